//! Building the server from its options: backends, engine, state, first-start bootstrap, and
//! serving until shutdown.

use std::sync::Arc;

use nodus_core::clock::SystemClock;
use nodus_core::engine::{Config, Deps, Engine};
use nodus_core::ledger::StoreLedger;
use nodus_core::model::ModelClient;
use nodus_core::resource::{Agent, AgentSpec};
use nodus_core::router::Router;
use nodus_core::runner::{Runner, RunnerConfig};
use nodus_core::sandbox::Sandbox;
use nodus_core::store::Store;
use nodus_core::{Clock, Usd};

use crate::auth::{ADMIN_TOKEN_FILE, Auth, DEFAULT_PROJECT, TEMPLATE_PROJECT};
use crate::metrics::Metrics;
use crate::options::{Options, Role, SQLITE_FILE, SandboxKind, StoreUrl};
use crate::secrets::{Cipher, StoreSecrets};
use crate::start_error::StartError;
use crate::state::AppState;

/// Credits the `default` project gets on first start, so that the quickstart runs at once.
pub const WELCOME_CREDITS: Usd = Usd::from_cents(500);

/// A server ready to serve.
pub struct Server {
    state: Arc<AppState>,
    /// This replica's name (kept in the data directory).
    replica: String,
    options: Options,
    _lock: crate::lock::DataDirLock,
    /// The span exporter's task, flushed at a graceful stop (`--otlp-endpoint` only).
    spans: Option<crate::telemetry::Flush>,
    /// Lines for the operator: the store, sandbox and model in use, and where the token is.
    pub announcements: Vec<String>,
}

impl Server {
    /// Build the backends and the engine, and bootstrap a first start.
    pub async fn build(options: Options) -> Result<Server, StartError> {
        // Everything that can be refused is checked before anything is written.
        if let Some(token) = &options.bootstrap_token {
            check_bootstrap_token(token)?;
        }
        prepare_data_dir(&options.data_dir)?;
        let cipher = match options.store {
            Some(StoreUrl::Memory) => Cipher::ephemeral()?,
            _ => Cipher::in_dir(&options.data_dir)?,
        };
        // One process per data directory, whatever the store: held until the server drops.
        let lock = crate::lock::lock(&options.data_dir)?;
        let mut announcements = Vec::new();
        if let Some(reserve) = reserve_path(&options) {
            match crate::reserve::keep(&reserve) {
                Ok(crate::reserve::Kept::Released(path)) => announcements.push(format!(
                    "the disk is nearly full: released the store's reserve ({}) so that the \
                     store can open and write; free space on it",
                    path.display()
                )),
                Ok(_) => {}
                Err(error) => tracing::warn!(error = %error, "cannot keep the store's reserve"),
            }
        }
        let replica = replica_name(&options.data_dir)?;
        let store = open_store(&options, &mut announcements).await?;
        // The egress proxy: the only way out of the sandboxes of runs with an allowlist.
        // Its journal keeps every connection's record with the run; its authority (made in
        // the data directory at first start) ends TLS for the hosts whose requests get
        // injected headers.
        let egress_journal = nodus_core::egress_log::EgressJournal::new(store.clone());
        let tls =
            crate::egress_tls::Interceptor::open(&options.data_dir, &options.egress.extra_roots)
                .map_err(|e| StartError::Backend(format!("egress proxy: {e}")))?;
        let egress = crate::egress_proxy::EgressProxy::new(options.egress.clone())
            .with_journal(egress_journal.clone())
            .with_tls(tls);
        let sandbox = open_sandbox(&options, &store, &egress, &mut announcements).await?;
        let catalog =
            nodus_llm::default_catalog().map_err(|e| StartError::Backend(e.to_string()))?;
        let (model, router, catalog) =
            open_model(options.anthropic.clone(), catalog, &mut announcements)?;
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let ledger = StoreLedger::new(store.clone());
        let metrics = Metrics {
            egress: Some(egress_journal.clone()),
            ..Metrics::default()
        };
        let mut flush = None;
        let spans: Arc<dyn nodus_core::telemetry::SpanSink> = match &options.otlp {
            Some(otlp) => {
                let (sink, flushing) = crate::telemetry::start(otlp, metrics.spans.clone())
                    .map_err(|e| StartError::Backend(e.to_string()))?;
                announcements.push(format!(
                    "traces: OTLP/HTTP to {} (message content {})",
                    crate::telemetry::shown_url(&otlp.traces_url()),
                    match otlp.content {
                        nodus_core::telemetry::Content::On => "included",
                        nodus_core::telemetry::Content::Off => "left out",
                    }
                ));
                flush = Some(flushing);
                sink
            }
            None => Arc::new(nodus_core::telemetry::NoSpans),
        };
        let mut config = Config::default();
        config.default_image = options.default_image.clone();
        config.replica = Some(replica.clone());
        config.actions =
            crate::actions::registry(options.webhook_allow.clone()).merged(&options.actions);
        config.egress_allow = options.egress.allow.clone();
        config.egress_journal = Some(egress_journal);
        config.snapshots = options.snapshots;
        // BYOK calls go to the Anthropic client: users keep their key under its name.
        config.byok_secret_key = nodus_llm::anthropic::BYOK_SECRET_KEY.to_string();
        let engine = Engine::new(
            Deps {
                store: store.clone(),
                sandbox,
                model,
                router,
                clock: clock.clone(),
                catalog,
                secrets: Arc::new(StoreSecrets::new(store.clone(), cipher.clone())),
                ledger: Arc::new(ledger.clone()),
                spans,
            },
            config,
        );
        let state = Arc::new(AppState {
            engine: engine.clone(),
            store: store.clone(),
            auth: Auth::new(store.clone(), cipher.token_key(), clock.clone()),
            cipher,
            ledger,
            metrics,
            watches: crate::watch::Watches::new(options.watch_bookmark_interval),
            admission: Arc::new(crate::admission::Admission::new(admission_limits(&options))),
        });
        bootstrap(&state, &options, &mut announcements).await?;
        Ok(Server {
            state,
            replica,
            options,
            _lock: lock,
            spans: flush,
            announcements,
        })
    }

