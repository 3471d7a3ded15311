//! The HiCache load-back primitive on the GPU ([`LoadBackPool`]): a device page pool,
//! its page-locked host tier, load-backs on a dedicated copy stream, and the gather
//! (`kernels/hicache_copy.cu`) that does or does not wait for them.
//!
//! Not used by the served engine: only this crate's GPU test
//! (`gpu_gated_load_back_reads_the_loaded_page`) drives it. The paged pools of
//! `pool.rs` (one allocation per pool, page tables, generation tags) supersede it as
//! the GPU HiCache; moving prefill's pool onto the GPU should go through those.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use anyhow::{ensure, Context, Result};
use cudarc::driver::{
    CudaEvent, CudaFunction, CudaSlice, CudaStream, PinnedHostSlice, PushKernelArg,
};
use parking_lot::{Mutex, MutexGuard};

use super::{grid_for, to_u32, CudaBackend, ELEMENTWISE_THREADS};

/// Counters of a [`LoadBackPool`], for the engine's /metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadBackStats {
    pub evictions: u64,
    pub load_backs: u64,
    /// Reads that waited on an in-flight load-back of a page they read (gated reads).
    pub gated_waits: u64,
    /// Reads that touched a page with a load-back still recorded but did not wait on it
    /// (the missing gate: these reads race the copy).
    pub ungated_reads_of_loading_pages: u64,
}

/// The GPU page pool of one KV kind (main KV or index-K) plus its host tier.
///
/// How the engine uses it (HiCache on the prefill role):
/// - `write_page(page, bytes)` stores a freshly computed page (compute stream).
/// - `evict(page, slot)` copies a device page to host slot `slot` and returns once the
///   copy landed, so the device page can be reused at once.
/// - `load_back(slot, page)` queues host slot -> device page on the dedicated copy
///   stream and records an event; it returns immediately, the copy is still in flight.
/// - `read_pages(pages, gate)` gathers pages on the compute stream into one buffer
///   (the input of the indexer / attention, or of the transfer to decode). With
///   `gate = true` the compute stream first waits on the recorded load-back event of
///   every page it reads; with `gate = false` it does not: the gather may read the page
///   before the copy lands and return the previous occupant's bytes. That is the real
///   GPU race behind the seeds' bug: call it with `gate = true` for main KV always and
///   for index-K only when `SGLANG_DSV4_INDEX_K_HICACHE_SYNC=1`.
pub struct LoadBackPool {
    compute: Arc<CudaStream>,
    copy: Arc<CudaStream>,
    gather: CudaFunction,
    page_bytes: usize,
    device_pages: usize,
    host_pages: usize,
    /// One lock for the memory and the copies in flight: every call that touches one
    /// touches the device pages too.
    tiers: Mutex<Tiers>,
    stats: Mutex<LoadBackStats>,
}

/// The memory of a [`LoadBackPool`] and its load-backs still recorded.
struct Tiers {
    device: CudaSlice<u8>,
    host: PinnedHostSlice<u8>,
    /// Last load-back event per device page; dropped once a read finds it complete.
    in_flight: HashMap<u32, CudaEvent>,
}

impl LoadBackPool {
    /// `device_pages` pages of `page_bytes` on the GPU (zeroed) and `host_pages` in
    /// page-locked host memory, so load-backs are truly asynchronous DMA.
    pub fn new(
        backend: &CudaBackend,
        page_bytes: usize,
        device_pages: usize,
        host_pages: usize,
    ) -> Result<Self> {
        ensure!(
            page_bytes > 0 && device_pages > 0 && host_pages > 0,
            "page pool dimensions must be positive"
        );
        to_u32(page_bytes, "page bytes")?;
        to_u32(device_pages.max(host_pages), "page count")?;
        let device = backend
            .compute
            .alloc_zeros::<u8>(page_bytes * device_pages)?;
        // SAFETY: the host tier is zeroed below before any read.
        let mut host = unsafe {
            backend
                .ctx
                .alloc_pinned_with_flags::<u8>(page_bytes * host_pages, 0)
        }?;
        host.as_mut_slice()?.fill(0);
        // The allocation is stream-ordered on the compute stream; the copy stream uses it too.
        backend.compute.synchronize()?;
        Ok(LoadBackPool {
            compute: backend.compute.clone(),
            copy: backend.copy.clone(),
            gather: backend.kernels.gather_pages.clone(),
            page_bytes,
            device_pages,
            host_pages,
            tiers: Mutex::new(Tiers {
                device,
                host,
                in_flight: HashMap::new(),
            }),
            stats: Mutex::new(LoadBackStats::default()),
        })
    }

    pub fn page_bytes(&self) -> usize {
        self.page_bytes
    }

    pub fn stats(&self) -> LoadBackStats {
        *self.stats.lock()
    }

    fn device_range(&self, page: u32) -> Result<Range<usize>> {
        ensure!(
            (page as usize) < self.device_pages,
            "device page {page} outside 0..{}",
            self.device_pages
        );
        Ok(page as usize * self.page_bytes..(page as usize + 1) * self.page_bytes)
    }

