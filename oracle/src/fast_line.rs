//! The fast path of [`crate::schema::parse_line`]: the entries a trace is mostly made
//! of (engine events that carry page lists, sends and deliveries, timers), read
//! straight from the line's bytes into the schema's own types.
//!
//! The derived reader (`serde_json` into [`Entry`]) buffers every line three times
//! over: `Entry` flattens its record, and `Record`, `TraceEvent` and `MsgView` are
//! internally tagged, so serde collects each object into an intermediate tree before
//! it knows the variant. A page list of 10,000 tags became 10,000 small maps, twice.
//! This reader borrows from the line, keeps one member list per object, and parses a
//! page list in one pass.
//!
//! It never judges differently: it returns `None` (and the derived reader reads the
//! line, with its error message if the line is bad) for anything it does not know
//! exactly: another record or event, an unknown, missing or repeated field, an escape
//! in a string, a number that is not a plain unsigned integer, trailing text. A field's
//! value that is not a number, a plain string or a page list goes through the field
//! type's own `Deserialize`. `oracle/tests/roundtrip.rs` (every record, every field
//! set) and `tests/audit.rs` (every line of a sweep's traces) hold it to the derived
//! reader.

use crate::schema::msg_view::MsgView;
use crate::schema::record::{Entry, Record};
use kvsim_engine::ids::{Generation, NodeId, PageId, PageTag};
use kvsim_engine::trace::TraceEvent;
use serde::de::value::{
    BoolDeserializer, BorrowedStrDeserializer, Error, U64Deserializer, UnitDeserializer,
};
use serde::de::DeserializeOwned;

/// The entry on `line`, when it is one of the kinds this reader knows exactly.
pub fn entry(line: &str) -> Option<Entry> {
    let mut at = Cursor::new(line.as_bytes());
    let mut o = at.object()?;
    at.ws();
    if !at.end() {
        return None;
    }
    let at_ns = o.get("at_ns")?;
    let seq = o.get("seq")?;
    let rec = record(&mut o)?;
    o.done()?;
    Some(Entry { at_ns, seq, rec })
}

/// The variant `$v` with each field read from the member of its own name, by the
/// accessor given (`get`, `opt`, `or_default`, `tags`, `msg`), or taken as it is.
macro_rules! read {
    ($o:ident, $($v:ident)::+ { $($f:ident $(: $how:ident)?),* $(,)? }) => {
        $($v)::+ { $($f: read!(@ $o, $f $(, $how)?)),* }
    };
    (@ $o:ident, $f:ident) => { $f };
    (@ $o:ident, $f:ident, $how:ident) => { $o.$how(stringify!($f))? };
}

fn record(o: &mut Obj) -> Option<Record> {
    use Record::*;
    Some(match o.str("type")? {
        "engine" => Engine(event(o)?),
        "send" => read! { o, Send {
            from: get, to: get, msg: msg, deliver_at_ns: get, duplicate: or_default
        } },
        "deliver" => read! { o, Deliver { from: get, to: get, msg: msg } },
        "drop" => read! { o, Drop { from: get, to: get, msg: msg, reason: get } },
        "timer_set" => read! { o, TimerSet { node: get, timer: get, fire_at_ns: get } },
        "timer_cancel" => read! { o, TimerCancel { node: get, timer: get } },
        "timer_fire" => read! { o, TimerFire { node: get, timer: get } },
        _ => return None,
    })
}

/// The engine events that carry page lists, and the frequent small ones.
fn event(o: &mut Obj) -> Option<TraceEvent> {
    use TraceEvent::*;
    let node: NodeId = o.get("node")?;
    Some(match o.str("event")? {
        "PagesReserved" => read! { o, PagesReserved { node, room: get, pages: tags } },
        "PagesExpectWrite" => read! { o, PagesExpectWrite { node, room: get, pages: tags } },
        "PagesReady" => read! { o, PagesReady { node, room: get, pages: tags } },
        "PagesReleased" => read! { o, PagesReleased {
            node, room: get, pages: tags, how: get, held: tags
        } },
        "Quarantined" => read! { o, Quarantined { node, room: get, pages: tags } },
        "QuarantineReleased" => read! { o, QuarantineReleased {
            node, room: get, pages: tags, acked: get, held: tags
        } },
        "PagesHeld" => read! { o, PagesHeld { node, pages: tags } },
        "PagesUnheld" => read! { o, PagesUnheld { node, pages: tags, freed: tags } },
        "KvWritten" => {
            read! { o, KvWritten {
                node, room: get, pages: tags, start: get, tokens: get, pos: opt
            } }
        }
        "KvSent" => read! { o, KvSent { node, write: get, src: tags, dst: tags, to: opt } },
        "KvLanded" => read! { o, KvLanded { node, write: get, dst: tags } },
        "WriteCompleted" => read! { o, WriteCompleted { node, write: get, ok: get } },
        "Attend" => read! { o, Attend {
            node, room: get, step: get, query_pos: get, seq_len: get, pages: tags
        } },
        "Running" => read! { o, Running { node, room: get, side: get } },
        _ => return None,
    })
}

