//! The commands of the replicated log and how each changes [`ClusterState`].
//!
//! [`ClusterState::apply`] is a pure function of the state and the command:
//! no clock, no randomness, no I/O. That is what lets every node hold the
//! same state, and lets tests drive it without a cluster. It dispatches to
//! one module per domain:
//! - `nodes`: bootstrap, joins, removal, node state, labels, eviction;
//! - `pools`: what nodes report about their pools;
//! - `groups`: resource groups and the cluster's settings;
//! - `volumes`: create, grow, delete, replicas added, removed, reported
//!   and placed again;
//! - `primaries`: attach, detach, resync-only engines, and the in-sync
//!   marks with their fencing check;
//! - `snapshots`: snapshots, rollbacks, clones, schedules and fencing
//!   reports;
//! - `events`: attributed commands (and `event_record`, which events
//!   they leave) and events only a node sees.
//!
//! [`error`] holds why a command is refused, `placement` how a placer's
//! answer becomes replica records. None of them depends on another domain:
//! what several share lives in `crate::model`.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use trireme_types::{
    Generation, GroupName, NodeId, NodeName, PoolName, SnapshotId, SnapshotName, VolumeName,
};

use crate::model::*;

pub mod error;
mod event_record;
mod events;
mod groups;
mod nodes;
mod placement;
mod pools;
mod primaries;
mod snapshots;
mod volumes;

pub use crate::model::MAX_PLACE_COUNT;
pub use crate::placer::name_seed;
pub use error::{takeover_advice, CommandError};

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
        /// The size of the node's copy when it reported. A copy smaller
        /// than the volume (the report was made before a grow committed)
        /// is not ready: running engines grow only onto ready copies.
        /// `None` from nodes that predate it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        size_bytes: Option<u64>,
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
    /// (the `repair` module). Proposed by the leader; changes nothing when
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
    Snapshot(Box<crate::model::snapshot::SnapshotRecord>),
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
                size_bytes,
            } => self.report_replica(
                volume,
                volume_id,
                node,
                observed,
                allocated_bytes,
                size_bytes,
            ),
            Command::ReplicaRemoved {
                volume,
                volume_id,
                node,
            } => self.replica_removed(volume, volume_id, node),
            Command::SetSettings { settings } => self.set_settings(settings),
            Command::EvictNode { node, now_ms } => self.evict_node(node, now_ms),
            Command::SetDataAddress { node, data_address } => {
                self.set_data_address(node, data_address)
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
}
