//! The trace schema (version [`SCHEMA_VERSION`]): what a run writes, line by line, so
//! that any checker can judge it.
//!
//! A trace is JSON Lines. The first line is a [`RunHeader`] (`"type": "header"`,
//! carrying `schema_version`); every other line is an [`Entry`]: a time, a sequence
//! number and a [`Record`]. Records are the engine's own events ([`TraceEvent`](kvsim_engine::trace::TraceEvent), tag
//! `event`) plus what the driver saw happen around the nodes: client submits, cancels
//! and responses, messages sent, delivered and dropped, KV writes that failed on the
//! wire, timers, crashes and restarts (with the writes a crash flushed), and one
//! closing [`Record::End`] that says whether the run drained. `docs/TRACE.md`
//! documents every field and `docs/trace.schema.json` is the machine-readable form.
//!
//! The schema is a contract: the oracle reads nothing but these lines, so a trace
//! written by another engine in this form is judged exactly as kvsim's own.

mod header;
mod line;
pub(crate) mod msg_view;
pub(crate) mod record;

pub use header::{ClockKind, NodeInfo, RunHeader, READS_VERSIONS, SCHEMA_VERSION};
pub use line::{entry_line, header_line, parse_line, Line, LineError};
pub use msg_view::{MsgView, Viewed};
pub use record::{CancelHow, EndOutcome, Entry, FaultEvent, Record};

#[cfg(test)]
mod tests {
    use super::*;
    use kvsim_engine::config::EngineConfig;
    use kvsim_engine::ids::{NodeId, RoomKey};
    use kvsim_engine::trace::TraceEvent;
    use kvsim_engine::world::Topology;

    /// Every engine event is documented in the contract and in its JSON Schema.
    #[test]
    fn every_engine_event_is_in_the_documented_schema() {
        let doc = include_str!("../../docs/TRACE.md");
        let json = include_str!("../../docs/trace.schema.json");
        assert!(doc.contains("schema, version 2") && json.contains("\"schema_version\""));
        for name in TraceEvent::NAMES {
            assert!(
                doc.contains(&format!("| `{name}` |")),
                "docs/TRACE.md lacks {name}"
            );
            assert!(
                json.contains(&format!("\"const\": \"{name}\"")),
                "docs/trace.schema.json lacks {name}"
            );
        }
    }

    /// A header from anywhere cannot make the oracle divide by zero or allocate
    /// without bound: each bad field is refused by name.
    #[test]
    fn hostile_headers_are_refused_by_field() {
        let topo = Topology {
            prefill_pools: vec![3],
            decode_pools: vec![4],
        };
        let good = RunHeader::new(
            "test",
            ClockKind::Simulated,
            &EngineConfig::default(),
            &topo,
        );
        type Spoil = fn(&mut RunHeader);
        let cases: [(&str, Spoil); 4] = [
            ("page_size", |h| h.page_size = 0),
            ("nodes[1].pool_pages", |h| {
                h.nodes[1].pool_pages = Some(u32::MAX)
            }),
            ("nodes[2].pool_pages", |h| h.nodes[2].pool_pages = None),
            ("nodes[2].id", |h| h.nodes[2].id = h.nodes[1].id),
        ];
        for (field, spoil) in cases {
            let mut h = good.clone();
            spoil(&mut h);
            let err = parse_line(&header_line(&h)).unwrap_err();
            assert!(err.0.contains(field), "{field}: {err}");
        }
        assert!(parse_line(&header_line(&good)).is_ok());
    }

    #[test]
    fn header_and_entries_round_trip() {
        let topo = Topology {
            prefill_pools: vec![3],
            decode_pools: vec![4],
        };
        let h = RunHeader::new(
            "test",
            ClockKind::Simulated,
            &EngineConfig::default(),
            &topo,
        );
        match parse_line(&header_line(&h)).unwrap() {
            Line::Header(back) => assert_eq!(*back, h),
            other => panic!("{other:?}"),
        }
        let e = Entry {
            at_ns: 5,
            seq: 2,
            rec: Record::Engine(TraceEvent::DrainAcked {
                node: NodeId(1),
                room: RoomKey::new(1, 2),
            }),
        };
        assert_eq!(parse_line(&entry_line(&e)).unwrap(), Line::Entry(e));
        let err = parse_line(r#"{"at_ns": 1, "seq": 1}"#).unwrap_err();
        assert!(err.0.contains("type"), "{err}");
        let err =
            parse_line(r#"{"type":"engine","at_ns":1,"seq":1,"event":"DrainAcked","node":1}"#)
                .unwrap_err();
        assert!(err.0.contains("room"), "{err}");
    }
}
