//! The server as a process of its own under load, with 10,000 waiting runs, and killed in the
//! middle of 100 commands (issue 18 item 9, issue 19).
//!
//! `cargo bench -p nodus-tests --bench server_load` (with `scripts/test-env start` run once,
//! for bubblewrap). `NODUS_BENCH_PART` picks one part: `load`, `waiting` or `killed` (all by
//! default).
//!
//! The server is the embedded default (SQLite, bubblewrap sandboxes, the offline model) built
//! by `nodus_server::Server` with the options `nodus server` gives it, in a process of its own:
//! this benchmark's binary started again with `NODUS_BENCH_SERVE` naming its directory, so
//! that it can be measured from outside (resident memory, threads, processes) and killed with
//! SIGKILL. It also writes its runtime's count of live tokio tasks to a file there.
//!
//! - `load`: 200 clients, each on its own keep-alive connection, for 60 s (`NODUS_BENCH_LOAD_SECONDS`),
//!   each repeating: `GET /healthz` (the baseline, under the same load), create a run (one
//!   command), read it, list its own runs (by label), and watch it (long polls) until it
//!   succeeds. Errors are counted (any is a defect), latencies per request kind given as
//!   percentiles, and the server's resident memory before, at the end, and after its runs
//!   ended and a minute idle (`NODUS_BENCH_IDLE_SECONDS`).
//! - `waiting`: 10,000 keepAlive runs (`NODUS_BENCH_WAITING`), 100 groups of 100, each run's
//!   first turn one command, all then waiting for a message: the server's memory, threads,
//!   processes and tasks against the same server idle with no runs; then SIGKILL and restart:
//!   the time to healthy, to the answer of a message sent at once, and until the server is
//!   idle again (its runner has looked at every run), and its memory then.
//! - `killed`: 100 runs in `sleep` commands when the server is SIGKILLed; the time from restart
//!   until all are parked in `NeedsResolution` (a command interrupted by a crash is not
//!   repeated by itself) and until all are running again once `retry` is asked for each: one
//!   after the other on one connection, then (killed again) all at once, a connection each.
//!   Baseline: the same server's restart to healthy with no runs.

mod common;

use std::collections::HashMap;
use std::io::{BufRead as _, Write as _};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Connection, P, TOKEN};
use nodus_server::{Options, SandboxKind, Server, StoreUrl};

/// Set in the server's process: its directory.
const SERVE: &str = "NODUS_BENCH_SERVE";
/// Set in the server's process on its first start: add credits.
const CREDITS: &str = "NODUS_BENCH_CREDITS";
/// The command of the runs killed mid-command: a duration no other process uses, to count
/// them.
const SLEEP: [&str; 2] = ["sleep", "30.0719"];

