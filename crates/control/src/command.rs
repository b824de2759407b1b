//! The commands of the replicated log and how each changes [`ClusterState`].
//!
//! [`ClusterState::apply`] is a pure function of the state and the command:
//! no clock, no randomness, no I/O. That is what lets every node hold the
//! same state, and lets tests drive it without a cluster.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use trireme_types::{
    check_volume_size, Generation, GroupName, NodeId, NodeName, PoolName, SnapshotId, SnapshotName,
    VolumeName, VolumeSizeError,
};

use crate::model::*;

mod event_record;
use crate::placer::{self, Candidate, CandidatePool};

/// What a node says about itself when it creates or joins the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRegistration {
    pub name: NodeName,
    pub api_address: String,
    pub nbd_address: Option<String>,
    /// `HOST:PORT` of the node's replication listener.
    #[serde(default)]
    pub data_address: Option<String>,
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolReport {
    pub name: PoolName,
    pub record: PoolRecord,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// The first entry of a cluster's log: its id and its first node (id 1).
    Bootstrap {
        cluster_id: String,
        join_secret: String,
        node: NodeRegistration,
        now_ms: u64,
    },
    /// A verified join; `nonce` is remembered so the same join cannot be
    /// replayed.
    AddNode {
        node: NodeRegistration,
        nonce: String,
        now_ms: u64,
    },
    RemoveNode {
        node: NodeId,
    },
    SetNodeState {
        node: NodeId,
        state: NodeState,
        now_ms: u64,
    },
    /// A node's full list of pools, replacing what was recorded.
    ReportPools {
        node: NodeId,
        pools: Vec<PoolReport>,
    },
    CreateGroup {
        group: ResourceGroup,
    },
    DeleteGroup {
        name: GroupName,
    },
    /// Replace a resource group's settings (its name stays), validated as
    /// at creation. Replicas already placed stay where they are: `status`
    /// names the volumes that no longer satisfy the group.
    ModifyGroup {
        group: ResourceGroup,
    },
    /// Replace a node's placement labels (through the API, or the node
    /// itself when restarted with other `--label`s). Replicas stay where
    /// they are; `status` names the volumes whose placement broke.
    SetNodeLabels {
        node: NodeId,
        labels: BTreeMap<String, String>,
    },
    CreateVolume {
        name: VolumeName,
        size_bytes: u64,
        group: Option<GroupName>,
        /// Overrides the group's place-count.
        replicas: Option<usize>,
        /// Manual placement: exactly these nodes hold diskful replicas.
        nodes: Option<Vec<NodeName>>,
        /// Only pools of this name qualify (instead of the group's pools).
        pool: Option<PoolName>,
        /// Registers a replica that already exists on this node and pool
        /// (a volume made before the node was part of a cluster).
        adopt: Option<(NodeId, PoolName)>,
        now_ms: u64,
    },
    GrowVolume {
        name: VolumeName,
        size_bytes: u64,
    },
    /// Delete a volume. Refused while it has snapshots unless
    /// `with_snapshots` (they go with it), and while clones are being made
    /// from them.
    DeleteVolume {
        name: VolumeName,
        #[serde(default)]
        with_snapshots: bool,
    },
    /// A node's agent reports what it observed about one of its replicas.
    ReportReplica {
        volume: VolumeName,
        volume_id: u64,
        node: NodeId,
        observed: ReplicaObserved,
        allocated_bytes: u64,
    },
    /// A node's agent removed its replica of a deleted volume.
    ReplicaRemoved {
        volume: VolumeName,
        volume_id: u64,
        node: NodeId,
    },
    SetSettings {
        settings: ClusterSettings,
    },
    /// Re-place the replicas of a node that stayed offline too long.
    EvictNode {
        node: NodeId,
        now_ms: u64,
    },
    /// A node reports (or changes) the address of its replication listener,
    /// e.g. after an upgrade or a restart on another port.
    SetDataAddress {
        node: NodeId,
        data_address: Option<String>,
    },
    /// Make `node` a primary of the volume. With no other primary the
    /// generation moves forward (the new primary fences every older one);
    /// a second primary (`allow_two_primaries`, a live migration) shares
    /// the current generation. A primary whose node is not online, or any
    /// primary with `force_takeover`, is taken over: it stops being a
    /// primary and the generation moves forward, which fences it (a
    /// failover in one step). Replies [`Reply::Attached`].
    AttachVolume {
        name: VolumeName,
        node: NodeId,
        allow_two_primaries: bool,
        /// Take over from a primary whose node is still online (its
        /// machine is known to be dead but not yet marked offline).
        #[serde(default)]
        force_takeover: bool,
        now_ms: u64,
    },
    /// A primary restarted its engine: the generation moves forward, so
    /// writes of its former incarnation are refused. Replies
    /// [`Reply::Generation`].
    ReattachVolume {
        name: VolumeName,
        node: NodeId,
        now_ms: u64,
    },
    /// The node of an up-to-date replica of a detached volume starts a
    /// resync-only engine, to copy the data to the outdated replicas
    /// (nothing else would while no VM runs). Like an attach, the
    /// generation moves forward (the engine is a primary for the replicas
    /// and the in-sync set); unlike one, it serves no client and any
    /// attach replaces it. Refused unless the volume is detached, `node`
    /// holds an up-to-date replica and some replica is outdated. Replies
    /// [`Reply::Generation`].
    StartResync {
        name: VolumeName,
        node: NodeId,
        now_ms: u64,
    },
    /// The resync-only engine of `node` at `generation` is done (or can do
    /// nothing more): the volume is detached again. A no-op when an attach
    /// replaced it meanwhile. The generation stays.
    EndResync {
        name: VolumeName,
        node: NodeId,
        generation: Generation,
    },
    /// Stop being a primary on `node`; `None` when the volume has one
    /// primary. The generation stays.
    DetachVolume {
        name: VolumeName,
        node: Option<NodeId>,
    },
    /// A primary (`by`) tells that the replica on `node` missed writes.
    /// Refused unless `generation` is the volume's current one: a cut-off
    /// former primary can never shrink the in-sync set.
    MarkOutdated {
        name: VolumeName,
        generation: Generation,
        node: NodeId,
        by: NodeId,
    },
    /// A primary (`by`) tells that the replica on `node` has caught up.
    MarkInSync {
        name: VolumeName,
        generation: Generation,
        node: NodeId,
        by: NodeId,
    },
    /// Progress of the resync of the replica on `node`; `None` when it
    /// stopped.
    ReportSync {
        name: VolumeName,
        node: NodeId,
        progress: Option<SyncProgress>,
    },
    /// Place one more diskful replica, on `node` or where the placer finds
    /// room (by the volume's group; `pool` restricts the pools). It is not
    /// in sync until the data path has copied the data to it.
    AddReplica {
        name: VolumeName,
        node: Option<NodeId>,
        pool: Option<PoolName>,
        now_ms: u64,
    },
    /// Drop the diskful replica on `node` (a primary keeps a diskless one).
    RemoveReplica {
        name: VolumeName,
        node: NodeId,
    },
    /// Place again what the volume lost (its tiebreaker, replicas lost
    /// with a removed or evicted node), as far as nodes can take it
    /// (`crate::repair`). Proposed by the leader; changes nothing when
    /// there is nothing to restore. Replies [`Reply::Volume`] when it
    /// changed the placement.
    RestorePlacement {
        name: VolumeName,
    },
    /// Take a snapshot of a volume: by its primary's engine when attached,
    /// by each fenced up-to-date replica's node when detached. Replies
    /// [`Reply::Snapshot`]; the snapshot is ready once reported taken.
    CreateSnapshot {
        volume: VolumeName,
        name: SnapshotName,
        /// Taken by the volume's schedule.
        scheduled: bool,
        now_ms: u64,
    },
    /// `from` took snapshot `id` on the replicas of `holders` (a primary:
    /// every replica its barrier reached), or failed with `error`.
    ReportSnapshot {
        volume: VolumeName,
        id: SnapshotId,
        from: NodeId,
        holders: BTreeSet<NodeId>,
        error: Option<String>,
    },
    /// Delete a snapshot: every node removes its copy.
    DeleteSnapshot {
        volume: VolumeName,
        name: SnapshotName,
    },
    /// `node` holds no copy of snapshot `id` any more.
    SnapshotRemoved {
        volume: VolumeName,
        id: SnapshotId,
        node: NodeId,
    },
    /// Snapshot space as a holder measured it: (id, exclusive, shared bytes).
    ReportSnapshotSpace {
        volume: VolumeName,
        spaces: Vec<(SnapshotId, u64, u64)>,
    },
    /// Make a detached volume's content a snapshot's again.
    RollbackVolume {
        volume: VolumeName,
        snapshot: SnapshotName,
    },
    /// `node` rolled its replica back to snapshot `snapshot`.
    RolledBack {
        volume: VolumeName,
        node: NodeId,
        snapshot: SnapshotId,
    },
    /// Take a snapshot every `every_secs` and keep the newest `keep`
    /// (`None`: no schedule).
    SetSnapshotSchedule {
        volume: VolumeName,
        schedule: Option<(u64, usize)>,
        now_ms: u64,
    },
    /// `node` fenced `generation` of a detached volume on its replica.
    ReportFenced {
        volume: VolumeName,
        node: NodeId,
        generation: Generation,
    },
    /// A new volume with the content of a snapshot: its replicas are made
    /// on the snapshot's nodes, sharing its chunks. Replies
    /// [`Reply::Volume`].
    CloneVolume {
        name: VolumeName,
        source: VolumeName,
        snapshot: SnapshotName,
        group: Option<GroupName>,
        now_ms: u64,
    },
    /// `command`, asked for by `actor` at `now_ms`: applied as it is, and
    /// what it did is added to the event log (`crate::events`). Every node
    /// proposes its writes this way; plain commands log nothing.
    Attributed {
        actor: crate::events::Actor,
        now_ms: u64,
        command: Box<Command>,
    },
    /// Something only a node sees (a verify's result): logged as it is,
    /// when attributed; changes nothing else.
    RecordEvent {
        event: crate::events::ReportedEvent,
    },
}

