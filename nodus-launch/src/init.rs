//! Stage two, PID 1 of the sandbox: lays out its root, enters the inner user namespace,
//! starts the program and reaps every process of the namespace until the program exits.

use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};

use rustix::event::{PollFd, PollFlags};
use rustix::process::{Resource, Rlimit, Signal, WaitOptions};
use rustix::thread::UnshareFlags;

use crate::plan::Limit;
use crate::{Error, Plan, unshare, write_file};

/// Sets the plan's rlimits on PID 1, before anything of the sandbox runs: every process
/// of the sandbox (a plan's program, or each command of the channel) inherits them. All but
/// the address space's, which each program gets of its own ([`limit_address_space`]).
fn set_rlimits(plan: &Plan) -> Result<(), Error> {
    for (limit, value) in &plan.rlimits {
        let resource = match limit {
            Limit::FileSize => Resource::Fsize,
            Limit::Processes => Resource::Nproc,
            Limit::AddressSpace => continue,
        };
        let both = Rlimit {
            current: Some(*value),
            maximum: Some(*value),
        };
        rustix::process::setrlimit(resource, both).map_err(Error::errno(format!(
            "setting the limit {limit:?} to {value}"
        )))?;
    }
    Ok(())
}

/// Gives `command`'s program the plan's address-space limit, set in its own process between
/// the fork and the `exec` (the new image starts within it), not on PID 1: PID 1 is a fork
/// of the launcher, whose address space may hold more than the limit reserved and unused (the
/// `nodus` binary's allocator reserves 1 GiB up front), and under the limit it could start
/// nothing. Every process the program starts inherits the limit.
#[allow(unsafe_code)]
pub(crate) fn limit_address_space(command: &mut Command, plan: &Plan) {
    let Some(bytes) = plan
        .rlimits
        .iter()
        .find_map(|(limit, value)| matches!(limit, Limit::AddressSpace).then_some(*value))
    else {
        return;
    };
    let both = Rlimit {
        current: Some(bytes),
        maximum: Some(bytes),
    };
    // SAFETY: the closure runs in the child between its fork and its `exec`, where only
    // async-signal-safe calls may be made: it makes one, `setrlimit(2)` (rustix's wrapper
    // is the system call alone: it neither allocates nor takes a lock), on a value it copies.
    unsafe {
        command.pre_exec(move || {
            rustix::process::setrlimit(Resource::As, both).map_err(std::io::Error::from)
        });
    }
}

/// Runs stage two (forked by stage one, which holds the write end of `stage_one`'s pipe while
/// it lives) with stage one's plan.
pub(crate) fn init(plan: Plan, stage_one: OwnedFd) -> Result<u8, Error> {
    // First, so that the sandbox ends with stage one (and through it with the server).
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL))
        .map_err(Error::errno("setting the parent-death signal"))?;
    // A hang-up here means stage one died before the parent-death signal was set, and
    // nothing would end this sandbox with it.
    let mut polled = [PollFd::new(&stage_one, PollFlags::IN)];
    let now = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    rustix::event::poll(&mut polled, Some(&now)).map_err(Error::errno("polling stage one"))?;
    if polled[0].revents().contains(PollFlags::HUP) {
        return Err(Error::Plan(
            "stage one ended before the sandbox started".to_owned(),
        ));
    }
    // No controlling terminal of the server's session reaches the sandbox.
    rustix::process::setsid().map_err(Error::errno("starting a new session"))?;
    let (uid, gid) = plan
        .outer
        .ok_or_else(|| Error::Plan("stage one gave no outer user".to_owned()))?;
    crate::root::build(&plan)?;
    rustix::system::sethostname(plan.hostname.as_bytes())
        .map_err(Error::errno("setting the host name"))?;
    // This user namespace may hold one more (the inner one, next) and no further: the
    // sandbox's processes cannot make user namespaces of their own.
    write_file("/proc/sys/user/max_user_namespaces", "1")?;
    unshare(UnshareFlags::NEWUSER)?;
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL))
        .map_err(Error::errno("setting the parent-death signal"))?;
    // The sandbox's user is root of the outer namespace, seen inside as the host's id.
    let _ = std::fs::write("/proc/self/setgroups", "deny");
    write_file("/proc/self/uid_map", &format!("{uid} 0 1"))?;
    write_file("/proc/self/gid_map", &format!("{gid} 0 1"))?;

    drop_bounding_set()?;
    set_rlimits(&plan)?;
    if plan.channel {
        return crate::serve::serve(&plan);
    }
    let (program, args) = plan
        .program
        .split_first()
        .ok_or_else(|| Error::Plan("no program".to_owned()))?;
    // With a non-zero user id, `exec` leaves the program no capabilities.
    let mut command = Command::new(program);
    command
        .args(args)
        .env_clear()
        .envs(plan.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&plan.work_inside)
        .stdin(Stdio::null());
    limit_address_space(&mut command, &plan);
    let child = command.spawn().map_err(Error::step(format!(
        "starting {}",
        program.to_string_lossy()
    )))?;
    let main = child.id();
    // PID 1 reaps every orphan of the namespace; the program's own end ends the sandbox.
    loop {
        match rustix::process::wait(WaitOptions::empty()) {
            Ok(Some((pid, status))) if pid.as_raw_nonzero().get().unsigned_abs() == main => {
                return Ok(crate::code_of(status));
            }
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(Error::errno("waiting for the sandbox's processes")(e)),
        }
    }
}

/// Empties the capability bounding set, so that no program started here gets a capability
/// back, not even as user id 0 (the sandbox's user under a root server that runs sandboxes as
/// itself).
fn drop_bounding_set() -> Result<(), Error> {
    for bit in 0..64 {
        let capability = rustix::thread::CapabilitySet::from_bits_retain(1 << bit);
        match rustix::thread::remove_capability_from_bounding_set(capability) {
            Ok(()) => {}
            // Past the kernel's last capability.
            Err(rustix::io::Errno::INVAL) => break,
            Err(e) => return Err(Error::errno("dropping the capability bounding set")(e)),
        }
    }
    Ok(())
}
