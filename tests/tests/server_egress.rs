//! Network egress through a real `nodus server` (root, process sandboxes started by the nodus
//! launcher) and the CLI, with the offline model (it runs the commands a prompt quotes in
//! backticks). The test's HTTP server listens on 127.0.0.1 of the host only; the sandbox
//! reaches it by the name `files.test`, which the server's `--egress-hosts` gives and its
//! `--egress-allow 127.0.0.1` lets through. A run whose environment allows `files.test`
//! fetches from it through the proxy (as a plain proxied request and through a CONNECT
//! tunnel); a name not on the list, an allowed name that resolves to a refused address
//! (`internal.test`, 127.0.0.2, which `--egress-allow` leaves out), a direct connection to
//! the test server's address and a raw socket are each refused, and none of them reaches the
//! test server. A run with `egress: none` has no way out at all, and no proxy variables. A
//! server whose sandboxes cannot reach the proxy (started by bubblewrap) refuses a run with
//! an allowlist, naming the field, and writes nothing.

#[path = "support/server.rs"]
mod server;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use server::{Backend, ServerProcess};

/// A plain HTTP server on the host's 127.0.0.1 that answers every request with
/// `hello from <path>` and keeps the request lines it got.
fn origin() -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = listener.local_addr().expect("address").port();
    let seen: Arc<Mutex<Vec<String>>> = Arc::default();
    let shared = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let shared = shared.clone();
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
                let body = format!("hello from {path}");
                let _ = (&stream).write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                );
            });
        }
    });
    (port, seen)
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
    let (port, seen) = origin();
    let dir = tempfile::tempdir().expect("tempdir");
    let hosts = dir.path().join("egress-hosts");
    std::fs::write(
        &hosts,
        "# the test's names\n127.0.0.1 files.test other.test\n127.0.0.2 internal.test\n",
    )
    .expect("hosts file");
    let store = Backend::Sqlite.store_url(dir.path());
    let server = ServerProcess::start_with(
        &store,
        dir.path(),
        "process",
        &[
            "--egress-allow",
            "127.0.0.1",
            "--egress-hosts",
            hosts.to_str().expect("UTF-8"),
        ],
    );
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
}

#[test]
fn an_allowlist_is_refused_where_sandboxes_cannot_reach_the_proxy() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Backend::Sqlite.store_url(dir.path());
    let server = ServerProcess::start_with(
        &store,
        dir.path(),
        "process",
        &["--sandbox-starter", "bubblewrap"],
    );
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
