//! CUDA backend of the embedded engine: the device probe, the NVRTC compilation of
//! `kernels/*.cu`, the context and streams ([`CudaBackend`]) and the launch geometry.
//! Each part of the contract is implemented where its code lives: the slice methods
//! ([`Backend`](super::Backend)) in `launch`, with the launch helpers both kernel
//! families share (quantize shape, attention batch, query projection and flow, legacy
//! mask + softmax, top-k); the paged pools (device-resident KV, page tables, HiCache on
//! the copy stream, generation tags; `super::paged`) in `pool`
//! ([`PagedPools`](super::PagedPools)), their reads in `pool/reads`
//! ([`PagedReads`](super::PagedReads)); the older load-back primitive ([`LoadBackPool`],
//! superseded by the pools, used by one test only) in `loadback`.
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

mod launch;
mod loadback;
mod pool;
#[cfg(test)]
mod tests;

pub use loadback::{LoadBackPool, LoadBackStats};

use std::collections::HashMap;
use std::panic::catch_unwind;
use std::sync::Arc;

use anyhow::{anyhow, ensure, Context, Result};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DeviceRepr, LaunchConfig,
    ValidAsZeroBits,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};

use super::mla_up_projection;

/// One entry of [`KERNEL_SOURCES`]: `kernels/common.cuh`, the device helpers several
/// kernels share, then the kernel file, each behind a `#line` so that NVRTC's messages
/// name the right file and line. NVRTC gets the embedded text and no file system, so
/// the header is joined here rather than named in the .cu.
macro_rules! kernel_source {
    ($file:literal) => {
        (
            $file,
            concat!(
                "#line 1 \"common.cuh\"\n",
                include_str!("../../../../../kernels/common.cuh"),
                "#line 1 \"",
                $file,
                "\"\n",
                include_str!(concat!("../../../../../kernels/", $file)),
            ),
        )
    };
}

/// Every kernel source, embedded at build time: (file name under `kernels/`, source).
pub(crate) const KERNEL_SOURCES: &[(&str, &str)] = &[
    kernel_source!("index_k.cu"),
    kernel_source!("indexer_topk.cu"),
    kernel_source!("sparse_attention.cu"),
    kernel_source!("hicache_copy.cu"),
];

/// Virtual architecture of the GPU-less compile check (Hopper, the deployment's class).
pub(crate) const COMPILE_CHECK_ARCH: &str = "compute_90";

/// Threads per block the attention kernels are written for (`ATTN_THREADS` in the .cu).
const ATTN_THREADS: u32 = 256;
const TOPK_THREADS: u32 = 512;
const ELEMENTWISE_THREADS: u32 = 256;
/// Grid-stride kernels need no more blocks than this to fill any current GPU.
const MAX_GRID_BLOCKS: u32 = 65_535;

