//! The CUDA backend's paged pools ([`super::super::paged`]): device-resident KV read
//! through page tables, and HiCache on the GPU.
//!
//! Memory: one device allocation per pool (`kv`): the main-KV region, the index-K
//! region and the two generation-tag arrays, each 256-byte aligned; a page's rows are
//! contiguous in each region. The host tier is one page-locked allocation of slots
//! (main page, index page, main tag, index tag), so evictions and load-backs are real
//! DMA. Per call only the queries, the page tables (4 bytes per page of 64 rows, plus
//! the expected generation of each) and the results cross PCIe; they are staged in
//! page-locked memory (`CudaBackend::upload_pinned`), so the host never blocks on a
//! pageable upload.
//!
//! HiCache: eviction copies a page to its host slot on the copy stream after the work
//! queued on the compute stream and returns at once; its completion event stands in the
//! page's event maps, so the page's next writer waits for it (a load-back into the page
//! is behind it on the copy stream anyway). A load-back job over a request's pages is
//! queued on the copy stream: every main-KV page and main tag, one event; every index-K
//! page and index tag, one event; it returns at once. Main-KV readers (attention) make
//! the compute stream wait on the main event of every page they read; index-K readers
//! (the indexer) wait on the index event only with `gate_index_k`
//! (`SGLANG_DSV4_INDEX_K_HICACHE_SYNC=1`). Without it the indexer kernel can run while
//! the copy engine is still writing the page: the seeds' race, for real, and the longer
//! the copy stream's queue (bf16 pages are twice fp8's), the likelier. The reading
//! kernels count it through the tags (kernels/indexer_topk.cu). Served prefill's reader
//! is the shipping gather (`pool_gather`, kernels/hicache_copy.cu), gated the same way.
//!
//! cudarc's automatic synchronisation must stay out of the way, or it would order every
//! read after every copy touching the same allocation and hide the race: per-buffer
//! event tracking is disabled for the whole context in `CudaBackend::new` (before any
//! buffer exists), and the host tier is handed to the copies as plain `&[u8]` views of
//! the pinned allocation (cudarc records no event on those). Every cross-stream order
//! here is an explicit `join` or `wait`.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use cudarc::driver::{CudaEvent, CudaSlice, PinnedHostSlice, PushKernelArg};

use super::super::paged::{
    self, GatheredKv, IndexRows, PageContents, PageRows, PagedAttnJob, PagedIndexerJob, PoolId,
    PoolSpec, PoolStats, MAX_PAGE_TOKENS,
};
use super::super::{AttnOut, AttnPath, IndexKDtype, TopkImpl, INDEX_DIM, MAIN_DIM};
use super::launch::Selection;
use super::{
    grid_for, per_job, row_starts, to_u32, CudaBackend, ATTN_THREADS, ELEMENTWISE_THREADS,
};

/// Threads per block of the paged indexer kernels (`PAGED_THREADS` in the .cu).
const PAGED_THREADS: u32 = 128;
/// Threads per block (one page each) of `paged_gather_sequence`.
const GATHER_THREADS: u32 = 256;

fn align(offset: usize) -> usize {
    offset.div_ceil(256) * 256
}

/// Byte ranges of one pool's device allocation.
#[derive(Debug, Clone)]
struct Layout {
    main: Range<usize>,
    index: Range<usize>,
    main_tag: Range<usize>,
    index_tag: Range<usize>,
}

impl Layout {
    fn new(spec: &PoolSpec) -> Self {
        let main = 0..spec.device_pages * spec.main_page_bytes();
        let index_start = align(main.end);
        let index = index_start..index_start + spec.device_pages * spec.index_page_bytes();
        let tag_start = align(index.end);
        let main_tag = tag_start..tag_start + spec.device_pages * 4;
        let index_tag_start = align(main_tag.end);
        let index_tag = index_tag_start..index_tag_start + spec.device_pages * 4;
        Layout {
            main,
            index,
            main_tag,
            index_tag,
        }
    }

    fn total(&self) -> usize {
        self.index_tag.end
    }
}

/// Byte ranges of one host slot.
struct SlotLayout {
    main: Range<usize>,
    index: Range<usize>,
    main_tag: Range<usize>,
    index_tag: Range<usize>,
    bytes: usize,
}

impl SlotLayout {
    fn new(spec: &PoolSpec) -> Self {
        let main = 0..spec.main_page_bytes();
        let index = main.end..main.end + spec.index_page_bytes();
        let main_tag = index.end..index.end + 4;
        let index_tag = main_tag.end..main_tag.end + 4;
        SlotLayout {
            bytes: index_tag.end,
            main,
            index,
            main_tag,
            index_tag,
        }
    }

