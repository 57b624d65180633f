//! One trace entry as a line of text: [`render_entry`], the whole trace, reply tokens
//! with their canary owners, timers and fault events, and the rooms, requests and
//! pages an entry is about. It does not word single engine events (that is
//! [`crate::render::event`]) nor judge or pick entries for a finding
//! ([`crate::render`]).

use crate::render::event::{describe_event, secs};
use crate::schema::{CancelHow, Entry, FaultEvent, MsgView, Record};
use kvsim_engine::env::Timer;
use kvsim_engine::ids::{NodeId, PageId, PageTag, RequestId, RoomKey};
use kvsim_engine::trace::TraceEvent;

/// One entry as a line of text with its time and sequence number.
pub fn render_entry(e: &Entry) -> String {
    format!("[{} #{:>6}] {}", secs(e.at_ns), e.seq, e.text())
}

/// The full trace as text, one line per entry (normal sends and timer bookkeeping are
/// left to the JSON trace).
pub fn render_trace(entries: &[Entry]) -> String {
    let mut out = String::new();
    for e in entries.iter().filter(|e| e.shown_in_text()) {
        out.push_str(&render_entry(e));
        out.push('\n');
    }
    out
}

/// A reply's tokens, each canary token marked with its owner when it is not `req`.
pub fn render_tokens(req: RequestId, tokens: &[u32]) -> String {
    let parts: Vec<String> = tokens
        .iter()
        .map(|&t| match crate::canary::owner(t) {
            Some(o) if o == req => format!("{t:#x}"),
            Some(o) => format!("{t:#x}<{o}!>"),
            None => format!("{t:#x}"),
        })
        .collect();
    parts.join(" ")
}

/// A timer as a short name: `DrainRetry(room1.g8)`.
pub fn timer_name(t: &Timer) -> String {
    match t {
        Timer::Compute => "Compute".into(),
        Timer::Bootstrap(r) => format!("Bootstrap({r})"),
        Timer::WaitingForKv(r) => format!("WaitingForKv({r})"),
        Timer::DrainRetry(r, n) => format!("DrainRetry({r}, {n})"),
        Timer::Request(r) => format!("Request({r})"),
        Timer::Lease(r) => format!("Lease({r})"),
        Timer::Heartbeat(r) => format!("Heartbeat({r})"),
        Timer::Pairing(r) => format!("Pairing({r})"),
    }
}

fn timer_room(t: &Timer) -> Option<RoomKey> {
    match t {
        Timer::Bootstrap(r)
        | Timer::WaitingForKv(r)
        | Timer::DrainRetry(r, _)
        | Timer::Request(r)
        | Timer::Lease(r)
        | Timer::Heartbeat(r)
        | Timer::Pairing(r) => Some(*r),
        Timer::Compute => None,
    }
}

impl Entry {
    /// The rooms the entry is about.
    pub fn rooms(&self) -> Vec<RoomKey> {
        match &self.rec {
            Record::Send { msg, .. } | Record::Deliver { msg, .. } | Record::Drop { msg, .. } => {
                msg.room().into_iter().collect()
            }
            Record::TimerSet { timer, .. }
            | Record::TimerCancel { timer, .. }
            | Record::TimerFire { timer, .. } => timer_room(timer).into_iter().collect(),
            Record::Engine(ev) => ev.room().into_iter().collect(),
            Record::Violation { room, related, .. } => {
                room.iter().chain(related.iter()).copied().collect()
            }
            Record::WriteFailed { write, .. } => vec![write.room],
            Record::Submit { .. }
            | Record::ClientCancel { .. }
            | Record::Response { .. }
            | Record::Fault(_)
            | Record::End { .. } => Vec::new(),
        }
    }

