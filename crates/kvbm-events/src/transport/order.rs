//! The subscriber's bookkeeping without sockets: which sequence numbers it
//! has delivered or lost, what a live message or a replay answer changes,
//! and what to hand the consumer. The socket code (`subscriber.rs`) only
//! moves frames in and out of it, so every promise below is checked by a
//! fuzzer that plays arbitrary frames against this type alone.
//!
//! Promises, per *epoch* (the run of sequence numbers of one publisher
//! incarnation; a restart begins a new one at 0):
//! - a sequence number is delivered at most once, in increasing order;
//! - every sequence number from the epoch's first (the first message's, or
//!   `from`) up to the newest one settled is either delivered or counted
//!   lost, exactly once;
//! - a delivery's `lost` numbers all come before its first batch, so a
//!   consumer that resyncs on `lost > 0` and then applies the batches is
//!   exact;
//! - nothing here allocates more than the frames it was given (a replay
//!   answer is kept only while it continues an unbroken run).

use super::{END_OF_REPLAY, Received, SubscriberStats};
use crate::{KvEventBatch, decode};

/// What the subscriber expects next on the live socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    /// Nothing yet: the first message starts the epoch, whatever its number.
    First,
    /// This sequence number.
    At(u64),
    /// `u64::MAX` was settled: any further number means a new epoch.
    Past,
}

impl Next {
    fn after(seq: u64) -> Self {
        seq.checked_add(1).map_or(Self::Past, Self::At)
    }
}

/// A gap being repaired from the replay socket: the numbers `from..until`
/// and the live message at `until` that revealed the gap.
#[derive(Debug)]
struct Repair {
    from: u64,
    until: u64,
    restarted: bool,
    /// The live batch at `until` (`None`: its payload did not decode).
    live: Option<KvEventBatch>,
    /// Replayed batches forming an unbroken run (each one more than the
    /// last); a break drops what came before it.
    run: Vec<(u64, KvEventBatch)>,
    /// The highest number seen in the answer: anything not above it is a
    /// duplicate or out of order.
    last_seen: Option<u64>,
    /// Frames read for this repair, answered or not.
    frames: usize,
}

/// What a live message did.
#[derive(Debug)]
pub(super) enum Live {
    /// Nothing to deliver (malformed, another topic): counted, skipped.
    Skipped,
    /// In order (or settled without a replay): hand this to the consumer.
    Delivered(Received),
    /// A gap: ask the replay socket for everything from `from` on, then feed
    /// its frames to [`Core::on_replay`].
    Repair {
        /// The first missing sequence number.
        from: u64,
    },
}

/// What a replay frame did.
#[derive(Debug)]
pub(super) enum Replay {
    /// The answer goes on.
    Pending,
    /// The repair is settled. `clean` says the answer ended with its end
    /// marker, so nothing more of it can arrive; otherwise the socket may
    /// still receive the rest and must not be asked again.
    Done { received: Received, clean: bool },
}

/// The sequencing state of one subscriber.
#[derive(Debug)]
pub(super) struct Core {
    topic: Vec<u8>,
    next: Next,
    repair: Option<Repair>,
    stats: SubscriberStats,
    /// Frames one replay answer may take before it is cut off.
    max_replay_frames: usize,
}

impl Core {
    /// A subscriber to `topic` (empty: every topic, as ZeroMQ's prefix
    /// subscription to "" receives them all); with `from`, numbers before
    /// the first message down to `from` are a gap to repair.
    pub(super) fn new(topic: &[u8], from: Option<u64>, max_replay_frames: usize) -> Self {
        Self {
            topic: topic.to_vec(),
            next: from.map_or(Next::First, Next::At),
            repair: None,
            stats: SubscriberStats::default(),
            max_replay_frames,
        }
    }

    pub(super) fn stats(&self) -> SubscriberStats {
        self.stats
    }

    /// Counts a reconnection of the live socket.
    pub(super) fn note_reconnect(&mut self) {
        self.stats.reconnects = self.stats.reconnects.saturating_add(1);
    }

    /// Whether a repair waits for replay frames.
    pub(super) fn repairing(&self) -> bool {
        self.repair.is_some()
    }

    /// Whether `topic` is the subscribed one (an empty subscription takes
    /// every topic, since ZeroMQ delivers them all to it).
    fn topic_matches(&self, topic: &[u8]) -> bool {
        self.topic.is_empty() || topic == self.topic
    }

    /// A live `(topic, seq, payload)` message. `can_replay` says whether a
    /// gap can be asked for (else it is settled as lost at once).
    pub(super) fn on_live(&mut self, frames: &[Vec<u8>], can_replay: bool) -> Live {
        debug_assert!(self.repair.is_none(), "live messages wait for the repair");
        let Some((topic, seq, payload)) = split_message(frames) else {
            self.stats.malformed = self.stats.malformed.saturating_add(1);
            return Live::Skipped;
        };
        if !self.topic_matches(topic) {
            self.stats.foreign = self.stats.foreign.saturating_add(1);
            return Live::Skipped;
        }
        let (from, restarted) = match self.next {
            Next::First => (seq, false),
            Next::At(expected) if seq >= expected => (expected, false),
            // Numbered below what we expect: the publisher restarted (a
            // live PUB stream never goes back otherwise).
            Next::At(_) | Next::Past => (0, true),
        };
        let live = self.decode_counted(payload);
        self.repair = Some(Repair {
            from,
            until: seq,
            restarted,
            live,
            run: Vec::new(),
            last_seen: None,
            frames: 0,
        });
        if from < seq && can_replay {
            Live::Repair { from }
        } else {
            Live::Delivered(self.settle())
        }
    }

