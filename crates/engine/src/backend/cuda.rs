//! CUDA backend of the embedded engine: owns the NVRTC compilation of `kernels/*.cu`,
//! the GPU implementation of [`Backend`], the device probe, and the HiCache load-back
//! primitive on the GPU ([`LoadBackPool`]).
//!
//! cudarc is built with dynamic loading, so this module compiles and links without CUDA.
//! Nothing here may panic when the driver or NVRTC library is missing: cudarc panics on
//! first use of a library it cannot dlopen, so every entry point checks loadability first
//! ([`driver_library_present`], [`nvrtc_library_present`]) and wraps the first driver
//! calls in `catch_unwind` (an old driver lacking a symbol panics too).
//!
//! cudarc's per-buffer event tracking is disabled right after the context is created:
//! it would make every kernel wait for every earlier copy touching the same buffer and
//! so hide the very race the HiCache fix flag gates. All cross-stream ordering here is
//! explicit.
//!
//! Kernels are compiled with `--fmad=false`, IEEE division and square root, so the
//! scores and logits equal the CPU backend's bit for bit (see the headers of the .cu
//! files for the exact arithmetic each kernel mirrors).

use std::collections::HashMap;
use std::panic::catch_unwind;
use std::sync::Arc;

use anyhow::{anyhow, bail, ensure, Context, Result};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr,
    LaunchConfig, PinnedHostSlice, PushKernelArg, ValidAsZeroBits,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};
use parking_lot::Mutex;

use super::{
    mla_up_projection, AttnJob, AttnOut, AttnPath, Backend, IndexKDtype, IndexerJob, TopkImpl,
    INDEX_DIM, MAIN_DIM,
};

/// Every kernel source, embedded at build time: (file name under `kernels/`, source).
pub const KERNEL_SOURCES: &[(&str, &str)] = &[
    ("index_k.cu", include_str!("../../../../kernels/index_k.cu")),
    (
        "indexer_topk.cu",
        include_str!("../../../../kernels/indexer_topk.cu"),
    ),
    (
        "sparse_attention.cu",
        include_str!("../../../../kernels/sparse_attention.cu"),
    ),
    (
        "hicache_copy.cu",
        include_str!("../../../../kernels/hicache_copy.cu"),
    ),
];

/// Virtual architecture of the GPU-less compile check (Hopper, the deployment's class).
pub const COMPILE_CHECK_ARCH: &str = "compute_90";

/// Threads per block the attention kernels are written for (`ATTN_THREADS` in the .cu).
const ATTN_THREADS: u32 = 256;
const TOPK_THREADS: u32 = 512;
const ELEMENTWISE_THREADS: u32 = 256;
/// Grid-stride kernels need no more blocks than this to fill any current GPU.
const MAX_GRID_BLOCKS: u32 = 65_535;

