//! The one ordering key: priority, waiting time (`Aging::Timed`) and
//! preemption boosts (`restore_boosted`), on the queue alone.

use std::time::Duration;

use kvbm_queue::{Aging, MAX_BOOST_STEPS, Priority, QueueConfig, Request, RequestQueue};

#[derive(Debug)]
struct Arriving {
    id: u32,
    priority: Priority,
    at_ms: u64,
}

impl Request for Arriving {
    type Id = u32;
    fn id(&self) -> u32 {
        self.id
    }
    fn priority(&self) -> Priority {
        self.priority
    }
    fn prompt_tokens(&self) -> u32 {
        16
    }
    fn max_new_tokens(&self) -> u32 {
        0
    }
    fn arrival(&self) -> Option<Duration> {
        Some(Duration::from_millis(self.at_ms))
    }
}

fn queue(aging: Aging) -> RequestQueue<Arriving> {
    RequestQueue::new(QueueConfig::new(16, 1024).with_aging(aging)).expect("valid config")
}

fn submit(q: &RequestQueue<Arriving>, id: u32, priority: Priority, at_ms: u64) {
    q.enqueue(Arriving {
        id,
        priority,
        at_ms,
    })
    .expect("accepted");
}

/// Takes every queued request and puts each back, boosting `boosted` by
/// `steps`; returns the service order after.
fn requeue_boosting(q: &RequestQueue<Arriving>, boosted: u32, steps: u32) -> Vec<u32> {
    for admitted in q.select_batch(usize::MAX, u64::MAX) {
        let boost = if admitted.id() == boosted { steps } else { 0 };
        q.restore_boosted(admitted, boost).expect("restored");
    }
    let order = q.select_batch(usize::MAX, u64::MAX);
    let ids = order.iter().map(|a| a.id()).collect();
    for admitted in order {
        q.restore(admitted).expect("restored");
    }
    ids
}

#[test]
fn waiting_time_raises_urgency_at_the_configured_rate() {
    // One priority step per second of waiting: `Low` (3 steps below
    // `Critical`) arriving at 0 s ranks as if it were `Critical` arriving at
    // 3 s; `High` (1 step) at 1 s as `Critical` at 2 s.
    let q = queue(Aging::Timed {
        step: Duration::from_secs(1),
    });
    submit(&q, 1, Priority::Low, 0);
    submit(&q, 2, Priority::High, 1_000);
    submit(&q, 3, Priority::High, 2_500);
    submit(&q, 4, Priority::Critical, 2_900);
    submit(&q, 5, Priority::Normal, 1_000);
    let order: Vec<u32> = std::iter::from_fn(|| q.try_dequeue().ok().map(|r| r.id)).collect();
    // Ranks: 2 at 2 s, 4 at 2.9 s, 5 and 1 both at 3 s (the tie goes to the
    // more urgent `Normal`), 3 at 3.5 s.
    assert_eq!(order, [2, 4, 5, 1, 3]);
}

#[test]
fn without_arrival_times_the_queue_clock_orders_timed_requests_by_arrival() {
    #[derive(Debug)]
    struct Now(u32, Priority);
    impl Request for Now {
        type Id = u32;
        fn id(&self) -> u32 {
            self.0
        }
        fn priority(&self) -> Priority {
            self.1
        }
        fn prompt_tokens(&self) -> u32 {
            1
        }
        fn max_new_tokens(&self) -> u32 {
            0
        }
    }
    // A step of an hour: within a test, priority decides.
    let q = RequestQueue::new(QueueConfig::new(16, 64).with_aging(Aging::Timed {
        step: Duration::from_secs(3600),
    }))
    .unwrap();
    q.enqueue(Now(1, Priority::Low)).unwrap();
    q.enqueue(Now(2, Priority::High)).unwrap();
    q.enqueue(Now(3, Priority::High)).unwrap();
    let order: Vec<u32> = std::iter::from_fn(|| q.try_dequeue().ok().map(|r| r.0)).collect();
    assert_eq!(order, [2, 3, 1]);
}

#[test]
fn a_boost_moves_a_request_up_by_priority_steps_and_is_capped() {
    let q = queue(Aging::Strict);
    submit(&q, 1, Priority::Normal, 0);
    submit(&q, 2, Priority::Normal, 0);
    submit(&q, 3, Priority::Low, 0);
    // One step: level with `Normal`, and ties go to the more urgent priority.
    assert_eq!(requeue_boosting(&q, 3, 1), [1, 2, 3]);
    // Boosts add up: two steps in all rank it with `High`, ahead of both.
    assert_eq!(requeue_boosting(&q, 3, 1), [3, 1, 2]);
    // However many more, at most three steps: level with `Critical`, which
    // still wins the tie.
    submit(&q, 4, Priority::Critical, 0);
    assert_eq!(requeue_boosting(&q, 3, u32::MAX), [4, 3, 1, 2]);
    assert_eq!(MAX_BOOST_STEPS, 3);
}

#[test]
fn a_boost_under_timed_aging_is_worth_its_steps_of_waiting() {
    let q = queue(Aging::Timed {
        step: Duration::from_secs(1),
    });
    submit(&q, 1, Priority::Normal, 0);
    submit(&q, 2, Priority::Normal, 1_500);
    submit(&q, 3, Priority::Normal, 2_200);
    // One step of boost is one second of waiting: request 3 now ranks as if
    // it arrived at 1.2 s, ahead of request 2.
    assert_eq!(requeue_boosting(&q, 3, 1), [1, 3, 2]);
}

#[test]
fn a_boost_under_window_aging_is_worth_its_arrivals() {
    let q = queue(Aging::Window(2));
    for id in 1..=4 {
        submit(&q, id, Priority::Normal, 0);
    }
    // One step is two arrivals: request 4 (seq 3) ranks at 1, after 1 (0)
    // and, on the tie, after 2 (1), since the earlier arrival wins it.
    assert_eq!(requeue_boosting(&q, 4, 1), [1, 2, 4, 3]);
}
