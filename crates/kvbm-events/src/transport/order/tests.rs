//! The sequencing core against arbitrary live messages and replay answers:
//! what a hostile or unlucky publisher and replay server can send, in any
//! order, with restarts, duplicates, silence and garbage. After every step
//! the deliveries must account for every sequence number exactly once, in
//! order, with each batch under its own number.

use proptest::prelude::*;

use super::*;
use crate::{BlockHash, BlockRemoved, KvEvent, encode};

/// The batch published under `seq`: its timestamp and hash name it, so a
/// batch delivered under another number is caught.
fn batch(seq: u64) -> KvEventBatch {
    KvEventBatch::new(
        seq as f64,
        vec![KvEvent::BlockRemoved(BlockRemoved::new(vec![
            BlockHash::Int(seq),
        ]))],
    )
}

fn payload(seq: u64) -> Vec<u8> {
    encode(&batch(seq)).unwrap()
}

fn live(topic: &[u8], seq: u64, body: Vec<u8>) -> Vec<Vec<u8>> {
    vec![topic.to_vec(), seq.to_be_bytes().to_vec(), body]
}

fn replayed(topic: &[u8], seq: u64, body: Vec<u8>) -> Vec<Vec<u8>> {
    vec![vec![], topic.to_vec(), seq.to_be_bytes().to_vec(), body]
}

fn end_marker() -> Vec<Vec<u8>> {
    vec![vec![], vec![], END_OF_REPLAY.to_vec(), vec![]]
}

/// Where a live message's number falls, relative to what is expected.
#[derive(Clone, Debug)]
enum LiveSeq {
    Next,
    Ahead(u8),
    Back(u8),
    Zero,
    Max,
    Raw(u64),
}

#[derive(Clone, Debug)]
enum Body {
    Good,
    Garbage(Vec<u8>),
}

#[derive(Clone, Debug)]
enum Step {
    Live {
        seq: LiveSeq,
        own_topic: bool,
        body: Body,
    },
    /// Three frames, or a short sequence number.
    LiveMalformed(u8),
    /// A replayed message at `from + index % gap`.
    Replay {
        index: u16,
        own_topic: bool,
        body: Body,
    },
    /// The next `n` messages of an honest answer, in order.
    ReplayInOrder(u8),
    /// A replayed message numbered anywhere.
    ReplayRaw(u64),
    /// The same replayed message again.
    ReplayAgain,
    ReplayMalformed(u8),
    End,
    /// The replay stays silent past its timeout.
    Timeout,
}

fn body() -> impl Strategy<Value = Body> {
    prop_oneof![
        6 => Just(Body::Good),
        1 => prop::collection::vec(any::<u8>(), 0..6).prop_map(Body::Garbage),
    ]
}

fn live_seq() -> impl Strategy<Value = LiveSeq> {
    prop_oneof![
        8 => Just(LiveSeq::Next),
        4 => any::<u8>().prop_map(LiveSeq::Ahead),
        1 => any::<u8>().prop_map(LiveSeq::Back),
        1 => Just(LiveSeq::Zero),
        1 => Just(LiveSeq::Max),
        1 => any::<u64>().prop_map(LiveSeq::Raw),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        10 => (live_seq(), prop::bool::weighted(0.9), body())
            .prop_map(|(seq, own_topic, body)| Step::Live { seq, own_topic, body }),
        1 => any::<u8>().prop_map(Step::LiveMalformed),
        10 => (any::<u16>(), prop::bool::weighted(0.9), body())
            .prop_map(|(index, own_topic, body)| Step::Replay { index, own_topic, body }),
        10 => (1u8..40).prop_map(Step::ReplayInOrder),
        1 => any::<u64>().prop_map(Step::ReplayRaw),
        2 => Just(Step::ReplayAgain),
        1 => any::<u8>().prop_map(Step::ReplayMalformed),
        3 => Just(Step::End),
        1 => Just(Step::Timeout),
    ]
}

/// What the consumer has seen, and the promises checked against it.
#[derive(Debug, Default)]
struct Consumer {
    /// The next number the current epoch owes (delivered or lost).
    cursor: Option<u128>,
    delivered: u64,
    lost: u128,
    restarts: u64,
}

impl Consumer {
    fn take(&mut self, received: &Received) -> Result<(), TestCaseError> {
        if received.restarted {
            self.restarts += 1;
            self.cursor = Some(0);
        }
        if self.cursor.is_none() {
            // The stream's first delivery starts wherever it starts (with
            // its losses before it, if its very first message was lost).
            let first = received.batches.first().map(|(seq, _)| *seq);
            self.cursor = first.map(|seq| u128::from(seq) - u128::from(received.lost));
        }
        let mut cursor = self.cursor.unwrap_or_default() + u128::from(received.lost);
        for (seq, got) in &received.batches {
            prop_assert_eq!(
                u128::from(*seq),
                cursor,
                "in order, every number accounted for"
            );
            prop_assert_eq!(got, &batch(*seq), "each batch under its own number");
            cursor += 1;
        }
        if self.cursor.is_some() {
            self.cursor = Some(cursor);
        }
        self.delivered += received.batches.len() as u64;
        self.lost += u128::from(received.lost);
        Ok(())
    }
}

