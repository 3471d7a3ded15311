//! Engine load while a workload runs: a Prometheus text-format parser (exposition
//! format 0.0.4: `name{label="v",...} value [timestamp]`, `#` comments, escaped label
//! values, NaN/±Inf, scientific notation) and a poller that samples every role's
//! running/queued gauges (named by the target's engine preset: `sglang:num_running_reqs`,
//! `vllm:num_requests_running`, `llamacpp:requests_processing`, ...) plus the client's
//! in-flight count into the time series written as metrics.csv (docs/design.md 3.6).
//! Peak running requests per role feed the load-confound check of docs/design.md 3.7;
//! a role none of whose scrapes succeeded is reported ([`MetricsLog::all_failed`]) so
//! a missing load measurement is a warning, never silent. Scrapes carry the target's API
//! key (a server started with one answers 401 to an anonymous `/metrics`).

use super::client::InFlight;
use crate::core::engine_counts::{self, EngineCount, EngineCounter};
use crate::core::transport::{GapSample, LoadGap, WaitGauge, Waiting};
use anyhow::Context;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

pub(crate) const RUNNING_METRIC: &str = "sglang:num_running_reqs";
pub(crate) const QUEUED_METRIC: &str = "sglang:num_queue_reqs";
/// Role name of the rows that carry only the client's own in-flight count.
pub(crate) const CLIENT_ROLE: &str = "client";

/// One role's Prometheus endpoint and the gauges to read from it.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsEndpoint {
    pub role: String,
    pub url: String,
    pub running_metric: String,
    pub queued_metric: String,
    /// The role's prefill/decode hand-over queues (SGLang's PD gauges) and the parts of
    /// its queue by reason (vLLM's), for the load gap.
    pub wait_gauges: Vec<WaitGauge>,
    /// The engine's own counters to count over the block (selector, meaning).
    pub counters: Vec<(String, EngineCounter)>,
    /// The counters that witness a flag's mechanism (core::mechanism), by selector.
    pub witnesses: Vec<String>,
}

impl MetricsEndpoint {
    /// An endpoint read with SGLang's gauge names (the embedded engine and its mock).
    pub fn sglang(role: &str, url: String) -> Self {
        MetricsEndpoint {
            role: role.to_string(),
            url,
            running_metric: RUNNING_METRIC.to_string(),
            queued_metric: QUEUED_METRIC.to_string(),
            wait_gauges: Vec::new(),
            counters: Vec::new(),
            witnesses: Vec::new(),
        }
    }
}

/// Label (name, value) pairs of a sample, in exposition order.
pub(crate) type Labels = Vec<(String, String)>;

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sample {
    pub name: String,
    pub labels: Labels,
    pub value: f64,
}

/// A parsed exposition: the samples, and the lines that could not be read
/// (1-based line number, reason) so one odd line does not hide the rest.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Exposition {
    pub samples: Vec<Sample>,
    pub malformed: Vec<(usize, String)>,
    /// The metric families its `# TYPE` lines declare.
    pub declared: Vec<String>,
}

/// Labels that name replicas of one scheduler rather than schedulers of their own:
/// SGLang labels every scheduler gauge with `tp_rank`, `pp_rank` and `moe_ep_rank`
/// (python/sglang/srt/observability/metrics_collector.py, 0.5.23 lines 1382-1392); only
/// TP rank 0 records unless `--enable-metrics-for-all-schedulers`, and then every rank
/// of a replica reports that replica's requests: counted once. Data-parallel ranks
/// (`dp_rank`, set only with data parallelism) are schedulers of their own and add up.
const REPLICA_LABELS: [&str; 3] = ["tp_rank", "pp_rank", "moe_ep_rank"];

