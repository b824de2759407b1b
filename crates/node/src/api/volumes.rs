//! `/api/v1/volumes`: list, create, show, delete and grow volumes.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;

use super::model::{CreateVolumeRequest, ErrorBody, GrowVolumeRequest, VolumeResponse};
use super::{blocking, validate, ApiError, ApiJson, ApiState};

impl ApiState {
    fn volume_response(&self, info: trireme_store::VolumeInfo) -> VolumeResponse {
        VolumeResponse::new(info, self.addresses.nbd_url_base.as_deref())
    }
}

#[utoipa::path(get, path = "/api/v1/volumes", tag = "volumes",
    responses((status = 200, description = "Every volume of every online pool", body = [VolumeResponse])))]
pub async fn list_volumes(
    State(state): State<ApiState>,
) -> Result<Json<Vec<VolumeResponse>>, ApiError> {
    let volumes = blocking(&state.node, |node| node.volumes()).await?;
    Ok(Json(
        volumes
            .into_iter()
            .map(|info| state.volume_response(info))
            .collect(),
    ))
}

#[utoipa::path(post, path = "/api/v1/volumes", tag = "volumes", request_body = CreateVolumeRequest,
    responses(
        (status = 201, description = "Volume created", body = VolumeResponse),
        (status = 400, description = "Bad name or size", body = ErrorBody),
        (status = 404, description = "The named pool does not exist", body = ErrorBody),
        (status = 409, description = "A volume of that name exists, or the pool is offline", body = ErrorBody),
        (status = 507, description = "No online pool to place it in", body = ErrorBody)))]
pub async fn create_volume(
    State(state): State<ApiState>,
    ApiJson(request): ApiJson<CreateVolumeRequest>,
) -> Result<(StatusCode, Json<VolumeResponse>), ApiError> {
    let (name, size_bytes, pool) = validate::new_volume(&request)?;
    let info = blocking(&state.node, move |node| {
        node.create_volume(&name, size_bytes, pool.as_ref())
    })
    .await?;
    Ok((StatusCode::CREATED, Json(state.volume_response(info))))
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
    let info = blocking(&state.node, move |node| node.volume(&name)).await?;
    Ok(Json(state.volume_response(info)))
}

#[utoipa::path(delete, path = "/api/v1/volumes/{name}", tag = "volumes",
    params(("name" = String, Path, description = "Volume name")),
    responses(
        (status = 204, description = "Volume deleted; connected NBD clients get errors from now on"),
        (status = 404, description = "No such volume", body = ErrorBody)))]
pub async fn delete_volume(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let name = validate::volume_name(&name)?;
    blocking(&state.node, move |node| node.delete_volume(&name)).await?;
    Ok(StatusCode::NO_CONTENT)
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
    let info = blocking(&state.node, move |node| node.grow_volume(&name, size_bytes)).await?;
    Ok(Json(state.volume_response(info)))
}
