//! The owner letting go of its pages: release, quarantine and the ack that ends it,
//! and the unchecked free of a crashed room's pages. Taking and dropping holds, and
//! allocation, are [`PagePool`]'s own.

use super::*;

impl PagePool {
    /// Let go of one page; `true` when it went to Draining (still held).
    fn release_one(&mut self, owner: RoomKey, tag: PageTag, op: PageOp) -> Result<bool, PoolError> {
        let rec = self.owned_mut(owner, tag)?;
        let holders = Holders::counted(rec.holders);
        let op = let_go_op(op, holders);
        rec.state = transition(rec.state, op).map_err(|source| PoolError::Illegal {
            page: tag.page,
            source,
        })?;
        rec.owner = None;
        if rec.state == PageState::Free {
            // Upstream sorts the freed ids and prepends them, so the lowest freed page
            // is handed out first: push in reverse to keep that order on our stack.
            self.free.push(tag.page);
        }
        Ok(holders == Holders::Present)
    }

    /// Let go of every tag; returns the ones that went to Draining.
    fn release_all(
        &mut self,
        owner: RoomKey,
        tags: &[PageTag],
        op: PageOp,
    ) -> Result<Vec<PageTag>, PoolError> {
        self.precheck(owner, tags, op)?;
        let mut sorted = tags.to_vec();
        sorted.sort_by_key(|t| std::cmp::Reverse(t.page));
        let mut held = Vec::new();
        for t in sorted {
            if self.release_one(owner, t, op)? {
                held.push(t);
            }
        }
        held.sort();
        Ok(held)
    }

    /// The owner lets go of its pages. Held pages go to Draining and return to Free
    /// when their last holder lets go. Only the owner may release (S8).
    pub fn release(&mut self, owner: RoomKey, tags: &[PageTag]) -> Result<(), PoolError> {
        let free_before = self.free.len();
        let held = self.release_all(owner, tags, PageOp::Release)?;
        assert!(
            tags.iter().all(|t| !self.owns(owner, *t)),
            "none is the owner's now"
        );
        assert_eq!(self.free.len(), free_before + tags.len() - held.len());
        self.log(PageChange::Released {
            room: owner,
            pages: tags.to_vec(),
            how: ReleaseKind::Owner,
            held,
        });
        Ok(())
    }

    /// The owner aborted while remote writes may still land: keep the pages out of
    /// circulation until [`PagePool::release_quarantined`].
    pub fn quarantine(&mut self, owner: RoomKey, tags: &[PageTag]) -> Result<(), PoolError> {
        self.precheck(owner, tags, PageOp::Quarantine)?;
        for &t in tags {
            self.apply(owner, t, PageOp::Quarantine)?;
        }
        assert!(
            tags.iter()
                .all(|t| self.record(t.page).is_some_and(|r| r.owner == Some(owner))),
            "still the owner's"
        );
        assert!(tags
            .iter()
            .all(|t| self.state_is(*t, PageState::Quarantined)));
        self.log(PageChange::Quarantined {
            room: owner,
            pages: tags.to_vec(),
        });
        Ok(())
    }

    /// The writer acked that its writes for `owner` have drained: quarantined pages
    /// return to Free (or Draining while held).
    pub fn release_quarantined(
        &mut self,
        owner: RoomKey,
        tags: &[PageTag],
    ) -> Result<(), PoolError> {
        let free_before = self.free.len();
        let held = self.release_all(owner, tags, PageOp::DrainAcked)?;
        assert!(
            tags.iter().all(|t| !self.owns(owner, *t)),
            "none is the owner's now"
        );
        assert_eq!(self.free.len(), free_before + tags.len() - held.len());
        self.log(PageChange::QuarantineReleased {
            room: owner,
            pages: tags.to_vec(),
            held,
        });
        Ok(())
    }

    /// Upstream's unchecked `free()`: prepend the pages to the free list whatever their
    /// state, owner or holders, as SGLang's allocator does outside its debug mode.
    /// Only bug switches call this (`double-free-on-finish`,
    /// `prefill-release-before-drain`, `decode-release-immediate`); the defended engine
    /// never does. The result is what upstream would produce, including duplicates on
    /// the free list, which [`PagePool::invariants`] then reports.
    pub fn free_unchecked(&mut self, room: RoomKey, tags: &[PageTag]) {
        let mut sorted = tags.to_vec();
        sorted.sort_by_key(|t| std::cmp::Reverse(t.page));
        for t in sorted {
            let Some(rec) = self.pages.get_mut(t.page.0 as usize) else {
                continue;
            };
            if t.page.0 == 0 {
                continue;
            }
            rec.state = PageState::Free;
            rec.owner = None;
            rec.holders = 0;
            self.free.push(t.page);
        }
        self.log(PageChange::Released {
            room,
            pages: tags.to_vec(),
            how: ReleaseKind::Unchecked,
            held: Vec::new(),
        });
    }
}
