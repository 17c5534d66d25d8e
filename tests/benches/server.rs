//! Server throughput on loopback, and the wall time of a 1,000-run group.
//!
//! `cargo bench -p nodus-tests --bench server`
//!
//! The embedded default (SQLite, process sandboxes started by Nodus's launcher as `nodus
//! server` starts them, the offline model) is started in this process; this binary is the
//! launcher too (`--nodus-launch`, as `nodus` is where `nodus-launch` is not installed beside
//! it). A small keep-alive HTTP/1.1 load generator measures requests per second for
//! `GET /healthz` (the baseline: the HTTP stack alone), `GET` of an agent, and run creation
//! (into a group whose cap admits nothing, so only creation is measured). Then a group of
//! 100 and a group of 1,000 runs (maxActive 100, each run one command in its own sandbox)
//! are timed from the first batch to the group's success; the difference divided by 900 is
//! the time per run beyond a fixed start.
//!
//! `NODUS_BENCH_STORE` (`memory:`) and `NODUS_BENCH_SANDBOX` (`unisolated`) swap a backend to
//! see where the time goes, `NODUS_BENCH_STARTER=bubblewrap` starts process sandboxes with
//! bubblewrap; `NODUS_BENCH_GROUPS_ONLY` skips the request rates,
//! `NODUS_BENCH_RATES_ONLY` the groups; `NODUS_BENCH_SYSTEM_BYTES` sizes the agent's system
//! prompt (1 byte by default), which every run's document carries in its snapshot.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{Connection, P, TOKEN, group_wall_time};
use nodus_server::{Options, SandboxKind, Server, StoreUrl};

const CONNECTIONS: usize = 16;
const SECONDS: u64 = 5;

type MakeRequest = Arc<dyn Fn(u64) -> (String, Option<String>) + Send + Sync>;

