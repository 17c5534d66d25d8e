//! Property-based fuzzing of the journal's encoding and of selectors in the stores:
//! generated steps (every intent and outcome, arbitrary text, bytes, JSON, money and times)
//! read back exactly as written, from their stored text and through every backend (memory,
//! SQLite, Postgres); arbitrary or damaged stored text reads as a corrupt journal, never a
//! panic; and any selector lists the same documents from every backend (the SQL backends push
//! it down into their queries, the memory store matches in process), without an error.
//!
//! Every test's name starts with `fuzz_`; a long budget is
//! `PROPTEST_CASES=1000 cargo test -p nodus-store --lib fuzz_` (RELIABILITY.md, "Fuzzing").

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use jiff::Timestamp;
use nodus_core::catalog::Family;
use nodus_core::cost::Usage;
use nodus_core::journal::{Completion, Intent, Outcome, Step};
use nodus_core::lifecycle::RunPhase;
use nodus_core::model::{ContentBlock, ModelResponse, StopReason};
use nodus_core::money::Usd;
use nodus_core::output::Output;
use nodus_core::resource::ChosenBy;
use nodus_core::resource::Kind;
use nodus_core::sandbox::{ExecOutput, Limits, SandboxId, SandboxInfo, SandboxSpec};
use nodus_core::store::{Error, Lease, ObjectKey, Selector, Store};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use serde_json::Value;

use crate::sql;

fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => "\\PC{0,12}",
        1 => ".{0,12}",
        1 => prop::sample::select(vec!["", "\u{0}", "\\", "\"", "\\u0000", "\u{feff}", "𝄞", "\r\n"])
            .prop_map(str::to_string),
    ]
}

fn json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(Value::from),
        text().prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map(text(), inner, 0..4)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

fn timestamp() -> impl Strategy<Value = Timestamp> {
    (
        Timestamp::MIN.as_second()..=Timestamp::MAX.as_second(),
        0i32..1_000_000_000,
    )
        .prop_map(|(seconds, nanos)| {
            Timestamp::new(seconds, nanos)
                .unwrap_or_else(|_| Timestamp::new(seconds, 0).expect("in range"))
        })
}

fn usd() -> impl Strategy<Value = Usd> {
    any::<u64>().prop_map(Usd::from_nanos)
}

fn usage() -> impl Strategy<Value = Usage> {
    (any::<u64>(), any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(i, o, w, r)| Usage {
        input_tokens: i,
        output_tokens: o,
        cache_write_tokens: w,
        cache_read_tokens: r,
    })
}

fn output() -> impl Strategy<Value = Output> {
    (
        prop_oneof![
            prop::collection::vec(any::<u8>(), 0..40),
            text().prop_map(String::into_bytes)
        ],
        any::<bool>(),
    )
        .prop_map(|(bytes, truncated)| Output { bytes, truncated })
}

fn phase() -> impl Strategy<Value = RunPhase> {
    prop::sample::select(RunPhase::all())
}

fn stop_reason() -> impl Strategy<Value = StopReason> {
    prop_oneof![
        Just(StopReason::EndTurn),
        Just(StopReason::ToolUse),
        Just(StopReason::MaxTokens),
        Just(StopReason::StopSequence),
        Just(StopReason::PauseTurn),
        Just(StopReason::Refusal),
        // A reason this version does not know (a known name would read as that reason).
        "[A-Z][a-z_]{0,10}".prop_map(StopReason::Other),
    ]
}

fn block() -> impl Strategy<Value = ContentBlock> {
    prop_oneof![
        text().prop_map(|text| ContentBlock::Text { text }),
        (text(), text(), json()).prop_map(|(id, name, input)| ContentBlock::ToolUse {
            id,
            name,
            input
        }),
        (text(), text(), any::<bool>()).prop_map(|(tool_use_id, content, is_error)| {
            ContentBlock::ToolResult {
                tool_use_id,
                content,
                is_error,
            }
        }),
    ]
}

