//! `bisect diff A B`: two results directories side by side, both runs (`run.json`) or both
//! matrices (`matrix.json`). Arms are matched by label and cells by configuration; each
//! matched pair gets its counts, rates with Wilson 95% intervals, the change B - A with a
//! Newcombe (method 10) 95% interval, and a two-sided Fisher exact p (methods and
//! references in [`crate::core::stats`]). Around the rates: the confounds that differ between
//! the two directories (workload parameters, peak concurrency, tokens/s, wall time, flag
//! readbacks, engine info), because a change in rate means little when the load changed.
//!
//! Both files are read as loose JSON so a matrix written by a newer or older `bisect`
//! still diffs; rendering is a terminal table, markdown or JSON.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::Context;
use comfy_table::{presets, Cell, CellAlignment, ContentArrangement, Table};
use serde::Serialize;
use serde_json::Value;

use crate::core::stats;
use crate::exit::Failure;
use crate::results::table::{compact, fmt_p, pct, signed_pct};

/// Relative change above which a recorded quantity is flagged (DESIGN.md 3.7's 25%).
pub const WARN_RATIO: f64 = 0.25;
/// Engine-info leaves listed at most, so one noisy `/server_info` cannot drown the rest.
const MAX_ENGINE_INFO_DIFFS: usize = 40;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    Run,
    Matrix,
}

impl Kind {
    fn file(self) -> &'static str {
        match self {
            Kind::Run => "run.json",
            Kind::Matrix => "matrix.json",
        }
    }
}

/// How `bisect diff` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Table,
    Markdown,
    Json,
}

/// One side's identity.
#[derive(Debug, Clone, Serialize)]
pub struct Side {
    pub path: String,
    pub id: String,
    /// Run verdict status, or the number of regressed cells of a matrix, where recorded.
    pub verdict: Option<String>,
}

/// One arm's or cell's corruption on one side.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Rate {
    pub sessions: u64,
    pub corrupted: u64,
    pub rate: f64,
    pub ci95: [f64; 2],
    pub counts: Value,
}

/// One matched arm or cell; a side is `None` when only the other directory has it.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub key: String,
    pub a: Option<Rate>,
    pub b: Option<Rate>,
    /// B's rate minus A's.
    pub delta: Option<f64>,
    pub delta_ci95: Option<[f64; 2]>,
    pub p_value: Option<f64>,
}

/// Something that differs between A and B besides the rates.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ConfoundDiff {
    /// `run`, or the arm label / cell it belongs to.
    pub scope: String,
    pub name: String,
    pub a: Value,
    pub b: Value,
    /// blocking (rates not comparable), warning (differs by more than 25%, or a setting
    /// differs), info (recorded, within bounds).
    pub severity: String,
    pub note: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Diff {
    pub kind: Kind,
    pub a: Side,
    pub b: Side,
    pub rows: Vec<Row>,
    pub confounds: Vec<ConfoundDiff>,
}

/// Which kind of results directory `dir` is, and its record as loose JSON. A directory
/// with neither file is bad input naming the run.json it expected.
pub fn load(dir: &Path) -> anyhow::Result<(Kind, Value)> {
    for kind in [Kind::Run, Kind::Matrix] {
        let path = dir.join(kind.file());
        if path.is_file() {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            let value: Value = serde_json::from_str(&text).map_err(|e| {
                Failure::BadInput(format!("{}: not valid JSON: {e}", path.display()))
            })?;
            return Ok((kind, value));
        }
    }
    Err(Failure::BadInput(format!(
        "{}: no such file (and no matrix.json beside it)\n  fix: pass results directories written by `bisect run` or `bisect matrix`",
        dir.join("run.json").display()
    ))
    .into())
}

/// Diff two results directories.
pub fn diff_dirs(a: &Path, b: &Path) -> anyhow::Result<Diff> {
    let (kind_a, json_a) = load(a)?;
    let (kind_b, json_b) = load(b)?;
    if kind_a != kind_b {
        let describe = |k: Kind, p: &Path| {
            format!(
                "{} is a {} ({})",
                p.display(),
                if k == Kind::Run { "run" } else { "matrix" },
                k.file()
            )
        };
        return Err(Failure::BadInput(format!(
            "cannot diff a run against a matrix: {}, {}\n  fix: diff two runs or two matrices",
            describe(kind_a, a),
            describe(kind_b, b)
        ))
        .into());
    }
    Ok(diff_values(kind_a, a, &json_a, b, &json_b))
}

