//! Tiers below the GPU in a replay: [`TierSetup`] (sizes, offload policy,
//! bytes per token, links) and the links' timing model ([`Link`],
//! [`LinkClock`]).
//!
//! # The link model
//!
//! Each lower tier has one link to the tier above it (the host tier to the
//! GPU over PCIe, the disk tier to the host over NVMe), modelled as a FIFO
//! server per direction: a transfer down (a store) or up (a load) waits
//! for the transfers ahead of it in its direction, then takes
//! `setup + bytes / bandwidth`. A load from the disk tier to the GPU goes
//! over the disk's link (the drive is the bottleneck; GPUDirect Storage
//! reads straight into device memory).
//!
//! # Defaults from real hardware
//!
//! - **8B model, 128 KiB per token**: Llama-3.1-8B's KV cache, 32 layers ×
//!   8 KV heads × 128 dims × 2 (K and V) × 2 bytes (bf16) = 131,072 bytes.
//! - **Host link, PCIe 5.0 x16: 400 Gbit/s, 10 µs per transfer.** The bus
//!   carries 64 GB/s per direction before encoding; pinned-memory copies
//!   measure about 50 GB/s on H100 hosts (NVIDIA's `bandwidthTest`,
//!   `nvbandwidth` reports), which is 400 Gbit/s; a copy's launch and DMA
//!   setup cost on the order of 10 µs.
//! - **Disk link, one NVMe drive (PCIe 4.0 x4): 56 Gbit/s, 100 µs per
//!   transfer.** Data-center and high-end drives of that class read about
//!   7 GB/s sequentially (Samsung PM9A3/990 Pro, Kioxia CM6 data sheets),
//!   which is 56 Gbit/s, and an I/O's latency is about 80-100 µs.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt;
use std::str::FromStr;

use kvbm_queue::{LinkCost, LoadCost, TiersConfig};
use kvbm_tiers::{OffloadPolicy, Outcome, TierConfig, Transfer, TransferId, TransferKind};

use crate::{SimError, StepTime};

/// Which blocks go down to the lower tiers (`--offload`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Offload {
    /// Every block as soon as it is computed (`write-through`, the default).
    #[default]
    WriteThrough,
    /// Blocks about to be evicted (`write-back`).
    WriteBack,
    /// Blocks hit at least `K` times (`selective:K`, `K` at most 15).
    Selective(u8),
}

impl Offload {
    /// The tiers' policy it names.
    pub fn policy(self) -> OffloadPolicy {
        match self {
            Self::WriteThrough => OffloadPolicy::WriteThrough,
            Self::WriteBack => OffloadPolicy::WriteBack,
            Self::Selective(min_hits) => OffloadPolicy::Selective { min_hits },
        }
    }
}

impl fmt::Display for Offload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::WriteThrough => f.write_str("write-through"),
            Self::WriteBack => f.write_str("write-back"),
            Self::Selective(k) => write!(f, "selective:{k}"),
        }
    }
}

impl FromStr for Offload {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "write-through" => Ok(Self::WriteThrough),
            "write-back" => Ok(Self::WriteBack),
            _ => {
                let k = (text.strip_prefix("selective:")).ok_or_else(|| {
                    format!("{text:?}: expected write-through, write-back or selective:K")
                })?;
                let k: u8 = k
                    .parse()
                    .map_err(|_| format!("{text:?}: K must be a whole number from 0 to 15"))?;
                if k > kvbm_blocks::FrequencySketch::MAX_COUNT {
                    return Err(format!(
                        "{text:?}: K must be at most 15 (hits are counted to 15)"
                    ));
                }
                Ok(Self::Selective(k))
            }
        }
    }
}

/// One link: bandwidth and a setup time per transfer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Link {
    /// Gigabits per second, each direction.
    pub gbps: f64,
    /// Microseconds per transfer, whatever its size.
    pub setup_us: f64,
}

impl Link {
    /// PCIe 5.0 x16 (400 Gbit/s, 10 µs per transfer; sources in this
    /// module's docs).
    pub const PCIE5_X16: Self = Self {
        gbps: 400.0,
        setup_us: 10.0,
    };

