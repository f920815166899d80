//! [`Publisher`]: batches out on the PUB socket, kept for the replay thread.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use super::replay_server::{Limits, ReplayBuffer, ReplayCounters, ReplayThread};
use super::{Deadline, attach, recv_ready, resolved, wait_readable};
use crate::{EventError, KvEventBatch, encode};

/// Subscription messages read per publish (more than any honest fleet sends
/// between two batches; a flood is read at this pace).
const DRAIN_PER_PUBLISH: usize = 1024;

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
    /// Replay requests answered per peer and second (default 10; 0: no
    /// limit). A peer may ask this many at once, then one more every
    /// `1 / replay_requests_per_s` seconds; the rest get no answer and are
    /// counted in [`PublisherStats::replays_refused`]. A subscriber asks
    /// once per gap, so only a peer in a loop meets the limit.
    pub replay_requests_per_s: u32,
    /// Payload bytes all replay answers together may copy per second
    /// (default 256 MiB; 0: no limit): what every peer at once can make the
    /// replay thread copy into ZeroMQ's queues, where an answer waits until
    /// its peer reads it (up to the socket's high-water mark, one answer
    /// and a half, per peer). An answer over the budget is refused whole
    /// (counted in [`PublisherStats::replays_refused`]); one larger than a
    /// second's budget is still served when the budget is full.
    pub replay_bytes_per_s: u64,
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
            replay_requests_per_s: 10,
            replay_bytes_per_s: 256 << 20,
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

    /// Sets [`replay_bytes_per_s`](Self::replay_bytes_per_s).
    pub fn with_replay_bytes_per_s(mut self, bytes: u64) -> Self {
        self.replay_bytes_per_s = bytes;
        self
    }

    /// Sets [`replay_requests_per_s`](Self::replay_requests_per_s).
    pub fn with_replay_requests_per_s(mut self, requests: u32) -> Self {
        self.replay_requests_per_s = requests;
        self
    }
}

/// What a [`Publisher`] has done, and what its replay thread refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PublisherStats {
    /// Batches published.
    pub published: u64,
    /// Replay requests answered.
    pub replays_served: u64,
    /// Replay requests left unanswered because their peer asked more often
    /// than [`PublisherConfig::replay_requests_per_s`], or all answers
    /// together copied more than [`PublisherConfig::replay_bytes_per_s`].
    pub replays_refused: u64,
    /// Replay requests that were not `[b"", 8-byte start]`, ignored.
    pub replay_requests_malformed: u64,
}

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
    counters: Arc<ReplayCounters>,
    published: u64,
    /// Subscriptions seen by `wait_for_subscribers`, per subscribed topic
    /// that is a prefix of ours (only those receive our messages; so at
    /// most `topic.len() + 1` entries, whatever peers subscribe to).
    subscriptions: Vec<(Vec<u8>, usize)>,
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
        // Pass every subscription up, not only a topic's first: two
        // routers subscribing to one topic are two subscribers to wait for.
        socket.set_xpub_verbose(true)?;
        attach(&socket, &config.endpoint)?;
        let endpoint = resolved(&socket, &config.endpoint);
        let buffer: ReplayBuffer = Arc::new(Mutex::new(VecDeque::new()));
        let counters = Arc::new(ReplayCounters::default());
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
                let thread = ReplayThread::spawn(
                    router,
                    Arc::clone(&buffer),
                    config.topic.clone().into_bytes(),
                    Limits {
                        requests_per_s: config.replay_requests_per_s,
                        bytes_per_s: config.replay_bytes_per_s,
                    },
                    Arc::clone(&counters),
                )?;
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
            counters,
            published: 0,
            subscriptions: Vec::new(),
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

    /// What it has published and what its replay thread did.
    pub fn stats(&self) -> PublisherStats {
        let mut stats = self.counters.snapshot();
        stats.published = self.published;
        stats
    }

    /// Waits until `count` subscriptions that receive this publisher's
    /// topic have arrived (ZeroMQ delivers messages only to subscribers
    /// that have joined: the slow-joiner problem), or `timeout` has passed
    /// (`Duration::MAX`: no limit); the number seen. Call before the first
    /// batch when the consumers are known to be connecting.
    ///
    /// Each subscription counts, so two SUB sockets of one topic are two
    /// (and one socket subscribing twice is two as well). A topic's count
    /// drops to zero when ZeroMQ reports its last subscriber gone.
    ///
    /// # Errors
    ///
    /// [`EventError::Transport`] if the socket fails.
    pub fn wait_for_subscribers(
        &mut self,
        count: usize,
        timeout: Duration,
    ) -> Result<usize, EventError> {
        let deadline = Deadline::after(timeout);
        while self.subscribers() < count {
            if !wait_readable(&self.socket, deadline)? {
                break;
            }
            // A subscription message: 1 then the topic (0 then the topic
            // for the last unsubscription of it).
            if let Some(message) = recv_ready(&self.socket)? {
                self.note_subscription(&message.concat());
            }
        }
        Ok(self.subscribers())
    }

    /// Reads the subscription messages that arrived since the last call, at
    /// most [`DRAIN_PER_PUBLISH`] of them: libzmq queues them on the XPUB
    /// socket without limit until they are read, so a peer subscribing in a
    /// loop would otherwise grow our memory.
    fn drain_subscriptions(&mut self) -> Result<(), EventError> {
        for _ in 0..DRAIN_PER_PUBLISH {
            let Some(message) = recv_ready(&self.socket)? else {
                break;
            };
            self.note_subscription(&message.concat());
        }
        Ok(())
    }

    /// Subscriptions counted so far.
    fn subscribers(&self) -> usize {
        self.subscriptions.iter().map(|(_, n)| n).sum()
    }

    fn note_subscription(&mut self, message: &[u8]) {
        let Some((&kind, topic)) = message.split_first() else {
            return;
        };
        // Only subscriptions our topic starts with receive our messages.
        if !self.topic.starts_with(topic) {
            return;
        }
        let at = match self.subscriptions.iter().position(|(t, _)| t == topic) {
            Some(at) => at,
            None => {
                self.subscriptions.push((topic.to_vec(), 0));
                self.subscriptions.len() - 1
            }
        };
        let seen = &mut self.subscriptions[at].1;
        match kind {
            1 => *seen = seen.saturating_add(1),
            0 => *seen = 0,
            _ => {}
        }
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
    /// [`EventError::Protocol`] once every sequence number has been used
    /// (after 2^64 batches).
    pub fn publish_payload(&mut self, payload: Vec<u8>) -> Result<u64, EventError> {
        let seq = self.next_seq;
        let Some(next) = seq.checked_add(1) else {
            return Err(EventError::Protocol(
                "every sequence number has been used".to_owned(),
            ));
        };
        if let Some(delay) = self.pending_delay.take() {
            std::thread::sleep(delay);
        }
        self.drain_subscriptions()?;
        self.socket
            .send_multipart([&self.topic[..], &seq.to_be_bytes()[..], &payload[..]], 0)?;
        self.next_seq = next;
        self.published = self.published.saturating_add(1);
        if self.replay.is_some() && self.buffer_steps > 0 {
            let payload = Arc::new(payload);
            let mut buffer = self.buffer.lock().unwrap_or_else(PoisonError::into_inner);
            if buffer.len() >= self.buffer_steps {
                buffer.pop_front();
            }
            buffer.push_back((seq, payload));
        }
        Ok(seq)
    }

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
