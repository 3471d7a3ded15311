//! HiCache: the host tier of prefill's prefix cache and the loader that copies evicted
//! pages back to the device.
//!
//! The loader runs in virtual time: every scheduler step it moves a fixed number of
//! bytes (`bytes_per_step`), shared round-robin between active copy jobs one chunk at a
//! time, so a page can be partially loaded and many concurrent load-backs make each one
//! slower. A load-back is two jobs over the same pages, as in the deployment the seeds
//! describe: the main-KV copy, and, once it completes, the index-K copy. Readers of a
//! page wait for its main-KV rows (the gate); they wait for its index-K rows only when
//! `SGLANG_DSV4_INDEX_K_HICACHE_SYNC=1`. Being virtual, the race's outcome depends only
//! on the order of arrivals and steps, never on host CPU speed.

use super::backend::MAIN_DIM;
use super::kvpool::{DevicePool, MAIN_ROW_BYTES};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// A page's data parked in host memory.
#[derive(Debug)]
pub(crate) struct HostPage {
    pub(crate) tokens: Vec<u32>,
    pub(crate) main: Vec<f32>,
    pub(crate) index_k: Vec<u8>,
}

/// Host tier: page key -> data, bounded, least recently stored dropped first.
pub(crate) struct HostTier {
    pages: HashMap<u64, (Arc<HostPage>, u64)>,
    capacity_pages: usize,
    clock: u64,
}

impl HostTier {
    pub(crate) fn new(capacity_pages: usize) -> Self {
        HostTier {
            pages: HashMap::new(),
            capacity_pages: capacity_pages.max(1),
            clock: 0,
        }
    }

    /// Store a page; returns the key dropped to make room, if any.
    pub(crate) fn insert(&mut self, key: u64, page: HostPage) -> Option<u64> {
        self.clock += 1;
        let mut dropped = None;
        if !self.pages.contains_key(&key) && self.pages.len() >= self.capacity_pages {
            if let Some((&oldest, _)) = self
                .pages
                .iter()
                .min_by_key(|(key, (_, stamp))| (*stamp, **key))
            {
                self.pages.remove(&oldest);
                dropped = Some(oldest);
            }
        }
        self.pages.insert(key, (Arc::new(page), self.clock));
        dropped
    }

    pub(crate) fn get(&mut self, key: u64) -> Option<Arc<HostPage>> {
        self.clock += 1;
        let clock = self.clock;
        self.pages.get_mut(&key).map(|(page, stamp)| {
            *stamp = clock;
            page.clone()
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.pages.len()
    }
}

/// The host tier of a backend-resident prefix cache (`PrefillCore` on a backend with
/// asynchronous load-backs): page key -> host slot of the backend's pool, bounded, least
/// recently used dropped first. Slots named by a load-back not yet queued are pinned:
/// the data must still be in the slot when the copy runs.
pub(crate) struct SlotTier {
    slots: HashMap<u64, (u32, u64)>,
    free: Vec<u32>,
    pinned: Vec<u32>,
    clock: u64,
}

impl SlotTier {
    pub(crate) fn new(capacity_slots: u32) -> Self {
        SlotTier {
            slots: HashMap::new(),
            free: (0..capacity_slots.max(1)).rev().collect(),
            pinned: Vec::new(),
            clock: 0,
        }
    }

    /// A slot for `key`'s page: a free one, else the least recently used unpinned one
    /// (whose key is returned as dropped). None when every slot is pinned.
    pub(crate) fn insert(&mut self, key: u64) -> Option<(u32, Option<u64>)> {
        self.clock += 1;
        if let Some((slot, stamp)) = self.slots.get_mut(&key) {
            *stamp = self.clock;
            return Some((*slot, None));
        }
        let (slot, dropped) = match self.free.pop() {
            Some(slot) => (slot, None),
            None => {
                let (&oldest, &(slot, _)) = self
                    .slots
                    .iter()
                    .filter(|(_, (slot, _))| !self.pinned.contains(slot))
                    .min_by_key(|(key, (_, stamp))| (*stamp, **key))?;
                self.slots.remove(&oldest);
                (slot, Some(oldest))
            }
        };
        self.slots.insert(key, (slot, self.clock));
        Some((slot, dropped))
    }

    /// The slot holding `key`'s page, pinned until [`SlotTier::unpin_all`].
    pub(crate) fn get_pinned(&mut self, key: u64) -> Option<u32> {
        self.clock += 1;
        let clock = self.clock;
        let (slot, stamp) = self.slots.get_mut(&key)?;
        *stamp = clock;
        self.pinned.push(*slot);
        Some(*slot)
    }

    /// The pinned slots' load-backs are queued: their data is safe to replace again.
    pub(crate) fn unpin_all(&mut self) {
        self.pinned.clear();
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }
}

/// Loader bandwidth model (virtual time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LoaderOptions {
    /// Bytes copied per scheduler step, all jobs together.
    pub(crate) bytes_per_step: usize,
    /// Bytes a job copies per round-robin turn.
    pub(crate) chunk_bytes: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CopyKind {
    MainKv,
    IndexK,
}

struct CopyJob {
    kind: CopyKind,
    /// (device page, source) in sequence order.
    pages: Vec<(usize, Arc<HostPage>)>,
    /// Rows copied so far over all pages.
    rows_done: usize,
}

/// What finished during a loader step.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct LoaderEvents {
    pub(crate) main_jobs_done: usize,
    pub(crate) index_jobs_done: usize,
    pub(crate) bytes_moved: usize,
}

pub(crate) struct Loader {
    options: LoaderOptions,
    jobs: VecDeque<CopyJob>,
    /// Round-robin position, kept across steps so no job is favoured.
    turn: usize,
}

impl Loader {
    pub(crate) fn new(options: LoaderOptions) -> Self {
        Loader {
            options,
            jobs: VecDeque::new(),
            turn: 0,
        }
    }

