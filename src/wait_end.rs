//! Waiting for an end: looking again until a job has ended, or a group has, from any
//! process ([`crate::ReadJobs::wait_for`], [`crate::ReadJobs::wait_for_group`], which say
//! what they look for).
//!
//! The store's records are the truth, so a wait reads them: at once, then after pauses that
//! double from [`FIRST_PAUSE`] to [`WAIT_MAX_PAUSE`]. An end committed by any process or
//! machine, an attempt's or not (a cancel, an expiry), is so seen within [`WAIT_MAX_PAUSE`]
//! of its commit. There is no notice to lose, only a record to read: a waiter cannot miss an
//! end. (It subscribes to nothing: a subscriber would make every transaction of its store
//! build events, and be woken by each, for the one end it waits for.)
//!
//! Following every end ([`crate::ReadJobs::wait_for_endings`]) reads the endings instead,
//! and between two reads waits for a hint ([`follow`]): a commit that kept an ending wakes
//! this process's followers, and, while a follower says it follows, tells the other
//! processes of a shared file (a datagram) or the machines of a database (`NOTIFY`). The
//! endings are the truth and a hint only says when to read them, so a lost hint delays a
//! follower by one [`FOLLOW_LOOK`] at most; a handle that cannot be told (a read-only
//! reader) reads at the pauses a wait reads at.

use std::time::Duration;

use crate::clock::RealDeadline;
use crate::endings::{EndCursor, Endings};
use crate::error::Result;
use crate::notify::Notifier;

/// The first pause between two looks of a wait.
pub(crate) const FIRST_PAUSE: Duration = Duration::from_millis(2);

/// The longest pause between two reads of a wait ([`crate::ReadJobs::wait_for`]): the most
/// after its commit that an end is seen.
pub const WAIT_MAX_PAUSE: Duration = Duration::from_millis(200);

/// Looks until `look` finds what it waits for or `timeout` passes (`None`, after a last
/// look at the deadline).
pub(crate) fn until<T>(
    timeout: Duration,
    mut look: impl FnMut() -> Result<Option<T>>,
) -> Result<Option<T>> {
    let deadline = RealDeadline::after(timeout);
    let mut pause = FIRST_PAUSE;
    loop {
        if let Some(found) = look()? {
            return Ok(Some(found));
        }
        std::thread::sleep(pause.min(deadline.remaining()));
        if deadline.passed() {
            return look();
        }
        pause = (pause * 2).min(WAIT_MAX_PAUSE);
    }
}

/// How often a follower that hints can wake reads the endings with no hint: what bounds the
/// delay of an end whose hint was lost (a full socket, a listener reconnecting). Every
/// process that ends something sends a hint while somebody follows, so a lost one is rare;
/// an idle follower wakes for this look alone.
pub const FOLLOW_LOOK: Duration = Duration::from_secs(30);

/// How long after it first says it follows a follower reads again, hint or not: a commit in
/// another process that ended before that process heard the follower sends no hint.
const HEARD_WITHIN: Duration = Duration::from_millis(50);

/// What wakes a follower of one handle between its reads: the handle's notifier, and the
/// engine's way to say to the other processes that it follows (`true` when it said so anew,
/// what it said before having lapsed: see [`Notifier::announce_due`]).
pub(crate) struct Hints<'a> {
    pub(crate) notifier: &'a Notifier,
    pub(crate) announce: &'a dyn Fn() -> bool,
}

/// Reads the endings after `after` (by `read`, [`crate::ReadJobs::endings`]) until there
/// is one or `timeout` passes (an empty page): at once, then after each hint (and at least
/// every [`FOLLOW_LOOK`]), or, without hints or while PostgreSQL holds endings back
/// ([`Endings::held_back`]), at pauses that double from [`FIRST_PAUSE`] to
/// [`WAIT_MAX_PAUSE`] and once more at the deadline. A follower that hints wake reads
/// nothing at a deadline no hint came before: an end committed unheard
/// meanwhile is the next call's first read.
pub(crate) fn follow(
    read: impl Fn(EndCursor, usize) -> Result<Endings>,
    hints: Option<Hints<'_>>,
    after: EndCursor,
    limit: usize,
    timeout: Duration,
) -> Result<Endings> {
    let deadline = RealDeadline::after(timeout);
    let mut pause = FIRST_PAUSE;
    loop {
        // (the generation before the read: a hint between the read and the wait is kept)
        let (seen, fresh) = match &hints {
            Some(h) => (h.notifier.endings_generation(), (h.announce)()),
            None => (0, false),
        };
        let page = read(after, limit)?;
        if !page.list.is_empty() || deadline.passed() {
            return Ok(page);
        }
        let (wait, polling) = match &hints {
            Some(_) if fresh => (HEARD_WITHIN, true),
            Some(_) if !page.held_back => (FOLLOW_LOOK, false),
            _ => {
                let p = pause;
                pause = (pause * 2).min(WAIT_MAX_PAUSE);
                (p, true)
            }
        };
        let wait = wait.min(deadline.remaining());
        match &hints {
            Some(h) => {
                let hinted = h.notifier.wait_endings(seen, wait);
                if !hinted && !polling && deadline.passed() {
                    return Ok(page);
                }
            }
            None => std::thread::sleep(wait),
        }
    }
}
