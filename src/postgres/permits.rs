//! How many connections a [`super::PgStore`] handle holds at once for its operations: at
//! most [`connections`](super::PgStoreBuilder::connections). An operator sizes the server's
//! `max_connections` by it, so it is a bound the handle keeps, not a figure measured once:
//! an operation that finds every connection lent waits for one to come back.
//!
//! One sequence holds two at once: a big round's two halves, in two transactions on two
//! threads that wait on each other ([`super::backend`]). Were each half to wait for its
//! connection, two such rounds holding one each could wait forever on the last; so the
//! round takes both now or runs in one transaction ([`Permits::reserve_pair`]), and each
//! half's thread uses the one kept for it.

use std::cell::Cell;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

/// The handle's count of connections lent, and its bound.
pub(super) struct Permits {
    most: usize,
    lent: Mutex<usize>,
    returned: Condvar,
}

/// One connection's room, given back when dropped.
pub(super) struct Permit<'a> {
    permits: &'a Permits,
    /// Kept for this thread by [`Permits::reserve_pair`]: given back when the reservation
    /// ends, not now.
    reserved: bool,
}

/// A room kept for one thread: its operations use it, one at a time, while this lives.
pub(super) struct Reserved<'a> {
    permits: &'a Permits,
}

thread_local! {
    /// The handle (its `Permits`' address) this thread holds a reserved room of, and whether
    /// an operation uses it now.
    static RESERVED: Cell<(usize, bool)> = const { Cell::new((0, false)) };
    /// The handle (its `Permits`' address) this thread's operations hold rooms of, and how
    /// many: an operation called inside another's closure (the application's, in
    /// `PgStore::transaction`) on a handle whose every room this thread holds would wait for
    /// itself.
    static HELD: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
}

/// Why no room was given (its words are [`super::PgError::TooManyConnections`]'s).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum Busy {
    /// None was given back within the wait.
    #[error(
        "all {most} connections of this handle (PgStoreBuilder::connections) stayed in use \
         for {waited:?}"
    )]
    Waited { most: usize, waited: Duration },
    /// This thread holds every one, in operations it is inside of: no wait would end.
    #[error(
        "all {most} connections of this handle (PgStoreBuilder::connections) are held by \
         operations this call is inside of (the store called from PgStore::transaction's \
         closure?): give it one more"
    )]
    HeldHere { most: usize },
}

impl Permits {
    pub(super) fn new(most: usize) -> Permits {
        Permits {
            most: most.max(1),
            lent: Mutex::new(0),
            returned: Condvar::new(),
        }
    }

    fn address(&self) -> usize {
        self as *const Permits as usize
    }

    /// Room for one connection: this thread's reserved one if it has one free, else one of
    /// the handle's, waiting up to `wait` for one to be given back.
    pub(super) fn take(&self, wait: Duration) -> Result<Permit<'_>, Busy> {
        let here = self.address();
        let reserved = RESERVED.with(|r| match r.get() {
            (address, false) if address == here => {
                r.set((address, true));
                true
            }
            _ => false,
        });
        if reserved {
            return Ok(Permit {
                permits: self,
                reserved: true,
            });
        }
        let held = HELD.with(|h| match h.get() {
            (address, n) if address == here => n,
            _ => 0,
        });
        if held >= self.most {
            return Err(Busy::HeldHere { most: self.most });
        }
        let waited = crate::clock::Stopwatch::start();
        let mut lent = self.lent.lock();
        while *lent >= self.most {
            let left = wait.saturating_sub(waited.elapsed());
            let timed_out = left.is_zero() || self.returned.wait_for(&mut lent, left).timed_out();
            if timed_out && *lent >= self.most {
                return Err(Busy::Waited {
                    most: self.most,
                    waited: wait,
                });
            }
        }
        *lent += 1;
        // (a thread of one handle at a time is counted; another's nesting goes uncounted)
        HELD.with(|h| match h.get() {
            (address, n) if address == here => h.set((address, n + 1)),
            (_, 0) => h.set((here, 1)),
            _ => {}
        });
        Ok(Permit {
            permits: self,
            reserved: false,
        })
    }

    /// Room for two connections now, or `None` without waiting: the first kept for the
    /// calling thread, the second handed to the thread that will use it
    /// ([`Reserved::enter`]).
    pub(super) fn reserve_pair(&self) -> Option<(Reserved<'_>, Reserved<'_>)> {
        let mut lent = self.lent.lock();
        if *lent + 2 > self.most || RESERVED.with(|r| r.get().0 != 0) {
            return None;
        }
        *lent += 2;
        drop(lent);
        let here = Reserved { permits: self };
        here.enter();
        Some((here, Reserved { permits: self }))
    }

    fn give_back(&self) {
        *self.lent.lock() -= 1;
        self.returned.notify_one();
    }

    /// One fewer room held by this thread's operations.
    fn let_go(&self) {
        let here = self.address();
        HELD.with(|h| {
            if let (address, n) = h.get()
                && address == here
            {
                h.set(match n {
                    0 | 1 => (0, 0),
                    n => (address, n - 1),
                });
            }
        });
    }
}