/// Frames a step sends, given the core's state.
struct Script {
    topic: Vec<u8>,
    /// The gap being repaired, `from..until`.
    gap: Option<(u64, u64)>,
    last_replayed: Option<Vec<Vec<u8>>>,
    /// The next number an honest answer sends.
    replay_cursor: u64,
    /// The next number the live stream would carry.
    next_live: u64,
}

impl Script {
    fn topic(&self, own: bool) -> Vec<u8> {
        if own {
            self.topic.clone()
        } else {
            b"other".to_vec()
        }
    }

    fn body(seq: u64, body: &Body) -> Vec<u8> {
        match body {
            Body::Good => payload(seq),
            Body::Garbage(bytes) => bytes.clone(),
        }
    }
}

fn run(
    topic: &[u8],
    from: Option<u64>,
    max_frames: usize,
    steps: &[Step],
) -> Result<(), TestCaseError> {
    let mut core = Core::new(topic, from, max_frames);
    let mut consumer = Consumer {
        cursor: from.map(u128::from),
        ..Consumer::default()
    };
    let mut script = Script {
        topic: topic.to_vec(),
        gap: None,
        last_replayed: None,
        replay_cursor: 0,
        next_live: from.unwrap_or(0),
    };
    for step in steps {
        let received = match step {
            Step::Live {
                seq,
                own_topic,
                body,
            } => {
                if core.repairing() {
                    continue; // the socket code reads no live message then
                }
                let seq = match seq {
                    LiveSeq::Next => script.next_live,
                    LiveSeq::Ahead(k) => script.next_live.saturating_add(u64::from(*k)),
                    LiveSeq::Back(k) => script.next_live.saturating_sub(u64::from(*k) + 1),
                    LiveSeq::Zero => 0,
                    LiveSeq::Max => u64::MAX,
                    LiveSeq::Raw(seq) => *seq,
                };
                let frames = live(&script.topic(*own_topic), seq, Script::body(seq, body));
                match core.on_live(&frames, true) {
                    Live::Skipped => {
                        prop_assert!(
                            !*own_topic && !script.topic.is_empty(),
                            "only another topic is skipped"
                        );
                        None
                    }
                    Live::Delivered(received) => {
                        script.next_live = seq.saturating_add(1);
                        Some(received)
                    }
                    Live::Repair { from } => {
                        prop_assert!(from < seq);
                        script.gap = Some((from, seq));
                        script.last_replayed = None;
                        script.replay_cursor = from;
                        script.next_live = seq.saturating_add(1);
                        None
                    }
                }
            }
            Step::LiveMalformed(n) => {
                if core.repairing() {
                    continue;
                }
                let frames = match n % 3 {
                    0 => vec![script.topic.clone(), payload(0)],
                    1 => vec![
                        script.topic.clone(),
                        vec![0; usize::from(n % 8)],
                        payload(0),
                    ],
                    _ => vec![],
                };
                prop_assert!(matches!(core.on_live(&frames, true), Live::Skipped));
                None
            }
            Step::Replay {
                index,
                own_topic,
                body,
            } => {
                let Some((from, until)) = script.gap else {
                    continue;
                };
                let seq = from + u64::from(*index) % (until - from);
                let frames = replayed(&script.topic(*own_topic), seq, Script::body(seq, body));
                script.last_replayed = Some(frames.clone());
                done(core.on_replay(&frames), &mut script)
            }
            Step::ReplayInOrder(n) => {
                let mut outcome = None;
                for _ in 0..*n {
                    let Some((_, until)) = script.gap else { break };
                    let seq = script.replay_cursor;
                    let frames = if seq < until {
                        replayed(&script.topic, seq, payload(seq))
                    } else {
                        end_marker()
                    };
                    script.replay_cursor = seq.saturating_add(1);
                    outcome = done(core.on_replay(&frames), &mut script);
                }
                outcome
            }
            Step::ReplayRaw(seq) => {
                if script.gap.is_none() {
                    continue;
                }
                let frames = replayed(&script.topic, *seq, payload(*seq));
                done(core.on_replay(&frames), &mut script)
            }
            Step::ReplayAgain => {
                let Some(frames) = script.last_replayed.clone() else {
                    continue;
                };
                if script.gap.is_none() {
                    continue;
                }
                done(core.on_replay(&frames), &mut script)
            }
            Step::ReplayMalformed(n) => {
                if script.gap.is_none() {
                    continue;
                }
                let frames = match n % 3 {
                    0 => vec![
                        vec![1],
                        script.topic.clone(),
                        0u64.to_be_bytes().to_vec(),
                        payload(0),
                    ],
                    1 => vec![vec![], script.topic.clone()],
                    _ => vec![],
                };
                done(core.on_replay(&frames), &mut script)
            }
            Step::End => {
                if script.gap.is_none() {
                    continue;
                }
                done(core.on_replay(&end_marker()), &mut script)
            }
            Step::Timeout => {
                script.gap = None;
                core.abandon_repair()
            }
        };
        if let Some(received) = received {
            consumer.take(&received)?;
        }
        prop_assert_eq!(core.repairing(), script.gap.is_some());
        let stats = core.stats();
        prop_assert_eq!(stats.delivered, consumer.delivered);
        prop_assert_eq!(
            u128::from(stats.lost),
            consumer.lost.min(u128::from(u64::MAX))
        );
        prop_assert_eq!(stats.restarts, consumer.restarts);
        prop_assert!(stats.repaired <= stats.delivered);
        if let Some(repair) = &core.repair {
            prop_assert!(repair.run.len() as u64 <= repair.until - repair.from);
            prop_assert!(repair.run.len() <= max_frames);
        }
    }
    if let Some(received) = core.abandon_repair() {
        consumer.take(&received)?;
    }
    prop_assert!(!core.repairing());
    Ok(())
}

