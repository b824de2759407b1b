//! A volume as a block device without the kernel's `nbd` module: nbdfuse
//! shows this daemon's NBD export of the volume as a file, and a loop
//! device makes that file a block device.
//!
//! nbdfuse runs in its own session (`setsid -f`), not as a child of the
//! daemon, so a daemon stopped outside a service manager leaves it, the
//! loop device and every mount on it in place. Under systemd the service's
//! stop ends every process of its cgroup, nbdfuse included. Either way its
//! NBD connection to the daemon ends with the daemon, and nbdfuse does not
//! reconnect: I/O through the loop device fails until the volume's device
//! is made again (docs/kubernetes.md, failure behaviour). What survives is
//! the loop device, found again by its backing file, so a restarted
//! daemon can still release it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::CommandError;
use super::DeviceError;
use trireme_host::{mount_at, run};

/// How long nbdfuse may take to connect and show the export.
pub const NBDFUSE_READY_WAIT: Duration = Duration::from_secs(20);
/// Attempts to unmount the FUSE file system while the loop device that
/// used it lets go.
const UNMOUNT_ATTEMPTS: u32 = 50;

/// The files of one volume's device under the state directory.
pub struct Paths {
    pub dir: PathBuf,
    /// nbdfuse's mount point.
    pub fuse: PathBuf,
    /// The export as a file: the loop device's backing file.
    pub file: PathBuf,
    pub log: PathBuf,
}

pub fn paths(state_dir: &Path, volume: &str) -> Paths {
    let dir = state_dir.join(volume);
    Paths {
        fuse: dir.join("fuse"),
        file: dir.join("fuse").join("nbd"),
        log: dir.join("nbdfuse.log"),
        dir,
    }
}

/// Every loop device whose backing file is a volume's file under
/// `state_dir`, as (volume, device). The list of every loop device is
/// matched by backing file, so nothing here touches the FUSE files
/// themselves (whose nbdfuse may be gone).
pub async fn loops(state_dir: &Path) -> Result<Vec<(String, String)>, CommandError> {
    if !any_made(state_dir) {
        return Ok(Vec::new());
    }
    let text = run("losetup", &["-n", "-l", "-O", "NAME,BACK-FILE"]).await?;
    Ok(text
        .lines()
        .filter_map(|line| {
            let (device, backing) = line.trim().split_once(char::is_whitespace)?;
            let backing = backing.trim();
            let backing = backing.strip_suffix(" (deleted)").unwrap_or(backing);
            let volume = volume_of(state_dir, Path::new(backing))?;
            Some((volume, device.to_string()))
        })
        .collect())
}

/// `STATE/<volume>/fuse/nbd` → `<volume>`.
fn volume_of(state_dir: &Path, backing: &Path) -> Option<String> {
    let relative = backing.strip_prefix(state_dir).ok()?;
    let parts: Vec<_> = relative.iter().collect();
    match parts.as_slice() {
        [volume, fuse, nbd] if *fuse == "fuse" && *nbd == "nbd" => {
            Some(volume.to_string_lossy().into_owned())
        }
        _ => None,
    }
}

/// Whether a device of `volume` may have been made this way: its FUSE
/// mount point is made first and removed last. Saves running losetup on
/// a host whose devices are all made the kernel's way (whose losetup may
/// not be util-linux's). Read from the parent directory's entries: a stat
/// of the mount point itself fails (ENOTCONN) once nbdfuse is gone, which
/// is exactly when a restarted daemon must still find the loop device.
pub fn made(state_dir: &Path, volume: &str) -> bool {
    std::fs::read_dir(state_dir.join(volume)).is_ok_and(|entries| {
        entries
            .filter_map(Result::ok)
            .any(|entry| entry.file_name() == "fuse")
    })
}

/// Whether any device may have been made this way.
pub fn any_made(state_dir: &Path) -> bool {
    std::fs::read_dir(state_dir).is_ok_and(|entries| {
        entries
            .filter_map(Result::ok)
            .any(|entry| made(state_dir, &entry.file_name().to_string_lossy()))
    })
}

