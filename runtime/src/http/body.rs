//! Request bodies, parsed with serde derive: SGLang's `/generate` body and the
//! OpenAI API's `/v1/completions` and `/v1/chat/completions` bodies.
//!
//! Every field has a type whose deserializer says what it must be (`must be a string`,
//! `must be an integer (got "many")`, ...), and [`parse`] names the field by its path
//! (`sampling_params.max_new_tokens`), so a wrong body gets a 400 that names the field
//! and the reason. Unknown fields are accepted (SGLang's router adds a dozen).

use crate::http::limits::MAX_PROMPT_TOKENS;
use serde::de::{self, DeserializeOwned, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use std::fmt;
use std::marker::PhantomData;

/// `field: reason`.
pub fn field_err(field: &str, why: impl fmt::Display) -> String {
    format!("{field}: {why}")
}

/// Parse a JSON object body into `T`; `Err` names the field and the reason.
pub fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, String> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace());
    if first.is_some_and(|b| *b != b'{') && serde_json::from_slice::<de::IgnoredAny>(body).is_ok() {
        return Err(field_err("body", "must be a JSON object"));
    }
    let mut de = serde_json::Deserializer::from_slice(body);
    let r: Result<T, _> = serde_path_to_error::deserialize(&mut de);
    let v = r.map_err(|e| {
        let inner = e.inner();
        if inner.is_syntax() || inner.is_eof() {
            return field_err("body", format!("not JSON: {inner}"));
        }
        let mut field = Vec::new();
        let mut element = None;
        for seg in e.path().iter() {
            match seg {
                serde_path_to_error::Segment::Map { key } => field.push(key.clone()),
                serde_path_to_error::Segment::Seq { index } => element = Some(*index),
                _ => {}
            }
        }
        let msg = inner.to_string();
        let msg = msg
            .rsplit_once(" at line ")
            .map_or(msg.as_str(), |(m, _)| m);
        let field = if field.is_empty() {
            "body".to_string()
        } else {
            field.join(".")
        };
        match element {
            Some(i) => field_err(&field, format!("element {i} {msg}")),
            None => field_err(&field, msg),
        }
    })?;
    de.end()
        .map_err(|e| field_err("body", format!("not JSON: {e}")))?;
    Ok(v)
}

/// The wrong-type methods of a visitor: each says what the value must be and what it
/// was.
macro_rules! wrong_types {
    ($what:expr, $($skip:ident),*) => {
        wrong_types!(@one $what, visit_bool, bool, |v: bool| v.to_string(), $($skip),*);
        wrong_types!(@one $what, visit_i64, i64, |v: i64| v.to_string(), $($skip),*);
        wrong_types!(@one $what, visit_u64, u64, |v: u64| v.to_string(), $($skip),*);
        wrong_types!(@one $what, visit_f64, f64, |v: f64| v.to_string(), $($skip),*);
        wrong_types!(@one $what, visit_str, &str, |v: &str| format!("{v:?}"), $($skip),*);
        wrong_types!(@seq $what, $($skip),*);
        wrong_types!(@map $what, $($skip),*);
    };
    (@one $what:expr, $name:ident, $t:ty, $show:expr, $($skip:ident),*) => {
        wrong_types!(@if_not $name [$($skip),*] {
            fn $name<E: de::Error>(self, v: $t) -> Result<Self::Value, E> {
                Err(E::custom(format!("{} (got {})", $what, ($show)(v))))
            }
        });
    };
    (@seq $what:expr, $($skip:ident),*) => {
        wrong_types!(@if_not visit_seq [$($skip),*] {
            fn visit_seq<A: SeqAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
                Err(de::Error::custom(format!("{} (got an array)", $what)))
            }
        });
    };
    (@map $what:expr, $($skip:ident),*) => {
        wrong_types!(@if_not visit_map [$($skip),*] {
            fn visit_map<A: MapAccess<'de>>(self, _: A) -> Result<Self::Value, A::Error> {
                Err(de::Error::custom(format!("{} (got an object)", $what)))
            }
        });
    };
    (@if_not $name:ident [] { $($body:tt)* }) => { $($body)* };
    (@if_not visit_bool [visit_bool $(, $rest:ident)*] { $($body:tt)* }) => {};
    (@if_not visit_i64 [visit_i64 $(, $rest:ident)*] { $($body:tt)* }) => {};
    (@if_not visit_u64 [visit_u64 $(, $rest:ident)*] { $($body:tt)* }) => {};
    (@if_not visit_f64 [visit_f64 $(, $rest:ident)*] { $($body:tt)* }) => {};
    (@if_not visit_str [visit_str $(, $rest:ident)*] { $($body:tt)* }) => {};
    (@if_not visit_seq [visit_seq $(, $rest:ident)*] { $($body:tt)* }) => {};
    (@if_not visit_map [visit_map $(, $rest:ident)*] { $($body:tt)* }) => {};
    (@if_not $name:ident [$first:ident $(, $rest:ident)*] { $($body:tt)* }) => {
        wrong_types!(@if_not $name [$($rest),*] { $($body)* });
    };
}

