//! The host tools the local devices need (nbdfuse, losetup, fusermount3,
//! blockdev) and the mount table.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// No tool here should take long; a hung one is reported, not waited for.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum CommandError {
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

pub fn package_of(program: &str) -> &'static str {
    match program {
        "nbdfuse" => "nbdfuse or libnbd-bin",
        "fusermount3" => "fuse3",
        _ => "util-linux",
    }
}

/// Runs `program args`, returning its standard output.
pub async fn run(program: &str, args: &[&str]) -> Result<String, CommandError> {
    let command = format!("{program} {}", args.join(" "));
    let child = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = match tokio::time::timeout(COMMAND_TIMEOUT, child).await {
        Err(_) => return Err(CommandError::TimedOut { command }),
        Ok(Err(source)) => {
            return Err(CommandError::Missing {
                program: program.to_string(),
                package: package_of(program),
                source,
            })
        }
        Ok(Ok(output)) => output,
    };
    if !output.status.success() {
        return Err(CommandError::Failed {
            command,
            status: output.status.to_string(),
            stderr: String::from_utf8_lossy(&output.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&output.stdout).to_string())
}

/// The file system type mounted at `path` (the topmost), if any.
pub fn mounted_type(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mounted_type_in(&text, path)
}

fn mounted_type_in(mountinfo: &str, path: &Path) -> Option<String> {
    mountinfo
        .lines()
        .rev()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let point = unescape(before.split(' ').nth(4)?);
            let fs_type = after.split(' ').next()?;
            Some((point, fs_type.to_string()))
        })
        .find(|(point, _)| Path::new(point) == path)
        .map(|(_, fs_type)| fs_type)
}

/// `\040` and friends in mountinfo's paths.
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

/// The size of a block device, from `blockdev --getsize64`.
pub async fn device_bytes(device: &str) -> Result<u64, CommandError> {
    let text = run("blockdev", &["--getsize64", device]).await?;
    text.trim().parse().map_err(|_| CommandError::Failed {
        command: format!("blockdev --getsize64 {device}"),
        status: "0".into(),
        stderr: format!("not a size: {text}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_topmost_mount_at_a_path_gives_its_type() {
        let text = "36 35 98:0 / /var/lib/trireme/devices/a\\040b/fuse rw - fuse nbdfuse rw\n\
                    37 35 0:40 / /mnt rw shared:2 - ext4 /dev/loop3 rw\n\
                    38 37 0:41 / /mnt rw shared:2 - xfs /dev/loop4 rw\n";
        assert_eq!(
            mounted_type_in(text, Path::new("/var/lib/trireme/devices/a b/fuse")).as_deref(),
            Some("fuse")
        );
        assert_eq!(
            mounted_type_in(text, Path::new("/mnt")).as_deref(),
            Some("xfs")
        );
        assert_eq!(mounted_type_in(text, Path::new("/")), None);
    }
}
