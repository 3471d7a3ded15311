//! The embedded miniature prefill/decode engine (docs/design.md section 4). The harness
//! never depends on this crate (its tests use `mock` as a dev-dependency only); the CLI
//! starts a role through the two entry points `EngineConfig` (built by `cli::engine`)
//! and `run`, and serves `mock` for benchmarks (`bisect mock-engine`, hidden).
//!
//! Layout: `tokenizer`, `template` (chat template, request types), `dsml` (tool-call
//! markup), `keys` + `model` (the agent and its KV read-back), `kvpool` + `hicache` +
//! `prefill` (prefill's pool, host tier, loader, scheduler), `transfer` (the KV payload),
//! `decode` (batching), `server/` (HTTP of both roles), `listen` (connection handling:
//! timeouts, connection cap), `metrics` (the one `/metrics` table), `mock` (a zero-work
//! chat server for the harness's tests and benchmarks), `backend/{cpu,cuda}`.
//!
//! Test-only (not in the binary): `sim` (in-process load simulation, how the tuning
//! was chosen), `needle` (context-length recall by index-K dtype) and `test_support`
//! (what the HTTP tests share).
//!
//! The crate's API is what the CLI, the benchmarks and the harness's tests use:
//! `EngineConfig` + `run`, `mock`, `listen::HttpLimits`, the backend contract with its
//! CPU and CUDA backends, and `keys` + `model`'s decode step for the decode benchmark;
//! everything else is `pub(crate)`.

pub mod backend;
pub(crate) mod decode;
pub(crate) mod dsml;
#[cfg(test)]
mod dsml_proptests;
pub(crate) mod hicache;
pub mod keys;
pub(crate) mod kvpool;
pub mod listen;
pub(crate) mod metrics;
pub mod mock;
pub mod model;
#[cfg(test)]
mod needle;
pub(crate) mod prefill;
pub(crate) mod server;
#[cfg(test)]
mod sim;
pub(crate) mod template;
#[cfg(test)]
mod test_support;
pub(crate) mod tokenizer;
pub(crate) mod transfer;

use backend::{AttnPath, Backend, IndexKDtype, TopkImpl};
use serde::Serialize;
use thiserror::Error;

pub(crate) const ENV_BF16_INDEX_K: &str = "SGLANG_DSV4_BF16_INDEX_K";
pub(crate) const ENV_INDEX_K_HICACHE_SYNC: &str = "SGLANG_DSV4_INDEX_K_HICACHE_SYNC";
pub(crate) const ENV_MMA_FLASHMLA: &str = "SGLANG_SM120_MMA_FLASHMLA";
pub(crate) const ENV_TOPK_V2: &str = "SGLANG_OPT_USE_TOPK_V2";
/// Optional instrumentation: crc32 of the transferred index-K on both sides.
pub(crate) const ENV_INDEX_K_CHECKSUM: &str = "SGLANG_DSV4_INDEX_K_CHECKSUM";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Prefill,
    Decode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceChoice {
    Auto,
    Cpu,
    Cuda,
}

/// The flags of docs/design.md section 4, as read at start.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EngineFlags {
    pub bf16_index_k: bool,
    pub index_k_hicache_sync: bool,
    pub mma_flashmla: bool,
    pub topk_v2: bool,
    pub hierarchical_cache: bool,
    pub cuda_graph_max_bs: usize,
    pub index_k_checksum: bool,
}

#[derive(Debug, Error, PartialEq)]
pub enum FlagError {
    #[error("{name}={value:?} is not a valid value: expected 0 or 1")]
    NotBoolean { name: String, value: String },
}

fn env_switch(
    lookup: &dyn Fn(&str) -> Option<String>,
    name: &str,
    default: bool,
) -> Result<bool, FlagError> {
    match lookup(name).as_deref().map(str::trim) {
        None | Some("") => Ok(default),
        Some("1") => Ok(true),
        Some("0") => Ok(false),
        Some(other) => Err(FlagError::NotBoolean {
            name: name.to_string(),
            value: other.to_string(),
        }),
    }
}

impl EngineFlags {
    /// Environment flags through `lookup` (std::env::var in production); the command
    /// line ones are passed in.
    pub fn from_env(
        lookup: &dyn Fn(&str) -> Option<String>,
        hierarchical_cache: bool,
        cuda_graph_max_bs: usize,
        index_k_checksum_arg: bool,
    ) -> Result<Self, FlagError> {
        Ok(EngineFlags {
            bf16_index_k: env_switch(lookup, ENV_BF16_INDEX_K, true)?,
            index_k_hicache_sync: env_switch(lookup, ENV_INDEX_K_HICACHE_SYNC, false)?,
            mma_flashmla: env_switch(lookup, ENV_MMA_FLASHMLA, true)?,
            topk_v2: env_switch(lookup, ENV_TOPK_V2, true)?,
            hierarchical_cache,
            cuda_graph_max_bs,
            index_k_checksum: index_k_checksum_arg
                || env_switch(lookup, ENV_INDEX_K_CHECKSUM, false)?,
        })
    }

