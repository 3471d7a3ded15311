//! Test-only fault hook: `BISECT_FAULT_PAUSE=<phase>[:<n>]` parks the process at the
//! `n`th time (default 1st) it reaches `phase`, after printing `fault-pause: <phase>` on
//! stderr, until a signal arrives (or 600 s pass). The fault-injection suite
//! (tests/integration/faults.rs) uses it to deliver SIGINT, SIGTERM, SIGHUP or kill -9
//! in a known phase without guessing at timings. Phases: `editing` (between two launch
//! configs' writes), `restarting` (engines spawned or restart commands done, before the
//! health wait), `health` (inside the health wait), `workload` (after the first session
//! of a block came back), `results` (between writing run.json and the other reports).
//!
//! Why an environment variable and not the `fail` crate's failpoints behind a cargo
//! feature: the suite drives the very binary users run (`CARGO_BIN_EXE_bisect`), which
//! `cargo test` builds without extra features, and a pause (not an injected error) is
//! all the suite needs: the fault itself is a real signal. Unset, the hook costs one
//! environment lookup per phase point and does nothing; it is not a user interface.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The variable that arms the hook.
pub const ENV: &str = "BISECT_FAULT_PAUSE";

static RELEASED: AtomicBool = AtomicBool::new(false);

fn hits() -> &'static Mutex<HashMap<String, u32>> {
    static HITS: OnceLock<Mutex<HashMap<String, u32>>> = OnceLock::new();
    HITS.get_or_init(|| Mutex::new(HashMap::new()))
}

/// `phase[:n]` -> (phase, n).
fn parse(spec: &str) -> Option<(&str, u32)> {
    match spec.split_once(':') {
        Some((phase, n)) => Some((phase, n.trim().parse().ok().filter(|n| *n > 0)?)),
        None => Some((spec, 1)),
    }
}

/// Called by the signal handler: a paused process resumes, and then meets the
/// cancellation like any other code in that phase.
pub fn release() {
    RELEASED.store(true, Ordering::SeqCst);
}

/// Pauses here when `BISECT_FAULT_PAUSE` names this phase and hit (see the module doc).
/// Blocks the calling thread until a signal arrives.
pub fn pause(phase: &str) {
    let Ok(spec) = std::env::var(ENV) else {
        return;
    };
    let Some((wanted, nth)) = parse(spec.trim()) else {
        return;
    };
    if wanted != phase {
        return;
    }
    let hit = {
        let mut hits = hits().lock().unwrap_or_else(|e| e.into_inner());
        let n = hits.entry(phase.to_string()).or_insert(0);
        *n += 1;
        *n
    };
    if hit != nth {
        return;
    }
    eprintln!("fault-pause: {phase}");
    let wait = || {
        let until = Instant::now() + Duration::from_secs(600);
        while !RELEASED.load(Ordering::SeqCst) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(10));
        }
    };
    // On a runtime worker, hand its other tasks (the signal handler among them) to
    // another thread first, so the pause cannot starve them even with one worker.
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(wait)
        }
        _ => wait(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_name_a_phase_and_an_optional_hit() {
        assert_eq!(parse("workload"), Some(("workload", 1)));
        assert_eq!(parse("results:2"), Some(("results", 2)));
        assert_eq!(parse("results:0"), None);
        assert_eq!(parse("results:x"), None);
    }
}
