//! Progress output of the commands that drive sessions (run, probe, culprit, matrix):
//! an indicatif bar on a terminal, plain lines otherwise.
//!
//! Progress is best effort: a line that cannot be written (stderr a pipe whose reader
//! went away) is dropped (`stderr_line!`), where `eprintln!` would panic mid-arm.

use std::sync::atomic::{AtomicU64, Ordering};

use indicatif::{ProgressBar, ProgressStyle};
use parking_lot::Mutex;

use bisect_harness::arm::{BlockName, Progress};
use bisect_harness::core::arm_stats::ArmStats;
use bisect_harness::core::session::SessionResult;

/// An indicatif bar per arm block, with its corrupted count.
pub(crate) struct Bar {
    bar: Mutex<Option<ProgressBar>>,
    corrupted: AtomicU64,
}

impl Bar {
    /// A bar per arm block, sized when the block starts.
    pub(crate) fn new() -> Self {
        Bar {
            bar: Mutex::new(None),
            corrupted: AtomicU64::new(0),
        }
    }
}

impl Progress for Bar {
    fn arm_started(&self, block: BlockName<'_>, sessions: u64) {
        let bar = ProgressBar::new(sessions);
        bar.set_style(
            ProgressStyle::with_template(
                "{prefix:>12} [{bar:30}] {pos}/{len} sessions  {msg}  {elapsed}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar.set_prefix(format!("{}={} r{}", block.label, block.value, block.repeat));
        self.corrupted.store(0, Ordering::Relaxed);
        *self.bar.lock() = Some(bar);
    }
    fn session_done(&self, result: &SessionResult) {
        if result.class.is_corrupted() {
            self.corrupted.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(bar) = self.bar.lock().as_ref() {
            bar.set_message(format!(
                "corrupted {}",
                self.corrupted.load(Ordering::Relaxed)
            ));
            bar.inc(1);
        }
    }
    fn arm_finished(&self, _: BlockName<'_>, stats: &ArmStats) {
        if let Some(bar) = self.bar.lock().take() {
            bar.finish_with_message(format!(
                "corrupted {}/{}  error+timeout {}  {:.1}s",
                stats.corrupted,
                stats.sessions(),
                stats.counts.failed(),
                stats.wall_s
            ));
        }
    }
    fn note(&self, message: &str) {
        match self.bar.lock().as_ref() {
            Some(bar) => bar.println(bisect_harness::redact::scrub(message)),
            None => stderr_line!("{}", bisect_harness::redact::scrub(message)),
        }
    }
}

/// Plain progress lines on stderr (CI logs, pipes, --json).
pub(crate) struct Lines {
    per_session: bool,
    done: AtomicU64,
}

impl Lines {
    pub(crate) fn new(per_session: bool) -> Self {
        Lines {
            per_session,
            done: AtomicU64::new(0),
        }
    }
}

impl Progress for Lines {
    fn arm_started(&self, block: BlockName<'_>, sessions: u64) {
        let BlockName {
            label,
            value,
            repeat,
        } = block;
        self.done.store(0, Ordering::Relaxed);
        if value.is_empty() {
            // Matrix cells and probes have a label but no flag value.
            stderr_line!("{label} repeat {repeat}: driving {sessions} sessions");
        } else {
            stderr_line!("arm {label}={value} repeat {repeat}: driving {sessions} sessions");
        }
    }
    fn session_done(&self, result: &SessionResult) {
        let n = self.done.fetch_add(1, Ordering::Relaxed) + 1;
        if self.per_session
            && (result.class.is_corrupted() || result.class.is_failure() || n % 20 == 0)
        {
            stderr_line!(
                "  session {} {}: {} {}",
                result.label,
                result.index,
                result.class.name(),
                short(&bisect_harness::redact::scrub(&result.evidence))
            );
        }
    }
    fn arm_finished(&self, block: BlockName<'_>, stats: &ArmStats) {
        let name = if block.value.is_empty() {
            block.label.to_string()
        } else {
            format!("arm {}={}", block.label, block.value)
        };
        stderr_line!(
            "{name}: corrupted {}, error+timeout {}, {:.1}s",
            bisect_harness::core::format::rate(stats.corrupted, stats.sessions()),
            stats.counts.failed(),
            stats.wall_s
        );
    }
    fn note(&self, message: &str) {
        stderr_line!("{}", bisect_harness::redact::scrub(message));
    }
}

fn short(s: &str) -> String {
    let one_line = s.replace('\n', "\\n");
    if one_line.chars().count() > 100 {
        format!("{}...", one_line.chars().take(100).collect::<String>())
    } else {
        one_line
    }
}
