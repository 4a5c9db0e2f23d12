//! The one clock.
//!
//! How store time is made, and why it is safe, is told on [`Clock`].
//!
//! This is the only module that reads the host's time; clippy's `disallowed-methods` enforces it.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bincode::{Decode, Encode};

use crate::ids::StoreTime;

/// One reading of a time source.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ClockReading {
    /// Identifies the span in which ticks are comparable (for the host clock: one boot).
    pub epoch: u128,
    /// Nanoseconds since an arbitrary origin fixed for the epoch.
    pub ticks: u64,
}

/// A time source for a store. Implementations must be monotonic within an epoch.
///
/// Every lease expiry is written and compared on the store's clock, inside the store. Workers
/// never compare their own clocks with a stored expiry, so clock skew between threads,
/// processes or a wall clock that an NTP daemon steps cannot expire a lease early.
///
/// # How store time is made
/// A [`Clock`] is a *time source*: it returns a [`ClockReading`], a tick count in nanoseconds
/// within an *epoch* (a span in which the ticks are comparable). The store turns readings
/// into [`StoreTime`] with an anchor persisted in the store file: "at tick `ticks` of epoch
/// `epoch`, store time was `store`". Store time is then `anchor.store + (ticks - anchor.ticks)`.
///
/// * The default [`MonotonicClock`] reads the host's `CLOCK_MONOTONIC`, and its epoch is the
///   kernel's boot id. Every process on the host reads the same ticks within a boot, so several
///   processes that open one store agree on store time through the one anchor in the file.
/// * When the store is opened in a new epoch (the host rebooted, or another clock is used), the
///   store re-anchors so that time resumes at the store's persisted **high-water mark**: the
///   largest of every `now` at which it committed and every lease expiry it wrote.
///
/// # What happens to downtime, and why that is safe
/// Within one boot the host clock keeps running while the application is down, so a restart
/// loses no time: leases written before a crash expire when they would have.
/// Across a reboot the time the machine was off is unknown; the store resumes at its
/// high-water mark. Because that mark includes every lease expiry ever written, **every lease
/// from before the reboot is expired when the store reopens** (a reboot ended every process
/// that held one, so none of them is alive to be wronged). Waiting jobs' run-at times and
/// retry backoffs, in contrast, do not count the time the machine was off: a job delayed by an
/// hour runs after an hour of running time. Store time therefore never runs backwards, and it
/// never runs *ahead* of what was observed, so no live lease can be expired by a clock jump.
///
/// `CLOCK_MONOTONIC` (not `CLOCK_BOOTTIME`) is chosen because it does not advance while the
/// host is suspended: the workers are suspended too, and counting that time would expire all
/// of their leases at once on resume and run their jobs twice.
///
pub trait Clock: Send + Sync + fmt::Debug + 'static {
    /// Reads the source.
    fn read(&self) -> ClockReading;
}

/// The host's monotonic clock (`CLOCK_MONOTONIC`, as the host reads it also from inside a time
/// namespace), with the boot id as its epoch.
///
/// On hosts without a readable boot id, each process gets an epoch of its own: the store then
/// resumes at its high-water mark on every open, and sharing one store between processes
/// needs all of them to read the same anchor within one boot, which such hosts cannot promise.
#[derive(Debug, Clone)]
pub struct MonotonicClock {
    epoch: u128,
}

impl MonotonicClock {
    /// A handle on the host's monotonic clock.
    pub fn new() -> MonotonicClock {
        MonotonicClock {
            epoch: boot_id().unwrap_or_else(crate::random::random_u128),
        }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        MonotonicClock::new()
    }
}

impl Clock for MonotonicClock {
    fn read(&self) -> ClockReading {
        ClockReading {
            epoch: self.epoch,
            ticks: monotonic_nanos(),
        }
    }
}

