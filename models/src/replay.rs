//! Replay a [`Schedule`] through the engine's nodes and the simulator's `Oracle`.
//!
//! This is the check that a counterexample is the engine's, not the model's: it
//! steps the engine's hand-stepped driver, [`Harness`], on the topology the simulator
//! builds (`world::Topology`: router `n0`, the prefill nodes, the decode nodes, `SymbolicGpu`
//! pools), forcing the inputs the schedule names, in order; the harness carries out
//! their effects through the world module as the simulator does, and the replayer
//! judges the records with the `kvsim_oracle::Oracle` the simulator feeds. None of the
//! model checker's code runs here: not its state, not its transition function, not
//! its property checks. The replayer itself only translates steps and records.
//!
//! It does not judge whether the schedule was a legal run of the model (fault budgets,
//! channel order); it only refuses a step that names a message not in flight or a
//! timer not pending.

use crate::model::HandoffModel;
use crate::model_state::{altered, stale_landing, ROUTER};
use crate::schedule::{MessageStep, Schedule, Step};
use crate::spec::ModelSpec;
use kvsim_engine::gpu::{SymbolicGpu, SymbolicPage};
use kvsim_engine::harness::{Delivered, Flight, Happened, Harness, HarnessError, Mark};
use kvsim_engine::ids::{NodeId, RequestId, RoomKey, TenantId};
use kvsim_engine::invariant::Invariant;
use kvsim_engine::msg::{Carried, Msg};
use kvsim_engine::trace::{FaultAction, TraceEvent};
use kvsim_engine::world::{self, Altered, DataFault, DropReason};
use kvsim_engine::Timer;
use kvsim_oracle::render::describe_event;
use kvsim_oracle::schema::{
    ClockKind, EndOutcome, Entry, FaultEvent, MsgView, Record, RunHeader, Viewed,
};
use kvsim_oracle::{Finding, Oracle};

/// A step the replayer cannot apply.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    #[error("step {index} (`{step}`): no such message in flight")]
    NoSuchMessage { index: usize, step: String },
    #[error("step {index} (`{step}`): that timer is not pending")]
    TimerNotPending { index: usize, step: String },
    #[error("step {index} (`{step}`): {reason}")]
    Invalid {
        index: usize,
        step: String,
        reason: String,
    },
    #[error("the model's topology cannot be built: {0}")]
    Topology(String),
}

/// What the simulator's oracle found on the forced run.
#[derive(Clone, Debug)]
pub struct ReplayOutcome {
    pub findings: Vec<Finding>,
    /// Distinct invariants found (violated or detected), in order of first finding.
    pub broken: Vec<Invariant>,
    /// One line per step and per engine event.
    pub log: Vec<String>,
    /// Nothing was in flight and no timer pending at the end (liveness was checked).
    pub quiescent: bool,
    /// The trace of the forced run (`docs/TRACE.md`): its header and every record the
    /// oracle judged, plus the sends, deliveries and losses of messages (which the
    /// oracle does not judge) for people and timelines. Its clock never moves (`at_ns`
    /// is 0); `seq` is the schedule's step.
    pub header: RunHeader,
    pub trace: Vec<Entry>,
}

/// How a message in flight is delivered.
#[derive(Clone, Copy)]
enum Landing {
    /// As it was sent (the world's rules decide what arrives).
    AsSent,
    /// A KV write the environment fails on the wire.
    FailedOnTheWire,
    /// A KV write that, if the world delivers it, lands altered by this data fault.
    Altered(DataFault),
}

/// Why a step could not be applied, before it is named by its index.
enum Refused {
    NoSuchMessage,
    TimerNotPending,
    Invalid(String),
}

impl From<HarnessError> for Refused {
    fn from(e: HarnessError) -> Self {
        Refused::Invalid(e.to_string())
    }
}

struct Replayer<'a> {
    spec: &'a ModelSpec,
    h: Harness<SymbolicGpu>,
    /// The client endpoint of the topology.
    client: NodeId,
    /// Copies of landed KV writes kept to land again as stale duplicates.
    stale: Vec<Flight<SymbolicPage>>,
    oracle: Oracle,
    log: Vec<String>,
    step: u64,
    trace: Vec<Entry>,
}

