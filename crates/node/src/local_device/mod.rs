//! Block devices of volumes for users on this host: the CSI node plugin
//! asks the daemon for "a block device for volume V here" and gets a
//! device path (`/dev/nbdN` or `/dev/loopN`), and gives it back when done.
//!
//! The daemon, not the plugin, owns these devices because the daemon runs
//! on the host as a service while the plugin runs in a container: a
//! container's restart ends every process of its PID namespace, and a
//! bridge process there (nbdfuse) would take the I/O of every staged
//! volume with it.
//!
//! Two ways to make one ([`DeviceKind`]), chosen once at start
//! ([`DEVICE_PATH_ENV`] forces one):
//! - `kernel_nbd`: the kernel's `nbd` module over generic netlink
//!   (`nbd_netlink`), fed a connection to this daemon's own NBD unix
//!   socket whose handshake `nbd_client` does. With a dead-connection
//!   timeout, I/O pauses while the daemon restarts; the restarted daemon
//!   reconnects every device it recorded. A volume that grows grows its
//!   device in place (the `grower` follows the cluster state). Chosen
//!   when the kernel has the module (`/sys/module/nbd`, or `modprobe nbd`
//!   loads it).
//! - `fuse_loop`: nbdfuse + a loop device over the same socket, where the
//!   kernel has no `nbd` module (as on the development machine). I/O fails
//!   while the daemon is down: nbdfuse does not reconnect, and its file
//!   keeps the size nbdfuse learnt at its handshake.
//! - `command`: the host tools and the mount table.
//!
//! State: `DATA/devices/<volume>/` holds a kernel device's record (its
//! index, `kernel-nbd`) or nbdfuse's mount point and log. The loop devices
//! are their own record, found by their backing file under that directory.
//! Either way a restarted daemon finds and can release the devices an
//! earlier run made, whichever way it makes new ones.

mod fuse_loop;
mod kernel_nbd;
mod nbd_client;
mod nbd_netlink;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use trireme_types::VolumeName;

pub use fuse_loop::NBDFUSE_READY_WAIT;
pub use kernel_nbd::{
    parse_dead_connection_timeout, parse_request_timeout, KernelNbdError, KernelNbdTimeouts,
    TimeoutError, DEAD_CONNECTION_TIMEOUT, REQUEST_TIMEOUT,
};
pub use nbd_client::HandshakeError;
pub use trireme_host::HostError as CommandError;

/// The directory under the data directory that holds the devices' state.
pub const STATE_DIR_NAME: &str = "devices";
/// Forces the way devices are made: `kernel-nbd` or `nbdfuse-loop`
/// (unset or `auto`: the kernel's module when it has one).
pub const DEVICE_PATH_ENV: &str = "TRIREME_DEVICE_PATH";

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error(transparent)]
    Command(#[from] CommandError),
    #[error(
        "nbdfuse could not show volume '{volume}' from this node's NBD socket within {} s: {log}",
        NBDFUSE_READY_WAIT.as_secs()
    )]
    NotServed { volume: String, log: String },
    #[error(transparent)]
    KernelNbd(#[from] KernelNbdError),
}

/// How a volume's device is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceKind {
    /// `/dev/nbdN` from the kernel's `nbd` module.
    KernelNbd,
    /// `/dev/loopN` over nbdfuse's file.
    NbdfuseLoop,
}

impl DeviceKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DeviceKind::KernelNbd => "kernel-nbd",
            DeviceKind::NbdfuseLoop => "nbdfuse-loop",
        }
    }

    /// The kind [`DEVICE_PATH_ENV`] asks for; `None` for automatic. A
    /// value it does not know is reported and taken as automatic: a typo
    /// must not stop the daemon.
    fn forced(value: Option<&str>) -> Option<DeviceKind> {
        match value.map(str::trim) {
            None | Some("") | Some("auto") => None,
            Some("kernel-nbd") => Some(DeviceKind::KernelNbd),
            Some("nbdfuse-loop") => Some(DeviceKind::NbdfuseLoop),
            Some(other) => {
                tracing::error!(
                    "{DEVICE_PATH_ENV}={other:?} is none of kernel-nbd, nbdfuse-loop, auto: \
                     choosing automatically"
                );
                None
            }
        }
    }

    /// The kernel's module when it has one (loading it if it can), else
    /// nbdfuse + loop.
    fn choose() -> DeviceKind {
        if let Some(kind) = DeviceKind::forced(std::env::var(DEVICE_PATH_ENV).ok().as_deref()) {
            return kind;
        }
        let loaded = || Path::new("/sys/module/nbd").exists();
        if !loaded() {
            let _ = std::process::Command::new("modprobe")
                .args(["-q", "nbd"])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
        }
        if loaded() {
            DeviceKind::KernelNbd
        } else {
            DeviceKind::NbdfuseLoop
        }
    }
}

