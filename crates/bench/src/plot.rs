//! The benchmarks' plots (`--plot FILE`), as SVG drawn by plotters with its SVG backend only:
//! no font, bitmap or image code, and the viewer lays the text out. Two shapes: latency
//! distributions (cumulative shares on a logarithmic axis of milliseconds), and counts over
//! time in panels stacked on one time axis, with shaded spans (faults), vertical markers (a
//! kill, a takeover) and a strip of alarms (the node not Ready).
//!
//! The benchmarks hand in plain numbers (points, spans, moments); what the numbers mean is
//! theirs, how they are drawn is here.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

/// Width and height of every plot, in pixels: one screen of a document.
const SIZE: (u32, u32) = (1000, 600);

/// Colours of the lines, in turn (Tableau 10: told apart in print and by most colour-blind
/// readers).
const COLOURS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];
/// Shaded spans (faults) and their labels.
const SPAN: RGBColor = RGBColor(255, 187, 120);
/// Vertical markers and their labels.
const MARKER: RGBColor = RGBColor(64, 64, 64);
/// The fine grid, faint: the lines are what is read.
const LIGHT: RGBColor = RGBColor(242, 242, 242);
/// The strip of alarms.
const ALARM: RGBColor = RGBColor(214, 39, 40);

/// At most this many points per line: a plot of 10,000 pods stays a few hundred KiB.
const MAX_POINTS: usize = 1000;

/// One line: its legend, and its points (x, y).
#[derive(Debug, Clone, Default)]
pub(crate) struct Line {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

impl Line {
    pub(crate) fn new(label: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Self {
            label: label.into(),
            points,
        }
    }
}

/// Where a panel's legend goes: where its lines are not.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Corner {
    UpperRight,
    LowerRight,
}

/// One panel of a timeline: its y axis and its lines.
#[derive(Debug, Clone)]
pub(crate) struct Panel {
    pub y_desc: String,
    pub lines: Vec<Line>,
    pub legend: Corner,
}

/// A stretch of time, shaded, with its label (a fault).
#[derive(Debug, Clone)]
pub(crate) struct Span {
    pub label: String,
    pub from: f64,
    pub to: f64,
}

/// A moment, drawn as a vertical line with its label (a kill, a takeover).
#[derive(Debug, Clone)]
pub(crate) struct Marker {
    pub label: String,
    pub at: f64,
}

/// Counts over time: panels stacked on one time axis (seconds), the spans and markers drawn
/// across all of them, and the alarms (stretches of time, labelled once) as a strip at the
/// bottom of the last panel.
#[derive(Debug, Clone, Default)]
pub(crate) struct Timeline {
    pub title: String,
    pub x_desc: String,
    pub panels: Vec<Panel>,
    pub spans: Vec<Span>,
    pub markers: Vec<Marker>,
    pub alarms: Option<(String, Vec<(f64, f64)>)>,
}

/// The build of this binary, for a plot's title: a debug build's latencies are not a release
/// build's.
pub(crate) fn build() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

/// Writes `svg` to `path`, making its folder if missing.
pub(crate) fn write(path: &Path, svg: &str) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, svg).with_context(|| format!("writing the plot {}", path.display()))
}

/// The cumulative distribution of `samples`, in milliseconds against the share (0 to 1) at or
/// below: at most [`MAX_POINTS`] points, each a quantile.
pub(crate) fn cdf(samples: &[Duration]) -> Vec<(f64, f64)> {
    let mut ms: Vec<f64> = samples.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    ms.sort_by(f64::total_cmp);
    let n = ms.len();
    if n == 0 {
        return Vec::new();
    }
    let step = n.div_ceil(MAX_POINTS);
    #[allow(clippy::cast_precision_loss)]
    let share = |i: usize| (i + 1) as f64 / n as f64;
    let mut points: Vec<(f64, f64)> = (0..n).step_by(step).map(|i| (ms[i], share(i))).collect();
    if !(n - 1).is_multiple_of(step) {
        points.push((ms[n - 1], 1.0));
    }
    points
}

