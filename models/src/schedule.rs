//! `Schedule`: a run as a forced sequence of environment steps, in readable text.
//!
//! A counterexample of the model checker is a path of [`Action`]s; its schedule names
//! each step by what a person (and the replayer) can recognise without the model:
//! `submit req0 t1 prompt=3 max_new=1`, `deliver n1 -> n2 | KvWrite room1.g1 chunk=0
//! src=[p1@g1] dst=[p1@g1]`, `fire n2 WaitingForKv room1.g1`. One step per line; the
//! text round-trips through [`Schedule::parse`], so a counterexample can be kept as a
//! file and replayed through the simulator's nodes and oracle ([`crate::replay`]).
//!
//! A message is named by its sender, receiver and
//! [`Msg::summary`](kvsim_engine::msg::Msg::summary) (which leaves out the KV
//! payload): the replayer picks the message in flight that matches.

use crate::model::HandoffModel;
use crate::model_state::{Action, State};
use kvsim_engine::env::Timer;
use kvsim_engine::ids::{NodeId, RequestId, RoomKey};
use kvsim_engine::world::DataFault;
use std::fmt;

/// One forced step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    Submit {
        req: RequestId,
        tenant: u32,
        prompt_len: u64,
        max_new_tokens: u32,
    },
    Cancel {
        req: RequestId,
    },
    /// A message: delivered, delivered ahead of older ones, delivered twice (the copy
    /// stays in flight), lost, or (a KV write) failed on the wire.
    Message {
        how: MessageStep,
        from: NodeId,
        to: NodeId,
        summary: String,
    },
    Fire {
        node: NodeId,
        timer: Timer,
    },
    /// A timer that already fired or was cancelled is delivered again.
    Refire {
        node: NodeId,
        timer: Timer,
    },
    /// The node crashes and restarts into its next incarnation.
    Crash {
        node: NodeId,
    },
    /// The node freezes (a stall) until its `wake`. Both only order the steps
    /// between them: the replayer forces that order and has nothing else to do.
    Pause {
        node: NodeId,
    },
    Wake {
        node: NodeId,
    },
    /// Another party's start pair for the live room use `room`, from request `req`
    /// (`world::colliding_starts`), goes in flight from the router's address.
    Collide {
        room: RoomKey,
        req: RequestId,
        prompt_len: u64,
        max_new_tokens: u32,
    },
}

impl Step {
    /// The step of a collision.
    pub fn collide(c: &crate::model_state::Collision) -> Step {
        Step::Collide {
            room: c.room,
            req: c.req,
            prompt_len: c.prompt_len,
            max_new_tokens: c.max_new_tokens,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MessageStep {
    Deliver,
    Overtake,
    Duplicate,
    Lose,
    FailWrite,
    /// A KV write delivered altered by this data fault (`deliver-corrupt`, ...). For
    /// [`DataFault::StaleDuplicate`] (`deliver-stale-duplicate`): a kept copy of a
    /// write that landed earlier lands again.
    Alter(DataFault),
    /// A KV write delivered, and a copy of it kept in the network to land again later
    /// as a stale duplicate (`deliver-keep-copy`).
    KeepCopy,
}

impl MessageStep {
    fn word(self) -> String {
        match self {
            MessageStep::Deliver => "deliver".into(),
            MessageStep::Overtake => "overtake".into(),
            MessageStep::Duplicate => "duplicate".into(),
            MessageStep::Lose => "lose".into(),
            MessageStep::FailWrite => "fail-write".into(),
            MessageStep::Alter(fault) => format!("deliver-{}", fault.name()),
            MessageStep::KeepCopy => "deliver-keep-copy".into(),
        }
    }
}

/// A schedule: steps in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Schedule(pub Vec<Step>);

/// A line that is not a step.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("schedule line {line}: {reason}: `{text}`")]
pub struct ParseError {
    pub line: usize,
    pub text: String,
    pub reason: String,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Submit {
                req,
                tenant,
                prompt_len,
                max_new_tokens,
            } => write!(
                f,
                "submit {req} t{tenant} prompt={prompt_len} max_new={max_new_tokens}"
            ),
            Step::Cancel { req } => write!(f, "cancel {req}"),
            Step::Message {
                how,
                from,
                to,
                summary,
            } => write!(f, "{} {from} -> {to} | {summary}", how.word()),
            Step::Fire { node, timer } => {
                write!(f, "fire {node} {}", crate::model_state::timer_text(*timer))
            }
            Step::Refire { node, timer } => {
                write!(
                    f,
                    "refire {node} {}",
                    crate::model_state::timer_text(*timer)
                )
            }
            Step::Crash { node } => write!(f, "crash {node}"),
            Step::Pause { node } => write!(f, "pause {node}"),
            Step::Wake { node } => write!(f, "wake {node}"),
            Step::Collide {
                room,
                req,
                prompt_len,
                max_new_tokens,
            } => write!(
                f,
                "collide {room} {req} prompt={prompt_len} max_new={max_new_tokens}"
            ),
        }
    }
}

impl fmt::Display for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for s in &self.0 {
            writeln!(f, "{s}")?;
        }
        Ok(())
    }
}

