//! The journal writer thread: writes admitted records in sequence order,
//! as many per `pwritev` as are waiting, and the whole chunks they name
//! (a redirect's fresh chunks, a whole-chunk direct write's own), with up
//! to three batches' chunks in flight at once (docs/store-format.md,
//! *Batches in flight*).

use super::active::direct_runs;
use super::{Engine, State};
use crate::journal::{encode_redirect_payload, HEADER_BYTES};
use crate::layout::CHUNK_BYTES;
use crate::record::{Record, RecordBody};
use std::io::IoSlice;
use std::sync::{Arc, MutexGuard};

/// The journal writer thread: writes admitted records in order, as many
/// per `pwritev` as are waiting, so one system call serves many requests.
/// One thread at a time holds the writing role (`State::writing`): this
/// one, or a caller of [`Engine::write_now`] that found it idle.
pub fn run_journal_writer(engine: Arc<Engine>) {
    // The helpers that write a batch's whole chunks (they end, and are
    // joined, when this thread returns).
    let helper = engine
        .disk
        .parallel_direct_writes()
        .then(|| spawn_direct_helper(engine.clone()));
    let pipelined = helper.is_some() && engine.pipeline_batches;
    // Batches whose whole chunks the helpers are writing, their records
    // not yet, oldest first: while any is in flight this thread holds the
    // writing role, and it starts the next ones before it writes the
    // oldest one's records.
    let mut in_flight: std::collections::VecDeque<(Started, BatchPath)> = Default::default();
    let mut state = engine.lock();
    loop {
        if state.failed.is_some() {
            if !in_flight.is_empty() {
                drop(state);
                // Their writes still use the records' buffers; wait for them.
                for (started, _) in in_flight.drain(..) {
                    let _ = started.wait_for_chunks();
                }
                state = engine.lock();
                state.writing = false;
            }
            return;
        }
        if !in_flight.is_empty() {
            // The next batches, cut and started while the oldest one's
            // chunks are on their way, so the device never waits for a
            // batch to end; deep enough that the oldest one's records,
            // queued at the device behind the batches after it, return
            // while the device still has work.
            while in_flight.len() < PIPELINE_DEPTH {
                let after = in_flight.back().expect("not empty").0.last_sequence();
                if state.next_sequence - 1 == after {
                    break;
                }
                let next = next_batch(&state, after);
                if in_flight
                    .iter()
                    .any(|(started, _)| started.overlaps(&engine.layout, &next))
                {
                    break;
                }
                let path = engine.batch_path(&state);
                drop(state);
                in_flight.push_back((
                    engine.start_batch(next, helper.as_ref(), Share::Helpers),
                    path,
                ));
                state = engine.lock();
                state.batches_started_ahead += 1;
            }
            let limit = state.tail + engine.layout.journal_bytes;
            drop(state);
            let (oldest, path) = in_flight.pop_front().expect("not empty");
            let more = !in_flight.is_empty();
            // With later batches' chunks in flight, a buffered write of
            // the records would wait for them: ext4 takes the file's lock
            // exclusively for a buffered write, and shares it among direct
            // overwrites.
            let path = if more {
                BatchPath::Direct { limit }
            } else {
                path
            };
            let batch = oldest.batch.clone();
            let result = engine.finish_batch(oldest, path);
            let written;
            (state, written) = engine.batch_written(&batch, result, more);
            engine.changed.notify_all();
            if written.is_ok() && !more {
                state = engine.sync_eagerly(state);
                engine.changed.notify_all();
            }
            continue;
        }
        let unwritten = state.next_sequence - 1 - state.written_sequence;
        if unwritten == 0 || state.writing {
            if unwritten == 0 && state.shutting_down && !state.writing {
                return;
            }
            state.journal_idle = true;
            state = engine
                .journal_wake
                .wait(state)
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            state.journal_idle = false;
            continue;
        }
        let batch = next_batch(&state, state.written_sequence);
        let path = engine.batch_path(&state);
        state.writing = true;
        drop(state);
        if pipelined
            && batch
                .iter()
                .any(|record| whole_chunk_targets(record).is_some())
        {
            in_flight.push_back((
                engine.start_batch(batch, helper.as_ref(), Share::Helpers),
                path,
            ));
            state = engine.lock();
            continue;
        }
        let written;
        (state, written) = engine.write_in_role(&batch, path, helper.as_ref());
        if written.is_ok() {
            engine.changed.notify_all();
            state = engine.sync_eagerly(state);
        }
        engine.changed.notify_all();
    }
}

