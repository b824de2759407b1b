//! The write path: a request becomes a journal record, admitted (space,
//! memory and chunks reserved, visible to reads) and then acknowledged; the
//! journal writer thread puts it in the file. FUA and FLUSH wait for a
//! device flush that covers them (group commit: one flush serves every
//! record written before it started).

use super::active::Journaled;
use super::admission_queue::Needs;
use super::journal_writer::{flushed_recently, BatchPath};
use super::stalls::AdmissionWait;
use super::{bug, Background, Engine, State, VolumeState};
use crate::journal::{
    block_crcs, checksums_payload_bytes, record_journal_bytes, redirect_payload_bytes,
    RECORD_MAX_DATA_BYTES, SNAPSHOT_PAYLOAD_BYTES,
};
use crate::layout::{BLOCKS_PER_CHUNK, BLOCK_BYTES};
use crate::record::{Record, RecordBody};
use std::sync::{Arc, MutexGuard};
use std::time::Instant;
use trireme_types::{Attempt, BlockBuf, TargetError, VolumeId};

/// What admission did with a record.
enum Admission {
    Admitted(u64),
    /// Admitted, and the caller holds the writing role: it writes the
    /// record to the journal itself (see [`Engine::write_now`]).
    AdmittedToWrite(Arc<Record>, BatchPath),
    /// Admitted to be written with the records the caller holds
    /// ([`Admit::Join`]), in its batch and on that batch's path.
    Joined(Arc<Record>),
    WouldWait(RecordBody),
}

/// What a waiting write asks of the applier.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Wake {
    /// A checkpoint: the journal (or the free chunks) must come back.
    Checkpoint,
    /// An apply pass: data waits to be applied.
    Apply,
}

/// What admission does with a record that must wait for room, and who
/// writes it to the journal.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Admit {
    /// Hand it back.
    NoWait,
    /// Wait; the journal writer writes it.
    Wait,
    /// Wait; the caller writes it if the journal writer is idle.
    WaitWriteNow,
    /// The caller holds the writing role with this many records admitted
    /// and not yet written ([`HeldWrite::admit_also`]): admit the record
    /// only if it is the next one after them and needs no wait, and the
    /// caller writes it with them. Otherwise hand it back: a caller that
    /// holds the role must never wait for room, which only records being
    /// written can give back.
    Join(u64),
}

/// An admitted write whose record the caller's thread still has to put in
/// the journal ([`Engine::admit_now`]). It holds the pool's writing role:
/// nothing else reaches the journal until it is finished, so finish it
/// soon. Dropping it writes the record too, so the role always comes back.
#[must_use = "the record must be written: call finish"]
pub struct HeldWrite<'a> {
    engine: &'a Engine,
    volume: VolumeId,
    /// Admitted in sequence order, none written yet; empty once finished.
    records: Vec<Arc<Record>>,
    path: BatchPath,
}

/// Records one [`HeldWrite`] gathers at most: the role is held while they
/// are gathered, and the journal writer (other volumes' records) waits.
pub const HELD_RECORDS_MAX: usize = 64;

impl HeldWrite<'_> {
    /// Admits another small plain write of the same volume, to be written
    /// with the records held already in one journal write: a replica's
    /// link that has several writes in its read buffer answers each once
    /// admitted and writes them together, one `pwritev` for all their
    /// records instead of one each. The data comes back (`Ok(Some)`)
    /// when the write cannot join them: not whole blocks or too large,
    /// `HELD_RECORDS_MAX` held already, another thread's record admitted
    /// in between, or admission would have to wait (for journal space or
    /// the held-data limit, which only written records give back). The
    /// caller then finishes this one and writes that data as usual.
    pub fn admit_also(
        &mut self,
        offset: u64,
        data: Arc<BlockBuf>,
    ) -> Result<Option<Arc<BlockBuf>>, TargetError> {
        if self.records.is_empty()
            || self.records.len() >= HELD_RECORDS_MAX
            || data.is_empty()
            || !whole_blocks(offset, &data)
            || data.len() as u64 > WRITE_NOW_MAX_BYTES
        {
            return Ok(Some(data));
        }
        let held = self.records.len() as u64;
        match self
            .engine
            .admit_blocks(self.volume, offset, data, Admit::Join(held))?
        {
            Admission::Joined(record) => {
                self.records.push(record);
                Ok(None)
            }
            Admission::WouldWait(RecordBody::Write { data, .. }) => Ok(Some(data)),
            Admission::WouldWait(_) => unreachable!("a write record comes back as one"),
            Admission::Admitted(_) | Admission::AdmittedToWrite(..) => {
                unreachable!("a joining record is written by its holder")
            }
        }
    }

    /// Writes the records (and gives the writing role back).
    pub fn finish(mut self) -> Result<(), TargetError> {
        self.write()
    }

    fn write(&mut self) -> Result<(), TargetError> {
        if self.records.is_empty() {
            return Ok(());
        }
        let records = std::mem::take(&mut self.records);
        self.engine.write_holding_role(&records, self.path)
    }
}

