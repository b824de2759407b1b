//! The disk seam: every byte the engine reads or writes on a pool's device
//! goes through [`Disk`]. [`FileDisk`] is the production one, a block device
//! or a regular file; the simulator (crates/sim) has an in-memory one that
//! loses unsynced writes on a crash, tears and reorders them, and injects
//! I/O errors and corruption.
//!
//! Opening, probing, sizing at creation and locking a device stay on the
//! real file (`device`, `probe`): they ask the host about the path, which a
//! simulated disk has no use for. What comes out of them is a `FileDisk`.
//!
//! The calls mirror the system calls the engine made before the seam, one
//! each, so the production path costs one virtual call per system call.

use std::fs::File;
use std::io::{self, IoSlice};
use std::os::unix::fs::FileExt;

/// A pool's device, as the engine uses it. Offsets are bytes from the
/// device's start. Writes are not durable until [`Disk::sync_data`]
/// returns; a crash may lose, tear or reorder any write made since.
pub trait Disk: Send + Sync {
    /// Reads exactly `buffer.len()` bytes at `offset`.
    fn read_at(&self, buffer: &mut [u8], offset: u64) -> io::Result<()>;

    /// Reads `buffer.len()` bytes only if that needs no waiting for the
    /// device (Linux: all of it is in the page cache, `RWF_NOWAIT`). False
    /// otherwise, including on any error: the caller then reads with
    /// [`Disk::read_at`], which meets and reports it.
    fn try_read_at_nowait(&self, buffer: &mut [u8], offset: u64) -> bool;

    /// Writes all of `data` at `offset`.
    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()>;

