//! Engine presets of a target profile (docs/design.md 3.2, "Engine presets"): what a
//! serving engine calls its load gauges, where it reports the configuration it runs
//! with, and which tool-call markup its templates use. A profile names its engine
//! (`engine = "llamacpp"`) instead of spelling these out; every value stays overridable
//! per role (`running_metric`, `queued_metric`, `effective_url`) or per target
//! (`markup`).
//!
//! The table is the one place the engines' names live; the values are the ones the
//! engines' own sources and docs use (SGLang `sglang:num_running_reqs`, vLLM
//! `vllm:num_requests_running`, llama.cpp's `llamacpp:requests_processing`, served
//! with `--metrics`).
//!
//! Rejections (docs/design.md 3.5, `rejected`): the error replies with which an engine
//! refuses a model output its tool-call parser could not read, as the engines' sources
//! word them (each preset's entry below names the file). A profile adds, replaces or
//! turns off patterns with `[[reject]]` tables (docs/design.md 3.2).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::core::classify::{MarkupFamily, RejectionPattern};
use crate::core::engine_counts::EngineCounter;

/// The serving engine a profile (or one role of it) targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Engine {
    Sglang,
    Vllm,
    Llamacpp,
    /// `bisect engine`, the embedded miniature prefill/decode engine.
    Embedded,
    /// No preset: SGLang's metric names, and the effective configuration looked for at
    /// `/server_info` then `/get_server_info` beside the health URL (what bisect did
    /// before presets, so profiles without `engine` keep working unchanged).
    #[default]
    Custom,
}

impl Engine {
    /// Where the engine keeps its batch-invariant mode, for the testbed and `bisect check`
    /// to read back (crate::core::determinism): the embedded engine computes each
    /// request's reads from its own rows in a fixed order (no cross-request reduction),
    /// so alone and under load agree to the bit unless a bug intervenes; SGLang reports
    /// `--enable-deterministic-inference` in its server info; vLLM's
    /// `VLLM_BATCH_INVARIANT=1` lives only in its environment; llama.cpp has no such mode.
    pub(crate) fn mode_source(self) -> crate::core::determinism::ModeSource {
        use crate::core::determinism::ModeSource;
        match self {
            Engine::Embedded => ModeSource::ByConstruction,
            Engine::Sglang | Engine::Custom => ModeSource::ServerInfo,
            Engine::Vllm => ModeSource::ProcessEnvironment,
            Engine::Llamacpp => ModeSource::NoMode,
        }
    }
}

/// What a preset sets. `effective_path` is joined to the origin of the role's health
/// URL (`http://host:port`); `None` means the engine serves no configuration document
/// bisect knows of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preset {
    pub running_metric: &'static str,
    pub queued_metric: &'static str,
    pub(crate) effective_path: Option<&'static str>,
    pub markup: &'static [MarkupFamily],
    /// The engine's parse-failure replies: (name, status or any non-2xx, body regex).
    pub rejections: &'static [(&'static str, Option<u16>, &'static str)],
    /// Gauges of requests held between prefill and decode, with their meaning in the
    /// load gap's words: (metric, words).
    pub wait_gauges: &'static [(&'static str, &'static str)],
    /// Parts of the queued gauge by reason, in the load gap's words: (selector, words).
    pub queue_reasons: &'static [(&'static str, &'static str)],
    /// The engine's own counters counted over each block: (selector, meaning).
    pub counters: &'static [(&'static str, EngineCounter)],
}

/// vLLM's waiting requests by reason (vllm/v1/metrics/loggers.py,
/// `vllm:num_requests_waiting_by_reason`, 0.32): they add up to
/// `vllm:num_requests_waiting`, the preset's queued gauge.
const VLLM_QUEUE_REASONS: &[(&str, &str)] = &[
    (
        r#"vllm:num_requests_waiting_by_reason{reason="capacity"}"#,
        "waiting for scheduling capacity",
    ),
    (
        r#"vllm:num_requests_waiting_by_reason{reason="deferred"}"#,
        // vLLM's own words; measured on the CPU 0.32.0 server, the requests held back by
        // --max-num-seqs 1 were counted here, not under capacity.
        "deferred (vLLM: by transient constraints such as LoRA budget, KV transfer, blocked status)",
    ),
];

