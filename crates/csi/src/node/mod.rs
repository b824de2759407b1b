//! The Node service: a volume attached on this node becomes a block
//! device (`device`: the node daemon on this host makes it), gets a file
//! system when it is a filesystem volume (`stage`), and is bind-mounted
//! where the pod wants it.
//!
//! Each RPC checks what is already in place (a mount at the path, the
//! daemon's device for the volume) before it acts, so repeats and a restarted
//! driver find their work done rather than doing it twice.

mod device;
mod stage;
pub mod system;

use std::path::Path;
use tonic::{Request, Response, Status};

use crate::api;
use crate::controller::topology;
use crate::csi::node_server::Node;
use crate::csi::node_service_capability::{self, rpc};
use crate::csi::*;
use crate::names;
use crate::status::{from_api, missing};
use crate::{Driver, NodeConfig};

const CAPABILITIES: [rpc::Type; 4] = [
    rpc::Type::StageUnstageVolume,
    rpc::Type::GetVolumeStats,
    rpc::Type::ExpandVolume,
    rpc::Type::VolumeCondition,
];

impl Driver {
    fn node_config(&self) -> Result<&NodeConfig, Status> {
        self.node.as_ref().ok_or_else(|| {
            Status::unimplemented("this driver runs in controller mode: the Node service is off")
        })
    }

    /// The volume, or NOT_FOUND.
    async fn existing_volume(&self, id: &str) -> Result<api::Volume, Status> {
        let not_found = || Status::not_found(format!("volume '{id}' does not exist"));
        if !names::is_trireme_name(id) {
            return Err(not_found());
        }
        match self.api.get(&format!("/volumes/{id}")).await {
            Ok(volume) => Ok(volume),
            Err(error) if error.is_not_found() => Err(not_found()),
            Err(error) => Err(from_api(&format!("looking up volume '{id}'"), error)),
        }
    }
}

#[tonic::async_trait]
impl Node for Driver {
    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let config = self.node_config()?;
        stage::stage(self, config, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let config = self.node_config()?;
        stage::unstage(self, config, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let config = self.node_config()?;
        stage::publish(self, config, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        self.node_config()?;
        stage::unpublish(request.into_inner())
            .await
            .map(Response::new)
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        self.node_config()?;
        let request = request.into_inner();
        if request.volume_id.is_empty() {
            return Err(missing("volume_id"));
        }
        if request.volume_path.is_empty() {
            return Err(missing("volume_path"));
        }
        let volume = self.existing_volume(&request.volume_id).await?;
        let path = Path::new(&request.volume_path);
        let Ok(meta) = std::fs::metadata(path) else {
            return Err(Status::not_found(format!(
                "volume path {} does not exist on this node",
                request.volume_path
            )));
        };
        let condition = Some(match volume.abnormal() {
            Some(message) => VolumeCondition {
                abnormal: true,
                message,
            },
            None => VolumeCondition {
                abnormal: false,
                message: format!("volume '{}' is {}", volume.name, volume.state),
            },
        });
        use std::os::unix::fs::FileTypeExt;
        let usage = if meta.file_type().is_block_device() {
            vec![VolumeUsage {
                total: volume.size_bytes as i64,
                unit: volume_usage::Unit::Bytes as i32,
                ..Default::default()
            }]
        } else {
            if system::mount_at(path).is_none() {
                return Err(Status::not_found(format!(
                    "volume '{}' is not mounted at {}",
                    request.volume_id, request.volume_path
                )));
            }
            let stats =
                system::statvfs(path).map_err(|error| Status::internal(error.to_string()))?;
            let block = stats.f_frsize as i64;
            vec![
                VolumeUsage {
                    available: stats.f_bavail as i64 * block,
                    total: stats.f_blocks as i64 * block,
                    used: (stats.f_blocks as i64 - stats.f_bfree as i64) * block,
                    unit: volume_usage::Unit::Bytes as i32,
                },
                VolumeUsage {
                    available: stats.f_favail as i64,
                    total: stats.f_files as i64,
                    used: stats.f_files as i64 - stats.f_ffree as i64,
                    unit: volume_usage::Unit::Inodes as i32,
                },
            ]
        };
        Ok(Response::new(NodeGetVolumeStatsResponse {
            usage,
            volume_condition: condition,
        }))
    }

    async fn node_expand_volume(
        &self,
        request: Request<NodeExpandVolumeRequest>,
    ) -> Result<Response<NodeExpandVolumeResponse>, Status> {
        let config = self.node_config()?;
        let request = request.into_inner();
        if request.volume_id.is_empty() {
            return Err(missing("volume_id"));
        }
        if request.volume_path.is_empty() {
            return Err(missing("volume_path"));
        }
        let volume = self.existing_volume(&request.volume_id).await?;
        stage::expand(self, config, &request, volume.size_bytes)
            .await
            .map(Response::new)
    }

    async fn node_get_capabilities(
        &self,
        _request: Request<NodeGetCapabilitiesRequest>,
    ) -> Result<Response<NodeGetCapabilitiesResponse>, Status> {
        let capabilities = CAPABILITIES
            .iter()
            .map(|kind| NodeServiceCapability {
                r#type: Some(node_service_capability::Type::Rpc(
                    node_service_capability::Rpc {
                        r#type: *kind as i32,
                    },
                )),
            })
            .collect();
        Ok(Response::new(NodeGetCapabilitiesResponse { capabilities }))
    }

    async fn node_get_info(
        &self,
        _request: Request<NodeGetInfoRequest>,
    ) -> Result<Response<NodeGetInfoResponse>, Status> {
        let config = self.node_config()?;
        let name = &config.node_name;
        let node: api::Node = self
            .api
            .get(&format!("/nodes/{name}"))
            .await
            .map_err(|error| {
                from_api(
                    &format!("reading trireme node '{name}' (--node-name / NODE_NAME)"),
                    error,
                )
            })?;
        Ok(Response::new(NodeGetInfoResponse {
            node_id: name.clone(),
            max_volumes_per_node: 0,
            accessible_topology: Some(topology::of_node(&node)),
        }))
    }
}
