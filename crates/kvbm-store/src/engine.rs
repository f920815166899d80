//! [`TransferEngine`]: runs the tiers' transfer plans on worker threads and
//! reports each one, completed or failed, exactly once.

mod follow;
mod job;
mod stats;

use std::fmt;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, TrySendError};
use kvbm_blocks::EventSubscription;
use kvbm_tiers::{Outcome, TierId, Transfer, TransferId, TransferKind};

pub use stats::DataPlaneStats;

use crate::{BlockStore, DeviceMemory, StoreError};
use follow::Follower;
use stats::Counters;

/// How the engine runs.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct EngineConfig {
    /// Worker threads (at least 1).
    pub workers: usize,
    /// Transfers waiting for a worker at most; past it
    /// [`TransferEngine::try_submit`] hands the transfer back.
    pub queue: usize,
    /// Blocks a worker moves per store call (its buffer holds this many).
    pub batch_blocks: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            workers: 2,
            queue: 64,
            batch_blocks: 32,
        }
    }
}

impl EngineConfig {
    /// `workers` worker threads.
    pub fn with_workers(mut self, workers: usize) -> Self {
        self.workers = workers;
        self
    }

    /// At most `queue` transfers waiting.
    pub fn with_queue(mut self, queue: usize) -> Self {
        self.queue = queue;
        self
    }

    /// `blocks` blocks per store call.
    pub fn with_batch_blocks(mut self, blocks: usize) -> Self {
        self.batch_blocks = blocks;
        self
    }
}

/// One lower tier's store, as the engine is given it.
#[derive(Debug)]
pub struct TierStore {
    tier: TierId,
    store: Arc<dyn BlockStore>,
    follow: Option<EventSubscription>,
}

impl TierStore {
    /// `store` holds the bytes of lower tier `tier`.
    pub fn new(tier: TierId, store: Arc<dyn BlockStore>) -> Self {
        Self {
            tier,
            store,
            follow: None,
        }
    }

    /// Keeps the store to what the tier holds: `subscription` (from the
    /// tier's pool, [`Tiers::pool`](kvbm_tiers::Tiers::pool)`(tier).subscribe_events(..)`)
    /// announces its evictions, and the engine removes them from the store
    /// before writing into it. Without it the store fills with blocks the
    /// tier evicted, and its puts fail once it is full.
    pub fn following(mut self, subscription: EventSubscription) -> Self {
        self.follow = Some(subscription);
        self
    }
}

/// A transfer's source or destination.
pub(crate) enum Endpoint {
    Device(Arc<dyn DeviceMemory>),
    Store {
        store: Arc<dyn BlockStore>,
        follower: Option<Follower>,
    },
}

/// Why a transfer failed: the first block that could not be moved, or a
/// plan the engine cannot run.
#[derive(Debug)]
#[non_exhaustive]
pub struct Failure {
    /// The block's index in the transfer ([`Transfer::pairs`] order), if the
    /// failure is about one block.
    pub block: Option<usize>,
    /// That block's hash value.
    pub key: Option<u128>,
    /// What went wrong.
    pub error: StoreError,
}

impl Failure {
    fn block(index: usize, key: u128, error: StoreError) -> Self {
        Self {
            block: Some(index),
            key: Some(key),
            error,
        }
    }

    fn plan(reason: String) -> Self {
        Self {
            block: None,
            key: None,
            error: StoreError::Engine(reason),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.block, self.key) {
            (Some(block), Some(key)) => write!(f, "block {block} ({key:032x}): {}", self.error),
            _ => write!(f, "{}", self.error),
        }
    }
}

/// What became of one transfer. Every transfer the engine accepted is
/// reported exactly once.
#[derive(Debug)]
#[non_exhaustive]
pub struct Report {
    /// The transfer.
    pub id: TransferId,
    /// Which way it went.
    pub kind: TransferKind,
    /// Its blocks.
    pub blocks: usize,
    /// `Ok` when every block was moved (and, for blocks read from a store,
    /// verified); the first failure otherwise.
    pub result: Result<(), Failure>,
}

