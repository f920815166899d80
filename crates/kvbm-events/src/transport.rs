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
//!   `[b"", start sequence as 8 bytes big-endian]` (a DEALER with an empty
//!   delimiter, or a REQ) and receives `[b"", topic, seq, payload]` for every
//!   buffered batch from `start` on, then the end marker
//!   `[b"", b"", -1 as 8 bytes big-endian, b""]`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::{EventError, KvEventBatch, decode, encode};

/// The replay end marker's sequence field: -1 as a signed 8-byte integer.
const END_OF_REPLAY: [u8; 8] = (-1i64).to_be_bytes();

/// How often the replay thread looks for a stop request between requests.
const REPLAY_POLL_MS: i64 = 50;

/// Where and how a [`Publisher`] sends (vLLM's defaults).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PublisherConfig {
    /// The PUB endpoint (default `tcp://*:5557`; `tcp://127.0.0.1:*` binds
    /// an ephemeral port, see [`Publisher::endpoint`]).
    pub endpoint: String,
    /// The replay ROUTER endpoint; `None` (the default) serves no replay.
    pub replay_endpoint: Option<String>,
    /// The topic frame of every message (default empty).
    pub topic: String,
    /// Batches kept for replay (default 10,000).
    pub buffer_steps: usize,
    /// The PUB socket's send high-water mark (default 100,000).
    pub high_water_mark: i32,
    /// Time to wait before the first batch, so that subscribers connecting
    /// now are listening when it goes out (ZeroMQ drops messages for
    /// subscribers that have not joined yet: the slow-joiner problem).
    pub first_batch_delay: Duration,
}

impl Default for PublisherConfig {
    fn default() -> Self {
        Self {
            endpoint: "tcp://*:5557".to_owned(),
            replay_endpoint: None,
            topic: String::new(),
            buffer_steps: 10_000,
            high_water_mark: 100_000,
            first_batch_delay: Duration::ZERO,
        }
    }
}

impl PublisherConfig {
    /// The defaults with another PUB endpoint.
    pub fn new(endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            ..Self::default()
        }
    }

    /// Sets [`replay_endpoint`](Self::replay_endpoint).
    pub fn with_replay(mut self, endpoint: impl Into<String>) -> Self {
        self.replay_endpoint = Some(endpoint.into());
        self
    }

    /// Sets [`topic`](Self::topic).
    pub fn with_topic(mut self, topic: impl Into<String>) -> Self {
        self.topic = topic.into();
        self
    }

    /// Sets [`buffer_steps`](Self::buffer_steps).
    pub fn with_buffer_steps(mut self, steps: usize) -> Self {
        self.buffer_steps = steps;
        self
    }

    /// Sets [`first_batch_delay`](Self::first_batch_delay).
    pub fn with_first_batch_delay(mut self, delay: Duration) -> Self {
        self.first_batch_delay = delay;
        self
    }
}

