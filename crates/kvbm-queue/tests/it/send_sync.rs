//! Pins the auto traits of the public types (tokio's `async_send_sync.rs`).

use std::rc::Rc;

use kvbm_queue::{
    Admitted, Batch, CancelHandle, QueueConfig, QueueError, QueueStats, Rejected, Request,
    RequestQueue, Ticket, WaitToken,
};

use crate::Req;

fn send_sync<T: Send + Sync>() {}
fn send<T: Send>() {}
fn error<T: std::error::Error + Send + Sync + 'static>() {}

#[test]
fn handles_are_send_and_sync_when_requests_are_send() {
    send_sync::<RequestQueue<Req>>();
    send_sync::<CancelHandle<Req>>();
    send_sync::<Ticket<u32>>();
    send_sync::<WaitToken<Req>>();
    send_sync::<Batch<Req>>();
    send_sync::<Admitted<Req>>();
    send_sync::<QueueConfig>();
    send_sync::<QueueStats>();
    error::<QueueError>();
    error::<Rejected<Req>>();
    error::<Rejected<Admitted<Req>>>();
}

/// A `Send` but not `Sync` request still makes a `Sync` queue: the queue
/// only ever moves requests, under its mutex.
#[test]
fn a_send_only_request_is_enough() {
    struct Cell(std::cell::Cell<u32>);
    impl Request for Cell {
        type Id = u32;
        fn id(&self) -> u32 {
            self.0.get()
        }
        fn prompt_tokens(&self) -> u32 {
            0
        }
        fn max_new_tokens(&self) -> u32 {
            0
        }
    }
    send_sync::<RequestQueue<Cell>>();
    send_sync::<CancelHandle<Cell>>();
    send::<Batch<Cell>>();
}

/// A non-`Send` request type works on one thread (no bound on the trait).
#[test]
fn a_local_request_type_works_on_one_thread() -> Result<(), QueueError> {
    #[derive(Debug)]
    struct Local(Rc<u32>);
    impl Request for Local {
        type Id = u32;
        fn id(&self) -> u32 {
            *self.0
        }
        fn prompt_tokens(&self) -> u32 {
            0
        }
        fn max_new_tokens(&self) -> u32 {
            0
        }
    }
    let q = RequestQueue::new(QueueConfig::new(16, 8))?;
    q.enqueue(Local(Rc::new(3)))?;
    assert_eq!(*q.try_dequeue()?.0, 3);
    Ok(())
}

#[test]
fn every_public_type_has_a_useful_debug() -> Result<(), QueueError> {
    let q = crate::queue(8);
    let ticket = q.enqueue(crate::req(1, kvbm_queue::Priority::High))?;
    let handle = q.cancel_handle(ticket);
    assert!(format!("{ticket:?}").contains("id: 1"));
    let token = q.wait_token();
    let queue_debug = format!("{q:?}");
    assert!(queue_debug.contains("len: 1"), "{queue_debug}");
    assert!(format!("{handle:?}").contains("id: 1"));
    assert!(format!("{token:?}").contains("cancelled: false"));
    let batch = q.select_batch(1, 8);
    assert!(format!("{batch:?}").contains("Admitted"));
    assert!(format!("{:?}", q.stats()).contains("selected: 1"));
    let rejected = q
        .enqueue(crate::sized(2, kvbm_queue::Priority::Low, 9))
        .unwrap_err();
    assert!(format!("{rejected:?}").contains("TooLarge"));
    assert_eq!(
        rejected.to_string(),
        "the request needs 9 KV blocks but the pool has 8"
    );
    Ok(())
}
