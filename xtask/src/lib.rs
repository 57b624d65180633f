//! kvsim's developer commands (`cargo xtask ...`, the pattern rust-analyzer uses) and
//! the checks of the guide they share with the tests.

pub mod layout;
pub mod links;
