//! The read path and block status.
//!
//! A read is planned under the lock (which blocks come from pending records,
//! which are zeros, which are on disk and with what checksum) and carried
//! out without it. The applier may move a block between planning and
//! reading; a checksum mismatch is therefore re-planned and re-read before
//! it counts as corruption: only a mismatch that repeats with the same
//! location and checksum is reported (EIO).

use super::VolumeState;
use super::{bug, Engine, State};
use crate::chunk_map::ChunkEntry;
use crate::layout::{BLOCKS_PER_CHUNK, BLOCK_BYTES};
use crate::record::{Record, RecordBody};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use trireme_types::{BlockStatusExtent, SnapshotId, TargetError, VolumeId};

const READ_ATTEMPTS: usize = 3;
/// Block status looks at most this many blocks per call (4 GiB); the NBD
/// client asks again for the rest.
const BLOCK_STATUS_MAX_BLOCKS: u64 = 1 << 20;

/// What a read reads: the volume (pending records, then its map), or one
/// of its snapshots (its view of the maps; nothing of it is pending).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum View {
    Volume,
    Snapshot(SnapshotId),
}

enum Step {
    Zero {
        blocks: u64,
    },
    Pending {
        record: Arc<Record>,
        first_block: u64,
        blocks: u64,
    },
    Disk {
        physical_block: u64,
        blocks: u64,
        crcs_from: usize,
    },
}

struct Plan {
    steps: Vec<Step>,
    crcs: Vec<u32>,
}

#[derive(PartialEq, Eq)]
struct Mismatch {
    block: u64,
    physical_block: u64,
    expected: u32,
}

impl Engine {
    pub fn read(
        &self,
        volume: VolumeId,
        offset: u64,
        buffer: &mut [u8],
    ) -> Result<(), TargetError> {
        self.read_view(volume, View::Volume, offset, buffer)
    }

    pub fn read_view(
        &self,
        volume: VolumeId,
        view: View,
        offset: u64,
        buffer: &mut [u8],
    ) -> Result<(), TargetError> {
        if buffer.is_empty() {
            return Ok(());
        }
        let length = buffer.len() as u64;
        if offset
            .checked_add(length)
            .is_none_or(|end| end > u64::MAX - BLOCK_BYTES)
        {
            return Err(TargetError::Invalid(format!(
                "range {offset}+{length} overflows"
            )));
        }
        if offset.is_multiple_of(BLOCK_BYTES) && length.is_multiple_of(BLOCK_BYTES) {
            return self.read_blocks(volume, view, offset / BLOCK_BYTES, buffer);
        }
        let first_block = offset / BLOCK_BYTES;
        let end_block = (offset + length).div_ceil(BLOCK_BYTES);
        let mut blocks = vec![0u8; ((end_block - first_block) * BLOCK_BYTES) as usize];
        self.read_blocks(volume, view, first_block, &mut blocks)?;
        let start = (offset - first_block * BLOCK_BYTES) as usize;
        buffer.copy_from_slice(&blocks[start..start + buffer.len()]);
        Ok(())
    }

    fn read_blocks(
        &self,
        volume: VolumeId,
        view: View,
        first_block: u64,
        buffer: &mut [u8],
    ) -> Result<(), TargetError> {
        let block_count = buffer.len() as u64 / BLOCK_BYTES;
        let mut previous: Vec<Mismatch> = Vec::new();
        for attempt in 0..READ_ATTEMPTS {
            let plan = {
                let mut state = self.lock();
                state.check_usable()?;
                self.plan(&mut state, volume, view, first_block, block_count)?
            };
            let mismatches = self
                .execute(&plan, first_block, buffer, false)?
                .expect("a blocking read always completes");
            if mismatches.is_empty() {
                return Ok(());
            }
            let repeated = attempt > 0 && mismatches == previous;
            if repeated || attempt + 1 == READ_ATTEMPTS {
                return Err(self.report_corruption(volume, &mismatches));
            }
            previous = mismatches;
        }
        unreachable!("the last attempt returns")
    }

