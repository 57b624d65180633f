//! The trace schema (version [`SCHEMA_VERSION`]): what a run writes, line by line, so
//! that any checker can judge it.
//!
//! A trace is JSON Lines. The first line is a [`RunHeader`] (`"type": "header"`,
//! carrying `schema_version`); every other line is an [`Entry`]: a time, a sequence
//! number and a [`Record`]. Records are the engine's own events ([`TraceEvent`], tag
//! `event`) plus what the driver saw happen around the nodes: client submits, cancels
//! and responses, messages sent, delivered and dropped, KV writes that failed on the
//! wire, timers, crashes and restarts (with the writes a crash flushed), and one
//! closing [`Record::End`] that says whether the run drained. `docs/TRACE.md`
//! documents every field and `docs/trace.schema.json` is the machine-readable form.
//!
//! The schema is a contract: the oracle reads nothing but these lines, so a trace
//! written by another engine in this form is judged exactly as kvsim's own.

use kvsim_engine::bugs::BugSet;
use kvsim_engine::config::{Defenses, EngineConfig};
use kvsim_engine::env::Timer;
use kvsim_engine::ids::{NodeId, PageId, PageTag, RequestId, RoomKey, TenantId, Token, WriteId};
use kvsim_engine::invariant::Violation;
use kvsim_engine::msg::{Msg, Status, TransferOutcome, Why};
use kvsim_engine::node::Role;
use kvsim_engine::trace::TraceEvent;
use kvsim_engine::world::{DataFault, DropReason, Topology, WriteFailure};
use serde::{Deserialize, Serialize};

/// The version of the schema this crate writes.
pub const SCHEMA_VERSION: u32 = 2;

/// The versions this crate reads: version 1 (whose `KvSent` does not name its
/// receiver) is judged as version 2 (`docs/TRACE.md`, "Versions").
pub const READS_VERSIONS: [u32; 2] = [1, 2];

/// Where a trace's timestamps come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClockKind {
    /// Simulated nanoseconds since the start of the run (the simulator, the model).
    Simulated,
    /// Wall-clock nanoseconds (a real server).
    Wall,
}

/// One node as the header declares it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub id: NodeId,
    pub role: Role,
    /// Pool size in pages (prefill and decode nodes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_pages: Option<u32>,
}

/// The first line of every trace: the facts about the run that no event states.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunHeader {
    pub schema_version: u32,
    /// Who wrote the trace (`kvsim-sim`, `kvsim-serve`, another engine's name).
    pub source: String,
    pub clock: ClockKind,
    /// The scenario and seed, when a simulator run wrote it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scenario: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Tokens per KV page.
    pub page_size: u32,
    /// The advertised context length, in tokens.
    pub context_len: u64,
    /// Prompts over a node's limit are cut to it instead of rejected.
    #[serde(default)]
    pub allow_auto_truncate: bool,
    /// Most pages in one KV write, and most writes in flight per room.
    pub chunk_pages: u32,
    pub max_inflight_chunks: u32,
    /// The defenses on (reported with the findings they catch).
    pub defenses: Defenses,
    /// The bug switches on (names).
    pub bugs: BugSet,
    /// Every node; a trace of one node of a larger deployment lists them all.
    pub nodes: Vec<NodeInfo>,
    /// The client endpoint's id, when clients are part of the trace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<NodeId>,
    /// Prompt token `t` belongs to request `(t >> 16) - 1` (kvsim's canary prompts), so
    /// a reply can be checked for tokens of another request.
    #[serde(default)]
    pub canary_tokens: bool,
    /// Every 200 reply is echo attention over the request's own prompt (kvsim's model):
    /// step `s` of `n` echoes the prompt token at `query_position(s, n, prompt_len)`.
    /// With `canary_tokens` the oracle then knows each reply exactly and checks it
    /// (S10, reply correctness).
    #[serde(default)]
    pub echo_replies: bool,
    /// Bounded cleanup (L6): after a request's terminal answer (`RouterResponse`),
    /// every node must have answered its half and let go of the room's pages (freed,
    /// or quarantined) within this many nanoseconds of the trace's clock. Absent: not
    /// checked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cleanup_bound_ns: Option<u64>,
}

