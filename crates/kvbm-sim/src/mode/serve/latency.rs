//! [`Latency`]: percentiles of one latency over the requests that have it.

use std::fmt;
use std::time::Duration;

use serde_json::json;

/// Percentiles of a latency (in simulated time) over a set of requests.
///
/// Percentiles are nearest-rank: the `p`-th percentile of `n` sorted samples
/// is sample number `ceil(p / 100 × n)` (1-based), so every reported value
/// is one a request really saw, and `p100` is the maximum. All zero when
/// there are no samples.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Latency {
    /// Requests measured.
    pub count: u64,
    /// Arithmetic mean.
    pub mean: Duration,
    /// Median.
    pub p50: Duration,
    /// 90th percentile.
    pub p90: Duration,
    /// 99th percentile.
    pub p99: Duration,
    /// The largest sample.
    pub max: Duration,
}

impl Latency {
    /// The percentiles of `samples` (nanoseconds; sorted in place).
    pub(crate) fn from_nanos(samples: &mut [u64]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort_unstable();
        let n = samples.len();
        let rank = |percent: usize| {
            // ceil(percent × n / 100), at least 1, as a 0-based index.
            let rank = (percent * n).div_ceil(100).max(1);
            Duration::from_nanos(samples.get(rank - 1).copied().unwrap_or_default())
        };
        let sum: u128 = samples.iter().map(|&s| u128::from(s)).sum();
        let mean = u64::try_from(sum / n as u128).unwrap_or(u64::MAX);
        Self {
            count: n as u64,
            mean: Duration::from_nanos(mean),
            p50: rank(50),
            p90: rank(90),
            p99: rank(99),
            max: rank(100),
        }
    }

    /// The percentiles as a JSON object, in milliseconds.
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "count": self.count,
            "mean_ms": ms(self.mean),
            "p50_ms": ms(self.p50),
            "p90_ms": ms(self.p90),
            "p99_ms": ms(self.p99),
            "max_ms": ms(self.max),
        })
    }
}

pub(crate) fn ms(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1e3
}

impl fmt::Display for Latency {
    /// `p50 12.3 ms, p90 45.6 ms, p99 78.9 ms, max 99.9 ms (n = 10)`, with
    /// seconds for values of ten seconds or more.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.count == 0 {
            return f.write_str("no samples");
        }
        let show = |d: Duration| {
            if d >= Duration::from_secs(10) {
                format!("{:.1} s", d.as_secs_f64())
            } else {
                format!("{:.1} ms", ms(d))
            }
        };
        write!(
            f,
            "p50 {}, p90 {}, p99 {}, max {} (mean {}, n = {})",
            show(self.p50),
            show(self.p90),
            show(self.p99),
            show(self.max),
            show(self.mean),
            self.count
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        // 1..=10 ms: p50 is the 5th sample, p90 the 9th, p99 the 10th.
        let mut samples: Vec<u64> = (1..=10).rev().map(|ms| ms * 1_000_000).collect();
        let latency = Latency::from_nanos(&mut samples);
        assert_eq!(latency.count, 10);
        assert_eq!(latency.p50, Duration::from_millis(5));
        assert_eq!(latency.p90, Duration::from_millis(9));
        assert_eq!(latency.p99, Duration::from_millis(10));
        assert_eq!(latency.max, Duration::from_millis(10));
        assert_eq!(latency.mean, Duration::from_micros(5_500));
        // One sample is every percentile.
        let one = Latency::from_nanos(&mut [7]);
        assert_eq!(
            (one.p50, one.p99, one.max),
            (
                Duration::from_nanos(7),
                Duration::from_nanos(7),
                Duration::from_nanos(7)
            )
        );
        // None: zeros, shown as such.
        let none = Latency::from_nanos(&mut []);
        assert_eq!(none, Latency::default());
        assert_eq!(none.to_string(), "no samples");
        // 200 samples: p99 is the 198th.
        let mut samples: Vec<u64> = (1..=200).collect();
        assert_eq!(
            Latency::from_nanos(&mut samples).p99,
            Duration::from_nanos(198)
        );
    }
}
