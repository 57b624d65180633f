//! Every field of every message and every trace record survives the trace: each engine
//! event, each record of the driver and each message view goes through its JSON line
//! and comes back equal, field by field (every value is distinct from its default, so
//! a field dropped or skipped on the way comes back different); and each engine
//! message's trace view carries every field of the message, with only the prompt's
//! tokens (as their count) and the KV payload left out. So the in-process oracle, which
//! sees the records, and `kvsim audit`, which sees their lines, cannot judge different
//! runs.

use kvsim_engine::env::Timer;
use kvsim_engine::ids::{
    Generation, NodeId, PageId, PageTag, RequestId, RoomId, RoomKey, TenantId, WriteId,
};
use kvsim_engine::invariant::{Invariant, Violation};
use kvsim_engine::msg::{Carried, KvWrite, Msg, Status, TransferOutcome, Why};
use kvsim_engine::trace::{NodeFault, ReleaseKind, Side, TraceEvent, TransferClaim};
use kvsim_engine::world::{DataFault, DropReason, WriteFailure};
use kvsim_oracle::schema::{
    entry_line, parse_line, CancelHow, EndOutcome, Entry, FaultEvent, Line, MsgView, Record,
};
use std::collections::BTreeSet;

const N: NodeId = NodeId(7);
const M: NodeId = NodeId(9);

fn room() -> RoomKey {
    RoomKey {
        room: RoomId(3),
        gen: Generation(11),
    }
}
fn tag(p: u32) -> PageTag {
    PageTag {
        page: PageId(p),
        gen: Generation((5 << 32) + u64::from(p)),
    }
}
fn tags() -> Vec<PageTag> {
    vec![tag(4), tag(6)]
}
fn write() -> WriteId {
    WriteId {
        writer: N,
        epoch: 5,
        room: room(),
        chunk: 2,
    }
}

