//! Stage one: cgroups, the sandbox's user, `no_new_privs`, the new namespaces, and stage two
//! started as PID 1 of the new pid namespace.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode, Stdio};

use rustix::process::Signal;
use rustix::thread::UnshareFlags;

use crate::{Error, INIT_ARG, Plan, unshare, write_file};

/// Reads the plan from standard input and starts the sandbox; returns how its program exited.
pub(crate) fn enter() -> Result<ExitCode, Error> {
    let mut bytes = Vec::new();
    std::io::stdin()
        .read_to_end(&mut bytes)
        .map_err(Error::step("reading the plan"))?;
    let mut plan = Plan::decode(&bytes)?;
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
    if !plan.network {
        flags |= UnshareFlags::NEWNET;
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
    let encoded = plan.encode()?;

    let mut init = Command::new("/proc/self/exe")
        .arg0("nodus-launch")
        .arg(INIT_ARG)
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::piped())
        .spawn()
        .map_err(Error::step("starting the sandbox's init"))?;
    // The plan, length first; the pipe stays open while this process lives, so that stage
    // two can tell, once its own parent-death signal is set, that this one is still there.
    let mut pipe = init
        .stdin
        .take()
        .ok_or_else(|| Error::Plan("no pipe to the sandbox's init".to_owned()))?;
    let length = u64::try_from(encoded.len()).unwrap_or(u64::MAX);
    // A failed write means stage two is gone already: its status says how.
    let _ = pipe
        .write_all(&length.to_le_bytes())
        .and_then(|()| pipe.write_all(&encoded));
    let status = init
        .wait()
        .map_err(Error::step("waiting for the sandbox's init"))?;
    drop(pipe);
    Ok(crate::exit_code(status))
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
    Ok(())
}