    /// One NVMe drive on PCIe 4.0 x4 (56 Gbit/s, 100 µs per transfer;
    /// sources in this module's docs).
    pub const NVME_GEN4: Self = Self {
        gbps: 56.0,
        setup_us: 100.0,
    };

    /// Nanoseconds one transfer of `bytes` takes on the wire (rounded up;
    /// saturating at `u64::MAX`).
    pub fn transfer_nanos(&self, bytes: u64) -> u64 {
        let nanos = self.setup_us * 1e3 + bytes as f64 * 8.0 / self.gbps;
        if nanos >= u64::MAX as f64 {
            u64::MAX
        } else {
            nanos.ceil() as u64
        }
    }

    /// A 100 Gbit/s network link with 20 µs per transfer: one 100 GbE or
    /// RDMA NIC's share per engine (Mooncake's nodes have 8 × 400 Gbit/s
    /// NICs for 8 GPUs; a 100 Gbit/s share is the conservative end), and
    /// an RDMA read's setup of a few µs plus the store's software path.
    pub const NETWORK_100G: Self = Self {
        gbps: 100.0,
        setup_us: 20.0,
    };

    pub(crate) fn validate(&self, which: &'static str) -> Result<(), SimError> {
        // Up to 1 Pbit/s and a second of setup: anything past is a typo.
        if !(self.gbps.is_finite() && self.gbps > 0.0 && self.gbps <= 1e6) {
            return Err(SimError::InvalidTiers(format!(
                "{which} link of {} Gbit/s (must be above 0 and at most 1,000,000)",
                self.gbps
            )));
        }
        if !(self.setup_us.is_finite() && (0.0..=1e6).contains(&self.setup_us)) {
            return Err(SimError::InvalidTiers(format!(
                "{which} link setup of {} µs (must be 0 to 1,000,000)",
                self.setup_us
            )));
        }
        Ok(())
    }
}

/// The tiers below the GPU in a replay (all off by default).
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct TierSetup {
    /// Tokens the host tier holds (`--host-tier-tokens`); `None`: no host
    /// tier.
    pub host_tokens: Option<u64>,
    /// Tokens the disk tier holds (`--disk-tier-tokens`); `None`: no disk
    /// tier. With a host tier it sits below it; without, right below the
    /// GPU.
    pub disk_tokens: Option<u64>,
    /// What each lower tier takes from the one above it.
    pub offload: Offload,
    /// KV bytes per token (default 131,072: an 8B model).
    pub kv_bytes_per_token: u64,
    /// The host tier's link (default PCIe 5.0 x16).
    pub host_link: Link,
    /// The disk tier's link (default one NVMe drive).
    pub disk_link: Link,
}

impl Default for TierSetup {
    fn default() -> Self {
        Self {
            host_tokens: None,
            disk_tokens: None,
            offload: Offload::WriteThrough,
            kv_bytes_per_token: 128 * 1024,
            host_link: Link::PCIE5_X16,
            disk_link: Link::NVME_GEN4,
        }
    }
}

/// The medium of a pool several engines share (a cluster's store).
pub(crate) const REMOTE: &str = "REMOTE";
/// The host tier's medium.
pub(crate) const HOST: &str = "CPU";

/// One lower tier as a replay builds it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct TierPlan {
    pub(crate) medium: &'static str,
    pub(crate) blocks: usize,
    pub(crate) link: Link,
}

impl TierSetup {
    /// Whether any lower tier is configured.
    pub fn is_enabled(&self) -> bool {
        self.host_tokens.is_some() || self.disk_tokens.is_some()
    }

    /// Sets [`host_tokens`](Self::host_tokens).
    pub fn with_host_tokens(mut self, tokens: u64) -> Self {
        self.host_tokens = Some(tokens);
        self
    }

    /// Sets [`disk_tokens`](Self::disk_tokens).
    pub fn with_disk_tokens(mut self, tokens: u64) -> Self {
        self.disk_tokens = Some(tokens);
        self
    }

