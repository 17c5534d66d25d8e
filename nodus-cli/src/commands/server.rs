//! `nodus server`: builds the server from its flags, announces what it runs on, and serves
//! until Ctrl-C or SIGTERM (then exits 0).

use std::path::{Path, PathBuf};

use nodus_server::{Options, SandboxKind, Server, StoreUrl};

use crate::cli::ServerArgs;
use crate::error::{Error, Result};

/// The options the flags describe.
pub fn options(args: ServerArgs) -> Result<Options> {
    let data_dir = args.data_dir.unwrap_or_else(nodus_server::default_data_dir);
    let mut options = Options::new(data_dir);
    options.listen = listen_address(&args.listen)?;
    options.store = args
        .store
        .as_deref()
        .map(str::parse::<StoreUrl>)
        .transpose()
        .map_err(Error::Input)?;
    options.sandbox = args.sandbox.parse::<SandboxKind>().map_err(Error::Input)?;
    options.bootstrap_token = args.bootstrap_token.filter(|t| !t.is_empty());
    options.default_image = args.default_image;
    options.docker_hosts = args
        .docker_host
        .iter()
        .map(|host| nodus_server::options::parse_docker_host(host, args.docker_tls_dir.as_deref()))
        .collect::<std::result::Result<_, _>>()
        .map_err(Error::Input)?;
    if !options.docker_hosts.is_empty() && options.sandbox != SandboxKind::Docker {
        return Err(Error::Input(
            "--docker-host places Docker sandboxes: it needs --sandbox docker".to_string(),
        ));
    }
    if args.docker_tls_dir.is_some() && args.docker_host.is_empty() {
        return Err(Error::Input(
            "--docker-tls-dir is for tcp:// Docker hosts: give --docker-host too".to_string(),
        ));
    }
    options.sandbox_dir = args.sandbox_dir;
    options.sandbox_launcher = sandbox_launcher(&args.sandbox_starter)?;
    if let Some(allow) = &args.webhook_allow {
        options.webhook_allow = allow.parse().map_err(Error::Input)?;
    }
    options.otlp = match args.otlp_endpoint.as_deref().filter(|e| !e.is_empty()) {
        Some(endpoint) => {
            let url = endpoint.parse::<reqwest::Url>().map_err(|e| {
                Error::Input(format!(
                    "--otlp-endpoint: not a URL ({e}); expected e.g. http://127.0.0.1:4318"
                ))
            })?;
            if !matches!(url.scheme(), "http" | "https") {
                return Err(Error::Input(
                    "--otlp-endpoint: the scheme must be http or https".to_string(),
                ));
            }
            Some(nodus_server::telemetry::OtlpOptions {
                endpoint: endpoint.to_string(),
                content: if args.otlp_content {
                    nodus_core::telemetry::Content::On
                } else {
                    nodus_core::telemetry::Content::Off
                },
            })
        }
        None if args.otlp_content => {
            return Err(Error::Input(
                "--otlp-content needs --otlp-endpoint (or OTEL_EXPORTER_OTLP_ENDPOINT)".to_string(),
            ));
        }
        None => None,
    };
    options.snapshots = match args.snapshots {
        crate::cli::Switch::On => Some(nodus_core::snapshot::Budget {
            limit_bytes: args.snapshot_budget,
        }),
        crate::cli::Switch::Off => None,
    };
    if let Some(allow) = &args.egress_allow {
        options.egress.allow =
            nodus_core::egress::parse_operator_allow(allow).map_err(Error::Input)?;
    }
    if let Some(path) = &args.egress_hosts {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::Input(format!(
                "--egress-hosts {}: cannot read it: {e}",
                path.display()
            ))
        })?;
        options.egress.hosts =
            nodus_server::egress_proxy::parse_hosts(&text).map_err(Error::Input)?;
    }
    if let Some(path) = &args.egress_ca {
        let text = std::fs::read_to_string(path).map_err(|e| {
            Error::Input(format!(
                "--egress-ca {}: cannot read it: {e}",
                path.display()
            ))
        })?;
        options.egress.extra_roots = nodus_server::egress_proxy::parse_extra_roots(&text)
            .map_err(|e| Error::Input(format!("{e} ({})", path.display())))?;
    }
    let count = |value: u64| usize::try_from(value).unwrap_or(usize::MAX);
    options.egress.max_connections = count(args.egress_max_connections);
    options.egress.max_bytes = args.egress_max_bytes;
    options.max_connections = count(args.max_connections);
    options.header_timeout = std::time::Duration::from_secs(args.header_timeout);
    options.admission.max_body_memory = count(args.max_body_memory.saturating_mul(1024 * 1024));
    options.admission.max_bodies_per_token = count(args.max_bodies_per_token);
    options.admission.max_streams_per_token = count(args.max_streams_per_token);
    options.admission.max_streams_per_session = count(args.max_streams_per_session);
    if let Some(capacity) = args.capacity {
        options.capacity = count(capacity);
    }
    options.role = args.role.parse().map_err(Error::Input)?;
    options.drain_timeout = std::time::Duration::from_secs(args.drain_timeout);
    Ok(options)
}

