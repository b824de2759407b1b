//! Snapshot handlers: take, list, delete, roll back, clone and schedules.
//!
//! Each writes a command to the control plane, then waits (bounded) for
//! the nodes to do the work the command asks for, so that a CLI call
//! returns once the snapshot is taken, deleted or rolled back; past the
//! wait it answers 202 with the state so far.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use std::time::Duration;
use trireme_control::{
    ClusterState, Command, CommandError, NodeState, Reply, SnapshotRecord, SnapshotState,
};
use trireme_types::{GroupName, SnapshotId, SnapshotName, VolumeName};

use super::model::{
    CloneRequest, CreateSnapshotRequest, ErrorBody, RollbackRequest, ScheduleRequest,
    ScheduleResponse, SnapshotResponse, VolumeResponse,
};
use super::{validate, ApiError, ApiJson, ApiState};
use crate::cluster::{auth, ClusterError};
use crate::NodeError;

/// How long taking, deleting or rolling back waits for the nodes.
const WORK_WAIT: Duration = Duration::from_secs(60);
/// How long a snapshot of a just-detached volume waits for its replicas to
/// confirm the detach (fencing).
const FENCE_WAIT: Duration = Duration::from_secs(15);

/// Whether a detached volume's up-to-date replicas on online nodes have all
/// confirmed the detach (true too for an attached or unknown volume: the
/// command then answers for itself).
fn every_online_copy_fenced(cluster: &ClusterState, volume: &VolumeName) -> bool {
    let Some(record) = cluster.volumes.get(volume) else {
        return true;
    };
    if !record.primaries.is_empty() {
        return true;
    }
    record.in_sync.iter().all(|node| {
        record.fenced.contains(node)
            || cluster
                .nodes
                .get(node)
                .is_none_or(|node| node.state != NodeState::Online)
    })
}

fn snapshot_name(name: &str) -> Result<SnapshotName, ApiError> {
    SnapshotName::new(name).map_err(|error| NodeError::from(error).into())
}

impl ApiState {
    fn snapshot_response(&self, volume: &VolumeName, record: &SnapshotRecord) -> SnapshotResponse {
        let state = self.cluster.state.read();
        let me = self.cluster.node_id();
        let nbd_url = if record.nodes.contains(&me) {
            self.addresses
                .nbd_url_base
                .as_ref()
                .map(|base| format!("nbd://{base}/{volume}@{}", record.name))
        } else {
            record
                .nodes
                .iter()
                .filter_map(|node| state.nodes.get(node))
                .find_map(|node| node.nbd_address.as_ref())
                .map(|address| format!("nbd://{address}/{volume}@{}", record.name))
        };
        SnapshotResponse {
            volume: volume.to_string(),
            name: record.name.to_string(),
            id: record.id.0,
            state: record.state.as_str().to_string(),
            error: match &record.state {
                SnapshotState::Failed { reason } => Some(reason.clone()),
                _ => None,
            },
            created_unix_seconds: record.created_ms / 1000,
            size_bytes: record.size_bytes,
            nodes: record
                .nodes
                .iter()
                .map(|node| state.node_name(*node))
                .collect(),
            scheduled: record.scheduled,
            exclusive_bytes: record.exclusive_bytes,
            shared_bytes: record.shared_bytes,
            nbd_url: nbd_url.filter(|_| record.is_ready()),
        }
    }

    fn snapshot_record(&self, volume: &VolumeName, id: SnapshotId) -> Option<SnapshotRecord> {
        self.cluster
            .state
            .read()
            .volumes
            .get(volume)
            .and_then(|record| record.snapshot_by_id(id))
            .cloned()
    }

    /// Waits until `check` says the work on the volume is done.
    async fn wait_for(&self, check: impl FnMut(&ClusterState) -> bool) -> bool {
        self.cluster.wait_for_state(WORK_WAIT, check).await
    }
}

