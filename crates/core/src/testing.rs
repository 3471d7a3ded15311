//! Test support shared with the harness's tests: the real engines' captured replies,
//! logs and metrics (tests/fixtures/engines, described in its README).

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
