//! A minimal blocking HTTP/1.1 client (one request per connection) for the operator
//! checks (`kvsim preflight`, `kvsim canary`) and the tests: `http://HOST:PORT/PATH`
//! only, `Connection: close`, the whole reply read to the end (bounded).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Most bytes of a reply.
pub const MAX_REPLY: usize = 64 * 1024 * 1024;

/// Why a request failed (no reply to judge).
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("`{0}` is not an http://HOST:PORT URL")]
    BadUrl(String),
    #[error("{url}: unreachable: {source}")]
    Unreachable { url: String, source: std::io::Error },
    #[error("{url}: {why}")]
    BadReply { url: String, why: String },
}

/// An HTTP reply.
#[derive(Debug, Clone)]
pub struct HttpReply {
    pub status: u16,
    pub body: Vec<u8>,
}

impl HttpReply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// `http://host:port` (a trailing slash or path is dropped) to an address.
pub fn base_addr(url: &str) -> Result<SocketAddr, FetchError> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| FetchError::BadUrl(url.into()))?;
    let host = rest.split('/').next().unwrap_or("");
    let host = if host.contains(':') {
        host.to_string()
    } else {
        format!("{host}:80")
    };
    host.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| FetchError::BadUrl(url.into()))
}

/// Open a connection and send one request; the caller reads (or drops) the stream.
pub fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    timeout: Duration,
) -> std::io::Result<TcpStream> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    s.set_nodelay(true)?;
    let body = body.unwrap_or(&[]);
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    Ok(s)
}

/// Read a whole reply off `s`.
pub fn read_reply(url: &str, mut s: TcpStream) -> Result<HttpReply, FetchError> {
    let mut buf = Vec::new();
    (&mut s)
        .take(MAX_REPLY as u64 + 1)
        .read_to_end(&mut buf)
        .map_err(|source| FetchError::Unreachable {
            url: url.into(),
            source,
        })?;
    let bad = |why: &str| FetchError::BadReply {
        url: url.into(),
        why: why.into(),
    };
    if buf.len() > MAX_REPLY {
        return Err(bad("reply longer than 64 MiB"));
    }
    let end = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| bad("no end of the reply's head"))?;
    let head = std::str::from_utf8(&buf[..end]).map_err(|_| bad("reply head is not UTF-8"))?;
    let status = head
        .lines()
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse::<u16>().ok())
        .ok_or_else(|| bad("no status line"))?;
    Ok(HttpReply {
        status,
        body: buf[end + 4..].to_vec(),
    })
}

/// One request and its whole reply.
pub fn fetch(
    base: &str,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    timeout: Duration,
) -> Result<HttpReply, FetchError> {
    let url = format!("{}{path}", base.trim_end_matches('/'));
    let addr = base_addr(base)?;
    let s = send(addr, method, path, body, timeout).map_err(|source| FetchError::Unreachable {
        url: url.clone(),
        source,
    })?;
    read_reply(&url, s)
}
