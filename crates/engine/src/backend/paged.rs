//! The paged half of the [`Backend`](super::Backend) contract, its supertraits
//! [`PagedPools`] (lifecycle, writes, HiCache copies) and [`PagedReads`]: KV pools that
//! live with the backend (host memory for the CPU, one device allocation for CUDA),
//! addressed by a [`PoolId`] handle and per-sequence page lists. Only new tokens' keys, per-step
//! queries and page lists cross the boundary; results come back as positions.
//!
//! A pool holds `device_pages` pages of `page_tokens` rows. Each row stores the main
//! key (MAIN_DIM f32) and the quantized index-K row (`dtype.bytes_per_token()` bytes,
//! [`super::layout`]); a page's rows are contiguous in each region, so a reader that
//! walks a page reads one contiguous run of bytes. Its HiCache host tier holds
//! `host_pages` slots (page-locked memory on CUDA) that pages are evicted to and loaded
//! back from.
//!
//! Generation tags make stale reads countable, on every backend the same way: every
//! write of a page gives it a fresh generation, stored next to the page's main KV and
//! next to its index-K (two tags, because a load-back copies the two separately, main
//! first). Eviction carries the tags to the host slot with the data; a load-back copies
//! the data, then its tag. The pool remembers the generation each page should hold;
//! the reading kernels compare each page's tag with it before reading the page and
//! count a mismatch as a stale read ([`PoolStats`]). On CUDA a load-back is an async
//! copy on the copy stream, so an ungated read can run before it lands; on the CPU it
//! lands before `load_back_page` returns, so the CPU pool never reads stale (the CPU
//! race of the served engine is the virtual-time loader in `hicache`, unchanged).

use super::{AttnOut, AttnPath, IndexKDtype, TopkImpl};
use anyhow::{ensure, Result};
use serde::Serialize;

/// Handle of a pool created by [`PagedPools::create_pool`];
/// only meaningful to the backend that made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PoolId(pub u32);

/// Shape of a paged pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSpec {
    pub dtype: IndexKDtype,
    /// Rows per page: a multiple of 4 in 4..=128 (the CUDA indexer stages whole pages
    /// of up to 128 rows in shared memory with 16-byte loads).
    pub page_tokens: usize,
    pub device_pages: usize,
    /// HiCache host-tier slots (at least 1).
    pub host_pages: usize,
}

/// Largest page the paged kernels accept (rows staged per block).
pub const MAX_PAGE_TOKENS: usize = 128;

impl PoolSpec {
    pub fn validate(&self) -> Result<()> {
        ensure!(
            self.page_tokens >= 4
                && self.page_tokens <= MAX_PAGE_TOKENS
                && self.page_tokens % 4 == 0,
            "page_tokens = {} must be a multiple of 4 in 4..={MAX_PAGE_TOKENS}",
            self.page_tokens
        );
        ensure!(
            self.device_pages > 0 && self.host_pages > 0,
            "a pool needs at least one device page and one host slot ({} and {} asked)",
            self.device_pages,
            self.host_pages
        );
        ensure!(
            u32::try_from(self.device_pages.max(self.host_pages)).is_ok(),
            "page counts must fit 32-bit page ids"
        );
        Ok(())
    }

    /// Bytes of one page's main KV (MAIN_DIM f32 per row).
    pub(crate) fn main_page_bytes(&self) -> usize {
        self.page_tokens * super::MAIN_DIM * 4
    }

    /// Bytes of one page's index-K.
    pub(crate) fn index_page_bytes(&self) -> usize {
        self.page_tokens * self.dtype.bytes_per_token()
    }
}

/// New rows `first_row..` of one page, as [`PagedPools::store_rows`] takes them
/// (`write_rows` is the short form for index keys to quantize).
pub struct PageRows<'a> {
    pub page: u32,
    pub first_row: usize,
    /// MAIN_DIM f32 a row, stored as they are.
    pub main_keys: &'a [f32],
    pub index: IndexRows<'a>,
}

/// The index-K of new rows.
#[derive(Clone, Copy)]
pub enum IndexRows<'a> {
    /// INDEX_DIM f32 a row, quantized by the backend in the pool's dtype.
    Keys(&'a [f32]),
    /// Rows quantized elsewhere (prefill's shipped index-K, stale or not): their bytes
    /// are kept exactly.
    Quantized(&'a [u8]),
}

/// New rows of several pages, one per entry of `rows` (page, row in page), as
/// [`PagedPools::append_rows`] takes them: decode's new tokens of a step.
#[derive(Clone, Copy)]
pub struct AppendedRows<'a> {
    pub rows: &'a [(u32, usize)],
    /// MAIN_DIM f32 a row, stored as they are.
    pub main_keys: &'a [f32],
    /// INDEX_DIM f32 a row, quantized by the backend in the pool's dtype.
    pub index_keys: &'a [f32],
}