#[utoipa::path(post, path = "/api/v1/volumes/{name}/snapshots", tag = "snapshots",
    params(("name" = String, Path, description = "Volume name")),
    request_body = CreateSnapshotRequest,
    responses(
        (status = 201, description = "Snapshot taken on the volume's replicas", body = SnapshotResponse),
        (status = 202, description = "Asked; not every replica has taken it yet", body = SnapshotResponse),
        (status = 404, description = "No such volume", body = ErrorBody),
        (status = 409, description = "A snapshot of that name exists, or the volume is rolling back", body = ErrorBody),
        (status = 500, description = "No replica could take it (the message says why)", body = ErrorBody)))]
pub async fn create_snapshot(
    State(state): State<ApiState>,
    Path(volume): Path<String>,
    ApiJson(request): ApiJson<CreateSnapshotRequest>,
) -> Result<(StatusCode, Json<SnapshotResponse>), ApiError> {
    let volume = validate::volume_name(&volume)?;
    let name = snapshot_name(&request.name)?;
    let command = || Command::CreateSnapshot {
        volume: volume.clone(),
        name: name.clone(),
        scheduled: false,
        now_ms: auth::now_ms(),
    };
    // A volume detached a moment ago: its replicas confirm within seconds,
    // each on its own. Wait (bounded) for every up-to-date replica on an
    // online node, so the snapshot is taken on all of them and not only on
    // the first to confirm; an offline one gets no wait.
    let deadline = tokio::time::Instant::now() + FENCE_WAIT;
    state
        .cluster
        .wait_for_state(FENCE_WAIT, |cluster| {
            every_online_copy_fenced(cluster, &volume)
        })
        .await;
    let reply = loop {
        match state.cluster.write(command()).await {
            Err(ClusterError::Refused(CommandError::NotFenced { .. }))
                if tokio::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            other => break other?,
        }
    };
    let Reply::Snapshot(asked) = reply else {
        return Err(NodeError::Internal("taking a snapshot gave no snapshot".into()).into());
    };
    let id = asked.id;
    state
        .wait_for(|cluster| {
            cluster
                .volumes
                .get(&volume)
                .and_then(|record| record.snapshot_by_id(id))
                .is_none_or(|snapshot| !matches!(snapshot.state, SnapshotState::Creating { .. }))
        })
        .await;
    let record = state.snapshot_record(&volume, id).unwrap_or(*asked);
    match &record.state {
        SnapshotState::Ready => Ok((
            StatusCode::CREATED,
            Json(state.snapshot_response(&volume, &record)),
        )),
        SnapshotState::Failed { reason } => {
            // Nothing to keep: the name is free again (copies some replica
            // made are removed with the record).
            let _ = state
                .cluster
                .write(Command::DeleteSnapshot {
                    volume: volume.clone(),
                    name: name.clone(),
                })
                .await;
            Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "snapshot_failed",
                format!("snapshot '{name}' of volume '{volume}' could not be taken: {reason}"),
            ))
        }
        _ => Ok((
            StatusCode::ACCEPTED,
            Json(state.snapshot_response(&volume, &record)),
        )),
    }
}

#[utoipa::path(get, path = "/api/v1/volumes/{name}/snapshots", tag = "snapshots",
    params(("name" = String, Path, description = "Volume name")),
    responses(
        (status = 200, description = "The volume's snapshots, oldest first", body = [SnapshotResponse]),
        (status = 404, description = "No such volume", body = ErrorBody)))]
pub async fn list_snapshots(
    State(state): State<ApiState>,
    Path(volume): Path<String>,
) -> Result<Json<Vec<SnapshotResponse>>, ApiError> {
    let volume = validate::volume_name(&volume)?;
    let record = state.volume_record(&volume)?;
    Ok(Json(
        record
            .snapshots
            .iter()
            .map(|snapshot| state.snapshot_response(&volume, snapshot))
            .collect(),
    ))
}

#[utoipa::path(get, path = "/api/v1/snapshots", tag = "snapshots",
    responses((status = 200, description = "Every snapshot of every volume", body = [SnapshotResponse])))]
pub async fn list_all_snapshots(State(state): State<ApiState>) -> Json<Vec<SnapshotResponse>> {
    let volumes: Vec<_> = state
        .cluster
        .state
        .read()
        .volumes
        .values()
        .cloned()
        .collect();
    Json(
        volumes
            .iter()
            .flat_map(|volume| {
                volume
                    .snapshots
                    .iter()
                    .map(|snapshot| state.snapshot_response(&volume.name, snapshot))
                    .collect::<Vec<_>>()
            })
            .collect(),
    )
}

