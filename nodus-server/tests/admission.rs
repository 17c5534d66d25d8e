//! What a hostile client can hold of a real server (a socket, the runner on): stalled request
//! bodies and streams past the limits leave `/healthz` answering; bodies without a token are
//! refused before they are read (the server's memory does not grow with them); a deleted
//! token's streams and long polls end within a second or two; a body that stalls is cut.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use nodus_server::admission::AdmissionLimits;
use nodus_server::{Options, SandboxKind, Server, StoreUrl};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

const TOKEN: &str = "nodus_admission_test_token_0123456789";
const BASE: &str = "/apis/nodus.dev/v1/projects/default";
/// Connections a hostile client opens: more than the connection limit these servers had.
const HOSTILE: usize = 520;
/// How long `/healthz` may take while they are open.
const HEALTHY: Duration = Duration::from_millis(100);

struct Running {
    address: SocketAddr,
    state: std::sync::Arc<nodus_server::AppState>,
    http: reqwest::Client,
    _stop: tokio::sync::oneshot::Sender<()>,
    _dir: tempfile::TempDir,
}

async fn start(change: impl FnOnce(&mut Options)) -> Running {
    let dir = tempfile::tempdir().expect("dir");
    let mut options = Options::new(dir.path().join("data"));
    options.store = Some(StoreUrl::Memory);
    options.sandbox = SandboxKind::Unisolated;
    options.bootstrap_token = Some(TOKEN.to_string());
    options.listen = "127.0.0.1:0".parse().expect("address");
    change(&mut options);
    let server = Server::build(options).await.expect("server");
    let state = server.state();
    let bound = server.bind().await.expect("bind");
    let address = bound.local_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(bound.serve(async move {
        let _ = stopped.await;
    }));
    Running {
        address,
        state,
        http: client().build().expect("client"),
        _stop: stop,
        _dir: dir,
    }
}

impl Running {
    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.address)
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = self.http.request(method, self.url(path)).bearer_auth(TOKEN);
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_string());
        }
        let response = request.send().await.expect("answer");
        let status = response.status();
        let body: Value = json_of(response).await;
        assert!(status.is_success(), "{path}: {status} {body}");
        body
    }

    /// A new token of `default` with `role`; the token.
    async fn token(&self, name: &str, role: &str) -> String {
        let made = self
            .call(
                reqwest::Method::POST,
                &format!("{BASE}/tokens"),
                Some(json!({"metadata": {"name": name}, "spec": {"role": role}})),
            )
            .await;
        made["token"].as_str().expect("token").to_string()
    }

    async fn delete_token(&self, name: &str) {
        self.call(
            reqwest::Method::DELETE,
            &format!("{BASE}/tokens/{name}"),
            None,
        )
        .await;
    }

    /// `GET /healthz` on a new connection: how long it took (the median of five).
    async fn healthz_time(&self) -> Duration {
        let mut times = Vec::new();
        for _ in 0..5 {
            let start = Instant::now();
            let answer = tokio::time::timeout(
                Duration::from_secs(30),
                raw(self.address, "GET /healthz HTTP/1.1\r\nHost: n\r\n\r\n"),
            )
            .await
            .expect("healthz answers at all");
            times.push(start.elapsed());
            assert!(
                answer.contains("200 OK") && answer.ends_with("ok\n"),
                "{answer}"
            );
        }
        times.sort();
        times[2]
    }

    /// `GET path` with `token`.
    async fn get(&self, path: &str, token: &str) -> reqwest::Response {
        self.http
            .get(self.url(path))
            .bearer_auth(token)
            .send()
            .await
            .expect("answer")
    }

    /// `GET path` of a console session (its `cookie`).
    async fn get_in_session(&self, path: &str, cookie: &str) -> reqwest::Response {
        self.http
            .get(self.url(path))
            .header("cookie", cookie)
            .send()
            .await
            .expect("answer")
    }

    /// A console session of `token`: its cookie.
    async fn console_session(&self, token: &str) -> String {
        let client = client()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .expect("client");
        let answer = client
            .post(self.url("/console/signin"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!("token={token}"))
            .send()
            .await
            .expect("sign-in");
        assert_eq!(answer.status(), 303);
        let cookie = answer.headers()["set-cookie"].to_str().expect("cookie");
        cookie.split(';').next().expect("pair").to_string()
    }
}

/// An HTTP client as the server's own (rustls with ring).
fn client() -> reqwest::ClientBuilder {
    nodus_llm::http::client_builder(&nodus_llm::HttpConfig::default()).expect("client")
}

