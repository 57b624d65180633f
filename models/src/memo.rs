//! Memoized node transitions: each distinct (node state, input) pair is computed by
//! the engine once per thread, however many global states it occurs in.
//!
//! A model state is three nodes plus the environment, and an action feeds one input to
//! one node. Interleavings make the same node-local step recur: in the diamond "deliver
//! m to prefill, then n to decode" against "n to decode, then m to prefill", decode
//! handles n in the very same state both ways, and with faults in play most generated
//! successors are such repeats (stateright generates about three successors per
//! unique state on the standard models). The engine's handlers are pure functions of
//! (node, input): no clock, no randomness, no globals (the engine's determinism rule,
//! enforced by `engine/clippy.toml`), and the model resets the outbox's clock to 0
//! before every call. So the effect of a step can be cached and reused: the new node
//! (shared, not copied) and what it sent, set and traced, in the order it did.
//! The model still applies those effects and runs every oracle check on every
//! transition; only the node-local computation is shared.
//!
//! The cache is direct-mapped and per thread (stateright's checker threads never
//! contend on it), holds at most [`SLOTS`] entries per node kind, and is keyed by
//! the model instance as well as the node and the input: `Cfg` compares equal across
//! configurations (it is hashed as the nodes' identity, not their settings), so
//! entries from a model with other bug switches must never be reused.
//!
//! Invariant: an entry's `effect` is exactly what `handle(before.clone(), input)`
//! produces. `HandoffModel::with_memo_check` recomputes every hit and panics on a
//! difference; the crate's tests run the reduced models that way.

use crate::model_state::Envelope;
use kvsim_engine::decode::DecodeNode;
use kvsim_engine::env::{Effect as Step, Input, Outbox};
use kvsim_engine::gpu::{SymbolicGpu, SymbolicPage};
use kvsim_engine::ids::NodeId;
use kvsim_engine::msg::{Carried, KvWrite, Msg};
use kvsim_engine::node::Node;
use kvsim_engine::router::Router;
use kvsim_oracle::shared::{hash_of, Shared};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::hash::Hash;
use std::sync::{Arc, Mutex};
use std::thread::LocalKey;

/// Entries per node kind and thread (a power of two).
pub const SLOTS: usize = 1 << 15;

/// A node the model drives: the engine's handler, and the world's landing of a KV
/// write at it ([`kvsim_engine::world::receive`]).
pub trait Machine: Clone + Hash + Eq + Sized + 'static {
    fn step(&mut self, input: Input, out: &mut Outbox<SymbolicPage>);
    fn receive(
        &mut self,
        from: NodeId,
        write: KvWrite<SymbolicPage>,
        out: &mut Outbox<SymbolicPage>,
    );
    /// This kind's cache on the current thread.
    fn memo() -> &'static LocalKey<RefCell<Memo<Self>>>;
}

/// Where a send goes once the model applies it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Routed {
    /// A response to a client (client traffic is not faulted: it arrives at once).
    Client(Msg),
    /// A message put in flight, prebuilt and prehashed.
    Peer(Shared<Envelope>),
}

/// What one input did to one node: its new state and its effects, in the order the
/// handler issued them, with sends pre-routed.
#[derive(Debug, PartialEq, Eq)]
pub struct Effect<N> {
    pub after: Shared<N>,
    pub effects: Vec<Step<Routed>>,
}

/// What a node handles, as the cache knows it: a delivered message keeps the
/// envelope it travelled in (shared, its digest already computed), so a cache hit
/// neither copies nor rehashes the message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cause {
    /// The message in this envelope reaches its destination.
    Delivered(Shared<Envelope>),
    /// A client's message or a fired timer.
    Input(Input),
}

impl Cause {
    fn digest(&self) -> u64 {
        match self {
            Cause::Delivered(e) => e.digest(),
            Cause::Input(i) => hash_of(i),
        }
    }

    /// Carry it out on `node`: a message or a timer through the node's handler, a KV
    /// write through the world's landing ([`kvsim_engine::world::receive`]).
    pub fn apply<N: Machine>(&self, node: &mut N, out: &mut Outbox<SymbolicPage>) {
        match self {
            Cause::Delivered(e) => {
                let from = e.get().from;
                match &e.get().msg {
                    Carried::Msg(msg) => node.step(
                        Input::Message {
                            from,
                            msg: msg.clone(),
                        },
                        out,
                    ),
                    Carried::Write(w) => node.receive(from, w.clone(), out),
                }
            }
            Cause::Input(i) => node.step(i.clone(), out),
        }
    }
}