    /// Sets [`offload`](Self::offload).
    pub fn with_offload(mut self, offload: Offload) -> Self {
        self.offload = offload;
        self
    }

    /// Bytes one block of `block_size` tokens takes.
    ///
    /// # Errors
    ///
    /// [`SimError::InvalidTiers`] if it does not fit in `u64`.
    pub fn block_bytes(&self, block_size: usize) -> Result<u64, SimError> {
        self.kv_bytes_per_token
            .checked_mul(block_size as u64)
            .ok_or_else(|| {
                SimError::InvalidTiers(format!(
                    "{} bytes per token × {block_size} tokens per block overflows",
                    self.kv_bytes_per_token
                ))
            })
    }

    /// The lower tiers in order, their sizes in blocks of `block_size`.
    ///
    /// # Errors
    ///
    /// [`SimError::InvalidTiers`] for a tier smaller than one block or
    /// larger than a pool may be, 0 bytes per token, a link of 0 (or
    /// non-finite, or absurd) bandwidth or setup time.
    pub(crate) fn plan(&self, block_size: usize) -> Result<Vec<TierPlan>, SimError> {
        if !self.is_enabled() {
            return Ok(Vec::new());
        }
        if self.kv_bytes_per_token == 0 {
            return Err(SimError::InvalidTiers("0 KV bytes per token".to_owned()));
        }
        self.block_bytes(block_size)?;
        let mut tiers = Vec::new();
        for (medium, tokens, link, which) in [
            (HOST, self.host_tokens, self.host_link, "host"),
            ("DISK", self.disk_tokens, self.disk_link, "disk"),
        ] {
            let Some(tokens) = tokens else {
                continue;
            };
            link.validate(which)?;
            let blocks = tokens / block_size.max(1) as u64;
            if blocks == 0 || blocks > kvbm_blocks::MAX_BLOCKS as u64 {
                return Err(SimError::InvalidTiers(format!(
                    "a {which} tier of {tokens} tokens is {blocks} blocks of {block_size} \
                     (1 to {} blocks)",
                    kvbm_blocks::MAX_BLOCKS
                )));
            }
            tiers.push(TierPlan {
                medium,
                blocks: blocks as usize,
                link,
            });
        }
        Ok(tiers)
    }

    /// What the scheduler is given: the tiers and the load cost model
    /// (recomputing a token costs what prefilling it does in `step_time`;
    /// loading a block costs what its link takes), or `None` with no tier.
    ///
    /// # Errors
    ///
    /// As [`plan`](Self::plan).
    pub(crate) fn scheduler_config(
        &self,
        block_size: usize,
        step_time: &StepTime,
    ) -> Result<Option<TiersConfig>, SimError> {
        let plans = self.plan(block_size)?;
        if plans.is_empty() {
            return Ok(None);
        }
        let block_bytes = self.block_bytes(block_size)?;
        let lower = (plans.iter())
            .map(|plan| {
                TierConfig::new(plan.medium, plan.blocks)
                    .with_offload(self.offload.policy())
                    .with_max_incoming_blocks(incoming_window(plan.link, block_bytes))
            })
            .collect();
        let links = (plans.iter())
            .map(|plan| LinkCost {
                setup_s: plan.link.setup_us / 1e6,
                block_s: block_bytes as f64 * 8.0 / (plan.link.gbps * 1e9),
            })
            .collect();
        let cost = LoadCost::new(step_time.per_prefill_token.as_secs_f64(), links);
        Ok(Some(TiersConfig::new(lower).with_cost(cost)))
    }

