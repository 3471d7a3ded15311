//! `matrix.csv`: one row per cell, for spreadsheets and dashboards. Flag values get one
//! `flag:NAME` column each and peak concurrency one `peak:ROLE` column per role; a load
//! cell fills the `load_*` columns (its threshold, the baseline's, the move).

use std::collections::BTreeSet;

use crate::commands::matrix::record::MatrixRecord;
use crate::core::session::SessionClass;
use crate::results::Exporter;

pub(crate) struct MatrixCsv;

impl Exporter<MatrixRecord> for MatrixCsv {
    fn file_name(&self) -> &'static str {
        "matrix.csv"
    }

    fn render(&self, r: &MatrixRecord) -> anyhow::Result<String> {
        let flags: BTreeSet<&str> = r
            .cells
            .iter()
            .flat_map(|c| c.flags.keys().map(String::as_str))
            .collect();
        let peaks: BTreeSet<&str> = r
            .cells
            .iter()
            .flat_map(|c| c.stats.peak_running.keys().map(String::as_str))
            .collect();
        let mut out = ::csv::Writer::from_writer(Vec::new());
        let mut header: Vec<String> = vec!["cell".into(), "group".into()];
        header.extend(flags.iter().map(|f| format!("flag:{f}")));
        header.extend(["sessions", "rounds", "status"].map(String::from));
        header.extend(SessionClass::iter().map(|c| c.name().to_string()));
        header.extend(["corrupted", "corruption_rate", "ci95_lo", "ci95_hi"].map(String::from));
        header.extend(peaks.iter().map(|p| format!("peak:{p}")));
        header.extend(
            [
                "completion_tokens",
                "tokens_per_s",
                "wall_s",
                "config_hash",
                "workload_hash",
                "baseline",
                "baseline_rate",
                "p_value",
                "p_adjusted",
                "reasons",
                "load_threshold",
                "load_baseline_threshold",
                "load_moved",
            ]
            .map(String::from),
        );
        out.write_record(&header)?;
        for c in &r.cells {
            let mut row: Vec<String> = vec![c.id.clone(), c.group.to_string()];
            row.extend(
                flags
                    .iter()
                    .map(|f| c.flags.get(*f).cloned().unwrap_or_default()),
            );
            row.extend([
                c.sessions.to_string(),
                c.rounds.to_string(),
                c.status.to_string(),
            ]);
            row.extend(SessionClass::iter().map(|k| c.stats.counts[k].to_string()));
            row.extend([
                c.stats.corrupted.to_string(),
                format!("{:.6}", c.stats.corruption_rate),
                format!("{:.6}", c.stats.ci95[0]),
                format!("{:.6}", c.stats.ci95[1]),
            ]);
            row.extend(peaks.iter().map(|p| {
                c.stats
                    .peak_running
                    .get(*p)
                    .map(u64::to_string)
                    .unwrap_or_default()
            }));
            let cmp = c.comparison.as_ref();
            let opt = |v: Option<f64>| v.map(|x| format!("{x:.6e}")).unwrap_or_default();
            row.extend([
                c.stats.completion_tokens.to_string(),
                format!("{:.3}", c.stats.tokens_per_s),
                format!("{:.3}", c.stats.wall_s),
                c.config_hash.clone(),
                c.workload_hash.clone(),
                cmp.map(|x| x.status.name().to_string()).unwrap_or_default(),
                cmp.map(|x| format!("{:.6}", x.baseline_rate))
                    .unwrap_or_default(),
                opt(cmp.and_then(|x| x.p_value)),
                opt(cmp.and_then(|x| x.p_adjusted)),
                cmp.map(|x| x.reasons.join("; ")).unwrap_or_default(),
            ]);
            let threshold = cmp.and_then(|x| x.threshold.as_ref());
            row.extend([
                c.load
                    .as_ref()
                    .map(|l| l.threshold.clone())
                    .unwrap_or_default(),
                threshold.map(|t| t.baseline.clone()).unwrap_or_default(),
                threshold
                    .and_then(|t| t.moved)
                    .map(|m| m.as_str().to_string())
                    .unwrap_or_default(),
            ]);
            out.write_record(&row)?;
        }
        Ok(String::from_utf8(out.into_inner()?)?)
    }
}
