//! What changed in working directories on the local file system, told by inotify: one
//! inotify instance per backend, a watch on every directory of every watched working
//! directory, and the paths its events name gathered per sandbox until the engine asks
//! ([`nodus_core::Sandbox::changes`]), so that a snapshot after a command that changed nothing
//! lists nothing.
//!
//! The kernel queues an event before the system call that caused it returns, so once a
//! command has ended, everything it changed is in the queue. What inotify cannot tell (the
//! first call for a sandbox, a lost queue (`IN_Q_OVERFLOW`), a directory renamed (the paths
//! of the watches below it are stale), the working directory itself moved or removed) makes
//! the watch made again, and the answer, at the latest at the next call, the whole listing,
//! taken once the watch is made and in the same trip to the blocking pool
//! ([`Changes::Listed`]); a watch the kernel refuses (`max_user_watches`) makes it
//! [`Changes::Unknown`], for the engine to list the directory itself. What inotify does not
//! see at all: writes through a shared memory mapping (no event until the file is written or
//! its attributes change otherwise), and a file hard-linked from outside the working
//! directory and changed there.

use std::collections::{BTreeSet, HashMap};
use std::ffi::{CStr, CString};
use std::mem::MaybeUninit;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use nodus_core::sandbox::{Error, SandboxId};
use nodus_core::snapshot::{Changes, FileStat};
use rustix::fd::{AsRawFd, OwnedFd};
use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::archive;
use crate::workdir::blocking;

/// The directories of one working directory watched at most: past them it is listed whole
/// at each snapshot, and the host's watches (`max_user_watches`, shared by every sandbox) are
/// not spent on one sandbox.
const MAX_WATCHED_DIRS: usize = 10_000;

/// The deepest directory watched, below the working directory: each directory on the way to
/// the one being read is held open, so a chain of directories deeper than this is listed
/// whole at each snapshot instead of holding a descriptor per level.
const MAX_WATCHED_DEPTH: usize = 128;

/// The changed paths held for one sandbox between two snapshots at most: past them it is
/// listed whole at the next, so that a command that makes millions of files holds no memory
/// for them (nor does a sandbox whose changes nobody asks for: none are held before the
/// first answer).
const MAX_CHANGED_PATHS: usize = 100_000;

/// What each directory's watch reports: every change of an entry in it, and of itself.
fn watch_flags() -> WatchFlags {
    WatchFlags::MODIFY
        | WatchFlags::ATTRIB
        | WatchFlags::CLOSE_WRITE
        | WatchFlags::CREATE
        | WatchFlags::DELETE
        | WatchFlags::MOVED_FROM
        | WatchFlags::MOVED_TO
        | WatchFlags::DELETE_SELF
        | WatchFlags::MOVE_SELF
        | WatchFlags::DONT_FOLLOW
        | WatchFlags::ONLYDIR
        | WatchFlags::EXCL_UNLINK
}

/// The working directories a backend watches. See the [module docs](self).
#[derive(Debug, Default)]
pub(crate) struct Watcher(Mutex<Watches>);

#[derive(Debug, Default)]
struct Watches {
    /// The inotify instance, made at the first call; `Err` once it could not be made.
    fd: Option<Result<OwnedFd, Errno>>,
    /// Each watch: its sandbox and directory (relative to the working directory, `""` for
    /// the working directory itself).
    by_wd: HashMap<i32, (String, String)>,
    /// What is known of each sandbox asked about.
    sandboxes: HashMap<String, Tracked>,
    /// Counts the watches made and the events noted, of every sandbox: a sandbox's
    /// [`Watcher::mark`].
    clock: u64,
}

#[derive(Debug)]
enum Tracked {
    /// Watched since the last call (or since the watch was begun): its directories' watches,
    /// the paths changed since, and whether a call was answered since the watch was made
    /// (`false`: the next answer is the whole listing, as the engine knows nothing yet, or
    /// more paths changed than are held; no path is held then).
    Watching {
        root: PathBuf,
        dirs: HashMap<String, i32>,
        changed: BTreeSet<String>,
        told: bool,
        /// The clock when the watch was made or its last event was noted.
        last_change: u64,
        /// A directory was made or moved in since the watches were last completed (by a
        /// watch made, or [`Watches::stat`] watching the new ones): what is written under it
        /// makes no event yet, so that the mark cannot vouch for the directory.
        unwatched_dirs: bool,
    },
    /// Watched, but its events cannot be trusted since the last call: made again next time.
    Lost,
    /// The kernel refused a watch: never asked again (each call answers `Unknown`).
    Refused,
}

