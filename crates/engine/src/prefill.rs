//! The prefill role's scheduler core: prefix cache (hash-chained full pages, shared
//! across sessions, refcounted, LRU), the HiCache host tier and loader, chunked forward
//! over the prompt's new tokens, and shipping of the prompt's main KV + index-K.
//!
//! One compute thread owns a `PrefillCore` and calls `step` in a loop. A step admits
//! queued requests (prefix match, page allocation, load-backs), advances the loader,
//! runs a forward over ready requests within a token budget, and ships the finished
//! ones. A request is ready once every page it reads has its main-KV rows (the gate);
//! it waits for the index-K rows only with `index_k_sync` (the fix). What it ships is
//! whatever bytes its index-K pages hold at that moment: a freshly allocated page still
//! holds its previous occupant's rows until the index-K copy reaches them.
//!
//! Where the pages' bytes live ([`Store`]): on the CPU (and in every CPU test) in host
//! memory with the virtual-time `hicache::Loader`, the deterministic reference. On a
//! backend whose load-backs are asynchronous (CUDA, `PagedPools::load_back_is_async`) in
//! one of the backend's paged pools ([`PrefillCore::for_backend`]): evictions go to the
//! pool's page-locked host slots, a request's load-backs are one job on the copy stream
//! (all main KV, then all index-K), new rows are written on the device, and the finished
//! prompt is gathered by a kernel whose stream waits on the main-KV load-back event and,
//! only with `index_k_sync`, on the index-K one. The race is then the GPU's own: the
//! gather can run while the copy engine is still writing the index-K pages, and the
//! kernel counts it through the pages' generation tags (`backend::paged`). The
//! scheduler's bookkeeping (prefix cache, LRU, refcounts) is the same in both.

use super::backend::{Backend, IndexKDtype, PoolId, PoolSpec, PoolStats, MAIN_DIM};
use super::hicache::{HostPage, HostTier, Loader, LoaderOptions, SlotTier};
use super::keys;
use super::kvpool::{DevicePool, PageState};
use anyhow::Context;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PrefillOptions {
    pub(crate) dtype: IndexKDtype,
    pub(crate) page_tokens: usize,
    /// Device pool capacity in bytes (main KV + index-K).
    pub(crate) pool_bytes: usize,
    /// Host tier capacity in pages.
    pub(crate) host_pages: usize,
    pub(crate) hicache: bool,
    pub(crate) index_k_sync: bool,
    pub(crate) loader: LoaderOptions,
    /// Prompt tokens computed per step, all requests together (chunked prefill).
    pub(crate) step_token_budget: usize,
    /// Resident store only: modelled device time of the forward per token computed in a
    /// step, queued on the compute stream before the step's gathers
    /// (`Backend::model_forward_delay`). 0: the gathers follow the writes at once.
    pub(crate) forward_ns_per_token: u64,
}

impl PrefillOptions {
    /// The tuned defaults (see the module doc of `sim` for how they were measured).
    pub(crate) fn tuned(dtype: IndexKDtype, hicache: bool, index_k_sync: bool) -> Self {
        PrefillOptions {
            dtype,
            page_tokens: 64,
            pool_bytes: 24 << 20,
            host_pages: 1 << 16,
            hicache,
            index_k_sync,
            loader: LoaderOptions {
                bytes_per_step: 512 << 10,
                chunk_bytes: 16 << 10,
            },
            step_token_budget: 1024,
            forward_ns_per_token: 0,
        }
    }
}