    fn at(&self, slot: u32, part: &Range<usize>) -> Range<usize> {
        let base = slot as usize * self.bytes;
        base + part.start..base + part.end
    }
}

pub(super) struct GpuPool {
    spec: PoolSpec,
    layout: Layout,
    slots: SlotLayout,
    kv: CudaSlice<u8>,
    /// [stale index-K page reads, stale main-KV page reads], bumped by the kernels.
    counters: CudaSlice<u64>,
    host: PinnedHostSlice<u8>,
    /// Generation each page should hold (sent with every page table).
    expected: Vec<u32>,
    slot_generation: Vec<u32>,
    next_generation: u32,
    /// Unfinished copies landing on (load-back) or leaving (eviction) a page; one
    /// load-back job shares its two events between its pages.
    main_events: HashMap<u32, Arc<CudaEvent>>,
    index_events: HashMap<u32, Arc<CudaEvent>>,
    stats: PoolStats,
}

impl GpuPool {
    fn page_range(&self, region: &Range<usize>, page: u32, page_bytes: usize) -> Range<usize> {
        let start = region.start + page as usize * page_bytes;
        start..start + page_bytes
    }

    fn tag_range(&self, region: &Range<usize>, page: u32) -> Range<usize> {
        let start = region.start + page as usize * 4;
        start..start + 4
    }

    /// Before reading `pages` on `compute`: drop the events of finished load-backs and,
    /// with `wait`, make the compute stream wait on the unfinished ones.
    fn gate(
        &mut self,
        compute: &cudarc::driver::CudaStream,
        pages: &[u32],
        index: bool,
        wait: bool,
    ) -> Result<()> {
        let events = if index {
            &mut self.index_events
        } else {
            &mut self.main_events
        };
        // A load-back job's pages share its events: one stream wait per event.
        let mut waited: Vec<*const CudaEvent> = Vec::new();
        for page in pages {
            let Some(event) = events.get(page) else {
                continue;
            };
            if event.is_complete() {
                events.remove(page);
            } else if wait {
                self.stats.gated_waits += 1;
                if !waited.contains(&Arc::as_ptr(event)) {
                    compute.wait(event)?;
                    waited.push(Arc::as_ptr(event));
                }
            }
        }
        Ok(())
    }
}

/// Page tables of a batch: the used pages of every job back to back, with the expected
/// generation of each and the prefix sums of pages per job.
struct PageTables {
    table: Vec<u32>,
    expected: Vec<u32>,
    page_start: Vec<u32>,
}

fn page_tables<'a>(
    pool: &GpuPool,
    jobs: impl Iterator<Item = (&'a [u32], usize)>,
) -> Result<PageTables> {
    let mut tables = PageTables {
        table: Vec::new(),
        expected: Vec::new(),
        page_start: vec![0],
    };
    for (pages, n) in jobs {
        let used = &pages[..n.div_ceil(pool.spec.page_tokens)];
        tables.table.extend_from_slice(used);
        tables
            .expected
            .extend(used.iter().map(|&page| pool.expected[page as usize]));
        tables
            .page_start
            .push(to_u32(tables.table.len(), "page-table entries")?);
    }
    Ok(tables)
}

fn pool_mut(pools: &mut [Option<GpuPool>], pool: PoolId) -> Result<&mut GpuPool> {
    pools
        .get_mut(pool.0 as usize)
        .and_then(Option::as_mut)
        .ok_or_else(|| anyhow!("unknown or released pool {pool:?}"))
}

impl CudaBackend {
    pub(super) fn pool_create(&self, spec: PoolSpec) -> Result<PoolId> {
        spec.validate()?;
        let layout = Layout::new(&spec);
        let slots = SlotLayout::new(&spec);
        let kv = self
            .compute
            .alloc_zeros::<u8>(layout.total())
            .with_context(|| format!("allocating a {} MiB device pool", layout.total() >> 20))?;
        let counters = self.compute.alloc_zeros::<u64>(2)?;
        // SAFETY: the slots are zeroed below before any copy reads them.
        let mut host = unsafe {
            self.ctx
                .alloc_pinned_with_flags::<u8>(spec.host_pages * slots.bytes, 0)
        }
        .with_context(|| {
            format!(
                "allocating {} MiB of page-locked host tier",
                (spec.host_pages * slots.bytes) >> 20
            )
        })?;
        host.as_mut_slice()?.fill(0);
        // The allocation is ordered on the compute stream; the copy stream uses it too.
        self.compute.synchronize()?;
        let mut pools = self.pools.lock();
        pools.push(Some(GpuPool {
            spec,
            layout,
            slots,
            kv,
            counters,
            host,
            expected: vec![0; spec.device_pages],
            slot_generation: vec![0; spec.host_pages],
            next_generation: 1,
            main_events: HashMap::new(),
            index_events: HashMap::new(),
            stats: PoolStats::default(),
        }));
        Ok(PoolId((pools.len() - 1) as u32))
    }

