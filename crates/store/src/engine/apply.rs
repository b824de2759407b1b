//! The background work of a pool: make journal records durable, apply them
//! in place (data, checksums, chunk maps) and checkpoint.
//!
//! Ordering, step by step (also in `docs/store-format.md`):
//! 1. A record is applied only once durable in the journal, so in-place data
//!    never runs ahead of the log that can redo it.
//! 2. Applying writes data in place and updates the in-memory maps and
//!    checksum cache; none of it needs to be durable yet.
//! 3. A checkpoint writes the dirty checksum pages, flushes the device, then
//!    commits the changed map entries and the new journal start in one redb
//!    transaction. Only then is the journal space before it reused.
//!    A crash anywhere replays from the previous checkpoint, which redoes
//!    every step above idempotently.

use super::active::direct_runs;
use super::{bug, DeferredFree, Engine, FreeReason, SnapshotState, State};
use crate::checksums::{ChecksumTable, CACHE_PAGES_MAX};
use crate::chunk_map::ChunkEntry;
use crate::layout::{BLOCKS_PER_CHUNK, BLOCK_BYTES, CHUNK_BYTES};
use crate::metadata::{Changes, Checkpoint, SnapshotRecord};
use crate::record::{Record, RecordBody};
use crate::StoreError;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long written records may wait before the applier takes them.
const APPLY_DELAY: Duration = Duration::from_millis(5);
/// Apply at once when this much data is waiting.
pub(super) const APPLY_BATCH_MIN_BYTES: u64 = 4 << 20;
/// At most this much data per apply pass.
const APPLY_BATCH_MAX_BYTES: u64 = 16 << 20;
/// Bounds replay time after a crash.
const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);
/// Drops the blocks of `writes` that a later write of the same pass writes
/// again: every record of a pass is durable, so replay redoes both, and
/// only the last data needs to reach the device now.
fn drop_superseded(writes: Vec<InPlace>) -> Vec<InPlace> {
    let blocks: usize = writes.iter().map(|write| write.blocks).sum();
    let mut last_writer = std::collections::HashMap::with_capacity(blocks);
    for (index, write) in writes.iter().enumerate() {
        for block in 0..write.blocks as u64 {
            last_writer.insert(write.device_offset + block * BLOCK_BYTES, index);
        }
    }
    if last_writer.len() == blocks {
        return writes;
    }
    let mut kept = Vec::with_capacity(writes.len());
    for (index, write) in writes.into_iter().enumerate() {
        let mut run_start = None;
        for block in 0..=write.blocks {
            let keep = block < write.blocks
                && last_writer[&(write.device_offset + block as u64 * BLOCK_BYTES)] == index;
            match (keep, run_start) {
                (true, None) => run_start = Some(block),
                (false, Some(start)) => {
                    kept.push(InPlace {
                        record: write.record.clone(),
                        first_index: write.first_index + start,
                        blocks: block - start,
                        device_offset: write.device_offset + start as u64 * BLOCK_BYTES,
                    });
                    run_start = None;
                }
                _ => {}
            }
        }
    }
    kept
}

enum Batch {
    Applied,
    Nothing,
    NeedsCheckpoint,
}

/// Takes every change since the last checkpoint out of the dirty sets, in
/// key order: the same changes make the same transaction, so a simulated
/// run does not depend on the sets' hashing.
fn collect_changes(state: &mut State) -> Changes {
    let live = |state: &State, volume: &trireme_types::VolumeId| {
        state
            .volumes
            .get(volume)
            .filter(|volume| !volume.deleted)
            .is_some()
    };
    let mut chunk_keys: Vec<_> = state.dirty_chunks.drain().collect();
    chunk_keys.sort_unstable();
    let chunks = chunk_keys
        .into_iter()
        .filter(|(volume, _)| live(state, volume))
        .map(|(volume, chunk)| ((volume, chunk), state.volumes[&volume].map.get(chunk)))
        .collect();
    let mut saved_keys: Vec<_> = state.dirty_saved.drain().collect();
    saved_keys.sort_unstable();
    let saved = saved_keys
        .into_iter()
        .filter(|(volume, _, _)| live(state, volume))
        .filter_map(|(volume, snapshot, chunk)| {
            let volume_state = &state.volumes[&volume];
            // A deleted snapshot's rows go with its record.
            let index = volume_state.snapshot_index(snapshot)?;
            Some((
                (volume, snapshot, chunk),
                volume_state.snapshots[index].saved.get(chunk),
            ))
        })
        .collect();
    let mut refcount_keys: Vec<_> = state.dirty_refcounts.drain().collect();
    refcount_keys.sort_unstable();
    let refcounts = refcount_keys
        .into_iter()
        .map(|physical| {
            (
                physical,
                state.refcounts.get(&physical).copied().unwrap_or(1),
            )
        })
        .collect();
    let mut snapshot_keys: Vec<_> = state.dirty_snapshots.drain().collect();
    snapshot_keys.sort_unstable();
    let snapshots = snapshot_keys
        .into_iter()
        .filter(|(volume, _)| live(state, volume))
        .map(|(volume, snapshot)| {
            let volume_state = &state.volumes[&volume];
            let record = volume_state
                .snapshot_index(snapshot)
                .map(|index| volume_state.snapshots[index].record);
            ((volume, snapshot), record)
        })
        .collect();
    let mut volume_keys: Vec<_> = state.dirty_volumes.drain().collect();
    volume_keys.sort_unstable();
    let volumes = volume_keys
        .into_iter()
        .map(|volume| {
            let record = state
                .volumes
                .get(&volume)
                .filter(|volume| !volume.deleted)
                .map(|volume| volume.record.clone());
            (volume, record)
        })
        .collect();
    Changes {
        chunks,
        saved,
        refcounts,
        volumes,
        snapshots,
    }
}

