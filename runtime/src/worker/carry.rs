//! The worker API as the carrier of the engine front's messages to the other half's
//! front (SGLang worker mode's pairing, `kvsim_engine::worker`): decode's `Register`
//! is a `POST /kvsim/bootstrap` to its prefill node's bootstrap endpoint, whose HTTP
//! answer is prefill's `Registered` (or its word that its half ended); prefill's
//! `Registered` and `PrefillDone` answer the registration waiting for them, and a
//! later `PrefillDone` is a `POST /kvsim/prefill_done` to decode's URL. A
//! registration that cannot be carried (prefill's bootstrap unreachable or refusing)
//! is prefill's word of a 502 (an upstream half failed at the HTTP level). Nothing
//! here decides anything of the pairing.

use crate::node::event::NodeEvent;
use crate::sync::mpsc::{channel, Receiver};
use crate::sync::Arc;
use crate::worker::state::Worker;
use kvsim_engine::ids::{NodeId, RoomKey};
use kvsim_engine::msg::{Msg, Status, Why};
use serde_json::{json, Value};
use std::time::Duration;

/// Link the node's front to a carrier thread of its own (`NodeEvent::FrontLink`).
pub(super) fn spawn_carrier<K: Send + 'static>(w: &Arc<Worker<K>>) -> std::io::Result<()> {
    let (tx, rx) = channel::<(NodeId, Msg)>();
    // A loop already stopped carries nothing: its front sends nothing either.
    let _ = w.p.node.send(NodeEvent::FrontLink(tx));
    let w = w.clone();
    crate::sync::thread::Builder::new()
        .name(format!("{}-front-carrier", w.p.id))
        .spawn(move || carry(&w, rx))?;
    Ok(())
}

/// Carry each of the front's messages, in order (a registration on a thread of its
/// own: it waits for prefill's answer).
fn carry<K: Send + 'static>(w: &Arc<Worker<K>>, rx: Receiver<(NodeId, Msg)>) {
    let a = crate::http_client::agent(Duration::from_secs(2));
    for (to, msg) in rx {
        match msg {
            Msg::Register { room } => {
                let w = w.clone();
                let _ = crate::sync::thread::Builder::new()
                    .name(format!("{}-register", w.p.id))
                    .spawn(move || register_at(&w, to, room));
            }
            Msg::Registered { room, epoch } => {
                answer(w, room, json!({"ok": true, "epoch": epoch}));
            }
            Msg::PrefillDone { room, status, why } => {
                let v = json!({"ok": false, "prefill_status": status.0, "why": why});
                if !answer(w, room, v) {
                    tell_decode(w, &a, to, (room, status, why));
                }
            }
            _ => {}
        }
    }
}

/// Prefill: answer the registration of `room` waiting at the bootstrap endpoint with
/// `v`; false when none waits (the answer was given already).
fn answer<K>(w: &Worker<K>, room: RoomKey, v: Value) -> bool {
    let waiting = w
        .pending
        .lock()
        .ok()
        .and_then(|mut m| m.remove(&room.gen.0));
    waiting.is_some_and(|tx| tx.send(v).is_ok())
}

/// Prefill: tell decode node `to` (at the URL its registration named) that prefill's
/// half of `room` ended; a decode node that cannot be reached is told nothing (its
/// room then stays open in the audit, which is what is known).
fn tell_decode<K>(
    w: &Worker<K>,
    a: &ureq::Agent,
    to: NodeId,
    (room, status, why): (RoomKey, Status, Option<Why>),
) {
    let Some(url) = w.decode_urls.lock().ok().and_then(|m| m.get(&to).cloned()) else {
        return;
    };
    let reason = why.map(|w| w.to_string());
    let body = json!({"room": room.gen.0, "status": status.0, "reason": reason, "why": why,
                      "prefill": w.p.id.0});
    let body = body.to_string();
    let _ = crate::http_client::fetch_with(
        a,
        &url,
        "POST",
        "/kvsim/prefill_done",
        Some(body.as_bytes()),
    );
}

/// Decode: register `room` at prefill node `prefill`'s bootstrap, naming this node
/// and its URL; the answer goes to the front as prefill's message.
fn register_at<K>(w: &Worker<K>, prefill: NodeId, room: RoomKey) {
    let msg = match bootstrap_answer(w, prefill, room) {
        Ok(msg) => msg,
        Err(()) => Msg::PrefillDone {
            room,
            status: Status::BAD_GATEWAY,
            why: None,
        },
    };
    let _ = w.p.node.send(NodeEvent::FrontPeer { from: prefill, msg });
}

/// Prefill's bootstrap's answer to the registration of `room`, as its message.
fn bootstrap_answer<K>(w: &Worker<K>, prefill: NodeId, room: RoomKey) -> Result<Msg, ()> {
    let addr =
        w.p.prefills
            .iter()
            .find(|(_, n)| **n == prefill)
            .map(|(a, _)| *a);
    let url = format!("http://{}", addr.ok_or(())?);
    let body = json!({"room": room.gen.0, "decode": w.p.id.0, "notify": w.p.url}).to_string();
    let a = crate::http_client::agent(Duration::from_secs(5));
    let rep =
        crate::http_client::fetch_with(&a, &url, "POST", "/kvsim/bootstrap", Some(body.as_bytes()))
            .map_err(|_| ())?;
    if rep.status != 200 {
        return Err(());
    }
    let v: Value = serde_json::from_slice(&rep.body).map_err(|_| ())?;
    if let Some(epoch) = v["epoch"].as_u64().and_then(|e| u32::try_from(e).ok()) {
        return Ok(Msg::Registered { room, epoch });
    }
    let status = v["prefill_status"]
        .as_u64()
        .and_then(|s| u16::try_from(s).ok())
        .ok_or(())?;
    let why = serde_json::from_value(v["why"].clone()).ok().flatten();
    Ok(Msg::PrefillDone {
        room,
        status: Status(status),
        why,
    })
}