    fn report_corruption(&self, volume: VolumeId, mismatches: &[Mismatch]) -> TargetError {
        let mut state = self.lock();
        if let Some(volume_state) = state.volumes.get_mut(&volume) {
            volume_state.checksum_errors += mismatches.len() as u64;
        }
        drop(state);
        self.checksum_errors
            .fetch_add(mismatches.len() as u64, Ordering::Relaxed);
        for mismatch in mismatches {
            tracing::error!(
                pool = %self.pool_name,
                volume = volume.0,
                block = mismatch.block,
                physical_block = mismatch.physical_block,
                expected_crc = mismatch.expected,
                "checksum mismatch: data on disk is damaged"
            );
        }
        let first = &mismatches[0];
        TargetError::Checksum {
            volume_block: first.block,
            pool_block: first.physical_block,
        }
    }

    fn plan(
        &self,
        state: &mut State,
        volume: VolumeId,
        view: View,
        first_block: u64,
        block_count: u64,
    ) -> Result<Plan, TargetError> {
        let end_block = first_block + block_count;
        let volume_state = state.live_volume(volume)?;
        let source = Source::of(volume_state, view)?;
        if end_block * BLOCK_BYTES > source.size_bytes(volume_state) {
            return Err(TargetError::Invalid(
                "read past the end of the volume".into(),
            ));
        }
        let mut plan = Plan {
            steps: Vec::new(),
            crcs: Vec::new(),
        };
        if let Source::Snapshot(_) = source {
            self.plan_in_place(state, volume, source, first_block, end_block, &mut plan)?;
            return Ok(plan);
        }
        let segments = volume_state.overlay.lookup(first_block, end_block);
        for segment in segments {
            match segment.record {
                Some(record) => plan.steps.push(Step::Pending {
                    record,
                    first_block: segment.start,
                    blocks: segment.end - segment.start,
                }),
                None => self.plan_in_place(
                    state,
                    volume,
                    source,
                    segment.start,
                    segment.end,
                    &mut plan,
                )?,
            }
        }
        Ok(plan)
    }

    fn plan_in_place(
        &self,
        state: &mut State,
        volume: VolumeId,
        source: Source,
        first: u64,
        end: u64,
        plan: &mut Plan,
    ) -> Result<(), TargetError> {
        let mut block = first;
        while block < end {
            let chunk = block / BLOCKS_PER_CHUNK;
            let chunk_end = ((chunk + 1) * BLOCKS_PER_CHUNK).min(end);
            let entry = source.entry(&state.volumes[&volume], chunk);
            match entry {
                None => push_zero(plan, chunk_end - block),
                Some(entry) => {
                    // A chunk being copied into reads from its source: the
                    // blocks the pass writes come from its records (still
                    // pending), and the rest are the copied ones.
                    let physical = if state.copying.is_empty() {
                        entry.physical
                    } else {
                        state
                            .copying
                            .get(&entry.physical)
                            .copied()
                            .unwrap_or(entry.physical)
                    };
                    for block in block..chunk_end {
                        if !entry.block_written(block % BLOCKS_PER_CHUNK) {
                            push_zero(plan, 1);
                            continue;
                        }
                        let physical_block =
                            physical as u64 * BLOCKS_PER_CHUNK + block % BLOCKS_PER_CHUNK;
                        let crc = state
                            .checksums
                            .get(&*self.disk, &self.layout, physical_block)
                            .map_err(|error| {
                                TargetError::Device(format!("reading checksums: {error}"))
                            })?;
                        push_disk(plan, physical_block, crc);
                    }
                }
            }
            block = chunk_end;
        }
        Ok(())
    }

    /// A read served without waiting for the device: `None` when a block is
    /// not in memory (or fails its checksum, which the blocking path then
    /// re-checks and reports).
    pub fn try_read(
        &self,
        volume: VolumeId,
        offset: u64,
        buffer: &mut [u8],
    ) -> Option<Result<(), TargetError>> {
        self.try_read_view(volume, View::Volume, offset, buffer)
    }