impl Watcher {
    /// What changed in the working directory `root` of sandbox `id` since the last call for
    /// it. Blocking (it reads and lists the file system): call it off the async threads.
    pub(crate) fn changes(&self, id: &str, root: &Path) -> Result<Changes, Error> {
        let mut watches = self.drained();
        match watches.sandboxes.get_mut(id) {
            Some(Tracked::Watching {
                changed,
                told: true,
                ..
            }) => {
                let changed = std::mem::take(changed);
                let told = watches.stat(id, changed);
                if told.is_err() {
                    // The changes drained for this answer are not told: the next one cannot
                    // be only what changes from now on.
                    watches.lose(id);
                }
                return told;
            }
            // Watched since it was made ([`Watcher::begin`]), never told: the listing, after
            // the directories made since are watched too (the whole watch made again).
            Some(Tracked::Watching {
                unwatched_dirs: true,
                ..
            }) => watches.watch(id, root, true),
            Some(Tracked::Watching { changed, told, .. }) => {
                changed.clear();
                *told = true;
            }
            Some(Tracked::Refused) => return Ok(Changes::Unknown),
            Some(Tracked::Lost) | None => watches.watch(id, root, true),
        }
        // Listed after the watch is made: what changes from here on is told next time (a
        // change between the two is listed now and told again: harmless).
        drop(watches);
        Ok(Changes::Listed(archive::list(root)?))
    }

    /// Begins watching the working directory `root` of sandbox `id`, which was just made:
    /// from here on [`Watcher::mark`] can tell that a command wrote nothing (the first
    /// [`Watcher::changes`] still answers with the whole listing). Blocking (it walks the
    /// directory): call it off the async threads. A watch the kernel refuses is refused for
    /// good, as in [`Watcher::changes`].
    pub(crate) fn begin(&self, id: &str, root: &Path) {
        let mut watches = self.drained();
        watches.watch(id, root, false);
    }

    /// A mark of sandbox `id`'s working directory as the watch knows it now, `None` when it is
    /// not watched, or holds a directory made since that is not watched yet (whatever is
    /// written under it makes no event): the same mark later means that nothing in it
    /// changed in between (no event, no watch made again), so that what was measured of it
    /// after the first still holds. Nothing but a read of the queue that does not block; it
    /// drains nothing the engine is told.
    pub(crate) fn mark(&self, id: &str) -> Option<u64> {
        let watches = self.drained();
        match watches.sandboxes.get(id) {
            Some(Tracked::Watching {
                last_change,
                unwatched_dirs: false,
                ..
            }) => Some(*last_change),
            _ => None,
        }
    }

    /// [`Watcher::changes`] of sandbox `id`, whose canonical working directory `dir` finds
    /// (or fails to), off the async threads.
    pub(crate) async fn changes_of(
        self: &Arc<Self>,
        id: &SandboxId,
        dir: impl FnOnce() -> Result<PathBuf, Error> + Send + 'static,
    ) -> Result<Changes, Error> {
        // Most often nothing changed: told here, without a trip to the blocking pool (the
        // queue is read without blocking).
        if self.nothing_changed(&id.0) {
            return Ok(Changes::Known {
                present: Vec::new(),
                gone: Vec::new(),
            });
        }
        let (watcher, id) = (Arc::clone(self), id.clone());
        blocking(move || {
            let dir = dir()?;
            watcher.changes(&id.0, &dir)
        })
        .await
    }

    /// Whether sandbox `id` is watched and nothing changed since the last call (which this
    /// call then is): nothing but a read of the queue that does not block.
    fn nothing_changed(&self, id: &str) -> bool {
        let watches = self.drained();
        matches!(watches.sandboxes.get(id), Some(Tracked::Watching { changed, told: true, .. }) if changed.is_empty())
    }

