//! [`RedisClusterStore`]: a [`BlockStore`] on a Redis Cluster.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kvbm_store::{BlockRef, BlockStore, Checksum, StoreError};
use redis::cluster::{ClusterClientBuilder, cluster_pipe};
use redis::{Cmd, Value, cmd};
use tracing::{debug, instrument, trace, warn};

use crate::config::{Namespace, RedisConfig};
use crate::error::{again, from_redis};
use crate::pool::Pool;
use crate::value::{self, HEADER_BYTES};

/// Retries redis-rs may make of one command (a `MOVED` redirect after a
/// resharding, a reconnect): one, so a dead node costs a bounded time.
const RETRIES: u32 = 1;
/// redis-rs's wait between retries, in milliseconds (its defaults start at
/// 1.28 s, longer than a whole call may take here).
const RETRY_WAIT_MS: (u64, u64) = (10, 100);

/// A [`BlockStore`] on a Redis Cluster: each block one string value under
/// its [`Namespace`]'s key, a 32-byte header (the key and the caller's
/// [`Checksum`]) before its bytes.
///
/// - **Batches** go out as one cluster pipeline, which redis-rs splits into
///   one pipeline per master. When a node fails it (dead, timed out,
///   refusing a write), the store retries that batch key by key on a fresh
///   connection, so each block gets its own result: blocks on the surviving
///   masters succeed, blocks on the dead one fail with
///   [`StoreError::Remote`] or [`StoreError::Timeout`], and the request
///   that needed them recomputes. While a master is down, every batch that
///   touches it pays this per-key retry, bounded by the config's
///   `call_timeout`.
/// - **Puts** are `SET key value NX`: a block already stored is never
///   overwritten. Where `NX` did not set, the store reads the stored header
///   (`GETRANGE`, 32 bytes) and compares checksums: the same is `Ok`,
///   another is [`StoreError::Collision`]. (A Lua script could do both in
///   one round trip, but would copy every block through Lua's strings; a
///   re-put is the rare case.)
/// - **Gets** check the header's key and recompute the checksum over the
///   bytes read, so bytes that changed on the way or at rest are
///   [`StoreError::Corrupt`], never handed out.
/// - **Capacity** is counted over this store's own puts and removes (a
///   block a put created counts, a removed one stops counting), starting
///   from 0 at [`connect`](Self::connect); a put past it is
///   [`StoreError::Full`], unless the block is already stored with the
///   same bytes. Blocks another process (or an earlier run) put under the
///   same namespace are not counted, nor is a put whose node failed after
///   writing it: bound the cluster's memory with Redis's `maxmemory`
///   (`noeviction` makes a full node refuse writes, which fails those
///   puts), and give each store its own share of it.
/// - A put over a value that is not a block of this key (see above) is
///   [`StoreError::Corrupt`] and leaves it: [`remove`](BlockStore::remove)
///   it first. [`contains`](BlockStore::contains) answers `false` for a
///   key it cannot reach.
///
/// For the store to keep serving the surviving masters once the cluster
/// has marked a dead one failed, run the cluster with
/// `cluster-require-full-coverage no`; with the default `yes`, every node
/// refuses commands until the failed master is back or replaced.
#[derive(Debug)]
pub struct RedisClusterStore {
    namespace: Namespace,
    nodes: Vec<String>,
    block_bytes: usize,
    capacity: usize,
    /// Blocks this store put and did not remove.
    held: AtomicUsize,
    pool: Pool,
    connection_timeout: Duration,
    response_timeout: Duration,
    call_timeout: Duration,
    /// Parts a large batch is cut into, each on its own connection.
    parallel: usize,
}

/// Batches carrying at least this many bytes run in parts in parallel
/// ([`RedisClusterStore::run_parts`]).
const PARALLEL_BYTES: usize = 1 << 20;

/// Parts a large batch is cut into at most.
const MAX_PARTS: usize = 4;

/// What a put does for one block.
#[derive(Clone, Copy, Debug)]
enum Plan {
    /// A place is reserved: `SET NX` it.
    Set,
    /// No place left: only see whether it is already stored.
    Check,
}