impl<'a> AppendedRows<'a> {
    /// Each new row as the one-row [`PageRows`] it is (after `check_append`).
    pub(crate) fn one_by_one(&self) -> impl Iterator<Item = PageRows<'a>> + 'a {
        let (main_keys, index_keys) = (self.main_keys, self.index_keys);
        self.rows
            .iter()
            .enumerate()
            .map(move |(i, &(page, first_row))| PageRows {
                page,
                first_row,
                main_keys: &main_keys[i * super::MAIN_DIM..(i + 1) * super::MAIN_DIM],
                index: IndexRows::Keys(
                    &index_keys[i * super::INDEX_DIM..(i + 1) * super::INDEX_DIM],
                ),
            })
    }
}

/// One indexer query over a sequence stored in a pool: row `p` of the sequence is row
/// `p % page_tokens` of page `pages[p / page_tokens]`.
pub struct PagedIndexerJob<'a> {
    /// INDEX_DIM f32.
    pub query: &'a [f32],
    pub pages: &'a [u32],
    pub n: usize,
}

/// One sparse-attention query over a sequence stored in a pool.
pub struct PagedAttnJob<'a> {
    /// MAIN_DIM f32.
    pub query: &'a [f32],
    pub pages: &'a [u32],
    pub n: usize,
    /// Positions chosen by the indexer (no duplicates), each < n.
    pub selected: &'a [u32],
}

/// Counters of one pool (exported on /metrics by whoever owns the pool).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct PoolStats {
    pub evictions: u64,
    pub load_backs: u64,
    /// Page reads that waited on an unfinished load-back of the page.
    pub gated_waits: u64,
    /// Page reads of the indexer whose index-K tag did not match the generation the
    /// page should hold (counted by the reading kernel).
    pub stale_index_k_reads: u64,
    /// The same for main-KV reads of attention (always gated, so 0 unless broken).
    pub stale_main_reads: u64,
}

/// A sequence's rows gathered out of a pool for shipping (prefill -> decode), read by
/// [`PagedReads::gather_sequence`].
#[derive(Debug, Clone, PartialEq)]
pub struct GatheredKv {
    /// n * MAIN_DIM f32.
    pub main: Vec<f32>,
    /// n * bytes_per_token bytes, whatever the pages held when the reader ran.
    pub index_k: Vec<u8>,
    /// Pages whose index-K tag did not match the generation they should hold: read
    /// before their load-back landed (counted by the reader, on CUDA the kernel).
    pub stale_index_pages: usize,
    /// The same for main KV (always gated, so 0 unless broken).
    pub stale_main_pages: usize,
}

/// What a page holds, read back after every copy queued on it has landed (tests).
#[derive(Debug, Clone, PartialEq)]
pub struct PageContents {
    /// page_tokens * MAIN_DIM f32.
    pub main: Vec<f32>,
    /// page_tokens * bytes_per_token bytes.
    pub index_k: Vec<u8>,
    pub main_tag: u32,
    pub index_tag: u32,
    /// The generation the pool expects the page to hold.
    pub expected: u32,
}