/// True when a CUDA driver library (`libcuda.so*`) can be dlopened.
pub fn driver_library_present() -> bool {
    // SAFETY: only tries dlopen on cudarc's candidate names; no symbol is called.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// True when NVRTC (`libnvrtc.so*`, e.g. from the PyPI package nvidia-cuda-nvrtc-cu12
/// on `LD_LIBRARY_PATH`) can be dlopened.
pub fn nvrtc_library_present() -> bool {
    // SAFETY: as above, dlopen only.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// A description of GPU 0 ("NVIDIA H200, sm_90, 139.8 GiB, 1 device(s)") when a driver
/// library and at least one device are present; `None` otherwise. Never panics.
pub fn probe() -> Option<String> {
    if !driver_library_present() {
        return None;
    }
    let described = catch_unwind(|| -> Result<Option<String>> {
        let count = CudaContext::device_count()?;
        if count < 1 {
            return Ok(None);
        }
        let ctx = CudaContext::new(0)?;
        Ok(Some(describe_device(&ctx, count)?))
    });
    match described {
        Ok(Ok(description)) => description,
        Ok(Err(_)) | Err(_) => None,
    }
}

fn describe_device(ctx: &Arc<CudaContext>, count: i32) -> Result<String> {
    let (major, minor) = ctx.compute_capability()?;
    let gib = ctx.total_mem()? as f64 / (1u64 << 30) as f64;
    Ok(format!(
        "{}, sm_{major}{minor}, {gib:.1} GiB, {count} device(s)",
        ctx.name()?
    ))
}

fn compile_options(file: &str, arch: String) -> CompileOptions {
    CompileOptions {
        ftz: Some(false),
        prec_sqrt: Some(true),
        prec_div: Some(true),
        fmad: Some(false),
        use_fast_math: Some(false),
        options: vec![format!("--gpu-architecture={arch}")],
        name: Some(file.to_string()),
        ..Default::default()
    }
}

fn compile_kernel(file: &str, source: &str, arch: &str) -> Result<Ptx> {
    compile_ptx_with_opts(source, compile_options(file, arch.to_string())).map_err(|error| {
        match error {
            cudarc::nvrtc::CompileError::CompileError { log, .. } => {
                anyhow!(
                    "NVRTC failed on kernels/{file} for {arch}:\n{}",
                    log.to_string_lossy()
                )
            }
            other => anyhow!("NVRTC failed on kernels/{file} for {arch}: {other}"),
        }
    })
}

/// Compiles every `kernels/*.cu` with NVRTC for [`COMPILE_CHECK_ARCH`]; needs only
/// libnvrtc, no GPU or driver. Returns (kernel file name, PTX size in bytes).
pub fn compile_check_all() -> Result<Vec<(String, usize)>> {
    ensure!(
        nvrtc_library_present(),
        "NVRTC library not found: run scripts/install-nvrtc.sh and put the directory it prints on LD_LIBRARY_PATH"
    );
    KERNEL_SOURCES
        .iter()
        .map(|(file, source)| {
            let ptx = compile_kernel(file, source, COMPILE_CHECK_ARCH)?;
            Ok((file.to_string(), ptx.to_src().len()))
        })
        .collect()
}

struct Kernels {
    quantize_bf16: CudaFunction,
    quantize_fp8: CudaFunction,
    scores_bf16: CudaFunction,
    scores_fp8: CudaFunction,
    topk_v1: CudaFunction,
    topk_v2: CudaFunction,
    mla_project: CudaFunction,
    mla_absorb: CudaFunction,
    attn_mma: CudaFunction,
    attn_legacy_dense: CudaFunction,
    attn_legacy_mask: CudaFunction,
    attn_legacy_softmax: CudaFunction,
    gather_pages: CudaFunction,
}

impl Kernels {
    fn load(ctx: &Arc<CudaContext>, arch: &str) -> Result<Self> {
        let mut modules: HashMap<&str, Arc<CudaModule>> = HashMap::new();
        for (file, source) in KERNEL_SOURCES {
            let ptx = compile_kernel(file, source, arch)?;
            let module = ctx
                .load_module(ptx)
                .with_context(|| format!("loading the PTX of kernels/{file}"))?;
            modules.insert(file, module);
        }
        let function = |file: &str, name: &str| -> Result<CudaFunction> {
            modules[file]
                .load_function(name)
                .with_context(|| format!("kernel {name} in kernels/{file}"))
        };
        Ok(Kernels {
            quantize_bf16: function("index_k.cu", "quantize_index_k_bf16")?,
            quantize_fp8: function("index_k.cu", "quantize_index_k_fp8")?,
            scores_bf16: function("indexer_topk.cu", "indexer_scores_bf16")?,
            scores_fp8: function("indexer_topk.cu", "indexer_scores_fp8")?,
            topk_v1: function("indexer_topk.cu", "topk_v1_bitonic")?,
            topk_v2: function("indexer_topk.cu", "topk_v2_radix_select")?,
            mla_project: function("sparse_attention.cu", "mla_project_queries")?,
            mla_absorb: function("sparse_attention.cu", "mla_absorb_queries")?,
            attn_mma: function("sparse_attention.cu", "sparse_attention_mma")?,
            attn_legacy_dense: function("sparse_attention.cu", "sparse_attention_legacy_dense")?,
            attn_legacy_mask: function("sparse_attention.cu", "sparse_attention_legacy_mask")?,
            attn_legacy_softmax: function(
                "sparse_attention.cu",
                "sparse_attention_legacy_softmax",
            )?,
            gather_pages: function("hicache_copy.cu", "gather_pages")?,
        })
    }
}

/// The GPU backend: one context on device 0, a compute stream for the kernels and a
/// separate copy stream for HiCache load-backs ([`LoadBackPool`]).
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    compute: Arc<CudaStream>,
    copy: Arc<CudaStream>,
    kernels: Kernels,
    /// The MLA up-projection W (`mla_up_projection()`), resident on the device.
    up_projection: CudaSlice<f32>,
    description: String,
}

impl CudaBackend {
    /// Opens device 0, disables cudarc's event tracking and compiles every kernel with
    /// NVRTC for the device's own architecture. Errors (never panics) without a driver,
    /// a device or NVRTC.
    pub fn new() -> Result<Self> {
        ensure!(
            driver_library_present(),
            "no CUDA driver library (libcuda.so) found"
        );
        ensure!(
            nvrtc_library_present(),
            "no NVRTC library (libnvrtc.so*) found: install the CUDA toolkit or run scripts/install-nvrtc.sh and add the printed directory to LD_LIBRARY_PATH"
        );
        let opened = catch_unwind(|| -> Result<(Arc<CudaContext>, String)> {
            let count = CudaContext::device_count().context("counting CUDA devices")?;
            ensure!(count >= 1, "the CUDA driver reports no device");
            let ctx = CudaContext::new(0).context("creating a CUDA context on device 0")?;
            let description = describe_device(&ctx, count)?;
            Ok((ctx, description))
        })
        .map_err(|_| {
            anyhow!("the CUDA driver library is unusable (cudarc panicked while opening device 0)")
        })??;
        let (ctx, description) = opened;
        // SAFETY: called before any buffer or stream exists; from here on every
        // cross-stream dependency is an explicit event wait or stream join.
        unsafe { ctx.disable_event_tracking() };
        let (major, minor) = ctx.compute_capability()?;
        let arch = format!("compute_{major}{minor}");
        let kernels = Kernels::load(&ctx, &arch)?;
        let compute = ctx.new_stream().context("creating the compute stream")?;
        let copy = ctx
            .new_stream()
            .context("creating the load-back copy stream")?;
        let up_projection = compute.clone_htod(mla_up_projection())?;
        compute.synchronize()?;
        Ok(CudaBackend {
            ctx,
            compute,
            copy,
            kernels,
            up_projection,
            description,
        })
    }

    /// Device description, as [`probe`] gives it.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// Uploads at least one element so empty inputs never ask for a zero-size allocation.
    fn upload<T: DeviceRepr + Default + Clone>(&self, data: &[T]) -> Result<CudaSlice<T>> {
        let slice = if data.is_empty() {
            self.compute.clone_htod(&[T::default()][..])?
        } else {
            self.compute.clone_htod(data)?
        };
        Ok(slice)
    }

    fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize) -> Result<CudaSlice<T>> {
        Ok(self.compute.alloc_zeros::<T>(len.max(1))?)
    }

    /// Copies `src` back and waits for it (pageable destinations are not synchronised
    /// by cudarc once event tracking is off).
    fn download<T: DeviceRepr + Default + Clone>(
        &self,
        src: &CudaSlice<T>,
        len: usize,
    ) -> Result<Vec<T>> {
        let mut host = vec![T::default(); src.len()];
        self.compute.memcpy_dtoh(src, &mut host)?;
        self.compute.synchronize()?;
        host.truncate(len);
        Ok(host)
    }
}

