//! The one way numbers are written for people: p-values, percentages, signed changes in
//! percentage points, rates with their intervals, and measured quantities. Every
//! rendering (terminal table, summary.md, report.html, diff, verdict summary, matrix and
//! culprit exports) formats through here, so a number reads the same wherever it
//! appears. Machine-readable files (run.json, matrix.json, CSV) keep full precision and
//! never pass through this module.
//!
//! Non-finite values are written `n/a` rather than Rust's `NaN`/`inf`: they only arise
//! from a degenerate input (no sessions), and a reader should see that, not a number.

use crate::stats;

/// Written for a value that is not a number (NaN, infinite).
pub(crate) const NOT_A_NUMBER: &str = "n/a";

/// The first `max` characters, with `...` when something was cut (counted in
/// characters, so a cut never splits one).
pub(crate) fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_string(),
    }
}

/// A p-value with two significant figures: `0.50`, `0.011`, `0.0028`, and below 0.001
/// in scientific notation without zero padding, `6.6e-5`. Exactly 0 is `0`, 1 is
/// `1.00`.
pub fn p_value(p: f64) -> String {
    if !p.is_finite() {
        return NOT_A_NUMBER.to_string();
    }
    if p <= 0.0 {
        return "0".to_string();
    }
    // Rust's `{:.1e}` rounds to two significant figures first, so the exponent read back
    // already carries a rounding such as 9.96e-5 -> 1.0e-4.
    let scientific = format!("{p:.1e}");
    let exponent: i32 = scientific
        .split_once('e')
        .and_then(|(_, e)| e.parse().ok())
        .unwrap_or(0);
    if exponent < -3 {
        scientific
    } else {
        let decimals = (1 - exponent).max(2) as usize;
        format!("{p:.decimals$}")
    }
}

/// The digits of a proportion in percent, one decimal, no sign: 0.175 -> `17.5`. Also
/// for a difference in percentage points (-0.003 -> `-0.3`); a tiny negative that rounds
/// to zero is `0.0`, never `-0.0`, which would read as a sign error.
pub fn percent_digits(fraction: f64) -> String {
    if !fraction.is_finite() {
        return NOT_A_NUMBER.to_string();
    }
    let text = format!("{:.1}", 100.0 * fraction);
    if text == "-0.0" {
        "0.0".to_string()
    } else {
        text
    }
}

/// A proportion as a percentage: 0.175 -> `17.5%`.
pub fn percent(fraction: f64) -> String {
    if !fraction.is_finite() {
        return NOT_A_NUMBER.to_string();
    }
    format!("{}%", percent_digits(fraction))
}

/// A change in percentage points, always signed: 0.031 -> `+3.1%`, -0.003 -> `-0.3%`;
/// a change that rounds to zero is `+0.0%` whichever side it came from.
pub fn signed_percent(fraction: f64) -> String {
    if !fraction.is_finite() {
        return NOT_A_NUMBER.to_string();
    }
    let digits = percent_digits(fraction);
    if digits.starts_with('-') {
        format!("{digits}%")
    } else {
        format!("+{digits}%")
    }
}

/// A rate as a count and a percentage: `14/80 (17.5%)`.
pub fn rate(corrupted: u64, sessions: u64) -> String {
    format!(
        "{corrupted}/{sessions} ({})",
        percent(stats::rate(corrupted, sessions))
    )
}

/// A percentage with its interval: `17.5% [10.7%, 27.3%]`.
pub fn percent_interval(fraction: f64, interval: [f64; 2]) -> String {
    format!(
        "{} [{}, {}]",
        percent(fraction),
        percent(interval[0]),
        percent(interval[1])
    )
}

/// A rate as a count, a percentage and its interval: `14/80 = 17.5% [10.7%, 27.3%]`.
pub fn rate_interval(corrupted: u64, sessions: u64, interval: [f64; 2]) -> String {
    format!(
        "{corrupted}/{sessions} = {}",
        percent_interval(stats::rate(corrupted, sessions), interval)
    )
}

