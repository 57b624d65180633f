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

use crate::matrix::{load, scenario_for};
use crate::LabError;
use kvsim_engine::bugs::{Bug, BugSet};
use kvsim_engine::config::{Defenses, RouterPolicy};
use kvsim_engine::invariant::Invariant;
use kvsim_engine::world::KvTransport;
use kvsim_sim::plan::{Plan, Reduction};
use kvsim_sim::scenario::Scenario;
use kvsim_sim::{run_plan, Backend};
use std::fmt::Write as _;

/// What a leak is: a read of slots the request never wrote or a reply carrying
/// another request's canary (S3), or a 200 with a wrong token (S10): what a client
/// would see.
pub const LEAKS: [Invariant; 2] = [Invariant::S3, Invariant::S10];

/// A hazard: a bug switch (in the scenario that reaches its code path) or a data
/// fault (alone, in `scenarios/data-faults.toml`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hazard {
    Bugs(BugSet),
    Data(&'static str),
    /// A prefill node that stays alive and keeps writing after decode timed out, asked
    /// for the drain until its budget ran out, and gave up (`faults.slow_writer_ms`).
    SlowWriter,
}

impl Hazard {
    pub fn name(self) -> String {
        match self {
            Hazard::Bugs(b) if b == BugSet::INCIDENT => "incident pair".into(),
            Hazard::Bugs(b) => b.to_string(),
            Hazard::Data(f) => format!("{f} write"),
            Hazard::SlowWriter => "slow writer".into(),
        }
    }

    /// A defense whose own path the hazard needs to be reachable at all: auto-truncation
    /// is the admission check's policy, so a request is cut (and the halves can disagree
    /// for `no-length-agreement`) only when the admission check is on.
    pub fn reached_only_with(self) -> Option<fn(&Defenses) -> bool> {
        match self {
            Hazard::Bugs(b) if b == BugSet::NONE.with(Bug::NoLengthAgreement) => {
                Some(|d| d.admission_check)
            }
            _ => None,
        }
    }

    fn bugs(self) -> BugSet {
        match self {
            Hazard::Bugs(b) => b,
            Hazard::Data(_) | Hazard::SlowWriter => BugSet::NONE,
        }
    }

    /// The scenario that exercises it.
    pub fn scenario(self) -> Result<(&'static str, Scenario), LabError> {
        match self {
            Hazard::Bugs(b) => {
                let path = scenario_for(b);
                Ok((path, load(path)?))
            }
            Hazard::Data(f) => {
                let path = "scenarios/data-faults.toml";
                let mut sc = load(path)?;
                let fs = &mut sc.faults;
                let all = [
                    ("corrupt", &mut fs.corrupt_write_permille),
                    ("misdirect", &mut fs.misdirect_write_permille),
                    ("torn", &mut fs.torn_write_permille),
                    ("stale-duplicate", &mut fs.stale_duplicate_write_permille),
                ];
                for (name, rate) in all {
                    *rate = if name == f { 200 } else { 0 };
                }
                Ok((path, sc))
            }
            Hazard::SlowWriter => {
                // The data-fault scenario's fleet with its data faults off, one prefill
                // node, and its writes landing later than decode's waiting timeout (2 s)
                // plus its whole drain budget (100 x 50 ms). sim/tests/slow_writer.rs
                // uses 12 s; here 7.5 s, so that some late writes still land while the
                // pages' next owners read them (at 12 s none leaked, with no defense,
                // on 10 seeds: the workload had finished reading).
                let path = "scenarios/data-faults.toml";
                let mut sc = load(path)?;
                let fs = &mut sc.faults;
                fs.corrupt_write_permille = 0;
                fs.misdirect_write_permille = 0;
                fs.torn_write_permille = 0;
                fs.stale_duplicate_write_permille = 0;
                fs.slow_writer_ms = 7_500;
                if let Some(sw) = sc.swarm.as_mut() {
                    sw.prefill_nodes = [1, 1];
                }
                Ok((path, sc))
            }
        }
    }
}