/// Diff two records already loaded (`kind` says which file they came from).
pub fn diff_values(kind: Kind, path_a: &Path, a: &Value, path_b: &Path, b: &Value) -> Diff {
    let (rows, confounds) = match kind {
        Kind::Run => (run_rows(a, b), run_confounds(a, b)),
        Kind::Matrix => (matrix_rows(a, b), matrix_confounds(a, b)),
    };
    Diff {
        kind,
        a: side(kind, path_a, a),
        b: side(kind, path_b, b),
        rows,
        confounds,
    }
}

fn side(kind: Kind, path: &Path, v: &Value) -> Side {
    let verdict = match kind {
        Kind::Run => v
            .pointer("/verdict/status")
            .and_then(Value::as_str)
            .map(String::from)
            .or_else(|| v.get("status").and_then(Value::as_str).map(String::from)),
        Kind::Matrix => v
            .get("regressions")
            .and_then(Value::as_array)
            .map(|r| format!("{} regressed cell(s)", r.len())),
    };
    Side {
        path: path.display().to_string(),
        id: v.get("id").map(compact).unwrap_or_default(),
        verdict,
    }
}

/// The rate of an arm or a cell object (`sessions`, `corrupted`, `ci95`, `counts`);
/// missing derived fields are computed from the counts.
pub fn rate_of(v: &Value) -> Rate {
    let counts = v.get("counts").cloned().unwrap_or(Value::Null);
    let total: u64 = counts
        .as_object()
        .map(|m| m.values().filter_map(Value::as_u64).sum())
        .unwrap_or(0);
    let corrupted_from_counts: u64 = ["leak", "bad_args", "wrong_args", "no_tool"]
        .iter()
        .filter_map(|k| counts.get(*k).and_then(Value::as_u64))
        .sum();
    let sessions = v.get("sessions").and_then(Value::as_u64).unwrap_or(total);
    let corrupted = v
        .get("corrupted")
        .and_then(Value::as_u64)
        .unwrap_or(corrupted_from_counts);
    let (lo, hi) = stats::wilson(corrupted, sessions, 0.95);
    Rate {
        sessions,
        corrupted,
        rate: stats::rate(corrupted, sessions),
        ci95: [lo, hi],
        counts,
    }
}

fn row(key: String, a: Option<&Value>, b: Option<&Value>) -> Row {
    let (ra, rb) = (a.map(rate_of), b.map(rate_of));
    let (delta, delta_ci95, p_value) = match (&ra, &rb) {
        (Some(x), Some(y)) => {
            let (d, lo, hi) =
                stats::newcombe_diff(y.corrupted, y.sessions, x.corrupted, x.sessions, 0.95);
            let p = stats::fisher_exact_two_sided(
                y.corrupted,
                y.sessions.saturating_sub(y.corrupted),
                x.corrupted,
                x.sessions.saturating_sub(x.corrupted),
            );
            (Some(d), Some([lo, hi]), Some(p))
        }
        _ => (None, None, None),
    };
    Row {
        key,
        a: ra,
        b: rb,
        delta,
        delta_ci95,
        p_value,
    }
}

fn array<'a>(v: &'a Value, key: &str) -> Vec<&'a Value> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|a| a.iter().collect())
        .unwrap_or_default()
}

fn label(v: &Value) -> String {
    v.get("label").map(compact).unwrap_or_default()
}

