//! Prefill -> decode KV transfer: decode posts the prompt's tokens to prefill's
//! `/internal/prefill`; prefill answers with one binary payload: magic, a JSON header
//! (index-K dtype, token count, page size, optional crc32 of the index-K bytes), then
//! the token ids, the main keys and the index-K bytes. Decode refuses a payload whose
//! index-K dtype differs from its own. The checksum proves the bytes crossed intact;
//! it cannot tell whether they were already stale when prefill read them.

use super::backend::{IndexKDtype, MAIN_DIM};
use super::prefill::PromptKv;
use serde::{Deserialize, Serialize};
use thiserror::Error;

const MAGIC: &[u8; 8] = b"BSKVXF01";

/// Decode's request to prefill.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct PrefillRequest {
    pub(crate) tokens: Vec<u32>,
    /// Decode's own index-K dtype name (for prefill's logs; decode does the check).
    pub(crate) index_k_dtype: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(crate) struct PayloadHeader {
    pub(crate) index_k_dtype: String,
    pub(crate) n_tokens: usize,
    pub(crate) page_tokens: usize,
    pub(crate) stale_index_pages: usize,
    #[serde(default)]
    pub(crate) index_k_crc32: Option<u32>,
}

#[derive(Debug, Error, PartialEq)]
pub(crate) enum TransferError {
    #[error("index-K dtype mismatch: prefill sends {sent}, decode expects {expected}; set SGLANG_DSV4_BF16_INDEX_K identically on both roles")]
    DtypeMismatch { sent: String, expected: String },
    #[error("malformed KV transfer payload: {0}")]
    Malformed(String),
}

pub(crate) fn dtype_from_name(name: &str) -> Option<IndexKDtype> {
    [IndexKDtype::Bf16, IndexKDtype::Fp8]
        .into_iter()
        .find(|dtype| dtype.name() == name)
}

pub(crate) fn encode(kv: &PromptKv, with_checksum: bool) -> Vec<u8> {
    let header = PayloadHeader {
        index_k_dtype: kv.dtype.name().to_string(),
        n_tokens: kv.tokens.len(),
        page_tokens: kv.page_tokens,
        stale_index_pages: kv.stale_index_pages,
        index_k_crc32: with_checksum.then(|| crc32fast::hash(&kv.index_k)),
    };
    let header = serde_json::to_vec(&header).expect("header serializes");
    let mut out = Vec::with_capacity(
        16 + header.len() + kv.tokens.len() * 4 + kv.main.len() * 4 + kv.index_k.len(),
    );
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(&header);
    kv.tokens
        .iter()
        .for_each(|t| out.extend_from_slice(&t.to_le_bytes()));
    kv.main
        .iter()
        .for_each(|v| out.extend_from_slice(&v.to_le_bytes()));
    out.extend_from_slice(&kv.index_k);
    out
}

/// A received payload, checked against decode's dtype.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Received {
    pub(crate) header: PayloadHeader,
    pub(crate) kv: PromptKv,
    /// crc32 of the received index-K when the sender attached one.
    pub(crate) received_crc32: Option<u32>,
}

impl Received {
    /// Sender's and receiver's checksums differ (None when no checksum was sent).
    pub(crate) fn checksum_mismatch(&self) -> Option<bool> {
        Some(self.header.index_k_crc32? != self.received_crc32?)
    }
}

pub(crate) fn decode(bytes: &[u8], expected: IndexKDtype) -> Result<Received, TransferError> {
    let malformed = |what: &str| TransferError::Malformed(what.to_string());
    if bytes.len() < 12 || &bytes[..8] != MAGIC {
        return Err(malformed("bad magic"));
    }
    let header_len = u32::from_le_bytes(bytes[8..12].try_into().expect("4 bytes")) as usize;
    let body = bytes
        .get(12 + header_len..)
        .ok_or_else(|| malformed("truncated header"))?;
    let header: PayloadHeader = serde_json::from_slice(&bytes[12..12 + header_len])
        .map_err(|e| TransferError::Malformed(e.to_string()))?;
    let dtype =
        dtype_from_name(&header.index_k_dtype).ok_or_else(|| malformed("unknown index-K dtype"))?;
    if dtype != expected {
        return Err(TransferError::DtypeMismatch {
            sent: dtype.name().into(),
            expected: expected.name().into(),
        });
    }
    let n = header.n_tokens;
    let (token_bytes, main_bytes, index_bytes) =
        (n * 4, n * MAIN_DIM * 4, n * dtype.bytes_per_token());
    if body.len() != token_bytes + main_bytes + index_bytes {
        return Err(malformed("body length does not match the header"));
    }
    let tokens = body[..token_bytes]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4")))
        .collect();
    let main = body[token_bytes..token_bytes + main_bytes]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().expect("4")))
        .collect();
    let index_k = body[token_bytes + main_bytes..].to_vec();
    let received_crc32 = header.index_k_crc32.map(|_| crc32fast::hash(&index_k));
    Ok(Received {
        kv: PromptKv {
            dtype,
            page_tokens: header.page_tokens,
            tokens,
            main,
            index_k,
            stale_index_pages: header.stale_index_pages,
        },
        header,
        received_crc32,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(dtype: IndexKDtype) -> PromptKv {
        PromptKv {
            dtype,
            page_tokens: 64,
            tokens: vec![1, 2, 3],
            main: (0..3 * MAIN_DIM).map(|i| i as f32).collect(),
            index_k: (0..3 * dtype.bytes_per_token()).map(|i| i as u8).collect(),
            stale_index_pages: 1,
        }
    }

    #[test]
    fn round_trip_with_matching_checksum() {
        let kv = sample(IndexKDtype::Fp8);
        let received = decode(&encode(&kv, true), IndexKDtype::Fp8).unwrap();
        assert_eq!(received.kv, kv);
        assert_eq!(received.checksum_mismatch(), Some(false));
        assert_eq!(
            decode(&encode(&kv, false), IndexKDtype::Fp8)
                .unwrap()
                .checksum_mismatch(),
            None
        );
    }

    #[test]
    fn dtype_mismatch_is_refused_with_the_fix_in_the_message() {
        let error =
            decode(&encode(&sample(IndexKDtype::Bf16), false), IndexKDtype::Fp8).unwrap_err();
        assert_eq!(
            error.to_string(),
            "index-K dtype mismatch: prefill sends bf16, decode expects fp8_e4m3; set SGLANG_DSV4_BF16_INDEX_K identically on both roles"
        );
        let mut corrupt = encode(&sample(IndexKDtype::Bf16), false);
        corrupt.truncate(corrupt.len() - 1);
        assert!(matches!(
            decode(&corrupt, IndexKDtype::Bf16),
            Err(TransferError::Malformed(_))
        ));
    }
}
