//! The engine self-report client: what an engine says about itself (its effective
//! configuration, its pid and start time), read over HTTP with the target's API key.
//! Engine control reads it to prove a restart and to own what it spawned; the arm
//! lifecycle reads it for the effective values and the engine identity of each block.

use crate::config::RoleSpec;

/// The effective-configuration document at `url`, fetched with the API key where one
/// is configured; `None` when it does not answer with a document.
async fn fetch_effective(
    client: &reqwest::Client,
    url: &str,
    api_key: Option<&str>,
) -> Option<serde_json::Value> {
    let resp = keyed_get(client, url, api_key).send().await.ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let text = resp.text().await.ok()?;
    crate::core::effective::parse_document(&text).map(|(doc, _)| doc)
}

/// A GET carrying the API key as a bearer token where one is configured.
fn keyed_get(
    client: &reqwest::Client,
    url: &str,
    api_key: Option<&str>,
) -> reqwest::RequestBuilder {
    let request = client.get(url);
    match api_key {
        Some(key) => request.bearer_auth(key),
        None => request,
    }
}

/// What the engine reports about itself (its effective configuration): the role's
/// `effective_url` where the profile or its engine preset names one (SGLang's
/// `/server_info` falling back to the deprecated `/get_server_info` of older releases),
/// else, beside its health URL, `/server_info` (the embedded engine, SGLang) or
/// `/get_server_info` (older SGLang). The one reading of an engine's self-report, for the lifecycle's checks
/// (what it runs with, which process it is) and engine control's (a restart's proof,
/// the ownership of a spawned role's engine, the foreign-engine refusal): every path
/// sends the API key (`api_key_env`'s) when the target has one, as the engines that
/// want it on their metrics want it here too.
pub(crate) async fn fetch_server_info(
    client: &reqwest::Client,
    role: &RoleSpec,
    api_key: Option<&str>,
) -> Option<serde_json::Value> {
    if let Some(url) = &role.effective_url {
        if let Some(doc) = fetch_effective(client, url, api_key).await {
            return Some(doc);
        }
        // An SGLang from before `/server_info` serves only `/get_server_info`.
        let legacy = crate::config::engine::legacy_effective_url(url)?;
        return fetch_effective(client, &legacy, api_key).await;
    }
    let base = role.health.strip_suffix("/health")?;
    for path in ["/server_info", "/get_server_info"] {
        let Ok(resp) = keyed_get(client, &format!("{base}{path}"), api_key)
            .send()
            .await
        else {
            return None;
        };
        if resp.status().is_success() {
            return resp.json().await.ok();
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[tokio::test]
    async fn the_self_report_is_read_with_the_key_on_every_path() {
        let addr = crate::test_http::keyed_engine().await;
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let guessed = crate::config::RoleSpec::new(
            "prefill",
            PathBuf::new(),
            format!("http://{addr}/health"),
            None,
        );
        // Its health on a dead port: only the effective URL can answer for it.
        let named = crate::config::RoleSpec {
            health: "http://127.0.0.1:9/health".into(),
            effective_url: Some(format!("http://{addr}/config")),
            ..guessed.clone()
        };
        for role in [&named, &guessed] {
            let doc = fetch_server_info(&http, role, Some(crate::test_http::KEY)).await;
            assert!(doc.is_some_and(|d| d["pid"].is_u64()), "{role:?}");
            assert_eq!(fetch_server_info(&http, role, None).await, None);
        }
    }
}
