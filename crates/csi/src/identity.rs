//! The Identity service: the driver's name and what it offers.

use tonic::{Request, Response, Status};

use crate::csi::identity_server::Identity;
use crate::csi::plugin_capability::{self, service, volume_expansion};
use crate::csi::{
    GetPluginCapabilitiesRequest, GetPluginCapabilitiesResponse, GetPluginInfoRequest,
    GetPluginInfoResponse, PluginCapability, ProbeRequest, ProbeResponse,
};
use crate::{Driver, Expansion};

pub const DRIVER_NAME: &str = "csi.trireme.io";

#[tonic::async_trait]
impl Identity for Driver {
    async fn get_plugin_info(
        &self,
        _request: Request<GetPluginInfoRequest>,
    ) -> Result<Response<GetPluginInfoResponse>, Status> {
        Ok(Response::new(GetPluginInfoResponse {
            name: DRIVER_NAME.to_string(),
            vendor_version: env!("CARGO_PKG_VERSION").to_string(),
            manifest: Default::default(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _request: Request<GetPluginCapabilitiesRequest>,
    ) -> Result<Response<GetPluginCapabilitiesResponse>, Status> {
        let service = |kind: service::Type| PluginCapability {
            r#type: Some(plugin_capability::Type::Service(
                plugin_capability::Service {
                    r#type: kind as i32,
                },
            )),
        };
        let mut capabilities = vec![service(service::Type::VolumeAccessibilityConstraints)];
        if self.mode.controller() {
            capabilities.push(service(service::Type::ControllerService));
        }
        // Online where the nodes have the kernel `nbd` module: the
        // replication engine grows a published volume while it runs, and
        // the node daemon grows its kernel device in place once it serves
        // the new size, so NodeExpandVolume grows the mounted file system.
        // nbdfuse's device (no `nbd` module) keeps the size it connected
        // with until the volume is staged again: there ONLINE would have
        // csi-resizer grow volumes in use and kubelet retry a
        // NodeExpandVolume that cannot succeed until the pod restarts.
        // One answer per plugin (`--expansion`, decided by this host's
        // module when `auto`).
        let expansion = match self.expansion {
            Expansion::Online => volume_expansion::Type::Online,
            Expansion::Offline | Expansion::Auto => volume_expansion::Type::Offline,
        };
        capabilities.push(PluginCapability {
            r#type: Some(plugin_capability::Type::VolumeExpansion(
                plugin_capability::VolumeExpansion {
                    r#type: expansion as i32,
                },
            )),
        });
        Ok(Response::new(GetPluginCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn probe(
        &self,
        _request: Request<ProbeRequest>,
    ) -> Result<Response<ProbeResponse>, Status> {
        // Ready when the cluster answers: without it no RPC can succeed.
        let ready = self.api.get::<serde_json::Value>("/health").await.is_ok();
        Ok(Response::new(ProbeResponse { ready: Some(ready) }))
    }
}
