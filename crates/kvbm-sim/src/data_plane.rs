//! `--data-plane`: real stores behind a serve replay's lower tiers, so the
//! bytes of every offload and load actually move ([`DataPlaneSpec`]).
//!
//! Time stays simulated (the link model decides when a transfer ends); the
//! bytes are real: a fake engine writes each computed block's KV (a
//! function of its hash, [`kvbm_store::fake_kv`]) into device memory in
//! host RAM, `kvbm-store`'s transfer engine copies it down to the stores
//! and back, and every block a load brings up is checked byte for byte
//! against what it must be before the scheduler may use it. The replay's
//! outcome follows the real one: a transfer the data plane failed fails in
//! the replay too (its request recomputes).

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvbm_blocks::BlockId;
use kvbm_store::{
    BlockStore, DiskConfig, DiskStore, EngineConfig, HostArena, HostDevice, Report, TierStore,
    TransferEngine,
};
use kvbm_tiers::{Outcome, TierId, Tiers, Transfer, TransferId, TransferKind};
use serde::Serialize;

use crate::SimError;

/// Where the lowest lower tier keeps its bytes (`--data-plane`); the tiers
/// above it (the host tier, when a disk tier is below) use host arenas.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DataPlaneSpec {
    /// Host memory (`host`): preallocated arenas.
    Host,
    /// A disk store in this directory (`disk:DIR`), created if missing.
    Disk(PathBuf),
    /// A Redis Cluster reached through these nodes
    /// (`redis:redis://host:port[,redis://...]`).
    Redis(Vec<String>),
}

impl FromStr for DataPlaneSpec {
    type Err = SimError;

    fn from_str(text: &str) -> Result<Self, SimError> {
        let bad = |reason: &str| SimError::DataPlane {
            reason: format!("`{text}`: {reason} (expected host, disk:DIR or redis:URL[,URL...])"),
        };
        match text.split_once(':') {
            None if text == "host" => Ok(Self::Host),
            Some(("disk", "")) => Err(bad("no directory")),
            Some(("disk", dir)) => Ok(Self::Disk(PathBuf::from(dir))),
            Some(("redis", urls)) => {
                let nodes: Vec<String> = urls
                    .split(',')
                    .filter(|url| !url.is_empty())
                    .map(str::to_owned)
                    .collect();
                if nodes.is_empty() {
                    Err(bad("no Redis node"))
                } else {
                    Ok(Self::Redis(nodes))
                }
            }
            _ => Err(bad("unknown store")),
        }
    }
}

impl fmt::Display for DataPlaneSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Host => f.write_str("host"),
            Self::Disk(dir) => write!(f, "disk:{}", dir.display()),
            Self::Redis(nodes) => write!(f, "redis:{}", nodes.join(",")),
        }
    }
}

/// What the data plane moved and checked in a replay (the serve report's
/// `data_plane`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[non_exhaustive]
pub struct DataPlaneReport {
    /// The `--data-plane` given.
    pub store: String,
    /// Bytes per block.
    pub block_bytes: u64,
    /// Blocks completed loads wrote to the device.
    pub loaded_blocks: u64,
    /// Of those, the blocks that held exactly their own KV.
    pub verified_blocks: u64,
    /// Of those, blocks that held other bytes (each failed its transfer, so
    /// no request used it; must stay 0).
    pub wrong_blocks: u64,
    /// Blocks of transfers the data plane failed (their requests recompute).
    pub failed_blocks: u64,
    /// Blocks whose bytes did not verify when read from a store.
    pub corrupt_blocks: u64,
    /// Bytes read from the stores.
    pub bytes_read: u64,
    /// Bytes written to the stores.
    pub bytes_written: u64,
    /// Wall-clock seconds the replay waited for the data plane.
    pub wait_seconds: f64,
}

/// How long the replay waits for one transfer's real outcome before it
/// counts the transfer as failed.
const REPORT_TIMEOUT: Duration = Duration::from_secs(60);

/// The most bytes of device memory and host arenas a replay may allocate.
pub const MAX_DATA_PLANE_BYTES: u64 = 8 << 30;

