//! [`Pool`]: create, open and manage a storage pool and its volumes.

use crate::{StoreError, Volume};
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use trireme_types::{DeviceClass, PoolId, PoolName, VolumeId, VolumeName};

/// How to create a pool.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    pub name: PoolName,
    pub id: PoolId,
    pub class: DeviceClass,
    /// A block device or a regular file. A missing file is created.
    pub device_path: PathBuf,
    /// The redb metadata database; created, must not exist.
    pub metadata_path: PathBuf,
    /// Needed when `device_path` does not exist; a device's own size otherwise.
    pub size_bytes: Option<u64>,
    /// Reserve the file's space on the host file system up front
    /// (fallocate) instead of leaving it sparse.
    pub preallocate: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct PoolInfo {
    pub name: PoolName,
    pub id: PoolId,
    pub class: DeviceClass,
    pub device_path: PathBuf,
    pub metadata_path: PathBuf,
    /// Bytes of the data region: what volumes can be given.
    pub capacity_bytes: u64,
    /// Bytes of chunks in use (by written data).
    pub allocated_bytes: u64,
    pub free_bytes: u64,
    /// Sum of the sizes of all volumes; may exceed capacity (over-commit).
    pub provisioned_bytes: u64,
    pub volume_count: usize,
    pub journal_bytes: u64,
    pub chunk_bytes: u64,
    /// Blocks that failed their checksum since the pool was opened.
    pub checksum_errors: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct VolumeInfo {
    pub name: VolumeName,
    pub id: VolumeId,
    pub pool: PoolName,
    pub size_bytes: u64,
    pub allocated_bytes: u64,
    pub created_unix_seconds: u64,
    pub checksum_errors: u64,
}

/// What a full scan of a pool found: accounting recomputed from the chunk
/// maps and every written block checked against its checksum.
#[derive(Debug, Clone, Serialize)]
pub struct ScanReport {
    pub allocated_chunks_counted: u64,
    pub allocated_chunks_accounted: u64,
    pub blocks_checked: u64,
    pub checksum_mismatches: Vec<String>,
    pub problems: Vec<String>,
}

impl ScanReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
            && self.checksum_mismatches.is_empty()
            && self.allocated_chunks_counted == self.allocated_chunks_accounted
    }
}

pub struct Pool {
    _private: (),
}

impl Pool {
    pub fn create(config: PoolConfig) -> Result<Arc<Pool>, StoreError> {
        let _ = config;
        todo!("store: being written")
    }

    pub fn open(device_path: &Path, metadata_path: &Path) -> Result<Arc<Pool>, StoreError> {
        let _ = (device_path, metadata_path);
        todo!("store: being written")
    }

    pub fn name(&self) -> &PoolName {
        todo!()
    }

    pub fn info(&self) -> PoolInfo {
        todo!()
    }

    pub fn create_volume(
        &self,
        name: &VolumeName,
        size_bytes: u64,
    ) -> Result<VolumeInfo, StoreError> {
        let _ = (name, size_bytes);
        todo!()
    }

    /// Deletes the volume and returns its chunks. Open handles of it answer
    /// `ShuttingDown` from then on.
    pub fn delete_volume(&self, name: &VolumeName) -> Result<(), StoreError> {
        let _ = name;
        todo!()
    }

    /// Grows a volume; shrinking is refused.
    pub fn grow_volume(
        &self,
        name: &VolumeName,
        new_size_bytes: u64,
    ) -> Result<VolumeInfo, StoreError> {
        let _ = (name, new_size_bytes);
        todo!()
    }

    pub fn volume_info(&self, name: &VolumeName) -> Result<VolumeInfo, StoreError> {
        let _ = name;
        todo!()
    }

    pub fn volumes(&self) -> Vec<VolumeInfo> {
        todo!()
    }

    pub fn open_volume(&self, name: &VolumeName) -> Result<Arc<Volume>, StoreError> {
        let _ = name;
        todo!()
    }

    /// Recomputes accounting from the chunk maps and checks every written
    /// block's checksum. Reads the whole pool: for tests and `pool check`.
    pub fn scan(&self) -> Result<ScanReport, StoreError> {
        todo!()
    }

    /// Applies the journal, checkpoints and stops the background thread.
    pub fn shutdown(&self) -> Result<(), StoreError> {
        todo!()
    }

    /// Removes an empty pool: wipes its superblock, deletes its metadata, and
    /// deletes the device file if the pool created it.
    pub fn destroy(self: Arc<Self>) -> Result<(), StoreError> {
        todo!()
    }
}
