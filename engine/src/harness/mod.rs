//! `Harness`: a hand-stepped driver for tests, in the shape of quinn-proto's test
//! `Pair`. It builds a router, prefill and decode nodes on any [`Topology`] and lets a
//! test take one step at a time: deliver any message in flight (in any order, any
//! number of times), drop it, fail a KV write, fire any pending timer (timers carry no
//! time, as in the model checker), crash and restart a node; and read what happened:
//! every event with its node, every message sent, every client response, each node's
//! pending timers, pages and per-room phase.
//!
//! It is not a simulator (no clock, no seeded faults, no schedule of its own beyond
//! [`Harness::settle`]) and not a model checker (it explores nothing). It has no
//! rules of its own about the world: a node's effects are carried out only through
//! [`world::apply`] with the harness's [`Driver`], and what an arriving message or a
//! crash does is decided only by [`world::arrival`] and [`world::crash_fate`].
//!
//! A node's [`NodeFault`] is recorded ([`Harness::faults`]) and not acted on: the
//! test decides what follows (a restart is [`Harness::crash_restart`]).
//!
//! Invariant: every message a node sends to another node is in [`Harness::in_flight`]
//! until the test delivers, drops or fails it or a crash decides its fate; messages to
//! the client endpoint are answers, recorded in [`Harness::responses`] at once (the
//! client link is never faulted, [`world::Transport::Client`]).

mod drive;
mod read;
mod records;
mod world;

pub use drive::{pool_for_context, Harness};
pub use records::{
    ClientResponse, CrashReport, Delivered, Flight, Happened, HarnessError, Mark, Sent,
};
