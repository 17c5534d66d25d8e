//! Ending and steering runs: a cancel, a delete, a deadline and a group cancel stop a running
//! command at once (a served server on real bubblewrap); over the engine, a message key
//! reused for another payload is refused, a keepAlive conversation is closed after its
//! current turn, and a group run that can never start says why; the same through the real
//! `nodus` CLI against a `nodus server` process.

#[path = "support/server.rs"]
mod server;
mod support;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nodus_core::Usd;
use nodus_core::engine::Driven;
use nodus_core::engine::Engine;
use nodus_core::journal::{StepKind, StepState};
use nodus_core::lifecycle::{CancelReason, FailReason, PendingReason, RunPhase};
use nodus_core::resource::{AgentGroup, AgentGroupSpec, AgentRun, AgentRunSpec, GroupLimits};
use nodus_core::store::Delivery;
use nodus_core::testing::Drive;
use nodus_llm::Reply;
use nodus_server::{Options, SandboxKind, Server, StoreUrl};
use support::{PROJECT, World, agent, helper_run, run, waiting_chat};

fn text(s: &str) -> Reply {
    Reply::Text(s.to_string())
}

#[tokio::test]
async fn a_message_key_reused_for_another_payload_is_refused() {
    let world = World::new(vec![text("first"), text("second")]);
    let engine = world.engine();
    waiting_chat(&engine).await;
    let first = engine
        .send_message(PROJECT, "chat", "Now the staging logs", Some("staging-1"))
        .await
        .expect("send");
    assert_eq!(first, Delivery::Delivered(1));
    let refused = engine
        .send_message(
            PROJECT,
            "chat",
            "Now the production logs",
            Some("staging-1"),
        )
        .await
        .expect_err("another payload under the same key");
    assert_eq!(refused.reason(), "Invalid");
    let message = refused.to_string();
    assert!(
        message.contains("messageKey") && message.contains("staging-1"),
        "the refusal names the field and the key: {message}"
    );
    // The same message again is still a repeat, delivered once.
    let again = engine
        .send_message(PROJECT, "chat", "Now the staging logs", Some("staging-1"))
        .await
        .expect("repeat");
    assert_eq!(again, Delivery::Duplicate(1));
    let journal_uid = engine
        .get_run(PROJECT, "chat")
        .await
        .expect("run")
        .metadata
        .uid
        .expect("uid");
    let inbox = engine.store().inbox(&journal_uid).await.expect("inbox");
    assert_eq!(inbox.len(), 1, "nothing written: {inbox:?}");

    // A finished run refuses another payload under a delivered key the same way.
    let runner = world.runner(&engine);
    engine.cancel_run(PROJECT, "chat").await.expect("cancel");
    runner.settled(PROJECT, "chat").await.expect("cancelled");
    runner.shutdown().await;
    let refused = engine
        .send_message(
            PROJECT,
            "chat",
            "Now the production logs",
            Some("staging-1"),
        )
        .await
        .expect_err("finished, another payload");
    assert_eq!(refused.reason(), "Invalid", "{refused}");
    let repeat = engine
        .send_message(PROJECT, "chat", "Now the staging logs", Some("staging-1"))
        .await
        .expect("repeat after the end");
    assert_eq!(repeat, Delivery::Duplicate(1));
    assert!(matches!(
        engine
            .get_run(PROJECT, "chat")
            .await
            .expect("run")
            .status
            .phase,
        Some(RunPhase::Cancelled(_))
    ));
}