/// True if `record` writes in place into a chunk filled by a redirect that
/// is not yet checkpointed.
fn writes_into_fresh_chunk(state: &State, record: &Record) -> bool {
    if state.fresh_since_checkpoint.is_empty() || record.is_redirect() {
        return false;
    }
    let RecordBody::Write { .. } = &record.body else {
        return false;
    };
    let Some(volume) = state.volumes.get(&record.volume) else {
        return false;
    };
    let first_chunk = record.first_block / BLOCKS_PER_CHUNK;
    let end_chunk = record.end_block().div_ceil(BLOCKS_PER_CHUNK);
    (first_chunk..end_chunk).any(|chunk| {
        volume
            .map
            .get(chunk)
            .is_some_and(|entry| state.fresh_since_checkpoint.contains(&entry.physical))
    })
}

/// One in-place write: a run of blocks of one record at one device offset.
struct InPlace {
    record: Arc<Record>,
    first_index: usize,
    blocks: usize,
    device_offset: u64,
}

/// Blocks copied from a shared chunk to its private copy before a write
/// lands there (copy-on-write), in physical block numbers.
struct CopyBlocks {
    from_block: u64,
    to_block: u64,
    blocks: u64,
}

/// The written-bitmap bits of blocks `[from, to)` of a chunk.
fn block_mask(from: u64, to: u64) -> u16 {
    (((1u32 << to) - 1) & !((1u32 << from) - 1)) as u16
}

pub fn run_applier(engine: Arc<Engine>) {
    let mut last_checkpoint = Instant::now();
    loop {
        let (stop, urgent) = {
            let mut state = engine.lock();
            let waiting_since = Instant::now();
            loop {
                if state.failed.is_some() {
                    return;
                }
                let pending = state.written_sequence > state.applied_sequence;
                let checkpoint_due = state.applied_position > state.tail
                    && last_checkpoint.elapsed() >= CHECKPOINT_INTERVAL;
                if state.applier_paused && !state.shutting_down {
                    state = engine.wait(state);
                    continue;
                }
                if state.urgent
                    || state.shutting_down
                    || checkpoint_due
                    || !state.activation_wanted.is_empty()
                    || state.checkpoint_wanted
                    || (pending
                        && (state.unapplied_bytes >= APPLY_BATCH_MIN_BYTES
                            || waiting_since.elapsed() >= APPLY_DELAY))
                {
                    break;
                }
                let timeout = if pending {
                    APPLY_DELAY
                } else {
                    CHECKPOINT_INTERVAL
                };
                state.applier_asleep = true;
                state = engine
                    .applier_wake
                    .wait_timeout(state, timeout)
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .0;
                state.applier_asleep = false;
            }
            let urgent = state.urgent;
            state.urgent = false;
            (state.shutting_down, urgent)
        };
        // Regions writers asked for: activated here, off the journal
        // writer's thread (a slot write and a flush of the whole file), so
        // the journal never waits for it; meanwhile their writes take the
        // journal.
        engine.activate_wanted();
        if let Err(error) = engine.apply_all(false) {
            tracing::error!(pool = %engine.pool_name, %error, "applying the journal failed");
            return;
        }
        let (journal_half_full, frees_waiting) = {
            let mut state = engine.lock();
            state.checkpoint_wanted = false;
            (
                (state.head - state.tail) * 2 > engine.layout.journal_bytes
                    || state.checksums.dirty_pages() * 2 > CACHE_PAGES_MAX,
                Engine::frees_waiting(&state),
            )
        };
        if urgent
            || stop
            || journal_half_full
            || frees_waiting
            || last_checkpoint.elapsed() >= CHECKPOINT_INTERVAL
        {
            if let Err(error) = engine.checkpoint() {
                tracing::error!(pool = %engine.pool_name, %error, "checkpoint failed");
                return;
            }
            last_checkpoint = Instant::now();
        }
        if stop {
            let state = engine.lock();
            if state.unapplied.is_empty() && state.tail == state.head {
                return;
            }
        }
    }
}

