//! The one record model of an arm's measurements: [`ArmStats`] is filled by the single
//! collector of an arm block (`crate::arm`) and embedded, flattened, in every record
//! that reports arms: a run's arms and blocks (`run.json`), a matrix cell
//! (`matrix.json`), a culprit flag's pooled arms (`culprit.json`). Field names are the
//! results contract of docs/design.md 3.6: flattening keeps the keys those files always
//! had. Also the shared vocabulary of records: [`RecordStatus`] and [`ArmLabel`].
//!
//! Pure: derived fields come from [`crate::stats`].

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::session::{Counts, RoundClass, SessionResult};
use crate::stats;
use crate::transport::{LoadGap, TransportStats};

/// The confidence of every per-arm interval.
const CONFIDENCE: f64 = 0.95;

/// Where a record (run, matrix, culprit search, matrix cell) stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum RecordStatus {
    /// Not started (a matrix cell waiting for its group).
    #[default]
    Pending,
    Running,
    Finished,
    /// Stopped by Ctrl-C, SIGTERM or SIGHUP; the configs were restored.
    Interrupted,
    Failed,
    /// A matrix cell whose engine reported a configuration other than the cell's after
    /// the restart: not driven, never compared (its reasons are in the cell's `blocked`).
    Blocked,
}

impl RecordStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RecordStatus::Pending => "pending",
            RecordStatus::Running => "running",
            RecordStatus::Finished => "finished",
            RecordStatus::Interrupted => "interrupted",
            RecordStatus::Failed => "failed",
            RecordStatus::Blocked => "blocked",
        }
    }
}

impl fmt::Display for RecordStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which arm of an experiment a record is: the flag's `on` or `off` value, or a probe's
/// single arm with the configs as they are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ArmLabel {
    On,
    Off,
    Probe,
}

impl ArmLabel {
    /// The two arms of an A/B, in the order they are reported.
    pub const AB: [ArmLabel; 2] = [ArmLabel::On, ArmLabel::Off];

    pub fn as_str(self) -> &'static str {
        match self {
            ArmLabel::On => "on",
            ArmLabel::Off => "off",
            ArmLabel::Probe => "probe",
        }
    }

    pub fn parse(text: &str) -> Option<ArmLabel> {
        match text {
            "on" => Some(ArmLabel::On),
            "off" => Some(ArmLabel::Off),
            "probe" => Some(ArmLabel::Probe),
            _ => None,
        }
    }
}