/// The prompt's KV as shipped to decode.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct PromptKv {
    pub(crate) dtype: IndexKDtype,
    pub(crate) page_tokens: usize,
    pub(crate) tokens: Vec<u32>,
    pub(crate) main: Vec<f32>,
    pub(crate) index_k: Vec<u8>,
    /// Pages shipped before their index-K load-back completed.
    pub(crate) stale_index_pages: usize,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct PrefillCounters {
    pub(crate) requests: u64,
    pub(crate) prompt_tokens: u64,
    pub(crate) cached_tokens: u64,
    pub(crate) computed_tokens: u64,
    pub(crate) loadback_pages: u64,
    pub(crate) loadback_requests: u64,
    pub(crate) evicted_pages: u64,
    pub(crate) dropped_pages: u64,
    pub(crate) stale_index_k_pages: u64,
    pub(crate) stale_index_k_requests: u64,
    pub(crate) loader_bytes: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Location {
    Device(usize),
    Host,
}

struct Active {
    id: u64,
    tokens: Vec<u32>,
    /// Device page per page index of the prompt.
    pages: Vec<usize>,
    /// First position still to compute.
    computed: usize,
}

/// Gauges of the scheduler, for /metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct PrefillGauges {
    pub(crate) running: usize,
    pub(crate) queued: usize,
    pub(crate) used_pages: usize,
    pub(crate) total_pages: usize,
    pub(crate) host_pages: usize,
    pub(crate) loader_jobs: usize,
}

/// Where the prefix cache's page bytes live (see the module doc).
enum Store {
    /// Host memory: `pool`'s pages hold the bytes, the loader runs in virtual time.
    Virtual { host: HostTier, loader: Loader },
    /// A backend pool: `pool`'s pages are bookkeeping only, page i of it is page i of
    /// the backend's pool; the host tier is the backend pool's slots.
    Resident { pool: PoolId, slots: SlotTier },
}

/// Host slots of a resident pool per device page: the served workloads reuse far fewer
/// evicted pages than this, and each slot is page-locked memory (33 KiB with bf16).
const RESIDENT_SLOTS_PER_PAGE: usize = 8;

pub(crate) struct PrefillCore {
    options: PrefillOptions,
    pool: DevicePool,
    store: Store,
    cache: HashMap<u64, Location>,
    queue: VecDeque<(u64, Vec<u32>)>,
    active: Vec<Active>,
    step: u64,
    pub(crate) counters: PrefillCounters,
}

fn chain_key(previous: u64, tokens: &[u32]) -> u64 {
    // FNV-1a over the previous key and this page's tokens.
    let mut hash = previous ^ 0xcbf2_9ce4_8422_2325;
    for token in tokens {
        for byte in token.to_le_bytes() {
            hash ^= byte as u64;
            hash = hash.wrapping_mul(0x0000_0100_0000_01B3);
        }
    }
    hash
}

impl PrefillCore {
    /// The virtual-time store (the CPU reference).
    pub(crate) fn new(options: PrefillOptions) -> Self {
        let pool = DevicePool::new(options.pool_bytes, options.page_tokens, options.dtype);
        let store = Store::Virtual {
            host: HostTier::new(options.host_pages),
            loader: Loader::new(options.loader),
        };
        Self::with_store(options, pool, store)
    }

    fn with_store(options: PrefillOptions, pool: DevicePool, store: Store) -> Self {
        PrefillCore {
            pool,
            store,
            cache: HashMap::new(),
            queue: VecDeque::new(),
            active: Vec::new(),
            step: 0,
            counters: PrefillCounters::default(),
            options,
        }
    }

    /// The store `backend` calls for: a pool of the backend when its load-backs are
    /// asynchronous (CUDA), else the virtual-time one ([`PrefillCore::new`]).
    pub(crate) fn for_backend(
        options: PrefillOptions,
        backend: &dyn Backend,
    ) -> anyhow::Result<Self> {
        if backend.load_back_is_async() {
            Self::resident(options, backend)
        } else {
            Ok(Self::new(options))
        }
    }

