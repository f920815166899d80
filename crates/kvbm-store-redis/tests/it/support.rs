//! What the tests need from outside: the shared cluster `cargo xtask test`
//! starts (`KVBM_REDIS_CLUSTER`), private servers and clusters this process
//! spawns from `redis-server` (killed when dropped), and raw connections to
//! look behind the store's back.
//!
//! Outside CI, a test whose server is missing prints a loud `SKIPPED` line
//! and passes; in CI (`CI` set) it fails: CI must start what tests need.

use std::io::Write;
use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kvbm_store::{BlockRef, BlockStore, Checksum, fake_kv};
use kvbm_store_redis::RedisConfig;
use redis::{Connection, cmd};
use tempfile::TempDir;

/// The variable `cargo xtask test` sets: the shared cluster's nodes as
/// comma-separated `redis://` URLs.
pub(crate) const CLUSTER_ENV: &str = "KVBM_REDIS_CLUSTER";

/// The longest any wait on a server here may take.
const STARTUP: Duration = Duration::from_secs(15);

/// Fails the test in CI, skips it loudly elsewhere.
fn skip(test: &str, why: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("{test}: {why}; CI must start the Redis Cluster (`cargo xtask test` does)");
    }
    // Straight to the process's stderr: the test harness captures
    // `eprintln!` of passing tests, and a skip must not pass silently.
    let _ = writeln!(
        std::io::stderr(),
        "\n*** SKIPPED {test}: {why} (run `cargo xtask test`, or install redis-server) ***"
    );
}

/// The shared cluster's nodes, or `None` (after a loud skip) when there is
/// none outside CI.
pub(crate) fn shared_cluster(test: &str) -> Option<Vec<String>> {
    match std::env::var(CLUSTER_ENV) {
        Ok(nodes) if !nodes.trim().is_empty() => Some(
            nodes
                .split(',')
                .map(|node| node.trim().to_owned())
                .collect(),
        ),
        _ => {
            skip(test, &format!("{CLUSTER_ENV} is not set"));
            None
        }
    }
}

/// Whether `redis-server` can be spawned (after a loud skip if not, outside
/// CI).
pub(crate) fn have_redis_server(test: &str) -> bool {
    let found = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success());
    if !found {
        skip(test, "redis-server is not installed");
    }
    found
}

/// A namespace no other test or earlier run uses.
pub(crate) fn unique_namespace(test: &str) -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_nanos());
    format!(
        "test/{test}/{}-{nanos}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A config for tests: short timeouts, so a failure shows quickly.
pub(crate) fn config(nodes: &[String], namespace: &str, block_bytes: usize) -> RedisConfig {
    let mut config = RedisConfig::new(nodes.iter().cloned(), namespace, block_bytes, 10_000);
    config.pool_size = 4;
    config.connection_timeout = Duration::from_millis(500);
    config.response_timeout = Duration::from_millis(500);
    config.call_timeout = Duration::from_secs(3);
    config
}

/// The fake engine's bytes of block `key`.
pub(crate) fn kv(key: u128, block_bytes: usize) -> Vec<u8> {
    let mut bytes = vec![0; block_bytes];
    fake_kv(key, &mut bytes);
    bytes
}

/// A put of `bytes` as the block `key`.
pub(crate) fn block(key: u128, bytes: &[u8]) -> BlockRef<'_> {
    BlockRef {
        key,
        lineage: kvbm_store::Lineage::ROOT,
        checksum: Checksum::of(key, bytes),
        bytes,
    }
}

/// Keys spread over the whole hash space.
/// The fake KV of every key of `keys`, each `block_bytes` long.
pub(crate) fn kvs(keys: &[u128], block_bytes: usize) -> Vec<Vec<u8>> {
    keys.iter().map(|&key| kv(key, block_bytes)).collect()
}

/// Puts of `blocks`, each the block of the key beside it.
pub(crate) fn blocks_of<'a>(keys: &[u128], blocks: &'a [Vec<u8>]) -> Vec<BlockRef<'a>> {
    keys.iter().zip(blocks).map(|(&k, b)| block(k, b)).collect()
}

/// Puts the fake KV of every key of `keys` (each `block_bytes` long) and
/// checks every put succeeded; the blocks' bytes, in order.
pub(crate) fn put_all(store: &dyn BlockStore, keys: &[u128], block_bytes: usize) -> Vec<Vec<u8>> {
    let blocks = kvs(keys, block_bytes);
    for result in store.put(&blocks_of(keys, &blocks)) {
        result.unwrap();
    }
    blocks
}

pub(crate) fn keys(seed: u128, count: usize) -> Vec<u128> {
    (0..count as u128)
        .map(|i| (seed << 64 | i).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835))
        .collect()
}

