//! The host's tools and tables the node service uses: running a command,
//! the mount table, file system statistics.

use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::process::Command;

/// No host tool the node service runs should take longer (mkfs of a large
/// volume is the slowest); a hung one is reported, not waited for.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, thiserror::Error)]
pub enum SystemError {
    #[error("cannot run {program}: {source}; is it installed on the node (Debian: {package})?")]
    Missing {
        program: String,
        package: &'static str,
        source: std::io::Error,
    },
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("`{command}` took longer than {} s", COMMAND_TIMEOUT.as_secs())]
    TimedOut { command: String },
    #[error("{doing} {}: {source}", path.display())]
    Io {
        doing: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

fn package_of(program: &str) -> &'static str {
    match program {
        "mkfs.ext4" | "resize2fs" | "e2fsck" | "dumpe2fs" | "blkid" => "e2fsprogs / util-linux",
        "mkfs.xfs" | "xfs_growfs" => "xfsprogs",
        _ => "util-linux",
    }
}

/// Runs `program args`, returning its standard output.
pub async fn run(program: &str, args: &[&str]) -> Result<String, SystemError> {
    run_accepting(program, args, &[0]).await
}

/// Runs `program args`, taking any exit status in `accepted` as success
/// (e2fsck answers 1 for "errors corrected").
pub async fn run_accepting(
    program: &str,
    args: &[&str],
    accepted: &[i32],
) -> Result<String, SystemError> {
    let command = format!("{program} {}", args.join(" "));
    let child = Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = match tokio::time::timeout(COMMAND_TIMEOUT, child).await {
        Err(_) => return Err(SystemError::TimedOut { command }),
        Ok(Err(source)) => {
            return Err(SystemError::Missing {
                program: program.to_string(),
                package: package_of(program),
                source,
            })
        }
        Ok(Ok(output)) => output,
    };
    if !output
        .status
        .code()
        .is_some_and(|code| accepted.contains(&code))
    {
        return Err(SystemError::Failed {
            command,
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).to_string())
}

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

/// One line of /proc/self/mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub mount_point: PathBuf,
    pub fs_type: String,
    pub source: String,
}

/// `\040` and friends in mountinfo's paths.
fn unescape(field: &str) -> String {
    let mut out = String::new();
    let bytes = field.as_bytes();
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'\\' && index + 3 < bytes.len() {
            if let Ok(code) = u8::from_str_radix(&field[index + 1..index + 4], 8) {
                out.push(code as char);
                index += 4;
                continue;
            }
        }
        out.push(bytes[index] as char);
        index += 1;
    }
    out
}

pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let mount_point = before.split(' ').nth(4)?;
            let mut after = after.split(' ');
            let fs_type = after.next()?;
            let source = after.next()?;
            Some(Mount {
                mount_point: PathBuf::from(unescape(mount_point)),
                fs_type: fs_type.to_string(),
                source: unescape(source),
            })
        })
        .collect()
}

pub fn mounts() -> Vec<Mount> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|text| parse_mountinfo(&text))
        .unwrap_or_default()
}

/// The topmost mount at `path`, if `path` is a mount point.
pub fn mount_at(path: &Path) -> Option<Mount> {
    mounts()
        .into_iter()
        .rev()
        .find(|mount| mount.mount_point == path)
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

/// The size of a block device, from `blockdev --getsize64`.
pub async fn device_bytes(device: &str) -> Result<u64, SystemError> {
    let text = run("blockdev", &["--getsize64", device]).await?;
    text.trim().parse().map_err(|_| SystemError::Failed {
        command: format!("blockdev --getsize64 {device}"),
        status: "0".into(),
        stderr: format!("not a size: {text}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_give_mount_point_type_and_source() {
        let text = "36 35 98:0 / /mnt/a\\040b rw,noatime master:1 - ext4 /dev/loop3 rw\n\
                    37 35 0:40 / /var/lib/x/fuse rw shared:2 - fuse nbdfuse rw,user_id=0\n";
        let mounts = parse_mountinfo(text);
        assert_eq!(mounts.len(), 2);
        assert_eq!(mounts[0].mount_point, PathBuf::from("/mnt/a b"));
        assert_eq!(mounts[0].fs_type, "ext4");
        assert_eq!(mounts[0].source, "/dev/loop3");
        assert_eq!(mounts[1].fs_type, "fuse");
    }
}
