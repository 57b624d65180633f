//! What a sweep exercised: which fault kinds fired, at which phases clients
//! cancelled, which engine paths (refusals, quarantines, drains, faults) were hit,
//! which protocol paths ([`crate::reach`]) how many seeds reached, and which of the
//! things a scenario configures its sweep never reached — the simulator's
//! counterpart of the model checker's `sometimes` properties.
//!
//! One run counts into a [`RunCoverage`] (fixed arrays, no allocation on the hot
//! path: the world counts an engine event with one `match`); a sweep adds runs into
//! a [`Coverage`] of named counts, which shards merge by addition.

use crate::plan::FaultKind;
use crate::reach::ReachPath;
use crate::scenario::ReqPhase;
use crate::simulator::output::FaultStats;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;

pub(crate) mod run;

use run::phase_index;
pub use run::{cancel_index, path_index, RunCoverage, CANCEL_PHASES, PATHS};

/// How often a fault kind visibly fired in a run, where the world counts it; `None`
/// for a kind whose effect is a timing the world does not count (delay, reorder,
/// slow writes, short timeouts, the slow writer).
fn fired(kind: FaultKind, st: &FaultStats) -> Option<u64> {
    match kind {
        FaultKind::Loss => Some(st.lost),
        FaultKind::Duplicate => Some(st.duplicated),
        FaultKind::Partition => Some(st.dropped),
        FaultKind::LateWrite => Some(st.writes_late),
        FaultKind::WriteFail => Some(st.writes_failed),
        FaultKind::Crash => Some(st.crashes),
        FaultKind::Cancel => Some(st.cancels),
        FaultKind::CorruptWrite => Some(st.corrupted),
        FaultKind::MisdirectWrite => Some(st.misdirected),
        FaultKind::TornWrite => Some(st.torn),
        FaultKind::StaleReplay => Some(st.stale_replayed),
        FaultKind::ClientRoom => Some(st.client_rooms),
        FaultKind::StaleDuplicateWrite => Some(st.stale_duplicates),
        FaultKind::Pause => Some(st.pauses),
        FaultKind::Delay
        | FaultKind::ClockSkew
        | FaultKind::Reorder
        | FaultKind::SlowWrite
        | FaultKind::ShortTimeouts
        | FaultKind::SlowWriter => None,
    }
}

/// What a sweep hit, as named counts (shards add them up).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Coverage {
    /// Seeds whose plan drew each fault kind on.
    pub drawn: BTreeMap<String, u64>,
    /// How often each countable fault kind fired, over all seeds.
    pub fired: BTreeMap<String, u64>,
    /// Cancels that fired, by phase.
    pub cancel_phases: BTreeMap<String, u64>,
    /// Seeds that hit each engine path of [`PATHS`] at least once.
    pub paths: BTreeMap<String, u64>,
    /// The cancel phases the scenario lets a cancel pick.
    pub configured_cancel_phases: Vec<String>,
    /// Seeds that reached each protocol path of [`ReachPath`] (every path, zero
    /// included, once a seed ran).
    #[serde(default)]
    pub reach: BTreeMap<String, u64>,
    /// The paths the scenario declares it exists to reach (its `reach` list).
    #[serde(default)]
    pub declared_reach: Vec<String>,
}

fn add(map: &mut BTreeMap<String, u64>, key: &str, n: u64) {
    let e = map.entry(key.to_string()).or_insert(0);
    *e = e.saturating_add(n);
}

impl Coverage {
    /// An empty coverage for a sweep whose scenario lets cancels pick `phases`
    /// (empty: every phase, and a time after submission).
    pub fn new(cancel_phases: &[String]) -> Coverage {
        let mut configured: Vec<String> = if cancel_phases.is_empty() {
            CANCEL_PHASES.iter().map(|p| p.to_string()).collect()
        } else {
            cancel_phases
                .iter()
                .map(|p| match ReqPhase::parse(p) {
                    Some(phase) => CANCEL_PHASES[phase_index(phase)].to_string(),
                    None => p.clone(),
                })
                .collect()
        };
        configured.sort();
        configured.dedup();
        Coverage {
            configured_cancel_phases: configured,
            ..Coverage::default()
        }
    }

