//! The resident launcher's pool of empty network namespaces, for the sandboxes without
//! network (issue 19): making a network namespace (`copy_net_ns` in `unshare`) and tearing it
//! down (`cleanup_net`, in kernel workers) is the dearest single step of a sandbox's start
//! and end, and an emptied one is as good as a fresh one.
//!
//! Only where the launcher runs as root of the initial user namespace with `CAP_SYS_ADMIN`
//! (a root server): a namespace is made there by `unshare(CLONE_NEWNET)` in the launcher
//! itself, opened (`/proc/thread-self/ns/net`), and the launcher `setns` back to the
//! namespace it started in (whose descriptor it opened at start). Such a namespace belongs to
//! the initial user namespace: a sandbox's root, in a user namespace of its own, has no
//! capability over it (it cannot raise loopback, add an interface, a route or a rule, nor
//! write its sysctls), so nothing a sandbox could configure is left in one. Its only
//! interface is loopback, down, as in a fresh one.
//!
//! The child enters the namespace with `setns` while still root, and stage one's `unshare`
//! then leaves out `CLONE_NEWNET`.
//!
//! Invariant, where a namespace goes back ([`NetPool::give_back`]): only once its child
//! (stage one) was reaped and had EXITED, not been killed by a signal. Stage one exits only
//! after it reaped the sandbox's init (or before it forked one: then nothing but it entered
//! the namespace), and the init of a pid namespace is reaped only once every process of that
//! namespace is gone (the kernel kills them when the init dies and waits for them before the
//! init can be reaped). No process outside the sandbox's pid namespace but stage one ever
//! entered the namespace (the sandbox's processes have no capability to `setns` into another
//! one, nor could anything of them move out of their pid namespace). So a namespace whose
//! stage one exited holds no process. Stage one killed by a signal may leave its init still
//! dying: that namespace is dropped instead (the kernel frees it when its last process goes),
//! as is one that finds the pool full.
//!
//! Sockets close with their processes; one kind can outlive them a moment: a unix socket
//! whose last reference is an in-flight `SCM_RIGHTS` message, freed by the kernel's garbage
//! collector shortly after. The namespace has no address a socket of the next sandbox could
//! reach it by but an abstract name, which such a socket no longer serves (nobody can accept
//! on it).

use std::os::fd::{AsFd, OwnedFd};

use rustix::fs::{Mode, OFlags};
use rustix::process::WaitStatus;
use rustix::thread::{CapabilitySet, LinkNameSpaceType, UnshareFlags};

use crate::Error;

/// The launch argument that gives the resident launcher its pool's size (the number next):
/// `FORKS_ARG --netns-pool N`. Without it, or with 0, there is no pool.
pub const NETNS_POOL_ARG: &str = "--netns-pool";

/// Empty network namespaces kept for the next sandboxes without network.
#[derive(Debug)]
pub(crate) struct NetPool {
    /// The network namespace the launcher started in, to go back to after making one.
    home: OwnedFd,
    /// The namespaces ready to hand out, each known empty.
    free: Vec<OwnedFd>,
    /// The most kept.
    capacity: usize,
}

impl NetPool {
    /// A pool of at most `capacity` namespaces, when this process may keep one: `capacity` is
    /// not 0, and it runs as root of the initial user namespace with `CAP_SYS_ADMIN`. `None`
    /// otherwise (each sandbox's stage one then makes its own).
    pub(crate) fn open(capacity: usize) -> Option<NetPool> {
        if capacity == 0 || !initial_root() {
            return None;
        }
        let home = open_own()?;
        Some(NetPool {
            home,
            free: Vec::with_capacity(capacity),
            capacity,
        })
    }

    /// A namespace for one sandbox without network: one from the pool, else a new one.
    /// `Ok(None)` when none can be made (stage one then makes its own); an error when this
    /// process could not go back to its own namespace (it must not go on: its next children
    /// would start in the wrong one).
    pub(crate) fn take(&mut self) -> Result<Option<OwnedFd>, Error> {
        if let Some(netns) = self.free.pop() {
            return Ok(Some(netns));
        }
        if crate::unshare(UnshareFlags::NEWNET).is_err() {
            return Ok(None);
        }
        let made = open_own();
        rustix::thread::move_into_link_name_space(
            self.home.as_fd(),
            Some(LinkNameSpaceType::Network),
        )
        .map_err(Error::errno(
            "going back to the launcher's own network namespace",
        ))?;
        Ok(made)
    }

    /// Takes back `netns`, which the child that ended with `status` had: kept only when that
    /// child EXITED (see the module's invariant) and the pool has room; dropped otherwise.
    pub(crate) fn give_back(&mut self, netns: OwnedFd, status: WaitStatus) {
        if status.exit_status().is_some() {
            self.put(netns);
        }
    }

    /// Takes back `netns`, which no process entered (its child was never forked).
    pub(crate) fn put_unused(&mut self, netns: OwnedFd) {
        self.put(netns);
    }

    fn put(&mut self, netns: OwnedFd) {
        if self.free.len() < self.capacity {
            self.free.push(netns);
        }
    }
}

/// This thread's network namespace, opened (close-on-exec).
fn open_own() -> Option<OwnedFd> {
    rustix::fs::open(
        "/proc/thread-self/ns/net",
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ok()
}

/// Whether this process is root of the initial user namespace (its uid map is the whole
/// identity) with `CAP_SYS_ADMIN` in effect.
fn initial_root() -> bool {
    let whole = std::fs::read_to_string("/proc/self/uid_map")
        .is_ok_and(|map| map.split_whitespace().collect::<Vec<_>>() == ["0", "0", "4294967295"]);
    whole
        && rustix::process::geteuid().is_root()
        && rustix::thread::capabilities(None)
            .is_ok_and(|sets| sets.effective.contains(CapabilitySet::SYS_ADMIN))
}

/// The pool's size from the resident launcher's arguments (after [`crate::FORKS_ARG`]): 0
/// when not given.
pub(crate) fn size_from(args: &[std::ffi::OsString]) -> Result<usize, Error> {
    match args {
        [] => Ok(0),
        [flag, size] if flag == NETNS_POOL_ARG => size
            .to_str()
            .and_then(|size| size.parse().ok())
            .ok_or_else(|| {
                Error::Usage(format!(
                    "{NETNS_POOL_ARG} takes a number of namespaces, not {size:?}"
                ))
            }),
        other => Err(Error::Usage(format!(
            "the resident launcher takes only `{NETNS_POOL_ARG} N`, not {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_size_is_read_from_the_arguments_or_refused_by_name() {
        let args = |list: &[&str]| -> Vec<std::ffi::OsString> {
            list.iter().map(|arg| (*arg).into()).collect()
        };
        assert_eq!(size_from(&args(&[])).expect("none"), 0);
        assert_eq!(size_from(&args(&["--netns-pool", "7"])).expect("7"), 7);
        let e = size_from(&args(&["--netns-pool", "x"])).expect_err("x");
        assert!(
            e.to_string()
                .contains("--netns-pool takes a number of namespaces, not \"x\""),
            "{e}"
        );
        let e = size_from(&args(&["--other"])).expect_err("other");
        assert!(e.to_string().contains("--other"), "{e}");
    }
}
