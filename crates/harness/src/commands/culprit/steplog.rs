//! The culprit search's step log, `steps.jsonl` (docs/culprit.md, "Step log"): one JSON
//! document per line, flushed as it happens, so a killed search loses nothing it ran.
//!
//! - line 1, `{"line": "search", ...}`: what the search was started with (flags with
//!   their failing and passing values, load, block and look sizes, seed, budget);
//! - `{"line": "block", "request": ..., "outcome": ...}`: every block run, with the
//!   classes of its sessions in index order as a string of one letter per session
//!   (see [`CODES`]);
//! - `{"line": "step", ...}`: every step decided.
//!
//! The search is a deterministic function of its blocks' outcomes, so replaying the
//! blocks ([`Replay`]) walks the same path; `--resume DIR` does that and runs live only
//! from the first block the log does not hold. No block already run is run again.

use std::path::Path;

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

use crate::commands::blocks::{BlockRunner, EventSink};
use crate::core::culprit::{BlockOutcome, BlockRequest, Event, FlagValues, StepRecord};
use crate::core::session::SessionClass;
use crate::results::JsonlWriter;

/// One letter per session ([`SessionClass::letter`]), in `steps.jsonl`.
fn encode(classes: &[SessionClass]) -> String {
    classes.iter().map(|c| c.letter()).collect()
}

fn decode(text: &str) -> Option<Vec<SessionClass>> {
    text.chars()
        .map(|l| SessionClass::iter().find(|c| c.letter() == l))
        .collect()
}

/// Line 1: the search's identity; a resume must match it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct Header {
    pub(super) flags: Vec<FlagValues>,
    pub(super) concurrency: u32,
    pub(super) block: u64,
    pub(super) look: u64,
    pub(super) seed: u64,
    pub(super) budget: u64,
    pub(super) pinned: Vec<String>,
    /// The replica sets every block was split over; empty on one set (and in logs
    /// written before replica sets), so a search is resumed on the sets it ran on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) sets: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct LoggedOutcome {
    classes: String,
    peak_engine: Option<u64>,
    wall_s: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tokens_per_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    mechanisms: Vec<crate::core::mechanism::MechanismRecord>,
    /// Each replica set's counts, where the block was split over several.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    sets: Vec<crate::core::culprit::SetShare>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "line", rename_all = "snake_case")]
enum Line {
    Search(Header),
    Block {
        request: BlockRequest,
        outcome: LoggedOutcome,
    },
    Step(Box<StepRecord>),
}

/// What a step log holds: its header and its blocks, in order.
#[derive(Debug, Clone)]
pub(super) struct Logged {
    pub(super) header: Header,
    pub(super) blocks: Vec<(BlockRequest, BlockOutcome)>,
}

/// Read `steps.jsonl`. Errors name the file and line.
pub(super) fn read(path: &Path) -> anyhow::Result<Logged> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "reading {}\n  fix: pass --resume the directory of an earlier `bisect culprit` (it holds steps.jsonl)",
            path.display()
        )
    })?;
    let mut header = None;
    let mut blocks = Vec::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let parsed: Line = match serde_json::from_str(line) {
            Ok(l) => l,
            // A search killed mid-write leaves at most its last line torn: drop it.
            Err(_) if i + 1 == text.lines().count() => break,
            Err(e) => bail!(
                "{}:{}: not a step-log line: {e}\n  fix: restore the file, or start a new search without --resume",
                path.display(),
                i + 1
            ),
        };
        match parsed {
            Line::Search(h) if header.is_none() => header = Some(h),
            Line::Search(_) => bail!("{}:{}: a second search header", path.display(), i + 1),
            Line::Block { request, outcome } => {
                let classes = decode(&outcome.classes).with_context(|| {
                    format!(
                        "{}:{}: unknown class letter in {:?}",
                        path.display(),
                        i + 1,
                        outcome.classes
                    )
                })?;
                blocks.push((
                    request,
                    BlockOutcome {
                        classes,
                        peak_engine: outcome.peak_engine,
                        wall_s: outcome.wall_s,
                        tokens_per_s: outcome.tokens_per_s,
                        warnings: outcome.warnings,
                        mechanisms: outcome.mechanisms,
                        sets: outcome.sets,
                    },
                ));
            }
            Line::Step(_) => {}
        }
    }
    let header =
        header.with_context(|| format!("{}: no search header on line 1", path.display()))?;
    Ok(Logged { header, blocks })
}

/// Writes the log as the search goes.
pub(super) struct StepLog {
    out: JsonlWriter,
}

impl StepLog {
    /// Start `path` afresh with `header` (a resume rewrites the replayed blocks too).
    pub(super) fn create(path: &Path, header: &Header) -> anyhow::Result<Self> {
        if path.exists() {
            std::fs::remove_file(path).with_context(|| format!("replacing {}", path.display()))?;
        }
        let mut out = JsonlWriter::open(path)?;
        out.append_one(&Line::Search(header.clone()))?;
        Ok(StepLog { out })
    }
}

impl EventSink<Event> for StepLog {
    fn event(&mut self, event: Event) -> anyhow::Result<()> {
        match event {
            Event::Block(request, outcome) => self.block(&request, &outcome),
            Event::Step(step) => self.step(&step),
        }
    }
}

impl StepLog {
    pub(super) fn block(
        &mut self,
        request: &BlockRequest,
        outcome: &BlockOutcome,
    ) -> anyhow::Result<()> {
        self.out.append_one(&Line::Block {
            request: request.clone(),
            outcome: LoggedOutcome {
                classes: encode(&outcome.classes),
                peak_engine: outcome.peak_engine,
                wall_s: outcome.wall_s,
                tokens_per_s: outcome.tokens_per_s,
                warnings: outcome.warnings.clone(),
                mechanisms: outcome.mechanisms.clone(),
                sets: outcome.sets.clone(),
            },
        })
    }