#[utoipa::path(delete, path = "/api/v1/volumes/{name}/snapshots/{snapshot}", tag = "snapshots",
    params(("name" = String, Path, description = "Volume name"),
           ("snapshot" = String, Path, description = "Snapshot name")),
    responses(
        (status = 204, description = "Deleted on every node; its space is returned"),
        (status = 202, description = "Deleting: a node holding it has not removed it yet (offline?)"),
        (status = 404, description = "No such volume or snapshot", body = ErrorBody),
        (status = 409, description = "A clone of it is being made, or the volume rolls back to it", body = ErrorBody)))]
pub async fn delete_snapshot(
    State(state): State<ApiState>,
    Path((volume, snapshot)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    let volume = validate::volume_name(&volume)?;
    let name = snapshot_name(&snapshot)?;
    let reply = state
        .cluster
        .write(Command::DeleteSnapshot {
            volume: volume.clone(),
            name: name.clone(),
        })
        .await?;
    let Reply::Snapshot(deleting) = reply else {
        return Ok(StatusCode::NO_CONTENT);
    };
    let id = deleting.id;
    // Wait for the holders that can answer: a node that is offline removes
    // its copy when it is back, so waiting for it would only hang the caller.
    let mut gone = false;
    state
        .wait_for(|cluster| {
            let Some(snapshot) = cluster
                .volumes
                .get(&volume)
                .and_then(|record| record.snapshot_by_id(id))
            else {
                gone = true;
                return true;
            };
            snapshot.nodes.iter().all(|node| {
                cluster
                    .nodes
                    .get(node)
                    .is_none_or(|record| record.state != NodeState::Online)
            })
        })
        .await;
    Ok(if gone {
        StatusCode::NO_CONTENT
    } else {
        StatusCode::ACCEPTED
    })
}

#[utoipa::path(post, path = "/api/v1/volumes/{name}/rollback", tag = "snapshots",
    params(("name" = String, Path, description = "Volume name")),
    request_body = RollbackRequest,
    responses(
        (status = 200, description = "Every replica holding the snapshot has its content again", body = VolumeResponse),
        (status = 202, description = "Rolling back: some replicas' nodes have not finished (the volume cannot be attached until they have)", body = VolumeResponse),
        (status = 404, description = "No such volume or snapshot", body = ErrorBody),
        (status = 409, description = "The volume is attached, or a snapshot is being taken", body = ErrorBody)))]
pub async fn rollback_volume(
    State(state): State<ApiState>,
    Path(volume): Path<String>,
    ApiJson(request): ApiJson<RollbackRequest>,
) -> Result<(StatusCode, Json<VolumeResponse>), ApiError> {
    let volume = validate::volume_name(&volume)?;
    let snapshot = snapshot_name(&request.snapshot)?;
    state
        .cluster
        .write(Command::RollbackVolume {
            volume: volume.clone(),
            snapshot,
        })
        .await?;
    let done = state
        .wait_for(|cluster| {
            cluster
                .volumes
                .get(&volume)
                .is_none_or(|record| record.rollback.is_none())
        })
        .await;
    let record = state.volume_record(&volume)?;
    let status = if done {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, Json(state.volume_response(&record).await)))
}

#[utoipa::path(post, path = "/api/v1/volumes/{name}/snapshots/{snapshot}/clone", tag = "snapshots",
    params(("name" = String, Path, description = "Volume name"),
           ("snapshot" = String, Path, description = "Snapshot name")),
    request_body = CloneRequest,
    responses(
        (status = 201, description = "Clone created on the snapshot's nodes, sharing its chunks", body = VolumeResponse),
        (status = 202, description = "Clone created; some replicas' nodes have not reported yet", body = VolumeResponse),
        (status = 404, description = "No such volume, snapshot or group", body = ErrorBody),
        (status = 409, description = "A volume of that name exists, or placement is impossible", body = ErrorBody)))]