/// The host's `CLOCK_MONOTONIC`, the same reading in every process of the host: inside a time
/// namespace (containers, checkpoint/restore) the kernel adds the namespace's offset, which is
/// taken off again here. Without that, a store made in a namespace whose clock runs 100,000 s
/// ahead would stand still on the host until the host's clock caught up, and two processes of
/// one boot would disagree on store time.
#[cfg(unix)]
fn monotonic_nanos() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec and CLOCK_MONOTONIC exists on every unix
    // leasehold supports; clock_gettime writes only into `ts`.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return fallback_nanos();
    }
    let secs = i128::from(ts.tv_sec);
    let nanos = i128::from(ts.tv_nsec);
    let reading = secs * 1_000_000_000 + nanos - namespace_offset_nanos();
    u64::try_from(reading.max(0)).unwrap_or(u64::MAX)
}

/// This process's time namespace's offset of `CLOCK_MONOTONIC` (zero outside one, or where the
/// kernel has no time namespaces). A process's time namespace is fixed once it runs threads,
/// so it is read once.
#[cfg(unix)]
fn namespace_offset_nanos() -> i128 {
    use std::sync::OnceLock;
    static OFFSET: OnceLock<i128> = OnceLock::new();
    *OFFSET.get_or_init(|| {
        std::fs::read_to_string("/proc/self/timens_offsets")
            .ok()
            .and_then(|text| parse_monotonic_offset(&text))
            .unwrap_or(0)
    })
}

/// The `monotonic` line of `/proc/PID/timens_offsets` ("monotonic <secs> <nanos>"), in
/// nanoseconds.
fn parse_monotonic_offset(text: &str) -> Option<i128> {
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("monotonic"))?;
    let mut fields = line.split_whitespace().skip(1);
    let secs: i128 = fields.next()?.parse().ok()?;
    let nanos: i128 = fields.next()?.parse().ok()?;
    Some(secs * 1_000_000_000 + nanos)
}

#[cfg(not(unix))]
fn monotonic_nanos() -> u64 {
    fallback_nanos()
}

/// A per-process monotonic origin: correct within this process, which is all a host without
/// a shared monotonic clock can offer (its epoch is per process too).
fn fallback_nanos() -> u64 {
    use std::sync::OnceLock;
    use std::time::Instant;
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    #[allow(clippy::disallowed_methods)] // the one clock module
    let origin = *ORIGIN.get_or_init(Instant::now);
    u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

fn boot_id() -> Option<u128> {
    let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let hex: String = text.trim().chars().filter(|c| *c != '-').collect();
    u128::from_str_radix(&hex, 16).ok()
}

/// The wall clock, in whole seconds since the Unix epoch: read only to find a cron
/// schedule's ticks ([`crate::schedule`]), never to judge a lease.
#[allow(clippy::disallowed_methods)] // the one clock module; wall time for cron ticks only
pub(crate) fn wall_seconds(at: std::time::SystemTime) -> i64 {
    match at.duration_since(std::time::UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        Err(before) => -i64::try_from(before.duration().as_secs()).unwrap_or(i64::MAX),
    }
}

/// The wall clock now (see [`wall_seconds`]).
#[allow(clippy::disallowed_methods)] // the one clock module; wall time for cron ticks only
pub(crate) fn wall_now() -> std::time::SystemTime {
    std::time::SystemTime::now()
}

/// A point in real (host monotonic) time, for thread lifecycles only: how long a shutdown
/// waits, how long a test waits. Never compared with store time or stored.
#[derive(Copy, Clone, Debug)]
pub(crate) struct RealDeadline(std::time::Instant);

impl RealDeadline {
    /// `d` from now.
    #[allow(clippy::disallowed_methods)] // the one clock module
    pub(crate) fn after(d: Duration) -> RealDeadline {
        let now = std::time::Instant::now();
        RealDeadline(
            now.checked_add(d)
                .unwrap_or(now + Duration::from_secs(86_400 * 365)),
        )
    }

    /// The time left, zero once passed.
    #[allow(clippy::disallowed_methods)] // the one clock module
    pub(crate) fn remaining(&self) -> Duration {
        self.0.saturating_duration_since(std::time::Instant::now())
    }

    /// `d` after this deadline (or after now, if this deadline passed more than `d` ago, so
    /// a stalled loop does not fire a burst of catch-up ticks).
    pub(crate) fn plus(&self, d: Duration) -> RealDeadline {
        let next = RealDeadline(self.0 + d);
        if next.passed() {
            RealDeadline::after(d)
        } else {
            next
        }
    }

    pub(crate) fn passed(&self) -> bool {
        self.remaining().is_zero()
    }
}

/// Real time elapsed since a start, for pacing decisions inside one process (how long
/// handlers and commits take). Never stored, never compared with store time.
#[derive(Copy, Clone, Debug)]
pub(crate) struct Stopwatch(std::time::Instant);

impl Stopwatch {
    #[allow(clippy::disallowed_methods)] // the one clock module
    pub(crate) fn start() -> Stopwatch {
        Stopwatch(std::time::Instant::now())
    }

    pub(crate) fn elapsed(&self) -> Duration {
        self.0.elapsed()
    }
}

/// A clock that moves only when told: for deterministic tests and simulations.
///
/// Clones share one time. Each `ManualClock::new()` is its own epoch, so reopening a store
/// with a clone continues its time, and reopening it with a fresh manual clock resumes at the
/// store's high-water mark, exactly as the host clock does across a reboot.
#[derive(Debug, Clone)]
pub struct ManualClock {
    inner: Arc<ManualInner>,
}

#[derive(Debug)]
struct ManualInner {
    epoch: u128,
    ticks: AtomicU64,
}

impl ManualClock {
    /// A manual clock reading zero.
    pub fn new() -> ManualClock {
        ManualClock {
            inner: Arc::new(ManualInner {
                epoch: crate::random::random_u128(),
                ticks: AtomicU64::new(0),
            }),
        }
    }

    /// Moves the clock forward by `d`.
    pub fn advance(&self, d: Duration) {
        let nanos = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        let _ = self
            .inner
            .ticks
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| {
                Some(t.saturating_add(nanos))
            });
    }

    /// Sets the clock's reading to `since_origin`. Setting it backwards is allowed (to test
    /// that the store never follows it backwards).
    pub fn set(&self, since_origin: Duration) {
        let nanos = u64::try_from(since_origin.as_nanos()).unwrap_or(u64::MAX);
        self.inner.ticks.store(nanos, Ordering::SeqCst);
    }

    /// The clock's current reading.
    pub fn elapsed(&self) -> Duration {
        Duration::from_nanos(self.inner.ticks.load(Ordering::SeqCst))
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        ManualClock::new()
    }
}