    /// [`scheduler_config`](Self::scheduler_config) with, below the
    /// engine's own tiers, a pool `remote` shares with other engines (a
    /// cluster's store, medium `"REMOTE"`), reached over `link`.
    ///
    /// # Errors
    ///
    /// As [`plan`](Self::plan).
    pub(crate) fn scheduler_config_with_remote(
        &self,
        block_size: usize,
        step_time: &StepTime,
        remote: Option<(&kvbm_blocks::BlockManager<kvbm_tiers::Lower>, Link)>,
    ) -> Result<Option<TiersConfig>, SimError> {
        let own = self.scheduler_config(block_size, step_time)?;
        let Some((pool, link)) = remote else {
            return Ok(own);
        };
        let block_bytes = self.block_bytes(block_size)?;
        let prefill_token_s = step_time.per_prefill_token.as_secs_f64();
        let mut config = own.unwrap_or_else(|| {
            TiersConfig::default().with_cost(LoadCost::new(prefill_token_s, Vec::new()))
        });
        config.lower.push(
            TierConfig::shared(REMOTE, pool)
                .with_offload(self.offload.policy())
                .with_max_incoming_blocks(incoming_window(link, block_bytes)),
        );
        if let Some(cost) = &mut config.cost {
            cost.links.push(LinkCost {
                setup_s: link.setup_us / 1e6,
                block_s: block_bytes as f64 * 8.0 / (link.gbps * 1e9),
            });
        }
        Ok(Some(config))
    }
}

/// How long a link's stores may queue: the blocks on their way into a tier
/// are bounded by what its link moves in this time (at least one), so a
/// slow tier never pins more of the GPU than that (a store's sources stay
/// pinned until it ends) and stores past it are skipped, as a bounded
/// offload queue drops them.
pub const STORE_WINDOW_MS: f64 = 100.0;

/// Blocks `link` moves in [`STORE_WINDOW_MS`], at least 1.
pub(crate) fn incoming_window(link: Link, block_bytes: u64) -> usize {
    let bytes = link.gbps * 1e9 / 8.0 * STORE_WINDOW_MS / 1e3;
    let blocks = (bytes / block_bytes.max(1) as f64).floor();
    if blocks >= 1e9 {
        1_000_000_000
    } else {
        (blocks as usize).max(1)
    }
}

/// The transfers of one engine on their links, in simulated time.
#[derive(Debug)]
pub(crate) struct LinkClock {
    /// Per lower tier: its link, and when each direction (down, up) is
    /// free next.
    links: Vec<(Link, [u64; 2])>,
    block_bytes: u64,
    /// Transfers under way: when each ends, earliest first.
    ends: BinaryHeap<Reverse<(u64, u64)>>,
    /// Per lower tier: bytes stored into it and loaded from it.
    pub(crate) bytes: Vec<[u64; 2]>,
}

impl LinkClock {
    pub(crate) fn new(plans: &[TierPlan], block_bytes: u64) -> Self {
        Self {
            links: plans.iter().map(|plan| (plan.link, [0, 0])).collect(),
            block_bytes,
            ends: BinaryHeap::new(),
            bytes: vec![[0, 0]; plans.len()],
        }
    }

    /// One more lower tier's link, below the others.
    pub(crate) fn push(&mut self, link: Link) {
        self.links.push((link, [0, 0]));
        self.bytes.push([0, 0]);
    }

    /// Starts `transfers` at `now`, each behind what its link direction
    /// already carries.
    pub(crate) fn start(&mut self, now: u64, transfers: &[Transfer]) {
        for transfer in transfers {
            let (tier, direction) = match transfer.kind {
                TransferKind::Load => (transfer.source, 1),
                _ => (transfer.destination, 0),
            };
            let Some(index) = tier.level().checked_sub(1) else {
                continue;
            };
            let Some((link, free)) = self.links.get_mut(index) else {
                continue;
            };
            let bytes = (transfer.blocks() as u64).saturating_mul(self.block_bytes);
            let begins = free[direction].max(now);
            let ends = begins.saturating_add(link.transfer_nanos(bytes));
            free[direction] = ends;
            if let Some(counts) = self.bytes.get_mut(index) {
                counts[direction] = counts[direction].saturating_add(bytes);
            }
            self.ends.push(Reverse((ends, transfer.id.get())));
        }
    }