/// One of every engine event, every field set to a value that is not its default.
fn events() -> Vec<TraceEvent> {
    use TraceEvent::*;
    let claim = TransferClaim {
        from: M,
        prompt_len: 700,
        reserved_pages: 11,
        sent_tokens: 699,
        sent_pages: 10,
        fully_written: true,
    };
    let (node, room, req) = (N, room(), RequestId(13));
    let s = |x: &str| x.to_string();
    let success = Status::OK;
    vec![
        Routed {
            node,
            req,
            tenant: TenantId(2),
            room,
            prefill: M,
            decode: NodeId(10),
            prompt_len: 700,
            max_new_tokens: 9,
        },
        Admitted {
            node,
            room,
            req,
            side: Side::Decode,
            prompt_len: 700,
        },
        Rejected {
            node,
            room,
            side: Side::Prefill,
            status: Status::BAD_REQUEST,
            reason: s("too long"),
        },
        Truncated {
            node,
            room,
            from: 700,
            to: 512,
        },
        RejectedLegacy {
            node,
            room,
            prompt_len: 700,
        },
        PagesReserved {
            node,
            room,
            pages: tags(),
        },
        PagesExpectWrite {
            node,
            room,
            pages: tags(),
        },
        PagesReady {
            node,
            room,
            pages: tags(),
        },
        PagesReleased {
            node,
            room,
            pages: tags(),
            how: ReleaseKind::Unchecked,
            held: vec![tag(6)],
        },
        Quarantined {
            node,
            room,
            pages: tags(),
        },
        QuarantineReleased {
            node,
            room,
            pages: tags(),
            acked: RoomKey::new(4, 1),
            held: vec![tag(4)],
        },
        PagesHeld {
            node,
            pages: tags(),
        },
        PagesUnheld {
            node,
            pages: tags(),
            freed: vec![tag(6)],
        },
        KvWritten {
            node,
            room,
            pages: tags(),
            start: 3,
            tokens: 5,
            pos: Some(67),
        },
        PagesZeroed {
            node,
            pages: vec![PageId(4), PageId(6)],
        },
        KvSent {
            node,
            write: write(),
            src: tags(),
            dst: vec![tag(8), tag(9)],
            to: Some(M),
        },
        KvLanded {
            node,
            write: write(),
            dst: tags(),
        },
        KvRefused {
            node,
            write: write(),
            tag: Some(tag(4)),
            reason: s("page is Ready"),
        },
        WriteCompleted {
            node,
            write: write(),
            ok: true,
        },
        TransferReported {
            node,
            room,
            from: M,
            success: true,
        },
        TransferAccepted { node, room, claim },
        TransferRefused {
            node,
            room,
            claim,
            reason: s("checksum"),
        },
        TransferFailed {
            node,
            room,
            reason: s("timeout"),
        },
        Running {
            node,
            room,
            side: Side::Decode,
        },
        Attend {
            node,
            room,
            step: 4,
            query_pos: 99,
            seq_len: 703,
            pages: tags(),
        },
        TagMismatch {
            node,
            room,
            step: 4,
            seq_len: 703,
            pages: tags(),
            tag: tag(6),
            current: Generation(77),
        },
        AbortNoted {
            node,
            room,
            side: Side::Decode,
        },
        Responded {
            node,
            room,
            side: Side::Decode,
            status: success,
        },
        RouterResponse {
            node,
            req,
            room: Some(room),
            status: success,
            tokens: vec![65536, 65539],
        },
        RoomCleared { node, room },
        RouterRetried {
            node,
            req,
            room,
            status: Status(502),
            attempt: 2,
        },
        FrontCancelled {
            node,
            room,
            status: Status(400),
        },
        DrainAcked { node, room },
        KvReadServed {
            node,
            read: write(),
            src: tags(),
            dst: vec![tag(8), tag(9)],
            to: M,
        },
        Leased {
            node,
            room,
            pages: tags(),
        },
        LeaseEnded {
            node,
            room,
            expired: true,
        },
        PeerRefused {
            node,
            from: M,
            room: Some(room),
            msg: s("KvDone"),
            reason: s("not its peer"),
        },
        Fault {
            node,
            fault: NodeFault::DrainAckMissing { room, retries: 3 },
        },
        Fault {
            node,
            fault: NodeFault::PageRecordRefused {
                room: Some(room),
                op: s("mark-ready"),
                error: s("stale"),
            },
        },
        Fault {
            node,
            fault: NodeFault::HoldLost {
                tag: tag(4),
                error: s("gone"),
            },
        },
        Fault {
            node,
            fault: NodeFault::WriteRefused {
                room,
                error: s("past the list"),
            },
        },
    ]
}

