//! TLS ended at the egress proxy, for the hosts whose requests get the headers a run's
//! `spec.network.inject` adds. The proxy answers such a `CONNECT` as itself: it shows the
//! sandbox a certificate for the host signed by the server's own authority (made at first
//! start in the data directory, its key `0600`; the sandboxes trust it), reads each HTTP/1.1
//! request, puts the headers in (replacing any the sandbox sent under the same names), and
//! sends it on over TLS to the host, whose real certificate it verifies against the system's
//! roots and the operator's `--egress-ca`. The headers' values never go back to the sandbox,
//! into a record or a log.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nodus_core::egress::InjectedHeader;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// The authority's key and certificate in the data directory.
pub const CA_KEY_FILE: &str = "egress-ca.key";
/// The authority's certificate (PEM), what a sandbox or an image trusts.
pub const CA_CERT_FILE: &str = "egress-ca.pem";
/// The longest request head the proxy reads inside a terminated connection.
const MAX_HEAD_BYTES: u64 = 64 << 10;
/// How long a handshake may take, on either side.
const HANDSHAKE: Duration = Duration::from_secs(10);
/// How long a host's certificate is used before a new one is made (each is valid for
/// [`LEAF_DAYS`] from the day before it was made).
const LEAF_REUSE: Duration = Duration::from_secs(7 * 24 * 3600);
const LEAF_DAYS: i64 = 30;
/// Hosts' certificates kept at most (a `*.domain` entry lets a sandbox name many hosts): past
/// it, the cache starts afresh.
const MAX_LEAVES: usize = 1024;

/// Why TLS could not be ended or begun: said to the operator or in the sandbox's answer,
/// never holding a header's value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TlsError(String);

/// The proxy's authority and the TLS it speaks on both sides; cheap to share.
pub struct Interceptor {
    ca_pem: String,
    ca_der: CertificateDer<'static>,
    issuer: Issuer<'static, KeyPair>,
    /// One key for every host's certificate, made at start and kept in memory only.
    leaf_key: KeyPair,
    leaves: Mutex<HashMap<String, (Instant, Arc<rustls::ServerConfig>)>>,
    onward: tokio_rustls::TlsConnector,
}

impl std::fmt::Debug for Interceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interceptor").finish_non_exhaustive()
    }
}

/// The authority's name and uses: the same every time, so that a key read back signs
/// certificates its stored certificate verifies.
fn ca_params() -> CertificateParams {
    let mut params = CertificateParams::default();
    params
        .distinguished_name
        .push(DnType::CommonName, "Nodus egress proxy authority");
    params
        .distinguished_name
        .push(DnType::OrganizationName, "Nodus");
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    params
}

/// The day `days` from today (UTC): year, month, day, as rcgen takes them.
fn day(days: i64) -> (i32, u8, u8) {
    let date = jiff::tz::Offset::UTC
        .to_datetime(jiff::Timestamp::now())
        .date()
        .checked_add(jiff::Span::new().days(days))
        .unwrap_or(jiff::civil::date(2100, 1, 1));
    (
        i32::from(date.year()),
        u8::try_from(date.month()).unwrap_or(1),
        u8::try_from(date.day()).unwrap_or(1),
    )
}

fn failed(what: &str) -> impl Fn(rcgen::Error) -> TlsError + '_ {
    move |e| TlsError(format!("{what}: {e}"))
}

/// Reads the authority from `dir`, or makes it there (the key `0600`, the certificate
/// `0644`): its key and certificate.
fn load_or_make_ca(dir: &Path) -> Result<(KeyPair, String), TlsError> {
    let key_path = dir.join(CA_KEY_FILE);
    let cert_path = dir.join(CA_CERT_FILE);
    let io = |path: &PathBuf| {
        let shown = path.display().to_string();
        move |e: std::io::Error| TlsError(format!("the egress proxy's authority {shown}: {e}"))
    };
    if key_path.exists() {
        let key_pem = std::fs::read_to_string(&key_path).map_err(io(&key_path))?;
        let key = KeyPair::from_pem(&key_pem).map_err(failed("reading egress-ca.key"))?;
        let cert_pem = match std::fs::read_to_string(&cert_path) {
            Ok(pem) => pem,
            // The certificate alone is made again from the key.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let pem = self_signed(&key)?;
                write_file(&cert_path, &pem, 0o600).map_err(io(&cert_path))?;
                pem
            }
            Err(e) => return Err(io(&cert_path)(e)),
        };
        return Ok((key, cert_pem));
    }
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(failed("making the egress proxy's authority"))?;
    let cert_pem = self_signed(&key)?;
    // The certificate first: a key without one is completed at the next start.
    write_file(&cert_path, &cert_pem, 0o600).map_err(io(&cert_path))?;
    write_file(&key_path, &key.serialize_pem(), 0o600).map_err(io(&key_path))?;
    Ok((key, cert_pem))
}

