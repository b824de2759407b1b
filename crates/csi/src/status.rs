//! The CSI status code of each failure of the cluster's API.

use tonic::{Code, Status};

use crate::api::ApiError;

/// `error` as the gRPC status the CSI spec asks for; `doing` says what the
/// driver was doing ("creating volume 'x'").
pub fn from_api(doing: &str, error: ApiError) -> Status {
    if let ApiError::Refused {
        status: 401 | 403,
        message,
        ..
    } = &error
    {
        return Status::unauthenticated(format!("{doing}: {}", unauthenticated(message)));
    }
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

/// The node's words name the CLI's --token; a driver's token comes from
/// elsewhere, so say where.
fn unauthenticated(message: &str) -> String {
    const WHERE: &str = "the driver takes it from a request's secrets (key `token`, the Secret a \
         StorageClass names in csi.storage.k8s.io/*-secret-name) or else from --token-file \
         (TRIREME_TOKEN_FILE, the Secret the deployment mounts); its content is admin.token in \
         the data directory of any trireme node (/var/lib/trireme/admin.token)";
    if message.contains("needs a token") {
        format!("the trireme API wants the admin token and this driver sent none: {WHERE}")
    } else {
        format!(
            "the trireme API refused the admin token this driver sent (wrong or stale): {WHERE}"
        )
    }
}

pub fn missing(field: &str) -> Status {
    Status::invalid_argument(format!(
        "the request has no {field}; the CSI spec requires it"
    ))
}
