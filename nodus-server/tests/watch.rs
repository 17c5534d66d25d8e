//! Watch streams through a served server, as a client reads them over HTTP: the current
//! state as `ADDED` events, then each change in the selection, `BOOKMARK`s while nothing
//! happens, the same views as `GET`, and the end at `timeoutSeconds` or when the server stops.

use std::time::Duration;

use nodus_server::{Options, SandboxKind, Server, StoreUrl};
use serde_json::{Value, json};

const TOKEN: &str = "nodus_watch_stream_test_0123456789abcdef";
const BOOKMARKS: Duration = Duration::from_millis(300);
/// Far longer than any event takes to arrive; a test that waits this long has failed.
const PATIENCE: Duration = Duration::from_secs(20);

struct Served {
    base: String,
    http: reqwest::Client,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

async fn serve() -> Served {
    let dir = tempfile::tempdir().expect("dir");
    // The server makes its data directory owner-only; a temporary directory is not.
    let mut options = Options::new(dir.path().join("data"));
    options.store = Some(StoreUrl::Memory);
    options.sandbox = SandboxKind::Unisolated;
    options.bootstrap_token = Some(TOKEN.to_string());
    options.listen = "127.0.0.1:0".parse().expect("address");
    options.watch_bookmark_interval = BOOKMARKS;
    let bound = Server::build(options)
        .await
        .expect("server")
        .bind()
        .await
        .expect("bind");
    let address = bound.local_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(async move {
        bound
            .serve(async move {
                let _ = stopped.await;
            })
            .await
            .expect("serves");
    });
    Served {
        base: format!("http://{address}/apis/nodus.dev/v1/projects/default"),
        // A client with a TLS provider set (reqwest is built without a default one).
        http: nodus_llm::http::build_client(&nodus_llm::HttpConfig::default()).expect("client"),
        stop: Some(stop),
        served,
        _dir: dir,
    }
}

impl Served {
    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut request = self
            .http
            .request(method.clone(), format!("{}{path}", self.base))
            .bearer_auth(TOKEN);
        if let Some(body) = body {
            let content_type = if method == reqwest::Method::PATCH {
                "application/merge-patch+json"
            } else {
                "application/json"
            };
            request = request
                .header("content-type", content_type)
                .body(body.to_string());
        }
        let response = request.send().await.expect("answers");
        let status = response.status();
        let text = response.text().await.expect("a body");
        assert!(status.is_success(), "{path}: {status} {text}");
        serde_json::from_str(&text).expect("JSON")
    }

    async fn watch(&self, path: &str) -> Events {
        let response = self
            .http
            .get(format!("{}{path}", self.base))
            .bearer_auth(TOKEN)
            .send()
            .await
            .expect("answers");
        assert_eq!(response.status(), 200, "{path}");
        assert_eq!(
            response
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            Some("application/x-ndjson")
        );
        Events {
            response,
            buffer: Vec::new(),
        }
    }
}

/// The events of a stream, line by line.
struct Events {
    response: reqwest::Response,
    buffer: Vec<u8>,
}

impl Events {
    /// The next event; `None` when the stream has ended.
    async fn next(&mut self) -> Option<Value> {
        tokio::time::timeout(PATIENCE, async {
            loop {
                if let Some(end) = self.buffer.iter().position(|&b| b == b'\n') {
                    let line: Vec<u8> = self.buffer.drain(..=end).collect();
                    return Some(serde_json::from_slice(&line).expect("a JSON line"));
                }
                match self.response.chunk().await {
                    Ok(Some(chunk)) => self.buffer.extend_from_slice(&chunk),
                    _ => return None,
                }
            }
        })
        .await
        .expect("an event or the end in time")
    }

    /// The next event that is not a `BOOKMARK`.
    async fn change(&mut self) -> Value {
        loop {
            let event = self.next().await.expect("the stream goes on");
            if event["type"] != "BOOKMARK" {
                return event;
            }
        }
    }

    /// Reads up to the `BOOKMARK` that ends the initial events; the events before it.
    async fn initial(&mut self) -> Vec<Value> {
        let mut events = Vec::new();
        loop {
            let event = self.next().await.expect("the stream goes on");
            if event["type"] == "BOOKMARK" {
                assert_eq!(
                    event["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"], "true",
                    "{event}"
                );
                return events;
            }
            events.push(event);
        }
    }
}

fn agent(name: &str, team: &str) -> Value {
    json!({"apiVersion": "nodus.dev/v1", "kind": "Agent",
           "metadata": {"name": name, "labels": {"team": team}},
           "spec": {"system": "You are careful.", "model": {"access": "Nodus"}, "perRunMaxCostUSD": "0.50"}})
}

