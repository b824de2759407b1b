//! NodeStage/Unstage, NodePublish/Unpublish and NodeExpand: devices, file
//! systems and bind mounts.

use std::path::Path;
use std::time::Duration;
use tonic::Status;

use super::device;
use super::system::{self, run, SystemError};
use crate::controller::capability::{self, FILE_SYSTEMS};
use crate::csi::volume_capability::AccessType;
use crate::csi::*;
use crate::status::missing;
use crate::{Driver, NodeConfig};

fn internal(error: impl std::fmt::Display) -> Status {
    Status::internal(error.to_string())
}

pub async fn stage(
    driver: &Driver,
    config: &NodeConfig,
    request: NodeStageVolumeRequest,
) -> Result<NodeStageVolumeResponse, Status> {
    if request.volume_id.is_empty() {
        return Err(missing("volume_id"));
    }
    if request.staging_target_path.is_empty() {
        return Err(missing("staging_target_path"));
    }
    let capability = capability::check_one(request.volume_capability.as_ref())?;
    driver.existing_volume(&request.volume_id).await?;
    let staging = Path::new(&request.staging_target_path);
    let device = device::attach(driver, config, &request.volume_id).await?;
    let Some(AccessType::Mount(mount)) = &capability.access_type else {
        // A block volume is its device: NodePublish binds it.
        return Ok(NodeStageVolumeResponse {});
    };
    if system::mount_at(staging).is_some() {
        return Ok(NodeStageVolumeResponse {});
    }
    let fs_type = if mount.fs_type.is_empty() {
        FILE_SYSTEMS[0]
    } else {
        mount.fs_type.as_str()
    };
    let existing = system::file_system_type(&device).await.map_err(internal)?;
    match existing {
        None => make_file_system(fs_type, &device).await.map_err(internal)?,
        Some(existing) if existing != fs_type => {
            return Err(Status::failed_precondition(format!(
                "volume '{}' holds a {existing} file system, not {fs_type}: it is never \
                 reformatted; ask for fstype {existing}",
                request.volume_id
            )));
        }
        Some(_) if fs_type == "ext4" => grow_ext4_to_device(&device).await.map_err(internal)?,
        Some(_) => {}
    }
    std::fs::create_dir_all(staging).map_err(internal)?;
    let options = mount_options(&mount.mount_flags, false);
    let staging_text = staging.display().to_string();
    let mut args = vec!["-t", fs_type];
    if !options.is_empty() {
        args.extend(["-o", options.as_str()]);
    }
    args.extend([device.as_str(), staging_text.as_str()]);
    run("mount", &args).await.map_err(internal)?;
    Ok(NodeStageVolumeResponse {})
}

/// An ext4 smaller than its device (the volume grew since it was last
/// staged) grows before it is mounted. Offline, resize2fs needs only the
/// device; online it needs CAP_SYS_RESOURCE, which a container (or the
/// machine the tests run on) may not have. resize2fs wants a checked file
/// system, so e2fsck -f runs first (it also replays the journal of a file
/// system whose node died with it mounted).
async fn grow_ext4_to_device(device: &str) -> Result<(), SystemError> {
    let header = run("dumpe2fs", &["-h", device]).await?;
    let field = |name: &str| {
        header
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|value| value.trim().parse::<u64>().ok())
    };
    let (Some(blocks), Some(block_bytes)) = (field("Block count:"), field("Block size:")) else {
        return Ok(());
    };
    let device_bytes = system::device_bytes(device).await?;
    if (blocks + 1) * block_bytes > device_bytes {
        return Ok(());
    }
    // 0: clean, 1: errors corrected; anything else needs a person.
    system::run_accepting("e2fsck", &["-f", "-p", device], &[0, 1]).await?;
    run("resize2fs", &[device]).await.map(drop)
}

async fn make_file_system(fs_type: &str, device: &str) -> Result<(), SystemError> {
    match fs_type {
        // No discard: a new trireme volume reads as zeros already.
        "xfs" => run("mkfs.xfs", &["-q", "-K", device]).await.map(drop),
        _ => run("mkfs.ext4", &["-q", "-F", "-E", "nodiscard", device])
            .await
            .map(drop),
    }
}

