//! Connection set-up toward the engine, paced, so that bisect puts a server under the
//! load a plain client can instead of storming it (issue: a thread-per-connection server
//! with the standard library's listen backlog of 5).
//!
//! Why pacing: the kernel completes a TCP handshake without the server, and queues the
//! connection until the server's `accept`. A queue that holds `backlog + 1` connections
//! is full after six fast connects to a server whose accept loop is slow (Python's, under
//! its GIL), and the kernel then drops further SYNs: the client's kernel sends each again
//! after 1 s, then 3 s, then 7 s. Dozens of connects issued in the same microsecond (every
//! slot opening its connection at once) made hundreds of such drops, sessions that timed
//! out in their first round, and an engine that ran a fraction of the load asked. A
//! plain threaded client never does this: starting a thread spaces its connects.
//!
//! The [`ConnectGate`] of a drive spaces connection starts by a gap (250 us at first:
//! 4000 connects a second, 80 connections in 20 ms) and keeps at most a window of
//! handshakes unfinished. A connect still unanswered long after the usual connect time
//! (ten times the median of the recent ones, at least 20 ms) is taken for a dropped SYN:
//! it is abandoned and started again at the next paced start instead of waiting the
//! kernel's one-second retransmission, and the gap widens (doubling, up to 50 ms), so
//! the pacing settles at the rate the server accepts; a connect refused or slow does the
//! same, and fast ones narrow the gap back. Refused and reset connects are tried again with a backoff (the request was
//! never sent, so nothing is sent twice) until the caller's deadline. Every connect's
//! time is measured apart from reply time, and the tally becomes the arm's
//! [`TransportStats`].

use crate::core::stats::percentile;
use crate::core::transport::{TransportStats, SLOW_CONNECT_MS};
use parking_lot::Mutex;
use std::io;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::Semaphore;
use tokio::time::Instant;

/// How connection starts are spaced.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pacing {
    /// The gap between two connection starts while connects come back fast.
    pub gap: Duration,
    /// The widest the gap grows when connects come back slow or refused.
    pub(crate) max_gap: Duration,
    /// Handshakes unfinished at once.
    pub window: usize,
}

impl Default for Pacing {
    fn default() -> Self {
        Pacing {
            gap: Duration::from_micros(250),
            max_gap: Duration::from_millis(50),
            window: 16,
        }
    }
}

impl Pacing {
    /// Every connect at once, as the driver did before pacing (benchmarks compare).
    pub fn unpaced() -> Self {
        Pacing {
            gap: Duration::ZERO,
            max_gap: Duration::ZERO,
            window: Semaphore::MAX_PERMITS,
        }
    }
}

/// The first wait before trying a refused connect again; doubled each time, up to
/// [`MAX_RETRY_BACKOFF`].
const FIRST_RETRY_BACKOFF: Duration = Duration::from_millis(10);
const MAX_RETRY_BACKOFF: Duration = Duration::from_millis(500);

/// A connect unanswered this many times the recent median connect time is stalled...
const STALL_FACTOR: u32 = 10;
/// ...but never sooner than this (a busy machine delays a loopback handshake too).
const STALL_FLOOR: Duration = Duration::from_millis(20);
/// Recent connect times kept for the median.
const RECENT: usize = 32;

/// Why a connect gave up.
#[derive(Debug)]
pub enum ConnectFailure {
    /// Not established before the deadline.
    Timeout,
    /// An error not worth retrying, or a retryable one when the deadline left no room.
    Error(io::Error),
}

#[derive(Debug, Default)]
struct Tally {
    connect_us: Vec<u64>,
    /// The last [`RECENT`] connect times, oldest overwritten first.
    recent_us: std::collections::VecDeque<u64>,
    stalled: u64,
    slow: u64,
    refused: u64,
    reset: u64,
    failed: u64,
    abandoned: u64,
    shed: u64,
    shed_retried: u64,
    widest_gap: Duration,
}

