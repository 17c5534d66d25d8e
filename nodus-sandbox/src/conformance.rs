//! The conformance suite (feature `test-util`): what every sandbox backend must do, as one
//! public async function per case, run against a real backend.
//!
//! Two groups, so that it is explicit what an unisolated backend is held to:
//! - [`COMMON`]: commands, exit codes, output, timeouts, files, archives, lifecycle. Every
//!   backend passes these, [`UnisolatedSandbox`](crate::UnisolatedSandbox) included.
//! - [`ISOLATION`]: no network, no host secrets, no other sandbox's files, no writes outside
//!   the working directory, no privileges (mount, new namespaces, device nodes, setuid, `/proc`
//!   and `/sys` writes, the host's processes), fork bombs, memory hogs and a gigabyte of output
//!   contained. Only isolating backends pass these.
//!
//! - [`LIVE`]: a sandbox that keeps a process between commands (bubblewrap, Docker) starts it
//!   again when it was killed from outside.
//!
//! [`run_common`], [`run_isolation`] and [`run_all`] run a group one case after another;
//! [`conformance_tests!`](crate::conformance_tests) makes one `#[tokio::test]` per case, so that
//! cases run side by side and fail one by one.
//!
//! The cases need, inside the sandbox: a POSIX `sh` with `printf`, `head`, `sleep` (with
//! fractions), `cat`, `ls`, `ln`, `mkdir`, `touch`, `find`, `dd` and `busybox` (for `wget`);
//! and on the host: `pgrep`, and the right to read `/etc/shadow` (they run as root in CI).
//! Processes are looked for on the host, so a Docker engine must be local.

use std::collections::BTreeMap;
use std::future::Future;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nodus_core::Sandbox;
use nodus_core::sandbox::{
    Error, ExecOutput, ExecRequest, Limits, MAX_COMMAND_BYTES, SandboxId, SandboxInfo, SandboxSpec,
};

mod changes;
mod files;
mod isolation;

pub use changes::{changes_agree_with_the_listing, changes_are_told};
pub use files::{
    HOSTILE_ARCHIVES, archives_out_are_clean_and_capped, bad_links_refused, files_round_trip,
    hostile_archives_refused, links_lead_into_the_workdir, recreate_keeps_files,
};
pub use isolation::{
    disk_limit_stops_writers, fork_bomb_contained, gigabyte_of_output_contained,
    host_secrets_unreadable, memory_hog_contained, no_network, no_writes_outside_workdir,
    other_sandbox_unreachable, privileges_refused,
};

/// A backend under test.
#[derive(Clone)]
pub struct Backend {
    /// The backend.
    pub sandbox: Arc<dyn Sandbox>,
    /// The image for container backends (`None` for process backends).
    pub image: Option<String>,
    /// Whether it isolates ([`SandboxInfo::isolated`]); only then does [`ISOLATION`] apply.
    pub isolated: bool,
}

/// A boxed case, as listed in [`COMMON`] and [`ISOLATION`].
pub type Case = for<'a> fn(&'a Backend) -> std::pin::Pin<Box<dyn Future<Output = ()> + 'a>>;

macro_rules! cases {
    ($($name:ident),* $(,)?) => {
        &[$((stringify!($name), |b| Box::pin($name(b)))),*]
    };
}

/// The cases every backend passes, by name.
pub const COMMON: &[(&str, Case)] = cases![
    exit_codes,
    stdout_and_stderr_apart,
    output_cap,
    timeout_kills_process_tree,
    dropping_exec_kills,
    dropped_command_kill_spares_the_next,
    background_processes_end_with_command,
    environment_and_cwd,
    files_round_trip,
    hostile_archives_refused,
    recreate_keeps_files,
    destroy_twice,
    longest_command,
    archives_out_are_clean_and_capped,
    bad_links_refused,
    changes_agree_with_the_listing,
];

