//! [`Subscriber`]: the sockets around the sequencing in `order.rs`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::order::{Core, Live, Replay};
use super::{Deadline, checked_endpoint, interrupted, recv_ready, wait_readable};
use crate::{EventError, KvEventBatch};

/// Names each subscriber's monitor endpoint apart (`inproc://` names are
/// per context, but a name is cheap to keep unique).
static MONITORS: AtomicU64 = AtomicU64::new(0);

/// Where a [`Subscriber`] listens and what it tolerates.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SubscriberConfig {
    /// The publisher's PUB endpoint (connected).
    pub endpoint: String,
    /// Its replay ROUTER endpoint, for gap repair; `None`: gaps are lost.
    pub replay_endpoint: Option<String>,
    /// The topic subscribed to. Messages must carry exactly it (a ZeroMQ
    /// subscription matches prefixes; the others are skipped and counted in
    /// [`SubscriberStats::foreign`]); the empty topic takes every topic.
    pub topic: String,
    /// With a value, the first message after it opens a gap from it (a
    /// subscriber that must see everything from sequence `from` on); `None`
    /// (the default) starts at whatever arrives first.
    pub from: Option<u64>,
    /// How long one gap repair may wait for the replay socket's answer
    /// (default 1 s; `Duration::MAX`: no limit). Past it, what did not
    /// arrive is lost and the live batch is delivered.
    pub replay_timeout: Duration,
    /// The largest message accepted, in bytes (default 64 MiB). ZeroMQ
    /// refuses a longer one before allocating it and drops the connection,
    /// which reconnects; the batch becomes a gap, repaired if the replay
    /// has it (within the same limit).
    pub max_message_bytes: u64,
    /// Messages one replay answer may hold before the repair stops reading
    /// it (default 10,001: vLLM's whole default buffer and the end marker).
    pub max_replay_messages: usize,
}

