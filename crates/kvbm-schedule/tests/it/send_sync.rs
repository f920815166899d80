//! Pins the auto traits: a sequence may move to and be dropped on any
//! thread, whatever its tier marker, and the errors are well-behaved.

use std::rc::Rc;

use kvbm_schedule::{
    ApplyError, DecodeOutcome, EventLog, HistoryPolicy, SchedulableSequence,
    SchedulableSequenceBuilder, ScheduleError, SequenceEvent, SequenceState,
};

fn send_sync<T: Send + Sync>() {}

/// A tier marker that is itself neither `Send` nor `Sync`.
#[allow(dead_code)]
struct NotSendMarker(Rc<()>);

#[test]
fn sequences_are_send_and_sync_for_any_marker() {
    send_sync::<SchedulableSequence<NotSendMarker>>();
    send_sync::<SchedulableSequenceBuilder<NotSendMarker>>();
    send_sync::<EventLog>();
    send_sync::<SequenceEvent>();
    send_sync::<SequenceState>();
    send_sync::<DecodeOutcome>();
    send_sync::<HistoryPolicy>();
}

#[test]
fn the_errors_are_well_behaved_errors() {
    fn error<E: std::error::Error + Send + Sync + 'static>() {}
    error::<ScheduleError>();
    error::<ApplyError>();
}

#[test]
fn a_sequence_holding_blocks_drops_on_another_thread() {
    let manager = crate::manager(4);
    let mut seq = crate::request(5, 3);
    seq.schedule_prefill(5, &manager).unwrap();
    seq.apply_prefill(Some(5), &manager).unwrap();
    seq.schedule_decode(&manager).unwrap(); // a pending step, too
    std::thread::spawn(move || drop(seq)).join().unwrap();
    let audit = crate::audit(&manager);
    assert_eq!((audit.free_blocks, audit.inactive_blocks), (3, 1));
}
