//! The HTML timeline of a run: one self-contained page (inline CSS, SVG and a small
//! inline script; nothing fetched) that draws a trace's entries and an oracle's findings
//! the way Jepsen's `timeline.html` draws a history.
//!
//! One vertical lane per node (router, each prefill, each decode) and per tenant of the
//! client endpoint; one row per entry, time flowing down, with the time (or, for a trace
//! whose clock never moves, such as a model checker's counterexample, the step) on the
//! left; each message from its send to its delivery as an arrow between lanes (dropped
//! ones ending in a cross, those never delivered as a stub), each KV write as a thicker
//! arrow; faults (crash, restart, partition, data faults) marked on their lanes; a
//! column per room use and node showing the pages it owns over time, and a table of every
//! room use's pages (tags and generations) and when they were let go; the first
//! violation as a red band with its invariant, the other violations red, detections (a
//! defense that fired) amber. Hovering an element shows its sentence (the
//! [`crate::render`] text); clicking shows it in the details panel.
//!
//! `kvsim replay --html`, `kvsim check --html` and `kvsim audit --html` all call
//! [`render`]: formatting only, it decides nothing (the findings are the oracle's). The
//! output is a pure function of its input (no clock, no hash-map order), so the same
//! run always gives the same bytes. A long trace is cut to [`Timeline::max_entries`]
//! entries around the first violation, and the page says so.
//!
//! The parts: `picture` reads the entries into what is drawn (lanes, rows, the
//! pages each room use owns over time); `svg` draws it (lanes, rows, arrows, room
//! columns, findings); `page` wraps the drawing in the page (the header, the rooms
//! table, the embedded data, and `page.css` and `page.js` inline).

mod html;
mod page;
mod picture;
mod subject;
mod svg;
#[cfg(test)]
mod tests;

use crate::oracle::Finding;
use crate::schema::Entry;
use picture::Picture;
use std::collections::VecDeque;

pub use html::esc;
pub use picture::page_runs;
pub use subject::{Timeline, DEFAULT_MAX_ENTRIES, MAX_ROOM_COLUMNS};

/// The time and step of the first violation (else the first finding), where a window
/// is centred.
pub fn focus_point(findings: &[Finding]) -> Option<(u64, u64)> {
    findings
        .iter()
        .find(|f| f.violated())
        .or(findings.first())
        .map(|f| (f.at_ns, f.event))
}

fn at_or_after(e: &Entry, (at, seq): (u64, u64)) -> bool {
    e.at_ns > at || (e.at_ns == at && e.seq >= seq)
}

/// The range of `entries` drawn when at most `max` are: all of them, or `max` around
/// the focus (three quarters before it: the story; a quarter after).
pub fn window(entries: &[Entry], focus: Option<(u64, u64)>, max: usize) -> std::ops::Range<usize> {
    let max = max.max(1);
    if entries.len() <= max {
        return 0..entries.len();
    }
    let at = focus
        .and_then(|p| entries.iter().position(|e| at_or_after(e, p)))
        .unwrap_or(0);
    let start = at.saturating_sub(max * 3 / 4);
    let end = (start + max).min(entries.len());
    end.saturating_sub(max)..end
}

/// Keeps the window of a trace read as a stream (a file too large to hold): at most
/// `max` entries around the focus, the way [`window`] picks them from a list.
pub struct Collector {
    max: usize,
    focus: Option<(u64, u64)>,
    kept: VecDeque<Entry>,
    reached: bool,
    /// The position of the first kept entry.
    pub first: u64,
}

impl Collector {
    pub fn new(max: usize, focus: Option<(u64, u64)>) -> Self {
        Collector {
            max: max.max(1),
            focus,
            kept: VecDeque::new(),
            reached: focus.is_none(),
            first: 0,
        }
    }

    /// The next entry; `false` once the window is full (the rest is not needed).
    pub fn push(&mut self, e: &Entry) -> bool {
        if !self.reached && self.focus.is_some_and(|p| at_or_after(e, p)) {
            self.reached = true;
        }
        if self.reached {
            if self.kept.len() >= self.max {
                return false;
            }
        } else if self.kept.len() >= self.max * 3 / 4 {
            self.kept.pop_front();
            self.first += 1;
        }
        self.kept.push_back(e.clone());
        true
    }

    pub fn into_entries(self) -> Vec<Entry> {
        self.kept.into()
    }
}

/// Render the page.
pub fn render(t: &Timeline) -> String {
    let range = window(t.entries, focus_point(t.findings), t.max_entries);
    let entries = &t.entries[range.clone()];
    let mut p = Picture::new(t, entries);
    p.build_rows();
    let drawing = svg::draw(&p);
    page::page(&p, (range.start, range.end), &drawing)
}