impl SubscriberConfig {
    /// The defaults, listening at `endpoint`.
    pub fn new(endpoint: impl Into<String>) -> Self {
        Self {
            endpoint: endpoint.into(),
            replay_endpoint: None,
            topic: String::new(),
            from: None,
            replay_timeout: Duration::from_secs(1),
            max_message_bytes: 64 << 20,
            max_replay_messages: 10_001,
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

    /// Sets [`from`](Self::from).
    pub fn with_from(mut self, from: u64) -> Self {
        self.from = Some(from);
        self
    }

    /// Sets [`replay_timeout`](Self::replay_timeout).
    pub fn with_replay_timeout(mut self, timeout: Duration) -> Self {
        self.replay_timeout = timeout;
        self
    }

    /// Sets [`max_message_bytes`](Self::max_message_bytes).
    pub fn with_max_message_bytes(mut self, bytes: u64) -> Self {
        self.max_message_bytes = bytes;
        self
    }

    /// Sets [`max_replay_messages`](Self::max_replay_messages).
    pub fn with_max_replay_messages(mut self, messages: usize) -> Self {
        self.max_replay_messages = messages;
        self
    }
}

/// What one [`Subscriber::recv`] hands over: batches in sequence order,
/// with what was lost right before them.
///
/// A consumer that keeps state from the stream (a router's index) applies
/// it this way: if [`needs_resync`](Self::needs_resync), forget what this
/// publisher said before (its blocks: `AllBlocksCleared`), then apply the
/// batches. Losses and restarts always come before the first batch of a
/// delivery, so that is exact.
///
/// It iterates as `(sequence number, batch)` pairs.
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct Received {
    /// `(sequence number, batch)`, consecutive numbers in increasing order.
    pub batches: Vec<(u64, KvEventBatch)>,
    /// Sequence numbers lost for good just before the first batch (or, with
    /// no batch, just now): missed, and neither in the replay buffer nor
    /// decodable.
    pub lost: u64,
    /// The publisher restarted (its numbers went back, as an engine that
    /// restarts numbers from 0 again) just before the first batch: what it
    /// said before no longer holds.
    pub restarted: bool,
}

impl Received {
    /// Whether the consumer must forget this publisher's earlier state
    /// before applying the batches (something was lost, or it restarted).
    pub fn needs_resync(&self) -> bool {
        self.lost > 0 || self.restarted
    }
}

impl IntoIterator for Received {
    type Item = (u64, KvEventBatch);
    type IntoIter = std::vec::IntoIter<(u64, KvEventBatch)>;

    fn into_iter(self) -> Self::IntoIter {
        self.batches.into_iter()
    }
}

/// What a [`Subscriber`] has seen, counted since it was created (each
/// saturates at `u64::MAX`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SubscriberStats {
    /// Batches delivered.
    pub delivered: u64,
    /// Sequence numbers lost for good.
    pub lost: u64,
    /// Delivered batches that came from the replay socket.
    pub repaired: u64,
    /// Times the publisher's numbers went back (a restart).
    pub restarts: u64,
    /// Messages without vLLM's frames (live or replayed), skipped.
    pub malformed: u64,
    /// Live messages of another topic, skipped.
    pub foreign: u64,
    /// Payloads that were not a batch (their numbers count as lost).
    pub undecodable: u64,
    /// Repairs the replay socket did not finish within the timeout.
    pub replay_timeouts: u64,
    /// Replayed messages refused: outside the gap asked for, repeated, out
    /// of order, or of another topic.
    pub replay_rejected: u64,
    /// Times the live connection dropped and was opened again (a publisher
    /// that went away, or a message over the size limit, after which
    /// ZeroMQ would not reconnect on its own).
    pub reconnects: u64,
}

/// Receives batches from a [`Publisher`](super::Publisher) (or vLLM), in
/// sequence order, repairing gaps from the replay socket when one is
/// given.
///
/// ```no_run
/// use std::time::Duration;
/// use kvbm_events::{Subscriber, SubscriberConfig};
///
/// let config = SubscriberConfig::new("tcp://127.0.0.1:5557").with_replay("tcp://127.0.0.1:5558");
/// let mut subscriber = Subscriber::from_config(&config)?;
/// while let Some(received) = subscriber.recv(Duration::from_secs(1))? {
///     if received.needs_resync() {
///         // forget what this engine told us before
///     }
///     for (seq, batch) in received {
///         println!("{seq}: {} events", batch.events().len());
///     }
/// }
/// # Ok::<(), kvbm_events::EventError>(())
/// ```
pub struct Subscriber {
    context: zmq::Context,
    socket: zmq::Socket,
    endpoint: String,
    /// Tells when the live connection drops (see [`Self::reconnect`]).
    monitor: zmq::Socket,
    replay: Option<ReplayClient>,
    core: Core,
    replay_timeout: Duration,
    /// When the repair in progress gives up.
    repair_deadline: Deadline,
}

/// The DEALER socket that asks for replays. It is replaced after any
/// answer that did not end with its end marker, so the rest of that answer
/// can never be read as the next one's.
struct ReplayClient {
    endpoint: String,
    max_message_bytes: i64,
    dealer: Option<zmq::Socket>,
}

impl Subscriber {
    /// Subscribes to `topic` at `endpoint`, with `replay_endpoint` for gap
    /// repair and the other settings at their defaults
    /// ([`SubscriberConfig`]).
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
        let mut config = SubscriberConfig::new(endpoint).with_topic(topic);
        config.replay_endpoint = replay_endpoint.map(str::to_owned);
        config.from = from;
        Self::from_config(&config)
    }

