//! Credentials injected at the edge, through a real `nodus server` (process sandboxes started
//! by the nodus launcher) and the CLI, with the offline model (it runs the commands a prompt
//! quotes in backticks). The test's HTTPS server listens on 127.0.0.1 of the host only, with
//! a certificate for `secure.test` from an authority the test makes and gives the server with
//! `--egress-ca`; the sandbox reaches it by the names `secure.test` and `wrong.test`
//! (`--egress-hosts`, `--egress-allow 127.0.0.1`). A run whose environment injects an
//! `Authorization` header from a Secret for both names fetches `https://secure.test` through
//! the proxy: the server sees the header with the Secret's value (in place of one the command
//! forged), while the sandbox's environment, every process's `/proc/PID/environ`, its working
//! directory, the run's steps, results and answer and the server's log hold no trace of it.
//! `wrong.test` shows a certificate for another name and `untrusted.test` (another HTTPS
//! server of the test's) one from an authority the proxy is not given: the proxy refuses
//! both, says so, and journals them as refused (`upstream TLS: …`); a plain `http://` request
//! to an inject host is refused. The same holds on Docker (`NODUS_TEST_DOCKER_CURL_IMAGE`:
//! busybox and the host's curl), where the container reaches the proxy from the engine's
//! internal egress network and trusts its authority through the bundle bound into it.

#[path = "support/server.rs"]
mod server;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use server::{Backend, ServerProcess};

/// The Secret's value: it must reach the test's server and nothing else.
const PLANTED: &str = "Bearer inject-planted-value-6b3e90d2f1";

/// An authority of the test's and a certificate it signed for `host` (and nothing else): the
/// authority's PEM, and the server's TLS configuration.
fn test_authority(host: &str) -> (String, Arc<rustls::ServerConfig>) {
    let ca_key = rcgen::KeyPair::generate().expect("a key");
    let mut ca = rcgen::CertificateParams::default();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name.push(
        rcgen::DnType::CommonName,
        format!("the test's authority for {host}"),
    );
    ca.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).expect("self-signed");
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let leaf_key = rcgen::KeyPair::generate().expect("a key");
    let mut leaf = rcgen::CertificateParams::new(vec![host.to_string()]).expect("params");
    leaf.use_authority_key_identifier_extension = true;
    let leaf_cert = leaf.signed_by(&leaf_key, &issuer).expect("signed");
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into());
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(vec![leaf_cert.der().clone()], key)
    .expect("a server configuration");
    (ca_cert.pem(), Arc::new(config))
}

/// An HTTPS server on the host's 127.0.0.1 that answers each request with `hello over tls
/// from <path>` and keeps the heads it got (each a list of lines).
fn https_origin(config: Arc<rustls::ServerConfig>) -> (u16, Arc<Mutex<Vec<Vec<String>>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("a port");
    let port = listener.local_addr().expect("address").port();
    let seen: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
    let shared = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let (config, shared) = (config.clone(), shared.clone());
            std::thread::spawn(move || {
                let Ok(connection) = rustls::ServerConnection::new(config) else {
                    return;
                };
                let mut tls = rustls::StreamOwned::new(connection, stream);
                let mut reader = BufReader::new(&mut tls);
                let mut head = Vec::new();
                loop {
                    let mut line = String::new();
                    match reader.read_line(&mut line) {
                        Ok(n) if n > 2 => head.push(line.trim_end().to_string()),
                        _ => break,
                    }
                }
                if head.is_empty() {
                    return;
                }
                let path = head[0].split_whitespace().nth(1).unwrap_or("?").to_string();
                shared.lock().expect("lock").push(head);
                let body = format!("hello over tls from {path}");
                let _ = tls.write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                        body.len()
                    )
                    .as_bytes(),
                );
                tls.conn.send_close_notify();
                let _ = tls.flush();
            });
        }
    });
    (port, seen)
}

#[test]
fn an_injected_header_reaches_the_host_and_nothing_else() {
    let dir = tempfile::tempdir().expect("tempdir");
    injects_and_hides(dir.path(), Sandboxes::Process { wrapper: &[] });
}

/// The same on Docker: the container's curl goes through the proxy from the engine's internal
/// egress network and trusts the proxy's authority from the bundle bound into the container.
#[test]
fn a_docker_run_gets_its_header_injected_and_never_sees_it() {
    let image = std::env::var("NODUS_TEST_DOCKER_CURL_IMAGE").unwrap_or_else(|_| {
        panic!(
            "NODUS_TEST_DOCKER_CURL_IMAGE is not set: run the tests with ./scripts/test, which \
             builds the test images"
        )
    });
    let dir = tempfile::tempdir().expect("tempdir");
    injects_and_hides(dir.path(), Sandboxes::Docker { image: &image });
}