/// The records to write next: those after sequence `after` (the written
/// sequence, or the last of a batch in flight), up to a batch's bounds,
/// ending at a pad (the record after it starts the next lap, so it is not
/// contiguous).
fn next_batch(state: &State, after: u64) -> Vec<Arc<Record>> {
    let first_unwritten = (after - state.applied_sequence) as usize;
    let mut batch = Vec::new();
    let mut bytes = 0;
    for record in state.unapplied.range(first_unwritten..) {
        batch.push(record.clone());
        bytes += record.data_bytes();
        let full = batch.len() >= JOURNAL_BATCH_MAX_RECORDS || bytes >= JOURNAL_BATCH_MAX_BYTES;
        if full || matches!(record.body, RecordBody::Pad) {
            break;
        }
    }
    batch
}

impl Engine {
    /// The journal writer's work, on the caller's thread ([`Background::Inline`]):
    /// writes the next batch of unwritten records. False when there was
    /// none to write, another thread holds the writing role, or the pool
    /// failed.
    ///
    /// [`Background::Inline`]: super::Background::Inline
    pub(super) fn write_journal_inline<'a>(
        &'a self,
        mut state: MutexGuard<'a, State>,
    ) -> (MutexGuard<'a, State>, bool) {
        let unwritten = state.next_sequence - 1 - state.written_sequence;
        if state.failed.is_some() || state.writing || unwritten == 0 {
            return (state, false);
        }
        let batch = next_batch(&state, state.written_sequence);
        let path = self.batch_path(&state);
        state.writing = true;
        drop(state);
        let (state, written) = self.write_in_role(&batch, path, None);
        self.changed.notify_all();
        (state, written.is_ok())
    }
}

/// While a caller asked for a flush this recently, each batch is flushed
/// as soon as it is written and nothing more waits, and its writer counts
/// as synchronous (`batch_path`, `write::is_synchronous`).
const EAGER_SYNC_WINDOW: std::time::Duration = std::time::Duration::from_millis(50);

/// True if a client's last FLUSH or FUA (`at`) lies within
/// [`EAGER_SYNC_WINDOW`].
pub(super) fn flushed_recently(at: Option<std::time::Instant>) -> bool {
    at.is_some_and(|at| at.elapsed() < EAGER_SYNC_WINDOW)
}

/// How the writing role writes a batch: through the page cache, or with
/// `O_DIRECT` (see [`Engine::batch_path`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum BatchPath {
    Buffered,
    /// Straight to the device, the journal's blocks ending at `limit` at
    /// the latest (a logical position: journal space from there on is
    /// still in use a lap behind).
    Direct {
        limit: u64,
    },
}

impl Engine {
    /// How the next batch goes to the device. A synchronous writer (one
    /// that flushed in the last 50 ms) waits for the device after every
    /// write anyway; written with `O_DIRECT`, its records are on the device
    /// when `pwrite` returns, and the `fdatasync` that
    /// follows only flushes the device's cache. Through the page cache, the
    /// same `fdatasync` first had to find and write back the dirty pages:
    /// 50 µs more per node and cycle on this machine's three-replica J1
    /// (`bench/j1_floor.c`, buffered against direct). Writers that never
    /// flush keep the page cache, whose `pwrite` returns without waiting
    /// for the device.
    pub(super) fn batch_path(&self, state: &State) -> BatchPath {
        if self.direct_sync && flushed_recently(state.last_flush_request) {
            BatchPath::Direct {
                limit: state.tail + self.layout.journal_bytes,
            }
        } else {
            BatchPath::Buffered
        }
    }

    /// A synchronous writer (a write, then a flush, then the next write)
    /// waits for a device flush per write anyway: starting it as soon as
    /// the write is in the journal, rather than when the flush request
    /// arrives, overlaps it with the write's reply and the flush request's
    /// trip (and, on a replica, with the primary's). Writers that do not
    /// flush never pay for it.
    pub(super) fn sync_eagerly<'a>(
        &'a self,
        state: MutexGuard<'a, State>,
    ) -> MutexGuard<'a, State> {
        let recent = flushed_recently(state.last_flush_request);
        let idle = state.next_sequence - 1 == state.written_sequence;
        if !recent || !idle || state.flushing || state.durable_sequence >= state.written_sequence {
            return state;
        }
        self.sync_written(state)
    }
}