impl RunHeader {
    /// The header of a run of `cfg` on `topology`.
    pub fn new(source: &str, clock: ClockKind, cfg: &EngineConfig, topology: &Topology) -> Self {
        RunHeader {
            schema_version: SCHEMA_VERSION,
            source: source.to_string(),
            clock,
            scenario: None,
            seed: None,
            page_size: cfg.page_size,
            context_len: cfg.context_len,
            allow_auto_truncate: cfg.allow_auto_truncate,
            chunk_pages: cfg.chunk_pages,
            max_inflight_chunks: cfg.max_inflight_chunks,
            defenses: cfg.defenses,
            bugs: cfg.bugs,
            nodes: topology
                .nodes()
                .into_iter()
                .map(|(id, role, pool_pages)| NodeInfo {
                    id,
                    role,
                    pool_pages,
                })
                .collect(),
            client: Some(topology.client()),
            canary_tokens: true,
            echo_replies: true,
            cleanup_bound_ns: None,
        }
    }

    /// The most pages a header may declare for one node: the oracle keeps a record per
    /// page, so a trace from anywhere must not make it allocate without bound.
    pub const MAX_POOL_PAGES: u32 = 1 << 24;
    /// The most nodes a header may declare.
    pub const MAX_NODES: usize = 4096;

    /// The relations a header must satisfy before anything is built from it, naming the
    /// field that breaks one.
    pub fn check(&self) -> Result<(), String> {
        if self.page_size == 0 {
            return Err("header: `page_size` must be at least 1".into());
        }
        if self.nodes.len() > Self::MAX_NODES {
            return Err(format!(
                "header: `nodes` lists {} nodes; at most {}",
                self.nodes.len(),
                Self::MAX_NODES
            ));
        }
        for (i, n) in self.nodes.iter().enumerate() {
            match (n.role, n.pool_pages) {
                (Role::Router, _) => {}
                (_, None) => {
                    return Err(format!(
                        "header: `nodes[{i}].pool_pages` is missing for a {:?} node",
                        n.role
                    ))
                }
                (_, Some(p)) if p == 0 || p > Self::MAX_POOL_PAGES => {
                    return Err(format!(
                        "header: `nodes[{i}].pool_pages` is {p}; a pool has 1 to {} pages",
                        Self::MAX_POOL_PAGES
                    ))
                }
                _ => {}
            }
            if self.nodes[..i].iter().any(|m| m.id == n.id) {
                return Err(format!("header: `nodes[{i}].id` {} appears twice", n.id));
            }
        }
        Ok(())
    }

    pub fn node(&self, id: NodeId) -> Option<&NodeInfo> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// The tokens a node's pool holds.
    pub fn pool_tokens(&self, id: NodeId) -> Option<u64> {
        self.node(id)
            .and_then(|n| n.pool_pages)
            .map(|p| u64::from(p) * u64::from(self.page_size))
    }

    /// The longest request (tokens) a node may admit: `min(context, pool)`.
    pub fn limit(&self, id: NodeId) -> u64 {
        self.pool_tokens(id)
            .map_or(self.context_len, |p| p.min(self.context_len))
    }
}

/// How a client gives up on a request. Both reach the router as a cancel; a
/// disconnected client no longer reads its answer (the oracle still checks it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum CancelHow {
    Abort,
    Disconnect,
}

/// A message as the trace shows it: every field but the KV payload and the prompt's
/// tokens (their count instead). The engine's own serde form of a message keeps both,
/// because that form travels on the wire; a trace must stay small.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind")]
pub enum MsgView {
    Submit {
        req: RequestId,
        tenant: TenantId,
        prompt_len: usize,
        max_new_tokens: u32,
    },
    Cancel {
        req: RequestId,
    },
    Response {
        req: RequestId,
        status: Status,
        tokens: Vec<Token>,
        /// The engine's reason for a status that is not 200, where it has one (`null`
        /// otherwise; absent in traces written before it was added: read as `null`).
        #[serde(default)]
        why: Option<Why>,
    },
    PrefillStart {
        room: RoomKey,
        req: RequestId,
        prompt_len: usize,
        decode: NodeId,
    },
    DecodeStart {
        room: RoomKey,
        req: RequestId,
        prompt_len: usize,
        max_new_tokens: u32,
        prefill: NodeId,
    },
    Abort {
        room: RoomKey,
    },
    KvMeta {
        room: RoomKey,
        dst: Vec<PageTag>,
        prompt_len: u64,
    },
    DrainRequest {
        room: RoomKey,
    },
    WriteDone {
        id: WriteId,
        ok: bool,
    },
    KvWrite {
        id: WriteId,
        src: Vec<PageTag>,
        dst: Vec<PageTag>,
    },
    KvDone {
        room: RoomKey,
        outcome: TransferOutcome,
        /// The decode incarnation whose page list the transfer served (absent in traces
        /// written before schema version 2 had it: read as 0).
        #[serde(default)]
        epoch: u32,
    },
    DrainAck {
        room: RoomKey,
    },
    PrefillFinished {
        room: RoomKey,
        status: Status,
        /// The engine's reason for a status that is not 200, where it has one (`null`
        /// otherwise; absent in traces written before it was added: read as `null`).
        #[serde(default)]
        why: Option<Why>,
    },
    TokenOut {
        room: RoomKey,
        index: u32,
        token: Token,
    },
    DecodeFinished {
        room: RoomKey,
        status: Status,
        /// The engine's reason for a status that is not 200, where it has one (`null`
        /// otherwise; absent in traces written before it was added: read as `null`).
        #[serde(default)]
        why: Option<Why>,
    },
}

