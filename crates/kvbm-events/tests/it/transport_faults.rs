//! The transport under unlucky and hostile peers, one regression test per
//! failure issue 21 reproduced: replays that never answer, answer late,
//! never end or lie; publishers that restart, number up to `u64::MAX`, or
//! send another topic or oversized messages; several subscribers; "no
//! timeout"; peers that flood the replay socket. Each runs under a
//! watchdog, so a hang fails the test.

use std::time::{Duration, Instant};

use kvbm_events::{Publisher, PublisherConfig, Subscriber, SubscriberConfig};

use crate::peers::{Answer, Consumer, FakePublisher, batch, bounded, next_delivery, payload};

const TICK: Duration = Duration::from_millis(50);

/// A subscriber of `fake` that must see everything from 0, repairing for
/// at most `replay_timeout`.
fn subscriber_of(fake: &FakePublisher, replay_timeout: Duration) -> Subscriber {
    let config = SubscriberConfig::new(fake.endpoint())
        .with_replay(fake.replay_endpoint())
        .with_from(0)
        .with_replay_timeout(replay_timeout);
    let subscriber = Subscriber::from_config(&config).unwrap();
    fake.wait_subscribed();
    subscriber
}

/// Item 1: the replay never answers. The gap is counted lost, the live
/// batch delivered, and the stream goes on in order.
#[test]
fn an_unanswered_replay_loses_the_gap_and_delivery_goes_on() {
    bounded(|| {
        let fake = FakePublisher::new(vec![Answer::Silent]);
        let mut subscriber = subscriber_of(&fake, Duration::from_millis(200));
        fake.publish(b"", 3);
        let first = next_delivery(&mut subscriber, TICK);
        assert_eq!((first.lost, &first.batches[..]), (3, &[(3, batch(3))][..]));
        assert!(first.needs_resync());
        fake.publish(b"", 4);
        let next = next_delivery(&mut subscriber, TICK);
        assert_eq!((next.lost, &next.batches[..]), (0, &[(4, batch(4))][..]));
        assert_eq!(subscriber.stats().replay_timeouts, 1);
    });
}

/// Item 2: an answer that arrives after its repair gave up is never read
/// as the next repair's answer.
#[test]
fn a_late_replay_answer_is_not_taken_for_the_next_ones() {
    bounded(|| {
        let fake = FakePublisher::new(vec![Answer::Late(Duration::from_millis(400))]);
        let mut subscriber = subscriber_of(&fake, Duration::from_millis(100));
        fake.record(0);
        fake.record(1);
        fake.publish(b"", 2);
        let first = next_delivery(&mut subscriber, TICK);
        assert_eq!(
            (first.lost, first.batches.len()),
            (2, 1),
            "given up in time"
        );
        // Let the late answer (0, 1, 2, end) arrive before the next gap.
        std::thread::sleep(Duration::from_millis(600));
        fake.record(3);
        fake.record(4);
        fake.publish(b"", 5);
        let second = next_delivery(&mut subscriber, TICK);
        assert_eq!(second.lost, 0, "the second answer, not the late first one");
        assert_eq!(
            second.batches,
            vec![(3, batch(3)), (4, batch(4)), (5, batch(5))]
        );
        assert_eq!(subscriber.repaired(), 2);
    });
}