/// Pairs by key, in A's order, then B-only ones in B's order.
fn pair<'a>(
    a: &[&'a Value],
    b: &[&'a Value],
    key: impl Fn(&Value) -> String,
) -> Vec<(String, Option<&'a Value>, Option<&'a Value>)> {
    let mut out: Vec<(String, Option<&Value>, Option<&Value>)> = Vec::new();
    for x in a {
        let k = key(x);
        let other = b.iter().find(|y| key(y) == k).copied();
        out.push((k, Some(*x), other));
    }
    for y in b {
        let k = key(y);
        if !out.iter().any(|(seen, _, _)| *seen == k) {
            out.push((k, None, Some(*y)));
        }
    }
    out
}

fn run_rows(a: &Value, b: &Value) -> Vec<Row> {
    pair(&array(a, "arms"), &array(b, "arms"), label)
        .into_iter()
        .map(|(k, x, y)| row(k, x, y))
        .collect()
}

/// A cell's identity: its configuration with keys sorted, so key order never matters.
pub fn configuration_key(cell: &Value) -> String {
    fn canonical(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let sorted: BTreeMap<&String, Value> =
                    m.iter().map(|(k, v)| (k, canonical(v))).collect();
                serde_json::to_value(sorted).unwrap_or(Value::Null)
            }
            Value::Array(a) => Value::Array(a.iter().map(canonical).collect()),
            other => other.clone(),
        }
    }
    match cell.get("configuration") {
        Some(c) => canonical(c).to_string(),
        None => label(cell),
    }
}

fn cells(v: &Value) -> Vec<&Value> {
    match v.get("cells") {
        Some(Value::Array(a)) => a.iter().collect(),
        _ => Vec::new(),
    }
}

fn matrix_rows(a: &Value, b: &Value) -> Vec<Row> {
    pair(&cells(a), &cells(b), configuration_key)
        .into_iter()
        .map(|(_, x, y)| {
            let shown = crate::results::html::cell_label(x.or(y).unwrap_or(&Value::Null));
            row(shown, x, y)
        })
        .collect()
}

fn confound(
    scope: &str,
    name: &str,
    a: &Value,
    b: &Value,
    severity: &str,
    note: &str,
) -> ConfoundDiff {
    ConfoundDiff {
        scope: scope.to_string(),
        name: name.to_string(),
        a: a.clone(),
        b: b.clone(),
        severity: severity.to_string(),
        note: note.to_string(),
    }
}

/// Keys of two objects whose values differ (a key missing on one side counts).
fn differing_keys<'a>(a: &'a Value, b: &'a Value) -> Vec<(String, Value, Value)> {
    let empty = serde_json::Map::new();
    let ma = a.as_object().unwrap_or(&empty);
    let mb = b.as_object().unwrap_or(&empty);
    let keys: BTreeSet<&String> = ma.keys().chain(mb.keys()).collect();
    keys.into_iter()
        .filter_map(|k| {
            let (x, y) = (
                ma.get(k).cloned().unwrap_or(Value::Null),
                mb.get(k).cloned().unwrap_or(Value::Null),
            );
            (x != y).then(|| (k.clone(), x, y))
        })
        .collect()
}

/// A recorded number on both sides: info within 25%, warning beyond.
fn numeric(scope: &str, name: &str, a: Option<&Value>, b: Option<&Value>) -> Option<ConfoundDiff> {
    let (x, y) = (a?.as_f64()?, b?.as_f64()?);
    let base = x.abs().max(y.abs());
    let relative = if base == 0.0 {
        0.0
    } else {
        (y - x) / base.max(1e-12)
    };
    let severity = if relative.abs() > WARN_RATIO {
        "warning"
    } else {
        "info"
    };
    let note = if x == 0.0 && y == 0.0 {
        "both zero".to_string()
    } else {
        let change = if x != 0.0 {
            (y - x) / x.abs()
        } else {
            f64::INFINITY
        };
        if change.is_finite() {
            format!("B {} of A", signed_pct(change))
        } else {
            "zero in A".to_string()
        }
    };
    Some(confound(scope, name, a?, b?, severity, &note))
}

fn load_confounds(scope: &str, a: &Value, b: &Value, out: &mut Vec<ConfoundDiff>) {
    let peaks: BTreeSet<String> = [a, b]
        .iter()
        .filter_map(|v| v.get("peak_running").and_then(Value::as_object))
        .flat_map(|m| m.keys().cloned())
        .collect();
    for key in peaks {
        let name = format!("peak running ({key})");
        let pa = a.pointer(&format!("/peak_running/{key}"));
        let pb = b.pointer(&format!("/peak_running/{key}"));
        match numeric(scope, &name, pa, pb) {
            Some(c) => out.push(c),
            None => out.push(confound(
                scope,
                &name,
                pa.unwrap_or(&Value::Null),
                pb.unwrap_or(&Value::Null),
                "warning",
                "recorded on one side only",
            )),
        }
    }
    for key in ["tokens_per_s", "wall_s"] {
        let name = if key == "tokens_per_s" {
            "tokens/s"
        } else {
            "wall time (s)"
        };
        out.extend(numeric(scope, name, a.get(key), b.get(key)));
    }
}

