//! One test per defect of the C# spec (`shared/design/queue.md` §1), named
//! after it. Each would fail on the spec's behaviour. Defect 8 (an `int`
//! sequence number) and the blocked-consumer half of defect 11 are unit tests
//! (`src/queue/tests.rs`); defect 15 (exactly-once under concurrency) is the
//! stress test and the loom models.

use std::thread;
use std::time::Duration;

use kvbm_queue::{
    Aging, GenerationReserve, KvLayout, Priority, QueueConfig, QueueError, Selection,
};

use crate::{Req, check, drain_ids, queue, req, sized, with_config};

#[test]
fn defect_01_removed_request_is_never_served() -> Result<(), QueueError> {
    let q = queue(8);
    for id in 1..=3 {
        q.enqueue(req(id, Priority::Normal))?;
    }
    assert_eq!(q.remove(2).map(|r| r.id), Some(2));
    assert!(!q.contains(2));
    assert_eq!(q.len(), 2);
    assert_eq!(q.queued_ids(), [1, 3]);
    let batch = q.select_batch(8, 8);
    assert_eq!(batch.iter().map(|a| a.id()).collect::<Vec<_>>(), [1, 3]);

    // The spec's stale heap entry, popped later, erased the index of a
    // re-enqueued request with the same id. Here the new one stays visible.
    q.enqueue(req(5, Priority::High))?;
    q.remove(5);
    q.enqueue(req(5, Priority::Low))?;
    q.enqueue(req(6, Priority::Normal))?;
    assert_eq!(q.try_dequeue()?.id, 6);
    assert!(q.contains(5), "the re-enqueued request is still indexed");
    assert_eq!(q.remove(5).map(|r| r.priority), Some(Priority::Low));
    assert!(q.is_empty());
    Ok(())
}

#[test]
fn defect_02_no_counter_drifts_from_the_live_count() -> Result<(), QueueError> {
    let q = queue(8);
    // Selection and clear take requests without consuming "permits"; the
    // spec's semaphore kept them, so a later Dequeue woke with nothing.
    for round in 0..1000 {
        q.enqueue(req(round, Priority::Normal))?;
        q.enqueue(req(10_000 + round, Priority::Normal))?;
        assert_eq!(q.select_batch(1, 8).len(), 1);
        assert_eq!(q.clear().len(), 1);
    }
    assert_eq!(q.try_dequeue(), Err(QueueError::Empty));
    assert_eq!(
        q.dequeue_timeout(Duration::from_millis(5)),
        Err(QueueError::Timeout),
        "waits, rather than waking to nothing"
    );
    // A blocking consumer started now gets the next request, not a null.
    let consumer = {
        let q = q.clone();
        thread::spawn(move || q.dequeue())
    };
    q.enqueue(req(99_999, Priority::Normal))?;
    assert_eq!(
        consumer.join().ok().and_then(Result::ok).map(|r| r.id),
        Some(99_999)
    );
    assert!(q.stats().is_balanced());
    Ok(())
}

#[test]
fn defect_03_selection_skips_and_never_charges_removed_or_cancelled() -> Result<(), QueueError> {
    let q = queue(64);
    // A removed request at the head must not stop selection either.
    q.enqueue(sized(1, Priority::Critical, 50))?;
    let cancelled = q.enqueue(sized(2, Priority::High, 4))?;
    for id in 3..=5 {
        q.enqueue(sized(id, Priority::Normal, 2))?;
    }
    q.remove(1);
    q.cancel(cancelled);
    let batch = q.select_batch(8, 6);
    assert_eq!(batch.iter().map(|a| a.id()).collect::<Vec<_>>(), [3, 4, 5]);
    assert_eq!(batch.blocks(), 6, "only live requests are charged");
    Ok(())
}

#[test]
fn defect_04_request_larger_than_the_pool_is_refused_at_enqueue() -> Result<(), QueueError> {
    let q = queue(10);
    let rejected = q.enqueue(sized(1, Priority::Critical, 11)).unwrap_err();
    assert_eq!(
        rejected.error(),
        &QueueError::TooLarge {
            needed: 11,
            pool: 10
        }
    );
    assert_eq!(rejected.into_inner(), sized(1, Priority::Critical, 11));
    q.enqueue(sized(2, Priority::Critical, 10))?; // the whole pool is fine
    q.enqueue(sized(3, Priority::Normal, 1))?;
    // Nothing can block the head forever: with the whole pool free, it goes.
    assert_eq!(q.select_batch(8, 10).len(), 1);
    assert_eq!(q.select_batch(8, 10).len(), 1);
    Ok(())
}

