//! The lease protocol on PostgreSQL (the `postgres` feature): for users who outgrow one
//! machine, the same rules on a database their worker machines share.
//!
//! The protocol is the crate's one (`src/protocol/`, deciding by `src/rules/`), run
//! over this engine's records (`records.rs`: a job a row, locked for the rest of the
//! transaction when loaded for writing), so the two engines cannot drift apart. Where one
//! statement for many rows pays, it is taken instead (`fast.rs`): a claim (`FOR UPDATE SKIP
//! LOCKED` in a CTE limited to the batch), renewals of a batch, completions of a batch (each
//! fenced by `id AND attempt AND state = 'running'`), plain enqueues; each names the step it
//! mirrors and leaves to it what its statement cannot decide. Every time is read and
//! compared on the database's clock (`clock_timestamp()`, not `now()`, which is the
//! transaction's start); the reaper works in bounded batches and re-checks each lease under
//! its row lock.
//!
//! A `PgStore` is a cheap handle, shared by threads like [`crate::Store`]: it keeps a few
//! connections of the synchronous `postgres` client and lends one to each operation.

mod backend;
mod clock_estimate;
mod connection;
mod error;
mod fast;
mod listen;
mod named;
mod names;
mod permits;
mod read;
mod records;
mod requests;
mod rows;
mod schema;
mod schema_check;
mod store;
mod timeline;
mod transaction;
mod vacuum;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use parking_lot::Mutex;
use postgres::Statement;

use connection::Connection;

/// The PostgreSQL client this build uses: [`PgTransaction::sql`] hands out its types, so
/// name them through this re-export rather than a separately chosen version.
pub use ::postgres as client;
pub use error::PgError;
pub use schema::VERSION as SCHEMA_VERSION;
pub use store::{PgTransaction, SqlWrites};

use crate::error::{Error, Result};

/// The dead row versions past which a reaper pass vacuums a table (plus a fifth of its live
/// rows); see [`PgStoreBuilder::vacuum_when_dead`].
const DEFAULT_VACUUM_WHEN_DEAD: u64 = 20_000;

/// The client's keepalive idle time when nothing sets it (2 hours), and ours.
const DEFAULT_KEEPALIVES_IDLE: Duration = Duration::from_secs(2 * 60 * 60);
const KEEPALIVES_IDLE: Duration = Duration::from_secs(10);
/// How long sent data may go unacknowledged before the connection is given up.
const TCP_USER_TIMEOUT: Duration = Duration::from_secs(15);

/// How long opening a connection may take unless the URL says otherwise.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How a [`PgStore`] connects and what it applies; see [`PgStore::builder`].
#[derive(Clone, Debug)]
pub struct PgStoreBuilder {
    url: String,
    schema: String,
    settings: Settings,
    simulated_clock: Option<crate::clock::ManualClock>,
}

/// What a store applies, as its builder set it: the protocol's rules and the connections'.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub(crate) policy: crate::protocol::Policy,
    pub(crate) vacuum_when_dead: Option<u64>,
    pub(crate) listen: bool,
    /// Whether opening makes the schema's tables when there are none.
    create: bool,
    connections: usize,
    statement_timeout: Duration,
    pub(crate) side_by_side_from: usize,
    /// Whether the one-statement shortcuts (`fast.rs`) are taken (always, but in the suites
    /// that hold them to the protocol's own steps).
    pub(crate) shortcuts: bool,
}

impl PgStoreBuilder {
    crate::config::policy_setters!(
        PgStoreBuilder,
        settings.policy,
        "so the table stays the size of the live work and autovacuum has dead rows of bounded count to clean."
    );

    /// For the conformance tests: with `false`, every operation runs the protocol's own
    /// steps ([`crate::protocol`] over this engine's records) and none of the one-statement
    /// shortcuts, so that the suites hold the shortcuts to the same answers.
    #[cfg(feature = "__internal")]
    #[doc(hidden)]
    pub fn shortcuts(mut self, on: bool) -> PgStoreBuilder {
        self.settings.shortcuts = on;
        self
    }