fn run_confounds(a: &Value, b: &Value) -> Vec<ConfoundDiff> {
    let mut out = Vec::new();
    let null = Value::Null;
    for (k, x, y) in differing_keys(
        a.get("workload").unwrap_or(&null),
        b.get("workload").unwrap_or(&null),
    ) {
        out.push(confound(
            "run",
            &format!("workload {k}"),
            &x,
            &y,
            "blocking",
            "workload parameters differ: the rates are not comparable",
        ));
    }
    for (k, x, y) in differing_keys(
        a.get("flag").unwrap_or(&null),
        b.get("flag").unwrap_or(&null),
    ) {
        out.push(confound(
            "run",
            &format!("flag {k}"),
            &x,
            &y,
            "warning",
            "a different flag definition",
        ));
    }
    for (k, x, y) in differing_keys(
        a.get("sets").unwrap_or(&null),
        b.get("sets").unwrap_or(&null),
    ) {
        out.push(confound(
            "run",
            &format!("pinned {k}"),
            &x,
            &y,
            "warning",
            "another flag pinned differently (--set)",
        ));
    }
    for key in ["name", "api", "model"] {
        let (x, y) = (
            a.pointer(&format!("/target/{key}")).unwrap_or(&null),
            b.pointer(&format!("/target/{key}")).unwrap_or(&null),
        );
        if x != y {
            out.push(confound(
                "run",
                &format!("target {key}"),
                x,
                y,
                "info",
                "a different target profile",
            ));
        }
    }
    for (label, x, y) in pair(&array(a, "arms"), &array(b, "arms"), label) {
        let (Some(x), Some(y)) = (x, y) else { continue };
        for (role, ra, rb) in differing_keys(
            x.get("readback").unwrap_or(&null),
            y.get("readback").unwrap_or(&null),
        ) {
            out.push(confound(
                &label,
                &format!("readback {role}"),
                &ra,
                &rb,
                "warning",
                "the launch config read back another value",
            ));
        }
        load_confounds(&label, x, y, &mut out);
    }
    engine_info_confounds(
        a.get("engine_info").unwrap_or(&null),
        b.get("engine_info").unwrap_or(&null),
        &mut out,
    );
    out
}

fn matrix_confounds(a: &Value, b: &Value) -> Vec<ConfoundDiff> {
    let mut out = Vec::new();
    let null = Value::Null;
    for key in ["workload", "target"] {
        for (k, x, y) in differing_keys(a.get(key).unwrap_or(&null), b.get(key).unwrap_or(&null)) {
            let severity = if key == "workload" {
                "blocking"
            } else {
                "info"
            };
            out.push(confound(
                "matrix",
                &format!("{key} {k}"),
                &x,
                &y,
                severity,
                &format!("{key} differs"),
            ));
        }
    }
    for (_, x, y) in pair(&cells(a), &cells(b), configuration_key) {
        let (Some(x), Some(y)) = (x, y) else { continue };
        let scope = crate::results::html::cell_label(x);
        for (k, ra, rb) in differing_keys(
            x.get("readback").unwrap_or(&null),
            y.get("readback").unwrap_or(&null),
        ) {
            out.push(confound(
                &scope,
                &format!("readback {k}"),
                &ra,
                &rb,
                "warning",
                "the launch config read back another value",
            ));
        }
        load_confounds(&scope, x, y, &mut out);
    }
    engine_info_confounds(
        a.get("engine_info").unwrap_or(&null),
        b.get("engine_info").unwrap_or(&null),
        &mut out,
    );
    out
}

/// Leaves of a JSON tree as `path -> value` (`on-r0/prefill.env.X`).
fn leaves(prefix: &str, v: &Value, out: &mut BTreeMap<String, Value>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(&p, x, out);
            }
        }
        other => {
            out.insert(prefix.to_string(), other.clone());
        }
    }
}

