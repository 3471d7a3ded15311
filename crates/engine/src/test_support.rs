//! Helpers the engine's HTTP tests share (the mock's and the served roles').

/// A client without pooled connections (each request on its own connection).
pub(crate) fn fresh_client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

/// POSTs `body` as JSON to `url` and returns the reply, whatever its status; panics
/// only when no reply comes.
pub(crate) async fn send_json(
    client: &reqwest::Client,
    url: impl reqwest::IntoUrl,
    body: &impl serde::Serialize,
) -> reqwest::Response {
    client.post(url).json(body).send().await.unwrap()
}

/// POSTs `body` as JSON to `url` and returns the JSON reply; panics on any failure.
pub(crate) async fn post_json(
    client: &reqwest::Client,
    url: impl reqwest::IntoUrl,
    body: &impl serde::Serialize,
) -> serde_json::Value {
    send_json(client, url, body).await.json().await.unwrap()
}

/// GETs `url` and returns the reply's body as text; panics on any failure.
pub(crate) async fn get_text(client: &reqwest::Client, url: impl reqwest::IntoUrl) -> String {
    client.get(url).send().await.unwrap().text().await.unwrap()
}

/// GETs `url` and returns the JSON reply; panics on any failure.
pub(crate) async fn get_json(
    client: &reqwest::Client,
    url: impl reqwest::IntoUrl,
) -> serde_json::Value {
    client.get(url).send().await.unwrap().json().await.unwrap()
}