    /// Add one run: its plan's fault kinds (`Plan::levels`) and what it counted.
    pub fn add_run(&mut self, levels: &[(FaultKind, u32)], stats: &FaultStats) {
        for (kind, _) in levels {
            add(&mut self.drawn, kind.name(), 1);
            if let Some(n) = fired(*kind, stats) {
                add(&mut self.fired, kind.name(), n);
            }
        }
        for (i, n) in stats.coverage.cancels.iter().enumerate() {
            if *n > 0 {
                add(&mut self.cancel_phases, CANCEL_PHASES[i], *n);
            }
        }
        for (i, n) in stats.coverage.paths.iter().enumerate() {
            if *n > 0 {
                add(&mut self.paths, PATHS[i], 1);
            }
        }
        for p in ReachPath::ALL {
            add(
                &mut self.reach,
                p.name(),
                u64::from(stats.coverage.reach.contains(p)),
            );
        }
    }

    /// Add a shard's coverage.
    pub fn merge(&mut self, other: &Coverage) {
        for (map, from) in [
            (&mut self.drawn, &other.drawn),
            (&mut self.fired, &other.fired),
            (&mut self.cancel_phases, &other.cancel_phases),
            (&mut self.paths, &other.paths),
            (&mut self.reach, &other.reach),
        ] {
            for (k, v) in from {
                add(map, k, *v);
            }
        }
        for p in &other.configured_cancel_phases {
            if !self.configured_cancel_phases.contains(p) {
                self.configured_cancel_phases.push(p.clone());
            }
        }
        self.configured_cancel_phases.sort();
        for p in &other.declared_reach {
            if !self.declared_reach.contains(p) {
                self.declared_reach.push(p.clone());
            }
        }
    }

    /// The declared paths no seed reached, in the order declared.
    pub fn unreached_declared(&self) -> Vec<String> {
        self.declared_reach
            .iter()
            .filter(|p| self.reach.get(p.as_str()).copied().unwrap_or(0) == 0)
            .cloned()
            .collect()
    }

    /// The `reach` line: the declared paths with the seeds that reached each, those
    /// no seed reached, then the other paths reached. `judged`: the sweep ran every
    /// seed of its range (otherwise it says it does not judge).
    pub fn render_reach(&self, judged: bool) -> String {
        let seeds = |p: &str| self.reach.get(p).copied().unwrap_or(0);
        let declared: Vec<String> = self
            .declared_reach
            .iter()
            .map(|p| format!("{p} {}", seeds(p)))
            .collect();
        let others: Vec<String> = ReachPath::ALL
            .iter()
            .map(|p| p.name())
            .filter(|p| !self.declared_reach.iter().any(|d| d == p) && seeds(p) > 0)
            .map(|p| format!("{p} {}", seeds(p)))
            .collect();
        let mut s = format!(
            "  reach           declared: {} (seeds)",
            if declared.is_empty() {
                "none".to_string()
            } else {
                declared.join(", ")
            }
        );
        let unreached = self.unreached_declared();
        if !unreached.is_empty() {
            if judged {
                s.push_str(&format!("; NOT REACHED: {}", unreached.join(", ")));
            } else {
                s.push_str(&format!(
                    "; not reached yet: {} (not judged: the sweep did not run every seed of its range)",
                    unreached.join(", ")
                ));
            }
        }
        s.push_str(&format!(
            "; also reached: {}\n",
            if others.is_empty() {
                "none".to_string()
            } else {
                others.join(", ")
            }
        ));
        s
    }

