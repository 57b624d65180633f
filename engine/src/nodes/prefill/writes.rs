//! The KV writes: bounded chunks with at most `max_inflight_chunks` in flight (M6),
//! the concluding send (M7), each write's completion, and the inflight poll that
//! releases source pages and answers the router. It does not handle aborts or drains.

use super::state::{Chunk, KvDoneOwed, Outstanding, Phase, PrefillNode, Sending};
use crate::bugs::Bug;
use crate::env::{Outbox, Timer};
use crate::gpu::KvPayload;
use crate::gpu::{ids, zero_on_free, DeviceError, Gpu};
use crate::ids::{NodeId, PageTag, RoomKey, WriteId};
use crate::kv::PageState;
use crate::msg::{KvWrite, Msg, Status, TransferOutcome, Why};
use crate::trace::{NodeFault, Side, TraceEvent};

impl<G: Gpu> PrefillNode<G> {
    /// Issue chunk writes up to the in-flight limit ([`Self::next_chunk`],
    /// [`Self::send_chunk`]); conclude the transfer when every one completed.
    pub(super) fn send_chunks(&mut self, room: RoomKey, env: &mut Outbox<G::Kv>) {
        while let Some(chunk) = self.next_chunk(room) {
            if let Err(e) = self.send_chunk(room, chunk, env) {
                self.send_failed_on_device(room, &e, env);
                return;
            }
        }
        self.conclude_send(room, env);
    }

    /// The next chunk write of a sending room, if the in-flight limit and the pages
    /// left allow one ([`Phase::sending`] says how many pages are sent in all).
    pub(super) fn next_chunk(&self, room: RoomKey) -> Option<Chunk> {
        let req = self.requests.get(&room)?;
        let Sending {
            dst,
            pages,
            next_page,
            in_flight,
            to_send,
        } = req.phase.sending()?;
        if in_flight >= self.cfg.max_inflight_chunks || next_page >= to_send {
            return None;
        }
        let (end, at) = self.chunk_bounds(next_page, pages.len(), to_send);
        // The prompt's last page, when partial, is sent as the slots it holds: a
        // one-sided write places the bytes it carries, so decode's generated KV in the
        // rest of that page is out of reach of this write and of any late copy of it
        // (docs/DECISIONS.md, "Two transports").
        let ps = u64::from(self.cfg.page_size).max(1);
        let slots = (req.prompt.len() as u64 % ps) as usize;
        let tail = match pages.len().checked_sub(1) {
            Some(last) if slots != 0 && (next_page..end).contains(&last) => {
                Some((last - next_page, slots))
            }
            _ => None,
        };
        assert!(next_page < end && end <= to_send && at + (end - next_page) <= to_send);
        Some(Chunk {
            src: pages[next_page..end].to_vec(),
            dst: dst[at..at + (end - next_page)].to_vec(),
            end,
            tail,
            to: req.decode,
        })
    }

    /// Where the chunk starting at page `next_page` of a prompt of `pages` pages ends,
    /// and where in decode's page list it lands. A prefix hit (`prefix_hit_pages`, at
    /// most all but the last page) skips the cached pages' forward chunks, so the first
    /// send carries them with the first computed chunk; every chunk after it is
    /// `chunk_pages` long. The defended sender writes each chunk at exactly its own
    /// position (`next_page`). Under `chunk-index-by-position` (sglang #30545) a chunk
    /// is identified by its index on the uniform chunk grid, `next_page / chunk_pages`,
    /// and lands at that grid slot: after a prefix hit that is not a whole number of
    /// chunks, every chunk after the first lands short of its position.
    fn chunk_bounds(&self, next_page: usize, pages: usize, to_send: usize) -> (usize, usize) {
        let grid = self.cfg.chunk_pages as usize;
        let hit = if next_page == 0 {
            (self.cfg.prefix_hit_pages as usize).min(pages.saturating_sub(1))
        } else {
            0
        };
        let end = (next_page + hit + grid).min(to_send);
        let at = if self.cfg.bugs.has(Bug::ChunkIndexByPosition) {
            next_page / grid * grid
        } else {
            next_page
        };
        assert!(at <= next_page, "a chunk never lands past its own position");
        (end, at)
    }

