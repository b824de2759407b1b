//! One node: `GET /api/v1/nodes/{name}` (`trireme node show`) and its
//! placement labels, `PUT /api/v1/nodes/{name}/labels` (`trireme node label`).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use std::collections::BTreeSet;
use trireme_control::{ClusterState, Command, NodeRecord, ReplicaKind};
use trireme_types::NodeName;

use super::cluster::node_entry;
use super::model::{ErrorBody, NodeDetail, NodeLabelsBody, NodePool, NodeReplica};
use super::{ApiError, ApiJson, ApiState};
use crate::NodeError;

fn node_by_name<'a>(state: &'a ClusterState, name: &str) -> Result<&'a NodeRecord, ApiError> {
    let name = NodeName::new(name).map_err(NodeError::from)?;
    state.node_by_name(&name).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "node_not_found",
            format!("no node named '{name}': see `trireme node list`"),
        )
    })
}

fn node_detail(
    state: &ApiState,
    cluster_state: &ClusterState,
    voters: &BTreeSet<u64>,
    node: &NodeRecord,
) -> NodeDetail {
    let replicas = cluster_state
        .volumes
        .values()
        .filter(|volume| !volume.deleting)
        .filter_map(|volume| {
            let replica = volume.replica(node.id);
            let primary = volume.primaries.iter().any(|p| p.node == node.id);
            if replica.is_none() && !primary {
                return None;
            }
            let diskful = replica.is_some_and(|r| r.kind == ReplicaKind::Diskful);
            Some(NodeReplica {
                volume: volume.name.to_string(),
                kind: replica.map_or("none", |r| r.kind.as_str()).to_string(),
                pool: replica.and_then(|r| r.pool.as_ref().map(ToString::to_string)),
                data: match (diskful, volume.is_in_sync(node.id)) {
                    (true, true) => "up-to-date",
                    (true, false) => "outdated",
                    (false, _) => "-",
                }
                .to_string(),
                primary,
            })
        })
        .collect();
    NodeDetail {
        node: node_entry(state, node, voters),
        state_since_ms: node.state_since_ms,
        joined_ms: node.joined_ms,
        pool_list: node
            .pools
            .iter()
            .map(|(name, pool)| NodePool {
                name: name.to_string(),
                class: pool.class.to_string(),
                capacity_bytes: pool.capacity_bytes,
                free_bytes: pool.free_bytes,
                online: pool.online,
            })
            .collect(),
        replicas,
    }
}

#[utoipa::path(get, path = "/api/v1/nodes/{name}", tag = "cluster",
    params(("name" = String, Path, description = "Node name")),
    responses(
        (status = 200, description = "The node: state, labels, role, pools, replicas, addresses", body = NodeDetail),
        (status = 404, description = "No such node", body = ErrorBody)))]
pub async fn show_node(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<NodeDetail>, ApiError> {
    let cluster_state = state.cluster.state.read();
    let voters: BTreeSet<u64> = cluster_state.membership().voter_ids().collect();
    let node = node_by_name(&cluster_state, &name)?;
    Ok(Json(node_detail(&state, &cluster_state, &voters, node)))
}

#[utoipa::path(put, path = "/api/v1/nodes/{name}/labels", tag = "cluster",
    params(("name" = String, Path, description = "Node name")),
    request_body = NodeLabelsBody,
    responses(
        (status = 200, description = "The node with its new labels; `status` names volumes whose placement no longer satisfies their group", body = NodeDetail),
        (status = 400, description = "A bad label", body = ErrorBody),
        (status = 404, description = "No such node", body = ErrorBody)))]
pub async fn set_node_labels(
    State(state): State<ApiState>,
    Path(name): Path<String>,
    ApiJson(body): ApiJson<NodeLabelsBody>,
) -> Result<Json<NodeDetail>, ApiError> {
    let (id, labels) = {
        let cluster_state = state.cluster.state.read();
        let node = node_by_name(&cluster_state, &name)?;
        let mut labels = node.labels.clone();
        for key in &body.remove {
            labels.remove(key);
        }
        labels.extend(body.set.clone());
        (node.id, labels)
    };
    state
        .cluster
        .write(Command::SetNodeLabels { node: id, labels })
        .await?;
    let cluster_state = state.cluster.state.read();
    let voters: BTreeSet<u64> = cluster_state.membership().voter_ids().collect();
    let node = node_by_name(&cluster_state, &name)?;
    Ok(Json(node_detail(&state, &cluster_state, &voters, node)))
}