/// The loop device showing `volume`, if it is set up.
pub async fn find(state_dir: &Path, volume: &str) -> Result<Option<String>, CommandError> {
    if !made(state_dir, volume) {
        return Ok(None);
    }
    Ok(loops(state_dir)
        .await?
        .into_iter()
        .find(|(name, _)| name == volume)
        .map(|(_, device)| device))
}

/// Sets up (or finds) the loop device of `volume`.
pub async fn attach(
    state_dir: &Path,
    nbd_socket: &Path,
    volume: &str,
) -> Result<String, DeviceError> {
    if let Some(device) = find(state_dir, volume).await? {
        return Ok(device);
    }
    let paths = paths(state_dir, volume);
    if !is_fuse_mounted(&paths.fuse) {
        start_nbdfuse_when_served(nbd_socket, volume, &paths).await?;
    }
    let file = paths.file.display().to_string();
    let device = run("losetup", &["-f", "--show", &file]).await?;
    Ok(device.trim().to_string())
}

fn is_fuse_mounted(path: &Path) -> bool {
    mount_at(path).is_some_and(|mount| mount.fs_type.starts_with("fuse"))
}

/// The daemon starts serving a volume a moment after the attach (the
/// agent applies the change), so an export not there yet is asked for
/// again, up to the same wait.
async fn start_nbdfuse_when_served(
    nbd_socket: &Path,
    volume: &str,
    paths: &Paths,
) -> Result<(), DeviceError> {
    let deadline = tokio::time::Instant::now() + NBDFUSE_READY_WAIT;
    loop {
        match start_nbdfuse(nbd_socket, volume, paths).await {
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

fn io(doing: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> CommandError {
    let path = path.to_path_buf();
    move |source| CommandError::Io {
        doing,
        path,
        source,
    }
}

async fn start_nbdfuse(nbd_socket: &Path, volume: &str, paths: &Paths) -> Result<(), DeviceError> {
    std::fs::create_dir_all(&paths.fuse).map_err(io("creating", &paths.fuse))?;
    let log = std::fs::File::create(&paths.log).map_err(io("creating", &paths.log))?;
    let uri = format!("nbd+unix:///{volume}?socket={}", nbd_socket.display());
    // setsid -f: nbdfuse leaves the daemon's session and process group
    // (and is not its child).
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
        .map_err(|source| CommandError::Missing {
            program: "setsid".into(),
            package: "util-linux",
            source,
        })?;
    if !status.success() {
        return Err(CommandError::Failed {
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
pub async fn detach(state_dir: &Path, volume: &str) -> Result<(), DeviceError> {
    if !made(state_dir, volume) {
        return Ok(());
    }
    if let Some(device) = find(state_dir, volume).await? {
        run("losetup", &["-d", &device]).await?;
    }
    let paths = paths(state_dir, volume);
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
    // nbdfuse exits once unmounted; its directory goes with the device.
    let _ = std::fs::remove_dir(&paths.fuse);
    let _ = std::fs::remove_file(&paths.log);
    let _ = std::fs::remove_dir(&paths.dir);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_volume_with_a_fuse_mount_point_may_have_a_loop_device() {
        let state = tempfile::tempdir().unwrap();
        assert!(!any_made(state.path()));
        std::fs::create_dir_all(state.path().join("kernel-only")).unwrap();
        std::fs::write(state.path().join("kernel-only/kernel-nbd"), "0\n").unwrap();
        assert!(!any_made(state.path()));
        std::fs::create_dir_all(state.path().join("pvc-1/fuse")).unwrap();
        assert!(made(state.path(), "pvc-1"));
        assert!(!made(state.path(), "kernel-only"));
        assert!(any_made(state.path()));
    }

    #[test]
    fn only_a_volumes_fuse_file_under_the_state_directory_names_a_volume() {
        let state = Path::new("/var/lib/trireme/devices");
        let of = |path: &str| volume_of(state, Path::new(path));
        assert_eq!(
            of("/var/lib/trireme/devices/pvc-1/fuse/nbd").as_deref(),
            Some("pvc-1")
        );
        assert_eq!(of("/var/lib/trireme/devices/pvc-1/other"), None);
        assert_eq!(of("/var/lib/trireme/pools/default/pool.img"), None);
        assert_eq!(of("/elsewhere/pvc-1/fuse/nbd"), None);
    }
}