    /// The shared state (for tests that call the router without a socket).
    pub fn state(&self) -> Arc<AppState> {
        self.state.clone()
    }

    /// Serve the API and run the engine's runner until `shutdown` resolves.
    pub async fn serve(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), StartError> {
        self.bind().await?.serve(shutdown).await
    }

    /// Bind the listen address (port 0 picks a free port; [`Bound::local_addr`] tells it).
    pub async fn bind(self) -> Result<Bound, StartError> {
        let listener = tokio::net::TcpListener::bind(self.options.listen)
            .await
            .map_err(|e| StartError::Listen {
                address: self.options.listen.to_string(),
                reason: e.to_string(),
            })?;
        Ok(Bound {
            server: self,
            listener,
        })
    }
}

/// A server bound to its address, not serving yet.
pub struct Bound {
    server: Server,
    listener: tokio::net::TcpListener,
}

impl Bound {
    /// The address the API listens on.
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.listener
            .local_addr()
            .unwrap_or(self.server.options.listen)
    }

    /// Serve the API and run the engine's [`Runner`] until `shutdown` resolves.
    pub async fn serve(
        self,
        shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> Result<(), StartError> {
        let address = self.local_addr();
        let Bound { server, listener } = self;
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        // The runner drives every run and reconciles every group; the API only records. An
        // API replica starts none: the worker replicas drive its runs.
        let runner = server.options.role.drives().then(|| {
            let mut config = RunnerConfig::default();
            config.max_concurrent = server.options.capacity;
            config.retention = Some(PAYLOAD_RETENTION);
            Runner::start(server.state.engine.clone(), config)
        });
        let _ = server
            .state
            .metrics
            .replica
            .set(crate::metrics::ReplicaGauges {
                name: server.replica.clone(),
                role: server.options.role.as_str(),
                capacity: if server.options.role.drives() {
                    server.options.capacity
                } else {
                    0
                },
                in_use: runner
                    .as_ref()
                    .map(nodus_core::runner::RunnerHandle::driving),
            });
        let info = crate::replicas::ReplicaInfo {
            name: server.replica.clone(),
            role: server.options.role.as_str(),
            capacity: if server.options.role.drives() {
                server.options.capacity
            } else {
                0
            },
        };
        let in_use = runner
            .as_ref()
            .map(nodus_core::runner::RunnerHandle::driving);
        let heartbeat = {
            let (store, engine, info) = (
                server.state.store.clone(),
                server.state.engine.clone(),
                info.clone(),
            );
            tokio::spawn(async move {
                let mut beat = crate::replicas::Beat::First;
                loop {
                    let used = in_use.as_ref().map_or(0, |in_use| *in_use.borrow());
                    let now = engine.clock().now();
                    let draining = engine.draining();
                    if let Err(error) =
                        crate::replicas::beat(store.as_ref(), &info, used, draining, now, beat)
                            .await
                    {
                        tracing::warn!(error = %error, "cannot write the replica's heartbeat");
                    }
                    beat = crate::replicas::Beat::Again;
                    tokio::time::sleep(crate::replicas::HEARTBEAT).await;
                }
            })
        };
        let runner = Arc::new(tokio::sync::Mutex::new(runner));
        let reserve = reserve_path(&server.options).map(|dir| tokio::spawn(keep_reserve(dir)));
        // Streams of a token end when it is deleted (on any replica) or expires.
        let tokens = tokio::spawn(
            server
                .state
                .admission
                .clone()
                .watch_tokens(server.state.auth.clone(), server.state.store.subscribe()),
        );
        let app = match server.options.role {
            Role::Worker => crate::api::worker_router(server.state.clone()),
            Role::All | Role::Api => crate::console::router(server.state.clone())
                .merge(crate::api::router(server.state.clone())),
        };
        let mut stop = stop_rx;
        let files = crate::listen::raise_descriptor_limit();
        let limits = crate::listen::ConnectionLimits {
            header_timeout: server.options.header_timeout,
            // Half the descriptors at most: the store, sandboxes and commands need the rest.
            max_connections: files
                .and_then(|files| usize::try_from(files / 2).ok())
                .map_or(server.options.max_connections, |half| {
                    server.options.max_connections.min(half)
                }),
        };
        tracing::info!(
            %address,
            max_connections = limits.max_connections,
            open_files = files,
            "serving"
        );
        let served = crate::listen::serve(listener, app, limits, async move {
            let _ = stop.wait_for(|stopped| *stopped).await;
        });
        let state = server.state.clone();
        let draining = runner.clone();
        let drain_timeout = server.options.drain_timeout;
        let drain_info = info.clone();
        // An operator's `nodus server drain NAME` (heard through the store) stops this
        // replica as SIGTERM does.
        let asked = crate::replicas::drain_requested(state.store.clone(), info.name.clone());
        let signal = tokio::spawn(async move {
            tokio::select! {
                () = shutdown => {}
                () = asked => tracing::info!("an operator asked this replica to drain"),
            }
            // Drain first, still serving: take on no more runs, let running commands finish
            // (up to the drain timeout), and hand every run over to the other replicas.
            if let Some(runner) = draining.lock().await.take() {
                tracing::info!(timeout = ?drain_timeout, "draining");
                runner.engine().start_draining();
                let used = *runner.driving().borrow();
                let now = state.engine.clock().now();
                if let Err(error) = crate::replicas::beat(
                    state.store.as_ref(),
                    &drain_info,
                    used,
                    true,
                    now,
                    crate::replicas::Beat::Again,
                )
                .await
                {
                    tracing::warn!(error = %error, "cannot mark the replica draining");
                }
                let cut = runner.drain(drain_timeout).await;
                tracing::info!(cut, "drained: every run handed over");
            }
            // Long polls answer now: serving stops once every request is answered.
            state.watches.stop();
            let _ = stop_tx.send(true);
        });
        served.await;
        signal.abort();
        tokens.abort();
        if let Some(reserve) = reserve {
            reserve.abort();
        }
        if let Some(runner) = runner.lock().await.take() {
            runner.shutdown().await;
        }
        // Every step journaled so far has its span queued: export them before exiting.
        if let Some(spans) = server.spans {
            spans.finish(crate::telemetry::FLUSH_BOUND).await;
        }
        heartbeat.abort();
        crate::replicas::remove(server.state.store.as_ref(), &info.name).await;
        Ok(())
    }
}

