//! ValidateVolumeCapabilities, ListVolumes, GetCapacity,
//! ControllerExpandVolume and ControllerGetVolume.

use tonic::Status;

use super::{capability, create::csi_volume, parse_token, size_for, topology, TOKEN_PREFIX};
use crate::api::{self, Api};
use crate::csi::*;
use crate::names;
use crate::status::{from_api, missing};
use crate::Driver;

async fn volume(api: &Api, id: &str) -> Result<api::Volume, Status> {
    let not_found = || {
        Status::not_found(format!(
            "volume '{id}' does not exist: see `trireme volume list`"
        ))
    };
    if !names::is_trireme_name(id) {
        return Err(not_found());
    }
    match api.get(&format!("/volumes/{id}")).await {
        Ok(volume) => Ok(volume),
        Err(error) if error.is_not_found() => Err(not_found()),
        Err(error) => Err(from_api(&format!("looking up volume '{id}'"), error)),
    }
}

fn condition(volume: &api::Volume) -> VolumeCondition {
    match volume.abnormal() {
        Some(message) => VolumeCondition {
            abnormal: true,
            message,
        },
        None => VolumeCondition {
            abnormal: false,
            message: format!("volume '{}' is {}", volume.name, volume.state),
        },
    }
}

pub async fn validate(
    driver: &Driver,
    request: ValidateVolumeCapabilitiesRequest,
) -> Result<ValidateVolumeCapabilitiesResponse, Status> {
    if request.volume_id.is_empty() {
        return Err(missing("volume_id"));
    }
    if request.volume_capabilities.is_empty() {
        return Err(missing("volume_capabilities"));
    }
    let api = driver.api_for(&request.secrets);
    volume(&api, &request.volume_id).await?;
    let refused: Vec<String> = request
        .volume_capabilities
        .iter()
        .filter_map(capability::unsupported)
        .collect();
    if !refused.is_empty() {
        return Ok(ValidateVolumeCapabilitiesResponse {
            confirmed: None,
            message: refused.join("; "),
        });
    }
    Ok(ValidateVolumeCapabilitiesResponse {
        confirmed: Some(validate_volume_capabilities_response::Confirmed {
            volume_context: request.volume_context,
            volume_capabilities: request.volume_capabilities,
            parameters: request.parameters,
            mutable_parameters: request.mutable_parameters,
        }),
        message: String::new(),
    })
}

pub async fn list(
    driver: &Driver,
    request: ListVolumesRequest,
) -> Result<ListVolumesResponse, Status> {
    let after = parse_token(&request.starting_token)?;
    if request.max_entries < 0 {
        return Err(Status::invalid_argument("max_entries cannot be negative"));
    }
    let api = &driver.api;
    let mut volumes: Vec<api::Volume> = api
        .get("/volumes")
        .await
        .map_err(|error| from_api("listing volumes", error))?;
    let nodes: Vec<api::Node> = api
        .get("/nodes")
        .await
        .map_err(|error| from_api("reading the nodes", error))?;
    volumes.sort_by(|a, b| a.name.cmp(&b.name));
    // After the token's name, present or deleted since.
    let rest: Vec<&api::Volume> = volumes
        .iter()
        .filter(|volume| after.is_none_or(|after| volume.name.as_str() > after))
        .collect();
    let take = match request.max_entries {
        0 => rest.len(),
        count => rest.len().min(count as usize),
    };
    let next_token = if take < rest.len() {
        format!("{TOKEN_PREFIX}{}", rest[take - 1].name)
    } else {
        String::new()
    };
    let entries = rest[..take]
        .iter()
        .map(|volume| list_volumes_response::Entry {
            volume: Some(csi_volume(volume, &nodes, None)),
            status: Some(list_volumes_response::VolumeStatus {
                published_node_ids: volume.primaries.clone(),
                volume_condition: Some(condition(volume)),
            }),
        })
        .collect();
    Ok(ListVolumesResponse {
        entries,
        next_token,
    })
}

