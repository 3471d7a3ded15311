//! The death watch of one arm block (docs/design.md 3.7, "Engine deaths"): while the
//! block's sessions run, each role is watched: a process bisect spawned by its exit
//! status (`control::death::exit_of`, read without reaping it), any other role by its
//! health port refusing connections. The first sign of a death records it with the time
//! into the block and the requests in flight then; from that moment the block's connect
//! pacer tries no refused connect again (the rest of the block ends at once), and the
//! collector classes every session that failed as `crashed` rather than as an error or a
//! timeout: a dead engine's refused connections are the death's.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use crate::control::death::{exit_of, refuses};
use crate::control::SpawnedRole;
use crate::core::deaths::EngineDeath;
use crate::core::session::{RoundClass, SessionClass, SessionResult};
use crate::driver::InFlight;

/// Log lines kept before a death.
const LOG_LINES: usize = 20;

pub(super) struct DeathWatch {
    spawned: Vec<SpawnedRole>,
    /// Roles bisect did not spawn: (role, health URL).
    others: Vec<(String, String)>,
    started: Instant,
    inflight: Arc<InFlight>,
    seen: Mutex<Vec<EngineDeath>>,
    /// The client's peak in flight over the previous poll window: with the current
    /// window's, the load a death noticed now came at.
    last_window: Mutex<u64>,
}

impl DeathWatch {
    pub(super) fn new(
        spawned: Vec<SpawnedRole>,
        others: Vec<(String, String)>,
        inflight: Arc<InFlight>,
    ) -> Self {
        DeathWatch {
            spawned,
            others,
            started: Instant::now(),
            inflight,
            seen: Mutex::new(Vec::new()),
            last_window: Mutex::new(0),
        }
    }

    /// Times deaths from `started` (the block's drive start, so a death on a later
    /// engine life reads as seconds into the block, as the restarts do).
    pub(super) fn timed_from(mut self, started: Instant) -> Self {
        self.started = started;
        self
    }

    fn dead(&self, role: &str) -> bool {
        self.seen.lock().iter().any(|d| d.role == role)
    }

    fn record(&self, death: EngineDeath) {
        let mut seen = self.seen.lock();
        if !seen.iter().any(|d| d.role == death.role) {
            seen.push(death);
            self.inflight.gate().engine_died();
        }
    }

    /// Looks at every role not yet dead; true when some role has died by now.
    pub(super) async fn poll(&self) -> bool {
        // The client's own count over this window and the one before: a death is
        // noticed up to a poll period after it, when the requests it cut are gone from
        // the count (the count now would say 0 of a death at full load).
        let in_flight = {
            let mut last = self.last_window.lock();
            let window = self.inflight.take_recent_peak();
            let around = window.max(*last);
            *last = window;
            around
        };
        for s in &self.spawned {
            if self.dead(&s.role) {
                continue;
            }
            if let Some(exit) = exit_of(s.pid) {
                let log_tail = engine_tail(&s.log);
                self.record(EngineDeath {
                    role: s.role.clone(),
                    at_s: self.started.elapsed().as_secs_f64(),
                    in_flight,
                    engine_running: self.inflight.engine_running(&s.role),
                    exit: Some(exit),
                    log_tail,
                });
            }
        }
        for (role, health) in &self.others {
            if !self.dead(role) && refuses(health).await {
                self.record(EngineDeath {
                    role: role.clone(),
                    at_s: self.started.elapsed().as_secs_f64(),
                    in_flight,
                    engine_running: self.inflight.engine_running(role),
                    exit: None,
                    log_tail: Vec::new(),
                });
            }
        }
        !self.seen.lock().is_empty()
    }

    /// The deaths seen, in the order noticed.
    pub(super) fn deaths(&self) -> Vec<EngineDeath> {
        self.seen.lock().clone()
    }

    /// A failed session, once an engine of the block died, is the death's: `crashed`,
    /// its failing round too, with the death and the round's own evidence.
    pub(super) async fn judge(&self, session: &mut SessionResult) {
        if !session.class.is_failure() {
            return;
        }
        // A connection the death reset can reach the client a moment before the
        // kernel's record of the exit is readable: one second look.
        if !self.poll().await {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            if !self.poll().await {
                return;
            }
        }
        let Some(death) = self.seen.lock().first().cloned() else {
            return;
        };
        let evidence = format!(
            "crashed: {}; the session's round: {}",
            death.describe(),
            session.evidence
        );
        if let Some(round) = session
            .rounds
            .iter_mut()
            .rev()
            .find(|r| matches!(r.class, RoundClass::Error | RoundClass::Timeout))
        {
            round.class = RoundClass::Crashed;
            round.evidence = evidence.clone();
        }
        session.class = SessionClass::Crashed;
        session.evidence = evidence;
    }
}

/// The dead engine's last [`LOG_LINES`] lines without its echoes of bisect's own polls
/// (core::root_cause::is_poll_echo), with a first line saying how many were left out.
fn engine_tail(log: &std::path::Path) -> Vec<String> {
    let text = match std::fs::read(log) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) => return vec![format!("(cannot read {}: {e})", log.display())],
    };
    let (mut tail, skipped) = crate::core::root_cause::tail_without_polls(&text, LOG_LINES);
    if skipped > 0 {
        tail.insert(
            0,
            format!("[{skipped} lines of the engine logging bisect's own polls (/metrics, /health) left out]"),
        );
    }
    tail
}
