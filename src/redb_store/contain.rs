//! Containing the storage engine's panics on a damaged file.
//!
//! redb panics on some damaged pages (and documents that an altered file may make it
//! panic). leasehold turns such a panic into an error the application and the tool's exit
//! code can act on ([`crate::Error::Corrupt`], [`crate::OpenError::Corrupt`]), which is only
//! half of it: Rust's default panic hook has already printed the engine's message and a
//! backtrace to stderr, so an operator reading a damaged store saw a crash report beside the
//! error that says "corrupt". So a contained call is also quiet: the first one installs a
//! panic hook that stays silent for a panic inside a contained call on the same thread, and
//! hands every other panic to the hook that was there before (the application's, or the
//! default). An application that installs its own hook later replaces this one, and then
//! hears contained panics too.

use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};

thread_local! {
    /// How many contained calls this thread is inside.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// Runs `f`, catching a panic (which is not printed); `Err` if it panicked.
pub(crate) fn quietly<T>(f: impl FnOnce() -> T) -> std::thread::Result<T> {
    install_hook();
    DEPTH.with(|d| d.set(d.get() + 1));
    let result = catch_unwind(AssertUnwindSafe(f));
    DEPTH.with(|d| d.set(d.get().saturating_sub(1)));
    if let Err(panic) = &result {
        tracing::debug!(panic = %crate::error::panic_message(&**panic), "the storage engine panicked on a damaged page; reported as corruption");
    }
    result
}

fn install_hook() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if DEPTH.with(Cell::get) == 0 {
                previous(info);
            }
        }));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_contained_panic_is_caught_and_the_thread_goes_on() {
        let caught = quietly(|| -> u32 { panic!("a damaged page") });
        assert!(caught.is_err());
        assert_eq!(quietly(|| 7).ok(), Some(7));
        assert_eq!(DEPTH.with(Cell::get), 0, "left every contained call");
    }
}
