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

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::core::classify::MarkupFamily;

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

/// What a preset sets. `effective_path` is joined to the origin of the role's health
/// URL (`http://host:port`); `None` means the engine serves no configuration document
/// bisect knows of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preset {
    pub running_metric: &'static str,
    pub queued_metric: &'static str,
    pub effective_path: Option<&'static str>,
    pub markup: &'static [MarkupFamily],
}

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
            Engine::Sglang => Preset {
                running_metric: "sglang:num_running_reqs",
                queued_metric: "sglang:num_queue_reqs",
                effective_path: Some("/get_server_info"),
                markup: ALL_MARKUP,
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
            },
            Engine::Llamacpp => Preset {
                running_metric: "llamacpp:requests_processing",
                queued_metric: "llamacpp:requests_deferred",
                effective_path: Some("/props"),
                markup: ALL_MARKUP,
            },
            Engine::Embedded => Preset {
                running_metric: "sglang:num_running_reqs",
                queued_metric: "sglang:num_queue_reqs",
                effective_path: Some("/server_info"),
                markup: ALL_MARKUP,
            },
            Engine::Custom => Preset {
                running_metric: "sglang:num_running_reqs",
                queued_metric: "sglang:num_queue_reqs",
                effective_path: None,
                markup: ALL_MARKUP,
            },
        }
    }

    /// The preset's effective-config URL for a role answering health on `health_url`.
    pub fn effective_url(self, health_url: &str) -> Option<String> {
        let path = self.preset().effective_path?;
        Some(format!("{}{path}", origin(health_url)?))
    }
}

/// `http://host:port` of an `http://host:port/path` URL.
pub fn origin(url: &str) -> Option<&str> {
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
            Some("http://10.0.0.2:30000/get_server_info")
        );
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