impl Engine {
    /// Makes every record already in the journal file durable and applies
    /// it; with `everything_admitted`, first waits for the journal writer to
    /// write every record admitted so far (a sync, a scan).
    pub fn apply_all(&self, everything_admitted: bool) -> Result<(), StoreError> {
        let _applying = self
            .apply_lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let (target, needs_flush) = {
            let state = self.lock();
            if everything_admitted {
                (state.next_sequence - 1, true)
            } else {
                // Redirects and direct writes may be applied once written:
                // a stream of whole-chunk writes or small overwrites costs
                // no device flush here. That flush (of the whole pool file,
                // so of every dirty in-place page too) would stall the
                // applier, and the writers waiting for it, several times a
                // second. The checkpoint flushes before it commits what they
                // changed. Anything else (a pad at the end of a lap too)
                // waits to be durable.
                let target = state.written_sequence;
                let needs_flush = !bug!(self, apply_before_durable)
                    && state.unapplied.iter().any(|record| {
                        record.sequence > state.durable_sequence
                            && record.sequence <= target
                            && !record.applies_once_written()
                    });
                (target, needs_flush)
            }
        };
        if needs_flush {
            self.flush_to(target)
                .map_err(|error| StoreError::Fatal(error.to_string()))?;
        }
        loop {
            match self.apply_batch()? {
                Batch::Applied => {}
                Batch::Nothing => return Ok(()),
                Batch::NeedsCheckpoint => self.checkpoint_holding_apply_lock()?,
            }
        }
    }

