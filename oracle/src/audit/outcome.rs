//! What an audit is asked and what it answers: [`AuditOptions`], [`AuditReport`] and
//! [`AuditError`] (which file, which line, and why a trace cannot be used). It does
//! not read traces ([`crate::audit`]) nor print the report ([`crate::audit::text`]).

use crate::oracle::{Finding, Leak};
use crate::schema::{EndOutcome, RunHeader};

/// A trace that cannot be used: which file, which line, and why.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AuditError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} line {line}: {reason}")]
    Line {
        path: String,
        line: u64,
        reason: String,
    },
    #[error("{path}: the first line must be the run header (`\"type\": \"header\"`)")]
    NoHeader { path: String },
    #[error("{path}: its header disagrees with {first}'s: {reason}")]
    HeaderMismatch {
        path: String,
        first: String,
        reason: String,
    },
    #[error("no trace given")]
    Nothing,
}

/// What an audit prints besides the verdict.
#[derive(Clone, Copy, Debug)]
pub struct AuditOptions {
    /// Collect the causal trace of each violation (a second pass over the files).
    pub causal: bool,
    /// Most lines of one causal trace.
    pub max_lines: usize,
    /// Causal traces for at most this many findings.
    pub max_findings_explained: usize,
}

impl Default for AuditOptions {
    fn default() -> Self {
        AuditOptions {
            causal: true,
            max_lines: 60,
            max_findings_explained: 3,
        }
    }
}

/// The verdict on a set of trace files.
#[derive(Clone, Debug)]
pub struct AuditReport {
    pub header: RunHeader,
    pub findings: Vec<Finding>,
    pub leaks: Vec<Leak>,
    /// Entries and bytes read.
    pub entries: u64,
    pub bytes: u64,
    /// How the run ended (`Cut` when no file said).
    pub end: EndOutcome,
    /// For explained findings: the index into `findings` and its causal trace.
    pub causal: Vec<(usize, Vec<String>)>,
}

impl AuditReport {
    /// Any invariant violated (detections do not count: [`crate::fails`]).
    pub fn violated(&self) -> bool {
        crate::fails(&self.findings)
    }
}