/// One serve engine's data plane.
pub(crate) struct SimDataPlane {
    spec: String,
    block_bytes: usize,
    engine: TransferEngine,
    device: Arc<HostDevice>,
    /// Transfers the engine's queue had no room for yet, in order.
    backlog: VecDeque<Transfer>,
    /// Loads submitted: where each block lands, to check it.
    loads: HashMap<u64, Vec<(BlockId, u128)>>,
    /// Real outcomes received before the link model asked for them.
    outcomes: HashMap<u64, Outcome>,
    loaded: u64,
    verified: u64,
    wrong: u64,
    waited: Duration,
    /// A remote store whose namespace is this replay's alone: emptied when
    /// the replay ends, so a replay leaves nothing behind in the cluster.
    remote: Option<Arc<dyn BlockStore>>,
}

impl Drop for SimDataPlane {
    fn drop(&mut self) {
        let Some(remote) = &self.remote else {
            return;
        };
        match remote.keys() {
            Ok(keys) => {
                for chunk in keys.chunks(1024) {
                    let _ = remote.remove(chunk);
                }
            }
            Err(err) => tracing::warn!(%err, "the replay's Redis keys were not removed"),
        }
    }
}

impl fmt::Debug for SimDataPlane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimDataPlane")
            .field("spec", &self.spec)
            .field("engine", &self.engine)
            .finish_non_exhaustive()
    }
}

impl SimDataPlane {
    /// The stores `spec` names behind `tiers`' lower tiers, a device of the
    /// device pool's size, and a transfer engine over them.
    pub(crate) fn new<D>(
        spec: &DataPlaneSpec,
        tiers: &Tiers<D>,
        block_bytes: u64,
    ) -> Result<Self, SimError> {
        let lower: Vec<TierId> = tiers.lower_ids().collect();
        let Some(&lowest) = lower.last() else {
            return Err(SimError::DataPlane {
                reason: "--data-plane needs a tier below the GPU (--host-tier-tokens or --disk-tier-tokens)".into(),
            });
        };
        let blocks_of = |tier: TierId| tiers.config(tier).map_or(0, |c| c.blocks);
        // Device memory and host arenas are allocated up front: bound them.
        let in_memory = lower
            .iter()
            .filter(|&&t| t != lowest || *spec == DataPlaneSpec::Host)
            .map(|&t| blocks_of(t) as u64)
            .fold(tiers.device().total_blocks() as u64, u64::saturating_add);
        let bytes = in_memory.saturating_mul(block_bytes);
        if bytes > MAX_DATA_PLANE_BYTES {
            return Err(SimError::DataPlane {
                reason: format!(
                    "device memory and host arenas of {bytes} bytes ({in_memory} blocks of \
                     {block_bytes} bytes) exceed {MAX_DATA_PLANE_BYTES}: lower the GPU's or the tiers' size, or --kv-bytes-per-token \
                     (with a model, --capacity-bytes)"
                ),
            });
        }
        let block_bytes = usize::try_from(block_bytes).map_err(|_| SimError::DataPlane {
            reason: format!("{block_bytes}-byte blocks cannot be addressed"),
        })?;
        let store_error = |err: kvbm_store::StoreError| SimError::DataPlane {
            reason: err.to_string(),
        };
        let device = Arc::new(
            HostDevice::new(block_bytes, tiers.device().total_blocks()).map_err(store_error)?,
        );
        let mut stores = Vec::with_capacity(lower.len());
        let mut remote = None;
        for &tier in &lower {
            let blocks = blocks_of(tier);
            let store: Arc<dyn BlockStore> = match spec {
                DataPlaneSpec::Disk(dir) if tier == lowest => Arc::new(
                    DiskStore::open(DiskConfig::new(dir, block_bytes, blocks).create(true))
                        .map_err(store_error)?,
                ),
                DataPlaneSpec::Redis(nodes) if tier == lowest => {
                    let store = redis_store(nodes, block_bytes, blocks)?;
                    remote = Some(Arc::clone(&store));
                    store
                }
                _ => Arc::new(HostArena::new(block_bytes, blocks).map_err(store_error)?),
            };
            let mut tier_store = TierStore::new(tier, store);
            if let Some(pool) = tiers.pool(tier) {
                tier_store = tier_store.following(pool.subscribe_events(4096));
            }
            stores.push(tier_store);
        }
        let engine = TransferEngine::new(device.clone(), stores, EngineConfig::default())
            .map_err(store_error)?;
        Ok(Self {
            spec: spec.to_string(),
            block_bytes,
            engine,
            device,
            backlog: VecDeque::new(),
            loads: HashMap::new(),
            outcomes: HashMap::new(),
            loaded: 0,
            verified: 0,
            wrong: 0,
            waited: Duration::ZERO,
            remote,
        })
    }