impl Drop for HeldWrite<'_> {
    fn drop(&mut self) {
        // A failed write has failed the pool; the next flush says so.
        let _ = self.write();
    }
}

/// Records up to this size are written on the caller's thread: small
/// writes, where the hand-off to the journal writer is the larger cost.
/// Larger ones keep the journal writer's batching (the bound is a choice,
/// not a measured crossover).
pub const WRITE_NOW_MAX_BYTES: u64 = 32 << 10;

impl Engine {
    /// Writes `data` at `offset`. The record keeps `data` as it is, shared
    /// with whoever else holds it (a replicated write's primary keeps it
    /// to send again): it is never written to afterwards.
    pub fn write(
        &self,
        volume: VolumeId,
        offset: u64,
        data: Arc<BlockBuf>,
        fua: bool,
    ) -> Result<(), TargetError> {
        if data.is_empty() {
            return if fua { self.flush(volume) } else { Ok(()) };
        }
        self.check_range(volume, offset, data.len() as u64)?;
        let last_sequence = if whole_blocks(offset, &data) {
            self.write_blocks(volume, offset / BLOCK_BYTES, data, true)?
        } else {
            let _partial = self
                .partial_block_lock
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let (first_block, blocks) = self.merge_partial(volume, offset, &data)?;
            self.write_blocks(volume, first_block, Arc::new(blocks), false)?
        };
        if fua {
            self.note_client_flush(volume);
            self.flush_to(last_sequence)?;
        }
        Ok(())
    }

    /// Reads the blocks a partial write touches and lays `data` over them.
    fn merge_partial(
        &self,
        volume: VolumeId,
        offset: u64,
        data: &[u8],
    ) -> Result<(u64, BlockBuf), TargetError> {
        let first_block = offset / BLOCK_BYTES;
        let end_block = (offset + data.len() as u64).div_ceil(BLOCK_BYTES);
        let mut blocks = BlockBuf::zeroed(((end_block - first_block) * BLOCK_BYTES) as usize);
        let block = BLOCK_BYTES as usize;
        if !offset.is_multiple_of(BLOCK_BYTES) {
            self.read(volume, first_block * BLOCK_BYTES, &mut blocks[..block])?;
        }
        let end = offset + data.len() as u64;
        if !end.is_multiple_of(BLOCK_BYTES)
            && (end_block - 1 != first_block || offset.is_multiple_of(BLOCK_BYTES))
        {
            let length = blocks.len();
            self.read(
                volume,
                (end_block - 1) * BLOCK_BYTES,
                &mut blocks[length - block..],
            )?;
        }
        let start = (offset - first_block * BLOCK_BYTES) as usize;
        blocks[start..start + data.len()].copy_from_slice(data);
        Ok((first_block, blocks))
    }

    /// Writes whole blocks as one or more records; returns the last
    /// sequence. With `direct_ok`, a record may go in place directly (see
    /// `direct_chunks`); partial blocks and zeroes take the journal.
    fn write_blocks(
        &self,
        volume: VolumeId,
        first_block: u64,
        data: Arc<BlockBuf>,
        direct_ok: bool,
    ) -> Result<u64, TargetError> {
        let pieces: Vec<Arc<BlockBuf>> = if data.len() as u64 <= RECORD_MAX_DATA_BYTES {
            vec![data]
        } else {
            data.chunks(RECORD_MAX_DATA_BYTES as usize)
                .map(|piece| Arc::new(BlockBuf::from(piece)))
                .collect()
        };
        let mut block = first_block;
        let mut last_sequence = 0;
        for piece in pieces {
            let block_count = piece.len() as u64 / BLOCK_BYTES;
            let block_crcs = block_crcs(&piece);
            let body = RecordBody::Write {
                data: piece,
                block_crcs,
                fresh_chunks: Vec::new(),
                direct: Vec::new(),
            };
            last_sequence = self.append_blocking(volume, block, block_count, body, direct_ok)?;
            block += block_count;
        }
        Ok(last_sequence)
    }

