//! Post-run actions through a real `nodus server` and the CLI, with the offline model: the
//! `agents.webhook` action delivers the run record to a test receiver once across a SIGKILL
//! of the server in the middle of the delivery (it is carried out again with the same
//! `Idempotency-Key`, and a delivery whose outcome was journaled is never repeated, not even
//! by another restart: the receiver sees one distinct key); a header taken from a Secret is
//! sent with the value the Secret had when the run was created (changed and deleted before
//! the delivery) and shows nowhere else, and a credential-like header in plain text is
//! refused at creation; a URL naming an internal address is refused at creation (the
//! server lists only 127.0.0.1 in --webhook-allow); what it saves is among the run's
//! results; a receiver that refuses
//! fails the run after its other results were saved; the rules of which action a run may or
//! must choose are checked at creation, row by row (the row of an agent declaring several
//! actions and not agents.noop on a server embedded in this test, which installs one action
//! more, `test.stamp`, through `Options::actions`); `nodus get postrunactions` lists what is
//! installed.

#[path = "support/server.rs"]
mod server;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use nodus_core::postrun::{ActionContext, ActionResults, PostRunAction};
use nodus_core::validate::Invalid;
use server::{Backend, ServerProcess};

/// One request the receiver got: its path, Idempotency-Key, body and headers (names in
/// lower case).
#[derive(Debug, Clone)]
struct Received {
    path: String,
    key: String,
    body: String,
    headers: Vec<(String, String)>,
}