/// Every hazard: each runtime bug switch, the incident pair, the four data faults,
/// the slow writer. `abort-after-success` is no hazard a defense stops: its requests
/// are answered with an error safely (no page at risk), and only the model checker's
/// "an error answer has a cause" judges it.
pub fn hazards() -> Vec<Hazard> {
    let mut v: Vec<Hazard> = Bug::ALL
        .into_iter()
        .filter(|b| *b != Bug::SkipPreflight && *b != Bug::AbortAfterSuccess)
        .map(|b| Hazard::Bugs(BugSet::NONE.with(b)))
        .collect();
    v.push(Hazard::Bugs(BugSet::INCIDENT));
    for f in ["corrupt", "misdirect", "torn", "stale-duplicate"] {
        v.push(Hazard::Data(f));
    }
    v.push(Hazard::SlowWriter);
    v
}

/// The configurations of the matrix: none, each runtime defense alone, all (the
/// default engine).
pub fn configurations() -> Vec<(&'static str, Defenses)> {
    let only = |f: fn(&mut Defenses)| {
        let mut d = Defenses::none();
        f(&mut d);
        d
    };
    vec![
        ("no defense", Defenses::none()),
        ("admission check alone", only(|d| d.admission_check = true)),
        (
            "verify on completion alone",
            only(|d| d.verify_on_completion = true),
        ),
        (
            "deferred release alone",
            only(|d| d.deferred_release = true),
        ),
        ("page tags alone", only(|d| d.page_tags = true)),
        // Only on two-sided does it exist; on one-sided this row is "no defense".
        ("landing gate alone", only(|d| d.landing_gate = true)),
        // Cancelling the other half makes decode let go of its pages at once, which is
        // safe only with deferred release (measured: alone, it leaks under
        // double-free-on-finish and admit-beyond-pool where no defense did not).
        (
            "router cancels both + deferred",
            only(|d| {
                d.router_cancels_both = true;
                d.deferred_release = true;
            }),
        ),
        ("all defenses", Defenses::default()),
        (
            "all + zero on free",
            Defenses {
                zero_on_free: true,
                ..Defenses::default()
            },
        ),
    ]
}

/// What each defense must stop alone: (configuration, hazard), zero leaking seeds.
/// Each is load-bearing: without any defense the same hazard leaks (a test checks
/// both). Not listed, as measured: a bug switch that bypasses the defense's own code
/// path (`gate-checks-finished-only` is the admission check's rejection done wrong,
/// `decode-release-immediate` is deferred release skipped), liveness hazards
/// (`router-cancels-one-half`, `admit-beyond-pool` leak nothing), and the wrong 200
/// of the legacy rejection (the incident pair: S10 under every configuration, the
/// pages hold the placeholder prompt the request was served with, so no tag can
/// object).
pub fn expected() -> Vec<(&'static str, Hazard)> {
    let bug = |b: Bug| Hazard::Bugs(BugSet::NONE.with(b));
    vec![
        ("verify on completion alone", Hazard::Data("corrupt")),
        ("verify on completion alone", Hazard::Data("torn")),
        (
            "deferred release alone",
            bug(Bug::PrefillReleaseBeforeDrain),
        ),
        ("page tags alone", Hazard::Data("misdirect")),
        ("page tags alone", Hazard::Data("stale-duplicate")),
        ("page tags alone", bug(Bug::DecodeReleaseImmediate)),
        ("page tags alone", bug(Bug::PrefillReleaseBeforeDrain)),
        ("page tags alone", bug(Bug::FailedSendReportsDrained)),
        ("page tags alone", bug(Bug::DoubleFreeOnFinish)),
        ("page tags alone", bug(Bug::FailOpenOnRecvError)),
        ("deferred release alone", Hazard::SlowWriter),
        ("page tags alone", Hazard::SlowWriter),
    ]
}

/// The configuration named `name`.
pub fn configuration(name: &str) -> Option<Defenses> {
    configurations()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, d)| d)
}

/// The row of the router's cancel of both halves (with deferred release).
pub const ROUTER_CANCEL_ROW: &str = "router cancels both + deferred";

/// The configurations that exist under `router`: the router's cancel of both halves
/// is a defense of the careful router only.
pub fn configurations_under(router: RouterPolicy) -> Vec<(&'static str, Defenses)> {
    configurations()
        .into_iter()
        .filter(|(name, _)| router == RouterPolicy::Careful || *name != ROUTER_CANCEL_ROW)
        .collect()
}

