//! Cgroup limits for process sandboxes: memory, process count and CPU through cgroup v1 or v2,
//! wherever the host lets this process manage them.
//!
//! Each sandbox gets a cgroup `<parent>/<key>` in every hierarchy that holds one of the three
//! controllers (v1: the `memory`, `pids` and `cpu` hierarchies; v2: the unified one, with the
//! controllers enabled for `<parent>`). Its commands are moved into those cgroups before they
//! start. A controller that cannot be used is reported by [`Cgroups::enforced`], so that the
//! caller falls back to rlimits for it.
//!
//! A hierarchy is used only once this process has made a cgroup under the parent and moved a
//! process into it (a probe), so that a user who may not make cgroups (an ordinary user on
//! cgroup v1, or under a parent a root server made) gets rlimits instead of failed runs. On
//! cgroup v2 a process that cannot use `<mount>/<parent>` uses what the host delegates to it:
//! `<parent>` beside its own cgroup (systemd gives a user's services their own subtree).
//! [`Cgroups::summary`] says which limits hold.
//!
//! Emptied cgroups are kept for reuse (a pool, cgroup v1 only): making a cgroup (the memory
//! controller's per-CPU state, the CPU controller's per-CPU run queues) and removing it (its
//! teardown runs in kernel workers after an RCU grace period) is most of what the backend's
//! own work costs the machine per sandbox. At [`Cgroups::remove`] a cgroup whose processes
//! are all gone is renamed `+pool-…` (no sandbox key holds a `+`) instead of removed, up to
//! a configured number a hierarchy; [`Cgroups::create`] renames one back to the new sandbox's key
//! and writes every limit of the new sandbox again. What a pooled cgroup keeps of the
//! sandbox before it: its counters (peak memory, failures, CPU time), which Nodus reads
//! nowhere and a sandbox cannot see (it has no `/sys`), and on the memory controller the
//! charge of page cache and kernel memory that sandbox left behind, which the next one's
//! limit reclaims like its own cache: a memory cgroup still charged with more than
//! [`POOL_MAX_CHARGE`] is removed instead. Cgroup v2 renames no cgroup, so there each is
//! made and removed. The pool is removed when the backend is dropped, and a pool left by a
//! process that is gone when the next backend starts.

use std::fs;
use std::io;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use nodus_core::sandbox::{Error, Limits};
use tracing::{debug, warn};

/// CFS period for CPU limits, in microseconds.
const CPU_PERIOD_US: u64 = 100_000;
/// The smallest CFS quota the kernel accepts, in microseconds.
const MIN_CPU_QUOTA_US: u64 = 1_000;
/// How long removing a busy cgroup is tried (killed processes leave it only when the kernel
/// schedules their exit, which on a loaded host can take seconds), and how far apart.
const REMOVE_WITHIN: std::time::Duration = std::time::Duration::from_secs(15);
const REMOVE_PAUSE: std::time::Duration = std::time::Duration::from_millis(1);
/// An emptied memory cgroup still charged with more than this (page cache and kernel memory
/// its sandbox left) is removed, not pooled: the next sandbox starts with at most this much
/// of another's charge, which its limit reclaims as its own cache.
pub(crate) const POOL_MAX_CHARGE: u64 = 8 << 20;
/// What every pooled cgroup's name starts with: no sandbox key holds a `+`.
const POOL_PREFIX: &str = "+pool-";

/// Which limits a set of cgroups enforces.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Controllers {
    /// Memory (no swap).
    pub(crate) memory: bool,
    /// Processes and threads.
    pub(crate) pids: bool,
    /// CPU time per period.
    pub(crate) cpu: bool,
}

impl Controllers {
    fn any(self) -> bool {
        self.memory || self.pids || self.cpu
    }

    fn or(self, other: Controllers) -> Controllers {
        Controllers {
            memory: self.memory || other.memory,
            pids: self.pids || other.pids,
            cpu: self.cpu || other.cpu,
        }
    }

    fn minus(self, other: Controllers) -> Controllers {
        Controllers {
            memory: self.memory && !other.memory,
            pids: self.pids && !other.pids,
            cpu: self.cpu && !other.cpu,
        }
    }
}

