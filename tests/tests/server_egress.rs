//! Network egress through a real `nodus server` (root, process sandboxes started by the nodus
//! launcher) and the CLI, with the offline model (it runs the commands a prompt quotes in
//! backticks). The test's HTTP server listens on 127.0.0.1 of the host only; the sandbox
//! reaches it by the name `files.test`, which the server's `--egress-hosts` gives and its
//! `--egress-allow 127.0.0.1` lets through. A run whose environment allows `files.test`
//! fetches from it through the proxy (as a plain proxied request and through a CONNECT
//! tunnel); a name not on the list, an allowed name that resolves to a refused address
//! (`internal.test`, 127.0.0.2, which `--egress-allow` leaves out), a direct connection to
//! the test server's address and a raw socket are each refused, and none of them reaches the
//! test server. The proxy's decisions are journaled with the run (its result `egress`,
//! `nodus agentrun egress`, `status.egress`) and are still there after the server is killed
//! and started again; the direct connection and the raw socket never reach the proxy, so
//! they leave no record. A run with `egress: none` has no way out at all, no proxy variables
//! and no egress result. All of that holds for a server that is not root too (as root, the
//! test runs it as `nobody`). The operator's per-run limits hold: connections at once
//! (`--egress-max-connections`) and bytes (`--egress-max-bytes`: the connection that passes
//! it is cut off, later ones are refused, both recorded). A server whose sandboxes cannot
//! reach the proxy (started by bubblewrap) refuses a run with an allowlist, naming the field,
//! and writes nothing. On Docker (`NODUS_TEST_DOCKER_IMAGE`, busybox) a run with an allowlist
//! goes out through the same proxy from the engine's internal egress network, and nowhere
//! else. In an evaluation, the Environment's `spec.network` reaches the agent's run and
//! never the grader's sandbox.

#[path = "support/server.rs"]
mod server;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use server::ServerProcess;

/// The test's HTTP server: its port, the request lines it got, and the most requests it
/// served at once.
struct Origin {
    port: u16,
    seen: Arc<Mutex<Vec<String>>>,
    most_at_once: Arc<AtomicUsize>,
}

/// Bytes of the body of `/big`.
const BIG: usize = 3_000_000;

/// A plain HTTP server on the host's 127.0.0.1 that answers every request with
/// `hello from <path>` (after 1.5 s for paths starting with `/slow`; `/big` answers [`BIG`]
/// bytes) and keeps the request lines it got.
fn origin() -> Origin {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = listener.local_addr().expect("address").port();
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let most_at_once: Arc<AtomicUsize> = Arc::default();
    let active: Arc<AtomicUsize> = Arc::default();
    let shared = seen.clone();
    let most = most_at_once.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let shared = shared.clone();
            let (active, most) = (active.clone(), most.clone());
            std::thread::spawn(move || {
                let mut reader = BufReader::new(stream.try_clone().expect("clone"));
                let mut first = String::new();
                if reader.read_line(&mut first).is_err() {
                    return;
                }
                // The rest of the head.
                let mut line = String::new();
                while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                    line.clear();
                }
                let path = first.split_whitespace().nth(1).unwrap_or("?").to_string();
                shared
                    .lock()
                    .expect("lock")
                    .push(first.trim_end().to_string());
                let now = active.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                if path.starts_with("/slow") {
                    std::thread::sleep(Duration::from_millis(1500));
                }
                let body = if path == "/big" {
                    "x".repeat(BIG)
                } else {
                    format!("hello from {path}")
                };
                let _ = (&stream).write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                );
                active.fetch_sub(1, Ordering::SeqCst);
            });
        }
    });
    Origin {
        port,
        seen,
        most_at_once,
    }
}

/// `status.egress` of run `name`.
fn egress_status(server: &ServerProcess, name: &str) -> serde_json::Value {
    let text = server.ok(&[
        "get",
        &format!("agentrun/{name}"),
        "-o",
        "jsonpath={.status.egress}",
    ]);
    serde_json::from_str(text.trim()).expect("status.egress as JSON")
}