impl Received {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A webhook receiver: answers 200 to `/hook` (holding the first request unanswered when
/// `hold_first`), 400 to `/reject`.
#[derive(Clone, Default)]
struct Receiver {
    received: Arc<Mutex<Vec<Received>>>,
    hold_first: Arc<Mutex<bool>>,
}

impl Receiver {
    fn start(hold_first: bool) -> (Receiver, u16) {
        let listener = TcpListener::bind("127.0.0.1:0").expect("a port");
        let port = listener.local_addr().expect("address").port();
        let receiver = Receiver {
            received: Arc::default(),
            hold_first: Arc::new(Mutex::new(hold_first)),
        };
        let shared = receiver.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let shared = shared.clone();
                std::thread::spawn(move || shared.serve(stream));
            }
        });
        (receiver, port)
    }

    fn serve(&self, stream: TcpStream) {
        let mut reader = BufReader::new(stream.try_clone().expect("clone"));
        let mut request_line = String::new();
        if reader.read_line(&mut request_line).is_err() {
            return;
        }
        let path = request_line
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_string();
        let (mut length, mut key) = (0usize, String::new());
        let mut headers = Vec::new();
        loop {
            let mut line = String::new();
            if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':') {
                headers.push((name.trim().to_ascii_lowercase(), value.trim().to_string()));
            }
            let lower = line.to_ascii_lowercase();
            if let Some(value) = lower.strip_prefix("content-length:") {
                length = value.trim().parse().unwrap_or(0);
            }
            if lower.starts_with("idempotency-key:") {
                key = line["idempotency-key:".len()..].trim().to_string();
            }
        }
        let mut body = vec![0; length];
        if reader.read_exact(&mut body).is_err() {
            return;
        }
        self.received.lock().expect("lock").push(Received {
            path: path.clone(),
            key,
            body: String::from_utf8_lossy(&body).into_owned(),
            headers,
        });
        let hold = std::mem::take(&mut *self.hold_first.lock().expect("lock"));
        if hold {
            // Never answered: the server is killed meanwhile.
            std::thread::sleep(Duration::from_secs(600));
            return;
        }
        let status = if path == "/reject" {
            "400 Bad Request"
        } else {
            "200 OK"
        };
        let mut stream = stream;
        let _ = stream.write_all(
            format!("HTTP/1.1 {status}\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
                .as_bytes(),
        );
    }

    fn at(&self, path: &str) -> Vec<Received> {
        self.received
            .lock()
            .expect("lock")
            .iter()
            .filter(|r| r.path == path)
            .cloned()
            .collect()
    }

    fn wait_for(&self, path: &str, count: usize) {
        let deadline = Instant::now() + Duration::from_secs(120);
        while self.at(path).len() < count {
            assert!(
                Instant::now() < deadline,
                "{count} requests to {path} expected"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

const AGENTS: &str = "apiVersion: nodus.dev/v1\nkind: Agent\nmetadata:\n  name: hooked\nspec:\n  system: You are a careful assistant.\n  postRunActions: [agents.noop, agents.webhook]\n---\napiVersion: nodus.dev/v1\nkind: Agent\nmetadata:\n  name: plain\nspec:\n  system: You are a careful assistant.\n---\napiVersion: nodus.dev/v1\nkind: Agent\nmetadata:\n  name: only-webhook\nspec:\n  system: You are a careful assistant.\n  postRunActions: [agents.webhook]\n";

/// A row of the rules: the run, its agent, its spec.postRunAction, the field a refusal names
/// (`None`: accepted), the action carried out.
type Row<'a> = (
    &'a str,
    &'a str,
    Option<String>,
    Option<&'a str>,
    Option<&'a str>,
);

fn run_document(name: &str, agent: &str, action: Option<&str>) -> String {
    let mut document = format!(
        "apiVersion: nodus.dev/v1\nkind: AgentRun\nmetadata:\n  name: {name}\nspec:\n  agent: {agent}\n  input: Run `echo payload-$((2+3))` and tell me.\n"
    );
    if let Some(action) = action {
        document.push_str(&format!("  postRunAction: {action}\n"));
    }
    document
}

fn apply(server: &ServerProcess, document: &str) -> std::process::Output {
    server.cli_in(&["apply", "-f", "-"], Some(document))
}

/// A server whose webhooks may reach the receiver on 127.0.0.1 (and no other internal
/// address).
fn start(store: &str, dir: &std::path::Path) -> ServerProcess {
    ServerProcess::start_with(store, dir, "process", &["--webhook-allow", "127.0.0.1"])
}

/// The value of the Secret a webhook header reads when its run is created, and what it is
/// changed to before the delivery.
const HOOK_TOKEN: &str = "hook-token-0c4e9d21b7";
const HOOK_CHANGED: &str = "hook-changed-5a83f0e6";

fn actions(backend: Backend) {
    let (receiver, port) = Receiver::start(true);
    let hook =
        format!("{{kind: agents.webhook, config: {{url: \"http://127.0.0.1:{port}/hook\"}}}}");
    let dir = tempfile::tempdir().expect("tempdir");
    let store = backend.store_url(dir.path());
    let mut server = start(&store, dir.path());
    let output = apply(&server, AGENTS);
    assert!(output.status.success(), "{output:?}");

    let listed = server.ok(&["get", "postrunactions"]);
    assert!(listed.contains("agents.noop"), "{listed}");
    assert!(listed.contains("agents.webhook"), "{listed}");

    // The webhook delivers once across a SIGKILL in the middle of its delivery.
    let output = apply(&server, &run_document("delivered", "hooked", Some(&hook)));
    assert!(output.status.success(), "{output:?}");
    receiver.wait_for("/hook", 1);
    server.kill();
    server = start(&store, dir.path());
    server.wait_for("delivered", "Succeeded");
    let hooks = receiver.at("/hook");
    assert_eq!(
        hooks.len(),
        2,
        "the interrupted delivery was made again: {hooks:?}"
    );
    assert_eq!(hooks[0].key, hooks[1].key, "with the same Idempotency-Key");
    assert!(!hooks[0].key.is_empty());
    // Delivery is at least once: the receiver counts one distinct Idempotency-Key, so one
    // that keeps the keys it has seen takes the run record once.
    let distinct: std::collections::BTreeSet<&str> = hooks.iter().map(|h| h.key.as_str()).collect();
    assert_eq!(distinct.len(), 1, "one delivery, by its key: {hooks:?}");
    let record: serde_json::Value = serde_json::from_str(&hooks[1].body).expect("JSON");
    assert_eq!(record["name"], "delivered");
    assert!(
        record["answer"]
            .as_str()
            .is_some_and(|a| a.contains("payload-5")),
        "{record}"
    );
    let results = server.ok(&["agentrun", "results", "delivered"]);
    assert!(results.contains("webhookDelivery"), "{results}");
    let saved = server.ok(&[
        "agentrun",
        "results",
        "delivered",
        "webhookDelivery",
        "-o",
        "-",
    ]);
    let saved: serde_json::Value = serde_json::from_str(&saved).expect("JSON");
    assert_eq!(saved["status"], 200, "{saved}");
    // A delivered one is not repeated by another restart.
    server.kill();
    server = start(&store, dir.path());
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(receiver.at("/hook").len(), 2);

    // A receiver that refuses fails the run, after its results were saved.
    let reject =
        format!("{{kind: agents.webhook, config: {{url: \"http://127.0.0.1:{port}/reject\"}}}}");
    let output = apply(&server, &run_document("rejected", "hooked", Some(&reject)));
    assert!(output.status.success(), "{output:?}");
    server.wait_for("rejected", "Failed");
    let run: serde_json::Value =
        serde_json::from_str(&server.ok(&["get", "agentrun/rejected", "-o", "json"]))
            .expect("JSON");
    assert_eq!(run["status"]["reason"], "PostRunActionFailed", "{run}");
    let results = server.ok(&["agentrun", "results", "rejected"]);
    for name in ["outputWorkdir", "artifacts", "runRecord", "error"] {
        assert!(results.contains(name), "{results}");
    }
    let error = server.ok(&["agentrun", "results", "rejected", "error", "-o", "-"]);
    let error: serde_json::Value = serde_json::from_str(&error).expect("JSON");
    assert_eq!(error["type"], "PostRunActionFailed", "{error}");
    assert!(
        error["message"].as_str().is_some_and(|m| m.contains("400")),
        "{error}"
    );

    // A header from a Secret: its value is pinned when the run is created (the Secret is
    // changed, then deleted, before the delivery), sent, and shown nowhere else.
    let output = apply(
        &server,
        &format!(
            "apiVersion: nodus.dev/v1\nkind: Secret\nmetadata:\n  name: hook-auth\nstringData:\n  token: \"Bearer {HOOK_TOKEN}\"\n"
        ),
    );
    assert!(output.status.success(), "{output:?}");
    let authed = format!(
        "{{kind: agents.webhook, config: {{url: \"http://127.0.0.1:{port}/authed\", headers: {{Authorization: {{secretKeyRef: {{name: hook-auth, key: token}}}}, X-Trace: plain-trace}}}}}}"
    );
    let document = format!(
        "{}  keepAlive: true\n",
        run_document("authed", "hooked", Some(&authed))
    );
    let output = apply(&server, &document);
    assert!(output.status.success(), "{output:?}");
    server.wait_for("authed", "Waiting");
    let output = apply(
        &server,
        &format!(
            "apiVersion: nodus.dev/v1\nkind: Secret\nmetadata:\n  name: hook-auth\nstringData:\n  token: \"Bearer {HOOK_CHANGED}\"\n"
        ),
    );
    assert!(output.status.success(), "{output:?}");
    server.ok(&["delete", "secret/hook-auth"]);
    server.ok(&["agentrun", "close", "authed"]);
    server.wait_for("authed", "Succeeded");
    let hooks = receiver.at("/authed");
    assert_eq!(hooks.len(), 1, "{hooks:?}");
    assert_eq!(
        hooks[0].header("authorization"),
        Some(format!("Bearer {HOOK_TOKEN}").as_str()),
        "the value pinned at creation"
    );
    assert_eq!(hooks[0].header("x-trace"), Some("plain-trace"));
    let (status, steps) = server.http_with(
        "GET",
        "/apis/nodus.dev/v1/projects/default/agentruns/authed/steps?payload=true",
        &[],
        None,
    );
    assert_eq!(status, 200, "{steps}");
    let seen = [
        (
            "the run",
            server.ok(&["get", "agentrun/authed", "-o", "json"]),
        ),
        ("its steps", server.ok(&["agentrun", "steps", "authed"])),
        ("its steps with payloads", steps.to_string()),
        ("its logs", server.ok(&["agentrun", "logs", "authed"])),
        (
            "its run record",
            server.ok(&["agentrun", "results", "authed", "runRecord", "-o", "-"]),
        ),
        (
            "the server's log",
            std::fs::read_to_string(&server.log).expect("log"),
        ),
    ];
    for (place, text) in &seen {
        for value in [HOOK_TOKEN, HOOK_CHANGED] {
            assert!(!text.contains(value), "{value} shows in {place}:\n{text}");
        }
    }
    // A credential in plain text, a Secret that does not exist and an internal address are
    // refused at creation, naming the field (and not echoing the credential).
    let refusals = [
        (
            "plain-credential",
            format!(
                "{{kind: agents.webhook, config: {{url: \"http://127.0.0.1:{port}/hook\", headers: {{Authorization: \"Bearer plain-credential-4411\"}}}}}}"
            ),
            "spec.postRunAction.config.headers.Authorization",
            "secretKeyRef",
        ),
        (
            "missing-secret",
            format!(
                "{{kind: agents.webhook, config: {{url: \"http://127.0.0.1:{port}/hook\", headers: {{X-Api-Key: {{secretKeyRef: {{name: nowhere, key: token}}}}}}}}}}"
            ),
            "spec.postRunAction.config.headers.X-Api-Key.secretKeyRef",
            "must name a Secret",
        ),
        (
            "metadata-address",
            "{kind: agents.webhook, config: {url: \"http://169.254.169.254/latest/meta-data/\"}}"
                .to_string(),
            "spec.postRunAction.config.url",
            "--webhook-allow",
        ),
        (
            "other-loopback",
            "{kind: agents.webhook, config: {url: \"http://127.0.0.2:9/hook\"}}".to_string(),
            "spec.postRunAction.config.url",
            "loopback",
        ),
    ];
    for (name, action, field, rule) in refusals {
        let output = apply(&server, &run_document(name, "hooked", Some(&action)));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{name} was accepted");
        assert!(
            stderr.contains(field),
            "{name}: {field} not named: {stderr}"
        );
        assert!(stderr.contains(rule), "{name}: {stderr}");
        assert!(!stderr.contains("plain-credential-4411"), "{stderr}");
        assert!(
            !server
                .cli(&["get", &format!("agentrun/{name}")])
                .status
                .success()
        );
    }

    // The rules, row by row: (run, agent, its spec.postRunAction, the field a refusal
    // names or None when accepted, the action carried out).
    let inline_agent = "{system: You are a careful assistant.}";
    let rows: Vec<Row<'_>> = vec![
        // Declared includes agents.noop.
        ("noop-omitted", "hooked", None, None, None),
        (
            "noop-declared",
            "hooked",
            Some(hook.clone()),
            None,
            Some("agents.webhook"),
        ),
        // Exactly one kind: omitted runs it with an empty config (webhook's needs a url).
        (
            "one-omitted",
            "only-webhook",
            None,
            Some("spec.postRunAction.config.url"),
            None,
        ),
        (
            "one-other",
            "only-webhook",
            Some("{kind: agents.noop}".to_string()),
            Some("spec.postRunAction.kind"),
            None,
        ),
        (
            "one-named",
            "only-webhook",
            Some(hook.clone()),
            None,
            Some("agents.webhook"),
        ),
        // An agent that declares none allows only agents.noop.
        (
            "none-webhook",
            "plain",
            Some(hook.clone()),
            Some("spec.postRunAction.kind"),
            None,
        ),
        (
            "none-noop",
            "plain",
            Some("{kind: agents.noop}".to_string()),
            None,
            None,
        ),
        // An inline agent: agents.noop, or any installed kind.
        ("inline-omitted", inline_agent, None, None, None),
        (
            "inline-named",
            inline_agent,
            Some(hook.clone()),
            None,
            Some("agents.webhook"),
        ),
        (
            "inline-unknown",
            inline_agent,
            Some("{kind: agents.nothing}".to_string()),
            Some("spec.postRunAction.kind"),
            None,
        ),
    ];
    for (name, agent, action, refused, carried) in rows {
        let output = apply(&server, &run_document(name, agent, action.as_deref()));
        let stderr = String::from_utf8_lossy(&output.stderr);
        match refused {
            Some(field) => {
                assert!(!output.status.success(), "{name} was accepted");
                assert!(
                    stderr.contains(field),
                    "{name}: {field} not named: {stderr}"
                );
                assert!(
                    !server
                        .cli(&["get", &format!("agentrun/{name}")])
                        .status
                        .success()
                );
            }
            None => {
                assert!(output.status.success(), "{name}: {stderr}");
                let run: serde_json::Value = serde_json::from_str(&server.ok(&[
                    "get",
                    &format!("agentrun/{name}"),
                    "-o",
                    "json",
                ]))
                .expect("JSON");
                assert_eq!(
                    run["status"]["snapshot"]["postRunAction"]["kind"].as_str(),
                    carried,
                    "{name}: {run}"
                );
            }
        }
    }
    // An agent declaring an action that is not installed is refused when written.
    let output = apply(
        &server,
        "apiVersion: nodus.dev/v1\nkind: Agent\nmetadata:\n  name: wishful\nspec:\n  system: x\n  postRunActions: [agents.nothing]\n",
    );
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("spec.postRunActions[0]"),
        "{output:?}"
    );
}

