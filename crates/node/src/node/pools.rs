//! Pool operations of [`Node`]: the default pool, create, delete, list, scan.

use std::path::PathBuf;
use std::sync::Arc;
use trireme_store::{Pool, PoolConfig, PoolInfo, ScanReport, StoreError};
use trireme_types::{DeviceClass, PoolId, PoolName};

use super::{Node, PoolSlot};
use crate::catalog::PoolRecord;
use crate::{space, NodeError};

pub const DEFAULT_POOL_NAME: &str = "default";
const DEFAULT_POOL_FILE: &str = "pool.img";
const DEFAULT_POOL_CLASS: DeviceClass = DeviceClass::Ssd;
/// The default pool never takes more than this, however large the disk.
const DEFAULT_POOL_MAX_BYTES: u64 = 64 << 30;
/// ... nor more than this share of the free space (in percent). The file
/// is sparse and grows as volumes are written, up to its size (freed
/// chunks are reused first and their space given back), so the host's
/// file system keeps at least the other half of what was free, for logs,
/// the metadata databases and everything else on it. At 90% a full pool
/// plus other growth filled hosts' disks.
const DEFAULT_POOL_FREE_SPACE_PERCENT: u64 = 50;
/// Pool file sizes are rounded down to a whole number of these.
const POOL_SIZE_ALIGNMENT_BYTES: u64 = 1 << 20;

/// What `POST /pools` asks for, already validated in shape.
#[derive(Debug, Clone)]
pub struct NewPool {
    pub name: PoolName,
    pub device_path: PathBuf,
    pub size_bytes: Option<u64>,
    pub class: DeviceClass,
    pub preallocate: bool,
    /// Format a path that holds data or an old pool (never one in use).
    pub force: bool,
}

/// A pool as the catalog knows it, with its live numbers when it is online.
#[derive(Debug, Clone)]
pub struct PoolStatus {
    pub record: PoolRecord,
    pub info: Option<PoolInfo>,
    pub offline_reason: Option<String>,
}

impl Node {
    /// On a node with no pool at all, makes `default`: a sparse file in the
    /// data directory. Returns the new pool, or `None` if the node had pools.
    pub fn ensure_default_pool(&self) -> Result<Option<PoolInfo>, NodeError> {
        if !self.lock_state()?.catalog.pools.is_empty() {
            return Ok(None);
        }
        let name = PoolName::new(DEFAULT_POOL_NAME)?;
        let directory = self.pool_directory(&name);
        std::fs::create_dir_all(&directory)
            .map_err(|error| NodeError::io(format!("create {}", directory.display()), error))?;
        let available = space::available_bytes(&directory).map_err(|error| {
            NodeError::io(
                format!("measure free space of {}", directory.display()),
                error,
            )
        })?;
        let share = available / 100 * DEFAULT_POOL_FREE_SPACE_PERCENT;
        let size_bytes = share.min(DEFAULT_POOL_MAX_BYTES) / POOL_SIZE_ALIGNMENT_BYTES
            * POOL_SIZE_ALIGNMENT_BYTES;
        let info = self.create_pool(NewPool {
            name,
            device_path: directory.join(DEFAULT_POOL_FILE),
            size_bytes: Some(size_bytes),
            class: DEFAULT_POOL_CLASS,
            preallocate: false,
            force: false,
        })?;
        Ok(Some(info))
    }

    pub fn create_pool(&self, new: NewPool) -> Result<PoolInfo, NodeError> {
        if !new.device_path.is_absolute() {
            return Err(NodeError::InvalidPath(format!(
                "pool path '{}' is relative: give an absolute path",
                new.device_path.display()
            )));
        }
        let mut state = self.lock_state()?;
        if state.pools.contains_key(&new.name) {
            return Err(NodeError::PoolExists(new.name));
        }
        if let Some(record) = state
            .catalog
            .pools
            .iter()
            .find(|record| record.device_path == new.device_path)
        {
            return Err(NodeError::PoolPathInUse {
                path: new.device_path,
                pool: record.name.clone(),
            });
        }
        match new.device_path.parent() {
            Some(parent) if parent.is_dir() => {}
            _ => {
                return Err(NodeError::InvalidPath(format!(
                    "the directory of pool path '{}' does not exist: create it first",
                    new.device_path.display()
                )))
            }
        }
        let directory = self.pool_directory(&new.name);
        std::fs::create_dir_all(&directory)
            .map_err(|error| NodeError::io(format!("create {}", directory.display()), error))?;
        let record = PoolRecord {
            name: new.name.clone(),
            id: PoolId(state.catalog.next_pool_id),
            class: new.class,
            device_path: new.device_path.clone(),
            metadata_path: self.metadata_path(&new.name),
        };
        let pool = Pool::create(PoolConfig {
            name: record.name.clone(),
            id: record.id,
            class: record.class,
            device_path: record.device_path.clone(),
            metadata_path: record.metadata_path.clone(),
            size_bytes: new.size_bytes,
            preallocate: new.preallocate,
            force: new.force,
        })
        .inspect_err(|_| {
            // Only succeeds when empty: never removes a device file.
            let _ = std::fs::remove_dir(&directory);
        })?;

        let mut catalog = state.catalog.clone();
        catalog.pools.push(record.clone());
        catalog.next_pool_id += 1;
        if let Err(error) = catalog.save(&self.data_dir) {
            // Without a catalog entry the pool would be orphaned: undo it.
            if let Err(destroy_error) = pool.destroy() {
                tracing::error!(pool = %record.name, %destroy_error, "cannot undo pool creation");
            }
            return Err(error);
        }
        state.catalog = catalog;
        let info = pool.info();
        state
            .pools
            .insert(record.name.clone(), PoolSlot::Online(pool));
        tracing::info!(pool = %record.name, device = %record.device_path.display(), capacity_bytes = info.capacity_bytes, "pool created");
        Ok(info)
    }

