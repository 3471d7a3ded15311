//! Cells of a matrix: expansion of a plan's axes (or its explicit list) into cells with
//! deterministic ids and configuration hashes, grouping into restart groups, and the
//! `--shard I/N` subset.
//!
//! A restart group is the set of cells sharing every flag value: the engines restart
//! once per group and the group's session counts (and rounds) run back to back. Shards
//! take whole groups, round-robin by group index (group g runs in shard g mod N), so a
//! shard never restarts for a group another shard also runs, and the union of the N
//! shards is the plan exactly once.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use super::plan::spec::{CellSpec, Layout, LoadCellSpec, LoadSweep, RegressionPolicy};
use crate::config::Pin;
use crate::config::{FlagSpec, Workload};
use crate::core::load::Allocation;

/// One configuration run: flag values, sessions and rounds.
#[derive(Debug, Clone, PartialEq)]
pub struct Cell {
    /// `FLAG=value,...,s<sessions>[,r<rounds>]`, in the plan's flag order.
    pub id: String,
    /// Index of its restart group (0-based, execution order).
    pub group: usize,
    pub flags: Vec<Pin>,
    pub sessions: u32,
    pub rounds: u32,
    /// Hash of flag values + sessions + rounds (a load cell: + its sweep and the
    /// plan's alpha and min_effect, which decide its answer): a cell is comparable with
    /// a baseline cell only when these agree.
    pub config_hash: String,
    /// A load cell (`kind = "load"`): the sweep it runs; `flags` are then its fixed
    /// flags and `sessions` the sessions per level (adaptive: the cap).
    pub load: Option<LoadSweep>,
}

impl Cell {
    /// Flag values by catalog name, for records.
    pub fn flag_values(&self) -> BTreeMap<String, String> {
        self.flags
            .iter()
            .map(|p| (p.flag.name.clone(), p.value.clone()))
            .collect()
    }
}

/// Expand a layout into grouped cells, then the load cells, each a restart group of its
/// own after them. Errors (as text) when two cells get the same id.
pub(crate) fn expand(
    layout: &Layout,
    loads: &[LoadCellSpec],
    default_rounds: u32,
    policy: &RegressionPolicy,
) -> Result<Vec<Cell>, String> {
    let mut cells = group(cell_specs(layout), default_rounds);
    let groups = cells.last().map_or(0, |c| c.group + 1);
    for (i, spec) in loads.iter().enumerate() {
        cells.push(load_cell(spec, groups + i, default_rounds, policy));
    }
    let mut seen = std::collections::BTreeSet::new();
    for c in &cells {
        if !seen.insert(c.id.as_str()) {
            return Err(format!(
                "two cells have the same configuration (id {})",
                c.id
            ));
        }
    }
    Ok(cells)
}

/// Every cell of a layout in plan order: axes crossed in file order, then rounds, then
/// sessions (innermost); an explicit list as it is.
fn cell_specs(layout: &Layout) -> Vec<CellSpec> {
    let mut specs: Vec<CellSpec> = Vec::new();
    match layout {
        Layout::Axes {
            flags,
            sessions,
            rounds,
        } => {
            let mut combos: Vec<Vec<Pin>> = vec![Vec::new()];
            for (flag, values) in flags {
                combos = combos
                    .into_iter()
                    .flat_map(|combo| {
                        values.iter().map(move |v| {
                            let mut next = combo.clone();
                            next.push(Pin::new(flag.clone(), v.clone()));
                            next
                        })
                    })
                    .collect();
            }
            let round_values: Vec<Option<u32>> = match rounds {
                Some(r) => r.iter().copied().map(Some).collect(),
                None => vec![None],
            };
            for combo in &combos {
                for r in &round_values {
                    for s in sessions {
                        specs.push(CellSpec {
                            flags: combo.clone(),
                            sessions: *s,
                            rounds: *r,
                        });
                    }
                }
            }
        }
        Layout::Cells(list) => {
            specs.extend(list.iter().cloned());
        }
    }
    specs
}

/// Cells grouped by flag values (order-insensitive), groups in order of first appearance.
fn group(specs: Vec<CellSpec>, default_rounds: u32) -> Vec<Cell> {
    let key = |flags: &[Pin]| -> BTreeMap<String, String> {
        flags
            .iter()
            .map(|p| (p.flag.name.clone(), p.value.clone()))
            .collect()
    };
    let mut group_keys: Vec<BTreeMap<String, String>> = Vec::new();
    let mut grouped: Vec<Vec<Cell>> = Vec::new();
    for CellSpec {
        flags,
        sessions,
        rounds,
    } in specs
    {
        let k = key(&flags);
        let group = match group_keys.iter().position(|g| *g == k) {
            Some(i) => i,
            None => {
                group_keys.push(k);
                grouped.push(Vec::new());
                group_keys.len() - 1
            }
        };
        let rounds_used = rounds.unwrap_or(default_rounds);
        grouped[group].push(Cell {
            id: cell_id(&flags, sessions, rounds),
            group,
            config_hash: config_hash(&flags, sessions, rounds_used),
            flags,
            sessions,
            rounds: rounds_used,
            load: None,
        });
    }
    grouped.into_iter().flatten().collect()
}