    pub(super) fn step(&mut self, step: &StepRecord) -> anyhow::Result<()> {
        self.out.append_one(&Line::Step(Box::new(step.clone())))
    }
}

/// Answers the blocks a log already holds, in order, then runs `live`.
pub(super) struct Replay<R> {
    pub(super) logged: std::collections::VecDeque<(BlockRequest, BlockOutcome)>,
    pub(super) live: R,
    /// Blocks answered from the log.
    pub(super) replayed: u64,
}

impl<R> Replay<R> {
    pub(super) fn new(logged: Vec<(BlockRequest, BlockOutcome)>, live: R) -> Self {
        Replay {
            logged: logged.into(),
            live,
            replayed: 0,
        }
    }
}

impl<R: BlockRunner<BlockRequest, BlockOutcome>> BlockRunner<BlockRequest, BlockOutcome>
    for Replay<R>
{
    async fn run_block(&mut self, request: &BlockRequest) -> anyhow::Result<BlockOutcome> {
        match self.logged.pop_front() {
            Some((logged, outcome)) if &logged == request => {
                self.replayed += 1;
                Ok(outcome)
            }
            Some((logged, _)) => bail!(
                "steps.jsonl: block {} of the log ran {:?} (seed {}), but the search now asks for {:?} (seed {}): the log is from another search\n  fix: resume with the same --flags, --set, --concurrency, --seed and --budget, or start a new search",
                logged.block,
                logged.failing,
                logged.seed,
                request.failing,
                request.seed
            ),
            None => self.live.run_block(request).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::blocks::{drive, Discard};
    use crate::core::culprit::simulate::{Expected, Oracle, OracleRunner, Rule};
    use crate::core::culprit::{search, SearchParams};

    #[test]
    fn codes_round_trip() {
        let all = SessionClass::iter().collect::<Vec<_>>();
        assert_eq!(decode(&encode(&all)).unwrap(), all);
        assert!(decode("dq").is_none());
    }

    /// Counts blocks that reach the live runner.
    struct Counting<'a>(OracleRunner<'a>, u64);
    impl BlockRunner<BlockRequest, BlockOutcome> for Counting<'_> {
        async fn run_block(&mut self, r: &BlockRequest) -> anyhow::Result<BlockOutcome> {
            self.1 += 1;
            Ok(self.0.run_block(r))
        }
    }

    /// Runs `params`' search with `runner`, reporting to `sink`.
    fn run(
        params: &SearchParams,
        runner: &mut impl BlockRunner<BlockRequest, BlockOutcome>,
        sink: &mut impl EventSink<Event>,
    ) -> anyhow::Result<crate::core::culprit::SearchReport> {
        Ok(futures::executor::block_on(drive(
            search(params.clone()),
            runner,
            sink,
        ))??)
    }

    #[test]
    fn a_resumed_search_reruns_nothing_and_ends_the_same() {
        let oracle = Oracle::new("t", 4, Rule::All(vec![1, 2]), 0.2, Expected::NoCulprit);
        let params = SearchParams::new(oracle.flag_values(), 80, 4000, 11);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("steps.jsonl");
        let header = Header {
            flags: params.flags.clone(),
            concurrency: 80,
            block: params.block,
            look: params.look,
            seed: 11,
            budget: 4000,
            pinned: vec![],
            sets: vec![],
        };
        let mut log = StepLog::create(&path, &header).unwrap();
        let mut runner = Counting(
            OracleRunner {
                oracle: &oracle,
                seed: 11,
            },
            0,
        );
        let full = run(&params, &mut runner, &mut log).unwrap();
        drop(log);

        // Killed after 5 blocks: keep the header and the first 5 block lines.
        let text = std::fs::read_to_string(&path).unwrap();
        let mut kept = Vec::new();
        let mut blocks = 0;
        for line in text.lines() {
            if line.contains("\"line\":\"block\"") {
                blocks += 1;
                if blocks > 5 {
                    break;
                }
            }
            kept.push(line);
        }
        std::fs::write(&path, kept.join("\n") + "\n{\"line\":\"blo").unwrap();

        let logged = read(&path).unwrap();
        assert_eq!(logged.header, header);
        assert_eq!(logged.blocks.len(), 5);
        let live = Counting(
            OracleRunner {
                oracle: &oracle,
                seed: 11,
            },
            0,
        );
        let mut replay = Replay::new(logged.blocks, live);
        let mut log = StepLog::create(&path, &header).unwrap();
        let resumed = run(&params, &mut replay, &mut log).unwrap();
        assert_eq!(replay.replayed, 5);
        assert_eq!(replay.live.1, full.blocks.len() as u64 - 5);
        assert_eq!(resumed, full);
        assert_eq!(read(&path).unwrap().blocks.len(), full.blocks.len());

        // A log from another search is refused, naming the block.
        let other = SearchParams::new(oracle.flag_values(), 80, 4000, 12);
        let mut replay = Replay::new(
            read(&path).unwrap().blocks,
            Counting(
                OracleRunner {
                    oracle: &oracle,
                    seed: 12,
                },
                0,
            ),
        );
        let err = run(&other, &mut replay, &mut Discard).unwrap_err();
        assert!(
            format!("{err:#}").contains("the log is from another search"),
            "{err:#}"
        );
    }
}