impl MsgView {
    pub fn of<K>(m: &Msg<K>) -> MsgView {
        match m {
            Msg::Submit {
                req,
                tenant,
                prompt,
                max_new_tokens,
            } => MsgView::Submit {
                req: *req,
                tenant: *tenant,
                prompt_len: prompt.len(),
                max_new_tokens: *max_new_tokens,
            },
            Msg::Cancel { req } => MsgView::Cancel { req: *req },
            Msg::Response {
                req,
                status,
                tokens,
                why,
            } => MsgView::Response {
                req: *req,
                status: *status,
                tokens: tokens.clone(),
                why: *why,
            },
            Msg::PrefillStart {
                room,
                req,
                prompt,
                decode,
            } => MsgView::PrefillStart {
                room: *room,
                req: *req,
                prompt_len: prompt.len(),
                decode: *decode,
            },
            Msg::DecodeStart {
                room,
                req,
                prompt,
                max_new_tokens,
                prefill,
            } => MsgView::DecodeStart {
                room: *room,
                req: *req,
                prompt_len: prompt.len(),
                max_new_tokens: *max_new_tokens,
                prefill: *prefill,
            },
            Msg::Abort { room } => MsgView::Abort { room: *room },
            Msg::KvMeta {
                room,
                dst,
                prompt_len,
            } => MsgView::KvMeta {
                room: *room,
                dst: dst.clone(),
                prompt_len: *prompt_len,
            },
            Msg::DrainRequest { room } => MsgView::DrainRequest { room: *room },
            Msg::WriteDone { id, ok } => MsgView::WriteDone { id: *id, ok: *ok },
            Msg::KvWrite { id, src, dst, .. } => MsgView::KvWrite {
                id: *id,
                src: src.clone(),
                dst: dst.clone(),
            },
            Msg::KvDone {
                room,
                outcome,
                epoch,
            } => MsgView::KvDone {
                room: *room,
                outcome: outcome.clone(),
                epoch: *epoch,
            },
            Msg::DrainAck { room } => MsgView::DrainAck { room: *room },
            Msg::PrefillFinished { room, status, why } => MsgView::PrefillFinished {
                room: *room,
                status: *status,
                why: *why,
            },
            Msg::TokenOut { room, index, token } => MsgView::TokenOut {
                room: *room,
                index: *index,
                token: *token,
            },
            Msg::DecodeFinished { room, status, why } => MsgView::DecodeFinished {
                room: *room,
                status: *status,
                why: *why,
            },
        }
    }

    pub fn room(&self) -> Option<RoomKey> {
        use MsgView::*;
        match self {
            Submit { .. } | Cancel { .. } | Response { .. } => None,
            PrefillStart { room, .. }
            | DecodeStart { room, .. }
            | Abort { room }
            | KvMeta { room, .. }
            | DrainRequest { room }
            | KvDone { room, .. }
            | DrainAck { room }
            | PrefillFinished { room, .. }
            | TokenOut { room, .. }
            | DecodeFinished { room, .. } => Some(*room),
            WriteDone { id, .. } | KvWrite { id, .. } => Some(id.room),
        }
    }