    /// The request the entry is about, when it names one directly.
    pub fn request(&self) -> Option<RequestId> {
        match &self.rec {
            Record::Submit { req, .. }
            | Record::ClientCancel { req, .. }
            | Record::Response { req, .. } => Some(*req),
            Record::Engine(
                TraceEvent::RouterResponse { req, .. }
                | TraceEvent::Routed { req, .. }
                | TraceEvent::Admitted { req, .. },
            ) => Some(*req),
            Record::Deliver {
                msg: MsgView::Submit { req, .. } | MsgView::Cancel { req },
                ..
            } => Some(*req),
            _ => None,
        }
    }

    /// The physical pages (node, page) the entry touches.
    pub fn pages(&self) -> Vec<(NodeId, PageId)> {
        let on = |n: NodeId, t: &[PageTag]| t.iter().map(move |t| (n, t.page)).collect::<Vec<_>>();
        match &self.rec {
            Record::Deliver { from, to, msg } => match msg {
                MsgView::KvWrite { src, dst, .. } => {
                    let mut v = on(*to, dst);
                    v.extend(on(*from, src));
                    v
                }
                MsgView::KvMeta { dst, .. } => on(*from, dst),
                _ => Vec::new(),
            },
            Record::Engine(ev) => match ev {
                TraceEvent::PagesReserved { node, pages, .. }
                | TraceEvent::PagesReleased { node, pages, .. }
                | TraceEvent::Quarantined { node, pages, .. }
                | TraceEvent::QuarantineReleased { node, pages, .. }
                | TraceEvent::Attend { node, pages, .. } => on(*node, pages),
                TraceEvent::KvSent { node, src, .. } => on(*node, src),
                TraceEvent::KvLanded { node, dst, .. } => on(*node, dst),
                TraceEvent::KvRefused { node, tag, .. } => {
                    tag.iter().map(|t| (*node, t.page)).collect()
                }
                TraceEvent::TagMismatch { node, pages, .. } => on(*node, pages),
                TraceEvent::PagesExpectWrite { node, pages, .. }
                | TraceEvent::PagesReady { node, pages, .. }
                | TraceEvent::PagesHeld { node, pages }
                | TraceEvent::PagesUnheld { node, pages, .. }
                | TraceEvent::KvWritten { node, pages, .. } => on(*node, pages),
                _ => Vec::new(),
            },
            Record::Violation { pages, .. } => pages.clone(),
            _ => Vec::new(),
        }
    }

    /// The entry as one line of text (without the time prefix).
    pub fn text(&self) -> String {
        match &self.rec {
            Record::Submit {
                req,
                tenant,
                prompt_len,
                max_new_tokens,
            } => format!(
                "client submits {req} ({tenant}, prompt {prompt_len} tokens, {max_new_tokens} new)"
            ),
            Record::ClientCancel { req, how, plan } => {
                format!("client {} {req} ({plan})", cancel_verb(*how))
            }
            Record::Send { .. }
            | Record::Deliver { .. }
            | Record::Drop { .. }
            | Record::WriteFailed { .. } => self.network_text(),
            Record::TimerSet { .. } | Record::TimerCancel { .. } | Record::TimerFire { .. } => {
                self.timer_text()
            }
            Record::Engine(ev) => format!("  {}", describe_event(ev)),
            Record::Response {
                req,
                status,
                tokens,
            } => response_text(*req, *status, tokens),
            Record::Fault(f) => fault_text(f),
            Record::Violation {
                violation,
                detected_by,
                ..
            } => match detected_by {
                None => format!("!! VIOLATION {violation}"),
                Some(d) => format!("!! DETECTED (refused by {d}, nothing leaked) {violation}"),
            },
            Record::End { outcome, detail } => format!("END {outcome:?}: {detail}"),
        }
    }