fn self_signed(key: &KeyPair) -> Result<String, TlsError> {
    let mut params = ca_params();
    let (y, m, d) = day(-1);
    params.not_before = rcgen::date_time_ymd(y, m, d);
    let (y, m, d) = day(3650);
    params.not_after = rcgen::date_time_ymd(y, m, d);
    Ok(params
        .self_signed(key)
        .map_err(failed("signing the egress proxy's authority"))?
        .pem())
}

/// Writes `text` to `path` with `mode`, through a new file renamed into place.
fn write_file(path: &Path, text: &str, mode: u32) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let staged = path.with_extension("new");
    let _ = std::fs::remove_file(&staged);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&staged)?;
    file.write_all(text.as_bytes())?;
    file.set_permissions(std::fs::Permissions::from_mode(mode))?;
    file.sync_all()?;
    std::fs::rename(&staged, path)
}

impl Interceptor {
    /// The authority kept in `data_dir` (made there at first start), and onward TLS that
    /// trusts the system's roots and `extra_roots` (`--egress-ca`).
    pub fn open(
        data_dir: &Path,
        extra_roots: &[CertificateDer<'static>],
    ) -> Result<Interceptor, TlsError> {
        let (ca_key, ca_pem) = load_or_make_ca(data_dir)?;
        let ca_der = rustls::pki_types::pem::PemObject::from_pem_slice(ca_pem.as_bytes())
            .map_err(|e| TlsError(format!("reading {CA_CERT_FILE}: {e}")))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls_platform_verifier::Verifier::new_with_extra_roots(
            extra_roots.iter().cloned(),
            provider.clone(),
        )
        .map_err(|e| TlsError(format!("the egress proxy's certificate verifier: {e}")))?;
        let mut onward = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError(format!("TLS versions: {e}")))?
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(verifier))
            .with_no_client_auth();
        onward.alpn_protocols = vec![b"http/1.1".to_vec()];
        let leaf_key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
            .map_err(failed("making the key of the hosts' certificates"))?;
        Ok(Interceptor {
            ca_pem,
            ca_der,
            issuer: Issuer::new(ca_params(), ca_key),
            leaf_key,
            leaves: Mutex::default(),
            onward: tokio_rustls::TlsConnector::from(Arc::new(onward)),
        })
    }

    /// The authority's certificate (PEM).
    pub fn ca_certificate(&self) -> &str {
        &self.ca_pem
    }

    /// What the proxy shows the sandbox for `host`: a certificate for it signed by the
    /// authority, made once a week at most.
    fn shown_for(&self, host: &str) -> Result<Arc<rustls::ServerConfig>, TlsError> {
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((made, config)) = leaves.get(host)
            && made.elapsed() < LEAF_REUSE
        {
            return Ok(config.clone());
        }
        let mut params = CertificateParams::new(vec![host.to_owned()])
            .map_err(failed("the certificate's host name"))?;
        params.distinguished_name.push(DnType::CommonName, host);
        let (y, m, d) = day(-1);
        params.not_before = rcgen::date_time_ymd(y, m, d);
        let (y, m, d) = day(LEAF_DAYS);
        params.not_after = rcgen::date_time_ymd(y, m, d);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.use_authority_key_identifier_extension = true;
        let leaf = params
            .signed_by(&self.leaf_key, &self.issuer)
            .map_err(failed("signing a host's certificate"))?;
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.leaf_key.serialize_der()));
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError(format!("TLS versions: {e}")))?
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone(), self.ca_der.clone()], key)
        .map_err(|e| TlsError(format!("a host's certificate: {e}")))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        if leaves.len() >= MAX_LEAVES {
            leaves.clear();
        }
        leaves.insert(host.to_owned(), (Instant::now(), config.clone()));
        Ok(config)
    }

    /// Serves a tunnel to `host` whose requests get `headers`: TLS with the sandbox (`client`,
    /// past the proxy's `200`), TLS onward on `upstream`, and each request in between with
    /// the headers put in. The bytes (sandbox to host, host to sandbox) of the requests and
    /// answers; or which side failed, and why (the sandbox is told when it was the host's).
    pub async fn serve<S>(
        &self,
        client: S,
        upstream: TcpStream,
        host: &str,
        headers: &[&InjectedHeader],
    ) -> Result<(u64, u64), Unserved>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        let shown = self.shown_for(host).map_err(Unserved::Proxy)?;
        let accept = tokio_rustls::TlsAcceptor::from(shown).accept(client);
        let mut sandbox = match tokio::time::timeout(HANDSHAKE, accept).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => {
                return Err(Unserved::Sandbox(TlsError(format!(
                    "the sandbox's TLS handshake for {host} failed: {e}"
                ))));
            }
            Err(_) => {
                return Err(Unserved::Sandbox(TlsError(format!(
                    "the sandbox's TLS handshake for {host} took too long"
                ))));
            }
        };
        let name = ServerName::try_from(host.to_owned()).map_err(|e| {
            Unserved::Host(TlsError(format!("{host} is not a TLS server name: {e}")))
        })?;
        let connect = self.onward.connect(name, upstream);
        let onward = match tokio::time::timeout(HANDSHAKE, connect).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => {
                let why = TlsError(onward_failure(host, &e));
                let body = format!("{why}\n");
                let answer = format!(
                    "HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/plain; charset=utf-8\r\n\
                     Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = sandbox.write_all(answer.as_bytes()).await;
                let _ = sandbox.shutdown().await;
                return Err(Unserved::Host(why));
            }
            Err(_) => {
                return Err(Unserved::Host(TlsError(format!(
                    "{host}'s TLS handshake took too long"
                ))));
            }
        };
        Ok(relay(sandbox, onward, headers).await)
    }
}

