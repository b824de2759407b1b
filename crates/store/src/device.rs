//! The pool's device: opening or creating it, sizing, reserving space,
//! and the lock that keeps a second process off it.

use crate::layout::{Superblock, SUPERBLOCK_BYTES};
use crate::probe;
use crate::StoreError;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Opens an existing device or file, or creates a file of `size_bytes`.
/// Returns the file, its size, and whether it was created here.
///
/// An existing path is refused when this host uses it (mounted, swap, a
/// loop device's backing file, held by device mapper or RAID, or a block
/// device the kernel will not open exclusively), even with `force`; and
/// without `force` when it holds a pool or any data (see `probe`). Nothing
/// is written to it before those checks pass.
pub(crate) fn open_or_create_device(
    path: &Path,
    size_bytes: Option<u64>,
    force: bool,
) -> Result<(File, u64, bool), StoreError> {
    let opening = |error| StoreError::io(format!("opening {}", path.display()), error);
    if path.exists() {
        let metadata = std::fs::metadata(path).map_err(opening)?;
        let in_use = |user: String| StoreError::InUse {
            path: path.to_path_buf(),
            user,
        };
        if let Some(user) = probe::user(path, &metadata) {
            return Err(in_use(user));
        }
        let is_block_device = metadata.file_type().is_block_device();
        let mut options = OpenOptions::new();
        options.read(true).write(true);
        if is_block_device {
            // O_EXCL on a block device claims it: the open fails with EBUSY
            // while it (or one of its partitions) is mounted or claimed by
            // another holder, and keeps it from being mounted meanwhile.
            options.custom_flags(libc::O_EXCL);
        }
        let file = options.open(path).map_err(|error| {
            if error.raw_os_error() == Some(libc::EBUSY) {
                in_use("the kernel holds it (mounted, a partition of it mounted, or part of a RAID, LVM or device-mapper device)".into())
            } else {
                opening(error)
            }
        })?;
        lock_exclusive(&file, path)?;
        let mut size = device_size(&file).map_err(opening)?;
        let mut block = vec![0u8; SUPERBLOCK_BYTES as usize];
        let is_pool =
            file.read_exact_at(&mut block, 0).is_ok() && Superblock::decode(path, &block).is_ok();
        if !force {
            if is_pool {
                return Err(StoreError::AlreadyAPool {
                    path: path.to_path_buf(),
                });
            }
            if let Some(found) = probe::data_found(&file, size).map_err(opening)? {
                return Err(StoreError::HoldsData {
                    path: path.to_path_buf(),
                    found,
                });
            }
        }
        if !is_block_device {
            if let Some(wanted) = size_bytes.filter(|wanted| *wanted > size) {
                file.set_len(wanted)
                    .map_err(|error| StoreError::io(format!("sizing {}", path.display()), error))?;
                size = wanted;
            }
        }
        if size == 0 {
            return Err(StoreError::SizeNeeded {
                path: path.to_path_buf(),
            });
        }
        return Ok((file, size, false));
    }
    let size = size_bytes.ok_or_else(|| StoreError::SizeNeeded {
        path: path.to_path_buf(),
    })?;
    if size < crate::layout::POOL_MIN_BYTES {
        return Err(StoreError::PoolTooSmall {
            size_bytes: size,
            minimum_bytes: crate::layout::POOL_MIN_BYTES,
        });
    }
    if let Some(parent) = path
        .parent()
        .filter(|parent| !parent.as_os_str().is_empty())
    {
        std::fs::create_dir_all(parent)
            .map_err(|error| StoreError::io(format!("creating {}", parent.display()), error))?;
    }
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|error| StoreError::io(format!("creating {}", path.display()), error))?;
    lock_exclusive(&file, path)?;
    file.set_len(size)
        .map_err(|error| StoreError::io(format!("sizing {}", path.display()), error))?;
    Ok((file, size, true))
}

/// A page-aligned 4 KiB buffer: `O_DIRECT` needs memory aligned to the
/// device's logical block size, and a `Vec` of these is aligned to 4 KiB.
#[derive(Clone, Copy)]
#[repr(C, align(4096))]
pub struct AlignedPage(pub [u8; 4096]);

/// The bytes of `pages`, as one slice.
pub(crate) fn page_bytes(pages: &mut [AlignedPage]) -> &mut [u8] {
    // SAFETY: AlignedPage is 4096 plain bytes with no padding (repr C, size
    // equal to its alignment), so the pages are one contiguous byte array.
    unsafe { std::slice::from_raw_parts_mut(pages.as_mut_ptr().cast::<u8>(), pages.len() * 4096) }
}