/// The same through a server that is not root: as root, the test runs it as `nobody` (its
/// data directory given to that user); otherwise it is not root already.
#[test]
fn an_unprivileged_server_injects_too() {
    let dir = tempfile::tempdir().expect("tempdir");
    let wrapper = server::unprivileged_wrapper(dir.path());
    let server = injects_and_hides(dir.path(), Sandboxes::Process { wrapper });
    server::assert_not_root(server.pid());
}

/// Where the server under test puts its runs.
#[derive(Clone, Copy)]
enum Sandboxes<'a> {
    /// Process sandboxes, the server started by `wrapper` (empty: directly).
    Process { wrapper: &'a [&'a str] },
    /// Docker containers of `image` (one with curl).
    Docker { image: &'a str },
}

/// A server in `dir` on `sandboxes` whose run injects a header, checked end to end; the
/// server, still running.
fn injects_and_hides(dir: &std::path::Path, sandboxes: Sandboxes) -> ServerProcess {
    let (ca_pem, config) = test_authority("secure.test");
    let (port, seen) = https_origin(config);
    // A server whose certificate's authority the proxy is not given.
    let (_, untrusted_config) = test_authority("untrusted.test");
    let (untrusted_port, untrusted_seen) = https_origin(untrusted_config);
    let hosts = dir.join("egress-hosts");
    std::fs::write(&hosts, "127.0.0.1 secure.test wrong.test untrusted.test\n")
        .expect("hosts file");
    let ca = dir.join("test-ca.pem");
    std::fs::write(&ca, &ca_pem).expect("the test's authority");
    let store = Backend::Sqlite.store_url(dir);
    let mut flags = vec![
        "--egress-allow",
        "127.0.0.1",
        "--egress-hosts",
        hosts.to_str().expect("UTF-8"),
        "--egress-ca",
        ca.to_str().expect("UTF-8"),
    ];
    let (sandbox, wrapper) = match sandboxes {
        Sandboxes::Process { wrapper } => ("process", wrapper),
        Sandboxes::Docker { image } => {
            flags.extend(["--default-image", image]);
            ("docker", &[][..])
        }
    };
    let server = ServerProcess::start_wrapped(
        &store,
        dir,
        sandbox,
        &flags,
        &[("NODUS_LOG", "debug")],
        wrapper,
    );
    let resources = format!(
        "apiVersion: nodus.dev/v1\nkind: Secret\nmetadata:\n  name: api-key\nstringData:\n  \
         authorization: \"{PLANTED}\"\n---\napiVersion: nodus.dev/v1\nkind: AgentEnvironment\n\
         metadata:\n  name: keyed\nspec:\n  network:\n    egress: allowlist\n    allow:\n    \
         - host: secure.test\n      ports: [{port}]\n    - host: wrong.test\n      ports: \
         [{port}]\n    - host: untrusted.test\n      ports: [{untrusted_port}]\n    inject:\n    \
         - host: secure.test\n      header: Authorization\n      \
         valueFrom: {{secretKeyRef: {{name: api-key, key: authorization}}}}\n    - host: \
         wrong.test\n      header: Authorization\n      valueFrom: {{secretKeyRef: {{name: \
         api-key, key: authorization}}}}\n    - host: untrusted.test\n      header: \
         Authorization\n      valueFrom: {{secretKeyRef: {{name: api-key, key: \
         authorization}}}}\n---\napiVersion: nodus.dev/v1\nkind: Agent\n\
         metadata:\n  name: net-agent\nspec:\n  system: You are a careful assistant.\n  \
         perRunMaxCostUSD: \"0.50\"\n"
    );
    let output = server.cli_in(&["apply", "-f", "-"], Some(&resources));
    assert!(output.status.success(), "{output:?}");

    let fetch = format!(
        "curl -sS https://secure.test:{port}/inject; echo; \
         curl -sS -H 'Authorization: forged' https://secure.test:{port}/forged; echo; \
         curl -s -w ' wrong=%{{http_code}}' https://wrong.test:{port}/wrong; echo; \
         curl -s -w ' untrusted=%{{http_code}}' https://untrusted.test:{untrusted_port}/u; echo; \
         curl -s -w ' plain=%{{http_code}}' http://secure.test:{port}/plain; echo; \
         grep -c 'The Nodus egress proxy' $SSL_CERT_FILE; echo bundled; \
         echo environment: ; env; \
         echo processes: ; cat /proc/[0-9]*/environ | tr '\\0' '\\n'"
    );
    server.ok(&[
        "create",
        "agentrun",
        "keyed",
        "--agent",
        "net-agent",
        "--environment",
        "keyed",
        "--prompt",
        &format!("Run `{fetch}` and tell me."),
    ]);
    server.ok(&[
        "wait",
        "agentrun/keyed",
        "--for=jsonpath={.status.phase}=Succeeded",
        "--timeout=2m",
    ]);
    let answer = server.ok(&["agentrun", "answer", "keyed"]);
    assert!(answer.contains("hello over tls from /inject"), "{answer}");
    assert!(answer.contains("hello over tls from /forged"), "{answer}");
    assert!(
        answer.contains("wrong.test's certificate is not trusted by the egress proxy (")
            && answer.contains(" wrong=502"),
        "{answer}"
    );
    assert!(
        answer.contains(
            "untrusted.test's certificate is not trusted by the egress proxy (UnknownIssuer)"
        ) && answer.contains(" untrusted=502"),
        "{answer}"
    );
    assert!(
        untrusted_seen.lock().expect("lock").is_empty(),
        "no request reached the untrusted server"
    );
    // The failed onward handshakes are journaled as refused, with why.
    let records = server.egress_records("keyed");
    let verdicts: Vec<(&str, &str, &str)> = records
        .iter()
        .map(|r| {
            let text = |name: &str| r[name].as_str().unwrap_or("-");
            (text("host"), text("verdict"), text("rule"))
        })
        .collect();
    assert_eq!(verdicts.len(), 5, "{records:?}");
    assert_eq!(
        verdicts[3],
        (
            "untrusted.test",
            "refused",
            "upstream TLS: untrusted.test's certificate is not trusted by the egress proxy \
             (UnknownIssuer)"
        ),
        "{records:?}"
    );
    let (host, verdict, rule) = verdicts[2];
    assert_eq!((host, verdict), ("wrong.test", "refused"), "{records:?}");
    assert!(
        rule.starts_with(
            "upstream TLS: wrong.test's certificate is not trusted by the egress proxy ("
        ),
        "{rule}"
    );
    assert_eq!(
        verdicts[..2],
        [("secure.test", "allowed", "spec.network.allow[0]"); 2]
    );
    assert!(
        answer.contains("http:// to secure.test is refused") && answer.contains(" plain=403"),
        "{answer}"
    );
    // The trust bundle holds the proxy's authority (once).
    assert!(answer.contains("\n1\nbundled"), "{answer}");
    // The dumps ran: the proxy's variables and the trust bundle's are there (the proxy on the
    // sandbox's loopback, or on the egress network's gateway for a container).
    let proxy = match sandboxes {
        Sandboxes::Process { .. } => "HTTPS_PROXY=http://127.0.0.1:3128",
        Sandboxes::Docker { .. } => "HTTPS_PROXY=http://",
    };
    assert!(
        answer.contains(proxy) && answer.contains("SSL_CERT_FILE="),
        "{answer}"
    );

    // The test's server got the two requests over TLS, each with the Secret's value as its one
    // Authorization header (the forged one replaced); nothing of wrong.test or the plain one.
    let heads = seen.lock().expect("lock").clone();
    let firsts: Vec<&str> = heads.iter().map(|head| head[0].as_str()).collect();
    assert_eq!(
        firsts,
        ["GET /inject HTTP/1.1", "GET /forged HTTP/1.1"],
        "{heads:?}"
    );
    for head in &heads {
        let authorization: Vec<&String> = head
            .iter()
            .filter(|line| line.to_ascii_lowercase().starts_with("authorization:"))
            .collect();
        assert_eq!(
            authorization,
            [&format!("Authorization: {PLANTED}")],
            "{head:?}"
        );
    }

    // The value shows nowhere but at the test's server.
    let mut places = server.run_texts("keyed", dir);
    places.push((
        "the working directory".to_string(),
        server.result_text("keyed", "outputWorkdir", dir),
    ));
    places.push((
        "the environment".to_string(),
        server.ok(&["get", "agentenvironment/keyed", "-o", "yaml"]),
    ));
    places.push((
        "the server's log".to_string(),
        std::fs::read_to_string(&server.log).expect("log"),
    ));
    for (place, text) in &places {
        assert!(
            !text.contains(PLANTED) && !text.contains("inject-planted-value"),
            "the Secret's value shows in {place}:\n{text}"
        );
    }
    server
}
