//! [`Pool`]: create, open and manage a storage pool and its volumes.

use crate::chunk_map::ChunkEntry;
use crate::device::{
    allocate_space, file_is_block_device, fill_zeros, lock_exclusive, open_or_create_device,
    random_u128,
};
use crate::disk::{Disk, FileDisk};
use crate::engine::View;
use crate::engine::{
    open_engine, run_applier, run_journal_writer, run_writeback, Background, Engine, EngineOptions,
    Step, VolumeState,
};
use crate::layout::{Layout, Superblock, CHUNK_BYTES, FORMAT_VERSION, SUPERBLOCK_BYTES};
use crate::metadata::{Metadata, PoolRecord, SnapshotRecord, VolumeRecord};
use crate::volume::SnapshotView;
use crate::{StoreError, Volume};
use serde::Serialize;
use std::collections::HashMap;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use trireme_types::{DeviceClass, PoolId, PoolName, SnapshotId, VolumeId, VolumeName, BLOCK_SIZE};

/// The largest volume: 1 PiB. Far beyond any device here, and small enough
/// that every block number and byte offset stays far from overflow.
pub const VOLUME_MAX_BYTES: u64 = 1 << 50;

/// How to create a pool.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    pub name: PoolName,
    pub id: PoolId,
    pub class: DeviceClass,
    /// A block device or a regular file. A missing file is created.
    pub device_path: PathBuf,
    /// The redb metadata database; created, must not exist.
    pub metadata_path: PathBuf,
    /// Needed when `device_path` does not exist; a device's own size otherwise.
    pub size_bytes: Option<u64>,
    /// Reserve the file's space on the host file system up front
    /// (fallocate) instead of leaving the data region sparse.
    pub preallocate: bool,
    /// Format an existing path that holds data or an old pool. A device or
    /// file in use on this host is refused even so.
    pub force: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct PoolInfo {
    pub name: PoolName,
    pub id: PoolId,
    pub class: DeviceClass,
    pub device_path: PathBuf,
    pub metadata_path: PathBuf,
    /// Bytes of the data region: what volumes can be given.
    pub capacity_bytes: u64,
    /// Bytes of chunks in use (by written data).
    pub allocated_bytes: u64,
    pub free_bytes: u64,
    /// Bytes the device takes on its host: a file's allocated blocks
    /// (the journal and checksum regions, the chunks holding data, and
    /// freed chunks until the checkpoint that gives them back), a block
    /// device's whole size. `None` if it could not be measured.
    pub host_bytes: Option<u64>,
    /// Bytes of free chunks whose space the pool file still holds, for the
    /// overwrites that freed them to take again (*warm* chunks: at most
    /// 256 MiB, or a sixteenth of a smaller pool; a block device's chunks
    /// always hold theirs).
    pub warm_bytes: u64,
    /// Sum of the sizes of all volumes; may exceed capacity (over-commit).
    pub provisioned_bytes: u64,
    pub volume_count: usize,
    pub journal_bytes: u64,
    pub chunk_bytes: u64,
    /// Blocks that failed their checksum since the pool was opened.
    pub checksum_errors: u64,
    /// Why the pool refuses I/O, when it does.
    pub failed: Option<String>,
}

/// Where the journal and the applier stand ([`Pool::journal_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JournalStats {
    pub journal_bytes: u64,
    /// Written and not yet checkpointed (free again).
    pub journal_used_bytes: u64,
    /// Records acknowledged and not yet applied in place.
    pub unapplied_records: u64,
    /// Their data, held in memory (writers wait at `HELD_BYTES_MAX`).
    pub unapplied_bytes: u64,
    /// Chunk-map entries changed since the last checkpoint.
    pub dirty_map_entries: u64,
    /// Small writes since the pool opened: in place once, or journaled
    /// and why (`docs/store-format.md`, *Small overwrites written once*).
    pub write_path: crate::WritePathStats,
    /// Where writers and the background thread waited since the pool
    /// opened.
    pub stalls: crate::StallStats,
}

#[derive(Debug, Clone, Serialize)]
pub struct VolumeInfo {
    pub name: VolumeName,
    pub id: VolumeId,
    pub pool: PoolName,
    pub size_bytes: u64,
    pub allocated_bytes: u64,
    pub created_unix_seconds: u64,
    pub checksum_errors: u64,
}

/// One snapshot of a volume.
#[derive(Debug, Clone, Serialize)]
pub struct SnapshotInfo {
    pub id: SnapshotId,
    pub volume: VolumeName,
    pub created_unix_seconds: u64,
    /// The volume's size when the snapshot was taken.
    pub size_bytes: u64,
    /// Bytes deleting it would give back.
    pub exclusive_bytes: u64,
    /// Bytes of chunks it reads that something else (the volume, another
    /// snapshot, a clone) also holds.
    pub shared_bytes: u64,
}

