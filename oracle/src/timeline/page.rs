//! The page around the picture: the header (facts, verdict, first violation, counts,
//! legend), the rooms table, the data for scripts, and the page's CSS and script
//! (`page.css` and `page.js`, inline: nothing is fetched).

use crate::oracle::Finding;
use crate::render::distinct;
use crate::schema::{ClockKind, RunHeader};
use crate::timeline::html::esc;
use crate::timeline::picture::{time_label, Picture};
use crate::timeline::subject::{Timeline, MAX_ROOM_COLUMNS};
use crate::timeline::svg::{heads_svg, Drawing};
use std::fmt::Write as _;

const CSS: &str = include_str!("page.css");

const JS: &str = include_str!("page.js");

const LEGEND: &str = r#"<p class="legend"><span class="k msg">→ message</span> <span class="k kv">⇒ KV write</span> <span class="k dropped">✕ dropped</span> <span class="k pending">⋯ not delivered</span> <span class="k fault">◆ fault</span> <span class="k violation">● violation</span> <span class="k detection">● detection (a defense fired)</span> room columns: <span class="k s-reserved">reserved</span> <span class="k s-writing">writing</span> <span class="k s-ready">ready</span> <span class="k s-quarantined">quarantined</span></p>"#;

/// The page: `drawing` of `p`, the entries `from..to` of the ones given.
pub(super) fn page(p: &Picture, range: (usize, usize), drawing: &Drawing) -> String {
    let width = p.width();
    let mut html = String::new();
    html.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    let _ = writeln!(
        html,
        "<title>{}</title>",
        esc(&format!("kvsim timeline: {}", p.t.title))
    );
    let _ = writeln!(html, "<style>\n{CSS}</style>\n</head>\n<body>");
    header_html(p, &mut html, range, drawing);
    let _ = write!(
        html,
        r#"<div id="heads" style="width:{width}px">{}</div>"#,
        heads_svg(p, width)
    );
    let _ = writeln!(html, r#"<div id="main">{}</div>"#, drawing.svg);
    rooms_table(p, &mut html);
    html.push_str(r#"<aside id="details"><b>Details</b><div id="details-text">Click an event, an arrow or a marker to see its full text.</div></aside>"#);
    html.push('\n');
    let _ = writeln!(
        html,
        r#"<script type="application/json" id="kvsim-data">{}</script>"#,
        data_json(p, range)
    );
    let _ = writeln!(html, "<script>\n{JS}</script>\n</body>\n</html>");
    html
}

/// The header: the title and notes, the facts, the verdict, the first violation, the
/// cap (when the page draws a window), the counts and the legend.
fn header_html(p: &Picture, html: &mut String, range: (usize, usize), drawing: &Drawing) {
    let t = p.t;
    let _ = writeln!(html, "<header>\n<h1>{}</h1>", esc(&t.title));
    for n in &t.notes {
        let _ = writeln!(html, r#"<p class="note">{}</p>"#, esc(n));
    }
    facts_table(t.header, html);
    verdict_line(t.findings, html);
    first_violation_line(p, html);
    html.push_str(&cap_line(t, range));
    let _ = writeln!(
        html,
        r#"<p class="summary">{} lanes, {} rows, {} arrows, {} findings drawn; {} room uses. <span id="drawn"></span></p>"#,
        p.lanes.len(),
        p.rows.len(),
        drawing.arrows,
        drawing.markers,
        p.own.len()
    );
    html.push_str(LEGEND);
    html.push_str("</header>\n");
}

/// The run's facts: scenario, seed, bug switches, defenses off, the trace's source.
fn facts_table(h: &RunHeader, html: &mut String) {
    html.push_str(r#"<table id="facts">"#);
    let scenario = h.scenario.clone().unwrap_or_else(|| "-".into());
    fact(html, "scenario", "scenario", scenario);
    let seed = h.seed.map_or("-".into(), |s| s.to_string());
    fact(html, "seed", "seed", seed);
    fact(html, "bug switches", "bugs", h.bugs.to_string());
    fact(html, "defenses off", "defenses-off", defenses_off(h));
    fact(html, "trace", "source", trace_source(h));
    html.push_str("</table>\n");
}

fn fact(html: &mut String, k: &str, id: &str, v: String) {
    let _ = write!(
        html,
        r#"<tr><th>{k}</th><td id="{id}">{}</td></tr>"#,
        esc(&v)
    );
}

/// The defenses the run turned off, by name (`none`).
fn defenses_off(h: &RunHeader) -> String {
    let off: Vec<String> = serde_json::to_value(h.defenses)
        .ok()
        .and_then(|v| v.as_object().cloned())
        .map(|o| {
            o.iter()
                .filter(|(_, v)| v.as_bool() == Some(false))
                .map(|(k, _)| k.clone())
                .collect()
        })
        .unwrap_or_default();
    if off.is_empty() {
        "none".into()
    } else {
        off.join(", ")
    }
}

/// What wrote the trace, its clock, and the engine's shape.
fn trace_source(h: &RunHeader) -> String {
    format!(
        "written by {}, {} clock; {} nodes, page {} tokens, context {} tokens",
        h.source,
        match h.clock {
            ClockKind::Simulated => "simulated",
            ClockKind::Wall => "wall",
        },
        h.nodes.len(),
        h.page_size,
        h.context_len
    )
}

/// The verdict: the invariants violated (or none), then the detections.
fn verdict_line(findings: &[Finding], html: &mut String) {
    let violated = distinct(
        &findings
            .iter()
            .filter(|f| f.violated())
            .cloned()
            .collect::<Vec<_>>(),
    );
    let names: Vec<String> = violated.iter().map(|i| i.to_string()).collect();
    let (verdict, text) = if names.is_empty() {
        ("clean", "no violation".to_string())
    } else {
        ("violated", format!("VIOLATED {}", names.join(", ")))
    };
    let _ = write!(
        html,
        r#"<p id="verdict" data-verdict="{verdict}" class="{verdict}">verdict: {text}"#
    );
    let detected: Vec<String> = findings
        .iter()
        .filter(|f| !f.violated())
        .map(|f| {
            format!(
                "{} (by {})",
                f.violation.invariant,
                f.detected_by.unwrap_or("?")
            )
        })
        .collect();
    if !detected.is_empty() {
        let _ = write!(
            html,
            "; detected (a defense fired, nothing leaked): {}",
            esc(&detected.join(", "))
        );
    }
    html.push_str("</p>\n");
}

/// The first violation, linked to its marker in the picture.
fn first_violation_line(p: &Picture, html: &mut String) {
    let Some(f) = p.t.findings.iter().find(|f| f.violated()) else {
        return;
    };
    let _ = writeln!(
        html,
        r##"<p id="first-violation-text" data-invariant="{}"><a href="#first-violation" onclick="kvsimJump(event)">first violation</a> at {} (step #{}): <b>{}</b>: {}</p>"##,
        f.violation.invariant,
        esc(&if p.steps {
            format!("step {}", f.event)
        } else {
            time_label(f.at_ns)
        }),
        f.event,
        esc(&f.verdict()),
        esc(&f.violation.to_string())
    );
}

/// The note that the page draws a window of the trace (empty when it draws all of it).
fn cap_line(t: &Timeline, (from, to): (usize, usize)) -> String {
    let total = t.total.max(t.first + t.entries.len() as u64);
    let shown = (to - from) as u64;
    if shown < total {
        format!(
            r#"<p id="cap" class="cap">This page draws {shown} of the trace's {total} entries (#{} to #{}), the cap being {}: the window is placed around the first violation. The JSON trace has all of them.</p>"#,
            t.first + from as u64 + 1,
            t.first + to as u64,
            t.max_entries
        )
    } else {
        String::new()
    }
}

/// Every room use's pages on each node over time, and how they were let go.
fn rooms_table(p: &Picture, html: &mut String) {
    html.push_str(r#"<section id="rooms"><h2>Page ownership per room use</h2>"#);
    if p.cols.len() > MAX_ROOM_COLUMNS {
        let _ = write!(
            html,
            r#"<p class="cap">The picture has a column for the first {MAX_ROOM_COLUMNS} of {} (room use, node) pairs; this table has them all.</p>"#,
            p.cols.len()
        );
    }
    html.push_str("<table><tr><th>room use</th><th>request</th><th>node</th><th>its pages over time</th></tr>");
    for (k, o) in &p.own {
        let (room, node) = *k;
        let req = p
            .room_req
            .get(&room)
            .map_or("-".to_string(), |(q, tn, _, _)| format!("{q} ({tn})"));
        let _ = write!(
            html,
            r#"<tr class="room" data-room="{room}" data-node="{node}"><td>{room}</td><td>{}</td><td>{node}</td><td>{}</td></tr>"#,
            esc(&req),
            esc(&o.history.join(" → "))
        );
    }
    html.push_str("</table></section>\n");
}

/// The page's facts as JSON, for scripts and tests.
fn data_json(p: &Picture, (from, to): (usize, usize)) -> String {
    let t = p.t;
    let first = t.findings.iter().find(|f| f.violated());
    let v = serde_json::json!({
        "scenario": t.header.scenario,
        "seed": t.header.seed,
        "bugs": t.header.bugs,
        "source": t.header.source,
        "title": t.title,
        "verdict": if first.is_some() { "violated" } else { "clean" },
        "first_violation": first.map(|f| serde_json::json!({
            "invariant": f.violation.invariant.to_string(),
            "text": f.violation.to_string(),
            "at_ns": f.at_ns,
            "seq": f.event,
        })),
        "findings": t.findings.iter().map(|f| serde_json::json!({
            "invariant": f.violation.invariant.to_string(),
            "verdict": if f.violated() { "violated" } else { "detected" },
            "at_ns": f.at_ns,
            "seq": f.event,
        })).collect::<Vec<_>>(),
        "lanes": p.lanes.iter().map(|l| serde_json::json!({"id": l.id, "label": l.label, "role": l.role})).collect::<Vec<_>>(),
        "entries": {"first": t.first + from as u64, "drawn": to - from, "total": t.total.max(t.first + t.entries.len() as u64), "cap": t.max_entries},
    });
    // Inside a script element: no `<`, `>` or `&` may appear as themselves.
    v.to_string()
        .replace('<', "\\u003c")
        .replace('>', "\\u003e")
        .replace('&', "\\u0026")
}
