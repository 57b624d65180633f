//! The world's rules, each checked on its own.

use super::*;
use crate::env::{Timer, TimerOp};
use crate::gpu::SymbolicPage;
use crate::ids::{Generation, NodeId, PageId, PageTag, RoomKey, WriteId};
use crate::msg::{Carried, KvWrite, Msg};

fn write(epoch: u32) -> Carried<()> {
    Carried::Write(KvWrite {
        id: WriteId {
            writer: NodeId(1),
            epoch: 0,
            room: RoomKey::new(1, 1),
            chunk: 0,
        },
        src: vec![],
        dst: vec![PageTag {
            page: PageId(1),
            gen: Generation(Generation::first_of_epoch(epoch).0 + 1),
        }],
        kv: vec![()],
    })
}

#[test]
fn topology_numbers_nodes_as_documented() {
    let t = Topology {
        prefill_pools: vec![4, 5],
        decode_pools: vec![6],
    };
    assert_eq!(t.prefill_ids(), vec![NodeId(1), NodeId(2)]);
    assert_eq!(t.decode_ids(), vec![NodeId(3)]);
    assert_eq!(t.client(), NodeId(4));
    assert_eq!(t.pool(NodeId(2)), Some(5));
    assert_eq!(t.pool(NodeId(3)), Some(6));
    assert_eq!(t.role(NodeId(4)), None);
    assert_eq!(t.nodes().len(), 4);
}

/// Both ends alive, nothing in the way.
const ALIVE: Arriving = Arriving {
    sender_alive: true,
    receiver_alive: true,
    receiver_restarted: false,
    receiver_epoch: 0,
    partitioned: false,
    injected_failure: false,
    transport: KvTransport::OneSided,
};

#[test]
fn a_write_fails_back_for_every_reason_and_lands_otherwise() {
    let alive = ALIVE;
    assert_eq!(arrival(&write(0), &alive), Arrival::Deliver);
    let fails = |at: Arriving, why| match arrival(&write(0), &at) {
        Arrival::Fail { reason, completion } => {
            assert_eq!(reason, why);
            assert!(matches!(completion, Msg::WriteDone { ok: false, .. }));
        }
        other => panic!("{other:?}"),
    };
    fails(
        Arriving {
            injected_failure: true,
            ..alive
        },
        WriteFailure::Injected,
    );
    fails(
        Arriving {
            receiver_alive: false,
            ..alive
        },
        WriteFailure::ReceiverGone,
    );
    fails(
        Arriving {
            partitioned: true,
            ..alive
        },
        WriteFailure::Partitioned,
    );
    fails(
        Arriving {
            receiver_epoch: 1,
            ..alive
        },
        WriteFailure::StaleRegistration,
    );
    // Over NIXL a stale write to a live receiver lands (its tags keep the old epoch);
    // every other reason fails it back there too.
    let nixl = Arriving {
        transport: KvTransport::Nixl,
        ..alive
    };
    assert_eq!(
        arrival(
            &write(0),
            &Arriving {
                receiver_epoch: 1,
                ..nixl
            }
        ),
        Arrival::Deliver
    );
    fails(
        Arriving {
            receiver_alive: false,
            receiver_epoch: 1,
            ..nixl
        },
        WriteFailure::ReceiverGone,
    );
    assert_eq!(
        arrival(
            &write(0),
            &Arriving {
                sender_alive: false,
                ..alive
            }
        ),
        Arrival::Drop(DropReason::SenderCrashed)
    );
}

#[test]
fn a_completion_crosses_a_partition_and_a_control_message_does_not() {
    let done: Carried<()> = Carried::Msg(failed_completion(&write(0)).unwrap());
    let cut = Arriving {
        partitioned: true,
        ..ALIVE
    };
    assert_eq!(arrival(&done, &cut), Arrival::Deliver);
    assert_eq!(
        arrival(
            &Carried::<()>::Msg(Msg::Abort {
                room: RoomKey::new(1, 1)
            }),
            &cut
        ),
        Arrival::Drop(DropReason::Partitioned)
    );
}

