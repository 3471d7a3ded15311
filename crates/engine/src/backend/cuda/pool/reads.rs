//! The reads of a CUDA pool ([`PagedReads`]), each one kernel family over page tables
//! on the compute stream: the shipping gather, the indexer scores (then the shared
//! top-k) and both sparse attention paths (the shared attention flow around the paged
//! kernels, [`PagedAttn`]). Main-KV reads always wait for the pages' unfinished
//! load-backs, index-K reads only with `gate_index_k` (the header of `pool.rs` says why
//! that gate is the seeds' race). Also the host's look at a page (`read_page`, tests)
//! and the pool's counters.

use std::ops::Range;

use anyhow::{Context, Result};
use cudarc::driver::{CudaSlice, CudaView, CudaViewMut, PushKernelArg};

use super::super::super::paged::{
    self, GatheredKv, PageContents, PagedAttnJob, PagedIndexerJob, PagedReads, PoolId, PoolStats,
    MAX_PAGE_TOKENS,
};
use super::super::super::{AttnOut, AttnPath, IndexKDtype, TopkImpl, MAIN_DIM};
use super::super::launch::{AttnBatch, AttnKernels, AttnRun, Selection};
use super::super::{
    blocks, grid_for, row_starts, to_u32, CudaBackend, ATTN_THREADS, ELEMENTWISE_THREADS,
};
use super::{pool_mut, GpuPool};

/// Threads per block of the paged indexer kernels (`PAGED_THREADS` in the .cu).
const PAGED_THREADS: u32 = 128;
/// Threads per block (one page each) of `paged_gather_sequence`.
const GATHER_THREADS: u32 = 256;

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

/// [`PageTables`] on the device.
struct DeviceTables {
    table: CudaSlice<u32>,
    expected: CudaSlice<u32>,
    page_start: CudaSlice<u32>,
}

impl CudaBackend {
    /// A batch's page tables, through the staging ring, in their fields' order.
    fn upload_tables(&self, tables: &PageTables) -> Result<DeviceTables> {
        Ok(DeviceTables {
            table: self.upload_pinned(&tables.table)?,
            expected: self.upload_pinned(&tables.expected)?,
            page_start: self.upload_pinned(&tables.page_start)?,
        })
    }
}

/// A pool's regions as the reading kernels take them.
struct PoolViews<'a> {
    main: CudaView<'a, f32>,
    index: CudaView<'a, u8>,
    main_tags: CudaView<'a, u32>,
    index_tags: CudaView<'a, u32>,
    /// [stale index-K page reads, stale main-KV page reads].
    counters: CudaViewMut<'a, u64>,
}

impl GpuPool {
    fn views(&mut self) -> Result<PoolViews<'_>> {
        let main = self.kv.slice(self.layout.main.clone());
        let main_tags = self.kv.slice(self.layout.main_tag.clone());
        let index_tags = self.kv.slice(self.layout.index_tag.clone());
        let pages = self.spec.device_pages;
        // SAFETY: each region starts 256-aligned; the main one holds whole f32 rows,
        // each tag region device_pages u32.
        let typed = unsafe {
            (
                main.transmute::<f32>(self.layout.main.len() / 4),
                main_tags.transmute::<u32>(pages),
                index_tags.transmute::<u32>(pages),
            )
        };
        let (Some(main), Some(main_tags), Some(index_tags)) = typed else {
            anyhow::bail!("typed views of the pool's regions");
        };
        Ok(PoolViews {
            main,
            index: self.kv.slice(self.layout.index.clone()),
            main_tags,
            index_tags,
            counters: self.counters.slice_mut(0..2),
        })
    }
}

impl PagedReads for CudaBackend {
    /// Rows 0..n of a sequence out of the pool for shipping: main KV gated on its
    /// load-back events, index-K only with `gate_index_k`; the kernel checks both tags
    /// of every page (kernels/hicache_copy.cu, `paged_gather_sequence`).
    fn gather_sequence(
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
            let mut views = p.views()?;
            let mut launch = self.compute.launch_builder(&self.kernels.paged_gather);
            launch
                .arg(&views.main)
                .arg(&views.index)
                .arg(&views.main_tags)
                .arg(&views.index_tags)
                .arg(&d_table)
                .arg(&d_expected)
                .arg(&used32)
                .arg(&rows32)
                .arg(&page_tokens32)
                .arg(&width32)
                .arg(&mut d_main)
                .arg(&mut d_index)
                .arg(&mut d_flags)
                .arg(&mut views.counters);
            // SAFETY: matches paged_gather_sequence in hicache_copy.cu; every page id was
            // checked against the pool and the pages hold n rows.
            unsafe { launch.launch(blocks(used, GATHER_THREADS)) }
                .context("launching paged_gather_sequence")?;
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

    fn indexer_topk_paged(
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
        let d_tables = self.upload_tables(&tables)?;
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
            let mut views = p.views()?;
            let mut stale = views.counters.slice_mut(0..1);
            let mut launch = self.compute.launch_builder(function);
            launch
                .arg(&d_queries)
                .arg(&views.index)
                .arg(&views.index_tags)
                .arg(&d_tables.table)
                .arg(&d_tables.expected)
                .arg(&d_tables.page_start)
                .arg(&d_tile_start)
                .arg(&d_starts)
                .arg(&jobs32)
                .arg(&page_tokens32)
                .arg(&tile_pages32)
                .arg(&mut d_scores)
                .arg(&mut stale);
            // SAFETY: matches PAGED_SCORES_PARAMS, the parameters of both
            // paged_indexer_scores_* in indexer_topk.cu; every page id was checked
            // against the pool, every job has the pages its n needs.
            unsafe { launch.launch(blocks(tiles as usize, PAGED_THREADS)) }
                .context("launching paged_indexer_scores")?;
        }
        drop(pools);
        let counts: Vec<usize> = jobs.iter().map(|job| job.n).collect();
        self.topk_on_device(&d_scores, &d_starts, &counts, k, topk)
    }

