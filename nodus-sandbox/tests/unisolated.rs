//! The unisolated backend against real processes and a real file system.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nodus_core::Sandbox;
use nodus_core::sandbox::{
    Error, ExecOutput, ExecRequest, Limits, MAX_ARCHIVE_BYTES, SandboxId, SandboxSpec,
};
use nodus_sandbox::UnisolatedSandbox;
use nodus_sandbox::conformance::{HOSTILE_ARCHIVES, raw_entry};

const MIB: usize = 1 << 20;

fn spec(key: &str) -> SandboxSpec {
    SandboxSpec {
        key: key.to_owned(),
        image: None,
        env: BTreeMap::new(),
        limits: Limits::default(),
        network: false,
        egress: None,
        egress_headers: Vec::new(),
        links: Default::default(),
    }
}

fn request(command: &str) -> ExecRequest {
    ExecRequest {
        command: command.to_owned(),
        timeout: Duration::from_secs(30),
        cwd: None,
        output_cap: MIB as u64,
    }
}

/// A backend in a fresh temporary directory, with one sandbox created.
async fn setup() -> (tempfile::TempDir, UnisolatedSandbox, SandboxId) {
    let root = tempfile::tempdir().expect("tempdir");
    let sandbox = UnisolatedSandbox::new(root.path().join("sandboxes"));
    let info = sandbox.create(&spec("run-1")).await.expect("create");
    (root, sandbox, info.id)
}

async fn exec(sandbox: &UnisolatedSandbox, id: &SandboxId, command: &str) -> ExecOutput {
    sandbox.exec(id, &request(command)).await.expect("exec")
}

/// A string no other process on the machine has in its command line.
fn marker() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .subsec_nanos();
    format!("{}{nanos:09}", std::process::id())
}

/// How many processes have `pattern` in their command line.
fn count_processes(pattern: &str) -> usize {
    let out = std::process::Command::new("pgrep")
        .args(["-f", pattern])
        .output()
        .expect("run pgrep");
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "pgrep failed: {out:?}"
    );
    String::from_utf8_lossy(&out.stdout).lines().count()
}

/// Waits until no process has `pattern` in its command line (SIGKILL is delivered
/// asynchronously); returns how many are left at the end.
async fn survivors(pattern: &str) -> usize {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = count_processes(pattern);
        if left == 0 || Instant::now() > deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A tar archive of regular files and directories.
fn archive(files: &[(&str, &[u8])]) -> Vec<u8> {
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

/// Every entry of an archive: a file's content, `-> target` for a link, `<dir>` for a directory.
fn listing(tar: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut archive = tar::Archive::new(tar);
    let mut out = Vec::new();
    for entry in archive.entries().expect("entries") {
        let mut entry = entry.expect("entry");
        let path = entry.path().expect("path").display().to_string();
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
    out
}

fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read_dir") {
            let path = entry.expect("entry").path();
            out.push(path.display().to_string());
            if path.symlink_metadata().expect("stat").is_dir() {
                stack.push(path);
            }
        }
    }
    out.sort();
    out
}

#[tokio::test]
async fn create_is_unisolated_and_keyed() {
    let (root, sandbox, id) = setup().await;
    let info = sandbox.create(&spec("run-1")).await.expect("create again");
    assert_eq!(info.id, id);
    assert!(!info.isolated);
    assert_eq!(id, SandboxId("run-1".to_owned()));
    assert!(root.path().join("sandboxes/run-1").is_dir());

    for bad in ["", ".", "..", "a/b", "../up", "/abs", "sp ace"] {
        match sandbox.create(&spec(bad)).await {
            Err(Error::Refused(_)) => {}
            other => panic!("key {bad:?}: {other:?}"),
        }
    }
    let mut with_bad_env = spec("env");
    with_bad_env.env.insert("A=B".to_owned(), "x".to_owned());
    assert!(matches!(
        sandbox.create(&with_bad_env).await,
        Err(Error::Refused(_))
    ));
}

