//! One test per bullet of the C# spec's "Testing Requirements".

use std::collections::HashSet;
use std::thread;
use std::time::{Duration, Instant};

use kvbm_queue::{Priority, QueueError};

use crate::{drain_ids, queue, req, sized};

// 1. Basic operations

#[test]
fn spec_1_enqueue_and_dequeue_single_request() -> Result<(), QueueError> {
    let q = queue(8);
    q.enqueue(req(7, Priority::Normal))?;
    assert_eq!(q.dequeue()?, req(7, Priority::Normal));
    assert_eq!(q.try_dequeue(), Err(QueueError::Empty));
    Ok(())
}

#[test]
fn spec_1_enqueue_many_dequeue_in_priority_order() -> Result<(), QueueError> {
    let q = queue(8);
    let arrivals = [
        (1, Priority::Low),
        (2, Priority::Normal),
        (3, Priority::Critical),
        (4, Priority::High),
        (5, Priority::Low),
        (6, Priority::Critical),
        (7, Priority::Normal),
    ];
    for (id, priority) in arrivals {
        q.enqueue(req(id, priority))?;
    }
    assert_eq!(q.queued_ids(), [3, 6, 4, 2, 7, 1, 5]);
    assert_eq!(drain_ids(&q), [3, 6, 4, 2, 7, 1, 5]);
    Ok(())
}

#[test]
fn spec_1_count_and_is_empty() -> Result<(), QueueError> {
    let q = queue(8);
    assert!(q.is_empty());
    assert_eq!(q.len(), 0);
    for id in 0..5 {
        q.enqueue(req(id, Priority::Normal))?;
        assert_eq!(q.len(), id as usize + 1);
        assert!(!q.is_empty());
    }
    q.try_dequeue()?;
    assert_eq!(q.len(), 4);
    q.remove(3);
    assert_eq!(q.len(), 3);
    q.clear();
    assert_eq!(q.len(), 0);
    assert!(q.is_empty());
    Ok(())
}

// 2. Cancellation handling

#[test]
fn spec_2_request_cancelled_before_dequeue_is_skipped() -> Result<(), QueueError> {
    let q = queue(8);
    q.enqueue(req(1, Priority::High))?;
    let doomed = q.enqueue(req(2, Priority::High))?;
    q.enqueue(req(3, Priority::High))?;
    assert_eq!(q.cancel(doomed), Some(req(2, Priority::High)));
    assert_eq!(drain_ids(&q), [1, 3]);
    Ok(())
}

#[test]
fn spec_2_cancel_after_enqueue_cleans_up_completely() -> Result<(), QueueError> {
    let q = queue(8);
    let ticket = q.enqueue(req(1, Priority::Normal))?;
    let handle = q.cancel_handle(ticket);
    assert!(q.is_queued(ticket) && handle.is_queued());
    // Cancelled from another thread, as a disconnecting client would.
    let remote = handle.clone();
    let cancelled = thread::spawn(move || remote.cancel()).join();
    assert_eq!(cancelled.ok().flatten().map(|r| r.id), Some(1));
    assert!(!q.is_queued(ticket) && !handle.is_queued());
    assert!(!q.contains(1));
    assert_eq!((q.len(), q.is_empty()), (0, true));
    assert_eq!(handle.cancel(), None, "cancelling twice does nothing");
    assert_eq!(q.cancel(ticket), None);
    assert_eq!(q.stats().cancelled, 1);
    // Nothing stays registered: the id is free, and the old handle cannot
    // touch the new request.
    let reused = q.enqueue(req(1, Priority::Normal))?;
    assert_eq!(reused.id(), ticket.id());
    assert_ne!(reused, ticket);
    assert_eq!(handle.cancel(), None);
    assert_eq!(q.cancel(ticket), None);
    assert!(q.contains(1));
    Ok(())
}

// 3. Batch selection

#[test]
fn spec_3_select_batch_respects_max_count() -> Result<(), QueueError> {
    let q = queue(64);
    for id in 0..10 {
        q.enqueue(req(id, Priority::Normal))?;
    }
    let batch = q.select_batch(4, 64);
    assert_eq!(batch.len(), 4);
    assert_eq!(q.len(), 6);
    assert_eq!(q.select_batch(0, 64).len(), 0);
    assert_eq!(q.len(), 6, "max_count 0 changes nothing");
    Ok(())
}

#[test]
fn spec_3_select_batch_respects_the_memory_budget() -> Result<(), QueueError> {
    let q = queue(64);
    for (id, blocks) in [(1, 3), (2, 2), (3, 4), (4, 1)] {
        q.enqueue(sized(id, Priority::Normal, blocks))?;
    }
    let batch = q.select_batch(10, 9);
    assert_eq!(batch.iter().map(|a| a.id()).collect::<Vec<_>>(), [1, 2, 3]);
    assert_eq!(batch.blocks(), 9, "the budget can be used exactly");
    assert!(batch.iter().map(|a| a.blocks()).sum::<u64>() <= 9);
    assert_eq!(q.queued_ids(), [4]);
    Ok(())
}

#[test]
fn spec_3_selection_keeps_priority_order() -> Result<(), QueueError> {
    let q = queue(64);
    let arrivals = [
        (1, Priority::Low),
        (2, Priority::High),
        (3, Priority::Normal),
        (4, Priority::Critical),
        (5, Priority::High),
    ];
    for (id, priority) in arrivals {
        q.enqueue(req(id, priority))?;
    }
    let batch = q.select_batch(4, 64);
    assert_eq!(
        batch.iter().map(|a| a.id()).collect::<Vec<_>>(),
        [4, 2, 5, 3]
    );
    Ok(())
}

