//! `/api/v1/volumes`: cluster volumes. Creating, growing and deleting are
//! commands committed through the leader (any node forwards them); the
//! handlers then wait for the nodes holding replicas to report, so a
//! `201 Created` volume is ready to use. Attaching, detaching and adding or
//! removing a replica are commands too; they answer once committed (the
//! data path acts on them, and resyncs show in the volume's replicas).
//! Reads come from this node's copy of the cluster state.

use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::Json;
use std::time::Duration;
use trireme_control::{
    command::takeover_advice, ClusterState, Command, CommandError, NodeState, ReplicaFailure,
    ReplicaKind, ReplicaObserved, ReplicaRecord, Reply, SyncProgress, VolumeRecord,
};
use trireme_types::{GroupName, NodeId, NodeName, VolumeName};

use super::model::{
    AddReplicaRequest, AttachRequest, AttachResponse, CreateVolumeRequest, DetachRequest,
    ErrorBody, FencedPrimaryResponse, GrowVolumeRequest, ReplicaResponse, SyncResponse,
    VolumeResponse, VolumeState,
};
use super::{blocking, validate, ApiError, ApiJson, ApiState};
use crate::cluster::protocol::LastHeard;
use crate::cluster::{auth, ClusterError, OFFLINE_AFTER};
use crate::NodeError;

/// How long a request waits for the replicas' nodes to act on a change.
pub const REPLICA_WAIT: Duration = Duration::from_secs(30);

fn node_online(state: &ClusterState, node: trireme_types::NodeId) -> bool {
    state
        .nodes
        .get(&node)
        .is_some_and(|node| node.state == NodeState::Online)
}

/// The volume's state, as every command and answer shows it.
pub fn volume_state(volume: &VolumeRecord, state: &ClusterState) -> VolumeState {
    state.volume_health(volume).into()
}

/// A resync's progress as the API shows it, with its percentage and the
/// time left at the reported rate.
///
/// A running resync reports every second (`PROGRESS_EVERY_MS`); a record
/// older than [`SYNC_STALLED_AFTER_MS`] is what a resync left behind when it
/// stopped (its primary died, or it failed), and shows as stalled rather
/// than as a rate and a time left that will never come true. The margin
/// covers commit delays and clocks a little apart between nodes.
pub fn sync_response(progress: &SyncProgress, now_ms: u64) -> SyncResponse {
    let done = progress.done_bytes.min(progress.total_bytes);
    let silent_ms = now_ms.saturating_sub(progress.reported_ms);
    let stalled_secs = (silent_ms > SYNC_STALLED_AFTER_MS).then_some(silent_ms / 1000);
    let rate_bytes_per_sec = if stalled_secs.is_some() {
        0
    } else {
        progress.rate_bytes_per_sec
    };
    let eta_secs = (rate_bytes_per_sec > 0)
        .then(|| (progress.total_bytes - done).div_ceil(rate_bytes_per_sec));
    SyncResponse {
        done_bytes: progress.done_bytes,
        total_bytes: progress.total_bytes,
        rate_bytes_per_sec,
        eta_secs,
        percent: sync_percent(progress),
        stalled_secs,
    }
}

/// See [`sync_response`].
pub const SYNC_STALLED_AFTER_MS: u64 = 30_000;

/// 0 to 100: how much of the resync is done.
fn sync_percent(progress: &SyncProgress) -> u64 {
    let done = progress.done_bytes.min(progress.total_bytes);
    if progress.total_bytes == 0 {
        100
    } else {
        (u128::from(done) * 100 / u128::from(progress.total_bytes)) as u64
    }
}

/// What a replica is to the volume's data: `primary`, `up-to-date`,
/// `outdated`, `syncing 42%`, `diskless` or `tiebreaker`; a primary whose
/// own diskful replica is behind shows `primary (outdated)` or
/// `primary (syncing 42%)`.
pub fn replica_state(volume: &VolumeRecord, replica: &ReplicaRecord) -> String {
    let data = match replica.kind {
        ReplicaKind::Diskless => None,
        ReplicaKind::Tiebreaker => Some("tiebreaker".to_string()),
        ReplicaKind::Diskful if volume.is_in_sync(replica.node) => None,
        ReplicaKind::Diskful => Some(match &replica.sync {
            Some(progress) => format!("syncing {}%", sync_percent(progress)),
            None => "outdated".to_string(),
        }),
    };
    match (volume.is_attached_on(replica.node), data) {
        (true, None) => "primary".to_string(),
        (true, Some(other)) => format!("primary ({other})"),
        (false, Some(data)) => data,
        (false, None) if replica.kind == ReplicaKind::Diskless => "diskless".to_string(),
        (false, None) => "up-to-date".to_string(),
    }
}