/// Requests per second of `make(i)` over `CONNECTIONS` connections for `SECONDS`.
async fn rate(address: SocketAddr, method: &'static str, make: MakeRequest, expect: u16) -> u64 {
    let counter = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let stop = Instant::now() + Duration::from_secs(SECONDS);
    let mut tasks = Vec::new();
    for _ in 0..CONNECTIONS {
        let (counter, done, make) = (counter.clone(), done.clone(), make.clone());
        tasks.push(tokio::spawn(async move {
            let mut connection = Connection::open(address).await;
            while Instant::now() < stop {
                let (path, body) = make(counter.fetch_add(1, Ordering::Relaxed));
                let (status, answer) = connection.request(method, &path, body.as_deref()).await;
                assert_eq!(status, expect, "{}", String::from_utf8_lossy(&answer));
                done.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    for task in tasks {
        task.await.expect("load task");
    }
    done.load(Ordering::Relaxed) / SECONDS
}

/// Requests per second for the health check (the baseline), an agent's `GET` and a run's
/// `POST`, printed.
async fn requests_per_second(address: SocketAddr) {
    let healthz = rate(
        address,
        "GET",
        Arc::new(|_| ("/healthz".to_string(), None)),
        200,
    )
    .await;
    let get = rate(
        address,
        "GET",
        Arc::new(|_| (format!("{P}/agents/bench"), None)),
        200,
    )
    .await;
    let create = rate(
        address,
        "POST",
        Arc::new(|i| {
            (
                format!("{P}/agentruns"),
                Some(format!(
                    r#"{{"apiVersion":"nodus.dev/v1","kind":"AgentRun","spec":{{"agent":"bench","group":"parked","taskKey":"c{i}","input":"hi"}}}}"#
                )),
            )
        }),
        201,
    )
    .await;
    println!(
        "requests per second on loopback ({CONNECTIONS} keep-alive connections, {SECONDS} s each):"
    );
    println!("  GET /healthz (baseline)     {healthz:>8}/s");
    println!(
        "  GET an agent                {get:>8}/s   ({}% of the baseline)",
        get * 100 / healthz.max(1)
    );
    println!(
        "  POST a run (create only)    {create:>8}/s   ({}% of the baseline)",
        create * 100 / healthz.max(1)
    );
}

fn main() -> std::process::ExitCode {
    // The sandbox launcher, before any thread starts.
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if let Some(code) = nodus_launch::run_if_asked(&args) {
        return code;
    }
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(bench());
    std::process::ExitCode::SUCCESS
}

async fn bench() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut options = Options::new(dir.path().join("data"));
    // NODUS_BENCH_STORE and NODUS_BENCH_SANDBOX choose other backends, to see where time goes.
    options.store = Some(match std::env::var("NODUS_BENCH_STORE") {
        Ok(url) => url.parse().expect("NODUS_BENCH_STORE"),
        Err(_) => StoreUrl::Sqlite(dir.path().join("nodus.db")),
    });
    options.sandbox = match std::env::var("NODUS_BENCH_SANDBOX") {
        Ok(kind) => kind.parse().expect("NODUS_BENCH_SANDBOX"),
        Err(_) => SandboxKind::Process,
    };
    options.sandbox_launcher = match std::env::var("NODUS_BENCH_STARTER").as_deref() {
        Ok("bubblewrap") => None,
        Ok(other) => panic!("NODUS_BENCH_STARTER={other:?}: only bubblewrap is another choice"),
        Err(_) => Some(std::env::current_exe().expect("this binary")),
    };
    options.bootstrap_token = Some(TOKEN.to_string());
    options.listen = "127.0.0.1:0".parse().expect("address");
    let server = Server::build(options).await.expect("server");
    // Which store and sandbox (and what starts it) this run measures.
    for line in &server.announcements {
        if line.starts_with("store") || line.starts_with("sandbox") {
            println!("{line}");
        }
    }
    let state = server.state();
    state
        .ledger
        .add("default", nodus_core::Usd::from_cents(100_000))
        .await
        .expect("credits");
    let bound = server.bind().await.expect("bind");
    let address = bound.local_addr();
    tokio::spawn(bound.serve(std::future::pending()));

    let mut connection = Connection::open(address).await;
    // NODUS_BENCH_SYSTEM_BYTES: the agent's system prompt, which every run's document copies.
    let system_bytes: usize = std::env::var("NODUS_BENCH_SYSTEM_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let agent = format!(
        r#"{{"apiVersion":"nodus.dev/v1","kind":"Agent","metadata":{{"name":"bench"}},"spec":{{"system":"{}","perRunMaxCostUSD":"0.10","maxTokens":1024}}}}"#,
        "s".repeat(system_bytes)
    );
    let agent = agent.as_str();
    let (status, body) = connection
        .request("POST", &format!("{P}/agents"), Some(agent))
        .await;
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let parked = r#"{"apiVersion":"nodus.dev/v1","kind":"AgentGroup","metadata":{"name":"parked"},"spec":{"agent":"bench","maxCostUSD":"0.00"}}"#;
    let (status, body) = connection
        .request("POST", &format!("{P}/agentgroups"), Some(parked))
        .await;
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));

    // NODUS_BENCH_GROUPS_ONLY skips the request rates (for iterating on the group figure).
    // NODUS_BENCH_RATES_ONLY skips the groups.
    if std::env::var_os("NODUS_BENCH_GROUPS_ONLY").is_none() {
        requests_per_second(address).await;
    }
    if std::env::var_os("NODUS_BENCH_RATES_ONLY").is_some() {
        return;
    }
    let hundred = group_wall_time(address, "g100", 100).await;
    let thousand = group_wall_time(address, "g1000", 1000).await;
    println!("group wall time, maxActive 100, one command per run in its own sandbox:");
    println!("  100 runs    {hundred:>8} ms");
    println!("  1000 runs   {thousand:>8} ms");
    println!(
        "  per run beyond a fixed start: {} µs",
        (thousand.saturating_sub(hundred)) * 1000 / 900
    );
}
