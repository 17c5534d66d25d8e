//! Egress for Docker sandboxes: a container whose spec carries an allowlist
//! ([`SandboxSpec::egress`]) joins one internal Docker network of the engine (`internal: true`:
//! no route out of it; inter-container traffic off, so sandboxes cannot reach each other),
//! whose only address outside the containers is its gateway, the bridge's address on this
//! host. The server listens there (one port per server) and hands each connection to the
//! egress proxy over the proxy's socket of the sandbox that made it ([`nodus_launch::handoff`])
//! — the same [`EgressGate`] path as the process sandbox's. The sandbox is told by the engine: the container holding the
//! connection's source address on the network now (no address is trusted from memory, so a
//! container that took over a stopped one's address is never taken for it), which must be a
//! sandbox this process opened the gate for; any other connection is closed at once.
//!
//! Only an engine on this host (a Unix socket) can do this: a remote engine's networks are
//! on another host, where the server does not listen ([`DockerEgress::reaches`]).

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use bollard::Docker;
use bollard::models::{Mount, MountType, NetworkCreateRequest, NetworkInspect};
use nodus_core::resource::NetworkSpec;
use nodus_core::sandbox::{EgressGate, Error, SandboxSpec};
use tokio::net::{TcpListener, TcpStream, UnixStream};
use tokio::sync::{OnceCell, Semaphore};
use tracing::{debug, info, warn};

use super::{Endpoint, api_error, status};

/// The network every allowlisted sandbox of this engine joins, unless configured otherwise.
pub const DEFAULT_NETWORK: &str = "nodus-egress";

/// The label that marks the network as Nodus's.
const NETWORK_LABEL: &str = "nodus.egress";

/// The connections the listener identifies at once, of every sandbox (each holds a
/// descriptor, a task and a call to the engine until it is handed to its proxy or closed):
/// past it, the listener waits for one to be done before it accepts another. The proxy then
/// bounds each run's own (`--egress-max-connections`).
const MAX_IDENTIFIED: usize = 1024;

/// How Docker sandboxes reach the egress proxy: the proxy, the network, and a directory of
/// the server's own for the proxy's sockets and the trust bundle.
#[derive(Debug, Clone)]
pub struct DockerEgress {
    /// The egress proxy.
    pub gate: Arc<dyn EgressGate>,
    /// The internal network's name (made when missing).
    pub network: String,
    /// Where the proxy's sockets (`<key>.sock`) and the trust bundle (`trust/`) go.
    pub dir: PathBuf,
}

impl DockerEgress {
    /// The proxy `gate`, network [`DEFAULT_NETWORK`], files in `dir`.
    pub fn new(gate: Arc<dyn EgressGate>, dir: PathBuf) -> Self {
        DockerEgress {
            gate,
            network: DEFAULT_NETWORK.to_owned(),
            dir,
        }
    }

    /// Why a sandbox on the engine at `endpoint` cannot reach the proxy, or `None` when it can
    /// (an engine on this host).
    pub fn reaches(endpoint: &Endpoint) -> Option<String> {
        match endpoint {
            Endpoint::Socket(_) => None,
            Endpoint::Tcp { url, .. } => Some(format!(
                "the Docker engine at {url} is remote: its containers' networks are on another \
                 host, where this server's egress proxy does not listen"
            )),
        }
    }
}

/// The network's gateway and the server's listener on it, made at the first allowlisted
/// sandbox.
#[derive(Debug)]
struct Bridge {
    /// Where sandboxes find the proxy: the gateway's address and the listener's port.
    proxy: SocketAddr,
    /// The task that accepts connections; ended when the backend is dropped.
    accepting: tokio::task::JoinHandle<()>,
}

impl Drop for Bridge {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

/// A Docker backend's egress: its configuration, the bridge once made, and the sandboxes
/// this process opened the gate for.
#[derive(Debug)]
pub(super) struct Egress {
    config: DockerEgress,
    bridge: OnceCell<Bridge>,
    open: Arc<Mutex<HashSet<String>>>,
}

/// What a container with an allowlist is made with.
#[derive(Debug, Clone)]
pub(super) struct Wiring {
    /// The network it joins.
    pub network: String,
    /// Its proxy (and trust) variables.
    pub env: Vec<String>,
    /// The trust bundle's directory, bound read-only, when the proxy ends TLS.
    pub mount: Option<Mount>,
}

impl Egress {
    pub(super) fn new(config: DockerEgress) -> Self {
        Egress {
            config,
            bridge: OnceCell::new(),
            open: Arc::default(),
        }
    }