/// Hands a settled repair's delivery on.
fn done(replay: Replay, script: &mut Script) -> Option<Received> {
    match replay {
        Replay::Pending => None,
        Replay::Done { received, .. } => {
            script.gap = None;
            Some(received)
        }
    }
}

fn cases() -> u32 {
    std::env::var("KVBM_FUZZ_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(2_048)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases()))]

    #[test]
    fn fuzz_sequencing_accounts_for_every_number(
        topic in prop_oneof![Just(Vec::new()), Just(b"kv".to_vec())],
        from in prop::option::of(prop_oneof![Just(0u64), any::<u64>()]),
        max_frames in 1usize..64,
        steps in prop::collection::vec(step(), 0..80),
    ) {
        run(&topic, from, max_frames, &steps)?;
    }
}

#[test]
fn an_unanswered_replay_loses_the_gap_and_delivers_the_live_batch() {
    let mut core = Core::new(b"", Some(0), 100);
    assert!(matches!(
        core.on_live(&live(b"", 3, payload(3)), true),
        Live::Repair { from: 0 }
    ));
    let received = core.abandon_repair().unwrap();
    assert_eq!((received.lost, received.batches), (3, vec![(3, batch(3))]));
    // And the stream goes on in order.
    let Live::Delivered(next) = core.on_live(&live(b"", 4, payload(4)), true) else {
        panic!("in order")
    };
    assert_eq!((next.lost, next.batches), (0, vec![(4, batch(4))]));
}

#[test]
fn a_duplicate_replay_answer_is_refused_not_counted_twice() {
    let mut core = Core::new(b"", Some(0), 100);
    assert!(matches!(
        core.on_live(&live(b"", 2, payload(2)), true),
        Live::Repair { from: 0 }
    ));
    for seq in [0, 0, 1, 1] {
        assert!(matches!(
            core.on_replay(&replayed(b"", seq, payload(seq))),
            Replay::Pending
        ));
    }
    let Replay::Done { received, clean } = core.on_replay(&end_marker()) else {
        panic!("the end marker settles")
    };
    assert!(clean);
    assert_eq!(received.lost, 0);
    assert_eq!(
        received.batches,
        vec![(0, batch(0)), (1, batch(1)), (2, batch(2))]
    );
    assert_eq!(
        (core.stats().replay_rejected, core.stats().repaired),
        (2, 2)
    );
}

#[test]
fn a_restart_numbering_from_zero_is_reported() {
    let mut core = Core::new(b"", None, 100);
    for seq in 5..8 {
        assert!(matches!(
            core.on_live(&live(b"", seq, payload(seq)), true),
            Live::Delivered(_)
        ));
    }
    let Live::Delivered(received) = core.on_live(&live(b"", 0, payload(0)), true) else {
        panic!("a restart at 0 has no gap")
    };
    assert!(received.restarted && received.needs_resync());
    assert_eq!(received.batches, vec![(0, batch(0))]);
    assert_eq!(core.stats().restarts, 1);
}

#[test]
fn sequence_number_max_is_followed_by_a_new_epoch() {
    let mut core = Core::new(b"", None, 100);
    let Live::Delivered(last) = core.on_live(&live(b"", u64::MAX, payload(u64::MAX)), true) else {
        panic!("first message")
    };
    assert_eq!(last.batches.len(), 1);
    let Live::Delivered(next) = core.on_live(&live(b"", 0, payload(0)), true) else {
        panic!("a new epoch")
    };
    assert!(next.restarted);
}

#[test]
fn an_answer_cut_off_at_its_budget_is_not_clean() {
    let mut core = Core::new(b"", Some(0), 2);
    assert!(matches!(
        core.on_live(&live(b"", 9, payload(9)), true),
        Live::Repair { from: 0 }
    ));
    assert!(matches!(
        core.on_replay(&replayed(b"", 0, payload(0))),
        Replay::Pending
    ));
    let Replay::Done { received, clean } = core.on_replay(&replayed(b"", 1, payload(1))) else {
        panic!("two messages are the budget")
    };
    assert!(!clean, "the rest of the answer may still come");
    // 0 and 1 do not reach 9: a hole between them, so only 9 is delivered.
    assert_eq!((received.lost, received.batches), (9, vec![(9, batch(9))]));
}