/// The ways out of an attach refused because the volume's primary is on a
/// node still counted online, the failover's first: whoever attaches
/// elsewhere is usually restarting a VM whose machine died.
pub fn takeover_advice(name: &str, primary: &str) -> String {
    format!(
        "If '{primary}' is down, attach again once it is marked offline: the attach then takes the volume over and fences '{primary}' (or pass --force-takeover now if you know it is dead). If a VM is moving there, pass --allow-two-primaries; to move a stopped VM, detach it there first (`trireme volume detach {name}`)"
    )
}

/// A primary that an attach took the volume over from: it is no longer a
/// primary, and the replicas refuse its writes once the new primary's
/// generation reaches them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FencedPrimary {
    pub node: NodeId,
    /// Its node's state when it was fenced (`Online` only with
    /// `force_takeover`).
    pub state: NodeState,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    Done,
    NodeAdded {
        node: NodeId,
    },
    Volume(Box<VolumeRecord>),
    Evicted {
        replaced: Vec<VolumeName>,
        degraded: Vec<VolumeName>,
    },
    /// The volume's generation after a reattach.
    Generation(Generation),
    /// The volume's generation after an attach, and the primaries it
    /// fenced (taken over from), each with its node's state then.
    Attached {
        generation: Generation,
        fenced: Vec<FencedPrimary>,
    },
    Snapshot(Box<crate::snapshot::SnapshotRecord>),
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

