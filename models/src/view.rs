//! A model state as a person reads it (stateright's Explorer shows this instead of
//! the state's `Debug` dump): the clients, each room as the router, prefill and
//! decode see it, the pages each pool holds, the messages in flight and the
//! pending timers, in the trace's notation (`room1.g1`, `p2@g3`, `n1`).

use crate::model_state::{State, ROUTER};
use kvsim_engine::ids::RoomKey;
use kvsim_engine::invariant::Invariant;
use kvsim_engine::kv::{PagePool, PageState};
use kvsim_engine::Timer;
use std::fmt::Write as _;

/// The pages of a pool that are not free, one `page@gen state owner` each.
fn pages(pool: &PagePool) -> String {
    let taken: Vec<String> = pool
        .records()
        .filter(|(_, r)| r.state != PageState::Free)
        .map(|(p, r)| {
            let owner = r.owner.map_or("-".to_string(), |o| o.to_string());
            let held = if r.holders > 0 {
                format!(" held x{}", r.holders)
            } else {
                String::new()
            };
            format!("{p}@{} {:?} {owner}{held}", r.gen, r.state)
        })
        .collect();
    format!(
        "{} of {} free{}{}",
        pool.free_count(),
        pool.records().count(),
        if taken.is_empty() { "" } else { "; " },
        taken.join(", ")
    )
}

/// A timer in the trace's notation: `Compute`, `WaitingForKv room1.g1`.
fn timer(t: Timer) -> String {
    match t {
        Timer::Compute => "Compute".to_string(),
        Timer::Bootstrap(k) => format!("Bootstrap {k}"),
        Timer::WaitingForKv(k) => format!("WaitingForKv {k}"),
        Timer::DrainRetry(k, n) => format!("DrainRetry {k} #{n}"),
        Timer::Request(k) => format!("Request {k}"),
        Timer::Lease(k) => format!("Lease {k}"),
        Timer::Heartbeat(k) => format!("Heartbeat {k}"),
        Timer::Pairing(k) => format!("Pairing {k}"),
    }
}

/// Every room use the state mentions: the router's rooms of the clients' requests,
/// page owners and the rooms of messages in flight.
fn rooms(s: &State) -> Vec<RoomKey> {
    let router = s.router.get();
    let mut out: Vec<RoomKey> = s
        .book
        .get()
        .clients
        .iter()
        .filter_map(|c| c.req.and_then(|r| router.room_of(r)))
        .collect();
    for pool in s.kv_ids().filter_map(|n| s.pool(n)) {
        out.extend(pool.records().filter_map(|(_, r)| r.owner));
    }
    out.extend(s.net.iter().filter_map(|e| e.get().msg.room()));
    out.extend(s.stale.iter().filter_map(|c| c.get().env.msg.room()));
    out.sort();
    out.dedup();
    out
}

/// The state as text. `model` names the model.
pub fn state_text(model: &str, s: &State) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "model {model}");
    clients_text(&mut out, s);
    rooms_text(&mut out, s);
    nodes_text(&mut out, s);
    in_flight_text(&mut out, s);
    let f = &s.book.get().faults;
    let _ = writeln!(
        out,
        "faults used: {} lost, {} duplicated, {} write failures, {} early timeouts, {} overtakes, {} crashes",
        f.losses, f.duplicates, f.write_failures, f.early_timeouts, f.overtakes, f.crashes
    );
    let violated: Vec<String> = Invariant::ALL
        .iter()
        .filter(|i| s.violated(**i))
        .map(|i| i.to_string())
        .collect();
    if !violated.is_empty() {
        let _ = writeln!(out, "VIOLATED so far: {}", violated.join(", "));
    }
    out
}

/// Each client: submitted or not, cancelled, answered.
fn clients_text(out: &mut String, s: &State) {
    let _ = writeln!(out, "clients:");
    for (i, c) in s.book.get().clients.iter().enumerate() {
        let _ = writeln!(
            out,
            "  client {i}: {}{}{}",
            c.req.map_or("not submitted yet".to_string(), |r| format!(
                "submitted {r}"
            )),
            if c.cancelled { ", cancelled" } else { "" },
            c.reply
                .map_or(String::new(), |st| format!(", answered {st}"))
        );
    }
}

/// Each room use as the router, prefill and decode see it.
fn rooms_text(out: &mut String, s: &State) {
    let router = s.router.get();
    // The room's phase on whichever node of each kind holds it.
    let prefill = |room| {
        s.prefills
            .iter()
            .find_map(|n| n.get().prefill_phase_text(room))
    };
    let decode = |room| s.decodes.iter().find_map(|n| n.get().room_phase(room));
    let _ = writeln!(out, "rooms:");
    let keys = rooms(s);
    if keys.is_empty() {
        let _ = writeln!(out, "  none");
    }
    for room in keys {
        let at_router = router.room_state(room).map_or("-".to_string(), |r| {
            format!(
                "{} (prefill {}, decode {}{}{}{})",
                r.req,
                r.prefill,
                r.decode,
                r.prefill_status
                    .map_or(String::new(), |st| format!(", prefill said {st}")),
                r.decode_status
                    .map_or(String::new(), |st| format!(", decode said {st}")),
                if r.answered { ", client answered" } else { "" }
            )
        });
        let _ = writeln!(
            out,
            "  {room}: router {at_router}; prefill {}; decode {}",
            prefill(room).unwrap_or_else(|| "-".to_string()),
            decode(room).map_or("-".to_string(), |p| format!("{p:?}"))
        );
    }
}

/// The router's live rooms, and each node's requests and pages.
fn nodes_text(out: &mut String, s: &State) {
    let _ = writeln!(
        out,
        "router {ROUTER}: {} live rooms",
        s.router.get().live_rooms()
    );
    for (id, prefill) in s.prefill_ids().zip(&s.prefills) {
        let prefill = prefill.get();
        let _ = writeln!(
            out,
            "prefill {id}: {} requests; pages {}",
            prefill.live_requests(),
            prefill.pool().map_or_else(String::new, pages)
        );
    }
    for (id, decode) in s.decode_ids().zip(&s.decodes) {
        let decode = decode.get();
        let _ = writeln!(
            out,
            "decode {id}: {} requests, {} quarantined rooms{}; pages {}",
            decode.requests(),
            decode.quarantined_rooms(),
            decode
                .fatal()
                .map_or(String::new(), |f| format!(", STOPPED: {f}")),
            pages(decode.pool())
        );
    }
}

/// The messages in flight, the copies kept to land again, the pending timers.
fn in_flight_text(out: &mut String, s: &State) {
    let _ = writeln!(out, "in flight ({}):", s.net.len());
    for e in &s.net {
        let _ = writeln!(out, "  {}", e.get());
    }
    if !s.stale.is_empty() {
        let _ = writeln!(
            out,
            "kept to land again as stale duplicates ({}):",
            s.stale.len()
        );
        for c in &s.stale {
            let _ = writeln!(out, "  {}", c.get());
        }
    }
    let timers: Vec<String> = s
        .timers
        .iter()
        .map(|(n, t)| format!("{n} {}", timer(t)))
        .collect();
    let _ = writeln!(
        out,
        "timers: {}",
        if timers.is_empty() {
            "none".to_string()
        } else {
            timers.join(", ")
        }
    );
}
