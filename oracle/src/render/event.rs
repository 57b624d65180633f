//! One engine event as a sentence fragment ([`describe_event`]), the short forms of
//! page tags and times that every text form uses. It does not format whole entries
//! (that is [`crate::render::entry`]) nor findings and causal traces
//! ([`crate::render`]).

use kvsim_engine::ids::{fmt_tags, PageTag};
use kvsim_engine::trace::{TraceEvent, TransferClaim};

/// Page tags, shortened when long.
pub fn tags(t: &[PageTag]) -> String {
    fmt_tags(t, 4)
}

/// One engine event as a sentence fragment.
pub fn describe_event(ev: &TraceEvent) -> String {
    use TraceEvent::*;
    match ev {
        Routed { node, req, tenant, room, prefill, decode, prompt_len, max_new_tokens } => format!(
            "{node} routes {req} ({tenant}, prompt {prompt_len}, {max_new_tokens} new) to {room}: prefill {prefill}, decode {decode}"
        ),
        Admitted { node, room, req, side, prompt_len } => {
            format!("{node} admits {room} for {req} ({side:?}, prompt {prompt_len})")
        }
        Rejected { node, room, side, status, reason } => format!("{node} rejects {room} ({side:?}) with {status}: {reason}"),
        RejectedLegacy { node, room, prompt_len } => format!(
            "{node} rejects {room} the legacy way: prompt of {prompt_len} swapped for a 1-token placeholder, error parked in to_finish"
        ),
        Truncated { node, room, from, to } => {
            format!("{node} truncates the prompt of {room} from {from} to {to} tokens (allow_auto_truncate)")
        }
        PagesReserved { .. }
        | PagesExpectWrite { .. }
        | PagesReady { .. }
        | PagesReleased { .. }
        | Quarantined { .. }
        | QuarantineReleased { .. }
        | PagesHeld { .. }
        | PagesUnheld { .. }
        | KvWritten { .. }
        | PagesZeroed { .. } => describe_page_event(ev),
        KvSent { .. }
        | KvLanded { .. }
        | KvRefused { .. }
        | WriteCompleted { .. }
        | TransferReported { .. }
        | TransferAccepted { .. }
        | TransferRefused { .. }
        | TransferFailed { .. } => describe_transfer_event(ev),
        Running { node, room, side } => format!("{node} runs {room} ({side:?})"),
        Attend { node, room, step, query_pos, seq_len, pages } => format!(
            "{node} step {step} of {room} attends over {seq_len} tokens in [{}], query position {query_pos}",
            tags(pages)
        ),
        TagMismatch { node, room, step, tag, current, .. } => format!(
            "{node} page-tag check refuses step {step} of {room}: page {tag} is not its own (page now at {current})"
        ),
        AbortNoted { node, room, side } => format!("{node} sees the abort of {room} ({side:?})"),
        Responded { node, room, side, status } => format!("{node} answers {room} ({side:?}) with {status}"),
        RouterResponse { node, req, room, status, tokens } => {
            let room = room.map_or(String::new(), |r| format!(" ({r})"));
            format!("{node} answers the client for {req}{room}: {status}, {} tokens", tokens.len())
        }
        RoomCleared { node, room } => format!("{node} clears {room}"),
        FrontCancelled { node, room, status } => {
            format!("{node}'s worker front ends {room} on prefill's {status}")
        }
        RouterRetried {
            node,
            req,
            room,
            status,
            attempt,
        } => format!("{node} gives up {room} of {req} ({status}) and starts attempt {attempt}"),
        DrainAcked { node, room } => format!("{node} acks the drain of {room}"),
        KvReadServed { .. } | Leased { .. } | LeaseEnded { .. } => describe_pull_event(ev),
        PeerRefused { node, from, room, msg, reason } => {
            let room = room.map_or(String::new(), |r| format!(" about {r}"));
            format!("{node} refuses {msg}{room} from {from}: {reason}")
        }
        Fault { node, fault } => format!("{node} FAULT ({:?}): {fault}", fault.action()),
    }
}

/// An event of vLLM's pull (a READ served, a lease) as a sentence fragment.
fn describe_pull_event(ev: &TraceEvent) -> String {
    use TraceEvent::*;
    match ev {
        KvReadServed {
            node,
            read,
            src,
            dst,
            to,
        } => format!(
            "{node}'s NIC serves READ {read} of [{}] for {to}'s [{}]",
            tags(src),
            tags(dst)
        ),
        Leased { node, room, pages } => {
            format!("{node} keeps [{}] of {room} under a lease", tags(pages))
        }
        LeaseEnded {
            node,
            room,
            expired,
        } => match expired {
            true => format!("{node}'s lease on {room} expires: its pages are freed"),
            false => format!("{node} frees {room}'s pages on the read notification"),
        },
        _ => unreachable!("not a pull event: {}", ev.name()),
    }
}

