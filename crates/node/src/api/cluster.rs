//! The cluster endpoints: status (`trireme status`), nodes, resource
//! groups, settings and the join token. Reads come from this node's copy of
//! the state; changes are committed through the leader.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use std::collections::BTreeSet;
use trireme_control::{
    ClusterState, Command, NodeState, PoolRecord, QuorumPolicy, ReplicaKind, ReplicaObserved,
    ResourceGroup, VolumeRecord,
};
use trireme_types::{format_size, DeviceClass, GroupName, NodeName, PoolName};

use super::model::{
    CountBy, ErrorBody, GroupBody, JoinTokenResponse, MisplacedReplica, NodeEntry, SettingsBody,
    StatusResponse, SyncResponse, VolumeCounts,
};
use super::volumes::{sync_response, volume_state};
use super::{ApiError, ApiJson, ApiState};
use crate::agent::FREE_BYTES_REPORT_SHARE;
use crate::cluster::auth;
use crate::NodeError;

/// A pool fuller than this share (in percent) is warned about.
const POOL_FULL_WARNING_PERCENT: u64 = 90;

fn role(state: &ApiState, node: u64, voters: &BTreeSet<u64>) -> &'static str {
    if state.cluster.leader().map(|leader| leader.0) == Some(node) {
        "leader"
    } else if voters.contains(&node) {
        "voter"
    } else {
        "learner"
    }
}

fn seconds_since(ms: u64) -> u64 {
    auth::now_ms().saturating_sub(ms) / 1000
}

#[utoipa::path(get, path = "/api/v1/nodes", tag = "cluster",
    responses((status = 200, description = "Every node of the cluster", body = [NodeEntry])))]
pub async fn list_nodes(State(state): State<ApiState>) -> Json<Vec<NodeEntry>> {
    let cluster_state = state.cluster.state.read();
    let voters: BTreeSet<u64> = cluster_state.membership().voter_ids().collect();
    Json(
        cluster_state
            .nodes
            .values()
            .map(|node| node_entry(&state, node, &voters))
            .collect(),
    )
}

pub(super) fn node_entry(
    state: &ApiState,
    node: &trireme_control::NodeRecord,
    voters: &BTreeSet<u64>,
) -> NodeEntry {
    NodeEntry {
        id: node.id.0,
        name: node.name.to_string(),
        api_address: node.api_address.clone(),
        nbd_address: node.nbd_address.clone(),
        data_address: node.data_address.clone(),
        labels: node.labels.clone(),
        state: node.state.as_str().to_string(),
        state_seconds: seconds_since(node.state_since_ms),
        role: role(state, node.id.0, voters).to_string(),
        pools: node.pools.len(),
        capacity_bytes: node.pools.values().map(|pool| pool.capacity_bytes).sum(),
        free_bytes: node.pools.values().map(|pool| pool.free_bytes).sum(),
    }
}

#[utoipa::path(delete, path = "/api/v1/nodes/{name}", tag = "cluster",
    params(("name" = String, Path, description = "Node name")),
    responses(
        (status = 204, description = "Node removed; its vote went to another node"),
        (status = 404, description = "No such node", body = ErrorBody),
        (status = 409, description = "It holds the last up-to-date replica of a volume", body = ErrorBody)))]
pub async fn remove_node(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let name = NodeName::new(name).map_err(NodeError::from)?;
    let id = state
        .cluster
        .state
        .read()
        .node_by_name(&name)
        .map(|node| node.id)
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "node_not_found",
                format!("no node named '{name}': see `trireme node list`"),
            )
        })?;
    state
        .cluster
        .write(Command::RemoveNode { node: id })
        .await?;
    Ok(StatusCode::NO_CONTENT)
}

fn group_body(group: &ResourceGroup) -> GroupBody {
    GroupBody {
        name: group.name.to_string(),
        place_count: group.place_count,
        min_place_count: Some(group.min_place_count),
        pools: group.pools.iter().map(|pool| pool.to_string()).collect(),
        class: group.class.map(|class| class.to_string()),
        replicas_on_different: group.replicas_on_different.clone(),
        diskless_on_remaining: group.diskless_on_remaining,
        on_no_quorum: Some(group.on_no_quorum.as_str().to_string()),
    }
}

#[utoipa::path(get, path = "/api/v1/groups", tag = "cluster",
    responses((status = 200, description = "Every resource group", body = [GroupBody])))]
