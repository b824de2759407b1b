//! `GET /api/v1/io/history`: the last hour of I/O at 10 s resolution, for
//! the cluster, one node or one volume, so that a chart opens full. Each
//! node keeps its own samples ([`crate::metrics::history`]); the answering
//! node gathers them from every online node (the internal route below,
//! signed by a member, like `/api/v1/io`) and adds up those of the same
//! slot.

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::task::JoinSet;
use trireme_control::NodeState;
use trireme_types::{NodeName, VolumeName};
use utoipa::ToSchema;

use super::{validate, ApiError, ApiState};
use crate::metrics::history::{self, Sample};
use crate::NodeError;

/// The public route.
pub const PATH: &str = "/api/v1/io/history";
/// Where a node answers with its own samples (signed by a member).
pub const PATH_INTERNAL: &str = "/internal/v1/io-history";
/// How long the answering node waits for the others: a slow or cut-off
/// node is reported in `missing_nodes`, never waited for longer.
const GATHER_TIMEOUT: Duration = Duration::from_secs(2);

/// The I/O of one slot of `resolution_seconds`, added up over the nodes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct IoHistorySample {
    /// Start of the slot, seconds since the Unix epoch (a multiple of the
    /// resolution).
    pub unix_seconds: u64,
    pub read_iops: f64,
    pub write_iops: f64,
    pub read_bytes_per_sec: f64,
    pub write_bytes_per_sec: f64,
}

impl From<Sample> for IoHistorySample {
    fn from(sample: Sample) -> Self {
        IoHistorySample {
            unix_seconds: sample.unix_seconds,
            read_iops: f64::from(sample.read_iops),
            write_iops: f64::from(sample.write_iops),
            read_bytes_per_sec: f64::from(sample.read_bytes_per_sec),
            write_bytes_per_sec: f64::from(sample.write_bytes_per_sec),
        }
    }
}

/// The history of the cluster, a node or a volume.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct IoHistoryResponse {
    /// `cluster`, `node` or `volume`.
    pub scope: String,
    /// The node's or volume's name; none for the cluster.
    pub name: Option<String>,
    /// One sample per this many seconds (10).
    pub resolution_seconds: u64,
    /// How far back the nodes keep samples (3600); at most
    /// span / resolution samples are answered.
    pub span_seconds: u64,
    /// Oldest first. Slots no node has a sample of (before a node started,
    /// or while none served the volume) are left out.
    pub samples: Vec<IoHistorySample>,
    /// Nodes asked that did not answer within 2 s, or offline ones: their
    /// I/O is not in the figures.
    pub missing_nodes: Vec<String>,
}

/// What the answering node asks each node for.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct InternalRequest {
    /// One volume's samples; without it the node's own.
    volume: Option<String>,
}

/// What the history is of, from the query.
enum Scope {
    Cluster,
    Node(NodeName),
    Volume(VolumeName),
}

/// The public route, for the protected router.
pub fn router() -> Router<ApiState> {
    Router::new().route(PATH, get(io_history))
}

/// The node-to-node route, signed by a member (outside the token check).
pub fn internal_router() -> Router<ApiState> {
    Router::new().route(PATH_INTERNAL, post(internal_io_history))
}

fn scope_of(query: Option<&str>) -> Result<Scope, ApiError> {
    let mut scope = Scope::Cluster;
    // Names are letters, digits, '-', '_' and '.': nothing to decode, and
    // an escape is refused by the name check, which says what is allowed.
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let next = match pair.split_once('=') {
            Some(("volume", name)) => Scope::Volume(validate::volume_name(name)?),
            Some(("node", name)) => Scope::Node(NodeName::new(name).map_err(NodeError::from)?),
            _ => {
                return Err(ApiError::bad_request(
                    "invalid_request",
                    format!("query '{pair}' is not understood: give volume=NAME, node=NAME or nothing (the whole cluster)"),
                ))
            }
        };
        if !matches!(scope, Scope::Cluster) {
            return Err(ApiError::bad_request(
                "invalid_request",
                "give one of volume=NAME and node=NAME, not both",
            ));
        }
        scope = next;
    }
    Ok(scope)
}

