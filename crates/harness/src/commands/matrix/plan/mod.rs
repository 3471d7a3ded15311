//! PLAN.toml (`bisect matrix PLAN.toml`): which target, which workload, which flag values
//! and loads to cross (or an explicit cell list), load sweeps (`kind = "load"` cells,
//! [`load`]), pinned flags, repeats and the regression rule's thresholds. Every problem is a [`ConfigError`] naming the plan
//! file, the line of the offending key and the fix. `plans/nightly.toml` documents
//! every key.

use std::collections::BTreeSet;
use std::fmt;
use std::marker::PhantomData;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use toml::Spanned;

use super::cells::{self, Cell};

mod load;
mod policy;
pub(crate) mod spec;

use crate::config::workload::DEFAULT_WORKLOAD;
use crate::config::Pin;
use crate::config::{
    read_text, validate_value, ConfigError, FlagCatalog, FlagSpec, Setting, Source, Workload,
};
use policy::regression_policy;
pub use spec::{CellSpec, Layout, LoadSweep, RegressionPolicy};

/// A validated plan: flags resolved through the catalog, workload loaded, cells expanded.
#[derive(Debug, Clone)]
pub struct Plan {
    pub name: String,
    /// The plan file, as given.
    pub source: PathBuf,
    /// Target profile path (resolved against the plan's directory); `None` = embedded.
    pub target: Option<PathBuf>,
    /// The workload every cell runs, before the cell's sessions/rounds are set.
    pub workload: Workload,
    /// Flags pinned to one value in every cell (`[set]`).
    pub pins: Vec<Pin>,
    /// Blocks per cell, pooled.
    pub repeats: u32,
    pub policy: RegressionPolicy,
    /// Every cell of the plan, grouped by restart group, in execution order.
    pub cells: Vec<Cell>,
    /// `[commits]`: what `bisect history --auto-bisect` searches with.
    pub commits: Option<CommitsSpec>,
}

const PLAN_FIX: &str = "see plans/nightly.toml for every key of a plan";

/// A TOML scalar accepted as a flag value: strings, and integers/booleans for convenience.
#[derive(Deserialize)]
#[serde(untagged)]
enum RawValue {
    Text(String),
    Integer(i64),
    Bool(bool),
}

impl RawValue {
    fn text(&self) -> String {
        match self {
            RawValue::Text(s) => s.clone(),
            RawValue::Integer(i) => i.to_string(),
            RawValue::Bool(b) => b.to_string(),
        }
    }
}

/// A TOML table kept in file order with spanned values (toml's own map type is not
/// generic over its values, and the axes' order decides the cells' order).
struct Ordered<V>(Vec<(String, V)>);

impl<'de, V: Deserialize<'de>> Deserialize<'de> for Ordered<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct OrderedVisitor<V>(PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for OrderedVisitor<V> {
            type Value = Ordered<V>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a table")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut entries = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, V>()? {
                    entries.push((k, v));
                }
                Ok(Ordered(entries))
            }
        }
        deserializer.deserialize_map(OrderedVisitor(PhantomData))
    }
}

/// One axis: its values, each spanned for its own error line.
type RawAxis = Spanned<Vec<Spanned<RawValue>>>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPlan {
    name: Option<Spanned<String>>,
    target: Option<Spanned<String>>,
    workload: Option<Spanned<String>>,
    #[serde(default)]
    flags_dir: Vec<Spanned<String>>,
    axes: Option<Spanned<Ordered<RawAxis>>>,
    sessions: Option<Spanned<Vec<Spanned<i64>>>>,
    rounds: Option<Spanned<Vec<Spanned<i64>>>>,
    #[serde(default)]
    cell: Vec<Spanned<RawCell>>,
    set: Option<Ordered<Spanned<RawValue>>>,
    repeats: Option<Spanned<i64>>,
    alpha: Option<Spanned<f64>>,
    min_effect: Option<Spanned<f64>>,
    tokens_per_s_noise: Option<Spanned<f64>>,
    degraded_fraction: Option<Spanned<f64>>,
    ctx: Option<Spanned<i64>>,
    max_tokens: Option<Spanned<i64>>,
    timeout_s: Option<Spanned<f64>>,
    seed: Option<Spanned<i64>>,
    commits: Option<Spanned<RawCommits>>,
}

