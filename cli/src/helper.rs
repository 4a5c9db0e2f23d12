//! Helper processes of this binary (its hidden subcommands), started by the bench and the
//! demo, their stdout read line by line.

use std::io::{BufRead, BufReader, Lines, Write};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};

use leasehold::Error;

pub(super) fn io(e: std::io::Error) -> Error {
    Error::Storage(leasehold::redb::Error::Io(e))
}

/// A helper process of this binary, its stdout read line by line.
pub(super) struct Helper {
    child: Child,
    out: Lines<BufReader<ChildStdout>>,
}

impl Helper {
    pub(super) fn start(path: &Path, args: &[&str]) -> Result<Helper, Error> {
        let exe = std::env::current_exe().map_err(io)?;
        let mut child = Command::new(exe)
            .arg("--db")
            .arg(path)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(io)?;
        let stdout = child.stdout.take().ok_or(Error::InUse("no stdout"))?;
        let mut helper = Helper {
            child,
            out: BufReader::new(stdout).lines(),
        };
        helper.until("ready")?;
        Ok(helper)
    }

    /// Reads lines until one starts with `word`; returns its other words.
    pub(super) fn until(&mut self, word: &str) -> Result<Vec<String>, Error> {
        for line in self.out.by_ref() {
            let line = line.map_err(io)?;
            let mut words = line.split_whitespace().map(str::to_owned);
            if words.next().as_deref() == Some(word) {
                return Ok(words.collect());
            }
        }
        Err(Error::InUse("a helper process ended early"))
    }

    pub(super) fn end(mut self) {
        if let Some(mut stdin) = self.child.stdin.take() {
            let _ = stdin.write_all(b"\n");
        }
        let _ = self.child.wait();
    }

    /// Ends the process as [`Helper::end`] does, and returns the words after `word` in the
    /// line it printed last that starts so, if any.
    pub(super) fn finish(mut self, word: &str) -> Option<Vec<String>> {
        if let Some(mut stdin) = self.child.stdin.take() {
            let _ = stdin.write_all(b"\n");
        }
        let found = self.until(word).ok();
        let _ = self.child.wait();
        found
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(super) fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