/// Start a process-sandbox server on `dir` whose egress proxy knows `files.test` and
/// `other.test` (127.0.0.1) and `internal.test` (127.0.0.2), may reach 127.0.0.1, and takes
/// `extra` flags.
fn egress_server(dir: &std::path::Path, extra: &[&str]) -> ServerProcess {
    egress_server_on(dir, "process", extra)
}

/// [`egress_server`] with sandboxes of kind `sandbox`.
fn egress_server_on(dir: &std::path::Path, sandbox: &str, extra: &[&str]) -> ServerProcess {
    egress_server_as(dir, sandbox, extra, &[])
}

/// [`egress_server_on`] started by `wrapper` (as another user, say).
fn egress_server_as(
    dir: &std::path::Path,
    sandbox: &str,
    extra: &[&str],
    wrapper: &[&str],
) -> ServerProcess {
    let hosts = dir.join("egress-hosts");
    std::fs::write(
        &hosts,
        "# the test's names\n127.0.0.1 files.test other.test\n127.0.0.2 internal.test\n",
    )
    .expect("hosts file");
    let mut flags = vec![
        "--egress-allow",
        "127.0.0.1",
        "--egress-hosts",
        hosts.to_str().expect("UTF-8"),
    ];
    flags.extend_from_slice(extra);
    ServerProcess::start_wrapped(
        &server::Backend::Sqlite.store_url(dir),
        dir,
        sandbox,
        &flags,
        &[],
        wrapper,
    )
}

/// Create run `name` of `net-agent` with `prompt` (in `environment` when given), wait until
/// it ends, and return its answer.
fn run(server: &ServerProcess, name: &str, prompt: &str, environment: Option<&str>) -> String {
    let mut create = vec![
        "create",
        "agentrun",
        name,
        "--agent",
        "net-agent",
        "--prompt",
        prompt,
    ];
    if let Some(environment) = environment {
        create.extend(["--environment", environment]);
    }
    server.ok(&create);
    server.ok(&[
        "wait",
        &format!("agentrun/{name}"),
        "--for=jsonpath={.status.phase}=Succeeded",
        "--timeout=2m",
    ]);
    server.ok(&["agentrun", "answer", name])
}

#[test]
fn a_run_on_an_allowlist_gets_out_only_through_the_proxy() {
    let dir = tempfile::tempdir().expect("tempdir");
    gets_out_only_through_the_proxy(dir.path(), &[]);
}

/// The same through a server that is not root (as root, the test runs it as `nobody`).
#[test]
fn an_unprivileged_server_s_run_gets_out_only_through_the_proxy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let wrapper = server::unprivileged_wrapper(dir.path());
    let server = gets_out_only_through_the_proxy(dir.path(), wrapper);
    server::assert_not_root(server.pid());
}

