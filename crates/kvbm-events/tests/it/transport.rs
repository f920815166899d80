//! vLLM's ZeroMQ transport on loopback: PUB frames, the replay protocol
//! byte for byte, and a subscriber repairing a gap from the replay socket.

use std::time::Duration;

use kvbm_events::{KvEventBatch, Publisher, PublisherConfig, Subscriber};

use crate::peers::batch;

const WAIT: Duration = Duration::from_secs(5);

fn publisher(topic: &str) -> Publisher {
    let config = PublisherConfig::new("tcp://127.0.0.1:*")
        .with_replay("tcp://127.0.0.1:*")
        .with_topic(topic)
        .with_buffer_steps(4);
    Publisher::new(&config).expect("loopback endpoints bind")
}

/// Publishes `batch(seq)` until a subscriber's socket has joined (ZeroMQ
/// drops messages for subscribers that have not), returning what it got.
fn first_delivery(
    publisher: &mut Publisher,
    subscriber: &mut Subscriber,
) -> Vec<(u64, KvEventBatch)> {
    for _ in 0..100 {
        let seq = publisher.next_seq();
        publisher.publish(&batch(seq)).expect("published");
        if let Some(got) = subscriber
            .recv(Duration::from_millis(50))
            .expect("well-formed")
        {
            return got.batches;
        }
    }
    panic!("the subscriber never joined");
}

#[test]
fn messages_are_topic_sequence_payload_frames() {
    let mut publisher = publisher("kv");
    let context = zmq::Context::new();
    let raw = context.socket(zmq::SUB).unwrap();
    raw.connect(publisher.endpoint()).unwrap();
    raw.set_subscribe(b"kv").unwrap();
    raw.set_rcvtimeo(50).unwrap();
    for _ in 0..100 {
        let seq = publisher.next_seq();
        publisher.publish(&batch(seq)).unwrap();
        if let Ok(frames) = raw.recv_multipart(0) {
            assert_eq!(frames.len(), 3);
            assert_eq!(frames[0], b"kv");
            let seq = u64::from_be_bytes(frames[1][..].try_into().unwrap());
            assert_eq!(kvbm_events::decode(&frames[2]).unwrap(), batch(seq));
            return;
        }
    }
    panic!("no message arrived");
}

#[test]
fn replay_answers_with_buffered_batches_then_the_end_marker() {
    let mut publisher = publisher("t");
    for n in 0..6 {
        publisher.publish(&batch(n)).unwrap();
    }
    // The buffer keeps the last 4: 2..=5. Ask from 3.
    let context = zmq::Context::new();
    let dealer = context.socket(zmq::DEALER).unwrap();
    dealer
        .connect(publisher.replay_endpoint().unwrap())
        .unwrap();
    dealer.set_rcvtimeo(5_000).unwrap();
    dealer
        .send_multipart([&b""[..], &3u64.to_be_bytes()[..]], 0)
        .unwrap();
    for seq in 3..6u64 {
        let frames = dealer.recv_multipart(0).expect("a replayed batch");
        assert_eq!(frames.len(), 4);
        assert_eq!((&frames[0][..], &frames[1][..]), (&b""[..], &b"t"[..]));
        assert_eq!(frames[2], seq.to_be_bytes());
        assert_eq!(kvbm_events::decode(&frames[3]).unwrap(), batch(seq));
    }
    let end = dealer.recv_multipart(0).expect("the end marker");
    assert_eq!(
        end,
        [
            b"".to_vec(),
            b"".to_vec(),
            (-1i64).to_be_bytes().to_vec(),
            b"".to_vec()
        ]
    );
}

/// Batches published before a subscriber joined are a gap it repairs from
/// the replay buffer (the last 4 batches); older ones are counted lost.
#[test]
fn a_subscriber_repairs_a_gap_from_the_replay_socket() {
    let mut publisher = publisher("");
    for n in 0..3 {
        publisher.publish(&batch(n)).unwrap();
    }
    // Must see everything from 0: the first message it gets (k >= 3) opens
    // a gap 0..k, and the replay buffer holds k-3..=k.
    let mut subscriber = Subscriber::new(
        publisher.endpoint(),
        publisher.replay_endpoint(),
        "",
        Some(0),
    )
    .unwrap();
    let got = first_delivery(&mut publisher, &mut subscriber);
    let seqs: Vec<u64> = got.iter().map(|(s, _)| *s).collect();
    let k = *seqs.last().unwrap();
    assert!(k >= 3);
    assert_eq!(
        seqs,
        (k - 3..=k).collect::<Vec<_>>(),
        "the gap replayed, in order"
    );
    for (seq, b) in &got {
        assert_eq!(b, &batch(*seq));
    }
    assert_eq!((subscriber.repaired(), subscriber.lost()), (3, k - 3));
    // From now on, in order with no gap.
    let next = publisher.publish(&batch(k + 1)).unwrap();
    let got = subscriber.recv(WAIT).unwrap().expect("the next batch");
    assert_eq!(got.batches, vec![(next, batch(next))]);
}

/// With the wait, the very first batch reaches a subscriber that was still
/// connecting: no slow-joiner loss, no retry.
#[test]
fn waiting_for_subscribers_delivers_the_first_batch() {
    let mut publisher = publisher("");
    let mut subscriber = Subscriber::new(publisher.endpoint(), None, "", Some(0)).unwrap();
    assert_eq!(publisher.wait_for_subscribers(1, WAIT).unwrap(), 1);
    publisher.publish(&batch(0)).unwrap();
    let got = subscriber.recv(WAIT).unwrap().expect("the first batch");
    assert_eq!(got.batches, vec![(0, batch(0))]);
    assert_eq!((subscriber.repaired(), subscriber.lost()), (0, 0));
    // Nobody else is coming: the wait gives up at its timeout.
    let seen = publisher
        .wait_for_subscribers(2, Duration::from_millis(100))
        .unwrap();
    assert_eq!(seen, 1);
}
