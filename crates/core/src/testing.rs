//! Test support shared with the harness's tests: the real engines' captured replies,
//! logs and metrics (tests/fixtures/engines, described in its README), and a timeline
//! of timed sessions for the trend's tests, and a witness's record for the tests of the
//! never-ran rule.

/// The text of `tests/fixtures/engines/<path>`.
///
/// # Panics
/// When the fixture cannot be read (a test's own mistake).
#[allow(clippy::disallowed_methods)] // Tests only: reading a fixture is their one I/O.
pub fn engine_fixture(path: &str) -> String {
    let full = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/engines")
        .join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// `n` timed sessions with request indices `0..n` and uptime `i / 8` s, corrupted where
/// `bad(i)`: the input of [`crate::trend::bin`] in the trend's, the confound's and the
/// reports' tests.
pub fn trend_timeline(n: u64, bad: impl Fn(u64) -> bool) -> Vec<crate::trend::TimedSession> {
    (0..n)
        .map(|i| crate::trend::TimedSession {
            request_seq: i,
            uptime_s: i as f64 / 8.0,
            life: 0,
            corrupted: bad(i),
        })
        .collect()
}

/// What a block or arm recorded of `flag`'s mechanism `name` at `value`: one witness
/// `witness` (minimum 1) that counted `count`, `needed` when the value lets the path run.
pub fn witnessed(
    (flag, name): (&str, &str),
    (value, needed): (&str, bool),
    witness: &str,
    count: u64,
) -> crate::mechanism::MechanismRecord {
    crate::mechanism::MechanismRecord {
        flag: flag.into(),
        name: name.into(),
        value: value.into(),
        needed,
        fix: String::new(),
        unwatched: None,
        witnesses: vec![crate::mechanism::WitnessReading {
            witness: witness.into(),
            min: 1,
            count,
            unread: vec![],
        }],
    }
}