/// The message view at the cursor: the ones that carry page lists read here, any
/// other (its text) through its own `Deserialize`.
fn msg_view(at: &mut Cursor) -> Option<MsgView> {
    let start = at.i;
    let mut o = at.object()?;
    let m = match o.str("kind")? {
        "KvWrite" => read! { o, MsgView::KvWrite { id: get, src: tags, dst: tags } },
        "KvMeta" => read! { o, MsgView::KvMeta { room: get, dst: tags, prompt_len: get } },
        _ => {
            let text = std::str::from_utf8(&at.b[start..at.i]).ok()?;
            return serde_json::from_str(text).ok();
        }
    };
    o.done()?;
    Some(m)
}

/// A member's value: what this reader parsed itself, or the raw text of one the
/// field's own `Deserialize` reads.
enum Val<'a> {
    Num(u64),
    Str(&'a str),
    Bool(bool),
    Null,
    Tags(Vec<PageTag>),
    Msg(Box<MsgView>),
    Raw(&'a str),
}

impl Val<'_> {
    fn into<T: DeserializeOwned>(self) -> Option<T> {
        match self {
            Val::Num(n) => T::deserialize(U64Deserializer::<Error>::new(n)).ok(),
            Val::Str(s) => T::deserialize(BorrowedStrDeserializer::<Error>::new(s)).ok(),
            Val::Bool(b) => T::deserialize(BoolDeserializer::<Error>::new(b)).ok(),
            Val::Null => T::deserialize(UnitDeserializer::<Error>::new()).ok(),
            Val::Tags(_) | Val::Msg(_) => None,
            Val::Raw(text) => serde_json::from_str(text).ok(),
        }
    }
}

/// One object's members, in order; each is taken at most once, and [`Obj::done`]
/// says whether every one was.
struct Obj<'a> {
    members: Vec<(&'a str, Option<Val<'a>>)>,
}

impl<'a> Obj<'a> {
    fn take(&mut self, key: &str) -> Option<Val<'a>> {
        let m = self.members.iter_mut().find(|(k, _)| *k == key)?;
        m.1.take()
    }

    /// A required field.
    fn get<T: DeserializeOwned>(&mut self, key: &str) -> Option<T> {
        self.take(key)?.into()
    }

    /// An `Option` field: absent or `null` is `Some(None)`; `None` when its value
    /// does not read.
    fn opt<T: DeserializeOwned>(&mut self, key: &str) -> Option<Option<T>> {
        match self.take(key) {
            None | Some(Val::Null) => Some(None),
            Some(v) => v.into().map(Some),
        }
    }

    /// A `#[serde(default)]` field: absent is its default (`null` is not).
    fn or_default<T: DeserializeOwned + Default>(&mut self, key: &str) -> Option<T> {
        match self.take(key) {
            None => Some(T::default()),
            Some(v) => v.into(),
        }
    }

    fn str(&mut self, key: &str) -> Option<&'a str> {
        match self.take(key)? {
            Val::Str(s) => Some(s),
            _ => None,
        }
    }

    fn tags(&mut self, key: &str) -> Option<Vec<PageTag>> {
        match self.take(key)? {
            Val::Tags(t) => Some(t),
            v => v.into(),
        }
    }

    fn msg(&mut self, key: &str) -> Option<MsgView> {
        match self.take(key)? {
            Val::Msg(m) => Some(*m),
            _ => None,
        }
    }

    /// Every member was taken: none unknown.
    fn done(&self) -> Option<()> {
        self.members.iter().all(|(_, v)| v.is_none()).then_some(())
    }
}