#[test]
fn what_was_on_its_way_to_a_crashed_node_reaches_its_next_incarnation() {
    let (p, d) = (NodeId(1), NodeId(2));
    let room = RoomKey::new(1, 1);
    let abort = Carried::<()>::Msg(Msg::Abort { room });
    let done: Carried<()> = Carried::Msg(failed_completion(&write(0)).unwrap());
    // At the crash of d: a write to it fails back, anything else to it travels on.
    assert!(matches!(
        crash_fate(d, p, d, &write(0)),
        CrashFate::FailBack(_)
    ));
    assert_eq!(crash_fate(d, NodeId(0), d, &abort), CrashFate::Keep);
    assert_eq!(crash_fate(p, d, p, &done), CrashFate::Keep);
    assert_eq!(crash_fate(p, p, d, &write(0)), CrashFate::Flush);
    // Arriving at the restarted incarnation: delivered; at a node still down: lost.
    let restarted = Arriving {
        sender_alive: true,
        receiver_alive: false,
        receiver_restarted: true,
        receiver_epoch: 1,
        partitioned: false,
        injected_failure: false,
        transport: KvTransport::OneSided,
    };
    assert_eq!(arrival(&abort, &restarted), Arrival::Deliver);
    assert_eq!(arrival(&done, &restarted), Arrival::Deliver);
    assert!(matches!(
        arrival(&write(0), &restarted),
        Arrival::Fail { .. }
    ));
    let down = Arriving {
        receiver_restarted: false,
        ..restarted
    };
    assert_eq!(
        arrival(&abort, &down),
        Arrival::Drop(DropReason::ReceiverGone)
    );
    assert_eq!(
        arrival(&done, &down),
        Arrival::Drop(DropReason::ReceiverGone)
    );
}

/// [`write`], written by `writer` as its chunk `chunk`.
fn write_of(writer: NodeId, chunk: u32) -> Carried<()> {
    match write(0) {
        Carried::Write(mut w) => {
            w.id.writer = writer;
            w.id.chunk = chunk;
            Carried::Write(w)
        }
        m => m,
    }
}

#[test]
fn the_crash_walk_judges_each_message_in_flight_once() {
    let (r, p, d) = (ROUTER, NodeId(1), NodeId(2));
    let abort = Carried::<()>::Msg(Msg::Abort {
        room: RoomKey::new(1, 1),
    });
    let own = |chunk| write_of(d, chunk);
    // (from, to, message, epochs at sending, a stale duplicate), walked at the crash
    // of d's incarnation 1.
    let flights = vec![
        (p, d, write(0), Some((0, 1)), false), // to the dead one: fails back
        (d, p, own(7), Some((1, 0)), false),   // its own write: flushed
        (r, d, abort.clone(), Some((0, 1)), false), // to the dead one: late
        (r, p, abort.clone(), Some((0, 0)), false), // elsewhere: on its way
        (r, d, abort.clone(), Some((0, 0)), false), // to an earlier one: untouched
        (p, d, write(0), Some((0, 1)), true),  // a stale duplicate: lost
        (p, d, write(0), None, false),         // no epochs kept: the dead one's
    ];
    let walk = CrashWalk::new(d, 1).walk(flights.clone(), |(from, to, msg, epochs, dup)| {
        Some(Flying {
            from: *from,
            to: *to,
            msg,
            epochs: *epochs,
            duplicate: *dup,
        })
    });
    let travel: Vec<(usize, Travel)> = walk
        .kept
        .iter()
        .map(|(f, t)| (flights.iter().position(|g| g == f).unwrap(), *t))
        .collect();
    assert_eq!(
        travel,
        vec![
            (2, Travel::Late),
            (3, Travel::OnItsWay),
            (4, Travel::OnItsWay)
        ]
    );
    assert_eq!(
        walk.flushed,
        own(7).write_id().into_iter().collect::<Vec<_>>()
    );
    assert_eq!(
        walk.failed.len(),
        2,
        "both writes to the dead incarnation fail back"
    );
    assert!(walk
        .failed
        .iter()
        .all(|(f, done)| f.0 == p && *done == failed_completion(&write(0)).unwrap()));
    assert_eq!(walk.lost.len(), 1);
    assert!(walk.lost[0].4, "the stale duplicate is lost");
    assert_eq!(walk.epoch(), 2);
}