#[utoipa::path(get, path = "/api/v1/io/history", tag = "cluster",
    params(
        ("volume" = Option<String>, Query, description = "One volume's history (the sum over the nodes that served it)"),
        ("node" = Option<String>, Query, description = "One node's history (all the volumes it served)")),
    responses(
        (status = 200, description = "The last hour of read and write rates, one sample per 10 s, oldest first; without a query, the whole cluster's. Nodes keep their samples in memory: a node that restarted has none from before", body = IoHistoryResponse),
        (status = 400, description = "A query other than volume=NAME or node=NAME, or a bad name", body = super::model::ErrorBody),
        (status = 404, description = "No such volume or node", body = super::model::ErrorBody)))]
pub async fn io_history(
    State(state): State<ApiState>,
    RawQuery(query): RawQuery,
) -> Result<Json<IoHistoryResponse>, ApiError> {
    let scope = scope_of(query.as_deref())?;
    let (asked, missing_nodes, ask_myself) = nodes_to_ask(&state, &scope)?;
    let (scope_word, name, volume) = match scope {
        Scope::Cluster => ("cluster", None, None),
        Scope::Node(node) => ("node", Some(node.to_string()), None),
        Scope::Volume(volume) => ("volume", Some(volume.to_string()), Some(volume.to_string())),
    };
    let request = InternalRequest { volume };
    let mut answers = Vec::new();
    if ask_myself {
        answers.push(local_samples(&state, &request));
    }
    let (gathered, mut missing_nodes) = gather(&state, asked, &request, missing_nodes).await;
    answers.extend(gathered);
    missing_nodes.sort();
    Ok(Json(IoHistoryResponse {
        scope: scope_word.to_string(),
        name,
        resolution_seconds: history::RESOLUTION.as_secs(),
        span_seconds: history::SPAN.as_secs(),
        samples: merge(answers),
        missing_nodes,
    }))
}

type Peer = (String, String);

/// The other nodes to ask (name, API address), those that cannot be
/// asked (offline), and whether this node's own samples count.
fn nodes_to_ask(
    state: &ApiState,
    scope: &Scope,
) -> Result<(Vec<Peer>, Vec<String>, bool), ApiError> {
    let me = state.cluster.node_id();
    let cluster_state = state.cluster.state.read();
    if let Scope::Volume(volume) = scope {
        if !cluster_state.volumes.contains_key(volume) {
            return Err(NodeError::VolumeNotFound(volume.clone()).into());
        }
    }
    let only = match scope {
        Scope::Node(name) => Some(cluster_state.node_by_name(name).ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "node_not_found",
                format!("no node named '{name}': see `trireme node list`"),
            )
        })?),
        _ => None,
    };
    let mut asked = Vec::new();
    let mut missing = Vec::new();
    let mut ask_myself = false;
    let candidates = cluster_state
        .nodes
        .values()
        .filter(|record| only.is_none_or(|only| only.id == record.id));
    for record in candidates {
        if record.id == me {
            ask_myself = true;
        } else if record.state == NodeState::Online {
            asked.push((record.name.to_string(), record.api_address.clone()));
        } else {
            missing.push(record.name.to_string());
        }
    }
    Ok((asked, missing, ask_myself))
}

fn local_samples(state: &ApiState, request: &InternalRequest) -> Vec<IoHistorySample> {
    let history = &state.metrics.history;
    let samples = match &request.volume {
        Some(volume) => history.volume(volume),
        None => history.node(),
    };
    samples.into_iter().map(IoHistorySample::from).collect()
}