#[derive(Debug)]
struct Schedule {
    /// The earliest moment the next connection may start.
    next_start: Option<Instant>,
    gap: Duration,
    /// Widenings so far. A connect widens the gap only if none happened since it was
    /// scheduled: the connects of one congestion event (all stalled on the same full
    /// queue) widen it once, not once each (which drove it to the cap at once).
    epoch: u64,
}

/// The pacer every connection of one drive goes through; see the module doc.
#[derive(Debug)]
pub struct ConnectGate {
    pacing: Pacing,
    window: Semaphore,
    schedule: Mutex<Schedule>,
    tally: Mutex<Tally>,
    /// Connects in progress now (pacing wait included): the metrics poller's sample of
    /// "still connecting" for the load-gap attribution.
    connecting: std::sync::atomic::AtomicU64,
    /// Set once an engine of the block died ([`ConnectGate::engine_died`]): a refused or
    /// reset connect is the death's, not a busy server's, and is not tried again (the
    /// block's remaining sessions end at once instead of each waiting out its round).
    engine_dead: std::sync::atomic::AtomicBool,
}

impl Default for ConnectGate {
    fn default() -> Self {
        ConnectGate::new(Pacing::default())
    }
}

/// Counts a connect in progress, and one cut off when dropped unfinished.
struct Attempt<'a> {
    gate: &'a ConnectGate,
    finished: bool,
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        use std::sync::atomic::Ordering;
        self.gate.connecting.fetch_sub(1, Ordering::SeqCst);
        if !self.finished {
            self.gate.tally.lock().abandoned += 1;
        }
    }
}

/// Why a connect attempt is worth another try.
enum Retry {
    Refused,
    Reset,
    /// No answer to the SYN within the stall limit: tried again at once (paced).
    Stalled,
}

fn retryable(error: &io::Error) -> Option<Retry> {
    match error.kind() {
        io::ErrorKind::ConnectionRefused => Some(Retry::Refused),
        io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted => Some(Retry::Reset),
        io::ErrorKind::TimedOut => Some(Retry::Stalled),
        _ => None,
    }
}

impl ConnectGate {
    pub fn new(pacing: Pacing) -> Self {
        ConnectGate {
            window: Semaphore::new(pacing.window.min(Semaphore::MAX_PERMITS)),
            schedule: Mutex::new(Schedule {
                next_start: None,
                gap: pacing.gap,
                epoch: 0,
            }),
            tally: Mutex::new(Tally {
                widest_gap: pacing.gap,
                ..Tally::default()
            }),
            pacing,
            connecting: Default::default(),
            engine_dead: Default::default(),
        }
    }

    /// When the last connection scheduled so far starts (None before the first).
    pub(crate) fn last_start(&self) -> Option<Instant> {
        let schedule = self.schedule.lock();
        schedule.next_start.map(|next| next - schedule.gap)
    }