impl Exposition {
    /// A gauge's value for the whole server: the samples of `name` grouped by their
    /// labels other than [`REPLICA_LABELS`], the largest of each group (one replica's
    /// ranks report one count; the largest is the latest to have seen a change), the
    /// groups summed. NaN samples skipped; `None` when no sample of that name exists.
    ///
    /// `name` may be a selector, `name{label="value",...}`: then only the samples that
    /// carry every one of those labels with those values (vLLM's
    /// `vllm:num_requests_waiting_by_reason{reason="capacity"}`). A selector that does
    /// not parse matches nothing.
    pub fn gauge(&self, name: &str) -> Option<f64> {
        let (name, wanted) = match name.find('{') {
            None => (name, Vec::new()),
            Some(i) => match parse_labels(&name[i..]) {
                Ok((labels, rest)) if rest.trim().is_empty() => (&name[..i], labels),
                _ => return None,
            },
        };
        let mut groups: Vec<(Labels, f64)> = Vec::new();
        for s in self.samples.iter().filter(|s| {
            s.name == name && !s.value.is_nan() && wanted.iter().all(|w| s.labels.contains(w))
        }) {
            let key: Labels = s
                .labels
                .iter()
                .filter(|(k, _)| !REPLICA_LABELS.contains(&k.as_str()))
                .cloned()
                .collect();
            match groups.iter_mut().find(|(k, _)| *k == key) {
                Some((_, v)) => *v = v.max(s.value),
                None => groups.push((key, s.value)),
            }
        }
        (!groups.is_empty()).then(|| groups.iter().map(|(_, v)| v).sum())
    }

    /// A counter's value by selector ([`Exposition::gauge`]), or 0 when the server
    /// declares its family (`# TYPE`) but serves no sample of those labels yet: a
    /// labelled counter appears at its first increment (Python's prometheus_client,
    /// SGLang's `sglang:load_back_tokens_total{pool="kv"}`). `None`: not served at all.
    pub fn counter(&self, selector: &str) -> Option<f64> {
        if let Some(v) = self.gauge(selector) {
            return Some(v);
        }
        let name = selector.split('{').next().unwrap_or(selector);
        let family = name.strip_suffix("_total").unwrap_or(name);
        self.declared
            .iter()
            .any(|d| d == name || d == family)
            .then_some(0.0)
    }

    /// The sum of `name` over all its label sets, NaN samples skipped; `None` when no
    /// (non-NaN) sample of that name exists.
    #[cfg(test)]
    pub fn sum(&self, name: &str) -> Option<f64> {
        let mut values = self
            .samples
            .iter()
            .filter(|s| s.name == name && !s.value.is_nan())
            .map(|s| s.value)
            .peekable();
        values.peek()?;
        Some(values.sum())
    }
}

fn parse_value(token: &str) -> Result<f64, String> {
    match token {
        "NaN" | "nan" => Ok(f64::NAN),
        "+Inf" | "Inf" | "inf" | "+inf" => Ok(f64::INFINITY),
        "-Inf" | "-inf" => Ok(f64::NEG_INFINITY),
        _ => token
            .parse::<f64>()
            .map_err(|_| format!("bad sample value {token:?}")),
    }
}

fn is_name_char(c: char, first: bool) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':' || (!first && c.is_ascii_digit())
}

/// Parses `{a="x",b="y\"z"}` at the start of `text`; returns the labels and the rest.
fn parse_labels(text: &str) -> Result<(Labels, &str), String> {
    let mut labels = Vec::new();
    let mut rest = text.strip_prefix('{').ok_or("expected '{'")?;
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix('}') {
            return Ok((labels, after));
        }
        let name_end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .ok_or("unterminated label set")?;
        let name = &rest[..name_end];
        if name.is_empty() {
            return Err(format!("bad label name at {:?}", excerpt(rest)));
        }
        rest = rest[name_end..].trim_start();
        rest = rest
            .strip_prefix('=')
            .ok_or("expected '=' after label name")?;
        rest = rest.trim_start();
        rest = rest
            .strip_prefix('"')
            .ok_or("expected '\"' opening a label value")?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let close = loop {
            match chars.next() {
                None => return Err("unterminated label value".into()),
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => return Err("unterminated label value".into()),
                },
                Some((_, c)) => value.push(c),
            }
        };
        labels.push((name.to_string(), value));
        rest = rest[close + 1..].trim_start();
        if let Some(after) = rest.strip_prefix(',') {
            rest = after;
        } else if !rest.starts_with('}') {
            return Err(format!("expected ',' or '}}' at {:?}", excerpt(rest)));
        }
    }
}

