//! Remote Docker hosts (issue 30): one server places its runs' sandboxes on two Docker engines
//! this test starts on this machine — the first on a unix socket, the second listening on a
//! loopback TCP port with TLS (certificates the test makes with openssl, the client's in one
//! directory as the Docker CLI reads them) — each with capacity 2. Both hold sandboxes, never
//! more than 2 (sampled); `status.sandbox.host` names the engine. The second engine is
//! stopped mid-group: its runs finish on the first (a run whose command was under way when it
//! stopped parks, as after any interrupted command, and is resolved to run it again). A run
//! that failed over records the sandbox made again on the first engine in its command's
//! outcome, and its `status.sandbox.host` names the first engine, also after the server is
//! killed and started again (on the first engine alone: a server does not start while one
//! of its engines does not answer) while such runs are unfinished (the new server replays
//! their journals).
//!
//! Needs root (dockerd), `dockerd`, `docker`, `openssl` and `NODUS_TEST_DOCKER_IMAGE` (loaded
//! into both engines with `docker save | docker load`); fails when any is missing.

#[path = "support/server.rs"]
mod server;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nodus_core::cost::Usage;
use nodus_llm::testing::{Fake, FakeMessage, FakeServer, RecordedRequest};
use serde_json::{Value, json};
use server::{Backend, ServerProcess};

const PROJECT: &str = "/apis/nodus.dev/v1/projects/default";
const RUNS: usize = 8;
const PER_HOST: usize = 2;

fn image() -> String {
    std::env::var("NODUS_TEST_DOCKER_IMAGE").unwrap_or_else(|_| {
        panic!("NODUS_TEST_DOCKER_IMAGE is not set: run the tests with ./scripts/test, which builds the test image")
    })
}