/// How to make a pool on a [`Disk`] of the caller's ([`Pool::create_on`]).
#[derive(Debug, Clone)]
pub struct PoolOnDisk {
    pub name: PoolName,
    pub id: PoolId,
    pub class: DeviceClass,
    /// The pool's identity; its halves salt the journal records. Chosen by
    /// the caller so that a simulated run is the same for one seed.
    pub uuid: u128,
}

/// What a full scan of a pool found: accounting recomputed from the chunk
/// maps and every written block checked against its checksum.
#[derive(Debug, Clone, Serialize)]
pub struct ScanReport {
    pub allocated_chunks_counted: u64,
    pub allocated_chunks_accounted: u64,
    pub blocks_checked: u64,
    pub checksum_mismatches: Vec<String>,
    pub problems: Vec<String>,
}

impl ScanReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
            && self.checksum_mismatches.is_empty()
            && self.allocated_chunks_counted == self.allocated_chunks_accounted
    }
}

pub struct Pool {
    engine: Arc<Engine>,
    record: PoolRecord,
    /// The applier, the journal writer and the write-back thread, joined
    /// at shutdown.
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Pool {
    pub fn create(config: PoolConfig) -> Result<Arc<Pool>, StoreError> {
        let path = &config.device_path;
        let (file, device_bytes, created_file) =
            open_or_create_device(path, config.size_bytes, config.force)?;
        let cleanup = |error: StoreError| {
            if created_file {
                let _ = std::fs::remove_file(path);
            }
            error
        };
        let layout = Layout::compute(device_bytes).map_err(cleanup)?;
        let is_file = !file_is_block_device(&file);
        if is_file {
            // The journal and checksums must never meet a full host file
            // system, and are written with zeros rather than fallocated:
            // overwriting fallocated (unwritten) extents makes every first
            // write a metadata change, which each flush would then commit.
            // The data region is reserved only when asked.
            let reserving = |error| {
                cleanup(StoreError::io(
                    format!("reserving space in {}", path.display()),
                    error,
                ))
            };
            fill_zeros(&file, layout.data_offset).map_err(reserving)?;
            if config.preallocate {
                allocate_space(&file, device_bytes).map_err(reserving)?;
            }
        }
        let superblock = Superblock {
            pool_uuid: random_u128(),
            layout,
        };
        let record = PoolRecord {
            uuid: superblock.pool_uuid,
            name: config.name.clone(),
            id: config.id,
            class: config.class,
            device_path: path.clone(),
            created_file,
            preallocated: is_file && config.preallocate,
        };
        if let Some(parent) = config.metadata_path.parent() {
            std::fs::create_dir_all(parent).map_err(|error| {
                cleanup(StoreError::io(
                    format!("creating {}", parent.display()),
                    error,
                ))
            })?;
        }
        Metadata::create(&config.metadata_path, &record).map_err(cleanup)?;
        // The superblock is written last: a device is a pool only once its
        // metadata exists.
        file.write_all_at(&superblock.encode(), 0)
            .and_then(|()| file.sync_all())
            .map_err(|error| {
                cleanup(StoreError::io(
                    format!("writing the superblock of {}", path.display()),
                    error,
                ))
            })?;
        drop(file);
        Pool::open(path, &config.metadata_path)
    }

    pub fn open(device_path: &Path, metadata_path: &Path) -> Result<Arc<Pool>, StoreError> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(device_path)
            .map_err(|error| {
                StoreError::io(
                    format!("opening pool device {}", device_path.display()),
                    error,
                )
            })?;
        lock_exclusive(&file, device_path)?;
        let disk: Arc<dyn Disk> = Arc::new(FileDisk::new(file));
        let superblock = read_superblock(&*disk, device_path)?;
        let (metadata, loaded) = Metadata::open(metadata_path)?;
        if loaded.pool.uuid != superblock.pool_uuid {
            return Err(StoreError::MetadataMismatch {
                path: device_path.to_path_buf(),
                metadata: metadata_path.to_path_buf(),
            });
        }
        Pool::start(
            disk,
            superblock,
            metadata,
            loaded,
            EngineOptions::production(),
            true,
        )
    }

    /// Makes a pool on `disk` (of any kind; the simulator's) with its
    /// metadata database on `metadata`, which must be empty. `label`
    /// stands for the device's path in the pool's record and in messages.
    pub fn create_on(
        disk: Arc<dyn Disk>,
        metadata: impl redb::StorageBackend,
        label: &Path,
        config: PoolOnDisk,
        background: Background,
    ) -> Result<Arc<Pool>, StoreError> {
        Pool::create_on_with(
            disk,
            metadata,
            label,
            config,
            EngineOptions::new(background),
        )
    }