/// The pools' lifecycle and everything that changes their pages: row writes and
/// HiCache's evictions and load-backs. With [`PagedReads`], the paged half of
/// [`Backend`](super::Backend).
pub trait PagedPools {
    /// Creates a pool (zeroed pages and host slots, every tag 0).
    fn create_pool(&self, spec: PoolSpec) -> Result<PoolId>;
    /// Frees a pool's memory; its id is invalid afterwards.
    fn release_pool(&self, pool: PoolId) -> Result<()>;
    /// Stores new rows of one page ([`PageRows`]): their main keys (MAIN_DIM f32 each)
    /// as they are, their index keys quantized in the pool's dtype, or their index-K
    /// bytes kept exactly when they come quantized elsewhere (prefill's shipped
    /// index-K, stale or not). Gives the page a fresh generation.
    /// Waits for any load-back still landing on it.
    fn store_rows(&self, pool: PoolId, rows: PageRows<'_>) -> Result<()>;
    /// [`PagedPools::store_rows`] of index keys to quantize.
    fn write_rows(
        &self,
        pool: PoolId,
        page: u32,
        first_row: usize,
        main_keys: &[f32],
        index_keys: &[f32],
    ) -> Result<()> {
        let index = IndexRows::Keys(index_keys);
        self.store_rows(
            pool,
            PageRows {
                page,
                first_row,
                main_keys,
                index,
            },
        )
    }
    /// Appends one row per entry of `rows.rows`, in one call: decode's new tokens of a
    /// step. Keys as in [`PagedPools::write_rows`]. Each page written gets one fresh
    /// generation.
    fn append_rows(&self, pool: PoolId, rows: AppendedRows<'_>) -> Result<()>;
    /// HiCache eviction: page -> host slot (data and tags), after every read queued so
    /// far. The page can be reused at once: later writes of it and load-backs into it
    /// are ordered after the copy (on CUDA the copy is queued, not waited for).
    fn evict_page(&self, pool: PoolId, page: u32, slot: u32) -> Result<()>;
    /// HiCache load-back of several (host slot, page) pairs as one job: every main-KV
    /// page, then every index-K page (the order of the seeds' deployment: the index-K
    /// copy of a request's pages starts once all their main KV has landed). On CUDA it
    /// is queued on the copy stream, one main and one index-K event for the whole job,
    /// and returns before it lands.
    fn load_back_pages(&self, pool: PoolId, pairs: &[(u32, u32)]) -> Result<()>;
    /// HiCache load-back of one page: host slot -> page, main KV first, then index-K.
    fn load_back_page(&self, pool: PoolId, slot: u32, page: u32) -> Result<()> {
        self.load_back_pages(pool, &[(slot, page)])
    }
    /// True when a load-back can still be landing after `load_back_page` returns (CUDA's
    /// copy stream): an ungated read can then race it. The served prefill keeps its
    /// prefix cache in a pool of this backend only then (docs/design.md 4.11); on the
    /// CPU it keeps the virtual-time loader of `hicache`, the deterministic reference.
    fn load_back_is_async(&self) -> bool {
        false
    }
}

/// The reads of the pools: the shipping gather, the indexer and sparse attention over
/// page tables, and the host's look at a page and at the counters.
pub trait PagedReads {
    /// Rows 0..n of the sequence stored in `pages` (row p in page pages[p / page_tokens]),
    /// gathered for shipping: main-KV reads wait for unfinished main-KV load-backs of
    /// those pages, index-K reads only with `gate_index_k`. The reader compares every
    /// page's tags with the generation it should hold and counts mismatches (in the
    /// result and in [`PoolStats`]).
    fn gather_sequence(
        &self,
        pool: PoolId,
        pages: &[u32],
        n: usize,
        gate_index_k: bool,
    ) -> Result<GatheredKv>;
    /// [`Backend::indexer_topk`](super::Backend::indexer_topk) over sequences in a pool.
    /// `gate_index_k`: wait for unfinished index-K load-backs of the pages read
    /// (`SGLANG_DSV4_INDEX_K_HICACHE_SYNC=1`); without it a read may race the copy.
    fn indexer_topk_paged(
        &self,
        pool: PoolId,
        jobs: &[PagedIndexerJob<'_>],
        k: usize,
        topk: TopkImpl,
        gate_index_k: bool,
    ) -> Result<Vec<Vec<u32>>>;
    /// [`Backend::sparse_attention`](super::Backend::sparse_attention) over sequences in
    /// a pool; main-KV reads always wait for unfinished main-KV load-backs.
    fn sparse_attention_paged(
        &self,
        pool: PoolId,
        jobs: &[PagedAttnJob<'_>],
        path: AttnPath,
    ) -> Result<Vec<AttnOut>>;
    /// A page's bytes and tags once every copy queued on it has landed.
    fn read_page(&self, pool: PoolId, page: u32) -> Result<PageContents>;
    fn pool_stats(&self, pool: PoolId) -> Result<PoolStats>;
}

/// Shape checks shared by every backend, before anything is read.
pub(crate) fn check_indexer_jobs(spec: &PoolSpec, jobs: &[PagedIndexerJob<'_>]) -> Result<()> {
    for (j, job) in jobs.iter().enumerate() {
        check_query("paged indexer", j, job.query, super::INDEX_DIM)?;
        check_pages(spec, j, job.pages, job.n)?;
    }
    Ok(())
}

pub(crate) fn check_attention_jobs(spec: &PoolSpec, jobs: &[PagedAttnJob<'_>]) -> Result<()> {
    for (j, job) in jobs.iter().enumerate() {
        check_query("paged attention", j, job.query, super::MAIN_DIM)?;
        check_pages(spec, j, job.pages, job.n)?;
        check_selection("paged attention", j, job.selected, job.n)?;
    }
    Ok(())
}

/// A job's query is one whole vector of `dim` (the slice and the paged checks of every
/// backend say it in these words, `kind` naming the job).
pub(crate) fn check_query(kind: &str, j: usize, query: &[f32], dim: usize) -> Result<()> {
    ensure!(
        query.len() == dim,
        "{kind} job {j}: query has {} f32, not {dim}",
        query.len()
    );
    Ok(())
}

/// An attention job selects at least one row, each among its n.
pub(crate) fn check_selection(kind: &str, j: usize, selected: &[u32], n: usize) -> Result<()> {
    ensure!(!selected.is_empty(), "{kind} job {j}: empty selection");
    if let Some(bad) = selected.iter().find(|&&p| p as usize >= n) {
        anyhow::bail!("{kind} job {j}: selected position {bad} is outside 0..{n}");
    }
    Ok(())
}

fn check_pages(spec: &PoolSpec, job: usize, pages: &[u32], n: usize) -> Result<()> {
    ensure!(
        pages.len() >= n.div_ceil(spec.page_tokens),
        "paged job {job}: {} pages cannot hold n = {n} rows of {} per page",
        pages.len(),
        spec.page_tokens
    );
    if let Some(bad) = pages.iter().find(|&&p| p as usize >= spec.device_pages) {
        anyhow::bail!(
            "paged job {job}: page {bad} is outside the pool's 0..{}",
            spec.device_pages
        );
    }
    Ok(())
}

/// Checks of a `store_rows` call of index keys (`write_rows`): the rows must lie inside
/// one page.
pub(crate) fn check_write(
    spec: &PoolSpec,
    page: u32,
    first_row: usize,
    main_keys: &[f32],
    index_keys: &[f32],
) -> Result<usize> {
    ensure!(
        (page as usize) < spec.device_pages,
        "write to page {page} outside the pool's 0..{}",
        spec.device_pages
    );
    ensure!(
        main_keys.len() % super::MAIN_DIM == 0 && index_keys.len() % super::INDEX_DIM == 0,
        "write_rows: keys are not whole rows"
    );
    let rows = main_keys.len() / super::MAIN_DIM;
    ensure!(
        index_keys.len() / super::INDEX_DIM == rows,
        "write_rows: {rows} main rows but {} index rows",
        index_keys.len() / super::INDEX_DIM
    );
    ensure!(
        first_row + rows <= spec.page_tokens,
        "write_rows: rows {first_row}..{} do not fit a page of {}",
        first_row + rows,
        spec.page_tokens
    );
    Ok(rows)
}

/// Checks of a `store_rows` call of quantized index rows: whole rows inside one page
/// (its errors keep the name the call had before `store_rows` took both kinds).
pub(crate) fn check_write_quantized(
    spec: &PoolSpec,
    page: u32,
    first_row: usize,
    main_keys: &[f32],
    index_rows: &[u8],
) -> Result<usize> {
    let width = spec.dtype.bytes_per_token();
    ensure!(
        index_rows.len() % width == 0,
        "write_quantized_rows: {} index-K bytes are not whole {}-byte rows",
        index_rows.len(),
        width
    );
    let placeholder = vec![0.0f32; index_rows.len() / width * super::INDEX_DIM];
    check_write(spec, page, first_row, main_keys, &placeholder)
}

/// Checks of a `store_rows` call, by the kind of index rows; returns the number of
/// rows.
pub(crate) fn check_store(spec: &PoolSpec, rows: &PageRows<'_>) -> Result<usize> {
    match rows.index {
        IndexRows::Keys(keys) => check_write(spec, rows.page, rows.first_row, rows.main_keys, keys),
        IndexRows::Quantized(bytes) => {
            check_write_quantized(spec, rows.page, rows.first_row, rows.main_keys, bytes)
        }
    }
}

/// Checks of an `append_rows` call.
pub(crate) fn check_append(spec: &PoolSpec, appended: &AppendedRows<'_>) -> Result<()> {
    let (rows, main_keys, index_keys) = (appended.rows, appended.main_keys, appended.index_keys);
    ensure!(
        main_keys.len() == rows.len() * super::MAIN_DIM
            && index_keys.len() == rows.len() * super::INDEX_DIM,
        "append_rows: {} rows but {} main and {} index f32",
        rows.len(),
        main_keys.len(),
        index_keys.len()
    );
    if let Some((page, row)) = rows
        .iter()
        .find(|(page, row)| *page as usize >= spec.device_pages || *row >= spec.page_tokens)
    {
        anyhow::bail!(
            "append_rows: row {row} of page {page} is outside the pool ({} pages of {} rows)",
            spec.device_pages,
            spec.page_tokens
        );
    }
    Ok(())
}

/// Checks of a `gather_sequence` call.
pub(crate) fn check_gather(spec: &PoolSpec, pages: &[u32], n: usize) -> Result<()> {
    ensure!(n > 0, "gather_sequence: no rows asked");
    check_pages(spec, 0, pages, n)
}

/// Range checks of evict / load-back.
pub(crate) fn check_slot(spec: &PoolSpec, page: u32, slot: u32) -> Result<()> {
    ensure!(
        (page as usize) < spec.device_pages,
        "page {page} outside the pool's 0..{}",
        spec.device_pages
    );
    ensure!(
        (slot as usize) < spec.host_pages,
        "host slot {slot} outside the pool's 0..{}",
        spec.host_pages
    );
    Ok(())
}