    /// TRIM (`deallocate`) or WRITE_ZEROES: whole blocks inside the range
    /// become a zero record, which frees chunks left with no written block.
    /// Partial blocks at the edges are zeroed by writing (WRITE_ZEROES) or
    /// left alone (TRIM, which promises nothing about their content).
    pub fn zero(
        &self,
        volume: VolumeId,
        offset: u64,
        length: u64,
        fua: bool,
        trim: bool,
    ) -> Result<(), TargetError> {
        if length == 0 {
            return if fua { self.flush(volume) } else { Ok(()) };
        }
        self.check_range(volume, offset, length)?;
        let end = offset + length;
        let first_whole = offset.div_ceil(BLOCK_BYTES);
        let end_whole = end / BLOCK_BYTES;
        let mut last_sequence = 0;
        if !trim {
            let head_end = end.min(first_whole * BLOCK_BYTES);
            if head_end > offset {
                let zeroes = Arc::new(BlockBuf::zeroed((head_end - offset) as usize));
                self.write(volume, offset, zeroes, false)?;
            }
            let tail_start = (end_whole * BLOCK_BYTES).max(offset).max(head_end);
            if end > tail_start {
                let zeroes = Arc::new(BlockBuf::zeroed((end - tail_start) as usize));
                self.write(volume, tail_start, zeroes, false)?;
            }
        }
        if end_whole > first_whole {
            last_sequence = self.append_blocking(
                volume,
                first_whole,
                end_whole - first_whole,
                RecordBody::Zero,
                false,
            )?;
        }
        if fua {
            self.note_client_flush(volume);
            match last_sequence {
                0 => self.flush(volume)?,
                sequence => self.flush_to(sequence)?,
            }
        }
        Ok(())
    }

    /// Writes zero data that stays allocated (WRITE_ZEROES with NO_HOLE).
    pub fn zero_allocated(
        &self,
        volume: VolumeId,
        offset: u64,
        length: u64,
        fua: bool,
    ) -> Result<(), TargetError> {
        self.check_range(volume, offset, length)?;
        let mut done = 0;
        while done < length {
            let piece = (length - done).min(RECORD_MAX_DATA_BYTES);
            let zeroes = Arc::new(BlockBuf::zeroed(piece as usize));
            if whole_blocks(offset + done, &zeroes) {
                self.write_blocks(volume, (offset + done) / BLOCK_BYTES, zeroes, false)?;
            } else {
                self.write(volume, offset + done, zeroes, false)?;
            }
            done += piece;
        }
        if fua {
            self.flush(volume)?;
        }
        Ok(())
    }

    /// A plain aligned write admitted without waiting, or the data back.
    pub fn try_write(
        &self,
        volume: VolumeId,
        offset: u64,
        data: Arc<BlockBuf>,
    ) -> Attempt<(), Arc<BlockBuf>> {
        if data.is_empty() {
            return Attempt::Done(Ok(()));
        }
        if !whole_blocks(offset, &data) || data.len() as u64 > RECORD_MAX_DATA_BYTES {
            return Attempt::WouldBlock(data);
        }
        // Admission checks the range and the volume, under the one lock the
        // write takes.
        match self.admit_blocks(volume, offset, data, Admit::NoWait) {
            Ok(Admission::Admitted(_)) => Attempt::Done(Ok(())),
            Ok(Admission::AdmittedToWrite(..) | Admission::Joined(_)) => {
                unreachable!("only asked for by write_now and admit_also")
            }
            Ok(Admission::WouldWait(RecordBody::Write { data, .. })) => Attempt::WouldBlock(data),
            Ok(Admission::WouldWait(_)) => unreachable!("a write record comes back as one"),
            Err(error) => Attempt::Done(Err(error)),
        }
    }

