//! What the conformance suite does not cover of the bubblewrap backend: the message when
//! `bwrap` is missing, re-creating over the same directory after a restart, commands inside
//! the sandbox's cgroups, rlimits where no cgroup is used, and what a sandbox sees of the host.
//! The tests whose names end in `_with_the_launcher` run the same on sandboxes started by
//! Nodus's own launcher, and a launcher that fails its self-check falls back to bubblewrap.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nodus_core::Sandbox;
use nodus_core::sandbox::{Error, ExecOutput, SandboxId, SandboxSpec};
use nodus_sandbox::conformance::{request, test_limits, unique_key};
use nodus_sandbox::{BwrapConfig, BwrapSandbox, CgroupUse};

/// A temporary directory that a sandbox's user can reach (a root server runs sandboxes as
/// another user, which must be able to search every directory on the way).
fn reachable_tempdir() -> tempfile::TempDir {
    let root = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o711)).expect("chmod");
    root
}

/// The backend's configuration over `root`, started by Nodus's own launcher when `launcher`
/// (the tests below that run on both say so in their names).
fn config(root: PathBuf, launcher: bool) -> BwrapConfig {
    let mut config = BwrapConfig::new(root);
    if launcher {
        config.launcher = Some(env!("CARGO_BIN_EXE_nodus-sandbox-launch").into());
    }
    config
}

/// A backend with [`config`], checked to start sandboxes as asked (not by the fallback).
async fn backend(config: BwrapConfig) -> BwrapSandbox {
    let launcher = config.launcher.is_some();
    let sandbox = BwrapSandbox::new(config);
    assert_eq!(
        sandbox.uses_launcher().await.expect("prepared"),
        launcher,
        "started by the launcher"
    );
    sandbox
}

