//! A staged volume's block device, which the node daemon on this host
//! makes and owns (`PUT /api/v1/volumes/{name}/device`; trireme-node's
//! `local_device`): nbdfuse and the loop device run on the host, in the
//! daemon's service, never in this process or its container. A restart
//! of the node plugin's pod, which ends every process of the container,
//! leaves every staged volume's I/O running. This module only asks.
//!
//! The daemon asked is this node's own, at the API address the cluster
//! lists for `--node-name` (looked up each time: a restarted daemon may
//! listen elsewhere); a device is made on the host of the daemon that
//! answers, and the request names the node it means, so one that reaches
//! another node is refused.

use serde::{Deserialize, Serialize};
use tonic::Status;

use crate::api::{self, Api};
use crate::status::from_api;
use crate::{Driver, NodeConfig};

#[derive(Debug, Serialize)]
struct DeviceRequest<'a> {
    node: &'a str,
}

/// The daemon's answer; only the fields the driver reads.
#[derive(Debug, Clone, Deserialize)]
pub struct Device {
    /// `/dev/nbdN` or `/dev/loopN`.
    pub device: String,
    pub size_bytes: u64,
    /// How the daemon made it: [`KERNEL_NBD`] or `nbdfuse-loop`.
    #[serde(default)]
    pub kind: String,
}

/// The kind of device that grows in place when its volume grows.
pub const KERNEL_NBD: &str = "kernel-nbd";

/// The API of this node's own daemon.
async fn local_api(driver: &Driver, config: &NodeConfig) -> Result<Api, Status> {
    let name = &config.node_name;
    let node: api::Node = driver
        .api
        .get(&format!("/nodes/{name}"))
        .await
        .map_err(|error| {
            from_api(
                &format!("looking up trireme node '{name}' (--node-name / NODE_NAME)"),
                error,
            )
        })?;
    Ok(driver.api.at(&node.api_address))
}

/// Makes (or finds) the block device of `volume` on this node.
pub async fn attach(driver: &Driver, config: &NodeConfig, volume: &str) -> Result<String, Status> {
    Ok(attach_device(driver, config, volume).await?.device)
}

/// Makes (or finds) the block device of `volume` on this node; a kernel
/// device found is grown to the size the daemon serves, if that is more.
pub async fn attach_device(
    driver: &Driver,
    config: &NodeConfig,
    volume: &str,
) -> Result<Device, Status> {
    let api = local_api(driver, config).await?;
    let device: Device = api
        .put(
            &format!("/volumes/{volume}/device"),
            &DeviceRequest {
                node: &config.node_name,
            },
        )
        .await
        .map_err(|error| {
            from_api(
                &format!(
                    "asking the trireme node '{}' for a block device of volume '{volume}'",
                    config.node_name
                ),
                error,
            )
        })?;
    Ok(device)
}

/// The block device of `volume` on this node, if there is one.
pub async fn find(
    driver: &Driver,
    config: &NodeConfig,
    volume: &str,
) -> Result<Option<String>, Status> {
    Ok(find_device(driver, config, volume)
        .await?
        .map(|device| device.device))
}

/// The daemon's word on the block device of `volume` on this node.
pub async fn find_device(
    driver: &Driver,
    config: &NodeConfig,
    volume: &str,
) -> Result<Option<Device>, Status> {
    let api = local_api(driver, config).await?;
    match api
        .get::<Device>(&format!("/volumes/{volume}/device"))
        .await
    {
        Ok(device) => Ok(Some(device)),
        Err(error) if error.is_not_found() => Ok(None),
        Err(error) => Err(from_api(
            &format!("looking up the block device of volume '{volume}'"),
            error,
        )),
    }
}

/// Gives the block device of `volume` back; nothing to do when there is
/// none, or the volume is gone.
pub async fn detach(driver: &Driver, config: &NodeConfig, volume: &str) -> Result<(), Status> {
    let api = local_api(driver, config).await?;
    match api.delete(&format!("/volumes/{volume}/device")).await {
        Ok(()) => Ok(()),
        Err(error) if error.is_not_found() => Ok(()),
        Err(error) => Err(from_api(
            &format!("releasing the block device of volume '{volume}'"),
            error,
        )),
    }
}
