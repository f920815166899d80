//! The Redis Cluster the `test` gate starts for kvbm-store-redis's tests:
//! three masters on loopback (ports 7101-7103 when free), their files in
//! `target/redis-cluster/`, shut down when the guard drops, whether the
//! tests passed or not. `cargo xtask store-limits` may start one master
//! instead, pinned to a CPU ([`start_with`]).
//!
//! In CI (`CI` set) a missing `redis-server` is installed with apt-get
//! (Debian's `redis-server` package, which brings `redis-cli`); the
//! package's own service, if its install starts one, listens on 6379 and is
//! left alone. Outside CI a missing server is a warning, and the tests that
//! need it skip loudly.
//!
//! kvbm-store-redis's `tests/it/support.rs` spawns its private clusters the
//! same way (same server flags), with `CLUSTER MEET` instead of
//! `redis-cli --cluster create`.

use std::env;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use xshell::{Shell, cmd};

use crate::project_root;

/// The variable the tests read the cluster's nodes from.
pub(crate) const CLUSTER_ENV: &str = "KVBM_REDIS_CLUSTER";

/// The ports tried first, one per master.
const PORTS: [u16; 3] = [7101, 7102, 7103];

/// The longest wait for a server to answer, or the cluster to agree.
const STARTUP: Duration = Duration::from_secs(30);

/// A running cluster; shut down when dropped.
#[derive(Debug)]
pub(crate) struct RedisCluster {
    servers: Vec<(u16, Child)>,
    dir: PathBuf,
}

