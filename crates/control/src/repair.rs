//! Placing again what a volume lost: its tiebreaker, diskful replicas lost
//! with a removed node, and replicas left on an evicted node because
//! nothing could take them at the time.
//!
//! A volume placed as two replicas and a tiebreaker that loses the
//! tiebreaker's node has two voters, both needed: one more failure stops
//! its writes. Nothing but the placer can give it a tiebreaker again, so
//! the leader asks for it: every half second it lists the volumes whose
//! placement would change ([`ClusterState::placements_to_restore`]) and
//! commits a `Command::RestorePlacement` for each. Applying it (in the
//! command module's `volumes`) decides again from the state then, with the
//! same function, so every node computes the same placement and a stale
//! request changes nothing.
//!
//! Rules, each keeping the volume's quorum:
//! - one diskful replica at a time is added while the volume has fewer
//!   than its `replica_target`, or to replace one on an evicted node (the
//!   evicted copy goes only once another up-to-date ready copy exists and
//!   a new node takes its place);
//! - an even number of diskful replicas gets a tiebreaker when a node can
//!   be one, an odd number none; a tiebreaker on a node that is merely
//!   offline stays (it votes again when its node returns, and moving it
//!   on every flap would churn);
//! - a node whose replica an admin removed (`replica remove`) is the
//!   tiebreaker only while no other node can be: on three nodes it is the
//!   only one left, and a tiebreaker there still lets the volume survive a
//!   failure; once another node can take the seat, the seat moves there
//!   (once: the new holder never gives it back);
//! - nothing changes that would leave fewer up-to-date voters than a
//!   majority (or, for a volume that has lost its quorum, bring it no
//!   nearer): a new replica is empty and does not count until it is
//!   synced, so adding one where no tiebreaker can come with it may have
//!   to wait for another node.

use std::collections::BTreeSet;
use trireme_types::{NodeId, PoolName, VolumeName};

use crate::model::{
    ClusterState, NodeState, ReplicaKind, ReplicaObserved, VolumeRecord, MAX_PLACE_COUNT,
};
use crate::placer::{self, name_seed, Placement};

impl ClusterState {
    /// The volumes whose placement [`ClusterState::restored_placement`]
    /// would change now, by name.
    pub fn placements_to_restore(&self) -> Vec<VolumeName> {
        self.volumes
            .values()
            .filter(|volume| self.restored_placement(volume).is_some())
            .map(|volume| volume.name.clone())
            .collect()
    }

    /// The placement `volume` should move to now, or `None` when it has
    /// what it should have or nothing better can be placed.
    pub fn restored_placement(&self, volume: &VolumeRecord) -> Option<Placement> {
        // A rollback or a create in progress owns the replicas meanwhile.
        if volume.deleting || volume.rollback.is_some() {
            return None;
        }
        let current = volume.placement();
        let evicted: Vec<NodeId> = current
            .diskful
            .iter()
            .map(|(node, _)| *node)
            .filter(|node| self.node_state(*node) == Some(NodeState::Evicted))
            .collect();
        let target = volume.replica_target.clamp(1, MAX_PLACE_COUNT);
        // An evicted node's copy may go once another copy is up to date,
        // ready and on a node that is not evicted (the rule of eviction).
        let replaceable = evicted.first().copied().filter(|_| {
            volume.diskful().any(|replica| {
                !evicted.contains(&replica.node)
                    && volume.is_in_sync(replica.node)
                    && replica.observed == ReplicaObserved::Ready
            })
        });
        let mut grown = None;
        if current.diskful.len() < target || replaceable.is_some() {
            let keep: Vec<(NodeId, PoolName)> = if current.diskful.len() < target {
                current.diskful.clone()
            } else {
                current
                    .diskful
                    .iter()
                    .filter(|(node, _)| Some(*node) != replaceable)
                    .cloned()
                    .collect()
            };
            grown = self.place_with(volume, &keep, keep.len() + 1, &evicted);
        }
        let tiebreaker_only = self.place_with(volume, &current.diskful, current.diskful.len(), &[]);
        [grown, tiebreaker_only]
            .into_iter()
            .flatten()
            .find(|placement| {
                changes(&current, placement) && keeps_quorum(volume, &current, placement)
            })
    }

