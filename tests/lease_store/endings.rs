//! Endings: every end of a job or a group, kept in the transaction of the end, read in the
//! order they committed from a cursor that outlives its reader.

use std::time::Duration;

use leasehold::{EndCursor, EndOf, Ending, JobId, JobState, NewGroup, NewJob};

use crate::on_both::{Backend, Kind, Q, lease};

crate::on_both::on_both!(
    and protocol;
    every_end_is_kept_in_the_order_it_committed_and_read_on_from_a_cursor,
    a_job_that_ends_again_after_a_retry_has_a_second_ending,
    a_cursor_kept_as_text_reads_on_after_a_reopen,
    retention_takes_old_endings_and_a_reader_behind_it_is_told_of_the_gap,
    a_follower_gets_what_is_kept_at_once_and_an_empty_page_at_its_deadline,
    a_follower_is_woken_by_an_end_another_thread_or_machine_commits,
);

/// Shorter than [`leasehold::FOLLOW_LOOK`] (30 s), a follower's own look with no hint, and a
/// follower reads nothing at a deadline no hint came before: one that comes back with an
/// end committed within it was told of the commit. (Ample for one commit, on any machine.)
const HEARD: Duration = Duration::from_secs(4);

/// A pause before a commit, so that the follower has read once and waits (its order, not
/// its timing: a slower machine only makes the follower find the end at its first read).
const SETTLE: Duration = Duration::from_millis(300);

/// Reads endings after `after`, one page of `page` at a time, until `n` are read (on
/// PostgreSQL an ending is read once every older transaction on the server has ended, which
/// another test's may not have yet: a generous deadline, no timing asserted).
fn read(f: &Backend, after: EndCursor, page: usize, n: usize) -> (Vec<Ending>, EndCursor) {
    #[allow(clippy::disallowed_methods)]
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let (mut got, mut at) = (Vec::new(), after);
    while got.len() < n {
        let endings = f.endings(at, page).unwrap();
        assert!(endings.list.len() <= page, "a page holds at most its limit");
        assert!(!endings.gap);
        at = endings.next;
        got.extend(endings.list);
        #[allow(clippy::disallowed_methods)]
        let late = std::time::Instant::now() > deadline;
        assert!(
            !late,
            "{} endings of {n} after a minute: {got:?}",
            got.len()
        );
    }
    (got, at)
}

/// What each ending says: the job or group, and how it ended.
fn said(endings: &[Ending]) -> Vec<(Option<JobId>, Option<u64>, JobState)> {
    let of = |e: &Ending| match &e.of {
        EndOf::Job { id, queue } => {
            assert!(!queue.is_empty());
            (Some(*id), None)
        }
        EndOf::Group(g) => (None, Some(g.0)),
        other => panic!("an ending of {other:?}"),
    };
    endings
        .iter()
        .map(|e| {
            let (job, group) = of(e);
            (job, group, e.state)
        })
        .collect()
}

fn every_end_is_kept_in_the_order_it_committed_and_read_on_from_a_cursor(kind: Kind) {
    let f = kind.open();
    assert!(f.endings(EndCursor::START, 10).unwrap().list.is_empty());
    let [done, cancelled, dead] = f.enqueue_n(3)[..] else {
        unreachable!()
    };
    let late = f
        .enqueue(NewJob::new(Q, "late").expires_in(Duration::from_secs(5)))
        .unwrap();
    let l = f.claim_job(done, "w", lease()).unwrap().unwrap();
    f.complete(&l, b"").unwrap();
    f.cancel(cancelled).unwrap();
    let l = f.claim_job(dead, "w", lease()).unwrap().unwrap();
    f.fail_permanently(&l, "no").unwrap();
    let (group, members) = f
        .enqueue_group(NewGroup::new(), vec![NewJob::new("members", "m")])
        .unwrap();
    let l = f.claim("members", "w", lease()).unwrap().unwrap();
    f.complete(&l, b"").unwrap();
    f.advance(Duration::from_secs(10));
    f.reap().unwrap();
    let want = vec![
        (Some(done), None, JobState::Succeeded),
        (Some(cancelled), None, JobState::Cancelled),
        (Some(dead), None, JobState::Dead),
        (Some(members[0]), None, JobState::Succeeded),
        (None, Some(group.0), JobState::Succeeded),
        (Some(late), None, JobState::Expired),
    ];
    // Read whole, and a page of one at a time: the same endings, in the same order.
    let (all, end) = read(&f, EndCursor::START, 100, want.len());
    assert_eq!(said(&all), want);
    let (one_by_one, same_end) = read(&f, EndCursor::START, 1, want.len());
    assert_eq!(one_by_one, all);
    assert_eq!(end, same_end);
    let cursors: Vec<EndCursor> = all.iter().map(|e| e.cursor).collect();
    assert!(cursors.windows(2).all(|w| w[0] < w[1]), "{cursors:?}");
    assert!(all.windows(2).all(|w| w[0].at <= w[1].at));
    // Read on from the middle: what came after it.
    let (rest, _) = read(&f, all[2].cursor, 100, 3);
    assert_eq!(rest, all[3..]);
    assert!(f.endings(end, 10).unwrap().list.is_empty());
    assert_eq!(
        f.endings(end, 10).unwrap().next,
        end,
        "nothing new: the same cursor"
    );
}

