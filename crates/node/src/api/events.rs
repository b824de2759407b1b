//! `GET /api/v1/events`: the cluster's event log (`trireme_control::events`),
//! read from this node's copy of the replicated state, so every node
//! answers alike and none asks another.

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::Json;
use std::collections::BTreeMap;
use trireme_control::{Event, EVENT_LOG_CAPACITY};
use trireme_types::time::UtcTime;

use super::model::{ErrorBody, EventResponse, EventsResponse};
use super::{validate, ApiError, ApiState};

/// Events in one answer unless `limit` says otherwise.
pub const DEFAULT_EVENTS_LIMIT: usize = 100;
/// The most events in one answer: the whole log.
pub const MAX_EVENTS_LIMIT: usize = EVENT_LOG_CAPACITY;

#[utoipa::path(get, path = "/api/v1/events", tag = "cluster",
    params(
        ("after" = Option<u64>, Query, description = "Only events with a larger seq, oldest first (to follow the log). Without it: the newest events."),
        ("volume" = Option<String>, Query, description = "Only events of this volume"),
        ("limit" = Option<usize>, Query, description = "At most this many events (1 to 1000, default 100)")),
    responses(
        (status = 200, description = "Events, oldest first", body = EventsResponse),
        (status = 400, description = "A parameter is not valid", body = ErrorBody),
        (status = 404, description = "No such volume, and no event of it in the log", body = ErrorBody)))]
pub async fn list_events(
    State(state): State<ApiState>,
    Query(query): Query<BTreeMap<String, String>>,
) -> Result<Json<EventsResponse>, ApiError> {
    let mut after = None;
    let mut volume = None;
    let mut limit = DEFAULT_EVENTS_LIMIT;
    for (key, value) in &query {
        match key.as_str() {
            "after" => after = Some(parse_after(value)?),
            "volume" => volume = Some(validate::volume_name(value)?),
            "limit" => limit = parse_limit(value)?,
            other => {
                return Err(ApiError::bad_request(
                    "invalid_query",
                    format!(
                    "unknown parameter '{other}': GET /api/v1/events takes after, volume and limit"
                ),
                ))
            }
        }
    }
    let cluster_state = state.cluster.state.read();
    if let Some(volume) = &volume {
        let known = cluster_state.volumes.contains_key(volume)
            || cluster_state
                .events
                .iter()
                .any(|event| event.volume.as_ref() == Some(volume));
        if !known {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "volume_not_found",
                format!("no volume named '{volume}', and no event of one in the log (see `trireme volume list`)"),
            ));
        }
    }
    let page = cluster_state.events.page(after, volume.as_ref(), limit);
    Ok(Json(EventsResponse {
        events: page.events.iter().map(response).collect(),
        last_seq: page.last_seq,
        missed: page.missed,
    }))
}

fn parse_after(value: &str) -> Result<u64, ApiError> {
    value.parse().map_err(|_| {
        ApiError::bad_request(
            "invalid_query",
            format!("after={value:?} is not an event sequence number: give the seq of the last event you have (0 for all)"),
        )
    })
}

fn parse_limit(value: &str) -> Result<usize, ApiError> {
    match value.parse::<usize>() {
        Ok(limit) if (1..=MAX_EVENTS_LIMIT).contains(&limit) => Ok(limit),
        _ => Err(ApiError::bad_request(
            "invalid_query",
            format!("limit={value:?} is not a number from 1 to {MAX_EVENTS_LIMIT}"),
        )),
    }
}

pub fn response(event: &Event) -> EventResponse {
    EventResponse {
        seq: event.seq,
        time: rfc3339(event.time_ms),
        time_ms: event.time_ms,
        kind: event.kind.as_str().to_string(),
        node: event.node.clone(),
        volume: event.volume.as_ref().map(|volume| volume.to_string()),
        actor: event.actor.clone(),
        message: event.message.clone(),
    }
}

/// `2026-11-27T04:48:49.123Z`
fn rfc3339(time_ms: u64) -> String {
    let time = UtcTime::from_unix(time_ms / 1000);
    format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        time.year,
        time.month,
        time.day,
        time.hour,
        time.minute,
        time.second,
        time_ms % 1000
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn times_are_rfc3339_in_utc() {
        assert_eq!(
            super::rfc3339(1_795_503_909_042),
            "2026-11-24T07:05:09.042Z"
        );
    }
}