    /// For the conformance tests: every transaction reads store time from `clock` (as
    /// microseconds since the Unix epoch) instead of the database's clock.
    #[cfg(feature = "__internal")]
    #[doc(hidden)]
    pub fn simulated_clock(self, clock: crate::clock::ManualClock) -> PgStoreBuilder {
        self.with_simulated_clock(clock)
    }

    /// The same, for `leasehold::testing`'s `TestPgStore`, which needs it without the
    /// internal feature.
    #[cfg(any(feature = "__internal", feature = "testing"))]
    pub(crate) fn with_simulated_clock(
        mut self,
        clock: crate::clock::ManualClock,
    ) -> PgStoreBuilder {
        self.simulated_clock = Some(clock);
        self
    }

    /// The longest one statement may run (waiting for a row lock included) before the
    /// server cancels it: a stuck statement fails, typed, rather than hold a worker forever.
    /// Applied to every connection the store opens, so also to the application's SQL in
    /// [`PgStore::complete_with`]. Default: 30 s.
    pub fn statement_timeout(mut self, timeout: Duration) -> PgStoreBuilder {
        self.settings.statement_timeout = timeout;
        self
    }

    /// The PostgreSQL schema holding leasehold's tables (created if missing). Default:
    /// `leasehold`. Its tables are leasehold's alone; the application's own live elsewhere.
    pub fn schema(mut self, schema: impl Into<String>) -> PgStoreBuilder {
        self.schema = schema.into();
        self
    }

    /// Each reaper pass ([`JobStore::reap`](crate::JobStore::reap)) vacuums the store's job or history table itself,
    /// in the background, once it holds more than `dead` dead row versions plus a fifth of
    /// its live rows (2 s apart at least): where autovacuum is off (as on some servers)
    /// or behind a churning queue, dead versions otherwise grow without bound and claims
    /// slow down as they walk past them. `None` leaves vacuuming to autovacuum alone.
    /// Default: 20,000.
    pub fn vacuum_when_dead(mut self, dead: Option<u64>) -> PgStoreBuilder {
        self.settings.vacuum_when_dead = dead;
        self
    }

    /// Whether the handle keeps a `LISTEN` connection to hear other machines' enqueues
    /// (once a pool waits for work). Turn it off behind a transaction-mode connection
    /// pooler (PgBouncer, say), where `LISTEN` is accepted but hears nothing: idle pools
    /// then find work by their jittered polling alone (every 250–500 ms). Default: on.
    pub fn listen(mut self, listen: bool) -> PgStoreBuilder {
        self.settings.listen = listen;
        self
    }

    /// Whether opening makes leasehold's tables in a schema that has none (and the schema, if
    /// missing). Off, such a schema is refused with [`PgError::NoStore`] and nothing is made:
    /// for readers and tools, where a mistyped schema name must not become a new, empty
    /// store. Default: on.
    pub fn create_if_missing(mut self, create: bool) -> PgStoreBuilder {
        self.settings.create = create;
        self
    }

    /// The size from which a worker pool's commit round (its completions, and the claim
    /// that refills its workers) runs its two halves at once, in two transactions on two
    /// connections, rather than one after the other in one: both halves must hold at least
    /// this many jobs. Default: 64. Below it a round is small, and one commit serves it
    /// better than two. `usize::MAX`: never.
    pub fn side_by_side_from(mut self, n: usize) -> PgStoreBuilder {
        self.settings.side_by_side_from = n.max(1);
        self
    }

    /// The most connections the handle (and its clones) holds at once for its operations,
    /// and keeps open between them. Default: 16. An operation that finds them all in use
    /// waits for one, as long as a statement may run
    /// ([`statement_timeout`](PgStoreBuilder::statement_timeout)), then fails with
    /// [`PgError::TooManyConnections`], having done nothing. Besides these the handle holds
    /// its `LISTEN` connection (once a pool waits for work) and a vacuum's while one runs.
    /// A worker pool of any size works within 1 (its big rounds then run in one
    /// transaction, not two at once); see docs/postgres.md, "Connections", for what to give
    /// one. An operation called inside another's closure (the store called from
    /// [`PgStore::transaction`]) needs one more; where the calling thread holds them all so,
    /// it is refused at once ([`PgError::TooManyConnections`], saying so) rather than left
    /// to wait for itself.
    pub fn connections(mut self, n: usize) -> PgStoreBuilder {
        self.settings.connections = n.max(1);
        self
    }