    /// Applies one batch of records; false when there was none. A record
    /// that writes in place must be durable first; a redirect or a direct
    /// write only needs to be in the file, as its apply overwrites nothing
    /// that a crash could need.
    ///
    /// A record that would write in place into a chunk that a redirect
    /// filled since the last checkpoint ends the batch and asks for a
    /// checkpoint first: replay checks a redirect's chunks against its crcs
    /// to tell torn data, which an in-place write would make fail.
    fn apply_batch(&self) -> Result<Batch, StoreError> {
        let mut writes = Vec::new();
        let mut copies = Vec::new();
        let mut outcome = Batch::Applied;
        let batch: Vec<Arc<Record>> = {
            let mut state = self.lock();
            let mut batch = Vec::new();
            let mut bytes = 0;
            let durable = if bug!(self, apply_before_durable) {
                state.written_sequence
            } else {
                state.durable_sequence
            };
            for record in state.unapplied.iter() {
                let ready = record.sequence <= durable
                    || (record.applies_once_written() && record.sequence <= state.written_sequence);
                if !ready || (bytes >= APPLY_BATCH_MAX_BYTES && !batch.is_empty()) {
                    break;
                }
                bytes += record.data_bytes();
                batch.push(record.clone());
            }
            // A snapshot starts a batch of its own: the copies that
            // copy-on-write makes after it read chunks from the device, so
            // every in-place write before it must be there already.
            if let Some(at) = batch.iter().skip(1).position(|record| record.is_snapshot()) {
                batch.truncate(at + 1);
            }
            for (index, record) in batch.iter().enumerate() {
                // The rules this pass keeps (docs/store-format.md, step 5):
                // records apply in their journal order, without a gap, and
                // in-place data comes only from durable records (a
                // redirect or a direct write, which write nothing in place
                // when applied, once written).
                assert_eq!(
                    record.sequence,
                    state.applied_sequence + 1 + index as u64,
                    "journal sequences apply contiguously"
                );
                assert!(
                    record.sequence <= state.durable_sequence
                        || (record.applies_once_written()
                            && record.sequence <= state.written_sequence),
                    "record {} applied before it is durable (durable up to {})",
                    record.sequence,
                    state.durable_sequence
                );
                if writes_into_fresh_chunk(&state, record) {
                    batch.truncate(index);
                    outcome = Batch::NeedsCheckpoint;
                    break;
                }
                if let Err(reason) =
                    self.apply_to_maps(&mut state, record, &mut copies, &mut writes)
                {
                    self.fail(&mut state, reason.clone());
                    return Err(StoreError::Fatal(reason));
                }
            }
            batch
        };
        if batch.is_empty() {
            return Ok(match outcome {
                Batch::NeedsCheckpoint => Batch::NeedsCheckpoint,
                _ => Batch::Nothing,
            });
        }
        let writes = if batch.len() > 1 {
            drop_superseded(writes)
        } else {
            writes
        };
        // Copies first: their sources are shared chunks, which nothing in
        // this batch writes, and in-place writes later in the batch may
        // land in the chunks they fill.
        for copy in &copies {
            if let Err(error) = self.copy_blocks(copy) {
                let reason = format!(
                    "copy-on-write of pool block {} failed: {error}",
                    copy.from_block
                );
                let mut state = self.lock();
                self.fail(&mut state, reason.clone());
                return Err(StoreError::Fatal(reason));
            }
        }
        for write in &writes {
            let RecordBody::Write { data, .. } = &write.record.body else {
                unreachable!("only writes go in place")
            };
            let block = BLOCK_BYTES as usize;
            let bytes =
                &data[write.first_index * block..(write.first_index + write.blocks) * block];
            if let Err(error) = self.disk.write_at(bytes, write.device_offset) {
                let reason = format!(
                    "in-place write at byte {} failed: {error}",
                    write.device_offset
                );
                let mut state = self.lock();
                self.fail(&mut state, reason.clone());
                return Err(StoreError::Fatal(reason));
            }
        }
        // The pass's data is in place (in the page cache): its records
        // leave the overlay and give their memory back now, before the
        // write-back is started. Starting it blocks while the device's
        // queue is full (or the kernel throttles write-back for reads), for
        // tens of milliseconds under load. The in-place bytes stay held
        // (`unstarted_bytes`) until the write-back thread starts them, and
        // it gives them back slice by slice: writers waiting for room get
        // it as the device takes the data, not a pass at a time.
        let extents = self.pass_extents(&copies, &writes, &batch);
        let mut state = self.lock();
        state.unstarted_bytes += extents.iter().map(|(_, length)| length).sum::<u64>();
        // The copies are written: reads may go to the private chunks now,
        // and so may later passes' in-place writes to the shared ones.
        state.copying.clear();
        for record in &batch {
            let front = state
                .unapplied
                .pop_front()
                .expect("batch came from the front");
            assert_eq!(front.sequence, record.sequence, "records apply in order");
            if let Some(volume) = state.volumes.get_mut(&record.volume) {
                volume.overlay.remove(record);
            }
            state.applied_sequence = record.sequence;
            state.applied_position = record.position + record.journal_bytes;
            state.unapplied_bytes -= record.data_bytes();
        }
        state.validate(self.layout.journal_bytes);
        self.changed.notify_all();
        drop(state);
        if let Err(error) = self.start_writeback(extents) {
            let reason = format!("writing applied data back failed: {error}");
            let mut state = self.lock();
            self.fail(&mut state, reason.clone());
            return Err(StoreError::Fatal(reason));
        }
        Ok(outcome)
    }

