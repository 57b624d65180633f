//! A decode node's side: its KV memory registered with an agent of its own, the
//! metadata frame its links send first, and the thread that pulls its notifications.

use super::agent::{make, Dram};
use super::writer::Note;
use crate::kvpath::NixlMeta;
use crate::node::event::NodeEvent;
use crate::sync::atomic::{AtomicBool, Ordering};
use crate::sync::mpsc::Sender;
use crate::sync::thread;
use crate::sync::Arc;
use crate::wire::nixl_frame;
use kvsim_engine::gpu::HostMemory;
use kvsim_engine::ids::NodeId;
use nixl_sys::{Agent, NotificationMap, RegistrationHandle};
use std::time::Duration;

/// How long the notification thread sleeps when it found none.
const IDLE_POLL: Duration = Duration::from_micros(200);

/// A decode node's NIXL agent with its KV memory registered; the registrations end
/// (and the agent goes) when the last holder drops it.
pub struct NixlReceiver {
    pub(super) meta: NixlMeta,
    // Dropped in this order: the registrations, the agent, then the memory they named.
    _regs: Vec<RegistrationHandle>,
    _agent: Agent,
    _owner: Box<dyn std::any::Any + Send + Sync>,
}

impl NixlReceiver {
    /// Register `memory` (decode node `node`'s pages and tags, which `owner` keeps
    /// alive: it lives as long as the registrations) with a new agent and start
    /// pulling its notifications into `to_loop` until `stop`.
    pub fn start<K: Send + 'static>(
        node: NodeId,
        (owner, memory): (Box<dyn std::any::Any + Send + Sync>, HostMemory),
        to_loop: Sender<NodeEvent<K>>,
        stop: Arc<AtomicBool>,
    ) -> Result<Arc<Self>, String> {
        let name = format!("kvsim-{node}-p{}", std::process::id());
        let agent = make(&name, true)?;
        let mut regs = Vec::new();
        for region in [memory.data, memory.tags] {
            let reg = agent
                .register_memory(&Dram(region), None)
                .map_err(|e| format!("nixl: registering {} bytes: {e}", region.len))?;
            regs.push(reg);
        }
        let md = agent
            .get_local_md()
            .map_err(|e| format!("nixl: the agent's metadata: {e}"))?;
        let meta = NixlMeta {
            node,
            agent: name,
            md,
            memory,
        };
        let pull = agent.clone();
        thread::Builder::new()
            .name(format!("{node}-nixl-notes"))
            .spawn(move || pull_notes(&pull, &to_loop, &stop))
            .map_err(|e| format!("nixl: the notification thread: {e}"))?;
        Ok(Arc::new(NixlReceiver {
            meta,
            _regs: regs,
            _agent: agent,
            _owner: owner,
        }))
    }

    /// The frame each of the node's links writes first.
    pub fn hello(&self) -> Result<Vec<u8>, String> {
        nixl_frame(&self.meta).map_err(|e| format!("nixl: the metadata frame: {e}"))
    }
}

/// Pull the agent's notifications until `stop` or the loop is gone: each one, in the
/// order its sender posted it, to the loop. A notification whose sender's agent is
/// not the node it names is refused (stderr), as the peer rule refuses a message.
fn pull_notes<K>(agent: &Agent, to_loop: &Sender<NodeEvent<K>>, stop: &AtomicBool) {
    let Ok(mut map) = NotificationMap::new() else {
        eprintln!("kvsim serve: nixl: cannot make a notification map");
        return;
    };
    while !stop.load(Ordering::Relaxed) {
        let got = agent
            .get_notifications(&mut map, None)
            .and_then(|()| map.take_notifs());
        let notes = match got {
            Ok(n) if !n.is_empty() => n,
            Ok(_) => {
                thread::sleep(IDLE_POLL);
                continue;
            }
            Err(e) => {
                eprintln!("kvsim serve: nixl: pulling notifications: {e}");
                thread::sleep(IDLE_POLL);
                continue;
            }
        };
        // Each sender's notifications in its order; senders in name order.
        let mut senders: Vec<_> = notes.into_iter().collect();
        senders.sort_by(|a, b| a.0.cmp(&b.0));
        for (sender, texts) in senders {
            for text in texts {
                if let Some(ev) = event_of(&sender, &text) {
                    if to_loop.send(ev).is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// The loop's event for notification `text` of agent `sender`.
fn event_of<K>(sender: &str, text: &str) -> Option<NodeEvent<K>> {
    let note: Note = match serde_json::from_str(text) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("kvsim serve: nixl: a notification of {sender} does not parse: {e}");
            return None;
        }
    };
    let from = note.from();
    if !sender.starts_with(&format!("kvsim-{from}-")) {
        eprintln!("kvsim serve: nixl: agent {sender} sent a notification as {from}: refused");
        return None;
    }
    match note {
        // What decode's software sees of a write: its notification, after the bytes
        // landed. A one-sided receiver runs nothing for it (the world's record of the
        // landing is the writer's, at the transfer's completion).
        Note::Landed { .. } => None,
        Note::Msg { from, msg } => Some(NodeEvent::Msg { from, msg }),
    }
}
