//! How a volume stands, in one word, and how far it is from losing its
//! quorum: what `volume list`, `volume show`, `status` and the REST API
//! all say, decided in one place from the replicated state.
//!
//! The data path counts a write's quorum among the voters (diskful
//! replicas and the tiebreaker) as: the in-sync diskful replicas that hold
//! it, plus the tiebreaker while it is linked (docs/replication.md, rule
//! 3). A syncing or outdated replica does not count until it is back in
//! the in-sync set. The control plane's view of the same rule: the in-sync
//! diskful replicas and the tiebreaker whose node is online.

use serde::{Deserialize, Serialize};
use trireme_types::NodeId;

use crate::model::{ClusterState, NodeState, ReplicaKind, ReplicaObserved, VolumeRecord};

/// A volume's state, worst first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum VolumeHealth {
    /// Its record goes once every node has removed its copy.
    Deleting,
    /// No diskful replica could be made or kept: every one failed.
    Failed,
    /// Too few voters are up to date and online: writes fail (or wait,
    /// with `on-no-quorum suspend`) until one comes back.
    NoQuorum,
    /// Replicas are being made on their nodes (after a create or a grow).
    Creating,
    /// A replica that is not up to date is being resynced.
    Syncing,
    /// Fewer up-to-date copies than placed: a replica is outdated, failed,
    /// on a node that is not online, or lost with its node and not yet
    /// placed again.
    Degraded,
    /// Every placed replica is made, up to date and on an online node.
    Ready,
}

impl VolumeHealth {
    pub fn as_str(self) -> &'static str {
        match self {
            VolumeHealth::Deleting => "deleting",
            VolumeHealth::Failed => "failed",
            VolumeHealth::NoQuorum => "no-quorum",
            VolumeHealth::Creating => "creating",
            VolumeHealth::Syncing => "syncing",
            VolumeHealth::Degraded => "degraded",
            VolumeHealth::Ready => "ready",
        }
    }
}

impl std::fmt::Display for VolumeHealth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A volume's voters as the control plane sees them now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuorumCount {
    /// Diskful replicas and the tiebreaker.
    pub voters: usize,
    /// How many of them a write needs.
    pub majority: usize,
    /// Voters that count for a write now: in-sync diskful replicas and the
    /// tiebreaker, on online nodes.
    pub up_to_date: usize,
}

impl QuorumCount {
    pub fn has_quorum(&self) -> bool {
        self.up_to_date >= self.majority
    }

    /// One more voter lost and writes stop: the volume has quorum with no
    /// voter to spare, and was meant to have redundancy (more than one
    /// voter; a volume with a single replica is always one failure away,
    /// and says so by its replica count).
    pub fn one_failure_from_losing_it(&self) -> bool {
        self.voters > 1 && self.up_to_date == self.majority
    }
}

impl ClusterState {
    fn node_online(&self, node: NodeId) -> bool {
        self.nodes
            .get(&node)
            .is_some_and(|record| record.state == NodeState::Online)
    }

    /// The voters of `volume` and how many of them count now.
    pub fn quorum_count(&self, volume: &VolumeRecord) -> QuorumCount {
        let voters = volume.voters();
        let up_to_date = volume
            .replicas
            .iter()
            .filter(|replica| self.node_online(replica.node))
            .filter(|replica| match replica.kind {
                ReplicaKind::Diskful => volume.is_in_sync(replica.node),
                ReplicaKind::Tiebreaker => true,
                ReplicaKind::Diskless => false,
            })
            .count();
        QuorumCount {
            voters: voters.len(),
            majority: voters.len() / 2 + 1,
            up_to_date,
        }
    }

    /// The one word for `volume`; see [`VolumeHealth`] for each.
    pub fn volume_health(&self, volume: &VolumeRecord) -> VolumeHealth {
        if volume.deleting {
            return VolumeHealth::Deleting;
        }
        let diskful: Vec<_> = volume.diskful().collect();
        let usable = diskful
            .iter()
            .filter(|replica| replica.observed == ReplicaObserved::Ready)
            .filter(|replica| self.node_online(replica.node))
            .count();
        let failed = diskful
            .iter()
            .any(|replica| matches!(replica.observed, ReplicaObserved::Failed(_)));
        if usable == 0 && failed {
            return VolumeHealth::Failed;
        }
        if !self.quorum_count(volume).has_quorum() {
            return VolumeHealth::NoQuorum;
        }
        // A replica pending on an offline node will not be made soon.
        let pending = diskful.iter().any(|replica| {
            replica.observed == ReplicaObserved::Pending && self.node_online(replica.node)
        });
        if pending && !failed {
            return VolumeHealth::Creating;
        }
        let behind = diskful
            .iter()
            .filter(|replica| !volume.is_in_sync(replica.node));
        if behind.clone().any(|replica| replica.sync.is_some()) {
            return VolumeHealth::Syncing;
        }
        let up_to_date = diskful
            .iter()
            .filter(|replica| volume.is_in_sync(replica.node))
            .filter(|replica| replica.observed == ReplicaObserved::Ready)
            .filter(|replica| self.node_online(replica.node))
            .count();
        if up_to_date < diskful.len().max(volume.replica_target) {
            return VolumeHealth::Degraded;
        }
        VolumeHealth::Ready
    }
}
