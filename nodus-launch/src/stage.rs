//! Stage one: cgroups, the sandbox's user, `no_new_privs`, the new namespaces, and stage two
//! forked as PID 1 of the new pid namespace.

use std::io::{Read, Write};

use rustix::process::{Signal, WaitOptions};
use rustix::thread::UnshareFlags;

use crate::{Error, Plan, unshare, write_file};

/// Reads the plan from standard input and starts the sandbox; returns how its program exited.
pub(crate) fn enter() -> Result<u8, Error> {
    let mut bytes = Vec::new();
    std::io::stdin()
        .read_to_end(&mut bytes)
        .map_err(Error::step("reading the plan"))?;
    start(Plan::decode(&bytes)?, false)
}

/// Starts the sandbox of `plan` from this process (a launcher started for it, or a fork of
/// the resident launcher); returns how its program exited (in stage one and, once it has
/// forked, in stage two). `net_entered`: this process is in the sandbox's network namespace
/// already (one of the resident launcher's pool), so that no new one is made.
pub(crate) fn start(mut plan: Plan, net_entered: bool) -> Result<u8, Error> {
    if !plan.cpus.is_empty() {
        let mut set = rustix::thread::CpuSet::new();
        for &cpu in &plan.cpus {
            if cpu >= rustix::thread::CpuSet::MAX_CPU {
                return Err(Error::Plan(format!("CPU {cpu} is past the last one")));
            }
            set.set(cpu);
        }
        rustix::thread::sched_setaffinity(None, &set).map_err(Error::errno(format!(
            "pinning the sandbox to the CPUs {:?}",
            plan.cpus
        )))?;
    }
    for file in &plan.cgroup_files {
        // Writing `0` moves the writer's own (only) thread into the cgroup.
        std::fs::write(file, "0").map_err(|source| Error::Cgroup {
            path: file.display().to_string(),
            source,
        })?;
    }
    if let Some((uid, gid)) = plan.user {
        become_user(uid, gid)?;
    }
    rustix::thread::set_no_new_privs(true).map_err(Error::errno("setting no_new_privs"))?;
    let uid = rustix::process::getuid().as_raw();
    let gid = rustix::process::getgid().as_raw();
    let mut flags = UnshareFlags::NEWUSER
        | UnshareFlags::NEWNS
        | UnshareFlags::NEWPID
        | UnshareFlags::NEWIPC
        | UnshareFlags::NEWUTS
        | UnshareFlags::NEWCGROUP;
    if !plan.network && !net_entered {
        flags |= UnshareFlags::NEWNET;
    }
    // With an egress bridge, the namespaces but the user's and the network's come after it is
    // forked (see below): it stays in the host's pid and mount namespaces.
    let later = UnshareFlags::NEWNS
        | UnshareFlags::NEWPID
        | UnshareFlags::NEWIPC
        | UnshareFlags::NEWUTS
        | UnshareFlags::NEWCGROUP;
    if plan.egress.is_some() {
        flags.remove(later);
    }
    unshare(flags)?;
    // Entering a user namespace changed the credentials, which clears the parent-death
    // signal: set after it, it holds until this process ends.
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL))
        .map_err(Error::errno("setting the parent-death signal"))?;
    write_file("/proc/self/setgroups", "deny")?;
    write_file("/proc/self/uid_map", &format!("0 {uid} 1"))?;
    write_file("/proc/self/gid_map", &format!("0 {gid} 1"))?;
    plan.outer = Some((uid, gid));
    // The way out through the egress proxy: a listener in the sandbox's (new) network
    // namespace, served by a process forked before the sandbox's pid and mount namespaces are
    // entered: the sandbox's processes cannot see or signal it, and it still reaches the
    // proxy's socket by its host path (the sandbox's root, pivoted into later, would take
    // the place of its own in a shared mount namespace).
    match &plan.egress {
        Some(socket) if !net_entered => {
            crate::egress::Bridge::listen(socket.clone())?.start()?;
            unshare(later)?;
        }
        Some(_) => {
            return Err(Error::Plan(
                "a sandbox with an egress socket needs a network namespace of its own".to_owned(),
            ));
        }
        None => {}
    }

    // A pipe whose write end only this process holds: stage two, once its own parent-death
    // signal is set, sees it hung up if this process ended before (and nothing would end the
    // sandbox with it then).
    let (alive, alive_write) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(Error::errno("making a pipe"))?;
    let Some(init) = crate::fork("the sandbox's init")? else {
        drop(alive_write);
        return crate::init::init(plan, alive);
    };
    drop(alive);
    let status = loop {
        match rustix::process::waitpid(Some(init), WaitOptions::empty()) {
            Ok(Some((_, status))) => break status,
            Ok(None) | Err(rustix::io::Errno::INTR) => {}
            // Never an exit while the init may live: a pooled network namespace goes back
            // to the resident launcher's pool when this process EXITED, which must mean
            // that the init was reaped (see the `netpool` module). Aborting is a signal.
            Err(e) => {
                let _ = writeln!(
                    std::io::stderr(),
                    "nodus-launch: waiting for the sandbox's init: {e}"
                );
                std::process::abort();
            }
        }
    };
    drop(alive_write);
    Ok(crate::code_of(status))
}

/// Becomes the host user `uid`:`gid` with no supplementary groups (from root).
fn become_user(uid: u32, gid: u32) -> Result<(), Error> {
    use rustix::process::{Gid, Uid};
    let (uid, gid) = (Uid::from_raw(uid), Gid::from_raw(gid));
    rustix::thread::set_thread_groups(&[]).map_err(Error::errno("clearing the groups"))?;
    rustix::thread::set_thread_res_gid(gid, gid, gid)
        .map_err(Error::errno("becoming the sandbox's group"))?;
    rustix::thread::set_thread_res_uid(uid, uid, uid)
        .map_err(Error::errno("becoming the sandbox's user"))?;
    // Leaving root made this process non-dumpable, which gives its `/proc/self` files to
    // root: the user namespace's maps could not be written. It holds nothing of root's (the
    // plan only, which the backend wrote), and no process of that user sees it (the
    // sandboxes' processes are in pid namespaces of their own).
    rustix::process::set_dumpable_behavior(rustix::process::DumpableBehavior::Dumpable)
        .map_err(Error::errno("making the launcher dumpable again"))?;
    Ok(())
}
