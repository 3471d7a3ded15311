//! Tests of the miniature model: task parsing, span planning, and the read-back
//! decode on host slices and through a pool's page tables (same tokens).

use super::super::backend::cpu::CpuBackend;
use super::super::backend::PagedPools;
use super::*;
use serde_json::json;

#[test]
fn parses_the_task_and_the_requested_answer() {
    let text = "Please do this.\n1. read_file(path=\"/srv/app/config.yaml\", max_lines=40)\n2. grep(pattern=\"a, b\", flags=[\"-i\"])\nWhen every step is done, reply exactly: DONE: all steps completed.";
    let task = parse_task(text).unwrap();
    assert_eq!(task.steps.len(), 2);
    assert_eq!(task.steps[0].0, "read_file");
    assert_eq!(
        Value::Object(task.steps[0].1.clone()),
        json!({"path": "/srv/app/config.yaml", "max_lines": 40})
    );
    assert_eq!(
        Value::Object(task.steps[1].1.clone()),
        json!({"pattern": "a, b", "flags": ["-i"]})
    );
    assert_eq!(task.answer, "DONE: all steps completed.");
    assert_eq!(parse_task("no steps here"), None);
}

#[test]
fn plan_prefers_longest_then_earliest_spans() {
    let context = [1, 2, 3, 9, 1, 2, 3, 4];
    assert_eq!(
        plan(&context, &[1, 2, 3, 4, 7]),
        vec![Piece::Copy { anchor: 4, len: 4 }, Piece::Literal(7)]
    );
    assert_eq!(
        plan(&context, &[2, 3]),
        vec![Piece::Copy { anchor: 1, len: 2 }]
    );
}

fn clean_sequence(backend: &CpuBackend, dtype: IndexKDtype, tokens: &[u32]) -> SequenceKv {
    let index = keys::index_keys(tokens, 0);
    let mut index_k = vec![0u8; tokens.len() * dtype.bytes_per_token()];
    backend
        .quantize_index_k(dtype, &index, &mut index_k)
        .unwrap();
    SequenceKv {
        truth: tokens.to_vec(),
        stored_tokens: tokens.to_vec(),
        main: keys::main_keys(tokens, 0),
        index_k,
    }
}

#[test]
fn clean_memory_copies_exactly_and_corrupted_index_k_derails() {
    let backend = CpuBackend::new();
    let tokens: Vec<u32> = (0..600u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) % 97)
        .collect();
    let wanted: Vec<u32> = tokens[300..320].to_vec();
    for dtype in [IndexKDtype::Bf16, IndexKDtype::Fp8] {
        let path = mma_path(dtype, 32);
        let mut sequence = clean_sequence(&backend, dtype, &tokens);
        let mut generation = Generation::new(plan(&tokens, &wanted), 100);
        while generation.finish.is_none() {
            decode_step(&backend, &path, &mut [(&mut generation, &mut sequence)]).unwrap();
        }
        assert_eq!(generation.emitted, wanted, "{dtype:?}");
        // Zeroed index-K (a never-loaded page) under the copied span: the read goes elsewhere.
        let mut broken = clean_sequence(&backend, dtype, &tokens);
        let width = dtype.bytes_per_token();
        broken.index_k[256 * width..320 * width]
            .iter_mut()
            .for_each(|b| *b = 0);
        let mut generation = Generation::new(plan(&tokens, &wanted), 100);
        while generation.finish.is_none() {
            decode_step(&backend, &path, &mut [(&mut generation, &mut broken)]).unwrap();
        }
        assert_ne!(generation.emitted, wanted, "{dtype:?}");
    }
}

/// The read path the decode tests use: top 32 by V2, Mma attention.
pub(crate) fn mma_path(dtype: IndexKDtype, max_graph_batch: usize) -> ReadPath {
    ReadPath {
        dtype,
        top_k: 32,
        topk: TopkImpl::V2,
        attn: AttnPath::Mma,
        max_graph_batch,
    }
}