    /// The watches, with what the queue held gathered into them.
    fn drained(&self) -> std::sync::MutexGuard<'_, Watches> {
        let mut watches = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        watches.drain();
        watches
    }

    /// Stop watching a sandbox (it is being removed).
    pub(crate) fn forget(&self, id: &str) {
        let mut watches = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        watches.unwatch(id);
        watches.sandboxes.remove(id);
    }
}

impl Watches {
    /// Gather what the queue holds into each sandbox's changed paths.
    fn drain(&mut self) {
        let Some(Ok(fd)) = &self.fd else {
            return;
        };
        let mut events: Vec<(i32, ReadFlags, Option<Vec<u8>>)> = Vec::new();
        let mut buf = [MaybeUninit::<u8>::uninit(); 16 * 1024];
        let mut reader = inotify::Reader::new(fd, &mut buf);
        let mut lost = false;
        loop {
            match reader.next() {
                Ok(event) => events.push((
                    event.wd(),
                    event.events(),
                    event.file_name().map(|name| name.to_bytes().to_vec()),
                )),
                Err(Errno::WOULDBLOCK) => break,
                Err(Errno::INTR) => {}
                Err(_) => {
                    lost = true;
                    break;
                }
            }
        }
        for (wd, flags, name) in events {
            if flags.contains(ReadFlags::QUEUE_OVERFLOW) {
                lost = true;
                continue;
            }
            self.note(wd, flags, name.as_deref());
        }
        if lost {
            let watching: Vec<String> = self
                .sandboxes
                .iter()
                .filter(|(_, tracked)| matches!(tracked, Tracked::Watching { .. }))
                .map(|(id, _)| id.clone())
                .collect();
            for id in watching {
                self.lose(&id);
            }
        }
    }

    /// Stop trusting sandbox `id`'s watches: removed, and made again next time.
    fn lose(&mut self, id: &str) {
        self.unwatch(id);
        self.sandboxes.insert(id.to_string(), Tracked::Lost);
    }

    /// One event: the path it names is changed for its sandbox, or the sandbox is lost.
    fn note(&mut self, wd: i32, flags: ReadFlags, name: Option<&[u8]>) {
        let Some((id, dir)) = self.by_wd.get(&wd).cloned() else {
            return;
        };
        // Any event of the sandbox's moves its mark, whatever follows.
        self.clock += 1;
        if let Some(Tracked::Watching { last_change, .. }) = self.sandboxes.get_mut(&id) {
            *last_change = self.clock;
        }
        if flags.contains(ReadFlags::IGNORED) {
            // The directory is gone (its removal is told by its parent's watch).
            self.by_wd.remove(&wd);
            if let Some(Tracked::Watching { dirs, .. }) = self.sandboxes.get_mut(&id)
                && dirs.get(&dir) == Some(&wd)
            {
                dirs.remove(&dir);
            }
            return;
        }
        let renamed_dir = flags.contains(ReadFlags::ISDIR) && flags.contains(ReadFlags::MOVED_FROM);
        let root_moved = dir.is_empty()
            && (flags.contains(ReadFlags::DELETE_SELF) || flags.contains(ReadFlags::MOVE_SELF));
        // A name that is not UTF-8 is listed under another (lossy) name: only a whole
        // listing gives it as the listing does.
        let name = match name.map(std::str::from_utf8) {
            Some(Ok(name)) => Some(name),
            Some(Err(_)) => {
                self.lose(&id);
                return;
            }
            None => None,
        };
        if renamed_dir || root_moved {
            self.lose(&id);
            return;
        }
        let (
            Some(Tracked::Watching {
                changed,
                told,
                unwatched_dirs,
                ..
            }),
            Some(name),
        ) = (self.sandboxes.get_mut(&id), name)
        else {
            return;
        };
        if flags.contains(ReadFlags::ISDIR)
            && flags.intersects(ReadFlags::CREATE | ReadFlags::MOVED_TO)
        {
            *unwatched_dirs = true;
        }
        // Not told since the watch was made: the next answer is the whole listing, which
        // needs no path (a sandbox nobody asks about, with snapshots off, holds none).
        if !*told {
            return;
        }
        // An entry made, removed or renamed changes its directory's time too (the working
        // directory itself is not listed).
        let entries_changed =
            ReadFlags::CREATE | ReadFlags::DELETE | ReadFlags::MOVED_FROM | ReadFlags::MOVED_TO;
        if flags.intersects(entries_changed) && !dir.is_empty() {
            changed.insert(dir.clone());
        }
        changed.insert(if dir.is_empty() {
            name.to_string()
        } else {
            format!("{dir}/{name}")
        });
        // Past this, listing the whole directory costs less than the paths held for it: the
        // next answer is the listing, and the watch (with its mark) goes on.
        if changed.len() > MAX_CHANGED_PATHS {
            *changed = BTreeSet::new();
            *told = false;
        }
    }

