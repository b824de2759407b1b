//! What this node does about snapshots and detached volumes, as the
//! cluster state asks (the agent calls [`Replication::reconcile_snapshots`]
//! on every change and every few seconds):
//!
//! - **Fence** each detached volume's generation on its local copy, and say
//!   so: from then on no primary of that generation can write here.
//! - **Take** snapshots: an attached volume's through its engine, on the
//!   primary (one barrier on every replica); a detached volume's on the
//!   local copy, under the fence, when this node is one of the targets.
//! - **Delete** copies of snapshots being deleted, and orphans (a copy whose
//!   record is gone, e.g. taken by a barrier that the control plane then
//!   counted as failed).
//! - **Roll back** the local copy when a rollback waits for this node.
//! - **Report** snapshot space (from one holder per volume).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use trireme_control::{
    ClusterState, Command, ReplicaObserved, SnapshotRecord, SnapshotState, SnapshotTaker,
    VolumeRecord,
};
use trireme_types::{NodeId, SnapshotId, VolumeName};

use super::Replication;
use crate::NodeError;

/// Snapshot space is reported again when a number moved by more than this
/// share of itself (1/64), or by 64 MiB, whichever is less; to or from zero
/// always. Measured against the volume's size instead, a snapshot's 4 MiB
/// becoming exclusive on a 1 GiB volume was never reported and the list
/// said 0 B while deleting it gave 4 MiB back.
const SPACE_REPORT_SHARE: u64 = 64;
const SPACE_REPORT_BYTES: u64 = 64 << 20;

/// Whether a measured snapshot space differs enough from the recorded one
/// to write it to the cluster state (each report is a Raft write, so a
/// snapshot whose space creeps up is not reported at every step).
fn space_moved(recorded_bytes: u64, measured_bytes: u64) -> bool {
    if recorded_bytes == measured_bytes {
        return false;
    }
    if recorded_bytes == 0 || measured_bytes == 0 {
        return true;
    }
    let threshold =
        (recorded_bytes.max(measured_bytes) / SPACE_REPORT_SHARE).min(SPACE_REPORT_BYTES);
    recorded_bytes.abs_diff(measured_bytes) > threshold
}

impl Replication {
    async fn write(&self, command: Command) -> Result<(), NodeError> {
        self.control
            .propose(command)
            .await
            .map(|_| ())
            .map_err(|error| NodeError::Internal(error.to_string()))
    }

    pub async fn reconcile_snapshots(self: &Arc<Self>) -> Result<(), NodeError> {
        let me = self.control.node_id();
        let (volumes, next_snapshot_id): (Vec<VolumeRecord>, u64) = {
            let state = self.control.state().read();
            (
                state
                    .volumes
                    .values()
                    .filter(|volume| {
                        !volume.deleting && (volume.is_diskful_on(me) || volume.is_primary(me))
                    })
                    .cloned()
                    .collect(),
                state.next_snapshot_id,
            )
        };
        for volume in volumes {
            let replica_ready = volume
                .replica(me)
                .is_some_and(|replica| replica.observed == ReplicaObserved::Ready)
                && volume.is_diskful_on(me);
            if replica_ready {
                self.fence_detached(&volume).await?;
                self.roll_back(&volume).await?;
            }
            for snapshot in &volume.snapshots {
                self.work_on(&volume, snapshot, replica_ready).await?;
            }
            if replica_ready {
                self.remove_orphans(&volume, next_snapshot_id).await?;
                self.report_space(&volume).await?;
            }
        }
        Ok(())
    }

    async fn fence_detached(&self, volume: &VolumeRecord) -> Result<(), NodeError> {
        let me = self.control.node_id();
        if !volume.primaries.is_empty() || volume.fenced.contains(&me) {
            return Ok(());
        }
        let (service, name, generation) =
            (self.service.clone(), volume.name.clone(), volume.generation);
        tokio::task::spawn_blocking(move || service.fence(&name, generation))
            .await
            .map_err(|error| NodeError::Internal(error.to_string()))??;
        tracing::info!(volume = %volume.name, generation = %volume.generation, "detached: generation fenced");
        self.write(Command::ReportFenced {
            volume: volume.name.clone(),
            node: me,
            generation: volume.generation,
        })
        .await
    }