fn summary(event: &Value) -> (String, String) {
    (
        event["type"].as_str().unwrap_or_default().to_string(),
        event["object"]["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

fn pair(kind: &str, name: &str) -> (String, String) {
    (kind.to_string(), name.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_list_watch_streams_the_current_state_then_each_change_in_its_selection() {
    use reqwest::Method;
    let server = serve().await;
    server
        .call(Method::POST, "/agents", Some(agent("a", "x")))
        .await;
    server
        .call(Method::POST, "/agents", Some(agent("b", "y")))
        .await;

    // Without resourceVersion: an ADDED event for each object there is, then changes.
    let mut events = server
        .watch("/agents?watch=true&labelSelector=team%3Dx")
        .await;
    let initial = events.initial().await;
    assert_eq!(
        initial.iter().map(summary).collect::<Vec<_>>(),
        [pair("ADDED", "a")]
    );
    // The object is what GET answers, no more.
    assert_eq!(
        initial[0]["object"],
        server.call(Method::GET, "/agents/a", None).await
    );

    server
        .call(Method::POST, "/agents", Some(agent("c", "x")))
        .await;
    assert_eq!(summary(&events.change().await), pair("ADDED", "c"));
    // Outside the selection: no event (the next one is the change after it).
    server
        .call(Method::POST, "/agents", Some(agent("d", "y")))
        .await;
    let patched = server
        .call(
            Method::PATCH,
            "/agents/a",
            Some(json!({"metadata": {"labels": {"team": "x", "tier": "gold"}}})),
        )
        .await;
    let modified = events.change().await;
    assert_eq!(summary(&modified), pair("MODIFIED", "a"));
    assert_eq!(modified["object"], patched);
    assert_eq!(
        modified["object"]["metadata"]["resourceVersion"], patched["metadata"]["resourceVersion"],
        "each event carries its object's own version"
    );
    // Leaving the selection is a deletion from it.
    server
        .call(
            Method::PATCH,
            "/agents/a",
            Some(json!({"metadata": {"labels": {"team": "y"}}})),
        )
        .await;
    assert_eq!(summary(&events.change().await), pair("DELETED", "a"));
    let c = server.call(Method::GET, "/agents/c", None).await;
    server.call(Method::DELETE, "/agents/c", None).await;
    let deleted = events.change().await;
    assert_eq!(
        deleted,
        json!({"type": "DELETED", "object": {"apiVersion": "nodus.dev/v1", "kind": "Agent",
               "metadata": {"name": "c", "uid": c["metadata"]["uid"],
                            "resourceVersion": c["metadata"]["resourceVersion"]}}})
    );
    // Nothing happens: a BOOKMARK says the stream is alive.
    let bookmark = events.next().await.expect("a bookmark");
    assert_eq!(bookmark["type"], "BOOKMARK", "{bookmark}");
    assert_eq!(bookmark["object"]["kind"], "Agent");

    // A Secret's stream shows what GET shows: its keys, never its values.
    let secret = json!({"apiVersion": "nodus.dev/v1", "kind": "Secret", "metadata": {"name": "key"},
                        "stringData": {"API_KEY": "sk-very-secret-value"}});
    let mut secrets = server.watch("/secrets?watch=true").await;
    assert!(secrets.initial().await.is_empty());
    server.call(Method::POST, "/secrets", Some(secret)).await;
    let added = secrets.change().await;
    assert_eq!(summary(&added), pair("ADDED", "key"));
    assert_eq!(
        added["object"],
        server.call(Method::GET, "/secrets/key", None).await
    );
    assert!(
        !added.to_string().contains("sk-very-secret-value"),
        "{added}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_object_streams_by_its_path_or_from_a_version_by_its_name() {
    use reqwest::Method;
    let server = serve().await;
    let created = server
        .call(Method::POST, "/agents", Some(agent("a", "x")))
        .await;
    let version = created["metadata"]["resourceVersion"]
        .as_str()
        .expect("a version")
        .to_string();
    server
        .call(Method::POST, "/agents", Some(agent("b", "x")))
        .await;

    // By its path, without resourceVersion: the object, then its changes only.
    let mut by_path = server.watch("/agents/a?watch=true").await;
    let initial = by_path.initial().await;
    assert_eq!(
        initial.iter().map(summary).collect::<Vec<_>>(),
        [pair("ADDED", "a")]
    );
    // By name from the version the client has: nothing to tell until it changes.
    let mut from_version = server
        .watch(&format!(
            "/agents?watch=true&fieldSelector=metadata.name%3Da&resourceVersion={version}"
        ))
        .await;
    assert!(from_version.initial().await.is_empty());
    server
        .call(
            Method::PATCH,
            "/agents/b",
            Some(json!({"metadata": {"labels": {"other": "1"}}})),
        )
        .await;
    let patched = server
        .call(
            Method::PATCH,
            "/agents/a",
            Some(json!({"metadata": {"labels": {"tier": "gold"}}})),
        )
        .await;
    for events in [&mut by_path, &mut from_version] {
        let modified = events.change().await;
        assert_eq!(summary(&modified), pair("MODIFIED", "a"));
        assert_eq!(modified["object"], patched);
        // A stream of one object bookmarks its version: a stream may start from it.
        let bookmark = events.next().await.expect("a bookmark");
        assert_eq!(
            bookmark["object"]["metadata"]["resourceVersion"],
            patched["metadata"]["resourceVersion"]
        );
    }
    // From an older version: the object as it is now, at once.
    let mut behind = server
        .watch(&format!(
            "/agents?watch=true&fieldSelector=metadata.name%3Da&resourceVersion={version}"
        ))
        .await;
    let caught_up = behind.initial().await;
    assert_eq!(
        caught_up.iter().map(summary).collect::<Vec<_>>(),
        [pair("MODIFIED", "a")]
    );
    server.call(Method::DELETE, "/agents/a", None).await;
    for events in [&mut by_path, &mut behind] {
        assert_eq!(summary(&events.change().await), pair("DELETED", "a"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_ends_at_its_timeout_and_when_the_server_stops() {
    let mut server = serve().await;
    let mut timed = server.watch("/agents?watch=true&timeoutSeconds=1").await;
    assert!(timed.initial().await.is_empty());
    // Bookmarks until the time is up, then the end.
    while let Some(event) = timed.next().await {
        assert_eq!(event["type"], "BOOKMARK", "{event}");
    }

    let mut open = server.watch("/agentruns?watch=true").await;
    assert!(open.initial().await.is_empty());
    let _ = server.stop.take().expect("running").send(());
    while let Some(event) = open.next().await {
        assert_eq!(event["type"], "BOOKMARK", "{event}");
    }
    tokio::time::timeout(PATIENCE, server.served)
        .await
        .expect("serving ends once the streams have")
        .expect("served");
}
