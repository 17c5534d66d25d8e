//! Connections a client without a token opens cannot exhaust the server: idle ones are
//! closed after the header timeout, fresh or kept alive, and past the connection limit new
//! ones wait instead of taking descriptors, while `/healthz` still answers; the soft limit
//! of open files is raised to the hard one.

use std::time::{Duration, Instant};

use nodus_server::{Options, SandboxKind, Server, StoreUrl};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

const TIMEOUT: Duration = Duration::from_secs(1);
const LIMIT: usize = 40;
/// Idle connections opened: more than the limit.
const IDLE: usize = 100;
/// Far more than the few header timeouts the idle connections need to be served and closed.
const PATIENCE: Duration = Duration::from_secs(15);

async fn start(dir: &std::path::Path) -> (std::net::SocketAddr, tokio::sync::oneshot::Sender<()>) {
    let mut options = Options::new(dir.join("data"));
    options.store = Some(StoreUrl::Memory);
    options.sandbox = SandboxKind::Unisolated;
    options.bootstrap_token = Some("nodus_connections_test_token_0123456789".to_string());
    options.listen = "127.0.0.1:0".parse().expect("address");
    options.header_timeout = TIMEOUT;
    options.max_connections = LIMIT;
    let bound = Server::build(options)
        .await
        .expect("server")
        .bind()
        .await
        .expect("bind");
    let address = bound.local_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(bound.serve(async move {
        let _ = stopped.await;
    }));
    (address, stop)
}

/// `GET /healthz` on a connection kept alive; the body.
async fn healthz(stream: &mut TcpStream) -> String {
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: nodus\r\n\r\n")
        .await
        .expect("request");
    let mut answer = Vec::new();
    let mut buffer = [0u8; 1024];
    while !answer.ends_with(b"\r\n\r\nok\n") {
        let read = stream.read(&mut buffer).await.expect("answer");
        assert!(read > 0, "closed before answering");
        answer.extend_from_slice(&buffer[..read]);
    }
    String::from_utf8_lossy(&answer).into_owned()
}

/// Whether the server closes `stream` within `within` (EOF or a reset).
async fn closed_within(mut stream: TcpStream, within: Duration) -> bool {
    let mut buffer = [0u8; 64];
    matches!(
        tokio::time::timeout(within, stream.read(&mut buffer)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_connections_are_closed_after_the_timeout_while_healthz_answers() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    // A low soft limit of open files, as many hosts start processes with: the server raises
    // it to the hard limit.
    let hard = getrlimit(Resource::Nofile).maximum;
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(512),
            maximum: hard,
        },
    )
    .expect("a lower soft limit");
    let dir = tempfile::tempdir().expect("dir");
    let (address, stop) = start(dir.path()).await;
    let mut idle = Vec::new();
    for _ in 0..IDLE {
        idle.push(TcpStream::connect(address).await.expect("connect"));
    }
    let opened = Instant::now();

    // More idle connections than the limit: /healthz is answered once the first ones time out.
    let mut fresh = tokio::time::timeout(PATIENCE, TcpStream::connect(address))
        .await
        .expect("connects in time")
        .expect("connect");
    let answer = tokio::time::timeout(PATIENCE, healthz(&mut fresh))
        .await
        .expect("/healthz answers while idle connections are open");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let soft = getrlimit(Resource::Nofile).current;
    assert!(
        soft > Some(512),
        "the soft limit was raised: {soft:?} (hard {hard:?})"
    );

    // Every idle connection is closed by the server, none before the timeout.
    let closing: Vec<_> = idle
        .into_iter()
        .map(|stream| tokio::spawn(closed_within(stream, PATIENCE)))
        .collect();
    for (index, closed) in closing.into_iter().enumerate() {
        assert!(
            closed.await.expect("task"),
            "idle connection {index} is still open"
        );
    }
    assert!(opened.elapsed() >= TIMEOUT, "not closed before the timeout");

    // A kept-alive connection that goes idle after a request is closed too.
    let started = Instant::now();
    assert!(
        closed_within(fresh, PATIENCE).await,
        "the kept-alive connection is still open"
    );
    assert!(started.elapsed() < PATIENCE);
    let mut again = TcpStream::connect(address).await.expect("connect");
    let answer = tokio::time::timeout(PATIENCE, healthz(&mut again))
        .await
        .expect("/healthz answers at once when nothing is idle");
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let _ = stop.send(());
}