    /// Watch every directory of sandbox `id`'s working directory `root`, from nothing; `told`:
    /// the caller answers with the listing now (else the next call does).
    fn watch(&mut self, id: &str, root: &Path, told: bool) {
        self.unwatch(id);
        let fd = match self
            .fd
            .get_or_insert_with(|| inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK))
        {
            Ok(fd) => &*fd,
            Err(_) => {
                self.sandboxes.insert(id.to_string(), Tracked::Refused);
                return;
            }
        };
        let Some(added) = add_tree(fd, root, "", MAX_WATCHED_DIRS) else {
            self.sandboxes.insert(id.to_string(), Tracked::Refused);
            return;
        };
        for (rel, wd) in &added {
            self.by_wd.insert(*wd, (id.to_string(), rel.clone()));
        }
        let dirs: HashMap<String, i32> = added.into_iter().collect();
        self.clock += 1;
        self.sandboxes.insert(
            id.to_string(),
            Tracked::Watching {
                root: root.to_path_buf(),
                dirs,
                changed: BTreeSet::new(),
                told,
                last_change: self.clock,
                unwatched_dirs: false,
            },
        );
    }

    /// Remove sandbox `id`'s watches.
    fn unwatch(&mut self, id: &str) {
        let fd = match &self.fd {
            Some(Ok(fd)) => fd,
            _ => return,
        };
        self.by_wd.retain(|wd, (of, _)| {
            let keep = of != id;
            if !keep {
                let _ = inotify::remove_watch(fd, *wd);
            }
            keep
        });
    }

    /// The changed paths of sandbox `id` as the listing would give them: each present one
    /// (a directory not watched yet, that is new, watched and with everything under it),
    /// and those gone.
    fn stat(&mut self, id: &str, changed: BTreeSet<String>) -> Result<Changes, Error> {
        let root = match self.sandboxes.get(id) {
            Some(Tracked::Watching { root, .. }) => root.clone(),
            _ => return Ok(Changes::Unknown),
        };
        let mut present: Vec<FileStat> = Vec::new();
        let mut gone = Vec::new();
        for path in changed {
            // A path under a new directory listed whole below may still be gone: one of the
            // directory that was there before under the same name.
            let Some(stat) = archive::stat_one(&root, Path::new(&path))? else {
                gone.push(path);
                continue;
            };
            let new_dir = stat.mode & nodus_core::snapshot::TYPE_BITS
                == nodus_core::snapshot::DIRECTORY
                && !self.watches_dir(id, &path);
            present.push(stat);
            if new_dir {
                if !self.watch_below(id, &root, &path) {
                    return Ok(Changes::Unknown);
                }
                archive::list_below(&root, PathBuf::from(&path), &mut present)?;
            }
        }
        present.sort_by(|a, b| a.path.cmp(&b.path));
        present.dedup_by(|a, b| a.path == b.path);
        // Every directory made since the last answer was among the changed paths, and is
        // watched now with what is under it.
        if let Some(Tracked::Watching { unwatched_dirs, .. }) = self.sandboxes.get_mut(id) {
            *unwatched_dirs = false;
        }
        Ok(Changes::Known { present, gone })
    }

    fn watches_dir(&self, id: &str, rel: &str) -> bool {
        matches!(self.sandboxes.get(id), Some(Tracked::Watching { dirs, .. }) if dirs.contains_key(rel))
    }

    /// Watch the new directory `rel` of sandbox `id` and every directory under it; `false`
    /// (and the sandbox made again next time) when that cannot be done.
    fn watch_below(&mut self, id: &str, root: &Path, rel: &str) -> bool {
        let (Some(Ok(fd)), Some(Tracked::Watching { dirs, .. })) =
            (&self.fd, self.sandboxes.get(id))
        else {
            return false;
        };
        let room = MAX_WATCHED_DIRS.saturating_sub(dirs.len());
        let Some(added) = add_tree(fd, root, rel, room) else {
            self.lose(id);
            return false;
        };
        for (rel, wd) in &added {
            self.by_wd.insert(*wd, (id.to_string(), rel.clone()));
        }
        if let Some(Tracked::Watching { dirs, .. }) = self.sandboxes.get_mut(id) {
            dirs.extend(added);
        }
        true
    }
}