    /// [`Pool::create_on`] with the engine's options (the simulator's bug
    /// switches).
    pub fn create_on_with(
        disk: Arc<dyn Disk>,
        metadata: impl redb::StorageBackend,
        label: &Path,
        config: PoolOnDisk,
        options: EngineOptions,
    ) -> Result<Arc<Pool>, StoreError> {
        Pool::create_on_version(disk, metadata, label, config, options, FORMAT_VERSION)
    }

    /// [`Pool::create_on_with`] in an older format `version` (2): what an
    /// earlier trireme made, for the tests of the upgrade.
    #[doc(hidden)]
    pub fn create_on_version(
        disk: Arc<dyn Disk>,
        metadata: impl redb::StorageBackend,
        label: &Path,
        config: PoolOnDisk,
        options: EngineOptions,
        version: u32,
    ) -> Result<Arc<Pool>, StoreError> {
        let device_bytes = disk
            .size()
            .map_err(|error| StoreError::io("sizing the pool device", error))?;
        let layout = Layout::compute_version(device_bytes, version)?;
        let superblock = Superblock {
            pool_uuid: config.uuid,
            layout,
        };
        let record = PoolRecord {
            uuid: superblock.pool_uuid,
            name: config.name,
            id: config.id,
            class: config.class,
            device_path: label.to_path_buf(),
            created_file: false,
            preallocated: false,
        };
        let metadata = Metadata::create_on(metadata, label, &record)?;
        // As in `create`: the superblock last, once the metadata exists.
        disk.write_at(&superblock.encode(), 0)
            .and_then(|()| disk.sync_data())
            .map_err(|error| StoreError::io("writing the superblock", error))?;
        let loaded = metadata.load()?;
        // A pool made in an older format stays in it until it is opened.
        Pool::start(disk, superblock, metadata, loaded, options, false)
    }

    /// Opens the pool on `disk` with its metadata on `metadata`: replays
    /// the journal like [`Pool::open`].
    pub fn open_on(
        disk: Arc<dyn Disk>,
        metadata: impl redb::StorageBackend,
        label: &Path,
        background: Background,
    ) -> Result<Arc<Pool>, StoreError> {
        Pool::open_on_with(disk, metadata, label, EngineOptions::new(background))
    }

    /// [`Pool::open_on`] with the engine's options.
    pub fn open_on_with(
        disk: Arc<dyn Disk>,
        metadata: impl redb::StorageBackend,
        label: &Path,
        options: EngineOptions,
    ) -> Result<Arc<Pool>, StoreError> {
        let superblock = read_superblock(&*disk, label)?;
        let (metadata, loaded) = Metadata::open_on(metadata, label)?;
        if loaded.pool.uuid != superblock.pool_uuid {
            return Err(StoreError::MetadataMismatch {
                path: label.to_path_buf(),
                metadata: label.to_path_buf(),
            });
        }
        Pool::start(disk, superblock, metadata, loaded, options, true)
    }

    /// Replays the journal and starts the background work.
    fn start(
        disk: Arc<dyn Disk>,
        superblock: Superblock,
        metadata: Metadata,
        loaded: crate::metadata::Loaded,
        options: EngineOptions,
        upgrade: bool,
    ) -> Result<Arc<Pool>, StoreError> {
        let background = options.background;
        let record = loaded.pool.clone();
        let actual_bytes = disk
            .size()
            .map_err(|error| StoreError::io("sizing the pool device", error))?;
        if actual_bytes < superblock.layout.device_bytes {
            return Err(StoreError::NotAPool {
                path: record.device_path.clone(),
                reason: format!(
                    "device is {actual_bytes} bytes but the pool was made for {}",
                    superblock.layout.device_bytes
                ),
            });
        }
        let salt = (superblock.pool_uuid as u64) ^ ((superblock.pool_uuid >> 64) as u64);
        let mut engine = open_engine(disk, options, superblock.layout, salt, metadata, loaded)?;
        if upgrade && superblock.layout.version() < FORMAT_VERSION {
            engine = upgrade_to_current(engine, &superblock)?;
        }
        let mut threads = Vec::new();
        if background == Background::Threads {
            engine.writeback.thread_starts();
            // The write-back thread last: shutdown stops it after the
            // others, once nothing can hand it more.
            for (role, body) in [
                ("apply", run_applier as fn(Arc<Engine>)),
                ("journal", run_journal_writer as fn(Arc<Engine>)),
                ("writeback", run_writeback as fn(Arc<Engine>)),
            ] {
                let thread_engine = engine.clone();
                let handle = std::thread::Builder::new()
                    .name(format!("{role}-{}", record.name))
                    .spawn(move || body(thread_engine))
                    .map_err(|error| {
                        StoreError::io(format!("starting the {role} thread"), error)
                    })?;
                threads.push(handle);
            }
        }
        Ok(Arc::new(Pool {
            engine,
            record,
            threads: Mutex::new(threads),
        }))
    }

