//! Replay a [`Schedule`] through the engine's nodes and the simulator's `Oracle`.
//!
//! This is the check that a counterexample is the engine's, not the model's: it
//! rebuilds the topology the simulator builds (`world::Topology`: router `n0`, prefill
//! `n1`, decode `n2`, `SymbolicGpu` pools), feeds each node the inputs the schedule
//! forces, in order, carries out their effects through the world module as the
//! simulator does, and judges the records with the `kvsim_oracle::Oracle` the simulator
//! feeds. None of the model checker's code runs here: not its state, not its
//! transition function, not its property checks.
//!
//! It does not judge whether the schedule was a legal run of the model (fault budgets,
//! channel order); it only refuses a step that names a message not in flight or a
//! timer not pending.

use crate::schedule::{MessageStep, Schedule, Step};
use crate::spec::ModelSpec;
use crate::state::{altered, stale_landing, CLIENT, PREFILL, ROUTER};
use crate::HandoffModel;
use kvsim_engine::env::{Input, Outbox, Timer, TimerOp};
use kvsim_engine::gpu::{SymbolicGpu, SymbolicPage};
use kvsim_engine::ids::{NodeId, RequestId, TenantId, WriteId};
use kvsim_engine::invariant::Invariant;
use kvsim_engine::msg::Msg;
use kvsim_engine::node::Node;
use kvsim_engine::trace::{FaultAction, TraceEvent};
use kvsim_engine::world::{
    self, Arrival, Arriving, CrashFate, DataFault, Driver, Timers, WriteFailure,
};
use kvsim_engine::Cfg;
use kvsim_oracle::render::describe_event;
use kvsim_oracle::schema::{ClockKind, EndOutcome, Entry, FaultEvent, Record, RunHeader};
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
}

struct Replayer<'a> {
    spec: &'a ModelSpec,
    nodes: Vec<Node<SymbolicGpu>>,
    net: Vec<(NodeId, NodeId, Msg<SymbolicPage>)>,
    /// Copies of landed KV writes kept to land again as stale duplicates.
    stale: Vec<(NodeId, NodeId, Msg<SymbolicPage>)>,
    /// The write whose stale duplicate is being delivered (its completion is dropped).
    replaying: Option<WriteId>,
    timers: Timers<()>,
    oracle: Oracle,
    log: Vec<String>,
    step: u64,
    restart: Option<NodeId>,
}