pub async fn list_groups(State(state): State<ApiState>) -> Json<Vec<GroupBody>> {
    Json(
        state
            .cluster
            .state
            .read()
            .groups
            .values()
            .map(group_body)
            .collect(),
    )
}

#[utoipa::path(post, path = "/api/v1/groups", tag = "cluster", request_body = GroupBody,
    responses(
        (status = 201, description = "Group created", body = GroupBody),
        (status = 400, description = "Bad name, count, class or policy", body = ErrorBody),
        (status = 409, description = "A group of that name exists", body = ErrorBody)))]
pub async fn create_group(
    State(state): State<ApiState>,
    ApiJson(body): ApiJson<GroupBody>,
) -> Result<(StatusCode, Json<GroupBody>), ApiError> {
    let group = group_from_body(&body)?;
    let answer = group_body(&group);
    state.cluster.write(Command::CreateGroup { group }).await?;
    Ok((StatusCode::CREATED, Json(answer)))
}

#[utoipa::path(put, path = "/api/v1/groups/{name}", tag = "cluster", request_body = GroupBody,
    params(("name" = String, Path, description = "Group name")),
    responses(
        (status = 200, description = "Group changed; replicas stay where they are, and `status` names the volumes that no longer satisfy it", body = GroupBody),
        (status = 400, description = "Bad count, class or policy, or another name in the body", body = ErrorBody),
        (status = 404, description = "No such group", body = ErrorBody)))]
pub async fn modify_group(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<GroupBody>,
) -> Result<Json<GroupBody>, ApiError> {
    if body.name != name {
        return Err(ApiError::bad_request(
            "invalid_request",
            format!(
                "the body names group '{}' but the path group '{name}'; a group cannot be renamed",
                body.name
            ),
        ));
    }
    let group = group_from_body(&body)?;
    let answer = group_body(&group);
    state.cluster.write(Command::ModifyGroup { group }).await?;
    Ok(Json(answer))
}

/// A group as the API received it, checked as far as the body allows (the
/// counts are checked when the command is applied).
fn group_from_body(body: &GroupBody) -> Result<ResourceGroup, ApiError> {
    let bad = |message: String| ApiError::bad_request("invalid_request", message);
    let class = body
        .class
        .as_deref()
        .map(|class| match class {
            "nvme" => Ok(DeviceClass::Nvme),
            "ssd" => Ok(DeviceClass::Ssd),
            "hdd" => Ok(DeviceClass::Hdd),
            other => Err(bad(format!("class '{other}' is not one of nvme, ssd, hdd"))),
        })
        .transpose()?;
    let on_no_quorum = match body.on_no_quorum.as_deref() {
        None | Some("io-error") => QuorumPolicy::IoError,
        Some("suspend") => QuorumPolicy::Suspend,
        Some(other) => {
            return Err(bad(format!(
                "on-no-quorum '{other}' is not one of io-error, suspend"
            )))
        }
    };
    for key in &body.replicas_on_different {
        if key.is_empty() || key.contains(['=', ',', ' ']) {
            return Err(bad(format!("label key '{key}' is not valid")));
        }
    }
    let group = ResourceGroup {
        name: GroupName::new(&body.name).map_err(NodeError::from)?,
        place_count: body.place_count,
        min_place_count: body.min_place_count.unwrap_or(body.place_count),
        pools: body
            .pools
            .iter()
            .map(PoolName::new)
            .collect::<Result<_, _>>()
            .map_err(NodeError::from)?,
        class,
        replicas_on_different: body.replicas_on_different.clone(),
        diskless_on_remaining: body.diskless_on_remaining,
        on_no_quorum,
    };
    Ok(group)
}

#[utoipa::path(delete, path = "/api/v1/groups/{name}", tag = "cluster",
    params(("name" = String, Path, description = "Group name")),
    responses(
        (status = 204, description = "Group deleted"),
        (status = 404, description = "No such group", body = ErrorBody),
        (status = 409, description = "Volumes use it, or it is the default group", body = ErrorBody)))]
pub async fn delete_group(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let name = GroupName::new(name).map_err(NodeError::from)?;
    state.cluster.write(Command::DeleteGroup { name }).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(get, path = "/api/v1/cluster/settings", tag = "cluster",
    responses((status = 200, description = "Cluster-wide settings", body = SettingsBody)))]
pub async fn show_settings(State(state): State<ApiState>) -> Json<SettingsBody> {
    let settings = state.cluster.state.read().settings.clone();
    Json(SettingsBody {
        eviction_enabled: settings.eviction_enabled,
        eviction_delay_secs: settings.eviction_delay_secs,
        resync_rate_bytes_per_sec: settings.resync_rate_bytes_per_sec,
    })
}

