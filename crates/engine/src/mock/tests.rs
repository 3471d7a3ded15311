//! Tests of the mock engine: its progress through a task, reply shapes, fault
//! selection, metrics and think time.

use super::*;
use crate::test_support::{get_json, get_text, post_json, send_json};

fn task_message() -> Value {
    json!({"role": "user", "content": "You are on call. Do these steps in order:\n\
        1. read_file(path=\"/srv/app/config.yaml\", max_lines=40)\n\
        2. list_dir(path=\"/srv/app\")\n\
        When all steps are done, answer with a one-line summary."})
}

fn shared() -> Shared {
    Shared {
        config: MockConfig::default(),
        stats: Arc::default(),
        shutdown: CancellationToken::new(),
        tasks: Mutex::default(),
    }
}

/// (done steps, round, steps, first step's tool, its max_lines) of a conversation.
fn progress_of(
    shared: &Shared,
    conversation: &[Value],
) -> Option<(usize, u32, usize, String, Value)> {
    let text = Value::Array(conversation.to_vec()).to_string();
    let messages: Vec<RequestMessage> = serde_json::from_str(&text).unwrap();
    let p = progress(shared, &messages)?;
    let (tool, args) = &p.task.steps[0];
    let max_lines = args.get("max_lines").cloned().unwrap_or(Value::Null);
    Some((
        p.done_steps,
        p.round,
        p.task.steps.len(),
        tool.clone(),
        max_lines,
    ))
}

#[test]
fn progress_counts_steps_and_rounds_after_the_task() {
    let shared = shared();
    let mut conversation = vec![
        json!({"role": "system", "content": "tools"}),
        task_message(),
    ];
    let first = progress_of(&shared, &conversation).unwrap();
    assert_eq!(first, (0, 1, 2, "read_file".to_string(), json!(40)));
    conversation.push(json!({"role": "assistant", "content": null, "tool_calls": []}));
    conversation.push(json!({"role": "tool", "tool_call_id": "call_1", "content": "x"}));
    let second = progress_of(&shared, &conversation).unwrap();
    assert_eq!((second.0, second.1), (1, 2));
    assert!(progress_of(&shared, &[json!({"role": "user", "content": "hello"})]).is_none());
    // Parsed once per text: the task and the non-task message.
    assert_eq!(shared.tasks.lock().len(), 2);
    // Escaped text (an owned string, not borrowed) parses the same.
    let escaped = json!({"role": "user", "content": format!("\"quoted\"\n{}", task_message()["content"].as_str().unwrap())});
    let third = progress_of(&shared, &[escaped]).unwrap();
    assert_eq!(third.2, 2);
}

