//! A half at the node: handed to the engine front with the engine's own message as
//! from the router ([`start`]), its answer awaited within a bound ([`bounded`]), and the words for a
//! half that failed without the engine's reason. Not what a prefill or decode half
//! does around it.

use crate::http::pending::{CancelGuard, Job, Pending};
use crate::node::event::NodeEvent;
use crate::node::reply::{Reply, ReplyEv, ReplySink};
use crate::sync::atomic::Ordering;
use crate::sync::Arc;
use crate::worker::state::Worker;
use kvsim_engine::ids::RoomKey;
use kvsim_engine::msg::Msg;
use std::time::Duration;
use tokio::sync::mpsc;

pub(super) fn engine_error(status: u16, side: &str) -> String {
    match status {
        400 => format!("the {side} half refused the request (the prompt does not fit)"),
        503 => format!("the {side} half has no capacity now (queue full or intake closed)"),
        504 => format!(
            "the {side} half was not paired in time (no decode node registered its \
             bootstrap_room, or no request for it came)"
        ),
        st => format!("the {side} half failed the request (status {st})"),
    }
}

/// Hand the engine front a half (it pairs it, then starts it at the node); the
/// guard aborts it when dropped armed. `refused`: the worker refuses it
/// (`--worker-fail-first`), answered 503 by the front. `prefill_epoch`: vLLM's
/// decode half's prefill incarnation, as its handshake named it.
pub(super) fn start<K: Send + 'static>(
    w: &Arc<Worker<K>>,
    key: RoomKey,
    msg: Msg,
    job: &Job,
    (refused, prefill_epoch): (bool, Option<u32>),
) -> Result<Pending, String> {
    let (tx, rx) = mpsc::unbounded_channel();
    let prompt_len = job.ids.len();
    let sink = ReplySink::new(move |ev: ReplyEv| tx.send(ev).is_ok());
    let sent = w.p.node.send(NodeEvent::StartHalf {
        room: key,
        msg,
        max_new_tokens: job.max_new_tokens,
        reply: sink,
        refused,
        prefill_epoch,
    });
    if sent.is_err() {
        return Err("the node is shutting down".into());
    }
    let (node, w2) = (w.p.node.clone(), w.clone());
    Ok(Pending {
        req: key.gen.0,
        prompt_len,
        rx,
        params: None,
        guard: CancelGuard::new(move || {
            w2.counters.disconnects.fetch_add(1, Ordering::Relaxed);
            let _ = node.send(NodeEvent::AbortHalf { room: key });
        }),
    })
}

/// The bound on a half's answer: the engine's request bound twice over.
fn answer_bound<K>(w: &Worker<K>) -> Duration {
    Duration::from_nanos(w.p.cfg.timeouts.request_ns.max(1_000_000) * 2)
}

/// Wait for the half's terminal answer within [`answer_bound`]; past it the half is
/// aborted (its guard) and `None` returned.
pub(super) async fn bounded<K>(
    w: &Worker<K>,
    pending: &mut Pending,
    tokens: &mut Vec<u32>,
) -> Option<Reply> {
    tokio::time::timeout(answer_bound(w), pending.done_with(tokens))
        .await
        .unwrap_or_default()
}
