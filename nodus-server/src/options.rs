//! What `nodus server` is started with. The embedded default needs no flags: SQLite in the
//! user's data directory, the process sandbox, `127.0.0.1:7070`, and the model from
//! `ANTHROPIC_API_KEY` — or the offline model when no key is set.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

/// Where state is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// In memory: nothing survives the process.
    Memory,
    /// One SQLite file.
    Sqlite(PathBuf),
    /// A PostgreSQL server, shared by replicas.
    Postgres(String),
}

impl FromStr for StoreUrl {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text == "memory:" || text == "memory" {
            Ok(StoreUrl::Memory)
        } else if let Some(path) = text.strip_prefix("sqlite://") {
            if path.is_empty() {
                return Err(
                    "sqlite:// needs a file path, as in sqlite:///var/lib/nodus/nodus.db".into(),
                );
            }
            Ok(StoreUrl::Sqlite(PathBuf::from(path)))
        } else if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            Ok(StoreUrl::Postgres(text.to_string()))
        } else {
            Err(format!(
                "--store takes memory:, sqlite://PATH or postgres://…, not {text:?}"
            ))
        }
    }
}

/// The SQLite file of a server given no `--store`, in its data directory.
pub(crate) const SQLITE_FILE: &str = "nodus.db";

/// Where runs' commands execute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxKind {
    /// Processes isolated with bubblewrap (the default).
    Process,
    /// Docker containers.
    Docker,
    /// Plain local processes, no isolation; only when asked for by name, and every run in it
    /// records that it was unisolated.
    Unisolated,
}

impl FromStr for SandboxKind {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "process" => Ok(SandboxKind::Process),
            "docker" => Ok(SandboxKind::Docker),
            "unisolated" => Ok(SandboxKind::Unisolated),
            other => Err(format!(
                "--sandbox takes process, docker or unisolated, not {other:?}"
            )),
        }
    }
}

/// What a replica does (`--role`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Serves the API and drives runs (the default).
    All,
    /// Serves the API and drives nothing: its runs are driven by the worker replicas.
    Api,
    /// Drives runs and serves only `/healthz` and `/metrics`.
    Worker,
}

impl Role {
    /// Whether a replica of this role starts a runner.
    pub fn drives(self) -> bool {
        self != Role::Api
    }

    /// The role's name, as `--role` takes it and `nodus get replicas` shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::All => "all",
            Role::Api => "api",
            Role::Worker => "worker",
        }
    }
}

impl FromStr for Role {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "all" => Ok(Role::All),
            "api" => Ok(Role::Api),
            "worker" => Ok(Role::Worker),
            other => Err(format!("--role takes all, api or worker, not {other:?}")),
        }
    }
}

/// The memory counted per sandbox when a replica's capacity is sized from its host: a
/// sandbox may use up to its limit (1 GiB by default), but most commands use far less.
pub const MEMORY_PER_SANDBOX: u64 = 512 << 20;

/// Sandboxes per CPU when a replica's capacity is sized from its host: a run's sandbox is
/// idle while its model answers, which is most of a run.
pub const SANDBOXES_PER_CPU: usize = 4;

/// A replica's capacity (live sandboxes at once) on a host with `cpus` CPUs and
/// `memory_bytes` of memory: [`SANDBOXES_PER_CPU`] per CPU, at most one per
/// [`MEMORY_PER_SANDBOX`], at least one.
pub fn default_capacity(cpus: usize, memory_bytes: u64) -> usize {
    let by_memory = usize::try_from(memory_bytes / MEMORY_PER_SANDBOX).unwrap_or(usize::MAX);
    cpus.saturating_mul(SANDBOXES_PER_CPU).min(by_memory).max(1)
}

/// [`default_capacity`] of this host: its CPUs as the process may use them, its memory from
/// `/proc/meminfo` (when that cannot be read, the CPUs alone decide).
pub fn host_capacity() -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| mem_total(&text))
        .unwrap_or(u64::MAX);
    default_capacity(cpus, memory)
}