/// Item 3: an engine restarts on the same endpoint and numbers from 0
/// again. The subscriber says so, and follows the new numbers.
#[test]
fn a_restarted_publisher_is_reported_and_followed() {
    bounded(|| {
        // ipc endpoints: bound by both incarnations (vLLM binds only
        // endpoints with `*`, `::` or ipc/inproc), and only on this host.
        let dir = std::env::temp_dir();
        let id = std::process::id();
        let endpoint = format!("ipc://{}/kvbm-restart-{id}.pub", dir.display());
        let replay = format!("ipc://{}/kvbm-restart-{id}.replay", dir.display());
        let config = PublisherConfig::new(&endpoint).with_replay(&replay);
        let mut first = Publisher::new(&config).unwrap();
        let mut subscriber = Subscriber::new(&endpoint, Some(&replay), "", None).unwrap();
        first
            .wait_for_subscribers(1, Duration::from_secs(10))
            .unwrap();
        let mut consumer = Consumer::default();
        for seq in 0..20 {
            first.publish(&batch(seq)).unwrap();
        }
        while consumer.seqs.last() != Some(&19) {
            consumer.take(&next_delivery(&mut subscriber, TICK));
        }
        drop(first);
        let mut second = Publisher::new(&config).unwrap();
        // The subscriber reconnects (and resubscribes: ZeroMQ resends a
        // subscription only when the socket is used, as a router's loop
        // does); wait for it, then publish from 0 again.
        let started = Instant::now();
        while second.wait_for_subscribers(1, TICK).unwrap() < 1 {
            assert!(subscriber.recv(TICK).unwrap().is_none());
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "the subscriber came back"
            );
        }
        for seq in 0..3 {
            second.publish(&batch(seq)).unwrap();
        }
        let restarted = next_delivery(&mut subscriber, TICK);
        assert!(restarted.restarted && restarted.needs_resync());
        consumer.take(&restarted);
        while consumer.seqs.last() != Some(&2) {
            consumer.take(&next_delivery(&mut subscriber, TICK));
        }
        assert_eq!(consumer.restarts, 1);
        assert_eq!(subscriber.stats().restarts, 1);
        assert_eq!(consumer.lost, 0);
    });
}

/// Item 4: a replay answer without its end marker, followed by a flood of
/// junk: `recv` keeps returning within its timeout, and the repair ends at
/// its own timeout with what arrived; with a message budget, the flood is
/// cut off at the budget instead.
#[test]
fn a_replay_without_end_marker_cannot_hold_recv() {
    bounded(|| {
        for budget in [usize::MAX, 1_000] {
            let fake = FakePublisher::new(vec![Answer::Flood(Duration::from_secs(2))]);
            let config = SubscriberConfig::new(fake.endpoint())
                .with_replay(fake.replay_endpoint())
                .with_from(0)
                .with_replay_timeout(Duration::from_millis(300))
                .with_max_replay_messages(budget);
            let mut subscriber = Subscriber::from_config(&config).unwrap();
            fake.wait_subscribed();
            fake.record(0);
            fake.record(1);
            fake.publish(b"", 2);
            let mut calls = 0;
            let received = loop {
                calls += 1;
                if let Some(received) = subscriber.recv(TICK).unwrap() {
                    break received;
                }
            };
            assert_eq!(received.lost, 0, "every batch had arrived");
            assert_eq!(received.batches.len(), 3);
            let stats = subscriber.stats();
            if budget == usize::MAX {
                assert!(calls > 1, "recv returned while the repair went on");
                assert_eq!(stats.replay_timeouts, 1, "{stats:?}");
            } else {
                assert_eq!(stats.replay_timeouts, 0, "{stats:?}");
                assert_eq!(stats.malformed, budget as u64 - 3, "{stats:?}");
            }
        }
    });
}

/// Item 6: duplicated and reordered answers are refused, never delivered
/// twice, and never make the loss count wrap.
#[test]
fn replay_answers_are_checked_not_trusted() {
    bounded(|| {
        let fake = FakePublisher::new(vec![Answer::Duplicated, Answer::Reversed, Answer::Garbage]);
        let mut subscriber = subscriber_of(&fake, Duration::from_secs(5));
        let mut consumer = Consumer::from(Some(0));
        // Duplicated: 0, 0, 1, 1, end. All repaired.
        fake.record(0);
        fake.record(1);
        fake.publish(b"", 2);
        let received = next_delivery(&mut subscriber, TICK);
        assert_eq!((received.lost, received.batches.len()), (0, 3));
        consumer.take(&received);
        // Reversed: 5, 4, 3 (and 0..=2): only 5 can be taken in order.
        for seq in 3..6 {
            fake.record(seq);
        }
        fake.publish(b"", 6);
        let received = next_delivery(&mut subscriber, TICK);
        assert_eq!(received.lost, 2);
        consumer.take(&received);
        // Garbage, including a payload at u64::MAX and an undecodable one.
        fake.record(7);
        fake.publish(b"", 8);
        let received = next_delivery(&mut subscriber, TICK);
        assert_eq!((received.lost, received.batches.len()), (1, 1));
        consumer.take(&received);
        assert_eq!(consumer.seqs, [0, 1, 2, 5, 6, 8]);
        assert_eq!(consumer.lost, 3);
        assert_eq!(subscriber.lost(), 3);
        assert!(subscriber.stats().replay_rejected > 0);
    });
}