#[test]
fn defect_04_head_of_line_is_the_stated_default() -> Result<(), QueueError> {
    let q = queue(16);
    assert_eq!(q.config().selection(), Selection::HeadOfLine);
    q.enqueue(sized(1, Priority::Normal, 2))?;
    q.enqueue(sized(2, Priority::Normal, 8))?;
    q.enqueue(sized(3, Priority::Normal, 1))?;
    let batch = q.select_batch(8, 6);
    assert_eq!(batch.iter().map(|a| a.id()).collect::<Vec<_>>(), [1]);
    assert_eq!(batch.bypassed(), 0);
    assert_eq!(q.queued_ids(), [2, 3], "3 fits but does not overtake 2");
    Ok(())
}

#[test]
fn defect_05_a_selected_request_goes_back_to_its_original_place() -> Result<(), QueueError> {
    let q = queue(16);
    let ticket = q.enqueue(req(1, Priority::High))?;
    q.enqueue(req(2, Priority::Normal))?;
    q.enqueue(req(3, Priority::Normal))?;
    let mut batch = q.select_batch(2, 16); // 1 and 2
    q.enqueue(req(4, Priority::Normal))?; // arrives while the batch is out
    q.enqueue(req(5, Priority::High))?;
    let failed = batch.split_off(0);
    assert_eq!(batch.blocks(), 0);
    for admitted in failed.into_iter().rev() {
        q.restore(admitted).map_err(|r| r.into_parts().0)?;
    }
    assert_eq!(q.queued_ids(), [1, 5, 2, 3, 4]);
    assert!(q.is_queued(ticket), "the ticket works again");
    assert_eq!(q.cancel(ticket).map(|r| r.id), Some(1));

    // Restoring refuses (and hands back) what cannot go back.
    let admitted = q.select_batch(1, 16).into_iter().next().expect("5 fits");
    let other = queue(16);
    let foreign = other.restore(admitted).unwrap_err();
    assert_eq!(foreign.error(), &QueueError::ForeignQueue);
    let admitted = foreign.into_inner();
    q.enqueue(req(5, Priority::Low))?;
    let duplicate = q.restore(admitted).unwrap_err();
    assert_eq!(duplicate.error(), &QueueError::Duplicate);
    q.remove(5);
    let admitted = duplicate.into_inner();
    q.close();
    let closed = q.restore(admitted).unwrap_err();
    assert_eq!(closed.error(), &QueueError::Closed);
    assert_eq!(closed.into_inner().into_request(), req(5, Priority::High));
    Ok(())
}

#[test]
fn defect_06_kv_cost_comes_from_the_model_layout() -> Result<(), QueueError> {
    // Llama-3-8B: 2 (K and V) x 32 layers x 8 KV heads x 128 dims x 2 bytes.
    let llama = KvLayout::new(32, 8, 128, 2)?;
    assert_eq!(llama.bytes_per_token(), 131_072);
    assert_eq!(
        llama.bytes_per_token() / 4,
        32_768,
        "the spec charged 4 B/token"
    );
    assert_eq!(llama.bytes_per_block(16), Some(2 << 20));
    assert_eq!(llama.tensor_parallel(2)?.bytes_per_token(), 65_536);
    assert_eq!(llama.tensor_parallel(8)?.kv_heads_per_rank(), 1);
    assert_eq!(
        llama.tensor_parallel(16)?.kv_heads_per_rank(),
        1,
        "replicated"
    );

    let config = QueueConfig::new(16, 1_000).with_layout(llama);
    // 1000 prompt + min(4096, 256) reserve = 1256 tokens = 79 blocks = 158 MiB.
    assert_eq!(config.request_blocks(1000, 4096), 79);
    let q = with_config(config);
    let r = Req {
        id: 1,
        priority: Priority::Normal,
        prompt: 1000,
        max_new: 4096,
    };
    q.enqueue(r)?;
    let budget = 79 * (2 << 20);
    assert!(q.select_batch_bytes(1, budget - 1)?.is_empty());
    assert_eq!(q.select_batch_bytes(1, budget)?.blocks(), 79);
    // No overflow: the spec's int arithmetic broke at 16k tokens.
    assert_eq!(config.request_blocks(u32::MAX, u32::MAX), 268_435_472);

    // Rounding up to whole blocks, and the configurable reserve.
    let block_16 = QueueConfig::new(16, 1 << 20);
    check(
        |(prompt, max_new)| block_16.request_blocks(prompt, max_new),
        &[
            ((0, 0), 0),
            ((1, 0), 1),
            ((16, 0), 1),
            ((17, 0), 2),
            ((0, 16), 1),
            ((0, 1000), 16), // capped at 256
            ((15, 1), 1),
        ],
    );
    let full = block_16.with_reserve(GenerationReserve::Full);
    assert_eq!(full.request_blocks(0, 1000), 63);
    let none = block_16.with_reserve(GenerationReserve::Capped(0));
    assert_eq!(none.request_blocks(17, 1000), 2);
    Ok(())
}

