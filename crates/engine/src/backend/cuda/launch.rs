//! The GPU implementation of [`Backend`]'s slice methods: uploads, kernel launches and
//! downloads of index-K quantization, indexer scores + top-k, and both sparse attention
//! paths over gathered host slices (the paged methods are implemented by the pools,
//! `pool`). Also the launch helpers the slice and paged kernel families share, so that
//! what differs between them is only how a kernel finds its rows: the top-k, the query
//! side of attention and the whole attention flow ([`CudaBackend::attend`], each family
//! giving its kernels as an [`AttnKernels`]). Each call runs on the compute stream and
//! returns once its results are on the host.

use anyhow::{ensure, Context, Result};
use cudarc::driver::{CudaFunction, CudaSlice, LaunchConfig, PushKernelArg};

use super::super::{
    paged, AttnJob, AttnOut, AttnPath, Backend, IndexKDtype, IndexerJob, IndexerRead, TopkImpl,
    INDEX_DIM, MAIN_DIM,
};
use super::{
    blocks, grid_for, row_starts, to_u32, CudaBackend, ATTN_THREADS, ELEMENTWISE_THREADS,
    TOPK_THREADS,
};

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
        let (function, cfg) = self.quantize_kernel(dtype, n);
        let mut launch = self.compute.launch_builder(function);
        launch.arg(&d_keys).arg(&mut d_out).arg(&n32);
        // SAFETY: argument types and order match the kernel signature in index_k.cu.
        unsafe { launch.launch(cfg) }
            .with_context(|| format!("launching quantize_index_k ({})", dtype.name()))?;
        out.copy_from_slice(&self.download(&d_out, out.len())?);
        Ok(())
    }

    fn indexer_topk(&self, jobs: &[IndexerJob<'_>], read: IndexerRead) -> Result<Vec<Vec<u32>>> {
        let IndexerRead { dtype, k, topk } = read;
        let bytes_per_token = dtype.bytes_per_token();
        for (j, job) in jobs.iter().enumerate() {
            paged::check_query("indexer", j, job.query, INDEX_DIM)?;
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
        let jobs32 = to_u32(jobs.len(), "indexer jobs")?;

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

        let counts: Vec<usize> = jobs.iter().map(|job| job.n).collect();
        self.topk_on_device(&d_scores, &d_starts, &counts, k, topk)
    }

    fn sparse_attention(&self, jobs: &[AttnJob<'_>], path: AttnPath) -> Result<Vec<AttnOut>> {
        check_attention_jobs(jobs)?;
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let batch = AttnBatch::new(jobs.iter().map(|job| (job.query, job.n, job.selected)))?;
        let keys: Vec<f32> = jobs
            .iter()
            .flat_map(|job| job.keys[..job.n * MAIN_DIM].iter().copied())
            .collect();
        let d_queries = self.upload(&batch.queries)?;
        let d_keys = self.upload(&keys)?;
        let selection = self.upload_selection(&batch, false)?;
        let mut kernels = SliceAttn {
            backend: self,
            keys: &d_keys,
            selection: &selection,
        };
        self.attend(&d_queries, &selection, path, &mut kernels)
    }

    fn model_forward_delay(&self, ns: u64) -> Result<()> {
        if ns == 0 {
            return Ok(());
        }
        let mut launch = self.compute.launch_builder(&self.kernels.forward_delay);
        launch.arg(&ns);
        // SAFETY: matches model_forward_delay in hicache_copy.cu (one u64 by value).
        unsafe { launch.launch(blocks(1, 1)) }.context("launching model_forward_delay")?;
        Ok(())
    }
}

/// The slice family's attention kernels: every job's rows gathered back to back
/// (`Selection::row_start` says whose).
struct SliceAttn<'a> {
    backend: &'a CudaBackend,
    keys: &'a CudaSlice<f32>,
    selection: &'a Selection,
}

impl AttnKernels for SliceAttn<'_> {
    fn mma(&mut self, absorbed: &CudaSlice<f32>, run: &mut AttnRun) -> Result<()> {
        let (backend, selection) = (self.backend, self.selection);
        let mut d_logits = backend.zeros::<f32>(selection.selected_total)?;
        let mut launch = backend.compute.launch_builder(&backend.kernels.attn_mma);
        launch
            .arg(absorbed)
            .arg(self.keys)
            .arg(&selection.row_start)
            .arg(&selection.selected)
            .arg(&selection.sel_start)
            .arg(&mut d_logits)
            .arg(&mut run.argmax)
            .arg(&mut run.weight);
        // SAFETY: matches sparse_attention_mma in sparse_attention.cu.
        unsafe { launch.launch(blocks(selection.jobs(), ATTN_THREADS)) }
            .context("launching sparse_attention_mma")?;
        Ok(())
    }

    fn dense(&mut self, projected: &CudaSlice<f32>, dense: &mut CudaSlice<f32>) -> Result<()> {
        let (backend, selection) = (self.backend, self.selection);
        let mut launch = backend
            .compute
            .launch_builder(&backend.kernels.attn_legacy_dense);
        launch
            .arg(&backend.up_projection)
            .arg(projected)
            .arg(self.keys)
            .arg(&selection.row_start)
            .arg(&selection.jobs32)
            .arg(dense);
        // SAFETY: matches sparse_attention_legacy_dense.
        unsafe { launch.launch(grid_for(selection.rows, ELEMENTWISE_THREADS)) }
            .context("launching legacy dense")?;
        Ok(())
    }
}