/// The admission limits of `options`, with room kept: streams take at most half the
/// connections, so that `/healthz` and ordinary requests always get in.
fn admission_limits(options: &Options) -> crate::admission::AdmissionLimits {
    let mut limits = options.admission;
    limits.body_timeout = options.header_timeout;
    limits.max_streams = limits.max_streams.min(options.max_connections / 2).max(1);
    limits
}

/// Make the data directory owner-only (0700) when it is missing; refuse one that other users
/// can read or write: it holds every prompt, output and token hash, and the server key.
fn prepare_data_dir(dir: &std::path::Path) -> Result<(), StartError> {
    use std::os::unix::fs::{DirBuilderExt as _, PermissionsExt as _};
    let refuse = |reason: String| StartError::DataDir {
        path: dir.display().to_string(),
        reason,
    };
    match std::fs::metadata(dir) {
        Ok(meta) if !meta.is_dir() => Err(refuse("it is not a directory".to_string())),
        Ok(meta) => {
            let mode = meta.permissions().mode() & 0o7777;
            if mode & 0o066 != 0 {
                return Err(refuse(format!(
                    "its mode is {mode:04o}: other users can read or write it, and it holds \
                     every prompt, output and token hash and the server key; make it \
                     owner-only with `chmod 700 {}`",
                    dir.display()
                )));
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent).map_err(|e| refuse(e.to_string()))?;
            }
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(dir)
                .or_else(|e| match e.kind() {
                    // Made by someone else meanwhile: check it as an existing one.
                    std::io::ErrorKind::AlreadyExists => Ok(()),
                    _ => Err(refuse(e.to_string())),
                })?;
            // The mode given to `mkdir` passes through the umask; this one does not.
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| refuse(e.to_string()))?;
            prepare_data_dir(dir)
        }
        Err(e) => Err(refuse(e.to_string())),
    }
}

