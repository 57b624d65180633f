//! Replay a [`Schedule`] through the engine's nodes and the simulator's `Oracle`.
//!
//! This is the check that a counterexample is the engine's, not the model's: it
//! rebuilds the topology the simulator builds (router `n0`, prefill `n1`, decode `n2`,
//! `SymbolicGpu` pools), feeds each node the inputs the schedule forces, in order, and
//! runs `kvsim_sim::oracle::Oracle` exactly as `kvsim_sim::world::World` does after
//! every input. None of the model checker's code runs here: not its state, not its
//! transition function, not its property checks.
//!
//! It does not judge whether the schedule was a legal run of the model (fault budgets,
//! channel order); it only refuses a step that names a message not in flight or a
//! timer not pending.

use crate::schedule::{MessageStep, Schedule, Step};
use crate::spec::ModelSpec;
use crate::state::{failed_write_done, CLIENT, DECODE, PREFILL, ROUTER};
use kvsim_engine::decode::DecodeNode;
use kvsim_engine::env::{Input, Outbox, Timer, TimerOp};
use kvsim_engine::gpu::{SymbolicGpu, SymbolicPage};
use kvsim_engine::ids::{NodeId, RequestId, TenantId};
use kvsim_engine::invariant::Invariant;
use kvsim_engine::msg::Msg;
use kvsim_engine::node::Node;
use kvsim_engine::prefill::PrefillNode;
use kvsim_engine::router::Router;
use kvsim_engine::Cfg;
use kvsim_sim::oracle::{Finding, Oracle};
use kvsim_sim::report::{describe_event, distinct};
use kvsim_sim::scenario::PlannedRequest;
use std::collections::{BTreeMap, BTreeSet};

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
    /// Distinct invariants broken, in order of first finding.
    pub broken: Vec<Invariant>,
    /// One line per step and per engine event.
    pub log: Vec<String>,
    /// Nothing was in flight and no timer pending at the end (liveness was checked).
    pub quiescent: bool,
}

struct Replayer {
    nodes: Vec<Node<SymbolicGpu>>,
    net: Vec<(NodeId, NodeId, Msg<SymbolicPage>)>,
    timers: BTreeSet<(NodeId, Timer)>,
    oracle: Oracle,
    log: Vec<String>,
}

impl Replayer {
    /// `World::dispatch_with`, without a clock.
    fn dispatch(&mut self, node: NodeId, input: Input<SymbolicPage>, submitted: Option<RequestId>) {
        let mut out = Outbox::new(0);
        self.nodes[node.0 as usize].handle(input, &mut out);
        if node == ROUTER {
            for (to, msg) in &out.sends {
                self.oracle.on_router_send(submitted, msg, *to);
            }
        }
        for ev in &out.traces {
            let mut flying = std::collections::BTreeMap::new();
            for (_, to, m) in &self.net {
                if let Msg::KvWrite { room, .. } = m {
                    *flying.entry((*to, *room)).or_insert(0u32) += 1;
                }
            }
            self.oracle.on_trace(&self.nodes, &flying, ev);
            self.log.push(format!("    {}", describe_event(ev)));
        }
        for (to, msg) in out.sends {
            if to == CLIENT {
                if let Msg::Response {
                    req,
                    status,
                    tokens,
                } = &msg
                {
                    self.oracle.on_response(*req, *status, tokens);
                    self.log.push(format!(
                        "    client gets {status} for {req} ({} tokens)",
                        tokens.len()
                    ));
                }
            } else {
                self.net.push((node, to, msg));
            }
        }
        for op in out.timers {
            match op {
                TimerOp::Set { timer, .. } => {
                    self.timers.insert((node, timer));
                }
                TimerOp::Cancel { timer } => {
                    self.timers.remove(&(node, timer));
                }
            }
        }
        self.oracle.after_event(&self.nodes[node.0 as usize]);
    }

    fn deliver(&mut self, from: NodeId, to: NodeId, msg: Msg<SymbolicPage>) {
        if let Msg::KvWrite { room, dst, .. } = &msg {
            let epoch = self.nodes[to.0 as usize].pool().map_or(0, |p| p.epoch());
            if dst.iter().any(|t| t.gen.epoch() != epoch) {
                // `World::deliver`: a stale registration fails the write.
                self.log.push(format!(
                    "    the KV write for {room} fails: stale registration"
                ));
                self.net
                    .extend(failed_write_done(&msg).map(|done| (to, from, done)));
                return;
            }
        }
        self.oracle.before_deliver(&self.nodes, from, to, &msg);
        self.dispatch(to, Input::Message { from, msg }, None);
    }