fn spec(key: &str) -> SandboxSpec {
    SandboxSpec {
        key: key.to_owned(),
        image: None,
        env: BTreeMap::new(),
        limits: test_limits(),
        network: false,
        egress: None,
        egress_headers: Vec::new(),
        links: Default::default(),
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
    let root = reachable_tempdir();
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
    let root = reachable_tempdir();
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

/// The cgroup controllers a sandbox gets on this machine kind (cgroup v1, tests as root).
const CONTROLLERS: [&str; 3] = ["memory", "pids", "cpu"];

/// The inode of each of sandbox `key`'s cgroups: the same inode under another name is the
/// same cgroup, renamed.
fn cgroup_inodes(key: &str) -> Vec<u64> {
    CONTROLLERS
        .iter()
        .map(|controller| {
            let dir = cgroup_dir(controller, key)
                .unwrap_or_else(|| panic!("a {controller} cgroup for {key}"));
            std::fs::metadata(dir).expect("the cgroup").ino()
        })
        .collect()
}

/// What sandbox `key`'s cgroups hold of `limits`, against what they should hold, file by file.
fn assert_limits(key: &str, limits: &nodus_core::sandbox::Limits) {
    let read = |controller: &str, file: &str| {
        let dir = cgroup_dir(controller, key).expect("the cgroup");
        std::fs::read_to_string(dir.join(file))
            .unwrap_or_else(|e| panic!("{controller}/{file}: {e}"))
            .trim()
            .to_owned()
    };
    let memory = limits.memory_bytes.to_string();
    let quota = (u64::from(limits.cpu_millis) * 100).to_string();
    assert_eq!(read("memory", "memory.limit_in_bytes"), memory, "{key}");
    assert_eq!(
        read("memory", "memory.memsw.limit_in_bytes"),
        memory,
        "{key}"
    );
    assert_eq!(
        read("pids", "pids.max"),
        limits.processes.to_string(),
        "{key}"
    );
    assert_eq!(read("cpu", "cpu.cfs_quota_us"), quota, "{key}");
    assert_eq!(read("cpu", "cpu.cfs_period_us"), "100000", "{key}");
}

/// Whether any cgroup under the sandboxes' parent of `controller` has inode `ino`.
fn cgroup_with_inode(controller: &str, ino: u64) -> Option<PathBuf> {
    let parent = Path::new("/sys/fs/cgroup").join(controller).join("nodus");
    std::fs::read_dir(parent)
        .expect("the parent cgroup")
        .flatten()
        .map(|entry| entry.path())
        .find(|path| std::fs::metadata(path).is_ok_and(|meta| meta.is_dir() && meta.ino() == ino))
}

#[tokio::test]
async fn a_reused_cgroup_holds_the_new_limits_and_nothing_of_the_sandbox_before() {
    a_reused_cgroup_holds_the_new_limits_on(false).await;
}

#[tokio::test]
async fn a_reused_cgroup_holds_the_new_limits_and_nothing_of_the_sandbox_before_with_the_launcher()
{
    a_reused_cgroup_holds_the_new_limits_on(true).await;
}

/// A destroyed sandbox's emptied cgroups are the next sandbox's (the same cgroups, renamed):
/// with every limit of the new sandbox, whether higher or lower than the old one's, and
/// nothing left running of the sandbox before, even a process that was put there from
/// outside its namespaces. Dropping the backend removes the pooled cgroups.
async fn a_reused_cgroup_holds_the_new_limits_on(launcher: bool) {
    let root = reachable_tempdir();
    let sandbox = backend(config(root.path().to_path_buf(), launcher)).await;
    // Every limit unlike the next sandbox's (`test_limits`), and lower.
    let small = nodus_core::sandbox::Limits {
        cpu_millis: 500,
        memory_bytes: 128 << 20,
        processes: 32,
        ..test_limits()
    };
    let first = unique_key("pool-first");
    let id = sandbox
        .create(&SandboxSpec {
            limits: small,
            ..spec(&first)
        })
        .await
        .expect("create")
        .id;
    assert_eq!(text(&exec(&sandbox, &id, "echo in").await), "in\n");
    assert_limits(&first, &small);
    let inodes = cgroup_inodes(&first);
    // A host process in the sandbox's cgroups, outside its namespaces: killing the sandbox
    // does not end it, the backend must before the cgroups serve another sandbox.
    let mut stray = std::process::Command::new("sleep")
        .arg("600")
        .spawn()
        .expect("sleep");
    for controller in CONTROLLERS {
        let procs = cgroup_dir(controller, &first)
            .expect("cgroup")
            .join("cgroup.procs");
        std::fs::write(procs, stray.id().to_string()).expect("move the stray process");
    }
    sandbox.destroy(&id).await.expect("destroy");
    let ended = stray.try_wait().expect("the stray process");
    if ended.is_none() {
        let _ = stray.kill();
    }
    assert!(
        ended.is_some(),
        "the process left in the cgroups is ended before they are pooled"
    );

    // The next sandbox gets the same cgroups, with its own limits (higher), and nothing else
    // runs in them.
    let second = unique_key("pool-second");
    let id = sandbox.create(&spec(&second)).await.expect("create").id;
    assert_eq!(
        cgroup_inodes(&second),
        inodes,
        "the pooled cgroups are reused"
    );
    assert_limits(&second, &test_limits());
    let pids = cgroup_dir("pids", &second).expect("cgroup");
    let procs = std::fs::read_to_string(pids.join("cgroup.procs")).expect("procs");
    assert!(
        !procs
            .lines()
            .any(|pid| pid.trim() == stray.id().to_string()),
        "{procs:?}"
    );
    // Its commands run in them, under its own limits.
    assert_eq!(text(&exec(&sandbox, &id, "echo again").await), "again\n");
    sandbox.destroy(&id).await.expect("destroy");

    // And lower limits again: the memory limit goes below the one it held.
    let third = unique_key("pool-third");
    let id = sandbox
        .create(&SandboxSpec {
            limits: small,
            ..spec(&third)
        })
        .await
        .expect("create")
        .id;
    assert_eq!(
        cgroup_inodes(&third),
        inodes,
        "the pooled cgroups are reused"
    );
    assert_limits(&third, &small);
    assert_eq!(text(&exec(&sandbox, &id, "echo third").await), "third\n");
    sandbox.destroy(&id).await.expect("destroy");
    assert!(
        cgroup_dir("memory", &third).is_none(),
        "no cgroup by its key"
    );

    // The pool goes with the backend.
    assert!(cgroup_with_inode("memory", inodes[0]).is_some(), "pooled");
    drop(sandbox);
    for (controller, ino) in CONTROLLERS.iter().zip(&inodes) {
        assert_eq!(
            cgroup_with_inode(controller, *ino),
            None,
            "the pooled {controller} cgroup is removed with the backend"
        );
    }
}

/// A memory cgroup still charged with more than the pool takes (here the page cache of a
/// file the suspended sandbox keeps in its working directory) is removed, not reused; the
/// others are reused.
#[tokio::test]
async fn a_memory_cgroup_left_charged_is_not_reused() {
    let root = reachable_tempdir();
    let sandbox = backend(config(root.path().to_path_buf(), true)).await;
    let key = unique_key("pool-charged");
    let id = sandbox.create(&spec(&key)).await.expect("create").id;
    let before = cgroup_inodes(&key);
    // Suspended with little charged: all three come back.
    sandbox.suspend(&id).await.expect("suspend");
    assert_eq!(text(&exec(&sandbox, &id, "echo small").await), "small\n");
    assert_eq!(cgroup_inodes(&key), before, "reused");
    // 32 MiB of page cache, kept by the suspended sandbox's file.
    let out = exec(
        &sandbox,
        &id,
        "dd if=/dev/zero of=big bs=1M count=32 2>/dev/null && echo written",
    )
    .await;
    assert_eq!(text(&out), "written\n", "{out:?}");
    sandbox.suspend(&id).await.expect("suspend");
    assert_eq!(text(&exec(&sandbox, &id, "echo big").await), "big\n");
    let after = cgroup_inodes(&key);
    assert_ne!(
        after[0], before[0],
        "the charged memory cgroup is made anew"
    );
    assert_eq!(
        after[1..],
        before[1..],
        "the pids and cpu cgroups are reused"
    );
    sandbox.destroy(&id).await.expect("destroy");
}

#[tokio::test]
async fn commands_run_inside_the_sandbox_cgroups_with_its_limits() {
    commands_run_inside_the_sandbox_cgroups_with_its_limits_on(false).await;
}

#[tokio::test]
async fn commands_run_inside_the_sandbox_cgroups_with_its_limits_with_the_launcher() {
    commands_run_inside_the_sandbox_cgroups_with_its_limits_on(true).await;
}

async fn commands_run_inside_the_sandbox_cgroups_with_its_limits_on(launcher: bool) {
    let root = reachable_tempdir();
    let sandbox = backend(config(root.path().to_path_buf(), launcher)).await;
    let key = unique_key("cgroups");
    let id = sandbox.create(&spec(&key)).await.expect("create").id;
    // This machine kind mounts cgroup v1 and runs tests as root: the limits are cgroups here.
    let memory = cgroup_dir("memory", &key).expect("a memory cgroup for the sandbox");
    let pids = cgroup_dir("pids", &key).expect("a pids cgroup for the sandbox");
    let limit = std::fs::read_to_string(memory.join("memory.limit_in_bytes"))
        .or_else(|_| std::fs::read_to_string(memory.join("memory.max")))
        .expect("memory limit");
    assert_eq!(limit.trim(), (256u64 << 20).to_string());
    // On v1, memory plus swap is pinned to the memory limit, and one CPU is a full period.
    if let Ok(memsw) = std::fs::read_to_string(memory.join("memory.memsw.limit_in_bytes")) {
        assert_eq!(memsw.trim(), (256u64 << 20).to_string());
    }
    if let Some(cpu) = cgroup_dir("cpu", &key).filter(|dir| dir.join("cpu.cfs_period_us").exists())
    {
        let read = |file: &str| std::fs::read_to_string(cpu.join(file)).expect("cpu");
        assert_eq!(
            (
                read("cpu.cfs_period_us").trim(),
                read("cpu.cfs_quota_us").trim()
            ),
            ("100000", "100000")
        );
    }
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

    // A suspended sandbox (its run waits for a message) holds no cgroup; its next command
    // makes them again, with the same limits, and runs inside them.
    sandbox.suspend(&id).await.expect("suspend");
    assert!(
        cgroup_dir("pids", &key).is_none() && cgroup_dir("memory", &key).is_none(),
        "a suspended sandbox holds no cgroup"
    );
    assert_eq!(text(&exec(&sandbox, &id, "echo back").await), "back\n");
    let pids = cgroup_dir("pids", &key).expect("the pids cgroup, made again");
    assert_eq!(
        std::fs::read_to_string(pids.join("pids.max"))
            .expect("pids")
            .trim(),
        "64"
    );
    let procs = std::fs::read_to_string(pids.join("cgroup.procs")).expect("procs");
    assert!(
        procs.lines().count() >= 2,
        "the sandbox is in it: {procs:?}"
    );

    // A cgroup the sandbox cannot join: the command does not run outside it, and the failure
    // is the sandbox's, not the command's. Its processes are killed from outside (they leave
    // its cgroups, which stay), and its pids cgroup is closed: the next command starts it
    // again, which has to join them first.
    let patience = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let procs = std::fs::read_to_string(pids.join("cgroup.procs")).expect("procs");
        if procs.trim().is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < patience,
            "still there: {procs:?}"
        );
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            if let Some(pid) = rustix::process::Pid::from_raw(pid) {
                let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The gate joins as the sandbox's user, to whom the backend gives the `tasks` file: taken
    // back here. A root server's launcher joins as root (then becomes the sandbox's user):
    // the file is covered by a read-only one.
    let cover = if launcher {
        Some(ReadOnlyCover::over(&pids.join("tasks")))
    } else {
        std::fs::set_permissions(pids.join("tasks"), std::fs::Permissions::from_mode(0o000))
            .expect("chmod");
        None
    };
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

    drop(cover);
    sandbox.destroy(&id).await.expect("destroy");
    assert!(
        cgroup_dir("memory", &key).is_none(),
        "the cgroups are removed"
    );
}

/// A read-only file bound over a file (as root), unmounted when dropped (before the file it
/// binds is removed).
struct ReadOnlyCover {
    target: PathBuf,
    _file: tempfile::NamedTempFile,
}

impl ReadOnlyCover {
    fn over(target: &Path) -> Self {
        let file = tempfile::NamedTempFile::new().expect("a file");
        let mount = |args: &[&std::ffi::OsStr]| {
            let status = std::process::Command::new("mount")
                .args(args)
                .status()
                .expect("mount");
            assert!(status.success(), "mount {args:?}: {status}");
        };
        mount(&[
            "--bind".as_ref(),
            file.path().as_os_str(),
            target.as_os_str(),
        ]);
        let cover = ReadOnlyCover {
            target: target.to_path_buf(),
            _file: file,
        };
        mount(&[
            "-o".as_ref(),
            "remount,bind,ro".as_ref(),
            target.as_os_str(),
        ]);
        cover
    }
}

impl Drop for ReadOnlyCover {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(&self.target)
            .status();
    }
}

#[tokio::test]
async fn without_cgroups_rlimits_contain_fork_bombs_or_root_is_refused() {
    let root = reachable_tempdir();
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
    the_sandbox_sees_little_of_the_host_on(false).await;
}

#[tokio::test]
async fn the_sandbox_sees_little_of_the_host_with_the_launcher() {
    the_sandbox_sees_little_of_the_host_on(true).await;
}

async fn the_sandbox_sees_little_of_the_host_on(launcher: bool) {
    let root = reachable_tempdir();
    let sandbox = backend(config(root.path().to_path_buf(), launcher)).await;
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
    // The sandbox's init (bubblewrap's or the launcher's), the channel's shell, the command's
    // shell, `ls` and `grep`.
    assert!(processes <= 5, "only the sandbox's processes: {processes}");
    assert_eq!(rest[4], "nodus");

    // The backend's root (other sandboxes) is not there; /etc/shadow cannot be read.
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

/// A file only root may read, made for a test and removed when dropped.
struct RootOnly(PathBuf);

impl RootOnly {
    fn new(path: PathBuf, content: &str) -> Self {
        std::fs::write(&path, content).expect("write the secret");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        RootOnly(path)
    }
}

impl Drop for RootOnly {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[tokio::test]
async fn root_only_host_files_stay_unreadable_under_a_root_server() {
    root_only_host_files_stay_unreadable_under_a_root_server_on(false).await;
}

#[tokio::test]
async fn root_only_host_files_stay_unreadable_under_a_root_server_with_the_launcher() {
    root_only_host_files_stay_unreadable_under_a_root_server_on(true).await;
}

async fn root_only_host_files_stay_unreadable_under_a_root_server_on(launcher: bool) {
    assert!(
        rustix::process::getuid().is_root(),
        "this test plays a root server: run it as root"
    );
    let root = reachable_tempdir();
    let config = config(root.path().join("area"), launcher);
    assert_eq!(
        config.run_as,
        Some(nodus_sandbox::DEFAULT_SANDBOX_USER),
        "a root server runs sandboxes as nobody"
    );
    let sandbox = backend(config).await;
    let tag = unique_key("rootonly");
    // A root-only file in a directory bound into every sandbox, made before the backend
    // was prepared ...
    let share = Path::new("/usr/local/share").join(&tag);
    std::fs::create_dir_all(&share).expect("mkdir");
    let early = RootOnly::new(share.join("secret"), "classified-usr\n");
    let id = sandbox.create(&spec(&tag)).await.expect("create").id;
    // ... and one made in /etc after it was.
    let late = RootOnly::new(Path::new("/etc").join(&tag), "classified-etc\n");

    let out = exec(
        &sandbox,
        &id,
        &format!(
            "cat {} 2>&1; echo rc=$?; cat {} 2>&1; echo rc=$?; grep ^Groups: /proc/self/status; \
             id -u",
            early.0.display(),
            late.0.display()
        ),
    )
    .await;
    let seen = text(&out);
    assert!(!seen.contains("classified"), "{seen}");
    assert_eq!(seen.matches("Permission denied").count(), 2, "{seen}");
    assert_eq!(seen.matches("rc=1").count(), 2, "{seen}");
    assert!(seen.ends_with("65534\n"), "runs as nobody: {seen}");
    // No supplementary group is left from the server's (root's would show as 65534, the
    // user namespace's overflow group).
    let groups = seen
        .lines()
        .find(|l| l.starts_with("Groups:"))
        .expect("groups");
    assert_eq!(groups.trim_end(), "Groups:", "{seen}");

    // Files staged by the server belong to the sandbox's user, which may change them.
    sandbox
        .put_files(
            &id,
            nodus_sandbox::conformance::archive(&[("in/staged.txt", b"x")]),
        )
        .await
        .expect("stage");
    let out = exec(
        &sandbox,
        &id,
        "echo y >> in/staged.txt && rm -r in && echo ok",
    )
    .await;
    assert_eq!(text(&out), "ok\n", "{out:?}");
    let dir = root.path().join("area/sandboxes").join(&tag);
    let meta = std::fs::metadata(&dir).expect("the working directory");
    assert_eq!((meta.uid(), meta.mode() & 0o777), (65534, 0o700));
    sandbox.destroy(&id).await.expect("destroy");
    drop((early, late));
    std::fs::remove_dir(&share).expect("rmdir");
}

#[tokio::test]
async fn a_sandbox_directory_its_user_cannot_reach_is_refused_by_name() {
    // A directory 0700 and root's (as a data directory is): the sandboxes' user cannot pass
    // it.
    let hidden = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(hidden.path(), std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let mut config = BwrapConfig::new(hidden.path().join("area"));
    config.run_as = Some(nodus_sandbox::DEFAULT_SANDBOX_USER);
    let sandbox = BwrapSandbox::new(config);
    match sandbox.create(&spec(&unique_key("unreachable"))).await {
        Err(Error::Refused(why)) => {
            let shown = hidden.path().display().to_string();
            assert!(why.contains(&format!("{shown} (mode 700")), "{why}");
            assert!(why.contains("65534:65534"), "{why}");
            assert!(why.contains("chmod o+x"), "{why}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn proc_shows_no_host_path_of_the_server() {
    proc_shows_no_host_path_of_the_server_on(false).await;
}

#[tokio::test]
async fn proc_shows_no_host_path_of_the_server_with_the_launcher() {
    proc_shows_no_host_path_of_the_server_on(true).await;
}

async fn proc_shows_no_host_path_of_the_server_on(launcher: bool) {
    let root = reachable_tempdir();
    let area = root.path().join("area");
    let sandbox = backend(config(area.clone(), launcher)).await;
    let id = sandbox
        .create(&spec(&unique_key("proc")))
        .await
        .expect("create")
        .id;
    let out = exec(
        &sandbox,
        &id,
        "tr '\\0' ' ' < /proc/1/cmdline; echo; echo --; tr '\\0' ' ' < /proc/1/environ; \
         echo; echo --; cat /proc/self/mountinfo",
    )
    .await;
    let seen = text(&out);
    let parts: Vec<&str> = seen.split("--\n").collect();
    let [cmdline, environ, mountinfo] = parts[..] else {
        panic!("three parts: {seen}");
    };
    let server_cwd = std::env::current_dir().expect("cwd");
    let server_cwd = server_cwd.display().to_string();
    let area = area.display().to_string();
    for (name, text) in [
        ("cmdline", cmdline),
        ("environ", environ),
        ("mountinfo", mountinfo),
    ] {
        assert!(
            !text.contains(&server_cwd),
            "{name} shows the server's cwd: {text}"
        );
    }
    // bubblewrap's options (or the launcher's plan), host paths among them, come from
    // standard input (or the resident launcher's socket): the command line is bubblewrap's
    // name and the shell with the command, or the launcher's second stage, a fork of the
    // first, itself a fork of the resident launcher, which the backend starts under the name
    // `nodus-launch` (not its host path), with the size of its network namespace pool.
    if launcher {
        assert_eq!(
            cmdline.trim_end(),
            format!(
                "nodus-launch --nodus-launch-forks --netns-pool {}",
                nodus_sandbox::DEFAULT_NETNS_POOL
            ),
            "{cmdline}"
        );
    } else {
        assert!(
            cmdline.starts_with("/usr/bin/bwrap --args 0 -- /bin/sh -c "),
            "{cmdline}"
        );
    }
    assert!(!cmdline.contains(&area), "{cmdline}");
    assert!(!environ.contains(&area), "{environ}");
    // The gate shell's own `PWD`, at most, and that is `/`.
    assert!(["", "PWD=/"].contains(&environ.trim()), "{environ}");
    sandbox.destroy(&id).await.expect("destroy");
}

/// A tmpfs mounted for a test (as root), unmounted when dropped.
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn mount(size: &str) -> Self {
        let dir = reachable_tempdir();
        let status = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0711"),
                "tmpfs",
            ])
            .arg(dir.path())
            .status()
            .expect("mount");
        assert!(status.success(), "mount a tmpfs (the test runs as root)");
        Tmpfs(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.0.path())
            .status();
    }
}

#[tokio::test]
async fn a_command_is_stopped_before_the_disk_runs_short() {
    // Working directories on a 200 MiB file system that keeps 120 MiB free: a command may
    // write about 80 MiB there, though its own limit is 1 GiB.
    let disk = Tmpfs::mount("200m");
    let mut config = BwrapConfig::new(disk.0.path().join("area"));
    config.disk_reserve_bytes = 120 << 20;
    let sandbox = BwrapSandbox::new(config);
    let mut spec = spec(&unique_key("reserve"));
    spec.limits.disk_bytes = 1 << 30;
    let id = sandbox.create(&spec).await.expect("create").id;
    let mut req = request(
        "for i in $(seq 1 40); do dd if=/dev/zero of=f$i bs=1M count=4 2>/dev/null; \
         sleep 0.05; done; echo finished",
    );
    req.timeout = Duration::from_secs(60);
    let out = sandbox.exec(&id, &req).await.expect("exec");
    assert!(!out.timed_out, "{out:?}");
    assert!(!text(&out).contains("finished"), "{out:?}");
    let stopped = out.stopped.clone().unwrap_or_default();
    assert!(
        stopped.contains(&format!("less than the {} bytes kept free", 120u64 << 20)),
        "{out:?}"
    );
    let stat = rustix::fs::statvfs(disk.0.path()).expect("statvfs");
    let free = stat.f_bavail * stat.f_frsize;
    assert!(free > 90 << 20, "room is left for the store: {free}");
    // Freeing space works; then writing does again.
    let out = exec(&sandbox, &id, "rm f*; echo ok > note; cat note").await;
    assert_eq!((text(&out).as_str(), out.stopped), ("ok\n", None));
    sandbox.destroy(&id).await.expect("destroy");
}

/// Writes through a shared memory mapping make no inotify event, and the backend skips
/// measuring a working directory its watch saw unchanged: a command that fills sparse files
/// made by the command before, through a mapping, is stopped at the disk limit all the same
/// (closing the mapped file, at the latest when the command's processes end, is an event).
#[tokio::test]
async fn sparse_files_filled_through_a_mapping_stop_at_the_disk_limit() {
    writes_through_a_mapping_are_measured(false).await;
}

#[tokio::test]
async fn sparse_files_filled_through_a_mapping_stop_at_the_disk_limit_with_the_launcher() {
    writes_through_a_mapping_are_measured(true).await;
}

async fn writes_through_a_mapping_are_measured(launcher: bool) {
    assert!(
        Path::new("/usr/bin/python3").exists(),
        "this test maps files with python3, which the sandbox takes from the host's /usr"
    );
    let root = reachable_tempdir();
    let sandbox = backend(config(root.path().join("area"), launcher)).await;
    let id = sandbox
        .create(&spec(&unique_key("mapped")))
        .await
        .expect("create")
        .id;
    let limit = test_limits().disk_bytes;
    // Three files of 24 MiB that take no block yet (each under the file size limit), 72 MiB
    // in all once filled.
    let made = exec(
        &sandbox,
        &id,
        "for i in 1 2 3; do truncate -s 24M sparse$i; done; du -k sparse1 | cut -f1",
    )
    .await;
    assert_eq!(
        (text(&made).trim(), made.stopped.as_deref()),
        ("0", None),
        "{made:?}"
    );
    // Nothing happens in the working directory between the two commands.
    let idle = exec(&sandbox, &id, "true").await;
    assert_eq!(idle.stopped, None, "{idle:?}");
    let filled = exec(
        &sandbox,
        &id,
        "python3 -c 'import mmap,os\nfor i in (1, 2, 3):\n    fd = os.open(\"sparse%d\" % i, \
         os.O_RDWR)\n    m = mmap.mmap(fd, 24 << 20)\n    m.write(b\"x\" * (24 << 20))\n    \
         m.flush()\n    m.close()\n    os.close(fd)'; du -sk . | cut -f1",
    )
    .await;
    let stopped = filled.stopped.clone().unwrap_or_default();
    assert!(
        stopped.contains(&format!("disk limit of {limit} bytes")),
        "{filled:?}"
    );
    sandbox.destroy(&id).await.expect("destroy");
}

#[tokio::test]
async fn a_launcher_that_cannot_start_sandboxes_falls_back_to_bubblewrap() {
    let root = reachable_tempdir();
    // Not a launcher: `false` starts nothing and fails its self-check.
    let mut config = BwrapConfig::new(root.path().to_path_buf());
    config.launcher = Some(PathBuf::from("/bin/false"));
    let sandbox = BwrapSandbox::new(config);
    assert!(!sandbox.uses_launcher().await.expect("prepared"));
    let id = sandbox
        .create(&spec(&unique_key("fallback")))
        .await
        .expect("create")
        .id;
    assert_eq!(text(&exec(&sandbox, &id, "echo ok").await), "ok\n");
    sandbox.destroy(&id).await.expect("destroy");
}

#[tokio::test]
async fn commands_run_alike_from_the_channels_shell_and_the_launchers_loop() {
    commands_run_alike_on(false).await;
}

#[tokio::test]
async fn commands_run_alike_from_the_channels_shell_and_the_launchers_loop_with_the_launcher() {
    commands_run_alike_on(true).await;
}

/// What the launcher's PID 1 does in place of the channel's shell, checked against that shell
/// on bubblewrap: a background child that outlives its command is ended before the next
/// command (its late output never reaches that command), an orphan that exits while a command
/// runs is reaped (no zombie), a command that closes its stdout early still reports its status
/// and stderr, `PWD` and `OLDPWD` are what the shell's `cd` leaves, and commands get the
/// sandbox's file-size limit.
async fn commands_run_alike_on(launcher: bool) {
    let root = reachable_tempdir();
    let sandbox = backend(config(root.path().to_path_buf(), launcher)).await;
    let id = sandbox
        .create(&spec(&unique_key("loop")))
        .await
        .expect("create")
        .id;

    let out = exec(&sandbox, &id, "(sleep 1; echo late) & echo now").await;
    assert_eq!((out.exit_code, text(&out)), (Some(0), "now\n".to_owned()));
    let out = exec(&sandbox, &id, "sleep 2; echo next").await;
    assert_eq!(
        (out.exit_code, text(&out)),
        (Some(0), "next\n".to_owned()),
        "the background child of the last command was ended: {out:?}"
    );

    // `true` is orphaned at once (its parent shell exits) and exits; then, a moment later,
    // no process of the sandbox is a zombie.
    let out = exec(
        &sandbox,
        &id,
        "sh -c 'true &'; sleep 0.5; grep -l '^State:.*Z' /proc/[0-9]*/status; echo checked",
    )
    .await;
    assert_eq!(text(&out), "checked\n", "{out:?}");

    let out = exec(&sandbox, &id, "exec >&-; sleep 0.2; echo said >&2; exit 3").await;
    assert_eq!(out.exit_code, Some(3), "{out:?}");
    assert_eq!(out.stdout.bytes, b"");
    assert_eq!(out.stderr.bytes, b"said\n");

    exec(&sandbox, &id, "mkdir -p sub").await;
    let mut in_sub = request("echo \"$PWD $OLDPWD\"; pwd");
    in_sub.cwd = Some("sub".to_owned());
    let out = sandbox.exec(&id, &in_sub).await.expect("exec in sub");
    assert_eq!(text(&out), "/work/sub /work\n/work/sub\n");

    let out = exec(&sandbox, &id, "ulimit -f").await;
    assert_eq!(text(&out), format!("{}\n", test_limits().disk_bytes / 512));
    sandbox.destroy(&id).await.expect("destroy");
}

/// A backend with the launcher, checked to start its sandboxes through the resident
/// launcher.
async fn resident_backend(root: &Path) -> std::sync::Arc<BwrapSandbox> {
    let sandbox = std::sync::Arc::new(backend(config(root.to_path_buf(), true)).await);
    assert!(
        sandbox.resident_launcher_pid().is_some(),
        "the resident launcher did not start (see the log)"
    );
    sandbox
}

/// The resident launcher killed from outside between two creations: the next sandbox starts
/// through a new one and runs its command, and the sandbox the killed one had started (which
/// ended with it) starts again at its next command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_resident_launcher_is_replaced_for_the_next_sandbox() {
    let root = reachable_tempdir();
    let sandbox = resident_backend(root.path()).await;
    let first = sandbox
        .create(&spec(&unique_key("zygote-a")))
        .await
        .expect("create")
        .id;
    assert_eq!(text(&exec(&sandbox, &first, "echo one").await), "one\n");
    let killed = sandbox
        .resident_launcher_pid()
        .expect("a resident launcher");
    let pid = rustix::process::Pid::from_raw(i32::try_from(killed).expect("pid")).expect("pid");
    rustix::process::kill_process(pid, rustix::process::Signal::KILL).expect("kill it");

    let second = sandbox
        .create(&spec(&unique_key("zygote-b")))
        .await
        .expect("create after the resident launcher was killed")
        .id;
    let out = exec(&sandbox, &second, "echo two").await;
    assert_eq!((out.exit_code, text(&out)), (Some(0), "two\n".to_owned()));
    let again = sandbox
        .resident_launcher_pid()
        .expect("a new resident launcher");
    assert_ne!(again, killed, "started again");
    let out = exec(&sandbox, &first, "echo one again").await;
    assert_eq!(
        (out.exit_code, text(&out)),
        (Some(0), "one again\n".to_owned())
    );
    for id in [first, second] {
        sandbox.destroy(&id).await.expect("destroy");
    }
}

/// A command's shell holds descriptors 0, 1 and 2 only: neither the resident launcher's
/// socket nor another sandbox's streams (a second sandbox is started first) reach it. (The
/// channel's shell under bubblewrap keeps descriptors of its own, which its commands see.)
#[tokio::test]
async fn a_command_holds_only_the_standard_descriptors_with_the_launcher() {
    let root = reachable_tempdir();
    let sandbox = resident_backend(root.path()).await;
    let other = sandbox
        .create(&spec(&unique_key("fds-other")))
        .await
        .expect("create")
        .id;
    let id = sandbox
        .create(&spec(&unique_key("fds")))
        .await
        .expect("create")
        .id;
    let out = exec(&sandbox, &id, "ls /proc/$$/fd").await;
    assert_eq!(
        (out.exit_code, text(&out)),
        (Some(0), "0\n1\n2\n".to_owned()),
        "{out:?}"
    );
    for id in [id, other] {
        sandbox.destroy(&id).await.expect("destroy");
    }
}

/// Sandboxes started at the same time each get their own stdout and stderr: each command
/// prints its sandbox's variable on both, and reads back its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_started_at_once_keep_their_own_streams_with_the_launcher() {
    let root = reachable_tempdir();
    let sandbox = resident_backend(root.path()).await;
    let mut started = tokio::task::JoinSet::new();
    for i in 0..8 {
        let sandbox = sandbox.clone();
        started.spawn(async move {
            let mut spec = spec(&unique_key("streams"));
            spec.env.insert("WHO".to_owned(), format!("sandbox-{i}"));
            let id = sandbox.create(&spec).await.expect("create").id;
            let out = exec(&sandbox, &id, "echo $WHO; echo $WHO-err >&2").await;
            sandbox.destroy(&id).await.expect("destroy");
            (i, out)
        });
    }
    while let Some(done) = started.join_next().await {
        let (i, out) = done.expect("a sandbox's task");
        assert_eq!(text(&out), format!("sandbox-{i}\n"), "{out:?}");
        assert_eq!(
            out.stderr.bytes,
            format!("sandbox-{i}-err\n").as_bytes(),
            "{out:?}"
        );
    }
}

/// A sandbox runs on as many CPUs as its CPU limit rounds up to, so that `nproc` inside
/// agrees with the limit: 1 with 1000 millis on a host of more, all of them with as many.
#[tokio::test]
async fn nproc_shows_the_cpus_the_limit_rounds_up_to() {
    nproc_shows_the_cpus_the_limit_rounds_up_to_on(false).await;
}

#[tokio::test]
async fn nproc_shows_the_cpus_the_limit_rounds_up_to_with_the_launcher() {
    nproc_shows_the_cpus_the_limit_rounds_up_to_on(true).await;
}

/// The same with the launcher spawned for each sandbox (no resident launcher), which pins
/// itself from its plan as the resident launcher's forks do.
#[tokio::test]
async fn nproc_shows_the_cpus_the_limit_rounds_up_to_with_the_spawned_launcher() {
    let root = reachable_tempdir();
    let mut config = config(root.path().to_path_buf(), true);
    config.resident_launcher = false;
    nproc_on(backend(config).await).await;
}

async fn nproc_shows_the_cpus_the_limit_rounds_up_to_on(launcher: bool) {
    let root = reachable_tempdir();
    nproc_on(backend(config(root.path().to_path_buf(), launcher)).await).await;
}

async fn nproc_on(sandbox: BwrapSandbox) {
    let host = rustix::thread::sched_getaffinity(None)
        .expect("this thread's CPUs")
        .count();
    assert!(host >= 2, "this test needs at least 2 CPUs, not {host}");
    for (millis, cpus) in [(1000, 1), (1001, 2.min(host)), (host * 1000, host)] {
        let mut limited = spec(&unique_key("nproc"));
        limited.limits.cpu_millis = millis;
        let id = sandbox.create(&limited).await.expect("create").id;
        let out = exec(&sandbox, &id, "nproc").await;
        assert_eq!(text(&out), format!("{cpus}\n"), "{millis} millis: {out:?}");
        sandbox.destroy(&id).await.expect("destroy");
    }
}

/// Whether this test runs as root of the initial user namespace: only there does the
/// resident launcher keep a pool of network namespaces.
fn initial_root() -> bool {
    rustix::process::geteuid().is_root()
        && std::fs::read_to_string("/proc/self/uid_map")
            .is_ok_and(|map| map.split_whitespace().collect::<Vec<_>>() == ["0", "0", "4294967295"])
}

/// A resident-launcher backend with a pool of `pool` network namespaces.
async fn netns_backend(root: &Path, pool: usize) -> std::sync::Arc<BwrapSandbox> {
    let mut config = config(root.to_path_buf(), true);
    config.netns_pool = pool;
    let sandbox = std::sync::Arc::new(backend(config).await);
    assert!(
        sandbox.resident_launcher_pid().is_some(),
        "the resident launcher did not start (see the log)"
    );
    sandbox
}

/// The sandbox's network namespace as `readlink /proc/self/ns/net` names it (`net:[INODE]`).
async fn netns_of(sandbox: &BwrapSandbox, id: &SandboxId) -> String {
    let out = exec(sandbox, id, "readlink /proc/self/ns/net").await;
    let name = text(&out).trim_end().to_owned();
    assert!(name.starts_with("net:["), "{out:?}");
    name
}

/// A descriptor of the network namespace `name`, opened through a process in it (this test
/// runs as root): held, that namespace is not freed, so that its inode number cannot name a
/// new namespace made after.
fn hold_netns(name: &str) -> std::fs::File {
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let path = entry.path().join("ns/net");
        if std::fs::read_link(&path).is_ok_and(|link| link.as_os_str() == name)
            && let Ok(held) = std::fs::File::open(&path)
            && held
                .metadata()
                .is_ok_and(|m| format!("net:[{}]", m.ino()) == name)
        {
            return held;
        }
    }
    panic!("no process is in the network namespace {name}");
}

/// Eight sandboxes alive at once, from a pool that holds namespaces emptied by eight before:
/// each has a network namespace of its own, none the host's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandboxes_alive_at_once_never_share_a_network_namespace() {
    assert!(
        initial_root(),
        "the network namespace pool is for root servers only: run this test as root (./scripts/test does)"
    );
    let root = reachable_tempdir();
    let sandbox = netns_backend(root.path(), 32).await;
    // Eight made and destroyed first: their namespaces are in the pool.
    for i in 0..8 {
        let id = sandbox
            .create(&spec(&unique_key(&format!("netns-warm-{i}"))))
            .await
            .expect("create")
            .id;
        netns_of(&sandbox, &id).await;
        sandbox.destroy(&id).await.expect("destroy");
    }
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let sandbox = sandbox.clone();
            tokio::spawn(async move {
                let id = sandbox
                    .create(&spec(&unique_key(&format!("netns-at-once-{i}"))))
                    .await
                    .expect("create")
                    .id;
                let name = netns_of(&sandbox, &id).await;
                (id, name)
            })
        })
        .collect();
    let mut started = Vec::new();
    for task in tasks {
        started.push(task.await.expect("a sandbox's task"));
    }
    let names: std::collections::BTreeSet<&String> = started.iter().map(|(_, name)| name).collect();
    assert_eq!(names.len(), 8, "shared: {started:?}");
    let host = std::fs::read_link("/proc/self/ns/net").expect("our namespace");
    assert!(
        !names
            .iter()
            .any(|name| std::ffi::OsStr::new(name.as_str()) == host),
        "{started:?}"
    );
    for (id, _) in started {
        sandbox.destroy(&id).await.expect("destroy");
    }
}