/// One of every message, every field set.
fn messages() -> Vec<Carried<u8>> {
    let (room, req) = (room(), RequestId(13));
    let kv_write = Carried::Write(KvWrite {
        id: write(),
        src: tags(),
        dst: vec![tag(8), tag(9)],
        kv: vec![1, 2],
    });
    let msgs = vec![
        Msg::Submit {
            req,
            tenant: TenantId(2),
            prompt: vec![1, 2, 3],
            max_new_tokens: 9,
        },
        Msg::Cancel { req },
        Msg::Response {
            req,
            status: Status::CLIENT_CLOSED,
            tokens: vec![5, 6],
            why: Some(Why::ReplyTooLong {
                tokens: 700,
                new_tokens: 9,
                limit: 512,
            }),
        },
        Msg::PrefillStart {
            room,
            req,
            prompt: vec![1, 2, 3],
            decode: M,
        },
        Msg::DecodeStart {
            room,
            req,
            prompt: vec![1, 2],
            max_new_tokens: 9,
            prefill: N,
        },
        Msg::Abort { room },
        Msg::KvMeta {
            room,
            dst: tags(),
            prompt_len: 700,
        },
        Msg::DrainRequest { room },
        Msg::WriteDone {
            id: write(),
            ok: true,
        },
        Msg::KvDone {
            room,
            outcome: TransferOutcome::Success {
                tokens: 700,
                pages: 11,
                checksum: 42,
            },
            epoch: 3,
        },
        Msg::DrainAck { room },
        Msg::PrefillFinished {
            room,
            status: Status::INTERNAL,
            why: Some(Why::PromptTooLong {
                tokens: 700,
                limit: 512,
            }),
        },
        Msg::TokenOut {
            room,
            index: 4,
            token: 65539,
        },
        Msg::DecodeFinished {
            room,
            status: Status::UNAVAILABLE,
            why: Some(Why::QueueFull { side: Side::Decode }),
        },
        Msg::KvParams {
            room,
            src: tags(),
            tokens: 700,
        },
        Msg::PullStart {
            room,
            req,
            prompt: vec![1, 2],
            max_new_tokens: 9,
            prefill: N,
            src: tags(),
        },
        Msg::KvRead {
            id: write(),
            src: tags(),
            dst: vec![tag(8), tag(9)],
        },
        Msg::ReadNotify { room, rank: 1 },
        Msg::Heartbeat { room },
        Msg::Register { room },
        Msg::Registered { room, epoch: 2 },
        Msg::PrefillDone {
            room,
            status: Status(504),
            why: Some(Why::TransferFailed),
        },
    ];
    let mut all: Vec<Carried<u8>> = msgs.into_iter().map(Carried::Msg).collect();
    all.push(kv_write);
    all
}

/// The name of a message variant (exhaustive: a new variant must be added above).
fn msg_name(m: &Carried<u8>) -> &'static str {
    let m = match m {
        Carried::Write(_) => return "KvWrite",
        Carried::Msg(m) => m,
    };
    match m {
        Msg::Submit { .. } => "Submit",
        Msg::Cancel { .. } => "Cancel",
        Msg::Response { .. } => "Response",
        Msg::PrefillStart { .. } => "PrefillStart",
        Msg::DecodeStart { .. } => "DecodeStart",
        Msg::Abort { .. } => "Abort",
        Msg::KvMeta { .. } => "KvMeta",
        Msg::DrainRequest { .. } => "DrainRequest",
        Msg::WriteDone { .. } => "WriteDone",
        Msg::KvDone { .. } => "KvDone",
        Msg::DrainAck { .. } => "DrainAck",
        Msg::PrefillFinished { .. } => "PrefillFinished",
        Msg::TokenOut { .. } => "TokenOut",
        Msg::DecodeFinished { .. } => "DecodeFinished",
        Msg::KvParams { .. } => "KvParams",
        Msg::PullStart { .. } => "PullStart",
        Msg::KvRead { .. } => "KvRead",
        Msg::ReadNotify { .. } => "ReadNotify",
        Msg::Heartbeat { .. } => "Heartbeat",
        Msg::Register { .. } => "Register",
        Msg::Registered { .. } => "Registered",
        Msg::PrefillDone { .. } => "PrefillDone",
    }
}

