//! The simulation's plots, drawn as SVG by plotters: every plot is lines over simulated
//! seconds, one line per tenant (or per reason), so one drawing routine serves them all.
//! They are drawn to be read at about 700 px wide (two to a row on a 1,400 px page): text
//! of 15 to 22 px, thick lines, and no fairness plot for a single tenant.

use plotters::prelude::*;
use tollgate::simulate::RunResult;

/// Line colours that stay apart on white (Tableau 10), reused past ten lines.
const COLOURS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Font sizes as plotters takes them, in points: its SVG writes `size / 1.24` px, so these
/// are 22.6 px titles, 16.1 px axis names and 15.3 px labels and legends.
const TITLE: u32 = 28;
const AXIS: u32 = 20;
const LABEL: u32 = 19;

/// One line of a plot; `None` leaves a gap.
pub struct Line {
    pub label: String,
    pub points: Vec<Option<f64>>,
}

/// The plots of one run: (file stem, SVG text).
pub fn all(run: &RunResult, concurrency: u32) -> Vec<(&'static str, String)> {
    let s = &run.series;
    let x: Vec<f64> = s.t_ms.iter().map(|&t| t as f64 / 1000.0).collect();
    let per_tenant = |values: &dyn Fn(usize, usize) -> Option<f64>| -> Vec<Line> {
        run.tenants
            .iter()
            .enumerate()
            .map(|(i, name)| Line {
                label: name.clone(),
                points: (0..x.len()).map(|k| values(i, k)).collect(),
            })
            .collect()
    };
    let backlog = per_tenant(&|i, k| Some(s.backlog[i][k] as f64));
    let waits = per_tenant(&|i, k| s.wait_ms[i][k].map(|w| w / 1000.0));
    let share = per_tenant(&|i, k| {
        let all: u64 = s.tokens.iter().map(|t| t[k]).sum();
        (all > 0).then(|| s.tokens[i][k] as f64 / all as f64)
    });
    let expired = per_tenant(&|i, k| s.expired.get(i).and_then(|e| e.get(k)).map(|&v| v as f64));
    let refusals: Vec<Line> = s
        .refusals
        .iter()
        .map(|(reason, n)| Line {
            label: reason.clone(),
            points: n.iter().map(|&v| Some(v as f64)).collect(),
        })
        .collect();
    let mut occupancy = vec![Line {
        label: "calls in flight".into(),
        points: s.occupancy.iter().map(|&v| Some(v as f64)).collect(),
    }];
    occupancy.push(Line {
        label: "provider concurrency".into(),
        points: vec![Some(concurrency as f64); x.len()],
    });
    let mut plots = vec![
        (
            "backlog",
            draw("Backlog: queued jobs per tenant", "jobs", &x, &backlog),
        ),
        (
            "waits",
            draw(
                "Wait before the call, mean per sample",
                "seconds",
                &x,
                &waits,
            ),
        ),
        (
            "refusals",
            draw("Refusals per sample, by reason", "refusals", &x, &refusals),
        ),
        (
            "expirations",
            draw(
                "Expired jobs per tenant, so far",
                "jobs expired",
                &x,
                &expired,
            ),
        ),
        (
            "occupancy",
            draw("Provider occupancy", "calls", &x, &occupancy),
        ),
    ];
    // Each simulated deployment's load: calls sent to it per second, between samples.
    if !s.deployment_sent.is_empty() {
        let per_s: Vec<Line> = s
            .deployment_sent
            .iter()
            .map(|(name, sent)| Line {
                label: name.clone(),
                points: (0..x.len())
                    .map(|k| {
                        let span = x[k] - x[k.max(1) - 1];
                        (k > 0 && span > 0.0).then(|| sent[k] as f64 / span)
                    })
                    .collect(),
            })
            .collect();
        plots.push((
            "deployments",
            draw(
                "Calls sent per deployment, per second",
                "calls/s",
                &x,
                &per_s,
            ),
        ));
    }
    // A share among tenants says something only when there are several.
    if run.tenants.len() > 1 {
        plots.push((
            "token_share",
            draw(
                "Token share per tenant, so far",
                "share of tokens",
                &x,
                &share,
            ),
        ));
    }
    plots
}

/// A line plot over `x` seconds, as SVG text.
pub fn draw(title: &str, y_desc: &str, x: &[f64], lines: &[Line]) -> String {
    let mut svg = String::new();
    let x_max = x.last().copied().unwrap_or(1.0).max(1e-3);
    let y_max = lines
        .iter()
        .flat_map(|l| l.points.iter().flatten())
        .fold(0.0f64, |m, &v| m.max(v));
    let y_max = if y_max <= 0.0 { 1.0 } else { y_max * 1.08 };
    {
        let root = SVGBackend::with_string(&mut svg, (720, 360)).into_drawing_area();
        // Drawing into a string cannot fail for want of a device; an error still only
        // costs the plot, never the run.
        let _ = plot(&root, title, y_desc, x, x_max, y_max, lines);
        let _ = root.present();
    }
    svg
}

fn plot<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    y_desc: &str,
    x: &[f64],
    x_max: f64,
    y_max: f64,
    lines: &[Line],
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", TITLE))
        .margin(14)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
    chart
        .configure_mesh()
        .x_desc("simulated seconds")
        .y_desc(y_desc)
        .label_style(("sans-serif", LABEL))
        .axis_desc_style(("sans-serif", AXIS))
        .x_labels(6)
        .y_labels(6)
        .light_line_style(WHITE.mix(0.0))
        .draw()?;
    for (i, line) in lines.iter().enumerate() {
        let color = COLOURS[i % COLOURS.len()].to_rgba();
        // A gap (no value) splits the line into runs.
        let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
        for (k, p) in line.points.iter().enumerate() {
            match p {
                Some(v) => runs.last_mut().expect("one run").push((x[k], *v)),
                None if !runs.last().expect("one run").is_empty() => runs.push(Vec::new()),
                None => {}
            }
        }
        let mut first = true;
        for run in runs.into_iter().filter(|r| !r.is_empty()) {
            let series = chart.draw_series(LineSeries::new(run, color.stroke_width(3)))?;
            if std::mem::take(&mut first) {
                series.label(line.label.clone()).legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 22, y)], color.stroke_width(3))
                });
            }
        }
    }
    if !lines.is_empty() {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .label_font(("sans-serif", LABEL))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .draw()?;
    }
    Ok(())
}