/// The cases only an isolating backend passes, by name.
pub const ISOLATION: &[(&str, Case)] = cases![
    no_network,
    host_secrets_unreadable,
    other_sandbox_unreachable,
    no_writes_outside_workdir,
    fork_bomb_contained,
    memory_hog_contained,
    privileges_refused,
    gigabyte_of_output_contained,
    links_lead_into_the_workdir,
];

/// The cases of a backend that limits the working directory's size, by name: bubblewrap, and
/// Docker where the server can see the volumes (a local engine, as root).
pub const DISK: &[(&str, Case)] = cases![disk_limit_stops_writers];

/// The cases of a backend that keeps a process per sandbox between commands, by name:
/// bubblewrap and Docker.
pub const LIVE: &[(&str, Case)] = cases![killed_between_commands, suspended_holds_no_process];

/// The cases of a backend that watches its working directories (they are on the server's
/// file system): the unisolated one, bubblewrap, and Docker with a local engine as root.
pub const WATCHED: &[(&str, Case)] = cases![changes_are_told];

/// Runs [`COMMON`].
pub async fn run_common(backend: &Backend) {
    for (name, case) in COMMON {
        tracing::info!(case = name, "conformance");
        case(backend).await;
    }
}

/// Runs [`ISOLATION`].
pub async fn run_isolation(backend: &Backend) {
    for (name, case) in ISOLATION {
        tracing::info!(case = name, "conformance");
        case(backend).await;
    }
}

/// Runs every case: [`COMMON`], then [`ISOLATION`].
pub async fn run_all(backend: &Backend) {
    run_common(backend).await;
    run_isolation(backend).await;
}

/// One `#[tokio::test]` per case: `conformance_tests!(common, make)` for [`COMMON`],
/// `conformance_tests!(all, make)` for [`COMMON`] and [`ISOLATION`],
/// `conformance_tests!(disk, make)` for [`DISK`], `conformance_tests!(live, make)` for
/// [`LIVE`], `conformance_tests!(watched, make)` for [`WATCHED`], where `make` is an `async fn() -> Backend`
/// in scope.
#[macro_export]
macro_rules! conformance_tests {
    (common, $make:ident) => {
        $crate::conformance_tests!(@cases $make,
            exit_codes, stdout_and_stderr_apart, output_cap, timeout_kills_process_tree,
            dropping_exec_kills, dropped_command_kill_spares_the_next, background_processes_end_with_command, environment_and_cwd, files_round_trip,
            hostile_archives_refused, recreate_keeps_files, destroy_twice, longest_command,
            archives_out_are_clean_and_capped, bad_links_refused,
            changes_agree_with_the_listing);
    };
    (all, $make:ident) => {
        $crate::conformance_tests!(common, $make);
        $crate::conformance_tests!(@cases $make,
            no_network, host_secrets_unreadable, other_sandbox_unreachable,
            no_writes_outside_workdir, fork_bomb_contained, memory_hog_contained,
            privileges_refused, gigabyte_of_output_contained, links_lead_into_the_workdir);
    };
    (disk, $make:ident) => {
        $crate::conformance_tests!(@cases $make, disk_limit_stops_writers);
    };
    (watched, $make:ident) => {
        $crate::conformance_tests!(@cases $make, changes_are_told);
    };
    (live, $make:ident) => {
        $crate::conformance_tests!(@cases $make, killed_between_commands, suspended_holds_no_process);
    };
    (@cases $make:ident, $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $crate::conformance::$case(&$make().await).await;
            }
        )*
    };
}

// ---------------------------------------------------------------------------------------------
// Helpers

/// Limits small enough that a hostile command is contained fast on a small machine.
pub fn test_limits() -> Limits {
    Limits {
        cpu_millis: 1000,
        memory_bytes: 256 << 20,
        processes: 64,
        command_timeout_secs: 60,
        output_cap_bytes: 1 << 20,
        disk_bytes: 64 << 20,
    }
}

/// A key no other test on this machine uses.
pub fn unique_key(tag: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("conf-{tag}-{}-{nanos:09}-{n}", std::process::id())
}

