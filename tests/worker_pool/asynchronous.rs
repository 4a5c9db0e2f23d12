//! Async applications (the `tokio` feature): async handlers on a runtime, async waits.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use leasehold::{Interrupted, Interruption, JobState, NewJob};

use crate::common::wait_until;
use crate::on_both::{Kind, Q};
use crate::pool;

crate::on_both::on_both!(
    an_async_handler_runs_on_the_runtime_and_its_output_is_committed,
    an_async_handler_that_panics_fails_its_attempt_and_the_pool_keeps_working,
    a_cancelled_job_wakes_its_async_handler_from_a_long_sleep,
    an_async_wait_for_work_is_woken_by_the_enqueue_not_by_its_timeout,
);

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap()
}

fn an_async_handler_runs_on_the_runtime_and_its_output_is_committed(kind: Kind) {
    let rt = runtime();
    let f = kind.open();
    let ids = f.enqueue_n(8);
    let p = pool(&f, "w")
        .concurrency(4)
        .start_async(rt.handle().clone(), |ctx| async move {
            tokio::time::sleep(Duration::from_millis(1)).await; // needs the runtime's timer
            ctx.tick();
            Ok(format!("done {}", ctx.job()))
        })
        .unwrap();
    wait_until("every job to succeed", || p.stats().succeeded == 8);
    for id in ids {
        assert_eq!(f.job(id).unwrap().unwrap().state(), JobState::Succeeded);
        assert_eq!(
            f.output(id).unwrap().unwrap(),
            format!("done {id}").as_bytes()
        );
    }
}

fn an_async_handler_that_panics_fails_its_attempt_and_the_pool_keeps_working(kind: Kind) {
    let rt = runtime();
    let f = kind.open();
    let boom = f.enqueue(NewJob::new(Q, "boom").max_attempts(1)).unwrap();
    f.enqueue_n(3);
    let p = pool(&f, "w")
        .concurrency(2)
        .start_async(rt.handle().clone(), |ctx| async move {
            if ctx.payload() == b"boom" {
                panic!("decoder exploded");
            }
            Ok(Vec::new())
        })
        .unwrap();
    wait_until("every job to end", || {
        let s = p.stats();
        s.succeeded + s.panicked == 4
    });
    assert_eq!((p.stats().panicked, p.stats().succeeded), (1, 3));
    let job = f.job(boom).unwrap().unwrap();
    assert_eq!(job.state(), JobState::Dead);
    assert!(job.last_error().unwrap().contains("decoder exploded"));
}

fn a_cancelled_job_wakes_its_async_handler_from_a_long_sleep(kind: Kind) {
    let rt = runtime();
    let f = kind.open();
    let id = f.enqueue_n(1)[0];
    let (tx, rx) = crossbeam_channel::bounded(1);
    let p = pool(&f, "w")
        .start_async(rt.handle().clone(), move |ctx| {
            let tx = tx.clone();
            async move {
                let slept = ctx.sleep_async(Duration::from_secs(3600)).await;
                let _ = tx.send(slept);
                slept?;
                Ok(Vec::new())
            }
        })
        .unwrap();
    wait_until("the job to run", || crate::started(&p, 1));
    f.cancel(id).unwrap();
    // the next heartbeat brings the cancel; the hour-long sleep ends with it
    let slept = rx.recv_timeout(Duration::from_secs(60)).unwrap();
    assert_eq!(slept, Err(Interrupted(Interruption::Cancelled)));
    wait_until("the attempt to end", || p.stats().in_flight == 0);
    assert_eq!(f.job(id).unwrap().unwrap().state(), JobState::Cancelled);
}

/// Counts its wake-ups, so a test can poll a future by hand and see who woke it.
#[derive(Default)]
struct CountingWaker(AtomicUsize);

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn an_async_wait_for_work_is_woken_by_the_enqueue_not_by_its_timeout(kind: Kind) {
    let rt = runtime();
    let _in_runtime = rt.enter(); // the wait's timeout needs the runtime's timer
    let f = kind.open();
    let seen = f.work_generation(Q);
    let mut wait = Box::pin(f.wait_for_work_async(Q, seen, Duration::from_secs(3600)));
    let counter = Arc::new(CountingWaker::default());
    let waker = Waker::from(counter.clone());
    let mut cx = Context::from_waker(&waker);
    assert!(wait.as_mut().poll(&mut cx).is_pending(), "no work yet");
    assert_eq!(counter.0.load(Ordering::SeqCst), 0);
    f.enqueue_n(1);
    assert_eq!(
        counter.0.load(Ordering::SeqCst),
        1,
        "the commit woke the waiter"
    );
    match wait.as_mut().poll(&mut cx) {
        Poll::Ready(generation) => assert_ne!(generation, seen),
        Poll::Pending => panic!("woken but not ready"),
    }
}
