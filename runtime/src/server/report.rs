//! What a server's nodes report: each loop's status, asked for over its channel
//! ([`statuses`]), and the report a server makes as it ends ([`ExitReport`]). Not
//! what a node counts ([`NodeStatus`]).

use crate::node::event::NodeEvent;
use crate::node::status::NodeStatus;
use crate::sync::mpsc::{channel, Sender};
use serde::Serialize;
use std::time::Duration;

/// Ask every loop for its status (one that does not answer within a second is left
/// out).
pub(super) fn statuses<K>(txs: &[Sender<NodeEvent<K>>]) -> Vec<NodeStatus> {
    txs.iter()
        .filter_map(|tx| {
            let (stx, srx) = channel();
            tx.send(NodeEvent::Status(stx)).ok()?;
            srx.recv_timeout(Duration::from_secs(1)).ok()
        })
        .collect()
}

/// What a server reports as it ends.
#[derive(Clone, Debug, Serialize)]
pub struct ExitReport {
    /// Every node quiesced (nothing in flight, every pool page free) before the end.
    pub drained: bool,
    pub nodes: Vec<NodeStatus>,
}

impl ExitReport {
    pub fn render(&self) -> String {
        let mut s = format!(
            "kvsim serve: {}\n",
            if self.drained {
                "drained; pages each pool holds at exit:"
            } else {
                "did NOT drain in time; pages each pool holds at exit:"
            }
        );
        for n in &self.nodes {
            let pool = match (n.free_pages, n.pool_pages) {
                (Some(f), Some(c)) => format!("{f} of {c} pages free, {} held", c - f),
                _ => "no pool".into(),
            };
            s.push_str(&format!(
                "  {} {:?} (epoch {}): {pool}; {} live, {} quarantined{}\n",
                n.node,
                n.role,
                n.epoch,
                n.live,
                n.quarantined,
                n.fault
                    .as_deref()
                    .map(|f| format!("; FAULT: {f}"))
                    .unwrap_or_default()
            ));
        }
        s
    }
}
