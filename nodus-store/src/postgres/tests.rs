//! The Postgres store against the conformance suite, each test in a schema of its own on the
//! real PostgreSQL that `scripts/test-env` starts (`NODUS_TEST_POSTGRES_URL`); two stores on
//! one schema as two replicas; and a database that goes down and comes back, through a TCP
//! proxy the test cuts.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use jiff::Timestamp;
use nodus_core::journal::{Intent, Step};
use nodus_core::resource::Kind;
use nodus_core::store::{Change, Error, Lease, MemberCap, ObjectKey, Store};
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::{PostgresOptions, PostgresStore};
use crate::conformance;

/// The test database's URL; a test fails (never skips) without it.
fn url() -> String {
    match std::env::var("NODUS_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => url,
        _ => panic!(
            "NODUS_TEST_POSTGRES_URL is not set: the Postgres store tests need a real \
             PostgreSQL. Run `eval \"$(scripts/test-env start)\"` first (scripts/test does)."
        ),
    }
}

/// A schema no other test or earlier run uses.
fn schema() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() % 1_000_000_000_000);
    format!(
        "t_{}_{nanos}_{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

async fn fresh() -> PostgresStore {
    PostgresStore::connect(PostgresOptions::new(url()).schema(schema()))
        .await
        .expect("connect to the test database")
}

/// Two stores on one new schema: two replicas of a server.
async fn two_replicas() -> (PostgresStore, PostgresStore) {
    two_replicas_in(&schema()).await
}

/// [`two_replicas`] on `schema`.
async fn two_replicas_in(schema: &str) -> (PostgresStore, PostgresStore) {
    let options = PostgresOptions::new(url()).schema(schema);
    let a = PostgresStore::connect(options.clone())
        .await
        .expect("replica a");
    let b = PostgresStore::connect(options).await.expect("replica b");
    (a, b)
}

/// Store group `name` of project `p`, running (open to runs).
async fn open_group(store: &PostgresStore, name: &str) -> nodus_core::store::Record {
    let document = json!({
        "metadata": {"name": name, "uid": format!("uid-{name}")},
        "spec": {"agent": "helper"},
        "status": {"phase": "Running"},
    });
    store
        .create(&ObjectKey::new("p", Kind::AgentGroup, name), document)
        .await
        .expect("the group")
}

macro_rules! cases {
    ($($case:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $case() {
            conformance::$case(fresh().await).await;
        }
    )*};
}

cases!(
    create_get_list_update_delete,
    list_selectors,
    list_sparse_known,
    list_pages,
    group_phases,
    optimistic_concurrency,
    concurrent_writers,
    atomic_edits,
    batch_atomicity_and_order,
    idempotent_batches,
    capped_batches,
    closed_groups,
    journal_in_order,
    complete_step_with_a_document,
    complete_step_with_a_snapshot,
    complete_step_with_the_next_step,
    fencing,
    messages,
    change_notification,
    delete_removes_journal_and_inbox,
    money_exact,
    leases,
    replicas_racing,
    retention,
    rewrite_run,
    extension_kinds,
    snapshots,
    snapshot_deltas,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn run_all_in_one_schema() {
    let store = fresh().await;
    conformance::run_all(|| store.clone()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reconnecting_to_a_migrated_schema_works() {
    let options = PostgresOptions::new(url()).schema(schema());
    let first = PostgresStore::connect(options.clone())
        .await
        .expect("first");
    let key = ObjectKey::new("p", Kind::Agent, "a");
    first.create(&key, json!({"n": 1})).await.expect("create");
    let second = PostgresStore::connect(options).await.expect("again");
    assert_eq!(second.get(&key).await.map(|r| r.version), Ok(1));
}

#[tokio::test]
async fn a_bad_schema_name_is_refused() {
    let result = PostgresStore::connect(PostgresOptions::new(url()).schema("x; DROP")).await;
    assert!(matches!(result, Err(Error::Invalid(_))), "{result:?}");
}

/// Two stores on one schema are two replicas: each run is claimed by exactly one, a
/// takeover after expiry fences the first, and one hears the other's changes (NOTIFY).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_on_one_database() {
    let (a, b) = two_replicas().await;
    let mut heard_by_b = b.subscribe();

    const RUNS: usize = 30;
    let mut uids = Vec::new();
    for i in 0..RUNS {
        let uid = format!("uid-{i}");
        let document = json!({"metadata": {"name": format!("r{i}"), "uid": uid},
            "status": {"phase": "Running"}});
        a.create(
            &ObjectKey::new("p", Kind::AgentRun, format!("r{i}")),
            document,
        )
        .await
        .expect("create");
        uids.push(uid);
    }
    // B hears A's writes.
    let first = tokio::time::timeout(Duration::from_secs(10), heard_by_b.recv())
        .await
        .expect("a notification in time")
        .expect("a change");
    assert_eq!(
        first,
        Change::Written(ObjectKey::new("p", Kind::AgentRun, "r0"), 1)
    );

    let at = Timestamp::from_second(1_700_000_000).expect("time");
    let race = |store: PostgresStore, owner: &'static str, uids: Vec<String>| async move {
        let lease = Lease::new(owner, at, Duration::from_secs(30));
        let mut mine = Vec::new();
        for uid in uids {
            match store.claim(&uid, &lease).await {
                Ok(fence) => mine.push((uid, fence)),
                Err(Error::Leased { .. }) => {}
                Err(other) => panic!("claim {uid}: {other}"),
            }
        }
        mine
    };
    // A claims from the first run on, B from the last: they meet.
    let backwards: Vec<String> = uids.iter().rev().cloned().collect();
    let (from_a, from_b) = tokio::join!(
        tokio::spawn(race(a.clone(), "a", uids.clone())),
        tokio::spawn(race(b.clone(), "b", backwards))
    );
    let (from_a, from_b) = (from_a.expect("a's task"), from_b.expect("b's task"));
    let mut all: Vec<String> = from_a
        .iter()
        .chain(&from_b)
        .map(|(uid, _)| uid.clone())
        .collect();
    all.sort();
    let mut expected = uids.clone();
    expected.sort();
    assert_eq!(all, expected, "every run claimed exactly once");

    // B takes one of A's runs over after expiry; A's fence is refused.
    let (taken, taken_fence) = from_a.first().or(from_b.first()).expect("a claim").clone();
    let later = Timestamp::from_second(1_700_000_031).expect("time");
    let fence = b
        .claim(&taken, &Lease::new("c", later, Duration::from_secs(30)))
        .await
        .expect("takeover after expiry");
    let step = Step {
        seq: 0,
        started_at: later,
        intent: Intent::Route { turn: 0 },
        completion: None,
    };
    assert_eq!(
        a.append_step(&taken, taken_fence, &step).await,
        Err(Error::Fenced { run: taken.clone() })
    );
    a.append_step(&taken, fence, &step)
        .await
        .expect("the new fence writes through either replica");
}

/// Two replicas editing one document at once (as runs on both reserve against one account)
/// lose no edit: each edit transaction reads the document locked (`FOR UPDATE`, the
/// dialect's `LOCK_FOR_UPDATE`) before it writes the next version.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_editing_one_document_lose_no_edit() {
    let (a, b) = two_replicas().await;
    let key = ObjectKey::new("p", Kind::Budget, "account");
    a.create(
        &key,
        json!({"metadata": {"name": "account"}, "spec": {"count": 0}}),
    )
    .await
    .expect("create");
    const EDITS: u64 = 60;
    let edits = |store: PostgresStore, key: ObjectKey| async move {
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..EDITS {
            let (store, key) = (store.clone(), key.clone());
            tasks.spawn(async move {
                store
                    .modify(
                        &key,
                        Box::new(|document: &serde_json::Value| {
                            let mut next = document.clone();
                            let count = next["spec"]["count"].as_u64().expect("a count");
                            next["spec"]["count"] = json!(count + 1);
                            Some(next)
                        }),
                    )
                    .await
                    .expect("edit");
            });
        }
        while let Some(done) = tasks.join_next().await {
            done.expect("an edit's task");
        }
    };
    tokio::join!(edits(a.clone(), key.clone()), edits(b.clone(), key.clone()));
    let record = a.get(&key).await.expect("get");
    assert_eq!(
        record.document["spec"]["count"],
        json!(2 * EDITS),
        "no edit lost"
    );
    assert_eq!(record.version, 1 + 2 * EDITS, "one version per edit");
}

/// Two replicas admitting runs to one group at once keep its cap: sixteen batches of one run
/// each, half through each replica, into a group whose runs may be four unfinished, some of
/// them with a phase and some without (two counters, so the counters' row locks alone would
/// not order them): four are written, the others refused with `OverCap`.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_admitting_at_once_keep_a_group_s_cap() {
    let (a, b) = two_replicas().await;
    open_group(&a, "g").await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..16 {
        let store = if i % 2 == 0 { a.clone() } else { b.clone() };
        tasks.spawn(async move {
            let name = format!("r{i}");
            let mut document = json!({
                "metadata": {"name": name, "uid": format!("uid-{i}")},
                "spec": {"agent": "helper", "group": "g"},
                "status": {},
            });
            if i % 4 < 2 {
                document["status"]["phase"] = json!("Pending");
            }
            let cap = MemberCap {
                project: "p".to_string(),
                group: "g".to_string(),
                at_most: 4,
            };
            store
                .create_batch_within(
                    vec![(ObjectKey::new("p", Kind::AgentRun, &name), document)],
                    None,
                    &[cap],
                )
                .await
        });
    }
    let mut passed = 0;
    while let Some(done) = tasks.join_next().await {
        match done.expect("a batch's task") {
            Ok(_) => passed += 1,
            Err(Error::OverCap { at_most: 4, .. }) => {}
            Err(other) => panic!("{other}"),
        }
    }
    assert_eq!(passed, 4);
    let phases = a.group_phases("p", "g").await.expect("phases");
    let unfinished: u64 = phases.iter().map(|(_, n)| n).sum();
    assert_eq!(unfinished, 4, "{phases:?}");
}

