//! The miniature model's "weights": deterministic index keys (INDEX_DIM) and main keys
//! (MAIN_DIM) of a context position, computed from the bigram (token[j-1], token[j])
//! and the position j.
//!
//! key(j) = normalize(sqrt(1 - s) * content(token[j-1], token[j]) + sqrt(s) * position(j)),
//! with hash-seeded unit vectors and a different seed per key kind. The positional
//! share `s` sets how far apart two occurrences of the same bigram score: for index
//! keys it is small (a gap of about `s`), so at long context, with many repeats of a
//! bigram, fp8's quantization noise lets repeats outscore the true position and push
//! it out of the top-k, while bf16's noise is ~16x smaller. Main keys use a large
//! share so sparse attention separates the true position from its repeats cleanly.

use super::backend::{INDEX_DIM, MAIN_DIM};

/// Positional share of index keys (see module doc).
pub(crate) const INDEX_POSITIONAL_SHARE: f32 = 0.004;
/// Positional share of main keys.
pub(crate) const MAIN_POSITIONAL_SHARE: f32 = 0.5;
/// Weight of the previous token inside the bigram content vector.
const PREVIOUS_TOKEN_WEIGHT: f32 = 0.5;

const SEED_INDEX: u64 = 0x1D3E_5A17;
const SEED_MAIN: u64 = 0x3A17_C0DE;

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Adds `weight * unit_vector(seed)` to `out` (components uniform, then normalised).
fn add_unit_vector(seed: u64, weight: f32, out: &mut [f32]) {
    let mut state = seed;
    let mut buffer = [0.0f32; INDEX_DIM];
    let buffer = &mut buffer[..out.len()];
    let mut norm = 0.0f32;
    for value in buffer.iter_mut() {
        *value = (splitmix(&mut state) >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
        norm += *value * *value;
    }
    let scale = weight / norm.sqrt();
    out.iter_mut()
        .zip(buffer.iter())
        .for_each(|(dst, v)| *dst += v * scale);
}

fn normalize(out: &mut [f32]) {
    let norm = out.iter().map(|v| v * v).sum::<f32>().sqrt();
    if norm > 0.0 {
        out.iter_mut().for_each(|v| *v /= norm);
    }
}

fn key(
    seed: u64,
    positional_share: f32,
    previous: u32,
    current: u32,
    position: usize,
    out: &mut [f32],
) {
    out.iter_mut().for_each(|v| *v = 0.0);
    let mut content = [0.0f32; INDEX_DIM];
    let content = &mut content[..out.len()];
    add_unit_vector(seed ^ ((current as u64) << 20) ^ 0xC0, 1.0, content);
    add_unit_vector(
        seed ^ ((previous as u64) << 21) ^ 0xB1,
        PREVIOUS_TOKEN_WEIGHT,
        content,
    );
    normalize(content);
    out.iter_mut()
        .zip(content.iter())
        .for_each(|(dst, v)| *dst = v * (1.0 - positional_share).sqrt());
    add_unit_vector(
        seed.rotate_left(17) ^ (position as u64).wrapping_mul(0x2545_F491_4F6C_DD1D),
        positional_share.sqrt(),
        out,
    );
    normalize(out);
}

/// Index key of position `position` holding `current`, preceded by `previous`.
pub(crate) fn index_key(previous: u32, current: u32, position: usize, out: &mut [f32]) {
    debug_assert_eq!(out.len(), INDEX_DIM);
    key(
        SEED_INDEX,
        INDEX_POSITIONAL_SHARE,
        previous,
        current,
        position,
        out,
    );
}

/// Main (attention) key of a position.
pub(crate) fn main_key(previous: u32, current: u32, position: usize, out: &mut [f32]) {
    debug_assert_eq!(out.len(), MAIN_DIM);
    key(
        SEED_MAIN,
        MAIN_POSITIONAL_SHARE,
        previous,
        current,
        position,
        out,
    );
}

/// The token before `position` in `tokens` (position 0 has none: a fixed sentinel).
pub(crate) fn previous_token(tokens: &[u32], position: usize) -> u32 {
    if position == 0 {
        u32::MAX
    } else {
        tokens[position - 1]
    }
}

/// Index keys of positions `start..tokens.len()`, row-major.
pub fn index_keys(tokens: &[u32], start: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; (tokens.len() - start) * INDEX_DIM];
    for (row, position) in out.chunks_exact_mut(INDEX_DIM).zip(start..) {
        index_key(
            previous_token(tokens, position),
            tokens[position],
            position,
            row,
        );
    }
    out
}

/// Main keys of positions `start..tokens.len()`, row-major.
pub fn main_keys(tokens: &[u32], start: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; (tokens.len() - start) * MAIN_DIM];
    for (row, position) in out.chunks_exact_mut(MAIN_DIM).zip(start..) {
        main_key(
            previous_token(tokens, position),
            tokens[position],
            position,
            row,
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dot(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    #[test]
    fn same_bigram_elsewhere_scores_just_below_the_true_position() {
        let mut target = [0.0f32; INDEX_DIM];
        let mut repeat = [0.0f32; INDEX_DIM];
        let mut other = [0.0f32; INDEX_DIM];
        index_key(5, 9, 100, &mut target);
        index_key(5, 9, 700, &mut repeat);
        index_key(6, 9, 100, &mut other);
        let self_score = dot(&target, &target);
        let repeat_score = dot(&target, &repeat);
        assert!((self_score - 1.0).abs() < 1e-5);
        assert!(
            repeat_score < 1.0 - INDEX_POSITIONAL_SHARE * 0.5,
            "{repeat_score}"
        );
        assert!(
            repeat_score > 1.0 - INDEX_POSITIONAL_SHARE * 1.5,
            "{repeat_score}"
        );
        assert!(dot(&target, &other) < 0.95);
        let mut main_target = [0.0f32; MAIN_DIM];
        let mut main_repeat = [0.0f32; MAIN_DIM];
        main_key(5, 9, 100, &mut main_target);
        main_key(5, 9, 700, &mut main_repeat);
        assert!(dot(&main_target, &main_repeat) < 0.8);
    }
}