#[tokio::test]
async fn a_group_run_whose_cap_can_never_fit_says_what_to_change() {
    let world = World::new(vec![text("done")]);
    let engine = world.engine();
    engine
        .apply_agent(
            PROJECT,
            agent("worker", |s| s.per_run_max_cost_usd = Usd::from_cents(10)),
        )
        .await
        .expect("agent");
    let mut group = AgentGroupSpec {
        agent: "worker".to_string(),
        limits: GroupLimits::default(),
        max_cost_usd: Some(Usd::from_cents(5)),
        sealed: false,
        evaluation: None,
    };
    engine
        .apply_group(PROJECT, AgentGroup::new("g", group.clone()))
        .await
        .expect("group");
    engine
        .create_run(
            PROJECT,
            run("g-a", "worker", "go", |s| {
                s.group = Some("g".to_string());
                s.task_key = Some("a".to_string());
            }),
        )
        .await
        .expect("run");
    // What the runner does when a run of the group is created.
    engine
        .reconcile_group(PROJECT, "g")
        .await
        .expect("reconcile");
    let waiting = engine.get_run(PROJECT, "g-a").await.expect("run");
    assert_eq!(
        waiting.status.phase,
        Some(RunPhase::Pending(PendingReason::GroupWait))
    );
    let message = waiting.status.message.unwrap_or_default();
    assert!(
        message.contains("raise the group's spec.maxCostUSD ($0.05)")
            && message.contains("lower the agent's perRunMaxCostUSD ($0.10"),
        "the run says what to change: {message:?}"
    );
    // A reconcile that changes nothing writes nothing.
    let version = waiting.metadata.resource_version.clone();
    engine.reconcile_group(PROJECT, "g").await.expect("again");
    assert_eq!(
        engine
            .get_run(PROJECT, "g-a")
            .await
            .expect("run")
            .metadata
            .resource_version,
        version
    );

    // Raised, the run starts and the message goes.
    group.max_cost_usd = Some(Usd::from_cents(10));
    engine
        .apply_group(PROJECT, AgentGroup::new("g", group))
        .await
        .expect("raise");
    let started = engine.get_run(PROJECT, "g-a").await.expect("run");
    assert_eq!(started.status.phase, Some(RunPhase::Running));
    assert_eq!(started.status.message, None);
    assert_eq!(
        engine.drive(PROJECT, "g-a").await.expect("drive"),
        Driven::Finished(RunPhase::Succeeded)
    );
    let done = engine.get_run(PROJECT, "g-a").await.expect("run");
    assert_eq!(done.status.message, None);
}

#[tokio::test]
async fn a_closed_keep_alive_conversation_succeeds_after_its_turn() {
    let world = World::new(vec![text("first"), text("second")]);
    let engine = world.engine();
    waiting_chat(&engine).await;
    // A message that came before the close is still answered; then the run succeeds.
    engine
        .send_message(PROJECT, "chat", "And the staging logs", None)
        .await
        .expect("send");
    let closing = engine.close_run(PROJECT, "chat").await.expect("close");
    assert!(closing.status.close_requested);
    assert_eq!(
        world.sandbox.live().len(),
        1,
        "closing only records: the runner carries it out"
    );
    let runner = world.runner(&engine);
    let closed = runner.settled(PROJECT, "chat").await.expect("closed");
    runner.shutdown().await;
    assert_eq!(closed.status.phase, Some(RunPhase::Succeeded));
    assert_eq!(
        closed.status.answer.map(|a| a.preview).as_deref(),
        Some("second"),
        "the answer is kept"
    );
    assert_eq!(
        engine
            .answer(PROJECT, "chat")
            .await
            .expect("answer")
            .as_deref(),
        Some("second")
    );
    assert!(world.sandbox.live().is_empty(), "the sandbox is deleted");
    let refused = engine
        .close_run(PROJECT, "chat")
        .await
        .expect_err("finished");
    assert_eq!(refused.reason(), "AgentRunFinished");
    let refused = engine
        .send_message(PROJECT, "chat", "anyone there?", None)
        .await
        .expect_err("finished");
    assert_eq!(refused.reason(), "AgentRunFinished");
}

#[tokio::test]
async fn closing_a_waiting_conversation_ends_it_at_once() {
    let world = World::new(vec![text("only")]);
    let engine = world.engine();
    waiting_chat(&engine).await;
    let calls = world.model.calls();
    let runner = world.runner(&engine);
    engine.close_run(PROJECT, "chat").await.expect("close");
    let closed = runner.settled(PROJECT, "chat").await.expect("closed");
    runner.shutdown().await;
    assert_eq!(closed.status.phase, Some(RunPhase::Succeeded));
    assert_eq!(world.model.calls(), calls, "no model call after the close");
    assert!(world.sandbox.live().is_empty(), "the sandbox is deleted");
}

