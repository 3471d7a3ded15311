//! Compute backends of the embedded engine: index-K quantize+store, indexer scores +
//! top-k, and sparse attention over the main KV. CPU is the default and the reference;
//! CUDA (cudarc, kernels in top-level `kernels/*.cu`, compiled with NVRTC at start) is
//! used with `--device cuda` or when `--device auto` finds a GPU.
//!
//! Two halves of one contract: [`Backend`] holds the slice methods, its supertraits
//! [`PagedPools`] and [`PagedReads`] ([`paged`]) the paged ones. The paged methods take
//! pool handles and page lists: the KV lives with the backend (one device allocation per
//! pool on CUDA), and only new tokens' keys, queries, page lists and results cross. The
//! slice methods take gathered, contiguous host buffers.
//!
//! Which half the served roles use: on CUDA, prefill keeps its pages in a pool (rows
//! written there, evictions and load-backs on the copy stream, the shipping gather) and
//! decode reads its requests through the paged indexer and attention (the shipped
//! prompt stored at admission, each new token appended); only a decode request that got
//! no pages reads host slices. On the CPU both roles use the slice methods: prefill
//! quantizes index-K with `quantize_index_k` into its virtual-time host store, decode
//! reads host slices; the CPU's pools serve the tests, which check the paged
//! bookkeeping against them. On the CPU both halves are one implementation (a gathered
//! buffer is read as one page, `cpu_pool::Rows`); on CUDA they are two kernel families
//! sharing their launch helpers. Results must be bit-identical between backends for the
//! selected positions (ties are broken by the lower position), and between the slice
//! and paged methods.

pub mod cpu;
mod cpu_pool;
pub mod cuda;
pub(crate) mod paged;
#[cfg(test)]
pub(crate) mod paged_tests;

pub use paged::{
    AppendedRows, GatheredKv, IndexRows, PageContents, PageRows, PagedAttnJob, PagedIndexerJob,
    PagedPools, PagedReads, PoolId, PoolSpec, PoolStats, MAX_PAGE_TOKENS,
};

use anyhow::Result;
use serde::Serialize;

/// Dimensions of the miniature model.
pub const INDEX_DIM: usize = 128;
pub const MAIN_DIM: usize = 64;

/// Storage format of index-K (`SGLANG_DSV4_BF16_INDEX_K`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum IndexKDtype {
    /// 128 x bf16 = 256 B/token.
    Bf16,
    /// 128 x fp8 e4m3 + one f32 scale = 132 B/token.
    Fp8,
}

impl IndexKDtype {
    pub fn bytes_per_token(self) -> usize {
        match self {
            IndexKDtype::Bf16 => INDEX_DIM * 2,
            IndexKDtype::Fp8 => INDEX_DIM + 4,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            IndexKDtype::Bf16 => "bf16",
            IndexKDtype::Fp8 => "fp8_e4m3",
        }
    }
}

/// Which top-k implementation (`SGLANG_OPT_USE_TOPK_V2`): same results, different speed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopkImpl {
    /// Full sort of all scores.
    V1,
    /// Partial selection (select_nth / heap).
    V2,
}

/// What one indexer call reads and keeps: index-K stored in `dtype`, then per job the
/// `k` best-scored positions, found with `topk`. One value for the whole call because
/// the kernels take one storage format and one selection for a whole batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexerRead {
    pub dtype: IndexKDtype,
    pub k: usize,
    pub topk: TopkImpl,
}

/// Which attention path (`SGLANG_SM120_MMA_FLASHMLA`): same results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttnPath {
    /// Fast path: only the top-k selected rows.
    Mma,
    /// Legacy path: dense scores over every row, then masked to the selection (>= 5x slower).
    Legacy,
}

/// One indexer query against one sequence's gathered index-K.
pub struct IndexerJob<'a> {
    /// INDEX_DIM f32.
    pub query: &'a [f32],
    /// n * dtype.bytes_per_token() bytes, position-major.
    pub index_k: &'a [u8],
    pub n: usize,
}

/// One sparse-attention query against one sequence's gathered main keys.
pub struct AttnJob<'a> {
    /// MAIN_DIM f32.
    pub query: &'a [f32],
    /// n * MAIN_DIM f32, position-major.
    pub keys: &'a [f32],
    pub n: usize,
    /// Positions chosen by the indexer (ascending or not; duplicates not allowed).
    pub selected: &'a [u32],
}

#[derive(Debug, Clone, PartialEq)]
pub struct AttnOut {
    /// Position with the highest attention weight (ties: lower position).
    pub argmax: u32,
    /// Its softmax weight over the selection.
    pub weight: f32,
    /// The best-weighted positions of the selection with their softmax weights, highest
    /// first (at most [`CANDIDATES`]): what the served log-probabilities are made of.
    /// Empty where the backend reports the argmax only (the CUDA kernels).
    pub candidates: Vec<(u32, f32)>,
}

/// How many of a selection's positions [`AttnOut::candidates`] keeps.
pub(crate) const CANDIDATES: usize = 8;

