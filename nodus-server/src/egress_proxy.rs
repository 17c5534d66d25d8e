//! The egress proxy: the only way out of a sandbox whose run has `spec.network.egress:
//! allowlist`. An HTTP forward proxy (absolute-URI `http://` requests and `CONNECT`
//! tunnels) with one Unix-socket listener per run, so a connection's run is the listener it
//! came in on. It resolves names itself (the operator's `--egress-hosts` lines first), asks
//! [`nodus_core::egress::decide`] about every resolved address, dials only an address that
//! was allowed (the connection is pinned to it), and answers a refusal with a 403 whose body
//! names the rule. Every connection asked for becomes an [`EgressRecord`], handed to the
//! run's egress journal ([`EgressJournal`]) when the connection ends, however it ends; a run's
//! connections at once and bytes in all are bounded ([`ProxyConfig`], the `meter` module). A
//! plain tunnel's bytes are moved by the kernel (`splice(2)`, the `splice` module). A
//! tunnel to a host whose requests get injected headers (`spec.network.inject`) is served by
//! [`crate::egress_tls`], which ends TLS to put them in; a plain `http://` request to such a
//! host is refused, since the credential would cross the network in clear.

mod meter;
mod splice;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nodus_core::egress::{self, Cidr, EgressRecord, InjectedHeader, Verdict};
use nodus_core::egress_log::EgressJournal;
use nodus_core::resource::NetworkSpec;
use nodus_core::sandbox::{EgressGate, Error as SandboxError};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener};

use crate::egress_tls::Tunnelled;

/// The longest request head the proxy reads.
const MAX_HEAD_BYTES: usize = 16 << 10;
/// How long the proxy waits for a request head, and for an onward connection.
const WAIT: Duration = Duration::from_secs(10);
/// Connections one run's sandbox may hold open through the proxy at once unless the operator
/// says otherwise (`--egress-max-connections`); past it the proxy accepts the next only when
/// one ends (each holds two descriptors of the server's).
pub const DEFAULT_MAX_CONNECTIONS: usize = 64;
/// Bytes (both ways together) one run's connections may carry unless the operator says
/// otherwise (`--egress-max-bytes`): 1 GiB.
pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;
/// Connection records a run keeps in memory when the proxy has no journal (unit tests).
const MAX_RECORDS_PER_RUN: usize = 10_000;

/// What the operator gives the proxy: the internal networks it may reach (`--egress-allow`),
/// names it resolves itself (`--egress-hosts`) and the bounds of each run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyConfig {
    /// Internal addresses and networks a run's allowlist may lead to.
    pub allow: Vec<Cidr>,
    /// Names (lower case) and their addresses, read before the system's resolver.
    pub hosts: HashMap<String, Vec<IpAddr>>,
    /// Connections a run's sandbox may hold open at once (`--egress-max-connections`), 1 or
    /// more.
    pub max_connections: usize,
    /// Bytes a run's connections may carry, both ways together (`--egress-max-bytes`): the
    /// connection that passes it is cut off and later ones are refused.
    pub max_bytes: u64,
    /// Trust roots besides the system's for the TLS the proxy speaks onward (`--egress-ca`).
    pub extra_roots: Vec<rustls::pki_types::CertificateDer<'static>>,
}

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            allow: Vec::new(),
            hosts: HashMap::new(),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_bytes: DEFAULT_MAX_BYTES,
            extra_roots: Vec::new(),
        }
    }
}

/// Reads `--egress-ca`'s PEM text: its certificates (at least one).
pub fn parse_extra_roots(
    text: &str,
) -> Result<Vec<rustls::pki_types::CertificateDer<'static>>, String> {
    use rustls::pki_types::pem::PemObject;
    let roots = rustls::pki_types::CertificateDer::pem_slice_iter(text.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("--egress-ca: not PEM certificates: {e}"))?;
    if roots.is_empty() {
        return Err("--egress-ca: the file holds no PEM certificate".to_string());
    }
    Ok(roots)
}

