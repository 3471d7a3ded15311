//! What differs between two records besides the rates: workload parameters (blocking:
//! the rates are not comparable), the flag definition and pinned flags, the target, per
//! arm or cell the readbacks and the load (peak concurrency, tokens/s, wall time), and
//! the engines' `/server_info`.

use std::collections::{BTreeMap, BTreeSet};

use serde::Serialize;
use serde_json::{json, Value};

use super::rows::pair;
use super::{ConfoundDiff, WARN_RATIO};
use crate::commands::matrix::record::MatrixRecord;
use crate::core::arm_stats::ArmStats;
use crate::core::evidence::Severity;
use crate::core::format;
use crate::results::run_record::{RunRecord, TargetInfo};

/// Engine-info leaves listed at most, so one noisy `/server_info` cannot drown the rest.
const MAX_ENGINE_INFO_DIFFS: usize = 40;

fn confound(
    scope: &str,
    name: &str,
    a: Value,
    b: Value,
    severity: Severity,
    note: &str,
) -> ConfoundDiff {
    ConfoundDiff {
        scope: scope.to_string(),
        name: name.to_string(),
        a,
        b,
        severity,
        note: note.to_string(),
    }
}

/// Entries of two maps whose values differ (a key missing on one side counts, as null).
fn differing<V: PartialEq + Serialize>(
    a: &BTreeMap<String, V>,
    b: &BTreeMap<String, V>,
) -> Vec<(String, Value, Value)> {
    let keys: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    let value = |v: Option<&V>| v.map_or(Value::Null, |v| json!(v));
    keys.into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| (k.clone(), value(a.get(k)), value(b.get(k))))
        .collect()
}

/// The fields of a JSON object (a workload, a serialised flag definition) as a map.
fn fields(v: &Value) -> BTreeMap<String, Value> {
    v.as_object()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
        .unwrap_or_default()
}

fn fields_of<T: Serialize>(v: &T) -> BTreeMap<String, Value> {
    fields(&serde_json::to_value(v).unwrap_or(Value::Null))
}

/// A recorded number on both sides: info within 25%, warning beyond.
fn numeric(scope: &str, name: &str, a: Value, b: Value) -> Option<ConfoundDiff> {
    let (x, y) = (a.as_f64()?, b.as_f64()?);
    let base = x.abs().max(y.abs());
    let relative = if base == 0.0 { 0.0 } else { (y - x) / base };
    let severity = if relative.abs() > WARN_RATIO {
        Severity::Warning
    } else {
        Severity::Info
    };
    let note = if x == 0.0 && y == 0.0 {
        "both zero".to_string()
    } else if x == 0.0 {
        "zero in A".to_string()
    } else {
        format!("B {} of A", format::signed_percent((y - x) / x.abs()))
    };
    Some(confound(scope, name, a, b, severity, &note))
}

/// Peak concurrency per role and client, tokens/s and wall time of one arm or cell.
fn load_confounds(scope: &str, a: &ArmStats, b: &ArmStats, out: &mut Vec<ConfoundDiff>) {
    let peaks: BTreeSet<&String> = a.peak_running.keys().chain(b.peak_running.keys()).collect();
    for key in peaks {
        let name = format!("peak running ({key})");
        let (pa, pb) = (a.peak_running.get(key), b.peak_running.get(key));
        match (pa, pb) {
            (Some(x), Some(y)) => out.extend(numeric(scope, &name, json!(x), json!(y))),
            _ => out.push(confound(
                scope,
                &name,
                json!(pa),
                json!(pb),
                Severity::Warning,
                "recorded on one side only",
            )),
        }
    }
    out.extend(numeric(
        scope,
        "tokens/s",
        json!(a.tokens_per_s),
        json!(b.tokens_per_s),
    ));
    out.extend(numeric(
        scope,
        "wall time (s)",
        json!(a.wall_s),
        json!(b.wall_s),
    ));
    mechanism_confounds(scope, a, b, out);
}

