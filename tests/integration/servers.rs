//! The driver against servers as they really are (issue: bisect puts any server under
//! the load a plain client can), each written for its test with plain threads and
//! sockets: a thread per connection behind a listen backlog of 5 and a slow accept
//! loop; `Connection: close` after every reply; HTTP/1.0 replies; chunked replies and
//! server-sent events with pauses; a server that accepts and never answers; a server
//! that sheds load with 429/503 and `Retry-After`. Each is either served at the load or
//! reported as what it is.
//!
//! The replies' content comes from the zero-work mock engine (`bisect_engine::mock`),
//! forwarded over a blocking socket, so sessions run their full rounds and the classes
//! are the mock's; the shape of the HTTP exchange is the test server's own.

use bisect_engine::mock::{MockConfig, MockServer};
use bisect_harness::core::session::SessionClass;
use bisect_harness::core::session::SessionResult;
use bisect_harness::driver::sample::{drive_collected, sample_workload};
use bisect_harness::driver::{DrivePlan, DriveStats};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How the test server answers.
#[derive(Debug, Clone, Copy)]
enum Reply {
    /// HTTP/1.1, Content-Length, connection kept alive.
    KeepAlive,
    /// HTTP/1.1 with `Connection: close`, then the connection is closed.
    Close,
    /// An HTTP/1.0 status line, then the connection is closed.
    Http10,
    /// Chunked transfer coding, the body in three chunks with pauses between them.
    Chunked { pause_ms: u64 },
    /// Server-sent events (a streaming request), one event per chunk, with pauses.
    Sse { pause_ms: u64 },
    /// Reads the request and never answers.
    Silent,
    /// Beyond `cap` requests in progress, `status` with `Retry-After: retry_after`.
    Shed {
        cap: u64,
        status: u16,
        retry_after: &'static str,
    },
}

struct ServerSpec {
    backlog: u32,
    /// Time the accept loop spends per connection (a GIL-bound loop's).
    accept_delay: Duration,
    /// Time each reply takes at least.
    reply_delay: Duration,
    reply: Reply,
}

#[derive(Default)]
struct Gauge {
    running: AtomicU64,
    peak: AtomicU64,
    accepted: AtomicU64,
    requests: AtomicU64,
}

struct TestServer {
    port: u16,
    gauge: Arc<Gauge>,
    stop: Arc<AtomicBool>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

impl TestServer {
    /// Listens on a free port with `spec.backlog`; must run inside a tokio runtime (the
    /// socket is set up through tokio, the only way here to choose the backlog).
    fn start(spec: ServerSpec, mock: SocketAddr) -> TestServer {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let listener = socket.listen(spec.backlog).unwrap().into_std().unwrap();
        listener.set_nonblocking(false).unwrap();
        let port = listener.local_addr().unwrap().port();
        let gauge = Arc::new(Gauge::default());
        let stop = Arc::new(AtomicBool::new(false));
        let spec = Arc::new(spec);
        {
            let (gauge, stop) = (gauge.clone(), stop.clone());
            std::thread::spawn(move || {
                for stream in listener.incoming() {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                    let Ok(stream) = stream else { continue };
                    std::thread::sleep(spec.accept_delay);
                    gauge.accepted.fetch_add(1, Ordering::SeqCst);
                    let (gauge, stop, spec) = (gauge.clone(), stop.clone(), spec.clone());
                    std::thread::spawn(move || {
                        let _ = serve_connection(stream, &spec, &gauge, &stop, mock);
                    });
                }
            });
        }
        TestServer { port, gauge, stop }
    }

    fn api(&self) -> String {
        format!("http://127.0.0.1:{}/v1", self.port)
    }