impl RedisClusterStore {
    /// Connects to the cluster: checks the configuration, asks the first
    /// node that answers whether it belongs to a healthy cluster, and opens
    /// the pool's first connection (which reads the cluster's slot map).
    ///
    /// # Errors
    ///
    /// - [`StoreError::Config`] for an invalid configuration (see
    ///   [`RedisConfig::validate`]) or a node that is a standalone Redis,
    ///   not a cluster node.
    /// - [`StoreError::Remote`] when no node can be reached (each node's
    ///   failure is in the message) or the cluster reports a state other
    ///   than `ok`; [`StoreError::Timeout`] when every node timed out.
    #[instrument(level = "debug", skip_all, fields(namespace = %config.namespace))]
    pub fn connect(config: RedisConfig) -> Result<Self, StoreError> {
        let namespace = config.namespace()?;
        probe(&config)?;
        let client = ClusterClientBuilder::new(config.nodes.iter().map(String::as_str))
            .connection_timeout(config.connection_timeout)
            .response_timeout(config.response_timeout)
            .retries(RETRIES)
            .min_retry_wait(RETRY_WAIT_MS.0)
            .max_retry_wait(RETRY_WAIT_MS.1)
            .build()
            .map_err(|err| StoreError::Config(format!("cluster client: {err}")))?;
        let pool = Pool::new(
            client,
            config.pool_size,
            config.call_timeout,
            config.connection_timeout,
            config.response_timeout,
        );
        drop(pool.lease()?);
        debug!(nodes = ?config.nodes, "connected to the redis cluster");
        Ok(Self {
            namespace,
            nodes: config.nodes,
            block_bytes: config.block_bytes,
            capacity: config.capacity_blocks,
            held: AtomicUsize::new(0),
            pool,
            connection_timeout: config.connection_timeout,
            response_timeout: config.response_timeout,
            call_timeout: config.call_timeout,
            parallel: config.pool_size.clamp(1, MAX_PARTS),
        })
    }

    /// The namespace the store's keys are under.
    pub fn namespace(&self) -> &Namespace {
        &self.namespace
    }