fn intent() -> impl Strategy<Value = Intent> {
    prop_oneof![
        (
            text(),
            prop::option::of(text()),
            prop::collection::btree_map(text(), text(), 0..3),
            (
                any::<u32>(),
                any::<u64>(),
                any::<u32>(),
                any::<u64>(),
                any::<u64>(),
                any::<u64>()
            ),
            any::<bool>(),
        )
            .prop_map(
                |(key, image, env, (cpu, memory, processes, timeout, cap, disk), network)| {
                    Intent::CreateSandbox {
                        spec: SandboxSpec {
                            key,
                            image,
                            env,
                            limits: Limits {
                                cpu_millis: cpu,
                                memory_bytes: memory,
                                processes,
                                command_timeout_secs: timeout,
                                output_cap_bytes: cap,
                                disk_bytes: disk,
                            },
                            network,
                            egress: None,
                            egress_headers: Vec::new(),
                            links: Default::default(),
                        },
                    }
                }
            ),
        any::<u32>().prop_map(|turn| Intent::Route { turn }),
        (any::<u32>(), text(), usd(), any::<bool>()).prop_map(
            |(turn, model, reserved_usd, tools)| {
                Intent::CallModel {
                    turn,
                    model,
                    reserved_usd,
                    tools,
                }
            }
        ),
        (any::<u32>(), text(), text()).prop_map(|(turn, tool_use_id, command)| Intent::Command {
            turn,
            tool_use_id,
            command,
        }),
        (any::<u32>(), any::<u64>())
            .prop_map(|(turn, message_seq)| Intent::ReadMessage { turn, message_seq }),
        any::<u32>().prop_map(|turn| Intent::Answer { turn }),
        (text(), phase()).prop_map(|(id, then)| Intent::DestroySandbox {
            id: SandboxId(id),
            then
        }),
        (text(), json()).prop_map(|(action, config)| Intent::PostRunAction { action, config }),
    ]
}

/// A sandbox, on a host or not.
fn sandbox_info() -> impl Strategy<Value = SandboxInfo> {
    (text(), any::<bool>(), prop::option::of(text())).prop_map(|(id, isolated, host)| SandboxInfo {
        id: SandboxId(id),
        isolated,
        host,
    })
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        sandbox_info().prop_map(|info| Outcome::SandboxCreated { info }),
        (
            prop::option::of(prop::sample::select(Family::ALL.to_vec())),
            text(),
            prop::sample::select(vec![ChosenBy::Jev, ChosenBy::Fallback, ChosenBy::Agent]),
            usd(),
            prop::option::of(usage()),
            prop::option::of(text()),
        )
            .prop_map(
                |(family, model, chosen_by, cost_usd, usage, fallback_reason)| Outcome::Routed {
                    family,
                    model,
                    chosen_by,
                    cost_usd,
                    usage,
                    fallback_reason,
                }
            ),
        (
            text(),
            prop::collection::vec(block(), 0..3),
            stop_reason(),
            usage(),
            prop::option::of(text()),
            usd(),
        )
            .prop_map(
                |(model, content, stop_reason, usage, request_id, cost_usd)| {
                    Outcome::ModelReplied {
                        response: ModelResponse {
                            model,
                            content,
                            stop_reason,
                            usage,
                            request_id,
                        },
                        cost_usd,
                    }
                }
            ),
        (
            prop::option::of(any::<i32>()),
            output(),
            output(),
            any::<bool>(),
            prop::option::of(text()),
            prop::option::of(sandbox_info()),
        )
            .prop_map(
                |(exit_code, stdout, stderr, timed_out, stopped, remade_sandbox)| {
                    Outcome::CommandFinished {
                        output: ExecOutput {
                            exit_code,
                            stdout,
                            stderr,
                            timed_out,
                            stopped,
                        },
                        remade_sandbox,
                    }
                }
            ),
        Just(Outcome::MessageRead),
        Just(Outcome::Answered),
        Just(Outcome::SandboxDestroyed),
        prop::collection::btree_map(text(), text(), 0..3)
            .prop_map(|results| Outcome::ActionFinished { results }),
        (text(), any::<bool>()).prop_map(|(error, by_resolution)| Outcome::Failed {
            error,
            by_resolution
        }),
        Just(Outcome::Superseded),
        text().prop_map(|reason| Outcome::Stopped { reason }),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    (
        any::<u32>(),
        timestamp(),
        intent(),
        prop::option::of((timestamp(), outcome())),
    )
        .prop_map(|(seq, started_at, intent, completion)| Step {
            seq,
            started_at,
            intent,
            completion: completion.map(|(finished_at, outcome)| Completion {
                finished_at,
                outcome,
            }),
        })
}