    /// Subscribes as `config` says.
    ///
    /// # Errors
    ///
    /// [`EventError::Transport`] if an endpoint cannot be connected;
    /// [`EventError::Protocol`] for `max_replay_messages` 0.
    pub fn from_config(config: &SubscriberConfig) -> Result<Self, EventError> {
        if config.max_replay_messages == 0 {
            return Err(EventError::Protocol(
                "max_replay_messages must be at least 1 (the end marker)".to_owned(),
            ));
        }
        let max_message_bytes = i64::try_from(config.max_message_bytes).unwrap_or(i64::MAX);
        let endpoint = checked_endpoint(&config.endpoint)?;
        let context = zmq::Context::new();
        let socket = context.socket(zmq::SUB)?;
        socket.set_linger(0)?;
        socket.set_maxmsgsize(max_message_bytes)?;
        let monitor_endpoint = format!(
            "inproc://kvbm-subscriber-monitor-{}",
            MONITORS.fetch_add(1, Ordering::Relaxed)
        );
        socket.monitor(&monitor_endpoint, zmq::SocketEvent::DISCONNECTED as i32)?;
        let monitor = context.socket(zmq::PAIR)?;
        monitor.set_linger(0)?;
        monitor.connect(&monitor_endpoint)?;
        socket.connect(endpoint)?;
        socket.set_subscribe(config.topic.as_bytes())?;
        let replay = match &config.replay_endpoint {
            None => None,
            Some(endpoint) => Some(ReplayClient {
                endpoint: checked_endpoint(endpoint)?.to_owned(),
                max_message_bytes,
                dealer: None,
            }),
        };
        let mut subscriber = Self {
            context,
            socket,
            endpoint: endpoint.to_owned(),
            monitor,
            replay,
            core: Core::new(
                config.topic.as_bytes(),
                config.from,
                config.max_replay_messages,
            ),
            replay_timeout: config.replay_timeout,
            repair_deadline: Deadline(None),
        };
        // Connect the replay socket now, so the first repair need not wait
        // for it (and a bad endpoint is an error here, not a lost gap).
        subscriber.dealer()?;
        Ok(subscriber)
    }

    /// Sequence numbers lost for good so far (a gap the replay buffer no
    /// longer held, with no replay socket, or undecodable): the consumer
    /// should resynchronize ([`Received::needs_resync`] says when).
    pub fn lost(&self) -> u64 {
        self.core.stats().lost
    }

    /// Batches recovered through replay so far.
    pub fn repaired(&self) -> u64 {
        self.core.stats().repaired
    }

    /// Everything counted so far.
    pub fn stats(&self) -> SubscriberStats {
        self.core.stats()
    }

    /// The next batches in sequence order, with what was lost before them;
    /// `None` if nothing could be delivered within `timeout`
    /// (`Duration::MAX`: wait without limit).
    ///
    /// Returns within `timeout` whatever the peers do. A gap is repaired
    /// from the replay socket for up to
    /// [`replay_timeout`](SubscriberConfig::replay_timeout), across calls if
    /// `timeout` is shorter: meanwhile `recv` answers `None` and the batch
    /// that revealed the gap waits, so order is kept. Malformed messages,
    /// other topics and undecodable payloads are skipped and counted
    /// ([`stats`](Self::stats)); an undecodable batch counts as lost.
    ///
    /// # Errors
    ///
    /// [`EventError::Transport`] only if the live socket itself fails (a
    /// failing replay socket loses the gap and is reopened).
    pub fn recv(&mut self, timeout: Duration) -> Result<Option<Received>, EventError> {
        let deadline = Deadline::after(timeout);
        loop {
            if self.core.repairing() {
                return Ok(self.continue_repair(deadline));
            }
            if self.wait_live(deadline)?
                && let Some(frames) = recv_ready(&self.socket)?
            {
                match self.core.on_live(&frames, self.replay.is_some()) {
                    Live::Skipped => {}
                    Live::Delivered(received) => return Ok(Some(received)),
                    Live::Repair { from } => {
                        self.repair_deadline = Deadline::after(self.replay_timeout);
                        if self.ask_replay(from).is_err() {
                            return Ok(self.core.abandon_repair());
                        }
                        continue;
                    }
                }
            }
            if deadline.passed() {
                return Ok(None);
            }
        }
    }

    /// Polls the live socket until `deadline`, reconnecting it when the
    /// monitor says the connection dropped; whether a message is ready.
    fn wait_live(&mut self, deadline: Deadline) -> Result<bool, EventError> {
        loop {
            let mut items = [
                self.socket.as_poll_item(zmq::POLLIN),
                self.monitor.as_poll_item(zmq::POLLIN),
            ];
            match zmq::poll(&mut items, deadline.poll_millis()) {
                Ok(_) => {}
                Err(error) if interrupted(&error) && !deadline.passed() => continue,
                Err(error) if interrupted(&error) => return Ok(false),
                Err(error) => return Err(error.into()),
            }
            let (live, dropped) = (items[0].is_readable(), items[1].is_readable());
            if dropped {
                self.reconnect()?;
            }
            if live {
                return Ok(true);
            }
            if !dropped || deadline.passed() {
                return Ok(false);
            }
        }
    }

