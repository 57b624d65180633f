//! Adversarial peers: the router, prefill and decode nodes are fed arbitrary sequences
//! of honest steps (submits, cancels, deliveries in any order, drops, duplicates,
//! failed writes, timers, crashes) interleaved with forged peer input: messages for
//! rooms that never existed, for stale and future generations of real rooms, from
//! wrong and unknown senders, with out-of-range pages and chunk numbers, duplicated
//! and reordered completions.
//!
//! Checked, through the harness's public API only:
//! - no input panics a node (a panic fails the property);
//! - every node's local invariants hold after every single input;
//! - when the forging stops and the world quiesces (every message delivered, every
//!   pending timer fired until none is left), every request has had its answer or
//!   been forgotten, and no page of any pool is left taken: no page leaked.
//!
//! Not a test of which answer a request gets (a forged message may legitimately fail
//! a request), nor of the oracle's invariants (the simulator's sweeps do that).

mod common;
use common::{cfg, H};
use kvsim_engine::gpu::SymbolicPage;
use kvsim_engine::harness::Harness;
use kvsim_engine::ids::{
    Generation, NodeId, PageId, PageTag, RequestId, RoomId, RoomKey, TenantId, WriteId,
};
use kvsim_engine::kv::PageState;
use kvsim_engine::msg::{Carried, KvWrite, Msg, Status, TransferOutcome};
use kvsim_engine::world::{Topology, Transport};
use kvsim_engine::{Timer, Token};
use proptest::prelude::*;

/// Router n0, prefills n1 n2, decodes n3 n4, client n5: a wrong but real peer exists
/// for every role.
fn h2() -> H {
    Harness::with_topology(
        cfg(),
        Topology {
            prefill_pools: vec![8, 8],
            decode_pools: vec![8, 8],
        },
    )
    .expect("a valid topology")
}

const NODES: u16 = 5;
const CLIENT: NodeId = NodeId(5);
/// An endpoint that is neither a node nor the client.
const STRANGER: NodeId = NodeId(9);

/// Which room a forged message names.
#[derive(Clone, Debug)]
enum RoomSel {
    /// The i-th room use seen so far (mod their number), with its generation moved:
    /// 0 the same, -1 the previous (stale), +1 the next (future), `u64::MAX`.
    Seen(usize, i8),
    /// A room that may never have existed.
    Raw(u32, u64),
}

/// Which page a forged page tag names.
#[derive(Clone, Debug)]
enum PageSel {
    /// Page `p` of the receiver with its current generation (a tag that looks valid).
    Current(u32),
    /// Page `p` (in range or not) with an arbitrary generation.
    Raw(u32, u64),
}

#[derive(Clone, Debug)]
enum Forged {
    PrefillStart(RoomSel, u8, u16),
    DecodeStart(RoomSel, u8, u8, u16),
    Abort(RoomSel),
    KvMeta(RoomSel, Vec<PageSel>, u64),
    DrainRequest(RoomSel),
    WriteDone(u16, u32, RoomSel, u32, bool),
    KvWrite(u16, u32, RoomSel, u32, Vec<PageSel>, Vec<PageSel>, Vec<u8>),
    KvDone(RoomSel, Option<(u64, u32, u64)>),
    DrainAck(RoomSel),
    PrefillFinished(RoomSel, u16),
    TokenOut(RoomSel, u32, u32),
    DecodeFinished(RoomSel, u16),
    Submit(u64, u8, u32),
    Cancel(u64),
    Response(u64),
}

#[derive(Clone, Debug)]
enum Op {
    Submit(u64, u8, u8),
    Cancel(u64),
    Deliver(usize),
    Drop(usize),
    Duplicate(usize),
    FailWrite(usize),
    Fire(u16, usize),
    Crash(u16),
    /// A forged message from `from` to node `to`, delivered at once.
    Forge(u16, u16, Forged),
    /// Duplicate a completion (WriteDone or KvDone) in flight and deliver the copy.
    ReplayCompletion(usize),
}

fn room_sel() -> impl Strategy<Value = RoomSel> {
    prop_oneof![
        3 => (any::<usize>(), prop_oneof![Just(0i8), Just(-1), Just(1), Just(i8::MAX)])
            .prop_map(|(i, d)| RoomSel::Seen(i, d)),
        1 => (
            prop_oneof![0u32..12, Just(u32::MAX)],
            prop_oneof![0u64..4, Just(u64::MAX)]
        )
            .prop_map(|(r, g)| RoomSel::Raw(r, g)),
    ]
}

