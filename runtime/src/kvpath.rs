//! A KV path beside the TCP links: what a transport that moves KV bytes outside the
//! node's connections (NIXL, `--transport nixl`, [`crate::nixl`] under the `nixl`
//! feature) plugs into the runtime, with no feature of its own here. The links still
//! carry every control message; the path takes the KV writes (and, where the
//! transport orders it behind them, the message that concludes a transfer), and the
//! writer side learns each decode node's registered memory from the [`NixlMeta`]
//! frame that precedes the node's page lists on its connection.

use kvsim_engine::gpu::HostMemory;
use kvsim_engine::ids::{NodeId, RoomKey};
use kvsim_engine::msg::Carried;
use serde::{Deserialize, Serialize};

/// A decode node's NIXL agent and registered KV memory, as its writers need them:
/// sent first on each of its connections (so ahead of every page list it sends on
/// it), bound by the reader to each page list that follows ([`RemoteBook`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NixlMeta {
    /// The decode node.
    pub node: NodeId,
    /// Its agent's name (unique per process: a restarted process is a new agent).
    pub agent: String,
    /// The agent's metadata blob (`nixlAgent::getLocalMD`: its backend's connection
    /// information and its registrations), for the writer's `loadRemoteMD`.
    pub md: Vec<u8>,
    /// Where the pages and their tags lie in the registered regions: each page's
    /// descriptors (address, length) are computed from it.
    pub memory: HostMemory,
}

/// What a KV path did with a message handed to it.
pub enum Carry<K> {
    /// It carries it.
    Taken,
    /// It cannot reach `to` (no metadata, a refused request): the world's rule for an
    /// undeliverable message applies (a KV write fails back).
    Undeliverable(Carried<K>),
    /// Not its kind: the link carries it.
    NotMine(Carried<K>),
}

/// A transport beside the links, as a node's runtime hands it its outgoing messages.
pub trait KvPath<K>: Send + Sync {
    fn carry(&self, to: NodeId, msg: Carried<K>) -> Carry<K>;
}

/// A writer's book of its receivers' registered memory, fed by its connections'
/// readers in the order frames arrive.
pub trait RemoteBook: Send + Sync {
    /// A decode node's metadata arrived.
    fn meta(&self, meta: NixlMeta);
    /// Decode node `from` sent the page list of `room` (after its metadata on the
    /// same connection): the room's writes go to the memory that metadata names.
    fn page_list(&self, from: NodeId, room: RoomKey);
}
