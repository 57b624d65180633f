//! The matrix's rows and other axes: the defense configurations (none, each alone,
//! all), the router policies each exists under, the transports, the stops each
//! defense must make alone, and the order among configurations (one only adds
//! defenses to another). The hazards themselves are [`super::hazard`]'s.

use crate::isolation::hazard::Hazard;
use kvsim_engine::bugs::{Bug, BugSet};
use kvsim_engine::config::{Defenses, RouterPolicy};
use kvsim_engine::world::KvTransport;

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
/// is a defense only of a policy that can cancel the other half
/// ([`RouterPolicy::cancels_other_half`]).
pub fn configurations_under(router: RouterPolicy) -> Vec<(&'static str, Defenses)> {
    configurations()
        .into_iter()
        .filter(|(name, _)| router.cancels_other_half() || *name != ROUTER_CANCEL_ROW)
        .collect()
}

/// The transports every configuration runs on (default first).
pub const TRANSPORTS: [KvTransport; KvTransport::ALL.len()] = KvTransport::ALL;

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