/// The cumulative distribution a Prometheus histogram's buckets give: `buckets` are (upper
/// bound in seconds, count at or below), `+Inf` left out; in milliseconds against the share of
/// `total`. Empty buckets below the first sample and above the last are left out but one, so
/// the line spans the samples.
pub(crate) fn cdf_of_buckets(buckets: &[(f64, f64)], total: f64) -> Vec<(f64, f64)> {
    if total <= 0.0 {
        return Vec::new();
    }
    let finite: Vec<(f64, f64)> = buckets
        .iter()
        .filter(|(le, _)| le.is_finite())
        .map(|(le, count)| (le * 1e3, count / total))
        .collect();
    let first = finite
        .iter()
        .position(|(_, share)| *share > 0.0)
        .map_or(0, |i| i.saturating_sub(1));
    let last = finite
        .iter()
        .position(|(_, share)| *share >= 1.0)
        .unwrap_or(finite.len().saturating_sub(1));
    finite.get(first..=last).unwrap_or_default().to_vec()
}

/// How many of `times` (seconds) are at or before each moment: one step per time, at most
/// [`MAX_POINTS`] points (every k-th time past that), starting at (0, 0).
pub(crate) fn cumulative(times: &[f64]) -> Vec<(f64, f64)> {
    let mut t: Vec<f64> = times.to_vec();
    t.sort_by(f64::total_cmp);
    let step = t.len().div_ceil(MAX_POINTS).max(1);
    let mut points = vec![(0.0, 0.0)];
    #[allow(clippy::cast_precision_loss)]
    for (i, at) in t.iter().enumerate() {
        if i.is_multiple_of(step) || i + 1 == t.len() {
            points.push((*at, (i + 1) as f64));
        }
    }
    points
}

/// `f` sampled at [`MAX_POINTS`] moments from 0 to `end` seconds.
pub(crate) fn sampled(end: f64, f: impl Fn(f64) -> f64) -> Vec<(f64, f64)> {
    #[allow(clippy::cast_precision_loss)]
    (0..=MAX_POINTS)
        .map(|i| {
            let t = end * i as f64 / MAX_POINTS as f64;
            (t, f(t))
        })
        .collect()
}

/// How many of the sorted `times` are at or before `t`.
pub(crate) fn count_at(sorted: &[f64], t: f64) -> f64 {
    #[allow(clippy::cast_precision_loss)]
    let n = sorted.partition_point(|x| *x <= t) as f64;
    n
}

/// The two panels of a burst's timeline (failover, faults), from the moments (seconds) each
/// pod was first seen created upstairs, created downstairs and Running upstairs: those counts,
/// and above them the upper pods not Running (created, waiting: what a user finds unavailable).
pub(crate) fn burst_panels(
    upper_created: &[f64],
    lower_created: &[f64],
    upper_running: &[f64],
) -> Vec<Panel> {
    let sorted = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v
    };
    let (created, running) = (sorted(upper_created), sorted(upper_running));
    let end = created
        .iter()
        .chain(&running)
        .chain(lower_created)
        .fold(0.0_f64, |a, b| a.max(*b));
    vec![
        Panel {
            y_desc: "pods".into(),
            lines: vec![
                Line::new("upper pods created", cumulative(&created)),
                Line::new("lower pods created", cumulative(lower_created)),
                Line::new("upper pods Running", cumulative(&running)),
            ],
            legend: Corner::LowerRight,
        },
        Panel {
            y_desc: "upper pods not Running".into(),
            lines: vec![Line::new(
                "created upstairs, not Running yet",
                sampled(end, |t| count_at(&created, t) - count_at(&running, t)),
            )],
            legend: Corner::UpperRight,
        },
    ]
}

fn position(corner: Corner) -> SeriesLabelPosition {
    match corner {
        Corner::UpperRight => SeriesLabelPosition::UpperRight,
        Corner::LowerRight => SeriesLabelPosition::LowerRight,
    }
}

