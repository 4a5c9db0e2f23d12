//! Replays every fuzz corpus entry and crash reproducer on stable, as part of `cargo test`:
//! `fuzz/corpus/<target>/*` and `fuzz/regressions/<target>/*`.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs, dead_code)]

#[path = "support/backends.rs"]
mod backends;
#[path = "support/fuzz_checks.rs"]
mod fuzz_checks;
#[path = "support/harness.rs"]
mod harness;
#[path = "support/model.rs"]
mod model;

use std::path::Path;

fn replay(target: &str, check: fn(&[u8])) -> usize {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut n = 0;
    for kind in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(kind).join(target)) else {
            continue;
        };
        let mut files: Vec<_> = entries.map(|e| e.unwrap().path()).collect();
        files.sort();
        for file in files {
            let data = std::fs::read(&file).unwrap();
            let outcome = std::panic::catch_unwind(|| check(&data));
            assert!(outcome.is_ok(), "{} fails again", file.display());
            n += 1;
        }
    }
    n
}

#[test]
fn every_decode_record_input_seen_by_the_fuzzer_still_decodes_or_errs() {
    let n = replay("decode_record", fuzz_checks::decode_record);
    assert!(n > 0, "no corpus for decode_record");
}

#[test]
fn every_open_file_input_seen_by_the_fuzzer_still_opens_or_errs() {
    let n = replay("open_file", fuzz_checks::open_file);
    assert!(n > 0, "no corpus for open_file");
}

#[test]
fn every_op_sequence_seen_by_the_fuzzer_still_matches_the_model() {
    let n = replay("op_sequence", fuzz_checks::op_sequence);
    assert!(n > 0, "no corpus for op_sequence");
}