/// Watch the directory `start` of the working directory `root` and every directory under
/// it, each before it is read (an entry made after its watch is told, one made before is
/// listed), at most `room` of them. `None`, with the watches made removed, when there are
/// more, one is deeper than [`MAX_WATCHED_DEPTH`], the kernel refuses one
/// (`max_user_watches`), or a directory's name is not UTF-8: then the sandbox is listed whole
/// instead.
///
/// Every directory is opened below its parent's descriptor without following a link, and
/// watched and read through that descriptor: a run that swaps a directory of its own for a
/// link to one of the host's between two looks makes it find nothing there (the swap itself
/// is told by the parent's watch), never watch or list the host's directory.
fn add_tree(fd: &OwnedFd, root: &Path, start: &str, room: usize) -> Option<Vec<(String, i32)>> {
    let mut added: Vec<(String, i32)> = Vec::new();
    let mut next = match open_below(root, start) {
        Ok(dir) => Some((start.to_string(), dir)),
        // Gone meanwhile, or not a directory (a link) any more: told by its parent's watch.
        Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => None,
        Err(_) => return None,
    };
    // Directories still to watch: each one's path, its parent (open) and its name.
    let mut pending: Vec<(String, Arc<OwnedFd>, CString)> = Vec::new();
    let mut complete = true;
    loop {
        let (rel, dir) = match next.take() {
            Some(found) => found,
            None => match pending.pop() {
                None => break,
                Some((rel, parent, name)) => match open_dir_at(&parent, &name) {
                    Ok(dir) => (rel, dir),
                    Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => continue,
                    Err(_) => {
                        complete = false;
                        break;
                    }
                },
            },
        };
        if added.len() >= room || rel.split('/').count() > MAX_WATCHED_DEPTH {
            complete = false;
            break;
        }
        // The descriptor's own path names the directory it opened, whatever its path is now.
        let through = format!("/proc/self/fd/{}", dir.as_raw_fd());
        match inotify::add_watch(
            fd,
            through.as_str(),
            watch_flags() - WatchFlags::DONT_FOLLOW,
        ) {
            Ok(wd) => added.push((rel.clone(), wd)),
            Err(_) => {
                complete = false;
                break;
            }
        }
        let dir = Arc::new(dir);
        let entries = match Dir::read_from(&*dir) {
            Ok(entries) => entries,
            // One nobody may read (the listing cannot read it either): watched, not entered.
            Err(Errno::ACCESS) => continue,
            // Out of descriptors or memory: what is below it would go unseen.
            Err(_) => {
                complete = false;
                break;
            }
        };
        for entry in entries {
            let Ok(entry) = entry else {
                complete = false;
                break;
            };
            let name = entry.file_name();
            if matches!(name.to_bytes(), b"." | b"..") || !is_dir(&dir, &entry) {
                continue;
            }
            let Some(shown) = name.to_str().ok() else {
                complete = false;
                break;
            };
            let child = if rel.is_empty() {
                shown.to_string()
            } else {
                format!("{rel}/{shown}")
            };
            pending.push((child, dir.clone(), name.to_owned()));
        }
        if !complete {
            break;
        }
    }
    if complete {
        return Some(added);
    }
    for (_, wd) in added {
        let _ = inotify::remove_watch(fd, wd);
    }
    None
}