// 4. Thread safety

#[test]
fn spec_4_concurrent_enqueues() {
    let q = queue(8);
    thread::scope(|s| {
        for t in 0..4 {
            let q = &q;
            s.spawn(move || {
                for i in 0..250 {
                    assert!(
                        q.enqueue(req(t * 1000 + i, Priority::ALL[i as usize % 4]))
                            .is_ok()
                    );
                }
            });
        }
    });
    assert_eq!(q.len(), 1000);
    let ids: HashSet<u32> = drain_ids(&q).into_iter().collect();
    assert_eq!(ids.len(), 1000);
}

#[test]
fn spec_4_concurrent_dequeues() -> Result<(), QueueError> {
    let q = queue(8);
    for id in 0..1000 {
        q.enqueue(req(id, Priority::ALL[id as usize % 4]))?;
    }
    let taken: Vec<Vec<u32>> = thread::scope(|s| {
        let consumers: Vec<_> = (0..4).map(|_| s.spawn(|| drain_ids(&q))).collect();
        consumers
            .into_iter()
            .map(|c| c.join().unwrap_or_default())
            .collect()
    });
    let all: Vec<u32> = taken.concat();
    let unique: HashSet<u32> = all.iter().copied().collect();
    assert_eq!((all.len(), unique.len()), (1000, 1000), "each exactly once");
    Ok(())
}

#[test]
fn spec_4_enqueue_dequeue_race_delivers_each_request_once() {
    let q = queue(8);
    let got: Vec<Vec<u32>> = thread::scope(|s| {
        let consumers: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let mut got = Vec::new();
                    while let Ok(r) = q.dequeue() {
                        got.push(r.id);
                    }
                    got
                })
            })
            .collect();
        let producers: Vec<_> = (0..2)
            .map(|t| {
                let q = &q;
                s.spawn(move || {
                    for i in 0..500 {
                        assert!(q.enqueue(req(t * 1000 + i, Priority::Normal)).is_ok());
                    }
                })
            })
            .collect();
        for p in producers {
            assert!(p.join().is_ok());
        }
        q.close();
        consumers
            .into_iter()
            .map(|c| c.join().unwrap_or_default())
            .collect()
    });
    let mut all = got.concat();
    all.sort_unstable();
    let want: Vec<u32> = (0..500).chain(1000..1500).collect();
    assert_eq!(all, want);
    // One consumer sees each producer's requests in FIFO order.
    for mine in got {
        for producer in [0..1000, 1000..2000] {
            let seen: Vec<u32> = mine
                .iter()
                .copied()
                .filter(|id| producer.contains(id))
                .collect();
            assert!(seen.is_sorted(), "FIFO within a priority");
        }
    }
}

// 5. Edge cases

#[test]
fn spec_5_dequeue_from_empty_queue_with_timeout() {
    let q = queue(8);
    let wait = Duration::from_millis(20);
    let start = Instant::now();
    assert_eq!(q.dequeue_timeout(wait), Err(QueueError::Timeout));
    assert!(start.elapsed() >= wait, "it waited (a lower bound only)");
    assert_eq!(q.dequeue_timeout(Duration::ZERO), Err(QueueError::Timeout));
}

#[test]
fn spec_5_dequeue_with_a_cancelled_token() -> Result<(), QueueError> {
    let q = queue(8);
    q.enqueue(req(1, Priority::Normal))?;
    let token = q.wait_token();
    assert!(!token.is_cancelled());
    token.cancel();
    assert!(token.is_cancelled());
    assert_eq!(q.dequeue_cancellable(&token), Err(QueueError::Cancelled));
    assert_eq!(q.len(), 1, "a cancelled consumer takes nothing");
    // A fresh token still works.
    assert_eq!(q.dequeue_cancellable(&q.wait_token())?.id, 1);
    // A token cancelled while its consumer is blocked wakes it.
    let token = q.wait_token();
    let waiting = {
        let (q, token) = (q.clone(), token.clone());
        thread::spawn(move || q.dequeue_cancellable(&token))
    };
    token.cancel();
    assert_eq!(waiting.join().ok(), Some(Err(QueueError::Cancelled)));
    // A token from another queue is refused rather than never waking.
    let other = queue(8);
    assert_eq!(
        q.dequeue_cancellable(&other.wait_token()),
        Err(QueueError::ForeignQueue)
    );
    Ok(())
}

#[test]
fn spec_5_remove_nonexistent_request() -> Result<(), QueueError> {
    let q = queue(8);
    assert_eq!(q.remove(42), None);
    q.enqueue(req(1, Priority::Normal))?;
    assert_eq!(q.remove(42), None);
    assert_eq!(q.remove(1).map(|r| r.id), Some(1));
    assert_eq!(q.remove(1), None, "removing twice finds nothing");
    assert_eq!(q.stats().removed, 1);
    Ok(())
}

#[test]
fn spec_5_clear_empties_the_queue_and_returns_in_service_order() -> Result<(), QueueError> {
    let q = queue(8);
    for (id, p) in [
        (1, Priority::Low),
        (2, Priority::High),
        (3, Priority::Normal),
    ] {
        q.enqueue(req(id, p))?;
    }
    let cleared: Vec<u32> = q.clear().into_iter().map(|r| r.id).collect();
    assert_eq!(cleared, [2, 3, 1]);
    assert!(q.is_empty());
    assert!(!q.contains(2));
    assert!(!q.is_closed(), "clear does not close");
    q.enqueue(req(2, Priority::Normal))?;
    assert_eq!(q.len(), 1);
    Ok(())
}