    /// Runs one step of the background work of a pool opened with
    /// [`Background::Inline`]; false when it had nothing to do.
    pub fn step(&self, step: Step) -> Result<bool, StoreError> {
        if self.engine.background != Background::Inline {
            return Err(StoreError::Fatal(
                "background steps are for pools without background threads".into(),
            ));
        }
        self.engine.step(step)
    }

    /// Regions of the data area (`active_set::REGION_BYTES` each, from
    /// the data offset) that a crash now could leave in the durable active
    /// set: replay takes the checksums of their written blocks from their
    /// data, so corruption injected there is adopted, not detected.
    pub fn regions_maybe_active(&self) -> std::collections::BTreeSet<u32> {
        self.engine.regions_maybe_active()
    }

    /// Writes admitted in this session that went in place once, with a
    /// checksum record.
    pub fn direct_writes(&self) -> u64 {
        self.engine.lock().direct_writes
    }

    pub fn name(&self) -> &PoolName {
        &self.record.name
    }

    pub fn info(&self) -> PoolInfo {
        let state = self.engine.lock();
        let live = state.volumes.values().filter(|volume| !volume.deleted);
        let (provisioned_bytes, volume_count) = live
            .fold((0u64, 0usize), |(bytes, count), volume| {
                (bytes.saturating_add(volume.record.size_bytes), count + 1)
            });
        PoolInfo {
            name: self.record.name.clone(),
            id: self.record.id,
            class: self.record.class,
            device_path: self.record.device_path.clone(),
            metadata_path: self.engine.metadata.path().to_path_buf(),
            capacity_bytes: self.engine.layout.capacity_bytes(),
            allocated_bytes: state.allocator.used_count() * CHUNK_BYTES,
            free_bytes: state.allocator.free_count() * CHUNK_BYTES,
            host_bytes: self.engine.disk.host_bytes().ok(),
            warm_bytes: state.allocator.warm_count() as u64 * CHUNK_BYTES,
            provisioned_bytes,
            volume_count,
            journal_bytes: self.engine.layout.journal_bytes,
            chunk_bytes: CHUNK_BYTES,
            checksum_errors: self.engine.checksum_errors.load(Ordering::Relaxed),
            failed: state.failed.clone(),
        }
    }

    /// The journal and the applier's backlog, for monitoring: one short
    /// hold of the engine's lock.
    pub fn journal_stats(&self) -> JournalStats {
        let state = self.engine.lock();
        JournalStats {
            journal_bytes: self.engine.layout.journal_bytes,
            journal_used_bytes: state.head.saturating_sub(state.tail),
            unapplied_records: state.unapplied.len() as u64,
            unapplied_bytes: state.unapplied_bytes,
            dirty_map_entries: state.dirty_chunks.len() as u64,
            write_path: state.write_path,
            stalls: state.stalls,
        }
    }