/// Create a missing SQLite file owner-only (0600); SQLite gives its `-wal` and `-shm` files
/// the database's mode.
fn create_private_db(path: &std::path::Path) -> Result<(), StartError> {
    use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
    let failed =
        |e: std::io::Error| StartError::Backend(format!("SQLite store {}: {e}", path.display()));
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(file) => file
            .set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(failed),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(failed(e)),
    }
}

/// The reserve of the server's store: beside a SQLite file, on its file system (which the
/// working directories in the data directory may fill); none for other stores.
fn reserve_path(options: &Options) -> Option<std::path::PathBuf> {
    match &options.store {
        None => Some(crate::reserve::reserve_of(
            &options.data_dir.join(SQLITE_FILE),
        )),
        Some(StoreUrl::Sqlite(path)) => Some(crate::reserve::reserve_of(path)),
        Some(StoreUrl::Memory | StoreUrl::Postgres(_)) => None,
    }
}

/// Every few seconds: give the store's reserve back when the disk is nearly full, and make it
/// again when there is room.
async fn keep_reserve(reserve: std::path::PathBuf) {
    let mut every = tokio::time::interval(std::time::Duration::from_secs(10));
    loop {
        every.tick().await;
        let reserve = reserve.clone();
        let _ = tokio::task::spawn_blocking(move || crate::reserve::keep_logged(&reserve)).await;
    }
}

/// Recorded payloads are kept this long after their run ended (the runner's retention sweep
/// removes them after that, once an hour).
pub const PAYLOAD_RETENTION: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);