/// A position in a line.
struct Cursor<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Cursor<'a> {
    fn new(b: &'a [u8]) -> Self {
        Cursor { b, i: 0 }
    }

    fn end(&self) -> bool {
        self.i == self.b.len()
    }

    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    /// The next byte after whitespace is `c`: consume it.
    fn eat(&mut self, c: u8) -> bool {
        self.ws();
        let hit = self.peek() == Some(c);
        self.i += usize::from(hit);
        hit
    }

    fn expect(&mut self, c: u8) -> Option<()> {
        self.eat(c).then_some(())
    }

    /// An object's members; a key given twice is refused.
    fn object(&mut self) -> Option<Obj<'a>> {
        self.expect(b'{')?;
        let mut members: Vec<(&'a str, Option<Val<'a>>)> = Vec::with_capacity(12);
        if self.eat(b'}') {
            return Some(Obj { members });
        }
        loop {
            self.ws();
            let key = self.string()?;
            if members.iter().any(|(k, _)| *k == key) {
                return None;
            }
            self.expect(b':')?;
            self.ws();
            let v = if key == "msg" {
                Val::Msg(Box::new(msg_view(self)?))
            } else {
                self.value()?
            };
            members.push((key, Some(v)));
            if self.eat(b'}') {
                return Some(Obj { members });
            }
            self.expect(b',')?;
        }
    }

    /// A string without escapes or control characters (its content); the cursor is on
    /// its opening quote.
    fn string(&mut self) -> Option<&'a str> {
        if self.peek() != Some(b'"') {
            return None;
        }
        let start = self.i + 1;
        let len = self.b[start..]
            .iter()
            .position(|&c| c == b'"' || c == b'\\' || c < 0x20)?;
        if self.b[start + len] != b'"' {
            return None;
        }
        self.i = start + len + 1;
        std::str::from_utf8(&self.b[start..start + len]).ok()
    }

    fn value(&mut self) -> Option<Val<'a>> {
        match self.peek()? {
            b'"' => self.string().map(Val::Str),
            b'0'..=b'9' => self.number().map(Val::Num),
            b't' => self.word("true").map(|()| Val::Bool(true)),
            b'f' => self.word("false").map(|()| Val::Bool(false)),
            b'n' => self.word("null").map(|()| Val::Null),
            b'[' => {
                let start = self.i;
                if let Some(t) = self.tag_list() {
                    return Some(Val::Tags(t));
                }
                self.i = start;
                self.skip().map(Val::Raw)
            }
            b'{' => self.skip().map(Val::Raw),
            _ => None,
        }
    }

    fn word(&mut self, w: &str) -> Option<()> {
        let hit = self.b[self.i..].starts_with(w.as_bytes());
        self.i += if hit { w.len() } else { 0 };
        hit.then_some(())
    }

    /// A plain unsigned integer that fits a u64 (no sign, fraction, exponent or
    /// leading zero).
    fn number(&mut self) -> Option<u64> {
        let start = self.i;
        let mut n: u64 = 0;
        while let Some(d @ b'0'..=b'9') = self.peek() {
            n = n.checked_mul(10)?.checked_add(u64::from(d - b'0'))?;
            self.i += 1;
        }
        let digits = self.i - start;
        let leading_zero = digits > 1 && self.b[start] == b'0';
        let more = matches!(self.peek(), Some(b'.' | b'e' | b'E'));
        (digits > 0 && !leading_zero && !more).then_some(n)
    }

    /// A non-empty list of `{"page": P, "gen": G}`, in that form; `None` for any other
    /// value (the cursor is then left anywhere: the caller rewinds).
    fn tag_list(&mut self) -> Option<Vec<PageTag>> {
        self.expect(b'[')?;
        let mut tags = Vec::new();
        loop {
            self.expect(b'{')?;
            self.ws();
            self.word("\"page\"")?;
            self.expect(b':')?;
            self.ws();
            let page = u32::try_from(self.number()?).ok()?;
            self.expect(b',')?;
            self.ws();
            self.word("\"gen\"")?;
            self.expect(b':')?;
            self.ws();
            let gen = self.number()?;
            self.expect(b'}')?;
            tags.push(PageTag {
                page: PageId(page),
                gen: Generation(gen),
            });
            if self.eat(b']') {
                return Some(tags);
            }
            self.expect(b',')?;
        }
    }

    /// Skip one array or object (strings inside may hold escapes): its text.
    fn skip(&mut self) -> Option<&'a str> {
        let start = self.i;
        let mut depth = 0usize;
        while let Some(c) = self.peek() {
            match c {
                b'"' => {
                    self.i += 1;
                    while let Some(s) = self.peek() {
                        self.i += if s == b'\\' { 2 } else { 1 };
                        if s == b'"' {
                            break;
                        }
                    }
                    continue;
                }
                b'[' | b'{' => depth += 1,
                b']' | b'}' => {
                    depth = depth.checked_sub(1)?;
                    if depth == 0 {
                        self.i += 1;
                        return std::str::from_utf8(&self.b[start..self.i]).ok();
                    }
                }
                _ => {}
            }
            self.i += 1;
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the derived reader makes of a line.
    fn derived(line: &str) -> Option<Entry> {
        serde_json::from_str(line).ok()
    }

    /// Every line of the conformance suite this reader takes, it reads as the derived
    /// reader does; and it takes the page-list lines.
    #[test]
    fn reads_the_conformance_lines_as_the_derived_reader() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/trace-conformance");
        let (mut taken, mut lists) = (0, 0);
        for f in std::fs::read_dir(dir).unwrap() {
            let path = f.unwrap().path();
            if path.extension().is_none_or(|x| x != "jsonl") {
                continue;
            }
            for line in std::fs::read_to_string(&path).unwrap().lines().skip(1) {
                if let Some(e) = entry(line) {
                    assert_eq!(
                        Some(&e),
                        derived(line).as_ref(),
                        "{}: {line}",
                        path.display()
                    );
                    taken += 1;
                    lists += usize::from(line.contains("\"page\":"));
                }
            }
        }
        assert!(
            taken > 100 && lists > 50,
            "{taken} lines taken, {lists} with pages"
        );
    }

    /// A line in another form than kvsim writes is read the same, or left to the
    /// derived reader; one the derived reader refuses is never taken.
    #[test]
    fn declines_what_it_does_not_know_exactly() {
        let base = r#"{"at_ns":5,"seq":2,"type":"engine","event":"PagesHeld","node":1,"pages":[{"page":3,"gen":7}]}"#;
        assert!(entry(base).is_some());
        let same = [
            r#" { "seq" : 2 , "at_ns":5,"type":"engine","node":1,"event":"PagesHeld","pages":[ { "page" : 3 , "gen" : 7 } ] } "#,
            r#"{"at_ns":5,"seq":2,"type":"engine","event":"PagesHeld","node":1,"pages":[{"gen":7,"page":3}]}"#,
        ];
        for line in same {
            let line = line.trim();
            assert_eq!(
                entry(line).or_else(|| derived(line)),
                derived(line),
                "{line}"
            );
            assert_eq!(derived(line), entry(base), "{line}");
        }
        let refused = [
            r#"{"at_ns":5,"seq":2,"type":"engine","event":"PagesHeld","node":1,"pages":[{"page":3,"gen":7}]} x"#,
            r#"{"at_ns":5,"at_ns":5,"seq":2,"type":"engine","event":"PagesHeld","node":1,"pages":[]}"#,
            r#"{"at_ns":5.0,"seq":2,"type":"engine","event":"PagesHeld","node":1,"pages":[]}"#,
            r#"{"at_ns":05,"seq":2,"type":"engine","event":"PagesHeld","node":1,"pages":[]}"#,
            r#"{"at_ns":5,"seq":2,"type":"engine","event":"PagesHeld","node":70000,"pages":[]}"#,
            r#"{"at_ns":5,"seq":2,"type":"engine","event":"PagesHeld","node":1,"pages":[{"page":4294967296,"gen":7}]}"#,
            r#"{"at_ns":5,"seq":2,"type":"engine","event":"PagesHeld","node":1}"#,
            r#"{"at_ns":5,"seq":2,"type":"send","from":1,"to":2,"deliver_at_ns":9,"duplicate":null,"msg":{"kind":"Cancel","req":1}}"#,
        ];
        for line in refused {
            assert_eq!(entry(line), None, "{line}");
        }
        let left = [
            r#"{"at_ns":5,"seq":2,"type":"engine","event":"PagesHeld","node":1,"pages":[],"extra":1}"#,
            r#"{"at_ns":5,"seq":2,"type":"engine","event":"PagesHe\u006cd","node":1,"pages":[]}"#,
        ];
        for line in left {
            assert_eq!(entry(line), None, "{line}");
            assert!(derived(line).is_some(), "{line}");
        }
    }
}