    /// Opens the gate for the sandbox of `spec` (whose allowlist is `network`) on `docker`,
    /// making the network and the listener first if this is the first: what its container is
    /// made with.
    pub(super) async fn open(
        &self,
        docker: &Docker,
        name_prefix: &str,
        spec: &SandboxSpec,
        network: &NetworkSpec,
    ) -> Result<Wiring, Error> {
        if spec.network {
            return Err(Error::Refused(
                "this sandbox's only way out would be the egress proxy, but it asks for the \
                 host's network too"
                    .into(),
            ));
        }
        let bridge = self
            .bridge
            .get_or_try_init(|| self.bridge(docker, name_prefix))
            .await?;
        let dir = self.config.dir.clone();
        let socket = dir.join(format!("{}.sock", spec.key));
        // sockaddr_un holds 108 bytes with the terminating NUL.
        if socket.as_os_str().len() > 107 {
            return Err(Error::Refused(format!(
                "the egress proxy's socket {} would be longer than a Unix socket's 107 bytes: \
                 give the server a shorter data directory",
                socket.display()
            )));
        }
        private_dir(&dir).await?;
        self.config
            .gate
            .open(&spec.key, network, &spec.egress_headers, &socket)?;
        let owned = socket.clone();
        tokio::task::spawn_blocking(move || {
            std::fs::set_permissions(&owned, std::fs::Permissions::from_mode(0o600))
        })
        .await
        .map_err(|e| Error::Failed(e.to_string()))?
        .map_err(|e| Error::Failed(format!("making the egress socket private: {e}")))?;
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(spec.key.clone());
        let mut env: Vec<String> = proxy_env(bridge.proxy)
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let mount = match self.config.gate.ca_certificate() {
            Some(ca) => {
                let trust = dir.join("trust");
                let made = trust.clone();
                tokio::task::spawn_blocking(move || crate::trust::write_bundle(&made, &ca))
                    .await
                    .map_err(|e| Error::Failed(e.to_string()))?
                    .map_err(|e| {
                        Error::Failed(format!(
                            "writing the egress trust bundle in {}: {e}",
                            trust.display()
                        ))
                    })?;
                env.extend(
                    crate::trust::trust_env(&crate::trust::inside_bundle())
                        .into_iter()
                        .map(|(k, v)| format!("{k}={v}")),
                );
                Some(Mount {
                    target: Some(crate::trust::INSIDE_DIR.to_owned()),
                    source: Some(trust.display().to_string()),
                    typ: Some(MountType::BIND),
                    read_only: Some(true),
                    ..Default::default()
                })
            }
            None => None,
        };
        Ok(Wiring {
            network: self.config.network.clone(),
            env,
            mount,
        })
    }

    /// Stops serving sandbox `key`.
    pub(super) fn close(&self, key: &str) {
        let was_open = self
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(key);
        if was_open {
            self.config.gate.close(key);
        }
    }