/// One mounted hierarchy with a parent cgroup that this process may create cgroups under.
#[derive(Debug, Clone)]
struct Hierarchy {
    /// `<mount point>/<parent>`.
    parent: PathBuf,
    /// `parent`, opened once: each sandbox's cgroup is made, written and removed relative to
    /// it, without walking the whole path again.
    fd: Arc<OwnedFd>,
    v2: bool,
    /// Whether v1's memory controller limits memory plus swap here
    /// (`memory.memsw.limit_in_bytes`): as in `parent`, so in every cgroup made under it.
    memsw: bool,
    controllers: Controllers,
    /// Emptied cgroups kept for reuse (v1 only: v2 renames no cgroup).
    pool: Option<Arc<Pool>>,
}

/// Emptied cgroups of one hierarchy, named `+pool-<pid>-<backend>-<n>` under its parent,
/// kept for the next sandboxes; removed when the last copy of their [`Cgroups`] is dropped.
#[derive(Debug)]
struct Pool {
    parent: PathBuf,
    fd: Arc<OwnedFd>,
    /// `+pool-<pid>-<backend>-`: each backend's own names, so that backends sharing a parent
    /// never take each other's.
    prefix: String,
    /// The most cgroups it keeps.
    size: usize,
    state: Mutex<PoolState>,
}

#[derive(Debug, Default)]
struct PoolState {
    /// The names of the pooled cgroups, each empty and holding limits of a sandbox that is gone.
    free: Vec<String>,
    /// The number in the next pooled cgroup's name.
    next: u64,
}

impl Pool {
    fn new(parent: &Path, fd: &Arc<OwnedFd>, size: usize) -> Arc<Pool> {
        static BACKENDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let backend = BACKENDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Arc::new(Pool {
            parent: parent.to_path_buf(),
            fd: Arc::clone(fd),
            prefix: format!("{POOL_PREFIX}{}-{backend}-", std::process::id()),
            size,
            state: Mutex::default(),
        })
    }

    fn state(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A pooled cgroup's name, if one waits.
    fn take(&self) -> Option<String> {
        self.state().free.pop()
    }

    /// A name for one more pooled cgroup, while the pool has room.
    fn room(&self) -> Option<String> {
        let mut state = self.state();
        if state.free.len() >= self.size {
            return None;
        }
        state.next = state.next.wrapping_add(1);
        Some(format!("{}{}", self.prefix, state.next))
    }

    fn put(&self, name: String) {
        self.state().free.push(name);
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        for name in std::mem::take(&mut self.state().free) {
            if let Err(e) = rustix::fs::unlinkat(
                self.fd.as_fd(),
                name.as_str(),
                rustix::fs::AtFlags::REMOVEDIR,
            ) {
                let dir = self.parent.join(name);
                debug!(cgroup = %dir.display(), error = %e, "cannot remove a pooled cgroup");
            }
        }
    }
}

/// Removes the pooled cgroups under `parent` that a process now gone left behind (it ended
/// without dropping its backend). Pooled cgroups are empty: nothing is killed.
fn sweep_pools(parent: &Path) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|name| name.strip_prefix(POOL_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new("/proc").join(pid.to_string()).exists() {
            continue;
        }
        if let Err(e) = fs::remove_dir(entry.path()) {
            debug!(cgroup = %entry.path().display(), error = %e, "cannot remove a pooled cgroup left behind");
        }
    }
}

/// How a sandbox's cgroup came to be: what its limit files hold before they are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Made {
    /// Just made: the kernel's defaults.
    Fresh,
    /// Taken from the pool: another sandbox's limits, written by this process (the CPU period
    /// is [`CPU_PERIOD_US`], the only one it writes).
    Pooled,
    /// There already (a sandbox of the same key, made before a restart): anything.
    Found,
}

/// The cgroups that sandboxes are put in; empty when the host allows none.
#[derive(Debug, Clone, Default)]
pub(crate) struct Cgroups {
    hierarchies: Vec<Hierarchy>,
}

impl Cgroups {
    /// No cgroups: every limit falls back to rlimits.
    pub(crate) fn none() -> Self {
        Cgroups::default()
    }

