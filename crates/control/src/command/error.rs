//! Why a command was refused, in words shown to people as they are.

use serde::{Deserialize, Serialize};
use trireme_types::{Generation, NodeId, VolumeSizeError};

/// The ways out of an attach refused because the volume's primary is on a
/// node still counted online, the failover's first: whoever attaches
/// elsewhere is usually restarting a VM whose machine died.
pub fn takeover_advice(name: &str, primary: &str) -> String {
    format!(
        "If '{primary}' is down, attach again once it is marked offline: the attach then takes the volume over and fences '{primary}' (or pass --force-takeover now if you know it is dead). If a VM is moving there, pass --allow-two-primaries; to move a stopped VM, detach it there first (`trireme volume detach {name}`)"
    )
}

/// Why a command was refused. The text is shown to people as is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum CommandError {
    #[error("the cluster is not created yet")]
    NotBootstrapped,
    #[error("the cluster already exists (id {cluster_id})")]
    AlreadyBootstrapped { cluster_id: String },
    #[error("a node named '{name}' is already a member; give the new node another --name")]
    NodeNameTaken { name: String },
    #[error("this join request was already used; ask a member for a fresh join (the CLI makes a new one each time)")]
    JoinReplayed,
    #[error("no node with id {node} in the cluster")]
    UnknownNode { node: NodeId },
    #[error("node '{node}' holds the last up-to-date replica of {volumes}; add replicas elsewhere or delete the volumes first")]
    LastReplica { node: String, volumes: String },
    #[error("a volume named '{name}' already exists")]
    VolumeExists { name: String },
    #[error("no volume named '{name}'")]
    UnknownVolume { name: String },
    #[error("volume '{name}' is being deleted")]
    VolumeDeleting { name: String },
    #[error("no resource group named '{name}'")]
    UnknownGroup { name: String },
    #[error("a resource group named '{name}' already exists")]
    GroupExists { name: String },
    #[error("resource group '{name}' is used by volumes {volumes}; delete them first")]
    GroupInUse { name: String, volumes: String },
    #[error("the default resource group cannot be deleted")]
    DefaultGroup,
    #[error("volume '{name}' is {current} bytes; a volume can only grow (asked for {requested})")]
    ShrinkRefused {
        name: String,
        current: u64,
        requested: u64,
    },
    #[error("cannot place volume '{name}': {reason}")]
    Placement { name: String, reason: String },
    #[error("node '{node}' is {state}; attach the volume on an online node")]
    NodeNotOnline { node: String, state: String },
    /// The primary's node is online as far as the control plane knows: a
    /// live migration passes --allow-two-primaries; a failover waits until
    /// the node is marked offline, or forces the takeover. The node's API
    /// adds when the node was last heard from.
    #[error("volume '{name}' is attached on node '{primary}', which the cluster still counts as online. {}", takeover_advice(.name, .primary))]
    AlreadyAttached { name: String, primary: String },
    #[error("volume '{name}' already has two primaries ({primaries}); detach one of them first (`trireme volume detach {name} --node NODE`)")]
    TwoPrimaries { name: String, primaries: String },
    #[error("volume '{name}' has no up-to-date replica, so no node can serve its data; start the node that held its last up-to-date replica again")]
    NoUpToDateReplica { name: String },
    #[error("volume '{name}' is not attached")]
    NotAttached { name: String },
    #[error("node '{node}' is not a primary of volume '{name}' (attached on: {primaries})")]
    NotPrimary {
        name: String,
        node: String,
        primaries: String,
    },
    #[error(
        "volume '{name}' is attached on two nodes ({primaries}); say which to detach with --node"
    )]
    WhichPrimary { name: String, primaries: String },
    #[error("volume '{name}' is at generation {current}, not {given}: a former primary cannot change which replicas are up to date")]
    StaleGeneration {
        name: String,
        given: Generation,
        current: Generation,
    },
    #[error("node '{node}' holds the last up-to-date replica of volume '{name}'; add a replica elsewhere (`trireme volume replica add {name}`) and wait until it is in sync (`trireme volume show {name} --wait`) first")]
    LastInSync { name: String, node: String },
    #[error("node '{node}' holds no diskful replica of volume '{name}' (see `trireme volume show {name}`)")]
    NoDiskfulReplica { name: String, node: String },
    #[error("node '{node}' already holds a diskful replica of volume '{name}'; name another node, or leave out --node to let the placer choose")]
    ReplicaExists { name: String, node: String },
    #[error("removing the replica on '{node}' would leave volume '{name}' without quorum: {up_to_date} of its {voters} remaining voters would be up to date or tiebreaker, and a majority is {majority}; wait until the other replicas are in sync (`trireme volume show {name} --wait`)")]
    WouldLoseQuorum {
        name: String,
        node: String,
        up_to_date: usize,
        voters: usize,
        majority: usize,
    },
    #[error("volume '{name}' is attached on {primaries}; detach it first (`trireme volume detach {name}`)")]
    VolumeAttached { name: String, primaries: String },
    #[error("volume '{volume}' already has a snapshot named '{name}'")]
    SnapshotExists { volume: String, name: String },
    #[error(
        "volume '{volume}' has no snapshot named '{name}' (see `trireme snapshot list {volume}`)"
    )]
    UnknownSnapshot { volume: String, name: String },
    #[error("volume '{name}' is being rolled back on {nodes} node(s); wait until it is done (`trireme volume show {name}`)")]
    RollbackPending { name: String, nodes: usize },
    #[error("the replicas of volume '{name}' have not yet confirmed that it is detached; retry in a few seconds")]
    NotFenced { name: String },
    #[error("node '{node}' holds the last copy of snapshot(s) {snapshots} of volume '{name}'; delete them first (`trireme snapshot delete {name} SNAPSHOT`)")]
    LastSnapshotCopy {
        name: String,
        node: String,
        snapshots: String,
    },
    #[error("volume '{name}': {problem}")]
    InvalidSize {
        name: String,
        problem: VolumeSizeError,
    },
    #[error("volume '{name}' has snapshot(s) {snapshots}; deleting it deletes them too: delete them first (`trireme snapshot delete {name} SNAPSHOT`), or say so with `trireme volume delete {name} --with-snapshots`{clones}")]
    HasSnapshots {
        name: String,
        snapshots: String,
        /// The clones made from them, which keep their data either way.
        clones: String,
    },
    #[error("volume(s) {clones} are being made from snapshots of volume '{name}' and still read their data from it: wait until they are ready (`trireme volume show CLONE --wait`), or delete them (`trireme volume delete CLONE`), then delete '{name}'")]
    ClonesBeingMade { name: String, clones: String },
    #[error("{0}")]
    Invalid(String),
}