/// Binds `endpoint` the way vLLM decides to, or connects it.
fn attach(socket: &zmq::Socket, endpoint: &str) -> Result<(), EventError> {
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

/// The batches kept for replay: `(sequence number, payload)`, oldest first.
type ReplayBuffer = Arc<Mutex<VecDeque<(u64, Vec<u8>)>>>;

/// Publishes [`KvEventBatch`]es on vLLM's wire.
///
/// ```no_run
/// use kvbm_events::{KvEvent, KvEventBatch, Publisher, PublisherConfig};
///
/// let config = PublisherConfig::new("tcp://*:5557").with_replay("tcp://*:5558");
/// let mut publisher = Publisher::new(&config)?;
/// let seq = publisher.publish(&KvEventBatch::new(0.0, vec![KvEvent::AllBlocksCleared]))?;
/// assert_eq!(seq, 0);
/// # Ok::<(), kvbm_events::EventError>(())
/// ```
pub struct Publisher {
    _context: zmq::Context,
    socket: zmq::Socket,
    endpoint: String,
    replay_endpoint: Option<String>,
    topic: Vec<u8>,
    next_seq: u64,
    buffer: ReplayBuffer,
    buffer_steps: usize,
    pending_delay: Option<Duration>,
    replay: Option<ReplayThread>,
    /// Subscriptions seen by `wait_for_subscribers`.
    subscribers: usize,
}

impl Publisher {
    /// Opens the PUB socket (and the replay ROUTER, served by a thread of
    /// its own).
    ///
    /// # Errors
    ///
    /// [`EventError::Transport`] if an endpoint cannot be bound or
    /// connected.
    pub fn new(config: &PublisherConfig) -> Result<Self, EventError> {
        let context = zmq::Context::new();
        let socket = context.socket(zmq::XPUB)?;
        socket.set_sndhwm(config.high_water_mark)?;
        socket.set_linger(0)?;
        attach(&socket, &config.endpoint)?;
        let endpoint = resolved(&socket, &config.endpoint);
        let buffer: ReplayBuffer = Arc::default();
        let (replay, replay_endpoint) = match &config.replay_endpoint {
            None => (None, None),
            Some(requested) => {
                let router = context.socket(zmq::ROUTER)?;
                let hwm = i32::try_from(config.buffer_steps.saturating_add(1).saturating_mul(2))
                    .unwrap_or(i32::MAX);
                router.set_sndhwm(hwm)?;
                router.set_linger(0)?;
                attach(&router, requested)?;
                let endpoint = resolved(&router, requested);
                let thread =
                    ReplayThread::spawn(router, Arc::clone(&buffer), config.topic.clone())?;
                (Some(thread), Some(endpoint))
            }
        };
        Ok(Self {
            _context: context,
            socket,
            endpoint,
            replay_endpoint,
            topic: config.topic.clone().into_bytes(),
            next_seq: 0,
            buffer,
            buffer_steps: config.buffer_steps,
            pending_delay: Some(config.first_batch_delay).filter(|d| !d.is_zero()),
            replay,
            subscribers: 0,
        })
    }

    /// The PUB endpoint, with an ephemeral port resolved.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The replay endpoint, with an ephemeral port resolved.
    pub fn replay_endpoint(&self) -> Option<&str> {
        self.replay_endpoint.as_deref()
    }

    /// Waits until `count` subscriptions have arrived (ZeroMQ delivers
    /// messages only to subscribers that have joined: the slow-joiner
    /// problem), or `timeout` has passed; the number seen. Call before the
    /// first batch when the consumers are known to be connecting.
    ///
    /// # Errors
    ///
    /// [`EventError::Transport`] if the socket fails.
    pub fn wait_for_subscribers(
        &mut self,
        count: usize,
        timeout: Duration,
    ) -> Result<usize, EventError> {
        let deadline = Instant::now() + timeout;
        while self.subscribers < count {
            let left = deadline.saturating_duration_since(Instant::now());
            let millis = i64::try_from(left.as_millis()).unwrap_or(i64::MAX);
            if left.is_zero() || self.socket.poll(zmq::POLLIN, millis)? == 0 {
                break;
            }
            // A subscription message: 1 then the topic (0 then the topic
            // for an unsubscription).
            let message = self.socket.recv_bytes(0)?;
            match message.first() {
                Some(1) => self.subscribers += 1,
                Some(0) => self.subscribers = self.subscribers.saturating_sub(1),
                _ => {}
            }
        }
        Ok(self.subscribers)
    }

    /// The sequence number the next batch gets.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Sends `batch` and keeps it for replay; its sequence number.
    ///
    /// # Errors
    ///
    /// [`EventError::Encode`] or [`EventError::Transport`]; the sequence
    /// number is not used up then.
    pub fn publish(&mut self, batch: &KvEventBatch) -> Result<u64, EventError> {
        self.publish_payload(encode(batch)?)
    }

    /// Sends an already encoded batch (from [`encode`] or
    /// [`WireFormat::encode`](crate::WireFormat::encode)) and keeps it for
    /// replay; its sequence number.
    ///
    /// # Errors
    ///
    /// [`EventError::Transport`]; the sequence number is not used up then.
    pub fn publish_payload(&mut self, payload: Vec<u8>) -> Result<u64, EventError> {
        if let Some(delay) = self.pending_delay.take() {
            std::thread::sleep(delay);
        }
        let seq = self.next_seq;
        self.socket
            .send_multipart([&self.topic[..], &seq.to_be_bytes()[..], &payload[..]], 0)?;
        self.next_seq += 1;
        if self.replay.is_some() && self.buffer_steps > 0 {
            let mut buffer = self.buffer.lock().unwrap_or_else(PoisonError::into_inner);
            if buffer.len() >= self.buffer_steps {
                buffer.pop_front();
            }
            buffer.push_back((seq, payload));
        }
        Ok(seq)
    }
}

impl Publisher {
    /// Closes the sockets, giving messages still queued up to `linger` to
    /// leave (dropping a publisher discards them at once).
    pub fn close(self, linger: Duration) {
        let millis = i32::try_from(linger.as_millis()).unwrap_or(i32::MAX);
        // A socket that refuses the option closes as it would have anyway.
        let _ = self.socket.set_linger(millis);
    }
}

impl Drop for Publisher {
    fn drop(&mut self) {
        if let Some(replay) = self.replay.take() {
            replay.stop();
        }
    }
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("endpoint", &self.endpoint)
            .field("replay_endpoint", &self.replay_endpoint)
            .field("next_seq", &self.next_seq)
            .finish_non_exhaustive()
    }
}