impl ClusterState {
    /// Applies one command. A refused command leaves the state unchanged.
    pub fn apply(&mut self, command: Command) -> Result<Reply, CommandError> {
        let bootstrap = match &command {
            Command::Attributed { command, .. } => matches!(**command, Command::Bootstrap { .. }),
            command => matches!(command, Command::Bootstrap { .. }),
        };
        if self.cluster_id.is_empty() && !bootstrap {
            return Err(CommandError::NotBootstrapped);
        }
        let reply = match command {
            Command::Bootstrap {
                cluster_id,
                join_secret,
                node,
                now_ms,
            } => self.bootstrap(cluster_id, join_secret, node, now_ms),
            Command::AddNode {
                node,
                nonce,
                now_ms,
            } => self.add_node(node, nonce, now_ms),
            Command::RemoveNode { node } => self.remove_node(node),
            Command::SetNodeState {
                node,
                state,
                now_ms,
            } => self.set_node_state(node, state, now_ms),
            Command::ReportPools { node, pools } => self.report_pools(node, pools),
            Command::CreateGroup { group } => self.create_group(group),
            Command::DeleteGroup { name } => self.delete_group(name),
            Command::ModifyGroup { group } => self.modify_group(group),
            Command::SetNodeLabels { node, labels } => self.set_node_labels(node, labels),
            Command::CreateVolume {
                name,
                size_bytes,
                group,
                replicas,
                nodes,
                pool,
                adopt,
                now_ms,
            } => self.create_volume(
                name,
                size_bytes,
                group,
                replicas,
                nodes,
                pool.map(|pool| vec![pool]),
                adopt,
                now_ms,
            ),
            Command::GrowVolume { name, size_bytes } => self.grow_volume(name, size_bytes),
            Command::DeleteVolume {
                name,
                with_snapshots,
            } => self.delete_volume(name, with_snapshots),
            Command::ReportReplica {
                volume,
                volume_id,
                node,
                observed,
                allocated_bytes,
            } => self.report_replica(volume, volume_id, node, observed, allocated_bytes),
            Command::ReplicaRemoved {
                volume,
                volume_id,
                node,
            } => self.replica_removed(volume, volume_id, node),
            Command::SetSettings { settings } => {
                if settings.resync_rate_bytes_per_sec < MIN_RESYNC_RATE {
                    return Err(CommandError::Invalid(format!(
                        "resync rate {} B/s is too slow: use at least {} MiB/s",
                        settings.resync_rate_bytes_per_sec,
                        MIN_RESYNC_RATE >> 20
                    )));
                }
                self.settings = settings;
                Ok(Reply::Done)
            }
            Command::EvictNode { node, now_ms } => self.evict_node(node, now_ms),
            Command::SetDataAddress { node, data_address } => {
                let record = self
                    .nodes
                    .get_mut(&node)
                    .ok_or(CommandError::UnknownNode { node })?;
                record.data_address = data_address;
                Ok(Reply::Done)
            }
            Command::AttachVolume {
                name,
                node,
                allow_two_primaries,
                force_takeover,
                now_ms,
            } => self.attach_volume(name, node, allow_two_primaries, force_takeover, now_ms),
            Command::ReattachVolume { name, node, now_ms } => {
                self.reattach_volume(name, node, now_ms)
            }
            Command::StartResync { name, node, now_ms } => self.start_resync(name, node, now_ms),
            Command::EndResync {
                name,
                node,
                generation,
            } => self.end_resync(name, node, generation),
            Command::DetachVolume { name, node } => self.detach_volume(name, node),
            Command::MarkOutdated {
                name,
                generation,
                node,
                by,
            } => self.mark_outdated(name, generation, node, by),
            Command::MarkInSync {
                name,
                generation,
                node,
                by,
            } => self.mark_in_sync(name, generation, node, by),
            Command::ReportSync {
                name,
                node,
                progress,
            } => self.report_sync(name, node, progress),
            Command::AddReplica {
                name,
                node,
                pool,
                now_ms: _,
            } => self.add_replica(name, node, pool),
            Command::RemoveReplica { name, node } => self.remove_replica(name, node),
            Command::RestorePlacement { name } => self.restore_placement(name),
            Command::CreateSnapshot {
                volume,
                name,
                scheduled,
                now_ms,
            } => self.create_snapshot(volume, name, scheduled, now_ms),
            Command::ReportSnapshot {
                volume,
                id,
                from,
                holders,
                error,
            } => self.report_snapshot(volume, id, from, holders, error),
            Command::DeleteSnapshot { volume, name } => self.delete_snapshot(volume, name),
            Command::SnapshotRemoved { volume, id, node } => {
                self.snapshot_removed(volume, id, node)
            }
            Command::ReportSnapshotSpace { volume, spaces } => {
                self.report_snapshot_space(volume, spaces)
            }
            Command::RollbackVolume { volume, snapshot } => self.rollback_volume(volume, snapshot),
            Command::RolledBack {
                volume,
                node,
                snapshot,
            } => self.rolled_back(volume, node, snapshot),
            Command::SetSnapshotSchedule {
                volume,
                schedule,
                now_ms,
            } => self.set_snapshot_schedule(volume, schedule, now_ms),
            Command::ReportFenced {
                volume,
                node,
                generation,
            } => self.report_fenced(volume, node, generation),
            Command::CloneVolume {
                name,
                source,
                snapshot,
                group,
                now_ms,
            } => self.clone_volume(name, source, snapshot, group, now_ms),
            Command::Attributed {
                actor,
                now_ms,
                command,
            } => return self.apply_attributed(actor, now_ms, *command),
            Command::RecordEvent { event } => self.check_reported_event(&event),
        }?;
        self.normalize_snapshots();
        if let Err(broken) = self.check_invariants() {
            // A bug in apply, not bad input: every node would hold the same
            // broken state, so stop here rather than spread it further.
            panic!("cluster state invariant broken: {broken}");
        }
        Ok(reply)
    }

    fn apply_attributed(
        &mut self,
        actor: crate::events::Actor,
        now_ms: u64,
        command: Command,
    ) -> Result<Reply, CommandError> {
        if matches!(command, Command::Attributed { .. }) {
            return Err(CommandError::Invalid(
                "an attributed command cannot wrap another".into(),
            ));
        }
        let before = event_record::Before::capture(self, &command);
        let described = command.clone();
        let reply = self.apply(command)?;
        event_record::record(self, before, &described, &reply, actor, now_ms);
        Ok(reply)
    }

    fn check_reported_event(
        &self,
        event: &crate::events::ReportedEvent,
    ) -> Result<Reply, CommandError> {
        if let Some(node) = event.node {
            if !self.nodes.contains_key(&node) {
                return Err(CommandError::UnknownNode { node });
            }
        }
        Ok(Reply::Done)
    }

    fn bootstrap(
        &mut self,
        cluster_id: String,
        join_secret: String,
        node: NodeRegistration,
        now_ms: u64,
    ) -> Result<Reply, CommandError> {
        if !self.cluster_id.is_empty() {
            return Err(CommandError::AlreadyBootstrapped {
                cluster_id: self.cluster_id.clone(),
            });
        }
        if cluster_id.is_empty() {
            return Err(CommandError::Invalid("the cluster id is empty".into()));
        }
        self.cluster_id = cluster_id;
        self.join_secret = join_secret;
        self.created_ms = now_ms;
        self.next_node_id = 1;
        self.next_volume_id = 1;
        let group = ResourceGroup::default_group();
        self.groups.insert(group.name.clone(), group);
        let id = self.insert_node(node, now_ms);
        Ok(Reply::NodeAdded { node: id })
    }

    fn insert_node(&mut self, node: NodeRegistration, now_ms: u64) -> NodeId {
        let id = NodeId(self.next_node_id);
        self.next_node_id += 1;
        self.nodes.insert(
            id,
            NodeRecord {
                id,
                name: node.name,
                api_address: node.api_address,
                nbd_address: node.nbd_address,
                data_address: node.data_address,
                labels: node.labels,
                state: NodeState::Online,
                state_since_ms: now_ms,
                joined_ms: now_ms,
                pools: BTreeMap::new(),
            },
        );
        id
    }

