//! Inline SVG charts for the HTML report, drawn with plotters' SVG backend (no fonts are
//! loaded: text becomes SVG `<text>` elements the browser lays out, so the report stays
//! self-contained).
//!
//! Four charts: corruption rate per arm or cell with its Wilson 95% whiskers, the
//! concurrency timeline of one arm block (engine running requests per role and client
//! in-flight over time, from metrics.csv), the round at which corruption first appears
//! (sessions per first bad round, grouped by arm), and the corruption rate against
//! request index per arm (core::trend's bins; each point's uptime and counts in its SVG
//! `<title>` tooltip, which needs no script). Every function is pure: data in, SVG text
//! out.

use std::collections::BTreeMap;

use plotters::coord::ranged1d::{AsRangedCoord, SegmentValue};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::core::format;

/// One bar of the rate chart.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RateBar {
    pub label: String,
    pub corrupted: u64,
    pub sessions: u64,
    pub rate: f64,
    /// Wilson 95% interval.
    pub ci95: [f64; 2],
}

/// One series of a timeline: a name (`decode running`, `client in-flight`) and its points.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// Sessions per first bad round (index 0 = round 1) of one arm or cell.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RoundCounts {
    pub label: String,
    pub(crate) per_round: Vec<u64>,
}

const WIDTH: u32 = 760;
pub(crate) const FONT: &str = "sans-serif";
/// Width of a label character at the axis font size, for sizing the label area.
const CHAR_PX: u32 = 8;

pub(crate) fn draw_err<E: std::fmt::Display>(e: E) -> anyhow::Error {
    anyhow::anyhow!("drawing an SVG chart: {e}")
}

fn colour(i: usize) -> RGBColor {
    // Colour-blind-safe (Okabe-Ito), distinguishable on white and in grey print.
    const PALETTE: [RGBColor; 7] = [
        RGBColor(213, 94, 0),
        RGBColor(0, 114, 178),
        RGBColor(0, 158, 115),
        RGBColor(204, 121, 167),
        RGBColor(230, 159, 0),
        RGBColor(86, 180, 233),
        RGBColor(90, 90, 90),
    ];
    PALETTE[i % PALETTE.len()]
}

/// A chart drawn on the shared frame (white, `WIDTH` wide, caption, label areas) over
/// the `x` and `y` ranges; `draw` adds the mesh and series, then the series legend is
/// drawn if `legend`. Returns the SVG text.
fn framed<X: AsRangedCoord, Y: AsRangedCoord>(
    title: &str,
    height: u32,
    y_label_px: u32,
    (x, y): (X, Y),
    legend: bool,
    draw: impl FnOnce(
        &mut ChartContext<'_, SVGBackend<'_>, Cartesian2d<X::CoordDescType, Y::CoordDescType>>,
    ) -> anyhow::Result<()>,
) -> anyhow::Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, height)).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, (FONT, 19))
            .margin(12)
            .x_label_area_size(34)
            .y_label_area_size(y_label_px)
            .build_cartesian_2d(x, y)
            .map_err(draw_err)?;
        draw(&mut chart)?;
        if legend {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::UpperRight)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .label_font((FONT, 14))
                .draw()
                .map_err(draw_err)?;
        }
        root.present().map_err(draw_err)?;
    }
    Ok(svg)
}