#[test]
fn defect_07_equal_priorities_are_fifo_and_higher_is_served_first() -> Result<(), QueueError> {
    let q = queue(8);
    for id in 0..1000 {
        q.enqueue(req(id, Priority::Normal))?;
    }
    assert_eq!(drain_ids(&q), (0..1000).collect::<Vec<_>>());

    assert!(Priority::Low < Priority::Normal);
    assert!(Priority::Normal < Priority::High);
    assert!(Priority::High < Priority::Critical);
    assert_eq!(Priority::default(), Priority::Normal);
    for id in 0..40 {
        q.enqueue(req(id, Priority::ALL[id as usize % 4]))?;
    }
    let order: Vec<u32> = drain_ids(&q);
    let want: Vec<u32> = [3, 2, 1, 0]
        .into_iter()
        .flat_map(|p| (0..40).filter(move |id| id % 4 == p))
        .collect();
    assert_eq!(order, want);
    Ok(())
}

#[test]
fn defect_09_cancellation_leaves_nothing_registered_and_never_misfires() -> Result<(), QueueError> {
    let q = queue(8);
    // A late cancel after the request left does nothing.
    let served = q.enqueue(req(1, Priority::Normal))?;
    assert_eq!(q.try_dequeue()?.id, 1);
    assert_eq!(q.cancel(served), None);
    // A stale handle does not hit a new request that reuses the id.
    let stale = q.enqueue(req(2, Priority::Normal))?;
    q.remove(2);
    q.enqueue(req(2, Priority::High))?;
    assert_eq!(q.cancel(stale), None);
    assert_eq!(q.cancel_handle(stale).cancel(), None);
    assert!(q.contains(2));
    // Dropping tickets and handles changes nothing: there is no
    // registration to undo.
    let kept: Vec<_> = (10..20)
        .map(|id| {
            q.enqueue(req(id, Priority::Low))
                .map(|t| q.cancel_handle(t))
        })
        .collect::<Result<_, _>>()?;
    drop(kept);
    assert_eq!(q.len(), 11);
    // Handles outlive clear and close harmlessly.
    let late = q.enqueue(req(30, Priority::Low))?;
    q.clear();
    q.close();
    assert_eq!(q.cancel(late), None);
    assert_eq!(q.stats().cancelled, 0);
    Ok(())
}

#[test]
fn defect_10_empty_timeout_closed_and_cancelled_are_distinct() {
    let q = queue(8);
    let empty = q.try_dequeue().unwrap_err();
    let timeout = q.dequeue_timeout(Duration::ZERO).unwrap_err();
    let token = q.wait_token();
    token.cancel();
    let cancelled = q.dequeue_cancellable(&token).unwrap_err();
    q.close();
    let closed = q.dequeue().unwrap_err();
    let all = [empty, timeout, cancelled, closed];
    assert_eq!(
        all,
        [
            QueueError::Empty,
            QueueError::Timeout,
            QueueError::Cancelled,
            QueueError::Closed
        ]
    );
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            assert_ne!(a.to_string(), b.to_string());
        }
    }
    // After close every dequeue flavour reports Closed, not Empty/Timeout.
    assert_eq!(q.try_dequeue(), Err(QueueError::Closed));
    assert_eq!(q.dequeue_timeout(Duration::ZERO), Err(QueueError::Closed));
    assert_eq!(
        q.dequeue_cancellable(&q.wait_token()),
        Err(QueueError::Closed)
    );
}

#[test]
fn defect_11_close_refuses_enqueues_and_lets_the_rest_drain() -> Result<(), QueueError> {
    let q = queue(8);
    for id in 1..=4 {
        q.enqueue(req(id, Priority::Normal))?;
    }
    assert!(q.close());
    assert!(!q.close(), "close is idempotent");
    assert!(q.is_closed());
    let refused = q.enqueue(req(9, Priority::Critical)).unwrap_err();
    assert_eq!(refused.error(), &QueueError::Closed);
    assert_eq!(refused.into_inner().id, 9);
    assert_eq!(
        q.remove(4).map(|r| r.id),
        Some(4),
        "remove works after close"
    );
    assert_eq!(q.select_batch(1, 8).len(), 1, "so does selection");
    assert_eq!(q.dequeue()?.id, 2, "dequeue drains");
    assert_eq!(q.dequeue_timeout(Duration::from_secs(60))?.id, 3);
    assert_eq!(q.dequeue(), Err(QueueError::Closed));
    Ok(())
}

