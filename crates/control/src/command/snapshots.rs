//! The snapshot commands: take, report, delete, roll back, clone,
//! schedules, and the fencing reports of detached volumes.

use std::collections::BTreeSet;
use trireme_types::{
    Generation, GroupName, NodeId, PoolName, SnapshotId, SnapshotName, VolumeName,
};

use super::error::CommandError;
use super::placement::replicas_of;
use super::Reply;
use crate::model::snapshot::{
    CloneOrigin, Rollback, SnapshotRecord, SnapshotSchedule, SnapshotState, SnapshotTaker,
    MAX_SNAPSHOTS_PER_VOLUME, MIN_SCHEDULE_SECS,
};
use crate::model::*;
use crate::placer::{self, name_seed};

impl ClusterState {
    fn volume_named(&mut self, name: &VolumeName) -> Result<&mut VolumeRecord, CommandError> {
        self.volumes
            .get_mut(name)
            .ok_or_else(|| CommandError::UnknownVolume {
                name: name.to_string(),
            })
    }

    pub(super) fn create_snapshot(
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
    pub(super) fn report_snapshot(
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

    pub(super) fn delete_snapshot(
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
    pub(super) fn snapshot_removed(
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

    pub(super) fn report_snapshot_space(
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

    pub(super) fn rollback_volume(
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

    pub(super) fn rolled_back(
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

    pub(super) fn set_snapshot_schedule(
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

    pub(super) fn clone_volume(
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
    pub(super) fn report_fenced(
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
}
