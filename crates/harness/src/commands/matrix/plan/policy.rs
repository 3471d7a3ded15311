//! The regression rule's thresholds (`alpha`, `min_effect`, `tokens_per_s_noise`,
//! `degraded_fraction`) as a plan sets them.

use toml::Spanned;

use super::RawPlan;
use crate::config::{ConfigError, Source};

/// The thresholds of the per-cell regression rule (see [`super::baseline`]).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RegressionPolicy {
    /// Holm-adjusted one-sided Fisher p below this: corruption significantly higher.
    pub alpha: f64,
    /// ...and the rate must also have risen by at least this much (absolute).
    pub min_effect: f64,
    /// tokens/s below (1 - this) x the baseline's: slower beyond noise.
    pub(crate) tokens_per_s_noise: f64,
    /// A cell with more than this fraction of error+timeout sessions is degraded.
    pub degraded_fraction: f64,
}

pub(crate) const DEFAULT_ALPHA: f64 = 0.01;
pub(crate) const DEFAULT_MIN_EFFECT: f64 = 0.05;
/// The same 25% that docs/design.md 3.7 uses to warn about a tokens/s confound.
pub(crate) const DEFAULT_TOKENS_PER_S_NOISE: f64 = 0.25;
/// The same 10% that makes an arm "degraded" in docs/design.md 3.7.
pub(crate) const DEFAULT_DEGRADED_FRACTION: f64 = 0.10;

impl Default for RegressionPolicy {
    fn default() -> Self {
        RegressionPolicy {
            alpha: DEFAULT_ALPHA,
            min_effect: DEFAULT_MIN_EFFECT,
            tokens_per_s_noise: DEFAULT_TOKENS_PER_S_NOISE,
            degraded_fraction: DEFAULT_DEGRADED_FRACTION,
        }
    }
}

/// The regression rule's thresholds: each a fraction in (0, 1), defaulted when absent.
pub(super) fn regression_policy(
    src: &Source,
    raw: &RawPlan,
) -> Result<RegressionPolicy, ConfigError> {
    let fraction = |key: &str, v: &Option<Spanned<f64>>, default: f64, example: &str| match v {
        None => Ok(default),
        Some(s) if s.get_ref().is_finite() && *s.get_ref() > 0.0 && *s.get_ref() < 1.0 => {
            Ok(*s.get_ref())
        }
        Some(s) => Err(src.invalid(
            s.span(),
            format!("{key} = {} must lie strictly between 0 and 1", s.get_ref()),
            format!("e.g. {key} = {example}"),
        )),
    };
    Ok(RegressionPolicy {
        alpha: fraction("alpha", &raw.alpha, DEFAULT_ALPHA, "0.01")?,
        min_effect: fraction("min_effect", &raw.min_effect, DEFAULT_MIN_EFFECT, "0.05")?,
        tokens_per_s_noise: fraction(
            "tokens_per_s_noise",
            &raw.tokens_per_s_noise,
            DEFAULT_TOKENS_PER_S_NOISE,
            "0.25",
        )?,
        degraded_fraction: fraction(
            "degraded_fraction",
            &raw.degraded_fraction,
            DEFAULT_DEGRADED_FRACTION,
            "0.10",
        )?,
    })
}
