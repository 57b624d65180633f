//! Which seeds a sweep runs: a half-open [`SeedRange`] and a [`Shard`] of it (`k/n`),
//! parsed from the command line, with the [`UsageError`] a bad one gets. Not how
//! the seeds run (`runner`) nor what they add up to (`summary`).

use serde::{Deserialize, Serialize};

/// A half-open range of seeds, `start..end`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SeedRange {
    pub start: u64,
    pub end: u64,
}

/// A bad command-line value.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UsageError {
    #[error("--seeds `{0}`: expected A..B (B exclusive), A..=B or a single seed")]
    Seeds(String),
    #[error("--seeds `{0}`: seed 18446744073709551615 (u64::MAX) is past the last sweepable seed (a sweep's range is half-open: it ends at most at u64::MAX, exclusive); run that seed alone with `kvsim replay --seed 18446744073709551615`")]
    SeedsMax(String),
    #[error("--shard `{0}`: expected K/N with 1 <= K <= N")]
    Shard(String),
    #[error("--jobs must be at least 1")]
    Jobs,
    #[error("cannot merge: {0}")]
    Merge(String),
}

impl SeedRange {
    /// Parse `A..B`, `A..=B` or `N`.
    pub fn parse(s: &str) -> Result<SeedRange, UsageError> {
        let bad = || UsageError::Seeds(s.to_string());
        let max = || UsageError::SeedsMax(s.to_string());
        let num = |x: &str| x.trim().replace('_', "").parse::<u64>().map_err(|_| bad());
        let r = if let Some((a, b)) = s.split_once("..=") {
            SeedRange {
                start: num(a)?,
                end: num(b)?.checked_add(1).ok_or_else(max)?,
            }
        } else if let Some((a, b)) = s.split_once("..") {
            SeedRange {
                start: num(a)?,
                end: num(b)?,
            }
        } else {
            let n = num(s)?;
            SeedRange {
                start: n,
                end: n.checked_add(1).ok_or_else(max)?,
            }
        };
        if r.end <= r.start {
            return Err(bad());
        }
        Ok(r)
    }

    pub fn len(&self) -> u64 {
        self.end.saturating_sub(self.start)
    }

    pub fn is_empty(&self) -> bool {
        self.end <= self.start
    }
}

impl std::fmt::Display for SeedRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}..{}", self.start, self.end)
    }
}

/// Shard `k` of `n` (1-based): the seeds `start + k - 1`, `start + k - 1 + n`, ...
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    pub k: u32,
    pub n: u32,
}

impl Shard {
    pub const WHOLE: Shard = Shard { k: 1, n: 1 };

    pub fn parse(s: &str) -> Result<Shard, UsageError> {
        let bad = || UsageError::Shard(s.to_string());
        let (k, n) = s.split_once('/').ok_or_else(bad)?;
        let k: u32 = k.trim().parse().map_err(|_| bad())?;
        let n: u32 = n.trim().parse().map_err(|_| bad())?;
        if n == 0 || k == 0 || k > n {
            return Err(bad());
        }
        Ok(Shard { k, n })
    }

    /// The seeds of `range` this shard runs, in order, computed one at a time (a
    /// range of 10^18 seeds costs nothing until it is iterated).
    pub fn seeds(&self, range: SeedRange) -> impl Iterator<Item = u64> {
        let (k, n) = (u64::from(self.k), u64::from(self.n));
        let first = range.start.checked_add(k - 1).filter(|&f| f < range.end);
        let count = first.map_or(0, |f| (range.end - f - 1) / n + 1);
        (0..count).map(move |i| first.unwrap_or(0) + i * n)
    }

    /// How many seeds of `range` this shard runs.
    pub fn count(&self, range: SeedRange) -> u64 {
        let (k, n) = (u64::from(self.k), u64::from(self.n));
        match range.start.checked_add(k - 1).filter(|&f| f < range.end) {
            Some(f) => (range.end - f - 1) / n + 1,
            None => 0,
        }
    }
}

impl std::fmt::Display for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.k, self.n)
    }
}
