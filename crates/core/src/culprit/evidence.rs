//! How the culprit search files and reads its evidence: blocks are kept per
//! configuration and generation ([`EvidenceKey`]), and read as counts (looks of `look`
//! sessions for the e-processes, totals for rates and words).

use std::collections::BTreeSet;

use super::block::BlockOutcome;
use crate::session::SessionClass;

/// Flags (indices into [`super::SearchParams::flags`]) at their failing values; the others
/// are flipped.
pub(super) type FailingSet = BTreeSet<usize>;

/// Whose blocks a step reads: a configuration and a generation (a re-test reads fresh
/// blocks of the same configuration).
pub(super) type EvidenceKey = (FailingSet, u32);

/// Looks (corrupted, judged) of `look` sessions each, in session-index order across
/// blocks; a trailing partial look waits for the next block. Judged: neither failed
/// nor truncated at max_tokens (`SessionClass::is_judged`), as every rate.
pub(super) fn looks_of(blocks: &[BlockOutcome], look: u64) -> Vec<(u64, u64)> {
    let all: Vec<SessionClass> = blocks
        .iter()
        .flat_map(|b| b.classes.iter().copied())
        .collect();
    all.chunks_exact(look as usize)
        .map(|chunk| {
            let classified = chunk.iter().filter(|c| c.is_judged()).count() as u64;
            let corrupted = chunk.iter().filter(|c| c.is_corrupted()).count() as u64;
            (corrupted, classified)
        })
        .collect()
}

pub(super) struct Totals {
    pub(super) corrupted: u64,
    pub(super) classified: u64,
    pub(super) sessions: u64,
    pub(super) error_timeout: u64,
}

pub(super) fn totals(blocks: &[BlockOutcome]) -> Totals {
    let all = || blocks.iter().flat_map(|b| b.classes.iter());
    Totals {
        corrupted: all().filter(|c| c.is_corrupted()).count() as u64,
        classified: all().filter(|c| c.is_judged()).count() as u64,
        sessions: all().count() as u64,
        error_timeout: all().filter(|c| c.is_failure()).count() as u64,
    }
}

/// [`crate::deaths::crashed_without_corruption`] over a configuration's blocks.
pub(super) fn crashed_without_corruption(blocks: &[BlockOutcome]) -> Option<u64> {
    crate::deaths::crashed_without_corruption(blocks.iter().flat_map(|b| b.classes.iter()))
}

pub(super) fn pct(k: u64, n: u64) -> String {
    if n == 0 {
        "-".into()
    } else {
        format!("{k}/{n} = {:.1}%", 100.0 * k as f64 / n as f64)
    }
}