    /// Send one chunk write: read the source, hold it until the write completes (with
    /// deferred release), record the write as outstanding, state and send it.
    pub(super) fn send_chunk(
        &mut self,
        room: RoomKey,
        chunk: Chunk,
        env: &mut Outbox<G::Kv>,
    ) -> Result<(), DeviceError> {
        let Chunk {
            src,
            dst,
            end,
            tail,
            to,
        } = chunk;
        assert_eq!(src.len(), dst.len(), "a chunk writes each source page once");
        // Read before holding: a device that fails here fails the send with no hold
        // taken for a write that never leaves.
        let mut kv = self.gpu.read_pages(&ids(&src))?;
        let hold = self.hold_sources(&src, env);
        if let Some((i, slots)) = tail {
            if let Some(k) = kv.get_mut(i) {
                k.keep_slots(slots);
            }
        }
        let id = self.record_write(room, to, if hold { src.clone() } else { Vec::new() });
        env.trace(TraceEvent::KvSent {
            node: self.id,
            write: id,
            src: src.clone(),
            dst: dst.clone(),
            to: Some(to),
        });
        env.post_write(to, KvWrite { id, src, dst, kv });
        if let Some(Phase::Sending {
            next_page,
            in_flight,
            ..
        }) = self.requests.get_mut(&room).map(|r| &mut r.phase)
        {
            *next_page = end;
            *in_flight += 1;
        }
        assert!(self
            .outstanding
            .get(&room)
            .is_some_and(|o| o.chunks.contains_key(&id.chunk)));
        Ok(())
    }

    /// Hold a chunk's source pages until its write completes (deferred release, unless
    /// a bug switch releases before the drain): whether they are held.
    fn hold_sources(&mut self, src: &[PageTag], env: &mut Outbox<G::Kv>) -> bool {
        let hold = !self.cfg.bugs.has(Bug::PrefillReleaseBeforeDrain)
            && self.cfg.defenses.deferred_release;
        if hold {
            for &t in src {
                // Our own Ready pages: a refusal means the record is corrupt.
                self.pool
                    .hold(t)
                    .expect("sending room owns its source pages (S1)");
            }
            for c in self.pool.take_changes() {
                env.trace(c.into_event(self.id, None));
            }
        }
        hold
    }

    /// The id of a new chunk write of `room` to `to`, recorded as outstanding with the
    /// source pages it holds.
    fn record_write(&mut self, room: RoomKey, to: NodeId, held: Vec<PageTag>) -> WriteId {
        let out = self.outstanding.entry(room).or_insert_with(|| Outstanding {
            to,
            ..Outstanding::default()
        });
        let id = WriteId {
            writer: self.id,
            epoch: self.pool.epoch(),
            room,
            chunk: out.next_chunk,
        };
        out.next_chunk += 1;
        out.chunks.insert(id.chunk, held);
        id
    }

    /// Every chunk was sent and completed: report the transfer to decode (M7) with
    /// prefill's own counts and the digest of what it sent.
    pub(super) fn conclude_send(&mut self, room: RoomKey, env: &mut Outbox<G::Kv>) {
        let Some(req) = self.requests.get(&room) else {
            return;
        };
        let Some(Sending {
            pages,
            next_page,
            in_flight,
            to_send,
            ..
        }) = req.phase.sending()
        else {
            return;
        };
        if in_flight != 0 || next_page < to_send {
            return;
        }
        let tokens = req.prompt.len() as u64;
        let checksum = match self.gpu.digest(&ids(&pages[..to_send]), tokens) {
            Ok(c) => c,
            Err(e) => {
                self.send_failed_on_device(room, &e, env);
                return;
            }
        };
        // `is_last_chunk = curr_idx == num_kv_indices`: prefill reports its own page
        // count and token count, whatever decode reserved.
        let outcome = TransferOutcome::Success {
            tokens,
            pages: pages.len() as u32,
            checksum,
        };
        let (decode, epoch) = (req.decode, req.phase.decode_epoch());
        if let Some(r) = self.requests.get_mut(&room) {
            let reported = outcome.clone();
            r.advance(|now| match now {
                Phase::Sending { meta, pages, .. } => Phase::Inflight {
                    meta,
                    pages,
                    outcome: reported,
                },
                other => other,
            });
            assert!(matches!(r.phase, Phase::Inflight { .. }));
        }
        env.send(
            decode,
            Msg::KvDone {
                room,
                outcome,
                epoch,
            },
        );
        self.arm_compute(env);
    }

