//! A checked request ([`Job`]) submitted to the router's loop ([`submit`]) and its
//! answers as they come ([`Pending`], or a streaming body, [`EventBody`]), cancelled
//! when its client goes away ([`CancelGuard`]). Not how a request is checked nor how
//! its answer is rendered.

use crate::http::state::Shared;
use crate::node::event::NodeEvent;
use crate::node::reply::{Reply, ReplyEv, ReplySink};
use crate::sync::atomic::Ordering;
use crate::sync::Arc;
use hyper::body::{Body, Bytes, Frame};
use kvsim_engine::ids::{PageTag, RequestId, TenantId};
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::sync::mpsc;

/// A checked request for the engine.
#[derive(Clone, Debug)]
pub struct Job {
    pub ids: Vec<u32>,
    pub max_new_tokens: u32,
    pub stream: bool,
}

/// Runs its action when dropped armed: hyper drops a request's future, or its
/// streaming body, when the client closes the connection, and the action cancels
/// the request where it runs.
pub struct CancelGuard(Option<Box<dyn FnOnce() + Send>>);

impl CancelGuard {
    pub fn new(on_drop: impl FnOnce() + Send + 'static) -> Self {
        CancelGuard(Some(Box::new(on_drop)))
    }

    /// The request was answered: nothing to cancel.
    pub fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }
}

/// A request submitted to a node's loop: its id, its answers, its guard.
pub struct Pending {
    pub req: u64,
    pub prompt_len: usize,
    pub rx: mpsc::UnboundedReceiver<ReplyEv>,
    pub guard: CancelGuard,
    /// vLLM's prefill half: its reply's `kv_transfer_params`, once they came.
    pub params: Option<(Vec<PageTag>, u64)>,
}

impl Pending {
    /// Wait for the terminal answer (`None`: the server is shutting down); the tokens
    /// streamed before it are in `tokens`, by index.
    pub async fn done_with(&mut self, tokens: &mut Vec<u32>) -> Option<Reply> {
        while let Some(ev) = self.rx.recv().await {
            match ev {
                ReplyEv::Token { index, token } => {
                    if index as usize == tokens.len() {
                        tokens.push(token);
                    }
                }
                ReplyEv::Params { src, tokens } => self.params = Some((src, tokens)),
                ReplyEv::Done(r) => {
                    self.guard.disarm();
                    return Some(r);
                }
            }
        }
        self.guard.disarm();
        None
    }

    /// Wait for the terminal answer (`None`: the server is shutting down).
    pub async fn done(&mut self) -> Option<Reply> {
        self.done_with(&mut Vec::new()).await
    }
}

/// Submit `job` to the router's loop.
pub fn submit<K: Send + 'static>(sh: &Arc<Shared<K>>, job: &Job) -> Result<Pending, String> {
    let id = sh.next.fetch_add(1, Ordering::Relaxed);
    let prompt = if sh.canary {
        if id as usize >= kvsim_oracle::canary::MAX_REQUESTS {
            return Err("request limit reached: canary prompts name at most 65535 requests".into());
        }
        if let Ok(mut p) = sh.prompts.lock() {
            p.keep(id, &job.ids);
        }
        kvsim_oracle::canary::prompt(RequestId(id), job.ids.len() as u64)
    } else {
        job.ids.clone()
    };
    let (tx, rx) = mpsc::unbounded_channel();
    // A reply that is not streamed needs only its terminal answer (it has every
    // token): each token passed on would wake the request's task for nothing.
    let stream = job.stream;
    let sink = ReplySink::new(move |ev| match ev {
        ReplyEv::Token { .. } if !stream => !tx.is_closed(),
        ev => tx.send(ev).is_ok(),
    });
    let sent = sh.router.send(NodeEvent::Submit {
        req: RequestId(id),
        tenant: TenantId(0),
        prompt,
        max_new_tokens: job.max_new_tokens,
        reply: sink,
    });
    if sent.is_err() {
        return Err("server is shutting down".into());
    }
    let sh2 = sh.clone();
    Ok(Pending {
        req: id,
        prompt_len: job.ids.len(),
        rx,
        params: None,
        guard: CancelGuard::new(move || {
            sh2.counters.disconnects.fetch_add(1, Ordering::Relaxed);
            let _ = sh2.router.send(NodeEvent::Cancel { req: RequestId(id) });
        }),
    })
}

/// A streaming body: each answer event rendered as bytes as it arrives; dropping it
/// (the client went away) cancels the request through its guard.
pub struct EventBody {
    pending: Pending,
    render: Box<dyn FnMut(ReplyEv) -> Bytes + Send>,
    /// Sent when the answers end without a terminal one (shutdown).
    on_close: Option<Bytes>,
    done: bool,
}

impl EventBody {
    pub fn new(
        pending: Pending,
        render: impl FnMut(ReplyEv) -> Bytes + Send + 'static,
        on_close: Bytes,
    ) -> Self {
        EventBody {
            pending,
            render: Box::new(render),
            on_close: Some(on_close),
            done: false,
        }
    }
}

impl Body for EventBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let me = self.get_mut();
        if me.done {
            return Poll::Ready(None);
        }
        match me.pending.rx.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(ev)) => {
                if matches!(ev, ReplyEv::Done(_)) {
                    me.pending.guard.disarm();
                    me.done = true;
                }
                Poll::Ready(Some(Ok(Frame::data((me.render)(ev)))))
            }
            Poll::Ready(None) => {
                me.pending.guard.disarm();
                me.done = true;
                Poll::Ready(me.on_close.take().map(|b| Ok(Frame::data(b))))
            }
        }
    }
}
