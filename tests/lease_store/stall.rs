use std::time::Duration;

use leasehold::{ConfigError, Error, JobState, LeaseTerms, Outcome, Renewal};

use crate::on_both::{Kind, LEASE, Q};

crate::on_both::on_both!(
    and protocol;
    a_heartbeat_without_progress_past_the_stall_timeout_revokes_the_lease,
    progress_keeps_a_slow_job_alive_past_the_stall_timeout,
    a_zero_stall_timeout_is_a_configuration_error,
);

fn terms() -> LeaseTerms {
    LeaseTerms::new(LEASE).stall_timeout(Duration::from_secs(90))
}

fn a_heartbeat_without_progress_past_the_stall_timeout_revokes_the_lease(kind: Kind) {
    let f = kind.open();
    let id = f.enqueue_n(1)[0];
    let l = f.claim(Q, "w", terms()).unwrap().unwrap();
    for _ in 0..4 {
        f.advance(Duration::from_secs(20));
        assert!(matches!(
            f.heartbeat(&l, 0).unwrap(),
            Renewal::Renewed { .. }
        ));
    }
    f.advance(Duration::from_secs(10)); // 90 s without progress
    assert_eq!(f.heartbeat(&l, 0).unwrap(), Renewal::Stalled);
    let job = f.job(id).unwrap().unwrap();
    assert_eq!(job.state(), JobState::RetryWait);
    assert_eq!(job.failures(), 1);
    assert_eq!(f.history(id).unwrap()[0].outcome(), Some(&Outcome::Stalled));
    assert_eq!(f.stats().unwrap().counters.stalled, 1);
    assert!(f.complete(&l, b"").unwrap_err().is_lease_lost());
}

fn progress_keeps_a_slow_job_alive_past_the_stall_timeout(kind: Kind) {
    let f = kind.open();
    f.enqueue_n(1);
    let l = f.claim(Q, "w", terms()).unwrap().unwrap();
    for step in 1..=20u64 {
        f.advance(Duration::from_secs(20));
        assert!(matches!(
            f.heartbeat(&l, step).unwrap(),
            Renewal::Renewed { .. }
        ));
    }
    f.complete(&l, b"slow but steady").unwrap();
}

fn a_zero_stall_timeout_is_a_configuration_error(kind: Kind) {
    let f = kind.open();
    f.enqueue_n(1);
    let zero = LeaseTerms::new(LEASE).stall_timeout(Duration::ZERO);
    assert!(matches!(
        f.claim(Q, "w", zero),
        Err(Error::Config(ConfigError::ZeroStallTimeout))
    ));
}