    fn peak(&self) -> u64 {
        self.gauge.peak.load(Ordering::SeqCst)
    }
}

/// One request: the body, or None at the end of the connection.
fn read_request(reader: &mut BufReader<TcpStream>) -> std::io::Result<Option<Vec<u8>>> {
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut length = 0usize;
    loop {
        let mut header = String::new();
        reader.read_line(&mut header)?;
        let header = header.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((name, value)) = header.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().unwrap_or(0);
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body)?;
    Ok(Some(body))
}

/// The mock's answer to `body` (its status and JSON).
fn ask_mock(mock: SocketAddr, body: &[u8]) -> std::io::Result<(u16, Vec<u8>)> {
    let mut stream = TcpStream::connect(mock)?;
    write!(
        stream,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: mock\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    stream.write_all(body)?;
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply)?;
    let split = reply
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("the mock's reply has a header");
    let head = String::from_utf8_lossy(&reply[..split]).to_string();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    Ok((status, reply[split + 4..].to_vec()))
}

/// The mock's JSON completion as OpenAI streaming events: role and content, each tool
/// call's name then its arguments in two pieces, the finish reason, `[DONE]`.
fn sse_events(completion: &[u8]) -> Vec<String> {
    let value: serde_json::Value = serde_json::from_slice(completion).unwrap();
    let message = &value["choices"][0]["message"];
    let chunk = |delta: serde_json::Value, finish: serde_json::Value| {
        let event = serde_json::json!({
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        });
        format!("data: {event}\n\n")
    };
    let mut events = vec![chunk(
        serde_json::json!({"role": "assistant", "content": message["content"]}),
        serde_json::Value::Null,
    )];
    for (i, call) in message["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        events.push(chunk(
            serde_json::json!({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                "function": {"name": call["function"]["name"], "arguments": ""}}]}),
            serde_json::Value::Null,
        ));
        let arguments = call["function"]["arguments"].as_str().unwrap_or_default();
        let half = arguments
            .char_indices()
            .nth(arguments.chars().count() / 2)
            .map_or(arguments.len(), |(at, _)| at);
        for piece in [&arguments[..half], &arguments[half..]] {
            events.push(chunk(
                serde_json::json!({"tool_calls": [{"index": i, "function": {"arguments": piece}}]}),
                serde_json::Value::Null,
            ));
        }
    }
    events.push(chunk(
        serde_json::json!({}),
        value["choices"][0]["finish_reason"].clone(),
    ));
    events.push("data: [DONE]\n\n".to_string());
    events
}

fn write_chunk(stream: &mut TcpStream, data: &[u8]) -> std::io::Result<()> {
    write!(stream, "{:x}\r\n", data.len())?;
    stream.write_all(data)?;
    stream.write_all(b"\r\n")?;
    stream.flush()
}

