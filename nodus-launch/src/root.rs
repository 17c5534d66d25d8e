//! The sandbox's root file system, laid out by stage two in its own mount namespace: a tmpfs
//! with the read-only binds, a fresh `/proc`, a small `/dev`, a sized `/tmp` and the working
//! directory, then `pivot_root` into it and the host's tree detached.
//!
//! No step reads `/proc/self/mountinfo`: bind sources are cloned first (so that mounting the
//! new root over `/tmp` hides none of them), and a read-only remount keeps the flags the
//! kernel locks (`nosuid`, `nodev`, `noexec`, atime) from `statvfs` of the mount itself.

use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{FileType, Mode, StatVfsMountFlags};
use rustix::mount::{
    MountFlags, MountPropagationFlags, MoveMountFlags, OpenTreeFlags, UnmountFlags,
};

use crate::{Error, Plan};

/// Where the new root is mounted before the pivot (hidden by it from the host's view of
/// this mount namespace only).
const STAGING: &str = "/tmp";

/// The host devices a sandbox gets, bound at the same names.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// Symbolic links in the sandbox's `/dev`: (name, target).
const DEV_LINKS: &[(&str, &str)] = &[
    ("fd", "/proc/self/fd"),
    ("stdin", "/proc/self/fd/0"),
    ("stdout", "/proc/self/fd/1"),
    ("stderr", "/proc/self/fd/2"),
    ("core", "/proc/kcore"),
    ("ptmx", "pts/ptmx"),
];

/// A host tree cloned before the new root hides it: a detached copy of the mount at a host
/// path with everything mounted below it (`open_tree` with `OPEN_TREE_CLONE`), attached in
/// the new root by `move_mount`, with no path walked again (the bind of old went through
/// `/proc/self/fd/N`).
struct Source(OwnedFd);

/// Clones the tree at `path`; `None` when nothing is there (a host without `/dev/tty`).
fn clone_tree(path: &Path) -> Result<Option<Source>, Error> {
    let flags = OpenTreeFlags::OPEN_TREE_CLONE
        | OpenTreeFlags::OPEN_TREE_CLOEXEC
        | OpenTreeFlags::AT_RECURSIVE;
    match rustix::mount::open_tree(rustix::fs::CWD, path, flags) {
        Ok(fd) => Ok(Some(Source(fd))),
        Err(rustix::io::Errno::NOENT) => Ok(None),
        Err(e) => Err(Error::errno(format!("cloning {}", path.display()))(e)),
    }
}

/// Clones the tree at `path`, which must be there.
fn clone_required(path: &Path) -> Result<Source, Error> {
    clone_tree(path)?.ok_or_else(|| Error::Step {
        step: format!("cloning {}", path.display()),
        source: std::io::ErrorKind::NotFound.into(),
    })
}

/// `path` (absolute) below `root`.
fn under(root: &Path, path: &Path) -> PathBuf {
    let relative: PathBuf = path
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect();
    root.join(relative)
}

fn mkdirs(path: &Path) -> Result<(), Error> {
    std::fs::create_dir_all(path).map_err(Error::step(format!("making {}", path.display())))
}

fn mount_tmpfs(target: &Path, flags: MountFlags, options: &str) -> Result<(), Error> {
    let options = std::ffi::CString::new(options)
        .map_err(|_| Error::Plan(format!("tmpfs options {options:?} hold a NUL")))?;
    rustix::mount::mount("tmpfs", target, "tmpfs", flags, Some(options.as_c_str())).map_err(
        Error::errno(format!("mounting a tmpfs on {}", target.display())),
    )
}

fn attach(source: &Source, target: &Path) -> Result<(), Error> {
    rustix::mount::move_mount(
        &source.0,
        "",
        rustix::fs::CWD,
        target,
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
    )
    .map_err(Error::errno(format!("binding {}", target.display())))
}

/// Makes the mount at `target` read-only, keeping the flags the kernel would not let this
/// namespace clear.
fn remount_read_only(target: &Path) -> Result<(), Error> {
    let stat = rustix::fs::statvfs(target).map_err(Error::errno(format!(
        "reading the mount of {}",
        target.display()
    )))?;
    let mut flags = MountFlags::BIND | MountFlags::RDONLY;
    for (kept, flag) in [
        (StatVfsMountFlags::NOSUID, MountFlags::NOSUID),
        (StatVfsMountFlags::NODEV, MountFlags::NODEV),
        (StatVfsMountFlags::NOEXEC, MountFlags::NOEXEC),
        (StatVfsMountFlags::NOATIME, MountFlags::NOATIME),
        (StatVfsMountFlags::NODIRATIME, MountFlags::NODIRATIME),
        (StatVfsMountFlags::RELATIME, MountFlags::RELATIME),
    ] {
        if stat.f_flag.contains(kept) {
            flags |= flag;
        }
    }
    rustix::mount::mount_remount(target, flags, "").map_err(Error::errno(format!(
        "making {} read-only",
        target.display()
    )))
}

