//! Decodes in place change no result: serve replays with them and without
//! them ([`ServeConfig`]'s `in_place`) give the same reports, wall-clock
//! times aside (the cluster's property is in `cluster/tests.rs`; the
//! instructions they save are measured on the trace; `kvbm-queue`'s tests
//! check that the scheduler runs them).

use std::num::NonZeroUsize;

use kvbm_queue::{GenerationReserve, Preemption, SchedulerConfig};

use super::*;
use crate::Capacity;

fn excerpt(requests: usize) -> Trace {
    let mut trace = Trace::conversation_excerpt().unwrap();
    trace.truncate(NonZeroUsize::new(requests).unwrap());
    trace
}

/// `config`'s replay with and without decodes in place, without their
/// wall-clock times.
fn both(trace: &Trace, config: &ServeConfig) -> (ServeReport, ServeReport) {
    let run = |in_place: bool| {
        let config = ServeConfig {
            in_place,
            ..*config
        };
        let mut report = config.run(trace).unwrap();
        report.clear_wall_times();
        report
    };
    (run(false), run(true))
}

/// Requests far apart decode alone, and every number of the report is the
/// same, whatever the pool, the audits, the priorities or the step time.
#[test]
fn serve_replays_are_the_same_with_decodes_in_place() {
    let trace = excerpt(60);
    let small = SchedulerConfig::default()
        .with_max_running(4)
        .with_token_budget(3_000)
        .with_reserve(GenerationReserve::Capped(8));
    let configs = [
        ServeConfig::default(),
        // Audits every 7 steps, in the middle of runs in place.
        ServeConfig::new(16, Capacity::Blocks(3_000)).with_audit_every(7),
        // A pool that preempts, priorities that reorder.
        ServeConfig::new(16, Capacity::Blocks(900))
            .with_scheduler(small.with_preemption(Preemption::ByPriority))
            .with_priorities(PriorityMix::parse("0:0.3,1:0.7").unwrap())
            .with_metrics(true),
        // Fast steps: arrivals find engines busy.
        ServeConfig::new(64, Capacity::Tokens(2_000_000))
            .with_step_time(StepTime::from_millis(0.05, 0.0, 0.01).unwrap()),
        // No time at all per step.
        ServeConfig::default().with_step_time(StepTime::from_millis(0.0, 0.0, 0.0).unwrap()),
        // Speculative decoding never runs in place.
        ServeConfig::default()
            .with_scheduler(SchedulerConfig::default().with_speculative_tokens(3)),
    ];
    for config in configs {
        let (plain, in_place) = both(&trace, &config);
        assert_eq!(plain, in_place, "{config:?}");
        assert!(plain.census.is_balanced());
    }
}