/// A volume's block device on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    pub volume: String,
    /// `/dev/nbdN` or `/dev/loopN`.
    pub path: String,
    pub size_bytes: u64,
    pub kind: DeviceKind,
}

type Locks = Arc<Mutex<HashMap<VolumeName, Arc<tokio::sync::Mutex<()>>>>>;

/// One lock per volume: a repeated request waits for the first to finish
/// and then finds its device, instead of making a second; a reconnect
/// never races a release.
fn lock_of(locks: &Locks, volume: &VolumeName) -> Arc<tokio::sync::Mutex<()>> {
    let mut locks = locks.lock().expect("the device locks are never poisoned");
    locks.entry(volume.clone()).or_default().clone()
}

/// The devices this daemon makes, one per volume.
pub struct LocalDevices {
    state_dir: PathBuf,
    nbd_socket: PathBuf,
    kind: DeviceKind,
    timeouts: KernelNbdTimeouts,
    locks: Locks,
}

impl LocalDevices {
    /// Chooses how devices are made and, with the kernel's module, starts
    /// reconnecting the devices an earlier run left (when called inside
    /// a tokio runtime, as the daemon does). `timeouts` are the kernel
    /// devices' (the nbdfuse path has none).
    pub fn new(data_dir: &Path, nbd_socket: PathBuf, timeouts: KernelNbdTimeouts) -> LocalDevices {
        let devices = LocalDevices {
            state_dir: data_dir.join(STATE_DIR_NAME),
            nbd_socket,
            kind: DeviceKind::choose(),
            timeouts,
            locks: Locks::default(),
        };
        tracing::info!(kind = devices.kind.as_str(), "local block devices");
        if devices.kind == DeviceKind::KernelNbd && tokio::runtime::Handle::try_current().is_ok() {
            tracing::info!(
                request_timeout_s = timeouts.request.as_secs(),
                dead_connection_timeout_s = timeouts.dead_connection.as_secs(),
                "kernel nbd device timeouts"
            );
            tokio::spawn(reconnector::run(
                devices.state_dir.clone(),
                devices.nbd_socket.clone(),
                devices.locks.clone(),
                timeouts,
            ));
        }
        devices
    }

    /// Grows each kernel device when its volume grows, whoever grew it
    /// (the REST API or CLI on any node, CSI's ControllerExpandVolume):
    /// from now on, on every change of the cluster state and every few
    /// seconds. Nothing to do on the nbdfuse path, which cannot grow.
    pub fn follow_volume_sizes(self: &Arc<Self>, cluster: Arc<crate::cluster::Cluster>) {
        if self.kind == DeviceKind::KernelNbd {
            tokio::spawn(grower::run(self.clone(), cluster));
        }
    }

    /// How this daemon makes new devices.
    pub fn kind(&self) -> DeviceKind {
        self.kind
    }

    async fn device(
        &self,
        volume: &str,
        path: String,
        kind: DeviceKind,
    ) -> Result<Device, DeviceError> {
        let size_bytes = trireme_host::device_bytes(&path).await?;
        Ok(Device {
            volume: volume.to_string(),
            path,
            size_bytes,
            kind,
        })
    }