/// Whether the streamed body of `response` ends within `within`.
async fn ends_within(mut response: reqwest::Response, within: Duration) -> bool {
    let ended = async { while let Ok(Some(_)) = response.chunk().await {} };
    tokio::time::timeout(within, ended).await.is_ok()
}

async fn json_of(response: reqwest::Response) -> Value {
    let text = response.text().await.expect("body");
    serde_json::from_str(&text).unwrap_or(Value::Null)
}

/// Send `request` on a new connection and read until the server closes it or answers a whole
/// `Content-Length` body.
async fn raw(address: SocketAddr, request: &str) -> String {
    let mut stream = TcpStream::connect(address).await.expect("connect");
    stream.write_all(request.as_bytes()).await.expect("send");
    read_answer(&mut stream).await
}

async fn read_answer(stream: &mut TcpStream) -> String {
    let mut answer = Vec::new();
    let mut buffer = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&answer).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n")
            && let Some(length) = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().to_string())
                })
                .and_then(|v| v.parse::<usize>().ok())
            && body.len() >= length
        {
            return text;
        }
        match stream.read(&mut buffer).await {
            Ok(0) | Err(_) => return text,
            Ok(read) => answer.extend_from_slice(&buffer[..read]),
        }
    }
}

/// Whether the server closes `stream` within `within` (after whatever it answered).
async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
    let mut buffer = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buffer)).await {
            Ok(Ok(0) | Err(_)) => return true,
            Ok(Ok(_)) => {}
            Err(_) => return false,
        }
    }
}

