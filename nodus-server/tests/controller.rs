//! The controllers at work in a served server: runs execute by themselves, groups admit by
//! dependencies and limits, a message wakes a waiting run, a deadline ends one (queued in a
//! group too), credits gate spending, and a restarted server resumes its runs.

use std::time::Duration;

use nodus_core::Usd;
use nodus_core::engine::Engine;
use nodus_core::lifecycle::{FailReason, RunPhase, WaitReason};
use nodus_core::resource::{
    Agent, AgentGroup, AgentGroupSpec, AgentRun, AgentRunSpec, AgentSpec, GroupLimits,
};
use nodus_llm::testing::{Fake, FakeMessage, FakeServer};
use nodus_server::{Options, SandboxKind, Server, StoreUrl};

struct Running {
    engine: Engine,
    state: std::sync::Arc<nodus_server::AppState>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Running {
    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = self.task.await;
    }
}

async fn serve(dir: &std::path::Path, store: StoreUrl) -> Running {
    serve_with(dir, store, nodus_llm::AnthropicConfig::new()).await
}

/// A server whose platform runs call (and are billed by) the fake provider.
async fn serve_priced(dir: &std::path::Path, fake: &FakeServer) -> Running {
    let mut anthropic = nodus_llm::AnthropicConfig::new();
    anthropic.base_url = fake.base_url();
    anthropic.api_key = Some(nodus_core::secret::SecretString::new(
        "sk-ant-controller-test",
    ));
    serve_with(dir, StoreUrl::Memory, anthropic).await
}

/// The offline model is free: the tests of credits and budgets need a priced one. The fake
/// answers each call with text, so a run's first call ends its turn.
async fn priced_fake() -> FakeServer {
    let fake = FakeServer::start().await.expect("fake provider");
    fake.push_all((0..4).map(|_| Fake::Message(FakeMessage::text("paid"))));
    fake
}

async fn serve_with(
    dir: &std::path::Path,
    store: StoreUrl,
    anthropic: nodus_llm::AnthropicConfig,
) -> Running {
    // The server makes its data directory owner-only; a temporary directory is not.
    let mut options = Options::new(dir.join("data"));
    options.anthropic = anthropic;
    options.store = Some(store);
    options.sandbox = SandboxKind::Unisolated;
    options.bootstrap_token = Some("nodus_controller_test_0123456789abcdef".to_string());
    options.listen = "127.0.0.1:0".parse().expect("address");
    let server = Server::build(options).await.expect("server");
    let state = server.state();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        server
            .serve(async move {
                let _ = stopped.await;
            })
            .await
            .expect("serves");
    });
    Running {
        engine: state.engine.clone(),
        state,
        stop: Some(stop),
        task,
    }
}

async fn phase_of(engine: &Engine, name: &str) -> Option<RunPhase> {
    engine
        .get_run("default", name)
        .await
        .ok()
        .and_then(|r| r.status.phase)
}