    fn host_range(&self, slot: u32) -> Result<Range<usize>> {
        ensure!(
            (slot as usize) < self.host_pages,
            "host slot {slot} outside 0..{}",
            self.host_pages
        );
        Ok(slot as usize * self.page_bytes..(slot as usize + 1) * self.page_bytes)
    }

    /// Stores one page on the compute stream and waits for it.
    pub fn write_page(&self, page: u32, bytes: &[u8]) -> Result<()> {
        ensure!(
            bytes.len() == self.page_bytes,
            "page of {} bytes, pool pages are {}",
            bytes.len(),
            self.page_bytes
        );
        let range = self.device_range(page)?;
        let mut tiers = self.tiers.lock();
        // A load-back still landing on this page would overwrite the new contents.
        if let Some(event) = tiers.in_flight.remove(&page) {
            self.compute.wait(&event)?;
        }
        self.compute
            .memcpy_htod(bytes, &mut tiers.device.slice_mut(range))?;
        self.compute.synchronize()?;
        Ok(())
    }

    /// The start of a copy between `page` and host slot `slot`: both ranges checked,
    /// the tiers locked, and the copy stream ordered after all compute work queued so
    /// far (which may still be writing the page, or reading its previous occupant).
    fn start_copy(
        &self,
        page: u32,
        slot: u32,
    ) -> Result<(MutexGuard<'_, Tiers>, [Range<usize>; 2])> {
        let ranges = [self.device_range(page)?, self.host_range(slot)?];
        let tiers = self.tiers.lock();
        self.copy.join(&self.compute)?;
        Ok((tiers, ranges))
    }

    /// Device page -> host slot on the copy stream, after all compute work queued so
    /// far (which may still be writing the page); returns when the copy has landed.
    pub fn evict(&self, page: u32, slot: u32) -> Result<()> {
        let (mut guard, [device_range, host_range]) = self.start_copy(page, slot)?;
        let tiers = &mut *guard;
        if let Some(event) = tiers.in_flight.remove(&page) {
            self.copy.wait(&event)?;
        }
        let host_bytes = &mut tiers.host.as_mut_slice()?[host_range];
        self.copy
            .memcpy_dtoh(&tiers.device.slice(device_range), host_bytes)?;
        self.copy.synchronize()?;
        self.stats.lock().evictions += 1;
        Ok(())
    }

    /// Host slot -> device page, queued on the copy stream; returns before it lands.
    pub fn load_back(&self, slot: u32, page: u32) -> Result<()> {
        let (mut guard, [device_range, host_range]) = self.start_copy(page, slot)?;
        let tiers = &mut *guard;
        // SAFETY of the host view: the host tier is only written by `evict`, which
        // finishes its copies before returning, and copies from it run on this stream.
        let host_bytes = &tiers.host.as_slice()?[host_range];
        self.copy
            .memcpy_htod(host_bytes, &mut tiers.device.slice_mut(device_range))?;
        let event = self.copy.record_event(None)?;
        tiers.in_flight.insert(page, event);
        self.stats.lock().load_backs += 1;
        Ok(())
    }

    /// Gathers `pages` in order on the compute stream; with `gate` the gather first
    /// waits on the load-back of every page it reads (see the type's docs).
    pub fn read_pages(&self, pages: &[u32], gate: bool) -> Result<Vec<u8>> {
        for &page in pages {
            self.device_range(page)?;
        }
        if pages.is_empty() {
            return Ok(Vec::new());
        }
        let mut tiers = self.tiers.lock();
        {
            let in_flight = &mut tiers.in_flight;
            let mut stats = self.stats.lock();
            for page in pages {
                let Some(event) = in_flight.get(page) else {
                    continue;
                };
                if event.is_complete() {
                    in_flight.remove(page);
                } else if gate {
                    self.compute.wait(event)?;
                    stats.gated_waits += 1;
                } else {
                    stats.ungated_reads_of_loading_pages += 1;
                }
            }
        }
        let total = pages.len() * self.page_bytes;
        let d_pages = self.compute.clone_htod(pages)?;
        let mut d_out = self.compute.alloc_zeros::<u8>(total)?;
        let num_pages = pages.len() as u32;
        let page_bytes = self.page_bytes as u32;
        let mut launch = self.compute.launch_builder(&self.gather);
        launch
            .arg(&tiers.device)
            .arg(&d_pages)
            .arg(&num_pages)
            .arg(&page_bytes)
            .arg(&mut d_out);
        // SAFETY: matches gather_pages in hicache_copy.cu; page ids were range-checked.
        unsafe { launch.launch(grid_for(total, ELEMENTWISE_THREADS)) }
            .context("launching gather_pages")?;
        let mut out = vec![0u8; total];
        self.compute.memcpy_dtoh(&d_out, &mut out)?;
        self.compute.synchronize()?;
        Ok(out)
    }
}