/// The shortest eviction delay accepted: shorter would evict nodes that
/// are merely rebooting.
pub const MIN_EVICTION_DELAY_SECS: u64 = 10;

#[utoipa::path(put, path = "/api/v1/cluster/settings", tag = "cluster", request_body = SettingsBody,
    responses(
        (status = 200, description = "Settings changed", body = SettingsBody),
        (status = 400, description = "Delay or rate out of range", body = ErrorBody)))]
pub async fn change_settings(
    State(state): State<ApiState>,
    ApiJson(body): ApiJson<SettingsBody>,
) -> Result<Json<SettingsBody>, ApiError> {
    if body.eviction_delay_secs < MIN_EVICTION_DELAY_SECS {
        return Err(ApiError::bad_request(
            "invalid_request",
            format!(
                "eviction delay {} s is too short: use at least {MIN_EVICTION_DELAY_SECS} s",
                body.eviction_delay_secs
            ),
        ));
    }
    if body.resync_rate_bytes_per_sec < trireme_control::MIN_RESYNC_RATE {
        return Err(ApiError::bad_request(
            "invalid_request",
            format!(
                "resync rate {} B/s is too slow: use at least {} MiB/s (e.g. --resync-rate 64M)",
                body.resync_rate_bytes_per_sec,
                trireme_control::MIN_RESYNC_RATE >> 20
            ),
        ));
    }
    state
        .cluster
        .write(Command::SetSettings {
            settings: trireme_control::ClusterSettings {
                eviction_enabled: body.eviction_enabled,
                eviction_delay_secs: body.eviction_delay_secs,
                resync_rate_bytes_per_sec: body.resync_rate_bytes_per_sec,
            },
        })
        .await?;
    Ok(Json(body))
}

#[utoipa::path(get, path = "/api/v1/cluster/join-token", tag = "cluster",
    responses((status = 200, description = "The token that lets a machine join", body = JoinTokenResponse)))]
pub async fn join_token(State(state): State<ApiState>) -> Json<JoinTokenResponse> {
    let token = state.cluster.join_token();
    Json(JoinTokenResponse {
        command: format!(
            "trireme node run --join {} --token {token}",
            state.cluster.api_address
        ),
        token,
    })
}

/// `45s`, `3m20s`, `2h5m`: a time left, to the second below ten minutes.
fn eta_text(seconds: u64) -> String {
    match seconds {
        0..60 => format!("{seconds}s"),
        60..600 => format!("{}m{}s", seconds / 60, seconds % 60),
        600..3600 => format!("{}m", seconds / 60),
        _ => format!("{}h{}m", seconds / 3600, seconds % 3600 / 60),
    }
}

/// The replicas placed against their group's rules (after a label or
/// group change), each with a warning that gives the commands that move it.
fn misplaced_replicas(volume: &VolumeRecord, state: &ClusterState) -> Vec<MisplacedReplica> {
    trireme_control::conformance::misplaced_replicas(state, volume)
        .into_iter()
        .map(|misplaced| {
            let node = state.node_name(misplaced.node);
            let warning = format!(
                "volume {} no longer satisfies its group {}: {}. To move that replica: `trireme volume replica add {}`, wait for it (`trireme volume show {} --wait`), then `trireme volume replica remove {} --node {node}`",
                volume.name, volume.group, misplaced.reason, volume.name, volume.name, volume.name
            );
            MisplacedReplica {
                volume: volume.name.to_string(),
                group: volume.group.to_string(),
                node,
                reason: misplaced.reason,
                warning,
            }
        })
        .collect()
}

/// A warning per diskful replica that is not up to date: a running resync
/// with its progress, or an outdated replica and what brings it back.
fn resync_warnings(volume: &VolumeRecord, state: &ClusterState, now_ms: u64) -> Vec<String> {
    volume
        .diskful()
        .filter(|replica| !volume.is_in_sync(replica.node))
        .map(|replica| {
            let behind = Behind {
                volume,
                state,
                node: state.node_name(replica.node),
                primaries: volume
                    .primaries
                    .iter()
                    .map(|primary| state.node_name(primary.node))
                    .collect(),
                pool: replica.pool.as_ref().and_then(|pool| {
                    let record = state.nodes.get(&replica.node)?.pools.get(pool)?;
                    Some((pool, record))
                }),
                node_offline: state
                    .nodes
                    .get(&replica.node)
                    .is_some_and(|record| record.state != NodeState::Online),
                room: state.replica_room(volume),
            };
            match &replica.sync {
                Some(progress) => {
                    let sync = sync_response(progress, now_ms);
                    match sync.stalled_secs {
                        Some(silent) => behind.stalled(&sync, silent),
                        None => behind.syncing(&sync),
                    }
                }
                None => behind.outdated(),
            }
        })
        .collect()
}

