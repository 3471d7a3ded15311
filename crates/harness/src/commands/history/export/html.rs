//! `history.html`: the dashboard of a history, one self-contained page rendered from the
//! typed [`HistoryRecord`] (inline CSS and SVG, no scripts, nothing fetched): the plan,
//! the nights and the rule; the states grid, a square per cell and night coloured by its
//! state (hover for the state, rate, evidence and reasons; each column's night links to
//! its report.html); per rate cell its corruption rate night by night with Wilson
//! whiskers, missing nights as gaps and each regression's first bad night marked; the
//! load cells' thresholds night by night; the regressions with their nights, builds,
//! evidence, the search between the builds and its answer; the records skipped. The
//! frame and the escaping are the other pages' ([`crate::results::markup`]), the charts
//! drawn like theirs ([`crate::results::charts`]: plotters' SVG, tooltips as `<title>`s).

use std::fmt::Write as _;

use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::markdown::{
    answer_name, ended_words, evidence_words, landed_detail, measure_words, night_label,
    nights_words, rates_words, rule_words, short_build, OutcomeWords,
};
use crate::commands::history::record::{
    CellHistory, CellKind, CellPoint, HistoryRecord, NightRef, NightStatus, RegressionEntry,
    SearchPlan,
};
use crate::commands::history::Outcome;
use crate::core::adaptive::e_value_text;
use crate::core::history::State;
use crate::results::charts::{draw_err, FONT};
use crate::results::markup::{escape, facts_list, figure, list, page, verdict_box};
use crate::results::Exporter;

pub struct HistoryHtml;

impl Exporter<HistoryRecord> for HistoryHtml {
    fn file_name(&self) -> &'static str {
        "history.html"
    }

    fn render(&self, record: &HistoryRecord) -> anyhow::Result<String> {
        Ok(render_history_html(record))
    }
}