    pub(super) fn pool_release(&self, pool: PoolId) -> Result<()> {
        let mut pools = self.pools.lock();
        pool_mut(&mut pools, pool)?;
        self.copy.synchronize()?;
        self.compute.synchronize()?;
        pools[pool.0 as usize] = None;
        Ok(())
    }

    /// The first half of `pool_store_rows`: wait
    /// for a load-back still landing on `page` (it would overwrite the new rows), then
    /// copy the checked rows' main keys into it.
    fn store_main_rows(
        &self,
        p: &mut GpuPool,
        page: u32,
        first_row: usize,
        main_keys: &[f32],
    ) -> Result<()> {
        let rows = main_keys.len() / MAIN_DIM;
        for events in [&mut p.main_events, &mut p.index_events] {
            if let Some(event) = events.remove(&page) {
                self.compute.wait(&event)?;
            }
        }
        let main_page = p.page_range(&p.layout.main, page, p.spec.main_page_bytes());
        let main_start = main_page.start + first_row * MAIN_DIM * 4;
        let mut bytes = p.kv.slice_mut(main_start..main_start + rows * MAIN_DIM * 4);
        // SAFETY: the range is 4-byte aligned (regions are 256-aligned, rows 256 B).
        let mut floats = unsafe { bytes.transmute_mut::<f32>(rows * MAIN_DIM) }
            .ok_or_else(|| anyhow!("main-KV view of {rows} rows"))?;
        self.compute.memcpy_htod(main_keys, &mut floats)?;
        Ok(())
    }

    /// The last step of `pool_store_rows`: a fresh generation in both of the page's
    /// tags, and as the page's expected generation.
    fn stamp_page(&self, p: &mut GpuPool, page: u32) -> Result<()> {
        let generation = p.next_generation;
        p.next_generation = p.next_generation.wrapping_add(1).max(1);
        let tag = generation.to_le_bytes();
        for region in [p.layout.main_tag.clone(), p.layout.index_tag.clone()] {
            let range = p.tag_range(&region, page);
            self.compute
                .memcpy_htod(&tag[..], &mut p.kv.slice_mut(range))?;
        }
        p.expected[page as usize] = generation;
        Ok(())
    }

    /// `store_rows`: the main keys, then the index-K quantized by `quantize_index_k_*`
    /// (or copied as they are when they come quantized), then the page's new generation.
    pub(super) fn pool_store_rows(&self, pool: PoolId, rows: PageRows<'_>) -> Result<()> {
        let mut pools = self.pools.lock();
        let p = pool_mut(&mut pools, pool)?;
        let count = paged::check_store(&p.spec, &rows)?;
        if count == 0 {
            return Ok(());
        }
        let (page, first_row) = (rows.page, rows.first_row);
        self.store_main_rows(p, page, first_row, rows.main_keys)?;
        let width = p.spec.dtype.bytes_per_token();
        let index_page = p.page_range(&p.layout.index, page, p.spec.index_page_bytes());
        let index_start = index_page.start + first_row * width;
        match rows.index {
            IndexRows::Keys(index_keys) => {
                let d_keys = self.upload_pinned(index_keys)?;
                let rows32 = to_u32(count, "rows")?;
                let mut out = p.kv.slice_mut(index_start..index_start + count * width);
                let (function, cfg) = match p.spec.dtype {
                    IndexKDtype::Bf16 => (
                        &self.kernels.quantize_bf16,
                        grid_for(count * INDEX_DIM, ELEMENTWISE_THREADS),
                    ),
                    IndexKDtype::Fp8 => (&self.kernels.quantize_fp8, {
                        let mut cfg = grid_for(count, 1);
                        cfg.block_dim = (INDEX_DIM as u32, 1, 1);
                        cfg
                    }),
                };
                let mut launch = self.compute.launch_builder(function);
                launch.arg(&d_keys).arg(&mut out).arg(&rows32);
                // SAFETY: matches quantize_index_k_* in index_k.cu; `out` holds count * width bytes.
                unsafe { launch.launch(cfg) }
                    .context("launching quantize_index_k into a pool page")?;
            }
            IndexRows::Quantized(index_rows) => {
                self.compute.memcpy_htod(
                    index_rows,
                    &mut p.kv.slice_mut(index_start..index_start + count * width),
                )?;
            }
        }
        self.stamp_page(p, page)
    }

