//! Peer identity: a message about a room from a node that is not that room's peer is
//! refused, traced as `PeerRefused`, counted in `counters().peer_refused`, moves no
//! page, and the run still ends with the right answer afterwards.
//!
//! Two prefill and two decode nodes, so that a wrong but real peer exists: request 1
//! runs on (P1, D1), and P2, D2, the router and unknown endpoints forge messages
//! about it. Not a test of the handlers' normal paths (see the `*_handlers.rs`
//! files). Invariant checked: every forgery is refused exactly once by the node it
//! was sent to, with every pool record (and the receiver's KV memory) unchanged.

mod common;
use common::{all_pages, cfg, handled, prompt, LEN, NEW};
use kvsim_engine::decode::DecodePhase;
use kvsim_engine::gpu::SymbolicPage;
use kvsim_engine::harness::Harness;
use kvsim_engine::ids::RoomId;
use kvsim_engine::ids::{Generation, NodeId, PageId, PageTag, RequestId, RoomKey, WriteId};
use kvsim_engine::msg::{Carried, KvWrite, Msg, Status, TransferOutcome};
use kvsim_engine::trace::TraceEvent;
use kvsim_engine::world::Topology;
use kvsim_engine::{Bug, BugSet, EngineConfig, Node, Timer, Token};

type H = common::H;

const R: NodeId = NodeId(0);
const P1: NodeId = NodeId(1);
const P2: NodeId = NodeId(2);
const D1: NodeId = NodeId(3);
const D2: NodeId = NodeId(4);
/// An endpoint that is not the client endpoint (`n5`) nor a node.
const STRANGER: NodeId = NodeId(9);

fn h2() -> H {
    h2_on(cfg())
}

/// [`h2`] on a two-sided transport: the receiver's software sees each KV write, so
/// its peer rule can refuse one (on one-sided RDMA nothing at the receiver runs).
fn h2_two_sided() -> H {
    let mut cfg = cfg();
    cfg.transport = kvsim_engine::world::KvTransport::TwoSided;
    h2_on(cfg)
}

fn h2_on(cfg: kvsim_engine::EngineConfig) -> H {
    Harness::with_topology(
        cfg,
        Topology {
            prefill_pools: vec![8, 8],
            decode_pools: vec![8, 8],
        },
    )
    .unwrap()
}

/// Request 1, routed to (P1, D1); its room.
fn start(h: &mut H) -> RoomKey {
    handled(h.submit(1, prompt(LEN), NEW).unwrap());
    let room = h.room_of(1).unwrap();
    let s = h.router_room(room).unwrap();
    assert_eq!((s.prefill, s.decode), (P1, D1));
    room
}

/// The tokens request 1 gets when nothing is forged.
fn reference() -> Vec<Token> {
    let mut h = h2();
    start(&mut h);
    h.settle(200).unwrap();
    let r = h.response(1).unwrap();
    assert_eq!(r.status, Status::OK);
    r.tokens.clone()
}

/// The KV memory of a prefill or decode node, for before/after comparisons.
fn memory(h: &H, node: NodeId) -> Option<kvsim_engine::gpu::SymbolicGpu> {
    h.node(node).and_then(Node::gpu).cloned()
}