    /// One message of a replay answer: `[b"", topic, seq, payload]`, or the
    /// end marker. Frames that fit neither, another topic's, numbers outside
    /// the gap, duplicates and numbers out of order are refused (counted).
    pub(super) fn on_replay(&mut self, frames: &[Vec<u8>]) -> Replay {
        let Some(repair) = &mut self.repair else {
            // No repair asked for this: a stray answer. The socket code
            // never reads the replay socket then; count it all the same.
            self.stats.replay_rejected = self.stats.replay_rejected.saturating_add(1);
            return Replay::Pending;
        };
        repair.frames = repair.frames.saturating_add(1);
        let over_budget = repair.frames >= self.max_replay_frames;
        match frames.split_first() {
            Some((empty, rest)) if empty.is_empty() => {
                if is_end_marker(rest) {
                    return Replay::Done {
                        received: self.settle(),
                        clean: true,
                    };
                }
                self.take_replayed(rest);
            }
            _ => self.stats.malformed = self.stats.malformed.saturating_add(1),
        }
        if over_budget {
            return Replay::Done {
                received: self.settle(),
                clean: false,
            };
        }
        Replay::Pending
    }

    /// A replayed `[topic, seq, payload]`, kept if it continues the run.
    fn take_replayed(&mut self, frames: &[Vec<u8>]) {
        let Some((topic, seq, payload)) = split_message(frames) else {
            self.stats.malformed = self.stats.malformed.saturating_add(1);
            return;
        };
        let topic_ok = self.topic_matches(topic);
        let Some(repair) = &mut self.repair else {
            return;
        };
        let fresh = repair.last_seen.is_none_or(|last| seq > last);
        if !topic_ok || !(repair.from..repair.until).contains(&seq) || !fresh {
            self.stats.replay_rejected = self.stats.replay_rejected.saturating_add(1);
            return;
        }
        repair.last_seen = Some(seq);
        let breaks_run =
            (repair.run.last()).is_some_and(|&(last, _)| last.checked_add(1) != Some(seq));
        if breaks_run {
            repair.run.clear();
        }
        match decode(payload) {
            Ok(batch) => repair.run.push((seq, batch)),
            Err(_) => {
                self.stats.undecodable = self.stats.undecodable.saturating_add(1);
                // A hole: nothing before it can be delivered in order.
                if let Some(repair) = &mut self.repair {
                    repair.run.clear();
                }
            }
        }
    }

    /// The replay did not answer in time (or could not be asked): settles
    /// the repair with what arrived.
    pub(super) fn abandon_repair(&mut self) -> Option<Received> {
        self.repair.as_ref()?;
        self.stats.replay_timeouts = self.stats.replay_timeouts.saturating_add(1);
        Some(self.settle())
    }

    /// Ends the repair in progress: the longest unbroken run that reaches
    /// the live message is delivered with it, every other number of the gap
    /// is lost, and the live message's successor is expected next.
    fn settle(&mut self) -> Received {
        let Some(mut repair) = self.repair.take() else {
            return Received::default();
        };
        let reaches_live =
            (repair.run.last()).is_none_or(|&(last, _)| last.checked_add(1) == Some(repair.until));
        if !reaches_live {
            repair.run.clear();
        }
        let gap = repair.until - repair.from;
        let recovered = repair.run.len() as u64;
        let (batches, lost, repaired) = match repair.live {
            Some(batch) => {
                let mut batches = repair.run;
                batches.push((repair.until, batch));
                (batches, gap - recovered, recovered)
            }
            // The live message is a hole at the end: what came before it
            // cannot be applied in order either.
            None => (Vec::new(), gap.saturating_add(1), 0),
        };
        self.stats.repaired = self.stats.repaired.saturating_add(repaired);
        self.stats.delivered = self.stats.delivered.saturating_add(batches.len() as u64);
        self.stats.lost = self.stats.lost.saturating_add(lost);
        if repair.restarted {
            self.stats.restarts = self.stats.restarts.saturating_add(1);
        }
        self.next = Next::after(repair.until);
        Received {
            batches,
            lost,
            restarted: repair.restarted,
        }
    }

    fn decode_counted(&mut self, payload: &[u8]) -> Option<KvEventBatch> {
        let batch = decode(payload).ok();
        if batch.is_none() {
            self.stats.undecodable = self.stats.undecodable.saturating_add(1);
        }
        batch
    }
}

/// `(topic, seq, payload)` of a `[topic, 8-byte seq, payload]` message.
pub(super) fn split_message(frames: &[Vec<u8>]) -> Option<(&[u8], u64, &[u8])> {
    let [topic, seq, payload] = frames else {
        return None;
    };
    let seq = <[u8; 8]>::try_from(&seq[..]).ok()?;
    Some((topic, u64::from_be_bytes(seq), payload))
}

/// Whether `[topic, seq, payload]` is the replay's end marker
/// `[b"", -1, b""]`.
fn is_end_marker(frames: &[Vec<u8>]) -> bool {
    matches!(frames, [topic, seq, payload]
        if topic.is_empty() && seq[..] == END_OF_REPLAY && payload.is_empty())
}

#[cfg(test)]
mod tests;
