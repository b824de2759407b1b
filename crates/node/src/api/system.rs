//! Health, node description and the OpenAPI document.

use axum::extract::State;
use axum::Json;
use utoipa::OpenApi;

use super::model::{HealthResponse, NodeResponse};
use super::{blocking, ApiDocument, ApiError, ApiState};

#[utoipa::path(get, path = "/api/v1/health", tag = "node",
    responses((status = 200, description = "The node answers", body = HealthResponse)))]
pub async fn health(State(state): State<ApiState>) -> Result<Json<HealthResponse>, ApiError> {
    let pools = blocking(&state.node, |node| node.pools()).await?;
    let pools_online = pools
        .iter()
        .filter(|pool| pool.offline_reason.is_none())
        .count();
    Ok(Json(HealthResponse {
        status: "ok".to_string(),
        pools_online,
        pools_offline: pools.len() - pools_online,
    }))
}

#[utoipa::path(get, path = "/api/v1/node", tag = "node",
    responses((status = 200, description = "Version and addresses", body = NodeResponse)))]
pub async fn node_info(State(state): State<ApiState>) -> Json<NodeResponse> {
    Json(NodeResponse {
        version: env!("CARGO_PKG_VERSION").to_string(),
        data_dir: state.node.data_dir().display().to_string(),
        api_address: state.addresses.api.clone(),
        nbd_tcp_address: state.addresses.nbd_tcp.clone(),
        nbd_unix_socket: state.addresses.nbd_unix.clone(),
        device_kind: Some(state.devices.kind().as_str().to_string()),
        cluster_id: state.cluster.identity.cluster_id.clone(),
        node_id: state.cluster.node_id().0,
        node_name: state.cluster.config.name.to_string(),
    })
}

pub async fn openapi() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDocument::openapi())
}
