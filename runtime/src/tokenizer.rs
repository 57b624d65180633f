//! The HTTP front's tokenizer: deterministic, word-level, reversible.
//!
//! Text is split on ASCII/Unicode whitespace into words; each distinct word gets the
//! next free id of the server's vocabulary in order of first appearance (id
//! [`FIRST_ID`] is the first word the server ever saw). Decoding joins the words of the
//! ids with single spaces, so `decode(encode(t))` is `t` with its whitespace runs
//! collapsed to one space. A marker such as `CANARY-small-1a2b3c4d` is one word, hence
//! one token, and comes back byte for byte whenever a reply echoes that token.
//!
//! The same requests in the same order give the same ids (no hashing reaches an id).
//! Ids below [`FIRST_ID`] are reserved: `0` is the engine's placeholder token (decoded
//! as [`UNKNOWN`]). An id no word has (a client's own `input_ids`) decodes to `<id:N>`.

use std::collections::HashMap;
use std::sync::Arc;

/// The first id a word gets.
pub const FIRST_ID: u32 = 1;
/// How the placeholder token (0) reads.
pub const UNKNOWN: &str = "<unk>";
/// The most distinct words a server's vocabulary holds.
pub const MAX_VOCAB: usize = 1 << 22;

/// Why a text cannot be encoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenizeError {
    #[error("the vocabulary is full ({MAX_VOCAB} distinct words)")]
    VocabularyFull,
}

/// A server's vocabulary (words in order of first appearance).
#[derive(Default, Debug)]
pub struct Vocab {
    words: Vec<Arc<str>>,
    ids: HashMap<Arc<str>, u32>,
}

impl Vocab {
    pub fn new() -> Vocab {
        Vocab::default()
    }

    /// The ids of `text`'s words, adding new words to the vocabulary.
    pub fn encode(&mut self, text: &str) -> Result<Vec<u32>, TokenizeError> {
        let mut out = Vec::new();
        for w in text.split_whitespace() {
            if let Some(&id) = self.ids.get(w) {
                out.push(id);
                continue;
            }
            if self.words.len() >= MAX_VOCAB {
                return Err(TokenizeError::VocabularyFull);
            }
            let id = FIRST_ID + self.words.len() as u32;
            let word: Arc<str> = Arc::from(w);
            self.words.push(word.clone());
            self.ids.insert(word, id);
            out.push(id);
        }
        Ok(out)
    }

    /// The word of one id.
    pub fn word(&self, id: u32) -> String {
        if id == 0 {
            return UNKNOWN.to_string();
        }
        match self.words.get((id - FIRST_ID) as usize) {
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
        let ids = v.encode("CANARY-small-1a2b3c4d x x  x\ty").unwrap();
        assert_eq!(ids, vec![1, 2, 2, 2, 3]);
        assert_eq!(v.decode(&ids), "CANARY-small-1a2b3c4d x x x y");
        assert_eq!(v.decode(&[1]), "CANARY-small-1a2b3c4d");
        assert_eq!(v.decode(&[0, 99]), "<unk> <id:99>");
        // Deterministic: a second vocabulary fed the same text gives the same ids.
        let mut w = Vocab::new();
        assert_eq!(w.encode("CANARY-small-1a2b3c4d x x  x\ty").unwrap(), ids);
        assert!(v.encode("   ").unwrap().is_empty());
    }
}
