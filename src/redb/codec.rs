//! The one place records become bytes and back.
//!
//! Every stored value starts with a format-version byte, followed by the bincode 2 encoding
//! of the record. Swapping the codec (or evolving a record) means a new version byte here and
//! a decoder for the old one; nothing outside this module knows how records are encoded.
//!
//! Decoding is defensive: bytes that are not a valid record (a damaged or foreign file, or a
//! fuzzer) give a [`CodecError`], never a panic, and a length prefix cannot make the decoder
//! allocate more than [`DECODE_LIMIT`].

use bincode::config::{self, Configuration, Limit};
use bincode::{Decode, Encode};

/// The current format version byte.
pub const FORMAT_VERSION: u8 = 1;

/// The most a single decoded record may allocate.
pub const DECODE_LIMIT: usize = 64 << 20;

fn config() -> Configuration<config::LittleEndian, config::Varint, Limit<DECODE_LIMIT>> {
    config::standard().with_limit::<DECODE_LIMIT>()
}

/// Why bytes could not be decoded into a record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    /// No bytes at all.
    #[error("empty record")]
    Empty,
    /// A version byte this build does not know.
    #[error("unknown record format version {0}")]
    UnknownVersion(u8),
    /// The body is not a valid record.
    #[error("malformed record: {0}")]
    Malformed(String),
    /// A valid record followed by extra bytes.
    #[error("{0} trailing bytes after record")]
    Trailing(usize),
}

/// Encodes `value` with the current format version.
pub fn encode<T: Encode>(value: &T) -> Vec<u8> {
    // Room for a typical record up front: growing from one byte reallocates several times,
    // and records are encoded on every write.
    let mut out = Vec::with_capacity(128);
    out.push(FORMAT_VERSION);
    // Encoding into a Vec fails only if the writer fails, which a Vec never does, or if a
    // value exceeds the limit, which the store's input checks keep far away.
    if let Err(e) = bincode::encode_into_std_write(value, &mut out, config()) {
        tracing::error!(error = %e, "record encoding failed");
    }
    out
}

/// Decodes a record written by [`encode`].
pub fn decode<T: Decode<()>>(bytes: &[u8]) -> Result<T, CodecError> {
    let (&version, body) = bytes.split_first().ok_or(CodecError::Empty)?;
    if version != FORMAT_VERSION {
        return Err(CodecError::UnknownVersion(version));
    }
    let (value, used) = bincode::decode_from_slice(body, config())
        .map_err(|e| CodecError::Malformed(e.to_string()))?;
    if used != body.len() {
        return Err(CodecError::Trailing(body.len() - used));
    }
    Ok(value)
}

/// The counters as builds before `reclaimed_process_died` stored them (that path was
/// counted in `reclaimed_at_open`): read once, written back in the new shape.
#[derive(Decode)]
struct CountersBefore {
    reclaimed_by_reaper: u64,
    reclaimed_by_takeover: u64,
    reclaimed_at_open: u64,
    released: u64,
    leases_lost: u64,
    fenced_writes_rejected: u64,
    stalled: u64,
    worst_detection_delay: std::time::Duration,
}

/// The counters stored in `bytes`, in this build's shape or an earlier one's.
pub(crate) fn decode_counters(bytes: &[u8]) -> Result<crate::Counters, CodecError> {
    match decode::<crate::Counters>(bytes) {
        Ok(c) => Ok(c),
        Err(now) => match decode::<CountersBefore>(bytes) {
            Ok(b) => Ok(crate::Counters {
                reclaimed_by_reaper: b.reclaimed_by_reaper,
                reclaimed_by_takeover: b.reclaimed_by_takeover,
                reclaimed_at_open: b.reclaimed_at_open,
                released: b.released,
                leases_lost: b.leases_lost,
                fenced_writes_rejected: b.fenced_writes_rejected,
                stalled: b.stalled,
                worst_detection_delay: b.worst_detection_delay,
                reclaimed_process_died: 0,
            }),
            Err(_) => Err(now),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{Outcome, ReclaimPath, RunRecord};
    use crate::{Attempt, StoreTime};
    use std::time::Duration;

    fn run() -> RunRecord {
        RunRecord {
            attempt: Attempt(3),
            worker: "w".into(),
            claimed_at: StoreTime(5),
            ended_at: Some(StoreTime(9)),
            outcome: Some(Outcome::LeaseExpired {
                path: ReclaimPath::Reaper,
                overdue: Duration::from_millis(7),
            }),
            progress: 11,
        }
    }

    #[test]
    fn round_trips_a_record() {
        let bytes = encode(&run());
        assert_eq!(bytes[0], FORMAT_VERSION);
        assert_eq!(decode::<RunRecord>(&bytes), Ok(run()));
    }

    #[test]
    fn rejects_unknown_version_truncation_and_trailing_bytes() {
        let mut bytes = encode(&run());
        assert_eq!(decode::<RunRecord>(&[]), Err(CodecError::Empty));
        bytes[0] = 99;
        assert_eq!(
            decode::<RunRecord>(&bytes),
            Err(CodecError::UnknownVersion(99))
        );
        bytes[0] = FORMAT_VERSION;
        assert!(matches!(
            decode::<RunRecord>(&bytes[..bytes.len() - 1]),
            Err(CodecError::Malformed(_))
        ));
        bytes.push(0);
        assert_eq!(decode::<RunRecord>(&bytes), Err(CodecError::Trailing(1)));
    }

    #[test]
    fn huge_length_prefix_is_refused_without_allocating() {
        // version, attempt 0, then a string length of u64::MAX in varint form
        let bytes = [
            FORMAT_VERSION,
            0,
            0xFD,
            0xFF,
            0xFF,
            0xFF,
            0xFF,
            0xFF,
            0xFF,
            0xFF,
            0xFF,
        ];
        assert!(decode::<RunRecord>(&bytes).is_err());
    }

    /// What builds before `reclaimed_process_died` wrote.
    #[derive(Encode)]
    struct Earlier(u64, u64, u64, u64, u64, u64, u64, Duration);

    #[test]
    fn counters_stored_by_an_earlier_build_are_read_with_the_new_counter_at_zero() {
        let bytes = encode(&Earlier(1, 2, 3, 4, 5, 6, 7, Duration::from_secs(8)));
        let c = decode_counters(&bytes).unwrap();
        assert_eq!(
            (c.reclaimed_at_open, c.stalled, c.reclaimed_process_died),
            (3, 7, 0)
        );
        assert_eq!(c.worst_detection_delay, Duration::from_secs(8));
        let now = crate::Counters {
            reclaimed_process_died: 9,
            ..c.clone()
        };
        assert_eq!(decode_counters(&encode(&now)).unwrap(), now);
        assert!(decode_counters(b"\x01garbage").is_err());
    }
}