    /// The nodes it was given.
    pub fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// Takes a place for a new block, if there is one.
    fn reserve(&self) -> bool {
        self.held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held < self.capacity).then_some(held + 1)
            })
            .is_ok()
    }

    /// Gives a place back.
    fn release(&self) {
        let _ = self
            .held
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                held.checked_sub(1)
            });
    }

    fn wrong_size(&self, got: usize) -> StoreError {
        StoreError::WrongSize {
            expected: self.block_bytes,
            got,
        }
    }

    fn header_of(&self, key: u128) -> Cmd {
        cmd("GETRANGE")
            .arg(self.namespace.redis_key(key))
            .arg(0)
            .arg(HEADER_BYTES - 1)
            .clone()
    }

    /// Runs `cmds` as one cluster pipeline; when that fails, each command on
    /// its own, until the call's time is up. One result per command.
    fn run(&self, cmds: Vec<Cmd>) -> Vec<Result<Value, StoreError>> {
        self.run_batch(cmds).0
    }

    /// A batch of `cmds` carrying about `bytes` bytes of blocks, as
    /// [`run_batch`](Self::run_batch) runs it; a large one in parts on
    /// several pooled connections at once.
    ///
    /// A cluster pipeline of the `redis` crate's synchronous client talks to
    /// one master at a time (it writes one node's commands, reads its
    /// replies, then the next's), so one batch never keeps more than one
    /// master busy; parts in parallel keep them all busy, as a client per
    /// master would. Small batches run inline: a thread costs more than
    /// they take.
    fn run_parts(&self, cmds: Vec<Cmd>, bytes: usize) -> (Vec<Result<Value, StoreError>>, bool) {
        let parts = self.parallel.min(cmds.len());
        if bytes < PARALLEL_BYTES || parts < 2 {
            return self.run_batch(cmds);
        }
        let per_part = cmds.len().div_ceil(parts);
        let mut split: Vec<Vec<Cmd>> = Vec::with_capacity(parts);
        let mut rest = cmds.into_iter();
        loop {
            let part: Vec<Cmd> = rest.by_ref().take(per_part).collect();
            if part.is_empty() {
                break;
            }
            split.push(part);
        }
        let answers: Vec<(Vec<Result<Value, StoreError>>, bool)> = std::thread::scope(|scope| {
            let handles: Vec<_> = split
                .into_iter()
                .map(|part| {
                    let len = part.len();
                    (len, scope.spawn(move || self.run_batch(part)))
                })
                .collect();
            handles
                .into_iter()
                .map(|(len, handle)| {
                    handle.join().unwrap_or_else(|_| {
                        let failed = || Err(StoreError::Remote("a batch's thread panicked".into()));
                        ((0..len).map(|_| failed()).collect(), true)
                    })
                })
                .collect()
        });
        let resent = answers.iter().any(|(_, resent)| *resent);
        (
            answers
                .into_iter()
                .flat_map(|(replies, _)| replies)
                .collect(),
            resent,
        )
    }

    /// [`run`](Self::run), and whether the commands were sent twice (the
    /// pipeline failed, some of it may have been applied).
    fn run_batch(&self, cmds: Vec<Cmd>) -> (Vec<Result<Value, StoreError>>, bool) {
        if cmds.is_empty() {
            return (Vec::new(), false);
        }
        let started = Instant::now();
        let mut lease = match self.pool.lease() {
            Ok(lease) => lease,
            Err(err) => return (cmds.iter().map(|_| Err(again(&err))).collect(), false),
        };
        let mut pipe = cluster_pipe();
        for command in cmds {
            // Moved, not copied: a command carries a whole block.
            pipe.add_command(command);
        }
        let cmds = pipe.cmd_iter().collect::<Vec<&Cmd>>();
        match pipe.query::<Vec<Value>>(lease.connection()) {
            Ok(values) if values.len() == cmds.len() => {
                let replies: Vec<_> = values.into_iter().map(reply).collect();
                if replies.iter().any(Result::is_err) {
                    // A node refused some commands (out of memory, a
                    // redirect): its view of the cluster may be stale.
                    lease.discard();
                }
                return (replies, false);
            }
            Ok(values) => warn!(
                sent = cmds.len(),
                got = values.len(),
                "pipeline answered the wrong number of replies"
            ),
            Err(err) => {
                debug!(%err, commands = cmds.len(), "pipeline failed, retrying each command")
            }
        }
        // Replies may be left unread on some node: never reuse it.
        lease.discard();
        drop(lease);

        let mut lease = None;
        let mut failed = false;
        let replies = cmds
            .iter()
            .map(|command| {
                if started.elapsed() >= self.call_timeout {
                    return Err(StoreError::Timeout(self.call_timeout));
                }
                let lease = match &mut lease {
                    Some(lease) => lease,
                    None => lease.insert(self.pool.lease()?),
                };
                match command.query::<Value>(lease.connection()) {
                    Ok(value) => reply(value),
                    Err(err) => {
                        failed = true;
                        trace!(%err, "command failed");
                        Err(from_redis(&err, self.response_timeout))
                    }
                }
            })
            .collect();
        if let (Some(lease), true) = (&mut lease, failed) {
            lease.discard();
        }
        (replies, true)
    }

    /// A put's verdict from the stored header: `Ok` for the same block,
    /// [`StoreError::Collision`] for other bytes, `absent` when nothing is
    /// stored.
    fn compare(
        &self,
        block: &BlockRef<'_>,
        reply: Result<Value, StoreError>,
        absent: impl FnOnce() -> StoreError,
    ) -> Result<(), StoreError> {
        let key = block.key;
        match reply? {
            Value::BulkString(raw) if raw.is_empty() => Err(absent()),
            Value::BulkString(raw) => match value::header(&raw) {
                Ok(header) if header.key != key => Err(StoreError::Corrupt {
                    key,
                    reason: format!("value is the block {:032x}", header.key),
                }),
                Ok(header) if header.checksum == block.checksum => Ok(()),
                Ok(_) => Err(StoreError::Collision { key }),
                Err(reason) => Err(StoreError::Corrupt { key, reason }),
            },
            other => Err(unexpected("GETRANGE", &other)),
        }
    }
}

/// A reply, or the error a node answered instead.
fn reply(value: Value) -> Result<Value, StoreError> {
    match value {
        Value::ServerError(err) => Err(StoreError::Remote(err.to_string())),
        value => Ok(value),
    }
}

fn unexpected(command: &str, value: &Value) -> StoreError {
    StoreError::Remote(format!("unexpected reply to {command}: {value:?}"))
}