    fn add_node(
        &mut self,
        node: NodeRegistration,
        nonce: String,
        now_ms: u64,
    ) -> Result<Reply, CommandError> {
        let seen_recently = self
            .join_nonces
            .get(&nonce)
            .is_some_and(|seen_ms| seen_ms.saturating_add(JOIN_WINDOW_MS) >= now_ms);
        if seen_recently {
            return Err(CommandError::JoinReplayed);
        }
        if self.node_by_name(&node.name).is_some() {
            return Err(CommandError::NodeNameTaken {
                name: node.name.to_string(),
            });
        }
        // Forget nonces whose joins are too old to be accepted anyway; only
        // now, as a refused command changes nothing.
        self.join_nonces
            .retain(|_, seen_ms| seen_ms.saturating_add(JOIN_WINDOW_MS) >= now_ms);
        self.join_nonces.insert(nonce, now_ms);
        let id = self.insert_node(node, now_ms);
        Ok(Reply::NodeAdded { node: id })
    }

    fn remove_node(&mut self, node: NodeId) -> Result<Reply, CommandError> {
        let record = self
            .nodes
            .get(&node)
            .ok_or(CommandError::UnknownNode { node })?;
        let last: Vec<String> = self
            .volumes_on(node)
            .filter(|volume| {
                // Pending (e.g. being grown) or failed, its data may still be
                // the only copy: only another ready replica makes it spare,
                // and only another up-to-date one keeps the data current.
                volume.is_diskful_on(node)
                    && !volume.deleting
                    && (!has_other_ready(volume, node) || !has_other_in_sync(volume, node))
            })
            .map(|volume| volume.name.to_string())
            .collect();
        if !last.is_empty() {
            return Err(CommandError::LastReplica {
                node: record.name.to_string(),
                volumes: last.join(", "),
            });
        }
        if let Some(volume) = self
            .volumes_on(node)
            .find(|volume| !volume.deleting && !last_snapshot_copies(volume, node).is_empty())
        {
            return Err(CommandError::LastSnapshotCopy {
                name: volume.name.to_string(),
                node: record.name.to_string(),
                snapshots: last_snapshot_copies(volume, node).join(", "),
            });
        }
        self.nodes.remove(&node);
        for volume in self.volumes.values_mut() {
            volume.replicas.retain(|replica| replica.node != node);
            volume.in_sync.remove(&node);
            volume.primaries.retain(|primary| primary.node != node);
            volume.replica_removed_from.remove(&node);
        }
        self.forget_deleted_volumes();
        Ok(Reply::Done)
    }

    fn set_node_state(
        &mut self,
        node: NodeId,
        state: NodeState,
        now_ms: u64,
    ) -> Result<Reply, CommandError> {
        let record = self
            .nodes
            .get_mut(&node)
            .ok_or(CommandError::UnknownNode { node })?;
        if record.state != state {
            record.state = state;
            record.state_since_ms = now_ms;
        }
        Ok(Reply::Done)
    }

    fn report_pools(
        &mut self,
        node: NodeId,
        pools: Vec<PoolReport>,
    ) -> Result<Reply, CommandError> {
        let record = self
            .nodes
            .get_mut(&node)
            .ok_or(CommandError::UnknownNode { node })?;
        record.pools = pools
            .into_iter()
            .map(|pool| (pool.name, pool.record))
            .collect();
        Ok(Reply::Done)
    }

    fn create_group(&mut self, group: ResourceGroup) -> Result<Reply, CommandError> {
        if self.groups.contains_key(&group.name) {
            return Err(CommandError::GroupExists {
                name: group.name.to_string(),
            });
        }
        validate_group(&group)?;
        self.groups.insert(group.name.clone(), group);
        Ok(Reply::Done)
    }

    fn modify_group(&mut self, group: ResourceGroup) -> Result<Reply, CommandError> {
        if !self.groups.contains_key(&group.name) {
            return Err(CommandError::UnknownGroup {
                name: group.name.to_string(),
            });
        }
        validate_group(&group)?;
        self.groups.insert(group.name.clone(), group);
        Ok(Reply::Done)
    }

    fn set_node_labels(
        &mut self,
        node: NodeId,
        labels: BTreeMap<String, String>,
    ) -> Result<Reply, CommandError> {
        if let Some((key, value)) = labels
            .iter()
            .find(|(key, value)| !valid_label_part(key) || !valid_label_part(value))
        {
            return Err(CommandError::Invalid(format!(
                "label '{key}={value}': use letters, digits, '-', '_', '.' and '/' on both sides of '='"
            )));
        }
        let record = self
            .nodes
            .get_mut(&node)
            .ok_or(CommandError::UnknownNode { node })?;
        record.labels = labels;
        Ok(Reply::Done)
    }
}

