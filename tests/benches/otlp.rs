//! The cost of trace export on the 1,000-run group: the same group timed in one process with
//! the OTLP exporter off, on (a collector that takes every request), and on with the endpoint
//! down (nothing listens), the three interleaved, each round on a fresh server.
//!
//! `cargo bench -p nodus-tests --bench otlp` (`NODUS_BENCH_ROUNDS`, 3 by default;
//! `NODUS_BENCH_SANDBOX`, unisolated by default, as the exporter's cost shows most where a
//! run costs least). The collector here is a minimal HTTP/1.1 responder in this process that
//! counts the requests and bytes it takes and discards them (decoding is the test's job,
//! tests/tests/telemetry.rs); it answers 200 with an empty ExportTraceServiceResponse.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use common::{P, TOKEN, group_wall_time};
use nodus_core::telemetry::Content;
use nodus_server::telemetry::OtlpOptions;
use nodus_server::{Options, SandboxKind, Server, StoreUrl};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

fn main() -> std::process::ExitCode {
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

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Off,
    On,
    Down,
}

/// Requests and body bytes the collector took.
#[derive(Default)]
struct Taken {
    requests: AtomicU64,
    bytes: AtomicU64,
}

/// A collector that answers every POST with 200 and counts what it took.
async fn collector(taken: Arc<Taken>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let taken = taken.clone();
            tokio::spawn(async move {
                let (read, mut write) = stream.into_split();
                let mut read = BufReader::new(read);
                loop {
                    let mut length = 0usize;
                    let mut line = String::new();
                    loop {
                        line.clear();
                        if read.read_line(&mut line).await.unwrap_or(0) == 0 {
                            return;
                        }
                        let header = line.trim_end();
                        if header.is_empty() {
                            break;
                        }
                        if let Some((name, value)) = header.split_once(':')
                            && name.eq_ignore_ascii_case("content-length")
                        {
                            length = value.trim().parse().unwrap_or(0);
                        }
                    }
                    let mut body = vec![0u8; length];
                    if read.read_exact(&mut body).await.is_err() {
                        return;
                    }
                    taken.requests.fetch_add(1, Ordering::Relaxed);
                    taken.bytes.fetch_add(length as u64, Ordering::Relaxed);
                    let answer = "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
                    if write.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    address
}

/// A fresh server in `mode`; the group's wall time and this process's CPU time during it, and
/// its span counters once every span is exported or dropped.
async fn round(mode: Mode, collector: SocketAddr) -> (u128, u64, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut options = Options::new(dir.path().join("data"));
    options.store = Some(StoreUrl::Sqlite(dir.path().join("nodus.db")));
    options.sandbox = match std::env::var("NODUS_BENCH_SANDBOX") {
        Ok(kind) => kind.parse().expect("NODUS_BENCH_SANDBOX"),
        Err(_) => SandboxKind::Unisolated,
    };
    options.sandbox_launcher = Some(std::env::current_exe().expect("this binary"));
    options.bootstrap_token = Some(TOKEN.to_string());
    options.listen = "127.0.0.1:0".parse().expect("address");
    let down = common::free_port_address();
    options.otlp = match mode {
        Mode::Off => None,
        Mode::On => Some(OtlpOptions {
            endpoint: format!("http://{collector}"),
            content: Content::Off,
        }),
        Mode::Down => Some(OtlpOptions {
            endpoint: format!("http://{down}"),
            content: Content::Off,
        }),
    };
    let server = Server::build(options).await.expect("server");
    let state = server.state();
    state
        .ledger
        .add("default", nodus_core::Usd::from_cents(100_000))
        .await
        .expect("credits");
    let bound = server.bind().await.expect("bind");
    let address = bound.local_addr();
    tokio::spawn(bound.serve(std::future::pending()));
    let mut connection = common::Connection::open(address).await;
    let agent = r#"{"apiVersion":"nodus.dev/v1","kind":"Agent","metadata":{"name":"bench"},"spec":{"system":"s","perRunMaxCostUSD":"0.10","maxTokens":1024}}"#;
    let (status, body) = connection
        .request("POST", &format!("{P}/agents"), Some(agent))
        .await;
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let cpu = nodus_core::testing::process_cpu();
    let millis = group_wall_time(address, "g1000", 1000).await;
    let cpu =
        u64::try_from((nodus_core::testing::process_cpu() - cpu).as_millis()).unwrap_or(u64::MAX);
    // Wait until every span is accounted for (exported or dropped): 7 steps and the run's
    // span per run, and the group's.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        // A new connection each time: the first one idled past the header timeout.
        let mut connection = common::Connection::open(address).await;
        let (_, body) = connection.request("GET", "/metrics", None).await;
        let text = String::from_utf8_lossy(&body).to_string();
        let counted: u64 = text
            .lines()
            .filter(|l| l.starts_with("nodus_otlp_spans"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
            .sum();
        if mode == Mode::Off || counted >= 8001 || std::time::Instant::now() > deadline {
            let counters = text
                .lines()
                .filter(|l| l.starts_with("nodus_otlp_spans"))
                .collect::<Vec<_>>()
                .join("; ");
            return (millis, cpu, counters);
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

async fn bench() {
    let taken = Arc::new(Taken::default());
    let collector = collector(taken.clone()).await;
    let rounds: usize = std::env::var("NODUS_BENCH_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let mut times: Vec<(Mode, u128, u64)> = Vec::new();
    for r in 0..rounds {
        for mode in [Mode::Off, Mode::On, Mode::Down] {
            let before = taken.requests.load(Ordering::Relaxed);
            let (millis, cpu, counters) = round(mode, collector).await;
            let requests = taken.requests.load(Ordering::Relaxed) - before;
            println!(
                "round {r} {mode:?}: 1000-run group {millis} ms, {cpu} ms CPU; collector took {requests} requests; {counters}"
            );
            times.push((mode, millis, cpu));
        }
    }
    let ratio = |t: u128, o: u128| format!("{}.{:02}", t / o, (t % o) * 100 / o);
    let of = |mode: Mode| -> Vec<(u128, u128)> {
        times
            .iter()
            .filter(|(m, _, _)| *m == mode)
            .map(|(_, t, c)| (*t, u128::from(*c)))
            .collect()
    };
    let off = of(Mode::Off);
    for mode in [Mode::On, Mode::Down] {
        let pairs: Vec<String> = of(mode)
            .iter()
            .zip(&off)
            .map(|((t, c), (ot, oc))| format!("{} ({} CPU)", ratio(*t, *ot), ratio(*c, *oc)))
            .collect();
        println!("{mode:?} / Off per round, wall (CPU): {}", pairs.join(", "));
    }
    println!(
        "collector took {} bytes in all",
        taken.bytes.load(Ordering::Relaxed)
    );
}
