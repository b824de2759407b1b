//! Resyncs of detached volumes.
//!
//! An engine resyncs a volume's outdated replicas, but only an attached
//! volume has one: a replica that fell behind while a VM ran and came back
//! after it stopped would stay outdated for good, leaving the volume on
//! fewer copies than it should have. So, for a detached volume with a
//! replica behind, the node of one up-to-date replica (the one with the
//! lowest id among the online ones, so every node picks the same) asks the
//! control plane for a resync-only engine (`Command::StartResync`): a
//! primary at a new generation, under every fencing rule of an attach,
//! that serves no client. It ends (`Command::EndResync`, after a clean
//! detach of the engine) once every replica is up to date or nothing more
//! can be copied, and any attach replaces it at a newer generation.
//!
//! It starts only while every up-to-date replica's node is online: an
//! engine outdates the up-to-date members it cannot reach, and a detached
//! volume gains nothing from that. [`blocked`] says why a replica is not
//! being resynced, for the API (`volume show --wait` stops on it rather
//! than wait for what nothing will do).

use std::collections::BTreeSet;
use std::time::Duration;
use trireme_control::{
    ClusterState, Command, NodeState, ReplicaKind, ReplicaObserved, VolumeRecord,
};
use trireme_types::{NodeId, VolumeName};

use super::Replication;
use crate::cluster::auth;

/// How long a finished resync engine gets to detach cleanly (final flush,
/// goodbyes) before its end is recorded anyway.
const STOP_GRACE: Duration = Duration::from_secs(5);

/// Why the diskful replica on `node`, which is behind, is not being
/// resynced and will not be until something changes; `None` when a resync
/// runs or will start by itself.
pub fn blocked(state: &ClusterState, volume: &VolumeRecord, node: NodeId) -> Option<String> {
    let name = &volume.name;
    let node_state = state.nodes.get(&node).map(|record| record.state);
    if node_state != Some(NodeState::Online) {
        return Some(format!(
            "its node {} is {}: start it again, or move the replica (`trireme volume replica add {name}`, then `trireme volume replica remove {name} --node {}`)",
            state.node_name(node),
            node_state.map_or("unknown", |state| state.as_str()),
            state.node_name(node),
        ));
    }
    if let Some(ReplicaObserved::Failed(message)) = volume.replica(node).map(|r| &r.observed) {
        return Some(format!(
            "its node {} cannot make the replica: {message}",
            state.node_name(node)
        ));
    }
    if volume.deleting || !volume.primaries.is_empty() || volume.rollback.is_some() {
        // Being deleted, or an engine runs (it resyncs once linked), or a
        // rollback makes the copies first.
        return None;
    }
    let offline: Vec<String> = up_to_date_nodes(volume)
        .filter(|node| state.nodes.get(node).map(|n| n.state) != Some(NodeState::Online))
        .map(|node| state.node_name(node).to_string())
        .collect();
    if volume.in_sync.is_empty() {
        return Some(format!(
            "volume '{name}' has no up-to-date replica to copy from"
        ));
    }
    if !offline.is_empty() {
        return Some(format!(
            "volume '{name}' is detached and its up-to-date replica on {} is offline; a detached volume resyncs only while all its up-to-date replicas are online (attach it to resync from the others now: `trireme volume attach {name} --node NODE`)",
            offline.join(", ")
        ));
    }
    None
}

fn up_to_date_nodes(volume: &VolumeRecord) -> impl Iterator<Item = NodeId> + '_ {
    volume
        .diskful()
        .map(|replica| replica.node)
        .filter(|node| volume.is_in_sync(*node))
}

fn behind(volume: &VolumeRecord) -> impl Iterator<Item = NodeId> + '_ {
    volume
        .diskful()
        .map(|replica| replica.node)
        .filter(|node| !volume.is_in_sync(*node))
}

/// The node that drives the resync of a detached volume: the lowest id
/// among the up-to-date replicas whose copy is ready, if all of them are
/// online and some replica behind can be resynced.
fn driver(state: &ClusterState, volume: &VolumeRecord) -> Option<NodeId> {
    if volume.deleting
        || !volume.primaries.is_empty()
        || volume.rollback.is_some()
        || volume.snapshot_in_progress()
    {
        return None;
    }
    let mut candidates = behind(volume).filter(|node| blocked(state, volume, *node).is_none());
    candidates.next()?;
    up_to_date_nodes(volume).find(|node| {
        volume
            .replica(*node)
            .is_some_and(|r| r.kind == ReplicaKind::Diskful && r.observed == ReplicaObserved::Ready)
    })
}

/// A resync-only engine's work is over: every replica is up to date, or
/// none behind can be resynced (their nodes went away). It is not ended
/// while a snapshot it takes is in progress.
fn finished(state: &ClusterState, volume: &VolumeRecord) -> bool {
    !volume.snapshot_in_progress()
        && behind(volume).all(|node| blocked(state, volume, node).is_some())
}

impl Replication {
    /// Starts the resyncs this node drives and ends the ones that are
    /// over. Returns the volumes whose resync-only engine is finished: the
    /// caller must not start it again.
    pub(super) async fn drive_resyncs(&self) -> BTreeSet<VolumeName> {
        let me = self.control.node_id();
        let (start, end) = {
            let state = self.control.state().read();
            let mut start = Vec::new();
            let mut end = Vec::new();
            for volume in state.volumes.values() {
                match volume.resync_driver() {
                    Some(node) if node == me && finished(&state, volume) => {
                        end.push((volume.name.clone(), volume.generation));
                    }
                    Some(_) => {}
                    None if driver(&state, volume) == Some(me) => start.push(volume.name.clone()),
                    None => {}
                }
            }
            (start, end)
        };
        let mut finished_here = BTreeSet::new();
        for (name, generation) in end {
            finished_here.insert(name.clone());
            if let Some(engine) = self.engine(&name) {
                engine.shut_down();
                let deadline = tokio::time::Instant::now() + STOP_GRACE;
                while !engine.is_stopped() && tokio::time::Instant::now() < deadline {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            tracing::info!(volume = %name, %generation, "resync of the detached volume is over");
            let command = Command::EndResync {
                name: name.clone(),
                node: me,
                generation,
            };
            if let Err(error) = self.control.propose(command).await {
                tracing::warn!(volume = %name, %error, "cannot record the end of the resync; retrying");
            }
        }
        for name in start {
            tracing::info!(volume = %name, "a replica of the detached volume is behind: resyncing it from this node");
            let command = Command::StartResync {
                name: name.clone(),
                node: me,
                now_ms: auth::now_ms(),
            };
            if let Err(error) = self.control.propose(command).await {
                tracing::warn!(volume = %name, %error, "cannot start the resync of the detached volume; retrying");
            }
        }
        finished_here
    }
}
