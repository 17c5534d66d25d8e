//! What the conformance suite does not cover of the bubblewrap backend: the message when
//! `bwrap` is missing, re-creating over the same directory after a restart, commands inside
//! the sandbox's cgroups, rlimits where no cgroup is used, and what a sandbox sees of the host.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nodus_core::Sandbox;
use nodus_core::sandbox::{Error, ExecOutput, SandboxId, SandboxSpec};
use nodus_sandbox::conformance::{request, test_limits, unique_key};
use nodus_sandbox::{BwrapConfig, BwrapSandbox, CgroupUse};

fn spec(key: &str) -> SandboxSpec {
    SandboxSpec {
        key: key.to_owned(),
        image: None,
        env: BTreeMap::new(),
        limits: test_limits(),
        network: false,
    }
}

async fn exec(sandbox: &BwrapSandbox, id: &SandboxId, command: &str) -> ExecOutput {
    sandbox.exec(id, &request(command)).await.expect("exec")
}

fn text(out: &ExecOutput) -> String {
    String::from_utf8_lossy(&out.stdout.bytes).into_owned()
}

#[tokio::test]
async fn missing_bwrap_says_how_to_install_it() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut config = BwrapConfig::new(root.path().to_path_buf());
    config.bwrap = Some(PathBuf::from("/nonexistent/bwrap"));
    let sandbox = BwrapSandbox::new(config);
    match sandbox.create(&spec(&unique_key("nobwrap"))).await {
        Err(Error::Refused(why)) => {
            assert!(why.contains("apt-get install bubblewrap"), "{why}");
            assert!(why.contains("unisolated"), "{why}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_restarted_server_recreates_over_the_same_directory() {
    let root = tempfile::tempdir().expect("tempdir");
    let key = unique_key("restart");
    let first = BwrapSandbox::new(BwrapConfig::new(root.path().to_path_buf()));
    let info = first.create(&spec(&key)).await.expect("create");
    assert!(info.isolated);
    exec(&first, &info.id, "echo kept > state").await;
    drop(first);

    // As after a crash: a new backend value over the same root.
    let again = BwrapSandbox::new(BwrapConfig::new(root.path().to_path_buf()));
    assert_eq!(
        again.exec(&info.id, &request("true")).await,
        Err(Error::NotFound(info.id.clone())),
        "exec before re-create"
    );
    let id = again.create(&spec(&key)).await.expect("re-create").id;
    assert_eq!(id, info.id);
    assert_eq!(text(&exec(&again, &id, "cat state").await), "kept\n");
    assert!(
        root.path()
            .join("sandboxes")
            .join(&key)
            .join("state")
            .is_file()
    );
    again.destroy(&id).await.expect("destroy");
    assert!(!root.path().join("sandboxes").join(&key).exists());
}

/// The cgroup v1 or v2 directory of a controller for `key`, if this host has one.
fn cgroup_dir(controller: &str, key: &str) -> Option<PathBuf> {
    let v1 = Path::new("/sys/fs/cgroup")
        .join(controller)
        .join("nodus")
        .join(key);
    let v2 = Path::new("/sys/fs/cgroup/nodus").join(key);
    [v1, v2].into_iter().find(|p| p.is_dir())
}

#[tokio::test]
async fn commands_run_inside_the_sandbox_cgroups_with_its_limits() {
    let root = tempfile::tempdir().expect("tempdir");
    let sandbox = BwrapSandbox::new(BwrapConfig::new(root.path().to_path_buf()));
    let key = unique_key("cgroups");
    let id = sandbox.create(&spec(&key)).await.expect("create").id;
    // This machine kind mounts cgroup v1 and runs tests as root: the limits are cgroups here.
    let memory = cgroup_dir("memory", &key).expect("a memory cgroup for the sandbox");
    let pids = cgroup_dir("pids", &key).expect("a pids cgroup for the sandbox");
    let limit = std::fs::read_to_string(memory.join("memory.limit_in_bytes"))
        .or_else(|_| std::fs::read_to_string(memory.join("memory.max")))
        .expect("memory limit");
    assert_eq!(limit.trim(), (256u64 << 20).to_string());
    assert_eq!(
        std::fs::read_to_string(pids.join("pids.max"))
            .expect("pids")
            .trim(),
        "64"
    );
    // While a command runs, its processes are in the cgroup: bubblewrap, the sandbox's init,
    // the shell and `sleep`.
    let (out, seen) = tokio::join!(exec(&sandbox, &id, "sleep 3; echo done"), async {
        let started = std::time::Instant::now();
        loop {
            let procs = std::fs::read_to_string(pids.join("cgroup.procs")).expect("procs");
            if procs.lines().count() >= 4 || started.elapsed() > Duration::from_millis(2500) {
                return procs;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    assert_eq!(text(&out), "done\n");
    assert!(seen.lines().count() >= 4, "bwrap and the command: {seen:?}");

    // A cgroup gone from under the sandbox: the command does not run outside it, and the
    // failure is the sandbox's, not the command's.
    // The last processes of the command leave the cgroup a moment after it answered.
    let patience = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match std::fs::remove_dir(&pids) {
            Ok(()) => break,
            Err(e)
                if e.kind() == std::io::ErrorKind::ResourceBusy
                    && std::time::Instant::now() < patience =>
            {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("remove the pids cgroup: {e}"),
        }
    }
    let refused = sandbox
        .exec(&id, &request("echo ran > ran"))
        .await
        .expect_err("no command outside the cgroups");
    assert!(
        matches!(&refused, Error::Failed(m) if m.contains("cannot join the cgroup")),
        "{refused:?}"
    );
    assert!(
        !root
            .path()
            .join("sandboxes")
            .join(&key)
            .join("ran")
            .exists()
    );

    sandbox.destroy(&id).await.expect("destroy");
    assert!(
        cgroup_dir("memory", &key).is_none(),
        "the cgroups are removed"
    );
}

#[tokio::test]
async fn without_cgroups_rlimits_contain_fork_bombs_or_root_is_refused() {
    let root = tempfile::tempdir().expect("tempdir");
    let mut config = BwrapConfig::new(root.path().to_path_buf());
    config.cgroups = CgroupUse::Never;
    let sandbox = BwrapSandbox::new(config);
    let key = unique_key("rlimits");
    if rustix::process::getuid().is_root() {
        // As root an rlimit cannot contain processes (it counts every root process of the
        // host): without a pids cgroup the sandbox is refused, with a reason.
        let refused = sandbox
            .create(&spec(&key))
            .await
            .expect_err("refused as root");
        assert!(refused.to_string().contains("pids cgroup"), "{refused}");
        return;
    }
    let id = sandbox.create(&spec(&key)).await.expect("create").id;
    assert!(cgroup_dir("pids", &key).is_none());
    let limits = exec(
        &sandbox,
        &id,
        "grep -E 'Max (processes|address space)' /proc/self/limits",
    )
    .await;
    let limits = text(&limits);
    let fields: Vec<Vec<&str>> = limits
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(fields[0][2..4], ["64", "64"], "{limits}");
    let memory = (256u64 << 20).to_string();
    assert_eq!(
        fields[1][3..5],
        [memory.as_str(), memory.as_str()],
        "{limits}"
    );

    let mut bomb = request("bomb() { bomb | bomb & }; bomb; sleep 30");
    bomb.timeout = Duration::from_secs(4);
    let out = sandbox.exec(&id, &bomb).await.expect("bomb");
    assert!(out.timed_out);
    let hog = exec(
        &sandbox,
        &id,
        "dd if=/dev/zero of=/dev/null bs=600M count=1",
    )
    .await;
    assert_ne!(hog.exit_code, Some(0), "{hog:?}");
    assert_eq!(text(&exec(&sandbox, &id, "echo ok").await), "ok\n");
    sandbox.destroy(&id).await.expect("destroy");
}

#[tokio::test]
async fn the_sandbox_sees_little_of_the_host() {
    let root = tempfile::tempdir().expect("tempdir");
    let sandbox = BwrapSandbox::new(BwrapConfig::new(root.path().to_path_buf()));
    let id = sandbox
        .create(&spec(&unique_key("view")))
        .await
        .expect("create")
        .id;
    let out = exec(
        &sandbox,
        &id,
        "ls -A /; echo --; pwd; id -u; grep CapEff /proc/self/status; \
         ls /proc | grep -c '^[0-9]'; hostname",
    )
    .await;
    let seen = text(&out);
    let (top, rest) = seen.split_once("--\n").expect("two parts");
    let mut top: Vec<&str> = top.lines().collect();
    top.sort_unstable();
    for entry in &top {
        assert!(
            [
                "bin", "dev", "etc", "lib", "lib32", "lib64", "libx32", "proc", "sbin", "tmp",
                "usr", "work"
            ]
            .contains(entry),
            "unexpected /{entry} in {top:?}"
        );
    }
    let rest: Vec<&str> = rest.lines().collect();
    assert_eq!(rest[0], "/work");
    assert_eq!(rest[2], "CapEff:\t0000000000000000", "no capabilities");
    let processes: u32 = rest[3].parse().expect("count");
    assert!(processes <= 4, "only the sandbox's processes: {processes}");
    assert_eq!(rest[4], "nodus");

    // The backend's root (other sandboxes, masks) is not there; the masks cannot be read.
    let probe = exec(
        &sandbox,
        &id,
        &format!(
            "ls {} 2>&1; cat /etc/shadow 2>&1; echo rc=$?",
            root.path().display()
        ),
    )
    .await;
    let probe = text(&probe);
    let probe = probe.as_str();
    assert!(probe.contains("No such file or directory"), "{probe}");
    assert!(probe.contains("Permission denied"), "{probe}");
    assert!(probe.ends_with("rc=1\n"), "{probe}");
    sandbox.destroy(&id).await.expect("destroy");
}