    /// Connects now in progress.
    pub fn connecting(&self) -> u64 {
        self.connecting.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// An engine of the block died: from now on a refused or reset connect fails at once.
    pub(crate) fn engine_died(&self) {
        self.engine_dead
            .store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether an engine of the block was seen dead ([`ConnectGate::engine_died`]): the
    /// drive starts no new session after it (the rest of the arm runs on a restarted
    /// engine, `arm::Testbed::drive_observed`).
    pub(crate) fn is_engine_dead(&self) -> bool {
        self.engine_dead.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Opens a TCP connection to `host:port`, paced, retrying refused and reset
    /// connects until `deadline`.
    pub async fn connect(
        &self,
        host: &str,
        port: u16,
        deadline: Instant,
    ) -> Result<TcpStream, ConnectFailure> {
        self.connecting
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut attempt = Attempt {
            gate: self,
            finished: false,
        };
        let mut backoff = FIRST_RETRY_BACKOFF;
        loop {
            let outcome = tokio::time::timeout_at(deadline, self.connect_once(host, port)).await;
            let (error, epoch) = match outcome {
                // Unfinished: the attempt's drop counts it as abandoned.
                Err(_) => return Err(ConnectFailure::Timeout),
                Ok((Ok(stream), _)) => {
                    attempt.finished = true;
                    return Ok(stream);
                }
                Ok((Err(error), epoch)) => (error, epoch),
            };
            let Some(retry) = retryable(&error) else {
                attempt.finished = true;
                self.tally.lock().failed += 1;
                return Err(ConnectFailure::Error(error));
            };
            {
                let mut tally = self.tally.lock();
                match retry {
                    Retry::Refused => tally.refused += 1,
                    Retry::Reset => tally.reset += 1,
                    Retry::Stalled => tally.stalled += 1,
                }
            }
            if self.engine_dead.load(std::sync::atomic::Ordering::SeqCst)
                && !matches!(retry, Retry::Stalled)
            {
                attempt.finished = true;
                self.tally.lock().failed += 1;
                return Err(ConnectFailure::Error(error));
            }
            self.widen(epoch);
            if matches!(retry, Retry::Stalled) {
                // The widened pacing is the wait: the queue drains while the others go.
                continue;
            }
            if Instant::now() + backoff >= deadline {
                attempt.finished = true;
                self.tally.lock().failed += 1;
                return Err(ConnectFailure::Error(error));
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_RETRY_BACKOFF);
        }
    }

    /// One handshake: a window place, then the next start in the schedule. Also
    /// returns the pacing epoch it was scheduled in.
    async fn connect_once(&self, host: &str, port: u16) -> (io::Result<TcpStream>, u64) {
        let Ok(_place) = self.window.acquire().await else {
            return (Err(io::Error::other("connect window closed")), 0);
        };
        let (start, epoch) = {
            let mut schedule = self.schedule.lock();
            let now = Instant::now();
            let start = schedule.next_start.map_or(now, |next| next.max(now));
            schedule.next_start = Some(start + schedule.gap);
            (start, schedule.epoch)
        };
        (self.handshake(host, port, start, epoch).await, epoch)
    }

    async fn handshake(
        &self,
        host: &str,
        port: u16,
        start: Instant,
        epoch: u64,
    ) -> io::Result<TcpStream> {
        if start > Instant::now() {
            tokio::time::sleep_until(start).await;
        }
        let began = Instant::now();
        let connecting = TcpStream::connect((host, port));
        let result = match self.stall_limit() {
            Some(limit) => match tokio::time::timeout(limit, connecting).await {
                Ok(result) => result,
                Err(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no answer to the SYN within {} ms", limit.as_millis()),
                    ))
                }
            },
            None => connecting.await,
        };
        let took = began.elapsed();
        if result.is_ok() {
            let slow = took.as_secs_f64() * 1000.0 >= SLOW_CONNECT_MS;
            {
                let mut tally = self.tally.lock();
                let us = took.as_micros() as u64;
                tally.connect_us.push(us);
                if tally.recent_us.len() == RECENT {
                    tally.recent_us.pop_front();
                }
                tally.recent_us.push_back(us);
                if slow {
                    tally.slow += 1;
                }
            }
            if slow {
                self.widen(epoch);
            } else {
                self.narrow();
            }
        }
        result
    }

    /// How long a connect may go unanswered before it counts as stalled: None until a
    /// connect has completed (the first ones wait as long as the caller lets them).
    fn stall_limit(&self) -> Option<Duration> {
        let tally = self.tally.lock();
        if tally.recent_us.is_empty() {
            return None;
        }
        let mut recent: Vec<u64> = tally.recent_us.iter().copied().collect();
        recent.sort_unstable();
        let median = Duration::from_micros(recent[recent.len() / 2]);
        Some((median * STALL_FACTOR).max(STALL_FLOOR))
    }

    /// Doubles the gap, unless it already widened since `epoch`.
    fn widen(&self, epoch: u64) {
        let mut schedule = self.schedule.lock();
        if schedule.epoch != epoch {
            return;
        }
        schedule.epoch += 1;
        let wider = (schedule.gap * 2)
            .max(Duration::from_millis(1))
            .min(self.pacing.max_gap);
        schedule.gap = schedule.gap.max(wider);
        let mut tally = self.tally.lock();
        tally.widest_gap = tally.widest_gap.max(schedule.gap);
    }

    fn narrow(&self) {
        let mut schedule = self.schedule.lock();
        if schedule.gap > self.pacing.gap {
            schedule.gap = (schedule.gap - schedule.gap / 32).max(self.pacing.gap);
        }
    }

    /// A reply of 429 or 503 (`retried`: the request was sent again after Retry-After).
    pub(crate) fn note_shed(&self, retried: bool) {
        let mut tally = self.tally.lock();
        tally.shed += 1;
        if retried {
            tally.shed_retried += 1;
        }
    }

    /// The tally so far, as the arm's transport statistics.
    pub fn stats(&self) -> TransportStats {
        let tally = self.tally.lock();
        let mut times = tally.connect_us.clone();
        times.sort_unstable();
        let ms = |q: f64| percentile(&times, q) as f64 / 1000.0;
        TransportStats {
            connects: times.len() as u64,
            connect_ms_p50: ms(0.50),
            connect_ms_p99: ms(0.99),
            connect_ms_max: times.last().map_or(0.0, |&us| us as f64 / 1000.0),
            slow_connects: tally.slow,
            stalled_connects: tally.stalled,
            refused_retried: tally.refused,
            reset_retried: tally.reset,
            failed: tally.failed,
            abandoned: tally.abandoned,
            shed_replies: tally.shed,
            shed_retried: tally.shed_retried,
            pacing_gap_ms_max: tally.widest_gap.as_secs_f64() * 1000.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn connection_starts_are_spaced_by_the_gap() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let gate = std::sync::Arc::new(ConnectGate::new(Pacing {
            gap: Duration::from_millis(10),
            max_gap: Duration::from_millis(50),
            window: 16,
        }));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..5 {
            let gate = gate.clone();
            tasks.push(tokio::spawn(async move {
                let far = Instant::now() + Duration::from_secs(60);
                gate.connect("127.0.0.1", port, far).await.unwrap();
                Instant::now() - started
            }));
        }
        let mut at: Vec<Duration> = Vec::new();
        for task in tasks {
            at.push(task.await.unwrap());
        }
        at.sort();
        // The fifth start waited four gaps (a sleep never ends early).
        assert!(at[4] >= Duration::from_millis(40), "{at:?}");
        assert_eq!(gate.stats().connects, 5);
        assert_eq!(gate.connecting(), 0);
    }

    #[tokio::test]
    async fn a_refused_connect_is_retried_until_the_server_listens() {
        // A port nobody listens on yet: refused, then the listener appears.
        let port = {
            let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            probe.local_addr().unwrap().port()
        };
        let gate = std::sync::Arc::new(ConnectGate::default());
        let connecting = {
            let gate = gate.clone();
            tokio::spawn(async move {
                let deadline = Instant::now() + Duration::from_secs(10);
                gate.connect("127.0.0.1", port, deadline).await
            })
        };
        tokio::time::sleep(Duration::from_millis(60)).await;
        let _listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        assert!(connecting.await.unwrap().is_ok());
        let stats = gate.stats();
        assert!(stats.refused_retried >= 1, "{stats:?}");
        assert_eq!(stats.connects, 1);
        assert_eq!(stats.failed, 0);
        assert!(
            stats.pacing_gap_ms_max >= 1.0,
            "a refusal widens the gap: {stats:?}"
        );
    }

    #[tokio::test]
    async fn refused_until_the_deadline_fails_with_the_error() {
        let port = {
            let probe = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            probe.local_addr().unwrap().port()
        };
        let gate = ConnectGate::default();
        let deadline = Instant::now() + Duration::from_millis(100);
        match gate.connect("127.0.0.1", port, deadline).await {
            Err(ConnectFailure::Error(e)) => {
                assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused)
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
        let stats = gate.stats();
        assert_eq!(stats.connects, 0);
        assert_eq!(stats.failed, 1);
        assert!(stats.refused_retried >= 2, "{stats:?}");
    }
}