fn excerpt(text: &str) -> String {
    text.chars().take(30).collect()
}

fn parse_line(line: &str) -> Result<Sample, String> {
    let name_end = line
        .char_indices()
        .find(|&(i, c)| !is_name_char(c, i == 0))
        .map_or(line.len(), |(i, _)| i);
    if name_end == 0 {
        return Err("missing metric name".into());
    }
    let name = &line[..name_end];
    let mut rest = line[name_end..].trim_start();
    let labels = if rest.starts_with('{') {
        let (labels, after) = parse_labels(rest)?;
        rest = after;
        labels
    } else {
        Vec::new()
    };
    let mut tokens = rest.split_whitespace();
    let value = parse_value(tokens.next().ok_or("missing sample value")?)?;
    if let Some(ts) = tokens.next() {
        ts.parse::<i64>()
            .map_err(|_| format!("bad timestamp {ts:?}"))?;
    }
    if tokens.next().is_some() {
        return Err("trailing text after the timestamp".into());
    }
    Ok(Sample {
        name: name.to_string(),
        labels,
        value,
    })
}

/// Parses a Prometheus text exposition.
pub(crate) fn parse_exposition(text: &str) -> Exposition {
    let mut out = Exposition::default();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if let Some(family) = line.strip_prefix("# TYPE ") {
            if let Some(name) = family.split_whitespace().next() {
                out.declared.push(name.to_string());
            }
            continue;
        }
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match parse_line(line) {
            Ok(sample) => out.samples.push(sample),
            Err(reason) => out.malformed.push((i + 1, reason)),
        }
    }
    out
}

/// One row of metrics.csv. Rows of role [`CLIENT_ROLE`] carry the client in-flight
/// count in `running`; `error` says why a scrape failed (then running/queued are empty).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MetricsRow {
    pub t_s: f64,
    pub role: String,
    pub running: Option<f64>,
    pub queued: Option<f64>,
    pub(crate) client_inflight: u64,
    pub label: String,
    pub error: Option<String>,
    /// The client's connects in progress at the sample (older files: absent, 0).
    #[serde(default)]
    pub(crate) client_connecting: u64,
    /// The role's hand-over queues at this scrape, for the block's load gap; not a
    /// column of metrics.csv.
    #[serde(skip)]
    pub(crate) waiting: Vec<Waiting>,
}

/// The time series of one poll, with peaks and scrape failures per role.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MetricsLog {
    pub rows: Vec<MetricsRow>,
    /// Highest `running` sampled per engine role (roles never scraped are absent).
    pub peak_running: BTreeMap<String, f64>,
    /// Highest client in-flight count sampled (`InFlight::peak` is the exact one).
    pub peak_client_inflight: u64,
    pub(crate) scrape_failures: BTreeMap<String, u64>,
    /// Scrapes attempted per role.
    pub scrapes: BTreeMap<String, u64>,
    /// The last failure's reason per role.
    pub(crate) last_error: BTreeMap<String, String>,
    /// Each (role, counter)'s values over the scrapes that carried it, in order.
    pub(crate) counter_values: BTreeMap<(String, EngineCounter), Vec<f64>>,
    /// Each (role, witness selector)'s values over the scrapes that carried it.
    pub(crate) witness_values: BTreeMap<(String, String), Vec<f64>>,
}

impl MetricsLog {
    /// Tags every row with the arm (or cell) label before it is appended to the CSV.
    pub(crate) fn set_label(&mut self, label: &str) {
        for row in &mut self.rows {
            row.label = label.to_string();
        }
    }

