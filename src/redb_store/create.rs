//! Creating a new store so that a crash (or an I/O fault) part-way leaves nothing half-made:
//! a missing store, or a whole one, never a file that every later open refuses.
//!
//! redb initializes new storage in place and writes its magic number last; a crash before it
//! leaves bytes that are not a redb database, and would be refused as "not a store" forever.
//! A file is therefore built under a temporary name and linked into place once whole. A custom
//! backend has no names: the store is built in memory and copied in, the magic number last,
//! over a marker that says "creation under way", so that an interrupted copy is recognised at
//! the next open and started again.

use std::path::Path;
use std::sync::Arc;

use parking_lot::Mutex;
use redb::{Database, StorageBackend};

use crate::error::{Error, OpenError, Result};
/// The first bytes of every redb file.
pub(crate) const REDB_MAGIC: [u8; 9] = [b'r', b'e', b'd', b'b', 0x1A, 0x0A, 0xA9, 0x0D, 0x0A];
use crate::redb_store::schema::{MARKER, SCHEMA_VERSION, meta_key};
use crate::redb_store::writing::Tables;

/// Creates a new store beside `path` and links it into place only once it is whole.
///
/// redb initializes a new file in place and writes its magic number last, so a crash during
/// that first open would leave a file that no later open accepts. Built under a temporary
/// name and hard-linked to `path` (which fails if `path` appeared meanwhile, so two processes
/// creating the same store at once end up sharing one file), a crash leaves at most a stray
/// temporary file, never a half-made store.
pub(crate) fn create_atomically(path: &Path, builder: &redb::Builder) -> Result<(), OpenError> {
    let io = |source| io_error(path, source);
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => std::path::PathBuf::from("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(
        ".{name}.creating-{}-{:x}",
        std::process::id(),
        crate::random::random_u64()
    ));
    let made = crate::redb_store::contain::quietly(|| builder.create(&tmp));
    let result = match made {
        Ok(Ok(db)) => {
            let init = initialize(&db).map_err(|e| OpenError::Corrupt {
                path: path.to_owned(),
                detail: format!("initializing a new store failed: {e}"),
            });
            drop(db);
            init.and_then(|()| link_into_place(&tmp, path).map_err(io))
        }
        Ok(Err(e)) => Err(creating_failed(path, e)),
        Err(_) => Err(OpenError::Corrupt {
            path: path.to_owned(),
            detail: "the storage engine failed creating the file".into(),
        }),
    };
    let _ = std::fs::remove_file(&tmp);
    result
}

fn link_into_place(tmp: &Path, path: &Path) -> std::io::Result<()> {
    match std::fs::hard_link(tmp, path) {
        Ok(()) => {}
        // Another process created the store first: use theirs.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        // A filesystem without hard links (FAT on some devices): rename, which replaces a
        // store that another process created in the same instant (documented).
        Err(_) => std::fs::rename(tmp, path)?,
    }
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        // Make the new name durable, not only the file's contents.
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
    Ok(())
}

/// Makes an empty redb database into a leasehold store: every table, the marker, the
/// schema version. One transaction, so a crash leaves either nothing or a whole store.
pub(crate) fn initialize(db: &Database) -> Result<()> {
    let txn = db.begin_write()?;
    {
        let mut t = Tables::open(&txn, false)?;
        t.meta.insert(meta_key::MARKER, MARKER)?;
        t.meta.insert(
            meta_key::SCHEMA_VERSION,
            SCHEMA_VERSION.to_le_bytes().as_slice(),
        )?;
    }
    txn.commit().map_err(Error::from)
}

/// What a backend's first bytes hold while a store is copied into it: anything but redb's
/// magic number, and nothing that damage to a real store would produce.
pub(crate) const CREATING: [u8; 9] = *b"lh-create";