/// vLLM's counters (0.32: vllm/v1/metrics/loggers.py `vllm:num_preemptions_total`;
/// vllm/parser/metrics.py `vllm:tool_call_parser_invocations_total`). The parser counts
/// once per choice without streaming and once per delta with it, so only the
/// non-streaming chat completions are read as replies.
const VLLM_COUNTERS: &[(&str, EngineCounter)] = &[
    ("vllm:num_preemptions_total", EngineCounter::Preemptions),
    (
        r#"vllm:tool_call_parser_invocations_total{mode="non_streaming",outcome="tool_call",request_type="chat_completions"}"#,
        EngineCounter::ParsedCall,
    ),
    (
        r#"vllm:tool_call_parser_invocations_total{mode="non_streaming",outcome="no_tool_call",request_type="chat_completions"}"#,
        EngineCounter::ParsedNoCall,
    ),
];

/// SGLang prefill/decode disaggregation's hand-over queues, as its metrics collector
/// names them (python/sglang/srt/observability/metrics_collector.py; 0.5.23 lines
/// 582-605, 0.5.10 lines 317-341). A request between the two engines is in one of them,
/// neither running nor queued by `num_running_reqs`/`num_queue_reqs`: without these it
/// would read as "sent but not seen by the engine". The prefill side's first queue was
/// `num_prefill_prealloc_queue_reqs` up to 0.5.10 and is
/// `num_prefill_bootstrap_queue_reqs` in 0.5.23; older releases spelt the second
/// `infight`. An engine serves one name of each; all are read.
const SGLANG_PD_QUEUES: &[(&str, &str)] = &[
    (
        "sglang:num_prefill_bootstrap_queue_reqs",
        "waiting for decode to reserve their KV cache (bootstrap)",
    ),
    (
        "sglang:num_prefill_prealloc_queue_reqs",
        "waiting for decode to reserve their KV cache (bootstrap)",
    ),
    (
        "sglang:num_prefill_inflight_queue_reqs",
        "prefilled, their KV cache in transfer to decode",
    ),
    (
        "sglang:num_prefill_infight_queue_reqs",
        "prefilled, their KV cache in transfer to decode",
    ),
    (
        "sglang:num_decode_prealloc_queue_reqs",
        "waiting for KV cache space",
    ),
    (
        "sglang:num_decode_transfer_queue_reqs",
        "waiting for KV transfer",
    ),
];

/// llama.cpp: when the chat parser derived from the model's template cannot read
/// what the model generated, `common_chat_peg_parse` (common/chat.cpp) throws, and the
/// server's handler wrapper (`ex_wrapper` in tools/server/server.cpp, the body from
/// `format_error_response` in tools/server/server-common.cpp) answers HTTP 500 with
/// `{"error":{"code":500,"message":...,"type":"server_error"}}`. The message was
/// "Failed to parse input at pos N: <the rest of the output>" in earlier builds and is
/// "The model produced output that does not match the expected <FORMAT> format" in the
/// llama.cpp that `scripts/llama-server.sh` builds. Not matched: "Failed to parse
/// messages" / "tools" / "tool call arguments as JSON", which are about the request.
const LLAMACPP_REJECTIONS: &[(&str, Option<u16>, &str)] = &[
    (
        "llamacpp.format",
        Some(500),
        r#"The model produced output that does not match the expected [^"]{1,80} format"#,
    ),
    (
        "llamacpp.pos",
        Some(500),
        r"Failed to parse input at pos \d+",
    ),
];

/// vLLM: with `tool_choice: "auto"` its tool parsers (vllm/entrypoints/openai/
/// tool_parsers/, e.g. hermes_tool_parser.py) log "Error in extracting tool call from
/// response." and return the raw text as content, which bisect judges as a leak. With
/// `tool_choice: "required"` the chat server (vllm/entrypoints/openai/serving_chat.py,
/// `chat_completion_full_generator`) validated the output with pydantic's
/// `TypeAdapter(list[FunctionDefinition]).validate_json`, and a failure came back as an
/// error reply whose message is pydantic's "N validation error(s) for
/// list[FunctionDefinition]" (status 400 or 500 by version, so any). Later versions
/// (vllm/entrypoints/openai/engine/serving.py) suppress the error and return no call
/// (`no_tool`).
const VLLM_REJECTIONS: &[(&str, Option<u16>, &str)] = &[(
    "vllm.required",
    None,
    r"validation errors? for list\[FunctionDefinition\]",
)];

