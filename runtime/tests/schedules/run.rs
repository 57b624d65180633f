//! One run of the bed on shuttle's scheduler: the clients' requests, cancels and the
//! nodes' restarts at points the schedule's random source picks, every answer waited
//! for, the deployment settled and stopped, then every check: the nodes' own
//! invariants (checked by each loop after every input), the oracle over the whole
//! trace, each client answered once, every pool whole and no write left in flight.

use crate::bed::{Bed, Restarter, Stopped, DECODE, NODES, PAGES, PREFILL, ROUTER};
use kvsim_engine::ids::{RequestId, TenantId};
use kvsim_oracle::audit::EntryAudit;
use kvsim_oracle::schema::{EndOutcome, Entry, Record};
use kvsim_runtime::node::{NodeEvent, ReplyEv, ReplySink};
use kvsim_runtime::sync::mpsc::{channel, Receiver};
use kvsim_runtime::sync::thread::{self, yield_now, JoinHandle};
use shuttle::rand::{thread_rng, RngCore};

/// Most scheduler turns the clients give away between two requests.
const PACE: u64 = 60;
/// Requests per run, and most of them in flight at once.
pub const REQUESTS: u64 = 12;
const IN_FLIGHT: usize = 3;
/// Restarts per run, each after at most this many scheduler turns of its thread.
const RESTARTS: u64 = 3;
const RESTART_GAP: u64 = 1_500;
/// Most status rounds the deployment may take to settle after the last answer.
const SETTLE_ROUNDS: usize = 2_000;

/// A number below `n` from the schedule's random source.
fn below(n: u64) -> u64 {
    thread_rng().next_u64() % n.max(1)
}

/// A client's request: its answers, whether it went away, whether it was answered.
struct Client {
    req: u64,
    rx: Receiver<ReplyEv>,
    left: bool,
    answered: bool,
}

/// One run: what the trace holds at the end (for a replay to compare).
pub fn one_run(planted: bool) -> Vec<Entry> {
    let bed = Bed::start(planted);
    let restarts = spawn_restarts(bed.restarter());
    let clients = clients(&bed);
    restarts.join().expect("the restarts' thread");
    settle(&bed);
    for tx in bed.txs.values() {
        let stop = NodeEvent::Stop {
            outcome: EndOutcome::Drained,
            detail: "drained: every node quiescent".into(),
        };
        tx.send(stop).expect("the loop is running");
    }
    let stopped = bed.join();
    let log = stopped.log.entries();
    check(&stopped, &log, &clients);
    stopped.finish();
    log
}

/// The nodes restart at points the schedule picks, prefill's one time in three.
fn spawn_restarts(r: Restarter) -> JoinHandle<()> {
    thread::spawn(move || {
        for _ in 0..RESTARTS {
            for _ in 0..below(RESTART_GAP) {
                yield_now();
            }
            r.restart(if below(3) == 0 { PREFILL } else { DECODE });
        }
    })
}

/// The clients: [`REQUESTS`] requests, at most [`IN_FLIGHT`] unanswered at once, some
/// of them given up on; every client that stayed is answered.
fn clients(bed: &Bed) -> Vec<Client> {
    let mut clients: Vec<Client> = Vec::new();
    for req in 1..=REQUESTS {
        if let Some(i) = clients.len().checked_sub(IN_FLIGHT) {
            wait_answer(&mut clients[i]);
        }
        clients.push(submit(bed, req));
        for _ in 0..below(PACE) {
            yield_now();
        }
        if below(8) == 0 {
            cancel(bed, &mut clients);
        }
    }
    for c in &mut clients {
        wait_answer(c);
    }
    clients
}

fn submit(bed: &Bed, req: u64) -> Client {
    let (tx, rx) = channel();
    let len = 1 + below(12);
    let ev = NodeEvent::Submit {
        req: RequestId(req),
        tenant: TenantId(0),
        prompt: kvsim_oracle::canary::prompt(RequestId(req), len),
        max_new_tokens: 1 + below(3) as u32,
        reply: ReplySink::channel(tx),
    };
    bed.txs[&ROUTER].send(ev).expect("the router runs");
    Client {
        req,
        rx,
        left: false,
        answered: false,
    }
}

