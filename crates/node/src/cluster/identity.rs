//! `DATA/cluster.json`: which cluster this node belongs to, its node id and
//! the cluster secret that signs node-to-node requests. Written once, at
//! cluster creation or join, atomically and readable by its owner only.

use serde::{Deserialize, Serialize};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use trireme_types::NodeId;

use crate::NodeError;

pub const IDENTITY_FILE: &str = "cluster.json";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Identity {
    pub cluster_id: String,
    pub node_id: NodeId,
    /// Hex of the 32-byte cluster secret.
    pub secret: String,
    /// This node created the cluster: if it stopped before the first log
    /// entry was written, it initializes Raft again at the next start.
    pub founder: bool,
}

impl Identity {
    pub fn path(data_dir: &Path) -> PathBuf {
        data_dir.join(IDENTITY_FILE)
    }

    pub fn load(data_dir: &Path) -> Result<Option<Identity>, NodeError> {
        let path = Self::path(data_dir);
        let bytes = match std::fs::read(&path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(NodeError::io(format!("read {}", path.display()), error)),
        };
        serde_json::from_slice(&bytes).map(Some).map_err(|error| {
            NodeError::Internal(format!(
                "{} is damaged ({error}); restore it from a backup or remove the node from the cluster and join it again",
                path.display()
            ))
        })
    }

    pub fn save(&self, data_dir: &Path) -> Result<(), NodeError> {
        let path = Self::path(data_dir);
        let temporary = data_dir.join(format!("{IDENTITY_FILE}.tmp"));
        let bytes = serde_json::to_vec_pretty(self)
            .map_err(|error| NodeError::Internal(error.to_string()))?;
        let write = || -> std::io::Result<()> {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&temporary)?;
            file.write_all(&bytes)?;
            file.sync_all()?;
            std::fs::rename(&temporary, &path)?;
            std::fs::File::open(data_dir)?.sync_all()
        };
        write().map_err(|error| NodeError::io(format!("write {}", path.display()), error))
    }

    pub fn secret_bytes(&self) -> Vec<u8> {
        hex::decode(&self.secret).unwrap_or_default()
    }
}
