//! kvsim patch: the action path a BFS job carries, as LEB128 varints.
//!
//! Upstream's BFS queue holds every frontier state with its whole path as a
//! `Vec<usize>`: eight bytes per step, the largest part of a queued job on a deep
//! model. Action indices are small (below 128 they take one byte here), so the path
//! is kept as bytes and decoded to indices only when a discovery or a visitor needs
//! it. Invariant: the bytes are a sequence of complete varints, one per step.

/// A path of action indices, one varint per step.
#[derive(Clone, Debug, Default)]
pub(crate) struct CompactPath(Vec<u8>);

impl CompactPath {
    /// The path of an initial state: its index among the initial states.
    pub(crate) fn start(index: usize) -> Self {
        let mut p = CompactPath(Vec::with_capacity(2));
        p.push(index);
        p
    }

    /// This path extended by one step (one allocation of the final size).
    pub(crate) fn then(&self, index: usize) -> Self {
        let mut p = CompactPath(Vec::with_capacity(self.0.len() + 2));
        p.0.extend_from_slice(&self.0);
        p.push(index);
        p
    }

    fn push(&mut self, mut index: usize) {
        loop {
            let low = (index & 0x7f) as u8;
            index >>= 7;
            if index == 0 {
                self.0.push(low);
                return;
            }
            self.0.push(low | 0x80);
        }
    }

    /// The action indices, first step first.
    pub(crate) fn indices(&self) -> Vec<usize> {
        let mut out = Vec::with_capacity(self.0.len());
        let (mut value, mut shift) = (0usize, 0u32);
        for &b in &self.0 {
            value |= usize::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                out.push(value);
                (value, shift) = (0, 0);
            } else {
                shift += 7;
            }
        }
        debug_assert_eq!(shift, 0, "a path ends with a complete varint");
        out
    }
}

#[cfg(test)]
mod test {
    use super::*;

    #[test]
    fn round_trips_small_and_large_indices() {
        let steps = [0usize, 1, 127, 128, 300, 16_383, 16_384, usize::MAX >> 1, 5];
        let mut p = CompactPath::start(steps[0]);
        for &s in &steps[1..] {
            p = p.then(s);
        }
        assert_eq!(p.indices(), steps);
        assert_eq!(CompactPath::start(3).then(4).0.len(), 2);
    }
}