impl Clock for ManualClock {
    fn read(&self) -> ClockReading {
        ClockReading {
            epoch: self.inner.epoch,
            ticks: self.inner.ticks.load(Ordering::SeqCst),
        }
    }
}

/// "At tick `ticks` of epoch `epoch`, store time was `store`." Persisted in the store.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Encode, Decode)]
pub(crate) struct Anchor {
    /// The epoch of the reading.
    pub epoch: u128,
    /// The source's ticks at the anchor.
    pub ticks: u64,
    /// Store time at the anchor.
    pub store: StoreTime,
}

/// A time source bound to a store's timeline: converts readings to [`StoreTime`] and never
/// returns a time below one it returned before.
#[derive(Debug)]
pub(crate) struct StoreClock {
    source: Arc<dyn Clock>,
    anchor: Anchor,
    last: AtomicU64,
}

impl StoreClock {
    /// Binds `source` to a store whose persisted anchor and high-water mark are given.
    /// Returns the clock and whether its anchor is new (and must be persisted).
    pub(crate) fn resume(
        source: Arc<dyn Clock>,
        persisted: Option<Anchor>,
        high_water: StoreTime,
    ) -> (StoreClock, bool) {
        let reading = source.read();
        // Within one epoch the source never runs backwards, so the anchor holds as it is; the
        // high-water mark (which includes future lease expiries) matters only to a new epoch,
        // whose relation to the old ticks is unknown.
        let continued = persisted.filter(|a| a.epoch == reading.epoch);
        let (anchor, fresh) = match continued {
            Some(a) => (a, false),
            None => (
                Anchor {
                    epoch: reading.epoch,
                    ticks: reading.ticks,
                    store: high_water,
                },
                true,
            ),
        };
        let clock = StoreClock {
            last: AtomicU64::new(project(&anchor, reading.ticks).0),
            source,
            anchor,
        };
        (clock, fresh)
    }