    /// Admits the journal record of snapshot `id` of `volume` (after every
    /// record admitted so far); returns its sequence.
    pub fn admit_snapshot(
        &self,
        volume: VolumeId,
        id: trireme_types::SnapshotId,
        created_unix_seconds: u64,
        size_bytes: u64,
    ) -> Result<u64, TargetError> {
        let body = RecordBody::Snapshot {
            id,
            created_unix_seconds,
            size_bytes,
        };
        self.append_blocking(volume, 0, 0, body, false)
    }

    fn append_blocking(
        &self,
        volume: VolumeId,
        first_block: u64,
        block_count: u64,
        body: RecordBody,
        direct_ok: bool,
    ) -> Result<u64, TargetError> {
        match self.append(
            volume,
            first_block,
            block_count,
            body,
            Admit::Wait,
            direct_ok,
        )? {
            Admission::Admitted(sequence) => Ok(sequence),
            Admission::AdmittedToWrite(..) | Admission::Joined(_) => {
                unreachable!("only asked for by write_now and admit_also")
            }
            Admission::WouldWait(_) => unreachable!("blocking admission waits"),
        }
    }

    /// A plain write (no FUA) that the caller's thread puts in the journal
    /// itself when the journal writer is idle, instead of waking it: a
    /// thread hand-off fewer before the record can be flushed. For callers
    /// about to wait for the device anyway (a replica's link, whose next
    /// message is often the flush; see [`Engine::sync_ahead`]). Returns
    /// once the record is admitted, and written if this thread wrote it.
    pub fn write_now(
        &self,
        volume: VolumeId,
        offset: u64,
        data: Arc<BlockBuf>,
    ) -> Result<(), TargetError> {
        match self.admit_now(volume, offset, data)? {
            Some(held) => held.finish(),
            None => Ok(()),
        }
    }

