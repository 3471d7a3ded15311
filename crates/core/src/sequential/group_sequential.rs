//! The comparator the e-process was chosen against (kept so the benchmark runs it and
//! its boundaries stay tested): two-sided symmetric boundaries for a z statistic looked
//! at K times, from the Lan-DeMets O'Brien-Fleming-type alpha-spending function or the
//! classical O'Brien-Fleming shape C sqrt(K/k). Probabilities of the sequence of z
//! statistics by recursive numerical integration on the score scale
//! S_k = Z_k sqrt(t_k), whose increments are independent N(drift dt, dt) (Jennison and
//! Turnbull 2000, chapter 19).

use statrs::distribution::{Continuous, ContinuousCDF, Normal};

/// Grid points per unit of the increment's standard deviation.
const POINTS_PER_SD: f64 = 16.0;
/// Densities are kept within this many standard deviations of the mean.
const SPAN_SD: f64 = 9.0;

fn normal() -> Normal {
    Normal::new(0.0, 1.0).expect("the standard normal has valid parameters")
}

/// Two-sided alpha spent by information fraction t, in the convention of rpact
/// (`typeOfDesign = "asOF"`) and gsDesign (`sfLDOF`): each side spends
/// `2 - 2 Phi(z_{1-a/2} / sqrt(t))` of its one-sided a = alpha/2. t is clamped to [0, 1].
pub(crate) fn obrien_fleming_spent(alpha: f64, t: f64) -> f64 {
    let t = t.clamp(0.0, 1.0);
    if t == 0.0 {
        return 0.0;
    }
    let z = -normal().inverse_cdf(alpha / 4.0);
    2.0 * 2.0 * normal().sf(z / t.sqrt())
}

/// The sub-density of S_k on the continuation region, on a Simpson grid.
struct Continuation {
    points: Vec<f64>,
    /// density x Simpson weight.
    mass: Vec<f64>,
    t: f64,
}

fn simpson_grid(lo: f64, hi: f64, step: f64) -> (Vec<f64>, Vec<f64>) {
    let intervals = (((hi - lo) / step).ceil() as usize).max(2);
    let intervals = intervals + intervals % 2;
    let h = (hi - lo) / intervals as f64;
    let points = (0..=intervals).map(|i| lo + i as f64 * h).collect();
    let weights = (0..=intervals)
        .map(|i| {
            let w = if i == 0 || i == intervals {
                1.0
            } else if i % 2 == 1 {
                4.0
            } else {
                2.0
            };
            w * h / 3.0
        })
        .collect();
    (points, weights)
}

/// Probability of crossing +-b (z scale) at the look with fraction `t`, having
/// continued so far (`previous` = None: this is the first look), and the new
/// continuation density.
fn step(
    previous: Option<&Continuation>,
    t: f64,
    b: f64,
    drift: f64,
    with_density: bool,
) -> (f64, Option<Continuation>) {
    let n = normal();
    let c = b * t.sqrt();
    match previous {
        None => {
            let (mean, sd) = (drift * t, t.sqrt());
            let cross = n.sf((c - mean) / sd) + n.cdf((-c - mean) / sd);
            let density = with_density.then(|| {
                let lo = (-c).max(mean - SPAN_SD * sd);
                let hi = c.min(mean + SPAN_SD * sd);
                let (points, weights) = simpson_grid(lo, hi.max(lo), sd / POINTS_PER_SD);
                let mass = points
                    .iter()
                    .zip(&weights)
                    .map(|(&s, &w)| w * n.pdf((s - mean) / sd) / sd)
                    .collect();
                Continuation { points, mass, t }
            });
            (cross, density)
        }
        Some(prev) => {
            let dt = t - prev.t;
            let sd = dt.sqrt();
            let shift = drift * dt;
            let cross = prev
                .points
                .iter()
                .zip(&prev.mass)
                .map(|(&u, &m)| m * (n.sf((c - u - shift) / sd) + n.cdf((-c - u - shift) / sd)))
                .sum();
            let density = with_density.then(|| {
                let (first, last) = (prev.points[0], prev.points[prev.points.len() - 1]);
                let lo = (-c).max(first + shift - SPAN_SD * sd);
                let hi = c.min(last + shift + SPAN_SD * sd);
                let (points, weights) = simpson_grid(lo, hi.max(lo), sd / POINTS_PER_SD);
                let mass = points
                    .iter()
                    .zip(&weights)
                    .map(|(&s, &w)| {
                        let density: f64 = prev
                            .points
                            .iter()
                            .zip(&prev.mass)
                            .map(|(&u, &m)| m * n.pdf((s - u - shift) / sd))
                            .sum::<f64>()
                            / sd;
                        w * density
                    })
                    .collect();
                Continuation { points, mass, t }
            });
            (cross, density)
        }
    }
}

