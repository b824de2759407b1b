//! The routes of `/internal/v1`: what nodes ask each other (their paths
//! and bodies are in [`crate::cluster::protocol`]). Every endpoint but
//! `join` needs a signed request from a member (see
//! [`crate::cluster::auth`]); `join` is signed with the join token instead.

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use openraft::BasicNode;
use std::sync::Arc;
use trireme_control::raft::{ClientWriteError, RaftError};
use trireme_control::{Command, CommandError, Reply};
use trireme_types::NodeId;

use super::ApiError;
use crate::cluster::protocol::{
    Heartbeat, JoinRequest, JoinResponse, LastHeard, WriteOutcome, CODE_NODE_REMOVED, PATH_APPEND,
    PATH_HEARTBEAT, PATH_JOIN, PATH_LAST_HEARD, PATH_SNAPSHOT, PATH_VOTE, PATH_WRITE,
};
use crate::cluster::{auth, peer, was_removed, Cluster, ClusterError};

/// How long the leader tries to commit a forwarded write; below the peer
/// request timeout, so the forwarding node hears the answer.
const FORWARDED_COMMIT_WAIT: std::time::Duration = std::time::Duration::from_secs(4);
/// Snapshot chunks and log batches are bigger than a REST body.
const INTERNAL_BODY_LIMIT: usize = 64 << 20;

pub fn router(cluster: Arc<Cluster>) -> Router {
    Router::new()
        .route(PATH_APPEND, post(append))
        .route(PATH_VOTE, post(vote))
        .route(PATH_SNAPSHOT, post(snapshot))
        .route(PATH_WRITE, post(write))
        .route(PATH_HEARTBEAT, post(heartbeat))
        .route(PATH_LAST_HEARD, post(last_heard))
        .route(PATH_JOIN, post(join))
        .layer(DefaultBodyLimit::max(INTERNAL_BODY_LIMIT))
        .with_state(cluster)
}

fn unauthorized(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::UNAUTHORIZED, "unauthenticated", message)
}

/// Checks a member's signature; returns the sender and the parsed body.
pub(crate) fn verified<T: serde::de::DeserializeOwned>(
    cluster: &Cluster,
    headers: &HeaderMap,
    path: &str,
    body: &[u8],
) -> Result<(NodeId, T), ApiError> {
    let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok());
    let (Some(node), Some(time), Some(mac)) = (
        header(auth::HEADER_NODE).and_then(|v| v.parse::<u64>().ok()),
        header(auth::HEADER_TIME).and_then(|v| v.parse::<u64>().ok()),
        header(auth::HEADER_MAC),
    ) else {
        return Err(unauthorized(
            "node-to-node request without its signature headers",
        ));
    };
    let node = NodeId(node);
    let skew = auth::now_ms().abs_diff(time);
    if skew > auth::REQUEST_WINDOW_MS {
        return Err(unauthorized(format!(
            "request from node {node} is {} s off this node's clock; synchronise the clocks (NTP)",
            skew / 1000
        )));
    }
    if !auth::request_mac_matches(
        &cluster.identity.secret_bytes(),
        node,
        "POST",
        path,
        time,
        body,
        mac,
    ) {
        return Err(unauthorized(format!(
            "request claiming to be node {node} has a bad signature: it is not a member of cluster {}",
            cluster.identity.cluster_id
        )));
    }
    {
        let state = cluster.state.read();
        if was_removed(&state, node) {
            // Told apart from an unknown node so that a removed node that
            // comes back learns it, records it and stops (see `peer`).
            return Err(ApiError::new(
                StatusCode::GONE,
                CODE_NODE_REMOVED,
                format!(
                    "node {node} was removed from cluster {}; it must not run on its old data directory",
                    cluster.identity.cluster_id
                ),
            ));
        }
        // A node that just joined has no state yet and must accept its
        // leader's first messages.
        if !state.nodes.is_empty() && !state.nodes.contains_key(&node) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "unknown_node",
                format!(
                    "node {node} is not a member of cluster {} (removed?)",
                    cluster.identity.cluster_id
                ),
            ));
        }
    }
    let parsed = serde_json::from_slice(body)
        .map_err(|error| ApiError::bad_request("invalid_body", format!("{path}: {error}")))?;
    Ok((node, parsed))
}