impl fmt::Display for ArmLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an arm block measured. `counts`, `completion_tokens`, `first_bad_round` are
/// accumulated session by session ([`ArmStats::add_session`]); `peak_running`,
/// `wall_s` and `health_wait_s` are set by the arm lifecycle; the rest is derived by
/// [`ArmStats::finish`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArmStats {
    pub counts: Counts,
    pub corrupted: u64,
    pub corruption_rate: f64,
    /// Wilson 95% interval of `corruption_rate`.
    pub ci95: [f64; 2],
    /// `client` (in-flight requests) or a role name -> peak running requests.
    pub peak_running: BTreeMap<String, u64>,
    pub wall_s: f64,
    pub completion_tokens: u64,
    pub tokens_per_s: f64,
    pub health_wait_s: f64,
    /// Per round (1-based index - 1): sessions whose first bad round this was.
    #[serde(default)]
    pub first_bad_round: Vec<u64>,
    /// Role -> why none of its metrics scrapes gave a running-requests sample: that
    /// role's load is unmeasured, which the record must say (docs/design.md 3.7).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metrics_failed: BTreeMap<String, String>,
    /// Roles whose engine was not the same process at the end of the block as after its
    /// restart, in words (`control::identity`): blocks the verdict.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub engine_replaced: Vec<String>,
    /// How the driver's connections were set up and whether the server shed load
    /// (absent in records made before the connect pacer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub transport: Option<TransportStats>,
    /// Where the client's in-flight requests were while the engine ran fewer, when it
    /// did by more than 10% ([`LoadGap::is_material`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_gap: Option<LoadGap>,
    /// Replies the engines served (rounds that got an answer): the exposure of the
    /// engines' lives (core::deaths). Absent in older records (0), and written only
    /// when non-zero, so they keep their shape when rewritten.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub served: u64,
    /// The engines that died during the block (core::deaths), in the order noticed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deaths: Vec<crate::deaths::EngineDeath>,
    /// The restarts after those deaths, each beginning a new engine life in the block.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub restarts: Vec<crate::deaths::DeathRestart>,
    /// Set when the block stopped at the death budget ([`crate::deaths::DEATH_BUDGET`])
    /// with sessions it never ran: how many.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub unrun: u64,
    /// Role -> [samples the poller found its running gauge above zero, samples that
    /// read it]: whether its sampled peak is a level it held (core::confounds, the peak
    /// rule, where the engine counts no busy time of its own).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub busy_samples: BTreeMap<String, [u64; 2]>,
    /// The solo canaries run after a corrupted session on the same engine
    /// (core::poison): whether each engine life was poisoned by its first failure.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub canaries: Vec<crate::poison::Canary>,
    /// What the engines' own counters counted over the block (preemptions, replies
    /// their tool-call parser found a call in or not), where their preset names any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub engine_counts: Vec<crate::engine_counts::EngineCount>,
    /// What the witnesses of the flags this block set counted (core::mechanism): whether
    /// the path each flag controls ran.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mechanisms: Vec<crate::mechanism::MechanismRecord>,
    /// The corruption rate against request index (core::trend): judged sessions in
    /// equal-count bins by their engine life's request index, pooled by bin position.
    /// Absent in records without session timings, and with too few sessions.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trend: Vec<crate::trend::TrendBin>,
    /// The judged sessions' timings, collected by [`ArmStats::add_session`] and cut into
    /// `trend` by [`ArmStats::finish`]: working state, not part of the record.
    #[serde(skip)]
    pub timeline: Vec<crate::trend::TimedSession>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl Default for ArmStats {
    fn default() -> Self {
        ArmStats {
            counts: Counts::default(),
            corrupted: 0,
            corruption_rate: 0.0,
            ci95: [0.0, 1.0],
            peak_running: BTreeMap::new(),
            wall_s: 0.0,
            completion_tokens: 0,
            tokens_per_s: 0.0,
            health_wait_s: 0.0,
            first_bad_round: Vec::new(),
            metrics_failed: BTreeMap::new(),
            engine_replaced: Vec::new(),
            transport: None,
            load_gap: None,
            served: 0,
            deaths: Vec::new(),
            restarts: Vec::new(),
            unrun: 0,
            canaries: Vec::new(),
            busy_samples: BTreeMap::new(),
            engine_counts: Vec::new(),
            mechanisms: Vec::new(),
            trend: Vec::new(),
            timeline: Vec::new(),
        }
    }
}

impl ArmStats {
    /// Sessions classified, whatever their class.
    pub fn sessions(&self) -> u64 {
        self.counts.total()
    }

    /// Sessions that could show corruption ([`Counts::judged`]): the denominator of
    /// every corruption rate.
    pub fn judged(&self) -> u64 {
        self.counts.judged()
    }

    /// Count one finished session: the collector's and `reclassify`'s only way in.
    pub fn add_session(&mut self, session: &SessionResult) {
        self.counts.add(session.class);
        self.served += session
            .rounds
            .iter()
            .filter(|r| {
                !matches!(
                    r.class,
                    RoundClass::Error | RoundClass::Timeout | RoundClass::Crashed
                )
            })
            .count() as u64;
        self.completion_tokens += session.completion_tokens;
        if let Some(round) = session.first_bad_round {
            self.add_first_bad_round(round, 1);
        }
        self.timeline
            .extend(crate::trend::TimedSession::of(session));
    }

    fn add_first_bad_round(&mut self, round: u32, n: u64) {
        let idx = round.saturating_sub(1) as usize;
        if self.first_bad_round.len() <= idx {
            self.first_bad_round.resize(idx + 1, 0);
        }
        self.first_bad_round[idx] += n;
    }

    /// Forget the session-derived fields (counts, tokens, first bad rounds), keeping
    /// what the lifecycle measured (wall time, peaks, health wait): for recounting.
    pub fn clear_sessions(&mut self) {
        self.counts = Counts::default();
        self.completion_tokens = 0;
        self.first_bad_round.clear();
        self.served = 0;
        self.timeline.clear();
        self.trend.clear();
    }