    pub fn create_volume(
        &self,
        name: &VolumeName,
        size_bytes: u64,
    ) -> Result<VolumeInfo, StoreError> {
        check_volume_size(size_bytes)?;
        let _metadata = self.metadata_lock();
        if self.find(name).is_ok() {
            return Err(StoreError::VolumeExists(name.clone()));
        }
        let record = VolumeRecord {
            name: name.clone(),
            size_bytes,
            created_unix_seconds: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |elapsed| elapsed.as_secs()),
            epoch: 1,
        };
        let id = self.engine.metadata.add_volume(Some(&record))?;
        self.engine
            .lock()
            .volumes
            .insert(id, VolumeState::new(record));
        self.volume_info(name)
    }

    /// Deletes the volume and its snapshots and returns their chunks, except
    /// those clones still share. Open handles of it answer `ShuttingDown`
    /// from then on.
    pub fn delete_volume(&self, name: &VolumeName) -> Result<(), StoreError> {
        let id = self.find(name)?;
        // Records of the volume still in the journal are skipped when applied
        // or replayed: the volume id is never reused.
        self.engine.delete_volume(id, name)
    }

    /// Grows a volume; shrinking is refused.
    pub fn grow_volume(
        &self,
        name: &VolumeName,
        new_size_bytes: u64,
    ) -> Result<VolumeInfo, StoreError> {
        check_volume_size(new_size_bytes)?;
        let id = self.find(name)?;
        self.engine.change_and_checkpoint(|state| {
            let volume = state
                .volumes
                .get_mut(&id)
                .ok_or_else(|| StoreError::VolumeNotFound(name.clone()))?;
            if new_size_bytes < volume.record.size_bytes {
                return Err(StoreError::ShrinkRefused {
                    name: name.clone(),
                    current_bytes: volume.record.size_bytes,
                    requested_bytes: new_size_bytes,
                });
            }
            volume.record.size_bytes = new_size_bytes;
            state.dirty_volumes.insert(id);
            Ok(())
        })?;
        self.volume_info(name)
    }

    /// The volume's snapshots, oldest first.
    pub fn snapshots(&self, volume: &VolumeName) -> Result<Vec<SnapshotInfo>, StoreError> {
        let id = self.find(volume)?;
        let usage = self
            .engine
            .snapshot_usage(id)
            .ok_or_else(|| StoreError::VolumeNotFound(volume.clone()))?;
        Ok(usage
            .into_iter()
            .map(|usage| SnapshotInfo {
                id: usage.id,
                volume: volume.clone(),
                created_unix_seconds: usage.created_unix_seconds,
                size_bytes: usage.size_bytes,
                exclusive_bytes: usage.chunks_exclusive * CHUNK_BYTES,
                shared_bytes: (usage.chunks_read - usage.chunks_exclusive) * CHUNK_BYTES,
            })
            .collect())
    }

    /// Deletes a snapshot and gives back the space only it held.
    pub fn delete_snapshot(&self, volume: &VolumeName, id: SnapshotId) -> Result<(), StoreError> {
        let volume_id = self.find(volume)?;
        self.engine.delete_snapshot(volume_id, volume, id)
    }

    /// A read-only view of a snapshot, served as a [`BlockTarget`](trireme_types::BlockTarget).
    pub fn open_snapshot(
        &self,
        volume: &VolumeName,
        id: SnapshotId,
    ) -> Result<Arc<SnapshotView>, StoreError> {
        let volume_id = self.find(volume)?;
        let size_bytes = {
            let state = self.engine.lock();
            let volume_state = state
                .live_volume(volume_id)
                .map_err(|_| StoreError::VolumeNotFound(volume.clone()))?;
            let index =
                volume_state
                    .snapshot_index(id)
                    .ok_or_else(|| StoreError::SnapshotNotFound {
                        volume: volume.clone(),
                        id,
                    })?;
            volume_state.snapshots[index].record.size_bytes
        };
        Ok(Arc::new(SnapshotView {
            engine: self.engine.clone(),
            volume: volume_id,
            volume_name: volume.clone(),
            id,
            size_bytes,
        }))
    }

    /// A new thin volume `name` with the snapshot's content, sharing every
    /// chunk with it; writes to either side copy on write. The clone stays
    /// when the snapshot or its volume is deleted.
    pub fn clone_volume(
        &self,
        source: &VolumeName,
        id: SnapshotId,
        name: &VolumeName,
    ) -> Result<VolumeInfo, StoreError> {
        let source_id = self.find(source)?;
        self.engine.clone_snapshot(source_id, source, id, name)?;
        self.volume_info(name)
    }

    /// The volume reads as the snapshot again; its snapshots stay. The
    /// caller makes sure no I/O is in flight on the volume.
    pub fn rollback_volume(&self, volume: &VolumeName, id: SnapshotId) -> Result<(), StoreError> {
        let volume_id = self.find(volume)?;
        self.engine.rollback(volume_id, volume, id)
    }

    pub fn volume_info(&self, name: &VolumeName) -> Result<VolumeInfo, StoreError> {
        let id = self.find(name)?;
        let state = self.engine.lock();
        Ok(self.describe(id, &state.volumes[&id]))
    }

    pub fn volumes(&self) -> Vec<VolumeInfo> {
        let state = self.engine.lock();
        state
            .volumes
            .iter()
            .filter(|(_, volume)| !volume.deleted)
            .map(|(id, volume)| self.describe(*id, volume))
            .collect()
    }

    pub fn open_volume(&self, name: &VolumeName) -> Result<Arc<Volume>, StoreError> {
        let id = self.find(name)?;
        Ok(Arc::new(Volume {
            engine: self.engine.clone(),
            id,
            name: name.clone(),
        }))
    }

    /// Holds the background applier back (or lets it go again), so that a
    /// test can leave records in the journal on purpose. Writers that need
    /// journal space wait while it is paused.
    #[doc(hidden)]
    pub fn pause_applier(&self, paused: bool) {
        self.engine.lock().applier_paused = paused;
        self.engine.applier_wake.notify_all();
    }

    /// Runs `work` while no apply pass or checkpoint runs (the journal writer
    /// goes on). Tests copy a pool's files in here to get what a crash
    /// leaves: in-place data, checksums and metadata only change under this
    /// lock, so the copy never has metadata newer than the data it names.
    #[doc(hidden)]
    pub fn while_quiesced<R>(&self, work: impl FnOnce() -> R) -> R {
        let _applying = self
            .engine
            .apply_lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        work()
    }

    /// Applies the journal and checkpoints now.
    pub fn sync(&self) -> Result<(), StoreError> {
        self.engine.apply_all(true)?;
        self.engine.checkpoint()
    }

    /// Recomputes accounting from the chunk maps and saved maps (chunks in
    /// use, reference counts), compares everything in memory with the
    /// database, and reads every written block of every volume and
    /// snapshot through the checksum-verifying read path.
    pub fn scan(&self) -> Result<ScanReport, StoreError> {
        self.sync()?;
        let mut report = ScanReport {
            allocated_chunks_counted: 0,
            allocated_chunks_accounted: 0,
            blocks_checked: 0,
            checksum_mismatches: Vec::new(),
            problems: Vec::new(),
        };
        let memory = {
            // No checkpoint between reading memory and the database.
            let _applying = self
                .engine
                .apply_lock
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let _metadata = self.metadata_lock();
            let memory = self.collect_maps(&mut report);
            let stored = self.engine.metadata.stored()?;
            compare_stored(&memory, stored, &mut report);
            memory
        };
        let mut references: HashMap<u32, u32> = HashMap::new();
        for (_, _, entry) in &memory.chunks {
            *references.entry(entry.physical).or_default() += 1;
        }
        for (_, _, _, entry) in &memory.saved {
            *references.entry(entry.physical).or_default() += 1;
        }
        report.allocated_chunks_counted = references.len() as u64;
        let counted: HashMap<u32, u32> = memory.refcounts.iter().copied().collect();
        for (physical, count) in &references {
            let recorded = counted.get(physical).copied().unwrap_or(1);
            if recorded != *count {
                report.problems.push(format!(
                    "physical chunk {physical} is mapped {count} times but its reference count is {recorded}"
                ));
            }
        }
        for (physical, recorded) in &counted {
            if !references.contains_key(physical) {
                report.problems.push(format!(
                    "physical chunk {physical} has reference count {recorded} but is not mapped"
                ));
            }
        }
        self.check_blocks(&memory, &mut report);
        Ok(report)
    }

    /// Everything in the maps, sorted, and the chunks the allocator says
    /// are in use by them.
    fn collect_maps(&self, report: &mut ScanReport) -> Maps {
        let state = self.engine.lock();
        let mut maps = Maps::default();
        for (id, volume) in state.volumes.iter().filter(|(_, volume)| !volume.deleted) {
            maps.volumes
                .push((*id, volume.record.epoch, volume.record.size_bytes));
            for (chunk, entry) in volume.map.iter() {
                if entry.birth > volume.record.epoch {
                    report.problems.push(format!(
                        "volume {id} chunk {chunk} was born after the volume's epoch"
                    ));
                }
                maps.chunks.push((*id, chunk, entry));
            }
            let mut previous_epoch = None;
            for snapshot in &volume.snapshots {
                if previous_epoch.is_some_and(|previous| previous >= snapshot.record.epoch)
                    || snapshot.record.epoch >= volume.record.epoch
                {
                    report.problems.push(format!(
                        "snapshot {} of volume {id} is out of epoch order",
                        snapshot.id
                    ));
                }
                previous_epoch = Some(snapshot.record.epoch);
                maps.snapshots.push((*id, snapshot.id, snapshot.record));
                for (chunk, entry) in snapshot.saved.iter() {
                    if entry.birth > snapshot.record.epoch {
                        report.problems.push(format!(
                            "saved map of snapshot {} of volume {id} holds chunk {chunk} born after it",
                            snapshot.id
                        ));
                    }
                    maps.saved.push((*id, snapshot.id, chunk, entry));
                }
            }
        }
        maps.refcounts = state
            .refcounts
            .iter()
            .map(|(physical, count)| (*physical, *count))
            .collect();
        // Chunks in use but not (or no longer) in a map: fresh chunks of
        // redirects not yet applied, and chunks freed at the next checkpoint.
        let in_flight: u64 = state
            .unapplied
            .iter()
            .map(|record| match &record.body {
                crate::record::RecordBody::Write { fresh_chunks, .. } => fresh_chunks.len() as u64,
                _ => 0,
            })
            .sum();
        report.allocated_chunks_accounted =
            state.allocator.used_count() - in_flight - state.deferred_frees.len() as u64;
        maps.sort();
        maps
    }

    fn check_blocks(&self, maps: &Maps, report: &mut ScanReport) {
        let blocks_per_chunk = CHUNK_BYTES / BLOCK_SIZE;
        let mut buffer = vec![0u8; BLOCK_SIZE as usize];
        let mut check = |volume: VolumeId, view: View, chunk: u64, entry: &ChunkEntry| {
            for bit in 0..blocks_per_chunk {
                if !entry.block_written(bit) {
                    continue;
                }
                let block = chunk * blocks_per_chunk + bit;
                report.blocks_checked += 1;
                if let Err(error) =
                    self.engine
                        .read_view(volume, view, block * BLOCK_SIZE, &mut buffer)
                {
                    let what = match view {
                        View::Volume => String::new(),
                        View::Snapshot(id) => format!(" snapshot {id}"),
                    };
                    report
                        .checksum_mismatches
                        .push(format!("volume {volume}{what} block {block}: {error}"));
                }
            }
        };
        for (volume, chunk, entry) in &maps.chunks {
            check(*volume, View::Volume, *chunk, entry);
        }
        // Saved entries are what their snapshot reads there.
        for (volume, snapshot, chunk, entry) in &maps.saved {
            check(*volume, View::Snapshot(*snapshot), *chunk, entry);
        }
    }

    /// Applies the journal, checkpoints and stops the background thread.
    /// Later I/O answers `ShuttingDown`.
    pub fn shutdown(&self) -> Result<(), StoreError> {
        {
            let mut state = self.engine.lock();
            state.shutting_down = true;
            self.engine.changed.notify_all();
            self.engine.applier_wake.notify_all();
            self.engine.journal_wake.notify_all();
        }
        if self.engine.background == Background::Inline {
            // What the threads would do before they end: write, apply
            // and checkpoint everything.
            if let Err(error) = self.engine.run_background_inline() {
                tracing::warn!(pool = %self.record.name, %error, "finishing the background work failed");
            }
        }
        let mut threads: Vec<_> = self
            .threads
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .drain(..)
            .collect();
        // The write-back thread is the last (see `open`): it is stopped
        // once nothing can hand it more, and ends when it has started what
        // it was given.
        let writeback = threads.pop();
        // The applier first: it finishes only once the journal writer has
        // written and it has applied every record.
        for handle in threads {
            let _ = handle.join();
        }
        self.engine.writeback.stop();
        if let Some(handle) = writeback {
            let _ = handle.join();
        }
        match self.engine.lock().failed.clone() {
            Some(reason) => Err(StoreError::Fatal(reason)),
            None => Ok(()),
        }
    }

    /// Removes an empty pool: wipes its superblock, deletes its metadata, and
    /// deletes the device file if the pool created it.
    pub fn destroy(self: Arc<Self>) -> Result<(), StoreError> {
        let count = self.volumes().len();
        if count > 0 {
            return Err(StoreError::PoolNotEmpty {
                pool: self.record.name.clone(),
                count,
            });
        }
        let _ = self.shutdown();
        let path = &self.record.device_path;
        self.engine
            .disk
            .write_at(&[0u8; SUPERBLOCK_BYTES as usize], 0)
            .and_then(|()| self.engine.disk.sync_data())
            .map_err(|error| {
                StoreError::io(
                    format!("wiping the superblock of {}", path.display()),
                    error,
                )
            })?;
        let metadata_path = self.engine.metadata.path().to_path_buf();
        std::fs::remove_file(&metadata_path).map_err(|error| {
            StoreError::io(format!("removing {}", metadata_path.display()), error)
        })?;
        if self.record.created_file {
            std::fs::remove_file(path)
                .map_err(|error| StoreError::io(format!("removing {}", path.display()), error))?;
        }
        Ok(())
    }

    fn find(&self, name: &VolumeName) -> Result<VolumeId, StoreError> {
        let state = self.engine.lock();
        state
            .volumes
            .iter()
            .find(|(_, volume)| !volume.deleted && &volume.record.name == name)
            .map(|(id, _)| *id)
            .ok_or_else(|| StoreError::VolumeNotFound(name.clone()))
    }

    fn describe(&self, id: VolumeId, volume: &VolumeState) -> VolumeInfo {
        VolumeInfo {
            name: volume.record.name.clone(),
            id,
            pool: self.record.name.clone(),
            size_bytes: volume.record.size_bytes,
            allocated_bytes: volume.map.len() * CHUNK_BYTES,
            created_unix_seconds: volume.record.created_unix_seconds,
            checksum_errors: volume.checksum_errors,
        }
    }

    fn metadata_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.engine
            .metadata_lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Makes a version 2 pool one of version 3, right after its replay and