fn page_sel() -> impl Strategy<Value = PageSel> {
    prop_oneof![
        2 => (0u32..8).prop_map(PageSel::Current),
        1 => (prop_oneof![0u32..12, Just(u32::MAX)], prop_oneof![0u64..4, Just(u64::MAX)])
            .prop_map(|(p, g)| PageSel::Raw(p, g)),
    ]
}

fn pages() -> impl Strategy<Value = Vec<PageSel>> {
    prop::collection::vec(page_sel(), 0..5)
}

fn chunk() -> impl Strategy<Value = u32> {
    prop_oneof![0u32..6, Just(u32::MAX)]
}

fn forged() -> impl Strategy<Value = Forged> {
    prop_oneof![
        (room_sel(), 0u8..40, 0u16..10).prop_map(|(r, l, d)| Forged::PrefillStart(r, l, d)),
        (room_sel(), 0u8..40, 0u8..12, 0u16..10)
            .prop_map(|(r, l, n, p)| Forged::DecodeStart(r, l, n, p)),
        room_sel().prop_map(Forged::Abort),
        (room_sel(), pages(), prop_oneof![0u64..40, Just(u64::MAX)])
            .prop_map(|(r, p, l)| Forged::KvMeta(r, p, l)),
        room_sel().prop_map(Forged::DrainRequest),
        (0u16..10, 0u32..3, room_sel(), chunk(), any::<bool>())
            .prop_map(|(w, e, r, c, ok)| Forged::WriteDone(w, e, r, c, ok)),
        (
            0u16..10,
            0u32..3,
            room_sel(),
            chunk(),
            pages(),
            pages(),
            prop::collection::vec(0u8..6, 0..5)
        )
            .prop_map(|(w, e, r, c, s, d, kv)| Forged::KvWrite(w, e, r, c, s, d, kv)),
        (
            room_sel(),
            prop::option::of((0u64..40, 0u32..12, any::<u64>()))
        )
            .prop_map(|(r, o)| Forged::KvDone(r, o)),
        room_sel().prop_map(Forged::DrainAck),
        (
            room_sel(),
            prop_oneof![Just(200u16), Just(499), Just(500), Just(503)]
        )
            .prop_map(|(r, s)| Forged::PrefillFinished(r, s)),
        (
            room_sel(),
            prop_oneof![0u32..12, Just(u32::MAX)],
            any::<u32>()
        )
            .prop_map(|(r, i, t)| Forged::TokenOut(r, i, t)),
        (
            room_sel(),
            prop_oneof![Just(200u16), Just(499), Just(500), Just(503)]
        )
            .prop_map(|(r, s)| Forged::DecodeFinished(r, s)),
        (1u64..6, 0u8..40, 0u32..12).prop_map(|(q, l, n)| Forged::Submit(q, l, n)),
        (1u64..6).prop_map(Forged::Cancel),
        (1u64..6).prop_map(Forged::Response),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1u64..5, 1u8..40, 1u8..6).prop_map(|(q, l, n)| Op::Submit(q, l, n)),
        1 => (1u64..5).prop_map(Op::Cancel),
        // Any message in flight, not only the oldest: deliveries are reordered.
        12 => any::<usize>().prop_map(Op::Deliver),
        1 => any::<usize>().prop_map(Op::Drop),
        1 => any::<usize>().prop_map(Op::Duplicate),
        1 => any::<usize>().prop_map(Op::FailWrite),
        4 => (0u16..NODES, any::<usize>()).prop_map(|(n, i)| Op::Fire(n, i)),
        1 => (1u16..NODES).prop_map(Op::Crash),
        6 => (
            prop_oneof![0u16..6, Just(STRANGER.0)],
            0u16..NODES,
            forged()
        )
            .prop_map(|(f, t, m)| Op::Forge(f, t, m)),
        2 => any::<usize>().prop_map(Op::ReplayCompletion),
    ]
}

/// The test's running knowledge: every room use any node has named in a send.
struct Seen(Vec<RoomKey>);

impl Seen {
    fn update(&mut self, h: &H) {
        for s in h.sends() {
            if let Some(r) = s.msg.room() {
                if !self.0.contains(&r) {
                    self.0.push(r);
                }
            }
        }
    }

