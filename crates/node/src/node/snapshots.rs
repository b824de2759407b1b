//! Snapshot operations of [`Node`] on the pool that holds each volume:
//! list, delete, open read-only, clone and roll back. Taking one goes
//! through the volume itself (`Volume::snapshot`), in its write order.

use std::sync::Arc;
use trireme_store::{SnapshotInfo, SnapshotView, VolumeInfo};
use trireme_types::{SnapshotId, VolumeName};

use super::Node;
use crate::NodeError;

impl Node {
    /// The snapshots of the local copy of `volume` (none when it has no
    /// copy here).
    pub fn snapshots(&self, volume: &VolumeName) -> Result<Vec<SnapshotInfo>, NodeError> {
        let state = self.lock_state()?;
        match state.pool_of(volume)? {
            Some(pool) => Ok(pool.snapshots(volume)?),
            None => Ok(Vec::new()),
        }
    }

    /// Deletes snapshot `id` of the local copy; a snapshot it does not
    /// have is no error.
    pub fn delete_snapshot(&self, volume: &VolumeName, id: SnapshotId) -> Result<(), NodeError> {
        let state = self.lock_state()?;
        let Some(pool) = state.pool_of(volume)? else {
            return Ok(());
        };
        if !pool
            .snapshots(volume)?
            .iter()
            .any(|snapshot| snapshot.id == id)
        {
            return Ok(());
        }
        pool.delete_snapshot(volume, id)?;
        tracing::info!(%volume, snapshot = %id, "snapshot deleted");
        Ok(())
    }

    pub fn open_snapshot(
        &self,
        volume: &VolumeName,
        id: SnapshotId,
    ) -> Result<Arc<SnapshotView>, NodeError> {
        let state = self.lock_state()?;
        let pool = state
            .pool_of(volume)?
            .ok_or_else(|| NodeError::VolumeNotFound(volume.clone()))?;
        Ok(pool.open_snapshot(volume, id)?)
    }

    /// Makes `name` a clone of snapshot `id` of `source`, in the pool of
    /// the local copy of `source` (they share its chunks).
    pub fn clone_volume(
        &self,
        source: &VolumeName,
        id: SnapshotId,
        name: &VolumeName,
    ) -> Result<VolumeInfo, NodeError> {
        let state = self.lock_state()?;
        let pool = state
            .pool_of(source)?
            .ok_or_else(|| NodeError::VolumeNotFound(source.clone()))?;
        let info = pool.clone_volume(source, id, name)?;
        tracing::info!(volume = %name, %source, snapshot = %id, "clone created");
        Ok(info)
    }

    /// The local copy of `volume` gets snapshot `id`'s content back. The
    /// caller makes sure nothing writes to it (the volume is detached and
    /// its generation fenced).
    pub fn rollback_volume(&self, volume: &VolumeName, id: SnapshotId) -> Result<(), NodeError> {
        let state = self.lock_state()?;
        let pool = state
            .pool_of(volume)?
            .ok_or_else(|| NodeError::VolumeNotFound(volume.clone()))?;
        pool.rollback_volume(volume, id)?;
        tracing::info!(%volume, snapshot = %id, "rolled back");
        Ok(())
    }
}
