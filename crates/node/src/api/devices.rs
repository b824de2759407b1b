//! `/api/v1/volumes/{name}/device` and `/api/v1/devices`: block devices of
//! volumes on this node's host, for the CSI node plugin
//! ([`crate::local_device`]). Unlike the rest of the API these act on the
//! node that answers, never on the cluster: the caller names the node it
//! means, and a request that reached another one is refused.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use std::time::Duration;
use trireme_control::{ClusterState, VolumeRecord};
use trireme_types::{NodeId, VolumeName};
use utoipa::ToSchema;

use super::model::ErrorBody;
use super::{ApiError, ApiJson, ApiState};
use crate::local_device::{Device, DeviceError, HandshakeError, KernelNbdError};
use crate::NodeError;

/// How long a device request waits for this node's copy of the cluster
/// state to show an attach that was just committed elsewhere.
const ATTACH_SEEN_WAIT: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeviceRequest {
    /// The node the caller means (its name): the device is made on the
    /// node that answers, so a request that reached another is refused.
    pub node: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DeviceResponse {
    pub volume: String,
    /// The node whose host has the device.
    pub node: String,
    /// The block device, e.g. `/dev/nbd0` or `/dev/loop3`.
    pub device: String,
    pub size_bytes: u64,
    /// How the device is made: `kernel-nbd` (the kernel's nbd module) or
    /// `nbdfuse-loop` (nbdfuse + a loop device).
    pub kind: String,
}

impl ApiState {
    fn device_response(&self, device: Device) -> DeviceResponse {
        DeviceResponse {
            volume: device.volume,
            node: self.cluster.config.name.to_string(),
            device: device.path,
            size_bytes: device.size_bytes,
            kind: device.kind.as_str().to_string(),
        }
    }
}

fn volume_name(name: &str) -> Result<VolumeName, ApiError> {
    VolumeName::new(name).map_err(|error| NodeError::from(error).into())
}

fn device_error(error: DeviceError) -> ApiError {
    match error {
        // The same answer on both paths: the agent applies an attach a
        // moment after it is committed, so the caller should retry.
        DeviceError::NotServed { .. }
        | DeviceError::KernelNbd(KernelNbdError::Handshake(HandshakeError::NoExport { .. })) => {
            ApiError::new(StatusCode::CONFLICT, "not_served", error.to_string())
        }
        DeviceError::Command(_) | DeviceError::KernelNbd(_) => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "device_failed",
            error.to_string(),
        ),
    }
}

fn volume_not_found(name: &VolumeName) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "volume_not_found",
        format!("no volume named '{name}': see `trireme volume list`"),
    )
}

/// Whether this node serves `volume` over NBD: attached here, or not
/// attached anywhere with its only replica here (as the NBD server rules).
fn served_here(volume: &VolumeRecord, me: NodeId) -> bool {
    let attached = volume.primaries.iter().any(|primary| !primary.resync_only);
    if attached {
        return volume.is_attached_on(me);
    }
    let diskful: Vec<_> = volume.diskful().collect();
    matches!(diskful.as_slice(), [only] if only.node == me)
}

/// Why this node does not serve `volume`.
fn not_served_here(state: &ClusterState, volume: &VolumeRecord, me: NodeId) -> ApiError {
    let here = state.node_name(me);
    let name = &volume.name;
    let primaries: Vec<String> = volume
        .primaries
        .iter()
        .filter(|primary| !primary.resync_only)
        .map(|primary| state.node_name(primary.node))
        .collect();
    let message = if primaries.is_empty() {
        format!(
            "volume '{name}' is not attached: attach it on this node ({here}) first \
             (`trireme volume attach {name} --node {here}`, or ControllerPublishVolume)"
        )
    } else {
        format!(
            "volume '{name}' is attached on {}, not on this node ({here}): attach it here first",
            primaries.join(" and ")
        )
    };
    ApiError::new(StatusCode::CONFLICT, "not_attached_here", message)
}