    /// Recompute the derived fields (corrupted, rate, interval, tokens/s) from counts.
    pub fn finish(&mut self) {
        let n = self.judged();
        self.corrupted = self.counts.corrupted();
        self.corruption_rate = stats::rate(self.corrupted, n);
        let (lo, hi) = stats::wilson(self.corrupted, n, CONFIDENCE);
        self.ci95 = [lo, hi];
        self.tokens_per_s = if self.wall_s > 0.0 {
            self.completion_tokens as f64 / self.wall_s
        } else {
            0.0
        };
        // A record read back (or a pool) has no timeline: its bins stand as they are.
        if !self.timeline.is_empty() {
            self.trend = crate::trend::bin(&self.timeline);
        }
    }

    /// Pool several blocks of the same arm (repeats, looks, a cell's repeats): counts,
    /// tokens, wall and health-wait time add up; peaks take the maximum; the trend's bins
    /// pool by position (core::trend).
    pub fn pool<'a>(blocks: impl IntoIterator<Item = &'a ArmStats>) -> ArmStats {
        let mut pooled = ArmStats::default();
        let mut counted: Vec<&[crate::engine_counts::EngineCount]> = Vec::new();
        let mut trends: Vec<&[crate::trend::TrendBin]> = Vec::new();
        let mut mechanisms: Vec<&[crate::mechanism::MechanismRecord]> = Vec::new();
        for b in blocks {
            counted.push(&b.engine_counts);
            mechanisms.push(&b.mechanisms);
            trends.push(&b.trend);
            pooled.counts.merge(&b.counts);
            for (k, v) in &b.peak_running {
                let slot = pooled.peak_running.entry(k.clone()).or_insert(0);
                *slot = (*slot).max(*v);
            }
            pooled.wall_s += b.wall_s;
            pooled.completion_tokens += b.completion_tokens;
            pooled.served += b.served;
            pooled.deaths.extend(b.deaths.iter().cloned());
            pooled.restarts.extend(b.restarts.iter().cloned());
            pooled.unrun += b.unrun;
            pooled.canaries.extend(b.canaries.iter().cloned());
            for (role, [busy, samples]) in &b.busy_samples {
                let slot = pooled.busy_samples.entry(role.clone()).or_default();
                slot[0] += busy;
                slot[1] += samples;
            }
            pooled.health_wait_s += b.health_wait_s;
            for (i, n) in b.first_bad_round.iter().enumerate() {
                pooled.add_first_bad_round(i as u32 + 1, *n);
            }
            for (role, why) in &b.metrics_failed {
                pooled
                    .metrics_failed
                    .entry(role.clone())
                    .or_insert_with(|| why.clone());
            }
            pooled
                .engine_replaced
                .extend(b.engine_replaced.iter().cloned());
            if let Some(t) = &b.transport {
                pooled.transport = Some(pool_transport(pooled.transport.take(), t));
            }
            // The widest gap of any block stands for the arm.
            if let Some(gap) = &b.load_gap {
                let shortfall = |g: &LoadGap| g.client_in_flight - g.engine_running;
                if pooled
                    .load_gap
                    .as_ref()
                    .is_none_or(|p| shortfall(gap) > shortfall(p))
                {
                    pooled.load_gap = Some(gap.clone());
                }
            }
        }
        pooled.engine_counts = crate::engine_counts::pool(counted);
        pooled.trend = crate::trend::pool(trends);
        pooled.mechanisms = crate::mechanism::pool(mechanisms);
        pooled.finish();
        pooled
    }
}

/// Counts add up; connect times and the pacing gap keep the worst block's.
fn pool_transport(pooled: Option<TransportStats>, block: &TransportStats) -> TransportStats {
    let Some(p) = pooled else {
        return block.clone();
    };
    TransportStats {
        connects: p.connects + block.connects,
        connect_ms_p50: p.connect_ms_p50.max(block.connect_ms_p50),
        connect_ms_p99: p.connect_ms_p99.max(block.connect_ms_p99),
        connect_ms_max: p.connect_ms_max.max(block.connect_ms_max),
        slow_connects: p.slow_connects + block.slow_connects,
        stalled_connects: p.stalled_connects + block.stalled_connects,
        refused_retried: p.refused_retried + block.refused_retried,
        reset_retried: p.reset_retried + block.reset_retried,
        failed: p.failed + block.failed,
        abandoned: p.abandoned + block.abandoned,
        shed_replies: p.shed_replies + block.shed_replies,
        shed_retried: p.shed_retried + block.shed_retried,
        pacing_gap_ms_max: p.pacing_gap_ms_max.max(block.pacing_gap_ms_max),
    }
}