fn main() {
    if let Some(dir) = std::env::var_os(SERVE) {
        serve(PathBuf::from(dir));
        return;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let part = std::env::var("NODUS_BENCH_PART").unwrap_or_default();
    runtime.block_on(async {
        if part.is_empty() || part == "load" {
            load().await;
        }
        if part.is_empty() || part == "waiting" {
            waiting().await;
        }
        if part.is_empty() || part == "killed" {
            killed().await;
        }
    });
}

/// The server's process: build the embedded default in `dir`, print the address it listens
/// on, and serve until killed.
fn serve(dir: PathBuf) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let mut options = Options::new(dir.join("data"));
        options.store = Some(StoreUrl::Sqlite(dir.join("nodus.db")));
        options.sandbox = SandboxKind::Process;
        options.bootstrap_token = Some(TOKEN.to_string());
        options.listen = "127.0.0.1:0".parse().expect("address");
        let server = Server::build(options).await.expect("server");
        if std::env::var_os(CREDITS).is_some() {
            server
                .state()
                .ledger
                .add("default", nodus_core::Usd::from_cents(10_000_000))
                .await
                .expect("credits");
        }
        let bound = server.bind().await.expect("bind");
        let mut out = std::io::stdout();
        writeln!(out, "{}", bound.local_addr()).expect("stdout");
        out.flush().expect("stdout");
        // The runtime's live tasks (this one among them), for the benchmark to read.
        let tasks = dir.join("tasks");
        tokio::spawn(async move {
            let metrics = tokio::runtime::Handle::current().metrics();
            loop {
                let next = tasks.with_extension("next");
                if std::fs::write(&next, metrics.num_alive_tasks().to_string()).is_ok() {
                    let _ = std::fs::rename(&next, &tasks);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        bound.serve(std::future::pending()).await.expect("serve");
    });
}

/// A server process.
struct ServerProcess {
    child: Child,
    address: SocketAddr,
    dir: PathBuf,
    /// When the process was started.
    started: Instant,
}

impl ServerProcess {
    /// Start the server over `dir` and wait until `/healthz` answers; also the time that took.
    async fn start(dir: &Path, first: bool) -> (ServerProcess, Duration) {
        let started = Instant::now();
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(dir.join("server.log"))
            .expect("log");
        let mut command = Command::new(std::env::current_exe().expect("this binary"));
        command
            .env(SERVE, dir)
            .env_remove("ANTHROPIC_API_KEY")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log);
        if first {
            command.env(CREDITS, "1");
        }
        let mut child = command.spawn().expect("the server starts");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("the server's address");
        let Ok(address) = line.trim().parse() else {
            panic!(
                "the server did not start ({line:?}); its log:\n{}",
                std::fs::read_to_string(dir.join("server.log")).unwrap_or_default()
            )
        };
        loop {
            if let Ok(mut connection) = Connection::try_open(address).await
                && let Ok((200, _)) = connection.try_request("GET", "/healthz", None).await
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let healthy = started.elapsed();
        (
            ServerProcess {
                child,
                address,
                dir: dir.to_path_buf(),
                started,
            },
            healthy,
        )
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, as a crash.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// What the process holds now.
    fn usage(&self) -> Usage {
        let pid = self.pid();
        Usage {
            rss_kib: status_field(pid, "VmRSS"),
            threads: status_field(pid, "Threads"),
            processes: descendants(pid),
            tasks: std::fs::read_to_string(self.dir.join("tasks"))
                .ok()
                .and_then(|t| t.trim().parse().ok())
                .unwrap_or(0),
        }
    }

    /// Wait until the process has used no more than 20 ms of CPU in 500 ms (its work is done);
    /// when the quiet half second began.
    async fn quiet(&self) -> Instant {
        quiet(self.pid()).await
    }
}

/// Wait until process `pid` has used no more than 20 ms of CPU in 500 ms (looked at every
/// 100 ms); when the quiet half second began.
async fn quiet(pid: u32) -> Instant {
    let mut samples = std::collections::VecDeque::new();
    loop {
        samples.push_back((Instant::now(), cpu_ticks(pid)));
        if samples.len() > 6 {
            samples.pop_front();
        }
        if let (Some(first), Some(last)) = (samples.front(), samples.back())
            && samples.len() == 6
            && last.1.saturating_sub(first.1) <= 2
        {
            return first.0;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Resident memory, threads, processes below the server, live tokio tasks.
#[derive(Debug, Clone, Copy)]
struct Usage {
    rss_kib: u64,
    threads: u64,
    processes: usize,
    tasks: u64,
}

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "RSS {:.1} MiB, {} threads, {} processes below it, {} tokio tasks",
            mib(self.rss_kib),
            self.threads,
            self.processes,
            self.tasks
        )
    }
}

/// KiB as MiB with one decimal, for printing only.
#[allow(clippy::float_arithmetic)]
fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

/// A numeric field of `/proc/PID/status` (`VmRSS` in KiB, `Threads`).
fn status_field(pid: u32, name: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key == name).then(|| value.split_whitespace().next()?.parse().ok())?
        })
        .unwrap_or(0)
}

/// User and system CPU ticks of a process.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    // After the command: state (0), ppid (1), …, utime (11), stime (12).
    let tick = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
    tick(11).unwrap_or(0) + tick(12).unwrap_or(0)
}

