//! [`Capacity`]: how big the simulated cache is.

use std::fmt;

use kvbm_blocks::MAX_BLOCKS;

use crate::{SimError, Workload};

/// The size of the simulated KV cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Capacity {
    /// This many blocks, whatever the block size.
    Blocks(u64),
    /// This many tokens, rounded down to whole blocks of the workload's size.
    Tokens(u64),
    /// Room for every distinct block of the workload: nothing is ever
    /// evicted, so the hit rate is the workload's reuse ceiling.
    #[default]
    Unbounded,
}

impl Capacity {
    /// The pool size in blocks for `workload`.
    ///
    /// `Unbounded` counts the workload's distinct blocks (O(blocks)).
    ///
    /// # Errors
    ///
    /// [`SimError::ZeroCapacity`] for zero blocks or fewer tokens than one
    /// block, [`SimError::CapacityTooLarge`] beyond what a pool addresses.
    pub fn resolve(self, workload: &Workload) -> Result<usize, SimError> {
        // A pool needs one block even when the workload has none.
        self.resolve_with(workload.block_size(), || {
            workload.distinct_blocks().max(1) as u64
        })
    }

    /// The pool size in blocks of `block_size` tokens, for a bounded
    /// capacity (serve mode, where "room for every distinct block" means
    /// nothing: running requests hold blocks no cache ever shares).
    ///
    /// # Errors
    ///
    /// [`SimError::UnboundedServe`] for [`Capacity::Unbounded`], and the
    /// errors of [`resolve`](Self::resolve).
    pub fn resolve_bounded(self, block_size: usize) -> Result<usize, SimError> {
        let mut unbounded = false;
        let blocks = self.resolve_with(block_size, || {
            unbounded = true;
            1
        });
        if unbounded {
            return Err(SimError::UnboundedServe);
        }
        blocks
    }

    fn resolve_with(
        self,
        block_size: usize,
        unbounded: impl FnOnce() -> u64,
    ) -> Result<usize, SimError> {
        let blocks = match self {
            Self::Blocks(blocks) => blocks,
            Self::Tokens(tokens) => tokens / block_size.max(1) as u64,
            Self::Unbounded => unbounded(),
        };
        if blocks == 0 {
            return Err(SimError::ZeroCapacity {
                capacity: self.to_string(),
                block_size,
            });
        }
        match usize::try_from(blocks) {
            Ok(count) if count <= MAX_BLOCKS => Ok(count),
            _ => Err(SimError::CapacityTooLarge {
                blocks,
                max: MAX_BLOCKS,
            }),
        }
    }

    /// Whether this is [`Capacity::Unbounded`].
    pub fn is_unbounded(self) -> bool {
        self == Self::Unbounded
    }

    /// Parses a count written plainly or with an SI suffix: `6000`, `6k`,
    /// `1.5M`, `2G` (`k`/`K` = 1,000, `m`/`M` = 1,000,000, `g`/`G` = 10⁹),
    /// `_` allowed as a digit separator. The result must be whole. Zero
    /// parses (as `0`); [`resolve`](Self::resolve) is what refuses an empty
    /// cache, with the error that says so.
    ///
    /// # Errors
    ///
    /// [`SimError::InvalidCapacity`] for anything else.
    pub fn parse_count(text: &str) -> Result<u64, SimError> {
        let invalid = || SimError::InvalidCapacity {
            text: text.to_owned(),
        };
        let trimmed = text.trim().replace('_', "");
        let (number, scale) = match trimmed.char_indices().last() {
            Some((at, 'k' | 'K')) => (&trimmed[..at], 1_000u64),
            Some((at, 'm' | 'M')) => (&trimmed[..at], 1_000_000),
            Some((at, 'g' | 'G')) => (&trimmed[..at], 1_000_000_000),
            _ => (trimmed.as_str(), 1),
        };
        // Integer arithmetic, so `1.1k` is exactly 1100 (in floating point
        // it is 1100.0000000000002).
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        let digits = |part: &str| part.chars().all(|c| c.is_ascii_digit());
        if whole.is_empty() || !digits(whole) || !digits(fraction) {
            return Err(invalid());
        }
        let whole: u64 = whole.parse().map_err(|_| invalid())?;
        let mut value = whole.checked_mul(scale).ok_or_else(invalid)?;
        let mut place = scale;
        for digit in fraction.bytes() {
            if place % 10 != 0 {
                // A digit below one block: only zeros may follow.
                if digit != b'0' {
                    return Err(invalid());
                }
                continue;
            }
            place /= 10;
            value = value
                .checked_add(u64::from(digit - b'0') * place)
                .ok_or_else(invalid)?;
        }
        Ok(value)
    }
}

impl fmt::Display for Capacity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Blocks(blocks) => write!(f, "{blocks} blocks"),
            Self::Tokens(tokens) => write!(f, "{tokens} tokens"),
            Self::Unbounded => f.write_str("unbounded"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_parse_with_si_suffixes_exactly() {
        for (text, count) in [
            ("6000", 6000),
            ("6k", 6000),
            ("6K", 6000),
            ("1.5M", 1_500_000),
            ("1.1k", 1100),
            ("2.50k", 2500),
            ("2G", 2_000_000_000),
            ("50_000", 50_000),
            (" 7 ", 7),
            ("0", 0),
            ("1.000", 1),
        ] {
            assert_eq!(Capacity::parse_count(text).unwrap(), count, "{text}");
        }
        for text in [
            "", "k", "-5", "1.5", "1.0005k", "abc", "1e3", "inf", "NaN", ".5k", "5kk",
        ] {
            assert!(
                matches!(
                    Capacity::parse_count(text),
                    Err(SimError::InvalidCapacity { .. })
                ),
                "{text}"
            );
        }
        assert!(Capacity::parse_count("99999999999999999999").is_err());
        assert!(Capacity::parse_count("20000000000G").is_err());
    }

    #[test]
    fn bounded_capacities_resolve_without_a_workload() {
        assert_eq!(
            Capacity::Tokens(3_000_000).resolve_bounded(16).unwrap(),
            187_500
        );
        assert_eq!(Capacity::Blocks(7).resolve_bounded(16).unwrap(), 7);
        assert!(matches!(
            Capacity::Unbounded.resolve_bounded(16),
            Err(SimError::UnboundedServe)
        ));
        assert!(matches!(
            Capacity::Tokens(15).resolve_bounded(16),
            Err(SimError::ZeroCapacity { .. })
        ));
    }

    #[test]
    fn capacities_display_as_written() {
        assert_eq!(Capacity::Blocks(6000).to_string(), "6000 blocks");
        assert_eq!(Capacity::Tokens(3).to_string(), "3 tokens");
        assert_eq!(Capacity::default().to_string(), "unbounded");
    }
}