/// A server served in this process on the in-memory store and real bubblewrap sandboxes,
/// with the offline model (it runs the commands a prompt quotes in backticks) and the agent
/// `sleeper`.
struct Served {
    dir: tempfile::TempDir,
    engine: Engine,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Served {
    async fn start() -> Served {
        Served::start_on(SandboxKind::Process).await
    }

    async fn start_on(sandbox: SandboxKind) -> Served {
        let dir = tempfile::tempdir().expect("dir");
        // The server makes its data directory owner-only; a temporary directory is not.
        let mut options = Options::new(dir.path().join("data"));
        options.store = Some(StoreUrl::Memory);
        options.sandbox = sandbox;
        if sandbox == SandboxKind::Docker {
            options.default_image = Some(std::env::var("NODUS_TEST_DOCKER_IMAGE").unwrap_or_else(|_| {
                panic!("NODUS_TEST_DOCKER_IMAGE is not set: run the tests with ./scripts/test, which builds the test image")
            }));
        }
        options.bootstrap_token = Some("nodus_run_control_test_token_0123456789".to_string());
        options.listen = "127.0.0.1:0".parse().expect("address");
        let server = Server::build(options).await.expect("server");
        let engine = server.state().engine.clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            server
                .serve(async move {
                    let _ = stopped.await;
                })
                .await
                .expect("serves");
        });
        engine
            .apply_agent(PROJECT, agent("sleeper", |_| {}))
            .await
            .expect("agent");
        Served {
            dir,
            engine,
            stop: Some(stop),
            task,
        }
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = self.task.await;
    }

    /// The host directory of a run's sandbox.
    /// Where a process sandbox's working directory is (for a root server, outside the data
    /// directory).
    fn sandbox_dir(&self, uid: &str) -> PathBuf {
        nodus_server::default_sandbox_dir(self.dir.path())
            .join("sandboxes")
            .join(uid)
    }

    async fn uid(&self, name: &str) -> String {
        self.engine
            .get_run(PROJECT, name)
            .await
            .expect("run")
            .metadata
            .uid
            .expect("uid")
    }

    async fn phase(&self, name: &str) -> Option<RunPhase> {
        self.engine
            .get_run(PROJECT, name)
            .await
            .ok()
            .and_then(|r| r.status.phase)
    }

    /// Wait (up to 30 s) until the run reaches `want`.
    async fn until(&self, name: &str, want: impl Fn(RunPhase) -> bool) -> RunPhase {
        for _ in 0..1200 {
            if let Some(phase) = self.phase(name).await
                && want(phase)
            {
                return phase;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("run {name} stayed {:?}", self.phase(name).await);
    }
}

/// The processes whose command line holds `marker` (the sandboxed command and the
/// bubblewrap that runs it).
fn processes_with(marker: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if pid == std::process::id() {
            continue;
        }
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline"))
            && String::from_utf8_lossy(&cmdline).contains(marker)
        {
            found.push(pid);
        }
    }
    found
}

