//! vLLM's ZeroMQ transport (feature `zmq`): a [`Publisher`] that sends each
//! batch as a PUB message `(topic, sequence number, payload)` (from an XPUB
//! socket, which SUB subscribers cannot tell from PUB and which lets the
//! publisher [wait for them](Publisher::wait_for_subscribers)) and answers
//! replay requests on a ROUTER socket, and a [`Subscriber`] that repairs gaps
//! in the sequence from that replay socket.
//!
//! Wire facts (vLLM 0.33, `vllm/distributed/kv_events.py`):
//!
//! - every batch is one multipart message: the topic (UTF-8, default empty),
//!   the sequence number as 8 bytes big-endian (from 0), the msgpack payload;
//! - an endpoint with `*` or `::` in it, or an `ipc://`/`inproc://` one, is
//!   bound, any other connected;
//! - the replay ROUTER keeps the last `buffer_steps` payloads; a client sends
//!   `[b"", start sequence as 8 bytes big-endian]` from a DEALER socket and
//!   receives one message `[b"", topic, seq, payload]` per buffered batch
//!   from `start` on, then the end marker `[b"", b"", -1 as 8 bytes
//!   big-endian, b""]`. (A REQ socket can send the request too, but takes
//!   only the first message of the answer: use a DEALER.)
//!
//! What the peers on the other end may do, and what we promise then:
//!
//! - A [`Subscriber`] never delivers a batch twice or out of order, and
//!   accounts for every sequence number as delivered or lost
//!   ([`Received::lost`]); a publisher that restarts and numbers from 0
//!   again is reported ([`Received::restarted`]), and its new numbers are
//!   followed. [`Subscriber::recv`] returns within its timeout whatever the
//!   peers send or withhold; a replay that does not answer within
//!   [`SubscriberConfig::replay_timeout`] counts the gap lost and delivery
//!   goes on. Malformed frames, other topics and undecodable payloads are
//!   counted ([`SubscriberStats`]), never errors that stop the stream;
//!   messages over [`SubscriberConfig::max_message_bytes`] are refused by
//!   ZeroMQ before they are allocated.
//! - A [`Publisher`]'s replay thread survives interrupted polls (a signal
//!   with a handler), malformed requests and peers that ask too often
//!   ([`PublisherConfig::replay_requests_per_s`] per peer, the rest refused
//!   and counted in [`PublisherStats`]); answering copies no payload under
//!   the buffer's lock, so replays never hold up `publish`.

mod order;
mod publisher;
mod replay_server;
mod subscriber;

use std::time::{Duration, Instant};

pub use publisher::{Publisher, PublisherConfig, PublisherStats};
pub use subscriber::{Received, Subscriber, SubscriberConfig, SubscriberStats};

use crate::EventError;

/// The replay end marker's sequence field: -1 as a signed 8-byte integer.
const END_OF_REPLAY: [u8; 8] = (-1i64).to_be_bytes();

/// `endpoint`, if ZeroMQ can take it (the `zmq` crate panics on a NUL
/// byte in one).
fn checked_endpoint(endpoint: &str) -> Result<&str, EventError> {
    if endpoint.contains('\0') {
        return Err(EventError::Protocol(format!(
            "endpoint {endpoint:?} has a NUL byte"
        )));
    }
    Ok(endpoint)
}

/// Binds `endpoint` the way vLLM decides to, or connects it.
fn attach(socket: &zmq::Socket, endpoint: &str) -> Result<(), EventError> {
    let endpoint = checked_endpoint(endpoint)?;
    let binds = endpoint.contains('*')
        || endpoint.contains("::")
        || endpoint.starts_with("ipc://")
        || endpoint.starts_with("inproc://");
    if binds {
        socket.bind(endpoint)?;
    } else {
        socket.connect(endpoint)?;
    }
    Ok(())
}

/// The endpoint a socket is bound to (its port resolved), or `requested`.
fn resolved(socket: &zmq::Socket, requested: &str) -> String {
    match socket.get_last_endpoint() {
        Ok(Ok(endpoint)) if !endpoint.is_empty() => endpoint,
        _ => requested.to_owned(),
    }
}

/// A point in time to give up at, or never (a timeout too long for the
/// clock to represent, such as `Duration::MAX`, waits without end).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Deadline(Option<Instant>);

impl Deadline {
    /// `timeout` from now.
    fn after(timeout: Duration) -> Self {
        Self(Instant::now().checked_add(timeout))
    }

    /// The earlier of the two.
    fn min(self, other: Self) -> Self {
        match (self.0, other.0) {
            (Some(a), Some(b)) => Self(Some(a.min(b))),
            (a, b) => Self(a.or(b)),
        }
    }

    /// Whether it has passed.
    fn passed(self) -> bool {
        self.0.is_some_and(|at| Instant::now() >= at)
    }

    /// The time left as a `zmq_poll` timeout: milliseconds rounded up (so a
    /// poll never wakes just before the deadline and spins), -1 for never.
    fn poll_millis(self) -> i64 {
        let Some(at) = self.0 else {
            return -1;
        };
        let left = at.saturating_duration_since(Instant::now());
        let millis = left.as_nanos().div_ceil(1_000_000);
        i64::try_from(millis).unwrap_or(i64::MAX)
    }
}

/// Whether a socket error is a signal interrupting a blocking call: try
/// again (a process with a SIGTERM handler or a profiler sees many).
fn interrupted(error: &zmq::Error) -> bool {
    *error == zmq::Error::EINTR
}

/// Polls `socket` for input until `deadline`, retrying interrupted polls;
/// whether a message is ready.
fn wait_readable(socket: &zmq::Socket, deadline: Deadline) -> Result<bool, EventError> {
    loop {
        match socket.poll(zmq::POLLIN, deadline.poll_millis()) {
            Ok(ready) => return Ok(ready > 0),
            Err(error) if interrupted(&error) && !deadline.passed() => {}
            Err(error) if interrupted(&error) => return Ok(false),
            Err(error) => return Err(error.into()),
        }
    }
}

/// One multipart message if one is ready now, retrying interrupted reads.
fn recv_ready(socket: &zmq::Socket) -> Result<Option<Vec<Vec<u8>>>, EventError> {
    loop {
        match socket.recv_multipart(zmq::DONTWAIT) {
            Ok(frames) => return Ok(Some(frames)),
            Err(zmq::Error::EAGAIN) => return Ok(None),
            Err(error) if interrupted(&error) => {}
            Err(error) => return Err(error.into()),
        }
    }
}
