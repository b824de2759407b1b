//! The NBD side of the node: [`NodeExports`] maps an export name to the
//! volume of that name for the NBD server of `trireme-export`.
//!
//! Volumes are opened once and cached by [`Node`]; a deleted volume drops
//! out of the cache (its old handle answers `ShuttingDown`).

use std::sync::Arc;
use trireme_types::VolumeName;

use crate::cluster::Cluster;
use tokio::runtime::{Handle, RuntimeFlavor};
use trireme_export::ExportRegistry;
use trireme_types::BlockTarget;

use crate::metrics::Metrics;
use crate::replicated::Replication;
use crate::Node;

pub use trireme_export::{NbdConfig, NbdServer};

/// Export name → volume, for the NBD server.
pub struct NodeExports {
    node: Arc<Node>,
    cluster: Arc<Cluster>,
    replication: Arc<Replication>,
    /// Where each volume's requests are counted.
    metrics: Arc<Metrics>,
}

impl NodeExports {
    pub fn new(
        node: Arc<Node>,
        cluster: Arc<Cluster>,
        replication: Arc<Replication>,
        metrics: Arc<Metrics>,
    ) -> Self {
        NodeExports {
            node,
            cluster,
            replication,
            metrics,
        }
    }

    /// A volume that is not attached anywhere is served straight from its
    /// copy when that is its only replica and it lives here (no engine
    /// needed: there is nobody to replicate to). Any other volume is
    /// served only where it is attached (`volume attach`); the error says
    /// where that is, or how to attach it.
    fn servable_here(&self, name: &str) -> Result<(), String> {
        let cluster = &self.cluster;
        let Ok(name) = VolumeName::new(name) else {
            return Err(format!("'{name}' is not a volume name"));
        };
        let state = cluster.state.read();
        let Some(volume) = state.volumes.get(&name) else {
            // A local volume the agent has not registered yet.
            return Ok(());
        };
        let me = cluster.node_id();
        if volume.deleting {
            return Err(format!("volume '{name}' is being deleted"));
        }
        // A resync-only engine serves nobody: the volume is detached.
        if volume.primaries.iter().any(|primary| !primary.resync_only) {
            let served: Vec<String> = volume
                .primaries
                .iter()
                .map(|primary| {
                    let node = state.nodes.get(&primary.node);
                    match node.and_then(|node| node.nbd_address.as_ref()) {
                        Some(address) => format!("nbd://{address}/{name}"),
                        None => format!("node {}", state.node_name(primary.node)),
                    }
                })
                .collect();
            return Err(format!(
                "volume '{name}' is attached on {}, not on this node ({}): connect to {}",
                primaries_text(&state, volume),
                state.node_name(me),
                served.join(" or ")
            ));
        }
        let diskful: Vec<_> = volume.diskful().collect();
        if let [only] = diskful.as_slice() {
            if only.node == me {
                return Ok(());
            }
            if let Some(address) = state
                .nodes
                .get(&only.node)
                .and_then(|node| node.nbd_address.as_ref())
            {
                return Err(format!(
                    "volume '{name}' has its only replica on {}, which serves it: connect to nbd://{address}/{name}",
                    state.node_name(only.node)
                ));
            }
        }
        tracing::warn!(
            volume = %name,
            replicas = diskful.len(),
            "not served here: attach it to this node first (trireme volume attach {name} --node THIS-NODE)"
        );
        Err(format!(
            "volume '{name}' is not attached: attach it where it should be served (`trireme volume attach {name} --node {}` for this node)",
            state.node_name(me)
        ))
    }
}

/// `n1` or `n1 and n2`: where a volume is attached.
fn primaries_text(
    state: &trireme_control::ClusterState,
    volume: &trireme_control::VolumeRecord,
) -> String {
    let names: Vec<String> = volume
        .primaries
        .iter()
        .map(|primary| state.node_name(primary.node))
        .collect();
    names.join(" and ")
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
    fn open_snapshot(&self, volume: &str, snapshot: &str) -> Result<Arc<dyn BlockTarget>, String> {
        let cluster = &self.cluster;
        let volume =
            VolumeName::new(volume).map_err(|_| format!("'{volume}' is not a volume name"))?;
        let state = cluster.state.read();
        let Some((id, holders)) =
            crate::replicated::snapshots::snapshot_holders(&state, &volume, snapshot)
        else {
            return Err(format!(
                "volume '{volume}' has no ready snapshot named '{snapshot}' (see `trireme snapshot list {volume}`)"
            ));
        };
        if !holders.contains(&cluster.node_id()) {
            tracing::warn!(%volume, snapshot, "not served here: this node holds no copy of the snapshot");
            let holders: Vec<String> = holders.iter().map(|node| state.node_name(*node)).collect();
            return Err(format!(
                "this node holds no copy of snapshot '{volume}@{snapshot}': connect to one that does ({})",
                holders.join(", ")
            ));
        }
        drop(state);
        let view = without_stalling_the_reactor(|| self.node.open_snapshot(&volume, id));
        match view {
            Ok(view) => Ok(view),
            Err(error) => {
                tracing::warn!(%volume, snapshot, %error, "cannot open the snapshot");
                Err(format!(
                    "cannot open snapshot '{volume}@{snapshot}': {error}"
                ))
            }
        }
    }
}

impl ExportRegistry for NodeExports {
    fn open(&self, name: &str) -> Result<Arc<dyn BlockTarget>, String> {
        if let Some((volume, snapshot)) = name.split_once('@') {
            return self.open_snapshot(volume, snapshot);
        }
        if let Ok(volume) = VolumeName::new(name) {
            if self.replication.attached_here(&volume) == Some(true) {
                return self.replication.target(&volume).ok_or_else(|| {
                    format!("volume '{name}' is attached here, but its replication engine is still starting: try again in a moment")
                });
            }
        }
        self.servable_here(name)?;
        let volume: Arc<dyn BlockTarget> = match self.node.cached_volume(name) {
            Some(volume) => volume,
            None => without_stalling_the_reactor(|| self.node.open_volume(name))
                .ok_or_else(|| format!("no volume named '{name}' (see `trireme volume list`)"))?,
        };
        Ok(volume)
    }

    fn names(&self) -> Vec<String> {
        without_stalling_the_reactor(|| self.node.volume_names())
    }

    fn volume_io(&self, name: &str) -> Option<Arc<trireme_export::VolumeIo>> {
        self.metrics.volume_io(name)
    }
}
