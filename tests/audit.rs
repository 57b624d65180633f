//! `kvsim audit` sees what the simulator sees: the verdict of the oracle fed only a
//! run's exported trace equals the in-process verdict, finding for finding, on every
//! seed of a sweep and on the failing seeds of every bug switch; and a trace edited by
//! hand so that a decode step reads a page another room wrote is judged S3, with the
//! write that proves it. Every line the simulator writes validates against the strict
//! JSON Schema (`docs/trace.schema.json`).

mod cli;

use kvsim_engine::bugs::{Bug, BugSet};
use kvsim_engine::invariant::Invariant;
use kvsim_engine::trace::TraceEvent;
use kvsim_lab::matrix::{configurations, load, load_for, sim_cell, sim_not_applicable};
use kvsim_oracle::audit::{audit, audit_readers, render, AuditOptions};
use kvsim_oracle::schema::{entry_line, header_line, parse_line, Line, Record};
use kvsim_sim::plan::{Plan, Reduction};
use kvsim_sim::sweep::{run_sweep, SeedRange, SweepOptions};
use kvsim_sim::{run_and_audit, run_and_audit_in_memory, run_plan, Backend};

#[test]
fn audit_agrees_with_the_run_on_every_seed_of_a_sweep() {
    let sc = load("scenarios/mixed-faults.toml").unwrap();
    let s = run_sweep(
        &sc,
        "scenarios/mixed-faults.toml",
        &SweepOptions {
            seeds: SeedRange { start: 0, end: 150 },
            audit: true,
            ..SweepOptions::default()
        },
    )
    .unwrap();
    assert_eq!(s.audited, 150);
    assert!(s.audit_mismatches.is_empty(), "{}", s.render());
    assert!(s.clean(), "{}", s.render());
}

#[test]
fn audit_agrees_with_the_run_on_the_failing_seed_of_every_bug_switch() {
    let mut audited = 0;
    for (label, bugs, baseline) in configurations() {
        if baseline || bugs.has(Bug::SkipPreflight) || sim_not_applicable(bugs).is_some() {
            continue;
        }
        let cell = sim_cell(bugs, 300, |_| {}).unwrap();
        let seed = cell
            .first_seed
            .unwrap_or_else(|| panic!("{label}: no failing seed in 300"));
        let plan = Plan::build(
            &load_for(bugs).unwrap(),
            seed,
            Some(bugs),
            &Reduction::default(),
        )
        .unwrap();
        let (out, agreed) = run_and_audit(&plan, Backend::Symbolic);
        assert!(
            !out.findings.is_empty(),
            "{label} seed {seed}: nothing found"
        );
        assert_eq!(agreed, Ok(()), "{label} seed {seed}");
        // The same run handed to the audit in memory (`sweep --audit`).
        let (again, agreed) = run_and_audit_in_memory(&plan, Backend::Symbolic);
        assert_eq!(again.findings, out.findings, "{label} seed {seed}");
        assert_eq!(agreed, Ok(()), "{label} seed {seed}: in memory");
        audited += 1;
    }
    // Every switch but skip-preflight and abort-after-success, and the incident pair.
    assert_eq!(audited, Bug::ALL.len() - 1);
}