    /// Connects, creates the schema if it is missing, and checks the one found.
    pub fn open(self) -> Result<PgStore> {
        self.settings.policy.check()?;
        let mut config: postgres::Config = self
            .url
            .parse()
            .map_err(|e: postgres::Error| PgError::BadUrl(e.to_string()))?;
        // An unreachable server fails a connection attempt after a while, not after TCP's
        // own minutes (a URL's connect_timeout is kept).
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        // A connection to a database that went silent (a machine cut off, a server gone
        // without a word) fails in about half a minute rather than TCP's own quarter hour:
        // keepalives after 10 s idle, and sent data unacknowledged for 15 s ends it (unless
        // the URL says otherwise). A live server acknowledges at once however long a
        // statement runs, so this never cuts a slow statement short.
        if config.get_keepalives_idle() == DEFAULT_KEEPALIVES_IDLE {
            config.keepalives_idle(KEEPALIVES_IDLE);
        }
        if config.get_keepalives_interval().is_none() {
            config.keepalives_interval(Duration::from_secs(2));
        }
        if config.get_keepalives_retries().is_none() {
            config.keepalives_retries(3);
        }
        if config.get_tcp_user_timeout().is_none() {
            config.tcp_user_timeout(TCP_USER_TIMEOUT);
        }
        let schema = names::Names::new(&self.schema, self.simulated_clock.is_some())?;
        let permits = permits::Permits::new(self.settings.connections);
        let store = PgStore {
            inner: Arc::new(Inner {
                config,
                names: schema,
                settings: self.settings,
                simulated_clock: self.simulated_clock,
                idle: Mutex::new(Vec::new()),
                permits,
                notifier: Arc::new(crate::notify::Notifier::default()),
                hub: Default::default(),
                listener: std::sync::OnceLock::new(),
                requests: crossbeam_channel::bounded(1),
                requests_heard: std::sync::atomic::AtomicBool::new(false),
                // Set from the database's clock below, before anyone reads it.
                clock: clock_estimate::ClockEstimate::new(crate::ids::StoreTime::ZERO),
                statements_epoch: std::sync::atomic::AtomicU64::new(0),
                vacuum: Mutex::new(vacuum::Vacuum::Never),
                dead_rows: Mutex::new(None),
                vacuum_thread: Mutex::new(None),
                upgraded_from: std::sync::OnceLock::new(),
                served: crate::queue::ServedMarks::default(),
                timelines: Default::default(),
            }),
        };
        let create = store.inner.settings.create;
        let upgraded = store.with_connection(|conn| {
            schema::prepare(&mut conn.client, &store.inner.names, create)
        })?;
        store.inner.timelines.ready();
        if let Some(older) = upgraded {
            let _ = store.inner.upgraded_from.set(older);
        }
        let now = crate::job_store::ReadJobs::now(&store)?;
        store.inner.clock.read(now);
        Ok(store)
    }
}

/// A job store on PostgreSQL: the lease protocol of [`crate::Store`] on a database that
/// worker machines share. Clones share the connections.
#[derive(Clone)]
pub struct PgStore {
    inner: Arc<Inner>,
}

