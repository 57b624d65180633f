//! The operator checks' HTTP client (`kvsim preflight`, `kvsim canary`) and the tests':
//! `ureq` 3 with rustls, so a reply may be chunked, the `Host` header is the URL's
//! host, and `https://` URLs work; the standard proxy variables are honoured. Replies
//! are read to the end, bounded by [`MAX_REPLY`].
//!
//! [`send`] is the one raw piece: it writes a request on a plain TCP connection and
//! hands the connection back, for a client that goes away mid-request on purpose.

use std::io::Write;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Most bytes of a reply.
pub const MAX_REPLY: usize = 64 * 1024 * 1024;

/// Why a request failed (no reply to judge).
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("`{0}` is not an http:// or https:// URL")]
    BadUrl(String),
    #[error("{url}: unreachable: {why}")]
    Unreachable { url: String, why: String },
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

/// `http://host:port` (a trailing slash or path is dropped) to its host and port.
pub fn host_port(url: &str) -> Result<(String, u16), FetchError> {
    let (rest, default) = match (url.strip_prefix("http://"), url.strip_prefix("https://")) {
        (Some(r), _) => (r, 80),
        (_, Some(r)) => (r, 443),
        _ => return Err(FetchError::BadUrl(url.into())),
    };
    let host = rest.split('/').next().unwrap_or("");
    let bad = || FetchError::BadUrl(url.into());
    // `[v6]:port`, `[v6]`, `name:port`, `name`.
    let (h, port) = match host.rfind(']') {
        Some(i) => (&host[..=i], host[i + 1..].strip_prefix(':')),
        None => match host.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (host, None),
        },
    };
    if h.is_empty() {
        return Err(bad());
    }
    let port = match port {
        Some(p) => p.parse().map_err(|_| bad())?,
        None => default,
    };
    Ok((h.to_string(), port))
}

/// A URL's socket address.
pub fn base_addr(url: &str) -> Result<SocketAddr, FetchError> {
    let (h, p) = host_port(url)?;
    (h.trim_matches(['[', ']']), p)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| FetchError::BadUrl(url.into()))
}

/// Open a plain connection to `addr` and send one request (`Host: host`); the caller
/// reads or drops the stream (a disconnect on purpose).
pub fn send_to(
    addr: SocketAddr,
    host: &str,
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
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body)?;
    Ok(s)
}

/// [`send_to`] with the address as the host.
pub fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    timeout: Duration,
) -> std::io::Result<TcpStream> {
    send_to(addr, &addr.to_string(), method, path, body, timeout)
}

/// An agent whose every request ends within `timeout`; any status is a reply.
pub fn agent(timeout: Duration) -> ureq::Agent {
    ureq::Agent::config_builder()
        .timeout_global(Some(timeout))
        .http_status_as_error(false)
        .build()
        .into()
}

/// One request and its whole reply.
pub fn fetch(
    base: &str,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
    timeout: Duration,
) -> Result<HttpReply, FetchError> {
    fetch_with(&agent(timeout), base, method, path, body)
}

/// One request on `agent` (whose connections are kept alive) and its whole reply.
pub fn fetch_with(
    agent: &ureq::Agent,
    base: &str,
    method: &str,
    path: &str,
    body: Option<&[u8]>,
) -> Result<HttpReply, FetchError> {
    let url = format!("{}{path}", base.trim_end_matches('/'));
    host_port(base)?;
    let sent = match (method, body) {
        ("GET", _) => agent.get(&url).call(),
        ("POST", b) => agent
            .post(&url)
            .header("content-type", "application/json")
            .send(b.unwrap_or(&[])),
        (m, _) => {
            return Err(FetchError::BadUrl(format!(
                "{url}: method {m} (GET or POST only)"
            )))
        }
    };
    let mut resp = sent.map_err(|e| FetchError::Unreachable {
        url: url.clone(),
        why: e.to_string(),
    })?;
    let status = resp.status().as_u16();
    let body = resp
        .body_mut()
        .with_config()
        .limit(MAX_REPLY as u64)
        .read_to_vec()
        .map_err(|e| FetchError::BadReply {
            url: url.clone(),
            why: format!("reading the reply: {e}"),
        })?;
    Ok(HttpReply { status, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_host_and_port() {
        assert_eq!(host_port("http://a:5/x").unwrap(), ("a".into(), 5));
        assert_eq!(host_port("https://a").unwrap(), ("a".into(), 443));
        assert_eq!(host_port("http://[::1]:7").unwrap(), ("[::1]".into(), 7));
        assert!(host_port("ftp://a").is_err());
        assert!(host_port("http://").is_err());
    }
}