fn a_job_that_ends_again_after_a_retry_has_a_second_ending(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue(NewJob::new(Q, "flaky").max_attempts(1)).unwrap();
    let l = f.claim(Q, "w", lease()).unwrap().unwrap();
    f.fail(&l, "first").unwrap();
    f.retry(id).unwrap();
    let l = f.claim(Q, "w", lease()).unwrap().unwrap();
    f.complete(&l, b"").unwrap();
    let (got, _) = read(&f, EndCursor::START, 10, 2);
    let want = vec![
        (Some(id), None, JobState::Dead),
        (Some(id), None, JobState::Succeeded),
    ];
    assert_eq!(said(&got), want);
}

/// A reader keeps its cursor as text, dies, and carries on after the store was closed and
/// opened again: it reads what ended meanwhile, and nothing twice.
fn a_cursor_kept_as_text_reads_on_after_a_reopen(kind: Kind) {
    let mut f = kind.open();
    let first = f.enqueue(NewJob::new(Q, "a")).unwrap();
    f.cancel(first).unwrap();
    let (got, at) = read(&f, EndCursor::START, 10, 1);
    assert_eq!(said(&got), [(Some(first), None, JobState::Cancelled)]);
    let kept = at.to_string();
    let second = f.enqueue(NewJob::new(Q, "b")).unwrap();
    f.cancel(second).unwrap();
    f.reopen();
    let at: EndCursor = kept.parse().unwrap();
    let (got, _) = read(&f, at, 10, 1);
    assert_eq!(said(&got), [(Some(second), None, JobState::Cancelled)]);
    assert!("7".parse::<EndCursor>().is_err());
    assert!("x.7".parse::<EndCursor>().is_err());
}

/// Endings go with the purge of what ended as long ago; a reader whose cursor is behind the
/// last one purged is told that it missed some, one past it is not.
fn retention_takes_old_endings_and_a_reader_behind_it_is_told_of_the_gap(kind: Kind) {
    let f = kind.open();
    let hour = Duration::from_secs(3600);
    let old = f.enqueue(NewJob::new(Q, "old")).unwrap();
    f.cancel(old).unwrap();
    let (got, after_old) = read(&f, EndCursor::START, 10, 1);
    f.advance(hour * 2);
    let young = f.enqueue(NewJob::new(Q, "young")).unwrap();
    f.cancel(young).unwrap();
    read(&f, after_old, 10, 1);
    f.purge(hour, &[JobState::Cancelled]).unwrap();
    let behind = f.endings(EndCursor::START, 10).unwrap();
    assert!(
        behind.gap,
        "the old ending was purged before this reader read it"
    );
    assert_eq!(
        said(&behind.list),
        [(Some(young), None, JobState::Cancelled)]
    );
    let caught_up = f.endings(got[0].cursor, 10).unwrap();
    assert!(!caught_up.gap, "this reader had read it");
    assert_eq!(caught_up.list, behind.list);
}

/// A follower returns at once what is kept after its cursor; with nothing after it, an empty
/// page at its deadline, the cursor where it was.
fn a_follower_gets_what_is_kept_at_once_and_an_empty_page_at_its_deadline(kind: Kind) {
    let f = kind.open();
    let short = Duration::from_millis(20);
    let none = f.wait_for_endings(EndCursor::START, 10, short).unwrap();
    assert!(none.list.is_empty());
    assert_eq!(none.next, EndCursor::START);
    let id = f.enqueue(NewJob::new(Q, "unwanted")).unwrap();
    f.cancel(id).unwrap();
    // (on PostgreSQL, behind every transaction older than it: a generous deadline)
    let page = f
        .wait_for_endings(EndCursor::START, 10, Duration::from_secs(60))
        .unwrap();
    assert_eq!(said(&page.list), [(Some(id), None, JobState::Cancelled)]);
    let after = f.wait_for_endings(page.next, 10, short).unwrap();
    assert!(after.list.is_empty());
    assert_eq!(after.next, page.next);
}

/// A follower waiting with nothing to read is woken by the commit of an end: another
/// thread's of its own handle, and on PostgreSQL another machine's, and then a machine's
/// that opened after the follower said it follows (the statement that keeps the end reads
/// whether somebody follows; nothing of the writer's listens).
fn a_follower_is_woken_by_an_end_another_thread_or_machine_commits(kind: Kind) {
    let f = kind.open();
    let writer = f.another_machine().unwrap_or_else(|| f.handle());
    let id = writer.enqueue(NewJob::new(Q, "order 42")).unwrap();
    let l = writer.claim(Q, "w", lease()).unwrap().unwrap();
    let page = std::thread::scope(|s| {
        let mine = f.handle();
        let follower = s.spawn(move || mine.wait_for_endings(EndCursor::START, 10, HEARD));
        std::thread::sleep(SETTLE);
        writer.complete(&l, b"").unwrap();
        follower.join().unwrap()
    });
    let page = page.unwrap();
    assert_eq!(
        said(&page.list),
        [(Some(id), None, JobState::Succeeded)],
        "the follower was not told of the end before its deadline"
    );
    let Some(newcomer) = f.another_machine() else {
        return;
    };
    // It commits an end every SETTLE until the follower comes back.
    let got = std::thread::scope(|s| {
        let mine = f.handle();
        let follower = s.spawn(move || mine.wait_for_endings(page.next, 10, HEARD));
        std::thread::sleep(SETTLE);
        while !follower.is_finished() {
            let id = newcomer.enqueue(NewJob::new(Q, "later")).unwrap();
            newcomer.cancel(id).unwrap();
            std::thread::sleep(SETTLE);
        }
        follower.join().unwrap()
    });
    assert!(
        !got.unwrap().list.is_empty(),
        "the machine that opened last did not tell the follower"
    );
}