    /// Makes (or finds) the network and listens on its gateway.
    async fn bridge(&self, docker: &Docker, name_prefix: &str) -> Result<Bridge, Error> {
        let name = &self.config.network;
        let found = match docker.inspect_network(name, None).await {
            Ok(found) => found,
            Err(e) if status(&e) == Some(404) => {
                let request = NetworkCreateRequest {
                    name: name.clone(),
                    driver: Some("bridge".to_owned()),
                    internal: Some(true),
                    labels: Some(HashMap::from([(NETWORK_LABEL.to_owned(), "1".to_owned())])),
                    options: Some(HashMap::from([(
                        "com.docker.network.bridge.enable_icc".to_owned(),
                        "false".to_owned(),
                    )])),
                    ..Default::default()
                };
                match docker.create_network(request).await {
                    Ok(_) => info!(network = %name, "made the Docker network of egress"),
                    // Made by another server at the same moment.
                    Err(e) if status(&e) == Some(409) => {}
                    Err(e) => return Err(api_error("making the egress network", e)),
                }
                docker
                    .inspect_network(name, None)
                    .await
                    .map_err(|e| api_error("reading the egress network", e))?
            }
            Err(e) => return Err(api_error("reading the egress network", e)),
        };
        let gateway = check_network(name, &found).map_err(Error::Refused)?;
        let listener = TcpListener::bind((gateway, 0)).await.map_err(|e| {
            Error::Failed(format!(
                "listening on the egress network's gateway {gateway}: {e} (the server must run \
                 on the Docker engine's host, in its network namespace)"
            ))
        })?;
        let proxy = listener
            .local_addr()
            .map_err(|e| Error::Failed(format!("the egress listener's address: {e}")))?;
        info!(network = %name, %proxy, "Docker sandboxes with an allowlist reach the egress proxy here");
        let serving = Serving {
            docker: docker.clone(),
            network: name.clone(),
            name_prefix: name_prefix.to_owned(),
            dir: self.config.dir.clone(),
            open: self.open.clone(),
        };
        let accepting = tokio::spawn(serving.accept(listener));
        Ok(Bridge { proxy, accepting })
    }
}

/// What the listener needs to serve a connection.
struct Serving {
    docker: Docker,
    network: String,
    name_prefix: String,
    dir: PathBuf,
    open: Arc<Mutex<HashSet<String>>>,
}

impl Serving {
    async fn accept(self, listener: TcpListener) {
        let serving = Arc::new(self);
        let identifying = Arc::new(Semaphore::new(MAX_IDENTIFIED));
        loop {
            let Ok(permit) = identifying.clone().acquire_owned().await else {
                return;
            };
            match listener.accept().await {
                Ok((stream, peer)) => {
                    let serving = serving.clone();
                    tokio::spawn(async move {
                        serving.hand_over(stream, peer.ip()).await;
                        drop(permit);
                    });
                }
                Err(e) => {
                    // Out of descriptors, for a moment: try again shortly.
                    warn!(error = %e, "the egress listener cannot accept");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// Hands one connection from `peer` to its sandbox's proxy, or closes it.
    async fn hand_over(&self, stream: TcpStream, peer: IpAddr) {
        let found = match self.docker.inspect_network(&self.network, None).await {
            Ok(found) => found,
            Err(e) => {
                warn!(error = %e, "cannot read the egress network: a connection is closed");
                return;
            }
        };
        let open = self
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let Some(key) = sandbox_at(&found, peer, &self.name_prefix, &open) else {
            debug!(%peer, "a connection from no open sandbox of this server is closed");
            return;
        };
        let socket = self.dir.join(format!("{key}.sock"));
        let handed = async {
            let channel = UnixStream::connect(&socket).await?;
            loop {
                channel.writable().await?;
                match channel.try_io(tokio::io::Interest::WRITABLE, || {
                    nodus_launch::handoff::send(&channel, &stream)
                }) {
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    handed => return handed,
                }
            }
        };
        if let Err(e) = handed.await {
            debug!(%key, error = %e, "the egress proxy's socket is closed");
        }
    }
}

/// The gateway (this host's address) of the egress network `found`, or why it cannot serve:
/// it must be an internal bridge network with an IPv4 gateway.
fn check_network(name: &str, found: &NetworkInspect) -> Result<Ipv4Addr, String> {
    if found.internal != Some(true) {
        return Err(format!(
            "the Docker network {name} exists and is not internal (`internal: true`): its \
             containers could go out around the egress proxy; remove it, or name another"
        ));
    }
    if found.driver.as_deref() != Some("bridge") {
        return Err(format!(
            "the Docker network {name} has the driver {:?}, not bridge",
            found.driver.as_deref().unwrap_or_default()
        ));
    }
    found
        .ipam
        .as_ref()
        .and_then(|ipam| ipam.config.as_ref())
        .into_iter()
        .flatten()
        .find_map(|config| config.gateway.as_deref()?.parse::<Ipv4Addr>().ok())
        .ok_or_else(|| format!("the Docker network {name} has no IPv4 gateway"))
}

/// The key of the sandbox whose container holds `peer` on the network `found` now, when it
/// is one of `open`.
fn sandbox_at(
    found: &NetworkInspect,
    peer: IpAddr,
    name_prefix: &str,
    open: &HashSet<String>,
) -> Option<String> {
    let container = found.containers.as_ref()?.values().find(|endpoint| {
        endpoint
            .ipv4_address
            .as_deref()
            .and_then(|address| address.split('/').next())
            .and_then(|address| address.parse::<IpAddr>().ok())
            == Some(peer)
    })?;
    let key = container
        .name
        .as_deref()?
        .trim_start_matches('/')
        .strip_prefix(name_prefix)?;
    open.contains(key).then(|| key.to_owned())
}

/// The variables that send a container's HTTP clients to the proxy at `proxy` (both
/// spellings, as in the process sandbox), and its own addresses past it.
fn proxy_env(proxy: SocketAddr) -> Vec<(&'static str, String)> {
    let proxy = format!("http://{proxy}");
    let local = "localhost,127.0.0.1,::1".to_owned();
    vec![
        ("HTTP_PROXY", proxy.clone()),
        ("HTTPS_PROXY", proxy.clone()),
        ("http_proxy", proxy.clone()),
        ("https_proxy", proxy),
        ("NO_PROXY", local.clone()),
        ("no_proxy", local),
    ]
}

/// Whether a container's variables `env` send it to `wiring`'s proxy: one made by another
/// server (or this one before a restart, listening elsewhere) must be made again.
pub(super) fn wired_to(env: &[String], wiring: &Wiring) -> bool {
    wiring.env.iter().all(|wanted| env.contains(wanted))
}

/// Makes `dir` (0700, the server's only).
async fn private_dir(dir: &Path) -> Result<(), Error> {
    let made = dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&made)?;
        std::fs::set_permissions(&made, std::fs::Permissions::from_mode(0o700))
    })
    .await
    .map_err(|e| Error::Failed(e.to_string()))?
    .map_err(|e| {
        Error::Failed(format!(
            "making {} for the egress proxy: {e}",
            dir.display()
        ))
    })
}

impl super::DockerSandbox {
    /// What the container of `spec` is made with to reach the egress proxy, when its spec
    /// carries an allowlist; refused where this backend has no way to the proxy.
    pub(super) async fn wire(&self, spec: &SandboxSpec) -> Result<Option<Wiring>, Error> {
        let Some(network) = &spec.egress else {
            return Ok(None);
        };
        let refused = |why: String| {
            Error::Refused(format!(
                "this sandbox's only way out would be the egress proxy, but {why}"
            ))
        };
        let Some(egress) = &self.egress else {
            return Err(refused("this backend was given none".into()));
        };
        if let Some(why) = DockerEgress::reaches(&self.config.endpoint) {
            return Err(refused(why));
        }
        egress
            .open(&self.docker, &self.config.name_prefix, spec, network)
            .await
            .map(Some)
    }

