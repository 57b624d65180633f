//! The HTTP fronts' tokenizer: deterministic, word-level, the same in every process.
//!
//! Text is split on ASCII/Unicode whitespace into words; a word's id is a hash of its
//! bytes (64-bit FNV-1a, folded into `FIRST_ID..2^31`), so a prefill and a decode
//! process given the same text (as SGLang's router gives both halves) make the same
//! ids with no shared state. Decoding reads ids back through the words this
//! process has seen (at most [`MAX_VOCAB`] of them), joined with single spaces, so
//! `decode(encode(t))` is `t` with its whitespace runs collapsed to one space. A marker
//! such as `CANARY-small-1a2b3c4d` is one word, hence one token, and comes back byte
//! for byte whenever a reply echoes that token. Two words whose hashes agree share an
//! id (about one pair in 2^31): the first one seen is how the id reads.
//!
//! Ids below [`FIRST_ID`] are reserved: `0` is the engine's placeholder token (decoded
//! as [`UNKNOWN`]). An id no word seen has (a client's own `input_ids`) decodes to
//! `<id:N>`.

use crate::sync::Arc;
use std::collections::HashMap;

/// The first id a word gets.
pub const FIRST_ID: u32 = 1;
/// Word ids are below this.
pub const ID_LIMIT: u32 = 1 << 31;
/// How the placeholder token (0) reads.
pub const UNKNOWN: &str = "<unk>";
/// The most distinct words a process remembers for decoding (encoding needs none).
pub const MAX_VOCAB: usize = 1 << 22;

/// The id of one word.
pub fn word_id(w: &str) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in w.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    FIRST_ID + (h % u64::from(ID_LIMIT - FIRST_ID)) as u32
}

/// The words a process has seen, by id.
#[derive(Default, Debug)]
pub struct Vocab {
    words: HashMap<u32, Arc<str>>,
}

impl Vocab {
    pub fn new() -> Vocab {
        Vocab::default()
    }

    /// The ids of `text`'s words (remembering new words while there is room).
    pub fn encode(&mut self, text: &str) -> Vec<u32> {
        let mut out = Vec::new();
        for w in text.split_whitespace() {
            let id = word_id(w);
            if self.words.len() < MAX_VOCAB {
                self.words.entry(id).or_insert_with(|| Arc::from(w));
            }
            out.push(id);
        }
        out
    }

    /// The word of one id.
    pub fn word(&self, id: u32) -> String {
        if id == 0 {
            return UNKNOWN.to_string();
        }
        match self.words.get(&id) {
            Some(w) => w.to_string(),
            None => format!("<id:{id}>"),
        }
    }

    /// The text of `ids`: their words joined by single spaces.
    pub fn decode(&self, ids: &[u32]) -> String {
        ids.iter()
            .map(|&i| self.word(i))
            .collect::<Vec<_>>()
            .join(" ")
    }

    pub fn len(&self) -> usize {
        self.words.len()
    }

    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_markers_are_one_token() {
        let mut v = Vocab::new();
        let ids = v.encode("CANARY-small-1a2b3c4d x x  x\ty");
        let (m, x, y) = (word_id("CANARY-small-1a2b3c4d"), word_id("x"), word_id("y"));
        assert_eq!(ids, vec![m, x, x, x, y]);
        assert!(ids.iter().all(|&i| (FIRST_ID..ID_LIMIT).contains(&i)));
        assert_eq!(v.decode(&ids), "CANARY-small-1a2b3c4d x x x y");
        assert_eq!(v.decode(&[m]), "CANARY-small-1a2b3c4d");
        assert_eq!(v.decode(&[0, 99]), "<unk> <id:99>");
        // The same in another process: a fresh vocabulary gives the same ids.
        let mut w = Vocab::new();
        assert_eq!(w.encode("CANARY-small-1a2b3c4d x x  x\ty"), ids);
        assert!(v.encode("   ").is_empty());
    }
}