/// Text that is almost a stored step: a real one with a few bytes changed, cut or repeated.
fn damaged(text: String, edits: &[(prop::sample::Index, u8, u8)]) -> String {
    let mut bytes = text.into_bytes();
    for (at, what, byte) in edits {
        if bytes.is_empty() {
            break;
        }
        let i = at.index(bytes.len());
        match what % 4 {
            0 => bytes[i] = *byte,
            1 => bytes.truncate(i),
            2 => {
                bytes.remove(i);
            }
            _ => {
                let tail = bytes[i..].to_vec();
                bytes.extend(tail);
            }
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

proptest! {
    /// A step, its intent and its completion stored apart, reads back exactly.
    #[test]
    fn fuzz_steps_read_back_from_their_stored_text(step in step()) {
        let stored = sql::step_text(&step).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let completion = step
            .completion
            .as_ref()
            .map(sql::completion_text)
            .transpose()
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let back = sql::read_step("r", &stored, completion.as_deref())
            .map_err(|e| TestCaseError::fail(format!("{e}: {stored} / {completion:?}")))?;
        prop_assert_eq!(back, step);
    }

    /// Arbitrary text, and real stored steps damaged, read as a corrupt journal or as some
    /// step: never a panic.
    #[test]
    fn fuzz_damaged_or_arbitrary_stored_text_is_refused(
        step in step(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), any::<u8>()), 1..4),
        garbage in prop_oneof!["\\PC{0,60}", ".{0,60}"],
    ) {
        let stored = sql::step_text(&step).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let completion = step.completion.as_ref().map(sql::completion_text).transpose()
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        for (text, completion) in [
            (damaged(stored.clone(), &edits), completion.clone()),
            (stored.clone(), completion.clone().map(|c| damaged(c, &edits))),
            (garbage.clone(), None),
            (stored, Some(garbage)),
        ] {
            match sql::read_step("r", &text, completion.as_deref()) {
                Ok(_) => {}
                Err(Error::Corrupt(message)) => prop_assert!(message.contains("journal of run r")),
                Err(other) => prop_assert!(false, "not a corrupt journal: {other}"),
            }
        }
    }
}

/// A run id no other case, test or process uses (a pid repeats across processes: the time too).
fn unique() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() % 1_000_000_000_000);
    format!(
        "fuzz-{}-{nanos}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Runs of generated steps, each appended, completed and read back through `store`.
fn journals_round_trip(store: &dyn Store, runtime: &tokio::runtime::Runtime) {
    let strategy = prop::collection::vec(step(), 1..4);
    let mut runner = TestRunner::new(Config::default());
    runner
        .run(&strategy, |steps| {
            runtime.block_on(async {
                let run = unique();
                let lease = Lease::new("fuzz", Timestamp::now(), Duration::from_secs(60));
                let fence = store.claim(&run, &lease).await.expect("claim");
                let mut expected = Vec::new();
                for (seq, mut step) in (0u32..).zip(steps) {
                    step.seq = seq;
                    let completion = step.completion.take();
                    store
                        .append_step(&run, fence, &step)
                        .await
                        .map_err(|e| TestCaseError::fail(format!("append {step:?}: {e}")))?;
                    if let Some(completion) = completion {
                        store
                            .complete_step(&run, fence, seq, &completion)
                            .await
                            .map_err(|e| {
                                TestCaseError::fail(format!("complete {completion:?}: {e}"))
                            })?;
                        step.completion = Some(completion);
                    }
                    expected.push(step);
                }
                let back = store
                    .journal(&run)
                    .await
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(back, expected);
                Ok(())
            })
        })
        .unwrap_or_else(|e| panic!("{e}"));
}

/// Text of labels, names and selectors: a few plain words and the characters that JSON
/// paths, SQL and JSON escapes treat specially.
fn word() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => prop::sample::select(vec!["a", "b", "app", "x.y", "a/b", ""]).prop_map(str::to_string),
        1 => prop::collection::vec(
            prop::sample::select(vec![
                "a", ".", "\"", "\\", "'", "$", "[", "]", "*", "?", " ", "é", "\u{0}", "\n", "%", "_", "/",
            ]),
            1..4,
        )
        .prop_map(|parts| parts.concat()),
    ]
}

/// A stored AgentRun-shaped document: labels, and fields a selector may name, of any JSON
/// type (`spec.group` and `status.phase`, which the SQL stores keep in columns, as the
/// strings the typed documents always hold).
fn listed_document() -> impl Strategy<Value = Value> {
    let no_nul = |v: &Value| !v.to_string().contains("\\u0000");
    (
        prop::collection::btree_map(word(), word(), 0..3),
        prop::option::of(prop_oneof![
            word().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<bool>().prop_map(Value::from),
            Just(Value::Null),
            Just(serde_json::json!({"a": "b"})),
        ]),
        prop::option::of(word()),
        prop::option::of(word()),
    )
        .prop_map(|(labels, agent, group, phase)| {
            let mut document =
                serde_json::json!({"metadata": {"labels": labels}, "spec": {}, "status": {}});
            if let Some(agent) = agent {
                document["spec"]["agent"] = agent;
            }
            if let Some(group) = group {
                document["spec"]["group"] = Value::from(group);
            }
            if let Some(phase) = phase {
                document["status"]["phase"] = Value::from(phase);
            }
            document
        })
        .prop_filter("documents as stored hold no NUL", no_nul)
}

