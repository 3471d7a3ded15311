//! The regression rule's thresholds (`alpha`, `min_effect`, `tokens_per_s_noise`,
//! `degraded_fraction`) as a plan sets them.

use toml::Spanned;

use super::spec::{
    RegressionPolicy, DEFAULT_ALPHA, DEFAULT_DEGRADED_FRACTION, DEFAULT_MIN_EFFECT,
    DEFAULT_TOKENS_PER_S_NOISE,
};
use super::RawPlan;
use crate::config::{ConfigError, Source};

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