fn engine_info_confounds(a: &Value, b: &Value, out: &mut Vec<ConfoundDiff>) {
    let (mut la, mut lb) = (BTreeMap::new(), BTreeMap::new());
    leaves("", a, &mut la);
    leaves("", b, &mut lb);
    // Only blocks present on both sides are compared: a run with more repeats has more
    // blocks, which is not an engine difference.
    let block = |path: &str| path.split('.').next().unwrap_or("").to_string();
    let blocks_a: BTreeSet<String> = la.keys().map(|k| block(k)).collect();
    let blocks_b: BTreeSet<String> = lb.keys().map(|k| block(k)).collect();
    let keys: BTreeSet<&String> = la.keys().chain(lb.keys()).collect();
    let mut listed = 0;
    let mut more = 0;
    for k in keys {
        let bl = block(k);
        if !(blocks_a.contains(&bl) && blocks_b.contains(&bl)) {
            continue;
        }
        let (x, y) = (
            la.get(k).unwrap_or(&Value::Null),
            lb.get(k).unwrap_or(&Value::Null),
        );
        if x == y {
            continue;
        }
        if listed < MAX_ENGINE_INFO_DIFFS {
            out.push(confound(
                "engine",
                k,
                x,
                y,
                "warning",
                "the engine reports a different setting",
            ));
            listed += 1;
        } else {
            more += 1;
        }
    }
    if more > 0 {
        out.push(confound(
            "engine",
            "more engine info",
            &Value::Null,
            &Value::Null,
            "warning",
            &format!("{more} more differing /server_info values not listed"),
        ));
    }
}

fn rate_text(r: &Option<Rate>) -> String {
    match r {
        Some(r) => format!(
            "{}/{} = {} [{}, {}]",
            r.corrupted,
            r.sessions,
            pct(r.rate),
            pct(r.ci95[0]),
            pct(r.ci95[1])
        ),
        None => "-".to_string(),
    }
}

fn delta_text(row: &Row) -> String {
    match (row.delta, row.delta_ci95) {
        (Some(d), Some([lo, hi])) => {
            format!("{} [{}, {}]", signed_pct(d), signed_pct(lo), signed_pct(hi))
        }
        _ => "-".to_string(),
    }
}

fn p_text(row: &Row) -> String {
    row.p_value.map(fmt_p).unwrap_or_else(|| "-".to_string())
}

fn side_text(name: &str, s: &Side) -> String {
    format!(
        "{name}: {} (id {}{})",
        s.path,
        s.id,
        s.verdict
            .as_ref()
            .map(|v| format!(", {v}"))
            .unwrap_or_default()
    )
}

const ROW_HEADER: [&str; 5] = [
    "arm/cell",
    "A corrupted [95% CI]",
    "B corrupted [95% CI]",
    "B - A [95% CI]",
    "Fisher p",
];
const CONFOUND_HEADER: [&str; 6] = ["scope", "confound", "A", "B", "severity", "note"];

fn kind_word(kind: Kind) -> &'static str {
    match kind {
        Kind::Run => "runs",
        Kind::Matrix => "matrices",
    }
}

