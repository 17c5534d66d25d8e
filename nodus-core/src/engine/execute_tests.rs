//! Unit tests of the executor over `mockall` mocks of the `Store`, the `Sandbox` and the
//! `ModelClient`: each asserts the exact calls one drive makes (how many, with what).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use jiff::Timestamp;
use mockall::predicate::eq;

use super::Driven;
use crate::catalog::{Catalog, CatalogModel, Family};
use crate::cost::{Prices, Rates, Usage};
use crate::engine::{Config, Deps, Engine, typed};
use crate::journal::{Completion, Intent, Outcome, Step};
use crate::lifecycle::{FailReason, RunPhase};
use crate::model::{
    ContentBlock, Credentials, ErrorKind, MockModelClient, ModelResponse, Role, StopReason,
};
use crate::money::Usd;
use crate::output::Output;
use crate::resource::{Access, AgentRun, AgentRunSpec, AgentSpec, Kind, ModelAccess, RunSnapshot};
use crate::router::FixedRouter;
use crate::sandbox::{ExecOutput, MockSandbox, SandboxId, SandboxInfo, SandboxSpec};
use crate::secret::StaticSecrets;
use crate::store::{
    Change, Delivery, Error, Fence, InboxMessage, Lease, ObjectKey, Record, RunRewrite, Selector,
    Store,
};
use crate::testing::ManualClock;