/// A clean run's trace, with one decode step edited to read a page that another room
/// use wrote: the audit must call it S3 and cite that room's write.
#[test]
fn a_hand_edited_read_of_another_rooms_page_is_s3_with_its_proof() {
    let sc = load("scenarios/mixed-faults.toml").unwrap();
    let plan = Plan::build(&sc, 3, Some(BugSet::NONE), &Reduction::default()).unwrap();
    let out = run_plan(&plan, Backend::Symbolic, true);
    assert!(out.clean());
    let mut lines = vec![header_line(&out.header)];
    let mut edited = None;
    for (i, e) in out.trace.iter().enumerate() {
        let mut e = e.clone();
        if edited.is_none() {
            if let Record::Engine(TraceEvent::Attend {
                node, room, pages, ..
            }) = &mut e.rec
            {
                // A page of this decode node that another room use wrote earlier.
                let other = out.trace[..i].iter().find_map(|p| match &p.rec {
                    Record::Engine(TraceEvent::KvLanded {
                        node: n,
                        write,
                        dst,
                    }) if n == node && write.room != *room => {
                        dst.first().copied().map(|t| (t, write.room))
                    }
                    _ => None,
                });
                if let Some((tag, writer)) = other {
                    pages[0] = tag;
                    edited = Some((*room, writer, tag));
                }
            }
        }
        lines.push(entry_line(&e));
    }
    let (room, writer, tag) = edited.expect("a decode step and another room's page to edit in");
    let text = lines.join("\n");
    let report = audit_readers(vec![(
        "edited".into(),
        Box::new(std::io::Cursor::new(text.clone())),
    )])
    .unwrap();
    let s3 = report
        .findings
        .iter()
        .find(|f| f.violation.invariant == Invariant::S3)
        .unwrap_or_else(|| panic!("no S3:\n{}", render(&report)));
    assert!(s3.violated());
    assert_eq!(s3.room, Some(room));
    assert!(s3.related.contains(&writer), "{s3:?}");
    assert!(
        s3.evidence.iter().any(|e| e.contains(&writer.to_string())),
        "the proof names the other room's write: {s3:?}"
    );
    // From a file, with the causal trace of the rooms involved.
    let dir = std::env::temp_dir().join(format!("kvsim-audit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("edited.jsonl");
    std::fs::write(&path, text).unwrap();
    let report = audit(&[path], AuditOptions::default()).unwrap();
    let rendered = render(&report);
    assert!(rendered.contains("VIOLATED S3"), "{rendered}");
    assert!(rendered.contains("causal trace"), "{rendered}");
    assert!(rendered.contains(&tag.to_string()), "{rendered}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_unusable_trace_names_the_line_and_the_field() {
    let sc = load("scenarios/mixed-faults.toml").unwrap();
    let plan = Plan::build(&sc, 1, Some(BugSet::NONE), &Reduction::default()).unwrap();
    let out = run_plan(&plan, Backend::Symbolic, true);
    let mut lines = vec![header_line(&out.header)];
    lines.extend(out.trace.iter().take(20).map(entry_line));
    // The first line with a room loses it.
    let i = lines
        .iter()
        .position(|l| l.contains("\"type\":\"engine\"") && l.contains("\"room\":"))
        .expect("an engine event about a room");
    lines[i] = lines[i].replacen("\"room\":", "\"rooom\":", 1);
    let err = audit_readers(vec![(
        "t.jsonl".into(),
        Box::new(std::io::Cursor::new(lines.join("\n"))),
    )])
    .expect_err("refused");
    let msg = err.to_string();
    assert!(msg.contains(&format!("t.jsonl line {}", i + 1)), "{msg}");
    assert!(msg.contains("room"), "{msg}");
    // No header at all.
    let err = audit_readers(vec![(
        "h.jsonl".into(),
        Box::new(std::io::Cursor::new(lines[1].clone())),
    )])
    .expect_err("refused");
    assert!(err.to_string().contains("header"), "{err}");
    // And every line the simulator writes parses back to what it wrote.
    for l in &lines[1..5] {
        assert!(matches!(parse_line(l), Ok(Line::Entry(_))), "{l}");
    }
}

/// The audit's fast reader (`kvsim_oracle::fast_line`) reads every line of a sweep's
/// traces that it takes exactly as the derived reader does, and takes the lines that
/// carry page lists.
#[test]
fn the_fast_reader_reads_every_line_as_the_derived_reader() {
    let sc = load("scenarios/mixed-faults.toml").unwrap();
    let (mut lines, mut taken, mut lists) = (0, 0, 0);
    for seed in 0..20 {
        let plan = Plan::build(&sc, seed, Some(BugSet::NONE), &Reduction::default()).unwrap();
        let out = run_plan(&plan, Backend::Symbolic, true);
        for e in &out.trace {
            let line = entry_line(e);
            lines += 1;
            if let Some(fast) = kvsim_oracle::fast_line::entry(&line) {
                let derived: kvsim_oracle::Entry = serde_json::from_str(&line).unwrap();
                assert_eq!(fast, derived, "seed {seed}: {line}");
                assert_eq!(&fast, e, "seed {seed}: {line}");
                taken += 1;
                lists += usize::from(line.contains("\"page\":"));
            }
        }
    }
    assert!(
        taken * 2 > lines && lists > 1000,
        "{taken} of {lines} lines taken, {lists} with pages"
    );
}

/// The strict schema (`docs/trace.schema.json`): every line of the simulator's traces
/// validates, over the scenarios whose runs hold every kind of record (faults of the
/// world and of data, crashes and restarts, aborts and drains, bug switches' findings).
#[test]
fn every_line_the_simulator_writes_validates_against_the_schema() {
    let schema: serde_json::Value =
        serde_json::from_str(include_str!("../docs/trace.schema.json")).unwrap();
    let v = jsonschema::validator_for(&schema).expect("the schema compiles");
    let runs: [(&str, u64, BugSet); 5] = [
        ("scenarios/mixed-faults.toml", 3, BugSet::NONE),
        ("scenarios/data-faults.toml", 3, BugSet::NONE),
        ("scenarios/abort-storm.toml", 2, BugSet::NONE),
        ("scenarios/partition.toml", 1, BugSet::NONE),
        (
            "scenarios/glm53-incident.toml",
            1,
            BugSet::parse("gate-checks-finished-only,no-length-agreement").unwrap(),
        ),
    ];
    let mut kinds = std::collections::BTreeSet::new();
    for (path, seed, bugs) in runs {
        let plan = Plan::build(
            &load(path).unwrap(),
            seed,
            Some(bugs),
            &Reduction::default(),
        )
        .unwrap();
        let out = run_plan(&plan, Backend::Symbolic, true);
        let lines =
            std::iter::once(header_line(&out.header)).chain(out.trace.iter().map(entry_line));
        for (i, l) in lines.enumerate() {
            let value: serde_json::Value = serde_json::from_str(&l).unwrap();
            if let Err(e) = v.validate(&value) {
                panic!("{path} seed {seed} line {}: {e}\n{l}", i + 1);
            }
            let kind = match (value["type"].as_str(), value["event"].as_str()) {
                (Some("engine"), Some(ev)) => ev.to_string(),
                (Some(t), _) => t.to_string(),
                _ => String::new(),
            };
            kinds.insert(kind);
        }
    }
    for k in [
        "header",
        "send",
        "deliver",
        "drop",
        "fault",
        "end",
        "KvSent",
        "TransferRefused",
        "Quarantined",
        "violation",
    ] {
        assert!(kinds.contains(k), "no {k} line was validated: {kinds:?}");
    }
}

/// `kvsim audit` itself over the conformance suite (`docs/trace-conformance/`): exit 2
/// naming the line for every unusable trace, 1 when the index lists a violation, 0
/// otherwise, and the verdict line names every invariant the index lists.
#[test]
fn kvsim_audit_gives_every_conformance_trace_its_exit_code_and_verdict() {
    let dir = cli::root().join("docs/trace-conformance");
    let index: toml::Table =
        toml::from_str(&std::fs::read_to_string(dir.join("expected.toml")).unwrap()).unwrap();
    let cases = index["case"].as_array().expect("cases");
    for c in cases {
        let files: Vec<String> = c["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| dir.join(f.as_str().unwrap()).display().to_string())
            .collect();
        let mut args = vec!["audit", "--no-causal"];
        args.extend(files.iter().map(String::as_str));
        let out = cli::kvsim(&args);
        let (stdout, stderr) = (
            cli::text(&out),
            String::from_utf8_lossy(&out.stderr).to_string(),
        );
        let findings: Vec<&str> = c
            .get("findings")
            .and_then(|f| f.as_array())
            .map(|a| a.iter().filter_map(|f| f.as_str()).collect())
            .unwrap_or_default();
        let want = if let Some(u) = c.get("unusable") {
            let line = format!("line {}:", u["line"].as_integer().unwrap());
            assert!(stderr.contains(&line), "{files:?}: {stderr}");
            2
        } else if findings.iter().any(|f| f.starts_with("VIOLATED")) {
            1
        } else {
            0
        };
        assert_eq!(
            out.status.code(),
            Some(want),
            "{files:?}:\n{stdout}{stderr}"
        );
        for f in &findings {
            let inv = f.split(' ').nth(1).unwrap();
            let verdict = stdout
                .lines()
                .find(|l| l.starts_with("verdict:"))
                .unwrap_or("");
            assert!(verdict.contains(inv), "{files:?}: {f} not in {verdict}");
        }
    }
}
