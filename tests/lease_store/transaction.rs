//! What only the redb store's transactions have: the application's tables beside the
//! store's own (whose prefix is refused to it), and the writer's seat that a store call from
//! inside the transaction would wait on. (On PostgreSQL the application's SQL runs in its own
//! schema, and a store call from inside runs on another connection.)

use leasehold::{Error, JobState, NewJob};
use leasehold::{JobStore, ReadJobs};
use redb::TableDefinition;

use crate::common::{Fixture, LEASE, Q};

#[test]
fn the_stores_own_tables_are_refused_to_the_application() {
    let f = Fixture::new();
    let theirs: TableDefinition<&str, &[u8]> = TableDefinition::new("leasehold.jobs");
    let err = f
        .transaction(|t| t.open_table(theirs).map(|_| ()))
        .unwrap_err();
    assert!(matches!(err, Error::Input(_)), "{err:?}");
}

#[test]
fn calling_the_store_from_inside_its_own_transaction_is_an_error_not_a_hang() {
    let f = Fixture::new();
    f.enqueue_n(1);
    let l = f.claim_one("w");
    let store = (*f).clone();
    let err = f
        .complete_with(&l, b"ok", |_t| -> Result<(), Error> {
            store.enqueue(NewJob::new(Q, "follow-up, the wrong way"))?;
            Ok(())
        })
        .unwrap_err();
    assert!(matches!(err, Error::Reentered), "{err:?}");
    let err = f.transaction(|_t| store.claim(Q, "w2", LEASE)).unwrap_err();
    assert!(matches!(err, Error::Reentered), "{err:?}");
    assert!(matches!(
        f.transaction(|_t| f.reap().map(|_| ())),
        Err(Error::Reentered)
    ));
    // reads are fine inside, and the store works again once the transaction is over
    f.transaction(|_t| f.job(l.job).map(|_| ())).unwrap();
    assert_eq!(f.job(l.job).unwrap().unwrap().state(), JobState::Running);
    f.complete(&l, b"ok").unwrap();
}