/// Reads hosts-file lines (`ADDRESS NAME...`, `#` comments) into names and addresses.
pub fn parse_hosts(text: &str) -> Result<HashMap<String, Vec<IpAddr>>, String> {
    let mut hosts: HashMap<String, Vec<IpAddr>> = HashMap::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or_default().trim();
        let mut words = line.split_whitespace();
        let Some(address) = words.next() else {
            continue;
        };
        let address: IpAddr = address.parse().map_err(|_| {
            format!(
                "--egress-hosts line {}: {address:?} is not an IP address",
                number + 1
            )
        })?;
        for name in words {
            hosts
                .entry(name.trim_end_matches('.').to_ascii_lowercase())
                .or_default()
                .push(address);
        }
    }
    Ok(hosts)
}

/// The proxy: cheap to clone; [`EgressProxy::listen`] opens a run's listener, and as the
/// sandbox backends' [`EgressGate`] it keeps one per sandbox (by key, the run's uid).
#[derive(Debug, Clone, Default)]
pub struct EgressProxy {
    config: Arc<ProxyConfig>,
    open: Arc<Mutex<HashMap<String, RunProxy>>>,
    journal: Option<EgressJournal>,
    /// What ends TLS for hosts with injected headers; without it such hosts are refused.
    tls: Option<Arc<crate::egress_tls::Interceptor>>,
}

/// A run's listener: it serves until dropped (then its socket file is removed).
#[derive(Debug)]
pub struct RunProxy {
    path: PathBuf,
    records: Arc<Mutex<Vec<EgressRecord>>>,
    budget: Arc<meter::Budget>,
    task: tokio::task::JoinHandle<()>,
}

impl RunProxy {
    /// The listener's socket.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The records of the connections finished so far.
    pub fn records(&self) -> Vec<EgressRecord> {
        self.records
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

impl Drop for RunProxy {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

impl EgressProxy {
    /// A proxy with the operator's `config`.
    pub fn new(config: ProxyConfig) -> Self {
        EgressProxy {
            config: Arc::new(config),
            open: Arc::default(),
            journal: None,
            tls: None,
        }
    }

    /// This proxy, handing every connection's record to `journal` (keyed by the sandbox's key,
    /// the run's uid) instead of keeping it in memory.
    pub fn with_journal(mut self, journal: EgressJournal) -> Self {
        self.journal = Some(journal);
        self
    }

    /// This proxy, ending TLS with `tls` for the hosts whose requests get injected headers.
    pub fn with_tls(mut self, tls: crate::egress_tls::Interceptor) -> Self {
        self.tls = Some(Arc::new(tls));
        self
    }

    fn open_runs(&self) -> std::sync::MutexGuard<'_, HashMap<String, RunProxy>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The records of sandbox `key`'s connections so far (none when it is not open).
    pub fn records_of(&self, key: &str) -> Vec<EgressRecord> {
        self.open_runs()
            .get(key)
            .map(RunProxy::records)
            .unwrap_or_default()
    }

    /// Opens a listener at `path` (a stale socket there is replaced) for a run whose
    /// `spec.network` is `network`.
    pub fn listen(&self, path: &Path, network: NetworkSpec) -> std::io::Result<RunProxy> {
        self.listen_recording(path, network, Vec::new(), "", None)
    }

    /// [`EgressProxy::listen`] for sandbox `key`, going on with `was` (the records and the
    /// byte budget of its listener before, when it is opened again).
    fn listen_recording(
        &self,
        path: &Path,
        network: NetworkSpec,
        headers: Vec<InjectedHeader>,
        key: &str,
        was: Option<RunProxy>,
    ) -> std::io::Result<RunProxy> {
        let (records, budget) = match was {
            Some(was) => (was.records.clone(), was.budget.clone()),
            None => (
                Arc::default(),
                Arc::new(meter::Budget::new(self.config.max_bytes)),
            ),
        };
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        let max_connections = self.config.max_connections.max(1);
        let run = Arc::new(Run {
            config: self.config.clone(),
            network,
            key: key.to_string(),
            journal: self.journal.clone(),
            headers,
            tls: self.tls.clone(),
            records: records.clone(),
            budget: budget.clone(),
        });
        // The connections are tasks of a set the accept loop owns: when the run's listener is
        // dropped (its task aborted), they end with it, tunnels included.
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            loop {
                while connections.try_join_next().is_some() {}
                if connections.len() >= max_connections {
                    connections.join_next().await;
                    continue;
                }
                match listener.accept().await {
                    Ok((channel, _)) => {
                        let run = run.clone();
                        connections.spawn(async move {
                            if let Ok(connection) = handed_over(&channel).await {
                                run.serve(connection).await;
                            }
                        });
                    }
                    // Out of file descriptors, say: wait rather than spin.
                    Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                }
            }
        });
        Ok(RunProxy {
            path: path.to_path_buf(),
            records,
            budget,
            task,
        })
    }
}

impl EgressGate for EgressProxy {
    fn open(
        &self,
        key: &str,
        network: &NetworkSpec,
        headers: &[InjectedHeader],
        socket: &Path,
    ) -> Result<(), SandboxError> {
        let mut open = self.open_runs();
        // A sandbox opened again (started again after a restart, a retried step) keeps the
        // records of its connections so far, and what they used of its byte budget.
        let was = open.remove(key);
        let run = self
            .listen_recording(socket, network.clone(), headers.to_vec(), key, was)
            .map_err(|e| {
                SandboxError::Failed(format!(
                    "the egress proxy cannot listen on {}: {e}",
                    socket.display()
                ))
            })?;
        open.insert(key.to_owned(), run);
        Ok(())
    }