    /// Opens the live connection again after the monitor reported it
    /// dropped. ZeroMQ reconnects on its own after a network failure, but
    /// not after a protocol error, which is what a message over
    /// `max_message_bytes` is: without this, one oversized message would
    /// cut the subscriber off for good. Reconnecting after an ordinary
    /// drop as well costs nothing (the subscription goes with the socket).
    fn reconnect(&mut self) -> Result<(), EventError> {
        let mut dropped = false;
        while let Some(event) = recv_ready(&self.monitor)? {
            let id = event.first().and_then(|frame| frame.get(..2));
            dropped |= id.is_some_and(|id| {
                u16::from_le_bytes([id[0], id[1]]) == zmq::SocketEvent::DISCONNECTED.to_raw()
            });
        }
        if dropped {
            // Not connected any more is fine: the session may be gone.
            let _ = self.socket.disconnect(&self.endpoint);
            self.socket.connect(&self.endpoint)?;
            self.core.note_reconnect();
        }
        Ok(())
    }

    /// Reads the replay answer until the repair settles (`Some`) or
    /// `deadline` passes (`None`: the repair goes on at the next call).
    fn continue_repair(&mut self, deadline: Deadline) -> Option<Received> {
        let until = deadline.min(self.repair_deadline);
        loop {
            match self.read_replay(until) {
                Ok(Some(Replay::Done { received, clean })) => {
                    if !clean {
                        self.drop_dealer();
                    }
                    return Some(received);
                }
                Ok(Some(Replay::Pending) | None) => {}
                // The replay socket failed: the gap is lost, a fresh
                // socket asks next time.
                Err(_) => {
                    self.drop_dealer();
                    return self.core.abandon_repair();
                }
            }
            if self.repair_deadline.passed() {
                self.drop_dealer();
                return self.core.abandon_repair();
            }
            if deadline.passed() {
                return None;
            }
        }
    }

    /// One replay message fed to the core, if one arrives before `until`.
    fn read_replay(&mut self, until: Deadline) -> Result<Option<Replay>, EventError> {
        let Some(dealer) = self.replay.as_ref().and_then(|r| r.dealer.as_ref()) else {
            return Err(EventError::Protocol("no replay socket".to_owned()));
        };
        if !wait_readable(dealer, until)? {
            return Ok(None);
        }
        let Some(frames) = recv_ready(dealer)? else {
            return Ok(None);
        };
        Ok(Some(self.core.on_replay(&frames)))
    }

    /// Sends the replay request for everything from `from` on.
    fn ask_replay(&mut self, from: u64) -> Result<(), EventError> {
        let sent = match self.dealer()? {
            Some(dealer) => dealer
                .send_multipart([&b""[..], &from.to_be_bytes()[..]], zmq::DONTWAIT)
                .map_err(EventError::from),
            None => Err(EventError::Protocol("no replay endpoint".to_owned())),
        };
        if sent.is_err() {
            self.drop_dealer();
        }
        sent
    }

    /// The replay socket, opened (and connected) if it is not.
    fn dealer(&mut self) -> Result<Option<&zmq::Socket>, EventError> {
        let Some(client) = &mut self.replay else {
            return Ok(None);
        };
        if client.dealer.is_none() {
            let dealer = self.context.socket(zmq::DEALER)?;
            dealer.set_linger(0)?;
            dealer.set_maxmsgsize(client.max_message_bytes)?;
            dealer.connect(&client.endpoint)?;
            client.dealer = Some(dealer);
        }
        Ok(client.dealer.as_ref())
    }

    fn drop_dealer(&mut self) {
        if let Some(client) = &mut self.replay {
            client.dealer = None;
        }
    }
}

impl std::fmt::Debug for Subscriber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscriber")
            .field("stats", &self.core.stats())
            .field("repairing", &self.core.repairing())
            .finish_non_exhaustive()
    }
}