    /// Updates maps, allocator and checksums for one record and lists its
    /// copies and in-place writes. Runs under the lock; does no data I/O.
    fn apply_to_maps(
        &self,
        state: &mut State,
        record: &Arc<Record>,
        copies: &mut Vec<CopyBlocks>,
        writes: &mut Vec<InPlace>,
    ) -> Result<(), String> {
        state.reserved_chunks -= record.reserved_chunks;
        let live = matches!(state.volumes.get(&record.volume), Some(volume) if !volume.deleted);
        if !live {
            // The volume was deleted after this record was written.
            if let RecordBody::Write { fresh_chunks, .. } = &record.body {
                state
                    .deferred_frees
                    .extend(fresh_chunks.iter().map(|&physical| DeferredFree {
                        physical,
                        why: FreeReason::Released,
                    }));
            }
            return Ok(());
        }
        match &record.body {
            RecordBody::Pad => {}
            RecordBody::Snapshot {
                id,
                created_unix_seconds,
                size_bytes,
            } => {
                let volume = state.volumes.get_mut(&record.volume).expect("live");
                volume.pending_snapshots.retain(|pending| pending != id);
                if volume.snapshot_index(*id).is_none() {
                    let record_epoch = volume.record.epoch;
                    volume.snapshots.push(SnapshotState {
                        id: *id,
                        record: SnapshotRecord {
                            epoch: record_epoch,
                            created_unix_seconds: *created_unix_seconds,
                            size_bytes: *size_bytes,
                        },
                        saved: Default::default(),
                    });
                    volume.record.epoch += 1;
                    state.dirty_snapshots.insert((record.volume, *id));
                    state.dirty_volumes.insert(record.volume);
                }
            }
            RecordBody::Write {
                block_crcs,
                fresh_chunks,
                ..
            } if !fresh_chunks.is_empty() => {
                self.apply_redirect(state, record, block_crcs, fresh_chunks)?;
            }
            RecordBody::Write {
                block_crcs, direct, ..
            } => {
                let first_chunk = record.first_block / BLOCKS_PER_CHUNK;
                let end_chunk = record.end_block().div_ceil(BLOCKS_PER_CHUNK);
                for chunk in first_chunk..end_chunk {
                    let chunk_first = chunk * BLOCKS_PER_CHUNK;
                    let from = record.first_block.max(chunk_first);
                    let to = record.end_block().min(chunk_first + BLOCKS_PER_CHUNK);
                    let mask = block_mask(from - chunk_first, to - chunk_first);
                    let volume_state = &state.volumes[&record.volume];
                    let birth = volume_state.record.epoch;
                    if !direct.is_empty() {
                        // Its data is in place already (written before the
                        // record); admission chose the chunk, and nothing
                        // applied since can have remapped it.
                        let expected = direct[(chunk - first_chunk) as usize];
                        match volume_state.map.get(chunk) {
                            Some(entry)
                                if entry.physical == expected
                                    && !state.is_shared(volume_state, entry) => {}
                            other => {
                                return Err(format!(
                                    "direct write {} went to physical chunk {expected}, but volume {} chunk {chunk} maps to {:?}",
                                    record.sequence,
                                    record.volume,
                                    other.map(|entry| entry.physical)
                                ))
                            }
                        }
                    }
                    let before = volume_state.map.get(chunk);
                    let mut entry = match before {
                        Some(entry) if !state.is_shared(volume_state, entry) => entry,
                        existing => {
                            let physical = state.allocator.allocate().ok_or_else(|| {
                                format!(
                                    "no free chunk for a reserved write (volume {}, chunk {chunk})",
                                    record.volume
                                )
                            })?;
                            let mut entry = ChunkEntry {
                                physical,
                                written: 0,
                                birth,
                            };
                            if let Some(shared) = existing {
                                // Copy-on-write: the blocks this record does
                                // not overwrite, with their checksums.
                                entry.written = shared.written & !mask;
                                self.copy_chunk(state, shared.physical, entry, copies)?;
                                state.release_entry(
                                    record.volume,
                                    chunk,
                                    shared,
                                    FreeReason::Released,
                                );
                            }
                            entry
                        }
                    };
                    entry.written |= mask;
                    // An overwrite of written blocks (every direct write,
                    // most journaled ones) leaves the entry as it was: the
                    // checkpoint has nothing to commit for it. Marking it
                    // anyway had each checkpoint of 4k random writes commit
                    // an unchanged entry per chunk written.
                    if before != Some(entry) {
                        let volume = state.volumes.get_mut(&record.volume).expect("live");
                        volume.map.set(chunk, Some(entry));
                        state.dirty_chunks.insert((record.volume, chunk));
                    }
                    for block in from..to {
                        let index = (block - record.first_block) as usize;
                        let bit = block % BLOCKS_PER_CHUNK;
                        let physical_block = entry.physical as u64 * BLOCKS_PER_CHUNK + bit;
                        state
                            .checksums
                            .set(&*self.disk, &self.layout, physical_block, block_crcs[index])
                            .map_err(|error| format!("loading checksums failed: {error}"))?;
                        if !direct.is_empty() {
                            continue;
                        }
                        state.replayed_in_place.insert(entry.physical);
                        let device_offset = self.layout.data_block_offset(physical_block);
                        match writes.last_mut() {
                            Some(last)
                                if Arc::ptr_eq(&last.record, record)
                                    && last.device_offset + last.blocks as u64 * BLOCK_BYTES
                                        == device_offset =>
                            {
                                last.blocks += 1
                            }
                            _ => writes.push(InPlace {
                                record: record.clone(),
                                first_index: index,
                                blocks: 1,
                                device_offset,
                            }),
                        }
                    }
                }
            }
            RecordBody::Zero => {
                let first_chunk = record.first_block / BLOCKS_PER_CHUNK;
                let end_chunk = record.end_block().div_ceil(BLOCKS_PER_CHUNK);
                let mapped = state.volumes[&record.volume]
                    .map
                    .mapped_in(first_chunk, end_chunk);
                for chunk in mapped {
                    let chunk_first = chunk * BLOCKS_PER_CHUNK;
                    let from = record.first_block.max(chunk_first) - chunk_first;
                    let to = record.end_block().min(chunk_first + BLOCKS_PER_CHUNK) - chunk_first;
                    let mask = block_mask(from, to);
                    let volume_state = &state.volumes[&record.volume];
                    let entry = volume_state.map.get(chunk).expect("listed as mapped");
                    if entry.written & mask == 0 {
                        continue;
                    }
                    let snapshot_reads = volume_state
                        .newest_snapshot_epoch()
                        .is_some_and(|epoch| entry.birth <= epoch);
                    let birth = volume_state.record.epoch;
                    let written = entry.written & !mask;
                    let replacement = if snapshot_reads {
                        // The newest snapshot keeps the entry as it was; the
                        // volume keeps the rest of the chunk through a
                        // second reference to it (no data moves).
                        state.release_entry(record.volume, chunk, entry, FreeReason::Released);
                        if written != 0 {
                            state.add_reference(entry.physical);
                        }
                        ChunkEntry {
                            written,
                            birth,
                            ..entry
                        }
                    } else {
                        // Only the written-bitmap of this entry changes;
                        // other entries sharing the chunk keep theirs.
                        if written == 0 {
                            state.drop_reference(entry.physical, FreeReason::Released);
                        }
                        ChunkEntry { written, ..entry }
                    };
                    let volume = state.volumes.get_mut(&record.volume).expect("live");
                    volume.map.set(chunk, (written != 0).then_some(replacement));
                    state.dirty_chunks.insert((record.volume, chunk));
                }
            }
        }
        Ok(())
    }

