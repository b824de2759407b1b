//! Turning the placer's answer into a volume's replica records.

use std::collections::BTreeSet;
use trireme_types::NodeId;

use crate::model::{ReplicaKind, ReplicaObserved, ReplicaRecord, VolumeRecord};
use crate::placer;

/// Gives `volume` the members of `placement`. Replicas that stay keep their
/// record (what their node reported, their resync); new diskful replicas
/// are pending and not in sync; a primary keeps a diskless membership.
pub(crate) fn apply_placement(volume: &mut VolumeRecord, placement: &placer::Placement) {
    let mut replicas = replicas_of(placement, false);
    for replica in &mut replicas {
        if let Some(old) = volume.replica(replica.node) {
            if old.kind == replica.kind {
                *replica = old.clone();
            }
        }
    }
    for old in &volume.replicas {
        let placed = replicas.iter().any(|replica| replica.node == old.node);
        if !placed && old.kind == ReplicaKind::Diskless && volume.is_primary(old.node) {
            replicas.push(old.clone());
        }
    }
    volume.replicas = replicas;
    let diskful: BTreeSet<NodeId> = volume.diskful().map(|replica| replica.node).collect();
    volume.in_sync.retain(|node| diskful.contains(node));
    volume
        .replica_removed_from
        .retain(|node| !diskful.contains(node));
}

pub(crate) fn diskless_member(node: NodeId) -> ReplicaRecord {
    ReplicaRecord {
        node,
        kind: ReplicaKind::Diskless,
        pool: None,
        observed: ReplicaObserved::Ready,
        allocated_bytes: 0,
        sync: None,
    }
}

pub(crate) fn replicas_of(placement: &placer::Placement, ready: bool) -> Vec<ReplicaRecord> {
    let diskful = placement.diskful.iter().map(|(node, pool)| ReplicaRecord {
        node: *node,
        kind: ReplicaKind::Diskful,
        pool: Some(pool.clone()),
        observed: if ready {
            ReplicaObserved::Ready
        } else {
            ReplicaObserved::Pending
        },
        allocated_bytes: 0,
        sync: None,
    });
    let member = |node: &NodeId, kind| ReplicaRecord {
        node: *node,
        kind,
        pool: None,
        observed: ReplicaObserved::Ready,
        allocated_bytes: 0,
        sync: None,
    };
    diskful
        .chain(
            placement
                .tiebreaker
                .iter()
                .map(|node| member(node, ReplicaKind::Tiebreaker)),
        )
        .chain(
            placement
                .diskless
                .iter()
                .map(|node| member(node, ReplicaKind::Diskless)),
        )
        .collect()
}
