//! Scripted peers for the transport tests: a publisher made of raw sockets
//! that sends whatever frames a test says, a replay server that answers
//! each request as the test's script says (honestly, late, never, without
//! its end marker, with duplicates, ...), a consumer that checks every
//! delivery's promises, and a watchdog that turns a hang into a failure.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use kvbm_events::{BlockHash, BlockRemoved, KvEvent, KvEventBatch, Received, Subscriber};

/// How long any one test may run before it counts as hung.
pub(crate) const WATCHDOG: Duration = Duration::from_secs(60);

/// Runs `body` on a thread of its own and fails if it does not finish
/// within [`WATCHDOG`] (a hang becomes a failure, not a stuck CI).
pub(crate) fn bounded<T: Send + 'static>(body: impl FnOnce() -> T + Send + 'static) -> T {
    let (done, finished) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        let out = body();
        let _ = done.send(());
        out
    });
    match finished.recv_timeout(WATCHDOG) {
        Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => thread
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic)),
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("hung for {WATCHDOG:?}"),
    }
}

/// The batch published under `seq`: its timestamp and hash name it, so a
/// batch delivered under another number is caught.
pub(crate) fn batch(seq: u64) -> KvEventBatch {
    KvEventBatch::new(
        seq as f64,
        vec![KvEvent::BlockRemoved(
            BlockRemoved::new(vec![BlockHash::Int(seq)]).with_medium("GPU"),
        )],
    )
}

pub(crate) fn payload(seq: u64) -> Vec<u8> {
    kvbm_events::encode(&batch(seq)).unwrap()
}

/// How the fake replay server answers one request.
#[derive(Clone, Debug)]
pub(crate) enum Answer {
    /// Every recorded batch from the start asked for, then the end marker.
    Honest,
    /// Nothing at all.
    Silent,
    /// The batches, but no end marker.
    NoEndMarker,
    /// An honest answer, after a pause.
    Late(Duration),
    /// Every batch twice, then the end marker.
    Duplicated,
    /// The batches newest first, then the end marker.
    Reversed,
    /// Frames of every wrong shape, then the end marker.
    Garbage,
    /// The batches, then junk without end for a while.
    Flood(Duration),
}

/// Batches the fake publisher has (published or only recorded), for its
/// replay server.
type History = Arc<Mutex<Vec<(u64, Vec<u8>)>>>;

/// A publisher made of raw sockets: an XPUB (so it can wait for the
/// subscription) and a ROUTER answering per script on a thread.
pub(crate) struct FakePublisher {
    _context: zmq::Context,
    xpub: zmq::Socket,
    endpoint: String,
    replay_endpoint: String,
    history: History,
    stop: Arc<AtomicBool>,
    server: Option<JoinHandle<()>>,
}

impl FakePublisher {
    /// Answers replay requests with `answers` in turn, then honestly.
    pub(crate) fn new(answers: Vec<Answer>) -> Self {
        let context = zmq::Context::new();
        let xpub = context.socket(zmq::XPUB).unwrap();
        xpub.set_linger(0).unwrap();
        xpub.set_xpub_verbose(true).unwrap();
        xpub.bind("tcp://127.0.0.1:*").unwrap();
        let endpoint = xpub.get_last_endpoint().unwrap().unwrap();
        let router = context.socket(zmq::ROUTER).unwrap();
        router.set_linger(0).unwrap();
        router.bind("tcp://127.0.0.1:*").unwrap();
        let replay_endpoint = router.get_last_endpoint().unwrap().unwrap();
        let history = History::default();
        let stop = Arc::new(AtomicBool::new(false));
        let server = {
            let (history, stop) = (Arc::clone(&history), Arc::clone(&stop));
            std::thread::spawn(move || serve(&router, &history, answers, &stop))
        };
        Self {
            _context: context,
            xpub,
            endpoint,
            replay_endpoint,
            history,
            stop,
            server: Some(server),
        }
    }

    pub(crate) fn endpoint(&self) -> &str {
        &self.endpoint
    }

    pub(crate) fn replay_endpoint(&self) -> &str {
        &self.replay_endpoint
    }

    /// Waits for a subscription (so nothing sent next is lost to the slow
    /// joiner).
    pub(crate) fn wait_subscribed(&self) {
        self.xpub.set_rcvtimeo(10_000).unwrap();
        let message = self.xpub.recv_bytes(0).expect("a subscription arrives");
        assert_eq!(message.first(), Some(&1), "a subscription");
    }

    /// Sends raw frames on the live socket.
    pub(crate) fn send(&self, frames: &[Vec<u8>]) {
        self.xpub.send_multipart(frames, 0).unwrap();
    }

    /// Keeps `batch(seq)` for replay without sending it (a batch the
    /// subscriber missed).
    pub(crate) fn record(&self, seq: u64) {
        self.history.lock().unwrap().push((seq, payload(seq)));
    }