pub async fn capacity(
    driver: &Driver,
    request: GetCapacityRequest,
) -> Result<GetCapacityResponse, Status> {
    for capability in &request.volume_capabilities {
        if capability::unsupported(capability).is_some() {
            return Ok(GetCapacityResponse::default());
        }
    }
    let class = request.parameters.get("deviceClass").cloned();
    let api = &driver.api;
    let nodes: Vec<api::Node> = api
        .get("/nodes")
        .await
        .map_err(|error| from_api("reading the nodes", error))?;
    let mut free_bytes: u64 = 0;
    let mut largest_bytes: u64 = 0;
    for node in nodes.iter().filter(|node| node.state == "online") {
        if let Some(segment) = &request.accessible_topology {
            let own = topology::segments(&node.name, &node.labels);
            if !segment.segments.iter().all(|(k, v)| own.get(k) == Some(v)) {
                continue;
            }
        }
        let (free, capacity) = match &class {
            None => (node.free_bytes, node.capacity_bytes),
            Some(class) => {
                let detail: api::NodeDetail = api
                    .get(&format!("/nodes/{}", node.name))
                    .await
                    .map_err(|error| from_api("reading a node's pools", error))?;
                detail
                    .pool_list
                    .iter()
                    .filter(|pool| pool.online && &pool.class == class)
                    .fold((0, 0), |(free, capacity), pool| {
                        (free + pool.free_bytes, capacity.max(pool.capacity_bytes))
                    })
            }
        };
        free_bytes += free;
        largest_bytes = largest_bytes.max(capacity);
    }
    Ok(GetCapacityResponse {
        available_capacity: free_bytes as i64,
        maximum_volume_size: Some(largest_bytes as i64),
        minimum_volume_size: Some(super::BLOCK_BYTES as i64),
    })
}

pub async fn expand(
    driver: &Driver,
    request: ControllerExpandVolumeRequest,
) -> Result<ControllerExpandVolumeResponse, Status> {
    let id = &request.volume_id;
    if id.is_empty() {
        return Err(missing("volume_id"));
    }
    let range = request
        .capacity_range
        .as_ref()
        .ok_or_else(|| missing("capacity_range"))?;
    let size_bytes = size_for(Some(range))?;
    let api = driver.api_for(&request.secrets);
    let current = volume(&api, id).await?;
    // A block volume is grown once the device is; a file system also
    // needs NodeExpandVolume.
    let node_expansion_required = !request
        .volume_capability
        .as_ref()
        .is_some_and(capability::is_block);
    if current.size_bytes >= size_bytes {
        return Ok(ControllerExpandVolumeResponse {
            capacity_bytes: current.size_bytes as i64,
            node_expansion_required,
        });
    }
    let grown: api::Volume = api
        .post(&format!("/volumes/{id}/grow"), &api::Grow { size_bytes })
        .await
        .map_err(|error| {
            from_api(
                &format!("growing volume '{id}' to {size_bytes} bytes"),
                error,
            )
        })?;
    Ok(ControllerExpandVolumeResponse {
        capacity_bytes: grown.size_bytes as i64,
        node_expansion_required,
    })
}

pub async fn get(
    driver: &Driver,
    request: ControllerGetVolumeRequest,
) -> Result<ControllerGetVolumeResponse, Status> {
    if request.volume_id.is_empty() {
        return Err(missing("volume_id"));
    }
    let volume = volume(&driver.api, &request.volume_id).await?;
    let nodes: Vec<api::Node> = driver.api.get("/nodes").await.unwrap_or_default();
    Ok(ControllerGetVolumeResponse {
        volume: Some(csi_volume(&volume, &nodes, None)),
        status: Some(controller_get_volume_response::VolumeStatus {
            published_node_ids: volume.primaries.clone(),
            volume_condition: Some(condition(&volume)),
        }),
    })
}