/// Pool of one: the namespace of a destroyed sandbox is the next one's; without a pool the
/// next one has a new namespace (the first held meanwhile, so that its inode number cannot
/// come back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destroyed_sandboxs_network_namespace_goes_to_the_next_one() {
    assert!(
        initial_root(),
        "the network namespace pool is for root servers only: run this test as root (./scripts/test does)"
    );
    for pool in [1, 0] {
        let root = reachable_tempdir();
        let sandbox = netns_backend(root.path(), pool).await;
        let a = sandbox
            .create(&spec(&unique_key("netns-a")))
            .await
            .expect("create")
            .id;
        let first = netns_of(&sandbox, &a).await;
        let held = hold_netns(&first);
        sandbox.destroy(&a).await.expect("destroy");
        let b = sandbox
            .create(&spec(&unique_key("netns-b")))
            .await
            .expect("create")
            .id;
        let second = netns_of(&sandbox, &b).await;
        if pool == 1 {
            assert_eq!(second, first, "reused from the pool");
        } else {
            assert_ne!(second, first, "no pool: a new namespace");
        }
        sandbox.destroy(&b).await.expect("destroy");
        drop(held);
    }
}

/// In a namespace from the pool the sandbox still has no network and cannot change it: it
/// cannot raise loopback nor write a sysctl, what the sandbox before bound on an abstract
/// unix socket is gone, and the conformance suite's no-network case passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recycled_network_namespace_is_as_closed_as_a_new_one() {
    assert!(
        initial_root(),
        "the network namespace pool is for root servers only: run this test as root (./scripts/test does)"
    );
    let root = reachable_tempdir();
    let sandbox = netns_backend(root.path(), 1).await;
    assert!(
        Path::new("/usr/bin/python3").exists(),
        "this test binds an abstract unix socket with python3, which the sandbox takes from the host's /usr"
    );
    let a = sandbox
        .create(&spec(&unique_key("netns-abstract")))
        .await
        .expect("create")
        .id;
    let first = netns_of(&sandbox, &a).await;
    // A listener on an abstract name, in the background; once it is listed, counted
    // (the command's end kills it with the rest of what the command left).
    let out = exec(
        &sandbox,
        &a,
        "python3 -c 'import socket,time; s=socket.socket(socket.AF_UNIX); \
         s.bind(\"\\0nodus-netns-test\"); s.listen(); time.sleep(60)' & \
         for i in $(seq 100); do grep -q nodus-netns-test /proc/net/unix && break; \
         sleep 0.1; done; grep -c nodus-netns-test /proc/net/unix",
    )
    .await;
    assert_eq!(text(&out), "1\n", "bound in the first sandbox: {out:?}");
    sandbox.destroy(&a).await.expect("destroy");

    let b = sandbox
        .create(&spec(&unique_key("netns-recycled")))
        .await
        .expect("create")
        .id;
    assert_eq!(netns_of(&sandbox, &b).await, first, "recycled");
    let out = exec(
        &sandbox,
        &b,
        "ip link set lo up; echo \"ip=$?\"; \
         echo 1 > /proc/sys/net/ipv4/ip_forward; echo \"sysctl=$?\"; \
         ip addr add 10.9.9.9/32 dev lo; echo \"addr=$?\"; \
         grep -c nodus-netns-test /proc/net/unix; \
         cat /sys/class/net/lo/operstate 2>/dev/null || ip -o link show lo",
    )
    .await;
    let said = text(&out);
    assert!(
        said.contains("ip=") && !said.contains("ip=0"),
        "{said}\n{}",
        String::from_utf8_lossy(&out.stderr.bytes)
    );
    assert!(
        said.contains("sysctl=") && !said.contains("sysctl=0"),
        "{said}"
    );
    assert!(said.contains("addr=") && !said.contains("addr=0"), "{said}");
    assert!(
        said.contains("\n0\n"),
        "the abstract socket is gone: {said}"
    );
    assert!(
        !said.contains("UP,") && !said.contains(",UP"),
        "loopback down: {said}"
    );
    sandbox.destroy(&b).await.expect("destroy");

    // The conformance case, in the pool's one namespace (emptied by `b`).
    let backend = nodus_sandbox::conformance::Backend {
        sandbox: sandbox.clone(),
        image: None,
        isolated: true,
    };
    nodus_sandbox::conformance::no_network(&backend).await;
}

