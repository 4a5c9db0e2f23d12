//! Settings, their defaults, and the checks that refuse nonsense before anything runs.

use std::time::Duration;

use crate::error::ConfigError;

/// The default lease length.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(60);
/// The default reaper interval.
pub const DEFAULT_REAPER_INTERVAL: Duration = Duration::from_secs(15);
/// The default number of leases one reaper transaction reclaims.
pub const DEFAULT_REAP_BATCH: usize = 500;
/// The default retry budget of a job.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 25;
/// The default payload (and output) size limit.
pub const DEFAULT_MAX_PAYLOAD: usize = 1 << 20;

/// The setters of a store's [`crate::protocol::Policy`], the same on every engine's builder:
/// `policy_setters!(Builder, path.to.policy, "how retention frees room on this engine")`
/// inside the builder's `impl`. (The retention's last sentence is the engine's own: what the
/// purge gives back differs.)
macro_rules! policy_setters {
    ($builder:ident, $($policy:ident).+, $retention:literal) => {
        /// The backoff between failed attempts of jobs (and queues) that have none of their
        /// own. Default: [`RetryPolicy::default`](crate::retry::RetryPolicy::default).
        pub fn retry_policy(mut self, retry: crate::retry::RetryPolicy) -> $builder {
            self.$($policy).+.retry = retry;
            self
        }

        /// The retry budget of jobs enqueued without one. Default: 25.
        pub fn default_max_attempts(mut self, n: u32) -> $builder {
            self.$($policy).+.default_max_attempts = n;
            self
        }

        /// The largest payload or output accepted. Default: 1 MiB.
        pub fn max_payload(mut self, bytes: usize) -> $builder {
            self.$($policy).+.max_payload = bytes;
            self
        }

        /// Deletes succeeded, cancelled and expired jobs, with their payload, output and
        /// history, once they finished more than `keep` ago: each reaper pass
        /// ([`JobStore::reap`](crate::job_store::JobStore::reap)) purges them in batches of
        #[doc = concat!("[`", stringify!($builder), "::reap_batch`], ", $retention)]
        /// Dead jobs are kept for an operator to retry or purge
        /// ([`JobStore::purge`](crate::job_store::JobStore::purge)). Default: off, every job is kept
        /// until purged.
        pub fn retention(mut self, keep: std::time::Duration) -> $builder {
            self.$($policy).+.retention = Some(keep);
            self
        }

        /// How many leases one reaper transaction takes back (and how many finished jobs one
        /// purge deletes), so that reclaiming a whole dead pool does not hold the store's
        /// writes for long. Default: 500.
        pub fn reap_batch(mut self, n: usize) -> $builder {
            self.$($policy).+.reap_batch = n;
            self
        }
    };
}
pub(crate) use policy_setters;

/// How long a lease lasts and how often its holder renews it.
///
/// The worst-case time for a dead holder's job to be taken back is
/// `lease + reaper interval`: the lease must run out (the holder's last renewal may have been
/// just before it died) and then the next reaper pass must come. A claimer can take the job
/// over sooner, as soon as the lease has expired.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) struct LeaseSettings {
    lease: Duration,
    heartbeat: Duration,
}

impl LeaseSettings {
    /// A lease of `lease`, renewed every `heartbeat`. The heartbeat must be shorter than the
    /// lease (a third of it is the default: two renewals may fail before the lease lapses).
    pub fn new(lease: Duration, heartbeat: Duration) -> Result<LeaseSettings, ConfigError> {
        check_lease(lease)?;
        if heartbeat.is_zero() {
            return Err(ConfigError::ZeroHeartbeat);
        }
        if heartbeat >= lease {
            return Err(ConfigError::HeartbeatNotShorterThanLease { heartbeat, lease });
        }
        Ok(LeaseSettings { lease, heartbeat })
    }

    /// A lease of `lease`, renewed every `lease / 3`.
    pub fn with_lease(lease: Duration) -> Result<LeaseSettings, ConfigError> {
        LeaseSettings::new(lease, lease / 3)
    }

    /// The lease length.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// The heartbeat interval.
    pub fn heartbeat(&self) -> Duration {
        self.heartbeat
    }
}

impl Default for LeaseSettings {
    /// 60 s leases renewed every 20 s.
    fn default() -> Self {
        LeaseSettings {
            lease: DEFAULT_LEASE,
            heartbeat: DEFAULT_LEASE / 3,
        }
    }
}

/// The longest lease granted. A lease is the window in which a dead holder goes unnoticed;
/// anything longer than a week is a mistake (often a unit mix-up), not a policy.
pub const MAX_LEASE: Duration = Duration::from_secs(7 * 24 * 3600);

/// Refuses a lease no holder could keep, or one so long a dead holder would never be noticed.
pub fn check_lease(lease: Duration) -> Result<(), ConfigError> {
    if lease.is_zero() {
        return Err(ConfigError::ZeroLease);
    }
    if lease > MAX_LEASE {
        return Err(ConfigError::LeaseTooLong {
            lease,
            max: MAX_LEASE,
        });
    }
    Ok(())
}

/// Refuses lease terms no holder could keep.
pub fn check_terms(terms: &crate::lease::LeaseTerms) -> Result<(), ConfigError> {
    check_lease(terms.length)?;
    if terms.stall_timeout.is_some_and(|d| d.is_zero()) {
        return Err(ConfigError::ZeroStallTimeout);
    }
    if terms.time_limit.is_some_and(|d| d.is_zero()) {
        return Err(ConfigError::ZeroTimeLimit);
    }
    Ok(())
}

/// How often the background reaper runs.
pub fn check_reaper_interval(interval: Duration) -> Result<(), ConfigError> {
    if interval.is_zero() {
        return Err(ConfigError::ZeroReaperInterval);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn heartbeat_not_shorter_than_lease_is_refused() {
        let s = Duration::from_secs(10);
        assert_eq!(
            LeaseSettings::new(s, s),
            Err(ConfigError::HeartbeatNotShorterThanLease {
                heartbeat: s,
                lease: s
            })
        );
        assert!(LeaseSettings::new(s, s * 2).is_err());
        assert_eq!(
            LeaseSettings::new(Duration::ZERO, s),
            Err(ConfigError::ZeroLease)
        );
        assert_eq!(
            LeaseSettings::new(s, Duration::ZERO),
            Err(ConfigError::ZeroHeartbeat)
        );
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let d = LeaseSettings::default();
        assert_eq!(d.lease(), Duration::from_secs(60));
        assert_eq!(d.heartbeat(), Duration::from_secs(20));
    }
}

/// What a commit promises.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Durability {
    /// Every commit is on disk (fsync'd) when the call returns. A crash or power loss loses
    /// nothing that was acknowledged. The default.
    Immediate,
    /// Commits are made durable at most `flush_every` apart (at the first commit after that
    /// much store time, at [`Store::flush`](crate::Store::flush), and when the store is dropped); the ones between
    /// are in memory only. A crash or power loss may lose the commits since the last durable
    /// one, as a whole and in order, and never corrupts the file: the store reopens at an
    /// earlier consistent state. Then a completed job may run again, so handlers must be
    /// idempotent (they must be anyway: a lease can be falsely reclaimed).
    Eventual {
        /// The longest span of commits that a crash may lose.
        flush_every: Duration,
    },
}
