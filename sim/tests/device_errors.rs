//! A device that fails fails the request it was serving, never the process: every
//! `Gpu` method that touches the device returns a `DeviceError`, the node states it
//! (`Fault` `DeviceFailed`), answers the request with an error and the reason
//! `Why::DeviceFailed` where its half gave the answer, and lets the request's pages go
//! (freed, or quarantined until the drain ack); the run goes on and the oracle stays
//! clean.
//!
//! The failing device is a test-only wrapper over the symbolic backend that fails one
//! operation on a fixed schedule of its own calls (deterministic per node, so a seed
//! still reproduces its trace). The scenario is `transfer-failures` with its faults
//! off, so that every failure here is the device's. Not a test of the CUDA backend (the
//! device script covers it; `CudaGpu` returns these same errors).

mod common;

use kvsim_engine::gpu::{
    DeviceError, Gpu, SymbolicGpu, SymbolicPage, TagError, WriteError, WriteTag,
};
use kvsim_engine::ids::{PageId, PageTag, RoomKey, Token};
use kvsim_engine::trace::{NodeFault, TraceEvent};
use kvsim_engine::{BugSet, RouterPolicy, Status, Why};
use kvsim_oracle::schema::{MsgView, Record};
use kvsim_sim::plan::{Plan, Reduction};
use kvsim_sim::scenario::FaultSpec;
use kvsim_sim::{run_plan_with, RunOutcome};
use std::cell::Cell;

/// The operation a [`Failing`] device fails.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum Op {
    WriteTokens,
    ReadPage,
    WritePage,
    CheckTags,
    Attend,
    Digest,
    ZeroPage,
}

/// The symbolic backend, failing `op` on every `every`-th call of it (the count is
/// the node's own, so the schedule depends on the node's inputs only). Hash and
/// equality are the inner memory's: the count is not KV state.
#[derive(Clone, Debug)]
struct Failing {
    inner: SymbolicGpu,
    op: Op,
    every: u64,
    calls: Cell<u64>,
}

impl std::hash::Hash for Failing {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.inner.hash(h)
    }
}
impl PartialEq for Failing {
    fn eq(&self, o: &Self) -> bool {
        self.inner == o.inner
    }
}
impl Eq for Failing {}

impl Failing {
    /// Does this call of `op` fail?
    fn fails(&self, op: Op) -> Result<(), DeviceError> {
        if op != self.op {
            return Ok(());
        }
        let n = self.calls.get() + 1;
        self.calls.set(n);
        if n.is_multiple_of(self.every) {
            return Err(DeviceError {
                op: "test",
                detail: format!("injected failure {n} of {op:?}"),
            });
        }
        Ok(())
    }
}

impl Gpu for Failing {
    type Kv = SymbolicPage;
    fn page_size(&self) -> u32 {
        self.inner.page_size()
    }
    fn pages(&self) -> u32 {
        self.inner.pages()
    }
    fn write_tokens(
        &mut self,
        pages: &[PageTag],
        start: u64,
        tokens: &[Token],
        room: RoomKey,
    ) -> Result<(), WriteError> {
        self.fails(Op::WriteTokens)?;
        self.inner.write_tokens(pages, start, tokens, room)
    }
    fn read_page(&self, page: PageId) -> Result<SymbolicPage, DeviceError> {
        self.fails(Op::ReadPage)?;
        self.inner.read_page(page)
    }
    fn write_page(
        &mut self,
        dst: PageTag,
        room: RoomKey,
        kv: &SymbolicPage,
    ) -> Result<(), WriteError> {
        self.fails(Op::WritePage)?;
        self.inner.write_page(dst, room, kv)
    }
    fn page_tag(&self, page: PageId) -> Result<Option<WriteTag>, DeviceError> {
        self.inner.page_tag(page)
    }
    fn check_tags(&self, pages: &[PageTag], room: RoomKey) -> Result<(), TagError> {
        self.fails(Op::CheckTags)?;
        self.inner.check_tags(pages, room)
    }
    fn attend(&self, pages: &[PageId], seq_len: u64, query_pos: u64) -> Result<Token, DeviceError> {
        self.fails(Op::Attend)?;
        self.inner.attend(pages, seq_len, query_pos)
    }
    fn token_at(&self, pages: &[PageId], pos: u64) -> Result<Token, DeviceError> {
        self.inner.token_at(pages, pos)
    }
    fn zero_page(&mut self, page: PageId) -> Result<(), DeviceError> {
        self.fails(Op::ZeroPage)?;
        self.inner.zero_page(page)
    }
    fn digest(&self, pages: &[PageId], tokens: u64) -> Result<u64, DeviceError> {
        self.fails(Op::Digest)?;
        self.inner.digest(pages, tokens)
    }
}