/// The id of the node named `name`; 404 when there is none.
pub(super) fn node_named(state: &ClusterState, name: &str) -> Result<NodeId, ApiError> {
    let name = NodeName::new(name).map_err(NodeError::from)?;
    state
        .node_by_name(&name)
        .map(|node| node.id)
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "node_not_found",
                format!("no node named '{name}': see `trireme node list`"),
            )
        })
}

impl ApiState {
    /// Where `node` serves volume `name` over NBD (TCP).
    fn nbd_url_on(&self, node: NodeId, name: &VolumeName) -> Option<String> {
        let address = if node == self.cluster.node_id() {
            self.addresses.nbd_url_base.clone()
        } else {
            self.cluster
                .state
                .read()
                .nodes
                .get(&node)
                .and_then(|node| node.nbd_address.clone())
        };
        address.map(|address| format!("nbd://{address}/{name}"))
    }

    pub(super) async fn volume_response(&self, record: &VolumeRecord) -> VolumeResponse {
        let me = self.cluster.node_id();
        let now_ms = auth::now_ms();
        let local = match record.replica(me) {
            Some(replica) if replica.kind == ReplicaKind::Diskful => {
                let name = record.name.clone();
                blocking(&self.node, move |node| node.volume(&name))
                    .await
                    .ok()
            }
            _ => None,
        };
        let state = self.cluster.state.read();
        let diskful: Vec<_> = record.diskful().collect();
        let url_on = |node: NodeId| {
            if node == me {
                self.addresses.nbd_url_base.clone()
            } else {
                state
                    .nodes
                    .get(&node)
                    .and_then(|node| node.nbd_address.clone())
            }
            .map(|address| format!("nbd://{address}/{}", record.name))
        };
        // An attached volume is served by its primary (this node first, if
        // it is one); one that is not is served where its only replica lives.
        let primary = record
            .primaries
            .iter()
            .filter(|primary| !primary.resync_only)
            .map(|primary| primary.node)
            .find(|node| *node == me)
            .or_else(|| {
                record
                    .primaries
                    .iter()
                    .find(|primary| !primary.resync_only)
                    .map(|primary| primary.node)
            });
        let nbd_url = match diskful.as_slice() {
            _ if primary.is_some() => primary.and_then(url_on),
            [only] if only.node == me => self
                .addresses
                .nbd_url_base
                .as_ref()
                .map(|base| format!("nbd://{base}/{}", record.name)),
            [only] => state
                .nodes
                .get(&only.node)
                .and_then(|node| node.nbd_address.as_ref())
                .map(|address| format!("nbd://{address}/{}", record.name)),
            _ => None,
        };
        VolumeResponse {
            name: record.name.to_string(),
            id: record.id,
            pool: local
                .as_ref()
                .map(|info| info.pool.to_string())
                .or_else(|| {
                    diskful
                        .first()
                        .and_then(|r| r.pool.as_ref())
                        .map(|p| p.to_string())
                })
                .unwrap_or_default(),
            size_bytes: record.size_bytes,
            allocated_bytes: local
                .as_ref()
                .map(|info| info.allocated_bytes)
                .unwrap_or_else(|| {
                    diskful
                        .iter()
                        .map(|replica| replica.allocated_bytes)
                        .max()
                        .unwrap_or(0)
                }),
            created_unix_seconds: record.created_ms / 1000,
            checksum_errors: local.as_ref().map(|info| info.checksum_errors).unwrap_or(0),
            nbd_url,
            group: record.group.to_string(),
            state: volume_state(record, &state),
            replicas: record
                .replicas
                .iter()
                .map(|replica| {
                    let (observed, message) = match &replica.observed {
                        ReplicaObserved::Pending => ("pending", None),
                        ReplicaObserved::Ready => ("ready", None),
                        ReplicaObserved::Failed(message) => ("failed", Some(message.to_string())),
                    };
                    let in_sync = record.is_in_sync(replica.node);
                    ReplicaResponse {
                        node: state.node_name(replica.node),
                        kind: replica.kind.as_str().to_string(),
                        pool: replica.pool.as_ref().map(|pool| pool.to_string()),
                        state: replica_state(record, replica),
                        observed: observed.to_string(),
                        message,
                        allocated_bytes: replica.allocated_bytes,
                        in_sync,
                        // A late report about a replica marked in sync since.
                        sync: replica
                            .sync
                            .as_ref()
                            .filter(|_| !in_sync)
                            .map(|progress| sync_response(progress, now_ms)),
                        resync_blocked: (replica.kind == ReplicaKind::Diskful && !in_sync)
                            .then(|| {
                                crate::replicated::resync::blocked(&state, record, replica.node)
                            })
                            .flatten(),
                    }
                })
                .collect(),
            generation: record.generation.0,
            // A resync-only engine is not an attachment.
            primaries: record
                .primaries
                .iter()
                .filter(|primary| !primary.resync_only)
                .map(|primary| state.node_name(primary.node))
                .collect(),
        }
    }

