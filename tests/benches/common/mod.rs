//! What the server benchmarks share: the bench token, the project's API prefix and a small
//! keep-alive HTTP/1.1 client.

#![allow(dead_code)]

use std::net::SocketAddr;

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
