//! CPU backend: the reference implementation of the engine's three kernels (index-K
//! quantize, indexer scores + top-k, sparse attention) and of the whole [`Backend`]
//! contract. Plain safe Rust, single threaded per call; the results define what every
//! other backend must reproduce. The reads are written once, over [`Rows`]: the slice
//! methods read a gathered buffer as one page, the paged ones a pool's pages
//! (`cpu_pool`).

use super::cpu_pool::{CpuPools, Region, Rows};
use super::paged::{self, PageRows};
use super::{
    layout, mla_up_projection, AppendedRows, AttnJob, AttnOut, AttnPath, Backend, GatheredKv,
    IndexKDtype, IndexerJob, IndexerRead, PageContents, PagedAttnJob, PagedIndexerJob, PagedPools,
    PagedReads, PoolId, PoolSpec, PoolStats, TopkImpl, INDEX_DIM, MAIN_DIM,
};
use anyhow::{ensure, Result};
use std::cmp::Ordering;

pub struct CpuBackend {
    fp8_table: [f32; 256],
    pools: CpuPools,
    /// Claims asynchronous load-backs (as CUDA's), so that `PrefillCore::for_backend`
    /// and the load simulation take the resident store; its load-backs still land at
    /// once, so nothing is ever stale. Only tests build it so
    /// ([`CpuBackend::claiming_async_load_backs`]).
    claims_async: bool,
    /// The modelled forward delays asked of a backend claiming async load-backs (it has
    /// no device to occupy): what the tests check prefill's resident store queues.
    pub(crate) delays: std::sync::Mutex<Vec<u64>>,
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self::new()
    }
}

impl CpuBackend {
    pub fn new() -> Self {
        CpuBackend {
            fp8_table: layout::fp8_table(),
            pools: Default::default(),
            claims_async: false,
            delays: Default::default(),
        }
    }

    /// The CPU backend taken for one whose load-backs are asynchronous (see
    /// `claims_async`), recording the forward delays it is asked for.
    #[cfg(test)]
    pub(crate) fn claiming_async_load_backs() -> Self {
        CpuBackend {
            claims_async: true,
            ..Self::new()
        }
    }

    /// One indexer query over rows 0..n of `index_k`: dequantized dot products, then
    /// the top `k` in the indexer's order.
    fn indexer_job(
        &self,
        read: IndexerRead,
        query: &[f32],
        index_k: Rows<'_, u8>,
        n: usize,
    ) -> Vec<u32> {
        let mut row = [0.0f32; INDEX_DIM];
        let scored: Vec<(f32, u32)> = index_k
            .first(n)
            .enumerate()
            .map(|(position, bytes)| {
                layout::dequantize_row(read.dtype, bytes, &self.fp8_table, &mut row);
                (sanitize(dot(query, &row)), position as u32)
            })
            .collect();
        select_top(scored, read.k, read.topk)
    }
}

/// Scores that stale garbage turns into NaN/inf must not win: they rank last.
fn sanitize(score: f32) -> f32 {
    if score.is_finite() {
        score
    } else {
        f32::NEG_INFINITY
    }
}

