//! The floor under the workload driver's throughput (issue: the harness is never the
//! bottleneck): a client that moves exactly the driver's bytes and does nothing else, and a
//! server that does nothing but answer. Whatever the floor loses between 100 and 1000
//! sessions in flight is the machine's (kernel, loopback TCP, scheduler wake-ups), not the
//! driver's. Three modes:
//!
//! - `record --upstream http://127.0.0.1:P --listen-port Q --out FILE`: a recording
//!   HTTP/1.1 proxy. Each accepted connection gets its own upstream connection; requests
//!   (head up to CRLFCRLF, then a Content-Length body) are forwarded one at a time and each
//!   reply is read back the same way (a reply without Content-Length is an error: chunked
//!   replies are not supported). Every POST request's raw bytes are appended to FILE as a
//!   record (u32 little-endian length, then the bytes), and the reply to the first POST is
//!   written raw to FILE.reply. Runs until killed (SIGTERM or Ctrl-C end it cleanly;
//!   records are written whole, so a kill loses nothing already answered). Record the
//!   driver at concurrency 1, so consecutive records are one session's rounds:
//!   `cargo bench --bench driver -- --url http://127.0.0.1:Q/v1 --concurrency 1 --json N`.
//! - `serve --port P --reply FILE.reply`: a bytes-only server, one task per connection,
//!   answering every request (parsed by Content-Length) with the recorded reply, unchanged
//!   (its Date header is stale). TCP_NODELAY.
//! - `drive --url http://127.0.0.1:P --requests FILE --rounds R --sessions N
//!   [--concurrency C] [--json]`: the floor client. The records are grouped into sessions
//!   of R consecutive requests; C connections (TCP_NODELAY; C = 0 or absent: N) are opened
//!   before the clock and, as in the driver, start together and send their first requests
//!   as one wave; then each connection, closed loop, takes the next session number k
//!   from a shared counter and replays recorded session k mod (sessions recorded): writes
//!   each request as recorded (the URL's path is ignored, the requests carry theirs) and
//!   reads the reply to its Content-Length, failing on any status but 200, until N
//!   sessions are done. Prints the fields of `cargo bench --bench driver -- --json` (client
//!   "floor"): round latency is write start to reply complete, send lag is a reply's
//!   completion to the same session's next write, CPU is getrusage(RUSAGE_SELF) user + sys
//!   over the clocked part.
//!
//! Run: `cargo bench --bench floor -- MODE ...`; `scripts/bench-clients.sh` records the
//! driver through `record` and adds floor rows (against the mock, then against `serve`).

mod support;

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::{bail, ensure, Context as _};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use support::{cpu_seconds, percentile_ms, proc_status_kib};

/// Longest message head accepted; a longer one is a framing error, not a request.
const MAX_HEAD: usize = 64 * 1024;
/// Longest message accepted.
const MAX_MESSAGE: usize = 64 * 1024 * 1024;

