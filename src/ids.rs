//! Small newtypes for the numbers the lease protocol must never mix up: job ids, attempts
//! and lease tokens (together, the fence) and store time.

use std::fmt;
use std::time::Duration;

use bincode::{Decode, Encode};

/// The identity of a job. Assigned by the store from a persisted counter and never reused,
/// not even after the job is purged.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Encode, Decode)]
pub struct JobId(pub u64);

impl fmt::Display for JobId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// One process's registration with a store shared by several processes (see
/// [`Sharing::MultiProcess`](crate::Sharing::MultiProcess)): a random id, never a pid (pids
/// are reused), held alive by a kernel lock for the process's life. Every lease records the
/// instance that holds it, so when that process dies its leases are known and taken back.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Encode, Decode)]
pub struct InstanceId(pub u64);

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// How many times a job has been claimed. Every claim increments it, so it names one
/// execution of a job exactly: it is the **fencing token**. A write that carries an older
/// attempt than the job's current one comes from a holder that lost its lease, and the store
/// refuses it. Attempt 0 means "never claimed".
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Encode, Decode)]
pub struct Attempt(pub u32);

impl Attempt {
    /// The attempt a new claim will carry; `None` once the counter is exhausted, since a
    /// fence that stopped growing would let an old holder's write pass for a newer one's.
    pub fn next(self) -> Option<Attempt> {
        self.0.checked_add(1).map(Attempt)
    }
}

impl fmt::Display for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// The token of one lease, drawn at random when the lease is granted and kept in the job's
/// record: with the [`Attempt`], what a holder's write must name for the fence to let it
/// through.
///
/// An attempt number names one execution within one history of the store. A store that
/// loses its last commits — a PostgreSQL standby promoted before it received them, a store
/// file put back from a backup — grants the same attempt number again, to another holder,
/// while the first may still be running; the token (64 random bits) tells the two apart, so
/// the stale holder's renewals and ends are refused. [`LeaseToken::NONE`] is the token of
/// leases granted by builds before tokens, and of jobs never claimed.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Encode, Decode)]
pub struct LeaseToken(pub u64);

impl LeaseToken {
    /// No token: a job never claimed, or a lease granted by a build before tokens.
    pub const NONE: LeaseToken = LeaseToken(0);

    /// The token as PostgreSQL keeps it (its 64 bits as a signed `bigint`, the
    /// `lease_token` column), for the SQL functions that end an attempt (`complete_job`,
    /// `fail_job`: see the PostgreSQL guide).
    pub fn as_bigint(self) -> i64 {
        i64::from_ne_bytes(self.0.to_ne_bytes())
    }

    /// A new token, never [`LeaseToken::NONE`].
    pub(crate) fn fresh() -> LeaseToken {
        match crate::random::random_u64() {
            0 => LeaseToken(1),
            n => LeaseToken(n),
        }
    }
}

impl fmt::Display for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// A point on the store's clock, in nanoseconds since the store's own origin.
///
/// Store time is the only time leasehold compares: lease expiries, run-at times and history
/// timestamps are all written and compared in it, inside the store, so no two hosts' or
/// threads' wall clocks are ever compared. It never runs backwards, also across restarts
/// (see [`crate::Clock`]). It is not a wall-clock time and has no calendar meaning.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Encode, Decode)]
pub struct StoreTime(pub u64);

impl StoreTime {
    /// The store's origin.
    pub const ZERO: StoreTime = StoreTime(0);

    /// Nanoseconds since the store's origin.
    pub fn as_nanos(self) -> u64 {
        self.0
    }

    /// This time plus `d`, saturating at the end of time rather than wrapping, so an absurd
    /// delay or lease means "never" instead of "long ago".
    pub fn saturating_add(self, d: Duration) -> StoreTime {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        StoreTime(self.0.saturating_add(nanos))
    }

    /// How long after `earlier` this time is; zero if it is not after it.
    pub fn saturating_since(self, earlier: StoreTime) -> Duration {
        Duration::from_nanos(self.0.saturating_sub(earlier.0))
    }
}

impl fmt::Display for StoreTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = Duration::from_nanos(self.0);
        write!(f, "t+{:.3}s", d.as_secs_f64())
    }
}

/// The identity of a group of jobs ([`crate::NewGroup`]): assigned by the store, never
/// reused. A numbering of its own, apart from jobs'.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Encode, Decode)]
pub struct GroupId(pub u64);

impl fmt::Display for GroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "g{}", self.0)
    }
}