    pub fn try_read_view(
        &self,
        volume: VolumeId,
        view: View,
        offset: u64,
        buffer: &mut [u8],
    ) -> Option<Result<(), TargetError>> {
        let length = buffer.len() as u64;
        if !offset.is_multiple_of(BLOCK_BYTES) || !length.is_multiple_of(BLOCK_BYTES) || length == 0
        {
            return None;
        }
        let first_block = offset / BLOCK_BYTES;
        let plan = {
            let mut state = self.lock();
            if let Err(error) = state.check_usable() {
                return Some(Err(error));
            }
            if offset.checked_add(length).is_none() {
                return Some(Err(TargetError::Invalid(format!(
                    "range {offset}+{length} overflows"
                ))));
            }
            match self.plan(&mut state, volume, view, first_block, length / BLOCK_BYTES) {
                Ok(plan) => plan,
                Err(error) => return Some(Err(error)),
            }
        };
        match self.execute(&plan, first_block, buffer, true) {
            Ok(Some(mismatches)) if mismatches.is_empty() => Some(Ok(())),
            Ok(_) => None,
            Err(error) => Some(Err(error)),
        }
    }

    /// Carries out a plan. With `nowait`, device reads only take what the
    /// page cache holds, and `None` means some of it was not there.
    fn execute(
        &self,
        plan: &Plan,
        first_block: u64,
        buffer: &mut [u8],
        nowait: bool,
    ) -> Result<Option<Vec<Mismatch>>, TargetError> {
        let block_size = BLOCK_BYTES as usize;
        let mut mismatches = Vec::new();
        let mut at = 0usize;
        let mut block = first_block;
        for step in &plan.steps {
            match step {
                Step::Zero { blocks } => {
                    let bytes = *blocks as usize * block_size;
                    buffer[at..at + bytes].fill(0);
                    at += bytes;
                    block += blocks;
                }
                Step::Pending {
                    record,
                    first_block: start,
                    blocks,
                } => {
                    let bytes = *blocks as usize * block_size;
                    match &record.body {
                        RecordBody::Write { data, .. } => {
                            let from = ((start - record.first_block) as usize) * block_size;
                            buffer[at..at + bytes].copy_from_slice(&data[from..from + bytes]);
                        }
                        _ => buffer[at..at + bytes].fill(0),
                    }
                    at += bytes;
                    block += blocks;
                }
                Step::Disk {
                    physical_block,
                    blocks,
                    crcs_from,
                } => {
                    let bytes = *blocks as usize * block_size;
                    let target = &mut buffer[at..at + bytes];
                    let device_offset = self.layout.data_block_offset(*physical_block);
                    if nowait {
                        if !self.disk.try_read_at_nowait(target, device_offset) {
                            return Ok(None);
                        }
                    } else {
                        self.disk.read_at(target, device_offset).map_err(|error| {
                            TargetError::Device(format!("reading pool data: {error}"))
                        })?;
                    }
                    for (index, data) in target.chunks_exact(block_size).enumerate() {
                        let expected = plan.crcs[crcs_from + index];
                        if crc_fast::crc32_iscsi(data) != expected
                            && !bug!(self, skip_read_checksum)
                        {
                            mismatches.push(Mismatch {
                                block: block + index as u64,
                                physical_block: physical_block + index as u64,
                                expected,
                            });
                        }
                    }
                    at += bytes;
                    block += blocks;
                }
            }
        }
        debug_assert_eq!(at, buffer.len());
        Ok(Some(mismatches))
    }

    /// `base:allocation` for `[offset, offset + length)`: written blocks are
    /// data; everything else is a hole that reads as zeros.
    pub fn block_status(
        &self,
        volume: VolumeId,
        offset: u64,
        length: u64,
    ) -> Result<Vec<BlockStatusExtent>, TargetError> {
        self.block_status_view(volume, View::Volume, offset, length)
    }

