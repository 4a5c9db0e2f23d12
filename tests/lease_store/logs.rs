//! Job logs: the lines each attempt wrote, kept apart per attempt, bounded, gone with the
//! job when it is purged.

use std::time::Duration;

use leasehold::{JobState, MAX_LOG_LINES, NewJob};

use crate::on_both::{Backend, Kind, LEASE, Q};

crate::on_both::on_both!(
    and protocol;
    each_attempts_lines_are_kept_apart_bounded_and_purged_with_the_job,
);

fn lines(f: &Backend, job: leasehold::JobId) -> Vec<(u32, u64, Vec<String>)> {
    (f.logs(job).unwrap().iter())
        .map(|l| {
            let text = l.lines().map(|(_, t)| t.to_owned()).collect();
            (l.attempt().0, l.dropped(), text)
        })
        .collect()
}

/// A takeover's attempt writes its own log; the holder it replaced still writes to its own
/// attempt's (the truth about what it did), never to the new one's. An attempt keeps its
/// newest lines and counts the rest. The lines go with the job.
fn each_attempts_lines_are_kept_apart_bounded_and_purged_with_the_job(kind: Kind) {
    let f = kind.open();
    let job = f.enqueue(NewJob::new(Q, "import")).unwrap();
    assert!(lines(&f, job).is_empty());
    let first = f.claim_one("a");
    f.log(&first, &["opened rows.csv", "row 1"]).unwrap();
    f.advance(LEASE + Duration::from_secs(1));
    let second = f.claim_one("b");
    f.log(&first, &["row 2, late"]).unwrap();
    let many: Vec<String> = (0..MAX_LOG_LINES + 20)
        .map(|i| format!("line {i}"))
        .collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    f.log(&second, &many[..50]).unwrap();
    f.log(&second, &many[50..]).unwrap();
    let found = lines(&f, job);
    assert_eq!(found.len(), 2, "{found:?}");
    assert_eq!(
        found[0],
        (
            1,
            0,
            vec![
                "opened rows.csv".into(),
                "row 1".into(),
                "row 2, late".into()
            ]
        )
    );
    assert_eq!((found[1].0, found[1].1), (2, 20));
    assert_eq!(found[1].2.first().map(String::as_str), Some("line 20"));
    assert_eq!(found[1].2.len(), MAX_LOG_LINES);
    let at = f.logs(job).unwrap()[0].lines().next().unwrap().0;
    assert!(at <= f.now());
    f.complete(&second, b"").unwrap();
    f.advance(Duration::from_secs(10));
    assert_eq!(
        f.purge(Duration::from_secs(1), &[JobState::Succeeded])
            .unwrap(),
        1
    );
    assert!(lines(&f, job).is_empty());
    f.log(&second, &["after the purge"]).unwrap();
    assert!(
        lines(&f, job).is_empty(),
        "nothing written for a job that is gone"
    );
}