struct Slot<N> {
    model: u64,
    key: u64,
    before: Shared<N>,
    cause: Cause,
    effect: Arc<Effect<N>>,
}

/// One thread's cache for one node kind.
pub struct Memo<N> {
    slots: Vec<Option<Slot<N>>>,
    /// The node states computed steps produced, direct-mapped by digest: a step whose
    /// node comes out equal to one produced before gets that one's allocation, so the
    /// states holding either compare by pointer in a later look-up instead of by value
    /// (a node is several ordered maps; comparing two equal ones walks them all).
    nodes: Vec<Option<(u64, Shared<N>)>>,
    /// The same for the envelopes those steps sent: a delivery's look-up compares its
    /// envelope with the cached one, and so does the network's merge of a retransmission.
    envelopes: Vec<Option<(u64, Shared<Envelope>)>>,
}

impl<N> Memo<N> {
    pub fn new() -> Self {
        Memo {
            slots: (0..SLOTS).map(|_| None).collect(),
            nodes: (0..SLOTS).map(|_| None).collect(),
            envelopes: (0..SLOTS).map(|_| None).collect(),
        }
    }

    /// Drop every entry (and the nodes they keep alive).
    pub fn clear(&mut self) {
        self.slots.iter_mut().for_each(|s| *s = None);
        self.nodes.iter_mut().for_each(|s| *s = None);
        self.envelopes.iter_mut().for_each(|s| *s = None);
    }
}

impl<N: Hash + Eq> Memo<N> {
    /// The step's node and envelopes, each replaced by an equal one this thread's
    /// steps produced before where there is one (same values, so the same state; only
    /// the allocations are shared). Keyed by the model as the entries are: a node
    /// compares equal to one of a model with other settings (see the module's notes).
    fn intern(&mut self, model: u64, effect: &mut Effect<N>) {
        effect.after = intern(&mut self.nodes, model, effect.after.clone());
        for e in &mut effect.effects {
            if let Step::Send {
                msg: Routed::Peer(env),
                ..
            }
            | Step::Write {
                write: Routed::Peer(env),
                ..
            } = e
            {
                *env = intern(&mut self.envelopes, model, env.clone());
            }
        }
    }
}

/// `value`, or an equal value of the same model that `table` holds (direct-mapped
/// by digest); `table` keeps the one returned.
fn intern<T: Hash + Eq>(
    table: &mut [Option<(u64, Shared<T>)>],
    model: u64,
    value: Shared<T>,
) -> Shared<T> {
    let i = (value.digest() as usize) & (table.len() - 1);
    match &table[i] {
        Some((m, known)) if *m == model && *known == value => known.clone(),
        _ => {
            table[i] = Some((model, value.clone()));
            value
        }
    }
}

impl<N> Default for Memo<N> {
    fn default() -> Self {
        Self::new()
    }
}

/// How many node transitions a model's check reused and computed, over all threads.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoStats {
    pub reused: u64,
    pub computed: u64,
}

/// Totals per model, from threads that moved on to another model or exited.
static TOTALS: Mutex<BTreeMap<u64, MemoStats>> = Mutex::new(BTreeMap::new());

/// One thread's running tally for the model it is checking.
struct Tally {
    model: u64,
    stats: MemoStats,
}

impl Tally {
    fn flush(&mut self) {
        if self.stats != MemoStats::default() {
            let mut totals = TOTALS.lock().unwrap_or_else(|e| e.into_inner());
            let t = totals.entry(self.model).or_default();
            t.reused += self.stats.reused;
            t.computed += self.stats.computed;
            self.stats = MemoStats::default();
        }
    }

    fn count(&mut self, model: u64, reused: bool) {
        if model != self.model {
            self.flush();
            self.model = model;
        }
        if reused {
            self.stats.reused += 1;
        } else {
            self.stats.computed += 1;
        }
    }
}