    pub fn dtype(&self) -> IndexKDtype {
        if self.bf16_index_k {
            IndexKDtype::Bf16
        } else {
            IndexKDtype::Fp8
        }
    }

    pub(crate) fn attn_path(&self) -> AttnPath {
        if self.mma_flashmla {
            AttnPath::Mma
        } else {
            AttnPath::Legacy
        }
    }

    pub(crate) fn topk_impl(&self) -> TopkImpl {
        if self.topk_v2 {
            TopkImpl::V2
        } else {
            TopkImpl::V1
        }
    }
}

/// Tuning knobs of the served engine.
///
/// Pool and loader bandwidth are calibrated over HTTP through the harness (README,
/// "Embedded engine: measured"), not taken from the (test-only) `sim`: real clients arrive less densely
/// than the simulation's arrival model, so the served pool is larger (29 MiB: the
/// default workload's 80 sessions fit with fp8 index-K, not with bf16) and the loader a
/// little faster (576 KiB per step) than `PrefillOptions::tuned`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EngineTuning {
    pub page_tokens: usize,
    pub pool_bytes: usize,
    pub host_pages: usize,
    pub loader_bytes_per_step: usize,
    pub loader_chunk_bytes: usize,
    pub step_token_budget: usize,
    /// Modelled floor of one prefill forward step in wall time (a GPU forward never
    /// takes less than its launch latency). The loader's bandwidth is per step, so this
    /// maps virtual time onto wall time; 0 runs steps back to back.
    pub prefill_step_floor_us: u64,
    /// With prefill's pool on the device (`--device cuda`): modelled device time of the
    /// forward per prompt token computed, queued before the step's KV is gathered for
    /// shipping; the longer, the more time the copy stream has to land a load-back's
    /// index-K before it is read. 0 (the default, uncalibrated): the gather follows at
    /// once. Ignored on the CPU.
    pub prefill_forward_ns_per_token: u64,
    pub top_k: usize,
    /// Decode's running batch cap.
    pub max_running: usize,
    /// Decode pool capacity in tokens.
    pub decode_pool_tokens: usize,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
}