/// `transfer-failures` without its faults, on a device failing `op` every `every`
/// calls; traced.
fn run(op: Op, every: u64, seed: u64) -> RunOutcome {
    let mut sc = common::scenario("scenarios/transfer-failures.toml");
    sc.faults = FaultSpec::default();
    // One attempt per request, so that a failed request is seen failed (the gateway's
    // policy retries it in a new room).
    sc.routers = vec![RouterPolicy::Careful];
    if op == Op::ZeroPage {
        sc.engine.defenses.zero_on_free = true;
    }
    let plan = Plan::build(&sc, seed, Some(BugSet::NONE), &Reduction::default()).unwrap();
    let make = |pages, page_size| Failing {
        inner: SymbolicGpu::new(pages, page_size),
        op,
        every,
        calls: Cell::new(0),
    };
    run_plan_with(&plan, make, true)
}

/// The device failures the trace states: a node's `DeviceFailed` fault, or a write
/// its receiver's device refused (a landing has no request of its own to fail: its
/// writer's completion says so, and the transfer fails).
fn device_faults(out: &RunOutcome) -> usize {
    out.trace
        .iter()
        .filter(|e| match &e.rec {
            Record::Engine(TraceEvent::Fault {
                fault: NodeFault::DeviceFailed { .. },
                ..
            }) => true,
            Record::Engine(TraceEvent::KvRefused { reason, .. }) => {
                reason.contains("the device failed")
            }
            _ => false,
        })
        .count()
}

/// The answers (a half's or the router's) that give the device as their reason.
fn device_answers(out: &RunOutcome) -> usize {
    let device = |w: &Option<Why>| matches!(w, Some(Why::DeviceFailed { .. }));
    out.trace
        .iter()
        .filter(|e| match &e.rec {
            Record::Send {
                msg:
                    MsgView::PrefillFinished { why, .. }
                    | MsgView::DecodeFinished { why, .. }
                    | MsgView::Response { why, .. },
                ..
            } => device(why),
            _ => false,
        })
        .count()
}

/// The run went on through the device's failures: every request answered once, the
/// oracle clean (no page leaked, none freed while a write could land, every reply the
/// request's own), the failures stated, and some requests failed by them.
fn survives(op: Op, every: u64, reason_reaches_an_answer: bool) {
    for seed in 0..3 {
        let out = run(op, every, seed);
        assert!(out.clean(), "{op:?} seed {seed}: {:?}", out.findings);
        assert!(out.leaks.is_empty(), "{op:?} seed {seed}: {:?}", out.leaks);
        assert!(
            device_faults(&out) > 0,
            "{op:?} seed {seed}: no failure injected"
        );
        for r in &out.requests {
            let n = out.replies.get(&r.req).map_or(0, Vec::len);
            assert_eq!(
                n, 1,
                "{op:?} seed {seed}: request {} answered {n} times",
                r.req
            );
        }
        let failed = out
            .replies
            .values()
            .flatten()
            .filter(|r| r.status != Status::OK)
            .count();
        let ok = out.replies.len() - failed;
        if op != Op::ZeroPage {
            assert!(
                failed > 0,
                "{op:?} seed {seed}: the failures failed nothing"
            );
        }
        assert!(ok > 0, "{op:?} seed {seed}: nothing succeeded");
        if reason_reaches_an_answer {
            assert!(
                device_answers(&out) > 0,
                "{op:?} seed {seed}: no answer says why"
            );
        }
    }
}

#[test]
fn a_failed_decode_step_fails_its_request_and_frees_its_pages() {
    survives(Op::Attend, 7, true);
}

#[test]
fn a_failed_tag_check_fails_its_request() {
    survives(Op::CheckTags, 9, true);
}

#[test]
fn a_failed_kv_write_fails_its_request_on_either_half() {
    survives(Op::WriteTokens, 11, true);
}

#[test]
fn a_failed_verification_digest_fails_the_transfer() {
    survives(Op::Digest, 5, true);
}

#[test]
fn a_failed_source_read_fails_the_send() {
    survives(Op::ReadPage, 13, false);
}

#[test]
fn a_failed_landing_refuses_the_write_and_fails_the_transfer() {
    survives(Op::WritePage, 13, false);
}

#[test]
fn a_failed_zeroing_is_stated_and_the_run_goes_on() {
    survives(Op::ZeroPage, 5, false);
}
