//! Tests of the paged contract on the CPU backend, and the fixture the CUDA parity
//! tests (`cuda/tests.rs`) reuse: sequences stored in scattered, shuffled pages, with
//! partial last pages and rows written in uneven chunks.

use super::cpu::CpuBackend;
use super::{
    AppendedRows, AttnJob, AttnPath, Backend, IndexKDtype, IndexerJob, IndexerRead, PagedAttnJob,
    PagedIndexerJob, PagedPools, PagedReads, PoolId, PoolSpec, TopkImpl, INDEX_DIM, MAIN_DIM,
};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub(crate) struct Sequence {
    pub(crate) pages: Vec<u32>,
    pub(crate) n: usize,
    pub(crate) main: Vec<f32>,
    pub(crate) index_keys: Vec<f32>,
    pub(crate) index_query: Vec<f32>,
    pub(crate) main_query: Vec<f32>,
}

pub(crate) struct Fixture {
    pub(crate) spec: PoolSpec,
    pub(crate) sequences: Vec<Sequence>,
}

impl Fixture {
    /// Every sequence's pages, in sequence order.
    pub(crate) fn all_pages(&self) -> Vec<u32> {
        self.sequences
            .iter()
            .flat_map(|s| s.pages.clone())
            .collect()
    }
}

/// Sequences of `sizes` rows in a pool of `page_tokens`-row pages, pages handed out in
/// a shuffled order (so page tables are not the identity), one spare page per
/// sequence. Index keys get exact duplicates (score ties); queries are near a stored
/// row so the attention argmax is meaningful.
pub(crate) fn fixture(
    dtype: IndexKDtype,
    page_tokens: usize,
    sizes: &[usize],
    seed: u64,
) -> Fixture {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let needed: usize = sizes.iter().map(|n| n.div_ceil(page_tokens) + 1).sum();
    let mut free: Vec<u32> = (0..needed as u32).collect();
    free.shuffle(&mut rng);
    let sequences = sizes
        .iter()
        .map(|&n| {
            let pages: Vec<u32> = free.drain(..n.div_ceil(page_tokens)).collect();
            let main: Vec<f32> = (0..n * MAIN_DIM)
                .map(|_| rng.random::<f32>() * 2.0 - 1.0)
                .collect();
            let mut index_keys: Vec<f32> = (0..n * INDEX_DIM)
                .map(|i| (rng.random::<f32>() - 0.5) * 10f32.powi((i % 5) as i32 - 2))
                .collect();
            if n > 40 {
                let row = index_keys[3 * INDEX_DIM..4 * INDEX_DIM].to_vec();
                index_keys[37 * INDEX_DIM..38 * INDEX_DIM].copy_from_slice(&row);
            }
            let target = rng.random_range(0..n.max(1));
            let index_query: Vec<f32> = (0..INDEX_DIM).map(|_| rng.random::<f32>() - 0.5).collect();
            let main_query: Vec<f32> = if n == 0 {
                vec![0.5; MAIN_DIM]
            } else {
                main[target * MAIN_DIM..(target + 1) * MAIN_DIM]
                    .iter()
                    .map(|v| v * 4.0 + (rng.random::<f32>() - 0.5) * 0.1)
                    .collect()
            };
            Sequence {
                pages,
                n,
                main,
                index_keys,
                index_query,
                main_query,
            }
        })
        .collect();
    Fixture {
        spec: PoolSpec {
            dtype,
            page_tokens,
            device_pages: needed,
            host_pages: needed,
        },
        sequences,
    }
}

/// Stores every sequence through `write_rows`, in chunks of 1..=page_tokens/2+1 rows
/// that never cross a page (as decode appends and prefill chunks do).
pub(crate) fn store(backend: &dyn Backend, fixture: &Fixture) -> PoolId {
    let pool = backend.create_pool(fixture.spec).unwrap();
    let page_tokens = fixture.spec.page_tokens;
    let mut rng = ChaCha8Rng::seed_from_u64(99);
    for sequence in &fixture.sequences {
        let mut position = 0;
        while position < sequence.n {
            let row = position % page_tokens;
            let chunk = rng
                .random_range(1..=page_tokens / 2 + 1)
                .min(page_tokens - row)
                .min(sequence.n - position);
            backend
                .write_rows(
                    pool,
                    sequence.pages[position / page_tokens],
                    row,
                    &sequence.main[position * MAIN_DIM..(position + chunk) * MAIN_DIM],
                    &sequence.index_keys[position * INDEX_DIM..(position + chunk) * INDEX_DIM],
                )
                .unwrap();
            position += chunk;
        }
    }
    pool
}

pub(crate) fn indexer_jobs(fixture: &Fixture) -> Vec<PagedIndexerJob<'_>> {
    fixture
        .sequences
        .iter()
        .map(|s| PagedIndexerJob {
            query: &s.index_query,
            pages: &s.pages,
            n: s.n,
        })
        .collect()
}