/// A spec for `backend` with the [`test_limits`].
pub fn spec(backend: &Backend, key: &str) -> SandboxSpec {
    SandboxSpec {
        key: key.to_owned(),
        image: backend.image.clone(),
        env: BTreeMap::new(),
        limits: test_limits(),
        network: false,
        egress: None,
        egress_headers: Vec::new(),
        links: Default::default(),
    }
}

/// A command with a 60 s timeout and a 1 MiB cap.
pub fn request(command: &str) -> ExecRequest {
    ExecRequest {
        command: command.to_owned(),
        timeout: Duration::from_secs(60),
        cwd: None,
        output_cap: 1 << 20,
    }
}

async fn create(backend: &Backend, spec: &SandboxSpec) -> SandboxInfo {
    let info = backend.sandbox.create(spec).await.expect("create");
    assert_eq!(info.isolated, backend.isolated, "isolated as declared");
    info
}

async fn fresh(backend: &Backend, tag: &str) -> SandboxId {
    create(backend, &spec(backend, &unique_key(tag))).await.id
}

async fn exec(backend: &Backend, id: &SandboxId, command: &str) -> ExecOutput {
    backend
        .sandbox
        .exec(id, &request(command))
        .await
        .unwrap_or_else(|e| panic!("exec {command:?}: {e}"))
}

async fn destroy(backend: &Backend, id: &SandboxId) {
    backend.sandbox.destroy(id).await.expect("destroy");
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// How many host processes have `pattern` in their command line.
fn count_processes(pattern: &str) -> usize {
    let out = std::process::Command::new("pgrep")
        .args(["-f", pattern])
        .output()
        .expect("run pgrep (package procps)");
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "pgrep failed: {out:?}"
    );
    String::from_utf8_lossy(&out.stdout).lines().count()
}

/// Waits until no host process has `pattern` in its command line; returns how many are left.
async fn survivors(pattern: &str) -> usize {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = count_processes(pattern);
        if left == 0 || Instant::now() > deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A tar archive of regular files.
pub fn archive(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, data) in files {
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o644);
        header.set_size(data.len() as u64);
        header.set_entry_type(tar::EntryType::Regular);
        builder
            .append_data(&mut header, path, *data)
            .expect("append");
    }
    builder.into_inner().expect("finish")
}

/// A tar archive entry written with raw bytes, so that hostile names are possible.
pub fn raw_entry(out: &mut Vec<u8>, path: &str, kind: tar::EntryType, target: &str, data: &[u8]) {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(0o644);
    header.set_size(data.len() as u64);
    let old = header.as_old_mut();
    old.name[..path.len()].copy_from_slice(path.as_bytes());
    old.linkname[..target.len()].copy_from_slice(target.as_bytes());
    header.set_cksum();
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out.resize(out.len().next_multiple_of(512), 0);
}

/// Every entry of an archive: a file's content, `-> target` for a symbolic link, `<dir>` for
/// a directory.
pub fn listing(tar: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut archive = tar::Archive::new(tar);
    let mut out = Vec::new();
    for entry in archive.entries().expect("entries") {
        let mut entry = entry.expect("entry");
        let path = entry.path().expect("path").display().to_string();
        let path = path.trim_end_matches('/').to_owned();
        match entry.header().entry_type() {
            tar::EntryType::Symlink => {
                let target = entry.link_name().expect("link").expect("target");
                out.push((path, format!("-> {}", target.display()).into_bytes()));
            }
            tar::EntryType::Directory => out.push((path, b"<dir>".to_vec())),
            _ => {
                let mut data = Vec::new();
                entry.read_to_end(&mut data).expect("read");
                out.push((path, data));
            }
        }
    }
    out.sort();
    out
}

// ---------------------------------------------------------------------------------------------
// Common cases

/// Exit codes come back as the shell gives them.
pub async fn exit_codes(b: &Backend) {
    let id = fresh(b, "exit").await;
    assert_eq!(exec(b, &id, "true").await.exit_code, Some(0));
    assert_eq!(exec(b, &id, "exit 3").await.exit_code, Some(3));
    assert_eq!(exec(b, &id, "false").await.exit_code, Some(1));
    let missing = exec(b, &id, "no-such-command-xyz").await;
    assert_eq!(missing.exit_code, Some(127));
    assert!(!missing.stderr.bytes.is_empty(), "the shell says why");
    let out = exec(b, &id, "exit 0").await;
    assert!(!out.timed_out);
    destroy(b, &id).await;
}

