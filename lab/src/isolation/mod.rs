//! The defense-isolation matrix: every defense alone against the hazards it exists to
//! stop, and the check that a configuration that only adds defenses never looks worse.
//!
//! With every defense on, admission, verification and quarantine stop most hazards
//! before the page-tag check or the landing check ever matters, so a weakened layer
//! changes no verdict. Here each defense runs alone (every other one off; none of them
//! needs another to work), against the bug switches and the data faults, and each cell
//! counts the seeds on which something **leaked** to a client: a violated S3 (a read
//! of slots the request never wrote, or a reply carrying another request's canary) or
//! S10 (a 200 whose tokens are wrong).
//! A defense's own stops (a refused landing, a refused read, a refused transfer) are
//! detections and do not count. [`EXPECTED`] lists the hazards each defense must stop
//! alone (zero leaking seeds); the rest of the table is measured and reported. The
//! router's cancel of both halves runs with deferred release, which it strictly needs
//! (a cancelled decode lets its pages go at once otherwise).
//!
//! Pre-flight (a start-up rule, no runtime hazard) and zero-on-free (it blanks stale
//! pages, it refuses nothing: a read of zeroed slots is still S3) are not rows.
//!
//! Two dimensions more: the router policy (every configuration runs under the careful
//! router and under `sglang-router`, the real gateway's behaviour: no cancel, retries
//! in new rooms, where the router's cancel of both halves does not exist and its row is
//! left out) and the transport (one-sided RDMA, the default, where no landing gate
//! exists, and two-sided, where the landing gate is a defense of its own). Each expected
//! stop must hold under both routers on both transports.
//!
//! The files: the hazards (`hazard`), the configurations and other axes (`configs`),
//! one cell's run (`cell`), the whole matrix and its judgements (`results`) and its
//! table as text (`render`).

mod cell;
mod configs;
mod hazard;
mod render;
mod results;

pub use cell::{cell, cell_in, cell_on, cell_under, Cell};
pub use configs::{
    adds_only, configuration, configurations, configurations_under, expected, ROUTER_CANCEL_ROW,
    TRANSPORTS,
};
pub use hazard::{hazards, Hazard, LEAKS};
pub use results::{run, run_under, Isolation, Miss};
