//! Messages that arrive inside one transition: delivered, failed on the wire, landed
//! altered by a data fault, or kept to land again as a stale duplicate.
//!
//! The world's rules ([`world::arrival`]) decide each arrival; the node's handling
//! of it is [`crate::model::tx`]'s dispatch.

use crate::memo::Cause;
use crate::model::tx::Tx;
use crate::model_state::{altered, stale_landing, Envelope, StaleCopy};
use kvsim_engine::msg::Carried;
use kvsim_engine::world::{self, Arrival, DataFault};
use kvsim_oracle::schema::{FaultEvent, Record};
use kvsim_oracle::shared::Shared;

impl Tx<'_> {
    /// A KV write lands and the network keeps a copy of it, to land again later.
    #[inline]
    pub(super) fn keep_stale(&mut self, e: &Shared<Envelope>) {
        self.s.book(|b| b.faults.data_faults += 1);
        if !self.s.take(e) {
            return;
        }
        // The oracle's facts of the write as it is in flight now, before
        // it lands (the simulator's oracle keeps them at the landing).
        let facts = e
            .get()
            .msg
            .write_id()
            .and_then(|id| self.s.oracle.get().write_in_flight(id).cloned());
        self.event_text(|| "the network keeps a copy of the KV write, to land again later".into());
        self.deliver(e, false, None);
        self.s.keep_stale(StaleCopy {
            env: e.get().clone(),
            facts,
        });
    }

    /// A message arrives; the world's rules ([`world::arrival`]) decide what follows.
    /// `fail`: the environment fails this KV write on the wire; `fault`: a KV write
    /// that is delivered lands altered by this data fault ([`crate::model_state::altered`]).
    pub(super) fn deliver(
        &mut self,
        shared: &Shared<Envelope>,
        fail: bool,
        fault: Option<DataFault>,
    ) {
        let env = shared.get();
        let transport = self.m.spec.engine.transport;
        if self.s.faults().is_overdue(env.to) && transport.arrival_waits_for_receiver(&env.msg) {
            // The woken node's loop ran: what was overdue has had its chance.
            self.s.book(|b| b.faults.overdue = 0);
        }
        let at = self.m.arriving(&self.s, env.to, fail);
        match world::arrival(&env.msg, &at) {
            Arrival::Deliver => {
                let altered = fault.and_then(|f| altered(&self.m.spec, env.to, &env.msg, f));
                match (altered, env.msg.write_id()) {
                    (Some((msg, a)), Some(write)) => {
                        self.event_text(|| {
                            format!(
                                "the KV write {write} lands {}: its page meant for {} lands at {}",
                                a.fault.name(),
                                a.meant,
                                a.landed
                            )
                        });
                        self.record(&Record::Fault(FaultEvent::data_fault(
                            env.from, env.to, write, &a,
                        )));
                        let changed = Shared::new(Envelope {
                            from: env.from,
                            to: env.to,
                            msg,
                        });
                        self.dispatch(env.to, Cause::Delivered(changed))
                    }
                    _ => self.dispatch(env.to, Cause::Delivered(shared.clone())),
                }
            }
            Arrival::Drop(_) => {}
            Arrival::Fail { reason, completion } => {
                if let Some(write) = env.msg.write_id() {
                    self.event_text(|| {
                        format!("the KV write {write} fails on the wire ({reason:?})")
                    });
                    self.record(&Record::WriteFailed {
                        from: env.from,
                        to: env.to,
                        write,
                        reason,
                    });
                }
                // The poster's NIC reports the failure (the writer, or a READ's reader).
                let to = world::poster(&env.msg).map_or(env.from, |(p, _)| p);
                self.s.send(Envelope {
                    from: env.to,
                    to,
                    msg: Carried::Msg(completion),
                });
            }
        }
    }

    /// A kept copy of a KV write lands again as a stale duplicate. The world's rule for
    /// an arriving write applies (one that would fail is simply gone: its writer knows
    /// nothing of it); one that lands is announced with the simulator's `data_fault`
    /// record and handed to its node, whose completion of it is dropped.
    pub(super) fn land_stale(&mut self, copy: &StaleCopy) {
        let env = &copy.env;
        let at = self.m.arriving(&self.s, env.to, false);
        if !matches!(world::arrival(&env.msg, &at), Arrival::Deliver) {
            return;
        }
        let Some(write) = env.msg.write_id() else {
            return;
        };
        let Some(a) = self
            .s
            .pool(env.to)
            .and_then(|pool| stale_landing(pool, &env.msg))
        else {
            return;
        };
        self.event_text(|| {
            format!(
                "a stale duplicate of the KV write {write} lands: its page {} lands over {}",
                a.landed, a.meant
            )
        });
        self.record(&Record::Fault(FaultEvent::data_fault(
            env.from, env.to, write, &a,
        )));
        self.replaying = Some(write);
        self.replay = copy.facts.clone();
        self.dispatch(env.to, Cause::Delivered(Shared::new(env.clone())));
        self.replaying = None;
        self.replay = None;
    }
}
