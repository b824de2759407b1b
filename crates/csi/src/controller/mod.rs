//! The Controller service: volumes, attachments and snapshots, each RPC
//! one or a few calls of the cluster's REST API.
//!
//! - `capability`: the access types and modes served.
//! - `create`: CreateVolume (with its content sources) and DeleteVolume.
//! - `publish`: ControllerPublish/Unpublish (attach, takeover, refusal).
//! - `snapshots`: Create/Delete/ListSnapshots.
//! - `topology`: node segments and placement from topology requirements.
//! - `volumes`: listing, capacity, expansion, ControllerGetVolume.

pub mod capability;
mod create;
mod publish;
mod snapshots;
pub mod topology;
mod volumes;

use tonic::{Request, Response, Status};

use crate::csi::controller_server::Controller;
use crate::csi::controller_service_capability::{self, rpc};
use crate::csi::*;
use crate::Driver;

/// Volume sizes are whole 4 KiB blocks.
pub const BLOCK_BYTES: u64 = 4096;
/// The size of a volume whose request names none.
pub const DEFAULT_SIZE_BYTES: u64 = 1 << 30;
/// trireme's largest volume (`VOLUME_MAX_BYTES` in trireme-types).
pub const VOLUME_MAX_BYTES: u64 = 1 << 50;

/// Pagination tokens: `after:` and the last entry of the page before.
pub const TOKEN_PREFIX: &str = "after:";

const CAPABILITIES: [rpc::Type; 11] = [
    rpc::Type::CreateDeleteVolume,
    rpc::Type::PublishUnpublishVolume,
    rpc::Type::ListVolumes,
    rpc::Type::GetCapacity,
    rpc::Type::CreateDeleteSnapshot,
    rpc::Type::ListSnapshots,
    rpc::Type::CloneVolume,
    rpc::Type::ExpandVolume,
    rpc::Type::ListVolumesPublishedNodes,
    rpc::Type::GetVolume,
    rpc::Type::VolumeCondition,
];

