//! Snapshots in the cluster state: which exist and on which replicas,
//! rollbacks, clones' origins and schedules, and the fencing of detached
//! volumes they rely on. The commands that change them are in
//! the command module's `snapshots`.
//!
//! The state says what is wanted and what each node did; the data path does
//! the work. An attached volume's snapshot is one barrier of its primary's
//! engine, so every replica that takes it holds exactly the same writes. A
//! detached volume's is taken by each up-to-date replica's node on its own,
//! only once that node has *fenced* the volume's generation (no primary of
//! it, even one cut off from the cluster, can write there any more), and
//! only while no newer primary was accepted there: the copies then cannot
//! change under the snapshot, so they agree.

use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use trireme_types::{Generation, NodeId, SnapshotId, SnapshotName, VolumeName};

use super::{ClusterState, ReplicaObserved, VolumeRecord};

/// Snapshots one volume may have: enough for hourly snapshots kept for
/// days; each one costs a map lookup on reads of older snapshots.
pub const MAX_SNAPSHOTS_PER_VOLUME: usize = 256;
/// The shortest interval of a snapshot schedule.
pub const MIN_SCHEDULE_SECS: u64 = 10;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    /// Given by the control plane, the same on every replica, never reused.
    pub id: SnapshotId,
    pub name: SnapshotName,
    pub created_ms: u64,
    /// The volume's size when it was taken: a clone of it gets this size.
    pub size_bytes: u64,
    /// The volume's generation when it was asked.
    pub generation: Generation,
    pub state: SnapshotState,
    /// The nodes whose replica holds it.
    pub nodes: BTreeSet<NodeId>,
    /// Taken by the volume's schedule, which also deletes it.
    #[serde(default)]
    pub scheduled: bool,
    /// Bytes deleting it would give back, and bytes it shares with the
    /// volume, other snapshots or clones, as its nodes last reported.
    #[serde(default)]
    pub exclusive_bytes: u64,
    #[serde(default)]
    pub shared_bytes: u64,
}

impl SnapshotRecord {
    pub fn is_ready(&self) -> bool {
        self.state == SnapshotState::Ready
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SnapshotState {
    /// Asked, being taken.
    Creating {
        taker: SnapshotTaker,
    },
    Ready,
    /// No replica took it.
    Failed {
        reason: String,
    },
    /// Its nodes remove their copies; the record goes when none is left.
    Deleting,
}

impl SnapshotState {
    pub fn as_str(&self) -> &'static str {
        match self {
            SnapshotState::Creating { .. } => "creating",
            SnapshotState::Ready => "ready",
            SnapshotState::Failed { .. } => "failed",
            SnapshotState::Deleting => "deleting",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SnapshotTaker {
    /// The primary's engine, in one barrier on the replicas it writes to.
    Primary { node: NodeId },
    /// A detached volume: each target (fenced, up to date) on its own.
    Replicas {
        targets: BTreeSet<NodeId>,
        answered: BTreeSet<NodeId>,
        errors: Vec<String>,
    },
}

/// Snapshots taken every `every_secs`, the newest `keep` kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotSchedule {
    pub every_secs: u64,
    pub keep: usize,
    /// When the schedule last took one (or was set).
    pub last_ms: u64,
}

impl SnapshotSchedule {
    pub fn due(&self, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.last_ms) >= self.every_secs * 1000
    }
}

/// A rollback in progress: these nodes have not yet made their copy the
/// snapshot's again. The volume cannot be attached meanwhile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rollback {
    pub snapshot: SnapshotId,
    pub pending: BTreeSet<NodeId>,
}

/// Where a clone's data comes from: its replicas on `holders` are made from
/// the snapshot's copy on the same node (sharing its chunks).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloneOrigin {
    pub volume: VolumeName,
    pub snapshot: SnapshotId,
    pub holders: BTreeSet<NodeId>,
}

impl VolumeRecord {
    /// Whether this volume is a clone of `source`'s snapshot `id` whose
    /// replicas are still being made from it.
    pub fn is_being_cloned_from_snapshot(&self, source: &VolumeName, id: SnapshotId) -> bool {
        self.origin.as_ref().is_some_and(|origin| {
            &origin.volume == source && origin.snapshot == id && self.clone_pending(origin)
        })
    }

    /// Whether this volume is a clone of one of `source`'s snapshots whose
    /// replicas are still being made.
    pub fn is_being_cloned_from(&self, source: &VolumeName) -> bool {
        self.origin
            .as_ref()
            .is_some_and(|origin| &origin.volume == source && self.clone_pending(origin))
    }

    fn clone_pending(&self, origin: &CloneOrigin) -> bool {
        self.diskful().any(|replica| {
            replica.observed == ReplicaObserved::Pending && origin.holders.contains(&replica.node)
        })
    }

    pub fn snapshot(&self, name: &SnapshotName) -> Option<&SnapshotRecord> {
        self.snapshots
            .iter()
            .find(|snapshot| &snapshot.name == name)
    }

    pub fn snapshot_by_id(&self, id: SnapshotId) -> Option<&SnapshotRecord> {
        self.snapshots.iter().find(|snapshot| snapshot.id == id)
    }

