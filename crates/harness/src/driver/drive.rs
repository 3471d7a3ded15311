//! The workload driver of one arm block: sessions run against the engine's chat API,
//! each sending its `SessionResult` over a channel the moment it ends, so the caller's
//! single collector can append sessions.jsonl incrementally (docs/design.md 3.6).
//!
//! Load is a controlled variable (docs/design.md 3.4): `concurrency` C tokio tasks
//! ("slots") each take the next session index when their session ends, a closed loop
//! that keeps C sessions in flight until the sample is reached, so any number of
//! sessions runs at the same load. Sessions start in index order. By default C equals
//! the number of sessions: every session starts at once, as one burst.
//!
//! Cancellation: when the token fires, sessions still running are dropped mid-request
//! and nothing is sent for them (they are counted in `DriveStats::cancelled`): an
//! interrupted run loses exactly the sessions in flight, and no half session is ever
//! recorded as if it had a class.

use super::barrier::RoundBarrier;
use super::body::Sampling;
use super::client::{tools_payload, ChatClient, Connection, FirstWave, InFlight, WaveSeat};
use super::conversation::{run_session, Prepared, SessionContext};
use crate::config::Workload;
use crate::core::classify::Classifier;
use crate::core::session::{Counts, SessionResult};
use crate::core::stats::percentile;
use anyhow::Context;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// What to drive: one arm block of `sessions` sessions.
#[derive(Debug, Clone)]
pub struct DrivePlan {
    /// OpenAI base URL, e.g. `http://127.0.0.1:8000/v1`.
    pub api: String,
    pub model: String,
    pub api_key: Option<String>,
    pub workload: Workload,
    /// Arm label written into every result (`on`, `off`, a cell or probe label).
    pub label: String,
    pub repeat: u32,
    /// Sessions to run (indices 0..sessions); usually `workload.sessions`, or a
    /// `--sessions` override. Session i gets the same task in every arm and repeat.
    pub sessions: u32,
    /// Sessions in flight at once; 0 (or anything >= `sessions`) starts them all at once.
    pub concurrency: u32,
    /// The solo oracle's references, when the block is judged against them too.
    pub oracle: Option<Arc<super::conversation::Oracle>>,
}

impl DrivePlan {
    /// The number of sessions kept in flight.
    pub fn slots(&self) -> u32 {
        if self.concurrency == 0 {
            self.sessions
        } else {
            self.concurrency.min(self.sessions)
        }
    }
}

/// Totals of one drive.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DriveStats {
    pub wall_s: f64,
    /// Most chat requests this client had open at once (exact, not sampled).
    pub peak_client_inflight: u64,
    pub completion_tokens: u64,
    pub tokens_per_s: f64,
    /// Sessions that finished and were sent.
    pub sessions: u32,
    /// Sessions dropped by cancellation (nothing sent for them).
    pub cancelled: u32,
    pub counts: Counts,
    /// Client-side round latency percentiles over all rounds, milliseconds.
    pub round_latency_p50_ms: f64,
    pub round_latency_p99_ms: f64,
    /// CPU seconds spent classifying replies (inside `wall_s`, concurrent with serving).
    pub(crate) classify_s: f64,
    /// The harness's turn-around between a reply's arrival and the same session's next
    /// request (classification, tool answers, scheduling), milliseconds.
    pub send_lag_p50_ms: f64,
    pub send_lag_p99_ms: f64,
    /// Chat requests sent (rounds over all finished sessions).
    pub requests: u64,
    /// Connection set-up and load shedding, as the connect pacer saw them.
    pub transport: crate::core::transport::TransportStats,
}

struct Finished {
    class: crate::core::session::SessionClass,
    completion_tokens: u64,
    round_latency_us: Vec<u64>,
    send_lag_us: Vec<u64>,
}

/// What one slot did: the sessions it finished, and whether the collector went away.
#[derive(Default)]
struct SlotOutcome {
    finished: Vec<Finished>,
    collector_gone: bool,
}