#[tokio::test]
async fn exit_codes() {
    let (_root, sandbox, id) = setup().await;
    assert_eq!(exec(&sandbox, &id, "true").await.exit_code, Some(0));
    assert_eq!(exec(&sandbox, &id, "exit 3").await.exit_code, Some(3));
    assert_eq!(exec(&sandbox, &id, "false").await.exit_code, Some(1));
    assert_eq!(
        exec(&sandbox, &id, "no-such-command-xyz").await.exit_code,
        Some(127)
    );
    let killed = exec(&sandbox, &id, "kill -9 $$").await;
    assert_eq!(killed.exit_code, None);
    assert!(!killed.timed_out);
}

#[tokio::test]
async fn stdout_and_stderr_are_kept_apart_and_raw() {
    let (_root, sandbox, id) = setup().await;
    let out = exec(
        &sandbox,
        &id,
        r"printf 'out\377\n'; printf 'err\n' >&2; printf more",
    )
    .await;
    assert_eq!(out.stdout.bytes, b"out\xff\nmore");
    assert_eq!(out.stderr.bytes, b"err\n");
    assert!(!out.stdout.truncated && !out.stderr.truncated);
    assert!(!out.timed_out);
}

#[tokio::test]
async fn output_is_capped_and_fully_drained() {
    let (_root, sandbox, id) = setup().await;
    let started = Instant::now();
    let out = exec(
        &sandbox,
        &id,
        "head -c 5242880 /dev/zero; head -c 5242880 /dev/zero >&2; echo done >&2",
    )
    .await;
    // The writer was never blocked on a full pipe: it finished and exited normally.
    assert_eq!(out.exit_code, Some(0));
    assert!(!out.timed_out);
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_eq!(out.stdout.bytes.len(), MIB);
    assert!(out.stdout.truncated);
    assert_eq!(out.stderr.bytes.len(), MIB);
    assert!(out.stderr.truncated);

    let small = exec(&sandbox, &id, "head -c 1048576 /dev/zero").await;
    assert_eq!(small.stdout.bytes.len(), MIB);
    assert!(!small.stdout.truncated, "exactly the cap is not truncated");
}