/// True when a CUDA driver library (`libcuda.so*`) can be dlopened.
pub(crate) fn driver_library_present() -> bool {
    // SAFETY: only tries dlopen on cudarc's candidate names; no symbol is called.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// True when NVRTC (`libnvrtc.so*`, e.g. from the PyPI package nvidia-cuda-nvrtc-cu12
/// on `LD_LIBRARY_PATH`) can be dlopened.
pub(crate) fn nvrtc_library_present() -> bool {
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
    append_rows: CudaFunction,
    paged_scores_bf16: CudaFunction,
    paged_scores_fp8: CudaFunction,
    paged_attn_mma: CudaFunction,
    paged_legacy_dense: CudaFunction,
    paged_count_stale_main: CudaFunction,
    paged_gather: CudaFunction,
    forward_delay: CudaFunction,
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
            append_rows: function("index_k.cu", "append_rows")?,
            paged_scores_bf16: function("indexer_topk.cu", "paged_indexer_scores_bf16")?,
            paged_scores_fp8: function("indexer_topk.cu", "paged_indexer_scores_fp8")?,
            paged_attn_mma: function("sparse_attention.cu", "paged_sparse_attention_mma")?,
            paged_legacy_dense: function("sparse_attention.cu", "paged_attention_legacy_dense")?,
            paged_count_stale_main: function("sparse_attention.cu", "paged_count_stale_main")?,
            paged_gather: function("hicache_copy.cu", "paged_gather_sequence")?,
            forward_delay: function("hicache_copy.cu", "model_forward_delay")?,
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
    /// Paged pools ([`super::paged`]), indexed by `PoolId`; `None` once released.
    pools: parking_lot::Mutex<Vec<Option<pool::GpuPool>>>,
    /// Page-locked staging of the paged calls' per-call inputs (page tables, queries).
    staging: parking_lot::Mutex<Staging>,
}

/// Page-locked host memory the paged calls stage their small per-call inputs in (page
/// tables, expected generations, queries, new rows) before one async H2D copy each on
/// the compute stream: from pageable memory the driver would stage every upload itself
/// through a bounce buffer and block the host until it is copied.
///
/// The arena is used as a ring: each upload takes the next 256-aligned bytes and
/// records `uploaded` on the compute stream behind its copy. When the ring wraps, the
/// host waits on that event (every earlier copy is before it on the same stream) before
/// overwriting bytes a queued copy may still read. Event tracking is off (see
/// `CudaBackend::new`), so this event is the only thing that protects the bytes.
struct Staging {
    host: Option<cudarc::driver::PinnedHostSlice<u8>>,
    cursor: usize,
    uploaded: Option<cudarc::driver::CudaEvent>,
}

impl Drop for Staging {
    fn drop(&mut self) {
        // A copy still queued from the ring must finish before its memory is freed.
        if let Some(event) = self.uploaded.take() {
            let _ = event.synchronize();
        }
    }
}

/// First size of the staging ring; it doubles when one upload does not fit.
const STAGING_BYTES: usize = 4 << 20;

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
            pools: parking_lot::Mutex::new(Vec::new()),
            staging: parking_lot::Mutex::new(Staging {
                host: None,
                cursor: 0,
                uploaded: None,
            }),
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

    /// As [`CudaBackend::upload`], through the page-locked staging ring ([`Staging`]):
    /// one truly asynchronous H2D copy on the compute stream.
    fn upload_pinned<T: DeviceRepr + Default + Clone>(&self, data: &[T]) -> Result<CudaSlice<T>> {
        let one = [T::default()];
        let data = if data.is_empty() { &one[..] } else { data };
        let bytes = std::mem::size_of_val(data);
        let mut staging = self.staging.lock();
        let capacity = staging.host.as_ref().map_or(0, |host| host.len());
        if bytes > capacity || staging.cursor + bytes > capacity {
            if let Some(event) = staging.uploaded.take() {
                event.synchronize()?;
            }
            staging.cursor = 0;
            if bytes > capacity {
                let size = bytes.next_power_of_two().max(STAGING_BYTES);
                // SAFETY: every byte handed to a copy is written first (below).
                let host = unsafe { self.ctx.alloc_pinned_with_flags::<u8>(size, 0) }
                    .with_context(|| {
                        format!("allocating {} MiB of page-locked staging", size >> 20)
                    })?;
                staging.host = Some(host);
            }
        }
        let start = staging.cursor;
        staging.cursor = (start + bytes).div_ceil(256) * 256;
        let host = staging
            .host
            .as_mut()
            .ok_or_else(|| anyhow!("no staging memory"))?
            .as_mut_slice()?;
        let window = &mut host[start..start + bytes];
        // SAFETY: `window` is `bytes` long, 256-aligned inside a page-aligned allocation,
        // and T is a plain device type (u32/f32): a byte copy of `data` is a valid [T].
        let typed: &[T] = unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr() as *const u8, window.as_mut_ptr(), bytes);
            std::slice::from_raw_parts(window.as_ptr() as *const T, data.len())
        };
        // SAFETY: fully written by the copy queued next, before any kernel reads it.
        let mut device = unsafe { self.compute.alloc::<T>(data.len()) }?;
        self.compute.memcpy_htod(typed, &mut device)?;
        staging.uploaded = Some(self.compute.record_event(None)?);
        Ok(device)
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

/// `count` blocks of `threads` threads: one per job, page or tile.
fn blocks(count: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (count as u32, 1, 1),
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