/// One of the `concurrency` slots: runs sessions one after another, each time taking
/// the next index, until the sample is reached or the drive is stopped.
struct Slot {
    ctx: Arc<SessionContext>,
    barrier: Option<Arc<RoundBarrier>>,
    results: mpsc::Sender<SessionResult>,
    stop: CancellationToken,
    /// The session indices this drive runs, in order, and the position of the next.
    order: Arc<[u32]>,
    next: Arc<AtomicU32>,
    /// Kept alive from one session of this slot to the next, like a pooled connection.
    connection: Connection,
    /// The slot's first session, built before the clock started.
    first: Option<Prepared>,
    /// Its place in the opening burst (its first request only).
    wave: Option<WaveSeat>,
}

impl Slot {
    async fn run(mut self) -> SlotOutcome {
        let mut outcome = SlotOutcome::default();
        loop {
            if self.stop.is_cancelled() {
                return outcome;
            }
            // Once an engine of the block died, no session starts on it: the sessions
            // not started run on the restarted engine (arm::Testbed::drive_observed).
            if self.ctx.inflight.gate().is_engine_dead() {
                return outcome;
            }
            let session = match self.first.take() {
                Some(first) => first,
                None => {
                    let at = self.next.fetch_add(1, Ordering::Relaxed);
                    let Some(&index) = self.order.get(at as usize) else {
                        return outcome;
                    };
                    Prepared::new(&self.ctx.workload, index)
                }
            };
            let seat = self.barrier.as_deref().map(RoundBarrier::seat);
            let run = tokio::select! {
                biased;
                run = run_session(&self.ctx, session, seat, &mut self.connection, self.wave.take()) => run,
                _ = self.stop.cancelled() => return outcome,
            };
            let finished = Finished {
                class: run.result.class,
                completion_tokens: run.result.completion_tokens,
                round_latency_us: run.round_latency_us,
                send_lag_us: run.send_lag_us,
            };
            if self.results.send(run.result).await.is_err() {
                self.stop.cancel();
                outcome.collector_gone = true;
                return outcome;
            }
            outcome.finished.push(finished);
        }
    }
}

/// How long the opening phase waits for connects after the pacer's last scheduled
/// start: shorter than the kernel's first SYN retransmission (1 s), so a SYN a full
/// listen queue dropped does not hold the opening wave.
const OPEN_PATIENCE: Duration = Duration::from_millis(500);

/// Opens up to `slots` connections through the pacer; those not open within
/// [`OPEN_PATIENCE`] of the last scheduled start (which moves later as the pacer
/// widens) are left for their slot's first request.
async fn open_connections(ctx: &SessionContext, slots: u32) -> Vec<Connection> {
    use futures::StreamExt;
    let gate = ctx.inflight.gate();
    let began = tokio::time::Instant::now();
    let patience_end = || gate.last_start().unwrap_or(began).max(began) + OPEN_PATIENCE;
    let mut opening: futures::stream::FuturesUnordered<_> = (0..slots)
        .map(|_| async {
            let mut connection = Connection::new();
            ctx.client.open(&mut connection, gate).await;
            connection
        })
        .collect();
    let mut opened = Vec::with_capacity(slots as usize);
    loop {
        let until = patience_end();
        tokio::select! {
            next = opening.next() => match next {
                Some(connection) => opened.push(connection),
                None => break,
            },
            () = tokio::time::sleep_until(until) => {
                if patience_end() <= tokio::time::Instant::now() {
                    break;
                }
            }
        }
    }
    opened
}

/// One engine life's part of a block: which of the plan's sessions it runs, and the
/// clocks its sessions' [`SessionTiming`](crate::core::session::SessionTiming) is read
/// against. A block whose engine never dies is one life running every session.
#[derive(Debug, Clone)]
pub struct Life {
    /// The engine life within the block: 0 until the first death, one more per restart.
    pub life: u32,
    /// The session indices to run, in order.
    pub indices: Vec<u32>,
    /// When the block's drive started (its first life's).
    pub block_started: Instant,
    /// When this engine life started (the engines healthy).
    pub life_started: Instant,
}