/// Horizontal bars, one per arm or cell (first on top), with Wilson whiskers and the
/// `k/n` count printed beside each bar.
pub(crate) fn rate_bars(title: &str, bars: &[RateBar]) -> anyhow::Result<String> {
    let n = bars.len().max(1);
    let row_px = 34u32;
    let height = 90 + row_px * n as u32;
    let longest = bars
        .iter()
        .map(|b| b.label.chars().count())
        .max()
        .unwrap_or(4) as u32;
    let label_px = (longest * CHAR_PX + 16).clamp(60, 360);
    let x_max = bars
        .iter()
        .map(|b| b.ci95[1].max(b.rate))
        .fold(0.05_f64, f64::max)
        .min(1.0);
    // Room to the right of the longest whisker for the count text.
    let x_end = (x_max * 1.25).min(1.3);
    framed(
        title,
        height,
        label_px,
        (0.0..x_end, (0..n - 1).into_segmented()),
        false,
        |chart| {
            // `a..b` segments into b-a+1 rows; row i is drawn at n-1-i so the first bar sits
            // on top, in reading order.
            let row = |i: usize| n - 1 - i;
            let labels: Vec<String> = bars.iter().map(|b| b.label.clone()).collect();
            chart
                .configure_mesh()
                .disable_y_mesh()
                .y_labels(n)
                .y_label_formatter(&|v| match v {
                    SegmentValue::CenterOf(r) if *r < n => {
                        labels.get(n - 1 - *r).cloned().unwrap_or_default()
                    }
                    _ => String::new(),
                })
                .x_desc("corrupted sessions (Wilson 95% interval)")
                .x_label_formatter(&|x| format!("{:.0}%", x * 100.0))
                .label_style((FONT, 15))
                .draw()
                .map_err(draw_err)?;
            chart
                .draw_series(bars.iter().enumerate().map(|(i, b)| {
                    let mut bar = Rectangle::new(
                        [
                            (0.0, SegmentValue::Exact(row(i))),
                            (b.rate, SegmentValue::Exact(row(i) + 1)),
                        ],
                        colour(i).mix(0.75).filled(),
                    );
                    bar.set_margin(7, 7, 0, 0);
                    bar
                }))
                .map_err(draw_err)?;
            chart
                .draw_series(bars.iter().enumerate().map(|(i, b)| {
                    ErrorBar::new_horizontal(
                        SegmentValue::CenterOf(row(i)),
                        b.ci95[0],
                        b.rate,
                        b.ci95[1],
                        BLACK.stroke_width(2),
                        12,
                    )
                }))
                .map_err(draw_err)?;
            chart
                .draw_series(bars.iter().enumerate().map(|(i, b)| {
                    Text::new(
                        format!(
                            "{}/{} = {}",
                            b.corrupted,
                            b.sessions,
                            format::percent(b.rate)
                        ),
                        (
                            b.ci95[1].max(b.rate) + x_end * 0.015,
                            SegmentValue::CenterOf(row(i)),
                        ),
                        TextStyle::from((FONT, 14).into_font())
                            .color(&BLACK)
                            .pos(Pos::new(HPos::Left, VPos::Center)),
                    )
                }))
                .map_err(draw_err)?;
            Ok(())
        },
    )
}

/// One arm block's concurrency over time: a line per series, legend in the corner.
pub fn timeline(title: &str, series: &[Series]) -> anyhow::Result<String> {
    let t_max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .fold(0.0_f64, f64::max)
        .max(1e-3);
    let y_max = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.1))
        .fold(0.0_f64, f64::max)
        .max(1.0)
        * 1.15;
    framed(
        title,
        300,
        44,
        (0.0..t_max, 0.0..y_max),
        !series.is_empty(),
        |chart| {
            chart
                .configure_mesh()
                .x_desc("seconds since the block started")
                .y_desc("requests")
                .x_label_formatter(&|x| format!("{x:.2}"))
                .y_label_formatter(&|y| format!("{y:.0}"))
                .label_style((FONT, 14))
                .draw()
                .map_err(draw_err)?;
            for (i, s) in series.iter().enumerate() {
                let style = colour(i).stroke_width(2);
                chart
                    .draw_series(LineSeries::new(s.points.iter().copied(), style))
                    .map_err(draw_err)?
                    .label(s.name.clone())
                    .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], style));
            }
            Ok(())
        },
    )
}

/// Sessions per first bad round, bars grouped by round, one colour per arm or cell.
pub(crate) fn first_bad_rounds(title: &str, groups: &[RoundCounts]) -> anyhow::Result<String> {
    let rounds = groups
        .iter()
        .map(|g| g.per_round.len())
        .max()
        .unwrap_or(0)
        .max(1);
    let y_max = groups
        .iter()
        .flat_map(|g| g.per_round.iter().copied())
        .max()
        .unwrap_or(0)
        .max(1) as f64
        * 1.15;
    let m = groups.len().max(1) as f64;
    framed(
        title,
        300,
        44,
        (0.5..rounds as f64 + 0.5, 0.0..y_max),
        !groups.is_empty(),
        |chart| {
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_labels(rounds)
                .x_desc("round of the first non-ok reply")
                .y_desc("sessions")
                .x_label_formatter(&|x| {
                    if (x - x.round()).abs() < 1e-6 {
                        format!("{}", x.round() as i64)
                    } else {
                        String::new()
                    }
                })
                .y_label_formatter(&|y| format!("{y:.0}"))
                .label_style((FONT, 14))
                .draw()
                .map_err(draw_err)?;
            for (j, g) in groups.iter().enumerate() {
                let fill = colour(j).mix(0.8).filled();
                let legend_fill = fill;
                chart
                    .draw_series(g.per_round.iter().enumerate().map(|(r, count)| {
                        let left = (r + 1) as f64 - 0.4 + 0.8 * j as f64 / m;
                        Rectangle::new([(left, 0.0), (left + 0.8 / m, *count as f64)], fill)
                    }))
                    .map_err(draw_err)?
                    .label(g.label.clone())
                    .legend(move |(x, y)| {
                        Rectangle::new([(x, y - 5), (x + 12, y + 5)], legend_fill)
                    });
            }
            Ok(())
        },
    )
}