/// `MemTotal` of a `/proc/meminfo` text, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// Everything the server is started with.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where the API listens.
    pub listen: SocketAddr,
    /// Where state is kept; `None`: SQLite in the data directory.
    pub store: Option<StoreUrl>,
    /// Where commands run.
    pub sandbox: SandboxKind,
    /// The Anthropic API: the platform key and the base URL (by default from
    /// `ANTHROPIC_API_KEY` and `ANTHROPIC_BASE_URL`). Without a key, platform runs use the
    /// offline model at $0, and BYOK runs still call this base URL with their own key.
    pub anthropic: nodus_llm::AnthropicConfig,
    /// The data directory (token file, server key, SQLite file, sandboxes' working dirs).
    pub data_dir: PathBuf,
    /// The admin token to register instead of generating one.
    pub bootstrap_token: Option<String>,
    /// Live sandboxes at once on this replica (`--capacity`): it drives at most this many
    /// runs at once and claims no other run's lease while full, so other replicas take
    /// them.
    pub capacity: usize,
    /// What this replica does (`--role`).
    pub role: Role,
    /// How long a drain (SIGTERM) lets running commands finish before it cuts them and hands
    /// their runs over (`--drain-timeout`).
    pub drain_timeout: Duration,
    /// The image of container sandboxes when a run names none.
    pub default_image: Option<String>,
    /// The Docker engines of `--sandbox docker` (`--docker-host`, repeatable); none: the local
    /// engine's socket.
    pub docker_hosts: Vec<DockerHostOption>,
    /// Working-directory snapshots after each command, with the bytes of new content each
    /// run's snapshots may keep (`--snapshot-budget`; 1 GiB by default: past it, later steps
    /// cannot be forked from); `None` (`--snapshots off`): none taken, no fork.
    pub snapshots: Option<nodus_core::snapshot::Budget>,
    /// Where process sandboxes keep their working directories; `None`:
    /// [`default_sandbox_dir`] of the data directory.
    pub sandbox_dir: Option<PathBuf>,
    /// Nodus's own sandbox launcher for process sandboxes (an executable that runs
    /// `nodus_launch::run_if_asked` first: the `nodus` binary); `None`, or a launcher that
    /// fails its self-check on this host, means bubblewrap.
    pub sandbox_launcher: Option<PathBuf>,
    /// How long a connection may take to send a request's headers, counted from when it
    /// opened or its last response was sent; this also closes idle keep-alive connections.
    pub header_timeout: Duration,
    /// HTTP connections served at once; more wait in the kernel's backlog. At most half the
    /// process's limit of open files.
    pub max_connections: usize,
    /// What request bodies and streams may hold (per token, per console session, in all);
    /// a body's pause and the base of its deadline are `header_timeout`, and streams take at
    /// most half of `max_connections`.
    pub admission: crate::admission::AdmissionLimits,
    /// The internal hosts, addresses and CIDRs webhooks may reach (by default none: loopback,
    /// private, link-local and metadata addresses are refused).
    pub webhook_allow: crate::egress::WebhookAllow,
    /// The egress proxy's internal networks (`--egress-allow`) and own names
    /// (`--egress-hosts`); by default none of either.
    pub egress: crate::egress_proxy::ProxyConfig,
    /// Post-run actions an embedder installs besides the built-in `agents.noop` and
    /// `agents.webhook` (none by default), with [`Registry::with`](nodus_core::postrun::Registry::with).
    pub actions: nodus_core::postrun::Registry,
    /// How long a watch stream goes without an event before it sends a `BOOKMARK`.
    pub watch_bookmark_interval: Duration,
    /// Where to export OpenTelemetry traces (OTLP/HTTP); `None`: no export.
    pub otlp: Option<crate::telemetry::OtlpOptions>,
}

impl Options {
    /// The embedded default in `data_dir`.
    pub fn new(data_dir: PathBuf) -> Self {
        Options {
            listen: SocketAddr::from(([127, 0, 0, 1], 7070)),
            store: None,
            sandbox: SandboxKind::Process,
            anthropic: nodus_llm::AnthropicConfig::from_env(),
            data_dir,
            bootstrap_token: None,
            capacity: host_capacity(),
            role: Role::All,
            drain_timeout: Duration::from_secs(30),
            default_image: None,
            docker_hosts: Vec::new(),
            snapshots: Some(nodus_core::snapshot::Budget::default()),
            sandbox_dir: None,
            sandbox_launcher: None,
            header_timeout: Duration::from_secs(10),
            max_connections: 4096,
            admission: crate::admission::AdmissionLimits::default(),
            webhook_allow: crate::egress::WebhookAllow::default(),
            egress: crate::egress_proxy::ProxyConfig::default(),
            actions: nodus_core::postrun::Registry::default(),
            watch_bookmark_interval: crate::watch::DEFAULT_BOOKMARK_INTERVAL,
            otlp: None,
        }
    }

