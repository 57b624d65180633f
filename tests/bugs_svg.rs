//! `reports/bugs.svg` is read by people: rendered to pixels (resvg), every bar sits on
//! its own label's row, and nothing (no legend box, no other bar) is drawn over a bar.
//! A synthetic matrix (no runs) with caught and missed switches of very different
//! lengths, so that both colours and a long bar under the top-right corner (where a
//! default legend sits) are present.

use kvsim_lab::matrix_report::{self, Matrix, MatrixRow, SimCell, CAUGHT, MISSED};

fn row(label: &str, seeds_run: u64, caught: bool) -> MatrixRow {
    MatrixRow {
        label: label.to_string(),
        sim: SimCell {
            scenario: "scenarios/mixed-faults.toml".into(),
            seeds_run,
            first_seed: caught.then_some(seeds_run - 1),
            invariant: caught.then(|| "S3".to_string()),
            wall_s: 0.1,
        },
        mc: Err("not run".into()),
        baseline: false,
    }
}

fn matrix() -> Matrix {
    Matrix {
        rows: vec![
            row("gate-checks-finished-only", 1, true),
            row("no-length-agreement", 300, false),
            row("success-overwrites-abort", 12, true),
            row("decode-release-immediate", 3, true),
            row("ack-ignores-generation", 240, true),
            row("router-cancels-one-half", 300, false),
        ],
        defenses: Vec::new(),
        seed_budget: 300,
        command: "test".into(),
    }
}

/// One `<tag ...>` element's attribute, as a number.
fn attr(element: &str, name: &str) -> Option<f32> {
    let key = format!(" {name}=\"");
    let start = element.find(&key)? + key.len();
    let end = start + element[start..].find('"')?;
    element[start..end].parse().ok()
}

fn attr_str<'a>(element: &'a str, name: &str) -> Option<&'a str> {
    let key = format!(" {name}=\"");
    let start = element.find(&key)? + key.len();
    let end = start + element[start..].find('"')?;
    Some(&element[start..end])
}

struct Bar {
    x: f32,
    y: f32,
    w: f32,
    h: f32,
    fill: String,
}

fn hex(c: plotters::style::RGBColor) -> String {
    format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
}

/// The bars: rectangles filled with one of the two bar colours.
fn bars(svg: &str) -> Vec<Bar> {
    let colours = [hex(CAUGHT), hex(MISSED)];
    svg.split('<')
        .filter(|e| e.starts_with("rect "))
        .filter_map(|e| {
            let fill = attr_str(e, "fill")?.to_uppercase();
            colours.contains(&fill).then(|| Bar {
                x: attr(e, "x").unwrap_or(0.0),
                y: attr(e, "y").unwrap_or(0.0),
                w: attr(e, "width").unwrap_or(0.0),
                h: attr(e, "height").unwrap_or(0.0),
                fill,
            })
        })
        .collect()
}

/// The y of the text element whose content is `label`.
fn label_y(svg: &str, label: &str) -> Option<f32> {
    svg.split('<')
        .filter(|e| e.starts_with("text "))
        .find(|e| e.rsplit('>').next().map(str::trim) == Some(label))
        .and_then(|e| attr(e, "y"))
}

fn render(svg: &str) -> resvg::tiny_skia::Pixmap {
    let tree = resvg::usvg::Tree::from_str(svg, &resvg::usvg::Options::default())
        .expect("the chart is valid SVG");
    let size = tree.size().to_int_size();
    let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height()).expect("a pixmap");
    resvg::render(
        &tree,
        resvg::tiny_skia::Transform::identity(),
        &mut pixmap.as_mut(),
    );
    pixmap
}

fn pixel(p: &resvg::tiny_skia::Pixmap, x: f32, y: f32) -> String {
    let c = p
        .pixel(x.round() as u32, y.round() as u32)
        .expect("inside the image");
    format!("#{:02X}{:02X}{:02X}", c.red(), c.green(), c.blue())
}