    /// The device of `volume`, if this daemon (or an earlier run) made one.
    pub async fn find(&self, volume: &VolumeName) -> Result<Option<Device>, DeviceError> {
        let name = volume.as_str();
        if let Some(path) = kernel_nbd::find(&self.state_dir, name).await? {
            return Ok(Some(self.device(name, path, DeviceKind::KernelNbd).await?));
        }
        match fuse_loop::find(&self.state_dir, name).await? {
            Some(path) => Ok(Some(
                self.device(name, path, DeviceKind::NbdfuseLoop).await?,
            )),
            None => Ok(None),
        }
    }

    /// Makes the device of `volume`, or finds the one made before.
    /// A kernel device found is first grown to the size its volume's
    /// export serves, if that is more (so a repeated request is also the
    /// way to ask "the volume grew: show it").
    pub async fn attach(&self, volume: &VolumeName) -> Result<Device, DeviceError> {
        let lock = lock_of(&self.locks, volume);
        let _held = lock.lock().await;
        if let Some(mut device) = self.find(volume).await? {
            if device.kind == DeviceKind::KernelNbd {
                match kernel_nbd::grow(&self.state_dir, &self.nbd_socket, volume.as_str()).await {
                    Ok(Some(size_bytes)) => device.size_bytes = size_bytes,
                    Ok(None) => {}
                    // The device is there and works at its size: answer it.
                    Err(error) => {
                        tracing::warn!(%volume, %error, "cannot check whether the device should grow")
                    }
                }
            }
            return Ok(device);
        }
        let name = volume.as_str();
        let path = match self.kind {
            DeviceKind::KernelNbd => {
                kernel_nbd::attach(&self.state_dir, &self.nbd_socket, name, self.timeouts).await?
            }
            DeviceKind::NbdfuseLoop => {
                fuse_loop::attach(&self.state_dir, &self.nbd_socket, name).await?
            }
        };
        self.device(name, path, self.kind).await
    }

    /// Takes the device of `volume` down; nothing to do when there is none.
    pub async fn detach(&self, volume: &VolumeName) -> Result<(), DeviceError> {
        let lock = lock_of(&self.locks, volume);
        let _held = lock.lock().await;
        kernel_nbd::detach(&self.state_dir, volume.as_str()).await?;
        fuse_loop::detach(&self.state_dir, volume.as_str()).await
    }

    /// Every device this daemon made (or an earlier run of it).
    pub async fn list(&self) -> Result<Vec<Device>, DeviceError> {
        let mut devices = Vec::new();
        for (volume, path) in kernel_nbd::devices(&self.state_dir).await? {
            devices.push(self.device(&volume, path, DeviceKind::KernelNbd).await?);
        }
        for (volume, path) in fuse_loop::loops(&self.state_dir).await? {
            devices.push(self.device(&volume, path, DeviceKind::NbdfuseLoop).await?);
        }
        devices.sort_by(|left, right| left.volume.cmp(&right.volume));
        Ok(devices)
    }
}

/// Fresh connections for kernel devices: once for every recorded device
/// when the daemon starts (the old daemon's connections died with it),
/// then for each device whose connection the kernel reports dead.
mod reconnector {
    use super::*;
    use std::time::Duration;

    /// How long to wait before listening again after the event
    /// subscription failed.
    const RESUBSCRIBE_WAIT: Duration = Duration::from_secs(10);

    pub async fn run(
        state_dir: PathBuf,
        nbd_socket: PathBuf,
        locks: Locks,
        timeouts: KernelNbdTimeouts,
    ) {
        let (dead_sender, mut dead) = tokio::sync::mpsc::unbounded_channel::<u32>();
        std::thread::Builder::new()
            .name("nbd-link-dead".into())
            .spawn(move || loop {
                let error = nbd_netlink::watch_dead_links(|index| {
                    let _ = dead_sender.send(index);
                });
                if dead_sender.is_closed() {
                    return;
                }
                tracing::warn!(%error, "not told of dead nbd connections; listening again soon");
                std::thread::sleep(RESUBSCRIBE_WAIT);
            })
            .expect("a thread can be started at daemon start");
        for (volume, _) in kernel_nbd::records(&state_dir) {
            spawn_reconnect(&state_dir, &nbd_socket, &locks, volume, timeouts);
        }
        while let Some(index) = dead.recv().await {
            let records = kernel_nbd::records(&state_dir);
            if let Some((volume, _)) = records.into_iter().find(|(_, of)| *of == index) {
                spawn_reconnect(&state_dir, &nbd_socket, &locks, volume, timeouts);
            }
        }
    }

