//! ControllerPublish/Unpublish: attach and detach a volume on a node.
//!
//! Attaching makes the node the volume's primary; its NBD socket then
//! serves the volume. A single-writer volume attached on another node is
//! refused while that node lives (FAILED_PRECONDITION), and taken over at
//! once when it does not: the driver asks the other node's API itself,
//! and when nothing answers there it attaches with `force_takeover`, which
//! fences the dead primary (a new generation: the replicas refuse its
//! writes). So a pod moves after a node death without waiting for the
//! cluster to count the node offline, and never with two writers.

use tonic::Status;

use super::capability;
use crate::api::{self, Api};
use crate::csi::*;
use crate::names;
use crate::status::{from_api, missing};
use crate::Driver;

pub async fn publish(
    driver: &Driver,
    request: ControllerPublishVolumeRequest,
) -> Result<ControllerPublishVolumeResponse, Status> {
    let ControllerPublishVolumeRequest {
        volume_id,
        node_id,
        volume_capability,
        secrets,
        ..
    } = request;
    if volume_id.is_empty() {
        return Err(missing("volume_id"));
    }
    if node_id.is_empty() {
        return Err(missing("node_id"));
    }
    let capability = capability::check_one(volume_capability.as_ref())?;
    let api = driver.api_for(&secrets);
    let volume = volume(&api, &volume_id).await?;
    node(&api, &node_id).await?;
    let answer = ControllerPublishVolumeResponse {
        publish_context: [("trireme.io/export".to_string(), volume.name.clone())].into(),
    };
    if volume.primaries.contains(&node_id) {
        return Ok(answer);
    }
    let path = format!("/volumes/{volume_id}/attach");
    let mut attach = api::Attach {
        node: &node_id,
        allow_two_primaries: capability::multi_node(capability),
        force_takeover: false,
    };
    let refused = match api.post::<api::AttachAnswer>(&path, &attach).await {
        Ok(attached) => {
            log_fenced(&volume_id, &node_id, &attached);
            return Ok(answer);
        }
        Err(error) if error.code() == Some("already_attached") => error,
        Err(error) => {
            return Err(from_api(
                &format!("attaching '{volume_id}' on '{node_id}'"),
                error,
            ))
        }
    };
    let alive = live_primaries(&api, &volume.primaries).await?;
    if !alive.is_empty() {
        return Err(Status::failed_precondition(format!(
            "volume '{volume_id}' is published on node {}, which is alive: a ReadWriteOnce \
             volume is attached on one node at a time; unpublish it there first ({refused})",
            alive.join(", ")
        )));
    }
    attach.force_takeover = true;
    let attached = api
        .post::<api::AttachAnswer>(&path, &attach)
        .await
        .map_err(|error| from_api(&format!("taking '{volume_id}' over on '{node_id}'"), error))?;
    log_fenced(&volume_id, &node_id, &attached);
    Ok(answer)
}

fn log_fenced(volume: &str, node: &str, attached: &api::AttachAnswer) {
    for fenced in &attached.fenced {
        tracing::warn!(
            volume,
            node,
            former = %fenced.node,
            former_state = %fenced.state,
            "took the volume over: the former primary is fenced"
        );
    }
}

/// The primaries whose node's API still answers.
async fn live_primaries(api: &Api, primaries: &[String]) -> Result<Vec<String>, Status> {
    let nodes: Vec<api::Node> = api
        .get("/nodes")
        .await
        .map_err(|error| from_api("reading the nodes", error))?;
    let mut alive = Vec::new();
    for primary in primaries {
        let answers = match nodes.iter().find(|node| &node.name == primary) {
            Some(node) if node.state == "online" => api.node_answers(&node.api_address).await,
            _ => false,
        };
        if answers {
            alive.push(primary.clone());
        }
    }
    Ok(alive)
}

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

async fn node(api: &Api, name: &str) -> Result<(), Status> {
    let not_found = || {
        Status::not_found(format!(
            "node '{name}' is not a trireme node: see `trireme node list` (the CSI node id is the \
             trireme node name, --node-name of the node plugin)"
        ))
    };
    if !names::is_trireme_name(name) {
        return Err(not_found());
    }
    match api
        .get::<serde_json::Value>(&format!("/nodes/{name}"))
        .await
    {
        Ok(_) => Ok(()),
        Err(error) if error.is_not_found() => Err(not_found()),
        Err(error) => Err(from_api(&format!("looking up node '{name}'"), error)),
    }
}

pub async fn unpublish(
    driver: &Driver,
    request: ControllerUnpublishVolumeRequest,
) -> Result<ControllerUnpublishVolumeResponse, Status> {
    let id = request.volume_id;
    if id.is_empty() {
        return Err(missing("volume_id"));
    }
    let done = ControllerUnpublishVolumeResponse {};
    if !names::is_trireme_name(&id) {
        return Ok(done);
    }
    let api = driver.api_for(&request.secrets);
    let volume: api::Volume = match api.get(&format!("/volumes/{id}")).await {
        Ok(volume) => volume,
        Err(error) if error.is_not_found() => return Ok(done),
        Err(error) => return Err(from_api(&format!("looking up volume '{id}'"), error)),
    };
    // No node id: unpublish from every node.
    let targets: Vec<String> = if request.node_id.is_empty() {
        volume.primaries.clone()
    } else {
        volume
            .primaries
            .iter()
            .filter(|primary| **primary == request.node_id)
            .cloned()
            .collect()
    };
    for node in targets {
        match api
            .post::<serde_json::Value>(
                &format!("/volumes/{id}/detach"),
                &api::Detach { node: &node },
            )
            .await
        {
            Ok(_) => {}
            Err(error) if error.is_not_found() || error.code() == Some("not_attached") => {}
            Err(error) => return Err(from_api(&format!("detaching '{id}' from '{node}'"), error)),
        }
    }
    Ok(done)
}