/// A plain connection to one node.
pub(crate) fn raw(node: &str) -> Connection {
    let client = redis::Client::open(node).expect("a redis:// URL");
    let connection = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .unwrap_or_else(|err| panic!("connecting to {node}: {err}"));
    connection
        .set_read_timeout(Some(Duration::from_secs(2)))
        .expect("a timeout");
    connection
}

/// The keys of `namespace` that one node holds.
pub(crate) fn keys_on(node: &str, namespace: &str) -> Vec<String> {
    cmd("KEYS")
        .arg(format!("{namespace}:kv:*"))
        .query(&mut raw(node))
        .unwrap_or_else(|err| panic!("KEYS on {node}: {err}"))
}

/// A loopback port nothing listens on (nor on its cluster bus port,
/// 10000 above), free when this returns.
pub(crate) fn free_port() -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("an ephemeral port");
        let port = listener.local_addr().expect("an address").port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// One `redis-server` process, killed when dropped.
#[derive(Debug)]
pub(crate) struct Server {
    pub(crate) port: u16,
    child: Option<Child>,
}

impl Server {
    /// A server on a free port with its files in `dir`, answering `PING`.
    pub(crate) fn spawn(dir: &Path, cluster: bool) -> Self {
        let port = free_port();
        let mut command = Command::new("redis-server");
        command
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(dir)
            .arg("--logfile")
            .arg(dir.join(format!("redis-{port}.log")))
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if cluster {
            command
                .args(["--cluster-enabled", "yes"])
                .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
                .args(["--cluster-node-timeout", "1000"])
                .args(["--cluster-require-full-coverage", "no"]);
        }
        let child = command.spawn().expect("spawning redis-server");
        let server = Self {
            port,
            child: Some(child),
        };
        wait_until(&format!("redis-server on {port} answers"), || {
            redis::Client::open(server.url())
                .and_then(|client| client.get_connection_with_timeout(Duration::from_millis(200)))
                .and_then(|mut connection| cmd("PING").query::<String>(&mut connection))
                .is_ok()
        });
        server
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills it now (SIGKILL: no goodbye to the cluster) and reaps it.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A private cluster of masters on free ports, no replicas, every process
/// killed and its directory removed when dropped.
#[derive(Debug)]
pub(crate) struct Cluster {
    pub(crate) servers: Vec<Server>,
    _dir: TempDir,
}

impl Cluster {
    /// `masters` servers, the 16384 slots split evenly, `cluster_state:ok`
    /// on every node (the way `redis-cli --cluster create` builds one:
    /// slots, config epochs, then `CLUSTER MEET`).
    pub(crate) fn start(masters: usize) -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let servers: Vec<Server> = (0..masters)
            .map(|_| Server::spawn(dir.path(), true))
            .collect();
        let cluster = Self { servers, _dir: dir };
        let per = 16_384 / masters;
        for (i, server) in cluster.servers.iter().enumerate() {
            let first = i * per;
            let last = if i + 1 == masters {
                16_383
            } else {
                first + per - 1
            };
            let mut connection = raw(&server.url());
            let () = cmd("CLUSTER")
                .arg("ADDSLOTSRANGE")
                .arg(first)
                .arg(last)
                .query(&mut connection)
                .expect("CLUSTER ADDSLOTSRANGE");
            let () = cmd("CLUSTER")
                .arg("SET-CONFIG-EPOCH")
                .arg(i + 1)
                .query(&mut connection)
                .expect("CLUSTER SET-CONFIG-EPOCH");
        }
        let mut first = raw(&cluster.servers[0].url());
        for server in &cluster.servers[1..] {
            let () = cmd("CLUSTER")
                .arg("MEET")
                .arg("127.0.0.1")
                .arg(server.port)
                .query(&mut first)
                .expect("CLUSTER MEET");
        }
        for server in &cluster.servers {
            wait_until(&format!("cluster_state:ok on {}", server.port), || {
                cluster_info(&server.url()).contains("cluster_state:ok")
            });
        }
        cluster
    }

    pub(crate) fn urls(&self) -> Vec<String> {
        self.servers.iter().map(Server::url).collect()
    }
}

/// `CLUSTER INFO` of one node, or "" if it does not answer.
pub(crate) fn cluster_info(node: &str) -> String {
    redis::Client::open(node)
        .and_then(|client| client.get_connection_with_timeout(Duration::from_millis(200)))
        .and_then(|mut connection| cmd("CLUSTER").arg("INFO").query::<String>(&mut connection))
        .unwrap_or_default()
}

/// Polls `ready` until it holds, failing the test after [`STARTUP`].
pub(crate) fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + STARTUP;
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(20));
    }
}

/// A loopback address nothing listens on.
pub(crate) fn closed_port() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("an ephemeral port");
    listener.local_addr().expect("an address")
}