/// `[commits]`: how `bisect history --auto-bisect` searches a regression's builds.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCommits {
    repo: Spanned<String>,
    build: Option<Spanned<String>>,
    artifact: Option<Spanned<String>>,
    sessions: Option<Spanned<i64>>,
    max_sessions: Option<Spanned<i64>>,
}

/// How a regression's builds are searched (`[commits]`, docs/history.md): the engine's
/// repository and its build (or artifact) command, as `bisect commits` takes them.
#[derive(Debug, Clone, PartialEq)]
pub struct CommitsSpec {
    /// The repository, resolved against the plan's directory.
    pub repo: PathBuf,
    pub build: crate::commands::commits::build::BuildStep,
    /// Sessions per block of the search; default: the cell's sessions.
    pub sessions: Option<u32>,
    /// The search's budget; default: `bisect commits`' own.
    pub max_sessions: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCell {
    /// `"load"`: a load sweep ([`load`]); absent: flag values at one load.
    kind: Option<Spanned<String>>,
    flags: Option<Spanned<Ordered<Spanned<RawValue>>>>,
    sessions: Option<Spanned<i64>>,
    rounds: Option<Spanned<i64>>,
    levels: Option<Spanned<Vec<Spanned<i64>>>>,
    flag: Option<Spanned<String>>,
    max_sessions: Option<Spanned<i64>>,
}

impl Plan {
    /// Load and validate a plan file.
    pub fn load(path: &Path) -> Result<Plan, ConfigError> {
        let text = read_text(path)?;
        Plan::parse(path, &text)
    }

    /// Validate plan text; relative paths inside it resolve against `path`'s directory.
    pub fn parse(path: &Path, text: &str) -> Result<Plan, ConfigError> {
        let src = Source { path, text };
        let raw: RawPlan = src.parse(PLAN_FIX)?;
        let base = path.parent().unwrap_or(Path::new(""));
        let name = plan_name(&src, raw.name.as_ref())?;
        let catalog = load_catalog(&src, base, &raw.flags_dir)?;
        let target = target_path(&src, base, raw.target.as_ref())?;
        let workload = load_workload(&src, base, &raw)?;
        let flags = FlagValues {
            src: &src,
            catalog: &catalog,
        };
        let pins = flags.pinned(raw.set.as_ref())?;
        let (plain, loads) = load::partition(&src, &raw.cell)?;
        let layout = match (&raw.axes, plain.is_empty()) {
            (Some(axes), false) => {
                return Err(src.invalid(
                    axes.span(),
                    "the plan has both [axes] and [[cell]] entries of flag values",
                    "use [axes] (crossed) or an explicit [[cell]] list, not both (kind = \"load\" cells go with either)",
                ))
            }
            (None, true) if loads.is_empty() => {
                return Err(src.invalid(
                    0..0,
                    "the plan has neither [axes] nor [[cell]]",
                    "add [axes] FLAG = [\"on-value\", \"off-value\"] and sessions = [1, 16], or [[cell]] entries",
                ))
            }
            (Some(axes), true) => flags.axes(axes.get_ref(), &raw, workload.sessions)?,
            (None, _) => flags.explicit_cells(&raw, &plain)?,
        };
        flags.check_pins_not_varied(raw.set.as_ref(), &pins, &layout)?;
        let loads = flags.load_cells(&loads, &layout, &pins, workload.sessions)?;
        let repeats = match &raw.repeats {
            Some(r) => src.whole_number("repeats", r, 1)?,
            None => 1,
        };
        let policy = regression_policy(&src, &raw)?;
        let cells =
            cells::expand(&layout, &loads, workload.rounds, &policy).map_err(|message| {
                let span = raw
                    .axes
                    .as_ref()
                    .map(|a| a.span())
                    .or_else(|| raw.cell.first().map(|c| c.span()))
                    .unwrap_or(0..0);
                src.invalid(
                    span,
                    message,
                    "make every cell's flag values, sessions and rounds distinct",
                )
            })?;
        let commits = commits_spec(&src, base, raw.commits.as_ref())?;
        Ok(Plan {
            name,
            source: path.to_path_buf(),
            target,
            workload,
            pins,
            repeats,
            policy,
            cells,
            commits,
        })
    }