fn run(command: &mut Command) -> String {
    let output = command.output().expect("the command starts");
    assert!(
        output.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate; the client's
/// `ca.pem`, `cert.pem`, `key.pem` in `client`, the server's in `server`.
fn make_certificates(server: &Path, client: &Path) {
    let openssl = |args: &[&str], dir: &Path| {
        run(Command::new("openssl").args(args).current_dir(dir));
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    openssl(
        &[
            &["req", "-x509"],
            &ec[..],
            &[
                "-keyout",
                "ca-key.pem",
                "-out",
                "ca.pem",
                "-days",
                "1",
                "-subj",
                "/CN=nodus-test-ca",
            ],
        ]
        .concat(),
        server,
    );
    openssl(
        &[
            &["req"],
            &ec[..],
            &[
                "-keyout",
                "key.pem",
                "-out",
                "server.csr",
                "-subj",
                "/CN=127.0.0.1",
            ],
        ]
        .concat(),
        server,
    );
    std::fs::write(
        server.join("server.ext"),
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
    )
    .expect("ext");
    openssl(
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca-key.pem",
            "-CAcreateserial",
            "-out",
            "cert.pem",
            "-days",
            "1",
            "-extfile",
            "server.ext",
        ],
        server,
    );
    openssl(
        &[
            &["req"],
            &ec[..],
            &[
                "-keyout",
                "client-key.pem",
                "-out",
                "client.csr",
                "-subj",
                "/CN=nodus",
            ],
        ]
        .concat(),
        server,
    );
    std::fs::write(server.join("client.ext"), "extendedKeyUsage=clientAuth\n").expect("ext");
    openssl(
        &[
            "x509",
            "-req",
            "-in",
            "client.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca-key.pem",
            "-CAcreateserial",
            "-out",
            "client-cert.pem",
            "-days",
            "1",
            "-extfile",
            "client.ext",
        ],
        server,
    );
    for (from, to) in [
        ("ca.pem", "ca.pem"),
        ("client-cert.pem", "cert.pem"),
        ("client-key.pem", "key.pem"),
    ] {
        std::fs::copy(server.join(from), client.join(to)).expect("a client file");
    }
}

/// A Docker engine of the test's own: its data, state, containerd and socket in `dir`, no
/// iptables rules (the sandboxes have no network), optionally also on a TCP port with TLS.
/// Stopped (and its directory and bridge removed) when dropped.
///
/// Its bridge is one the test makes (`bridge`, with an address of its own): an engine started
/// with `--bridge=none` deletes the host's `docker0` (Docker removes "the default bridge"
/// when told there is none), which broke every later `docker build` of the machine's engine;
/// with no `--bridge` it would take `docker0` and its addresses over.
struct Dockerd {
    child: Option<Child>,
    dir: PathBuf,
    bridge: String,
}

/// Engines started by this process, for their bridges' names and addresses.
static ENGINES: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// Runs `ip` with `args`, asserting that it succeeds.
fn ip(args: &[&str]) {
    let done = Command::new("ip")
        .args(args)
        .output()
        .expect("ip (iproute2) runs");
    assert!(done.status.success(), "ip {args:?}: {done:?}");
}

impl Dockerd {
    fn start(dir: &Path, tls: Option<(u16, &Path)>) -> Dockerd {
        std::fs::create_dir_all(dir).expect("the engine's directory");
        let n = ENGINES.fetch_add(1, Ordering::Relaxed);
        let bridge = format!("ndh{}x{n}", std::process::id());
        ip(&["link", "add", &bridge, "type", "bridge"]);
        ip(&[
            "addr",
            "add",
            &format!("10.231.{}.1/24", n % 250),
            "dev",
            &bridge,
        ]);
        let mut command = Command::new("dockerd");
        command
            .arg("--data-root")
            .arg(dir.join("data"))
            .arg("--exec-root")
            .arg(dir.join("exec"))
            .arg("--pidfile")
            .arg(dir.join("docker.pid"))
            .arg("-H")
            .arg(format!("unix://{}", dir.join("docker.sock").display()))
            .arg(format!("--bridge={bridge}"))
            .args(["--iptables=false", "--ip6tables=false", "--ip-masq=false"])
            .args(["--shutdown-timeout", "1"]);
        if let Some((port, certs)) = tls {
            command
                .args(["-H", &format!("tcp://127.0.0.1:{port}"), "--tlsverify"])
                .arg("--tlscacert")
                .arg(certs.join("ca.pem"))
                .arg("--tlscert")
                .arg(certs.join("cert.pem"))
                .arg("--tlskey")
                .arg(certs.join("key.pem"));
        }
        let log = std::fs::File::create(dir.join("dockerd.log")).expect("log");
        let child = command
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("dockerd starts (it needs root)");
        let engine = Dockerd {
            child: Some(child),
            dir: dir.to_path_buf(),
            bridge,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !engine
            .docker(&["version"])
            .status()
            .is_ok_and(|s| s.success())
        {
            assert!(
                Instant::now() < deadline,
                "the engine did not start: {}",
                std::fs::read_to_string(dir.join("dockerd.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        // The test image, from the machine's engine.
        let mut save = Command::new("docker")
            .args(["save", &image()])
            .stdout(Stdio::piped())
            .spawn()
            .expect("docker save");
        let loaded = engine
            .docker(&["load", "-q"])
            .stdin(save.stdout.take().expect("the image"))
            .output()
            .expect("docker load");
        assert!(save.wait().is_ok_and(|s| s.success()), "docker save");
        assert!(loaded.status.success(), "docker load: {loaded:?}");
        engine
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("docker.sock")
    }

    fn docker(&self, args: &[&str]) -> Command {
        let mut command = Command::new("docker");
        command
            .arg("-H")
            .arg(format!("unix://{}", self.socket().display()))
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command
    }

    /// This backend's containers on the engine.
    fn sandboxes(&self) -> usize {
        let output = self
            .docker(&["ps", "-aq", "--filter", "label=nodus.sandbox.key"])
            .output()
            .expect("docker ps");
        assert!(output.status.success(), "docker ps: {output:?}");
        String::from_utf8_lossy(&output.stdout).lines().count()
    }

    /// Stop the engine (SIGTERM: its containers are stopped, its ports closed).
    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
    }
}

impl Drop for Dockerd {
    fn drop(&mut self) {
        self.stop();
        let _ = Command::new("ip")
            .args(["link", "del", &self.bridge])
            .status();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Each run's model asks for two commands that sleep, then answers; while `hold` is set, the
/// answer waits 30 s (a run stops before it answers, after its commands).
fn responder(hold: &AtomicBool, request: &RecordedRequest) -> Fake {
    let results = request.body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|message| message["content"].as_array())
        .flatten()
        .filter(|block| block["type"] == "tool_result")
        .count();
    let usage = Usage {
        input_tokens: 200,
        output_tokens: 20,
        ..Usage::default()
    };
    let message = if results < 2 {
        FakeMessage::tool_use(
            &format!("toolu_c{results}"),
            &format!("sleep 2 && echo c{results}"),
        )
    } else {
        FakeMessage::text("done")
    };
    let reply = Fake::Message(message.with_usage(usage));
    if results >= 2 && hold.load(Ordering::SeqCst) {
        return Fake::Slow(Duration::from_secs(30), Box::new(reply));
    }
    reply
}

/// A run's commands that ran, and the host of the last sandbox one of them made again (its
/// own was lost), from its journal.
fn failover(server: &ServerProcess, name: &str) -> (usize, Option<String>) {
    let (status, steps) = server.http_with(
        "GET",
        &format!("{PROJECT}/agentruns/{name}/steps?payload=true"),
        &[],
        None,
    );
    assert_eq!(status, 200, "{steps}");
    let outcomes: Vec<&Value> = steps["items"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|step| &step["outcome"])
        .filter(|outcome| outcome["result"] == "commandFinished")
        .collect();
    let remade = outcomes
        .iter()
        .rev()
        .find_map(|outcome| outcome["remadeSandbox"]["host"].as_str())
        .map(str::to_string);
    (outcomes.len(), remade)
}

/// Resolves each parked run (its command was under way on the stopped engine) to run the
/// command again, once per run; `resolved` lists those done.
fn resolve_parked(server: &ServerProcess, resolved: &mut Vec<String>) {
    for run in runs(server) {
        let name = run["metadata"]["name"].as_str().unwrap_or_default();
        if phase(&run) == "NeedsResolution" && !resolved.iter().any(|done| done == name) {
            let (status, body) = server.http_with(
                "POST",
                &format!("{PROJECT}/agentruns/{name}/resolve"),
                &[],
                Some(r#"{"action":"retry"}"#),
            );
            assert_eq!(status, 200, "{body}");
            resolved.push(name.to_string());
        }
    }
}

fn runs(server: &ServerProcess) -> Vec<Value> {
    let (status, list) = server.http_with(
        "GET",
        &format!("{PROJECT}/agentruns?fieldSelector=spec.group=hosts"),
        &[],
        None,
    );
    assert_eq!(status, 200, "{list}");
    list["items"].as_array().cloned().unwrap_or_default()
}

fn phase(run: &Value) -> &str {
    run["status"]["phase"].as_str().unwrap_or("")
}

#[test]
fn runs_are_placed_on_two_docker_engines_by_capacity_and_fail_over_when_one_stops() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let fake = runtime
        .block_on(FakeServer::start())
        .expect("fake provider");
    let hold = Arc::new(AtomicBool::new(false));
    let held = hold.clone();
    fake.respond_with(move |request| responder(&held, request));
    // Short paths: containerd's sockets live under the exec root.
    let engines = tempfile::Builder::new()
        .prefix("nd")
        .tempdir_in("/tmp")
        .expect("the engines' directory");
    let (certs, client) = (engines.path().join("certs"), engines.path().join("client"));
    std::fs::create_dir_all(&certs).expect("certs");
    std::fs::create_dir_all(&client).expect("client");
    make_certificates(&certs, &client);
    let first = Dockerd::start(&engines.path().join("e1"), None);
    let port = server::free_port();
    let mut second = Dockerd::start(&engines.path().join("e2"), Some((port, &certs)));
    let (first_url, second_url) = (
        format!("unix://{}", first.socket().display()),
        format!("tcp://127.0.0.1:{port}"),
    );

    let dir = tempfile::tempdir().expect("data directory");
    let store = Backend::Sqlite.store_url(dir.path());
    let base_url = fake.base_url();
    // A server on the engines at `urls`.
    let start = |urls: &[&str]| {
        let (image, capacity, tls) = (
            image(),
            (2 * PER_HOST).to_string(),
            client.display().to_string(),
        );
        let hosts: Vec<String> = urls.iter().map(|url| format!("{url}={PER_HOST}")).collect();
        let mut args = vec!["--default-image", &image, "--capacity", &capacity];
        for host in &hosts {
            args.extend(["--docker-host", host.as_str()]);
        }
        args.extend(["--docker-tls-dir", &tls]);
        ServerProcess::start_in_env(
            &store,
            dir.path(),
            "docker",
            &args,
            &[
                ("ANTHROPIC_BASE_URL", base_url.as_str()),
                ("ANTHROPIC_API_KEY", "sk-ant-platform-hosts-0001"),
            ],
        )
    };
    let mut server = start(&[&first_url, &second_url]);
    for (plural, object) in [
        (
            "agents",
            json!({"apiVersion": "nodus.dev/v1", "kind": "Agent", "metadata": {"name": "sleeper"},
                "spec": {"system": "Sleep.", "model": {"access": "Nodus"}, "maxTokens": 1024,
                    "perRunMaxCostUSD": "0.50"}}),
        ),
        (
            "agentgroups",
            json!({"apiVersion": "nodus.dev/v1", "kind": "AgentGroup", "metadata": {"name": "hosts"},
                "spec": {"agent": "sleeper", "maxCostUSD": "10.00"}}),
        ),
    ] {
        let (status, body) = server.http_with(
            "POST",
            &format!("{PROJECT}/{plural}"),
            &[],
            Some(&object.to_string()),
        );
        assert_eq!(status, 201, "{plural}: {body}");
    }
    let items: Vec<Value> = (0..RUNS)
        .map(|i| {
            json!({"apiVersion": "nodus.dev/v1", "kind": "AgentRun", "metadata": {"name": format!("hosts-t{i}")},
                "spec": {"agent": "sleeper", "group": "hosts", "taskKey": format!("t{i}"), "input": "Sleep twice."}})
        })
        .collect();
    let list = json!({"apiVersion": "nodus.dev/v1", "kind": "AgentRunList", "items": items});
    let (status, body) = server.http_with(
        "POST",
        &format!("{PROJECT}/agentruns"),
        &[],
        Some(&list.to_string()),
    );
    assert_eq!(status, 201, "{body}");

    // Both engines hold sandboxes, neither more than its capacity; then the second stops.
    let mut most = [0usize; 2];
    let mut hosts_seen = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut samples = 0;
    let first_sample = jiff::Timestamp::now();
    loop {
        let held = [first.sandboxes(), second.sandboxes()];
        samples += 1;
        most = [most[0].max(held[0]), most[1].max(held[1])];
        let mut second_busy = false;
        for run in runs(&server) {
            if let Some(host) = run["status"]["sandbox"]["host"].as_str() {
                hosts_seen.insert(host.to_string());
                second_busy |= host == second_url && phase(&run) == "Running";
            }
        }
        // Full, and the status of a run there says so (it is written once the sandbox is).
        if held[1] == PER_HOST && held[0] > 0 && second_busy {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the second engine never filled: {held:?} after {samples} samples, the first at {first_sample:?}; runs {:?}; server log:\n{}",
            runs(&server)
                .iter()
                .map(|r| format!(
                    "{}={} {}",
                    r["metadata"]["name"],
                    phase(r),
                    r["status"]["message"]
                ))
                .collect::<Vec<_>>(),
            std::fs::read_to_string(&server.log).unwrap_or_default()
                + &server.ok(&["agentrun", "steps", "hosts-t0"])
                + &runs(&server)[0].to_string()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let on_second: Vec<String> = runs(&server)
        .iter()
        .filter(|run| run["status"]["sandbox"]["host"] == second_url.as_str())
        .filter(|run| phase(run) == "Running")
        .filter_map(|run| run["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    assert!(
        !on_second.is_empty(),
        "no unfinished run on the second engine ({second_url}): hosts seen {hosts_seen:?}; {:?}",
        runs(&server)
            .iter()
            .map(|r| format!(
                "{}={} {}",
                r["metadata"]["name"],
                phase(r),
                r["status"]["sandbox"]
            ))
            .collect::<Vec<_>>()
    );
    let before = most;
    // From here on the runs stop before they answer: the server is killed below while the
    // runs that failed over are unfinished.
    hold.store(true, Ordering::SeqCst);
    second.stop();

    // Each run of the second engine fails over at its next command (a parked one, whose
    // command was under way there, is resolved to run it again, on the first), unless its
    // commands were all done.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut resolved = Vec::new();
    let failed_over = loop {
        most[0] = most[0].max(first.sandboxes());
        resolve_parked(&server, &mut resolved);
        let states: Vec<(String, usize, Option<String>)> = on_second
            .iter()
            .map(|name| {
                let (commands, remade) = failover(&server, name);
                (name.clone(), commands, remade)
            })
            .collect();
        if states
            .iter()
            .all(|(_, commands, remade)| remade.is_some() || *commands == 2)
        {
            break states
                .into_iter()
                .filter_map(|(name, _, remade)| remade.map(|host| (name, host)))
                .collect::<Vec<_>>();
        }
        assert!(
            Instant::now() < deadline,
            "the second engine's runs did not fail over: {states:?}; steps {}; runs {:?}; server log:\n{}",
            on_second
                .iter()
                .map(|name| server.ok(&["agentrun", "steps", name]))
                .collect::<String>(),
            runs(&server)
                .iter()
                .map(|r| format!(
                    "{}={} {}",
                    r["metadata"]["name"],
                    phase(r),
                    r["status"]["message"]
                ))
                .collect::<Vec<_>>(),
            std::fs::read_to_string(&server.log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        !failed_over.is_empty(),
        "no run of the second engine ({on_second:?}) ran a command after it stopped"
    );
    for (name, host) in &failed_over {
        assert_eq!(
            host, &first_url,
            "{name} was made again on the first engine"
        );
    }
    // A crash and a restart: the new server replays the journals of the runs that failed over.
    // It is started on the first engine alone: a server does not start while one of its
    // engines does not answer.
    server.kill();
    hold.store(false, Ordering::SeqCst);
    server = start(&[&first_url]);

    // Every run ends.
    let deadline = Instant::now() + Duration::from_secs(120);
    let finished = loop {
        most[0] = most[0].max(first.sandboxes());
        resolve_parked(&server, &mut resolved);
        let runs = runs(&server);
        if runs
            .iter()
            .all(|run| matches!(phase(run), "Succeeded" | "Failed" | "Cancelled"))
        {
            break runs;
        }
        assert!(
            Instant::now() < deadline,
            "runs did not finish: {:?}",
            runs.iter()
                .map(|r| format!("{}={}", r["metadata"]["name"], phase(r)))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!(
        "most sandboxes per engine {most:?}; hosts seen {hosts_seen:?}; on the second when it \
         stopped {on_second:?}; failed over before the restart {failed_over:?}; resolved \
         {resolved:?}"
    );
    for run in &finished {
        assert_eq!(phase(run), "Succeeded", "{run}");
        if let Some(host) = run["status"]["sandbox"]["host"].as_str() {
            hosts_seen.insert(host.to_string());
        }
    }
    // A run whose sandbox was made again (a failover, a parked command run again, the
    // restart) says where: its status names the host of the last sandbox it was made again
    // in, the first engine, the only one that still answers.
    for run in &finished {
        let name = run["metadata"]["name"].as_str().unwrap_or_default();
        let (_, remade) = failover(&server, name);
        if let Some(host) = remade {
            assert_eq!(host, first_url, "{name}");
            assert_eq!(
                run["status"]["sandbox"]["host"],
                first_url.as_str(),
                "{name}: {}",
                run["status"]
            );
        }
    }
    // The runs that failed over before the restart, and every parked one (its command ran
    // again after the engine stopped), ended on the first engine.
    for name in failed_over.iter().map(|(name, _)| name).chain(&resolved) {
        let run = finished
            .iter()
            .find(|run| run["metadata"]["name"] == name.as_str())
            .expect("a listed run");
        assert_eq!(
            run["status"]["sandbox"]["host"],
            first_url.as_str(),
            "{name}: {}",
            run["status"]
        );
    }
    // Before the stop each engine held at most its capacity; after it the first takes the
    // second's sandboxes too, within the replica's capacity.
    assert!(
        before.iter().all(|&n| n <= PER_HOST),
        "an engine held more than {PER_HOST}: {before:?}"
    );
    assert!(
        most[0] <= 2 * PER_HOST,
        "the first engine held more than the replica's capacity: {most:?}"
    );
    assert_eq!(
        hosts_seen,
        [first_url.clone(), second_url.clone()]
            .into_iter()
            .collect(),
        "status.sandbox.host names both engines"
    );
    // The runs of the second engine finished on the first: every sandbox was deleted there.
    assert_eq!(first.sandboxes(), 0, "sandboxes left on the first engine");
    drop(server);
}
