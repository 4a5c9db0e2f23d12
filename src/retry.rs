//! How long a failed job waits before it runs again: a pure function of the policy, the
//! failure count and a seed. Whether it runs again at all is the rule book's
//! (`rules::after_failure`), and which policy applies (the job's own, its queue's, the
//! store's) is too (`rules::backoff_policy`).

use std::fmt;
use std::time::Duration;

use bincode::{Decode, Encode};

use crate::error::ConfigError;

/// The most delays a [`RetryPolicy::delays`] list may hold: a policy travels in each job
/// record that carries one.
pub const MAX_RETRY_DELAYS: usize = 32;

/// How long a failed job waits before its next attempt: exponential (with a cap), fixed, or
/// a list of delays, each shortened by up to a fraction of itself ([`RetryPolicy::jitter`])
/// so that jobs which failed together (a dependency went down) do not all come back in the
/// same instant. The jitter is drawn from a seed made of the job id and attempt, so a
/// policy's waits are reproducible in tests and simulations.
///
/// A store has one ([`crate::StoreBuilder::retry_policy`]); a queue may have its own
/// ([`crate::JobStore::set_queue_retry_policy`]) and a job too ([`crate::NewJob::retry_policy`]):
/// a failure waits by the job's, else its queue's, else the store's. A handler's
/// [`crate::JobError::retry_in`] names the wait of one failure itself.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Encode, Decode)]
pub struct RetryPolicy {
    shape: Shape,
    /// The fraction of a wait that jitter may remove, in millionths; above a million (a
    /// fraction outside `0.0..=1.0` was asked for) the policy is refused.
    jitter_ppm: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Encode, Decode)]
enum Shape {
    /// The `n`-th failure waits `min(max, base * 2^(n-1))`.
    Exponential { base: Duration, max: Duration },
    /// Every failure waits the same.
    Fixed(Duration),
    /// The `n`-th failure waits the `n`-th delay; failures past the list wait its last.
    Delays(Vec<Duration>),
}

impl Default for RetryPolicy {
    /// 1 s, doubling up to 1 h, with 20 % jitter.
    fn default() -> Self {
        RetryPolicy::exponential(Duration::from_secs(1), Duration::from_secs(3600)).jitter(0.2)
    }
}

impl RetryPolicy {
    /// The first failure waits `base`, each next one twice the last, up to `max`. No jitter
    /// until [`jitter`](Self::jitter) adds it.
    pub fn exponential(base: Duration, max: Duration) -> RetryPolicy {
        RetryPolicy {
            shape: Shape::Exponential { base, max },
            jitter_ppm: 0,
        }
    }

    /// Every failure waits `wait`.
    pub fn fixed(wait: Duration) -> RetryPolicy {
        RetryPolicy {
            shape: Shape::Fixed(wait),
            jitter_ppm: 0,
        }
    }

    /// The first failure waits the first delay, the second the second, and so on; every
    /// failure past the list waits its last. At least one delay and at most
    /// [`MAX_RETRY_DELAYS`].
    pub fn delays(delays: impl IntoIterator<Item = Duration>) -> RetryPolicy {
        RetryPolicy {
            shape: Shape::Delays(delays.into_iter().collect()),
            jitter_ppm: 0,
        }
    }

    /// Shortens each wait by up to `fraction` of itself (within `0.0..=1.0`; anything else
    /// is refused where the policy is given).
    pub fn jitter(mut self, fraction: f64) -> RetryPolicy {
        self.jitter_ppm = if (0.0..=1.0).contains(&fraction) {
            (fraction * 1e6).round() as u32
        } else {
            u32::MAX
        };
        self
    }

