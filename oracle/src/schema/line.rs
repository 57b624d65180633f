//! A trace's lines as text: the header and entries written as JSON lines, and
//! [`parse_line`], which reads either back (entries through [`crate::fast_line`]
//! first) and refuses a bad line naming its field. It does not define the records
//! themselves ([`crate::schema::record`], [`crate::schema::header`]).

use crate::schema::header::{RunHeader, READS_VERSIONS, SCHEMA_VERSION};
use crate::schema::record::Entry;
use serde::Serialize;

/// The header line as written: the header's fields plus `"type": "header"`.
#[derive(Serialize)]
struct HeaderLine<'a> {
    r#type: &'static str,
    #[serde(flatten)]
    header: &'a RunHeader,
}

/// The header as one JSON line (no newline).
pub fn header_line(h: &RunHeader) -> String {
    serde_json::to_string(&HeaderLine {
        r#type: "header",
        header: h,
    })
    .expect("a header always serializes")
}

/// An entry as one JSON line (no newline).
pub fn entry_line(e: &Entry) -> String {
    serde_json::to_string(e).expect("an entry always serializes")
}

/// A line of a trace, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Line {
    Header(Box<RunHeader>),
    Entry(Entry),
}

/// A line that cannot be used, with the reason (naming the missing or bad field).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LineError(pub String);

/// Parse one line of a trace.
pub fn parse_line(text: &str) -> Result<Line, LineError> {
    // The common case first: the entries a trace is mostly made of, read straight
    // from the line (`fast_line` declines anything it does not know exactly); then
    // any entry, parsed into its type by the derived reader.
    if let Some(e) = crate::fast_line::entry(text) {
        return Ok(Line::Entry(e));
    }
    if let Ok(e) = serde_json::from_str::<Entry>(text) {
        return Ok(Line::Entry(e));
    }
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| LineError(format!("not JSON: {e}")))?;
    let kind = value
        .get("type")
        .and_then(|t| t.as_str())
        .ok_or_else(|| LineError("missing field `type`".into()))?
        .to_string();
    if kind == "header" {
        let mut v = value;
        if let Some(o) = v.as_object_mut() {
            o.remove("type");
        }
        let h: RunHeader =
            serde_json::from_value(v).map_err(|e| LineError(format!("header: {e}")))?;
        if !READS_VERSIONS.contains(&h.schema_version) {
            return Err(LineError(format!(
                "header: `schema_version` {} is not supported (this kvsim reads versions 1 and 2, and writes {SCHEMA_VERSION})",
                h.schema_version
            )));
        }
        h.check().map_err(LineError)?;
        return Ok(Line::Header(Box::new(h)));
    }
    let e: Entry =
        serde_json::from_value(value).map_err(|e| LineError(format!("`{kind}` entry: {e}")))?;
    Ok(Line::Entry(e))
}
