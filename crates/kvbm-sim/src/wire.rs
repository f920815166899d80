//! [`ZmqEventSink`]: a replay's cache events on vLLM's wire (ZeroMQ PUB
//! frames, msgpack `KVEventBatch`es, an optional replay socket), as
//! `kvbm-sim serve --kv-events` publishes them.
//!
//! Like vLLM's `ZmqEventPublisher`, encoding and sending happen on a thread
//! of their own: the engine hands each step's batch over a bounded channel
//! and goes on. When that thread falls behind, the engine waits (a replay
//! must not lose events; the channel's bound keeps memory bounded).

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Receiver, Sender};
use kvbm_blocks::EventMessage;
use kvbm_events::{EventError, Publisher, PublisherConfig, WireFormat};

use crate::{EventSink, SimError};

/// Handoffs in flight between the engine and the publishing thread.
const IN_FLIGHT: usize = 64;

/// Messages per handoff: waking the publishing thread for every step's
/// batch would cost the engine more than the batch itself.
const PER_HANDOFF: usize = 64;

/// Publishes each message as one vLLM batch, from a thread of its own.
pub struct ZmqEventSink {
    endpoint: String,
    state: State,
    /// Subscriptions seen while waiting.
    subscribers: usize,
    published: u64,
}

/// The engine's side of the channel, with the messages not yet handed off.
///
/// Published messages come back to be dropped here: glibc's allocator locks
/// the allocating thread's arena to free a block from another thread, and
/// the engine allocates all the time, so freeing them on the publishing
/// thread slowed the engine by a third.
struct Handoff {
    sender: Sender<Vec<Tagged>>,
    returned: Receiver<Vec<Tagged>>,
    waiting: Vec<Tagged>,
    /// The lower tiers' media seen so far (shared, so a message's tag costs
    /// no allocation).
    media: Vec<Arc<str>>,
}

/// A message and the medium it is sent with (`None`: the device's, as the
/// sink's `WireFormat` says).
type Tagged = (Option<Arc<str>>, EventMessage);

impl Handoff {
    fn push(&mut self, medium: Option<&str>, message: &EventMessage) -> Result<(), SimError> {
        let medium = medium.map(
            |name| match self.media.iter().find(|known| &***known == name) {
                Some(known) => Arc::clone(known),
                None => {
                    let known: Arc<str> = Arc::from(name);
                    self.media.push(Arc::clone(&known));
                    known
                }
            },
        );
        self.waiting.push((medium, message.clone()));
        if self.waiting.len() >= PER_HANDOFF {
            self.hand_off()?;
        }
        Ok(())
    }

    fn hand_off(&mut self) -> Result<(), SimError> {
        let next = match self.returned.try_recv() {
            Ok(mut published) => {
                published.clear();
                published
            }
            Err(_) => Vec::with_capacity(PER_HANDOFF),
        };
        let messages = std::mem::replace(&mut self.waiting, next);
        self.sender.send(messages).map_err(|_| hung_up())
    }
}

enum State {
    /// Opened, nothing published yet (subscribers can still be awaited).
    Ready(Publisher, WireFormat),
    /// The publishing thread runs; it hands the publisher back at the end.
    Running(Handoff, JoinHandle<Result<Publisher, EventError>>),
    /// Finished: the sockets stay open (for late readers and replay) until
    /// the sink is closed or dropped.
    Finished(Publisher),
    /// Failed, or in transition.
    Done,
}

fn failed(error: EventError) -> SimError {
    SimError::Events {
        reason: error.to_string(),
    }
}

fn hung_up() -> SimError {
    SimError::Events {
        reason: "the publishing thread stopped".to_owned(),
    }
}

impl ZmqEventSink {
    /// Opens the sockets `config` names (binding or connecting as vLLM
    /// decides: an endpoint with `*` binds). Call
    /// [`wait_for_subscribers`](Self::wait_for_subscribers) next when
    /// consumers are connecting: ZeroMQ drops messages for subscribers not
    /// yet joined, so they would miss the first batches (and with them the
    /// parents of later ones).
    ///
    /// # Errors
    ///
    /// [`SimError::Events`] if a socket cannot be opened.
    pub fn new(config: &PublisherConfig, format: WireFormat) -> Result<Self, SimError> {
        let publisher = Publisher::new(config).map_err(failed)?;
        Ok(Self {
            endpoint: publisher.endpoint().to_owned(),
            state: State::Ready(publisher, format),
            subscribers: 0,
            published: 0,
        })
    }

    /// Waits up to `timeout` until `count` subscriptions in all have
    /// arrived (a router and a monitor: 2); the number seen. At once for a
    /// count already reached (0, say), and only before the first batch:
    /// afterwards it answers the number seen while waiting.
    ///
    /// # Errors
    ///
    /// [`SimError::Events`] if the socket fails.
    pub fn wait_for_subscribers(
        &mut self,
        count: usize,
        timeout: Duration,
    ) -> Result<usize, SimError> {
        if let State::Ready(publisher, _) = &mut self.state
            && count > self.subscribers
        {
            self.subscribers = (publisher.wait_for_subscribers(count, timeout)).map_err(failed)?;
        }
        Ok(self.subscribers)
    }