/// Wait (up to 30 s) until the sandboxed command with `marker` runs.
async fn running(marker: &str) {
    for _ in 0..1200 {
        if !processes_with(marker).is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    panic!("the command {marker} never started");
}

/// A run of `sleeper` whose one command is `sleep SECONDS`.
fn sleeping(name: &str, seconds: &str) -> AgentRun {
    AgentRun::new(
        name,
        AgentRunSpec::new("sleeper", format!("Run `sleep {seconds}`")),
    )
}

/// What every stopped run must show: no process of its command left, its sandbox (working
/// directory and cgroups) deleted.
async fn assert_stopped(served: &Served, marker: &str, uid: &str, elapsed: Duration) {
    assert!(
        elapsed < Duration::from_secs(5),
        "the run ended {elapsed:?} after it was asked to, not at once"
    );
    // The processes are killed as the command's step is stopped; give the kernel a moment
    // to reap them.
    let deadline = Instant::now() + Duration::from_secs(2);
    while !processes_with(marker).is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(
        processes_with(marker),
        Vec::<u32>::new(),
        "the command's processes are gone"
    );
    assert!(
        !served.sandbox_dir(uid).exists(),
        "the sandbox's working directory is deleted"
    );
    for hierarchy in ["pids", "memory", "cpu", "unified"] {
        let cgroup = Path::new("/sys/fs/cgroup")
            .join(hierarchy)
            .join("nodus")
            .join(uid);
        assert!(!cgroup.exists(), "{} is removed", cgroup.display());
    }
}

/// The run's command step was recorded as stopped (not uncertain).
async fn assert_command_cancelled(engine: &Engine, name: &str) {
    let steps = engine.steps(PROJECT, name).await.expect("steps");
    let command = steps
        .iter()
        .find(|s| s.kind == StepKind::Command)
        .expect("a command step");
    assert_eq!(command.state, StepState::Cancelled, "{steps:?}");
    assert!(command.summary.contains("stopped"), "{}", command.summary);
    assert_eq!(
        steps.last().map(|s| s.kind),
        Some(StepKind::SandboxDeletion),
        "{steps:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_delete_and_deadlines_stop_a_running_command_at_once() {
    let served = Served::start().await;
    let engine = &served.engine;

    // Cancel, as the API records it: the runner stops the command.
    engine
        .create_run(PROJECT, sleeping("cancelled", "60.11"))
        .await
        .expect("run");
    running("60.11").await;
    let uid = served.uid("cancelled").await;
    let asked = Instant::now();
    engine
        .cancel_run(PROJECT, "cancelled")
        .await
        .expect("cancel");
    let phase = served.until("cancelled", RunPhase::is_finished).await;
    assert_eq!(phase, RunPhase::Cancelled(CancelReason::CancelRequested));
    assert_stopped(&served, "60.11", &uid, asked.elapsed()).await;
    assert_command_cancelled(engine, "cancelled").await;

    // Delete: the run goes, and so do its command and its sandbox.
    engine
        .create_run(PROJECT, sleeping("deleted", "60.12"))
        .await
        .expect("run");
    running("60.12").await;
    let uid = served.uid("deleted").await;
    let asked = Instant::now();
    engine
        .delete::<AgentRun>(PROJECT, "deleted")
        .await
        .expect("delete");
    assert_eq!(served.phase("deleted").await, None, "the run is gone");
    assert_stopped(&served, "60.12", &uid, asked.elapsed()).await;

    // A deadline ends the command when it comes, not when the command ends.
    let mut run = sleeping("late", "60.13");
    run.spec.deadline = Some(jiff::Timestamp::now() + jiff::SignedDuration::from_secs(3));
    let created = Instant::now();
    engine.create_run(PROJECT, run).await.expect("run");
    running("60.13").await;
    let uid = served.uid("late").await;
    let phase = served.until("late", RunPhase::is_finished).await;
    assert_eq!(phase, RunPhase::Failed(FailReason::DeadlineExceeded));
    let after_deadline = created.elapsed().saturating_sub(Duration::from_secs(3));
    assert_stopped(&served, "60.13", &uid, after_deadline).await;
    assert_command_cancelled(engine, "late").await;

    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_cancel_stops_its_running_commands_at_once() {
    let served = Served::start().await;
    let engine = &served.engine;
    let group = AgentGroupSpec {
        agent: "sleeper".to_string(),
        limits: GroupLimits::default(),
        max_cost_usd: None,
        sealed: false,
        evaluation: None,
    };
    engine
        .apply_group(PROJECT, AgentGroup::new("g", group))
        .await
        .expect("group");
    for (key, seconds) in [("a", "60.21"), ("b", "60.22")] {
        let mut run = sleeping("", seconds);
        run.metadata.name = None;
        run.spec.group = Some("g".to_string());
        run.spec.task_key = Some(key.to_string());
        engine.create_run(PROJECT, run).await.expect("run");
    }
    running("60.21").await;
    running("60.22").await;
    let uids = [served.uid("g-a").await, served.uid("g-b").await];
    let asked = Instant::now();
    engine.cancel_group(PROJECT, "g").await.expect("cancel");
    for name in ["g-a", "g-b"] {
        let phase = served.until(name, RunPhase::is_finished).await;
        assert_eq!(phase, RunPhase::Cancelled(CancelReason::GroupCancelled));
    }
    let elapsed = asked.elapsed();
    assert_stopped(&served, "60.21", &uids[0], elapsed).await;
    assert_stopped(&served, "60.22", &uids[1], elapsed).await;
    assert_command_cancelled(engine, "g-a").await;
    served.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_stops_a_running_command_in_a_docker_container_at_once() {
    let served = Served::start_on(SandboxKind::Docker).await;
    let engine = &served.engine;
    engine
        .create_run(PROJECT, sleeping("boxed", "60.31"))
        .await
        .expect("run");
    // The container's processes are the host's too.
    running("60.31").await;
    let asked = Instant::now();
    engine.cancel_run(PROJECT, "boxed").await.expect("cancel");
    let phase = served.until("boxed", RunPhase::is_finished).await;
    assert_eq!(phase, RunPhase::Cancelled(CancelReason::CancelRequested));
    let elapsed = asked.elapsed();
    assert!(elapsed < Duration::from_secs(5), "ended after {elapsed:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !processes_with("60.31").is_empty() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(processes_with("60.31"), Vec::<u32>::new());
    assert_command_cancelled(engine, "boxed").await;
    served.stop().await;
}

/// The CLI closes a conversation (it ends Succeeded, with its answer), refuses to send a
/// reused message key with another payload (exit 1, naming messageKey), and cancels a run in
/// a long command at once; against a `nodus server` on SQLite and bubblewrap.
#[test]
fn the_cli_closes_conversations_refuses_reused_message_keys_and_cancels_at_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = server::Backend::Sqlite.store_url(dir.path());
    let server = server::ServerProcess::start(&store, dir.path(), "process");
    server.ok(&[
        "apply",
        "-f",
        concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/agent.yaml"),
    ]);
    server.ok(&[
        "create",
        "agentrun",
        "chat",
        "--agent",
        "hello-agent",
        "--prompt",
        "Run `echo first`",
        "--keep-alive",
    ]);
    server.ok(&[
        "wait",
        "agentrun/chat",
        "--for=jsonpath={.status.phase}=Waiting",
        "--timeout=2m",
    ]);
    server.ok(&[
        "agentrun",
        "send",
        "chat",
        "Run `echo staging`",
        "--key",
        "k1",
    ]);
    let repeat = server.ok(&[
        "agentrun",
        "send",
        "chat",
        "Run `echo staging`",
        "--key",
        "k1",
    ]);
    assert!(repeat.contains("already delivered"), "{repeat}");
    let reused = server.cli(&[
        "agentrun",
        "send",
        "chat",
        "Run `echo other`",
        "--key",
        "k1",
    ]);
    assert_eq!(reused.status.code(), Some(1), "{reused:?}");
    let stderr = String::from_utf8_lossy(&reused.stderr);
    assert!(
        stderr.contains("Invalid") && stderr.contains("messageKey"),
        "{stderr}"
    );

    let closed = server.ok(&["agentrun", "close", "chat"]);
    assert!(closed.contains("closed"), "{closed}");
    server.ok(&[
        "wait",
        "agentrun/chat",
        "--for=jsonpath={.status.phase}=Succeeded",
        "--timeout=2m",
    ]);
    let answer = server.ok(&["agentrun", "answer", "chat"]);
    assert!(
        answer.lines().any(|l| l == "staging"),
        "the last turn's answer (the command's output line) is kept: {answer}"
    );
    assert!(
        !answer.contains("other"),
        "the refused message was never read: {answer}"
    );
    let refused = server.fails(&["agentrun", "close", "chat"]);
    assert!(refused.contains("AgentRunFinished"), "{refused}");
    // The REST call is documented.
    let (status, openapi) = server.http("GET", "/openapi.json", None, None);
    assert_eq!(status, 200);
    let path = "/apis/nodus.dev/v1/projects/{project}/agentruns/{name}/close";
    assert!(
        openapi["paths"][path]["post"].is_object(),
        "{path} in {:?}",
        openapi["paths"]
            .as_object()
            .map(|p| p.keys().collect::<Vec<_>>())
    );

    // Cancel from the CLI ends a run in a long command at once.
    server.ok(&[
        "create",
        "agentrun",
        "sleepy",
        "--agent",
        "hello-agent",
        "--prompt",
        "Run `sleep 60.41`",
    ]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while processes_with("60.41").is_empty() {
        assert!(Instant::now() < deadline, "the command never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    let asked = Instant::now();
    server.ok(&["cancel", "agentrun/sleepy"]);
    // The cancel answers once the run has ended: "cancelled" is what it is.
    let phase = server.ok(&["get", "agentrun/sleepy", "-o", "jsonpath={.status.phase}"]);
    assert_eq!(phase.trim(), "Cancelled");
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "cancelled after {:?}",
        asked.elapsed()
    );
}

/// Hooks of a sandbox that, while it deletes a run's sandbox, sends the run a message (as a
/// user who writes at the moment the run ends) and keeps the answer.
#[derive(Default)]
struct MessageWhileDeleting {
    sender: std::sync::OnceLock<Engine>,
    sent: std::sync::Mutex<Option<nodus_core::engine::Result<Delivery>>>,
}

#[async_trait::async_trait]
impl support::hooked::Hooks for MessageWhileDeleting {
    async fn destroy(
        &self,
        inner: &nodus_core::testing::RecordingSandbox,
        id: &nodus_core::sandbox::SandboxId,
    ) -> Result<(), nodus_core::sandbox::Error> {
        if let Some(sender) = self.sender.get() {
            let sent = sender
                .send_message(PROJECT, "job", "One more thing.", None)
                .await;
            *self.sent.lock().expect("lock") = Some(sent);
        }
        nodus_core::sandbox::Sandbox::destroy(inner, id).await
    }
}

#[tokio::test]
async fn a_message_sent_while_the_run_deletes_its_sandbox_is_refused_not_lost() {
    let world = World::new(vec![text("done")]);
    let sandbox = std::sync::Arc::new(support::hooked::Hooked {
        inner: world.sandbox.clone(),
        hooks: MessageWhileDeleting::default(),
    });
    let engine = world.engine_with_sandbox(sandbox.clone());
    let _ = sandbox.hooks.sender.set(world.engine());
    helper_run(&engine, "job", "Check the logs", |_| {}).await;
    let driven = engine.drive(PROJECT, "job").await.expect("drive");
    assert_eq!(driven, Driven::Finished(RunPhase::Succeeded));
    let sent = sandbox
        .hooks
        .sent
        .lock()
        .expect("lock")
        .take()
        .expect("a message was sent while the sandbox was deleted");
    // Answered delivered, it would never be read: the run's turn is over and it succeeded.
    let error = sent.expect_err("the ending run refuses the message");
    assert_eq!(error.reason(), "AgentRunFinished", "{error}");
    assert!(error.to_string().contains("Succeeded"), "{error}");
    let inbox = world
        .engine()
        .get_run(PROJECT, "job")
        .await
        .expect("run")
        .status
        .turns
        .len();
    assert_eq!(inbox, 1, "one turn: the message was never taken in");
}

/// A run that writes until its disk limit (the default, 1 GiB) is stopped there through the
/// real server: its command step says so and is completed (not uncertain), the run goes on
/// and succeeds, nothing of it is left on disk, and the server still takes writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_fills_its_disk_is_stopped_at_the_limit_and_the_server_still_writes() {
    let served = Served::start().await;
    let engine = &served.engine;
    let filler = AgentRun::new(
        "filler",
        AgentRunSpec::new(
            "sleeper",
            "Run `dd if=/dev/zero of=fill bs=1M count=1300 2>&1; ls -l fill`",
        ),
    );
    engine.create_run(PROJECT, filler).await.expect("run");
    let uid = served.uid("filler").await;
    let phase = served.until("filler", RunPhase::is_finished).await;
    assert_eq!(phase, RunPhase::Succeeded, "the run goes on after the stop");
    let steps = engine.steps(PROJECT, "filler").await.expect("steps");
    let command = steps
        .iter()
        .find(|s| s.kind == StepKind::Command)
        .expect("a command step");
    assert_eq!(command.state, StepState::Completed, "{steps:?}");
    assert!(
        command.summary.contains("stopped") && command.summary.contains("disk limit"),
        "{}",
        command.summary
    );
    assert!(
        !served.sandbox_dir(&uid).exists(),
        "the filled working directory is deleted with the sandbox"
    );
    // The store still takes writes: another run is created and finishes.
    engine
        .create_run(PROJECT, sleeping("after", "0"))
        .await
        .expect("the server still writes");
    assert_eq!(
        served.until("after", RunPhase::is_finished).await,
        RunPhase::Succeeded
    );
    served.stop().await;
}
