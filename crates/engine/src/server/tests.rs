//! Tests of both served roles over real HTTP: streaming and plain replies, bad
//! requests, dtype mismatches, body and connection limits, health and gauges.

use super::*;
use crate::backend::cpu::CpuBackend;
use crate::listen::HttpLimits;
use crate::test_support::{fresh_client, get_json, get_text, post_json, send_json};
use crate::{sim, DeviceChoice, EngineFlags, EngineTuning};
use serde_json::Value;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn config(role: Role, bf16: bool, prefill_url: Option<String>) -> EngineConfig {
    let env = move |name: &str| {
        (name == crate::ENV_BF16_INDEX_K).then(|| if bf16 { "1" } else { "0" }.to_string())
    };
    EngineConfig {
        role,
        host: "127.0.0.1".into(),
        port: 0,
        prefill_url,
        device: DeviceChoice::Cpu,
        flags: EngineFlags::from_env(&env, true, 32, true).unwrap(),
        tuning: EngineTuning {
            prefill_step_floor_us: 0,
            ..EngineTuning::default()
        },
        http: HttpLimits::default(),
    }
}

async fn start(config: EngineConfig) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(serve_listener(
        config,
        Box::new(CpuBackend::new()),
        listener,
    ));
    url
}

/// A bf16 prefill and a bf16 decode pointed at it: (prefill URL, decode URL).
async fn start_pair() -> (String, String) {
    let prefill = start(config(Role::Prefill, true, None)).await;
    let decode = start(config(Role::Decode, true, Some(prefill.clone()))).await;
    (prefill, decode)
}

