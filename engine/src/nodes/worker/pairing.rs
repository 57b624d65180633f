//! The pairing of a room's two halves between their worker fronts, as engine
//! messages the world carries: decode's front registers the room at its prefill's
//! bootstrap (`Msg::Register`, SGLang's decode registering its KV receiver with
//! prefill's bootstrap server), the bootstrap answers with prefill's incarnation
//! (`Msg::Registered`), prefill's half waits (at most `wait_ns`) for that
//! registration, and prefill's front tells decode's when its half ended
//! (`Msg::PrefillDone`, run or not). Not a half's start at the node (`halves.rs`).

use super::state::{FrontEffect, WorkerFront, EARLY_DONE, MAX_REGISTERED};
use crate::ids::{NodeId, RoomKey};
use crate::msg::{Msg, Side, Status, Why};
use crate::nodes::role::Role;

impl WorkerFront {
    /// A message from node `from`'s front. A front ignores what is not its side's.
    pub(super) fn on_peer(&mut self, from: NodeId, msg: Msg, out: &mut Vec<FrontEffect>) {
        match (self.role, msg) {
            (Role::Decode, Msg::Registered { room, epoch }) => {
                self.registered_at(from, room, epoch, out)
            }
            (Role::Decode, Msg::PrefillDone { room, status, why }) => {
                self.prefill_ended(from, room, status, why, out)
            }
            (Role::Prefill, Msg::Register { room }) => self.take_registration(from, room, out),
            _ => {}
        }
    }

    /// Decode: is `room`'s half held for its registration at prefill node `prefill`?
    fn held_for(&self, room: RoomKey, prefill: NodeId) -> bool {
        matches!(self.held.get(&room), Some((Msg::DecodeStart { prefill: p, .. }, _)) if *p == prefill)
    }

    /// Decode: prefill node `prefill`'s bootstrap took `room`'s registration as
    /// incarnation `epoch`: the held half starts. A copy, or an answer for a room not
    /// held, still says which incarnation answered (the epoch rule).
    fn registered_at(
        &mut self,
        prefill: NodeId,
        room: RoomKey,
        epoch: u32,
        out: &mut Vec<FrontEffect>,
    ) {
        if !self.held_for(room, prefill) {
            self.prefill_incarnation(prefill, epoch, out);
            return;
        }
        if let Some((msg, max_new_tokens)) = self.held.remove(&room) {
            self.begin(room, msg, max_new_tokens, Some(epoch), out);
        }
    }

    /// Decode: prefill's word that its half of `room` ended. A held half whose
    /// prefill failed before taking its registration ends with prefill's status (the
    /// node never saw it); otherwise the word is prefill's half's end.
    fn prefill_ended(
        &mut self,
        from: NodeId,
        room: RoomKey,
        status: Status,
        why: Option<Why>,
        out: &mut Vec<FrontEffect>,
    ) {
        if self.held_for(room, from) {
            if !status.is_ok() {
                self.held.remove(&room);
                let ev = self.done(status, why, Side::Prefill, Vec::new());
                out.push(FrontEffect::Answer { room, ev });
            }
            return;
        }
        self.peer_done(room, status, why, out);
    }

    /// Prefill's bootstrap: decode node `decode` registers `room`. It is answered with
    /// this incarnation; a half held for it starts, with `decode` as its peer; a half
    /// that already ended here without running is told at once; otherwise the
    /// registration waits (at most `wait_ns`) for the router's request. A copy of a
    /// registration taken is answered again and changes nothing; a table full refuses
    /// it (503, as prefill's word).
    fn take_registration(&mut self, decode: NodeId, room: RoomKey, out: &mut Vec<FrontEffect>) {
        let taken = self.halves.get(&room).map(|h| h.peer);
        let copy = taken == Some(Some(decode)) || self.registered.get(&room) == Some(&decode);
        let full = self.registered.len() >= MAX_REGISTERED && !self.held.contains_key(&room);
        if full && !copy {
            tell(out, decode, room, Status::UNAVAILABLE, None);
            return;
        }
        let epoch = self.epoch;
        let registered = FrontEffect::Send {
            to: decode,
            msg: Msg::Registered { room, epoch },
        };
        if copy || taken.is_some() {
            out.push(registered);
            return;
        }
        if let Some((mut msg, max_new_tokens)) = self.held.remove(&room) {
            if let Msg::PrefillStart { decode: d, .. } = &mut msg {
                *d = decode;
            }
            // The half goes to the node before the answer to decode: a start the node
            // refuses at once is answered (`PrefillDone`) before `Registered` leaves,
            // so decode's held half ends with prefill's status and reason instead of
            // starting a transfer prefill will fail (a driver delivering `ToNode` in
            // the same step, as the runtime does, sends the two in that order).
            self.begin(room, msg, max_new_tokens, None, out);
            out.push(registered);
            return;
        }
        out.push(registered);
        if let Some(i) = self.gone.iter().position(|(r, _)| *r == room) {
            let (_, status) = self.gone.remove(i).unwrap_or((room, Status::INTERNAL));
            tell(out, decode, room, status, None);
            return;
        }
        self.registered.insert(room, decode);
        let after_ns = self.wait_ns;
        out.push(FrontEffect::Wait { room, after_ns });
    }

    /// Prefill: `room`'s pairing wait is over. A half still waiting for decode's
    /// registration is answered 504; a registration no half took is dropped and its
    /// decode told (504), so the abandoned decode half ends.
    pub(super) fn wait_over(&mut self, room: RoomKey, out: &mut Vec<FrontEffect>) {
        if self.role == Role::Decode {
            return;
        }
        if self.held.remove(&room).is_some() {
            let ev = self.done(Status::GATEWAY_TIMEOUT, None, Side::Prefill, Vec::new());
            out.push(FrontEffect::Answer { room, ev });
            self.ended_unrun(room, Status::GATEWAY_TIMEOUT, out);
        } else if let Some(decode) = self.registered.remove(&room) {
            tell(out, decode, room, Status::GATEWAY_TIMEOUT, None);
        }
    }

    /// Prefill: `room`'s half ended here without running, with `status`: its decode,
    /// registered now or later, is told.
    pub(super) fn ended_unrun(
        &mut self,
        room: RoomKey,
        status: Status,
        out: &mut Vec<FrontEffect>,
    ) {
        if let Some(decode) = self.registered.remove(&room) {
            tell(out, decode, room, status, None);
            return;
        }
        if self.gone.len() >= EARLY_DONE {
            self.gone.pop_front();
        }
        self.gone.push_back((room, status));
    }
}

/// Prefill's word to `decode` that its half of `room` ended with `status`.
fn tell(
    out: &mut Vec<FrontEffect>,
    decode: NodeId,
    room: RoomKey,
    status: Status,
    why: Option<Why>,
) {
    let msg = Msg::PrefillDone { room, status, why };
    out.push(FrontEffect::Send { to: decode, msg });
}
