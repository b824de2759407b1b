//! The replicated cluster state: what every node holds a copy of.
//!
//! Everything here changes only through commands (`Command`) applied
//! in log order, so every node that applied the same log holds the same
//! state. Times are milliseconds since the Unix epoch, chosen by whoever
//! proposed the command: applying never reads a clock.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use trireme_types::{DeviceClass, Generation, GroupName, NodeId, NodeName, PoolName, VolumeName};

use crate::placer::{Candidate, CandidatePool, Placement};

pub mod snapshot;
use snapshot::{CloneOrigin, Rollback, SnapshotRecord, SnapshotSchedule};

/// The resource group a volume uses when the request names none.
pub const DEFAULT_GROUP: &str = "default";
/// Place-count of the default group: three replicas, the usual DRBD/LINSTOR
/// choice that survives one failure with quorum to spare.
pub const DEFAULT_PLACE_COUNT: usize = 3;
/// How long a join request's timestamp stays acceptable; the nonces seen in
/// this window are remembered, so a replayed join is refused.
pub const JOIN_WINDOW_MS: u64 = 10 * 60 * 1000;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterState {
    /// Empty until the bootstrap command is applied.
    pub cluster_id: String,
    pub created_ms: u64,
    pub next_node_id: u64,
    pub next_volume_id: u64,
    /// Snapshot ids are never reused (0 in states from before snapshots:
    /// the first id is 1).
    #[serde(default)]
    pub next_snapshot_id: u64,
    pub nodes: BTreeMap<NodeId, NodeRecord>,
    pub groups: BTreeMap<GroupName, ResourceGroup>,
    pub volumes: BTreeMap<VolumeName, VolumeRecord>,
    pub settings: ClusterSettings,
    /// The secret that join tokens carry; every member may verify a join.
    pub join_secret: String,
    /// Join nonces accepted within [`JOIN_WINDOW_MS`], with their times.
    pub join_nonces: BTreeMap<String, u64>,
    /// The last events (`crate::events`); empty in states from before it.
    #[serde(default)]
    pub events: crate::events::EventLog,
    /// Rules `apply` is told to break (the simulator's): never stored or
    /// sent, off unless set.
    #[cfg(feature = "bug-switches")]
    #[serde(skip)]
    bugs: ControlBugs,
}

/// Rules `apply` can be told to break, to show that the replication
/// simulator catches each (crates/sim's bug-switch tests). Off by default;
/// only with the `bug-switches` feature.
#[cfg(feature = "bug-switches")]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ControlBugs {
    /// `MarkOutdated` and `MarkInSync` are applied without their fencing
    /// check: from a node that is no longer a primary, or at a generation
    /// that is no longer current.
    pub skip_fence_check: bool,
    /// A replica's ready report is taken whatever size its copy had when
    /// it was made (before a grow committed, say).
    pub ready_ignores_size: bool,
}

impl ClusterState {
    #[cfg(feature = "bug-switches")]
    pub fn set_bugs(&mut self, bugs: ControlBugs) {
        self.bugs = bugs;
    }

    /// Whether the fencing check of the in-sync marks is skipped (a bug
    /// switch; never without the feature).
    pub(crate) fn skips_fence_check(&self) -> bool {
        #[cfg(feature = "bug-switches")]
        return self.bugs.skip_fence_check;
        #[cfg(not(feature = "bug-switches"))]
        false
    }