    pub(super) fn volume_record(&self, name: &VolumeName) -> Result<VolumeRecord, ApiError> {
        self.cluster
            .state
            .read()
            .volumes
            .get(name)
            .cloned()
            .ok_or_else(|| NodeError::VolumeNotFound(name.clone()).into())
    }

    /// Waits until no diskful replica of `name` (id `id`) is pending on an
    /// online node (an offline node makes its replica when it returns).
    pub(super) async fn wait_replicas(&self, name: &VolumeName, id: u64) -> Option<VolumeRecord> {
        let mut latest = None;
        self.cluster
            .wait_for_state(REPLICA_WAIT, |state| match state.volumes.get(name) {
                Some(volume) if volume.id == id => {
                    latest = Some(volume.clone());
                    !volume.diskful().any(|replica| {
                        replica.observed == ReplicaObserved::Pending
                            && node_online(state, replica.node)
                    })
                }
                // Not applied here yet: keep waiting. Replaced: done.
                Some(_) => true,
                None => false,
            })
            .await;
        latest
    }
}

#[utoipa::path(get, path = "/api/v1/volumes", tag = "volumes",
    responses((status = 200, description = "Every volume of the cluster", body = [VolumeResponse])))]
pub async fn list_volumes(
    State(state): State<ApiState>,
) -> Result<Json<Vec<VolumeResponse>>, ApiError> {
    let records: Vec<VolumeRecord> = state
        .cluster
        .state
        .read()
        .volumes
        .values()
        .cloned()
        .collect();
    let mut answers = Vec::with_capacity(records.len());
    for record in &records {
        answers.push(state.volume_response(record).await);
    }
    Ok(Json(answers))
}

#[utoipa::path(post, path = "/api/v1/volumes", tag = "volumes", request_body = CreateVolumeRequest,
    responses(
        (status = 201, description = "Volume created and its replicas ready", body = VolumeResponse),
        (status = 202, description = "Volume created; some replicas' nodes have not reported yet", body = VolumeResponse),
        (status = 400, description = "Bad name or size", body = ErrorBody),
        (status = 404, description = "The named pool, group or node does not exist", body = ErrorBody),
        (status = 409, description = "A volume of that name exists, or placement is impossible (the message says why)", body = ErrorBody),
        (status = 503, description = "The control plane has no leader", body = ErrorBody),
        (status = 507, description = "No node has an online pool", body = ErrorBody)))]