pub async fn clone_snapshot(
    State(state): State<ApiState>,
    Path((volume, snapshot)): Path<(String, String)>,
    ApiJson(request): ApiJson<CloneRequest>,
) -> Result<(StatusCode, Json<VolumeResponse>), ApiError> {
    let source = validate::volume_name(&volume)?;
    let snapshot = snapshot_name(&snapshot)?;
    let name = validate::volume_name(&request.name)?;
    let group = request
        .group
        .as_deref()
        .map(GroupName::new)
        .transpose()
        .map_err(NodeError::from)?;
    let reply = state
        .cluster
        .write(Command::CloneVolume {
            name: name.clone(),
            source,
            snapshot,
            group,
            now_ms: auth::now_ms(),
        })
        .await?;
    let Reply::Volume(created) = reply else {
        return Err(NodeError::Internal("cloning gave no volume".into()).into());
    };
    let record = state
        .wait_replicas(&name, created.id)
        .await
        .unwrap_or(*created);
    let pending = record
        .diskful()
        .any(|replica| replica.observed == trireme_control::ReplicaObserved::Pending);
    let status = if pending {
        StatusCode::ACCEPTED
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(state.volume_response(&record).await)))
}

fn schedule_response(volume: &VolumeName, state: &ApiState) -> Result<ScheduleResponse, ApiError> {
    let record = state.volume_record(volume)?;
    Ok(ScheduleResponse {
        volume: volume.to_string(),
        every_secs: record.schedule.as_ref().map(|schedule| schedule.every_secs),
        keep: record.schedule.as_ref().map(|schedule| schedule.keep),
    })
}

#[utoipa::path(get, path = "/api/v1/volumes/{name}/snapshot-schedule", tag = "snapshots",
    params(("name" = String, Path, description = "Volume name")),
    responses(
        (status = 200, description = "The volume's snapshot schedule (empty fields: none)", body = ScheduleResponse),
        (status = 404, description = "No such volume", body = ErrorBody)))]
pub async fn show_schedule(
    State(state): State<ApiState>,
    Path(volume): Path<String>,
) -> Result<Json<ScheduleResponse>, ApiError> {
    let volume = validate::volume_name(&volume)?;
    Ok(Json(schedule_response(&volume, &state)?))
}

#[utoipa::path(put, path = "/api/v1/volumes/{name}/snapshot-schedule", tag = "snapshots",
    params(("name" = String, Path, description = "Volume name")),
    request_body = ScheduleRequest,
    responses(
        (status = 200, description = "Schedule set: the first snapshot comes one interval from now", body = ScheduleResponse),
        (status = 400, description = "Interval or count out of range", body = ErrorBody),
        (status = 404, description = "No such volume", body = ErrorBody)))]
pub async fn set_schedule(
    State(state): State<ApiState>,
    Path(volume): Path<String>,
    ApiJson(request): ApiJson<ScheduleRequest>,
) -> Result<Json<ScheduleResponse>, ApiError> {
    let volume = validate::volume_name(&volume)?;
    state
        .cluster
        .write(Command::SetSnapshotSchedule {
            volume: volume.clone(),
            schedule: Some((request.every_secs, request.keep)),
            now_ms: auth::now_ms(),
        })
        .await?;
    Ok(Json(schedule_response(&volume, &state)?))
}

#[utoipa::path(delete, path = "/api/v1/volumes/{name}/snapshot-schedule", tag = "snapshots",
    params(("name" = String, Path, description = "Volume name")),
    responses(
        (status = 200, description = "No schedule any more; its snapshots stay", body = ScheduleResponse),
        (status = 404, description = "No such volume", body = ErrorBody)))]
pub async fn delete_schedule(
    State(state): State<ApiState>,
    Path(volume): Path<String>,
) -> Result<Json<ScheduleResponse>, ApiError> {
    let volume = validate::volume_name(&volume)?;
    state
        .cluster
        .write(Command::SetSnapshotSchedule {
            volume: volume.clone(),
            schedule: None,
            now_ms: auth::now_ms(),
        })
        .await?;
    Ok(Json(schedule_response(&volume, &state)?))
}
