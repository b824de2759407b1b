//! Opening a pool: load the maps, replay the journal, checkpoint.
//!
//! Replay starts at the checkpoint's position and sequence and accepts a
//! record only if its header is intact, it belongs to this pool (salt), it
//! was written in the epoch that followed the checkpoint, its sequence is the
//! next one, and its data matches its crc. The first record that fails ends
//! the journal: it was torn by the crash, or never written, and so was never
//! acknowledged as durable (a flush covers a record only after every record
//! before it is in the file). The pool then checkpoints under a new epoch
//! before accepting writes, so leftovers after the end can never be taken for
//! records later.

use super::EngineOptions;
use super::{Engine, SnapshotState, State, VolumeState};
use crate::chunk_map::ChunkEntry;
use crate::disk::Disk;
use crate::journal::{
    block_crcs, chunks_spanned, data_crc, decode_chunks_and_crcs, decode_redirect_payload,
    decode_snapshot_payload, RecordHeader, RecordKind, HEADER_BYTES, SNAPSHOT_PAYLOAD_BYTES,
};
use crate::layout::Layout;
use crate::layout::{BLOCKS_PER_CHUNK, CHUNK_BYTES};
use crate::metadata::{Loaded, Metadata};
use crate::record::{Record, RecordBody};
use crate::StoreError;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Condvar, Mutex};
use trireme_types::VolumeId;

pub fn open_engine(
    disk: Arc<dyn Disk>,
    options: EngineOptions,
    layout: Layout,
    pool_salt: u64,
    metadata: Metadata,
    loaded: Loaded,
) -> Result<Arc<Engine>, StoreError> {
    let mut state = State::new(&layout);
    for (id, record) in loaded.volumes {
        state.volumes.insert(id, VolumeState::new(record));
    }
    let invalid =
        |entry: &ChunkEntry| entry.physical as u64 >= layout.chunk_count || entry.written == 0;
    let mut orphans = std::collections::BTreeSet::new();
    // Map entries per physical chunk, to check the reference counts.
    let mut references: HashMap<u32, u32> = HashMap::new();
    for (volume, chunk, entry) in loaded.chunks {
        let Some(volume_state) = state.volumes.get_mut(&volume) else {
            orphans.insert(volume);
            continue;
        };
        if invalid(&entry) || entry.birth > volume_state.record.epoch {
            return Err(StoreError::Fatal(format!(
                "chunk map of volume {volume} has an invalid entry for chunk {chunk}"
            )));
        }
        *references.entry(entry.physical).or_default() += 1;
        volume_state.map.set(chunk, Some(entry));
    }
    for (volume, id, record) in loaded.snapshots {
        let Some(volume_state) = state.volumes.get_mut(&volume) else {
            orphans.insert(volume);
            continue;
        };
        if record.epoch >= volume_state.record.epoch {
            return Err(StoreError::Fatal(format!(
                "snapshot {id} of volume {volume} is newer than its volume"
            )));
        }
        volume_state.snapshots.push(SnapshotState {
            id,
            record,
            saved: Default::default(),
        });
    }
    for volume_state in state.volumes.values_mut() {
        volume_state
            .snapshots
            .sort_unstable_by_key(|snapshot| snapshot.record.epoch);
    }
    for (volume, id, chunk, entry) in loaded.saved {
        let Some(volume_state) = state.volumes.get_mut(&volume) else {
            orphans.insert(volume);
            continue;
        };
        let Some(index) = volume_state.snapshot_index(id) else {
            return Err(StoreError::Fatal(format!(
                "saved map of snapshot {id} of volume {volume} has no snapshot"
            )));
        };
        let snapshot = &mut volume_state.snapshots[index];
        if invalid(&entry) || entry.birth > snapshot.record.epoch {
            return Err(StoreError::Fatal(format!(
                "saved map of snapshot {id} of volume {volume} has an invalid entry for chunk {chunk}"
            )));
        }
        *references.entry(entry.physical).or_default() += 1;
        snapshot.saved.set(chunk, Some(entry));
    }
    for (physical, count) in loaded.refcounts {
        if count > 1 {
            state.refcounts.insert(physical, count);
        }
    }
    for (physical, count) in &references {
        let counted = state.refcounts.get(physical).copied().unwrap_or(1);
        if counted != *count {
            return Err(StoreError::Fatal(format!(
                "physical chunk {physical} is mapped {count} times but its reference count is {counted}"
            )));
        }
        state.allocator.mark_used(*physical);
    }
    if let Some(physical) = state
        .refcounts
        .keys()
        .find(|physical| !references.contains_key(physical))
    {
        return Err(StoreError::Fatal(format!(
            "physical chunk {physical} has a reference count but is not mapped"
        )));
    }
    for orphan in orphans {
        tracing::warn!(
            volume = orphan.0,
            "removing chunk-map entries of a deleted volume"
        );
        metadata.remove_orphans(orphan)?;
    }
    let checkpoint = loaded.checkpoint;
    state.head = checkpoint.position;
    state.tail = checkpoint.position;
    state.applied_position = checkpoint.position;
    state.next_sequence = checkpoint.next_sequence;
    state.applied_sequence = checkpoint.next_sequence - 1;
    state.written_sequence = state.applied_sequence;
    state.durable_sequence = state.applied_sequence;
    state.checkpoint_epoch = checkpoint.epoch;
    let punch_holes = !loaded.pool.preallocated && disk.can_punch_holes();
    let engine = Arc::new(Engine {
        pool_name: loaded.pool.name.clone(),
        disk,
        background: options.background,
        layout,
        pool_salt,
        epoch: checkpoint.epoch + 1,
        metadata,
        punch_holes: AtomicBool::new(punch_holes),
        state: Mutex::new(state),
        changed: Condvar::new(),
        applier_wake: Condvar::new(),
        journal_wake: Condvar::new(),
        partial_block_lock: Mutex::new(()),
        metadata_lock: Mutex::new(()),
        apply_lock: Mutex::new(()),
        writeback: Default::default(),
        snapshot_lock: Mutex::new(()),
        active_set_lock: Mutex::new(()),
        direct_writes: options.direct_writes,
        direct_sync: options.direct_sync,
        pipeline_batches: options.pipeline_batches,
        journal_tail: Default::default(),
        checksum_errors: AtomicU64::new(0),
        #[cfg(feature = "bug-switches")]
        bugs: options.bugs,
    });
    // Only these chunks can hold a direct write since the checkpoint; the
    // rest, replay fills exactly (`repair_active_regions`).
    let mapped_at_checkpoint: HashSet<u32> = references.into_keys().collect();
    let active_set = engine.load_active_set()?;
    let replayed = engine.replay(checkpoint.epoch)?;
    engine.apply_all(false)?;
    if let Some(active_set) = &active_set {
        let regions = active_set.as_ref().map(|(_, regions)| regions.clone());
        if let Some(regions) = &regions {
            engine.lock().recent_active_sets = [regions.clone(), regions.clone(), regions.clone()];
        }
        let repaired = engine.repair_active_regions(&regions, &mapped_at_checkpoint)?;
        if repaired > 0 {
            tracing::info!(pool = %engine.pool_name, blocks = repaired, "checksums of blocks written in place since the last checkpoint taken from their data");
        }
    }
    engine.lock().checkpoint_epoch = engine.epoch;
    engine.checkpoint()?;
    if let Some(active_set) = &active_set {
        engine.reset_active_set(active_set.as_ref().map_or(0, |(generation, _)| *generation))?;
    }
    if replayed > 0 {
        tracing::info!(pool = %engine.pool_name, records = replayed, "replayed the journal");
    }
    // Every free chunk's space goes back to the host, whatever an earlier
    // session left there: the maps just committed need none of them, and
    // no I/O is accepted yet. This also shrinks a pool file grown by a
    // trireme that did not give space back.
    let free_runs = engine.lock().allocator.free_runs();
    engine.punch_runs(&free_runs);
    Ok(engine)
}

