//! Block devices of volumes for users on this host: the CSI node plugin
//! asks the daemon for "a block device for volume V here" and gets a
//! device path (`/dev/loopN`), and gives it back when done.
//!
//! The daemon, not the plugin, owns these devices because the daemon runs
//! on the host as a service while the plugin runs in a container: a
//! container's restart ends every process of its PID namespace, and a
//! bridge process there (nbdfuse) would take the I/O of every staged
//! volume with it.
//!
//! - `fuse_loop`: the device as nbdfuse + a loop device over this daemon's
//!   own NBD unix socket (the only way on a kernel without the `nbd`
//!   module). The kernel `nbd` path over netlink is not built yet.
//! - `command`: the host tools and the mount table.
//!
//! State: `DATA/devices/<volume>/` holds nbdfuse's mount point and log.
//! Nothing else is recorded: the loop devices are the record, found by
//! their backing file under that directory, so a restarted daemon finds
//! and can release the devices an earlier run made.

mod fuse_loop;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use trireme_types::VolumeName;

pub use fuse_loop::NBDFUSE_READY_WAIT;
pub use trireme_host::HostError as CommandError;

/// The directory under the data directory that holds the devices' state.
pub const STATE_DIR_NAME: &str = "devices";

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error(transparent)]
    Command(#[from] CommandError),
    #[error(
        "nbdfuse could not show volume '{volume}' from this node's NBD socket within {} s: {log}",
        NBDFUSE_READY_WAIT.as_secs()
    )]
    NotServed { volume: String, log: String },
}

/// A volume's block device on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub volume: String,
    /// `/dev/loopN`.
    pub path: String,
    pub size_bytes: u64,
}

/// The devices this daemon makes, one per volume.
pub struct LocalDevices {
    state_dir: PathBuf,
    nbd_socket: PathBuf,
    /// One lock per volume: a repeated request waits for the first to
    /// finish and then finds its device, instead of making a second.
    locks: Mutex<HashMap<VolumeName, Arc<tokio::sync::Mutex<()>>>>,
}

impl LocalDevices {
    pub fn new(data_dir: &std::path::Path, nbd_socket: PathBuf) -> LocalDevices {
        LocalDevices {
            state_dir: data_dir.join(STATE_DIR_NAME),
            nbd_socket,
            locks: Mutex::new(HashMap::new()),
        }
    }

    fn lock_of(&self, volume: &VolumeName) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self
            .locks
            .lock()
            .expect("the device locks are never poisoned");
        locks.entry(volume.clone()).or_default().clone()
    }

    async fn device(&self, volume: &str, path: String) -> Result<Device, DeviceError> {
        let size_bytes = trireme_host::device_bytes(&path).await?;
        Ok(Device {
            volume: volume.to_string(),
            path,
            size_bytes,
        })
    }

    /// The device of `volume`, if this daemon made one.
    pub async fn find(&self, volume: &VolumeName) -> Result<Option<Device>, DeviceError> {
        match fuse_loop::find(&self.state_dir, volume.as_str()).await? {
            Some(path) => Ok(Some(self.device(volume.as_str(), path).await?)),
            None => Ok(None),
        }
    }

    /// Makes the device of `volume`, or finds the one made before.
    pub async fn attach(&self, volume: &VolumeName) -> Result<Device, DeviceError> {
        let lock = self.lock_of(volume);
        let _held = lock.lock().await;
        let path = fuse_loop::attach(&self.state_dir, &self.nbd_socket, volume.as_str()).await?;
        self.device(volume.as_str(), path).await
    }

    /// Takes the device of `volume` down; nothing to do when there is none.
    pub async fn detach(&self, volume: &VolumeName) -> Result<(), DeviceError> {
        let lock = self.lock_of(volume);
        let _held = lock.lock().await;
        fuse_loop::detach(&self.state_dir, volume.as_str()).await
    }

    /// Every device this daemon made (or an earlier run of it).
    pub async fn list(&self) -> Result<Vec<Device>, DeviceError> {
        let mut devices = Vec::new();
        for (volume, path) in fuse_loop::loops(&self.state_dir).await? {
            devices.push(self.device(&volume, path).await?);
        }
        devices.sort_by(|left, right| left.volume.cmp(&right.volume));
        Ok(devices)
    }
}