/// Opens the device behind `file` again, with `O_DIRECT`; `None` if the
/// file system does not support it. One aligned read of the superblock
/// proves it, as some file systems accept the flag at open and refuse the
/// I/O.
pub(crate) fn open_direct(file: &File) -> Option<File> {
    use std::os::fd::AsRawFd;
    let path = format!("/proc/self/fd/{}", file.as_raw_fd());
    let opened = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path);
    let probed = opened.and_then(|direct| {
        let mut page = [AlignedPage([0; 4096])];
        direct.read_exact_at(page_bytes(&mut page), 0)?;
        Ok(direct)
    });
    match probed {
        Ok(direct) => Some(direct),
        Err(error) => {
            tracing::info!(%error, "O_DIRECT not available; whole-chunk writes go through the page cache");
            None
        }
    }
}

/// Tells the kernel that reads of `file` are random: it then reads only
/// the pages asked for, with no readahead, into single-page folios.
///
/// Why: with readahead, the kernel caches a file in large folios (up to
/// 2 MiB on ext4 since Linux 6.16), and a folio is dirty as a whole. After
/// a sequential read had cached the pool, each later 4 KiB in-place write
/// dirtied a 2 MiB folio: random writes kept the whole cached pool counted
/// dirty (2 GiB for a 2 GiB volume, with a few MiB of data really
/// unwritten), and the kernel's dirty-page throttling and write-back then
/// stalled the applier, and the journal behind it (issue 24: 13k IOPS and
/// a 244 ms p99.9 for random writes after a read, against 60k without the
/// read). Requests are served as they come (128 KiB for a large read), so
/// readahead gains little here. Advice is best effort: a file system that
/// ignores it is only slower after reads, as before.
pub(crate) fn advise_random_access(file: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain system call on a descriptor this `File` owns.
    let result = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
    if result != 0 {
        tracing::info!(
            error = %std::io::Error::from_raw_os_error(result),
            "posix_fadvise(RANDOM) refused; reads of the pool may leave large folios in the page cache"
        );
    }
}

pub(crate) fn file_is_block_device(file: &File) -> bool {
    file.metadata()
        .map(|metadata| metadata.file_type().is_block_device())
        .unwrap_or(false)
}

pub(crate) fn device_size(file: &File) -> std::io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    // Seeking to the end sizes both files and block devices.
    let mut handle = file;
    let size = handle.seek(SeekFrom::End(0))?;
    handle.seek(SeekFrom::Start(0))?;
    Ok(size)
}

pub(crate) fn fill_zeros(file: &File, bytes: u64) -> std::io::Result<()> {
    const PIECE_BYTES: u64 = 1 << 20;
    let zeros = vec![0u8; PIECE_BYTES as usize];
    let mut offset = 0;
    while offset < bytes {
        let length = (bytes - offset).min(PIECE_BYTES);
        file.write_all_at(&zeros[..length as usize], offset)?;
        offset += length;
    }
    file.sync_data()
}

pub(crate) fn allocate_space(file: &File, bytes: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: plain system call on an open descriptor.
    let result = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, bytes as libc::off_t) };
    if result == 0 {
        return Ok(());
    }
    let error = std::io::Error::last_os_error();
    // File systems without fallocate (tmpfs has it; some FUSE ones do not)
    // still work, only without the reservation.
    if error.raw_os_error() == Some(libc::EOPNOTSUPP) {
        return Ok(());
    }
    Err(error)
}

/// Gives `length` bytes at `offset` back to the file system: they read as
/// zeros and take no space on the host until written again. The file's
/// size stays.
pub(crate) fn punch_hole(file: &File, offset: u64, length: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: plain system call on an open descriptor.
    let result = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            length as libc::off_t,
        )
    };
    if result == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Bytes `file` takes on its host: a regular file's allocated blocks
/// (holes take none), a block device's whole size.
pub(crate) fn host_bytes(file: &File) -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    if file_is_block_device(file) {
        return device_size(file);
    }
    // st_blocks counts 512-byte units whatever the file system's block size.
    Ok(file.metadata()?.blocks() * 512)
}

/// One process per pool: a second `trireme` on the same device would
/// corrupt it.
pub(crate) fn lock_exclusive(file: &File, path: &Path) -> Result<(), StoreError> {
    use std::os::fd::AsRawFd;
    // SAFETY: plain system call on an open descriptor.
    let result = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if result != 0 {
        return Err(StoreError::io(
            format!(
                "locking {} (is another trireme process using it?)",
                path.display()
            ),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

pub(crate) fn random_u128() -> u128 {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded from the OS's random source; two hashers give
    // 128 random bits without another dependency.
    let mut value = 0u128;
    for round in 0..2u64 {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u64(round);
        hasher.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        value = (value << 64) | hasher.finish() as u128;
    }
    value
}