/// A run on an allowlist, checked end to end on a server in `dir` started by `wrapper`; the
/// server (started again once), still running.
fn gets_out_only_through_the_proxy(dir: &std::path::Path, wrapper: &[&str]) -> ServerProcess {
    let Origin { port, seen, .. } = origin();
    let mut server = egress_server_as(dir, "process", &[], wrapper);
    let resources = format!(
        "apiVersion: nodus.dev/v1\nkind: AgentEnvironment\nmetadata:\n  name: files\nspec:\n  \
         network:\n    egress: allowlist\n    allow:\n    - host: files.test\n      ports: \
         [{port}]\n    - host: internal.test\n      ports: [{port}]\n---\napiVersion: \
         nodus.dev/v1\nkind: Agent\nmetadata:\n  name: net-agent\nspec:\n  system: You are a \
         careful assistant.\n  perRunMaxCostUSD: \"0.50\"\n"
    );
    let output = server.cli_in(&["apply", "-f", "-"], Some(&resources));
    assert!(output.status.success(), "{output:?}");

    let fetch = format!(
        "curl -sS http://files.test:{port}/proxied; echo; \
         curl -sS -p http://files.test:{port}/tunnelled; echo; \
         curl -s -w ' other=%{{http_code}}' http://other.test:{port}/other; echo; \
         curl -s -w ' internal=%{{http_code}}' http://internal.test:{port}/internal; echo; \
         curl -s --noproxy '*' -m 5 http://127.0.0.1:{port}/direct; echo direct-exit=$?; \
         perl -MSocket -e 'if (socket(my $s, PF_INET, SOCK_RAW, 1)) {{ print qq(raw=opened\\n) }} else {{ print qq(raw=refused: $!\\n) }}'; \
         echo proxy=$HTTP_PROXY"
    );
    let answer = run(
        &server,
        "fetches",
        &format!("Run `{fetch}` and tell me."),
        Some("files"),
    );
    assert!(answer.contains("hello from /proxied"), "{answer}");
    assert!(answer.contains("hello from /tunnelled"), "{answer}");
    // The proxy's refusals name the rule.
    assert!(
        answer.contains("other.test is not in spec.network.allow\n other=403"),
        "{answer}"
    );
    assert!(
        answer.contains(
            "127.0.0.2 is an internal address (loopback) that the server's --egress-allow \
             does not list\n internal=403"
        ),
        "{answer}"
    );
    // curl's "could not connect" (7): the sandbox's 127.0.0.1 is its own.
    assert!(answer.contains("direct-exit=7"), "{answer}");
    assert!(answer.contains("raw=refused"), "{answer}");
    assert!(answer.contains("proxy=http://127.0.0.1:3128"), "{answer}");
    // Only the two allowed requests reached the test server.
    let requests = seen.lock().expect("lock").clone();
    assert_eq!(
        requests,
        ["GET /proxied HTTP/1.1", "GET /tunnelled HTTP/1.1"],
        "{answer}"
    );

    // Each connection the proxy was asked for is journaled with its verdict and rule; the
    // direct connection and the raw socket never reached the proxy and leave no record.
    let journaled = |server: &ServerProcess| {
        let records = server.egress_records("fetches");
        let seen: Vec<(String, String, String, String)> = records
            .iter()
            .map(|r| {
                let text = |name: &str| r[name].as_str().unwrap_or("-").to_string();
                (text("host"), text("address"), text("verdict"), text("rule"))
            })
            .collect();
        assert_eq!(
            seen,
            [
                (
                    "files.test",
                    "127.0.0.1",
                    "allowed",
                    "spec.network.allow[0]"
                ),
                (
                    "files.test",
                    "127.0.0.1",
                    "allowed",
                    "spec.network.allow[0]"
                ),
                (
                    "other.test",
                    "-",
                    "refused",
                    "other.test is not in spec.network.allow"
                ),
                (
                    "internal.test",
                    "127.0.0.2",
                    "refused",
                    "127.0.0.2 is an internal address (loopback) that the server's \
                     --egress-allow does not list"
                ),
            ]
            .map(|(h, a, v, r)| (
                h.to_string(),
                a.to_string(),
                v.to_string(),
                r.to_string()
            )),
        );
        assert!(records.iter().all(|r| r["port"] == port));
        // The allowed ones carried the request out and the answer back.
        for allowed in &records[..2] {
            assert!(allowed["bytesOut"].as_u64() > Some(20), "{allowed}");
            assert!(allowed["bytesIn"].as_u64() > Some(20), "{allowed}");
        }
        records
    };
    let records = journaled(&server);
    let status = egress_status(&server, "fetches");
    assert_eq!(status["allowed"], 2, "{status}");
    assert_eq!(status["refused"], 2, "{status}");
    let bytes_in: u64 = records.iter().filter_map(|r| r["bytesIn"].as_u64()).sum();
    assert_eq!(status["bytesIn"].as_u64(), Some(bytes_in), "{status}");
    let table = server.ok(&["agentrun", "egress", "fetches"]);
    assert!(
        table.contains(&format!("other.test:{port}")) && table.contains("refused"),
        "{table}"
    );

    // Kept in the store, not in the proxy's memory: a server killed and started again on
    // the same data directory serves them unchanged.
    server.kill();
    let server = egress_server_as(dir, "process", &[], wrapper);
    assert_eq!(journaled(&server), records);
    assert_eq!(egress_status(&server, "fetches"), status);

    // Without an allowlist there is no way out at all, and no proxy to point at.
    let answer = run(
        &server,
        "no-way-out",
        &format!(
            "Run `curl -s -m 5 -x http://127.0.0.1:3128 http://files.test:{port}/none; \
             echo none-exit=$?; echo proxy=[$HTTP_PROXY]` and tell me."
        ),
        None,
    );
    assert!(answer.contains("none-exit=7"), "{answer}");
    assert!(answer.contains("proxy=[]"), "{answer}");
    assert_eq!(seen.lock().expect("lock").len(), 2, "{answer}");
    // No proxy, no journal.
    let refused = server.fails(&["agentrun", "egress", "no-way-out"]);
    assert!(refused.contains("egress"), "{refused}");
    server
}