    async fn roll_back(&self, volume: &VolumeRecord) -> Result<(), NodeError> {
        let me = self.control.node_id();
        let Some(rollback) = &volume.rollback else {
            return Ok(());
        };
        if !rollback.pending.contains(&me) {
            return Ok(());
        }
        let (service, node, name, generation, id) = (
            self.service.clone(),
            self.node.clone(),
            volume.name.clone(),
            volume.generation,
            rollback.snapshot,
        );
        // The rollback started a new generation, fenced here first: no
        // primary of an older one can write while the copy changes.
        let result = tokio::task::spawn_blocking(move || {
            service.fence(&name, generation)?;
            service
                .while_fenced(&name, generation, || node.rollback_volume(&name, id))
                .map_err(NodeError::Internal)?
        })
        .await
        .map_err(|error| NodeError::Internal(error.to_string()))?;
        match result {
            Ok(()) => {
                self.write(Command::RolledBack {
                    volume: volume.name.clone(),
                    node: me,
                    snapshot: id,
                })
                .await
            }
            Err(error) => {
                tracing::error!(volume = %volume.name, snapshot = %id, %error, "rollback failed; retrying");
                Ok(())
            }
        }
    }

    async fn work_on(
        self: &Arc<Self>,
        volume: &VolumeRecord,
        snapshot: &SnapshotRecord,
        replica_ready: bool,
    ) -> Result<(), NodeError> {
        let me = self.control.node_id();
        match &snapshot.state {
            SnapshotState::Creating {
                taker: SnapshotTaker::Primary { node },
            } if *node == me => {
                self.take_attached(&volume.name, snapshot.id);
                Ok(())
            }
            SnapshotState::Creating {
                taker:
                    SnapshotTaker::Replicas {
                        targets, answered, ..
                    },
            } if replica_ready && targets.contains(&me) && !answered.contains(&me) => {
                self.take_detached(volume, snapshot).await
            }
            SnapshotState::Deleting if snapshot.nodes.contains(&me) => {
                let (name, id) = (volume.name.clone(), snapshot.id);
                self.node
                    .blocking(move |node| node.delete_snapshot(&name, id))
                    .await?;
                self.write(Command::SnapshotRemoved {
                    volume: volume.name.clone(),
                    id: snapshot.id,
                    node: me,
                })
                .await
            }
            _ => Ok(()),
        }
    }

    /// Asks the engine for the barrier, once, and reports what it did.
    fn take_attached(self: &Arc<Self>, volume: &VolumeName, id: SnapshotId) {
        let Some(engine) = self.engine_handle(volume) else {
            // Starting: the next round asks.
            return;
        };
        if !self
            .taking
            .lock()
            .expect("taking lock")
            .insert((volume.clone(), id))
        {
            return;
        }
        let this = self.clone();
        let volume = volume.clone();
        tokio::spawn(async move {
            let outcome = engine.take_snapshot(id).await;
            let (holders, error) = match outcome {
                Ok(nodes) => (nodes, None),
                Err(error) => (BTreeSet::new(), Some(error)),
            };
            let result = this
                .control
                .propose(Command::ReportSnapshot {
                    volume: volume.clone(),
                    id,
                    from: this.control.node_id(),
                    holders,
                    error,
                })
                .await;
            if let Err(error) = result {
                tracing::warn!(%volume, snapshot = %id, %error, "cannot report the snapshot");
            }
            this.taking
                .lock()
                .expect("taking lock")
                .remove(&(volume, id));
        });
    }

    /// A detached volume: the local copy takes it, under the fence of the
    /// generation the snapshot was asked at.
    async fn take_detached(
        &self,
        volume: &VolumeRecord,
        snapshot: &SnapshotRecord,
    ) -> Result<(), NodeError> {
        let me = self.control.node_id();
        let (service, node, name, generation, id) = (
            self.service.clone(),
            self.node.clone(),
            volume.name.clone(),
            snapshot.generation,
            snapshot.id,
        );
        let outcome = tokio::task::spawn_blocking(move || {
            let copy = node
                .open_volume(name.as_str())
                .ok_or_else(|| format!("no local copy of volume '{name}'"))?;
            service
                .while_fenced(&name, generation, || copy.snapshot(id))?
                .map_err(|error| error.to_string())
        })
        .await
        .map_err(|error| NodeError::Internal(error.to_string()))?;
        let (holders, error) = match outcome {
            Ok(()) => (BTreeSet::from([me]), None),
            Err(error) => {
                tracing::warn!(volume = %volume.name, snapshot = %snapshot.id, %error, "cannot take the snapshot");
                (BTreeSet::new(), Some(error))
            }
        };
        self.write(Command::ReportSnapshot {
            volume: volume.name.clone(),
            id: snapshot.id,
            from: me,
            holders,
            error,
        })
        .await
    }