/// Asks the other nodes at once, each for at most [`GATHER_TIMEOUT`].
async fn gather(
    state: &ApiState,
    asked: Vec<Peer>,
    request: &InternalRequest,
    mut missing_nodes: Vec<String>,
) -> (Vec<Vec<IoHistorySample>>, Vec<String>) {
    let mut answers = JoinSet::new();
    for (name, address) in asked {
        let cluster = state.cluster.clone();
        let request = request.clone();
        answers.spawn(async move {
            let answer = tokio::time::timeout(
                GATHER_TIMEOUT,
                cluster
                    .peers
                    .post::<_, Vec<IoHistorySample>>(&address, PATH_INTERNAL, &request),
            )
            .await;
            (name, answer)
        });
    }
    let mut gathered = Vec::new();
    while let Some(joined) = answers.join_next().await {
        match joined {
            Ok((_, Ok(Ok(samples)))) => gathered.push(samples),
            Ok((name, Ok(Err(error)))) => {
                tracing::debug!(node = %name, %error, "no I/O history from this node");
                missing_nodes.push(name);
            }
            Ok((name, Err(_))) => {
                tracing::debug!(node = %name, "no I/O history from this node in time");
                missing_nodes.push(name);
            }
            Err(error) => tracing::warn!(%error, "gathering I/O history failed"),
        }
    }
    (gathered, missing_nodes)
}

/// Adds up the nodes' samples of each slot; keeps the newest
/// [`history::SAMPLES_KEPT`] slots (nodes' clocks may differ a little).
fn merge(answers: Vec<Vec<IoHistorySample>>) -> Vec<IoHistorySample> {
    let mut slots: BTreeMap<u64, IoHistorySample> = BTreeMap::new();
    for sample in answers.into_iter().flatten() {
        let slot = slots.entry(sample.unix_seconds).or_insert(IoHistorySample {
            unix_seconds: sample.unix_seconds,
            read_iops: 0.0,
            write_iops: 0.0,
            read_bytes_per_sec: 0.0,
            write_bytes_per_sec: 0.0,
        });
        slot.read_iops += sample.read_iops;
        slot.write_iops += sample.write_iops;
        slot.read_bytes_per_sec += sample.read_bytes_per_sec;
        slot.write_bytes_per_sec += sample.write_bytes_per_sec;
    }
    let skip = slots.len().saturating_sub(history::SAMPLES_KEPT);
    slots.into_values().skip(skip).collect()
}