    /// Finds the memory, pids and cpu controllers in `/proc/self/mountinfo` (v1 first, then
    /// v2) and prepares the parent cgroup `parent` in each hierarchy. Hierarchies that cannot
    /// be used are left out with a warning. Each v1 hierarchy keeps up to `pool` emptied
    /// cgroups for reuse.
    pub(crate) fn detect(parent: &str, pool: usize) -> Self {
        let mountinfo = match fs::read_to_string("/proc/self/mountinfo") {
            Ok(text) => text,
            Err(e) => {
                warn!(error = %e, "cannot read /proc/self/mountinfo: no cgroup limits");
                return Cgroups::none();
            }
        };
        let mut found = Controllers::default();
        let mut hierarchies = Vec::new();
        let mut v2_mounts = Vec::new();
        for line in mountinfo.lines() {
            let Some((mount, fstype, options)) = parse_mount(line) else {
                continue;
            };
            match fstype {
                "cgroup" => {
                    let has = |name: &str| options.split(',').any(|o| o == name);
                    let controllers = Controllers {
                        memory: has("memory"),
                        pids: has("pids"),
                        cpu: has("cpu"),
                    }
                    .minus(found);
                    if !controllers.any() {
                        continue;
                    }
                    match prepare_v1(&mount, parent)
                        .and_then(|dir| probe(&dir, false).map(|()| dir))
                        .and_then(|dir| open_dir(&dir).map(|fd| (dir, fd)))
                    {
                        Ok((dir, fd)) => {
                            found = found.or(controllers);
                            sweep_pools(&dir);
                            hierarchies.push(Hierarchy {
                                pool: (pool > 0).then(|| Pool::new(&dir, &fd, pool)),
                                memsw: dir.join("memory.memsw.limit_in_bytes").exists(),
                                fd,
                                parent: dir,
                                v2: false,
                                controllers,
                            });
                        }
                        Err(e) => {
                            warn!(mount = %mount.display(), error = %e, "cannot use this cgroup v1 hierarchy")
                        }
                    }
                }
                "cgroup2" => v2_mounts.push(mount),
                _ => {}
            }
        }
        for mount in v2_mounts {
            let available =
                fs::read_to_string(mount.join("cgroup.controllers")).unwrap_or_default();
            let has = |name: &str| available.split_whitespace().any(|c| c == name);
            let wanted = Controllers {
                memory: has("memory"),
                pids: has("pids"),
                cpu: has("cpu"),
            }
            .minus(found);
            if !wanted.any() {
                continue;
            }
            let prepared = prepare_v2_anywhere(&mount, parent, wanted)
                .and_then(|(dir, controllers)| open_dir(&dir).map(|fd| (dir, fd, controllers)));
            match prepared {
                Ok((dir, fd, controllers)) if controllers.any() => {
                    found = found.or(controllers);
                    hierarchies.push(Hierarchy {
                        memsw: false,
                        fd,
                        parent: dir,
                        v2: true,
                        controllers,
                        pool: None,
                    });
                }
                Ok(_) => {
                    warn!(mount = %mount.display(), "no cgroup v2 controller could be enabled")
                }
                Err(e) => {
                    warn!(mount = %mount.display(), error = %e, "cannot use the cgroup v2 hierarchy")
                }
            }
        }
        debug!(?found, "cgroup controllers for sandboxes");
        Cgroups { hierarchies }
    }

    /// One sentence on which limits hold: which go through cgroups (and where), and what
    /// stands in for the others.
    pub(crate) fn summary(&self) -> String {
        let enforced = self.enforced();
        let limits = [
            (
                "memory",
                enforced.memory,
                "memory by an address-space rlimit",
            ),
            (
                "processes",
                enforced.pids,
                "processes by an rlimit on this user's processes",
            ),
            ("CPU", enforced.cpu, "CPU only by each command's timeout"),
        ];
        let held: Vec<&str> = limits.iter().filter(|l| l.1).map(|l| l.0).collect();
        let instead: Vec<&str> = limits.iter().filter(|l| !l.1).map(|l| l.2).collect();
        let mut parts = Vec::new();
        if !held.is_empty() {
            let places: Vec<String> = self
                .hierarchies
                .iter()
                .map(|h| h.parent.display().to_string())
                .collect();
            parts.push(format!(
                "{} limited by cgroups under {}",
                held.join(", "),
                places.join(", ")
            ));
        }
        if !instead.is_empty() {
            parts.push(format!(
                "without a cgroup this process may make, {}",
                instead.join(", ")
            ));
        }
        format!("sandbox limits: {}", parts.join("; "))
    }