    /// Deletes an empty pool and its files. An offline pool is only removed
    /// from the catalog: its device is left untouched.
    pub fn delete_pool(&self, name: &PoolName) -> Result<(), NodeError> {
        let mut state = self.lock_state()?;
        let Some(slot) = state.pools.remove(name) else {
            return Err(NodeError::PoolNotFound(name.to_string()));
        };
        if let PoolSlot::Online(pool) = slot {
            let volume_count = pool.info().volume_count;
            if volume_count > 0 {
                state.pools.insert(name.clone(), PoolSlot::Online(pool));
                return Err(StoreError::PoolNotEmpty {
                    pool: name.clone(),
                    count: volume_count,
                }
                .into());
            }
            if let Err(error) = pool.destroy() {
                state.pools.insert(
                    name.clone(),
                    PoolSlot::Offline {
                        reason: format!("deletion failed: {error}"),
                    },
                );
                return Err(error.into());
            }
            // Only succeeds when the store left it empty.
            let _ = std::fs::remove_dir(self.pool_directory(name));
        } else {
            tracing::warn!(pool = %name, "offline pool removed from the catalog; its device and metadata were left in place");
        }
        let mut catalog = state.catalog.clone();
        catalog.pools.retain(|record| &record.name != name);
        catalog.save(&self.data_dir)?;
        state.catalog = catalog;
        tracing::info!(pool = %name, "pool deleted");
        Ok(())
    }

    pub fn pools(&self) -> Result<Vec<PoolStatus>, NodeError> {
        let state = self.lock_state()?;
        Ok(state
            .catalog
            .pools
            .iter()
            .map(|record| Self::status(record, state.pools.get(&record.name)))
            .collect())
    }

    /// Every pool in the catalog with its live numbers and handle when it
    /// is open (for `/metrics`: one short hold of the node's lock).
    pub fn pool_handles(&self) -> Vec<(String, Option<PoolInfo>, Option<Arc<Pool>>)> {
        let Ok(state) = self.lock_state() else {
            return Vec::new();
        };
        state
            .catalog
            .pools
            .iter()
            .map(|record| match state.pools.get(&record.name) {
                Some(PoolSlot::Online(pool)) => {
                    let info = pool.info();
                    let online = info.failed.is_none();
                    (
                        record.name.to_string(),
                        online.then_some(info),
                        Some(pool.clone()),
                    )
                }
                _ => (record.name.to_string(), None, None),
            })
            .collect()
    }

    pub fn pool(&self, name: &PoolName) -> Result<PoolStatus, NodeError> {
        let state = self.lock_state()?;
        let record = state
            .catalog
            .find(name)
            .ok_or_else(|| NodeError::PoolNotFound(name.to_string()))?;
        Ok(Self::status(record, state.pools.get(name)))
    }

    fn status(record: &PoolRecord, slot: Option<&PoolSlot>) -> PoolStatus {
        let (info, offline_reason) = match slot {
            Some(PoolSlot::Online(pool)) => {
                // Open but taken offline by an I/O error: every request
                // fails until the node restarts it.
                let info = pool.info();
                let failed = info.failed.clone();
                (Some(info), failed)
            }
            Some(PoolSlot::Offline { reason }) => (None, Some(reason.clone())),
            None => (None, Some("not opened".to_string())),
        };
        PoolStatus {
            record: record.clone(),
            info,
            offline_reason,
        }
    }

    /// Full scan of a pool: reads every written block. Holds the node lock
    /// only to find the pool, so other operations go on meanwhile.
    pub fn scan_pool(&self, name: &PoolName) -> Result<ScanReport, NodeError> {
        let pool = self.lock_state()?.online_pool(name)?.clone();
        Ok(pool.scan()?)
    }
}
