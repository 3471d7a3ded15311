//! The sequential path of an adaptive run (`adaptive` in run.json) and the phase
//! accounting (`phases`), as the terminal, summary.md and report.html show them: a small
//! table with one row per look (block pair, sub-block, cumulative counts per arm,
//! e-value against its threshold, the always-valid interval, the decision), the design
//! it ran under, and where the wall time went. Each renderer appends its own section.

use std::fmt::Write;

use crate::core::adaptive::{e_value_text, AdaptiveRecord};
use crate::core::format::percent_digits;
use crate::core::sequential::Decision;

use super::markup::{escape, table_header};
use super::run_record::RunRecord;

const HEADER: [&str; 7] = [
    "pair",
    "sub-block",
    "on corrupted/sessions",
    "off corrupted/sessions",
    "e-value / threshold",
    "always-valid interval (points)",
    "decision",
];

fn decision_text(d: &Decision) -> String {
    match d {
        Decision::Continue => "continue".into(),
        Decision::Implicated { direction } => {
            format!("implicated ({})", format!("{direction:?}").to_lowercase())
        }
        Decision::Cleared => "cleared".into(),
        Decision::Underpowered { .. } => "underpowered (cap)".into(),
    }
}

fn rows(seq: &AdaptiveRecord) -> Vec<[String; 7]> {
    seq.looks
        .iter()
        .map(|l| {
            let r = &l.record;
            [
                l.pair.to_string(),
                l.sub_block.to_string(),
                format!("{}/{}", r.on.corrupted, r.on.sessions),
                format!("{}/{}", r.off.corrupted, r.off.sessions),
                format!(
                    "{} / {}",
                    e_value_text(r.e_value),
                    e_value_text(r.threshold)
                ),
                format!(
                    "{} to {}",
                    percent_digits(r.diff_interval[0]),
                    percent_digits(r.diff_interval[1])
                ),
                decision_text(&r.decision),
            ]
        })
        .collect()
}

/// One sentence: the design the run used.
pub(crate) fn design_sentence(seq: &AdaptiveRecord) -> String {
    let d = &seq.design;
    let (on, off) = seq.sessions_per_arm();
    let cost = d.cost_model.map_or(String::new(), |c| {
        format!(
            "; measured cost {:.3} s per session, {:.2} s per restart",
            c.session_s, c.restart_s
        )
    });
    format!(
        "Sequential design: alpha {}, power {} at {} points over a {}% baseline, blocks of \
         {} sessions per arm at {} in flight (e-process factors of at most {}), cap {} per \
         arm ({}){cost}. Ran {on} + {off} sessions in {} block pairs.",
        d.alpha,
        d.power,
        percent_digits(d.min_effect),
        percent_digits(d.baseline),
        d.block_per_arm,
        d.concurrency,
        d.granularity,
        d.max_per_arm,
        d.cap_source.describe(),
        seq.pairs()
    )
}

/// summary.md: the design, the looks table, why it stopped; then the phases.
pub fn markdown(record: &RunRecord) -> String {
    let mut s = String::new();
    if let Some(seq) = &record.adaptive {
        let _ = writeln!(s, "\n## Sequential looks\n\n{}\n", design_sentence(seq));
        s.push_str(&table_header(&HEADER));
        for row in rows(seq) {
            let _ = writeln!(s, "| {} |", row.join(" | "));
        }
        if let Some(reason) = &seq.stopped {
            let _ = writeln!(s, "\nStopped: {reason}");
        }
    }
    if let Some(p) = &record.phases {
        let _ = writeln!(s, "\n## Where the time went\n\n{}", p.line());
    }
    if let Some(c) = &record.cost {
        let _ = writeln!(s, "\n{}", c.line());
    }
    s
}

/// The terminal: the design and the looks, compact.
pub fn text(record: &RunRecord) -> String {
    let mut s = String::new();
    if let Some(seq) = &record.adaptive {
        let _ = writeln!(s, "{}", design_sentence(seq));
        for row in rows(seq) {
            let _ = writeln!(
                s,
                "  look pair {} sub {}: on {} vs off {}, e-value {}, interval {}: {}",
                row[0], row[1], row[2], row[3], row[4], row[5], row[6]
            );
        }
        if let Some(reason) = &seq.stopped {
            let _ = writeln!(s, "  stopped: {reason}");
        }
    }
    if let Some(p) = &record.phases {
        let _ = writeln!(s, "time: {}", p.line());
    }
    if let Some(c) = &record.cost {
        let _ = writeln!(s, "{}", c.line());
    }
    s
}

/// report.html: the same sections.
pub fn html(record: &RunRecord) -> String {
    let mut s = String::new();
    if let Some(seq) = &record.adaptive {
        let _ = writeln!(
            s,
            "<h2>Sequential looks</h2>\n<p>{}</p>\n<table><tr>{}</tr>",
            escape(&design_sentence(seq)),
            HEADER
                .iter()
                .map(|h| format!("<th>{}</th>", escape(h)))
                .collect::<String>()
        );
        for row in rows(seq) {
            let _ = writeln!(
                s,
                "<tr>{}</tr>",
                row.iter()
                    .map(|c| format!("<td>{}</td>", escape(c)))
                    .collect::<String>()
            );
        }
        s.push_str("</table>\n");
        if let Some(reason) = &seq.stopped {
            let _ = writeln!(s, "<p>Stopped: {}</p>", escape(reason));
        }
    }
    if let Some(p) = &record.phases {
        let _ = writeln!(
            s,
            "<h2>Where the time went</h2>\n<p>{}</p>",
            escape(&p.line())
        );
    }
    if let Some(c) = &record.cost {
        let _ = writeln!(s, "<p>{}</p>", escape(&c.line()));
    }
    s
}