/// A checker thread's tally reaches the totals when the thread ends.
impl Drop for Tally {
    fn drop(&mut self) {
        self.flush();
    }
}

/// What the checks of `model` reused and computed so far, on every thread that has
/// exited or moved on to another model, plus the calling thread. Call it after the
/// checker's threads are joined.
pub fn stats(model: u64) -> MemoStats {
    TALLY.with(|t| {
        let mut t = t.borrow_mut();
        if t.model == model {
            t.flush();
        }
    });
    TOTALS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&model)
        .copied()
        .unwrap_or_default()
}

/// Count one transition of `model` on this thread.
pub fn tally(model: u64, reused: bool) {
    TALLY.with(|t| t.borrow_mut().count(model, reused));
}

thread_local! {
    static TALLY: RefCell<Tally> = const {
        RefCell::new(Tally {
            model: 0,
            stats: MemoStats {
                reused: 0,
                computed: 0,
            },
        })
    };
    static ROUTER_MEMO: RefCell<Memo<Router>> = RefCell::new(Memo::new());
    static PREFILL_MEMO: RefCell<Memo<Node<SymbolicGpu>>> = RefCell::new(Memo::new());
    static DECODE_MEMO: RefCell<Memo<DecodeNode<SymbolicGpu>>> = RefCell::new(Memo::new());
}

/// The three node kinds step the same way: the engine's handler, then the node's own
/// checks; each has its own cache.
macro_rules! machine {
    ($node:ty, $memo:ident) => {
        impl Machine for $node {
            fn step(&mut self, input: Input, out: &mut Outbox<SymbolicPage>) {
                kvsim_engine::world::step(self, input, out);
            }
            fn receive(
                &mut self,
                from: NodeId,
                write: KvWrite<SymbolicPage>,
                out: &mut Outbox<SymbolicPage>,
            ) {
                kvsim_engine::world::receive::<SymbolicGpu, _, _>(self, from, write, out);
            }
            fn memo() -> &'static LocalKey<RefCell<Memo<Self>>> {
                &$memo
            }
        }
    };
}

machine!(Router, ROUTER_MEMO);
machine!(Node<SymbolicGpu>, PREFILL_MEMO);
machine!(DecodeNode<SymbolicGpu>, DECODE_MEMO);

/// Run the engine: node `id` in state `before` takes `cause`.
pub fn compute<N: Machine>(id: NodeId, before: &Shared<N>, cause: &Cause) -> Effect<N> {
    let mut out = Outbox::new(0);
    let mut after = before.clone();
    after.update(|n| cause.apply(n, &mut out));
    let effects = out
        .effects
        .drain(..)
        .map(|e| match e {
            // A `Response` is the router's answer to a client, the only message a
            // client gets and one no node sends a peer (`router/flow.rs`, `respond`).
            Step::Send { to, msg } => Step::Send {
                to,
                msg: if matches!(msg, Msg::Response { .. }) {
                    Routed::Client(msg)
                } else {
                    Routed::Peer(Shared::new(Envelope {
                        from: id,
                        to,
                        msg: Carried::Msg(msg),
                    }))
                },
            },
            Step::Write { to, write } => Step::Write {
                to,
                write: Routed::Peer(Shared::new(Envelope {
                    from: id,
                    to,
                    msg: Carried::Write(write),
                })),
            },
            Step::Timer(op) => Step::Timer(op),
            Step::Trace(ev) => Step::Trace(ev),
            Step::Stream {
                to,
                req,
                index,
                token,
            } => Step::Stream {
                to,
                req,
                index,
                token,
            },
            // world::step carried it out, in this same transition.
            Step::Compute(job) => unreachable!("a compute left unrun: {job:?}"),
        })
        .collect();
    Effect { after, effects }
}