/// A command of [`MAX_COMMAND_BYTES`] runs; one byte longer is refused and nothing runs.
pub async fn longest_command(b: &Backend) {
    let id = fresh(b, "long").await;
    let padded = |command: &str, length: usize| {
        let comment = " #".to_owned() + &"x".repeat(length - command.len() - 2);
        command.to_owned() + &comment
    };
    let longest = padded("touch longest; echo ran", MAX_COMMAND_BYTES);
    assert_eq!(longest.len(), MAX_COMMAND_BYTES);
    let out = exec(b, &id, &longest).await;
    assert_eq!(
        (out.exit_code, text(&out.stdout.bytes)),
        (Some(0), "ran\n".to_owned())
    );
    let too_long = padded("touch too-long", MAX_COMMAND_BYTES + 1);
    match b.sandbox.exec(&id, &request(&too_long)).await {
        Err(Error::Refused(message)) => assert!(message.contains("at most"), "{message}"),
        other => panic!("a command over the limit must be refused: {other:?}"),
    }
    let seen = exec(b, &id, "ls").await;
    assert_eq!(
        text(&seen.stdout.bytes),
        "longest\n",
        "the refused command did not run"
    );
    destroy(b, &id).await;
}

/// Stdout and stderr are separate and raw: invalid UTF-8 is kept as it is.
pub async fn stdout_and_stderr_apart(b: &Backend) {
    let id = fresh(b, "streams").await;
    let out = exec(
        b,
        &id,
        r"printf 'out\377\n'; printf 'err\n' >&2; printf more",
    )
    .await;
    assert_eq!(out.stdout.bytes, b"out\xff\nmore");
    assert_eq!(out.stderr.bytes, b"err\n");
    assert!(!out.stdout.truncated && !out.stderr.truncated);
    assert_eq!(out.exit_code, Some(0));
    destroy(b, &id).await;
}

/// Each stream is capped and marked truncated; the writer is never blocked; the sandbox's
/// limit bounds a request that asks for more.
pub async fn output_cap(b: &Backend) {
    let mut small = spec(b, &unique_key("cap"));
    small.limits.output_cap_bytes = 3000;
    let id = create(b, &small).await.id;
    let started = Instant::now();
    let out = exec(
        b,
        &id,
        "head -c 3000000 /dev/zero; head -c 3000000 /dev/zero >&2; echo done >&2",
    )
    .await;
    assert_eq!(out.exit_code, Some(0), "the writer finished: {out:?}");
    assert!(!out.timed_out);
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(
        out.stdout.bytes.len(),
        3000,
        "bounded by the sandbox's limit"
    );
    assert!(out.stdout.truncated);
    assert_eq!(out.stderr.bytes.len(), 3000);
    assert!(out.stderr.truncated);

    let mut req = request("head -c 2000 /dev/zero; head -c 1000 /dev/zero >&2");
    req.output_cap = 1000;
    let out = b.sandbox.exec(&id, &req).await.expect("exec");
    assert_eq!(out.stdout.bytes.len(), 1000, "bounded by the request");
    assert!(out.stdout.truncated);
    assert_eq!(out.stderr.bytes.len(), 1000);
    assert!(!out.stderr.truncated, "exactly the cap is not truncated");
    destroy(b, &id).await;
}

