//! Request checks that need no store: names, sizes, device classes, paths.
//! Each error names the field, what was wrong and what to send instead.

use std::path::PathBuf;
use trireme_types::{DeviceClass, PoolName, VolumeName, BLOCK_SIZE};

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

/// A volume size: positive and a whole number of 4 KiB blocks.
pub fn volume_size(size_bytes: u64) -> Result<u64, NodeError> {
    if size_bytes == 0 {
        return Err(NodeError::InvalidSize(
            "size_bytes must be greater than 0".to_string(),
        ));
    }
    if !size_bytes.is_multiple_of(BLOCK_SIZE) {
        let advice = match size_bytes.div_ceil(BLOCK_SIZE).checked_mul(BLOCK_SIZE) {
            Some(rounded_up) => format!("round it up to {rounded_up}"),
            None => format!("round it down to {}", size_bytes / BLOCK_SIZE * BLOCK_SIZE),
        };
        return Err(NodeError::InvalidSize(format!(
            "size_bytes {size_bytes} is not a multiple of {BLOCK_SIZE} (4 KiB): {advice}"
        )));
    }
    Ok(size_bytes)
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