/// A string field (`must be a string`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Str(pub String);

impl<'de> Deserialize<'de> for Str {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Str;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Str, E> {
                Ok(Str(v.to_string()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Str, E> {
                Ok(Str(v))
            }
            wrong_types!("must be a string", visit_str);
        }
        d.deserialize_any(V)
    }
}

/// A boolean field (`must be true or false`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flag(pub bool);

impl<'de> Deserialize<'de> for Flag {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Flag;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("true or false")
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Flag, E> {
                Ok(Flag(v))
            }
            wrong_types!("must be true or false", visit_bool);
        }
        d.deserialize_any(V)
    }
}

/// An integer field, range-checked by its user (`must be an integer (got 2.5)`); a
/// value beyond `i64` saturates (it is out of every range).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Int(pub i64);

impl<'de> Deserialize<'de> for Int {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Int;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an integer")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Int, E> {
                Ok(Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Int, E> {
                Ok(Int(i64::try_from(v).unwrap_or(i64::MAX)))
            }
            wrong_types!("must be an integer", visit_i64, visit_u64);
        }
        d.deserialize_any(V)
    }
}

/// One token id (an integer `0..2^32`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokenId(pub u32);

impl<'de> Deserialize<'de> for TokenId {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        const WHAT: &str = "a token id (an integer 0..2^32)";
        impl<'de> Visitor<'de> for V {
            type Value = TokenId;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str(WHAT)
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<TokenId, E> {
                u32::try_from(v)
                    .map(TokenId)
                    .map_err(|_| E::custom(format!("is not {WHAT} (got {v})")))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<TokenId, E> {
                u32::try_from(v)
                    .map(TokenId)
                    .map_err(|_| E::custom(format!("is not {WHAT} (got {v})")))
            }
            wrong_types!(
                "is not a token id (an integer 0..2^32)",
                visit_u64,
                visit_i64
            );
        }
        d.deserialize_any(V)
    }
}

/// A prompt as text: one string, or a batch (a list of strings, or a list of token-id
/// lists, which SGLang and OpenAI both accept).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Text {
    One(String),
    Batch(Vec<String>),
}

/// The most prompts in one batch.
pub const MAX_BATCH: usize = 256;

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Text, E> {
                Ok(Text::One(v.to_string()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Text, E> {
                Ok(Text::One(v))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Text, A::Error> {
                let mut out = Vec::new();
                while let Some(Str(t)) = a.next_element::<Str>()? {
                    if out.len() >= MAX_BATCH {
                        return Err(de::Error::custom(format!(
                            "a batch of more than {MAX_BATCH} prompts"
                        )));
                    }
                    out.push(t);
                }
                Ok(Text::Batch(out))
            }
            wrong_types!("must be a string", visit_str, visit_seq);
        }
        d.deserialize_any(V)
    }
}

/// Token ids: one list, or a batch (a list of lists).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ids {
    One(Vec<u32>),
    Batch(Vec<Vec<u32>>),
}

