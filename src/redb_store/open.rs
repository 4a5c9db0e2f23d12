//! Opening a store file: telling a leasehold store from a foreign, damaged, newer or locked
//! file, creating a new one, and binding the store clock to the file's timeline.
//!
//! Every refusal leaves the file exactly as it was: the checks that can be made by reading
//! are made before anything is written.

use std::io::Read;
use std::path::Path;

use redb::{
    Database, DatabaseError, ReadTransaction, ReadableDatabase, ReadableTable, StorageBackend,
    StorageError, TableHandle,
};

use crate::clock::{Anchor, StoreClock};
use crate::codec;
use crate::error::{Error, OpenError, Result};
use crate::ids::StoreTime;
use crate::redb_store::create::{self, REDB_MAGIC};
use crate::redb_store::schema::{self, MARKER, SCHEMA_VERSION, meta_key};
use crate::redb_store::writing::read_u64;

/// Options for the redb open.
pub(crate) struct EngineOptions {
    pub cache_size: usize,
    pub verify: bool,
    pub mode: redb::ConcurrencyMode,
}

/// Opens (or creates) the redb file, or the database in `backend`, mapping each failure to its
/// own [`OpenError`].
pub(crate) fn open_database(
    path: &Path,
    backend: Option<Box<dyn StorageBackend>>,
    opts: &EngineOptions,
) -> Result<Database> {
    let mut builder = redb::Builder::new();
    builder.set_cache_size(opts.cache_size);
    builder.set_check_integrity_on_open(opts.verify);
    builder.set_concurrency_mode(opts.mode);
    // redb documents that a plain open of an altered file may panic; a damaged file must be
    // an error, never a crash of the application that embeds us.
    let opened = match backend {
        Some(backend) => {
            let len = backend.len().map_err(|e| io_error(path, e))?;
            if len == 0 || create::interrupted_in(backend.as_ref()) {
                create::create_in_backend(path, backend.as_ref(), &builder)?;
            } else {
                sniff_backend(path, backend.as_ref())?;
            }
            crate::redb_store::contain::quietly(|| builder.create_with_backend(Boxed(backend)))
        }
        None => {
            if sniff(path)? {
                // redb writes to a file it opens for writing (its header, at least) before
                // leasehold can look inside; a file that is refused must be left as it was.
                check_before_writing(path)?;
            } else {
                create::create_atomically(path, &builder)?;
            }
            crate::redb_store::contain::quietly(|| builder.create(path))
        }
    };
    match opened {
        Ok(Ok(db)) => Ok(db),
        Ok(Err(e)) => Err(match map_database_error(path, e) {
            // Held by processes that share it, and this open does not: say so, rather than
            // "another process" (there may be many, and joining them is the fix).
            OpenError::Locked { path, .. }
                if opts.mode != redb::ConcurrencyMode::MultiWriter && held_shared(&path) =>
            {
                OpenError::IncompatibleSharing { path }
            }
            other => other,
        }
        .into()),
        Err(_) => Err(unreadable(path).into()),
    }
}

/// Reads an existing file read-only and refuses it, writing nothing, if it is not a store this
/// build may open: another application's redb database, a newer schema, a damaged clock, a
/// truncated file. (An empty redb database becomes a store, as an empty file does.)
fn check_before_writing(path: &Path) -> Result<()> {
    let view = open_read_only(path)?;
    let checked = crate::redb_store::reading::contained("the store's meta table", || {
        let read = view.begin_read()?;
        if read.list_tables()?.next().is_none() {
            return Ok(());
        }
        inspect(&read, path).map(|_| ())
    });
    // A file whose pages cannot be read (cut short, say) is damaged, not a passing fault.
    checked.map_err(|e| match e {
        Error::Storage(e) => OpenError::Corrupt {
            path: path.to_owned(),
            detail: format!("its pages cannot be read: {e}"),
        }
        .into(),
        Error::Corrupt(detail) => OpenError::Corrupt {
            path: path.to_owned(),
            detail,
        }
        .into(),
        other => other,
    })
}

/// A boxed backend, so the builder can hold any backend the application gives it.
#[derive(Debug)]
struct Boxed(Box<dyn StorageBackend>);