    /// Lists the copy of `entry.written` blocks from `from_physical` into
    /// `entry.physical` and copies their checksums.
    fn copy_chunk(
        &self,
        state: &mut State,
        from_physical: u32,
        entry: ChunkEntry,
        copies: &mut Vec<CopyBlocks>,
    ) -> Result<(), String> {
        state.replayed_in_place.insert(entry.physical);
        let earlier = state.copying.insert(entry.physical, from_physical);
        assert!(earlier.is_none(), "a chunk is copied into once per pass");
        for bit in 0..BLOCKS_PER_CHUNK {
            if !entry.block_written(bit) {
                continue;
            }
            let from_block = from_physical as u64 * BLOCKS_PER_CHUNK + bit;
            let to_block = entry.physical as u64 * BLOCKS_PER_CHUNK + bit;
            state
                .checksums
                .get(&*self.disk, &self.layout, from_block)
                .and_then(|crc| {
                    state
                        .checksums
                        .set(&*self.disk, &self.layout, to_block, crc)
                })
                .map_err(|error| format!("loading checksums failed: {error}"))?;
            match copies.last_mut() {
                Some(last)
                    if last.from_block + last.blocks == from_block
                        && last.to_block + last.blocks == to_block =>
                {
                    last.blocks += 1
                }
                _ => copies.push(CopyBlocks {
                    from_block,
                    to_block,
                    blocks: 1,
                }),
            }
        }
        Ok(())
    }

    /// A pass's in-place data `(device offset, length)`, for write-back:
    /// copies, writes, and the data direct writes of `batch` put in place
    /// through the page cache before their records (`writeback`); not
    /// whole chunks written with `O_DIRECT`, which left nothing there.
    fn pass_extents(
        &self,
        copies: &[CopyBlocks],
        writes: &[InPlace],
        batch: &[Arc<Record>],
    ) -> Vec<(u64, u64)> {
        let mut extents = Vec::with_capacity(copies.len() + writes.len() + batch.len());
        for copy in copies {
            extents.push((
                self.layout.data_block_offset(copy.to_block),
                copy.blocks * BLOCK_BYTES,
            ));
        }
        for write in writes {
            extents.push((write.device_offset, write.blocks as u64 * BLOCK_BYTES));
        }
        let bypassed = self.disk.direct_writes_bypass_cache();
        for record in batch {
            if bypassed && record.is_direct_whole_chunks() {
                continue;
            }
            if let RecordBody::Write { direct, .. } = &record.body {
                for (device_offset, range) in direct_runs(&self.layout, record, direct) {
                    extents.push((device_offset, range.len() as u64));
                }
            }
        }
        extents
    }

    fn copy_blocks(&self, copy: &CopyBlocks) -> std::io::Result<()> {
        let mut data = vec![0u8; (copy.blocks * BLOCK_BYTES) as usize];
        self.disk
            .read_at(&mut data, self.layout.data_block_offset(copy.from_block))?;
        self.disk
            .write_at(&data, self.layout.data_block_offset(copy.to_block))
    }