impl Replayer<'_> {
    fn record(&mut self, rec: Record) {
        let e = Entry {
            at_ns: 0,
            seq: self.step,
            rec,
        };
        self.oracle.observe(&e);
        self.trace.push(e);
    }

    /// A record the oracle does not judge (a message sent, delivered or lost), kept in
    /// the trace for the timeline.
    fn note(&mut self, rec: Record) {
        self.trace.push(Entry {
            at_ns: 0,
            seq: self.step,
            rec,
        });
    }

    /// Log and judge what the harness's last step did (every engine event, the
    /// client's answers, dropped duplicate completions, in order), then carry out a
    /// restart a node asked for.
    fn log_and_judge(&mut self, mark: Mark) {
        let mut restart = None;
        let mut records: Vec<(bool, Record)> = Vec::new();
        for happened in self.h.happened_since(mark) {
            match happened {
                Happened::Event(_, ev) => {
                    self.log.push(format!("    {}", describe_event(ev)));
                    if let TraceEvent::Fault { node, fault } = ev {
                        if fault.action() == FaultAction::Restart {
                            restart = Some(*node);
                        }
                    }
                    records.push((true, Record::Engine(ev.clone())));
                }
                Happened::Sent(sent) => {
                    records.push((false, sent_record(sent.from, sent.to, &sent.msg)));
                    if let Carried::Msg(Msg::Response {
                        req,
                        status,
                        tokens,
                        ..
                    }) = &sent.msg
                    {
                        self.log.push(format!(
                            "    client gets {status} for {req} ({} tokens)",
                            tokens.len()
                        ));
                    }
                }
                Happened::DuplicateCompletionDropped(_) => {
                    self.log
                        .push("    its completion of the stale duplicate is dropped".into());
                }
            }
        }
        for (judged, rec) in records {
            if judged {
                self.record(rec);
            } else {
                self.note(rec);
            }
        }
        if let Some(n) = restart {
            self.crash(n).ok();
        }
    }

    /// Carry out what the delivery of a message from `from` to `to` came to: a
    /// landed write's data fault `fault` is announced before its receiver's events;
    /// a failed write is recorded (its completion is in flight).
    fn delivered(
        &mut self,
        (from, to, msg): (NodeId, NodeId, &Carried<SymbolicPage>),
        mark: Mark,
        outcome: Delivered,
        fault: Option<Altered>,
    ) {
        match outcome {
            Delivered::Handled => {
                if let (Some(a), Some(write)) = (fault, msg.write_id()) {
                    self.log.push(format!(
                        "    the KV write {write} lands {}: its page meant for {} lands at {}",
                        a.fault.name(),
                        a.meant,
                        a.landed
                    ));
                    self.record(Record::Fault(FaultEvent::data_fault(from, to, write, &a)));
                }
                self.note(Record::Deliver {
                    from,
                    to,
                    msg: MsgView::of(msg),
                });
                self.log_and_judge(mark);
            }
            Delivered::Dropped(reason) => self.note(Record::Drop {
                from,
                to,
                msg: MsgView::of(msg),
                reason,
            }),
            Delivered::Failed(reason) => {
                if let Some(write) = msg.write_id() {
                    self.log.push(format!(
                        "    the KV write {write} fails on the wire ({reason:?})"
                    ));
                    self.record(Record::WriteFailed {
                        from,
                        to,
                        write,
                        reason,
                    });
                }
            }
        }
    }

    /// Deliver the message in flight at `i` as `how` says.
    fn deliver(&mut self, i: usize, how: Landing) -> Result<(), HarnessError> {
        let Flight { from, to, msg, .. } = self.h.in_flight()[i].clone();
        let mark = self.h.mark();
        let (outcome, a) = match how {
            Landing::AsSent => (self.h.deliver(i)?, None),
            Landing::FailedOnTheWire => (self.h.fail_write(i)?, None),
            Landing::Altered(fault) => match altered(self.spec, to, &msg, fault) {
                Some((changed, a)) => (self.h.deliver_as(i, changed)?, Some(a)),
                None => (self.h.deliver(i)?, None),
            },
        };
        self.delivered((from, to, &msg), mark, outcome, a);
        Ok(())
    }

    /// A kept copy of a KV write lands again as a stale duplicate, as the simulator
    /// delivers one: by the world's rule for an arriving write (one that would fail is
    /// gone), announced with a `data_fault` record, its receiver's completion dropped.
    fn land_stale(&mut self, copy: Flight<SymbolicPage>) -> Result<(), HarnessError> {
        let Some(pool) = self.h.node(copy.to).and_then(|n| n.pool()) else {
            return Ok(());
        };
        let (Some(write), Some(a)) = (copy.msg.write_id(), stale_landing(pool, &copy.msg)) else {
            return Ok(());
        };
        let (from, to) = (copy.from, copy.to);
        let mark = self.h.mark();
        if self.h.land_duplicate(copy)? != Delivered::Handled {
            return Ok(());
        }
        self.log.push(format!(
            "    a stale duplicate of the KV write {write} lands: its page {} lands over {}",
            a.landed, a.meant
        ));
        self.record(Record::Fault(FaultEvent::data_fault(from, to, write, &a)));
        self.log_and_judge(mark);
        Ok(())
    }

    /// Another party's start pair for the live room use `room` goes in flight from the
    /// router's address, as the model sent it (`world::colliding_starts`).
    fn collide(
        &mut self,
        room: RoomKey,
        req: RequestId,
        (prompt_len, max_new): (u64, u32),
    ) -> Result<(), Refused> {
        let live = self
            .h
            .router_room(room)
            .ok_or_else(|| Refused::Invalid(format!("{room} is not live at the router")))?;
        let prompt = world::colliding_prompt(prompt_len);
        let halves = (live.prefill, live.decode);
        for (to, msg) in world::colliding_starts(room, halves, req, prompt, max_new) {
            self.note(sent_record(ROUTER, to, &msg));
            self.h.post(ROUTER, to, msg);
        }
        Ok(())
    }

    /// A crash and an immediate restart, by the world's rules.
    fn crash(&mut self, node: NodeId) -> Result<(), String> {
        let report = self
            .h
            .crash_report(node)
            .map_err(|_| "only a prefill or decode node can crash".to_string())?;
        self.stale.retain(|f| f.from != node && f.to != node);
        self.record(Record::Fault(FaultEvent::Crash {
            node,
            epoch: report.dead,
            flushed: report.flushed,
        }));
        for (from, to, write) in report.failed {
            self.record(Record::WriteFailed {
                from,
                to,
                write,
                reason: kvsim_engine::world::crash_failure(node, to),
            });
        }
        self.record(Record::Fault(FaultEvent::Restart {
            node,
            epoch: report.epoch,
        }));
        Ok(())
    }

    /// A client's message, handed to the router at once.
    fn client_sends(&mut self, msg: Msg) -> Result<(), Refused> {
        let client = self.client;
        self.note(sent_record(client, ROUTER, &msg));
        self.note(Record::Deliver {
            from: client,
            to: ROUTER,
            msg: MsgView::of(&msg),
        });
        let mark = self.h.mark();
        self.h.inject(client, ROUTER, msg)?;
        self.log_and_judge(mark);
        Ok(())
    }

    /// A pending timer of `node` fires.
    fn fire(&mut self, node: NodeId, timer: Timer) -> Result<(), Refused> {
        let mark = self.h.mark();
        let done = self.h.fire(node, timer);
        self.timer_delivered(mark, done)
    }

    /// A stale delivery of a timer: the node gets the input whether or not one of
    /// that value is pending (a pending one still fires later).
    fn refire(&mut self, node: NodeId, timer: Timer) -> Result<(), Refused> {
        let mark = self.h.mark();
        let done = self.h.refire(node, timer);
        self.timer_delivered(mark, done)
    }

    fn timer_delivered(
        &mut self,
        mark: Mark,
        done: Result<(), HarnessError>,
    ) -> Result<(), Refused> {
        match done {
            Ok(()) => {}
            Err(HarnessError::NoSuchTimer { .. }) => return Err(Refused::TimerNotPending),
            Err(HarnessError::NoSuchNode(_)) => {
                return Err(Refused::Invalid("no such node".into()))
            }
            Err(e) => return Err(e.into()),
        }
        self.log_and_judge(mark);
        Ok(())
    }

    fn apply(&mut self, step: &Step) -> Result<(), Refused> {
        match step {
            Step::Submit {
                req,
                tenant,
                prompt_len,
                max_new_tokens,
            } => {
                self.record(Record::Submit {
                    req: *req,
                    tenant: TenantId(*tenant),
                    prompt_len: *prompt_len,
                    max_new_tokens: *max_new_tokens,
                });
                self.client_sends(Msg::Submit {
                    req: *req,
                    tenant: TenantId(*tenant),
                    prompt: kvsim_oracle::canary::prompt(*req, *prompt_len),
                    max_new_tokens: *max_new_tokens,
                })
            }
            Step::Cancel { req } => self.client_sends(Msg::Cancel { req: *req }),
            Step::Message {
                how,
                from,
                to,
                summary,
            } => self.message(*how, (*from, *to), summary),
            Step::Crash { node } => self.crash(*node).map_err(Refused::Invalid),
            // The order of the steps between a pause and its wake is what the pause
            // did; the replay forces that order and has nothing more to do.
            Step::Pause { .. } | Step::Wake { .. } => Ok(()),
            Step::Collide {
                room,
                req,
                prompt_len,
                max_new_tokens,
            } => self.collide(*room, *req, (*prompt_len, *max_new_tokens)),
            Step::Fire { node, timer } => self.fire(*node, *timer),
            Step::Refire { node, timer } => self.refire(*node, *timer),
        }
    }

    /// A step on the message from `from` to `to` that reads `summary`.
    fn message(
        &mut self,
        how: MessageStep,
        (from, to): (NodeId, NodeId),
        summary: &str,
    ) -> Result<(), Refused> {
        let is =
            |f: &Flight<SymbolicPage>| f.from == from && f.to == to && f.msg.summary() == summary;
        if how == MessageStep::Alter(DataFault::StaleDuplicate) {
            let i = self
                .stale
                .iter()
                .position(is)
                .ok_or(Refused::NoSuchMessage)?;
            let copy = self.stale.remove(i);
            return Ok(self.land_stale(copy)?);
        }
        let i = self
            .h
            .in_flight()
            .iter()
            .position(is)
            .ok_or(Refused::NoSuchMessage)?;
        let is_write = matches!(self.h.in_flight()[i].msg, Carried::Write(_));
        match how {
            MessageStep::Deliver | MessageStep::Overtake => self.deliver(i, Landing::AsSent)?,
            MessageStep::Duplicate => {
                let copy = self.h.duplicate(i)?;
                self.deliver(copy, Landing::AsSent)?;
            }
            MessageStep::Alter(fault) => {
                if altered(self.spec, to, &self.h.in_flight()[i].msg, fault).is_none() {
                    return Err(Refused::Invalid(format!(
                        "the data fault {} has nothing to act on here",
                        fault.name()
                    )));
                }
                self.deliver(i, Landing::Altered(fault))?;
            }
            MessageStep::KeepCopy => {
                if !is_write {
                    return Err(Refused::Invalid(
                        "only a KV write is kept to land again".into(),
                    ));
                }
                self.stale.push(self.h.in_flight()[i].clone());
                self.deliver(i, Landing::AsSent)?;
            }
            MessageStep::Lose => {
                let f = self.h.in_flight()[i].clone();
                self.h.drop_flight(i)?;
                self.note(Record::Drop {
                    from: f.from,
                    to: f.to,
                    msg: MsgView::of(&f.msg),
                    reason: DropReason::Lost,
                });
            }
            MessageStep::FailWrite => {
                // As the model (`write_actions`): a KV write or a READ request.
                if !self.h.in_flight()[i].msg.is_rdma() {
                    return Err(Refused::Invalid(
                        "only an RDMA operation (a KV write or a READ) can fail on the wire".into(),
                    ));
                }
                self.deliver(i, Landing::FailedOnTheWire)?;
            }
        }
        Ok(())
    }
}