/// A timeout kills the whole process tree and keeps what was printed before it; the sandbox's
/// limit bounds a request that allows longer.
pub async fn timeout_kills_process_tree(b: &Backend) {
    let mut short = spec(b, &unique_key("timeout"));
    short.limits.command_timeout_secs = 3;
    let id = create(b, &short).await.id;
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    // `sleep 1000.<mark>`: a duration that names this case's processes on the host.
    let sleep = format!("sleep 1000.{}{nanos:09}", std::process::id());
    let command = format!(
        "echo started; {sleep} & sh -c '{sleep}; true' & (trap '' TERM HUP; {sleep}) & {sleep}"
    );
    let started = Instant::now();
    let req = request(&command);
    let (out, seen) = tokio::join!(b.sandbox.exec(&id, &req), async {
        loop {
            let seen = count_processes(&sleep);
            if seen >= 4 || started.elapsed() > Duration::from_millis(2800) {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let out = out.expect("exec");
    assert!(seen >= 4, "the tree was running: {seen} processes");
    assert!(out.timed_out, "{out:?}");
    assert_eq!(out.exit_code, None);
    assert_eq!(out.stdout.bytes, b"started\n", "output so far is kept");
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(2900) && took < Duration::from_secs(20),
        "{took:?}"
    );
    assert_eq!(survivors(&sleep).await, 0, "no process of the tree is left");
    let after = exec(b, &id, "echo still here").await;
    assert_eq!(after.stdout.bytes, b"still here\n");
    destroy(b, &id).await;
}

/// Polls `running`, an exec's future, until `count` processes match `pattern`; the command
/// must not end before that.
async fn until_seen<T: std::fmt::Debug>(
    running: &mut (impl Future<Output = T> + Unpin),
    pattern: &str,
    count: usize,
) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        tokio::select! {
            done = &mut *running => panic!("the command ended before it was seen: {done:?}"),
            () = tokio::time::sleep(Duration::from_millis(5)) => {}
        }
        if count_processes(pattern) >= count {
            return;
        }
        assert!(Instant::now() < deadline, "the command did not start");
    }
}

/// Dropping the future of `exec` kills the command and its children.
pub async fn dropping_exec_kills(b: &Backend) {
    let id = fresh(b, "drop").await;
    let sleep = format!("sleep 1000.{}{}", std::process::id(), unique_nanos());
    let req = request(&format!("{sleep} & {sleep}"));
    let mut running = Box::pin(b.sandbox.exec(&id, &req));
    // Wait until the command's processes run, then stop waiting for it.
    until_seen(&mut running, &sleep, 2).await;
    drop(running);
    assert_eq!(survivors(&sleep).await, 0, "nothing of it is left");
    assert_eq!(exec(b, &id, "echo next").await.stdout.bytes, b"next\n");
    destroy(b, &id).await;
}

/// The kill of a dropped command never reaches the command after it, even when the dropped
/// one ended by itself just before it was dropped, or just after (its kill lands later).
pub async fn dropped_command_kill_spares_the_next(b: &Backend) {
    let id = fresh(b, "drop-next").await;
    for late_ms in [280, 300, 320, 350] {
        // A sleep of 0.3 s, told apart from every other by its last digits.
        let sleep = format!("sleep 0.3000{}", &unique_nanos()[..5]);
        let req = request(&sleep);
        let mut running = Box::pin(b.sandbox.exec(&id, &req));
        until_seen(&mut running, &sleep, 1).await;
        // Stop waiting about when it ends by itself (the future is not polled meanwhile).
        tokio::time::sleep(Duration::from_millis(late_ms)).await;
        drop(running);
        let next = exec(b, &id, "sleep 1; echo next").await;
        assert_eq!(
            (next.exit_code, text(&next.stdout.bytes)),
            (Some(0), "next\n".to_owned()),
            "the next command ran whole (dropped {late_ms} ms after it started): {next:?}"
        );
    }
    destroy(b, &id).await;
}

/// A command ends when its shell does, and what it left in the background is killed.
pub async fn background_processes_end_with_command(b: &Backend) {
    let id = fresh(b, "background").await;
    let sleep = format!("sleep 1000.{}{}", std::process::id(), unique_nanos());
    let started = Instant::now();
    let out = exec(b, &id, &format!("{sleep} & echo hi")).await;
    assert_eq!(out.exit_code, Some(0));
    assert!(!out.timed_out);
    assert_eq!(out.stdout.bytes, b"hi\n");
    assert!(started.elapsed() < Duration::from_secs(15));
    assert_eq!(survivors(&sleep).await, 0);
    destroy(b, &id).await;
}

fn unique_nanos() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{nanos:09}")
}