    /// [`Engine::write_now`] in two steps: the write is admitted (ordered
    /// after every record before it, visible to reads, covered by the next
    /// flush: it may be acknowledged) when this returns, and a
    /// [`HeldWrite`] says this thread still has to put it in the journal.
    /// A replica's link answers the write in between, so that its answer
    /// does not wait for the device write. A device error in
    /// [`HeldWrite::finish`] fails the pool, and the flush that must follow
    /// reports it.
    pub fn admit_now(
        &self,
        volume: VolumeId,
        offset: u64,
        data: Arc<BlockBuf>,
    ) -> Result<Option<HeldWrite<'_>>, TargetError> {
        if data.is_empty()
            || !whole_blocks(offset, &data)
            || data.len() as u64 > WRITE_NOW_MAX_BYTES
        {
            return self.write(volume, offset, data, false).map(|()| None);
        }
        match self.admit_blocks(volume, offset, data, Admit::WaitWriteNow)? {
            Admission::Admitted(_) => Ok(None),
            Admission::AdmittedToWrite(record, path) => Ok(Some(HeldWrite {
                engine: self,
                volume,
                records: vec![record],
                path,
            })),
            Admission::Joined(_) => unreachable!("only asked for by admit_also"),
            Admission::WouldWait(_) => unreachable!("blocking admission waits"),
        }
    }

    /// Admits whole blocks at a block-aligned `offset` as one write record.
    fn admit_blocks(
        &self,
        volume: VolumeId,
        offset: u64,
        data: Arc<BlockBuf>,
        admit: Admit,
    ) -> Result<Admission, TargetError> {
        let block_count = data.len() as u64 / BLOCK_BYTES;
        let block_crcs = block_crcs(&data);
        let body = RecordBody::Write {
            data,
            block_crcs,
            fresh_chunks: Vec::new(),
            direct: Vec::new(),
        };
        self.append(volume, offset / BLOCK_BYTES, block_count, body, admit, true)
    }

    /// Writes `records`, the unwritten ones in sequence order, while this
    /// thread holds the writing role, then gives the role back (to the
    /// journal writer, if records were admitted meanwhile).
    fn write_holding_role(
        &self,
        records: &[Arc<Record>],
        path: BatchPath,
    ) -> Result<(), TargetError> {
        let (state, written) = self.write_in_role(records, path, None);
        state.validate(self.layout.journal_bytes);
        self.changed.notify_all();
        if state.next_sequence - 1 > state.written_sequence || state.shutting_down {
            self.journal_wake.notify_one();
        }
        written.map_err(TargetError::Device)
    }

    pub fn check_range(
        &self,
        volume: VolumeId,
        offset: u64,
        length: u64,
    ) -> Result<(), TargetError> {
        let state = self.lock();
        state.check_usable()?;
        let size = state.live_volume(volume)?.record.size_bytes;
        match offset.checked_add(length) {
            Some(end) if end <= size => Ok(()),
            _ => Err(TargetError::Invalid(format!(
                "range {offset}+{length} is past the end of the volume ({size} bytes)"
            ))),
        }
    }

    /// Admits a record: journal space, memory and chunks are reserved, the
    /// record gets its sequence and position and shows in the overlay, and
    /// the journal writer is woken if idle. From here on reads see the
    /// record and a flush covers it; the write may be acknowledged.
    /// Without `blocking`, a record that would have to wait is handed back.
    fn append(
        &self,
        volume: VolumeId,
        first_block: u64,
        block_count: u64,
        mut body: RecordBody,
        admit: Admit,
        direct_ok: bool,
    ) -> Result<Admission, TargetError> {
        let data_bytes = match &body {
            RecordBody::Write { data, .. } => data.len() as u64,
            _ => 0,
        };
        let payload_bytes = match &body {
            RecordBody::Snapshot { .. } => SNAPSHOT_PAYLOAD_BYTES,
            _ => data_bytes,
        };
        let whole_chunks = matches!(body, RecordBody::Write { .. })
            && first_block.is_multiple_of(BLOCKS_PER_CHUNK)
            && block_count.is_multiple_of(BLOCKS_PER_CHUNK);
        let journal_size = self.layout.journal_bytes;
        let mut state = self.lock();
        // The first reason this write waited, and since when.
        let mut waited: Option<(AdmissionWait, Instant)> = None;
        // This write's place among those waiting for journal space or the
        // unapplied-data budget (`admission_queue`), once it has waited.
        let mut ticket: Option<u64> = None;
        let (redirect, direct, journal_bytes, reserve) = loop {
            if let Err(error) = state.check_usable() {
                self.leave_admission_queue(&mut state, ticket);
                return Err(error);
            }
            if let Admit::Join(held) = admit {
                // Checked first, before admission changes anything: the
                // caller writes the record right behind its own, so it
                // must come right after them.
                if !state.writing || state.next_sequence != state.written_sequence + held + 1 {
                    return Ok(Admission::WouldWait(body));
                }
            }
            let available = state.allocator.free_count() - state.reserved_chunks;
            let size = match state.live_volume(volume) {
                Ok(volume_state) => volume_state.record.size_bytes,
                Err(error) => {
                    self.leave_admission_queue(&mut state, ticket);
                    return Err(error);
                }
            };
            if (first_block + block_count) * BLOCK_BYTES > size {
                self.leave_admission_queue(&mut state, ticket);
                return Err(TargetError::Invalid(format!(
                    "range {}+{} is past the end of the volume ({size} bytes)",
                    first_block * BLOCK_BYTES,
                    block_count * BLOCK_BYTES
                )));
            }
            // Whole chunks overwrite in place when the rules for direct
            // writes allow it, else go to fresh chunks while there are
            // enough; in a full pool they overwrite in place through the
            // journal instead, which needs no new space
            // (docs/store-format.md, *Which writes*). A synchronous
            // writer's small writes take the journal: one device write
            // before its flush, not two (the in-place data and the
            // record); the applier's in-place copy comes later, off the
            // writer's path (*Synchronous writers*).
            let mut direct = match &body {
                RecordBody::Write { .. } if !direct_ok => Some(Err(Journaled::NotWholeBlocks)),
                RecordBody::Write { .. }
                    if !whole_chunks
                        && self.direct_sync
                        && state.volumes.get(&volume).is_some_and(is_synchronous) =>
                {
                    Some(Err(Journaled::Synchronous))
                }
                RecordBody::Write { .. } => {
                    Some(self.direct_chunks(&mut state, volume, first_block, block_count))
                }
                _ => None,
            };
            let wants_fresh = whole_chunks && !matches!(direct, Some(Ok(_)));
            let redirect = wants_fresh && available >= block_count / BLOCKS_PER_CHUNK;
            if redirect {
                // Not a small write: not counted in the write path's stats.
                direct = None;
            }
            if wants_fresh && !state.checkpoint_wanted && Engine::frees_waiting(&state) {
                state.checkpoint_wanted = true;
                self.applier_wake.notify_all();
            }
            let journal_bytes = if redirect {
                record_journal_bytes(redirect_payload_bytes(block_count))
            } else if matches!(direct, Some(Ok(_))) {
                record_journal_bytes(checksums_payload_bytes(first_block, block_count))
            } else {
                record_journal_bytes(payload_bytes)
            };
            let lap_left = journal_size - state.head % journal_size;
            let pad = if journal_bytes > lap_left {
                lap_left
            } else {
                0
            };
            // Room held for the writes that waited before this one
            // (`admission_queue`): none of them is overtaken.
            let ahead = state.admission.ahead(ticket);
            let journal_full =
                state.head + pad + ahead.journal_bytes + journal_bytes - state.tail > journal_size;
            let held = state.unapplied_bytes + state.unstarted_bytes + ahead.data_bytes;
            let memory_full = held > 0 && held + data_bytes > super::HELD_BYTES_MAX;
            if journal_full || memory_full {
                // Only a full journal needs a checkpoint (it frees the
                // ring); held data needs only the applier and the
                // write-back thread, which gives room back as it starts.
                // Asking for a checkpoint each time made one per apply pass
                // (over 100 a second in J4), each a device flush.
                let wake = if journal_full {
                    Wake::Checkpoint
                } else {
                    Wake::Apply
                };
                if matches!(admit, Admit::NoWait | Admit::Join(_)) {
                    self.ask_applier(&mut state, wake);
                    return Ok(Admission::WouldWait(body));
                }
                waited.get_or_insert_with(|| {
                    let reason = if journal_full {
                        AdmissionWait::JournalFull
                    } else {
                        AdmissionWait::UnappliedBytes
                    };
                    (reason, Instant::now())
                });
                if ticket.is_none() {
                    ticket = Some(state.admission.take(Needs {
                        data_bytes,
                        journal_bytes,
                    }));
                }
                state = self.wait_for_applier(state, wake);
                continue;
            }
            if matches!(admit, Admit::Join(_)) && (pad > 0 || redirect) {
                // A pad record would come between; a redirect is the
                // journal writer's (see `write_now` below).
                return Ok(Admission::WouldWait(body));
            }
            // Through. (The wait for chunks below keeps no order: a trim
            // behind this write may be what frees them.)
            if let Some(ticket) = ticket.take() {
                state.admission.leave(ticket);
            }
            let needed = match body {
                RecordBody::Write { .. } if redirect => block_count / BLOCKS_PER_CHUNK,
                RecordBody::Write { .. } => {
                    chunks_to_reserve(&state, volume, first_block, block_count)
                }
                _ => 0,
            };
            if state.allocator.free_count() - state.reserved_chunks < needed {
                if !state.unapplied.is_empty() || !state.deferred_frees.is_empty() {
                    // Pending trims may free chunks, and pending writes may
                    // hold reservations they turn out not to need.
                    if matches!(admit, Admit::NoWait | Admit::Join(_)) {
                        self.wake_applier(&mut state);
                        return Ok(Admission::WouldWait(body));
                    }
                    waited.get_or_insert_with(|| (AdmissionWait::Chunks, Instant::now()));
                    state = self.wait_for_applier(state, Wake::Checkpoint);
                    continue;
                }
                return Err(TargetError::NoSpace {
                    pool: self.pool_name.to_string(),
                });
            }
            break (
                redirect,
                direct,
                journal_bytes,
                if redirect { 0 } else { needed },
            );
        };
        if let Some((reason, since)) = waited {
            state.stalls.admission[reason as usize].add(since.elapsed());
        }
        // Counted once the write is admitted (admission may loop).
        if let Some(outcome) = &direct {
            state
                .write_path
                .count(outcome.as_ref().map(|_| ()).map_err(|reason| *reason));
        }
        let direct_chunks = direct.and_then(Result::ok).unwrap_or_default();
        if !direct_chunks.is_empty() {
            let RecordBody::Write { direct, .. } = &mut body else {
                unreachable!("direct records are writes")
            };
            *direct = direct_chunks.clone();
        }
        if redirect {
            let RecordBody::Write { fresh_chunks, .. } = &mut body else {
                unreachable!("redirects are writes")
            };
            *fresh_chunks = (0..block_count / BLOCKS_PER_CHUNK)
                .map(|_| {
                    state
                        .allocator
                        .allocate()
                        .expect("free chunks were counted")
                })
                .collect();
        }
        let lap_left = journal_size - state.head % journal_size;
        if journal_bytes > lap_left {
            let sequence = state.next_sequence;
            let record = Arc::new(Record::new(
                sequence,
                state.head,
                lap_left,
                volume,
                0,
                0,
                RecordBody::Pad,
                0,
            ));
            state.next_sequence += 1;
            state.head += lap_left;
            state.unapplied.push_back(record);
        }
        let sequence = state.next_sequence;
        let record = Arc::new(Record::new(
            sequence,
            state.head,
            journal_bytes,
            volume,
            first_block,
            block_count,
            body,
            reserve,
        ));
        state.next_sequence += 1;
        state.head += journal_bytes;
        state.reserved_chunks += reserve;
        if !direct_chunks.is_empty() {
            Engine::note_direct(&mut state, &direct_chunks, sequence);
        }
        state.unapplied_bytes += data_bytes;
        state.unapplied.push_back(record.clone());
        let volume_state = state.volumes.get_mut(&volume).expect("checked live above");
        match &record.body {
            // A snapshot covers no blocks; writes admitted until it is
            // applied reserve for copy-on-write.
            RecordBody::Snapshot { id, .. } => volume_state.pending_snapshots.push(*id),
            _ => volume_state.overlay.insert(record.clone()),
        }
        state.validate(journal_size);
        self.wake_applier_for_records(&mut state);
        // The caller may write the record itself only if it is the one
        // record to write next, and redirects (whole chunks) are left to
        // the journal writer, which splits them among its helpers.
        // A pool run in steps has no journal writer: its writer is idle
        // unless a step runs, and none runs inside an admission.
        let write_now = admit == Admit::WaitWriteNow
            && (state.journal_idle || self.background == Background::Inline)
            && !state.writing
            && !redirect
            && state.written_sequence + 1 == sequence;
        if write_now {
            state.writing = true;
            let path = self.batch_path(&state);
            return Ok(Admission::AdmittedToWrite(record, path));
        }
        if let Admit::Join(_) = admit {
            // The caller holds the role already; its batch keeps its path.
            return Ok(Admission::Joined(record));
        }
        if state.journal_idle {
            self.journal_wake.notify_one();
        }
        Ok(Admission::Admitted(sequence))
    }

    /// The write holding `ticket` gives up: the room held for it is free
    /// again, and the writes behind it look again.
    fn leave_admission_queue(&self, state: &mut State, ticket: Option<u64>) {
        if let Some(ticket) = ticket {
            state.admission.leave(ticket);
            self.changed.notify_all();
        }
    }

    fn wait_for_applier<'a>(
        &'a self,
        mut state: MutexGuard<'a, State>,
        wake: Wake,
    ) -> MutexGuard<'a, State> {
        if self.background == Background::Inline {
            drop(state);
            if let Err(error) = self.run_background_inline() {
                tracing::warn!(pool = %self.pool_name, %error, "background work failed");
            }
            return self.lock();
        }
        self.ask_applier(&mut state, wake);
        self.wait(state)
    }

    fn ask_applier(&self, state: &mut State, wake: Wake) {
        match wake {
            Wake::Checkpoint => self.wake_applier(state),
            Wake::Apply => self.applier_wake.notify_all(),
        }
    }

    /// Makes every write completed before this call durable; `volume`'s
    /// client asked (see `note_client_flush`).
    pub fn flush(&self, volume: VolumeId) -> Result<(), TargetError> {
        self.note_client_flush(volume);
        let target = self.lock().next_sequence - 1;
        self.flush_to(target)
    }

    /// [`Engine::flush`] if it needs no waiting (see `Volume::try_flush`).
    /// It counts as a client's flush for `sync_eagerly` either way.
    pub fn try_flush(&self, volume: VolumeId) -> Attempt<(), ()> {
        let mut state = self.lock();
        note_client_flush(&mut state, volume);
        match state.flushed_to(state.next_sequence - 1) {
            Some(answer) => Attempt::Done(answer),
            None => Attempt::WouldBlock(()),
        }
    }

    /// Flushes, on the caller's thread, the records written and not yet
    /// durable, if clients flush often (see `sync_eagerly`) and no flush is
    /// running. A caller with nothing else to do (a replica's link with no
    /// message waiting) then finds the flush that follows already done,
    /// and nobody had to be woken to tell it.
    pub fn sync_ahead(&self) {
        let state = self.lock();
        drop(self.sync_eagerly(state));
    }

    /// `volume`'s client asked for durability (FLUSH or FUA): see
    /// `sync_eagerly`, `batch_path` and `is_synchronous`.
    fn note_client_flush(&self, volume: VolumeId) {
        note_client_flush(&mut self.lock(), volume);
    }

    /// Returns once every record up to `sequence` is durable. Concurrent
    /// callers share one device flush.
    pub fn flush_to(&self, sequence: u64) -> Result<(), TargetError> {
        let mut state = self.lock();
        loop {
            if let Some(answer) = state.flushed_to(sequence) {
                return answer;
            }
            if bug!(self, ack_before_durable) && state.written_sequence >= sequence {
                return Ok(());
            }
            if state.written_sequence < sequence || state.flushing {
                if self.background == Background::Inline && !state.flushing && !state.writing {
                    let progressed;
                    (state, progressed) = self.write_journal_inline(state);
                    assert!(
                        progressed || state.failed.is_some(),
                        "a flush waits for records nobody writes"
                    );
                    continue;
                }
                state = self.wait(state);
                continue;
            }
            state = self.sync_written(state);
        }
    }

    /// One device flush, covering every record written so far; the lock is
    /// let go while it runs. The caller checked that no flush is running.
    pub(super) fn sync_written<'a>(
        &'a self,
        mut state: MutexGuard<'a, State>,
    ) -> MutexGuard<'a, State> {
        debug_assert!(!state.flushing);
        state.flushing = true;
        let covered = state.written_sequence;
        drop(state);
        let result = self.disk.sync_data();
        let mut state = self.lock();
        state.flushing = false;
        assert!(
            covered <= state.written_sequence,
            "a flush covers only written records"
        );
        match result {
            Ok(()) => state.durable_sequence = state.durable_sequence.max(covered),
            Err(error) => {
                // After a failed fsync the kernel may have dropped dirty
                // pages: nothing unflushed can be trusted any more.
                self.fail(&mut state, format!("device flush failed: {error}"));
            }
        }
        self.changed.notify_all();
        state
    }
}

