//! `/api/v1/volumes/{name}/verify`: compares a volume's up-to-date replicas
//! online, block by block, and rewrites the copies that differ from the
//! majority (docs/replication.md, "Verify"). The verify runs in the
//! volume's engine on its primary; any node forwards the request there
//! through `/internal/v1/verify`, signed like every node-to-node request.

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;
use trireme_control::events::ReportedEvent;
use trireme_control::{Command, EventKind};
use trireme_replication::{VerifyReport, VerifyState};
use trireme_types::{NodeId, VolumeName};

use super::model::{ErrorBody, RepairedResponse, VerifyResponse};
use super::{validate, ApiError, ApiState};
use crate::NodeError;

pub const PATH_INTERNAL_VERIFY: &str = "/internal/v1/verify";

/// What a node asks the primary's node.
#[derive(Debug, Serialize, Deserialize)]
pub struct InternalVerifyRequest {
    pub volume: String,
    /// Start one (or join the running one); otherwise only report.
    pub start: bool,
}

#[utoipa::path(post, path = "/api/v1/volumes/{name}/verify", tag = "volumes",
    params(("name" = String, Path, description = "Volume name")),
    responses(
        (status = 200, description = "Verify started (or already running): its report so far", body = VerifyResponse),
        (status = 404, description = "No such volume", body = ErrorBody),
        (status = 409, description = "Not attached, or fewer than two up-to-date replicas to compare", body = ErrorBody),
        (status = 502, description = "The primary's node did not answer", body = ErrorBody)))]
pub async fn start_verify(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<VerifyResponse>, ApiError> {
    let name = validate::volume_name(&name)?;
    on_primary(&state, &name, true).await.map(Json)
}

#[utoipa::path(get, path = "/api/v1/volumes/{name}/verify", tag = "volumes",
    params(("name" = String, Path, description = "Volume name")),
    responses(
        (status = 200, description = "The running or last verify", body = VerifyResponse),
        (status = 404, description = "No such volume, or no verify ran since the volume was attached", body = ErrorBody),
        (status = 409, description = "Not attached", body = ErrorBody),
        (status = 502, description = "The primary's node did not answer", body = ErrorBody)))]
pub async fn show_verify(
    State(state): State<ApiState>,
    Path(name): Path<String>,
) -> Result<Json<VerifyResponse>, ApiError> {
    let name = validate::volume_name(&name)?;
    on_primary(&state, &name, false).await.map(Json)
}

/// Signed by a member: the primary's part of the two endpoints above.
pub async fn internal_verify(
    State(state): State<ApiState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Option<VerifyResponse>>, ApiError> {
    let (_, request): (_, InternalVerifyRequest) =
        super::internal::verified(&state.cluster, &headers, PATH_INTERNAL_VERIFY, &body)?;
    let name = validate::volume_name(&request.volume)?;
    here(&state, &name, request.start).await.map(Json)
}

async fn on_primary(
    state: &ApiState,
    name: &VolumeName,
    start: bool,
) -> Result<VerifyResponse, ApiError> {
    let (primary, address) = {
        let cluster_state = state.cluster.state.read();
        let volume = cluster_state
            .volumes
            .get(name)
            .ok_or_else(|| NodeError::VolumeNotFound(name.clone()))?;
        let Some(primary) = volume.primaries.first() else {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "not_attached",
                format!(
                    "volume '{name}' is not attached; verify runs in its engine on the primary: attach it first (trireme volume attach {name} --node NODE)"
                ),
            ));
        };
        let address = cluster_state
            .nodes
            .get(&primary.node)
            .map(|node| node.api_address.clone());
        (primary.node, address)
    };
    let report = if primary == state.cluster.node_id() {
        here(state, name, start).await?
    } else {
        let address = address.ok_or_else(|| {
            ApiError::new(
                StatusCode::BAD_GATEWAY,
                "primary_unreachable",
                format!("the primary of volume '{name}' (node {primary}) has no API address"),
            )
        })?;
        let request = InternalVerifyRequest {
            volume: name.to_string(),
            start,
        };
        state
            .cluster
            .peers
            .post::<_, Option<VerifyResponse>>(&address, PATH_INTERNAL_VERIFY, &request)
            .await
            .map_err(|error| forwarded_error(name, error))?
    };
    report.ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "no_verify",
            format!(
                "no verify of volume '{name}' ran since it was attached; start one with `trireme volume verify {name}`"
            ),
        )
    })
}

/// The primary's node answered with an error of its own: keep its status
/// and message; it could not be reached: 502.
fn forwarded_error(name: &VolumeName, error: crate::cluster::peer::PeerError) -> ApiError {
    use crate::cluster::peer::PeerError;
    match error {
        PeerError::Status { status, body, .. } => {
            let message = serde_json::from_str::<ErrorBody>(&body)
                .map(|body| body.error)
                .unwrap_or(body);
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
            ApiError::new(status, "verify_refused", message)
        }
        other => ApiError::new(
            StatusCode::BAD_GATEWAY,
            "primary_unreachable",
            format!("the node where volume '{name}' is attached did not answer: {other}"),
        ),
    }
}