fn mount_options(flags: &[String], read_only: bool) -> String {
    let mut options: Vec<&str> = flags.iter().map(String::as_str).collect();
    if read_only {
        options.push("ro");
    }
    options.join(",")
}

pub async fn unstage(
    driver: &Driver,
    config: &NodeConfig,
    request: NodeUnstageVolumeRequest,
) -> Result<NodeUnstageVolumeResponse, Status> {
    if request.volume_id.is_empty() {
        return Err(missing("volume_id"));
    }
    if request.staging_target_path.is_empty() {
        return Err(missing("staging_target_path"));
    }
    let staging = Path::new(&request.staging_target_path);
    if system::mount_at(staging).is_some() {
        let staging = staging.display().to_string();
        run("umount", &[&staging]).await.map_err(internal)?;
    }
    if crate::names::is_trireme_name(&request.volume_id) {
        device::detach(driver, config, &request.volume_id).await?;
    }
    Ok(NodeUnstageVolumeResponse {})
}

pub async fn publish(
    driver: &Driver,
    config: &NodeConfig,
    request: NodePublishVolumeRequest,
) -> Result<NodePublishVolumeResponse, Status> {
    if request.volume_id.is_empty() {
        return Err(missing("volume_id"));
    }
    if request.target_path.is_empty() {
        return Err(missing("target_path"));
    }
    let capability = capability::check_one(request.volume_capability.as_ref())?;
    if request.staging_target_path.is_empty() {
        return Err(missing("staging_target_path"));
    }
    let target = Path::new(&request.target_path);
    if system::mount_at(target).is_some() {
        return Ok(NodePublishVolumeResponse {});
    }
    let not_staged = || {
        Status::failed_precondition(format!(
            "volume '{}' is not staged on this node: NodeStageVolume comes first",
            request.volume_id
        ))
    };
    let (source, flags) = match &capability.access_type {
        Some(AccessType::Mount(mount)) => {
            let staging = Path::new(&request.staging_target_path);
            if system::mount_at(staging).is_none() {
                return Err(not_staged());
            }
            std::fs::create_dir_all(target).map_err(internal)?;
            (
                request.staging_target_path.clone(),
                mount.mount_flags.clone(),
            )
        }
        _ => {
            let device = device::find(driver, config, &request.volume_id)
                .await?
                .ok_or_else(not_staged)?;
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent).map_err(internal)?;
            }
            std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(target)
                .map_err(internal)?;
            (device, Vec::new())
        }
    };
    let target_text = target.display().to_string();
    run("mount", &["--bind", &source, &target_text])
        .await
        .map_err(internal)?;
    if request.readonly || !flags.is_empty() {
        // A bind mount takes its own options only at a remount.
        let options = format!("remount,bind,{}", mount_options(&flags, request.readonly));
        let options = options.trim_end_matches(',');
        run("mount", &["-o", options, &target_text])
            .await
            .map_err(internal)?;
    }
    Ok(NodePublishVolumeResponse {})
}

pub async fn unpublish(
    request: NodeUnpublishVolumeRequest,
) -> Result<NodeUnpublishVolumeResponse, Status> {
    if request.volume_id.is_empty() {
        return Err(missing("volume_id"));
    }
    if request.target_path.is_empty() {
        return Err(missing("target_path"));
    }
    let target = Path::new(&request.target_path);
    while system::mount_at(target).is_some() {
        let text = target.display().to_string();
        run("umount", &[&text]).await.map_err(internal)?;
    }
    match std::fs::symlink_metadata(target) {
        Ok(meta) if meta.is_dir() => std::fs::remove_dir(target).map_err(internal)?,
        Ok(_) => std::fs::remove_file(target).map_err(internal)?,
        Err(_) => {}
    }
    Ok(NodeUnpublishVolumeResponse {})
}

/// How long NodeExpandVolume waits for a kernel device to show its
/// volume's new size: the daemon grows it once its NBD server serves the
/// new size, a moment after the growth is committed.
const GROWN_WAIT: Duration = Duration::from_secs(15);