#[tokio::test]
async fn timeout_kills_the_whole_process_tree() {
    let (_root, sandbox, id) = setup().await;
    let mark = marker();
    // `sleep 1000.<mark>`: a duration that names this test's processes.
    let sleep = format!("sleep 1000.{mark}");
    let command = format!(
        "echo started; {sleep} & sh -c '{sleep}; true' & (trap '' TERM HUP; {sleep}) & {sleep}"
    );
    let mut req = request(&command);
    req.timeout = Duration::from_secs(2);
    let started = Instant::now();
    let (out, seen) = tokio::join!(sandbox.exec(&id, &req), async {
        // Watch the tree come up while the command runs.
        loop {
            let seen = count_processes(&sleep);
            if seen >= 4 || started.elapsed() > Duration::from_millis(1500) {
                return seen;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    let out = out.expect("exec");
    assert!(seen >= 4, "the tree was running: {seen} processes");
    assert!(out.timed_out);
    assert_eq!(out.exit_code, None);
    assert_eq!(out.stdout.bytes, b"started\n", "output so far is kept");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(survivors(&sleep).await, 0, "no process of the tree is left");
}

#[tokio::test]
async fn background_children_do_not_outlive_their_command() {
    let (_root, sandbox, id) = setup().await;
    let sleep = format!("sleep 1000.{}", marker());
    let started = Instant::now();
    // The background child keeps stdout open; the command still ends when the shell does.
    let out = exec(&sandbox, &id, &format!("{sleep} & echo hi")).await;
    assert_eq!(out.exit_code, Some(0));
    assert!(!out.timed_out);
    assert_eq!(out.stdout.bytes, b"hi\n");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(survivors(&sleep).await, 0);
}

#[tokio::test]
async fn environment_and_working_directory() {
    let root = tempfile::tempdir().expect("tempdir");
    let sandbox = UnisolatedSandbox::new(root.path().to_path_buf());
    let mut with_env = spec("envs");
    with_env
        .env
        .insert("GREETING".to_owned(), "hello world".to_owned());
    let id = sandbox.create(&with_env).await.expect("create").id;
    let home = root.path().join("envs").canonicalize().expect("home");

    let out = exec(&sandbox, &id, "env; pwd").await;
    let text = String::from_utf8(out.stdout.bytes).expect("utf-8");
    assert!(text.contains("GREETING=hello world\n"), "{text}");
    assert!(
        text.contains(&format!("HOME={}\n", home.display())),
        "{text}"
    );
    assert!(text.contains("LANG=C.UTF-8\n"), "{text}");
    assert!(text.contains("PATH="), "{text}");
    assert!(text.ends_with(&format!("{}\n", home.display())), "{text}");
    // The server's own environment (cargo sets CARGO_* for tests) does not leak in.
    assert!(!text.contains("CARGO"), "{text}");

    exec(&sandbox, &id, "mkdir -p sub/dir && ln -s / escape").await;
    let mut in_sub = request("pwd");
    in_sub.cwd = Some("./sub//dir/".to_owned());
    let out = sandbox.exec(&id, &in_sub).await.expect("exec in sub");
    assert_eq!(
        out.stdout.bytes,
        format!("{}/sub/dir\n", home.display()).into_bytes()
    );
    for bad in ["/tmp", "..", "sub/../..", "missing", "escape", "escape/tmp"] {
        let mut req = request("pwd");
        req.cwd = Some(bad.to_owned());
        match sandbox.exec(&id, &req).await {
            Err(Error::Refused(_)) => {}
            other => panic!("cwd {bad:?}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn exec_needs_a_created_sandbox() {
    let root = tempfile::tempdir().expect("tempdir");
    let sandbox = UnisolatedSandbox::new(root.path().to_path_buf());
    for id in ["never-created", "../x", ""] {
        let id = SandboxId(id.to_owned());
        assert_eq!(
            sandbox.exec(&id, &request("true")).await,
            Err(Error::NotFound(id.clone()))
        );
        assert_eq!(
            sandbox.put_files(&id, archive(&[])).await,
            Err(Error::NotFound(id.clone()))
        );
        assert_eq!(
            sandbox.get_files(&id, ".", MAX_ARCHIVE_BYTES).await,
            Err(Error::NotFound(id.clone()))
        );
    }
}

#[tokio::test]
async fn files_round_trip() {
    let (_root, sandbox, id) = setup().await;
    let binary: Vec<u8> = (0..=255).collect();
    let files: [(&str, &[u8]); 3] = [
        ("a.txt", b"alpha\n"),
        ("dir/b.bin", &binary),
        ("dir/deeper/c", b""),
    ];
    let tar = archive(&files);
    sandbox.put_files(&id, tar).await.expect("put");

    let out = exec(
        &sandbox,
        &id,
        "cat a.txt; wc -c < dir/b.bin; ln -s ../a.txt dir/link",
    )
    .await;
    assert_eq!(out.stdout.bytes, b"alpha\n256\n");

    let all = listing(
        &sandbox
            .get_files(&id, ".", MAX_ARCHIVE_BYTES)
            .await
            .expect("get all"),
    );
    assert_eq!(
        all,
        [
            ("a.txt".to_owned(), b"alpha\n".to_vec()),
            ("dir".to_owned(), b"<dir>".to_vec()),
            ("dir/b.bin".to_owned(), binary.clone()),
            ("dir/deeper".to_owned(), b"<dir>".to_vec()),
            ("dir/deeper/c".to_owned(), Vec::new()),
            ("dir/link".to_owned(), b"-> ../a.txt".to_vec()),
        ]
    );
    let one = listing(
        &sandbox
            .get_files(&id, "dir/b.bin", MAX_ARCHIVE_BYTES)
            .await
            .expect("get one"),
    );
    assert_eq!(one, [("dir/b.bin".to_owned(), binary.clone())]);

    // What comes out goes back in, into another sandbox.
    let other = sandbox.create(&spec("run-2")).await.expect("create").id;
    let sub = sandbox
        .get_files(&id, "dir", MAX_ARCHIVE_BYTES)
        .await
        .expect("get dir");
    sandbox.put_files(&other, sub).await.expect("put back");
    let out = exec(&sandbox, &other, "cat dir/link; wc -c < dir/b.bin").await;
    assert_eq!(out.stdout.bytes, b"256\n");
    assert!(
        !out.stderr.bytes.is_empty(),
        "the link dangles: no a.txt here"
    );

    for (bad, expected) in [
        ("/etc/passwd", "is absolute"),
        ("../run-2", "contains `..`"),
        ("missing", "does not exist"),
    ] {
        match sandbox.get_files(&id, bad, MAX_ARCHIVE_BYTES).await {
            Err(Error::Refused(why)) => assert!(why.contains(expected), "{bad}: {why}"),
            other => panic!("{bad}: {other:?}"),
        }
    }
    exec(&sandbox, &id, "ln -s /etc escape").await;
    match sandbox
        .get_files(&id, "escape/passwd", MAX_ARCHIVE_BYTES)
        .await
    {
        Err(Error::Refused(why)) => assert!(why.contains("outside"), "{why}"),
        other => panic!("through a link to /etc: {other:?}"),
    }
    // The link itself is not handed out: it leads outside.
    match sandbox.get_files(&id, "escape", MAX_ARCHIVE_BYTES).await {
        Err(Error::Refused(why)) => assert!(why.contains("leads outside"), "{why}"),
        other => panic!("a link to /etc: {other:?}"),
    }
}

#[tokio::test]
async fn hostile_archives_are_refused_and_write_nothing() {
    let (root, sandbox, id) = setup().await;
    let outside = root.path().join("outside");
    std::fs::create_dir(&outside).expect("outside dir");
    let workdir = root.path().join("sandboxes/run-1");
    for (path, kind, target, expected) in HOSTILE_ARCHIVES {
        // A harmless file first: it must not be written either.
        let mut tar = Vec::new();
        raw_entry(&mut tar, "harmless.txt", tar::EntryType::Regular, "", b"hi");
        raw_entry(&mut tar, path, kind, target, b"pwned");
        tar.extend_from_slice(&[0; 1024]);
        match sandbox.put_files(&id, tar).await {
            Err(Error::Refused(why)) => {
                assert!(why.contains(path), "{why} names {path}");
                assert!(why.contains(expected), "{why}");
            }
            other => panic!("{path}: {other:?}"),
        }
        assert_eq!(files_under(&workdir), Vec::<String>::new(), "{path}");
        assert_eq!(files_under(&outside), Vec::<String>::new(), "{path}");
    }
    assert!(!Path::new("/tmp/nodus-hostile-abs").exists());

    // A link that a command left in the working directory is not written through.
    exec(&sandbox, &id, &format!("ln -s {} out", outside.display())).await;
    let mut tar = Vec::new();
    raw_entry(&mut tar, "out/x", tar::EntryType::Regular, "", b"pwned");
    tar.extend_from_slice(&[0; 1024]);
    match sandbox.put_files(&id, tar).await {
        Err(Error::Refused(why)) => assert!(why.contains("symbolic link \"out\""), "{why}"),
        other => panic!("through an existing link: {other:?}"),
    }
    assert_eq!(files_under(&outside), Vec::<String>::new());

    assert!(matches!(
        sandbox
            .put_files(&id, b"not a tar archive at all".repeat(40))
            .await,
        Err(Error::Refused(_))
    ));
}

#[tokio::test]
async fn recreate_keeps_files_and_destroy_is_idempotent() {
    let (root, sandbox, id) = setup().await;
    exec(
        &sandbox,
        &id,
        "echo kept > state; mkdir ro && touch ro/f && chmod 500 ro",
    )
    .await;

    // As after a crash: a new backend value over the same root.
    let again = UnisolatedSandbox::new(root.path().join("sandboxes"));
    assert_eq!(
        again.exec(&id, &request("true")).await,
        Err(Error::NotFound(id.clone())),
        "exec before re-create"
    );
    let info = again.create(&spec("run-1")).await.expect("re-create");
    assert_eq!(info.id, id);
    assert_eq!(exec(&again, &id, "cat state").await.stdout.bytes, b"kept\n");

    again.destroy(&id).await.expect("destroy");
    assert!(!root.path().join("sandboxes/run-1").exists());
    again.destroy(&id).await.expect("destroy again");
    again
        .destroy(&SandboxId("../sandboxes".to_owned()))
        .await
        .expect("an id never issued");
    assert!(
        root.path().join("sandboxes").is_dir(),
        "nothing else removed"
    );
    assert_eq!(
        again.exec(&id, &request("true")).await,
        Err(Error::NotFound(id.clone()))
    );
}
