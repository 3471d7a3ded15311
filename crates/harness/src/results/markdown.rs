//! `summary.md`: the run as a human pastes it into a PR or an incident channel.

use super::cells::{arm_cells, compact, comparison_sentence, header, legend, Shown};
use super::markup::table_header;
use super::run_record::{RunRecord, TargetInfo};
use super::Exporter;

pub(crate) struct SummaryMarkdown;

impl Exporter<RunRecord> for SummaryMarkdown {
    fn file_name(&self) -> &'static str {
        "summary.md"
    }

    fn render(&self, r: &RunRecord) -> anyhow::Result<String> {
        let mut s = String::new();
        push_heading(&mut s, r);
        push_arms(&mut s, r);
        push_confounds(&mut s, r);
        push_mechanism(&mut s, r);
        push_deaths(&mut s, r);
        push_lives(&mut s, r);
        push_first_bad_rounds(&mut s, r);
        push_trend(&mut s, r);
        s.push_str(&super::sequential_view::markdown(r));
        if let Some(e) = &r.error {
            s.push_str(&format!("\nError: {e}\n"));
        }
        Ok(s)
    }
}

/// The title, what was flipped where, the status, and the verdict with its reasons.
fn push_heading(s: &mut String, r: &RunRecord) {
    s.push_str(&format!(
        "# bisect run `{}`: {}\n\n",
        r.flag.name, r.header.id
    ));
    let setting = r
        .flag
        .env
        .as_ref()
        .map(|v| format!("env `{v}`"))
        .or_else(|| r.flag.arg.as_ref().map(|v| format!("arg `{v}`")))
        .or_else(|| r.flag.switch.as_ref().map(|v| format!("switch `{v}`")))
        .unwrap_or_default();
    s.push_str(&format!(
        "- flag: `{}` ({setting}) in roles {}; on = `{}`, off = `{}`\n",
        r.flag.name,
        r.flag.roles.join(", "),
        r.flag.on,
        r.flag.off
    ));
    s.push_str(&format!("- target: {}\n", target_words(&r.header.target)));
    s.push_str(&format!("- workload: `{}`\n", compact(&r.workload)));
    if !r.sets.is_empty() {
        let sets: Vec<String> = r.sets.iter().map(|(k, v)| format!("{k}={v}")).collect();
        s.push_str(&format!("- pinned: {}\n", sets.join(", ")));
    }
    s.push_str(&format!("- status: {}\n\n", r.header.status));
    if let Some(v) = &r.verdict {
        s.push_str(&format!("**Verdict: {}**\n\n", v.summary));
        for reason in &v.reasons {
            s.push_str(&format!("- {reason}\n"));
        }
        s.push('\n');
    }
}

/// The arms' table with its legend, the blocks in execution order when there were
/// repeats, and the comparison's sentence.
fn push_arms(s: &mut String, r: &RunRecord) {
    let shown = Shown::of(r);
    s.push_str(&table_header(&header(shown)));
    for arm in &r.arms {
        s.push_str(&format!(
            "| {} |\n",
            arm_cells(&r.flag.name, arm, false, shown).join(" | ")
        ));
    }
    s.push_str(&format!("\n{}\n", legend(shown)));
    if r.runs.len() > r.arms.len() {
        s.push_str("\nArm blocks in execution order:\n\n");
        s.push_str(&table_header(&header(shown)));
        for arm in &r.runs {
            let mut cells = arm_cells(&r.flag.name, arm, false, shown);
            cells[0] = format!("{} r{}", cells[0], arm.repeat.unwrap_or(0));
            s.push_str(&format!("| {} |\n", cells.join(" | ")));
        }
    }
    if let Some(c) = &r.comparison {
        s.push_str(&format!("\n{}\n", comparison_sentence(c)));
    }
}

/// The confounds' table, when there are any.
fn push_confounds(s: &mut String, r: &RunRecord) {
    if r.confounds.is_empty() {
        return;
    }
    s.push('\n');
    s.push_str(&table_header(&[
        "confound", "on", "off", "severity", "note",
    ]));
    for c in &r.confounds {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            c.name,
            compact(&c.on),
            compact(&c.off),
            serde_json::to_value(c.severity)
                .ok()
                .and_then(|v| v.as_str().map(String::from))
                .unwrap_or_default(),
            c.note
        ));
    }
}

/// Whether the flag's path ran, by its witnesses, per arm.
fn push_mechanism(s: &mut String, r: &RunRecord) {
    let lines = r.mechanism_lines();
    if lines.is_empty() {
        return;
    }
    s.push_str("\nMechanism (what the flag's witnesses counted):\n\n");
    for line in lines {
        s.push_str(&format!("- {line}\n"));
    }
}