    /// The store in a pool of `backend` (on any backend; the CPU's pools never read
    /// stale, which the tests use to check the bookkeeping against the reference).
    /// Same page count as the virtual store for the same options.
    pub(crate) fn resident(options: PrefillOptions, backend: &dyn Backend) -> anyhow::Result<Self> {
        let pool = DevicePool::bookkeeping(options.pool_bytes, options.page_tokens, options.dtype);
        let host_pages = options
            .host_pages
            .min(pool.capacity() * RESIDENT_SLOTS_PER_PAGE)
            .max(1);
        let spec = PoolSpec {
            dtype: options.dtype,
            page_tokens: options.page_tokens,
            device_pages: pool.capacity(),
            host_pages,
        };
        let id = backend.create_pool(spec).with_context(|| {
            format!(
                "creating prefill's {} pool ({} pages of {} tokens, {} host slots)",
                backend.name(),
                spec.device_pages,
                spec.page_tokens,
                host_pages
            )
        })?;
        let store = Store::Resident {
            pool: id,
            slots: SlotTier::new(host_pages as u32),
        };
        Ok(Self::with_store(options, pool, store))
    }

    /// True when the pages live in a backend pool ([`PrefillCore::resident`]).
    pub(crate) fn is_resident(&self) -> bool {
        matches!(self.store, Store::Resident { .. })
    }

    /// The backend pool's counters (stale reads counted by the reading kernel), when
    /// resident.
    pub(crate) fn pool_stats(&self, backend: &dyn Backend) -> Option<anyhow::Result<PoolStats>> {
        match &self.store {
            Store::Resident { pool, .. } => Some(backend.pool_stats(*pool)),
            Store::Virtual { .. } => None,
        }
    }

    /// Frees the backend pool of a resident store (its page-locked host tier with it).
    /// Nothing to do for the virtual store.
    #[cfg(test)]
    pub(crate) fn close(self, backend: &dyn Backend) -> anyhow::Result<()> {
        match self.store {
            Store::Resident { pool, .. } => backend.release_pool(pool),
            Store::Virtual { .. } => Ok(()),
        }
    }

    fn loads_in_flight(&self) -> usize {
        match &self.store {
            Store::Virtual { loader, .. } => loader.active_jobs(),
            Store::Resident { .. } => 0,
        }
    }

    pub(crate) fn submit(&mut self, id: u64, tokens: Vec<u32>) {
        self.queue.push_back((id, tokens));
    }

    /// Drop a request the client no longer waits for (queued or running).
    pub(crate) fn cancel(&mut self, id: u64) {
        self.queue.retain(|(queued, _)| *queued != id);
        if let Some(index) = self.active.iter().position(|active| active.id == id) {
            let active = self.active.remove(index);
            self.release(&active, false);
        }
    }

    pub(crate) fn has_work(&self) -> bool {
        !self.queue.is_empty() || !self.active.is_empty() || self.loads_in_flight() > 0
    }

    pub(crate) fn gauges(&self) -> PrefillGauges {
        PrefillGauges {
            running: self.active.len(),
            queued: self.queue.len(),
            used_pages: self.pool.used_pages(),
            total_pages: self.pool.capacity(),
            host_pages: match &self.store {
                Store::Virtual { host, .. } => host.len(),
                Store::Resident { slots, .. } => slots.len(),
            },
            loader_jobs: self.loads_in_flight(),
        }
    }

    /// Free a page for a new occupant, evicting the LRU idle cached page if needed.
    fn allocate(&mut self, backend: &dyn Backend, depth: usize) -> anyhow::Result<Option<usize>> {
        if let Some(id) = self.pool.take_free(depth, self.step) {
            return Ok(Some(id));
        }
        let Some(victim) = self.pool.eviction_victim() else {
            return Ok(None);
        };
        let PageState::Cached(key) = self.pool.pages[victim].state else {
            unreachable!("victims are cached")
        };
        self.counters.evicted_pages += 1;
        let mut kept = false;
        if self.options.hicache {
            let dropped = match &mut self.store {
                Store::Virtual { host, .. } => {
                    let page = &self.pool.pages[victim];
                    let data = HostPage {
                        tokens: page.tokens.clone(),
                        main: page.main.clone(),
                        index_k: page.index_k.clone(),
                    };
                    kept = true;
                    host.insert(key, data)
                }
                Store::Resident { pool, slots } => match slots.insert(key) {
                    Some((slot, dropped)) => {
                        backend.evict_page(*pool, victim as u32, slot)?;
                        kept = true;
                        dropped
                    }
                    // Every slot awaits a load-back: the page is dropped instead.
                    None => None,
                },
            };
            if kept {
                self.cache.insert(key, Location::Host);
            }
            if let Some(dropped) = dropped {
                if self.cache.get(&dropped) == Some(&Location::Host) {
                    self.cache.remove(&dropped);
                }
            }
        }
        if !kept {
            self.cache.remove(&key);
            self.counters.dropped_pages += 1;
        }
        self.pool.release_to_free(victim);
        Ok(self.pool.take_free(depth, self.step))
    }

