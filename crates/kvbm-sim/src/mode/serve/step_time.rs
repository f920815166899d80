//! [`StepTime`]: how long one engine step takes in simulated time.

use std::fmt;
use std::time::Duration;

use crate::SimError;

/// The step-time model: a step that prefills `p` tokens (chunks and
/// recomputation after preemption alike) and decodes `d` requests takes
///
/// ```text
/// per_step + p × per_prefill_token + d × per_decode_request
/// ```
///
/// A step that runs nothing takes no time.
///
/// # Defaults: an 8B model on one H100
///
/// The defaults (5 ms + 0.05 ms per prefill token + 0.1 ms per decoding
/// request) are rough figures for a Llama-3-8B-class model in bf16 on one
/// H100 SXM (989 dense bf16 TFLOPS, 3.35 TB/s of HBM):
///
/// - **5 ms per step**: every step streams all 16 GB of weights from HBM at
///   least once, 16 GB / 3.35 TB/s ≈ 4.8 ms, plus launch and sampling
///   overhead. This is also a batch-of-one decode step, about what vLLM
///   reports for small batches.
/// - **0.05 ms per prefill token** (20k tokens/s): a token costs ≈ 2 × 8e9 =
///   16 GFLOP in the linear layers, plus attention over long prompts; at a
///   realistic 35–40% of peak that is 0.04–0.05 ms.
/// - **0.1 ms per decoding request**: its share of a batched decode step,
///   dominated by reading its KV cache (128 KiB per token for Llama-3-8B's
///   grouped-query attention; 0.1 ms reads ≈ 2.6k tokens of context). With
///   128 requests decoding, a step takes 17.8 ms, in line with published
///   vLLM time-per-output-token figures for this class of model. A flat
///   per-request cost ignores context length: raise it for traces with
///   long contexts.
///
/// The conversation trace (145M prompt tokens in an hour) is far more than
/// one such GPU prefills in an hour, so at these defaults it runs
/// overloaded and queues build up; that is what the simulator should show.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct StepTime {
    /// Fixed cost of any step that runs something.
    pub per_step: Duration,
    /// Cost of each prompt (or recomputed) token a step prefills.
    pub per_prefill_token: Duration,
    /// Cost of each request a step decodes.
    pub per_decode_request: Duration,
}

impl Default for StepTime {
    /// 5 ms + 0.05 ms per prefill token + 0.1 ms per decoding request (see
    /// the type's docs for why).
    fn default() -> Self {
        Self {
            per_step: Duration::from_millis(5),
            per_prefill_token: Duration::from_micros(50),
            per_decode_request: Duration::from_micros(100),
        }
    }
}

impl StepTime {
    /// A model from costs in (fractional) milliseconds, as the command line
    /// takes them; each is rounded to the nanosecond.
    ///
    /// # Errors
    ///
    /// [`SimError::InvalidStepTime`] for a negative, non-finite or absurdly
    /// large (over an hour) cost.
    pub fn from_millis(
        per_step: f64,
        per_prefill_token: f64,
        per_decode_request: f64,
    ) -> Result<Self, SimError> {
        let millis = |what: &'static str, value: f64| {
            if value.is_finite() && (0.0..=3_600_000.0).contains(&value) {
                Ok(Duration::from_nanos((value * 1e6).round() as u64))
            } else {
                Err(SimError::InvalidStepTime { what, value })
            }
        };
        Ok(Self {
            per_step: millis("per step", per_step)?,
            per_prefill_token: millis("per prefill token", per_prefill_token)?,
            per_decode_request: millis("per decoding request", per_decode_request)?,
        })
    }

    /// The simulated time of a step prefilling `prefill_tokens` tokens and
    /// decoding `decode_requests` requests, in nanoseconds (zero when it
    /// runs nothing). Saturates instead of overflowing.
    pub(crate) fn step_nanos(&self, prefill_tokens: u64, decode_requests: u64) -> u64 {
        if prefill_tokens == 0 && decode_requests == 0 {
            return 0;
        }
        let nanos = |duration: Duration| u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        nanos(self.per_step)
            .saturating_add(nanos(self.per_prefill_token).saturating_mul(prefill_tokens))
            .saturating_add(nanos(self.per_decode_request).saturating_mul(decode_requests))
    }

    /// The simulated time of a step prefilling `prefill_tokens` tokens and
    /// decoding `decode_requests` requests.
    pub fn step_duration(&self, prefill_tokens: u64, decode_requests: u64) -> Duration {
        Duration::from_nanos(self.step_nanos(prefill_tokens, decode_requests))
    }
}

impl fmt::Display for StepTime {
    /// `5 ms + 0.05 ms/prefill token + 0.1 ms/decoding request`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |duration: Duration| duration.as_secs_f64() * 1e3;
        write!(
            f,
            "{} ms + {} ms/prefill token + {} ms/decoding request",
            ms(self.per_step),
            ms(self.per_prefill_token),
            ms(self.per_decode_request)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_time_is_fixed_plus_per_token_plus_per_request() {
        let model = StepTime::default();
        // 5 + 2048 × 0.05 + 10 × 0.1 = 5 + 102.4 + 1 = 108.4 ms.
        assert_eq!(
            model.step_duration(2048, 10),
            Duration::from_micros(108_400)
        );
        assert_eq!(model.step_duration(0, 0), Duration::ZERO);
        assert_eq!(model.step_duration(0, 1), Duration::from_micros(5_100));
        assert_eq!(
            model.to_string(),
            "5 ms + 0.05 ms/prefill token + 0.1 ms/decoding request"
        );
    }

    #[test]
    fn millis_parse_exactly_and_refuse_nonsense() {
        let model = StepTime::from_millis(5.0, 0.05, 0.1).unwrap();
        assert_eq!(model, StepTime::default());
        assert_eq!(
            StepTime::from_millis(0.0, 0.0, 0.000_001)
                .unwrap()
                .per_decode_request,
            Duration::from_nanos(1)
        );
        for (step, prefill, decode, what) in [
            (-1.0, 0.0, 0.0, "per step"),
            (1.0, f64::NAN, 0.0, "per prefill token"),
            (1.0, 0.0, f64::INFINITY, "per decoding request"),
            (4e6, 0.0, 0.0, "per step"),
        ] {
            match StepTime::from_millis(step, prefill, decode) {
                Err(SimError::InvalidStepTime { what: got, .. }) => assert_eq!(got, what),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn huge_steps_saturate() {
        let model = StepTime::from_millis(1.0, 3_600_000.0, 0.0).unwrap();
        assert_eq!(model.step_nanos(u64::MAX, 0), u64::MAX);
    }
}