/// Why a tunnel with injected headers carried no request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unserved {
    /// The proxy could not show the sandbox a certificate for the host.
    Proxy(TlsError),
    /// The sandbox's side of TLS failed: the connection was allowed, the sandbox gave up.
    Sandbox(TlsError),
    /// TLS onward to the host failed (its certificate not trusted, say): the connection
    /// reached no host it could trust, and is refused.
    Host(TlsError),
}

/// What an onward handshake's failure `error` means, in words: a certificate the proxy does
/// not trust says so and why (rustls' reason: `UnknownIssuer`, `NotValidForName`, …).
fn onward_failure(host: &str, error: &std::io::Error) -> String {
    let rustls_error = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    match rustls_error {
        Some(rustls::Error::InvalidCertificate(why)) => {
            format!("{host}'s certificate is not trusted by the egress proxy ({why})")
        }
        _ => format!("the TLS handshake with {host} failed: {error}"),
    }
}

/// How a tunnel with injected headers ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Tunnelled {
    /// Its requests and answers were carried: the bytes each way.
    Carried(u64, u64),
    /// No host could be reached to carry them to: the rule its record is refused with.
    Refused(String),
}

/// Serves a `CONNECT` tunnel to `host` whose requests get `headers`, its onward connection
/// made: answers `200`, then [`Interceptor::serve`] (with `rest`, what the sandbox sent after
/// the `CONNECT` head, first). Refused when no interceptor can end TLS or TLS onward failed
/// (the rule says `upstream TLS:` and why); carried otherwise (a sandbox that gave up its own
/// handshake carried nothing).
pub(crate) async fn tunnel<S>(
    tls: Option<&Interceptor>,
    mut client: S,
    rest: Vec<u8>,
    upstream: TcpStream,
    host: &str,
    headers: &[&InjectedHeader],
) -> Tunnelled
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let Some(tls) = tls else {
        let body =
            format!("{host} has injected headers, but this egress proxy ends no TLS to add them\n");
        let _ = client
            .write_all(
                format!(
                    "HTTP/1.1 502 Bad Gateway\r\nContent-Length: {}\r\nConnection: close\r\n\r\n\
                     {body}",
                    body.len()
                )
                .as_bytes(),
            )
            .await;
        return Tunnelled::Refused(body.trim_end().to_string());
    };
    if client
        .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
        .await
        .is_err()
    {
        return Tunnelled::Carried(0, 0);
    }
    let (read, write) = tokio::io::split(client);
    let client = tokio::io::join(std::io::Cursor::new(rest).chain(read), write);
    match tls.serve(client, upstream, host, headers).await {
        Ok((out, back)) => Tunnelled::Carried(out, back),
        Err(Unserved::Host(why)) => Tunnelled::Refused(format!("upstream TLS: {why}")),
        Err(Unserved::Proxy(error) | Unserved::Sandbox(error)) => {
            tracing::warn!(host = %host, error = %error, "egress: TLS with injected headers failed");
            Tunnelled::Carried(0, 0)
        }
    }
}