/// The spec's environment reaches commands, `HOME` is the working directory, and a command
/// can run in a directory under it but nowhere else.
pub async fn environment_and_cwd(b: &Backend) {
    let mut with_env = spec(b, &unique_key("env"));
    with_env
        .env
        .insert("GREETING".to_owned(), "hello world".to_owned());
    let id = create(b, &with_env).await.id;
    let out = exec(b, &id, "echo \"$GREETING\"; pwd; echo \"$HOME\"").await;
    let text = text(&out.stdout.bytes);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(lines[0], "hello world");
    assert_eq!(lines[1], lines[2], "HOME is the working directory: {text}");
    let home = lines[1].to_owned();

    exec(b, &id, "mkdir -p sub/dir && ln -s / escape").await;
    let mut in_sub = request("pwd");
    in_sub.cwd = Some("./sub//dir/".to_owned());
    let out = b.sandbox.exec(&id, &in_sub).await.expect("exec in sub");
    assert_eq!(text_of(&out), format!("{home}/sub/dir\n"));
    for bad in ["/tmp", "..", "sub/../..", "missing", "escape", "escape/tmp"] {
        let mut req = request("pwd");
        req.cwd = Some(bad.to_owned());
        match b.sandbox.exec(&id, &req).await {
            Err(Error::Refused(_)) => {}
            other => panic!("cwd {bad:?}: {other:?}"),
        }
    }
    let mut bad_env = spec(b, &unique_key("badenv"));
    bad_env.env.insert("A=B".to_owned(), "x".to_owned());
    assert!(matches!(
        b.sandbox.create(&bad_env).await,
        Err(Error::Refused(_))
    ));
    for bad in ["", "..", "a/b", "sp ace"] {
        let bad_key = spec(b, bad);
        assert!(
            matches!(b.sandbox.create(&bad_key).await, Err(Error::Refused(_))),
            "key {bad:?}"
        );
    }
    destroy(b, &id).await;
}

fn text_of(out: &ExecOutput) -> String {
    text(&out.stdout.bytes)
}

/// Kills every host process of a sandbox ([`sandbox_processes`]); how many it killed.
fn kill_sandbox(entry: &str, pid_ns: Option<&str>) -> usize {
    let mut killed = 0;
    for pid in sandbox_processes(entry, pid_ns) {
        if let Some(pid) = rustix::process::Pid::from_raw(pid)
            && rustix::process::kill_process(pid, rustix::process::Signal::KILL).is_ok()
        {
            killed += 1;
        }
    }
    killed
}

/// The pid namespace the commands of sandbox `id` run in, as `/proc/self/ns/pid` names it
/// (`pid:[N]`, the same from the host), or `None` when it is the host's own.
async fn pid_namespace(b: &Backend, id: &SandboxId) -> Option<String> {
    let out = exec(b, id, "readlink /proc/self/ns/pid").await;
    let inside = text(&out.stdout.bytes).trim().to_owned();
    let own = std::fs::read_link("/proc/self/ns/pid").ok()?;
    (!inside.is_empty() && Path::new(&inside) != own).then_some(inside)
}

/// The host processes of a sandbox: those whose environment holds `entry` exactly (a
/// sandbox's shell or a container's first process, which start with the sandbox's
/// environment), and those in its pid namespace `pid_ns` (the launcher's PID 1, which reads
/// the commands itself and was started with no environment).
fn sandbox_processes(entry: &str, pid_ns: Option<&str>) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|d| d.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let marked = std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|e| e == entry.as_bytes()));
            marked
                || pid_ns.is_some_and(|ns| {
                    std::fs::read_link(format!("/proc/{pid}/ns/pid"))
                        .is_ok_and(|link| link == Path::new(ns))
                })
        })
        .collect()
}