/// `--sandbox-starter`: the launcher (`launcher`, see [`launcher_beside`]), or none
/// (`bubblewrap`).
pub fn sandbox_launcher(starter: &str) -> Result<Option<PathBuf>> {
    match starter {
        "launcher" => Ok(std::env::current_exe()
            .ok()
            .map(|exe| launcher_beside(&exe))),
        "bubblewrap" | "bwrap" => Ok(None),
        other => Err(Error::usage(format!(
            "--sandbox-starter {other:?}: must be launcher or bubblewrap"
        ))),
    }
}

/// The launcher for the `nodus` binary at `exe`: the program `nodus-launch` beside it (both
/// are installed by `cargo install --path nodus-cli`), which starts faster than `nodus`; else
/// `exe` itself (`nodus --nodus-launch`).
pub fn launcher_beside(exe: &Path) -> PathBuf {
    let beside = exe.with_file_name(LAUNCHER_PROGRAM);
    if beside.is_file() {
        beside
    } else {
        exe.to_path_buf()
    }
}

/// The name of the launcher's own program.
const LAUNCHER_PROGRAM: &str = "nodus-launch";

/// `--listen`: HOST:PORT, where HOST is an address or a name (`localhost:7070`); a name
/// listens on the first IPv4 address it resolves to (where `nodus login`'s default,
/// 127.0.0.1, finds a local server), else on its first address.
pub fn listen_address(text: &str) -> Result<std::net::SocketAddr> {
    use std::net::ToSocketAddrs as _;
    let usage = |why: &str| {
        Error::usage(format!(
            "--listen {text:?}: {why} (HOST:PORT, such as 127.0.0.1:7070 or localhost:7070)"
        ))
    };
    let addresses: Vec<std::net::SocketAddr> = text
        .to_socket_addrs()
        .map_err(|e| usage(&format!("cannot be resolved: {e}")))?
        .collect();
    addresses
        .iter()
        .find(|a| a.is_ipv4())
        .or(addresses.first())
        .copied()
        .ok_or_else(|| usage("resolves to no address"))
}

/// `nodus server drain NAME`: ask the replica NAME to drain (it hears it through the store,
/// wherever it runs) and say so.
pub async fn drain(client: &crate::client::Client, name: &str) -> Result<()> {
    client
        .send(
            reqwest::Method::POST,
            &["apis", "nodus.dev", "v1", "replicas", name, "drain"],
            &[],
            None,
            &[],
        )
        .await?;
    super::outln(&format!(
        "replica/{name} asked to drain: it takes no more runs, lets its running commands \
         finish up to its --drain-timeout, hands its runs over and stops"
    ));
    Ok(())
}

