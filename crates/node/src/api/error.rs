//! [`ApiError`]: how a failure becomes an HTTP answer.
//!
//! Status codes: 400 the request is wrong, 404 the named thing is missing,
//! 409 it conflicts with what exists (attached elsewhere, last up-to-date
//! replica, quorum), 503 the node is stopping, 507 no pool
//! can take it, 500 the node itself failed.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use trireme_store::StoreError;

use super::model::ErrorBody;
use crate::error::is_out_of_space;
use crate::NodeError;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
        }
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, code, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::error!(code = self.code, message = %self.message, "request failed");
        }
        let body = ErrorBody {
            error: self.message,
            code: self.code.to_string(),
        };
        (self.status, Json(body)).into_response()
    }
}

impl From<NodeError> for ApiError {
    fn from(error: NodeError) -> Self {
        let message = error.to_string();
        let (status, code) = match &error {
            NodeError::InvalidName(_) => (StatusCode::BAD_REQUEST, "invalid_name"),
            NodeError::InvalidSize(_) => (StatusCode::BAD_REQUEST, "invalid_size"),
            NodeError::InvalidRequest(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
            NodeError::InvalidPath(_) => (StatusCode::BAD_REQUEST, "invalid_path"),
            NodeError::PoolNotFound(_) => (StatusCode::NOT_FOUND, "pool_not_found"),
            NodeError::PoolExists(_) => (StatusCode::CONFLICT, "pool_exists"),
            NodeError::PoolPathInUse { .. } => (StatusCode::CONFLICT, "pool_path_in_use"),
            NodeError::PoolOffline { .. } => (StatusCode::CONFLICT, "pool_offline"),
            NodeError::VolumeNotFound(_) => (StatusCode::NOT_FOUND, "volume_not_found"),
            NodeError::VolumeExists { .. } => (StatusCode::CONFLICT, "volume_exists"),
            NodeError::NoPoolAvailable => (StatusCode::INSUFFICIENT_STORAGE, "no_pool_available"),
            NodeError::Store(store_error) => store_status(store_error),
            NodeError::Io { source, .. } if is_out_of_space(source) => {
                (StatusCode::INSUFFICIENT_STORAGE, "insufficient_storage")
            }
            NodeError::Io { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "io_error"),
            NodeError::Nbd(_) => (StatusCode::INTERNAL_SERVER_ERROR, "nbd_error"),
            // Only at start-up, before the API serves; here for completeness.
            NodeError::DataDirInUse(_) => (StatusCode::CONFLICT, "data_dir_in_use"),
            NodeError::ShuttingDown => (StatusCode::SERVICE_UNAVAILABLE, "shutting_down"),
            NodeError::Removed { .. } => (StatusCode::GONE, "node_removed"),
            NodeError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        ApiError::new(status, code, message)
    }
}

impl From<crate::cluster::ClusterError> for ApiError {
    fn from(error: crate::cluster::ClusterError) -> Self {
        use crate::cluster::ClusterError;
        use trireme_control::CommandError;
        let message = error.to_string();
        let (status, code) = match &error {
            ClusterError::Refused(refusal) => match refusal {
                CommandError::UnknownVolume { .. } => (StatusCode::NOT_FOUND, "volume_not_found"),
                CommandError::UnknownGroup { .. } => (StatusCode::NOT_FOUND, "group_not_found"),
                CommandError::UnknownNode { .. } => (StatusCode::NOT_FOUND, "node_not_found"),
                CommandError::VolumeExists { .. } => (StatusCode::CONFLICT, "volume_exists"),
                CommandError::GroupExists { .. } => (StatusCode::CONFLICT, "group_exists"),
                CommandError::GroupInUse { .. } => (StatusCode::CONFLICT, "group_in_use"),
                CommandError::DefaultGroup => (StatusCode::CONFLICT, "default_group"),
                CommandError::VolumeDeleting { .. } => (StatusCode::CONFLICT, "volume_deleting"),
                CommandError::LastReplica { .. } => (StatusCode::CONFLICT, "last_replica"),
                CommandError::NodeNameTaken { .. } => (StatusCode::CONFLICT, "node_name_taken"),
                CommandError::JoinReplayed => (StatusCode::FORBIDDEN, "join_refused"),
                CommandError::ShrinkRefused { .. } => (StatusCode::BAD_REQUEST, "shrink_refused"),
                CommandError::Placement { .. } => (StatusCode::CONFLICT, "placement_failed"),
                CommandError::NodeNotOnline { .. } => (StatusCode::CONFLICT, "node_not_online"),
                CommandError::AlreadyAttached { .. } | CommandError::TwoPrimaries { .. } => {
                    (StatusCode::CONFLICT, "already_attached")
                }
                CommandError::NoUpToDateReplica { .. } => {
                    (StatusCode::CONFLICT, "no_up_to_date_replica")
                }
                CommandError::NotAttached { .. } => (StatusCode::CONFLICT, "not_attached"),
                CommandError::NotPrimary { .. } => (StatusCode::CONFLICT, "not_primary"),
                CommandError::WhichPrimary { .. } => (StatusCode::BAD_REQUEST, "which_primary"),
                CommandError::StaleGeneration { .. } => (StatusCode::CONFLICT, "stale_generation"),
                CommandError::LastInSync { .. } => (StatusCode::CONFLICT, "last_in_sync"),
                CommandError::NoDiskfulReplica { .. } => {
                    (StatusCode::NOT_FOUND, "replica_not_found")
                }
                CommandError::ReplicaExists { .. } => (StatusCode::CONFLICT, "replica_exists"),
                CommandError::WouldLoseQuorum { .. } => (StatusCode::CONFLICT, "would_lose_quorum"),
                CommandError::VolumeAttached { .. } => (StatusCode::CONFLICT, "volume_attached"),
                CommandError::SnapshotExists { .. } => (StatusCode::CONFLICT, "snapshot_exists"),
                CommandError::UnknownSnapshot { .. } => {
                    (StatusCode::NOT_FOUND, "snapshot_not_found")
                }
                CommandError::RollbackPending { .. } => (StatusCode::CONFLICT, "rollback_pending"),
                CommandError::NotFenced { .. } => (StatusCode::SERVICE_UNAVAILABLE, "not_fenced"),
                CommandError::LastSnapshotCopy { .. } => {
                    (StatusCode::CONFLICT, "last_snapshot_copy")
                }
                CommandError::InvalidSize { .. } => (StatusCode::BAD_REQUEST, "invalid_size"),
                CommandError::HasSnapshots { .. } => (StatusCode::CONFLICT, "has_snapshots"),
                CommandError::ClonesBeingMade { .. } => (StatusCode::CONFLICT, "clones_being_made"),
                CommandError::Invalid(_) => (StatusCode::BAD_REQUEST, "invalid_request"),
                CommandError::NotBootstrapped | CommandError::AlreadyBootstrapped { .. } => {
                    (StatusCode::SERVICE_UNAVAILABLE, "cluster_not_ready")
                }
            },
            ClusterError::NoLeader { .. } => (StatusCode::SERVICE_UNAVAILABLE, "no_leader"),
            ClusterError::Join(_) => (StatusCode::FORBIDDEN, "join_refused"),
            ClusterError::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "internal"),
        };
        ApiError::new(status, code, message)
    }
}

fn store_status(error: &StoreError) -> (StatusCode, &'static str) {
    match error {
        StoreError::Io { source, .. } if is_out_of_space(source) => {
            (StatusCode::INSUFFICIENT_STORAGE, "insufficient_storage")
        }
        StoreError::Io { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "io_error"),
        StoreError::Metadata { .. } => (StatusCode::INTERNAL_SERVER_ERROR, "metadata_error"),
        StoreError::AlreadyAPool { .. } => (StatusCode::CONFLICT, "pool_path_in_use"),
        StoreError::HoldsData { .. } => (StatusCode::CONFLICT, "path_holds_data"),
        StoreError::InUse { .. } => (StatusCode::CONFLICT, "path_in_use"),
        StoreError::NotAPool { .. } => (StatusCode::BAD_REQUEST, "not_a_pool"),
        StoreError::UnsupportedVersion { .. } => {
            (StatusCode::INTERNAL_SERVER_ERROR, "unsupported_version")
        }
        StoreError::MetadataMismatch { .. } => {
            (StatusCode::INTERNAL_SERVER_ERROR, "metadata_mismatch")
        }
        StoreError::PoolTooSmall { .. } => (StatusCode::BAD_REQUEST, "pool_too_small"),
        StoreError::SizeNeeded { .. } => (StatusCode::BAD_REQUEST, "size_needed"),
        StoreError::PoolNotEmpty { .. } => (StatusCode::CONFLICT, "pool_not_empty"),
        StoreError::VolumeExists(_) => (StatusCode::CONFLICT, "volume_exists"),
        StoreError::VolumeNotFound(_) => (StatusCode::NOT_FOUND, "volume_not_found"),
        StoreError::SizeZero | StoreError::SizeUnaligned(_) | StoreError::SizeTooLarge { .. } => {
            (StatusCode::BAD_REQUEST, "invalid_size")
        }
        StoreError::ShrinkRefused { .. } => (StatusCode::BAD_REQUEST, "shrink_refused"),
        StoreError::SnapshotExists { .. } => (StatusCode::CONFLICT, "snapshot_exists"),
        StoreError::SnapshotNotFound { .. } => (StatusCode::NOT_FOUND, "snapshot_not_found"),
        StoreError::ShutDown => (StatusCode::SERVICE_UNAVAILABLE, "shutting_down"),
        StoreError::Fatal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "pool_failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trireme_types::{PoolName, VolumeName};

    fn status_and_code(error: NodeError) -> (StatusCode, &'static str) {
        let api_error = ApiError::from(error);
        (api_error.status, api_error.code)
    }

    #[test]
    fn store_errors_map_to_status_codes() {
        let volume = VolumeName::new("v").unwrap();
        let pool = PoolName::new("p").unwrap();
        let cases = [
            (
                StoreError::VolumeNotFound(volume.clone()).into(),
                StatusCode::NOT_FOUND,
            ),
            (
                StoreError::VolumeExists(volume).into(),
                StatusCode::CONFLICT,
            ),
            (StoreError::SizeZero.into(), StatusCode::BAD_REQUEST),
            (
                StoreError::SizeUnaligned(4097).into(),
                StatusCode::BAD_REQUEST,
            ),
            (
                StoreError::PoolNotEmpty { pool, count: 2 }.into(),
                StatusCode::CONFLICT,
            ),
            (
                StoreError::Io {
                    context: "preallocate".into(),
                    source: std::io::Error::from_raw_os_error(libc::ENOSPC),
                }
                .into(),
                StatusCode::INSUFFICIENT_STORAGE,
            ),
            (
                StoreError::Fatal("bad".into()).into(),
                StatusCode::INTERNAL_SERVER_ERROR,
            ),
            (NodeError::NoPoolAvailable, StatusCode::INSUFFICIENT_STORAGE),
            (NodeError::ShuttingDown, StatusCode::SERVICE_UNAVAILABLE),
        ];
        for (error, expected) in cases {
            let text = error.to_string();
            assert_eq!(status_and_code(error).0, expected, "{text}");
        }
    }
}
