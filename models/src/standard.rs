//! The standard models: their names, what each explores and its bounds, and the
//! reduced (`-small`) bounds the default `cargo test` runs.
//!
//! Only the catalogue: the types of a spec, the engine configuration the models share
//! ([`model_engine`]) and the checks of a spec are [`crate::spec`]'s. A private module:
//! its items are inherent items of [`ModelSpec`], reached as `ModelSpec::handoff()`.

use crate::model::names;
use crate::spec::{model_engine, ClientSpec, FaultBounds, ModelSpec, Nodes, SpecError};
use kvsim_engine::config::RouterPolicy;

impl ModelSpec {
    /// The standard models, by name.
    pub const NAMES: [&'static str; 28] = [
        "handoff",
        "abort-race",
        "timeout-race",
        "crash-race",
        "data-fault",
        "timer-refire",
        "stale-control",
        "handoff-small",
        "abort-race-small",
        "crash-race-small",
        "data-fault-small",
        "timer-refire-small",
        "stale-control-small",
        "retry-race",
        "retry-race-small",
        "pause-race",
        "pause-race-small",
        "two-by-two",
        "two-by-two-small",
        "prefix-hit",
        "vllm-pull",
        "vllm-lease-race",
        "vllm-ranks",
        "worker-front",
        "vllm-crash",
        "failed-room",
        "client-rooms",
        "nixl-race",
    ];

