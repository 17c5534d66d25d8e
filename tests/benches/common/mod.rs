//! What the server benchmarks share: the bench token, the project's API prefix, a small
//! keep-alive HTTP/1.1 client and the wall time of a group.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// The bootstrap token the benchmarks' servers are started with.
pub const TOKEN: &str = "nodus_bench_token_0123456789abcdef";
/// The default project's API prefix.
pub const P: &str = "/apis/nodus.dev/v1/projects/default";

/// One keep-alive connection: send a request, read the status and the body.
pub struct Connection {
    stream: BufReader<TcpStream>,
}

impl Connection {
    /// Connect, panicking on failure.
    pub async fn open(address: SocketAddr) -> Connection {
        Connection::try_open(address).await.expect("connect")
    }

    /// Connect.
    pub async fn try_open(address: SocketAddr) -> std::io::Result<Connection> {
        Ok(Connection {
            stream: BufReader::new(TcpStream::connect(address).await?),
        })
    }

    /// Send a request and read its answer, panicking on a broken connection.
    pub async fn request(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> (u16, Vec<u8>) {
        self.try_request(method, path, body).await.expect("request")
    }

    /// Send a request and read its answer (status and body).
    pub async fn try_request(
        &mut self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> std::io::Result<(u16, Vec<u8>)> {
        let broken = |what: &str| std::io::Error::other(what.to_string());
        let body = body.unwrap_or("");
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {TOKEN}\r\n\
             Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        let stream = self.stream.get_mut();
        stream.write_all(head.as_bytes()).await?;
        stream.write_all(body.as_bytes()).await?;
        let mut line = String::new();
        if self.stream.read_line(&mut line).await? == 0 {
            return Err(broken("the connection was closed before an answer"));
        }
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| broken(&format!("no status in {line:?}")))?;
        let mut length = 0usize;
        loop {
            line.clear();
            if self.stream.read_line(&mut line).await? == 0 {
                return Err(broken("the connection was closed in the headers"));
            }
            if line == "\r\n" {
                break;
            }
            if let Some((name, value)) = line.split_once(':')
                && name.eq_ignore_ascii_case("content-length")
            {
                length = value
                    .trim()
                    .parse()
                    .map_err(|_| broken(&format!("bad length {value:?}")))?;
            }
        }
        let mut body = vec![0; length];
        self.stream.read_exact(&mut body).await?;
        Ok((status, body))
    }
}

/// Milliseconds from the first batch of a group of `runs` to the group's success.
pub async fn group_wall_time(address: SocketAddr, name: &str, runs: usize) -> u128 {
    let mut connection = Connection::open(address).await;
    let group = format!(
        r#"{{"apiVersion":"nodus.dev/v1","kind":"AgentGroup","metadata":{{"name":"{name}"}},"spec":{{"agent":"bench","limits":{{"maxActive":100}},"maxCostUSD":"1000.00"}}}}"#
    );
    let (status, body) = connection
        .request("POST", &format!("{P}/agentgroups"), Some(&group))
        .await;
    assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    let started = Instant::now();
    for batch in 0..runs.div_ceil(100) {
        let items: Vec<String> = (batch * 100..((batch + 1) * 100).min(runs))
            .map(|i| {
                format!(
                    r#"{{"apiVersion":"nodus.dev/v1","kind":"AgentRun","spec":{{"agent":"bench","group":"{name}","taskKey":"t{i}","input":"Run `echo {i}`"}}}}"#
                )
            })
            .collect();
        let list = format!(
            r#"{{"apiVersion":"nodus.dev/v1","kind":"AgentRunList","items":[{}]}}"#,
            items.join(",")
        );
        let (status, body) = connection
            .request("POST", &format!("{P}/agentruns"), Some(&list))
            .await;
        assert_eq!(status, 201, "{}", String::from_utf8_lossy(&body));
    }
    let (status, body) = connection
        .request(
            "PATCH",
            &format!("{P}/agentgroups/{name}"),
            Some(r#"{"spec":{"sealed":true}}"#),
        )
        .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    loop {
        let (_, body) = connection
            .request("GET", &format!("{P}/agentgroups/{name}"), None)
            .await;
        let group: serde_json::Value = serde_json::from_slice(&body).expect("json");
        match group["status"]["phase"].as_str() {
            Some("Succeeded") => return started.elapsed().as_millis(),
            Some("Failed") => panic!("the group failed: {group}"),
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// An address on loopback that nothing listens on (a port bound and released).
pub fn free_port_address() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("address")
}
