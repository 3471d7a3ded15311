//! Decode throughput of the embedded engine's CPU backend: tokens/s at batch 1, 16 and
//! 64 over a ~1.5k-token context, Mma vs Legacy attention path. Not a test: prints a table.
//! `cargo bench --bench engine_decode`

use bisect_engine::backend::cpu::CpuBackend;
use bisect_engine::backend::{AttnPath, Backend, IndexKDtype, TopkImpl};
use bisect_engine::keys;
use bisect_engine::model::{decode_step, plan, Generation, ReadPath, SequenceKv};
use std::time::Instant;

fn main() {
    let backend = CpuBackend::new();
    let context = 1536usize;
    let steps = 32usize;
    println!("| dtype | attention | batch | tokens/s |");
    println!("|---|---|---|---|");
    for dtype in [IndexKDtype::Bf16, IndexKDtype::Fp8] {
        for attn in [AttnPath::Mma, AttnPath::Legacy] {
            for batch in [1usize, 16, 64] {
                let path = ReadPath {
                    dtype,
                    top_k: 32,
                    topk: TopkImpl::V2,
                    attn,
                    max_graph_batch: 32,
                };
                let mut requests: Vec<(Generation, SequenceKv)> = (0..batch)
                    .map(|r| {
                        let tokens: Vec<u32> = (0..context as u32)
                            .map(|i| {
                                (i.wrapping_add(r as u32 * 7)).wrapping_mul(2_654_435_761) % 211
                            })
                            .collect();
                        let index = keys::index_keys(&tokens, 0);
                        let mut index_k = vec![0u8; context * dtype.bytes_per_token()];
                        backend
                            .quantize_index_k(dtype, &index, &mut index_k)
                            .expect("quantize");
                        let wanted: Vec<u32> = tokens[500..500 + steps].to_vec();
                        let sequence = SequenceKv {
                            truth: tokens.clone(),
                            stored_tokens: tokens.clone(),
                            main: keys::main_keys(&tokens, 0),
                            index_k,
                        };
                        (Generation::new(plan(&tokens, &wanted), steps), sequence)
                    })
                    .collect();
                let start = Instant::now();
                let mut produced = 0usize;
                for _ in 0..steps {
                    let mut view: Vec<_> = requests.iter_mut().map(|(g, s)| (g, s)).collect();
                    decode_step(&backend, &path, &mut view).expect("decode step");
                    produced += batch;
                }
                let rate = produced as f64 / start.elapsed().as_secs_f64();
                println!("| {} | {:?} | {batch} | {rate:.0} |", dtype.name(), attn);
            }
        }
    }
}
