//! Sandbox latency: create + first exec + destroy for each backend, next to the bare tools
//! measured in the same run (`bwrap … true`, `docker run --rm IMAGE true`), and exec latency in
//! a live sandbox. Prints p50 and p99 of each and the ratios.
//!
//! Each iteration runs the bare tool and then the backend's cycle, so that the load of the
//! machine weighs on both alike.
//!
//! Then starts at a time: how many sandboxes per second the process backend (with bubblewrap
//! and with Nodus's own launcher), bare `bwrap` and bare `unshare` go through with 1, 16 and
//! 100 in flight, next to `sh -c true` (a process start, which scales with the cores), and
//! how busy the machine's CPUs were meanwhile. A start that cannot use the idle cores waits
//! on something other than the CPU. Last, the launcher's cycle, the same without the pool
//! of emptied cgroups (every cgroup made and removed, `cgroup_pool` 0) and bare `unshare`
//! in alternated batches at 1 and 16 in flight.
//!
//! `eval "$(scripts/test-env start)"; cargo bench -p nodus-sandbox --bench sandboxes`
//! Iterations: `NODUS_BENCH_ITERS` (default 100 for processes, a third of it for Docker, four
//! times it for each figure of the starts at a time);
//! `NODUS_BENCH_ONLY=processes`, `docker` or `parallel` runs one part; `cycles` runs only the
//! launcher's cycle and bare `unshare`, alternated, at 16 in flight (`NODUS_BENCH_IN_FLIGHT`
//! sets another number): what to run under `perf record -a -g`, or against another build;
//! there the launcher is the resident one (`NODUS_BENCH_RESIDENT=0`: spawned for each
//! sandbox), and `NODUS_BENCH_SPAWNED=1` adds the spawned launcher's cycle, alternated too;
//! `NODUS_BENCH_NETNS_OFF=1` adds the resident launcher's cycle without its pool of network
//! namespaces (`netns_pool` 0: each sandbox makes one, the kernel tears it down after),
//! alternated too, and the ratio pool / no pool per round.

#![allow(clippy::float_arithmetic)] // milliseconds and ratios for display only

use std::collections::BTreeMap;
use std::future::Future;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nodus_core::Sandbox;
use nodus_core::sandbox::{ExecRequest, Limits, SandboxId, SandboxSpec};
use nodus_sandbox::{BwrapConfig, BwrapSandbox, DockerConfig, DockerSandbox, UnisolatedSandbox};

/// Latencies of one measurement, sorted.
struct Samples {
    name: String,
    sorted: Vec<Duration>,
}

impl Samples {
    fn new(name: &str, mut all: Vec<Duration>) -> Self {
        all.sort_unstable();
        Samples {
            name: name.to_owned(),
            sorted: all,
        }
    }

    /// The `per_mille`th quantile (nearest rank).
    fn quantile(&self, per_mille: usize) -> Duration {
        let n = self.sorted.len();
        let rank = (n * per_mille).div_ceil(1000).clamp(1, n.max(1));
        self.sorted.get(rank - 1).copied().unwrap_or_default()
    }

    fn p50(&self) -> Duration {
        self.quantile(500)
    }

    fn p99(&self) -> Duration {
        self.quantile(990)
    }