/// Shape checks of an attention batch, before anything is uploaded.
fn check_attention_jobs(jobs: &[AttnJob<'_>]) -> Result<()> {
    for (j, job) in jobs.iter().enumerate() {
        paged::check_query("attention", j, job.query, MAIN_DIM)?;
        ensure!(
            job.keys.len() >= job.n * MAIN_DIM,
            "attention job {j}: {} key f32 for n = {}",
            job.keys.len(),
            job.n
        );
        paged::check_selection("attention", j, job.selected, job.n)?;
    }
    Ok(())
}

impl CudaBackend {
    /// Top-k of per-job score rows already on the device (job j's scores are
    /// `d_scores[d_starts[j]..d_starts[j + 1]]`, `counts[j]` of them): the slice and the
    /// paged indexer share it. Returns min(k, n_j) positions per job.
    pub(super) fn topk_on_device(
        &self,
        d_scores: &CudaSlice<f32>,
        d_starts: &CudaSlice<u32>,
        counts: &[usize],
        k: usize,
        topk: TopkImpl,
    ) -> Result<Vec<Vec<u32>>> {
        let k32 = to_u32(k, "top-k")?;
        to_u32(counts.len() * k, "indexer output slots")?;
        let mut d_out = self.zeros::<u32>(counts.len() * k)?;
        match topk {
            TopkImpl::V1 => {
                let mut scratch_starts = Vec::with_capacity(counts.len());
                let mut padded_total = 0u64;
                for &n in counts {
                    scratch_starts.push(padded_total);
                    padded_total += n.max(1).next_power_of_two() as u64;
                }
                let d_scratch_starts = self.upload(&scratch_starts)?;
                let mut d_scratch = self.zeros::<u64>(padded_total as usize)?;
                let mut launch = self.compute.launch_builder(&self.kernels.topk_v1);
                launch
                    .arg(d_scores)
                    .arg(d_starts)
                    .arg(&d_scratch_starts)
                    .arg(&mut d_scratch)
                    .arg(&k32)
                    .arg(&mut d_out);
                // SAFETY: matches topk_v1_bitonic in indexer_topk.cu.
                unsafe { launch.launch(blocks(counts.len(), TOPK_THREADS)) }
                    .context("launching topk_v1_bitonic")?;
            }
            TopkImpl::V2 => {
                let mut d_scratch = self.zeros::<u64>(counts.len() * k)?;
                let mut launch = self.compute.launch_builder(&self.kernels.topk_v2);
                launch
                    .arg(d_scores)
                    .arg(d_starts)
                    .arg(&mut d_scratch)
                    .arg(&k32)
                    .arg(&mut d_out);
                // SAFETY: matches topk_v2_radix_select in indexer_topk.cu.
                unsafe { launch.launch(blocks(counts.len(), TOPK_THREADS)) }
                    .context("launching topk_v2_radix_select")?;
            }
        }
        let flat = self.download(&d_out, counts.len() * k)?;
        Ok(counts
            .iter()
            .zip(flat.chunks(k))
            .map(|(&n, slots)| slots[..n.min(k)].to_vec())
            .collect())
    }
}

impl CudaBackend {
    /// The quantize kernel of `dtype` and its launch shape for `rows` tokens, shared by
    /// `quantize_index_k` and a pool's `store_rows`.
    pub(super) fn quantize_kernel(
        &self,
        dtype: IndexKDtype,
        rows: usize,
    ) -> (&CudaFunction, LaunchConfig) {
        match dtype {
            IndexKDtype::Bf16 => (
                &self.kernels.quantize_bf16,
                grid_for(rows * INDEX_DIM, ELEMENTWISE_THREADS),
            ),
            // One block of exactly INDEX_DIM threads per token (the kernel's amax reduction).
            IndexKDtype::Fp8 => (&self.kernels.quantize_fp8, {
                let mut cfg = grid_for(rows, 1);
                cfg.block_dim = (INDEX_DIM as u32, 1, 1);
                cfg
            }),
        }
    }
}

/// The host side of an attention batch, slice or paged: the queries and the
/// selections back to back, and the prefix sums of rows and of selections per job.
pub(super) struct AttnBatch {
    pub(super) jobs32: u32,
    pub(super) row_start: Vec<u32>,
    pub(super) sel_start: Vec<u32>,
    pub(super) rows: usize,
    pub(super) selected_total: usize,
    pub(super) queries: Vec<f32>,
    pub(super) selected: Vec<u32>,
}

impl AttnBatch {
    /// From each job's (query, n, selected).
    pub(super) fn new<'a>(
        jobs: impl ExactSizeIterator<Item = (&'a [f32], usize, &'a [u32])> + Clone,
    ) -> Result<Self> {
        let jobs32 = to_u32(jobs.len(), "attention jobs")?;
        let row_start = row_starts(jobs.clone().map(|(_, n, _)| n))?;
        let sel_start = row_starts(jobs.clone().map(|(_, _, selected)| selected.len()))?;
        Ok(AttnBatch {
            jobs32,
            rows: *row_start.last().unwrap_or(&0) as usize,
            selected_total: *sel_start.last().unwrap_or(&0) as usize,
            row_start,
            sel_start,
            queries: jobs
                .clone()
                .flat_map(|(query, _, _)| query.iter().copied())
                .collect(),
            selected: jobs
                .flat_map(|(_, _, selected)| selected.iter().copied())
                .collect(),
        })
    }
}

