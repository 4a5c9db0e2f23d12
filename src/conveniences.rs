//! The everyday calls as each store's own methods, in the forms an application writes:
//! a lease's terms as a plain [`Duration`](std::time::Duration) (or [`LeaseTerms`](crate::LeaseTerms)), a batch
//! as any iterator of jobs.
//!
//! [`JobStore`](crate::JobStore) takes [`LeaseTerms`](crate::LeaseTerms) and a `Vec`, because a trait used as
//! `&dyn JobStore` (the pool, the reaper, the page, the tool) cannot have generic methods.
//! A concrete store's own methods can: `store.claim(queue, worker, Duration::from_secs(60))`
//! reads as it did before the calls moved into the trait, and an inherent method is chosen
//! before a trait's of the same name, so both forms compile wherever the trait is in scope.

/// Defines the conveniences on a store type that implements [`crate::JobStore`].
macro_rules! conveniences {
    ($store:ty) => {
        /// The everyday calls in the forms an application writes (see
        /// [`JobStore`](crate::JobStore) for each one's meaning).
        impl $store {
            /// [`JobStore::claim`](crate::JobStore::claim), the terms a
            /// [`Duration`](std::time::Duration) or [`LeaseTerms`](crate::LeaseTerms).
            pub fn claim(
                &self,
                queue: &str,
                worker: &str,
                terms: impl Into<crate::lease::LeaseTerms>,
            ) -> crate::error::Result<Option<crate::lease::Lease>> {
                crate::job_store::JobStore::claim(self, queue, worker, terms.into())
            }

            /// [`JobStore::claim_job`](crate::JobStore::claim_job), the terms a
            /// [`Duration`](std::time::Duration) or [`LeaseTerms`](crate::LeaseTerms).
            pub fn claim_job(
                &self,
                job: crate::ids::JobId,
                worker: &str,
                terms: impl Into<crate::lease::LeaseTerms>,
            ) -> crate::error::Result<Option<crate::lease::Lease>> {
                crate::job_store::JobStore::claim_job(self, job, worker, terms.into())
            }

            /// [`JobStore::claim_batch`](crate::JobStore::claim_batch), the terms a
            /// [`Duration`](std::time::Duration) or [`LeaseTerms`](crate::LeaseTerms).
            pub fn claim_batch(
                &self,
                queue: &str,
                worker: &str,
                terms: impl Into<crate::lease::LeaseTerms>,
                n: usize,
            ) -> crate::error::Result<Vec<crate::lease::Lease>> {
                crate::job_store::JobStore::claim_batch(self, queue, worker, terms.into(), n)
            }

            /// [`JobStore::complete_and_claim`](crate::JobStore::complete_and_claim), the
            /// terms a [`Duration`](std::time::Duration) or
            /// [`LeaseTerms`](crate::LeaseTerms).
            pub fn complete_and_claim(
                &self,
                lease: &crate::lease::Lease,
                output: &[u8],
                terms: impl Into<crate::lease::LeaseTerms>,
            ) -> crate::error::Result<Option<crate::lease::Lease>> {
                crate::job_store::JobStore::complete_and_claim(self, lease, output, terms.into())
            }

            /// [`JobStore::enqueue_batch`](crate::JobStore::enqueue_batch) of any iterator
            /// of jobs: all of them in one transaction, or on an error none.
            pub fn enqueue_batch(
                &self,
                jobs: impl IntoIterator<Item = crate::new_job::NewJob>,
            ) -> crate::error::Result<Vec<crate::ids::JobId>> {
                crate::job_store::JobStore::enqueue_batch(self, jobs.into_iter().collect())
            }
        }
    };
}
pub(crate) use conveniences;