    /// Queues the load-backs `admit` started: the virtual loader's job, or one job on
    /// the backend's copy stream.
    fn queue_loads(
        &mut self,
        backend: &dyn Backend,
        virtual_loads: Vec<(usize, Arc<HostPage>)>,
        slot_loads: &[(u32, u32)],
    ) -> anyhow::Result<()> {
        match &mut self.store {
            Store::Virtual { loader, .. } => loader.load_back(virtual_loads),
            Store::Resident { pool, slots } => {
                let queued = backend.load_back_pages(*pool, slot_loads);
                slots.unpin_all();
                queued?;
                let page_bytes =
                    DevicePool::page_bytes(self.options.page_tokens, self.options.dtype);
                self.counters.loader_bytes += (slot_loads.len() * page_bytes) as u64;
            }
        }
        Ok(())
    }

    /// Try to admit one request: match its prefix, allocate its pages, queue load-backs.
    /// Returns false (and changes nothing) when the pool cannot hold it now.
    fn admit(&mut self, backend: &dyn Backend, id: u64, tokens: Vec<u32>) -> anyhow::Result<bool> {
        let page_tokens = self.options.page_tokens;
        let total_pages = tokens.len().div_ceil(page_tokens);
        let mut pages: Vec<usize> = Vec::with_capacity(total_pages);
        let mut virtual_loads = Vec::new();
        let mut slot_loads = Vec::new();
        let mut key = 0u64;
        // Keep at least the last token to compute.
        let matchable = tokens.len().saturating_sub(1) / page_tokens;
        for page_index in 0..matchable {
            key = chain_key(
                key,
                &tokens[page_index * page_tokens..(page_index + 1) * page_tokens],
            );
            match self.cache.get(&key).copied() {
                Some(Location::Device(page)) => {
                    self.pool.pages[page].refs += 1;
                    pages.push(page);
                }
                Some(Location::Host) => {
                    let source = match &mut self.store {
                        Store::Virtual { host, .. } => host.get(key).map(Ok),
                        Store::Resident { slots, .. } => slots.get_pinned(key).map(Err),
                    };
                    let Some(source) = source else {
                        break;
                    };
                    let Some(page) = self.allocate(backend, page_index)? else {
                        break;
                    };
                    let device = &mut self.pool.pages[page];
                    device.state = PageState::Cached(key);
                    self.cache.insert(key, Location::Device(page));
                    match source {
                        Ok(data) => {
                            device.main_rows_valid = 0;
                            device.index_rows_valid = 0;
                            virtual_loads.push((page, data));
                        }
                        // The backend's gates stand for the valid-row counts.
                        Err(slot) => slot_loads.push((slot, page as u32)),
                    }
                    pages.push(page);
                }
                None => break,
            }
        }
        let matched = pages.len();
        for page_index in matched..total_pages {
            match self.allocate(backend, page_index)? {
                Some(page) => pages.push(page),
                None => {
                    // Undo: unpin matched pages, free fresh ones; started loads stay cached.
                    for (index, page) in pages.iter().enumerate() {
                        if index < matched {
                            self.pool.pages[*page].refs -= 1;
                        } else {
                            self.pool.release_to_free(*page);
                        }
                    }
                    self.queue_loads(backend, virtual_loads, &slot_loads)?;
                    return Ok(false);
                }
            }
        }
        self.counters.requests += 1;
        self.counters.prompt_tokens += tokens.len() as u64;
        self.counters.cached_tokens += (matched * page_tokens) as u64;
        let loads = virtual_loads.len() + slot_loads.len();
        if loads > 0 {
            self.counters.loadback_requests += 1;
            self.counters.loadback_pages += loads as u64;
        }
        self.queue_loads(backend, virtual_loads, &slot_loads)?;
        self.active.push(Active {
            id,
            tokens,
            pages,
            computed: matched * page_tokens,
        });
        Ok(true)
    }