struct Inner {
    config: postgres::Config,
    names: names::Names,
    settings: Settings,
    simulated_clock: Option<crate::clock::ManualClock>,
    idle: Mutex<Vec<Connection>>,
    /// How many connections are lent to operations now, at most `settings.connections`.
    permits: permits::Permits,
    /// Wakes this process's pools when a commit, here or (through the listener) on another
    /// machine, gives a queue work.
    notifier: Arc<crate::notify::Notifier>,
    /// The subscribers to this handle's events.
    hub: crate::events::Hub,
    /// The `LISTEN` connection's thread, started when a pool first waits for work (`None`
    /// if it could not be started: idle pools then only poll).
    listener: std::sync::OnceLock<Option<listen::Listener>>,
    /// Told by the listener that a request was made in SQL; a reaper of this handle waits
    /// on it (`requests.rs`).
    requests: (
        crossbeam_channel::Sender<()>,
        crossbeam_channel::Receiver<()>,
    ),
    /// Whether a reaper of this handle waits on `requests`.
    requests_heard: std::sync::atomic::AtomicBool,
    /// The database's clock at the last reading, and the local time since: what a pool's
    /// threads read as store time between readings, and while the database is unreachable.
    clock: clock_estimate::ClockEstimate,
    /// Moves when the server said a prepared statement no longer fits its table (a column
    /// altered): each connection drops the statements it prepared before, once.
    statements_epoch: std::sync::atomic::AtomicU64,
    /// Where this handle's vacuum stands (one at a time).
    vacuum: Mutex<vacuum::Vacuum>,
    /// The tables' dead row versions (name, live, dead) as the reaper's pass read them
    /// when it began, for its vacuum at its end (`None`: read them then).
    dead_rows: Mutex<Option<vacuum::DeadRows>>,
    /// The thread of the last vacuum, joined before the next one starts and when the handle
    /// closes.
    vacuum_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// The schema version opening upgraded the store from (see [`PgStore::upgraded_from`]).
    upgraded_from: std::sync::OnceLock<u32>,
    /// When this handle last marked each queue served (see [`crate::queue`]).
    served: crate::queue::ServedMarks,
    /// The servers' timelines its connections found (see `timeline.rs`).
    timelines: timeline::Timelines,
}

impl Drop for Inner {
    fn drop(&mut self) {
        // The listener sleeps until a notification comes: one sent on the connection this
        // handle used last wakes it to stop. (One try: on a server gone silent it fails in
        // the connection's TCP timeout, and the listener then ends by itself a little later.)
        if let Some(Some(listener)) = self.listener.take() {
            let idle = self.idle.get_mut();
            let channel = &self.names.channel;
            listener.stop(|| {
                (idle.last_mut())
                    .is_some_and(|conn| listen::look_again(&mut conn.client, channel).is_ok())
            });
        }
        // Unless this is the vacuum thread itself, holding the last handle for a moment (it
        // returns right after).
        if let Some(thread) = self.vacuum_thread.get_mut().take()
            && thread.thread().id() != std::thread::current().id()
        {
            let _ = thread.join();
        }
    }
}

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("schema", &self.inner.names.schema)
            .finish_non_exhaustive()
    }
}

impl PgStore {
    /// A store at `url` (`postgres://user@host:port/database`, or the key-value form) with
    /// the default settings.
    pub fn builder(url: impl Into<String>) -> PgStoreBuilder {
        PgStoreBuilder {
            url: url.into(),
            schema: "leasehold".to_owned(),
            settings: Settings {
                policy: crate::protocol::Policy::default(),
                vacuum_when_dead: Some(DEFAULT_VACUUM_WHEN_DEAD),
                listen: true,
                create: true,
                connections: 16,
                statement_timeout: Duration::from_secs(30),
                side_by_side_from: 64,
                shortcuts: true,
            },
            simulated_clock: None,
        }
    }

    /// [`PgStore::builder`] with the defaults, opened.
    pub fn open(url: impl Into<String>) -> Result<PgStore> {
        PgStore::builder(url).open()
    }

    /// Runs `f` on a connection lent from the handle's idle ones (a new one if none is idle).
    /// A connection that failed is dropped rather than lent again. With every connection the
    /// handle may hold lent ([`PgStoreBuilder::connections`]), waits for one to come back,
    /// as long as a statement may run: [`PgError::TooManyConnections`] if none did.
    fn with_connection<T>(&self, f: impl FnOnce(&mut Connection) -> Result<T>) -> Result<T> {
        let wait = self.inner.settings.statement_timeout;
        let _permit = (self.inner.permits.take(wait))
            .map_err(|busy| PgError::TooManyConnections(busy.to_string()))?;
        let idle = self.inner.idle.lock().pop();
        let epoch = self.inner.statements_epoch.load(Ordering::SeqCst);
        let mut conn = match idle {
            Some(conn) if !conn.client.is_closed() => conn,
            _ => self.connect(epoch)?,
        };
        // (a connection refused here is dropped, not lent again)
        self.inner.timelines.vet(&mut conn, &self.inner.names)?;
        if conn.epoch != epoch {
            // Dropping a statement closes it on the server; the next use prepares it anew.
            conn.prepared.clear();
            conn.epoch = epoch;
        }
        let result = f(&mut conn);
        // A connection that failed is not lent again, even where the client has not yet seen
        // it close: a backend ended by an operator or a restart resets the socket, and the
        // next operation on it would fail for nothing. (A refusal is no failure of it; nor is
        // a deadlock or a serialization failure the server answered, after which the
        // connection is as good as before: dropping it made a retry open another beside the
        // one still closing.)
        let failed = matches!(&result, Err(e) if !e.is_refusal() && !e.is_transient());
        if !failed && !conn.client.is_closed() {
            let mut idle = self.inner.idle.lock();
            if idle.len() < self.inner.settings.connections {
                idle.push(conn);
            }
        }
        result
    }