    /// Whether a ready report of a copy smaller than the volume is taken
    /// as ready (a bug switch; never without the feature).
    pub(crate) fn ready_ignores_size(&self) -> bool {
        #[cfg(feature = "bug-switches")]
        return self.bugs.ready_ignores_size;
        #[cfg(not(feature = "bug-switches"))]
        false
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    Online,
    Offline,
    /// Offline for longer than the eviction delay: its replicas were placed
    /// elsewhere. It becomes online again when it heartbeats.
    Evicted,
}

impl NodeState {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Online => "online",
            NodeState::Offline => "offline",
            NodeState::Evicted => "evicted",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRecord {
    pub id: NodeId,
    pub name: NodeName,
    /// `HOST:PORT` of the node's REST API; node-to-node requests use it too.
    pub api_address: String,
    /// `HOST:PORT` of the node's NBD server, if it serves TCP.
    pub nbd_address: Option<String>,
    /// `HOST:PORT` of the node's replication listener, where primaries send
    /// a volume's writes and resyncs. Absent in states written before it
    /// existed, until the node reports it (`Command::SetDataAddress`).
    #[serde(default)]
    pub data_address: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub state: NodeState,
    pub state_since_ms: u64,
    pub joined_ms: u64,
    pub pools: BTreeMap<PoolName, PoolRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolRecord {
    pub class: DeviceClass,
    pub capacity_bytes: u64,
    pub free_bytes: u64,
    pub online: bool,
    pub reported_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum QuorumPolicy {
    /// Writes fail with EIO while the volume has no quorum.
    IoError,
    /// Writes wait until quorum returns.
    Suspend,
}

impl QuorumPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            QuorumPolicy::IoError => "io-error",
            QuorumPolicy::Suspend => "suspend",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceGroup {
    pub name: GroupName,
    pub place_count: usize,
    /// Fewest diskful replicas a new volume may start with. The default
    /// group uses 1, so a one- or two-node cluster can create volumes; other
    /// groups use their place-count unless told otherwise.
    pub min_place_count: usize,
    /// Only these pools (by name) qualify; empty means any.
    pub pools: Vec<PoolName>,
    pub class: Option<DeviceClass>,
    /// Label keys (e.g. `zone`, `rack`): no two diskful replicas share a value.
    pub replicas_on_different: Vec<String>,
    pub diskless_on_remaining: bool,
    pub on_no_quorum: QuorumPolicy,
}

impl ResourceGroup {
    pub fn default_group() -> Self {
        ResourceGroup {
            name: GroupName::new(DEFAULT_GROUP).expect("the default group's name is valid"),
            place_count: DEFAULT_PLACE_COUNT,
            min_place_count: 1,
            pools: Vec::new(),
            class: None,
            replicas_on_different: Vec::new(),
            diskless_on_remaining: false,
            on_no_quorum: QuorumPolicy::IoError,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReplicaKind {
    /// Holds a full copy of the data.
    Diskful,
    /// A member without data (serves I/O through its peers).
    Diskless,
    /// A diskless member that only votes, so an even number of diskful
    /// replicas keeps a majority when one is lost.
    Tiebreaker,
}

impl ReplicaKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ReplicaKind::Diskful => "diskful",
            ReplicaKind::Diskless => "diskless",
            ReplicaKind::Tiebreaker => "tiebreaker",
        }
    }
}

/// What the replica's node last reported about it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", tag = "state", content = "message")]
pub enum ReplicaObserved {
    /// Placed, not yet reported by its node.
    Pending,
    Ready,
    Failed(ReplicaFailure),
}

/// Why a node could not make its replica, as it reported it: classified
/// where the error was still typed, so no reader has to search the text.
///
/// Untagged: a failure of no known class is its message alone, as every
/// failure was before the classes existed, so older logs and snapshots
/// read the same.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ReplicaFailure {
    /// The pool, or the file system under it, has no room left.
    NoSpace {
        pool: PoolName,
        message: String,
    },
    Other(String),
}

impl ReplicaFailure {
    pub fn message(&self) -> &str {
        match self {
            ReplicaFailure::NoSpace { message, .. } | ReplicaFailure::Other(message) => message,
        }
    }
}

impl std::fmt::Display for ReplicaFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

impl From<String> for ReplicaFailure {
    fn from(message: String) -> Self {
        ReplicaFailure::Other(message)
    }
}

impl From<&str> for ReplicaFailure {
    fn from(message: &str) -> Self {
        ReplicaFailure::Other(message.to_string())
    }
}

/// How far a running resync of one replica has got, as the data path last
/// reported it (`Command::ReportSync`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncProgress {
    pub done_bytes: u64,
    pub total_bytes: u64,
    pub rate_bytes_per_sec: u64,
    /// When the proposer measured it.
    pub reported_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaRecord {
    pub node: NodeId,
    pub kind: ReplicaKind,
    /// The pool holding a diskful replica.
    pub pool: Option<PoolName>,
    pub observed: ReplicaObserved,
    /// Bytes allocated in the pool, as last reported.
    pub allocated_bytes: u64,
    /// A running resync of this (diskful) replica; cleared when it is
    /// marked in sync.
    #[serde(default)]
    pub sync: Option<SyncProgress>,
}

/// A node where a volume is attached: it runs the volume's engine and
/// serves it (over NBD) to its clients.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PrimaryRecord {
    pub node: NodeId,
    /// When this node's current engine took the role (attach or reattach).
    pub since_ms: u64,
    /// Not attached: the node of an up-to-date replica runs the engine of
    /// a detached volume only to resync its outdated replicas
    /// (`Command::StartResync`). It serves no client, and gives
    /// way to any attach (which moves the generation on and so fences it).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub resync_only: bool,
}

/// The most primaries a volume may have: two only while a VM migrates.
pub const MAX_PRIMARIES: usize = 2;

/// The generation of a newly created volume.
pub const FIRST_GENERATION: Generation = Generation(1);

fn first_generation() -> Generation {
    FIRST_GENERATION
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VolumeRecord {
    pub id: u64,
    pub name: VolumeName,
    pub size_bytes: u64,
    pub group: GroupName,
    pub created_ms: u64,
    /// Set by a delete: nodes remove their replicas, then the record goes.
    pub deleting: bool,
    pub replicas: Vec<ReplicaRecord>,
    /// The volume's data-history id: moves forward when a primary takes
    /// over with no other primary (attach) or restarts its engine
    /// (reattach). Replicas refuse writes of an older generation, and the
    /// in-sync set only shrinks by a command carrying the current one.
    pub generation: Generation,
    /// Where the volume is attached (at most [`MAX_PRIMARIES`]).
    pub primaries: Vec<PrimaryRecord>,
    /// The nodes whose diskful replica is known to hold every acknowledged
    /// write. The control plane is the arbiter: a replica leaves the set
    /// only by a command of a current primary carrying the current
    /// generation, and joins it when the data path reports it synced.
    pub in_sync: BTreeSet<NodeId>,
    /// Its snapshots, oldest first.
    pub snapshots: Vec<SnapshotRecord>,
    pub schedule: Option<SnapshotSchedule>,
    pub rollback: Option<Rollback>,
    /// Set on a clone: the snapshot its first replicas were made from.
    pub origin: Option<CloneOrigin>,
    /// While detached: the nodes whose replica has fenced the current
    /// generation (no primary of it can write there any more).
    pub fenced: BTreeSet<NodeId>,
    /// How many diskful replicas the volume should have: what it was
    /// placed with, moved by `replica add` and `replica remove`. A node's
    /// removal or eviction does not lower it, so the leader places the
    /// missing replicas again once nodes can take them
    /// (`Command::RestorePlacement`).
    pub replica_target: usize,
    /// Nodes whose diskful replica an admin removed (`replica remove`):
    /// they are made the volume's tiebreaker only when no other node can
    /// be, and give that seat up once another node can take it. A node
    /// leaves the set when it holds a diskful replica again.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub replica_removed_from: BTreeSet<NodeId>,
}

/// [`VolumeRecord`] as stored: fields added later are optional, so that
/// snapshots written before them still load.
#[derive(Deserialize)]
struct StoredVolumeRecord {
    id: u64,
    name: VolumeName,
    size_bytes: u64,
    group: GroupName,
    created_ms: u64,
    deleting: bool,
    replicas: Vec<ReplicaRecord>,
    #[serde(default = "first_generation")]
    generation: Generation,
    #[serde(default)]
    primaries: Vec<PrimaryRecord>,
    /// `None` in states written before in-sync tracking existed.
    #[serde(default)]
    in_sync: Option<BTreeSet<NodeId>>,
    #[serde(default)]
    snapshots: Vec<SnapshotRecord>,
    #[serde(default)]
    schedule: Option<SnapshotSchedule>,
    #[serde(default)]
    rollback: Option<Rollback>,
    #[serde(default)]
    origin: Option<CloneOrigin>,
    #[serde(default)]
    fenced: BTreeSet<NodeId>,
    /// `None` in states written before it existed.
    #[serde(default)]
    replica_target: Option<usize>,
    #[serde(default)]
    replica_removed_from: BTreeSet<NodeId>,
}

impl From<StoredVolumeRecord> for VolumeRecord {
    fn from(stored: StoredVolumeRecord) -> Self {
        // Before in-sync tracking, a volume was served only where its one
        // replica lived, and volumes with several replicas were placed but
        // never served: every diskful replica holds the volume's data.
        let in_sync = stored.in_sync.unwrap_or_else(|| {
            stored
                .replicas
                .iter()
                .filter(|replica| replica.kind == ReplicaKind::Diskful)
                .map(|replica| replica.node)
                .collect()
        });
        let diskful_count = stored
            .replicas
            .iter()
            .filter(|replica| replica.kind == ReplicaKind::Diskful)
            .count();
        VolumeRecord {
            id: stored.id,
            name: stored.name,
            size_bytes: stored.size_bytes,
            group: stored.group,
            created_ms: stored.created_ms,
            deleting: stored.deleting,
            replicas: stored.replicas,
            generation: stored.generation,
            primaries: stored.primaries,
            in_sync,
            snapshots: stored.snapshots,
            schedule: stored.schedule,
            rollback: stored.rollback,
            origin: stored.origin,
            fenced: stored.fenced,
            // Before the target existed, what a volume lost was never
            // placed again: its replicas now are all it is known to want.
            replica_target: stored.replica_target.unwrap_or(diskful_count),
            replica_removed_from: stored.replica_removed_from,
        }
    }
}

impl<'de> Deserialize<'de> for VolumeRecord {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        StoredVolumeRecord::deserialize(deserializer).map(VolumeRecord::from)
    }
}

impl VolumeRecord {
    pub fn replica(&self, node: NodeId) -> Option<&ReplicaRecord> {
        self.replicas.iter().find(|replica| replica.node == node)
    }