/// Asks the nodes in order, up to the first that answers, whether it is a
/// node of a cluster in state `ok`.
fn probe(config: &RedisConfig) -> Result<(), StoreError> {
    let mut failures = Vec::new();
    let mut timed_out = 0;
    for node in &config.nodes {
        match probe_node(node, config) {
            Ok((info, state)) => {
                if !info.lines().any(|line| line.trim() == "cluster_enabled:1") {
                    return Err(StoreError::Config(format!(
                        "{node} is a standalone Redis, not a cluster node (cluster_enabled:0): \
                         the remote tier needs a Redis Cluster"
                    )));
                }
                let state = state
                    .unwrap_or_default()
                    .lines()
                    .find_map(|line| line.trim().strip_prefix("cluster_state:"))
                    .unwrap_or("unknown")
                    .to_owned();
                if state != "ok" {
                    return Err(StoreError::Remote(format!(
                        "the cluster at {node} reports cluster_state:{state}"
                    )));
                }
                return Ok(());
            }
            Err(err) => {
                timed_out += usize::from(err.is_timeout());
                failures.push(format!("{node}: {err}"));
            }
        }
    }
    if timed_out == config.nodes.len() {
        return Err(StoreError::Timeout(config.connection_timeout));
    }
    Err(StoreError::Remote(format!(
        "no cluster node answered ({})",
        failures.join("; ")
    )))
}

/// `INFO cluster` of one node, and `CLUSTER INFO` if it is a cluster node.
fn probe_node(node: &str, config: &RedisConfig) -> redis::RedisResult<(String, Option<String>)> {
    let client = redis::Client::open(node)?;
    let mut connection = client.get_connection_with_timeout(config.connection_timeout)?;
    connection.set_read_timeout(Some(config.response_timeout))?;
    connection.set_write_timeout(Some(config.response_timeout))?;
    let info: String = cmd("INFO").arg("cluster").query(&mut connection)?;
    if !info.contains("cluster_enabled:1") {
        return Ok((info, None));
    }
    let state: String = cmd("CLUSTER").arg("INFO").query(&mut connection)?;
    Ok((info, Some(state)))
}

impl BlockStore for RedisClusterStore {
    fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    fn capacity(&self) -> usize {
        self.capacity
    }