    /// Queue a load-back of `pages` (their device pages must already be marked as
    /// having no valid rows). The index-K copy is queued when the main copy completes.
    pub(crate) fn load_back(&mut self, pages: Vec<(usize, Arc<HostPage>)>) {
        if !pages.is_empty() {
            self.jobs.push_back(CopyJob {
                kind: CopyKind::MainKv,
                pages,
                rows_done: 0,
            });
        }
    }

    pub(crate) fn active_jobs(&self) -> usize {
        self.jobs.len()
    }

    /// Advance all jobs by one step's bandwidth.
    pub(crate) fn step(&mut self, pool: &mut DevicePool) -> LoaderEvents {
        let page_tokens = pool.page_tokens;
        let index_width = pool.dtype.bytes_per_token();
        let mut events = LoaderEvents::default();
        let mut budget = self.options.bytes_per_step;
        let mut turn = self.turn;
        while !self.jobs.is_empty() {
            if turn >= self.jobs.len() {
                turn = 0;
            }
            let job = &mut self.jobs[turn];
            let row_bytes = match job.kind {
                CopyKind::MainKv => MAIN_ROW_BYTES,
                CopyKind::IndexK => index_width,
            };
            let total_rows = job.pages.len() * page_tokens;
            let chunk_rows = (self.options.chunk_bytes / row_bytes).max(1);
            let rows = chunk_rows
                .min(total_rows - job.rows_done)
                .min(budget / row_bytes);
            if rows == 0 {
                break;
            }
            for row in job.rows_done..job.rows_done + rows {
                let (device, source) = &job.pages[row / page_tokens];
                let r = row % page_tokens;
                let page = &mut pool.pages[*device];
                match job.kind {
                    CopyKind::MainKv => {
                        page.tokens[r] = source.tokens[r];
                        page.main[r * MAIN_DIM..(r + 1) * MAIN_DIM]
                            .copy_from_slice(&source.main[r * MAIN_DIM..(r + 1) * MAIN_DIM]);
                        page.main_rows_valid = r + 1;
                    }
                    CopyKind::IndexK => {
                        page.index_k[r * index_width..(r + 1) * index_width].copy_from_slice(
                            &source.index_k[r * index_width..(r + 1) * index_width],
                        );
                        page.index_rows_valid = r + 1;
                    }
                }
            }
            job.rows_done += rows;
            budget -= rows * row_bytes;
            events.bytes_moved += rows * row_bytes;
            if job.rows_done == total_rows {
                let finished = self.jobs.remove(turn).expect("job exists");
                match finished.kind {
                    CopyKind::MainKv => {
                        events.main_jobs_done += 1;
                        self.jobs.push_back(CopyJob {
                            kind: CopyKind::IndexK,
                            pages: finished.pages,
                            rows_done: 0,
                        });
                    }
                    CopyKind::IndexK => events.index_jobs_done += 1,
                }
            } else {
                turn += 1;
            }
        }
        self.turn = turn;
        events
    }
}

#[cfg(test)]
mod tests {
    use super::super::backend::IndexKDtype;
    use super::*;

