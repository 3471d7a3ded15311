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
//! is the shipping gather (`gather_sequence`, kernels/hicache_copy.cu), gated the same way.
//!
//! cudarc's automatic synchronisation must stay out of the way, or it would order every
//! read after every copy touching the same allocation and hide the race: per-buffer
//! event tracking is disabled for the whole context in `CudaBackend::new` (before any
//! buffer exists), and the host tier is handed to the copies as plain `&[u8]` views of
//! the pinned allocation (cudarc records no event on those). Every cross-stream order
//! here is an explicit `join` or `wait`.
//!
//! This module owns a pool's memory and what changes it (create, writes, appends,
//! evictions, load-backs); its reads are in `reads`.

mod reads;

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use anyhow::{anyhow, Context, Result};
use cudarc::driver::{CudaEvent, CudaSlice, PinnedHostSlice, PushKernelArg};

use super::super::paged::{
    self, AppendedRows, IndexRows, PageRows, PagedPools, PoolId, PoolSpec, PoolStats,
};
use super::super::{IndexKDtype, INDEX_DIM, MAIN_DIM};
use super::{blocks, to_u32, CudaBackend, MAX_GRID_BLOCKS};

fn align(offset: usize) -> usize {
    offset.div_ceil(256) * 256
}

/// A page's two parts, each copied with its own tag: main KV and index-K.
#[derive(Clone, Copy)]
enum Region {
    Main,
    Index,
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

    /// What a load-back of `slot` into `page` copies for one region, in its order:
    /// (host range, device range) of the page's data, then of its tag.
    fn load_back_parts(
        &self,
        region: Region,
        slot: u32,
        page: u32,
    ) -> [(Range<usize>, Range<usize>); 2] {
        let (data, data_slot, tag, tag_slot, page_bytes) = match region {
            Region::Main => (
                &self.layout.main,
                &self.slots.main,
                &self.layout.main_tag,
                &self.slots.main_tag,
                self.spec.main_page_bytes(),
            ),
            Region::Index => (
                &self.layout.index,
                &self.slots.index,
                &self.layout.index_tag,
                &self.slots.index_tag,
                self.spec.index_page_bytes(),
            ),
        };
        [
            (
                self.slots.at(slot, data_slot),
                self.page_range(data, page, page_bytes),
            ),
            (self.slots.at(slot, tag_slot), self.tag_range(tag, page)),
        ]
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

fn pool_mut(pools: &mut [Option<GpuPool>], pool: PoolId) -> Result<&mut GpuPool> {
    pools
        .get_mut(pool.0 as usize)
        .and_then(Option::as_mut)
        .ok_or_else(|| anyhow!("unknown or released pool {pool:?}"))
}

impl CudaBackend {
    /// The first half of `store_rows`: wait for a load-back still landing on `page` (it
    /// would overwrite the new rows), then copy the checked rows' main keys into it.
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

    /// The last step of `store_rows`: a fresh generation in both of the page's
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
}

impl PagedPools for CudaBackend {
    fn create_pool(&self, spec: PoolSpec) -> Result<PoolId> {
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

    fn release_pool(&self, pool: PoolId) -> Result<()> {
        let mut pools = self.pools.lock();
        pool_mut(&mut pools, pool)?;
        self.copy.synchronize()?;
        self.compute.synchronize()?;
        pools[pool.0 as usize] = None;
        Ok(())
    }

    /// `store_rows`: the main keys, then the index-K quantized by `quantize_index_k_*`
    /// (or copied as they are when they come quantized), then the page's new generation.
    fn store_rows(&self, pool: PoolId, rows: PageRows<'_>) -> Result<()> {
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
                let (function, cfg) = self.quantize_kernel(p.spec.dtype, count);
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

    fn append_rows(&self, pool: PoolId, appended: AppendedRows<'_>) -> Result<()> {
        let mut pools = self.pools.lock();
        let p = pool_mut(&mut pools, pool)?;
        paged::check_append(&p.spec, &appended)?;
        let rows = appended.rows;
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
        let d_main = self.upload_pinned(appended.main_keys)?;
        let d_index = self.upload_pinned(appended.index_keys)?;
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
        let cfg = blocks(rows32.min(MAX_GRID_BLOCKS) as usize, INDEX_DIM as u32);
        // SAFETY: matches append_rows in index_k.cu; rows and pages were range-checked.
        unsafe { launch.launch(cfg) }.context("launching append_rows")?;
        Ok(())
    }

    fn evict_page(&self, pool: PoolId, page: u32, slot: u32) -> Result<()> {
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
        // (`store_main_rows`, `append_rows`), a load-back into the page or out of
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
    fn load_back_pages(&self, pool: PoolId, pairs: &[(u32, u32)]) -> Result<()> {
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
        let mut events = Vec::with_capacity(2);
        for region in [Region::Main, Region::Index] {
            for &(slot, page) in pairs {
                for (host_range, device) in p.load_back_parts(region, slot, page) {
                    self.copy
                        .memcpy_htod(&host[host_range], &mut p.kv.slice_mut(device))?;
                }
            }
            events.push(Arc::new(self.copy.record_event(None)?));
        }
        let (main_event, index_event) = (&events[0], &events[1]);
        for &(slot, page) in pairs {
            p.main_events.insert(page, main_event.clone());
            p.index_events.insert(page, index_event.clone());
            p.expected[page as usize] = p.slot_generation[slot as usize];
        }
        p.stats.load_backs += pairs.len() as u64;
        Ok(())
    }

    fn load_back_is_async(&self) -> bool {
        true
    }
}
