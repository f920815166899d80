//! The transport against hostile peers over real sockets: a publisher and
//! a replay server that send arbitrary frames, numbers (restarts,
//! duplicates, jumps, `u64::MAX`), topics and answers (silence, late,
//! duplicated, reversed, garbage, no end marker), and subscribers that send
//! our publisher arbitrary replay requests and subscriptions. Every `recv`
//! must return (a watchdog fails the case otherwise), and every delivery
//! must keep the order and accounting promises ([`Consumer`]); our
//! publisher must keep publishing and answering.

use std::time::{Duration, Instant};

use kvbm_events::{Publisher, PublisherConfig, Subscriber, SubscriberConfig};
use proptest::prelude::*;

use crate::peers::{Answer, Consumer, FakePublisher, batch, bounded, payload};

/// Cases per test: `KVBM_FUZZ_CASES` (`cargo xtask fuzz`), else few: each
/// case opens sockets and waits on timeouts.
fn cases() -> u32 {
    std::env::var("KVBM_FUZZ_CASES")
        .ok()
        .and_then(|cases| cases.parse::<u32>().ok())
        .map_or(12, |cases| (cases / 100).max(12))
}

#[derive(Clone, Debug)]
enum Send {
    /// The next number, published.
    Next,
    /// Skip `n` numbers (kept for replay, not sent).
    Skip(u8),
    /// Number from 0 again, as a restarted engine.
    Restart,
    /// The same number again.
    Repeat,
    /// A raw number.
    Raw(u64),
    /// Another topic.
    Foreign,
    /// Frames of a wrong shape, or a payload that is not a batch.
    Malformed(u8),
}

fn sends() -> impl Strategy<Value = Vec<Send>> {
    let send = prop_oneof![
        8 => Just(Send::Next),
        3 => (1u8..12).prop_map(Send::Skip),
        1 => Just(Send::Restart),
        1 => Just(Send::Repeat),
        1 => prop_oneof![Just(u64::MAX), Just(u64::MAX - 1), any::<u64>()].prop_map(Send::Raw),
        1 => Just(Send::Foreign),
        1 => any::<u8>().prop_map(Send::Malformed),
    ];
    prop::collection::vec(send, 1..25)
}

fn answers() -> impl Strategy<Value = Vec<Answer>> {
    let answer = prop_oneof![
        4 => Just(Answer::Honest),
        1 => Just(Answer::Silent),
        1 => Just(Answer::NoEndMarker),
        1 => (0u64..200).prop_map(|ms| Answer::Late(Duration::from_millis(ms))),
        1 => Just(Answer::Duplicated),
        1 => Just(Answer::Reversed),
        1 => Just(Answer::Garbage),
        1 => (0u64..150).prop_map(|ms| Answer::Flood(Duration::from_millis(ms))),
    ];
    prop::collection::vec(answer, 0..6)
}

/// Plays `sends` against a subscriber whose replay answers per `answers`,
/// draining it with `recv(timeout)` after each send; checks every delivery.
fn play(sends: Vec<Send>, answers: Vec<Answer>, timeout_ms: u64, from: Option<u64>) {
    let fake = FakePublisher::new(answers);
    let mut config = SubscriberConfig::new(fake.endpoint())
        .with_replay(fake.replay_endpoint())
        .with_topic("kv")
        .with_replay_timeout(Duration::from_millis(100))
        .with_max_replay_messages(64);
    config.from = from;
    let mut subscriber = Subscriber::from_config(&config).unwrap();
    fake.wait_subscribed();
    let mut consumer = Consumer::from(from);
    let timeout = Duration::from_millis(timeout_ms);
    let mut next = from.unwrap_or(0);
    let mut last = None;
    for send in sends {
        match send {
            Send::Next => {
                fake.publish(b"kv", next);
                last = Some(next);
                next = next.saturating_add(1);
            }
            Send::Skip(n) => {
                for _ in 0..n {
                    fake.record(next);
                    next = next.saturating_add(1);
                }
            }
            Send::Restart => {
                fake.publish(b"kv", 0);
                last = Some(0);
                next = 1;
            }
            Send::Repeat => {
                if let Some(seq) = last {
                    fake.publish(b"kv", seq);
                }
            }
            Send::Raw(seq) => {
                fake.publish(b"kv", seq);
                last = Some(seq);
                next = seq.saturating_add(1);
            }
            Send::Foreign => fake.publish(b"kv2", next),
            Send::Malformed(n) => match n % 3 {
                0 => fake.send(&[b"kv".to_vec(), payload(next)]),
                1 => fake.send(&[b"kv".to_vec(), vec![1; usize::from(n % 8)], payload(next)]),
                _ => fake.send(&[b"kv".to_vec(), next.to_be_bytes().to_vec(), vec![n]]),
            },
        }
        while let Some(received) = subscriber.recv(timeout).unwrap() {
            consumer.take(&received);
        }
    }
    // Whatever is still under repair settles within its timeout.
    let started = Instant::now();
    while started.elapsed() < Duration::from_millis(400) {
        if let Some(received) = subscriber.recv(timeout).unwrap() {
            consumer.take(&received);
        }
    }
    let stats = subscriber.stats();
    assert_eq!(stats.delivered, consumer.seqs.len() as u64);
    assert_eq!(
        u128::from(stats.lost),
        consumer.lost.min(u128::from(u64::MAX))
    );
    assert_eq!(stats.restarts, consumer.restarts);
}

