//! The HTML timeline (`--html FILE` of `kvsim replay`, `check` and `audit`), as a
//! browser shows it: the GLM-5.3 incident's violating replay rendered by headless
//! Chromium (the DOM after the page's script ran, and a screenshot), the defended run
//! with no violation, a model checker counterexample, and the same bytes for the same
//! seed. Without `chromium` on PATH the browser checks skip (recorded; under
//! KVSIM_REQUIRE_TOOLS=1 they fail); the file checks still run.

mod cli;

use cli::{kvsim, text, tmp_in, INCIDENT};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SCENARIO: &str = "scenarios/glm53-incident.toml";
/// The incident's seed that leaks (tests/incident.rs runs the scenario's own seed, 1).
const SEED: &str = "1";
/// How long one Chromium run may take before it is killed.
const BROWSER_WAIT: Duration = Duration::from_secs(120);

/// `kvsim replay` of the incident with `bugs` (none: the defended engine), its
/// timeline written to a file of this test binary; the page's text and the exit code.
fn replay_html(name: &str, bugs: Option<&str>) -> (PathBuf, String, Option<i32>) {
    let file = tmp_in("timeline", name);
    let path = file.to_str().unwrap();
    let mut args = vec![
        "replay", SCENARIO, "--seed", SEED, "--brief", "--html", path,
    ];
    if let Some(b) = bugs {
        args.extend(["--bugs", b]);
    }
    let out = kvsim(&args);
    assert!(
        text(&out).contains(&format!("written to {path}")),
        "{}",
        text(&out)
    );
    let html = std::fs::read_to_string(&file).unwrap();
    (file, html, out.status.code())
}

/// Run Chromium headless on `page` with `extra` arguments (a fresh profile, no
/// network, a virtual time budget for the page's script), killed after
/// [`BROWSER_WAIT`]; its standard output.
/// Each call gets its own profile and output file (tests run in parallel), and one
/// browser runs at a time (two headless Chromiums on a loaded 2-core machine make
/// each other's virtual time budget unreliable).
fn chromium(browser: &Path, page: &Path, extra: &[String]) -> String {
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let profile = tmp_in("timeline", &format!("profile-{call}"));
    let _ = std::fs::remove_dir_all(&profile);
    std::fs::create_dir_all(&profile).unwrap();
    let stdout = tmp_in("timeline", &format!("stdout-{call}.txt"));
    let mut child = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--virtual-time-budget=5000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&stdout).unwrap())
        .stderr(Stdio::null())
        .spawn()
        .expect("chromium starts");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > BROWSER_WAIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish within {BROWSER_WAIT:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "chromium: {status}");
    std::fs::read_to_string(&stdout).unwrap()
}

/// The DOM Chromium built from `page`, after its scripts ran.
fn dump_dom(browser: &Path, page: &Path) -> String {
    chromium(browser, page, &["--dump-dom".to_string()])
}

fn count(s: &str, pat: &str) -> usize {
    s.matches(pat).count()
}

/// The text content of the element with id `id` (its first text, tags stripped).
fn text_of(dom: &str, id: &str) -> String {
    let start = dom
        .find(&format!("id=\"{id}\""))
        .unwrap_or_else(|| panic!("no #{id}"));
    let rest = &dom[start..];
    let open = rest.find('>').unwrap() + 1;
    let close = rest.find("</").unwrap();
    rest[open..close].to_string()
}

