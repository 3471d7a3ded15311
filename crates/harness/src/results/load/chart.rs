//! The chart of report.html: corruption rate against sessions in flight (each level's
//! rate with its Wilson 95% interval, the isotonic fit and its simultaneous band, the
//! `off` arm beside an A/B's `on`), the threshold as a vertical line, and on a second
//! axis the engine-side load each level reached against the load asked (the diagonal).
//! Plain inline SVG written by hand: deterministic text, no scripts.

use std::fmt::Write as _;

use crate::core::load::report::{Answer, LevelReport};
use crate::core::load::{Axis, LoadReport};
use crate::core::stats;

const W: f64 = 720.0;
const H: f64 = 380.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 70.0;
const TOP: f64 = 36.0;
const BOTTOM: f64 = 56.0;

struct Scale {
    max_level: f64,
    max_rate: f64,
    /// The right axis's top: the highest level in flight, or a pressure sweep's load.
    max_running: f64,
    axis: Axis,
}

impl Scale {
    fn x(&self, level: f64) -> f64 {
        LEFT + (W - LEFT - RIGHT) * level / self.max_level
    }
    fn y(&self, rate: f64) -> f64 {
        H - BOTTOM - (H - TOP - BOTTOM) * (rate / self.max_rate).min(1.0)
    }
    /// The right axis: engine-side running requests, 0 to the highest load asked.
    fn y_load(&self, running: f64) -> f64 {
        H - BOTTOM - (H - TOP - BOTTOM) * (running / self.max_running).min(1.0)
    }
}

fn scale(levels: &[LevelReport], axis: Axis) -> Scale {
    let max_level = levels.iter().map(|l| l.level).max().unwrap_or(1).max(1) as f64;
    let max_running = match axis {
        Axis::InFlight => max_level,
        Axis::Pressure { in_flight } => f64::from(in_flight.max(1)),
    };
    let top = levels
        .iter()
        .flat_map(|l| {
            let off = l
                .off
                .as_ref()
                .map(|o| stats::wilson(o.corrupted, o.judged, 0.95).1);
            [Some(l.wilson[1]), l.band.map(|b| b[1]), off]
        })
        .flatten()
        .fold(0.05_f64, f64::max);
    // Up to the next 5 points.
    let max_rate = ((top * 20.0).ceil() / 20.0).min(1.0);
    Scale {
        max_level,
        max_rate,
        max_running,
        axis,
    }
}

/// The chart as an inline `<svg>` element (an empty string without levels).
pub fn svg(report: &LoadReport, ab: bool) -> String {
    let levels = &report.levels;
    if levels.is_empty() {
        return String::new();
    }
    let s = scale(levels, report.axis);
    let mut out = format!(
        "<svg class=\"load-chart\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {W} {H}\" width=\"{W}\" height=\"{H}\" font-family=\"sans-serif\" font-size=\"12\">\n"
    );
    axes(&mut out, &s, levels);
    band_and_fit(&mut out, &s, levels);
    load_points(&mut out, &s, levels);
    rate_points(&mut out, &s, levels, ab);
    if let Answer::Threshold { level, .. } = report.answer {
        let x = s.x(f64::from(level));
        let _ = writeln!(
            out,
            "<line x1=\"{x:.1}\" y1=\"{TOP}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#c62828\" stroke-dasharray=\"6 4\"/><text x=\"{:.1}\" y=\"{:.1}\" fill=\"#c62828\">threshold {level}</text>",
            H - BOTTOM,
            x + 4.0,
            TOP + 12.0
        );
    }
    legend(&mut out, ab);
    out.push_str("</svg>\n");
    out
}

fn axes(out: &mut String, s: &Scale, levels: &[LevelReport]) {
    let (x0, x1, y0) = (LEFT, W - RIGHT, H - BOTTOM);
    let _ = writeln!(
        out,
        "<path d=\"M{x0} {TOP} V{y0} H{x1} V{TOP}\" fill=\"none\" stroke=\"#444\"/>"
    );
    for l in levels {
        let x = s.x(f64::from(l.level));
        let _ = writeln!(
            out,
            "<line x1=\"{x:.1}\" y1=\"{y0}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"#444\"/><text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            y0 + 5.0,
            y0 + 18.0,
            l.level
        );
    }
    for i in 0..=4 {
        let rate = s.max_rate * f64::from(i) / 4.0;
        let y = s.y(rate);
        let running = s.max_running * f64::from(i) / 4.0;
        let _ = writeln!(
            out,
            "<line x1=\"{x0}\" y1=\"{y:.1}\" x2=\"{x1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{:.0}%</text><text x=\"{:.1}\" y=\"{:.1}\" fill=\"#e65100\">{running:.0}</text>",
            x0 - 6.0,
            y + 4.0,
            rate * 100.0,
            x1 + 6.0,
            y + 4.0
        );
    }
    let _ = writeln!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
        (x0 + x1) / 2.0,
        H - 14.0,
        match s.axis {
            Axis::InFlight => "sessions in flight (asked)".to_string(),
            Axis::Pressure { in_flight } =>
                format!("KV cache pressure, % (asked), at {in_flight} in flight"),
        }
    );
    let _ = writeln!(
        out,
        "<text transform=\"translate(16 {:.1}) rotate(-90)\" text-anchor=\"middle\">corrupted sessions</text>",
        (TOP + y0) / 2.0
    );
    let _ = writeln!(
        out,
        "<text transform=\"translate({:.1} {:.1}) rotate(90)\" text-anchor=\"middle\" fill=\"#e65100\">engine-side peak running</text>",
        W - 14.0,
        (TOP + y0) / 2.0
    );
}

