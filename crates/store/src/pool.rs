//! [`Pool`]: create, open and manage a storage pool and its volumes.

use crate::device::{
    allocate_space, device_size, file_is_block_device, fill_zeros, lock_exclusive,
    open_or_create_device, random_u128,
};
use crate::engine::{open_engine, run_applier, run_journal_writer, Engine, VolumeState};
use crate::layout::{Layout, Superblock, CHUNK_BYTES, SUPERBLOCK_BYTES};
use crate::metadata::{Metadata, PoolRecord, VolumeRecord};
use crate::{StoreError, Volume};
use serde::Serialize;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use trireme_types::{DeviceClass, PoolId, PoolName, VolumeId, VolumeName, BLOCK_SIZE};

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
    /// The applier and the journal writer, joined at shutdown.
    threads: Mutex<Vec<JoinHandle<()>>>,
}

impl Pool {
    pub fn create(config: PoolConfig) -> Result<Arc<Pool>, StoreError> {
        let path = &config.device_path;
        let (file, device_bytes, created_file) = open_or_create_device(path, config.size_bytes)?;
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
        let mut block = vec![0u8; SUPERBLOCK_BYTES as usize];
        file.read_exact_at(&mut block, 0)
            .map_err(|_| StoreError::NotAPool {
                path: device_path.to_path_buf(),
                reason: "too short to hold a superblock".into(),
            })?;
        let superblock = Superblock::decode(device_path, &block)?;
        let actual_bytes =
            device_size(&file).map_err(|error| StoreError::io("sizing the pool device", error))?;
        if actual_bytes < superblock.layout.device_bytes {
            return Err(StoreError::NotAPool {
                path: device_path.to_path_buf(),
                reason: format!(
                    "device is {actual_bytes} bytes but the pool was made for {}",
                    superblock.layout.device_bytes
                ),
            });
        }
        let (metadata, loaded) = Metadata::open(metadata_path)?;
        if loaded.pool.uuid != superblock.pool_uuid {
            return Err(StoreError::MetadataMismatch {
                path: device_path.to_path_buf(),
                metadata: metadata_path.to_path_buf(),
            });
        }
        let record = loaded.pool.clone();
        let salt = (superblock.pool_uuid as u64) ^ ((superblock.pool_uuid >> 64) as u64);
        let engine = open_engine(file, superblock.layout, salt, metadata, loaded)?;
        let mut threads = Vec::new();
        for (role, body) in [
            ("apply", run_applier as fn(Arc<Engine>)),
            ("journal", run_journal_writer as fn(Arc<Engine>)),
        ] {
            let thread_engine = engine.clone();
            let handle = std::thread::Builder::new()
                .name(format!("{role}-{}", record.name))
                .spawn(move || body(thread_engine))
                .map_err(|error| StoreError::io(format!("starting the {role} thread"), error))?;
            threads.push(handle);
        }
        Ok(Arc::new(Pool {
            engine,
            record,
            threads: Mutex::new(threads),
        }))
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
            provisioned_bytes,
            volume_count,
            journal_bytes: self.engine.layout.journal_bytes,
            chunk_bytes: CHUNK_BYTES,
            checksum_errors: self.engine.checksum_errors.load(Ordering::Relaxed),
            failed: state.failed.clone(),
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
        };
        let id = self.engine.metadata.add_volume(&record)?;
        self.engine
            .lock()
            .volumes
            .insert(id, VolumeState::new(record));
        self.volume_info(name)
    }

    /// Deletes the volume and returns its chunks. Open handles of it answer
    /// `ShuttingDown` from then on.
    pub fn delete_volume(&self, name: &VolumeName) -> Result<(), StoreError> {
        let _metadata = self.metadata_lock();
        let id = self.find(name)?;
        self.engine
            .lock()
            .volumes
            .get_mut(&id)
            .expect("found")
            .deleted = true;
        // Records of the volume still in the journal are skipped when applied
        // or replayed: the volume id is never reused.
        if let Err(error) = self.engine.metadata.remove_volume(id) {
            self.engine
                .lock()
                .volumes
                .get_mut(&id)
                .expect("found")
                .deleted = false;
            return Err(error);
        }
        let mut state = self.engine.lock();
        let volume = state.volumes.remove(&id).expect("found");
        for (_, entry) in volume.map.iter() {
            state.allocator.free(entry.physical);
        }
        state.dirty_chunks.retain(|(volume, _)| *volume != id);
        self.engine.changed.notify_all();
        Ok(())
    }

    /// Grows a volume; shrinking is refused.
    pub fn grow_volume(
        &self,
        name: &VolumeName,
        new_size_bytes: u64,
    ) -> Result<VolumeInfo, StoreError> {
        check_volume_size(new_size_bytes)?;
        let _metadata = self.metadata_lock();
        let id = self.find(name)?;
        let mut record = self.engine.lock().volumes[&id].record.clone();
        if new_size_bytes < record.size_bytes {
            return Err(StoreError::ShrinkRefused {
                name: name.clone(),
                current_bytes: record.size_bytes,
                requested_bytes: new_size_bytes,
            });
        }
        record.size_bytes = new_size_bytes;
        self.engine.metadata.update_volume(id, &record)?;
        self.engine
            .lock()
            .volumes
            .get_mut(&id)
            .expect("found")
            .record = record;
        self.volume_info(name)
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

    /// Recomputes accounting from the chunk maps, compares the maps in
    /// memory with those in the database, and reads every written block
    /// through the checksum-verifying read path.
    pub fn scan(&self) -> Result<ScanReport, StoreError> {
        self.sync()?;
        let mut report = ScanReport {
            allocated_chunks_counted: 0,
            allocated_chunks_accounted: 0,
            blocks_checked: 0,
            checksum_mismatches: Vec::new(),
            problems: Vec::new(),
        };
        let (mut chunks, used) = {
            let state = self.engine.lock();
            let chunks: Vec<_> = state
                .volumes
                .iter()
                .filter(|(_, volume)| !volume.deleted)
                .flat_map(|(id, volume)| {
                    volume
                        .map
                        .iter()
                        .map(move |(chunk, entry)| (*id, chunk, entry))
                })
                .collect();
            // Chunks in use but not (or no longer) in a map: fresh chunks of
            // redirects not yet applied, and chunks freed at the next checkpoint.
            let in_flight: u64 = state
                .unapplied
                .iter()
                .map(|record| match &record.body {
                    crate::record::RecordBody::Write { fresh_chunks, .. } => {
                        fresh_chunks.len() as u64
                    }
                    _ => 0,
                })
                .sum();
            let used = state.allocator.used_count() - in_flight - state.deferred_frees.len() as u64;
            (chunks, used)
        };
        chunks.sort_unstable_by_key(|(volume, chunk, _)| (*volume, *chunk));
        report.allocated_chunks_counted = chunks.len() as u64;
        report.allocated_chunks_accounted = used;
        let mut physical_seen = std::collections::HashSet::new();
        for (volume, chunk, entry) in &chunks {
            if !physical_seen.insert(entry.physical) {
                report.problems.push(format!(
                    "physical chunk {} is mapped twice (volume {volume}, chunk {chunk})",
                    entry.physical
                ));
            }
        }
        let mut stored = self.engine.metadata.stored_chunks()?;
        stored.sort_unstable_by_key(|(volume, chunk, _)| (*volume, *chunk));
        if stored != chunks {
            report.problems.push(format!(
                "chunk maps in memory ({} entries) differ from the database ({} entries)",
                chunks.len(),
                stored.len()
            ));
        }
        self.check_blocks(&chunks, &mut report);
        Ok(report)
    }

    fn check_blocks(
        &self,
        chunks: &[(VolumeId, u64, crate::chunk_map::ChunkEntry)],
        report: &mut ScanReport,
    ) {
        let blocks_per_chunk = CHUNK_BYTES / BLOCK_SIZE;
        let mut buffer = vec![0u8; BLOCK_SIZE as usize];
        for (volume, chunk, entry) in chunks {
            for bit in 0..blocks_per_chunk {
                if !entry.block_written(bit) {
                    continue;
                }
                let block = chunk * blocks_per_chunk + bit;
                report.blocks_checked += 1;
                if let Err(error) = self.engine.read(*volume, block * BLOCK_SIZE, &mut buffer) {
                    report
                        .checksum_mismatches
                        .push(format!("volume {volume} block {block}: {error}"));
                }
            }
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
        let threads: Vec<_> = self
            .threads
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .drain(..)
            .collect();
        // The applier first: it finishes only once the journal writer has
        // written and it has applied every record.
        for handle in threads {
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
            .file
            .write_all_at(&[0u8; SUPERBLOCK_BYTES as usize], 0)
            .and_then(|()| self.engine.file.sync_all())
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

impl Drop for Pool {
    fn drop(&mut self) {
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