#[test]
fn actions_on_sqlite() {
    actions(Backend::Sqlite);
}

#[test]
fn actions_on_postgres() {
    actions(Backend::Postgres);
}

/// A server with an HTTP proxy in its environment sends a webhook straight to the address it
/// checked, not through the proxy: the proxy would resolve the host again itself, and could
/// reach an address the check refuses (a name that resolves elsewhere the second time).
#[test]
fn a_webhook_goes_to_the_checked_address_not_through_a_proxy() {
    let (receiver, port) = Receiver::start(false);
    // A proxy is sent the absolute URL as its request's path; this one answers 200 to it.
    let (proxy, proxy_port) = Receiver::start(false);
    let proxy_url = format!("http://127.0.0.1:{proxy_port}");
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Backend::Sqlite.store_url(dir.path());
    let server = ServerProcess::start_in_env(
        &store,
        dir.path(),
        "process",
        &["--webhook-allow", "127.0.0.1"],
        &[
            ("HTTP_PROXY", &proxy_url),
            ("http_proxy", &proxy_url),
            ("HTTPS_PROXY", &proxy_url),
            ("ALL_PROXY", &proxy_url),
            ("NO_PROXY", ""),
            ("no_proxy", ""),
        ],
    );
    let output = apply(&server, AGENTS);
    assert!(output.status.success(), "{output:?}");
    let hook =
        format!("{{kind: agents.webhook, config: {{url: \"http://127.0.0.1:{port}/hook\"}}}}");
    let output = apply(&server, &run_document("direct", "hooked", Some(&hook)));
    assert!(output.status.success(), "{output:?}");
    server.wait_for("direct", "Succeeded");
    assert_eq!(receiver.at("/hook").len(), 1, "delivered to the receiver");
    let proxied = proxy.received.lock().expect("lock").len();
    assert_eq!(proxied, 0, "nothing went through the proxy");
}

