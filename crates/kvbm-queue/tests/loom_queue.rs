//! Loom models of the request queue: every interleaving (up to
//! `LOOM_MAX_PREEMPTIONS`) of a few threads using the public API. A lost
//! wake-up shows up as a loom deadlock, a lost or duplicated request as a
//! failed assertion.
//!
//! Run: `RUSTFLAGS="--cfg kvbm_loom -C debug-assertions" LOOM_MAX_PREEMPTIONS=2
//! cargo test -p kvbm-queue --release --target-dir target/loom --test loom_queue`
#![cfg(kvbm_loom)]

use std::time::Duration;

use loom::thread;

use kvbm_queue::{QueueConfig, QueueError, Request, RequestQueue};

/// A request: an id plus a generation, to tell apart two requests that share
/// an id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct R {
    id: u32,
    generation: u32,
}

fn r(id: u32) -> R {
    R { id, generation: 0 }
}

impl Request for R {
    type Id = u32;
    fn id(&self) -> u32 {
        self.id
    }
    fn prompt_tokens(&self) -> u32 {
        16
    }
    fn max_new_tokens(&self) -> u32 {
        0
    }
}

fn queue() -> RequestQueue<R> {
    RequestQueue::new(QueueConfig::new(16, 8)).expect("valid config")
}

fn spawn<T: 'static>(f: impl FnOnce() -> T + 'static) -> thread::JoinHandle<T> {
    thread::spawn(f)
}

#[test]
fn enqueue_racing_a_blocked_dequeue_delivers_the_request() {
    loom::model(|| {
        let q = queue();
        let consumer = {
            let q = q.clone();
            spawn(move || q.dequeue())
        };
        q.enqueue(r(1)).expect("fresh id");
        assert_eq!(consumer.join().expect("no panic"), Ok(r(1)));
        assert!(q.is_empty());
    });
}

#[test]
fn two_producers_one_consumer_deliver_each_request_exactly_once() {
    loom::model(|| {
        let q = queue();
        let producers: Vec<_> = [1, 2]
            .into_iter()
            .map(|id| {
                let q = q.clone();
                spawn(move || q.enqueue(r(id)).map(|_| ()).map_err(QueueError::from))
            })
            .collect();
        let mut got = [q.dequeue(), q.dequeue()].map(|r| r.ok().map(|r| r.id));
        got.sort();
        assert_eq!(got, [Some(1), Some(2)]);
        for producer in producers {
            assert_eq!(producer.join().expect("no panic"), Ok(()));
        }
        assert_eq!(q.try_dequeue(), Err(QueueError::Empty));
        assert!(q.stats().is_balanced());
    });
}

#[test]
fn cancel_racing_dequeue_exactly_one_of_them_gets_the_request() {
    loom::model(|| {
        let q = queue();
        let handle = q.cancel_handle(q.enqueue(r(1)).expect("fresh id"));
        let canceller = {
            let q = q.clone();
            spawn(move || {
                let cancelled = handle.cancel();
                q.close(); // so the consumer cannot wait forever
                cancelled
            })
        };
        let dequeued = q.dequeue();
        let cancelled = canceller.join().expect("no panic");
        match (dequeued, cancelled) {
            (Ok(got), None) | (Err(QueueError::Closed), Some(got)) => assert_eq!(got, r(1)),
            other => panic!("not exactly one winner: {other:?}"),
        }
        assert!(q.is_empty());
        assert!(q.stats().is_balanced());
    });
}

#[test]
fn close_racing_a_blocked_dequeue_wakes_it_with_closed() {
    loom::model(|| {
        let q = queue();
        let consumer = {
            let q = q.clone();
            spawn(move || q.dequeue())
        };
        assert!(q.close());
        assert_eq!(consumer.join().expect("no panic"), Err(QueueError::Closed));
    });
}

#[test]
fn close_racing_enqueue_and_a_blocked_dequeue_never_loses_the_request() {
    loom::model(|| {
        let q = queue();
        let consumer = {
            let q = q.clone();
            spawn(move || q.dequeue())
        };
        let producer = {
            let q = q.clone();
            spawn(move || q.enqueue(r(1)).is_ok())
        };
        q.close();
        let accepted = producer.join().expect("no panic");
        let got = consumer.join().expect("no panic");
        if accepted {
            // Accepted before the close: drained after it at the latest.
            assert_eq!(got, Ok(r(1)));
        } else {
            assert_eq!(got, Err(QueueError::Closed));
        }
        assert!(q.is_empty());
    });
}