/// Every record of the driver, and one of every fault of the world.
fn records() -> Vec<Record> {
    let view = MsgView::of(&messages()[3]);
    let faults = vec![
        FaultEvent::PartitionStart {
            prefill: N,
            decode: M,
        },
        FaultEvent::PartitionEnd {
            prefill: N,
            decode: M,
        },
        FaultEvent::Crash {
            node: N,
            epoch: 4,
            flushed: vec![write()],
        },
        FaultEvent::Restart { node: N, epoch: 5 },
        FaultEvent::DataFault {
            from: N,
            to: M,
            write: write(),
            kind: DataFault::StaleDuplicate,
            meant: tag(4),
            landed: tag(6),
        },
        FaultEvent::Heal,
    ];
    let mut out = vec![
        Record::Submit {
            req: RequestId(13),
            tenant: TenantId(2),
            prompt_len: 700,
            max_new_tokens: 9,
        },
        Record::ClientCancel {
            req: RequestId(13),
            how: CancelHow::Disconnect,
            plan: "mid-transfer".into(),
        },
        Record::Send {
            from: N,
            to: M,
            msg: view.clone(),
            deliver_at_ns: 99,
            duplicate: true,
        },
        Record::Deliver {
            from: N,
            to: M,
            msg: view.clone(),
        },
        Record::Drop {
            from: N,
            to: M,
            msg: view,
            reason: DropReason::SenderCrashed,
        },
        Record::WriteFailed {
            from: N,
            to: M,
            write: write(),
            reason: WriteFailure::StaleRegistration,
        },
        Record::TimerSet {
            node: N,
            timer: Timer::DrainRetry(room(), 2),
            fire_at_ns: 77,
        },
        Record::TimerCancel {
            node: N,
            timer: Timer::Bootstrap(room()),
        },
        Record::TimerFire {
            node: N,
            timer: Timer::WaitingForKv(room()),
        },
        Record::Response {
            req: RequestId(13),
            status: Status::OK,
            tokens: vec![1, 2],
        },
        Record::Violation {
            violation: Violation::new(Invariant::S9, "a sentence"),
            detected_by: Some("page_tags".into()),
            room: Some(room()),
            related: vec![RoomKey::new(4, 1)],
            pages: vec![(N, PageId(4))],
        },
        Record::End {
            outcome: EndOutcome::LivenessBound,
            detail: "2 s".into(),
        },
    ];
    out.extend(faults.into_iter().map(Record::Fault));
    out.extend(events().into_iter().map(Record::Engine));
    out
}

fn through_a_line(rec: Record) -> Record {
    let e = Entry {
        at_ns: 123,
        seq: 45,
        rec,
    };
    let line = entry_line(&e);
    match parse_line(&line) {
        Ok(Line::Entry(back)) => {
            assert_eq!((back.at_ns, back.seq), (123, 45), "{line}");
            back.rec
        }
        other => panic!("{line}: {other:?}"),
    }
}

#[test]
fn every_engine_event_and_record_survives_its_line_field_by_field() {
    let names: BTreeSet<&str> = events().iter().map(TraceEvent::name).collect();
    assert_eq!(
        names,
        TraceEvent::NAMES.iter().copied().collect(),
        "one of every event"
    );
    for rec in records() {
        let back = through_a_line(rec.clone());
        assert_eq!(back, rec);
    }
}

#[test]
fn every_message_view_carries_every_field_of_its_message() {
    let msgs = messages();
    let names: BTreeSet<&str> = msgs.iter().map(msg_name).collect();
    assert_eq!(names.len(), msgs.len(), "one of every message");
    for m in &msgs {
        let view = MsgView::of(m);
        // The message's own fields, as its wire form has them (a write's under its
        // kind, as a message's are).
        let wire = match m {
            Carried::Msg(m) => serde_json::to_value(m),
            Carried::Write(w) => {
                serde_json::to_value(w).map(|w| serde_json::json!({ "KvWrite": w }))
            }
        }
        .expect("a message serializes");
        let (kind, fields) = wire
            .as_object()
            .and_then(|o| o.iter().next())
            .expect("tagged");
        let mut want = fields.as_object().cloned().unwrap_or_default();
        if let Some(p) = want.remove("prompt") {
            let len = p.as_array().map_or(0, Vec::len);
            want.insert("prompt_len".into(), serde_json::json!(len));
        }
        want.remove("kv");
        let mut got = serde_json::to_value(&view).expect("a view serializes");
        let got = got.as_object_mut().expect("an object");
        assert_eq!(got.remove("kind"), Some(serde_json::json!(kind)), "{kind}");
        assert_eq!(
            *got, want,
            "{kind}: the trace view differs from the message"
        );
        assert_eq!(view.room(), room_of(m), "{kind}");
        // And the view survives its line.
        let rec = Record::Deliver {
            from: N,
            to: M,
            msg: view.clone(),
        };
        assert_eq!(through_a_line(rec.clone()), rec, "{kind}");
    }
}

