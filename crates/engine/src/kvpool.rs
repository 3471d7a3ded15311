//! Prefill's paged device pool: fixed capacity in BYTES (so bf16's bigger index-K rows
//! mean fewer pages than fp8's), pages of `page_tokens` rows each holding the main KV
//! (token id + MAIN_DIM f32 main key) and the quantized index-K. A freed page keeps its
//! bytes: the next occupant sees the previous one's data until it overwrites it.

use super::backend::{IndexKDtype, MAIN_DIM};

/// Bytes of one main-KV row: the main key plus the token id stored with it.
pub(crate) const MAIN_ROW_BYTES: usize = MAIN_DIM * 4 + 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PageState {
    Free,
    /// Owned by one in-flight request, not (yet) in the prefix cache.
    Private,
    /// In the prefix cache under this chained page key.
    Cached(u64),
}

#[derive(Debug, Clone)]
pub(crate) struct DevicePage {
    pub(crate) tokens: Vec<u32>,
    pub(crate) main: Vec<f32>,
    pub(crate) index_k: Vec<u8>,
    pub(crate) state: PageState,
    /// Requests currently holding the page.
    pub(crate) refs: u32,
    /// Scheduler step of the last use (LRU).
    pub(crate) last_use: u64,
    /// Page index inside its sequence (eviction prefers deeper pages on ties).
    pub(crate) depth: usize,
    /// Rows whose main KV / index-K hold this page's own data (a load-back fills them
    /// chunk by chunk; computed pages are complete at once).
    pub(crate) main_rows_valid: usize,
    pub(crate) index_rows_valid: usize,
}

pub(crate) struct DevicePool {
    pub(crate) page_tokens: usize,
    pub(crate) dtype: IndexKDtype,
    pub(crate) pages: Vec<DevicePage>,
    free: Vec<usize>,
}

impl DevicePool {
    pub(crate) fn page_bytes(page_tokens: usize, dtype: IndexKDtype) -> usize {
        page_tokens * (MAIN_ROW_BYTES + dtype.bytes_per_token())
    }

    /// As many pages as fit in `pool_bytes` (at least one).
    pub(crate) fn new(pool_bytes: usize, page_tokens: usize, dtype: IndexKDtype) -> Self {
        Self::with_pages(pool_bytes, page_tokens, dtype, true)
    }

    /// The same pages as [`DevicePool::new`] without their bytes: the bookkeeping of a
    /// pool whose data lives with a backend (prefill's resident store). `write_row` and
    /// the byte fields must not be used on it.
    pub(crate) fn bookkeeping(pool_bytes: usize, page_tokens: usize, dtype: IndexKDtype) -> Self {
        Self::with_pages(pool_bytes, page_tokens, dtype, false)
    }

    fn with_pages(pool_bytes: usize, page_tokens: usize, dtype: IndexKDtype, bytes: bool) -> Self {
        let count = (pool_bytes / Self::page_bytes(page_tokens, dtype)).max(1);
        let rows = if bytes { page_tokens } else { 0 };
        let pages = (0..count)
            .map(|_| DevicePage {
                tokens: vec![0; rows],
                main: vec![0.0; rows * MAIN_DIM],
                index_k: vec![0; rows * dtype.bytes_per_token()],
                state: PageState::Free,
                refs: 0,
                last_use: 0,
                depth: 0,
                main_rows_valid: page_tokens,
                index_rows_valid: page_tokens,
            })
            .collect();
        // Pop from the end: page 0 is handed out first.
        DevicePool {
            page_tokens,
            dtype,
            pages,
            free: (0..count).rev().collect(),
        }
    }

    pub(crate) fn capacity(&self) -> usize {
        self.pages.len()
    }

    /// Take a free page (its bytes are whatever the previous occupant left).
    pub(crate) fn take_free(&mut self, depth: usize, step: u64) -> Option<usize> {
        let id = self.free.pop()?;
        let page = &mut self.pages[id];
        page.state = PageState::Private;
        page.refs = 1;
        page.depth = depth;
        page.last_use = step;
        page.main_rows_valid = self.page_tokens;
        page.index_rows_valid = self.page_tokens;
        Some(id)
    }

    pub(crate) fn release_to_free(&mut self, id: usize) {
        let page = &mut self.pages[id];
        page.state = PageState::Free;
        page.refs = 0;
        self.free.push(id);
    }

    /// The least recently used unreferenced, fully valid cached page (deeper first on ties).
    pub(crate) fn eviction_victim(&self) -> Option<usize> {
        self.pages
            .iter()
            .enumerate()
            .filter(|(_, page)| {
                matches!(page.state, PageState::Cached(_))
                    && page.refs == 0
                    && page.main_rows_valid == self.page_tokens
                    && page.index_rows_valid == self.page_tokens
            })
            .min_by_key(|(id, page)| (page.last_use, std::cmp::Reverse(page.depth), *id))
            .map(|(id, _)| id)
    }

    /// Write computed rows (position `row` of page `id`).
    pub(crate) fn write_row(
        &mut self,
        id: usize,
        row: usize,
        token: u32,
        main_key: &[f32],
        index_row: &[u8],
    ) {
        let width = self.dtype.bytes_per_token();
        let page = &mut self.pages[id];
        page.tokens[row] = token;
        page.main[row * MAIN_DIM..(row + 1) * MAIN_DIM].copy_from_slice(main_key);
        page.index_k[row * width..(row + 1) * width].copy_from_slice(index_row);
    }

    pub(crate) fn used_pages(&self) -> usize {
        self.pages.len() - self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_capacity_gives_fp8_more_pages() {
        let bf16 = DevicePool::new(1 << 20, 64, IndexKDtype::Bf16);
        let fp8 = DevicePool::new(1 << 20, 64, IndexKDtype::Fp8);
        assert_eq!(bf16.capacity(), (1 << 20) / (64 * (260 + 256)));
        assert_eq!(fp8.capacity(), (1 << 20) / (64 * (260 + 132)));
        assert!(fp8.capacity() > bf16.capacity());
    }

    #[test]
    fn freed_pages_keep_stale_bytes_and_lru_prefers_deeper_pages() {
        let mut pool = DevicePool::new(
            4 * DevicePool::page_bytes(2, IndexKDtype::Fp8),
            2,
            IndexKDtype::Fp8,
        );
        let a = pool.take_free(0, 1).unwrap();
        pool.write_row(a, 0, 42, &[1.0; MAIN_DIM], &[7; 132]);
        pool.release_to_free(a);
        let again = pool.take_free(0, 2).unwrap();
        assert_eq!(again, a);
        assert_eq!(pool.pages[a].tokens[0], 42);
        let b = pool.take_free(1, 2).unwrap();
        for (id, key) in [(a, 1), (b, 2)] {
            pool.pages[id].state = PageState::Cached(key);
            pool.pages[id].refs = 0;
        }
        assert_eq!(pool.eviction_victim(), Some(b));
    }
}