    fn close(&self, key: &str) {
        let closed = self.open_runs().remove(key);
        drop(closed);
    }

    fn ca_certificate(&self) -> Option<String> {
        self.tls.as_ref().map(|tls| tls.ca_certificate().to_owned())
    }
}

/// One run's policy and records.
struct Run {
    config: Arc<ProxyConfig>,
    network: NetworkSpec,
    /// The sandbox's key (the run's uid), as the journal knows it.
    key: String,
    journal: Option<EgressJournal>,
    /// The headers `network.inject` adds, with their values.
    headers: Vec<InjectedHeader>,
    tls: Option<Arc<crate::egress_tls::Interceptor>>,
    records: Arc<Mutex<Vec<EgressRecord>>>,
    budget: Arc<meter::Budget>,
}

/// A connection's record, handed over when the connection ends: when it is dropped, so that
/// a connection cut short (its sandbox deleted, the server stopping) is recorded too, with
/// the bytes it carried.
struct Journaled<'a> {
    run: &'a Run,
    meter: &'a meter::Meter,
    started: Instant,
    record: EgressRecord,
    handed: bool,
}

impl Journaled<'_> {
    fn finish(&mut self) {
        if std::mem::replace(&mut self.handed, true) {
            return;
        }
        let mut record = self.record.clone();
        record.duration_ms = millis(self.started);
        record.bytes_out = record.bytes_out.max(self.meter.bytes_out());
        record.bytes_in = record.bytes_in.max(self.meter.bytes_in());
        if self.meter.was_cut() {
            record.verdict = "refused".into();
            record.rule = format!(
                "cut off: the run's connections passed the {} bytes the server's \
                 --egress-max-bytes allows a run ({} had allowed it)",
                self.run.budget.limit(),
                record.rule
            );
        }
        self.run.push(record);
    }
}

impl Drop for Journaled<'_> {
    fn drop(&mut self) {
        self.finish();
    }
}

/// What a request asked for.
struct Request {
    host: String,
    port: u16,
    /// The head to send onward (`None` for a tunnel), and what came after the head.
    onward: Option<Vec<u8>>,
    rest: Vec<u8>,
}

