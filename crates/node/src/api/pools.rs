//! `/api/v1/pools`: list, create, show, delete and scan pools.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;

use super::model::{CreatePoolRequest, ErrorBody, PoolResponse, ScanResponse};
use super::{blocking, validate, ApiError, ApiJson, ApiState};

impl ApiState {
    /// Tells the cluster about a new or deleted pool now, so the next
    /// placement can use it; the agent would within seconds.
    async fn report_pools(&self) {
        let me = self.cluster.node_id();
        let recorded = self
            .cluster
            .state
            .read()
            .nodes
            .get(&me)
            .map(|node| node.pools.clone())
            .unwrap_or_default();
        if let Err(error) = crate::agent::report_pools(&self.cluster, &self.node, &recorded).await {
            tracing::warn!(%error, "reporting the pools failed; the agent retries");
        }
    }
}

#[utoipa::path(get, path = "/api/v1/pools", tag = "pools",
    responses((status = 200, description = "Every pool of the node, online or offline", body = [PoolResponse])))]
pub async fn list_pools(
    State(state): State<ApiState>,
) -> Result<Json<Vec<PoolResponse>>, ApiError> {
    let pools = blocking(&state.node, |node| node.pools()).await?;
    Ok(Json(pools.into_iter().map(PoolResponse::from).collect()))
}

#[utoipa::path(post, path = "/api/v1/pools", tag = "pools", request_body = CreatePoolRequest,
    responses(
        (status = 201, description = "Pool created", body = PoolResponse),
        (status = 400, description = "Bad name, path, class or size", body = ErrorBody),
        (status = 409, description = "Name or path already in use, or the path holds data (`force` formats it) or is in use on the host", body = ErrorBody),
        (status = 507, description = "The file system has no room for a preallocated pool", body = ErrorBody)))]
pub async fn create_pool(
    State(state): State<ApiState>,
    ApiJson(request): ApiJson<CreatePoolRequest>,
) -> Result<(StatusCode, Json<PoolResponse>), ApiError> {
    let new_pool = validate::new_pool(request)?;
    let name = new_pool.name.clone();
    let status = blocking(&state.node, move |node| {
        node.create_pool(new_pool)?;
        node.pool(&name)
    })
    .await?;
    state.report_pools().await;
    Ok((StatusCode::CREATED, Json(status.into())))
}

#[utoipa::path(get, path = "/api/v1/pools/{name}", tag = "pools",
    params(("name" = String, Path, description = "Pool name")),
    responses(
        (status = 200, description = "The pool", body = PoolResponse),
        (status = 404, description = "No such pool", body = ErrorBody)))]
pub async fn show_pool(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<PoolResponse>, ApiError> {
    let name = validate::pool_name(&name)?;
    let status = blocking(&state.node, move |node| node.pool(&name)).await?;
    Ok(Json(status.into()))
}

#[utoipa::path(delete, path = "/api/v1/pools/{name}", tag = "pools",
    params(("name" = String, Path, description = "Pool name")),
    responses(
        (status = 204, description = "Pool deleted"),
        (status = 404, description = "No such pool", body = ErrorBody),
        (status = 409, description = "The pool still holds volumes", body = ErrorBody)))]
pub async fn delete_pool(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let name = validate::pool_name(&name)?;
    blocking(&state.node, move |node| node.delete_pool(&name)).await?;
    state.report_pools().await;
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/api/v1/pools/{name}/scan", tag = "pools",
    params(("name" = String, Path, description = "Pool name")),
    responses(
        (status = 200, description = "Accounting and checksums checked against a full scan", body = ScanResponse),
        (status = 404, description = "No such pool", body = ErrorBody),
        (status = 409, description = "The pool is offline", body = ErrorBody)))]
pub async fn scan_pool(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<ScanResponse>, ApiError> {
    let name = validate::pool_name(&name)?;
    let report = blocking(&state.node, move |node| node.scan_pool(&name)).await?;
    Ok(Json(report.into()))
}