pub async fn create_volume(
    State(state): State<ApiState>,
    ApiJson(request): ApiJson<CreateVolumeRequest>,
) -> Result<(StatusCode, Json<VolumeResponse>), ApiError> {
    let (name, size_bytes, pool) = validate::new_volume(&request)?;
    let group = request
        .group
        .as_deref()
        .map(GroupName::new)
        .transpose()
        .map_err(NodeError::from)?;
    let nodes = request
        .nodes
        .as_ref()
        .map(|names| {
            names
                .iter()
                .map(NodeName::new)
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()
        .map_err(NodeError::from)?;
    {
        let cluster_state = state.cluster.state.read();
        let mut pools = cluster_state
            .nodes
            .values()
            .flat_map(|node| node.pools.iter())
            .filter(|(_, pool)| pool.online);
        if let Some(pool) = &pool {
            if !pools.any(|(name, _)| name == pool) {
                return Err(NodeError::PoolNotFound(pool.to_string()).into());
            }
        } else if pools.next().is_none() {
            return Err(NodeError::NoPoolAvailable.into());
        }
    }
    let reply = state
        .cluster
        .write(Command::CreateVolume {
            name: name.clone(),
            size_bytes,
            group,
            replicas: request.replicas,
            nodes,
            pool,
            adopt: None,
            now_ms: auth::now_ms(),
        })
        .await?;
    let Reply::Volume(created) = reply else {
        return Err(NodeError::Internal("creating a volume gave no volume".into()).into());
    };
    let record = state
        .wait_replicas(&name, created.id)
        .await
        .unwrap_or(*created);
    let failures: Vec<(String, &ReplicaFailure)> = record
        .diskful()
        .filter_map(|replica| match &replica.observed {
            ReplicaObserved::Failed(failure) => Some((
                format!(
                    "{}: {failure}",
                    state.cluster.state.read().node_name(replica.node)
                ),
                failure,
            )),
            _ => None,
        })
        .collect();
    if !failures.is_empty()
        && !record
            .diskful()
            .any(|r| r.observed == ReplicaObserved::Ready)
    {
        // Nothing was made anywhere: take the record back, say why.
        let _ = state
            .cluster
            .write(Command::DeleteVolume {
                name: name.clone(),
                with_snapshots: false,
            })
            .await;
        let message = format!(
            "volume '{name}' could not be created: {}",
            failures
                .iter()
                .map(|(text, _)| text.as_str())
                .collect::<Vec<_>>()
                .join("; ")
        );
        let full = failures
            .iter()
            .any(|(_, failure)| matches!(failure, ReplicaFailure::NoSpace { .. }));
        let status = if full {
            StatusCode::INSUFFICIENT_STORAGE
        } else {
            StatusCode::INTERNAL_SERVER_ERROR
        };
        return Err(ApiError::new(status, "replica_failed", message));
    }
    let pending = record
        .diskful()
        .any(|replica| replica.observed == ReplicaObserved::Pending);
    let status = if pending {
        StatusCode::ACCEPTED
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(state.volume_response(&record).await)))
}

#[utoipa::path(get, path = "/api/v1/volumes/{name}", tag = "volumes",
    params(("name" = String, Path, description = "Volume name")),
    responses(
        (status = 200, description = "The volume", body = VolumeResponse),
        (status = 404, description = "No such volume", body = ErrorBody)))]
pub async fn show_volume(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<VolumeResponse>, ApiError> {
    let name = validate::volume_name(&name)?;
    let record = state.volume_record(&name)?;
    Ok(Json(state.volume_response(&record).await))
}

#[utoipa::path(delete, path = "/api/v1/volumes/{name}", tag = "volumes",
    params(
        ("name" = String, Path, description = "Volume name"),
        ("with_snapshots" = Option<bool>, Query, description = "Delete the volume's snapshots with it; without it a volume with snapshots is refused (409) [default: false]")),
    responses(
        (status = 204, description = "Volume deleted on every node; connected NBD clients get errors from now on"),
        (status = 202, description = "Deleting: a node holding a replica has not removed it yet (offline?)"),
        (status = 400, description = "A query parameter other than with_snapshots=true|false", body = ErrorBody),
        (status = 404, description = "No such volume", body = ErrorBody),
        (status = 409, description = "Attached, has snapshots (and with_snapshots is not true), or clones are being made from its snapshots; the message names them", body = ErrorBody)))]
pub async fn delete_volume(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<StatusCode, ApiError> {
    let name = validate::volume_name(&name)?;
    let with_snapshots = validate::with_snapshots(query.as_deref())?;
    let record = state.volume_record(&name)?;
    state
        .cluster
        .write(Command::DeleteVolume {
            name: name.clone(),
            with_snapshots,
        })
        .await?;
    let gone = state
        .cluster
        .wait_for_state(REPLICA_WAIT, |cluster_state| {
            cluster_state
                .volumes
                .get(&name)
                .is_none_or(|volume| volume.id != record.id)
        })
        .await;
    Ok(if gone {
        StatusCode::NO_CONTENT
    } else {
        StatusCode::ACCEPTED
    })
}

#[utoipa::path(post, path = "/api/v1/volumes/{name}/grow", tag = "volumes",
    params(("name" = String, Path, description = "Volume name")),
    request_body = GrowVolumeRequest,
    responses(
        (status = 200, description = "Volume grown", body = VolumeResponse),
        (status = 400, description = "Bad size, or smaller than the current size", body = ErrorBody),
        (status = 404, description = "No such volume", body = ErrorBody)))]