impl Life {
    /// The whole block on one life starting now: sessions `0..plan.sessions`.
    pub fn whole(plan: &DrivePlan) -> Self {
        let now = Instant::now();
        Life {
            life: 0,
            indices: (0..plan.sessions).collect(),
            block_started: now,
            life_started: now,
        }
    }
}

/// Runs every session of `plan`, sending each result on `results` as it ends.
/// Fails if the HTTP client cannot be built, a session task panics, or the results
/// receiver is gone (then the remaining sessions are stopped: their results would be lost).
pub async fn drive(
    plan: &DrivePlan,
    classifier: Arc<Classifier>,
    results: mpsc::Sender<SessionResult>,
    inflight: Arc<InFlight>,
    cancel: CancellationToken,
) -> anyhow::Result<DriveStats> {
    drive_life(
        plan,
        &Life::whole(plan),
        classifier,
        results,
        inflight,
        cancel,
    )
    .await
}

/// [`drive`] of the sessions `life` names, at the plan's concurrency, on one engine
/// life: once the block's connect gate hears of a death, no further session starts
/// (those in flight end `crashed`), and `DriveStats::cancelled` counts the ones never
/// started.
pub async fn drive_life(
    plan: &DrivePlan,
    life: &Life,
    classifier: Arc<Classifier>,
    results: mpsc::Sender<SessionResult>,
    inflight: Arc<InFlight>,
    cancel: CancellationToken,
) -> anyhow::Result<DriveStats> {
    let mut ctx = session_context(plan, classifier, inflight.clone())?;
    Arc::get_mut(&mut ctx)
        .expect("the context is not shared yet")
        .timeline = super::conversation::Timeline {
        life: life.life,
        block_started: life.block_started,
        life_started: life.life_started,
    };
    let workload = ctx.workload.clone();
    let sessions = life.indices.len() as u32;
    let slots = if plan.concurrency == 0 {
        sessions
    } else {
        plan.concurrency.min(sessions)
    };
    if workload.barrier && slots < sessions {
        anyhow::bail!(
            "the round barrier needs every session in flight at once, but concurrency {slots} < {sessions} sessions\n  fix: drop `barrier` from the workload, or run with --concurrency equal to --sessions",
        );
    }
    let barrier = workload
        .barrier
        .then(|| Arc::new(RoundBarrier::new(sessions as usize)));
    // Stops the sessions on the caller's cancel, or when the collector went away.
    let stop = cancel.child_token();
    // Before the clock: each slot's connection is opened, so the opening burst is the
    // sessions' first requests, not thousands of connects and task set-ups racing the
    // first sessions' later rounds (at 1000 in flight the first sessions used to finish
    // before the last had connected, so the target load was never reached). The connects
    // go through the drive's pacer (`connect.rs`: a burst of them overflowed a small
    // listen backlog), and the phase waits for a slow one only a little: a connect
    // still unfinished then (its SYN dropped and due again in a second) is dropped, and
    // its slot connects with its first request instead of holding every other slot.
    let opened = tokio::select! {
        opened = open_connections(&ctx, slots) => opened,
        _ = stop.cancelled() => Vec::new(),
    };
    let mut connections = opened.into_iter();
    let order: Arc<[u32]> = life.indices.clone().into();
    let next = Arc::new(AtomicU32::new(slots));
    let wave = Arc::new(FirstWave::new(slots));

    // Slots wait at this gate until all are spawned, so the first sessions start as one
    // burst even when the spawning thread is slow or descheduled: the load shape must
    // not depend on how fast tasks were created.
    let start = CancellationToken::new();
    let mut tasks = JoinSet::new();
    for index in 0..slots {
        let slot = Slot {
            ctx: ctx.clone(),
            barrier: barrier.clone(),
            results: results.clone(),
            stop: stop.clone(),
            order: order.clone(),
            next: next.clone(),
            connection: connections.next().unwrap_or_default(),
            first: Some(Prepared::new(&workload, order[index as usize])),
            wave: Some(wave.seat()),
        };
        let start = start.clone();
        tasks.spawn(async move {
            start.cancelled().await;
            slot.run().await
        });
    }
    drop(results);
    let started = Instant::now();
    start.cancel();

    let joined = join_slots(&mut tasks, &stop).await;
    let mut stats = drive_stats(&ctx, &inflight, started, joined.finished);
    // Sessions that never finished (stopped mid-flight, or never started because the
    // run was stopped) are not recorded: count them, so nothing is silently missing.
    stats.cancelled = sessions - stats.sessions;

    if let Some(message) = joined.panicked {
        anyhow::bail!("a session task of arm {} failed: {message}", plan.label);
    }
    if joined.collector_gone {
        anyhow::bail!(
            "the session results receiver closed during arm {}; {} sessions were stopped unrecorded",
            plan.label,
            stats.cancelled
        );
    }
    Ok(stats)
}