/// This node is the primary: ask its engine.
async fn here(
    state: &ApiState,
    name: &VolumeName,
    start: bool,
) -> Result<Option<VerifyResponse>, ApiError> {
    let Some(engine) = state.replication.engine_handle(name) else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "engine_not_running",
            format!(
                "volume '{name}' is attached here but its engine is not running (it starts within a second of an attach, or the node's copy is still being created); try again in a moment"
            ),
        ));
    };
    let report = if start {
        let report = engine
            .start_verify()
            .await
            .map_err(|reason| ApiError::new(StatusCode::CONFLICT, "verify_refused", reason))?;
        if report.state == VerifyState::Running {
            log_when_finished(state, name.clone(), engine.clone());
        }
        Some(report)
    } else {
        engine
            .verify_report()
            .await
            .map_err(|reason| ApiError::new(StatusCode::CONFLICT, "engine_stopped", reason))?
    };
    Ok(report.map(|report| response(state, name, &report)))
}

fn response(state: &ApiState, name: &VolumeName, report: &VerifyReport) -> VerifyResponse {
    let cluster_state = state.cluster.state.read();
    let (state_text, reason) = match &report.state {
        VerifyState::Running => ("running", None),
        VerifyState::Done => ("done", None),
        VerifyState::Aborted(reason) => ("aborted", Some(reason.clone())),
    };
    let percent = if report.total_bytes == 0 {
        100
    } else {
        ((u128::from(report.checked_bytes + report.skipped_bytes) * 100)
            / u128::from(report.total_bytes)) as u64
    };
    VerifyResponse {
        volume: name.to_string(),
        primary: cluster_state.node_name(state.cluster.node_id()),
        state: state_text.to_string(),
        reason,
        total_bytes: report.total_bytes,
        checked_bytes: report.checked_bytes,
        skipped_bytes: report.skipped_bytes,
        percent: percent.min(100),
        replicas: report
            .members
            .iter()
            .map(|&node| cluster_state.node_name(node))
            .collect(),
        differing_blocks: report.differing_blocks,
        no_majority_blocks: report.no_majority_blocks,
        unrecoverable_blocks: report.unrecoverable_blocks,
        repaired: report
            .repaired
            .iter()
            .map(|(&node, &blocks)| RepairedResponse {
                node: cluster_state.node_name(node),
                blocks,
            })
            .collect(),
        elapsed_ms: if report.finished_ms > 0 {
            report.finished_ms.saturating_sub(report.started_ms)
        } else {
            0
        },
    }
}

/// How often a finished verify is looked for, to log its result.
const VERIFY_WATCH_INTERVAL: Duration = Duration::from_secs(1);

/// Verifies being watched, by (node, volume): one watcher each, however
/// often a start is asked for while one runs.
fn watched() -> &'static Mutex<BTreeSet<(NodeId, VolumeName)>> {
    static WATCHED: OnceLock<Mutex<BTreeSet<(NodeId, VolumeName)>>> = OnceLock::new();
    WATCHED.get_or_init(Default::default)
}

/// Logs the verify's result (and its repairs) in the cluster's event log
/// once the engine reports it finished. The watcher ends with the engine.
fn log_when_finished(
    state: &ApiState,
    name: VolumeName,
    engine: Arc<crate::replicated::EngineHandle>,
) {
    let node = state.cluster.node_id();
    let key = (node, name.clone());
    if !watched()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key.clone())
    {
        return;
    }
    let cluster = state.cluster.clone();
    tokio::spawn(async move {
        let report = loop {
            tokio::time::sleep(VERIFY_WATCH_INTERVAL).await;
            match engine.verify_report().await {
                Ok(Some(report)) if report.state != VerifyState::Running => break Some(report),
                Ok(_) => continue,
                Err(_) => break None,
            }
        };
        watched()
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key);
        let Some(report) = report else { return };
        let events = verify_events(&cluster.state.read(), node, &name, &report);
        for event in events {
            if let Err(error) = cluster.write(Command::RecordEvent { event }).await {
                tracing::warn!(volume = %name, "could not log the verify's result: {error}");
            }
        }
    });
}

fn verify_events(
    cluster_state: &trireme_control::ClusterState,
    node: NodeId,
    name: &VolumeName,
    report: &VerifyReport,
) -> Vec<ReportedEvent> {
    let outcome = match &report.state {
        VerifyState::Aborted(reason) => format!("aborted: {reason}"),
        _ => "done".to_string(),
    };
    let mut events = vec![ReportedEvent {
        kind: EventKind::VerifyFinished,
        node: Some(node),
        volume: Some(name.clone()),
        message: format!(
            "verify of volume {name} {outcome}: {} of {} bytes compared, {} blocks differed, {} without a majority, {} unrecoverable",
            report.checked_bytes,
            report.total_bytes,
            report.differing_blocks,
            report.no_majority_blocks,
            report.unrecoverable_blocks
        ),
    }];
    if !report.repaired.is_empty() {
        let repaired: Vec<String> = report
            .repaired
            .iter()
            .map(|(node, blocks)| format!("{blocks} on {}", cluster_state.node_name(*node)))
            .collect();
        events.push(ReportedEvent {
            kind: EventKind::Repaired,
            node: Some(node),
            volume: Some(name.clone()),
            message: format!(
                "verify of volume {name} rewrote blocks that differed from the majority: {}",
                repaired.join(", ")
            ),
        });
    }
    events
}