/// One arm's corruption rate against request index: its label and core::trend's bins.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TrendSeries {
    pub label: String,
    pub bins: Vec<crate::core::trend::TrendBin>,
}

/// The corruption rate per bin against the bin's mean request index, a line with Wilson
/// 95% whiskers per arm; hovering a point shows its bin, requests, mean uptime and counts
/// (an SVG `<title>` on a transparent circle over it).
pub(crate) fn trend(title: &str, series: &[TrendSeries]) -> anyhow::Result<String> {
    let filled = |s: &TrendSeries| -> Vec<(usize, crate::core::trend::TrendBin)> {
        s.bins
            .iter()
            .cloned()
            .enumerate()
            .filter(|(_, b)| b.sessions > 0)
            .collect()
    };
    let wilson = |b: &crate::core::trend::TrendBin| {
        crate::core::stats::wilson(b.corrupted, b.sessions, 0.95)
    };
    let rate = |b: &crate::core::trend::TrendBin| crate::core::stats::rate(b.corrupted, b.sessions);
    let x_max = series
        .iter()
        .flat_map(|s| s.bins.iter().map(|b| b.request_seq.max(b.last_seq as f64)))
        .fold(1.0_f64, f64::max)
        * 1.05;
    let y_max = series
        .iter()
        .flat_map(|s| {
            s.bins
                .iter()
                .filter(|b| b.sessions > 0)
                .map(|b| wilson(b).1)
        })
        .fold(0.1_f64, f64::max)
        .min(1.0)
        * 1.08;
    let mut hits: Vec<(i32, i32, String)> = Vec::new();
    let svg =
        framed(
            title,
            320,
            54,
            (0.0..x_max, 0.0..y_max),
            !series.is_empty(),
            |chart| {
                chart
                    .configure_mesh()
                    .x_desc("request index: requests the engine life had been sent (bin mean)")
                    .y_desc("corrupted sessions")
                    .x_label_formatter(&|x| format!("{x:.0}"))
                    .y_label_formatter(&|y| format!("{:.0}%", y * 100.0))
                    .label_style((FONT, 14))
                    .draw()
                    .map_err(draw_err)?;
                for (i, s) in series.iter().enumerate() {
                    let points = filled(s);
                    let style = colour(i).stroke_width(2);
                    chart
                        .draw_series(LineSeries::new(
                            points.iter().map(|(_, b)| (b.request_seq, rate(b))),
                            style,
                        ))
                        .map_err(draw_err)?
                        .label(s.label.clone())
                        .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], style));
                    chart
                        .draw_series(points.iter().map(|(_, b)| {
                            let (lo, hi) = wilson(b);
                            ErrorBar::new_vertical(
                                b.request_seq,
                                lo,
                                rate(b),
                                hi,
                                colour(i).stroke_width(1),
                                8,
                            )
                        }))
                        .map_err(draw_err)?;
                    chart
                        .draw_series(points.iter().map(|(_, b)| {
                            Circle::new((b.request_seq, rate(b)), 4, colour(i).filled())
                        }))
                        .map_err(draw_err)?;
                    for (j, b) in &points {
                        let (x, y) = chart.backend_coord(&(b.request_seq, rate(b)));
                        let (lo, hi) = wilson(b);
                        hits.push((
                            x,
                            y,
                            format!(
                                "{}: bin {} of {}, requests {}-{} (mean {:.1}), uptime {:.1} s: \
                             {}/{} = {} (Wilson 95%)",
                                s.label,
                                j + 1,
                                s.bins.len(),
                                b.first_seq,
                                b.last_seq,
                                b.request_seq,
                                b.uptime_s,
                                b.corrupted,
                                b.sessions,
                                format::percent_interval(rate(b), [lo, hi])
                            ),
                        ));
                    }
                }
                Ok(())
            },
        )?;
    let tooltips: String = hits
        .iter()
        .map(|(x, y, text)| {
            format!(
                "<circle cx=\"{x}\" cy=\"{y}\" r=\"8\" fill=\"#000\" fill-opacity=\"0\"><title>{}</title></circle>\n",
                super::markup::escape(text)
            )
        })
        .collect();
    Ok(match svg.rfind("</svg>") {
        Some(end) => format!("{}{tooltips}{}", &svg[..end], &svg[end..]),
        None => svg,
    })
}