impl DrivePlan {
    /// The chat client for this plan's API with the workload's tools, temperature,
    /// request options and timeout, its replies cut at `max_tokens`.
    pub(crate) fn client(&self, max_tokens: u32) -> anyhow::Result<ChatClient> {
        let w = &self.workload;
        let timeout = Duration::from_secs_f64(w.timeout_s.max(0.001));
        Ok(
            ChatClient::new(&self.api, &self.model, self.api_key.clone(), timeout)
                .with_context(|| format!("chat client for {}", self.api))?
                .with_request(
                    &tools_payload(&w.tools),
                    Sampling {
                        max_tokens,
                        temperature: w.temperature,
                    },
                    &w.request,
                ),
        )
    }
}

/// What every slot shares: the workload, the chat client built for `plan`'s API with
/// the workload's tools, sampling and request options, and the classifier.
pub(crate) fn session_context(
    plan: &DrivePlan,
    classifier: Arc<Classifier>,
    inflight: Arc<InFlight>,
) -> anyhow::Result<Arc<SessionContext>> {
    let workload = Arc::new(plan.workload.clone());
    let client = plan.client(workload.max_tokens)?;
    Ok(Arc::new(SessionContext {
        workload,
        client,
        classifier,
        inflight,
        label: plan.label.clone(),
        repeat: plan.repeat,
        classify_ns: Default::default(),
        oracle: plan.oracle.clone(),
        timeline: super::conversation::Timeline::now(),
    }))
}

/// The slots' outcomes put together: every finished session, whether the results
/// receiver went away, and the first slot task that failed.
struct Joined {
    finished: Vec<Finished>,
    collector_gone: bool,
    panicked: Option<String>,
}

/// Waits for every slot; a slot task that fails stops the others.
async fn join_slots(tasks: &mut JoinSet<SlotOutcome>, stop: &CancellationToken) -> Joined {
    let mut joined = Joined {
        finished: Vec::new(),
        collector_gone: false,
        panicked: None,
    };
    while let Some(result) = tasks.join_next().await {
        match result {
            Ok(outcome) => {
                joined.finished.extend(outcome.finished);
                joined.collector_gone |= outcome.collector_gone;
            }
            Err(e) => {
                stop.cancel();
                joined.panicked.get_or_insert_with(|| e.to_string());
            }
        }
    }
    joined
}