    /// Writes all of `slices`, one after another, from `offset`.
    fn write_vectored_at(&self, slices: &mut [IoSlice<'_>], offset: u64) -> io::Result<()>;

    /// Like [`Disk::write_vectored_at`], for whole 4 KiB blocks in
    /// page-aligned memory at a block-aligned offset (whole chunks, a
    /// synchronous writer's journal blocks): the device
    /// may take them without copying them into the page cache
    /// (`O_DIRECT`), and then has them when the call returns.
    fn write_direct_at(&self, slices: &mut [IoSlice<'_>], offset: u64) -> io::Result<()>;

    /// True if [`Disk::write_direct_at`] bypasses the page cache, so
    /// writing from several threads at once is worth it (the device takes
    /// the writes in parallel).
    fn parallel_direct_writes(&self) -> bool;

    /// True if [`Disk::write_direct_at`] leaves nothing in the page cache
    /// (`O_DIRECT`): no write-back to start for what it wrote.
    fn direct_writes_bypass_cache(&self) -> bool {
        false
    }

    /// Makes every write that returned before this call durable
    /// (`fdatasync`). After an error nothing unsynced can be trusted.
    fn sync_data(&self) -> io::Result<()>;

    /// The device's size in bytes.
    fn size(&self) -> io::Result<u64>;

    /// Bytes the device takes on its host: a file's allocated blocks, a
    /// block device's size.
    fn host_bytes(&self) -> io::Result<u64>;

    /// True if [`Disk::punch_hole`] gives space back to a host (a regular
    /// file); a block device keeps its size whatever is written to it.
    fn can_punch_holes(&self) -> bool;

    /// `length` bytes at `offset` read as zeros and take no space on the
    /// host. Need not be durable before the next sync. `EOPNOTSUPP` when
    /// the host cannot.
    fn punch_hole(&self, offset: u64, length: u64) -> io::Result<()>;

    /// Starts writing `[from, to)` back towards the device without waiting
    /// (`sync_file_range(WRITE)`). Makes nothing durable.
    fn start_writeback(&self, from: u64, to: u64) -> io::Result<()>;

    /// Waits until the write-back already started in `[from, to)` is done
    /// (`sync_file_range(WAIT_BEFORE)`), starting none: dirty pages in the
    /// range that nobody started yet (direct writes not applied yet) are
    /// left to their own pass. Makes nothing durable either: it bounds the
    /// dirty data, not the crash loss.
    fn wait_writeback(&self, from: u64, to: u64) -> io::Result<()>;
}

/// A pool's device on this host: a block device or a regular file, and a
/// second descriptor of it with `O_DIRECT` where the file system allows.
pub struct FileDisk {
    file: File,
    /// The same device opened with `O_DIRECT`, for whole chunks (a stream
    /// of them, a copy, a restore, a sequential write, goes to the device
    /// without a copy into the page cache, which was the single biggest
    /// cost of large writes) and a synchronous writer's journal blocks.
    /// `None` where the file system refuses `O_DIRECT` (tmpfs before Linux
    /// 6.6, some FUSE ones): those writes stay buffered.
    direct: Option<File>,
    is_block_device: bool,
}

impl FileDisk {
    /// Wraps an open (and locked) device.
    pub fn new(file: File) -> FileDisk {
        let direct = crate::device::open_direct(&file);
        crate::device::advise_random_access(&file);
        let is_block_device = crate::device::file_is_block_device(&file);
        FileDisk {
            file,
            direct,
            is_block_device,
        }
    }

    pub fn file(&self) -> &File {
        &self.file
    }
}

impl Disk for FileDisk {
    fn read_at(&self, buffer: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buffer, offset)
    }

    fn try_read_at_nowait(&self, buffer: &mut [u8], offset: u64) -> bool {
        read_cached_at(&self.file, buffer, offset)
    }

    fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(data, offset)
    }

    fn write_vectored_at(&self, slices: &mut [IoSlice<'_>], offset: u64) -> io::Result<()> {
        write_all_vectored_at(&self.file, slices, offset)
    }

    fn write_direct_at(&self, slices: &mut [IoSlice<'_>], offset: u64) -> io::Result<()> {
        match &self.direct {
            Some(direct) => {
                debug_assert!(slices.iter().all(|slice| (slice.as_ptr() as usize)
                    .is_multiple_of(trireme_types::BlockBuf::ALIGN)
                    && slice.len().is_multiple_of(trireme_types::BlockBuf::ALIGN)));
                debug_assert!(offset.is_multiple_of(trireme_types::BlockBuf::ALIGN as u64));
                write_all_vectored_at(direct, slices, offset)
            }
            None => write_all_vectored_at(&self.file, slices, offset),
        }
    }

    fn parallel_direct_writes(&self) -> bool {
        self.direct.is_some()
    }

    fn direct_writes_bypass_cache(&self) -> bool {
        self.direct.is_some()
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn size(&self) -> io::Result<u64> {
        crate::device::device_size(&self.file)
    }

    fn host_bytes(&self) -> io::Result<u64> {
        crate::device::host_bytes(&self.file)
    }

    fn can_punch_holes(&self) -> bool {
        !self.is_block_device
    }

    fn punch_hole(&self, offset: u64, length: u64) -> io::Result<()> {
        crate::device::punch_hole(&self.file, offset, length)
    }

    fn start_writeback(&self, from: u64, to: u64) -> io::Result<()> {
        sync_range(&self.file, from, to, libc::SYNC_FILE_RANGE_WRITE)
    }

    fn wait_writeback(&self, from: u64, to: u64) -> io::Result<()> {
        sync_range(&self.file, from, to, libc::SYNC_FILE_RANGE_WAIT_BEFORE)
    }
}

/// `sync_file_range(2)` over `[from, to)` of `file`.
fn sync_range(file: &File, from: u64, to: u64, flags: u32) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: plain system call on an open descriptor.
    let result = unsafe {
        libc::sync_file_range(
            file.as_raw_fd(),
            from as libc::off64_t,
            (to - from) as libc::off64_t,
            flags,
        )
    };
    if result == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Reads `buffer.len()` bytes only if all are in the page cache
/// (`RWF_NOWAIT`); false otherwise, including on any error.
fn read_cached_at(file: &File, buffer: &mut [u8], offset: u64) -> bool {
    use std::os::fd::AsRawFd;
    let iovec = libc::iovec {
        iov_base: buffer.as_mut_ptr() as *mut libc::c_void,
        iov_len: buffer.len(),
    };
    // SAFETY: the iovec points into `buffer`, alive and exclusive for the call.
    let read = unsafe {
        libc::preadv2(
            file.as_raw_fd(),
            &iovec,
            1,
            offset as libc::off_t,
            libc::RWF_NOWAIT,
        )
    };
    read >= 0 && read as usize == buffer.len()
}

/// Records per `pwritev`: the kernel's IOV_MAX.
const IOV_MAX: usize = 1024;

/// `pwritev` until every slice is written.
fn write_all_vectored_at(
    file: &File,
    mut slices: &mut [IoSlice<'_>],
    mut offset: u64,
) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    while !slices.is_empty() {
        let count = slices.len().min(IOV_MAX);
        // SAFETY: IoSlice is ABI-compatible with iovec, and the slices live
        // for the whole call.
        let written = unsafe {
            libc::pwritev(
                file.as_raw_fd(),
                slices.as_ptr() as *const libc::iovec,
                count as libc::c_int,
                offset as libc::off_t,
            )
        };
        if written < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        if written == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "pwritev wrote nothing",
            ));
        }
        offset += written as u64;
        IoSlice::advance_slices(&mut slices, written as usize);
    }
    Ok(())
}