impl Default for EngineTuning {
    fn default() -> Self {
        let prefill = prefill::PrefillOptions::tuned(IndexKDtype::Bf16, true, false);
        EngineTuning {
            page_tokens: prefill.page_tokens,
            pool_bytes: 29 << 20,
            host_pages: prefill.host_pages,
            loader_bytes_per_step: 576 << 10,
            loader_chunk_bytes: prefill.loader.chunk_bytes,
            step_token_budget: prefill.step_token_budget,
            prefill_step_floor_us: 1000,
            prefill_forward_ns_per_token: 0,
            top_k: model::DEFAULT_TOP_K,
            max_running: 256,
            decode_pool_tokens: 1 << 20,
            max_body_bytes: 8 << 20,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EngineConfig {
    pub role: Role,
    pub host: String,
    pub port: u16,
    /// Decode only: where prefill listens (e.g. http://127.0.0.1:30000).
    pub prefill_url: Option<String>,
    pub device: DeviceChoice,
    pub flags: EngineFlags,
    pub tuning: EngineTuning,
    /// Connection timeouts and cap of the role's HTTP server.
    pub http: listen::HttpLimits,
}

impl EngineConfig {
    pub(crate) fn prefill_options(&self) -> prefill::PrefillOptions {
        prefill::PrefillOptions {
            dtype: self.flags.dtype(),
            page_tokens: self.tuning.page_tokens,
            pool_bytes: self.tuning.pool_bytes,
            host_pages: self.tuning.host_pages,
            hicache: self.flags.hierarchical_cache,
            index_k_sync: self.flags.index_k_hicache_sync,
            loader: hicache::LoaderOptions {
                bytes_per_step: self.tuning.loader_bytes_per_step,
                chunk_bytes: self.tuning.loader_chunk_bytes,
            },
            step_token_budget: self.tuning.step_token_budget,
            forward_ns_per_token: self.tuning.prefill_forward_ns_per_token,
        }
    }

    pub(crate) fn read_path(&self) -> model::ReadPath {
        model::ReadPath {
            dtype: self.flags.dtype(),
            top_k: self.tuning.top_k,
            topk: self.flags.topk_impl(),
            attn: self.flags.attn_path(),
            max_graph_batch: self.flags.cuda_graph_max_bs,
        }
    }
}

/// Pick the compute backend for `--device`: `cpu`; `cuda` (an error if no GPU or NVRTC
/// is usable); `auto`: the CPU, for now, even where `backend::cuda::probe` finds a GPU:
/// the GPU path (the paged pools and kernels of `backend::paged`) has not been verified
/// on a device yet (scripts/gpu-check.sh does that; docs/performance.md "GPU"), and a silently wrong
/// backend would make verdicts silently wrong. The probe loads the driver library itself
/// before touching cudarc, whose context creation panics when no driver exists.
pub(crate) fn select_backend(device: DeviceChoice) -> anyhow::Result<Box<dyn Backend>> {
    match device {
        DeviceChoice::Cpu => Ok(Box::new(backend::cpu::CpuBackend::new())),
        DeviceChoice::Cuda => {
            let gpu = backend::cuda::probe()
                .ok_or_else(|| anyhow::anyhow!("--device cuda: no CUDA driver or device found"))?;
            let cuda = backend::cuda::CudaBackend::new()
                .map_err(|e| anyhow::anyhow!("--device cuda ({gpu}): {e:#}"))?;
            Ok(Box::new(cuda))
        }
        DeviceChoice::Auto => {
            if let Some(gpu) = backend::cuda::probe() {
                tracing::info!(
                    "found {gpu}; --device auto uses the CPU until the GPU path is verified on a device (pass --device cuda to use it)"
                );
            }
            Ok(Box::new(backend::cpu::CpuBackend::new()))
        }
    }
}

/// Run one role until the process is killed (blocking: starts its own runtime).
pub fn run(config: EngineConfig) -> anyhow::Result<()> {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .try_init();
    let backend = select_backend(config.device)?;
    tracing::info!(
        role = ?config.role,
        device = backend.name(),
        flags = %serde_json::to_string(&config.flags).unwrap_or_default(),
        tuning = %serde_json::to_string(&config.tuning).unwrap_or_default(),
        http = %serde_json::to_string(&config.http).unwrap_or_default(),
        "bisect engine starting: {}={} {}={} {}={} {}={} hierarchical_cache={} cuda_graph_max_bs={} index_k_checksum={}",
        ENV_BF16_INDEX_K, config.flags.bf16_index_k as u8,
        ENV_INDEX_K_HICACHE_SYNC, config.flags.index_k_hicache_sync as u8,
        ENV_MMA_FLASHMLA, config.flags.mma_flashmla as u8,
        ENV_TOPK_V2, config.flags.topk_v2 as u8,
        config.flags.hierarchical_cache, config.flags.cuda_graph_max_bs, config.flags.index_k_checksum,
    );
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(server::serve(config, backend))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_selection_never_panics_without_a_gpu() {
        assert_eq!(select_backend(DeviceChoice::Cpu).unwrap().name(), "cpu");
        // Until the GPU path is verified on a device, auto is the CPU everywhere.
        assert_eq!(select_backend(DeviceChoice::Auto).unwrap().name(), "cpu");
        if backend::cuda::probe().is_none() {
            let error = select_backend(DeviceChoice::Cuda).err().unwrap();
            assert!(error.to_string().contains("no CUDA driver"), "{error}");
        }
    }

    #[test]
    fn flags_default_and_bad_values_name_the_variable() {
        let none = |_: &str| None;
        let flags = EngineFlags::from_env(&none, true, 32, false).unwrap();
        assert!(
            flags.bf16_index_k
                && !flags.index_k_hicache_sync
                && flags.mma_flashmla
                && flags.topk_v2
        );
        assert_eq!(flags.dtype(), IndexKDtype::Bf16);
        let bad = |name: &str| (name == ENV_BF16_INDEX_K).then(|| "yes".to_string());
        let error = EngineFlags::from_env(&bad, true, 32, false).unwrap_err();
        assert!(
            error
                .to_string()
                .contains("SGLANG_DSV4_BF16_INDEX_K=\"yes\""),
            "{error}"
        );
        let fp8 = |name: &str| (name == ENV_BF16_INDEX_K).then(|| "0".to_string());
        assert_eq!(
            EngineFlags::from_env(&fp8, false, 32, false)
                .unwrap()
                .dtype(),
            IndexKDtype::Fp8
        );
    }
}
