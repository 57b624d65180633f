//! The environment's book: the clients, the notes of the `sometimes` properties, the
//! faults used so far and the invariants found broken, with its hand-written hash.
//!
//! Not the nodes, the network or the timers: those are [`crate::model_state::State`]'s
//! own fields; the book is the part most transitions leave as it is, so states share it.

use kvsim_engine::env::Timer;
use kvsim_engine::ids::{NodeId, RequestId, RoomKey};
use kvsim_engine::msg::Status;
use smallvec::SmallVec;
use std::hash::{Hash, Hasher};

/// One client. `group` names its [`crate::spec::ClientSpec`]: clients with identical
/// specs share a group and are interchangeable (the symmetry reduction sorts them).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord)]
pub struct Client {
    pub group: u8,
    /// The request id it got when it submitted (ids follow submission order).
    pub req: Option<RequestId>,
    pub cancelled: bool,
    /// The first terminal answer it received.
    pub reply: Option<Status>,
}

/// What the environment remembers about a room use for its `sometimes` properties
/// (the oracle keeps its own facts, in [`State::oracle`](crate::model_state::State::oracle)).
pub mod note {
    /// Decode's drain-retry timer fired while the room was quarantined (cleared when
    /// the quarantine ends, so it mirrors the node's own retry count).
    pub const DRAIN_RETRIED: u8 = 4;
}

/// Faults injected so far.
#[derive(Clone, Copy, Debug, Default, Hash, PartialEq, Eq)]
pub struct FaultsUsed {
    pub losses: u8,
    pub duplicates: u8,
    pub write_failures: u8,
    pub early_timeouts: u8,
    pub overtakes: u8,
    pub crashes: u8,
    /// Crashes of a node that held a request (or a quarantine) at the time.
    pub busy_crashes: u8,
    pub data_faults: u8,
    pub timer_refires: u8,
    pub pauses: u8,
    /// A timeout fired at one node while another was frozen (0 or 1).
    pub frozen_timeouts: u8,
    /// The node frozen now (a pause; `NodeId.0 + 1`, 0: none).
    pub frozen: u8,
    /// The node that woke last and has handled no message since (`NodeId.0 + 1`, 0:
    /// none): its timers fell due while it was frozen, so they may fire before its
    /// queued inputs without counting as early.
    pub overdue: u8,
    /// Start pairs sent for a live room use by another party.
    pub colliding_rooms: u8,
}

impl FaultsUsed {
    /// The frozen node, if any.
    pub fn frozen_node(&self) -> Option<NodeId> {
        self.frozen.checked_sub(1).map(|n| NodeId(u16::from(n)))
    }

    /// Is `node`'s timer due although other work is under way (it woke overdue)?
    pub fn is_overdue(&self, node: NodeId) -> bool {
        self.overdue.checked_sub(1).map(u16::from) == Some(node.0)
    }

    /// The environment has injected at least one fault of any kind.
    pub fn any(&self) -> bool {
        // Every count starts at zero: any fault is a count that moved.
        *self != FaultsUsed::default()
    }
}

/// What the environment remembers besides the nodes and the network: the clients,
/// the notes of its `sometimes` properties, the faults used and the invariants the
/// oracle found broken. Most transitions leave it as it is, so a state shares it with its
/// successors ([`Shared`](kvsim_oracle::shared::Shared)) until one changes it; its lists are inline, so that copy
/// is a single allocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Book {
    pub clients: SmallVec<[Client; 4]>,
    /// Environment notes per room use (see [`note`]).
    pub notes: SmallVec<[(RoomKey, u8); 4]>,
    pub faults: FaultsUsed,
    /// Invariants some transition broke (bit `Invariant as u16`). Always empty on a
    /// correct engine, so it splits no states there.
    pub violations: u16,
    /// Invariants whose hazard a defense stopped, in a model whose spec has
    /// `detections_hold` (otherwise such a finding is in `violations`).
    pub detected: u16,
    /// A client was answered with an error nothing explains (see
    /// `names::CAUSED`): judged when the answer is given. Always false on a correct
    /// engine, so it splits no states there.
    pub uncaused: bool,
    /// Timers that fired or were cancelled and may be delivered again (sorted):
    /// tracked only while the model's `timer_refires` budget is not spent, so a model
    /// without that fault has it empty.
    pub spent: SmallVec<[(NodeId, Timer); 4]>,
}

/// Written by hand: packing the small fields into a few words makes hashing a few
/// dozen hasher calls. It hashes exactly the fields `Eq` compares.
impl Hash for Book {
    fn hash<H: Hasher>(&self, h: &mut H) {
        // The lengths, so that no two different splits of the lists hash alike.
        h.write_u64(self.clients.len() as u64 | (self.notes.len() as u64) << 32);
        for c in &self.clients {
            h.write_u64(
                u64::from(c.group)
                    | u64::from(c.cancelled) << 8
                    | u64::from(c.req.is_some()) << 9
                    | u64::from(c.reply.is_some()) << 10
                    | u64::from(c.reply.map_or(0, |s| s.0)) << 16,
            );
            h.write_u64(c.req.map_or(0, |r| r.0));
        }
        for (k, flags) in &self.notes {
            h.write_u64(u64::from(k.room.0) << 8 | u64::from(*flags));
            h.write_u64(k.gen.0);
        }
        let f = &self.faults;
        h.write_u64(
            u64::from(f.losses)
                | u64::from(f.duplicates) << 8
                | u64::from(f.write_failures) << 16
                | u64::from(f.early_timeouts) << 24
                | u64::from(f.overtakes) << 32
                | u64::from(self.violations) << 40
                | u64::from(f.crashes) << 56
                | u64::from(f.busy_crashes) << 60,
        );
        h.write_u64(
            u64::from(f.data_faults)
                | u64::from(f.timer_refires) << 8
                | u64::from(self.detected) << 16
                | (self.spent.len() as u64) << 32
                | u64::from(self.uncaused) << 48
                | u64::from(f.pauses & 0x3) << 52
                | u64::from(f.frozen_timeouts & 0x3) << 54
                | u64::from(f.frozen & 0xf) << 56
                | u64::from(f.overdue & 0xf) << 60,
        );
        // Hashed only when used, so a model without collisions hashes as before.
        if f.colliding_rooms != 0 {
            h.write_u64(u64::from(f.colliding_rooms));
        }
        for (node, t) in &self.spent {
            let (a, b) = timer_words(*node, *t);
            h.write_u64(a);
            h.write_u64(b);
        }
    }
}

/// A timer in one word plus its room's generation: node, kind, a drain retry's arming
/// (its low 8 bits), room number.
pub(super) fn timer_words(node: NodeId, t: Timer) -> (u64, u64) {
    let (kind, key, arming) = t.parts();
    let kind = u64::from(kind);
    (
        u64::from(node.0) << 48
            | kind << 40
            | u64::from(arming & 0xff) << 32
            | u64::from(key.room.0),
        key.gen.0,
    )
}