fn room_of(m: &Carried<u8>) -> Option<RoomKey> {
    let m = match m {
        Carried::Write(w) => return Some(w.id.room),
        Carried::Msg(m) => m,
    };
    match m {
        Msg::Submit { .. } | Msg::Cancel { .. } | Msg::Response { .. } => None,
        Msg::WriteDone { id, .. } | Msg::KvRead { id, .. } => Some(id.room),
        Msg::KvParams { room, .. }
        | Msg::PullStart { room, .. }
        | Msg::ReadNotify { room, .. }
        | Msg::Heartbeat { room }
        | Msg::Register { room }
        | Msg::Registered { room, .. }
        | Msg::PrefillDone { room, .. }
        | Msg::PrefillStart { room, .. }
        | Msg::DecodeStart { room, .. }
        | Msg::Abort { room }
        | Msg::KvMeta { room, .. }
        | Msg::DrainRequest { room }
        | Msg::KvDone { room, .. }
        | Msg::DrainAck { room }
        | Msg::PrefillFinished { room, .. }
        | Msg::TokenOut { room, .. }
        | Msg::DecodeFinished { room, .. } => Some(*room),
    }
}

/// The engine names its events' fields as the schema does: every event's JSON keys are
/// the ones `docs/trace.schema.json` lists for it (no more, no fewer).
#[test]
fn every_event_has_exactly_the_fields_the_schema_lists() {
    let schema: serde_json::Value =
        serde_json::from_str(include_str!("../../docs/trace.schema.json")).expect("schema");
    let variants = schema["oneOf"].as_array().expect("oneOf");
    for ev in events() {
        let line = serde_json::to_value(Entry {
            at_ns: 1,
            seq: 1,
            rec: Record::Engine(ev.clone()),
        })
        .expect("json");
        let keys: BTreeSet<&str> = line
            .as_object()
            .expect("object")
            .keys()
            .map(String::as_str)
            .collect();
        let entry = variants
            .iter()
            .find(|v| v["properties"]["event"]["const"] == ev.name())
            .unwrap_or_else(|| panic!("the schema lacks {}", ev.name()));
        let listed: BTreeSet<&str> = entry["properties"]
            .as_object()
            .expect("properties")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, listed, "{}", ev.name());
    }
}

/// The schema's closed sets are the engine's: the bug switches and the invariants it
/// lists are exactly the engine's, so a new switch or invariant must be added there.
#[test]
fn the_schemas_closed_sets_are_the_engines() {
    let schema: serde_json::Value =
        serde_json::from_str(include_str!("../../docs/trace.schema.json")).expect("schema");
    let strings = |v: &serde_json::Value| -> BTreeSet<String> {
        v.as_array()
            .expect("an enum")
            .iter()
            .filter_map(|s| s.as_str().map(str::to_string))
            .collect()
    };
    let bugs = strings(&schema["oneOf"][0]["properties"]["bugs"]["items"]["enum"]);
    let want: BTreeSet<String> = kvsim_engine::bugs::Bug::ALL
        .iter()
        .map(|b| b.name().to_string())
        .collect();
    assert_eq!(bugs, want, "header.bugs");
    let violation = schema["oneOf"]
        .as_array()
        .expect("oneOf")
        .iter()
        .find(|v| v["properties"]["type"]["const"] == "violation")
        .expect("the violation record");
    let invs = strings(&violation["properties"]["violation"]["properties"]["invariant"]["enum"]);
    let want: BTreeSet<String> = Invariant::ALL.iter().map(|i| i.to_string()).collect();
    assert_eq!(invs, want, "violation.invariant");
}

