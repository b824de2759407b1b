//! [`NodeError`]: every way a node operation can fail.
//!
//! Each case is one thing the caller can act on; the REST layer maps each to
//! an HTTP status and a stable `code` string (see `api::error`).

use std::path::PathBuf;
use trireme_store::StoreError;
use trireme_types::{NameError, PoolName, VolumeName};

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    InvalidName(#[from] NameError),
    #[error("{0}")]
    InvalidSize(String),
    #[error("{0}")]
    InvalidRequest(String),
    #[error("{0}")]
    InvalidPath(String),
    #[error("pool '{0}' does not exist: see `trireme pool list`")]
    PoolNotFound(String),
    #[error("pool '{0}' already exists: choose another name")]
    PoolExists(PoolName),
    #[error("'{path}' is already the device of pool '{pool}': choose another path")]
    PoolPathInUse { path: PathBuf, pool: PoolName },
    #[error("pool '{pool}' is offline ({reason}): fix the device or delete the pool")]
    PoolOffline { pool: PoolName, reason: String },
    #[error("volume '{0}' does not exist: see `trireme volume list`")]
    VolumeNotFound(VolumeName),
    #[error("volume '{name}' already exists in pool '{pool}': volume names are unique on a node (they are NBD export names)")]
    VolumeExists { name: VolumeName, pool: PoolName },
    #[error("no online pool to place the volume in: create one with `trireme pool create`")]
    NoPoolAvailable,
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    /// The NBD server could not listen (address in use, bad socket path).
    #[error("cannot start the NBD server: {0}")]
    Nbd(String),
    #[error("the data directory {} is in use by another trireme process (it holds {}): stop that node first (it may still be shutting down), or give this one another --data-dir", .0.display(), .0.join(crate::node::LOCK_FILE).display())]
    DataDirInUse(PathBuf),
    #[error("the node is shutting down")]
    ShuttingDown,
    /// This node was removed from its cluster (`trireme node remove`): its
    /// data directory is stale, and nothing in it may be served or said.
    #[error("this node (id {node_id}) was removed from cluster {cluster_id} ({reason}); nothing in its data directory {} may be served, and no member listens to it any more. To use this machine again: wipe the data directory (`rm -rf {}`; pools created outside it with `trireme pool create` need their files deleted or devices wiped too), then join as a new node: `trireme node run --join MEMBER:7450 --token TOKEN` (print the token on a member with `trireme cluster join-token`)", data_dir.display(), data_dir.display())]
    Removed {
        cluster_id: String,
        node_id: trireme_types::NodeId,
        reason: String,
        data_dir: PathBuf,
    },
    #[error("internal error: {0}")]
    Internal(String),
}

impl NodeError {
    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        NodeError::Io {
            context: context.into(),
            source,
        }
    }

    /// Whether the disk or file system ran out of room (ENOSPC, or a quota:
    /// EDQUOT): the admin makes room or uses another pool; nothing is broken.
    pub fn is_out_of_space(&self) -> bool {
        match self {
            NodeError::Store(StoreError::Io { source, .. }) | NodeError::Io { source, .. } => {
                is_out_of_space(source)
            }
            _ => false,
        }
    }
}

pub(crate) fn is_out_of_space(error: &std::io::Error) -> bool {
    error.raw_os_error() == Some(libc::ENOSPC) || error.raw_os_error() == Some(libc::EDQUOT)
}