/// A refusal or failure answered to the sandbox.
struct Answer {
    status: &'static str,
    body: String,
}

impl Run {
    async fn serve<S: AsyncRead + AsyncWrite + Unpin + splice::Socket>(&self, mut client: S) {
        let started = Instant::now();
        let time = jiff::Timestamp::now().to_string();
        let request = match tokio::time::timeout(WAIT, read_request(&mut client)).await {
            Ok(Ok(request)) => request,
            Ok(Err(answer)) => {
                let _ = respond(&mut client, &answer).await;
                return;
            }
            Err(_) => return,
        };
        let meter = meter::Meter::default();
        let mut journaled = Journaled {
            run: self,
            meter: &meter,
            started,
            record: EgressRecord {
                time,
                host: request.host.clone(),
                port: request.port,
                address: None,
                verdict: "refused".into(),
                rule: String::new(),
                bytes_out: 0,
                bytes_in: 0,
                duration_ms: 0,
            },
            handed: false,
        };
        let connected = if self.budget.spent() {
            Err(Answer {
                status: "403 Forbidden",
                body: format!(
                    "the run's connections have used the {} bytes the server's \
                     --egress-max-bytes allows a run",
                    self.budget.limit()
                ),
            })
        } else {
            self.connect(&request, &mut journaled.record).await
        };
        match connected {
            Err(answer) => {
                if journaled.record.rule.is_empty() {
                    journaled.record.rule = answer.body.clone();
                }
                // Recorded before the answer, so that a refusal's record is there once the
                // sandbox has read it.
                journaled.finish();
                let _ = respond(&mut client, &answer).await;
            }
            Ok(upstream)
                if egress::headers_for(&self.headers, &request.host)
                    .next()
                    .is_some() =>
            {
                let injected: Vec<&InjectedHeader> =
                    egress::headers_for(&self.headers, &request.host).collect();
                // The sandbox's side is metered (TLS bytes) against the run's byte budget; the
                // record also gets the plain bytes the interceptor carried.
                let metered = meter::Metered {
                    inner: &mut client,
                    meter: &meter,
                    budget: &self.budget,
                };
                let tunnelled = crate::egress_tls::tunnel(
                    self.tls.as_deref(),
                    metered,
                    request.rest,
                    upstream,
                    &request.host,
                    &injected,
                )
                .await;
                let record = &mut journaled.record;
                match tunnelled {
                    Tunnelled::Carried(out, back) => {
                        (record.bytes_out, record.bytes_in) = (out, back)
                    }
                    Tunnelled::Refused(rule) => {
                        record.verdict = "refused".into();
                        record.rule = rule;
                    }
                }
                journaled.finish();
            }
            Ok(mut upstream) => {
                let ready = match &request.onward {
                    None => client
                        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                        .await
                        .is_ok(),
                    Some(head) => upstream.write_all(head).await.is_ok(),
                };
                if ready && upstream.write_all(&request.rest).await.is_ok() {
                    meter.add_out(
                        (request.onward.as_ref().map_or(0, Vec::len) + request.rest.len()) as u64,
                    );
                    let _ = splice::carry(&client, &upstream, &meter, &self.budget).await;
                }
                journaled.finish();
            }
        }
    }

    fn push(&self, record: EgressRecord) {
        tracing::debug!(host = %record.host, port = record.port, verdict = %record.verdict,
            rule = %record.rule, "egress");
        if let Some(journal) = &self.journal {
            journal.record(&self.key, record);
            return;
        }
        let mut records = self.records.lock().unwrap_or_else(|e| e.into_inner());
        if records.len() < MAX_RECORDS_PER_RUN {
            records.push(record);
        }
    }