/// Wait until the run reaches `want` (or fail after a while, saying where it is).
async fn until(engine: &Engine, name: &str, want: impl Fn(RunPhase) -> bool) -> RunPhase {
    for _ in 0..400 {
        if let Some(phase) = phase_of(engine, name).await
            && want(phase)
        {
            return phase;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("run {name} stayed {:?}", phase_of(engine, name).await);
}

/// A server on the in-memory store, in its own directory (dropped last), with the agent
/// `worker` (a 10-cent cap) in the project `default`.
async fn serve_worker() -> (tempfile::TempDir, Running) {
    let dir = tempfile::tempdir().expect("dir");
    let server = serve(dir.path(), StoreUrl::Memory).await;
    server
        .engine
        .apply_agent("default", agent(10))
        .await
        .expect("agent");
    (dir, server)
}

fn agent(cap_cents: u64) -> Agent {
    let mut spec = AgentSpec::new("You are careful.");
    spec.per_run_max_cost_usd = Usd::from_cents(cap_cents);
    Agent::new("worker", spec)
}

fn task(group: &str, key: &str, deps: &[&str], input: &str) -> AgentRun {
    let mut spec = AgentRunSpec::new("worker", input);
    spec.group = Some(group.to_string());
    spec.task_key = Some(key.to_string());
    spec.depends_on = deps.iter().map(|d| d.to_string()).collect();
    let mut run = AgentRun::new("", spec);
    run.metadata.name = None;
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_and_groups_execute_by_themselves() {
    let (_dir, server) = serve_worker().await;
    let engine = &server.engine;
    engine
        .create_run(
            "default",
            AgentRun::new("solo", AgentRunSpec::new("worker", "Run `echo solo`")),
        )
        .await
        .expect("run");
    assert_eq!(
        until(engine, "solo", RunPhase::is_finished).await,
        RunPhase::Succeeded
    );

    let group = AgentGroupSpec {
        agent: "worker".to_string(),
        limits: GroupLimits {
            max_active: 2,
            ..GroupLimits::default()
        },
        max_cost_usd: Some(Usd::from_cents(60)),
        sealed: false,
        evaluation: None,
    };
    engine
        .apply_group("default", AgentGroup::new("g", group.clone()))
        .await
        .expect("group");
    // Long enough for the controller to have settled the new group before its runs come.
    tokio::time::sleep(Duration::from_millis(500)).await;
    for (key, deps) in [("a", vec![]), ("b", vec![]), ("c", vec!["a", "b"])] {
        engine
            .create_run("default", task("g", key, &deps, "Run `echo task`"))
            .await
            .expect("task");
    }
    // An open group runs what it has: nothing but the runs' own creation wakes it.
    assert_eq!(
        until(engine, "g-c", RunPhase::is_finished).await,
        RunPhase::Succeeded
    );
    let mut sealed = group;
    sealed.sealed = true;
    engine
        .apply_group("default", AgentGroup::new("g", sealed))
        .await
        .expect("seal");
    for _ in 0..200 {
        let g = engine
            .get::<AgentGroupSpec>("default", "g")
            .await
            .expect("group");
        if g.status.phase == Some(nodus_core::group::GroupPhase::Succeeded) {
            assert_eq!(g.status.counts.succeeded, 3);
            let c = engine.get_run("default", "g-c").await.expect("c");
            let a = engine.get_run("default", "g-a").await.expect("a");
            assert!(
                c.status.start_time >= a.status.completion_time,
                "c started after a finished"
            );
            server.stop().await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the sealed group did not succeed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_wake_waiting_runs_and_deadlines_end_them() {
    let (_dir, server) = serve_worker().await;
    let engine = &server.engine;
    let mut spec = AgentRunSpec::new("worker", "Run `echo first`");
    spec.keep_alive = true;
    spec.deadline = Some(jiff::Timestamp::now() + jiff::SignedDuration::from_secs(3));
    engine
        .create_run("default", AgentRun::new("chat", spec))
        .await
        .expect("run");
    until(engine, "chat", |p| {
        p == RunPhase::Waiting(WaitReason::AwaitingMessage)
    })
    .await;
    engine
        .send_message("default", "chat", "Now run `echo second`", Some("k1"))
        .await
        .expect("send");
    for _ in 0..200 {
        let run = engine.get_run("default", "chat").await.expect("run");
        let answered = engine
            .answer("default", "chat")
            .await
            .expect("answer")
            .unwrap_or_default();
        if run.status.turns.len() == 2 && answered.lines().any(|l| l == "second") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    // The output line of `echo second`, not the command the answer quotes.
    let answered = engine
        .answer("default", "chat")
        .await
        .expect("answer")
        .unwrap_or_default();
    assert!(answered.lines().any(|l| l == "second"), "{answered}");
    let ended = until(engine, "chat", RunPhase::is_finished).await;
    assert_eq!(ended, RunPhase::Failed(FailReason::DeadlineExceeded));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_queued_in_its_group_ends_at_its_deadline_by_itself() {
    let (_dir, server) = serve_worker().await;
    let engine = &server.engine;
    let group = AgentGroupSpec {
        agent: "worker".to_string(),
        limits: GroupLimits {
            max_active: 1,
            ..GroupLimits::default()
        },
        // Room for one run's cap (10 cents).
        max_cost_usd: Some(Usd::from_cents(10)),
        sealed: false,
        evaluation: None,
    };
    engine
        .apply_group("default", AgentGroup::new("one-slot", group))
        .await
        .expect("group");
    // The group's cap goes to a conversation that waits for messages and never ends: waiting,
    // it holds no slot, but it holds its cap.
    let mut holder = task("one-slot", "holder", &[], "Run `echo first`");
    holder.spec.keep_alive = true;
    engine.create_run("default", holder).await.expect("holder");
    until(engine, "one-slot-holder", |p| {
        p == RunPhase::Waiting(WaitReason::AwaitingMessage)
    })
    .await;
    let mut queued = task("one-slot", "queued", &[], "Run `echo never`");
    queued.spec.deadline = Some(jiff::Timestamp::now() + jiff::SignedDuration::from_secs(2));
    engine.create_run("default", queued).await.expect("queued");
    // Nothing else happens in the group: the controller looks at the run at its deadline.
    let ended = until(engine, "one-slot-queued", RunPhase::is_finished).await;
    assert_eq!(ended, RunPhase::Failed(FailReason::DeadlineExceeded));
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_waiting_under_a_budget_continues_when_the_budget_is_raised() {
    use nodus_core::store::ObjectKey;
    let dir = tempfile::tempdir().expect("dir");
    let fake = priced_fake().await;
    let server = serve_priced(dir.path(), &fake).await;
    let engine = &server.engine;
    let budget = |limit: &str| {
        serde_json::json!({
            "apiVersion": "nodus.dev/v1", "kind": "Budget",
            "metadata": {"name": "cap"}, "spec": {"maxSpendUSD": limit}
        })
    };
    let key = ObjectKey::new("default", nodus_core::resource::Kind::Budget, "cap");
    let written = server
        .state
        .store
        .create(&key, budget("0.00"))
        .await
        .expect("budget");
    engine
        .apply_agent("default", agent(10))
        .await
        .expect("agent");
    engine
        .create_run(
            "default",
            AgentRun::new("r", AgentRunSpec::new("worker", "Run `echo paid`")),
        )
        .await
        .expect("run");
    until(engine, "r", |p| {
        p == RunPhase::Waiting(WaitReason::AwaitingFunds)
    })
    .await;
    // Only the budget changes: no credits are added, no other run writes the account.
    server
        .state
        .store
        .update(&key, written.version, budget("10.00"))
        .await
        .expect("raise");
    assert_eq!(
        until(engine, "r", RunPhase::is_finished).await,
        RunPhase::Succeeded
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_waits_for_credits_and_continues_when_they_are_added() {
    let dir = tempfile::tempdir().expect("dir");
    let fake = priced_fake().await;
    let server = serve_priced(dir.path(), &fake).await;
    let engine = &server.engine;
    server
        .state
        .ledger
        .open("poor", Usd::ZERO)
        .await
        .expect("project");
    engine.apply_agent("poor", agent(10)).await.expect("agent");
    engine
        .create_run(
            "poor",
            AgentRun::new("r", AgentRunSpec::new("worker", "Run `echo paid`")),
        )
        .await
        .expect("run");
    let waiting = RunPhase::Waiting(WaitReason::AwaitingFunds);
    for _ in 0..400 {
        if engine
            .get_run("poor", "r")
            .await
            .ok()
            .and_then(|r| r.status.phase)
            == Some(waiting)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(
        engine.get_run("poor", "r").await.expect("run").status.phase,
        Some(waiting)
    );
    server
        .state
        .ledger
        .add("poor", Usd::from_cents(100))
        .await
        .expect("credits");
    for _ in 0..400 {
        if engine
            .get_run("poor", "r")
            .await
            .ok()
            .and_then(|r| r.status.phase)
            == Some(RunPhase::Succeeded)
        {
            let account = server.state.ledger.account("poor").await.expect("account");
            let run = engine.get_run("poor", "r").await.expect("run");
            assert_eq!(account.spent_usd, run.status.cost.total_usd);
            assert!(account.spent_usd > Usd::ZERO, "the fake's reply was billed");
            assert!(account.reserved.is_empty(), "every reservation settled");
            server.stop().await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the run did not continue after credits were added");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_server_resumes_its_runs() {
    let dir = tempfile::tempdir().expect("dir");
    let db = StoreUrl::Sqlite(dir.path().join("nodus.db"));
    let first = serve(dir.path(), db.clone()).await;
    first
        .engine
        .apply_agent("default", agent(10))
        .await
        .expect("agent");
    let mut spec = AgentRunSpec::new("worker", "Run `echo before`");
    spec.keep_alive = true;
    first
        .engine
        .create_run("default", AgentRun::new("long", spec))
        .await
        .expect("run");
    until(&first.engine, "long", |p| {
        p == RunPhase::Waiting(WaitReason::AwaitingMessage)
    })
    .await;
    first.stop().await;

    let second = serve(dir.path(), db).await;
    second
        .engine
        .send_message("default", "long", "Run `echo after`", None)
        .await
        .expect("send");
    for _ in 0..400 {
        let answer = second
            .engine
            .answer("default", "long")
            .await
            .expect("answer")
            .unwrap_or_default();
        if answer.lines().any(|l| l == "after") {
            let run = second.engine.get_run("default", "long").await.expect("run");
            assert_eq!(run.status.turns.len(), 2);
            second.stop().await;
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the restarted server did not take the message");
}

/// `GET path` over a fresh connection: the status and the JSON body.
async fn http_get(address: std::net::SocketAddr, path: &str) -> (u16, serde_json::Value) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(address)
        .await
        .expect("connects");
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: nodus\r\nAuthorization: Bearer nodus_controller_test_0123456789abcdef\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await.expect("writes");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).await.expect("reads");
    let answer = String::from_utf8_lossy(&answer);
    let (head, body) = answer.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .expect("a status");
    (status, serde_json::from_str(body).expect("a JSON body"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_follows_a_run_to_its_end_and_ends_when_the_server_stops() {
    let dir = tempfile::tempdir().expect("dir");
    // The server makes its data directory owner-only; a temporary directory is not.
    let mut options = Options::new(dir.path().join("data"));
    options.store = Some(StoreUrl::Memory);
    options.sandbox = SandboxKind::Unisolated;
    options.bootstrap_token = Some("nodus_controller_test_0123456789abcdef".to_string());
    options.listen = "127.0.0.1:0".parse().expect("address");
    let server = Server::build(options).await.expect("server");
    let engine = server.state().engine.clone();
    engine
        .apply_agent("default", agent(10))
        .await
        .expect("agent");
    let bound = server.bind().await.expect("binds");
    let address = bound.local_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(async move {
        bound
            .serve(async move {
                let _ = stopped.await;
            })
            .await
            .expect("serves");
    });
    let created = engine
        .create_run(
            "default",
            AgentRun::new(
                "followed",
                AgentRunSpec::new("worker", "Run `echo followed`"),
            ),
        )
        .await
        .expect("run");
    let path = "/apis/nodus.dev/v1/projects/default/agentruns/followed";
    // Each answer is a new version of the run, until it has finished: no answer is a
    // timeout, and nothing is read in between.
    let mut version = created.metadata.resource_version.expect("a version");
    let mut answers = 0;
    let phase = loop {
        let (status, run) = http_get(
            address,
            &format!("{path}?watch=true&resourceVersion={version}&timeoutSeconds=20"),
        )
        .await;
        assert_eq!(status, 200, "{run}");
        let next = run["metadata"]["resourceVersion"]
            .as_str()
            .expect("a version")
            .to_string();
        assert_ne!(next, version, "a timeout, not a change: {run}");
        version = next;
        answers += 1;
        let phase = run["status"]["phase"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        if ["Succeeded", "Failed", "Cancelled"].contains(&phase.as_str()) {
            break phase;
        }
        assert!(answers < 200, "the run never finished: {run}");
    };
    assert_eq!(phase, "Succeeded");

    // Stopping the server answers the long polls it holds at once, and serving ends.
    let waiting = tokio::spawn(async move {
        let started = std::time::Instant::now();
        let answer = http_get(
            address,
            &format!("{path}?watch=true&resourceVersion={version}&timeoutSeconds=300"),
        )
        .await;
        (answer, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiting.is_finished(), "nothing changed: it waits");
    let _ = stop.send(());
    let ((status, run), took) = waiting.await.expect("answered");
    assert_eq!(status, 200, "{run}");
    assert_eq!(run["status"]["phase"], "Succeeded");
    assert!(took < Duration::from_secs(5), "{took:?}");
    tokio::time::timeout(Duration::from_secs(5), serving)
        .await
        .expect("serving ends")
        .expect("served");
}
