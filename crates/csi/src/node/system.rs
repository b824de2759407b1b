//! The host's tools and tables the node service uses: those shared with
//! the node daemon (running a command, the mount table) from trireme-host,
//! and the file-system probe and statistics only the plugin needs.

use std::path::Path;

pub use trireme_host::{
    device_bytes, mount_at, run, run_accepting, HostError as SystemError, Mount,
};

/// The file system on `device`, or `None` when it holds none.
///
/// `blkid -p` probes the device itself. Plain `blkid` answers from its
/// cache (/run/blkid/blkid.tab) when the last probe is under two seconds
/// old: a loop device just set up on a new, empty volume then reads as the
/// file system of the volume that had the same loop device a moment ago,
/// and the volume is never formatted. Any failure other than "nothing
/// found" (exit status 2) is an error: formatting on a failed probe would
/// destroy a file system. blkid answers 2 for a device it cannot open as
/// well, so the device is opened and its first blocks read here first.
pub async fn file_system_type(device: &str) -> Result<Option<String>, SystemError> {
    let path = device.to_string();
    tokio::task::spawn_blocking(move || readable_block_device(&path))
        .await
        .expect("the device check does not panic")?;
    const NOTHING_FOUND: i32 = 2;
    let export = run_accepting(
        "blkid",
        &["-p", "-o", "export", device],
        &[0, NOTHING_FOUND],
    )
    .await?;
    let value_of = |key: &str| {
        export.lines().find_map(|line| {
            let (name, value) = line.split_once('=')?;
            (name == key).then(|| value.to_string())
        })
    };
    if let Some(found) = value_of("TYPE") {
        return Ok(Some(found));
    }
    // Something blkid knows that is no file system (a partition table):
    // never "empty", so never formatted over.
    if let Some(table) = value_of("PTTYPE") {
        return Err(SystemError::Failed {
            command: format!("blkid -p -o export {device}"),
            status: "0".into(),
            stderr: format!("{device} holds a {table} partition table, not a file system; it is never formatted"),
        });
    }
    Ok(None)
}

/// Fails unless `device` is a block device whose first 64 KiB (where
/// every file system blkid knows keeps its signature) can be read.
fn readable_block_device(device: &str) -> Result<(), SystemError> {
    use std::io::Read;
    use std::os::unix::fs::FileTypeExt;
    let path = Path::new(device);
    let io = |doing, source| SystemError::Io {
        doing,
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(|source| io("looking up", source))?;
    if !meta.file_type().is_block_device() {
        return Err(io(
            "probing",
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a block device"),
        ));
    }
    let mut head = vec![0u8; 64 * 1024];
    let mut file = std::fs::File::open(path).map_err(|source| io("opening", source))?;
    let mut filled = 0;
    while filled < head.len() {
        match file.read(&mut head[filled..]) {
            Ok(0) => break,
            Ok(read) => filled += read,
            Err(source) => return Err(io("reading the first blocks of", source)),
        }
    }
    Ok(())
}

/// Statistics of the file system holding `path`.
pub fn statvfs(path: &Path) -> Result<libc::statvfs, SystemError> {
    use std::os::unix::ffi::OsStrExt;
    let io = |source| SystemError::Io {
        doing: "reading file system statistics of",
        path: path.to_path_buf(),
        source,
    };
    let name = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io(std::io::Error::from(std::io::ErrorKind::InvalidInput)))?;
    let mut stats: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `name` is a NUL-terminated path and `stats` a valid buffer.
    let result = unsafe { libc::statvfs(name.as_ptr(), &mut stats) };
    if result != 0 {
        return Err(io(std::io::Error::last_os_error()));
    }
    Ok(stats)
}