pub async fn grow_volume(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    ApiJson(request): ApiJson<GrowVolumeRequest>,
) -> Result<Json<VolumeResponse>, ApiError> {
    let name = validate::volume_name(&name)?;
    let size_bytes = validate::volume_size(request.size_bytes)?;
    let record = state.volume_record(&name)?;
    if size_bytes < record.size_bytes {
        // Same words as the store's refusal, before anything is committed.
        return Err(NodeError::Store(trireme_store::StoreError::ShrinkRefused {
            name,
            current_bytes: record.size_bytes,
            requested_bytes: size_bytes,
        })
        .into());
    }
    state
        .cluster
        .write(Command::GrowVolume {
            name: name.clone(),
            size_bytes,
        })
        .await?;
    let record = state
        .wait_replicas(&name, record.id)
        .await
        .ok_or_else(|| ApiError::from(NodeError::VolumeNotFound(name.clone())))?;
    Ok(Json(state.volume_response(&record).await))
}

/// This node's copy of `name` once it has applied a change just committed.
async fn answer_volume(
    state: &ApiState,
    name: &VolumeName,
) -> Result<Json<VolumeResponse>, ApiError> {
    let record = state.volume_record(name)?;
    Ok(Json(state.volume_response(&record).await))
}

#[utoipa::path(post, path = "/api/v1/volumes/{name}/attach", tag = "volumes",
    params(("name" = String, Path, description = "Volume name")),
    request_body = AttachRequest,
    responses(
        (status = 200, description = "Attached: the node is a primary (it already was, or became one; with no other primary the generation moved forward). A primary on a node that is not online, or any with force_takeover, was taken over and fenced (listed in `fenced`)", body = AttachResponse),
        (status = 404, description = "No such volume or node", body = ErrorBody),
        (status = 409, description = "Attached on a node still counted online (the message says when it was last heard from and when it would be marked offline), node not online, volume being deleted, or no replica up to date", body = ErrorBody)))]
pub async fn attach_volume(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    ApiJson(request): ApiJson<AttachRequest>,
) -> Result<Json<AttachResponse>, ApiError> {
    let name = validate::volume_name(&name)?;
    let node = {
        let cluster_state = state.cluster.state.read();
        if !cluster_state.volumes.contains_key(&name) {
            return Err(NodeError::VolumeNotFound(name).into());
        }
        node_named(&cluster_state, &request.node)?
    };
    let reply = state
        .cluster
        .write(Command::AttachVolume {
            name: name.clone(),
            node,
            allow_two_primaries: request.allow_two_primaries,
            force_takeover: request.force_takeover,
            now_ms: auth::now_ms(),
        })
        .await;
    let fenced = match reply {
        Ok(Reply::Attached { fenced, .. }) => fenced,
        Ok(_) => Vec::new(),
        Err(ClusterError::Refused(CommandError::AlreadyAttached { name, primary })) => {
            return Err(still_online(&state, name, primary).await)
        }
        Err(error) => return Err(error.into()),
    };
    let record = state.volume_record(&name)?;
    let mut volume = state.volume_response(&record).await;
    // The node just attached serves it, whichever node answers.
    volume.nbd_url = state.nbd_url_on(node, &record.name).or(volume.nbd_url);
    let cluster_state = state.cluster.state.read();
    let fenced = fenced
        .iter()
        .map(|primary| FencedPrimaryResponse {
            node: cluster_state.node_name(primary.node),
            state: primary.state.as_str().to_string(),
        })
        .collect();
    Ok(Json(AttachResponse { volume, fenced }))
}

/// The refusal of an attach where the only primary's node is still counted
/// online, with when the leader last heard from it: a node heard from a
/// moment ago is alive (a migration wants --allow-two-primaries); one
/// silent for seconds is probably dead and will be marked offline soon.
async fn still_online(state: &ApiState, name: String, primary: String) -> ApiError {
    let heard = match NodeName::new(primary.as_str()) {
        Ok(node_name) => {
            let node = state
                .cluster
                .state
                .read()
                .node_by_name(&node_name)
                .map(|node| node.id);
            match node {
                Some(node) => state.cluster.last_heard(node).await,
                None => None,
            }
        }
        Err(_) => None,
    };
    let offline_after = OFFLINE_AFTER.as_secs_f64();
    let soon = |left: f64| {
        if left < 0.1 {
            "any moment now if it is down".to_string()
        } else {
            format!("in about {left:.1} s if it is down")
        }
    };
    let when = match heard {
        Some(LastHeard::Ago { millis }) => {
            let ago = millis as f64 / 1000.0;
            format!(
                "the leader last heard from it {ago:.1} s ago and marks a node offline after {offline_after:.0} s without a heartbeat ({})",
                soon(offline_after - ago)
            )
        }
        Some(LastHeard::NotSince { millis }) => {
            let ago = millis as f64 / 1000.0;
            format!(
                "the leader, elected {ago:.1} s ago, has not heard from it yet and marks it offline after {offline_after:.0} s of silence ({})",
                soon(offline_after - ago)
            )
        }
        Some(LastHeard::NotLeader) | None => {
            format!("a node is marked offline {offline_after:.0} s after its last heartbeat")
        }
    };
    ApiError::new(
        StatusCode::CONFLICT,
        "already_attached",
        format!(
            "volume '{name}' is attached on node '{primary}', which the cluster still counts as online: {when}. {}",
            takeover_advice(&name, &primary)
        ),
    )
}

