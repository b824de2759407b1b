//! CreateVolume and DeleteVolume.
//!
//! CreateVolume is idempotent by name: the CSI name maps to one trireme
//! name ([`crate::names`]), so a repeat finds the volume the first call
//! made and answers it if its size fits, or ALREADY_EXISTS if it does not.
//! A create that fails after trireme made something (a clone that cannot
//! be grown, a source snapshot taken for a volume clone) takes it back:
//! nothing is left half-made.

use std::collections::HashMap;
use std::time::Duration;
use tonic::Status;

use super::{capability, fits, size_for, topology};
use crate::api::{self, Api, ApiError};
use crate::csi::volume_content_source::{self, SnapshotSource, VolumeSource};
use crate::csi::*;
use crate::names;
use crate::status::{from_api, missing};
use crate::Driver;

/// StorageClass parameters the external-provisioner passes through with
/// this prefix (fstype, secrets' names): read or ignored, never refused.
const KUBERNETES_PREFIX: &str = "csi.storage.k8s.io/";
/// How long a CreateVolume waits for a snapshot it took to be ready.
const SNAPSHOT_READY_WAIT: Duration = Duration::from_secs(30);

/// The StorageClass parameters trireme reads.
#[derive(Debug, Default)]
struct Parameters {
    group: Option<String>,
    replicas: Option<usize>,
    device_class: Option<String>,
}

fn parameters(map: &HashMap<String, String>) -> Result<Parameters, Status> {
    let mut parameters = Parameters::default();
    for (key, value) in map {
        match key.as_str() {
            "resourceGroup" => parameters.group = Some(value.clone()),
            "replicas" => {
                let count = value.parse::<usize>().ok().filter(|count| *count >= 1);
                parameters.replicas = Some(count.ok_or_else(|| {
                    Status::invalid_argument(format!(
                        "StorageClass parameter replicas='{value}' is not a whole number from 1 up"
                    ))
                })?);
            }
            "deviceClass" => {
                if !matches!(value.as_str(), "nvme" | "ssd" | "hdd") {
                    return Err(Status::invalid_argument(format!(
                        "StorageClass parameter deviceClass='{value}': use nvme, ssd or hdd"
                    )));
                }
                parameters.device_class = Some(value.clone());
            }
            key if key.starts_with(KUBERNETES_PREFIX) => {}
            other => {
                return Err(Status::invalid_argument(format!(
                    "unknown StorageClass parameter '{other}': trireme reads resourceGroup, \
                     replicas and deviceClass"
                )))
            }
        }
    }
    Ok(parameters)
}

/// The resource group to create in and its replica count: the named one,
/// else the one whose device class is asked for, else `default`.
async fn group_for(api: &Api, parameters: &Parameters) -> Result<(String, usize), Status> {
    let groups: Vec<api::Group> = api
        .get("/groups")
        .await
        .map_err(|error| from_api("reading the resource groups", error))?;
    let group = match (&parameters.group, &parameters.device_class) {
        (Some(name), class) => {
            let group = groups
                .iter()
                .find(|group| &group.name == name)
                .ok_or_else(|| {
                    Status::invalid_argument(format!(
                        "StorageClass parameter resourceGroup='{name}': no such resource group; \
                     create it with `trireme group create {name}` or see `trireme group list`"
                    ))
                })?;
            if let Some(class) = class {
                if group.class.as_deref() != Some(class.as_str()) {
                    return Err(Status::invalid_argument(format!(
                        "resource group '{name}' places on {} pools, not deviceClass '{class}': \
                         drop one of the two parameters",
                        group.class.as_deref().unwrap_or("any")
                    )));
                }
            }
            group
        }
        (None, Some(class)) => groups
            .iter()
            .find(|group| group.class.as_deref() == Some(class.as_str()))
            .ok_or_else(|| {
                Status::invalid_argument(format!(
                    "no resource group places on deviceClass '{class}': create one with \
                     `trireme group create csi-{class} --class {class}` and name it in the \
                     StorageClass (resourceGroup)"
                ))
            })?,
        (None, None) => groups
            .iter()
            .find(|group| group.name == "default")
            .or(groups.first())
            .ok_or_else(|| Status::failed_precondition("the cluster has no resource group"))?,
    };
    let count = parameters.replicas.unwrap_or(group.place_count);
    Ok((group.name.clone(), count))
}