impl Reserved<'_> {
    /// Keeps this room for the calling thread.
    pub(super) fn enter(&self) {
        RESERVED.with(|r| r.set((self.permits.address(), false)));
    }
}

impl Drop for Reserved<'_> {
    fn drop(&mut self) {
        let here = self.permits.address();
        RESERVED.with(|r| {
            if r.get().0 == here {
                r.set((0, false));
            }
        });
        self.permits.give_back();
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if self.reserved {
            RESERVED.with(|r| r.set((r.get().0, false)));
        } else {
            self.permits.let_go();
            self.permits.give_back();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_handle_lends_no_more_connections_than_its_bound_and_a_waiter_gets_one_given_back() {
        let permits = Permits::new(2);
        let a = permits.take(Duration::ZERO).expect("the first");
        let _b = permits.take(Duration::ZERO).expect("the second");
        // This thread holds both: a third asked for here would wait for itself.
        assert_eq!(
            permits.take(Duration::from_secs(60)).err(),
            Some(Busy::HeldHere { most: 2 })
        );
        std::thread::scope(|s| {
            let other = s.spawn(|| permits.take(Duration::from_millis(10)).err());
            let waited = Duration::from_millis(10);
            let busy = Busy::Waited { most: 2, waited };
            assert_eq!(other.join().unwrap(), Some(busy), "another waits");
            let waiter = s.spawn(|| permits.take(Duration::from_secs(60)).is_ok());
            drop(a);
            assert!(waiter.join().unwrap(), "the waiter got the one given back");
        });
    }

    #[test]
    fn a_pair_is_reserved_whole_or_not_at_all_and_its_threads_use_only_their_own() {
        let permits = &Permits::new(3);
        let one = permits.take(Duration::ZERO).expect("one");
        let (here, there) = permits.reserve_pair().expect("two of the three are free");
        // This thread's operations, one after another, use the room kept for it.
        for _ in 0..3 {
            let p = permits.take(Duration::ZERO).expect("its own room");
            assert!(p.reserved);
        }
        // Nested in one of them, another takes the handle's (none left now).
        let held = permits.take(Duration::ZERO).expect("its own room");
        assert_eq!(
            permits.take(Duration::ZERO).err(),
            Some(Busy::Waited {
                most: 3,
                waited: Duration::ZERO
            }),
            "the bound holds"
        );
        drop(held);
        std::thread::scope(|s| {
            s.spawn(move || {
                there.enter();
                let p = permits.take(Duration::ZERO).expect("the room handed over");
                assert!(p.reserved);
            });
        });
        assert!(
            permits.reserve_pair().is_none(),
            "this thread already holds one"
        );
        drop(here);
        drop(one);
        assert_eq!(*permits.lent.lock(), 0, "every room was given back");
        let (_x, _y) = permits.reserve_pair().expect("all free again");
        let third = permits.take(Duration::ZERO).expect("this thread's own");
        assert!(third.reserved);
    }
}