async fn open_store(
    options: &Options,
    announcements: &mut Vec<String>,
) -> Result<Arc<dyn Store>, StartError> {
    let url = options
        .store
        .clone()
        .unwrap_or_else(|| StoreUrl::Sqlite(options.data_dir.join(SQLITE_FILE)));
    match url {
        StoreUrl::Memory => {
            announcements.push("store: in memory (nothing survives a restart)".to_string());
            Ok(Arc::new(nodus_store::MemoryStore::new()))
        }
        StoreUrl::Sqlite(path) => {
            create_private_db(&path)?;
            let store = nodus_store::SqliteStore::open(&path).await.map_err(|e| {
                StartError::Backend(format!("SQLite store {}: {e}", path.display()))
            })?;
            announcements.push(format!("store: SQLite at {} (one process)", path.display()));
            Ok(Arc::new(store))
        }
        StoreUrl::Postgres(url) => {
            let store = nodus_store::PostgresStore::connect(nodus_store::PostgresOptions::new(url))
                .await
                .map_err(|e| StartError::Backend(format!("Postgres store: {e}")))?;
            announcements
                .push("store: Postgres (replicas share the work through leases)".to_string());
            Ok(Arc::new(store))
        }
    }
}

async fn open_sandbox(
    options: &Options,
    store: &Arc<dyn Store>,
    egress: &crate::egress_proxy::EgressProxy,
    announcements: &mut Vec<String>,
) -> Result<Arc<dyn Sandbox>, StartError> {
    match options.sandbox {
        SandboxKind::Unisolated => {
            let root = options.data_dir.join("sandboxes");
            announcements.push(format!(
                "sandbox: UNISOLATED local processes in {} (chosen by name; runs record it)",
                root.display()
            ));
            Ok(Arc::new(nodus_sandbox::UnisolatedSandbox::new(root)))
        }
        SandboxKind::Process => {
            let root = options.sandbox_dir();
            announcements.push(format!(
                "sandbox: isolated processes, working directories in {}",
                root.display()
            ));
            let mut config = nodus_sandbox::BwrapConfig::new(root);
            config.launcher = options.sandbox_launcher.clone();
            config.egress = Some(Arc::new(egress.clone()));
            let sandbox = nodus_sandbox::BwrapSandbox::new(config);
            if let Some(launcher) = &options.sandbox_launcher {
                // Decided now (a self-check), so that the operator reads which at start.
                announcements.push(match sandbox.uses_launcher().await {
                    Ok(true) => format!(
                        "sandbox: started by the nodus launcher ({})",
                        launcher.display()
                    ),
                    Ok(false) => "sandbox: started by bubblewrap (the nodus launcher failed \
                                  its self-check on this host; the log says why)"
                        .to_string(),
                    Err(e) => format!(
                        "sandbox: neither the nodus launcher nor bubblewrap works here yet: {e}"
                    ),
                });
            } else {
                announcements.push("sandbox: started by bubblewrap".to_string());
            }
            announcements.push(sandbox.limits());
            Ok(Arc::new(sandbox))
        }
        SandboxKind::Docker => {
            let Some(image) = options.default_image.clone() else {
                return Err(StartError::Backend(
                    "--sandbox docker needs --default-image IMAGE: the image of runs that name none"
                        .to_string(),
                ));
            };
            announcements.push(format!(
                "sandbox: Docker containers (default image {image})"
            ));
            let live = live_run_uids(store.as_ref()).await?;
            // Sandboxes with an allowlist join the engine's internal egress network and reach
            // the proxy through the server's listener on its gateway (local engines only).
            let docker_egress = nodus_sandbox::DockerEgress::new(
                Arc::new(egress.clone()),
                options.sandbox_dir().join("docker-egress"),
            );
            let owner = options.sandbox_owner();
            if options.docker_hosts.is_empty() {
                let mut config = nodus_sandbox::DockerConfig::new(image);
                config.egress = Some(docker_egress);
                config.owner = Some(owner);
                let docker = connect_docker(config).await?;
                remove_orphans(&docker, &live, announcements).await;
                return Ok(Arc::new(docker));
            }
            let mut hosts = Vec::new();
            for host in &options.docker_hosts {
                let mut config = nodus_sandbox::DockerConfig::new(image.clone());
                config.endpoint = host.endpoint.clone();
                config.egress = Some(docker_egress.clone());
                config.owner = Some(owner.clone());
                let docker = connect_docker(config).await?;
                remove_orphans(&docker, &live, announcements).await;
                let capacity = host.capacity.unwrap_or(options.capacity);
                announcements.push(format!(
                    "sandbox: Docker host {} (capacity {capacity})",
                    host.endpoint
                ));
                hosts.push(nodus_sandbox::DockerHost {
                    sandbox: docker,
                    capacity,
                });
            }
            let hosts = nodus_sandbox::DockerHosts::new(hosts)
                .map_err(|e| StartError::Backend(format!("Docker sandbox: {e}")))?;
            Ok(Arc::new(hosts))
        }
    }
}