/// checkpoint (the journal is empty, and no I/O was accepted): zeroes the
/// first 8 KiB of the old journal, which become the active set's two
/// slots (neither valid: every region counts until the first slot is
/// written), flushes, then writes the new superblock and flushes. A crash
/// before the superblock leaves a version 2 pool with an empty journal
/// (its next record would be in the new geometry's epoch anyway); after
/// it, a version 3 one. Old records left in the journal never replay:
/// their epochs are older than the checkpoint's.
fn upgrade_to_current(
    engine: Arc<Engine>,
    superblock: &Superblock,
) -> Result<Arc<Engine>, StoreError> {
    let layout = Layout::compute(superblock.layout.device_bytes)?;
    let engine = Arc::try_unwrap(engine)
        .map_err(|_| StoreError::Fatal("the pool is in use while it is upgraded".into()))?;
    {
        let state = engine.lock();
        assert!(
            state.unapplied.is_empty() && state.tail == state.head,
            "a pool is upgraded with an empty journal"
        );
    }
    let disk = engine.disk.clone();
    let offset = layout
        .active_set_offset()
        .expect("version 3 has an active set");
    let new_superblock = Superblock {
        pool_uuid: superblock.pool_uuid,
        layout,
    };
    disk.write_at(&vec![0u8; layout.active_set_bytes as usize], offset)
        .and_then(|()| disk.sync_data())
        .and_then(|()| disk.write_at(&new_superblock.encode(), 0))
        .and_then(|()| disk.sync_data())
        .map_err(|error| StoreError::io("upgrading the pool to format version 3", error))?;
    tracing::info!(pool = %engine.pool_name, "pool upgraded from format version 2 to 3");
    let engine = Arc::new(Engine { layout, ..engine });
    engine.reset_active_set(0)?;
    Ok(engine)
}