fn main() -> anyhow::Result<()> {
    // `cargo bench` passes `--bench` to every bench binary.
    let mut args = std::env::args().skip(1).filter(|a| a != "--bench");
    let mode = args.next().unwrap_or_default();
    let mut flags = Flags::default();
    while let Some(arg) = args.next() {
        let Some(name) = arg.strip_prefix("--") else {
            bail!("unexpected argument {arg:?}");
        };
        if name == "json" {
            flags.json = true;
            continue;
        }
        let value = args
            .next()
            .with_context(|| format!("--{name} needs a value"))?;
        flags.values.push((name.to_string(), value));
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match mode.as_str() {
        "record" => {
            let upstream = host_port(&flags.get("upstream")?)?;
            let port: u16 = flags.parse("listen-port")?;
            let out = flags.get("out")?;
            flags.done()?;
            runtime.block_on(record(upstream, port, out))
        }
        "serve" => {
            let port: u16 = flags.parse("port")?;
            let reply = flags.get("reply")?;
            flags.done()?;
            runtime.block_on(serve(port, reply))
        }
        "drive" => {
            let plan = Drive {
                target: host_port(&flags.get("url")?)?,
                requests: flags.get("requests")?,
                rounds: flags.parse("rounds")?,
                sessions: flags.parse("sessions")?,
                concurrency: flags.parse_or("concurrency", 0)?,
            };
            let json = flags.json;
            flags.done()?;
            let row = runtime.block_on(drive(&plan))?;
            if json {
                println!("{}", row.json());
            } else {
                println!("{}", row.summary());
            }
            Ok(())
        }
        other => bail!(
            "usage: floor record --upstream URL --listen-port Q --out FILE | \
             serve --port P --reply FILE | \
             drive --url URL --requests FILE --rounds R --sessions N [--concurrency C] [--json] \
             (got mode {other:?})"
        ),
    }
}

#[derive(Default)]
struct Flags {
    values: Vec<(String, String)>,
    json: bool,
}

impl Flags {
    fn take(&mut self, name: &str) -> Option<String> {
        let i = self.values.iter().position(|(n, _)| n == name)?;
        Some(self.values.remove(i).1)
    }

    fn get(&mut self, name: &str) -> anyhow::Result<String> {
        self.take(name)
            .with_context(|| format!("--{name} is required"))
    }

    fn parse<T: std::str::FromStr>(&mut self, name: &str) -> anyhow::Result<T>
    where
        T::Err: std::error::Error + Send + Sync + 'static,
    {
        let value = self.get(name)?;
        value.parse().with_context(|| format!("--{name} {value:?}"))
    }

    fn parse_or<T: std::str::FromStr>(&mut self, name: &str, default: T) -> anyhow::Result<T>
    where
        T::Err: std::error::Error + Send + Sync + 'static,
    {
        match self.take(name) {
            Some(value) => value.parse().with_context(|| format!("--{name} {value:?}")),
            None => Ok(default),
        }
    }

    /// Every flag given was used.
    fn done(self) -> anyhow::Result<()> {
        match self.values.first() {
            Some((name, _)) => bail!("unknown flag --{name}"),
            None => Ok(()),
        }
    }
}

/// `http://host:port[/path]` -> `host:port` (the path is not used: requests carry theirs).
fn host_port(url: &str) -> anyhow::Result<String> {
    let rest = url
        .strip_prefix("http://")
        .with_context(|| format!("{url:?}: only http:// URLs"))?;
    let authority = rest.split('/').next().unwrap_or_default();
    ensure!(authority.contains(':'), "{url:?}: give the port");
    Ok(authority.to_string())
}

/// The length of the HTTP/1.1 message at the start of `buf`, once its head is complete
/// (None before). A message without Content-Length has no body if it is a request and is
/// an error if it is a reply; chunked transfer is an error either way.
fn message_len(buf: &[u8], reply: bool) -> anyhow::Result<Option<usize>> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        ensure!(
            buf.len() <= MAX_HEAD,
            "no end of headers in the first {MAX_HEAD} bytes"
        );
        return Ok(None);
    };
    let head = std::str::from_utf8(&buf[..end]).context("message head is not UTF-8")?;
    let mut length = None;
    for line in head.split("\r\n").skip(1) {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let name = name.trim();
        if name.eq_ignore_ascii_case("content-length") {
            let n: usize = value
                .trim()
                .parse()
                .with_context(|| format!("bad Content-Length {value:?}"))?;
            length = Some(n);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            bail!("Transfer-Encoding {:?} is not supported", value.trim());
        }
    }
    let body = match length {
        Some(n) => n,
        None if reply => bail!(
            "reply has no Content-Length (chunked replies are not supported): {:?}",
            head.lines().next().unwrap_or_default()
        ),
        None => 0,
    };
    ensure!(
        end + 4 + body <= MAX_MESSAGE,
        "message over {MAX_MESSAGE} bytes"
    );
    Ok(Some(end + 4 + body))
}

