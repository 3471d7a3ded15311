//! The CPU backend's paged pools ([`super::paged`]) over host memory: each pool's
//! pages, host slots and generation tags, the writes, evictions and load-backs on them,
//! and [`Rows`], the page-table view the CPU's reads go through. The arithmetic of the
//! reads is the backend's (`cpu.rs`); this module only stores and addresses rows.
//!
//! A load-back here is a plain copy that has landed when it returns, so tags always
//! match and stale reads stay 0: the CPU's served race is the virtual-time loader
//! (`hicache`), which this does not replace.

use super::paged::{self, GatheredKv, IndexRows, PageContents, PageRows, PoolId, PoolSpec};
use super::{layout, PoolStats, INDEX_DIM, MAIN_DIM};
use anyhow::{anyhow, Result};
use parking_lot::Mutex;

/// Rows of one sequence as the CPU reads them: row `p` is row `p % page_rows` of page
/// `pages[p / page_rows]` of `data`, `width` elements a row. A pool's sequence is read
/// through its page table; a caller's gathered buffer is one page holding all its rows
/// ([`Rows::gathered`]): the slice-over-paged adapter, so that the slice methods read
/// through the very code of the paged ones.
#[derive(Clone, Copy)]
pub(super) struct Rows<'a, T> {
    data: &'a [T],
    width: usize,
    page_rows: usize,
    pages: &'a [u32],
}

impl<'a, T> Rows<'a, T> {
    /// `n` rows of `width` stored back to back in `data`, as one page.
    pub(super) fn gathered(data: &'a [T], width: usize, n: usize) -> Self {
        Rows {
            data,
            width,
            page_rows: n.max(1),
            pages: &[0],
        }
    }

    pub(super) fn row(&self, position: usize) -> &'a [T] {
        let page = self.pages[position / self.page_rows] as usize;
        let start = (page * self.page_rows + position % self.page_rows) * self.width;
        &self.data[start..start + self.width]
    }

    /// Rows 0..n in order, page after page (what a scan of every row walks: no
    /// division per row).
    pub(super) fn first(&self, n: usize) -> impl Iterator<Item = &'a [T]> + '_ {
        self.pages
            .iter()
            .flat_map(move |&page| {
                let start = page as usize * self.page_rows * self.width;
                self.data[start..start + self.page_rows * self.width].chunks_exact(self.width)
            })
            .take(n)
    }
}

/// Which of a page's two regions (and tags) a read touches.
#[derive(Clone, Copy)]
pub(super) enum Region {
    Main,
    Index,
}

pub(super) struct HostPool {
    pub(super) spec: PoolSpec,
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
    pub(super) stats: PoolStats,
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

    /// Stores new rows of one page, after the contract's checks: the main keys as they
    /// are, the index-K quantized in the pool's dtype (or copied when it comes
    /// quantized), then a fresh generation on both tags.
    pub(super) fn store(&mut self, rows: &PageRows<'_>) -> Result<()> {
        let count = paged::check_store(&self.spec, rows)?;
        let dtype = self.spec.dtype;
        let width = dtype.bytes_per_token();
        let base = rows.page as usize * self.spec.page_tokens + rows.first_row;
        self.main[base * MAIN_DIM..(base + count) * MAIN_DIM].copy_from_slice(rows.main_keys);
        let index_k = &mut self.index_k[base * width..(base + count) * width];
        match rows.index {
            IndexRows::Keys(keys) => {
                for (key, out) in keys
                    .chunks_exact(INDEX_DIM)
                    .zip(index_k.chunks_exact_mut(width))
                {
                    layout::quantize_row(dtype, key, out);
                }
            }
            IndexRows::Quantized(bytes) => index_k.copy_from_slice(bytes),
        }
        let generation = self.next_generation;
        self.next_generation = self.next_generation.wrapping_add(1).max(1);
        let page = rows.page as usize;
        self.main_tag[page] = generation;
        self.index_tag[page] = generation;
        self.expected[page] = generation;
        Ok(())
    }

    pub(super) fn evict(&mut self, page: u32, slot: u32) -> Result<()> {
        paged::check_slot(&self.spec, page, slot)?;
        let (main_page, index_page) = (
            self.spec.page_tokens * MAIN_DIM,
            self.spec.index_page_bytes(),
        );
        let (page, slot) = (page as usize, slot as usize);
        self.slot_main[slot * main_page..(slot + 1) * main_page]
            .copy_from_slice(&self.main[page * main_page..(page + 1) * main_page]);
        self.slot_index_k[slot * index_page..(slot + 1) * index_page]
            .copy_from_slice(&self.index_k[page * index_page..(page + 1) * index_page]);
        self.slot_main_tag[slot] = self.main_tag[page];
        self.slot_index_tag[slot] = self.index_tag[page];
        self.stats.evictions += 1;
        Ok(())
    }

