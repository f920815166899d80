//! Seeded random choices of the stand-in engine and workload: which
//! priority a request gets and how many draft tokens a speculative step
//! accepts.
//!
//! Every draw is a pure function of the seed, a stream name and the draw's
//! coordinates (a request and a token position): XXH3 of those, seeded,
//! read as a uniform number in `[0, 1)`. Nothing depends on the order the
//! scheduler happens to visit requests in, so two configurations replaying
//! the same trace with the same seed see the same acceptances for the same
//! tokens, and their difference is the configuration's alone.

use kvbm_queue::Priority;

use crate::SimError;

/// Independent streams of draws.
#[derive(Clone, Copy, Debug)]
#[repr(u64)]
pub(super) enum Stream {
    /// A request's priority, from its trace index.
    Priority = 1,
    /// Whether a draft token is accepted, from its request and position.
    Draft = 2,
}

/// A uniform number in `[0, 1)` for `(stream, a, b)` under `seed`.
pub(super) fn unit(seed: u64, stream: Stream, a: u64, b: u64) -> f64 {
    let mut bytes = [0u8; 24];
    bytes[..8].copy_from_slice(&(stream as u64).to_le_bytes());
    bytes[8..16].copy_from_slice(&a.to_le_bytes());
    bytes[16..].copy_from_slice(&b.to_le_bytes());
    let bits = xxhash_rust::xxh3::xxh3_64_with_seed(&bytes, seed);
    // The top 53 bits: every value a double holds exactly.
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// How many of `drafts` draft tokens at positions after `position` are
/// accepted when each is accepted independently with probability `p`,
/// until the first rejection.
pub(super) fn accepted_drafts(
    seed: u64,
    p: f64,
    request: u64,
    position: usize,
    drafts: usize,
) -> usize {
    (0..drafts)
        .take_while(|&i| unit(seed, Stream::Draft, request, (position + i) as u64) < p)
        .count()
}

/// The priority of a request that has no `priority` of its own in the
/// trace, drawn by shares (`--priorities 0:0.1,1:0.9`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PriorityMix {
    /// Cumulative shares, normalized to end at 1, least urgent first
    /// (indexed like [`Priority::ALL`]).
    cumulative: [f64; 4],
}

impl PriorityMix {
    /// Parses `PRIORITY:SHARE[,PRIORITY:SHARE...]`, where `PRIORITY` is a
    /// vLLM priority value (an integer, lower is more urgent; see
    /// [`priority_from_vllm`]) and `SHARE` a non-negative weight.
    ///
    /// # Errors
    ///
    /// [`SimError::InvalidPriorityMix`] for anything else, or shares adding
    /// up to 0.
    pub fn parse(mix: &str) -> Result<Self, SimError> {
        let fail = |reason| SimError::InvalidPriorityMix {
            mix: mix.to_owned(),
            reason,
        };
        let mut shares = [0.0f64; 4];
        for part in mix.split(',') {
            let (value, share) = part
                .split_once(':')
                .ok_or(fail("expected PRIORITY:SHARE"))?;
            let value: i64 = value
                .trim()
                .parse()
                .map_err(|_| fail("a priority is an integer"))?;
            let share: f64 = share
                .trim()
                .parse()
                .map_err(|_| fail("a share is a number"))?;
            if !share.is_finite() || share < 0.0 {
                return Err(fail("a share is finite and at least 0"));
            }
            shares[priority_from_vllm(value) as usize] += share;
        }
        let total: f64 = shares.iter().sum();
        if !total.is_finite() || total <= 0.0 {
            return Err(fail("the shares add up to more than 0"));
        }
        let mut cumulative = [0.0; 4];
        let mut sum = 0.0;
        for (c, share) in cumulative.iter_mut().zip(shares) {
            sum += share / total;
            *c = sum;
        }
        cumulative[3] = 1.0;
        Ok(Self { cumulative })
    }

    /// The priority a uniform `u` in `[0, 1)` picks.
    pub(super) fn pick(&self, u: f64) -> Priority {
        let index = self.cumulative.iter().position(|&c| u < c).unwrap_or(3);
        Priority::ALL[index]
    }
}

/// kvbm's [`Priority`] for a vLLM priority value (lower is more urgent):
/// 0 and below are `Critical`, 1 `High`, 2 `Normal`, 3 and above `Low`.
pub fn priority_from_vllm(value: i64) -> Priority {
    match value {
        i64::MIN..=0 => Priority::Critical,
        1 => Priority::High,
        2 => Priority::Normal,
        _ => Priority::Low,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_are_uniform_and_reproducible() {
        let draws: Vec<f64> = (0..10_000).map(|i| unit(7, Stream::Draft, 1, i)).collect();
        assert!(draws.iter().all(|&u| (0.0..1.0).contains(&u)));
        let mean = draws.iter().sum::<f64>() / draws.len() as f64;
        assert!((mean - 0.5).abs() < 0.02, "mean {mean}");
        assert_eq!(unit(7, Stream::Draft, 1, 3), draws[3]);
        assert_ne!(unit(8, Stream::Draft, 1, 3), draws[3]);
        assert_ne!(unit(7, Stream::Priority, 1, 3), draws[3]);
    }

    #[test]
    fn acceptance_stops_at_the_first_rejection_and_matches_the_rate() {
        assert_eq!(accepted_drafts(1, 1.0, 5, 10, 4), 4);
        assert_eq!(accepted_drafts(1, 0.0, 5, 10, 4), 0);
        // Expected accepted of 4 drafts at p: p + p² + p³ + p⁴.
        let p = 0.6;
        let n = 20_000;
        let total: usize = (0..n).map(|r| accepted_drafts(3, p, r, 0, 4)).sum();
        let mean = total as f64 / n as f64;
        let expected = p + p * p + p * p * p + p * p * p * p;
        assert!(
            (mean - expected).abs() < 0.05,
            "mean {mean}, expected {expected}"
        );
    }

    #[test]
    fn a_mix_picks_by_share_and_refuses_nonsense() {
        let mix = PriorityMix::parse("0:0.1, 1:0.9").unwrap();
        assert_eq!(mix.pick(0.05), Priority::High);
        assert_eq!(mix.pick(0.95), Priority::Critical);
        let n = 10_000;
        let critical = (0..n)
            .filter(|&i| mix.pick(unit(1, Stream::Priority, i, 0)) == Priority::Critical)
            .count();
        assert!((critical as f64 / n as f64 - 0.1).abs() < 0.02);
        for bad in ["", "0", "x:1", "0:y", "0:-1", "0:0", "0:inf", "0:NaN"] {
            assert!(
                matches!(
                    PriorityMix::parse(bad),
                    Err(SimError::InvalidPriorityMix { .. })
                ),
                "{bad:?} accepted"
            );
        }
        assert_eq!(priority_from_vllm(-5), Priority::Critical);
        assert_eq!(priority_from_vllm(2), Priority::Normal);
        assert_eq!(priority_from_vllm(i64::MAX), Priority::Low);
    }
}