/// `act` forges one message to `at` from `from`: it must be refused there exactly
/// once, counted, and leave every page record and `at`'s KV memory as they were.
/// Returns the reason given.
fn refused(h: &mut H, at: NodeId, from: NodeId, act: impl FnOnce(&mut H)) -> String {
    let (pages, mem, count) = (all_pages(h), memory(h, at), h.peer_refused(at));
    let m = h.mark();
    act(h);
    let refusals: Vec<String> = h
        .events_since(m)
        .iter()
        .filter_map(|(n, e)| match e {
            TraceEvent::PeerRefused {
                from: f, reason, ..
            } if *n == at && *f == from => Some(reason.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(refusals.len(), 1, "{:?}", h.events_since(m));
    assert_eq!(h.peer_refused(at), count + 1);
    assert_eq!(all_pages(h), pages, "no page moved");
    assert_eq!(memory(h, at), mem, "nothing written");
    h.invariants().unwrap();
    refusals.into_iter().next().unwrap_or_default()
}

/// The run goes on to request 1's one right answer, every pool back to free.
fn completes(h: &mut H, tokens: &[Token]) {
    h.settle(200).unwrap();
    let answers: Vec<_> = h
        .responses()
        .iter()
        .filter(|r| r.req == RequestId(1))
        .collect();
    assert_eq!(answers.len(), 1);
    assert_eq!(answers[0].status, Status::OK);
    assert_eq!(answers[0].tokens, tokens);
    for n in [P1, P2, D1, D2] {
        assert_eq!(h.free_pages(n), 8, "{n}");
    }
    h.invariants().unwrap();
}

fn send(from: NodeId, to: NodeId, msg: impl Into<Carried<SymbolicPage>>) -> impl FnOnce(&mut H) {
    let msg = msg.into();
    move |h| handled(h.inject(from, to, msg).unwrap())
}

fn tag(page: u32) -> PageTag {
    PageTag {
        page: PageId(page),
        gen: Generation(1),
    }
}

// ---- decode ------------------------------------------------------------------------

#[test]
fn a_drain_ack_from_a_node_that_was_not_asked_releases_nothing() {
    let mut h = h2();
    let room = start(&mut h);
    handled(h.deliver_kind("DecodeStart", D1).unwrap());
    handled(h.cancel(1).unwrap());
    handled(h.deliver_kind("Abort", D1).unwrap());
    assert!(h.timer_pending(D1, Timer::DrainRetry(room, 0)));
    for forger in [P2, D2, R] {
        let why = refused(&mut h, D1, forger, send(forger, D1, Msg::DrainAck { room }));
        assert!(why.contains("was not asked"), "{why}");
    }
    assert!(h.timer_pending(D1, Timer::DrainRetry(room, 0)));
    // The real ack (P1 answers the drain request) releases the quarantine, and a
    // next request runs.
    h.settle(200).unwrap();
    assert_eq!(h.response(1).unwrap().status, Status::CLIENT_CLOSED);
    assert_eq!(h.free_pages(D1), 8);
    assert!(h.timers_of(D1).is_empty());
    handled(h.submit(3, prompt(LEN), NEW).unwrap());
    h.settle(200).unwrap();
    assert_eq!(h.response(3).unwrap().status, Status::OK);
}

/// Request 1 with both chunk writes in flight from P1 to D1.
fn sending(h: &mut H) -> RoomKey {
    let room = start(h);
    handled(h.deliver_kind("DecodeStart", D1).unwrap());
    handled(h.deliver_kind("PrefillStart", P1).unwrap());
    handled(h.deliver_kind("KvMeta", P1).unwrap());
    h.fire(P1, Timer::Compute).unwrap();
    h.fire(P1, Timer::Compute).unwrap();
    assert_eq!(h.count_kind("KvWrite"), 2);
    room
}

/// P1's first chunk write, as `from` would forge it with `writer` as its id's writer.
fn forged_write(h: &H, writer: NodeId) -> KvWrite<SymbolicPage> {
    let i = h.find_kind("KvWrite", D1).unwrap();
    match h.in_flight()[i].msg.clone() {
        Carried::Write(KvWrite { id, src, dst, kv }) => KvWrite {
            id: WriteId {
                writer,
                chunk: 7,
                ..id
            },
            src,
            dst,
            kv,
        },
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_kv_write_from_a_node_that_is_not_the_rooms_prefill_is_refused() {
    let tokens = reference();
    let mut h = h2_two_sided();
    let room = sending(&mut h);
    let msg = forged_write(&h, P2);
    let m = h.mark();
    let why = refused(&mut h, D1, P2, send(P2, D1, msg));
    assert!(
        why.contains(&format!("{room}'s prefill node is {P1}")),
        "{why}"
    );
    // Its one failed completion goes back to the forger, who has no such write.
    assert_eq!(h.send_kinds_since(m), vec![(D1, "WriteDone", P2)]);
    completes(&mut h, &tokens);
}

#[test]
fn a_kv_write_whose_id_names_another_writer_is_refused() {
    let tokens = reference();
    // From a wrong node naming the right writer, and from the right node naming a
    // wrong writer.
    for (from, writer) in [(P2, P1), (P1, P2)] {
        let mut h = h2_two_sided();
        sending(&mut h);
        let msg = forged_write(&h, writer);
        let why = refused(&mut h, D1, from, send(from, D1, msg));
        assert!(why.contains("names another writer"), "{why}");
        completes(&mut h, &tokens);
    }
}

#[test]
fn a_kv_done_from_a_node_that_is_not_the_rooms_prefill_is_refused() {
    let tokens = reference();
    for outcome in [
        TransferOutcome::Failed,
        TransferOutcome::Success {
            tokens: 10,
            pages: 3,
            checksum: 0,
        },
    ] {
        let mut h = h2();
        let room = sending(&mut h);
        let done = Msg::KvDone {
            room,
            outcome,
            epoch: 0,
        };
        let why = refused(&mut h, D1, P2, send(P2, D1, done));
        assert!(why.contains("prefill node is"), "{why}");
        completes(&mut h, &tokens);
    }
}

#[test]
fn an_abort_from_a_node_that_is_not_the_router_is_refused() {
    let tokens = reference();
    let mut h = h2();
    let room = start(&mut h);
    handled(h.deliver_kind("DecodeStart", D1).unwrap());
    handled(h.deliver_kind("PrefillStart", P1).unwrap());
    let c = h.client();
    for (from, to) in [
        (P1, D1),
        (D2, D1),
        (D1, P1),
        (P2, P1),
        (c, P1),
        (STRANGER, D1),
    ] {
        let why = refused(&mut h, to, from, send(from, to, Msg::Abort { room }));
        assert!(why.contains("only the router"), "{why}");
    }
    completes(&mut h, &tokens);
}

#[test]
fn a_start_from_a_node_that_is_not_the_router_is_refused() {
    let mut h = h2();
    let room = RoomKey::new(5, 1);
    let start = Msg::PrefillStart {
        room,
        req: RequestId(9),
        prompt: prompt(LEN),
        decode: D1,
    };
    refused(&mut h, P1, D1, send(D1, P1, start));
    let start = Msg::DecodeStart {
        room,
        req: RequestId(9),
        prompt: prompt(LEN),
        max_new_tokens: NEW,
        prefill: P1,
    };
    refused(&mut h, D1, P2, send(P2, D1, start));
    assert!(h.in_flight().is_empty(), "nothing was started");
}

/// Finding (fixed): decode believed the start's `prefill` field. A start naming a node
/// that is not a prefill node reserved pages and sent the page list there; after an
/// abort those pages waited for a drain ack that node can never send, and the drain
/// retries never gave up on it. Decode now refuses such a start (it knows the
/// deployment's prefill nodes): nothing is reserved, and the router's abort is
/// answered as for any room decode does not know.
#[test]
fn a_start_naming_a_node_that_is_not_a_prefill_is_refused() {
    for named in [D2, R, STRANGER, D1] {
        let mut h = h2();
        let room = RoomKey::new(5, 1);
        let start = Msg::DecodeStart {
            room,
            req: RequestId(9),
            prompt: prompt(LEN),
            max_new_tokens: NEW,
            prefill: named,
        };
        let why = refused(&mut h, D1, R, send(R, D1, start));
        assert!(why.contains("not a prefill node"), "{why}");
        assert!(h.in_flight().is_empty(), "no page list was sent");
        assert_eq!(h.decode_phase(D1, room), None);
        // An abort for it quarantines nothing and leaves no retry behind.
        handled(h.inject(R, D1, Msg::Abort { room }).unwrap());
        h.settle(200).unwrap();
        assert_eq!(h.free_pages(D1), 8);
        assert!(h.timers_of(D1).is_empty(), "{named}");
    }
}

/// Two uses of room 1 on one decode node, both quarantined: the first (room1.g1)
/// waits on P1's drain ack, the second (room1.g2) on P2's. The first drain request
/// is held back until the second use is quarantined. Returns both rooms and the
/// held request.
fn two_uses_quarantined(bugs: BugSet) -> (H, RoomKey, RoomKey) {
    let cfg = EngineConfig {
        bugs,
        max_rooms: 1,
        ..cfg()
    };
    let topo = Topology {
        prefill_pools: vec![8, 8],
        decode_pools: vec![8],
    };
    let mut h = Harness::with_topology(cfg, topo).unwrap();
    let d = NodeId(3);
    let quarantine = |h: &mut H, req: u64| {
        handled(h.submit(req, prompt(LEN), NEW).unwrap());
        let room = h.room_of(req).unwrap();
        handled(h.deliver_kind("DecodeStart", d).unwrap());
        handled(h.cancel(req).unwrap());
        handled(h.deliver_kind("Abort", d).unwrap());
        room
    };
    let first = quarantine(&mut h, 1);
    let held = h.find_kind("DrainRequest", P1).unwrap();
    let held = h.drop_flight(held).unwrap();
    h.settle(200).unwrap();
    let second = quarantine(&mut h, 2);
    assert_eq!((first.room, second.room), (RoomId(1), RoomId(1)));
    assert_eq!(h.router_room(second).unwrap().prefill, P2);
    assert!(matches!(
        h.decode_phase(d, first),
        Some(DecodePhase::Quarantined { .. })
    ));
    assert!(matches!(
        h.decode_phase(d, second),
        Some(DecodePhase::Quarantined { .. })
    ));
    // P1 hears the held drain request and acks room1.g1.
    handled(h.inject(held.from, held.to, held.msg).unwrap());
    (h, first, second)
}

#[test]
fn the_ack_of_the_prefill_that_was_asked_is_believed_while_the_room_number_waits_on_another() {
    let d = NodeId(3);
    // Without the bug: P1's ack releases its own use only; the second waits for P2.
    let (mut h, first, second) = two_uses_quarantined(BugSet::NONE);
    handled(h.deliver_kind("DrainAck", d).unwrap());
    assert_eq!(h.peer_refused(d), 0);
    assert_eq!(h.decode_phase(d, first), None);
    assert!(matches!(
        h.decode_phase(d, second),
        Some(DecodePhase::Quarantined { .. })
    ));
    h.settle(200).unwrap();
    assert_eq!(h.free_pages(d), 8);
    // With generation-blind acks the same ack is believed too, and releases both
    // uses: the bug switch's S9 violation, not a refusal. (Before the fix in
    // `DecodeNode::check_peer` the ack was refused because the room number also
    // waited on P2, so neither use was ever released: the bug was masked in any
    // topology where a decode node pairs with more than one prefill node.)
    let (mut h, first, second) = two_uses_quarantined(BugSet::NONE.with(Bug::AckIgnoresGeneration));
    let m = h.mark();
    handled(h.deliver_kind("DrainAck", d).unwrap());
    assert_eq!(h.peer_refused(d), 0);
    assert_eq!(
        h.event_names_since(m),
        vec!["QuarantineReleased", "QuarantineReleased"]
    );
    assert_eq!(h.decode_phase(d, first), None);
    assert_eq!(h.decode_phase(d, second), None);
    // A node asked for neither use is refused in both modes.
    for bugs in [BugSet::NONE, BugSet::NONE.with(Bug::AckIgnoresGeneration)] {
        let (mut h, first, _) = two_uses_quarantined(bugs);
        let ack = Msg::DrainAck { room: first };
        refused(&mut h, d, NodeId(0), send(NodeId(0), d, ack));
    }
}

// ---- prefill -----------------------------------------------------------------------

#[test]
fn a_page_list_from_a_node_that_is_not_the_rooms_decode_is_refused() {
    let tokens = reference();
    for forger in [D2, P2, R] {
        let mut h = h2();
        let room = start(&mut h);
        handled(h.deliver_kind("PrefillStart", P1).unwrap());
        let meta = Msg::KvMeta {
            room,
            dst: vec![tag(1), tag(2), tag(3)],
            prompt_len: 10,
        };
        let why = refused(&mut h, P1, forger, send(forger, P1, meta));
        assert!(why.contains(&format!("decode node is {D1}")), "{why}");
        assert_eq!(
            h.prefill_phase(P1, room),
            Some(kvsim_engine::prefill::PrefillPhase::Bootstrapping)
        );
        completes(&mut h, &tokens);
    }
}

#[test]
fn a_page_list_from_a_wrong_node_before_the_start_is_refused_when_the_start_arrives() {
    let tokens = reference();
    let mut h = h2();
    let room = start(&mut h);
    let meta = Msg::KvMeta {
        room,
        dst: vec![tag(1), tag(2), tag(3)],
        prompt_len: 10,
    };
    // Kept, for all prefill can tell, as the page list of a start still on its way.
    let count = h.peer_refused(P1);
    handled(h.inject(D2, P1, meta).unwrap());
    assert_eq!(h.peer_refused(P1), count);
    assert_eq!(h.prefill(P1).unwrap().early_meta_from(room), vec![D2]);
    // The start names D1: the kept list is refused then, and never used.
    refused(&mut h, P1, D2, |h| {
        handled(h.deliver_kind("PrefillStart", P1).unwrap())
    });
    assert_eq!(
        h.prefill_phase(P1, room),
        Some(kvsim_engine::prefill::PrefillPhase::Bootstrapping)
    );
    completes(&mut h, &tokens);
}

#[test]
fn a_drain_request_from_a_node_that_is_not_the_rooms_decode_is_refused() {
    let tokens = reference();
    let mut h = h2();
    let room = sending(&mut h);
    let why = refused(&mut h, P1, D2, send(D2, P1, Msg::DrainRequest { room }));
    assert!(why.contains("decode node is"), "{why}");
    completes(&mut h, &tokens);
}

#[test]
fn a_write_completion_from_a_node_the_write_did_not_go_to_is_refused() {
    let tokens = reference();
    for ok in [false, true] {
        let mut h = h2();
        sending(&mut h);
        let i = h.find_kind("KvWrite", D1).unwrap();
        let id = h.in_flight()[i].msg.write_id().unwrap();
        let why = refused(&mut h, P1, D2, send(D2, P1, Msg::WriteDone { id, ok }));
        assert!(why.contains(&format!("went to {D1}")), "{why}");
        // And a completion of a write this node never issued, from anyone.
        let other = WriteId { writer: P2, ..id };
        let why = refused(
            &mut h,
            P1,
            D1,
            send(D1, P1, Msg::WriteDone { id: other, ok }),
        );
        assert!(why.contains("not a write of this incarnation"), "{why}");
        completes(&mut h, &tokens);
    }
}

// ---- router ------------------------------------------------------------------------

#[test]
fn half_reports_and_tokens_from_the_wrong_node_are_refused_at_the_router() {
    let tokens = reference();
    let mut h = h2();
    let room = start(&mut h);
    let before = h.router_room(room);
    let forgeries: Vec<(NodeId, Msg)> = vec![
        (
            P2,
            Msg::PrefillFinished {
                room,
                status: Status::INTERNAL,
                why: None,
            },
        ),
        (
            D1,
            Msg::PrefillFinished {
                room,
                status: Status::OK,
                why: None,
            },
        ),
        (
            D2,
            Msg::DecodeFinished {
                room,
                status: Status::OK,
                why: None,
            },
        ),
        (
            P1,
            Msg::DecodeFinished {
                room,
                status: Status::INTERNAL,
                why: None,
            },
        ),
        (
            D2,
            Msg::TokenOut {
                room,
                index: 0,
                token: 7,
            },
        ),
    ];
    for (from, msg) in forgeries {
        let m = h.mark();
        refused(&mut h, R, from, send(from, R, msg));
        assert!(h.sends_since(m).is_empty(), "no answer, no abort");
        assert_eq!(h.router_room(room), before);
    }
    completes(&mut h, &tokens);
}

#[test]
fn a_cancel_from_another_client_endpoint_is_refused() {
    let tokens = reference();
    let mut h = h2();
    let room = start(&mut h);
    for from in [STRANGER, P1, D1] {
        let cancel = Msg::Cancel { req: RequestId(1) };
        let why = refused(&mut h, R, from, send(from, R, cancel));
        assert!(why.contains("was submitted by"), "{why}");
        assert!(!h.router_room(room).unwrap().answered);
    }
    assert!(h.responses().is_empty());
    completes(&mut h, &tokens);
}

// ---- findings: forged messages about a room prefill does not know yet ----------------

/// Finding: prefill keeps one early page list per room, the last to arrive. A wrong
/// node's page list arriving after decode's (both before the start) replaces it, the
/// replacement is refused when the start arrives, and the real list is gone: the
/// room waits for its bootstrap timeout. No page moves, but the request fails.
#[test]

fn a_forged_early_page_list_does_not_evict_the_real_one() {
    let tokens = reference();
    let mut h = h2();
    let room = start(&mut h);
    handled(h.deliver_kind("DecodeStart", D1).unwrap());
    handled(h.deliver_kind("KvMeta", P1).unwrap());
    let meta = Msg::KvMeta {
        room,
        dst: vec![tag(1)],
        prompt_len: 10,
    };
    handled(h.inject(D2, P1, meta).unwrap());
    completes(&mut h, &tokens);
}

/// Finding (fixed): a drain request for a room prefill did not know yet was believed
/// from any node (there is no recorded peer); it retired the room, so the real start
/// was then ignored as stale, and the request hung until the router's request
/// timeout. Now prefill keeps it (acked: it has no write for the room) and believes
/// it only when the start names its sender as the room's decode node.
#[test]
fn a_forged_drain_request_before_the_start_does_not_retire_the_room() {
    let tokens = reference();
    let mut h = h2();
    let room = start(&mut h);
    handled(h.inject(D2, P1, Msg::DrainRequest { room }).unwrap());
    assert!(!h.prefill(P1).unwrap().is_retired(room));
    // Refused when the start arrives naming D1.
    refused(&mut h, P1, D2, |h| {
        handled(h.deliver_kind("PrefillStart", P1).unwrap())
    });
    completes(&mut h, &tokens);
}

/// The room's own decode node asking to drain before the start still retires the
/// room when the start arrives: decode was told no write would come, so none may.
#[test]
fn the_decodes_drain_request_before_the_start_retires_the_room() {
    let mut h = h2();
    let room = start(&mut h);
    let m = h.mark();
    handled(h.inject(D1, P1, Msg::DrainRequest { room }).unwrap());
    assert_eq!(h.send_kinds_since(m), vec![(P1, "DrainAck", D1)]);
    handled(h.deliver_kind("PrefillStart", P1).unwrap());
    assert!(h.prefill(P1).unwrap().is_retired(room));
    assert_eq!(h.prefill_phase(P1, room), None);
    assert_eq!(h.peer_refused(P1), 0);
}