    /// Removes the container `name` of `spec` (keeping its volume: the working directory)
    /// when it is this sandbox's and is not wired to `wiring`'s proxy (made by another
    /// server, or by this one before a restart). Answers whether it did.
    pub(super) async fn rewire(
        &self,
        spec: &SandboxSpec,
        name: &str,
        wiring: Option<&Wiring>,
    ) -> Result<bool, Error> {
        let Some(wiring) = wiring else {
            return Ok(false);
        };
        let found = match self.docker.inspect_container(name, None).await {
            Ok(found) => found,
            Err(e) if status(&e) == Some(404) => return Ok(true),
            Err(e) => return Err(api_error("inspecting the container", e)),
        };
        let config = found.config.unwrap_or_default();
        let ours = config
            .labels
            .as_ref()
            .and_then(|labels| labels.get(super::KEY_LABEL))
            == Some(&spec.key);
        if !ours || wired_to(&config.env.unwrap_or_default(), wiring) {
            return Ok(false);
        }
        info!(container = %name, "making a sandbox's container again for this server's egress proxy");
        let options = bollard::query_parameters::RemoveContainerOptionsBuilder::new()
            .force(true)
            .v(false)
            .build();
        match self.docker.remove_container(name, Some(options)).await {
            Ok(()) => {}
            Err(e) if status(&e) == Some(404) => {}
            Err(e) => return Err(api_error("removing the container", e)),
        }
        self.slots
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bollard::models::{EndpointResource, Ipam, IpamConfig};

    fn network(internal: bool, driver: &str, gateway: Option<&str>) -> NetworkInspect {
        NetworkInspect {
            internal: Some(internal),
            driver: Some(driver.to_owned()),
            ipam: Some(Ipam {
                config: Some(vec![IpamConfig {
                    gateway: gateway.map(str::to_owned),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn only_an_internal_bridge_network_with_a_gateway_serves() {
        let cases = [
            (
                network(true, "bridge", Some("172.18.0.1")),
                Ok("172.18.0.1"),
            ),
            (
                network(false, "bridge", Some("172.18.0.1")),
                Err("is not internal"),
            ),
            (
                network(true, "overlay", Some("10.0.0.1")),
                Err("not bridge"),
            ),
            (network(true, "bridge", None), Err("no IPv4 gateway")),
            (
                network(true, "bridge", Some("fd00::1")),
                Err("no IPv4 gateway"),
            ),
        ];
        for (found, expected) in cases {
            match (check_network("n", &found), expected) {
                (Ok(gateway), Ok(wanted)) => assert_eq!(gateway.to_string(), wanted),
                (Err(why), Err(wanted)) => assert!(why.contains(wanted), "{why}"),
                (got, wanted) => panic!("{got:?} for {wanted:?}"),
            }
        }
    }

    #[test]
    fn a_connection_belongs_to_the_open_sandbox_holding_its_address_now() {
        let endpoint = |name: &str, address: &str| EndpointResource {
            name: Some(name.to_owned()),
            ipv4_address: Some(address.to_owned()),
            ..Default::default()
        };
        let found = NetworkInspect {
            containers: Some(HashMap::from([
                ("a".to_owned(), endpoint("nodus-run-a", "172.18.0.2/16")),
                ("b".to_owned(), endpoint("nodus-run-b", "172.18.0.3/16")),
                ("c".to_owned(), endpoint("someone-else", "172.18.0.4/16")),
            ])),
            ..Default::default()
        };
        let open = HashSet::from(["run-a".to_owned()]);
        let at = |peer: &str| sandbox_at(&found, peer.parse().expect("ip"), "nodus-", &open);
        assert_eq!(at("172.18.0.2").as_deref(), Some("run-a"));
        // A sandbox of another server (or one closed) and a container not ours: none.
        assert_eq!(at("172.18.0.3"), None);
        assert_eq!(at("172.18.0.4"), None);
        // An address no container holds now.
        assert_eq!(at("172.18.0.9"), None);
    }

    #[test]
    fn only_an_engine_of_this_host_reaches_the_proxy() {
        assert_eq!(
            DockerEgress::reaches(&Endpoint::Socket("/var/run/docker.sock".into())),
            None
        );
        let remote = Endpoint::Tcp {
            url: "tcp://10.1.2.3:2376".into(),
            tls_dir: None,
        };
        let why = DockerEgress::reaches(&remote).expect("refused");
        assert!(
            why.contains("tcp://10.1.2.3:2376") && why.contains("remote"),
            "{why}"
        );
    }

    #[test]
    fn a_container_is_wired_to_one_proxy() {
        let wiring = |port| Wiring {
            network: DEFAULT_NETWORK.to_owned(),
            env: proxy_env(SocketAddr::from(([172, 18, 0, 1], port)))
                .into_iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect(),
            mount: None,
        };
        let mut env = wiring(4000).env;
        env.push("HOME=/work".to_owned());
        assert!(wired_to(&env, &wiring(4000)));
        assert!(!wired_to(&env, &wiring(4001)));
        assert!(env.contains(&"HTTP_PROXY=http://172.18.0.1:4000".to_owned()));
        assert!(env.contains(&"NO_PROXY=localhost,127.0.0.1,::1".to_owned()));
    }
}