    fn len(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    #[instrument(level = "debug", skip_all, fields(blocks = blocks.len()))]
    fn put(&self, blocks: &[BlockRef<'_>]) -> Vec<Result<(), StoreError>> {
        let mut results: Vec<Option<Result<(), StoreError>>> = Vec::with_capacity(blocks.len());
        let mut plans = Vec::new();
        let mut cmds = Vec::new();
        for (at, block) in blocks.iter().enumerate() {
            if block.bytes.len() != self.block_bytes {
                results.push(Some(Err(self.wrong_size(block.bytes.len()))));
                continue;
            }
            results.push(None);
            if self.reserve() {
                let redis_key = self.namespace.redis_key(block.key);
                // Header and bytes go straight into the command's buffer,
                // sized for them up front: the block is copied into it
                // once, never again as the buffer grows.
                let data =
                    "SET".len() + redis_key.len() + HEADER_BYTES + block.bytes.len() + "NX".len();
                let mut set = Cmd::with_capacity(4, data);
                set.arg("SET")
                    .arg(redis_key)
                    .arg(value::Encoded::new(block.key, block.checksum, block.bytes))
                    .arg("NX");
                cmds.push(set);
                plans.push((at, Plan::Set));
            } else {
                cmds.push(self.header_of(block.key));
                plans.push((at, Plan::Check));
            }
        }

        // Where `NX` did not set: the block's index, and whether it holds a
        // place (the batch was sent twice, so the first send may have
        // stored it: counted as ours, erring towards `Full`).
        let mut stored_before = Vec::new();
        let bytes = blocks.len().saturating_mul(self.block_bytes);
        let (replies, resent) = self.run_parts(cmds, bytes);
        for ((at, plan), reply) in plans.into_iter().zip(replies) {
            let result = match (plan, reply) {
                (Plan::Set, Ok(Value::Okay)) => Ok(()),
                (Plan::Set, Ok(Value::Nil)) => {
                    if !resent {
                        self.release();
                    }
                    stored_before.push((at, resent));
                    continue;
                }
                (Plan::Set, Ok(other)) => {
                    self.release();
                    Err(unexpected("SET", &other))
                }
                (Plan::Set, Err(err)) => {
                    // It may have been written before the node failed: then
                    // it is stored but not counted, an undercount Redis's
                    // own `maxmemory` still bounds.
                    self.release();
                    Err(err)
                }
                (Plan::Check, reply) => self.compare(&blocks[at], reply, || StoreError::Full {
                    capacity: self.capacity,
                }),
            };
            results[at] = Some(result);
        }

        if !stored_before.is_empty() {
            let cmds: Vec<Cmd> = stored_before
                .iter()
                .map(|&(at, _)| self.header_of(blocks[at].key))
                .collect();
            for ((at, holds_place), reply) in stored_before.into_iter().zip(self.run(cmds)) {
                let result = self.compare(&blocks[at], reply, || {
                    StoreError::Remote("the stored block was removed while being put".to_owned())
                });
                if holds_place && result.is_err() {
                    self.release();
                }
                results[at] = Some(result);
            }
        }
        results
            .into_iter()
            .map(|result| result.unwrap_or_else(|| Err(StoreError::Remote("no reply".to_owned()))))
            .collect()
    }

    #[instrument(level = "debug", skip_all, fields(blocks = reads.len()))]
    fn get(&self, reads: &mut [(u128, &mut [u8])]) -> Vec<Result<Checksum, StoreError>> {
        let mut results: Vec<Option<Result<Checksum, StoreError>>> =
            Vec::with_capacity(reads.len());
        let mut asked = Vec::new();
        let mut cmds = Vec::new();
        for (at, (key, into)) in reads.iter().enumerate() {
            if into.len() != self.block_bytes {
                results.push(Some(Err(self.wrong_size(into.len()))));
                continue;
            }
            results.push(None);
            asked.push(at);
            cmds.push(cmd("GET").arg(self.namespace.redis_key(*key)).clone());
        }
        let bytes = cmds.len().saturating_mul(self.block_bytes);
        for (at, reply) in asked.into_iter().zip(self.run_parts(cmds, bytes).0) {
            let (key, into) = &mut reads[at];
            let key = *key;
            results[at] = Some(match reply {
                Ok(Value::Nil) => Err(StoreError::Missing { key }),
                Ok(Value::BulkString(raw)) => value::decode(key, &raw, into),
                Ok(other) => Err(unexpected("GET", &other)),
                Err(err) => Err(err),
            });
        }
        results
            .into_iter()
            .map(|result| result.unwrap_or_else(|| Err(StoreError::Remote("no reply".to_owned()))))
            .collect()
    }

    #[instrument(level = "debug", skip_all, fields(blocks = keys.len()))]
    fn contains(&self, keys: &[u128]) -> Vec<bool> {
        let cmds: Vec<Cmd> = keys
            .iter()
            .map(|&key| cmd("EXISTS").arg(self.namespace.redis_key(key)).clone())
            .collect();
        self.run(cmds)
            .into_iter()
            .map(|reply| matches!(reply, Ok(Value::Int(1))))
            .collect()
    }

    #[instrument(level = "debug", skip_all, fields(blocks = keys.len()))]
    fn remove(&self, keys: &[u128]) -> Vec<Result<bool, StoreError>> {
        let cmds: Vec<Cmd> = keys
            .iter()
            .map(|&key| cmd("DEL").arg(self.namespace.redis_key(key)).clone())
            .collect();
        self.run(cmds)
            .into_iter()
            .map(|reply| match reply {
                Ok(Value::Int(0)) => Ok(false),
                Ok(Value::Int(_)) => {
                    self.release();
                    Ok(true)
                }
                Ok(other) => Err(unexpected("DEL", &other)),
                Err(err) => Err(err),
            })
            .collect()
    }
    /// Every block key under this store's namespace, on every healthy
    /// master (`SCAN`; blocks another process put under the namespace
    /// included), within the call's time budget.
    /// Always: a get checks the value's header and recomputes the
    /// block's checksum.
    fn verifies_reads(&self) -> bool {
        true
    }

    fn keys(&self) -> Result<Vec<u128>, StoreError> {
        crate::scan::keys(
            &self.nodes,
            &self.namespace,
            crate::scan::Limits {
                connection: self.connection_timeout,
                response: self.response_timeout,
                call: self.call_timeout,
            },
        )
    }
}
