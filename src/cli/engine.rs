//! clap arguments of `bisect engine` (the embedded prefill/decode engine) and of the
//! hidden `bisect mock-engine` (the zero-work mock, for benchmarks that need it in
//! another process). The environment flags of docs/design.md section 4 are read here, once,
//! at start.

use anyhow::Context;
use bisect_engine::listen::HttpLimits;
use bisect_engine::mock::{Fault, FaultRule, MockConfig, MockServer};
use bisect_engine::{DeviceChoice, EngineConfig, EngineFlags, EngineTuning, Role};
use std::net::SocketAddr;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum RoleArg {
    Prefill,
    Decode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum DeviceArg {
    Auto,
    Cpu,
    Cuda,
}

/// Run one role of the embedded miniature prefill/decode engine.
///
/// Environment flags (0 or 1, read at start): SGLANG_DSV4_BF16_INDEX_K (default 1),
/// SGLANG_DSV4_INDEX_K_HICACHE_SYNC (0), SGLANG_SM120_MMA_FLASHMLA (1),
/// SGLANG_OPT_USE_TOPK_V2 (1), SGLANG_DSV4_INDEX_K_CHECKSUM (0).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct EngineArgs {
    /// Which role this process plays.
    #[arg(long, value_enum)]
    pub(crate) role: RoleArg,
    #[arg(long)]
    pub(crate) port: u16,
    #[arg(long, default_value = "127.0.0.1")]
    pub(crate) host: String,
    /// Decode only: base URL of the prefill role.
    #[arg(long)]
    pub(crate) prefill_url: Option<String>,
    /// Compute backend. `auto` is the CPU for now, even with a GPU present: the GPU path
    /// is not yet verified on a device (docs/performance.md, "GPU"); `cuda` uses it anyway (prefill's
    /// prefix cache and HiCache then live on the device). The environment variable
    /// reaches engines started by `bisect run` through their launch scripts.
    #[arg(long, value_enum, default_value = "auto", env = "BISECT_ENGINE_DEVICE")]
    pub(crate) device: DeviceArg,
    /// Prefill's HiCache host tier: evicted prefix pages go to host memory and are loaded back.
    #[arg(long)]
    pub(crate) enable_hierarchical_cache: bool,
    /// Decode batches larger than this take the eager path (same results).
    #[arg(long, default_value_t = 32)]
    pub(crate) cuda_graph_max_bs: usize,
    /// crc32 of the transferred index-K on both sides (also SGLANG_DSV4_INDEX_K_CHECKSUM=1).
    #[arg(long)]
    pub(crate) index_k_checksum: bool,
    /// Tokens per KV page.
    #[arg(long)]
    pub(crate) page_size: Option<usize>,
    /// Prefill device pool capacity in bytes (main KV + index-K).
    #[arg(long)]
    pub(crate) pool_bytes: Option<usize>,
    /// HiCache loader bandwidth in bytes per prefill scheduler step (virtual time).
    #[arg(long)]
    pub(crate) loader_bytes_per_step: Option<usize>,
    /// Modelled floor of one prefill step in microseconds (maps steps onto wall time).
    #[arg(long)]
    pub(crate) prefill_step_floor_us: Option<u64>,
    /// With --device cuda: modelled device time of prefill's forward per prompt token,
    /// queued before a step's KV is gathered for shipping (0: none; ignored on the CPU).
    /// The environment variable reaches engines started by `bisect run`.
    #[arg(long, env = "BISECT_PREFILL_FORWARD_NS_PER_TOKEN")]
    pub(crate) prefill_forward_ns_per_token: Option<u64>,
    /// Prompt tokens computed per prefill step.
    #[arg(long)]
    pub(crate) chunked_prefill_size: Option<usize>,
    /// Decode's running-batch cap.
    #[arg(long)]
    pub(crate) max_running_requests: Option<usize>,
}

