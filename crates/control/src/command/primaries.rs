//! Who writes a volume and which replicas are up to date: attach, detach,
//! reattach, resync-only engines, and the in-sync marks with their fencing
//! check.

use trireme_types::{Generation, NodeId, VolumeName};

use super::error::CommandError;
use super::{FencedPrimary, Reply};
use crate::model::*;

impl ClusterState {
    /// Refuses a command about the in-sync set unless it comes from a
    /// current primary (`by`) and carries the current generation.
    fn check_fence(
        &self,
        volume: &VolumeRecord,
        generation: Generation,
        by: NodeId,
    ) -> Result<(), CommandError> {
        if self.skips_fence_check() {
            return Ok(());
        }
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

    pub(super) fn attach_volume(
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

    pub(super) fn start_resync(
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

    pub(super) fn end_resync(
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

    pub(super) fn reattach_volume(
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

    pub(super) fn detach_volume(
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

    pub(super) fn mark_outdated(
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

    pub(super) fn mark_in_sync(
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
}