    /// What the sweep configured and never reached: a fault kind drawn on in some
    /// seed that never fired (where firing is counted), a cancel phase the scenario
    /// allows that no cancel fired at (when cancels fired at all).
    pub fn unreached(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (kind, seeds) in &self.drawn {
            if self.fired.get(kind) == Some(&0) {
                out.push(format!(
                    "fault kind `{kind}` drawn on in {seeds} seeds never fired"
                ));
            }
        }
        if self.drawn.contains_key("cancel") {
            for p in &self.configured_cancel_phases {
                if !self.cancel_phases.contains_key(p) {
                    out.push(format!("no cancel fired at phase `{p}`"));
                }
            }
        }
        out
    }

    /// The closing lines of a sweep: fault kinds, cancel phases, engine paths, and a
    /// warning per thing configured and never reached.
    pub fn render(&self) -> String {
        let mut s = String::new();
        let kinds: Vec<String> = self
            .drawn
            .iter()
            .map(|(k, seeds)| match self.fired.get(k) {
                Some(n) => format!("{k} {n}x ({seeds} seeds)"),
                None => format!("{k} ({seeds} seeds, not counted)"),
            })
            .collect();
        let _ = writeln!(
            s,
            "  faults fired    {}",
            if kinds.is_empty() {
                "none drawn".to_string()
            } else {
                kinds.join(", ")
            }
        );
        if self.drawn.contains_key("cancel") {
            let phases: Vec<String> = self
                .cancel_phases
                .iter()
                .map(|(k, n)| format!("{k} {n}"))
                .collect();
            let _ = writeln!(
                s,
                "  cancel phases   {}",
                if phases.is_empty() {
                    "none".to_string()
                } else {
                    phases.join(", ")
                }
            );
        }
        let hit: Vec<String> = PATHS
            .iter()
            .filter_map(|p| self.paths.get(*p).map(|n| format!("{p} {n}")))
            .collect();
        let missed: Vec<&str> = PATHS
            .iter()
            .copied()
            .filter(|p| !self.paths.contains_key(*p))
            .collect();
        let _ = writeln!(
            s,
            "  engine paths    {} (seeds); not hit: {}",
            if hit.is_empty() {
                "none".to_string()
            } else {
                hit.join(", ")
            },
            if missed.is_empty() {
                "-".to_string()
            } else {
                missed.join(", ")
            }
        );
        for w in self.unreached() {
            let _ = writeln!(s, "  WARNING         {w}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvsim_engine::ids::{NodeId, RoomKey};
    use kvsim_engine::trace::TraceEvent;

    #[test]
    fn paths_are_trace_event_names() {
        for p in PATHS {
            assert!(TraceEvent::NAMES.contains(&p), "{p} is not an event");
        }
        let ev = TraceEvent::DrainAcked {
            node: NodeId(1),
            room: RoomKey::new(1, 1),
        };
        assert_eq!(path_index(&ev).map(|i| PATHS[i]), Some(ev.name()));
    }

    #[test]
    fn a_kind_drawn_and_never_fired_is_a_warning() {
        let mut c = Coverage::new(&["kv-sent".to_string()]);
        c.drawn.insert("loss".into(), 3);
        c.fired.insert("loss".into(), 0);
        c.drawn.insert("delay".into(), 3);
        c.drawn.insert("cancel".into(), 2);
        c.fired.insert("cancel".into(), 0);
        let w = c.unreached();
        assert!(w.iter().any(|l| l.contains("`loss`")), "{w:?}");
        assert!(!w.iter().any(|l| l.contains("`delay`")), "{w:?}");
        assert!(w.iter().any(|l| l.contains("phase `kv-sent`")), "{w:?}");
        c.fired.insert("loss".into(), 5);
        c.cancel_phases.insert("kv-sent".into(), 1);
        c.fired.insert("cancel".into(), 1);
        assert!(c.unreached().is_empty(), "{:?}", c.unreached());
    }
}