    pub fn diskful(&self) -> impl Iterator<Item = &ReplicaRecord> {
        self.replicas
            .iter()
            .filter(|replica| replica.kind == ReplicaKind::Diskful)
    }

    /// Whether `node` holds a diskful replica.
    pub fn is_diskful_on(&self, node: NodeId) -> bool {
        self.replica(node)
            .is_some_and(|replica| replica.kind == ReplicaKind::Diskful)
    }

    /// The members that vote on the volume's quorum: the diskful replicas
    /// and the tiebreaker, in replica order.
    pub fn voters(&self) -> Vec<NodeId> {
        self.replicas
            .iter()
            .filter(|replica| {
                matches!(replica.kind, ReplicaKind::Diskful | ReplicaKind::Tiebreaker)
            })
            .map(|replica| replica.node)
            .collect()
    }

    /// How many voters make a majority.
    pub fn quorum_size(&self) -> usize {
        self.voters().len() / 2 + 1
    }

    pub fn is_primary(&self, node: NodeId) -> bool {
        self.primaries.iter().any(|primary| primary.node == node)
    }

    /// It has a primary: attached, or resyncing while detached (fencing
    /// and snapshots treat both alike: an engine runs).
    pub fn is_attached(&self) -> bool {
        !self.primaries.is_empty()
    }