/// Carries the requests of `sandbox` to `onward` with `headers` put in, and the answers back,
/// until either side is done; the bytes each way.
async fn relay<A, B>(sandbox: A, onward: B, headers: &[&InjectedHeader]) -> (u64, u64)
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let (sandbox_in, mut sandbox_out) = tokio::io::split(sandbox);
    let (mut onward_in, mut onward_out) = tokio::io::split(onward);
    let sent = AtomicU64::new(0);
    let requests = async {
        let _ = forward_requests(BufReader::new(sandbox_in), &mut onward_out, headers, &sent).await;
        let _ = onward_out.shutdown().await;
    };
    let answers = async {
        let got = tokio::io::copy(&mut onward_in, &mut sandbox_out)
            .await
            .unwrap_or(0);
        let _ = sandbox_out.shutdown().await;
        got
    };
    tokio::pin!(requests, answers);
    let back = tokio::select! {
        () = &mut requests => answers.await,
        // The host is done: nothing more the sandbox sends can reach it.
        got = &mut answers => got,
    };
    (sent.load(Ordering::Relaxed), back)
}

/// The body that follows a request head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Body {
    /// None.
    Empty,
    /// This many bytes.
    Length(u64),
    /// Chunks, up to the last one and its trailer.
    Chunked,
    /// The connection becomes something else (an accepted `Upgrade`): everything that
    /// follows, as it comes.
    Rest,
}

