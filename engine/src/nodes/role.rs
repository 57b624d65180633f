//! [`Role`]: the part a node plays (router, prefill, decode), apart from the nodes
//! themselves so that a worker front, which fronts a node of one role, needs no node.

/// The role a node plays.
#[derive(
    Clone, Copy, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum Role {
    Router,
    Prefill,
    Decode,
}