/// Lays out the sandbox's root and pivots into it; the current directory is then `/`.
pub(crate) fn build(plan: &Plan) -> Result<(), Error> {
    let binds: Vec<(Source, &PathBuf)> = plan
        .ro_binds
        .iter()
        .map(|dir| Ok((clone_required(dir)?, dir)))
        .collect::<Result<_, Error>>()?;
    let binds_at: Vec<(Source, &PathBuf)> = plan
        .ro_binds_at
        .iter()
        .map(|(host, inside)| Ok((clone_required(host)?, inside)))
        .collect::<Result<_, Error>>()?;
    let work = clone_required(&plan.work_host)?;
    // A host without one of them (a container without /dev/tty) goes without.
    let mut devices = Vec::with_capacity(DEVICES.len());
    for name in DEVICES {
        if let Some(source) = clone_tree(&Path::new("/dev").join(name))? {
            devices.push((source, *name));
        }
    }

    // Nothing of what follows propagates back to the host.
    rustix::mount::mount_change(
        "/",
        MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
    )
    .map_err(Error::errno("making the mounts private"))?;
    let root = Path::new(STAGING);
    mount_tmpfs(root, MountFlags::NOSUID | MountFlags::NODEV, "mode=0755")?;

    for (source, dir) in &binds {
        let target = under(root, dir);
        mkdirs(&target)?;
        attach(source, &target)?;
        remount_read_only(&target)?;
    }
    for sub in &plan.ro_submounts {
        let target = under(root, sub);
        // A submount that went away since the plan was made is no longer there to protect.
        if target.exists() {
            remount_read_only(&target)?;
        }
    }
    for (target, path) in &plan.symlinks {
        let link = under(root, path);
        if let Some(parent) = link.parent().filter(|parent| *parent != root) {
            mkdirs(parent)?;
        }
        rustix::fs::symlink(target, &link)
            .map_err(Error::errno(format!("making the link {}", path.display())))?;
    }

    let proc = root.join("proc");
    mkdirs(&proc)?;
    rustix::mount::mount(
        "proc",
        &proc,
        "proc",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        None,
    )
    .map_err(Error::errno("mounting /proc"))?;

    let dev = root.join("dev");
    mkdirs(&dev)?;
    mount_tmpfs(&dev, MountFlags::NOSUID | MountFlags::NOEXEC, "mode=0755")?;
    for (source, name) in &devices {
        let node = dev.join(name);
        // An empty file to mount the device on (one call, where a create is an open and a
        // close).
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &node,
            FileType::RegularFile,
            Mode::from_raw_mode(0o644),
            0,
        )
        .map_err(Error::errno(format!("making /dev/{name}")))?;
        attach(source, &node)?;
    }
    for (name, target) in DEV_LINKS {
        rustix::fs::symlink(*target, dev.join(name))
            .map_err(Error::errno(format!("making /dev/{name}")))?;
    }
    for dir in ["shm", "pts"] {
        rustix::fs::mkdir(dev.join(dir), Mode::from_raw_mode(0o1777))
            .map_err(Error::errno(format!("making /dev/{dir}")))?;
    }
    // mkdir's mode went through the umask.
    std::fs::set_permissions(
        dev.join("shm"),
        std::os::unix::fs::PermissionsExt::from_mode(0o1777),
    )
    .map_err(Error::step("opening /dev/shm"))?;

    let tmp = root.join("tmp");
    mkdirs(&tmp)?;
    mount_tmpfs(
        &tmp,
        MountFlags::NOSUID | MountFlags::NODEV,
        &format!("mode=1777,size={}", plan.tmp_size),
    )?;

    for (source, path) in &binds_at {
        let target = under(root, path);
        mkdirs(&target)?;
        attach(source, &target)?;
        remount_read_only(&target)?;
    }

    let inside = under(root, &plan.work_inside);
    mkdirs(&inside)?;
    attach(&work, &inside)?;

    // Into the new root; the host's tree, stacked on it by `pivot_root(".", ".")`, is
    // detached.
    rustix::process::chdir(root).map_err(Error::errno("entering the new root"))?;
    rustix::process::pivot_root(".", ".").map_err(Error::errno("pivoting into the new root"))?;
    rustix::mount::unmount(".", UnmountFlags::DETACH)
        .map_err(Error::errno("detaching the host's root"))?;
    rustix::process::chdir("/").map_err(Error::errno("entering /"))?;
    remount_read_only(Path::new("/"))?;
    drop((binds, binds_at, work, devices));
    Ok(())
}