/// A label key or value: what `--label` accepts.
fn valid_label_part(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 63
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

/// The rules a resource group obeys, at creation and at every change. (A
/// rule added here must not refuse what an older log holds: replayed, the
/// log must give the same state.)
fn validate_group(group: &ResourceGroup) -> Result<(), CommandError> {
    if group.place_count == 0 || group.place_count > MAX_PLACE_COUNT {
        return Err(CommandError::Invalid(format!(
            "place-count {} is out of range: use 1 to {MAX_PLACE_COUNT}",
            group.place_count
        )));
    }
    if group.min_place_count == 0 || group.min_place_count > group.place_count {
        return Err(CommandError::Invalid(format!(
            "min-place-count {} is out of range: use 1 to the place-count ({})",
            group.min_place_count, group.place_count
        )));
    }
    Ok(())
}

impl ClusterState {
    fn delete_group(&mut self, name: GroupName) -> Result<Reply, CommandError> {
        if name.as_str() == DEFAULT_GROUP {
            return Err(CommandError::DefaultGroup);
        }
        if !self.groups.contains_key(&name) {
            return Err(CommandError::UnknownGroup {
                name: name.to_string(),
            });
        }
        let users: Vec<String> = self
            .volumes
            .values()
            .filter(|volume| volume.group == name)
            .map(|volume| volume.name.to_string())
            .collect();
        if !users.is_empty() {
            return Err(CommandError::GroupInUse {
                name: name.to_string(),
                volumes: users.join(", "),
            });
        }
        self.groups.remove(&name);
        Ok(Reply::Done)
    }

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

    #[allow(clippy::too_many_arguments)]
    fn create_volume(
        &mut self,
        name: VolumeName,
        size_bytes: u64,
        group: Option<GroupName>,
        replicas: Option<usize>,
        nodes: Option<Vec<NodeName>>,
        pools: Option<Vec<PoolName>>,
        adopt: Option<(NodeId, PoolName)>,
        now_ms: u64,
    ) -> Result<Reply, CommandError> {
        if self.volumes.contains_key(&name) {
            return Err(CommandError::VolumeExists {
                name: name.to_string(),
            });
        }
        check_volume_size(size_bytes).map_err(|problem| CommandError::InvalidSize {
            name: name.to_string(),
            problem,
        })?;
        let group_name = group.unwrap_or_else(|| {
            GroupName::new(DEFAULT_GROUP).expect("the default group's name is valid")
        });
        let group = self
            .groups
            .get(&group_name)
            .ok_or_else(|| CommandError::UnknownGroup {
                name: group_name.to_string(),
            })?
            .clone();
        let (place_count, min_place_count) = match replicas {
            Some(count) if count == 0 || count > MAX_PLACE_COUNT => {
                return Err(CommandError::Invalid(format!(
                    "--replicas {count} is out of range: use 1 to {MAX_PLACE_COUNT}"
                )))
            }
            // An explicit count is what the person asked for: all or nothing.
            Some(count) => (count, count),
            None => (group.place_count, group.min_place_count),
        };
        let observed_adopted = adopt.is_some();
        let placement = if let Some((node, pool)) = adopt {
            if !self.nodes.contains_key(&node) {
                return Err(CommandError::UnknownNode { node });
            }
            placer::Placement {
                diskful: vec![(node, pool)],
                tiebreaker: None,
                diskless: Vec::new(),
            }
        } else {
            let candidates = self.candidates();
            let pools = pools.unwrap_or_else(|| group.pools.clone());
            let request = placer::Request {
                size_bytes,
                place_count,
                min_place_count,
                pools: &pools,
                class: group.class,
                replicas_on_different: &group.replicas_on_different,
                diskless_on_remaining: group.diskless_on_remaining,
                manual_nodes: nodes.as_deref(),
                exclude: &[],
                keep: &[],
                seed: name_seed(name.as_str()),
            };
            placer::place(&candidates, &request).map_err(|error| CommandError::Placement {
                name: name.to_string(),
                reason: error.to_string(),
            })?
        };
        let mut record = VolumeRecord {
            id: self.next_volume_id,
            name: name.clone(),
            size_bytes,
            group: group_name,
            created_ms: now_ms,
            deleting: false,
            replicas: Vec::new(),
            generation: FIRST_GENERATION,
            primaries: Vec::new(),
            // New replicas are all empty, hence identical: all up to date.
            // (An adopted replica is the only copy of its data.)
            in_sync: placement.diskful.iter().map(|(node, _)| *node).collect(),
            snapshots: Vec::new(),
            schedule: None,
            rollback: None,
            origin: None,
            fenced: BTreeSet::new(),
            replica_target: placement.diskful.len(),
            replica_removed_from: BTreeSet::new(),
        };
        self.next_volume_id += 1;
        record.replicas = replicas_of(&placement, observed_adopted);
        self.volumes.insert(name, record.clone());
        Ok(Reply::Volume(Box::new(record)))
    }

    fn volume_mut(&mut self, name: &VolumeName) -> Result<&mut VolumeRecord, CommandError> {
        self.volumes
            .get_mut(name)
            .ok_or_else(|| CommandError::UnknownVolume {
                name: name.to_string(),
            })
    }

    fn grow_volume(&mut self, name: VolumeName, size_bytes: u64) -> Result<Reply, CommandError> {
        let volume = self.volume_mut(&name)?;
        if volume.deleting {
            return Err(CommandError::VolumeDeleting {
                name: name.to_string(),
            });
        }
        // Checked before anything changes: a size every replica's store
        // refuses would leave the volume failed on every node.
        check_volume_size(size_bytes).map_err(|problem| CommandError::InvalidSize {
            name: name.to_string(),
            problem,
        })?;
        if size_bytes < volume.size_bytes {
            return Err(CommandError::ShrinkRefused {
                name: name.to_string(),
                current: volume.size_bytes,
                requested: size_bytes,
            });
        }
        if size_bytes > volume.size_bytes {
            volume.size_bytes = size_bytes;
            // Every node grows its replica and reports it again.
            for replica in &mut volume.replicas {
                if replica.kind == ReplicaKind::Diskful {
                    replica.observed = ReplicaObserved::Pending;
                }
            }
        }
        Ok(Reply::Volume(Box::new(volume.clone())))
    }

    fn delete_volume(
        &mut self,
        name: VolumeName,
        with_snapshots: bool,
    ) -> Result<Reply, CommandError> {
        let volume = self
            .volumes
            .get(&name)
            .ok_or_else(|| CommandError::UnknownVolume {
                name: name.to_string(),
            })?;
        if volume.is_attached() && volume.resync_driver().is_none() {
            return Err(CommandError::VolumeAttached {
                name: name.to_string(),
                primaries: self.primaries_text(volume),
            });
        }
        let cloning: Vec<String> = self
            .volumes
            .values()
            .filter(|clone| clone.is_being_cloned_from(&name))
            .map(|clone| clone.name.to_string())
            .collect();
        if !cloning.is_empty() {
            return Err(CommandError::ClonesBeingMade {
                name: name.to_string(),
                clones: cloning.join(", "),
            });
        }
        // As rbd and LINSTOR do: a volume's snapshots are data of their
        // own, and go only when the request says so.
        let snapshots: Vec<String> = volume
            .snapshots
            .iter()
            .filter(|snapshot| snapshot.state != crate::snapshot::SnapshotState::Deleting)
            .map(|snapshot| snapshot.name.to_string())
            .collect();
        if !snapshots.is_empty() && !with_snapshots && !volume.deleting {
            let clones: Vec<String> = self
                .volumes
                .values()
                .filter(|clone| {
                    clone
                        .origin
                        .as_ref()
                        .is_some_and(|origin| origin.volume == name)
                })
                .map(|clone| clone.name.to_string())
                .collect();
            return Err(CommandError::HasSnapshots {
                name: name.to_string(),
                snapshots: snapshots.join(", "),
                clones: if clones.is_empty() {
                    String::new()
                } else {
                    format!(
                        ". Clones made from them ({}) keep their data either way: they share chunks with it, counted, and need no flattening",
                        clones.join(", ")
                    )
                },
            });
        }
        let volume = self.volume_mut(&name)?;
        // A resync of what is deleted gives way.
        volume.primaries.clear();
        volume.deleting = true;
        // Members without data have nothing to remove.
        volume
            .replicas
            .retain(|replica| replica.kind == ReplicaKind::Diskful);
        self.forget_deleted_volumes();
        Ok(Reply::Done)
    }

    fn forget_deleted_volumes(&mut self) {
        self.volumes
            .retain(|_, volume| !(volume.deleting && volume.replicas.is_empty()));
    }

    fn report_replica(
        &mut self,
        name: VolumeName,
        volume_id: u64,
        node: NodeId,
        observed: ReplicaObserved,
        allocated_bytes: u64,
    ) -> Result<Reply, CommandError> {
        let volume = self.volume_mut(&name)?;
        // A report about an older volume of the same name changes nothing.
        if volume.id != volume_id {
            return Ok(Reply::Done);
        }
        if let Some(replica) = volume
            .replicas
            .iter_mut()
            .find(|replica| replica.node == node)
        {
            replica.observed = observed;
            replica.allocated_bytes = allocated_bytes;
        }
        Ok(Reply::Done)
    }

    fn replica_removed(
        &mut self,
        name: VolumeName,
        volume_id: u64,
        node: NodeId,
    ) -> Result<Reply, CommandError> {
        let Some(volume) = self.volumes.get_mut(&name) else {
            return Ok(Reply::Done);
        };
        // Only a deleted volume's replicas go away on their node's word.
        if volume.id == volume_id && volume.deleting {
            volume.replicas.retain(|replica| replica.node != node);
            volume.in_sync.remove(&node);
            self.forget_deleted_volumes();
        }
        Ok(Reply::Done)
    }

    fn evict_node(&mut self, node: NodeId, now_ms: u64) -> Result<Reply, CommandError> {
        let record = self
            .nodes
            .get_mut(&node)
            .ok_or(CommandError::UnknownNode { node })?;
        if record.state == NodeState::Online {
            return Err(CommandError::Invalid(format!(
                "node '{}' is online; only an offline node is evicted",
                record.name
            )));
        }
        record.state = NodeState::Evicted;
        record.state_since_ms = now_ms;
        // Gone for the whole eviction delay: it is no primary any more, so
        // it can no longer change which replicas are up to date, and the
        // volume may be attached elsewhere (with a new generation).
        for volume in self.volumes.values_mut() {
            volume.primaries.retain(|primary| primary.node != node);
        }
        let candidates = self.candidates();
        let mut replaced = Vec::new();
        let mut degraded = Vec::new();
        let names: Vec<VolumeName> = self.volumes_on(node).map(|v| v.name.clone()).collect();
        for name in names {
            let volume = self.volumes.get(&name).expect("listed above");
            if volume.deleting {
                continue;
            }
            if !has_other_ready(volume, node) || !has_other_in_sync(volume, node) {
                // The evicted node holds the only (up-to-date) copy: a new,
                // empty replica elsewhere would be a replica in name only.
                // Keep the record (the data may come back with the node).
                degraded.push(name);
                continue;
            }
            let group = self
                .groups
                .get(&volume.group)
                .cloned()
                .unwrap_or_else(ResourceGroup::default_group);
            let keep: Vec<(NodeId, PoolName)> = volume
                .placement()
                .diskful
                .into_iter()
                .filter(|(holder, _)| *holder != node)
                .collect();
            let wanted = volume.diskful().count();
            let request = placer::Request {
                size_bytes: volume.size_bytes,
                place_count: wanted,
                min_place_count: wanted,
                pools: &group.pools,
                class: group.class,
                replicas_on_different: &group.replicas_on_different,
                diskless_on_remaining: group.diskless_on_remaining,
                manual_nodes: None,
                exclude: &[node],
                keep: &keep,
                seed: name_seed(name.as_str()),
            };
            let volume = self.volumes.get_mut(&name).expect("listed above");
            match placer::place(&candidates, &request) {
                Ok(placement) => {
                    // The new replica is empty: not in sync until the data
                    // path has copied the volume to it.
                    apply_placement(volume, &placement);
                    replaced.push(name);
                }
                Err(_) => {
                    // Nowhere to go: the replica stays recorded (its data may
                    // come back with the node) and the volume runs degraded.
                    degraded.push(name);
                }
            }
        }
        Ok(Reply::Evicted { replaced, degraded })
    }

    /// The names of a volume's primaries, for messages: `n1, n2` or `none`.
    fn primaries_text(&self, volume: &VolumeRecord) -> String {
        if volume.primaries.is_empty() {
            return "none".to_string();
        }
        volume
            .primaries
            .iter()
            .map(|primary| self.node_name(primary.node))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The volume `name`, refused when unknown or being deleted.
    pub(crate) fn live_volume(&self, name: &VolumeName) -> Result<&VolumeRecord, CommandError> {
        let volume = self
            .volumes
            .get(name)
            .ok_or_else(|| CommandError::UnknownVolume {
                name: name.to_string(),
            })?;
        if volume.deleting {
            return Err(CommandError::VolumeDeleting {
                name: name.to_string(),
            });
        }
        Ok(volume)
    }

    /// Refuses a command about the in-sync set unless it comes from a
    /// current primary (`by`) and carries the current generation.
    fn check_fence(
        &self,
        volume: &VolumeRecord,
        generation: Generation,
        by: NodeId,
    ) -> Result<(), CommandError> {
        if generation != volume.generation {
            return Err(CommandError::StaleGeneration {
                name: volume.name.to_string(),
                given: generation,
                current: volume.generation,
            });
        }
        if !volume.is_primary(by) {
            return Err(CommandError::NotPrimary {
                name: volume.name.to_string(),
                node: self.node_name(by),
                primaries: self.primaries_text(volume),
            });
        }
        Ok(())
    }

    fn attach_volume(
        &mut self,
        name: VolumeName,
        node: NodeId,
        allow_two_primaries: bool,
        force_takeover: bool,
        now_ms: u64,
    ) -> Result<Reply, CommandError> {
        let volume = self.live_volume(&name)?;
        let record = self
            .nodes
            .get(&node)
            .ok_or(CommandError::UnknownNode { node })?;
        if record.state != NodeState::Online {
            return Err(CommandError::NodeNotOnline {
                node: record.name.to_string(),
                state: record.state.as_str().to_string(),
            });
        }
        // A resync-only engine gives way: the attach fences it.
        let resyncing = volume.resync_driver().is_some();
        if volume.is_primary(node) && !resyncing {
            return Ok(Reply::Attached {
                generation: volume.generation,
                fenced: Vec::new(),
            });
        }
        let fenced = match volume.primaries.as_slice() {
            [] => Vec::new(),
            [_] if resyncing => Vec::new(),
            [only] => {
                // A node that is not online cannot be a migration's source:
                // whatever ran there is dead or cut off, so the attach is a
                // failover and takes the volume over, even when two
                // primaries are allowed.
                // (A removed node, which the invariants rule out, would be
                // as gone as an offline one.)
                let state = self
                    .nodes
                    .get(&only.node)
                    .map_or(NodeState::Offline, |record| record.state);
                match state {
                    NodeState::Online if allow_two_primaries && !force_takeover => Vec::new(),
                    NodeState::Online if !force_takeover => {
                        return Err(CommandError::AlreadyAttached {
                            name: name.to_string(),
                            primary: self.node_name(only.node),
                        })
                    }
                    state => vec![FencedPrimary {
                        node: only.node,
                        state,
                    }],
                }
            }
            _ => {
                return Err(CommandError::TwoPrimaries {
                    name: name.to_string(),
                    primaries: self.primaries_text(volume),
                })
            }
        };
        if volume.in_sync.is_empty() {
            return Err(CommandError::NoUpToDateReplica {
                name: name.to_string(),
            });
        }
        if let Some(rollback) = &volume.rollback {
            return Err(CommandError::RollbackPending {
                name: name.to_string(),
                nodes: rollback.pending.len(),
            });
        }
        let volume = self.volume_mut(&name)?;
        if resyncing {
            volume.primaries.clear();
        }
        volume
            .primaries
            .retain(|primary| !fenced.iter().any(|gone| gone.node == primary.node));
        if volume.primaries.is_empty() {
            // A new history: every replica refuses the writes of whoever
            // was primary before, including the primaries just fenced.
            volume.generation = volume.generation.next();
        }
        ClusterState::primaries_changed(volume, "the volume was attached while it was taken");
        volume.primaries.push(PrimaryRecord {
            node,
            since_ms: now_ms,
            resync_only: false,
        });
        Ok(Reply::Attached {
            generation: volume.generation,
            fenced,
        })
    }

    fn start_resync(
        &mut self,
        name: VolumeName,
        node: NodeId,
        now_ms: u64,
    ) -> Result<Reply, CommandError> {
        let volume = self.live_volume(&name)?;
        let refuse = |why: &str| {
            Err(CommandError::Invalid(format!(
                "no resync of volume '{name}' from node {node}: {why}"
            )))
        };
        if !volume.primaries.is_empty() {
            return refuse("it has a primary, which resyncs it");
        }
        if volume.rollback.is_some() {
            return refuse("it is rolling back");
        }
        if !(volume.is_in_sync(node) && volume.is_diskful_on(node)) {
            return refuse("the node holds no up-to-date replica");
        }
        if volume
            .diskful()
            .all(|replica| volume.is_in_sync(replica.node))
        {
            return refuse("every replica is up to date");
        }
        if self.nodes.get(&node).map(|n| n.state) != Some(NodeState::Online) {
            return refuse("the node is not online");
        }
        let volume = self.volume_mut(&name)?;
        volume.generation = volume.generation.next();
        ClusterState::primaries_changed(volume, "a resync started while it was taken");
        volume.primaries.push(PrimaryRecord {
            node,
            since_ms: now_ms,
            resync_only: true,
        });
        Ok(Reply::Generation(volume.generation))
    }

    fn end_resync(
        &mut self,
        name: VolumeName,
        node: NodeId,
        generation: Generation,
    ) -> Result<Reply, CommandError> {
        let Some(volume) = self.volumes.get_mut(&name) else {
            return Ok(Reply::Done);
        };
        if volume.resync_driver() == Some(node) && volume.generation == generation {
            volume.primaries.clear();
            ClusterState::primaries_changed(volume, "the resync ended while it was taken");
        }
        Ok(Reply::Done)
    }

    fn reattach_volume(
        &mut self,
        name: VolumeName,
        node: NodeId,
        now_ms: u64,
    ) -> Result<Reply, CommandError> {
        let volume = self.live_volume(&name)?;
        if !volume.is_primary(node) {
            return Err(CommandError::NotPrimary {
                name: name.to_string(),
                node: self.node_name(node),
                primaries: self.primaries_text(volume),
            });
        }
        let volume = self.volume_mut(&name)?;
        volume.generation = volume.generation.next();
        ClusterState::primaries_changed(volume, "the primary restarted while it was taken");
        for primary in &mut volume.primaries {
            if primary.node == node {
                primary.since_ms = now_ms;
            }
        }
        Ok(Reply::Generation(volume.generation))
    }

    fn detach_volume(
        &mut self,
        name: VolumeName,
        node: Option<NodeId>,
    ) -> Result<Reply, CommandError> {
        let volume = self
            .volumes
            .get(&name)
            .ok_or_else(|| CommandError::UnknownVolume {
                name: name.to_string(),
            })?;
        let leaving = match (node, volume.primaries.as_slice()) {
            (_, [])
            | (
                _,
                [PrimaryRecord {
                    resync_only: true, ..
                }],
            ) => {
                return Err(CommandError::NotAttached {
                    name: name.to_string(),
                })
            }
            (Some(node), _) if !volume.is_primary(node) => {
                return Err(CommandError::NotPrimary {
                    name: name.to_string(),
                    node: self.node_name(node),
                    primaries: self.primaries_text(volume),
                })
            }
            (Some(node), _) => node,
            (None, [only]) => only.node,
            (None, _) => {
                return Err(CommandError::WhichPrimary {
                    name: name.to_string(),
                    primaries: self.primaries_text(volume),
                })
            }
        };
        let volume = self.volume_mut(&name)?;
        volume.primaries.retain(|primary| primary.node != leaving);
        ClusterState::primaries_changed(volume, "the volume was detached while it was taken");
        Ok(Reply::Volume(Box::new(volume.clone())))
    }

    fn mark_outdated(
        &mut self,
        name: VolumeName,
        generation: Generation,
        node: NodeId,
        by: NodeId,
    ) -> Result<Reply, CommandError> {
        let volume = self
            .volumes
            .get(&name)
            .ok_or_else(|| CommandError::UnknownVolume {
                name: name.to_string(),
            })?;
        self.check_fence(volume, generation, by)?;
        if !volume.is_in_sync(node) {
            return Ok(Reply::Done);
        }
        if volume.in_sync.len() == 1 {
            return Err(CommandError::LastInSync {
                name: name.to_string(),
                node: self.node_name(node),
            });
        }
        self.volume_mut(&name)?.in_sync.remove(&node);
        Ok(Reply::Done)
    }

    fn mark_in_sync(
        &mut self,
        name: VolumeName,
        generation: Generation,
        node: NodeId,
        by: NodeId,
    ) -> Result<Reply, CommandError> {
        let volume = self
            .volumes
            .get(&name)
            .ok_or_else(|| CommandError::UnknownVolume {
                name: name.to_string(),
            })?;
        self.check_fence(volume, generation, by)?;
        if !volume.is_diskful_on(node) {
            return Err(CommandError::NoDiskfulReplica {
                name: name.to_string(),
                node: self.node_name(node),
            });
        }
        let volume = self.volume_mut(&name)?;
        volume.in_sync.insert(node);
        for replica in &mut volume.replicas {
            if replica.node == node {
                replica.sync = None;
            }
        }
        Ok(Reply::Done)
    }

    fn report_sync(
        &mut self,
        name: VolumeName,
        node: NodeId,
        progress: Option<SyncProgress>,
    ) -> Result<Reply, CommandError> {
        let volume = self
            .volumes
            .get(&name)
            .ok_or_else(|| CommandError::UnknownVolume {
                name: name.to_string(),
            })?;
        if !volume.is_diskful_on(node) {
            return Err(CommandError::NoDiskfulReplica {
                name: name.to_string(),
                node: self.node_name(node),
            });
        }
        let volume = self.volume_mut(&name)?;
        for replica in &mut volume.replicas {
            if replica.node == node {
                replica.sync = progress.clone();
            }
        }
        Ok(Reply::Done)
    }

    /// The resource group of a volume (the default one if it went missing,
    /// which the invariants rule out).
    pub(crate) fn group_of(&self, volume: &VolumeRecord) -> ResourceGroup {
        self.groups
            .get(&volume.group)
            .cloned()
            .unwrap_or_else(ResourceGroup::default_group)
    }

    fn add_replica(
        &mut self,
        name: VolumeName,
        node: Option<NodeId>,
        pool: Option<PoolName>,
    ) -> Result<Reply, CommandError> {
        let volume = self.live_volume(&name)?;
        let manual: Option<Vec<NodeName>> = match node {
            None => None,
            Some(node) => {
                let record = self
                    .nodes
                    .get(&node)
                    .ok_or(CommandError::UnknownNode { node })?;
                if volume.is_diskful_on(node) {
                    return Err(CommandError::ReplicaExists {
                        name: name.to_string(),
                        node: record.name.to_string(),
                    });
                }
                Some(vec![record.name.clone()])
            }
        };
        let keep = volume.placement().diskful;
        if keep.len() >= MAX_PLACE_COUNT {
            return Err(CommandError::Invalid(format!(
                "volume '{name}' has {} diskful replicas, the most a volume may have",
                keep.len()
            )));
        }
        let group = self.group_of(volume);
        let pools = pool.map(|pool| vec![pool]).unwrap_or(group.pools);
        let wanted = keep.len() + 1;
        let request = placer::Request {
            size_bytes: volume.size_bytes,
            place_count: wanted,
            min_place_count: wanted,
            pools: &pools,
            class: group.class,
            replicas_on_different: &group.replicas_on_different,
            diskless_on_remaining: group.diskless_on_remaining,
            manual_nodes: manual.as_deref(),
            exclude: &[],
            keep: &keep,
            seed: name_seed(name.as_str()),
        };
        let placement = placer::place(&self.candidates(), &request).map_err(|error| {
            CommandError::Placement {
                name: name.to_string(),
                reason: error.to_string(),
            }
        })?;
        let volume = self.volume_mut(&name)?;
        apply_placement(volume, &placement);
        volume.replica_target = volume.replica_target.max(volume.diskful().count());
        Ok(Reply::Volume(Box::new(volume.clone())))
    }

    fn remove_replica(&mut self, name: VolumeName, node: NodeId) -> Result<Reply, CommandError> {
        let volume = self.live_volume(&name)?;
        if !volume.is_diskful_on(node) {
            return Err(CommandError::NoDiskfulReplica {
                name: name.to_string(),
                node: self.node_name(node),
            });
        }
        if !has_other_in_sync(volume, node) {
            return Err(CommandError::LastInSync {
                name: name.to_string(),
                node: self.node_name(node),
            });
        }
        let last_copies = last_snapshot_copies(volume, node);
        if !last_copies.is_empty() {
            return Err(CommandError::LastSnapshotCopy {
                name: name.to_string(),
                node: self.node_name(node),
                snapshots: last_copies.join(", "),
            });
        }
        let keep: Vec<(NodeId, PoolName)> = volume
            .placement()
            .diskful
            .into_iter()
            .filter(|(holder, _)| *holder != node)
            .collect();
        let group = self.group_of(volume);
        let request = placer::Request {
            size_bytes: volume.size_bytes,
            place_count: keep.len(),
            min_place_count: keep.len(),
            pools: &group.pools,
            class: group.class,
            replicas_on_different: &group.replicas_on_different,
            diskless_on_remaining: group.diskless_on_remaining,
            manual_nodes: None,
            exclude: &[node],
            keep: &keep,
            seed: name_seed(name.as_str()),
        };
        // The node gives its replica up: it takes no tiebreaker or diskless
        // membership in exchange here. The leader's restore may make it the
        // tiebreaker later, but only while no other node can be one
        // (`replica_removed_from`).
        let mut candidates = self.candidates();
        candidates.retain(|candidate| candidate.id != node);
        let placement =
            placer::place(&candidates, &request).map_err(|error| CommandError::Placement {
                name: name.to_string(),
                reason: error.to_string(),
            })?;
        let voters = placement.diskful.len() + usize::from(placement.tiebreaker.is_some());
        let up_to_date = placement
            .diskful
            .iter()
            .filter(|(holder, _)| volume.is_in_sync(*holder))
            .count()
            + usize::from(placement.tiebreaker.is_some());
        let majority = voters / 2 + 1;
        if up_to_date < majority {
            return Err(CommandError::WouldLoseQuorum {
                name: name.to_string(),
                node: self.node_name(node),
                up_to_date,
                voters,
                majority,
            });
        }
        let volume = self.volume_mut(&name)?;
        apply_placement(volume, &placement);
        // Asked for by the admin: the leader must not place it again.
        volume.replica_target = volume.diskful().count();
        volume.replica_removed_from.insert(node);
        if volume.is_primary(node) && volume.replica(node).is_none() {
            // A primary goes on serving the volume through its peers.
            volume.replicas.push(diskless_member(node));
        }
        Ok(Reply::Volume(Box::new(volume.clone())))
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
fn last_snapshot_copies(volume: &VolumeRecord, node: NodeId) -> Vec<String> {
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
fn has_other_ready(volume: &VolumeRecord, node: NodeId) -> bool {
    volume
        .diskful()
        .any(|replica| replica.node != node && replica.observed == ReplicaObserved::Ready)
}

/// Whether a node other than `node` holds an up-to-date replica of `volume`.
fn has_other_in_sync(volume: &VolumeRecord, node: NodeId) -> bool {
    volume.in_sync.iter().any(|holder| *holder != node)
}

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

fn diskless_member(node: NodeId) -> ReplicaRecord {
    ReplicaRecord {
        node,
        kind: ReplicaKind::Diskless,
        pool: None,
        observed: ReplicaObserved::Ready,
        allocated_bytes: 0,
        sync: None,
    }
}

/// The most diskful replicas a volume may have.
pub const MAX_PLACE_COUNT: usize = 7;

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

/// A stable seed from a volume's name (FNV-1a), so ties in placement spread
/// volumes across nodes the same way on every node.
pub fn name_seed(name: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in name.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}