async fn append(
    State(cluster): State<Arc<Cluster>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Result<openraft::raft::AppendEntriesResponse<u64>, RaftError>>, ApiError> {
    let (_, request) = verified(&cluster, &headers, PATH_APPEND, &body)?;
    Ok(Json(cluster.raft.append_entries(request).await))
}

async fn vote(
    State(cluster): State<Arc<Cluster>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Result<openraft::raft::VoteResponse<u64>, RaftError>>, ApiError> {
    let (_, request) = verified(&cluster, &headers, PATH_VOTE, &body)?;
    Ok(Json(cluster.raft.vote(request).await))
}

type SnapshotAnswer = Result<
    openraft::raft::InstallSnapshotResponse<u64>,
    RaftError<openraft::error::InstallSnapshotError>,
>;

async fn snapshot(
    State(cluster): State<Arc<Cluster>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<SnapshotAnswer>, ApiError> {
    let (_, request) = verified(&cluster, &headers, PATH_SNAPSHOT, &body)?;
    Ok(Json(cluster.raft.install_snapshot(request).await))
}

async fn write(
    State(cluster): State<Arc<Cluster>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<WriteOutcome>, ApiError> {
    let (_, command): (_, Command) = verified(&cluster, &headers, PATH_WRITE, &body)?;
    // Answer before the forwarding node's request times out.
    let attempt = tokio::time::timeout(FORWARDED_COMMIT_WAIT, cluster.raft.client_write(command));
    Ok(Json(match attempt.await {
        Err(_) => WriteOutcome::NotCommitted(format!(
            "the leader could not commit within {FORWARDED_COMMIT_WAIT:?}: it cannot reach a majority of the voters. The change is not committed yet, but it may still take effect when a majority is back: look (e.g. `trireme volume show`) before you retry it"
        )),
        Ok(Ok(response)) => WriteOutcome::Applied(response.data, response.log_id.index),
        Ok(Err(RaftError::APIError(ClientWriteError::ForwardToLeader(_)))) => {
            WriteOutcome::NotLeader
        }
        Ok(Err(error)) => WriteOutcome::Failed(error.to_string()),
    }))
}

async fn heartbeat(
    State(cluster): State<Arc<Cluster>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<bool>, ApiError> {
    let (sender, beat): (_, Heartbeat) = verified(&cluster, &headers, PATH_HEARTBEAT, &body)?;
    if sender != beat.node {
        return Err(unauthorized("a node may only heartbeat for itself"));
    }
    cluster.liveness.seen(sender);
    Ok(Json(cluster.is_leader()))
}

async fn last_heard(
    State(cluster): State<Arc<Cluster>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<LastHeard>, ApiError> {
    let (_, asked): (_, Heartbeat) = verified(&cluster, &headers, PATH_LAST_HEARD, &body)?;
    Ok(Json(cluster.last_heard_here(asked.node)))
}

fn join_refused(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, "join_refused", message)
}

async fn join(
    State(cluster): State<Arc<Cluster>>,
    body: Bytes,
) -> Result<Json<JoinResponse>, ApiError> {
    let request: JoinRequest = serde_json::from_slice(&body)
        .map_err(|error| ApiError::bad_request("invalid_body", format!("join request: {error}")))?;
    if !cluster.is_leader() {
        return forward_join(&cluster, &request).await.map(Json);
    }
    if request.cluster_id != cluster.identity.cluster_id {
        return Err(join_refused(format!(
            "the token is for cluster {}, but this node belongs to cluster {}",
            request.cluster_id, cluster.identity.cluster_id
        )));
    }
    let now = auth::now_ms();
    if now.abs_diff(request.time_ms) > auth::JOIN_WINDOW_MS {
        return Err(join_refused(format!(
            "the join request is {} s away from this node's clock; synchronise the clocks and try again",
            now.abs_diff(request.time_ms) / 1000
        )));
    }
    let join_secret = cluster.state.read().join_secret.clone();
    if !auth::join_mac_matches(&join_secret, &request.canonical(), &request.mac) {
        return Err(join_refused(
            "wrong join token: print the current one with `trireme cluster join-token` on a member",
        ));
    }
    let reply = cluster
        .write(Command::AddNode {
            node: request.node.clone(),
            nonce: request.nonce.clone(),
            now_ms: now,
        })
        .await
        .map_err(|error| match error {
            ClusterError::Refused(refusal @ CommandError::JoinReplayed) => {
                join_refused(refusal.to_string())
            }
            ClusterError::Refused(refusal) => {
                ApiError::new(StatusCode::CONFLICT, "join_refused", refusal.to_string())
            }
            other => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "no_leader",
                other.to_string(),
            ),
        })?;
    let Reply::NodeAdded { node } = reply else {
        return Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            "adding the node gave no node id",
        ));
    };
    // The membership task would also do it; doing it now saves a second.
    if let Err(error) = cluster
        .raft
        .add_learner(node.0, BasicNode::new(&request.node.api_address), false)
        .await
    {
        tracing::warn!(%error, node = %node, "adding the new node as a learner failed; the leader retries");
    }
    tracing::info!(node = %node, name = %request.node.name, address = %request.node.api_address, "node joined");
    Ok(Json(JoinResponse {
        cluster_id: cluster.identity.cluster_id.clone(),
        node_id: node,
        sealed_secret: auth::seal_secret(
            &join_secret,
            &request.nonce,
            &cluster.identity.secret_bytes(),
        ),
    }))
}

async fn forward_join(cluster: &Cluster, request: &JoinRequest) -> Result<JoinResponse, ApiError> {
    let leader = cluster.leader().and_then(|leader| {
        cluster
            .state
            .read()
            .membership()
            .get_node(&leader.0)
            .map(|node| node.addr.clone())
    });
    let Some(address) = leader else {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "no_leader",
            "the cluster has no leader right now; try again in a few seconds",
        ));
    };
    let response = peer::PeerClient::http()
        .post(format!("http://{address}{PATH_JOIN}"))
        .json(request)
        .send()
        .await
        .map_err(|error| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "no_leader",
                format!("cannot reach the leader at {address}: {error}"),
            )
        })?;
    let status = response.status();
    match peer::read_answer::<JoinResponse>(&address, response).await {
        Ok(answer) => Ok(answer),
        Err(peer::PeerError::Status { body, .. }) => Err(ApiError::new(
            StatusCode::from_u16(status.as_u16()).unwrap_or(StatusCode::BAD_GATEWAY),
            "join_refused",
            body,
        )),
        Err(error) => Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            "join_failed",
            error.to_string(),
        )),
    }
}
