//! `GET /metrics` (Prometheus), and `GET /api/v1/io`: the cluster's I/O
//! rates, gathered from every node.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::time::Duration;
use tokio::task::JoinSet;
use trireme_control::NodeState;

use super::model::{IoResponse, VolumeIoRate};
use super::{ApiError, ApiState};
use crate::metrics::{self, Sources};

/// Every metric of this node, in the OpenMetrics text format.
pub async fn metrics(State(state): State<ApiState>) -> Result<Response, ApiError> {
    let sources = Sources {
        metrics: state.metrics.clone(),
        node: state.node.clone(),
        cluster: state.cluster.clone(),
        replication: state.replication.clone(),
    };
    // Pools' and engines' locks are taken briefly: off the reactor.
    let text = tokio::task::spawn_blocking(move || metrics::render(sources))
        .await
        .map_err(|error| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                format!("gathering metrics failed: {error}"),
            )
        })?
        .map_err(|_| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "encoding metrics failed",
            )
        })?;
    Ok(([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], text).into_response())
}

/// Where a node answers for its own volumes' rates (signed by a member).
pub const PATH_INTERNAL_IO: &str = "/internal/v1/io";
/// How long the answering node waits for the others: a slow or cut-off
/// node is reported in `missing_nodes`, never waited for longer.
const GATHER_TIMEOUT: Duration = Duration::from_secs(2);

/// This node's volumes and their rates.
fn local_rates(state: &ApiState) -> Vec<VolumeIoRate> {
    let node = state.cluster.config.name.to_string();
    state
        .metrics
        .rates
        .current()
        .into_iter()
        .map(|(volume, rate)| VolumeIoRate {
            volume,
            node: node.clone(),
            read_iops: rate.read_iops,
            write_iops: rate.write_iops,
            read_bytes_per_sec: rate.read_bytes_per_sec,
            write_bytes_per_sec: rate.write_bytes_per_sec,
        })
        .collect()
}

/// Signed by a member: this node's part of `GET /api/v1/io`.
pub async fn internal_io(
    State(state): State<ApiState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Vec<VolumeIoRate>>, ApiError> {
    let _: (_, serde_json::Value) =
        super::internal::verified(&state.cluster, &headers, PATH_INTERNAL_IO, &body)?;
    Ok(Json(local_rates(&state)))
}

#[utoipa::path(get, path = "/api/v1/io", tag = "cluster",
    responses((status = 200, description = "The cluster's read and write rates over the last ~10 s, and the busiest volumes first; nodes that did not answer within 2 s are listed in missing_nodes", body = IoResponse)))]
pub async fn io(State(state): State<ApiState>) -> Json<IoResponse> {
    let me = state.cluster.node_id();
    let (asked, mut missing_nodes) = {
        let cluster_state = state.cluster.state.read();
        let mut asked = Vec::new();
        let mut missing = Vec::new();
        for record in cluster_state
            .nodes
            .values()
            .filter(|record| record.id != me)
        {
            if record.state == NodeState::Online {
                asked.push((record.name.to_string(), record.api_address.clone()));
            } else {
                missing.push(record.name.to_string());
            }
        }
        (asked, missing)
    };
    let mut volumes = local_rates(&state);
    let mut answers = JoinSet::new();
    for (name, address) in asked {
        let cluster = state.cluster.clone();
        answers.spawn(async move {
            let answer = tokio::time::timeout(
                GATHER_TIMEOUT,
                cluster.peers.post::<_, Vec<VolumeIoRate>>(
                    &address,
                    PATH_INTERNAL_IO,
                    &serde_json::json!({}),
                ),
            )
            .await;
            (name, answer)
        });
    }
    while let Some(joined) = answers.join_next().await {
        match joined {
            Ok((_, Ok(Ok(rates)))) => volumes.extend(rates),
            Ok((name, Ok(Err(error)))) => {
                tracing::debug!(node = %name, %error, "no I/O rates from this node");
                missing_nodes.push(name);
            }
            Ok((name, Err(_))) => {
                tracing::debug!(node = %name, "no I/O rates from this node in time");
                missing_nodes.push(name);
            }
            Err(error) => tracing::warn!(%error, "gathering I/O rates failed"),
        }
    }
    missing_nodes.sort();
    volumes.sort_by(|a, b| {
        let busy = |v: &VolumeIoRate| {
            (
                v.read_iops + v.write_iops,
                v.read_bytes_per_sec + v.write_bytes_per_sec,
            )
        };
        busy(b)
            .partial_cmp(&busy(a))
            .unwrap_or(std::cmp::Ordering::Equal)
            .then_with(|| a.volume.cmp(&b.volume))
    });
    let sum = |field: fn(&VolumeIoRate) -> f64| volumes.iter().map(field).sum::<f64>();
    Json(IoResponse {
        read_iops: sum(|v| v.read_iops),
        write_iops: sum(|v| v.write_iops),
        read_bytes_per_sec: sum(|v| v.read_bytes_per_sec),
        write_bytes_per_sec: sum(|v| v.write_bytes_per_sec),
        volumes,
        missing_nodes,
    })
}
