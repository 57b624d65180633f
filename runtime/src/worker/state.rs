//! What a worker front is given ([`WorkerParts`]) and keeps ([`Worker`]): the rooms
//! it was given (none taken twice, none reused at an older generation), prefill's
//! registrations waiting for the engine front's answer and its decode nodes' URLs,
//! and its counters. Not the endpoints that read and change them, nor the pairing's
//! decisions (the engine's `WorkerFront`).

use crate::http::info::FrontInfo;
use crate::http::limits::FrontLimits;
use crate::http::response::{error, Out};
use crate::http::state::{FrontCounters, NodesFn};
use crate::node::event::NodeEvent;
use crate::sync::mpsc::Sender;
use crate::sync::Mutex;
use crate::tokenizer::Vocab;
use hyper::Response;
use kvsim_engine::config::EngineConfig;
use kvsim_engine::ids::{Generation, NodeId, RoomId, RoomKey};
use kvsim_engine::node::Role;
use kvsim_engine::retired::{GenTable, RETIRED_MIN_HALF};
use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

/// What a worker front is given.
pub struct WorkerParts<K> {
    pub id: NodeId,
    /// This worker's own URL (a decode node gives it to prefill's bootstrap, where
    /// prefill says when its half of a room is done).
    pub url: String,
    pub role: Role,
    pub node: Sender<NodeEvent<K>>,
    pub nodes: NodesFn,
    pub info: FrontInfo,
    pub cfg: EngineConfig,
    /// The deployment's decode nodes (who may register at a bootstrap).
    pub decodes: Vec<NodeId>,
    /// Each prefill node's bootstrap address.
    pub prefills: BTreeMap<SocketAddr, NodeId>,
    pub limits: FrontLimits,
    /// Answer the first this many `/generate` requests 503 (prefill; a test's failing
    /// half).
    pub fail_first: u64,
    /// The incarnation this process started the node as (`--epoch`): a prefill node's
    /// bootstrap answers each registration with it, so that decode learns when the
    /// prefill process it registered a room at was killed and restarted.
    pub epoch: u32,
}

/// The rooms this node was given.
pub(super) struct Rooms {
    pub(super) live: BTreeSet<u64>,
    /// The newest generation given per engine room number, bounded by the engine's own
    /// rule for its retired rooms (the same table, the same bound: a number this front
    /// lets go of, the node's engine lets go of after as many rooms).
    pub(super) newest: GenTable<()>,
}

impl Rooms {
    pub(super) fn new(cfg: &EngineConfig) -> Self {
        Rooms {
            live: BTreeSet::new(),
            newest: GenTable::new((cfg.max_rooms as usize).max(RETIRED_MIN_HALF)),
        }
    }
}

/// The engine's room key of a router room.
pub fn room_key(r: u64) -> RoomKey {
    RoomKey::new(1 + (r % u64::from(u32::MAX)) as u32, r)
}

pub(super) struct Worker<K> {
    pub(super) p: WorkerParts<K>,
    pub(super) vocab: Mutex<Vocab>,
    pub(super) rooms: Mutex<Rooms>,
    /// Prefill: registrations at the bootstrap endpoint waiting for the front's
    /// answer (`Registered`, or prefill's word that its half ended), by router room.
    pub(super) pending: Mutex<BTreeMap<u64, tokio::sync::oneshot::Sender<serde_json::Value>>>,
    /// Prefill: each decode node's URL, as its registrations named it (where prefill's
    /// word that a half ended goes).
    pub(super) decode_urls: Mutex<BTreeMap<NodeId, String>>,
    /// Prefill: answer this many more `/generate` requests 503 without running them
    /// (`--worker-fail-first`: a half that fails, for the router's retries).
    pub(super) fail_first: crate::sync::atomic::AtomicU64,
    pub(super) counters: FrontCounters,
    pub(super) bootstrap_port: Option<u16>,
    /// A vLLM-kind prefill's side channel (its bootstrap address), named in the params.
    pub(super) bootstrap_addr: Option<std::net::SocketAddr>,
    /// A vLLM-kind prefill: the next room it gives a request (vLLM's router has none):
    /// from the incarnation up, so a restarted node's rooms are newer.
    pub(super) next_room: crate::sync::atomic::AtomicU64,
}

