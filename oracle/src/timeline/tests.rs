//! The page for a small hand-made run: what it draws, escaping, the window.

use super::{focus_point, page_runs, render, window, Collector, Timeline};
use crate::oracle::Finding;
use crate::schema::{ClockKind, Entry, FaultEvent, MsgView, Record, RunHeader};
use kvsim_engine::config::EngineConfig;
use kvsim_engine::ids::{Generation, NodeId, PageId, PageTag, RequestId, RoomKey, TenantId};
use kvsim_engine::invariant::{Invariant, Violation};
use kvsim_engine::trace::{ReleaseKind, TraceEvent};
use kvsim_engine::world::Topology;

fn header() -> RunHeader {
    let mut h = RunHeader::new(
        "test",
        ClockKind::Simulated,
        &EngineConfig::default(),
        &Topology {
            prefill_pools: vec![8],
            decode_pools: vec![8],
        },
    );
    h.scenario = Some("tiny <\"&'>".into());
    h.seed = Some(7);
    h
}

fn tag(p: u32, g: u64) -> PageTag {
    PageTag {
        page: PageId(p),
        gen: Generation(g),
    }
}

/// The run: a request submitted and routed, then its handoff.
fn entries() -> Vec<Entry> {
    let mut recs = request();
    recs.extend(handoff());
    recs.into_iter()
        .enumerate()
        .map(|(i, (at_ns, rec))| Entry {
            at_ns,
            seq: i as u64 + 1,
            rec,
        })
        .collect()
}

/// The room use all of it is about, and the nodes: router, prefill, decode, client.
fn room_and_nodes() -> (RoomKey, [NodeId; 4]) {
    (
        RoomKey::new(1, 1),
        [NodeId(0), NodeId(1), NodeId(2), NodeId(3)],
    )
}

/// The client submits a request, the router gets it and routes it.
fn request() -> Vec<(u64, Record)> {
    let (room, [r, p, d, c]) = room_and_nodes();
    let submit = MsgView::Submit {
        req: RequestId(0),
        tenant: TenantId(1),
        prompt_len: 64,
        max_new_tokens: 2,
    };
    vec![
        (
            0,
            Record::Submit {
                req: RequestId(0),
                tenant: TenantId(1),
                prompt_len: 64,
                max_new_tokens: 2,
            },
        ),
        (
            0,
            Record::Send {
                from: c,
                to: r,
                msg: submit.clone(),
                deliver_at_ns: 50_000,
                duplicate: false,
            },
        ),
        (
            50_000,
            Record::Deliver {
                from: c,
                to: r,
                msg: submit,
            },
        ),
        (
            50_000,
            Record::Engine(TraceEvent::Routed {
                node: r,
                req: RequestId(0),
                tenant: TenantId(1),
                room,
                prefill: p,
                decode: d,
                prompt_len: 64,
                max_new_tokens: 2,
            }),
        ),
    ]
}

/// The handoff: the prefill gets its start and reserves pages, the decode's start is
/// dropped, the decode crashes, the prefill releases its pages.
fn handoff() -> Vec<(u64, Record)> {
    let (room, [r, p, d, _]) = room_and_nodes();
    let start = MsgView::PrefillStart {
        room,
        req: RequestId(0),
        prompt_len: 64,
        decode: d,
    };
    vec![
        (
            50_000,
            Record::Send {
                from: r,
                to: p,
                msg: start.clone(),
                deliver_at_ns: 100_000,
                duplicate: false,
            },
        ),
        (
            100_000,
            Record::Deliver {
                from: r,
                to: p,
                msg: start.clone(),
            },
        ),
        (
            100_000,
            Record::Engine(TraceEvent::PagesReserved {
                node: p,
                room,
                pages: vec![tag(1, 1), tag(2, 1), tag(3, 2)],
            }),
        ),
        (
            100_000,
            Record::Send {
                from: r,
                to: d,
                msg: start.clone(),
                deliver_at_ns: 150_000,
                duplicate: false,
            },
        ),
        (
            120_000,
            Record::Drop {
                from: r,
                to: d,
                msg: start,
                reason: kvsim_engine::world::DropReason::Lost,
            },
        ),
        (
            130_000,
            Record::Fault(FaultEvent::Crash {
                node: d,
                epoch: 0,
                flushed: vec![],
            }),
        ),
        (
            140_000,
            Record::Engine(TraceEvent::PagesReleased {
                node: p,
                room,
                pages: vec![tag(1, 1), tag(2, 1), tag(3, 2)],
                how: ReleaseKind::Owner,
                held: vec![],
            }),
        ),
    ]
}

fn finding(inv: Invariant, detected: Option<&'static str>, seq: u64) -> Finding {
    Finding {
        violation: Violation::new(inv, "a <b> & \"c\""),
        detected_by: detected,
        at_ns: 100_000,
        event: seq,
        room: Some(RoomKey::new(1, 1)),
        related: vec![],
        pages: vec![(NodeId(1), PageId(2))],
        evidence: vec![],
    }
}

fn count(s: &str, pat: &str) -> usize {
    s.matches(pat).count()
}

