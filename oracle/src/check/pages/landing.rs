//! The page rules that meet the writes in flight at their destination: a write's
//! target no longer its room's, landings accepted or refused, stray landings judged
//! by their effect, isolation, and reads of slots the room never wrote (S2, S3). It
//! does not judge releases ([`crate::check::pages::release`]).

use crate::check::book::Provenance;
use crate::check::pages::nodes::Pages;
use crate::check::rooms::Rooms;
use crate::check::{draft, Drafts};
use crate::schema::RunHeader;
use kvsim_engine::ids::{NodeId, PageTag, RoomKey};
use kvsim_engine::invariant::Invariant;
use kvsim_engine::kv::PageState;

/// Landings, reads and releases: the page rules that meet the writes in flight.
impl Pages {
    /// S2 on a write's destination: the first page that no longer belongs to its room.
    pub fn write_target_breach(
        &self,
        node: NodeId,
        room: RoomKey,
        dst: &[PageTag],
    ) -> Option<(PageTag, String)> {
        let book = self.book(node)?;
        dst.iter().find_map(|t| {
            let ok = book.page(t.page).is_some_and(|p| {
                p.gen == t.gen
                    && p.owner == Some(room)
                    && (p.state.is_owned() || p.state == PageState::Quarantined)
            });
            (!ok).then(|| {
                let now = book.page(t.page).map_or("not a pool page".into(), |p| {
                    format!("{} at {} for {:?}", p.state, p.gen, p.owner)
                });
                (*t, now)
            })
        })
    }

    /// A KV write of `room` landed in `dst` on `node`, carrying `prov` for each page
    /// (`None`: the send is not in the trace, a trace of the receiver only, and the
    /// write is taken as the room's, every slot). Pages the write reached although they
    /// are not its room use's (nothing checked it before it landed: a one-sided
    /// transport, or no landing gate) hold stray bytes, judged by their effect.
    pub fn landed(
        &mut self,
        h: &RunHeader,
        (node, room): (NodeId, RoomKey),
        dst: &[PageTag],
        prov: Option<&[Provenance]>,
    ) {
        let strays: Vec<PageTag> = dst
            .iter()
            .filter(|t| self.write_target_breach(node, room, &[**t]).is_some())
            .copied()
            .collect();
        let whole = Provenance {
            writer: Some(room),
            at: None,
            lo: 0,
            hi: h.page_size,
        };
        if let Some(mut b) = self.book_mut(node) {
            for (i, t) in dst.iter().enumerate() {
                let prov = prov.and_then(|p| p.get(i).copied()).unwrap_or(whole);
                if let Some(p) = b.page_mut(t.page) {
                    p.landed |=
                        p.state == PageState::Writing && p.owner == Some(room) && p.gen == t.gen;
                    p.prov = p.prov.after_landing(prov);
                    p.stray = strays.contains(t) || (p.stray && p.prov.writer != Some(room));
                }
            }
        }
    }

    /// Decode `node`'s landing gate refused `write` aimed at `dst`: S2 detected when a
    /// page of `dst` is no longer the room's (nothing landed).
    pub fn landing_refused(
        &self,
        rooms: &Rooms,
        node: NodeId,
        write: kvsim_engine::ids::WriteId,
        dst: &[PageTag],
        out: &mut Drafts,
    ) {
        let room = write.room;
        if let Some((t, now)) = self.write_target_breach(node, room, dst) {
            out.push(draft(Invariant::S2, Some(room), format!(
                    "decode {node}'s landing-time tag check refused the KV write {write} for {} aimed at page {t} (it is {now}): nothing landed",
                    rooms.describe(room)
                )).detected(Some("landing_gate")).on_page(node, t.page));
        }
    }