    /// A new connection with the store's session settings ([`Connection::open`]).
    fn connect(&self, epoch: u64) -> Result<Connection> {
        let timeout = self.inner.settings.statement_timeout;
        Connection::open(&self.inner.config, timeout, epoch)
    }

    /// Runs `f` in a transaction, retried (from the start) when PostgreSQL aborts it for a
    /// serialization failure or a deadlock, or a statement prepared before a column was
    /// altered; commits what `f` returns `Ok` for. A connection lost or ended while
    /// committing leaves the outcome unknown: [`PgError::OutcomeUnknown`].
    fn in_transaction<T>(
        &self,
        mut f: impl FnMut(&mut postgres::Transaction<'_>, &mut Prepared<'_>) -> Result<T>,
    ) -> Result<T> {
        self.retried(|| self.transaction_once(&mut f))
    }

    /// Runs `once` again (from the start) where PostgreSQL aborted it for a serialization
    /// failure or a deadlock, or a statement prepared before a column was altered.
    fn retried<T>(&self, mut once: impl FnMut() -> Result<T>) -> Result<T> {
        const ATTEMPTS: usize = 5;
        let mut tries = 0;
        loop {
            tries += 1;
            match once() {
                Err(Error::Postgres(e)) if e.is_stale_statement() && tries < ATTEMPTS => {
                    self.inner.statements_epoch.fetch_add(1, Ordering::SeqCst);
                }
                Err(Error::Postgres(e)) if e.is_transient() && tries < ATTEMPTS => {
                    // Two transactions that deadlocked and run again at once may meet again:
                    // a few milliseconds apart, at random, they seldom do.
                    let most = 1u64 << tries.min(6);
                    let wait = crate::random::random_u64() % (most * 1000);
                    std::thread::sleep(Duration::from_micros(wait));
                }
                Err(Error::Postgres(PgError::SchemaAltered {
                    schema: None,
                    detail,
                })) => {
                    return Err(PgError::SchemaAltered {
                        schema: Some(self.inner.names.schema.clone()),
                        detail,
                    }
                    .into());
                }
                other => return other,
            }
        }
    }