/// Records per journal batch: two iovecs each, within the kernel's IOV_MAX.
const JOURNAL_BATCH_MAX_RECORDS: usize = 512;
const JOURNAL_BATCH_MAX_BYTES: u64 = 8 << 20;

impl Engine {
    /// Writes `batch`, the records right after the written sequence, for
    /// the thread that holds the writing role (the journal writer, or a
    /// caller of `write_now`), then takes the lock and gives the role back.
    /// The written sequence advances over the batch, or the pool fails: a
    /// hole in the journal would cut off every later record.
    pub(super) fn write_in_role(
        &self,
        batch: &[Arc<Record>],
        path: BatchPath,
        helper: Option<&DirectHelper>,
    ) -> (MutexGuard<'_, State>, Result<(), String>) {
        let started = self.start_batch(batch.to_vec(), helper, Share::WithHelpers);
        let result = self.finish_batch(started, path);
        self.batch_written(batch, result, false)
    }

    /// After `batch` was written (or failed): advances the written
    /// sequence over it and wakes the applier, or fails the pool. The
    /// writing role stays with the caller if `keep_role` (a batch after
    /// this one is in flight), else it is given back.
    fn batch_written(
        &self,
        batch: &[Arc<Record>],
        result: std::io::Result<()>,
        keep_role: bool,
    ) -> (MutexGuard<'_, State>, Result<(), String>) {
        let mut state = self.lock();
        state.writing = keep_role;
        let written = match result {
            Ok(()) => {
                let last = batch.last().expect("a batch has a record");
                assert_eq!(last.sequence, state.written_sequence + batch.len() as u64);
                state.written_sequence = last.sequence;
                self.wake_applier_for_records(&mut state);
                Ok(())
            }
            Err(error) => {
                let offset = self.journal_physical(batch[0].position);
                let reason = format!("journal write at byte {offset} failed: {error}");
                self.fail(&mut state, reason.clone());
                state.writing = false;
                Err(reason)
            }
        };
        (state, written)
    }

