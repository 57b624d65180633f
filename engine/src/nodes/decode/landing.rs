//! The transfer: the node's memory taking a KV write (for the world, which lands it),
//! a landing the receiver's software copied (two-sided) traced and completed, and the
//! verdict on completion (defense 2) over what the destination pages store. It does
//! not release pages nor run the decode loop.

use super::state::{DecodeNode, Phase, Request, TransferFacts, Verdict};
use crate::bugs::Bug;
use crate::env::{Outbox, Timer};
use crate::gpu::{device_fault, ids, DeviceError, Gpu, TagError};
use crate::ids::{NodeId, PageTag, RoomKey, WriteId};
use crate::kv::{land, PageRecords, Refusal};
use crate::msg::{KvWrite, Msg, Status, TransferOutcome, Why};
use crate::trace::{NodeFault, Side, TraceEvent};

impl<G: Gpu, P: PageRecords> DecodeNode<G, P> {
    /// A write its receiver already landed (or refused), entering through `handle`: the
    /// peer rule of a delivered write first, then [`Self::landed`].
    pub(super) fn on_landed(
        &mut self,
        from: NodeId,
        id: WriteId,
        dst: Vec<PageTag>,
        landing: Result<(), Refusal>,
        env: &mut Outbox<G::Kv>,
    ) {
        if let Err(reason) = self.check_writer(from, id) {
            // Refused as the delivered write would be, by the same rule, with the one
            // completion the writer is owed.
            let node = self.id;
            let kind = "KvWrite";
            self.counters
                .refuse_peer(env, node, from, Some(id.room), kind, reason);
            env.send(from, Msg::WriteDone { id, ok: false });
            return;
        }
        self.landed(from, id, dst, landing, env)
    }

    /// The receiver's memory takes the KV write `write` ([`land`], the one landing
    /// function): gated by the node's ownership record when `gate` (the landing gate,
    /// which only receiver software that sees the write can run), placed wherever it
    /// points inside the registered pool otherwise. Only the world calls it
    /// ([`crate::world::receive`]): on a one-sided transport it is the receiver's NIC,
    /// and the node's software runs nothing.
    pub(crate) fn take_write(&mut self, write: &KvWrite<G::Kv>, gate: bool) -> Result<(), Refusal> {
        land(
            &self.pool,
            &mut self.gpu,
            gate,
            write.id.room,
            &write.dst,
            &write.kv,
        )
    }

    /// A KV write of `from` landed in (or was refused by) this node's memory, copied
    /// by the receiver's software (a two-sided transport: [`crate::world::receive`],
    /// the hardware runtime's transfer thread): trace it and complete the write
    /// (exactly one completion). Nothing is noted: verification reads what the pages
    /// store ([`Self::unwritten`]).
    pub(super) fn landed(
        &mut self,
        from: NodeId,
        id: WriteId,
        dst: Vec<PageTag>,
        landing: Result<(), Refusal>,
        env: &mut Outbox<G::Kv>,
    ) {
        if let Err(Refusal { tag, reason }) = landing {
            self.counters.writes_refused += 1;
            env.trace(TraceEvent::KvRefused {
                node: self.id,
                write: id,
                tag,
                reason,
            });
            env.send(from, Msg::WriteDone { id, ok: false });
            return;
        }
        assert!(
            self.check_writer(from, id).is_ok(),
            "a landing reaches here only past the peer rule"
        );
        env.trace(TraceEvent::KvLanded {
            node: self.id,
            write: id,
            dst,
        });
        env.send(from, Msg::WriteDone { id, ok: true });
    }

    /// Prefill concluded the room's transfer: judge it ([`Self::judge_transfer`]), then
    /// accept it and run the request, or fail the room (refused at verification, a
    /// reported failure, or this node's device failing the check).
    pub(super) fn on_kv_done(
        &mut self,
        from: NodeId,
        room: RoomKey,
        outcome: TransferOutcome,
        env: &mut Outbox<G::Kv>,
    ) {
        let Some(req) = self.requests.get(&room) else {
            return;
        };
        let Phase::Transferring { pages, dst_pages } = &req.phase else {
            return;
        };
        env.trace(TraceEvent::TransferReported {
            node: self.id,
            room,
            from,
            success: matches!(outcome, TransferOutcome::Success { .. }),
        });
        let dst = &pages[..*dst_pages];
        let unwritten = self.unwritten(room, dst);
        let verdict = self.judge_transfer(req, dst, &unwritten, &outcome);
        let facts = TransferFacts {
            from,
            prompt_len: req.prompt_len,
            reserved_pages: *dst_pages as u32,
            fully_written: matches!(unwritten, Ok(None)),
        };
        match (verdict, outcome) {
            (Verdict::Accept { tokens, pages }, _) => {
                self.accept_transfer(room, facts, tokens, pages, env)
            }
            (Verdict::Reject(reason), TransferOutcome::Success { tokens, pages, .. }) => {
                self.refuse_transfer(room, facts, (tokens, pages), reason, env)
            }
            (Verdict::Reject(reason), TransferOutcome::Failed) => {
                self.counters.transfers_failed += 1;
                env.trace(TraceEvent::TransferFailed {
                    node: self.id,
                    room,
                    reason,
                });
                self.fail(room, Status::INTERNAL, Some(Why::TransferFailed), env);
            }
            (Verdict::Device(e), _) => {
                self.counters.transfers_failed += 1;
                self.device_failed(room, &e, env);
            }
        }
    }