    /// The limits these cgroups enforce.
    pub(crate) fn enforced(&self) -> Controllers {
        self.hierarchies
            .iter()
            .fold(Controllers::default(), |all, h| all.or(h.controllers))
    }

    /// Whether every hierarchy is cgroup v1 (or there is none): there a process may move
    /// itself into a cgroup whose `tasks` file it may write, whatever its user.
    pub(crate) fn all_v1(&self) -> bool {
        self.hierarchies.iter().all(|h| !h.v2)
    }

    /// Creates (or reuses) the cgroups of sandbox `key` and writes its limits: each is a
    /// pooled one renamed to `key` when the pool has one, else made. With an `entrant` (user
    /// id, group id), a v1 cgroup's `tasks` file is given to that user, so that a process of
    /// the sandbox's user can join it without root: only the sandbox's cgroup, whose limits
    /// it cannot change, and none of the host's.
    pub(crate) fn create(
        &self,
        key: &str,
        limits: &Limits,
        entrant: Option<(u32, u32)>,
    ) -> Result<(), Error> {
        for hierarchy in &self.hierarchies {
            let dir = hierarchy.parent.join(key);
            // The cgroup's host path goes to the log only, never into a run's status.
            let failed = |what: &str, e: io::Error| {
                warn!(cgroup = %dir.display(), error = %e, "{what} a sandbox's cgroup failed");
                Error::Failed(format!("{what} the sandbox's cgroup: {e}"))
            };
            let make = || match hierarchy.mkdir(key) {
                Ok(()) => Ok(Made::Fresh),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(Made::Found),
                Err(e) => Err(failed("creating", e)),
            };
            let pooled = hierarchy
                .pool
                .as_ref()
                .and_then(|pool| pool.take().map(|name| (pool, name)));
            let made = match pooled {
                Some((pool, name)) => {
                    match hierarchy.rename(&name, key) {
                        Ok(()) => Made::Pooled,
                        Err(e) => {
                            let from = hierarchy.parent.join(&name);
                            debug!(cgroup = %from.display(), error = %e, "cannot reuse a pooled cgroup");
                            if dir.exists() {
                                // The key's own is there (made before a restart): the pooled
                                // one waits for the next sandbox.
                                pool.put(name);
                            } else {
                                let _ = hierarchy.rmdir(&name);
                            }
                            make()?
                        }
                    }
                }
                None => make()?,
            };
            write_limits(hierarchy, key, limits, made)
                .map_err(|e| failed("setting the limits of", e))?;
            if let (Some((uid, gid)), false) = (entrant, hierarchy.v2) {
                std::os::unix::fs::lchown(dir.join("tasks"), Some(uid), Some(gid))
                    .map_err(|e| failed("opening", e))?;
            }
        }
        Ok(())
    }

    /// The files into which a process of sandbox `key` writes `0` to move itself into the
    /// sandbox's cgroups: `tasks` in v1 (which moves the writing thread, and spares the kernel
    /// the global lock it takes to move another process; the gate shell has one thread),
    /// `cgroup.procs` in v2.
    pub(crate) fn entry_files(&self, key: &str) -> Vec<PathBuf> {
        self.hierarchies
            .iter()
            .map(|h| {
                let file = if h.v2 { "cgroup.procs" } else { "tasks" };
                h.parent.join(key).join(file)
            })
            .collect()
    }

    /// Removes the cgroups of sandbox `key` (or pools them); missing ones are fine. Blocks
    /// while the last processes leave.
    pub(crate) fn remove(&self, key: &str) {
        self.remove_after(key, || ());
    }

