//! Serving HTTP/1 connections with bounds a client without a token cannot get around: a
//! request's headers must arrive within a timeout (which also closes idle keep-alive
//! connections), and at most so many connections are open at once; past that, new ones wait
//! in the kernel's backlog, holding no descriptor of the server.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

/// The open files asked for when the hard limit is unlimited.
const MAX_OPEN_FILES: u64 = 1 << 20;

/// How long a failed `accept` (descriptors exhausted, say) waits before the next one.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// The bounds on connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConnectionLimits {
    /// How long a connection may take to send a request's headers, counted from when it
    /// opened or its last response was sent: it bounds slow headers and idle keep-alive
    /// connections alike.
    pub header_timeout: Duration,
    /// Connections served at once.
    pub max_connections: usize,
}

/// Serve `router` on `listener` until `shutdown` resolves, then let open connections finish
/// their requests.
pub(crate) async fn serve(
    listener: TcpListener,
    router: axum::Router,
    limits: ConnectionLimits,
    shutdown: impl Future<Output = ()> + Send,
) {
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    let builder = Arc::new(builder);
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    // Each connection holds a receiver: `closed()` resolves when all of them are gone.
    let (closing_tx, closing_rx) = watch::channel(false);
    tokio::pin!(shutdown);
    loop {
        let permit = tokio::select! {
            biased;
            () = &mut shutdown => break,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let stream = tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // EMFILE, ENFILE, ENOBUFS or a connection reset before it was accepted:
                    // none of them stops the server.
                    tracing::warn!(error = %error, "cannot accept a connection; retrying");
                    tokio::time::sleep(ACCEPT_PAUSE).await;
                    continue;
                }
            },
        };
        // A streamed answer (a run's watch, its output) is written in small pieces: without
        // this, each waits for the client to acknowledge the one before.
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(error = %error, "cannot turn Nagle's algorithm off");
        }
        let service = TowerToHyperService::new(router.clone());
        let builder = builder.clone();
        let mut closing = closing_rx.clone();
        tokio::spawn(async move {
            let connection = builder.serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(error) = result {
                        tracing::debug!(error = %error, "connection ended");
                    }
                }
                () = async { drop(closing.wait_for(|closing| *closing).await) } => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
            drop(permit);
            drop(closing);
        });
    }
    drop(closing_rx);
    let _ = closing_tx.send(true);
    closing_tx.closed().await;
}

/// Raise the soft limit of open descriptors to the hard limit, so that connections, the
/// store and commands' pipes do not run out at the default 1024. Returns the soft limit now.
pub(crate) fn raise_descriptor_limit() -> Option<u64> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    // An unlimited hard limit: as many as Linux allows by default (`fs.nr_open`).
    let target = limit.maximum.unwrap_or(MAX_OPEN_FILES);
    if limit.current.is_some_and(|current| current < target) {
        let raised = rustix::process::Rlimit {
            current: Some(target),
            maximum: limit.maximum,
        };
        if let Err(error) = setrlimit(Resource::Nofile, raised) {
            tracing::warn!(error = %error, "cannot raise the limit of open files");
        }
    }
    getrlimit(Resource::Nofile).current
}