    /// Waits up to `timeout` for a (further) subscriber; whether one came.
    /// Only before the first batch (afterwards it returns `false`).
    ///
    /// # Errors
    ///
    /// [`SimError::Events`] if the socket fails.
    pub fn wait_for_subscriber(&mut self, timeout: Duration) -> Result<bool, SimError> {
        if !matches!(self.state, State::Ready(..)) {
            return Ok(false);
        }
        let before = self.subscribers;
        Ok(self.wait_for_subscribers(before.saturating_add(1), timeout)? > before)
    }

    /// The PUB endpoint, its port resolved.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Batches published, once [`finish`](EventSink::finish)ed.
    pub fn published(&self) -> u64 {
        self.published
    }

    /// Closes the sockets, giving queued messages up to `linger` to leave.
    pub fn close(mut self, linger: Duration) {
        if let State::Finished(publisher) | State::Ready(publisher, _) =
            std::mem::replace(&mut self.state, State::Done)
        {
            publisher.close(linger);
        }
    }

    fn start(publisher: Publisher, format: WireFormat) -> Result<State, SimError> {
        let (sender, receiver) = crossbeam_channel::bounded::<Vec<Tagged>>(IN_FLIGHT);
        // Room for every handoff, so the publishing thread never waits to
        // give one back.
        let (give_back, returned) = crossbeam_channel::bounded(IN_FLIGHT + 2);
        let thread = std::thread::Builder::new()
            .name("kv-events".to_owned())
            .spawn(move || {
                let mut publisher = publisher;
                // The device's format, and one per lower tier's medium.
                let mut formats: Vec<(Arc<str>, WireFormat)> = Vec::new();
                for messages in receiver {
                    for (medium, message) in &messages {
                        // Stamped like vLLM's (`time.time()`): wall-clock seconds.
                        let ts = (SystemTime::now().duration_since(UNIX_EPOCH))
                            .map_or(0.0, |since| since.as_secs_f64());
                        let format = match medium {
                            None => &format,
                            Some(medium) => {
                                let at = match formats.iter().position(|(m, _)| m == medium) {
                                    Some(at) => at,
                                    None => {
                                        let tier =
                                            (format.clone()).with_medium(Some(medium.to_string()));
                                        formats.push((Arc::clone(medium), tier));
                                        formats.len() - 1
                                    }
                                };
                                &formats[at].1
                            }
                        };
                        publisher.publish_payload(format.encode(message, ts)?)?;
                    }
                    // Full only if the engine stopped taking them back: then
                    // dropping here is all that is left.
                    let _ = give_back.try_send(messages);
                }
                Ok(publisher)
            })
            .map_err(|error| SimError::Events {
                reason: format!("cannot start the publishing thread: {error}"),
            })?;
        let handoff = Handoff {
            sender,
            returned,
            waiting: Vec::with_capacity(PER_HANDOFF),
            media: Vec::new(),
        };
        Ok(State::Running(handoff, thread))
    }
}

impl ZmqEventSink {
    /// Hands `message` to the publishing thread (starting it at the first),
    /// to go out with `medium` (`None`: the device's).
    fn send(&mut self, medium: Option<&str>, message: &EventMessage) -> Result<(), SimError> {
        if let State::Ready(..) = self.state
            && let State::Ready(publisher, format) = std::mem::replace(&mut self.state, State::Done)
        {
            self.state = Self::start(publisher, format)?;
        }
        match &mut self.state {
            State::Running(handoff, _) => handoff.push(medium, message),
            State::Ready(..) | State::Finished(_) | State::Done => Err(hung_up()),
        }
    }
}

impl EventSink for ZmqEventSink {
    fn publish(&mut self, message: &EventMessage) -> Result<(), SimError> {
        self.send(None, message)
    }

    /// A lower tier's stores and removals go out on the same stream, with
    /// their medium (`"CPU"`, `"DISK"`) in every event, as vLLM's
    /// offloading connector publishes its tiers'.
    fn publish_on(&mut self, medium: &str, message: &EventMessage) -> Result<(), SimError> {
        if crate::events::is_empty_opening(message) {
            return Ok(());
        }
        self.send(Some(medium), message)
    }

    fn finish(&mut self) -> Result<(), SimError> {
        if let State::Running(mut handoff, thread) = std::mem::replace(&mut self.state, State::Done)
        {
            if !handoff.waiting.is_empty() {
                handoff.hand_off()?;
            }
            drop(handoff);
            let publisher = thread.join().map_err(|_| hung_up())?.map_err(failed)?;
            self.published = publisher.next_seq();
            self.state = State::Finished(publisher);
        }
        Ok(())
    }
}

impl std::fmt::Debug for ZmqEventSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZmqEventSink")
            .field("endpoint", &self.endpoint)
            .field("published", &self.published)
            .finish_non_exhaustive()
    }
}