/// Probability that |Z_k| >= boundaries[k] at some look, when E[Z_k] = drift sqrt(t_k).
/// `fractions` are increasing information fractions in (0, 1].
pub(crate) fn rejection_probability(boundaries: &[f64], fractions: &[f64], drift: f64) -> f64 {
    let mut total = 0.0;
    let mut previous: Option<Continuation> = None;
    for (k, (&b, &t)) in boundaries.iter().zip(fractions).enumerate() {
        let last = k + 1 == boundaries.len();
        let (cross, next) = step(previous.as_ref(), t, b, drift, !last);
        total += cross;
        previous = next;
    }
    total
}

/// Lan-DeMets boundaries (z scale) spending alpha by the O'Brien-Fleming-type function
/// at the given information fractions.
pub fn spending_boundaries(alpha: f64, fractions: &[f64]) -> Vec<f64> {
    let mut boundaries = Vec::with_capacity(fractions.len());
    let mut previous: Option<Continuation> = None;
    let mut spent_before = 0.0;
    for (k, &t) in fractions.iter().enumerate() {
        let spent = obrien_fleming_spent(alpha, t);
        let target = spent - spent_before;
        let b = if previous.is_none() {
            -normal().inverse_cdf(target / 2.0)
        } else {
            // Crossing probability falls as b rises: bisect on [0, 40].
            let (mut lo, mut hi) = (0.0_f64, 40.0_f64);
            for _ in 0..60 {
                let mid = 0.5 * (lo + hi);
                if step(previous.as_ref(), t, mid, 0.0, false).0 > target {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            0.5 * (lo + hi)
        };
        let last = k + 1 == fractions.len();
        previous = step(previous.as_ref(), t, b, 0.0, !last).1;
        spent_before = spent;
        boundaries.push(b);
    }
    boundaries
}

/// Classical O'Brien-Fleming boundaries for K equally spaced looks: C sqrt(K/k), with C
/// such that the total two-sided crossing probability is alpha.
#[cfg(test)]
pub(crate) fn classical_obrien_fleming(alpha: f64, looks: usize) -> Vec<f64> {
    let fractions: Vec<f64> = (1..=looks).map(|k| k as f64 / looks as f64).collect();
    let shape: Vec<f64> = (1..=looks)
        .map(|k| (looks as f64 / k as f64).sqrt())
        .collect();
    let scaled = |c: f64| shape.iter().map(|s| c * s).collect::<Vec<f64>>();
    let (mut lo, mut hi) = (0.5_f64, 10.0_f64);
    for _ in 0..50 {
        let mid = 0.5 * (lo + hi);
        if rejection_probability(&scaled(mid), &fractions, 0.0) > alpha {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    scaled(0.5 * (lo + hi))
}

/// Maximum information of the sequential design over that of the fixed design with
/// the same alpha and power (Jennison and Turnbull's R): (drift / (z_{1-alpha/2} +
/// z_power))^2, where drift gives the boundaries rejection probability `power`.
pub fn inflation_factor(alpha: f64, power: f64, boundaries: &[f64], fractions: &[f64]) -> f64 {
    let (mut lo, mut hi) = (0.0_f64, 20.0_f64);
    for _ in 0..50 {
        let mid = 0.5 * (lo + hi);
        if rejection_probability(boundaries, fractions, mid) < power {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let drift = 0.5 * (lo + hi);
    let fixed = -normal().inverse_cdf(alpha / 2.0) + normal().inverse_cdf(power);
    (drift / fixed).powi(2)
}
