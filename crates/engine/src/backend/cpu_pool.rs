//! The CPU backend's paged pools ([`super::paged`]) over host memory: the reference
//! the CUDA pools are checked against. Page-table reads use the very arithmetic of the
//! slice methods (`cpu::attend`, `cpu::select_top`), so a sequence read through its
//! pages gives the same positions as the same rows gathered into one buffer.
//!
//! A load-back here is a plain copy that has landed when `load_back_page` returns, so
//! tags always match and stale reads stay 0: the CPU's served race is the virtual-time
//! loader (`hicache`), which this does not replace.

use super::cpu::{attend, dot, sanitize, select_top};
use super::paged::{
    self, GatheredKv, PageContents, PagedAttnJob, PagedIndexerJob, PoolId, PoolSpec, PoolStats,
};
use super::{layout, AttnOut, AttnPath, IndexKDtype, TopkImpl, INDEX_DIM, MAIN_DIM};
use anyhow::{anyhow, Result};
use parking_lot::Mutex;

struct HostPool {
    spec: PoolSpec,
    main: Vec<f32>,
    index_k: Vec<u8>,
    main_tag: Vec<u32>,
    index_tag: Vec<u32>,
    /// Generation each page should hold.
    expected: Vec<u32>,
    slot_main: Vec<f32>,
    slot_index_k: Vec<u8>,
    slot_main_tag: Vec<u32>,
    slot_index_tag: Vec<u32>,
    next_generation: u32,
    stats: PoolStats,
}

impl HostPool {
    fn new(spec: PoolSpec) -> Self {
        let main_page = spec.page_tokens * MAIN_DIM;
        let index_page = spec.index_page_bytes();
        HostPool {
            spec,
            main: vec![0.0; spec.device_pages * main_page],
            index_k: vec![0; spec.device_pages * index_page],
            main_tag: vec![0; spec.device_pages],
            index_tag: vec![0; spec.device_pages],
            expected: vec![0; spec.device_pages],
            slot_main: vec![0.0; spec.host_pages * main_page],
            slot_index_k: vec![0; spec.host_pages * index_page],
            slot_main_tag: vec![0; spec.host_pages],
            slot_index_tag: vec![0; spec.host_pages],
            next_generation: 1,
            stats: PoolStats::default(),
        }
    }

    /// Stores checked rows `first_row..` of `page`: the main keys as they are, the
    /// index-K bytes of those rows filled by `fill_index` (given the pool's dtype), then
    /// a fresh generation on both tags: the one write path of `write_rows` and
    /// `write_quantized_rows`.
    fn store_rows(
        &mut self,
        page: u32,
        first_row: usize,
        main_keys: &[f32],
        fill_index: impl FnOnce(IndexKDtype, &mut [u8]),
    ) {
        let rows = main_keys.len() / MAIN_DIM;
        let width = self.spec.dtype.bytes_per_token();
        let base = page as usize * self.spec.page_tokens + first_row;
        self.main[base * MAIN_DIM..(base + rows) * MAIN_DIM].copy_from_slice(main_keys);
        fill_index(
            self.spec.dtype,
            &mut self.index_k[base * width..(base + rows) * width],
        );
        let generation = self.next_generation;
        self.next_generation = self.next_generation.wrapping_add(1).max(1);
        self.main_tag[page as usize] = generation;
        self.index_tag[page as usize] = generation;
        self.expected[page as usize] = generation;
    }

    fn main_row(&self, page: u32, row: usize) -> &[f32] {
        let start = (page as usize * self.spec.page_tokens + row) * MAIN_DIM;
        &self.main[start..start + MAIN_DIM]
    }

    fn index_row(&self, page: u32, row: usize) -> &[u8] {
        let width = self.spec.dtype.bytes_per_token();
        let start = (page as usize * self.spec.page_tokens + row) * width;
        &self.index_k[start..start + width]
    }
}

#[derive(Default)]
pub(super) struct CpuPools {
    pools: Mutex<Vec<Option<HostPool>>>,
}

impl CpuPools {
    fn with<T>(&self, pool: PoolId, f: impl FnOnce(&mut HostPool) -> Result<T>) -> Result<T> {
        let mut pools = self.pools.lock();
        let found = pools
            .get_mut(pool.0 as usize)
            .and_then(Option::as_mut)
            .ok_or_else(|| anyhow!("unknown or released pool {:?}", pool))?;
        f(found)
    }

