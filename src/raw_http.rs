//! The load generator's own HTTP/1.1 client for `kvsim bench-http --client raw`: one
//! kept-alive connection, the request's bytes written once, the reply read by its
//! `Content-Length` or its chunks. It costs the client about what the line endpoint's
//! client costs, so on a machine whose cores the server shares with its load, the two
//! fronts' figures compare the servers, not the clients. Benchmarks only: the operator
//! tools use `ureq` (`kvsim_runtime::http_client`).

use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// One kept-alive connection to a server.
pub struct RawClient {
    stream: TcpStream,
    buf: Vec<u8>,
}

impl RawClient {
    pub fn connect(addr: &str) -> Result<Self> {
        let stream = TcpStream::connect(addr).with_context(|| addr.to_string())?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(RawClient {
            stream,
            buf: Vec::with_capacity(8192),
        })
    }

    /// Send `request` (a whole HTTP/1.1 request) and read its reply: (latency, time to
    /// the first byte of the body, status).
    pub fn send(&mut self, request: &[u8]) -> Result<(Duration, Duration, u16)> {
        let t = Instant::now();
        self.stream.write_all(request)?;
        self.buf.clear();
        let head_end = loop {
            if let Some(i) = find(&self.buf, b"\r\n\r\n") {
                break i + 4;
            }
            self.fill()?;
        };
        let head = std::str::from_utf8(&self.buf[..head_end]).context("reply head")?;
        let status: u16 = head
            .get(9..12)
            .and_then(|s| s.parse().ok())
            .context("reply status line")?;
        let lower = head.to_ascii_lowercase();
        let length = lower
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse::<usize>().ok());
        let chunked = lower.contains("transfer-encoding: chunked");
        let mut first = None;
        if self.buf.len() > head_end {
            first = Some(t.elapsed());
        }
        match (length, chunked) {
            (Some(n), _) => {
                while self.buf.len() < head_end + n {
                    self.fill()?;
                    first.get_or_insert_with(|| t.elapsed());
                }
            }
            (None, true) => self.read_chunks(head_end, t, &mut first)?,
            (None, false) => bail!("a reply with neither a length nor chunks"),
        }
        let total = t.elapsed();
        Ok((total, first.unwrap_or(total), status))
    }

    /// Read chunks from `at` through the last (empty) one.
    fn read_chunks(
        &mut self,
        mut at: usize,
        t: Instant,
        first: &mut Option<Duration>,
    ) -> Result<()> {
        loop {
            let line_end = loop {
                if let Some(i) = find(&self.buf[at..], b"\r\n") {
                    break at + i;
                }
                self.fill()?;
            };
            let size_text = std::str::from_utf8(&self.buf[at..line_end]).context("chunk size")?;
            let size = usize::from_str_radix(size_text.split(';').next().unwrap_or("").trim(), 16)
                .context("chunk size")?;
            let end = line_end + 2 + size + 2;
            while self.buf.len() < end {
                self.fill()?;
            }
            if size == 0 {
                return Ok(());
            }
            first.get_or_insert_with(|| t.elapsed());
            at = end;
        }
    }

    fn fill(&mut self) -> Result<()> {
        let mut chunk = [0u8; 8192];
        let n = self.stream.read(&mut chunk)?;
        if n == 0 {
            bail!("the server closed the connection");
        }
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(())
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The bytes of a `POST path` of `body` (JSON) to `host`, kept alive.
pub fn post_request(host: &str, path: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}
