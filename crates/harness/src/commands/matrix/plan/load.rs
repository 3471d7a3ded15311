//! `[[cell]] kind = "load"`: a load sweep as a matrix cell (docs/load.md, "In the
//! matrix"). Its keys: `levels` (sessions in flight, ascending), `flag` (each level an
//! A/B of it; optional), `sessions` (per level and arm, fixed allocation) or
//! `max_sessions` (adaptive, the cap per level and arm), `flags` (the other flags' values
//! for every block) and `rounds`. Every cell of a plan names the same flags (a load
//! cell's `flag` counts as named): a flag some cell left out would keep whatever the
//! cell before it wrote, and its configuration would depend on the order cells ran.

use std::collections::BTreeSet;

use toml::Spanned;

use super::spec::{Layout, LoadCellSpec, LoadSweep};
use super::{counts, FlagValues, RawCell};
use crate::config::Pin;
use crate::config::{ConfigError, Source};
use crate::core::load::{Allocation, LoadParams};

/// `[[cell]]` entries as the plan holds them.
type RawCells<'r> = Vec<&'r Spanned<RawCell>>;

const KINDS: &str = "kind = \"load\" (a load sweep), or no kind (flag values at one load)";

/// The plain cells and the load cells of `[[cell]]`, in file order; an unknown kind, or
/// a load cell's key on a plain cell, is refused.
pub(super) fn partition<'r>(
    src: &Source,
    cells: &'r [Spanned<RawCell>],
) -> Result<(RawCells<'r>, RawCells<'r>), ConfigError> {
    let mut plain = Vec::new();
    let mut load = Vec::new();
    for cell in cells {
        let c = cell.get_ref();
        match &c.kind {
            Some(k) if k.get_ref() == "load" => load.push(cell),
            Some(k) => {
                return Err(src.invalid(
                    k.span(),
                    format!("unknown cell kind {:?}", k.get_ref()),
                    format!("use {KINDS}"),
                ))
            }
            None => {
                let key = [
                    ("levels", c.levels.as_ref().map(|v| v.span())),
                    ("flag", c.flag.as_ref().map(|v| v.span())),
                    ("max_sessions", c.max_sessions.as_ref().map(|v| v.span())),
                ]
                .into_iter()
                .find_map(|(k, span)| span.map(|s| (k, s)));
                if let Some((key, span)) = key {
                    return Err(src.invalid(
                        span,
                        format!("{key} is a key of load cells, and this [[cell]] has no kind"),
                        format!("add kind = \"load\" to make it a load sweep, or remove {key}"),
                    ));
                }
                plain.push(cell);
            }
        }
    }
    Ok((plain, load))
}

