//! kvsim-lab: the experiments that exercise the simulator and the model checker
//! together, above both (`kvsim bugs`, the default suite's matrix rows).
//!
//! [`matrix`] hunts every historical bug switch with both tools and turns defenses off
//! one at a time; [`matrix_report`] renders that as Markdown and SVG
//! (`reports/bugs.md`, `reports/bugs.svg`); [`isolation`] runs each defense alone
//! against the hazards it exists to stop. Nothing here is linked into `kvsim serve`'s
//! runtime; the CLI (`src/cmd_bugs.rs`, `src/suite.rs`) only calls these and prints.

pub mod isolation;
pub mod lease_floor;
pub mod matrix;
pub mod matrix_report;

/// Why a lab run could not be made (not a finding: findings are in the tables).
#[derive(Debug, thiserror::Error)]
pub enum LabError {
    #[error("no compiled-in scenario {0}")]
    NoScenario(String),
    #[error(transparent)]
    Scenario(#[from] kvsim_sim::scenario::ScenarioError),
    #[error(transparent)]
    Model(#[from] kvsim_models::SpecError),
}
