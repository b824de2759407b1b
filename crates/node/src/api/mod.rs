//! The REST API under `/api/v1`, described by the OpenAPI document served at
//! `GET /api/v1/openapi.json`.
//!
//! - [`model`]: request and response bodies (shared with the CLI).
//! - [`error`]: [`ApiError`] and the status code of every failure.
//! - `validate`: checks of names, sizes and bodies, before any store call.
//! - `system`, `pools`, `volumes`, `snapshots`, `verify`, `cluster`,
//!   `events`, `history`: the handlers.
//! - `internal`: the node-to-node routes under `/internal/v1` (Raft,
//!   forwarded writes, heartbeats, joins), signed by a member; their paths
//!   and bodies are [`crate::cluster::protocol`].
//! - `devices`: block devices of volumes on this node's host (the CSI
//!   node plugin's), [`crate::local_device`].
//! - `ui`: the web dashboard at `/ui`, its assets embedded in the binary.
//!
//! Handlers validate the request, then run the blocking node operation on
//! `spawn_blocking` so a slow disk never stalls the reactor.

mod cluster;
mod devices;
pub mod error;
mod events;
mod history;
mod internal;
pub mod model;
mod monitoring;
mod nodes;
mod pools;
mod snapshots;
mod system;
mod ui;
mod validate;
mod verify;
mod volumes;

pub use error::ApiError;

use axum::extract::ConnectInfo;
use axum::extract::{FromRequest, Request};
use axum::http::{Method, StatusCode, Uri};
use axum::middleware::Next;
use axum::response::Response;
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::de::DeserializeOwned;
use std::sync::Arc;
use utoipa::OpenApi;

use crate::cluster::Cluster;
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
    pub cluster: Arc<Cluster>,
    /// The engines of volumes attached here (verify runs in them).
    pub replication: Arc<crate::replicated::Replication>,
    /// The NBD edge's counters and I/O rates.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Block devices of volumes on this host.
    pub devices: Arc<crate::local_device::LocalDevices>,
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "trireme node API",
        description = "A trireme cluster, through any of its nodes: the cluster's nodes, resource groups and volumes, and this node's pools. Sizes are in bytes; errors are {\"error\", \"code\"}. Clients on loopback are trusted (unless the node runs with --trust-loopback=false); others send `Authorization: Bearer <token>` with the token from `DATA/admin.token`."
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
        volumes::attach_volume,
        volumes::detach_volume,
        volumes::add_replica,
        volumes::remove_replica,
        verify::start_verify,
        verify::show_verify,
        snapshots::create_snapshot,
        snapshots::list_snapshots,
        snapshots::list_all_snapshots,
        snapshots::delete_snapshot,
        snapshots::rollback_volume,
        snapshots::clone_snapshot,
        snapshots::show_schedule,
        snapshots::set_schedule,
        snapshots::delete_schedule,
        cluster::status,
        monitoring::io,
        history::io_history,
        events::list_events,
        cluster::list_nodes,
        cluster::remove_node,
        nodes::show_node,
        nodes::set_node_labels,
        cluster::modify_group,
        cluster::list_groups,
        cluster::create_group,
        cluster::delete_group,
        cluster::show_settings,
        cluster::change_settings,
        cluster::join_token,
        devices::make_device,
        devices::show_device,
        devices::release_device,
        devices::list_devices,
    )
)]
pub struct ApiDocument;