/// Stores `sequence`'s rows in `pages` of `pool` as decode does on admission.
pub(crate) fn make_resident(
    backend: &dyn Backend,
    pool: PoolId,
    page_tokens: usize,
    pages: &[u32],
    sequence: &SequenceKv,
) {
    sequence
        .store_in_pages(backend, pool, page_tokens, pages)
        .unwrap();
}

#[test]
fn resident_decode_emits_the_same_tokens_through_page_tables() {
    use super::super::backend::PoolSpec;
    let backend = CpuBackend::new();
    let tokens: Vec<u32> = (0..600u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 7) % 97)
        .collect();
    // A literal (token 500 is in no context) between two copied spans.
    let wanted: [Vec<u32>; 2] = [
        [&tokens[300..320], &[500][..], &tokens[40..50]].concat(),
        tokens[100..130].to_vec(),
    ];
    for dtype in [IndexKDtype::Bf16, IndexKDtype::Fp8] {
        for max_graph_batch in [32, 1] {
            let path = mma_path(dtype, max_graph_batch);
            let run = |resident: bool| -> Vec<Vec<u32>> {
                let mut sequences: Vec<SequenceKv> = (0..2)
                    .map(|_| clean_sequence(&backend, dtype, &tokens))
                    .collect();
                let mut generations: Vec<Generation> = wanted
                    .iter()
                    .map(|w| Generation::new(plan(&tokens, w), 100))
                    .collect();
                let page_tokens = 64;
                let per = (600 + 100usize).div_ceil(page_tokens);
                // Pages handed out backwards: page tables are not the identity.
                let all: Vec<u32> = (0..2 * per as u32).rev().collect();
                let page_lists: Vec<&[u32]> = all.chunks(per).collect();
                let pool = backend
                    .create_pool(PoolSpec {
                        dtype,
                        page_tokens,
                        device_pages: 2 * per,
                        host_pages: 1,
                    })
                    .unwrap();
                for (sequence, pages) in sequences.iter().zip(&page_lists) {
                    make_resident(&backend, pool, page_tokens, pages, sequence);
                }
                let placement = Resident {
                    pool,
                    page_tokens,
                    pages: &page_lists,
                };
                while generations.iter().any(|g| g.finish.is_none()) {
                    let mut batch: Vec<(&mut Generation, &mut SequenceKv)> =
                        generations.iter_mut().zip(sequences.iter_mut()).collect();
                    if resident {
                        decode_step_resident(&backend, &path, &placement, &mut batch).unwrap();
                    } else {
                        decode_step(&backend, &path, &mut batch).unwrap();
                    }
                }
                backend.release_pool(pool).unwrap();
                generations.into_iter().map(|g| g.emitted).collect()
            };
            let plain = run(false);
            assert_eq!(plain, wanted.to_vec(), "{dtype:?}");
            assert_eq!(
                run(true),
                plain,
                "{dtype:?} max_graph_batch {max_graph_batch}"
            );
        }
    }
}

#[test]
fn a_reads_logprobs_rank_tokens_by_their_best_position_with_the_emitted_one_first() {
    // Positions 0..4 store tokens 7, 9, 7, 5; the selection's best positions come first.
    let stored = [7, 9, 7, 5];
    let candidates = [(2, 0.5), (1, 0.3), (0, 0.15), (3, 0.05)];
    let prob = TokenProb::of_read(7, &candidates, &stored).unwrap();
    assert_eq!(prob.logprob, 0.5f32.ln());
    let tokens: Vec<u32> = prob.top.iter().map(|(t, _)| *t).collect();
    assert_eq!(tokens, [7, 9, 5], "one entry a token, best first");
    assert_eq!(prob.top[1].1, 0.3f32.ln());
    // No distribution where the backend gave none (the argmax only).
    assert_eq!(TokenProb::of_read(7, &[], &stored), None);
    assert_eq!(TokenProb::certain(4).top, [(4, 0.0)]);
}