    pub fn block_status_view(
        &self,
        volume: VolumeId,
        view: View,
        offset: u64,
        length: u64,
    ) -> Result<Vec<BlockStatusExtent>, TargetError> {
        let state = self.lock();
        state.check_usable()?;
        let volume_state = state.live_volume(volume)?;
        let source = Source::of(volume_state, view)?;
        let size = source.size_bytes(volume_state);
        let end = offset
            .checked_add(length)
            .filter(|end| *end <= size && length > 0)
            .ok_or_else(|| {
                TargetError::Invalid(format!(
                    "range {offset}+{length} is outside the volume ({size} bytes)"
                ))
            })?;
        let first_block = offset / BLOCK_BYTES;
        let end_block = end
            .div_ceil(BLOCK_BYTES)
            .min(first_block + BLOCK_STATUS_MAX_BLOCKS);
        let mut runs: Vec<(u64, bool)> = Vec::new(); // (blocks, is_data)
        let mut push = |blocks: u64, data: bool| match runs.last_mut() {
            Some((count, kind)) if *kind == data => *count += blocks,
            _ => runs.push((blocks, data)),
        };
        let segments = match source {
            Source::Volume => volume_state.overlay.lookup(first_block, end_block),
            Source::Snapshot(_) => vec![crate::overlay::Segment {
                start: first_block,
                end: end_block,
                record: None,
            }],
        };
        for segment in segments {
            if let Some(record) = &segment.record {
                push(
                    segment.end - segment.start,
                    matches!(record.body, RecordBody::Write { .. }),
                );
                continue;
            }
            let mut block = segment.start;
            while block < segment.end {
                let chunk = block / BLOCKS_PER_CHUNK;
                let chunk_end = ((chunk + 1) * BLOCKS_PER_CHUNK).min(segment.end);
                match source.entry(volume_state, chunk) {
                    None => push(chunk_end - block, false),
                    Some(entry) => {
                        for block in block..chunk_end {
                            push(1, entry.block_written(block % BLOCKS_PER_CHUNK));
                        }
                    }
                }
                block = chunk_end;
            }
        }
        let mut extents = Vec::with_capacity(runs.len());
        let mut position = first_block * BLOCK_BYTES;
        let limit = end.min(end_block * BLOCK_BYTES);
        for (blocks, data) in runs {
            let run_end = (position + blocks * BLOCK_BYTES).min(limit);
            let run_start = position.max(offset);
            if run_end > run_start {
                extents.push(BlockStatusExtent {
                    length_bytes: run_end - run_start,
                    hole: !data,
                    zero: !data,
                });
            }
            position += blocks * BLOCK_BYTES;
        }
        Ok(extents)
    }
}

/// Where map entries come from: the volume's map, or the view of its
/// snapshot at this index.
#[derive(Clone, Copy)]
enum Source {
    Volume,
    Snapshot(usize),
}

impl Source {
    fn of(volume: &VolumeState, view: View) -> Result<Source, TargetError> {
        match view {
            View::Volume => Ok(Source::Volume),
            View::Snapshot(id) => volume
                .snapshot_index(id)
                .map(Source::Snapshot)
                .ok_or(TargetError::ShuttingDown),
        }
    }

    fn size_bytes(self, volume: &VolumeState) -> u64 {
        match self {
            Source::Volume => volume.record.size_bytes,
            Source::Snapshot(index) => volume.snapshots[index].record.size_bytes,
        }
    }

    fn entry(self, volume: &VolumeState, chunk: u64) -> Option<ChunkEntry> {
        match self {
            Source::Volume => volume.map.get(chunk),
            Source::Snapshot(index) => volume.snapshot_entry(index, chunk),
        }
    }
}

fn push_zero(plan: &mut Plan, blocks: u64) {
    match plan.steps.last_mut() {
        Some(Step::Zero { blocks: count }) => *count += blocks,
        _ => plan.steps.push(Step::Zero { blocks }),
    }
}

fn push_disk(plan: &mut Plan, physical_block: u64, crc: u32) {
    if let Some(Step::Disk {
        physical_block: start,
        blocks,
        ..
    }) = plan.steps.last_mut()
    {
        if *start + *blocks == physical_block {
            *blocks += 1;
            plan.crcs.push(crc);
            return;
        }
    }
    plan.steps.push(Step::Disk {
        physical_block,
        blocks: 1,
        crcs_from: plan.crcs.len(),
    });
    plan.crcs.push(crc);
}