    /// A batch's first half: encodes its records, writes the in-place data
    /// of its small direct writes (through the page cache), and starts its
    /// whole chunks (a redirect's fresh ones, a whole-chunk direct write's
    /// own): on the helpers ([`Share`]), or on this thread when there are
    /// none. Its records are written by [`Engine::finish_batch`], once the
    /// chunks are on the device: replay checks that data against the
    /// record's crcs, as the kernel may write a header back before the
    /// data.
    fn start_batch(
        &self,
        batch: Vec<Arc<Record>>,
        helper: Option<&DirectHelper>,
        share: Share,
    ) -> Started {
        let headers: Vec<[u8; HEADER_BYTES as usize]> = batch
            .iter()
            .map(|record| record.header(self.pool_salt, self.epoch).encode())
            .collect();
        let mut payloads = Vec::new();
        // Fresh chunks of redirects and in-place blocks of direct writes:
        // written before the records, from the requests' buffers.
        let mut chunks = Vec::new();
        let mut result = Ok(());
        for record in &batch {
            if record.is_snapshot() {
                payloads.push(record.snapshot_payload());
                continue;
            }
            if let RecordBody::Write {
                data,
                block_crcs,
                direct,
                ..
            } = &record.body
            {
                if let Some(targets) = whole_chunk_targets(record) {
                    // Whole chunks: a redirect's fresh ones, or in place.
                    // With `O_DIRECT` from the request's buffer, after every
                    // buffered write of the batch (docs/store-format.md,
                    // *Which writes*).
                    debug_assert_eq!(data.len(), targets.len() * CHUNK_BYTES as usize);
                    chunks.extend(targets.iter().enumerate().map(|(index, physical)| {
                        DirectPiece {
                            device_offset: self.layout.data_offset + *physical as u64 * CHUNK_BYTES,
                            record: record.clone(),
                            from: index * CHUNK_BYTES as usize,
                            bytes: CHUNK_BYTES as usize,
                        }
                    }));
                    let mut payload = encode_redirect_payload(targets, block_crcs);
                    // Records are laid out at 64-byte boundaries.
                    payload.resize((record.journal_bytes - HEADER_BYTES) as usize, 0);
                    payloads.push(payload);
                } else if !direct.is_empty() {
                    // In place through the page cache, in batch order (a
                    // block two writes of the batch write ends with the
                    // later data), before the records: a memcpy each,
                    // where `O_DIRECT` cost 25-36 µs of CPU per 4 KiB write
                    // and waited for the device. The applier starts their
                    // write-back and counts them into its budget once their
                    // records are applied (`writeback`). Also in a batch
                    // written with `O_DIRECT`: a synchronous writer's small
                    // writes are journaled, so these are other volumes'
                    // (one device round trip each would stall the batch)
                    // or admitted before their writer turned synchronous
                    // (its `fdatasync` writes them back).
                    for (device_offset, range) in direct_runs(&self.layout, record, direct) {
                        if result.is_ok() {
                            result = self.disk.write_at(&data[range], device_offset);
                        }
                    }
                    let mut payload = encode_redirect_payload(direct, block_crcs);
                    payload.resize((record.journal_bytes - HEADER_BYTES) as usize, 0);
                    payloads.push(payload);
                }
            }
        }
        let mut chunks = last_write_of_each_chunk(chunks);
        // In device order: the pieces are distinct chunks now, so any order
        // is as good, and device order makes consecutive chunks one run.
        // Writes that waited at admission are admitted in whatever order
        // their threads took the pool lock, so a sequential stream's
        // records often come out of order, and each record's chunks were a
        // `pwritev` (and a device request) of their own: twice the
        // requests in J5 of `bench/steady.sh`.
        chunks.sort_unstable_by_key(|piece| piece.device_offset);
        let chunk_offsets: Vec<u64> = chunks.iter().map(|piece| piece.device_offset).collect();
        let mut started = Started {
            batch,
            headers,
            payloads,
            chunk_offsets,
            answers: None,
            sent: 0,
            result,
        };
        if started.result.is_err() || chunks.is_empty() {
            return started;
        }
        let Some(helper) = helper.filter(|helper| !helper.jobs.is_empty()) else {
            started.result = self.write_chunks(&chunks);
            return started;
        };
        // Shares of consecutive chunks, one per thread (the device takes
        // them in parallel); the journal writer keeps the last one only
        // when it waits for the batch anyway.
        let threads = match share {
            Share::WithHelpers if chunks.len() < DIRECT_SPLIT_MIN_CHUNKS => 1,
            Share::WithHelpers => helper.jobs.len() + 1,
            Share::Helpers => helper.jobs.len(),
        };
        let shares = threads.min(chunks.len().div_ceil(DIRECT_SHARE_MIN_CHUNKS));
        let own = matches!(share, Share::WithHelpers);
        let share_len = chunks.len().div_ceil(shares);
        let (reply, answers) = std::sync::mpsc::sync_channel(helper.jobs.len());
        for jobs in &helper.jobs {
            if chunks.is_empty() || (own && chunks.len() <= share_len) {
                break;
            }
            let theirs = chunks.split_off(chunks.len().saturating_sub(share_len));
            match jobs.send(DirectJob {
                chunks: theirs,
                reply: reply.clone(),
            }) {
                Ok(()) => started.sent += 1,
                Err(std::sync::mpsc::SendError(job)) => {
                    started.result = started.result.and(self.write_chunks(&job.chunks))
                }
            }
        }
        // Only the helpers' clones remain: one that dies without an answer
        // then ends the wait for it instead of hanging it.
        drop(reply);
        started.answers = Some(answers);
        // What no helper took (all of it if none would), on this thread.
        if !chunks.is_empty() {
            started.result = started.result.and(self.write_chunks(&chunks));
        }
        started
    }

    /// A batch's second half: waits for its whole chunks, then writes its
    /// records (headers and data) with one system call, through the page
    /// cache or, on `path` [`BatchPath::Direct`], as whole blocks with
    /// `O_DIRECT`.
    fn finish_batch(&self, started: Started, path: BatchPath) -> std::io::Result<()> {
        started.wait_for_chunks()?;
        let Started {
            batch,
            headers,
            payloads,
            ..
        } = started;
        let mut payloads = payloads.iter();
        let mut slices = Vec::with_capacity(batch.len() * 2);
        for (record, header) in batch.iter().zip(&headers) {
            slices.push(IoSlice::new(header));
            match &record.body {
                RecordBody::Write {
                    fresh_chunks,
                    direct,
                    ..
                } if !fresh_chunks.is_empty() || !direct.is_empty() => {
                    slices.push(IoSlice::new(
                        payloads.next().expect("one payload per redirect"),
                    ));
                }
                RecordBody::Write { data, .. } => slices.push(IoSlice::new(data)),
                RecordBody::Snapshot { .. } => slices.push(IoSlice::new(
                    payloads.next().expect("one payload per snapshot"),
                )),
                _ => {}
            }
        }
        let start = batch[0].position;
        let last = batch.last().expect("a batch has a record");
        let next = last.position + last.journal_bytes;
        let mut tail = self
            .journal_tail
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let blocks = match path {
            BatchPath::Direct { limit } => tail.whole_blocks(start, &slices, limit),
            BatchPath::Buffered => None,
        };
        let result = match blocks {
            Some((block, bytes)) => {
                let result = self
                    .disk
                    .write_direct_at(&mut [IoSlice::new(bytes)], self.journal_physical(block));
                tail.advance(start, &slices, next);
                result
            }
            None => {
                // `pwritev` consumes the slices: the tail learns from them first.
                tail.advance(start, &slices, next);
                self.disk
                    .write_vectored_at(&mut slices, self.journal_physical(start))
            }
        };
        if result.is_err() {
            tail.forget();
        }
        result
    }