async fn body_json(response: Response) -> Value {
    let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

#[tokio::test]
async fn typed_replies_have_the_openai_shape() {
    let call = body_json(tool_call_reply(3, "read_file", r#"{"path":"/a \"b\""}"#, 9)).await;
    assert_eq!(
        call,
        json!({
            "id": "chatcmpl-mock",
            "object": "chat.completion",
            "model": "mock",
            "choices": [{"index": 0, "message": {
                "role": "assistant",
                "content": null,
                "tool_calls": [{"id": "call_3", "type": "function",
                    "function": {"name": "read_file", "arguments": "{\"path\":\"/a \\\"b\\\"\"}"}}],
            }, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 9},
        })
    );
    let text = body_json(text_reply("done \u{1}")).await;
    assert_eq!(
        text["choices"][0]["message"],
        json!({"role": "assistant", "content": "done \u{1}"})
    );
    assert_eq!(
        text["usage"]["completion_tokens"],
        token_count("done \u{1}")
    );
}

#[test]
fn fault_selection_is_a_pure_function_of_the_task_text() {
    let rule = FaultRule::new(5, 2, 1, Fault::NoTool);
    let picked: Vec<bool> = (0..50)
        .map(|i| rule.selects(&format!("task {i}")))
        .collect();
    assert_eq!(
        picked,
        (0..50)
            .map(|i| rule.selects(&format!("task {i}")))
            .collect::<Vec<_>>()
    );
    let hits = picked.iter().filter(|p| **p).count();
    assert!((3..=20).contains(&hits), "{hits}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_the_current_step_and_reports_metrics_from_the_table() {
    let server = MockServer::start(MockConfig::default()).await.unwrap();
    let client = reqwest::Client::new();
    let reply: Value = post_json(
        &client,
        format!("{}/chat/completions", server.api()),
        &json!({"messages": [task_message()]}),
    )
    .await;
    let call = &reply["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "read_file");
    let arguments: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(
        arguments,
        json!({"path": "/srv/app/config.yaml", "max_lines": 40})
    );
    let text = get_text(&client, server.metrics_url()).await;
    let expected = metrics::render(&[
        (Metric::RunningRequests, 0.0),
        (Metric::QueuedRequests, 0.0),
    ]);
    assert_eq!(text, expected);
    assert_eq!(server.stats().requests(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_count_think_time_between_a_sessions_rounds_only() {
    let server = MockServer::start(MockConfig::default()).await.unwrap();
    let client = reqwest::Client::new();
    let url = format!("{}/chat/completions", server.api());
    let first = vec![task_message()];
    let reply: Value = post_json(&client, &url, &json!({"messages": first})).await;
    // Another session's first round: no think time.
    let other = vec![
        json!({"role": "system", "content": "other"}),
        task_message(),
    ];
    send_json(&client, &url, &json!({"messages": other})).await;
    let mut second = first.clone();
    second.push(reply["choices"][0]["message"].clone());
    second.push(json!({"role": "tool", "tool_call_id": "call_1", "content": "x"}));
    send_json(&client, &url, &json!({"messages": second})).await;
    let summary = get_json(&client, format!("http://{}/stats", server.addr())).await;
    assert_eq!(summary["requests"], 3);
    assert_eq!(summary["think"]["samples"], 1);
    assert_eq!(summary["handling"]["samples"], 3);
    let status = client
        .post(format!("http://{}/stats/reset", server.addr()))
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status, reqwest::StatusCode::NO_CONTENT);
    assert!(server.stats().think_ns().is_empty());
}

/// A task message of its own for session `i`: a task the mock parses, whose text (and
/// so its CRC-32) differs per session.
fn session_task(i: u32) -> Value {
    json!({"role": "user", "content": format!("You are on call. Do these steps in order:\n\
        1. read_file(path=\"/srv/app{i}/config.yaml\", max_lines=40)\n\
        2. list_dir(path=\"/srv/app{i}\")\n\
        When all steps are done, answer with a one-line summary.")})
}

/// The message of a chat reply.
fn message_of(reply: &Value) -> &Value {
    &reply["choices"][0]["message"]
}

/// `--leak-first-round M`: the first round of the sessions the rule picks comes back as
/// DSML markup in the text even alone (one request in flight), the others' as parsed
/// calls, and the picked sessions' later rounds are parsed again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leak_first_round_leaks_the_picked_sessions_first_round_alone() {
    let rule = FaultRule::leak_first_round(3);
    assert_eq!(rule, FaultRule::new(3, 0, 1, Fault::LeakDsml));
    let server = MockServer::start(MockConfig {
        faults: vec![rule.clone()],
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let client = reqwest::Client::new();
    let url = format!("{}/chat/completions", server.api());
    let (mut leaked, mut parsed) = (0, 0);
    for i in 0..12 {
        let task = session_task(i);
        let text = task["content"].as_str().unwrap().to_string();
        let picked = crc32fast::hash(text.as_bytes()) % 3 == 0;
        assert_eq!(rule.selects(&text), picked);
        let first = post_json(&client, &url, &json!({"messages": [task.clone()]})).await;
        let message = message_of(&first);
        if picked {
            leaked += 1;
            assert!(message["tool_calls"].is_null(), "{first}");
            let content = message["content"].as_str().unwrap();
            assert!(
                content.starts_with("<｜DSML｜function_calls>")
                    && content.contains(&format!("/srv/app{i}/config.yaml")),
                "{content}"
            );
        } else {
            parsed += 1;
            assert_eq!(message["tool_calls"][0]["function"]["name"], "read_file");
        }
        // Round 2 of every session, picked or not, is the step's own call.
        let second = json!({"messages": [
            task,
            {"role": "assistant", "content": null, "tool_calls": []},
            {"role": "tool", "tool_call_id": "call_1", "content": "x"},
        ]});
        let reply = post_json(&client, &url, &second).await;
        assert_eq!(
            message_of(&reply)["tool_calls"][0]["function"]["name"],
            "list_dir",
            "{reply}"
        );
    }
    assert!(leaked > 0 && parsed > 0, "{leaked} leaked, {parsed} parsed");
    assert_eq!(server.stats().poisoned(), None);
}

/// `--poison-at-running N`: alone the mock answers right; the first time N requests are
/// in flight at once it is poisoned, and every call from then on, that request's
/// included and those sent alone afterwards, has a wrong argument.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_at_running_corrupts_every_call_after_the_first_load_even_alone() {
    let server = MockServer::start(MockConfig {
        poison_at_running: Some(2),
        // Every first round waits, so that a second request finds the first in flight.
        faults: vec![FaultRule::new(
            1,
            0,
            1,
            Fault::Sleep(Duration::from_millis(500)),
        )],
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let client = reqwest::Client::new();
    let url = format!("{}/chat/completions", server.api());
    let second_round = |i: u32| {
        json!({"messages": [
            session_task(i),
            {"role": "assistant", "content": null, "tool_calls": []},
            {"role": "tool", "tool_call_id": "call_1", "content": "x"},
        ]})
    };
    let path_of = |reply: &Value| -> Value {
        let call = &message_of(reply)["tool_calls"][0]["function"];
        assert_eq!(call["name"], "list_dir", "{reply}");
        serde_json::from_str::<Value>(call["arguments"].as_str().unwrap()).unwrap()["path"].clone()
    };
    // Alone, one request at a time: right, and not poisoned.
    let alone = post_json(&client, &url, &second_round(0)).await;
    assert_eq!(path_of(&alone), "/srv/app0");
    let first = post_json(&client, &url, &json!({"messages": [session_task(1)]})).await;
    let call = &message_of(&first)["tool_calls"][0]["function"];
    let arguments: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments["path"], "/srv/app1/config.yaml", "{first}");
    assert_eq!(server.stats().poisoned(), None);
    // Two in flight: the first sleeps in the handler while the second arrives.
    let sleeper = {
        let (client, url) = (client.clone(), url.clone());
        tokio::spawn(async move {
            post_json(&client, &url, &json!({"messages": [session_task(2)]})).await
        })
    };
    let started = Instant::now();
    while server.stats.running.load(Ordering::SeqCst) < 1 {
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "never in flight"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let poisoning = post_json(&client, &url, &second_round(3)).await;
    assert_eq!(
        path_of(&poisoning),
        "/srv/app3.bak",
        "that request's own call"
    );
    let poisoned = server.stats().poisoned().expect("poisoned");
    assert_eq!(
        poisoned,
        Poisoning {
            request: 4,
            running: 2
        }
    );
    sleeper.await.unwrap();
    // From then on, alone, every call is wrong, for the rest of the process's life.
    for i in 4..7 {
        let reply = post_json(&client, &url, &second_round(i)).await;
        assert_eq!(path_of(&reply), format!("/srv/app{i}.bak"));
    }
    server.stats().clear();
    let reply = post_json(&client, &url, &second_round(7)).await;
    assert_eq!(path_of(&reply), "/srv/app7.bak", "a clear does not cure it");
    let summary = get_json(&client, format!("http://{}/stats", server.addr())).await;
    assert_eq!(summary["poisoned"], json!({"request": 4, "running": 2}));
}