    fn spawn_reconnect(
        state_dir: &Path,
        nbd_socket: &Path,
        locks: &Locks,
        volume: String,
        timeouts: KernelNbdTimeouts,
    ) {
        let Ok(name) = VolumeName::new(&volume) else {
            tracing::warn!(volume, "a device record under a name that is no volume's");
            return;
        };
        let lock = lock_of(locks, &name);
        let state_dir = state_dir.to_path_buf();
        let nbd_socket = nbd_socket.to_path_buf();
        tokio::spawn(async move {
            let _held = lock.lock().await;
            let wait = kernel_nbd::RECONNECT_WAIT;
            if let Err(error) =
                kernel_nbd::reconnect(&state_dir, &nbd_socket, &volume, wait, timeouts).await
            {
                tracing::error!(volume, %error, "cannot reconnect the volume's kernel nbd device");
            }
        });
    }
}

/// New sizes for kernel devices whose volumes grew. The cluster state says
/// a volume grew; the device grows once this daemon's NBD server serves
/// the new size (`kernel_nbd::grow` asks it), which is a moment later,
/// when the agent has grown the local copy and reported it (another
/// change of the state), or, for a volume attached here, when its
/// replication engine serves the new size.
mod grower {
    use super::*;
    use std::time::Duration;

    /// How often to look again without a change of the state: a volume
    /// whose export does not serve its new size yet is retried this often.
    const RECHECK: Duration = Duration::from_secs(5);

    pub async fn run(devices: Arc<LocalDevices>, cluster: Arc<crate::cluster::Cluster>) {
        let mut changes = cluster.state.subscribe();
        // The size each volume's device could not reach yet: said once.
        let mut waiting: HashMap<String, u64> = HashMap::new();
        loop {
            let behind: Vec<(VolumeName, u64)> = {
                let records = kernel_nbd::records(&devices.state_dir);
                let state = cluster.state.read();
                records
                    .into_iter()
                    .filter_map(|(volume, index)| {
                        let name = VolumeName::new(&volume).ok()?;
                        let wanted = state.volumes.get(&name)?.size_bytes;
                        let has = kernel_nbd::kernel_size(index)?;
                        (has > 0 && has < wanted).then_some((name, wanted))
                    })
                    .collect()
            };
            waiting.retain(|volume, _| behind.iter().any(|(name, _)| name.as_str() == volume));
            for (volume, wanted) in behind {
                let lock = lock_of(&devices.locks, &volume);
                let _held = lock.lock().await;
                let grown =
                    kernel_nbd::grow(&devices.state_dir, &devices.nbd_socket, volume.as_str())
                        .await;
                let name = volume.as_str().to_string();
                if let Ok(Some(_)) = grown {
                    waiting.remove(&name);
                    continue;
                }
                if waiting.insert(name, wanted) == Some(wanted) {
                    continue;
                }
                match grown {
                    Err(error) => tracing::warn!(
                        %volume,
                        %error,
                        "the volume grew, but its kernel nbd device cannot grow yet; retrying"
                    ),
                    _ => tracing::info!(
                        %volume,
                        wanted_bytes = wanted,
                        "the volume grew; its kernel nbd device grows once this node serves the new size"
                    ),
                }
            }
            tokio::select! {
                changed = changes.changed() => if changed.is_err() { return },
                _ = tokio::time::sleep(RECHECK) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_forced_kind_is_read_and_anything_else_is_automatic() {
        assert_eq!(
            DeviceKind::forced(Some("kernel-nbd")),
            Some(DeviceKind::KernelNbd)
        );
        assert_eq!(
            DeviceKind::forced(Some("nbdfuse-loop")),
            Some(DeviceKind::NbdfuseLoop)
        );
        assert_eq!(DeviceKind::forced(Some("auto")), None);
        assert_eq!(DeviceKind::forced(None), None);
        assert_eq!(DeviceKind::forced(Some("kernel")), None);
    }
}
