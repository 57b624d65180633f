//! What a client's request hears from a node's loop: its answer ([`Reply`]), the
//! events it arrives in ([`ReplyEv`]) and where they go ([`ReplySink`]). Not how a loop
//! decides what to answer (the loop, [`crate::node`]) nor how a front renders it.

use crate::sync::mpsc::Sender;
use kvsim_engine::ids::PageTag;
use kvsim_engine::msg::Why;
use serde::Serialize;

/// A reply to a client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Reply {
    pub req: u64,
    pub status: u16,
    pub tokens: Vec<u32>,
    /// The engine's reason for a status that is not 200, where it gave one: through
    /// the engine's router, the typed reason the refusing node sent with its status
    /// (`msg::Why`, carried by the router's `Response`); in worker mode, where the node
    /// that refused is the one answering, the text of its own refusal or failure event
    /// (the same words for a refusal at intake, more detail for a failed transfer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The engine's typed reason behind `reason`, where the node that answers gave one
    /// (a worker-mode prefill half tells decode's worker it; not on the wire).
    #[serde(skip)]
    pub why: Option<Why>,
}

/// What a client's request hears from the router's loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReplyEv {
    /// A token decode produced (index `index` of the reply), as it was produced.
    Token { index: u32, token: u32 },
    /// vLLM's prefill half: its reply's `kv_transfer_params` (the pages it holds under
    /// its lease for decode's READ, and the prompt's tokens), before its answer.
    Params { src: Vec<PageTag>, tokens: u64 },
    /// The request's one terminal answer.
    Done(Reply),
}

/// Where a request's answers go: called with each [`ReplyEv`]; it returns `false` once
/// its client is gone.
pub struct ReplySink(Box<dyn FnMut(ReplyEv) -> bool + Send>);

impl ReplySink {
    pub fn new(f: impl FnMut(ReplyEv) -> bool + Send + 'static) -> Self {
        ReplySink(Box::new(f))
    }

    /// Answers go to a std channel (its receiver gets each [`ReplyEv`]).
    pub fn channel(tx: Sender<ReplyEv>) -> Self {
        ReplySink::new(move |ev| tx.send(ev).is_ok())
    }

    pub fn send(&mut self, ev: ReplyEv) -> bool {
        (self.0)(ev)
    }
}

impl std::fmt::Debug for ReplySink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReplySink")
    }
}