#[test]
fn remove_racing_select_batch_puts_the_request_in_exactly_one_result() {
    loom::model(|| {
        let q = queue();
        q.enqueue(r(1)).expect("fresh id");
        q.enqueue(r(2)).expect("fresh id");
        let remover = {
            let q = q.clone();
            spawn(move || q.remove(1))
        };
        let batch = q.select_batch(2, 2);
        let removed = remover.join().expect("no panic");
        let selected: Vec<u32> = batch.iter().map(|a| a.id()).collect();
        match removed {
            Some(got) => {
                assert_eq!(got, r(1));
                assert_eq!(selected, [2]);
                assert_eq!(batch.blocks(), 1);
            }
            None => {
                assert_eq!(selected, [1, 2]);
                assert_eq!(batch.blocks(), 2);
            }
        }
        assert!(q.is_empty());
        assert!(q.stats().is_balanced());
    });
}

/// Model time stands in for real time: a thread advances the clock, which
/// wakes the waiters. It jumps to the end of model time, so the deadline has
/// passed whether the timed dequeue set it before or after the jump. A waiter
/// woken for a request must take it rather than report a timeout and swallow
/// the wake-up the other waiter needed.
#[test]
fn timed_dequeue_times_out_on_model_time_without_swallowing_a_wake_up() {
    loom::model(|| {
        let q = queue();
        let timed = {
            let q = q.clone();
            spawn(move || q.dequeue_timeout(Duration::from_millis(10)))
        };
        let blocking = {
            let q = q.clone();
            spawn(move || q.dequeue())
        };
        let producer = {
            let q = q.clone();
            spawn(move || q.enqueue(r(1)).is_ok())
        };
        q.loom_advance_clock(Duration::MAX);
        let timed = timed.join().expect("no panic");
        match timed {
            Ok(got) => {
                assert_eq!(got, r(1));
                q.close();
                assert_eq!(blocking.join().expect("no panic"), Err(QueueError::Closed));
            }
            Err(error) => {
                assert_eq!(error, QueueError::Timeout);
                assert_eq!(blocking.join().expect("no panic"), Ok(r(1)));
            }
        }
        assert!(producer.join().expect("no panic"));
    });
}

#[test]
fn stale_cancel_handle_never_hits_a_reused_id() {
    loom::model(|| {
        let q = queue();
        let stale = q.cancel_handle(q.enqueue(r(1)).expect("fresh id"));
        let canceller = spawn(move || stale.cancel());
        // Take the first instance (if the canceller has not) and reuse its id.
        let first = q.try_dequeue();
        let second = R {
            id: 1,
            generation: 1,
        };
        let requeued = q.enqueue(second).is_ok();
        let cancelled = canceller.join().expect("no panic");
        assert_ne!(
            cancelled,
            Some(second),
            "the stale handle hit the new request"
        );
        match (first, cancelled) {
            (Ok(got), None) | (Err(QueueError::Empty), Some(got)) => assert_eq!(got, r(1)),
            other => panic!("first instance not taken exactly once: {other:?}"),
        }
        // The first instance was gone before the enqueue in every case, so
        // the id was free and the new instance is queued.
        assert!(requeued);
        assert_eq!(q.try_dequeue(), Ok(second));
    });
}

/// A consumer whose token is cancelled may have absorbed the wake-up meant
/// for a request; it must pass it on to the other consumer.
#[test]
fn cancelled_wait_passes_its_wake_up_on() {
    loom::model(|| {
        let q = queue();
        let token = q.wait_token();
        let cancellable = {
            let (q, token) = (q.clone(), token.clone());
            spawn(move || q.dequeue_cancellable(&token))
        };
        let blocking = {
            let q = q.clone();
            spawn(move || q.dequeue())
        };
        let canceller = spawn(move || token.cancel());
        q.enqueue(r(1)).expect("fresh id");
        canceller.join().expect("no panic");
        match cancellable.join().expect("no panic") {
            Ok(got) => {
                assert_eq!(got, r(1));
                q.close();
                assert_eq!(blocking.join().expect("no panic"), Err(QueueError::Closed));
            }
            Err(error) => {
                assert_eq!(error, QueueError::Cancelled);
                assert_eq!(blocking.join().expect("no panic"), Ok(r(1)));
            }
        }
    });
}
