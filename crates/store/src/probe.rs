//! What a path holds before `pool create` formats it: whether the host uses
//! it (mounted, swap, backing a loop device, held by device mapper or RAID),
//! and whether it holds data (a known signature, or any non-zero byte at
//! its start or end). Only reads; the caller refuses, or formats with
//! `force`.

use std::fs::File;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

/// How much of the start (and of the end) of a device is read to find data.
pub const PROBE_BYTES: u64 = 1 << 20;

/// A known signature: `magic` at `offset` from the start of the device.
struct Signature {
    offset: usize,
    magic: &'static [u8],
    what: &'static str,
}

/// What `pool delete` leaves on a device or file it did not create.
const DELETED_POOL: &str = "the journal of a deleted trireme pool (its superblock is gone)";

/// Checked in this order; a name more precise than "a DOS partition
/// table" (whose 0x55aa FAT and NTFS boot sectors also carry) comes first.
const SIGNATURES: &[Signature] = &[
    // The superblock is checked before (a pool is its own case); a journal
    // record at the journal's start without it is what `pool delete`
    // leaves on a device or file it did not create.
    Signature {
        offset: 4096,
        magic: &[0x52, 0x4a, 0x52, 0x54],
        what: DELETED_POOL,
    },
    // Format 3: the active set's two slots ("TRAS") come first, then the
    // journal.
    Signature {
        offset: 4096,
        magic: &[0x53, 0x41, 0x52, 0x54],
        what: DELETED_POOL,
    },
    Signature {
        offset: 8192,
        magic: &[0x53, 0x41, 0x52, 0x54],
        what: DELETED_POOL,
    },
    Signature {
        offset: 12288,
        magic: &[0x52, 0x4a, 0x52, 0x54],
        what: DELETED_POOL,
    },
    Signature {
        offset: 1080,
        magic: &[0x53, 0xef],
        what: "an ext2/ext3/ext4 file system",
    },
    Signature {
        offset: 0,
        magic: b"XFSB",
        what: "an XFS file system",
    },
    Signature {
        offset: 65600,
        magic: b"_BHRfS_M",
        what: "a btrfs file system",
    },
    Signature {
        offset: 0,
        magic: b"LUKS\xba\xbe",
        what: "a LUKS encrypted volume",
    },
    Signature {
        offset: 536,
        magic: b"LVM2 001",
        what: "an LVM physical volume",
    },
    Signature {
        offset: 4086,
        magic: b"SWAPSPACE2",
        what: "a swap area",
    },
    Signature {
        offset: 65526,
        magic: b"SWAPSPACE2",
        what: "a swap area",
    },
    Signature {
        offset: 0,
        magic: &[0xfc, 0x4e, 0x2b, 0xa9],
        what: "a Linux RAID member (md)",
    },
    Signature {
        offset: 4096,
        magic: &[0xfc, 0x4e, 0x2b, 0xa9],
        what: "a Linux RAID member (md)",
    },
    Signature {
        offset: 0,
        magic: b"hsqs",
        what: "a squashfs image",
    },
    Signature {
        offset: 32769,
        magic: b"CD001",
        what: "an ISO 9660 image",
    },
    Signature {
        offset: 0,
        magic: b"QFI\xfb",
        what: "a qcow2 image",
    },
    Signature {
        offset: 3,
        magic: b"NTFS    ",
        what: "an NTFS file system",
    },
    Signature {
        offset: 82,
        magic: b"FAT32   ",
        what: "a FAT file system",
    },
    Signature {
        offset: 54,
        magic: b"FAT1",
        what: "a FAT file system",
    },
    Signature {
        offset: 512,
        magic: b"EFI PART",
        what: "a GPT partition table",
    },
    Signature {
        offset: 4096,
        magic: b"EFI PART",
        what: "a GPT partition table",
    },
    Signature {
        offset: 510,
        magic: &[0x55, 0xaa],
        what: "a DOS partition table or boot sector",
    },
];

/// What data the device holds, in words for an error message, or `None`
/// when its first and last [`PROBE_BYTES`] are all zeros (a new file, a
/// zeroed or never written device).
pub fn data_found(file: &File, size_bytes: u64) -> std::io::Result<Option<String>> {
    let head_bytes = size_bytes.min(PROBE_BYTES);
    let mut head = vec![0u8; head_bytes as usize];
    file.read_exact_at(&mut head, 0)?;
    if let Some(signature) = SIGNATURES.iter().find(|signature| {
        head.get(signature.offset..signature.offset + signature.magic.len())
            == Some(signature.magic)
    }) {
        return Ok(Some(signature.what.to_string()));
    }
    if let Some(offset) = head.iter().position(|byte| *byte != 0) {
        return Ok(Some(describe_bytes(&head, offset)));
    }
    let tail_start = size_bytes.saturating_sub(PROBE_BYTES).max(head_bytes);
    let mut tail = vec![0u8; (size_bytes - tail_start) as usize];
    file.read_exact_at(&mut tail, tail_start)?;
    if let Some(offset) = tail.iter().position(|byte| *byte != 0) {
        let at = tail_start + offset as u64;
        let what = if tail.len() >= 512 && tail[tail.len() - 512..].starts_with(b"EFI PART") {
            "the backup header of a GPT partition table".to_string()
        } else {
            format!("non-zero bytes near its end (from offset {at}: a RAID superblock or a backup partition table, perhaps)")
        };
        return Ok(Some(what));
    }
    Ok(None)
}