impl StorageBackend for Boxed {
    fn len(&self) -> std::result::Result<u64, std::io::Error> {
        self.0.len()
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::result::Result<(), std::io::Error> {
        self.0.read(offset, out)
    }
    fn set_len(&self, len: u64) -> std::result::Result<(), std::io::Error> {
        self.0.set_len(len)
    }
    fn sync_data(&self) -> std::result::Result<(), std::io::Error> {
        self.0.sync_data()
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::result::Result<(), std::io::Error> {
        self.0.write(offset, data)
    }
    fn close(&self) -> std::result::Result<(), std::io::Error> {
        self.0.close()
    }
}

fn sniff_backend(path: &Path, backend: &dyn StorageBackend) -> Result<(), OpenError> {
    let len = backend.len().map_err(|source| io_error(path, source))?;
    check_magic(path, len, |head| backend.read(0, head).is_ok())
}

/// Refuses what cannot be a store before redb sees it: anything but a regular file (opening a
/// FIFO would block forever; a directory or a device is never a store) and a non-empty file
/// that does not start with redb's magic number. Returns whether the file holds data (`false`:
/// missing or empty, a store to be created).
fn sniff(path: &Path) -> Result<bool, OpenError> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(io_error(path, e)),
    };
    if !meta.is_file() {
        return Err(OpenError::NotAStore {
            path: path.to_owned(),
            detail: format!("not a regular file ({})", file_kind(&meta)),
        });
    }
    let mut file = std::fs::File::open(path).map_err(|e| io_error(path, e))?;
    let len = file.metadata().map_err(|e| io_error(path, e))?.len();
    check_magic(path, len, |head| file.read_exact(head).is_ok())?;
    Ok(len > 0)
}

fn file_kind(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let t = meta.file_type();
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() || t.is_char_device() {
        "a device"
    } else {
        "not a regular file"
    }
}

/// An empty file (or backend) is a store to be; anything else must start with redb's magic
/// number. `read_head` fills the buffer from offset 0.
fn check_magic(
    path: &Path,
    len: u64,
    read_head: impl FnOnce(&mut [u8]) -> bool,
) -> Result<(), OpenError> {
    if len == 0 {
        return Ok(());
    }
    let mut head = [0u8; REDB_MAGIC.len()];
    if len < head.len() as u64 || !read_head(&mut head) || head != REDB_MAGIC {
        return Err(OpenError::NotAStore {
            path: path.to_owned(),
            detail: "the file is not a redb database".into(),
        });
    }
    Ok(())
}

pub(crate) fn io_error(path: &Path, source: std::io::Error) -> OpenError {
    OpenError::Io {
        path: path.to_owned(),
        source,
    }
}

pub(crate) fn map_database_error(path: &Path, e: DatabaseError) -> OpenError {
    let path = path.to_owned();
    match e {
        DatabaseError::LockProtocolMismatch => OpenError::IncompatibleSharing { path },
        DatabaseError::DatabaseAlreadyOpen => {
            let pid = holder_pid(&path);
            OpenError::Locked { path, pid }
        }
        DatabaseError::UpgradeRequired(v) => OpenError::NotAStore {
            path,
            detail: format!("a redb database in the old file format {v}"),
        },
        DatabaseError::Storage(StorageError::Io(source)) => OpenError::Io { path, source },
        other => OpenError::Corrupt {
            path,
            detail: other.to_string(),
        },
    }
}

/// The pid the current writer recorded, read through a read-only handle (which a writer in
/// single-writer mode admits); `None` when that cannot be known.
fn holder_pid(path: &Path) -> Option<u32> {
    let mut builder = redb::Builder::new();
    builder.set_concurrency_mode(redb::ConcurrencyMode::SingleWriter);
    builder.set_cache_size(1 << 20);
    let db = crate::redb_store::contain::quietly(|| builder.open_read_only(path))
        .ok()?
        .ok()?;
    let read = db.begin_read().ok()?;
    crate::redb_store::reading::writer_pid(&read).ok().flatten()
}

/// Whether the store's last writing open shared it between processes, read read-only.
fn held_shared(path: &Path) -> bool {
    open_read_only(path).ok().is_some_and(|view| {
        view.begin_read().ok().is_some_and(|read| {
            crate::redb_store::reading::shared_by_processes(&read).unwrap_or(false)
        })
    })
}

/// A read-only view of a store file.
pub(crate) enum ReadView {
    /// Beside a live writer (or none): each read sees the latest commit.
    Live(redb::ReadOnlyDatabase),
    /// The last commit of a store whose writer died, repaired in memory only
    /// (see [`crate::redb_store::crashed_file`]): a snapshot, and the file is left exactly as it was.
    Rescued(Database),
}

impl ReadView {
    pub(crate) fn begin_read(&self) -> Result<ReadTransaction, redb::TransactionError> {
        match self {
            ReadView::Live(db) => db.begin_read(),
            ReadView::Rescued(db) => db.begin_read(),
        }
    }
}