    /// Resolves, decides and dials: the onward connection, pinned to an allowed address.
    async fn connect(
        &self,
        request: &Request,
        record: &mut EgressRecord,
    ) -> Result<TcpStream, Answer> {
        let refused = |rule: String| Answer {
            status: "403 Forbidden",
            body: rule,
        };
        if let Some(verdict) = egress::precheck(&self.network, &request.host, request.port) {
            return Err(refused(verdict.rule().to_string()));
        }
        if request.onward.is_some()
            && egress::headers_for(&self.headers, &request.host)
                .next()
                .is_some()
        {
            return Err(refused(format!(
                "http:// to {} is refused: spec.network.inject adds a credential to its \
                 requests, which the egress proxy sends only over TLS (use https://)",
                request.host
            )));
        }
        let addresses = self
            .resolve(&request.host, request.port)
            .await
            .map_err(|e| {
                let rule = format!("{} does not resolve: {e}", request.host);
                record.rule = rule.clone();
                Answer {
                    status: "502 Bad Gateway",
                    body: rule,
                }
            })?;
        let mut first_refusal = None;
        for address in addresses {
            let verdict = egress::decide(
                &self.network,
                &self.config.allow,
                &request.host,
                request.port,
                address,
            );
            match verdict {
                Verdict::Allowed(rule) => {
                    record.address = Some(address.to_string());
                    record.verdict = "allowed".into();
                    record.rule = rule;
                    let dial = TcpStream::connect(SocketAddr::new(address, request.port));
                    return match tokio::time::timeout(WAIT, dial).await {
                        Ok(Ok(stream)) => Ok(stream),
                        Ok(Err(e)) => Err(Answer {
                            status: "502 Bad Gateway",
                            body: format!("cannot connect to {address}: {e}"),
                        }),
                        Err(_) => Err(Answer {
                            status: "504 Gateway Timeout",
                            body: format!("no answer from {address}"),
                        }),
                    };
                }
                Verdict::Refused(rule) => {
                    first_refusal.get_or_insert((address, rule));
                }
            }
        }
        let (address, rule) =
            first_refusal.unwrap_or_else(|| (IpAddr::from([0, 0, 0, 0]), "no address".into()));
        record.address = Some(address.to_string());
        record.rule = rule.clone();
        Err(refused(rule))
    }

    /// The addresses of `host`: itself when it is one, else the operator's hosts lines, else
    /// the system's resolver.
    async fn resolve(&self, host: &str, port: u16) -> std::io::Result<Vec<IpAddr>> {
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(address) = bare.parse::<IpAddr>() {
            return Ok(vec![address]);
        }
        let name = host.trim_end_matches('.').to_ascii_lowercase();
        if let Some(addresses) = self.config.hosts.get(&name) {
            return Ok(addresses.clone());
        }
        let found: Vec<IpAddr> = tokio::net::lookup_host((name.as_str(), port))
            .await?
            .map(|a| a.ip())
            .collect();
        Ok(found)
    }
}

/// The sandbox's TCP connection handed over `channel` ([`nodus_launch::handoff`]), within
/// [`WAIT`].
async fn handed_over(channel: &tokio::net::UnixStream) -> std::io::Result<TcpStream> {
    let received = async {
        loop {
            channel.readable().await?;
            match channel.try_io(tokio::io::Interest::READABLE, || {
                nodus_launch::handoff::receive(channel)
            }) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                received => return received,
            }
        }
    };
    let connection = tokio::time::timeout(WAIT, received)
        .await
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
    let connection = std::net::TcpStream::from(connection);
    connection.set_nonblocking(true)?;
    TcpStream::from_std(connection)
}