/// A diskful replica outside the in-sync set, for its `status` warning.
struct Behind<'a> {
    volume: &'a VolumeRecord,
    state: &'a ClusterState,
    node: String,
    primaries: Vec<String>,
    /// Its pool, as the node last reported it.
    pool: Option<(&'a PoolName, &'a PoolRecord)>,
    node_offline: bool,
    /// Whether another online node could take a replica of the volume.
    room: bool,
}

impl Behind<'_> {
    /// Its pool, when that is full: free space is reported in steps of
    /// 1/64 of the pool, and below one step it counts as full.
    fn full_pool(&self) -> Option<&PoolName> {
        self.pool
            .filter(|(_, record)| {
                record.online && record.free_bytes < record.capacity_bytes / FREE_BYTES_REPORT_SHARE
            })
            .map(|(name, _)| name)
    }

    fn failed_pool(&self) -> Option<&PoolName> {
        self.pool
            .filter(|(_, record)| !record.online)
            .map(|(name, _)| name)
    }

    fn move_hint(&self) -> String {
        let (volume, node) = (&self.volume.name, &self.node);
        if !self.room {
            return "add a node: no other online node can take a replica of it now".to_string();
        }
        format!(
            "move the replica (`trireme volume replica add {volume}`, then `trireme volume replica remove {volume} --node {node}`)"
        )
    }

    fn stalled(&self, sync: &SyncResponse, silent_secs: u64) -> String {
        let primary_down = self
            .volume
            .primaries
            .iter()
            .zip(&self.primaries)
            .find(|(primary, _)| {
                self.state
                    .nodes
                    .get(&primary.node)
                    .is_none_or(|record| record.state != NodeState::Online)
            })
            .map(|(_, name)| name);
        let why = if let Some(pool) = self.full_pool() {
            format!("its pool {pool} is full: free space in that pool")
        } else if self.primaries.is_empty() {
            format!(
                "the volume is not attached; it goes on once it is (`trireme volume attach {} --node NODE`)",
                self.volume.name
            )
        } else if let Some(primary) = primary_down {
            format!(
                "its primary {primary} is offline: start it again, or attach the volume elsewhere"
            )
        } else {
            format!(
                "the primary ({}) keeps trying: see its log",
                self.primaries.join(", ")
            )
        };
        format!(
            "volume {}: the resync of the replica on {} has stalled at {}% (no progress for {}): {why}",
            self.volume.name,
            self.node,
            sync.percent,
            eta_text(silent_secs)
        )
    }

    fn syncing(&self, sync: &SyncResponse) -> String {
        let eta = sync
            .eta_secs
            .map(|secs| format!(", about {} left", eta_text(secs)))
            .unwrap_or_default();
        let full = self
            .full_pool()
            .map(|pool| {
                format!(
                    "; its pool {pool} is full, which stops the resync at the first chunk it must allocate: free space in that pool"
                )
            })
            .unwrap_or_default();
        format!(
            "volume {}: the replica on {} is syncing: {}% ({} of {}) at {}/s{eta}{full}",
            self.volume.name,
            self.node,
            sync.percent,
            format_size(sync.done_bytes),
            format_size(sync.total_bytes),
            format_size(sync.rate_bytes_per_sec),
        )
    }

    fn outdated(&self) -> String {
        let (volume, node) = (&self.volume.name, &self.node);
        if !self.node_offline {
            if let Some(pool) = self.full_pool() {
                return format!(
                    "volume {volume}: the replica on {node} is outdated and its pool {pool} is full, so a resync fails as its writes did: free space in that pool (delete volumes or snapshots there), or {}",
                    self.move_hint()
                );
            }
            if let Some(pool) = self.failed_pool() {
                return format!(
                    "volume {volume}: the replica on {node} is outdated and its pool {pool} is offline (device errors): replace the disk and restart {node}, or {}",
                    self.move_hint()
                );
            }
        }
        let action = match (self.primaries.is_empty(), self.node_offline) {
            (_, true) if !self.room => format!(
                "start {node} again (no other online node can take a replica of it now)"
            ),
            (_, true) => format!(
                "start {node} again, or replace the replica (`trireme volume replica add {volume}`, then `trireme volume replica remove {volume} --node {node}`)"
            ),
            (true, false) => format!(
                "it is resynced once the volume is attached (`trireme volume attach {volume} --node NODE`)"
            ),
            (false, false) => format!(
                "the primary ({}) resyncs it once it reaches {node}",
                self.primaries.join(", ")
            ),
        };
        format!(
            "volume {volume}: the replica on {node} is outdated{}: {action}",
            if self.node_offline {
                " and its node is offline"
            } else {
                ""
            }
        )
    }
}