    /// Role -> why, for every role none of whose scrapes gave its running gauge: the
    /// arm has no engine-side load for that role, and the user must hear why.
    pub fn all_failed(&self) -> BTreeMap<String, String> {
        self.scrapes
            .iter()
            .filter(|(role, &n)| n > 0 && self.scrape_failures.get(*role) == Some(&n))
            .map(|(role, n)| {
                let last = self.last_error.get(role).map_or("", String::as_str);
                (
                    role.clone(),
                    format!("all {n} scrapes failed, last: {last}"),
                )
            })
            .collect()
    }

    /// What each role's own counters counted over the poll (their increase, in the
    /// counter's unit: [`EngineCounter::per_unit`]), in a fixed order; empty where no
    /// role has counters or none was ever read.
    /// Role -> (samples whose running gauge read above zero, samples that read it): how
    /// often the poller found each role busy, the sampled stand-in for an engine that
    /// counts no busy time of its own (core::confounds, the peak rule).
    pub fn busy_samples(&self) -> BTreeMap<String, [u64; 2]> {
        let mut busy: BTreeMap<String, [u64; 2]> = BTreeMap::new();
        for row in &self.rows {
            if let Some(running) = row.running {
                let slot = busy.entry(row.role.clone()).or_default();
                slot[0] += u64::from(running > 0.0);
                slot[1] += 1;
            }
        }
        busy
    }

    pub fn engine_counts(&self) -> Vec<EngineCount> {
        self.counter_values
            .iter()
            .map(|((role, counter), values)| {
                let scaled: Vec<f64> = values.iter().map(|v| v * counter.per_unit()).collect();
                EngineCount {
                    role: role.clone(),
                    counter: *counter,
                    count: engine_counts::increase(&scaled),
                }
            })
            .collect()
    }

    /// What the witness counter `selector` of `role` counted over the poll (its
    /// increase), or why it cannot say: no scrape of the role carried it.
    pub fn witness_count(&self, role: &str, selector: &str) -> Result<u64, String> {
        match self
            .witness_values
            .get(&(role.to_string(), selector.to_string()))
        {
            Some(values) => Ok(engine_counts::increase(values)),
            None => Err(format!(
                "no sample of {selector} in {} scrape{} of {role}{}",
                self.scrapes.get(role).copied().unwrap_or(0),
                if self.scrapes.get(role) == Some(&1) {
                    ""
                } else {
                    "s"
                },
                self.last_error
                    .get(role)
                    .map(|e| format!(" (last failure: {e})"))
                    .unwrap_or_default()
            )),
        }
    }

    /// Where the client's in-flight requests were while the busiest engine role ran
    /// fewer ([`LoadGap`]), over this log's samples; None without a measured role.
    pub fn load_gap(&self) -> Option<LoadGap> {
        let (role, _) = self
            .peak_running
            .iter()
            .max_by(|a, b| a.1.total_cmp(b.1).then_with(|| b.0.cmp(a.0)))?;
        // Every role's hand-over queues at the busiest role's sample: the poller scrapes
        // all roles at one tick, so their rows share its time.
        let waiting_at = |t_s: f64| -> Vec<Waiting> {
            self.rows
                .iter()
                .filter(|r| r.t_s == t_s)
                .flat_map(|r| r.waiting.iter().cloned())
                .collect()
        };
        let samples: Vec<GapSample> = self
            .rows
            .iter()
            .filter(|r| &r.role == role)
            .filter_map(|r| {
                Some(GapSample {
                    client_in_flight: r.client_inflight,
                    connecting: r.client_connecting,
                    running: r.running?,
                    queued: r.queued,
                    waiting: waiting_at(r.t_s),
                })
            })
            .collect();
        LoadGap::measure(role, &samples)
    }