/// Open `count` connections that each send a POST's headers and one byte of its 100-byte
/// body, with `authorization` (a header line or nothing).
async fn stalled_bodies(address: SocketAddr, count: usize, authorization: &str) -> Vec<TcpStream> {
    let mut streams = Vec::new();
    for i in 0..count {
        let mut stream = TcpStream::connect(address).await.expect("connect");
        let request = format!(
            "POST {BASE}/agentruns HTTP/1.1\r\nHost: n\r\n{authorization}Content-Type: \
             application/json\r\nContent-Length: 100\r\n\r\n{{"
        );
        stream.write_all(request.as_bytes()).await.expect("send");
        streams.push(stream);
        if i % 50 == 0 {
            tokio::task::yield_now().await;
        }
    }
    streams
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_bodies_without_a_token_are_refused_unread_and_healthz_answers() {
    let server = start(|options| options.max_connections = 512).await;
    let mut streams = stalled_bodies(server.address, HOSTILE, "").await;
    let took = server.healthz_time().await;
    assert!(
        took < HEALTHY,
        "/healthz took {took:?} with {HOSTILE} stalled bodies open"
    );
    // Each was answered 401 at once and closed: it holds nothing of the server's.
    let first = read_answer(&mut streams[0]).await;
    assert!(first.starts_with("HTTP/1.1 401"), "{first}");
    assert!(
        first.to_ascii_lowercase().contains("connection: close"),
        "{first}"
    );
    for stream in &mut streams {
        assert!(closed_within(stream, Duration::from_secs(5)).await);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_bodies_with_a_token_are_bounded_per_token_and_cut_at_their_deadline() {
    let server = start(|options| {
        options.max_connections = 512;
        // Long enough for the server to have read every connection's headers before the
        // first admitted body is cut (a slot it frees would admit a later one): on a loaded
        // machine one second was not (456 answers 429, not 488).
        options.header_timeout = Duration::from_secs(4);
    })
    .await;
    let writer = server.token("writer", "write").await;
    let authorization = format!("Authorization: Bearer {writer}\r\n");
    let mut streams = stalled_bodies(server.address, HOSTILE, &authorization).await;
    let took = server.healthz_time().await;
    assert!(
        took < HEALTHY,
        "/healthz took {took:?} with {HOSTILE} stalled bodies open"
    );
    let most = AdmissionLimits::default().max_bodies_per_token;
    let mut answers = Vec::new();
    for stream in &mut streams {
        let answer = tokio::time::timeout(Duration::from_secs(10), read_answer(stream))
            .await
            .expect("answered");
        answers.push(answer);
    }
    let too_many = answers
        .iter()
        .filter(|a| a.starts_with("HTTP/1.1 429"))
        .count();
    let late = answers
        .iter()
        .filter(|a| a.starts_with("HTTP/1.1 408"))
        .count();
    assert_eq!(too_many, HOSTILE - most, "past the token's bodies: 429");
    assert_eq!(
        late, most,
        "the admitted ones are cut when the body stalls: 408"
    );
    assert!(
        answers
            .iter()
            .all(|a| a.to_ascii_lowercase().contains("connection: close"))
    );
    assert!(
        answers
            .iter()
            .filter(|a| a.starts_with("HTTP/1.1 429"))
            .all(|a| a.contains("retry-after"))
    );
}

fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("rss");
    pages * 4096
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_without_a_token_are_not_read_into_memory() {
    const CONNECTIONS: usize = 120;
    const BODY: usize = 32 * 1024 * 1024;
    let server = start(|_| {}).await;
    // One body for every client, allocated (and touched) before the measure starts.
    let body = std::sync::Arc::new(vec![b' '; BODY]);
    let before = resident_bytes();
    let mut clients = Vec::new();
    for _ in 0..CONNECTIONS {
        let body = body.clone();
        let address = server.address;
        clients.push(tokio::spawn(async move {
            let mut stream = TcpStream::connect(address).await.expect("connect");
            let head = format!(
                "POST {BASE}/agentruns HTTP/1.1\r\nHost: n\r\nContent-Type: \
                 application/json\r\nContent-Length: {BODY}\r\n\r\n"
            );
            stream.write_all(head.as_bytes()).await.expect("headers");
            // The server answers and closes before taking it all: the write fails then.
            let _ = stream.write_all(&body).await;
            read_answer(&mut stream).await
        }));
    }
    for client in clients {
        let answer = client.await.expect("client");
        assert!(
            answer.is_empty() || answer.starts_with("HTTP/1.1 401"),
            "{answer}"
        );
    }
    let grown = resident_bytes().saturating_sub(before);
    assert!(
        grown < 64 * 1024 * 1024,
        "{CONNECTIONS} bodies of 32 MiB without a token grew the server by {} MiB",
        grown / (1024 * 1024)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_of_one_console_session_are_limited_and_healthz_answers() {
    let server = start(|options| options.max_connections = 512).await;
    let reader = server.token("reader", "read").await;
    let cookie = server.console_session(&reader).await;
    let mut streams = Vec::new();
    let mut refused = 0;
    for _ in 0..HOSTILE {
        let mut stream = TcpStream::connect(server.address).await.expect("connect");
        let request = format!(
            "GET /console/p/default/events HTTP/1.1\r\nHost: n\r\nCookie: {cookie}\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await.expect("send");
        let mut head = vec![0u8; 512];
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut head))
            .await
            .expect("the server answers every stream at once (open, or refused)")
            .expect("head");
        let head = String::from_utf8_lossy(&head[..read]).into_owned();
        if head.starts_with("HTTP/1.1 429") {
            assert!(head.contains("retry-after"), "{head}");
            assert!(
                closed_within(&mut stream, Duration::from_secs(5)).await,
                "a refusal closes"
            );
            refused += 1;
        } else {
            assert!(head.starts_with("HTTP/1.1 200"), "{head}");
            streams.push(stream);
        }
    }
    let most = AdmissionLimits::default().max_streams_per_session;
    assert_eq!(
        streams.len(),
        most,
        "a session holds at most {most} streams"
    );
    assert_eq!(refused, HOSTILE - most);
    let took = server.healthz_time().await;
    assert!(took < HEALTHY, "/healthz took {took:?}");
    // Another session of the same token still gets in; the API's watches count per token.
    let other = server.console_session(&reader).await;
    let answer = server
        .get_in_session("/console/p/default/events", &other)
        .await;
    assert_eq!(answer.status(), 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_polls_of_one_token_are_limited() {
    let server = start(|_| {}).await;
    let reader = server.token("reader", "read").await;
    let list = server.get(&format!("{BASE}/agents"), reader.as_str()).await;
    let list = json_of(list).await;
    let version = list["metadata"]["resourceVersion"]
        .as_str()
        .expect("version")
        .to_string();
    let most = AdmissionLimits::default().max_streams_per_token;
    let mut waiting = Vec::new();
    for _ in 0..most {
        let http = server.http.clone();
        let url = server.url(&format!(
            "{BASE}/agents?watch=true&resourceVersion={version}&timeoutSeconds=60"
        ));
        let reader = reader.clone();
        waiting.push(tokio::spawn(async move {
            http.get(url).bearer_auth(reader).send().await
        }));
    }
    // Every one of them is waiting before the next is tried.
    let patience = Instant::now() + Duration::from_secs(10);
    while server.state.admission.open_streams() < most {
        assert!(
            Instant::now() < patience,
            "the {most} long polls never all waited"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let answer = server
        .get(
            &format!("{BASE}/agents?watch=true&resourceVersion={version}&timeoutSeconds=60"),
            &reader,
        )
        .await;
    assert_eq!(answer.status(), 429);
    assert!(answer.headers().contains_key("retry-after"));
    let body = json_of(answer).await;
    assert_eq!(body["reason"], "TooManyRequests", "{body}");
    // Another token is not held back by this one's.
    let other = server.token("other", "read").await;
    let answer = server
        .get(
            &format!("{BASE}/agents?watch=true&resourceVersion={version}&timeoutSeconds=1"),
            &other,
        )
        .await;
    assert_eq!(answer.status(), 200);
    for wait in waiting {
        wait.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_tokens_follow_stream_console_events_and_long_poll_end() {
    let server = start(|_| {}).await;
    server
        .call(
            reqwest::Method::POST,
            &format!("{BASE}/agents"),
            Some(json!({"apiVersion": "nodus.dev/v1", "kind": "Agent",
                "metadata": {"name": "worker"}, "spec": {"system": "s"}})),
        )
        .await;
    server
        .call(
            reqwest::Method::POST,
            &format!("{BASE}/agentruns"),
            Some(json!({"apiVersion": "nodus.dev/v1", "kind": "AgentRun",
                "metadata": {"name": "long"},
                "spec": {"agent": "worker", "input": "Run `for i in $(seq 1 60); do echo tick-$i; sleep 1; done` and tell me."}})),
        )
        .await;
    let reader = server.token("reader", "read").await;
    // The follow stream: it gives its first line and keeps going while the command runs.
    let mut follow = server
        .get(
            &format!("{BASE}/agentruns/long/logs?follow=true"),
            reader.as_str(),
        )
        .await;
    assert_eq!(follow.status(), 200);
    let first = follow.chunk().await.expect("read").expect("first line");
    assert!(String::from_utf8_lossy(&first).contains("following"));
    // The console's event stream of a session of the same token.
    let cookie = server.console_session(&reader).await;
    let events = server
        .get_in_session("/console/p/default/events", &cookie)
        .await;
    assert_eq!(events.status(), 200);
    // A long poll of the list of agents, waiting for a change.
    let list = json_of(server.get(&format!("{BASE}/agents"), reader.as_str()).await).await;
    let version = list["metadata"]["resourceVersion"]
        .as_str()
        .expect("version");
    let poll = tokio::spawn(
        server
            .http
            .get(server.url(&format!(
                "{BASE}/agents?watch=true&resourceVersion={version}&timeoutSeconds=120"
            )))
            .bearer_auth(reader.clone())
            .send(),
    );
    // Let every one of them be open before the token goes.
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.delete_token("reader").await;
    let deleted = Instant::now();
    // An agent created after the revocation: the long poll must not show it.
    server
        .call(
            reqwest::Method::POST,
            &format!("{BASE}/agents"),
            Some(json!({"apiVersion": "nodus.dev/v1", "kind": "Agent",
                "metadata": {"name": "after"}, "spec": {"system": "s"}})),
        )
        .await;
    let within = Duration::from_secs(2);
    let polled = tokio::time::timeout(within, poll)
        .await
        .expect("the long poll answers within 2 s")
        .expect("task")
        .expect("answer");
    assert_eq!(
        polled.status(),
        401,
        "the long poll of a deleted token is refused"
    );
    let text = polled.text().await.expect("body");
    assert!(!text.contains("\"after\""), "{text}");
    assert!(
        ends_within(follow, within).await,
        "the follow stream of a deleted token ends within 2 s"
    );
    assert!(
        ends_within(events, within).await,
        "the console events of a deleted token end within 2 s"
    );
    assert!(deleted.elapsed() < Duration::from_secs(4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expiring_tokens_stream_ends_at_its_expiry() {
    let server = start(|_| {}).await;
    let made = server
        .call(
            reqwest::Method::POST,
            &format!("{BASE}/tokens"),
            Some(json!({"metadata": {"name": "brief"}, "spec": {"role": "read", "expires": "2s"}})),
        )
        .await;
    let brief = made["token"].as_str().expect("token");
    let cookie = server.console_session(brief).await;
    let events = server
        .get_in_session("/console/p/default/events", &cookie)
        .await;
    assert_eq!(events.status(), 200);
    assert!(
        ends_within(events, Duration::from_secs(5)).await,
        "the stream ends when its token expires"
    );
}