/// Total order of the indexer: score descending, then lower position first.
fn rank(a: &(f32, u32), b: &(f32, u32)) -> Ordering {
    b.0.total_cmp(&a.0).then(a.1.cmp(&b.1))
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `out = W v` for the row-major MAIN_DIM x MAIN_DIM matrix W.
fn project(matrix: &[f32], v: &[f32], out: &mut [f32]) {
    for (row, dst) in matrix.chunks_exact(MAIN_DIM).zip(out.iter_mut()) {
        *dst = dot(row, v);
    }
}

/// `out = W^T v`.
fn project_transposed(matrix: &[f32], v: &[f32], out: &mut [f32]) {
    out.iter_mut().for_each(|x| *x = 0.0);
    for (row, scale) in matrix.chunks_exact(MAIN_DIM).zip(v) {
        out.iter_mut()
            .zip(row)
            .for_each(|(dst, w)| *dst += w * scale);
    }
}

/// The top `k` of `scored` in the indexer's order; V1 sorts everything, V2 selects
/// first. Same result, different work.
fn select_top(mut scored: Vec<(f32, u32)>, k: usize, topk: TopkImpl) -> Vec<u32> {
    let keep = k.min(scored.len());
    match topk {
        TopkImpl::V1 => scored.sort_by(rank),
        TopkImpl::V2 => {
            if keep > 0 && keep < scored.len() {
                scored.select_nth_unstable_by(keep - 1, rank);
            }
            scored[..keep].sort_by(rank);
        }
    }
    scored[..keep]
        .iter()
        .map(|(_, position)| *position)
        .collect()
}

/// The selection's best positions by softmax weight (ties: lower position first, as the
/// argmax breaks them), at most [`super::CANDIDATES`]. Each weight is computed from its
/// own score against the whole selection's sum, in the selection's order, so it does not
/// depend on what else is in the batch.
fn candidates(scores: &[(u32, f32)], max: f32, total: f32) -> Vec<(u32, f32)> {
    if total <= 0.0 {
        return Vec::new();
    }
    let mut weighted: Vec<(u32, f32)> = scores
        .iter()
        .map(|&(position, score)| (position, (sanitize(score) - max).exp() / total))
        .collect();
    weighted.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    weighted.truncate(super::CANDIDATES);
    weighted
}

/// Sparse attention of one query over rows 0..n of `keys`, the selected ones.
fn attend(
    query: &[f32],
    keys: Rows<'_, f32>,
    n: usize,
    selected: &[u32],
    path: AttnPath,
) -> Result<AttnOut> {
    let matrix = mla_up_projection();
    let inv_sqrt_dim = 1.0 / (MAIN_DIM as f32).sqrt();
    let mut projected_query = [0.0f32; MAIN_DIM];
    let mut absorbed_query = [0.0f32; MAIN_DIM];
    let mut projected_key = [0.0f32; MAIN_DIM];
    ensure!(
        !selected.is_empty(),
        "sparse attention over an empty selection"
    );
    project(matrix, query, &mut projected_query);
    let selected_scores: Vec<(u32, f32)> = match path {
        AttnPath::Mma => {
            project_transposed(matrix, &projected_query, &mut absorbed_query);
            selected
                .iter()
                .map(|&position| {
                    let p = position as usize;
                    ensure!(p < n, "selected position {p} outside {n} rows");
                    Ok((position, dot(&absorbed_query, keys.row(p)) * inv_sqrt_dim))
                })
                .collect::<Result<_>>()?
        }
        AttnPath::Legacy => {
            // Dense: every stored row is up-projected and scored, then masked.
            let dense: Vec<f32> = keys
                .first(n)
                .map(|key| {
                    project(matrix, key, &mut projected_key);
                    dot(&projected_query, &projected_key) * inv_sqrt_dim
                })
                .collect();
            selected
                .iter()
                .map(|&position| {
                    let p = position as usize;
                    ensure!(p < n, "selected position {p} outside {n} rows");
                    Ok((position, dense[p]))
                })
                .collect::<Result<_>>()?
        }
    };
    let max = selected_scores
        .iter()
        .map(|(_, s)| sanitize(*s))
        .fold(f32::NEG_INFINITY, f32::max);
    let mut best = (u32::MAX, f32::NEG_INFINITY);
    let mut total = 0.0f32;
    for &(position, score) in &selected_scores {
        let score = sanitize(score);
        total += (score - max).exp();
        if score > best.1 || (score == best.1 && position < best.0) {
            best = (position, score);
        }
    }
    let weight = if total > 0.0 {
        (best.1 - max).exp() / total
    } else {
        0.0
    };
    Ok(AttnOut {
        argmax: best.0,
        weight,
        candidates: candidates(&selected_scores, max, total),
    })
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn quantize_index_k(&self, dtype: IndexKDtype, keys: &[f32], out: &mut [u8]) -> Result<()> {
        let per_token = dtype.bytes_per_token();
        ensure!(
            keys.len() % INDEX_DIM == 0,
            "index keys are not a whole number of rows"
        );
        ensure!(
            out.len() == keys.len() / INDEX_DIM * per_token,
            "index-K output buffer has {} bytes, expected {}",
            out.len(),
            keys.len() / INDEX_DIM * per_token
        );
        for (key, row) in keys
            .chunks_exact(INDEX_DIM)
            .zip(out.chunks_exact_mut(per_token))
        {
            layout::quantize_row(dtype, key, row);
        }
        Ok(())
    }

    fn indexer_topk(&self, jobs: &[IndexerJob<'_>], read: IndexerRead) -> Result<Vec<Vec<u32>>> {
        let per_token = read.dtype.bytes_per_token();
        let mut results = Vec::with_capacity(jobs.len());
        for job in jobs {
            ensure!(
                job.query.len() == INDEX_DIM,
                "indexer query must have {INDEX_DIM} values"
            );
            ensure!(
                job.index_k.len() >= job.n * per_token,
                "index-K buffer shorter than n rows"
            );
            let rows = Rows::gathered(job.index_k, per_token, job.n);
            results.push(self.indexer_job(read, job.query, rows, job.n));
        }
        Ok(results)
    }

    fn sparse_attention(&self, jobs: &[AttnJob<'_>], path: AttnPath) -> Result<Vec<AttnOut>> {
        let mut outputs = Vec::with_capacity(jobs.len());
        for job in jobs {
            ensure!(
                job.query.len() == MAIN_DIM,
                "attention query must have {MAIN_DIM} values"
            );
            ensure!(
                job.keys.len() >= job.n * MAIN_DIM,
                "main key buffer shorter than n rows"
            );
            let keys = Rows::gathered(job.keys, MAIN_DIM, job.n);
            outputs.push(attend(job.query, keys, job.n, job.selected, path)?);
        }
        Ok(outputs)
    }

    fn model_forward_delay(&self, ns: u64) -> Result<()> {
        // The CPU models step time on the host (`EngineTuning::prefill_step_floor_us`);
        // only a backend claiming async load-backs keeps what it was asked.
        if self.claims_async {
            self.delays
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(ns);
        }
        Ok(())
    }
}

impl PagedPools for CpuBackend {
    fn create_pool(&self, spec: PoolSpec) -> Result<PoolId> {
        self.pools.create(spec)
    }

    fn release_pool(&self, pool: PoolId) -> Result<()> {
        self.pools.release(pool)
    }

    fn store_rows(&self, pool: PoolId, rows: PageRows<'_>) -> Result<()> {
        self.pools.with(pool, |p| p.store(&rows))
    }

    fn append_rows(&self, pool: PoolId, appended: AppendedRows<'_>) -> Result<()> {
        self.pools.with(pool, |p| {
            paged::check_append(&p.spec, &appended)?;
            appended.one_by_one().try_for_each(|row| p.store(&row))
        })
    }

    fn evict_page(&self, pool: PoolId, page: u32, slot: u32) -> Result<()> {
        self.pools.with(pool, |p| p.evict(page, slot))
    }

    fn load_back_pages(&self, pool: PoolId, pairs: &[(u32, u32)]) -> Result<()> {
        // Each copy lands before the next starts: main KV and index-K of a pair at once.
        self.pools.with(pool, |p| {
            pairs
                .iter()
                .try_for_each(|&(slot, page)| p.load_back(slot, page))
        })
    }

    fn load_back_is_async(&self) -> bool {
        self.claims_async
    }
}

impl PagedReads for CpuBackend {
    fn gather_sequence(
        &self,
        pool: PoolId,
        pages: &[u32],
        n: usize,
        _gate_index_k: bool,
    ) -> Result<GatheredKv> {
        // Load-backs here have landed before they return: nothing to wait for.
        self.pools.with(pool, |p| p.gather(pages, n))
    }

    fn indexer_topk_paged(
        &self,
        pool: PoolId,
        jobs: &[PagedIndexerJob<'_>],
        k: usize,
        topk: TopkImpl,
        _gate_index_k: bool,
    ) -> Result<Vec<Vec<u32>>> {
        // Every CPU load-back has landed already: there is nothing to wait for.
        self.pools.with(pool, |p| {
            paged::check_indexer_jobs(&p.spec, jobs)?;
            let read = IndexerRead {
                dtype: p.spec.dtype,
                k,
                topk,
            };
            let mut results = Vec::with_capacity(jobs.len());
            for job in jobs {
                p.count_stale_reads(Region::Index, job.pages, job.n);
                let rows = p.index_rows(job.pages);
                results.push(self.indexer_job(read, job.query, rows, job.n));
            }
            Ok(results)
        })
    }

    fn sparse_attention_paged(
        &self,
        pool: PoolId,
        jobs: &[PagedAttnJob<'_>],
        path: AttnPath,
    ) -> Result<Vec<AttnOut>> {
        self.pools.with(pool, |p| {
            paged::check_attention_jobs(&p.spec, jobs)?;
            let mut outputs = Vec::with_capacity(jobs.len());
            for job in jobs {
                p.count_stale_reads(Region::Main, job.pages, job.n);
                let keys = p.main_rows(job.pages);
                outputs.push(attend(job.query, keys, job.n, job.selected, path)?);
            }
            Ok(outputs)
        })
    }

    fn read_page(&self, pool: PoolId, page: u32) -> Result<PageContents> {
        self.pools.with(pool, |p| p.read_page(page))
    }

    fn pool_stats(&self, pool: PoolId) -> Result<PoolStats> {
        self.pools.with(pool, |p| Ok(p.stats))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pseudo_random(seed: u64, len: usize) -> Vec<f32> {
        let mut state = seed;
        (0..len)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) - 0.5
            })
            .collect()
    }

    #[test]
    fn up_projection_is_orthogonal() {
        let w = mla_up_projection();
        for i in 0..MAIN_DIM {
            for j in 0..MAIN_DIM {
                let d = dot(
                    &w[i * MAIN_DIM..(i + 1) * MAIN_DIM],
                    &w[j * MAIN_DIM..(j + 1) * MAIN_DIM],
                );
                let expected = if i == j { 1.0 } else { 0.0 };
                assert!((d - expected).abs() < 1e-5, "row {i} . row {j} = {d}");
            }
        }
    }

    #[test]
    fn quantization_round_trips_within_format_precision() {
        let backend = CpuBackend::new();
        let keys = pseudo_random(7, INDEX_DIM * 4);
        for (dtype, tolerance) in [
            (IndexKDtype::Bf16, 1.0 / 128.0),
            (IndexKDtype::Fp8, 1.0 / 8.0),
        ] {
            let mut bytes = vec![0u8; 4 * dtype.bytes_per_token()];
            backend.quantize_index_k(dtype, &keys, &mut bytes).unwrap();
            let mut row = [0.0f32; INDEX_DIM];
            for (t, chunk) in bytes.chunks_exact(dtype.bytes_per_token()).enumerate() {
                layout::dequantize_row(dtype, chunk, &backend.fp8_table, &mut row);
                for (a, b) in row.iter().zip(&keys[t * INDEX_DIM..]) {
                    assert!(
                        (a - b).abs() <= b.abs() * tolerance + 0.5 / 448.0 * 0.5,
                        "{dtype:?}: {a} vs {b}"
                    );
                }
            }
        }
    }

    #[test]
    fn topk_implementations_agree_including_ties() {
        let backend = CpuBackend::new();
        let mut keys = pseudo_random(11, INDEX_DIM * 300);
        // Duplicate rows make exact ties that must resolve to the lower position.
        let duplicate = keys[..INDEX_DIM].to_vec();
        keys[INDEX_DIM * 100..INDEX_DIM * 101].copy_from_slice(&duplicate);
        let query = keys[..INDEX_DIM].to_vec();
        for dtype in [IndexKDtype::Bf16, IndexKDtype::Fp8] {
            let mut bytes = vec![0u8; 300 * dtype.bytes_per_token()];
            backend.quantize_index_k(dtype, &keys, &mut bytes).unwrap();
            let job = [IndexerJob {
                query: &query,
                index_k: &bytes,
                n: 300,
            }];
            let read = |topk| IndexerRead { dtype, k: 32, topk };
            let v1 = backend.indexer_topk(&job, read(TopkImpl::V1)).unwrap();
            let v2 = backend.indexer_topk(&job, read(TopkImpl::V2)).unwrap();
            assert_eq!(v1, v2);
            assert_eq!(v1[0].len(), 32);
            assert_eq!(&v1[0][..2], &[0, 100]);
        }
    }

    #[test]
    fn attention_paths_pick_the_same_row() {
        let backend = CpuBackend::new();
        let keys = pseudo_random(3, MAIN_DIM * 200);
        let selected: Vec<u32> = (0..200).step_by(3).collect();
        for target in [0usize, 51, 198] {
            let query = keys[target * MAIN_DIM..(target + 1) * MAIN_DIM].to_vec();
            let job = [AttnJob {
                query: &query,
                keys: &keys,
                n: 200,
                selected: &selected,
            }];
            let mma = backend.sparse_attention(&job, AttnPath::Mma).unwrap();
            let legacy = backend.sparse_attention(&job, AttnPath::Legacy).unwrap();
            assert_eq!(mma[0].argmax, legacy[0].argmax);
            assert!((mma[0].weight - legacy[0].weight).abs() < 1e-4);
            if target % 3 == 0 {
                assert_eq!(mma[0].argmax as usize, target);
            }
        }
    }
}