    fn record_client(&mut self, t_s: f64, inflight: u64, connecting: u64) {
        self.peak_client_inflight = self.peak_client_inflight.max(inflight);
        self.rows.push(MetricsRow {
            t_s,
            role: CLIENT_ROLE.to_string(),
            running: Some(inflight as f64),
            queued: None,
            client_inflight: inflight,
            label: String::new(),
            error: None,
            client_connecting: connecting,
            waiting: Vec::new(),
        });
    }

    fn record_scrape(
        &mut self,
        t_s: f64,
        endpoint: &MetricsEndpoint,
        (inflight, connecting): (u64, u64),
        scraped: Result<String, String>,
    ) {
        let role = endpoint.role.as_str();
        let mut waiting = Vec::new();
        let (running, queued, error) = match scraped {
            Ok(text) => {
                let exposition = parse_exposition(&text);
                for gauge in &endpoint.wait_gauges {
                    if let Some(requests) = exposition.gauge(&gauge.metric) {
                        waiting.push(Waiting {
                            role: role.to_string(),
                            words: gauge.words.clone(),
                            requests,
                            of_queue: gauge.of_queue,
                        });
                    }
                }
                for (selector, counter) in &endpoint.counters {
                    if let Some(value) = exposition.gauge(selector) {
                        self.counter_values
                            .entry((role.to_string(), *counter))
                            .or_default()
                            .push(value);
                    }
                }
                for selector in &endpoint.witnesses {
                    if let Some(value) = exposition.counter(selector) {
                        self.witness_values
                            .entry((role.to_string(), selector.clone()))
                            .or_default()
                            .push(value);
                    }
                }
                let running = exposition.gauge(&endpoint.running_metric);
                let error = running.is_none().then(|| {
                    format!(
                        "{}: no {} sample (set running_metric for role {role}, or the engine preset)",
                        endpoint.url, endpoint.running_metric
                    )
                });
                (running, exposition.gauge(&endpoint.queued_metric), error)
            }
            Err(e) => (None, None, Some(e)),
        };
        *self.scrapes.entry(role.to_string()).or_default() += 1;
        if let Some(e) = &error {
            *self.scrape_failures.entry(role.to_string()).or_default() += 1;
            self.last_error.insert(role.to_string(), e.clone());
        }
        if let Some(r) = running {
            let peak = self.peak_running.entry(role.to_string()).or_insert(r);
            *peak = peak.max(r);
        }
        self.rows.push(MetricsRow {
            t_s,
            role: role.to_string(),
            running,
            queued,
            client_inflight: inflight,
            label: String::new(),
            error,
            client_connecting: connecting,
            waiting,
        });
    }
}

async fn scrape(
    http: &reqwest::Client,
    url: &str,
    api_key: Option<&str>,
) -> Result<String, String> {
    let mut request = http.get(url);
    if let Some(key) = api_key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.map_err(|e| format!("{url}: {e}"))?;
    let status = response.status();
    if !status.is_success() {
        let hint = match status.as_u16() {
            401 | 403 => " (the server wants an API key: set api_key_env in the target profile)",
            404 => {
                " (no metrics here: llama-server needs --metrics, vLLM and SGLang serve /metrics)"
            }
            _ => "",
        };
        return Err(format!("{url}: HTTP {status}{hint}"));
    }
    response.text().await.map_err(|e| format!("{url}: {e}"))
}