/// Take room `r` for a half here, or say why not (status, message).
pub(super) fn take_room<K>(w: &Worker<K>, r: u64) -> Result<(), (u16, String)> {
    let key = room_key(r);
    let mut rooms = w
        .rooms
        .lock()
        .map_err(|_| (500, "room table poisoned".into()))?;
    if rooms.live.contains(&r) {
        return Err((400, format!("bootstrap_room {r} is already in use here")));
    }
    let rooms = &mut *rooms;
    if rooms.newest.get(key.room).is_some_and(|(g, _)| g.0 >= r) {
        return Err((
            503,
            format!(
                "bootstrap_room {r}: room number {} was used here with a later generation; \
                 retry with a new room",
                key.room.0
            ),
        ));
    }
    rooms.live.insert(r);
    let live = &rooms.live;
    let held = |n: RoomId| live.iter().any(|&l| room_key(l).room == n);
    *rooms.newest.entry(key.room, || (Generation(r), ()), &held) = (Generation(r), ());
    Ok(())
}

pub(super) fn release_room<K>(w: &Worker<K>, r: u64) {
    if let Ok(mut rooms) = w.rooms.lock() {
        rooms.live.remove(&r);
    }
}

pub(super) fn count<K>(w: &Worker<K>, status: u16) {
    if let Ok(mut m) = w.counters.by_status.lock() {
        *m.entry(status).or_default() += 1;
    }
}

pub(super) fn fail<K>(w: &Worker<K>, status: u16, msg: &str) -> Response<Out> {
    count(w, status);
    error(status, msg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sync::Arc;
    use serde_json::json;

    fn worker() -> Worker<()> {
        let (node, _rx) = crate::sync::mpsc::channel();
        let info = FrontInfo {
            model_path: "m".into(),
            context_len: 1024,
            max_new_tokens_limit: 16,
            min_pool_tokens: 512,
            page_size: 16,
            server_info: json!({}),
        };
        Worker {
            p: WorkerParts {
                id: NodeId(2),
                url: String::new(),
                role: Role::Decode,
                node,
                nodes: Arc::new(Vec::new),
                info,
                cfg: EngineConfig::default(),
                decodes: vec![NodeId(2)],
                prefills: BTreeMap::new(),
                limits: FrontLimits::default(),
                fail_first: 0,
                epoch: 0,
            },
            vocab: Mutex::new(Vocab::new()),
            rooms: Mutex::new(Rooms::new(&EngineConfig::default())),
            pending: Mutex::new(BTreeMap::new()),
            decode_urls: Mutex::new(BTreeMap::new()),
            fail_first: crate::sync::atomic::AtomicU64::new(0),
            counters: FrontCounters::default(),
            bootstrap_port: None,
            bootstrap_addr: None,
            next_room: crate::sync::atomic::AtomicU64::new(1),
        }
    }

    /// Rooms from the router are not trusted: a live room is refused (400), a room
    /// number this node used with a later generation is refused for a retry (503),
    /// and distinct rooms give distinct keys.
    #[test]
    fn reused_and_stale_rooms_are_refused() {
        let w = worker();
        let big = u64::from(u32::MAX) + 5; // the same room number as 5, a later generation
        assert_eq!(room_key(5).room, room_key(big).room);
        assert_ne!(room_key(5), room_key(big));
        assert!(take_room(&w, big).is_ok());
        assert_eq!(take_room(&w, big).map_err(|e| e.0), Err(400));
        release_room(&w, big);
        assert_eq!(take_room(&w, 5).map_err(|e| e.0), Err(503));
        assert!(take_room(&w, 6).is_ok());
        assert_eq!(room_key(0).room.0, 1, "room number 0 is never used");
    }

    /// The front's table of room numbers is bounded as the engine's retired rooms are:
    /// more distinct rooms than the bound leave at most the bound, a recent number is
    /// still refused as stale, and a live room is never let go.
    #[test]
    fn the_room_table_stays_within_its_bound() {
        let w = worker();
        let live = u64::from(u32::MAX) + 9; // room number 9, kept live throughout
        assert!(take_room(&w, live).is_ok());
        let n = 3 * RETIRED_MIN_HALF as u64;
        for r in 1000..1000 + n {
            assert!(take_room(&w, r).is_ok(), "{r}");
            release_room(&w, r);
            let rooms = w.rooms.lock().unwrap();
            assert!(rooms.newest.len() <= rooms.newest.bound() + 1, "{r}");
        }
        assert_eq!(take_room(&w, live).map_err(|e| e.0), Err(400), "still live");
        assert_eq!(take_room(&w, 9).map_err(|e| e.0), Err(503), "still known");
        let last = 1000 + n - 1;
        let stale = last + u64::from(u32::MAX); // a later generation of its number
        assert!(take_room(&w, stale).is_ok());
        release_room(&w, stale);
        assert_eq!(take_room(&w, last).map_err(|e| e.0), Err(503));
    }
}