/// The size of the device of `volume` once it shows `volume_bytes`, or
/// its size after [`GROWN_WAIT`]. Each round asks the daemon for the
/// device again (PUT), which grows a kernel device to the size the daemon
/// serves: the daemon also does it by itself, this only makes it sooner.
async fn wait_for_growth(
    driver: &Driver,
    config: &NodeConfig,
    volume: &str,
    volume_bytes: u64,
) -> Result<u64, Status> {
    let deadline = tokio::time::Instant::now() + GROWN_WAIT;
    loop {
        let device = device::attach_device(driver, config, volume).await?;
        // The daemon's word, then the device node's as this process sees it.
        let shown = if device.size_bytes >= volume_bytes {
            system::device_bytes(&device.device)
                .await
                .map_err(internal)?
        } else {
            device.size_bytes
        };
        if shown >= volume_bytes || tokio::time::Instant::now() >= deadline {
            return Ok(shown);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Grows the file system at `volume_path` to its device, online. A kernel
/// `nbd` device grows in place when its volume grows (the volume's
/// replication engine takes the new size once every copy in sync holds
/// it, and the node daemon then gives the device the size it serves);
/// nbdfuse's file, and the loop device over it, keep the size nbdfuse
/// learnt when it connected, so there the device has the new size only
/// after the volume is staged again (the driver advertises offline
/// expansion on such hosts). A device still smaller than the volume is
/// refused, not "grown" to its old size: the caller would take the old
/// size for the new one.
pub async fn expand(
    driver: &Driver,
    config: &NodeConfig,
    request: &NodeExpandVolumeRequest,
    volume_bytes: u64,
) -> Result<NodeExpandVolumeResponse, Status> {
    let path = Path::new(&request.volume_path);
    if std::fs::symlink_metadata(path).is_err() {
        return Err(Status::not_found(format!(
            "volume path {} does not exist on this node",
            request.volume_path
        )));
    }
    let found = device::find_device(driver, config, &request.volume_id)
        .await?
        .ok_or_else(|| {
            Status::failed_precondition(format!(
                "volume '{}' is not staged on this node",
                request.volume_id
            ))
        })?;
    let device = found.device.clone();
    let kernel = found.kind == device::KERNEL_NBD;
    let device_bytes = if kernel {
        wait_for_growth(driver, config, &request.volume_id, volume_bytes).await?
    } else {
        let _ = run("losetup", &["-c", &device]).await;
        system::device_bytes(&device).await.map_err(internal)?
    };
    if device_bytes < volume_bytes {
        let why = if kernel {
            format!(
                "the node daemon grows a kernel nbd device once its NBD server serves the new \
                 size, and it still serves the old one after {} s (the volume's replication \
                 engine takes the new size once every replica in sync has grown its copy: see \
                 `trireme volume show` for a replica that failed to grow)",
                GROWN_WAIT.as_secs()
            )
        } else {
            "an NBD client learns the size when it connects, and nbdfuse cannot be told a new \
             one, so on this node (no kernel nbd module) expansion is offline only"
                .to_string()
        };
        return Err(Status::failed_precondition(format!(
            "volume '{}' is {volume_bytes} bytes but its device {device} on this node still \
             shows {device_bytes} bytes: {why}; unstage the volume and stage it again (in \
             Kubernetes: restart the pod), then expand",
            request.volume_id
        )));
    }
    use std::os::unix::fs::FileTypeExt;
    let block = request
        .volume_capability
        .as_ref()
        .is_some_and(capability::is_block)
        || std::fs::metadata(path).is_ok_and(|meta| meta.file_type().is_block_device());
    if !block {
        if let Some(mount) = system::mount_at(path) {
            let path_text = path.display().to_string();
            match mount.fs_type.as_str() {
                "xfs" => run("xfs_growfs", &[&path_text]).await.map(drop),
                _ => run("resize2fs", &[&device]).await.map(drop),
            }
            .map_err(internal)?;
        }
    }
    Ok(NodeExpandVolumeResponse {
        capacity_bytes: device_bytes as i64,
    })
}
