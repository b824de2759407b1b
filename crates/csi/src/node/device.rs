//! A staged volume as a block device: nbdfuse shows the local node's NBD
//! export of the volume as a file, and a loop device makes that file a
//! block device (this kernel, like many, has no `nbd` module).
//!
//! nbdfuse runs in its own session (`setsid -f`), not as a child of this
//! process: a restart of the driver leaves it, the loop device and every
//! mount in place, and the next driver finds them again by path (the
//! loop device by its backing file, `losetup -j`). I/O never passes
//! through the driver. What a restart cannot keep is in a container's
//! PID namespace: there nbdfuse dies with the container (see the README
//! of this crate's deployment notes).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::system::{self, run, SystemError};
use crate::NodeConfig;

/// How long nbdfuse may take to connect and show the export.
const NBDFUSE_READY_WAIT: Duration = Duration::from_secs(20);
/// Attempts to unmount the FUSE file system while the loop device that
/// used it lets go.
const UNMOUNT_ATTEMPTS: u32 = 50;

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error(transparent)]
    System(#[from] SystemError),
    #[error(
        "nbdfuse could not show volume '{volume}' from the NBD socket {socket} within {} s: {log}; \
         is the volume attached on this node (ControllerPublishVolume) and `trireme node run` \
         running here with that --nbd-socket?",
        NBDFUSE_READY_WAIT.as_secs()
    )]
    NotServed {
        volume: String,
        socket: String,
        log: String,
    },
}

/// The files of one staged volume.
pub struct Paths {
    pub dir: PathBuf,
    /// nbdfuse's mount point.
    pub fuse: PathBuf,
    /// The export as a file.
    pub file: PathBuf,
    pub log: PathBuf,
}

pub fn paths(config: &NodeConfig, volume: &str) -> Paths {
    let dir = config.state_dir.join(volume);
    Paths {
        fuse: dir.join("fuse"),
        file: dir.join("fuse").join("nbd"),
        log: dir.join("nbdfuse.log"),
        dir,
    }
}

/// The loop device showing `volume`, if it is set up. The list of every
/// loop device is matched by backing file, so nothing here touches the
/// FUSE file itself (whose nbdfuse may be gone).
pub async fn find(config: &NodeConfig, volume: &str) -> Result<Option<String>, SystemError> {
    let file = paths(config, volume).file.display().to_string();
    let text = run("losetup", &["-n", "-l", "-O", "NAME,BACK-FILE"]).await?;
    Ok(text.lines().find_map(|line| {
        let (device, backing) = line.trim().split_once(char::is_whitespace)?;
        let backing = backing.trim();
        let backing = backing.strip_suffix(" (deleted)").unwrap_or(backing);
        (backing == file).then(|| device.to_string())
    }))
}

/// Sets up (or finds) the loop device of `volume`.
pub async fn attach(config: &NodeConfig, volume: &str) -> Result<String, DeviceError> {
    if let Some(device) = find(config, volume).await? {
        return Ok(device);
    }
    let paths = paths(config, volume);
    if !is_fuse_mounted(&paths.fuse) {
        start_nbdfuse_when_served(config, volume, &paths).await?;
    }
    let file = paths.file.display().to_string();
    let device = run("losetup", &["-f", "--show", &file]).await?;
    Ok(device.trim().to_string())
}

fn is_fuse_mounted(path: &Path) -> bool {
    system::mount_at(path).is_some_and(|mount| mount.fs_type.starts_with("fuse"))
}

/// The node daemon starts serving a volume a moment after the attach that
/// ControllerPublishVolume made returns (its agent applies the change), so
/// an export not there yet is asked for again, up to the same wait.
async fn start_nbdfuse_when_served(
    config: &NodeConfig,
    volume: &str,
    paths: &Paths,
) -> Result<(), DeviceError> {
    let deadline = tokio::time::Instant::now() + NBDFUSE_READY_WAIT;
    loop {
        match start_nbdfuse(config, volume, paths).await {
            Err(DeviceError::NotServed { log, .. })
                if log.contains("has no export named")
                    && tokio::time::Instant::now() < deadline =>
            {
                tracing::debug!(volume, "the export is not served yet; asking again");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            done => return done,
        }
    }
}

async fn start_nbdfuse(
    config: &NodeConfig,
    volume: &str,
    paths: &Paths,
) -> Result<(), DeviceError> {
    fn io(doing: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> SystemError {
        let path = path.to_path_buf();
        move |source| SystemError::Io {
            doing,
            path,
            source,
        }
    }
    std::fs::create_dir_all(&paths.fuse).map_err(io("creating", &paths.fuse))?;
    let log = std::fs::File::create(&paths.log).map_err(io("creating", &paths.log))?;
    let uri = format!(
        "nbd+unix:///{volume}?socket={}",
        config.nbd_socket.display()
    );
    // setsid -f: nbdfuse leaves this process's session and process group
    // (and is not its child), so it outlives a restart of the driver.
    let status = tokio::process::Command::new("setsid")
        .arg("-f")
        .arg("nbdfuse")
        .arg(&paths.fuse)
        .arg(&uri)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone().map_err(io("opening", &paths.log))?)
        .stderr(log)
        .status()
        .await
        .map_err(|source| SystemError::Missing {
            program: "setsid".into(),
            package: "util-linux",
            source,
        })?;
    if !status.success() {
        return Err(SystemError::Failed {
            command: format!("setsid -f nbdfuse {} {uri}", paths.fuse.display()),
            status: status.to_string(),
            stderr: String::new(),
        }
        .into());
    }
    let deadline = tokio::time::Instant::now() + NBDFUSE_READY_WAIT;
    loop {
        let ready = is_fuse_mounted(&paths.fuse)
            && std::fs::metadata(&paths.file).is_ok_and(|meta| meta.len() > 0);
        if ready {
            return Ok(());
        }
        let log = std::fs::read_to_string(&paths.log).unwrap_or_default();
        let failed = !log.trim().is_empty() && !is_fuse_mounted(&paths.fuse);
        if failed || tokio::time::Instant::now() > deadline {
            return Err(DeviceError::NotServed {
                volume: volume.to_string(),
                socket: config.nbd_socket.display().to_string(),
                log: if log.trim().is_empty() {
                    "nbdfuse said nothing".into()
                } else {
                    log.trim().to_string()
                },
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Takes the loop device and nbdfuse down; nothing to do when they are
/// not there.
pub async fn detach(config: &NodeConfig, volume: &str) -> Result<(), DeviceError> {
    if let Some(device) = find(config, volume).await? {
        run("losetup", &["-d", &device]).await?;
    }
    let paths = paths(config, volume);
    let fuse = paths.fuse.display().to_string();
    let mut attempt = 0;
    while is_fuse_mounted(&paths.fuse) {
        attempt += 1;
        // The loop device lets go of the file a moment after `losetup -d`.
        match run("fusermount3", &["-u", &fuse]).await {
            Ok(_) => break,
            Err(error) if attempt >= UNMOUNT_ATTEMPTS => return Err(error.into()),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    // nbdfuse exits once unmounted; its directory goes with the volume.
    let _ = std::fs::remove_dir(&paths.fuse);
    let _ = std::fs::remove_file(&paths.log);
    let _ = std::fs::remove_dir(&paths.dir);
    Ok(())
}
