//! `DATA/cluster.json`: which cluster this node belongs to, its node id and
//! the cluster secret that signs node-to-node requests. Written at cluster
//! creation or join, atomically and readable by its owner only; written
//! once more if the node learns that it was removed, so that it refuses to
//! start on this data directory from then on, even with no member around
//! to tell it again.

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
    /// Set when this node learned that it was removed from the cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub removed: Option<Removal>,
}

/// How a node learned of its removal, kept for the refusal at every start.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Removal {
    pub learned_ms: u64,
    /// Who said so, e.g. "node 1 at 127.0.0.1:7450 answered that it was removed".
    pub reason: String,
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

    /// Records durably that this node was removed, unless it already is.
    pub fn record_removal(&mut self, data_dir: &Path, reason: String) -> Result<(), NodeError> {
        if self.removed.is_none() {
            self.removed = Some(Removal {
                learned_ms: super::auth::now_ms(),
                reason,
            });
            self.save(data_dir)?;
        }
        Ok(())
    }

    /// The refusal to start (or go on) of a removed node.
    pub fn removed_error(&self, data_dir: &Path) -> Option<NodeError> {
        self.removed.as_ref().map(|removal| NodeError::Removed {
            cluster_id: self.cluster_id.clone(),
            node_id: self.node_id,
            reason: removal.reason.clone(),
            data_dir: data_dir.to_path_buf(),
        })
    }

    pub fn secret_bytes(&self) -> Vec<u8> {
        hex::decode(&self.secret).unwrap_or_default()
    }
}