    fn room(&self, sel: &RoomSel) -> RoomKey {
        match *sel {
            RoomSel::Raw(r, g) => RoomKey {
                room: RoomId(r),
                gen: Generation(g),
            },
            RoomSel::Seen(i, d) => {
                let Some(base) = self.0.get(i % self.0.len().max(1)).copied() else {
                    return RoomKey::new(0, 0);
                };
                let gen = match d {
                    0 => base.gen.0,
                    -1 => base.gen.0.saturating_sub(1),
                    1 => base.gen.0.saturating_add(1),
                    _ => u64::MAX,
                };
                RoomKey {
                    room: base.room,
                    gen: Generation(gen),
                }
            }
        }
    }
}

fn tags(h: &H, at: NodeId, sels: &[PageSel]) -> Vec<PageTag> {
    let records = h.pages(at);
    sels.iter()
        .map(|s| match *s {
            PageSel::Current(p) => PageTag {
                page: PageId(p),
                gen: records
                    .iter()
                    .find(|(id, _)| id.0 == p)
                    .map_or(Generation(0), |(_, r)| r.gen),
            },
            PageSel::Raw(p, g) => PageTag {
                page: PageId(p),
                gen: Generation(g),
            },
        })
        .collect()
}

fn prompt(len: u8) -> Vec<Token> {
    (0..u32::from(len)).map(|i| 100 + i).collect()
}

fn message(h: &H, seen: &Seen, to: NodeId, f: &Forged) -> Carried<SymbolicPage> {
    let room = |s: &RoomSel| seen.room(s);
    Carried::Msg(match f {
        Forged::PrefillStart(r, len, d) => Msg::PrefillStart {
            room: room(r),
            req: RequestId(1),
            prompt: prompt(*len),
            decode: NodeId(*d),
        },
        Forged::DecodeStart(r, len, new, p) => Msg::DecodeStart {
            room: room(r),
            req: RequestId(1),
            prompt: prompt(*len),
            max_new_tokens: u32::from(*new),
            prefill: NodeId(*p),
        },
        Forged::Abort(r) => Msg::Abort { room: room(r) },
        Forged::KvMeta(r, p, len) => Msg::KvMeta {
            room: room(r),
            dst: tags(h, to, p),
            prompt_len: *len,
        },
        Forged::DrainRequest(r) => Msg::DrainRequest { room: room(r) },
        Forged::WriteDone(w, e, r, c, ok) => Msg::WriteDone {
            id: WriteId {
                writer: NodeId(*w),
                epoch: *e,
                room: room(r),
                chunk: *c,
            },
            ok: *ok,
        },
        Forged::KvWrite(w, e, r, c, src, dst, kv) => {
            return Carried::Write(KvWrite {
                id: WriteId {
                    writer: NodeId(*w),
                    epoch: *e,
                    room: room(r),
                    chunk: *c,
                },
                src: tags(h, NodeId(*w), src),
                dst: tags(h, to, dst),
                kv: kv
                    .iter()
                    .map(|&n| SymbolicPage {
                        tokens: (0..u32::from(n)).map(|i| 7 + i).collect(),
                        tag: None,
                    })
                    .collect(),
            })
        }
        Forged::KvDone(r, o) => Msg::KvDone {
            room: room(r),
            outcome: match *o {
                None => TransferOutcome::Failed,
                Some((tokens, pages, checksum)) => TransferOutcome::Success {
                    tokens,
                    pages,
                    checksum,
                },
            },
            epoch: 0,
        },
        Forged::DrainAck(r) => Msg::DrainAck { room: room(r) },
        Forged::PrefillFinished(r, s) => Msg::PrefillFinished {
            room: room(r),
            status: Status(*s),
            why: None,
        },
        Forged::TokenOut(r, i, t) => Msg::TokenOut {
            room: room(r),
            index: *i,
            token: *t,
        },
        Forged::DecodeFinished(r, s) => Msg::DecodeFinished {
            room: room(r),
            status: Status(*s),
            why: None,
        },
        Forged::Submit(q, len, n) => Msg::Submit {
            req: RequestId(*q),
            tenant: TenantId(0),
            prompt: prompt(*len),
            max_new_tokens: *n,
        },
        Forged::Cancel(q) => Msg::Cancel { req: RequestId(*q) },
        Forged::Response(q) => Msg::Response {
            req: RequestId(*q),
            status: Status::OK,
            tokens: vec![1],
            why: None,
        },
    })
}

