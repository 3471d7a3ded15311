//! Compute backends of the embedded engine: index-K quantize+store, indexer scores +
//! top-k, and sparse attention over the main KV. CPU is the default and the reference;
//! CUDA (cudarc, kernels in top-level `kernels/*.cu`, compiled with NVRTC at start) is
//! used with `--device cuda` or when `--device auto` finds a GPU.
//!
//! All inputs are gathered, contiguous host buffers so both backends see identical
//! bytes; results must be bit-identical between backends for the selected positions
//! (scores may differ in the last ulp, ties are broken by the lower position).

pub mod cpu;
pub mod cuda;

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
}

pub trait Backend: Send + Sync {
    fn name(&self) -> &'static str;
    /// Quantize `keys` (n * INDEX_DIM f32) into `out` (n * bytes_per_token) in `dtype`.
    fn quantize_index_k(&self, dtype: IndexKDtype, keys: &[f32], out: &mut [u8]) -> anyhow::Result<()>;
    /// Per job: dequantized dot-product scores, then the top `k` positions
    /// (score descending, ties by lower position). Returns min(k, n) positions per job.
    fn indexer_topk(
        &self,
        dtype: IndexKDtype,
        jobs: &[IndexerJob<'_>],
        k: usize,
        topk: TopkImpl,
    ) -> anyhow::Result<Vec<Vec<u32>>>;
    /// Per job: softmax(q.K_sel / sqrt(MAIN_DIM)) over the selected rows; returns the argmax.
    fn sparse_attention(&self, jobs: &[AttnJob<'_>], path: AttnPath) -> anyhow::Result<Vec<AttnOut>>;
}