/// The device buffers that say which rows each attention job selected.
pub(super) struct Selection {
    pub(super) row_start: CudaSlice<u32>,
    pub(super) selected: CudaSlice<u32>,
    pub(super) sel_start: CudaSlice<u32>,
    pub(super) jobs32: u32,
    /// Rows of every job together (the Legacy path's dense pass reads them all).
    pub(super) rows: usize,
    pub(super) selected_total: usize,
}

impl Selection {
    pub(super) fn jobs(&self) -> usize {
        self.jobs32 as usize
    }
}

/// An attention batch on the device once its queries are prepared: the result buffers,
/// `W q` of every job, and on the Mma path the absorbed `W^T W q`.
pub(super) struct AttnRun {
    pub(super) argmax: CudaSlice<u32>,
    pub(super) weight: CudaSlice<f32>,
    pub(super) projected: CudaSlice<f32>,
    pub(super) absorbed: Option<CudaSlice<f32>>,
}

/// How one family's attention kernels find a job's rows: the slice kernels in a
/// gathered buffer, the paged ones through a pool's page tables. Everything around them
/// is [`CudaBackend::attend`]. Each implementation launches its own kernels, arguments
/// in the kernel's order next to the launch.
pub(super) trait AttnKernels {
    /// The Mma path's kernel: the logits of every job's selected rows (queries absorbed
    /// already), then its argmax and weight into `run`.
    fn mma(&mut self, absorbed: &CudaSlice<f32>, run: &mut AttnRun) -> Result<()>;
    /// The Legacy path's dense pass: every row's logit against the projected query.
    fn dense(&mut self, projected: &CudaSlice<f32>, dense: &mut CudaSlice<f32>) -> Result<()>;
    /// Queued before the Legacy path's passes (the paged family counts its stale main
    /// pages there; its Mma kernel counts them itself).
    fn before_legacy(&mut self) -> Result<()> {
        Ok(())
    }
}

impl CudaBackend {
    /// Uploads a batch's selection (row starts, selected positions, selection starts):
    /// through the page-locked staging ring on the paged path (`pinned`), plainly on
    /// the slice path.
    pub(super) fn upload_selection(&self, batch: &AttnBatch, pinned: bool) -> Result<Selection> {
        let upload = |data: &[u32]| {
            if pinned {
                self.upload_pinned(data)
            } else {
                self.upload(data)
            }
        };
        Ok(Selection {
            row_start: upload(&batch.row_start)?,
            selected: upload(&batch.selected)?,
            sel_start: upload(&batch.sel_start)?,
            jobs32: batch.jobs32,
            rows: batch.rows,
            selected_total: batch.selected_total,
        })
    }