#[test]
fn lanes_arrows_and_the_first_violation_are_drawn() {
    let h = header();
    let es = entries();
    let fs = [
        finding(Invariant::S4, Some("verify_on_completion"), 6),
        finding(Invariant::S3, None, 7),
        finding(Invariant::S6, None, 8),
    ];
    let html = render(&Timeline::new(&h, &es, &fs, "kvsim replay x --seed 7"));
    // A lane per node and one per tenant.
    for lane in ["n0", "n1", "n2", "t1"] {
        assert!(
            html.contains(&format!(r#"data-lane="{lane}" data-role"#)),
            "{lane}"
        );
    }
    assert_eq!(count(&html, r#"<g class="lane "#), 4);
    // Submit and PrefillStart delivered, one dropped.
    assert_eq!(count(&html, r#"<g class="arrow msg""#), 2);
    assert_eq!(count(&html, r#"<g class="arrow msg dropped""#), 1);
    assert!(html.contains(r#"data-from="t1" data-to="n0""#));
    assert_eq!(count(&html, r#"id="first-violation""#), 1);
    assert!(html.contains(
        r#"<g class="finding violation first" id="first-violation" data-invariant="S3""#
    ));
    assert_eq!(count(&html, r#"<g class="finding detection""#), 1);
    assert_eq!(count(&html, r#"<g class="finding violation"#), 2);
    assert!(html.contains(r#"data-lanes="n1 n2""#));
    assert!(html.contains("fault crash"));
    // The room column: reserved on n1, freed.
    assert!(html.contains(r#"data-room="room1.g1" data-node="n1" data-state="reserved" data-pages="3" data-end="freed""#));
    assert!(html.contains("p1..p2@g1, p3@g2"));
    assert!(html.contains(r#"id="verdict" data-verdict="violated""#));
    // Self-contained: nothing is fetched.
    assert!(!html.contains(" src=") && !html.contains("href=\"http") && !html.contains("@import"));
}

#[test]
fn strings_are_escaped() {
    let h = header();
    let es = entries();
    let fs = [finding(Invariant::S3, None, 7)];
    let html = render(&Timeline::new(&h, &es, &fs, "t <script>alert(1)</script>"));
    assert!(!html.contains("<script>alert"));
    assert!(html.contains("t &lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(html.contains("tiny &lt;&quot;&amp;&#39;&gt;"));
    assert!(html.contains("a &lt;b&gt; &amp; &quot;c&quot;"));
    assert!(!html.contains("a <b>"));
    // The embedded JSON cannot close its script element.
    let data = html.split(r#"id="kvsim-data">"#).nth(1).unwrap();
    let data = data.split("</script>").next().unwrap();
    assert!(!data.contains('<') && !data.contains('>'));
    let v: serde_json::Value = serde_json::from_str(data).unwrap();
    assert_eq!(v["first_violation"]["invariant"], "S3");
    assert_eq!(v["scenario"], "tiny <\"&'>");
}

#[test]
fn a_clean_run_has_no_marker_and_says_so() {
    let h = header();
    let es = entries();
    let fs = [finding(Invariant::S4, Some("verify_on_completion"), 6)];
    let html = render(&Timeline::new(&h, &es, &fs, "clean"));
    assert!(!html.contains(r#"id="first-violation""#));
    assert!(html.contains(r#"data-verdict="clean""#));
    assert!(html.contains("verdict: no violation"));
    assert!(
        html.contains("detected (a defense fired, nothing leaked): S4 (by verify_on_completion)")
    );
}

#[test]
fn a_long_trace_is_cut_around_the_first_violation_and_says_so() {
    let h = header();
    let mut es = Vec::new();
    for i in 0..1000u64 {
        es.push(Entry {
            at_ns: i * 1000,
            seq: i + 1,
            rec: Record::Engine(TraceEvent::RoomCleared {
                node: NodeId(0),
                room: RoomKey::new(1, i),
            }),
        });
    }
    let mut f = finding(Invariant::S3, None, 600);
    f.at_ns = 599_000;
    let fs = [f];
    let mut t = Timeline::new(&h, &es, &fs, "long");
    t.max_entries = 100;
    let r = window(&es, focus_point(&fs), 100);
    assert_eq!(r, 524..624);
    let html = render(&t);
    assert!(html.contains(r#"id="cap""#));
    assert!(html.contains("draws 100 of the trace's 1000 entries (#525 to #624)"));
    assert_eq!(count(&html, r#"<g class="row "#), 100);
    assert!(html.contains(r#"id="first-violation""#));
    // The streaming collector keeps the same window.
    let mut c = Collector::new(100, focus_point(&fs));
    for e in &es {
        if !c.push(e) {
            break;
        }
    }
    assert_eq!(c.first, 524);
    assert_eq!(c.into_entries(), es[524..624].to_vec());
}

#[test]
fn the_same_input_gives_the_same_bytes() {
    let h = header();
    let es = entries();
    let fs = [finding(Invariant::S3, None, 7)];
    let a = render(&Timeline::new(&h, &es, &fs, "x"));
    let b = render(&Timeline::new(&h, &es, &fs, "x"));
    assert_eq!(a, b);
}

#[test]
fn page_runs_group_consecutive_pages_of_one_generation() {
    let t = [tag(5, 2), tag(6, 2), tag(7, 2), tag(9, 2), tag(10, 1)];
    assert_eq!(page_runs(&t, 8), "p5..p7@g2, p9@g2, p10@g1");
    assert_eq!(page_runs(&t, 1), "p5..p7@g2, … 2 more runs");
}