    /// Where process sandboxes keep their working directories.
    pub fn sandbox_dir(&self) -> PathBuf {
        self.sandbox_dir
            .clone()
            .unwrap_or_else(|| default_sandbox_dir(&self.data_dir))
    }

    /// Who this server's Docker sandboxes belong to: one name per store, so that the
    /// replicas of one Postgres store (given the same address) share it and another
    /// installation on the same engine has its own (its containers are never this one's
    /// orphans). A digest of the store's address (a SQLite file or an in-memory store on
    /// this host: the host's name and the path; Postgres: its address without user or
    /// password), never the address itself.
    pub fn sandbox_owner(&self) -> String {
        let store = match &self.store {
            Some(StoreUrl::Postgres(url)) => format!("postgres {}", without_credentials(url)),
            Some(StoreUrl::Sqlite(path)) => format!("sqlite {} {}", host_name(), resolved(path)),
            None => format!(
                "sqlite {} {}",
                host_name(),
                resolved(&self.data_dir.join(SQLITE_FILE))
            ),
            Some(StoreUrl::Memory) => {
                format!("memory {} {}", host_name(), resolved(&self.data_dir))
            }
        };
        let digest = nodus_core::digest::sha256_hex(store.as_bytes());
        digest.chars().take(32).collect()
    }
}

/// `path` with its links and relative parts resolved, when it exists; as given otherwise.
fn resolved(path: &std::path::Path) -> String {
    std::fs::canonicalize(path)
        .unwrap_or_else(|_| path.to_path_buf())
        .display()
        .to_string()
}

/// This host's name (empty when it cannot be read).
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_string())
        .unwrap_or_default()
}

/// A Postgres address without its user and password: `postgres://HOST:PORT/DB?…`, the query
/// without `user` and `password`.
fn without_credentials(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("postgres", url));
    let (address, query) = rest.split_once('?').unwrap_or((rest, ""));
    let address = address.rsplit_once('@').map_or(address, |(_, host)| host);
    let query: Vec<&str> = query
        .split('&')
        .filter(|pair| {
            let key = pair.split('=').next().unwrap_or_default();
            !pair.is_empty() && key != "user" && key != "password"
        })
        .collect();
    let scheme = scheme.replace("postgresql", "postgres");
    match query.is_empty() {
        true => format!("{scheme}://{address}"),
        false => format!("{scheme}://{address}?{}", query.join("&")),
    }
}