/// A sandbox whose process was killed from outside between commands (the OOM killer, an
/// operator) is started again by the next command, over the same working directory and with
/// the same environment; the command runs once.
pub async fn killed_between_commands(b: &Backend) {
    let mark = format!("{}{}", std::process::id(), unique_nanos());
    let entry = format!("NODUS_CONFORMANCE_MARK={mark}");
    let mut marked = spec(b, &unique_key("killed"));
    marked
        .env
        .insert("NODUS_CONFORMANCE_MARK".to_owned(), mark.clone());
    let id = create(b, &marked).await.id;
    let first = exec(b, &id, "echo kept > state; echo one >> runs; echo first").await;
    assert_eq!(text(&first.stdout.bytes), "first\n", "{first:?}");
    for round in 0..2 {
        // Between commands only the sandbox's processes carry the mark or are in its pid
        // namespace.
        let pid_ns = pid_namespace(b, &id).await;
        let killed = kill_sandbox(&entry, pid_ns.as_deref());
        assert!(
            killed >= 1,
            "round {round}: no process of the sandbox was found"
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while !sandbox_processes(&entry, pid_ns.as_deref()).is_empty() {
            assert!(
                Instant::now() < deadline,
                "the killed process is still there"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let after = exec(
            b,
            &id,
            "cat state; echo one >> runs; echo \"$NODUS_CONFORMANCE_MARK\"",
        )
        .await;
        assert_eq!(
            (after.exit_code, text(&after.stdout.bytes)),
            (Some(0), format!("kept\n{mark}\n")),
            "round {round}: {after:?}"
        );
    }
    let runs = exec(b, &id, "cat runs").await;
    assert_eq!(
        text(&runs.stdout.bytes),
        "one\none\none\n",
        "each command ran once"
    );
    destroy(b, &id).await;
}

/// A suspended sandbox (its run waits for a message) holds no process; its next command
/// starts it again over the same working directory, with the same environment.
pub async fn suspended_holds_no_process(b: &Backend) {
    let mark = format!("{}{}", std::process::id(), unique_nanos());
    let entry = format!("NODUS_CONFORMANCE_MARK={mark}");
    let mut marked = spec(b, &unique_key("suspend"));
    marked
        .env
        .insert("NODUS_CONFORMANCE_MARK".to_owned(), mark.clone());
    let id = create(b, &marked).await.id;
    exec(b, &id, "echo kept > state").await;
    for round in 0..2 {
        let pid_ns = pid_namespace(b, &id).await;
        assert!(
            !sandbox_processes(&entry, pid_ns.as_deref()).is_empty(),
            "round {round}: a live sandbox keeps its process"
        );
        b.sandbox.suspend(&id).await.expect("suspend");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !sandbox_processes(&entry, pid_ns.as_deref()).is_empty() {
            assert!(
                Instant::now() < deadline,
                "round {round}: a process is left"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let after = exec(b, &id, "cat state; echo \"$NODUS_CONFORMANCE_MARK\"").await;
        assert_eq!(
            (after.exit_code, text(&after.stdout.bytes)),
            (Some(0), format!("kept\n{mark}\n")),
            "round {round}: {after:?}"
        );
    }
    destroy(b, &id).await;
    b.sandbox
        .suspend(&id)
        .await
        .expect("suspending a destroyed sandbox is fine");
}

/// Destroying twice is fine; a destroyed sandbox runs nothing, and a new one with the same key
/// starts empty.
pub async fn destroy_twice(b: &Backend) {
    let s = spec(b, &unique_key("destroy"));
    let id = create(b, &s).await.id;
    exec(b, &id, "echo x > file").await;
    destroy(b, &id).await;
    destroy(b, &id).await;
    assert!(
        matches!(
            b.sandbox.exec(&id, &request("true")).await,
            Err(Error::NotFound(_))
        ),
        "exec after destroy"
    );
    b.sandbox
        .destroy(&SandboxId("../never-issued".to_owned()))
        .await
        .expect("an id never issued");
    let id = create(b, &s).await.id;
    assert_eq!(text_of(&exec(b, &id, "ls -A").await), "");
    destroy(b, &id).await;
}