    pub(super) fn on_write_done(&mut self, id: WriteId, ok: bool, env: &mut Outbox<G::Kv>) {
        let room = id.room;
        let Some(out) = self.outstanding.get_mut(&room) else {
            return;
        };
        let Some(held) = out.chunks.remove(&id.chunk) else {
            return;
        };
        if !ok {
            out.any_failed = true;
        }
        assert!(
            !out.chunks.contains_key(&id.chunk),
            "one completion per write"
        );
        assert!(
            id.chunk < out.next_chunk,
            "a completion of a write this room sent"
        );
        env.trace(TraceEvent::WriteCompleted {
            node: self.id,
            write: id,
            ok,
        });
        let free_before = self.pool.free_count();
        for t in held {
            // Under `prefill-release-before-drain` the page may already be gone; the
            // hold then has nothing to release, which is reported, not dropped.
            if let Err(e) = self.pool.unhold(t) {
                self.fault(
                    NodeFault::HoldLost {
                        tag: t,
                        error: e.to_string(),
                    },
                    env,
                );
            }
        }
        self.flush(env);
        // The last hold on a released page frees it: like a release, that may unblock
        // the head of the waiting queue (without this a waiting request sat until a
        // timeout answered it 500, with pages free).
        if self.pool.free_count() > free_before && !self.waiting.is_empty() {
            self.arm_compute(env);
        }
        if let Some(req) = self.requests.get_mut(&room) {
            if let Phase::Sending { in_flight, .. } = &mut req.phase {
                *in_flight = in_flight.saturating_sub(1);
                if !ok {
                    // One failed write fails the room (M7 Failed, immediately).
                    self.fail_send(room, KvDoneOwed::Yes, env);
                } else {
                    self.send_chunks(room, env);
                }
            }
        }
        self.maybe_ack_drain(room, env);
    }

    /// `process_disagg_prefill_inflight_queue` for one concluded room.
    pub(super) fn poll_inflight(&mut self, room: RoomKey, env: &mut Outbox<G::Kv>) {
        let Some(req) = self.requests.get(&room) else {
            return;
        };
        let Phase::Inflight { pages, outcome, .. } = &req.phase else {
            return;
        };
        let pages = pages.clone();
        let status = match outcome {
            TransferOutcome::Success { .. } => {
                // #33507: the Success branch set FINISH_LENGTH unconditionally. The fix
                // keeps a pending abort. Under the legacy gates `to_finish` is invisible.
                let pending = if self.cfg.bugs.has(Bug::GateChecksFinishedOnly) {
                    req.finished_reason
                } else {
                    req.finished_reason.or(req.to_finish)
                };
                if self.cfg.bugs.has(Bug::SuccessOverwritesAbort) {
                    Status::OK
                } else {
                    pending.unwrap_or(Status::OK)
                }
            }
            TransferOutcome::Failed => req
                .finished_reason
                .or(req.to_finish)
                .unwrap_or(Status::INTERNAL),
        };
        self.release_source(room, &pages, env);
        self.retire(room, status, None, env);
    }

    /// `release_kv_cache` for the source pages. Held pages drain first, unless the
    /// `prefill-release-before-drain` bug frees them outright.
    pub(super) fn release_source(
        &mut self,
        room: RoomKey,
        pages: &[PageTag],
        env: &mut Outbox<G::Kv>,
    ) {
        let unchecked = self.cfg.bugs.has(Bug::PrefillReleaseBeforeDrain) && !self.drained(room);
        if unchecked {
            self.pool.free_unchecked(room, pages);
        } else if let Err(e) = self.pool.release(room, pages) {
            self.fault(NodeFault::record_refused(room, "release", &e), env);
            return;
        }
        self.flush(env);
        if self.cfg.defenses.zero_on_free {
            let pool = &self.pool;
            let is_free = |p| pool.record(p).is_some_and(|r| r.state == PageState::Free);
            let node = (self.id, &mut self.counters);
            zero_on_free(&mut self.gpu, env, node, pages, is_free);
        }
        // Freed pages may unblock the head of the waiting queue.
        if !self.waiting.is_empty() {
            self.arm_compute(env);
        }
    }

    /// Remove the request and answer the router once, with the engine's reason for an
    /// error `status` where it has one.
    pub(super) fn retire(
        &mut self,
        room: RoomKey,
        status: Status,
        why: Option<Why>,
        env: &mut Outbox<G::Kv>,
    ) {
        if self.requests.remove(&room).is_none() {
            return;
        }
        self.tombstone(room);
        env.cancel_timer(Timer::Bootstrap(room));
        self.answer(room, status, why, env);
        self.maybe_ack_drain(room, env);
    }

    /// Answer the router for `room`, once, with the engine's reason for an error
    /// `status` where it has one: a repeated answer (an abort seen again, for a use
    /// already answered) repeats the first status and reason.
    pub(super) fn answer(
        &mut self,
        room: RoomKey,
        status: Status,
        why: Option<Why>,
        env: &mut Outbox<G::Kv>,
    ) {
        let from = (self.id, self.router, Side::Prefill);
        self.retired
            .answer_once(env, from, room, (status, why), &self.outstanding);
    }
}