/// What each witness of the flags' mechanisms counted (core::mechanism): a path that
/// ran on one side and not on the other is a warning whatever the numbers, since one
/// record's rate then says nothing of that path.
fn mechanism_confounds(scope: &str, a: &ArmStats, b: &ArmStats, out: &mut Vec<ConfoundDiff>) {
    use crate::core::mechanism::{MechanismRecord, WitnessReading};
    let find = |stats: &ArmStats, flag: &str, witness: &str| -> Option<(u64, u64)> {
        stats
            .mechanisms
            .iter()
            .filter(|r: &&MechanismRecord| r.flag == flag)
            .flat_map(|r| r.witnesses.iter())
            .find(|w: &&WitnessReading| w.witness == witness)
            .map(|w| (w.count, w.min))
    };
    let mut seen: Vec<(String, String, String)> = Vec::new();
    for r in a.mechanisms.iter().chain(&b.mechanisms) {
        for w in &r.witnesses {
            let key = (r.flag.clone(), r.name.clone(), w.witness.clone());
            if !seen.contains(&key) {
                seen.push(key);
            }
        }
    }
    for (flag, name, witness) in seen {
        let label = format!("mechanism {flag}: {name} ({witness})");
        let (x, y) = (find(a, &flag, &witness), find(b, &flag, &witness));
        match (x, y) {
            (Some((x, min)), Some((y, _))) if (x >= min) != (y >= min) => out.push(confound(
                scope,
                &label,
                json!(x),
                json!(y),
                Severity::Warning,
                &format!(
                    "the path ran (at least {min}) in {} only",
                    if x >= min { "A" } else { "B" }
                ),
            )),
            (Some((x, _)), Some((y, _))) => out.extend(numeric(scope, &label, json!(x), json!(y))),
            _ => out.push(confound(
                scope,
                &label,
                json!(x.map(|v| v.0)),
                json!(y.map(|v| v.0)),
                Severity::Warning,
                "counted on one side only",
            )),
        }
    }
}

/// A setting compared entry by entry: how a differing entry is named, how much it
/// matters and why.
struct Setting {
    prefix: &'static str,
    severity: Severity,
    note: &'static str,
}

impl Setting {
    const fn new(prefix: &'static str, severity: Severity, note: &'static str) -> Setting {
        Setting {
            prefix,
            severity,
            note,
        }
    }
}

/// Workload parameters: the rates are not comparable.
const WORKLOAD: Setting = Setting::new(
    "workload",
    Severity::Blocking,
    "workload parameters differ: the rates are not comparable",
);
const FLAG: Setting = Setting::new("flag", Severity::Warning, "a different flag definition");
/// Flags pinned in every arm or cell (`--set`, a plan's `[set]`).
const PINNED: Setting = Setting::new(
    "pinned",
    Severity::Warning,
    "another flag pinned differently",
);
const READBACK: Setting = Setting::new(
    "readback",
    Severity::Warning,
    "the launch config read back another value",
);
const TARGET: Setting = Setting::new("target", Severity::Info, "a different target profile");

/// One confound per entry of `setting` that differs between `a` and `b`.
fn setting_confounds<V: PartialEq + Serialize>(
    setting: &Setting,
    scope: &str,
    a: &BTreeMap<String, V>,
    b: &BTreeMap<String, V>,
    out: &mut Vec<ConfoundDiff>,
) {
    for (k, x, y) in differing(a, b) {
        out.push(confound(
            scope,
            &format!("{} {k}", setting.prefix),
            x,
            y,
            setting.severity,
            setting.note,
        ));
    }
}

/// What names a target for a comparison (its roles and profile path may move).
fn target_identity(t: &TargetInfo) -> BTreeMap<String, String> {
    [("name", &t.name), ("api", &t.api), ("model", &t.model)]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
}

/// What both kinds of record say about the deployment they measured.
struct Deployment<'a> {
    workload: &'a Value,
    pinned: &'a BTreeMap<String, String>,
    target: &'a TargetInfo,
}

impl Deployment<'_> {
    fn of_run(r: &RunRecord) -> Deployment<'_> {
        Deployment {
            workload: &r.workload,
            pinned: &r.sets,
            target: &r.header.target,
        }
    }

    fn of_matrix(m: &MatrixRecord) -> Deployment<'_> {
        Deployment {
            workload: &m.workload,
            pinned: &m.plan.set,
            target: &m.header.target,
        }
    }
}

fn deployment_confounds(scope: &str, a: Deployment, b: Deployment, out: &mut Vec<ConfoundDiff>) {
    let (wa, wb) = (fields(a.workload), fields(b.workload));
    setting_confounds(&WORKLOAD, scope, &wa, &wb, out);
    setting_confounds(&PINNED, scope, a.pinned, b.pinned, out);
    let (ta, tb) = (target_identity(a.target), target_identity(b.target));
    setting_confounds(&TARGET, scope, &ta, &tb, out);
}

pub(crate) fn run_confounds(a: &RunRecord, b: &RunRecord) -> Vec<ConfoundDiff> {
    let mut out = Vec::new();
    let (da, db) = (Deployment::of_run(a), Deployment::of_run(b));
    deployment_confounds("run", da, db, &mut out);
    let (fa, fb) = (fields_of(&a.flag), fields_of(&b.flag));
    setting_confounds(&FLAG, "run", &fa, &fb, &mut out);
    for (label, x, y) in pair(&a.arms, &b.arms, |arm| arm.label) {
        let (Some(x), Some(y)) = (x, y) else { continue };
        let scope = label.as_str();
        setting_confounds(&READBACK, scope, &x.readback, &y.readback, &mut out);
        load_confounds(scope, &x.stats, &y.stats, &mut out);
    }
    engine_info_confounds(&a.engine_info, &b.engine_info, &mut out);
    out
}