/// Start the server and serve until Ctrl-C or SIGTERM. It says it serves only once it holds
/// its address: a busy port is an error before that.
pub async fn run(args: ServerArgs) -> Result<()> {
    init_logging();
    let options = options(args)?;
    let server = Server::build(options)
        .await
        .map_err(|e| Error::Start(format!("the server cannot start: {e}")))?;
    let announcements = server.announcements.clone();
    let bound = server
        .bind()
        .await
        .map_err(|e| Error::Start(format!("the server cannot start: {e}")))?;
    for line in &announcements {
        eprintln!("nodus server: {line}");
    }
    let listen = bound.local_addr();
    eprintln!("nodus server: serving the API on http://{listen} (Ctrl-C stops it)");
    bound
        .serve(shutdown())
        .await
        .map_err(|e| Error::Start(format!("the server stopped: {e}")))?;
    eprintln!("nodus server: stopped");
    Ok(())
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = terminate.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Logs to stderr at the level in `NODUS_LOG` (error, warn, info, debug, trace; default
/// info).
pub fn init_logging() {
    let level = std::env::var("NODUS_LOG")
        .ok()
        .and_then(|l| l.parse::<tracing_subscriber::filter::LevelFilter>().ok())
        .unwrap_or(tracing_subscriber::filter::LevelFilter::INFO);
    let _ = tracing_subscriber::fmt()
        .with_max_level(level)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser as _;

    fn server_args(line: &str) -> ServerArgs {
        match Cli::try_parse_from(line.split(' '))
            .expect("parses")
            .command
        {
            Command::Server(args) => args,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_launcher_is_the_program_beside_nodus_when_there_is_one() {
        let dir = tempfile::tempdir().expect("dir");
        let exe = dir.path().join("nodus");
        std::fs::write(&exe, "").expect("nodus");
        assert_eq!(launcher_beside(&exe), exe, "alone: nodus --nodus-launch");
        std::fs::create_dir(dir.path().join(LAUNCHER_PROGRAM)).expect("a directory");
        assert_eq!(launcher_beside(&exe), exe, "a directory is no launcher");
        let dir2 = tempfile::tempdir().expect("dir");
        let exe2 = dir2.path().join("nodus");
        std::fs::write(dir2.path().join(LAUNCHER_PROGRAM), "").expect("launcher");
        assert_eq!(launcher_beside(&exe2), dir2.path().join("nodus-launch"));
    }

    #[test]
    fn flags_become_options() {
        let options = options(server_args(
            "nodus server --store memory: --sandbox unisolated --data-dir /tmp/n --listen 127.0.0.1:7171 --bootstrap-token T",
        ))
        .expect("valid");
        assert_eq!(options.store, Some(StoreUrl::Memory));
        assert_eq!(options.sandbox, SandboxKind::Unisolated);
        assert_eq!(options.listen.to_string(), "127.0.0.1:7171");
        assert_eq!(options.data_dir, std::path::PathBuf::from("/tmp/n"));
        assert_eq!(options.bootstrap_token.as_deref(), Some("T"));
        let error = options_error("nodus server --store mysql://x");
        assert!(error.contains("sqlite://PATH"), "{error}");
        let error = options_error("nodus server --sandbox vm");
        assert!(error.contains("unisolated"), "{error}");
    }

    #[test]
    fn listen_takes_host_names() {
        let options = options(server_args("nodus server --listen localhost:7320")).expect("valid");
        assert!(options.listen.ip().is_loopback(), "{}", options.listen);
        assert_eq!(options.listen.port(), 7320);
        let error = options_error("nodus server --listen localhost");
        assert!(error.contains("--listen \"localhost\""), "{error}");
        assert!(error.contains("HOST:PORT"), "{error}");
    }

    fn options_error(line: &str) -> String {
        options(server_args(line)).expect_err("invalid").to_string()
    }
}