/// Item 7: a sequence number of `u64::MAX` on the wire is delivered, and
/// what follows it starts a new epoch instead of overflowing.
#[test]
fn sequence_number_max_from_the_wire_does_not_overflow() {
    bounded(|| {
        let fake = FakePublisher::new(vec![]);
        let config = SubscriberConfig::new(fake.endpoint());
        let mut subscriber = Subscriber::from_config(&config).unwrap();
        fake.wait_subscribed();
        fake.publish(b"", u64::MAX);
        let last = next_delivery(&mut subscriber, TICK);
        assert_eq!(last.batches, vec![(u64::MAX, batch(u64::MAX))]);
        fake.publish(b"", 0);
        let next = next_delivery(&mut subscriber, TICK);
        assert!(next.restarted);
        assert_eq!(next.batches, vec![(0, batch(0))]);
    });
}

/// Item 8: two routers subscribing to one topic are two subscribers.
#[test]
fn two_subscribers_of_one_topic_are_both_waited_for() {
    bounded(|| {
        let config = PublisherConfig::new("tcp://127.0.0.1:*").with_topic("kv");
        let mut publisher = Publisher::new(&config).unwrap();
        let mut a = Subscriber::new(publisher.endpoint(), None, "kv", Some(0)).unwrap();
        let mut b = Subscriber::new(publisher.endpoint(), None, "kv", Some(0)).unwrap();
        let seen = publisher
            .wait_for_subscribers(2, Duration::from_secs(10))
            .unwrap();
        assert_eq!(seen, 2);
        publisher.publish(&batch(0)).unwrap();
        for subscriber in [&mut a, &mut b] {
            let got = next_delivery(subscriber, TICK);
            assert_eq!(
                got.batches,
                vec![(0, batch(0))],
                "nobody missed the first batch"
            );
        }
        // A subscription to another topic does not count.
        let _other = Subscriber::new(publisher.endpoint(), None, "other", None).unwrap();
        let seen = publisher
            .wait_for_subscribers(3, Duration::from_millis(300))
            .unwrap();
        assert_eq!(seen, 2);
    });
}

/// Item 9: `Duration::MAX` means no timeout, everywhere.
#[test]
fn duration_max_means_no_timeout() {
    bounded(|| {
        let config = PublisherConfig::new("tcp://127.0.0.1:*").with_replay("tcp://127.0.0.1:*");
        let mut publisher = Publisher::new(&config).unwrap();
        let subscriber_config = SubscriberConfig::new(publisher.endpoint())
            .with_replay(publisher.replay_endpoint().unwrap())
            .with_from(0)
            .with_replay_timeout(Duration::MAX);
        let mut subscriber = Subscriber::from_config(&subscriber_config).unwrap();
        assert_eq!(publisher.wait_for_subscribers(1, Duration::MAX).unwrap(), 1);
        // A gap (0 goes to nobody's socket... it is sent before a second
        // batch that the subscriber gets) repaired under no timeout at all.
        publisher.publish(&batch(0)).unwrap();
        publisher.publish(&batch(1)).unwrap();
        let mut consumer = Consumer::from(Some(0));
        while consumer.seqs.last() != Some(&1) {
            let received = subscriber.recv(Duration::MAX).unwrap().expect("no timeout");
            consumer.take(&received);
        }
        assert_eq!(consumer.lost, 0);
    });
}

/// Topics are matched exactly: ZeroMQ's prefix subscription to "kv" also
/// receives "kvx", which is skipped and counted.
#[test]
fn another_topic_with_our_prefix_is_skipped() {
    bounded(|| {
        let fake = FakePublisher::new(vec![]);
        let config = SubscriberConfig::new(fake.endpoint()).with_topic("kv");
        let mut subscriber = Subscriber::from_config(&config).unwrap();
        fake.wait_subscribed();
        fake.publish(b"kvx", 0);
        fake.publish(b"kv", 1);
        let got = next_delivery(&mut subscriber, TICK);
        assert_eq!(got.batches, vec![(1, batch(1))]);
        assert_eq!(subscriber.stats().foreign, 1);
    });
}