fn style(i: usize) -> ShapeStyle {
    COLOURS[i % COLOURS.len()].stroke_width(2)
}

/// A label on a linear axis: whole numbers as such, others to a tenth (a run of a few seconds
/// has ticks every half second).
fn tick(v: &f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// A milliseconds label on a logarithmic axis: no trailing zeros.
fn ms_label(v: &f64) -> String {
    if *v >= 1.0 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_owned()
    }
}

/// The latency distributions of `lines` (milliseconds, shares 0 to 1) on one plot: shares in
/// percent against a logarithmic axis of milliseconds, with the p50 and p99 levels marked.
pub(crate) fn latency_cdf(title: &str, lines: &[Line]) -> anyhow::Result<String> {
    let xs = || lines.iter().flat_map(|l| l.points.iter().map(|p| p.0));
    let smallest = xs().filter(|x| *x > 0.0).fold(f64::INFINITY, f64::min);
    let largest = xs().fold(0.0_f64, f64::max);
    let (lo, hi) = if smallest.is_finite() {
        (
            10f64.powf(smallest.log10().floor()),
            10f64
                .powf(largest.log10().ceil())
                .max(10f64.powf(smallest.log10().floor() + 1.0)),
        )
    } else {
        (0.1, 1000.0)
    };
    // The legend goes under the chart, two entries a row: a distribution's lines cross the
    // whole plot, so no corner of it is free.
    let rows = u32::try_from(lines.len().div_ceil(2)).unwrap_or(u32::MAX);
    let legend_height = 16 + 22 * rows;
    let mut svg = String::new();
    {
        let root =
            SVGBackend::with_string(&mut svg, (SIZE.0, SIZE.1 + legend_height)).into_drawing_area();
        root.fill(&WHITE)?;
        let root = root.titled(title, ("sans-serif", 22))?;
        let (plot_area, legend_area) = root.split_vertically(SIZE.1 - 30);
        legend(&legend_area, lines)?;
        let mut chart = ChartBuilder::on(&plot_area)
            .margin(15)
            .x_label_area_size(45)
            .y_label_area_size(60)
            .build_cartesian_2d((lo..hi).log_scale(), 0.0..100.0)?;
        chart
            .configure_mesh()
            .light_line_style(LIGHT)
            .x_desc("latency (ms, logarithmic; samples of 0 at the left edge)")
            .y_desc("share at or below (%)")
            .x_label_formatter(&ms_label)
            .y_label_formatter(&|v| format!("{v:.0}"))
            .axis_desc_style(("sans-serif", 16))
            .draw()?;
        for (level, text) in [(50.0, "p50"), (99.0, "p99")] {
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(lo, level), (hi, level)],
                MARKER.mix(0.5).stroke_width(1),
            )))?;
            chart.draw_series(std::iter::once(Text::new(
                text,
                (lo, level),
                ("sans-serif", 13).into_font().color(&MARKER),
            )))?;
        }
        for (i, line) in lines.iter().enumerate() {
            let points = line
                .points
                .iter()
                .map(|(x, y)| (x.clamp(lo, hi), y * 100.0));
            chart.draw_series(LineSeries::new(points, style(i)))?;
        }
        root.present()?;
    }
    Ok(svg)
}

/// The legend of `lines` in `area`, two entries a row, in the lines' colours.
fn legend(area: &DrawingArea<SVGBackend<'_>, Shift>, lines: &[Line]) -> anyhow::Result<()> {
    let (width, _) = area.dim_in_pixel();
    let column = i32::try_from(width / 2).unwrap_or(i32::MAX);
    let font =
        TextStyle::from(("sans-serif", 14).into_font()).pos(Pos::new(HPos::Left, VPos::Center));
    for (i, line) in lines.iter().enumerate() {
        let (row, col) = (
            i32::try_from(i / 2).unwrap_or(i32::MAX),
            i32::try_from(i % 2).unwrap_or(0),
        );
        let (x, y) = (75 + col * column, 12 + row * 22);
        area.draw(&PathElement::new(vec![(x, y), (x + 28, y)], style(i)))?;
        area.draw(&Text::new(line.label.clone(), (x + 36, y), font.clone()))?;
    }
    Ok(())
}