impl Engine {
    /// The payload of the record at `physical` in the journal, or `None`
    /// when it does not match its header's crc (the journal's end: a
    /// record torn or never written).
    fn checked_payload(
        &self,
        physical: u64,
        header: &RecordHeader,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let mut payload = vec![0u8; header.data_bytes() as usize];
        self.disk
            .read_at(&mut payload, physical + HEADER_BYTES)
            .map_err(|error| StoreError::io("reading the journal", error))?;
        Ok((crc_fast::crc32_iscsi(&payload) == header.data_crc).then_some(payload))
    }

    /// A redirect replays only if its fresh chunks are free and hold the data
    /// its crcs describe (the header may have reached the disk before the
    /// data). They are then marked used at once, so that no record replayed
    /// before it can be given them.
    fn fresh_chunks_hold(
        &self,
        state: &mut State,
        fresh_chunks: &[u32],
        crcs: &[u32],
    ) -> Result<bool, StoreError> {
        let mut data = vec![0u8; CHUNK_BYTES as usize];
        for (index, physical) in fresh_chunks.iter().enumerate() {
            if *physical as u64 >= self.layout.chunk_count || state.allocator.is_used(*physical) {
                return Ok(false);
            }
            self.disk
                .read_at(
                    &mut data,
                    self.layout.data_offset + *physical as u64 * CHUNK_BYTES,
                )
                .map_err(|error| StoreError::io("reading redirected data", error))?;
            let expected =
                &crcs[index * BLOCKS_PER_CHUNK as usize..(index + 1) * BLOCKS_PER_CHUNK as usize];
            if block_crcs(&data) != expected {
                return Ok(false);
            }
        }
        for physical in fresh_chunks {
            state.allocator.mark_used(*physical);
        }
        Ok(true)
    }