impl EngineArgs {
    pub(crate) fn into_config(self) -> anyhow::Result<EngineConfig> {
        let lookup = |name: &str| std::env::var(name).ok();
        let flags = EngineFlags::from_env(
            &lookup,
            self.enable_hierarchical_cache,
            self.cuda_graph_max_bs,
            self.index_k_checksum,
        )
        .context("reading the engine's environment flags")?;
        anyhow::ensure!(
            self.cuda_graph_max_bs >= 1,
            "--cuda-graph-max-bs must be at least 1"
        );
        let defaults = EngineTuning::default();
        let tuning = EngineTuning {
            page_tokens: self.page_size.unwrap_or(defaults.page_tokens).max(1),
            pool_bytes: self.pool_bytes.unwrap_or(defaults.pool_bytes),
            loader_bytes_per_step: self
                .loader_bytes_per_step
                .unwrap_or(defaults.loader_bytes_per_step),
            prefill_step_floor_us: self
                .prefill_step_floor_us
                .unwrap_or(defaults.prefill_step_floor_us),
            prefill_forward_ns_per_token: self
                .prefill_forward_ns_per_token
                .unwrap_or(defaults.prefill_forward_ns_per_token),
            step_token_budget: self
                .chunked_prefill_size
                .unwrap_or(defaults.step_token_budget)
                .max(1),
            max_running: self
                .max_running_requests
                .unwrap_or(defaults.max_running)
                .max(1),
            ..defaults
        };
        let role = match self.role {
            RoleArg::Prefill => Role::Prefill,
            RoleArg::Decode => Role::Decode,
        };
        anyhow::ensure!(
            role == Role::Prefill || self.prefill_url.is_some(),
            "the decode role needs --prefill-url (e.g. http://127.0.0.1:30000)"
        );
        let device = match self.device {
            DeviceArg::Auto => DeviceChoice::Auto,
            DeviceArg::Cpu => DeviceChoice::Cpu,
            DeviceArg::Cuda => DeviceChoice::Cuda,
        };
        Ok(EngineConfig {
            role,
            host: self.host,
            port: self.port,
            prefill_url: self.prefill_url,
            device,
            flags,
            tuning,
            http: HttpLimits::default(),
        })
    }
}

/// Serve the zero-work mock chat engine (for benchmarks; not a user command).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct MockEngineArgs {
    #[arg(long)]
    pub(crate) port: u16,
    #[arg(long, default_value = "127.0.0.1")]
    pub(crate) host: std::net::IpAddr,
    /// A deterministic delay of 0..this many ms per request.
    #[arg(long, default_value_t = 0)]
    pub(crate) jitter_ms: u64,
    /// Die of SIGSEGV when this many requests are in flight at once (0: never): an
    /// engine that crashes at load, for tests of engine deaths. From the environment
    /// too, so a launch config's `export` line is a flag.
    #[arg(long, env = "BISECT_MOCK_CRASH_AT_RUNNING", default_value_t = 0)]
    pub(crate) crash_at_running: u64,
    /// Answer the first round of the sessions whose task message has crc32 % M == 0
    /// with DSML markup as text (a leak), alone or under load (0: never): an engine
    /// whose first rounds are sometimes corrupted even alone. From the environment too.
    #[arg(
        long,
        value_name = "M",
        env = "BISECT_MOCK_LEAK_FIRST_ROUND",
        default_value_t = 0
    )]
    pub(crate) leak_first_round: u32,
    /// Become poisoned the first time this many requests are in flight at once (0:
    /// never): every call from then on has a wrong argument, even alone, until the
    /// process restarts. From the environment too.
    #[arg(
        long,
        value_name = "N",
        env = "BISECT_MOCK_POISON_AT_RUNNING",
        default_value_t = 0
    )]
    pub(crate) poison_at_running: u64,
    /// Milliseconds per token of every reply, slept before it (0: none): an engine
    /// bound by decode latency rather than this machine's CPU. From the environment too.
    #[arg(long, env = "BISECT_MOCK_TOKEN_DELAY_MS", default_value_t = 0)]
    pub(crate) token_delay_ms: u64,
    /// Answer round 1 of the sessions whose task message has crc32 % M == 1 with a
    /// wrong argument, alone or under load (0: never): a build that corrupts some
    /// sessions whatever the flag (a replica that differs). From the environment too.
    #[arg(
        long,
        value_name = "M",
        env = "BISECT_MOCK_WRONG_ARGS_EVERY",
        default_value_t = 0
    )]
    pub(crate) wrong_args_every: u32,
}

/// Serve the mock until the process is killed (blocking: starts its own runtime).
pub(crate) fn run_mock(args: MockEngineArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        let config = MockConfig {
            jitter_ms: args.jitter_ms,
            crash_at_running: (args.crash_at_running > 0).then_some(args.crash_at_running),
            poison_at_running: (args.poison_at_running > 0).then_some(args.poison_at_running),
            faults: (args.leak_first_round > 0)
                .then(|| FaultRule::leak_first_round(args.leak_first_round))
                .into_iter()
                .chain(
                    (args.wrong_args_every > 0)
                        .then(|| FaultRule::new(args.wrong_args_every, 1, 1, Fault::WrongArgs)),
                )
                .collect(),
            token_delay_ms: args.token_delay_ms,
            ..MockConfig::default()
        };
        let addr = SocketAddr::new(args.host, args.port);
        let server = MockServer::bind(addr, config)
            .await
            .with_context(|| format!("binding {addr}"))?;
        stderr_line!("mock engine listening on {}", server.api());
        std::future::pending::<()>().await;
        Ok(())
    })
}
