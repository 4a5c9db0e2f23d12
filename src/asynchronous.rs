//! Async applications (the `tokio` feature): a pool whose handler is an `async fn`, and async
//! waits for work and for a handler's interruption.
//!
//! Store operations stay blocking. A commit waits for a disk flush and a claim for the
//! writer's seat; run on a runtime's worker threads they would stall every task behind them.
//! So the pool keeps its own threads (one per unit of concurrency, plus its dispatcher and
//! heartbeat), which claim, renew and commit as they always do, and only the handler's future
//! runs on the runtime: each pool thread hands its job's future to the runtime and waits for
//! it. The waits below are plain futures over the store's own wake-ups (no polling, no
//! thread), bounded by tokio's timer.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::runtime::Handle;

use crate::error::Result;
use crate::pool::{
    Handler, Interrupted, Interruption, JobContext, JobError, Output, PoolBuilder, WorkerPool,
};

impl<S: crate::engine::Engine> PoolBuilder<S> {
    /// Starts the pool with an async handler, whose futures run on the tokio runtime of
    /// `runtime` (pass `Handle::current()` from inside it). Everything else is as
    /// [`PoolBuilder::start`]: the pool's threads claim, renew and commit; each waits for its
    /// job's future. A handler that panics fails its attempt as a blocking one does; a runtime
    /// shut down under a running handler fails the attempt with a message saying so.
    pub fn start_async<H, F, O>(self, runtime: Handle, handler: H) -> Result<WorkerPool>
    where
        H: Fn(JobContext) -> F + Send + Sync + 'static,
        F: Future<Output = std::result::Result<O, JobError>> + Send + 'static,
        O: Into<Output<S::Writes>> + Send + 'static,
    {
        let handler: Handler = Arc::new(move |ctx: &JobContext| {
            let task = runtime.spawn(handler(ctx.clone()));
            match runtime.block_on(task) {
                Ok(result) => result.map(|o| crate::pool::any::<S>(o.into())),
                // The pool counts the panic and fails the attempt, as for a blocking handler.
                Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                Err(_) => Err(JobError::new(
                    "the async runtime shut down before the handler finished",
                )),
            }
        });
        self.start_handler(handler)
    }
}

impl JobContext {
    /// Resolves once the handler is asked to stop (its lease lost, the job cancelled or
    /// stalled, the pool shutting down), with the reason. Race it against the work to stop
    /// at once rather than at the next [`JobContext::checkpoint`].
    pub fn interrupted(&self) -> impl Future<Output = Interruption> + Send + '_ {
        std::future::poll_fn(|cx| self.attempt_state().poll_interrupted(cx))
    }

    /// [`JobContext::sleep`] for async handlers: waits for up to `d` without holding a
    /// thread, returning early with `Err` if the job is interrupted meanwhile.
    pub async fn sleep_async(&self, d: Duration) -> std::result::Result<(), Interrupted> {
        match tokio::time::timeout(d, self.interrupted()).await {
            Ok(why) => Err(Interrupted(why)),
            Err(_elapsed) => Ok(()),
        }
    }
}