fn node(s: &str) -> Option<NodeId> {
    s.strip_prefix('n')?.parse().ok().map(NodeId)
}

fn req(s: &str) -> Option<RequestId> {
    s.strip_prefix("req")?.parse().ok().map(RequestId)
}

/// `room1.g1` as `RoomKey::Display` writes it.
pub fn room(s: &str) -> Option<RoomKey> {
    let (r, g) = s.strip_prefix("room")?.split_once(".g")?;
    Some(RoomKey::new(r.parse().ok()?, g.parse().ok()?))
}

fn field<T: std::str::FromStr>(word: Option<&str>, key: &str) -> Option<T> {
    word?.strip_prefix(key)?.strip_prefix('=')?.parse().ok()
}

fn parse_step(text: &str) -> Result<Step, String> {
    let mut words = text.split_whitespace();
    let verb = words.next().ok_or("empty line")?;
    let how = match verb {
        "submit" => return parse_submit(words),
        "cancel" => {
            let r = req(words.next().unwrap_or("")).ok_or("expected reqN")?;
            return Ok(Step::Cancel { req: r });
        }
        "fire" | "refire" => {
            let n = node(words.next().unwrap_or("")).ok_or("expected nN")?;
            let timer = parse_timer(words)?;
            return Ok(if verb == "fire" {
                Step::Fire { node: n, timer }
            } else {
                Step::Refire { node: n, timer }
            });
        }
        "crash" | "pause" | "wake" => {
            let n = node(words.next().unwrap_or("")).ok_or("expected nN")?;
            return Ok(match verb {
                "crash" => Step::Crash { node: n },
                "pause" => Step::Pause { node: n },
                _ => Step::Wake { node: n },
            });
        }
        "collide" => {
            let rm = room(words.next().unwrap_or("")).ok_or("expected roomN.gM")?;
            let r = req(words.next().unwrap_or("")).ok_or("expected reqN")?;
            let prompt_len = field(words.next(), "prompt").ok_or("expected prompt=N")?;
            let max_new_tokens = field(words.next(), "max_new").ok_or("expected max_new=N")?;
            return Ok(Step::Collide {
                room: rm,
                req: r,
                prompt_len,
                max_new_tokens,
            });
        }
        "deliver" => MessageStep::Deliver,
        "overtake" => MessageStep::Overtake,
        "duplicate" => MessageStep::Duplicate,
        "lose" => MessageStep::Lose,
        "fail-write" => MessageStep::FailWrite,
        "deliver-keep-copy" => MessageStep::KeepCopy,
        _ => match verb
            .strip_prefix("deliver-")
            .and_then(|name| DataFault::ALL.into_iter().find(|f| f.name() == name))
        {
            Some(fault) => MessageStep::Alter(fault),
            None => return Err(format!("unknown step `{verb}`")),
        },
    };
    parse_message(text, how)
}