/// Whether `backend` holds a store whose creation was interrupted (see [`create_in_backend`]).
pub(crate) fn interrupted_in(backend: &dyn StorageBackend) -> bool {
    let mut head = [0u8; CREATING.len()];
    backend.len().is_ok_and(|len| len >= head.len() as u64)
        && backend.read(0, &mut head).is_ok()
        && head == CREATING
}

/// Creates a new store in an empty backend (or one whose creation was interrupted): builds it
/// in memory, then copies it in with [`CREATING`] where the magic number goes, syncs, and
/// writes the magic number last.
pub(crate) fn create_in_backend(
    path: &Path,
    backend: &dyn StorageBackend,
    builder: &redb::Builder,
) -> Result<()> {
    let failed = |detail: String| -> Error {
        OpenError::Corrupt {
            path: path.to_owned(),
            detail,
        }
        .into()
    };
    let memory = Memory::default();
    match crate::redb_store::contain::quietly(|| builder.create_with_backend(memory.clone())) {
        Ok(Ok(db)) => {
            initialize(&db).map_err(|e| failed(format!("initializing a new store failed: {e}")))?;
        }
        Ok(Err(e)) => return Err(creating_failed(path, e).into()),
        Err(_) => {
            return Err(failed(
                "the storage engine failed creating the store".into(),
            ));
        }
    }
    let image = std::mem::take(&mut *memory.0.lock());
    if image.len() < REDB_MAGIC.len() || image[..REDB_MAGIC.len()] != REDB_MAGIC {
        return Err(failed(
            "the storage engine made an image without its magic number".into(),
        ));
    }
    let io = |e| -> Error { io_error(path, e).into() };
    backend.set_len(0).map_err(io)?;
    backend.write(0, &CREATING).map_err(io)?;
    backend
        .write(CREATING.len() as u64, &image[CREATING.len()..])
        .map_err(io)?;
    backend.sync_data().map_err(io)?;
    backend.write(0, &REDB_MAGIC).map_err(io)?;
    backend.sync_data().map_err(io)
}

/// A store built in memory, whose bytes are taken once it is closed.
#[derive(Clone, Debug, Default)]
struct Memory(Arc<Mutex<Vec<u8>>>);

impl StorageBackend for Memory {
    fn len(&self) -> std::result::Result<u64, std::io::Error> {
        Ok(self.0.lock().len() as u64)
    }
    fn read(&self, offset: u64, out: &mut [u8]) -> std::result::Result<(), std::io::Error> {
        let bytes = self.0.lock();
        let start = usize::try_from(offset).map_err(std::io::Error::other)?;
        let src = start
            .checked_add(out.len())
            .and_then(|end| bytes.get(start..end))
            .ok_or_else(|| std::io::Error::from(std::io::ErrorKind::UnexpectedEof))?;
        out.copy_from_slice(src);
        Ok(())
    }
    fn set_len(&self, len: u64) -> std::result::Result<(), std::io::Error> {
        let len = usize::try_from(len).map_err(std::io::Error::other)?;
        self.0.lock().resize(len, 0);
        Ok(())
    }
    fn sync_data(&self) -> std::result::Result<(), std::io::Error> {
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8]) -> std::result::Result<(), std::io::Error> {
        let mut bytes = self.0.lock();
        let start = usize::try_from(offset).map_err(std::io::Error::other)?;
        let end = start + data.len();
        if end > bytes.len() {
            bytes.resize(end, 0);
        }
        bytes[start..end].copy_from_slice(data);
        Ok(())
    }
}

fn io_error(path: &Path, source: std::io::Error) -> OpenError {
    OpenError::Io {
        path: path.to_owned(),
        source,
    }
}

/// Why redb could not make a new database (a fresh file or backend, so never one that is
/// locked, foreign or of another version): the I/O error, or what redb said.
fn creating_failed(path: &Path, e: redb::DatabaseError) -> OpenError {
    match e {
        redb::DatabaseError::Storage(redb::StorageError::Io(source)) => io_error(path, source),
        other => OpenError::Corrupt {
            path: path.to_owned(),
            detail: format!("creating the store failed: {other}"),
        },
    }
}
