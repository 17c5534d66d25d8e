//! A real `nodus server` process for end-to-end tests, and the `nodus` CLI against it.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const TOKEN: &str = "nodus_e2e_admin_token_0123456789abcdef";

/// The `nodus` binary cargo built next to this test.
pub fn nodus_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let binary = dir.join("nodus");
    assert!(
        binary.exists(),
        "{} is missing: build the workspace (cargo test --workspace builds it)",
        binary.display()
    );
    binary
}

/// Which store a server uses.
#[derive(Debug, Clone)]
pub enum Backend {
    Sqlite,
    Postgres,
}

impl Backend {
    /// The `--store` URL for a server whose data lives in `dir`.
    pub fn store_url(&self, dir: &Path) -> String {
        match self {
            Backend::Sqlite => format!("sqlite://{}", dir.join("nodus.db").display()),
            Backend::Postgres => postgres_url(),
        }
    }
}

/// A fresh database on the test PostgreSQL (started by scripts/test-env).
pub fn postgres_url() -> String {
    let base = std::env::var("NODUS_TEST_POSTGRES_URL").unwrap_or_else(|_| {
        panic!("NODUS_TEST_POSTGRES_URL is not set: run the tests with ./scripts/test, which starts PostgreSQL")
    });
    // The pid alone repeats across test binaries on a fresh machine (CI), and the databases
    // of earlier binaries are kept: the time makes the name one no earlier process used.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() % 1_000_000_000_000);
    let database = format!("nodus_e2e_{}_{nanos}_{}", std::process::id(), unique());
    // CREATE DATABASE copies template1 and fails while another session uses it: retry.
    let created = (0..20).any(|attempt| {
        if attempt > 0 {
            std::thread::sleep(Duration::from_millis(250));
        }
        Command::new("psql")
            .arg(&base)
            .args(["-q", "-c", &format!("CREATE DATABASE {database}")])
            .status()
            .is_ok_and(|status| status.success())
    });
    assert!(created, "cannot create database {database} on {base}");
    match base.rsplit_once('/') {
        Some((server, _)) => format!("{server}/{database}"),
        None => panic!("NODUS_TEST_POSTGRES_URL has no database part: {base}"),
    }
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A running server; killed when dropped.
pub struct ServerProcess {
    child: Child,
    pub url: String,
    pub data_dir: PathBuf,
    pub store: String,
    pub log: PathBuf,
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The URL that the server started as `child` (logging to `log`) serves the API on, from the
/// line it prints once it is bound; panics with the log if it exits or takes a minute.
fn served_url(child: &mut Child, log: &Path) -> String {
    const SERVING: &str = "nodus server: serving the API on ";
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let printed = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(url) = printed
            .lines()
            .find_map(|line| line.strip_prefix(SERVING)?.split_whitespace().next())
        {
            return url.to_string();
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the server exited with {status}; log:\n{printed}");
        }
        assert!(
            Instant::now() < deadline,
            "the server did not bind within 60 s; log:\n{printed}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl ServerProcess {
    /// Start `nodus server` on `store` with its data in `data_dir`, and wait for /healthz.
    pub fn start(store: &str, data_dir: &Path, sandbox: &str) -> Self {
        Self::start_with(store, data_dir, sandbox, &[])
    }

    /// Start `nodus server` on a SQLite store in `data_dir` with more flags.
    pub fn start_sqlite(data_dir: &Path, sandbox: &str, extra: &[&str]) -> Self {
        Self::start_with(
            &Backend::Sqlite.store_url(data_dir),
            data_dir,
            sandbox,
            extra,
        )
    }

    /// The same, with more `nodus server` flags.
    pub fn start_with(store: &str, data_dir: &Path, sandbox: &str, extra: &[&str]) -> Self {
        Self::start_in_env(store, data_dir, sandbox, extra, &[])
    }

    /// The same, with variables set in the server's environment.
    pub fn start_in_env(
        store: &str,
        data_dir: &Path,
        sandbox: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        Self::start_wrapped(store, data_dir, sandbox, extra, env, &[])
    }

    /// The same, started by `wrapper` (a program and its arguments, such as `setpriv` that
    /// runs the server as another user) when it is not empty.
    pub fn start_wrapped(
        store: &str,
        data_dir: &Path,
        sandbox: &str,
        extra: &[&str],
        env: &[(&str, &str)],
        wrapper: &[&str],
    ) -> Self {
        // The server refuses a data directory that other users can read.
        std::fs::set_permissions(
            data_dir,
            std::os::unix::fs::PermissionsExt::from_mode(0o700),
        )
        .expect("an owner-only data directory");
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let started = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = data_dir.join(format!("server-{started}.log"));
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut command = Command::new(program);
                command.args(args).arg(nodus_binary());
                command
            }
            None => Command::new(nodus_binary()),
        };
        let mut child = command
            .args([
                "server",
                // The port is picked at the server's own bind: one picked here and let go
                // could be taken meanwhile by another test's server, which would then answer
                // for this one.
                "--listen",
                "127.0.0.1:0",
                "--store",
                store,
                "--sandbox",
                sandbox,
            ])
            .arg("--data-dir")
            .arg(data_dir)
            .args(["--bootstrap-token", TOKEN])
            .args(extra)
            .env_remove("ANTHROPIC_API_KEY")
            .env_remove("ANTHROPIC_BASE_URL")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).expect("log"))
            .stderr(
                std::fs::File::options()
                    .append(true)
                    .open(&log)
                    .expect("log"),
            )
            .spawn()
            .expect("nodus server starts");
        let url = served_url(&mut child, &log);
        let server = ServerProcess {
            child,
            url,
            data_dir: data_dir.to_path_buf(),
            store: store.to_string(),
            log,
        };
        server.wait_healthy();
        server
    }

    fn wait_healthy(&self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Ok(output) = Command::new("curl")
                .args(["-sf", &format!("{}/healthz", self.url)])
                .output()
                && output.status.success()
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!(
            "the server did not become healthy; log:\n{}",
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
    }

    /// Kill the server with SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Send SIGTERM, as an orchestrator stopping the replica does.
    pub fn terminate(&self) {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill -TERM: {status}");
    }

    /// Whether the process is still running (it has not exited or crashed).
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// How the process exited, once it has (`None` while it runs).
    pub fn try_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Run the CLI against this server; returns its output.
    pub fn cli(&self, args: &[&str]) -> Output {
        self.cli_in(args, None)
    }

    /// Run the CLI with `stdin` as its input.
    pub fn cli_in(&self, args: &[&str], stdin: Option<&str>) -> Output {
        cli_against(&self.url, &self.data_dir, args, stdin)
    }

    /// Start the CLI against this server without waiting for it (its output is dropped): for
    /// a command to be cut off by killing the server.
    pub fn spawn_cli(&self, args: &[&str]) -> Child {
        cli_command(&self.url, &self.data_dir, args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the CLI runs")
    }

    /// Wait (with `nodus wait`, up to two minutes) until run `run` is in `phase`.
    pub fn wait_for(&self, run: &str, phase: &str) {
        self.ok(&[
            "wait",
            &format!("agentrun/{run}"),
            &format!("--for=jsonpath={{.status.phase}}={phase}"),
            "--timeout=2m",
        ]);
    }

    /// Run the CLI and insist that it succeeds; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let output = self.cli(args);
        assert!(
            output.status.success(),
            "nodus {args:?} failed ({}):\nstdout: {}\nstderr: {}\nserver log:\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            std::fs::read_to_string(&self.log).unwrap_or_default()
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Run the CLI and insist that it fails; returns stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let output = self.cli(args);
        assert!(
            !output.status.success(),
            "nodus {args:?} should fail:\n{}",
            String::from_utf8_lossy(&output.stdout)
        );
        String::from_utf8_lossy(&output.stderr).into_owned()
    }

    /// The text of run `name`'s result `result`, fetched into `dir`: an archive
    /// (`artifacts`, `inputWorkdir`, `outputWorkdir`) as its files' contents one after another.
    pub fn result_text(&self, name: &str, result: &str, dir: &Path) -> String {
        let file = dir.join(format!("{name}-{result}"));
        self.ok(&[
            "agentrun",
            "results",
            name,
            result,
            "-o",
            file.to_str().expect("a path"),
        ]);
        if ["artifacts", "inputWorkdir", "outputWorkdir"].contains(&result) {
            let unpacked = Command::new("tar")
                .arg("xzOf")
                .arg(&file)
                .output()
                .expect("tar runs");
            assert!(unpacked.status.success(), "{unpacked:?}");
            String::from_utf8_lossy(&unpacked.stdout).into_owned()
        } else {
            std::fs::read_to_string(&file).expect("a result")
        }
    }

    /// The records of run `name`'s result `egress`, through `nodus agentrun egress -o jsonl`.
    pub fn egress_records(&self, name: &str) -> Vec<serde_json::Value> {
        self.ok(&["agentrun", "egress", name, "-o", "jsonl"])
            .lines()
            .map(|line| serde_json::from_str(line).expect("a JSON line"))
            .collect()
    }

    /// What run `name` shows anyone who asks: its resource, steps (with payloads), answer,
    /// logs and results `runRecord` and `artifacts` (fetched into `dir`); each with where it
    /// came from. For tests that a value shows in none of them.
    pub fn run_texts(&self, name: &str, dir: &Path) -> Vec<(String, String)> {
        let mut seen: Vec<(String, String)> = Vec::new();
        seen.push((
            format!("{name}'s resource"),
            self.ok(&["get", &format!("agentrun/{name}"), "-o", "json"]),
        ));
        seen.push((
            format!("{name}'s steps"),
            self.ok(&["agentrun", "steps", name]),
        ));
        let (status, steps) = self.http_with(
            "GET",
            &format!("/apis/nodus.dev/v1/projects/default/agentruns/{name}/steps?payload=true"),
            &[],
            None,
        );
        assert_eq!(status, 200, "{steps}");
        seen.push((format!("{name}'s steps with payloads"), steps.to_string()));
        seen.push((
            format!("{name}'s answer"),
            self.ok(&["agentrun", "answer", name]),
        ));
        seen.push((
            format!("{name}'s logs"),
            self.ok(&["agentrun", "logs", name]),
        ));
        for result in ["runRecord", "artifacts"] {
            seen.push((
                format!("{name}'s result {result}"),
                self.result_text(name, result, dir),
            ));
        }
        seen
    }

    /// A plain HTTP call with curl and the admin token, with extra headers.
    pub fn http_with(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> (u16, serde_json::Value) {
        self.curl(method, path, Some(TOKEN), headers, body)
    }

    /// A plain HTTP call with curl: (status, body).
    pub fn http(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: Option<&str>,
    ) -> (u16, serde_json::Value) {
        self.curl(method, path, token, &[], body)
    }

    fn curl(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        headers: &[(&str, &str)],
        body: Option<&str>,
    ) -> (u16, serde_json::Value) {
        let mut command = Command::new("curl");
        for (name, value) in headers {
            command.args(["-H", &format!("{name}: {value}")]);
        }
        command.args([
            "-s",
            "-o",
            "-",
            "-w",
            "\n%{http_code}",
            "-X",
            method,
            &format!("{}{}", self.url, path),
        ]);
        command.args(["-H", "Content-Type: application/json"]);
        if let Some(token) = token {
            command.args(["-H", &format!("Authorization: Bearer {token}")]);
        }
        if body.is_some() {
            command.args(["--data-binary", "@-"]);
            command.stdin(Stdio::piped());
        }
        command.stdout(Stdio::piped());
        let mut child = command.spawn().expect("curl");
        if let (Some(body), Some(mut pipe)) = (body, child.stdin.take()) {
            use std::io::Write as _;
            pipe.write_all(body.as_bytes()).expect("body");
        }
        let output = child.wait_with_output().expect("curl finishes");
        let text = String::from_utf8_lossy(&output.stdout);
        let (body, code) = text.rsplit_once('\n').expect("status line");
        (
            code.trim().parse().expect("status"),
            serde_json::from_str(body).unwrap_or(serde_json::Value::String(body.to_string())),
        )
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The CLI with `args`, against the server at `url` (the admin token; its config under
/// `data_dir`), not started yet.
pub fn cli_command(url: &str, data_dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(nodus_binary());
    command
        .args(args)
        .env("NODUS_SERVER", url)
        .env("NODUS_TOKEN", TOKEN)
        .env("XDG_CONFIG_HOME", data_dir.join("config"));
    command
}

/// Run the CLI against the server at `url` (the admin token; its config under `data_dir`) with
/// `stdin` as its input.
pub fn cli_against(url: &str, data_dir: &Path, args: &[&str], stdin: Option<&str>) -> Output {
    use std::io::Write as _;
    let mut child = cli_command(url, data_dir, args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("nodus runs");
    if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(text.as_bytes()).expect("stdin");
    }
    child.wait_with_output().expect("nodus finishes")
}

/// `nobody`, whom an unprivileged server runs as when the test is root.
const NOBODY: u32 = 65534;

/// The wrapper that starts a server as a user that is not root ([`ServerProcess::start_wrapped`]):
/// as root, `setpriv` to `nobody` with no capabilities, `data_dir` given to that user;
/// otherwise none (the test is not root already).
pub fn unprivileged_wrapper(data_dir: &Path) -> &'static [&'static str] {
    if effective_uid() != 0 {
        return &[];
    }
    std::os::unix::fs::chown(data_dir, Some(NOBODY), Some(NOBODY)).expect("chown");
    &[
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=-all",
    ]
}

/// The test's own effective user id.
fn effective_uid() -> u32 {
    let status = std::fs::read_to_string("/proc/self/status").expect("status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1))
        .and_then(|id| id.parse().ok())
        .expect("an effective uid")
}

/// Panics unless the process `pid` runs as a user other than root.
pub fn assert_not_root(pid: u32) {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).expect("the server's status");
    let uid = status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next())
        .expect("a Uid line")
        .to_string();
    assert_ne!(uid, "0", "the server runs as root: {status}");
}