impl FlagValues<'_> {
    /// Every load cell validated: levels, its flag, allocation, and the same flags as
    /// every other cell of the plan (the plain cells' `layout`, else the first load cell).
    pub(super) fn load_cells(
        &self,
        cells: &[&Spanned<RawCell>],
        layout: &Layout,
        sets: &[Pin],
        default_sessions: u32,
    ) -> Result<Vec<LoadCellSpec>, ConfigError> {
        let mut named: Option<BTreeSet<String>> = match layout {
            Layout::Axes { flags, .. } => Some(flags.iter().map(|(f, _)| f.name.clone()).collect()),
            Layout::Cells(specs) => specs
                .first()
                .map(|c| c.flags.iter().map(|p| p.flag.name.clone()).collect()),
        };
        let mut out = Vec::new();
        for cell in cells {
            let spec = self.load_cell(cell, sets, default_sessions)?;
            let mine: BTreeSet<String> = spec
                .fixed
                .iter()
                .map(|p| &p.flag.name)
                .chain(spec.sweep.flag.iter().map(|f| &f.name))
                .cloned()
                .collect();
            match &named {
                None => named = Some(mine),
                Some(all) if *all != mine => {
                    let list =
                        |s: &BTreeSet<String>| s.iter().cloned().collect::<Vec<_>>().join(", ");
                    return Err(self.src.invalid(
                        cell.span(),
                        format!(
                            "this load cell sets flags [{}] (its flag included) but the plan's cells set [{}]",
                            list(&mine),
                            list(all)
                        ),
                        "give every cell a value for the same flags: flags = { NAME = \"value\" } (a load cell's flag counts), and pin flags common to all cells under [set]",
                    ));
                }
                Some(_) => {}
            }
            out.push(spec);
        }
        Ok(out)
    }

    fn load_cell(
        &self,
        cell: &Spanned<RawCell>,
        sets: &[Pin],
        default_sessions: u32,
    ) -> Result<LoadCellSpec, ConfigError> {
        let src = self.src;
        let c = cell.get_ref();
        let flag = match &c.flag {
            Some(name) => Some(self.flag(name.get_ref(), name.span())?),
            None => None,
        };
        let fixed = match &c.flags {
            Some(table) => self.assignments(table.get_ref(), "is set twice in this cell")?,
            None => Vec::new(),
        };
        let written = flag.iter().map(|f| (f, c.flag.as_ref().map(|v| v.span())));
        let written = written.chain(
            fixed
                .iter()
                .map(|Pin { flag: f, .. }| (f, c.flags.as_ref().map(|v| v.span()))),
        );
        for (f, span) in written {
            if sets.iter().any(|p| p.flag.name == f.name) {
                return Err(src.invalid(
                    span.unwrap_or(cell.span()),
                    format!(
                        "flag {} is both pinned under [set] and set by this load cell",
                        f.name
                    ),
                    "pin it or set it in the cell, not both",
                ));
            }
        }
        if let (Some(f), Some(table)) = (&flag, &c.flags) {
            if fixed.iter().any(|p| p.flag.name == f.name) {
                return Err(src.invalid(
                    table.span(),
                    format!(
                        "flag {} is this cell's A/B flag (flag = ...) and also fixed under flags",
                        f.name
                    ),
                    "remove it from flags: each level runs it on and off",
                ));
            }
        }
        let Some(raw_levels) = &c.levels else {
            return Err(src.invalid(
                cell.span(),
                "this load cell has no levels",
                "add levels = [1, 16, 64] (sessions in flight, ascending)",
            ));
        };
        let levels = counts(src, "levels", raw_levels, 1)?;
        LoadParams::check_levels(&levels, flag.is_some()).map_err(|e| {
            src.invalid(
                raw_levels.span(),
                format!("levels: {}", e.replace("--flag", "flag = ...")),
                "list ascending levels, e.g. levels = [1, 16, 64]",
            )
        })?;
        let allocation = allocation(src, c, &levels, default_sessions)?;
        let rounds = match &c.rounds {
            Some(r) => Some(src.whole_number("rounds", r, 1)?),
            None => None,
        };
        Ok(LoadCellSpec {
            fixed,
            sweep: LoadSweep {
                levels,
                flag,
                allocation,
            },
            rounds,
        })
    }
}

/// `sessions` (fixed, per level and arm; default the workload's) or `max_sessions`
/// (adaptive, the cap per level and arm, at least the highest level).
fn allocation(
    src: &Source,
    c: &RawCell,
    levels: &[u32],
    default_sessions: u32,
) -> Result<Allocation, ConfigError> {
    match (&c.sessions, &c.max_sessions) {
        (Some(s), Some(_)) => Err(src.invalid(
            s.span(),
            "a load cell has both sessions (fixed per level) and max_sessions (adaptive)",
            "keep sessions = N for a fixed number per level, or max_sessions = N for an adaptive sweep",
        )),
        (Some(s), None) => Ok(Allocation::Fixed {
            sessions: u64::from(src.whole_number("sessions", s, 1)?),
        }),
        (None, Some(m)) => {
            let cap = src.whole_number("max_sessions", m, 1)?;
            let top = *levels.last().expect("checked levels");
            if cap < top {
                return Err(src.invalid(
                    m.span(),
                    format!("max_sessions = {cap} is below the highest level {top}: not one block at that load fits"),
                    format!("set max_sessions = {top} or more, or lower the levels"),
                ));
            }
            Ok(Allocation::Adaptive {
                max_sessions: u64::from(cap),
            })
        }
        (None, None) => Ok(Allocation::Fixed {
            sessions: u64::from(default_sessions),
        }),
    }
}

impl super::Plan {
    /// The sweep a load cell runs: its levels, flag and allocation, decided at the plan's
    /// policy, from the plan's workload seed.
    pub(crate) fn sweep_params(&self, sweep: &LoadSweep) -> LoadParams {
        let policy = crate::core::evidence::Policy {
            alpha: self.policy.alpha,
            min_effect: self.policy.min_effect,
            degraded_fraction: self.policy.degraded_fraction,
            ..crate::core::evidence::Policy::default()
        };
        LoadParams::new(
            sweep.levels.clone(),
            sweep.flag.is_some(),
            sweep.allocation,
            &policy,
            self.workload.seed,
        )
    }
}