/// The whole contract of a backend: the slice methods here, the paged ones in its
/// supertraits ([`PagedPools`], [`PagedReads`]), each implemented where its code lives.
pub trait Backend: PagedPools + PagedReads + Send + Sync {
    fn name(&self) -> &'static str;
    /// Quantize `keys` (n * INDEX_DIM f32) into `out` (n * bytes_per_token) in `dtype`.
    fn quantize_index_k(&self, dtype: IndexKDtype, keys: &[f32], out: &mut [u8]) -> Result<()>;
    /// Per job: dequantized dot-product scores, then the top `read.k` positions
    /// (score descending, ties by lower position). Returns min(k, n) positions per job.
    fn indexer_topk(&self, jobs: &[IndexerJob<'_>], read: IndexerRead) -> Result<Vec<Vec<u32>>>;
    /// Per job: softmax(q.K_sel / sqrt(MAIN_DIM)) over the selected rows; returns the argmax.
    fn sparse_attention(&self, jobs: &[AttnJob<'_>], path: AttnPath) -> Result<Vec<AttnOut>>;
    /// Occupies the compute stream for `ns` nanoseconds of device time without waiting
    /// for it: the modelled duration of a prefill forward, queued between a step's writes
    /// and its gathers (kernels/hicache_copy.cu, `model_forward_delay`). The CPU models
    /// step time on the host instead (`EngineTuning::prefill_step_floor_us`) and ignores
    /// this.
    fn model_forward_delay(&self, _ns: u64) -> Result<()> {
        Ok(())
    }
}

/// Byte layout of one quantized index-K row, shared by every backend so that pages
/// written by one can be read by another:
/// * bf16: INDEX_DIM little-endian bf16 values;
/// * fp8: INDEX_DIM e4m3 bytes, then the f32 scale (amax / 448) little-endian.
pub(crate) mod layout {
    use super::{IndexKDtype, INDEX_DIM};

    /// Largest finite e4m3 magnitude: the per-token scale maps amax onto it.
    pub(crate) const FP8_E4M3_MAX: f32 = 448.0;

    /// Quantize one row of INDEX_DIM f32 into `out` (dtype.bytes_per_token() bytes).
    pub(crate) fn quantize_row(dtype: IndexKDtype, key: &[f32], out: &mut [u8]) {
        debug_assert_eq!(key.len(), INDEX_DIM);
        match dtype {
            IndexKDtype::Bf16 => {
                for (value, dst) in key.iter().zip(out.chunks_exact_mut(2)) {
                    dst.copy_from_slice(&half::bf16::from_f32(*value).to_bits().to_le_bytes());
                }
            }
            IndexKDtype::Fp8 => {
                let amax = key.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let scale = if amax > 0.0 { amax / FP8_E4M3_MAX } else { 1.0 };
                for (value, dst) in key.iter().zip(out[..INDEX_DIM].iter_mut()) {
                    *dst = float8::F8E4M3::from_f32(value / scale).to_bits();
                }
                out[INDEX_DIM..INDEX_DIM + 4].copy_from_slice(&scale.to_le_bytes());
            }
        }
    }

    /// Dequantize one row into `out` (INDEX_DIM f32), using `fp8_table` for e4m3.
    pub(crate) fn dequantize_row(
        dtype: IndexKDtype,
        row: &[u8],
        fp8_table: &[f32; 256],
        out: &mut [f32],
    ) {
        match dtype {
            IndexKDtype::Bf16 => {
                for (dst, src) in out.iter_mut().zip(row.chunks_exact(2)) {
                    *dst = f32::from_bits((u16::from_le_bytes([src[0], src[1]]) as u32) << 16);
                }
            }
            IndexKDtype::Fp8 => {
                let scale = f32::from_le_bytes([
                    row[INDEX_DIM],
                    row[INDEX_DIM + 1],
                    row[INDEX_DIM + 2],
                    row[INDEX_DIM + 3],
                ]);
                for (dst, byte) in out.iter_mut().zip(row[..INDEX_DIM].iter()) {
                    *dst = fp8_table[*byte as usize] * scale;
                }
            }
        }
    }

    /// Every e4m3 bit pattern decoded once (NaN patterns decode to 0 so stale garbage
    /// cannot poison a whole score row).
    pub(crate) fn fp8_table() -> [f32; 256] {
        let mut table = [0.0f32; 256];
        for (bits, slot) in table.iter_mut().enumerate() {
            let value = float8::F8E4M3::from_bits(bits as u8).to_f32();
            *slot = if value.is_finite() { value } else { 0.0 };
        }
        table
    }
}

/// The MLA up-projection W (MAIN_DIM x MAIN_DIM, row-major, orthogonal) that turns a
/// stored latent main key into the attention key. The Mma path absorbs it into the
/// query once (`q' = W^T (W q)`); the Legacy path projects every stored row (`W k_j`)
/// before the dot product, which is the genuine extra work of the non-absorbed path.
/// Both give the same scores up to float rounding.
pub(crate) fn mla_up_projection() -> &'static [f32] {
    static MATRIX: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    MATRIX.get_or_init(|| {
        // Gram-Schmidt over deterministic pseudo-random rows.
        let mut state = 0x5eed_u64;
        let mut rows: Vec<Vec<f64>> = Vec::with_capacity(MAIN_DIM);
        for _ in 0..MAIN_DIM {
            let mut row: Vec<f64> = (0..MAIN_DIM)
                .map(|_| {
                    state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
                    let mut z = state;
                    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
                    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
                    z ^= z >> 31;
                    (z >> 11) as f64 / (1u64 << 53) as f64 - 0.5
                })
                .collect();
            for previous in &rows {
                let dot: f64 = row.iter().zip(previous).map(|(a, b)| a * b).sum();
                row.iter_mut()
                    .zip(previous)
                    .for_each(|(a, b)| *a -= dot * b);
            }
            let norm = row.iter().map(|a| a * a).sum::<f64>().sqrt();
            row.iter_mut().for_each(|a| *a /= norm);
            rows.push(row);
        }
        rows.into_iter().flatten().map(|v| v as f32).collect()
    })
}