/// The thread that answers replay requests on the ROUTER socket.
struct ReplayThread {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<()>,
}

impl ReplayThread {
    fn spawn(router: zmq::Socket, buffer: ReplayBuffer, topic: String) -> Result<Self, EventError> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("kv-events-replay".to_owned())
            .spawn(move || serve_replay(&router, &buffer, topic.as_bytes(), &stopping))
            .map_err(|e| EventError::Protocol(format!("cannot start the replay thread: {e}")))?;
        Ok(Self { stop, handle })
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.handle.join();
    }
}

/// Answers replay requests until `stop` is set. A malformed request is
/// ignored (answering it could only confuse the client further).
fn serve_replay(router: &zmq::Socket, buffer: &ReplayBuffer, topic: &[u8], stop: &AtomicBool) {
    while !stop.load(Ordering::Acquire) {
        match router.poll(zmq::POLLIN, REPLAY_POLL_MS) {
            Ok(0) => continue,
            Ok(_) => {}
            Err(_) => return,
        }
        let Ok(frames) = router.recv_multipart(0) else {
            continue;
        };
        // [identity, b"", start] from a DEALER or a REQ.
        let [identity, empty, start] = &frames[..] else {
            continue;
        };
        let Ok(start) = <[u8; 8]>::try_from(&start[..]) else {
            continue;
        };
        if !empty.is_empty() {
            continue;
        }
        let start = u64::from_be_bytes(start);
        let batches: Vec<(u64, Vec<u8>)> = buffer
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|(seq, _)| *seq >= start)
            .cloned()
            .collect();
        for (seq, payload) in &batches {
            let frames = [
                &identity[..],
                b"",
                topic,
                &seq.to_be_bytes()[..],
                &payload[..],
            ];
            if router.send_multipart(frames, 0).is_err() {
                break;
            }
        }
        let _ = router.send_multipart([&identity[..], b"", b"", &END_OF_REPLAY[..], b""], 0);
    }
}

/// Receives batches from a [`Publisher`] (or vLLM), in sequence order,
/// repairing gaps from the replay socket when one is given.
pub struct Subscriber {
    _context: zmq::Context,
    socket: zmq::Socket,
    replay: Option<zmq::Socket>,
    /// The sequence number expected next; `None` until the first message.
    expected: Option<u64>,
    /// Batches lost for good (missed, and not in the replay buffer).
    lost: u64,
    /// Batches recovered through replay.
    repaired: u64,
}

impl Subscriber {
    /// Subscribes to `topic` at `endpoint`, with `replay_endpoint` for gap
    /// repair. With `from` set, a first message after it counts as a gap
    /// (a subscriber that must see everything from sequence `from` on).
    ///
    /// # Errors
    ///
    /// [`EventError::Transport`] if an endpoint cannot be connected.
    pub fn new(
        endpoint: &str,
        replay_endpoint: Option<&str>,
        topic: &str,
        from: Option<u64>,
    ) -> Result<Self, EventError> {
        let context = zmq::Context::new();
        let socket = context.socket(zmq::SUB)?;
        socket.set_linger(0)?;
        socket.connect(endpoint)?;
        socket.set_subscribe(topic.as_bytes())?;
        let replay = match replay_endpoint {
            None => None,
            Some(endpoint) => {
                let dealer = context.socket(zmq::DEALER)?;
                dealer.set_linger(0)?;
                dealer.connect(endpoint)?;
                Some(dealer)
            }
        };
        Ok(Self {
            _context: context,
            socket,
            replay,
            expected: from,
            lost: 0,
            repaired: 0,
        })
    }