/// Serves one connection until the client closes it (or the reply mode closes it).
fn serve_connection(
    stream: TcpStream,
    spec: &ServerSpec,
    gauge: &Gauge,
    stop: &AtomicBool,
    mock: SocketAddr,
) -> std::io::Result<()> {
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    while let Some(body) = read_request(&mut reader)? {
        gauge.requests.fetch_add(1, Ordering::SeqCst);
        let running = gauge.running.fetch_add(1, Ordering::SeqCst) + 1;
        gauge.peak.fetch_max(running, Ordering::SeqCst);
        let leave = || gauge.running.fetch_sub(1, Ordering::SeqCst);
        if let Reply::Shed {
            cap,
            status,
            retry_after,
        } = spec.reply
        {
            if running > cap {
                leave();
                let text = br#"{"error":"overloaded"}"#;
                write!(
                    writer,
                    "HTTP/1.1 {status} Busy\r\nRetry-After: {retry_after}\r\n\
                     Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                    text.len()
                )?;
                writer.write_all(text)?;
                continue;
            }
        }
        if let Reply::Silent = spec.reply {
            while !stop.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(20));
            }
            leave();
            return Ok(());
        }
        std::thread::sleep(spec.reply_delay);
        let (status, answer) = ask_mock(mock, &body)?;
        leave();
        match spec.reply {
            Reply::KeepAlive | Reply::Shed { .. } => {
                write!(
                    writer,
                    "HTTP/1.1 {status} OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                    answer.len()
                )?;
                writer.write_all(&answer)?;
            }
            Reply::Close => {
                write!(
                    writer,
                    "HTTP/1.1 {status} OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    answer.len()
                )?;
                writer.write_all(&answer)?;
                return Ok(());
            }
            Reply::Http10 => {
                write!(
                    writer,
                    "HTTP/1.0 {status} OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                    answer.len()
                )?;
                writer.write_all(&answer)?;
                return Ok(());
            }
            Reply::Chunked { pause_ms } => {
                write!(
                    writer,
                    "HTTP/1.1 {status} OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
                )?;
                let third = answer.len() / 3;
                for piece in [
                    &answer[..third],
                    &answer[third..2 * third],
                    &answer[2 * third..],
                ] {
                    write_chunk(&mut writer, piece)?;
                    std::thread::sleep(Duration::from_millis(pause_ms));
                }
                writer.write_all(b"0\r\n\r\n")?;
            }
            Reply::Sse { pause_ms } => {
                write!(
                    writer,
                    "HTTP/1.1 {status} OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                )?;
                for event in sse_events(&answer) {
                    write_chunk(&mut writer, event.as_bytes())?;
                    std::thread::sleep(Duration::from_millis(pause_ms));
                }
                writer.write_all(b"0\r\n\r\n")?;
            }
            Reply::Silent => unreachable!("answered above"),
        }
    }
    Ok(())
}

/// Drives `sessions` sessions (all at once) of `rounds` rounds against `server`, with
/// `timeout_s` per round; `stream` asks for server-sent events.
async fn drive_against(
    server: &TestServer,
    sessions: u32,
    rounds: u32,
    timeout_s: f64,
    stream: bool,
) -> (DriveStats, Vec<SessionResult>) {
    let mut workload = sample_workload(sessions, rounds);
    workload.ctx = 300;
    workload.timeout_s = timeout_s;
    workload.request.stream = stream;
    let plan = DrivePlan {
        api: server.api(),
        model: "mock".into(),
        api_key: None,
        sessions,
        concurrency: 0,
        oracle: None,
        workload,
        label: "on".into(),
        repeat: 1,
    };
    drive_collected(&plan, CancellationToken::new())
        .await
        .unwrap()
}

async fn mock() -> MockServer {
    MockServer::start(MockConfig::default()).await.unwrap()
}

fn spec(reply: Reply) -> ServerSpec {
    ServerSpec {
        backlog: 128,
        accept_delay: Duration::ZERO,
        reply_delay: Duration::from_millis(5),
        reply,
    }
}