    /// `World::crash` and `World::restart` back to back.
    fn crash(&mut self, node: NodeId) -> Result<(), String> {
        let i = node.0 as usize;
        let epoch = match self.nodes.get(i).and_then(|n| n.pool()) {
            Some(pool) => pool.epoch() + 1,
            None => return Err("only a prefill or decode node can crash".into()),
        };
        self.timers.retain(|(n, _)| *n != node);
        let mut kept = Vec::new();
        for (from, to, msg) in std::mem::take(&mut self.net) {
            if to == node {
                kept.extend(failed_write_done(&msg).map(|done| (to, from, done)));
            } else if !(from == node && matches!(msg, Msg::KvWrite { .. })) {
                kept.push((from, to, msg));
            }
        }
        self.net = kept;
        self.nodes[i].restart(epoch);
        self.oracle.on_restart(node);
        self.oracle.after_event(&self.nodes[i]);
        Ok(())
    }
}

/// Replay `schedule` on the topology and engine configuration of `spec`.
pub fn replay(spec: &ModelSpec, schedule: &Schedule) -> Result<ReplayOutcome, ReplayError> {
    let cfg = Cfg::new(spec.engine.clone());
    let ps = cfg.page_size;
    let planned: Vec<PlannedRequest> = schedule
        .0
        .iter()
        .filter_map(|s| match s {
            Step::Submit {
                req,
                tenant,
                prompt_len,
                max_new_tokens,
            } => Some(PlannedRequest {
                req: *req,
                tenant: TenantId(*tenant),
                prompt_len: *prompt_len,
                max_new_tokens: *max_new_tokens,
                at_ns: 0,
                cancel: None,
            }),
            _ => None,
        })
        .collect();
    let pool_pages = BTreeMap::from([(PREFILL, spec.prefill_pages), (DECODE, spec.decode_pages)]);
    let mut r = Replayer {
        nodes: vec![
            Node::Router(Router::new(
                ROUTER,
                cfg.clone(),
                vec![PREFILL],
                vec![DECODE],
            )),
            Node::Prefill(PrefillNode::new(
                PREFILL,
                cfg.clone(),
                ROUTER,
                SymbolicGpu::new(spec.prefill_pages, ps),
            )),
            Node::Decode(DecodeNode::new(
                DECODE,
                cfg.clone(),
                ROUTER,
                SymbolicGpu::new(spec.decode_pages, ps),
            )),
        ],
        net: Vec::new(),
        timers: BTreeSet::new(),
        oracle: Oracle::new(cfg.clone(), &planned, pool_pages),
        log: Vec::new(),
    };
    for (index, step) in schedule.0.iter().enumerate() {
        r.oracle.set_clock(0, index as u64 + 1);
        r.log.push(format!("{:>3}. {step}", index + 1));
        match step {
            Step::Submit { req, .. } => {
                let Some(p) = planned.iter().find(|p| p.req == *req) else {
                    return Err(ReplayError::Invalid {
                        index,
                        step: step.to_string(),
                        reason: "unknown request".into(),
                    });
                };
                let msg = Msg::Submit {
                    req: *req,
                    tenant: p.tenant,
                    prompt: p.prompt(),
                    max_new_tokens: p.max_new_tokens,
                };
                r.dispatch(ROUTER, Input::Message { from: CLIENT, msg }, Some(*req));
            }
            Step::Cancel { req } => {
                let msg = Msg::Cancel { req: *req };
                r.dispatch(ROUTER, Input::Message { from: CLIENT, msg }, None);
            }
            Step::Message {
                how,
                from,
                to,
                summary,
            } => {
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
                        r.deliver(f, t, m);
                    }
                    MessageStep::Duplicate => {
                        let (f, t, m) = r.net[i].clone();
                        r.deliver(f, t, m);
                    }
                    MessageStep::Lose => {
                        r.net.remove(i);
                    }
                    MessageStep::FailWrite => {
                        let (f, t, m) = r.net.remove(i);
                        let Some(done) = failed_write_done(&m) else {
                            return Err(ReplayError::Invalid {
                                index,
                                step: step.to_string(),
                                reason: "only a KV write can fail on the wire".into(),
                            });
                        };
                        // The writer's NIC completes the work request with an error.
                        r.net.push((t, f, done));
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
                if !r.timers.remove(&(*node, *timer)) {
                    return Err(ReplayError::TimerNotPending {
                        index,
                        step: step.to_string(),
                    });
                }
                r.dispatch(*node, Input::Timer(*timer), None);
            }
        }
    }
    let quiescent = r.net.is_empty() && r.timers.is_empty();
    if quiescent {
        r.oracle.at_quiescence(&r.nodes, None);
    }
    let findings = r.oracle.findings().to_vec();
    Ok(ReplayOutcome {
        broken: distinct(&findings),
        findings,
        log: r.log,
        quiescent,
    })
}
