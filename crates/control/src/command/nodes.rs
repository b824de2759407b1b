//! The node commands: bootstrap, join, removal, state, labels, eviction
//! and addresses.

use std::collections::BTreeMap;
use trireme_types::{NodeId, PoolName, VolumeName};

use super::error::CommandError;
use super::placement::apply_placement;
use super::{NodeRegistration, Reply};
use crate::model::*;
use crate::placer::{self, name_seed};

impl ClusterState {
    pub(super) fn bootstrap(
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

    pub(super) fn add_node(
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

    pub(super) fn remove_node(&mut self, node: NodeId) -> Result<Reply, CommandError> {
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

    pub(super) fn set_node_state(
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

    pub(super) fn set_node_labels(
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

    pub(super) fn evict_node(&mut self, node: NodeId, now_ms: u64) -> Result<Reply, CommandError> {
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

    pub(super) fn set_data_address(
        &mut self,
        node: NodeId,
        data_address: Option<String>,
    ) -> Result<Reply, CommandError> {
        let record = self
            .nodes
            .get_mut(&node)
            .ok_or(CommandError::UnknownNode { node })?;
        record.data_address = data_address;
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
