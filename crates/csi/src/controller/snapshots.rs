//! CreateSnapshot, DeleteSnapshot and ListSnapshots.
//!
//! A snapshot's CSI id is `VOLUME@SNAPSHOT`. CSI snapshot names are unique
//! across the driver, trireme's only within a volume: a CreateSnapshot
//! whose name is taken by another volume's snapshot is ALREADY_EXISTS.

use tonic::Status;

use super::{parse_token, TOKEN_PREFIX};
use crate::api::{self, Api};
use crate::csi::*;
use crate::names;
use crate::status::{from_api, missing};
use crate::Driver;

fn csi_snapshot(snapshot: &api::Snapshot) -> Snapshot {
    Snapshot {
        size_bytes: snapshot.size_bytes as i64,
        snapshot_id: names::snapshot_id(&snapshot.volume, &snapshot.name),
        source_volume_id: snapshot.volume.clone(),
        creation_time: Some(prost_types::Timestamp {
            seconds: snapshot.created_unix_seconds as i64,
            nanos: 0,
        }),
        ready_to_use: snapshot.state == "ready",
        group_snapshot_id: String::new(),
    }
}

async fn all(api: &Api) -> Result<Vec<api::Snapshot>, Status> {
    api.get("/snapshots")
        .await
        .map_err(|error| from_api("listing snapshots", error))
}

pub async fn create(
    driver: &Driver,
    request: CreateSnapshotRequest,
) -> Result<CreateSnapshotResponse, Status> {
    if request.name.is_empty() {
        return Err(missing("name"));
    }
    let source = &request.source_volume_id;
    if source.is_empty() {
        return Err(missing("source_volume_id"));
    }
    let api = driver.api_for(&request.secrets);
    let name = names::trireme_name(&request.name);
    if let Some(existing) = all(&api).await?.into_iter().find(|s| s.name == name) {
        if &existing.volume != source {
            return Err(Status::already_exists(format!(
                "snapshot name '{}' is taken by a snapshot of volume '{}': choose another name",
                request.name, existing.volume
            )));
        }
        return Ok(CreateSnapshotResponse {
            snapshot: Some(csi_snapshot(&existing)),
        });
    }
    if !names::is_trireme_name(source) {
        return Err(Status::not_found(format!(
            "source volume '{source}' does not exist"
        )));
    }
    let taken: api::Snapshot = api
        .post(
            &format!("/volumes/{source}/snapshots"),
            &api::CreateSnapshot { name: &name },
        )
        .await
        .map_err(|error| from_api(&format!("snapshotting volume '{source}'"), error))?;
    if taken.state == "failed" {
        return Err(Status::internal(format!(
            "the snapshot of volume '{source}' failed: {}",
            taken.error.as_deref().unwrap_or("no reason given")
        )));
    }
    Ok(CreateSnapshotResponse {
        snapshot: Some(csi_snapshot(&taken)),
    })
}

pub async fn delete(
    driver: &Driver,
    request: DeleteSnapshotRequest,
) -> Result<DeleteSnapshotResponse, Status> {
    if request.snapshot_id.is_empty() {
        return Err(missing("snapshot_id"));
    }
    let Some((volume, snapshot)) = names::parse_snapshot_id(&request.snapshot_id) else {
        return Ok(DeleteSnapshotResponse {});
    };
    let api = driver.api_for(&request.secrets);
    match api
        .delete(&format!("/volumes/{volume}/snapshots/{snapshot}"))
        .await
    {
        Ok(()) => Ok(DeleteSnapshotResponse {}),
        Err(error) if error.is_not_found() => Ok(DeleteSnapshotResponse {}),
        Err(error) => Err(from_api(
            &format!("deleting snapshot '{}'", request.snapshot_id),
            error,
        )),
    }
}

pub async fn list(
    driver: &Driver,
    request: ListSnapshotsRequest,
) -> Result<ListSnapshotsResponse, Status> {
    let after = parse_token(&request.starting_token)?;
    if request.max_entries < 0 {
        return Err(Status::invalid_argument("max_entries cannot be negative"));
    }
    let api = driver.api_for(&request.secrets);
    let mut snapshots: Vec<Snapshot> = all(&api)
        .await?
        .iter()
        .filter(|snapshot| snapshot.state != "deleting")
        .map(csi_snapshot)
        .filter(|snapshot| {
            request.snapshot_id.is_empty() || snapshot.snapshot_id == request.snapshot_id
        })
        .filter(|snapshot| {
            request.source_volume_id.is_empty()
                || snapshot.source_volume_id == request.source_volume_id
        })
        .collect();
    snapshots.sort_by(|a, b| a.snapshot_id.cmp(&b.snapshot_id));
    let rest: Vec<Snapshot> = snapshots
        .into_iter()
        .filter(|snapshot| after.is_none_or(|after| snapshot.snapshot_id.as_str() > after))
        .collect();
    let take = match request.max_entries {
        0 => rest.len(),
        count => rest.len().min(count as usize),
    };
    let next_token = if take < rest.len() {
        format!("{TOKEN_PREFIX}{}", rest[take - 1].snapshot_id)
    } else {
        String::new()
    };
    let entries = rest
        .into_iter()
        .take(take)
        .map(|snapshot| list_snapshots_response::Entry {
            snapshot: Some(snapshot),
        })
        .collect();
    Ok(ListSnapshotsResponse {
        entries,
        next_token,
    })
}