/// `test.stamp`: saves the run's `project/name` as its result `stamp`.
struct Stamp;

#[async_trait]
impl PostRunAction for Stamp {
    fn kind(&self) -> &'static str {
        "test.stamp"
    }
    fn title(&self) -> &'static str {
        "Stamp"
    }
    fn description(&self) -> &'static str {
        "Saves the run's name among its results."
    }
    fn config_schema(&self) -> serde_json::Value {
        serde_json::json!({"type": "object"})
    }
    fn check_config(&self, _: &serde_json::Value) -> Result<(), Invalid> {
        Ok(())
    }
    async fn run(&self, context: &ActionContext) -> Result<ActionResults, String> {
        Ok(ActionResults::from([(
            "stamp".to_string(),
            context.run.clone().into_bytes(),
        )]))
    }
}

/// A server built in this process with [`Stamp`] installed besides the built-in actions,
/// serving on a free port until dropped.
struct Embedded {
    url: String,
    data_dir: std::path::PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Embedded {
    fn start(store: &str, data_dir: &std::path::Path) -> Embedded {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(data_dir, std::fs::Permissions::from_mode(0o700))
            .expect("an owner-only data directory");
        let mut options = nodus_server::Options::new(data_dir.to_path_buf());
        options.store = Some(store.parse().expect("a store URL"));
        options.bootstrap_token = Some(server::TOKEN.to_string());
        options.listen = "127.0.0.1:0".parse().expect("an address");
        options.actions = nodus_core::postrun::Registry::default().with(Arc::new(Stamp));
        let (address_tx, address_rx) = std::sync::mpsc::channel();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            runtime.block_on(async move {
                let server = nodus_server::Server::build(options)
                    .await
                    .expect("the server builds");
                let bound = server.bind().await.expect("it binds");
                address_tx.send(bound.local_addr()).expect("the test waits");
                bound
                    .serve(async {
                        let _ = stopped.await;
                    })
                    .await
                    .expect("it serves");
            });
        });
        let address = address_rx.recv().expect("the server starts");
        Embedded {
            url: format!("http://{address}"),
            data_dir: data_dir.to_path_buf(),
            stop: Some(stop),
            thread: Some(thread),
        }
    }

    fn cli(&self, args: &[&str], stdin: Option<&str>) -> std::process::Output {
        server::cli_against(&self.url, &self.data_dir, args, stdin)
    }
}