    /// Batches lost for good so far (a gap the replay buffer no longer held,
    /// or with no replay socket): the consumer should resynchronize.
    pub fn lost(&self) -> u64 {
        self.lost
    }

    /// Batches recovered through replay so far.
    pub fn repaired(&self) -> u64 {
        self.repaired
    }

    /// The next message's batches, in sequence order: the one received and,
    /// if it skipped sequence numbers, the missing ones before it from the
    /// replay socket. `None` if nothing arrived within `timeout`.
    ///
    /// # Errors
    ///
    /// [`EventError::Transport`], [`EventError::Protocol`] for frames that
    /// are not `(topic, 8-byte sequence number, payload)`, or
    /// [`EventError::Decode`] for a payload that is not a batch.
    pub fn recv(
        &mut self,
        timeout: Duration,
    ) -> Result<Option<Vec<(u64, KvEventBatch)>>, EventError> {
        let millis = i64::try_from(timeout.as_millis()).unwrap_or(i64::MAX);
        if self.socket.poll(zmq::POLLIN, millis)? == 0 {
            return Ok(None);
        }
        let frames = self.socket.recv_multipart(0)?;
        let (seq, payload) = message(&frames)?;
        let mut out = Vec::new();
        if let Some(expected) = self.expected
            && seq > expected
        {
            let recovered = self.replay_range(expected, seq, timeout)?;
            self.repaired += recovered.len() as u64;
            self.lost += (seq - expected) - recovered.len() as u64;
            out.extend(recovered);
        }
        if self.expected.is_none_or(|expected| seq >= expected) {
            out.push((seq, decode(payload)?));
            self.expected = Some(seq + 1);
        }
        Ok(Some(out))
    }

    /// Batches `from .. until` from the replay socket (those it still has).
    fn replay_range(
        &mut self,
        from: u64,
        until: u64,
        timeout: Duration,
    ) -> Result<Vec<(u64, KvEventBatch)>, EventError> {
        let Some(dealer) = &self.replay else {
            return Ok(Vec::new());
        };
        dealer.send_multipart([&b""[..], &from.to_be_bytes()[..]], 0)?;
        let deadline = Instant::now() + timeout;
        let mut out = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let millis = i64::try_from(left.as_millis()).unwrap_or(i64::MAX);
            if dealer.poll(zmq::POLLIN, millis)? == 0 {
                return Err(EventError::Protocol(
                    "replay did not finish in time".to_owned(),
                ));
            }
            let frames = dealer.recv_multipart(0)?;
            // [b"", topic, seq, payload], or the end marker.
            let Some((empty, rest)) = frames.split_first() else {
                continue;
            };
            if !empty.is_empty() {
                return Err(EventError::Protocol(
                    "replay frame without delimiter".to_owned(),
                ));
            }
            if rest.get(1).is_some_and(|seq| seq[..] == END_OF_REPLAY) {
                return Ok(out);
            }
            let (seq, payload) = message(rest)?;
            if (from..until).contains(&seq) {
                out.push((seq, decode(payload)?));
            }
        }
    }
}

impl std::fmt::Debug for Subscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscriber")
            .field("expected", &self.expected)
            .field("lost", &self.lost)
            .field("repaired", &self.repaired)
            .finish_non_exhaustive()
    }
}

/// `(seq, payload)` of a `(topic, seq, payload)` message.
fn message(frames: &[Vec<u8>]) -> Result<(u64, &[u8]), EventError> {
    let [_topic, seq, payload] = frames else {
        return Err(EventError::Protocol(format!(
            "expected 3 frames (topic, sequence, payload), got {}",
            frames.len()
        )));
    };
    let seq = <[u8; 8]>::try_from(&seq[..])
        .map_err(|_| EventError::Protocol(format!("a {}-byte sequence number", seq.len())))?;
    Ok((u64::from_be_bytes(seq), payload))
}