/// The router is the authority on the topology: a node knows only its router, and
/// believes the prefill or decode node a start from the router names (the room's
/// peer). A start the router sends therefore names a node of the right role; what
/// the router may still get wrong (rooms, generations, prompts, duplicates) stays
/// arbitrary. (A decode node told by its router that its prefill is some other
/// endpoint quarantines an aborted room's pages until that endpoint acks the drain,
/// which is forever: quarantine is released only by the writer's ack, by design.)
fn trust_router_topology(msg: &mut Carried<SymbolicPage>) {
    let Carried::Msg(msg) = msg else { return };
    match msg {
        Msg::PrefillStart { decode, .. } => *decode = NodeId(3 + decode.0 % 2),
        Msg::DecodeStart { prefill, .. } => *prefill = NodeId(1 + prefill.0 % 2),
        _ => {}
    }
}

fn transport(h: &H, i: usize) -> Transport {
    h.transport(&h.in_flight()[i])
}

/// Carry out one step. Steps the harness cannot carry out (no such message in flight,
/// no such timer) are skipped: they are the test's, not the engine's.
fn apply(h: &mut H, seen: &mut Seen, op: &Op) {
    let len = h.in_flight().len();
    match op {
        Op::Submit(q, l, n) => {
            let _ = h.submit(*q, prompt(*l), u32::from(*n));
        }
        Op::Cancel(q) => {
            let _ = h.cancel(*q);
        }
        Op::Deliver(i) if len > 0 => {
            let _ = h.deliver(i % len);
        }
        // The world loses and duplicates control messages only: a KV write lands once
        // or fails back with one completion, and a completion is never lost
        // (`world::Transport`). Duplicated completions are forged below.
        Op::Drop(i) if len > 0 && transport(h, i % len) == Transport::Control => {
            let _ = h.drop_flight(i % len);
        }
        Op::Duplicate(i) if len > 0 && transport(h, i % len) == Transport::Control => {
            let _ = h.duplicate(i % len);
        }
        Op::FailWrite(i) if len > 0 => {
            let _ = h.fail_write(i % len);
        }
        Op::Fire(n, i) => {
            let node = NodeId(*n);
            let timers = h.timers_of(node);
            if !timers.is_empty() {
                let _ = h.fire(node, timers[i % timers.len()]);
            }
        }
        Op::Crash(n) => {
            let _ = h.crash_restart(NodeId(*n));
        }
        Op::Forge(from, to, f) => {
            let to = NodeId(*to);
            let mut msg = message(h, seen, to, f);
            if *from == 0 {
                trust_router_topology(&mut msg);
            }
            let _ = h.inject(NodeId(*from), to, msg);
        }
        Op::ReplayCompletion(i) => {
            let done: Vec<usize> = h
                .in_flight()
                .iter()
                .enumerate()
                .filter(|(_, f)| {
                    matches!(
                        f.msg,
                        Carried::Msg(Msg::WriteDone { .. } | Msg::KvDone { .. })
                    )
                })
                .map(|(k, _)| k)
                .collect();
            if !done.is_empty() {
                if let Ok(copy) = h.duplicate(done[i % done.len()]) {
                    let _ = h.deliver(copy);
                }
            }
        }
        _ => {}
    }
    seen.update(h);
}

/// Deliver every message in flight, oldest first, and fire `Compute` timers, until
/// neither is left ([`Harness::settle`]); a message addressed to an endpoint that is
/// no node (an answer to a forger posing as one) goes nowhere and is dropped.
fn settle(h: &mut H) -> Result<(), String> {
    for _ in 0..200 {
        let stray = h.in_flight().iter().position(|f| f.to.0 >= NODES);
        match stray {
            Some(i) => {
                h.drop_flight(i).map_err(|e| e.to_string())?;
            }
            None => match h.settle(20_000) {
                Ok(_) => return Ok(()),
                Err(kvsim_engine::harness::HarnessError::NoSuchNode(_)) => {}
                Err(e) => return Err(e.to_string()),
            },
        }
    }
    Err("not settled after 200 rounds".into())
}

