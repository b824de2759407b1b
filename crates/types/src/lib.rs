//! Types shared by every trireme layer. Nothing here does I/O.
//!
//! - [`buffer`]: [`BlockBuf`], a write's bytes in page-aligned memory.
//! - [`ids`]: typed identifiers (`VolumeId`, `PoolId`, ...) and validated names.
//! - [`size`]: byte sizes as people write them (`512M`, `32G`, `4T`).
//! - [`target`]: [`BlockTarget`], the interface an export serves. A local
//!   store volume implements it today; the replication engine will too.
//! - [`volume_size`]: the sizes a volume may have, checked by the API and
//!   the control plane alike.

pub mod buffer;
mod huge_slab;
pub mod ids;
pub mod size;
pub mod target;
pub mod time;
pub mod volume_size;

pub use buffer::BlockBuf;
pub use ids::{
    Generation, GroupName, NameError, NodeId, NodeName, PoolId, PoolName, SnapshotId, SnapshotName,
    VolumeId, VolumeName,
};
pub use size::{format_size, parse_size, SizeError};
pub use target::{
    Attempt, BlockStatusExtent, BlockTarget, Completer, TargetError, TargetReply, TargetRequest,
    ZeroFlags,
};
pub use volume_size::{check_volume_size, VolumeSizeError, VOLUME_MAX_BYTES};

/// The unit of checksumming, allocation bitmaps and alignment: 4 KiB.
pub const BLOCK_SIZE: u64 = 4096;

/// What kind of device backs a pool; placement filters on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceClass {
    Nvme,
    Ssd,
    Hdd,
}

impl DeviceClass {
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceClass::Nvme => "nvme",
            DeviceClass::Ssd => "ssd",
            DeviceClass::Hdd => "hdd",
        }
    }
}

impl std::fmt::Display for DeviceClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for DeviceClass {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "nvme" => Ok(DeviceClass::Nvme),
            "ssd" => Ok(DeviceClass::Ssd),
            "hdd" => Ok(DeviceClass::Hdd),
            other => Err(format!(
                "device class '{other}' is unknown: use nvme, ssd or hdd"
            )),
        }
    }
}