/// One connection's read side: a buffer reused for every message.
struct Reader {
    buf: Vec<u8>,
    have: usize,
}

impl Reader {
    fn new(capacity: usize) -> Self {
        Reader {
            buf: vec![0; capacity],
            have: 0,
        }
    }

    /// Reads until a whole message is buffered and returns its length (`self.buf[..len]`);
    /// None when the peer closed cleanly between messages. Call `consume` after use.
    async fn message<S: AsyncRead + Unpin>(
        &mut self,
        stream: &mut S,
        reply: bool,
    ) -> anyhow::Result<Option<usize>> {
        let mut total = None;
        loop {
            if total.is_none() {
                total = message_len(&self.buf[..self.have], reply)?;
            }
            if let Some(total) = total {
                if self.have >= total {
                    return Ok(Some(total));
                }
                if total > self.buf.len() {
                    self.buf.resize(total, 0);
                }
            } else if self.have == self.buf.len() {
                let grown = self.buf.len() * 2;
                self.buf.resize(grown, 0);
            }
            let n = stream.read(&mut self.buf[self.have..]).await?;
            if n == 0 {
                if self.have == 0 {
                    return Ok(None);
                }
                bail!("connection closed mid-message ({} bytes read)", self.have);
            }
            self.have += n;
        }
    }

    /// Drops the first `len` bytes (the message just handled), keeping what follows.
    fn consume(&mut self, len: usize) {
        self.buf.copy_within(len..self.have, 0);
        self.have -= len;
    }
}

// ---------------------------------------------------------------------------------------
// record

struct Recording {
    requests: Mutex<std::fs::File>,
    reply_path: String,
    reply_written: AtomicBool,
    recorded: AtomicU64,
}

async fn record(upstream: String, port: u16, out: String) -> anyhow::Result<()> {
    let requests = std::fs::File::create(&out).with_context(|| format!("creating {out}"))?;
    let recording = Arc::new(Recording {
        requests: Mutex::new(requests),
        reply_path: format!("{out}.reply"),
        reply_written: AtomicBool::new(false),
        recorded: AtomicU64::new(0),
    });
    let listener = TcpListener::bind(("127.0.0.1", port))
        .await
        .with_context(|| format!("binding 127.0.0.1:{port}"))?;
    eprintln!("floor record: 127.0.0.1:{port} -> {upstream}, POST requests to {out}");
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (client, _) = match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        eprintln!("floor record: accept: {e}");
                        continue;
                    }
                };
                let recording = recording.clone();
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    if let Err(e) = proxy(client, &upstream, &recording).await {
                        eprintln!("floor record: connection: {e:#}");
                    }
                });
            }
            _ = terminate.recv() => break,
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    eprintln!(
        "floor record: {} requests recorded",
        recording.recorded.load(Ordering::Relaxed)
    );
    Ok(())
}