/// Deliver everything and fire every pending timer until nothing is pending (at most
/// `rounds` rounds of timers); Err names what is still pending.
fn quiesce(h: &mut H, rounds: usize) -> Result<(), String> {
    for _ in 0..rounds {
        settle(h)?;
        let pending: Vec<(NodeId, Timer)> = (0..NODES)
            .map(NodeId)
            .flat_map(|n| h.timers_of(n).into_iter().map(move |t| (n, t)))
            .collect();
        if pending.is_empty() {
            return Ok(());
        }
        for (n, t) in pending {
            if h.timer_pending(n, t) {
                h.fire(n, t).map_err(|e| e.to_string())?;
            }
            h.invariants()
                .map_err(|v| format!("after firing {t:?} at {n}: {v}"))?;
        }
    }
    let pending: Vec<String> = (0..NODES)
        .map(NodeId)
        .flat_map(|n| {
            h.timers_of(n)
                .into_iter()
                .map(move |t| format!("{n}:{t:?}"))
        })
        .collect();
    Err(format!(
        "still pending after {rounds} rounds of timers: {pending:?}"
    ))
}

/// Every page of every pool that is not free, as `node page state owner`.
fn taken(h: &H) -> Vec<String> {
    (1..NODES)
        .map(NodeId)
        .flat_map(|n| {
            h.pages(n)
                .into_iter()
                .filter(|(_, r)| r.state != PageState::Free)
                .map(move |(p, r)| format!("{n} {p} {:?} {:?}", r.state, r.owner))
        })
        .collect()
}

/// Run `ops`, then quiesce; the property's checks. Returns a description of the first
/// failure.
fn run(ops: &[Op]) -> Result<(), String> {
    let mut h = h2();
    let mut seen = Seen(Vec::new());
    for (i, op) in ops.iter().enumerate() {
        apply(&mut h, &mut seen, op);
        h.invariants()
            .map_err(|v| format!("after step {i} {op:?}: invariant: {v}"))?;
    }
    // The forging stops; the crashes stop. Every partition is healed (none is made).
    quiesce(&mut h, 40)?;
    let leaked = taken(&h);
    if !leaked.is_empty() {
        return Err(format!("pages taken at quiescence: {leaked:?}"));
    }
    let router = h.router().ok_or("no router")?;
    if router.live_rooms() != 0 {
        return Err(format!(
            "the router still holds {} room(s) at quiescence",
            router.live_rooms()
        ));
    }
    for n in (1..NODES).map(NodeId) {
        if let Some(p) = h.prefill(n) {
            if p.requests() != 0 {
                return Err(format!("{n} still holds {} request(s)", p.requests()));
            }
        }
        if let Some(d) = h.decode(n) {
            if d.requests() != 0 || d.quarantined_rooms() != 0 {
                return Err(format!(
                    "{n} still holds {} request(s), {} quarantined room(s)",
                    d.requests(),
                    d.quarantined_rooms()
                ));
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        max_shrink_iters: 4096,
        ..ProptestConfig::default()
    })]

    #[test]
    fn forged_peer_input_never_panics_breaks_invariants_or_leaks(
        ops in prop::collection::vec(op(), 1..80)
    ) {
        if let Err(e) = run(&ops) {
            prop_assert!(false, "{e}");
        }
    }
}

/// The property can fail: a run that leaves a request mid-transfer and never lets
/// the world quiesce is caught by the same checks (pages taken, rooms held).
#[test]
fn the_leak_check_sees_pages_taken_mid_run() {
    let mut h = h2();
    let _ = h.submit(1, prompt(10), 3);
    let mut seen = Seen(Vec::new());
    for _ in 0..3 {
        apply(&mut h, &mut seen, &Op::Deliver(0));
    }
    assert!(!taken(&h).is_empty(), "a request in progress holds pages");
    assert_eq!(h.router().map(|r| r.live_rooms()), Some(1));
    assert!(!seen.0.is_empty(), "the room use was seen in a send");
}

/// The client endpoint's id in this topology is the one the forgeries use.
#[test]
fn topology_ids_are_the_ones_forged() {
    let h = h2();
    assert_eq!(h.client(), CLIENT);
    assert_eq!(h.prefills(), vec![NodeId(1), NodeId(2)]);
    assert_eq!(h.decodes(), vec![NodeId(3), NodeId(4)]);
}