/// The blocks' engine lives: restarts after deaths, the death budget, canaries.
fn push_lives(s: &mut String, r: &RunRecord) {
    let lines = r.life_lines();
    if lines.is_empty() {
        return;
    }
    s.push_str("\nEngine lives (restarts after deaths; a canary alone after a failure):\n\n");
    for line in lines {
        s.push_str(&format!("- {line}\n"));
    }
}

/// The engine deaths, each with its log's last non-blank line.
fn push_deaths(s: &mut String, r: &RunRecord) {
    let deaths = r.death_lines();
    if deaths.is_empty() {
        return;
    }
    s.push_str(
        "\nEngine deaths (sessions they cut short are `crashed`, judged by engine lives):\n\n",
    );
    for (line, log) in &deaths {
        s.push_str(&format!("- {line}"));
        if let Some(last) = log.iter().rev().find(|l| !l.trim().is_empty()) {
            s.push_str(&format!("; its log's last line: `{}`", last.trim()));
        }
        s.push('\n');
    }
}

/// Per arm, how many sessions first went wrong at each round.
fn push_first_bad_rounds(s: &mut String, r: &RunRecord) {
    let rounds: Vec<String> = r
        .arms
        .iter()
        .filter(|a| !a.stats.first_bad_round.is_empty())
        .map(|a| {
            let per: Vec<String> = a
                .stats
                .first_bad_round
                .iter()
                .enumerate()
                .map(|(i, n)| format!("r{} {n}", i + 1))
                .collect();
            format!("{}: {}", a.label, per.join(", "))
        })
        .collect();
    if !rounds.is_empty() {
        s.push_str(&format!(
            "\nFirst non-ok round per session: {}\n",
            rounds.join("; ")
        ));
    }
}

/// When the `trend` confound fired (core::trend): each arm's corruption per bin of
/// request index, first to last, with the requests and uptimes they span.
fn push_trend(s: &mut String, r: &RunRecord) {
    if !r.confounds.iter().any(|c| c.name == "trend") {
        return;
    }
    let arms: Vec<String> = r
        .arms
        .iter()
        .filter_map(|a| {
            let (first, last) = (a.stats.trend.first()?, a.stats.trend.last()?);
            let bins: Vec<String> = a
                .stats
                .trend
                .iter()
                .map(|b| format!("{}/{}", b.corrupted, b.sessions))
                .collect();
            Some(format!(
                "{}: {} (requests {}-{}, uptime {:.1}-{:.1} s)",
                a.label,
                bins.join(", "),
                first.first_seq,
                last.last_seq,
                first.uptime_s,
                last.uptime_s
            ))
        })
        .collect();
    s.push_str(&format!(
        "\nCorruption against request index (corrupted per bin, first to last): {}\n",
        arms.join("; ")
    ));
}

/// `NAME (`API`, model `MODEL`)`: how every summary.md names its target.
pub(crate) fn target_words(t: &TargetInfo) -> String {
    format!("{} (`{}`, model `{}`)", t.name, t.api, t.model)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trend_that_fired_gets_its_line() {
        use crate::core::trend::bin;
        let mut r = crate::commands::diff::tests::run(10, 80, 80);
        let timeline = crate::core::testing::trend_timeline(40, |i| i >= 30);
        r.arms[0].stats.trend = bin(&timeline);
        let quiet = SummaryMarkdown.render(&r).unwrap();
        assert!(
            !quiet.contains("Corruption against request index"),
            "{quiet}"
        );
        let (on, off) = (
            r.arms[0].observe(&r.workload),
            r.arms[1].observe(&r.workload),
        );
        let fired =
            crate::core::confounds::trend::trend_confound(&on, &off, &Default::default()).unwrap();
        r.confounds.push(fired);
        let md = SummaryMarkdown.render(&r).unwrap();
        assert!(
            md.contains(
                "\nCorruption against request index (corrupted per bin, first to last): \
                 on: 0/5, 0/5, 0/5, 0/5, 0/5, 0/5, 5/5, 5/5 (requests 0-39, uptime 0.2-4.6 s)\n"
            ),
            "{md}"
        );
        assert!(md.contains("| trend |"), "{md}");
    }

    #[test]
    fn a_table_header_has_its_rule_one_cell_per_column() {
        assert_eq!(table_header(&["a", "b c"]), "| a | b c |\n|---|---|\n");
        let owned = vec!["x".to_string()];
        assert_eq!(table_header(&owned), "| x |\n|---|\n");
    }
}
