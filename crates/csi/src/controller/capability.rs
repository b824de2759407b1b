//! Which volume capabilities (access type and mode) trireme serves.
//!
//! A volume has one primary at a time, so one node writes it; a block
//! volume may have two primaries for the length of a live migration
//! (KubeVirt asks for MULTI_NODE_MULTI_WRITER block volumes). A file system
//! (ext4, xfs) is never shared between nodes.

use tonic::Status;

use crate::csi::volume_capability::access_mode::Mode;
use crate::csi::volume_capability::AccessType;
use crate::csi::VolumeCapability;
use crate::status::missing;

/// The file systems NodeStage makes; the first is the default.
pub const FILE_SYSTEMS: [&str; 2] = ["ext4", "xfs"];

/// Why `capability` is not served, if it is not.
pub fn unsupported(capability: &VolumeCapability) -> Option<String> {
    let mode = capability
        .access_mode
        .as_ref()
        .map(|mode| Mode::try_from(mode.mode).unwrap_or(Mode::Unknown))
        .unwrap_or(Mode::Unknown);
    let block = match &capability.access_type {
        Some(AccessType::Block(_)) => true,
        Some(AccessType::Mount(mount)) => {
            if !mount.fs_type.is_empty() && !FILE_SYSTEMS.contains(&mount.fs_type.as_str()) {
                return Some(format!(
                    "file system '{}' is not offered: use ext4 or xfs (csi.storage.k8s.io/fstype)",
                    mount.fs_type
                ));
            }
            false
        }
        None => return Some("a volume capability needs an access type (block or mount)".into()),
    };
    match mode {
        Mode::SingleNodeWriter
        | Mode::SingleNodeReaderOnly
        | Mode::SingleNodeSingleWriter
        | Mode::SingleNodeMultiWriter => None,
        Mode::MultiNodeMultiWriter if block => None,
        Mode::MultiNodeMultiWriter => Some(
            "MULTI_NODE_MULTI_WRITER is offered for block volumes only (a live migration's two \
             primaries); a file system cannot be mounted on two nodes"
                .into(),
        ),
        Mode::MultiNodeReaderOnly | Mode::MultiNodeSingleWriter => Some(format!(
            "access mode {} is not offered: a trireme volume is attached on one node (two during \
             a live migration of a block volume); use ReadWriteOnce",
            mode.as_str_name()
        )),
        Mode::Unknown => Some("a volume capability needs an access mode".into()),
    }
}

/// A request's one capability: present, and served.
pub fn check_one(capability: Option<&VolumeCapability>) -> Result<&VolumeCapability, Status> {
    let capability = capability.ok_or_else(|| missing("volume_capability"))?;
    match unsupported(capability) {
        Some(why) => Err(Status::invalid_argument(why)),
        None => Ok(capability),
    }
}

/// Checks a request's capabilities: present, and each one served.
pub fn check_all(capabilities: &[VolumeCapability]) -> Result<(), Status> {
    if capabilities.is_empty() {
        return Err(missing("volume_capabilities"));
    }
    for capability in capabilities {
        if let Some(why) = unsupported(capability) {
            return Err(Status::invalid_argument(why));
        }
    }
    Ok(())
}

/// Whether two live nodes may have the volume attached at once.
pub fn multi_node(capability: &VolumeCapability) -> bool {
    let block = matches!(capability.access_type, Some(AccessType::Block(_)));
    let mode = capability.access_mode.as_ref().map(|mode| mode.mode);
    block && mode == Some(Mode::MultiNodeMultiWriter as i32)
}

pub fn is_block(capability: &VolumeCapability) -> bool {
    matches!(capability.access_type, Some(AccessType::Block(_)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::csi::volume_capability::{AccessMode, BlockVolume, MountVolume};

    fn capability(block: bool, mode: Mode, fs_type: &str) -> VolumeCapability {
        VolumeCapability {
            access_type: Some(if block {
                AccessType::Block(BlockVolume {})
            } else {
                AccessType::Mount(MountVolume {
                    fs_type: fs_type.into(),
                    ..Default::default()
                })
            }),
            access_mode: Some(AccessMode { mode: mode as i32 }),
        }
    }

    #[test]
    fn a_shared_file_system_and_unknown_file_systems_are_refused() {
        assert!(unsupported(&capability(false, Mode::SingleNodeWriter, "ext4")).is_none());
        assert!(unsupported(&capability(false, Mode::SingleNodeWriter, "")).is_none());
        assert!(unsupported(&capability(false, Mode::SingleNodeWriter, "btrfs")).is_some());
        assert!(unsupported(&capability(false, Mode::MultiNodeMultiWriter, "xfs")).is_some());
        assert!(unsupported(&capability(true, Mode::MultiNodeMultiWriter, "")).is_none());
        assert!(unsupported(&capability(true, Mode::MultiNodeReaderOnly, "")).is_some());
        assert!(multi_node(&capability(
            true,
            Mode::MultiNodeMultiWriter,
            ""
        )));
        assert!(!multi_node(&capability(true, Mode::SingleNodeWriter, "")));
    }
}