    /// Whether `trireme volume replica add` would find a node for one more
    /// diskful replica of `volume` now (by its group's rules, on an online
    /// node that holds none).
    pub fn replica_room(&self, volume: &VolumeRecord) -> bool {
        let current = volume.placement();
        current.diskful.len() < MAX_PLACE_COUNT
            && self
                .place_with(volume, &current.diskful, current.diskful.len() + 1, &[])
                .is_some()
    }

    /// The placer's answer with `keep` and `count` diskful replicas, the
    /// current tiebreaker kept where it may stay and the current diskless
    /// members kept; `None` when the placer finds no room.
    fn place_with(
        &self,
        volume: &VolumeRecord,
        keep: &[(NodeId, PoolName)],
        count: usize,
        exclude: &[NodeId],
    ) -> Option<Placement> {
        let group = self.group_of(volume);
        let request = placer::Request {
            size_bytes: volume.size_bytes,
            place_count: count,
            min_place_count: count,
            pools: &group.pools,
            class: group.class,
            replicas_on_different: &group.replicas_on_different,
            diskless_on_remaining: false,
            manual_nodes: None,
            exclude,
            keep,
            seed: name_seed(volume.name.as_str()),
        };
        let mut placement = placer::place(&self.candidates(), &request).ok()?;
        let removed_from = &volume.replica_removed_from;
        if placement
            .tiebreaker
            .is_some_and(|node| removed_from.contains(&node))
        {
            // An admin took this node's replica away: another node is the
            // tiebreaker if one can be (the nodes left out hold no replica
            // of the volume, so only the tiebreaker can differ).
            let others: Vec<placer::Candidate> = self
                .candidates()
                .into_iter()
                .filter(|candidate| !removed_from.contains(&candidate.id))
                .collect();
            if let Ok(other) = placer::place(&others, &request) {
                if other.tiebreaker.is_some() && other.diskful == placement.diskful {
                    placement.tiebreaker = other.tiebreaker;
                }
            }
        }
        let diskful: BTreeSet<NodeId> = placement.diskful.iter().map(|(node, _)| *node).collect();
        let current_tiebreaker = volume
            .replicas
            .iter()
            .find(|replica| replica.kind == ReplicaKind::Tiebreaker)
            .map(|replica| replica.node)
            .filter(|node| {
                !diskful.contains(node)
                    && matches!(
                        self.node_state(*node),
                        Some(NodeState::Online | NodeState::Offline)
                    )
            })
            // A node that gave its replica up keeps the seat only until
            // another node can take it.
            .filter(|node| {
                !removed_from.contains(node)
                    || placement
                        .tiebreaker
                        .is_none_or(|chosen| removed_from.contains(&chosen))
            });
        if placement.diskful.len().is_multiple_of(2) && current_tiebreaker.is_some() {
            placement.tiebreaker = current_tiebreaker;
        }
        placement.diskless = volume
            .replicas
            .iter()
            .filter(|replica| replica.kind == ReplicaKind::Diskless)
            .map(|replica| replica.node)
            .filter(|node| !diskful.contains(node) && Some(*node) != placement.tiebreaker)
            .collect();
        Some(placement)
    }

    fn node_state(&self, node: NodeId) -> Option<NodeState> {
        self.nodes.get(&node).map(|record| record.state)
    }
}

/// Whether `placement` has other diskful nodes or another tiebreaker than
/// `current` (diskless members are kept as they are).
fn changes(current: &Placement, placement: &Placement) -> bool {
    let nodes = |placement: &Placement| -> BTreeSet<NodeId> {
        placement.diskful.iter().map(|(node, _)| *node).collect()
    };
    nodes(current) != nodes(placement) || current.tiebreaker != placement.tiebreaker
}

/// Whether moving `volume` from `current` to `placement` keeps its quorum:
/// the up-to-date diskful replicas kept, with the tiebreaker, are a
/// majority of the new voters, or (for a volume without quorum) closer to
/// one than before. A tiebreaker given to a volume that lost its quorum
/// brings it nearer, never further.
fn keeps_quorum(volume: &VolumeRecord, current: &Placement, placement: &Placement) -> bool {
    let missing = |placement: &Placement| -> usize {
        let tiebreaker = usize::from(placement.tiebreaker.is_some());
        let voters = placement.diskful.len() + tiebreaker;
        let up_to_date = placement
            .diskful
            .iter()
            .filter(|(node, _)| volume.is_in_sync(*node))
            .count()
            + tiebreaker;
        (voters / 2 + 1).saturating_sub(up_to_date)
    };
    let after = missing(placement);
    after == 0 || after < missing(current)
}
