//! [`Eviction`]: the eviction policies a replay can run, by name.

use std::fmt;
use std::str::FromStr;

use kvbm_blocks::EvictionPolicy;

use crate::SimError;

/// Which cached block the simulated cache evicts first, named as on the
/// command line (`lru`, `multi-level`, `lineage`).
///
/// Each maps to a [`kvbm_blocks::EvictionPolicy`]; see there for the exact
/// orders.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Eviction {
    /// Least recently released first.
    #[default]
    Lru,
    /// Frequency-aware multi-level LRU (TinyLFU-style levels).
    MultiLevel,
    /// Leaves before the prefixes they hang off.
    Lineage,
}

impl Eviction {
    /// Every policy, in command-line order.
    pub const ALL: [Self; 3] = [Self::Lru, Self::MultiLevel, Self::Lineage];

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Lru => "lru",
            Self::MultiLevel => "multi-level",
            Self::Lineage => "lineage",
        }
    }

    /// The block layer's policy.
    pub fn policy(self) -> EvictionPolicy {
        match self {
            Self::Lru => EvictionPolicy::Lru,
            Self::MultiLevel => EvictionPolicy::MultiLevelLru,
            Self::Lineage => EvictionPolicy::Lineage,
        }
    }
}

impl fmt::Display for Eviction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Eviction {
    type Err = SimError;

    /// Parses `lru`, `multi-level` (also `multi_level`, `mlru`) or
    /// `lineage`, ignoring ASCII case.
    fn from_str(name: &str) -> Result<Self, SimError> {
        match name.trim().to_ascii_lowercase().as_str() {
            "lru" => Ok(Self::Lru),
            "multi-level" | "multi_level" | "multilevel" | "mlru" => Ok(Self::MultiLevel),
            "lineage" => Ok(Self::Lineage),
            _ => Err(SimError::UnknownEviction {
                name: name.to_owned(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_map_to_the_block_policies() {
        for eviction in Eviction::ALL {
            assert_eq!(eviction.name().parse::<Eviction>().unwrap(), eviction);
            assert_eq!(eviction.to_string(), eviction.name());
        }
        assert_eq!("MLRU".parse::<Eviction>().unwrap(), Eviction::MultiLevel);
        assert_eq!(Eviction::Lineage.policy(), EvictionPolicy::Lineage);
        match "fifo".parse::<Eviction>() {
            Err(SimError::UnknownEviction { name }) => assert_eq!(name, "fifo"),
            other => panic!("{other:?}"),
        }
    }
}
