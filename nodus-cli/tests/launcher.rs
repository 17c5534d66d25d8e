//! The `nodus` binary is also the sandbox launcher (`nodus --nodus-launch`, what a server
//! started from it uses to start process sandboxes): started with a plan on its standard
//! input, it runs the plan's program in a sandbox. Run as root with no sandbox user, the
//! program runs as user 0 of its own namespaces, and still has no capability.

mod support;

use std::io::Write as _;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};

use support::NODUS;

/// A plan that runs `script` with `sh -c` in `work`, the host's system directories read-only.
fn plan_running(work: &std::path::Path, script: &str) -> nodus_launch::Plan {
    let mut plan = nodus_launch::Plan {
        hostname: "nodus".to_owned(),
        tmp_size: 16 << 20,
        work_host: work.to_path_buf(),
        work_inside: "/work".into(),
        program: ["/bin/sh", "-c", script].map(Into::into).to_vec(),
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        ..nodus_launch::Plan::default()
    };
    plan.add_host_dirs(["/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc"].map(Into::into));
    plan
}

/// Starts `nodus --nodus-launch` with `plan` and returns what its program printed.
fn launch(plan: &nodus_launch::Plan) -> String {
    // The sandbox's init is a fork of this process: it shows the name given here.
    let mut child = Command::new(NODUS)
        .arg0("nodus-launch")
        .arg(nodus_launch::LAUNCH_ARG)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start nodus");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(&plan.encode().expect("plan"))
        .expect("write the plan");
    let out = child.wait_with_output().expect("nodus");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{}: {stdout} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn the_nodus_binary_starts_a_sandbox_when_asked_to_launch() {
    let work = tempfile::tempdir().expect("tempdir");
    std::fs::write(work.path().join("seen"), "from the host\n").expect("write");
    let plan = plan_running(
        work.path(),
        "cat seen; hostname; id -u; grep -E '^Cap(Eff|Prm|Bnd):' \
         /proc/self/status; tr '\\0' ' ' < /proc/1/cmdline; echo; ls /proc | grep -c '^[0-9]'",
    );
    let stdout = launch(&plan);
    let user = rustix::process::getuid().as_raw().to_string();
    let expected = format!(
        "from the host\nnodus\n{user}\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\n\
         CapBnd:\t0000000000000000\nnodus-launch --nodus-launch \n"
    );
    assert!(stdout.starts_with(&expected), "{stdout}");
    // The sandbox's init, the shell, `ls` and `grep`: no process of the host.
    let processes: u32 = stdout
        .lines()
        .last()
        .and_then(|l| l.parse().ok())
        .expect("a count");
    assert!(processes <= 4, "{stdout}");
}

/// `nodus --nodus-launch-forks` is the resident launcher (what a server started from `nodus`
/// keeps to fork its sandboxes): a request on its socket starts the plan's program, whose
/// sandbox's init shows the resident launcher's command line, and it exits when the socket
/// hangs up.
#[test]
fn the_nodus_binary_is_the_resident_launcher_when_asked() {
    use std::io::Read as _;
    use std::os::fd::AsFd as _;
    let work = tempfile::tempdir().expect("tempdir");
    let plan = plan_running(
        work.path(),
        "echo resident; tr '\\0' ' ' < /proc/1/cmdline; echo",
    );
    let (ours, theirs) = nodus_launch::zygote_protocol::socket_pair().expect("socket pair");
    let mut resident = Command::new(NODUS)
        .arg0("nodus-launch")
        .arg(nodus_launch::FORKS_ARG)
        .stdin(Stdio::from(theirs))
        .spawn()
        .expect("start nodus");
    let (mut out, out_write) = std::io::pipe().expect("pipe");
    let (mut err, err_write) = std::io::pipe().expect("pipe");
    let forked = nodus_launch::zygote_protocol::request(
        ours.as_fd(),
        &plan.encode().expect("plan"),
        out_write.as_fd(),
        err_write.as_fd(),
    )
    .expect("a sandbox forked");
    drop((out_write, err_write));
    assert!(forked.pid > 1);
    let (mut stdout, mut stderr) = (String::new(), String::new());
    out.read_to_string(&mut stdout).expect("stdout");
    err.read_to_string(&mut stderr).expect("stderr");
    assert_eq!(
        stdout, "resident\nnodus-launch --nodus-launch-forks \n",
        "stderr: {stderr}"
    );
    drop(ours);
    let status = resident.wait().expect("nodus");
    assert!(status.success(), "{status}");
}

/// The plan's rlimits hold for its program (where no cgroup holds a limit, the backend gives
/// them to the launcher), as they do for each command of a sandbox's channel.
#[test]
fn the_plan_s_rlimits_hold_for_its_program() {
    let work = tempfile::tempdir().expect("tempdir");
    let mut plan = plan_running(
        work.path(),
        "grep -E '^Max (file size|processes|address space) ' /proc/self/limits",
    );
    let address_space: u64 = 512 << 20;
    plan.rlimits = vec![
        (nodus_launch::Limit::FileSize, 1 << 20),
        (nodus_launch::Limit::Processes, 64),
        (nodus_launch::Limit::AddressSpace, address_space),
    ];
    let stdout = launch(&plan);
    let limits: Vec<(String, Vec<&str>)> = stdout
        .lines()
        .map(|line| {
            let (name, rest) = line.split_at(26);
            (name.trim().to_owned(), rest.split_whitespace().collect())
        })
        .collect();
    let address_space = address_space.to_string();
    let expected = [
        ("Max file size", ["1048576", "1048576", "bytes"]),
        ("Max processes", ["64", "64", "processes"]),
        (
            "Max address space",
            [address_space.as_str(), address_space.as_str(), "bytes"],
        ),
    ];
    for (name, values) in expected {
        let found = limits.iter().find(|(n, _)| n == name);
        assert_eq!(
            found.map(|(_, v)| v.as_slice()),
            Some(&values[..]),
            "{name} in:\n{stdout}"
        );
    }
}

#[test]
fn a_malformed_plan_is_refused_by_name() {
    let out = Command::new(NODUS)
        .arg(nodus_launch::LAUNCH_ARG)
        .stdin(Stdio::null())
        .output()
        .expect("nodus");
    assert_eq!(
        out.status.code(),
        Some(i32::from(nodus_launch::FAILED_EXIT))
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("the plan is malformed: it is empty"),
        "{said}"
    );
}

#[test]
fn a_server_started_from_nodus_starts_sandboxes_with_the_launcher_program_beside_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = support::start_server(dir.path(), Some("memory:"), "process");
    let launcher = std::fs::canonicalize(env!("CARGO_BIN_EXE_nodus-launch")).expect("built");
    let expected = format!(
        "sandbox: started by the nodus launcher ({})",
        launcher.display()
    );
    let log = server.log();
    assert!(log.contains(&expected), "{expected:?} not in:\n{log}");
}
