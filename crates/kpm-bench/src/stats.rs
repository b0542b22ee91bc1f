//! Latency summaries (nearest-rank percentiles), lossless-enough number
//! conversions and bounded lists of failures for the JSON output.

use std::time::Duration;

use serde_json::{Value, json};

/// At most this many failures are listed in the JSON (all are counted).
const LISTED_FAILURES: usize = 10;

/// Milliseconds, as a float with microsecond resolution.
pub(crate) fn ms(duration: Duration) -> f64 {
    (duration.as_secs_f64() * 1e6).round() / 1e3
}

/// `x` as a float; the counters and kilobyte figures this is used for stay
/// far below 2^32.
pub(crate) fn float(x: u64) -> f64 {
    f64::from(u32::try_from(x).unwrap_or(u32::MAX))
}

/// Rounds to `digits` decimals, for readable JSON.
pub(crate) fn round(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}

/// The `percent`-th percentile of sorted `samples`, nearest rank: the
/// smallest sample with at least `percent` % of the samples at or below it.
pub(crate) fn percentile(sorted: &[Duration], percent: usize) -> Option<Duration> {
    let rank = (sorted.len() * percent).div_ceil(100).max(1);
    sorted.get(rank - 1).copied()
}

/// `{"count", "p50", "p99", "max", "mean"}`, times in milliseconds; the
/// times are `null` without samples.
pub(crate) fn summary(mut samples: Vec<Duration>) -> Value {
    samples.sort_unstable();
    let count = samples.len();
    let mean = u32::try_from(count)
        .ok()
        .filter(|&n| n > 0)
        .map(|n| ms(samples.iter().sum::<Duration>() / n));
    json!({
        "count": count,
        "p50": percentile(&samples, 50).map(ms),
        "p99": percentile(&samples, 99).map(ms),
        "max": samples.last().copied().map(ms),
        "mean": mean,
    })
}

/// The first [`LISTED_FAILURES`] of `failures`, for the JSON.
pub(crate) fn listed(failures: &[String]) -> Vec<String> {
    failures.iter().take(LISTED_FAILURES).cloned().collect()
}

/// A straight line fitted to points by least squares.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Fit {
    /// Change of y per unit of x.
    pub(crate) slope: f64,
    /// Two standard errors of the slope: about 95 % confidence for the
    /// twenty or more points it is used on.
    pub(crate) bound: f64,
    pub(crate) points: usize,
}

/// The least-squares line through `points`; `None` with fewer than three
/// points or when every x is the same.
pub(crate) fn fit(points: &[(f64, f64)]) -> Option<Fit> {
    let n = points.len();
    if n < 3 {
        return None;
    }
    let count = f64::from(u32::try_from(n).ok()?);
    let mean_x = points.iter().map(|(x, _)| x).sum::<f64>() / count;
    let mean_y = points.iter().map(|(_, y)| y).sum::<f64>() / count;
    let sxx: f64 = points.iter().map(|(x, _)| (x - mean_x).powi(2)).sum();
    let sxy: f64 = points.iter().map(|(x, y)| (x - mean_x) * (y - mean_y)).sum();
    if sxx <= 0.0 {
        return None;
    }
    let slope = sxy / sxx;
    let residuals: f64 =
        points.iter().map(|(x, y)| (y - mean_y - slope * (x - mean_x)).powi(2)).sum();
    let standard_error = (residuals / (count - 2.0) / sxx).sqrt();
    Some(Fit { slope, bound: 2.0 * standard_error, points: n })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn millis(values: &[u64]) -> Vec<Duration> {
        values.iter().copied().map(Duration::from_millis).collect()
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let samples = millis(&(1..=100).collect::<Vec<_>>());
        assert_eq!(percentile(&samples, 50), Some(Duration::from_millis(50)));
        assert_eq!(percentile(&samples, 99), Some(Duration::from_millis(99)));
        let few = millis(&[1, 2, 3]);
        assert_eq!(percentile(&few, 50), Some(Duration::from_millis(2)));
        assert_eq!(percentile(&few, 99), Some(Duration::from_millis(3)));
        assert_eq!(percentile(&[], 50), None);
    }

    #[test]
    fn summaries_sort_and_report_milliseconds() {
        let value = summary(vec![
            Duration::from_micros(2500),
            Duration::from_micros(500),
            Duration::from_micros(1500),
        ]);
        assert_eq!(value["count"], 3);
        assert_eq!(value["p50"], 1.5);
        assert_eq!(value["max"], 2.5);
        assert_eq!(value["mean"], 1.5);
        assert_eq!(summary(Vec::new())["p99"], Value::Null);
    }

    #[test]
    fn a_fit_finds_the_slope_and_bounds_it_by_the_scatter() {
        let line: Vec<(f64, f64)> =
            (0..10).map(|x| (f64::from(x), 3.0 + 0.5 * f64::from(x))).collect();
        let exact = fit(&line).unwrap();
        assert!((exact.slope - 0.5).abs() < 1e-12 && exact.bound < 1e-9);
        assert_eq!(exact.points, 10);
        // A flat saw-tooth: no slope to speak of, and a bound that covers zero.
        let saw: Vec<(f64, f64)> =
            (0..40).map(|x| (f64::from(x), if x % 2 == 0 { 10.0 } else { 11.0 })).collect();
        let flat = fit(&saw).unwrap();
        assert!(flat.slope.abs() <= flat.bound, "{flat:?}");
        // The same saw-tooth climbing: a slope well above its bound.
        let climbing: Vec<(f64, f64)> = saw.iter().map(|(x, y)| (*x, y + 0.2 * x)).collect();
        let rising = fit(&climbing).unwrap();
        assert!(
            (rising.slope - 0.2).abs() < 0.01 && rising.slope - rising.bound > 0.0,
            "{rising:?}"
        );
        assert_eq!(fit(&line[..2]), None);
        assert_eq!(fit(&[(1.0, 1.0), (1.0, 2.0), (1.0, 3.0)]), None);
    }
}
