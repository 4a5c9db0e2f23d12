//! How long a failed job waits before it runs again: a pure function of the failure count and
//! a seed. Whether it runs again at all is the rule book's (`rules::after_failure`).

use std::time::Duration;

use crate::error::ConfigError;

/// Exponential backoff with jitter.
///
/// The `n`-th failure waits `min(max, base * 2^(n-1))`, shortened by up to `jitter` of itself
/// (a fraction in `0.0..=1.0`) so that jobs which failed together (a dependency went down) do
/// not all come back in the same instant. The jitter is drawn from a seed made of the job id
/// and attempt, so it is reproducible in tests and simulations.
#[derive(Copy, Clone, Debug, PartialEq)]
pub struct RetryPolicy {
    /// The wait after the first failure.
    pub base: Duration,
    /// The longest wait.
    pub max: Duration,
    /// The fraction of a wait that jitter may remove.
    pub jitter: f64,
}

impl Default for RetryPolicy {
    /// 1 s, doubling up to 1 h, with 20 % jitter.
    fn default() -> Self {
        RetryPolicy {
            base: Duration::from_secs(1),
            max: Duration::from_secs(3600),
            jitter: 0.2,
        }
    }
}

impl RetryPolicy {
    /// Checks the policy is usable.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.max < self.base {
            return Err(ConfigError::RetryPolicy("max backoff is shorter than base"));
        }
        if !(0.0..=1.0).contains(&self.jitter) {
            return Err(ConfigError::RetryPolicy("jitter must be within 0.0..=1.0"));
        }
        Ok(())
    }

    /// How long to wait after the `failures`-th failure (1-based), with jitter from `seed`.
    pub fn backoff(&self, failures: u32, seed: u64) -> Duration {
        let doublings = failures.saturating_sub(1);
        let grown = if doublings >= 64 {
            u128::MAX
        } else {
            self.base.as_nanos().saturating_mul(1u128 << doublings)
        };
        let capped = grown.min(self.max.as_nanos());
        let full = Duration::from_nanos(u64::try_from(capped).unwrap_or(u64::MAX));
        let u = unit_interval(splitmix64(seed));
        full.mul_f64(1.0 - self.jitter * u)
    }
}

/// SplitMix64: a small, well-mixed hash for jitter seeds.
pub(crate) fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn unit_interval(x: u64) -> f64 {
    // 53 random bits into [0, 1)
    (x >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        let p = RetryPolicy {
            jitter: 0.0,
            ..RetryPolicy::default()
        };
        assert_eq!(p.backoff(1, 7), Duration::from_secs(1));
        assert_eq!(p.backoff(2, 7), Duration::from_secs(2));
        assert_eq!(p.backoff(5, 7), Duration::from_secs(16));
        assert_eq!(p.backoff(40, 7), Duration::from_secs(3600));
        assert_eq!(p.backoff(u32::MAX, 7), Duration::from_secs(3600));
    }

    #[test]
    fn jitter_stays_within_its_fraction() {
        let p = RetryPolicy::default();
        for seed in 0..1000 {
            let d = p.backoff(3, seed);
            assert!(d <= Duration::from_secs(4) && d >= Duration::from_millis(3200));
        }
    }

    #[test]
    fn inverted_or_out_of_range_policy_is_refused() {
        let inverted = RetryPolicy {
            base: Duration::from_secs(10),
            max: Duration::from_secs(1),
            jitter: 0.0,
        };
        assert!(inverted.validate().is_err());
        let bad_jitter = RetryPolicy {
            jitter: 1.5,
            ..RetryPolicy::default()
        };
        assert!(bad_jitter.validate().is_err());
    }
}