/// The directory `rel` of `root`, each of its parts opened below the last without following
/// a link (`root` itself is the backend's own, already resolved).
fn open_below(root: &Path, rel: &str) -> Result<OwnedFd, Errno> {
    let mut dir = rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    for part in rel.split('/').filter(|part| !part.is_empty()) {
        let name = CString::new(part).map_err(|_| Errno::INVAL)?;
        dir = open_dir_at(&dir, &name)?;
    }
    Ok(dir)
}

/// The directory `name` in `parent`, not followed when it is a link (`ELOOP`).
fn open_dir_at(parent: &OwnedFd, name: &CStr) -> Result<OwnedFd, Errno> {
    rustix::fs::openat(
        parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

/// Whether `entry` of `dir` is a directory (not a link to one).
fn is_dir(dir: &OwnedFd, entry: &rustix::fs::DirEntry) -> bool {
    match entry.file_type() {
        FileType::Directory => true,
        FileType::Unknown => rustix::fs::statat(dir, entry.file_name(), AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|stat| FileType::from_raw_mode(stat.st_mode) == FileType::Directory),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(stats: &[FileStat]) -> Vec<&str> {
        stats.iter().map(|s| s.path.as_str()).collect()
    }

    /// Writes `contents` to `path` from a process of its own: a command another test of this
    /// binary spawns meanwhile inherits no descriptor of the file, whose last close (at that
    /// command's `exec`) would be an event after the write's own, moving a mark the test
    /// expects to hold. The process's descriptors are closed before it can be waited for.
    fn write(path: impl AsRef<Path>, contents: &str) -> std::io::Result<()> {
        let status = std::process::Command::new("sh")
            .args(["-c", r#"printf %s "$1" > "$2""#, "sh", contents])
            .arg(path.as_ref())
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(std::io::Error::other(format!("sh wrote nothing: {status}")))
        }
    }

    #[test]
    fn a_watch_begun_with_the_sandbox_answers_the_listing_first_and_marks_every_write() {
        let root = tempfile::tempdir().expect("tempdir");
        write(root.path().join("staged"), "x").expect("file");
        let watcher = Watcher::default();
        assert_eq!(watcher.mark("s"), None, "not watched: it cannot vouch");
        watcher.begin("s", root.path());
        let begun = watcher.mark("s").expect("watched");
        assert_eq!(watcher.mark("s"), Some(begun), "nothing changed");
        // The engine knows nothing yet: the whole listing, though nothing changed.
        match watcher.changes("s", root.path()).expect("changes") {
            Changes::Listed(all) => assert_eq!(paths(&all), ["staged"]),
            other => panic!("the first answer is the listing: {other:?}"),
        }
        assert_eq!(watcher.mark("s"), Some(begun), "telling changes nothing");
        std::fs::create_dir(root.path().join("d")).expect("mkdir");
        write(root.path().join("d/new"), "y").expect("file");
        assert_eq!(
            watcher.mark("s"),
            None,
            "a directory made is not vouched for before it is watched"
        );
        match watcher.changes("s", root.path()).expect("changes") {
            Changes::Known { present, gone } => {
                assert_eq!(paths(&present), ["d", "d/new"]);
                assert!(gone.is_empty());
            }
            other => panic!("then what changed: {other:?}"),
        }
        let written = watcher.mark("s").expect("watched again");
        assert_ne!(written, begun, "a write is seen before it is told");
        assert_eq!(watcher.mark("s"), Some(written), "told, still the same");
        // A write to a file that is there already, a removal, another sandbox's write.
        write(root.path().join("staged"), "longer").expect("write");
        let rewritten = watcher.mark("s").expect("watched");
        assert_ne!(rewritten, written);
        let other = tempfile::tempdir().expect("tempdir");
        watcher.begin("t", other.path());
        write(other.path().join("f"), "z").expect("file");
        assert_ne!(watcher.mark("t"), None);
        assert_eq!(
            watcher.mark("s"),
            Some(rewritten),
            "another sandbox's write"
        );
        std::fs::remove_file(root.path().join("d/new")).expect("rm");
        assert_ne!(watcher.mark("s"), Some(rewritten));
        watcher.forget("s");
        assert_eq!(watcher.mark("s"), None, "forgotten: it cannot vouch");
    }

    #[test]
    fn a_directory_made_since_the_watches_were_completed_is_watched_before_it_is_vouched_for() {
        let root = tempfile::tempdir().expect("tempdir");
        let watcher = Watcher::default();
        watcher.begin("s", root.path());
        // Made before the first answer (as staged files are): the mark cannot vouch while
        // it is not watched, and the first answer watches it.
        std::fs::create_dir_all(root.path().join("early/deeper")).expect("mkdir");
        assert_eq!(watcher.mark("s"), None, "a directory nobody watches yet");
        match watcher.changes("s", root.path()).expect("changes") {
            Changes::Listed(all) => assert_eq!(paths(&all), ["early", "early/deeper"]),
            other => panic!("the first answer is the listing: {other:?}"),
        }
        let listed = watcher.mark("s").expect("watched whole again");
        write(root.path().join("early/deeper/f"), "x").expect("file");
        assert_ne!(watcher.mark("s"), Some(listed), "a write in it is seen");
        match watcher.changes("s", root.path()).expect("changes") {
            // The file, and its directory, whose time an entry made changes.
            Changes::Known { present, .. } => {
                assert_eq!(paths(&present), ["early/deeper", "early/deeper/f"]);
            }
            other => panic!("what changed in it: {other:?}"),
        }
        // Made by a command after it: no mark until an answer has watched it.
        std::fs::create_dir(root.path().join("later")).expect("mkdir");
        assert_eq!(watcher.mark("s"), None);
        let _ = watcher.changes("s", root.path()).expect("changes");
        let watched = watcher.mark("s").expect("watched");
        write(root.path().join("later/g"), "y").expect("file");
        assert_ne!(watcher.mark("s"), Some(watched));
    }

    /// How many changed paths the watcher holds for sandbox `id`.
    fn held(watcher: &Watcher, id: &str) -> usize {
        match watcher.drained().sandboxes.get(id) {
            Some(Tracked::Watching { changed, .. }) => changed.len(),
            other => panic!("{id} is not watched: {other:?}"),
        }
    }

    #[test]
    fn a_watch_never_asked_what_changed_holds_no_path_and_still_marks_writes() {
        let root = tempfile::tempdir().expect("tempdir");
        let watcher = Watcher::default();
        watcher.begin("s", root.path());
        let begun = watcher.mark("s").expect("watched");
        for i in 0..50 {
            write(root.path().join(format!("f{i}")), "x").expect("file");
        }
        assert_ne!(watcher.mark("s"), Some(begun), "the writes are seen");
        assert_eq!(
            held(&watcher, "s"),
            0,
            "no path held before the first answer"
        );
        match watcher.changes("s", root.path()).expect("changes") {
            Changes::Listed(all) => assert_eq!(all.len(), 50),
            other => panic!("the first answer is the listing: {other:?}"),
        }
        // Told: from here on, what changes is held for the next answer.
        write(root.path().join("f0"), "longer").expect("write");
        assert_eq!(held(&watcher, "s"), 1);
    }

    #[test]
    fn past_the_changed_paths_held_the_next_answer_is_the_listing_and_the_watch_goes_on() {
        let root = tempfile::tempdir().expect("tempdir");
        let watcher = Watcher::default();
        watcher.begin("s", root.path());
        assert!(matches!(
            watcher.changes("s", root.path()),
            Ok(Changes::Listed(_))
        ));
        // In rounds that the kernel's queue holds, each drained by a mark.
        let files = MAX_CHANGED_PATHS + 1;
        for from in (0..files).step_by(4096) {
            let status = std::process::Command::new("sh")
                .args([
                    "-c",
                    r#"i=$1; while [ "$i" -lt "$2" ]; do : > "f$i"; i=$((i+1)); done"#,
                ])
                .args([
                    "sh",
                    &from.to_string(),
                    &(from + 4096).min(files).to_string(),
                ])
                .current_dir(root.path())
                .status()
                .expect("sh");
            assert!(status.success());
            assert!(watcher.mark("s").is_some(), "still watched");
        }
        let past = watcher
            .mark("s")
            .expect("still watched past the paths held");
        assert_eq!(held(&watcher, "s"), 0, "the paths let go");
        match watcher.changes("s", root.path()).expect("changes") {
            Changes::Listed(all) => assert_eq!(all.len(), files),
            other => panic!("past the paths held, the listing: {other:?}"),
        }
        assert_eq!(watcher.mark("s"), Some(past), "listing it moves nothing");
        write(root.path().join("f0"), "x").expect("write");
        match watcher.changes("s", root.path()).expect("changes") {
            Changes::Known { present, gone } => {
                assert_eq!(paths(&present), ["f0"]);
                assert!(gone.is_empty());
            }
            other => panic!("then what changed: {other:?}"),
        }
    }

    #[test]
    fn a_tree_is_watched_whole_or_not_at_all() {
        let root = tempfile::tempdir().expect("tempdir");
        for dir in ["a", "a/b", "c"] {
            std::fs::create_dir(root.path().join(dir)).expect("mkdir");
        }
        write(root.path().join("a/f"), "x").expect("file");
        let fd = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK).expect("inotify");
        let mut all: Vec<String> = add_tree(&fd, root.path(), "", 10)
            .expect("room for four")
            .into_iter()
            .map(|(rel, _)| rel)
            .collect();
        all.sort();
        assert_eq!(all, ["", "a", "a/b", "c"]);
        let below: Vec<String> = add_tree(&fd, root.path(), "a", 10)
            .expect("room for two")
            .into_iter()
            .map(|(rel, _)| rel)
            .collect();
        assert_eq!(below.len(), 2, "{below:?}");
        assert_eq!(
            add_tree(&fd, root.path(), "", 3),
            None,
            "four directories, room for three"
        );
        let deep = (0..=MAX_WATCHED_DEPTH).fold(root.path().to_path_buf(), |dir, _| {
            let below = dir.join("d");
            std::fs::create_dir(&below).expect("mkdir");
            below
        });
        assert!(deep.is_dir());
        assert_eq!(
            add_tree(&fd, root.path(), "", 10_000),
            None,
            "a chain deeper than the deepest watched"
        );
    }

    #[test]
    fn a_directory_swapped_for_a_link_to_the_host_s_is_never_watched_nor_read() {
        let host = tempfile::tempdir().expect("tempdir");
        for dir in ["b", "b/c"] {
            std::fs::create_dir(host.path().join(dir)).expect("mkdir");
        }
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(root.path().join("d")).expect("mkdir");
        // `a` was a directory of the run's when its event came; now a link to the host's.
        std::os::unix::fs::symlink(host.path(), root.path().join("a")).expect("link");
        std::os::unix::fs::symlink(host.path(), root.path().join("d/e")).expect("link");
        let fd = inotify::init(CreateFlags::CLOEXEC | CreateFlags::NONBLOCK).expect("inotify");
        for start in ["a", "a/b", "a/b/c", "d/e", "d/e/b"] {
            assert_eq!(
                add_tree(&fd, root.path(), start, 10),
                Some(Vec::new()),
                "{start} runs through a link: nothing watched"
            );
        }
        let watched: Vec<String> = add_tree(&fd, root.path(), "", 10)
            .expect("room")
            .into_iter()
            .map(|(rel, _)| rel)
            .collect();
        assert_eq!(watched, ["", "d"], "the links are not followed");

        // What a watch through a descriptor tells is the directory's own events.
        let added = add_tree(&fd, root.path(), "d", 10).expect("room");
        let [(rel, wd)] = added.as_slice() else {
            panic!("one directory: {added:?}");
        };
        assert_eq!(rel, "d");
        write(root.path().join("d/new"), "x").expect("file");
        let mut buffer = [MaybeUninit::<u8>::uninit(); 4096];
        let mut reader = inotify::Reader::new(&fd, &mut buffer);
        let mut named = Vec::new();
        while let Ok(event) = reader.next() {
            if event.wd() == *wd {
                named.extend(
                    event
                        .file_name()
                        .map(|name| name.to_string_lossy().into_owned()),
                );
            }
        }
        assert!(named.iter().any(|name| name == "new"), "{named:?}");
    }
}