/// Every process: its pid, its parent's and its command line.
fn processes() -> Vec<(u32, u32, Vec<String>)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let pid: u32 = entry.ok()?.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let ppid = stat
                .rsplit_once(')')?
                .1
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let args = cmdline
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            Some((pid, ppid, args))
        })
        .collect()
}

/// How many processes descend from `pid`.
fn descendants(pid: u32) -> usize {
    let all = processes();
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(all.iter().filter(|p| p.1 == parent).map(|p| p.0));
        i += 1;
    }
    found.len() - 1
}

/// How many processes run exactly `args`.
fn running(args: &[&str]) -> usize {
    processes().iter().filter(|p| p.2 == args).count()
}

/// A fresh directory for a server; the sandbox area a root server keeps outside it is
/// removed with it.
struct Scratch {
    dir: tempfile::TempDir,
}

impl Scratch {
    fn new() -> Scratch {
        Scratch {
            dir: tempfile::tempdir().expect("tempdir"),
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(nodus_server::default_sandbox_dir(
            &self.dir.path().join("data"),
        ));
    }
}

/// Send a request that must be answered `expect`, and parse the answer.
async fn call(
    connection: &mut Connection,
    method: &str,
    path: &str,
    body: Option<&str>,
    expect: u16,
) -> serde_json::Value {
    let (status, answer) = connection.request(method, path, body).await;
    assert_eq!(
        status,
        expect,
        "{method} {path}: {}",
        String::from_utf8_lossy(&answer)
    );
    serde_json::from_slice(&answer).unwrap_or(serde_json::Value::Null)
}

/// The agent every run uses.
async fn create_agent(address: SocketAddr) {
    let mut connection = Connection::open(address).await;
    let agent = r#"{"apiVersion":"nodus.dev/v1","kind":"Agent","metadata":{"name":"bench"},"spec":{"system":"s","perRunMaxCostUSD":"0.10","maxTokens":1024}}"#;
    call(
        &mut connection,
        "POST",
        &format!("{P}/agents"),
        Some(agent),
        201,
    )
    .await;
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn millis(duration: Duration) -> u128 {
    duration.as_millis()
}

// ---------------------------------------------------------------------------------------
// load

/// What one client saw: latencies in microseconds by request kind, and errors.
#[derive(Default)]
struct Seen {
    latencies: HashMap<&'static str, Vec<u64>>,
    errors: Vec<String>,
    runs: u64,
}

impl Seen {
    /// Send a request, time it, and check its status.
    async fn timed(
        &mut self,
        connection: &mut Connection,
        kind: &'static str,
        method: &str,
        path: &str,
        body: Option<&str>,
        expect: u16,
    ) -> Result<serde_json::Value, String> {
        let started = Instant::now();
        let answer = connection.try_request(method, path, body).await;
        let took = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        let (status, answer) = answer.map_err(|e| format!("{kind}: {method} {path}: {e}"))?;
        if status != expect {
            return Err(format!(
                "{kind}: {method} {path}: {status} {}",
                String::from_utf8_lossy(&answer)
            ));
        }
        self.latencies.entry(kind).or_default().push(took);
        serde_json::from_slice(&answer).map_err(|e| format!("{kind}: {method} {path}: {e}"))
    }

    /// One round of a client: health, create, read, list, watch until the run ends.
    async fn round(
        &mut self,
        connection: &mut Connection,
        client: usize,
        round: u64,
    ) -> Result<(), String> {
        let started = Instant::now();
        let (status, answer) = connection
            .try_request("GET", "/healthz", None)
            .await
            .map_err(|e| format!("healthz: {e}"))?;
        if status != 200 {
            return Err(format!(
                "healthz: {status} {}",
                String::from_utf8_lossy(&answer)
            ));
        }
        let took = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.latencies
            .entry("GET /healthz (baseline)")
            .or_default()
            .push(took);
        let name = format!("c{client}-{round}");
        let run = format!(
            r#"{{"apiVersion":"nodus.dev/v1","kind":"AgentRun","metadata":{{"name":"{name}","labels":{{"client":"c{client}"}}}},"spec":{{"agent":"bench","input":"Run `echo {name}`"}}}}"#
        );
        let started = Instant::now();
        self.timed(
            connection,
            "POST a run",
            "POST",
            &format!("{P}/agentruns"),
            Some(&run),
            201,
        )
        .await?;
        let read = self
            .timed(
                connection,
                "GET the run",
                "GET",
                &format!("{P}/agentruns/{name}"),
                None,
                200,
            )
            .await?;
        let list = self
            .timed(
                connection,
                "GET the client's runs (label selector)",
                "GET",
                &format!("{P}/agentruns?labelSelector=client=c{client}"),
                None,
                200,
            )
            .await?;
        let listed = list["items"].as_array().map_or(0, Vec::len);
        if listed != usize::try_from(round + 1).unwrap_or(0) {
            return Err(format!(
                "list of c{client}'s runs: {listed} runs after {} created",
                round + 1
            ));
        }
        let mut run = read;
        loop {
            match run["status"]["phase"].as_str() {
                Some("Succeeded") => break,
                Some(phase @ ("Failed" | "Cancelled" | "NeedsResolution")) => {
                    return Err(format!("run {name} ended {phase}: {}", run["status"]));
                }
                _ => {}
            }
            let version = run["metadata"]["resourceVersion"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            run = self
                .timed(
                    connection,
                    "watch the run (a long poll: until it changes)",
                    "GET",
                    &format!(
                        "{P}/agentruns/{name}?watch=true&resourceVersion={version}&timeoutSeconds=30"
                    ),
                    None,
                    200,
                )
                .await?;
        }
        let took = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.latencies
            .entry("a run: created to seen Succeeded")
            .or_default()
            .push(took);
        self.runs += 1;
        Ok(())
    }
}

/// One client: rounds until `stop`; a broken connection is an error and is opened again.
async fn client(address: SocketAddr, client: usize, stop: Instant) -> Seen {
    let mut seen = Seen::default();
    let mut connection: Option<Connection> = None;
    let mut round = 0;
    while Instant::now() < stop {
        let open = match connection.as_mut() {
            Some(open) => open,
            None => match Connection::try_open(address).await {
                Ok(open) => connection.insert(open),
                Err(error) => {
                    seen.errors.push(format!("connect: {error}"));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        if let Err(error) = seen.round(open, client, round).await {
            seen.errors.push(error);
            connection = None;
        }
        round += 1;
    }
    seen
}

/// The `q`-th per-mille of sorted `values`.
fn per_mille(sorted: &[u64], q: usize) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let index = (sorted.len() * q).div_ceil(1000).saturating_sub(1);
    sorted[index.min(sorted.len() - 1)]
}

/// Microseconds as milliseconds with one decimal.
fn ms(micros: u64) -> String {
    format!("{}.{}", micros / 1000, (micros % 1000) / 100)
}

async fn load() {
    let clients = usize::try_from(env_number("NODUS_BENCH_CLIENTS", 200)).unwrap_or(200);
    let seconds = env_number("NODUS_BENCH_LOAD_SECONDS", 60);
    let idle = env_number("NODUS_BENCH_IDLE_SECONDS", 60);
    let scratch = Scratch::new();
    let (server, _) = ServerProcess::start(scratch.path(), true).await;
    create_agent(server.address).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = server.usage();
    let stop = Instant::now() + Duration::from_secs(seconds);
    let started = Instant::now();
    let tasks: Vec<_> = (0..clients)
        .map(|i| tokio::spawn(client(server.address, i, stop)))
        .collect();
    // The server's memory every second, for its peak.
    let pid = server.pid();
    let sampler = tokio::spawn(async move {
        let mut peak = 0;
        loop {
            peak = status_field(pid, "VmRSS").max(peak);
            tokio::time::sleep(Duration::from_secs(1)).await;
            if Instant::now() > stop {
                return peak;
            }
        }
    });
    let mut all = Seen::default();
    for task in tasks {
        let seen = task.await.expect("client");
        for (kind, mut latencies) in seen.latencies {
            all.latencies
                .entry(kind)
                .or_default()
                .append(&mut latencies);
        }
        all.errors.extend(seen.errors);
        all.runs += seen.runs;
    }
    let wall = started.elapsed();
    let peak = sampler.await.expect("sampler");
    let end = server.usage();
    // Every client watched its last run to its end: nothing runs now. A minute idle.
    tokio::time::sleep(Duration::from_secs(idle)).await;
    let after = server.usage();

    println!(
        "load: {clients} clients for {seconds} s (the last rounds ended after {} ms), \
         {} runs created and seen to succeed, {} errors",
        millis(wall),
        all.runs,
        all.errors.len()
    );
    for error in all.errors.iter().take(10) {
        println!("  error: {error}");
    }
    println!(
        "  {:<48} {:>8} {:>9} {:>9} {:>9} {:>9} {:>11}",
        "request", "count", "p50 ms", "p90 ms", "p99 ms", "max ms", "p50÷healthz"
    );
    let baseline = all
        .latencies
        .get("GET /healthz (baseline)")
        .map(|l| {
            let mut l = l.clone();
            l.sort_unstable();
            per_mille(&l, 500)
        })
        .unwrap_or(1)
        .max(1);
    let mut kinds: Vec<_> = all.latencies.into_iter().collect();
    kinds.sort_by_key(|(kind, _)| *kind);
    for (kind, mut latencies) in kinds {
        latencies.sort_unstable();
        let p50 = per_mille(&latencies, 500);
        println!(
            "  {kind:<48} {:>8} {:>9} {:>9} {:>9} {:>9} {:>10}x",
            latencies.len(),
            ms(p50),
            ms(per_mille(&latencies, 900)),
            ms(per_mille(&latencies, 990)),
            ms(latencies.last().copied().unwrap_or(0)),
            p50 / baseline
        );
    }
    println!("  server before: {before}");
    println!("  server peak RSS during the load: {:.1} MiB", mib(peak));
    println!("  server at the end: {end}");
    println!("  server after {idle} s idle: {after}");
    assert!(all.errors.is_empty(), "the load saw errors");
}

// ---------------------------------------------------------------------------------------
// waiting

/// Sum of a field of `status.counts` over every group.
async fn group_counts(connection: &mut Connection, field: &str) -> (u64, u64) {
    let groups = call(connection, "GET", &format!("{P}/agentgroups"), None, 200).await;
    let mut counted = 0;
    let mut failed = 0;
    for group in groups["items"].as_array().into_iter().flatten() {
        let counts = &group["status"]["counts"];
        counted += counts[field].as_u64().unwrap_or(0);
        failed += counts["failed"].as_u64().unwrap_or(0) + counts["parked"].as_u64().unwrap_or(0);
    }
    (counted, failed)
}

async fn waiting() {
    let runs = env_number("NODUS_BENCH_WAITING", 10_000);
    let scratch = Scratch::new();
    let (mut server, first_start) = ServerProcess::start(scratch.path(), true).await;
    create_agent(server.address).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle = server.usage();
    let mut connection = Connection::open(server.address).await;
    let started = Instant::now();
    for batch in 0..runs.div_ceil(100) {
        let group = format!(
            r#"{{"apiVersion":"nodus.dev/v1","kind":"AgentGroup","metadata":{{"name":"w{batch}"}},"spec":{{"agent":"bench","limits":{{"maxActive":100}},"maxCostUSD":"1000.00"}}}}"#
        );
        call(
            &mut connection,
            "POST",
            &format!("{P}/agentgroups"),
            Some(&group),
            201,
        )
        .await;
        let items: Vec<String> = (batch * 100..((batch + 1) * 100).min(runs))
            .map(|i| {
                format!(
                    r#"{{"apiVersion":"nodus.dev/v1","kind":"AgentRun","spec":{{"agent":"bench","group":"w{batch}","taskKey":"t{i}","keepAlive":true,"input":"Run `echo {i}`"}}}}"#
                )
            })
            .collect();
        let list = format!(
            r#"{{"apiVersion":"nodus.dev/v1","kind":"AgentRunList","items":[{}]}}"#,
            items.join(",")
        );
        call(
            &mut connection,
            "POST",
            &format!("{P}/agentruns"),
            Some(&list),
            201,
        )
        .await;
    }
    let created = started.elapsed();
    loop {
        let (waiting, failed) = group_counts(&mut connection, "waiting").await;
        assert_eq!(failed, 0, "runs failed or parked");
        if waiting == runs {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let all_waiting = started.elapsed();
    server.quiet().await;
    let held_at_quiet = server.usage();
    tokio::time::sleep(Duration::from_secs(12)).await;
    let held = server.usage();
    let bwrap_before_kill = running_named("bwrap");

    server.kill();
    drop(connection);
    let (server, healthy) = ServerProcess::start(scratch.path(), false).await;
    let restarted = server.started;
    let quiet_after_restart = tokio::spawn(quiet(server.pid()));
    // A message at once to the last run created: answered once the runner reaches it.
    let mut connection = Connection::open(server.address).await;
    let last = format!("w{}-t{}", (runs - 1) / 100, runs - 1);
    call(
        &mut connection,
        "POST",
        &format!("{P}/agentruns/{last}/messages"),
        Some(r#"{"payload":"Run `echo again`","messageKey":"again"}"#),
        201,
    )
    .await;
    let answered = loop {
        let run = call(
            &mut connection,
            "GET",
            &format!("{P}/agentruns/{last}"),
            None,
            200,
        )
        .await;
        if run["status"]["turns"].as_array().map_or(0, Vec::len) >= 2
            && run["status"]["phase"] == "Waiting"
        {
            break restarted.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let quiet = quiet_after_restart
        .await
        .expect("quiet")
        .duration_since(restarted);
    let after_quiet = server.usage();
    // Idle threads of tokio's blocking pool end after 10 s.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let after = server.usage();
    // A new connection: the server closes one idle for longer than its header timeout (10 s).
    let mut connection = Connection::open(server.address).await;
    let (waiting, failed) = group_counts(&mut connection, "waiting").await;

    println!(
        "waiting: {runs} keepAlive runs ({} groups of up to 100), each after one command",
        runs.div_ceil(100)
    );
    println!("  first start to healthy: {} ms", millis(first_start));
    println!(
        "  created in {} ms, all waiting {} ms after the first batch",
        millis(created),
        millis(all_waiting)
    );
    println!("  server idle, no runs (baseline): {idle}");
    println!("  server with {runs} runs waiting, once idle: {held_at_quiet}");
    println!("  … and 12 s later (idle blocking threads gone): {held}");
    println!("  bubblewrap processes on the machine then: {bwrap_before_kill}");
    println!(
        "  RSS ratio to the idle server: {}.{:02}",
        held.rss_kib / idle.rss_kib.max(1),
        held.rss_kib * 100 / idle.rss_kib.max(1) % 100
    );
    println!(
        "  after SIGKILL, restart to healthy: {} ms",
        millis(healthy)
    );
    println!(
        "  restart to the answer of a message sent at healthy (to the last run): {} ms",
        millis(answered)
    );
    println!(
        "  restart to the server idle again (≤ 20 ms CPU in 500 ms; its runner has looked at \
         every run): {} ms",
        millis(quiet)
    );
    println!("  server after the restart, once idle: {after_quiet}");
    println!("  … and 12 s later: {after}");
    println!("  runs waiting after the restart: {waiting}, failed or parked: {failed}");
    assert_eq!((waiting, failed), (runs, 0), "every run waits again");
}

/// How many processes run the program `name`.
fn running_named(name: &str) -> usize {
    processes()
        .iter()
        .filter(|p| {
            p.2.first()
                .is_some_and(|arg| Path::new(arg).file_name() == Some(name.as_ref()))
        })
        .count()
}

// ---------------------------------------------------------------------------------------
// killed

/// How the 100 retries are sent.
#[derive(Debug, Clone, Copy)]
enum Retries {
    /// One after the other on one connection.
    OneByOne,
    /// All at once, each on a connection of its own (as a script that sends them in parallel).
    AllAtOnce,
}

impl Retries {
    fn describe(self) -> &'static str {
        match self {
            Retries::OneByOne => "one request each, one after the other on one connection",
            Retries::AllAtOnce => "one request each, all at once, a connection each",
        }
    }
}

/// What one kill and restart measured.
struct Restart {
    retries: Retries,
    /// From the kill until the sandboxes' commands are gone.
    gone: Duration,
    /// From the restart (spawn of the process).
    healthy: Duration,
    parked: Duration,
    resolved: Duration,
    /// Retries refused with a 500 and sent again.
    refused: usize,
    again: Duration,
}

/// The retries of every run of group `k`, sent as `retries` says; how many were refused with
/// a 500 and sent again (see [`Retries::AllAtOnce`]).
async fn retry_all(address: SocketAddr, runs: u64, retries: Retries) -> usize {
    let path = |i: u64| format!("{P}/agentruns/k-t{i}/resolve");
    let body = Some(r#"{"action":"retry"}"#);
    match retries {
        Retries::OneByOne => {
            let mut connection = Connection::open(address).await;
            for i in 0..runs {
                call(&mut connection, "POST", &path(i), body, 200).await;
            }
            0
        }
        Retries::AllAtOnce => {
            // A resolve racing the runner's own look at the parked run loses its lease
            // ("is now owned by another writer", a 500; a defect left open): counted, and
            // sent again as a script would.
            let sent: Vec<_> = (0..runs)
                .map(|i| {
                    let path = path(i);
                    tokio::spawn(async move {
                        let mut connection = Connection::open(address).await;
                        let mut refused = 0;
                        loop {
                            let (status, answer) = connection.request("POST", &path, body).await;
                            match status {
                                200 => return refused,
                                500 if refused < 20
                                    && String::from_utf8_lossy(&answer)
                                        .contains("owned by another writer") =>
                                {
                                    refused += 1;
                                    tokio::time::sleep(Duration::from_millis(20)).await;
                                }
                                _ => panic!(
                                    "POST {path}: {status} {}",
                                    String::from_utf8_lossy(&answer)
                                ),
                            }
                        }
                    })
                })
                .collect();
            let mut refused = 0;
            for one in sent {
                refused += one.await.expect("a retry");
            }
            refused
        }
    }
}

/// SIGKILL the server while every run of group `k` is in its command, restart it, wait until
/// each run is parked, retry each as `retries` says, and wait until all run their command again.
async fn kill_and_retry(
    server: ServerProcess,
    dir: &Path,
    runs: u64,
    retries: Retries,
) -> (ServerProcess, Restart) {
    let mut server = server;
    server.kill();
    let killed = Instant::now();
    while running(&SLEEP) > 0 {
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "the commands outlived the server"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let gone = killed.elapsed();

    let (server, healthy) = ServerProcess::start(dir, false).await;
    let restarted = server.started;
    let mut connection = Connection::open(server.address).await;
    let parked_path =
        format!("{P}/agentruns?fieldSelector=spec.group=k,status.phase=NeedsResolution");
    while call(&mut connection, "GET", &parked_path, None, 200).await["items"]
        .as_array()
        .map_or(0, Vec::len)
        < usize::try_from(runs).unwrap_or(usize::MAX)
    {
        assert!(
            restarted.elapsed() < Duration::from_secs(60),
            "the runs were not parked"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let parked = restarted.elapsed();
    let refused = retry_all(server.address, runs, retries).await;
    let resolved = restarted.elapsed();
    let running_path = format!("{P}/agentruns?fieldSelector=spec.group=k,status.phase=Running");
    loop {
        let listed = call(&mut connection, "GET", &running_path, None, 200).await["items"]
            .as_array()
            .map_or(0, Vec::len);
        if listed == 100 && running(&SLEEP) == 100 {
            break;
        }
        assert!(
            restarted.elapsed() < Duration::from_secs(60),
            "the runs did not run again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let again = restarted.elapsed();
    (
        server,
        Restart {
            retries,
            gone,
            healthy,
            parked,
            resolved,
            refused,
            again,
        },
    )
}

async fn killed() {
    let runs: u64 = 100;
    let scratch = Scratch::new();
    let (mut server, first_start) = ServerProcess::start(scratch.path(), true).await;
    create_agent(server.address).await;
    // The baseline: a restart with no runs, three times.
    let mut empty = Vec::new();
    for _ in 0..3 {
        server.kill();
        let (again, healthy) = ServerProcess::start(scratch.path(), false).await;
        server = again;
        empty.push(millis(healthy));
    }
    let mut connection = Connection::open(server.address).await;
    let group = r#"{"apiVersion":"nodus.dev/v1","kind":"AgentGroup","metadata":{"name":"k"},"spec":{"agent":"bench","limits":{"maxActive":100},"maxCostUSD":"1000.00"}}"#;
    call(
        &mut connection,
        "POST",
        &format!("{P}/agentgroups"),
        Some(group),
        201,
    )
    .await;
    let command = SLEEP.join(" ");
    let items: Vec<String> = (0..runs)
        .map(|i| {
            format!(
                r#"{{"apiVersion":"nodus.dev/v1","kind":"AgentRun","spec":{{"agent":"bench","group":"k","taskKey":"t{i}","input":"Run `{command}`"}}}}"#
            )
        })
        .collect();
    let list = format!(
        r#"{{"apiVersion":"nodus.dev/v1","kind":"AgentRunList","items":[{}]}}"#,
        items.join(",")
    );
    let started = Instant::now();
    call(
        &mut connection,
        "POST",
        &format!("{P}/agentruns"),
        Some(&list),
        201,
    )
    .await;
    while running(&SLEEP) < 100 {
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the commands did not start"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let all_started = started.elapsed();
    drop(connection);
    // Killed twice: the retries sent one by one, then all at once (the runs run their
    // command again after the first, so the second kill finds them as the first did).
    let mut restarts = Vec::new();
    for retries in [Retries::OneByOne, Retries::AllAtOnce] {
        let (again, restart) = kill_and_retry(server, scratch.path(), runs, retries).await;
        server = again;
        restarts.push(restart);
    }
    // Cancel them: their sandboxes go.
    let mut connection = Connection::open(server.address).await;
    call(
        &mut connection,
        "POST",
        &format!("{P}/agentgroups/k/cancel"),
        None,
        200,
    )
    .await;

    println!("killed: {runs} runs, each in `{command}`, when the server is SIGKILLed");
    println!(
        "  first start to healthy {} ms; restarts with no runs to healthy (baseline): {empty:?} ms",
        millis(first_start)
    );
    println!(
        "  the 100 commands all running {} ms after the batch",
        millis(all_started)
    );
    for restart in &restarts {
        println!("  retries {}:", restart.retries.describe());
        println!(
            "    the commands all gone {} ms after the kill",
            millis(restart.gone)
        );
        println!("    restart to healthy: {} ms", millis(restart.healthy));
        println!(
            "    restart to all 100 parked in NeedsResolution: {} ms",
            millis(restart.parked)
        );
        println!(
            "    restart to 100 retries answered: {} ms ({} refused with a 500 and sent again)",
            millis(restart.resolved),
            restart.refused
        );
        println!(
            "    restart to all 100 Running again with their command: {} ms ({} ms after the retries)",
            millis(restart.again),
            millis(restart.again.saturating_sub(restart.resolved))
        );
    }
}