/// Data without a known signature: text is quoted (it is the admin's own
/// file, and its first line says best what it is), anything else located.
fn describe_bytes(head: &[u8], first_non_zero: usize) -> String {
    let prefix = &head[..head.len().min(4096)];
    let prefix = &prefix[..prefix
        .iter()
        .position(|byte| *byte == 0)
        .unwrap_or(prefix.len())];
    let text = match std::str::from_utf8(prefix) {
        Ok(text) => Some(text),
        // Cut in the middle of a character at the end of the prefix.
        Err(error) if error.error_len().is_none() => {
            std::str::from_utf8(&prefix[..error.valid_up_to()]).ok()
        }
        Err(_) => None,
    };
    let first_line = text
        .filter(|_| first_non_zero == 0)
        .and_then(|text| text.lines().next())
        .filter(|line| !line.is_empty() && !line.chars().any(|c| c.is_control() && c != '\t'));
    match first_line {
        Some(line) => {
            let line: String = line.chars().take(40).collect();
            format!("text starting with {line:?}")
        }
        None => format!("data (the first non-zero byte is at offset {first_non_zero})"),
    }
}

/// Who on this host uses the device or file at `path`, if anyone: a
/// mount, a swap area, a loop device it backs, a device-mapper or RAID
/// device built on it. `metadata` is the path's (symlinks followed).
pub fn user(path: &Path, metadata: &std::fs::Metadata) -> Option<String> {
    let file_type = metadata.file_type();
    if file_type.is_block_device() {
        let devices = device_and_partitions(metadata.rdev());
        let same = |candidate: &Path| {
            std::fs::metadata(candidate).is_ok_and(|found| {
                found.file_type().is_block_device() && devices.contains(&found.rdev())
            })
        };
        if let Some((source, mount_point)) = mounts().into_iter().find(|(source, _)| same(source)) {
            return Some(format!(
                "{} is mounted at {}",
                source.display(),
                mount_point.display()
            ));
        }
        if let Some(swap) = swaps().into_iter().find(|swap| same(swap)) {
            return Some(format!("{} is in use as swap", swap.display()));
        }
        let holders = holders(metadata.rdev());
        if !holders.is_empty() {
            return Some(format!(
                "it is held by {} (device mapper, LVM or RAID)",
                holders.join(", ")
            ));
        }
        return None;
    }
    let same_file = |candidate: &Path| {
        std::fs::metadata(candidate)
            .is_ok_and(|found| (found.dev(), found.ino()) == (metadata.dev(), metadata.ino()))
    };
    if swaps().into_iter().any(|swap| same_file(&swap)) {
        return Some(format!("{} is in use as a swap file", path.display()));
    }
    if let Some(loop_device) = loop_backing_files()
        .into_iter()
        .find(|(_, backing)| same_file(backing))
        .map(|(device, _)| device)
    {
        return Some(format!(
            "it backs the loop device {} (`losetup -d {}` detaches it)",
            loop_device, loop_device
        ));
    }
    None
}

/// The device number and those of its partitions (a whole disk is in use
/// when one of its partitions is).
fn device_and_partitions(rdev: u64) -> Vec<u64> {
    let mut devices = vec![rdev];
    let directory = sys_block(rdev);
    let Ok(entries) = std::fs::read_dir(&directory) else {
        return devices;
    };
    for entry in entries.flatten() {
        if !entry.path().join("partition").exists() {
            continue;
        }
        let number = std::fs::read_to_string(entry.path().join("dev"))
            .ok()
            .and_then(|text| {
                let (major, minor) = text.trim().split_once(':')?;
                Some(libc::makedev(major.parse().ok()?, minor.parse().ok()?))
            });
        devices.extend(number);
    }
    devices
}

fn sys_block(rdev: u64) -> PathBuf {
    PathBuf::from(format!(
        "/sys/dev/block/{}:{}",
        libc::major(rdev),
        libc::minor(rdev)
    ))
}

