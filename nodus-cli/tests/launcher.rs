//! The `nodus` binary is also the sandbox launcher (`nodus --nodus-launch`, what a server
//! started from it uses to start process sandboxes): started with a plan on its standard
//! input, it runs the plan's program in a sandbox. Run as root with no sandbox user, the
//! program runs as user 0 of its own namespaces, and still has no capability.

mod support;

use std::io::Write as _;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};

use support::NODUS;

#[test]
fn the_nodus_binary_starts_a_sandbox_when_asked_to_launch() {
    let work = tempfile::tempdir().expect("tempdir");
    std::fs::write(work.path().join("seen"), "from the host\n").expect("write");
    let mut plan = nodus_launch::Plan {
        hostname: "nodus".to_owned(),
        tmp_size: 16 << 20,
        work_host: work.path().to_path_buf(),
        work_inside: "/work".into(),
        program: [
            "/bin/sh",
            "-c",
            "cat seen; hostname; id -u; grep -E '^Cap(Eff|Prm|Bnd):' \
             /proc/self/status; tr '\\0' ' ' < /proc/1/cmdline; echo; ls /proc | grep -c '^[0-9]'",
        ]
        .map(Into::into)
        .to_vec(),
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        ..nodus_launch::Plan::default()
    };
    for dir in ["/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc"] {
        match std::fs::read_link(dir) {
            Ok(target) => plan.symlinks.push((target, dir.into())),
            Err(_) if std::path::Path::new(dir).is_dir() => plan.ro_binds.push(dir.into()),
            Err(_) => {}
        }
    }
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
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}: {stdout} {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
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
