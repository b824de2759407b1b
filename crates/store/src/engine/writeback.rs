//! Write-back of in-place data, on its own thread.
//!
//! In-place writes go through the page cache; trireme, not the kernel's
//! dirty-page heuristics, starts their write-back (`sync_file_range`
//! `WRITE`) and waits for it every `WRITEBACK_WAIT_BYTES`, which bounds how
//! much of the pool's data is ever dirty (docs/store-format.md, *Bounded
//! write-back*). Starting write-back blocks while the device's queue is
//! full, or while the kernel throttles write-back because reads wait
//! (blk-wbt): tens of milliseconds per pass once the device is the
//! bottleneck. Done by the applier, that blocked applying, and writers at
//! the unapplied-data limit then waited for whole passes at a time (their
//! tail latency). Here the applier hands each pass's extents over, cut into
//! slices of about `SLICE_BYTES` in device order, and goes on; it waits only
//! while `QUEUE_MAX_BYTES` are handed over and not yet started, and then
//! for one slice, not a pass. Nothing here is about durability: a flush's
//! `fdatasync` writes every dirty page whatever this thread has done.

use super::Engine;
use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// In-place bytes started towards the device before the thread waits for
/// them: with the unapplied-data limit and the queue below, this bounds
/// how much of the pool's data is ever dirty in the page cache.
pub(super) const WRITEBACK_WAIT_BYTES: u64 = 32 << 20;
/// Data handed to the thread and not yet started; the applier waits above.
pub(super) const QUEUE_MAX_BYTES: u64 = 16 << 20;
/// About this much data per `sync_file_range`: small enough that the
/// applier waiting for room waits for little, large enough that the
/// kernel still merges neighbouring pages into one request.
const SLICE_BYTES: u64 = 1 << 20;

/// A device range to start write-back of, and the in-place bytes in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slice {
    pub from: u64,
    pub to: u64,
    pub bytes: u64,
}

/// Cuts in-place extents `(device offset, length)` into slices of about
/// `SLICE_BYTES` of data each, in device order.
pub fn slices(mut extents: Vec<(u64, u64)>) -> Vec<Slice> {
    extents.sort_unstable();
    let mut slices: Vec<Slice> = Vec::new();
    for (from, length) in extents {
        match slices.last_mut() {
            Some(last) if last.bytes < SLICE_BYTES => {
                last.to = last.to.max(from + length);
                last.bytes += length;
            }
            _ => slices.push(Slice {
                from,
                to: from + length,
                bytes: length,
            }),
        }
    }
    slices
}

#[derive(Default)]
pub struct WritebackQueue {
    inner: Mutex<Queue>,
    /// The thread waits here for slices.
    work: Condvar,
    /// The applier waits here for room.
    room: Condvar,
}

#[derive(Default)]
struct Queue {
    slices: VecDeque<Slice>,
    queued_bytes: u64,
    /// Started since the last wait, and the range they lie in.
    started_bytes: u64,
    range: Option<(u64, u64)>,
    /// The thread runs: slices go to it (otherwise they are started by the
    /// caller, as in a pool without threads or before they start).
    thread: bool,
    stop: bool,
    /// The device refused a write-back: the pool is failing.
    failed: Option<String>,
}

impl WritebackQueue {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Slices go to the thread from now on (called before it is spawned).
    pub fn thread_starts(&self) {
        self.lock().thread = true;
    }

    /// Ends the thread once it has started every slice handed over; later
    /// slices are started by their callers.
    pub fn stop(&self) {
        let mut queue = self.lock();
        queue.stop = true;
        self.work.notify_all();
    }
}