/// Timeline series of one arm block from metrics.csv rows: engine running requests per
/// role (rows with a value) and the client's in-flight count (rows of role `client`).
pub(crate) fn block_series(rows: &[MetricsPoint]) -> Vec<Series> {
    let mut by_role: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut client: Vec<(f64, f64)> = Vec::new();
    for r in rows {
        if r.role == crate::driver::metrics::CLIENT_ROLE {
            client.push((r.t_s, r.client_inflight));
        } else if let Some(running) = r.running {
            by_role
                .entry(format!("{} running", r.role))
                .or_default()
                .push((r.t_s, running));
        }
    }
    let mut out: Vec<Series> = by_role
        .into_iter()
        .map(|(name, points)| Series { name, points })
        .collect();
    if !client.is_empty() {
        out.push(Series {
            name: "client in-flight".into(),
            points: client,
        });
    }
    for s in &mut out {
        s.points.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    out
}

/// One metrics.csv row, as much of it as the timeline needs.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
pub(crate) struct MetricsPoint {
    pub t_s: f64,
    pub role: String,
    #[serde(default)]
    pub running: Option<f64>,
    #[serde(default)]
    pub(crate) client_inflight: f64,
    /// Arm block, e.g. `on-r0`.
    #[serde(default)]
    pub label: String,
}

/// Reads metrics.csv into blocks (label -> rows), in the order blocks first appear.
/// Unreadable rows are skipped: a report must render from a half-written file.
pub(crate) fn read_metrics(path: &std::path::Path) -> Vec<(String, Vec<MetricsPoint>)> {
    let Ok(mut reader) = csv::Reader::from_path(path) else {
        return Vec::new();
    };
    let mut blocks: Vec<(String, Vec<MetricsPoint>)> = Vec::new();
    for row in reader.deserialize::<MetricsPoint>().flatten() {
        match blocks.iter_mut().find(|(l, _)| *l == row.label) {
            Some((_, rows)) => rows.push(row),
            None => blocks.push((row.label.clone(), vec![row])),
        }
    }
    blocks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bar(label: &str, k: u64, n: u64) -> RateBar {
        let (lo, hi) = crate::core::stats::wilson(k, n, 0.95);
        RateBar {
            label: label.into(),
            corrupted: k,
            sessions: n,
            rate: k as f64 / n as f64,
            ci95: [lo, hi],
        }
    }

    #[test]
    fn rate_bars_draw_one_bar_and_whisker_per_arm_with_labels() {
        let svg = rate_bars("rate", &[bar("on (X=1)", 14, 80), bar("off (X=0)", 0, 80)]).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80]);
        assert!(svg.contains("on (X=1)") && svg.contains("off (X=0)"));
        assert!(svg.contains("14/80 = 17.5%") && svg.contains("0/80 = 0.0%"));
        // Background and two bars; the whiskers are lines.
        assert_eq!(svg.matches("<rect").count(), 3, "{svg}");
        assert!(svg.contains("<line") || svg.contains("<polyline"));
    }

    #[test]
    fn timeline_has_a_line_and_legend_entry_per_series() {
        let series = block_series(&[
            MetricsPoint {
                t_s: 0.0,
                role: "client".into(),
                running: None,
                client_inflight: 0.0,
                label: "on-r0".into(),
            },
            MetricsPoint {
                t_s: 0.0,
                role: "decode".into(),
                running: Some(3.0),
                client_inflight: 0.0,
                label: "on-r0".into(),
            },
            MetricsPoint {
                t_s: 0.5,
                role: "client".into(),
                running: None,
                client_inflight: 8.0,
                label: "on-r0".into(),
            },
            MetricsPoint {
                t_s: 0.5,
                role: "decode".into(),
                running: Some(7.0),
                client_inflight: 8.0,
                label: "on-r0".into(),
            },
            MetricsPoint {
                t_s: 0.7,
                role: "prefill".into(),
                running: None,
                client_inflight: 8.0,
                label: "on-r0".into(),
            },
        ]);
        let names: Vec<&str> = series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["decode running", "client in-flight"]);
        assert_eq!(series[1].points, vec![(0.0, 0.0), (0.5, 8.0)]);
        let svg = timeline("on-r0", &series).unwrap();
        let thick = svg
            .lines()
            .filter(|l| l.starts_with("<polyline") && l.contains("stroke-width=\"2\""))
            .count();
        assert_eq!(thick, 4, "two lines + two legend marks: {svg}");
        assert!(svg.contains("decode running") && svg.contains("client in-flight"));
    }

    #[test]
    fn first_bad_round_histogram_has_a_bar_per_round_and_arm() {
        let svg = first_bad_rounds(
            "first bad round",
            &[
                RoundCounts {
                    label: "on".into(),
                    per_round: vec![0, 9, 3],
                },
                RoundCounts {
                    label: "off".into(),
                    per_round: vec![1],
                },
            ],
        )
        .unwrap();
        // background, plot area, 3 + 1 bars, 2 legend swatches (+ legend box).
        assert!(svg.matches("<rect").count() >= 8, "{svg}");
        assert!(svg.contains("\non\n") && svg.contains("\noff\n"), "{svg}");
    }

    #[test]
    fn trend_draws_a_line_per_arm_and_a_tooltip_per_filled_bin() {
        use crate::core::trend::TrendBin;
        let bin = |i: u64, k: u64| TrendBin {
            sessions: 10,
            corrupted: k,
            request_seq: 10.0 * i as f64 + 4.5,
            first_seq: 10 * i,
            last_seq: 10 * i + 9,
            uptime_s: 0.5 * i as f64,
        };
        let mut off: Vec<TrendBin> = (0..4).map(|i| bin(i, 0)).collect();
        off[2].sessions = 0;
        let svg = trend(
            "corruption against request index",
            &[
                TrendSeries {
                    label: "on (X=1)".into(),
                    bins: (0..8).map(|i| bin(i, i)).collect(),
                },
                TrendSeries {
                    label: "off (X=0)".into(),
                    bins: off,
                },
            ],
        )
        .unwrap();
        assert!(svg.trim_end().ends_with("</svg>"), "{svg}");
        assert_eq!(svg.matches("<title>").count(), 8 + 3, "{svg}");
        assert!(
            svg.contains(
                "<title>on (X=1): bin 8 of 8, requests 70-79 (mean 74.5), uptime 3.5 s: \
                 7/10 = 70.0% [39.7%, 89.2%] (Wilson 95%)</title>"
            ),
            "{svg}"
        );
        assert!(svg.contains("on (X=1)") && svg.contains("off (X=0)"));
        let thick = svg
            .lines()
            .filter(|l| l.starts_with("<polyline") && l.contains("stroke-width=\"2\""))
            .count();
        assert_eq!(thick, 4, "two lines + two legend marks: {svg}");
    }

    #[test]
    fn metrics_csv_is_split_into_blocks_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.csv");
        std::fs::write(
            &path,
            "t_s,role,running,queued,client_inflight,label,error\n\
             0.0,client,,,0,on-r0,\n0.1,decode,4,0,3,on-r0,\n0.1,prefill,,,3,on-r0,timeout\n\
             not,a,row\n0.0,client,,,1,off-r0,\n",
        )
        .unwrap();
        let blocks = read_metrics(&path);
        let labels: Vec<&str> = blocks.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(labels, ["on-r0", "off-r0"]);
        assert_eq!(blocks[0].1.len(), 3);
        assert_eq!(blocks[0].1[1].running, Some(4.0));
        assert!(read_metrics(&dir.path().join("missing.csv")).is_empty());
    }
}
