//! The needle workload: how long a context the agent can still copy a value from.
//! Filler is realistic, similar-looking text (the simulation's sentences), so the
//! bigrams of the needle's value recur throughout it; the longer the context, the more
//! repeats compete with the true position in the indexer's top-k. fp8 index-K's
//! quantization noise lets repeats win far sooner than bf16's: index-K precision
//! matters numerically.

use super::backend::{Backend, IndexKDtype};
use super::keys;
use super::model::{decode_step, plan, Generation, ReadPath, SequenceKv};
use super::sim::filler_text;
use super::tokenizer::Vocab;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

/// The needle sentence and the value the agent must copy out of it.
pub(crate) const NEEDLE: &str = "Remember this: the deploy key is cache worker retry batch.";
pub(crate) const NEEDLE_VALUE: &str = "cache worker retry batch";

/// Whether the agent copies the needle value correctly from `filler_tokens` of filler
/// with the needle in the middle, for each of `trials` seeds (all must succeed).
pub(crate) fn recalls(
    backend: &dyn Backend,
    path: &ReadPath,
    filler_tokens: usize,
    trials: u64,
) -> anyhow::Result<bool> {
    let vocab = Vocab::new();
    for seed in 0..trials {
        let mut rng = ChaCha8Rng::seed_from_u64(0x4EED_1E00 + seed);
        let mut tokens = vocab.encode(&filler_text(&mut rng, filler_tokens / 2));
        let needle_start = tokens.len();
        tokens.extend(vocab.encode(NEEDLE));
        tokens.extend(vocab.encode(&filler_text(&mut rng, filler_tokens / 2)));
        let wanted = vocab.encode(NEEDLE_VALUE);
        // The value is planned from the needle itself (its first occurrence is there).
        let pieces = plan(&tokens[..needle_start + 32], &wanted);
        let index = keys::index_keys(&tokens, 0);
        let mut index_k = vec![0u8; tokens.len() * path.dtype.bytes_per_token()];
        backend.quantize_index_k(path.dtype, &index, &mut index_k)?;
        let mut sequence = SequenceKv {
            truth: tokens.clone(),
            stored_tokens: tokens.clone(),
            main: keys::main_keys(&tokens, 0),
            index_k,
        };
        let mut generation = Generation::new(pieces, wanted.len() + 8);
        while generation.finish.is_none() {
            decode_step(backend, path, &mut [(&mut generation, &mut sequence)])?;
        }
        if generation.emitted != wanted {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Doubling search from `start` to `max` filler tokens: the longest context recalled
/// (0 if even `start` fails).
pub(crate) fn limit(
    backend: &dyn Backend,
    path: &ReadPath,
    start: usize,
    max: usize,
    trials: u64,
) -> anyhow::Result<usize> {
    let mut best = 0;
    let mut length = start;
    while length <= max {
        if !recalls(backend, path, length, trials)? {
            break;
        }
        best = length;
        length *= 2;
    }
    Ok(best)
}

/// Needle limits for bf16 and fp8 with the engine's read path.
pub(crate) fn limits(
    backend: &dyn Backend,
    top_k: usize,
    max: usize,
) -> anyhow::Result<(usize, usize)> {
    let path = |dtype: IndexKDtype| ReadPath {
        dtype,
        top_k,
        topk: super::backend::TopkImpl::V2,
        attn: super::backend::AttnPath::Mma,
        max_graph_batch: 32,
    };
    Ok((
        limit(backend, &path(IndexKDtype::Bf16), 512, max, 3)?,
        limit(backend, &path(IndexKDtype::Fp8), 512, max, 3)?,
    ))
}

#[cfg(test)]
mod tests {
    use super::super::backend::cpu::CpuBackend;
    use super::super::model::DEFAULT_TOP_K;
    use super::*;

    #[test]
    fn fp8_loses_the_needle_at_a_shorter_context_than_bf16() {
        let (bf16, fp8) = limits(&CpuBackend::new(), DEFAULT_TOP_K, 65536).unwrap();
        println!("needle limit (filler tokens, doubling 512..65536): bf16 {bf16}, fp8 {fp8}");
        assert!(
            fp8 >= 2048,
            "both must recall at the default workload's context: fp8 {fp8}"
        );
        assert!(bf16 >= 4 * fp8, "bf16 {bf16} vs fp8 {fp8}");
    }
}