/// The Docker engine of `config`, which must answer now.
async fn connect_docker(
    config: nodus_sandbox::DockerConfig,
) -> Result<nodus_sandbox::DockerSandbox, StartError> {
    let endpoint = config.endpoint.clone();
    nodus_sandbox::DockerSandbox::connect(config)
        .await
        .map_err(|e| StartError::Backend(format!("Docker sandbox at {endpoint}: {e}")))
}

/// Containers of runs that finished or were deleted while no server ran go now; live runs'
/// containers stay, and their runs re-attach to them.
async fn remove_orphans(
    docker: &nodus_sandbox::DockerSandbox,
    live: &std::collections::BTreeSet<String>,
    announcements: &mut Vec<String>,
) {
    match docker.remove_orphans(live).await {
        Ok(removed) if !removed.is_empty() => announcements.push(format!(
            "sandbox: removed {} orphaned container(s) at {}",
            removed.len(),
            docker.endpoint()
        )),
        Ok(_) => {}
        Err(error) => tracing::warn!(error = %error, "cannot remove orphaned containers"),
    }
}

/// The uids of every unfinished run of every project.
async fn live_run_uids(
    store: &dyn Store,
) -> Result<std::collections::BTreeSet<String>, StartError> {
    let selector = nodus_core::store::Selector::default();
    let projects = store
        .list(
            nodus_core::ledger::SYSTEM_PROJECT,
            nodus_core::resource::Kind::Account,
            &selector,
        )
        .await?;
    let mut live = std::collections::BTreeSet::new();
    for project in projects {
        let runs = store
            .list(
                &project.key.name,
                nodus_core::resource::Kind::AgentRun,
                &selector,
            )
            .await?;
        for run in runs {
            let finished = run.document["status"]["phase"]
                .as_str()
                .is_some_and(nodus_core::lifecycle::RunPhase::names_finished);
            if let (false, Some(uid)) = (finished, run.document["metadata"]["uid"].as_str()) {
                live.insert(uid.to_string());
            }
        }
    }
    Ok(live)
}

/// The model client, the router and the catalog of the server.
type ModelAndRouter = (
    Arc<dyn ModelClient>,
    Arc<dyn Router>,
    Arc<nodus_core::catalog::Catalog>,
);

/// The model of `Options::anthropic`: Anthropic with the platform key; without one, the
/// offline model (at $0) for platform runs, while BYOK runs still reach the Anthropic API at
/// the configured base URL with their own key.
fn open_model(
    config: nodus_llm::AnthropicConfig,
    catalog: nodus_core::catalog::Catalog,
    announcements: &mut Vec<String>,
) -> Result<ModelAndRouter, StartError> {
    let chosen = nodus_llm::from_env::model_from_config(config, catalog)
        .map_err(|e| StartError::Backend(format!("Anthropic client: {e}")))?;
    announcements.push(format!("{}; routed per prompt by jev", chosen.line));
    Ok((
        chosen.model,
        Arc::new(nodus_llm::Jev::new()),
        chosen.catalog,
    ))
}