/// The superblock at the start of `disk`; `path` names it in errors.
fn read_superblock(disk: &dyn Disk, path: &Path) -> Result<Superblock, StoreError> {
    let mut block = vec![0u8; SUPERBLOCK_BYTES as usize];
    disk.read_at(&mut block, 0)
        .map_err(|_| StoreError::NotAPool {
            path: path.to_path_buf(),
            reason: "too short to hold a superblock".into(),
        })?;
    Superblock::decode(path, &block)
}

/// The maps of a pool, sorted, for the scan.
#[derive(Default, PartialEq)]
struct Maps {
    volumes: Vec<(VolumeId, u64, u64)>,
    chunks: Vec<(VolumeId, u64, ChunkEntry)>,
    snapshots: Vec<(VolumeId, SnapshotId, SnapshotRecord)>,
    saved: Vec<(VolumeId, SnapshotId, u64, ChunkEntry)>,
    refcounts: Vec<(u32, u32)>,
}

impl Maps {
    fn sort(&mut self) {
        self.volumes.sort_unstable_by_key(|(id, _, _)| *id);
        self.chunks
            .sort_unstable_by_key(|(id, chunk, _)| (*id, *chunk));
        self.snapshots
            .sort_unstable_by_key(|(id, snapshot, _)| (*id, *snapshot));
        self.saved
            .sort_unstable_by_key(|(id, snapshot, chunk, _)| (*id, *snapshot, *chunk));
        self.refcounts.sort_unstable();
    }
}