/// What an evicted node still holds: eviction places a node's replicas
/// elsewhere only where another node can take them.
fn evicted_warning(node: &trireme_control::NodeRecord, state: &ClusterState) -> String {
    let stuck: Vec<String> = state
        .volumes_on(node.id)
        .filter(|volume| !volume.deleting && volume.is_diskful_on(node.id))
        .map(|volume| volume.name.to_string())
        .collect();
    let name = &node.name;
    if stuck.is_empty() {
        return format!(
            "node {name} was evicted and its replicas were placed on other nodes: remove it with `trireme node remove {name}`, or start it again (it returns holding none of them)"
        );
    }
    format!(
        "node {name} was evicted, but volume(s) {} still have a replica on it: no other online node could take them. Add a node (the leader places them there), or start {name} again (its copies come back with it)",
        stuck.join(", ")
    )
}

/// `n1, n2 (outdated), n4 (tiebreaker, offline)`: a volume's voters and
/// why each that does not count for a write does not.
fn voters_text(volume: &VolumeRecord, state: &ClusterState) -> String {
    volume
        .replicas
        .iter()
        .filter(|replica| replica.kind != ReplicaKind::Diskless)
        .map(|replica| {
            let mut notes = Vec::new();
            if replica.kind == ReplicaKind::Tiebreaker {
                notes.push("tiebreaker");
            } else if !volume.is_in_sync(replica.node) {
                notes.push(if replica.sync.is_some() {
                    "syncing"
                } else {
                    "outdated"
                });
            }
            let online = state
                .nodes
                .get(&replica.node)
                .is_some_and(|node| node.state == NodeState::Online);
            if !online {
                notes.push("offline");
            }
            let name = state.node_name(replica.node);
            if notes.is_empty() {
                name
            } else {
                format!("{name} ({})", notes.join(", "))
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A warning when `volume` has no quorum, or would lose it with one more
/// voter: the data path then fails its writes (docs/replication.md, rule 3).
fn quorum_warning(volume: &VolumeRecord, state: &ClusterState) -> Option<String> {
    let count = state.quorum_count(volume);
    let name = &volume.name;
    let standing = format!(
        "{} of its {} voters are up to date and online ({}) and a write needs {}",
        count.up_to_date,
        count.voters,
        voters_text(volume, state),
        count.majority
    );
    let placement = volume.placement();
    let no_tiebreaker = placement.diskful.len().is_multiple_of(2) && placement.tiebreaker.is_none();
    let tiebreaker_hint = if no_tiebreaker {
        "; it has no tiebreaker: the leader gives it one as soon as a node without a replica of it is online (add a node)"
    } else {
        ""
    };
    if !count.has_quorum() {
        return Some(format!(
            "volume {name} has no quorum: {standing}. Its writes fail (or wait, with on-no-quorum suspend) until enough voters are back: start the offline nodes again; an outdated replica counts again once it is resynced{tiebreaker_hint}"
        ));
    }
    count.one_failure_from_losing_it().then(|| {
        format!("volume {name} is one failure from losing its quorum: {standing}{tiebreaker_hint}")
    })
}

#[utoipa::path(get, path = "/api/v1/status", tag = "cluster",
    responses((status = 200, description = "One screen of cluster health", body = StatusResponse)))]
pub async fn status(State(state): State<ApiState>) -> Json<StatusResponse> {
    let leader = state.cluster.leader();
    let now_ms = auth::now_ms();
    let cluster_state = state.cluster.state.read();
    let membership = cluster_state.membership();
    let voter_ids: BTreeSet<u64> = membership.voter_ids().collect();
    let learner_ids: Vec<u64> = membership.learner_ids().collect();
    let mut warnings = Vec::new();
    let mut misplaced_volumes = Vec::new();
    let mut nodes = CountBy::default();
    let (mut pools, mut capacity, mut free) = (0, 0, 0);
    for node in cluster_state.nodes.values() {
        nodes.total += 1;
        match node.state {
            NodeState::Online => nodes.online += 1,
            NodeState::Offline => {
                nodes.offline += 1;
                warnings.push(format!(
                    "node {} is offline for {} s: start `trireme node run` on it again, or remove it with `trireme node remove {}`",
                    node.name,
                    seconds_since(node.state_since_ms),
                    node.name
                ));
            }
            NodeState::Evicted => {
                nodes.evicted += 1;
                warnings.push(evicted_warning(node, &cluster_state));
            }
        }
        for (name, pool) in &node.pools {
            pools += 1;
            capacity += pool.capacity_bytes;
            free += pool.free_bytes;
            if !pool.online {
                warnings.push(format!(
                    "pool {name} on node {} is offline: check its device, then restart the node",
                    node.name
                ));
            } else if pool.capacity_bytes > 0
                && (pool.capacity_bytes - pool.free_bytes.min(pool.capacity_bytes)) * 100
                    >= pool.capacity_bytes * POOL_FULL_WARNING_PERCENT
            {
                warnings.push(format!(
                    "pool {name} on node {} is {}% full ({} free): add a pool or delete volumes",
                    node.name,
                    100 - pool.free_bytes * 100 / pool.capacity_bytes,
                    format_size(pool.free_bytes)
                ));
            }
        }
    }
    if leader.is_none() {
        warnings.push(format!(
            "the control plane has no leader: start the stopped voters ({})",
            voter_ids
                .iter()
                .map(|id| cluster_state.node_name(trireme_types::NodeId(*id)))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    if nodes.total >= 3 && voter_ids.len() < 3 {
        warnings.push(format!(
            "only {} voter(s) with {} nodes: the leader adds voters once nodes are online and caught up",
            voter_ids.len(),
            nodes.total
        ));
    }
    let mut volumes = VolumeCounts::default();
    let mut provisioned = 0;
    for volume in cluster_state.volumes.values() {
        provisioned += volume.size_bytes;
        volumes.count(volume_state(volume, &cluster_state));
        for replica in volume.diskful() {
            if let ReplicaObserved::Failed(message) = &replica.observed {
                warnings.push(format!(
                    "volume {}: the replica on {} failed ({message}): fix the pool, the node retries every few seconds",
                    volume.name,
                    cluster_state.node_name(replica.node)
                ));
            }
        }
        if volume.deleting {
            continue;
        }
        let diskful = volume.diskful().count();
        let wanted = cluster_state
            .groups
            .get(&volume.group)
            .map(|group| group.place_count)
            .unwrap_or(diskful);
        // Only where `replica add` would succeed: an offline or evicted
        // node cannot take a replica.
        if diskful < wanted && cluster_state.replica_room(volume) {
            warnings.push(format!(
                "volume {} has {diskful} of {wanted} replicas and an online node could take another: add one with `trireme volume replica add {}`",
                volume.name, volume.name
            ));
        }
        warnings.extend(quorum_warning(volume, &cluster_state));
        if !volume.deleting {
            warnings.extend(resync_warnings(volume, &cluster_state, now_ms));
        }
        for misplaced in misplaced_replicas(volume, &cluster_state) {
            warnings.push(misplaced.warning.clone());
            misplaced_volumes.push(misplaced);
        }
    }
    let this_node = cluster_state.node_name(state.cluster.node_id());
    Json(StatusResponse {
        cluster_id: state.cluster.identity.cluster_id.clone(),
        health: if warnings.is_empty() {
            "HEALTH_OK"
        } else {
            "HEALTH_WARN"
        }
        .to_string(),
        this_node,
        leader: leader.map(|id| cluster_state.node_name(id)),
        voters: voter_ids
            .iter()
            .map(|id| cluster_state.node_name(trireme_types::NodeId(*id)))
            .collect(),
        learners: learner_ids
            .iter()
            .map(|id| cluster_state.node_name(trireme_types::NodeId(*id)))
            .collect(),
        nodes,
        pools,
        capacity_bytes: capacity,
        free_bytes: free,
        provisioned_bytes: provisioned,
        volumes,
        warnings,
        misplaced_volumes,
        eviction_enabled: cluster_state.settings.eviction_enabled,
        eviction_delay_secs: cluster_state.settings.eviction_delay_secs,
    })
}

#[cfg(test)]
mod tests {
    use super::super::volumes::SYNC_STALLED_AFTER_MS;
    use super::*;
    use trireme_control::{Command, PoolRecord, PoolReport};
    use trireme_types::{NodeId, VolumeName};

    const GIB: u64 = 1 << 30;

    /// Two nodes with a 64 GiB pool each, and a volume `v` on both; the
    /// replica on `b` is outdated.
    fn outdated_replica_on_b() -> ClusterState {
        let mut state = crate::cluster::test_state::two_nodes();
        for node in [NodeId(1), NodeId(2)] {
            state
                .apply(Command::ReportPools {
                    node,
                    pools: vec![PoolReport {
                        name: PoolName::new("default").unwrap(),
                        record: PoolRecord {
                            class: DeviceClass::Ssd,
                            capacity_bytes: 64 * GIB,
                            free_bytes: 64 * GIB,
                            online: true,
                            reported_ms: 0,
                        },
                    }],
                })
                .unwrap();
        }
        state
            .apply(Command::CreateVolume {
                name: VolumeName::new("v").unwrap(),
                size_bytes: GIB,
                group: None,
                replicas: Some(2),
                nodes: None,
                pool: None,
                adopt: None,
                now_ms: 0,
            })
            .unwrap();
        let volume = state.volumes.values_mut().next().unwrap();
        volume.in_sync.remove(&NodeId(2));
        state
    }

    fn pool_report(free_bytes: u64) -> Vec<PoolReport> {
        vec![PoolReport {
            name: PoolName::new("default").unwrap(),
            record: PoolRecord {
                class: DeviceClass::Ssd,
                capacity_bytes: 64 * GIB,
                free_bytes,
                online: true,
                reported_ms: 0,
            },
        }]
    }

    /// Node `name`, online, with a 64 GiB pool; its id.
    fn add_node_with_pool(state: &mut ClusterState, name: &str) -> NodeId {
        let reply = state
            .apply(Command::AddNode {
                node: trireme_control::NodeRegistration {
                    name: NodeName::new(name).unwrap(),
                    api_address: "127.0.0.1:9".into(),
                    nbd_address: None,
                    data_address: None,
                    labels: Default::default(),
                },
                nonce: name.into(),
                now_ms: 0,
            })
            .unwrap();
        let trireme_control::Reply::NodeAdded { node } = reply else {
            panic!("{reply:?}");
        };
        state
            .apply(Command::ReportPools {
                node,
                pools: pool_report(64 * GIB),
            })
            .unwrap();
        node
    }

    fn set_free(state: &mut ClusterState, node: NodeId, free_bytes: u64) {
        let node = state.nodes.get_mut(&node).unwrap();
        node.pools.values_mut().next().unwrap().free_bytes = free_bytes;
    }

    fn replica_on_b(state: &mut ClusterState) -> &mut trireme_control::model::ReplicaRecord {
        let volume = state.volumes.values_mut().next().unwrap();
        volume
            .replicas
            .iter_mut()
            .find(|replica| replica.node == NodeId(2))
            .unwrap()
    }

    #[test]
    fn quorum_warnings_say_how_far_a_volume_is_from_losing_writes() {
        // Two replicas and no tiebreaker (two nodes), b outdated: the
        // issue's `n2,n1(outdated)` with its tiebreaker lost.
        let mut state = outdated_replica_on_b();
        let volume_warning =
            |state: &ClusterState| quorum_warning(state.volumes.values().next().unwrap(), state);
        let text = volume_warning(&state).expect("a warning");
        assert!(
            text.starts_with("volume v has no quorum: 1 of its 2 voters are up to date and online (a, b (outdated)) and a write needs 2")
                && text.contains("it has no tiebreaker"),
            "{text}"
        );
        // A third node: the leader's restore gives it a tiebreaker, and
        // quorum is back, with nothing to spare.
        add_node_with_pool(&mut state, "c");
        let name = VolumeName::new("v").unwrap();
        state
            .apply(Command::RestorePlacement { name: name.clone() })
            .unwrap();
        let text = volume_warning(&state).expect("a warning");
        assert!(
            text.starts_with("volume v is one failure from losing its quorum: 2 of its 3 voters")
                && text.contains("c (tiebreaker)")
                && !text.contains("no tiebreaker"),
            "{text}"
        );
        state
            .volumes
            .get_mut(&name)
            .unwrap()
            .in_sync
            .insert(NodeId(2));
        assert_eq!(volume_warning(&state), None);
    }

    #[test]
    fn an_evicted_nodes_warning_says_what_is_still_on_it() {
        let mut state = outdated_replica_on_b();
        let name = VolumeName::new("v").unwrap();
        let volume = state.volumes.get_mut(&name).unwrap();
        volume.in_sync.insert(NodeId(2));
        for replica in &mut volume.replicas {
            replica.observed = ReplicaObserved::Ready;
        }
        state
            .apply(Command::SetNodeState {
                node: NodeId(2),
                state: NodeState::Offline,
                now_ms: 0,
            })
            .unwrap();
        state
            .apply(Command::EvictNode {
                node: NodeId(2),
                now_ms: 0,
            })
            .unwrap();
        let b = state.nodes[&NodeId(2)].clone();
        let text = evicted_warning(&b, &state);
        assert!(
            text.contains("node b was evicted, but volume(s) v still have a replica on it")
                && !text.contains("placed on other nodes"),
            "{text}"
        );
        // What `status` suggests for the replica left there must work:
        // no `replica add` while no online node can take one.
        let warnings = resync_warnings(&state.volumes[&name], &state, 0);
        assert!(
            warnings.iter().all(|text| !text.contains("replica add")),
            "{warnings:?}"
        );
        // One new node is not enough to move it: an empty replica there
        // and none on b would leave one up-to-date voter of two. It
        // becomes the tiebreaker; with a second node, the leader's
        // restore moves the replica.
        add_node_with_pool(&mut state, "c");
        state
            .apply(Command::RestorePlacement { name: name.clone() })
            .unwrap();
        assert!(state.volumes[&name].is_diskful_on(NodeId(2)));
        assert!(evicted_warning(&b, &state).contains("still have a replica on it"));
        add_node_with_pool(&mut state, "d");
        state.apply(Command::RestorePlacement { name }).unwrap();
        let text = evicted_warning(&b, &state);
        assert!(
            text.contains("its replicas were placed on other nodes"),
            "{text}"
        );
    }

    #[test]
    fn resync_warnings_say_what_holds_a_replica_back() {
        let mut state = outdated_replica_on_b();
        let warnings = |state: &ClusterState| {
            resync_warnings(state.volumes.values().next().unwrap(), state, 0)
        };
        let [text] = warnings(&state).try_into().unwrap();
        assert!(!text.contains("full"), "{text}");
        // Less free space than one report step (1/64 of the pool) is full.
        set_free(
            &mut state,
            NodeId(2),
            64 * GIB / FREE_BYTES_REPORT_SHARE - 1,
        );
        let [text] = warnings(&state).try_into().unwrap();
        // Two nodes, both holding a replica: nowhere to move it.
        assert!(
            text.contains("the replica on b is outdated and its pool default is full")
                && text.contains("add a node: no other online node can take a replica")
                && !text.contains("replica add"),
            "{text}"
        );
        add_node_with_pool(&mut state, "c");
        let [text] = warnings(&state).try_into().unwrap();
        assert!(
            text.contains("the replica on b is outdated and its pool default is full")
                && text.contains("trireme volume replica remove v --node b"),
            "{text}"
        );
        // While a resync runs, the warning says what will stop it.
        replica_on_b(&mut state).sync = Some(trireme_control::model::SyncProgress {
            done_bytes: 0,
            total_bytes: GIB,
            rate_bytes_per_sec: 0,
            reported_ms: 0,
        });
        let [text] = warnings(&state).try_into().unwrap();
        assert!(
            text.contains("is syncing") && text.contains("its pool default is full"),
            "{text}"
        );
        // A record left behind by a resync that stopped reads as stalled,
        // with the reason.
        let stalled = resync_warnings(
            state.volumes.values().next().unwrap(),
            &state,
            SYNC_STALLED_AFTER_MS + 5_000,
        );
        let [text] = stalled.try_into().unwrap();
        assert!(
            text.contains("the resync of the replica on b has stalled at 0% (no progress for 35s): its pool default is full"),
            "{text}"
        );
        set_free(&mut state, NodeId(2), 64 * GIB);
        let [text] = resync_warnings(
            state.volumes.values().next().unwrap(),
            &state,
            SYNC_STALLED_AFTER_MS + 5_000,
        )
        .try_into()
        .unwrap();
        assert!(
            text.contains("stalled") && text.contains("the volume is not attached"),
            "{text}"
        );
        replica_on_b(&mut state).sync = None;
        // Only the outdated replica's pool counts.
        set_free(&mut state, NodeId(2), 64 * GIB);
        set_free(&mut state, NodeId(1), 0);
        let [text] = warnings(&state).try_into().unwrap();
        assert!(!text.contains("full"), "{text}");
    }
}