/// The drive's statistics from its finished sessions: counts, tokens, wall time since
/// `started`, and the round-latency and send-lag percentiles.
fn drive_stats(
    ctx: &SessionContext,
    inflight: &InFlight,
    started: Instant,
    finished: Vec<Finished>,
) -> DriveStats {
    let mut stats = DriveStats::default();
    let mut latencies: Vec<u64> = Vec::new();
    let mut lags: Vec<u64> = Vec::new();
    for done in finished {
        stats.sessions += 1;
        stats.counts.add(done.class);
        stats.completion_tokens += done.completion_tokens;
        stats.requests += done.round_latency_us.len() as u64;
        latencies.extend(done.round_latency_us);
        lags.extend(done.send_lag_us);
    }
    stats.wall_s = started.elapsed().as_secs_f64();
    stats.classify_s = ctx.classify_ns.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1e9;
    stats.peak_client_inflight = inflight.peak();
    stats.transport = inflight.gate().stats();
    stats.tokens_per_s = if stats.wall_s > 0.0 {
        stats.completion_tokens as f64 / stats.wall_s
    } else {
        0.0
    };
    latencies.sort_unstable();
    stats.round_latency_p50_ms = percentile(&latencies, 0.50) as f64 / 1000.0;
    stats.round_latency_p99_ms = percentile(&latencies, 0.99) as f64 / 1000.0;
    lags.sort_unstable();
    stats.send_lag_p50_ms = percentile(&lags, 0.50) as f64 / 1000.0;
    stats.send_lag_p99_ms = percentile(&lags, 0.99) as f64 / 1000.0;
    stats
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::session::SessionClass;
    use crate::driver::sample::sample_workload;
    use bisect_engine::mock::{Fault, FaultRule, MockConfig, MockServer};

    async fn run(
        config: MockConfig,
        workload: Workload,
        cancel_after: Option<Duration>,
    ) -> (DriveStats, Vec<SessionResult>, MockServer) {
        run_at(config, workload, 0, cancel_after).await.unwrap()
    }

    async fn run_at(
        config: MockConfig,
        workload: Workload,
        concurrency: u32,
        cancel_after: Option<Duration>,
    ) -> anyhow::Result<(DriveStats, Vec<SessionResult>, MockServer)> {
        let server = MockServer::start(config).await.unwrap();
        let plan = DrivePlan {
            api: server.api(),
            model: "mock".into(),
            api_key: Some("sk-test".into()),
            sessions: workload.sessions,
            concurrency,
            oracle: None,
            workload,
            label: "on".into(),
            repeat: 1,
        };
        let cancel = CancellationToken::new();
        if let Some(after) = cancel_after {
            let cancel = cancel.clone();
            tokio::spawn(async move {
                tokio::time::sleep(after).await;
                cancel.cancel();
            });
        }
        let (stats, results) = crate::driver::sample::drive_collected(&plan, cancel).await?;
        Ok((stats, results, server))
    }

    /// The sessions whose task message a fault rule selects, computed like the mock does.
    fn selected(workload: &Workload, rule: &FaultRule) -> Vec<u32> {
        (0..workload.sessions)
            .filter(|&i| {
                let (_, messages) = crate::core::task::initial_conversation(workload, i);
                rule.selects(messages.last().unwrap().content.as_deref().unwrap())
            })
            .collect()
    }

    /// A life runs exactly the sessions it names, at the plan's concurrency, each with
    /// its timing against the life; once the gate hears of a death, nothing new starts.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_life_runs_its_sessions_and_starts_none_after_a_death() {
        let workload = sample_workload(12, 2);
        let server = MockServer::start(MockConfig::default()).await.unwrap();
        let plan = DrivePlan {
            api: server.api(),
            model: "mock".into(),
            api_key: None,
            sessions: workload.sessions,
            concurrency: 2,
            oracle: None,
            workload,
            label: "on".into(),
            repeat: 0,
        };
        let began = Instant::now();
        let life = Life {
            life: 2,
            indices: vec![9, 3, 7],
            block_started: began,
            life_started: began,
        };
        let collect = |inflight: Arc<InFlight>| {
            let (plan, life) = (plan.clone(), life.clone());
            async move {
                let (tx, mut rx) = mpsc::channel(16);
                let classifier = Arc::new(Classifier::with_defaults(&plan.workload.tools).unwrap());
                let driven = tokio::spawn(async move {
                    drive_life(
                        &plan,
                        &life,
                        classifier,
                        tx,
                        inflight,
                        CancellationToken::new(),
                    )
                    .await
                });
                let mut got = Vec::new();
                while let Some(s) = rx.recv().await {
                    got.push(s);
                }
                (driven.await.unwrap().unwrap(), got)
            }
        };
        let (stats, got) = collect(Arc::new(InFlight::new())).await;
        let mut indices: Vec<u32> = got.iter().map(|s| s.index).collect();
        indices.sort_unstable();
        assert_eq!(indices, vec![3, 7, 9]);
        assert_eq!((stats.sessions, stats.cancelled), (3, 0));
        for s in &got {
            let timing = s.timing.expect("a driven session has its timing");
            assert_eq!(timing.life, 2);
            assert!(timing.ended_s >= timing.started_s);
        }
        // The first two sessions take request indices 0 and 1 (one each at once).
        let mut seqs: Vec<u64> = got.iter().map(|s| s.timing.unwrap().request_seq).collect();
        seqs.sort_unstable();
        assert_eq!(&seqs[..2], &[0, 1]);
        // A gate that has heard of a death: no session starts, each counted as not run.
        let dead = Arc::new(InFlight::new());
        dead.gate().engine_died();
        let (stats, got) = collect(dead).await;
        assert!(got.is_empty(), "{}", got.len());
        assert_eq!(stats.cancelled, 3);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn clean_mock_completes_every_session() {
        let mut workload = sample_workload(40, 6);
        workload.ctx = 300;
        let steps = workload.task.steps;
        let (stats, results, server) = run(MockConfig::default(), workload, None).await;
        assert_eq!(stats.sessions, 40);
        assert_eq!(stats.cancelled, 0);
        assert_eq!(stats.counts[SessionClass::Done], 40, "{:?}", stats.counts);
        assert_eq!(results.len(), 40);
        for (i, r) in results.iter().enumerate() {
            assert_eq!(r.index, i as u32);
            assert_eq!(r.label, "on");
            assert_eq!(r.class, SessionClass::Done, "{}", r.evidence);
            assert_eq!(r.rounds_used, steps + 1);
            assert_eq!(r.first_bad_round, None);
            assert_eq!(r.rounds.len(), r.latency_ms.len());
            let tools = r.transcript.iter().filter(|m| m.role == "tool").count();
            assert_eq!(tools as u32, steps);
            assert_eq!(r.transcript.last().unwrap().role, "assistant");
        }
        assert!(stats.completion_tokens > 0);
        assert_eq!(
            stats.completion_tokens,
            results.iter().map(|r| r.completion_tokens).sum::<u64>()
        );
        assert!(stats.peak_client_inflight >= 1 && stats.peak_client_inflight <= 40);
        assert_eq!(server.stats().requests(), 40 * u64::from(steps + 1));
        assert_eq!(server.stats().bearer_seen(), server.stats().requests());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn deliberate_corruption_is_counted_exactly() {
        let mut workload = sample_workload(60, 6);
        workload.timeout_s = 1.5;
        let rules = vec![
            FaultRule::new(8, 0, 2, Fault::LeakDsml),
            FaultRule::new(8, 1, 1, Fault::Status500),
            FaultRule::new(8, 2, 3, Fault::WrongArgs),
            FaultRule::new(8, 3, 2, Fault::BadJsonArgs),
            FaultRule::new(8, 4, 1, Fault::NoTool),
            FaultRule::new(8, 5, 2, Fault::GarbageBody),
            FaultRule::new(8, 6, 1, Fault::Sleep(Duration::from_secs(8))),
        ];
        let expect: Vec<(Vec<u32>, SessionClass, u32)> = rules
            .iter()
            .map(|r| {
                let class = match r.fault {
                    Fault::LeakDsml => SessionClass::Leak,
                    Fault::Status500 | Fault::GarbageBody => SessionClass::Error,
                    Fault::WrongArgs => SessionClass::WrongArgs,
                    Fault::BadJsonArgs => SessionClass::BadArgs,
                    Fault::NoTool => SessionClass::NoTool,
                    Fault::Sleep(_) => SessionClass::Timeout,
                };
                (selected(&workload, r), class, r.round)
            })
            .collect();
        let (stats, results, _server) = run(
            MockConfig {
                faults: rules,
                ..Default::default()
            },
            workload.clone(),
            None,
        )
        .await;
        assert_eq!(results.len(), 60);
        let mut expected_counts = Counts::default();
        let mut claimed = std::collections::BTreeSet::new();
        for (sessions, class, round) in &expect {
            assert!(
                !sessions.is_empty(),
                "every fault rule must pick a session ({class:?})"
            );
            for &i in sessions {
                assert!(claimed.insert(i), "rules must pick disjoint sessions");
                let r = &results[i as usize];
                assert_eq!(r.class, *class, "session {i}: {}", r.evidence);
                assert_eq!(r.first_bad_round, Some(*round), "session {i}");
                assert_eq!(r.rounds_used, *round, "session {i}");
                expected_counts.add(*class);
                if class.is_failure() {
                    assert!(r.error.is_some(), "session {i} has no error text");
                }
            }
        }
        expected_counts[SessionClass::Done] = 60 - claimed.len() as u64;
        assert_eq!(stats.counts, expected_counts);
        assert!(stats.counts.corrupted() >= 10, "{:?}", stats.counts);
        assert!(
            stats.counts[SessionClass::Timeout] >= 1,
            "seed must select a sleeper: {:?}",
            stats.counts
        );
        let error_500 = results
            .iter()
            .find(|r| r.error.as_deref().is_some_and(|e| e.contains("HTTP 500")))
            .expect("a 500 session");
        assert!(error_500
            .error
            .as_ref()
            .unwrap()
            .contains("injected failure"));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shipped_workloads_run_clean_against_the_mock() {
        for name in crate::config::workload::builtin_workload_names() {
            let mut workload = crate::config::builtin_workload(name).unwrap();
            workload.sessions = workload.sessions.min(12);
            workload.ctx = workload.ctx.min(2000);
            let sessions = u64::from(workload.sessions);
            let (stats, results, _server) = run(MockConfig::default(), workload, None).await;
            assert_eq!(
                stats.counts[SessionClass::Done],
                sessions,
                "{name}: {:?}",
                stats.counts
            );
            assert!(results
                .iter()
                .all(|r| r.transcript.iter().any(|m| m.role == "tool")));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn rounds_running_out_is_maxrounds() {
        let mut workload = sample_workload(5, 3);
        workload.rounds = 2;
        let (stats, results, _server) = run(MockConfig::default(), workload, None).await;
        assert_eq!(stats.counts[SessionClass::Maxrounds], 5);
        for r in results {
            assert_eq!(r.rounds_used, 2);
            assert!(r.evidence.contains("2 of 3 steps"), "{}", r.evidence);
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn barrier_keeps_rounds_in_lockstep() {
        let mut workload = sample_workload(24, 4);
        workload.barrier = true;
        let rule = FaultRule::new(4, 1, 2, Fault::NoTool);
        let early = selected(&workload, &rule).len() as u64;
        let config = MockConfig {
            faults: vec![rule],
            jitter_ms: 15,
            ..MockConfig::default()
        };
        let (stats, _results, server) = run(config, workload, None).await;
        assert_eq!(stats.counts[SessionClass::NoTool], early);
        assert_eq!(stats.counts[SessionClass::Done], 24 - early);
        let rounds = server.stats().round_arrivals();
        assert!(
            rounds.windows(2).all(|w| w[0] <= w[1]),
            "rounds interleaved: {rounds:?}"
        );
        assert_eq!(*rounds.last().unwrap(), 4);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cancellation_drops_sessions_in_flight_and_sends_the_rest() {
        let mut workload = sample_workload(20, 4);
        workload.timeout_s = 60.0;
        let rule = FaultRule::new(2, 0, 1, Fault::Sleep(Duration::from_secs(30)));
        let sleepers = selected(&workload, &rule);
        let config = MockConfig {
            faults: vec![rule],
            ..Default::default()
        };
        let started = Instant::now();
        let (stats, results, _server) =
            run(config, workload, Some(Duration::from_millis(1500))).await;
        assert!(started.elapsed() < Duration::from_secs(10));
        assert_eq!(stats.cancelled as usize, sleepers.len());
        assert_eq!(results.len(), 20 - sleepers.len());
        assert!(results.iter().all(|r| !sleepers.contains(&r.index)));
        assert!(results.iter().all(|r| r.class == SessionClass::Done));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn closed_loop_keeps_the_concurrency_until_the_sample_is_reached() {
        let mut workload = sample_workload(24, 6);
        workload.timeout_s = 30.0;
        // Every first request takes 200 ms: the first four sessions overlap for sure.
        let rule = FaultRule::new(1, 0, 1, Fault::Sleep(Duration::from_millis(200)));
        let config = MockConfig {
            faults: vec![rule],
            ..Default::default()
        };
        let (stats, results, _server) = run_at(config, workload, 4, None).await.unwrap();
        assert_eq!(stats.sessions, 24);
        assert_eq!(stats.cancelled, 0);
        assert_eq!(stats.peak_client_inflight, 4, "never more, and reached");
        let indices: Vec<u32> = results.iter().map(|r| r.index).collect();
        assert_eq!(indices, (0..24).collect::<Vec<_>>());
        assert!(
            results.iter().all(|r| r.class == SessionClass::Done),
            "{:?}",
            results.iter().map(|r| &r.evidence).collect::<Vec<_>>()
        );
        // Six waves of four sessions, each first round 200 ms: the loop really cycled.
        assert!(stats.wall_s >= 1.2, "{}", stats.wall_s);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_round_barrier_below_full_concurrency_is_refused() {
        let mut workload = sample_workload(8, 2);
        workload.barrier = true;
        let err = run_at(MockConfig::default(), workload, 4, None)
            .await
            .err()
            .expect("refused");
        assert!(format!("{err:#}").contains("round barrier"), "{err:#}");
    }

    /// A TCP relay in front of `upstream` that counts the connections it accepts.
    async fn counting_relay(upstream: std::net::SocketAddr) -> (String, Arc<AtomicU32>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let accepted = Arc::new(AtomicU32::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut outbound = tokio::net::TcpStream::connect(upstream).await.unwrap();
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                });
            }
        });
        (format!("http://{addr}/v1"), accepted)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn each_slot_keeps_one_connection_and_the_opening_burst_reaches_every_slot() {
        let server = MockServer::start(MockConfig::default()).await.unwrap();
        for (sessions, concurrency) in [(40u32, 8u32), (30, 0)] {
            let (api, accepted) = counting_relay(server.addr()).await;
            let workload = sample_workload(sessions, 4);
            let classifier = Arc::new(Classifier::with_defaults(&workload.tools).unwrap());
            let plan = DrivePlan {
                api,
                model: "mock".into(),
                api_key: None,
                sessions,
                concurrency,
                oracle: None,
                workload,
                label: "on".into(),
                repeat: 1,
            };
            let (tx, mut rx) = mpsc::channel(64);
            let collector = tokio::spawn(async move { while rx.recv().await.is_some() {} });
            let stats = drive(
                &plan,
                classifier,
                tx,
                Arc::new(InFlight::new()),
                CancellationToken::new(),
            )
            .await
            .unwrap();
            collector.await.unwrap();
            assert_eq!(
                stats.counts[SessionClass::Done],
                u64::from(sessions),
                "{:?}",
                stats.counts
            );
            assert!(stats.requests >= 4 * u64::from(sessions));
            assert_eq!(
                accepted.load(Ordering::SeqCst),
                plan.slots(),
                "{sessions} sessions at {concurrency}: one connection per slot"
            );
            // The opening burst is delivered whatever the server's speed: every slot's
            // first request is out before any first reply is acted on.
            assert_eq!(stats.peak_client_inflight, u64::from(plan.slots()));
        }
    }
}
