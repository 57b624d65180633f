//! One row of the default suite's summary table, shared by the rows' modules
//! (`suite.rs`, `suite_protocols.rs`).

/// One row of the summary table.
#[derive(Clone, Debug)]
pub struct Row {
    pub check: String,
    pub expected: String,
    pub observed: String,
    pub ok: bool,
    pub wall_s: f64,
}