    /// Points whole chunks at their fresh chunks; the entries they replace
    /// are released (kept by a snapshot that reads them, else freed after
    /// the next checkpoint or one reference fewer).
    fn apply_redirect(
        &self,
        state: &mut State,
        record: &Record,
        block_crcs: &[u32],
        fresh_chunks: &[u32],
    ) -> Result<(), String> {
        let first_chunk = record.first_block / BLOCKS_PER_CHUNK;
        for (index, physical) in fresh_chunks.iter().enumerate() {
            let chunk = first_chunk + index as u64;
            let volume = state.volumes.get_mut(&record.volume).expect("live");
            let birth = volume.record.epoch;
            let replaced = volume.map.get(chunk);
            volume.map.set(
                chunk,
                Some(ChunkEntry {
                    physical: *physical,
                    written: u16::MAX,
                    birth,
                }),
            );
            state.dirty_chunks.insert((record.volume, chunk));
            if let Some(old) = replaced {
                assert_ne!(old.physical, *physical, "a fresh chunk was already mapped");
                state.release_entry(record.volume, chunk, old, FreeReason::Replaced);
            }
            state.fresh_since_checkpoint.insert(*physical);
            let per_chunk = BLOCKS_PER_CHUNK as usize;
            state
                .checksums
                .set_run(
                    &*self.disk,
                    &self.layout,
                    *physical as u64 * BLOCKS_PER_CHUNK,
                    &block_crcs[index * per_chunk..(index + 1) * per_chunk],
                )
                .map_err(|error| format!("loading checksums failed: {error}"))?;
        }
        Ok(())
    }

    /// Writes checksums, flushes, and commits maps and the journal start;
    /// then releases the chunks freed before it. Never runs during an apply
    /// pass, so it always sees the maps at a record boundary.
    pub fn checkpoint(&self) -> Result<(), StoreError> {
        let _applying = self
            .apply_lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        self.checkpoint_holding_apply_lock()
    }

    fn checkpoint_holding_apply_lock(&self) -> Result<(), StoreError> {
        let _metadata = self
            .metadata_lock
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        self.checkpoint_holding_locks()
    }

    /// A checkpoint by a caller that holds the apply lock and the metadata
    /// lock (snapshot deletion, clones, rollback, volume changes: they
    /// change the maps in memory and commit them here, in one transaction).
    pub(super) fn checkpoint_holding_locks(&self) -> Result<(), StoreError> {
        let since = Instant::now();
        let (changes, pages, checkpoint, freed) = {
            let mut state = self.lock();
            // Chunks freed so far; they stay listed (and count as coming
            // back, for writers waiting for space) until the commit.
            let freed = state.deferred_frees.len();
            let changes = collect_changes(&mut state);
            let checkpoint = Checkpoint {
                epoch: state.checkpoint_epoch,
                position: state.applied_position,
                next_sequence: state.applied_sequence + 1,
            };
            // The checkpoint never passes a record that is not applied, nor
            // one not in the journal file (the flush below makes those
            // durable before the commit), and never moves back.
            assert!(
                state
                    .unapplied
                    .front()
                    .is_none_or(|first| first.sequence == checkpoint.next_sequence
                        && first.position == checkpoint.position),
                "a checkpoint passes an unapplied record"
            );
            assert!(checkpoint.next_sequence <= state.written_sequence + 1);
            assert!(checkpoint.position >= state.tail, "a checkpoint moves back");
            (changes, state.checksums.collect_dirty(), checkpoint, freed)
        };
        let result = ChecksumTable::write_pages(&*self.disk, &self.layout, &pages)
            .and_then(|()| self.disk.sync_data())
            .map_err(|error| StoreError::io("writing checksums for a checkpoint", error))
            .and_then(|()| self.metadata.checkpoint(&changes, checkpoint));
        let mut state = self.lock();
        if let Err(error) = result {
            self.fail(&mut state, format!("checkpoint failed: {error}"));
            return Err(error);
        }
        state.stalls.checkpoints.add(since.elapsed());
        state.tail = checkpoint.position;
        state.checksums.mark_clean(&pages);
        state.fresh_since_checkpoint.clear();
        state.replayed_in_place.clear();
        state.validate(self.layout.journal_bytes);
        self.changed.notify_all();
        drop(state);
        self.retire_regions(checkpoint.next_sequence)?;
        let state = self.lock();
        if freed == 0 {
            return Ok(());
        }
        // The maps that free these chunks are durable now, so their data
        // is needed by no replay: their space goes back to the host file
        // system, in runs, before the allocator may hand them out again
        // (a hole punched after a new write would destroy it). Only this
        // checkpoint drains the list, so its first `freed` entries stay
        // put while the lock is let go for the punching.
        // Chunks an overwrite replaced keep their space, up to the warm
        // limit: the overwrites that freed them take them again first. A
        // sequential overwrite stream otherwise punched ~400 MiB a
        // checkpoint and filled the same holes again, each write an
        // allocating one on the host file system (J5 of bench/steady.sh:
        // 8% slower than on a preallocated pool).
        let mut warm_room = state.allocator.warm_room();
        let mut warm = Vec::new();
        let mut released = Vec::with_capacity(freed);
        for index in 0..freed {
            let DeferredFree { physical, why } = state.deferred_frees[index];
            if why == FreeReason::Replaced && warm_room > 0 {
                warm_room -= 1;
                warm.push(physical);
            } else {
                released.push(physical);
            }
        }
        drop(state);
        self.give_back(&released);
        let mut state = self.lock();
        state.deferred_frees.drain(..freed);
        for physical in released {
            state.allocator.free(physical);
        }
        for physical in warm {
            assert!(state.allocator.free_warm(physical), "warm room was counted");
        }
        state.validate(self.layout.journal_bytes);
        self.changed.notify_all();
        Ok(())
    }