fn millis(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

async fn respond<S: AsyncWrite + Unpin>(client: &mut S, answer: &Answer) -> std::io::Result<()> {
    let body = format!("{}\n", answer.body);
    let head = format!(
        "HTTP/1.1 {}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        answer.status,
        body.len()
    );
    client.write_all(head.as_bytes()).await?;
    client.write_all(body.as_bytes()).await?;
    client.shutdown().await
}

/// Reads a request head: `CONNECT host:port` or `METHOD http://host[:port]/path`.
async fn read_request<S: AsyncRead + Unpin>(client: &mut S) -> Result<Request, Answer> {
    let bad = |why: &str| Answer {
        status: "400 Bad Request",
        body: why.to_string(),
    };
    let mut buf = Vec::new();
    let end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        if buf.len() > MAX_HEAD_BYTES {
            return Err(bad("the request head is too long"));
        }
        let mut chunk = [0u8; 4096];
        let n = client
            .read(&mut chunk)
            .await
            .map_err(|_| bad("the request head could not be read"))?;
        if n == 0 {
            return Err(bad("the connection closed before a request head"));
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let rest = buf.split_off(end);
    let head = String::from_utf8(buf).map_err(|_| bad("the request head is not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let first = lines.next().unwrap_or_default();
    let mut words = first.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return Err(bad("the request line must be METHOD TARGET VERSION"));
    };
    if method.eq_ignore_ascii_case("CONNECT") {
        let (host, port) =
            split_authority(target, None).ok_or_else(|| bad("CONNECT takes host:port"))?;
        return Ok(Request {
            host,
            port,
            onward: None,
            rest,
        });
    }
    let Some(after) = target.strip_prefix("http://") else {
        return Err(bad(
            "the proxy takes absolute http:// requests and CONNECT tunnels (for https)",
        ));
    };
    let (authority, path) = match after.find('/') {
        Some(at) => (&after[..at], &after[at..]),
        None => (after, "/"),
    };
    let (host, port) =
        split_authority(authority, Some(80)).ok_or_else(|| bad("the URL's host is not valid"))?;
    let mut onward = format!("{method} {path} {version}\r\n");
    for line in lines.filter(|l| !l.is_empty()) {
        let name = line.split(':').next().unwrap_or_default().trim();
        let dropped = [
            "proxy-connection",
            "proxy-authorization",
            "connection",
            "keep-alive",
        ]
        .iter()
        .any(|d| name.eq_ignore_ascii_case(d));
        if !dropped {
            onward.push_str(line);
            onward.push_str("\r\n");
        }
    }
    onward.push_str("Connection: close\r\n\r\n");
    Ok(Request {
        host,
        port,
        onward: Some(onward.into_bytes()),
        rest,
    })
}

/// `host:port`, `[v6]:port`, or a host alone when `default` gives its port.
/// The longest host name the proxy takes (DNS's limit).
const MAX_HOST_BYTES: usize = 253;

fn split_authority(authority: &str, default: Option<u16>) -> Option<(String, u16)> {
    let authority = authority.rsplit('@').next()?;
    let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
        let (host, after) = v6.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(port) => port.parse().ok()?,
            None if after.is_empty() => default?,
            None => return None,
        };
        (host.to_string(), port)
    } else {
        match authority.rsplit_once(':') {
            Some((host, port)) => (host.to_string(), port.parse().ok()?),
            None => (authority.to_string(), default?),
        }
    };
    // A name is at most 253 bytes (DNS); longer ones would only swell the run's records.
    let valid = !host.is_empty()
        && host.len() <= MAX_HOST_BYTES
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b':' | b'_'));
    (valid && port != 0).then_some((host, port))
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodus_core::resource::{AllowEntry, EgressMode};
    use tokio::net::TcpListener;

    /// An HTTP server on 127.0.0.1 answering every connection with `hello`; its port.
    async fn origin() -> u16 {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bound");
        let port = listener.local_addr().expect("address").port();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let mut got = Vec::new();
                    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                        let Ok(n) = stream.read(&mut buf).await else {
                            return;
                        };
                        if n == 0 {
                            return;
                        }
                        got.extend_from_slice(&buf[..n]);
                    }
                    let _ = stream
                        .write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
                        )
                        .await;
                });
            }
        });
        port
    }

    fn allowlist(hosts: &[&str], port: u16) -> NetworkSpec {
        NetworkSpec {
            egress: EgressMode::Allowlist,
            allow: hosts
                .iter()
                .map(|host| AllowEntry {
                    host: Some(host.to_string()),
                    cidr: None,
                    ports: Some(vec![port]),
                })
                .collect(),
            inject: Vec::new(),
        }
    }

    fn config(allow: &str) -> ProxyConfig {
        ProxyConfig {
            allow: egress::parse_operator_allow(allow).expect("allow"),
            hosts: parse_hosts("# test names\n127.0.0.1 files.test FILES2.test\n::1 six.test\n")
                .expect("hosts"),
            ..ProxyConfig::default()
        }
    }

    /// The run's records once there are `count` (a record is written when its connection
    /// ends, which for a tunnel is after the client hangs up).
    async fn settled(run: &RunProxy, count: usize) -> Vec<EgressRecord> {
        for _ in 0..500 {
            let records = run.records();
            if records.len() >= count {
                return records;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{count} records expected: {:?}", run.records());
    }

    /// A TCP connection handed to the run listening on `path`, as a sandbox's bridge hands
    /// it: the client's end.
    async fn connect(path: &Path) -> TcpStream {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
        let address = listener.local_addr().expect("address");
        let (near, far) = tokio::join!(TcpStream::connect(address), listener.accept());
        let far = far.expect("accept").0.into_std().expect("std");
        let channel = std::os::unix::net::UnixStream::connect(path).expect("connected");
        nodus_launch::handoff::send(&channel, &far).expect("handed over");
        near.expect("connect")
    }

    async fn ask(path: &Path, request: &str) -> String {
        let mut stream = connect(path).await;
        stream.write_all(request.as_bytes()).await.expect("sent");
        // A tunnel the proxy opened by mistake stays open: a bounded wait fails the test.
        let mut answer = Vec::new();
        let read = stream.read_to_end(&mut answer);
        let _ = tokio::time::timeout(Duration::from_secs(2), read).await;
        String::from_utf8_lossy(&answer).into_owned()
    }

    #[tokio::test]
    async fn the_proxy_allows_the_list_and_refuses_the_rest_recording_each() {
        let port = origin().await;
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("run.sock");
        let proxy = EgressProxy::new(config("127.0.0.1"));
        let run = proxy
            .listen(&path, allowlist(&["files.test", "six.test"], port))
            .expect("listening");

        let get = ask(
            &path,
            &format!(
                "GET http://files.test:{port}/x HTTP/1.1\r\nHost: files.test:{port}\r\n\
                 Proxy-Authorization: Basic c2VjcmV0\r\n\r\n"
            ),
        )
        .await;
        assert!(
            get.starts_with("HTTP/1.1 200") && get.ends_with("hello"),
            "{get}"
        );

        let mut tunnel = connect(&path).await;
        tunnel
            .write_all(format!("CONNECT files.test:{port} HTTP/1.1\r\n\r\n").as_bytes())
            .await
            .expect("sent");
        let mut established = [0u8; 39];
        tunnel.read_exact(&mut established).await.expect("read");
        assert!(established.starts_with(b"HTTP/1.1 200"));
        tunnel
            .write_all(b"GET / HTTP/1.1\r\nHost: files.test\r\n\r\n")
            .await
            .expect("sent");
        let mut answer = String::new();
        tunnel.read_to_string(&mut answer).await.expect("read");
        assert!(answer.ends_with("hello"), "{answer}");
        drop(tunnel);
        settled(&run, 2).await;

        // Not on the list; on the list but another port; an address written directly.
        for (request, rule) in [
            (
                format!("GET http://other.test:{port}/ HTTP/1.1\r\n\r\n"),
                "other.test is not in",
            ),
            (
                "CONNECT files.test:22 HTTP/1.1\r\n\r\n".to_string(),
                "port 22",
            ),
            (
                format!("CONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n"),
                "127.0.0.1 is not in",
            ),
            // ::1 is loopback, and --egress-allow lists only 127.0.0.1.
            (
                format!("CONNECT six.test:{port} HTTP/1.1\r\n\r\n"),
                "internal address (loopback)",
            ),
        ] {
            let answer = ask(&path, &request).await;
            assert!(
                answer.starts_with("HTTP/1.1 403") && answer.contains(rule),
                "{request}: {answer}"
            );
        }
        let records = settled(&run, 6).await;
        let seen: Vec<(&str, &str, Option<&str>)> = records
            .iter()
            .map(|r| (r.host.as_str(), r.verdict.as_str(), r.address.as_deref()))
            .collect();
        assert_eq!(
            seen,
            [
                ("files.test", "allowed", Some("127.0.0.1")),
                ("files.test", "allowed", Some("127.0.0.1")),
                ("other.test", "refused", None),
                ("files.test", "refused", None),
                ("127.0.0.1", "refused", None),
                ("six.test", "refused", Some("::1")),
            ]
        );
        assert!(records[0].bytes_in > 5 && records[0].bytes_out > 0);
        assert!(!records[0].rule.is_empty() && records[0].rule.contains("allow[0]"));
        // The proxy's own header never goes onward, nor into a record.
        let journal = serde_json::to_string(&records).expect("json");
        assert!(!journal.contains("c2VjcmV0"));
    }

    #[tokio::test]
    async fn an_allowed_name_at_an_internal_address_needs_the_operator() {
        let port = origin().await;
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("run.sock");
        let proxy = EgressProxy::new(config(""));
        let run = proxy
            .listen(&path, allowlist(&["files.test"], port))
            .expect("listening");
        let answer = ask(
            &path,
            &format!("CONNECT files.test:{port} HTTP/1.1\r\n\r\n"),
        )
        .await;
        assert!(
            answer.starts_with("HTTP/1.1 403") && answer.contains("loopback"),
            "{answer}"
        );
        let records = settled(&run, 1).await;
        assert_eq!(records.len(), 1);
        assert_eq!(records[0].address.as_deref(), Some("127.0.0.1"));
        assert_eq!(records[0].verdict, "refused");
    }

    #[tokio::test]
    async fn a_runs_tunnels_end_with_its_listener() {
        let port = origin().await;
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("run.sock");
        let run = EgressProxy::new(config("127.0.0.1"))
            .listen(&path, allowlist(&["files.test"], port))
            .expect("listening");
        let mut tunnel = connect(&path).await;
        tunnel
            .write_all(format!("CONNECT files.test:{port} HTTP/1.1\r\n\r\n").as_bytes())
            .await
            .expect("sent");
        let mut established = [0u8; 39];
        tunnel.read_exact(&mut established).await.expect("read");
        drop(run);
        assert!(!path.exists(), "the socket is removed");
        let mut rest = Vec::new();
        let ended = tokio::time::timeout(Duration::from_secs(2), tunnel.read_to_end(&mut rest));
        assert!(
            ended.await.is_ok(),
            "the tunnel outlived its run's listener"
        );
    }

    #[test]
    fn hosts_lines_and_authorities_parse() {
        let hosts = parse_hosts("127.0.0.1 a.test b.test # x\n\n::1 a.test\n").expect("hosts");
        assert_eq!(hosts["a.test"].len(), 2);
        assert!(parse_hosts("nope a.test").is_err());
        assert_eq!(
            split_authority("a.test:8080", None),
            Some(("a.test".into(), 8080))
        );
        assert_eq!(
            split_authority("[::1]:443", None),
            Some(("::1".into(), 443))
        );
        assert_eq!(
            split_authority("a.test", Some(80)),
            Some(("a.test".into(), 80))
        );
        assert_eq!(split_authority("a.test", None), None);
        let longest = format!("{}.test", "a".repeat(MAX_HOST_BYTES - 5));
        assert_eq!(
            split_authority(&format!("{longest}:443"), None),
            Some((longest, 443))
        );
        let too_long = format!("{}.test:443", "a".repeat(MAX_HOST_BYTES - 4));
        assert_eq!(split_authority(&too_long, None), None);
        assert_eq!(split_authority("a test:80", None), None);
    }
}
