//! The whole matrix ([`Isolation`]): every cell run, looked up by its coordinates,
//! and judged: the expected stops that leaked and the monotonicity breaches. Its
//! table as text is [`super::render`]'s; one cell's run is [`super::cell`]'s.

use crate::isolation::cell::{cell_in, Cell};
use crate::isolation::configs::{adds_only, configurations_under, expected, TRANSPORTS};
use crate::isolation::hazard::{hazards, Hazard, LEAKS};
use crate::LabError;
use kvsim_engine::config::{Defenses, Protocol, RouterPolicy};
use kvsim_engine::invariant::Invariant;
use kvsim_engine::world::KvTransport;

/// An expected stop that leaked: (configuration, transport, router, hazard, leaking
/// seeds).
pub type Miss = (&'static str, KvTransport, RouterPolicy, Hazard, u64);

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
}

/// Run the matrix on `seeds` seeds per cell under every router policy of SGLang's
/// family, whose nodes the matrix's scenarios run (`progress` hears each
/// configuration).
pub fn run(seeds: u64, progress: impl FnMut(&str)) -> Result<Isolation, LabError> {
    run_under(&RouterPolicy::of(Protocol::Sglang), seeds, progress)
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