impl<'de> Deserialize<'de> for Ids {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Ids;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array of token ids")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Ids, A::Error> {
                let mut out = Vec::with_capacity(a.size_hint().unwrap_or(0).min(1 << 16));
                let mut lists: Vec<Vec<u32>> = Vec::new();
                loop {
                    if out.len() > MAX_PROMPT_TOKENS {
                        return Err(de::Error::custom(format!(
                            "more than the front's limit of {} tokens",
                            MAX_PROMPT_TOKENS
                        )));
                    }
                    if out.is_empty() && lists.is_empty() {
                        // The first element decides: an id, or a list (a batch).
                        match a.next_element::<IdOrList>()? {
                            None => break,
                            Some(IdOrList::Id(t)) => out.push(t),
                            Some(IdOrList::List(l)) => lists.push(l),
                        }
                    } else if !lists.is_empty() {
                        if lists.len() >= MAX_BATCH {
                            return Err(de::Error::custom(format!(
                                "a batch of more than {MAX_BATCH} prompts"
                            )));
                        }
                        match a.next_element::<List<TokenId>>()? {
                            None => break,
                            Some(List(l)) => lists.push(l.into_iter().map(|t| t.0).collect()),
                        }
                    } else {
                        match a.next_element::<TokenId>()? {
                            None => break,
                            Some(t) => out.push(t.0),
                        }
                    }
                }
                Ok(if !lists.is_empty() {
                    Ids::Batch(lists)
                } else {
                    Ids::One(out)
                })
            }
            wrong_types!("must be an array of token ids", visit_seq);
        }
        d.deserialize_any(V)
    }
}

/// The first element of `input_ids`: an id, or a list (the batch form).
enum IdOrList {
    Id(u32),
    List(Vec<u32>),
}

impl<'de> Deserialize<'de> for IdOrList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = IdOrList;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a token id")
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<IdOrList, E> {
                TokenId::deserialize(de::value::U64Deserializer::<E>::new(v))
                    .map(|t| IdOrList::Id(t.0))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<IdOrList, E> {
                TokenId::deserialize(de::value::I64Deserializer::<E>::new(v))
                    .map(|t| IdOrList::Id(t.0))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<IdOrList, A::Error> {
                let mut out = Vec::new();
                while let Some(t) = a.next_element::<TokenId>()? {
                    if out.len() >= MAX_PROMPT_TOKENS {
                        return Err(de::Error::custom("a prompt over the front's limit"));
                    }
                    out.push(t.0);
                }
                Ok(IdOrList::List(out))
            }
            wrong_types!(
                "is not a token id (an integer 0..2^32)",
                visit_u64,
                visit_i64,
                visit_seq
            );
        }
        d.deserialize_any(V)
    }
}

/// A JSON object field whose fields are `T`'s (`must be an object`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Obj<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Obj<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Obj<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, a: A) -> Result<Obj<T>, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(a)).map(Obj)
            }
            wrong_types!("must be an object", visit_map);
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// A list field (`must be an array`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct List<T>(pub Vec<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for List<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = List<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<List<T>, A::Error> {
                let mut out = Vec::new();
                while let Some(x) = a.next_element()? {
                    out.push(x);
                }
                Ok(List(out))
            }
            wrong_types!("must be an array", visit_seq);
        }
        d.deserialize_any(V(PhantomData))
    }
}

/// One value or a list of them (the SGLang router's batch form of its pairing
/// fields).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

impl<T: Clone> OneOrMany<T> {
    /// Element `i` (a single value stands for every element).
    pub fn get(&self, i: usize) -> Option<T> {
        match self {
            OneOrMany::One(t) => Some(t.clone()),
            OneOrMany::Many(v) => v.get(i).cloned(),
        }
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for OneOrMany<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        match v {
            serde_json::Value::Array(a) => a
                .into_iter()
                .take(MAX_BATCH + 1)
                .map(|x| T::deserialize(x).map_err(de::Error::custom))
                .collect::<Result<Vec<T>, D::Error>>()
                .map(OneOrMany::Many),
            x => T::deserialize(x)
                .map(OneOrMany::One)
                .map_err(de::Error::custom),
        }
    }
}

/// SGLang's `sampling_params` (only what kvsim uses; the rest is accepted).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct SamplingParams {
    pub max_new_tokens: Option<Int>,
}

/// SGLang's `POST /generate` body (and the write-ups' `prompt`/`max_tokens`/`model`).
#[derive(Clone, Debug, Default, Deserialize)]
pub struct GenerateBody {
    pub text: Option<Text>,
    pub input_ids: Option<Ids>,
    pub prompt: Option<Text>,
    pub sampling_params: Option<Obj<SamplingParams>>,
    pub max_tokens: Option<Int>,
    pub model: Option<Str>,
    pub stream: Option<Flag>,
}

/// OpenAI's `stream_options`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct StreamOptions {
    pub include_usage: Option<Flag>,
}

