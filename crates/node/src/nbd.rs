//! The NBD side of the node: [`NodeExports`] maps an export name to the
//! volume of that name for the NBD server of `trireme-export`.
//!
//! Volumes are opened once and cached by [`Node`]; a deleted volume drops
//! out of the cache (its old handle answers `ShuttingDown`).

use std::sync::{Arc, OnceLock};
use trireme_types::VolumeName;

use crate::cluster::Cluster;
use tokio::runtime::{Handle, RuntimeFlavor};
use trireme_export::ExportRegistry;
use trireme_types::BlockTarget;

use crate::replicated::Replication;
use crate::Node;

pub use trireme_export::{NbdConfig, NbdServer};

/// Export name → volume, for the NBD server.
pub struct NodeExports {
    node: Arc<Node>,
    /// Set once the node is a cluster member (the server binds before).
    cluster: Arc<OnceLock<Arc<Cluster>>>,
    replication: Arc<Replication>,
}

impl NodeExports {
    pub fn new(
        node: Arc<Node>,
        cluster: Arc<OnceLock<Arc<Cluster>>>,
        replication: Arc<Replication>,
    ) -> Self {
        NodeExports {
            node,
            cluster,
            replication,
        }
    }

    /// A volume that is not attached anywhere is served straight from its
    /// copy when that is its only replica and it lives here (no engine
    /// needed: there is nobody to replicate to). Any other volume is
    /// served only where it is attached (`volume attach`).
    fn servable_here(&self, name: &str) -> bool {
        let Some(cluster) = self.cluster.get() else {
            return true;
        };
        let Ok(name) = VolumeName::new(name) else {
            return false;
        };
        let state = cluster.state.read();
        let Some(volume) = state.volumes.get(&name) else {
            // A local volume the agent has not registered yet.
            return true;
        };
        let diskful: Vec<_> = volume.diskful().collect();
        let servable = !volume.deleting
            && volume.primaries.is_empty()
            && diskful.len() == 1
            && diskful[0].node == cluster.node_id();
        if !servable {
            tracing::warn!(
                volume = %name,
                replicas = diskful.len(),
                "not served here: attach it to this node first (trireme volume attach {name} --node THIS-NODE)"
            );
        }
        servable
    }
}

/// The server calls the registry on the network reactor. A cached volume
/// costs one uncontended lock; opening one reads pool metadata, so that
/// path tells tokio the thread blocks (other tasks move to other workers).
fn without_stalling_the_reactor<T>(work: impl FnOnce() -> T) -> T {
    match Handle::try_current() {
        Ok(handle) if handle.runtime_flavor() == RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(work)
        }
        _ => work(),
    }
}

impl NodeExports {
    /// `VOLUME@SNAPSHOT`: a ready snapshot whose copy is on this node,
    /// read-only.
    fn open_snapshot(&self, volume: &str, snapshot: &str) -> Option<Arc<dyn BlockTarget>> {
        let cluster = self.cluster.get()?;
        let volume = VolumeName::new(volume).ok()?;
        let (id, holders) = crate::replicated::snapshots::snapshot_holders(
            &cluster.state.read(),
            &volume,
            snapshot,
        )?;
        if !holders.contains(&cluster.node_id()) {
            tracing::warn!(%volume, snapshot, "not served here: this node holds no copy of the snapshot");
            return None;
        }
        let view = without_stalling_the_reactor(|| self.node.open_snapshot(&volume, id));
        match view {
            Ok(view) => Some(view),
            Err(error) => {
                tracing::warn!(%volume, snapshot, %error, "cannot open the snapshot");
                None
            }
        }
    }
}

impl ExportRegistry for NodeExports {
    fn open(&self, name: &str) -> Option<Arc<dyn BlockTarget>> {
        if let Some((volume, snapshot)) = name.split_once('@') {
            return self.open_snapshot(volume, snapshot);
        }
        if let Ok(volume) = VolumeName::new(name) {
            if self.replication.attached_here(&volume) == Some(true) {
                return self.replication.target(&volume);
            }
        }
        if !self.servable_here(name) {
            return None;
        }
        let volume: Arc<dyn BlockTarget> = match self.node.cached_volume(name) {
            Some(volume) => volume,
            None => without_stalling_the_reactor(|| self.node.open_volume(name))?,
        };
        Some(volume)
    }

    fn names(&self) -> Vec<String> {
        without_stalling_the_reactor(|| self.node.volume_names())
    }
}