/// The transports every configuration runs on (default first).
pub const TRANSPORTS: [KvTransport; 2] = [KvTransport::OneSided, KvTransport::TwoSided];

/// An expected stop that leaked: (configuration, transport, router, hazard, leaking
/// seeds).
pub type Miss = (&'static str, KvTransport, RouterPolicy, Hazard, u64);

/// One cell: a configuration against a hazard, on a transport, under a router policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cell {
    pub transport: KvTransport,
    pub config: &'static str,
    pub router: RouterPolicy,
    pub hazard: Hazard,
    pub seeds: u64,
    /// Seeds on which something leaked ([`LEAKS`] violated).
    pub leaked: u64,
    /// Seeds on which any invariant was violated.
    pub violated: u64,
    /// Every invariant violated on some seed, sorted.
    pub invariants: Vec<Invariant>,
    /// Every invariant a defense detected (stopped) on some seed, sorted.
    pub detected: Vec<Invariant>,
}

/// Run one configuration against one hazard on seeds `0..seeds`, on the default
/// (one-sided) transport under the careful router.
pub fn cell(
    config: &'static str,
    d: Defenses,
    hazard: Hazard,
    seeds: u64,
) -> Result<Cell, LabError> {
    cell_in(
        KvTransport::default(),
        RouterPolicy::Careful,
        config,
        d,
        hazard,
        seeds,
    )
}

/// [`cell`] on `transport`.
pub fn cell_on(
    transport: KvTransport,
    config: &'static str,
    d: Defenses,
    hazard: Hazard,
    seeds: u64,
) -> Result<Cell, LabError> {
    cell_in(transport, RouterPolicy::Careful, config, d, hazard, seeds)
}

/// [`cell`] under `router`.
pub fn cell_under(
    config: &'static str,
    d: Defenses,
    router: RouterPolicy,
    hazard: Hazard,
    seeds: u64,
) -> Result<Cell, LabError> {
    cell_in(KvTransport::default(), router, config, d, hazard, seeds)
}

/// [`cell`] on `transport` under `router`.
pub fn cell_in(
    transport: KvTransport,
    router: RouterPolicy,
    config: &'static str,
    d: Defenses,
    hazard: Hazard,
    seeds: u64,
) -> Result<Cell, LabError> {
    let (_, mut sc) = hazard.scenario()?;
    sc.engine.defenses = d;
    sc.engine.router = router;
    sc.routers = vec![router];
    sc.engine.transport = transport;
    // A defense that is off cannot be asked to pass its start-up rule.
    sc.engine.allow_unsafe_pool = sc.engine.allow_unsafe_pool || !d.preflight;
    let mut c = Cell {
        transport,
        config,
        router,
        hazard,
        seeds,
        leaked: 0,
        violated: 0,
        invariants: Vec::new(),
        detected: Vec::new(),
    };
    for seed in 0..seeds {
        let plan = Plan::build(&sc, seed, Some(hazard.bugs()), &Reduction::default())?;
        let out = run_plan(&plan, Backend::Symbolic, false);
        let broken = out.broken();
        c.leaked += u64::from(broken.iter().any(|i| LEAKS.contains(i)));
        c.violated += u64::from(!broken.is_empty());
        for i in broken {
            if !c.invariants.contains(&i) {
                c.invariants.push(i);
            }
        }
        for i in out.detected() {
            if !c.detected.contains(&i) {
                c.detected.push(i);
            }
        }
    }
    c.invariants.sort();
    c.detected.sort();
    Ok(c)
}

/// The whole matrix.
#[derive(Clone, Debug)]
pub struct Isolation {
    pub seeds: u64,
    pub cells: Vec<Cell>,
}

impl Isolation {
    /// The cell on the default (one-sided) transport under the careful router.
    pub fn get(&self, config: &str, hazard: Hazard) -> Option<&Cell> {
        self.get_in(
            KvTransport::default(),
            RouterPolicy::Careful,
            config,
            hazard,
        )
    }

    /// The cell on `t` under the careful router.
    pub fn get_on(&self, t: KvTransport, config: &str, hazard: Hazard) -> Option<&Cell> {
        self.get_in(t, RouterPolicy::Careful, config, hazard)
    }