    /// Records and sends `batch(seq)` under `topic`.
    pub(crate) fn publish(&self, topic: &[u8], seq: u64) {
        self.record(seq);
        self.send(&[topic.to_vec(), seq.to_be_bytes().to_vec(), payload(seq)]);
    }
}

impl Drop for FakePublisher {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(server) = self.server.take() {
            let _ = server.join();
        }
    }
}

fn serve(router: &zmq::Socket, history: &History, answers: Vec<Answer>, stop: &AtomicBool) {
    let mut answers = answers.into_iter();
    while !stop.load(Ordering::Acquire) {
        if router.poll(zmq::POLLIN, 20).unwrap_or(0) == 0 {
            continue;
        }
        let Ok(frames) = router.recv_multipart(0) else {
            continue;
        };
        let [identity, _, start] = &frames[..] else {
            continue;
        };
        let start = u64::from_be_bytes(start[..].try_into().unwrap());
        let batches: Vec<(u64, Vec<u8>)> = (history.lock().unwrap().iter())
            .filter(|(seq, _)| *seq >= start)
            .cloned()
            .collect();
        let send = |frames: &[&[u8]]| {
            let mut message = vec![&identity[..]];
            message.extend_from_slice(frames);
            let _ = router.send_multipart(message, zmq::DONTWAIT);
        };
        let send_batch = |(seq, payload): &(u64, Vec<u8>)| {
            send(&[b"", b"", &seq.to_be_bytes(), payload]);
        };
        let end = || send(&[b"", b"", &(-1i64).to_be_bytes(), b""]);
        match answers.next().unwrap_or(Answer::Honest) {
            Answer::Honest => {
                batches.iter().for_each(send_batch);
                end();
            }
            Answer::Silent => {}
            Answer::NoEndMarker => batches.iter().for_each(send_batch),
            Answer::Late(pause) => {
                std::thread::sleep(pause);
                batches.iter().for_each(send_batch);
                end();
            }
            Answer::Duplicated => {
                for batch in &batches {
                    send_batch(batch);
                    send_batch(batch);
                }
                end();
            }
            Answer::Reversed => {
                batches.iter().rev().for_each(send_batch);
                end();
            }
            Answer::Garbage => {
                send(&[]);
                send(&[b"x"]);
                send(&[b"", b""]);
                send(&[b"", b"", b"short", b""]);
                send(&[b"", b"", &u64::MAX.to_be_bytes(), b"not msgpack"]);
                send(&[b"", b"", &0u64.to_be_bytes(), b"\xc1"]);
                end();
            }
            Answer::Flood(period) => {
                batches.iter().for_each(send_batch);
                let until = Instant::now() + period;
                while Instant::now() < until && !stop.load(Ordering::Acquire) {
                    send(&[b"", b"junk"]);
                }
            }
        }
    }
}

/// What a consumer of the deliveries has seen, with every promise checked:
/// numbers in order with no gap unaccounted for, each batch under its own
/// number, restarts and losses before the first batch.
#[derive(Debug, Default)]
pub(crate) struct Consumer {
    cursor: Option<u128>,
    pub(crate) seqs: Vec<u64>,
    pub(crate) lost: u128,
    pub(crate) restarts: u64,
}

impl Consumer {
    /// Starts expecting `from` (a subscriber configured with it).
    pub(crate) fn from(from: Option<u64>) -> Self {
        Self {
            cursor: from.map(u128::from),
            ..Self::default()
        }
    }

    pub(crate) fn take(&mut self, received: &Received) {
        if received.restarted {
            self.restarts += 1;
            self.cursor = Some(0);
        }
        if self.cursor.is_none() {
            let first = received.batches.first().map(|(seq, _)| *seq);
            self.cursor = first.map(|seq| u128::from(seq) - u128::from(received.lost));
        }
        let mut cursor = self.cursor.unwrap_or_default() + u128::from(received.lost);
        for (seq, got) in &received.batches {
            assert_eq!(
                u128::from(*seq),
                cursor,
                "in order, every number accounted for"
            );
            assert_eq!(got, &batch(*seq), "each batch under its own number");
            cursor += 1;
            self.seqs.push(*seq);
        }
        if self.cursor.is_some() {
            self.cursor = Some(cursor);
        }
        self.lost += u128::from(received.lost);
    }
}

/// The subscriber's next delivery, calling `recv` with `timeout` until one
/// comes (each call must return: the watchdog catches one that does not).
pub(crate) fn next_delivery(subscriber: &mut Subscriber, timeout: Duration) -> Received {
    let started = Instant::now();
    loop {
        if let Some(received) = subscriber.recv(timeout).expect("the live socket works") {
            return received;
        }
        assert!(started.elapsed() < WATCHDOG / 2, "nothing was delivered");
    }
}
