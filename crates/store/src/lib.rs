//! trireme's store: storage pools on a block device or a file.
//!
//! A pool is one device (or file) cut into regions, plus a redb metadata
//! database beside it. Writes go to a journal first, which makes them
//! durable with one sequential write and one device flush for many requests;
//! a background applier later copies them to their chunks in place, updates
//! the per-block checksums and commits the chunk maps in batches. The on-disk
//! format and the write → flush → acknowledge ordering are in
//! `docs/store-format.md`.
//!
//! Modules:
//! - [`error`]: `StoreError`, one enum for every pool and volume operation.
//! - `layout`: the superblock and where each region starts.
//! - `device`: opening, creating, sizing and locking the pool's device.
//! - [`disk`]: [`Disk`], the seam every device read, write and flush goes
//!   through, and [`FileDisk`], the real one.
//! - `probe`: what a path holds, and who uses it, before a pool is made there.
//! - `journal`: the on-disk record format.
//! - [`active_set`]: the regions where small overwrites go in place once.
//! - `record`, `overlay`: records in memory, and which blocks they cover.
//! - `metadata`: redb tables (pool, volumes, chunk maps, checkpoint).
//! - `chunk_map`: in-memory chunk maps and the free-chunk allocator.
//! - `checksums`: the per-block crc32c table and its bounded cache.
//! - `engine`: the write, read, apply, checkpoint and replay paths.
//! - [`pool`]: [`Pool`], the public face: create, open, volumes.
//! - [`volume`]: [`Volume`], a [`trireme_types::BlockTarget`] for one volume,
//!   and [`SnapshotView`], a read-only one for a snapshot.

pub mod active_set;
mod checksums;
mod chunk_map;
mod device;
pub mod disk;
mod engine;
pub mod error;
mod journal;
pub mod layout;
mod metadata;
mod overlay;
pub mod pool;
mod probe;
mod record;
pub mod volume;

pub use disk::{Disk, FileDisk};
#[cfg(feature = "bug-switches")]
pub use engine::BugSwitches;
pub use engine::{
    AdmissionWait, Background, EngineOptions as PoolOptions, HeldWrite, Journaled, StallStats,
    Step, WaitTotal, WritePathStats,
};
pub use error::StoreError;
pub use pool::{
    JournalStats, Pool, PoolConfig, PoolInfo, PoolOnDisk, ScanReport, SnapshotInfo, VolumeInfo,
};
pub use volume::{SnapshotView, Volume};