/// Signed by a member: this node's samples, for the answering node.
async fn internal_io_history(
    State(state): State<ApiState>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Json<Vec<IoHistorySample>>, ApiError> {
    let (_, request): (_, InternalRequest) =
        super::internal::verified(&state.cluster, &headers, PATH_INTERNAL, &body)?;
    Ok(Json(local_samples(&state, &request)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use http_body_util::BodyExt;
    use std::sync::Arc;
    use std::time::UNIX_EPOCH;
    use tower::ServiceExt;

    use crate::metrics::Totals;

    /// A one-node cluster of its own with no pool, and its API state.
    async fn api_state(directory: &std::path::Path) -> ApiState {
        let node = Arc::new(crate::Node::open(directory).unwrap());
        let cluster = crate::cluster::start::start(
            crate::cluster::ClusterConfig {
                name: NodeName::new("solo").unwrap(),
                labels: Default::default(),
                join: None,
                trust_loopback: true,
            },
            directory,
            "127.0.0.1:9".to_string(),
            None,
            None,
        )
        .await
        .unwrap();
        let replication = crate::replicated::Replication::open(
            node.clone(),
            cluster.clone(),
            "127.0.0.1:9".into(),
        )
        .unwrap();
        let devices = Arc::new(crate::local_device::LocalDevices::new(
            directory,
            directory.join("nbd.sock"),
            Default::default(),
        ));
        ApiState {
            node,
            addresses: Arc::new(super::super::Addresses::default()),
            cluster,
            replication,
            metrics: crate::metrics::Metrics::new(),
            devices,
        }
    }

    async fn get_json(state: &ApiState, uri: &str) -> (StatusCode, serde_json::Value) {
        let response = super::super::router(state.clone())
            .oneshot(Request::get(uri).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&body).unwrap())
    }

    /// Two hours of counters, one reading a second, 5 writes of 8 KiB a
    /// second: the route answers the last hour only, one sample per 10 s.
    #[tokio::test]
    async fn the_route_answers_one_hour_at_ten_seconds_a_sample() {
        let directory = tempfile::tempdir().unwrap();
        let state = api_state(directory.path()).await;
        let start = 1_700_000_000;
        for second in 0..=2 * 3600u64 {
            let totals = Totals {
                write_ops: 5 * second,
                write_bytes: 5 * second * 8192,
                ..Totals::default()
            };
            let volumes = BTreeMap::from([("vm".to_string(), totals)]);
            let now = UNIX_EPOCH + Duration::from_secs(start + second);
            state.metrics.history.record(now, &volumes);
        }
        let (status, answer) = get_json(&state, PATH).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        let parsed: IoHistoryResponse = serde_json::from_value(answer).unwrap();
        assert_eq!(parsed.scope, "cluster");
        assert_eq!((parsed.resolution_seconds, parsed.span_seconds), (10, 3600));
        assert!(parsed.missing_nodes.is_empty());
        assert_eq!(parsed.samples.len(), 360, "an hour, no more");
        let last = parsed.samples.last().unwrap();
        assert_eq!(last.unix_seconds, start + 2 * 3600 - 10);
        for pair in parsed.samples.windows(2) {
            assert_eq!(pair[1].unix_seconds - pair[0].unix_seconds, 10);
        }
        for sample in &parsed.samples {
            assert!((sample.write_iops - 5.0).abs() < 1e-3, "{sample:?}");
            assert!((sample.write_bytes_per_sec - 40960.0).abs() < 1e-1);
            assert_eq!(sample.read_iops, 0.0);
        }
    }

    #[tokio::test]
    async fn a_bad_query_or_an_unknown_name_is_refused_with_the_reason() {
        let directory = tempfile::tempdir().unwrap();
        let state = api_state(directory.path()).await;
        let (status, answer) = get_json(&state, &format!("{PATH}?volume=nope")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
        assert!(
            answer["error"].as_str().unwrap().contains("nope"),
            "{answer}"
        );
        let (status, answer) = get_json(&state, &format!("{PATH}?node=elsewhere")).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{answer}");
        assert!(answer["error"]
            .as_str()
            .unwrap()
            .contains("trireme node list"));
        let (status, answer) = get_json(&state, &format!("{PATH}?since=5")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
        assert!(answer["error"].as_str().unwrap().contains("volume=NAME"));
        let (status, answer) = get_json(&state, &format!("{PATH}?volume=a&node=solo")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{answer}");
        let (status, answer) = get_json(&state, &format!("{PATH}?node=solo")).await;
        assert_eq!(status, StatusCode::OK, "{answer}");
        assert_eq!(answer["scope"], "node");
        assert_eq!(answer["samples"], serde_json::json!([]));
    }

    #[test]
    fn nodes_samples_of_a_slot_add_up_and_the_answer_stays_bounded() {
        let sample = |unix_seconds: u64, write_iops: f64| IoHistorySample {
            unix_seconds,
            read_iops: 0.0,
            write_iops,
            read_bytes_per_sec: 0.0,
            write_bytes_per_sec: 0.0,
        };
        // Two nodes whose clocks differ by 5 slots: 365 slots in all.
        let first: Vec<_> = (0..360).map(|slot| sample(slot * 10, 1.0)).collect();
        let second: Vec<_> = (5..365).map(|slot| sample(slot * 10, 2.0)).collect();
        let merged = merge(vec![first, second]);
        assert_eq!(merged.len(), history::SAMPLES_KEPT);
        assert_eq!(merged[0].unix_seconds, 50);
        assert_eq!(merged[0].write_iops, 3.0);
        assert_eq!(merged.last().unwrap().write_iops, 2.0);
    }
}