    /// The standard models `kvsim check --model all` exhausts (the small ones are
    /// their reduced bounds for the default `cargo test`). The fault-kind models
    /// (`data-fault`, `timer-refire`, `stale-control`) are checked by name: the full
    /// `timer-refire` alone takes minutes.
    pub const STANDARD: [&'static str; 4] = ["handoff", "abort-race", "timeout-race", "crash-race"];

    /// `handoff`: one prefill (3 pages of 2 tokens), one decode (4 pages), two
    /// interchangeable requests of 3 tokens and one of 7 tokens that exceeds the
    /// prefill pool (6 tokens) but fits decode's, all under a context of 16 tokens.
    /// Faults: one lost and one overtaking control message; timers fire in any order
    /// once nothing else can happen. (Failed KV writes, disconnects and premature
    /// timeouts are `abort-race`'s and `timeout-race`'s: adding any of them here
    /// multiplies the space past a minute.)
    pub fn handoff() -> ModelSpec {
        ModelSpec {
            name: "handoff".into(),
            about: "1 prefill (3 pages of 2 tokens), 1 decode (4 pages), context 16; two \
                    interchangeable 3-token requests and one over-length 7-token request; at \
                    most 1 lost and 1 overtaking control message"
                .into(),
            engine: model_engine(),
            nodes: Nodes::ONE_EACH,
            prefill_pages: 3,
            decode_pages: 4,
            clients: vec![
                ClientSpec::normal(1, 3),
                ClientSpec::normal(1, 3),
                ClientSpec::normal(2, 7),
            ],
            faults: FaultBounds {
                losses: 1,
                overtakes: 1,
                ..FaultBounds::default()
            },
            reaches: vec![names::COMPLETES, names::REJECTED, names::LATE_ACK],
            detections_hold: false,
        }
    }

    /// `handoff-small`: the reduced bounds the default `cargo test` runs: one 3-token
    /// request and the over-length one; one lost and one overtaking control message.
    pub fn handoff_small() -> ModelSpec {
        ModelSpec {
            name: "handoff-small".into(),
            about: "1 prefill (3 pages of 2 tokens), 1 decode (4 pages), context 16; one \
                    3-token request and one over-length 7-token request; at most 1 lost and \
                    1 overtaking control message"
                .into(),
            clients: vec![ClientSpec::normal(1, 3), ClientSpec::normal(2, 7)],
            faults: FaultBounds {
                losses: 1,
                overtakes: 1,
                ..FaultBounds::default()
            },
            reaches: vec![names::COMPLETES, names::REJECTED, names::LATE_ACK],
            ..ModelSpec::handoff()
        }
    }

    /// `abort-race`: decode's pool (2 pages) holds one request at a time, so the
    /// second request reuses exactly the pages of the first, whose client may
    /// disconnect at every point of its transfer (two one-page KV writes, both may be
    /// in flight). One KV write may fail and one control message may be delivered twice.
    pub fn abort_race() -> ModelSpec {
        ModelSpec {
            name: "abort-race".into(),
            about: "1 prefill (2 pages), 1 decode (2 pages: one request at a time), context \
                    16; a 3-token request whose client may disconnect at any point, and a \
                    second 3-token request that reuses its pages; at most 1 failed KV write \
                    and 1 duplicated control message"
                .into(),
            engine: model_engine(),
            nodes: Nodes::ONE_EACH,
            prefill_pages: 2,
            decode_pages: 2,
            clients: vec![
                ClientSpec::normal(1, 3).aborting(),
                ClientSpec::normal(2, 3),
            ],
            faults: FaultBounds {
                write_failures: 1,
                duplicates: 1,
                ..FaultBounds::default()
            },
            reaches: vec![names::COMPLETES, names::ABORT_RACE],
            detections_hold: false,
        }
    }

    /// `timeout-race`: `abort-race`'s pools with two interchangeable requests and no
    /// disconnects, where one timeout may fire prematurely (while a message is still in
    /// flight or a scheduler tick pending: the network was slower than the timer) and
    /// one KV write may fail. This is where a waiting, bootstrap, request or drain
    /// timeout races a transfer.
    pub fn timeout_race() -> ModelSpec {
        ModelSpec {
            name: "timeout-race".into(),
            about: "1 prefill (2 pages), 1 decode (2 pages), context 16; two interchangeable \
                    3-token requests; at most 1 premature timeout and 1 failed KV write"
                .into(),
            clients: vec![ClientSpec::normal(1, 3), ClientSpec::normal(1, 3)],
            faults: FaultBounds {
                write_failures: 1,
                early_timeouts: 1,
                ..FaultBounds::default()
            },
            reaches: vec![names::COMPLETES, names::ABORT_RACE, names::LATE_ACK],
            ..ModelSpec::abort_race()
        }
    }

    /// `abort-race-small`: the reduced bounds of `abort-race`: no write failure, and
    /// the prompt goes in one write.
    pub fn abort_race_small() -> ModelSpec {
        let mut engine = model_engine();
        engine.chunk_pages = 2;
        ModelSpec {
            name: "abort-race-small".into(),
            about: "abort-race with each prompt in one KV write and no failed write".into(),
            engine,
            faults: FaultBounds::default(),
            ..ModelSpec::abort_race()
        }
    }

    /// `crash-race`: `abort-race` (a request whose client may disconnect at any point,
    /// a second one of another tenant that reuses its decode pages, one duplicated
    /// control message) with, instead of a failed write, one crash of the prefill or
    /// the decode node at any point while anything else can still happen (restarting
    /// at once into a new incarnation whose page generations lie in a new epoch).
    pub fn crash_race() -> ModelSpec {
        ModelSpec {
            name: "crash-race".into(),
            about: "1 prefill (2 pages), 1 decode (2 pages: one request at a time), context \
                    16; a 3-token request whose client may disconnect at any point and a \
                    second 3-token request of another tenant; at most 1 crash (with restart) \
                    of the prefill or the decode node and 1 duplicated control message"
                .into(),
            clients: vec![
                ClientSpec::normal(1, 3).aborting(),
                ClientSpec::normal(2, 3),
            ],
            faults: FaultBounds {
                crashes: 1,
                duplicates: 1,
                ..FaultBounds::default()
            },
            reaches: vec![names::COMPLETES, names::CRASH],
            ..ModelSpec::abort_race()
        }
    }

    /// `crash-race-small`: the reduced bounds of `crash-race`: one request (that does
    /// not disconnect), sent in one KV write; still one crash and one duplicate.
    pub fn crash_race_small() -> ModelSpec {
        let mut engine = model_engine();
        engine.chunk_pages = 2;
        ModelSpec {
            name: "crash-race-small".into(),
            about: "crash-race with one request that stays connected, its prompt in one KV \
                    write"
                .into(),
            engine,
            clients: vec![ClientSpec::normal(1, 3)],
            ..ModelSpec::crash_race()
        }
    }

    /// `data-fault`: `abort-race`'s clients (a 3-token request whose client may
    /// disconnect at any point, a second one of another tenant; each prompt in two
    /// one-page KV writes) with a decode pool of 4 pages that holds both requests at
    /// once, so a misdirected page can land in the other request's page, where up to
    /// two data faults strike KV writes, each kind `world::DataFault::ALL` defines
    /// (corrupted, misdirected, torn, applied by `world::alter`; a stale duplicate: a
    /// copy of a landed write that lands again later), and no other fault.
    /// The defenses must act here (verification's checksum, the page tags): a hazard a
    /// defense stopped holds ([`ModelSpec::detections_hold`]), and the model must
    /// reach one.
    pub fn data_fault() -> ModelSpec {
        ModelSpec {
            name: "data-fault".into(),
            about: "1 prefill (2 pages), 1 decode (4 pages: both requests at once), context \
                    16; a 3-token request whose client may disconnect at any point and a \
                    second 3-token request of another tenant, one-page KV writes; at most 2 \
                    data faults (corrupt, misdirect, torn, stale duplicate); a hazard a \
                    defense stops is not a violation"
                .into(),
            decode_pages: 4,
            faults: FaultBounds {
                data_faults: 2,
                ..FaultBounds::default()
            },
            reaches: vec![
                names::COMPLETES,
                names::ABORT_RACE,
                names::ALTERED,
                names::STOPPED,
            ],
            detections_hold: true,
            ..ModelSpec::abort_race()
        }
    }

    /// `data-fault-small`: `data-fault` with one altered write.
    pub fn data_fault_small() -> ModelSpec {
        ModelSpec {
            name: "data-fault-small".into(),
            about: "data-fault with at most 1 data fault".into(),
            faults: FaultBounds {
                data_faults: 1,
                ..FaultBounds::default()
            },
            ..ModelSpec::data_fault()
        }
    }

    /// `timer-refire`: `timeout-race`'s pools and two interchangeable requests, each
    /// prompt in one KV write, where up to two timeouts fire prematurely, one KV write
    /// may fail (a quarantine and its drain retries), and one timer that already fired
    /// or was cancelled is delivered again (a timer wheel that delivers a stale entry:
    /// the node gets the same timer input a second time).
    pub fn timer_refire() -> ModelSpec {
        let mut engine = model_engine();
        engine.chunk_pages = 2;
        ModelSpec {
            name: "timer-refire".into(),
            about: "1 prefill (2 pages), 1 decode (2 pages), context 16; two interchangeable \
                    3-token requests, each prompt in one KV write; at most 2 premature \
                    timeouts, 1 failed KV write and 1 spent timer delivered again"
                .into(),
            engine,
            faults: FaultBounds {
                early_timeouts: 2,
                write_failures: 1,
                timer_refires: 1,
                ..FaultBounds::default()
            },
            reaches: vec![names::COMPLETES, names::LATE_ACK, names::REFIRED],
            ..ModelSpec::timeout_race()
        }
    }

    /// `timer-refire-small`: `timer-refire` with one premature timeout.
    pub fn timer_refire_small() -> ModelSpec {
        ModelSpec {
            name: "timer-refire-small".into(),
            about: "timer-refire with at most 1 premature timeout".into(),
            faults: FaultBounds {
                early_timeouts: 1,
                write_failures: 1,
                timer_refires: 1,
                ..FaultBounds::default()
            },
            ..ModelSpec::timer_refire()
        }
    }

    /// `stale-control`: `abort-race` with one room number (`max_rooms` 1), so the
    /// second request reuses the first one's room number as well as its decode pages,
    /// and up to two duplicated control messages: a message of the number's first use
    /// can be delivered again after the second use began. One KV write may fail (the
    /// path to a quarantine and its drain).
    pub fn stale_control() -> ModelSpec {
        let mut engine = model_engine();
        engine.max_rooms = 1;
        ModelSpec {
            name: "stale-control".into(),
            about: "abort-race with one room number (the second request reuses it) and at \
                    most 2 duplicated control messages and 1 failed KV write"
                .into(),
            engine,
            faults: FaultBounds {
                write_failures: 1,
                duplicates: 2,
                ..FaultBounds::default()
            },
            ..ModelSpec::abort_race()
        }
    }

    /// `stale-control-small`: `stale-control` with each prompt in one KV write.
    pub fn stale_control_small() -> ModelSpec {
        let mut engine = model_engine();
        engine.max_rooms = 1;
        engine.chunk_pages = 2;
        ModelSpec {
            name: "stale-control-small".into(),
            about: "stale-control with each prompt in one KV write".into(),
            engine,
            ..ModelSpec::stale_control()
        }
    }

    /// `retry-race`: the real router's policy (`sglang-router`, SGLang's gateway 0.3.2):
    /// no cancel of the other half, a retryable answer or a request timeout starts a new
    /// attempt in a new room (up to five). Decode's pool (2 pages) holds one request at a
    /// time, so a retry's decode half waits for the pages the first attempt's half still
    /// holds; the client may disconnect at any step (both halves of its current attempt
    /// are told to abort). One premature timeout (so the router gives an attempt up while
    /// its halves are live) and one duplicated control message.
    pub fn retry_race() -> ModelSpec {
        let mut engine = model_engine();
        engine.router = RouterPolicy::SglangRouter;
        ModelSpec {
            name: "retry-race".into(),
            about: "sglang-router policy; 1 prefill (2 pages), 1 decode (2 pages: one request \
                    at a time), context 16; one 3-token request whose client may disconnect at \
                    any point, retried in a new room while the first attempt's halves are live; \
                    at most 1 premature timeout and 1 duplicated control message"
                .into(),
            engine,
            nodes: Nodes::ONE_EACH,
            prefill_pages: 2,
            decode_pages: 2,
            clients: vec![ClientSpec::normal(1, 3).aborting()],
            faults: FaultBounds {
                early_timeouts: 1,
                duplicates: 1,
                ..FaultBounds::default()
            },
            reaches: vec![names::COMPLETES, names::ABORT_RACE, names::RETRIED_LIVE],
            detections_hold: false,
        }
    }

    /// `retry-race-small`: `retry-race` with the prompt in one KV write and no duplicate.
    pub fn retry_race_small() -> ModelSpec {
        let mut spec = ModelSpec::retry_race();
        spec.name = "retry-race-small".into();
        spec.about = "retry-race with the prompt in one KV write and no duplicated message".into();
        spec.engine.chunk_pages = 2;
        spec.faults.duplicates = 0;
        spec
    }

    /// `pause-race`: `abort-race`'s pools (decode holds one request at a time, so
    /// the second request, of another tenant, reuses exactly the first one's pages),
    /// each prompt in two one-page KV writes, with one pause of the prefill or the
    /// decode node at any point and its wake at any later point: the other nodes'
    /// timers fire as on time while it is frozen (decode's waiting timer while
    /// prefill is frozen mid-transfer, prefill's bootstrap timer while decode is),
    /// the frozen node's timers are overdue when it wakes, and one-sided KV writes
    /// land in a frozen decode. No timeout fires early otherwise: every race here is
    /// the pause's.
    pub fn pause_race() -> ModelSpec {
        ModelSpec {
            name: "pause-race".into(),
            about: "1 prefill (2 pages), 1 decode (2 pages: one request at a time), context \
                    16; two 3-token requests of two tenants, each prompt in two KV writes; \
                    at most 1 pause (with its wake) of the prefill or the decode node"
                .into(),
            clients: vec![ClientSpec::normal(1, 3), ClientSpec::normal(2, 3)],
            faults: FaultBounds {
                pauses: 1,
                ..FaultBounds::default()
            },
            reaches: vec![names::COMPLETES, names::FROZEN_TIMEOUT, names::LATE_ACK],
            ..ModelSpec::abort_race()
        }
    }

    /// `pause-race-small`: `pause-race` with one request, its prompt in one KV write
    /// (the pause still races every timer of the handoff).
    pub fn pause_race_small() -> ModelSpec {
        let mut spec = ModelSpec::pause_race();
        spec.name = "pause-race-small".into();
        spec.about = "pause-race with one request, its prompt in one KV write".into();
        spec.engine.chunk_pages = 2;
        spec.clients.truncate(1);
        spec
    }

    /// `prefix-hit`: prefill's radix cache hits the first page of a 7-token prompt
    /// (4 pages of 2 tokens) on a chunk grid of two pages (sglang #30545): the first
    /// KV write carries the cached page with the first computed chunk (3 pages), the
    /// second the last page, off the grid. One prefill and one decode of 4 pages each;
    /// one KV write may fail. Small enough for the default `cargo test` as it is.
    pub fn prefix_hit() -> ModelSpec {
        let mut engine = model_engine();
        engine.chunk_pages = 2;
        engine.prefix_hit_pages = 1;
        ModelSpec {
            name: "prefix-hit".into(),
            about: "1 prefill, 1 decode (4 pages of 2 tokens each), context 16, chunks of 2 \
                    pages; one 7-token request whose first page prefill's cache holds; at \
                    most 1 failed KV write"
                .into(),
            engine,
            nodes: Nodes::ONE_EACH,
            prefill_pages: 4,
            decode_pages: 4,
            clients: vec![ClientSpec::normal(1, 7)],
            faults: FaultBounds {
                write_failures: 1,
                ..FaultBounds::default()
            },
            reaches: vec![names::COMPLETES],
            detections_hold: false,
        }
    }

    /// `two-by-two`: the real topology, 2 prefill and 2 decode nodes, under the real
    /// gateway's policy (`sglang-router`: pairs taken round robin, no cancel of the
    /// other half, a retryable answer or a request timeout retried in a new room, up to
    /// five attempts). Each decode pool (2 pages) holds one request at a time, so the
    /// third of three interchangeable 3-token requests (each prompt in one KV write)
    /// waits for the pages of the first on its pair. One timeout may fire prematurely
    /// (an attempt is given up and retried on the other pair while its halves are
    /// live) and one KV write may fail (decode fails the transfer, the router retries
    /// the 500 in a new room). Exhausted with the symmetry reduction over the
    /// requests (`--symmetry`): about 29 million states against some 170 million
    /// without it (docs/PERFORMANCE.md).
    pub fn two_by_two() -> ModelSpec {
        let mut engine = model_engine();
        engine.router = RouterPolicy::SglangRouter;
        engine.chunk_pages = 2;
        ModelSpec {
            name: "two-by-two".into(),
            about: "sglang-router policy; 2 prefill nodes (2 pages each), 2 decode nodes (2 \
                    pages each: one request at a time), context 16; three interchangeable \
                    3-token requests, each prompt in one KV write; at most 1 premature \
                    timeout and 1 failed KV write"
                .into(),
            engine,
            nodes: Nodes {
                prefill: 2,
                decode: 2,
                fronts: false,
            },
            prefill_pages: 2,
            decode_pages: 2,
            clients: vec![ClientSpec::normal(1, 3); 3],
            faults: FaultBounds {
                early_timeouts: 1,
                write_failures: 1,
                ..FaultBounds::default()
            },
            reaches: vec![names::COMPLETES, names::RETRIED_LIVE, names::SPREAD],
            detections_hold: false,
        }
    }

    /// `two-by-two-small`: `two-by-two` with no fault (the default `cargo test`
    /// exhausts it, with and without the reduction): the third request still waits
    /// for the first one's decode pages on its pair.
    pub fn two_by_two_small() -> ModelSpec {
        let mut spec = ModelSpec::two_by_two();
        spec.name = "two-by-two-small".into();
        spec.about = "two-by-two with no fault".into();
        spec.faults = FaultBounds::default();
        spec.reaches = vec![names::COMPLETES, names::SPREAD];
        spec
    }

    /// `worker-front`: `retry-race-small` in worker mode: the prefill and the decode
    /// node each behind its SGLang worker front, the `sglang-router` policy reaching
    /// them only through the fronts (a start or an abort is the front's; its answer
    /// goes back as the half's message; an abort of a half the front no longer has is
    /// the router's closed connection). One 3-token request whose client may
    /// disconnect at any point, at most 1 premature timeout.
    pub fn worker_front() -> ModelSpec {
        let mut spec = ModelSpec::retry_race_small();
        spec.name = "worker-front".into();
        spec.about = "retry-race-small with each node behind its SGLang worker front".into();
        spec.nodes.fronts = true;
        spec
    }

    /// `nixl-race`: KV over NIXL (`KvTransport::Nixl`, the measured row of NIXL 1.5.1
    /// over UCX/TCP): `crash-race-small` (one request, its prompt in one KV write) with
    /// one crash (with restart) of the prefill or the decode node and one pause
    /// (SIGSTOP, then SIGCONT) of either at any point, and no duplicated message. On
    /// NIXL a write prefill posts through the page list of decode's earlier
    /// incarnation lands in the restarted one's memory (on RDMA it fails back), and a
    /// write to a stopped decode waits for its progress thread, with no transport
    /// timeout: only the engine's own timers end a room. (With a second request of
    /// another tenant the model has 11,631,925 states, 283 s: too many for the
    /// default `cargo test`.)
    pub fn nixl_race() -> ModelSpec {
        let mut spec = ModelSpec::crash_race_small();
        spec.name = "nixl-race".into();
        spec.about = "crash-race-small over NIXL: at most 1 crash (with restart) and 1 pause \
                      of the prefill or the decode node, no duplicated message"
            .into();
        spec.engine.transport = kvsim_engine::world::KvTransport::Nixl;
        spec.faults = FaultBounds {
            crashes: 1,
            pauses: 1,
            ..FaultBounds::default()
        };
        spec.reaches = vec![names::COMPLETES, names::CRASH, names::FROZEN_TIMEOUT];
        spec
    }

    /// A standard model by name.
    pub fn standard(name: &str) -> Result<ModelSpec, SpecError> {
        match name {
            "handoff" => Ok(ModelSpec::handoff()),
            "handoff-small" => Ok(ModelSpec::handoff_small()),
            "abort-race" => Ok(ModelSpec::abort_race()),
            "timeout-race" => Ok(ModelSpec::timeout_race()),
            "abort-race-small" => Ok(ModelSpec::abort_race_small()),
            "crash-race" => Ok(ModelSpec::crash_race()),
            "crash-race-small" => Ok(ModelSpec::crash_race_small()),
            "data-fault" => Ok(ModelSpec::data_fault()),
            "data-fault-small" => Ok(ModelSpec::data_fault_small()),
            "timer-refire" => Ok(ModelSpec::timer_refire()),
            "timer-refire-small" => Ok(ModelSpec::timer_refire_small()),
            "stale-control" => Ok(ModelSpec::stale_control()),
            "stale-control-small" => Ok(ModelSpec::stale_control_small()),
            "retry-race" => Ok(ModelSpec::retry_race()),
            "retry-race-small" => Ok(ModelSpec::retry_race_small()),
            "pause-race" => Ok(ModelSpec::pause_race()),
            "pause-race-small" => Ok(ModelSpec::pause_race_small()),
            "two-by-two" => Ok(ModelSpec::two_by_two()),
            "two-by-two-small" => Ok(ModelSpec::two_by_two_small()),
            "prefix-hit" => Ok(ModelSpec::prefix_hit()),
            "vllm-pull" => Ok(ModelSpec::vllm_pull()),
            "vllm-lease-race" => Ok(ModelSpec::vllm_lease_race()),
            "vllm-ranks" => Ok(ModelSpec::vllm_ranks()),
            "worker-front" => Ok(ModelSpec::worker_front()),
            "vllm-crash" => Ok(ModelSpec::vllm_crash()),
            "failed-room" => Ok(ModelSpec::failed_room()),
            "client-rooms" => Ok(ModelSpec::client_rooms()),
            "nixl-race" => Ok(ModelSpec::nixl_race()),
            other => Err(SpecError::UnknownModel(other.to_string())),
        }
    }
}