/// A page event (reserve, write, release, quarantine, hold) as a sentence fragment.
fn describe_page_event(ev: &TraceEvent) -> String {
    use TraceEvent::*;
    match ev {
        PagesReserved { node, room, pages } => {
            format!("{node} reserves [{}] for {room}", tags(pages))
        }
        PagesExpectWrite { node, room, pages } => {
            format!("{node} expects KV writes into [{}] of {room}", tags(pages))
        }
        PagesReady { node, room, pages } => {
            format!("{node} marks [{}] of {room} ready", tags(pages))
        }
        PagesReleased {
            node,
            room,
            pages,
            how,
            held,
        } => {
            let held = still_held(held);
            format!(
                "{node} releases [{}] of {room} ({how:?}){held}",
                tags(pages)
            )
        }
        Quarantined { node, room, pages } => {
            format!("{node} quarantines [{}] of {room}", tags(pages))
        }
        QuarantineReleased {
            node,
            room,
            pages,
            acked,
            held,
        } => {
            let held = still_held(held);
            format!(
                "{node} releases quarantined [{}] of {room} on the ack for {acked}{held}",
                tags(pages)
            )
        }
        PagesHeld { node, pages } => format!("{node} holds [{}] for a send", tags(pages)),
        PagesUnheld { node, pages, freed } => {
            let freed = if freed.is_empty() {
                String::new()
            } else {
                format!(", [{}] freed", tags(freed))
            };
            format!("{node} lets go of the hold on [{}]{freed}", tags(pages))
        }
        KvWritten {
            node,
            room,
            pages,
            start,
            tokens,
            ..
        } => format!(
            "{node} writes {tokens} tokens of {room} at position {start} of [{}]",
            tags(pages)
        ),
        PagesZeroed { node, pages } => format!("{node} zeroes {} pages", pages.len()),
        _ => String::new(),
    }
}

/// A KV transfer event (send, land, complete, verify) as a sentence fragment.
fn describe_transfer_event(ev: &TraceEvent) -> String {
    use TraceEvent::*;
    match ev {
        KvSent {
            node,
            write,
            src,
            dst,
            ..
        } => {
            format!("{node} sends {write}: [{}] -> [{}]", tags(src), tags(dst))
        }
        KvLanded { node, write, dst } => format!("{node} lands {write} in [{}]", tags(dst)),
        KvRefused {
            node,
            write,
            tag,
            reason,
        } => match tag {
            Some(t) => format!("{node} refuses {write}: page {t} {reason}"),
            None => format!("{node} refuses {write}: {reason}"),
        },
        WriteCompleted { node, write, ok } => {
            format!(
                "{node} completes {write} ({})",
                if *ok { "ok" } else { "failed" }
            )
        }
        TransferReported {
            node,
            room,
            from,
            success,
        } => format!(
            "{node} hears from {from} that the transfer of {room} {}",
            if *success { "succeeded" } else { "failed" }
        ),
        TransferAccepted { node, room, claim } => {
            let TransferClaim {
                from,
                prompt_len,
                reserved_pages,
                sent_tokens,
                sent_pages,
                fully_written,
            } = claim;
            format!(
                "{node} accepts the transfer of {room} from {from}: expects {prompt_len} tokens in {reserved_pages} pages, prefill sent {sent_tokens} tokens in {sent_pages} pages, all written: {fully_written}"
            )
        }
        TransferRefused {
            node, room, reason, ..
        } => {
            format!("{node} verification refuses the transfer of {room}: {reason}")
        }
        TransferFailed { node, room, reason } => {
            format!("{node} fails the transfer of {room}: {reason}")
        }
        _ => String::new(),
    }
}

/// Nanoseconds as seconds with microsecond precision.
pub fn secs(ns: u64) -> String {
    format!(
        "{}.{:06}s",
        ns / 1_000_000_000,
        (ns % 1_000_000_000) / 1_000
    )
}

/// `, [p1@g2] still held: draining` for pages another path still holds, else nothing.
fn still_held(held: &[PageTag]) -> String {
    if held.is_empty() {
        String::new()
    } else {
        format!(", [{}] still held: draining", tags(held))
    }
}
