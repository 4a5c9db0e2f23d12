//! Reading a store whose last writer died, without writing a byte of its file.
//!
//! A writer killed mid-run leaves the file marked unclean, and redb opens such a file only to
//! repair it, which writes. The read commands run exactly when an operator most needs to look,
//! and must not change what they look at (nor take back leases: that is the next writer's
//! job). So the file is opened through [`Overlay`], a storage backend that reads the file and
//! keeps every write redb's repair makes in memory: redb repairs its view of the last
//! committed state, the file stays as it was.
//!
//! This is a snapshot of the moment it was opened. A writer that opens the file afterwards
//! repairs it for real and goes on; a reader that wants its commits opens the file again (the
//! ordinary read-only path then works).

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use parking_lot::Mutex;
use redb::StorageBackend;

/// The size of the pieces the overlay keeps.
const CHUNK: u64 = 4096;

/// A copy-on-write view of a file: reads come from the file unless redb wrote that range,
/// writes stay in memory, and the file is only ever read.
#[derive(Debug)]
pub(crate) struct Overlay {
    file: File,
    state: Mutex<OverlayState>,
}

#[derive(Debug)]
struct OverlayState {
    /// The length redb sees.
    len: u64,
    /// How much of the file's own bytes are still visible: a shrink hides the rest for good
    /// (regrown space reads as zeros, as `set_len` requires).
    file_visible: u64,
    /// Chunks redb wrote, by index, each `CHUNK` bytes.
    written: BTreeMap<u64, Vec<u8>>,
}

impl Overlay {
    /// Opens `path` for reading only.
    pub(crate) fn open(path: &Path) -> io::Result<Overlay> {
        let file = File::open(path)?;
        let len = file.metadata()?.len();
        Ok(Overlay {
            file,
            state: Mutex::new(OverlayState {
                len,
                file_visible: len,
                written: BTreeMap::new(),
            }),
        })
    }

    /// The bytes of chunk `index` as redb last left them.
    fn chunk(&self, state: &OverlayState, index: u64) -> io::Result<Vec<u8>> {
        if let Some(c) = state.written.get(&index) {
            return Ok(c.clone());
        }
        let mut c = vec![0u8; CHUNK as usize];
        self.read_file(state, index * CHUNK, &mut c)?;
        Ok(c)
    }

    /// Reads the file's bytes at `offset`, zeros past what is visible of it.
    fn read_file(&self, state: &OverlayState, offset: u64, out: &mut [u8]) -> io::Result<()> {
        out.fill(0);
        if offset >= state.file_visible {
            return Ok(());
        }
        let n = usize::try_from((state.file_visible - offset).min(out.len() as u64))
            .unwrap_or(out.len());
        self.file.read_exact_at(&mut out[..n], offset)
    }
}

impl StorageBackend for Overlay {
    fn len(&self) -> Result<u64, io::Error> {
        Ok(self.state.lock().len)
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), io::Error> {
        let state = self.state.lock();
        let end = offset
            .checked_add(out.len() as u64)
            .filter(|&end| end <= state.len)
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        if state.written.is_empty() {
            return self.read_file(&state, offset, out);
        }
        let mut at = offset;
        while at < end {
            let index = at / CHUNK;
            let within = (at % CHUNK) as usize;
            let take = ((CHUNK - at % CHUNK).min(end - at)) as usize;
            let dst = &mut out[(at - offset) as usize..][..take];
            match state.written.get(&index) {
                Some(c) => dst.copy_from_slice(&c[within..within + take]),
                None => self.read_file(&state, at, dst)?,
            }
            at += take as u64;
        }
        Ok(())
    }

    fn set_len(&self, len: u64) -> Result<(), io::Error> {
        let mut state = self.state.lock();
        if len < state.len {
            state.file_visible = state.file_visible.min(len);
            let first_gone = len.div_ceil(CHUNK);
            state.written.split_off(&first_gone);
            // The chunk that holds the new end keeps its bytes below it only.
            if let Some(c) = state.written.get_mut(&(len / CHUNK)) {
                c[(len % CHUNK) as usize..].fill(0);
            }
        }
        state.len = len;
        Ok(())
    }

    fn sync_data(&self) -> Result<(), io::Error> {
        Ok(())
    }

    fn write(&self, offset: u64, data: &[u8]) -> Result<(), io::Error> {
        let mut state = self.state.lock();
        let end = offset
            .checked_add(data.len() as u64)
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        let mut at = offset;
        while at < end {
            let index = at / CHUNK;
            let within = (at % CHUNK) as usize;
            let take = ((CHUNK - at % CHUNK).min(end - at)) as usize;
            let mut c = self.chunk(&state, index)?;
            c[within..within + take].copy_from_slice(&data[(at - offset) as usize..][..take]);
            state.written.insert(index, c);
            at += take as u64;
        }
        state.len = state.len.max(end);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_seen_through_the_overlay_and_never_reach_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let original: Vec<u8> = (0..3 * CHUNK).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &original).unwrap();
        let o = Overlay::open(&path).unwrap();
        o.write(CHUNK - 2, &[9, 9, 9, 9]).unwrap();
        let mut got = vec![0u8; 8];
        o.read(CHUNK - 4, &mut got).unwrap();
        let mut want = original[(CHUNK - 4) as usize..][..8].to_vec();
        want[2..6].copy_from_slice(&[9, 9, 9, 9]);
        assert_eq!(got, want);
        // shrink and regrow: the file's bytes past the shrink read as zeros
        o.set_len(CHUNK + 10).unwrap();
        o.set_len(4 * CHUNK).unwrap();
        let mut tail = vec![1u8; 20];
        o.read(CHUNK + 5, &mut tail).unwrap();
        assert_eq!(&tail[..5], &original[(CHUNK + 5) as usize..][..5]);
        assert!(tail[5..].iter().all(|&b| b == 0));
        assert!(
            o.read(4 * CHUNK - 1, &mut [0u8; 2]).is_err(),
            "past the end"
        );
        drop(o);
        assert_eq!(std::fs::read(&path).unwrap(), original);
    }
}