#[test]
fn a_runs_connections_at_once_and_bytes_are_bounded_by_the_operator() {
    let origin = origin();
    let port = origin.port;
    let dir = tempfile::tempdir().expect("tempdir");
    let server = egress_server(
        dir.path(),
        &[
            "--egress-max-connections",
            "2",
            "--egress-max-bytes",
            "1000000",
        ],
    );
    let resources = format!(
        "apiVersion: nodus.dev/v1\nkind: AgentEnvironment\nmetadata:\n  name: files\nspec:\n  \
         network:\n    egress: allowlist\n    allow:\n    - host: files.test\n      ports: \
         [{port}]\n---\napiVersion: nodus.dev/v1\nkind: Agent\nmetadata:\n  name: net-agent\n\
         spec:\n  system: You are a careful assistant.\n  perRunMaxCostUSD: \"0.50\"\n"
    );
    let output = server.cli_in(&["apply", "-f", "-"], Some(&resources));
    assert!(output.status.success(), "{output:?}");
    let fetch = format!(
        "for i in 1 2 3 4; do curl -s http://files.test:{port}/slow$i & done; wait; echo; \
         curl -s -o /dev/null -w 'big=%{{http_code}} size=%{{size_download}}' \
         http://files.test:{port}/big; echo \" big-exit=$?\"; \
         curl -s -w ' after=%{{http_code}}' http://files.test:{port}/after; echo"
    );
    let answer = run(
        &server,
        "bounded",
        &format!("Run `{fetch}` and tell me."),
        Some("files"),
    );
    // Four requests, never more than two at once.
    for i in 1..=4 {
        assert!(answer.contains(&format!("hello from /slow{i}")), "{answer}");
    }
    assert_eq!(origin.most_at_once.load(Ordering::SeqCst), 2, "{answer}");
    // The download that passed the run's bytes is cut off (curl: 18, a partial transfer),
    // and the next connection is refused.
    assert!(answer.contains("big-exit=18"), "{answer}");
    let size: usize = answer
        .rsplit("size=")
        .next()
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no size: {answer}"));
    assert!((900_000..BIG).contains(&size), "{size}: {answer}");
    assert!(
        answer.contains(
            "the run's connections have used the 1000000 bytes the server's \
             --egress-max-bytes allows a run\n after=403"
        ),
        "{answer}"
    );
    assert!(
        !origin
            .seen
            .lock()
            .expect("lock")
            .iter()
            .any(|line| line.contains("/after")),
        "{answer}"
    );

    let records = server.egress_records("bounded");
    assert_eq!(records.len(), 6, "{records:?}");
    let rule = |i: usize| records[i]["rule"].as_str().unwrap_or_default().to_string();
    for slow in &records[..4] {
        assert_eq!(slow["verdict"], "allowed", "{slow}");
    }
    assert_eq!(records[4]["verdict"], "refused", "{records:?}");
    assert!(
        rule(4).starts_with(
            "cut off: the run's connections passed the 1000000 bytes the server's \
             --egress-max-bytes allows a run (spec.network.allow[0] had allowed it)"
        ),
        "{records:?}"
    );
    let cut_in = records[4]["bytesIn"].as_u64().unwrap_or_default();
    assert!((900_000..BIG as u64).contains(&cut_in), "{records:?}");
    assert_eq!(records[5]["verdict"], "refused", "{records:?}");
    assert!(
        rule(5).contains("have used the 1000000 bytes"),
        "{records:?}"
    );
    let status = egress_status(&server, "bounded");
    assert_eq!(
        (&status["allowed"], &status["refused"]),
        (&4.into(), &2.into())
    );
    let total = status["bytesIn"].as_u64().unwrap_or_default()
        + status["bytesOut"].as_u64().unwrap_or_default();
    // Cut within a buffer or so of the limit.
    assert!((1_000_000..1_100_000).contains(&total), "{status}");
}

