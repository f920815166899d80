//! [`RedisConfig`] and [`Namespace`]: which cluster, under which keys, with
//! what bounds on connections and time.

use std::fmt;
use std::time::Duration;

use kvbm_store::StoreError;

/// The deployment (or model) a store's keys belong to: every key is
/// `{namespace}:kv:{32 hex digits of the block's hash}`, so two deployments
/// that share a cluster never read each other's blocks.
///
/// A namespace is 1 to [`Namespace::MAX_BYTES`] bytes with no control
/// characters and no `{` or `}`: Redis Cluster hashes only the part of a
/// key between braces when there is one (a *hash tag*), which would put
/// every block of the deployment on one master.
///
/// ```
/// use kvbm_store_redis::Namespace;
///
/// let ns = Namespace::new("llama-3-70b/prod")?;
/// assert_eq!(
///     ns.redis_key(0xfeed),
///     "llama-3-70b/prod:kv:0000000000000000000000000000feed",
/// );
/// assert!(Namespace::new("").is_err());
/// assert!(Namespace::new("{pinned}").is_err());
/// # Ok::<(), kvbm_store::StoreError>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Namespace(String);

impl Namespace {
    /// The longest namespace, in bytes.
    pub const MAX_BYTES: usize = 128;

    /// A namespace, validated.
    ///
    /// # Errors
    ///
    /// [`StoreError::Config`] for an empty name, one longer than
    /// [`MAX_BYTES`](Self::MAX_BYTES), or one holding a control character
    /// or a brace.
    pub fn new(name: impl Into<String>) -> Result<Self, StoreError> {
        let name = name.into();
        let refuse = |why: &str| Err(StoreError::Config(format!("namespace {name:?}: {why}")));
        if name.is_empty() {
            return refuse("empty");
        }
        if name.len() > Self::MAX_BYTES {
            return refuse(&format!("longer than {} bytes", Self::MAX_BYTES));
        }
        if name.chars().any(char::is_control) {
            return refuse("holds a control character");
        }
        if name.contains(['{', '}']) {
            return refuse("holds a brace (a hash tag would put every block on one master)");
        }
        Ok(Self(name))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The Redis key of the block `key` (its hash value).
    pub fn redis_key(&self, key: u128) -> String {
        format!("{}:kv:{key:032x}", self.0)
    }
}

impl fmt::Debug for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Namespace").field(&self.0).finish()
    }
}

impl fmt::Display for Namespace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How to reach a Redis Cluster and how to use it: built with
/// [`RedisConfig::new`], whose defaults the public fields then adjust.
///
/// Every call is bounded: a connection attempt by
/// [`connection_timeout`](Self::connection_timeout), each reply by
/// [`response_timeout`](Self::response_timeout), and a whole batch (waiting
/// for a pooled connection, and the per-key retry of a batch a failed node
/// broke) by [`call_timeout`](Self::call_timeout).
///
/// ```
/// use std::time::Duration;
/// use kvbm_store_redis::RedisConfig;
///
/// let mut config = RedisConfig::new(
///     ["redis://10.0.0.1:6379", "redis://10.0.0.2:6379"],
///     "llama-3-70b/prod",
///     64 * 1024, // bytes per block
///     100_000,   // blocks this store may put
/// );
/// config.pool_size = 4;
/// config.response_timeout = Duration::from_millis(250);
/// config.validate()?;
///
/// config.pool_size = 0;
/// assert!(config.validate().is_err());
/// # Ok::<(), kvbm_store::StoreError>(())
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct RedisConfig {
    /// Some of the cluster's nodes as `redis://host:port` URLs; the rest
    /// are discovered from them.
    pub nodes: Vec<String>,
    /// The deployment or model the blocks belong to (see [`Namespace`]).
    pub namespace: String,
    /// Every block's size in bytes.
    pub block_bytes: usize,
    /// The blocks this store may hold at once: its
    /// [`capacity`](kvbm_store::BlockStore::capacity), counted over its own
    /// puts and removes.
    pub capacity_blocks: usize,
    /// Connections to the cluster at most (each a connection to every
    /// master); callers past it wait, up to
    /// [`call_timeout`](Self::call_timeout). Default 8.
    pub pool_size: usize,
    /// The longest wait for a TCP connection to a node. Default 1 s.
    pub connection_timeout: Duration,
    /// The longest wait for each reply (and each write). Default 1 s.
    pub response_timeout: Duration,
    /// The longest wait for a pooled connection, and the budget of a
    /// batch's per-key retry after a node failed it. Default 5 s.
    pub call_timeout: Duration,
}

impl RedisConfig {
    /// The default pool size.
    pub const DEFAULT_POOL_SIZE: usize = 8;
    /// The most connections a pool may hold.
    pub const MAX_POOL_SIZE: usize = 1024;

    /// A configuration with the default pool and timeouts.
    pub fn new<N: Into<String>>(
        nodes: impl IntoIterator<Item = N>,
        namespace: impl Into<String>,
        block_bytes: usize,
        capacity_blocks: usize,
    ) -> Self {
        Self {
            nodes: nodes.into_iter().map(Into::into).collect(),
            namespace: namespace.into(),
            block_bytes,
            capacity_blocks,
            pool_size: Self::DEFAULT_POOL_SIZE,
            connection_timeout: Duration::from_secs(1),
            response_timeout: Duration::from_secs(1),
            call_timeout: Duration::from_secs(5),
        }
    }

    /// Checks everything that can be checked without the network.
    ///
    /// # Errors
    ///
    /// [`StoreError::Config`] for no nodes, a node that is not a Redis URL,
    /// an invalid [`Namespace`], a block size or capacity of 0, a pool size
    /// of 0 or past [`MAX_POOL_SIZE`](Self::MAX_POOL_SIZE), or a zero
    /// timeout.
    pub fn validate(&self) -> Result<(), StoreError> {
        self.namespace().map(drop)
    }

    /// The validated namespace.
    pub(crate) fn namespace(&self) -> Result<Namespace, StoreError> {
        let refuse = |why: String| Err(StoreError::Config(why));
        if self.nodes.is_empty() {
            return refuse("no cluster nodes given".to_owned());
        }
        for node in &self.nodes {
            if let Err(err) = redis::IntoConnectionInfo::into_connection_info(node.as_str()) {
                return refuse(format!("node {node:?} is not a redis:// URL: {err}"));
            }
        }
        if self.block_bytes == 0 {
            return refuse("a block size of 0 bytes".to_owned());
        }
        if self.capacity_blocks == 0 {
            return refuse("a capacity of 0 blocks".to_owned());
        }
        if self.pool_size == 0 || self.pool_size > Self::MAX_POOL_SIZE {
            return refuse(format!(
                "a pool of {} connections (1 to {})",
                self.pool_size,
                Self::MAX_POOL_SIZE
            ));
        }
        for (name, value) in [
            ("connection_timeout", self.connection_timeout),
            ("response_timeout", self.response_timeout),
            ("call_timeout", self.call_timeout),
        ] {
            if value.is_zero() {
                return refuse(format!("{name} of 0"));
            }
        }
        Namespace::new(self.namespace.as_str())
    }
}

#[cfg(test)]
mod tests;