// SGLang rejects nothing: its chat server (python/sglang/srt/entrypoints/openai/
// serving_chat.py, `_process_tool_calls`) logs "Tool call parsing error" and returns
// the text as content ("Return error but don't fail the whole request"), judged as a
// leak or no_tool. The embedded engine and custom targets name none either.
const NO_REJECTIONS: &[(&str, Option<u16>, &str)] = &[];

const ALL_MARKUP: &[MarkupFamily] = &MarkupFamily::ALL;

impl Engine {
    pub const ALL: [Engine; 5] = [
        Engine::Sglang,
        Engine::Vllm,
        Engine::Llamacpp,
        Engine::Embedded,
        Engine::Custom,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Engine::Sglang => "sglang",
            Engine::Vllm => "vllm",
            Engine::Llamacpp => "llamacpp",
            Engine::Embedded => "embedded",
            Engine::Custom => "custom",
        }
    }

    /// The preset table. Markup: every family is checked for every engine, because a
    /// leak is markup of *any* template reaching the client (a DSML model behind a
    /// Hermes parser leaks DSML); a profile narrows it with `markup = [...]`.
    pub fn preset(self) -> Preset {
        match self {
            // `/server_info`: `/get_server_info` is deprecated (SGLang logs "Endpoint
            // '/get_server_info' is deprecated ... Please use '/server_info' instead");
            // an SGLang too old for the new path is asked the old one
            // ([`legacy_effective_url`]).
            Engine::Sglang => Preset {
                running_metric: "sglang:num_running_reqs",
                queued_metric: "sglang:num_queue_reqs",
                effective_path: Some("/server_info"),
                markup: ALL_MARKUP,
                rejections: NO_REJECTIONS,
                wait_gauges: SGLANG_PD_QUEUES,
                queue_reasons: &[],
                counters: &[],
            },
            // vLLM serves no document of its engine arguments (as of 0.11), but its
            // /metrics carries info metrics (`vllm:cache_config_info{cache_dtype=...}`)
            // and the process start time: read as a document (effective::prometheus_doc),
            // a profile's pointer checks the KV cache dtype, and the start time names
            // the process.
            Engine::Vllm => Preset {
                running_metric: "vllm:num_requests_running",
                queued_metric: "vllm:num_requests_waiting",
                effective_path: Some("/metrics"),
                markup: ALL_MARKUP,
                rejections: VLLM_REJECTIONS,
                wait_gauges: &[],
                queue_reasons: VLLM_QUEUE_REASONS,
                counters: VLLM_COUNTERS,
            },
            Engine::Llamacpp => Preset {
                running_metric: "llamacpp:requests_processing",
                queued_metric: "llamacpp:requests_deferred",
                effective_path: Some("/props"),
                markup: ALL_MARKUP,
                rejections: LLAMACPP_REJECTIONS,
                wait_gauges: &[],
                queue_reasons: &[],
                counters: &[],
            },
            // Each role counts the time its running gauge read above zero: whether its
            // sampled peak can show its load (core::confounds::recorded).
            Engine::Embedded => Preset {
                running_metric: "sglang:num_running_reqs",
                queued_metric: "sglang:num_queue_reqs",
                effective_path: Some("/server_info"),
                markup: ALL_MARKUP,
                rejections: NO_REJECTIONS,
                wait_gauges: &[],
                queue_reasons: &[],
                counters: &[("bisect_engine_busy_seconds_total", EngineCounter::BusyMs)],
            },
            Engine::Custom => Preset {
                running_metric: "sglang:num_running_reqs",
                queued_metric: "sglang:num_queue_reqs",
                effective_path: None,
                markup: ALL_MARKUP,
                rejections: NO_REJECTIONS,
                wait_gauges: SGLANG_PD_QUEUES,
                queue_reasons: &[],
                counters: &[],
            },
        }
    }

    /// What to change when the tool-call probe finds the engine returns calls as text
    /// or its model never calls (docs/design.md 3.13), in the engine's own options.
    pub(crate) fn tool_call_fix(self) -> &'static str {
        match self {
            Engine::Sglang => {
                "start every SGLang role with --tool-call-parser set for the model (DeepSeek V4: --tool-call-parser deepseekv4; V3.2: deepseekv32; V3.1: deepseekv31; Qwen: qwen25; see targets/sglang-pd/serve_dsv4_*.sh); SGLang parses tool calls only when a parser is set"
            }
            Engine::Vllm => {
                "start vLLM with --enable-auto-tool-choice --tool-call-parser NAME for the model's call format (hermes, xlam, deepseek_v3, ...), and a --chat-template that renders the tools; see targets/vllm/serve.sh"
            }
            Engine::Llamacpp => {
                "start llama-server with --jinja and a chat template that renders the tools and the assistant's tool_calls (--chat-template-file FILE; targets/llama-cpp/qwen2.5-coder-tools.jinja is one, for Qwen2.5-Coder)"
            }
            Engine::Embedded => {
                "the embedded engine always parses DSML: check that the target's api points at its router"
            }
            Engine::Custom => {
                "configure the engine's tool-call parser for the model's call format (SGLang --tool-call-parser, vLLM --enable-auto-tool-choice --tool-call-parser, llama-server --jinja with a tools template), or set engine in the profile to get its preset"
            }
        }
    }

    /// How to make the engine batch-invariant, so that `--oracle solo` compares exactly
    /// (every parting diverges, none excused as a near-tie).
    pub(crate) fn deterministic_fix(self) -> &'static str {
        match self {
            Engine::Sglang => {
                "start every SGLang role with --enable-deterministic-inference (FlashInfer, FA3 or Triton attention backend); its server info then says enable_deterministic_inference = true"
            }
            Engine::Vllm => {
                "start vLLM with VLLM_BATCH_INVARIANT=1 (NVIDIA compute capability 8.0 or newer), on the host bisect runs on: vLLM reports it nowhere else, so bisect reads the serving process's environment"
            }
            Engine::Llamacpp => {
                "llama.cpp has no batch-invariant mode: partings at or below --oracle-threshold (nats) count as drift, and docs/oracle.md says how the threshold was measured"
            }
            Engine::Embedded => "none needed: the embedded engine is batch-invariant by construction",
            Engine::Custom => {
                "set engine in the profile (sglang, vllm) so bisect knows where the engine reports its deterministic mode"
            }
        }
    }

    /// The preset's hand-over queue gauges, then the parts of its queue by reason.
    pub(crate) fn wait_gauges(self) -> Vec<crate::core::transport::WaitGauge> {
        let preset = self.preset();
        let gauge = |of_queue: bool| {
            move |(metric, words): &(&str, &str)| crate::core::transport::WaitGauge {
                metric: metric.to_string(),
                words: words.to_string(),
                of_queue,
            }
        };
        preset
            .wait_gauges
            .iter()
            .map(gauge(false))
            .chain(preset.queue_reasons.iter().map(gauge(true)))
            .collect()
    }

    /// The preset's counters: (selector, meaning).
    pub fn counters(self) -> Vec<(String, EngineCounter)> {
        self.preset()
            .counters
            .iter()
            .map(|(selector, counter)| (selector.to_string(), *counter))
            .collect()
    }

    /// The preset's rejection patterns.
    pub fn rejections(self) -> Vec<RejectionPattern> {
        self.preset()
            .rejections
            .iter()
            .map(|(name, status, body)| RejectionPattern::new(name, *status, body))
            .collect()
    }

    /// The preset's effective-config URL for a role answering health on `health_url`.
    pub fn effective_url(self, health_url: &str) -> Option<String> {
        let path = self.preset().effective_path?;
        Some(format!("{}{path}", origin(health_url)?))
    }
}