/// A request head with `headers` put in place of any of the same names; the head and the
/// body that follows it. `None` when the head is not HTTP/1.x.
fn rewrite_head(head: &str, headers: &[&InjectedHeader]) -> Option<(String, Body)> {
    let mut lines = head.split("\r\n").filter(|line| !line.is_empty());
    let first = lines.next()?;
    let mut words = first.split(' ');
    let (Some(method), Some(_), Some(version), None) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return None;
    };
    if !version.starts_with("HTTP/1.") {
        return None;
    }
    let mut out = format!("{first}\r\n");
    let mut body = Body::Empty;
    let mut chunked = false;
    let mut upgrade = method.eq_ignore_ascii_case("CONNECT");
    for line in lines {
        let (name, value) = line.split_once(':')?;
        let name = name.trim();
        if headers.iter().any(|h| h.name.eq_ignore_ascii_case(name)) {
            continue;
        }
        if name.eq_ignore_ascii_case("content-length") {
            body = Body::Length(value.trim().parse().ok()?);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.to_ascii_lowercase().contains("chunked");
        } else if name.eq_ignore_ascii_case("upgrade") {
            upgrade = true;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    for header in headers {
        out.push_str(&header.name);
        out.push_str(": ");
        out.push_str(header.value.expose());
        out.push_str("\r\n");
    }
    out.push_str("\r\n");
    let body = match (upgrade, chunked) {
        (true, _) => Body::Rest,
        (false, true) => Body::Chunked,
        (false, false) => body,
    };
    Some((out, body))
}

/// Reads one head (up to the empty line) from `from`: `None` at the end of the stream before
/// any byte of one.
async fn read_head<R: AsyncRead + Unpin>(
    from: &mut BufReader<R>,
) -> std::io::Result<Option<String>> {
    let mut head = Vec::new();
    loop {
        let before = head.len();
        let read = (&mut *from)
            .take(MAX_HEAD_BYTES.saturating_sub(head.len() as u64))
            .read_until(b'\n', &mut head)
            .await?;
        if read == 0 {
            return if head.is_empty() {
                Ok(None)
            } else {
                Err(std::io::ErrorKind::UnexpectedEof.into())
            };
        }
        if !head.ends_with(b"\n") {
            return Err(std::io::Error::other("a request head is too long"));
        }
        let line = &head[before..];
        // Empty lines before a request are allowed, and skipped.
        if head.len() == line.len() && (line == b"\r\n" || line == b"\n") {
            head.clear();
            continue;
        }
        if line == b"\r\n" || line == b"\n" {
            return String::from_utf8(head)
                .map(Some)
                .map_err(|_| std::io::Error::other("a request head is not UTF-8"));
        }
    }
}

/// Copies exactly `n` bytes.
async fn copy_exactly<R, W>(from: &mut R, to: &mut W, n: u64) -> std::io::Result<u64>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let copied = tokio::io::copy(&mut from.take(n), to).await?;
    if copied < n {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(copied)
}

/// Forwards the requests read from `from` to `to`, each with `headers` put in; adds the bytes
/// written to `sent`. Ends at the end of `from`, or with an error on a request it cannot
/// read (then nothing more goes onward).
async fn forward_requests<R, W>(
    mut from: BufReader<R>,
    to: &mut W,
    headers: &[&InjectedHeader],
    sent: &AtomicU64,
) -> std::io::Result<()>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    while let Some(head) = read_head(&mut from).await? {
        let (head, body) = rewrite_head(&head, headers)
            .ok_or_else(|| std::io::Error::other("not an HTTP/1.x request"))?;
        to.write_all(head.as_bytes()).await?;
        sent.fetch_add(head.len() as u64, Ordering::Relaxed);
        match body {
            Body::Empty => {}
            Body::Length(n) => {
                sent.fetch_add(copy_exactly(&mut from, to, n).await?, Ordering::Relaxed);
            }
            Body::Chunked => loop {
                let mut line = Vec::new();
                (&mut from).take(4096).read_until(b'\n', &mut line).await?;
                if !line.ends_with(b"\n") {
                    return Err(std::io::Error::other("a chunk's size line is not valid"));
                }
                to.write_all(&line).await?;
                sent.fetch_add(line.len() as u64, Ordering::Relaxed);
                let text = String::from_utf8_lossy(&line);
                let size = text.split([';', '\r', '\n']).next().unwrap_or_default();
                let size = u64::from_str_radix(size.trim(), 16)
                    .map_err(|_| std::io::Error::other("a chunk's size is not hexadecimal"))?;
                if size == 0 {
                    // The trailer, up to its empty line.
                    loop {
                        let mut line = Vec::new();
                        (&mut from).take(4096).read_until(b'\n', &mut line).await?;
                        to.write_all(&line).await?;
                        sent.fetch_add(line.len() as u64, Ordering::Relaxed);
                        if line == b"\r\n" || line == b"\n" || line.is_empty() {
                            break;
                        }
                    }
                    break;
                }
                sent.fetch_add(
                    copy_exactly(&mut from, to, size + 2).await?,
                    Ordering::Relaxed,
                );
            },
            Body::Rest => {
                sent.fetch_add(tokio::io::copy(&mut from, to).await?, Ordering::Relaxed);
                return Ok(());
            }
        }
        to.flush().await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use nodus_core::secret::SecretString;

    fn header(name: &str, value: &str) -> InjectedHeader {
        InjectedHeader {
            host: "api.test".into(),
            name: name.into(),
            value: SecretString::new(value),
        }
    }

    #[test]
    fn a_head_gets_the_headers_in_place_of_the_sandboxs() {
        let auth = header("Authorization", "Bearer s3cret");
        let table: Vec<(&str, Option<(&str, Body)>)> = vec![
            (
                "GET /x HTTP/1.1\r\nHost: api.test\r\nauthorization: forged\r\n\r\n",
                Some((
                    "GET /x HTTP/1.1\r\nHost: api.test\r\nAuthorization: Bearer s3cret\r\n\r\n",
                    Body::Empty,
                )),
            ),
            (
                "POST / HTTP/1.1\r\nContent-Length: 5\r\n\r\n",
                Some((
                    "POST / HTTP/1.1\r\nContent-Length: 5\r\nAuthorization: Bearer s3cret\r\n\r\n",
                    Body::Length(5),
                )),
            ),
            (
                "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
                Some((
                    "POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\nAuthorization: \
                     Bearer s3cret\r\n\r\n",
                    Body::Chunked,
                )),
            ),
            (
                "GET /ws HTTP/1.1\r\nUpgrade: websocket\r\n\r\n",
                Some((
                    "GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nAuthorization: Bearer s3cret\r\n\r\n",
                    Body::Rest,
                )),
            ),
            ("PRI * HTTP/2.0\r\n\r\n", None),
            ("GET / HTTP/1.1\r\nno colon\r\n\r\n", None),
            ("GET / HTTP/1.1\r\nContent-Length: x\r\n\r\n", None),
        ];
        for (head, expected) in table {
            let got = rewrite_head(head, &[&auth]);
            assert_eq!(
                got.as_ref().map(|(h, b)| (h.as_str(), *b)),
                expected,
                "{head:?}"
            );
        }
    }

    #[tokio::test]
    async fn each_request_of_a_connection_gets_the_headers_and_bodies_pass_whole() {
        let key = header("X-Key", "k1");
        let input = b"GET /a HTTP/1.1\r\nHost: h\r\n\r\n\
            POST /b HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc\
            POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nxyz\r\n0\r\nT: 1\r\n\r\n\
            GET /d HTTP/1.1\r\nX-Key: forged\r\n\r\n";
        let mut out = Vec::new();
        let sent = AtomicU64::new(0);
        forward_requests(BufReader::new(&input[..]), &mut out, &[&key], &sent)
            .await
            .expect("forwarded");
        let out = String::from_utf8(out).expect("text");
        assert_eq!(
            out,
            "GET /a HTTP/1.1\r\nHost: h\r\nX-Key: k1\r\n\r\n\
             POST /b HTTP/1.1\r\nContent-Length: 3\r\nX-Key: k1\r\n\r\nabc\
             POST /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\nX-Key: k1\r\n\r\n3\r\nxyz\r\n0\r\nT: 1\r\n\r\n\
             GET /d HTTP/1.1\r\nX-Key: k1\r\n\r\n"
        );
        assert_eq!(sent.load(Ordering::Relaxed), out.len() as u64);
        // A body cut short ends the connection with an error.
        let mut out = Vec::new();
        let cut = b"POST /b HTTP/1.1\r\nContent-Length: 9\r\n\r\nabc";
        assert!(
            forward_requests(
                BufReader::new(&cut[..]),
                &mut out,
                &[&key],
                &AtomicU64::new(0)
            )
            .await
            .is_err()
        );
    }

    #[test]
    fn the_authority_is_made_once_kept_private_and_signs_hosts_certificates() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("dir");
        let first = Interceptor::open(dir.path(), &[]).expect("made");
        let mode = |name: &str| {
            std::fs::metadata(dir.path().join(name))
                .expect("there")
                .permissions()
                .mode()
                & 0o777
        };
        assert_eq!((mode(CA_KEY_FILE), mode(CA_CERT_FILE)), (0o600, 0o600));
        let again = Interceptor::open(dir.path(), &[]).expect("read back");
        assert_eq!(first.ca_certificate(), again.ca_certificate());
        assert!(
            first
                .ca_certificate()
                .starts_with("-----BEGIN CERTIFICATE-----")
        );
        // A certificate the second start makes verifies under the first start's authority.
        let shown = again.shown_for("api.test").expect("a certificate");
        let cached = again.shown_for("api.test").expect("cached");
        assert!(Arc::ptr_eq(&shown, &cached));
        let mut roots = rustls::RootCertStore::empty();
        roots.add(first.ca_der.clone()).expect("a root");
        let leaf_pem = {
            let mut params = CertificateParams::new(vec!["api.test".to_owned()]).expect("p");
            params.use_authority_key_identifier_extension = true;
            params
                .signed_by(&again.leaf_key, &again.issuer)
                .expect("signed")
        };
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build()
        .expect("verifier");
        let name = ServerName::try_from("api.test").expect("name");
        rustls::client::danger::ServerCertVerifier::verify_server_cert(
            verifier.as_ref(),
            leaf_pem.der(),
            &[],
            &name,
            &[],
            rustls::pki_types::UnixTime::now(),
        )
        .expect("the first start's authority verifies the second's certificates");
        // Rotation: the files removed, the next start makes a new authority.
        std::fs::remove_file(dir.path().join(CA_KEY_FILE)).expect("removed");
        std::fs::remove_file(dir.path().join(CA_CERT_FILE)).expect("removed");
        let rotated = Interceptor::open(dir.path(), &[]).expect("made again");
        assert_ne!(rotated.ca_certificate(), first.ca_certificate());
    }
}
