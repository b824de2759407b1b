//! The JSON bodies of the REST API. The CLI deserialises the same types, so
//! the two cannot drift apart.

use serde::{Deserialize, Serialize};
use trireme_store::{ScanReport, VolumeInfo};
use utoipa::ToSchema;

use crate::node::PoolStatus;

/// Every error answer: a message for people and a stable code for programs.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// What was wrong and what to do about it.
    pub error: String,
    /// Stable machine-readable code, e.g. `volume_not_found`.
    pub code: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HealthResponse {
    /// `ok` when the API answers.
    pub status: String,
    pub pools_online: usize,
    pub pools_offline: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodeResponse {
    pub version: String,
    pub data_dir: String,
    /// The address the REST API listens on.
    pub api_address: String,
    /// The TCP address of the NBD server (`nbd://ADDRESS/VOLUME`).
    pub nbd_tcp_address: Option<String>,
    /// The unix socket of the NBD server.
    pub nbd_unix_socket: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreatePoolRequest {
    /// Letters, digits, '-', '_' and '.', at most 63 bytes.
    pub name: String,
    /// Absolute path of a block device or a file (created if missing).
    pub path: String,
    /// Size of the file to create; a block device's own size is used otherwise.
    #[serde(default)]
    pub size_bytes: Option<u64>,
    /// `nvme`, `ssd` (default) or `hdd`.
    #[serde(default)]
    pub class: Option<String>,
    /// Reserve the file's space up front instead of leaving it sparse.
    #[serde(default)]
    pub preallocate: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum PoolState {
    Online,
    Offline,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PoolResponse {
    pub name: String,
    pub id: u64,
    /// `nvme`, `ssd` or `hdd`.
    pub class: String,
    pub state: PoolState,
    /// Why the pool is offline.
    pub error: Option<String>,
    pub device_path: String,
    pub metadata_path: String,
    /// Bytes volumes can be given (the data region). Absent when offline.
    pub capacity_bytes: Option<u64>,
    /// Bytes of chunks holding written data.
    pub allocated_bytes: Option<u64>,
    pub free_bytes: Option<u64>,
    /// Sum of the volume sizes; above `capacity_bytes` means over-committed.
    pub provisioned_bytes: Option<u64>,
    pub volume_count: Option<usize>,
    pub journal_bytes: Option<u64>,
    pub chunk_bytes: Option<u64>,
    /// Blocks that failed their checksum since the pool was opened.
    pub checksum_errors: Option<u64>,
}

impl From<PoolStatus> for PoolResponse {
    fn from(status: PoolStatus) -> Self {
        let info = status.info.as_ref();
        PoolResponse {
            name: status.record.name.to_string(),
            id: status.record.id.0,
            class: status.record.class.to_string(),
            state: if info.is_some() {
                PoolState::Online
            } else {
                PoolState::Offline
            },
            error: status.offline_reason,
            device_path: status.record.device_path.display().to_string(),
            metadata_path: status.record.metadata_path.display().to_string(),
            capacity_bytes: info.map(|info| info.capacity_bytes),
            allocated_bytes: info.map(|info| info.allocated_bytes),
            free_bytes: info.map(|info| info.free_bytes),
            provisioned_bytes: info.map(|info| info.provisioned_bytes),
            volume_count: info.map(|info| info.volume_count),
            journal_bytes: info.map(|info| info.journal_bytes),
            chunk_bytes: info.map(|info| info.chunk_bytes),
            checksum_errors: info.map(|info| info.checksum_errors),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateVolumeRequest {
    /// The volume's name, also its NBD export name; unique on the node.
    pub name: String,
    /// A positive multiple of 4096.
    pub size_bytes: u64,
    /// The pool to place it in; default: the online pool with the most free bytes.
    #[serde(default)]
    pub pool: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GrowVolumeRequest {
    /// The new size: a multiple of 4096, not smaller than the current size.
    pub size_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct VolumeResponse {
    pub name: String,
    pub id: u64,
    pub pool: String,
    pub size_bytes: u64,
    /// Bytes of the pool's chunks this volume's written data holds.
    pub allocated_bytes: u64,
    pub created_unix_seconds: u64,
    pub checksum_errors: u64,
    /// Where NBD clients reach it, e.g. `nbd://127.0.0.1:10809/NAME`.
    pub nbd_url: Option<String>,
}

impl VolumeResponse {
    pub fn new(info: VolumeInfo, nbd_tcp_address: Option<&str>) -> Self {
        VolumeResponse {
            nbd_url: nbd_tcp_address.map(|address| format!("nbd://{address}/{}", info.name)),
            name: info.name.into(),
            id: info.id.0,
            pool: info.pool.into(),
            size_bytes: info.size_bytes,
            allocated_bytes: info.allocated_bytes,
            created_unix_seconds: info.created_unix_seconds,
            checksum_errors: info.checksum_errors,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ScanResponse {
    /// No problem, no checksum mismatch and the accounting agrees.
    pub clean: bool,
    pub allocated_chunks_counted: u64,
    pub allocated_chunks_accounted: u64,
    pub blocks_checked: u64,
    pub checksum_mismatches: Vec<String>,
    pub problems: Vec<String>,
}

impl From<ScanReport> for ScanResponse {
    fn from(report: ScanReport) -> Self {
        ScanResponse {
            clean: report.is_clean(),
            allocated_chunks_counted: report.allocated_chunks_counted,
            allocated_chunks_accounted: report.allocated_chunks_accounted,
            blocks_checked: report.blocks_checked,
            checksum_mismatches: report.checksum_mismatches,
            problems: report.problems,
        }
    }
}