#[test]
fn defect_12_len_and_is_empty_are_exact_after_every_operation() -> Result<(), QueueError> {
    let q = queue(8);
    let expect = |n: usize| {
        assert_eq!(q.len(), n);
        assert_eq!(q.is_empty(), n == 0);
        assert_eq!(q.queued_ids().len(), n);
        let stats = q.stats();
        assert_eq!(stats.len, n);
        assert!(stats.is_balanced(), "{stats:?}");
    };
    let h = q.enqueue(req(1, Priority::Normal))?;
    expect(1);
    q.enqueue(req(2, Priority::Normal))?;
    q.enqueue(req(3, Priority::Normal))?;
    expect(3);
    assert!(q.enqueue(req(3, Priority::Normal)).is_err());
    expect(3);
    q.cancel(h);
    expect(2);
    q.remove(2);
    expect(1);
    q.remove(2);
    expect(1);
    let batch = q.select_batch(4, 8);
    expect(0);
    for a in batch {
        q.restore(a).map_err(QueueError::from)?;
    }
    expect(1);
    q.try_dequeue()?;
    expect(0);
    Ok(())
}

#[test]
fn defect_13_duplicate_ids_are_refused_and_clear_resets_everything() -> Result<(), QueueError> {
    let q = queue(8);
    q.enqueue(Req {
        id: 1,
        priority: Priority::Low,
        prompt: 1,
        max_new: 0,
    })?;
    let second = Req {
        id: 1,
        priority: Priority::Critical,
        prompt: 2,
        max_new: 0,
    };
    let rejected = q.enqueue(second.clone()).unwrap_err();
    assert_eq!(rejected.error(), &QueueError::Duplicate);
    assert_eq!(rejected.into_inner(), second, "the same request comes back");
    assert_eq!(q.len(), 1);
    assert_eq!(
        q.try_dequeue()?.prompt,
        1,
        "the first is kept, not overwritten"
    );
    assert_eq!(q.try_dequeue(), Err(QueueError::Empty), "served once");

    let ticket = q.enqueue(req(2, Priority::Normal))?;
    q.enqueue(req(3, Priority::Normal))?;
    assert_eq!(q.clear().len(), 2);
    assert!(!q.contains(2) && !q.contains(3));
    assert!(!q.is_queued(ticket));
    q.enqueue(req(2, Priority::Normal))?;
    assert_eq!(q.cancel(ticket), None);
    assert_eq!(drain_ids(&q), [2]);
    Ok(())
}

#[test]
fn defect_14_strict_priority_starves_but_an_aging_window_bounds_it() -> Result<(), QueueError> {
    // Strict (the default): Low waits behind every later High.
    let strict = queue(8);
    strict.enqueue(req(0, Priority::Low))?;
    for id in 1..=20 {
        strict.enqueue(req(id, Priority::High))?;
    }
    assert_eq!(strict.queued_ids().last(), Some(&0));

    // Window(w): a Low request is overtaken by at most 3w later Critical ones.
    for w in [0, 1, 5] {
        let aged = with_config(QueueConfig::new(16, 8).with_aging(Aging::Window(w)));
        aged.enqueue(req(0, Priority::Low))?;
        for id in 1..=20 {
            aged.enqueue(req(id, Priority::Critical))?;
        }
        let position = aged.queued_ids().iter().position(|&id| id == 0);
        assert_eq!(position, Some(3 * w as usize), "window {w}");
        // One step less of priority costs exactly w arrivals.
        let high = with_config(QueueConfig::new(16, 8).with_aging(Aging::Window(w)));
        high.enqueue(req(0, Priority::High))?;
        for id in 1..=20 {
            high.enqueue(req(id, Priority::Critical))?;
        }
        assert_eq!(
            high.queued_ids().iter().position(|&id| id == 0),
            Some(w as usize)
        );
    }
    Ok(())
}

#[test]
fn defect_14_skip_ahead_passes_a_request_over_at_most_max_bypass_times() -> Result<(), QueueError> {
    let q = with_config(
        QueueConfig::new(16, 16).with_selection(Selection::SkipAhead {
            max_scan: 16,
            max_bypass: 2,
        }),
    );
    q.enqueue(sized(0, Priority::Normal, 8))?; // does not fit a budget of 4
    for id in 1..=6 {
        q.enqueue(sized(id, Priority::Normal, 1))?;
    }
    let ids = |b: kvbm_queue::Batch<Req>| b.iter().map(|a| a.id()).collect::<Vec<_>>();
    let first = q.select_batch(2, 4);
    assert_eq!(first.bypassed(), 1);
    assert_eq!(ids(first), [1, 2]);
    let second = q.select_batch(2, 4);
    assert_eq!(ids(second), [3, 4]);
    // Passed over twice: request 0 now reserves the head.
    let third = q.select_batch(2, 4);
    assert!(third.is_empty());
    assert_eq!(q.queued_ids(), [0, 5, 6]);
    let fourth = q.select_batch(8, 10);
    assert_eq!(ids(fourth), [0, 5, 6]);
    Ok(())
}