#[tonic::async_trait]
impl Controller for Driver {
    async fn create_volume(
        &self,
        request: Request<CreateVolumeRequest>,
    ) -> Result<Response<CreateVolumeResponse>, Status> {
        create::create_volume(self, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn delete_volume(
        &self,
        request: Request<DeleteVolumeRequest>,
    ) -> Result<Response<DeleteVolumeResponse>, Status> {
        create::delete_volume(self, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn controller_publish_volume(
        &self,
        request: Request<ControllerPublishVolumeRequest>,
    ) -> Result<Response<ControllerPublishVolumeResponse>, Status> {
        publish::publish(self, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<ControllerUnpublishVolumeResponse>, Status> {
        publish::unpublish(self, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<ValidateVolumeCapabilitiesResponse>, Status> {
        volumes::validate(self, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn list_volumes(
        &self,
        request: Request<ListVolumesRequest>,
    ) -> Result<Response<ListVolumesResponse>, Status> {
        volumes::list(self, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn get_capacity(
        &self,
        request: Request<GetCapacityRequest>,
    ) -> Result<Response<GetCapacityResponse>, Status> {
        volumes::capacity(self, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn controller_get_capabilities(
        &self,
        _request: Request<ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<ControllerGetCapabilitiesResponse>, Status> {
        let capabilities = CAPABILITIES
            .iter()
            .map(|kind| ControllerServiceCapability {
                r#type: Some(controller_service_capability::Type::Rpc(
                    controller_service_capability::Rpc {
                        r#type: *kind as i32,
                    },
                )),
            })
            .collect();
        Ok(Response::new(ControllerGetCapabilitiesResponse {
            capabilities,
        }))
    }

    async fn create_snapshot(
        &self,
        request: Request<CreateSnapshotRequest>,
    ) -> Result<Response<CreateSnapshotResponse>, Status> {
        snapshots::create(self, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn delete_snapshot(
        &self,
        request: Request<DeleteSnapshotRequest>,
    ) -> Result<Response<DeleteSnapshotResponse>, Status> {
        snapshots::delete(self, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn list_snapshots(
        &self,
        request: Request<ListSnapshotsRequest>,
    ) -> Result<Response<ListSnapshotsResponse>, Status> {
        snapshots::list(self, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn get_snapshot(
        &self,
        _request: Request<GetSnapshotRequest>,
    ) -> Result<Response<GetSnapshotResponse>, Status> {
        Err(Status::unimplemented(
            "GetSnapshot (alpha) is not offered: use ListSnapshots with the snapshot id",
        ))
    }

    async fn controller_expand_volume(
        &self,
        request: Request<ControllerExpandVolumeRequest>,
    ) -> Result<Response<ControllerExpandVolumeResponse>, Status> {
        volumes::expand(self, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn controller_get_volume(
        &self,
        request: Request<ControllerGetVolumeRequest>,
    ) -> Result<Response<ControllerGetVolumeResponse>, Status> {
        volumes::get(self, request.into_inner())
            .await
            .map(Response::new)
    }

    async fn controller_modify_volume(
        &self,
        _request: Request<ControllerModifyVolumeRequest>,
    ) -> Result<Response<ControllerModifyVolumeResponse>, Status> {
        Err(Status::unimplemented(
            "ControllerModifyVolume is not offered: trireme has no mutable volume attributes",
        ))
    }
}

/// The size a capacity range asks for: the required bytes rounded up to
/// whole blocks, or the default bounded by the limit.
pub fn size_for(range: Option<&CapacityRange>) -> Result<u64, Status> {
    let (required, limit) = range
        .map(|range| (range.required_bytes, range.limit_bytes))
        .unwrap_or((0, 0));
    if required < 0 || limit < 0 {
        return Err(Status::invalid_argument(
            "capacity_range: required_bytes and limit_bytes cannot be negative",
        ));
    }
    let (required, limit) = (required as u64, limit as u64);
    let size = if required > 0 {
        required.div_ceil(BLOCK_BYTES) * BLOCK_BYTES
    } else if limit > 0 {
        DEFAULT_SIZE_BYTES.min(limit / BLOCK_BYTES * BLOCK_BYTES)
    } else {
        DEFAULT_SIZE_BYTES
    };
    if size == 0 || (limit > 0 && size > limit) {
        return Err(Status::out_of_range(format!(
            "capacity_range required {required} and limit {limit} bytes leave no whole 4 KiB \
             block count: trireme volumes are a multiple of 4096 bytes"
        )));
    }
    if size > VOLUME_MAX_BYTES {
        return Err(Status::out_of_range(format!(
            "{size} bytes is more than trireme's largest volume, {VOLUME_MAX_BYTES} bytes (1 PiB)"
        )));
    }
    Ok(size)
}

/// Whether an existing volume of `size_bytes` satisfies `range`.
pub fn fits(size_bytes: u64, range: Option<&CapacityRange>) -> bool {
    let Some(range) = range else { return true };
    size_bytes >= range.required_bytes.max(0) as u64
        && (range.limit_bytes <= 0 || size_bytes <= range.limit_bytes as u64)
}

/// The `after:` token's entry; a token this driver did not make is
/// ABORTED, as the spec asks.
pub fn parse_token(token: &str) -> Result<Option<&str>, Status> {
    if token.is_empty() {
        return Ok(None);
    }
    token.strip_prefix(TOKEN_PREFIX).map(Some).ok_or_else(|| {
        Status::aborted(format!(
            "starting_token '{token}' was not given by this driver: start the listing again \
             without one"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(required: i64, limit: i64) -> Option<CapacityRange> {
        Some(CapacityRange {
            required_bytes: required,
            limit_bytes: limit,
        })
    }

    #[test]
    fn sizes_round_up_to_blocks_within_the_limit() {
        assert_eq!(size_for(None).unwrap(), DEFAULT_SIZE_BYTES);
        assert_eq!(size_for(range(1, 0).as_ref()).unwrap(), 4096);
        assert_eq!(size_for(range(0, 8192).as_ref()).unwrap(), 8192);
        assert_eq!(size_for(range(4097, 0).as_ref()).unwrap(), 8192);
        let error = size_for(range(4097, 5000).as_ref()).unwrap_err();
        assert_eq!(error.code(), tonic::Code::OutOfRange);
        let error = size_for(range(i64::MAX, 0).as_ref()).unwrap_err();
        assert_eq!(error.code(), tonic::Code::OutOfRange);
        assert!(fits(8192, range(4097, 0).as_ref()));
        assert!(!fits(8192, range(10000, 0).as_ref()));
        assert!(!fits(8192, range(0, 4096).as_ref()));
    }

    #[test]
    fn foreign_tokens_are_aborted() {
        assert_eq!(parse_token("").unwrap(), None);
        assert_eq!(parse_token("after:x").unwrap(), Some("x"));
        assert_eq!(
            parse_token("invalid-token").unwrap_err().code(),
            tonic::Code::Aborted
        );
    }
}
