//! Files that are not leasehold stores, made for the tests that refuse them.

use std::path::Path;

/// Another application's redb database: a table `users` with one row.
pub fn foreign_redb(path: &Path) {
    let db = leasehold::redb::Database::create(path).unwrap();
    let txn = db.begin_write().unwrap();
    let users: leasehold::redb::TableDefinition<&str, u64> =
        leasehold::redb::TableDefinition::new("users");
    txn.open_table(users).unwrap().insert("ada", 1).unwrap();
    txn.commit().unwrap();
}

/// A FIFO: opening it for reading blocks until a writer comes.
pub fn fifo(path: &Path) {
    let c = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo only creates the node.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}
