//! A bounded pool of cluster connections: `size` tokens in a bounded
//! channel, each either a connection or an empty place one may be opened in.
//!
//! redis-rs offers pooling through r2d2 (its `r2d2` feature), but r2d2
//! returns a connection to the pool unless the connection itself says it is
//! closed, and a cluster connection whose pipeline failed halfway may still
//! say it is open with replies unread on some node. Here a caller that saw
//! an error [`discard`](Lease::discard)s its connection, and the next
//! caller opens a fresh one (which also rereads the cluster's slot map). It
//! also keeps the dependency tree small: no background threads, no extra
//! crates.

use std::fmt;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender, bounded};
use redis::cluster::{ClusterClient, ClusterConnection};

use kvbm_store::StoreError;

use crate::error::from_redis;

/// At most `size` connections, opened when first needed.
pub(crate) struct Pool {
    client: ClusterClient,
    give: Sender<Option<ClusterConnection>>,
    take: Receiver<Option<ClusterConnection>>,
    size: usize,
    wait: Duration,
    connection_timeout: Duration,
    response_timeout: Duration,
}

impl Pool {
    /// A pool of `size` places; a caller waits at most `wait` for one.
    /// Each connection's writes time out like its reads (redis-rs bounds
    /// only reads by default).
    pub(crate) fn new(
        client: ClusterClient,
        size: usize,
        wait: Duration,
        connection_timeout: Duration,
        response_timeout: Duration,
    ) -> Self {
        let (give, take) = bounded(size);
        for _ in 0..size {
            give.send(None).expect("the pool holds its own receiver");
        }
        Self {
            client,
            give,
            take,
            size,
            wait,
            connection_timeout,
            response_timeout,
        }
    }

    /// A connection, pooled or new.
    ///
    /// # Errors
    ///
    /// [`StoreError::Timeout`] when every connection stays busy for the
    /// pool's wait; a [`from_redis`] error when a new one cannot be opened.
    pub(crate) fn lease(&self) -> Result<Lease<'_>, StoreError> {
        let place = self
            .take
            .recv_timeout(self.wait)
            .map_err(|_| StoreError::Timeout(self.wait))?;
        let connection = match place {
            Some(connection) => connection,
            None => match self.client.get_connection().and_then(|connection| {
                connection.set_write_timeout(Some(self.response_timeout))?;
                Ok(connection)
            }) {
                Ok(connection) => connection,
                Err(err) => {
                    self.put_back(None);
                    return Err(from_redis(&err, self.connection_timeout));
                }
            },
        };
        Ok(Lease {
            pool: self,
            connection: Some(connection),
            keep: true,
        })
    }

    fn put_back(&self, place: Option<ClusterConnection>) {
        // Never blocks and never fails: there are `size` places, and this
        // one was taken out.
        let _ = self.give.try_send(place);
    }
}

impl fmt::Debug for Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Pool")
            .field("size", &self.size)
            .field("idle", &self.take.len())
            .field("wait", &self.wait)
            .finish_non_exhaustive()
    }
}

/// A connection out of the pool; back in when dropped, unless discarded.
pub(crate) struct Lease<'a> {
    pool: &'a Pool,
    connection: Option<ClusterConnection>,
    keep: bool,
}

impl Lease<'_> {
    pub(crate) fn connection(&mut self) -> &mut ClusterConnection {
        self.connection
            .as_mut()
            .expect("a lease holds its connection until dropped")
    }

    /// Closes the connection when the lease ends instead of pooling it.
    pub(crate) fn discard(&mut self) {
        self.keep = false;
    }
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        let connection = self.connection.take().filter(|_| self.keep);
        self.pool.put_back(connection);
    }
}

impl fmt::Debug for Lease<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease").field("keep", &self.keep).finish()
    }
}