    /// Local snapshots the state knows nothing of (any more) go. Only ids
    /// the state has handed out count: a barrier may reach this copy before
    /// this node has applied the command that asked for it.
    async fn remove_orphans(
        &self,
        volume: &VolumeRecord,
        next_snapshot_id: u64,
    ) -> Result<(), NodeError> {
        let name = volume.name.clone();
        let local = self
            .node
            .blocking(move |node| node.snapshots(&name))
            .await?;
        let recorded: BTreeSet<SnapshotId> = volume.snapshots.iter().map(|s| s.id).collect();
        for snapshot in local {
            if snapshot.id.0 < next_snapshot_id && !recorded.contains(&snapshot.id) {
                tracing::info!(volume = %volume.name, snapshot = %snapshot.id, "removing a snapshot copy the cluster does not record");
                let (name, id) = (volume.name.clone(), snapshot.id);
                self.node
                    .blocking(move |node| node.delete_snapshot(&name, id))
                    .await?;
            }
        }
        Ok(())
    }

    /// The first holder of each snapshot reports its space when it moved.
    async fn report_space(&self, volume: &VolumeRecord) -> Result<(), NodeError> {
        let me = self.control.node_id();
        let reporting: BTreeMap<SnapshotId, &SnapshotRecord> = volume
            .snapshots
            .iter()
            .filter(|snapshot| snapshot.is_ready() && snapshot.nodes.first() == Some(&me))
            .map(|snapshot| (snapshot.id, snapshot))
            .collect();
        if reporting.is_empty() {
            return Ok(());
        }
        let name = volume.name.clone();
        let local = self
            .node
            .blocking(move |node| node.snapshots(&name))
            .await?;
        let spaces: Vec<(SnapshotId, u64, u64)> = local
            .iter()
            .filter_map(|info| {
                let recorded = reporting.get(&info.id)?;
                let moved = space_moved(recorded.exclusive_bytes, info.exclusive_bytes)
                    || space_moved(recorded.shared_bytes, info.shared_bytes);
                moved.then_some((info.id, info.exclusive_bytes, info.shared_bytes))
            })
            .collect();
        if spaces.is_empty() {
            return Ok(());
        }
        self.write(Command::ReportSnapshotSpace {
            volume: volume.name.clone(),
            spaces,
        })
        .await
    }
}

/// The nodes holding a ready snapshot `volume@name`, for the NBD registry.
pub fn snapshot_holders(
    state: &ClusterState,
    volume: &VolumeName,
    name: &str,
) -> Option<(SnapshotId, BTreeSet<NodeId>)> {
    let record = state.volumes.get(volume)?;
    let snapshot = record
        .snapshots
        .iter()
        .find(|snapshot| snapshot.name.as_str() == name && snapshot.is_ready())?;
    Some((snapshot.id, snapshot.nodes.clone()))
}

#[cfg(test)]
mod tests {
    use super::space_moved;

    const MIB: u64 = 1 << 20;

    #[test]
    fn snapshot_space_is_reported_when_it_moved_for_itself() {
        // The field case: 4 MiB becoming exclusive, whatever the volume's size.
        assert!(space_moved(0, 4 * MIB));
        assert!(space_moved(4 * MIB, 0));
        assert!(space_moved(4 * MIB, 8 * MIB));
        // A chunk more on a few MiB is news; on a TiB it is not.
        assert!(space_moved(MIB, MIB + 65536));
        assert!(!space_moved(1 << 40, (1 << 40) + 65536));
        // Large numbers are reported every 64 MiB at most.
        assert!(space_moved(1 << 40, (1 << 40) + 65 * MIB));
        assert!(!space_moved(7 * MIB, 7 * MIB));
    }
}