/// The effect of `input` on node `id` in state `before`, from this thread's cache when
/// the same model met the same step before. With `verify`, a hit is recomputed and
/// must equal the cached effect.
pub fn transition<N: Machine>(
    model: u64,
    id: NodeId,
    before: &Shared<N>,
    cause: Cause,
    verify: bool,
) -> Arc<Effect<N>> {
    let key = before.digest() ^ cause.digest().rotate_left(29) ^ model.rotate_left(47);
    let i = (key as usize) & (SLOTS - 1);
    let hit = N::memo().with(|m| match &m.borrow().slots[i] {
        Some(s) if s.model == model && s.key == key && s.before == *before && s.cause == cause => {
            Some(Arc::clone(&s.effect))
        }
        _ => None,
    });
    tally(model, hit.is_some());
    if let Some(effect) = hit {
        if verify {
            let fresh = compute(id, before, &cause);
            assert!(
                fresh == *effect,
                "memoized transition of {id} differs from the engine's: the handler is not a pure function of (node, input)"
            );
        }
        return effect;
    }
    let mut computed = compute(id, before, &cause);
    N::memo().with(|m| {
        let mut m = m.borrow_mut();
        m.intern(model, &mut computed);
        let effect = Arc::new(computed);
        m.slots[i] = Some(Slot {
            model,
            key,
            before: before.clone(),
            cause,
            effect: Arc::clone(&effect),
        });
        effect
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::ModelSpec;
    use kvsim_engine::env::Timer;
    use kvsim_engine::Cfg;

    /// The router of the small handoff model, as its initial state holds it.
    fn router() -> Shared<Router> {
        let cfg = Cfg::new(ModelSpec::handoff_small().engine);
        Shared::new(Router::new(
            NodeId(0),
            cfg,
            vec![NodeId(1)],
            vec![NodeId(2)],
        ))
    }

    /// The second identical step is answered from the cache, and a different input
    /// or node state is not.
    #[test]
    fn an_identical_step_is_reused_and_a_different_one_is_not() {
        let before = router();
        let input = |r: u32| {
            Cause::Input(Input::Timer(Timer::Request(
                kvsim_engine::ids::RoomKey::new(r, 1),
            )))
        };
        let a = transition(900, NodeId(0), &before, input(1), false);
        let b = transition(900, NodeId(0), &before, input(1), false);
        assert!(Arc::ptr_eq(&a, &b));
        let c = transition(900, NodeId(0), &before, input(2), false);
        let d = transition(901, NodeId(0), &before, input(1), false);
        assert!(!Arc::ptr_eq(&a, &c) && !Arc::ptr_eq(&a, &d));
        assert_eq!(
            stats(900),
            MemoStats {
                reused: 1,
                computed: 2
            }
        );
        assert_eq!(
            stats(901),
            MemoStats {
                reused: 0,
                computed: 1
            }
        );
    }

    /// Two steps whose nodes come out equal share one allocation, so a later look-up
    /// keyed by either compares by pointer; a model with other settings (whose nodes
    /// compare equal to these) gets its own.
    #[test]
    fn equal_nodes_from_different_steps_share_one_allocation_per_model() {
        let before = router();
        let stray = |r: u32| {
            Cause::Input(Input::Timer(Timer::Request(
                kvsim_engine::ids::RoomKey::new(r, 7),
            )))
        };
        let a = transition(903, NodeId(0), &before, stray(11), false);
        let b = transition(903, NodeId(0), &before, stray(12), false);
        assert!(!Arc::ptr_eq(&a, &b), "two different steps, two entries");
        assert_eq!(
            a.after, b.after,
            "a stray timer leaves the router as it was"
        );
        assert!(a.after.same(&b.after));
        let other = transition(904, NodeId(0), &before, stray(11), false);
        assert_eq!(other.after, a.after);
        assert!(
            !other.after.same(&a.after),
            "no node crosses between models"
        );
    }

    /// `verify` catches a cached effect that is not what the engine computes.
    #[test]
    #[should_panic(expected = "differs from the engine's")]
    fn verify_catches_a_wrong_cached_effect() {
        let before = router();
        let input = Cause::Input(Input::Timer(Timer::Compute));
        let good = transition(902, NodeId(0), &before, input.clone(), true);
        Router::memo().with(|m| {
            let mut m = m.borrow_mut();
            let slot = m
                .slots
                .iter_mut()
                .flatten()
                .find(|s| s.model == 902)
                .expect("the step was cached");
            slot.effect = Arc::new(Effect {
                after: good.after.clone(),
                effects: vec![Step::Timer(kvsim_engine::env::TimerOp::Cancel {
                    timer: Timer::Compute,
                })],
            });
        });
        transition(902, NodeId(0), &before, input, true);
    }
}