    /// Kills what runs in the cgroups of sandbox `key` and waits until it is gone, runs
    /// `between` (destroy removes the working directory there, so that its page cache is no
    /// longer charged to the memory cgroup), then pools each cgroup (empty, its memory
    /// charge at most [`POOL_MAX_CHARGE`], while the pool has room) or removes it. Missing
    /// cgroups are fine; blocks for up to [`REMOVE_WITHIN`] while the last processes leave.
    pub(crate) fn remove_after<T>(&self, key: &str, between: impl FnOnce() -> T) -> T {
        let emptied: Vec<bool> = self
            .hierarchies
            .iter()
            .map(|hierarchy| {
                if hierarchy.pool.is_some() {
                    empty(hierarchy, key)
                } else {
                    // A command still running there (its sandbox is deleted under it) is
                    // killed, with everything it started; the removal below waits until the
                    // last processes leave.
                    kill_all(hierarchy, key);
                    false
                }
            })
            .collect();
        let result = between();
        for (hierarchy, emptied) in self.hierarchies.iter().zip(emptied) {
            if emptied
                && let Some(pool) = &hierarchy.pool
                && within_charge(hierarchy, key)
                && let Some(name) = pool.room()
            {
                match hierarchy.rename(key, &name) {
                    Ok(()) => {
                        pool.put(name);
                        continue;
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                    Err(e) => {
                        let dir = hierarchy.parent.join(key);
                        debug!(cgroup = %dir.display(), error = %e, "cannot pool a sandbox's cgroup")
                    }
                }
            }
            remove_dir(hierarchy, key);
        }
        result
    }
}

impl Hierarchy {
    fn mkdir(&self, name: &str) -> io::Result<()> {
        Ok(rustix::fs::mkdirat(
            self.fd.as_fd(),
            name,
            rustix::fs::Mode::from_raw_mode(0o755),
        )?)
    }

    fn rmdir(&self, name: &str) -> io::Result<()> {
        Ok(rustix::fs::unlinkat(
            self.fd.as_fd(),
            name,
            rustix::fs::AtFlags::REMOVEDIR,
        )?)
    }

    fn rename(&self, from: &str, to: &str) -> io::Result<()> {
        Ok(rustix::fs::renameat(
            self.fd.as_fd(),
            from,
            self.fd.as_fd(),
            to,
        )?)
    }