    /// Checks the policy is usable.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check().map_err(ConfigError::RetryPolicy)
    }

    /// What is wrong with the policy, if anything.
    pub(crate) fn check(&self) -> Result<(), &'static str> {
        if self.jitter_ppm > 1_000_000 {
            return Err("jitter must be within 0.0..=1.0");
        }
        match &self.shape {
            Shape::Exponential { base, max } if max < base => {
                Err("max backoff is shorter than base")
            }
            Shape::Delays(d) if d.is_empty() => Err("a list of delays needs at least one"),
            Shape::Delays(d) if d.len() > MAX_RETRY_DELAYS => {
                Err("a list of delays may hold at most 32")
            }
            _ => Ok(()),
        }
    }

    /// How long to wait after the `failures`-th failure (1-based), with jitter from `seed`.
    pub fn backoff(&self, failures: u32, seed: u64) -> Duration {
        let full = match &self.shape {
            Shape::Exponential { base, max } => {
                let doublings = failures.saturating_sub(1);
                let grown = if doublings >= 64 {
                    u128::MAX
                } else {
                    base.as_nanos().saturating_mul(1u128 << doublings)
                };
                let capped = grown.min(max.as_nanos());
                Duration::from_nanos(u64::try_from(capped).unwrap_or(u64::MAX))
            }
            Shape::Fixed(wait) => *wait,
            Shape::Delays(delays) => {
                let at = usize::try_from(failures.saturating_sub(1)).unwrap_or(usize::MAX);
                (delays.get(at).or(delays.last()).copied()).unwrap_or_default()
            }
        };
        let jitter = f64::from(self.jitter_ppm.min(1_000_000)) / 1e6;
        full.mul_f64(1.0 - jitter * unit_interval(splitmix64(seed)))
    }
}

impl fmt::Display for RetryPolicy {
    /// `exponential 1s..3600s`, `fixed 30s`, `delays 1s, 10s, 60s`, each with `, jitter 20%`
    /// where it has one.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.shape {
            Shape::Exponential { base, max } => write!(f, "exponential {base:?}..{max:?}")?,
            Shape::Fixed(wait) => write!(f, "fixed {wait:?}")?,
            Shape::Delays(delays) => {
                f.write_str("delays ")?;
                for (i, d) in delays.iter().enumerate() {
                    write!(f, "{}{d:?}", if i == 0 { "" } else { ", " })?;
                }
            }
        }
        match self.jitter_ppm {
            0 => Ok(()),
            ppm => write!(f, ", jitter {}%", f64::from(ppm) / 1e4),
        }
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

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn exponential_backoff_doubles_and_caps() {
        let p = RetryPolicy::exponential(S(1), S(3600));
        assert_eq!(p.backoff(1, 7), S(1));
        assert_eq!(p.backoff(2, 7), S(2));
        assert_eq!(p.backoff(5, 7), S(16));
        assert_eq!(p.backoff(40, 7), S(3600));
        assert_eq!(p.backoff(u32::MAX, 7), S(3600));
    }

    #[test]
    fn a_fixed_backoff_waits_the_same_after_every_failure() {
        let p = RetryPolicy::fixed(S(30));
        assert_eq!(p.backoff(1, 7), S(30));
        assert_eq!(p.backoff(9, 7), S(30));
    }

    #[test]
    fn a_list_of_delays_is_walked_then_its_last_repeats() {
        let p = RetryPolicy::delays([S(1), S(10), S(60)]);
        let waits: Vec<_> = (1..=5).map(|n| p.backoff(n, 7)).collect();
        assert_eq!(waits, [S(1), S(10), S(60), S(60), S(60)]);
        assert_eq!(p.to_string(), "delays 1s, 10s, 60s");
    }

    #[test]
    fn jitter_stays_within_its_fraction() {
        let p = RetryPolicy::default();
        for seed in 0..1000 {
            let d = p.backoff(3, seed);
            assert!(d <= S(4) && d >= Duration::from_millis(3200));
        }
        let fixed = RetryPolicy::fixed(S(10)).jitter(0.5);
        let waits: Vec<_> = (0..200).map(|seed| fixed.backoff(1, seed)).collect();
        assert!(waits.iter().all(|d| *d <= S(10) && *d >= S(5)));
        assert!(
            waits.iter().any(|d| *d != waits[0]),
            "jitter varies by seed"
        );
        assert_eq!(fixed.to_string(), "fixed 10s, jitter 50%");
    }

    #[test]
    fn inverted_empty_long_or_out_of_range_policy_is_refused() {
        assert!(RetryPolicy::exponential(S(10), S(1)).validate().is_err());
        assert!(RetryPolicy::default().jitter(1.5).validate().is_err());
        assert!(RetryPolicy::default().jitter(f64::NAN).validate().is_err());
        assert!(RetryPolicy::delays([]).validate().is_err());
        assert!(RetryPolicy::delays(vec![S(1); 33]).validate().is_err());
        assert!(RetryPolicy::delays(vec![S(1); 32]).validate().is_ok());
        assert!(RetryPolicy::fixed(Duration::ZERO).validate().is_ok());
    }
}
