//! The volume commands: create, grow, delete, what nodes report about
//! their replicas, and adding, removing or placing again replicas.

use std::collections::BTreeSet;
use trireme_types::{check_volume_size, GroupName, NodeId, NodeName, PoolName, VolumeName};

use super::error::CommandError;
use super::placement::{apply_placement, diskless_member, replicas_of};
use super::Reply;
use crate::model::snapshot::SnapshotState;
use crate::model::*;
use crate::placer::{self, name_seed};

impl ClusterState {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn create_volume(
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

    pub(super) fn volume_mut(
        &mut self,
        name: &VolumeName,
    ) -> Result<&mut VolumeRecord, CommandError> {
        self.volumes
            .get_mut(name)
            .ok_or_else(|| CommandError::UnknownVolume {
                name: name.to_string(),
            })
    }

    pub(super) fn grow_volume(
        &mut self,
        name: VolumeName,
        size_bytes: u64,
    ) -> Result<Reply, CommandError> {
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

    pub(super) fn delete_volume(
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
            .filter(|snapshot| snapshot.state != SnapshotState::Deleting)
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

    pub(super) fn forget_deleted_volumes(&mut self) {
        self.volumes
            .retain(|_, volume| !(volume.deleting && volume.replicas.is_empty()));
    }

    pub(super) fn report_replica(
        &mut self,
        name: VolumeName,
        volume_id: u64,
        node: NodeId,
        observed: ReplicaObserved,
        allocated_bytes: u64,
        size_bytes: Option<u64>,
    ) -> Result<Reply, CommandError> {
        let ignore_size = self.ready_ignores_size();
        let volume = self.volume_mut(&name)?;
        // A report about an older volume of the same name changes nothing.
        if volume.id != volume_id {
            return Ok(Reply::Done);
        }
        // Made before a grow committed: the copy is not ready at the
        // size recorded now (its node grows it and reports again).
        let observed = match observed {
            ReplicaObserved::Ready
                if !ignore_size && size_bytes.is_some_and(|size| size < volume.size_bytes) =>
            {
                ReplicaObserved::Pending
            }
            observed => observed,
        };
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

    pub(super) fn replica_removed(
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

    /// The names of a volume's primaries, for messages: `n1, n2` or `none`.
    pub(super) fn primaries_text(&self, volume: &VolumeRecord) -> String {
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

    pub(super) fn report_sync(
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

    pub(super) fn add_replica(
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

    pub(super) fn remove_replica(
        &mut self,
        name: VolumeName,
        node: NodeId,
    ) -> Result<Reply, CommandError> {
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

    pub(super) fn restore_placement(&mut self, name: VolumeName) -> Result<Reply, CommandError> {
        let volume = self.live_volume(&name)?;
        let Some(placement) = self.restored_placement(volume) else {
            return Ok(Reply::Done);
        };
        let volume = self
            .volumes
            .get_mut(&name)
            .expect("found by live_volume above");
        apply_placement(volume, &placement);
        Ok(Reply::Volume(Box::new(volume.clone())))
    }
}