    /// A message's or KV write's fate on the network, as one line.
    fn network_text(&self) -> String {
        match &self.rec {
            Record::Send {
                from,
                to,
                msg,
                deliver_at_ns,
                duplicate,
            } => format!(
                "{from} -> {to} {}{} (due {})",
                msg.summary(),
                if *duplicate { " [duplicate]" } else { "" },
                secs(*deliver_at_ns)
            ),
            Record::Deliver { from, to, msg } => format!("{to} <- {from} {}", msg.summary()),
            Record::Drop {
                from,
                to,
                msg,
                reason,
            } => format!(
                "network drops {from} -> {to} {} ({reason:?})",
                msg.summary()
            ),
            Record::WriteFailed {
                from,
                to,
                write,
                reason,
            } => format!("KV write {write} {from} -> {to} fails, not applied ({reason:?})"),
            _ => unreachable!("network_text is called for the network's records only"),
        }
    }

    /// A timer's set, cancel or firing, as one line.
    fn timer_text(&self) -> String {
        match &self.rec {
            Record::TimerSet {
                node,
                timer,
                fire_at_ns,
            } => format!(
                "{node} sets timer {} for {}",
                timer_name(timer),
                secs(*fire_at_ns)
            ),
            Record::TimerCancel { node, timer } => {
                format!("{node} cancels timer {}", timer_name(timer))
            }
            Record::TimerFire { node, timer } => {
                format!("{node} timer {} fires", timer_name(timer))
            }
            _ => unreachable!("timer_text is called for timer records only"),
        }
    }

    /// Whether the full text trace shows this entry (sends that went normally and
    /// timer bookkeeping are in the JSON trace only).
    pub fn shown_in_text(&self) -> bool {
        match &self.rec {
            Record::Send { duplicate, .. } => *duplicate,
            Record::TimerSet { .. } | Record::TimerCancel { .. } => false,
            _ => true,
        }
    }
}

/// What a client does when it cancels.
fn cancel_verb(how: CancelHow) -> &'static str {
    match how {
        CancelHow::Abort => "aborts",
        CancelHow::Disconnect => "disconnects",
    }
}

/// A reply as the client got it, its canary tokens marked by owner.
fn response_text(req: RequestId, status: kvsim_engine::msg::Status, tokens: &[u32]) -> String {
    format!(
        "client gets {req}: {status}, {} tokens{}",
        tokens.len(),
        if tokens.is_empty() {
            String::new()
        } else {
            format!(" [{}]", render_tokens(req, tokens))
        }
    )
}

/// A fault event as a line of text.
fn fault_text(f: &FaultEvent) -> String {
    match f {
        FaultEvent::PartitionStart { prefill, decode } => {
            format!("FAULT partition {prefill} | {decode} begins")
        }
        FaultEvent::PartitionEnd { prefill, decode } => {
            format!("FAULT partition {prefill} | {decode} ends")
        }
        FaultEvent::Crash {
            node,
            epoch,
            flushed,
        } => {
            let flushed = if flushed.is_empty() {
                String::new()
            } else {
                format!("; {} KV writes flushed", flushed.len())
            };
            format!("FAULT {node} crashes (incarnation {epoch} dies with its timers, queues and connections{flushed})")
        }
        FaultEvent::Restart { node, epoch } => {
            format!("FAULT {node} restarts as incarnation {epoch} (empty pool, KV memory not zeroed)")
        }
        FaultEvent::Pause { node, until_ns } => {
            format!("FAULT {node} freezes until {} (its timers and inputs wait; one-sided KV writes still land)", secs(*until_ns))
        }
        FaultEvent::DataFault {
            from,
            to,
            write,
            kind,
            meant,
            landed,
        } => match kind {
            kvsim_engine::world::DataFault::StaleDuplicate => format!(
                "FAULT a stale duplicate of KV write {write} {from}->{to} lands again: over page {meant} with its old tag {landed} (no second completion)"
            ),
            _ => format!("FAULT KV write {write} {from}->{to} lands {}: page {meant} landed as {landed}", kind.name()),
        },
        FaultEvent::Heal => {
            "FAULTS HEAL: liveness phase, everything must drain".to_string()
        }
    }
}