    /// A one-line summary: the engine's own wording ([`Msg::summary`]) for the fields
    /// a view keeps.
    pub fn summary(&self) -> String {
        use MsgView::*;
        let tags = |t: &[PageTag]| kvsim_engine::ids::fmt_tags(t, 4);
        match self {
            Submit {
                req,
                tenant,
                prompt_len,
                max_new_tokens,
            } => format!("Submit {req} {tenant} prompt={prompt_len} max_new={max_new_tokens}"),
            Cancel { req } => format!("Cancel {req}"),
            Response {
                req,
                status,
                tokens,
                ..
            } => format!("Response {req} status={status} tokens={}", tokens.len()),
            PrefillStart {
                room,
                req,
                prompt_len,
                decode,
            } => format!("PrefillStart {room} {req} prompt={prompt_len} decode={decode}"),
            DecodeStart {
                room,
                req,
                prompt_len,
                max_new_tokens,
                prefill,
            } => format!(
                "DecodeStart {room} {req} prompt={prompt_len} max_new={max_new_tokens} prefill={prefill}"
            ),
            Abort { room } => format!("Abort {room}"),
            KvMeta {
                room,
                dst,
                prompt_len,
            } => format!("KvMeta {room} prompt={prompt_len} dst=[{}]", tags(dst)),
            DrainRequest { room } => format!("DrainRequest {room}"),
            WriteDone { id, ok } => format!("WriteDone {id} ok={ok}"),
            KvWrite { id, src, dst } => {
                format!("KvWrite {id} src=[{}] dst=[{}]", tags(src), tags(dst))
            }
            KvDone { room, outcome, .. } => format!("KvDone {room} {outcome:?}"),
            DrainAck { room } => format!("DrainAck {room}"),
            PrefillFinished { room, status, .. } => format!("PrefillFinished {room} status={status}"),
            TokenOut { room, index, token } => format!("TokenOut {room} #{index} token={token:#x}"),
            DecodeFinished { room, status, .. } => format!("DecodeFinished {room} status={status}"),
        }
    }
}

/// A fault of the world, as it strikes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "fault", rename_all = "snake_case")]
pub enum FaultEvent {
    PartitionStart {
        prefill: NodeId,
        decode: NodeId,
    },
    PartitionEnd {
        prefill: NodeId,
        decode: NodeId,
    },
    /// Incarnation `epoch` of `node` dies with its timers, queues and connections; the
    /// KV writes it had posted are flushed, never applied (`flushed`).
    Crash {
        node: NodeId,
        epoch: u32,
        #[serde(default)]
        flushed: Vec<WriteId>,
    },
    /// The node comes back as incarnation `epoch`: empty pool, KV memory not zeroed.
    Restart {
        node: NodeId,
        epoch: u32,
    },
    /// A KV write landed with a data fault (`world::alter`): its page meant for
    /// `meant` landed at `landed` (another page for a misdirect; the same page,
    /// corrupted or in part, otherwise). Its completion still reports success. Stated
    /// for people reading the trace; the oracle judges the landing from `KvLanded`
    /// and the reply (S10), never from this record.
    DataFault {
        from: NodeId,
        to: NodeId,
        write: WriteId,
        kind: DataFault,
        meant: PageTag,
        landed: PageTag,
    },
    /// The node freezes (a stall: GC, swap, SIGSTOP) until `until_ns`: its timers and
    /// the inputs that need its process wait until then; one-sided KV writes still
    /// land in its memory.
    Pause {
        node: NodeId,
        until_ns: u64,
    },
    /// The safety phase ends: no new faults from here on.
    Heal,
}

impl FaultEvent {
    /// The record of write `write` from `from` landing at `to` with the data fault
    /// `a` (what `world::alter` or `world::WriteHistory::duplicate` did): the one
    /// place every driver builds it.
    pub fn data_fault(
        from: NodeId,
        to: NodeId,
        write: WriteId,
        a: &kvsim_engine::world::Altered,
    ) -> Self {
        FaultEvent::DataFault {
            from,
            to,
            write,
            kind: a.fault,
            meant: a.meant,
            landed: a.landed,
        }
    }
}

/// How a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndOutcome {
    /// Nothing left to do: every message delivered, every timer fired or cancelled.
    Drained,
    /// The liveness phase's bound passed with work still pending.
    LivenessBound,
    /// The run's event limit was hit with work still pending.
    EventLimit,
    /// The trace was cut (a server stopped without draining, a trace of part of a run):
    /// liveness is not judged.
    Cut,
}

