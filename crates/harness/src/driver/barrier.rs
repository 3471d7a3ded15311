//! The optional round barrier (`workload.barrier`): every live session finishes round r
//! before any starts round r+1, so all rounds hit the engine as synchronized waves.
//! Sessions that end (done, first bad round, cancelled) leave the barrier, which then
//! stops waiting for them; leaving happens in `Drop`, so a cancelled session can never
//! strand the others.

use parking_lot::Mutex;
use tokio::sync::watch;

#[derive(Debug)]
struct State {
    /// Sessions that may still arrive.
    members: usize,
    /// Sessions waiting in the current generation.
    arrived: usize,
    generation: u64,
}

#[derive(Debug)]
pub(crate) struct RoundBarrier {
    state: Mutex<State>,
    released: watch::Sender<u64>,
}

impl RoundBarrier {
    pub fn new(members: usize) -> Self {
        RoundBarrier {
            state: Mutex::new(State {
                members,
                arrived: 0,
                generation: 0,
            }),
            released: watch::Sender::new(0),
        }
    }

    /// A member's place at the barrier; dropping it leaves.
    pub fn seat(&self) -> BarrierSeat<'_> {
        BarrierSeat { barrier: self }
    }

    fn release(&self, state: &mut State) {
        state.arrived = 0;
        state.generation += 1;
        self.released.send_replace(state.generation);
    }

    async fn arrive_and_wait(&self) {
        let mut released = self.released.subscribe();
        let generation = {
            let mut state = self.state.lock();
            state.arrived += 1;
            if state.arrived >= state.members {
                self.release(&mut state);
                return;
            }
            state.generation
        };
        // The sender lives in self, so the channel cannot close while we wait.
        let _ = released.wait_for(|g| *g > generation).await;
    }

    fn leave(&self) {
        let mut state = self.state.lock();
        state.members = state.members.saturating_sub(1);
        if state.arrived > 0 && state.arrived >= state.members {
            self.release(&mut state);
        }
    }
}

pub(crate) struct BarrierSeat<'a> {
    barrier: &'a RoundBarrier,
}

impl BarrierSeat<'_> {
    /// Waits until every remaining member has finished the current round.
    pub async fn wait(&self) {
        self.barrier.arrive_and_wait().await;
    }
}

impl Drop for BarrierSeat<'_> {
    fn drop(&mut self) {
        self.barrier.leave();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn waits_for_all_then_releases_and_leavers_do_not_block() {
        let barrier = Arc::new(RoundBarrier::new(3));
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for member in 0..3u32 {
            let barrier = barrier.clone();
            let log = log.clone();
            tasks.push(tokio::spawn(async move {
                let seat = barrier.seat();
                // Member 2 leaves after round 1; rounds 2 and 3 must not wait for it.
                let rounds = if member == 2 { 1 } else { 3 };
                for round in 1..=rounds {
                    tokio::time::sleep(Duration::from_millis(u64::from(member) * 20)).await;
                    log.lock().push(round);
                    if round < rounds {
                        seat.wait().await;
                    }
                }
            }));
        }
        for t in tasks {
            tokio::time::timeout(Duration::from_secs(10), t)
                .await
                .expect("barrier must not deadlock")
                .unwrap();
        }
        let log = log.lock().clone();
        assert_eq!(log, vec![1, 1, 1, 2, 2, 3, 3]);
    }
}