impl Replayer<'_> {
    fn record(&mut self, rec: Record) {
        self.oracle.observe(&Entry {
            at_ns: 0,
            seq: self.step,
            rec,
        });
    }

    /// Feed one input to one node and carry out its effects through the world module.
    fn dispatch(&mut self, node: NodeId, input: Input<SymbolicPage>) {
        let mut out = Outbox::new(0);
        self.nodes[node.0 as usize].handle(input, &mut out);
        world::apply(node, out.effects, self);
        if let Some(n) = self.restart.take() {
            self.crash(n).ok();
        }
    }

    fn deliver(
        &mut self,
        from: NodeId,
        to: NodeId,
        msg: Msg<SymbolicPage>,
        fail: bool,
        fault: Option<DataFault>,
    ) {
        let at = Arriving {
            sender_alive: true,
            receiver_alive: true,
            receiver_restarted: false,
            receiver_epoch: self.nodes[to.0 as usize].pool().map_or(0, |p| p.epoch()),
            partitioned: false,
            injected_failure: fail,
        };
        match world::arrival(&msg, &at) {
            Arrival::Deliver => {
                let changed = fault.and_then(|f| altered(self.spec, to, &msg, f));
                let msg = match (changed, msg.write_id()) {
                    (Some((changed, a)), Some(write)) => {
                        self.log.push(format!(
                            "    the KV write {write} lands {}: its page meant for {} lands at {}",
                            a.fault.name(),
                            a.meant,
                            a.landed
                        ));
                        self.record(Record::Fault(FaultEvent::data_fault(from, to, write, &a)));
                        changed
                    }
                    _ => msg,
                };
                self.dispatch(to, Input::Message { from, msg })
            }
            Arrival::Drop(_) => {}
            Arrival::Fail { reason, completion } => {
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
                self.net.push((to, from, completion));
            }
        }
    }

    /// A kept copy of a KV write lands again as a stale duplicate, as the simulator
    /// delivers one: by the world's rule for an arriving write (one that would fail is
    /// gone), announced with a `data_fault` record, its receiver's completion dropped.
    fn land_stale(&mut self, from: NodeId, to: NodeId, msg: Msg<SymbolicPage>) {
        let Some(pool) = self.nodes[to.0 as usize].pool() else {
            return;
        };
        let at = Arriving {
            sender_alive: true,
            receiver_alive: true,
            receiver_restarted: false,
            receiver_epoch: pool.epoch(),
            partitioned: false,
            injected_failure: false,
        };
        if !matches!(world::arrival(&msg, &at), Arrival::Deliver) {
            return;
        }
        let (Some(write), Some(a)) = (msg.write_id(), stale_landing(pool, &msg)) else {
            return;
        };
        self.log.push(format!(
            "    a stale duplicate of the KV write {write} lands: its page {} lands over {}",
            a.landed, a.meant
        ));
        self.record(Record::Fault(FaultEvent::data_fault(from, to, write, &a)));
        self.replaying = Some(write);
        self.dispatch(to, Input::Message { from, msg });
        self.replaying = None;
    }

    /// A crash and an immediate restart, by the world's rules.
    fn crash(&mut self, node: NodeId) -> Result<(), String> {
        let i = node.0 as usize;
        let dead = match self.nodes.get(i).and_then(|n| n.pool()) {
            Some(pool) => pool.epoch(),
            None => return Err("only a prefill or decode node can crash".into()),
        };
        self.timers.crash(node);
        self.stale
            .retain(|(from, to, _)| *from != node && *to != node);
        let mut kept = Vec::new();
        let mut flushed = Vec::new();
        let mut failed = Vec::new();
        for (from, to, msg) in std::mem::take(&mut self.net) {
            match world::crash_fate(node, from, to, &msg) {
                CrashFate::Keep => kept.push((from, to, msg)),
                CrashFate::Lose => {}
                CrashFate::Flush => flushed.extend(msg.write_id()),
                CrashFate::FailBack(done) => failed.push((from, to, done)),
            }
        }
        self.net = kept;
        self.nodes[i].restart(dead + 1);
        self.record(Record::Fault(FaultEvent::Crash {
            node,
            epoch: dead,
            flushed,
        }));
        for (from, to, done) in failed {
            if let Some(write) = done.write_id() {
                self.record(Record::WriteFailed {
                    from,
                    to,
                    write,
                    reason: WriteFailure::ReceiverGone,
                });
            }
            self.net.push((to, from, done));
        }
        self.record(Record::Fault(FaultEvent::Restart {
            node,
            epoch: dead + 1,
        }));
        Ok(())
    }
}

impl Driver<Msg<SymbolicPage>> for Replayer<'_> {
    fn send(&mut self, from: NodeId, to: NodeId, msg: Msg<SymbolicPage>) {
        if let Some(dup) = self.replaying {
            if world::duplicate_completion(dup, &msg) {
                self.log
                    .push("    its completion of the stale duplicate is dropped".into());
                return;
            }
        }
        if to == CLIENT {
            if let Msg::Response {
                req,
                status,
                tokens,
                ..
            } = &msg
            {
                self.log.push(format!(
                    "    client gets {status} for {req} ({} tokens)",
                    tokens.len()
                ));
            }
        } else {
            self.net.push((from, to, msg));
        }
    }

    fn timer(&mut self, node: NodeId, op: TimerOp) {
        self.timers.apply(node, op, ());
    }

    fn event(&mut self, _node: NodeId, ev: TraceEvent) {
        self.log.push(format!("    {}", describe_event(&ev)));
        if let TraceEvent::Fault { node, fault } = &ev {
            if fault.action() == FaultAction::Restart {
                self.restart = Some(*node);
            }
        }
        self.record(Record::Engine(ev));
    }
}

