//! The standard models of issue 37's classes that need an environment of their own:
//! `failed-room` (class 6: no timer longer than the run) and `client-rooms` (class 2:
//! another party's start for a live room use). A private module, as `standard.rs`:
//! its items are inherent items of [`ModelSpec`], listed in [`ModelSpec::NAMES`].

use crate::model::names;
use crate::spec::{model_engine, ClientSpec, FaultBounds, ModelSpec, Nodes};
use kvsim_engine::config::RouterPolicy;

impl ModelSpec {
    /// `failed-room`: issue 37, class 6, under the real gateway's policy
    /// (`sglang-router`: it never cancels the half that did not fail). One prefill (3
    /// pages of 2 tokens) and one decode (4 pages): a 3-token request, and a 7-token
    /// one that prefill refuses at intake (over its pool) after decode reserved pages
    /// for it. The run lasts 300 ms ([`FaultBounds::horizon_ns`]): prefill's bootstrap
    /// timer (200 ms) and decode's drain retry (50 ms) may fire, decode's waiting
    /// timeout (400 ms) and the router's request timeout (2 s) never do, as SGLang's
    /// 300 s and 1800 s never do within a transfer. So decode must hear of the refusal
    /// from prefill to let its pages go. One page list may overtake its start (kept
    /// early, then answered when the start is refused).
    pub fn failed_room() -> ModelSpec {
        let mut engine = model_engine();
        engine.router = RouterPolicy::SglangRouter;
        ModelSpec {
            name: "failed-room".into(),
            about: "sglang-router policy; 1 prefill (3 pages of 2 tokens), 1 decode (4 pages), \
                    context 16; one 3-token request and one 7-token request prefill refuses \
                    after decode reserved pages; no timer longer than 300 ms fires (decode's \
                    waiting timeout, the router's request timeout); at most 1 overtaking \
                    control message"
                .into(),
            engine,
            nodes: Nodes::ONE_EACH,
            prefill_pages: 3,
            decode_pages: 4,
            clients: vec![ClientSpec::normal(1, 3), ClientSpec::normal(2, 7)],
            faults: FaultBounds {
                overtakes: 1,
                horizon_ns: Some(300_000_000),
                ..FaultBounds::default()
            },
            reaches: vec![names::COMPLETES],
            detections_hold: false,
        }
    }

    /// `client-rooms`: issue 37, class 2 (SGLang #40125): one prefill (3 pages of 2
    /// tokens), one decode (4 pages), one 3-token request, and at any point while the
    /// router waits on its room use, one start pair for that room use from a request
    /// of another party (a client of the worker API supplying the room, or a second
    /// gateway drawing it), from the router's address, with a 2-token prompt
    /// ([`FaultBounds::colliding_rooms`]). Each half must refuse a start naming another
    /// request for a room use it holds; a start reaching a half before the router's
    /// own is the room's first, and the router's is refused in its place.
    pub fn client_rooms() -> ModelSpec {
        ModelSpec {
            name: "client-rooms".into(),
            about: "1 prefill (3 pages of 2 tokens), 1 decode (4 pages), context 16; one \
                    3-token request; at most 1 start pair for its live room use from another \
                    party's request (a 2-token prompt), from the router's address"
                .into(),
            clients: vec![ClientSpec::normal(1, 3)],
            faults: FaultBounds {
                colliding_rooms: 1,
                ..FaultBounds::default()
            },
            reaches: vec![names::COMPLETES],
            ..ModelSpec::handoff()
        }
    }
}