/// Polls `url`/health until it answers 200; `never` is the failure message.
async fn wait_healthy(client: &reqwest::Client, url: &str, never: &str) {
    let wait = std::time::Instant::now();
    while client
        .get(format!("{url}/health"))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .unwrap_or(0)
        != 200
    {
        assert!(wait.elapsed().as_secs() < 20, "{never}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn chat_body(max_tokens: i64) -> Value {
    let tools: Vec<Value> = sim::sim_tools()
        .into_iter()
        .map(|t| json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": t.parameters}}))
        .collect();
    json!({
        "model": "m", "max_tokens": max_tokens, "tools": tools,
        "messages": [{"role": "user", "content": "Do this:\n1. read_file(path=\"/srv/app/config.yaml\", max_lines=40)\nWhen every step is done, reply exactly: DONE: all steps completed."}]
    })
}

/// Reassemble an SSE chat stream into (content, tool_calls, finish_reason, events).
fn assemble(sse: &str) -> (String, Vec<Value>, String, usize) {
    let (mut content, mut calls, mut finish, mut events) =
        (String::new(), Vec::new(), String::new(), 0);
    for line in sse.lines() {
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        events += 1;
        let chunk: Value = serde_json::from_str(data).unwrap();
        let choice = &chunk["choices"][0];
        if let Some(text) = choice["delta"]["content"].as_str() {
            content.push_str(text);
        }
        if let Some(list) = choice["delta"]["tool_calls"].as_array() {
            calls.extend(list.iter().cloned());
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (content, calls, finish, events)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_matches_the_non_streaming_reply() {
    let (_prefill, decode) = start_pair().await;
    let client = fresh_client();
    let chat = format!("{decode}/v1/chat/completions");
    wait_healthy(&client, &decode, "decode never became healthy").await;
    let plain: Value = post_json(&client, &chat, &chat_body(256)).await;
    let message = &plain["choices"][0]["message"];
    let mut body = chat_body(256);
    body["stream"] = json!(true);
    let response = send_json(&client, &chat, &body).await;
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let sse = response.text().await.unwrap();
    assert!(sse.trim_end().ends_with("data: [DONE]"), "{sse}");
    let (content, calls, finish, events) = assemble(&sse);
    assert_eq!(
        finish,
        plain["choices"][0]["finish_reason"].as_str().unwrap()
    );
    assert_eq!(content, message["content"].as_str().unwrap_or(""));
    let plain_calls = message["tool_calls"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(calls.len(), plain_calls.len(), "{sse}");
    for (streamed, whole) in calls.iter().zip(&plain_calls) {
        assert_eq!(streamed["function"], whole["function"]);
    }

    // A final text answer streams token by token: many content events.
    let mut done = chat_body(64);
    done["messages"] = json!([
        done["messages"][0],
        {"role": "assistant", "content": null, "tool_calls": plain_calls},
        {"role": "tool", "tool_call_id": "call_0", "content": "listen: 0.0.0.0:8080"}
    ]);
    let plain: Value = post_json(&client, &chat, &done).await;
    done["stream"] = json!(true);
    let sse = send_json(&client, &chat, &done).await.text().await.unwrap();
    let (content, calls, finish, events_text) = assemble(&sse);
    assert!(calls.is_empty());
    assert_eq!(finish, "stop");
    assert_eq!(
        content,
        plain["choices"][0]["message"]["content"].as_str().unwrap()
    );
    assert!(
        events_text > 4,
        "token by token, got {events_text} events: {sse}"
    );
    assert!(events >= 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logprobs_are_served_token_by_token_the_same_streamed_and_plain() {
    let (_prefill, decode) = start_pair().await;
    let client = fresh_client();
    let chat = format!("{decode}/v1/chat/completions");
    wait_healthy(&client, &decode, "decode never became healthy").await;
    let plain: Value = post_json(&client, &chat, &chat_body(256)).await;
    assert!(plain["choices"][0].get("logprobs").is_none(), "not asked");

    let mut body = chat_body(256);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(3);
    let asked: Value = post_json(&client, &chat, &body).await;
    let content = asked["choices"][0]["logprobs"]["content"]
        .as_array()
        .expect("a token list")
        .clone();
    assert_eq!(
        content.len() as u64,
        asked["usage"]["completion_tokens"].as_u64().unwrap()
    );
    let text: String = content
        .iter()
        .map(|t| t["token"].as_str().unwrap())
        .collect();
    assert!(
        text.contains("read_file"),
        "the tokens spell the raw reply: {text}"
    );
    let mut read = 0;
    for token in &content {
        let logprob = token["logprob"].as_f64().unwrap();
        let top = token["top_logprobs"].as_array().unwrap();
        assert!(!top.is_empty() && top.len() <= 3, "{token}");
        assert!(logprob <= 1e-6, "{token}");
        // The alternatives are the best first, and the chosen token is among them
        // unless three others outweigh it.
        let lps: Vec<f64> = top.iter().map(|t| t["logprob"].as_f64().unwrap()).collect();
        assert!(lps.windows(2).all(|w| w[0] >= w[1]), "{token}");
        if top.len() > 1 {
            read += 1;
        }
    }
    assert!(read > 0, "copied tokens come from reads with alternatives");

    body["stream"] = json!(true);
    let sse = send_json(&client, &chat, &body).await.text().await.unwrap();
    let streamed: Vec<Value> = sse
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(
        streamed, content,
        "the same tokens and numbers, alone or streamed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn end_to_end_over_http_with_bad_requests_and_dtype_mismatch() {
    let (prefill, decode) = start_pair().await;
    // No pooled connections: the 413 below makes the server drop its connection, and a
    // reused pooled one could race with that close.
    let client = fresh_client();
    let chat = format!("{decode}/v1/chat/completions");
    let response: Value = post_json(&client, &chat, &chat_body(256)).await;
    let message = &response["choices"][0]["message"];
    assert_eq!(
        response["choices"][0]["finish_reason"], "tool_calls",
        "{response}"
    );
    assert_eq!(message["tool_calls"][0]["function"]["name"], "read_file");
    let arguments: Value = serde_json::from_str(
        message["tool_calls"][0]["function"]["arguments"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        arguments,
        json!({"path": "/srv/app/config.yaml", "max_lines": 40})
    );
    assert!(message["content"].is_null());

    let truncated: Value = post_json(&client, &chat, &chat_body(3)).await;
    assert_eq!(truncated["choices"][0]["finish_reason"], "length");

    for (body, status) in [
        (b"{not json".to_vec(), 400u16),
        (serde_json::to_vec(&chat_body(0)).unwrap(), 400),
        (serde_json::to_vec(&json!({"messages": [{"role": "wizard", "content": "x"}], "tools": chat_body(1)["tools"]})).unwrap(), 400),
        (serde_json::to_vec(&json!({"messages": [{"role": "user", "content": "x"}]})).unwrap(), 400),
    ] {
        let response = client.post(&chat).header("content-type", "application/json").body(body).send().await.unwrap();
        assert_eq!(response.status().as_u16(), status);
        let error: Value = response.json().await.unwrap();
        assert!(error["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{error}");
    }

    let metrics = get_text(&client, format!("{prefill}/metrics")).await;
    assert!(
        metrics.contains("sglang:num_running_reqs")
            && metrics.contains("bisect_engine_stale_index_k_reads_total")
    );
    let decode_metrics = get_text(&client, format!("{decode}/metrics")).await;
    assert!(
        decode_metrics.contains("bisect_engine_index_k_checksum_match_total 2"),
        "{decode_metrics}"
    );
    let info = get_json(&client, format!("{decode}/server_info")).await;
    assert_eq!(info["flags"]["SGLANG_DSV4_BF16_INDEX_K"], 1);
    // Who is answering: a harness compares these before and after a restart.
    assert_eq!(info["pid"], std::process::id());
    assert!(info["started_at"].as_str().is_some_and(|t| t.contains('T')));

    // A decode configured for fp8 against a bf16 prefill refuses the transfer.
    let mismatched = start(config(Role::Decode, false, Some(prefill.clone()))).await;
    let response = send_json(
        &client,
        format!("{mismatched}/v1/chat/completions"),
        &chat_body(64),
    )
    .await;
    assert_eq!(response.status().as_u16(), 500);
    let error: Value = response.json().await.unwrap();
    assert!(error["error"]["message"]
        .as_str()
        .unwrap()
        .contains("index-K dtype mismatch: prefill sends bf16, decode expects fp8_e4m3"));

    // Prefill unreachable: 503 naming it, and /health says so.
    let orphan = start(config(
        Role::Decode,
        true,
        Some("http://127.0.0.1:9".into()),
    ))
    .await;
    let response = send_json(
        &client,
        format!("{orphan}/v1/chat/completions"),
        &chat_body(64),
    )
    .await;
    assert_eq!(response.status().as_u16(), 503);
    let health = client.get(format!("{orphan}/health")).send().await.unwrap();
    assert_eq!(health.status().as_u16(), 503);
    let reason: Value = health.json().await.unwrap();
    assert!(reason["reason"]
        .as_str()
        .unwrap()
        .contains("prefill at http://127.0.0.1:9"));
}

/// `/health` of `url` once decode has checked its prefill at least once.
async fn settled_health(client: &reqwest::Client, url: &str) -> (u16, Value) {
    let wait = std::time::Instant::now();
    loop {
        let response = client.get(format!("{url}/health")).send().await.unwrap();
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap();
        let unchecked = body["reason"]
            .as_str()
            .is_some_and(|r| r.contains("not checked yet"));
        if !unchecked {
            return (status, body);
        }
        assert!(
            wait.elapsed().as_secs() < 20,
            "decode never checked prefill"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The value of an unlabelled sample in Prometheus text.
fn sample(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("{name} missing from {metrics}"))
        .parse()
        .unwrap()
}

/// Reads until the server closes the connection (an error is a close too); what came.
async fn read_until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut received = Vec::new();
    let read = stream.read_to_end(&mut received);
    // A liveness bound, not a timing assertion: the limits under test are far shorter.
    let outcome = tokio::time::timeout(Duration::from_secs(30), read).await;
    assert!(outcome.is_ok(), "the server kept the connection open");
    received
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_bodies_are_refused_with_413() {
    let mut small = config(Role::Decode, true, Some("http://127.0.0.1:9".into()));
    small.tuning.max_body_bytes = 1024;
    let decode = start(small).await;
    // Just over the limit, so the whole request is read before the refusal (a large
    // body still being written when the server closes makes the client see a reset).
    let response = fresh_client()
        .post(format!("{decode}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(vec![b' '; 2048])
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 413);
    let error: Value = response.json().await.unwrap();
    assert!(error["error"]["message"]
        .as_str()
        .is_some_and(|m| !m.is_empty()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decode_health_refuses_a_prefill_of_the_other_dtype() {
    let prefill = start(config(Role::Prefill, true, None)).await;
    let client = fresh_client();
    let matching = start(config(Role::Decode, true, Some(prefill.clone()))).await;
    let (status, body) = settled_health(&client, &matching).await;
    assert_eq!(status, 200, "{body}");
    let fp8 = start(config(Role::Decode, false, Some(prefill.clone()))).await;
    let (status, body) = settled_health(&client, &fp8).await;
    assert_eq!(status, 503, "{body}");
    let reason = body["reason"].as_str().unwrap();
    assert!(
        reason.contains("index-K dtype mismatch: prefill sends bf16, decode expects fp8_e4m3"),
        "{reason}"
    );
    // A decode pointed at another decode is told so, not left to fail every chat.
    let chained = start(config(Role::Decode, true, Some(matching))).await;
    let (status, body) = settled_health(&client, &chained).await;
    assert_eq!(status, 503, "{body}");
    assert!(body["reason"]
        .as_str()
        .unwrap()
        .contains("not a prefill role"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gauges_return_to_zero_once_requests_finish() {
    let (prefill, decode) = start_pair().await;
    let client = fresh_client();
    assert_eq!(settled_health(&client, &decode).await.0, 200);
    let chat = format!("{decode}/v1/chat/completions");
    let mut streamed = chat_body(32);
    streamed["stream"] = json!(true);
    let requests = [chat_body(64), chat_body(3), streamed, chat_body(256)];
    let replies = futures::future::join_all(requests.iter().map(|body| {
        let request = client.post(&chat).json(body).send();
        async move { request.await.unwrap().text().await.unwrap() }
    }))
    .await;
    assert!(replies.iter().all(|reply| reply.contains("chatcmpl-")));
    for url in [&prefill, &decode] {
        let metrics = get_text(&client, format!("{url}/metrics")).await;
        assert_eq!(sample(&metrics, "sglang:num_running_reqs"), 0.0, "{url}");
        assert_eq!(sample(&metrics, "sglang:num_queue_reqs"), 0.0, "{url}");
    }
}

/// A prefill with these HTTP limits: (its URL, its host:port for raw connections).
async fn start_limited(limits: HttpLimits) -> (String, String) {
    let prefill = start(EngineConfig {
        http: limits,
        ..config(Role::Prefill, true, None)
    })
    .await;
    let address = prefill.trim_start_matches("http://").to_string();
    (prefill, address)
}

/// A raw connection to `address` that has sent `request` (complete or not).
async fn connect_and_send(address: &str, request: &[u8]) -> TcpStream {
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream.write_all(request).await.unwrap();
    stream
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_loris_connections_are_closed_and_do_not_block_health() {
    let (prefill, address) = start_limited(HttpLimits {
        header_read_timeout_ms: 200,
        idle_timeout_ms: 400,
        ..HttpLimits::default()
    })
    .await;
    // 300 holds 600 descriptors in this process (both ends), within the common soft
    // limit of 1024.
    let mut lorises = Vec::new();
    for _ in 0..300 {
        lorises.push(connect_and_send(&address, b"GET /health HTTP/1.1\r\nHost: x\r\n").await);
    }
    let client = fresh_client();
    let health = client
        .get(format!("{prefill}/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status().as_u16(), 200);
    for stream in &mut lorises {
        assert!(read_until_closed(stream).await.is_empty());
    }
    // A kept-alive connection is answered, then closed once idle.
    let mut idle = connect_and_send(&address, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let answer = String::from_utf8(read_until_closed(&mut idle).await).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_are_answered_503() {
    let (prefill, address) = start_limited(HttpLimits {
        max_connections: 4,
        ..HttpLimits::default()
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(TcpStream::connect(&address).await.unwrap());
    }
    // Accepted in connection order: this is the fifth.
    let mut fifth = connect_and_send(&address, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let answer = String::from_utf8(read_until_closed(&mut fifth).await).unwrap();
    assert!(answer.starts_with("HTTP/1.1 503"), "{answer}");
    assert!(answer.contains("too many open connections"), "{answer}");
    drop(held);
    wait_healthy(&fresh_client(), &prefill, "the cap was never released").await;
}