/// Reports every way the database differs from the maps in memory.
fn compare_stored(memory: &Maps, stored: crate::metadata::Loaded, report: &mut ScanReport) {
    let mut stored = Maps {
        volumes: stored
            .volumes
            .into_iter()
            .map(|(id, record)| (id, record.epoch, record.size_bytes))
            .collect(),
        chunks: stored.chunks,
        snapshots: stored.snapshots,
        saved: stored.saved,
        refcounts: stored.refcounts,
    };
    stored.sort();
    let mut differ = |what: &str, memory_count: usize, stored_count: usize, same: bool| {
        if !same {
            report.problems.push(format!(
                "{what} in memory ({memory_count} entries) differ from the database ({stored_count} entries)"
            ));
        }
    };
    differ(
        "volumes",
        memory.volumes.len(),
        stored.volumes.len(),
        memory.volumes == stored.volumes,
    );
    differ(
        "chunk maps",
        memory.chunks.len(),
        stored.chunks.len(),
        memory.chunks == stored.chunks,
    );
    differ(
        "snapshots",
        memory.snapshots.len(),
        stored.snapshots.len(),
        memory.snapshots == stored.snapshots,
    );
    differ(
        "saved maps",
        memory.saved.len(),
        stored.saved.len(),
        memory.saved == stored.saved,
    );
    differ(
        "reference counts",
        memory.refcounts.len(),
        stored.refcounts.len(),
        memory.refcounts == stored.refcounts,
    );
}

impl Drop for Pool {
    fn drop(&mut self) {
        // Dropped while a panic unwinds (a broken assertion): finishing the
        // background work could meet the same assertion, and a second
        // panic aborts the process (the simulator's seed with it).
        if std::thread::panicking() {
            return;
        }
        let _ = self.shutdown();
    }
}

fn check_volume_size(size_bytes: u64) -> Result<(), StoreError> {
    if size_bytes == 0 {
        return Err(StoreError::SizeZero);
    }
    if size_bytes > VOLUME_MAX_BYTES {
        return Err(StoreError::SizeTooLarge {
            size_bytes,
            maximum_bytes: VOLUME_MAX_BYTES,
        });
    }
    if !size_bytes.is_multiple_of(BLOCK_SIZE) {
        return Err(StoreError::SizeUnaligned(size_bytes));
    }
    Ok(())
}
