use std::path::PathBuf;
use trireme_types::{PoolName, SnapshotId, VolumeName};

/// Every way a pool or volume operation can fail. `Fatal` cases mean the pool
/// can no longer be trusted and must be taken offline.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("metadata database {context}: {message}")]
    Metadata { context: String, message: String },
    #[error("'{path}' already holds a trireme pool: if it is one of this node's, `trireme pool list` names it and `trireme pool delete NAME` removes it; if no node uses it any more, add --force (REST: \"force\": true) to format it anew, destroying its volumes; or choose another path")]
    AlreadyAPool { path: PathBuf },
    #[error("'{path}' holds {found}; making a pool there would destroy it. Choose another path, or add --force (REST: \"force\": true) to format it anyway")]
    HoldsData { path: PathBuf, found: String },
    #[error("'{path}' is in use on this host: {user}. A pool is never made on a device or file in use, even with --force: stop that use first, or choose another path")]
    InUse { path: PathBuf, user: String },
    #[error("'{path}' is not a trireme pool ({reason})")]
    NotAPool { path: PathBuf, reason: String },
    #[error("pool '{path}' was written by on-disk format version {found}; this trireme reads version {supported} (to move its volumes: serve them with the trireme that made the pool, copy them off with `qemu-img convert`, then recreate the pool)")]
    UnsupportedVersion {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    #[error("pool device '{path}' and metadata '{metadata}' belong to different pools")]
    MetadataMismatch { path: PathBuf, metadata: PathBuf },
    #[error(
        "pool size {size_bytes} bytes is too small: a pool needs at least {minimum_bytes} bytes"
    )]
    PoolTooSmall { size_bytes: u64, minimum_bytes: u64 },
    #[error("'{path}' does not exist and no --size was given to create it")]
    SizeNeeded { path: PathBuf },
    #[error("pool '{pool}' still holds {count} volume(s): delete them first")]
    PoolNotEmpty { pool: PoolName, count: usize },
    #[error("volume '{0}' already exists")]
    VolumeExists(VolumeName),
    #[error("volume '{0}' does not exist")]
    VolumeNotFound(VolumeName),
    #[error("volume size must be greater than 0")]
    SizeZero,
    #[error("volume size {0} bytes is not a multiple of 4096 (4 KiB)")]
    SizeUnaligned(u64),
    #[error("volume size {size_bytes} bytes is larger than the maximum {maximum_bytes} bytes")]
    SizeTooLarge { size_bytes: u64, maximum_bytes: u64 },
    #[error("volume '{name}' is {current_bytes} bytes; it can only grow, not shrink to {requested_bytes} bytes")]
    ShrinkRefused {
        name: VolumeName,
        current_bytes: u64,
        requested_bytes: u64,
    },
    #[error("volume '{volume}' already has snapshot {id}")]
    SnapshotExists { volume: VolumeName, id: SnapshotId },
    #[error("volume '{volume}' has no snapshot {id}")]
    SnapshotNotFound { volume: VolumeName, id: SnapshotId },
    #[error("pool is shut down")]
    ShutDown,
    #[error("pool is damaged and was taken offline: {0}")]
    Fatal(String),
}

impl StoreError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        StoreError::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn metadata(context: impl Into<String>, error: impl std::fmt::Display) -> Self {
        StoreError::Metadata {
            context: context.into(),
            message: error.to_string(),
        }
    }
}
