//! The harness of the CLI tests: a real `nodus server` child on a free port (offline model,
//! the sandbox the test names), and the real `nodus` binary run against it with its own
//! config directory and no connection from the environment.

#![allow(dead_code)]

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const NODUS: &str = env!("CARGO_BIN_EXE_nodus");
/// The admin token of the test servers (32 characters and more).
pub const TOKEN: &str = "cli-test-token-0123456789abcdefghijklmnop";
/// The repository's root (README.md, examples/).
pub const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// A server child; killed when dropped.
pub struct Server {
    pub child: Child,
    pub log: PathBuf,
    pub port: u16,
}

impl Server {
    /// What the server printed.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Its URL.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a free port");
    listener.local_addr().expect("address").port()
}

pub fn healthy(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    let request = "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
    if stream.write_all(request.as_bytes()).is_err() {
        return false;
    }
    let mut answer = String::new();
    let _ = stream.read_to_string(&mut answer);
    answer.starts_with("HTTP/1.1 200")
}

/// `nodus server` with the data directory `dir/data` (`store` as --store when given), on
/// `--listen listen`, offline.
pub fn spawn_server(dir: &Path, store: Option<&str>, sandbox: &str, listen: &str) -> Child {
    let mut command = Command::new(NODUS);
    command.arg("server");
    if let Some(store) = store {
        command.args(["--store", store]);
    }
    command
        .args(["--sandbox", sandbox, "--data-dir"])
        .arg(dir.join("data"))
        .args(["--listen", listen, "--bootstrap-token", TOKEN])
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("NODUS_BOOTSTRAP_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("server.log")).expect("log file"))
        .spawn()
        .expect("nodus server starts")
}

/// A server on a free port, once its /healthz answers. The port is picked at the server's
/// own bind (`--listen 127.0.0.1:0`) and read from what it prints: one picked here and let go
/// could be taken meanwhile by another test's server, which would then answer for this one.
pub fn start_server(dir: &Path, store: Option<&str>, sandbox: &str) -> Server {
    let mut child = spawn_server(dir, store, sandbox, "127.0.0.1:0");
    let log = dir.join("server.log");
    let port = served_port(&mut child, &log);
    wait_healthy(Server { child, log, port })
}

/// The port that the server started as `child` (printing to `log`) serves the API on, from the
/// line it prints once it is bound; panics with the log if it exits or takes a minute.
fn served_port(child: &mut Child, log: &Path) -> u16 {
    const SERVING: &str = "nodus server: serving the API on http://127.0.0.1:";
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let printed = std::fs::read_to_string(log).unwrap_or_default();
        if let Some(port) = printed.lines().find_map(|line| {
            line.strip_prefix(SERVING)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        }) {
            return port;
        }
        if let Ok(Some(status)) = child.try_wait() {
            panic!("the server exited with {status}:\n{printed}");
        }
        assert!(
            Instant::now() < deadline,
            "the server did not bind within 60s:\n{printed}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `server` once its /healthz answers (panics with its log if it exits or takes a minute).
pub fn wait_healthy(mut server: Server) -> Server {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !healthy(server.port) {
        if let Ok(Some(status)) = server.child.try_wait() {
            panic!("the server exited with {status}:\n{}", server.log());
        }
        assert!(
            Instant::now() < deadline,
            "no /healthz within 60s:\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    server
}

/// The CLI with its config in `dir` and no connection from the environment.
pub fn command(dir: &Path) -> Command {
    let mut command = Command::new(NODUS);
    command
        .env("XDG_CONFIG_HOME", dir.join("config"))
        .env_remove("NODUS_CONFIG")
        .env_remove("NODUS_SERVER")
        .env_remove("NODUS_TOKEN")
        .env_remove("NODUS_PROJECT")
        .env_remove("ANTHROPIC_API_KEY")
        .stdin(Stdio::null());
    command
}

/// Runs the CLI in `dir` with `args`.
pub fn nodus(dir: &Path, args: &[&str]) -> Output {
    command(dir).args(args).output().expect("nodus runs")
}

pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs the CLI and requires exit code 0; returns its standard output.
pub fn ok(dir: &Path, args: &[&str]) -> String {
    let output = nodus(dir, args);
    assert!(
        output.status.success(),
        "nodus {args:?} failed with {}:\nstdout: {}\nstderr: {}",
        output.status,
        text(&output.stdout),
        text(&output.stderr)
    );
    text(&output.stdout)
}

/// Logs the CLI in `dir` in to `server` with the admin token.
pub fn login(dir: &Path, server: &Server) {
    ok(dir, &["login", "--server", &server.url(), "--token", TOKEN]);
}