    /// [`PgStore::in_transaction`] with the transaction as the protocol's records; once it
    /// has committed, this process's waiters of the queues it readied are woken (other
    /// processes', by the `NOTIFY` it sent).
    fn records<T>(
        &self,
        mut f: impl FnMut(&mut transaction::PgRecords<'_, '_, '_>) -> Result<T>,
    ) -> Result<T> {
        let settings = self.settings();
        let mut readied = std::collections::BTreeSet::new();
        let mut events = Vec::new();
        let answer = self.in_transaction(|tx, p| {
            let mut r = transaction::PgRecords::new(tx, p, settings);
            r.events = crate::events::Pending::of(&self.inner.hub);
            let answer = f(&mut r);
            let answer = r.counted(answer);
            readied = r.readied_queues();
            events = r.events.take();
            answer
        })?;
        self.readied(&readied);
        self.inner.hub.publish(events);
        Ok(answer)
    }

    /// One transaction, not retried; [`PgStore::transaction`] retries through it.
    fn transaction_once<T>(
        &self,
        f: impl FnMut(&mut postgres::Transaction<'_>, &mut Prepared<'_>) -> Result<T>,
    ) -> Result<T> {
        self.with_connection(|conn| {
            let Connection {
                client,
                prepared,
                warnings,
                ..
            } = conn;
            let mut tx = client.transaction().map_err(PgError::at_begin)?;
            self.simulate_time(&mut tx)?;
            let mut f = f;
            let mut p = Prepared {
                cache: prepared,
                names: &self.inner.names,
                ended: false,
            };
            let value = f(&mut tx, &mut p);
            let ended = p.ended;
            let value = finish(tx, warnings, value)?;
            if ended {
                self.ended();
            }
            Ok(value)
        })
    }

    /// Runs `f`, one statement, on a connection outside any transaction (retried as
    /// [`PgStore::in_transaction`] retries): one round trip where a transaction takes three.
    /// A statement is atomic on its own, and a write commits with it. What an idle pool and
    /// an idle reaper do now and then is done this way, so that they wake their threads as
    /// seldom as they can.
    fn alone<T>(
        &self,
        mut f: impl FnMut(&mut postgres::Client, &mut Prepared<'_>) -> Result<T>,
    ) -> Result<T> {
        self.retried(|| {
            self.with_connection(|conn| {
                if let Some(clock) = &self.inner.simulated_clock {
                    // (for this session: each transaction sets its own time all the same)
                    let us = (simulated_time(clock).0 / 1000).to_string();
                    (conn.client)
                        .execute("SELECT set_config('leasehold.now_us', $1, false)", &[&us])
                        .map_err(PgError::from)?;
                }
                f(
                    &mut conn.client,
                    &mut Prepared {
                        cache: &mut conn.prepared,
                        names: &self.inner.names,
                        ended: false,
                    },
                )
            })
        })
    }

    /// Sets the transaction's store time from the simulated clock, if there is one.
    fn simulate_time(&self, tx: &mut postgres::Transaction<'_>) -> Result<()> {
        if let Some(clock) = &self.inner.simulated_clock {
            let us = (simulated_time(clock).0 / 1000).to_string();
            tx.execute("SELECT set_config('leasehold.now_us', $1, true)", &[&us])
                .map_err(PgError::from)?;
        }
        Ok(())
    }

    fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// The schema holding leasehold's tables.
    pub fn schema(&self) -> &str {
        &self.inner.names.schema
    }
}

/// Store time on a simulated clock: its reading, in the microseconds PostgreSQL keeps.
fn simulated_time(clock: &crate::clock::ManualClock) -> crate::ids::StoreTime {
    let us = u64::try_from(clock.elapsed().as_micros()).unwrap_or(u64::MAX);
    crate::ids::StoreTime(us.saturating_mul(1000))
}

/// Ends a transaction by what its work returned: commits a success (a commit the server
/// only warned about is of unknown outcome: [`connection::commit`]), and also a refusal by
/// the fence (which wrote nothing but the refusal's counter, and stands whatever becomes of
/// it); rolls back anything else.
fn finish<T>(
    tx: postgres::Transaction<'_>,
    warnings: &connection::Warnings,
    value: Result<T>,
) -> Result<T> {
    match value {
        Ok(v) => {
            connection::commit(tx, warnings)?;
            Ok(v)
        }
        // (a refusal keeps its counter: `PgRecords::counted`)
        Err(e) if e.is_lease_lost() => {
            tx.commit().map_err(PgError::at_commit)?;
            Err(e)
        }
        Err(e) => Err(e),
    }
}

/// The statements prepared on one connection, by the template they were made from.
struct Prepared<'c> {
    cache: &'c mut std::collections::HashMap<&'static str, Statement>,
    names: &'c names::Names,
    /// Whether the transaction kept an ending: this process's followers are woken once it
    /// commits.
    ended: bool,
}

impl Prepared<'_> {
    /// The statement of `template` (`{s}` standing for the schema), prepared once per
    /// connection.
    fn get(
        &mut self,
        client: &mut impl postgres::GenericClient,
        template: &'static str,
    ) -> Result<Statement> {
        if let Some(st) = self.cache.get(template) {
            return Ok(st.clone());
        }
        let st = client
            .prepare(&self.names.sql(template))
            .map_err(PgError::from)?;
        self.cache.insert(template, st.clone());
        Ok(st)
    }
}