    /// The cell on the default transport under `router`.
    pub fn get_under(&self, config: &str, router: RouterPolicy, hazard: Hazard) -> Option<&Cell> {
        self.get_in(KvTransport::default(), router, config, hazard)
    }

    /// The cell on `t` under `router`.
    pub fn get_in(
        &self,
        t: KvTransport,
        router: RouterPolicy,
        config: &str,
        hazard: Hazard,
    ) -> Option<&Cell> {
        self.cells.iter().find(|c| {
            c.transport == t && c.router == router && c.config == config && c.hazard == hazard
        })
    }

    /// The router policies the matrix ran under.
    pub fn routers(&self) -> Vec<RouterPolicy> {
        let mut r: Vec<RouterPolicy> = self.cells.iter().map(|c| c.router).collect();
        r.sort();
        r.dedup();
        r
    }

    /// The expected stops that leaked on some transport under some router.
    pub fn misses(&self) -> Vec<Miss> {
        let mut out = Vec::new();
        for t in TRANSPORTS {
            for r in self.routers() {
                for (cfg, h) in expected() {
                    if let Some(c) = self.get_in(t, r, cfg, h).filter(|c| c.leaked > 0) {
                        out.push((cfg, t, r, h, c.leaked));
                    }
                }
            }
        }
        out
    }

    /// Monotonicity: for each hazard, a configuration that only adds defenses to
    /// another (no defense ⊆ one alone ⊆ all) leaks (S3, S10) on no seed when the
    /// weaker one leaked on none; and where the two differ only in zero-on-free, which changes no
    /// decision and so no schedule, it violates no invariant at all that the weaker
    /// one did not (the historical false alarm: zeroing once made the defended engine
    /// fail S3). Other invariants are not compared across defenses that change
    /// decisions: a refused request changes every later allocation, so which page a
    /// data fault hits, and a violation on a few seeds, differ by chance.
    /// Each breach: (weaker, stronger, hazard, the new invariants).
    pub fn monotonicity_breaches(
        &self,
    ) -> Vec<(&'static str, &'static str, Hazard, Vec<Invariant>)> {
        let mut out = Vec::new();
        for t in TRANSPORTS {
            for r in self.routers() {
                out.extend(self.breaches_in(t, r));
            }
        }
        out
    }

    /// [`Isolation::monotonicity_breaches`] on one transport under one router.
    fn breaches_in(
        &self,
        t: KvTransport,
        router: RouterPolicy,
    ) -> Vec<(&'static str, &'static str, Hazard, Vec<Invariant>)> {
        let configs = configurations_under(router);
        let mut out = Vec::new();
        for h in hazards() {
            for (weak, wd) in &configs {
                for (strong, sd) in &configs {
                    if weak == strong || !adds_only(*wd, *sd) {
                        continue;
                    }
                    // A configuration that never reaches the hazard proves nothing.
                    if h.reached_only_with().is_some_and(|reach| !reach(wd)) {
                        continue;
                    }
                    let (Some(w), Some(s)) = (
                        self.get_in(t, router, weak, h),
                        self.get_in(t, router, strong, h),
                    ) else {
                        continue;
                    };
                    let same_schedule = Defenses {
                        zero_on_free: sd.zero_on_free,
                        ..*wd
                    } == *sd;
                    let new: Vec<Invariant> = if same_schedule {
                        s.invariants
                            .iter()
                            .filter(|i| !w.invariants.contains(i))
                            .copied()
                            .collect()
                    } else if s.leaked > 0 && w.leaked == 0 {
                        s.invariants
                            .iter()
                            .filter(|i| LEAKS.contains(i))
                            .copied()
                            .collect()
                    } else {
                        Vec::new()
                    };
                    if !new.is_empty() {
                        out.push((*weak, *strong, h, new));
                    }
                }
            }
        }
        out
    }

