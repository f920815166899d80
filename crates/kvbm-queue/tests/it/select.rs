//! `select_batch` policies, byte budgets, restore, and every configuration error.

use kvbm_queue::{KvLayout, Priority, QueueConfig, QueueError, RequestQueue, Selection};

use crate::{Req, check, queue, req, sized, with_config};

fn ids(batch: &kvbm_queue::Batch<Req>) -> Vec<u32> {
    batch.iter().map(|a| a.id()).collect()
}

fn skip_ahead(max_scan: usize, max_bypass: u32) -> RequestQueue<Req> {
    with_config(
        QueueConfig::new(16, 64).with_selection(Selection::SkipAhead {
            max_scan,
            max_bypass,
        }),
    )
}

#[test]
fn skip_ahead_fills_around_a_request_that_does_not_fit() -> Result<(), QueueError> {
    let q = skip_ahead(64, 8);
    q.enqueue(sized(1, Priority::High, 2))?;
    q.enqueue(sized(2, Priority::High, 8))?;
    q.enqueue(sized(3, Priority::Normal, 3))?;
    q.enqueue(sized(4, Priority::Low, 5))?;
    let batch = q.select_batch(8, 6);
    assert_eq!(ids(&batch), [1, 3]);
    assert_eq!(batch.blocks(), 5);
    assert_eq!(
        batch.bypassed(),
        1,
        "2 was passed over; 4 had nothing behind it"
    );
    assert_eq!(q.queued_ids(), [2, 4]);
    Ok(())
}

#[test]
fn a_request_is_only_counted_as_bypassed_if_something_behind_it_was_taken() -> Result<(), QueueError>
{
    let q = skip_ahead(64, 1);
    q.enqueue(sized(1, Priority::Normal, 8))?;
    q.enqueue(sized(2, Priority::Normal, 8))?;
    for _ in 0..5 {
        // Nothing fits: nobody overtakes request 1, so it is not "bypassed".
        let batch = q.select_batch(8, 4);
        assert!(batch.is_empty());
        assert_eq!(batch.bypassed(), 0);
    }
    q.enqueue(sized(3, Priority::Normal, 1))?;
    let batch = q.select_batch(8, 4);
    assert_eq!((ids(&batch), batch.bypassed()), (vec![3], 2));
    // Both are now at their bound of one bypass: they reserve the head.
    q.enqueue(sized(4, Priority::Normal, 1))?;
    assert!(q.select_batch(8, 4).is_empty());
    Ok(())
}

#[test]
fn skip_ahead_examines_at_most_max_scan_requests() -> Result<(), QueueError> {
    let q = skip_ahead(3, 100);
    for id in 1..=3 {
        q.enqueue(sized(id, Priority::Normal, 10))?;
    }
    q.enqueue(sized(4, Priority::Normal, 1))?;
    assert!(
        q.select_batch(8, 4).is_empty(),
        "4 is beyond the scan window"
    );
    assert_eq!(ids(&q.select_batch(8, 10)), [1]);
    assert_eq!(ids(&q.select_batch(8, 4)), [4]);
    Ok(())
}

#[test]
fn zero_budget_takes_only_free_requests_and_max_count_zero_nothing() -> Result<(), QueueError> {
    let q = queue(8);
    q.enqueue(Req {
        id: 1,
        priority: Priority::Normal,
        prompt: 0,
        max_new: 0,
    })?;
    q.enqueue(req(2, Priority::Normal))?;
    assert!(q.select_batch(0, 100).is_empty());
    assert_eq!(q.len(), 2);
    let batch = q.select_batch(8, 0);
    assert_eq!((ids(&batch), batch.blocks()), (vec![1], 0));
    assert_eq!(q.len(), 1);
    Ok(())
}

#[test]
fn a_huge_max_count_takes_only_what_is_there() -> Result<(), QueueError> {
    let q = queue(8);
    for id in 0..5 {
        q.enqueue(req(id, Priority::Normal))?;
    }
    assert_eq!(q.select_batch(usize::MAX, u64::MAX).len(), 5);
    Ok(())
}

#[test]
fn byte_budgets_need_a_layout_and_round_down_to_blocks() -> Result<(), QueueError> {
    let q = queue(8);
    assert_eq!(
        q.select_batch_bytes(1, 1 << 30).unwrap_err(),
        QueueError::NoKvLayout
    );
    assert_eq!(
        q.config().blocks_in_bytes(1 << 30),
        Err(QueueError::NoKvLayout)
    );
    // A toy layout: 2 x 1 x 1 x 4 x 1 = 8 bytes per token, 128 per 16-token block.
    let config = QueueConfig::new(16, 8).with_layout(KvLayout::new(1, 1, 4, 1)?);
    check(
        |bytes| config.blocks_in_bytes(bytes),
        &[
            (0, Ok(0)),
            (127, Ok(0)),
            (128, Ok(1)),
            (255, Ok(1)),
            (256, Ok(2)),
        ],
    );
    let q = with_config(config);
    q.enqueue(sized(1, Priority::Normal, 1))?;
    q.enqueue(sized(2, Priority::Normal, 1))?;
    assert_eq!(ids(&q.select_batch_bytes(8, 255)?), [1]);
    Ok(())
}