/// A group sealed on one replica while a batch joins it on another: the batch that reads the
/// group after the seal began waits for it and is refused (the seal takes the group's lock
/// before its row's).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_group_sealed_on_one_replica_takes_no_batch_begun_on_another_meanwhile() {
    closed_while_a_batch_joins(true).await;
}

/// As [`a_group_sealed_on_one_replica_takes_no_batch_begun_on_another_meanwhile`], a group
/// deleted: the batch is refused, and leaves no run of a group that is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_group_deleted_on_one_replica_takes_no_batch_begun_on_another_meanwhile() {
    closed_while_a_batch_joins(false).await;
}

/// Group `g` sealed (or deleted) through one replica while a batch joins it through another:
/// the closing write is held by a third connection's lock on the group's row (as a slow write
/// would be), and the batch begun only once it waits for that lock.
async fn closed_while_a_batch_joins(seal: bool) {
    let schema = schema();
    let (a, b) = two_replicas_in(&schema).await;
    let group = open_group(&a, "g").await;
    let mut holder = <sqlx::PgConnection as sqlx::Connection>::connect(&url())
        .await
        .expect("a third connection");
    for statement in [format!("SET search_path TO {schema}"), "BEGIN".to_string()] {
        sqlx::query(&statement)
            .execute(&mut holder)
            .await
            .expect(&statement);
    }
    sqlx::query("SELECT 1 FROM resources WHERE kind = 'agentgroups' AND name = 'g' FOR UPDATE")
        .execute(&mut holder)
        .await
        .expect("the group's row held");
    let holder_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut holder)
        .await
        .expect("the holder's pid");
    // Who waits for whom, asked outside a transaction: one sees `pg_stat_activity` as it was
    // at its first read.
    let mut watcher = <sqlx::PgConnection as sqlx::Connection>::connect(&url())
        .await
        .expect("a fourth connection");

    let mut closing = tokio::spawn({
        let (a, key) = (a.clone(), group.key.clone());
        let mut sealed = group.document.clone();
        sealed["spec"]["sealed"] = json!(true);
        async move {
            match seal {
                true => a.update(&key, group.version, sealed).await.map(drop),
                false => a.delete(&key).await,
            }
        }
    });
    let closing_pid = blocked_by(&mut watcher, holder_pid, &mut closing)
        .await
        .expect("the closing write waits for the group's row");
    let document = json!({
        "metadata": {"name": "late", "uid": "uid-late"},
        "spec": {"agent": "helper", "group": "g"},
        "status": {},
    });
    let cap = MemberCap {
        project: "p".to_string(),
        group: "g".to_string(),
        at_most: 100,
    };
    let mut batch = tokio::spawn(async move {
        b.create_batch_within(
            vec![(ObjectKey::new("p", Kind::AgentRun, "late"), document)],
            None,
            &[cap],
        )
        .await
    });
    // The batch waits for the closing write (or, were that not to lock the group first, is
    // written at once: then it is over before it waits).
    blocked_by(&mut watcher, closing_pid, &mut batch).await;
    sqlx::query("COMMIT")
        .execute(&mut holder)
        .await
        .expect("the row let go");
    closing
        .await
        .expect("the closing task")
        .expect("the group closed");
    let refused = batch.await.expect("the batch's task");
    match seal {
        true => assert_eq!(
            refused,
            Err(Error::GroupClosed {
                project: "p".to_string(),
                group: "g".to_string(),
            })
        ),
        false => assert_eq!(refused, Err(Error::NotFound(group.key))),
    }
    assert!(matches!(
        a.get(&ObjectKey::new("p", Kind::AgentRun, "late")).await,
        Err(Error::NotFound(_))
    ));
}