#[utoipa::path(put, path = "/api/v1/volumes/{name}/device", tag = "devices",
    params(("name" = String, Path, description = "Volume name")),
    request_body = DeviceRequest,
    responses(
        (status = 200, description = "The volume's block device on this node's host (made now or before; a kernel nbd device made before is first grown to the size this node serves, if the volume grew)", body = DeviceResponse),
        (status = 400, description = "A bad volume name or body", body = ErrorBody),
        (status = 404, description = "No such volume", body = ErrorBody),
        (status = 409, description = "The request reached another node, or this node does not serve the volume (not attached here)", body = ErrorBody)))]
pub async fn make_device(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    ApiJson(request): ApiJson<DeviceRequest>,
) -> Result<Json<DeviceResponse>, ApiError> {
    let name = volume_name(&name)?;
    let here = state.cluster.config.name.to_string();
    if request.node != here {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "other_node",
            format!(
                "this is node '{here}', not '{}': a device is made on the node that answers; \
                 send the request to that node's own API address",
                request.node
            ),
        ));
    }
    let me = state.cluster.node_id();
    state
        .cluster
        .wait_for_state(ATTACH_SEEN_WAIT, |cluster| {
            cluster
                .volumes
                .get(&name)
                .is_none_or(|volume| volume.deleting || served_here(volume, me))
        })
        .await;
    {
        let cluster = state.cluster.state.read();
        let Some(volume) = cluster.volumes.get(&name) else {
            return Err(volume_not_found(&name));
        };
        if volume.deleting {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "volume_deleting",
                format!("volume '{name}' is being deleted"),
            ));
        }
        if !served_here(volume, me) {
            return Err(not_served_here(&cluster, volume, me));
        }
    }
    let device = state.devices.attach(&name).await.map_err(device_error)?;
    Ok(Json(state.device_response(device)))
}

#[utoipa::path(get, path = "/api/v1/volumes/{name}/device", tag = "devices",
    params(("name" = String, Path, description = "Volume name")),
    responses(
        (status = 200, description = "The volume's block device on this node's host", body = DeviceResponse),
        (status = 400, description = "A bad volume name", body = ErrorBody),
        (status = 404, description = "No device of that volume here", body = ErrorBody)))]
pub async fn show_device(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<DeviceResponse>, ApiError> {
    let name = volume_name(&name)?;
    match state.devices.find(&name).await.map_err(device_error)? {
        Some(device) => Ok(Json(state.device_response(device))),
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "device_not_found",
            format!(
                "volume '{name}' has no device on this node ({})",
                state.cluster.config.name
            ),
        )),
    }
}

#[utoipa::path(delete, path = "/api/v1/volumes/{name}/device", tag = "devices",
    params(("name" = String, Path, description = "Volume name")),
    responses(
        (status = 204, description = "Released, or there was none (the volume exists)"),
        (status = 400, description = "A bad volume name", body = ErrorBody),
        (status = 404, description = "No device here and no such volume", body = ErrorBody),
        (status = 409, description = "The device is still mounted", body = ErrorBody)))]
pub async fn release_device(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let name = volume_name(&name)?;
    match state.devices.find(&name).await.map_err(device_error)? {
        Some(device) => {
            if let Some(point) = mounted_at(&device.path) {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "device_in_use",
                    format!(
                        "the device {} of volume '{name}' is mounted at {point}: unmount it first",
                        device.path
                    ),
                ));
            }
            state.devices.detach(&name).await.map_err(device_error)?;
        }
        None if !state.cluster.state.read().volumes.contains_key(&name) => {
            return Err(volume_not_found(&name));
        }
        // Released before, or by an earlier run: nothing left to do.
        None => state.devices.detach(&name).await.map_err(device_error)?,
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Where `device` is mounted, if anywhere in this daemon's mount namespace.
fn mounted_at(device: &str) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    text.lines().find_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        let source = after.split(' ').nth(1)?;
        (source == device).then(|| before.split(' ').nth(4).unwrap_or("?").to_string())
    })
}

#[utoipa::path(get, path = "/api/v1/devices", tag = "devices",
    responses((status = 200, description = "The block devices of volumes on this node's host", body = [DeviceResponse])))]
pub async fn list_devices(
    State(state): State<ApiState>,
) -> Result<Json<Vec<DeviceResponse>>, ApiError> {
    let devices = state.devices.list().await.map_err(device_error)?;
    Ok(Json(
        devices
            .into_iter()
            .map(|device| state.device_response(device))
            .collect(),
    ))
}