#[utoipa::path(post, path = "/api/v1/volumes/{name}/detach", tag = "volumes",
    params(("name" = String, Path, description = "Volume name")),
    request_body = DetachRequest,
    responses(
        (status = 200, description = "Detached from the node (the generation stays)", body = VolumeResponse),
        (status = 400, description = "Attached on two nodes and no node named", body = ErrorBody),
        (status = 404, description = "No such volume or node", body = ErrorBody),
        (status = 409, description = "Not attached, or not on that node", body = ErrorBody)))]
pub async fn detach_volume(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    ApiJson(request): ApiJson<DetachRequest>,
) -> Result<Json<VolumeResponse>, ApiError> {
    let name = validate::volume_name(&name)?;
    let node = {
        let cluster_state = state.cluster.state.read();
        if !cluster_state.volumes.contains_key(&name) {
            return Err(NodeError::VolumeNotFound(name).into());
        }
        request
            .node
            .as_deref()
            .map(|node| node_named(&cluster_state, node))
            .transpose()?
    };
    state
        .cluster
        .write(Command::DetachVolume {
            name: name.clone(),
            node,
        })
        .await?;
    answer_volume(&state, &name).await
}

#[utoipa::path(post, path = "/api/v1/volumes/{name}/replicas", tag = "volumes",
    params(("name" = String, Path, description = "Volume name")),
    request_body = AddReplicaRequest,
    responses(
        (status = 200, description = "Placed; the new replica is outdated until the data path has synced it", body = VolumeResponse),
        (status = 404, description = "No such volume or node", body = ErrorBody),
        (status = 409, description = "The node already holds one, or no node fits the volume's group (the message says why)", body = ErrorBody)))]
pub async fn add_replica(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    ApiJson(request): ApiJson<AddReplicaRequest>,
) -> Result<Json<VolumeResponse>, ApiError> {
    let name = validate::volume_name(&name)?;
    let pool = request
        .pool
        .as_deref()
        .map(validate::pool_name)
        .transpose()?;
    let node = {
        let cluster_state = state.cluster.state.read();
        if !cluster_state.volumes.contains_key(&name) {
            return Err(NodeError::VolumeNotFound(name).into());
        }
        request
            .node
            .as_deref()
            .map(|node| node_named(&cluster_state, node))
            .transpose()?
    };
    state
        .cluster
        .write(Command::AddReplica {
            name: name.clone(),
            node,
            pool,
            now_ms: auth::now_ms(),
        })
        .await?;
    answer_volume(&state, &name).await
}

#[utoipa::path(delete, path = "/api/v1/volumes/{name}/replicas/{node}", tag = "volumes",
    params(
        ("name" = String, Path, description = "Volume name"),
        ("node" = String, Path, description = "The node whose diskful replica goes")),
    responses(
        (status = 200, description = "Removed (a primary keeps a diskless membership)", body = VolumeResponse),
        (status = 404, description = "No such volume or node, or the node holds no diskful replica", body = ErrorBody),
        (status = 409, description = "It is the last up-to-date replica, or the volume would lose its quorum", body = ErrorBody)))]
pub async fn remove_replica(
    State(state): State<ApiState>,
    Path((name, node)): Path<(String, String)>,
) -> Result<Json<VolumeResponse>, ApiError> {
    let name = validate::volume_name(&name)?;
    let node = {
        let cluster_state = state.cluster.state.read();
        if !cluster_state.volumes.contains_key(&name) {
            return Err(NodeError::VolumeNotFound(name).into());
        }
        node_named(&cluster_state, &node)?
    };
    state
        .cluster
        .write(Command::RemoveReplica {
            name: name.clone(),
            node,
        })
        .await?;
    answer_volume(&state, &name).await
}