/// `submit reqN tN prompt=N max_new=N`, after the verb.
fn parse_submit<'a>(mut words: impl Iterator<Item = &'a str>) -> Result<Step, String> {
    let r = req(words.next().unwrap_or("")).ok_or("expected reqN")?;
    let tenant = words
        .next()
        .and_then(|w| w.strip_prefix('t')?.parse().ok())
        .ok_or("expected tN")?;
    let prompt_len = field(words.next(), "prompt").ok_or("expected prompt=N")?;
    let max_new_tokens = field(words.next(), "max_new").ok_or("expected max_new=N")?;
    Ok(Step::Submit {
        req: r,
        tenant,
        prompt_len,
        max_new_tokens,
    })
}

/// A timer after a `fire nN` / `refire nN`: `Compute`, `Bootstrap roomR.gG`,
/// `DrainRetry roomR.gG #N`, ...
fn parse_timer<'a>(mut words: impl Iterator<Item = &'a str>) -> Result<Timer, String> {
    let kind = words.next().ok_or("expected a timer")?;
    let rk = words.next().map(|w| room(w).ok_or("expected roomR.gG"));
    Ok(match (kind, rk) {
        ("Compute", None) => Timer::Compute,
        ("Bootstrap", Some(r)) => Timer::Bootstrap(r?),
        ("WaitingForKv", Some(r)) => Timer::WaitingForKv(r?),
        ("DrainRetry", Some(r)) => {
            let arming = words
                .next()
                .and_then(|w| w.strip_prefix('#')?.parse().ok())
                .ok_or("expected #N (the drain retry's arming)")?;
            Timer::DrainRetry(r?, arming)
        }
        ("Request", Some(r)) => Timer::Request(r?),
        ("Lease", Some(r)) => Timer::Lease(r?),
        ("Heartbeat", Some(r)) => Timer::Heartbeat(r?),
        ("Pairing", Some(r)) => Timer::Pairing(r?),
        _ => return Err("unknown timer".into()),
    })
}

/// `verb nA -> nB | message summary`: a step on a message in flight.
fn parse_message(text: &str, how: MessageStep) -> Result<Step, String> {
    let (head, summary) = text
        .split_once(" | ")
        .ok_or("expected `from -> to | message`")?;
    let mut hw = head.split_whitespace().skip(1);
    let from = node(hw.next().unwrap_or("")).ok_or("expected a sender nN")?;
    if hw.next() != Some("->") {
        return Err("expected `->`".into());
    }
    let to = node(hw.next().unwrap_or("")).ok_or("expected a receiver nN")?;
    Ok(Step::Message {
        how,
        from,
        to,
        summary: summary.trim().to_string(),
    })
}

impl Schedule {
    /// Parse the text form; blank lines and `#` comments are skipped.
    pub fn parse(text: &str) -> Result<Schedule, ParseError> {
        let mut steps = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let t = line.trim();
            if t.is_empty() || t.starts_with('#') {
                continue;
            }
            let step = parse_step(t).map_err(|reason| ParseError {
                line: i + 1,
                text: t.to_string(),
                reason,
            })?;
            steps.push(step);
        }
        Ok(Schedule(steps))
    }

    /// The schedule of a model path (`(state before, action)` pairs).
    pub fn from_path(model: &HandoffModel, path: &[(State, Action)]) -> Schedule {
        Schedule(path.iter().map(|(s, a)| step_of(model, s, a)).collect())
    }
}