    /// Hash of what makes two nights' cells comparable beyond their own configuration:
    /// every workload parameter except sessions and rounds (those are per cell).
    pub fn workload_hash(&self) -> String {
        cells::workload_hash(&self.workload)
    }

    /// Hash of everything that must agree between shards of one matrix: name, workload,
    /// pinned flags, repeats, thresholds and the cells (ids and configurations).
    pub fn hash(&self) -> String {
        let doc = serde_json::json!({
            "name": self.name,
            "target": self.target.as_ref().map(|p| p.display().to_string()),
            "workload_hash": self.workload_hash(),
            "set": self.pins.iter().map(|p| (p.flag.name.clone(), p.value.clone())).collect::<Vec<_>>(),
            "repeats": self.repeats,
            "policy": self.policy,
            "cells": self.cells.iter().map(|c| (c.id.clone(), c.config_hash.clone())).collect::<Vec<_>>(),
        });
        cells::stable_hash(&doc.to_string())
    }
}

/// `name`: file-name-safe, since results directories and baselines are found by it.
fn plan_name(src: &Source, name: Option<&Spanned<String>>) -> Result<String, ConfigError> {
    let Some(n) = name else {
        return Err(src.invalid(
            0..0,
            "the plan has no name",
            "add name = \"nightly\": baselines are found by plan name",
        ));
    };
    let v = n.get_ref().trim();
    let valid = !v.is_empty()
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if !valid {
        return Err(src.invalid(
            n.span(),
            format!("plan name {v:?} is empty or has characters other than letters, digits and . _ -"),
            "name the plan like a file, e.g. name = \"nightly\" (results directories and baselines use it)",
        ));
    }
    Ok(v.to_string())
}

/// The flag catalog with the plan's `flags_dir` entries (relative to the plan) on top.
fn load_catalog(
    src: &Source,
    base: &Path,
    flags_dir: &[Spanned<String>],
) -> Result<FlagCatalog, ConfigError> {
    let mut dirs = Vec::new();
    for raw_dir in flags_dir {
        let dir = base.join(raw_dir.get_ref());
        if !dir.is_dir() {
            return Err(src.invalid(
                raw_dir.span(),
                format!(
                    "flags_dir {} is not a directory (resolved relative to this plan)",
                    dir.display()
                ),
                "point flags_dir at a directory of flag catalog files, or remove it",
            ));
        }
        dirs.push(dir);
    }
    FlagCatalog::load(&dirs)
}

/// `target`, resolved against the plan's directory; `None` runs the embedded engine.
fn target_path(
    src: &Source,
    base: &Path,
    target: Option<&Spanned<String>>,
) -> Result<Option<PathBuf>, ConfigError> {
    let Some(t) = target else { return Ok(None) };
    let p = base.join(t.get_ref());
    if !p.is_file() {
        return Err(src.invalid(
            t.span(),
            format!(
                "target profile {} does not exist (resolved relative to this plan)",
                p.display()
            ),
            "point target at a target profile TOML, or remove it to run the embedded engine",
        ));
    }
    Ok(Some(p))
}

/// `[commits]`, checked: a git repository, exactly one of `build` and `artifact`.
fn commits_spec(
    src: &Source,
    base: &Path,
    raw: Option<&Spanned<RawCommits>>,
) -> Result<Option<CommitsSpec>, ConfigError> {
    use crate::commands::commits::build::BuildStep;
    let Some(raw) = raw else { return Ok(None) };
    let table = raw.get_ref();
    let repo = base.join(table.repo.get_ref());
    if !repo.join(".git").exists() {
        return Err(src.invalid(
            table.repo.span(),
            format!(
                "[commits] repo {} is not a git repository (resolved relative to this plan)",
                repo.display()
            ),
            "point repo at the engine's git checkout (the one its launch configs come from)",
        ));
    }
    let build = match (&table.build, &table.artifact) {
        (Some(b), None) => BuildStep::Build(b.get_ref().clone()),
        (None, Some(a)) => BuildStep::Artifact(a.get_ref().clone()),
        _ => {
            return Err(src.invalid(
                raw.span(),
                "[commits] needs exactly one of build and artifact",
                "add build = \"make\" (run in each commit's worktree) or artifact = \"install {commit}\"",
            ))
        }
    };
    let sessions = match &table.sessions {
        Some(n) => Some(src.whole_number("sessions", n, 1)?),
        None => None,
    };
    let max_sessions = match &table.max_sessions {
        Some(n) => Some(u64::from(src.whole_number("max_sessions", n, 1)?)),
        None => None,
    };
    Ok(Some(CommitsSpec {
        repo,
        build,
        sessions,
        max_sessions,
    }))
}

/// `workload` (a builtin name, or a file relative to the plan; default `agentic`) with
/// the plan's `ctx`, `max_tokens`, `timeout_s` and `seed` on top.
fn load_workload(src: &Source, base: &Path, raw: &RawPlan) -> Result<Workload, ConfigError> {
    let mut workload = match &raw.workload {
        None => crate::config::load_workload(DEFAULT_WORKLOAD)?,
        Some(w) => {
            let given = w.get_ref().trim();
            let is_path = given.contains('/') || given.ends_with(".toml");
            let resolved = if is_path {
                base.join(given).display().to_string()
            } else {
                given.to_string()
            };
            crate::config::load_workload(&resolved).map_err(|e| match e {
                ConfigError::UnknownWorkload { name, known } => src.invalid(
                    w.span(),
                    format!("unknown workload `{name}`"),
                    format!("use one of {known}, or a path to a workload TOML file"),
                ),
                other => other,
            })?
        }
    };
    if let Some(v) = &raw.ctx {
        workload.ctx = src.whole_number("ctx", v, 0)?;
    }
    if let Some(v) = &raw.max_tokens {
        workload.max_tokens = src.whole_number("max_tokens", v, 1)?;
    }
    if let Some(v) = &raw.timeout_s {
        let t = *v.get_ref();
        if !(t.is_finite() && t > 0.0) {
            return Err(src.invalid(
                v.span(),
                format!("timeout_s = {t} must be a positive number of seconds"),
                "e.g. timeout_s = 60",
            ));
        }
        workload.timeout_s = t;
    }
    if let Some(v) = &raw.seed {
        if *v.get_ref() < 0 {
            return Err(src.invalid(v.span(), "seed must not be negative", "e.g. seed = 1"));
        }
        workload.seed = *v.get_ref() as u64;
    }
    Ok(workload)
}

/// Flag names and values as the plan writes them, resolved through the catalog: the
/// pinned `[set]`, the `[axes]` and the `[[cell]]` flags.
struct FlagValues<'a> {
    src: &'a Source<'a>,
    catalog: &'a FlagCatalog,
}