    /// Writes the batch's whole chunks (fresh or in place), one system
    /// call per run of consecutive chunks (sequential writes get consecutive
    /// ones, across records). With `O_DIRECT` the device takes each chunk
    /// from the request's own buffer: it is page-aligned ([`BlockBuf`]) and
    /// a chunk starts at a multiple of 64 KiB in it, so nothing is copied;
    /// the page cache's copy was the largest cost of large writes.
    ///
    /// [`BlockBuf`]: trireme_types::BlockBuf
    fn write_chunks(&self, chunks: &[DirectPiece]) -> std::io::Result<()> {
        let mut start = 0;
        while start < chunks.len() {
            let mut end = start + 1;
            while end < chunks.len()
                && chunks[end].device_offset
                    == chunks[end - 1].device_offset + chunks[end - 1].bytes as u64
            {
                end += 1;
            }
            let offset = chunks[start].device_offset;
            let mut slices: Vec<IoSlice> = chunks[start..end]
                .iter()
                .map(|piece| IoSlice::new(piece.data()))
                .collect();
            self.disk.write_direct_at(&mut slices, offset)?;
            start = end;
        }
        Ok(())
    }
}

/// The batch's whole-chunk writes without those a later one of the batch
/// writes again: the shares are written in parallel, so only one write
/// of a chunk may be among them, the last (a chunk written in place twice
/// in one batch; fresh chunks are all distinct). The overlay sends reads
/// of those blocks to the later record already.
fn last_write_of_each_chunk(mut pieces: Vec<DirectPiece>) -> Vec<DirectPiece> {
    let mut seen = std::collections::HashSet::with_capacity(pieces.len());
    let mut keep = vec![false; pieces.len()];
    for (index, piece) in pieces.iter().enumerate().rev() {
        keep[index] = seen.insert(piece.device_offset);
    }
    if keep.iter().all(|kept| *kept) {
        return pieces;
    }
    let mut keep = keep.into_iter();
    pieces.retain(|_| keep.next().expect("one flag per piece"));
    pieces
}

/// A batch the journal writer waits for (`write_in_role`) is shared with
/// the helpers from this many whole chunks.
const DIRECT_SPLIT_MIN_CHUNKS: usize = 8;
/// The fewest chunks in a share: smaller ones cost a thread hand-off for
/// little parallelism.
const DIRECT_SHARE_MIN_CHUNKS: usize = 4;
/// Threads that write whole chunks: three shares in flight kept this
/// machine's device busiest (fio, three sequential streams of 2.8 MB
/// `pwritev`s: 1,918 MiB/s, against 1,705-1,758 for one stream of 8 MiB).
const DIRECT_HELPERS: usize = 3;

/// Batches the journal writer keeps started at once (their chunks in
/// flight or queued for the helpers).
const PIPELINE_DEPTH: usize = 3;

/// Who writes a batch's whole chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Share {
    /// The helpers and this thread, which waits for the batch anyway.
    WithHelpers,
    /// The helpers only: this thread goes on to the next batch.
    Helpers,
}

/// A batch whose whole chunks are written or on their way, and whose
/// records are not written yet ([`Engine::start_batch`]).
pub(super) struct Started {
    batch: Vec<Arc<Record>>,
    headers: Vec<[u8; HEADER_BYTES as usize]>,
    payloads: Vec<Vec<u8>>,
    /// Device offsets of its whole chunks, in order.
    chunk_offsets: Vec<u64>,
    /// The helpers' answers, `sent` of them.
    answers: Option<std::sync::mpsc::Receiver<std::io::Result<()>>>,
    sent: usize,
    /// The first error of the writes this thread made.
    result: std::io::Result<()>,
}