    fn sparse_attention_paged(
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
        let batch = AttnBatch::new(jobs.iter().map(|job| (job.query, job.n, job.selected)))?;
        let d_queries = self.upload_pinned(&batch.queries)?;
        let d_tables = self.upload_tables(&tables)?;
        let selection = self.upload_selection(&batch, true)?;
        let page_tokens = p.spec.page_tokens as u32;
        let PoolViews {
            main,
            main_tags,
            mut counters,
            ..
        } = p.views()?;
        let mut kernels = PagedAttn {
            backend: self,
            selection: &selection,
            tables: &d_tables,
            page_tokens,
            main,
            tags: main_tags,
            stale: counters.slice_mut(1..2),
        };
        self.attend(&d_queries, &selection, path, &mut kernels)
    }

    fn read_page(&self, pool: PoolId, page: u32) -> Result<PageContents> {
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

    fn pool_stats(&self, pool: PoolId) -> Result<PoolStats> {
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

/// The paged family's attention kernels: main keys read through the page tables, each
/// page's main-KV tag compared with the generation it should hold.
struct PagedAttn<'a> {
    backend: &'a CudaBackend,
    selection: &'a Selection,
    tables: &'a DeviceTables,
    page_tokens: u32,
    main: CudaView<'a, f32>,
    tags: CudaView<'a, u32>,
    /// The pool's count of stale main-KV page reads.
    stale: CudaViewMut<'a, u64>,
}

impl AttnKernels for PagedAttn<'_> {
    fn mma(&mut self, absorbed: &CudaSlice<f32>, run: &mut AttnRun) -> Result<()> {
        let (backend, selection, tables) = (self.backend, self.selection, self.tables);
        let mut d_logits = backend.zeros::<f32>(selection.selected_total)?;
        let mut launch = backend
            .compute
            .launch_builder(&backend.kernels.paged_attn_mma);
        launch
            .arg(absorbed)
            .arg(&self.main)
            .arg(&self.tags)
            .arg(&tables.table)
            .arg(&tables.expected)
            .arg(&tables.page_start)
            .arg(&self.page_tokens)
            .arg(&selection.selected)
            .arg(&selection.sel_start)
            .arg(&mut d_logits)
            .arg(&mut run.argmax)
            .arg(&mut run.weight)
            .arg(&mut self.stale);
        // SAFETY: matches paged_sparse_attention_mma in sparse_attention.cu.
        unsafe { launch.launch(blocks(selection.jobs(), ATTN_THREADS)) }
            .context("launching paged_sparse_attention_mma")?;
        Ok(())
    }

    fn before_legacy(&mut self) -> Result<()> {
        let (backend, tables) = (self.backend, self.tables);
        let mut count = backend
            .compute
            .launch_builder(&backend.kernels.paged_count_stale_main);
        count
            .arg(&self.tags)
            .arg(&tables.table)
            .arg(&tables.expected)
            .arg(&tables.page_start)
            .arg(&mut self.stale);
        // SAFETY: matches paged_count_stale_main in sparse_attention.cu.
        unsafe { count.launch(blocks(self.selection.jobs(), ATTN_THREADS)) }
            .context("launching paged_count_stale_main")?;
        Ok(())
    }

    fn dense(&mut self, projected: &CudaSlice<f32>, dense: &mut CudaSlice<f32>) -> Result<()> {
        let (backend, selection, tables) = (self.backend, self.selection, self.tables);
        let mut launch = backend
            .compute
            .launch_builder(&backend.kernels.paged_legacy_dense);
        launch
            .arg(&backend.up_projection)
            .arg(projected)
            .arg(&self.main)
            .arg(&tables.table)
            .arg(&tables.page_start)
            .arg(&self.page_tokens)
            .arg(&selection.row_start)
            .arg(&selection.jobs32)
            .arg(dense);
        // SAFETY: matches paged_attention_legacy_dense in sparse_attention.cu.
        unsafe { launch.launch(grid_for(selection.rows, ELEMENTWISE_THREADS)) }
            .context("launching paged legacy dense")?;
        Ok(())
    }
}