/// Every label on one bar's row, at its centre, in its colour, and the rendered pixels
/// across each bar at its label's height in that colour; no two bars overlap.
fn check_chart(m: &Matrix, svg: &str) -> Result<(), String> {
    let found = bars(svg);
    if found.len() != m.rows.len() {
        return Err(format!(
            "{} bars for {} switches",
            found.len(),
            m.rows.len()
        ));
    }
    let png = render(svg);
    for r in &m.rows {
        let y = label_y(svg, &r.label).ok_or(format!("no label {}", r.label))?;
        let holding: Vec<&Bar> = found
            .iter()
            .filter(|b| b.y <= y && y <= b.y + b.h)
            .collect();
        let [bar] = holding[..] else {
            return Err(format!(
                "`{}`: its label at y={y} is on {} bars' rows",
                r.label,
                holding.len()
            ));
        };
        let centre = bar.y + bar.h / 2.0;
        if (centre - y).abs() > 2.0 {
            return Err(format!(
                "`{}`: label at y={y}, its bar's centre at y={centre}",
                r.label
            ));
        }
        let want = hex(if r.sim.first_seed.is_some() {
            CAUGHT
        } else {
            MISSED
        });
        if bar.fill != want {
            return Err(format!("`{}`: bar colour {} not {want}", r.label, bar.fill));
        }
        let steps = 8;
        for k in 0..=steps {
            let x = bar.x + 1.0 + (bar.w - 2.0).max(0.0) * k as f32 / steps as f32;
            let got = pixel(&png, x, y);
            if got != want {
                return Err(format!(
                    "`{}`: rendered pixel ({x}, {y}) is {got}, not its bar's {want}",
                    r.label
                ));
            }
        }
    }
    for (i, a) in found.iter().enumerate() {
        for b in &found[i + 1..] {
            if !(a.y + a.h <= b.y || b.y + b.h <= a.y) {
                return Err(format!("bars at y={} and y={} overlap", a.y, b.y));
            }
        }
    }
    Ok(())
}

#[test]
fn every_bar_is_on_its_labels_row_and_nothing_covers_a_bar() {
    let m = matrix();
    let svg = matrix_report::svg(&m).unwrap();
    check_chart(&m, &svg).unwrap();
}

/// The check can fail: a legend box drawn over the longest bar, and labels moved by
/// half a row (onto the boundary between two bars, the old chart's layout), are each
/// caught.
#[test]
fn a_legend_over_a_bar_or_a_label_between_bars_is_caught() {
    let m = matrix();
    let svg = matrix_report::svg(&m).unwrap();
    let long = bars(&svg)
        .into_iter()
        .max_by(|a, b| a.w.total_cmp(&b.w))
        .unwrap();
    let legend = format!(
        "<rect x=\"{}\" y=\"{}\" width=\"300\" height=\"{}\" fill=\"#FFFFFF\" stroke=\"#000000\"/>\n</svg>",
        long.x + long.w - 300.0,
        long.y - 2.0,
        long.h + 4.0
    );
    let covered = svg.replacen("</svg>", &legend, 1);
    let e = check_chart(&m, &covered).unwrap_err();
    assert!(e.contains("rendered pixel"), "{e}");

    let half = long.h / 2.0 + 2.0;
    let mut shifted = String::new();
    for (k, part) in svg.split('<').enumerate() {
        if k > 0 {
            shifted.push('<');
        }
        match (part.starts_with("text "), attr(part, "y")) {
            (true, Some(y)) => shifted.push_str(&part.replacen(
                &format!(" y=\"{}\"", attr_str(part, "y").unwrap()),
                &format!(" y=\"{}\"", y + half),
                1,
            )),
            _ => shifted.push_str(part),
        }
    }
    assert!(
        check_chart(&m, &shifted).is_err(),
        "labels between bars pass"
    );
}

mod cli;

/// `kvsim bugs` writes under target/ unless told `--out reports`: a run never
/// overwrites the committed report by default.
#[test]
fn bugs_writes_under_target_by_default() {
    let help = cli::text(&cli::kvsim(&["bugs", "--help"]));
    assert!(help.contains("[default: target/reports]"), "{help}");
}
