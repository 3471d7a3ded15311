//! Helpers the engine's HTTP tests share (the mock's and the served roles').

/// POSTs `body` as JSON to `url` and returns the JSON reply; panics on any failure.
pub(crate) async fn post_json(
    client: &reqwest::Client,
    url: impl reqwest::IntoUrl,
    body: &impl serde::Serialize,
) -> serde_json::Value {
    client
        .post(url)
        .json(body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}