    fn host_page(page_tokens: usize, dtype: IndexKDtype, fill: u8) -> Arc<HostPage> {
        Arc::new(HostPage {
            tokens: vec![fill as u32; page_tokens],
            main: vec![fill as f32; page_tokens * MAIN_DIM],
            index_k: vec![fill; page_tokens * dtype.bytes_per_token()],
        })
    }

    #[test]
    fn main_copy_gates_then_index_copy_follows_chunk_by_chunk() {
        let dtype = IndexKDtype::Bf16;
        let mut pool = DevicePool::new(4 * DevicePool::page_bytes(4, dtype), 4, dtype);
        let page = pool.take_free(0, 0).unwrap();
        pool.pages[page].main_rows_valid = 0;
        pool.pages[page].index_rows_valid = 0;
        // 2 rows of main per step.
        let mut loader = Loader::new(LoaderOptions {
            bytes_per_step: 2 * MAIN_ROW_BYTES,
            chunk_bytes: MAIN_ROW_BYTES,
        });
        loader.load_back(vec![(page, host_page(4, dtype, 9))]);
        assert_eq!(loader.step(&mut pool).main_jobs_done, 0);
        assert_eq!(pool.pages[page].main_rows_valid, 2);
        assert_eq!(loader.step(&mut pool).main_jobs_done, 1);
        assert_eq!(pool.pages[page].index_rows_valid, 0);
        assert_eq!(pool.pages[page].tokens, vec![9; 4]);
        loader.step(&mut pool);
        assert_eq!(
            pool.pages[page].index_rows_valid, 2,
            "partially loaded index-K page"
        );
        assert_eq!(loader.step(&mut pool).index_jobs_done, 1);
        assert_eq!(pool.pages[page].index_k, vec![9; 4 * 256]);
        assert_eq!(loader.active_jobs(), 0);
    }

    #[test]
    fn concurrent_jobs_share_bandwidth() {
        let dtype = IndexKDtype::Fp8;
        let mut pool = DevicePool::new(8 * DevicePool::page_bytes(4, dtype), 4, dtype);
        let mut loader = Loader::new(LoaderOptions {
            bytes_per_step: 4 * MAIN_ROW_BYTES,
            chunk_bytes: MAIN_ROW_BYTES,
        });
        for fill in 0..2u8 {
            let page = pool.take_free(0, 0).unwrap();
            pool.pages[page].main_rows_valid = 0;
            loader.load_back(vec![(page, host_page(4, dtype, fill))]);
        }
        // Alone a job would finish its main copy in one step; two share the bandwidth.
        assert_eq!(loader.step(&mut pool).main_jobs_done, 0);
        assert_eq!(loader.step(&mut pool).main_jobs_done, 2);
    }

    #[test]
    fn slot_tier_reuses_the_oldest_unpinned_slot() {
        let mut tier = SlotTier::new(2);
        assert_eq!(tier.insert(10), Some((0, None)));
        assert_eq!(tier.insert(11), Some((1, None)));
        assert_eq!(
            tier.insert(10),
            Some((0, None)),
            "a stored key keeps its slot"
        );
        // 11 is the oldest now, but pinned by a load-back not queued yet.
        assert_eq!(tier.get_pinned(11), Some(1));
        assert_eq!(tier.insert(12), Some((0, Some(10))));
        assert_eq!(tier.insert(13), Some((0, Some(12))), "slot 1 stays pinned");
        tier.unpin_all();
        assert_eq!(tier.insert(14), Some((1, Some(11))));
        assert_eq!(tier.len(), 2);
        let mut one = SlotTier::new(1);
        assert_eq!(one.insert(1), Some((0, None)));
        one.get_pinned(1);
        assert_eq!(one.insert(2), None, "every slot pinned");
    }

    #[test]
    fn host_tier_drops_the_oldest_when_full() {
        let mut tier = HostTier::new(2);
        let page = || HostPage {
            tokens: vec![],
            main: vec![],
            index_k: vec![],
        };
        assert_eq!(tier.insert(1, page()), None);
        assert_eq!(tier.insert(2, page()), None);
        tier.get(1);
        assert_eq!(tier.insert(3, page()), Some(2));
        assert_eq!(tier.len(), 2);
    }
}