/// This replica's stable name, kept in the data directory: a restarted server takes the
/// runs it was working on back at once instead of waiting for its old leases to expire.
fn replica_name(data_dir: &std::path::Path) -> Result<String, StartError> {
    let path = data_dir.join("replica-name");
    if let Ok(name) = std::fs::read_to_string(&path) {
        let name = name.trim().to_string();
        if !name.is_empty() {
            return Ok(name);
        }
    }
    let suffix = crate::auth::new_token()
        .map_err(|e| StartError::Backend(format!("no randomness for a replica name: {e}")))?;
    let name = format!("replica-{}", &suffix[6..22]);
    crate::auth::write_private_file(&path, &format!("{name}\n")).map_err(|e| {
        StartError::DataDir {
            path: path.display().to_string(),
            reason: e.to_string(),
        }
    })?;
    Ok(name)
}

/// A `--bootstrap-token` long enough that it cannot be guessed (the token itself is never
/// shown).
fn check_bootstrap_token(token: &str) -> Result<String, StartError> {
    let token = token.trim();
    let chars = token.chars().count();
    if chars < crate::auth::MIN_BOOTSTRAP_TOKEN_CHARS {
        return Err(StartError::Backend(format!(
            "--bootstrap-token must have at least {} characters, not {chars}: a short token \
             can be guessed; use a random one (such as `openssl rand -hex 24`), or leave the \
             flag out and the server makes one",
            crate::auth::MIN_BOOTSTRAP_TOKEN_CHARS
        )));
    }
    Ok(token.to_string())
}

/// First start: the projects `default` and `nodus`, the `claude-assistant` template, the
/// default project's welcome credits, and the admin token (written once to a file only its
/// owner can read, or the one given by `--bootstrap-token`).
async fn bootstrap(
    state: &AppState,
    options: &Options,
    announcements: &mut Vec<String>,
) -> Result<(), StartError> {
    state.ledger.open(DEFAULT_PROJECT, WELCOME_CREDITS).await?;
    state.ledger.open(TEMPLATE_PROJECT, Usd::ZERO).await?;
    let template = Agent::new("claude-assistant", {
        let mut spec = AgentSpec::new(
            "You are Claude, a careful assistant working in a sandbox. Run shell commands to \
             check your work before you answer, and answer concisely.",
        );
        spec.per_run_max_cost_usd = Usd::from_cents(100);
        spec
    });
    state
        .engine
        .apply_agent(TEMPLATE_PROJECT, template)
        .await
        .map_err(|e| {
            StartError::Backend(format!("cannot install the claude-assistant template: {e}"))
        })?;
    state
        .engine
        .install_builtin_environments()
        .await
        .map_err(|e| {
            StartError::Backend(format!("cannot install the built-in Environments: {e}"))
        })?;

    let token_file = options.data_dir.join(ADMIN_TOKEN_FILE);
    let token = match &options.bootstrap_token {
        Some(token) => check_bootstrap_token(token)?,
        None => match std::fs::read_to_string(&token_file) {
            Ok(token) => token.trim().to_string(),
            Err(_) => {
                let token = crate::auth::new_token()
                    .map_err(|e| StartError::Backend(format!("no randomness for a token: {e}")))?;
                crate::auth::write_private_file(&token_file, &format!("{token}\n")).map_err(
                    |e| StartError::DataDir {
                        path: token_file.display().to_string(),
                        reason: e.to_string(),
                    },
                )?;
                token
            }
        },
    };
    if token.is_empty() {
        return Err(StartError::Backend(
            "the bootstrap token is empty".to_string(),
        ));
    }
    state.auth.register_operator(&token).await?;
    if options.bootstrap_token.is_some() {
        announcements.push("admin token: the one given by --bootstrap-token".to_string());
    } else {
        announcements.push(format!(
            "admin token: in {} (owner-only)",
            token_file.display()
        ));
    }
    Ok(())
}