pub(crate) fn matrix_confounds(a: &MatrixRecord, b: &MatrixRecord) -> Vec<ConfoundDiff> {
    let mut out = Vec::new();
    let (da, db) = (Deployment::of_matrix(a), Deployment::of_matrix(b));
    deployment_confounds("matrix", da, db, &mut out);
    for (id, x, y) in pair(&a.cells, &b.cells, |c| c.id.clone()) {
        let (Some(x), Some(y)) = (x, y) else { continue };
        if x.config_hash != y.config_hash {
            out.push(confound(
                &id,
                "configuration hash",
                json!(x.config_hash),
                json!(y.config_hash),
                Severity::Warning,
                "the same cell id stands for another configuration (flag definitions changed)",
            ));
        }
        setting_confounds(&READBACK, &id, &x.readback, &y.readback, &mut out);
        load_confounds(&id, &x.stats, &y.stats, &mut out);
    }
    engine_info_confounds(&a.engine_info, &b.engine_info, &mut out);
    out
}

/// Leaves of a JSON tree as `path -> value` (`on-r0/prefill.env.X`).
fn leaves(prefix: &str, v: &Value, out: &mut BTreeMap<String, Value>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                leaves(&format!("{prefix}.{k}"), x, out);
            }
        }
        other => {
            out.insert(prefix.to_string(), other.clone());
        }
    }
}

/// Top-level `/server_info` keys that name the process, not its configuration: they
/// differ between any two runs by design (they prove a restart happened).
const IDENTITY_KEYS: [&str; 3] = ["pid", "ppid", "started_at"];

/// [`leaves`] of one block's engine info without the process's identity.
fn settings_leaves(block: &str, info: &Value, out: &mut BTreeMap<String, Value>) {
    match info {
        Value::Object(m) => {
            for (k, x) in m
                .iter()
                .filter(|(k, _)| !IDENTITY_KEYS.contains(&k.as_str()))
            {
                leaves(&format!("{block}.{k}"), x, out);
            }
        }
        other => leaves(block, other, out),
    }
}

