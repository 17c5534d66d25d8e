//! A server whose disk is full starts, serves reads and answers writes with a retryable 503
//! that says the disk is full and when to try again; once space is freed, writes work again,
//! and the database file passes SQLite's integrity check. The data directory is on a small
//! tmpfs mounted for the test (the test runs as root, as CI does).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use nodus_server::{Options, SandboxKind, Server};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tower::ServiceExt as _;

const TOKEN: &str = "nodus_full_disk_test_token_0123456789abcdef";
const AGENTS: &str = "/apis/nodus.dev/v1/projects/default/agents";

/// A tmpfs of `size` mounted at a new directory; unmounted when dropped.
struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    fn mount(dir: PathBuf, size: &str) -> Self {
        std::fs::create_dir_all(&dir).expect("mount point");
        let status = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "tmpfs",
            ])
            .arg(&dir)
            .status()
            .expect("mount runs");
        assert!(status.success(), "mounting a tmpfs needs root");
        Tmpfs { dir }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

/// Fill the file system of `dir` with the file `name` until it is full.
fn fill(dir: &Path, name: &str) {
    let mut file = std::fs::File::create(dir.join(name)).expect("a filler");
    let chunk = vec![1u8; 64 * 1024];
    loop {
        match file.write(&chunk) {
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(28) => break,
            Err(e) => panic!("filling: {e}"),
        }
    }
    let _ = file.sync_all();
}

fn options(data: &Path) -> Options {
    let mut options = Options::new(data.to_path_buf());
    options.sandbox = SandboxKind::Unisolated;
    options.bootstrap_token = Some(TOKEN.to_string());
    options.listen = "127.0.0.1:0".parse().expect("address");
    options
}

fn agent(name: &str) -> Value {
    json!({"apiVersion": "nodus.dev/v1", "kind": "Agent", "metadata": {"name": name},
           "spec": {"system": "You are careful.", "model": {"access": "Nodus"}, "perRunMaxCostUSD": "0.50"}})
}

async fn call(
    router: &axum::Router,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value) {
    let (status, body, _) = call_with_headers(router, method, path, body).await;
    (status, body)
}

async fn call_with_headers(
    router: &axum::Router,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (StatusCode, Value, axum::http::HeaderMap) {
    let request = Request::builder()
        .method(method)
        .uri(path)
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(body.map_or_else(Body::empty, |b| Body::from(b.to_string())))
        .expect("request");
    let response = router.clone().oneshot(request).await.expect("response");
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = axum::body::to_bytes(response.into_body(), usize::MAX)
        .await
        .expect("body");
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        headers,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_starts_on_a_full_disk_and_writes_again_once_space_is_freed() {
    let parent = tempfile::tempdir().expect("tempdir");
    let disk = Tmpfs::mount(parent.path().join("disk"), "32m");
    let data = disk.dir.join("data");

    // First start: the store, the template, the token; one agent written.
    {
        let server = Server::build(options(&data)).await.expect("first start");
        let router = nodus_server::router(server.state());
        let (status, body) = call(&router, Method::POST, AGENTS, Some(agent("kept"))).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
    }
    // Stopped; the connections close.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;

    fill(&disk.dir, "filler");

    // Second start, on a full disk: it starts and serves.
    let server = Server::build(options(&data))
        .await
        .expect("the server starts on a full disk");
    let router = nodus_server::router(server.state());
    let bound = server.bind().await.expect("bind");
    let address = bound.local_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(bound.serve(async move {
        let _ = stopped.await;
    }));
    let mut health = tokio::net::TcpStream::connect(address)
        .await
        .expect("connect");
    health
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: nodus\r\nConnection: close\r\n\r\n")
        .await
        .expect("request");
    let mut answer = String::new();
    health.read_to_string(&mut answer).await.expect("answer");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let (status, body) = call(&router, Method::GET, &format!("{AGENTS}/kept"), None).await;
    assert_eq!(status, StatusCode::OK, "reads are served: {body}");
    let (status, body) = call(
        &router,
        Method::GET,
        "/apis/nodus.dev/v1/projects/nodus/agents/claude-assistant",
        None,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "the template is there: {body}");

    // Whatever room the start made is taken too: a write is refused, retryably, saying why.
    fill(&disk.dir, "more-filler");
    let (status, body, headers) =
        call_with_headers(&router, Method::POST, AGENTS, Some(agent("blocked"))).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["reason"], "Unavailable", "{body}");
    let retry = headers
        .get(header::RETRY_AFTER)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    assert!(
        retry.is_some_and(|seconds| seconds > 0),
        "a refused write says when to try again: {headers:?}"
    );
    let message = body["message"].as_str().unwrap_or_default();
    assert!(message.contains("the disk is full"), "{message}");
    assert!(!message.contains(&data.display().to_string()), "{message}");

    // Space freed: the same write works.
    std::fs::remove_file(disk.dir.join("filler")).expect("free");
    std::fs::remove_file(disk.dir.join("more-filler")).expect("free");
    let (status, body) = call(&router, Method::POST, AGENTS, Some(agent("blocked"))).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, _) = call(&router, Method::GET, &format!("{AGENTS}/blocked"), None).await;
    assert_eq!(status, StatusCode::OK);

    let _ = stop.send(());
    serving.await.expect("served").expect("stopped");
    drop(router);
    // The file that a write was refused on is whole.
    let check = Command::new("sqlite3")
        .arg(data.join("nodus.db"))
        .arg("PRAGMA integrity_check;")
        .output()
        .expect("sqlite3 (scripts/test-env installs it)");
    assert_eq!(
        String::from_utf8_lossy(&check.stdout).trim(),
        "ok",
        "integrity check: {check:?}"
    );
    drop(disk);
}