/// The calls of the [`Store`] trait, with arguments a mock can hold (`mockall` cannot mock
/// `Option<&str>` or `&[&str]` arguments): [`MockedStore`] is the `Store` that forwards each
/// call to it. The calls a drive never makes are one `unexpected` call, which no test
/// expects: any of them fails the test.
#[mockall::automock]
#[async_trait::async_trait]
trait StoreCalls: Send + Sync {
    async fn create(&self, key: &ObjectKey, document: serde_json::Value) -> Result<Record, Error>;
    async fn get(&self, key: &ObjectKey) -> Result<Record, Error>;
    async fn list(
        &self,
        project: &str,
        kind: Kind,
        selector: &Selector,
    ) -> Result<Vec<Record>, Error>;
    async fn update(
        &self,
        key: &ObjectKey,
        expected_version: u64,
        document: serde_json::Value,
    ) -> Result<Record, Error>;
    async fn claim(&self, run_uid: &str, lease: &Lease) -> Result<Fence, Error>;
    async fn renew(&self, run_uid: &str, fence: Fence, lease: &Lease) -> Result<(), Error>;
    async fn release(&self, run_uid: &str, fence: Fence) -> Result<(), Error>;
    async fn append_step(&self, run_uid: &str, fence: Fence, step: &Step) -> Result<(), Error>;
    async fn complete_step(
        &self,
        run_uid: &str,
        fence: Fence,
        seq: u32,
        completion: &Completion,
    ) -> Result<(), Error>;
    async fn journal(&self, run_uid: &str) -> Result<Vec<Step>, Error>;
    async fn inbox(&self, run_uid: &str) -> Result<Vec<InboxMessage>, Error>;
    async fn projects(&self) -> Result<Vec<String>, Error>;
    fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Change>;
    fn unexpected(&self, call: &'static str);
}

/// A [`Store`] made of a [`MockStoreCalls`].
struct MockedStore(MockStoreCalls);

#[async_trait::async_trait]
impl Store for MockedStore {
    async fn create(&self, key: &ObjectKey, document: serde_json::Value) -> Result<Record, Error> {
        self.0.create(key, document).await
    }
    async fn create_batch_within(
        &self,
        _: Vec<(ObjectKey, serde_json::Value)>,
        _: Option<&str>,
        _: &[crate::store::MemberCap],
    ) -> Result<Vec<Record>, Error> {
        self.0.unexpected("create_batch");
        Err(Error::Unavailable("create_batch".to_string()))
    }
    async fn get(&self, key: &ObjectKey) -> Result<Record, Error> {
        self.0.get(key).await
    }
    async fn list(
        &self,
        project: &str,
        kind: Kind,
        selector: &Selector,
    ) -> Result<Vec<Record>, Error> {
        self.0.list(project, kind, selector).await
    }
    async fn list_page(
        &self,
        _: &str,
        _: Kind,
        _: &Selector,
        _: Option<crate::store::Position>,
        _: std::num::NonZeroUsize,
    ) -> Result<crate::store::Page, Error> {
        self.0.unexpected("list_page");
        Err(Error::Unavailable("list_page".to_string()))
    }
    async fn list_sparse_known(
        &self,
        _: &str,
        _: Kind,
        _: &Selector,
        _: &[&str],
        _: &std::collections::HashMap<String, crate::store::Seen>,
    ) -> Result<Vec<crate::store::Sparse>, Error> {
        self.0.unexpected("list_sparse_known");
        Err(Error::Unavailable("list_sparse_known".to_string()))
    }
    async fn projects(&self) -> Result<Vec<String>, Error> {
        self.0.projects().await
    }
    async fn update(
        &self,
        key: &ObjectKey,
        expected_version: u64,
        document: serde_json::Value,
    ) -> Result<Record, Error> {
        self.0.update(key, expected_version, document).await
    }
    async fn delete(&self, _: &ObjectKey) -> Result<(), Error> {
        self.0.unexpected("delete");
        Err(Error::Unavailable("delete".to_string()))
    }
    async fn claim(&self, run_uid: &str, lease: &Lease) -> Result<Fence, Error> {
        self.0.claim(run_uid, lease).await
    }
    async fn renew(&self, run_uid: &str, fence: Fence, lease: &Lease) -> Result<(), Error> {
        self.0.renew(run_uid, fence, lease).await
    }
    async fn release(&self, run_uid: &str, fence: Fence) -> Result<(), Error> {
        self.0.release(run_uid, fence).await
    }
    async fn append_step(&self, run_uid: &str, fence: Fence, step: &Step) -> Result<(), Error> {
        self.0.append_step(run_uid, fence, step).await
    }
    async fn complete_step(
        &self,
        run_uid: &str,
        fence: Fence,
        seq: u32,
        completion: &Completion,
    ) -> Result<(), Error> {
        self.0.complete_step(run_uid, fence, seq, completion).await
    }
    async fn journal(&self, run_uid: &str) -> Result<Vec<Step>, Error> {
        self.0.journal(run_uid).await
    }
    async fn post_message(
        &self,
        _: &ObjectKey,
        _: u64,
        _: Option<&str>,
        _: &str,
        _: Timestamp,
    ) -> Result<Delivery, Error> {
        self.0.unexpected("post_message");
        Err(Error::Unavailable("post_message".to_string()))
    }
    async fn inbox(&self, run_uid: &str) -> Result<Vec<InboxMessage>, Error> {
        self.0.inbox(run_uid).await
    }
    async fn rewrite_run(&self, _: RunRewrite) -> Result<Record, Error> {
        self.0.unexpected("rewrite_run");
        Err(Error::Unavailable("rewrite_run".to_string()))
    }
    async fn put_snapshot(
        &self,
        _: &str,
        _: u32,
        _: &crate::snapshot::Stored,
        _: &[crate::snapshot::Blob],
    ) -> Result<(), Error> {
        self.0.unexpected("put_snapshot");
        Err(Error::Unavailable("put_snapshot".to_string()))
    }
    async fn missing_blobs(&self, _: &[String]) -> Result<Vec<String>, Error> {
        self.0.unexpected("missing_blobs");
        Err(Error::Unavailable("missing_blobs".to_string()))
    }
    async fn snapshots(&self, _: &str) -> Result<Vec<(u32, crate::snapshot::Snapshot)>, Error> {
        self.0.unexpected("snapshots");
        Err(Error::Unavailable("snapshots".to_string()))
    }
    async fn blob(&self, _: &str) -> Result<Option<Vec<u8>>, Error> {
        self.0.unexpected("blob");
        Err(Error::Unavailable("blob".to_string()))
    }
    async fn delete_snapshots(&self, _: &str) -> Result<(), Error> {
        self.0.unexpected("delete_snapshots");
        Err(Error::Unavailable("delete_snapshots".to_string()))
    }
    async fn blob_bytes(&self) -> Result<u64, Error> {
        self.0.unexpected("blob_bytes");
        Err(Error::Unavailable("blob_bytes".to_string()))
    }
    fn subscribe(&self) -> tokio::sync::broadcast::Receiver<Change> {
        self.0.subscribe()
    }
}

const PROJECT: &str = "p";
const NAME: &str = "r";
const UID: &str = "uid-1";

fn key() -> ObjectKey {
    ObjectKey::new(PROJECT, Kind::AgentRun, NAME)
}

fn t0() -> Timestamp {
    "2026-12-01T10:00:00Z".parse().expect("time")
}

fn platform_agent() -> AgentSpec {
    AgentSpec::new("be brief")
}

fn byok_agent() -> AgentSpec {
    let mut agent = AgentSpec::new("be brief");
    agent.model = ModelAccess {
        access: Access::Byok,
        families: None,
        name: Some("m-byok".to_string()),
        api_key_secret: Some("my-key".to_string()),
    };
    agent
}

/// The run as stored: running, with its agent's snapshot.
fn run_document(agent: AgentSpec) -> serde_json::Value {
    let mut run = AgentRun::new(NAME, AgentRunSpec::new("a", "list the files"));
    run.metadata.project = Some(PROJECT.to_string());
    run.metadata.uid = Some(UID.to_string());
    run.status.phase = Some(RunPhase::Running);
    run.status.snapshot = Some(RunSnapshot {
        agent_ref: Some("p/a".to_string()),
        agent_revision: Some("1".to_string()),
        agent,
        workdir: None,
        environment: None,
        post_run_action: None,
        image_digest: None,
    });
    typed::encode(&key(), &run).expect("document")
}

/// What the mocked store holds: the run's document and version, and the steps written.
#[derive(Default)]
struct Held {
    document: serde_json::Value,
    version: u64,
    appended: Vec<Step>,
    completed: Vec<(u32, Outcome)>,
}

/// A store mock that holds the run's document (reads see the last write) and expects the
/// drive's lease and journal calls: one claim, one journal read, one release, and exactly
/// `appends` intents and `completions` outcomes written.
fn store(
    agent: AgentSpec,
    journal: Vec<Step>,
    appends: usize,
    completions: usize,
) -> (MockedStore, Arc<Mutex<Held>>) {
    // A run that ends keeps its final working directory once: what its sandbox gives, in
    // one create (it has no such document yet, so it reads none).
    let keeps = usize::from(appends > 0);
    let archive = crate::engine::workdir_archive_key(&key());
    let held = Arc::new(Mutex::new(Held {
        document: run_document(agent),
        version: 1,
        ..Held::default()
    }));
    let (changes, _) = tokio::sync::broadcast::channel::<Change>(16);
    let mut store = MockStoreCalls::new();
    let read = held.clone();
    store.expect_get().with(eq(key())).returning(move |key| {
        let held = read.lock().expect("held");
        Ok(Record {
            key: key.clone(),
            version: held.version,
            document: held.document.clone(),
        })
    });
    store.expect_get().with(eq(archive.clone())).times(0);
    store
        .expect_create()
        .withf(move |key, document| *key == archive && document["bytes"] == 0)
        .times(keeps)
        .returning(|key, document| {
            Ok(Record {
                key: key.clone(),
                version: 1,
                document,
            })
        });
    let written = held.clone();
    store
        .expect_update()
        .returning(move |key, version, document| {
            let mut held = written.lock().expect("held");
            assert_eq!(
                version, held.version,
                "the status is written over the version read"
            );
            held.version += 1;
            held.document = document.clone();
            Ok(Record {
                key: key.clone(),
                version: held.version,
                document,
            })
        });
    store
        .expect_inbox()
        .with(eq(UID))
        .returning(|_| Ok(Vec::new()));
    store
        .expect_claim()
        .withf(|uid, _| uid == UID)
        .times(1)
        .returning(|_, _| Ok(Fence(7)));
    store
        .expect_journal()
        .with(eq(UID))
        .times(1)
        .return_once(move |_| Ok(journal));
    store.expect_renew().returning(|_, _, _| Ok(()));
    store
        .expect_release()
        .with(eq(UID), eq(Fence(7)))
        .times(1)
        .returning(|_, _| Ok(()));
    let appended = held.clone();
    store
        .expect_append_step()
        .withf(|uid, fence, _| uid == UID && *fence == Fence(7))
        .times(appends)
        .returning(move |_, _, step| {
            appended.lock().expect("held").appended.push(step.clone());
            Ok(())
        });
    let completed = held.clone();
    store
        .expect_complete_step()
        .withf(|uid, fence, _, _| uid == UID && *fence == Fence(7))
        .times(completions)
        .returning(move |_, _, seq, completion| {
            completed
                .lock()
                .expect("held")
                .completed
                .push((seq, completion.outcome.clone()));
            Ok(())
        });
    store
        .expect_subscribe()
        .returning(move || changes.subscribe());
    (MockedStore(store), held)
}

/// The store of [`store`], which also names project `p` as the one project it holds and
/// lists the run as its one unfinished run (and no group), for a runner starting over it.
fn listing_store(
    agent: AgentSpec,
    journal: Vec<Step>,
    appends: usize,
    completions: usize,
) -> (MockedStore, Arc<Mutex<Held>>) {
    let (MockedStore(mut store), held) = store(agent, journal, appends, completions);
    // The project holds no account (an embedder's, unmetered): the runner still resumes it.
    store
        .expect_projects()
        .times(1)
        .returning(|| Ok(vec![PROJECT.to_string()]));
    let listed = held.clone();
    store
        .expect_list()
        .withf(|project, kind, _| project == PROJECT && *kind == Kind::AgentRun)
        .times(1)
        .returning(move |_, _, _| {
            let held = listed.lock().expect("held");
            Ok(vec![Record {
                key: key(),
                version: held.version,
                document: held.document.clone(),
            }])
        });
    store
        .expect_list()
        .withf(|project, kind, _| project == PROJECT && *kind == Kind::AgentGroup)
        .times(1)
        .returning(|_, _, _| Ok(Vec::new()));
    (MockedStore(store), held)
}

fn catalog() -> Catalog {
    let prices = Prices {
        base: Rates {
            input: Usd::from_cents(100),
            output: Usd::from_cents(500),
            cache_write: Usd::from_cents(125),
            cache_read: Usd::from_cents(10),
        },
        long_prompt: None,
    };
    Catalog {
        date: "2026-12-01".to_string(),
        notes: Vec::new(),
        families: BTreeMap::from([(
            Family::Haiku,
            CatalogModel {
                model: "m-haiku".to_string(),
                prices,
            },
        )]),
        models: Vec::new(),
    }
}

fn engine(store: MockedStore, sandbox: MockSandbox, model: MockModelClient) -> Engine {
    Engine::new(
        Deps {
            store: Arc::new(store),
            sandbox: Arc::new(sandbox),
            model: Arc::new(model),
            router: Arc::new(FixedRouter(Family::Haiku)),
            clock: Arc::new(ManualClock::new(t0())),
            catalog: Arc::new(catalog()),
            secrets: Arc::new(StaticSecrets::new()),
            ledger: Arc::new(crate::ledger::Unmetered),
            spans: Arc::new(crate::telemetry::NoSpans),
        },
        // Snapshots are tested through real sandboxes (tests/tests/forks.rs).
        Config {
            snapshots: None,
            ..Config::default()
        },
    )
}

fn step(seq: u32, intent: Intent, outcome: Option<Outcome>) -> Step {
    Step {
        seq,
        started_at: t0(),
        intent,
        completion: outcome.map(|outcome| Completion {
            finished_at: t0(),
            outcome,
        }),
    }
}

fn sandbox_spec() -> SandboxSpec {
    SandboxSpec {
        key: UID.to_string(),
        image: None,
        env: Default::default(),
        limits: Default::default(),
        network: false,
        egress: None,
        egress_headers: Vec::new(),
        links: Default::default(),
    }
}

fn reply(content: Vec<ContentBlock>) -> ModelResponse {
    ModelResponse {
        model: "m-haiku".to_string(),
        content,
        stop_reason: StopReason::EndTurn,
        usage: Usage {
            input_tokens: 50,
            output_tokens: 5,
            cache_write_tokens: 0,
            cache_read_tokens: 0,
        },
        request_id: None,
    }
}

fn text(text: &str) -> Vec<ContentBlock> {
    vec![ContentBlock::Text {
        text: text.to_string(),
    }]
}

fn ls_command() -> Intent {
    Intent::Command {
        turn: 0,
        tool_use_id: "t1".to_string(),
        command: "ls".to_string(),
    }
}

fn output(stdout: &str) -> ExecOutput {
    ExecOutput {
        exit_code: Some(0),
        stdout: Output {
            bytes: stdout.as_bytes().to_vec(),
            truncated: false,
        },
        stderr: Output::default(),
        timed_out: false,
        stopped: None,
    }
}

/// The journal of a run that crashed after the model asked for `ls`: its sandbox, its
/// route, the model's reply.
fn asked_ls() -> Vec<Step> {
    vec![
        step(
            0,
            Intent::CreateSandbox {
                spec: sandbox_spec(),
            },
            Some(Outcome::SandboxCreated {
                info: SandboxInfo {
                    id: SandboxId("sb-1".to_string()),
                    isolated: true,
                    host: None,
                },
            }),
        ),
        step(
            1,
            Intent::Route { turn: 0 },
            Some(Outcome::Routed {
                family: Some(Family::Haiku),
                model: "m-haiku".to_string(),
                chosen_by: crate::resource::ChosenBy::Jev,
                cost_usd: Usd::ZERO,
                usage: None,
                fallback_reason: None,
            }),
        ),
        step(
            2,
            Intent::CallModel {
                turn: 0,
                model: "m-haiku".to_string(),
                reserved_usd: Usd::from_cents(1),
                tools: true,
            },
            Some(Outcome::ModelReplied {
                response: reply(vec![ContentBlock::ToolUse {
                    id: "t1".to_string(),
                    name: "shell".to_string(),
                    input: serde_json::json!({"command": "ls"}),
                }]),
                cost_usd: Usd::from_nanos(100),
            }),
        ),
    ]
}

/// A sandbox that expects to be deleted once, and to run what `exec` says.
fn sandbox_deleted_once() -> MockSandbox {
    let mut sandbox = MockSandbox::new();
    sandbox.expect_create().times(0);
    // Its final working directory is kept before it goes (empty here), once.
    sandbox
        .expect_get_files()
        .withf(|id, path, _| id == &SandboxId("sb-1".to_string()) && path.is_empty())
        .times(1)
        .returning(|_, _, _| Ok(Vec::new()));
    sandbox
        .expect_destroy()
        .with(eq(SandboxId("sb-1".to_string())))
        .times(1)
        .returning(|_| Ok(()));
    sandbox
}

/// A model that answers `a.txt` once, to a request whose last message is the result of
/// `ls` (its output, `a.txt`).
fn model_answering_once() -> MockModelClient {
    let mut model = MockModelClient::new();
    model
        .expect_complete()
        .withf(|request| {
            let last = request.messages.last().expect("a message");
            request.model == "m-haiku"
                && request.credentials == Credentials::Platform
                && last.role == Role::User
                && last.content
                    == vec![ContentBlock::ToolResult {
                        tool_use_id: "t1".to_string(),
                        content: "exit code 0\nstdout:\na.txt\n".to_string(),
                        is_error: false,
                    }]
        })
        .times(1)
        .returning(|_| Ok(reply(text("a.txt"))));
    model
}

#[tokio::test]
async fn replay_runs_no_completed_command_again() {
    let mut journal = asked_ls();
    journal.push(step(
        3,
        ls_command(),
        Some(Outcome::CommandFinished {
            output: output("a.txt\n"),
            remade_sandbox: None,
        }),
    ));
    // The model call, the answer, the deletion: intents and outcomes.
    let (store, held) = store(platform_agent(), journal, 3, 3);
    let mut sandbox = sandbox_deleted_once();
    sandbox.expect_exec_live().times(0);
    let engine = engine(store, sandbox, model_answering_once());

    let driven = engine.drive(PROJECT, NAME).await.expect("drive");

    assert_eq!(driven, Driven::Finished(RunPhase::Succeeded));
    let held = held.lock().expect("held");
    let kinds: Vec<_> = held
        .appended
        .iter()
        .map(|s| (s.seq, s.intent.kind()))
        .collect();
    use crate::journal::StepKind::{Answer, ModelCall, SandboxDeletion};
    assert_eq!(
        kinds,
        vec![(4, ModelCall), (5, Answer), (6, SandboxDeletion)]
    );
}

#[tokio::test]
async fn replay_runs_once_a_command_whose_intent_was_never_written() {
    let (store, held) = store(platform_agent(), asked_ls(), 4, 4);
    let mut sandbox = sandbox_deleted_once();
    sandbox
        .expect_exec_live()
        .withf(|id, request, _| id == &SandboxId("sb-1".to_string()) && request.command == "ls")
        .times(1)
        .returning(|_, _, _| Ok(output("a.txt\n")));
    let engine = engine(store, sandbox, model_answering_once());

    let driven = engine.drive(PROJECT, NAME).await.expect("drive");

    assert_eq!(driven, Driven::Finished(RunPhase::Succeeded));
    let held = held.lock().expect("held");
    assert_eq!(held.appended[0].intent, ls_command());
    assert_eq!(held.appended[0].seq, 3);
    assert_eq!(
        held.completed[0],
        (
            3,
            Outcome::CommandFinished {
                output: output("a.txt\n"),
                remade_sandbox: None,
            }
        )
    );
}

#[tokio::test]
async fn replay_parks_on_a_command_that_was_under_way() {
    let mut journal = asked_ls();
    journal.push(step(3, ls_command(), None));
    let (store, held) = store(platform_agent(), journal, 0, 0);
    let mut sandbox = MockSandbox::new();
    sandbox.expect_exec_live().times(0);
    sandbox.expect_create().times(0);
    sandbox.expect_destroy().times(0);
    let mut model = MockModelClient::new();
    model.expect_complete().times(0);
    let engine = engine(store, sandbox, model);

    let driven = engine.drive(PROJECT, NAME).await.expect("drive");

    assert!(
        matches!(driven, Driven::Parked { seq: 3, .. }),
        "{driven:?}"
    );
    let held = held.lock().expect("held");
    assert_eq!(held.document["status"]["phase"], "NeedsResolution");
}

#[tokio::test]
async fn a_byok_call_whose_key_vanished_is_never_made() {
    let journal = vec![asked_ls().remove(0)];
    // The refused call, then the deletion: intents and outcomes.
    let (store, held) = store(byok_agent(), journal, 2, 2);
    let mut sandbox = sandbox_deleted_once();
    sandbox.expect_exec_live().times(0);
    let mut model = MockModelClient::new();
    model.expect_complete().times(0);
    let engine = engine(store, sandbox, model);

    let driven = engine.drive(PROJECT, NAME).await.expect("drive");

    assert_eq!(
        driven,
        Driven::Finished(RunPhase::Failed(FailReason::ModelCallFailed))
    );
    let held = held.lock().expect("held");
    assert_eq!(
        held.completed[0],
        (
            1,
            Outcome::Failed {
                error: "the Secret \"my-key\" holds no API_KEY".to_string(),
                by_resolution: false,
            }
        )
    );
    assert_eq!(
        held.document["status"]["message"],
        "the Secret \"my-key\" holds no API_KEY"
    );
}

#[tokio::test]
async fn a_platform_call_whose_reply_was_lost_is_made_again_within_its_attempts() {
    let mut journal = asked_ls();
    journal.push(step(
        3,
        ls_command(),
        Some(Outcome::CommandFinished {
            output: output("a.txt\n"),
            remade_sandbox: None,
        }),
    ));
    let (store, _held) = store(platform_agent(), journal, 3, 3);
    let mut sandbox = sandbox_deleted_once();
    sandbox.expect_exec_live().times(0);
    let mut model = MockModelClient::new();
    let mut sequence = mockall::Sequence::new();
    model
        .expect_complete()
        .times(2)
        .in_sequence(&mut sequence)
        .returning(|_| {
            Err(crate::model::Error {
                kind: ErrorKind::Uncertain,
                message: "the connection was cut".to_string(),
            })
        });
    model
        .expect_complete()
        .times(1)
        .in_sequence(&mut sequence)
        .returning(|_| Ok(reply(text("a.txt"))));
    let engine = engine(store, sandbox, model);

    let driven = engine.drive(PROJECT, NAME).await.expect("drive");

    assert_eq!(driven, Driven::Finished(RunPhase::Succeeded));
}

/// The runner, started over a store holding a run that crashed after its command finished,
/// resumes it once: one claim, no command executed again, one model call, one deletion.
#[tokio::test]
async fn the_runner_resumes_an_unfinished_run_once_without_repeating_its_command() {
    let mut journal = asked_ls();
    journal.push(step(
        3,
        ls_command(),
        Some(Outcome::CommandFinished {
            output: output("a.txt\n"),
            remade_sandbox: None,
        }),
    ));
    let (store, held) = listing_store(platform_agent(), journal, 3, 3);
    let mut sandbox = sandbox_deleted_once();
    sandbox.expect_exec_live().times(0);
    let engine = engine(store, sandbox, model_answering_once());

    let runner = crate::runner::Runner::start(engine, crate::runner::RunnerConfig::default());
    // The runner works on this thread between the test's yields (a mock that panics in
    // one of its tasks leaves the run unfinished: the test then fails here, not hangs).
    let mut finished = false;
    for _ in 0..100_000 {
        if held.lock().expect("held").document["status"]["phase"] == "Succeeded" {
            finished = true;
            break;
        }
        tokio::task::yield_now().await;
    }
    runner.shutdown().await;

    assert!(finished, "the runner finished the run");
    assert_eq!(held.lock().expect("held").appended.len(), 3);
}

/// [`asked_ls`], its sandbox on the Docker host `tcp://lost:2376`.
fn asked_ls_on_a_host() -> Vec<Step> {
    let mut journal = asked_ls();
    journal[0].completion = Some(Completion {
        finished_at: t0(),
        outcome: Outcome::SandboxCreated {
            info: SandboxInfo {
                host: Some("tcp://lost:2376".to_string()),
                ..sandbox_on_a()
            },
        },
    });
    journal
}

/// The run's sandbox made again on the Docker host `unix:///a.sock`.
fn sandbox_on_a() -> SandboxInfo {
    SandboxInfo {
        id: SandboxId("sb-1".to_string()),
        isolated: true,
        host: Some("unix:///a.sock".to_string()),
    }
}

/// A sandbox whose host stopped answering: the command finds it gone, the run makes it again
/// (on another host), runs the command there, and its outcome records where; the status
/// names that host.
#[tokio::test]
async fn a_command_whose_sandbox_was_lost_records_the_sandbox_made_again_for_it() {
    // The command, the model call, the answer, the deletion: intents and outcomes.
    let (store, held) = store(platform_agent(), asked_ls_on_a_host(), 4, 4);
    let mut sandbox = MockSandbox::new();
    let mut sequence = mockall::Sequence::new();
    sandbox
        .expect_exec_live()
        .withf(|id, request, _| id == &SandboxId("sb-1".to_string()) && request.command == "ls")
        .times(1)
        .in_sequence(&mut sequence)
        .returning(|id, _, _| Err(crate::sandbox::Error::NotFound(id.clone())));
    sandbox
        .expect_create()
        .withf(|spec| spec.key == UID)
        .times(1)
        .in_sequence(&mut sequence)
        .returning(|_| Ok(sandbox_on_a()));
    sandbox
        .expect_exec_live()
        .withf(|id, request, _| id == &SandboxId("sb-1".to_string()) && request.command == "ls")
        .times(1)
        .in_sequence(&mut sequence)
        .returning(|_, _, _| Ok(output("a.txt\n")));
    sandbox
        .expect_get_files()
        .times(1)
        .returning(|_, _, _| Ok(Vec::new()));
    sandbox
        .expect_destroy()
        .with(eq(SandboxId("sb-1".to_string())))
        .times(1)
        .returning(|_| Ok(()));
    let engine = engine(store, sandbox, model_answering_once());

    let driven = engine.drive(PROJECT, NAME).await.expect("drive");

    assert_eq!(driven, Driven::Finished(RunPhase::Succeeded));
    let held = held.lock().expect("held");
    assert_eq!(
        held.completed[0],
        (
            3,
            Outcome::CommandFinished {
                output: output("a.txt\n"),
                remade_sandbox: Some(sandbox_on_a()),
            }
        )
    );
    assert_eq!(
        held.document["status"]["sandbox"]["host"], "unix:///a.sock",
        "{}",
        held.document["status"]
    );
}

/// After a restart, the replay honours a sandbox made again during a command: the status
/// names the host the run is on now, not the one its sandbox was first created on.
#[tokio::test]
async fn replay_puts_the_run_in_the_sandbox_a_command_made_again() {
    let mut journal = asked_ls_on_a_host();
    journal.push(step(
        3,
        ls_command(),
        Some(Outcome::CommandFinished {
            output: output("a.txt\n"),
            remade_sandbox: Some(sandbox_on_a()),
        }),
    ));
    let (store, held) = store(platform_agent(), journal, 3, 3);
    let mut sandbox = sandbox_deleted_once();
    sandbox.expect_exec_live().times(0);
    let engine = engine(store, sandbox, model_answering_once());

    let driven = engine.drive(PROJECT, NAME).await.expect("drive");

    assert_eq!(driven, Driven::Finished(RunPhase::Succeeded));
    let held = held.lock().expect("held");
    assert_eq!(
        held.document["status"]["sandbox"]["host"], "unix:///a.sock",
        "{}",
        held.document["status"]
    );
}