/// The terminal table (comfy-table).
pub fn render_table(d: &Diff) -> String {
    let mut rates = Table::new();
    rates
        .load_preset(presets::UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(ROW_HEADER.iter().map(Cell::new));
    for r in &d.rows {
        rates.add_row(vec![
            Cell::new(&r.key),
            Cell::new(rate_text(&r.a)).set_alignment(CellAlignment::Right),
            Cell::new(rate_text(&r.b)).set_alignment(CellAlignment::Right),
            Cell::new(delta_text(r)).set_alignment(CellAlignment::Right),
            Cell::new(p_text(r)).set_alignment(CellAlignment::Right),
        ]);
    }
    let mut out = format!(
        "bisect diff of two {}\n{}\n{}\n{rates}\n",
        kind_word(d.kind),
        side_text("A", &d.a),
        side_text("B", &d.b)
    );
    if d.confounds.is_empty() {
        out.push_str("no confound differs\n");
    } else {
        let mut t = Table::new();
        t.load_preset(presets::UTF8_FULL_CONDENSED)
            .set_content_arrangement(ContentArrangement::Dynamic)
            .set_header(CONFOUND_HEADER.iter().map(Cell::new));
        for c in &d.confounds {
            t.add_row(vec![
                c.scope.clone(),
                c.name.clone(),
                compact(&c.a),
                compact(&c.b),
                c.severity.clone(),
                c.note.clone(),
            ]);
        }
        out.push_str(&format!("{t}\n"));
    }
    out
}

fn md_cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

/// Markdown for a PR or an incident channel.
pub fn render_markdown(d: &Diff) -> String {
    let mut s = format!("# bisect diff of two {}\n\n", kind_word(d.kind));
    s.push_str(&format!(
        "- {}\n- {}\n\n",
        md_cell(&side_text("A", &d.a)),
        md_cell(&side_text("B", &d.b))
    ));
    s.push_str(&format!(
        "| {} |\n|{}\n",
        ROW_HEADER.join(" | "),
        "---|".repeat(ROW_HEADER.len())
    ));
    for r in &d.rows {
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            md_cell(&r.key),
            rate_text(&r.a),
            rate_text(&r.b),
            delta_text(r),
            p_text(r)
        ));
    }
    if d.confounds.is_empty() {
        s.push_str("\nNo confound differs.\n");
    } else {
        s.push_str(&format!(
            "\n## Confounds\n\n| {} |\n|{}\n",
            CONFOUND_HEADER.join(" | "),
            "---|".repeat(CONFOUND_HEADER.len())
        ));
        for c in &d.confounds {
            s.push_str(&format!(
                "| {} | {} | {} | {} | {} | {} |\n",
                md_cell(&c.scope),
                md_cell(&c.name),
                md_cell(&compact(&c.a)),
                md_cell(&compact(&c.b)),
                c.severity,
                md_cell(&c.note)
            ));
        }
    }
    s
}