    pub(super) fn with_spec<T>(
        &self,
        pool: PoolId,
        f: impl FnOnce(&PoolSpec) -> Result<T>,
    ) -> Result<T> {
        self.with(pool, |p| f(&p.spec))
    }

    pub(super) fn create(&self, spec: PoolSpec) -> Result<PoolId> {
        spec.validate()?;
        let mut pools = self.pools.lock();
        pools.push(Some(HostPool::new(spec)));
        Ok(PoolId((pools.len() - 1) as u32))
    }

    pub(super) fn release(&self, pool: PoolId) -> Result<()> {
        let mut pools = self.pools.lock();
        let slot = pools
            .get_mut(pool.0 as usize)
            .filter(|slot| slot.is_some())
            .ok_or_else(|| anyhow!("unknown or released pool {:?}", pool))?;
        *slot = None;
        Ok(())
    }

    pub(super) fn write_rows(
        &self,
        pool: PoolId,
        page: u32,
        first_row: usize,
        main_keys: &[f32],
        index_keys: &[f32],
    ) -> Result<()> {
        self.with(pool, |p| {
            paged::check_write(&p.spec, page, first_row, main_keys, index_keys)?;
            p.store_rows(page, first_row, main_keys, |dtype, index_k| {
                let width = dtype.bytes_per_token();
                for (key, out) in index_keys
                    .chunks_exact(INDEX_DIM)
                    .zip(index_k.chunks_exact_mut(width))
                {
                    layout::quantize_row(dtype, key, out);
                }
            });
            Ok(())
        })
    }

    pub(super) fn write_quantized_rows(
        &self,
        pool: PoolId,
        page: u32,
        first_row: usize,
        main_keys: &[f32],
        index_rows: &[u8],
    ) -> Result<()> {
        self.with(pool, |p| {
            paged::check_write_quantized(&p.spec, page, first_row, main_keys, index_rows)?;
            p.store_rows(page, first_row, main_keys, |_, index_k| {
                index_k.copy_from_slice(index_rows)
            });
            Ok(())
        })
    }

    pub(super) fn evict(&self, pool: PoolId, page: u32, slot: u32) -> Result<()> {
        self.with(pool, |p| {
            paged::check_slot(&p.spec, page, slot)?;
            let (main_page, index_page) =
                (p.spec.page_tokens * MAIN_DIM, p.spec.index_page_bytes());
            let (page, slot) = (page as usize, slot as usize);
            p.slot_main[slot * main_page..(slot + 1) * main_page]
                .copy_from_slice(&p.main[page * main_page..(page + 1) * main_page]);
            p.slot_index_k[slot * index_page..(slot + 1) * index_page]
                .copy_from_slice(&p.index_k[page * index_page..(page + 1) * index_page]);
            p.slot_main_tag[slot] = p.main_tag[page];
            p.slot_index_tag[slot] = p.index_tag[page];
            p.stats.evictions += 1;
            Ok(())
        })
    }

    pub(super) fn load_back(&self, pool: PoolId, slot: u32, page: u32) -> Result<()> {
        self.with(pool, |p| {
            paged::check_slot(&p.spec, page, slot)?;
            let (main_page, index_page) =
                (p.spec.page_tokens * MAIN_DIM, p.spec.index_page_bytes());
            let (page, slot) = (page as usize, slot as usize);
            p.main[page * main_page..(page + 1) * main_page]
                .copy_from_slice(&p.slot_main[slot * main_page..(slot + 1) * main_page]);
            p.index_k[page * index_page..(page + 1) * index_page]
                .copy_from_slice(&p.slot_index_k[slot * index_page..(slot + 1) * index_page]);
            p.main_tag[page] = p.slot_main_tag[slot];
            p.index_tag[page] = p.slot_index_tag[slot];
            p.expected[page] = p.slot_index_tag[slot];
            p.stats.load_backs += 1;
            Ok(())
        })
    }