/// Relays one client connection over its own upstream connection, a message at a time.
async fn proxy(mut client: TcpStream, upstream: &str, recording: &Recording) -> anyhow::Result<()> {
    client.set_nodelay(true)?;
    let mut server = TcpStream::connect(upstream)
        .await
        .with_context(|| format!("connecting to {upstream}"))?;
    server.set_nodelay(true)?;
    let mut from_client = Reader::new(16 * 1024);
    let mut from_server = Reader::new(16 * 1024);
    while let Some(len) = from_client.message(&mut client, false).await? {
        let request = &from_client.buf[..len];
        let post = request.starts_with(b"POST ");
        if post {
            let mut entry = Vec::with_capacity(4 + len);
            entry.extend_from_slice(&u32::try_from(len)?.to_le_bytes());
            entry.extend_from_slice(request);
            // One write per record: a kill never leaves half of one behind.
            recording
                .requests
                .lock()
                .map_err(|_| anyhow::anyhow!("recording lock poisoned"))?
                .write_all(&entry)?;
            recording.recorded.fetch_add(1, Ordering::Relaxed);
        }
        server.write_all(request).await?;
        from_client.consume(len);
        let Some(len) = from_server.message(&mut server, true).await? else {
            bail!("upstream closed the connection before replying");
        };
        let reply = &from_server.buf[..len];
        if post && !recording.reply_written.swap(true, Ordering::Relaxed) {
            std::fs::write(&recording.reply_path, reply)
                .with_context(|| format!("writing {}", recording.reply_path))?;
        }
        client.write_all(reply).await?;
        from_server.consume(len);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// serve

async fn serve(port: u16, reply_path: String) -> anyhow::Result<()> {
    let reply = std::fs::read(&reply_path).with_context(|| format!("reading {reply_path}"))?;
    ensure!(
        message_len(&reply, true)? == Some(reply.len()),
        "{reply_path} is not exactly one HTTP reply"
    );
    let reply: Arc<[u8]> = reply.into();
    let listener = TcpListener::bind(("127.0.0.1", port))
        .await
        .with_context(|| format!("binding 127.0.0.1:{port}"))?;
    eprintln!(
        "floor serve: 127.0.0.1:{port}, {} reply bytes each",
        reply.len()
    );
    loop {
        let (mut stream, _) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                eprintln!("floor serve: accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                continue;
            }
        };
        let reply = reply.clone();
        tokio::spawn(async move {
            let answer = async {
                stream.set_nodelay(true)?;
                let mut reader = Reader::new(16 * 1024);
                while let Some(len) = reader.message(&mut stream, false).await? {
                    reader.consume(len);
                    stream.write_all(&reply).await?;
                }
                anyhow::Ok(())
            };
            if let Err(e) = answer.await {
                eprintln!("floor serve: connection: {e:#}");
            }
        });
    }
}

// ---------------------------------------------------------------------------------------
// drive

struct Drive {
    target: String,
    requests: String,
    rounds: usize,
    sessions: usize,
    concurrency: usize,
}

struct Row {
    sessions: usize,
    done: u64,
    wall_s: f64,
    requests: u64,
    cpu_s: f64,
    round_ns: Vec<u64>,
    lag_ns: Vec<u64>,
    target_inflight: usize,
    peak_inflight: u64,
    hwm_mib: f64,
}

impl Row {
    fn sessions_per_s(&self) -> f64 {
        self.sessions as f64 / self.wall_s
    }

    fn cpu_s_per_1000(&self) -> f64 {
        if self.requests == 0 {
            return 0.0;
        }
        self.cpu_s * 1000.0 / self.requests as f64
    }

    fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "client": "floor",
            "sessions": self.sessions,
            "done": self.done,
            "wall_s": self.wall_s,
            "sessions_per_s": self.sessions_per_s(),
            "requests": self.requests,
            "cpu_s_per_1000_requests": self.cpu_s_per_1000(),
            "round_p50_ms": percentile_ms(&self.round_ns, 0.50),
            "round_p99_ms": percentile_ms(&self.round_ns, 0.99),
            "lag_p50_ms": percentile_ms(&self.lag_ns, 0.50),
            "lag_p99_ms": percentile_ms(&self.lag_ns, 0.99),
            "target_inflight": self.target_inflight,
            "peak_inflight": self.peak_inflight,
            "peak_rss_mib": self.hwm_mib,
            "metrics_scrapes": 0,
        })
    }

    fn summary(&self) -> String {
        format!(
            "floor: {} sessions ({} done), {} requests, {} in flight (peak {}): {:.3} s, \
             {:.0} sessions/s, {:.4} CPU s / 1000 req, round p50/p99 {:.3}/{:.3} ms, \
             send lag p50/p99 {:.3}/{:.3} ms, VmHWM {:.1} MiB",
            self.sessions,
            self.done,
            self.requests,
            self.target_inflight,
            self.peak_inflight,
            self.wall_s,
            self.sessions_per_s(),
            self.cpu_s_per_1000(),
            percentile_ms(&self.round_ns, 0.50),
            percentile_ms(&self.round_ns, 0.99),
            percentile_ms(&self.lag_ns, 0.50),
            percentile_ms(&self.lag_ns, 0.99),
            self.hwm_mib,
        )
    }
}