    /// Punches the chunks' space out of a file-backed pool (`fallocate`
    /// `PUNCH_HOLE`), one call per run of consecutive chunks. Called only
    /// for chunks that no durable map or replayable record needs, and that
    /// the allocator does not hold (see the checkpoint). A file system
    /// without hole punching turns it off for the session; any other
    /// failure only leaves the space in the file, and is logged.
    pub(super) fn give_back(&self, chunks: &[u32]) {
        if chunks.is_empty() {
            return;
        }
        let mut sorted = chunks.to_vec();
        sorted.sort_unstable();
        let mut runs: Vec<(u32, u32)> = Vec::new();
        for physical in sorted {
            match runs.last_mut() {
                Some((first, count)) if *first + *count == physical => *count += 1,
                _ => runs.push((physical, 1)),
            }
        }
        self.punch_runs(&runs);
    }

    /// Punches runs `(first chunk, count)` of the data region, if this
    /// pool gives space back at all.
    pub(super) fn punch_runs(&self, runs: &[(u32, u32)]) {
        if !self.punch_holes.load(Ordering::Relaxed) {
            return;
        }
        for (first, count) in runs {
            let offset = self.layout.data_offset + *first as u64 * CHUNK_BYTES;
            let length = *count as u64 * CHUNK_BYTES;
            if let Err(error) = self.disk.punch_hole(offset, length) {
                if error.raw_os_error() == Some(libc::EOPNOTSUPP) {
                    tracing::info!(pool = %self.pool_name, "the file system cannot punch holes; freed chunks keep their space in the pool file");
                    self.punch_holes.store(false, Ordering::Relaxed);
                    return;
                }
                tracing::warn!(pool = %self.pool_name, %error, offset, length, "giving freed space back to the file system failed; it stays in the pool file until reused");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use trireme_types::{BlockBuf, VolumeId};

    fn record(sequence: u64, blocks: u64) -> Arc<Record> {
        Arc::new(Record::new(
            sequence,
            0,
            0,
            VolumeId(1),
            0,
            blocks,
            RecordBody::Write {
                data: std::sync::Arc::new(BlockBuf::zeroed((blocks * BLOCK_BYTES) as usize)),
                block_crcs: vec![0; blocks as usize],
                fresh_chunks: Vec::new(),
                direct: Vec::new(),
            },
            0,
        ))
    }

    fn in_place(record: &Arc<Record>, first_index: usize, blocks: usize, block: u64) -> InPlace {
        InPlace {
            record: record.clone(),
            first_index,
            blocks,
            device_offset: block * BLOCK_BYTES,
        }
    }

    /// (sequence, first index, blocks, device block) of each write kept.
    fn kept(writes: Vec<InPlace>) -> Vec<(u64, usize, usize, u64)> {
        drop_superseded(writes)
            .iter()
            .map(|write| {
                (
                    write.record.sequence,
                    write.first_index,
                    write.blocks,
                    write.device_offset / BLOCK_BYTES,
                )
            })
            .collect()
    }

    #[test]
    fn a_block_written_again_later_in_the_pass_is_written_once_with_the_later_data() {
        let (first, second, third) = (record(1, 8), record(2, 2), record(3, 1));
        let writes = vec![
            in_place(&first, 0, 8, 100),  // blocks 100..108
            in_place(&second, 0, 2, 103), // 103, 104 again
            in_place(&third, 0, 1, 107),  // 107 again
            in_place(&third, 0, 1, 500),  // elsewhere: untouched
        ];
        assert_eq!(
            kept(writes),
            vec![
                (1, 0, 3, 100),
                (1, 5, 2, 105),
                (2, 0, 2, 103),
                (3, 0, 1, 107),
                (3, 0, 1, 500)
            ]
        );
    }

    #[test]
    fn writes_to_distinct_blocks_are_all_kept() {
        let (first, second) = (record(1, 2), record(2, 2));
        let writes = vec![in_place(&first, 0, 2, 10), in_place(&second, 0, 2, 12)];
        assert_eq!(kept(writes), vec![(1, 0, 2, 10), (2, 0, 2, 12)]);
    }
}