    pub(super) fn pool_append_rows(
        &self,
        pool: PoolId,
        rows: &[(u32, usize)],
        main_keys: &[f32],
        index_keys: &[f32],
    ) -> Result<()> {
        let mut pools = self.pools.lock();
        let p = pool_mut(&mut pools, pool)?;
        paged::check_append(&p.spec, rows, main_keys, index_keys)?;
        if rows.is_empty() {
            return Ok(());
        }
        // One generation per page: blocks run in any order, so two rows of one page
        // must not leave different tags behind.
        let mut page_generation: HashMap<u32, u32> = HashMap::new();
        for &(page, _) in rows {
            if page_generation.contains_key(&page) {
                continue;
            }
            for events in [&mut p.main_events, &mut p.index_events] {
                if let Some(event) = events.remove(&page) {
                    self.compute.wait(&event)?;
                }
            }
            page_generation.insert(page, p.next_generation);
            p.expected[page as usize] = p.next_generation;
            p.next_generation = p.next_generation.wrapping_add(1).max(1);
        }
        let page_tokens = p.spec.page_tokens;
        let dst_row: Vec<u32> = rows
            .iter()
            .map(|&(page, row)| to_u32(page as usize * page_tokens + row, "pool row"))
            .collect::<Result<_>>()?;
        let dst_page: Vec<u32> = rows.iter().map(|&(page, _)| page).collect();
        let generation: Vec<u32> = rows.iter().map(|(page, _)| page_generation[page]).collect();
        let d_main = self.upload_pinned(main_keys)?;
        let d_index = self.upload_pinned(index_keys)?;
        let d_row = self.upload_pinned(&dst_row)?;
        let d_page = self.upload_pinned(&dst_page)?;
        let d_generation = self.upload_pinned(&generation)?;
        let rows32 = to_u32(rows.len(), "appended rows")?;
        let fp8 = u32::from(p.spec.dtype == IndexKDtype::Fp8);
        let layout = p.layout.clone();
        let device_pages = p.spec.device_pages;
        let (mut main_part, mut rest) = p.kv.split_at_mut(layout.index.start);
        let (mut index_part, mut tags) =
            rest.split_at_mut(layout.main_tag.start - layout.index.start);
        let (mut main_tag_part, mut index_tag_part) =
            tags.split_at_mut(layout.index_tag.start - layout.main_tag.start);
        // SAFETY: each region starts 256-aligned and holds what is viewed.
        let (mut main_pool, mut main_tag, mut index_tag) = unsafe {
            (
                main_part.transmute_mut::<f32>(layout.main.len() / 4),
                main_tag_part.transmute_mut::<u32>(device_pages),
                index_tag_part.transmute_mut::<u32>(device_pages),
            )
        };
        let (Some(main_pool), Some(main_tag), Some(index_tag)) =
            (main_pool.as_mut(), main_tag.as_mut(), index_tag.as_mut())
        else {
            anyhow::bail!("pool views for append_rows");
        };
        let mut launch = self.compute.launch_builder(&self.kernels.append_rows);
        launch
            .arg(&d_main)
            .arg(&d_index)
            .arg(&d_row)
            .arg(&d_page)
            .arg(&d_generation)
            .arg(&rows32)
            .arg(&fp8)
            .arg(main_pool)
            .arg(&mut index_part)
            .arg(main_tag)
            .arg(index_tag);
        let cfg = cudarc::driver::LaunchConfig {
            grid_dim: (rows32.min(super::MAX_GRID_BLOCKS), 1, 1),
            block_dim: (INDEX_DIM as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: matches append_rows in index_k.cu; rows and pages were range-checked.
        unsafe { launch.launch(cfg) }.context("launching append_rows")?;
        Ok(())
    }

    pub(super) fn pool_evict(&self, pool: PoolId, page: u32, slot: u32) -> Result<()> {
        let mut pools = self.pools.lock();
        let p = pool_mut(&mut pools, pool)?;
        paged::check_slot(&p.spec, page, slot)?;
        // Everything queued so far (the last writes and reads of the page) comes first;
        // an unfinished load-back of the page is earlier on the copy stream itself.
        self.copy.join(&self.compute)?;
        let parts = [
            (
                p.page_range(&p.layout.main, page, p.spec.main_page_bytes()),
                p.slots.at(slot, &p.slots.main),
            ),
            (
                p.page_range(&p.layout.index, page, p.spec.index_page_bytes()),
                p.slots.at(slot, &p.slots.index),
            ),
            (
                p.tag_range(&p.layout.main_tag, page),
                p.slots.at(slot, &p.slots.main_tag),
            ),
            (
                p.tag_range(&p.layout.index_tag, page),
                p.slots.at(slot, &p.slots.index_tag),
            ),
        ];
        // A plain view of the pinned tier, as for load-backs: no cudarc event on it.
        let host = p.host.as_mut_slice()?;
        for (device, host_range) in parts {
            self.copy
                .memcpy_dtoh(&p.kv.slice(device), &mut host[host_range])?;
        }
        // Not waited for here: the page's next writer waits for this event
        // (`store_main_rows`, `pool_append_rows`), a load-back into the page or out of
        // the slot is behind it on the copy stream.
        let done = Arc::new(self.copy.record_event(None)?);
        p.main_events.insert(page, done.clone());
        p.index_events.insert(page, done);
        p.slot_generation[slot as usize] = p.expected[page as usize];
        p.stats.evictions += 1;
        Ok(())
    }

    /// One load-back job: every pair's main-KV page and tag, one event, then every
    /// pair's index-K page and tag, another event; queued on the copy stream, not waited
    /// for.
    pub(super) fn pool_load_back(&self, pool: PoolId, pairs: &[(u32, u32)]) -> Result<()> {
        let mut pools = self.pools.lock();
        let p = pool_mut(&mut pools, pool)?;
        for &(slot, page) in pairs {
            paged::check_slot(&p.spec, page, slot)?;
        }
        if pairs.is_empty() {
            return Ok(());
        }
        // Reads of the pages' previous occupants queued so far must finish first: that
        // order is the allocator's, not the gate.
        self.copy.join(&self.compute)?;
        // A plain view of the pinned tier: cudarc records no event on it (see the header).
        let host = p.host.as_slice()?;
        for &(slot, page) in pairs {
            let main = [
                (
                    p.slots.at(slot, &p.slots.main),
                    p.page_range(&p.layout.main, page, p.spec.main_page_bytes()),
                ),
                (
                    p.slots.at(slot, &p.slots.main_tag),
                    p.tag_range(&p.layout.main_tag, page),
                ),
            ];
            for (host_range, device) in main {
                self.copy
                    .memcpy_htod(&host[host_range], &mut p.kv.slice_mut(device))?;
            }
        }
        let main_event = Arc::new(self.copy.record_event(None)?);
        for &(slot, page) in pairs {
            let index = [
                (
                    p.slots.at(slot, &p.slots.index),
                    p.page_range(&p.layout.index, page, p.spec.index_page_bytes()),
                ),
                (
                    p.slots.at(slot, &p.slots.index_tag),
                    p.tag_range(&p.layout.index_tag, page),
                ),
            ];
            for (host_range, device) in index {
                self.copy
                    .memcpy_htod(&host[host_range], &mut p.kv.slice_mut(device))?;
            }
        }
        let index_event = Arc::new(self.copy.record_event(None)?);
        for &(slot, page) in pairs {
            p.main_events.insert(page, main_event.clone());
            p.index_events.insert(page, index_event.clone());
            p.expected[page as usize] = p.slot_generation[slot as usize];
        }
        p.stats.load_backs += pairs.len() as u64;
        Ok(())
    }

    /// Rows 0..n of a sequence out of the pool for shipping: main KV gated on its
    /// load-back events, index-K only with `gate_index_k`; the kernel checks both tags
    /// of every page (kernels/hicache_copy.cu, `paged_gather_sequence`).
    pub(super) fn pool_gather(
        &self,
        pool: PoolId,
        pages: &[u32],
        n: usize,
        gate_index_k: bool,
    ) -> Result<GatheredKv> {
        let mut pools = self.pools.lock();
        let p = pool_mut(&mut pools, pool)?;
        paged::check_gather(&p.spec, pages, n)?;
        let tables = page_tables(p, std::iter::once((pages, n)))?;
        let used = tables.table.len();
        p.gate(&self.compute, &tables.table, false, true)?;
        p.gate(&self.compute, &tables.table, true, gate_index_k)?;
        let width = p.spec.dtype.bytes_per_token();
        let d_table = self.upload_pinned(&tables.table)?;
        let d_expected = self.upload_pinned(&tables.expected)?;
        let mut d_main = self.zeros::<f32>(n * MAIN_DIM)?;
        let mut d_index = self.zeros::<u8>(n * width)?;
        let mut d_flags = self.zeros::<u32>(used)?;
        let used32 = to_u32(used, "gathered pages")?;
        let rows32 = to_u32(n, "gathered rows")?;
        let page_tokens32 = to_u32(p.spec.page_tokens, "page_tokens")?;
        let width32 = width as u32;
        {
            let main_bytes = p.kv.slice(p.layout.main.clone());
            // SAFETY: the main region is 256-aligned and holds whole f32 rows.
            let main = unsafe { main_bytes.transmute::<f32>(p.layout.main.len() / 4) }
                .ok_or_else(|| anyhow!("main-KV view"))?;
            let index = p.kv.slice(p.layout.index.clone());
            let main_tag_bytes = p.kv.slice(p.layout.main_tag.clone());
            let index_tag_bytes = p.kv.slice(p.layout.index_tag.clone());
            // SAFETY: each tag region is 256-aligned and holds device_pages u32.
            let (main_tags, index_tags) = unsafe {
                (
                    main_tag_bytes.transmute::<u32>(p.spec.device_pages),
                    index_tag_bytes.transmute::<u32>(p.spec.device_pages),
                )
            };
            let (Some(main_tags), Some(index_tags)) = (main_tags, index_tags) else {
                anyhow::bail!("tag views for the gather");
            };
            let mut stale = p.counters.slice_mut(0..2);
            let mut launch = self.compute.launch_builder(&self.kernels.paged_gather);
            launch
                .arg(&main)
                .arg(&index)
                .arg(&main_tags)
                .arg(&index_tags)
                .arg(&d_table)
                .arg(&d_expected)
                .arg(&used32)
                .arg(&rows32)
                .arg(&page_tokens32)
                .arg(&width32)
                .arg(&mut d_main)
                .arg(&mut d_index)
                .arg(&mut d_flags)
                .arg(&mut stale);
            let cfg = cudarc::driver::LaunchConfig {
                grid_dim: (used32, 1, 1),
                block_dim: (GATHER_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: matches paged_gather_sequence in hicache_copy.cu; every page id was
            // checked against the pool and the pages hold n rows.
            unsafe { launch.launch(cfg) }.context("launching paged_gather_sequence")?;
        }
        drop(pools);
        let flags = self.download(&d_flags, used)?;
        Ok(GatheredKv {
            main: self.download(&d_main, n * MAIN_DIM)?,
            index_k: self.download(&d_index, n * width)?,
            stale_index_pages: flags.iter().filter(|&&f| f & 1 != 0).count(),
            stale_main_pages: flags.iter().filter(|&&f| f & 2 != 0).count(),
        })
    }

    pub(super) fn pool_indexer_topk(
        &self,
        pool: PoolId,
        jobs: &[PagedIndexerJob<'_>],
        k: usize,
        topk: TopkImpl,
        gate_index_k: bool,
    ) -> Result<Vec<Vec<u32>>> {
        let mut pools = self.pools.lock();
        let p = pool_mut(&mut pools, pool)?;
        paged::check_indexer_jobs(&p.spec, jobs)?;
        let starts = row_starts(jobs.iter().map(|job| job.n))?;
        let rows = *starts.last().unwrap_or(&0) as usize;
        if jobs.is_empty() || k == 0 || rows == 0 {
            return Ok(vec![Vec::new(); jobs.len()]);
        }
        let page_tokens = p.spec.page_tokens;
        let tile_pages = (MAX_PAGE_TOKENS / page_tokens).max(1);
        let tables = page_tables(p, jobs.iter().map(|job| (job.pages, job.n)))?;
        let tile_start = row_starts(
            jobs.iter()
                .map(|job| job.n.div_ceil(page_tokens).div_ceil(tile_pages)),
        )?;
        let tiles = *tile_start.last().unwrap_or(&0);
        p.gate(&self.compute, &tables.table, true, gate_index_k)?;

        let queries: Vec<f32> = jobs
            .iter()
            .flat_map(|job| job.query.iter().copied())
            .collect();
        let d_queries = self.upload_pinned(&queries)?;
        let d_table = self.upload_pinned(&tables.table)?;
        let d_expected = self.upload_pinned(&tables.expected)?;
        let d_page_start = self.upload_pinned(&tables.page_start)?;
        let d_tile_start = self.upload_pinned(&tile_start)?;
        let d_starts = self.upload_pinned(&starts)?;
        let mut d_scores = self.zeros::<f32>(rows)?;
        let jobs32 = to_u32(jobs.len(), "indexer jobs")?;
        let page_tokens32 = page_tokens as u32;
        let tile_pages32 = tile_pages as u32;
        let function = match p.spec.dtype {
            IndexKDtype::Bf16 => &self.kernels.paged_scores_bf16,
            IndexKDtype::Fp8 => &self.kernels.paged_scores_fp8,
        };
        {
            let index = p.kv.slice(p.layout.index.clone());
            let tag_bytes = p.kv.slice(p.layout.index_tag.clone());
            // SAFETY: the tag region is 256-aligned and holds device_pages u32.
            let tags = unsafe { tag_bytes.transmute::<u32>(p.spec.device_pages) }
                .ok_or_else(|| anyhow!("index tag view"))?;
            let mut stale = p.counters.slice_mut(0..1);
            let mut launch = self.compute.launch_builder(function);
            launch
                .arg(&d_queries)
                .arg(&index)
                .arg(&tags)
                .arg(&d_table)
                .arg(&d_expected)
                .arg(&d_page_start)
                .arg(&d_tile_start)
                .arg(&d_starts)
                .arg(&jobs32)
                .arg(&page_tokens32)
                .arg(&tile_pages32)
                .arg(&mut d_scores)
                .arg(&mut stale);
            let cfg = cudarc::driver::LaunchConfig {
                grid_dim: (tiles, 1, 1),
                block_dim: (PAGED_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: matches paged_indexer_scores_* in indexer_topk.cu; every page id
            // was checked against the pool, every job has the pages its n needs.
            unsafe { launch.launch(cfg) }.context("launching paged_indexer_scores")?;
        }
        drop(pools);
        let counts: Vec<usize> = jobs.iter().map(|job| job.n).collect();
        self.topk_on_device(&d_scores, &d_starts, &counts, k, topk)
    }

    pub(super) fn pool_sparse_attention(
        &self,
        pool: PoolId,
        jobs: &[PagedAttnJob<'_>],
        path: AttnPath,
    ) -> Result<Vec<AttnOut>> {
        let mut pools = self.pools.lock();
        let p = pool_mut(&mut pools, pool)?;
        paged::check_attention_jobs(&p.spec, jobs)?;
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let tables = page_tables(p, jobs.iter().map(|job| (job.pages, job.n)))?;
        // Main-KV reads always wait for their load-backs (the gate that exists).
        p.gate(&self.compute, &tables.table, false, true)?;
        let jobs32 = to_u32(jobs.len(), "attention jobs")?;
        let row_start = row_starts(jobs.iter().map(|job| job.n))?;
        let sel_start = row_starts(jobs.iter().map(|job| job.selected.len()))?;
        let rows = *row_start.last().unwrap_or(&0) as usize;
        let selected_total = *sel_start.last().unwrap_or(&0) as usize;
        let queries: Vec<f32> = jobs
            .iter()
            .flat_map(|job| job.query.iter().copied())
            .collect();
        let selected: Vec<u32> = jobs
            .iter()
            .flat_map(|job| job.selected.iter().copied())
            .collect();
        let d_queries = self.upload_pinned(&queries)?;
        let d_table = self.upload_pinned(&tables.table)?;
        let d_expected = self.upload_pinned(&tables.expected)?;
        let d_page_start = self.upload_pinned(&tables.page_start)?;
        let d_row_start = self.upload_pinned(&row_start)?;
        let d_selected = self.upload_pinned(&selected)?;
        let d_sel_start = self.upload_pinned(&sel_start)?;
        let mut d_argmax = self.zeros::<u32>(jobs.len())?;
        let mut d_weight = self.zeros::<f32>(jobs.len())?;
        let page_tokens32 = p.spec.page_tokens as u32;
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

        let main_bytes = p.kv.slice(p.layout.main.clone());
        // SAFETY: the main region is 256-aligned and holds whole f32 rows.
        let main = unsafe { main_bytes.transmute::<f32>(p.layout.main.len() / 4) }
            .ok_or_else(|| anyhow!("main-KV view"))?;
        let tag_bytes = p.kv.slice(p.layout.main_tag.clone());
        // SAFETY: as above, device_pages u32.
        let tags = unsafe { tag_bytes.transmute::<u32>(p.spec.device_pages) }
            .ok_or_else(|| anyhow!("main tag view"))?;
        let mut stale = p.counters.slice_mut(1..2);
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
                let mut launch = self.compute.launch_builder(&self.kernels.paged_attn_mma);
                launch
                    .arg(&d_absorbed)
                    .arg(&main)
                    .arg(&tags)
                    .arg(&d_table)
                    .arg(&d_expected)
                    .arg(&d_page_start)
                    .arg(&page_tokens32)
                    .arg(&d_selected)
                    .arg(&d_sel_start)
                    .arg(&mut d_logits)
                    .arg(&mut d_argmax)
                    .arg(&mut d_weight)
                    .arg(&mut stale);
                // SAFETY: matches paged_sparse_attention_mma in sparse_attention.cu.
                unsafe { launch.launch(per_job(jobs.len(), ATTN_THREADS)) }
                    .context("launching paged_sparse_attention_mma")?;
            }
            AttnPath::Legacy => {
                let mut count = self
                    .compute
                    .launch_builder(&self.kernels.paged_count_stale_main);
                count
                    .arg(&tags)
                    .arg(&d_table)
                    .arg(&d_expected)
                    .arg(&d_page_start)
                    .arg(&mut stale);
                // SAFETY: matches paged_count_stale_main in sparse_attention.cu.
                unsafe { count.launch(per_job(jobs.len(), ATTN_THREADS)) }
                    .context("launching paged_count_stale_main")?;
                let mut d_dense = self.zeros::<f32>(rows)?;
                let mut d_mask = self.zeros::<u8>(rows)?;
                let mut dense = self
                    .compute
                    .launch_builder(&self.kernels.paged_legacy_dense);
                dense
                    .arg(&self.up_projection)
                    .arg(&d_projected)
                    .arg(&main)
                    .arg(&d_table)
                    .arg(&d_page_start)
                    .arg(&page_tokens32)
                    .arg(&d_row_start)
                    .arg(&jobs32)
                    .arg(&mut d_dense);
                // SAFETY: matches paged_attention_legacy_dense in sparse_attention.cu.
                unsafe { dense.launch(grid_for(rows, ELEMENTWISE_THREADS)) }
                    .context("launching paged legacy dense")?;
                let selection = Selection {
                    row_start: &d_row_start,
                    selected: &d_selected,
                    sel_start: &d_sel_start,
                    jobs32,
                    selected_total,
                };
                self.legacy_mask_softmax(
                    &selection,
                    &d_dense,
                    &mut d_mask,
                    &mut d_argmax,
                    &mut d_weight,
                )?;
            }
        }
        self.download_attn(&d_argmax, &d_weight, jobs.len())
    }

    pub(super) fn pool_read_page(&self, pool: PoolId, page: u32) -> Result<PageContents> {
        let mut pools = self.pools.lock();
        let p = pool_mut(&mut pools, pool)?;
        paged::check_slot(&p.spec, page, 0)?;
        self.copy.synchronize()?;
        self.compute.synchronize()?;
        let read = |range: Range<usize>| -> Result<Vec<u8>> {
            let mut out = vec![0u8; range.len()];
            self.compute.memcpy_dtoh(&p.kv.slice(range), &mut out)?;
            self.compute.synchronize()?;
            Ok(out)
        };
        let main = read(p.page_range(&p.layout.main, page, p.spec.main_page_bytes()))?;
        let index_k = read(p.page_range(&p.layout.index, page, p.spec.index_page_bytes()))?;
        let tag = |bytes: Vec<u8>| u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        Ok(PageContents {
            main: main
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            index_k,
            main_tag: tag(read(p.tag_range(&p.layout.main_tag, page))?),
            index_tag: tag(read(p.tag_range(&p.layout.index_tag, page))?),
            expected: p.expected[page as usize],
        })
    }

    pub(super) fn pool_stats(&self, pool: PoolId) -> Result<PoolStats> {
        let mut pools = self.pools.lock();
        let p = pool_mut(&mut pools, pool)?;
        let counters = self.download(&p.counters, 2)?;
        Ok(PoolStats {
            stale_index_k_reads: counters[0],
            stale_main_reads: counters[1],
            ..p.stats
        })
    }
}
