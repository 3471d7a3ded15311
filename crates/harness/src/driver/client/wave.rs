//! The opening burst of a drive ([`FirstWave`]): each slot's seat, which holds its first
//! reply until every slot's first request is dispatched.

use std::sync::atomic::{AtomicU64, Ordering};

/// The opening burst: every slot's first request is dispatched before any slot acts on
/// its first reply. Without it, against a fast server, the runtime ran the first
/// sessions' later rounds (woken tasks go first) before it had even polled the last
/// slots, and the burst of C requests never happened (185 in flight of 1000 against the
/// zero-work mock). Real engines take longer than dispatching C requests, so there it
/// changes nothing.
#[derive(Debug)]
pub struct FirstWave {
    remaining: AtomicU64,
    pub(super) all_sent: tokio_util::sync::CancellationToken,
}

impl FirstWave {
    pub fn new(slots: u32) -> Self {
        let wave = FirstWave {
            remaining: AtomicU64::new(u64::from(slots)),
            all_sent: tokio_util::sync::CancellationToken::new(),
        };
        if slots == 0 {
            wave.all_sent.cancel();
        }
        wave
    }

    /// One slot's place in the wave; it counts as sent when dispatched or dropped (a
    /// slot that fails or stops before sending never holds the others).
    pub fn seat(self: &std::sync::Arc<Self>) -> WaveSeat {
        WaveSeat {
            wave: Some(self.clone()),
        }
    }

    fn arrive(&self) {
        if self.remaining.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.all_sent.cancel();
        }
    }
}

pub struct WaveSeat {
    pub(super) wave: Option<std::sync::Arc<FirstWave>>,
}

impl WaveSeat {
    pub(super) fn sent(&mut self) {
        if let Some(wave) = self.wave.take() {
            wave.arrive();
        }
    }
}

impl Drop for WaveSeat {
    fn drop(&mut self) {
        self.sent();
    }
}