    /// Starts `transfers`: the fake engine's KV of every block a store
    /// takes from the device is written there first (what the forward pass
    /// computed), then each goes to the transfer engine.
    pub(crate) fn start(&mut self, transfers: &[Transfer]) -> Result<(), SimError> {
        for transfer in transfers {
            if transfer.source.is_device() {
                for ((source, _), hash) in transfer.pairs().zip(&transfer.hashes) {
                    self.device.compute(source, hash.value()).map_err(|err| {
                        SimError::DataPlane {
                            reason: err.to_string(),
                        }
                    })?;
                }
            }
            if transfer.kind == TransferKind::Load {
                let lands = (transfer.pairs().map(|(_, to)| to))
                    .zip(transfer.hashes.iter().map(|h| h.value()))
                    .collect();
                self.loads.insert(transfer.id.get(), lands);
            }
            self.backlog.push_back(transfer.clone());
        }
        self.submit_backlog();
        Ok(())
    }

    /// Hands the engine what its queue has room for.
    fn submit_backlog(&mut self) {
        while let Some(transfer) = self.backlog.pop_front() {
            if let Err(back) = self.engine.try_submit(transfer) {
                self.backlog.push_front(back);
                return;
            }
        }
    }

    /// The real outcome of transfer `id`, waiting for it if it is still
    /// running (a transfer that does not end within a minute fails).
    pub(crate) fn outcome(&mut self, id: TransferId) -> Outcome {
        let started = Instant::now();
        let outcome = loop {
            if let Some(outcome) = self.outcomes.remove(&id.get()) {
                break outcome;
            }
            self.submit_backlog();
            if started.elapsed() > REPORT_TIMEOUT {
                tracing::warn!(%id, "the data plane did not report a transfer in time");
                break Outcome::Failed;
            }
            if let Some(report) = self.engine.report_timeout(Duration::from_millis(5)) {
                self.record(report);
            }
        };
        self.waited += started.elapsed();
        outcome
    }

    /// Takes a report in: a completed load is checked block by block, and
    /// fails if any block holds other bytes than its own KV.
    fn record(&mut self, report: Report) {
        let mut outcome = report.outcome();
        if let Some(lands) = self.loads.remove(&report.id.get())
            && outcome == Outcome::Completed
        {
            for (block, key) in lands {
                self.loaded += 1;
                if self.device.holds(block, key).unwrap_or(false) {
                    self.verified += 1;
                } else {
                    self.wrong += 1;
                    outcome = Outcome::Failed;
                }
            }
        }
        self.outcomes.insert(report.id.get(), outcome);
    }

    /// The report's `data_plane`.
    pub(crate) fn report(&self) -> DataPlaneReport {
        let stats = self.engine.stats();
        DataPlaneReport {
            store: self.spec.clone(),
            block_bytes: self.block_bytes as u64,
            loaded_blocks: self.loaded,
            verified_blocks: self.verified,
            wrong_blocks: self.wrong,
            failed_blocks: stats.failed_blocks,
            corrupt_blocks: stats.corrupt_blocks,
            bytes_read: stats.bytes_read,
            bytes_written: stats.bytes_written,
            wait_seconds: self.waited.as_secs_f64(),
        }
    }
}

/// The lowest tier on a Redis Cluster, under a namespace of its own for
/// this replay (removed again when the replay ends).
#[cfg(feature = "redis")]
fn redis_store(
    nodes: &[String],
    block_bytes: usize,
    blocks: usize,
) -> Result<Arc<dyn BlockStore>, SimError> {
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let namespace = format!("kvbm-sim/{}-{}", std::process::id(), started.as_nanos());
    let config =
        kvbm_store_redis::RedisConfig::new(nodes.iter().cloned(), namespace, block_bytes, blocks);
    let store = kvbm_store_redis::RedisClusterStore::connect(config).map_err(|err| {
        SimError::DataPlane {
            reason: err.to_string(),
        }
    })?;
    Ok(Arc::new(store))
}

/// Without the `redis` feature there is no Redis store.
#[cfg(not(feature = "redis"))]
fn redis_store(
    _nodes: &[String],
    _block_bytes: usize,
    _blocks: usize,
) -> Result<Arc<dyn BlockStore>, SimError> {
    Err(SimError::FeatureDisabled {
        flag: "--data-plane redis:URL",
        feature: "redis",
    })
}