impl Started {
    fn last_sequence(&self) -> u64 {
        self.batch.last().expect("a batch has a record").sequence
    }

    /// Waits until the helpers wrote their shares; the first error of all
    /// the batch's writes.
    fn wait_for_chunks(&self) -> std::io::Result<()> {
        let mut result = match &self.result {
            Ok(()) => Ok(()),
            Err(error) => Err(std::io::Error::new(error.kind(), error.to_string())),
        };
        if let Some(answers) = &self.answers {
            for _ in 0..self.sent {
                let answer = answers
                    .recv()
                    .unwrap_or_else(|_| Err(std::io::Error::other("a direct-write helper ended")));
                result = result.and(answer);
            }
        }
        result
    }

    /// True if `next` writes a chunk this batch's writes may still be
    /// writing: two writes of one chunk in flight at once land in either
    /// order, so `next` must wait. The overlay already sends reads to the
    /// later record; admission sends a write that covers a pending
    /// whole-chunk write only in part to the journal (`direct_chunks`), so
    /// only whole chunks can meet here.
    fn overlaps(&self, layout: &crate::layout::Layout, next: &[Arc<Record>]) -> bool {
        if self.chunk_offsets.is_empty() {
            return false;
        }
        next.iter()
            .filter_map(|record| whole_chunk_targets(record))
            .flatten()
            .any(|physical| {
                let offset = layout.data_offset + *physical as u64 * CHUNK_BYTES;
                self.chunk_offsets.binary_search(&offset).is_ok()
            })
    }
}

/// The physical chunks `record` writes whole with `O_DIRECT` before its
/// record is written: a redirect's fresh chunks, or a whole-chunk direct
/// write's own; `None` for every other record.
fn whole_chunk_targets(record: &Record) -> Option<&[u32]> {
    match &record.body {
        RecordBody::Write { fresh_chunks, .. } if !fresh_chunks.is_empty() => Some(fresh_chunks),
        RecordBody::Write { direct, .. } if record.is_direct_whole_chunks() => Some(direct),
        _ => None,
    }
}

/// A whole chunk of a redirect or a whole-chunk direct write, written with `O_DIRECT`
/// straight from the record's page-aligned buffer (it starts at a multiple
/// of 64 KiB in it).
struct DirectPiece {
    device_offset: u64,
    record: Arc<Record>,
    /// Byte range of the record's data.
    from: usize,
    bytes: usize,
}

impl DirectPiece {
    fn data(&self) -> &[u8] {
        let RecordBody::Write { data, .. } = &self.record.body else {
            unreachable!("direct pieces come from writes")
        };
        &data[self.from..self.from + self.bytes]
    }
}

/// A share of a batch's whole chunks, for a helper to write.
struct DirectJob {
    chunks: Vec<DirectPiece>,
    reply: std::sync::mpsc::SyncSender<std::io::Result<()>>,
}

/// The journal writer's helper threads for direct writes.
pub(super) struct DirectHelper {
    jobs: Vec<std::sync::mpsc::Sender<DirectJob>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl Drop for DirectHelper {
    /// Ends the helpers and waits for them: they hold the engine, whose
    /// device (and its lock) must be closed once the journal writer ends.
    fn drop(&mut self) {
        self.jobs.clear();
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

fn spawn_direct_helper(engine: Arc<Engine>) -> DirectHelper {
    let mut helper = DirectHelper {
        jobs: Vec::new(),
        threads: Vec::new(),
    };
    for _ in 0..DIRECT_HELPERS {
        let (jobs, receiver) = std::sync::mpsc::channel::<DirectJob>();
        let engine = engine.clone();
        let name = format!("direct-{}", engine.pool_name);
        let spawned = std::thread::Builder::new().name(name).spawn(move || {
            while let Ok(job) = receiver.recv() {
                let result = engine.write_chunks(&job.chunks);
                let _ = job.reply.send(result);
            }
        });
        match spawned {
            Ok(thread) => {
                helper.jobs.push(jobs);
                helper.threads.push(thread);
            }
            // Fewer helpers: the journal writer writes a larger share.
            Err(error) => tracing::warn!(%error, "cannot start a direct-write helper thread"),
        }
    }
    helper
}