    /// The current store time.
    pub(crate) fn now(&self) -> StoreTime {
        let reading = self.source.read();
        let t = if reading.epoch == self.anchor.epoch {
            project(&self.anchor, reading.ticks).0
        } else {
            // A source that changed epoch under a running store: hold time still rather than
            // guess; the next open re-anchors.
            0
        };
        let prev = self.last.fetch_max(t, Ordering::SeqCst);
        StoreTime(prev.max(t))
    }

    /// The same source on the same timeline, as a store opened anew resumes it.
    #[cfg(feature = "__internal")]
    pub(crate) fn resumed(&self) -> StoreClock {
        StoreClock::resume(self.source.clone(), Some(self.anchor), self.now()).0
    }

    pub(crate) fn anchor(&self) -> Anchor {
        self.anchor
    }
}

fn project(anchor: &Anchor, ticks: u64) -> StoreTime {
    if ticks >= anchor.ticks {
        StoreTime(anchor.store.0.saturating_add(ticks - anchor.ticks))
    } else {
        StoreTime(anchor.store.0.saturating_sub(anchor.ticks - ticks))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_clock_never_runs_backwards_when_source_is_set_back() {
        let manual = ManualClock::new();
        manual.set(Duration::from_secs(100));
        let (clock, _) = StoreClock::resume(Arc::new(manual.clone()), None, StoreTime::ZERO);
        let t1 = clock.now();
        manual.set(Duration::from_secs(10));
        assert!(clock.now() >= t1);
    }

    #[test]
    fn same_epoch_continues_the_persisted_anchor() {
        let manual = ManualClock::new();
        let (clock, fresh) = StoreClock::resume(Arc::new(manual.clone()), None, StoreTime::ZERO);
        assert!(fresh);
        let anchor = clock.anchor();
        manual.advance(Duration::from_secs(5));
        let (again, fresh) =
            StoreClock::resume(Arc::new(manual.clone()), Some(anchor), StoreTime(1));
        assert!(!fresh);
        assert_eq!(again.now(), StoreTime(5_000_000_000));
    }

    #[test]
    fn same_epoch_does_not_jump_to_a_lease_expiry_in_the_future() {
        let manual = ManualClock::new();
        let (clock, _) = StoreClock::resume(Arc::new(manual.clone()), None, StoreTime::ZERO);
        manual.advance(Duration::from_secs(1));
        let live_lease_expiry = StoreTime(61_000_000_000);
        let (again, fresh) = StoreClock::resume(
            Arc::new(manual.clone()),
            Some(clock.anchor()),
            live_lease_expiry,
        );
        assert!(!fresh);
        assert_eq!(again.now(), StoreTime(1_000_000_000));
    }

    #[test]
    fn new_epoch_resumes_at_the_high_water_mark() {
        let old = ManualClock::new();
        let (clock, _) = StoreClock::resume(Arc::new(old), None, StoreTime::ZERO);
        let anchor = clock.anchor();
        let fresh_source = ManualClock::new();
        let hw = StoreTime(42_000_000_000);
        let (clock, fresh) = StoreClock::resume(Arc::new(fresh_source.clone()), Some(anchor), hw);
        assert!(fresh);
        assert_eq!(clock.now(), hw);
        fresh_source.advance(Duration::from_secs(1));
        assert_eq!(clock.now(), StoreTime(43_000_000_000));
    }

    #[test]
    fn a_time_namespaces_monotonic_offset_is_read_from_its_proc_file() {
        let text = "monotonic      100000         5\nboottime            0         0\n";
        assert_eq!(parse_monotonic_offset(text), Some(100_000_000_000_005));
        assert_eq!(
            parse_monotonic_offset("monotonic -3 0\n"),
            Some(-3_000_000_000)
        );
        assert_eq!(parse_monotonic_offset("boottime 1 0\n"), None);
        assert_eq!(parse_monotonic_offset(""), None);
    }

    #[test]
    fn host_clock_is_monotonic_and_shares_an_epoch_between_handles() {
        let a = MonotonicClock::new();
        let b = MonotonicClock::new();
        let r1 = a.read();
        let r2 = b.read();
        assert_eq!(r1.epoch, r2.epoch);
        assert!(r2.ticks >= r1.ticks);
    }
}