fn band_and_fit(out: &mut String, s: &Scale, levels: &[LevelReport]) {
    let fitted: Vec<(f64, f64, [f64; 2])> = levels
        .iter()
        .filter_map(|l| Some((f64::from(l.level), l.fit?, l.band?)))
        .collect();
    if fitted.is_empty() {
        return;
    }
    let mut band = String::new();
    for (x, _, b) in &fitted {
        let _ = write!(band, "{:.1},{:.1} ", s.x(*x), s.y(b[1]));
    }
    for (x, _, b) in fitted.iter().rev() {
        let _ = write!(band, "{:.1},{:.1} ", s.x(*x), s.y(b[0].min(b[1])));
    }
    let line: Vec<String> = fitted
        .iter()
        .map(|(x, f, _)| format!("{:.1},{:.1}", s.x(*x), s.y(*f)))
        .collect();
    let _ = writeln!(
        out,
        "<polygon points=\"{}\" fill=\"#1565c0\" fill-opacity=\"0.15\" stroke=\"none\"/>\n<polyline points=\"{}\" fill=\"none\" stroke=\"#1565c0\" stroke-width=\"2\"/>",
        band.trim_end(),
        line.join(" ")
    );
}

fn load_points(out: &mut String, s: &Scale, levels: &[LevelReport]) {
    // Where the engine's peak should be: the level itself, or a pressure sweep's load.
    let (first, last) = (s.x(0.0), s.x(s.max_level));
    let asked = |level: f64| match s.axis {
        Axis::InFlight => level,
        Axis::Pressure { in_flight } => f64::from(in_flight),
    };
    let _ = writeln!(
        out,
        "<line x1=\"{first:.1}\" y1=\"{:.1}\" x2=\"{last:.1}\" y2=\"{:.1}\" stroke=\"#e65100\" stroke-opacity=\"0.5\" stroke-dasharray=\"3 3\"/>",
        s.y_load(asked(0.0)),
        s.y_load(asked(s.max_level))
    );
    for l in levels {
        let Some(peak) = l.arm.peak_engine else {
            continue;
        };
        let (x, y) = (s.x(f64::from(l.level)), s.y_load(peak as f64));
        let _ = writeln!(
            out,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"7\" height=\"7\" fill=\"#e65100\"><title>{} asked: engine-side peak {peak}</title></rect>",
            x - 3.5,
            y - 3.5,
            l.level
        );
    }
}

fn rate_points(out: &mut String, s: &Scale, levels: &[LevelReport], ab: bool) {
    for l in levels {
        let x = s.x(f64::from(l.level));
        let short = l.short.is_some();
        let colour = if short { "#c62828" } else { "#111" };
        let fill = if short { "none" } else { colour };
        let _ = writeln!(
            out,
            "<line x1=\"{x:.1}\" y1=\"{:.1}\" x2=\"{x:.1}\" y2=\"{:.1}\" stroke=\"{colour}\"/><circle cx=\"{x:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"{fill}\" stroke=\"{colour}\"><title>{}: {}/{} corrupted</title></circle>",
            s.y(l.wilson[0]),
            s.y(l.wilson[1]),
            s.y(l.arm.rate()),
            l.level,
            l.arm.corrupted,
            l.arm.judged
        );
        if short {
            let _ = writeln!(
                out,
                "<text x=\"{:.1}\" y=\"{:.1}\" fill=\"#c62828\" text-anchor=\"middle\">load short</text>",
                x,
                s.y(l.wilson[1]) - 6.0
            );
        }
        if let (true, Some(off)) = (ab, &l.off) {
            let (lo, hi) = stats::wilson(off.corrupted, off.judged, 0.95);
            let xo = x + 8.0;
            let _ = writeln!(
                out,
                "<line x1=\"{xo:.1}\" y1=\"{:.1}\" x2=\"{xo:.1}\" y2=\"{:.1}\" stroke=\"#888\"/><circle cx=\"{xo:.1}\" cy=\"{:.1}\" r=\"4\" fill=\"#fff\" stroke=\"#888\"><title>{} off: {}/{} corrupted</title></circle>",
                s.y(lo),
                s.y(hi),
                s.y(off.rate()),
                l.level,
                off.corrupted,
                off.judged
            );
        }
    }
}

fn legend(out: &mut String, ab: bool) {
    let y = 16.0;
    let _ = writeln!(
        out,
        "<circle cx=\"{LEFT}\" cy=\"{y}\" r=\"4\" fill=\"#111\"/><text x=\"{:.1}\" y=\"{:.1}\">{} (95% CI)</text>",
        LEFT + 8.0,
        y + 4.0,
        if ab { "on" } else { "rate" }
    );
    let _ = writeln!(
        out,
        "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"18\" height=\"8\" fill=\"#1565c0\" fill-opacity=\"0.3\"/><text x=\"{:.1}\" y=\"{:.1}\">monotone fit, 95% band</text>",
        LEFT + 110.0,
        y - 4.0,
        LEFT + 132.0,
        y + 4.0
    );
    let _ = writeln!(
        out,
        "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"7\" height=\"7\" fill=\"#e65100\"/><text x=\"{:.1}\" y=\"{:.1}\">engine-side load (dashed: asked)</text>",
        LEFT + 300.0,
        y - 3.5,
        LEFT + 312.0,
        y + 4.0
    );
    if ab {
        let _ = writeln!(
            out,
            "<circle cx=\"{:.1}\" cy=\"{y}\" r=\"4\" fill=\"#fff\" stroke=\"#888\"/><text x=\"{:.1}\" y=\"{:.1}\">off</text>",
            LEFT + 520.0,
            LEFT + 528.0,
            y + 4.0
        );
    }
}
