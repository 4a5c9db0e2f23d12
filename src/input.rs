//! Checks on arguments, applied before a transaction changes anything.

use crate::error::InputError;
use crate::schema::limits;

pub(crate) fn check_queue(queue: &str) -> Result<(), InputError> {
    if queue.is_empty() {
        return Err(InputError::EmptyQueueName);
    }
    if queue.len() > limits::MAX_QUEUE_NAME {
        return Err(InputError::QueueNameTooLong {
            len: queue.len(),
            max: limits::MAX_QUEUE_NAME,
        });
    }
    Ok(())
}

pub(crate) fn check_worker(worker: &str) -> Result<(), InputError> {
    if worker.is_empty() || worker.len() > limits::MAX_WORKER_ID {
        return Err(InputError::BadWorkerId {
            len: worker.len(),
            max: limits::MAX_WORKER_ID,
        });
    }
    Ok(())
}

pub(crate) fn check_unique_key(key: &str) -> Result<(), InputError> {
    if key.is_empty() || key.len() > limits::MAX_UNIQUE_KEY {
        return Err(InputError::BadUniqueKey {
            len: key.len(),
            max: limits::MAX_UNIQUE_KEY,
        });
    }
    Ok(())
}

pub(crate) fn check_size(what: &'static str, len: usize, max: usize) -> Result<(), InputError> {
    if len > max {
        return Err(InputError::TooLarge { what, len, max });
    }
    Ok(())
}

/// Error messages are evidence, not payload: a long one is cut (at a character boundary)
/// rather than refused, so that a failing job can always record that it failed.
pub(crate) fn truncate_error(message: &str) -> String {
    if message.len() <= limits::MAX_ERROR_MESSAGE {
        return message.to_owned();
    }
    let mut end = limits::MAX_ERROR_MESSAGE;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes cut)", &message[..end], message.len() - end)
}