impl Engine {
    /// Starts the write-back of in-place extents `(device offset, length)`:
    /// hands them to the write-back thread, waiting only while it is
    /// `QUEUE_MAX_BYTES` behind, or starts them here in a pool without it.
    /// An error is a write-back error of the device: it is reported once
    /// per descriptor, so the pool fails rather than let a later flush
    /// miss it.
    pub(super) fn start_writeback(&self, extents: Vec<(u64, u64)>) -> std::io::Result<()> {
        if extents.is_empty() {
            return Ok(());
        }
        let slices = slices(extents);
        let queue = &self.writeback;
        let mut inner = queue.lock();
        if !inner.thread || inner.stop {
            drop(inner);
            for slice in slices {
                self.write_back(slice)?;
            }
            return Ok(());
        }
        let since = Instant::now();
        let mut waited = false;
        for slice in slices {
            while inner.queued_bytes >= QUEUE_MAX_BYTES && inner.failed.is_none() {
                waited = true;
                inner = queue
                    .room
                    .wait(inner)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
            }
            if let Some(reason) = &inner.failed {
                return Err(std::io::Error::other(reason.clone()));
            }
            inner.queued_bytes += slice.bytes;
            inner.slices.push_back(slice);
            queue.work.notify_one();
        }
        drop(inner);
        if waited {
            self.lock().stalls.writeback_queue.add(since.elapsed());
        }
        Ok(())
    }

    /// Starts one slice's write-back and, once `WRITEBACK_WAIT_BYTES` have
    /// been started since the last wait, waits for all of it.
    fn write_back(&self, slice: Slice) -> std::io::Result<()> {
        let since = Instant::now();
        self.disk.start_writeback(slice.from, slice.to)?;
        let started = since.elapsed();
        let (wait, range) = {
            let mut queue = self.writeback.lock();
            queue.started_bytes += slice.bytes;
            let range = queue.range.map_or((slice.from, slice.to), |(low, high)| {
                (low.min(slice.from), high.max(slice.to))
            });
            queue.range = Some(range);
            let wait = queue.started_bytes >= WRITEBACK_WAIT_BYTES;
            if wait {
                queue.started_bytes = 0;
                queue.range = None;
            }
            (wait, range)
        };
        let waited = if wait {
            let since = Instant::now();
            self.disk.wait_writeback(range.0, range.1)?;
            Some(since.elapsed())
        } else {
            None
        };
        let mut state = self.lock();
        state.stalls.writeback_start.add(started);
        if let Some(waited) = waited {
            state.stalls.writeback.add(waited);
        }
        Ok(())
    }
}

/// The write-back thread of a pool: starts the slices the applier hands
/// over, in order, until the pool stops or fails.
pub fn run_writeback(engine: std::sync::Arc<Engine>) {
    let queue = &engine.writeback;
    loop {
        let slice = {
            let mut inner = queue.lock();
            loop {
                if let Some(slice) = inner.slices.front().copied() {
                    break slice;
                }
                if inner.stop || inner.failed.is_some() {
                    inner.thread = false;
                    return;
                }
                inner = queue
                    .work
                    .wait(inner)
                    .unwrap_or_else(|poisoned| poisoned.into_inner());
            }
        };
        let result = engine.write_back(slice);
        let mut inner = queue.lock();
        inner.slices.pop_front();
        inner.queued_bytes -= slice.bytes;
        queue.room.notify_all();
        if let Err(error) = result {
            let reason = format!("writing applied data back failed: {error}");
            inner.failed = Some(reason.clone());
            inner.slices.clear();
            inner.queued_bytes = 0;
            queue.room.notify_all();
            drop(inner);
            let mut state = engine.lock();
            engine.fail(&mut state, reason);
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extents_are_cut_in_device_order_into_slices_of_about_a_mebibyte() {
        let block = 4096;
        // 600 blocks spread out, handed over in reverse order.
        let extents: Vec<(u64, u64)> = (0..600).rev().map(|i| (i * 3 * block, block)).collect();
        let cut = slices(extents);
        assert_eq!(cut.len(), 3, "{cut:?}");
        assert_eq!(cut[0].from, 0);
        assert_eq!(cut[0].bytes, SLICE_BYTES);
        assert_eq!(cut[1].from, 256 * 3 * block);
        assert_eq!(cut[2].bytes, 88 * block);
        assert_eq!(cut[2].to, 599 * 3 * block + block);
        // Consecutive slices do not overlap.
        assert!(cut.windows(2).all(|pair| pair[0].to <= pair[1].from));
        assert_eq!(
            cut.iter().map(|slice| slice.bytes).sum::<u64>(),
            600 * block
        );
    }

    #[test]
    fn nothing_to_write_back_is_no_slice() {
        assert!(slices(Vec::new()).is_empty());
    }
}