    fn print(&self) {
        println!(
            "{:<52} n={:<4} p50 {:>9.2} ms   p99 {:>9.2} ms",
            self.name,
            self.sorted.len(),
            ms(self.p50()),
            ms(self.p99())
        );
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn ratio(a: &Samples, b: &Samples) {
    println!(
        "  ratio {} / {}: p50 {:.2}x, p99 {:.2}x",
        a.name,
        b.name,
        a.p50().as_secs_f64() / b.p50().as_secs_f64(),
        a.p99().as_secs_f64() / b.p99().as_secs_f64()
    );
}

fn spec(key: &str, image: Option<&str>) -> SandboxSpec {
    SandboxSpec {
        key: key.to_owned(),
        image: image.map(str::to_owned),
        env: BTreeMap::new(),
        limits: Limits::default(),
        network: false,
        egress: None,
        egress_headers: Vec::new(),
        links: Default::default(),
    }
}

fn request(command: &str) -> ExecRequest {
    ExecRequest {
        command: command.to_owned(),
        timeout: Duration::from_secs(60),
        cwd: None,
        output_cap: 1 << 20,
    }
}

/// Runs a command once and times it.
fn bare_once(argv: &[&str]) -> Duration {
    let started = Instant::now();
    let status = Command::new(argv[0])
        .args(&argv[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("run the bare command");
    let took = started.elapsed();
    assert!(status.success(), "{argv:?}: {status}");
    took
}

/// Create + first exec (`true`) + destroy, `n` times, with phases; before each, each bare
/// command of `bare` once. Returns the bare samples first, in the order of `bare`.
async fn lifecycle(
    name: &str,
    n: usize,
    sandbox: Arc<dyn Sandbox>,
    image: Option<&str>,
    bare: &[(&str, &[&str])],
) -> (Vec<Samples>, Samples, [Samples; 3]) {
    let mut bare_samples = vec![Vec::new(); bare.len()];
    let tag = format!("bench-{}", std::process::id());
    // Warm-up: the first create of a backend finds its tools once.
    let warm = sandbox
        .create(&spec(&format!("{tag}-warm"), image))
        .await
        .expect("create");
    sandbox.destroy(&warm.id).await.expect("destroy");
    let mut phases = [Vec::new(), Vec::new(), Vec::new()];
    let mut total = Vec::with_capacity(n);
    for i in 0..n {
        for ((_, argv), samples) in bare.iter().zip(&mut bare_samples) {
            samples.push(bare_once(argv));
        }
        let key = format!("{tag}-{i}");
        let start = Instant::now();
        let id = sandbox.create(&spec(&key, image)).await.expect("create").id;
        let created = Instant::now();
        let out = sandbox.exec(&id, &request("true")).await.expect("exec");
        let executed = Instant::now();
        assert_eq!(out.exit_code, Some(0), "{out:?}");
        sandbox.destroy(&id).await.expect("destroy");
        let destroyed = Instant::now();
        phases[0].push(created - start);
        phases[1].push(executed - created);
        phases[2].push(destroyed - executed);
        total.push(destroyed - start);
    }
    let [c, e, d] = phases;
    (
        bare.iter()
            .zip(bare_samples)
            .map(|((label, _), samples)| Samples::new(label, samples))
            .collect(),
        Samples::new(&format!("{name}: create+exec+destroy"), total),
        [
            Samples::new(&format!("  {name}: create"), c),
            Samples::new(&format!("  {name}: first exec"), e),
            Samples::new(&format!("  {name}: destroy"), d),
        ],
    )
}

/// `n` execs of `true` in one live sandbox; before each, a bare `sh -c true` started the same
/// way (the baseline: a process start), whose samples come second.
async fn live_exec(
    name: &str,
    n: usize,
    sandbox: Arc<dyn Sandbox>,
    image: Option<&str>,
) -> (Samples, Samples) {
    let key = format!("bench-{}-live", std::process::id());
    let id: SandboxId = sandbox.create(&spec(&key, image)).await.expect("create").id;
    sandbox.exec(&id, &request("true")).await.expect("warm-up");
    let mut bare = Vec::with_capacity(n);
    let mut all = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        bare_async(&["sh", "-c", "true"]).await;
        bare.push(started.elapsed());
        let started = Instant::now();
        let out = sandbox.exec(&id, &request("true")).await.expect("exec");
        all.push(started.elapsed());
        assert_eq!(out.exit_code, Some(0));
    }
    sandbox.destroy(&id).await.expect("destroy");
    (
        Samples::new(&format!("{name}: exec `true` in a live sandbox"), all),
        Samples::new("  bare `sh -c true` (baseline, same iterations)", bare),
    )
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is not supported.
    let n: usize = std::env::var("NODUS_BENCH_ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let image = std::env::var("NODUS_TEST_DOCKER_IMAGE")
        .expect("NODUS_TEST_DOCKER_IMAGE: run `eval \"$(scripts/test-env start)\"` first");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let root = tempfile::tempdir().expect("tempdir");

    // `NODUS_BENCH_ONLY=processes` or `docker` runs one half.
    let only = std::env::var("NODUS_BENCH_ONLY").unwrap_or_default();
    runtime.block_on(async {
        if only.is_empty() || only == "processes" {
            processes(n, root.path()).await;
        }
        if only.is_empty() || only == "docker" {
            docker(n, &image).await;
        }
        if only == "cycles" {
            // For a profiler, or against another build: the launcher's cycle and `unshare`.
            only_cycles(n * 4, root.path()).await;
        }
        if only.is_empty() || only == "parallel" {
            parallel(n * 4, root.path()).await;
        }
    });
}

/// Bubblewrap's own smallest isolated invocation: the bare tool of the process rows.
const BARE_BWRAP: &[&str] = &[
    "bwrap",
    "--ro-bind",
    "/",
    "/",
    "--unshare-all",
    "--die-with-parent",
    "--dev",
    "/dev",
    "--proc",
    "/proc",
    "true",
];

async fn processes(n: usize, root: &std::path::Path) {
    {
        println!("== processes ({n} iterations)");
        let bwrap_argv = BARE_BWRAP;
        let bwrap: Arc<dyn Sandbox> =
            Arc::new(BwrapSandbox::new(BwrapConfig::new(root.join("bwrap"))));
        let (bare_bwrap, bwrap_cycle, bwrap_phases) = lifecycle(
            "bwrap backend",
            n,
            bwrap.clone(),
            None,
            &[(
                "bare `bwrap --ro-bind / / --unshare-all … true`",
                bwrap_argv,
            )],
        )
        .await;
        let (bwrap_live, bwrap_bare_sh) = live_exec("bwrap backend", n, bwrap, None).await;
        let unisolated: Arc<dyn Sandbox> =
            Arc::new(UnisolatedSandbox::new(root.join("unisolated")));
        let (_, uni_cycle, _) =
            lifecycle("unisolated backend", n, unisolated.clone(), None, &[]).await;
        let (uni_live, uni_bare_sh) = live_exec("unisolated backend", n, unisolated, None).await;
        for bare in &bare_bwrap {
            bare.print();
        }
        bwrap_cycle.print();
        for phase in &bwrap_phases {
            phase.print();
        }
        bwrap_live.print();
        bwrap_bare_sh.print();
        uni_cycle.print();
        uni_live.print();
        uni_bare_sh.print();
        for bare in &bare_bwrap {
            ratio(&bwrap_cycle, bare);
        }
        ratio(&bwrap_live, &bwrap_bare_sh);
        ratio(&uni_live, &uni_bare_sh);
    }
}

async fn docker(n: usize, image: &str) {
    let n_docker = (n / 3).max(5);
    {
        println!("== Docker ({n_docker} iterations, image {image})");
        let docker_argv: &[&str] = &["docker", "run", "--rm", image, "true"];
        let docker_none_argv: &[&str] =
            &["docker", "run", "--rm", "--network", "none", image, "true"];
        let docker: Arc<dyn Sandbox> = Arc::new(
            DockerSandbox::connect(DockerConfig::new(image.to_owned()))
                .await
                .expect("Docker is reachable"),
        );
        let (bare_docker, docker_cycle, docker_phases) = lifecycle(
            "docker backend",
            n_docker,
            docker.clone(),
            Some(image),
            &[
                ("bare `docker run --rm IMAGE true`", docker_argv),
                (
                    "bare `docker run --rm --network none IMAGE true`",
                    docker_none_argv,
                ),
            ],
        )
        .await;
        let (docker_live, _) = live_exec("docker backend", n, docker, Some(image)).await;
        for bare in &bare_docker {
            bare.print();
        }
        docker_cycle.print();
        for phase in &docker_phases {
            phase.print();
        }
        docker_live.print();
        for bare in &bare_docker {
            ratio(&docker_cycle, bare);
        }
    }
}

/// The CPU time of the whole machine so far, from `/proc/stat`: (busy, all) in clock ticks,
/// where busy leaves out idle, I/O wait and time stolen by the hypervisor.
fn cpu_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").expect("/proc/stat");
    let line = stat.lines().next().expect("the cpu line");
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().expect("a tick count"))
        .collect();
    let at = |i: usize| fields.get(i).copied().unwrap_or(0);
    // user nice system idle iowait irq softirq steal (guest time is inside user)
    let busy = at(0) + at(1) + at(2) + at(5) + at(6);
    (busy, busy + at(3) + at(4) + at(7))
}

/// `n` starts, `in_flight` at a time, each the future `one(i)` makes; prints starts per
/// second and how busy the machine's CPUs were, and answers the wall time per start.
async fn at_a_time<F>(label: &str, n: usize, in_flight: usize, one: impl Fn(usize) -> F) -> f64
where
    F: Future<Output = ()> + Send + 'static,
{
    let (each, busy) = timed(n, in_flight, one).await;
    println!(
        "{label:<44} {in_flight:>3} in flight: {:>7.0}/s ({each:>5.2} ms each), CPUs {busy:>3.0} % busy",
        1000.0 / each,
    );
    each
}

/// [`at_a_time`] without the line: the wall time per start and how busy the CPUs were.
async fn timed<F>(n: usize, in_flight: usize, one: impl Fn(usize) -> F) -> (f64, f64)
where
    F: Future<Output = ()> + Send + 'static,
{
    let permits = Arc::new(tokio::sync::Semaphore::new(in_flight));
    let mut tasks = tokio::task::JoinSet::new();
    let (busy0, all0) = cpu_ticks();
    let started = Instant::now();
    for i in 0..n {
        let permit = permits.clone().acquire_owned().await.expect("permits");
        let start = one(i);
        tasks.spawn(async move {
            start.await;
            drop(permit);
        });
    }
    while let Some(done) = tasks.join_next().await {
        done.expect("a start");
    }
    let took = started.elapsed();
    let (busy1, all1) = cpu_ticks();
    let busy = (busy1 - busy0) as f64 * 100.0 / (all1 - all0).max(1) as f64;
    (ms(took) / n as f64, busy)
}

/// A bare command, started and awaited without its output.
async fn bare_async(argv: &'static [&'static str]) {
    let status = tokio::process::Command::new(argv[0])
        .args(&argv[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await
        .expect("run the bare command");
    assert!(status.success(), "{argv:?}: {status}");
}

/// The same namespaces as a sandbox's (user, pid, ipc, uts, cgroup, network, mount) with a
/// fresh `/proc`, and nothing else: the floor of an isolated start.
const BARE_UNSHARE: &[&str] = &[
    "unshare",
    "--user",
    "--pid",
    "--ipc",
    "--uts",
    "--cgroup",
    "--net",
    "--mount",
    "--fork",
    "--mount-proc",
    "true",
];

/// Wall time spent in each phase of the cycles of one measurement: create, first command,
/// destroy.
type Phases = Arc<std::sync::Mutex<[Duration; 3]>>;

/// One backend's full cycle: create, a first command `true`, destroy; adds each phase's time
/// to `phases`.
async fn cycle(sandbox: Arc<dyn Sandbox>, key: String, phases: Phases) {
    let started = Instant::now();
    let id = sandbox.create(&spec(&key, None)).await.expect("create").id;
    let created = Instant::now();
    let out = sandbox.exec(&id, &request("true")).await.expect("exec");
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    let ran = Instant::now();
    sandbox.destroy(&id).await.expect("destroy");
    let mut sums = phases.lock().expect("phases");
    sums[0] += created - started;
    sums[1] += ran - created;
    sums[2] += ran.elapsed();
}

/// Prints the mean wall time of each phase.
fn print_phases(phases: &Phases, n: usize) {
    let sums = *phases.lock().expect("phases");
    let each = |d: Duration| ms(d) / n as f64;
    println!(
        "    phases, mean wall time with the others in flight: create {:.2} ms, first command {:.2} ms, destroy {:.2} ms",
        each(sums[0]),
        each(sums[1]),
        each(sums[2])
    );
}

/// The launcher alone, as root (as the bare `unshare`), starting `true` in a sandbox laid
/// out as the backend's (read-only `/usr` and `/etc`, the links of `/bin` and the like, `/proc`,
/// `/dev`, a sized `/tmp`, a working directory), without cgroups and without the backend.
fn bare_launcher_plan(work: &std::path::Path) -> Vec<u8> {
    let mut plan = nodus_launch::Plan {
        hostname: "nodus".to_owned(),
        tmp_size: 1 << 30,
        work_host: work.to_path_buf(),
        work_inside: "/work".into(),
        program: vec!["/bin/true".into()],
        ..nodus_launch::Plan::default()
    };
    for dir in [
        "/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc",
    ] {
        match std::fs::read_link(dir) {
            Ok(target) => plan.symlinks.push((target, dir.into())),
            Err(_) if std::path::Path::new(dir).is_dir() => plan.ro_binds.push(dir.into()),
            Err(_) => {}
        }
    }
    plan.encode().expect("a plan")
}

/// Runs the bare launcher with `plan` on its standard input.
async fn bare_launcher(plan: Arc<Vec<u8>>) {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_nodus-sandbox-launch"))
        .arg(nodus_launch::LAUNCH_ARG)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("start the launcher");
    let mut stdin = child.stdin.take().expect("stdin");
    stdin.write_all(&plan).await.expect("the plan");
    drop(stdin);
    let status = child.wait().await.expect("the launcher");
    assert!(status.success(), "the bare launcher: {status}");
}

/// Starts at a time: the process backend's cycle with bubblewrap and with Nodus's own
/// launcher, bare `bwrap` and bare `unshare` against `sh -c true`.
async fn parallel(n: usize, root: &std::path::Path) {
    println!("== starts at a time ({n} each)");
    let bwrap: Arc<dyn Sandbox> = Arc::new(BwrapSandbox::new(BwrapConfig::new(root.join("par"))));
    let mut config = BwrapConfig::new(root.join("launch"));
    config.launcher = Some(env!("CARGO_BIN_EXE_nodus-sandbox-launch").into());
    let launched = Arc::new(BwrapSandbox::new(config));
    assert!(
        launched.uses_launcher().await.expect("prepared"),
        "the launcher failed its self-check"
    );
    let launcher: Arc<dyn Sandbox> = launched;
    let mut config = BwrapConfig::new(root.join("unpooled"));
    config.launcher = Some(env!("CARGO_BIN_EXE_nodus-sandbox-launch").into());
    config.cgroup_pool = 0;
    let unpooled = Arc::new(BwrapSandbox::new(config));
    assert!(
        unpooled.uses_launcher().await.expect("prepared"),
        "the launcher failed its self-check"
    );
    let unpooled: Arc<dyn Sandbox> = unpooled;
    for backend in [&bwrap, &launcher, &unpooled] {
        let warm = backend
            .create(&spec("bench-par-warm", None))
            .await
            .expect("create");
        backend.destroy(&warm.id).await.expect("destroy");
    }
    let tag = std::process::id();
    let work = root.join("bare-launcher-work");
    std::fs::create_dir_all(&work).expect("a working directory");
    let plan = Arc::new(bare_launcher_plan(&work));
    for in_flight in [1, 16, 100] {
        at_a_time("`sh -c true` (baseline)", n, in_flight, |_| {
            bare_async(&["sh", "-c", "true"])
        })
        .await;
        let unshare = at_a_time(
            "bare `unshare -Upiuc -n -m -f --mount-proc true`",
            n,
            in_flight,
            |_| bare_async(BARE_UNSHARE),
        )
        .await;
        let bare = at_a_time("bare `bwrap --unshare-all … true`", n, in_flight, |_| {
            bare_async(BARE_BWRAP)
        })
        .await;
        let bare_launched = at_a_time("bare launcher, `true`", n, in_flight, |_| {
            bare_launcher(plan.clone())
        })
        .await;
        let phases = Phases::default();
        let with_bwrap = at_a_time("bwrap backend: create+exec+destroy", n, in_flight, |i| {
            let key = format!("bench-par-{tag}-{in_flight}-{i}");
            cycle(bwrap.clone(), key, phases.clone())
        })
        .await;
        print_phases(&phases, n);
        let phases = Phases::default();
        let with_launcher = at_a_time("launcher backend: create+exec+destroy", n, in_flight, |i| {
            let key = format!("bench-launch-{tag}-{in_flight}-{i}");
            cycle(launcher.clone(), key, phases.clone())
        })
        .await;
        print_phases(&phases, n);
        // The baseline once more, after the backends: the load may have moved meanwhile.
        let unshare_after = at_a_time("bare `unshare …` again", n, in_flight, |_| {
            bare_async(BARE_UNSHARE)
        })
        .await;
        let unshare = (unshare + unshare_after) / 2.0;
        println!(
            "  ratios at {in_flight} in flight (unshare: mean of before and after): launcher cycle / unshare {:.2}x, bwrap cycle / unshare {:.2}x, bare launcher / unshare {:.2}x, bare bwrap / unshare {:.2}x",
            with_launcher / unshare,
            with_bwrap / unshare,
            bare_launched / unshare,
            bare / unshare
        );
    }
    alternated(&launcher, &unpooled, tag).await;
}

/// The launcher's cycle and bare `unshare`, 16 in flight (or `NODUS_BENCH_IN_FLIGHT`), in
/// alternated batches of 100 (`n` / 100 of each); prints each round's ratio, the ratio of
/// the sums and the phases.
async fn only_cycles(n: usize, root: &std::path::Path) {
    const BATCH: usize = 100;
    let flag = |name: &str| std::env::var(name).is_ok_and(|v| v == "1");
    let mut config = BwrapConfig::new(root.join("cycles"));
    config.launcher = Some(env!("CARGO_BIN_EXE_nodus-sandbox-launch").into());
    // `NODUS_BENCH_RESIDENT=0`: the launcher spawned for each sandbox, as before the
    // resident launcher.
    let resident = std::env::var("NODUS_BENCH_RESIDENT").map_or(true, |v| v != "0");
    if !resident {
        config.resident_launcher = false;
    }
    let launcher: Arc<dyn Sandbox> = Arc::new(BwrapSandbox::new(config));
    // `NODUS_BENCH_SPAWNED=1`: a third batch per round, the launcher spawned for each sandbox
    // (no resident launcher), and the ratio of the two cycles.
    let spawned: Option<Arc<dyn Sandbox>> = flag("NODUS_BENCH_SPAWNED").then(|| {
        let mut config = BwrapConfig::new(root.join("cycles-spawned"));
        config.launcher = Some(env!("CARGO_BIN_EXE_nodus-sandbox-launch").into());
        config.resident_launcher = false;
        Arc::new(BwrapSandbox::new(config)) as Arc<dyn Sandbox>
    });
    // `NODUS_BENCH_NETNS_OFF=1`: another batch per round, the resident launcher without its
    // pool of network namespaces, and the ratio of the two cycles.
    let netns_off: Option<Arc<dyn Sandbox>> = flag("NODUS_BENCH_NETNS_OFF").then(|| {
        let mut config = BwrapConfig::new(root.join("cycles-netns-off"));
        config.launcher = Some(env!("CARGO_BIN_EXE_nodus-sandbox-launch").into());
        config.netns_pool = 0;
        Arc::new(BwrapSandbox::new(config)) as Arc<dyn Sandbox>
    });
    let tag = std::process::id();
    let phases = Phases::default();
    let spawned_phases = Phases::default();
    let off_phases = Phases::default();
    let (mut off_cycles, mut off_pairs, mut pool_pairs) = (0.0, Vec::new(), Vec::new());
    let in_flight = std::env::var("NODUS_BENCH_IN_FLIGHT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(16);
    let rounds = (n / BATCH).max(1);
    let (mut unshare, mut cycles, mut pairs) = (0.0, 0.0, Vec::new());
    let (mut spawned_cycles, mut spawned_pairs, mut resident_pairs) = (0.0, Vec::new(), Vec::new());
    for round in 0..rounds {
        let (u, _) = timed(BATCH, in_flight, |_| bare_async(BARE_UNSHARE)).await;
        let (c, _) = timed(BATCH, in_flight, |i| {
            let key = format!("bench-cycles-{tag}-{round}-{i}");
            cycle(launcher.clone(), key, phases.clone())
        })
        .await;
        unshare += u;
        cycles += c;
        pairs.push(format!("{:.2}x", c / u));
        if let Some(spawned) = &spawned {
            let (s, _) = timed(BATCH, in_flight, |i| {
                let key = format!("bench-cycles-spawned-{tag}-{round}-{i}");
                cycle(spawned.clone(), key, spawned_phases.clone())
            })
            .await;
            spawned_cycles += s;
            spawned_pairs.push(format!("{:.2}x", s / u));
            resident_pairs.push(format!("{:.2}x", c / s));
        }
        if let Some(off) = &netns_off {
            let (o, _) = timed(BATCH, in_flight, |i| {
                let key = format!("bench-cycles-netns-off-{tag}-{round}-{i}");
                cycle(off.clone(), key, off_phases.clone())
            })
            .await;
            off_cycles += o;
            off_pairs.push(format!("{:.2}x", o / u));
            pool_pairs.push(format!("{:.2}x", c / o));
        }
    }
    println!(
        "cycles, {in_flight} in flight ({rounds} x {BATCH} of each, alternated): launcher cycle {:.2} ms, unshare {:.2} ms, launcher cycle / unshare {:.2}x (each round: {})",
        cycles / rounds as f64,
        unshare / rounds as f64,
        cycles / unshare,
        pairs.join(" ")
    );
    print_phases(&phases, rounds * BATCH);
    if spawned.is_some() {
        println!(
            "  spawned launcher (no resident launcher): cycle {:.2} ms, / unshare {:.2}x (each round: {}); resident / spawned {:.2}x (each round: {})",
            spawned_cycles / rounds as f64,
            spawned_cycles / unshare,
            spawned_pairs.join(" "),
            cycles / spawned_cycles,
            resident_pairs.join(" ")
        );
        print_phases(&spawned_phases, rounds * BATCH);
    }
    if netns_off.is_some() {
        println!(
            "  without the network namespace pool: cycle {:.2} ms, / unshare {:.2}x (each round: {}); pool / no pool {:.2}x (each round: {})",
            off_cycles / rounds as f64,
            off_cycles / unshare,
            off_pairs.join(" "),
            cycles / off_cycles,
            pool_pairs.join(" ")
        );
        print_phases(&off_phases, rounds * BATCH);
    }
}

/// The launcher's cycle, the same without the cgroup pool (`unpooled`) and bare `unshare`,
/// in batches of 100 taken in turn (six of each at 1 and at 16 in flight), so that a load
/// that moves (other work on the machine) weighs on all alike; prints each round's ratios,
/// the ratios of the sums and the phases.
async fn alternated(launcher: &Arc<dyn Sandbox>, unpooled: &Arc<dyn Sandbox>, tag: u32) {
    const ROUNDS: usize = 6;
    const BATCH: usize = 100;
    for in_flight in [1, 16] {
        let phases = Phases::default();
        let unpooled_phases = Phases::default();
        let (mut unshare, mut cycles, mut without) = (0.0, 0.0, 0.0);
        let (mut pairs, mut unpooled_pairs, mut pool_pairs) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            let (u, _) = timed(BATCH, in_flight, |_| bare_async(BARE_UNSHARE)).await;
            let (c, _) = timed(BATCH, in_flight, |i| {
                let key = format!("bench-alt-{tag}-{in_flight}-{round}-{i}");
                cycle(launcher.clone(), key, phases.clone())
            })
            .await;
            let (w, _) = timed(BATCH, in_flight, |i| {
                let key = format!("bench-alt-unpooled-{tag}-{in_flight}-{round}-{i}");
                cycle(unpooled.clone(), key, unpooled_phases.clone())
            })
            .await;
            unshare += u;
            cycles += c;
            without += w;
            pairs.push(format!("{:.2}x", c / u));
            unpooled_pairs.push(format!("{:.2}x", w / u));
            pool_pairs.push(format!("{:.2}x", c / w));
        }
        println!(
            "alternated, {in_flight} in flight ({ROUNDS} x {BATCH} of each): launcher cycle {:.2} ms, unshare {:.2} ms, launcher cycle / unshare {:.2}x (each round: {})",
            cycles / ROUNDS as f64,
            unshare / ROUNDS as f64,
            cycles / unshare,
            pairs.join(" ")
        );
        print_phases(&phases, ROUNDS * BATCH);
        println!(
            "    without the cgroup pool: cycle {:.2} ms, / unshare {:.2}x (each round: {}); with the pool / without {:.2}x (each round: {})",
            without / ROUNDS as f64,
            without / unshare,
            unpooled_pairs.join(" "),
            cycles / without,
            pool_pairs.join(" ")
        );
        print_phases(&unpooled_phases, ROUNDS * BATCH);
    }
}