/// An egress gate that answers every connection on a sandbox's socket with a fixed HTTP
/// response naming the request line it read: it stands in for the server's proxy.
#[derive(Debug, Default)]
struct AnsweringGate {
    opened: std::sync::Mutex<Vec<String>>,
    closed: std::sync::Mutex<Vec<String>>,
}

impl nodus_core::sandbox::EgressGate for AnsweringGate {
    fn open(
        &self,
        key: &str,
        _network: &nodus_core::resource::NetworkSpec,
        _headers: &[nodus_core::egress::InjectedHeader],
        socket: &Path,
    ) -> Result<(), Error> {
        use std::io::{BufRead, Write};
        let _ = std::fs::remove_file(socket);
        let listener = std::os::unix::net::UnixListener::bind(socket)
            .map_err(|e| Error::Failed(e.to_string()))?;
        std::thread::spawn(move || {
            for channel in listener.incoming().flatten() {
                // The sandbox's bridge hands its connection over, as to the real proxy.
                let Ok(stream) = nodus_launch::handoff::receive(&channel) else {
                    continue;
                };
                let stream = std::net::TcpStream::from(stream);
                let mut reader = std::io::BufReader::new(&stream);
                let mut first = String::new();
                let _ = reader.read_line(&mut first);
                let body = format!("gate saw {}", first.trim_end());
                let _ = (&stream).write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                );
            }
        });
        self.opened.lock().expect("lock").push(key.to_owned());
        Ok(())
    }

    fn close(&self, key: &str) {
        self.closed.lock().expect("lock").push(key.to_owned());
    }
}