/// A completion's prompt: a string, a list of token ids, or a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
    Batch(usize),
}

impl<'de> Deserialize<'de> for Prompt {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Prompt;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or a list of token ids")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Prompt, E> {
                Ok(Prompt::Text(v.to_string()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, a: A) -> Result<Prompt, A::Error> {
                // A list of strings is a batch; a list of ids is one prompt.
                match Ids::deserialize(de::value::SeqAccessDeserializer::new(a)) {
                    Ok(Ids::One(v)) => Ok(Prompt::Ids(v)),
                    Ok(Ids::Batch(n)) => Ok(Prompt::Batch(n.len())),
                    Err(e) => Err(e),
                }
            }
            wrong_types!(
                "must be a string or a list of token ids",
                visit_str,
                visit_seq
            );
        }
        d.deserialize_any(V)
    }
}

/// OpenAI's `POST /v1/completions` body.
#[derive(Clone, Debug, Deserialize)]
pub struct CompletionBody {
    pub model: Option<Str>,
    pub prompt: Option<Prompt>,
    pub max_tokens: Option<Int>,
    pub stream: Option<Flag>,
    pub stream_options: Option<Obj<StreamOptions>>,
    pub n: Option<Int>,
    pub echo: Option<Flag>,
}

/// One chat message.
#[derive(Clone, Debug, Deserialize)]
pub struct Message {
    pub role: Option<Str>,
    pub content: Option<Content>,
}

/// A message's content: a string, or OpenAI's list of parts (`{"type": "text", "text":
/// ...}`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Content(pub String);

#[derive(Deserialize)]
struct Part {
    text: Option<Str>,
}

impl<'de> Deserialize<'de> for Content {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Content;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or a list of text parts")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Content, E> {
                Ok(Content(v.to_string()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<Content, A::Error> {
                let mut out = Vec::new();
                while let Some(Obj(p)) = a.next_element::<Obj<Part>>()? {
                    out.extend(p.text.map(|t| t.0));
                }
                Ok(Content(out.join(" ")))
            }
            wrong_types!(
                "must be a string or a list of text parts",
                visit_str,
                visit_seq
            );
        }
        d.deserialize_any(V)
    }
}

/// OpenAI's `POST /v1/chat/completions` body.
#[derive(Clone, Debug, Deserialize)]
pub struct ChatBody {
    pub model: Option<Str>,
    pub messages: Option<List<Obj<Message>>>,
    pub max_tokens: Option<Int>,
    pub max_completion_tokens: Option<Int>,
    pub stream: Option<Flag>,
    pub stream_options: Option<Obj<StreamOptions>>,
    pub n: Option<Int>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_named_with_the_reason() {
        let e = parse::<GenerateBody>(br#"{"sampling_params":{"max_new_tokens":"many"}}"#);
        assert_eq!(
            e.unwrap_err(),
            "sampling_params.max_new_tokens: must be an integer (got \"many\")"
        );
        let e = parse::<GenerateBody>(br#"{"input_ids":[1,-2]}"#).unwrap_err();
        assert!(
            e.starts_with("input_ids: element 1 is not a token id"),
            "{e}"
        );
        let e = parse::<GenerateBody>(br#"{"stream":"yes"}"#).unwrap_err();
        assert_eq!(e, "stream: must be true or false (got \"yes\")");
        let e = parse::<GenerateBody>(b"[1]").unwrap_err();
        assert_eq!(e, "body: must be a JSON object");
        let e = parse::<GenerateBody>(b"{").unwrap_err();
        assert!(e.starts_with("body: not JSON"), "{e}");
        let e = parse::<GenerateBody>(br#"{"sampling_params":7}"#).unwrap_err();
        assert_eq!(e, "sampling_params: must be an object (got 7)");
        let g = parse::<GenerateBody>(br#"{"input_ids":[[1],[2]],"extra":{"x":1}}"#).unwrap();
        assert_eq!(g.input_ids, Some(Ids::Batch(vec![vec![1], vec![2]])));
        let c = parse::<CompletionBody>(br#"{"prompt":[1,2,3]}"#).unwrap();
        assert_eq!(c.prompt, Some(Prompt::Ids(vec![1, 2, 3])));
        let c = parse::<CompletionBody>(br#"{"prompt":["a","b"]}"#).unwrap_err();
        assert!(c.starts_with("prompt: element 0"), "{c}");
    }
}