/// The dashboard's own rules, added to the shared page style: the compact grid, the
/// state colours of the load table and the builds under the night labels.
const STYLE: &str = r#"
.scroll { overflow-x: auto; }
table.states th, table.states td { padding: 1px 3px; text-align: center; vertical-align: middle; }
table.states th.cell, table.states td.cell { text-align: left; white-space: nowrap; }
table.states th.night { font-weight: normal; font-size: 12px; white-space: nowrap; }
table.states svg { display: block; margin: auto; }
.build { display: block; color: #555; font-size: 11px; font-family: ui-monospace, "DejaVu Sans Mono", Menlo, monospace; }
td.st-regression { background: #ffe3e3; } td.st-suspicious { background: #fff5d6; } td.st-ok { background: #effaf1; }
td.st-insufficient { background: #e6ebf2; } td.st-missing { color: #777; background: repeating-linear-gradient(45deg, #f6f6f6 0 4px, #e8e8e8 4px 8px); }
.legend span { margin-right: 14px; white-space: nowrap; } .legend svg { vertical-align: middle; }
table.regressions td.nw { white-space: nowrap; } table.regressions td.search { min-width: 320px; }
"#;

/// Charts: the other pages' font (`crate::results::charts`), narrower: two side by side
/// in the page's grid at about their own size.
const CHART_WIDTH: u32 = 560;
const CHART_HEIGHT: u32 = 240;
/// Night labels written under a chart's axis at most (every k-th night beyond).
const CHART_X_LABELS: usize = 8;

/// The page of one history.
pub(crate) fn render_history_html(r: &HistoryRecord) -> String {
    let mut body = String::new();
    let _ = writeln!(
        body,
        "<h1>bisect history <code>{}</code></h1>\n<p class=\"meta\">{} &middot; {} &middot; generated {}</p>",
        escape(&r.plan),
        escape(&nights_words(&r.nights)),
        escape(&rule_words(r)),
        escape(&r.generated_at)
    );
    body.push_str(&facts_list(&facts(r)));
    body.push_str(&outcome_box(r));
    body.push_str(&states_section(r));
    body.push_str(&rates_section(r));
    body.push_str(&loads_section(r));
    body.push_str(&regressions_section(r));
    if !r.skipped.is_empty() {
        body.push_str("<h2>Skipped records</h2>\n");
        body.push_str(&list(&r.skipped));
        body.push('\n');
    }
    // The shared frame, with the dashboard's rules in its one <style> (valid HTML5 has
    // no <style> in the body).
    page(&format!("bisect history {}", r.plan), &body).replacen(
        "</style>",
        &format!("{STYLE}</style>"),
        1,
    )
}

fn facts(r: &HistoryRecord) -> Vec<String> {
    let count = |s: NightStatus| r.nights.iter().filter(|n| n.status == s).count();
    let mut facts = vec![
        format!(
            "{} finished, {} unfinished, {} absent night(s); {} cell(s), {} of them rate cells (the e-BH family)",
            count(NightStatus::Finished),
            count(NightStatus::Unfinished),
            count(NightStatus::Absent),
            r.cells.len(),
            r.family
        ),
        format!("command <code>{}</code>", escape(&r.command)),
    ];
    let reruns: usize = r.nights.iter().map(|n| n.replaced.len()).sum();
    if reruns > 0 {
        facts.push(format!(
            "{reruns} earlier record(s) replaced by a rerun of the same night"
        ));
    }
    facts
}

/// The newest nights' outcome: open regressions (red), cells not shown ok (amber), else
/// green.
fn outcome_box(r: &HistoryRecord) -> String {
    let outcome = Outcome::of(r);
    let class = if !outcome.regressed.is_empty() {
        "implicated"
    } else if outcome.unshown > 0 {
        "inconclusive"
    } else {
        "cleared"
    };
    let open: Vec<String> = r
        .regressions
        .iter()
        .filter(|g| g.event.is_open())
        .map(|g| {
            format!(
                "{}: first bad {}, flagged {}; {}; {}",
                g.cell,
                night_ref_text(&g.first_bad),
                g.flagged.label,
                evidence_words(&g.event),
                rates_words(&g.event)
            )
        })
        .collect();
    verdict_box(class, &outcome.words(str::to_string), &list(&open))
}

/// A state's colour: regression red, suspicious amber, ok green, insufficient grey-blue,
/// missing light grey (the verdict boxes' red, amber and green).
fn state_rgb(state: State) -> (u8, u8, u8) {
    match state {
        State::Regression => (209, 36, 47),
        State::Suspicious => (221, 155, 0),
        State::Ok => (26, 127, 55),
        State::Insufficient => (112, 134, 166),
        State::Missing => (214, 214, 214),
    }
}

fn state_hex(state: State) -> String {
    let (r, g, b) = state_rgb(state);
    format!("#{r:02x}{g:02x}{b:02x}")
}

/// A square of the grid: the state's colour (missing: pale, dashed and hatched), the
/// tooltip its `<title>`.
fn square(state: State, tooltip: &str) -> String {
    let shape = match state {
        State::Missing => "<rect x=\"1.5\" y=\"1.5\" width=\"13\" height=\"13\" rx=\"2\" fill=\"#f2f2f2\" stroke=\"#9a9a9a\" stroke-dasharray=\"2 2\"/><path d=\"M3 13L13 3M3 8L8 3M8 13L13 8\" stroke=\"#bdbdbd\"/>".to_string(),
        s => format!(
            "<rect x=\"1.5\" y=\"1.5\" width=\"13\" height=\"13\" rx=\"2\" fill=\"{}\"/>",
            state_hex(s)
        ),
    };
    format!(
        "<svg width=\"16\" height=\"16\" viewBox=\"0 0 16 16\" role=\"img\"><title>{}</title>{shape}</svg>",
        escape(tooltip)
    )
}

/// A night's point in words, for its tooltip.
fn point_tooltip(r: &HistoryRecord, c: &CellHistory, night: usize, p: &CellPoint) -> String {
    let mut parts = vec![
        format!("{}, {}: {}", c.id, night_label(r, night), p.state().name()),
        measure_words(c, p),
    ];
    if let Some(e) = p.assessment.e_rise {
        parts.push(format!("evidence of a rise e = {}", e_value_text(e)));
    }
    if let Some(e) = p.assessment.e_drop {
        parts.push(format!("evidence of a drop e = {}", e_value_text(e)));
    }
    parts.extend(p.assessment.reasons.iter().cloned());
    if let Some(reset) = &p.assessment.reset {
        parts.push(format!("reset: {reset}"));
    }
    parts.join("\n")
}

/// A relative link to `{dir}/report.html`, percent-encoded where a path character would
/// break the URL (a space, `#`, `?`, `%`), then escaped for the attribute.
fn report_href(dir: &str) -> String {
    let mut url = String::with_capacity(dir.len() + 12);
    for ch in dir.chars() {
        match ch {
            ' ' | '"' | '#' | '%' | '<' | '>' | '?' | '[' | '\\' | ']' | '^' | '`' | '{' | '|'
            | '}' => {
                let _ = write!(url, "%{:02X}", ch as u32);
            }
            c if c.is_ascii_control() => {
                let _ = write!(url, "%{:02X}", c as u32);
            }
            c => url.push(c),
        }
    }
    url.push_str("/report.html");
    escape(&url)
}

/// A build under a label: a sha cut short (the whole in its title).
fn build_span(build: Option<&str>) -> String {
    match build {
        Some(b) if short_build(b) != b => format!(
            "<span class=\"build\" title=\"{}\">{}</span>",
            escape(b),
            escape(short_build(b))
        ),
        Some(b) => format!("<span class=\"build\">{}</span>", escape(b)),
        None => "<span class=\"build\">-</span>".to_string(),
    }
}

/// The header row of the grid and the load table: a column per night, its label linking
/// to its report, its build (or absent) under it.
fn nights_header(r: &HistoryRecord) -> String {
    let mut s = String::from("<tr><th class=\"cell\">cell</th>");
    for n in &r.nights {
        let label = match &n.dir {
            Some(dir) => format!("<a href=\"{}\">{}</a>", report_href(dir), escape(&n.label)),
            None => escape(&n.label),
        };
        let under = match n.status {
            NightStatus::Absent => "<span class=\"build\">absent</span>".to_string(),
            NightStatus::Unfinished => format!(
                "{}<span class=\"build\">unfinished</span>",
                build_span(n.build_words())
            ),
            NightStatus::Finished => build_span(n.build_words()),
        };
        let _ = write!(s, "<th class=\"night\">{label}{under}</th>");
    }
    s.push_str("</tr>\n");
    s
}

/// Rows = cells, columns = nights, a square per night.
fn states_section(r: &HistoryRecord) -> String {
    let mut s = String::from("<h2>States</h2>\n<p class=\"legend\">");
    for state in [
        State::Regression,
        State::Suspicious,
        State::Ok,
        State::Insufficient,
        State::Missing,
    ] {
        let _ = write!(
            s,
            "<span>{} {}</span>",
            square(state, state.name()),
            state.name()
        );
    }
    s.push_str("</p>\n<div class=\"scroll\"><table class=\"states\">\n");
    s.push_str(&nights_header(r));
    for c in &r.cells {
        let kind = match c.kind {
            CellKind::Rate => "",
            CellKind::Load => " <span class=\"meta\">(load)</span>",
        };
        let _ = write!(
            s,
            "<tr><td class=\"cell\"><code>{}</code>{kind}</td>",
            escape(&c.id)
        );
        for (night, p) in c.series.iter().enumerate() {
            let sq = square(p.state(), &point_tooltip(r, c, night, p));
            match &p.dir {
                Some(dir) => {
                    let _ = write!(s, "<td><a href=\"{}\">{sq}</a></td>", report_href(dir));
                }
                None => {
                    let _ = write!(s, "<td>{sq}</td>");
                }
            }
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</table></div>\n");
    s
}

/// A trend chart per rate cell.
fn rates_section(r: &HistoryRecord) -> String {
    let rate_cells = r.cells_of(CellKind::Rate);
    if rate_cells.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "<h2>Corruption rate per night</h2>\n<p class=\"meta\">Wilson 95% whiskers, points coloured by state; a cross on the axis: nothing measured; a red line: a regression's first bad night. Hover a night for its state and reasons.</p>\n<div class=\"grid\">\n",
    );
    for c in rate_cells {
        s.push_str(&figure(rate_chart(r, c)));
    }
    s.push_str("</div>\n");
    s
}

fn rgb(state: State) -> RGBColor {
    let (r, g, b) = state_rgb(state);
    RGBColor(r, g, b)
}

/// One rate cell night by night: a point per measured night (its state's colour) with its
/// whiskers, a line through consecutive measured nights, a cross on the axis where
/// nothing was measured, a red line at each regression's first bad night; each night's
/// tooltip a transparent circle with a `<title>` over it.
fn rate_chart(r: &HistoryRecord, cell: &CellHistory) -> anyhow::Result<String> {
    let n = cell.series.len().max(1);
    let labels: Vec<String> = (0..n).map(|i| night_label(r, i)).collect();
    let y_max = (cell
        .series
        .iter()
        .filter_map(|p| p.ci95.map(|ci| ci[1]).or(p.rate))
        .fold(0.05_f64, f64::max)
        * 1.2)
        .min(1.0);
    let measured: Vec<(usize, &CellPoint, f64)> = cell
        .series
        .iter()
        .enumerate()
        .filter_map(|(i, p)| p.rate.map(|rate| (i, p, rate)))
        .collect();
    let first_bad: Vec<(usize, String)> = r
        .regressions
        .iter()
        .filter(|g| g.cell == cell.id)
        .map(|g| {
            (
                g.event.first_bad_night,
                format!("first bad {}", g.first_bad.label),
            )
        })
        .collect();
    let every = n.div_ceil(CHART_X_LABELS).max(1);
    let mut hits: Vec<(i32, i32, String)> = Vec::new();
    let mut svg = String::new();
    {
        let root =
            SVGBackend::with_string(&mut svg, (CHART_WIDTH, CHART_HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(&cell.id, (FONT, 18))
            .margin(10)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(-0.5..n as f64 - 0.5, 0.0..y_max)
            .map_err(draw_err)?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n.min(CHART_X_LABELS * 2))
            .x_label_formatter(&|x| {
                let i = x.round();
                if (x - i).abs() > 1e-6 || i < 0.0 || i as usize % every != 0 {
                    return String::new();
                }
                labels.get(i as usize).cloned().unwrap_or_default()
            })
            .y_desc("corrupted sessions")
            .y_label_formatter(&|y| format!("{:.0}%", y * 100.0))
            .label_style((FONT, 14))
            .draw()
            .map_err(draw_err)?;
        for (night, label) in &first_bad {
            let x = *night as f64;
            chart
                .draw_series(std::iter::once(DashedPathElement::new(
                    vec![(x, 0.0), (x, y_max)],
                    5,
                    3,
                    rgb(State::Regression).stroke_width(2),
                )))
                .map_err(draw_err)?;
            // Beside the line, on the side with room: right of it in the first half.
            let (side, dx) = if night * 2 < n {
                (HPos::Left, 4)
            } else {
                (HPos::Right, -4)
            };
            chart
                .draw_series(std::iter::once(
                    EmptyElement::at((x, y_max))
                        + Text::new(
                            label.clone(),
                            (dx, 2),
                            TextStyle::from((FONT, 13).into_font())
                                .color(&rgb(State::Regression))
                                .pos(Pos::new(side, VPos::Top)),
                        ),
                ))
                .map_err(draw_err)?;
        }
        // A line through consecutive measured nights: a night without a rate breaks it.
        let mut runs: Vec<Vec<(f64, f64)>> = Vec::new();
        let mut last: Option<usize> = None;
        for &(i, _, rate) in &measured {
            match (last, runs.last_mut()) {
                (Some(l), Some(run)) if l + 1 == i => run.push((i as f64, rate)),
                _ => runs.push(vec![(i as f64, rate)]),
            }
            last = Some(i);
        }
        for run in runs {
            chart
                .draw_series(LineSeries::new(
                    run,
                    RGBColor(150, 150, 150).stroke_width(1),
                ))
                .map_err(draw_err)?;
        }
        chart
            .draw_series(measured.iter().filter_map(|&(i, p, rate)| {
                p.ci95.map(|[lo, hi]| {
                    ErrorBar::new_vertical(
                        i as f64,
                        lo,
                        rate,
                        hi,
                        rgb(p.state()).stroke_width(1),
                        8,
                    )
                })
            }))
            .map_err(draw_err)?;
        chart
            .draw_series(
                measured
                    .iter()
                    .map(|&(i, p, rate)| Circle::new((i as f64, rate), 4, rgb(p.state()).filled())),
            )
            .map_err(draw_err)?;
        chart
            .draw_series(
                cell.series
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| p.rate.is_none())
                    .map(|(i, p)| {
                        let colour = match p.state() {
                            State::Missing => RGBColor(140, 140, 140),
                            s => rgb(s),
                        };
                        Cross::new((i as f64, 0.0), 4, colour.stroke_width(2))
                    }),
            )
            .map_err(draw_err)?;
        for (i, p) in cell.series.iter().enumerate() {
            let (x, y) = chart.backend_coord(&(i as f64, p.rate.unwrap_or(0.0)));
            hits.push((x, y, point_tooltip(r, cell, i, p)));
        }
        root.present().map_err(draw_err)?;
    }
    let tooltips: String = hits
        .iter()
        .map(|(x, y, text)| {
            format!(
                "<circle cx=\"{x}\" cy=\"{y}\" r=\"8\" fill=\"#000\" fill-opacity=\"0\"><title>{}</title></circle>\n",
                escape(text)
            )
        })
        .collect();
    Ok(match svg.rfind("</svg>") {
        Some(end) => format!("{}{tooltips}{}", &svg[..end], &svg[end..]),
        None => svg,
    })
}

/// The load cells: each night's threshold in its state's colour (a threshold is judged
/// against the night before, not charted as a rate).
fn loads_section(r: &HistoryRecord) -> String {
    let loads = r.cells_of(CellKind::Load);
    if loads.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "<h2>Load sweeps: threshold per night</h2>\n<div class=\"scroll\"><table class=\"states\">\n",
    );
    s.push_str(&nights_header(r));
    for c in loads {
        let _ = write!(
            s,
            "<tr><td class=\"cell\"><code>{}</code></td>",
            escape(&c.id)
        );
        for (night, p) in c.series.iter().enumerate() {
            let _ = write!(
                s,
                "<td class=\"st-{}\" title=\"{}\">{}</td>",
                p.state().name(),
                escape(&point_tooltip(r, c, night, p)),
                escape(p.threshold.as_deref().unwrap_or("-"))
            );
        }
        s.push_str("</tr>\n");
    }
    s.push_str("</table></div>\n");
    s
}

/// `LABEL` and its build under it, short (the whole in its title).
fn night_ref_html(n: &NightRef) -> String {
    format!("{}{}", escape(&n.label), build_span(n.build.as_deref()))
}

fn night_ref_text(n: &NightRef) -> String {
    match &n.build {
        Some(b) => format!("{} (build {})", n.label, short_build(b)),
        None => n.label.clone(),
    }
}

fn regressions_section(r: &HistoryRecord) -> String {
    let mut s = String::from("<h2>Regressions</h2>\n");
    if r.regressions.is_empty() {
        s.push_str("<p>None found.</p>\n");
        return s;
    }
    s.push_str("<div class=\"scroll\"><table class=\"regressions\"><tr><th>cell</th><th>flagged</th><th>last good</th><th>first bad</th><th>evidence (e-BH)</th><th>before &rarr; after</th><th>ended</th><th>search between the builds</th></tr>\n");
    for g in &r.regressions {
        let row = if g.event.is_open() {
            " class=\"blocking\""
        } else {
            ""
        };
        let _ = writeln!(
            s,
            "<tr{row}><td><code>{}</code></td><td class=\"nw\">{}</td><td class=\"nw\">{}</td><td class=\"nw\">{}</td><td class=\"nw\">{}</td><td>{}</td><td class=\"nw\">{}</td><td class=\"search\">{}</td></tr>",
            escape(&g.cell),
            escape(&g.flagged.label),
            night_ref_html(&g.last_good),
            night_ref_html(&g.first_bad),
            escape(&evidence_words(&g.event)),
            escape(&rates_words(&g.event)).replace(" -&gt; ", " &rarr; "),
            escape(&ended_words(r, &g.event)),
            search_html(g),
        );
    }
    s.push_str("</table></div>\n");
    s
}

/// The prepared command (or why there is none), and the answer once landed.
fn search_html(g: &RegressionEntry) -> String {
    let mut s = match &g.search {
        SearchPlan::Prepared { command, dir, .. } => format!(
            "<pre><code>{}</code></pre>into <code>{}</code>",
            escape(command),
            escape(dir)
        ),
        SearchPlan::Unavailable { why } => format!("no search: {}", escape(why)),
    };
    if let Some(l) = &g.landed {
        let _ = write!(
            s,
            "<p>answer <b>{}</b>{} (<a href=\"{}\">report</a>)</p>",
            escape(answer_name(l)),
            escape(&landed_detail(l)),
            report_href(&l.dir)
        );
    }
    s
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::commands::answer::SearchAnswer;
    use crate::commands::history::record::{LandedSearch, NightEntry};
    use crate::core::history::{Assessment, HistoryPolicy, RegressionEvent};

    fn night(
        label: &str,
        status: NightStatus,
        dir: Option<&str>,
        build: Option<&str>,
    ) -> NightEntry {
        NightEntry {
            label: label.into(),
            status,
            dir: dir.map(String::from),
            id: dir.map(|d| format!("m-{d}")),
            started_at: None,
            build: build.map(String::from),
            engine_build: None,
            bisect_version: None,
            plan_hash: None,
            replaced: Vec::new(),
        }
    }

    fn assessment(
        state: State,
        e_rise: Option<f64>,
        reasons: &[&str],
        event: Option<usize>,
    ) -> Assessment {
        Assessment {
            state,
            e_rise,
            e_drop: None,
            chain_nights: 1,
            reasons: reasons.iter().map(|s| s.to_string()).collect(),
            reset: None,
            event,
        }
    }

    /// A rate cell's night: `corrupted` of `judged` (`None`: nothing measured).
    fn rate_point(
        night_dir: Option<&str>,
        id: &str,
        counts: Option<(u64, u64)>,
        assessment: Assessment,
    ) -> CellPoint {
        let (corrupted, judged) = counts.unwrap_or((0, 0));
        let measured = counts.is_some_and(|(_, j)| j > 0);
        CellPoint {
            sessions: judged,
            judged,
            corrupted,
            rate: measured.then(|| crate::core::stats::rate(corrupted, judged)),
            ci95: measured.then(|| {
                let (lo, hi) = crate::core::stats::wilson(corrupted, judged, 0.95);
                [lo, hi]
            }),
            threshold: None,
            dir: night_dir
                .filter(|_| counts.is_some())
                .map(|d| format!("{d}/cells/{id}")),
            assessment,
        }
    }

    fn load_point(
        night_dir: Option<&str>,
        threshold: Option<&str>,
        assessment: Assessment,
    ) -> CellPoint {
        CellPoint {
            sessions: if threshold.is_some() { 40 } else { 0 },
            judged: 0,
            corrupted: 0,
            rate: None,
            ci95: None,
            threshold: threshold.map(String::from),
            dir: night_dir
                .filter(|_| threshold.is_some())
                .map(|d| format!("{d}/cells/load:c16")),
            assessment,
        }
    }

    pub(crate) const ABSENT: &str = "no record of this night (the nightly did not run)";
    pub(crate) const SUSPICIOUS: &str =
        "this night alone (4/20 (20.0%)) is above its chain's earlier nights (0/20 (0.0%)): one-sided Fisher p = 0.053 < 0.06";

    /// Four nights (the third absent, the fourth unfinished); a rate cell that regressed
    /// on the second night and is still open, a rate cell ok but suspicious on the second
    /// night, a load cell insufficient on the newest night; one regression with its search
    /// prepared and landed; one skipped record.
    pub(crate) fn sample_record() -> HistoryRecord {
        const SHA_GOOD: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f9012345678";
        const SHA_BAD: &str = "0123456789abcdef0123456789abcdef01234567";
        let dirs = [Some("n1"), Some("n2"), None, Some("n4")];
        let mut n4 = night("2025-01-04", NightStatus::Unfinished, Some("n4"), None);
        n4.engine_build = Some("v2.1".into());
        let nights = vec![
            night(
                "2025-01-01",
                NightStatus::Finished,
                Some("n1"),
                Some(SHA_GOOD),
            ),
            night(
                "2025-01-02",
                NightStatus::Finished,
                Some("n2"),
                Some(SHA_BAD),
            ),
            night("2025-01-03", NightStatus::Absent, None, None),
            n4,
        ];
        let missing = || assessment(State::Missing, None, &[ABSENT], None);
        let regressed_id = "BF16=1,s16";
        let regressed = CellHistory {
            id: regressed_id.into(),
            kind: CellKind::Rate,
            retired: false,
            series: vec![
                rate_point(dirs[0], regressed_id, Some((0, 16)), assessment(State::Ok, None, &[], None)),
                rate_point(
                    dirs[1],
                    regressed_id,
                    Some((8, 16)),
                    assessment(
                        State::Regression,
                        Some(240.0),
                        &["evidence of a rise e = 240 >= 200 (e-BH at alpha 0.01 over 2 cells): 0/16 (0.0%) -> 8/16 (50.0%) from night 2 on"],
                        Some(0),
                    ),
                ),
                rate_point(dirs[2], regressed_id, None, missing()),
                rate_point(
                    dirs[3],
                    regressed_id,
                    Some((9, 16)),
                    assessment(
                        State::Regression,
                        Some(300.0),
                        &["open regression since night 2 (found on night 2)"],
                        Some(0),
                    ),
                ),
            ],
        };
        let ok_id = "BF16=0,s16";
        let ok = CellHistory {
            id: ok_id.into(),
            kind: CellKind::Rate,
            retired: false,
            series: vec![
                rate_point(
                    dirs[0],
                    ok_id,
                    Some((0, 20)),
                    assessment(State::Ok, None, &[], None),
                ),
                rate_point(
                    dirs[1],
                    ok_id,
                    Some((4, 20)),
                    assessment(State::Suspicious, Some(3.5), &[SUSPICIOUS], None),
                ),
                rate_point(dirs[2], ok_id, None, missing()),
                rate_point(
                    dirs[3],
                    ok_id,
                    Some((1, 20)),
                    assessment(State::Ok, Some(0.8), &[], None),
                ),
            ],
        };
        let stands_alone = "no earlier night compared (its threshold stands alone)";
        let load = CellHistory {
            id: "load:c16".into(),
            kind: CellKind::Load,
            retired: false,
            series: vec![
                load_point(
                    dirs[0],
                    Some("12 sessions in flight"),
                    assessment(State::Ok, None, &[stands_alone], None),
                ),
                load_point(
                    dirs[1],
                    Some("12 sessions in flight"),
                    assessment(State::Ok, None, &["threshold unchanged"], None),
                ),
                load_point(dirs[2], None, missing()),
                load_point(
                    dirs[3],
                    Some("8 sessions in flight"),
                    assessment(
                        State::Insufficient,
                        None,
                        &["the sweep stopped short of its top load"],
                        None,
                    ),
                ),
            ],
        };
        let night_ref = |i: usize| NightRef {
            night: i,
            label: nights[i].label.clone(),
            build: nights[i].build_words().map(String::from),
        };
        let search_dir = "bisects/BF16_1_s16@2025-01-01..2025-01-02";
        let regression = RegressionEntry {
            cell: regressed_id.into(),
            event: RegressionEvent {
                cell: 0,
                flagged_night: 1,
                first_bad_night: 1,
                last_good_night: 0,
                e_value: 240.0,
                threshold: 200.0,
                before: (0, 16),
                after: (8, 16),
                ended: None,
            },
            last_good: night_ref(0),
            first_bad: night_ref(1),
            flagged: night_ref(1),
            search: SearchPlan::Prepared {
                command: format!(
                    "bisect commits --good {SHA_GOOD} --bad {SHA_BAD} --set BF16=1 --sessions 16 && echo \"done\""
                ),
                dir: search_dir.into(),
                good: SHA_GOOD.into(),
                bad: SHA_BAD.into(),
            },
            landed: Some(LandedSearch {
                dir: search_dir.into(),
                answer: Some(SearchAnswer::Culprit),
                words: "culprit 0badc0ffee verified: 0/16 -> 7/16".into(),
                culprit: Some("0badc0ffee1234567890abcdef1234567890abcd".into()),
                subject: Some("kv: reuse <blocks> early".into()),
            }),
        };
        HistoryRecord {
            schema: crate::commands::history::record::SCHEMA.into(),
            command: "bisect history nightly/ --auto-bisect".into(),
            generated_at: "2025-01-05T06:00:00.000Z".into(),
            plan: "nightly".into(),
            policy: HistoryPolicy::default(),
            family: 2,
            nights,
            cells: vec![regressed, ok, load],
            regressions: vec![regression],
            skipped: vec!["weekly/matrix.json: plan weekly, not nightly".into()],
        }
    }

    fn render(r: &HistoryRecord) -> String {
        HistoryHtml.render(r).unwrap()
    }

    /// The grid's row of `cell`.
    fn grid_row<'a>(html: &'a str, cell: &str) -> &'a str {
        let start = html
            .find(&format!(
                "<tr><td class=\"cell\"><code>{}</code>",
                escape(cell)
            ))
            .unwrap_or_else(|| panic!("no row for {cell}"));
        let end = start + html[start..].find("</tr>").unwrap();
        &html[start..end]
    }

    /// The states of a grid row, in order, read from the squares' tooltips.
    fn states_of(row: &str, cell: &str) -> Vec<String> {
        let prefix = format!("<title>{}, ", escape(cell));
        row.split(prefix.as_str())
            .skip(1)
            .map(|t| {
                let head = &t[..t.find('\n').unwrap_or(t.len())];
                head.split(": ").nth(1).unwrap().to_string()
            })
            .collect()
    }

    #[test]
    fn the_grid_has_each_cells_states_in_night_order() {
        let html = render(&sample_record());
        assert_eq!(
            states_of(grid_row(&html, "BF16=1,s16"), "BF16=1,s16"),
            ["ok", "regression", "missing", "regression"]
        );
        assert_eq!(
            states_of(grid_row(&html, "BF16=0,s16"), "BF16=0,s16"),
            ["ok", "suspicious", "missing", "ok"]
        );
        assert_eq!(
            states_of(grid_row(&html, "load:c16"), "load:c16"),
            ["ok", "ok", "missing", "insufficient"]
        );
        // The squares carry their state's colour; missing ones are dashed.
        let row = grid_row(&html, "BF16=1,s16");
        assert_eq!(row.matches("fill=\"#d1242f\"").count(), 2, "{row}");
        assert_eq!(row.matches("stroke-dasharray").count(), 1);
        assert!(grid_row(&html, "BF16=0,s16").contains("fill=\"#dd9b00\""));
        // A tooltip names the rate, the evidence and the reasons.
        assert!(row.contains("<title>BF16=1,s16, 2025-01-02: regression\n8/16 = 50.0% ["));
        assert!(row.contains("\nevidence of a rise e = 240\nevidence of a rise e = 240 &gt;= 200"));
        assert!(html.contains("<span class=\"meta\">(load)</span>"));
    }

    #[test]
    fn nights_link_to_their_reports_and_the_absent_one_does_not() {
        let html = render(&sample_record());
        for dir in ["n1", "n2", "n4"] {
            assert!(
                html.contains(&format!(
                    "<th class=\"night\"><a href=\"{dir}/report.html\">"
                )),
                "{dir}: {html}"
            );
        }
        assert!(
            html.contains("<th class=\"night\">2025-01-03<span class=\"build\">absent</span></th>")
        );
        assert!(!html.contains("href=\"/report.html\""));
        // Every cell square of a measured night links to the cell's report; none on the
        // absent night.
        let row = grid_row(&html, "BF16=1,s16");
        assert_eq!(row.matches("<a href=").count(), 3);
        assert!(row.contains("<a href=\"n2/cells/BF16=1,s16/report.html\">"));
        // Builds: a sha cut to 10 characters (whole in the title), other builds whole.
        assert!(html.contains(
            "<span class=\"build\" title=\"0123456789abcdef0123456789abcdef01234567\">0123456789</span>"
        ));
        assert!(html
            .contains("<span class=\"build\">v2.1</span><span class=\"build\">unfinished</span>"));
    }

    #[test]
    fn every_string_from_the_record_is_escaped() {
        let mut r = sample_record();
        r.plan = "night<ly>".into();
        r.skipped.push("<script>alert(1)</script>".into());
        let html = render(&r);
        assert!(!html.contains("<script"), "{html}");
        assert!(!html.contains("<ly>"));
        assert!(!html.contains("<blocks>"));
        assert!(html.contains("<title>bisect history night&lt;ly&gt;</title>"));
        assert!(html.contains("kv: reuse &lt;blocks&gt; early"));
        assert!(html.contains("one-sided Fisher p = 0.053 &lt; 0.06"));
        assert!(!html.contains("p = 0.053 < 0.06"));
        assert!(html.contains("&amp;&amp; echo &quot;done&quot;"));
        // A path character that would break the link is encoded.
        assert_eq!(
            report_href("n 1/cells/a#b?c"),
            "n%201/cells/a%23b%3Fc/report.html"
        );
        assert_eq!(report_href("a&b"), "a&amp;b/report.html");
    }

    #[test]
    fn the_regression_row_has_nights_builds_evidence_search_and_answer() {
        let html = render(&sample_record());
        assert!(html.contains(
            "<tr class=\"blocking\"><td><code>BF16=1,s16</code></td><td class=\"nw\">2025-01-02</td><td class=\"nw\">2025-01-01<span class=\"build\" title=\"a1b2c3d4e5f60718293a4b5c6d7e8f9012345678\">a1b2c3d4e5</span></td><td class=\"nw\">2025-01-02<span class=\"build\" title=\"0123456789abcdef0123456789abcdef01234567\">0123456789</span></td><td class=\"nw\">e = 240 &gt;= 200</td><td>0/16 (0.0%) &rarr; 8/16 (50.0%)</td><td class=\"nw\">open</td><td class=\"search\"><pre><code>bisect commits --good a1b2c3d4e5f6"
        ), "{html}");
        assert!(html.contains(
            "<p>answer <b>culprit</b> 0badc0ffee (kv: reuse &lt;blocks&gt; early): culprit 0badc0ffee verified: 0/16 -&gt; 7/16 (<a href=\"bisects/BF16_1_s16@2025-01-01..2025-01-02/report.html\">report</a>)</p>"
        ), "{html}");
        assert!(html.contains("<section class=\"verdict implicated\"><h2>Open regression on the newest night in 1 cell: BF16=1,s16</h2>"));

        let mut r = sample_record();
        r.regressions[0].event.ended = Some((3, crate::core::history::Ending::Superseded));
        r.regressions[0].search = SearchPlan::Unavailable {
            why: "night 2025-01-04 names no build".into(),
        };
        r.regressions[0].landed = None;
        let html = render(&r);
        assert!(html.contains("<td class=\"nw\">superseded on 2025-01-04</td><td class=\"search\">no search: night 2025-01-04 names no build</td></tr>"));
        assert!(!html.contains("<tr class=\"blocking\">"));
        assert!(!html.contains("<pre>"));
    }

    #[test]
    fn a_chart_per_rate_cell_with_gaps_and_the_first_bad_night() {
        let html = render(&sample_record());
        // Two rate cells, two charts (+ the grid's and legend's small squares).
        assert_eq!(html.matches("<figure>").count(), 2);
        assert!(!html.contains("chart not drawn"));
        // The regressed cell's first bad night is labelled in its chart, once.
        assert_eq!(
            html.matches("\nfirst bad 2025-01-02\n</text>").count(),
            1,
            "{html}"
        );
        // Each night of each chart has its tooltip, the missing one included.
        assert_eq!(
            html.matches("fill-opacity=\"0\"><title>BF16=0,s16, ")
                .count(),
            4
        );
        assert!(html
            .contains("fill-opacity=\"0\"><title>BF16=0,s16, 2025-01-03: missing\n-\nno record"));
        // The load cell is a table of thresholds, coloured by state.
        assert!(html.contains("<h2>Load sweeps: threshold per night</h2>"));
        assert!(html
            .contains("<td class=\"st-insufficient\" title=\"load:c16, 2025-01-04: insufficient"));
        assert!(html.contains(">8 sessions in flight</td>"));
        assert!(html.contains("<td class=\"st-missing\" title=\"load:c16, 2025-01-03: missing"));
    }

    #[test]
    fn the_page_is_one_self_contained_document() {
        let html = render(&sample_record());
        assert!(html.starts_with("<!DOCTYPE html>\n<html lang=\"en\">"));
        assert_eq!(html.matches("<style>").count(), 1);
        assert!(
            html.contains("table.states th.night"),
            "the dashboard's style in the head"
        );
        assert!(html.find("table.states th.night").unwrap() < html.find("</head>").unwrap());
        assert!(!html.contains("<script"));
        // Nothing fetched: the only URL is the SVG namespace.
        assert_eq!(
            html.matches("http").count(),
            html.matches("xmlns=\"http://www.w3.org/2000/svg\"").count(),
        );
        assert!(!html.contains("src="));
        assert!(html.contains("<h2>Skipped records</h2>\n<ul><li>weekly/matrix.json: plan weekly, not nightly</li></ul>"));
        assert!(html.contains("4 nights (2025-01-01..2025-01-04) &middot; a regression where e-BH at alpha 0.01 over the 2 rate cells rejects"));
        assert!(html.contains("generated 2025-01-05T06:00:00.000Z"));
    }
}
