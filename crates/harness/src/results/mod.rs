//! Results directories and reports (docs/design.md 3.6): `run.json`, `sessions.jsonl`,
//! `metrics.csv`, `launch/`, `logs/`, `summary.md`, and the terminal table.
//!
//! Every whole-file format is an [`Exporter`]; the run record is re-exported after each
//! arm block, so an interrupted run still leaves a readable directory. Streams
//! (sessions, metrics) are appended as they arrive.

pub mod cells;
pub mod charts;
pub mod export;
pub mod html;
pub mod json;
pub mod load;
pub mod markdown;
pub mod markup;
pub mod rates;
pub mod run_record;
pub mod sequential_view;
pub mod table;

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::config::TargetProfile;
use crate::core::session::SessionResult;
use crate::driver::metrics::MetricsLog;
use run_record::RunRecord;

pub use export::Exporter;

/// The fields every results record opens with (run.json, culprit.json, load.json,
/// commits.json, matrix.json, probe.json), flattened into each as its first field: one
/// struct, so their JSON stays alike and a field added here reaches all of them.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RecordHeader {
    /// `bisect.<kind>/<version>`: which reader understands the file.
    pub schema: String,
    pub id: String,
    /// The command line as typed (empty in probe records written before it was kept).
    #[serde(default)]
    pub command: String,
    pub started_at: String,
    pub finished_at: Option<String>,
    /// Where the record stands (`pending` in probe records written before it was kept).
    #[serde(default)]
    pub status: crate::core::arm_stats::RecordStatus,
    pub target: run_record::TargetInfo,
}

impl RecordHeader {
    /// A record's header as its command starts: running, not finished.
    pub(crate) fn running(
        schema: &str,
        id: &str,
        command: &str,
        started_at: String,
        target: run_record::TargetInfo,
    ) -> RecordHeader {
        RecordHeader {
            schema: schema.into(),
            id: id.into(),
            command: command.into(),
            started_at,
            finished_at: None,
            status: crate::core::arm_stats::RecordStatus::Running,
            target,
        }
    }
}

/// The run record itself, rewritten after each arm before its reports.
const RECORD: json::JsonFile = json::JsonFile("run.json");

/// The reports rebuilt from the record.
const REPORTS: [&dyn Exporter<RunRecord>; 2] = [&markdown::SummaryMarkdown, &html::HtmlReport];

/// A run's results directory.
pub struct ResultsDir {
    root: PathBuf,
}

impl ResultsDir {
    pub fn create(root: &Path) -> anyhow::Result<Self> {
        for sub in ["", "logs", "launch"] {
            let d = root.join(sub);
            std::fs::create_dir_all(&d).with_context(|| format!("creating {}", d.display()))?;
        }
        Ok(ResultsDir {
            root: root.to_path_buf(),
        })
    }

    pub fn open(root: &Path) -> Self {
        ResultsDir {
            root: root.to_path_buf(),
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Rewrite run.json, then summary.md and report.html, each atomically.
    pub fn write_record(&self, record: &RunRecord) -> anyhow::Result<()> {
        let write = |exporter: &dyn Exporter<RunRecord>| -> anyhow::Result<()> {
            let text = exporter.render_in(record, &self.root)?;
            write_atomic(&self.root.join(exporter.file_name()), text.as_bytes())
        };
        write(&RECORD)?;
        // The fault suite's `results` phase: the record is on disk, its reports not yet
        // (a kill here must leave a run.json that reports can be rebuilt from).
        crate::fault::pause("results");
        for exporter in REPORTS {
            write(exporter)?;
        }
        Ok(())
    }

    pub(crate) fn sessions_writer(&self) -> anyhow::Result<JsonlWriter> {
        JsonlWriter::open(&self.root.join("sessions.jsonl"))
    }

    /// Append one arm block's metrics (rows already labelled) to metrics.csv.
    pub(crate) fn append_metrics(&self, log: &MetricsLog) -> anyhow::Result<()> {
        crate::driver::write_csv(log, &self.root.join("metrics.csv"))
    }

    /// Copy every role's launch config, as applied for this block, into launch/.
    pub(crate) fn snapshot_launch(
        &self,
        label: &str,
        repeat: u32,
        target: &TargetProfile,
    ) -> anyhow::Result<()> {
        let dir = self.root.join("launch").join(format!("{label}-r{repeat}"));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        for role in &target.roles {
            let name = role
                .launch
                .file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_else(|| format!("{}.sh", role.name));
            let dest = dir.join(format!("{}--{}", role.name, name));
            // A launch config may hold the key itself: the copy is masked like any
            // other file bisect writes (bytes kept as they are when nothing matches).
            let bytes = std::fs::read(&role.launch)
                .with_context(|| format!("reading {}", role.launch.display()))?;
            let bytes = match std::str::from_utf8(&bytes) {
                Ok(text) => crate::redact::scrub(text).into_owned().into_bytes(),
                Err(_) => bytes,
            };
            std::fs::write(&dest, bytes).with_context(|| {
                format!("copying {} to {}", role.launch.display(), dest.display())
            })?;
        }
        Ok(())
    }

    pub fn read_record(&self) -> anyhow::Result<RunRecord> {
        let path = self.root.join("run.json");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
    }

    pub fn read_sessions(&self) -> anyhow::Result<Vec<SessionResult>> {
        let path = self.root.join("sessions.jsonl");
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        text.lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| {
                serde_json::from_str(l)
                    .with_context(|| format!("{}:{}: bad session line", path.display(), i + 1))
            })
            .collect()
    }
}

/// Appends one JSON document per line, flushed per line so a crash loses nothing written.
pub(crate) struct JsonlWriter {
    out: BufWriter<File>,
    path: PathBuf,
}

impl JsonlWriter {
    pub fn open(path: &Path) -> anyhow::Result<Self> {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        Ok(JsonlWriter {
            out: BufWriter::new(file),
            path: path.to_path_buf(),
        })
    }

    pub(crate) fn append_one<T: serde::Serialize>(&mut self, value: &T) -> anyhow::Result<()> {
        let line = serde_json::to_string(value)
            .with_context(|| format!("encoding a line of {}", self.path.display()))?;
        // The line and its newline in one write: blocks on replica sets append to one
        // file at once (O_APPEND), and one write is never interleaved with another's.
        let mut line = crate::redact::scrub(&line).into_owned();
        line.push('\n');
        self.out
            .write_all(line.as_bytes())
            .with_context(|| format!("writing {}", self.path.display()))?;
        self.out.flush()?;
        Ok(())
    }

    pub fn append(&mut self, result: &SessionResult) -> anyhow::Result<()> {
        self.append_one(result)
    }
}

/// Write via a temporary file and rename, so readers never see half a file. Text has
/// every registered secret masked first (`crate::redact`).
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    let scrubbed;
    let bytes = match std::str::from_utf8(bytes) {
        Ok(text) => {
            scrubbed = crate::redact::scrub(text);
            scrubbed.as_bytes()
        }
        Err(_) => bytes,
    };
    let tmp = path.with_extension("tmp~");
    std::fs::write(&tmp, bytes).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path)
        .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
    Ok(())
}
