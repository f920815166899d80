//! The publisher's replay thread: answers `[b"", start]` requests on the
//! ROUTER socket from the buffer of recent payloads.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::publisher::PublisherStats;
use super::{END_OF_REPLAY, interrupted};
use crate::EventError;

/// The batches kept for replay: `(sequence number, payload)`, oldest first,
/// numbers consecutive. Payloads are shared, so answering a request clones
/// pointers under the lock, never bytes.
pub(super) type ReplayBuffer = Arc<Mutex<VecDeque<(u64, Arc<Vec<u8>>)>>>;

/// How often the replay thread looks for a stop request between requests.
const REPLAY_POLL_MS: i64 = 50;

/// Peers whose request rate is tracked at once; past it, idle peers (and
/// then the longest silent one) are forgotten, so a peer that reconnects
/// under ever new identities cannot grow the table.
const MAX_TRACKED_PEERS: usize = 1024;

/// What the replay thread counts, read by [`Publisher::stats`](super::Publisher::stats).
#[derive(Debug, Default)]
pub(super) struct ReplayCounters {
    served: AtomicU64,
    refused: AtomicU64,
    malformed: AtomicU64,
}

impl ReplayCounters {
    pub(super) fn snapshot(&self) -> PublisherStats {
        PublisherStats {
            published: 0,
            replays_served: self.served.load(Ordering::Relaxed),
            replays_refused: self.refused.load(Ordering::Relaxed),
            replay_requests_malformed: self.malformed.load(Ordering::Relaxed),
        }
    }

    fn count(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

/// The thread that answers replay requests on the ROUTER socket.
pub(super) struct ReplayThread {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<()>,
}

impl ReplayThread {
    pub(super) fn spawn(
        router: zmq::Socket,
        buffer: ReplayBuffer,
        topic: Vec<u8>,
        limits: Limits,
        counters: Arc<ReplayCounters>,
    ) -> Result<Self, EventError> {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("kv-events-replay".to_owned())
            .spawn(move || {
                let server = ReplayServer {
                    router,
                    buffer,
                    topic,
                    limiter: Limiter::new(limits.requests_per_s),
                    bytes: ByteBudget::new(limits.bytes_per_s, Instant::now()),
                    counters,
                };
                server.run(&stopping);
            })
            .map_err(|e| EventError::Protocol(format!("cannot start the replay thread: {e}")))?;
        Ok(Self { stop, handle })
    }

    pub(super) fn stop(self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.handle.join();
    }
}

struct ReplayServer {
    router: zmq::Socket,
    buffer: ReplayBuffer,
    topic: Vec<u8>,
    limiter: Limiter,
    bytes: ByteBudget,
    counters: Arc<ReplayCounters>,
}

impl ReplayServer {
    /// Answers requests until `stop` is set. An interrupted poll (a signal
    /// with a handler) is retried; a persistent error is retried after a
    /// pause rather than ending the thread, which would leave the endpoint
    /// bound with nobody answering. Only a closed context ends it early.
    fn run(mut self, stop: &AtomicBool) {
        while !stop.load(Ordering::Acquire) {
            match self.router.poll(zmq::POLLIN, REPLAY_POLL_MS) {
                Ok(0) => continue,
                Ok(_) => {}
                Err(zmq::Error::ETERM) => return,
                Err(error) if interrupted(&error) => continue,
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(REPLAY_POLL_MS.unsigned_abs()));
                    continue;
                }
            }
            match self.router.recv_multipart(zmq::DONTWAIT) {
                Ok(frames) => self.answer(&frames),
                Err(zmq::Error::ETERM) => return,
                Err(_) => {}
            }
        }
    }

    /// Answers one request. A malformed one is ignored (answering it could
    /// only confuse the client further), a peer over its rate gets nothing.
    fn answer(&mut self, frames: &[Vec<u8>]) {
        // [identity, b"", start] from a DEALER.
        let Some(start) = parse_request(frames) else {
            ReplayCounters::count(&self.counters.malformed);
            return;
        };
        let identity = &frames[0];
        let now = Instant::now();
        if !self.limiter.allow(identity, now) {
            ReplayCounters::count(&self.counters.refused);
            return;
        }
        let batches = self.buffered_from(start);
        let bytes = batches
            .iter()
            .map(|(_, payload)| payload.len() as u64)
            .sum();
        if !self.bytes.take(bytes, now) {
            ReplayCounters::count(&self.counters.refused);
            return;
        }
        ReplayCounters::count(&self.counters.served);
        for (seq, payload) in &batches {
            let frames = [
                &identity[..],
                b"",
                &self.topic[..],
                &seq.to_be_bytes()[..],
                &payload[..],
            ];
            // A peer past its high-water mark, or gone, misses the rest:
            // its repair ends at its timeout and counts the gap lost.
            if self.router.send_multipart(frames, zmq::DONTWAIT).is_err() {
                return;
            }
        }
        let _ = self.router.send_multipart(
            [&identity[..], b"", b"", &END_OF_REPLAY[..], b""],
            zmq::DONTWAIT,
        );
    }

    /// The buffered batches numbered `start` or later (pointers, cloned
    /// under the lock; the bytes are copied into messages outside it).
    fn buffered_from(&self, start: u64) -> Vec<(u64, Arc<Vec<u8>>)> {
        let buffer = self.buffer.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(&(oldest, _)) = buffer.front() else {
            return Vec::new();
        };
        let skip = usize::try_from(start.saturating_sub(oldest)).unwrap_or(usize::MAX);
        buffer.iter().skip(skip).cloned().collect()
    }
}

