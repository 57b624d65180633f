//! The matrix as a text table: one row per configuration, one column per hazard, the
//! expected stops marked, then the summary of misses and monotonicity breaches. The
//! judgements themselves are [`super::results`]'s.

use crate::isolation::configs::{configurations_under, expected, TRANSPORTS};
use crate::isolation::hazard::{hazards, Hazard};
use crate::isolation::results::Isolation;
use kvsim_engine::config::RouterPolicy;
use kvsim_engine::world::KvTransport;
use std::fmt::Write as _;

impl Isolation {
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
