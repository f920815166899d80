//! Pins the auto traits: sequences and their block handles may move to and
//! be dropped on any thread, whatever the tier marker is.

use std::rc::Rc;

use kvbm_sequence::{BlockSequence, LogicalBlockAssignments, RequestSequence, Salt, SequenceError};

fn send_sync<T: Send + Sync>() {}

/// A tier marker that is itself neither `Send` nor `Sync`.
#[allow(dead_code)]
struct NotSendMarker(Rc<()>);

#[test]
fn sequences_are_send_and_sync_for_any_marker() {
    send_sync::<RequestSequence<NotSendMarker>>();
    send_sync::<LogicalBlockAssignments<NotSendMarker>>();
    send_sync::<BlockSequence>();
    send_sync::<Salt>();
}

#[test]
fn the_error_is_a_well_behaved_error() {
    fn error<E: std::error::Error + Send + Sync + 'static>() {}
    error::<SequenceError>();
}

#[test]
fn a_sequence_holding_blocks_drops_on_another_thread() {
    let manager = crate::manager(4);
    let mut seq = crate::request(&[1, 2, 3, 4, 5], 3);
    seq.allocate_blocks(2, &manager).unwrap();
    seq.complete_and_register_pending(&manager).unwrap();
    std::thread::spawn(move || drop(seq)).join().unwrap();
    let audit = crate::audit(&manager);
    assert_eq!((audit.free_blocks, audit.inactive_blocks), (3, 1));
}