/// Where the process sandboxes of a server with `data_dir` keep their working directories by
/// default. A server that is not root: `data_dir/sandboxes`. A root server runs its sandboxes
/// as an unprivileged user, which must be able to reach them, and a data directory (0700,
/// often under `/root`) is not reachable: `/var/lib/nodus/sandboxes/<12 hex digits of the
/// SHA-256 of the data directory's absolute path>`, so that servers with different data
/// directories do not share one, and the path shows a sandbox nothing of the data directory.
pub fn default_sandbox_dir(data_dir: &Path) -> PathBuf {
    if !rustix::process::getuid().is_root() {
        return data_dir.join("sandboxes");
    }
    let absolute = std::path::absolute(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    let digest = nodus_core::digest::sha256_hex(absolute.as_os_str().as_encoded_bytes());
    Path::new(ROOT_SANDBOX_AREA).join(digest.get(..12).unwrap_or(&digest))
}

/// Where a root server keeps its sandboxes' working directories by default.
pub const ROOT_SANDBOX_AREA: &str = "/var/lib/nodus/sandboxes";

/// The user's data directory for Nodus: `$XDG_DATA_HOME/nodus`, or `~/.local/share/nodus`.
pub fn default_data_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("nodus");
    }
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(home) => PathBuf::from(home).join(".local/share/nodus"),
        None => PathBuf::from(".nodus"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_names_one_sandbox_owner_whatever_its_credentials_and_never_says_them() {
        let with = |store: &str, data_dir: &str| {
            let mut options = Options::new(PathBuf::from(data_dir));
            options.store = Some(store.parse().expect("a store"));
            options.sandbox_owner()
        };
        let replica = with(
            "postgres://nodus:s3cret@db:5432/nodus?sslmode=require",
            "/a",
        );
        assert_eq!(
            replica,
            with(
                "postgresql://other:pw@db:5432/nodus?password=x&sslmode=require",
                "/b"
            ),
            "the replicas of one store share it"
        );
        assert_ne!(replica, with("postgres://nodus:s3cret@db:5432/other", "/a"));
        assert_ne!(
            with("sqlite:///var/lib/a/nodus.db", "/a"),
            with("sqlite:///var/lib/b/nodus.db", "/a"),
            "two SQLite files, two owners"
        );
        assert_eq!(replica.len(), 32);
        assert!(replica.chars().all(|c| c.is_ascii_hexdigit()), "{replica}");
        assert_eq!(
            without_credentials("postgres://nodus:s3cret@db:5432/nodus?user=u&password=p&a=b"),
            "postgres://db:5432/nodus?a=b"
        );
    }

    #[test]
    fn a_replica_is_sized_by_its_cpus_and_its_memory_whichever_allows_fewer() {
        let gib = 1u64 << 30;
        // (cpus, memory) → capacity
        let table = [
            ((2, 16 * gib), 8),
            ((2, 2 * gib), 4),
            ((16, 8 * gib), 16),
            ((64, 512 * gib), 256),
            ((1, 100 << 20), 1),
            ((0, 0), 1),
            ((4, u64::MAX), 16),
        ];
        for ((cpus, memory), expected) in table {
            assert_eq!(
                default_capacity(cpus, memory),
                expected,
                "{cpus} CPUs, {memory} bytes"
            );
        }
    }

    #[test]
    fn meminfo_gives_its_total_in_bytes() {
        let text = "MemTotal:       16318496 kB\nMemFree:         1000 kB\n";
        assert_eq!(mem_total(text), Some(16_318_496 * 1024));
        assert_eq!(mem_total("MemFree: 1 kB\n"), None);
    }

    #[test]
    fn roles_parse_and_only_an_api_replica_drives_nothing() {
        for role in [Role::All, Role::Api, Role::Worker] {
            assert_eq!(role.as_str().parse::<Role>(), Ok(role));
        }
        assert!(Role::All.drives() && Role::Worker.drives() && !Role::Api.drives());
        let refused = "both".parse::<Role>().unwrap_err();
        assert!(
            refused.contains("all, api or worker") && refused.contains("both"),
            "{refused}"
        );
    }

    #[test]
    fn store_urls_parse_and_bad_ones_say_what_is_allowed() {
        assert_eq!("memory:".parse(), Ok(StoreUrl::Memory));
        assert_eq!(
            "sqlite:///tmp/n.db".parse(),
            Ok(StoreUrl::Sqlite(PathBuf::from("/tmp/n.db")))
        );
        assert!(matches!(
            "postgres://u@h/db".parse(),
            Ok(StoreUrl::Postgres(_))
        ));
        let error = "mysql://x".parse::<StoreUrl>().expect_err("unsupported");
        assert!(error.contains("sqlite://PATH"), "{error}");
        assert!("vm".parse::<SandboxKind>().is_err());
    }

    #[test]
    fn a_root_servers_sandboxes_live_outside_its_data_directory() {
        let one = Options::new(PathBuf::from("/root/.local/share/nodus"));
        let other = Options::new(PathBuf::from("/srv/nodus"));
        if rustix::process::getuid().is_root() {
            // The sandboxes' user cannot pass a 0700 data directory, and the path a sandbox
            // sees in its mountinfo says nothing of it.
            for options in [&one, &other] {
                let dir = options.sandbox_dir();
                assert!(dir.starts_with(ROOT_SANDBOX_AREA), "{}", dir.display());
                assert!(!dir.starts_with(&options.data_dir), "{}", dir.display());
            }
            assert_ne!(
                one.sandbox_dir(),
                other.sandbox_dir(),
                "one area per data directory"
            );
        } else {
            assert_eq!(one.sandbox_dir(), one.data_dir.join("sandboxes"));
        }
        let mut chosen = Options::new(PathBuf::from("/srv/nodus"));
        chosen.sandbox_dir = Some(PathBuf::from("/data/boxes"));
        assert_eq!(chosen.sandbox_dir(), PathBuf::from("/data/boxes"));
    }
}

/// One `--docker-host URL[=capacity]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DockerHostOption {
    /// Where the engine listens.
    pub endpoint: nodus_sandbox::docker::Endpoint,
    /// The most sandboxes it holds at once; `None`: the replica's capacity.
    pub capacity: Option<usize>,
}

