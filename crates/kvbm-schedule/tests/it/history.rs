//! The event history: what each transition records, and how the policies
//! bound it.

use kvbm_schedule::{HistoryPolicy, SchedulableSequence, SequenceEvent, SequenceState};

use crate::{BLOCK_SIZE, Gpu, manager, request};

#[test]
fn every_transition_records_its_event_with_the_numbers() {
    use SequenceEvent as E;
    let m = manager(16);
    let mut seq = request(8, 10);
    assert_eq!(seq.match_and_add_prefix(&m).unwrap(), 0);
    seq.schedule_prefill(6, &m).unwrap();
    seq.revert_schedule().unwrap();
    seq.schedule_prefill(6, &m).unwrap();
    seq.apply_prefill(None, &m).unwrap();
    seq.schedule_prefill(2, &m).unwrap();
    seq.apply_prefill(Some(100), &m).unwrap();
    seq.schedule_decode(&m).unwrap();
    seq.apply_decode(101, &m).unwrap();
    seq.schedule_speculative(3, &m).unwrap();
    seq.apply_speculative(&[102], &m).unwrap();
    seq.release().unwrap();
    assert_eq!(seq.reacquire(&m).unwrap(), 2);

    let expected = vec![
        E::Created {
            num_input_tokens: 8,
            max_output_tokens: 10,
            block_size: 4,
        },
        E::PrefixMatched {
            blocks_matched: 0,
            kv_position: 0,
        },
        E::PrefillScheduled {
            num_tokens: 6,
            kv_position: 0,
            blocks_allocated: 2,
        },
        E::ScheduleReverted {
            reverted: SequenceState::PrefillScheduled {
                num_tokens: 6,
                blocks_allocated: 2,
            },
            blocks_released: 2,
        },
        E::PrefillScheduled {
            num_tokens: 6,
            kv_position: 0,
            blocks_allocated: 2,
        },
        E::PrefillApplied {
            num_tokens: 6,
            kv_position: 6,
            blocks_registered: 1,
            token: None,
        },
        E::PrefillScheduled {
            num_tokens: 2,
            kv_position: 6,
            blocks_allocated: 0,
        },
        E::PrefillApplied {
            num_tokens: 2,
            kv_position: 8,
            blocks_registered: 1,
            token: Some(100),
        },
        E::DecodeScheduled {
            kv_position: 8,
            blocks_allocated: 1,
        },
        E::DecodeApplied {
            token: 101,
            kv_position: 9,
            blocks_registered: 0,
            block_completed: false,
        },
        E::SpeculativeScheduled {
            requested: 3,
            num_tokens: 3,
            kv_position: 9,
            blocks_allocated: 1,
        },
        E::SpeculativeApplied {
            accepted: 1,
            scheduled: 3,
            kv_position: 10,
            blocks_registered: 0,
            blocks_released: 1,
        },
        E::Released {
            blocks_released: 3,
            kv_position: 10,
        },
        E::Reacquired {
            prefix_matched: 2,
            kv_position: 8,
            tokens_to_recompute: 2,
        },
    ];
    assert_eq!(seq.history().to_vec(), expected);
    assert_eq!(seq.history().dropped(), 0);
}

#[test]
fn a_refused_call_records_nothing() {
    let m = manager(4);
    let mut seq = request(8, 4);
    let before = seq.history().to_vec();
    assert!(seq.schedule_decode(&m).is_err());
    assert!(seq.apply_prefill(None, &m).is_err());
    assert!(seq.schedule_prefill(100, &m).is_err());
    assert_eq!(seq.history().to_vec(), before);
}

/// A long generation with a bounded history keeps memory flat; the log
/// still counts every event.
#[test]
fn bounded_and_disabled_histories_stay_bounded_over_a_long_decode() {
    const STEPS: usize = 20_000;
    for (policy, kept) in [
        (HistoryPolicy::Last(16), 16),
        (HistoryPolicy::Off, 0),
        (HistoryPolicy::Full, 2 * STEPS + 3),
    ] {
        // A pool big enough to hold the whole generation.
        let m = manager(STEPS / BLOCK_SIZE + 4);
        let mut seq = SchedulableSequence::<Gpu>::builder(vec![1, 2, 3, 4], STEPS + 1, BLOCK_SIZE)
            .history(policy)
            .build()
            .unwrap();
        seq.schedule_prefill(4, &m).unwrap();
        seq.apply_prefill(Some(0), &m).unwrap();
        for step in 0..STEPS {
            seq.schedule_decode(&m).unwrap();
            seq.apply_decode(step as u32, &m).unwrap();
        }
        let log = seq.history();
        let recorded = (2 * STEPS + 3) as u64; // created, prefill x2, decode x2 per step
        assert_eq!(log.len(), kept, "{policy:?}");
        assert_eq!(log.recorded(), recorded, "{policy:?}");
        assert_eq!(log.dropped(), recorded - kept as u64, "{policy:?}");
        assert_eq!(log.policy(), policy);
        if kept > 0 {
            assert!(matches!(
                log.last(),
                Some(SequenceEvent::DecodeApplied { token, .. }) if *token == STEPS as u32 - 1
            ));
        }
    }
}
