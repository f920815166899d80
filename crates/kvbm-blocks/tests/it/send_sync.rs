//! Pins the auto traits of the manager and every handle (tokio's
//! `async_send_sync.rs`): they may be shared and dropped on any thread,
//! whatever the tier marker is.

use std::rc::Rc;

use kvbm_blocks::{
    Allocation, BlockError, BlockManager, BlockManagerBuilder, CompleteBlock, ImmutableBlock,
    ImmutableBlocks, IntoIter, MutableBlock, Rejected, WeakBlock,
};

fn send_sync<T: Send + Sync>() {}

/// A tier marker that is itself neither `Send` nor `Sync`.
#[allow(dead_code)]
struct NotSendMarker(Rc<()>);

#[test]
fn handles_are_send_and_sync_for_any_marker() {
    send_sync::<BlockManager<NotSendMarker>>();
    send_sync::<BlockManagerBuilder<NotSendMarker>>();
    send_sync::<MutableBlock<NotSendMarker>>();
    send_sync::<CompleteBlock<NotSendMarker>>();
    send_sync::<ImmutableBlock<NotSendMarker>>();
    send_sync::<ImmutableBlocks<NotSendMarker>>();
    send_sync::<IntoIter<NotSendMarker>>();
    send_sync::<WeakBlock<NotSendMarker>>();
    send_sync::<Allocation<NotSendMarker>>();
    send_sync::<Rejected<MutableBlock<NotSendMarker>>>();
    send_sync::<BlockError>();
}

#[test]
fn handles_drop_on_other_threads() {
    let manager = crate::manager(4);
    let blocks = crate::register(&manager, &crate::chain(1, 2));
    let mutable = manager.allocate_blocks(1).unwrap();
    std::thread::spawn(move || drop((blocks, mutable)))
        .join()
        .unwrap();
    let audit = crate::audit(&manager);
    assert_eq!((audit.inactive_blocks, audit.free_blocks), (2, 2));
}