fn selector() -> impl Strategy<Value = Selector> {
    (
        prop::collection::btree_map(word(), word(), 0..3),
        prop::collection::btree_map(
            prop_oneof![
                prop::sample::select(vec![
                    "spec.agent",
                    "spec.group",
                    "status.phase",
                    "metadata.name",
                    "metadata.labels.a",
                ])
                .prop_map(str::to_string),
                word(),
            ],
            word(),
            0..3,
        ),
    )
        .prop_map(|(labels, fields)| Selector { labels, fields })
}

/// Lists of documents by generated selectors: every backend returns the documents that
/// [`Selector::matches`] picks, in creation order, and none fails.
fn selectors_agree(store: &dyn Store, runtime: &tokio::runtime::Runtime) {
    let strategy = (
        prop::collection::vec(listed_document(), 0..6),
        prop::collection::vec(selector(), 1..6),
    );
    let mut runner = TestRunner::new(Config::default());
    runner
        .run(&strategy, |(documents, selectors)| {
            runtime.block_on(async {
                let project = unique();
                let mut names = Vec::new();
                for (i, mut document) in documents.into_iter().enumerate() {
                    let name = format!("r{i}");
                    document["metadata"]["name"] = Value::from(name.clone());
                    store
                        .create(
                            &ObjectKey::new(&project, Kind::AgentRun, &name),
                            document.clone(),
                        )
                        .await
                        .map_err(|e| TestCaseError::fail(format!("create {document}: {e}")))?;
                    names.push((name, document));
                }
                for selector in selectors {
                    let expected: Vec<&str> = names
                        .iter()
                        .filter(|(_, d)| selector.matches(d))
                        .map(|(n, _)| n.as_str())
                        .collect();
                    let listed = store
                        .list(&project, Kind::AgentRun, &selector)
                        .await
                        .map_err(|e| TestCaseError::fail(format!("list {selector:?}: {e}")))?;
                    let listed: Vec<&str> = listed.iter().map(|r| r.key.name.as_str()).collect();
                    prop_assert_eq!(listed, expected, "{:?}", selector);
                }
                Ok(())
            })
        })
        .unwrap_or_else(|e| panic!("{e}"));
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn sqlite(runtime: &tokio::runtime::Runtime) -> (crate::SqliteStore, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let store = runtime
        .block_on(crate::SqliteStore::open(dir.path().join("nodus.db")))
        .expect("open");
    (store, dir)
}

/// A store in a schema of its own on the test database; the test fails (never skips)
/// without one.
fn postgres(runtime: &tokio::runtime::Runtime) -> crate::PostgresStore {
    let url = match std::env::var("NODUS_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "NODUS_TEST_POSTGRES_URL is not set: run `eval \"$(scripts/test-env start)\"` first"
        ),
    };
    let schema = format!("t_{}", unique().replace('-', "_"));
    runtime
        .block_on(crate::PostgresStore::connect(
            crate::PostgresOptions::new(url).schema(schema),
        ))
        .expect("connect to the test database")
}

#[test]
fn fuzz_journals_round_trip_in_memory() {
    journals_round_trip(&crate::MemoryStore::new(), &runtime());
}

#[test]
fn fuzz_journals_round_trip_in_sqlite() {
    let runtime = runtime();
    let (store, _dir) = sqlite(&runtime);
    journals_round_trip(&store, &runtime);
}

#[test]
fn fuzz_journals_round_trip_in_postgres() {
    let runtime = runtime();
    journals_round_trip(&postgres(&runtime), &runtime);
}

#[test]
fn fuzz_selectors_list_alike_in_memory() {
    selectors_agree(&crate::MemoryStore::new(), &runtime());
}

#[test]
fn fuzz_selectors_list_alike_in_sqlite() {
    let runtime = runtime();
    let (store, _dir) = sqlite(&runtime);
    selectors_agree(&store, &runtime);
}

#[test]
fn fuzz_selectors_list_alike_in_postgres() {
    let runtime = runtime();
    selectors_agree(&postgres(&runtime), &runtime);
}