    pub(super) fn indexer_topk(
        &self,
        fp8_table: &[f32; 256],
        pool: PoolId,
        jobs: &[PagedIndexerJob<'_>],
        k: usize,
        topk: TopkImpl,
    ) -> Result<Vec<Vec<u32>>> {
        self.with(pool, |p| {
            paged::check_indexer_jobs(&p.spec, jobs)?;
            let page_tokens = p.spec.page_tokens;
            let mut row = [0.0f32; INDEX_DIM];
            let mut results = Vec::with_capacity(jobs.len());
            for job in jobs {
                for &page in &job.pages[..job.n.div_ceil(page_tokens)] {
                    if p.index_tag[page as usize] != p.expected[page as usize] {
                        p.stats.stale_index_k_reads += 1;
                    }
                }
                let scored: Vec<(f32, u32)> = (0..job.n)
                    .map(|position| {
                        let bytes =
                            p.index_row(job.pages[position / page_tokens], position % page_tokens);
                        layout::dequantize_row(p.spec.dtype, bytes, fp8_table, &mut row);
                        (sanitize(dot(job.query, &row)), position as u32)
                    })
                    .collect();
                results.push(select_top(scored, k, topk));
            }
            Ok(results)
        })
    }

    pub(super) fn sparse_attention(
        &self,
        pool: PoolId,
        jobs: &[PagedAttnJob<'_>],
        path: AttnPath,
    ) -> Result<Vec<AttnOut>> {
        self.with(pool, |p| {
            paged::check_attention_jobs(&p.spec, jobs)?;
            let page_tokens = p.spec.page_tokens;
            let mut outputs = Vec::with_capacity(jobs.len());
            for job in jobs {
                for &page in &job.pages[..job.n.div_ceil(page_tokens)] {
                    if p.main_tag[page as usize] != p.expected[page as usize] {
                        p.stats.stale_main_reads += 1;
                    }
                }
                let pool: &HostPool = p;
                let key = |position: usize| {
                    pool.main_row(job.pages[position / page_tokens], position % page_tokens)
                };
                outputs.push(attend(job.query, job.n, job.selected, &key, path)?);
            }
            Ok(outputs)
        })
    }

    pub(super) fn gather(&self, pool: PoolId, pages: &[u32], n: usize) -> Result<GatheredKv> {
        self.with(pool, |p| {
            paged::check_gather(&p.spec, pages, n)?;
            let page_tokens = p.spec.page_tokens;
            let width = p.spec.dtype.bytes_per_token();
            let mut kv = GatheredKv {
                main: Vec::with_capacity(n * MAIN_DIM),
                index_k: Vec::with_capacity(n * width),
                stale_index_pages: 0,
                stale_main_pages: 0,
            };
            for (index, &page) in pages[..n.div_ceil(page_tokens)].iter().enumerate() {
                let rows = page_tokens.min(n - index * page_tokens);
                let page = page as usize;
                if p.index_tag[page] != p.expected[page] {
                    kv.stale_index_pages += 1;
                }
                if p.main_tag[page] != p.expected[page] {
                    kv.stale_main_pages += 1;
                }
                let base = page * page_tokens;
                kv.main
                    .extend_from_slice(&p.main[base * MAIN_DIM..(base + rows) * MAIN_DIM]);
                kv.index_k
                    .extend_from_slice(&p.index_k[base * width..(base + rows) * width]);
            }
            p.stats.stale_index_k_reads += kv.stale_index_pages as u64;
            p.stats.stale_main_reads += kv.stale_main_pages as u64;
            Ok(kv)
        })
    }

    pub(super) fn read_page(&self, pool: PoolId, page: u32) -> Result<PageContents> {
        self.with(pool, |p| {
            paged::check_slot(&p.spec, page, 0)?;
            let (main_page, index_page) =
                (p.spec.page_tokens * MAIN_DIM, p.spec.index_page_bytes());
            let page = page as usize;
            Ok(PageContents {
                main: p.main[page * main_page..(page + 1) * main_page].to_vec(),
                index_k: p.index_k[page * index_page..(page + 1) * index_page].to_vec(),
                main_tag: p.main_tag[page],
                index_tag: p.index_tag[page],
                expected: p.expected[page],
            })
        })
    }

    pub(super) fn stats(&self, pool: PoolId) -> Result<PoolStats> {
        self.with(pool, |p| Ok(p.stats))
    }
}