/// Samples every endpoint and the client in-flight count every `period` until `cancel`
/// fires, sending `api_key` as a bearer token when set. Scrape failures are recorded as
/// rows with an error, never fatal.
pub async fn poll(
    endpoints: Vec<MetricsEndpoint>,
    api_key: Option<String>,
    inflight: Arc<InFlight>,
    period: Duration,
    cancel: CancellationToken,
) -> MetricsLog {
    let mut log = MetricsLog::default();
    let period = period.max(Duration::from_millis(10));
    let http = match reqwest::Client::builder()
        .no_proxy()
        .timeout(period.max(Duration::from_secs(2)))
        .build()
    {
        Ok(client) => client,
        Err(e) => {
            for endpoint in &endpoints {
                log.record_scrape(
                    0.0,
                    endpoint,
                    (0, 0),
                    Err(format!("building the HTTP client: {e}")),
                );
            }
            return log;
        }
    };
    let started = Instant::now();
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // The first sample is always taken, even if the arm is already over: every arm
    // block then has at least one row per role in metrics.csv.
    let mut first = true;
    loop {
        if !first {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = ticks.tick() => {}
            }
        } else {
            ticks.tick().await;
        }
        let t_s = started.elapsed().as_secs_f64();
        let client_now = (inflight.current(), inflight.connecting());
        log.record_client(t_s, client_now.0, client_now.1);
        let scrapes = futures::future::join_all(
            endpoints
                .iter()
                .map(|e| scrape(&http, &e.url, api_key.as_deref())),
        );
        let scraped = if first {
            first = false;
            scrapes.await
        } else {
            tokio::select! {
                _ = cancel.cancelled() => break,
                scraped = scrapes => scraped,
            }
        };
        for (endpoint, result) in endpoints.iter().zip(scraped) {
            log.record_scrape(t_s, endpoint, client_now, result);
            // The death watch records the engine's last sample beside the client's
            // count at a death.
            if let Some(running) = log.rows.last().and_then(|row| row.running) {
                inflight.note_engine_running(&endpoint.role, running);
            }
        }
    }
    // A counter's last replies may have been counted after the last tick: one more
    // scrape of the roles with counters, once the block is over.
    let counted: Vec<&MetricsEndpoint> = endpoints
        .iter()
        .filter(|e| !e.counters.is_empty() || !e.witnesses.is_empty())
        .collect();
    if !counted.is_empty() {
        let t_s = started.elapsed().as_secs_f64();
        let client_now = (inflight.current(), inflight.connecting());
        let scraped = futures::future::join_all(
            counted
                .iter()
                .map(|e| scrape(&http, &e.url, api_key.as_deref())),
        )
        .await;
        for (endpoint, result) in counted.into_iter().zip(scraped) {
            log.record_scrape(t_s, endpoint, client_now, result);
        }
    }
    log
}