/// What one entry records.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Record {
    /// A client submits a request (its prompt, under `canary_tokens`, is the canary
    /// sequence of `req`).
    Submit {
        req: RequestId,
        tenant: TenantId,
        prompt_len: u64,
        max_new_tokens: u32,
    },
    /// A client gives up on a request.
    ClientCancel {
        req: RequestId,
        how: CancelHow,
        #[serde(default)]
        plan: String,
    },
    /// A node (or the client) sent a message; `deliver_at_ns` is when it is due.
    Send {
        from: NodeId,
        to: NodeId,
        msg: MsgView,
        deliver_at_ns: u64,
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        duplicate: bool,
    },
    /// A message reached its receiver, which handles it now.
    Deliver {
        from: NodeId,
        to: NodeId,
        msg: MsgView,
    },
    /// A message was not delivered.
    Drop {
        from: NodeId,
        to: NodeId,
        msg: MsgView,
        reason: DropReason,
    },
    /// A KV write failed on the wire and was not applied; its writer gets one failed
    /// completion.
    WriteFailed {
        from: NodeId,
        to: NodeId,
        write: WriteId,
        reason: WriteFailure,
    },
    TimerSet {
        node: NodeId,
        timer: Timer,
        fire_at_ns: u64,
    },
    TimerCancel {
        node: NodeId,
        timer: Timer,
    },
    TimerFire {
        node: NodeId,
        timer: Timer,
    },
    /// An engine event.
    Engine(TraceEvent),
    /// The client received its terminal response.
    Response {
        req: RequestId,
        status: Status,
        tokens: Vec<Token>,
    },
    Fault(FaultEvent),
    /// An oracle found an invariant broken, or a defense fire (written by the tool
    /// that judged the run; a checker ignores these and judges afresh).
    Violation {
        violation: Violation,
        #[serde(default)]
        detected_by: Option<String>,
        room: Option<RoomKey>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        related: Vec<RoomKey>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pages: Vec<(NodeId, PageId)>,
    },
    /// The last entry of a complete trace.
    End {
        outcome: EndOutcome,
        detail: String,
    },
}

/// One entry of a trace.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Nanoseconds: simulated (since the start) or wall-clock, as the header says.
    pub at_ns: u64,
    /// The driver's step number (one event taken off its queue, one input handled);
    /// entries of one step share it.
    pub seq: u64,
    #[serde(flatten)]
    pub rec: Record,
}

/// The header line as written: the header's fields plus `"type": "header"`.
#[derive(Serialize)]
struct HeaderLine<'a> {
    r#type: &'static str,
    #[serde(flatten)]
    header: &'a RunHeader,
}

/// The header as one JSON line (no newline).
pub fn header_line(h: &RunHeader) -> String {
    serde_json::to_string(&HeaderLine {
        r#type: "header",
        header: h,
    })
    .expect("a header always serializes")
}

/// An entry as one JSON line (no newline).
pub fn entry_line(e: &Entry) -> String {
    serde_json::to_string(e).expect("an entry always serializes")
}

/// A line of a trace, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Line {
    Header(Box<RunHeader>),
    Entry(Entry),
}

/// A line that cannot be used, with the reason (naming the missing or bad field).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LineError(pub String);

/// Parse one line of a trace.
pub fn parse_line(text: &str) -> Result<Line, LineError> {
    // The common case first: the entries a trace is mostly made of, read straight
    // from the line (`fast_line` declines anything it does not know exactly); then
    // any entry, parsed into its type by the derived reader.
    if let Some(e) = crate::fast_line::entry(text) {
        return Ok(Line::Entry(e));
    }
    if let Ok(e) = serde_json::from_str::<Entry>(text) {
        return Ok(Line::Entry(e));
    }
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| LineError(format!("not JSON: {e}")))?;
    let kind = value
        .get("type")
        .and_then(|t| t.as_str())
        .ok_or_else(|| LineError("missing field `type`".into()))?
        .to_string();
    if kind == "header" {
        let mut v = value;
        if let Some(o) = v.as_object_mut() {
            o.remove("type");
        }
        let h: RunHeader =
            serde_json::from_value(v).map_err(|e| LineError(format!("header: {e}")))?;
        if !READS_VERSIONS.contains(&h.schema_version) {
            return Err(LineError(format!(
                "header: `schema_version` {} is not supported (this kvsim reads versions 1 and 2, and writes {SCHEMA_VERSION})",
                h.schema_version
            )));
        }
        h.check().map_err(LineError)?;
        return Ok(Line::Header(Box::new(h)));
    }
    let e: Entry =
        serde_json::from_value(value).map_err(|e| LineError(format!("`{kind}` entry: {e}")))?;
    Ok(Line::Entry(e))
}

#[cfg(test)]
mod tests {
    use super::*;

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