#[test]
fn an_allowlist_is_refused_where_sandboxes_cannot_reach_the_proxy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server =
        ServerProcess::start_sqlite(dir.path(), "process", &["--sandbox-starter", "bubblewrap"]);
    let output = server.cli_in(
        &["apply", "-f", "-"],
        Some(
            "apiVersion: nodus.dev/v1\nkind: Agent\nmetadata:\n  name: net-agent\nspec:\n  \
             system: You are a careful assistant.\n  perRunMaxCostUSD: \"0.50\"\n---\n\
             apiVersion: nodus.dev/v1\nkind: AgentRun\nmetadata:\n  name: allowlist-run\n\
             spec:\n  agent: net-agent\n  input: hello\n  environment:\n    network:\n      \
             egress: allowlist\n      allow:\n      - host: pypi.org\n",
        ),
    );
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "accepted: {stderr}");
    assert!(
        stderr.contains("spec.environment.network.egress")
            && stderr.contains("no route to the egress proxy")
            && stderr.contains("allowlist"),
        "{stderr}"
    );
    assert!(
        !server
            .cli(&["get", "agentrun/allowlist-run"])
            .status
            .success()
    );
}

/// The same on Docker: the container joins the engine's internal egress network, whose only
/// address outside it is the server's listener on its gateway. busybox's `wget` goes through
/// the proxy for plain HTTP; an allowed name is fetched; a name not on the list and an allowed
/// name that resolves to a refused address are refused (and journaled); a direct connection
/// to the test server's address, one to the gateway's address on the test server's port, and
/// a raw socket (`ping`) fail and reach nothing; the trust bundle holds the proxy's
/// authority. A run with `egress: none` has no way out at all.
#[test]
fn a_docker_run_on_an_allowlist_gets_out_only_through_the_proxy() {
    let image = std::env::var("NODUS_TEST_DOCKER_IMAGE").unwrap_or_else(|_| {
        panic!("NODUS_TEST_DOCKER_IMAGE is not set: run the tests with ./scripts/test, which builds the test image")
    });
    let Origin { port, seen, .. } = origin();
    let dir = tempfile::tempdir().expect("tempdir");
    let server = egress_server_on(dir.path(), "docker", &["--default-image", &image]);
    let resources = format!(
        "apiVersion: nodus.dev/v1\nkind: AgentEnvironment\nmetadata:\n  name: files\nspec:\n  \
         network:\n    egress: allowlist\n    allow:\n    - host: files.test\n      ports: \
         [{port}]\n    - host: internal.test\n      ports: [{port}]\n---\napiVersion: \
         nodus.dev/v1\nkind: Agent\nmetadata:\n  name: net-agent\nspec:\n  system: You are a \
         careful assistant.\n  perRunMaxCostUSD: \"0.50\"\n"
    );
    let output = server.cli_in(&["apply", "-f", "-"], Some(&resources));
    assert!(output.status.success(), "{output:?}");

    let fetch = format!(
        "wget -q -O - http://files.test:{port}/proxied; echo; \
         wget -q -O - http://other.test:{port}/other; echo other-exit=$?; \
         wget -q -O - http://internal.test:{port}/internal; echo internal-exit=$?; \
         wget -Y off -q -T 5 -O - http://127.0.0.1:{port}/direct; echo direct-exit=$?; \
         gateway=${{HTTP_PROXY#http://}}; gateway=${{gateway%:*}}; \
         wget -Y off -q -T 5 -O - http://$gateway:{port}/gateway; echo gateway-exit=$?; \
         ping -c 1 -W 1 127.0.0.1; \
         grep -c 'The Nodus egress proxy' $SSL_CERT_FILE; \
         echo proxy=$HTTP_PROXY"
    );
    let answer = run(
        &server,
        "fetches",
        &format!("Run `{fetch}` and tell me."),
        Some("files"),
    );
    assert!(answer.contains("hello from /proxied"), "{answer}");
    // busybox wget exits 1 on an HTTP error and on a refused connection alike.
    for refused in ["other", "internal", "direct", "gateway"] {
        assert!(answer.contains(&format!("{refused}-exit=1")), "{answer}");
    }
    assert!(answer.contains("ping: permission denied"), "{answer}");
    assert!(answer.contains("\n1\nproxy=http://"), "{answer}");
    // Only the allowed request reached the test server.
    assert_eq!(
        seen.lock().expect("lock").clone(),
        ["GET /proxied HTTP/1.1"],
        "{answer}"
    );
    let records = server.egress_records("fetches");
    // An allowed connection is recorded when it ends (with its bytes), so it may come after a
    // later refusal: the records are compared in host order.
    let mut seen_records: Vec<(String, String, String, String)> = records
        .iter()
        .map(|r| {
            let text = |name: &str| r[name].as_str().unwrap_or("-").to_string();
            (text("host"), text("address"), text("verdict"), text("rule"))
        })
        .collect();
    seen_records.sort();
    assert_eq!(
        seen_records,
        [
            (
                "files.test",
                "127.0.0.1",
                "allowed",
                "spec.network.allow[0]"
            ),
            (
                "internal.test",
                "127.0.0.2",
                "refused",
                "127.0.0.2 is an internal address (loopback) that the server's --egress-allow \
                 does not list"
            ),
            (
                "other.test",
                "-",
                "refused",
                "other.test is not in spec.network.allow"
            ),
        ]
        .map(|(h, a, v, r)| (h.to_string(), a.to_string(), v.to_string(), r.to_string())),
    );
    let allowed = records
        .iter()
        .find(|r| r["verdict"] == "allowed")
        .unwrap_or_else(|| panic!("the allowed connection's record: {records:?}"));
    assert!(allowed["bytesIn"].as_u64() > Some(20), "{records:?}");
    let status = egress_status(&server, "fetches");
    assert_eq!(
        (&status["allowed"], &status["refused"]),
        (&1.into(), &2.into())
    );

    // Without an allowlist: no network at all, no proxy variables.
    let answer = run(
        &server,
        "no-way-out",
        &format!(
            "Run `wget -Y off -q -T 5 -O - http://127.0.0.1:{port}/none; echo none-exit=$?; \
             ip -4 addr | grep -c inet; echo proxy=[$HTTP_PROXY]` and tell me."
        ),
        None,
    );
    assert!(answer.contains("none-exit=1"), "{answer}");
    // Loopback only.
    assert!(answer.contains("\n1\nproxy=[]"), "{answer}");
    assert_eq!(seen.lock().expect("lock").len(), 1, "{answer}");
}