/// Pool read-backs or effective values (role -> value) of several blocks of one arm: a
/// block whose value does not `means` the arm's intended `value` must survive pooling,
/// so the first such value wins over meaning ones. `means` is the check the verdict
/// applies to what is pooled: text equality for a launch-file read-back,
/// [`crate::effective::agrees`] for an engine's report (`"true"` means `"on"`,
/// so comparing text would let an agreeing `"true"` hide a later `"false"`).
pub fn pool_readback<'a>(
    value: &str,
    blocks: impl IntoIterator<Item = &'a BTreeMap<String, String>>,
    means: impl Fn(&str, &str) -> bool,
) -> BTreeMap<String, String> {
    let mut pooled: BTreeMap<String, String> = BTreeMap::new();
    for readback in blocks {
        for (role, v) in readback {
            let slot = pooled.entry(role.clone()).or_insert_with(|| v.clone());
            if !means(value, v) && means(value, slot) {
                *slot = v.clone();
            }
        }
    }
    pooled
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::SessionClass;

    fn block(done: u64, leak: u64, wall_s: f64, peak: u64) -> ArmStats {
        let mut s = ArmStats {
            wall_s,
            ..ArmStats::default()
        };
        s.counts[SessionClass::Done] = done;
        s.counts[SessionClass::Leak] = leak;
        s.completion_tokens = 100 * (done + leak);
        s.peak_running.insert("client".into(), peak);
        s.first_bad_round = vec![0, leak];
        s.finish();
        s
    }

    #[test]
    fn finish_derives_rate_interval_and_speed() {
        let s = block(66, 14, 2.0, 80);
        assert_eq!(s.sessions(), 80);
        assert_eq!(s.corrupted, 14);
        assert!((s.corruption_rate - 0.175).abs() < 1e-12);
        // Wilson 95% for 14/80: 10.7% .. 27.3%.
        assert!((s.ci95[0] - 0.1068).abs() < 5e-4, "{:?}", s.ci95);
        assert!((s.ci95[1] - 0.2727).abs() < 5e-4, "{:?}", s.ci95);
        assert!((s.tokens_per_s - 4000.0).abs() < 1e-9);
    }

    #[test]
    fn pooling_adds_counts_and_takes_peak_maxima() {
        let pooled = ArmStats::pool([&block(70, 10, 2.0, 80), &block(75, 5, 3.0, 60)]);
        assert_eq!(pooled.sessions(), 160);
        assert_eq!(pooled.corrupted, 15);
        assert_eq!(pooled.wall_s, 5.0);
        assert_eq!(pooled.peak_running["client"], 80);
        assert_eq!(pooled.first_bad_round, vec![0, 15]);
        assert!((pooled.tokens_per_s - 16000.0 / 5.0).abs() < 1e-9);
    }

    fn session(class: SessionClass) -> SessionResult {
        SessionResult {
            label: "on".into(),
            repeat: 0,
            index: 0,
            class,
            rounds_used: 1,
            first_bad_round: None,
            evidence: String::new(),
            transcript: Vec::new(),
            rounds: Vec::new(),
            latency_ms: Vec::new(),
            completion_tokens: 0,
            error: None,
            oracle: None,
            timing: None,
        }
    }

    #[test]
    fn sessions_are_counted_once_each() {
        let mut s = ArmStats::default();
        let mut leak = session(SessionClass::Leak);
        leak.first_bad_round = Some(3);
        leak.completion_tokens = 42;
        s.add_session(&leak);
        s.add_session(&session(SessionClass::Done));
        s.finish();
        assert_eq!((s.sessions(), s.corrupted, s.completion_tokens), (2, 1, 42));
        assert_eq!(s.first_bad_round, vec![0, 0, 1]);
        s.clear_sessions();
        assert_eq!(s.sessions(), 0);
        assert!(s.first_bad_round.is_empty());
    }

    #[test]
    fn session_timings_become_trend_bins_that_pool_and_clear() {
        use crate::session::SessionTiming;
        let timed = |i: u64, class: SessionClass| SessionResult {
            index: i as u32,
            timing: Some(SessionTiming {
                life: 0,
                started_s: i as f64 / 4.0,
                uptime_s: i as f64 / 4.0,
                request_seq: i,
                ended_s: i as f64 / 4.0 + 1.0,
            }),
            ..session(class)
        };
        let mut s = ArmStats::default();
        for i in 0..40 {
            let class = if i >= 35 {
                SessionClass::Leak
            } else if i % 10 == 3 {
                // Not judged: in no bin.
                SessionClass::Timeout
            } else {
                SessionClass::Done
            };
            s.add_session(&timed(i, class));
        }
        // Without a timing (an older record's sessions): counted, in no bin.
        s.add_session(&session(SessionClass::Leak));
        s.finish();
        // 36 judged sessions with timings: 7 bins of 5 or 6, by request index.
        let sessions: Vec<u64> = s.trend.iter().map(|b| b.sessions).collect();
        assert_eq!(sessions, [5, 5, 5, 5, 5, 5, 6]);
        assert_eq!((s.trend[0].first_seq, s.trend[0].last_seq), (0, 5));
        assert_eq!(s.trend[6].corrupted, 5);
        assert_eq!(s.corrupted, 6);
        // Written to run.json and read back: the bins stand, the timeline is gone.
        let back: ArmStats = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back.trend, s.trend);
        assert!(back.timeline.is_empty());
        let mut again = back.clone();
        again.finish();
        assert_eq!(again.trend, s.trend);
        // Two blocks pool by position; a record without bins adds none and keeps its shape.
        let pooled = ArmStats::pool([&s, &back, &ArmStats::default()]);
        assert_eq!(pooled.trend.len(), 7);
        assert_eq!(pooled.trend[6].sessions, 12);
        let old = serde_json::to_value(ArmStats::default()).unwrap();
        assert!(old.get("trend").is_none());
        s.clear_sessions();
        s.finish();
        assert!(s.trend.is_empty() && s.timeline.is_empty());
    }

    #[test]
    fn a_mismatching_readback_survives_pooling() {
        let text = |a: &str, b: &str| a == b;
        let ok: BTreeMap<String, String> = [("decode".to_string(), "1".to_string())].into();
        let bad: BTreeMap<String, String> = [("decode".to_string(), "0".to_string())].into();
        assert_eq!(pool_readback("1", [&ok, &bad, &ok], text)["decode"], "0");
        assert_eq!(pool_readback("1", [&ok, &ok], text)["decode"], "1");
    }

    #[test]
    fn an_engine_report_that_disagrees_survives_an_agreeing_one_in_other_words() {
        // A switch set "on": the first block's engine reports `true` (agrees), the
        // second's `false` (it did not take the config). Compared as text, `true` is
        // already "not on" and would keep its slot, hiding the `false`.
        let agrees = crate::effective::agrees;
        let yes: BTreeMap<String, String> = [("prefill".to_string(), "true".to_string())].into();
        let no: BTreeMap<String, String> = [("prefill".to_string(), "false".to_string())].into();
        assert_eq!(pool_readback("on", [&yes, &no], agrees)["prefill"], "false");
        assert_eq!(pool_readback("on", [&no, &yes], agrees)["prefill"], "false");
        assert_eq!(pool_readback("on", [&yes, &yes], agrees)["prefill"], "true");
    }

    #[test]
    fn labels_and_statuses_serialise_as_the_contract_names() {
        assert_eq!(serde_json::to_string(&ArmLabel::Off).unwrap(), "\"off\"");
        assert_eq!(ArmLabel::parse("probe"), Some(ArmLabel::Probe));
        assert_eq!(
            serde_json::to_string(&RecordStatus::Interrupted).unwrap(),
            "\"interrupted\""
        );
        assert_eq!(
            serde_json::from_str::<RecordStatus>("\"pending\"").unwrap(),
            RecordStatus::Pending
        );
    }
}