fn assert_all_done(stats: &DriveStats, sessions: u64) {
    assert_eq!(stats.sessions as u64, sessions, "{stats:?}");
    assert_eq!(
        stats.counts[SessionClass::Done],
        sessions,
        "{:?}",
        stats.counts
    );
    assert_eq!(
        stats.counts[SessionClass::Error] + stats.counts[SessionClass::Timeout],
        0,
        "{stats:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thread_per_connection_server_with_a_backlog_of_5_and_a_slow_accept_gets_the_load() {
    let mock = mock().await;
    // 1 ms per accept: a Python accept loop competing for its GIL with 60 handler
    // threads is that slow or slower; 60 connects at once overflowed its queue.
    let server = TestServer::start(
        ServerSpec {
            backlog: 5,
            accept_delay: Duration::from_millis(1),
            reply_delay: Duration::from_millis(100),
            reply: Reply::KeepAlive,
        },
        mock.addr(),
    );
    let (stats, _) = drive_against(&server, 60, 5, 10.0, false).await;
    assert_all_done(&stats, 60);
    // The opening wave reached the server as one: its own gauge saw (nearly) all 60.
    assert!(
        server.peak() >= 54,
        "server-side peak {} of 60; {:?}",
        server.peak(),
        stats.transport
    );
    // One connection per slot (a connect abandoned as stalled after the server's kernel
    // completed it can still be accepted, so the server may count more).
    assert!(stats.transport.connects >= 60, "{:?}", stats.transport);
    assert!(
        server.gauge.accepted.load(Ordering::SeqCst) >= stats.transport.connects,
        "{:?}",
        stats.transport
    );
    assert_eq!(stats.transport.failed, 0, "{:?}", stats.transport);
}

/// A server that ends every connection after one reply (`reply`): each request gets a
/// connection of its own and every session still runs to its end. Returns the server's
/// peak of requests in progress.
async fn served_with_a_connection_per_request(reply: Reply) -> u64 {
    let mock = mock().await;
    let server = TestServer::start(spec(reply), mock.addr());
    let (stats, _) = drive_against(&server, 20, 5, 10.0, false).await;
    assert_all_done(&stats, 20);
    assert_eq!(
        stats.transport.connects, stats.requests,
        "{:?}",
        stats.transport
    );
    server.peak()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_closes_after_every_reply_is_served_with_a_connection_per_request() {
    assert_eq!(served_with_a_connection_per_request(Reply::Close).await, 20);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_1_0_replies_are_read_and_the_connection_replaced() {
    served_with_a_connection_per_request(Reply::Http10).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_replies_with_pauses_are_assembled() {
    let mock = mock().await;
    let server = TestServer::start(spec(Reply::Chunked { pause_ms: 15 }), mock.addr());
    let (stats, _) = drive_against(&server, 20, 5, 10.0, false).await;
    assert_all_done(&stats, 20);
    // Kept alive: one connection per session.
    assert_eq!(stats.transport.connects, 20, "{:?}", stats.transport);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_sent_events_with_pauses_are_assembled_into_tool_calls() {
    let mock = mock().await;
    let server = TestServer::start(spec(Reply::Sse { pause_ms: 5 }), mock.addr());
    let (stats, results) = drive_against(&server, 12, 5, 10.0, true).await;
    assert_all_done(&stats, 12);
    assert!(
        results.iter().all(|r| r.rounds_used >= 2),
        "tool calls were followed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_accepts_and_never_answers_is_timeouts_not_a_low_load() {
    let mock = mock().await;
    let server = TestServer::start(spec(Reply::Silent), mock.addr());
    let (stats, results) = drive_against(&server, 8, 3, 1.0, false).await;
    assert_eq!(stats.sessions, 8);
    assert_eq!(stats.counts[SessionClass::Timeout], 8, "{:?}", stats.counts);
    assert_eq!(stats.counts[SessionClass::Error], 0);
    // Every request reached the server and sat there: the load was delivered and the
    // server did not answer, which is what the record says.
    assert_eq!(server.gauge.requests.load(Ordering::SeqCst), 8);
    assert_eq!(server.peak(), 8);
    assert!(results.iter().all(|r| r
        .error
        .as_deref()
        .unwrap_or_default()
        .contains("no response within")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_shedding_load_with_retry_after_is_asked_again_within_the_round() {
    let mock = mock().await;
    let server = TestServer::start(
        spec(Reply::Shed {
            cap: 10,
            status: 429,
            retry_after: "1",
        }),
        mock.addr(),
    );
    let (stats, _) = drive_against(&server, 20, 5, 10.0, false).await;
    assert_all_done(&stats, 20);
    let t = &stats.transport;
    assert!(t.shed_replies >= 1, "{t:?}");
    assert_eq!(t.shed_retried, t.shed_replies, "{t:?}");
    let problems = t.problems().join("; ");
    assert!(problems.contains("the server shed load"), "{problems}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shedding_past_the_round_timeout_is_an_error_naming_the_status() {
    let mock = mock().await;
    let server = TestServer::start(
        spec(Reply::Shed {
            cap: 2,
            status: 503,
            retry_after: "30",
        }),
        mock.addr(),
    );
    let (stats, results) = drive_against(&server, 6, 3, 2.0, false).await;
    assert_eq!(stats.sessions, 6);
    let shed = results
        .iter()
        .filter(|r| r.error.as_deref().unwrap_or_default().contains("HTTP 503"))
        .count() as u64;
    assert!(shed >= 1, "{results:?}");
    assert_eq!(stats.counts[SessionClass::Error], shed);
    assert_eq!(stats.transport.shed_retried, 0, "{:?}", stats.transport);
    assert!(stats.transport.shed_replies >= shed);
}

/// `sessions` sessions of 3 rounds against a mock with `load`: first one at a time (the
/// reference), then all at once judged against it by the solo oracle (threshold 1 nat).
/// Arguments are checked against the schema only, so a changed value is the oracle's to
/// see. Returns the loaded sessions and how many the mock changed.
async fn oracle_against(
    load: bisect_engine::mock::LoadFault,
    sessions: u32,
) -> (Vec<SessionResult>, usize) {
    let server = MockServer::start(MockConfig {
        under_load: Some(load),
        // Requests overlap under load, not alone.
        jitter_ms: 20,
        ..MockConfig::default()
    })
    .await
    .unwrap();
    let mut workload = sample_workload(sessions, 3);
    workload.check_args = bisect_harness::core::workload::CheckArgs::Schema;
    workload
        .request
        .extra
        .insert("logprobs".into(), true.into());
    workload
        .request
        .extra
        .insert("top_logprobs".into(), 2.into());
    let plan = |concurrency: u32, oracle| DrivePlan {
        api: server.api(),
        model: "mock".into(),
        api_key: None,
        sessions,
        concurrency,
        oracle,
        workload: workload.clone(),
        label: "on".into(),
        repeat: 0,
    };
    let (_, alone) = drive_collected(&plan(1, None), CancellationToken::new())
        .await
        .unwrap();
    assert_eq!(
        server.stats().changed_under_load(),
        0,
        "alone: the task's own calls"
    );
    let clean = |c: SessionClass| matches!(c, SessionClass::Done | SessionClass::Maxrounds);
    assert!(
        alone.iter().all(|s| clean(s.class)),
        "{:?}",
        alone
            .iter()
            .map(|s| (s.class, &s.evidence))
            .collect::<Vec<_>>()
    );
    let oracle = bisect_harness::driver::Oracle {
        references: alone.into_iter().map(|s| (s.index, s)).collect(),
        threshold: 1.0,
    };
    let (_, loaded) = drive_collected(&plan(0, Some(Arc::new(oracle))), CancellationToken::new())
        .await
        .unwrap();
    (loaded, server.stats().changed_under_load())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn near_ties_that_flip_under_load_drift_and_never_diverge() {
    use bisect_engine::mock::LoadFault;
    let (loaded, changed) = oracle_against(LoadFault::NearTieFlip { margin: 0.3 }, 16).await;
    assert!(changed > 0, "the load flipped some near-ties");
    let count = |c| loaded.iter().filter(|s| s.class == c).count();
    assert_eq!(count(SessionClass::Diverged), 0);
    assert_eq!(
        count(SessionClass::Drifted),
        changed,
        "every flipped session drifted"
    );
    for s in loaded.iter().filter(|s| s.class == SessionClass::Drifted) {
        assert!(
            s.evidence.contains("alone's margin 0.30 nats"),
            "{}",
            s.evidence
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_swapped_between_sessions_under_load_all_diverge() {
    use bisect_engine::mock::LoadFault;
    let (loaded, changed) = oracle_against(LoadFault::Swap, 16).await;
    assert!(changed > 0, "the load crossed some requests");
    let count = |c| loaded.iter().filter(|s| s.class == c).count();
    assert_eq!(
        count(SessionClass::Diverged),
        changed,
        "every swapped session diverged"
    );
    assert_eq!(count(SessionClass::Drifted), 0);
    assert_eq!(
        count(SessionClass::Done) + count(SessionClass::Maxrounds),
        loaded.len() - changed
    );
}
