//! Tests of prefill's core: the virtual-time store and the resident store in a
//! backend pool, their shipments, evictions and load-backs.

use super::*;
use crate::backend::cpu::CpuBackend;
use crate::backend::PagedReads;

/// Six sessions of growing prompts, one request at a time, in a pool of 12 pages of
/// 16 tokens: later sessions evict earlier ones' prefixes to the host tier and each
/// session's next round loads them back.
fn rounds() -> Vec<Vec<u32>> {
    let mut prompts = Vec::new();
    for round in 0..3u32 {
        for session in 0..6u32 {
            let len = 40 + 24 * round as usize;
            prompts.push(
                (0..len as u32)
                    .map(|i| 1 + (session * 7919 + i * 31) % 5000)
                    .collect(),
            );
        }
    }
    prompts
}

fn options() -> PrefillOptions {
    let mut options = PrefillOptions::tuned(IndexKDtype::Bf16, true, true);
    options.page_tokens = 16;
    options.pool_bytes = 12 * DevicePool::page_bytes(16, IndexKDtype::Bf16);
    options.host_pages = 64;
    options
}

/// Serves `prompts` one after the other; every prompt's shipped KV.
fn serve(core: &mut PrefillCore, backend: &dyn Backend) -> Vec<PromptKv> {
    let mut shipped = Vec::new();
    for (id, prompt) in rounds().into_iter().enumerate() {
        core.submit(id as u64, prompt);
        let mut steps = 0;
        loop {
            let done = core.step(backend).unwrap();
            if let Some((_, kv)) = done.into_iter().next() {
                shipped.push(kv.unwrap());
                break;
            }
            steps += 1;
            assert!(steps < 1000, "request {id} never shipped");
        }
    }
    shipped
}

#[test]
fn resident_store_ships_the_virtual_stores_bytes_through_load_backs() {
    let backend = CpuBackend::new();
    let mut reference = PrefillCore::new(options());
    let mut resident = PrefillCore::resident(options(), &backend).unwrap();
    assert!(resident.is_resident() && !reference.is_resident());
    assert_eq!(
        resident.gauges().total_pages,
        reference.gauges().total_pages
    );
    let want = serve(&mut reference, &backend);
    let got = serve(&mut resident, &backend);
    for (index, (got, want)) in got.iter().zip(&want).enumerate() {
        assert_eq!(got, want, "request {index}");
    }
    let counters = &resident.counters;
    assert!(
        counters.loadback_pages > 0 && counters.evicted_pages > 0,
        "the fixture must exercise eviction and load-back: {counters:?}"
    );
    assert_eq!(counters.loadback_pages, reference.counters.loadback_pages);
    assert_eq!(counters.cached_tokens, reference.counters.cached_tokens);
    assert_eq!(counters.stale_index_k_pages, 0);
    let stats = resident.pool_stats(&backend).unwrap().unwrap();
    assert_eq!(stats.load_backs, counters.loadback_pages);
    assert_eq!(stats.evictions, counters.evicted_pages);
    assert_eq!((stats.stale_index_k_reads, stats.stale_main_reads), (0, 0));
    assert!(reference.pool_stats(&backend).is_none());
    resident.close(&backend).unwrap();
    assert!(
        backend.pool_stats(PoolId(0)).is_err(),
        "the pool is released"
    );
}

#[test]
fn resident_store_queues_the_modelled_forward_before_shipping() {
    let backend = CpuBackend::claiming_async_load_backs();
    let mut options = options();
    options.forward_ns_per_token = 10;
    let mut resident = PrefillCore::resident(options.clone(), &backend).unwrap();
    serve(&mut resident, &backend);
    let delays = backend.delays.lock().unwrap().clone();
    assert_eq!(
        delays.iter().sum::<u64>(),
        10 * resident.counters.computed_tokens
    );
    assert!(delays.iter().all(|&ns| ns > 0));
    // The virtual store models step time on the host: it never asks.
    let mut reference = PrefillCore::new(options);
    let before = backend.delays.lock().unwrap().len();
    serve(&mut reference, &backend);
    assert_eq!(backend.delays.lock().unwrap().len(), before);
}

#[test]
fn for_backend_keeps_the_virtual_loader_on_the_cpu() {
    let core = PrefillCore::for_backend(options(), &CpuBackend::new()).unwrap();
    assert!(!core.is_resident());
}

#[test]
fn resident_pool_refuses_a_page_size_the_kernels_cannot_read() {
    let mut options = options();
    options.page_tokens = 6;
    let error = PrefillCore::resident(options, &CpuBackend::new())
        .err()
        .unwrap();
    assert!(format!("{error:#}").contains("multiple of 4"), "{error:#}");
}