    /// Reads valid records after the checkpoint into the unapplied queue.
    fn replay(&self, epoch: u64) -> Result<u64, StoreError> {
        let journal_size = self.layout.journal_bytes;
        let mut state = self.lock();
        let mut count = 0;
        loop {
            let position = state.head;
            if position - state.tail >= journal_size {
                break;
            }
            let physical = self.journal_physical(position);
            let mut header_bytes = [0u8; HEADER_BYTES as usize];
            self.disk
                .read_at(&mut header_bytes, physical)
                .map_err(|error| StoreError::io("reading the journal", error))?;
            let Some(header) = RecordHeader::decode(&header_bytes) else {
                break;
            };
            if header.pool_salt != self.pool_salt
                || header.epoch != epoch
                || header.sequence != state.next_sequence
            {
                break;
            }
            let lap_left = journal_size - position % journal_size;
            let (body, journal_bytes) = match header.kind {
                RecordKind::Pad => (RecordBody::Pad, lap_left),
                RecordKind::Snapshot if header.journal_bytes() <= lap_left => {
                    let mut payload = vec![0u8; SNAPSHOT_PAYLOAD_BYTES as usize];
                    self.disk
                        .read_at(&mut payload, physical + HEADER_BYTES)
                        .map_err(|error| StoreError::io("reading the journal", error))?;
                    if crc_fast::crc32_iscsi(&payload) != header.data_crc {
                        break;
                    }
                    let (id, created_unix_seconds, size_bytes) = decode_snapshot_payload(&payload);
                    (
                        RecordBody::Snapshot {
                            id: trireme_types::SnapshotId(id),
                            created_unix_seconds,
                            size_bytes,
                        },
                        header.journal_bytes(),
                    )
                }
                RecordKind::Zero if header.block_count > 0 => {
                    (RecordBody::Zero, header.journal_bytes())
                }
                RecordKind::Write
                    if header.block_count > 0 && header.journal_bytes() <= lap_left =>
                {
                    let mut data = trireme_types::BlockBuf::zeroed(header.data_bytes() as usize);
                    self.disk
                        .read_at(&mut data, physical + HEADER_BYTES)
                        .map_err(|error| StoreError::io("reading the journal", error))?;
                    let crcs = block_crcs(&data);
                    if data_crc(&crcs) != header.data_crc {
                        break;
                    }
                    (
                        RecordBody::Write {
                            data: std::sync::Arc::new(data),
                            block_crcs: crcs,
                            fresh_chunks: Vec::new(),
                            direct: Vec::new(),
                        },
                        header.journal_bytes(),
                    )
                }
                RecordKind::Checksums
                    if header.block_count > 0 && header.journal_bytes() <= lap_left =>
                {
                    let Some(payload) = self.checked_payload(physical, &header)? else {
                        break;
                    };
                    let chunks = chunks_spanned(header.first_block, header.block_count);
                    let (direct, crcs) = decode_chunks_and_crcs(&payload, chunks);
                    if direct
                        .iter()
                        .any(|physical| *physical as u64 >= self.layout.chunk_count)
                    {
                        break;
                    }
                    (
                        RecordBody::Write {
                            data: Default::default(),
                            block_crcs: crcs,
                            fresh_chunks: Vec::new(),
                            direct,
                        },
                        header.journal_bytes(),
                    )
                }
                RecordKind::Redirect
                    if header.block_count > 0 && header.journal_bytes() <= lap_left =>
                {
                    let Some(payload) = self.checked_payload(physical, &header)? else {
                        break;
                    };
                    let (fresh_chunks, crcs) =
                        decode_redirect_payload(&payload, header.block_count);
                    if !self.fresh_chunks_hold(&mut state, &fresh_chunks, &crcs)? {
                        break;
                    }
                    (
                        RecordBody::Write {
                            data: Default::default(),
                            block_crcs: crcs,
                            fresh_chunks,
                            direct: Vec::new(),
                        },
                        header.journal_bytes(),
                    )
                }
                _ => break,
            };
            if position + journal_bytes - state.tail > journal_size {
                break;
            }
            let record = Arc::new(Record::new(
                header.sequence,
                position,
                journal_bytes,
                VolumeId(header.volume),
                header.first_block,
                header.block_count,
                body,
                0,
            ));
            assert!(
                state
                    .unapplied
                    .back()
                    .is_none_or(|previous| previous.sequence + 1 == record.sequence
                        && previous.position + previous.journal_bytes == record.position),
                "replayed records follow one another"
            );
            state.unapplied_bytes += record.data_bytes();
            state.unapplied.push_back(record);
            state.head = position + journal_bytes;
            state.next_sequence += 1;
            state.written_sequence = header.sequence;
            state.durable_sequence = header.sequence;
            count += 1;
        }
        state.validate(journal_size);
        Ok(count)
    }
}
