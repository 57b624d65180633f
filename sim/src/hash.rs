//! `TraceHash`: a fast, portable 64-bit digest of everything a run did.
//!
//! The world feeds it every input it hands a node and every event a node emits, so
//! two runs with equal hashes took the same steps with the same data. It is not
//! `std`'s `DefaultHasher`, whose algorithm may change between Rust releases: the
//! digest must mean the same thing on every machine and toolchain that compares it
//! (sweep shards merged from several hosts). Words are read little-endian.

use std::hash::Hasher;

const K: u64 = 0x517c_c1b7_2722_0a95;

/// A word-at-a-time multiply-rotate hash (the `FxHasher` construction), finished with
/// a SplitMix64 mix so that nearby inputs give distant digests.
#[derive(Clone, Copy, Debug)]
pub struct TraceHash(u64);

impl Default for TraceHash {
    fn default() -> Self {
        TraceHash(0x6b76_7369_6d5f_7472)
    }
}

impl TraceHash {
    #[inline]
    fn mix(&mut self, w: u64) {
        self.0 = (self.0.rotate_left(5) ^ w).wrapping_mul(K);
    }

    /// The digest so far.
    pub fn digest(&self) -> u64 {
        kvsim_engine::gpu::splitmix64(self.0)
    }
}

impl Hasher for TraceHash {
    fn finish(&self) -> u64 {
        self.digest()
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.mix(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.mix(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 56));
        }
    }

    fn write_u8(&mut self, i: u8) {
        self.mix(u64::from(i));
    }
    fn write_u16(&mut self, i: u16) {
        self.mix(u64::from(i));
    }
    fn write_u32(&mut self, i: u32) {
        self.mix(u64::from(i));
    }
    fn write_u64(&mut self, i: u64) {
        self.mix(i);
    }
    fn write_usize(&mut self, i: usize) {
        self.mix(i as u64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::Hash;

    const PINNED: u64 = 0x0039_0ca8_820d_ffed;

    #[test]
    fn stable_and_sensitive() {
        let h = |v: &(u64, &str, Vec<u32>)| {
            let mut t = TraceHash::default();
            v.hash(&mut t);
            t.digest()
        };
        let a = (1, "KvWrite", vec![1, 2, 3]);
        assert_eq!(h(&a), h(&a.clone()));
        assert_ne!(h(&a), h(&(1, "KvWrite", vec![1, 2, 4])));
        assert_ne!(h(&a), h(&(2, "KvWrite", vec![1, 2, 3])));
        // Pinned so that a change of algorithm (which changes every recorded trace
        // hash) is a visible decision.
        assert_eq!(h(&a), PINNED, "{:#018x}", h(&a));
    }
}