/// The schedule step of one action taken from state `s`.
pub fn step_of(model: &HandoffModel, s: &State, a: &Action) -> Step {
    let message =
        |how, e: &kvsim_oracle::shared::Shared<crate::model_state::Envelope>| Step::Message {
            how,
            from: e.get().from,
            to: e.get().to,
            summary: e.get().msg.summary(),
        };
    match a {
        Action::Submit(slot) => {
            let c = &s.clients()[*slot as usize];
            let spec = model.client_spec(c);
            Step::Submit {
                req: RequestId(s.clients().iter().filter(|c| c.req.is_some()).count() as u64),
                tenant: spec.tenant,
                prompt_len: spec.prompt_len,
                max_new_tokens: spec.max_new_tokens,
            }
        }
        Action::Cancel(slot) => Step::Cancel {
            req: s.clients()[*slot as usize].req.unwrap_or_default(),
        },
        Action::Deliver(e) => message(MessageStep::Deliver, e),
        Action::Overtake(e) => message(MessageStep::Overtake, e),
        Action::Duplicate(e) => message(MessageStep::Duplicate, e),
        Action::Lose(e) => message(MessageStep::Lose, e),
        Action::FailWrite(e) => message(MessageStep::FailWrite, e),
        Action::Fire(node, timer) => Step::Fire {
            node: *node,
            timer: *timer,
        },
        Action::Refire(node, timer) => Step::Refire {
            node: *node,
            timer: *timer,
        },
        Action::Alter(e, fault) => message(MessageStep::Alter(*fault), e),
        Action::KeepStale(e) => message(MessageStep::KeepCopy, e),
        Action::LandStale(c) => Step::Message {
            how: MessageStep::Alter(DataFault::StaleDuplicate),
            from: c.get().env.from,
            to: c.get().env.to,
            summary: c.get().env.msg.summary(),
        },
        Action::Crash(node) => Step::Crash { node: *node },
        Action::Pause(node) => Step::Pause { node: *node },
        Action::Wake(node) => Step::Wake { node: *node },
        Action::Collide(c) => Step::collide(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trips() {
        let text = "\
submit req0 t1 prompt=3 max_new=1
cancel req0
deliver n0 -> n2 | DecodeStart room1.g1 prompt=3 max_new=1 prefill=n1
fail-write n1 -> n2 | KvWrite room1.g1 chunk=0 src=[p1@g1] dst=[p1@g1]
fire n1 Compute
fire n0 Request room12.g3
crash n2
pause n1
wake n1
refire n2 WaitingForKv room1.g1
deliver-corrupt n1 -> n2 | KvWrite room1.g1 chunk=0 src=[p1@g1] dst=[p1@g1]
deliver-keep-copy n1 -> n2 | KvWrite room1.g1 chunk=0 src=[p1@g1] dst=[p1@g1]
refire n2 DrainRetry room1.g1 #1
collide room1.g1 req281474976710657 prompt=2 max_new=1
";
        let s = Schedule::parse(text).unwrap();
        assert_eq!(s.0.len(), 14);
        assert_eq!(
            s.0[13],
            Step::Collide {
                room: RoomKey::new(1, 1),
                req: RequestId(1 << 48 | 1),
                prompt_len: 2,
                max_new_tokens: 1,
            }
        );
        assert_eq!(s.0[7], Step::Pause { node: NodeId(1) });
        assert!(matches!(
            s.0[11],
            Step::Message {
                how: MessageStep::KeepCopy,
                ..
            }
        ));
        assert_eq!(
            s.0[12],
            Step::Refire {
                node: NodeId(2),
                timer: Timer::DrainRetry(RoomKey::new(1, 1), 1),
            }
        );
        // A drain retry names its arming.
        let err = Schedule::parse("fire n2 DrainRetry room1.g1").unwrap_err();
        assert!(err.reason.contains("arming"), "{}", err.reason);
        assert_eq!(
            s.0[10],
            Step::Message {
                how: MessageStep::Alter(DataFault::Corrupt),
                from: NodeId(1),
                to: NodeId(2),
                summary: "KvWrite room1.g1 chunk=0 src=[p1@g1] dst=[p1@g1]".into(),
            }
        );
        // Every data fault the world defines has a step of its own.
        for fault in DataFault::ALL {
            let line = format!("deliver-{} n1 -> n2 | KvWrite", fault.name());
            let parsed = Schedule::parse(&line).unwrap();
            assert_eq!(parsed.to_string().trim_end(), line);
        }
        assert_eq!(s.to_string(), text);
        let err = Schedule::parse("teleport n1").unwrap_err();
        assert_eq!(err.line, 1);
    }
}