/// The pid of the backend that waits for backend `pid`'s lock, asked through `conn` until one
/// does (or the task `done` ends first: then `None`).
async fn blocked_by<T>(
    conn: &mut sqlx::PgConnection,
    pid: i32,
    done: &mut tokio::task::JoinHandle<T>,
) -> Option<i32> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let waiting: Option<i32> = sqlx::query_scalar(
            "SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid)) LIMIT 1",
        )
        .bind(pid)
        .fetch_optional(&mut *conn)
        .await
        .expect("pg_stat_activity");
        if waiting.is_some() {
            return waiting;
        }
        if done.is_finished() {
            return None;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "nothing waits for backend {pid}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A TCP proxy to the database that the test can cut (every connection dropped, new ones
/// refused) and restore: the database going down and coming back.
struct Proxy {
    port: u16,
    up: watch::Sender<bool>,
}

impl Proxy {
    async fn start(upstream: String) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("addr").port();
        let (up, watching) = watch::channel(true);
        tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    return;
                };
                let mut watching = watching.clone();
                if !*watching.borrow() {
                    continue; // dropped: refused
                }
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    let Ok(mut server) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = watching.wait_for(|up| !*up) => {}
                    }
                });
            }
        });
        Proxy { port, up }
    }

    fn set(&self, up: bool) {
        self.up.send_replace(up);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_database_that_goes_down_is_unavailable_then_back() {
    let url = url();
    let parsed: sqlx::postgres::PgConnectOptions = url.parse().expect("url");
    let proxy = Proxy::start(format!("{}:{}", parsed.get_host(), parsed.get_port())).await;
    let through_proxy = {
        let rest = url.split_once('@').map_or(url.as_str(), |(_, rest)| rest);
        let (_, path) = rest.split_once('/').unwrap_or((rest, "postgres"));
        let user = parsed.get_username();
        format!("postgres://{user}@127.0.0.1:{}/{path}", proxy.port)
    };
    let mut options = PostgresOptions::new(through_proxy).schema(schema());
    options.acquire_timeout = Duration::from_secs(2);
    let store = Arc::new(PostgresStore::connect(options).await.expect("connect"));
    let key = ObjectKey::new("p", Kind::AgentRun, "r");
    store
        .create(&key, json!({"metadata": {"uid": "u"}}))
        .await
        .expect("create while up");
    let fence = store
        .claim(
            "u",
            &Lease::new("a", Timestamp::UNIX_EPOCH, Duration::from_secs(30)),
        )
        .await
        .expect("claim");

    proxy.set(false);
    let step = Step {
        seq: 0,
        started_at: Timestamp::UNIX_EPOCH,
        intent: Intent::Route { turn: 0 },
        completion: None,
    };
    for _ in 0..3 {
        let got = store.get(&key).await;
        assert!(
            matches!(&got, Err(e @ Error::Unavailable(_)) if e.is_retryable()),
            "a read while down: {got:?}"
        );
        let appended = store.append_step("u", fence, &step).await;
        assert!(
            matches!(&appended, Err(Error::Unavailable(_))),
            "a journal write while down: {appended:?}"
        );
        let updated = store.update(&key, 1, json!({})).await;
        assert!(
            matches!(&updated, Err(Error::Unavailable(_))),
            "{updated:?}"
        );
    }

    proxy.set(true);
    let mut back = None;
    for _ in 0..50 {
        match store.get(&key).await {
            Ok(record) => {
                back = Some(record);
                break;
            }
            Err(Error::Unavailable(_)) => tokio::time::sleep(Duration::from_millis(200)).await,
            Err(e) => panic!("after the database came back: {e}"),
        }
    }
    assert_eq!(back.map(|r| r.version), Some(1), "the store works again");
    store
        .append_step("u", fence, &step)
        .await
        .expect("the journal writer works again");
    assert_eq!(store.journal("u").await.map(|j| j.len()), Ok(1));
}

#[tokio::test]
async fn no_database_at_all_is_unavailable() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    let mut options =
        PostgresOptions::new(format!("postgres://postgres@127.0.0.1:{port}/postgres"));
    options.acquire_timeout = Duration::from_secs(1);
    let result = PostgresStore::connect(options).await;
    assert!(
        matches!(&result, Err(e @ Error::Unavailable(_)) if e.is_retryable()),
        "{result:?}"
    );
}

#[tokio::test]
async fn group_members_can_be_found_through_the_index() {
    let store = fresh().await;
    let selector = nodus_core::store::Selector::in_group("g");
    let mut query: sqlx::QueryBuilder<sqlx::Postgres> =
        sqlx::QueryBuilder::new("EXPLAIN SELECT name FROM resources WHERE project = ");
    crate::reads::Reads::<sqlx::Postgres>::push_selection(
        &mut query,
        "p",
        Kind::AgentRun,
        &selector,
    );
    let mut tx = store.inner.pool.begin().await.expect("begin");
    // An empty table is read whole whatever the indexes; forbid that to see whether the
    // query's expression matches the index at all.
    sqlx::query("SET LOCAL enable_seqscan = off")
        .execute(&mut *tx)
        .await
        .expect("set");
    let rows = query.build().fetch_all(&mut *tx).await.expect("explain");
    let plan: Vec<String> = rows
        .iter()
        .map(|row| sqlx::Row::get::<String, _>(row, 0))
        .collect();
    let plan = plan.join("\n");
    assert!(plan.contains("resources_group"), "{plan}");
}