#[tokio::test]
async fn a_sandbox_with_egress_reaches_only_its_gate_with_the_launcher() {
    let root = reachable_tempdir();
    let gate = std::sync::Arc::new(AnsweringGate::default());
    let mut config = config(root.path().to_path_buf(), true);
    config.egress = Some(gate.clone());
    let sandbox = backend(config).await;
    assert!(sandbox.supports_egress());
    let key = unique_key("egress");
    let mut spec = spec(&key);
    spec.egress = Some(nodus_core::resource::NetworkSpec {
        egress: nodus_core::resource::EgressMode::Allowlist,
        ..Default::default()
    });
    let id = sandbox.create(&spec).await.expect("create").id;
    assert_eq!(
        *gate.opened.lock().expect("lock"),
        std::slice::from_ref(&key)
    );
    let socket = root.path().join("egress").join(format!("{key}.sock"));
    let mode = std::fs::metadata(&socket).expect("socket").mode() & 0o777;
    assert_eq!(mode, 0o600, "only the sandboxes' user may connect");
    let out = exec(
        &sandbox,
        &id,
        "curl -sS http://files.test/x; echo; grep -c : /proc/net/dev; ps -e | grep -c nodus; \
         echo proxy=$HTTP_PROXY/$https_proxy/$NO_PROXY",
    )
    .await;
    let said = text(&out);
    assert!(
        said.contains("gate saw GET http://files.test/x HTTP/1.1"),
        "{said} {:?}",
        String::from_utf8_lossy(&out.stderr.bytes)
    );
    // Loopback only; the bridge is not among the sandbox's processes (PID 1 only).
    assert!(said.contains("\n1\n1\n"), "{said}");
    assert!(
        said.contains("proxy=http://127.0.0.1:3128/http://127.0.0.1:3128/localhost,127.0.0.1,::1"),
        "{said}"
    );
    // The socket's host path is nowhere in the sandbox.
    let out = exec(
        &sandbox,
        &id,
        "ls /egress 2>&1; grep -c egress /proc/self/mountinfo",
    )
    .await;
    assert!(text(&out).contains("No such file"), "{}", text(&out));
    // Across a command's end (which kills what it left running) and a suspension.
    sandbox.suspend(&id).await.expect("suspend");
    let out = exec(&sandbox, &id, "curl -sS http://files.test/again").await;
    assert!(
        text(&out).contains("gate saw GET http://files.test/again"),
        "{}",
        text(&out)
    );
    sandbox.destroy(&id).await.expect("destroy");
    assert_eq!(*gate.closed.lock().expect("lock"), [key]);
}

#[tokio::test]
async fn a_sandbox_with_egress_is_refused_by_bubblewrap_and_without_a_gate() {
    let root = reachable_tempdir();
    let mut with_gate = config(root.path().to_path_buf(), false);
    with_gate.egress = Some(std::sync::Arc::new(AnsweringGate::default()));
    let mut spec = spec(&unique_key("egress-bwrap"));
    spec.egress = Some(nodus_core::resource::NetworkSpec {
        egress: nodus_core::resource::EgressMode::Allowlist,
        ..Default::default()
    });
    let bwrap = backend(with_gate).await;
    assert!(!bwrap.supports_egress());
    match bwrap.create(&spec).await {
        Err(Error::Refused(why)) => assert!(why.contains("bubblewrap"), "{why}"),
        other => panic!("{other:?}"),
    }
    let no_gate = backend(config(root.path().to_path_buf(), true)).await;
    assert!(!no_gate.supports_egress());
    match no_gate.create(&spec).await {
        Err(Error::Refused(why)) => assert!(why.contains("egress proxy"), "{why}"),
        other => panic!("{other:?}"),
    }
}
