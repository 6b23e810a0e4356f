//! One Redis endpoint or a Redis Cluster behind one connection type.
//!
//! Every script call touches the keys of one ledger, which share one hash tag, so in a cluster it
//! goes to the one node owning that slot; the status indexes are single keys.

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;

#[derive(Clone)]
pub enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// Hands out connections; reconnects by itself (a cluster connection is made on first use, so
/// the service starts while the cluster is down).
pub enum Connector {
    Single(ConnectionManager),
    Cluster {
        client: Box<ClusterClient>,
        conn: Arc<Mutex<Option<ClusterConnection>>>,
    },
}

impl Connector {
    /// `timeout`: how long one Redis call may take before the answer is 503 (connecting gets
    /// half of it).
    pub fn new(url: &str, cluster: bool, timeout: Duration) -> Result<Connector, String> {
        let shown = crate::redacted(url);
        let connect = timeout / 2;
        if cluster {
            let client = ClusterClient::builder([url])
                .connection_timeout(connect)
                .response_timeout(timeout)
                .retries(1)
                .build()
                .map_err(|e| format!("--redis {shown}: {e}"))?;
            return Ok(Connector::Cluster {
                client: Box::new(client),
                conn: Arc::new(Mutex::new(None)),
            });
        }
        let client = redis::Client::open(url).map_err(|e| format!("--redis {shown}: {e}"))?;
        let config = redis::aio::ConnectionManagerConfig::new()
            .set_connection_timeout(Some(connect))
            .set_response_timeout(Some(timeout))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_millis(200));
        let conn = ConnectionManager::new_lazy_with_config(client, config)
            .map_err(|e| format!("--redis {shown}: {e}"))?;
        Ok(Connector::Single(conn))
    }

    /// A Redis Cluster: each ledger's keys live in their own hash slot, so no script call may
    /// span two ledgers.
    pub fn is_cluster(&self) -> bool {
        matches!(self, Connector::Cluster { .. })
    }

    pub async fn get(&self) -> redis::RedisResult<Conn> {
        match self {
            Connector::Single(c) => Ok(Conn::Single(c.clone())),
            Connector::Cluster { client, conn } => {
                let mut slot = conn.lock().await;
                if let Some(c) = slot.as_ref() {
                    return Ok(Conn::Cluster(c.clone()));
                }
                let c = client.get_async_connection().await?;
                *slot = Some(c.clone());
                Ok(Conn::Cluster(c))
            }
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(cmd, offset, count),
            Conn::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}