    /// The query side both attention calls share, queued after their uploads: the
    /// zeroed result buffers, `mla_project_queries`, and on the Mma path
    /// `mla_absorb_queries`.
    fn attention_queries(
        &self,
        d_queries: &CudaSlice<f32>,
        jobs32: u32,
        path: AttnPath,
    ) -> Result<AttnRun> {
        let jobs = jobs32 as usize;
        let argmax = self.zeros::<u32>(jobs)?;
        let weight = self.zeros::<f32>(jobs)?;
        let query_threads = grid_for(jobs * MAIN_DIM, ELEMENTWISE_THREADS);
        let mut projected = self.zeros::<f32>(jobs * MAIN_DIM)?;
        let mut project = self.compute.launch_builder(&self.kernels.mla_project);
        project
            .arg(&self.up_projection)
            .arg(d_queries)
            .arg(&jobs32)
            .arg(&mut projected);
        // SAFETY: matches mla_project_queries in sparse_attention.cu.
        unsafe { project.launch(query_threads) }.context("launching mla_project_queries")?;
        let absorbed = match path {
            AttnPath::Mma => {
                let mut absorbed = self.zeros::<f32>(jobs * MAIN_DIM)?;
                let mut absorb = self.compute.launch_builder(&self.kernels.mla_absorb);
                absorb
                    .arg(&self.up_projection)
                    .arg(&projected)
                    .arg(&jobs32)
                    .arg(&mut absorbed);
                // SAFETY: matches mla_absorb_queries in sparse_attention.cu.
                unsafe { absorb.launch(query_threads) }.context("launching mla_absorb_queries")?;
                Some(absorbed)
            }
            AttnPath::Legacy => None,
        };
        Ok(AttnRun {
            argmax,
            weight,
            projected,
            absorbed,
        })
    }

    /// The attention flow of both families once their inputs are on the device: the
    /// query side ([`CudaBackend::attention_queries`]), then the family's Mma kernel, or
    /// its `before_legacy` launches and the Legacy passes around its dense one
    /// ([`CudaBackend::legacy_attention`]); then each job's argmax and weight.
    pub(super) fn attend(
        &self,
        d_queries: &CudaSlice<f32>,
        selection: &Selection,
        path: AttnPath,
        kernels: &mut impl AttnKernels,
    ) -> Result<Vec<AttnOut>> {
        let mut run = self.attention_queries(d_queries, selection.jobs32, path)?;
        // Kept to the end, as the other device buffers of the call.
        let absorbed = run.absorbed.take();
        match &absorbed {
            Some(d_absorbed) => kernels.mma(d_absorbed, &mut run)?,
            None => {
                kernels.before_legacy()?;
                self.legacy_attention(selection, &mut run, |projected, dense| {
                    kernels.dense(projected, dense)
                })?
            }
        }
        self.download_attn(&run.argmax, &run.weight, selection.jobs())
    }

    /// The legacy path of either family: zeroed dense scores and mask, the family's
    /// dense pass (`dense`, given the projected queries and the scores to fill), then
    /// the shared mask of each job's selected rows and the softmax over them into each
    /// job's argmax and weight.
    fn legacy_attention(
        &self,
        selection: &Selection,
        run: &mut AttnRun,
        dense: impl FnOnce(&CudaSlice<f32>, &mut CudaSlice<f32>) -> Result<()>,
    ) -> Result<()> {
        let mut d_dense = self.zeros::<f32>(selection.rows)?;
        let mut d_mask = self.zeros::<u8>(selection.rows)?;
        dense(&run.projected, &mut d_dense)?;
        let mut mask = self.compute.launch_builder(&self.kernels.attn_legacy_mask);
        mask.arg(&selection.row_start)
            .arg(&selection.selected)
            .arg(&selection.sel_start)
            .arg(&selection.jobs32)
            .arg(&mut d_mask);
        // SAFETY: matches sparse_attention_legacy_mask.
        unsafe { mask.launch(grid_for(selection.selected_total, ELEMENTWISE_THREADS)) }
            .context("launching legacy mask")?;
        let mut softmax = self
            .compute
            .launch_builder(&self.kernels.attn_legacy_softmax);
        softmax
            .arg(&d_dense)
            .arg(&d_mask)
            .arg(&selection.row_start)
            .arg(&mut run.argmax)
            .arg(&mut run.weight);
        // SAFETY: matches sparse_attention_legacy_softmax.
        unsafe { softmax.launch(blocks(selection.jobs(), ATTN_THREADS)) }
            .context("launching legacy softmax")?;
        Ok(())
    }

    /// Each job's argmax and weight, downloaded.
    fn download_attn(
        &self,
        d_argmax: &CudaSlice<u32>,
        d_weight: &CudaSlice<f32>,
        jobs: usize,
    ) -> Result<Vec<AttnOut>> {
        let argmax = self.download(d_argmax, jobs)?;
        let weight = self.download(d_weight, jobs)?;
        Ok(argmax
            .into_iter()
            .zip(weight)
            .map(|(argmax, weight)| AttnOut {
                argmax,
                weight,
                // The kernel reduces to the argmax on the device; no runner-up comes
                // back, so this backend serves no log-probabilities.
                candidates: Vec::new(),
            })
            .collect())
    }
}