impl Drop for Embedded {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The row of an agent that declares several actions and not agents.noop: a run that names
/// none is refused (it must choose), one that names a declared kind carries it out (what it
/// saves is among the results), one that names another installed kind is refused; nothing is
/// written for a refused run.
fn several_actions(backend: Backend) {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Embedded::start(&backend.store_url(dir.path()), dir.path());
    let ok = |args: &[&str], stdin: Option<&str>| {
        let output = server.cli(args, stdin);
        assert!(output.status.success(), "nodus {args:?}: {output:?}");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    let installed = ok(&["get", "postrunactions"], None);
    for kind in ["agents.noop", "agents.webhook", "test.stamp"] {
        assert!(installed.contains(kind), "{installed}");
    }
    ok(
        &["apply", "-f", "-"],
        Some(
            "apiVersion: nodus.dev/v1\nkind: Agent\nmetadata:\n  name: pair\nspec:\n  system: You are a careful assistant.\n  perRunMaxCostUSD: \"0.50\"\n  postRunActions: [agents.webhook, test.stamp]\n",
        ),
    );
    let rows = [
        ("must-choose", None, Some("spec.postRunAction")),
        ("chose-stamp", Some("{kind: test.stamp}"), None),
        (
            "chose-undeclared",
            Some("{kind: agents.noop}"),
            Some("spec.postRunAction.kind"),
        ),
    ];
    for (name, action, refused) in rows {
        let output = server.cli(
            &["apply", "-f", "-"],
            Some(&run_document(name, "pair", action)),
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        match refused {
            Some(field) => {
                assert!(!output.status.success(), "{name} was accepted");
                assert!(
                    stderr.contains(field),
                    "{name}: {field} not named: {stderr}"
                );
                if action.is_none() {
                    assert!(stderr.contains("must choose"), "{name}: {stderr}");
                }
                let missing = server.cli(&["get", &format!("agentrun/{name}")], None);
                assert!(!missing.status.success(), "{name} was written");
            }
            None => assert!(output.status.success(), "{name}: {stderr}"),
        }
    }
    ok(
        &[
            "wait",
            "agentrun/chose-stamp",
            "--for=jsonpath={.status.phase}=Succeeded",
            "--timeout=2m",
        ],
        None,
    );
    let run: serde_json::Value =
        serde_json::from_str(&ok(&["get", "agentrun/chose-stamp", "-o", "json"], None))
            .expect("JSON");
    assert_eq!(
        run["status"]["snapshot"]["postRunAction"]["kind"], "test.stamp",
        "{run}"
    );
    let stamp = ok(
        &["agentrun", "results", "chose-stamp", "stamp", "-o", "-"],
        None,
    );
    assert_eq!(stamp, "default/chose-stamp");
}

#[test]
fn several_actions_without_noop_on_sqlite() {
    several_actions(Backend::Sqlite);
}

#[test]
fn several_actions_without_noop_on_postgres() {
    several_actions(Backend::Postgres);
}