/// A load cell: `load,[ab=FLAG,]FIXED=value,...,l1+16+64,s80|max480[,r6]`.
fn load_cell(
    spec: &LoadCellSpec,
    group: usize,
    default_rounds: u32,
    policy: &RegressionPolicy,
) -> Cell {
    let sweep = &spec.sweep;
    let sessions = match sweep.allocation {
        Allocation::Fixed { sessions } => sessions,
        Allocation::Adaptive { max_sessions } => max_sessions,
    };
    let sessions = u32::try_from(sessions).unwrap_or(u32::MAX);
    let mut head: Vec<String> = vec!["load".into()];
    head.extend(sweep.flag.iter().map(|f| format!("ab={}", f.name)));
    let levels: Vec<String> = sweep.levels.iter().map(u32::to_string).collect();
    let mut tail = vec![format!("l{}", levels.join("+"))];
    tail.push(match sweep.allocation {
        Allocation::Fixed { .. } => format!("s{sessions}"),
        Allocation::Adaptive { .. } => format!("max{sessions}"),
    });
    tail.extend(spec.rounds.map(|r| format!("r{r}")));
    let rounds = spec.rounds.unwrap_or(default_rounds);
    let mut hashed = config_doc(&spec.fixed, sessions, rounds);
    hashed["load"] = serde_json::json!({
        "levels": sweep.levels,
        "flag": sweep.flag.as_ref().map(setting),
        "allocation": sweep.allocation,
        "alpha": policy.alpha,
        "min_effect": policy.min_effect,
    });
    Cell {
        id: safe_id([head, flag_parts(&spec.fixed), tail].concat()),
        group,
        flags: spec.fixed.clone(),
        sessions,
        rounds,
        config_hash: stable_hash(&hashed.to_string()),
        load: Some(sweep.clone()),
    }
}

/// `FLAG=value,...,s<sessions>[,r<rounds>]`.
fn cell_id(flags: &[Pin], sessions: u32, rounds: Option<u32>) -> String {
    let mut parts = flag_parts(flags);
    parts.push(format!("s{sessions}"));
    if let Some(r) = rounds {
        parts.push(format!("r{r}"));
    }
    safe_id(parts)
}

fn flag_parts(flags: &[Pin]) -> Vec<String> {
    flags.iter().map(Pin::words).collect()
}

/// Directory-safe id: characters a value may hold but a path should not (`/`, `:`) become `_`.
fn safe_id(parts: Vec<String>) -> String {
    parts
        .join(",")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._=+,-".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn config_hash(flags: &[Pin], sessions: u32, rounds: u32) -> String {
    stable_hash(&config_doc(flags, sessions, rounds).to_string())
}

/// What a cell's configuration hash covers: flag values and settings, sessions, rounds.
fn config_doc(flags: &[Pin], sessions: u32, rounds: u32) -> serde_json::Value {
    let values: BTreeMap<String, String> = flags
        .iter()
        .map(|p| (p.flag.name.clone(), p.value.clone()))
        .collect();
    // The setting (env/arg/switch key and roles) is part of the configuration: the same
    // catalog name pointing at another variable is another experiment.
    let settings: BTreeMap<String, (String, String, Vec<String>)> = flags
        .iter()
        .map(|p| (p.flag.name.clone(), setting(&p.flag)))
        .collect();
    serde_json::json!({
        "flags": values,
        "settings": settings,
        "sessions": sessions,
        "rounds": rounds,
    })
}

fn setting(f: &FlagSpec) -> (String, String, Vec<String>) {
    (
        f.setting.kind().to_string(),
        f.setting.key().to_string(),
        f.roles.clone(),
    )
}

/// Hash of every workload parameter that shapes the sessions, except sessions and rounds.
pub fn workload_hash(w: &Workload) -> String {
    let mut params = w.params_json();
    if let Some(obj) = params.as_object_mut() {
        obj.remove("sessions");
        obj.remove("rounds");
    }
    let tools: Vec<serde_json::Value> = w
        .tools
        .iter()
        .map(|t| {
            serde_json::json!({
                "name": t.name,
                "description": t.description,
                "parameters": t.parameters,
                "arg_values": t.arg_values,
                "result": t.result,
            })
        })
        .collect();
    let doc = serde_json::json!({
        "params": params,
        "tools": tools,
        "task": {"steps": w.task.steps, "intro": w.task.intro, "outro": w.task.outro},
    });
    stable_hash(&doc.to_string())
}

/// 64-bit FNV-1a as 16 hex digits: stable across runs, platforms and Rust versions
/// (std's hasher is not), which matters because hashes are compared across nights.
pub(crate) fn stable_hash(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// `--shard I/N`: shard `index` (0-based) of `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Shard {
    pub index: u32,
    pub count: u32,
}

impl Shard {
    /// Whether restart group `group` runs in this shard.
    pub(crate) fn owns_group(&self, group: usize) -> bool {
        group as u64 % self.count as u64 == self.index as u64
    }