/// What one connection did.
#[derive(Default)]
struct Tally {
    sessions: u64,
    requests: u64,
    round_ns: Vec<u64>,
    lag_ns: Vec<u64>,
}

/// The recording, read whole: requests are ranges of it (no copies, so the client's RSS
/// is about the file's size).
struct Recorded {
    data: Vec<u8>,
    /// Per session, its `rounds` requests in order.
    sessions: Vec<Vec<std::ops::Range<usize>>>,
}

impl Recorded {
    fn load(path: &str, rounds: usize) -> anyhow::Result<Self> {
        ensure!(rounds > 0, "--rounds must be at least 1");
        let data = std::fs::read(path).with_context(|| format!("reading {path}"))?;
        let mut requests = Vec::new();
        let mut at = 0;
        while at < data.len() {
            let header = data
                .get(at..at + 4)
                .with_context(|| format!("{path}: truncated record length"))?;
            let len = u32::from_le_bytes(header.try_into()?) as usize;
            let range = at + 4..at + 4 + len;
            let request = data
                .get(range.clone())
                .with_context(|| format!("{path}: truncated record"))?;
            ensure!(
                message_len(request, false)? == Some(len),
                "{path}: record {} is not exactly one HTTP request",
                requests.len()
            );
            at = range.end;
            requests.push(range);
        }
        ensure!(
            !requests.is_empty() && requests.len() % rounds == 0,
            "{path}: {} requests are not whole sessions of {rounds} rounds \
             (record the driver at --concurrency 1, every session to the end)",
            requests.len()
        );
        let sessions = requests.chunks(rounds).map(<[_]>::to_vec).collect();
        Ok(Recorded { data, sessions })
    }

    /// Session `k`'s requests: recorded session k mod the number recorded.
    fn session(&self, k: usize) -> impl Iterator<Item = &[u8]> {
        self.sessions[k % self.sessions.len()]
            .iter()
            .map(|range| &self.data[range.clone()])
    }
}