impl Report {
    /// The outcome to give the tiers ([`Tiers::settle_all`](kvbm_tiers::Tiers::settle_all))
    /// or the scheduler (`Scheduler::report_transfers`).
    pub fn outcome(&self) -> Outcome {
        if self.result.is_ok() {
            Outcome::Completed
        } else {
            Outcome::Failed
        }
    }
}

/// Runs transfer plans: device to host, host to disk or remote, and back up
/// to the device, on worker threads.
///
/// Submitting is bounded ([`try_submit`](Self::try_submit) hands a transfer
/// back when [`EngineConfig::queue`] are waiting) and so are reports (a
/// worker waits to send one until the caller takes some), so nothing grows
/// without bound. Each accepted transfer yields exactly one [`Report`]:
/// give its [`outcome`](Report::outcome) to the tiers. A block read from a
/// store is verified against its key and checksum before it goes anywhere;
/// a failed transfer's blocks written to a store are removed again, and a
/// failed load's device blocks are never registered by the tiers, so
/// nothing wrong is ever matched.
///
/// Dropping the engine finishes the transfers already accepted (their
/// reports are dropped with it) and joins the workers.
pub struct TransferEngine {
    jobs: Option<Sender<Transfer>>,
    reports: Receiver<Report>,
    counters: Arc<Counters>,
    workers: Vec<JoinHandle<()>>,
    block_bytes: usize,
}

impl fmt::Debug for TransferEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransferEngine")
            .field("workers", &self.workers.len())
            .field("block_bytes", &self.block_bytes)
            .field("stats", &self.counters.snapshot())
            .finish()
    }
}

/// Every tier's endpoint, indexed by level (0: the device).
struct Endpoints(Vec<Option<Endpoint>>);

impl Endpoints {
    fn get(&self, tier: TierId) -> Option<&Endpoint> {
        self.0.get(tier.level()).and_then(Option::as_ref)
    }
}

impl TransferEngine {
    /// An engine moving blocks between `device` and the lower tiers'
    /// `stores`.
    ///
    /// # Errors
    ///
    /// [`StoreError::Config`] for no worker, a queue or batch of 0, a store
    /// given for the device tier or twice for one tier, or a store whose
    /// block size differs from the device's; [`StoreError::Engine`] if a
    /// worker thread cannot be started.
    pub fn new(
        device: Arc<dyn DeviceMemory>,
        stores: Vec<TierStore>,
        config: EngineConfig,
    ) -> Result<Self, StoreError> {
        if config.workers == 0 || config.queue == 0 || config.batch_blocks == 0 {
            return Err(StoreError::Config(format!(
                "{config:?}: workers, queue and batch must each be at least 1"
            )));
        }
        let block_bytes = device.block_bytes();
        let mut endpoints: Vec<Option<Endpoint>> = vec![Some(Endpoint::Device(device))];
        for tier in stores {
            if tier.tier.is_device() {
                return Err(StoreError::Config("a store for the device tier".into()));
            }
            if tier.store.block_bytes() != block_bytes {
                return Err(StoreError::Config(format!(
                    "tier {} stores {}-byte blocks, the device's are {block_bytes} bytes",
                    tier.tier,
                    tier.store.block_bytes()
                )));
            }
            let level = tier.tier.level();
            if endpoints.len() <= level {
                endpoints.resize_with(level + 1, || None);
            }
            if endpoints[level].is_some() {
                return Err(StoreError::Config(format!(
                    "two stores for tier {}",
                    tier.tier
                )));
            }
            endpoints[level] = Some(Endpoint::Store {
                store: tier.store,
                follower: tier.follow.map(Follower::new),
            });
        }
        let endpoints = Arc::new(Endpoints(endpoints));
        let counters = Arc::new(Counters::default());
        let (jobs, queue) = crossbeam_channel::bounded::<Transfer>(config.queue);
        let reports_capacity = config.queue.saturating_add(config.workers);
        let (report_tx, reports) = crossbeam_channel::bounded(reports_capacity);
        let mut workers = Vec::with_capacity(config.workers);
        for index in 0..config.workers {
            let worker = Worker {
                queue: queue.clone(),
                reports: report_tx.clone(),
                endpoints: Arc::clone(&endpoints),
                counters: Arc::clone(&counters),
                block_bytes,
                batch_blocks: config.batch_blocks,
            };
            let handle = std::thread::Builder::new()
                .name(format!("kvbm-transfer-{index}"))
                .spawn(move || worker.run())
                .map_err(|err| StoreError::Engine(format!("starting a worker: {err}")))?;
            workers.push(handle);
        }
        Ok(Self {
            jobs: Some(jobs),
            reports,
            counters,
            workers,
            block_bytes,
        })
    }

