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
}