    pub(crate) fn snapshot_mut(&mut self, id: SnapshotId) -> Option<&mut SnapshotRecord> {
        self.snapshots.iter_mut().find(|snapshot| snapshot.id == id)
    }

    /// Whether a snapshot is being taken.
    pub fn snapshot_in_progress(&self) -> bool {
        self.snapshots
            .iter()
            .any(|snapshot| matches!(snapshot.state, SnapshotState::Creating { .. }))
    }
}

impl ClusterState {
    /// The volume gets a primary (or a new generation): detached fencing
    /// no longer holds, and a snapshot its replicas were taking on their
    /// own, or the old engine was taking, will not complete.
    pub(crate) fn primaries_changed(volume: &mut VolumeRecord, reason: &str) {
        volume.fenced.clear();
        for snapshot in &mut volume.snapshots {
            if matches!(snapshot.state, SnapshotState::Creating { .. }) {
                snapshot.state = SnapshotState::Failed {
                    reason: reason.to_string(),
                };
            }
        }
    }

    /// Scheduled snapshots the leader should take (volume, name) and the
    /// ones it should delete, at `now_ms`.
    pub fn schedule_work(&self, now_ms: u64) -> (Vec<VolumeName>, Vec<(VolumeName, SnapshotName)>) {
        let mut take = Vec::new();
        let mut prune = Vec::new();
        for volume in self.volumes.values() {
            let Some(schedule) = &volume.schedule else {
                continue;
            };
            if volume.deleting {
                continue;
            }
            if schedule.due(now_ms) && !volume.snapshot_in_progress() && volume.rollback.is_none() {
                take.push(volume.name.clone());
            }
            // A scheduled snapshot that failed is deleted at once.
            for snapshot in &volume.snapshots {
                if snapshot.scheduled && matches!(snapshot.state, SnapshotState::Failed { .. }) {
                    prune.push((volume.name.clone(), snapshot.name.clone()));
                }
            }
            let scheduled: Vec<&SnapshotRecord> = volume
                .snapshots
                .iter()
                .filter(|snapshot| snapshot.scheduled && snapshot.is_ready())
                .collect();
            if scheduled.len() > schedule.keep {
                for snapshot in &scheduled[..scheduled.len() - schedule.keep] {
                    prune.push((volume.name.clone(), snapshot.name.clone()));
                }
            }
        }
        (take, prune)
    }

    /// Snapshot records follow their volume's replicas: a node without a
    /// diskful replica holds no copy. Called after every command.
    pub(crate) fn normalize_snapshots(&mut self) {
        for volume in self.volumes.values_mut() {
            let diskful: BTreeSet<NodeId> = volume.diskful().map(|replica| replica.node).collect();
            for snapshot in &mut volume.snapshots {
                snapshot.nodes.retain(|node| diskful.contains(node));
            }
            volume.fenced.retain(|node| diskful.contains(node));
            if let Some(rollback) = &mut volume.rollback {
                rollback.pending.retain(|node| diskful.contains(node));
                if rollback.pending.is_empty() {
                    volume.rollback = None;
                }
            }
            volume.forget_removed_snapshots();
        }
    }

    pub(crate) fn check_snapshot_invariants(&self) -> Result<(), String> {
        for (name, volume) in &self.volumes {
            let mut ids = BTreeSet::new();
            let mut names = BTreeSet::new();
            for snapshot in &volume.snapshots {
                if !ids.insert(snapshot.id) || !names.insert(&snapshot.name) {
                    return Err(format!(
                        "volume {name} has two snapshots with id {} or name {}",
                        snapshot.id, snapshot.name
                    ));
                }
                if snapshot.id.0 >= self.next_snapshot_id.max(1) {
                    return Err(format!(
                        "snapshot {} of volume {name} is not below the next id",
                        snapshot.id
                    ));
                }
                if let Some(stray) = snapshot
                    .nodes
                    .iter()
                    .find(|node| !volume.is_diskful_on(**node))
                {
                    return Err(format!(
                        "snapshot {} of volume {name} is recorded on node {stray} without a replica",
                        snapshot.id
                    ));
                }
            }
            if volume
                .snapshots
                .windows(2)
                .any(|pair| pair[0].id >= pair[1].id)
            {
                return Err(format!("volume {name}: snapshots are not in id order"));
            }
            if volume.is_attached() && !volume.fenced.is_empty() {
                return Err(format!("volume {name} is attached and fenced"));
            }
            if let Some(rollback) = &volume.rollback {
                if volume.is_attached() {
                    return Err(format!("volume {name} is attached while rolling back"));
                }
                if volume.snapshot_by_id(rollback.snapshot).is_none() {
                    return Err(format!("volume {name} rolls back to a missing snapshot"));
                }
            }
        }
        Ok(())
    }
}

impl VolumeRecord {
    /// Deleted snapshots no node holds any more, and failed ones no node
    /// holds, leave the record.
    pub(crate) fn forget_removed_snapshots(&mut self) {
        self.snapshots.retain(|snapshot| match snapshot.state {
            SnapshotState::Deleting => !snapshot.nodes.is_empty(),
            SnapshotState::Ready => !snapshot.nodes.is_empty(),
            _ => true,
        });
    }
}
