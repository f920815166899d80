//! Redis's errors as [`StoreError`]s (the trait's one error type; this
//! crate has no error enum of its own).

use std::time::Duration;

use kvbm_store::StoreError;
use redis::RedisError;

/// A failed call: [`StoreError::Timeout`] when the node did not answer
/// within `timeout`, [`StoreError::Remote`] with Redis's message otherwise.
pub(crate) fn from_redis(err: &RedisError, timeout: Duration) -> StoreError {
    if err.is_timeout() {
        StoreError::Timeout(timeout)
    } else {
        StoreError::Remote(err.to_string())
    }
}

/// The same error again, for every block of a batch that one failure
/// failed (`StoreError` is not `Clone`: it can hold an `io::Error`).
pub(crate) fn again(err: &StoreError) -> StoreError {
    match err {
        StoreError::Timeout(after) => StoreError::Timeout(*after),
        StoreError::Remote(why) => StoreError::Remote(why.clone()),
        StoreError::Config(why) => StoreError::Config(why.clone()),
        other => StoreError::Remote(other.to_string()),
    }
}
