//! Snapshots in the cluster state: which exist and on which replicas, and
//! the commands that change them (take, report, delete, roll back, clone,
//! schedules), with the fencing of detached volumes they rely on.
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

use crate::command::{name_seed, replicas_of, CommandError, Reply};
use crate::model::*;
use crate::placer;
use trireme_types::{GroupName, PoolName};

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

    fn snapshot_mut(&mut self, id: SnapshotId) -> Option<&mut SnapshotRecord> {
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
    fn volume_named(&mut self, name: &VolumeName) -> Result<&mut VolumeRecord, CommandError> {
        self.volumes
            .get_mut(name)
            .ok_or_else(|| CommandError::UnknownVolume {
                name: name.to_string(),
            })
    }

    pub(crate) fn create_snapshot(
        &mut self,
        volume_name: VolumeName,
        name: SnapshotName,
        scheduled: bool,
        now_ms: u64,
    ) -> Result<Reply, CommandError> {
        let id = SnapshotId(self.next_snapshot_id.max(1));
        let primaries = {
            let volume = self.volume_named(&volume_name)?;
            volume.primaries.clone()
        };
        let primaries_text = self.primaries_text_of(&primaries);
        let volume = self.volume_named(&volume_name)?;
        if volume.deleting {
            return Err(CommandError::VolumeDeleting {
                name: volume_name.to_string(),
            });
        }
        if volume.snapshot(&name).is_some() {
            return Err(CommandError::SnapshotExists {
                volume: volume_name.to_string(),
                name: name.to_string(),
            });
        }
        if volume.snapshots.len() >= MAX_SNAPSHOTS_PER_VOLUME {
            return Err(CommandError::Invalid(format!(
                "volume '{volume_name}' has {} snapshots, the most a volume may have; delete some first (`trireme snapshot delete {volume_name} NAME`)",
                volume.snapshots.len()
            )));
        }
        if let Some(rollback) = &volume.rollback {
            return Err(CommandError::RollbackPending {
                name: volume_name.to_string(),
                nodes: rollback.pending.len(),
            });
        }
        let taker = match primaries.as_slice() {
            [only] => SnapshotTaker::Primary { node: only.node },
            [] => {
                let targets: BTreeSet<NodeId> =
                    volume.in_sync.intersection(&volume.fenced).copied().collect();
                if targets.is_empty() {
                    return Err(CommandError::NotFenced {
                        name: volume_name.to_string(),
                    });
                }
                SnapshotTaker::Replicas {
                    targets,
                    answered: BTreeSet::new(),
                    errors: Vec::new(),
                }
            }
            _ => {
                return Err(CommandError::Invalid(format!(
                    "volume '{volume_name}' is attached on two nodes ({primaries_text}) while a VM migrates; take the snapshot once it is attached on one"
                )))
            }
        };
        let record = SnapshotRecord {
            id,
            name,
            created_ms: now_ms,
            size_bytes: volume.size_bytes,
            generation: volume.generation,
            state: SnapshotState::Creating { taker },
            nodes: BTreeSet::new(),
            scheduled,
            exclusive_bytes: 0,
            shared_bytes: 0,
        };
        volume.snapshots.push(record.clone());
        if scheduled {
            if let Some(schedule) = &mut volume.schedule {
                schedule.last_ms = now_ms;
            }
        }
        self.next_snapshot_id = id.0 + 1;
        Ok(Reply::Snapshot(Box::new(record)))
    }

    fn primaries_text_of(&self, primaries: &[PrimaryRecord]) -> String {
        primaries
            .iter()
            .map(|primary| self.node_name(primary.node))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// `from` took snapshot `id` on `holders` (the primary: every replica
    /// its barrier reached; a replica's node: itself), or failed.
    pub(crate) fn report_snapshot(
        &mut self,
        volume_name: VolumeName,
        id: SnapshotId,
        from: NodeId,
        holders: BTreeSet<NodeId>,
        error: Option<String>,
    ) -> Result<Reply, CommandError> {
        let from_name = self.node_name(from);
        let volume = self.volume_named(&volume_name)?;
        let diskful: BTreeSet<NodeId> = volume.diskful().map(|replica| replica.node).collect();
        let Some(snapshot) = volume.snapshot_mut(id) else {
            // Deleted meanwhile: what nodes hold is removed as an orphan.
            return Ok(Reply::Done);
        };
        let holders: BTreeSet<NodeId> = holders.intersection(&diskful).copied().collect();
        match &mut snapshot.state {
            SnapshotState::Creating {
                taker: SnapshotTaker::Primary { node },
            } => {
                if *node != from {
                    return Err(CommandError::Invalid(format!(
                        "snapshot {id} of volume '{volume_name}' is taken by another node, not '{from_name}'"
                    )));
                }
                snapshot.nodes.extend(holders);
                snapshot.state = if snapshot.nodes.is_empty() {
                    SnapshotState::Failed {
                        reason: error.unwrap_or_else(|| "no replica took it".into()),
                    }
                } else {
                    SnapshotState::Ready
                };
            }
            SnapshotState::Creating {
                taker:
                    SnapshotTaker::Replicas {
                        targets,
                        answered,
                        errors,
                    },
            } => {
                if !targets.contains(&from) {
                    return Err(CommandError::Invalid(format!(
                        "node '{from_name}' was not asked for snapshot {id} of volume '{volume_name}'"
                    )));
                }
                answered.insert(from);
                if let Some(error) = error {
                    errors.push(format!("{from_name}: {error}"));
                }
                let done = answered.is_superset(targets);
                let reason = errors.join("; ");
                snapshot.nodes.extend(holders);
                if done {
                    snapshot.state = if snapshot.nodes.is_empty() {
                        SnapshotState::Failed { reason }
                    } else {
                        SnapshotState::Ready
                    };
                }
            }
            // A late report after a failure or a delete: its copies are
            // recorded, so that deleting the snapshot removes them.
            SnapshotState::Failed { .. } | SnapshotState::Deleting => {
                snapshot.nodes.extend(holders);
            }
            SnapshotState::Ready => {}
        }
        Ok(Reply::Snapshot(Box::new(snapshot.clone())))
    }

    pub(crate) fn delete_snapshot(
        &mut self,
        volume_name: VolumeName,
        name: SnapshotName,
    ) -> Result<Reply, CommandError> {
        let cloning: Vec<String> = {
            let volume = self.volume_named(&volume_name)?;
            let Some(snapshot) = volume.snapshot(&name) else {
                return Err(CommandError::UnknownSnapshot {
                    volume: volume_name.to_string(),
                    name: name.to_string(),
                });
            };
            let id = snapshot.id;
            self.volumes
                .values()
                .filter(|clone| clone.is_being_cloned_from_snapshot(&volume_name, id))
                .map(|clone| clone.name.to_string())
                .collect()
        };
        if !cloning.is_empty() {
            return Err(CommandError::Invalid(format!(
                "volumes {} are being cloned from snapshot '{name}' of volume '{volume_name}'; delete it once they are created",
                cloning.join(", ")
            )));
        }
        let volume = self.volume_named(&volume_name)?;
        let snapshot = volume
            .snapshots
            .iter_mut()
            .find(|snapshot| snapshot.name == name)
            .expect("found above");
        if volume
            .rollback
            .as_ref()
            .is_some_and(|rollback| rollback.snapshot == snapshot.id)
        {
            return Err(CommandError::RollbackPending {
                name: volume_name.to_string(),
                nodes: volume.rollback.as_ref().map_or(0, |r| r.pending.len()),
            });
        }
        snapshot.state = SnapshotState::Deleting;
        let reply = Reply::Snapshot(Box::new(snapshot.clone()));
        volume.forget_removed_snapshots();
        Ok(reply)
    }

    /// `node` has no copy of snapshot `id` any more.
    pub(crate) fn snapshot_removed(
        &mut self,
        volume_name: VolumeName,
        id: SnapshotId,
        node: NodeId,
    ) -> Result<Reply, CommandError> {
        let Some(volume) = self.volumes.get_mut(&volume_name) else {
            return Ok(Reply::Done);
        };
        if let Some(snapshot) = volume.snapshot_mut(id) {
            if snapshot.state == SnapshotState::Deleting {
                snapshot.nodes.remove(&node);
            }
        }
        volume.forget_removed_snapshots();
        Ok(Reply::Done)
    }

    pub(crate) fn report_snapshot_space(
        &mut self,
        volume_name: VolumeName,
        spaces: Vec<(SnapshotId, u64, u64)>,
    ) -> Result<Reply, CommandError> {
        let Some(volume) = self.volumes.get_mut(&volume_name) else {
            return Ok(Reply::Done);
        };
        for (id, exclusive, shared) in spaces {
            if let Some(snapshot) = volume.snapshot_mut(id) {
                snapshot.exclusive_bytes = exclusive;
                snapshot.shared_bytes = shared;
            }
        }
        Ok(Reply::Done)
    }

    pub(crate) fn rollback_volume(
        &mut self,
        volume_name: VolumeName,
        name: SnapshotName,
    ) -> Result<Reply, CommandError> {
        let primaries = self.volume_named(&volume_name)?.primaries.clone();
        // A resync-only engine gives way below.
        if !primaries.is_empty() && !matches!(primaries.as_slice(), [only] if only.resync_only) {
            return Err(CommandError::VolumeAttached {
                name: volume_name.to_string(),
                primaries: self.primaries_text_of(&primaries),
            });
        }
        let volume = self.volume_named(&volume_name)?;
        if volume.deleting {
            return Err(CommandError::VolumeDeleting {
                name: volume_name.to_string(),
            });
        }
        if let Some(rollback) = &volume.rollback {
            return Err(CommandError::RollbackPending {
                name: volume_name.to_string(),
                nodes: rollback.pending.len(),
            });
        }
        if volume.snapshot_in_progress() {
            return Err(CommandError::Invalid(format!(
                "a snapshot of volume '{volume_name}' is being taken; roll back once it is done"
            )));
        }
        let Some(snapshot) = volume.snapshot(&name) else {
            return Err(CommandError::UnknownSnapshot {
                volume: volume_name.to_string(),
                name: name.to_string(),
            });
        };
        if !snapshot.is_ready() {
            return Err(CommandError::Invalid(format!(
                "snapshot '{name}' of volume '{volume_name}' is {}, not ready",
                snapshot.state.as_str()
            )));
        }
        let holders: BTreeSet<NodeId> = snapshot
            .nodes
            .iter()
            .copied()
            .filter(|node| volume.is_diskful_on(*node))
            .collect();
        if holders.is_empty() {
            return Err(CommandError::Invalid(format!(
                "no replica of volume '{volume_name}' holds snapshot '{name}'"
            )));
        }
        if snapshot.size_bytes != volume.size_bytes {
            return Err(CommandError::Invalid(format!(
                "volume '{volume_name}' has grown since snapshot '{name}' was taken; a rollback cannot shrink it (clone the snapshot instead: `trireme volume create NEW --from-snapshot {volume_name}@{name}`)"
            )));
        }
        let id = snapshot.id;
        // Every holder's copy becomes the snapshot, identical everywhere: they
        // are the up-to-date set of a new data history. The others lack it.
        volume.rollback = Some(Rollback {
            snapshot: id,
            pending: holders.clone(),
        });
        volume.in_sync = holders;
        // The new generation fences a resync-only engine, which gives way.
        volume.primaries.clear();
        volume.generation = volume.generation.next();
        volume.fenced.clear();
        for replica in &mut volume.replicas {
            replica.sync = None;
        }
        Ok(Reply::Volume(Box::new(volume.clone())))
    }

    pub(crate) fn rolled_back(
        &mut self,
        volume_name: VolumeName,
        node: NodeId,
        id: SnapshotId,
    ) -> Result<Reply, CommandError> {
        let volume = self.volume_named(&volume_name)?;
        if let Some(rollback) = &mut volume.rollback {
            if rollback.snapshot == id {
                rollback.pending.remove(&node);
                if rollback.pending.is_empty() {
                    volume.rollback = None;
                }
            }
        }
        Ok(Reply::Done)
    }

    pub(crate) fn set_snapshot_schedule(
        &mut self,
        volume_name: VolumeName,
        schedule: Option<(u64, usize)>,
        now_ms: u64,
    ) -> Result<Reply, CommandError> {
        let volume = self.volume_named(&volume_name)?;
        if volume.deleting {
            return Err(CommandError::VolumeDeleting {
                name: volume_name.to_string(),
            });
        }
        volume.schedule = match schedule {
            None => None,
            Some((every_secs, _)) if every_secs < MIN_SCHEDULE_SECS => {
                return Err(CommandError::Invalid(format!(
                    "a snapshot every {every_secs} s is too often: use at least {MIN_SCHEDULE_SECS} s"
                )))
            }
            Some((_, keep)) if keep == 0 || keep > MAX_SNAPSHOTS_PER_VOLUME / 2 => {
                return Err(CommandError::Invalid(format!(
                    "--keep {keep} is out of range: keep 1 to {} scheduled snapshots",
                    MAX_SNAPSHOTS_PER_VOLUME / 2
                )))
            }
            Some((every_secs, keep)) => Some(SnapshotSchedule {
                every_secs,
                keep,
                last_ms: now_ms,
            }),
        };
        Ok(Reply::Volume(Box::new(volume.clone())))
    }

    pub(crate) fn clone_volume(
        &mut self,
        name: VolumeName,
        source: VolumeName,
        snapshot_name: SnapshotName,
        group: Option<GroupName>,
        now_ms: u64,
    ) -> Result<Reply, CommandError> {
        if self.volumes.contains_key(&name) {
            return Err(CommandError::VolumeExists {
                name: name.to_string(),
            });
        }
        let origin = self.live_volume(&source)?;
        let Some(snapshot) = origin.snapshot(&snapshot_name) else {
            return Err(CommandError::UnknownSnapshot {
                volume: source.to_string(),
                name: snapshot_name.to_string(),
            });
        };
        if !snapshot.is_ready() {
            return Err(CommandError::Invalid(format!(
                "snapshot '{snapshot_name}' of volume '{source}' is {}, not ready",
                snapshot.state.as_str()
            )));
        }
        // Each copy of the clone is made in the pool of the snapshot's copy
        // on the same node, sharing its chunks.
        let keep: Vec<(NodeId, PoolName)> = origin
            .diskful()
            .filter(|replica| snapshot.nodes.contains(&replica.node))
            .map(|replica| {
                (
                    replica.node,
                    replica.pool.clone().expect("a diskful replica has a pool"),
                )
            })
            .collect();
        if keep.is_empty() {
            return Err(CommandError::Invalid(format!(
                "no replica of volume '{source}' holds snapshot '{snapshot_name}'"
            )));
        }
        let group_name = group.unwrap_or_else(|| origin.group.clone());
        let group = self
            .groups
            .get(&group_name)
            .ok_or_else(|| CommandError::UnknownGroup {
                name: group_name.to_string(),
            })?
            .clone();
        let request = placer::Request {
            size_bytes: snapshot.size_bytes,
            place_count: keep.len(),
            min_place_count: keep.len(),
            pools: &[],
            class: None,
            replicas_on_different: &[],
            diskless_on_remaining: group.diskless_on_remaining,
            manual_nodes: None,
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
        let holders: BTreeSet<NodeId> = keep.iter().map(|(node, _)| *node).collect();
        let record = VolumeRecord {
            id: self.next_volume_id,
            name: name.clone(),
            size_bytes: snapshot.size_bytes,
            group: group_name,
            created_ms: now_ms,
            deleting: false,
            replicas: replicas_of(&placement, false),
            generation: FIRST_GENERATION,
            primaries: Vec::new(),
            // Every copy is made from the same snapshot: all identical.
            in_sync: holders.clone(),
            snapshots: Vec::new(),
            schedule: None,
            rollback: None,
            origin: Some(CloneOrigin {
                volume: source,
                snapshot: snapshot.id,
                holders,
            }),
            fenced: BTreeSet::new(),
            replica_target: keep.len(),
            replica_removed_from: BTreeSet::new(),
        };
        self.next_volume_id += 1;
        self.volumes.insert(name, record.clone());
        Ok(Reply::Volume(Box::new(record)))
    }

    /// `node` fenced `generation` of the volume: no primary of it can
    /// write to its replica any more.
    pub(crate) fn report_fenced(
        &mut self,
        volume_name: VolumeName,
        node: NodeId,
        generation: Generation,
    ) -> Result<Reply, CommandError> {
        let Some(volume) = self.volumes.get_mut(&volume_name) else {
            return Ok(Reply::Done);
        };
        if volume.primaries.is_empty()
            && volume.generation == generation
            && volume.is_diskful_on(node)
        {
            volume.fenced.insert(node);
        }
        Ok(Reply::Done)
    }

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
    fn forget_removed_snapshots(&mut self) {
        self.snapshots.retain(|snapshot| match snapshot.state {
            SnapshotState::Deleting => !snapshot.nodes.is_empty(),
            SnapshotState::Ready => !snapshot.nodes.is_empty(),
            _ => true,
        });
    }
}