    /// The first of the destination pages `dst` of `room` that no write of this room
    /// use stamped (its page tag is not `room`'s with the page's generation), or `None`
    /// when every one carries it. What the receiver can see of a transfer: the tag a
    /// write lands with each page, read from its own memory, whichever transport (and
    /// NIC) placed the bytes.
    pub(super) fn unwritten(
        &self,
        room: RoomKey,
        dst: &[PageTag],
    ) -> Result<Option<PageTag>, DeviceError> {
        match self.gpu.check_tags(dst, room) {
            Ok(()) => Ok(None),
            Err(TagError::Mismatch(m)) => Ok(Some(m.expected)),
            Err(TagError::Device(e)) => Err(e),
        }
    }

    /// Defense 2, verify on completion: do prefill's token and page counts, the
    /// destination pages' tags ([`Self::unwritten`]) and the checksum agree with what
    /// this node reserved? Reads only.
    pub(super) fn judge_transfer(
        &self,
        req: &Request,
        dst_tags: &[PageTag],
        unwritten: &Result<Option<PageTag>, DeviceError>,
        outcome: &TransferOutcome,
    ) -> Verdict {
        let dst = ids(dst_tags);
        let verify = self.cfg.defenses.verify_on_completion;
        let checksum_is = |tokens: u64, want: u64, what: &str| match self.gpu.digest(&dst, tokens) {
            Err(e) => Err(Verdict::Device(e)),
            Ok(d) if d != want => Err(Verdict::Reject(format!("checksum over {what} differs"))),
            Ok(_) => Ok(()),
        };
        match *outcome {
            TransferOutcome::Failed if self.cfg.bugs.has(Bug::FailOpenOnRecvError) => {
                // vLLM #52234: a receive failure is treated as done; the request runs
                // on whatever its pages hold.
                Verdict::Accept {
                    tokens: 0,
                    pages: 0,
                }
            }
            TransferOutcome::Failed => {
                Verdict::Reject("prefill reported the transfer failed".into())
            }
            TransferOutcome::Success {
                tokens,
                pages,
                checksum,
            } => {
                let checked = if verify && !self.cfg.bugs.has(Bug::NoLengthAgreement) {
                    if tokens != req.prompt_len {
                        Err(Verdict::Reject(format!(
                            "prefill sent {tokens} tokens, decode expects {}",
                            req.prompt_len
                        )))
                    } else if pages as usize != dst_tags.len() {
                        Err(Verdict::Reject(format!(
                            "prefill sent {pages} pages, decode reserved {}",
                            dst_tags.len()
                        )))
                    } else {
                        match unwritten {
                            Err(e) => Err(Verdict::Device(e.clone())),
                            Ok(Some(t)) => Err(Verdict::Reject(format!(
                                "destination page {t} was never written"
                            ))),
                            Ok(None) => {
                                checksum_is(req.prompt_len, checksum, "the reserved prompt")
                            }
                        }
                    }
                } else if verify {
                    // The legacy digest covers only what prefill says it sent.
                    checksum_is(tokens, checksum, "the sent tokens")
                } else {
                    Ok(())
                };
                match checked {
                    Ok(()) => Verdict::Accept { tokens, pages },
                    Err(v) => v,
                }
            }
        }
    }

    /// Verification refused prefill's successful transfer: state both sides' counts and
    /// fail the room (its pages go to quarantine: a write may still land).
    pub(super) fn refuse_transfer(
        &mut self,
        room: RoomKey,
        facts: TransferFacts,
        (sent_tokens, sent_pages): (u64, u32),
        reason: String,
        env: &mut Outbox<G::Kv>,
    ) {
        self.counters.transfers_failed += 1;
        env.trace(TraceEvent::TransferRefused {
            node: self.id,
            room,
            claim: facts.claim((sent_tokens, sent_pages)),
            reason,
        });
        self.fail(room, Status::INTERNAL, Some(Why::TransferRefused), env);
    }

    /// The transfer was accepted: the destination pages hold verified KV; the request
    /// starts generating.
    pub(super) fn accept_transfer(
        &mut self,
        room: RoomKey,
        facts: TransferFacts,
        sent_tokens: u64,
        sent_pages: u32,
        env: &mut Outbox<G::Kv>,
    ) {
        let Some(Phase::Transferring {
            pages, dst_pages, ..
        }) = self.requests.get(&room).map(|r| &r.phase)
        else {
            return;
        };
        let dst_tags = pages[..*dst_pages].to_vec();
        // Under fail-open they may be Writing still; mark_ready accepts both.
        if let Err(e) = self.pool.mark_ready(room, &dst_tags) {
            self.fault(NodeFault::record_refused(room, "mark-ready", &e), env);
        }
        self.flush(env, None);
        env.trace(TraceEvent::TransferAccepted {
            node: self.id,
            room,
            claim: facts.claim((sent_tokens, sent_pages)),
        });
        env.trace(TraceEvent::Running {
            node: self.id,
            room,
            side: Side::Decode,
        });
        env.cancel_timer(Timer::WaitingForKv(room));
        if let Some(r) = self.requests.get_mut(&room) {
            let pages = std::mem::take(&mut r.phase).into_pages();
            r.phase = Phase::Running {
                pages,
                seq_len: facts.prompt_len,
                step: 0,
            };
        }
        self.arm_compute(env);
    }

    /// The device failed serving `room`: state it, and fail the request with its reason
    /// (its pages released, or quarantined while a write may still land).
    pub(super) fn device_failed(
        &mut self,
        room: RoomKey,
        e: &DeviceError,
        env: &mut Outbox<G::Kv>,
    ) {
        self.fault(device_fault(Some(room), e), env);
        let why = Some(Why::DeviceFailed { side: Side::Decode });
        match self.requests.get(&room).map(|r| &r.phase) {
            Some(Phase::Running { .. }) => self.finish(room, Status::INTERNAL, why, env),
            _ => self.fail(room, Status::INTERNAL, why, env),
        }
    }
}