    /// The node running a resync-only engine of this detached volume.
    pub fn resync_driver(&self) -> Option<NodeId> {
        match self.primaries.as_slice() {
            [only] if only.resync_only => Some(only.node),
            _ => None,
        }
    }

    /// `node` is a primary a client attached (not a resync driver).
    pub fn is_attached_on(&self, node: NodeId) -> bool {
        self.primaries
            .iter()
            .any(|primary| primary.node == node && !primary.resync_only)
    }

    pub fn is_in_sync(&self, node: NodeId) -> bool {
        self.in_sync.contains(&node)
    }

    pub fn placement(&self) -> Placement {
        Placement {
            diskful: self
                .diskful()
                .map(|replica| {
                    (
                        replica.node,
                        replica.pool.clone().expect("a diskful replica has a pool"),
                    )
                })
                .collect(),
            tiebreaker: self
                .replicas
                .iter()
                .find(|replica| replica.kind == ReplicaKind::Tiebreaker)
                .map(|replica| replica.node),
            diskless: self
                .replicas
                .iter()
                .filter(|replica| replica.kind == ReplicaKind::Diskless)
                .map(|replica| replica.node)
                .collect(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterSettings {
    /// Re-place the replicas of a node offline for longer than the delay.
    pub eviction_enabled: bool,
    pub eviction_delay_secs: u64,
    /// Bytes per second one volume's resyncs (and verify) may copy, so
    /// that application I/O keeps priority. Absent in states written
    /// before it existed: the default then.
    #[serde(default = "default_resync_rate")]
    pub resync_rate_bytes_per_sec: u64,
}

/// A resync's default rate: a quarter of a SATA SSD's bandwidth, so that a
/// returning replica catches up within minutes without starving the VMs.
pub const DEFAULT_RESYNC_RATE: u64 = 256 << 20;
/// The slowest resync rate accepted: slower would leave a replica
/// outdated (and the volume one failure from data loss) for days.
pub const MIN_RESYNC_RATE: u64 = 1 << 20;

fn default_resync_rate() -> u64 {
    DEFAULT_RESYNC_RATE
}

impl Default for ClusterSettings {
    fn default() -> Self {
        // Off by default: moving a volume's data is expensive, and an hour
        // covers a reboot or a kernel update.
        ClusterSettings {
            eviction_enabled: false,
            eviction_delay_secs: 3600,
            resync_rate_bytes_per_sec: DEFAULT_RESYNC_RATE,
        }
    }
}

impl ClusterState {
    pub fn node_by_name(&self, name: &NodeName) -> Option<&NodeRecord> {
        self.nodes.values().find(|node| &node.name == name)
    }

    pub fn node_name(&self, id: NodeId) -> String {
        self.nodes
            .get(&id)
            .map(|node| node.name.to_string())
            .unwrap_or_else(|| format!("node-{id}"))
    }

    /// Volumes with a replica of any kind on `node`.
    pub fn volumes_on(&self, node: NodeId) -> impl Iterator<Item = &VolumeRecord> {
        self.volumes
            .values()
            .filter(move |volume| volume.replica(node).is_some())
    }
}

impl ClusterState {
    /// The nodes as the placer sees them.
    pub fn candidates(&self) -> Vec<Candidate> {
        self.nodes
            .values()
            .map(|node| Candidate {
                id: node.id,
                name: node.name.clone(),
                labels: node.labels.clone(),
                online: node.state == NodeState::Online,
                evicted: node.state == NodeState::Evicted,
                pools: node
                    .pools
                    .iter()
                    .filter(|(_, pool)| pool.online)
                    .map(|(name, pool)| CandidatePool {
                        name: name.clone(),
                        class: pool.class,
                        capacity_bytes: pool.capacity_bytes,
                        free_bytes: pool.free_bytes,
                    })
                    .collect(),
            })
            .collect()
    }

    /// The resource group of a volume (the default one if it went missing,
    /// which the invariants rule out).
    pub(crate) fn group_of(&self, volume: &VolumeRecord) -> ResourceGroup {
        self.groups
            .get(&volume.group)
            .cloned()
            .unwrap_or_else(ResourceGroup::default_group)
    }

    /// What must hold after every command; checked by `apply`.
    pub fn check_invariants(&self) -> Result<(), String> {
        self.events.check()?;
        let mut names = std::collections::BTreeSet::new();
        for (id, node) in &self.nodes {
            if *id != node.id {
                return Err(format!("node {id} is recorded with id {}", node.id));
            }
            if !names.insert(&node.name) {
                return Err(format!("two nodes are named {}", node.name));
            }
            if node.id.0 >= self.next_node_id {
                return Err(format!("node id {} is not below the next id", node.id));
            }
        }
        for (name, volume) in &self.volumes {
            if name != &volume.name {
                return Err(format!("volume {name} is recorded as {}", volume.name));
            }
            if !self.groups.contains_key(&volume.group) {
                return Err(format!("volume {name} uses a missing group"));
            }
            let mut holders = std::collections::BTreeSet::new();
            for replica in &volume.replicas {
                if !holders.insert(replica.node) {
                    return Err(format!(
                        "volume {name} has two replicas on {}",
                        replica.node
                    ));
                }
                if !self.nodes.contains_key(&replica.node) {
                    return Err(format!("volume {name} has a replica on a removed node"));
                }
                if (replica.kind == ReplicaKind::Diskful) != replica.pool.is_some() {
                    return Err(format!("volume {name}: only diskful replicas name a pool"));
                }
            }
            if volume.deleting && volume.replicas.is_empty() {
                return Err(format!("deleted volume {name} is still recorded"));
            }
            for replica in &volume.replicas {
                if replica.sync.is_some() && replica.kind != ReplicaKind::Diskful {
                    return Err(format!(
                        "volume {name}: a {} replica has resync progress",
                        replica.kind.as_str()
                    ));
                }
            }
            if volume.generation < FIRST_GENERATION {
                return Err(format!("volume {name} has generation 0"));
            }
            if volume.primaries.len() > MAX_PRIMARIES {
                return Err(format!(
                    "volume {name} has {} primaries",
                    volume.primaries.len()
                ));
            }
            let mut primaries = BTreeSet::new();
            for primary in &volume.primaries {
                if !primaries.insert(primary.node) {
                    return Err(format!(
                        "volume {name} lists primary {} twice",
                        primary.node
                    ));
                }
                if !self.nodes.contains_key(&primary.node) {
                    return Err(format!("volume {name} is attached on a removed node"));
                }
            }
            if let Some(stray) = volume
                .in_sync
                .iter()
                .find(|node| !volume.is_diskful_on(**node))
            {
                return Err(format!(
                    "volume {name}: node {stray} is in sync without a diskful replica"
                ));
            }
            if volume.in_sync.is_empty() && (volume.is_attached() || !volume.deleting) {
                return Err(format!("volume {name} has no up-to-date replica"));
            }
            if !volume.deleting && !(1..=MAX_PLACE_COUNT).contains(&volume.replica_target) {
                return Err(format!(
                    "volume {name} wants {} diskful replicas",
                    volume.replica_target
                ));
            }
            if volume.deleting && volume.is_attached() {
                return Err(format!("volume {name} is attached while being deleted"));
            }
        }
        self.check_snapshot_invariants()
    }
}

/// The names of the ready snapshots of `volume` whose only copy is on `node`.
pub(crate) fn last_snapshot_copies(volume: &VolumeRecord, node: NodeId) -> Vec<String> {
    volume
        .snapshots
        .iter()
        .filter(|snapshot| {
            snapshot.is_ready()
                && snapshot.nodes.contains(&node)
                && snapshot.nodes.iter().all(|holder| *holder == node)
        })
        .map(|snapshot| snapshot.name.to_string())
        .collect()
}

/// Whether a diskful replica of `volume` on a node other than `node` is ready.
pub(crate) fn has_other_ready(volume: &VolumeRecord, node: NodeId) -> bool {
    volume
        .diskful()
        .any(|replica| replica.node != node && replica.observed == ReplicaObserved::Ready)
}

/// Whether a node other than `node` holds an up-to-date replica of `volume`.
pub(crate) fn has_other_in_sync(volume: &VolumeRecord, node: NodeId) -> bool {
    volume.in_sync.iter().any(|holder| *holder != node)
}

/// The most diskful replicas a volume may have.
pub const MAX_PLACE_COUNT: usize = 7;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_reads_as_before_and_its_class_survives_the_log() {
        // What every node wrote before failures had classes.
        let old: ReplicaObserved =
            serde_json::from_str(r#"{"state":"failed","message":"disk on fire"}"#).unwrap();
        assert_eq!(old, ReplicaObserved::Failed("disk on fire".into()));
        assert_eq!(
            serde_json::to_string(&old).unwrap(),
            r#"{"state":"failed","message":"disk on fire"}"#
        );
        let full = ReplicaObserved::Failed(ReplicaFailure::NoSpace {
            pool: PoolName::new("fast").unwrap(),
            message: "pool 'fast' has no room".into(),
        });
        let text = serde_json::to_string(&full).unwrap();
        assert_eq!(
            serde_json::from_str::<ReplicaObserved>(&text).unwrap(),
            full
        );
    }
}