    fn ready(&self, active: &Active) -> bool {
        if self.is_resident() {
            // The backend orders every read after the load-backs it must wait for.
            return true;
        }
        let full = self.options.page_tokens;
        active.pages.iter().all(|&page| {
            let page = &self.pool.pages[page];
            page.main_rows_valid == full
                && (!self.options.index_k_sync || page.index_rows_valid == full)
        })
    }

    /// Compute positions `from..to` of a request into its pages.
    fn forward(
        &mut self,
        backend: &dyn Backend,
        index: usize,
        from: usize,
        to: usize,
    ) -> anyhow::Result<()> {
        let active = &self.active[index];
        let page_tokens = self.options.page_tokens;
        let dtype = self.options.dtype;
        let width = dtype.bytes_per_token();
        let window = &active.tokens[..to];
        let index_keys = keys::index_keys(window, from);
        let main_keys = keys::main_keys(window, from);
        if let Store::Resident { pool, .. } = &self.store {
            let mut position = from;
            while position < to {
                let row = position % page_tokens;
                let end = to.min(position - row + page_tokens);
                let (a, b) = (position - from, end - from);
                backend.write_rows(
                    *pool,
                    active.pages[position / page_tokens] as u32,
                    row,
                    &main_keys[a * MAIN_DIM..b * MAIN_DIM],
                    &index_keys[a * super::backend::INDEX_DIM..b * super::backend::INDEX_DIM],
                )?;
                position = end;
            }
            self.active[index].computed = to;
            self.counters.computed_tokens += (to - from) as u64;
            return Ok(());
        }
        let mut quantized = vec![0u8; (to - from) * width];
        backend.quantize_index_k(dtype, &index_keys, &mut quantized)?;
        let pages = active.pages.clone();
        let tokens: Vec<u32> = active.tokens[from..to].to_vec();
        for (offset, position) in (from..to).enumerate() {
            self.pool.write_row(
                pages[position / page_tokens],
                position % page_tokens,
                tokens[offset],
                &main_keys[offset * MAIN_DIM..(offset + 1) * MAIN_DIM],
                &quantized[offset * width..(offset + 1) * width],
            );
        }
        self.active[index].computed = to;
        self.counters.computed_tokens += (to - from) as u64;
        Ok(())
    }

    fn gather(&self, backend: &dyn Backend, active: &Active) -> anyhow::Result<PromptKv> {
        let page_tokens = self.options.page_tokens;
        if let Store::Resident { pool, .. } = &self.store {
            let pages: Vec<u32> = active.pages.iter().map(|&page| page as u32).collect();
            let read = backend.gather_sequence(
                *pool,
                &pages,
                active.tokens.len(),
                self.options.index_k_sync,
            )?;
            return Ok(PromptKv {
                dtype: self.options.dtype,
                page_tokens,
                tokens: active.tokens.clone(),
                main: read.main,
                index_k: read.index_k,
                stale_index_pages: read.stale_index_pages,
            });
        }
        let width = self.options.dtype.bytes_per_token();
        let n = active.tokens.len();
        let mut kv = PromptKv {
            dtype: self.options.dtype,
            page_tokens,
            tokens: Vec::with_capacity(n),
            main: Vec::with_capacity(n * MAIN_DIM),
            index_k: Vec::with_capacity(n * width),
            stale_index_pages: 0,
        };
        for (page_index, &page) in active.pages.iter().enumerate() {
            let rows = page_tokens.min(n - page_index * page_tokens);
            let page = &self.pool.pages[page];
            if page.index_rows_valid < page_tokens {
                kv.stale_index_pages += 1;
            }
            kv.tokens.extend_from_slice(&page.tokens[..rows]);
            kv.main.extend_from_slice(&page.main[..rows * MAIN_DIM]);
            kv.index_k.extend_from_slice(&page.index_k[..rows * width]);
        }
        Ok(kv)
    }

