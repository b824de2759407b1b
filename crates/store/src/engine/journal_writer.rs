//! The journal writer thread: writes admitted records in sequence order,
//! as many per `pwritev` as are waiting, and the data of redirects to their
//! fresh chunks.

use super::Engine;
use crate::device::{page_bytes, AlignedPage};
use crate::journal::{encode_redirect_payload, HEADER_BYTES};
use crate::layout::CHUNK_BYTES;
use crate::record::{Record, RecordBody};
use std::io::IoSlice;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

/// The journal writer thread: writes admitted records in order, as many
/// per `pwritev` as are waiting, so one system call serves many requests and
/// only one thread ever takes the file's write lock for the journal.
pub fn run_journal_writer(engine: Arc<Engine>) {
    // The bounce buffer of direct writes, kept from batch to batch.
    let mut direct_buffer = Vec::new();
    let mut state = engine.lock();
    loop {
        if state.failed.is_some() {
            return;
        }
        let unwritten = state.next_sequence - 1 - state.written_sequence;
        if unwritten == 0 {
            if state.shutting_down {
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
        let first_unwritten = (state.written_sequence - state.applied_sequence) as usize;
        let mut batch = Vec::new();
        let mut bytes = 0;
        for record in state.unapplied.range(first_unwritten..) {
            batch.push(record.clone());
            bytes += record.data_bytes();
            // The record after a pad starts the next lap: not contiguous.
            let full = batch.len() >= JOURNAL_BATCH_MAX_RECORDS || bytes >= JOURNAL_BATCH_MAX_BYTES;
            if full || matches!(record.body, RecordBody::Pad) {
                break;
            }
        }
        drop(state);
        let result = engine.write_batch(&batch, &mut direct_buffer);
        state = engine.lock();
        match result {
            Ok(()) => {
                let last = batch.last().expect("a batch has a record");
                assert_eq!(last.sequence, state.written_sequence + batch.len() as u64);
                state.written_sequence = last.sequence;
            }
            Err(error) => {
                // A hole in the journal would cut off every later record.
                let offset = engine.journal_physical(batch[0].position);
                engine.fail(
                    &mut state,
                    format!("journal write at byte {offset} failed: {error}"),
                );
            }
        }
        engine.changed.notify_all();
    }
}

/// Records per journal batch: two iovecs each, within the kernel's IOV_MAX.
const JOURNAL_BATCH_MAX_RECORDS: usize = 512;
const JOURNAL_BATCH_MAX_BYTES: u64 = 8 << 20;
const IOV_MAX: usize = 1024;

impl Engine {
    /// Writes consecutive records (headers and data) with one system call,
    /// after writing the data of redirects to their fresh chunks. Replay
    /// checks that data against the record's crcs, as the kernel may write
    /// the header back before the data.
    fn write_batch(
        &self,
        batch: &[Arc<Record>],
        direct_buffer: &mut Vec<AlignedPage>,
    ) -> std::io::Result<()> {
        let headers: Vec<[u8; HEADER_BYTES as usize]> = batch
            .iter()
            .map(|record| record.header(self.pool_salt, self.epoch).encode())
            .collect();
        let mut payloads = Vec::new();
        let mut fresh = Vec::new();
        for record in batch {
            if record.is_snapshot() {
                payloads.push(record.snapshot_payload());
                continue;
            }
            if let RecordBody::Write {
                data,
                block_crcs,
                fresh_chunks,
            } = &record.body
            {
                if !fresh_chunks.is_empty() {
                    let chunk = CHUNK_BYTES as usize;
                    fresh.extend(
                        fresh_chunks
                            .iter()
                            .zip(data.chunks_exact(chunk))
                            .map(|(physical, bytes)| (*physical, bytes)),
                    );
                    let mut payload = encode_redirect_payload(fresh_chunks, block_crcs);
                    // Records are laid out at 64-byte boundaries.
                    payload.resize((record.journal_bytes - HEADER_BYTES) as usize, 0);
                    payloads.push(payload);
                }
            }
        }
        self.write_fresh_chunks(&fresh, direct_buffer)?;
        let mut payloads = payloads.iter();
        let mut slices = Vec::with_capacity(batch.len() * 2);
        for (record, header) in batch.iter().zip(&headers) {
            slices.push(IoSlice::new(header));
            match &record.body {
                RecordBody::Write { fresh_chunks, .. } if !fresh_chunks.is_empty() => {
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
        write_all_vectored_at(
            &self.file,
            &mut slices,
            self.journal_physical(batch[0].position),
        )
    }

    /// Writes the batch's whole chunks to their fresh chunks, one system
    /// call per run of consecutive chunks (sequential writes get consecutive
    /// ones, across records). With `O_DIRECT` the run is gathered into an
    /// aligned buffer first: a memory copy is far cheaper than the page
    /// cache's, and the device gets one large write.
    fn write_fresh_chunks(
        &self,
        fresh: &[(u32, &[u8])],
        buffer: &mut Vec<AlignedPage>,
    ) -> std::io::Result<()> {
        let chunk = CHUNK_BYTES as usize;
        let mut start = 0;
        while start < fresh.len() {
            let mut end = start + 1;
            while end < fresh.len() && fresh[end].0 == fresh[end - 1].0 + 1 {
                end += 1;
            }
            let offset = self.layout.data_offset + fresh[start].0 as u64 * CHUNK_BYTES;
            let run = &fresh[start..end];
            match &self.direct {
                Some(direct) => {
                    let pages = run.len() * chunk / 4096;
                    if buffer.len() < pages {
                        buffer.resize(pages, AlignedPage([0; 4096]));
                    }
                    let bytes = &mut page_bytes(buffer)[..run.len() * chunk];
                    for (into, (_, data)) in bytes.chunks_exact_mut(chunk).zip(run) {
                        into.copy_from_slice(data);
                    }
                    direct.write_all_at(bytes, offset)?;
                }
                None => {
                    let mut slices: Vec<IoSlice> =
                        run.iter().map(|(_, data)| IoSlice::new(data)).collect();
                    write_all_vectored_at(&self.file, &mut slices, offset)?;
                }
            }
            start = end;
        }
        // A batch holds JOURNAL_BATCH_MAX_BYTES and one record more; a buffer
        // grown well past that by one huge write is not kept.
        if buffer.len() * 4096 > 2 * JOURNAL_BATCH_MAX_BYTES as usize {
            *buffer = Vec::new();
        }
        Ok(())
    }
}

/// `pwritev` until every slice is written.
fn write_all_vectored_at(
    file: &std::fs::File,
    mut slices: &mut [IoSlice<'_>],
    mut offset: u64,
) -> std::io::Result<()> {
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
            let error = std::io::Error::last_os_error();
            if error.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(error);
        }
        if written == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::WriteZero,
                "pwritev wrote nothing",
            ));
        }
        offset += written as u64;
        IoSlice::advance_slices(&mut slices, written as usize);
    }
    Ok(())
}
