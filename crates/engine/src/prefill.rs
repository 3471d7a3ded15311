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

use super::backend::{Backend, IndexKDtype, MAIN_DIM};
use super::hicache::{HostPage, HostTier, Loader, LoaderOptions};
use super::keys;
use super::kvpool::{DevicePool, PageState};
use std::collections::{HashMap, VecDeque};

#[derive(Debug, Clone, PartialEq)]
pub struct PrefillOptions {
    pub dtype: IndexKDtype,
    pub page_tokens: usize,
    /// Device pool capacity in bytes (main KV + index-K).
    pub pool_bytes: usize,
    /// Host tier capacity in pages.
    pub host_pages: usize,
    pub hicache: bool,
    pub index_k_sync: bool,
    pub loader: LoaderOptions,
    /// Prompt tokens computed per step, all requests together (chunked prefill).
    pub step_token_budget: usize,
}

impl PrefillOptions {
    /// The tuned defaults (see the module doc of `sim` for how they were measured).
    pub fn tuned(dtype: IndexKDtype, hicache: bool, index_k_sync: bool) -> Self {
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
        }
    }
}

/// The prompt's KV as shipped to decode.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptKv {
    pub dtype: IndexKDtype,
    pub page_tokens: usize,
    pub tokens: Vec<u32>,
    pub main: Vec<f32>,
    pub index_k: Vec<u8>,
    /// Pages shipped before their index-K load-back completed.
    pub stale_index_pages: usize,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct PrefillCounters {
    pub requests: u64,
    pub prompt_tokens: u64,
    pub cached_tokens: u64,
    pub computed_tokens: u64,
    pub loadback_pages: u64,
    pub loadback_requests: u64,
    pub evicted_pages: u64,
    pub dropped_pages: u64,
    pub stale_index_k_pages: u64,
    pub stale_index_k_requests: u64,
    pub loader_bytes: u64,
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
pub struct PrefillGauges {
    pub running: usize,
    pub queued: usize,
    pub used_pages: usize,
    pub total_pages: usize,
    pub host_pages: usize,
    pub loader_jobs: usize,
}

pub struct PrefillCore {
    options: PrefillOptions,
    pool: DevicePool,
    host: HostTier,
    loader: Loader,
    cache: HashMap<u64, Location>,
    queue: VecDeque<(u64, Vec<u32>)>,
    active: Vec<Active>,
    step: u64,
    pub counters: PrefillCounters,
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
    pub fn new(options: PrefillOptions) -> Self {
        PrefillCore {
            pool: DevicePool::new(options.pool_bytes, options.page_tokens, options.dtype),
            host: HostTier::new(options.host_pages),
            loader: Loader::new(options.loader),
            cache: HashMap::new(),
            queue: VecDeque::new(),
            active: Vec::new(),
            step: 0,
            counters: PrefillCounters::default(),
            options,
        }
    }

    pub fn options(&self) -> &PrefillOptions {
        &self.options
    }

    pub fn submit(&mut self, id: u64, tokens: Vec<u32>) {
        self.queue.push_back((id, tokens));
    }

    /// Drop a request the client no longer waits for (queued or running).
    pub fn cancel(&mut self, id: u64) {
        self.queue.retain(|(queued, _)| *queued != id);
        if let Some(index) = self.active.iter().position(|active| active.id == id) {
            let active = self.active.remove(index);
            self.release(&active, false);
        }
    }

    pub fn has_work(&self) -> bool {
        !self.queue.is_empty() || !self.active.is_empty() || self.loader.active_jobs() > 0
    }

    pub fn gauges(&self) -> PrefillGauges {
        PrefillGauges {
            running: self.active.len(),
            queued: self.queue.len(),
            used_pages: self.pool.used_pages(),
            total_pages: self.pool.capacity(),
            host_pages: self.host.len(),
            loader_jobs: self.loader.active_jobs(),
        }
    }

    pub fn current_step(&self) -> u64 {
        self.step
    }

    /// Free a page for a new occupant, evicting the LRU idle cached page if needed.
    fn allocate(&mut self, depth: usize) -> Option<usize> {
        if let Some(id) = self.pool.take_free(depth, self.step) {
            return Some(id);
        }
        let victim = self.pool.eviction_victim()?;
        let PageState::Cached(key) = self.pool.pages[victim].state else {
            unreachable!("victims are cached")
        };
        self.counters.evicted_pages += 1;
        if self.options.hicache {
            let page = &self.pool.pages[victim];
            let data = HostPage {
                tokens: page.tokens.clone(),
                main: page.main.clone(),
                index_k: page.index_k.clone(),
            };
            self.cache.insert(key, Location::Host);
            if let Some(dropped) = self.host.insert(key, data) {
                if self.cache.get(&dropped) == Some(&Location::Host) {
                    self.cache.remove(&dropped);
                }
            }
        } else {
            self.cache.remove(&key);
            self.counters.dropped_pages += 1;
        }
        self.pool.release_to_free(victim);
        self.pool.take_free(depth, self.step)
    }

    /// Try to admit one request: match its prefix, allocate its pages, queue load-backs.
    /// Returns false (and changes nothing) when the pool cannot hold it now.
    fn admit(&mut self, id: u64, tokens: Vec<u32>) -> bool {
        let page_tokens = self.options.page_tokens;
        let total_pages = tokens.len().div_ceil(page_tokens);
        let mut pages: Vec<usize> = Vec::with_capacity(total_pages);
        let mut loads = Vec::new();
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
                    let Some(source) = self.host.get(key) else {
                        break;
                    };
                    let Some(page) = self.allocate(page_index) else {
                        break;
                    };
                    let device = &mut self.pool.pages[page];
                    device.state = PageState::Cached(key);
                    device.main_rows_valid = 0;
                    device.index_rows_valid = 0;
                    self.cache.insert(key, Location::Device(page));
                    loads.push((page, source));
                    pages.push(page);
                }
                None => break,
            }
        }
        let matched = pages.len();
        for page_index in matched..total_pages {
            match self.allocate(page_index) {
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
                    self.loader.load_back(loads);
                    return false;
                }
            }
        }
        self.counters.requests += 1;
        self.counters.prompt_tokens += tokens.len() as u64;
        self.counters.cached_tokens += (matched * page_tokens) as u64;
        if !loads.is_empty() {
            self.counters.loadback_requests += 1;
            self.counters.loadback_pages += loads.len() as u64;
        }
        self.loader.load_back(loads);
        self.active.push(Active {
            id,
            tokens,
            pages,
            computed: matched * page_tokens,
        });
        true
    }

    fn ready(&self, active: &Active) -> bool {
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

    fn gather(&self, active: &Active) -> PromptKv {
        let page_tokens = self.options.page_tokens;
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
        kv
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
    pub fn step(
        &mut self,
        backend: &dyn Backend,
    ) -> anyhow::Result<Vec<(u64, Result<PromptKv, String>)>> {
        self.step += 1;
        let mut shipped = Vec::new();
        while let Some((id, tokens)) = self.queue.pop_front() {
            let length = tokens.len();
            if !self.admit(id, tokens.clone()) {
                if self.active.is_empty() && self.loader.active_jobs() == 0 {
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
        let events = self.loader.step(&mut self.pool);
        self.counters.loader_bytes += events.bytes_moved as u64;
        let mut budget = self.options.step_token_budget;
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
        let mut index = 0;
        while index < self.active.len() {
            let done = self.active[index].computed == self.active[index].tokens.len()
                && self.ready(&self.active[index]);
            if !done {
                index += 1;
                continue;
            }
            let active = self.active.remove(index);
            let kv = self.gather(&active);
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