/// True if `data` at `offset` covers whole blocks only.
fn whole_blocks(offset: u64, data: &[u8]) -> bool {
    offset.is_multiple_of(BLOCK_BYTES) && (data.len() as u64).is_multiple_of(BLOCK_BYTES)
}

/// Chunks a write may have to allocate when it is applied: those not mapped
/// now, those shared with a snapshot or another entry (copy-on-write), and
/// those a pending zero record may free or share before it (see
/// `docs/store-format.md`, "Space accounting"). While a snapshot of the
/// volume is pending or a rollback runs, every chunk touched.
fn chunks_to_reserve(state: &State, volume: VolumeId, first_block: u64, block_count: u64) -> u64 {
    let volume_state = &state.volumes[&volume];
    let first_chunk = first_block / BLOCKS_PER_CHUNK;
    let end_chunk = (first_block + block_count).div_ceil(BLOCKS_PER_CHUNK);
    if !volume_state.pending_snapshots.is_empty() || volume_state.rolling_back {
        return end_chunk - first_chunk;
    }
    (first_chunk..end_chunk)
        .filter(|chunk| match volume_state.map.get(*chunk) {
            None => true,
            Some(entry) => {
                state.is_shared(volume_state, entry)
                    || volume_state
                        .overlay
                        .has_zero_in(chunk * BLOCKS_PER_CHUNK, (chunk + 1) * BLOCKS_PER_CHUNK)
            }
        })
        .count() as u64
}

/// The pool's and the volume's last client flush, now.
fn note_client_flush(state: &mut State, volume: VolumeId) {
    let now = Instant::now();
    state.last_flush_request = Some(now);
    if let Some(volume) = state.volumes.get_mut(&volume) {
        volume.last_flush_request = Some(now);
    }
}

/// A synchronous writer's volume: its client flushed in the last 50 ms
/// (`flushed_recently`). Its small writes take the journal (*Which
/// writes*); the other volumes' are not made to, though the pool's batches
/// go with `O_DIRECT` while any client flushes (`batch_path`).
fn is_synchronous(volume: &VolumeState) -> bool {
    flushed_recently(volume.last_flush_request)
}