/// Replay `schedule` on the topology and engine configuration of `spec`.
pub fn replay(spec: &ModelSpec, schedule: &Schedule) -> Result<ReplayOutcome, ReplayError> {
    let cfg = Cfg::new(spec.engine.clone());
    let topology = HandoffModel::topology_of(spec);
    let header = RunHeader::new(
        "kvsim-replay",
        ClockKind::Simulated,
        &spec.engine,
        &topology,
    );
    let mut r = Replayer {
        spec,
        nodes: topology.build(&cfg, SymbolicGpu::new),
        net: Vec::new(),
        stale: Vec::new(),
        replaying: None,
        timers: Timers::new(),
        oracle: Oracle::new(header),
        log: Vec::new(),
        step: 0,
        restart: None,
    };
    for (index, step) in schedule.0.iter().enumerate() {
        r.step = index as u64 + 1;
        r.log.push(format!("{:>3}. {step}", index + 1));
        match step {
            Step::Submit {
                req,
                tenant,
                prompt_len,
                max_new_tokens,
            } => {
                r.record(Record::Submit {
                    req: *req,
                    tenant: TenantId(*tenant),
                    prompt_len: *prompt_len,
                    max_new_tokens: *max_new_tokens,
                });
                let msg = Msg::Submit {
                    req: *req,
                    tenant: TenantId(*tenant),
                    prompt: kvsim_oracle::canary::prompt(*req, *prompt_len),
                    max_new_tokens: *max_new_tokens,
                };
                r.dispatch(ROUTER, Input::Message { from: CLIENT, msg });
            }
            Step::Cancel { req } => {
                let msg = Msg::Cancel { req: *req };
                r.dispatch(ROUTER, Input::Message { from: CLIENT, msg });
            }
            Step::Message {
                how,
                from,
                to,
                summary,
            } => {
                if *how == MessageStep::Alter(DataFault::StaleDuplicate) {
                    let Some(i) = r
                        .stale
                        .iter()
                        .position(|(f, t, m)| f == from && t == to && &m.summary() == summary)
                    else {
                        return Err(ReplayError::NoSuchMessage {
                            index,
                            step: step.to_string(),
                        });
                    };
                    let (f, t, m) = r.stale.remove(i);
                    r.land_stale(f, t, m);
                    continue;
                }
                let Some(i) = r
                    .net
                    .iter()
                    .position(|(f, t, m)| f == from && t == to && &m.summary() == summary)
                else {
                    return Err(ReplayError::NoSuchMessage {
                        index,
                        step: step.to_string(),
                    });
                };
                match how {
                    MessageStep::Deliver | MessageStep::Overtake => {
                        let (f, t, m) = r.net.remove(i);
                        r.deliver(f, t, m, false, None);
                    }
                    MessageStep::Duplicate => {
                        let (f, t, m) = r.net[i].clone();
                        r.deliver(f, t, m, false, None);
                    }
                    MessageStep::Alter(fault) => {
                        if altered(spec, r.net[i].1, &r.net[i].2, *fault).is_none() {
                            return Err(ReplayError::Invalid {
                                index,
                                step: step.to_string(),
                                reason: format!(
                                    "the data fault {} has nothing to act on here",
                                    fault.name()
                                ),
                            });
                        }
                        let (f, t, m) = r.net.remove(i);
                        r.deliver(f, t, m, false, Some(*fault));
                    }
                    MessageStep::KeepCopy => {
                        if !matches!(r.net[i].2, Msg::KvWrite { .. }) {
                            return Err(ReplayError::Invalid {
                                index,
                                step: step.to_string(),
                                reason: "only a KV write is kept to land again".into(),
                            });
                        }
                        let (f, t, m) = r.net.remove(i);
                        r.stale.push((f, t, m.clone()));
                        r.deliver(f, t, m, false, None);
                    }
                    MessageStep::Lose => {
                        r.net.remove(i);
                    }
                    MessageStep::FailWrite => {
                        if !matches!(r.net[i].2, Msg::KvWrite { .. }) {
                            return Err(ReplayError::Invalid {
                                index,
                                step: step.to_string(),
                                reason: "only a KV write can fail on the wire".into(),
                            });
                        }
                        let (f, t, m) = r.net.remove(i);
                        r.deliver(f, t, m, true, None);
                    }
                }
            }
            Step::Crash { node } => {
                r.crash(*node).map_err(|reason| ReplayError::Invalid {
                    index,
                    step: step.to_string(),
                    reason,
                })?;
            }
            Step::Fire { node, timer } => {
                if r.timers.take(*node, *timer).is_none() {
                    return Err(ReplayError::TimerNotPending {
                        index,
                        step: step.to_string(),
                    });
                }
                r.dispatch(*node, Input::Timer(*timer));
            }
            // A stale delivery of a timer: the node gets the input whether or not one
            // of that value is pending (a pending one still fires later).
            Step::Refire { node, timer } => {
                if node.0 as usize >= r.nodes.len() {
                    return Err(ReplayError::Invalid {
                        index,
                        step: step.to_string(),
                        reason: "no such node".into(),
                    });
                }
                r.dispatch(*node, Input::Timer(*timer));
            }
        }
    }
    let quiescent = r.net.is_empty() && r.timers.is_empty() && r.stale.is_empty();
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
    let _ = (PREFILL, RequestId(0), Timer::Compute);
    Ok(ReplayOutcome {
        broken,
        findings,
        log: r.log,
        quiescent,
    })
}
