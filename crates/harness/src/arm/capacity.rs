//! Reading an engine's KV capacity after a restart (core::pressure), by engine preset:
//! llama.cpp's `/props` (`default_generation_settings.n_ctx` per slot, `total_slots`),
//! vLLM's `vllm:cache_config_info` info metric (`kv_cache_size_tokens`, else
//! `num_gpu_blocks` x `block_size`), SGLang's `/server_info` (`max_total_num_tokens`)
//! and the embedded engine's `/server_info` (prefill's `pool`: device pages x page
//! tokens). Parsers are plain functions over the engines' own replies, tested on
//! captured ones (tests/fixtures/engines/).

use crate::config::{Engine, RoleSpec};
use crate::core::pressure::Capacity;

/// llama.cpp `/props`: the cache is `total_slots` slots of `n_ctx` each.
pub(crate) fn from_llamacpp_props(props: &serde_json::Value) -> Result<Capacity, String> {
    let n_ctx = props
        .pointer("/default_generation_settings/n_ctx")
        .and_then(|v| v.as_u64())
        .ok_or("no default_generation_settings.n_ctx in /props")?;
    let slots = props
        .get("total_slots")
        .and_then(|v| v.as_u64())
        .ok_or("no total_slots in /props")?;
    Ok(Capacity {
        kv_tokens: n_ctx * slots,
        slots: Some(slots),
        source: format!("/props: {slots} slots of {n_ctx} tokens"),
    })
}

/// vLLM `/metrics`: the labels of `vllm:cache_config_info`.
pub(crate) fn from_vllm_metrics(text: &str) -> Result<Capacity, String> {
    let exposition = crate::driver::metrics::parse_exposition(text);
    let info = exposition
        .samples
        .iter()
        .find(|s| s.name == "vllm:cache_config_info")
        .ok_or("no vllm:cache_config_info in /metrics")?;
    let label = |k: &str| {
        info.labels
            .iter()
            .find(|(n, _)| n == k)
            .and_then(|(_, v)| v.parse::<u64>().ok())
    };
    if let Some(tokens) = label("kv_cache_size_tokens") {
        return Ok(Capacity {
            kv_tokens: tokens,
            slots: None,
            source: format!("vllm:cache_config_info kv_cache_size_tokens {tokens}"),
        });
    }
    match (label("num_gpu_blocks"), label("block_size")) {
        (Some(blocks), Some(size)) => Ok(Capacity {
            kv_tokens: blocks * size,
            slots: None,
            source: format!("vllm:cache_config_info: {blocks} blocks of {size} tokens"),
        }),
        _ => Err("vllm:cache_config_info names neither kv_cache_size_tokens nor num_gpu_blocks and block_size".into()),
    }
}

/// SGLang or the embedded engine's `/server_info`.
pub(crate) fn from_server_info(info: &serde_json::Value) -> Result<Capacity, String> {
    if let Some(tokens) = info.get("max_total_num_tokens").and_then(|v| v.as_u64()) {
        return Ok(Capacity {
            kv_tokens: tokens,
            slots: None,
            source: format!("/server_info max_total_num_tokens {tokens}"),
        });
    }
    let pages = info.pointer("/pool/device_pages").and_then(|v| v.as_u64());
    let page = info.pointer("/pool/page_tokens").and_then(|v| v.as_u64());
    match (pages, page) {
        (Some(pages), Some(page)) => Ok(Capacity {
            kv_tokens: pages * page,
            slots: None,
            source: format!("/server_info pool: {pages} device pages of {page} tokens"),
        }),
        _ => Err("/server_info has neither max_total_num_tokens nor pool.device_pages and pool.page_tokens".into()),
    }
}

/// The capacity of the target's engine, read from the first role that reports one (for
/// a prefill/decode pair: prefill, whose pool holds the sessions' prompts).
pub(crate) async fn read(
    engine: Engine,
    roles: &[RoleSpec],
    http: &reqwest::Client,
) -> Result<Capacity, String> {
    let mut why = Vec::new();
    for role in roles {
        let Some(origin) = crate::config::engine::origin(&role.health) else {
            why.push(format!("{}: no http:// origin", role.name));
            continue;
        };
        let got = match engine {
            Engine::Llamacpp => get_json(http, &format!("{origin}/props"))
                .await
                .and_then(|v| from_llamacpp_props(&v)),
            Engine::Vllm => match &role.metrics {
                Some(url) => get_text(http, url)
                    .await
                    .and_then(|t| from_vllm_metrics(&t)),
                None => Err("no metrics URL".into()),
            },
            Engine::Sglang | Engine::Embedded | Engine::Custom => {
                get_json(http, &format!("{origin}/server_info"))
                    .await
                    .and_then(|v| from_server_info(&v))
            }
        };
        match got {
            Ok(c) => return Ok(c),
            Err(e) => why.push(format!("{}: {e}", role.name)),
        }
    }
    Err(why.join("; "))
}

/// `GET url`'s body, or why not in words (a failed request, a non-2xx status).
pub(crate) async fn get_text(http: &reqwest::Client, url: &str) -> Result<String, String> {
    let reply = http
        .get(url)
        .send()
        .await
        .map_err(|e| format!("GET {url}: {e}"))?;
    if !reply.status().is_success() {
        return Err(format!("GET {url}: {}", reply.status()));
    }
    reply.text().await.map_err(|e| format!("GET {url}: {e}"))
}

/// `GET url`'s body as JSON, or why not in words.
pub(crate) async fn get_json(
    http: &reqwest::Client,
    url: &str,
) -> Result<serde_json::Value, String> {
    let text = get_text(http, url).await?;
    serde_json::from_str(&text).map_err(|e| format!("GET {url}: not JSON: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::core::testing::engine_fixture as fixture;

    #[test]
    fn capacities_from_the_engines_own_replies() {
        let props: serde_json::Value =
            serde_json::from_str(&fixture("llamacpp/props.json")).unwrap();
        let c = from_llamacpp_props(&props).unwrap();
        assert_eq!((c.kv_tokens, c.slots), (16384, Some(4)));
        // 0.3.8's /props, as its log printed it: 4 slots of 2048 at CTX_SIZE 8192.
        let old: serde_json::Value =
            serde_json::from_str(&fixture("llamacpp/props-0.3.8.json")).unwrap();
        let c = from_llamacpp_props(&old).unwrap();
        assert_eq!((c.kv_tokens, c.slots), (8192, Some(4)));
        let c = from_vllm_metrics(&fixture("vllm/cpu-0.32.0/metrics.txt")).unwrap();
        assert_eq!((c.kv_tokens, c.slots), (74880, None));
        let embedded = serde_json::json!({"pool": {"device_pages": 920, "page_tokens": 64}});
        assert_eq!(from_server_info(&embedded).unwrap().kv_tokens, 920 * 64);
        let sglang = serde_json::json!({"max_total_num_tokens": 500000, "page_size": 64});
        assert_eq!(from_server_info(&sglang).unwrap().kv_tokens, 500000);
        assert!(from_server_info(&serde_json::json!({})).is_err());
        assert!(from_vllm_metrics("vllm:num_requests_running 0\n").is_err());
    }
}