/// Appends `log`'s rows to the CSV at `path` (columns t_s, role, running, queued,
/// client_inflight, label, error, client_connecting), writing the header only into a new or empty file,
/// so each arm appends to one metrics.csv.
pub(crate) fn write_csv(log: &MetricsLog, path: &Path) -> anyhow::Result<()> {
    use std::io::Write;
    // Blocks on replica sets end at the same time: whether the header is written and the
    // rows are appended is one step per file in this process, the rows in one write.
    static APPENDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one_at_a_time = APPENDING.lock().unwrap_or_else(|e| e.into_inner());
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    let empty = file
        .metadata()
        .with_context(|| format!("reading {}", path.display()))?
        .len()
        == 0;
    let mut writer = csv::WriterBuilder::new()
        .has_headers(empty)
        .from_writer(Vec::new());
    for row in &log.rows {
        writer
            .serialize(row)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let rows = writer
        .into_inner()
        .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    file.write_all(&rows)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bisect_engine::mock::{MockConfig, MockServer};

    const SGLANG: &str = r#"# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="deepseek-v4",engine_type="unified"} 12.0
sglang:num_running_reqs{model_name="other \"quoted\" \\ name",tp_rank="1",} 3
sglang:num_queue_reqs{model_name="deepseek-v4"} 1.5e1 1712345678000
sglang:token_usage{model_name="deepseek-v4"} NaN
sglang:token_usage{model_name="b"} 0.25
sglang:gen_throughput +Inf
process_cpu_seconds_total 4.2E-3
"#;

    #[test]
    fn sums_over_label_sets_with_escapes_and_timestamps() {
        let exp = parse_exposition(SGLANG);
        assert!(exp.malformed.is_empty(), "{:?}", exp.malformed);
        assert_eq!(exp.samples.len(), 7);
        assert_eq!(exp.sum(RUNNING_METRIC), Some(15.0));
        assert_eq!(exp.sum(QUEUED_METRIC), Some(15.0));
        assert_eq!(exp.sum("sglang:token_usage"), Some(0.25), "NaN is skipped");
        assert_eq!(exp.sum("sglang:gen_throughput"), Some(f64::INFINITY));
        assert_eq!(exp.sum("process_cpu_seconds_total"), Some(0.0042));
        assert_eq!(exp.sum("sglang:absent"), None);
        assert_eq!(
            exp.samples[1].labels,
            vec![
                (
                    "model_name".to_string(),
                    "other \"quoted\" \\ name".to_string()
                ),
                ("tp_rank".to_string(), "1".to_string())
            ]
        );
    }

    #[test]
    fn only_nan_is_absent_and_bad_lines_are_reported_not_fatal() {
        let exp = parse_exposition("a NaN\nb{x=\"1\" 3\nc 1 2 3\nd abc\ne{x=\"\\\"}\"} 2\n{} 1\n");
        assert_eq!(exp.sum("a"), None);
        assert_eq!(exp.sum("e"), Some(2.0));
        let lines: Vec<usize> = exp.malformed.iter().map(|(l, _)| *l).collect();
        assert_eq!(lines, vec![2, 3, 4, 6]);
    }

    /// The real vLLM exposition scraped three times over a block in which the server
    /// restarted (its counters back at 0) before the last scrape: the block's counts are
    /// the rises, the restarted counters' values rises from 0.
    #[test]
    fn a_blocks_engine_counts_are_the_counters_rises_over_its_scrapes() {
        let real = crate::test_http::engine_fixture("vllm/cpu-0.32.0/metrics.txt");
        let with = |call: &str, no_call: &str, preempted: &str| {
            real.lines()
                .map(|line| {
                    let value = if line.starts_with("vllm:num_preemptions_total{") {
                        preempted
                    } else if !line.contains(r#"mode="non_streaming""#)
                        || !line.contains(r#"request_type="chat_completions""#)
                        || !line.starts_with("vllm:tool_call_parser_invocations_total{")
                    {
                        return line.to_string();
                    } else if line.contains(r#"outcome="tool_call""#) {
                        call
                    } else {
                        no_call
                    };
                    let (sample, _) = line.rsplit_once(' ').unwrap();
                    format!("{sample} {value}")
                })
                .collect::<Vec<_>>()
                .join("\n")
        };
        let endpoint = MetricsEndpoint {
            role: "server".into(),
            url: "http://h/metrics".into(),
            running_metric: "vllm:num_requests_running".into(),
            queued_metric: "vllm:num_requests_waiting".into(),
            wait_gauges: Vec::new(),
            counters: crate::config::Engine::Vllm.counters(),
            witnesses: vec![
                "vllm:num_preemptions_total".into(),
                "vllm:never_served_total{engine=\"7\"}".into(),
            ],
        };
        let mut log = MetricsLog::default();
        for (t, text) in [
            (0.0, real.clone()),
            (1.0, with("3.0", "1.0", "2.0")),
            (2.0, with("2.0", "0.0", "0.0")),
        ] {
            log.record_scrape(t, &endpoint, (0, 0), Ok(text));
        }
        let counts: Vec<(EngineCounter, u64)> = log
            .engine_counts()
            .into_iter()
            .map(|c| (c.counter, c.count))
            .collect();
        assert_eq!(
            counts,
            vec![
                (EngineCounter::Preemptions, 2),
                (EngineCounter::ParsedCall, 2 + 2),
                (EngineCounter::ParsedNoCall, 1),
            ]
        );
        // The same counter read as KV_BLOCKS's witness; a selector no sample carries is
        // a read that failed, never a zero.
        assert_eq!(
            log.witness_count("server", "vllm:num_preemptions_total"),
            Ok(2)
        );
        assert_eq!(
            log.witness_count("server", "vllm:prefix_cache_hits_total{engine=\"7\"}"),
            Err(
                "no sample of vllm:prefix_cache_hits_total{engine=\"7\"} in 3 scrapes of server"
                    .into()
            )
        );
        // A labelled counter the server declares but has not incremented yet reads 0.
        let declared = parse_exposition(
            "# HELP sglang:load_back_tokens_total x\n# TYPE sglang:load_back_tokens counter\n",
        );
        assert_eq!(
            declared.counter("sglang:load_back_tokens_total{pool=\"kv\"}"),
            Some(0.0)
        );
        assert_eq!(declared.counter("sglang:other_total"), None);
    }

    /// The embedded engine's busy time, in seconds, is counted in milliseconds over the
    /// block (its preset's counter).
    #[test]
    fn busy_seconds_are_counted_in_milliseconds() {
        let endpoint = MetricsEndpoint {
            counters: crate::config::Engine::Embedded.counters(),
            ..MetricsEndpoint::sglang("prefill", "http://h/metrics".into())
        };
        let mut log = MetricsLog::default();
        for (t, busy) in [(0.0, 0.25), (0.25, 0.2625), (0.5, 0.375)] {
            let text =
                format!("sglang:num_running_reqs 0\nbisect_engine_busy_seconds_total {busy}\n");
            log.record_scrape(t, &endpoint, (0, 0), Ok(text));
        }
        assert_eq!(
            log.engine_counts(),
            vec![EngineCount {
                role: "prefill".into(),
                counter: EngineCounter::BusyMs,
                count: 125,
            }]
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn poller_samples_roles_and_records_failures() {
        let server = MockServer::start(MockConfig::default()).await.unwrap();
        let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dead_url = format!("http://{}/metrics", dead.local_addr().unwrap());
        drop(dead);
        let inflight = Arc::new(InFlight::new());
        let _held = inflight.enter();
        let cancel = CancellationToken::new();
        let poller = tokio::spawn(poll(
            vec![
                MetricsEndpoint::sglang("decode", server.metrics_url()),
                MetricsEndpoint::sglang("prefill", dead_url),
                MetricsEndpoint::sglang("health", server.health_url()),
            ],
            None,
            inflight.clone(),
            Duration::from_millis(50),
            cancel.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(400)).await;
        cancel.cancel();
        let mut log = poller.await.unwrap();
        let ticks = log.rows.iter().filter(|r| r.role == CLIENT_ROLE).count();
        assert!(ticks >= 3, "{ticks} ticks");
        assert_eq!(log.peak_client_inflight, 1);
        assert_eq!(log.peak_running.get("decode"), Some(&0.0));
        assert!(!log.peak_running.contains_key("prefill"));
        assert!(log.scrape_failures["prefill"] >= 3);
        assert!(
            log.scrape_failures["health"] >= 3,
            "a page without the metric is a failure"
        );
        assert!(!log.scrape_failures.contains_key("decode"));
        let failed = log.all_failed();
        assert_eq!(
            failed.keys().collect::<Vec<_>>(),
            vec!["health", "prefill"],
            "the roles none of whose scrapes worked"
        );
        assert!(failed["health"].contains("no sglang:num_running_reqs sample"));
        let decode = log.rows.iter().find(|r| r.role == "decode").unwrap();
        assert_eq!(
            (decode.running, decode.queued, decode.client_inflight),
            (Some(0.0), Some(0.0), 1)
        );

        log.set_label("on");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metrics.csv");
        write_csv(&log, &path).unwrap();
        write_csv(&log, &path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        let mut lines = text.lines();
        assert_eq!(
            lines.next().unwrap(),
            "t_s,role,running,queued,client_inflight,label,error,client_connecting"
        );
        assert_eq!(lines.count(), 2 * log.rows.len(), "header written once");
        let mut reader = csv::Reader::from_path(&path).unwrap();
        let back: Vec<MetricsRow> = reader.deserialize().map(Result::unwrap).collect();
        assert_eq!(back.len(), 2 * log.rows.len());
        assert!(back.iter().all(|r| r.label == "on"));
    }
}