async fn drive(plan: &Drive) -> anyhow::Result<Row> {
    let recorded = Arc::new(Recorded::load(&plan.requests, plan.rounds)?);
    let target_inflight = match plan.concurrency {
        0 => plan.sessions,
        c => c.min(plan.sessions),
    };
    let mut connections = Vec::with_capacity(target_inflight);
    for _ in 0..target_inflight {
        let stream = TcpStream::connect(&plan.target)
            .await
            .with_context(|| format!("connecting to {}", plan.target))?;
        stream.set_nodelay(true)?;
        connections.push(stream);
    }
    let next = Arc::new(AtomicUsize::new(0));
    let inflight = Arc::new(AtomicU64::new(0));
    let peak = Arc::new(AtomicU64::new(0));
    let sessions = plan.sessions;
    // As in the driver: every connection's task waits at this gate until all are spawned
    // (the clock starts when it opens), and the first wave holds each connection's first
    // reply until every connection has written its first request.
    let (start, gate) = tokio::sync::watch::channel(false);
    let wave = Arc::new(FirstWave::new(target_inflight));
    let tasks: Vec<_> = connections
        .into_iter()
        .map(|mut stream| {
            let (recorded, next) = (recorded.clone(), next.clone());
            let (inflight, peak) = (inflight.clone(), peak.clone());
            let mut gate = gate.clone();
            let wave = wave.clone();
            tokio::spawn(async move {
                let mut tally = Tally::default();
                let mut reader = Reader::new(4096);
                let mut seat = Seat(Some(wave.clone()));
                gate.wait_for(|&open| open).await?;
                loop {
                    let k = next.fetch_add(1, Ordering::Relaxed);
                    if k >= sessions {
                        break;
                    }
                    let mut replied: Option<Instant> = None;
                    for request in recorded.session(k) {
                        let sent = Instant::now();
                        if let Some(replied) = replied {
                            tally.lag_ns.push((sent - replied).as_nanos() as u64);
                        }
                        let now = inflight.fetch_add(1, Ordering::Relaxed) + 1;
                        peak.fetch_max(now, Ordering::Relaxed);
                        stream.write_all(request).await?;
                        let first = seat.sent();
                        let Some(len) = reader.message(&mut stream, true).await? else {
                            bail!("server closed the connection before replying");
                        };
                        if !reader.buf.starts_with(b"HTTP/1.1 200 ") {
                            let head = String::from_utf8_lossy(&reader.buf[..len.min(200)]);
                            bail!("session {k}: reply is not 200: {head:?}");
                        }
                        reader.consume(len);
                        ensure!(reader.have == 0, "bytes after the reply (unasked-for data)");
                        tally.round_ns.push(sent.elapsed().as_nanos() as u64);
                        tally.requests += 1;
                        if first {
                            wave.all_sent().await;
                        }
                        inflight.fetch_sub(1, Ordering::Relaxed);
                        replied = Some(Instant::now());
                    }
                    tally.sessions += 1;
                }
                anyhow::Ok(tally)
            })
        })
        .collect();
    let cpu_before = cpu_seconds();
    let started = Instant::now();
    start.send_replace(true);
    let mut total = Tally::default();
    for task in tasks {
        let tally = task.await??;
        total.sessions += tally.sessions;
        total.requests += tally.requests;
        total.round_ns.extend(tally.round_ns);
        total.lag_ns.extend(tally.lag_ns);
    }
    let wall_s = started.elapsed().as_secs_f64();
    let cpu_s = cpu_seconds() - cpu_before;
    total.round_ns.sort_unstable();
    total.lag_ns.sort_unstable();
    Ok(Row {
        sessions,
        done: total.sessions,
        wall_s,
        requests: total.requests,
        cpu_s,
        round_ns: total.round_ns,
        lag_ns: total.lag_ns,
        target_inflight,
        peak_inflight: peak.load(Ordering::Relaxed),
        hwm_mib: proc_status_kib("VmHWM:").unwrap_or(0) as f64 / 1024.0,
    })
}

/// The driver's opening burst (the harness's `FirstWave`): every connection's first
/// request is written before any connection acts on its first reply. Without it a fast
/// server answers the first connections' rounds before the runtime has polled the last
/// ones, and the target load is never reached.
struct FirstWave {
    remaining: AtomicUsize,
    sent: tokio::sync::watch::Sender<bool>,
}

impl FirstWave {
    fn new(connections: usize) -> Self {
        FirstWave {
            remaining: AtomicUsize::new(connections),
            sent: tokio::sync::watch::Sender::new(connections == 0),
        }
    }

    fn arrive(&self) {
        if self.remaining.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.sent.send_replace(true);
        }
    }

    /// Until every connection has written its first request (or given up).
    async fn all_sent(&self) {
        // The sender lives as long as `self`: waiting cannot fail.
        let _ = self.sent.subscribe().wait_for(|&sent| sent).await;
    }
}

/// A connection's place in the first wave; counts as sent when written or dropped, so a
/// connection that fails first never holds the others.
struct Seat(Option<Arc<FirstWave>>);

impl Seat {
    /// Marks the first request written; true the first time only.
    fn sent(&mut self) -> bool {
        match self.0.take() {
            Some(wave) => {
                wave.arrive();
                true
            }
            None => false,
        }
    }
}

impl Drop for Seat {
    fn drop(&mut self) {
        self.sent();
    }
}
