//! [`Node`]: this machine's pools and volumes, behind one lock.
//!
//! Every method blocks (the store does disk I/O): async callers run them on
//! `tokio::task::spawn_blocking`.
//!
//! Locking: `state` (catalog and pools) is taken for every control operation,
//! so creations, deletions and the uniqueness check of volume names are
//! serialised. `opened` (the volumes the NBD server holds open) is only taken
//! while holding `state` or alone for a lookup, never the other way round.
//!
//! - `pools`: create, delete, list and scan pools; the default pool.
//! - `volumes`: create, delete, grow and list volumes; opening them for NBD.
//! - `snapshots`: list, delete, open, clone and roll back snapshots.

mod pools;
mod snapshots;
mod volumes;

pub use pools::{NewPool, PoolStatus, DEFAULT_POOL_NAME};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use trireme_store::{Pool, Volume};
use trireme_types::{PoolName, VolumeName};

use crate::catalog::Catalog;
use crate::NodeError;

/// Where pool metadata directories live, under the data directory.
pub const POOLS_DIRECTORY: &str = "pools";
const METADATA_FILE: &str = "metadata.redb";

pub struct Node {
    data_dir: PathBuf,
    state: Mutex<NodeState>,
    opened: Mutex<BTreeMap<VolumeName, Arc<Volume>>>,
    stopping: AtomicBool,
    /// Held locked for the node's life: see [`lock_data_dir`].
    _lock: std::fs::File,
}

struct NodeState {
    catalog: Catalog,
    pools: BTreeMap<PoolName, PoolSlot>,
}

enum PoolSlot {
    Online(Arc<Pool>),
    /// The pool is in the catalog but could not be opened; the node runs on
    /// without it and reports why.
    Offline {
        reason: String,
    },
}

impl NodeState {
    fn online_pools(&self) -> impl Iterator<Item = (&PoolName, &Arc<Pool>)> {
        self.pools.iter().filter_map(|(name, slot)| match slot {
            PoolSlot::Online(pool) => Some((name, pool)),
            PoolSlot::Offline { .. } => None,
        })
    }

    fn online_pool(&self, name: &PoolName) -> Result<&Arc<Pool>, NodeError> {
        match self.pools.get(name) {
            None => Err(NodeError::PoolNotFound(name.to_string())),
            Some(PoolSlot::Online(pool)) => Ok(pool),
            Some(PoolSlot::Offline { reason }) => Err(NodeError::PoolOffline {
                pool: name.clone(),
                reason: reason.clone(),
            }),
        }
    }
}

/// The file a node holds locked (`flock`) while it runs, in its data
/// directory.
pub const LOCK_FILE: &str = "node.lock";

/// One node per data directory. Without this, a second process (a restart
/// racing the old one's shutdown, or a second unit) would find each pool
/// locked and mark it offline, and fail later on another file's lock with a
/// less clear error. The kernel drops the lock when the process ends, so a
/// crash leaves nothing to clean up.
fn lock_data_dir(data_dir: &Path) -> Result<std::fs::File, NodeError> {
    let path = data_dir.join(LOCK_FILE);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|error| NodeError::io(format!("open {}", path.display()), error))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => {
            Err(NodeError::DataDirInUse(data_dir.to_path_buf()))
        }
        Err(std::fs::TryLockError::Error(error)) => {
            Err(NodeError::io(format!("lock {}", path.display()), error))
        }
    }
}

impl Node {
    /// Runs `work` on tokio's blocking pool, from async code: the store's
    /// calls wait on the device.
    pub async fn blocking<T: Send + 'static>(
        self: &Arc<Self>,
        work: impl FnOnce(&Node) -> Result<T, NodeError> + Send + 'static,
    ) -> Result<T, NodeError> {
        let node = self.clone();
        tokio::task::spawn_blocking(move || work(&node))
            .await
            .map_err(|error| NodeError::Internal(error.to_string()))?
    }

    /// Opens the data directory (creating it on first start) and every pool
    /// in its catalog. A pool that fails to open is kept as offline.
    pub fn open(data_dir: &Path) -> Result<Node, NodeError> {
        std::fs::create_dir_all(data_dir.join(POOLS_DIRECTORY)).map_err(|error| {
            NodeError::io(
                format!("create data directory {}", data_dir.display()),
                error,
            )
        })?;
        let lock = lock_data_dir(data_dir)?;
        let catalog = Catalog::load(data_dir)?;
        let mut pools = BTreeMap::new();
        for record in &catalog.pools {
            let slot = match Pool::open(&record.device_path, &record.metadata_path) {
                Ok(pool) => {
                    tracing::info!(pool = %record.name, device = %record.device_path.display(), "pool opened");
                    PoolSlot::Online(pool)
                }
                Err(error) => {
                    tracing::error!(pool = %record.name, device = %record.device_path.display(), %error, "pool is offline");
                    PoolSlot::Offline {
                        reason: error.to_string(),
                    }
                }
            };
            pools.insert(record.name.clone(), slot);
        }
        Ok(Node {
            data_dir: data_dir.to_path_buf(),
            state: Mutex::new(NodeState { catalog, pools }),
            opened: Mutex::new(BTreeMap::new()),
            stopping: AtomicBool::new(false),
            _lock: lock,
        })
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    fn metadata_path(&self, pool: &PoolName) -> PathBuf {
        self.pool_directory(pool).join(METADATA_FILE)
    }

    fn pool_directory(&self, pool: &PoolName) -> PathBuf {
        self.data_dir.join(POOLS_DIRECTORY).join(pool.as_str())
    }

    /// Takes the state lock, refusing new work once shutdown has begun.
    fn lock_state(&self) -> Result<MutexGuard<'_, NodeState>, NodeError> {
        if self.stopping.load(Ordering::Acquire) {
            return Err(NodeError::ShuttingDown);
        }
        // A panic while holding the lock leaves plain data behind (no
        // half-applied invariants span the guard), so a poisoned lock is usable.
        Ok(self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()))
    }

    fn lock_opened(&self) -> MutexGuard<'_, BTreeMap<VolumeName, Arc<Volume>>> {
        self.opened
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Stops every pool: drops the opened volumes and applies each journal.
    /// Errors are logged, not returned: the other pools still get stopped.
    pub fn shutdown(&self) {
        let state = self.lock_state();
        self.stopping.store(true, Ordering::Release);
        self.lock_opened().clear();
        let Ok(state) = state else { return };
        for (name, pool) in state.online_pools() {
            match pool.shutdown() {
                Ok(()) => tracing::info!(pool = %name, "pool shut down"),
                Err(error) => tracing::error!(pool = %name, %error, "pool shutdown failed"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_node_per_data_directory() {
        let directory = tempfile::tempdir().unwrap();
        let first = Node::open(directory.path()).unwrap();
        let Err(error) = Node::open(directory.path()) else {
            panic!("a second node opened the same data directory");
        };
        assert!(matches!(error, NodeError::DataDirInUse(_)), "{error:?}");
        let text = error.to_string();
        assert!(
            text.contains("in use by another trireme process") && text.contains("node.lock"),
            "{text}"
        );
        // The lock goes with the node (a crash drops it too: it is the
        // process's flock).
        drop(first);
        Node::open(directory.path()).unwrap();
    }
}