pub fn router(state: ApiState) -> Router {
    let cluster = state.cluster.clone();
    let trust_loopback = state.cluster.config.trust_loopback;
    let token = Arc::new(state.cluster.admin_token());
    let node_id = state.cluster.node_id();
    let protected = Router::new()
        .route("/api/v1/node", get(system::node_info))
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
        .route(
            "/api/v1/volumes/{name}/attach",
            post(volumes::attach_volume),
        )
        .route(
            "/api/v1/volumes/{name}/detach",
            post(volumes::detach_volume),
        )
        .route(
            "/api/v1/volumes/{name}/replicas",
            post(volumes::add_replica),
        )
        .route(
            "/api/v1/volumes/{name}/replicas/{node}",
            axum::routing::delete(volumes::remove_replica),
        )
        .route(
            "/api/v1/volumes/{name}/verify",
            get(verify::show_verify).post(verify::start_verify),
        )
        .route(
            "/api/v1/volumes/{name}/snapshots",
            get(snapshots::list_snapshots).post(snapshots::create_snapshot),
        )
        .route(
            "/api/v1/volumes/{name}/snapshots/{snapshot}",
            axum::routing::delete(snapshots::delete_snapshot),
        )
        .route(
            "/api/v1/volumes/{name}/snapshots/{snapshot}/clone",
            post(snapshots::clone_snapshot),
        )
        .route(
            "/api/v1/volumes/{name}/rollback",
            post(snapshots::rollback_volume),
        )
        .route(
            "/api/v1/volumes/{name}/snapshot-schedule",
            get(snapshots::show_schedule)
                .put(snapshots::set_schedule)
                .delete(snapshots::delete_schedule),
        )
        .route(
            "/api/v1/volumes/{name}/device",
            get(devices::show_device)
                .put(devices::make_device)
                .delete(devices::release_device),
        )
        .route("/api/v1/devices", get(devices::list_devices))
        .route("/api/v1/snapshots", get(snapshots::list_all_snapshots))
        .route("/api/v1/status", get(cluster::status))
        .route("/api/v1/nodes", get(cluster::list_nodes))
        .route(
            "/api/v1/nodes/{name}",
            get(nodes::show_node).delete(cluster::remove_node),
        )
        .route(
            "/api/v1/nodes/{name}/labels",
            axum::routing::put(nodes::set_node_labels),
        )
        .route(
            "/api/v1/groups",
            get(cluster::list_groups).post(cluster::create_group),
        )
        .route(
            "/api/v1/groups/{name}",
            axum::routing::delete(cluster::delete_group).put(cluster::modify_group),
        )
        .route(
            "/api/v1/cluster/settings",
            get(cluster::show_settings).put(cluster::change_settings),
        )
        .route("/api/v1/cluster/join-token", get(cluster::join_token))
        .route("/metrics", get(monitoring::metrics))
        .route("/api/v1/io", get(monitoring::io))
        .route("/api/v1/events", get(events::list_events))
        .merge(history::router())
        .route_layer(axum::middleware::from_fn(move |request, next| {
            authenticate(trust_loopback, token.clone(), node_id, request, next)
        }));
    Router::new()
        .route("/api/v1/health", get(system::health))
        .route("/api/v1/openapi.json", get(system::openapi))
        .merge(protected)
        .merge(ui::router())
        // Signed by a member (checked in the handler), like /internal/v1.
        .route(verify::PATH_INTERNAL_VERIFY, post(verify::internal_verify))
        .route(monitoring::PATH_INTERNAL_IO, post(monitoring::internal_io))
        .merge(history::internal_router())
        .fallback(unknown_endpoint)
        .with_state(state)
        .merge(internal::router(cluster))
}

/// Lets a request through if it carries the admin token or comes from
/// loopback (when trusted), and serves it as that requester: the cluster
/// writes it makes are attributed to the token or the local client
/// ([`crate::cluster::REQUESTER`]).
async fn authenticate(
    trust_loopback: bool,
    token: Arc<String>,
    node_id: trireme_types::NodeId,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let from_loopback = request
        .extensions()
        .get::<ConnectInfo<std::net::SocketAddr>>()
        .map(|ConnectInfo(peer)| peer.ip().is_loopback())
        // In-process callers (tests through the router) have no peer.
        .unwrap_or(true);
    let presented = request
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    let valid_token = presented
        .is_some_and(|presented| constant_time_equal(presented.as_bytes(), token.as_bytes()));
    let requester = if valid_token {
        trireme_control::Actor::AdminToken { via: node_id }
    } else {
        trireme_control::Actor::Loopback { via: node_id }
    };
    if valid_token || (trust_loopback && from_loopback) {
        return Ok(crate::cluster::REQUESTER
            .scope(requester, next.run(request))
            .await);
    }
    match presented {
        Some(_) => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "the token is wrong: use the one in DATA/admin.token of any node of this cluster",
        )),
        None => Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthenticated",
            "this request needs a token: pass --token (or set TRIREME_TOKEN) with the content of DATA/admin.token of any node",
        )),
    }
}

fn constant_time_equal(left: &[u8], right: &[u8]) -> bool {
    left.len() == right.len()
        && left
            .iter()
            .zip(right)
            .fold(0u8, |difference, (a, b)| difference | (a ^ b))
            == 0
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