impl FlagValues<'_> {
    fn flag(&self, name: &str, span: Range<usize>) -> Result<FlagSpec, ConfigError> {
        self.catalog.get(name).cloned().map_err(|_| {
            self.src.invalid(
                span,
                format!("unknown flag `{name}`"),
                format!(
                    "use a catalog name ({}), or add its file to a flags_dir",
                    self.catalog.names().join(", ")
                ),
            )
        })
    }

    /// A plain value; for a switch, one of its two labels.
    fn value(&self, f: &FlagSpec, v: &Spanned<RawValue>) -> Result<String, ConfigError> {
        let text = v.get_ref().text();
        validate_value(&text).map_err(|e| {
            self.src.invalid(
                v.span(),
                format!("flag {}: {e}", f.name),
                "use a plain value",
            )
        })?;
        if matches!(f.setting, Setting::Switch(_)) && text != f.on && text != f.off {
            return Err(self.src.invalid(
                v.span(),
                format!(
                    "flag {} is a switch: value {text:?} is neither {:?} nor {:?}",
                    f.name, f.on, f.off
                ),
                format!(
                    "use \"{}\" (switch present) or \"{}\" (absent)",
                    f.on, f.off
                ),
            ));
        }
        Ok(text)
    }

    /// A table of `FLAG = value`, each flag once (`twice` ends the message for a repeat).
    fn assignments(
        &self,
        table: &Ordered<Spanned<RawValue>>,
        twice: &str,
    ) -> Result<Vec<Pin>, ConfigError> {
        let mut out: Vec<Pin> = Vec::new();
        for (k, v) in &table.0 {
            let f = self.flag(k, v.span())?;
            if out.iter().any(|p| p.flag.name == f.name) {
                return Err(self.src.invalid(
                    v.span(),
                    format!("flag {} {twice}", f.name),
                    "name each flag once",
                ));
            }
            let val = self.value(&f, v)?;
            out.push(Pin::new(f, val));
        }
        Ok(out)
    }

    /// `[set]`: flags pinned to one value in every cell.
    fn pinned(&self, set: Option<&Ordered<Spanned<RawValue>>>) -> Result<Vec<Pin>, ConfigError> {
        match set {
            Some(table) => self.assignments(table, "is pinned twice"),
            None => Ok(Vec::new()),
        }
    }

    /// `[axes]` crossed with the `sessions` and `rounds` axes.
    fn axes(
        &self,
        axes: &Ordered<RawAxis>,
        raw: &RawPlan,
        default_sessions: u32,
    ) -> Result<Layout, ConfigError> {
        let src = self.src;
        let mut flags: Vec<(FlagSpec, Vec<String>)> = Vec::new();
        for (k, values) in &axes.0 {
            let f = self.flag(k, values.span())?;
            if flags.iter().any(|(g, _)| g.name == f.name) {
                return Err(src.invalid(
                    values.span(),
                    format!("flag {} is an axis twice", f.name),
                    "name each flag once",
                ));
            }
            if values.get_ref().is_empty() {
                return Err(src.invalid(
                    values.span(),
                    format!("axis {k} has no values"),
                    format!("e.g. {k} = [\"{}\", \"{}\"]", f.on, f.off),
                ));
            }
            let mut seen = BTreeSet::new();
            let mut vals = Vec::new();
            for v in values.get_ref() {
                let text = self.value(&f, v)?;
                if !seen.insert(text.clone()) {
                    return Err(src.invalid(
                        v.span(),
                        format!("axis {k} lists {text:?} twice"),
                        "list each value once",
                    ));
                }
                vals.push(text);
            }
            flags.push((f, vals));
        }
        let sessions = match &raw.sessions {
            Some(s) => counts(src, "sessions", s, 1)?,
            None => vec![default_sessions],
        };
        let rounds = match &raw.rounds {
            Some(r) => Some(counts(src, "rounds", r, 1)?),
            None => None,
        };
        Ok(Layout::Axes {
            flags,
            sessions,
            rounds,
        })
    }

    /// `[[cell]]`: an explicit list, every cell naming the same flags.
    fn explicit_cells(
        &self,
        raw: &RawPlan,
        cells: &[&Spanned<RawCell>],
    ) -> Result<Layout, ConfigError> {
        let src = self.src;
        if let Some(s) = &raw.sessions {
            return Err(src.invalid(
                s.span(),
                "sessions = [...] is an axis; with [[cell]] each cell sets its own",
                "move sessions into every [[cell]]",
            ));
        }
        if let Some(r) = &raw.rounds {
            return Err(src.invalid(
                r.span(),
                "rounds = [...] is an axis; with [[cell]] each cell sets its own",
                "move rounds into the [[cell]] entries",
            ));
        }
        let mut specs: Vec<CellSpec> = Vec::new();
        let mut first_names: Option<Vec<String>> = None;
        for raw_cell in cells {
            let c = raw_cell.get_ref();
            let missing = |key: &str, fix: &str| {
                src.invalid(
                    raw_cell.span(),
                    format!("this [[cell]] has no {key}"),
                    format!("add {fix}, or kind = \"load\" with levels = [...] for a load sweep"),
                )
            };
            let table = c
                .flags
                .as_ref()
                .ok_or_else(|| missing("flags", "flags = { NAME = \"value\" }"))?;
            let raw_sessions = c
                .sessions
                .as_ref()
                .ok_or_else(|| missing("sessions", "sessions = 16"))?;
            let flags = self.assignments(table.get_ref(), "is set twice in this cell")?;
            let mut names: Vec<String> = flags.iter().map(|p| p.flag.name.clone()).collect();
            names.sort();
            // A flag named by some cells only would keep the previous group's value
            // in the others: their configuration would depend on execution order.
            match &first_names {
                None => first_names = Some(names),
                Some(first) if *first != names => {
                    return Err(src.invalid(
                        table.span(),
                        format!(
                            "this cell sets flags [{}] but the first cell sets [{}]",
                            names.join(", "),
                            first.join(", ")
                        ),
                        "give every [[cell]] a value for the same flags (pin flags common to all cells under [set])",
                    ))
                }
                Some(_) => {}
            }
            let sessions = src.whole_number("sessions", raw_sessions, 1)?;
            let rounds = match &c.rounds {
                Some(r) => Some(src.whole_number("rounds", r, 1)?),
                None => None,
            };
            specs.push(CellSpec {
                flags,
                sessions,
                rounds,
            });
        }
        Ok(Layout::Cells(specs))
    }

    /// A flag is either pinned under `[set]` or varied by the cells, never both.
    fn check_pins_not_varied(
        &self,
        set: Option<&Ordered<Spanned<RawValue>>>,
        sets: &[Pin],
        layout: &Layout,
    ) -> Result<(), ConfigError> {
        for Pin { flag: f, .. } in sets {
            let clash = match layout {
                Layout::Axes { flags, .. } => flags.iter().any(|(g, _)| g.name == f.name),
                Layout::Cells(specs) => specs
                    .iter()
                    .any(|c| c.flags.iter().any(|p| p.flag.name == f.name)),
            };
            if clash {
                let span = set
                    .and_then(|t| {
                        t.0.iter()
                            .find(|(k, _)| self.catalog.get(k).is_ok_and(|g| g.name == f.name))
                            .map(|(_, v)| v.span())
                    })
                    .unwrap_or(0..0);
                return Err(self.src.invalid(
                    span,
                    format!(
                        "flag {} is both pinned under [set] and varied by the cells",
                        f.name
                    ),
                    "pin it or vary it, not both",
                ));
            }
        }
        Ok(())
    }
}

fn counts(
    src: &Source,
    key: &str,
    list: &Spanned<Vec<Spanned<i64>>>,
    min: i64,
) -> Result<Vec<u32>, ConfigError> {
    if list.get_ref().is_empty() {
        return Err(src.invalid(
            list.span(),
            format!("{key} = [] has no values"),
            format!("e.g. {key} = [1, 16, 64]"),
        ));
    }
    let mut out = Vec::new();
    for v in list.get_ref() {
        let n = src.whole_number(key, v, min)?;
        if out.contains(&n) {
            return Err(src.invalid(
                v.span(),
                format!("{key} lists {n} twice"),
                "list each value once",
            ));
        }
        out.push(n);
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