pub(crate) fn attention_jobs<'a>(
    fixture: &'a Fixture,
    selections: &'a [Vec<u32>],
) -> Vec<PagedAttnJob<'a>> {
    fixture
        .sequences
        .iter()
        .zip(selections)
        .filter(|(s, _)| s.n > 0)
        .map(|(s, selected)| PagedAttnJob {
            query: &s.main_query,
            pages: &s.pages,
            n: s.n,
            selected,
        })
        .collect()
}

const SIZES: &[usize] = &[1, 5, 64, 129, 700];

#[test]
fn paged_reads_equal_the_slice_methods_on_gathered_rows() {
    let cpu = CpuBackend::new();
    for dtype in [IndexKDtype::Bf16, IndexKDtype::Fp8] {
        for page_tokens in [4usize, 64, 128] {
            let fixture = fixture(dtype, page_tokens, SIZES, 7 + page_tokens as u64);
            let pool = store(&cpu, &fixture);
            let gathered: Vec<Vec<u8>> = fixture
                .sequences
                .iter()
                .map(|s| {
                    let mut bytes = vec![0u8; s.n * dtype.bytes_per_token()];
                    cpu.quantize_index_k(dtype, &s.index_keys, &mut bytes)
                        .unwrap();
                    bytes
                })
                .collect();
            let slice_jobs: Vec<IndexerJob<'_>> = fixture
                .sequences
                .iter()
                .zip(&gathered)
                .map(|(s, bytes)| IndexerJob {
                    query: &s.index_query,
                    index_k: bytes,
                    n: s.n,
                })
                .collect();
            for k in [1usize, 32, 2048] {
                for topk in [TopkImpl::V1, TopkImpl::V2] {
                    let read = IndexerRead { dtype, k, topk };
                    let want = cpu.indexer_topk(&slice_jobs, read).unwrap();
                    let got = cpu
                        .indexer_topk_paged(pool, &indexer_jobs(&fixture), k, topk, false)
                        .unwrap();
                    assert_eq!(got, want, "{dtype:?} page {page_tokens} k={k} {topk:?}");
                }
            }
            let selections = cpu
                .indexer_topk_paged(pool, &indexer_jobs(&fixture), 32, TopkImpl::V2, false)
                .unwrap();
            for path in [AttnPath::Mma, AttnPath::Legacy] {
                let slice_jobs: Vec<AttnJob<'_>> = fixture
                    .sequences
                    .iter()
                    .zip(&selections)
                    .map(|(s, selected)| AttnJob {
                        query: &s.main_query,
                        keys: &s.main,
                        n: s.n,
                        selected,
                    })
                    .collect();
                let want = cpu.sparse_attention(&slice_jobs, path).unwrap();
                let got = cpu
                    .sparse_attention_paged(pool, &attention_jobs(&fixture, &selections), path)
                    .unwrap();
                assert_eq!(got, want, "{dtype:?} page {page_tokens} {path:?}");
            }
            let stats = cpu.pool_stats(pool).unwrap();
            assert_eq!((stats.stale_index_k_reads, stats.stale_main_reads), (0, 0));
        }
    }
}

#[test]
fn eviction_and_load_back_restore_bytes_and_generation() {
    let cpu = CpuBackend::new();
    let fixture = fixture(IndexKDtype::Bf16, 8, &[16, 16], 3);
    let pool = store(&cpu, &fixture);
    let page = fixture.sequences[0].pages[1];
    let other = fixture.sequences[1].pages[0];
    let before = cpu.read_page(pool, page).unwrap();
    assert_eq!(before.index_tag, before.expected);
    cpu.evict_page(pool, page, 5).unwrap();
    // A new occupant overwrites the page (fresh generation), then the old one returns.
    cpu.write_rows(pool, page, 0, &[0.25; 8 * MAIN_DIM], &[0.5; 8 * INDEX_DIM])
        .unwrap();
    let overwritten = cpu.read_page(pool, page).unwrap();
    assert_ne!(overwritten.index_k, before.index_k);
    assert_ne!(overwritten.expected, before.expected);
    cpu.load_back_page(pool, 5, page).unwrap();
    assert_eq!(cpu.read_page(pool, page).unwrap(), before);
    assert_ne!(cpu.read_page(pool, other).unwrap().index_k, before.index_k);
    let stats = cpu.pool_stats(pool).unwrap();
    assert_eq!((stats.evictions, stats.load_backs), (1, 1));
    // Reading the restored sequence counts nothing stale.
    cpu.indexer_topk_paged(pool, &indexer_jobs(&fixture), 4, TopkImpl::V2, false)
        .unwrap();
    assert_eq!(cpu.pool_stats(pool).unwrap().stale_index_k_reads, 0);
}

