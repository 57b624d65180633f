//! Seed streams: one `u64` seed, one independent ChaCha stream per component.
//!
//! Every random choice of a run comes from [`stream`]`(seed, component)`: the same
//! ChaCha8 key (from the seed) with a different stream number per component, so the
//! topology, the workload, each fault kind and each per-message decision draw from
//! sequences that do not share a single number. Turning a fault kind on or off, or
//! adding a new one, therefore does not reshuffle the workload or the other faults.
//! Nothing here reads a clock or an unseeded source.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub use rand_chacha::ChaCha8Rng as Rng;

/// The components that draw random numbers. The discriminant is the ChaCha stream
/// number: never renumber a variant (that would change every recorded seed), only
/// append.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u64)]
pub enum Component {
    /// Node counts, pool sizes, engine limits.
    Topology = 1,
    /// Tenants, prompt lengths, arrival times.
    Workload = 2,
    /// Which fault kinds are on and how hard (one draw per kind, in a fixed order).
    FaultLevels = 3,
    /// Client aborts and disconnects: which requests, how and when.
    Cancels = 4,
    /// Partition windows.
    Partitions = 5,
    /// Node crashes.
    Crashes = 6,
    /// Short engine timeouts.
    Timeouts = 7,
    /// Which prefill node is the slow writer.
    SlowWriter = 8,
    /// The router policy and the router's own seed.
    Router = 9,
    /// Node pauses (stalls).
    Pauses = 10,
    /// Each node's clock rate.
    Clocks = 11,
    /// Per control message: held back.
    NetDelay = 16,
    /// Per control message: lost.
    NetLoss = 17,
    /// Per control message: duplicated.
    NetDuplicate = 18,
    /// Per control message: jitter (reordering).
    NetJitter = 19,
    /// Per KV write: slow.
    WriteSlow = 20,
    /// Per KV write: lands late.
    WriteLate = 21,
    /// Per KV write: fails.
    WriteFail = 22,
    /// Per KV write: a data fault (corrupted, misdirected, torn) and its salt.
    WriteData = 23,
    /// Per reuse of a room number: redeliver the earlier use's control messages.
    StaleReplay = 24,
    /// Per routed room use: a client's start for it from another request.
    ClientRoom = 25,
}

/// The stream of one component for one seed.
pub fn stream(seed: u64, component: Component) -> ChaCha8Rng {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(component as u64);
    rng
}

/// A value in `lo..=hi` (`lo` when `hi < lo`).
pub fn between(rng: &mut ChaCha8Rng, lo: u64, hi: u64) -> u64 {
    if hi <= lo {
        lo
    } else {
        rng.random_range(lo..=hi)
    }
}

/// [`between`] for `u32`.
pub fn between32(rng: &mut ChaCha8Rng, r: [u32; 2]) -> u32 {
    between(rng, u64::from(r[0]), u64::from(r[1])) as u32
}

/// True with probability `permille / 1000`.
pub fn chance(rng: &mut ChaCha8Rng, permille: u32) -> bool {
    permille > 0 && rng.random_range(0..1000u32) < permille
}

/// A value spread evenly over orders of magnitude between `lo` and `hi` (inclusive),
/// so short and long values are both common. Integer arithmetic only, so the result
/// does not depend on the platform's floating point.
pub fn log_between(rng: &mut ChaCha8Rng, lo: u64, hi: u64) -> u64 {
    let lo = lo.max(1);
    if hi <= lo {
        return lo;
    }
    // Pick a binary order of magnitude, then a value inside it.
    let (lb, hb) = (63 - lo.leading_zeros(), 63 - hi.leading_zeros());
    let b = rng.random_range(lb..=hb);
    let (start, end) = ((1u64 << b).max(lo), ((1u64 << b) * 2 - 1).min(hi));
    between(rng, start, end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng as _;

    #[test]
    fn streams_are_independent_and_reproducible() {
        let a: Vec<u64> = (0..4)
            .map(|_| stream(7, Component::Workload).next_u64())
            .collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]), "same seed, same stream");
        let mut w = stream(7, Component::Workload);
        let mut f = stream(7, Component::FaultLevels);
        assert_ne!(w.next_u64(), f.next_u64());
        assert_ne!(
            stream(7, Component::Workload).next_u64(),
            stream(8, Component::Workload).next_u64()
        );
    }

    #[test]
    fn ranges_hold() {
        let mut r = stream(1, Component::Topology);
        for _ in 0..1000 {
            let v = log_between(&mut r, 3, 1500);
            assert!((3..=1500).contains(&v));
            let v = between(&mut r, 5, 9);
            assert!((5..=9).contains(&v));
        }
        assert_eq!(between(&mut r, 4, 4), 4);
        assert!(!chance(&mut r, 0));
        assert!(chance(&mut r, 1000));
    }
}
