//! The REST API under `/api/v1`, described by the OpenAPI document served at
//! `GET /api/v1/openapi.json`.
//!
//! - [`model`]: request and response bodies (shared with the CLI).
//! - [`error`]: [`ApiError`] and the status code of every failure.
//! - `validate`: checks of names, sizes and bodies, before any store call.
//! - `system`, `pools`, `volumes`: the handlers.
//!
//! Handlers validate the request, then run the blocking node operation on
//! `spawn_blocking` so a slow disk never stalls the reactor.

pub mod error;
pub mod model;
mod pools;
mod system;
mod validate;
mod volumes;

pub use error::ApiError;

use axum::extract::{FromRequest, Request};
use axum::http::{Method, StatusCode, Uri};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use std::sync::Arc;
use utoipa::OpenApi;

use crate::{Node, NodeError};

/// Where the node can be reached; reported by `GET /api/v1/node`.
#[derive(Debug, Clone, Default)]
pub struct Addresses {
    pub api: String,
    pub nbd_tcp: Option<String>,
    /// `HOST:PORT` of `nbd://HOST:PORT/VOLUME` URLs: the TCP address as a
    /// local client dials it.
    pub nbd_url_base: Option<String>,
    pub nbd_unix: Option<String>,
}

#[derive(Clone)]
pub struct ApiState {
    pub node: Arc<Node>,
    pub addresses: Arc<Addresses>,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "trireme node API",
        description = "Pools and volumes of one trireme node. Sizes are in bytes; errors are {\"error\", \"code\"}."
    ),
    paths(
        system::health,
        system::node_info,
        pools::list_pools,
        pools::create_pool,
        pools::show_pool,
        pools::delete_pool,
        pools::scan_pool,
        volumes::list_volumes,
        volumes::create_volume,
        volumes::show_volume,
        volumes::delete_volume,
        volumes::grow_volume,
    )
)]
pub struct ApiDocument;

pub fn router(state: ApiState) -> Router {
    Router::new()
        .route("/api/v1/health", get(system::health))
        .route("/api/v1/node", get(system::node_info))
        .route("/api/v1/openapi.json", get(system::openapi))
        .route(
            "/api/v1/pools",
            get(pools::list_pools).post(pools::create_pool),
        )
        .route(
            "/api/v1/pools/{name}",
            get(pools::show_pool).delete(pools::delete_pool),
        )
        .route("/api/v1/pools/{name}/scan", post(pools::scan_pool))
        .route(
            "/api/v1/volumes",
            get(volumes::list_volumes).post(volumes::create_volume),
        )
        .route(
            "/api/v1/volumes/{name}",
            get(volumes::show_volume).delete(volumes::delete_volume),
        )
        .route("/api/v1/volumes/{name}/grow", post(volumes::grow_volume))
        .fallback(unknown_endpoint)
        .with_state(state)
}

async fn unknown_endpoint(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "unknown_endpoint",
        format!("no endpoint {method} {uri}: see GET /api/v1/openapi.json"),
    )
}

/// A JSON body whose rejection is an [`ApiError`] (400 with the reason)
/// instead of axum's plain-text answer.
pub struct ApiJson<T>(pub T);

impl<T, S> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(request: Request, state: &S) -> Result<Self, ApiError> {
        match Json::<T>::from_request(request, state).await {
            Ok(Json(value)) => Ok(ApiJson(value)),
            Err(rejection) => Err(ApiError::bad_request(
                "invalid_body",
                format!("request body is not valid: {}", rejection.body_text()),
            )),
        }
    }
}

/// Runs a blocking node operation off the reactor. A panic inside it
/// becomes a 500 answer, not a dead connection.
async fn blocking<T, F>(node: &Arc<Node>, operation: F) -> Result<T, ApiError>
where
    T: Send + 'static,
    F: FnOnce(&Node) -> Result<T, NodeError> + Send + 'static,
{
    let node = node.clone();
    match tokio::task::spawn_blocking(move || operation(&node)).await {
        Ok(result) => result.map_err(ApiError::from),
        Err(join_error) => {
            Err(NodeError::Internal(format!("the operation failed: {join_error}")).into())
        }
    }
}

#[cfg(test)]
mod tests;
