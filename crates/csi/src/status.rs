//! The CSI status code of each failure of the cluster's API.

use tonic::{Code, Status};

use crate::api::ApiError;

/// `error` as the gRPC status the CSI spec asks for; `doing` says what the
/// driver was doing ("creating volume 'x'").
pub fn from_api(doing: &str, error: ApiError) -> Status {
    let code = match &error {
        ApiError::Unreachable { .. } => Code::Unavailable,
        ApiError::Unexpected { .. } => Code::Internal,
        ApiError::Refused { status, code, .. } => match (*status, code.as_str()) {
            (400, _) => Code::InvalidArgument,
            (401 | 403, _) => Code::Unauthenticated,
            (404, _) => Code::NotFound,
            (409, "volume_exists" | "snapshot_exists") => Code::AlreadyExists,
            (409, _) => Code::FailedPrecondition,
            (503, _) => Code::Unavailable,
            (507, _) => Code::ResourceExhausted,
            _ => Code::Internal,
        },
    };
    Status::new(code, format!("{doing}: {error}"))
}

pub fn missing(field: &str) -> Status {
    Status::invalid_argument(format!(
        "the request has no {field}; the CSI spec requires it"
    ))
}
