//! Volume operations of [`Node`]: placement, create, delete, grow, list, and
//! opening volumes for the NBD server.

use std::sync::Arc;
use trireme_store::{Pool, StoreError, Volume, VolumeInfo};
use trireme_types::{PoolName, VolumeName};

use super::{Node, NodeState};
use crate::NodeError;

impl NodeState {
    /// The online pool that holds `name`, if any.
    fn pool_of_volume(
        &self,
        name: &VolumeName,
    ) -> Result<Option<(PoolName, Arc<Pool>)>, NodeError> {
        for (pool_name, pool) in self.online_pools() {
            match pool.volume_info(name) {
                Ok(_) => return Ok(Some((pool_name.clone(), pool.clone()))),
                Err(StoreError::VolumeNotFound(_)) => {}
                Err(error) => return Err(error.into()),
            }
        }
        Ok(None)
    }

    /// The online pool holding `name`, if any.
    pub(super) fn pool_of(&self, name: &VolumeName) -> Result<Option<Arc<Pool>>, NodeError> {
        Ok(self.pool_of_volume(name)?.map(|(_, pool)| pool))
    }

    fn require_pool_of_volume(&self, name: &VolumeName) -> Result<Arc<Pool>, NodeError> {
        match self.pool_of_volume(name)? {
            Some((_, pool)) => Ok(pool),
            None => Err(NodeError::VolumeNotFound(name.clone())),
        }
    }

    /// The pool a new volume goes to when none is named: the online pool
    /// with the most free bytes, so thin volumes spread their writes.
    fn roomiest_pool(&self) -> Result<Arc<Pool>, NodeError> {
        self.online_pools()
            .map(|(_, pool)| (pool.info().free_bytes, pool))
            .max_by_key(|(free_bytes, _)| *free_bytes)
            .map(|(_, pool)| pool.clone())
            .ok_or(NodeError::NoPoolAvailable)
    }
}

impl Node {
    pub fn create_volume(
        &self,
        name: &VolumeName,
        size_bytes: u64,
        pool: Option<&PoolName>,
    ) -> Result<VolumeInfo, NodeError> {
        let state = self.lock_state()?;
        if let Some((pool, _)) = state.pool_of_volume(name)? {
            return Err(NodeError::VolumeExists {
                name: name.clone(),
                pool,
            });
        }
        let pool = match pool {
            Some(pool) => state.online_pool(pool)?.clone(),
            None => state.roomiest_pool()?,
        };
        let info = pool.create_volume(name, size_bytes)?;
        tracing::info!(volume = %name, pool = %info.pool, size_bytes, "volume created");
        Ok(info)
    }

    /// Deletes a volume. An NBD client still connected to it gets
    /// `ShuttingDown` from its handle from then on (the store does that).
    pub fn delete_volume(&self, name: &VolumeName) -> Result<(), NodeError> {
        let state = self.lock_state()?;
        let pool = state.require_pool_of_volume(name)?;
        // Under the state lock, so no NBD open can cache the handle again
        // between this removal and the deletion.
        self.lock_opened().remove(name);
        pool.delete_volume(name)?;
        tracing::info!(volume = %name, "volume deleted");
        Ok(())
    }

    pub fn grow_volume(&self, name: &VolumeName, size_bytes: u64) -> Result<VolumeInfo, NodeError> {
        let state = self.lock_state()?;
        let pool = state.require_pool_of_volume(name)?;
        let info = pool.grow_volume(name, size_bytes)?;
        tracing::info!(volume = %name, size_bytes, "volume grown");
        Ok(info)
    }

    pub fn volume(&self, name: &VolumeName) -> Result<VolumeInfo, NodeError> {
        let state = self.lock_state()?;
        Ok(state.require_pool_of_volume(name)?.volume_info(name)?)
    }

    /// Every volume of every online pool, sorted by name.
    pub fn volumes(&self) -> Result<Vec<VolumeInfo>, NodeError> {
        let state = self.lock_state()?;
        let mut volumes: Vec<VolumeInfo> = state
            .online_pools()
            .flat_map(|(_, pool)| pool.volumes())
            .collect();
        volumes.sort_by(|left, right| left.name.cmp(&right.name));
        Ok(volumes)
    }

    /// The already opened handle of volume `name`, if any. Never blocks on
    /// the disk.
    pub fn cached_volume(&self, name: &str) -> Option<Arc<Volume>> {
        let name = VolumeName::new(name).ok()?;
        self.lock_opened().get(&name).cloned()
    }

    /// The handle the NBD server serves for export `name`, opened once and
    /// cached. `None` when no such volume exists (or the name is invalid).
    pub fn open_volume(&self, name: &str) -> Option<Arc<Volume>> {
        let name = VolumeName::new(name).ok()?;
        if let Some(volume) = self.lock_opened().get(&name) {
            return Some(volume.clone());
        }
        let state = self.lock_state().ok()?;
        // Checked again under the state lock: another client may have opened it.
        if let Some(volume) = self.lock_opened().get(&name) {
            return Some(volume.clone());
        }
        let pool = match state.pool_of_volume(&name) {
            Ok(Some((_, pool))) => pool,
            Ok(None) => return None,
            Err(error) => {
                tracing::warn!(volume = %name, %error, "cannot look up volume for export");
                return None;
            }
        };
        match pool.open_volume(&name) {
            Ok(volume) => {
                self.lock_opened().insert(name, volume.clone());
                Some(volume)
            }
            Err(error) => {
                tracing::warn!(volume = %name, %error, "cannot open volume for export");
                None
            }
        }
    }

    /// Names of every volume, for NBD's export list.
    pub fn volume_names(&self) -> Vec<String> {
        self.volumes()
            .map(|volumes| volumes.into_iter().map(|info| info.name.into()).collect())
            .unwrap_or_default()
    }
}