/// Device-mapper and RAID devices built on the device.
fn holders(rdev: u64) -> Vec<String> {
    std::fs::read_dir(sys_block(rdev).join("holders"))
        .map(|entries| {
            entries
                .flatten()
                .map(|entry| entry.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// `/proc/mounts` escapes a space as `\040` (and tab, newline, backslash).
fn unescape(field: &str) -> PathBuf {
    let mut bytes = Vec::with_capacity(field.len());
    let raw = field.as_bytes();
    let mut index = 0;
    while index < raw.len() {
        let octal = raw.get(index + 1..index + 4).and_then(|digits| {
            let text = std::str::from_utf8(digits).ok()?;
            u8::from_str_radix(text, 8).ok()
        });
        match (raw[index], octal) {
            (b'\\', Some(byte)) => {
                bytes.push(byte);
                index += 4;
            }
            (byte, _) => {
                bytes.push(byte);
                index += 1;
            }
        }
    }
    use std::os::unix::ffi::OsStringExt;
    PathBuf::from(std::ffi::OsString::from_vec(bytes))
}

/// (source, mount point) of every mount whose source is a path.
fn mounts() -> Vec<(PathBuf, PathBuf)> {
    let text = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut fields = line.split(' ');
            let source = fields.next()?;
            let mount_point = fields.next()?;
            source
                .starts_with('/')
                .then(|| (unescape(source), unescape(mount_point)))
        })
        .collect()
}

/// The swap areas in use (devices and files).
fn swaps() -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/swaps").unwrap_or_default();
    text.lines()
        .skip(1)
        .filter_map(|line| line.split_whitespace().next().map(unescape))
        .collect()
}

/// (loop device, backing file) of every loop device in use.
fn loop_backing_files() -> Vec<(String, PathBuf)> {
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let backing = std::fs::read_to_string(entry.path().join("loop/backing_file")).ok()?;
            Some((format!("/dev/{name}"), PathBuf::from(backing.trim_end())))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_deleted_pool_signatures_are_the_journal_and_active_set_magics() {
        use crate::layout::{ACTIVE_SET_BYTES, SUPERBLOCK_BYTES};
        let record = crate::journal::RECORD_MAGIC.to_le_bytes();
        let slot = crate::active_set::SLOT_MAGIC.to_le_bytes();
        let deleted: Vec<_> = SIGNATURES
            .iter()
            .filter(|signature| signature.what == DELETED_POOL)
            .map(|signature| (signature.offset as u64, signature.magic))
            .collect();
        assert_eq!(
            deleted,
            vec![
                (SUPERBLOCK_BYTES, &record[..]),
                (SUPERBLOCK_BYTES, &slot[..]),
                (SUPERBLOCK_BYTES + ACTIVE_SET_BYTES / 2, &slot[..]),
                (SUPERBLOCK_BYTES + ACTIVE_SET_BYTES, &record[..]),
            ]
        );
    }

    use super::*;
    use std::io::Write;

    fn found(bytes: &[u8], size: u64) -> Option<String> {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(bytes).unwrap();
        file.set_len(size).unwrap();
        data_found(&file, size).unwrap()
    }

    #[test]
    fn zeros_are_no_data_and_signatures_are_named() {
        assert_eq!(found(&[], 8 << 20), None);
        assert_eq!(found(&[0; 4096], 4096), None);
        let mut ext4 = vec![0u8; 4096];
        ext4[1080..1082].copy_from_slice(&[0x53, 0xef]);
        ext4[0] = 1;
        assert_eq!(
            found(&ext4, 64 << 20).as_deref(),
            Some("an ext2/ext3/ext4 file system")
        );
        let text = found(b"hello world\nsecond line\n", 64 << 20).unwrap();
        assert!(
            text.contains("text starting with \"hello world\""),
            "{text}"
        );
        let mut binary = vec![0u8; 4096];
        binary[700] = 9;
        let binary = found(&binary, 64 << 20).unwrap();
        assert!(binary.contains("offset 700"), "{binary}");
    }

    #[test]
    fn data_near_the_end_is_found() {
        let file = tempfile::tempfile().unwrap();
        file.set_len(64 << 20).unwrap();
        file.write_all_at(b"EFI PART", (64 << 20) - 512).unwrap();
        let what = data_found(&file, 64 << 20).unwrap().unwrap();
        assert!(what.contains("GPT"), "{what}");
        // Past the last MiB is not looked at: only the two ends are read.
        let file = tempfile::tempfile().unwrap();
        file.set_len(64 << 20).unwrap();
        file.write_all_at(b"x", 32 << 20).unwrap();
        assert_eq!(data_found(&file, 64 << 20).unwrap(), None);
    }

    #[test]
    fn mount_fields_are_unescaped() {
        assert_eq!(unescape("/mnt/a\\040b"), PathBuf::from("/mnt/a b"));
        assert_eq!(unescape("/dev/sda1"), PathBuf::from("/dev/sda1"));
    }
}