/// The start sequence of a `[identity, b"", 8-byte start]` request.
fn parse_request(frames: &[Vec<u8>]) -> Option<u64> {
    let [_identity, empty, start] = frames else {
        return None;
    };
    if !empty.is_empty() {
        return None;
    }
    Some(u64::from_be_bytes(<[u8; 8]>::try_from(&start[..]).ok()?))
}

/// The replay thread's limits ([`PublisherConfig`](super::PublisherConfig)'s).
#[derive(Clone, Copy, Debug)]
pub(super) struct Limits {
    pub(super) requests_per_s: u32,
    pub(super) bytes_per_s: u64,
}

/// Bytes all answers may copy: a bucket of a second's worth, refilled
/// continuously. A take larger than what is left is allowed only from a
/// full bucket, which it leaves in debt, so no answer is refused forever.
#[derive(Debug)]
struct ByteBudget {
    per_s: f64,
    tokens: f64,
    at: Instant,
}

impl ByteBudget {
    /// `per_s` bytes a second; 0: no limit.
    fn new(per_s: u64, now: Instant) -> Self {
        let per_s = if per_s == 0 {
            f64::INFINITY
        } else {
            per_s as f64
        };
        Self {
            per_s,
            tokens: per_s,
            at: now,
        }
    }

    fn take(&mut self, bytes: u64, now: Instant) -> bool {
        if self.per_s.is_infinite() {
            return true;
        }
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.per_s).min(self.per_s);
        self.at = now;
        let bytes = bytes as f64;
        if bytes <= self.tokens || self.tokens >= self.per_s {
            self.tokens -= bytes;
            true
        } else {
            false
        }
    }
}

/// Replay requests allowed per peer: a token bucket of `per_s` tokens,
/// refilled at `per_s` a second.
#[derive(Debug)]
struct Limiter {
    per_s: u32,
    peers: HashMap<Vec<u8>, Bucket>,
}

#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Limiter {
    fn new(per_s: u32) -> Self {
        Self {
            per_s,
            peers: HashMap::new(),
        }
    }

    /// Whether `peer` may be answered now (and takes a token if so).
    fn allow(&mut self, peer: &[u8], now: Instant) -> bool {
        if self.per_s == 0 {
            return true;
        }
        let full = f64::from(self.per_s);
        if !self.peers.contains_key(peer) && self.peers.len() >= MAX_TRACKED_PEERS {
            self.forget_some(now);
        }
        let bucket = (self.peers).entry(peer.to_vec()).or_insert(Bucket {
            tokens: full,
            at: now,
        });
        let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * full).min(full);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// Makes room: forgets peers whose bucket has refilled (they would
    /// start full anyway), or else the one silent longest.
    fn forget_some(&mut self, now: Instant) {
        let full = f64::from(self.per_s);
        let before = self.peers.len();
        self.peers.retain(|_, bucket| {
            let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
            bucket.tokens + elapsed * full < full
        });
        if self.peers.len() < before {
            return;
        }
        let oldest = (self.peers.iter())
            .min_by_key(|(_, bucket)| bucket.at)
            .map(|(peer, _)| peer.clone());
        if let Some(peer) = oldest {
            self.peers.remove(&peer);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_gets_its_burst_then_one_request_per_refill() {
        let mut limiter = Limiter::new(2);
        let t0 = Instant::now();
        assert!(limiter.allow(b"a", t0));
        assert!(limiter.allow(b"a", t0));
        assert!(!limiter.allow(b"a", t0), "the burst is spent");
        assert!(limiter.allow(b"b", t0), "another peer has its own");
        assert!(limiter.allow(b"a", t0 + Duration::from_millis(500)));
        assert!(!limiter.allow(b"a", t0 + Duration::from_millis(600)));
    }

    #[test]
    fn the_peer_table_never_outgrows_its_bound() {
        let mut limiter = Limiter::new(1);
        let t0 = Instant::now();
        for peer in 0..(3 * MAX_TRACKED_PEERS as u32) {
            assert!(
                limiter.allow(&peer.to_be_bytes(), t0),
                "a new peer is served"
            );
            assert!(limiter.peers.len() <= MAX_TRACKED_PEERS);
        }
    }

    #[test]
    fn the_byte_budget_refills_and_never_refuses_forever() {
        let t0 = Instant::now();
        let mut budget = ByteBudget::new(1000, t0);
        assert!(budget.take(600, t0));
        assert!(!budget.take(600, t0), "over what is left");
        assert!(budget.take(600, t0 + Duration::from_millis(300)));
        // An answer larger than a second's budget waits for a full bucket.
        assert!(!budget.take(5000, t0 + Duration::from_millis(400)));
        assert!(budget.take(5000, t0 + Duration::from_secs(2)));
        assert!(!budget.take(1, t0 + Duration::from_secs(2)), "in debt");
        assert!(ByteBudget::new(0, t0).take(u64::MAX, t0), "0: no limit");
    }

    #[test]
    fn zero_means_no_limit() {
        let mut limiter = Limiter::new(0);
        let t0 = Instant::now();
        assert!((0..10_000).all(|_| limiter.allow(b"a", t0)));
        assert!(limiter.peers.is_empty());
    }

    #[test]
    fn requests_of_another_shape_are_malformed() {
        let id = b"id".to_vec();
        assert_eq!(
            parse_request(&[id.clone(), vec![], 7u64.to_be_bytes().to_vec()]),
            Some(7)
        );
        assert_eq!(
            parse_request(&[id.clone(), vec![1], 7u64.to_be_bytes().to_vec()]),
            None
        );
        assert_eq!(parse_request(&[id.clone(), vec![], vec![0; 7]]), None);
        assert_eq!(parse_request(&[id.clone(), vec![]]), None);
        assert_eq!(parse_request(&[]), None);
    }
}
