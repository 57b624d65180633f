//! What a timeline page draws ([`Timeline`]: the header, the entries or a window of
//! them, the findings, the title) and the limits on it. It does not read or draw the
//! entries (`picture`, `svg`, `page`) nor pick the window (the parent module).

use crate::oracle::Finding;
use crate::schema::{Entry, RunHeader};

/// The most entries a page draws by default.
pub const DEFAULT_MAX_ENTRIES: usize = 3000;

/// The most (room use, node) columns drawn beside the lanes (every room use is in the
/// table below the picture).
pub const MAX_ROOM_COLUMNS: usize = 48;

/// What to draw.
pub struct Timeline<'a> {
    pub header: &'a RunHeader,
    /// The run's entries in order (or a window of them: see `first`, `total`).
    pub entries: &'a [Entry],
    /// The oracle's findings about the run (violations and detections), first first.
    pub findings: &'a [Finding],
    /// What the page shows, in a line (the command that reproduces the run).
    pub title: String,
    /// Further lines for the header (a shrunk run's reduction, a counterexample's
    /// property).
    pub notes: Vec<String>,
    /// The position in the whole trace of `entries[0]` (0 unless a window was read).
    pub first: u64,
    /// The entries of the whole trace (`entries.len()` unless a window was read).
    pub total: u64,
    /// The most entries drawn: a longer list is cut around the first violation.
    pub max_entries: usize,
}

impl<'a> Timeline<'a> {
    /// The timeline of a whole run held in memory.
    pub fn new(
        header: &'a RunHeader,
        entries: &'a [Entry],
        findings: &'a [Finding],
        title: impl Into<String>,
    ) -> Self {
        Timeline {
            header,
            entries,
            findings,
            title: title.into(),
            notes: Vec::new(),
            first: 0,
            total: entries.len() as u64,
            max_entries: DEFAULT_MAX_ENTRIES,
        }
    }
}