    /// Opens the file `name` of the cgroup `key` (`access`: read or write only).
    fn open(&self, key: &str, name: &str, access: rustix::fs::OFlags) -> io::Result<fs::File> {
        let fd = rustix::fs::openat(
            self.fd.as_fd(),
            format!("{key}/{name}"),
            access | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?;
        Ok(fs::File::from(fd))
    }

    /// Writes `value` into the file `name` of the cgroup `key`, in one write.
    fn write(&self, key: &str, name: &str, value: &str) -> io::Result<()> {
        self.open(key, name, rustix::fs::OFlags::WRONLY)?
            .write_all(value.as_bytes())
    }

    /// The file `name` of the cgroup `key`.
    fn read(&self, key: &str, name: &str) -> io::Result<String> {
        let mut text = String::new();
        self.open(key, name, rustix::fs::OFlags::RDONLY)?
            .read_to_string(&mut text)?;
        Ok(text)
    }
}

/// Opens the directory `dir` for the `*at` calls relative to it.
fn open_dir(dir: &Path) -> io::Result<Arc<OwnedFd>> {
    let fd = rustix::fs::open(
        dir,
        rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    Ok(Arc::new(fd))
}

/// Removes the cgroup `key`, killing what is left in it and waiting (up to
/// [`REMOVE_WITHIN`]) while the last processes leave; a missing one is fine.
fn remove_dir(hierarchy: &Hierarchy, key: &str) {
    let started = std::time::Instant::now();
    let mut tries: u32 = 0;
    loop {
        match hierarchy.rmdir(key) {
            Ok(()) => break,
            Err(e) if e.kind() == io::ErrorKind::NotFound => break,
            Err(e)
                if e.kind() == io::ErrorKind::ResourceBusy && started.elapsed() < REMOVE_WITHIN =>
            {
                tries = tries.wrapping_add(1);
                if tries.is_multiple_of(100) {
                    // Something forked while it was being killed: again.
                    kill_all(hierarchy, key);
                }
                std::thread::sleep(REMOVE_PAUSE);
            }
            Err(e) => {
                let dir = hierarchy.parent.join(key);
                warn!(cgroup = %dir.display(), error = %e, "cannot remove a sandbox's cgroup");
                break;
            }
        }
    }
}

/// Waits (up to [`REMOVE_WITHIN`]) until the v1 cgroup `key`'s `tasks` lists no thread,
/// killing what is still there after a few tries: whether it is empty now (`false` when it
/// is gone or unreadable, or still busy).
fn empty(hierarchy: &Hierarchy, key: &str) -> bool {
    let started = std::time::Instant::now();
    let mut tries: u32 = 0;
    loop {
        let tasks = match hierarchy.read(key, "tasks") {
            Ok(tasks) => tasks,
            Err(_) => return false,
        };
        if tasks.trim().is_empty() {
            return true;
        }
        if started.elapsed() >= REMOVE_WITHIN {
            let dir = hierarchy.parent.join(key);
            warn!(cgroup = %dir.display(), "a sandbox's cgroup still holds processes");
            return false;
        }
        // The sandbox's own processes die with its init (the caller killed the first one):
        // whatever is still there after a few tries is killed, and again if something forked
        // while it was being killed.
        if tries % 100 == 5 {
            kill_all(hierarchy, key);
        }
        tries = tries.wrapping_add(1);
        std::thread::sleep(REMOVE_PAUSE);
    }
}

/// Whether the emptied cgroup `key`'s memory charge is small enough for the pool (always,
/// in a hierarchy without the memory controller).
fn within_charge(hierarchy: &Hierarchy, key: &str) -> bool {
    if !hierarchy.controllers.memory {
        return true;
    }
    hierarchy
        .read(key, "memory.usage_in_bytes")
        .ok()
        .and_then(|usage| usage.trim().parse::<u64>().ok())
        .is_some_and(|usage| usage <= POOL_MAX_CHARGE)
}

/// Kills every process in the cgroup `key`: through `cgroup.kill` where cgroup v2 has it
/// (Linux 5.14), otherwise each process that `cgroup.procs` lists. A cgroup that is gone
/// holds nothing.
fn kill_all(hierarchy: &Hierarchy, key: &str) {
    if hierarchy.v2 && hierarchy.write(key, "cgroup.kill", "1").is_ok() {
        return;
    }
    let Ok(procs) = hierarchy.read(key, "cgroup.procs") else {
        return;
    };
    for pid in procs
        .lines()
        .filter_map(|line| line.trim().parse::<i32>().ok())
        // Never 0 or 1: those do not name one process of the sandbox.
        .filter(|&pid| pid > 1)
        .filter_map(rustix::process::Pid::from_raw)
    {
        match rustix::process::kill_process(pid, rustix::process::Signal::KILL) {
            Ok(()) | Err(rustix::io::Errno::SRCH) => {}
            Err(e) => {
                let dir = hierarchy.parent.join(key);
                warn!(cgroup = %dir.display(), pid = pid.as_raw_nonzero().get(), error = %e, "cannot kill a process of a sandbox's cgroup")
            }
        }
    }
}

/// Writes every limit into the cgroup `key`. One just made has the kernel's defaults and a
/// pooled one a previous sandbox's limits, written by this process: what would only write
/// the same value again is left out (v1: lifting memory plus swap, which a fresh cgroup
/// starts without, and the CPU period, which starts at [`CPU_PERIOD_US`] and is never
/// written anything else).
fn write_limits(hierarchy: &Hierarchy, key: &str, limits: &Limits, made: Made) -> io::Result<()> {
    let set = |file: &str, value: &str| hierarchy.write(key, file, value);
    let quota = (u64::from(limits.cpu_millis) * CPU_PERIOD_US / 1000).max(MIN_CPU_QUOTA_US);
    let memory = limits.memory_bytes.to_string();
    let c = hierarchy.controllers;
    if hierarchy.v2 {
        if c.memory {
            set("memory.max", &memory)?;
            if hierarchy.parent.join(key).join("memory.swap.max").exists() {
                set("memory.swap.max", "0")?;
            }
        }
        if c.pids {
            set("pids.max", &limits.processes.to_string())?;
        }
        if c.cpu {
            set("cpu.max", &format!("{quota} {CPU_PERIOD_US}"))?;
        }
    } else {
        if c.memory {
            // Memory plus swap may never be below memory: lift it, set memory, then pin it.
            let memsw = hierarchy.memsw;
            if memsw && made != Made::Fresh {
                set("memory.memsw.limit_in_bytes", "-1")?;
            }
            set("memory.limit_in_bytes", &memory)?;
            if memsw {
                set("memory.memsw.limit_in_bytes", &memory)?;
            }
        }
        if c.pids {
            set("pids.max", &limits.processes.to_string())?;
        }
        if c.cpu {
            if made == Made::Found {
                set("cpu.cfs_period_us", &CPU_PERIOD_US.to_string())?;
            }
            set("cpu.cfs_quota_us", &quota.to_string())?;
        }
    }
    Ok(())
}

fn prepare_v1(mount: &Path, parent: &str) -> io::Result<PathBuf> {
    let dir = mount.join(parent);
    fs::create_dir_all(&dir)?;
    // Probe that cgroups can be made here.
    fs::metadata(dir.join("cgroup.procs"))?;
    Ok(dir)
}

/// Prepares the v2 parent cgroup at `<mount>/<parent>`, or, when this process cannot use that
/// one (not root), at `<parent>` beside its own cgroup, which the host may have delegated to
/// it. The first that passes the probe is used.
fn prepare_v2_anywhere(
    mount: &Path,
    parent: &str,
    wanted: Controllers,
) -> io::Result<(PathBuf, Controllers)> {
    let mut candidates = vec![mount.join(parent)];
    if let Some(own) = own_v2_cgroup()
        && let Some(beside) = Path::new(&own).parent()
    {
        let delegated = mount
            .join(beside.strip_prefix("/").unwrap_or(beside))
            .join(parent);
        if !candidates.contains(&delegated) {
            candidates.push(delegated);
        }
    }
    let mut refused = Vec::new();
    for dir in candidates {
        match prepare_v2(&dir, wanted).and_then(|prepared| probe(&dir, true).map(|()| prepared)) {
            Ok(prepared) => return Ok(prepared),
            Err(e) => refused.push(format!("{}: {e}", dir.display())),
        }
    }
    Err(io::Error::other(refused.join("; ")))
}

/// This process's cgroup in the v2 hierarchy (`/proc/self/cgroup`'s `0::` line).
fn own_v2_cgroup() -> Option<String> {
    let text = fs::read_to_string("/proc/self/cgroup").ok()?;
    text.lines()
        .find_map(|line| line.strip_prefix("0::"))
        .map(str::to_string)
}

/// Makes a cgroup under `dir`, moves a short-lived child process into it, and removes it: the
/// proof that sandboxes' cgroups can be made there and their commands moved in.
fn probe(dir: &Path, v2: bool) -> io::Result<()> {
    // One name per probe: backends made at the same time in one process (tests) must not
    // remove each other's probe while it is used.
    static PROBES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let probe = dir.join(format!("nodus-probe-{}-{n}", std::process::id()));
    fs::create_dir(&probe)
        .map_err(|e| io::Error::new(e.kind(), format!("creating a cgroup: {e}")))?;
    let entry = probe.join(if v2 { "cgroup.procs" } else { "tasks" });
    let joined = std::process::Command::new("/bin/sh")
        .args(["-c", "echo 0 > \"$1\"", "sh"])
        .arg(&entry)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
    let started = std::time::Instant::now();
    while let Err(e) = fs::remove_dir(&probe) {
        if e.kind() == io::ErrorKind::NotFound || started.elapsed() >= REMOVE_WITHIN {
            break;
        }
        std::thread::sleep(REMOVE_PAUSE);
    }
    match joined {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("moving a process into a cgroup failed ({status})"),
        )),
        Err(e) => Err(e),
    }
}

fn prepare_v2(dir: &Path, wanted: Controllers) -> io::Result<(PathBuf, Controllers)> {
    let dir = dir.to_path_buf();
    let above = dir.parent().unwrap_or(&dir).to_path_buf();
    let names = [
        ("memory", wanted.memory),
        ("pids", wanted.pids),
        ("cpu", wanted.cpu),
    ];
    for (name, want) in names {
        if want {
            // Already enabled, or refused: what counts is what `parent` ends up with.
            let _ = fs::write(above.join("cgroup.subtree_control"), format!("+{name}"));
        }
    }
    fs::create_dir_all(&dir)?;
    for (name, want) in names {
        if want {
            let _ = fs::write(dir.join("cgroup.subtree_control"), format!("+{name}"));
        }
    }
    let enabled = fs::read_to_string(dir.join("cgroup.subtree_control"))?;
    let on = |name: &str| enabled.split_whitespace().any(|c| c == name);
    Ok((
        dir,
        Controllers {
            memory: wanted.memory && on("memory"),
            pids: wanted.pids && on("pids"),
            cpu: wanted.cpu && on("cpu"),
        },
    ))
}

/// Mount point, file system type and super options of one line of `/proc/self/mountinfo`.
fn parse_mount(line: &str) -> Option<(PathBuf, &str, &str)> {
    let (left, right) = line.split_once(" - ")?;
    let mount = left.split(' ').nth(4)?;
    let mut right = right.split(' ');
    let fstype = right.next()?;
    let _source = right.next()?;
    let options = right.next().unwrap_or("");
    Some((PathBuf::from(unescape(mount)), fstype, options))
}

/// Undoes the octal escapes (`\040` for a space) of mountinfo paths.
fn unescape(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| b == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .and_then(|d| u8::from_str_radix(std::str::from_utf8(d).ok()?, 8).ok());
        match octal {
            Some(value) => {
                out.push(value);
                i += 4;
            }
            None => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cgroup that cannot be made fails the sandbox with a message that names no host path
    /// (it reaches the run's status).
    #[test]
    fn a_failure_names_no_host_path() {
        let dir = tempfile::tempdir().expect("dir");
        // A parent that went away after it was opened.
        let parent = dir.path().join("gone");
        fs::create_dir(&parent).expect("parent");
        let fd = open_dir(&parent).expect("open");
        fs::remove_dir(&parent).expect("remove");
        let cgroups = Cgroups {
            hierarchies: vec![Hierarchy {
                parent: parent.clone(),
                fd,
                memsw: false,
                v2: true,
                controllers: Controllers::default(),
                pool: None,
            }],
        };
        let limits = Limits::default();
        let message = match cgroups.create("sandbox-key", &limits, None) {
            Err(Error::Failed(message)) => message,
            other => panic!("created: {other:?}"),
        };
        assert!(message.contains("the sandbox's cgroup"), "{message}");
        assert!(
            !message.contains(&dir.path().display().to_string()),
            "{message}"
        );
    }

    #[test]
    fn mountinfo_lines() {
        let v1 = "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory";
        assert_eq!(
            parse_mount(v1),
            Some((
                PathBuf::from("/sys/fs/cgroup/memory"),
                "cgroup",
                "rw,memory"
            ))
        );
        let v2 = "30 23 0:26 / /sys/fs/cgroup rw shared:4 - cgroup2 cgroup2 rw,nsdelegate";
        assert_eq!(
            parse_mount(v2),
            Some((PathBuf::from("/sys/fs/cgroup"), "cgroup2", "rw,nsdelegate"))
        );
        let spaced = "1 2 0:1 / /mnt/a\\040b rw - ext4 /dev/x rw";
        assert_eq!(
            parse_mount(spaced).map(|m| m.0),
            Some(PathBuf::from("/mnt/a b"))
        );
        assert_eq!(parse_mount("garbage"), None);
        assert_eq!(unescape("a\\134b\\"), "a\\b\\");
    }

    #[test]
    fn controller_sets() {
        let mem = Controllers {
            memory: true,
            ..Controllers::default()
        };
        let all = Controllers {
            memory: true,
            pids: true,
            cpu: true,
        };
        assert_eq!(
            all.minus(mem),
            Controllers {
                memory: false,
                pids: true,
                cpu: true
            }
        );
        assert_eq!(mem.or(Controllers::default()), mem);
        assert!(!Controllers::default().any());
    }
}
