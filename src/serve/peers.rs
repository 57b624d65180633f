//! The node address lists of `kvsim serve`: the peers file (`nID ADDR`, `client ADDR`,
//! `bootstrap nID ADDR`) and the `nID=ADDR,...` lists of `--worker-http` and
//! `--bootstrap`. Text in, maps out; binding the addresses is [`super::start`]'s.

use anyhow::{bail, Context, Result};
use kvsim_engine::ids::NodeId;
use std::collections::BTreeMap;
use std::net::SocketAddr;

pub(super) fn node_id(s: &str) -> Result<NodeId> {
    let n = s.strip_prefix('n').unwrap_or(s);
    n.parse::<u16>()
        .map(NodeId)
        .with_context(|| format!("--node: `{s}` is not a node id (like n1)"))
}

/// The peers file: `nID ADDR` per node, `client ADDR`; `#` starts a comment.
pub fn parse_peers(text: &str) -> Result<(BTreeMap<NodeId, SocketAddr>, Option<SocketAddr>)> {
    let mut peers = BTreeMap::new();
    let mut client = None;
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        if line.starts_with("bootstrap ") {
            continue;
        }
        let mut parts = line.split_whitespace();
        let (Some(name), Some(addr), None) = (parts.next(), parts.next(), parts.next()) else {
            bail!("peers line {}: expected `NAME ADDR`, got `{line}`", i + 1);
        };
        let addr: SocketAddr = addr
            .parse()
            .with_context(|| format!("peers line {}: `{addr}` is not an address", i + 1))?;
        if name == "client" {
            client = Some(addr);
        } else if name == "bootstrap" {
            continue;
        } else {
            let id = node_id(name).with_context(|| format!("peers line {}", i + 1))?;
            if peers.insert(id, addr).is_some() {
                bail!("peers line {}: {name} is listed twice", i + 1);
            }
        }
    }
    Ok((peers, client))
}

/// `nID=ADDR,...` (--worker-http and --bootstrap without --node).
pub fn node_list(text: &str) -> Result<BTreeMap<NodeId, SocketAddr>> {
    let mut out = BTreeMap::new();
    for item in text.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let (n, addr) = item
            .split_once('=')
            .with_context(|| format!("`{item}`: expected nID=ADDR"))?;
        let id = node_id(n)?;
        let addr: SocketAddr = addr
            .parse()
            .with_context(|| format!("`{addr}` is not an address"))?;
        if out.insert(id, addr).is_some() {
            bail!("{id} is listed twice");
        }
    }
    Ok(out)
}

/// The peers file's `bootstrap nID ADDR` lines: each prefill node's bootstrap address.
pub fn parse_bootstraps(text: &str) -> Result<BTreeMap<NodeId, SocketAddr>> {
    let mut out = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        let Some(rest) = line.strip_prefix("bootstrap ") else {
            continue;
        };
        let mut parts = rest.split_whitespace();
        let (Some(n), Some(addr), None) = (parts.next(), parts.next(), parts.next()) else {
            bail!(
                "peers line {}: expected `bootstrap nID ADDR`, got `{line}`",
                i + 1
            );
        };
        let id = node_id(n).with_context(|| format!("peers line {}", i + 1))?;
        let addr: SocketAddr = addr
            .parse()
            .with_context(|| format!("peers line {}: `{addr}` is not an address", i + 1))?;
        out.insert(id, addr);
    }
    Ok(out)
}