    /// The table, one row per configuration, one column per hazard: leaking seeds /
    /// seeds, `-` where nothing leaked.
    pub fn render(&self) -> String {
        let hz = hazards();
        let mut s = String::new();
        let _ = writeln!(
            s,
            "Defense isolation ({} seeds per cell; a cell counts the seeds on which S3 or S10 was violated; * = this defense must stop it alone):",
            self.seeds
        );
        for (i, h) in hz.iter().enumerate() {
            let _ = writeln!(s, "  H{:<2} {}", i + 1, h.name());
        }
        let _ = write!(s, "  {:<31}", "");
        for i in 0..hz.len() {
            let _ = write!(s, " {:>5}", format!("H{}", i + 1));
        }
        let _ = writeln!(s);
        let exp = expected();
        for t in TRANSPORTS {
            for r in self.routers() {
                let _ = writeln!(s, "  {}, router policy {}:", t.name(), r.name());
                self.render_rows(&mut s, t, r, &hz, &exp);
            }
        }
        self.render_summary(&mut s, &exp);
        s
    }

    fn render_rows(
        &self,
        s: &mut String,
        t: KvTransport,
        r: RouterPolicy,
        hz: &[Hazard],
        exp: &[(&'static str, Hazard)],
    ) {
        for (cfg, _) in configurations_under(r) {
            let _ = write!(s, "  {cfg:<31}");
            for h in hz {
                let mark = if exp.contains(&(cfg, *h)) { "*" } else { "" };
                let v = match self.get_in(t, r, cfg, *h) {
                    Some(c) if c.leaked == 0 => format!("-{mark}"),
                    Some(c) => format!("{}{mark}", c.leaked),
                    None => "?".into(),
                };
                let _ = write!(s, " {v:>5}");
            }
            let _ = writeln!(s);
        }
    }

    fn render_summary(&self, s: &mut String, exp: &[(&'static str, Hazard)]) {
        let misses = self.misses();
        let all = exp.len() * TRANSPORTS.len() * self.routers().len();
        let _ = writeln!(
            s,
            "  expected stops: {} of {} held (both transports, every router){}",
            all - misses.len(),
            all,
            if misses.is_empty() {
                String::new()
            } else {
                format!(
                    "; MISSED: {}",
                    misses
                        .iter()
                        .map(|(c, t, r, h, n)| {
                            format!(
                                "{c} vs {} on {} under {} ({n} seeds)",
                                h.name(),
                                t.name(),
                                r.name()
                            )
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        );
        let breaches = self.monotonicity_breaches();
        if breaches.is_empty() {
            let _ = writeln!(
                s,
                "  monotonicity: no configuration that only adds defenses leaks where the weaker one did not, and zero-on-free adds no invariant"
            );
        } else {
            for (w, st, h, new) in &breaches {
                let _ = writeln!(
                    s,
                    "  MONOTONICITY BREACH: {st} violates {} under {} where {w} did not",
                    new.iter()
                        .map(|i| i.to_string())
                        .collect::<Vec<_>>()
                        .join(","),
                    h.name()
                );
            }
        }
    }
}

/// Does `strong` turn on every defense `weak` has (and maybe more)?
pub fn adds_only(weak: Defenses, strong: Defenses) -> bool {
    let f = |d: Defenses| {
        [
            d.admission_check,
            d.verify_on_completion,
            d.deferred_release,
            d.page_tags,
            d.landing_gate,
            d.preflight,
            d.router_cancels_both,
            d.zero_on_free,
        ]
    };
    f(weak).iter().zip(f(strong)).all(|(w, s)| !*w || s)
}

/// Run the matrix on `seeds` seeds per cell under every router policy (`progress`
/// hears each configuration).
pub fn run(seeds: u64, progress: impl FnMut(&str)) -> Result<Isolation, LabError> {
    run_under(&RouterPolicy::ALL, seeds, progress)
}

/// Run the matrix on `seeds` seeds per cell under `routers`.
pub fn run_under(
    routers: &[RouterPolicy],
    seeds: u64,
    mut progress: impl FnMut(&str),
) -> Result<Isolation, LabError> {
    let mut cells = Vec::new();
    for t in TRANSPORTS {
        for &r in routers {
            for (cfg, d) in configurations_under(r) {
                progress(&format!("{cfg} ({}, {} router)", t.name(), r.name()));
                for h in hazards() {
                    cells.push(cell_in(t, r, cfg, d, h, seeds)?);
                }
            }
        }
    }
    Ok(Isolation { seeds, cells })
}