/// The trace record of a message sent (due at once: the model has no clock).
fn sent_record<V: Viewed + ?Sized>(from: NodeId, to: NodeId, msg: &V) -> Record {
    Record::Send {
        from,
        to,
        msg: MsgView::of(msg),
        deliver_at_ns: 0,
        duplicate: false,
    }
}

/// Replay `schedule` on the topology and engine configuration of `spec`.
pub fn replay(spec: &ModelSpec, schedule: &Schedule) -> Result<ReplayOutcome, ReplayError> {
    let topology = HandoffModel::topology_of(spec);
    let client = topology.client();
    let header = RunHeader::new(
        "kvsim-replay",
        ClockKind::Simulated,
        &spec.engine,
        &topology,
    );
    let mut h = Harness::with_gpu(spec.engine.clone(), topology, SymbolicGpu::new)
        .map_err(|e| ReplayError::Topology(e.to_string()))?;
    if spec.nodes.fronts {
        h = h.behind_fronts(spec.engine.defenses.router_cancels_both);
    }
    let mut r = Replayer {
        spec,
        h,
        client,
        stale: Vec::new(),
        oracle: Oracle::new(header.clone()),
        log: Vec::new(),
        step: 0,
        trace: Vec::new(),
    };
    for (index, step) in schedule.0.iter().enumerate() {
        r.step = index as u64 + 1;
        r.log.push(format!("{:>3}. {step}", index + 1));
        r.apply(step).map_err(|refused| {
            let step = step.to_string();
            match refused {
                Refused::NoSuchMessage => ReplayError::NoSuchMessage { index, step },
                Refused::TimerNotPending => ReplayError::TimerNotPending { index, step },
                Refused::Invalid(reason) => ReplayError::Invalid {
                    index,
                    step,
                    reason,
                },
            }
        })?;
    }
    let quiescent = r.h.in_flight().is_empty() && !r.h.any_timer_pending() && r.stale.is_empty();
    if quiescent {
        r.step += 1;
        r.record(Record::End {
            outcome: EndOutcome::Drained,
            detail: "nothing in flight, no timer pending".into(),
        });
    }
    let findings = r.oracle.findings().to_vec();
    let mut broken: Vec<Invariant> = Vec::new();
    for f in &findings {
        if !broken.contains(&f.violation.invariant) {
            broken.push(f.violation.invariant);
        }
    }
    Ok(ReplayOutcome {
        broken,
        findings,
        log: r.log,
        quiescent,
        header,
        trace: r.trace,
    })
}