/// Opens an existing store file read-only, beside a writer in single-writer mode. A store
/// its writer left unclean (killed, say) is read through an in-memory repair, never written.
pub(crate) fn open_read_only(path: &Path) -> Result<ReadView, OpenError> {
    if !path.exists() {
        return Err(io_error(path, std::io::ErrorKind::NotFound.into()));
    }
    sniff(path)?;
    let mut builder = redb::Builder::new();
    builder.set_concurrency_mode(redb::ConcurrencyMode::SingleWriter);
    builder.set_cache_size(READ_CACHE);
    match crate::redb_store::contain::quietly(|| builder.open_read_only(path)) {
        Ok(Ok(db)) => Ok(ReadView::Live(db)),
        Ok(Err(DatabaseError::RepairAborted)) => rescue(path),
        Ok(Err(e)) => Err(map_database_error(path, e)),
        Err(_) => Err(unreadable(path)),
    }
}

const READ_CACHE: usize = 16 << 20;

/// Opens the last committed state of a store its writer left unclean, repairing it in memory.
fn rescue(path: &Path) -> Result<ReadView, OpenError> {
    let overlay =
        crate::redb_store::crashed_file::Overlay::open(path).map_err(|e| io_error(path, e))?;
    let mut builder = redb::Builder::new();
    builder.set_cache_size(READ_CACHE);
    match crate::redb_store::contain::quietly(|| builder.create_with_backend(overlay)) {
        Ok(Ok(db)) => Ok(ReadView::Rescued(db)),
        Ok(Err(e)) => Err(map_database_error(path, e)),
        Err(_) => Err(unreadable(path)),
    }
}

fn unreadable(path: &Path) -> OpenError {
    OpenError::Corrupt {
        path: path.to_owned(),
        detail: "the storage engine could not read the file".into(),
    }
}

/// The latest store time a clock could have written: 2^62 ns, about 146 years of running
/// time (the high-water mark runs at most a lease, a week at most, ahead of the clock). A
/// later value was not written by leasehold, and accepting it would move store time to the
/// end of time: every lease would then expire at once and stay expired.
const LATEST_PLAUSIBLE: StoreTime = StoreTime(1 << 62);

/// What the file says about time.
pub(crate) struct Timeline {
    pub anchor: Option<Anchor>,
    pub high_water: StoreTime,
}

/// Checks that `db` is a leasehold store this build can read (or makes a new, empty redb
/// database into one), and reads its timeline.
pub(crate) fn prepare(db: &Database, path: &Path) -> Result<()> {
    let read = db.begin_read()?;
    let empty = read.list_tables()?.next().is_none();
    if empty {
        drop(read);
        return create::initialize(db);
    }
    inspect(&read, path).map(|_| ())
}

/// Checks that an existing database is a leasehold store this build can read, and reads its
/// timeline. Writes nothing (readers use it too).
pub(crate) fn inspect(read: &ReadTransaction, path: &Path) -> Result<Timeline> {
    let not_a_store = |detail: &str| OpenError::NotAStore {
        path: path.to_owned(),
        detail: detail.to_owned(),
    };
    let has_meta = read.list_tables()?.any(|t| t.name() == schema::META.name());
    if !has_meta {
        return Err(not_a_store("a redb database without leasehold's tables").into());
    }
    let meta = read.open_table(schema::META)?;
    let marker = meta.get(meta_key::MARKER)?.map(|m| m.value().to_vec());
    if marker.as_deref() != Some(MARKER) {
        return Err(not_a_store("its meta table was not written by leasehold").into());
    }
    let version = match meta.get(meta_key::SCHEMA_VERSION)? {
        Some(v) => {
            let bytes: [u8; 4] = v.value().try_into().map_err(|_| OpenError::Corrupt {
                path: path.to_owned(),
                detail: "schema version is not 4 bytes".into(),
            })?;
            u32::from_le_bytes(bytes)
        }
        None => {
            return Err(OpenError::Corrupt {
                path: path.to_owned(),
                detail: "no schema version".into(),
            }
            .into());
        }
    };
    if version > SCHEMA_VERSION {
        return Err(OpenError::NewerSchema {
            path: path.to_owned(),
            found: version,
            supported: SCHEMA_VERSION,
        }
        .into());
    }
    read_timeline(&meta, path)
}

/// The clock anchor and high-water mark in `meta`, refused if no clock could have written them.
fn read_timeline(
    meta: &impl redb::ReadableTable<&'static str, &'static [u8]>,
    path: &Path,
) -> Result<Timeline> {
    let anchor = match meta.get(meta_key::ANCHOR)? {
        Some(b) => Some(
            codec::decode::<Anchor>(b.value()).map_err(|e| OpenError::Corrupt {
                path: path.to_owned(),
                detail: format!("clock anchor: {e}"),
            })?,
        ),
        None => None,
    };
    let high_water = StoreTime(read_u64(meta, meta_key::HIGH_WATER)?.unwrap_or(0));
    let implausible = |what: &str, t: StoreTime| OpenError::Corrupt {
        path: path.to_owned(),
        detail: format!("{what} {t} is later than any clock could have written"),
    };
    if high_water > LATEST_PLAUSIBLE {
        return Err(implausible("the clock's high-water mark", high_water).into());
    }
    if let Some(a) = &anchor
        && a.store > LATEST_PLAUSIBLE
    {
        return Err(implausible("the clock anchor's store time", a.store).into());
    }
    Ok(Timeline { anchor, high_water })
}

