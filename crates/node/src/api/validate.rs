//! Request checks that need no store: names, sizes, device classes, paths.
//! Each error names the field, what was wrong and what to send instead.

use std::path::PathBuf;
use trireme_types::{check_volume_size, DeviceClass, PoolName, VolumeName, VOLUME_MAX_BYTES};

use super::model::{CreatePoolRequest, CreateVolumeRequest};
use crate::node::NewPool;
use crate::NodeError;

const DEFAULT_CLASS: DeviceClass = DeviceClass::Ssd;

pub fn volume_name(name: &str) -> Result<VolumeName, NodeError> {
    Ok(VolumeName::new(name)?)
}

pub fn pool_name(name: &str) -> Result<PoolName, NodeError> {
    Ok(PoolName::new(name)?)
}

/// A volume size for a create or a grow: positive, at most the largest
/// volume, a whole number of 4 KiB blocks. The control plane checks it
/// again with the same function, so the two give the same words.
pub fn volume_size(size_bytes: u64) -> Result<u64, NodeError> {
    check_volume_size(size_bytes).map_err(|error| NodeError::InvalidSize(error.to_string()))
}

// The API, the control plane and the store refuse the same sizes.
const _: () = assert!(VOLUME_MAX_BYTES == trireme_store::pool::VOLUME_MAX_BYTES);

/// The query of a volume delete: nothing, or `with_snapshots=true` /
/// `with_snapshots=false`.
pub fn with_snapshots(query: Option<&str>) -> Result<bool, NodeError> {
    let mut with_snapshots = false;
    for pair in query
        .unwrap_or("")
        .split('&')
        .filter(|pair| !pair.is_empty())
    {
        with_snapshots = match pair.split_once('=') {
            Some(("with_snapshots", "true" | "1")) => true,
            Some(("with_snapshots", "false" | "0")) => false,
            _ => {
                return Err(NodeError::InvalidRequest(format!(
                    "query '{pair}' is not understood: a delete takes only with_snapshots=true or with_snapshots=false"
                )))
            }
        };
    }
    Ok(with_snapshots)
}

pub fn new_volume(
    request: &CreateVolumeRequest,
) -> Result<(VolumeName, u64, Option<PoolName>), NodeError> {
    let name = volume_name(&request.name)?;
    let size_bytes = volume_size(request.size_bytes)?;
    let pool = request.pool.as_deref().map(pool_name).transpose()?;
    Ok((name, size_bytes, pool))
}

pub fn new_pool(request: CreatePoolRequest) -> Result<NewPool, NodeError> {
    let name = pool_name(&request.name)?;
    let class = match request.class.as_deref() {
        None => DEFAULT_CLASS,
        Some(class) => class.parse().map_err(NodeError::InvalidRequest)?,
    };
    if request.path.is_empty() {
        return Err(NodeError::InvalidPath(
            "path is empty: give the absolute path of a block device or a file".to_string(),
        ));
    }
    let device_path = PathBuf::from(&request.path);
    if !device_path.is_absolute() {
        return Err(NodeError::InvalidPath(format!(
            "path '{}' is relative: give an absolute path",
            request.path
        )));
    }
    if request.size_bytes == Some(0) {
        return Err(NodeError::InvalidSize(
            "size_bytes must be greater than 0, or left out to use a block device's own size"
                .to_string(),
        ));
    }
    Ok(NewPool {
        name,
        device_path,
        size_bytes: request.size_bytes,
        class,
        preallocate: request.preallocate,
        force: request.force,
    })
}
