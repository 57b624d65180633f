//! kvsim-oracle: the trace schema, the oracle that judges a run from its trace alone,
//! and `kvsim audit`.
//!
//! A run (the simulator's, the model checker's, a real server's, another engine's) is
//! a stream of [`schema`] lines (version 2; version 1 is still read): a header, then
//! entries. [`oracle_state::OracleState`] is the one implementation of every invariant
//! (S1-S10 and L1-L5, judged by the checkers of [`check`] behind its dispatch; L6,
//! which needs the trace's times, is in [`oracle`]), built from those lines only;
//! [`oracle::Oracle`] adds times, evidence and de-duplication for reports; [`audit`]
//! reads trace files (one, or one per node, merged by time) in one streaming pass;
//! [`render`] prints entries, findings and causal traces the way every kvsim command
//! does; [`timeline`] draws them as one HTML page.

pub mod audit;
pub mod canary;
pub mod check;
mod evidence;
pub mod fast_line;
pub mod oracle;
pub mod oracle_state;
pub mod render;
pub mod schema;
pub mod shared;
pub mod timeline;

pub use oracle::{fails, Finding, Leak, Oracle};
pub use oracle_state::{Draft, OracleState};
pub use schema::{Entry, Line, Record, RunHeader, SCHEMA_VERSION};