/// Evaluation: an Environment's `spec.network` gives the agents of its evaluations an
/// allowlist, never their grader. The agent run of the one case fetches an allowed name
/// through the proxy (journaled with that run); the command grader, in a sandbox of its own,
/// tries the proxy's address and a direct connection to the test server, and both fail: its
/// sandbox has no network at all and no proxy variables.
#[test]
fn an_evaluation_s_agents_get_the_environment_s_allowlist_and_its_grader_no_network() {
    let Origin { port, seen, .. } = origin();
    let dir = tempfile::tempdir().expect("tempdir");
    let server = egress_server(dir.path(), &[]);
    let grader = format!(
        "p=$(curl -s -o /dev/null -m 5 -x http://127.0.0.1:3128 http://files.test:{port}/grader-proxy; echo $?); \
         d=$(curl -s -o /dev/null -m 5 --noproxy '*' http://127.0.0.1:{port}/grader-direct; echo $?); \
         printf '{{\"reward\": 1, \"passed\": true, \"evidence\": \"proxy=%s direct=%s env=[%s]\"}}\\n' \"$p\" \"$d\" \"$HTTP_PROXY\""
    );
    let resources = format!(
        "apiVersion: nodus.dev/v1\nkind: Agent\nmetadata:\n  name: net-agent\nspec:\n  system: \
         You are a careful assistant.\n  perRunMaxCostUSD: \"0.50\"\n---\napiVersion: \
         nodus.dev/v1\nkind: Environment\nmetadata:\n  name: net-tasks\nspec:\n  version: \
         1.0.0\n  network:\n    egress: allowlist\n    allow:\n    - host: files.test\n      \
         ports: [{port}]\n  splits:\n    test:\n      tasks:\n      - id: fetch\n        \
         prompt: {prompt}\n  grader:\n    kind: command\n    command: {grader}\n---\n\
         apiVersion: nodus.dev/v1\nkind: AgentGroup\nmetadata:\n  name: net-eval\nspec:\n  \
         agent: net-agent\n  maxCostUSD: \"1.00\"\n  evaluation:\n    environment: \
         net-tasks@1.0.0\n    tasks: 1\n    repetitions: 1\n    seed: 1\n    timeout: 5m\n",
        prompt = serde_json::to_string(&format!(
            "Run `curl -sS http://files.test:{port}/agent` and tell me."
        ))
        .expect("JSON"),
        grader = serde_json::to_string(&grader).expect("JSON"),
    );
    let output = server.cli_in(&["apply", "-f", "-"], Some(&resources));
    assert!(output.status.success(), "{output:?}");
    server.ok(&[
        "wait",
        "agentgroup/net-eval",
        "--for=jsonpath={.status.phase}=Succeeded",
        "--timeout=3m",
    ]);
    let results: serde_json::Value =
        serde_json::from_str(&server.ok(&["get", "results", "net-eval", "-o", "json"]))
            .expect("JSON");
    let result = &results["items"][0];
    assert_eq!(result["state"], "Scored", "{results}");
    // curl's "could not connect" (7) both ways: the grader has no proxy and no network.
    assert_eq!(result["evidence"], "proxy=7 direct=7 env=[]", "{results}");
    let run = result["run"].as_str().expect("a run");
    assert!(
        server
            .ok(&["agentrun", "answer", run])
            .contains("hello from /agent"),
        "{results}"
    );
    // Only the agent's request reached the test server, and the agent's run journaled it.
    assert_eq!(
        seen.lock().expect("lock").clone(),
        ["GET /agent HTTP/1.1"],
        "{results}"
    );
    let records = server.egress_records(run);
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0]["verdict"], "allowed", "{records:?}");
    assert_eq!(records[0]["rule"], "spec.network.allow[0]", "{records:?}");
}