/// Where an older engine served the self-report asked for at `url`: SGLang's
/// `/get_server_info` for `/server_info` (the new path since the old one was deprecated;
/// SGLang releases before it serve only the old one). `None` for any other URL.
pub(crate) fn legacy_effective_url(url: &str) -> Option<String> {
    url.strip_suffix("/server_info")
        .map(|base| format!("{base}/get_server_info"))
}

/// `http://host:port` of an `http://host:port/path` URL.
pub(crate) fn origin(url: &str) -> Option<&str> {
    let rest = url.strip_prefix("http://")?;
    let end = rest.find('/').map_or(url.len(), |i| i + "http://".len());
    Some(&url[..end])
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown engine `{0}`; known: sglang, vllm, llamacpp, embedded, custom")]
pub struct UnknownEngine(pub String);

impl FromStr for Engine {
    type Err = UnknownEngine;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Engine::ALL
            .into_iter()
            .find(|e| e.name() == s.trim())
            .ok_or_else(|| UnknownEngine(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_name_each_engines_own_gauges_and_config_document() {
        let p = Engine::Llamacpp.preset();
        assert_eq!(p.running_metric, "llamacpp:requests_processing");
        assert_eq!(p.queued_metric, "llamacpp:requests_deferred");
        assert_eq!(
            Engine::Llamacpp
                .effective_url("http://127.0.0.1:8080/health")
                .as_deref(),
            Some("http://127.0.0.1:8080/props")
        );
        assert_eq!(
            Engine::Sglang
                .effective_url("http://10.0.0.2:30000/health")
                .as_deref(),
            Some("http://10.0.0.2:30000/server_info")
        );
        assert_eq!(
            legacy_effective_url("http://10.0.0.2:30000/server_info").as_deref(),
            Some("http://10.0.0.2:30000/get_server_info")
        );
        assert_eq!(legacy_effective_url("http://h:1/props"), None);
        assert_eq!(
            Engine::Embedded
                .effective_url("http://h:1/health")
                .as_deref(),
            Some("http://h:1/server_info")
        );
        assert_eq!(
            Engine::Vllm.preset().running_metric,
            "vllm:num_requests_running"
        );
        assert_eq!(
            Engine::Vllm.effective_url("http://h:1/health").as_deref(),
            Some("http://h:1/metrics")
        );
        assert_eq!(Engine::Custom.effective_url("http://h:1/health"), None);
    }

    #[test]
    fn preset_rejections_compile_and_match_the_engines_own_words() {
        for e in Engine::ALL {
            crate::core::classify::RejectionSet::new(&e.rejections())
                .unwrap_or_else(|err| panic!("{e}: {err}"));
        }
        let llama =
            crate::core::classify::RejectionSet::new(&Engine::Llamacpp.rejections()).unwrap();
        let format = r#"{"error":{"code":500,"message":"The model produced output that does not match the expected Hermes 2 Pro format","type":"server_error"}}"#;
        assert_eq!(llama.find(500, format).unwrap().name, "llamacpp.format");
        let pos = r#"{"error":{"code":500,"message":"Failed to parse input at pos 13: <tool_call>{"na","type":"server_error"}}"#;
        assert_eq!(llama.find(500, pos).unwrap().name, "llamacpp.pos");
        // The request's own faults are not the model's.
        let request = r#"{"error":{"code":500,"message":"Failed to parse tool call arguments as JSON: ...","type":"server_error"}}"#;
        assert!(llama.find(500, request).is_none());
        assert!(
            llama.find(503, format).is_none(),
            "llama.cpp answers these with 500"
        );
        let vllm = crate::core::classify::RejectionSet::new(&Engine::Vllm.rejections()).unwrap();
        let pydantic = r#"{"object":"error","message":"1 validation error for list[FunctionDefinition]\n  Invalid JSON: EOF while parsing a list at line 1 column 9","type":"BadRequestError","param":null,"code":400}"#;
        assert_eq!(vllm.find(400, pydantic).unwrap().name, "vllm.required");
        assert!(Engine::Sglang.rejections().is_empty());
        assert!(Engine::Custom.rejections().is_empty());
    }

    /// The presets against the engines' own words (tests/fixtures/engines/): the gauges
    /// each preset reads are in each engine's exposition, SGLang's TP ranks are one
    /// replica, its PD hand-over queues are read under both releases' names, and
    /// llama-server's parse failure is a rejection.
    #[test]
    fn presets_read_the_engines_own_expositions_and_errors() {
        use crate::driver::metrics::parse_exposition;
        use crate::test_http::engine_fixture;
        let gauge = |file: &str, name: &str| parse_exposition(&engine_fixture(file)).gauge(name);
        let llama = Engine::Llamacpp.preset();
        assert_eq!(
            gauge("llamacpp/metrics.txt", llama.running_metric),
            Some(0.0)
        );
        assert_eq!(
            gauge("llamacpp/metrics.txt", llama.queued_metric),
            Some(0.0)
        );
        let vllm = Engine::Vllm.preset();
        assert_eq!(gauge("vllm/metrics.txt", vllm.running_metric), Some(4.0));
        assert_eq!(gauge("vllm/metrics.txt", vllm.queued_metric), Some(2.0));
        let sglang = Engine::Sglang.preset();
        // Four TP ranks each report the replica's 12 running requests: 12, not 48.
        let decode = "sglang/metrics-pd-decode.txt";
        assert_eq!(gauge(decode, sglang.running_metric), Some(12.0));
        assert_eq!(
            parse_exposition(&engine_fixture(decode)).sum(sglang.running_metric),
            Some(48.0),
            "summing label sets would count the ranks"
        );
        // Two data-parallel replicas of two TP ranks each: 7 + 9.
        assert_eq!(
            gauge("sglang/metrics-dp.txt", sglang.running_metric),
            Some(16.0)
        );
        assert_eq!(
            gauge("sglang/metrics-dp.txt", sglang.queued_metric),
            Some(1.0)
        );
        let waits = |file: &str| -> Vec<(String, f64)> {
            Engine::Sglang
                .wait_gauges()
                .iter()
                .filter_map(|w| Some((w.words.clone(), gauge(file, &w.metric)?)))
                .collect()
        };
        assert_eq!(
            waits(decode),
            vec![
                ("waiting for KV cache space".to_string(), 2.0),
                ("waiting for KV transfer".to_string(), 5.0),
            ]
        );
        assert_eq!(
            waits("sglang/metrics-pd-prefill-0.5.10.txt"),
            vec![
                (
                    "waiting for decode to reserve their KV cache (bootstrap)".to_string(),
                    4.0
                ),
                (
                    "prefilled, their KV cache in transfer to decode".to_string(),
                    6.0
                ),
            ]
        );
        let rejections =
            crate::core::classify::RejectionSet::new(&Engine::Llamacpp.rejections()).unwrap();
        let body = engine_fixture("llamacpp/rejection-500.json");
        assert_eq!(rejections.find(500, &body).unwrap().name, "llamacpp.format");
    }

    /// A real vLLM (the CPU 0.32.0 server, tests/fixtures/engines/vllm/cpu-0.32.0/): the
    /// preset's gauges, its queue's parts by reason and its counters are all in the
    /// server's own exposition, the counters read by their labels (the parser's
    /// non-streaming chat replies, not its per-delta streaming counts).
    #[test]
    fn the_vllm_preset_reads_a_real_servers_queue_reasons_and_counters() {
        use crate::driver::metrics::parse_exposition;
        use crate::test_http::engine_fixture;
        let exposition = parse_exposition(&engine_fixture("vllm/cpu-0.32.0/metrics.txt"));
        assert!(
            exposition.malformed.is_empty(),
            "{:?}",
            exposition.malformed
        );
        let vllm = Engine::Vllm.preset();
        assert_eq!(exposition.gauge(vllm.running_metric), Some(0.0));
        assert_eq!(exposition.gauge(vllm.queued_metric), Some(0.0));
        let parts: Vec<(bool, Option<f64>)> = Engine::Vllm
            .wait_gauges()
            .iter()
            .map(|w| (w.of_queue, exposition.gauge(&w.metric)))
            .collect();
        assert_eq!(parts, vec![(true, Some(0.0)), (true, Some(0.0))]);
        let counted: Vec<(EngineCounter, Option<f64>)> = Engine::Vllm
            .counters()
            .iter()
            .map(|(selector, counter)| (*counter, exposition.gauge(selector)))
            .collect();
        assert_eq!(
            counted,
            vec![
                (EngineCounter::Preemptions, Some(0.0)),
                // One non-streaming reply parsed with a call; the streaming requests'
                // 3 + 21 per-delta counts are not replies and are not read.
                (EngineCounter::ParsedCall, Some(1.0)),
                (EngineCounter::ParsedNoCall, Some(0.0)),
            ]
        );
        // A selector whose labels match nothing reads as absent, not as 0.
        assert_eq!(
            exposition.gauge(r#"vllm:num_requests_waiting_by_reason{reason="other"}"#),
            None
        );
    }

    #[test]
    fn names_round_trip_and_unknown_names_list_the_known_ones() {
        for e in Engine::ALL {
            assert_eq!(e.name().parse::<Engine>(), Ok(e));
        }
        let err = "tgi".parse::<Engine>().unwrap_err();
        assert!(err.to_string().contains("llamacpp"), "{err}");
    }

    #[test]
    fn origin_keeps_scheme_host_and_port() {
        assert_eq!(origin("http://h:80/a/b"), Some("http://h:80"));
        assert_eq!(origin("http://h:80"), Some("http://h:80"));
        assert_eq!(origin("https://h/x"), None);
    }
}