    pub(super) fn load_back(&mut self, slot: u32, page: u32) -> Result<()> {
        paged::check_slot(&self.spec, page, slot)?;
        let (main_page, index_page) = (
            self.spec.page_tokens * MAIN_DIM,
            self.spec.index_page_bytes(),
        );
        let (page, slot) = (page as usize, slot as usize);
        self.main[page * main_page..(page + 1) * main_page]
            .copy_from_slice(&self.slot_main[slot * main_page..(slot + 1) * main_page]);
        self.index_k[page * index_page..(page + 1) * index_page]
            .copy_from_slice(&self.slot_index_k[slot * index_page..(slot + 1) * index_page]);
        self.main_tag[page] = self.slot_main_tag[slot];
        self.index_tag[page] = self.slot_index_tag[slot];
        self.expected[page] = self.slot_index_tag[slot];
        self.stats.load_backs += 1;
        Ok(())
    }

    /// Main keys of the sequence in `pages`.
    pub(super) fn main_rows<'a>(&'a self, pages: &'a [u32]) -> Rows<'a, f32> {
        Rows {
            data: &self.main,
            width: MAIN_DIM,
            page_rows: self.spec.page_tokens,
            pages,
        }
    }

    /// Quantized index-K rows of the sequence in `pages`.
    pub(super) fn index_rows<'a>(&'a self, pages: &'a [u32]) -> Rows<'a, u8> {
        Rows {
            data: &self.index_k,
            width: self.spec.dtype.bytes_per_token(),
            page_rows: self.spec.page_tokens,
            pages,
        }
    }

    /// Whether `page`'s tag in `region` differs from the generation it should hold.
    fn is_stale(&self, region: Region, page: u32) -> bool {
        let tags = match region {
            Region::Main => &self.main_tag,
            Region::Index => &self.index_tag,
        };
        tags[page as usize] != self.expected[page as usize]
    }

    /// Counts, in the pool's stats, the stale pages among those holding rows 0..n of
    /// `pages` that a read of `region` is about to read.
    pub(super) fn count_stale_reads(&mut self, region: Region, pages: &[u32], n: usize) {
        let stale = pages[..n.div_ceil(self.spec.page_tokens)]
            .iter()
            .filter(|&&page| self.is_stale(region, page))
            .count() as u64;
        match region {
            Region::Main => self.stats.stale_main_reads += stale,
            Region::Index => self.stats.stale_index_k_reads += stale,
        }
    }

    pub(super) fn gather(&mut self, pages: &[u32], n: usize) -> Result<GatheredKv> {
        paged::check_gather(&self.spec, pages, n)?;
        let page_tokens = self.spec.page_tokens;
        let width = self.spec.dtype.bytes_per_token();
        let mut kv = GatheredKv {
            main: Vec::with_capacity(n * MAIN_DIM),
            index_k: Vec::with_capacity(n * width),
            stale_index_pages: 0,
            stale_main_pages: 0,
        };
        for (index, &page) in pages[..n.div_ceil(page_tokens)].iter().enumerate() {
            let rows = page_tokens.min(n - index * page_tokens);
            kv.stale_index_pages += usize::from(self.is_stale(Region::Index, page));
            kv.stale_main_pages += usize::from(self.is_stale(Region::Main, page));
            let base = page as usize * page_tokens;
            kv.main
                .extend_from_slice(&self.main[base * MAIN_DIM..(base + rows) * MAIN_DIM]);
            kv.index_k
                .extend_from_slice(&self.index_k[base * width..(base + rows) * width]);
        }
        self.stats.stale_index_k_reads += kv.stale_index_pages as u64;
        self.stats.stale_main_reads += kv.stale_main_pages as u64;
        Ok(kv)
    }

    pub(super) fn read_page(&self, page: u32) -> Result<PageContents> {
        paged::check_slot(&self.spec, page, 0)?;
        let (main_page, index_page) = (
            self.spec.page_tokens * MAIN_DIM,
            self.spec.index_page_bytes(),
        );
        let page = page as usize;
        Ok(PageContents {
            main: self.main[page * main_page..(page + 1) * main_page].to_vec(),
            index_k: self.index_k[page * index_page..(page + 1) * index_page].to_vec(),
            main_tag: self.main_tag[page],
            index_tag: self.index_tag[page],
            expected: self.expected[page],
        })
    }
}

/// Every pool of one CPU backend, indexed by [`PoolId`]; `None` once released.
#[derive(Default)]
pub(super) struct CpuPools {
    pools: Mutex<Vec<Option<HostPool>>>,
}

impl CpuPools {
    /// Runs `f` on one pool, under the lock of all (a call is one step of one pool).
    pub(super) fn with<T>(
        &self,
        pool: PoolId,
        f: impl FnOnce(&mut HostPool) -> Result<T>,
    ) -> Result<T> {
        let mut pools = self.pools.lock();
        let found = pools
            .get_mut(pool.0 as usize)
            .and_then(Option::as_mut)
            .ok_or_else(|| anyhow!("unknown or released pool {:?}", pool))?;
        f(found)
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
}