/// A timeline (see [`Timeline`]).
pub(crate) fn timeline(t: &Timeline) -> anyhow::Result<String> {
    let end = t
        .panels
        .iter()
        .flat_map(|p| p.lines.iter().flat_map(|l| l.points.iter().map(|p| p.0)))
        .chain(t.spans.iter().map(|s| s.to))
        .chain(t.markers.iter().map(|m| m.at))
        .chain(t.alarms.iter().flat_map(|(_, a)| a.iter().map(|s| s.1)))
        .fold(1.0_f64, f64::max)
        * 1.02;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE)?;
        let root = root.titled(&t.title, ("sans-serif", 22))?;
        let areas = root.split_evenly((t.panels.len().max(1), 1));
        let last = t.panels.len().saturating_sub(1);
        for (i, (area, panel)) in areas.iter().zip(&t.panels).enumerate() {
            draw_panel(area, t, panel, end, (i == 0, i == last))?;
        }
        root.present()?;
    }
    Ok(svg)
}

/// One panel of `t`. The first carries the labels of spans and markers, the last the time
/// axis's description and the alarms.
fn draw_panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    t: &Timeline,
    panel: &Panel,
    end: f64,
    (first, last): (bool, bool),
) -> anyhow::Result<()> {
    let alarms = t.alarms.as_ref().filter(|_| last);
    let legend_rows = panel.lines.len() + usize::from(alarms.is_some());
    // Rows of labels at the top of the first panel: the spans' two, then one per marker.
    let span_rows = if t.spans.is_empty() { 0 } else { 2 };
    let label_rows = span_rows + t.markers.len();
    // Room above the lines for the labels of the first panel and a legend in an upper corner.
    let headroom = match (first, panel.legend) {
        (_, Corner::UpperRight) => 1.15 + 0.12 * legend_rows as f64,
        (true, _) => 1.1 + 0.07 * label_rows as f64,
        _ => 1.1,
    };
    let top = panel
        .lines
        .iter()
        .flat_map(|l| l.points.iter().map(|p| p.1))
        .fold(1.0_f64, f64::max)
        * headroom;
    let mut chart = ChartBuilder::on(area)
        .margin(12)
        .x_label_area_size(if last { 40 } else { 22 })
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..end, 0.0..top)?;
    let mut mesh = chart.configure_mesh();
    mesh.light_line_style(LIGHT)
        .y_desc(panel.y_desc.as_str())
        .x_label_formatter(&tick)
        .y_label_formatter(&tick)
        .axis_desc_style(("sans-serif", 15));
    if last {
        mesh.x_desc(t.x_desc.as_str());
    }
    mesh.draw()?;
    let label_font = ("sans-serif", 13).into_font();
    for (k, span) in t.spans.iter().enumerate() {
        chart.draw_series(std::iter::once(Rectangle::new(
            [
                (span.from, 0.0),
                (span.to.max(span.from + end / 400.0), top),
            ],
            SPAN.mix(0.35).filled(),
        )))?;
        if first {
            // Neighbours' labels on alternate rows; in the right half a label ends where its
            // span does, so it is not cut at the edge.
            let y = top * (0.99 - 0.07 * (k % 2) as f64);
            let (x, anchor) = if span.from > end * 0.6 {
                (span.to - end * 0.004, Pos::new(HPos::Right, VPos::Top))
            } else {
                (span.from + end * 0.004, Pos::new(HPos::Left, VPos::Top))
            };
            chart.draw_series(std::iter::once(Text::new(
                span.label.clone(),
                (x, y),
                TextStyle::from(label_font.clone())
                    .color(&RGBColor(166, 86, 0))
                    .pos(anchor),
            )))?;
        }
    }
    for (k, m) in t.markers.iter().enumerate() {
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(m.at, 0.0), (m.at, top)],
            MARKER.stroke_width(1),
        )))?;
        if !first {
            continue;
        }
        // Markers close in time get their labels one under the other; in the right half of
        // the plot a label ends at its line, so it is not cut at the edge.
        let y = top * (0.99 - 0.07 * (span_rows + k) as f64);
        let (x, anchor) = if m.at > end * 0.6 {
            (m.at - end * 0.004, Pos::new(HPos::Right, VPos::Top))
        } else {
            (m.at + end * 0.004, Pos::new(HPos::Left, VPos::Top))
        };
        chart.draw_series(std::iter::once(Text::new(
            m.label.clone(),
            (x, y),
            TextStyle::from(label_font.clone())
                .color(&MARKER)
                .pos(anchor),
        )))?;
    }
    if let Some((label, stretches)) = alarms {
        let height = top * 0.03;
        chart
            .draw_series(stretches.iter().map(|(from, to)| {
                Rectangle::new(
                    [(*from, 0.0), ((*to).max(from + end / 400.0), height)],
                    ALARM.filled(),
                )
            }))?
            .label(label.as_str())
            .legend(|(x, y)| Rectangle::new([(x, y - 4), (x + 24, y + 4)], ALARM.filled()));
    }
    for (i, line) in panel.lines.iter().enumerate() {
        chart
            .draw_series(LineSeries::new(line.points.iter().copied(), style(i)))?
            .label(line.label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], style(i)));
    }
    chart
        .configure_series_labels()
        .position(position(panel.legend))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The texts of a well-formed SVG document (an error if it is not one).
    fn texts(svg: &str) -> Vec<String> {
        let doc = roxmltree::Document::parse(svg).expect("well-formed XML");
        assert_eq!(doc.root_element().tag_name().name(), "svg");
        doc.descendants()
            .filter(|n| n.has_tag_name("text"))
            .filter_map(|n| n.text().map(str::to_owned))
            .collect()
    }

    /// The polylines of an SVG document with at least `min` points: the lines drawn.
    fn polylines(svg: &str, min: usize) -> usize {
        let doc = roxmltree::Document::parse(svg).expect("well-formed XML");
        doc.descendants()
            .filter(|n| n.has_tag_name("polyline"))
            .filter(|n| n.attribute("points").unwrap_or_default().split(' ').count() >= min)
            .count()
    }

    fn has(texts: &[String], want: &str) -> bool {
        texts.iter().any(|t| t.contains(want))
    }

    #[test]
    fn a_latency_distribution_has_its_title_axes_legend_and_lines() {
        let outside: Vec<Duration> = (1..=200).map(|i| Duration::from_micros(i * 997)).collect();
        let lines = vec![
            Line::new("bound -> lower created", cdf(&outside)),
            Line::new(
                "queue_wait (inside the node)",
                cdf_of_buckets(
                    &[(0.001, 10.0), (0.01, 60.0), (0.1, 95.0), (1.0, 100.0)],
                    100.0,
                ),
            ),
        ];
        let svg = latency_cdf("Offload: 200 pods", &lines).unwrap();
        let t = texts(&svg);
        for want in [
            "Offload: 200 pods",
            "latency (ms, logarithmic;",
            "share at or below (%)",
            "bound -> lower created",
            "queue_wait (inside the node)",
            "p99",
        ] {
            assert!(has(&t, want), "{want:?} not in {t:?}");
        }
        // Both lines are drawn, each with its points (the p50/p99 levels have two).
        assert_eq!(polylines(&svg, 4), 2, "{svg}");
    }

    #[test]
    fn a_timeline_has_its_panels_spans_markers_and_alarms() {
        let created: Vec<f64> = (0..100).map(|i| f64::from(i) * 0.1).collect();
        let running: Vec<f64> = created.iter().map(|t| t + 2.0).collect();
        let waiting = sampled(12.0, |t| count_at(&created, t) - count_at(&running, t));
        let svg = timeline(&Timeline {
            title: "Faults: 100 pods".into(),
            x_desc: "time since the burst began (s)".into(),
            panels: vec![
                Panel {
                    y_desc: "pods".into(),
                    lines: vec![
                        Line::new("upper pods created", cumulative(&created)),
                        Line::new("upper pods Running", cumulative(&running)),
                    ],
                    legend: Corner::LowerRight,
                },
                Panel {
                    y_desc: "pods not Running".into(),
                    lines: vec![Line::new("waiting", waiting)],
                    legend: Corner::UpperRight,
                },
            ],
            spans: vec![Span {
                label: "lower-network-cut".into(),
                from: 3.0,
                to: 6.0,
            }],
            markers: vec![Marker {
                label: "leader killed".into(),
                at: 5.0,
            }],
            alarms: Some(("node not Ready".into(), vec![(3.5, 6.5)])),
        })
        .unwrap();
        let t = texts(&svg);
        for want in [
            "Faults: 100 pods",
            "time since the burst began (s)",
            "pods not Running",
            "upper pods created",
            "upper pods Running",
            "waiting",
            "lower-network-cut",
            "leader killed",
            "node not Ready",
        ] {
            assert!(has(&t, want), "{want:?} not in {t:?}");
        }
        assert_eq!(polylines(&svg, 50), 3, "{svg}");
    }

    #[test]
    fn an_empty_plot_is_still_a_document_but_has_no_lines() {
        let svg = latency_cdf("nothing", &[Line::new("none", Vec::new())]).unwrap();
        assert!(has(&texts(&svg), "nothing"));
        assert_eq!(polylines(&svg, 4), 0);
    }

    #[test]
    fn points_are_bounded_and_end_where_the_data_ends() {
        let many: Vec<Duration> = (1..=10_000).map(Duration::from_micros).collect();
        let c = cdf(&many);
        assert!(c.len() <= MAX_POINTS + 1, "{}", c.len());
        assert_eq!(c.last(), Some(&(10.0, 1.0)));
        assert!((c[0].0 - 0.001).abs() < 1e-9);
        let times: Vec<f64> = (0..5000).map(f64::from).rev().collect();
        let steps = cumulative(&times);
        assert!(steps.len() <= MAX_POINTS + 2, "{}", steps.len());
        assert_eq!(steps.first(), Some(&(0.0, 0.0)));
        assert_eq!(steps.last(), Some(&(4999.0, 5000.0)));
        assert!(
            steps
                .windows(2)
                .all(|w| w[0].0 <= w[1].0 && w[0].1 <= w[1].1)
        );
        assert_eq!(count_at(&[1.0, 2.0, 2.0, 3.0], 2.0), 3.0);
        assert_eq!(
            (tick(&2.0), tick(&2.5), tick(&0.1)),
            ("2".into(), "2.5".into(), "0.1".into())
        );
        assert_eq!(
            cdf_of_buckets(&[(0.5, 1.0), (f64::INFINITY, 2.0)], 2.0),
            vec![(500.0, 0.5)]
        );
        let trimmed = cdf_of_buckets(
            &[
                (0.001, 0.0),
                (0.002, 0.0),
                (0.004, 1.0),
                (0.008, 4.0),
                (0.016, 4.0),
            ],
            4.0,
        );
        assert_eq!(trimmed, vec![(2.0, 0.0), (4.0, 0.25), (8.0, 1.0)]);
    }

    #[test]
    fn a_plot_is_written_where_asked_its_folder_made() {
        let dir = std::env::temp_dir().join(format!("tensile-plot-{}", std::process::id()));
        let path = dir.join("sub").join("p.svg");
        let svg = latency_cdf(
            "written",
            &[Line::new("l", cdf(&[Duration::from_millis(3)]))],
        )
        .unwrap();
        write(&path, &svg).unwrap();
        let back = std::fs::read_to_string(&path).unwrap();
        assert!(has(&texts(&back), "written"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