impl RedisCluster {
    /// The value of [`CLUSTER_ENV`]: the masters as `redis://` URLs.
    pub(crate) fn nodes(&self) -> String {
        self.servers
            .iter()
            .map(|(port, _)| format!("redis://127.0.0.1:{port}"))
            .collect::<Vec<_>>()
            .join(",")
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for (port, child) in &mut self.servers {
            let port = port.to_string();
            let _ = Command::new("redis-cli")
                .args(["-p", &port, "shutdown", "nosave"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            let deadline = Instant::now() + Duration::from_secs(2);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        eprintln!(
            "redis cluster stopped (logs in {})",
            self.dir
                .strip_prefix(project_root())
                .unwrap_or(&self.dir)
                .display()
        );
    }
}

/// How many masters, and the CPUs they may run on.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    /// Masters: [`PORTS`]' three, or one that holds every slot.
    pub(crate) masters: usize,
    /// A `taskset -c` CPU list for the servers, or `None`: any CPU.
    pub(crate) cpus: Option<&'static str>,
}

impl Layout {
    /// The `test` gate's cluster: three masters, on any CPU.
    pub(crate) const TESTS: Self = Self {
        masters: PORTS.len(),
        cpus: None,
    };
}

/// Starts the cluster, installing Redis first in CI; `None` (after a loud
/// warning) outside CI when Redis is not installed.
pub(crate) fn start(sh: &Shell) -> Result<Option<RedisCluster>> {
    start_with(sh, Layout::TESTS)
}

/// [`start`] with `layout`'s masters and CPUs.
pub(crate) fn start_with(sh: &Shell, layout: Layout) -> Result<Option<RedisCluster>> {
    if !(layout.masters == 1 || layout.masters == PORTS.len()) {
        bail!(
            "a cluster of {} masters: 1 or {} here",
            layout.masters,
            PORTS.len()
        );
    }
    let in_ci = env::var_os("CI").is_some();
    if !installed(sh) {
        if !in_ci {
            eprintln!(
                "\nWARNING: redis-server/redis-cli not found: kvbm-store-redis's cluster tests \
                 will be SKIPPED (apt-get install redis-server; CI installs it itself)\n"
            );
            return Ok(None);
        }
        install(sh)?;
    }
    let dir = project_root().join("target/redis-cluster");
    if dir.exists() {
        sh.remove_path(&dir)?;
    }
    sh.create_dir(&dir)?;

    let mut cluster = RedisCluster {
        servers: Vec::new(),
        dir: dir.clone(),
    };
    for preferred in PORTS.into_iter().take(layout.masters) {
        let port = free_port(preferred)?;
        let child = spawn(&dir, port, layout.cpus)?;
        cluster.servers.push((port, child));
        wait(&format!("redis-server on port {port}"), || {
            let port = port.to_string();
            cmd!(sh, "redis-cli -p {port} ping")
                .quiet()
                .ignore_stderr()
                .read()
                .is_ok_and(|out| out.trim() == "PONG")
        })?;
    }
    let addresses: Vec<String> = cluster
        .servers
        .iter()
        .map(|(port, _)| format!("127.0.0.1:{port}"))
        .collect();
    // `redis-cli --cluster create` wants three masters at least: one is
    // given every slot by hand.
    let created = match &cluster.servers[..] {
        [(port, _)] => {
            let port = port.to_string();
            cmd!(sh, "redis-cli -p {port} cluster addslotsrange 0 16383")
        }
        _ => cmd!(
            sh,
            "redis-cli --cluster create {addresses...} --cluster-replicas 0 --cluster-yes"
        ),
    }
    .quiet()
    .ignore_stderr()
    .ignore_status()
    .output()?;
    if !created.status.success() {
        bail!(
            "creating the cluster failed:\n{}",
            String::from_utf8_lossy(&created.stdout)
        );
    }
    for (port, _) in &cluster.servers {
        let port = port.to_string();
        wait(&format!("cluster_state:ok on port {port}"), || {
            cmd!(sh, "redis-cli -p {port} cluster info")
                .quiet()
                .ignore_stderr()
                .read()
                .is_ok_and(|info| info.contains("cluster_state:ok"))
        })?;
    }
    eprintln!("redis cluster up: {}", cluster.nodes());
    Ok(Some(cluster))
}

fn installed(sh: &Shell) -> bool {
    ["redis-server", "redis-cli"].iter().all(|tool| {
        cmd!(sh, "{tool} --version")
            .quiet()
            .ignore_stdout()
            .ignore_stderr()
            .run()
            .is_ok()
    })
}

/// `apt-get install redis-server`, after `apt-get update` only if the
/// first try fails (a fresh machine's package lists may be stale).
fn install(sh: &Shell) -> Result<()> {
    eprintln!("installing redis-server (Debian package) for kvbm-store-redis's tests");
    let install = || {
        cmd!(
            sh,
            "apt-get install -y --no-install-recommends redis-server"
        )
        .env("DEBIAN_FRONTEND", "noninteractive")
        .run()
    };
    if install().is_err() {
        cmd!(sh, "apt-get update")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .run()?;
        install().context("apt-get install redis-server")?;
    }
    if !installed(sh) {
        bail!("redis-server installed, but redis-server/redis-cli still not found");
    }
    Ok(())
}

/// `preferred` if it and its cluster bus port (10000 above) are free, else
/// another free pair.
fn free_port(preferred: u16) -> Result<u16> {
    let free = |port: u16| {
        TcpListener::bind(("127.0.0.1", port)).is_ok()
            && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok()
    };
    if free(preferred) {
        return Ok(preferred);
    }
    for _ in 0..100 {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        if port < 55_000 && free(port) {
            return Ok(port);
        }
    }
    bail!("no free loopback port pair for a redis cluster node")
}

/// One cluster-enabled master, in the foreground (its own child process),
/// on `cpus` (a `taskset -c` list, which then execs the server) if given.
fn spawn(dir: &Path, port: u16, cpus: Option<&str>) -> Result<Child> {
    let mut server = match cpus {
        Some(cpus) => {
            let mut taskset = Command::new("taskset");
            taskset.args(["-c", cpus, "redis-server"]);
            taskset
        }
        None => Command::new("redis-server"),
    };
    server
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .arg("--dir")
        .arg(dir)
        .arg("--logfile")
        .arg(dir.join(format!("redis-{port}.log")))
        .args(["--cluster-enabled", "yes"])
        .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
        .args(["--cluster-require-full-coverage", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("spawning redis-server on port {port}"))
}

/// Polls `ready` until it holds, for at most [`STARTUP`].
fn wait(what: &str, mut ready: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + STARTUP;
    while !ready() {
        if Instant::now() >= deadline {
            bail!("timed out after {STARTUP:?} waiting for {what}");
        }
        thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}