/// One of every reason (exhaustive: a new variant must be added here and to the schema).
fn whys() -> Vec<Why> {
    let side = Side::Prefill;
    let all = vec![
        Why::PromptTooLong {
            tokens: 700,
            limit: 512,
        },
        Why::ReplyTooLong {
            tokens: 700,
            new_tokens: 9,
            limit: 512,
        },
        Why::QueueFull { side },
        Why::NodeStopped { side },
        Why::RejectedAtIntake,
        Why::TransferRefused,
        Why::TransferFailed,
        Why::InvalidRequest {
            max_new_tokens_limit: 64,
        },
        Why::NoRoom,
        Why::Timeout,
        Why::DeviceFailed { side },
    ];
    for w in &all {
        match w {
            Why::PromptTooLong { .. }
            | Why::ReplyTooLong { .. }
            | Why::QueueFull { .. }
            | Why::NodeStopped { .. }
            | Why::RejectedAtIntake
            | Why::TransferRefused
            | Why::TransferFailed
            | Why::InvalidRequest { .. }
            | Why::NoRoom
            | Why::Timeout
            | Why::DeviceFailed { .. } => {}
        }
    }
    all
}

/// The keys of `v`'s object, and the keys a schema variant lists.
fn keys(v: &serde_json::Value) -> BTreeSet<String> {
    v.as_object().expect("an object").keys().cloned().collect()
}

/// Every message view and every reason a view carries has exactly the fields
/// `docs/trace.schema.json` lists for it, every one of them required; a view written
/// without the reason (a trace from before it) reads as one without a reason.
#[test]
fn every_message_view_and_reason_has_exactly_the_fields_the_schema_lists() {
    let schema: serde_json::Value =
        serde_json::from_str(include_str!("../../docs/trace.schema.json")).expect("schema");
    let listed = |defs: &str, tag: &str, name: &str| -> (BTreeSet<String>, BTreeSet<String>) {
        let v = schema["$defs"][defs]["oneOf"]
            .as_array()
            .expect("oneOf")
            .iter()
            .find(|v| v["properties"][tag]["const"] == name)
            .unwrap_or_else(|| panic!("the schema's {defs} lacks {name}"));
        let required = v["required"]
            .as_array()
            .expect("required")
            .iter()
            .map(|k| k.as_str().expect("a name").to_string())
            .collect();
        (keys(&v["properties"]), required)
    };
    for m in messages() {
        let view = serde_json::to_value(MsgView::of(&m)).expect("json");
        let (props, required) = listed("msg", "kind", msg_name(&m));
        assert_eq!(keys(&view), props, "{}", msg_name(&m));
        assert_eq!(props, required, "{}: every field required", msg_name(&m));
    }
    let variants = schema["$defs"]["why"]["oneOf"].as_array().expect("oneOf");
    assert_eq!(
        variants.len(),
        whys().len(),
        "one schema variant per reason"
    );
    for w in whys() {
        let v = serde_json::to_value(w).expect("json");
        // A reason without fields is its name; one with fields, `{name: {fields}}`.
        let found = match &v {
            serde_json::Value::String(name) => variants.iter().any(|s| s["const"] == *name),
            serde_json::Value::Object(o) => {
                let (name, fields) = o.iter().next().expect("tagged");
                variants.iter().any(|s| {
                    let inner = &s["properties"][name];
                    inner.is_object()
                        && keys(&inner["properties"]) == keys(fields)
                        && inner["required"].as_array().map(Vec::len) == Some(keys(fields).len())
                })
            }
            other => panic!("{other}"),
        };
        assert!(found, "the schema lists {v} with exactly its fields");
        let back: Why = serde_json::from_value(v).expect("reads back");
        assert_eq!(back, w);
        assert!(!w.to_string().is_empty());
    }
    let old = r#"{"kind":"DecodeFinished","room":{"room":3,"gen":11},"status":500}"#;
    match serde_json::from_str::<MsgView>(old).expect("an old view reads") {
        MsgView::DecodeFinished { why, .. } => assert_eq!(why, None),
        other => panic!("{other:?}"),
    }
}