    /// Queues `transfer` for a worker.
    ///
    /// # Errors
    ///
    /// The transfer back, untouched, when the queue is full (take some
    /// reports and try again) or the engine is shutting down.
    #[allow(clippy::result_large_err)]
    pub fn try_submit(&self, transfer: Transfer) -> Result<(), Transfer> {
        let Some(jobs) = &self.jobs else {
            return Err(transfer);
        };
        jobs.try_send(transfer).map_err(|err| match err {
            TrySendError::Full(t) | TrySendError::Disconnected(t) => t,
        })
    }

    /// The next report, if one is waiting.
    pub fn try_report(&self) -> Option<Report> {
        self.reports.try_recv().ok()
    }

    /// The next report, waiting up to `timeout`.
    pub fn report_timeout(&self, timeout: Duration) -> Option<Report> {
        self.reports.recv_timeout(timeout).ok()
    }

    /// The report channel itself, for `select!` with other channels.
    pub fn reports(&self) -> &Receiver<Report> {
        &self.reports
    }

    /// What it has moved, verified and failed so far.
    pub fn stats(&self) -> DataPlaneStats {
        self.counters.snapshot()
    }

    /// Every block's size in bytes.
    pub fn block_bytes(&self) -> usize {
        self.block_bytes
    }
}

impl Drop for TransferEngine {
    fn drop(&mut self) {
        // Closing the queue ends each worker once it is drained; closing
        // the reports ends one waiting to send a report nobody will read.
        self.jobs = None;
        drop(std::mem::replace(
            &mut self.reports,
            crossbeam_channel::never(),
        ));
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}

/// One worker thread's share of the engine.
struct Worker {
    queue: Receiver<Transfer>,
    reports: Sender<Report>,
    endpoints: Arc<Endpoints>,
    counters: Arc<Counters>,
    block_bytes: usize,
    batch_blocks: usize,
}

impl Worker {
    fn run(self) {
        let mut buffer = Vec::new();
        let cx = job::Context {
            counters: &self.counters,
            block_bytes: self.block_bytes,
            batch_blocks: self.batch_blocks,
        };
        for transfer in &self.queue {
            let result = match (
                self.endpoints.get(transfer.source),
                self.endpoints.get(transfer.destination),
            ) {
                _ if transfer.source == transfer.destination => Err(Failure::plan(format!(
                    "transfer {} copies {} onto itself",
                    transfer.id, transfer.source
                ))),
                (Some(source), Some(destination)) => {
                    job::run(&cx, &transfer, source, destination, &mut buffer)
                }
                (source, _) => Err(Failure::plan(format!(
                    "transfer {}: no store for {}",
                    transfer.id,
                    if source.is_none() {
                        transfer.source
                    } else {
                        transfer.destination
                    }
                ))),
            };
            let blocks = transfer.blocks();
            match &result {
                Ok(()) => stats::add(&self.counters.completed_transfers, 1),
                Err(failure) => {
                    tracing::debug!(id = %transfer.id, %failure, "transfer failed");
                    stats::add(&self.counters.failed_transfers, 1);
                    stats::add(&self.counters.failed_blocks, blocks);
                }
            }
            let report = Report {
                id: transfer.id,
                kind: transfer.kind,
                blocks,
                result,
            };
            // Fails only once the engine is dropped: the rest of the queue
            // still runs, its reports thrown away.
            let _ = self.reports.send(report);
        }
    }
}