/// `/server_info` per block and role (`on-r0/prefill` -> the JSON it served).
fn engine_info_confounds(
    a: &BTreeMap<String, Value>,
    b: &BTreeMap<String, Value>,
    out: &mut Vec<ConfoundDiff>,
) {
    // Only blocks present on both sides are compared: a run with more repeats has more
    // blocks, which is not an engine difference.
    let (mut la, mut lb) = (BTreeMap::new(), BTreeMap::new());
    for (block, info) in a.iter().filter(|(k, _)| b.contains_key(*k)) {
        settings_leaves(block, info, &mut la);
    }
    for (block, info) in b.iter().filter(|(k, _)| a.contains_key(*k)) {
        settings_leaves(block, info, &mut lb);
    }
    let differ = differing(&la, &lb);
    let more = differ.len().saturating_sub(MAX_ENGINE_INFO_DIFFS);
    for (k, x, y) in differ.into_iter().take(MAX_ENGINE_INFO_DIFFS) {
        out.push(confound(
            "engine",
            &k,
            x,
            y,
            Severity::Warning,
            "the engine reports a different setting",
        ));
    }
    if more > 0 {
        out.push(confound(
            "engine",
            "more engine info",
            Value::Null,
            Value::Null,
            Severity::Warning,
            &format!("{more} more differing /server_info values not listed"),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{cell, matrix, run};
    use super::*;

    fn names(confounds: &[ConfoundDiff]) -> Vec<(String, String, Severity)> {
        confounds
            .iter()
            .map(|c| (c.scope.clone(), c.name.clone(), c.severity))
            .collect()
    }

    #[test]
    fn a_path_that_ran_on_one_side_only_is_a_warning() {
        let record = |count: u64| {
            crate::core::testing::witnessed(
                ("DEFRAG", "defrag"),
                ("0.1", true),
                "log /requesting defrag/",
                count,
            )
        };
        let (mut a, mut b) = (run(14, 80, 80), run(14, 80, 80));
        a.arms[0].stats.mechanisms = vec![record(9)];
        b.arms[0].stats.mechanisms = vec![record(0)];
        let c = run_confounds(&a, &b);
        let found = c
            .iter()
            .find(|c| c.name == "mechanism DEFRAG: defrag (log /requesting defrag/)")
            .unwrap();
        assert_eq!(
            (found.severity, found.note.as_str()),
            (Severity::Warning, "the path ran (at least 1) in A only")
        );
        b.arms[0].stats.mechanisms = vec![record(7)];
        let c = run_confounds(&a, &b);
        assert!(c
            .iter()
            .any(|c| c.name.starts_with("mechanism DEFRAG") && c.severity == Severity::Info));
    }

    #[test]
    fn identical_load_is_info_only() {
        let c = run_confounds(&run(14, 80, 80), &run(0, 80, 80));
        assert!(c.iter().all(|c| c.severity == Severity::Info), "{c:?}");
    }

    #[test]
    fn load_and_workload_changes_are_confounds() {
        let mut b = run(14, 64, 30);
        b.engine_info
            .insert("on-r0/prefill".into(), json!({"env": {"X": "0"}, "pid": 1}));
        b.engine_info
            .insert("off-r1/prefill".into(), json!({"env": {"X": "9"}}));
        b.arms[1].readback.insert("decode".into(), "0".into());
        b.header.target.model = "another".into();
        b.sets.insert("OTHER_FLAG".into(), "1".into());
        let c = run_confounds(&run(14, 80, 80), &b);
        let names = names(&c);
        assert!(
            names.contains(&("run".into(), "workload sessions".into(), Severity::Blocking)),
            "{names:?}"
        );
        assert!(names.contains(&(
            "on".into(),
            "peak running (client)".into(),
            Severity::Warning
        )));
        assert!(names.contains(&("off".into(), "readback decode".into(), Severity::Warning)));
        assert!(names.contains(&("run".into(), "target model".into(), Severity::Info)));
        assert!(names.contains(&("run".into(), "pinned OTHER_FLAG".into(), Severity::Warning)));
        assert!(names.contains(&(
            "engine".into(),
            "on-r0/prefill.env.X".into(),
            Severity::Warning
        )));
        // A block only B ran is not an engine difference.
        assert!(
            !names.iter().any(|n| n.1.starts_with("off-r1")),
            "{names:?}"
        );
        let peak = c
            .iter()
            .find(|c| c.name == "peak running (client)")
            .unwrap();
        assert_eq!(peak.note, "B -62.5% of A");
        assert_eq!((peak.a.clone(), peak.b.clone()), (json!(80), json!(30)));
    }

    #[test]
    fn which_process_answered_is_not_an_engine_difference() {
        let mut a = run(1, 10, 5);
        let mut b = run(1, 10, 5);
        a.engine_info.insert(
            "on-r0/prefill".into(),
            json!({"pid": 1, "started_at": "t1", "x": 1}),
        );
        b.engine_info.insert(
            "on-r0/prefill".into(),
            json!({"pid": 2, "started_at": "t2", "x": 1}),
        );
        let c = run_confounds(&a, &b);
        assert!(!c.iter().any(|c| c.scope == "engine"), "{c:?}");
    }

    #[test]
    fn engine_info_is_capped() {
        let a = run(1, 10, 5);
        let mut b = run(1, 10, 5);
        let many: serde_json::Map<String, Value> =
            (0..50).map(|i| (format!("k{i:02}"), json!(i))).collect();
        b.engine_info
            .insert("on-r0/prefill".into(), Value::Object(many));
        let c = run_confounds(&a, &b);
        let engine: Vec<&ConfoundDiff> = c.iter().filter(|c| c.scope == "engine").collect();
        assert_eq!(engine.len(), MAX_ENGINE_INFO_DIFFS + 1);
        // 50 new keys and env.X gone differ; A's `pid` names the process, not a setting.
        assert!(
            engine.last().unwrap().note.starts_with("11 more"),
            "{engine:?}"
        );
    }

    #[test]
    fn matrix_cells_compare_with_their_own_counterpart() {
        let mut a_cells = vec![cell("x", 1, 16), cell("y", 1, 16)];
        a_cells[1].stats.peak_running.insert("client".into(), 4);
        let a = matrix(a_cells);
        let mut b = matrix(vec![cell("y", 1, 16), cell("x", 1, 16)]);
        b.cells[1].config_hash = "changed".into();
        b.workload["ctx"] = json!(500);
        let c = matrix_confounds(&a, &b);
        let names = names(&c);
        assert!(names.contains(&("matrix".into(), "workload ctx".into(), Severity::Blocking)));
        assert!(names.contains(&("x".into(), "configuration hash".into(), Severity::Warning)));
        // y's peak differs (4 vs 16): found only if y meets y, not x.
        assert!(
            names.contains(&(
                "y".into(),
                "peak running (client)".into(),
                Severity::Warning
            )),
            "{names:?}"
        );
        assert!(names.contains(&("x".into(), "peak running (client)".into(), Severity::Info)));
    }
}
