//! The host's tools and tables that the node daemon (local block devices)
//! and the CSI node plugin (file systems, mounts) both use: running a
//! command with a timeout, the mount table, a block device's size.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// No host tool should take longer (mkfs of a large volume is the
/// slowest); a hung one is reported, not waited for.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(300);

#[derive(Debug, thiserror::Error)]
pub enum HostError {
    #[error("cannot run {program}: {source}; is it installed on this host (Debian: {package})?")]
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

/// The Debian package that has `program`, for the error that says it is
/// missing.
pub fn package_of(program: &str) -> &'static str {
    match program {
        "nbdfuse" => "nbdfuse or libnbd-bin",
        "fusermount3" => "fuse3",
        "mkfs.ext4" | "resize2fs" | "e2fsck" | "dumpe2fs" => "e2fsprogs",
        "mkfs.xfs" | "xfs_growfs" => "xfsprogs",
        _ => "util-linux",
    }
}

/// Runs `program args`, returning its standard output.
pub async fn run(program: &str, args: &[&str]) -> Result<String, HostError> {
    run_accepting(program, args, &[0]).await
}

/// Runs `program args`, taking any exit status in `accepted` as success
/// (e2fsck answers 1 for "errors corrected").
pub async fn run_accepting(
    program: &str,
    args: &[&str],
    accepted: &[i32],
) -> Result<String, HostError> {
    let command = format!("{program} {}", args.join(" "));
    let child = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = match tokio::time::timeout(COMMAND_TIMEOUT, child).await {
        Err(_) => return Err(HostError::TimedOut { command }),
        Ok(Err(source)) => {
            return Err(HostError::Missing {
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
        return Err(HostError::Failed {
            command,
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).to_string())
}

/// The size of a block device, from `blockdev --getsize64`.
pub async fn device_bytes(device: &str) -> Result<u64, HostError> {
    let text = run("blockdev", &["--getsize64", device]).await?;
    text.trim().parse().map_err(|_| HostError::Failed {
        command: format!("blockdev --getsize64 {device}"),
        status: "0".into(),
        stderr: format!("not a size: {text}"),
    })
}

/// One line of /proc/self/mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub mount_point: PathBuf,
    pub fs_type: String,
    pub source: String,
}

/// `\040` and friends in mountinfo's paths. Works on bytes: an escaped
/// path may hold UTF-8 beyond ASCII, which must come out whole.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'\\' && index + 3 < bytes.len() {
            if let Ok(code) = u8::from_str_radix(&field[index + 1..index + 4], 8) {
                out.push(code);
                index += 4;
                continue;
            }
        }
        out.push(bytes[index]);
        index += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
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
    topmost_at(mounts(), path)
}

fn topmost_at(mounts: Vec<Mount>, path: &Path) -> Option<Mount> {
    mounts
        .into_iter()
        .rev()
        .find(|mount| mount.mount_point == path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_lines_give_mount_point_type_and_source() {
        let text = "36 35 98:0 / /mnt/a\\040b rw,noatime master:1 - ext4 /dev/loop3 rw\n\
                    37 35 0:40 / /var/lib/x/fuse rw shared:2 - fuse nbdfuse rw,user_id=0\n\
                    38 35 0:41 / /mnt/\\303\\251t\\303\\251 rw - xfs /dev/loop4 rw\n";
        let mounts = parse_mountinfo(text);
        assert_eq!(mounts.len(), 3);
        assert_eq!(mounts[0].mount_point, PathBuf::from("/mnt/a b"));
        assert_eq!(mounts[0].fs_type, "ext4");
        assert_eq!(mounts[0].source, "/dev/loop3");
        assert_eq!(mounts[1].fs_type, "fuse");
        assert_eq!(mounts[2].mount_point, PathBuf::from("/mnt/été"));
    }

    #[test]
    fn the_topmost_mount_at_a_path_is_the_last_listed() {
        let text = "37 35 0:40 / /mnt rw shared:2 - ext4 /dev/loop3 rw\n\
                    38 37 0:41 / /mnt rw shared:2 - xfs /dev/loop4 rw\n";
        let top = topmost_at(parse_mountinfo(text), Path::new("/mnt")).expect("mounted");
        assert_eq!(top.fs_type, "xfs");
        assert_eq!(topmost_at(parse_mountinfo(text), Path::new("/")), None);
    }
}