/// A client of the last few goes away.
fn cancel(bed: &Bed, clients: &mut [Client]) {
    let n = clients.len() as u64;
    let victim = &mut clients[(n - 1 - below(n.min(3))) as usize];
    victim.left = true;
    let cancel = NodeEvent::Cancel {
        req: RequestId(victim.req),
    };
    bed.txs[&ROUTER].send(cancel).expect("the router runs");
}

/// A client that stayed is answered (its tokens first, then one answer); one that
/// went away is not waited for.
fn wait_answer(c: &mut Client) {
    if c.left || c.answered {
        return;
    }
    loop {
        match c.rx.recv() {
            Ok(ReplyEv::Done(_)) => break,
            Ok(ReplyEv::Token { .. } | ReplyEv::Params { .. }) => {}
            Err(_) => panic!("request {} was dropped unanswered", c.req),
        }
    }
    c.answered = true;
}

/// Until every node is quiescent (nothing live, no quarantine, every page free).
fn settle(bed: &Bed) {
    for _ in 0..SETTLE_ROUNDS {
        let quiet = bed.txs.values().all(|tx| {
            let (stx, srx) = channel();
            tx.send(NodeEvent::Status(stx)).expect("the loop runs");
            srx.recv().expect("the loop answers").quiescent()
        });
        if quiet {
            return;
        }
        for _ in 0..8 {
            yield_now();
        }
    }
    panic!("the deployment did not settle in {SETTLE_ROUNDS} status rounds");
}

/// Every check of a run that ended.
fn check(s: &Stopped, log: &[Entry], clients: &[Client]) {
    let broken: Vec<&Entry> = log
        .iter()
        .filter(|e| matches!(e.rec, Record::Violation { .. }))
        .collect();
    assert!(broken.is_empty(), "a node broke an invariant: {broken:?}");
    audit(s, log);
    for c in clients {
        let more =
            c.rx.try_iter()
                .filter(|ev| matches!(ev, ReplyEv::Done(_)))
                .count();
        assert!(
            more <= usize::from(c.left),
            "request {}: answered twice",
            c.req
        );
    }
    pools(s);
}

/// The oracle over the whole trace: nothing violated, nothing leaked.
fn audit(s: &Stopped, log: &[Entry]) {
    let mut audit = EntryAudit::new("schedules", &s.header).expect("the bed's header");
    for e in log {
        audit.observe(e);
    }
    let report = audit.finish();
    let violated: Vec<String> = report
        .findings
        .iter()
        .filter(|f| f.violated())
        .map(|f| format!("{f:?}"))
        .collect();
    assert!(violated.is_empty(), "the oracle found: {violated:#?}");
    assert!(report.leaks.is_empty(), "leaks: {:?}", report.leaks);
}

/// Every pool whole, no write in flight at its writer, no quarantine.
fn pools(s: &Stopped) {
    for (lp, id) in s.loops.iter().zip(NODES) {
        assert_eq!(lp.io.id, id);
        assert_eq!(lp.writes_in_flight(), Vec::new(), "{id}: writes in flight");
        assert!(lp.node.invariants().is_ok(), "{id}: invariants at the end");
    }
    let prefill = s.loops[PREFILL.0 as usize]
        .node
        .as_prefill()
        .expect("prefill");
    assert_eq!(
        prefill.pool().free_count(),
        PAGES as usize,
        "prefill's pool"
    );
    let decode = s.loops[DECODE.0 as usize].node.as_decode().expect("decode");
    assert_eq!(decode.quarantined_rooms(), 0, "every quarantine ended");
    let pool = decode.records().shared();
    assert_eq!(pool.free_count(), PAGES as usize, "decode's pool");
    assert!(pool.invariants().is_ok());
}
