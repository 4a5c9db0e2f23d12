//! The redb [`Store`] as a worker pool's and a reaper's store (see [`crate::backend`]).

use crate::backend::{LeaseBackend, ReaperLooks, RoundResults, Step};
use crate::error::Result;
use crate::ids::StoreTime;
use crate::lease::Lease;
use crate::protocol::{Claim, Completion};

use super::store::Store;

crate::engine::engine!(Store, super::app_transaction::RedbWrites);

impl LeaseBackend for Store {
    fn write_step(&self, mut step: Step) -> Result<Box<dyn std::any::Any + Send>> {
        self.write(move |tx| step(tx))
    }

    fn policy(&self) -> &crate::protocol::Policy {
        &self.inner.policy.rules
    }

    fn clock(&self) -> StoreTime {
        Store::now(self)
    }

    fn notifier(&self) -> &crate::notify::Notifier {
        &self.inner.notifier
    }

    fn hub(&self) -> &crate::events::Hub {
        &self.inner.hub
    }

    fn claimed(&self, leases: &[Lease]) {
        if let Some(table) = self.inner.started.get() {
            table.claimed(leases.iter().map(|l| (l.job, l.attempt)));
        }
    }

    fn started(&self, lease: &Lease) {
        if let Some(table) = self.inner.started.get() {
            table.started(lease.job, lease.attempt);
        }
    }

    fn returned(&self, lease: &Lease) {
        if let Some(table) = self.inner.started.get() {
            table.returned(lease.job, lease.attempt);
        }
    }

    fn ended(&self, job: crate::ids::JobId, attempt: crate::ids::Attempt) {
        if let Some(table) = self.inner.started.get() {
            table.ended(job, attempt);
        }
    }

    fn another_process_writes(&self) -> bool {
        Store::another_process_writes(self)
    }

    fn hears_schedule_changes(&self) -> bool {
        // (on a shared file, by a datagram from the process that changed them: lost only
        // where that process found this one's socket full)
        true
    }

    fn schedules_changed(&self) {
        self.inner.notifier.notify_schedules();
        if let Some(n) = &self.inner.neighbours {
            n.schedules_changed();
        }
    }

    fn next_due(&self, queue: &str) -> Result<Option<StoreTime>> {
        Store::next_due(self, queue)
    }

    fn marks_due(&self, queues: &mut dyn Iterator<Item = &str>) -> Vec<String> {
        self.inner.served.due(queues, self.now())
    }

    fn complete_all_then_claim(
        &self,
        done: Vec<Completion>,
        claim: Option<Claim<'_>>,
    ) -> RoundResults {
        Store::complete_all_then_claim(self, done, claim)
    }

    fn flush(&self) -> Result<()> {
        Store::flush(self)
    }

    fn reaper_looks(&self) -> Result<ReaperLooks> {
        use super::snapshots::Snapshots;
        let now = self.now();
        let (leases_expired, past_expiry) = self.reading("the expiry indexes", |read| {
            Ok((
                super::reading::any_indexed_expiry_by(read, now)?,
                super::reading::any_expiring_by(read, now)?,
            ))
        })?;
        Ok(ReaperLooks {
            now,
            leases_expired,
            past_expiry,
        })
    }

    fn note_reaper_pass(&self, pass: &crate::report::ReaperPass) -> Result<()> {
        let pass = pass.clone();
        self.write(move |tx| super::writing::note_reaper_pass(tx, &pass))
    }
}