    /// Unpin a request's pages; with `cache_new`, its new full pages join the prefix cache.
    fn release(&mut self, active: &Active, cache_new: bool) {
        let page_tokens = self.options.page_tokens;
        let mut key = 0u64;
        let full_pages = active.tokens.len() / page_tokens;
        for (page_index, &page) in active.pages.iter().enumerate() {
            if page_index < full_pages {
                key = chain_key(
                    key,
                    &active.tokens[page_index * page_tokens..(page_index + 1) * page_tokens],
                );
            }
            let state = self.pool.pages[page].state;
            self.pool.pages[page].last_use = self.step;
            match state {
                PageState::Cached(_) => self.pool.pages[page].refs -= 1,
                PageState::Private
                    if cache_new && page_index < full_pages && !self.cache.contains_key(&key) =>
                {
                    self.pool.pages[page].state = PageState::Cached(key);
                    self.pool.pages[page].refs = 0;
                    self.cache.insert(key, Location::Device(page));
                }
                PageState::Private => self.pool.release_to_free(page),
                PageState::Free => {}
            }
        }
    }

    /// One scheduler step. Returns the requests finished in it: their KV, or why they
    /// cannot be served.
    pub(crate) fn step(
        &mut self,
        backend: &dyn Backend,
    ) -> anyhow::Result<Vec<(u64, Result<PromptKv, String>)>> {
        self.step += 1;
        let mut shipped = Vec::new();
        while let Some((id, tokens)) = self.queue.pop_front() {
            let length = tokens.len();
            if !self.admit(backend, id, tokens.clone())? {
                if self.active.is_empty() && self.loads_in_flight() == 0 {
                    shipped.push((id, Err(format!(
                        "prompt of {length} tokens does not fit the prefill pool ({} pages of {} tokens)",
                        self.pool.capacity(),
                        self.options.page_tokens
                    ))));
                    continue;
                }
                self.queue.push_front((id, tokens));
                break;
            }
        }
        if let Store::Virtual { loader, .. } = &mut self.store {
            let events = loader.step(&mut self.pool);
            self.counters.loader_bytes += events.bytes_moved as u64;
        }
        let mut budget = self.options.step_token_budget;
        let computed_before = self.counters.computed_tokens;
        let mut index = 0;
        while index < self.active.len() && budget > 0 {
            if self.ready(&self.active[index]) {
                let from = self.active[index].computed;
                let to = self.active[index].tokens.len().min(from + budget);
                if to > from {
                    self.forward(backend, index, from, to)?;
                    budget -= to - from;
                }
            }
            index += 1;
        }
        let computed = self.counters.computed_tokens - computed_before;
        if self.is_resident() && computed > 0 && self.options.forward_ns_per_token > 0 {
            backend.model_forward_delay(computed * self.options.forward_ns_per_token)?;
        }
        let mut index = 0;
        while index < self.active.len() {
            let done = self.active[index].computed == self.active[index].tokens.len()
                && self.ready(&self.active[index]);
            if !done {
                index += 1;
                continue;
            }
            let active = self.active.remove(index);
            let kv = match self.gather(backend, &active) {
                Ok(kv) => kv,
                Err(error) => {
                    self.release(&active, false);
                    return Err(error);
                }
            };
            if kv.stale_index_pages > 0 {
                self.counters.stale_index_k_pages += kv.stale_index_pages as u64;
                self.counters.stale_index_k_requests += 1;
            }
            self.release(&active, true);
            shipped.push((active.id, Ok(kv)));
        }
        Ok(shipped)
    }
}

#[cfg(test)]
mod tests;
