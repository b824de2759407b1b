//! [`BlockTarget`]: what an export serves.
//!
//! The NBD server knows nothing of pools, journals or replicas; it talks to a
//! `BlockTarget`. A volume in a local pool is one; the replication engine's
//! volume is another. Calls block the calling thread, so the server runs
//! them on its I/O threads, never on the network reactor; a target may also
//! take requests asynchronously ([`BlockTarget::submit`]) and complete them
//! from its own threads.
//!
//! The server checks ranges against [`BlockTarget::size_bytes`] before calling,
//! so a target may treat an out-of-range request as a programming error and
//! answer [`TargetError::Invalid`].

use crate::BlockBuf;

/// Why a target refused or failed a request. Each maps to one NBD error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TargetError {
    /// The request failed for a reason above the device: the volume has
    /// no quorum, no up-to-date replica answers (NBD `EIO`).
    #[error("I/O error: {0}")]
    Io(String),
    /// The device under a pool failed a read or write, or the pool was
    /// taken offline after such a failure (NBD `EIO`). Another copy of the
    /// data may still be good; this pool's is not.
    #[error("device error: {0}")]
    Device(String),
    /// Data read back does not match its checksum (NBD `EIO`): this copy of
    /// the block is damaged, and a replica may hold a good one to repair it.
    #[error("checksum mismatch at volume block {volume_block} (pool block {pool_block})")]
    Checksum { volume_block: u64, pool_block: u64 },
    /// The pool has no free chunk left for this write (NBD `ENOSPC`).
    #[error("no space left in pool '{pool}'")]
    NoSpace { pool: String },
    /// The request itself is wrong (NBD `EINVAL`).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The target cannot do this quickly and the client asked it to fail
    /// rather than be slow (NBD_CMD_FLAG_FAST_ZERO → `ENOTSUP`).
    #[error("not supported: {0}")]
    NotSupported(String),
    /// The target is read-only (NBD `EPERM`).
    #[error("target is read-only")]
    ReadOnly,
    /// The target is going away: deleted, or the node is stopping (NBD `ESHUTDOWN`).
    #[error("target is shutting down")]
    ShuttingDown,
}

/// Flags of a WRITE_ZEROES request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ZeroFlags {
    /// Durable before the reply (NBD_CMD_FLAG_FUA).
    pub fua: bool,
    /// Keep the space allocated (NBD_CMD_FLAG_NO_HOLE).
    pub no_hole: bool,
    /// Fail with `NotSupported` rather than write zeros slowly
    /// (NBD_CMD_FLAG_FAST_ZERO).
    pub fast_zero: bool,
}

/// One run of blocks with the same allocation state, as NBD's
/// `base:allocation` context describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockStatusExtent {
    pub length_bytes: u64,
    /// No storage is allocated (NBD_STATE_HOLE).
    pub hole: bool,
    /// Reads as zeros (NBD_STATE_ZERO).
    pub zero: bool,
}

/// The outcome of a non-blocking attempt: done, or handed back untouched
/// because it would have to wait (for the device, for space, for a lock).
#[derive(Debug)]
pub enum Attempt<T, Back> {
    Done(Result<T, TargetError>),
    WouldBlock(Back),
}

/// A request a target can complete later, from any thread
/// ([`BlockTarget::submit`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetRequest {
    Read {
        offset: u64,
        length: u64,
    },
    Write {
        offset: u64,
        data: BlockBuf,
        fua: bool,
    },
    Flush,
    Trim {
        offset: u64,
        length: u64,
        fua: bool,
    },
    WriteZeroes {
        offset: u64,
        length: u64,
        flags: ZeroFlags,
    },
}

/// What a submitted request completed with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetReply {
    Done,
    /// A read's bytes.
    Data(Vec<u8>),
    /// A read of a range that is all zeros (no bytes to copy).
    Zeroes,
}

/// Called once when a submitted request completes.
pub type Completer = Box<dyn FnOnce(Result<TargetReply, TargetError>) + Send + 'static>;

pub trait BlockTarget: Send + Sync + 'static {
    fn size_bytes(&self) -> u64;

    fn read_only(&self) -> bool {
        false
    }

    /// Fills `buffer` with the bytes at `offset`.
    fn read(&self, offset: u64, buffer: &mut [u8]) -> Result<(), TargetError>;

    /// Writes `data` at `offset`. With `fua`, the data is durable before this
    /// returns; without, it is durable after the next [`BlockTarget::flush`].
    fn write(&self, offset: u64, data: BlockBuf, fua: bool) -> Result<(), TargetError>;

    /// A plain (not FUA) write that completes without blocking the calling
    /// thread, or the data handed back. The NBD server calls this on its
    /// network threads first, which saves two thread switches per request,
    /// and falls back to [`BlockTarget::write`] on an I/O thread.
    fn try_write(&self, offset: u64, data: BlockBuf) -> Attempt<(), BlockBuf> {
        let _ = offset;
        Attempt::WouldBlock(data)
    }

    /// A read served from memory (page cache included) without waiting for
    /// the device; `None` when it would wait.
    fn try_read(&self, offset: u64, buffer: &mut [u8]) -> Option<Result<(), TargetError>> {
        let _ = (offset, buffer);
        None
    }

    /// Makes every write that completed before this call durable.
    fn flush(&self) -> Result<(), TargetError>;

    /// The range may be returned to the pool; reads of it may return zeros or
    /// the old data (this store returns zeros).
    fn trim(&self, offset: u64, length: u64, fua: bool) -> Result<(), TargetError>;

    /// The range reads as zeros afterwards.
    fn write_zeroes(&self, offset: u64, length: u64, flags: ZeroFlags) -> Result<(), TargetError>;

    /// Allocation state from `offset`, covering at most `length` bytes and at
    /// least one extent. Extents are in order and do not overlap.
    fn block_status(&self, offset: u64, length: u64)
        -> Result<Vec<BlockStatusExtent>, TargetError>;

    /// Whether [`BlockTarget::submit`] takes requests. A target whose
    /// requests complete elsewhere (the replication engine, on the network)
    /// says yes, and the NBD server then hands requests over without
    /// parking an I/O thread on each.
    fn submits(&self) -> bool {
        false
    }

    /// Starts `request` and returns at once; `done` runs when it completes,
    /// on whatever thread completes it. Called only when
    /// [`BlockTarget::submits`] says yes; requests arrive in the client's
    /// order.
    fn submit(&self, request: TargetRequest, done: Completer) {
        let _ = request;
        done(Err(TargetError::NotSupported(
            "this target has no asynchronous path".into(),
        )));
    }
}