#[test]
fn every_configuration_error_is_reported() {
    fn zero<T>(field: &'static str) -> Result<T, QueueError> {
        Err(QueueError::Zero { field })
    }
    check(
        |(layers, heads, dim, bytes)| KvLayout::new(layers, heads, dim, bytes).map(|_| ()),
        &[
            ((0, 8, 128, 2), zero("num_layers")),
            ((32, 0, 128, 2), zero("num_kv_heads")),
            ((32, 8, 0, 2), zero("head_dim")),
            ((32, 8, 128, 0), zero("dtype_bytes")),
            ((32, 8, 128, 2), Ok(())),
            (
                (u32::MAX, u32::MAX, u32::MAX, u32::MAX),
                Err(QueueError::LayoutOverflow { what: "token" }),
            ),
        ],
    );
    let llama = KvLayout::new(32, 8, 128, 2).expect("valid");
    check(
        |tp| llama.tensor_parallel(tp).map(|l| l.kv_heads_per_rank()),
        &[
            (0, zero("tp_size")),
            (1, Ok(8)),
            (4, Ok(2)),
            (
                3,
                Err(QueueError::TensorParallel {
                    kv_heads: 8,
                    tp_size: 3,
                }),
            ),
            (
                12,
                Err(QueueError::TensorParallel {
                    kv_heads: 8,
                    tp_size: 12,
                }),
            ),
            (32, Ok(1)),
        ],
    );
    let huge = KvLayout::new(1 << 16, 1 << 16, 1 << 16, 1 << 8).expect("fits per token");
    check(
        |config: QueueConfig| RequestQueue::<Req>::new(config).map(|_| ()),
        &[
            (QueueConfig::new(0, 8), zero("block_tokens")),
            (QueueConfig::new(16, 0), zero("pool_blocks")),
            (
                QueueConfig::new(16, 8).with_selection(Selection::SkipAhead {
                    max_scan: 0,
                    max_bypass: 1,
                }),
                zero("max_scan"),
            ),
            (
                QueueConfig::new(1 << 20, 8).with_layout(huge),
                Err(QueueError::LayoutOverflow { what: "block" }),
            ),
            (QueueConfig::new(16, 8).with_layout(llama), Ok(())),
        ],
    );
    assert_eq!(
        QueueConfig::new(0, 8).with_layout(llama).blocks_in_bytes(1),
        Err(QueueError::Zero {
            field: "block_tokens"
        })
    );
    assert_eq!(QueueConfig::new(0, 8).request_blocks(1, 1), u64::MAX);
}

#[test]
fn config_getters_return_what_was_set() {
    let layout = KvLayout::new(2, 2, 2, 2).expect("valid");
    let config = QueueConfig::new(32, 100)
        .with_layout(layout)
        .with_aging(kvbm_queue::Aging::Window(3))
        .with_reserve(kvbm_queue::GenerationReserve::Full)
        .with_capacity(64);
    assert_eq!(config.block_tokens(), 32);
    assert_eq!(config.pool_blocks(), 100);
    assert_eq!(config.layout(), Some(layout));
    assert_eq!(config.aging(), kvbm_queue::Aging::Window(3));
    assert_eq!(config.reserve(), kvbm_queue::GenerationReserve::Full);
    assert_eq!(config.selection(), Selection::HeadOfLine);
    assert_eq!(config.capacity(), 64);
    assert_eq!(QueueConfig::new(1, 1).capacity(), 0);
    assert_eq!(layout.tp_size(), 1);
}

#[test]
fn admitted_and_batch_accessors() -> Result<(), QueueError> {
    let q = queue(8);
    q.enqueue(sized(1, Priority::High, 2))?;
    q.enqueue(sized(2, Priority::Low, 1))?;
    let batch = q.select_batch(8, 8);
    let first = batch.iter().next().expect("two were taken");
    assert_eq!(
        (first.id(), first.priority(), first.blocks(), first.seq()),
        (1, Priority::High, 2, 0)
    );
    assert_eq!(first.request(), &sized(1, Priority::High, 2));
    assert!(format!("{batch:?}").contains("blocks: 3"));
    assert_eq!((&batch).into_iter().count(), 2);
    let requests = batch.into_requests();
    assert_eq!(
        requests,
        [sized(1, Priority::High, 2), sized(2, Priority::Low, 1)]
    );
    Ok(())
}