#[test]
fn the_incident_timeline_in_a_browser_shows_lanes_arrows_rooms_and_the_first_violation() {
    let (file, html, code) = replay_html("incident.html", Some(INCIDENT));
    assert_eq!(code, Some(1), "the incident violates");
    assert!(html.len() < 2_000_000, "{} bytes", html.len());
    let Some(browser) = kvsim_testenv::tool(
        "the_incident_timeline_in_a_browser_shows_lanes_arrows_rooms_and_the_first_violation",
        kvsim_testenv::Need::Tools,
        "chromium",
    ) else {
        return;
    };
    let dom = dump_dom(&browser, &file);
    // The page's script ran in the browser.
    assert!(
        dom.contains(r#"data-script="ran""#),
        "the page's script did not run"
    );
    // A lane per node of the scenario (router, 1 prefill, 1 decode) and per tenant.
    for (lane, role) in [
        ("n0", "router"),
        ("n1", "prefill"),
        ("n2", "decode"),
        ("t1", "client"),
        ("t2", "client"),
    ] {
        assert_eq!(
            count(
                &dom,
                &format!(r#"class="lane {role}" data-lane="{lane}" data-role="{role}""#)
            ),
            1,
            "lane {lane}"
        );
    }
    assert_eq!(count(&dom, r#"<g class="lane "#), 5);
    // Messages and KV writes as arrows: the client's submits reach the router, the
    // prefill node's KV writes reach the decode node.
    assert!(count(&dom, r#"<g class="arrow msg""#) >= 10);
    assert!(dom.contains(r#"<g class="arrow msg" data-from="t2" data-to="n0""#));
    assert!(count(&dom, r#"<g class="arrow kv" data-from="n1" data-to="n2""#) >= 3);
    // The first violation: one marker, S5 (rejected means retired), on the room's two
    // halves; the later violations (S4, S3, S6, S10) marked too.
    assert_eq!(count(&dom, r#"id="first-violation""#), 1);
    // (The script selected it: its class gained `selected`.)
    assert!(dom.contains(
        r#"<g class="finding violation first selected" id="first-violation" data-invariant="S5" data-verdict="violated" data-lanes="n1 n2""#
    ));
    for inv in ["S4", "S3", "S6", "S10"] {
        assert!(
            dom.contains(&format!(
                r#"<g class="finding violation" data-invariant="{inv}""#
            )),
            "{inv}"
        );
    }
    assert!(text_of(&dom, "verdict").contains("VIOLATED S5, S4, S3, S6, S10"));
    // The script showed the first violation in the details panel and counted what the
    // browser drew.
    let details = text_of(&dom, "details-text");
    assert!(
        details.starts_with("VIOLATED S5: S5 (rejected means retired"),
        "{details}"
    );
    let drawn = text_of(&dom, "drawn");
    assert!(
        drawn.starts_with("In this browser: 5 lanes, ") && drawn.contains(" 5 violation markers"),
        "{drawn}"
    );
    // The room ownership panel: the over-length request's room use holds its pages on
    // the decode node (reserved, then written, then ready), and the table lists it.
    assert!(dom.contains(r#"<section id="rooms">"#));
    assert!(dom.contains(r#"<tr class="room" data-room="room2.g2" data-node="n2">"#));
    assert!(dom.contains(
        r#"data-room="room2.g2" data-node="n2" data-state="writing" data-pages="10938""#
    ));
    assert!(dom.contains(r#"data-room="room1.g1" data-node="n1" data-state="ready""#));
    // The header: scenario, seed, bug switches.
    assert_eq!(text_of(&dom, "scenario"), "glm53-incident");
    assert_eq!(text_of(&dom, "seed"), "1");
    assert_eq!(text_of(&dom, "bugs"), INCIDENT);

    // What the browser paints: a full window, many colours, and the red of the verdict
    // and of the first violation.
    let png = tmp_in("timeline", "incident.png");
    let _ = std::fs::remove_file(&png);
    chromium(
        &browser,
        &file,
        &[
            format!("--screenshot={}", png.display()),
            "--window-size=1400,1000".to_string(),
            "--hide-scrollbars".to_string(),
        ],
    );
    let bytes = std::fs::read(&png).unwrap();
    assert!(bytes.len() > 20_000, "{} bytes", bytes.len());
    let shot = resvg::tiny_skia::Pixmap::decode_png(&bytes).expect("a PNG");
    assert_eq!((shot.width(), shot.height()), (1400, 1000));
    let pixels: Vec<[u8; 3]> = shot
        .pixels()
        .iter()
        .map(|p| {
            let c = p.demultiply();
            [c.red(), c.green(), c.blue()]
        })
        .collect();
    let colours: std::collections::BTreeSet<[u8; 3]> = pixels.iter().copied().collect();
    assert!(colours.len() > 50, "{} colours", colours.len());
    let red = pixels
        .iter()
        .filter(|[r, g, b]| *r > 150 && *g < 60 && *b < 80)
        .count();
    assert!(red > 200, "{red} red pixels");
    let blue = pixels
        .iter()
        .filter(|[r, g, b]| *b > 180 && *r < 120 && *g < 140)
        .count();
    assert!(blue > 100, "{blue} blue pixels (the message arrows)");
}

#[test]
fn the_defended_run_says_no_violation_and_marks_none() {
    let (file, html, code) = replay_html("defended.html", None);
    assert_eq!(code, Some(0));
    assert!(html.contains(r#"id="verdict" data-verdict="clean""#));
    assert!(!html.contains(r#"id="first-violation"#));
    let Some(browser) = kvsim_testenv::tool(
        "the_defended_run_says_no_violation_and_marks_none",
        kvsim_testenv::Need::Tools,
        "chromium",
    ) else {
        return;
    };
    let dom = dump_dom(&browser, &file);
    assert!(dom.contains(r#"data-script="ran""#));
    assert_eq!(text_of(&dom, "verdict"), "verdict: no violation");
    assert!(!dom.contains(r#"id="first-violation""#));
    assert_eq!(count(&dom, r#"<g class="finding"#), 0);
    assert!(text_of(&dom, "details-text").starts_with("Click an event"));
    assert_eq!(text_of(&dom, "bugs"), "none");
    // Still a picture of the run: lanes, arrows, rooms.
    assert_eq!(count(&dom, r#"<g class="lane "#), 5);
    assert!(count(&dom, r#"<g class="arrow "#) >= 10);
    assert!(dom.contains(r#"<tr class="room" data-room="room1.g1""#));
}

#[test]
fn the_same_seed_writes_the_same_bytes() {
    let (_, a, _) = replay_html("again-1.html", Some(INCIDENT));
    let (_, b, _) = replay_html("again-2.html", Some(INCIDENT));
    assert!(a == b, "two replays of one seed wrote different timelines");
}

#[test]
fn a_model_checker_counterexample_has_its_timeline() {
    let file = tmp_in("timeline", "check.html");
    let path = file.to_str().unwrap();
    let out = kvsim(&[
        "check",
        "--model",
        "handoff-small",
        "--bugs",
        INCIDENT,
        "--quiet",
        "--html",
        path,
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains(&format!("written to {path}")),
        "{}",
        text(&out)
    );
    let html = std::fs::read_to_string(&file).unwrap();
    assert!(html.contains("<h1>kvsim check --model handoff-small --bugs "));
    assert!(html.contains(r#"id="first-violation" data-invariant="S5""#));
    assert!(html.contains(r#"data-lane="n1" data-role="prefill""#));
    assert!(html.contains(r#"<g class="arrow kv" data-from="n1" data-to="n2""#));
    assert!(html.contains("step 1</text>"), "the axis counts steps");
    // A clean check writes nothing and says so.
    let clean = tmp_in("timeline", "clean-check.html");
    let out = kvsim(&[
        "check",
        "--model",
        "handoff-small",
        "--quiet",
        "--html",
        clean.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(text(&out).contains("no counterexample, so no timeline"));
    assert!(!clean.exists());
}

#[test]
fn the_audit_draws_a_trace_file() {
    let trace = tmp_in("timeline", "incident.jsonl");
    let html = tmp_in("timeline", "audit.html");
    let t = trace.to_str().unwrap();
    let out = kvsim(&[
        "replay",
        SCENARIO,
        "--seed",
        SEED,
        "--bugs",
        INCIDENT,
        "--brief",
        "--trace-json",
        t,
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let out = kvsim(&["audit", t, "--no-causal", "--html", html.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains(r#"id="first-violation" data-invariant="S5""#));
    assert!(page.contains(r#"data-lane="n2" data-role="decode""#));
    assert!(page.contains(r#"<tr class="room" data-room="room2.g2" data-node="n2">"#));
}

#[test]
fn a_timeline_that_cannot_be_written_is_a_clear_error() {
    let out = kvsim(&[
        "replay",
        SCENARIO,
        "--seed",
        SEED,
        "--brief",
        "--html",
        "/nonexistent-dir/t.html",
    ]);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out).contains("cannot write the HTML timeline to /nonexistent-dir/t.html"),
        "{}",
        text(&out)
    );
}
