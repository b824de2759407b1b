//! The commands of the replicated log and how each changes [`ClusterState`].
//!
//! [`ClusterState::apply`] is a pure function of the state and the command:
//! no clock, no randomness, no I/O. That is what lets every node hold the
//! same state, and lets tests drive it without a cluster.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use trireme_types::{GroupName, NodeId, NodeName, PoolName, VolumeName};

use crate::model::*;
use crate::placer::{self, Candidate, CandidatePool};

/// What a node says about itself when it creates or joins the cluster.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeRegistration {
    pub name: NodeName,
    pub api_address: String,
    pub nbd_address: Option<String>,
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
    DeleteVolume {
        name: VolumeName,
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
    #[error("{0}")]
    Invalid(String),
}

impl ClusterState {
    /// Applies one command. A refused command leaves the state unchanged.
    pub fn apply(&mut self, command: Command) -> Result<Reply, CommandError> {
        if self.cluster_id.is_empty() && !matches!(command, Command::Bootstrap { .. }) {
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
            Command::DeleteVolume { name } => self.delete_volume(name),
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
                self.settings = settings;
                Ok(Reply::Done)
            }
            Command::EvictNode { node, now_ms } => self.evict_node(node, now_ms),
        }?;
        if let Err(broken) = self.check_invariants() {
            // A bug in apply, not bad input: every node would hold the same
            // broken state, so stop here rather than spread it further.
            panic!("cluster state invariant broken: {broken}");
        }
        Ok(reply)
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
                // the only copy: only another ready replica makes it spare.
                let holds_data = volume
                    .replica(node)
                    .is_some_and(|replica| replica.kind == ReplicaKind::Diskful);
                holds_data && !has_other_ready(volume, node) && !volume.deleting
            })
            .map(|volume| volume.name.to_string())
            .collect();
        if !last.is_empty() {
            return Err(CommandError::LastReplica {
                node: record.name.to_string(),
                volumes: last.join(", "),
            });
        }
        self.nodes.remove(&node);
        for volume in self.volumes.values_mut() {
            volume.replicas.retain(|replica| replica.node != node);
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
        self.groups.insert(group.name.clone(), group);
        Ok(Reply::Done)
    }

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
        if size_bytes == 0 {
            return Err(CommandError::Invalid(format!(
                "volume '{name}' needs a size above 0"
            )));
        }
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

    fn delete_volume(&mut self, name: VolumeName) -> Result<Reply, CommandError> {
        let volume = self.volume_mut(&name)?;
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
        let candidates = self.candidates();
        let mut replaced = Vec::new();
        let mut degraded = Vec::new();
        let names: Vec<VolumeName> = self.volumes_on(node).map(|v| v.name.clone()).collect();
        for name in names {
            let volume = self.volumes.get(&name).expect("listed above");
            if volume.deleting {
                continue;
            }
            if !has_other_ready(volume, node) {
                // The evicted node holds the only copy: a new, empty replica
                // elsewhere would be a replica in name only. Keep the record
                // (the data may come back with the node).
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
                    let mut new_replicas = replicas_of(&placement, false);
                    // Replicas that stay keep what their nodes reported.
                    for replica in &mut new_replicas {
                        if let Some(old) = volume.replica(replica.node) {
                            if old.kind == replica.kind {
                                *replica = old.clone();
                            }
                        }
                    }
                    volume.replicas = new_replicas;
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

    /// What must hold after every command; checked by `apply`.
    pub fn check_invariants(&self) -> Result<(), String> {
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
        }
        Ok(())
    }
}

/// Whether a diskful replica of `volume` on a node other than `node` is ready.
fn has_other_ready(volume: &VolumeRecord, node: NodeId) -> bool {
    volume
        .diskful()
        .any(|replica| replica.node != node && replica.observed == ReplicaObserved::Ready)
}

/// The most diskful replicas a volume may have.
pub const MAX_PLACE_COUNT: usize = 7;

fn replicas_of(placement: &placer::Placement, ready: bool) -> Vec<ReplicaRecord> {
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
    });
    let member = |node: &NodeId, kind| ReplicaRecord {
        node: *node,
        kind,
        pool: None,
        observed: ReplicaObserved::Ready,
        allocated_bytes: 0,
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