/// Sends our publisher's sockets arbitrary frames: replay requests of any
/// shape and number, subscriptions and unsubscriptions of any topic.
fn harass(requests: Vec<Vec<Vec<u8>>>, subscriptions: Vec<Vec<u8>>) {
    let config = PublisherConfig::new("tcp://127.0.0.1:*")
        .with_replay("tcp://127.0.0.1:*")
        .with_topic("kv")
        .with_buffer_steps(8);
    let mut publisher = Publisher::new(&config).unwrap();
    for seq in 0..10 {
        publisher.publish(&batch(seq)).unwrap();
    }
    let context = zmq::Context::new();
    let dealer = context.socket(zmq::DEALER).unwrap();
    dealer.set_linger(0).unwrap();
    dealer
        .connect(publisher.replay_endpoint().unwrap())
        .unwrap();
    let xsub = context.socket(zmq::XSUB).unwrap();
    xsub.set_linger(0).unwrap();
    xsub.connect(publisher.endpoint()).unwrap();
    for frames in &requests {
        if !frames.is_empty() {
            dealer.send_multipart(frames, zmq::DONTWAIT).unwrap();
        }
    }
    for subscription in &subscriptions {
        xsub.send(&subscription[..], zmq::DONTWAIT).unwrap();
    }
    // Publishing and waiting still work, whatever arrived.
    let _ = publisher
        .wait_for_subscribers(usize::MAX, Duration::from_millis(100))
        .unwrap();
    publisher.publish(&batch(10)).unwrap();
    // And the replay thread still answers a good request (from a fresh
    // peer: the harassing one may be over its rate).
    let honest = context.socket(zmq::DEALER).unwrap();
    honest.set_linger(0).unwrap();
    honest.set_rcvtimeo(10_000).unwrap();
    honest
        .connect(publisher.replay_endpoint().unwrap())
        .unwrap();
    honest
        .send_multipart([&b""[..], &10u64.to_be_bytes()[..]], 0)
        .unwrap();
    let answer = honest.recv_multipart(0).expect("the replay thread answers");
    assert_eq!(answer[2], 10u64.to_be_bytes());
    assert_eq!(kvbm_events::decode(&answer[3]).unwrap(), batch(10));
}

fn frame() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(Vec::new()),
        any::<u64>().prop_map(|n| n.to_be_bytes().to_vec()),
        prop::collection::vec(any::<u8>(), 0..12),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn fuzz_hostile_publisher_and_replay_server(
        sends in sends(),
        answers in answers(),
        timeout_ms in 0u64..40,
        from in prop::option::of(0u64..4),
    ) {
        bounded(move || play(sends, answers, timeout_ms, from));
    }

    #[test]
    fn fuzz_hostile_subscribers_of_our_publisher(
        requests in prop::collection::vec(prop::collection::vec(frame(), 0..4), 0..40),
        subscriptions in prop::collection::vec(
            (0u8..3, prop::collection::vec(any::<u8>(), 0..4))
                .prop_map(|(kind, topic)| [vec![kind], topic].concat()),
            0..40,
        ),
    ) {
        bounded(move || harass(requests, subscriptions));
    }
}
