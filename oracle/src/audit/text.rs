//! The audit report as text ([`render`]): what was read, how the run ended, the
//! verdict, every finding with its evidence, and the causal traces. It does not read
//! traces or judge anything ([`crate::audit`]).

use crate::audit::outcome::AuditReport;
use crate::schema::EndOutcome;

/// The report as text: what was read, how the run ended, the verdict, every finding
/// with the entries that prove it, and the causal traces.
pub fn render(r: &AuditReport) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    render_source(&mut s, r);
    render_verdict(&mut s, r);
    for f in &r.findings {
        let _ = writeln!(
            s,
            "  [{} #{}] {}: {}",
            crate::render::secs(f.at_ns),
            f.event,
            f.verdict(),
            f.violation
        );
        for e in &f.evidence {
            let _ = writeln!(s, "      evidence: {e}");
        }
    }
    for (i, lines) in &r.causal {
        let f = &r.findings[*i];
        let _ = writeln!(
            s,
            "causal trace of {} ({}):",
            f.verdict(),
            f.room.map_or("-".into(), |r| r.to_string())
        );
        for l in lines {
            let _ = writeln!(s, "  {l}");
        }
    }
    s
}

/// What was read (entries, size, the run's source, nodes, defenses, bugs) and how the
/// run ended.
fn render_source(s: &mut String, r: &AuditReport) {
    use std::fmt::Write as _;
    let h = &r.header;
    let what = match (&h.scenario, h.seed) {
        (Some(sc), Some(seed)) => format!(", scenario {sc} seed {seed}"),
        (Some(sc), None) => format!(", scenario {sc}"),
        _ => String::new(),
    };
    let _ = writeln!(
        s,
        "audit: {} entries, {:.1} MB from {}{what}; {} nodes; defenses: {}; bugs: {}",
        r.entries,
        r.bytes as f64 / 1e6,
        h.source,
        h.nodes.len(),
        defenses_on(&h.defenses),
        h.bugs
    );
    let _ = writeln!(
        s,
        "run end: {}",
        match r.end {
            EndOutcome::Drained => "drained (liveness judged)",
            EndOutcome::LivenessBound => "did not drain within its liveness bound",
            EndOutcome::EventLimit => "did not drain within its event limit",
            EndOutcome::Cut => "no end entry: the trace is cut, liveness not judged",
        }
    );
}

/// The verdict line: the invariants violated, and those a defense detected.
fn render_verdict(s: &mut String, r: &AuditReport) {
    use std::fmt::Write as _;
    let names = |v: bool| {
        let mut out: Vec<String> = Vec::new();
        for f in r.findings.iter().filter(|f| f.violated() == v) {
            let n = f.violation.invariant.to_string();
            if !out.contains(&n) {
                out.push(n);
            }
        }
        out.join(", ")
    };
    let violated = names(true);
    let detected = names(false);
    let _ = writeln!(
        s,
        "verdict: {}{}",
        if violated.is_empty() {
            "CLEAN (no invariant violated)".to_string()
        } else {
            format!("VIOLATED {violated}")
        },
        if detected.is_empty() {
            String::new()
        } else {
            format!("; DETECTED {detected} (a defense refused it, nothing leaked)")
        }
    );
}

fn defenses_on(d: &kvsim_engine::config::Defenses) -> String {
    let all = [
        ("admission_check", d.admission_check),
        ("verify_on_completion", d.verify_on_completion),
        ("deferred_release", d.deferred_release),
        ("page_tags", d.page_tags),
        ("preflight", d.preflight),
        ("router_cancels_both", d.router_cancels_both),
        ("zero_on_free", d.zero_on_free),
    ];
    let on: Vec<&str> = all.iter().filter(|(_, on)| *on).map(|(n, _)| *n).collect();
    if on.is_empty() {
        "none".into()
    } else {
        on.join(",")
    }
}
