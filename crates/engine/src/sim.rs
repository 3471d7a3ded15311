//! In-process, deterministic simulation of the whole engine under a multi-session
//! agentic load: N sessions x R rounds drive the real prefill core and the real decode
//! read-back path directly (no HTTP), in virtual time. One tick is one prefill
//! scheduler step; decode advances every running request by one token every
//! `ticks_per_decode_step` ticks; a session sends its next round a small deterministic
//! delay after its reply. Each round's reply is checked against what the task's current
//! step asked for, as the harness would; a session is corrupted at its first bad round.
//!
//! This is how the engine's tuning parameters were chosen (see `PrefillOptions::tuned`)
//! and what the engine's load-dependence tests assert on.

use super::backend::{AttnPath, Backend, IndexKDtype, TopkImpl};
use super::dsml;
use super::model::{
    self, decide, decode_step, Generation, Intent, ReadPath, SequenceKv, DEFAULT_TOP_K,
};
use super::prefill::{PrefillCore, PrefillCounters, PrefillOptions};
use super::template::{Conversation, ToolFunction, Turn};
use super::tokenizer::Vocab;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Map, Value};
use std::collections::HashMap;

#[derive(Debug, Clone)]
pub(crate) struct SimConfig {
    pub(crate) sessions: usize,
    pub(crate) rounds: usize,
    /// Filler tokens of earlier conversation before each session's task (about).
    pub(crate) ctx_tokens: usize,
    pub(crate) steps: usize,
    pub(crate) prefill: PrefillOptions,
    pub(crate) read: ReadPath,
    pub(crate) ticks_per_decode_step: u64,
    /// Client think time after a reply: 0..=this many ticks, hash-chosen per round.
    pub(crate) client_delay_max: u64,
    /// Decode's running-batch cap (more wait in its queue).
    pub(crate) max_running: usize,
    pub(crate) seed: u64,
    /// false: decode emits the planned tokens without reading memory (a timing model
    /// only, for fast prefill-side tests that count stale index-K shipments).
    pub(crate) read_back: bool,
}