#[test]
fn a_crash_walk_flushes_posted_writes_and_keeps_what_is_no_message() {
    let (p, d) = (NodeId(1), NodeId(2));
    // A driver whose writes left its hands: every posted write is flushed.
    let mut posted = WritesInFlight::new();
    let Carried::Write(own) = write_of(d, 3) else {
        unreachable!("a write")
    };
    posted.post(p, &own);
    let walk = CrashWalk::<()>::new(d, 1).flush_posted(&mut posted);
    assert_eq!(
        walk.flushed,
        write_of(d, 3).write_id().into_iter().collect::<Vec<_>>()
    );
    assert!(posted.is_empty());
    // Not a message: it stays as it is.
    let walk = CrashWalk::<u8>::new(d, 1).walk([9u8], |_: &u8| -> Option<Flying<'_, ()>> { None });
    assert_eq!(walk.kept, vec![(9, Travel::OnItsWay)]);
}

#[test]
fn data_faults_change_one_page_of_a_write_as_stated() {
    let page = |t: u32| SymbolicPage {
        tokens: vec![t; 4],
        tag: None,
    };
    let tag = |p: u32| PageTag {
        page: PageId(p),
        gen: Generation(3),
    };
    let w = || KvWrite {
        id: WriteId {
            writer: NodeId(1),
            epoch: 0,
            room: RoomKey::new(1, 1),
            chunk: 0,
        },
        src: vec![],
        dst: vec![tag(4), tag(8)],
        kv: vec![page(10), page(20)],
    };
    let parts = |m: &KvWrite<SymbolicPage>| (m.dst.clone(), m.kv.clone());
    // Misdirect: the page goes to the next page id, wrapping in the pool.
    let mut m = w();
    let a = alter(&mut m, DataFault::Misdirect, 8, 1).unwrap();
    assert_eq!((a.index, a.meant, a.landed), (1, tag(8), tag(1)));
    assert_eq!(parts(&m).0, vec![tag(4), tag(1)]);
    // Torn: the last page keeps its leading half.
    let mut m = w();
    let a = alter(&mut m, DataFault::Torn, 8, 0).unwrap();
    assert_eq!(a.index, 1);
    assert_eq!(parts(&m).1[1].tokens, vec![20, 20]);
    assert_eq!(parts(&m).1[0].tokens.len(), 4);
    // Corrupt: one slot of one page differs.
    let mut m = w();
    let a = alter(&mut m, DataFault::Corrupt, 8, 0).unwrap();
    let (_, kv) = parts(&m);
    let changed = kv[a.index]
        .tokens
        .iter()
        .filter(|t| **t != [10, 20][a.index])
        .count();
    assert_eq!(changed, 1);
    // Nothing to act on: a one-page pool.
    assert_eq!(alter(&mut w(), DataFault::Misdirect, 1, 0), None);
}

/// The writer and the receiver of the stale-duplicate tests.
const DUP_FROM: NodeId = NodeId(1);
const DUP_TO: NodeId = NodeId(3);

fn tag_at(page: u32, gen: u64) -> PageTag {
    PageTag {
        page: PageId(page),
        gen: Generation(gen),
    }
}

/// A write by [`DUP_FROM`] of chunk `chunk` of room `room` to `dst`, every page
/// filled with `fill`.
fn filled_write(room: u32, chunk: u32, dst: Vec<PageTag>, fill: u32) -> KvWrite<SymbolicPage> {
    KvWrite {
        id: WriteId {
            writer: DUP_FROM,
            epoch: 0,
            room: RoomKey::new(room, 1),
            chunk,
        },
        src: vec![],
        kv: dst
            .iter()
            .map(|_| SymbolicPage {
                tokens: vec![fill; 4],
                tag: None,
            })
            .collect(),
        dst,
    }
}

/// A history of three writes from [`DUP_FROM`]: two to [`DUP_TO`] (the first to
/// pages 5 and 6 at generation 2), one to another node; and that first write.
fn three_writes() -> (WriteHistory<SymbolicPage>, KvWrite<SymbolicPage>) {
    let (p, d, w, tag) = (DUP_FROM, DUP_TO, filled_write, tag_at);
    let mut h: WriteHistory<SymbolicPage> = WriteHistory::new();
    let first = w(1, 0, vec![tag(5, 2), tag(6, 2)], 10);
    assert!(h.duplicate(d, &first, 0).is_none(), "nothing taken yet");
    h.remember(p, d, &first);
    h.remember(p, d, &w(2, 0, vec![tag(1, 2)], 20));
    h.remember(p, NodeId(4), &w(9, 0, vec![tag(6, 2)], 90));
    (h, first)
}

#[test]
fn a_stale_duplicate_replays_an_earlier_write_of_a_page_being_rewritten() {
    let (p, d, w, tag) = (DUP_FROM, DUP_TO, filled_write, tag_at);
    let (mut h, first) = three_writes();
    // A newer use of page 6: the duplicate is the earlier write to page 6 at
    // node d, whatever the salt, carried as it was sent.
    let newer = w(3, 0, vec![tag(6, 4)], 30);
    for salt in 0..4 {
        let (from, dup, a) = h.duplicate(d, &newer, salt).unwrap();
        assert_eq!((from, dup.clone()), (p, first.clone()));
        assert_eq!(a.fault, DataFault::StaleDuplicate);
        assert_eq!((a.index, a.meant, a.landed), (1, tag(6, 4), tag(6, 2)));
    }
    // No earlier write shares a page: any earlier write to d, never the write itself.
    let elsewhere = w(4, 0, vec![tag(9, 4)], 40);
    let ids: Vec<_> = (0..4)
        .map(|s| h.duplicate(d, &elsewhere, s).unwrap().1.id)
        .collect();
    assert!(ids.contains(&first.id));
    assert!(!ids.contains(&elsewhere.id));
    h.remember(p, d, &elsewhere);
    assert_ne!(h.duplicate(d, &elsewhere, 0).unwrap().1.id, elsewhere.id);
}

#[test]
fn the_duplicate_window_is_bounded_and_a_writer_crash_forgets() {
    let (p, d, w, tag) = (DUP_FROM, DUP_TO, filled_write, tag_at);
    let (mut h, first) = three_writes();
    let newer = w(3, 0, vec![tag(6, 4)], 30);
    // Bounded: only the last DUPLICATE_WINDOW writes are kept.
    for c in 0..DUPLICATE_WINDOW as u32 {
        h.remember(p, d, &w(7, c, vec![tag(2, 2)], 70));
    }
    assert_ne!(h.duplicate(d, &newer, 0).unwrap().1.id, first.id);
    // A crash of the writer forgets its writes; alter leaves the write unchanged.
    h.crash(p);
    assert!(h.duplicate(d, &newer, 0).is_none());
    let mut m = newer.clone();
    assert_eq!(alter(&mut m, DataFault::StaleDuplicate, 8, 0), None);
    assert_eq!(m, newer);
    // The duplicate's completion is the one the driver drops.
    let id = first.id;
    assert!(duplicate_completion(id, &Msg::WriteDone { id, ok: true }));
    assert!(!duplicate_completion(
        id,
        &Msg::WriteDone {
            id: newer.id,
            ok: true
        }
    ));
}

#[test]
fn a_crash_keeps_fails_back_or_flushes() {
    let (p, d, r) = (NodeId(1), NodeId(2), NodeId(0));
    assert!(matches!(
        crash_fate(d, p, d, &write(0)),
        CrashFate::FailBack(Msg::WriteDone { ok: false, .. })
    ));
    assert_eq!(crash_fate(p, p, d, &write(0)), CrashFate::Flush);
    let abort = Carried::<()>::Msg(Msg::Abort {
        room: RoomKey::new(1, 1),
    });
    // To the dead incarnation: it reaches the restarted one (it used to be lost).
    assert_eq!(crash_fate(d, r, d, &abort), CrashFate::Keep);
    assert_eq!(crash_fate(d, r, p, &abort), CrashFate::Keep);
}

/// vLLM's pull: the response of a READ (a KV write posted by its reader, `p` here,
/// carried from the source `d`) is cut when the source crashes, and the reader's NIC
/// completes its READ with an error; the source's own writes are flushed as before.
#[test]
fn a_source_crash_fails_a_read_response_back_to_its_reader() {
    let (p, d) = (NodeId(1), NodeId(2));
    let response = write(0);
    let CrashFate::FailBack(done) = crash_fate(d, d, p, &response) else {
        panic!("a READ response from a crashed source must fail back to its reader");
    };
    assert_eq!(
        done,
        Msg::WriteDone {
            id: response.write_id().unwrap(),
            ok: false
        }
    );
    assert_eq!(crash_failure(d, p), WriteFailure::SourceGone);
    assert_eq!(crash_failure(d, d), WriteFailure::ReceiverGone);
    // Its own write (posted by the crashed node) is flushed, never failed back.
    assert_eq!(crash_fate(p, p, d, &response), CrashFate::Flush);
    // The walk routes the completion to the reader (the completion's writer).
    let flights = [(d, p, response.clone())];
    let walk = CrashWalk::new(d, 0).walk(flights, |(from, to, msg)| {
        Some(Flying {
            from: *from,
            to: *to,
            msg,
            epochs: None,
            duplicate: false,
        })
    });
    assert_eq!(walk.failed.len(), 1);
    assert!(walk.flushed.is_empty());
    assert_eq!(walk.failed[0].1.write_id().map(|id| id.writer), Some(p));
}

#[test]
fn timers_replace_cancel_and_die_with_their_node() {
    let mut t: Timers<u64> = Timers::new();
    let set = TimerOp::Set {
        timer: Timer::Compute,
        after_ns: 1,
    };
    t.apply(NodeId(1), set, 1);
    t.apply(NodeId(1), set, 2);
    t.apply(NodeId(2), set, 3);
    assert_eq!(t.len(), 2);
    assert_eq!(t.get(NodeId(1), Timer::Compute), Some(&2));
    t.apply(
        NodeId(2),
        TimerOp::Cancel {
            timer: Timer::Compute,
        },
        0,
    );
    assert_eq!(t.take(NodeId(2), Timer::Compute), None);
    t.crash(NodeId(1));
    assert!(t.is_empty());
}

fn posted(chunk: u32) -> (WriteId, KvWrite<()>) {
    let id = WriteId {
        writer: NodeId(1),
        epoch: 0,
        room: RoomKey::new(1, 1),
        chunk,
    };
    let msg = KvWrite {
        id,
        src: vec![],
        dst: vec![],
        kv: vec![],
    };
    (id, msg)
}

#[test]
fn a_write_in_flight_leaves_once() {
    let (a, b, c) = (posted(0), posted(1), posted(2));
    let (d1, d2) = (NodeId(2), NodeId(3));
    let mut w = WritesInFlight::new();
    w.post(d1, &a.1);
    w.post(d1, &b.1);
    w.post(d2, &c.1);
    assert_eq!(w.len(), 3, "only KV writes are in flight");
    assert!(
        !w.complete(d2, a.0),
        "a completion from another node is not a's"
    );
    assert!(w.complete(d1, a.0));
    assert!(!w.complete(d1, a.0), "a write completes once");
    assert!(!w.fail(d1, a.0), "a completed write does not fail");
    assert_eq!(
        w.peer_lost(d1),
        vec![b.0],
        "the writes still in flight to d1"
    );
    assert!(
        !w.complete(d1, b.0),
        "a write failed back does not complete"
    );
    assert_eq!(w.peer_lost(d1), Vec::<WriteId>::new());
    assert_eq!(w.iter().collect::<Vec<_>>(), vec![(d2, c.0)]);
    assert_eq!(
        w.crash(),
        vec![c.0],
        "a crash flushes every write in flight"
    );
    assert!(w.is_empty());
    assert!(!w.fail(d2, c.0), "a flushed write does not fail back");
}