    /// Reports of every transfer that ended by `now`, in the order they
    /// ended (appended to `out`).
    pub(crate) fn ended(&mut self, now: u64, out: &mut Vec<(TransferId, Outcome)>) {
        while let Some(&Reverse((at, id))) = self.ends.peek() {
            if at > now {
                break;
            }
            self.ends.pop();
            out.push((TransferId::from_raw(id), Outcome::Completed));
        }
    }

    /// When the next transfer under way ends.
    pub(crate) fn next_end(&self) -> Option<u64> {
        self.ends.peek().map(|&Reverse((at, _))| at)
    }
}

#[cfg(test)]
mod tests {
    use kvbm_tiers::TierId;

    use super::*;

    #[test]
    fn offload_policies_parse_and_print() {
        for text in ["write-through", "write-back", "selective:0", "selective:15"] {
            assert_eq!(text.parse::<Offload>().unwrap().to_string(), text);
        }
        for bad in ["selective:16", "selective:", "selective:-1", "lru", ""] {
            assert!(bad.parse::<Offload>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_block_over_pcie_takes_setup_plus_bytes_over_bandwidth() {
        // 16 tokens × 128 KiB = 2 MiB over 400 Gbit/s = 41.9 µs, + 10 µs.
        let nanos = Link::PCIE5_X16.transfer_nanos(16 * 128 * 1024);
        assert_eq!(nanos, 10_000 + 41_944);
    }

    #[test]
    fn a_link_direction_is_a_fifo_and_directions_are_independent() {
        let plans = [TierPlan {
            medium: "CPU",
            blocks: 8,
            link: Link {
                gbps: 8.0,
                setup_us: 1.0,
            },
        }];
        let mut clock = LinkClock::new(&plans, 1000);
        let transfer = |id: u64, kind| Transfer {
            id: TransferId::from_raw(id),
            kind,
            source: if kind == TransferKind::Load {
                TierId::lower(0).unwrap()
            } else {
                TierId::DEVICE
            },
            destination: if kind == TransferKind::Load {
                TierId::DEVICE
            } else {
                TierId::lower(0).unwrap()
            },
            runs: vec![kvbm_tiers::CopyRun {
                source: kvbm_blocks::BlockId::new(0),
                destination: kvbm_blocks::BlockId::new(0),
                blocks: 1,
            }],
            hashes: Vec::new(),
        };
        // 1000 bytes at 8 Gbit/s = 1 µs, + 1 µs setup: 2 µs each.
        clock.start(
            0,
            &[
                transfer(0, TransferKind::Store),
                transfer(1, TransferKind::Store),
            ],
        );
        clock.start(0, &[transfer(2, TransferKind::Load)]);
        let mut out = Vec::new();
        clock.ended(2_000, &mut out);
        assert_eq!(out.len(), 2, "the first store and the load");
        clock.ended(4_000, &mut out);
        assert_eq!(out.len(), 3, "the second store waited for the first");
        assert_eq!(clock.bytes[0], [2000, 1000]);
        assert_eq!(clock.next_end(), None);
    }

    #[test]
    fn bad_setups_are_refused() {
        let setup = |f: fn(&mut TierSetup)| {
            let mut setup = TierSetup::default().with_host_tokens(1 << 20);
            f(&mut setup);
            setup.plan(16)
        };
        assert!(setup(|_| {}).is_ok());
        assert!(setup(|s| s.host_tokens = Some(8)).is_err(), "under a block");
        assert!(
            setup(|s| s.host_tokens = Some(u64::MAX)).is_err(),
            "past a pool"
        );
        assert!(setup(|s| s.kv_bytes_per_token = 0).is_err());
        assert!(
            setup(|s| s.kv_bytes_per_token = u64::MAX).is_err(),
            "overflows"
        );
        assert!(setup(|s| s.host_link.gbps = 0.0).is_err());
        assert!(setup(|s| s.host_link.gbps = f64::NAN).is_err());
        assert!(setup(|s| s.host_link.setup_us = -1.0).is_err());
        assert!(setup(|s| s.host_link.gbps = f64::INFINITY).is_err());
        assert!(
            TierSetup::default().plan(16).unwrap().is_empty(),
            "off by default"
        );
    }
}