    /// S2 judged by its effect: `room` on `node` reads (`detected_by` `None`), or a
    /// defense refuses (the read-time tag check, verification), `pages`, and one of them
    /// holds stray bytes (a write that landed unchecked when the page was not its
    /// room's, `PageFact::stray`). A read that accepts them is the violation; a refusal
    /// is the detection. Either way the bytes have had their one effect: the flag clears.
    pub fn stray_effect(
        &mut self,
        rooms: &Rooms,
        (node, room): (NodeId, RoomKey),
        pages: &[PageTag],
        detected_by: Option<&'static str>,
        out: &mut Drafts,
    ) {
        // Stray bytes are rare: a read over pages that hold none changes nothing, so
        // the book is not copied (the model checker shares it between states).
        let any_stray = self.book(node).is_some_and(|b| {
            pages
                .iter()
                .any(|t| b.page(t.page).is_some_and(|p| p.stray))
        });
        if !any_stray {
            return;
        }
        let Some(mut b) = self.book_mut(node) else {
            return;
        };
        let mut hit = None;
        for t in pages {
            if let Some(p) = b.page_mut(t.page) {
                if p.stray && p.prov.writer != Some(room) {
                    hit.get_or_insert((*t, p.prov.writer));
                }
                p.stray = false;
            }
        }
        drop(b);
        let Some((t, writer)) = hit else {
            return;
        };
        let whose = writer.map_or("an unknown room use".to_string(), |w| rooms.describe(w));
        let what = match detected_by {
            None => format!("decode {node} read it for {}", rooms.describe(room)),
            Some(d) => format!(
                "{d} refused it for {} before any of it was read",
                rooms.describe(room)
            ),
        };
        out.push(draft(Invariant::S2, Some(room), format!(
                "a KV write of {whose} landed unchecked in decode {node} page {t} after the page left that room (no landing gate), and {what}"
            )).detected(detected_by).with_related(writer).on_page(node, t.page));
    }

    /// S3: the first attended page whose slots `0..need` were not all written by
    /// `room`, or were written for other positions than the ones read from them, with
    /// its provenance.
    fn isolation_breach(
        &self,
        h: &RunHeader,
        (node, room): (NodeId, RoomKey),
        seq_len: u64,
        pages: &[PageTag],
    ) -> Option<(usize, PageTag, Provenance)> {
        let book = self.book(node)?;
        let ps = u64::from(h.page_size);
        for (i, t) in pages.iter().enumerate() {
            let start = i as u64 * ps;
            if start >= seq_len {
                break;
            }
            let need = (seq_len - start).min(ps) as u32;
            let prov = book.page(t.page).map(|p| p.prov).unwrap_or_default();
            if !prov.covers(room, need) || !prov.meant_for(start) {
                return Some((i, *t, prov));
            }
        }
        None
    }

    /// S3 on a read of `seq_len` positions of `room` over `pages` on decode `node`
    /// (`refused`: the defense that refused the read, if one did, and the page whose
    /// check failed, which may be another than the first page the oracle finds wrong).
    pub fn read(
        &self,
        (rooms, h): (&Rooms, &RunHeader),
        (node, room): (NodeId, RoomKey),
        (seq_len, pages): (u64, &[PageTag]),
        refused: Option<(&'static str, PageTag)>,
        out: &mut Drafts,
    ) {
        let detected_by = refused.map(|(by, _)| by);
        let Some((i, t, prov)) = self.isolation_breach(h, (node, room), seq_len, pages) else {
            return;
        };
        let ps = u64::from(h.page_size);
        let start = i as u64 * ps;
        let whose = match (prov.writer, prov.at) {
            (Some(w), Some(at)) if w == room && at != start => format!(
                "its slots were written for positions {at}..{}",
                at + u64::from(prov.hi)
            ),
            (Some(w), _) if w == room => {
                format!("only slots {}..{} are its own", prov.lo, prov.hi)
            }
            (Some(w), _) => format!("it holds KV written by {}", rooms.describe(w)),
            (None, _) => "it was never written".to_string(),
        };
        let end = (start + ps).min(seq_len);
        let verb = if detected_by.is_some() {
            "the page-tag check refused the read of"
        } else {
            "reads"
        };
        let mut detail = format!(
            "decode {node} {verb} page {t} (positions {start}..{end}) for {} but {whose}",
            rooms.describe(room)
        );
        if let Some((_, at)) = refused.filter(|(_, at)| at.page != t.page) {
            detail.push_str(&format!(" (the check failed at page {at})"));
        }
        out.push(
            draft(Invariant::S3, Some(room), detail)
                .detected(detected_by)
                .with_related(prov.writer.filter(|w| *w != room))
                .on_page(node, t.page),
        );
    }
}