/// Malformed live frames are skipped and counted, not errors that stop the
/// stream.
#[test]
fn malformed_live_messages_are_skipped() {
    bounded(|| {
        let fake = FakePublisher::new(vec![]);
        let config = SubscriberConfig::new(fake.endpoint());
        let mut subscriber = Subscriber::from_config(&config).unwrap();
        fake.wait_subscribed();
        fake.send(&[b"".to_vec(), payload(0)]);
        fake.send(&[b"".to_vec(), vec![0; 7], payload(0)]);
        fake.send(&[b"".to_vec(), 0u64.to_be_bytes().to_vec(), b"\xc1".to_vec()]);
        fake.publish(b"", 1);
        let first = next_delivery(&mut subscriber, TICK);
        // The undecodable 0 is the stream's first number: lost, then 1.
        assert_eq!(first.lost, 1);
        assert!(first.batches.is_empty());
        let second = next_delivery(&mut subscriber, TICK);
        assert_eq!(second.batches, vec![(1, batch(1))]);
        let stats = subscriber.stats();
        assert_eq!((stats.malformed, stats.undecodable), (2, 1));
    });
}

/// A message over the size limit is refused by ZeroMQ before it is
/// allocated; the stream goes on after it.
#[test]
fn an_oversized_message_is_refused() {
    bounded(|| {
        let fake = FakePublisher::new(vec![]);
        let config = SubscriberConfig::new(fake.endpoint()).with_max_message_bytes(4096);
        let mut subscriber = Subscriber::from_config(&config).unwrap();
        fake.wait_subscribed();
        fake.send(&[
            b"".to_vec(),
            0u64.to_be_bytes().to_vec(),
            vec![0x90; 1 << 20],
        ]);
        // The connection was dropped and comes back: publish until a batch
        // gets through.
        let started = Instant::now();
        let mut seq = 1;
        let got = loop {
            fake.publish(b"", seq);
            if let Some(got) = subscriber.recv(TICK).unwrap() {
                break got;
            }
            seq += 1;
            assert!(started.elapsed() < Duration::from_secs(20), "reconnected");
        };
        assert!(got.batches.iter().all(|(seq, _)| *seq > 0), "{got:?}");
        assert!(subscriber.stats().reconnects >= 1);
    });
}

/// A peer asking for replays in a loop gets its burst, then nothing; the
/// refusals are counted and publishing goes on.
#[test]
fn a_peer_asking_in_a_loop_is_rate_limited() {
    bounded(|| {
        let config = PublisherConfig::new("tcp://127.0.0.1:*")
            .with_replay("tcp://127.0.0.1:*")
            .with_replay_requests_per_s(5);
        let mut publisher = Publisher::new(&config).unwrap();
        for seq in 0..10 {
            publisher.publish(&batch(seq)).unwrap();
        }
        let context = zmq::Context::new();
        let dealer = context.socket(zmq::DEALER).unwrap();
        dealer
            .connect(publisher.replay_endpoint().unwrap())
            .unwrap();
        for _ in 0..200 {
            dealer
                .send_multipart([&b""[..], &0u64.to_be_bytes()[..]], 0)
                .unwrap();
        }
        dealer.send_multipart([&b"garbage"[..]], 0).unwrap();
        let started = Instant::now();
        let stats = loop {
            let stats = publisher.stats();
            if stats.replays_served + stats.replays_refused == 200
                && stats.replay_requests_malformed == 1
            {
                break stats;
            }
            assert!(started.elapsed() < Duration::from_secs(20), "{stats:?}");
            std::thread::sleep(TICK);
        };
        assert!(stats.replays_refused > 0, "{stats:?}");
        assert!(stats.replays_served >= 5, "the burst is served: {stats:?}");
        assert_eq!(stats.published, 10);
        publisher.publish(&batch(10)).unwrap();
    });
}
