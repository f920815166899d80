//! [`SchedulerClock`]: the wall time a replay spends inside the
//! scheduler's step loop, apart from the simulator's own work around it.
//!
//! A replay's `replay_ms` covers everything the simulator does: building
//! each prompt's tokens as its request arrives, submitting it, standing in
//! for the engine, keeping every request's timeline. The scheduler's part
//! is planning each step ([`Scheduler::step_into`]) and applying the
//! engine's outputs ([`Scheduler::apply`], or the steps decoded in place,
//! [`Scheduler::run_decodes_in_place`]): the calls vLLM's `schedule()` and
//! `update_from_output()` make, timed the same way, so the two costs per
//! scheduled request-step compare like for like. (vLLM hashes a prompt's
//! blocks when its `Request` is built, outside those calls; ours are hashed
//! at admission, inside them.)
//!
//! Serve mode keeps one; a cluster's engines do not (each of their millions
//! of small steps would pay for two clock reads).
//!
//! [`Scheduler::step_into`]: kvbm_queue::Scheduler::step_into
//! [`Scheduler::apply`]: kvbm_queue::Scheduler::apply
//! [`Scheduler::run_decodes_in_place`]: kvbm_queue::Scheduler::run_decodes_in_place

use std::time::{Duration, Instant};

/// The time spent in the scheduler's calls so far, when kept.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SchedulerClock(Option<Duration>);

impl SchedulerClock {
    /// A clock that keeps time, from zero.
    pub(crate) fn running() -> Self {
        Self(Some(Duration::ZERO))
    }

    /// Runs `call` (a call into the scheduler), adding its wall time when
    /// the clock keeps time.
    #[inline]
    pub(crate) fn time<T>(&mut self, call: impl FnOnce() -> T) -> T {
        let Some(total) = &mut self.0 else {
            return call();
        };
        let began = Instant::now();
        let result = call();
        *total = total.saturating_add(began.elapsed());
        result
    }

    /// The time kept, `None` for a clock that keeps none.
    pub(crate) fn total(&self) -> Option<Duration> {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_clock_runs_calls_and_keeps_no_time() {
        let mut clock = SchedulerClock::default();
        assert_eq!(clock.time(|| 7), 7);
        assert_eq!(clock.total(), None);
    }

    #[test]
    fn a_running_clock_adds_each_call() {
        let mut clock = SchedulerClock::running();
        assert_eq!(clock.total(), Some(Duration::ZERO));
        let outer = Instant::now();
        clock.time(|| std::thread::sleep(Duration::from_millis(2)));
        clock.time(|| std::thread::sleep(Duration::from_millis(1)));
        let total = clock.total().unwrap();
        assert!(total >= Duration::from_millis(3), "{total:?}");
        assert!(total <= outer.elapsed(), "{total:?}");
    }
}