    /// The cells of this shard, in plan order.
    pub fn select<'a>(&self, cells: &'a [Cell]) -> Vec<&'a Cell> {
        cells.iter().filter(|c| self.owns_group(c.group)).collect()
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.index, self.count)
    }
}

impl FromStr for Shard {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (i, n) = s
            .split_once('/')
            .ok_or_else(|| format!("--shard {s}: expected I/N, e.g. 0/3"))?;
        let index: u32 = i
            .trim()
            .parse()
            .map_err(|_| format!("--shard {s}: I is not a whole number"))?;
        let count: u32 = n
            .trim()
            .parse()
            .map_err(|_| format!("--shard {s}: N is not a whole number"))?;
        if count == 0 || index >= count {
            return Err(format!(
                "--shard {s}: need 0 <= I < N (shards are numbered from 0, as SLURM_ARRAY_TASK_ID and JOB_COMPLETION_INDEX are)"
            ));
        }
        Ok(Shard { index, count })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FlagCatalog;

    fn axes(sessions: Vec<u32>) -> Layout {
        let c = FlagCatalog::builtin();
        Layout::Axes {
            flags: vec![
                (
                    c.get("BF16_INDEX_K").unwrap().clone(),
                    vec!["1".into(), "0".into()],
                ),
                (
                    c.get("HICACHE").unwrap().clone(),
                    vec!["on".into(), "off".into()],
                ),
                (
                    c.get("CUDA_GRAPH_MAX_BS").unwrap().clone(),
                    vec!["32".into(), "64".into(), "16".into()],
                ),
            ],
            sessions,
            rounds: None,
        }
    }

    #[test]
    fn shards_partition_whole_groups() {
        let cells = expand(&axes(vec![1, 16, 64]), &[], 4, &RegressionPolicy::default()).unwrap();
        assert_eq!(cells.len(), 36);
        assert_eq!(cells.last().unwrap().group, 11);
        for n in 1..=13u32 {
            let mut seen: Vec<&str> = Vec::new();
            for i in 0..n {
                let shard = Shard { index: i, count: n };
                let mine = shard.select(&cells);
                for c in &mine {
                    assert!(
                        cells
                            .iter()
                            .filter(|o| o.group == c.group)
                            .all(|o| mine.contains(&o)),
                        "shard {shard} splits group {}",
                        c.group
                    );
                }
                seen.extend(mine.iter().map(|c| c.id.as_str()));
            }
            seen.sort();
            let mut all: Vec<&str> = cells.iter().map(|c| c.id.as_str()).collect();
            all.sort();
            assert_eq!(seen, all, "{n} shards cover every cell exactly once");
        }
    }

    #[test]
    fn ids_and_hashes_are_deterministic_and_distinct() {
        let a = expand(&axes(vec![1, 16]), &[], 4, &RegressionPolicy::default()).unwrap();
        let b = expand(&axes(vec![1, 16]), &[], 4, &RegressionPolicy::default()).unwrap();
        assert_eq!(a, b);
        assert_eq!(a[0].id, "BF16_INDEX_K=1,HICACHE=on,CUDA_GRAPH_MAX_BS=32,s1");
        let mut hashes: Vec<&str> = a.iter().map(|c| c.config_hash.as_str()).collect();
        hashes.sort();
        hashes.dedup();
        assert_eq!(hashes.len(), a.len());
        // Rounds are configuration even when they are not an axis.
        let c = expand(&axes(vec![1, 16]), &[], 6, &RegressionPolicy::default()).unwrap();
        assert_eq!(a[0].id, c[0].id);
        assert_ne!(a[0].config_hash, c[0].config_hash);
        assert_eq!(stable_hash(""), "cbf29ce484222325");
    }

    #[test]
    fn explicit_duplicates_and_unsafe_characters() {
        let c = FlagCatalog::builtin();
        let f = c.get("CUDA_GRAPH_MAX_BS").unwrap().clone();
        let spec = |v: &str| CellSpec {
            flags: vec![Pin::new(f.clone(), v)],
            sessions: 2,
            rounds: None,
        };
        let cells = expand(
            &Layout::Cells(vec![spec("a/b:c")]),
            &[],
            4,
            &RegressionPolicy::default(),
        )
        .unwrap();
        assert_eq!(cells[0].id, "CUDA_GRAPH_MAX_BS=a_b_c,s2");
        let err = expand(
            &Layout::Cells(vec![spec("8"), spec("8")]),
            &[],
            4,
            &RegressionPolicy::default(),
        )
        .unwrap_err();
        assert!(err.contains("CUDA_GRAPH_MAX_BS=8,s2"), "{err}");
    }

    #[test]
    fn shard_parsing() {
        assert_eq!(
            "1/3".parse::<Shard>().unwrap(),
            Shard { index: 1, count: 3 }
        );
        assert!("3/3".parse::<Shard>().is_err());
        assert!("0/0".parse::<Shard>().is_err());
        assert!("x/2".parse::<Shard>().is_err());
        assert!("2".parse::<Shard>().is_err());
        assert_eq!(Shard { index: 2, count: 5 }.to_string(), "2/5");
    }
}