impl SimConfig {
    /// The default workload's shape: 80 sessions x 4 rounds, 3 steps, ~300 filler tokens.
    pub(crate) fn default_workload(dtype: IndexKDtype, hicache: bool, index_k_sync: bool) -> Self {
        SimConfig {
            sessions: 80,
            rounds: 4,
            ctx_tokens: 300,
            steps: 3,
            prefill: PrefillOptions::tuned(dtype, hicache, index_k_sync),
            read: ReadPath {
                dtype,
                top_k: DEFAULT_TOP_K,
                topk: TopkImpl::V2,
                attn: AttnPath::Mma,
                max_graph_batch: 32,
            },
            ticks_per_decode_step: 4,
            client_delay_max: 6,
            max_running: 256,
            seed: 7,
            read_back: true,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub(crate) struct SimReport {
    pub(crate) sessions: usize,
    pub(crate) corrupted: usize,
    pub(crate) done: usize,
    pub(crate) rounds: usize,
    pub(crate) corrupted_rounds_with_stale_index_k: usize,
    pub(crate) counters: PrefillCounters,
    pub(crate) ticks: u64,
    /// A few corrupted replies, for eyeballing.
    pub(crate) examples: Vec<String>,
}

impl SimReport {
    pub(crate) fn rate(&self) -> f64 {
        self.corrupted as f64 / self.sessions.max(1) as f64
    }
}

const WORDS: [&str; 24] = [
    "service", "config", "deploy", "logs", "latency", "cache", "worker", "queue", "metrics",
    "restart", "timeout", "request", "version", "module", "build", "cluster", "node", "error",
    "retry", "schema", "index", "batch", "memory", "thread",
];
const PATHS: [&str; 8] = [
    "/srv/app/config.yaml",
    "/srv/app/main.py",
    "/etc/nginx/nginx.conf",
    "/var/log/app/error.log",
    "/srv/app/requirements.txt",
    "/opt/worker/settings.toml",
    "/srv/app/routes/api.py",
    "/home/deploy/.env",
];
const PATTERNS: [&str; 6] = [
    "timeout",
    "ERROR",
    "max_connections",
    "retry_limit",
    "TODO",
    "listen",
];
const COMMANDS: [&str; 5] = [
    "systemctl status app",
    "df -h",
    "uptime",
    "ls -la /srv/app",
    "git log -3",
];

/// The tools the simulated sessions are offered.
pub(crate) fn sim_tools() -> Vec<ToolFunction> {
    let tool = |name: &str, description: &str, parameters: Value| ToolFunction {
        name: name.to_string(),
        description: Some(description.to_string()),
        parameters: Some(parameters),
    };
    vec![
        tool(
            "read_file",
            "Read a text file.",
            json!({"type": "object", "properties": {"path": {"type": "string"}, "max_lines": {"type": "integer"}}, "required": ["path"]}),
        ),
        tool(
            "grep",
            "Search a file for a pattern.",
            json!({"type": "object", "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}}, "required": ["pattern", "path"]}),
        ),
        tool(
            "list_dir",
            "List a directory.",
            json!({"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}),
        ),
        tool(
            "run_command",
            "Run a shell command.",
            json!({"type": "object", "properties": {"command": {"type": "string"}, "timeout_s": {"type": "integer"}}, "required": ["command"]}),
        ),
    ]
}

fn random_step(rng: &mut ChaCha8Rng) -> (String, Map<String, Value>) {
    let pick =
        |rng: &mut ChaCha8Rng, pool: &[&str]| pool[rng.random_range(0..pool.len())].to_string();
    let (name, arguments) = match rng.random_range(0..4) {
        0 => (
            "read_file",
            json!({"path": pick(rng, &PATHS), "max_lines": rng.random_range(1..9) * 10}),
        ),
        1 => (
            "grep",
            json!({"pattern": pick(rng, &PATTERNS), "path": pick(rng, &PATHS)}),
        ),
        2 => (
            "list_dir",
            json!({"path": pick(rng, &PATHS).rsplit_once('/').map(|(dir, _)| dir.to_string()).unwrap_or_default()}),
        ),
        _ => (
            "run_command",
            json!({"command": pick(rng, &COMMANDS), "timeout_s": rng.random_range(1..7) * 5}),
        ),
    };
    (
        name.to_string(),
        arguments.as_object().cloned().unwrap_or_default(),
    )
}

/// `key=JSON` argument list as a task line writes it.
fn task_arguments(arguments: &Map<String, Value>) -> String {
    arguments
        .iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Filler text of roughly `tokens` tokens (similar-looking sentences).
pub(crate) fn filler_text(rng: &mut ChaCha8Rng, tokens: usize) -> String {
    let mut text = String::new();
    let mut count = 0;
    while count < tokens {
        let sentence = format!(
            "The {} {} on node {} reported {} {} after the {} {}. ",
            WORDS[rng.random_range(0..WORDS.len())],
            WORDS[rng.random_range(0..WORDS.len())],
            rng.random_range(1..40),
            rng.random_range(2..500),
            WORDS[rng.random_range(0..WORDS.len())],
            WORDS[rng.random_range(0..WORDS.len())],
            WORDS[rng.random_range(0..WORDS.len())],
        );
        count += super::tokenizer::split(&sentence).len();
        text.push_str(&sentence);
    }
    text
}

/// A session's opening conversation: filler turns, then the task message.
fn session_opening(seed: u64, session: usize, ctx_tokens: usize, steps: usize) -> Vec<Turn> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ (session as u64).wrapping_mul(0x9E37_79B9));
    let mut turns = Vec::new();
    if ctx_tokens > 0 {
        turns.push(Turn::User(format!(
            "Earlier notes: {}",
            filler_text(&mut rng, ctx_tokens / 2)
        )));
        turns.push(Turn::Assistant {
            content: filler_text(&mut rng, ctx_tokens / 2),
            calls: vec![],
        });
    }
    let mut task = String::from(
        "Please help me check this server. Do these steps in order, one tool call per reply:\n",
    );
    for index in 0..steps {
        let (name, arguments) = random_step(&mut rng);
        task.push_str(&format!(
            "{}. {}({})\n",
            index + 1,
            name,
            task_arguments(&arguments)
        ));
    }
    task.push_str("When every step is done, reply exactly: DONE: all steps completed.");
    turns.push(Turn::User(task));
    turns
}

fn tool_result(name: &str, arguments: &Map<String, Value>) -> String {
    format!(
        "ok: {name} finished ({} arguments). exit status 0, 12 lines of output.",
        arguments.len()
    )
}

struct SessionState {
    turns: Vec<Turn>,
    rounds_used: usize,
    finished: bool,
    next_send: Option<u64>,
}

struct InFlight {
    session: usize,
    generation: Generation,
    prompt: Vec<u32>,
    expected: Intent,
}

/// Deterministic per-(session, round) client delay.
fn client_delay(seed: u64, session: usize, round: usize, max: u64) -> u64 {
    let mut z = seed ^ ((session as u64) << 32) ^ round as u64;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    (z ^ (z >> 31)) % (max + 1)
}

fn is_correct(expected: &Intent, output: &dsml::ParsedOutput) -> bool {
    match expected {
        Intent::Call((name, arguments)) => {
            output.content.is_none()
                && output.tool_calls.len() == 1
                && &output.tool_calls[0].name == name
                && serde_json::from_str::<Value>(&output.tool_calls[0].arguments).ok()
                    == Some(Value::Object(arguments.clone()))
        }
        Intent::Answer(answer) => {
            output.tool_calls.is_empty() && output.content.as_deref() == Some(answer.as_str())
        }
    }
}

/// Run the simulation to the end of every session.
pub(crate) fn run(config: &SimConfig, backend: &dyn Backend) -> anyhow::Result<SimReport> {
    run_split(config, backend, backend)
}

/// [`run`] with prefill and decode on different backends (the GPU race measurement
/// runs prefill's pool on CUDA and decode's read-back on the CPU: the race is prefill's,
/// and the CPU reads the shipped bytes the same way, in a fraction of the time the
/// CUDA slice path's per-call uploads take).
pub(crate) fn run_split(
    config: &SimConfig,
    backend: &dyn Backend,
    decode_backend: &dyn Backend,
) -> anyhow::Result<SimReport> {
    anyhow::ensure!(
        config.prefill.dtype == config.read.dtype,
        "prefill and decode index-K dtypes differ"
    );
    let mut prefill = PrefillCore::for_backend(config.prefill.clone(), backend)?;
    let mut sim = Simulation::new(config);
    let mut tick = 0u64;
    while sim.sessions.iter().any(|s| !s.finished) {
        // Idle: jump to the next send.
        if !prefill.has_work() && sim.running.is_empty() && sim.decode_queue.is_empty() {
            let next = sim.sessions.iter().filter_map(|s| s.next_send).min();
            match next {
                Some(at) if at > tick => tick = at,
                Some(_) => {}
                None => anyhow::bail!("simulation stalled with unfinished sessions"),
            }
        }
        sim.send_due(tick, &mut prefill);
        for (id, result) in prefill.step(backend)? {
            let kv = result.map_err(anyhow::Error::msg)?;
            if kv.stale_index_pages > 0 {
                sim.stale_requests.insert(id);
            }
            let flight = sim
                .waiting_prefill
                .remove(&id)
                .expect("shipped requests were submitted");
            let sequence = SequenceKv {
                truth: flight.prompt.clone(),
                stored_tokens: kv.tokens,
                main: kv.main,
                index_k: kv.index_k,
            };
            sim.decode_queue.push((flight, sequence));
            sim.queue_ids.push(id);
        }
        if tick % config.ticks_per_decode_step == 0 {
            sim.decode_tick(tick, decode_backend)?;
        }
        tick += 1;
    }
    let mut report = sim.report;
    report.counters = prefill.counters.clone();
    report.ticks = tick;
    prefill.close(backend)?;
    Ok(report)
}

/// One simulation between ticks: the sessions, the requests at each stage (waiting for
/// prefill, queued for decode, decoding), and the report so far.
struct Simulation<'c> {
    config: &'c SimConfig,
    vocab: Vocab,
    tools: Vec<ToolFunction>,
    sessions: Vec<SessionState>,
    waiting_prefill: HashMap<u64, InFlight>,
    decode_queue: Vec<(InFlight, SequenceKv)>,
    /// The request ids of `decode_queue`, in its order.
    queue_ids: Vec<u64>,
    running: Vec<(InFlight, SequenceKv)>,
    /// The request ids of `running`, in its order.
    running_ids: Vec<u64>,
    /// Requests whose prefill shipped a stale index-K page.
    stale_requests: std::collections::HashSet<u64>,
    report: SimReport,
    next_id: u64,
}

impl<'c> Simulation<'c> {
    /// Every session at its opening, its first send after its client delay.
    fn new(config: &'c SimConfig) -> Self {
        let sessions = (0..config.sessions)
            .map(|session| SessionState {
                turns: session_opening(config.seed, session, config.ctx_tokens, config.steps),
                rounds_used: 0,
                finished: false,
                next_send: Some(client_delay(
                    config.seed,
                    session,
                    0,
                    config.client_delay_max,
                )),
            })
            .collect();
        Simulation {
            config,
            vocab: Vocab::new(),
            tools: sim_tools(),
            sessions,
            waiting_prefill: HashMap::new(),
            decode_queue: Vec::new(),
            queue_ids: Vec::new(),
            running: Vec::new(),
            running_ids: Vec::new(),
            stale_requests: Default::default(),
            report: SimReport {
                sessions: config.sessions,
                ..SimReport::default()
            },
            next_id: 0,
        }
    }

    /// Submits the request of every session whose send is due at `tick` to prefill.
    fn send_due(&mut self, tick: u64, prefill: &mut PrefillCore) {
        for (index, session) in self.sessions.iter_mut().enumerate() {
            if session.next_send == Some(tick) {
                session.next_send = None;
                let conversation = Conversation {
                    tools: self.tools.clone(),
                    messages: session.turns.clone(),
                    max_tokens: 512,
                };
                let expected = decide(&conversation).expect("sessions always hold a task");
                let (prompt, generation) = model::prepare(&conversation, &self.vocab);
                prefill.submit(self.next_id, prompt.clone());
                self.waiting_prefill.insert(
                    self.next_id,
                    InFlight {
                        session: index,
                        generation,
                        prompt,
                        expected,
                    },
                );
                self.next_id += 1;
            }
        }
    }

    /// One decode step: queued requests admitted up to `max_running`, one token for each
    /// running one (read back from the shipped KV, or as planned), and every finished
    /// one judged.
    fn decode_tick(&mut self, tick: u64, decode_backend: &dyn Backend) -> anyhow::Result<()> {
        let config = self.config;
        while self.running.len() < config.max_running && !self.decode_queue.is_empty() {
            self.running.push(self.decode_queue.remove(0));
            self.running_ids.push(self.queue_ids.remove(0));
        }
        if !self.running.is_empty() && !config.read_back {
            for (flight, _) in self.running.iter_mut() {
                flight.generation.emit_planned(&flight.prompt);
            }
        } else if !self.running.is_empty() {
            let mut batch: Vec<(&mut Generation, &mut SequenceKv)> = self
                .running
                .iter_mut()
                .map(|(flight, sequence)| (&mut flight.generation, sequence))
                .collect();
            decode_step(decode_backend, &config.read, &mut batch)?;
        }
        let mut index = 0;
        while index < self.running.len() {
            if self.running[index].0.generation.finish.is_none() {
                index += 1;
                continue;
            }
            let (flight, _) = self.running.remove(index);
            let id = self.running_ids.remove(index);
            self.finish_round(flight, id, tick);
        }
        Ok(())
    }

    /// A finished generation judged against what the session expected: a wrong one ends
    /// the session corrupted; a right answer ends it done; a right call gets its tool
    /// result and the session's next send (or its end at the round limit).
    fn finish_round(&mut self, flight: InFlight, id: u64, tick: u64) {
        let config = self.config;
        let report = &mut self.report;
        let text = self.vocab.decode(&flight.generation.emitted);
        let output = dsml::parse(&text);
        let session = &mut self.sessions[flight.session];
        session.rounds_used += 1;
        report.rounds += 1;
        if !is_correct(&flight.expected, &output) {
            session.finished = true;
            report.corrupted += 1;
            if self.stale_requests.contains(&id) {
                report.corrupted_rounds_with_stale_index_k += 1;
            }
            if report.examples.len() < 4 {
                report.examples.push(text);
            }
            return;
        }
        match &flight.expected {
            Intent::Answer(_) => {
                session.finished = true;
                report.done += 1;
            }
            Intent::Call((name, arguments)) => {
                session.turns.push(Turn::Assistant {
                    content: String::new(),
                    calls: vec![(name.clone(), arguments.clone())],
                });
                session.turns.push(Turn::Tool(tool_result(name, arguments)));
                if session.rounds_used >= config.rounds {
                    session.finished = true;
                } else {
                    session.next_send = Some(
                        tick + 1
                            + client_delay(
                                config.seed,
                                flight.session,
                                session.rounds_used,
                                config.client_delay_max,
                            ),
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::backend::cpu::CpuBackend;
    use super::*;

    fn quick(sessions: usize, dtype: IndexKDtype, hicache: bool, sync: bool) -> SimReport {
        let mut config = SimConfig::default_workload(dtype, hicache, sync);
        config.sessions = sessions;
        // Scale the pool with the session count so pool pressure matches the full run.
        config.prefill.pool_bytes = config.prefill.pool_bytes * sessions / 80;
        run(&config, &CpuBackend::new()).unwrap()
    }

    #[test]
    #[ignore = "tuning aid"]
    fn print_scaled_rates() {
        let sessions: usize = std::env::var("SIM_SESSIONS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(24);
        for (label, dtype, hicache, sync) in [
            ("defaults", IndexKDtype::Bf16, true, false),
            ("fp8", IndexKDtype::Fp8, true, false),
            ("hicache off", IndexKDtype::Bf16, false, false),
            ("sync", IndexKDtype::Bf16, true, true),
        ] {
            let start = std::time::Instant::now();
            let r = quick(sessions, dtype, hicache, sync);
            println!(
                "{label}: {}/{} corrupted, {} stale req, {} loadback req ({:.1}s)",
                r.corrupted,
                r.sessions,
                r.counters.stale_index_k_requests,
                r.counters.loadback_requests,
                start.elapsed().as_secs_f64()
            );
        }
    }

    #[test]
    #[ignore = "prints the full table; run with --ignored --nocapture"]
    fn print_corruption_table() {
        let backend = CpuBackend::new();
        println!("config | sessions | corrupted | rate | loadback req | stale req | corrupted&stale | evicted | ticks");
        for (label, dtype, hicache, sync, sessions) in [
            ("defaults", IndexKDtype::Bf16, true, false, 80),
            ("BF16_INDEX_K=0", IndexKDtype::Fp8, true, false, 80),
            ("HiCache off", IndexKDtype::Bf16, false, false, 80),
            ("INDEX_K_HICACHE_SYNC=1", IndexKDtype::Bf16, true, true, 80),
            ("one session", IndexKDtype::Bf16, true, false, 1),
        ] {
            let mut config = SimConfig::default_workload(dtype, hicache, sync);
            config.sessions = sessions;
            // Tuning knobs (test-only): override the loader bandwidth and pool size.
            if let Some(bytes) = std::env::var("SIM_LOADER_BYTES_PER_STEP")
                .ok()
                .and_then(|v| v.parse().ok())
            {
                config.prefill.loader.bytes_per_step = bytes;
            }
            if let Some(bytes) = std::env::var("SIM_POOL_BYTES")
                .ok()
                .and_then(|v| v.parse().ok())
            {
                config.prefill.pool_bytes = bytes;
            }
            if std::env::var("SIM_ONLY_DEFAULTS").is_ok() && label != "defaults" {
                continue;
            }
            let start = std::time::Instant::now();
            let r = run(&config, &backend).unwrap();
            println!(
                "{label} | {} | {} | {:.3} | {} | {} | {} | {} | {} ({:.1}s)",
                r.sessions,
                r.corrupted,
                r.rate(),
                r.counters.loadback_requests,
                r.counters.stale_index_k_requests,
                r.corrupted_rounds_with_stale_index_k,
                r.counters.evicted_pages,
                r.ticks,
                start.elapsed().as_secs_f64()
            );
            for example in r.examples.iter().take(2) {
                println!("    e.g. {example:?}");
            }
        }
    }

    fn stale_requests(dtype: IndexKDtype, hicache: bool, sync: bool, sessions: usize) -> u64 {
        let mut config = SimConfig::default_workload(dtype, hicache, sync);
        config.sessions = sessions;
        config.read_back = false;
        let report = run(&config, &CpuBackend::new()).unwrap();
        report.counters.stale_index_k_requests
    }

    #[test]
    fn stale_index_k_shipments_need_load_bf16_hicache_and_no_sync() {
        let defaults = stale_requests(IndexKDtype::Bf16, true, false, 80);
        assert!(
            defaults >= 8,
            "defaults ship stale index-K under 80-session load: {defaults}"
        );
        assert_eq!(stale_requests(IndexKDtype::Fp8, true, false, 80), 0);
        assert_eq!(stale_requests(IndexKDtype::Bf16, false, false, 80), 0);
        assert_eq!(stale_requests(IndexKDtype::Bf16, true, true, 80), 0);
        assert_eq!(stale_requests(IndexKDtype::Bf16, true, false, 4), 0);
    }

    /// The resident store (prefill's bytes in a backend pool, as on CUDA) under the
    /// default workload's pool pressure, on the CPU's pools whose load-backs land at
    /// once: evictions and load-backs happen, no shipment is stale, no session is
    /// corrupted.
    #[test]
    fn resident_store_under_load_never_ships_stale_on_the_cpu_pools() {
        let mut config = SimConfig::default_workload(IndexKDtype::Bf16, true, false);
        config.sessions = 24;
        config.prefill.pool_bytes = config.prefill.pool_bytes * 24 / 80;
        let resident = run(&config, &CpuBackend::claiming_async_load_backs()).unwrap();
        let c = &resident.counters;
        assert!(c.loadback_requests > 0 && c.evicted_pages > 0, "{c:?}");
        assert_eq!((c.stale_index_k_pages, resident.corrupted), (0, 0), "{c:?}");
        assert_eq!(resident.done + resident.corrupted, resident.sessions);
    }

    #[test]
    fn one_session_is_never_corrupted() {
        let mut config = SimConfig::default_workload(IndexKDtype::Bf16, true, false);
        config.sessions = 1;
        let report = run(&config, &CpuBackend::new()).unwrap();
        assert_eq!(report.corrupted, 0);
        assert_eq!(report.done, 1);
        assert_eq!(report.counters.loadback_requests, 0);
    }
}
