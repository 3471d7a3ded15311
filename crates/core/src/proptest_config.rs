//! Shared settings of every property test (docs/property-tests.md): how many cases each
//! property runs and which seed drives it (the harness adds where properties that touch
//! files keep them). Built for this crate's tests and, with the `test-support` feature,
//! for the harness's.
//!
//! `BISECT_PROPTEST_CASES` sets the cases per property (default 10,000, what CI runs);
//! `BISECT_PROPTEST_SEED` the RNG seed. The seed is fixed by default so a CI run is
//! reproducible; a long run passes another seed to explore inputs CI never saw.

use proptest::test_runner::{Config, RngSeed};

/// Cases per property unless `BISECT_PROPTEST_CASES` says otherwise.
pub(crate) const DEFAULT_CASES: u32 = 10_000;
/// Seed unless `BISECT_PROPTEST_SEED` says otherwise.
pub(crate) const DEFAULT_SEED: u64 = 0x00b1_5ec7;

#[allow(clippy::disallowed_methods)] // The tests' own settings, read by the tests.
fn env_number<T: std::str::FromStr>(name: &str) -> Option<T> {
    let raw = std::env::var(name).ok()?;
    match raw.trim().replace('_', "").parse() {
        Ok(n) => Some(n),
        Err(_) => panic!("{name}={raw:?} is not a whole number"),
    }
}

/// The number of cases every property runs.
pub fn cases() -> u32 {
    env_number("BISECT_PROPTEST_CASES").unwrap_or(DEFAULT_CASES)
}

/// The proptest configuration every property uses: [`cases`] cases, a fixed seed, and
/// shrinking bounded so a failure is reported in seconds rather than minutes.
pub fn config() -> Config {
    Config {
        rng_seed: RngSeed::Fixed(env_number("BISECT_PROPTEST_SEED").unwrap_or(DEFAULT_SEED)),
        max_shrink_iters: 4096,
        ..Config::with_cases(cases())
    }
}