pub async fn create_volume(
    driver: &Driver,
    request: CreateVolumeRequest,
) -> Result<CreateVolumeResponse, Status> {
    if request.name.is_empty() {
        return Err(missing("name"));
    }
    capability::check_all(&request.volume_capabilities)?;
    let parameters = parameters(&request.parameters)?;
    let size_bytes = size_for(request.capacity_range.as_ref())?;
    let api = driver.api_for(&request.secrets);
    let name = names::trireme_name(&request.name);
    let source = request
        .volume_content_source
        .as_ref()
        .and_then(|source| source.r#type.clone());

    if let Some(existing) = find_volume(&api, &name).await? {
        return existing_answer(&api, &request, existing, source).await;
    }
    let (group, replicas) = group_for(&api, &parameters).await?;
    let nodes: Vec<api::Node> = api
        .get("/nodes")
        .await
        .map_err(|error| from_api("reading the nodes", error))?;
    check_space(&nodes, size_bytes)?;
    let made = match &source {
        None => {
            let placement = topology::placement(
                request.accessibility_requirements.as_ref(),
                &nodes,
                replicas,
            )
            .map_err(Status::resource_exhausted)?;
            let body = api::CreateVolume {
                name: &name,
                size_bytes,
                group: Some(&group),
                replicas: parameters.replicas,
                nodes: placement,
            };
            api.post::<api::Volume>("/volumes", &body).await
        }
        Some(volume_content_source::Type::Snapshot(SnapshotSource { snapshot_id })) => {
            clone_snapshot(&api, snapshot_id, &name, &group).await?
        }
        Some(volume_content_source::Type::Volume(VolumeSource { volume_id })) => {
            clone_volume(&api, volume_id, &name, &group).await?
        }
    };
    let volume = match made {
        Ok(volume) => volume,
        // Made meanwhile by a retry of this same request: answer as a repeat.
        Err(error) if error.code() == Some("volume_exists") => {
            let existing = find_volume(&api, &name)
                .await?
                .ok_or_else(|| from_api(&format!("creating volume '{name}'"), error))?;
            return existing_answer(&api, &request, existing, source).await;
        }
        Err(error) => return Err(from_api(&format!("creating volume '{name}'"), error)),
    };
    let volume = grow_clone(&api, volume, size_bytes).await?;
    Ok(CreateVolumeResponse {
        volume: Some(csi_volume(&volume, &nodes, source)),
    })
}

async fn find_volume(api: &Api, name: &str) -> Result<Option<api::Volume>, Status> {
    match api.get::<api::Volume>(&format!("/volumes/{name}")).await {
        Ok(volume) => Ok(Some(volume)),
        Err(error) if error.is_not_found() => Ok(None),
        Err(error) => Err(from_api(&format!("looking up volume '{name}'"), error)),
    }
}

/// A repeated CreateVolume: the same answer when the volume fits the
/// request, ALREADY_EXISTS when it does not.
async fn existing_answer(
    api: &Api,
    request: &CreateVolumeRequest,
    existing: api::Volume,
    source: Option<volume_content_source::Type>,
) -> Result<CreateVolumeResponse, Status> {
    if !fits(existing.size_bytes, request.capacity_range.as_ref()) {
        return Err(Status::already_exists(format!(
            "volume '{}' exists with {} bytes, outside the capacity range asked for now: \
             choose another name or the same size",
            request.name, existing.size_bytes
        )));
    }
    let nodes: Vec<api::Node> = api.get("/nodes").await.unwrap_or_default();
    Ok(CreateVolumeResponse {
        volume: Some(csi_volume(&existing, &nodes, source)),
    })
}

/// A volume larger than every node's storage could never be written full.
fn check_space(nodes: &[api::Node], size_bytes: u64) -> Result<(), Status> {
    let largest = nodes
        .iter()
        .filter(|node| node.state == "online")
        .map(|node| node.capacity_bytes)
        .max()
        .unwrap_or(0);
    if size_bytes > largest {
        return Err(Status::resource_exhausted(format!(
            "a volume of {size_bytes} bytes does not fit: the largest online node holds \
             {largest} bytes of pools; ask for less or add a pool (`trireme pool create`)"
        )));
    }
    Ok(())
}

async fn clone_snapshot(
    api: &Api,
    snapshot_id: &str,
    name: &str,
    group: &str,
) -> Result<Result<api::Volume, ApiError>, Status> {
    let not_found = || {
        Status::not_found(format!(
            "source snapshot '{snapshot_id}' does not exist: see `trireme snapshot list`"
        ))
    };
    let (volume, snapshot) = names::parse_snapshot_id(snapshot_id).ok_or_else(not_found)?;
    let snapshots: Vec<api::Snapshot> = match api.get(&format!("/volumes/{volume}/snapshots")).await
    {
        Ok(list) => list,
        Err(error) if error.is_not_found() => return Err(not_found()),
        Err(error) => return Err(from_api("reading the source snapshot", error)),
    };
    if !snapshots.iter().any(|s| s.name == snapshot) {
        return Err(not_found());
    }
    let body = api::Clone {
        name,
        group: Some(group),
    };
    Ok(api
        .post(
            &format!("/volumes/{volume}/snapshots/{snapshot}/clone"),
            &body,
        )
        .await)
}

/// A clone of a volume: a snapshot of it taken for the purpose, cloned,
/// then deleted (the clone keeps the chunks it shares).
async fn clone_volume(
    api: &Api,
    source: &str,
    name: &str,
    group: &str,
) -> Result<Result<api::Volume, ApiError>, Status> {
    if !names::is_trireme_name(source) || find_volume(api, source).await?.is_none() {
        return Err(Status::not_found(format!(
            "source volume '{source}' does not exist: see `trireme volume list`"
        )));
    }
    let snapshot = names::trireme_name(&format!("csi-clone-source-for:{name}"));
    let taken = api
        .post::<api::Snapshot>(
            &format!("/volumes/{source}/snapshots"),
            &api::CreateSnapshot { name: &snapshot },
        )
        .await;
    match taken {
        Ok(_) => {}
        Err(error) if error.code() == Some("snapshot_exists") => {}
        Err(error) => return Err(from_api(&format!("snapshotting volume '{source}'"), error)),
    }
    wait_snapshot_ready(api, source, &snapshot).await?;
    let made = api
        .post(
            &format!("/volumes/{source}/snapshots/{snapshot}/clone"),
            &api::Clone {
                name,
                group: Some(group),
            },
        )
        .await;
    if let Err(error) = api
        .delete(&format!("/volumes/{source}/snapshots/{snapshot}"))
        .await
    {
        tracing::warn!(%error, source, snapshot, "could not delete the snapshot a clone was made from");
    }
    Ok(made)
}

async fn wait_snapshot_ready(api: &Api, volume: &str, snapshot: &str) -> Result<(), Status> {
    let deadline = tokio::time::Instant::now() + SNAPSHOT_READY_WAIT;
    loop {
        let list: Vec<api::Snapshot> = api
            .get(&format!("/volumes/{volume}/snapshots"))
            .await
            .map_err(|error| from_api("reading snapshots", error))?;
        match list.iter().find(|s| s.name == snapshot) {
            Some(found) if found.state == "ready" => return Ok(()),
            Some(found) if found.state == "failed" => {
                return Err(Status::internal(format!(
                    "the snapshot of volume '{volume}' for a clone failed: {}",
                    found.error.as_deref().unwrap_or("no reason given")
                )))
            }
            _ if tokio::time::Instant::now() > deadline => {
                return Err(Status::deadline_exceeded(format!(
                    "the snapshot of volume '{volume}' for a clone was not ready in {} s; retry",
                    SNAPSHOT_READY_WAIT.as_secs()
                )))
            }
            _ => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

/// A clone has its source's size: grow it to the size asked for, or take
/// it back when that fails.
async fn grow_clone(
    api: &Api,
    volume: api::Volume,
    size_bytes: u64,
) -> Result<api::Volume, Status> {
    if volume.size_bytes >= size_bytes {
        return Ok(volume);
    }
    let name = volume.name.clone();
    match api
        .post::<api::Volume>(&format!("/volumes/{name}/grow"), &api::Grow { size_bytes })
        .await
    {
        Ok(grown) => Ok(grown),
        Err(error) => {
            if let Err(undo) = api.delete(&format!("/volumes/{name}")).await {
                tracing::error!(%undo, name, "could not take back a clone that failed to grow");
            }
            Err(from_api(
                &format!("growing the clone '{name}' to {size_bytes} bytes"),
                error,
            ))
        }
    }
}

/// The CSI view of a volume: reachable from the nodes holding its data.
pub fn csi_volume(
    volume: &api::Volume,
    nodes: &[api::Node],
    source: Option<volume_content_source::Type>,
) -> Volume {
    let accessible_topology = volume
        .diskful_nodes()
        .map(|name| match nodes.iter().find(|node| node.name == name) {
            Some(node) => topology::of_node(node),
            None => Topology {
                segments: [(topology::NODE_KEY.to_string(), name.to_string())].into(),
            },
        })
        .collect();
    Volume {
        capacity_bytes: volume.size_bytes as i64,
        volume_id: volume.name.clone(),
        volume_context: [("trireme.io/group".to_string(), volume.group.clone())].into(),
        content_source: source.map(|source| VolumeContentSource {
            r#type: Some(source),
        }),
        accessible_topology,
    }
}

pub async fn delete_volume(
    driver: &Driver,
    request: DeleteVolumeRequest,
) -> Result<DeleteVolumeResponse, Status> {
    let id = request.volume_id;
    if id.is_empty() {
        return Err(missing("volume_id"));
    }
    // An id this driver never made names no volume: already gone.
    if !names::is_trireme_name(&id) {
        return Ok(DeleteVolumeResponse {});
    }
    let api = driver.api_for(&request.secrets);
    match api.delete(&format!("/volumes/{id}")).await {
        Ok(()) => Ok(DeleteVolumeResponse {}),
        Err(error) if error.is_not_found() => Ok(DeleteVolumeResponse {}),
        Err(error) if error.code() == Some("has_snapshots") => Err(Status::failed_precondition(
            format!("volume '{id}' has snapshots: delete its VolumeSnapshots first ({error})"),
        )),
        Err(error) => Err(from_api(&format!("deleting volume '{id}'"), error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_parameters_and_bad_values_are_refused_by_name() {
        let map = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<HashMap<_, _>>()
        };
        let ok = parameters(&map(&[
            ("resourceGroup", "fast"),
            ("replicas", "2"),
            ("csi.storage.k8s.io/fstype", "xfs"),
        ]))
        .unwrap();
        assert_eq!(ok.group.as_deref(), Some("fast"));
        assert_eq!(ok.replicas, Some(2));
        let error = parameters(&map(&[("replica", "2")])).unwrap_err();
        assert!(error.message().contains("'replica'"), "{}", error.message());
        assert!(parameters(&map(&[("replicas", "0")])).is_err());
        assert!(parameters(&map(&[("deviceClass", "tape")])).is_err());
    }
}
