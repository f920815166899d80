//! Listing a namespace's keys: `SCAN` on every master the cluster reports,
//! bounded by the call's time budget.

use std::time::{Duration, Instant};

use kvbm_store::StoreError;
use redis::{Connection, cmd};

use crate::config::Namespace;
use crate::error::from_redis;

/// Keys asked for per `SCAN` round trip.
const SCAN_COUNT: usize = 1000;

/// The time limits of a listing.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub(crate) connection: Duration,
    pub(crate) response: Duration,
    pub(crate) call: Duration,
}

/// Every block key under `namespace` on every master, as hash values.
pub(crate) fn keys(
    nodes: &[String],
    namespace: &Namespace,
    limits: Limits,
) -> Result<Vec<u128>, StoreError> {
    let started = Instant::now();
    let masters = masters(nodes, limits)?;
    let pattern = format!("{}:kv:*", namespace.as_str());
    let prefix = format!("{}:kv:", namespace.as_str());
    let mut keys = Vec::new();
    for master in masters {
        let mut connection = connect(&format!("redis://{master}"), limits)?;
        let mut cursor: u64 = 0;
        loop {
            if started.elapsed() >= limits.call {
                return Err(StoreError::Timeout(limits.call));
            }
            let (next, batch): (u64, Vec<String>) = cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(SCAN_COUNT)
                .query(&mut connection)
                .map_err(|err| from_redis(&err, limits.response))?;
            keys.extend(
                batch
                    .iter()
                    .filter_map(|key| key.strip_prefix(&prefix))
                    .filter_map(|hex| u128::from_str_radix(hex, 16).ok()),
            );
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    Ok(keys)
}

/// The masters' `host:port`, from the first node that answers
/// `CLUSTER NODES` (masters marked failed are left out).
fn masters(nodes: &[String], limits: Limits) -> Result<Vec<String>, StoreError> {
    let mut failures = Vec::new();
    for node in nodes {
        let listing = connect(node, limits).and_then(|mut connection| {
            cmd("CLUSTER")
                .arg("NODES")
                .query::<String>(&mut connection)
                .map_err(|err| from_redis(&err, limits.response))
        });
        match listing {
            Ok(listing) => return Ok(parse_masters(&listing)),
            Err(err) => failures.push(format!("{node}: {err}")),
        }
    }
    Err(StoreError::Remote(format!(
        "no node listed the cluster ({})",
        failures.join("; ")
    )))
}

/// `host:port` of each healthy master in a `CLUSTER NODES` reply.
pub(crate) fn parse_masters(listing: &str) -> Vec<String> {
    listing
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_id, address, flags) = (fields.next()?, fields.next()?, fields.next()?);
            let flags: Vec<&str> = flags.split(',').collect();
            let healthy = flags.contains(&"master") && !flags.iter().any(|f| f.starts_with("fail"));
            // `ip:port@cport[,hostname]`
            let address = address.split(['@', ',']).next()?;
            healthy.then(|| address.to_owned())
        })
        .collect()
}

fn connect(node: &str, limits: Limits) -> Result<Connection, StoreError> {
    let client =
        redis::Client::open(node).map_err(|err| StoreError::Config(format!("{node}: {err}")))?;
    let connection = client
        .get_connection_with_timeout(limits.connection)
        .and_then(|connection| {
            connection.set_read_timeout(Some(limits.response))?;
            connection.set_write_timeout(Some(limits.response))?;
            Ok(connection)
        })
        .map_err(|err| from_redis(&err, limits.connection))?;
    Ok(connection)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masters_are_read_from_cluster_nodes() {
        let listing = "\
a1 127.0.0.1:7101@17101 myself,master - 0 0 1 connected 0-5460
b2 127.0.0.1:7102@17102 master - 0 0 2 connected 5461-10922
c3 127.0.0.1:7103@17103,host-c master,fail - 0 0 3 connected 10923-16383
d4 127.0.0.1:7104@17104 slave a1 0 0 1 connected
";
        assert_eq!(parse_masters(listing), ["127.0.0.1:7101", "127.0.0.1:7102"]);
        assert!(parse_masters("garbage\n\n").is_empty());
    }
}