/// Parses `--docker-host URL[=capacity]`: `unix:///PATH` or `tcp://HOST:PORT`; a TCP engine
/// is reached with TLS only, with the client's `ca.pem`, `cert.pem` and `key.pem` from
/// `tls_dir` (`--docker-tls-dir`), which must hold all three.
pub fn parse_docker_host(
    text: &str,
    tls_dir: Option<&std::path::Path>,
) -> Result<DockerHostOption, String> {
    use nodus_sandbox::docker::Endpoint;
    let refuse = |why: String| {
        format!(
            "--docker-host {text:?}: {why} (URL[=capacity]: unix:///var/run/docker.sock or tcp://HOST:PORT, capacity a whole number from 1)"
        )
    };
    let (url, capacity) = match text.rsplit_once('=') {
        Some((url, capacity)) => {
            let capacity = capacity
                .parse::<usize>()
                .ok()
                .filter(|n| *n >= 1)
                .ok_or_else(|| {
                    refuse(format!(
                        "the capacity {capacity:?} is not a whole number from 1"
                    ))
                })?;
            (url, Some(capacity))
        }
        None => (text, None),
    };
    let endpoint = if let Some(path) = url.strip_prefix("unix://") {
        if !path.starts_with('/') {
            return Err(refuse(format!("the socket path {path:?} is not absolute")));
        }
        Endpoint::Socket(std::path::PathBuf::from(path))
    } else if let Some(address) = url.strip_prefix("tcp://") {
        let (host, port) = address
            .rsplit_once(':')
            .ok_or_else(|| refuse("a tcp URL needs a port".to_string()))?;
        if host.is_empty() || port.parse::<u16>().map_or(true, |p| p == 0) {
            return Err(refuse(format!("{address:?} is not HOST:PORT")));
        }
        let Some(dir) = tls_dir else {
            return Err(refuse(
                "a TCP engine is reached with TLS only: give --docker-tls-dir DIR holding ca.pem, cert.pem and key.pem"
                    .to_string(),
            ));
        };
        for file in ["ca.pem", "cert.pem", "key.pem"] {
            if !dir.join(file).is_file() {
                return Err(format!(
                    "--docker-tls-dir {}: {file} is missing (it must hold ca.pem, cert.pem and key.pem, as the Docker CLI's)",
                    dir.display()
                ));
            }
        }
        Endpoint::Tcp {
            url: url.to_string(),
            tls_dir: Some(dir.to_path_buf()),
        }
    } else {
        return Err(refuse("the scheme must be unix:// or tcp://".to_string()));
    };
    Ok(DockerHostOption { endpoint, capacity })
}

#[cfg(test)]
mod docker_host_tests {
    use super::*;
    use nodus_sandbox::docker::Endpoint;

    #[test]
    fn a_docker_host_is_a_socket_or_tls_tcp_with_an_optional_capacity() {
        let dir = tempfile::tempdir().expect("dir");
        for file in ["ca.pem", "cert.pem", "key.pem"] {
            std::fs::write(dir.path().join(file), "x").expect("file");
        }
        assert_eq!(
            parse_docker_host("unix:///run/docker.sock=3", None),
            Ok(DockerHostOption {
                endpoint: Endpoint::Socket("/run/docker.sock".into()),
                capacity: Some(3)
            })
        );
        assert_eq!(
            parse_docker_host("tcp://127.0.0.1:2376", Some(dir.path())),
            Ok(DockerHostOption {
                endpoint: Endpoint::Tcp {
                    url: "tcp://127.0.0.1:2376".into(),
                    tls_dir: Some(dir.path().to_path_buf())
                },
                capacity: None
            })
        );
        for (bad, says) in [
            ("tcp://127.0.0.1:2376", "TLS only"),
            ("unix:///run/docker.sock=0", "capacity \"0\""),
            ("unix:///run/docker.sock=many", "capacity \"many\""),
            ("http://127.0.0.1:2376", "scheme"),
            ("tcp://127.0.0.1", "port"),
            ("unix://run/docker.sock", "not absolute"),
        ] {
            let error = parse_docker_host(bad, None).expect_err(bad);
            assert!(
                error.contains(says) && error.contains("--docker-host"),
                "{bad}: {error}"
            );
        }
        std::fs::remove_file(dir.path().join("key.pem")).expect("rm");
        let error =
            parse_docker_host("tcp://127.0.0.1:2376", Some(dir.path())).expect_err("no key");
        assert!(error.contains("key.pem is missing"), "{error}");
    }
}