fn grid_for(items: usize, threads: u32) -> LaunchConfig {
    let blocks = items
        .div_ceil(threads as usize)
        .clamp(1, MAX_GRID_BLOCKS as usize) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn per_job(jobs: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (jobs as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

fn to_u32(value: usize, what: &str) -> Result<u32> {
    u32::try_from(value)
        .map_err(|_| anyhow!("{what} = {value} does not fit the kernels' 32-bit indices"))
}

/// Prefix sums of per-job row counts: job j owns rows start[j] .. start[j + 1].
fn row_starts(counts: impl Iterator<Item = usize>) -> Result<Vec<u32>> {
    let mut starts = vec![0u32];
    let mut total = 0usize;
    for count in counts {
        total += count;
        starts.push(to_u32(total, "total rows of the batch")?);
    }
    Ok(starts)
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        "cuda"
    }

    fn quantize_index_k(&self, dtype: IndexKDtype, keys: &[f32], out: &mut [u8]) -> Result<()> {
        ensure!(
            keys.len() % INDEX_DIM == 0,
            "index-K keys: {} f32 is not a multiple of {INDEX_DIM}",
            keys.len()
        );
        let n = keys.len() / INDEX_DIM;
        ensure!(
            out.len() == n * dtype.bytes_per_token(),
            "index-K output: {} bytes for {n} tokens of {} ({} expected)",
            out.len(),
            dtype.name(),
            n * dtype.bytes_per_token()
        );
        if n == 0 {
            return Ok(());
        }
        let n32 = to_u32(n, "index-K tokens")?;
        let d_keys = self.upload(keys)?;
        let mut d_out = self.zeros::<u8>(out.len())?;
        let (function, cfg) = match dtype {
            IndexKDtype::Bf16 => (
                &self.kernels.quantize_bf16,
                grid_for(n * INDEX_DIM, ELEMENTWISE_THREADS),
            ),
            // One block of exactly INDEX_DIM threads per token (the kernel's amax reduction).
            IndexKDtype::Fp8 => (&self.kernels.quantize_fp8, {
                let mut cfg = grid_for(n, 1);
                cfg.block_dim = (INDEX_DIM as u32, 1, 1);
                cfg
            }),
        };
        let mut launch = self.compute.launch_builder(function);
        launch.arg(&d_keys).arg(&mut d_out).arg(&n32);
        // SAFETY: argument types and order match the kernel signature in index_k.cu.
        unsafe { launch.launch(cfg) }
            .with_context(|| format!("launching quantize_index_k ({})", dtype.name()))?;
        out.copy_from_slice(&self.download(&d_out, out.len())?);
        Ok(())
    }

    fn indexer_topk(
        &self,
        dtype: IndexKDtype,
        jobs: &[IndexerJob<'_>],
        k: usize,
        topk: TopkImpl,
    ) -> Result<Vec<Vec<u32>>> {
        let bytes_per_token = dtype.bytes_per_token();
        for (j, job) in jobs.iter().enumerate() {
            ensure!(
                job.query.len() == INDEX_DIM,
                "indexer job {j}: query has {} f32, not {INDEX_DIM}",
                job.query.len()
            );
            ensure!(
                job.index_k.len() >= job.n * bytes_per_token,
                "indexer job {j}: {} index-K bytes for n = {} in {}",
                job.index_k.len(),
                job.n,
                dtype.name()
            );
        }
        let starts = row_starts(jobs.iter().map(|job| job.n))?;
        let rows = *starts.last().unwrap_or(&0) as usize;
        if jobs.is_empty() || k == 0 || rows == 0 {
            return Ok(vec![Vec::new(); jobs.len()]);
        }
        let k32 = to_u32(k, "top-k")?;
        let jobs32 = to_u32(jobs.len(), "indexer jobs")?;
        to_u32(jobs.len() * k, "indexer output slots")?;

        let queries: Vec<f32> = jobs
            .iter()
            .flat_map(|job| job.query.iter().copied())
            .collect();
        let index_k: Vec<u8> = jobs
            .iter()
            .flat_map(|job| job.index_k[..job.n * bytes_per_token].iter().copied())
            .collect();
        let d_queries = self.upload(&queries)?;
        let d_index_k = self.upload(&index_k)?;
        let d_starts = self.upload(&starts)?;
        let mut d_scores = self.zeros::<f32>(rows)?;
        let scores_fn = match dtype {
            IndexKDtype::Bf16 => &self.kernels.scores_bf16,
            IndexKDtype::Fp8 => &self.kernels.scores_fp8,
        };
        let mut launch = self.compute.launch_builder(scores_fn);
        launch
            .arg(&d_queries)
            .arg(&d_index_k)
            .arg(&d_starts)
            .arg(&jobs32)
            .arg(&mut d_scores);
        // SAFETY: matches indexer_scores_* in indexer_topk.cu.
        unsafe { launch.launch(grid_for(rows, ELEMENTWISE_THREADS)) }
            .context("launching indexer_scores")?;

        let mut d_out = self.zeros::<u32>(jobs.len() * k)?;
        match topk {
            TopkImpl::V1 => {
                let mut scratch_starts = Vec::with_capacity(jobs.len());
                let mut padded_total = 0u64;
                for job in jobs {
                    scratch_starts.push(padded_total);
                    padded_total += job.n.max(1).next_power_of_two() as u64;
                }
                let d_scratch_starts = self.upload(&scratch_starts)?;
                let mut d_scratch = self.zeros::<u64>(padded_total as usize)?;
                let mut launch = self.compute.launch_builder(&self.kernels.topk_v1);
                launch
                    .arg(&d_scores)
                    .arg(&d_starts)
                    .arg(&d_scratch_starts)
                    .arg(&mut d_scratch)
                    .arg(&k32)
                    .arg(&mut d_out);
                // SAFETY: matches topk_v1_bitonic in indexer_topk.cu.
                unsafe { launch.launch(per_job(jobs.len(), TOPK_THREADS)) }
                    .context("launching topk_v1_bitonic")?;
            }
            TopkImpl::V2 => {
                let mut d_scratch = self.zeros::<u64>(jobs.len() * k)?;
                let mut launch = self.compute.launch_builder(&self.kernels.topk_v2);
                launch
                    .arg(&d_scores)
                    .arg(&d_starts)
                    .arg(&mut d_scratch)
                    .arg(&k32)
                    .arg(&mut d_out);
                // SAFETY: matches topk_v2_radix_select in indexer_topk.cu.
                unsafe { launch.launch(per_job(jobs.len(), TOPK_THREADS)) }
                    .context("launching topk_v2_radix_select")?;
            }
        }
        let flat = self.download(&d_out, jobs.len() * k)?;
        Ok(jobs
            .iter()
            .zip(flat.chunks(k))
            .map(|(job, slots)| slots[..job.n.min(k)].to_vec())
            .collect())
    }

    fn sparse_attention(&self, jobs: &[AttnJob<'_>], path: AttnPath) -> Result<Vec<AttnOut>> {
        for (j, job) in jobs.iter().enumerate() {
            ensure!(
                job.query.len() == MAIN_DIM,
                "attention job {j}: query has {} f32, not {MAIN_DIM}",
                job.query.len()
            );
            ensure!(
                job.keys.len() >= job.n * MAIN_DIM,
                "attention job {j}: {} key f32 for n = {}",
                job.keys.len(),
                job.n
            );
            ensure!(
                !job.selected.is_empty(),
                "attention job {j}: empty selection"
            );
            if let Some(bad) = job.selected.iter().find(|&&p| p as usize >= job.n) {
                bail!(
                    "attention job {j}: selected position {bad} is outside 0..{}",
                    job.n
                );
            }
        }
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let jobs32 = to_u32(jobs.len(), "attention jobs")?;
        let row_start = row_starts(jobs.iter().map(|job| job.n))?;
        let sel_start = row_starts(jobs.iter().map(|job| job.selected.len()))?;
        let rows = *row_start.last().unwrap_or(&0) as usize;
        let selected_total = *sel_start.last().unwrap_or(&0) as usize;

        let queries: Vec<f32> = jobs
            .iter()
            .flat_map(|job| job.query.iter().copied())
            .collect();
        let keys: Vec<f32> = jobs
            .iter()
            .flat_map(|job| job.keys[..job.n * MAIN_DIM].iter().copied())
            .collect();
        let selected: Vec<u32> = jobs
            .iter()
            .flat_map(|job| job.selected.iter().copied())
            .collect();
        let d_queries = self.upload(&queries)?;
        let d_keys = self.upload(&keys)?;
        let d_row_start = self.upload(&row_start)?;
        let d_selected = self.upload(&selected)?;
        let d_sel_start = self.upload(&sel_start)?;
        let mut d_argmax = self.zeros::<u32>(jobs.len())?;
        let mut d_weight = self.zeros::<f32>(jobs.len())?;
        let query_threads = grid_for(jobs.len() * MAIN_DIM, ELEMENTWISE_THREADS);
        let mut d_projected = self.zeros::<f32>(jobs.len() * MAIN_DIM)?;
        let mut project = self.compute.launch_builder(&self.kernels.mla_project);
        project
            .arg(&self.up_projection)
            .arg(&d_queries)
            .arg(&jobs32)
            .arg(&mut d_projected);
        // SAFETY: matches mla_project_queries in sparse_attention.cu.
        unsafe { project.launch(query_threads) }.context("launching mla_project_queries")?;

        match path {
            AttnPath::Mma => {
                let mut d_absorbed = self.zeros::<f32>(jobs.len() * MAIN_DIM)?;
                let mut absorb = self.compute.launch_builder(&self.kernels.mla_absorb);
                absorb
                    .arg(&self.up_projection)
                    .arg(&d_projected)
                    .arg(&jobs32)
                    .arg(&mut d_absorbed);
                // SAFETY: matches mla_absorb_queries in sparse_attention.cu.
                unsafe { absorb.launch(query_threads) }.context("launching mla_absorb_queries")?;
                let mut d_logits = self.zeros::<f32>(selected_total)?;
                let mut launch = self.compute.launch_builder(&self.kernels.attn_mma);
                launch
                    .arg(&d_absorbed)
                    .arg(&d_keys)
                    .arg(&d_row_start)
                    .arg(&d_selected)
                    .arg(&d_sel_start)
                    .arg(&mut d_logits)
                    .arg(&mut d_argmax)
                    .arg(&mut d_weight);
                // SAFETY: matches sparse_attention_mma in sparse_attention.cu.
                unsafe { launch.launch(per_job(jobs.len(), ATTN_THREADS)) }
                    .context("launching sparse_attention_mma")?;
            }
            AttnPath::Legacy => {
                let mut d_dense = self.zeros::<f32>(rows)?;
                let mut d_mask = self.zeros::<u8>(rows)?;
                let mut dense = self.compute.launch_builder(&self.kernels.attn_legacy_dense);
                dense
                    .arg(&self.up_projection)
                    .arg(&d_projected)
                    .arg(&d_keys)
                    .arg(&d_row_start)
                    .arg(&jobs32)
                    .arg(&mut d_dense);
                // SAFETY: matches sparse_attention_legacy_dense.
                unsafe { dense.launch(grid_for(rows, ELEMENTWISE_THREADS)) }
                    .context("launching legacy dense")?;
                let mut mask = self.compute.launch_builder(&self.kernels.attn_legacy_mask);
                mask.arg(&d_row_start)
                    .arg(&d_selected)
                    .arg(&d_sel_start)
                    .arg(&jobs32)
                    .arg(&mut d_mask);
                // SAFETY: matches sparse_attention_legacy_mask.
                unsafe { mask.launch(grid_for(selected_total, ELEMENTWISE_THREADS)) }
                    .context("launching legacy mask")?;
                let mut softmax = self
                    .compute
                    .launch_builder(&self.kernels.attn_legacy_softmax);
                softmax
                    .arg(&d_dense)
                    .arg(&d_mask)
                    .arg(&d_row_start)
                    .arg(&mut d_argmax)
                    .arg(&mut d_weight);
                // SAFETY: matches sparse_attention_legacy_softmax.
                unsafe { softmax.launch(per_job(jobs.len(), ATTN_THREADS)) }
                    .context("launching legacy softmax")?;
            }
        }
        let argmax = self.download(&d_argmax, jobs.len())?;
        let weight = self.download(&d_weight, jobs.len())?;
        Ok(argmax
            .into_iter()
            .zip(weight)
            .map(|(argmax, weight)| AttnOut { argmax, weight })
            .collect())
    }
}

/// Counters of a [`LoadBackPool`], for the engine's /metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadBackStats {
    pub evictions: u64,
    pub load_backs: u64,
    /// Reads that waited on an in-flight load-back of a page they read (gated reads).
    pub gated_waits: u64,
    /// Reads that touched a page with a load-back still recorded but did not wait on it
    /// (the missing gate: these reads race the copy).
    pub ungated_reads_of_loading_pages: u64,
}

/// The GPU page pool of one KV kind (main KV or index-K) plus its host tier.
///
/// How the engine uses it (HiCache on the prefill role):
/// - `write_page(page, bytes)` stores a freshly computed page (compute stream).
/// - `evict(page, slot)` copies a device page to host slot `slot` and returns once the
///   copy landed, so the device page can be reused at once.
/// - `load_back(slot, page)` queues host slot -> device page on the dedicated copy
///   stream and records an event; it returns immediately, the copy is still in flight.
/// - `read_pages(pages, gate)` gathers pages on the compute stream into one buffer
///   (the input of the indexer / attention, or of the transfer to decode). With
///   `gate = true` the compute stream first waits on the recorded load-back event of
///   every page it reads; with `gate = false` it does not: the gather may read the page
///   before the copy lands and return the previous occupant's bytes. That is the real
///   GPU race behind the seeds' bug: call it with `gate = true` for main KV always and
///   for index-K only when `SGLANG_DSV4_INDEX_K_HICACHE_SYNC=1`.
pub struct LoadBackPool {
    compute: Arc<CudaStream>,
    copy: Arc<CudaStream>,
    gather: CudaFunction,
    page_bytes: usize,
    device_pages: usize,
    host_pages: usize,
    device: Mutex<CudaSlice<u8>>,
    host: Mutex<PinnedHostSlice<u8>>,
    /// Last load-back event per device page; dropped once a read finds it complete.
    in_flight: Mutex<HashMap<u32, CudaEvent>>,
    stats: Mutex<LoadBackStats>,
}

impl LoadBackPool {
    /// `device_pages` pages of `page_bytes` on the GPU (zeroed) and `host_pages` in
    /// page-locked host memory, so load-backs are truly asynchronous DMA.
    pub fn new(
        backend: &CudaBackend,
        page_bytes: usize,
        device_pages: usize,
        host_pages: usize,
    ) -> Result<Self> {
        ensure!(
            page_bytes > 0 && device_pages > 0 && host_pages > 0,
            "page pool dimensions must be positive"
        );
        to_u32(page_bytes, "page bytes")?;
        to_u32(device_pages.max(host_pages), "page count")?;
        let device = backend
            .compute
            .alloc_zeros::<u8>(page_bytes * device_pages)?;
        // SAFETY: the host tier is zeroed below before any read.
        let mut host = unsafe {
            backend
                .ctx
                .alloc_pinned_with_flags::<u8>(page_bytes * host_pages, 0)
        }?;
        host.as_mut_slice()?.fill(0);
        // The allocation is stream-ordered on the compute stream; the copy stream uses it too.
        backend.compute.synchronize()?;
        Ok(LoadBackPool {
            compute: backend.compute.clone(),
            copy: backend.copy.clone(),
            gather: backend.kernels.gather_pages.clone(),
            page_bytes,
            device_pages,
            host_pages,
            device: Mutex::new(device),
            host: Mutex::new(host),
            in_flight: Mutex::new(HashMap::new()),
            stats: Mutex::new(LoadBackStats::default()),
        })
    }

    pub fn page_bytes(&self) -> usize {
        self.page_bytes
    }

    pub fn stats(&self) -> LoadBackStats {
        *self.stats.lock()
    }

    fn device_range(&self, page: u32) -> Result<std::ops::Range<usize>> {
        ensure!(
            (page as usize) < self.device_pages,
            "device page {page} outside 0..{}",
            self.device_pages
        );
        Ok(page as usize * self.page_bytes..(page as usize + 1) * self.page_bytes)
    }

    fn host_range(&self, slot: u32) -> Result<std::ops::Range<usize>> {
        ensure!(
            (slot as usize) < self.host_pages,
            "host slot {slot} outside 0..{}",
            self.host_pages
        );
        Ok(slot as usize * self.page_bytes..(slot as usize + 1) * self.page_bytes)
    }

    /// Stores one page on the compute stream and waits for it.
    pub fn write_page(&self, page: u32, bytes: &[u8]) -> Result<()> {
        ensure!(
            bytes.len() == self.page_bytes,
            "page of {} bytes, pool pages are {}",
            bytes.len(),
            self.page_bytes
        );
        let range = self.device_range(page)?;
        let mut device = self.device.lock();
        // A load-back still landing on this page would overwrite the new contents.
        if let Some(event) = self.in_flight.lock().remove(&page) {
            self.compute.wait(&event)?;
        }
        self.compute
            .memcpy_htod(bytes, &mut device.slice_mut(range))?;
        self.compute.synchronize()?;
        Ok(())
    }

    /// Device page -> host slot on the copy stream, after all compute work queued so
    /// far (which may still be writing the page); returns when the copy has landed.
    pub fn evict(&self, page: u32, slot: u32) -> Result<()> {
        let device_range = self.device_range(page)?;
        let host_range = self.host_range(slot)?;
        let device = self.device.lock();
        let mut host = self.host.lock();
        self.copy.join(&self.compute)?;
        if let Some(event) = self.in_flight.lock().remove(&page) {
            self.copy.wait(&event)?;
        }
        let host_bytes = &mut host.as_mut_slice()?[host_range];
        self.copy
            .memcpy_dtoh(&device.slice(device_range), host_bytes)?;
        self.copy.synchronize()?;
        self.stats.lock().evictions += 1;
        Ok(())
    }

    /// Host slot -> device page, queued on the copy stream; returns before it lands.
    pub fn load_back(&self, slot: u32, page: u32) -> Result<()> {
        let device_range = self.device_range(page)?;
        let host_range = self.host_range(slot)?;
        let mut device = self.device.lock();
        let host = self.host.lock();
        // Earlier compute work may still read this page's previous occupant.
        self.copy.join(&self.compute)?;
        // SAFETY of the host view: the host tier is only written by `evict`, which
        // finishes its copies before returning, and copies from it run on this stream.
        let host_bytes = &host.as_slice()?[host_range];
        self.copy
            .memcpy_htod(host_bytes, &mut device.slice_mut(device_range))?;
        let event = self.copy.record_event(None)?;
        self.in_flight.lock().insert(page, event);
        self.stats.lock().load_backs += 1;
        Ok(())
    }

    /// Gathers `pages` in order on the compute stream; with `gate` the gather first
    /// waits on the load-back of every page it reads (see the type's docs).
    pub fn read_pages(&self, pages: &[u32], gate: bool) -> Result<Vec<u8>> {
        for &page in pages {
            self.device_range(page)?;
        }
        if pages.is_empty() {
            return Ok(Vec::new());
        }
        let device = self.device.lock();
        {
            let mut in_flight = self.in_flight.lock();
            let mut stats = self.stats.lock();
            for page in pages {
                let Some(event) = in_flight.get(page) else {
                    continue;
                };
                if event.is_complete() {
                    in_flight.remove(page);
                } else if gate {
                    self.compute.wait(event)?;
                    stats.gated_waits += 1;
                } else {
                    stats.ungated_reads_of_loading_pages += 1;
                }
            }
        }
        let total = pages.len() * self.page_bytes;
        let d_pages = self.compute.clone_htod(pages)?;
        let mut d_out = self.compute.alloc_zeros::<u8>(total)?;
        let num_pages = pages.len() as u32;
        let page_bytes = self.page_bytes as u32;
        let mut launch = self.compute.launch_builder(&self.gather);
        launch
            .arg(&*device)
            .arg(&d_pages)
            .arg(&num_pages)
            .arg(&page_bytes)
            .arg(&mut d_out);
        // SAFETY: matches gather_pages in hicache_copy.cu; page ids were range-checked.
        unsafe { launch.launch(grid_for(total, ELEMENTWISE_THREADS)) }
            .context("launching gather_pages")?;
        let mut out = vec![0u8; total];
        self.compute.memcpy_dtoh(&d_out, &mut out)?;
        self.compute.synchronize()?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::super::cpu::CpuBackend;
    use super::*;
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// `extern "C" __global__ void NAME(` entry points declared in a kernel source.
    fn declared_kernels(source: &str) -> Vec<String> {
        let pattern = regex::Regex::new(r#"extern "C" __global__ void (\w+)\("#).unwrap();
        pattern
            .captures_iter(source)
            .map(|c| c[1].to_string())
            .collect()
    }

    #[test]
    fn kernel_sources_cover_every_kernels_file() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../kernels");
        let mut on_disk: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.ends_with(".cu"))
            .collect();
        on_disk.sort();
        let mut embedded: Vec<String> = KERNEL_SOURCES
            .iter()
            .map(|(name, _)| name.to_string())
            .collect();
        embedded.sort();
        assert_eq!(
            on_disk, embedded,
            "every kernels/*.cu must be listed in KERNEL_SOURCES"
        );
        for (name, source) in KERNEL_SOURCES {
            assert!(
                !declared_kernels(source).is_empty(),
                "{name} declares no extern \"C\" kernel"
            );
            assert!(
                !source.contains("#include"),
                "{name}: NVRTC from PyPI ships no CUDA headers"
            );
        }
    }

    #[test]
    fn kernels_compile_with_nvrtc() {
        if !nvrtc_library_present() {
            // CI exports BISECT_NVRTC_DIR after installing NVRTC: there a skip would hide
            // a broken install, so it fails instead.
            if let Ok(dir) = std::env::var("BISECT_NVRTC_DIR") {
                panic!("BISECT_NVRTC_DIR={dir} is set but libnvrtc is not loadable: is it on LD_LIBRARY_PATH?");
            }
            eprintln!(
                "skipped: libnvrtc not loadable (run scripts/install-nvrtc.sh and put its output on LD_LIBRARY_PATH)"
            );
            return;
        }
        let compiled = compile_check_all().unwrap();
        assert_eq!(compiled.len(), KERNEL_SOURCES.len());
        for ((name, size), (file, source)) in compiled.iter().zip(KERNEL_SOURCES) {
            assert_eq!(name, file);
            assert!(*size > 0, "{name}: empty PTX");
            let ptx = compile_kernel(file, source, COMPILE_CHECK_ARCH)
                .unwrap()
                .to_src();
            for kernel in declared_kernels(source) {
                assert!(
                    ptx.contains(&format!(".entry {kernel}(")),
                    "{name}: no PTX entry for {kernel}"
                );
            }
        }
    }

    #[test]
    fn nvrtc_reports_compile_errors_with_the_log() {
        if !nvrtc_library_present() {
            eprintln!("skipped: libnvrtc not loadable");
            return;
        }
        let error = compile_kernel(
            "broken.cu",
            "extern \"C\" __global__ void k() { undeclared(); }",
            COMPILE_CHECK_ARCH,
        )
        .unwrap_err()
        .to_string();
        assert!(
            error.contains("kernels/broken.cu") && error.contains("undeclared"),
            "{error}"
        );
    }

    #[test]
    fn probe_and_new_never_panic_and_agree() {
        match probe() {
            Some(description) => assert!(description.contains("device(s)"), "{description}"),
            None => {
                let error = CudaBackend::new()
                    .err()
                    .expect("no device, yet CudaBackend::new succeeded");
                assert!(!error.to_string().is_empty());
            }
        }
    }

    #[test]
    fn row_starts_are_prefix_sums() {
        assert_eq!(
            row_starts([3usize, 0, 5].into_iter()).unwrap(),
            vec![0, 3, 3, 8]
        );
        assert_eq!(row_starts(std::iter::empty()).unwrap(), vec![0]);
        assert!(row_starts([usize::MAX / 2, usize::MAX / 2].into_iter()).is_err());
        let cfg = grid_for(10_000_000_000, 256);
        assert_eq!(cfg.grid_dim.0, MAX_GRID_BLOCKS);
        assert_eq!(grid_for(0, 256).grid_dim.0, 1);
        assert_eq!(grid_for(257, 256).grid_dim.0, 2);
    }

    /// The GPU backend, or `None` (test skipped) on a machine without a CUDA device.
    fn gpu() -> Option<CudaBackend> {
        if probe().is_none() {
            eprintln!("skipped: no CUDA device");
            return None;
        }
        Some(CudaBackend::new().expect("a CUDA device is present but the backend failed to start"))
    }

    /// Keys with a spread of magnitudes plus the conversions' edge cases: an all-zero
    /// token, exact rounding ties, values around the e4m3 saturation and subnormal range.
    fn edge_case_keys(rng: &mut ChaCha8Rng, tokens: usize) -> Vec<f32> {
        let mut keys: Vec<f32> = (0..tokens * INDEX_DIM)
            .map(|i| {
                let magnitude = 10f32.powi((i % 7) as i32 - 3);
                (rng.random::<f32>() - 0.5) * magnitude
            })
            .collect();
        keys[..INDEX_DIM].fill(0.0);
        let specials = [
            1.0f32 + 1.0 / 256.0, // bf16 tie, even stays
            1.0 + 3.0 / 256.0,    // bf16 tie, odd rounds up
            448.0,
            464.0,
            470.0,
            -1.0e6,
            2.0f32.powi(-10),
            2.0f32.powi(-9) * 1.5,
            -2.0f32.powi(-7),
            1.0e-30,
            -0.0,
        ];
        keys[INDEX_DIM..INDEX_DIM + specials.len()].copy_from_slice(&specials);
        keys
    }

    #[test]
    fn gpu_quantize_matches_cpu_bytes() {
        let Some(gpu) = gpu() else { return };
        let cpu = CpuBackend::new();
        let mut rng = ChaCha8Rng::seed_from_u64(0x1dec);
        let keys = edge_case_keys(&mut rng, 777);
        for dtype in [IndexKDtype::Bf16, IndexKDtype::Fp8] {
            let mut want = vec![0u8; 777 * dtype.bytes_per_token()];
            let mut got = vec![0xAAu8; want.len()];
            cpu.quantize_index_k(dtype, &keys, &mut want).unwrap();
            gpu.quantize_index_k(dtype, &keys, &mut got).unwrap();
            let first_difference = want.iter().zip(&got).position(|(a, b)| a != b);
            assert_eq!(
                first_difference, None,
                "{dtype:?}: bytes differ from the CPU backend"
            );
        }
    }

    #[test]
    fn gpu_indexer_topk_matches_cpu_exactly() {
        let Some(gpu) = gpu() else { return };
        let cpu = CpuBackend::new();
        let mut rng = ChaCha8Rng::seed_from_u64(0x70b);
        let sizes = [0usize, 1, 5, 300, 4099];
        for dtype in [IndexKDtype::Bf16, IndexKDtype::Fp8] {
            let stored: Vec<(Vec<f32>, Vec<u8>)> = sizes
                .iter()
                .map(|&n| {
                    let mut keys = edge_case_keys(&mut rng, n.max(2));
                    keys.truncate(n * INDEX_DIM);
                    // Duplicated rows force exact score ties between positions.
                    if n > 200 {
                        let row = keys[7 * INDEX_DIM..8 * INDEX_DIM].to_vec();
                        keys[150 * INDEX_DIM..151 * INDEX_DIM].copy_from_slice(&row);
                    }
                    let mut bytes = vec![0u8; n * dtype.bytes_per_token()];
                    cpu.quantize_index_k(dtype, &keys, &mut bytes).unwrap();
                    let query: Vec<f32> =
                        (0..INDEX_DIM).map(|_| rng.random::<f32>() - 0.5).collect();
                    (query, bytes)
                })
                .collect();
            let jobs: Vec<IndexerJob<'_>> = stored
                .iter()
                .zip(sizes)
                .map(|((query, bytes), n)| IndexerJob {
                    query,
                    index_k: bytes,
                    n,
                })
                .collect();
            for k in [1usize, 64, 2048] {
                for topk in [TopkImpl::V1, TopkImpl::V2] {
                    let want = cpu.indexer_topk(dtype, &jobs, k, topk).unwrap();
                    let got = gpu.indexer_topk(dtype, &jobs, k, topk).unwrap();
                    assert_eq!(got, want, "{dtype:?} k={k} {topk:?}");
                }
            }
        }
    }

    #[test]
    fn gpu_sparse_attention_matches_cpu() {
        let Some(gpu) = gpu() else { return };
        let cpu = CpuBackend::new();
        let mut rng = ChaCha8Rng::seed_from_u64(0xa77);
        let sizes = [1usize, 17, 640, 3000];
        let data: Vec<(Vec<f32>, Vec<f32>, Vec<u32>)> = sizes
            .iter()
            .map(|&n| {
                let keys: Vec<f32> = (0..n * MAIN_DIM)
                    .map(|_| rng.random::<f32>() * 2.0 - 1.0)
                    .collect();
                let target = rng.random_range(0..n);
                // A query close to one stored row, so the argmax is meaningful.
                let query: Vec<f32> = keys[target * MAIN_DIM..(target + 1) * MAIN_DIM]
                    .iter()
                    .map(|v| v * 4.0 + (rng.random::<f32>() - 0.5) * 0.1)
                    .collect();
                let mut selected: Vec<u32> = (0..n as u32)
                    .filter(|p| p % 3 == 0 || *p == target as u32)
                    .collect();
                selected.reverse();
                (query, keys, selected)
            })
            .collect();
        let jobs: Vec<AttnJob<'_>> = data
            .iter()
            .zip(sizes)
            .map(|((query, keys, selected), n)| AttnJob {
                query,
                keys,
                n,
                selected,
            })
            .collect();
        for path in [AttnPath::Mma, AttnPath::Legacy] {
            let want = cpu.sparse_attention(&jobs, path).unwrap();
            let got = gpu.sparse_attention(&jobs, path).unwrap();
            for (j, (w, g)) in want.iter().zip(&got).enumerate() {
                assert_eq!(g.argmax, w.argmax, "{path:?} job {j}");
                let tolerance = 1e-5 * w.weight.abs().max(1e-6);
                assert!(
                    (g.weight - w.weight).abs() <= tolerance,
                    "{path:?} job {j}: {} vs {}",
                    g.weight,
                    w.weight
                );
            }
        }
    }

    #[test]
    fn gpu_gated_load_back_reads_the_loaded_page() {
        let Some(gpu) = gpu() else { return };
        let page_bytes = 64 * 256;
        let pool = LoadBackPool::new(&gpu, page_bytes, 4, 4).unwrap();
        let page = |fill: u8| vec![fill; page_bytes];
        pool.write_page(1, &page(0x11)).unwrap();
        pool.evict(1, 2).unwrap();
        pool.write_page(1, &page(0x22)).unwrap();
        for round in 0..50 {
            pool.load_back(2, 1).unwrap();
            let read = pool.read_pages(&[1, 0], true).unwrap();
            assert!(
                read[..page_bytes].iter().all(|&b| b == 0x11),
                "round {round}: gated read saw stale bytes"
            );
            assert!(
                read[page_bytes..].iter().all(|&b| b == 0),
                "round {round}: page 0 changed"
            );
            pool.write_page(1, &page(0x22)).unwrap();
        }
        let stats = pool.stats();
        assert_eq!((stats.evictions, stats.load_backs), (1, 50));
        assert_eq!(stats.ungated_reads_of_loading_pages, 0);
    }

    /// One sequence of the decode benchmark: indexer query and index-K, main query and keys.
    struct BenchSequence {
        query: Vec<f32>,
        index_k: Vec<u8>,
        main_keys: Vec<f32>,
        main_query: Vec<f32>,
    }

    /// Decode-step benchmark (`cargo test --release --lib
    /// engine::backend::cuda::tests::decode_step_throughput -- --ignored --nocapture`):
    /// one step = indexer top-k + sparse attention for a batch of sequences, inputs
    /// uploaded per call as the Backend trait defines; prints tokens/s per backend and
    /// checks the GPU's selections equal the CPU's.
    #[test]
    #[ignore = "benchmark; run explicitly (scripts/gpu-check.sh)"]
    fn decode_step_throughput() {
        const BATCH: usize = 32;
        const CONTEXT: usize = 8192;
        const TOP_K: usize = 2048;
        const STEPS: usize = 10;
        let cpu = CpuBackend::new();
        let gpu = gpu();
        let mut rng = ChaCha8Rng::seed_from_u64(0xbe7c);
        for dtype in [IndexKDtype::Bf16, IndexKDtype::Fp8] {
            let sequences: Vec<BenchSequence> = (0..BATCH)
                .map(|_| {
                    let keys: Vec<f32> = (0..CONTEXT * INDEX_DIM)
                        .map(|_| rng.random::<f32>() - 0.5)
                        .collect();
                    let mut index_k = vec![0u8; CONTEXT * dtype.bytes_per_token()];
                    cpu.quantize_index_k(dtype, &keys, &mut index_k).unwrap();
                    let query: Vec<f32> =
                        (0..INDEX_DIM).map(|_| rng.random::<f32>() - 0.5).collect();
                    let main_keys: Vec<f32> = (0..CONTEXT * MAIN_DIM)
                        .map(|_| rng.random::<f32>() - 0.5)
                        .collect();
                    let main_query: Vec<f32> =
                        (0..MAIN_DIM).map(|_| rng.random::<f32>() - 0.5).collect();
                    BenchSequence {
                        query,
                        index_k,
                        main_keys,
                        main_query,
                    }
                })
                .collect();
            let indexer_jobs: Vec<IndexerJob<'_>> = sequences
                .iter()
                .map(|sequence| IndexerJob {
                    query: &sequence.query,
                    index_k: &sequence.index_k,
                    n: CONTEXT,
                })
                .collect();
            let mut backends: Vec<&dyn Backend> = vec![&cpu];
            if let Some(gpu) = gpu.as_ref() {
                backends.push(gpu);
            }
            let mut selections = Vec::new();
            for backend in backends {
                let started = std::time::Instant::now();
                let mut last = Vec::new();
                for _ in 0..STEPS {
                    let selected = backend
                        .indexer_topk(dtype, &indexer_jobs, TOP_K, TopkImpl::V2)
                        .unwrap();
                    let attention_jobs: Vec<AttnJob<'_>> = sequences
                        .iter()
                        .zip(&selected)
                        .map(|(sequence, selected)| AttnJob {
                            query: &sequence.main_query,
                            keys: &sequence.main_keys,
                            n: CONTEXT,
                            selected,
                        })
                        .collect();
                    let out = backend
                        .sparse_attention(&attention_jobs, AttnPath::Mma)
                        .unwrap();
                    last = selected
                        .into_iter()
                        .zip(out.into_iter().map(|o| o.argmax))
                        .collect::<Vec<_>>();
                }
                let seconds = started.elapsed().as_secs_f64();
                eprintln!(
                    "decode step {} {}: batch {BATCH} x ctx {CONTEXT}, top-{TOP_K}: {:.1} ms/step, {:.0} tokens/s",
                    backend.name(),
                    dtype.name(),
                    seconds * 1e3 / STEPS as f64,
                    (BATCH * STEPS) as f64 / seconds
                );
                selections.push(last);
            }
            if selections.len() == 2 {
                assert_eq!(
                    selections[0], selections[1],
                    "{dtype:?}: CUDA selections differ from the CPU's"
                );
            }
        }
    }
}