/// A measured quantity without spurious decimals: 60 -> `60`, 12.345 -> `12.3`.
pub(crate) fn quantity(value: f64) -> String {
    if !value.is_finite() {
        return NOT_A_NUMBER.to_string();
    }
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{value:.0}")
    } else {
        format!("{value:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p_values_keep_two_significant_figures() {
        assert_eq!(p_value(1.0), "1.00");
        assert_eq!(p_value(0.4957983193277311), "0.50");
        assert_eq!(p_value(0.10), "0.10");
        assert_eq!(p_value(0.0107), "0.011");
        assert_eq!(p_value(0.0027594561852200836), "0.0028");
        assert_eq!(p_value(0.001), "0.0010");
        // Rounding up into the next decade keeps two figures.
        assert_eq!(p_value(0.000999), "0.0010");
        assert_eq!(p_value(0.0996), "0.10");
    }

    #[test]
    fn tiny_p_values_are_scientific_without_zero_padding() {
        assert_eq!(p_value(6.553361437755207e-05), "6.6e-5");
        assert_eq!(p_value(2.6e-6), "2.6e-6");
        assert_eq!(p_value(9.96e-5), "1.0e-4");
        assert_eq!(p_value(1.2e-300), "1.2e-300");
        assert_eq!(p_value(f64::MIN_POSITIVE), "2.2e-308");
    }

    #[test]
    fn degenerate_p_values() {
        assert_eq!(p_value(0.0), "0");
        assert_eq!(p_value(-0.0), "0");
        assert_eq!(p_value(f64::NAN), "n/a");
        assert_eq!(p_value(f64::INFINITY), "n/a");
        // A p-value never exceeds 1, but a huge input must not panic or lie.
        assert_eq!(p_value(1e20), "100000000000000000000.00");
    }

    #[test]
    fn percents() {
        assert_eq!(percent(0.175), "17.5%");
        assert_eq!(percent(0.0), "0.0%");
        assert_eq!(percent(1.0), "100.0%");
        assert_eq!(percent(1e-9), "0.0%");
        assert_eq!(percent(-1e-9), "0.0%");
        assert_eq!(percent(12345.678), "1234567.8%");
        assert_eq!(percent(f64::NAN), "n/a");
        assert_eq!(percent_digits(0.1875), "18.8");
        assert_eq!(percent_digits(-0.003), "-0.3");
        assert_eq!(percent_digits(-0.0004), "0.0");
        assert_eq!(percent_digits(f64::NEG_INFINITY), "n/a");
    }

    #[test]
    fn signed_percents() {
        assert_eq!(signed_percent(0.031), "+3.1%");
        assert_eq!(signed_percent(-0.625), "-62.5%");
        assert_eq!(signed_percent(0.0), "+0.0%");
        assert_eq!(signed_percent(-0.0), "+0.0%");
        assert_eq!(signed_percent(-1e-9), "+0.0%");
        assert_eq!(signed_percent(1.0), "+100.0%");
        assert_eq!(signed_percent(f64::NAN), "n/a");
    }

    #[test]
    fn rates() {
        assert_eq!(rate(14, 80), "14/80 (17.5%)");
        assert_eq!(rate(0, 0), "0/0 (0.0%)");
        assert_eq!(rate(80, 80), "80/80 (100.0%)");
        assert_eq!(
            rate_interval(18, 80, [0.147, 0.328]),
            "18/80 = 22.5% [14.7%, 32.8%]"
        );
        assert_eq!(
            percent_interval(0.25, [0.046, 0.699]),
            "25.0% [4.6%, 69.9%]"
        );
    }

    #[test]
    fn quantities() {
        assert_eq!(quantity(60.0), "60");
        assert_eq!(quantity(12.345), "12.3");
        assert_eq!(quantity(0.0), "0");
        assert_eq!(quantity(1e20), "100000000000000000000.0");
        assert_eq!(quantity(f64::NAN), "n/a");
    }
}
