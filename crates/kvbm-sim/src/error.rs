//! [`SimError`], the one error type of this crate.

use std::path::PathBuf;

use kvbm_blocks::BlockError;
use kvbm_queue::SchedulerError;

/// Everything that can go wrong loading a trace, configuring a replay or
/// writing its results.
///
/// Every variant names what the user can fix: the file, the line, the flag.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// The trace file does not exist.
    #[error("trace file not found: {}", path.display())]
    TraceNotFound {
        /// The path given.
        path: PathBuf,
    },
    /// The trace file exists but could not be read.
    #[error("cannot read trace {}: {source}", path.display())]
    ReadTrace {
        /// The path given.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// A line is not a JSON object with the four Mooncake fields.
    #[error("malformed trace line {line}, column {column}: {reason}")]
    MalformedLine {
        /// 1-based line number in the trace.
        line: usize,
        /// 1-based column in that line where parsing stopped.
        column: usize,
        /// What the JSON parser said.
        reason: String,
    },
    /// A request's `hash_ids` do not cover its `input_length` in 512-token
    /// blocks (`512 × (blocks - 1) < input_length <= 512 × blocks`).
    #[error(
        "trace line {line}: input_length {input_length} does not fit {blocks} hash_ids of 512 tokens"
    )]
    InconsistentRequest {
        /// 1-based line number in the trace (for in-memory traces, the
        /// request's 1-based index).
        line: usize,
        /// The request's prompt length in tokens.
        input_length: u64,
        /// How many hash ids the request lists.
        blocks: usize,
    },
    /// A request asks to generate more tokens than any request can
    /// (`max_new_tokens` is a `u32`).
    #[error("trace line {line}: output_length {output_length} exceeds the maximum of 4294967295")]
    OutputTooLong {
        /// 1-based line number in the trace (for in-memory traces, the
        /// request's 1-based index).
        line: usize,
        /// The request's `output_length` as written.
        output_length: u64,
    },
    /// A request arrives later than the simulated clock can follow
    /// ([`MAX_TIMESTAMP_MS`](crate::MAX_TIMESTAMP_MS), about 292 years).
    #[error(
        "trace line {line}: timestamp {timestamp} ms exceeds the maximum of {max} ms (about 292 years)",
        max = crate::MAX_TIMESTAMP_MS
    )]
    TimestampTooLarge {
        /// 1-based line number in the trace (for in-memory traces, the
        /// request's 1-based index).
        line: usize,
        /// The request's `timestamp` as written, in milliseconds.
        timestamp: u64,
    },
    /// The trace has no requests.
    #[error("the trace has no requests")]
    EmptyTrace,
    /// The block size does not split the trace's 512-token blocks evenly.
    #[error(
        "block size {block_size} must divide the trace's 512-token blocks (1, 2, 4, ..., 256, 512)"
    )]
    InvalidBlockSize {
        /// The block size asked for.
        block_size: usize,
    },
    /// A cache of zero blocks (including a token capacity below one block).
    #[error("cache capacity {capacity} holds no {block_size}-token block")]
    ZeroCapacity {
        /// The capacity asked for, as written.
        capacity: String,
        /// The block size it was resolved at.
        block_size: usize,
    },
    /// A cache larger than a block pool can address.
    #[error("cache capacity of {blocks} blocks exceeds the maximum of {max}")]
    CapacityTooLarge {
        /// The capacity in blocks.
        blocks: u64,
        /// The largest pool kvbm-blocks supports.
        max: usize,
    },
    /// Serve mode was asked for an unbounded pool, which means nothing there:
    /// running requests hold blocks that no other request can share.
    #[error(
        "serve mode needs a bounded KV pool: give a capacity in blocks or tokens (--capacity-blocks N or --capacity-tokens N)"
    )]
    UnboundedServe,
    /// A step-time cost that is negative, not a number, or over an hour.
    #[error(
        "step time {what} must be a finite number of milliseconds between 0 and 3,600,000, got {value}"
    )]
    InvalidStepTime {
        /// Which cost (`per step`, `per prefill token`, `per decoding request`).
        what: &'static str,
        /// The value given, in milliseconds.
        value: f64,
    },
    /// Lower tiers that cannot be simulated (a size under one block or
    /// past a pool, 0 bytes per token, a link of no or absurd bandwidth).
    #[error("tiers: {0}")]
    InvalidTiers(String),
    /// A speculative-decoding acceptance probability outside `0..=1`.
    #[error("draft acceptance probability must be between 0 and 1, got {value}")]
    InvalidAcceptance {
        /// The probability given.
        value: f64,
    },
    /// A priority mix that is not `PRIORITY:SHARE,...` with finite,
    /// non-negative shares adding up to more than 0.
    #[error("invalid priority mix `{mix}`: {reason}")]
    InvalidPriorityMix {
        /// The mix as written.
        mix: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// An aging rate that is negative or not a number.
    #[error(
        "aging rate must be a finite number of priority steps per second, at least 0, got {value}"
    )]
    InvalidAgingRate {
        /// The rate given.
        value: f64,
    },
    /// The metrics exporter could not be set up (the address is taken, or a
    /// recorder is already installed).
    #[error("metrics: {reason}")]
    Metrics {
        /// What went wrong.
        reason: String,
    },
    /// The scheduler refused its configuration (a zero limit, for instance)
    /// or an operation the replay relies on (a bug in the simulator or in
    /// kvbm-queue).
    #[error("scheduler: {0}")]
    Scheduler(#[from] SchedulerError),
    /// The scheduler planned nothing while requests were waiting and no more
    /// were due to arrive: the replay cannot finish. A bug in kvbm.
    #[error(
        "the scheduler stopped making progress at step {step} with {waiting} waiting and {running} running requests"
    )]
    Stalled {
        /// The scheduler's step number.
        step: u64,
        /// Requests waiting.
        waiting: u64,
        /// Requests running.
        running: u64,
    },
    /// Simulated time ran past what the clock counts (`u64` nanoseconds,
    /// about 584 years): step times so long, or so many steps after the
    /// last arrival, that no report could state them.
    #[error(
        "simulated time passed the clock's limit of about 584 years at scheduler step {step}: \
         the step times (--step-ms, --prefill-token-ms, --decode-request-ms) are too long for this trace"
    )]
    ClockOverflow {
        /// The scheduler step whose end could not be counted.
        step: u64,
    },
    /// A routing policy name that is not one of cluster mode's.
    #[error(
        "unknown routing policy `{name}` (expected random, round-robin, least-loaded or kv-aware)"
    )]
    UnknownPolicy {
        /// The name given.
        name: String,
    },
    /// After a cluster replay, the router's view of an engine's cache
    /// differs from the engine's pool: an event was lost or misapplied.
    #[error(
        "the router holds {router_blocks} blocks of engine {engine}, whose pool registers {pool_blocks}"
    )]
    RouterOutOfSync {
        /// The engine.
        engine: usize,
        /// Blocks the router's index holds for it.
        router_blocks: usize,
        /// Blocks its pool's registry holds.
        pool_blocks: usize,
    },
    /// A cluster of no engines.
    #[error("a cluster needs at least one engine")]
    ZeroEngines,
    /// `--replicate N` ([`Trace::replicate`](crate::Trace::replicate)):
    /// no copies, or more than can be told apart or counted.
    #[error("--replicate {copies}: {reason}")]
    InvalidReplicate {
        /// The copies asked for.
        copies: usize,
        /// Why they cannot be made.
        reason: String,
    },
    /// A flag whose capability this `kvbm-sim` was built without.
    #[error(
        "{flag} needs kvbm-sim built with the `{feature}` feature \
         (cargo run --release -p kvbm-sim --features {feature}, or --features full for all of them)"
    )]
    FeatureDisabled {
        /// The flag given.
        flag: &'static str,
        /// The Cargo feature that provides it.
        feature: &'static str,
    },
    /// More blocks over all engines than one pool may hold (a cluster that
    /// fits that but not the machine is [`SimError::ClusterMemory`]).
    #[error(
        "a cluster of {engines} engines of {capacity_blocks} blocks is too large \
         (at most {max} blocks in all)"
    )]
    ClusterTooLarge {
        /// Engines asked for.
        engines: usize,
        /// Blocks per engine.
        capacity_blocks: usize,
        /// The most blocks all engines may hold together.
        max: usize,
    },
    /// A cluster whose estimated memory
    /// ([`ClusterConfig::memory_estimate`](crate::ClusterConfig::memory_estimate))
    /// exceeds its budget: refused before any engine is built.
    #[error(
        "a cluster of {engines} engines of {capacity_blocks} blocks needs an estimated {} for this trace, \
         over the memory budget of {}: use fewer engines (--engines) or smaller pools \
         (--capacity-tokens), or raise the budget with --memory-limit-gb",
        crate::format::gigabytes(.estimate_bytes),
        crate::format::gigabytes(.budget_bytes)
    )]
    ClusterMemory {
        /// Engines asked for.
        engines: usize,
        /// Blocks per engine.
        capacity_blocks: usize,
        /// What the replay would allocate, by the estimate, in bytes.
        estimate_bytes: u64,
        /// The budget, in bytes.
        budget_bytes: u64,
    },
    /// A memory budget that is zero, negative, not a number or absurdly
    /// large.
    #[error(
        "memory limit must be a finite number of gigabytes above 0 and at most {max}, got {value:?}",
        max = crate::ClusterConfig::MAX_MEMORY_BUDGET / 1_000_000_000
    )]
    InvalidMemoryLimit {
        /// The value given, in gigabytes (10^9 bytes).
        value: f64,
    },
    /// Memory for a replay's state could not be reserved: the machine
    /// refused an allocation the memory estimate let through.
    #[error("out of memory: cannot allocate {bytes} bytes for {what}")]
    OutOfMemory {
        /// What was being allocated.
        what: &'static str,
        /// How many bytes.
        bytes: u64,
    },
    /// A KV-aware routing parameter that is negative or not finite.
    #[error("{name} must be a finite number at least 0, not {value}")]
    InvalidRouting {
        /// Which parameter (`overlap weight`, `temperature`).
        name: &'static str,
        /// What it was given.
        value: f64,
    },
    /// The cluster's thread pool could not be started.
    #[error("starting the cluster's threads: {reason}")]
    Threads {
        /// What the pool builder said.
        reason: String,
    },
    /// More `--kv-events` subscribers to wait for than a publisher could
    /// accept.
    #[error(
        "--kv-events-subscribers {count}: cannot wait for more than {max} KV event subscribers"
    )]
    TooManySubscribers {
        /// The count asked for.
        count: usize,
        /// The most accepted.
        max: usize,
    },
    /// The replay's event sink failed (the `--kv-events` socket).
    #[error("publishing KV events: {reason}")]
    Events {
        /// What the sink said.
        reason: String,
    },
    /// An eviction policy name that is not `lru`, `multi-level` or `lineage`.
    #[error("unknown eviction policy `{name}` (expected lru, multi-level or lineage)")]
    UnknownEviction {
        /// The name given.
        name: String,
    },
    /// A capacity that is not a positive number of blocks (`6000`, `6k`, `1.5M`).
    #[error("invalid capacity `{text}` (expected a block count such as 6000, 6k or 1.5M)")]
    InvalidCapacity {
        /// The text given.
        text: String,
    },
    /// A sweep with no capacity or no eviction policy to run.
    #[error("a sweep needs at least one capacity and one eviction policy")]
    EmptySweep,
    /// Writing a result file failed.
    #[error("cannot write {}: {source}", path.display())]
    WriteOutput {
        /// The file or directory being written.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// Drawing the sweep plot failed.
    #[error("cannot draw the sweep plot: {0}")]
    Plot(String),
    /// `--data-plane` names a store that cannot be used, or the data plane
    /// failed as a whole (not one block: a block's failure is a failed
    /// transfer, and its request recomputes).
    #[error("data plane: {reason}")]
    DataPlane {
        /// What is wrong.
        reason: String,
    },
    /// A `--model` name that is not one of the presets
    /// ([`ModelPreset::ALL`](crate::ModelPreset::ALL)).
    #[error(
        "unknown model `{name}` (expected gpt-oss-120b, gpt-oss-20b, gemma-3-27b, llama-3.1-8b \
         or llama-4-scout, or describe its layers with --groups)"
    )]
    UnknownModel {
        /// The name given.
        name: String,
    },
    /// A `--groups` description of a model's layers that does not parse or
    /// describes no model ([`KvModel::parse_layers`](crate::KvModel::parse_layers)).
    #[error(
        "invalid --groups `{spec}`: {reason} (expected comma-separated full:LAYERS, \
         sliding_window:WINDOW:LAYERS, chunked_local:CHUNK:LAYERS)"
    )]
    InvalidGroupSpec {
        /// The description as written.
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A byte count (`--capacity-bytes`, `--kv-bytes-per-token-layer`)
    /// that is 0, not a finite whole number, or too large.
    #[error("{flag} `{text}` {reason}")]
    InvalidBytes {
        /// The flag.
        flag: &'static str,
        /// The value as written.
        text: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// KV memory smaller than one block of the model.
    #[error(
        "--capacity-bytes {capacity_bytes} holds no block: one block of this model is \
         {block_bytes} bytes (block size x layers per group x bytes per token per layer)"
    )]
    CapacityBelowBlock {
        /// The memory given, in bytes.
        capacity_bytes: u64,
        /// Bytes of one block.
        block_bytes: u64,
    },
    /// Two flags that exclude each other.
    #[error("{flag} cannot be combined with {other}: {reason}")]
    ConflictingFlags {
        /// The first flag.
        flag: &'static str,
        /// The flag it excludes.
        other: &'static str,
        /// Why.
        reason: &'static str,
    },
    /// A flag given without the flag it needs.
    #[error("{flag} needs {needs}")]
    MissingFlag {
        /// The flag given.
        flag: &'static str,
        /// What it needs.
        needs: &'static str,
    },
    /// KV cache groups the sequence layer refuses (a window or chunk that
    /// is not a multiple of the block size, too many groups).
    #[error("KV cache groups: {0}")]
    Groups(#[from] kvbm_sequence::GroupError),
    /// The block layer refused an operation the replay relies on; this is a
    /// bug in the simulator or in kvbm-blocks.
    #[error("block manager error: {0}")]
    Blocks(#[from] BlockError),
    /// The sequence layer refused a prompt the replay hashes (a block size
    /// of 0, which validation refuses first); a bug in the simulator.
    #[error("sequence error: {0}")]
    Sequence(#[from] kvbm_sequence::SequenceError),
}