/// Binds the store clock to the file's timeline and records this writer, in one write
/// transaction: when several processes write the store, an anchor another one wrote an instant
/// ago must be read and used, never overwritten (two anchors would put two store times on one
/// file), and this process's instance is registered (`instance`) before it holds any lease.
/// Alone on the file, it records this process's pid, so a refused second writer can be told
/// who holds the seat. Also brings an older schema up to this build's.
/// What [`settle`] found and did.
pub(crate) struct Settled {
    pub clock: StoreClock,
    /// The schema version this open upgraded the store from, if it was older.
    pub upgraded_from: Option<u32>,
}

pub(crate) fn settle(
    db: &Database,
    path: &Path,
    source: std::sync::Arc<dyn crate::clock::Clock>,
    instance: Option<(
        crate::ids::InstanceId,
        &crate::redb_store::instance::Registration,
    )>,
) -> Result<Settled> {
    let shared = instance.is_some();
    let txn = db.begin_write()?;
    let mut upgraded_from = None;
    let clock = {
        let mut meta = txn.open_table(schema::META)?;
        let timeline = read_timeline(&meta, path)?;
        let (clock, fresh) = StoreClock::resume(source, timeline.anchor, timeline.high_water);
        if fresh {
            meta.insert(meta_key::ANCHOR, codec::encode(&clock.anchor()).as_slice())?;
        }
        if shared {
            meta.insert(meta_key::SHARING, schema::MULTI_PROCESS)?;
        } else {
            meta.remove(meta_key::SHARING)?;
            meta.insert(
                meta_key::WRITER_PID,
                u64::from(std::process::id()).to_le_bytes().as_slice(),
            )?;
        }
        let found = schema::version_in(&meta)?;
        if let Some(older) = found.filter(|v| *v < SCHEMA_VERSION) {
            upgraded_from = Some(older);
            tracing::info!(
                path = %path.display(),
                from = older,
                to = SCHEMA_VERSION,
                "upgrading the store's schema; builds older than this one will refuse it"
            );
        }
        meta.insert(
            meta_key::SCHEMA_VERSION,
            SCHEMA_VERSION.to_le_bytes().as_slice(),
        )?;
        clock
    };
    match instance {
        Some((id, registration)) => {
            // Created here, so readers of a shared store find them (an older store lacks them).
            txn.open_table(schema::HOLDERS)?;
            let mut instances = txn.open_table(schema::INSTANCES)?;
            instances.insert(id.0, codec::encode(registration).as_slice())?;
        }
        None => {
            // Alone on the file (the writer's seat proves no other process runs), no lease
            // has a live holder and no instance lives: what is left from when processes
            // shared the store goes.
            txn.delete_table(schema::HOLDERS)?;
            txn.delete_table(schema::INSTANCES)?;
        }
    }
    if upgraded_from.is_some_and(|v| v < 11) {
        index_groups(&txn)?;
    }
    txn.commit()?;
    Ok(Settled {
        clock,
        upgraded_from,
    })
}

/// Indexes the groups by their end and keeps each keyed group's key in its record: the
/// upgrade to schema version 11, in the transaction that records the new version. (Groups
/// are few beside jobs; each record is read once.)
fn index_groups(txn: &redb::WriteTransaction) -> Result<()> {
    let mut groups = txn.open_table(schema::GROUPS)?;
    let mut ends = txn.open_table(schema::GROUP_ENDS)?;
    let keys = txn.open_table(schema::GROUP_KEYS)?;
    let mut keyed = std::collections::BTreeMap::new();
    for entry in keys.iter()? {
        let (key, id) = entry?;
        keyed.insert(id.value(), key.value().to_owned());
    }
    let mut records = Vec::new();
    for entry in groups.iter()? {
        let (id, bytes) = entry?;
        let id = id.value();
        let record: Option<crate::workflow::GroupRecord> =
            codec::decode_stored(Some(bytes.value()), || format!("the record of group {id}"))?;
        records.extend(record);
    }
    for mut group in records {
        ends.insert(schema::group_end(&group), ())?;
        if let Some(key) = keyed.remove(&group.id.0) {
            group.key = Some(key);
            groups.insert(group.id.0, codec::encode(&group).as_slice())?;
        }
    }
    Ok(())
}