#[test]
fn bad_pool_use_is_an_error_naming_what_is_wrong() {
    let cpu = CpuBackend::new();
    let spec = PoolSpec {
        dtype: IndexKDtype::Fp8,
        page_tokens: 6,
        device_pages: 4,
        host_pages: 2,
    };
    let error = cpu.create_pool(spec).unwrap_err().to_string();
    assert!(error.contains("page_tokens = 6"), "{error}");
    let pool = cpu
        .create_pool(PoolSpec {
            page_tokens: 8,
            ..spec
        })
        .unwrap();
    let rows = |n: usize| (vec![0.0; n * MAIN_DIM], vec![0.0; n * INDEX_DIM]);
    let (main, index) = rows(3);
    let error = cpu
        .write_rows(pool, 1, 6, &main, &index)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("rows 6..9 do not fit a page of 8"),
        "{error}"
    );
    let error = cpu
        .write_rows(pool, 4, 0, &main, &index)
        .unwrap_err()
        .to_string();
    assert!(error.contains("page 4 outside"), "{error}");
    let error = cpu.evict_page(pool, 0, 2).unwrap_err().to_string();
    assert!(error.contains("host slot 2 outside"), "{error}");
    let query = vec![0.0; INDEX_DIM];
    let short = [PagedIndexerJob {
        query: &query,
        pages: &[0],
        n: 9,
    }];
    let error = cpu
        .indexer_topk_paged(pool, &short, 4, TopkImpl::V2, false)
        .unwrap_err()
        .to_string();
    assert!(error.contains("1 pages cannot hold n = 9"), "{error}");
    let past_the_page = AppendedRows {
        rows: &[(0, 8)],
        main_keys: &main[..MAIN_DIM],
        index_keys: &index[..INDEX_DIM],
    };
    let error = cpu
        .append_rows(pool, past_the_page)
        .unwrap_err()
        .to_string();
    assert!(error.contains("row 8 of page 0 is outside"), "{error}");
    let too_many_keys = AppendedRows {
        rows: &[(0, 1)],
        main_keys: &main,
        index_keys: &index[..INDEX_DIM],
    };
    let error = cpu
        .append_rows(pool, too_many_keys)
        .unwrap_err()
        .to_string();
    assert!(error.contains("1 rows but 192 main"), "{error}");
    cpu.release_pool(pool).unwrap();
    let error = cpu.pool_stats(pool).unwrap_err().to_string();
    assert!(error.contains("unknown or released pool"), "{error}");
}

/// Every sequence's rows, gathered through `gather_sequence`: (main, index-K bytes).
pub(crate) fn gather_all(
    backend: &dyn Backend,
    pool: PoolId,
    fixture: &Fixture,
    gate_index_k: bool,
) -> Vec<(Vec<f32>, Vec<u8>, usize)> {
    fixture
        .sequences
        .iter()
        .map(|s| {
            let kv = backend
                .gather_sequence(pool, &s.pages, s.n, gate_index_k)
                .unwrap();
            assert_eq!(kv.stale_main_pages, 0, "main-KV reads are gated");
            (kv.main, kv.index_k, kv.stale_index_pages)
        })
        .collect()
}

#[test]
fn gather_returns_the_stored_rows_before_and_after_a_batched_load_back() {
    let cpu = CpuBackend::new();
    for dtype in [IndexKDtype::Bf16, IndexKDtype::Fp8] {
        for page_tokens in [4usize, 64] {
            let fixture = fixture(dtype, page_tokens, SIZES, 3 + page_tokens as u64);
            let pool = store(&cpu, &fixture);
            let gathered = gather_all(&cpu, pool, &fixture, false);
            for (s, (main, index_k, stale)) in fixture.sequences.iter().zip(&gathered) {
                let mut want = vec![0u8; s.n * dtype.bytes_per_token()];
                cpu.quantize_index_k(dtype, &s.index_keys, &mut want)
                    .unwrap();
                assert_eq!((main, index_k, *stale), (&s.main, &want, 0));
            }
            // Evict every page, give the pages new occupants, load the old ones back as
            // one job: the gather sees the old rows again.
            let pages = fixture.all_pages();
            for (slot, &page) in pages.iter().enumerate() {
                cpu.evict_page(pool, page, slot as u32).unwrap();
                cpu.write_rows(
                    pool,
                    page,
                    0,
                    &vec![0.25; page_tokens * MAIN_DIM],
                    &vec![2.0; page_tokens * INDEX_DIM],
                )
                .unwrap();
            }
            assert_ne!(gather_all(&cpu, pool, &fixture, false), gathered);
            let pairs: Vec<(u32, u32)> = pages
                .iter()
                .enumerate()
                .map(|(slot, &page)| (slot as u32, page))
                .collect();
            cpu.load_back_pages(pool, &pairs).unwrap();
            assert_eq!(gather_all(&cpu, pool, &fixture, false), gathered);
            let stats = cpu.pool_stats(pool).unwrap();
            assert_eq!(stats.load_backs, pages.len() as u64);
            assert_eq!(stats.stale_index_k_reads, 0);
        }
    }
    let fixture = fixture(IndexKDtype::Fp8, 4, &[5], 1);
    let pool = store(&cpu, &fixture);
    let error = cpu.gather_sequence(pool, &[0], 5, false).unwrap_err();
    assert!(error.to_string().contains("cannot hold n = 5"), "{error}");
}