pub fn render(d: &Diff, format: Format) -> anyhow::Result<String> {
    Ok(match format {
        Format::Table => render_table(d),
        Format::Markdown => render_markdown(d),
        Format::Json => {
            let mut s = serde_json::to_string_pretty(d)?;
            s.push('\n');
            s
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn arm(label: &str, corrupted: u64, sessions: u64, peak: u64, tps: f64) -> Value {
        json!({
            "label": label, "value": "1", "readback": {"prefill": "1", "decode": "1"},
            "sessions": sessions,
            "counts": {"done": sessions - corrupted, "leak": corrupted},
            "corrupted": corrupted, "peak_running": {"client": peak}, "tokens_per_s": tps, "wall_s": 10.0
        })
    }

    fn run(on: u64, sessions: u64, peak: u64) -> Value {
        json!({
            "id": "r", "workload": {"name": "agentic", "sessions": sessions, "rounds": 4},
            "flag": {"name": "BF16_INDEX_K", "on": "1", "off": "0"},
            "arms": [arm("on", on, sessions, peak, 1000.0), arm("off", 0, sessions, peak, 1000.0)],
            "verdict": {"status": "implicated"},
            "engine_info": {"on-r0/prefill": {"env": {"X": "1"}, "pid": 1}}
        })
    }

    #[test]
    fn matched_arms_get_newcombe_delta_and_fisher_p() {
        let d = diff_values(
            Kind::Run,
            Path::new("a"),
            &run(14, 80, 80),
            Path::new("b"),
            &run(0, 80, 80),
        );
        let on = &d.rows[0];
        assert_eq!(on.key, "on");
        assert_eq!(on.delta, Some(-14.0 / 80.0));
        let (_, lo, hi) = stats::newcombe_diff(0, 80, 14, 80, 0.95);
        assert_eq!(on.delta_ci95, Some([lo, hi]));
        assert_eq!(
            on.p_value,
            Some(stats::fisher_exact_two_sided(0, 80, 14, 66))
        );
        assert!(on.p_value.unwrap() < 1e-4);
        let off = &d.rows[1];
        assert_eq!((off.delta, off.p_value), (Some(0.0), Some(1.0)));
        // Identical load: tokens/s and peaks are info only, and nothing blocks.
        assert!(
            d.confounds.iter().all(|c| c.severity == "info"),
            "{:?}",
            d.confounds
        );
    }

    #[test]
    fn load_and_workload_changes_are_confounds() {
        let mut b = run(14, 64, 30);
        b["engine_info"]["on-r0/prefill"]["env"]["X"] = json!("0");
        b["engine_info"]["on-r0/prefill"]["pid"] = json!(1);
        b["engine_info"]["off-r1/prefill"] = json!({"env": {"X": "9"}});
        let d = diff_values(
            Kind::Run,
            Path::new("a"),
            &run(14, 80, 80),
            Path::new("b"),
            &b,
        );
        let names: Vec<(String, String, String)> = d
            .confounds
            .iter()
            .map(|c| (c.scope.clone(), c.name.clone(), c.severity.clone()))
            .collect();
        assert!(
            names.contains(&("run".into(), "workload sessions".into(), "blocking".into())),
            "{names:?}"
        );
        assert!(names.contains(&(
            "on".into(),
            "peak running (client)".into(),
            "warning".into()
        )));
        assert!(names.contains(&(
            "engine".into(),
            "on-r0/prefill.env.X".into(),
            "warning".into()
        )));
        // A block only B ran is not an engine difference.
        assert!(
            !names.iter().any(|n| n.1.starts_with("off-r1")),
            "{names:?}"
        );
        let peak = d
            .confounds
            .iter()
            .find(|c| c.name == "peak running (client)")
            .unwrap();
        assert_eq!(peak.note, "B -62.5% of A");
    }

    #[test]
    fn cells_match_by_configuration_whatever_the_order() {
        let cell = |bf16: &str, sessions: u64, k: u64| json!({"configuration": {"BF16_INDEX_K": bf16, "sessions": sessions}, "counts": {"done": 16 - k, "leak": k}, "corrupted": k});
        let reordered = json!({"configuration": {"sessions": 16, "BF16_INDEX_K": "1"}, "counts": {"done": 16}, "corrupted": 0});
        let a = json!({"cells": [cell("1", 16, 5), cell("0", 16, 0)]});
        let b =
            json!({"cells": [cell("0", 16, 0), reordered, cell("1", 64, 9)], "regressions": []});
        let d = diff_values(Kind::Matrix, Path::new("a"), &a, Path::new("b"), &b);
        let keys: Vec<&str> = d.rows.iter().map(|r| r.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "BF16_INDEX_K=1, sessions=16",
                "BF16_INDEX_K=0, sessions=16",
                "BF16_INDEX_K=1, sessions=64"
            ]
        );
        assert_eq!(d.rows[0].delta, Some(-5.0 / 16.0));
        assert!(d.rows[2].a.is_none() && d.rows[2].p_value.is_none());
        assert_eq!(d.b.verdict.as_deref(), Some("0 regressed cell(s)"));
        let md = render_markdown(&d);
        assert!(
            md.contains("| BF16_INDEX_K=1, sessions=64 | - | 9/16 = 56.2%"),
            "{md}"
        );
    }

    #[test]
    fn run_against_matrix_and_missing_record_are_bad_input() {
        let dir = tempfile::tempdir().unwrap();
        let (run_dir, matrix_dir, empty) = (
            dir.path().join("r"),
            dir.path().join("m"),
            dir.path().join("e"),
        );
        for d in [&run_dir, &matrix_dir, &empty] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(run_dir.join("run.json"), run(1, 10, 5).to_string()).unwrap();
        std::fs::write(matrix_dir.join("matrix.json"), r#"{"cells": []}"#).unwrap();
        let err = diff_dirs(&run_dir, &matrix_dir).unwrap_err();
        assert_eq!(crate::exit::code_for_error(&err), crate::exit::BAD_INPUT);
        assert!(
            format!("{err}").contains("cannot diff a run against a matrix"),
            "{err}"
        );
        let err = diff_dirs(&run_dir, &empty).unwrap_err();
        assert_eq!(crate::exit::code_for_error(&err), crate::exit::BAD_INPUT);
        assert!(
            format!("{err}").contains(&empty.join("run.json").display().to_string()),
            "{err}"
        );
    }
}
