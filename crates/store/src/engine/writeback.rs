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
//! the held-data limit then waited for whole passes at a time (their tail
//! latency). Here the applier hands each pass's extents over, cut into
//! slices of about `SLICE_BYTES` in device order, and goes on. The data
//! stays held against `HELD_BYTES_MAX` until this thread has started its
//! slice, and each started slice gives its room back at once: on a device
//! saturated by write-back, writers get room in small steps as the device
//! takes the data. Nothing here is about durability: a flush's `fdatasync`
//! writes every dirty page whatever this thread has done.

use super::Engine;
use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Instant;

/// In-place bytes started towards the device before the thread waits for
/// them: with the held-data limit and the queue below, this bounds how
/// much of the pool's data is ever dirty or under write-back.
pub(super) const WRITEBACK_WAIT_BYTES: u64 = 32 << 20;
/// Data handed to the thread and not yet started; the applier waits above.
/// The held-data limit keeps the queue below it unless copy-on-write
/// copies (in-place data no writer brought) fill it.
pub(super) const QUEUE_MAX_BYTES: u64 = 48 << 20;
/// About this much data per slice: the step in which writers waiting for
/// room get it back (64 blocks of 4 KiB, about 2 ms of random write-back
/// here). Runs in a slice are started one `sync_file_range` each, so its
/// size does not change what the kernel can merge.
const SLICE_BYTES: u64 = 256 << 10;

/// The in-place data of about `SLICE_BYTES`, as runs of contiguous
/// device bytes, and the range they lie in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slice {
    pub from: u64,
    pub to: u64,
    pub bytes: u64,
    /// `(from, to)` device ranges, in order, none touching the next.
    pub runs: Vec<(u64, u64)>,
}

/// Cuts in-place extents `(device offset, length)` into slices of about
/// `SLICE_BYTES` of data each, in device order, merging extents that
/// touch or overlap into runs.
pub fn slices(mut extents: Vec<(u64, u64)>) -> Vec<Slice> {
    extents.sort_unstable();
    let mut slices: Vec<Slice> = Vec::new();
    for (from, length) in extents {
        let to = from + length;
        match slices.last_mut() {
            Some(last) if last.bytes < SLICE_BYTES => {
                last.to = last.to.max(to);
                last.bytes += length;
                match last.runs.last_mut() {
                    Some(run) if from <= run.1 => run.1 = run.1.max(to),
                    _ => last.runs.push((from, to)),
                }
            }
            _ => slices.push(Slice {
                from,
                to,
                bytes: length,
                runs: vec![(from, to)],
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
            for slice in &slices {
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

    /// Starts one slice's write-back, gives its room back to the writers,
    /// and, once `WRITEBACK_WAIT_BYTES` have been started since the last
    /// wait, waits for all of it.
    ///
    /// Write-back is started run by run, not over the slice's range: for
    /// small random writes that range is most of the pool, and starting it
    /// started every dirty page in it too (direct writes' data not applied
    /// yet, other slices'), so one call blocked for ~100 ms under load,
    /// and the writers waiting for room with it.
    fn write_back(&self, slice: &Slice) -> std::io::Result<()> {
        let since = Instant::now();
        let started = slice
            .runs
            .iter()
            .try_for_each(|&(from, to)| self.disk.start_writeback(from, to));
        {
            let mut state = self.lock();
            state.stalls.writeback_start.add(since.elapsed());
            // On its way to the device (or the pool fails): writers waiting
            // at `HELD_BYTES_MAX` may have its room.
            state.unstarted_bytes -= slice.bytes;
            self.changed.notify_all();
        }
        started?;
        let range = {
            let mut queue = self.writeback.lock();
            queue.started_bytes += slice.bytes;
            let range = queue.range.map_or((slice.from, slice.to), |(low, high)| {
                (low.min(slice.from), high.max(slice.to))
            });
            if queue.started_bytes < WRITEBACK_WAIT_BYTES {
                queue.range = Some(range);
                return Ok(());
            }
            queue.started_bytes = 0;
            queue.range = None;
            range
        };
        let since = Instant::now();
        self.disk.wait_writeback(range.0, range.1)?;
        self.lock().stalls.writeback.add(since.elapsed());
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
                // Taken off now; its bytes count as queued until started.
                if let Some(slice) = inner.slices.pop_front() {
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
        let result = engine.write_back(&slice);
        let mut inner = queue.lock();
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
    fn extents_are_cut_in_device_order_into_slices_of_about_slice_bytes() {
        let block = 4096;
        let per_slice = SLICE_BYTES / block;
        // 600 blocks spread out, handed over in reverse order.
        let extents: Vec<(u64, u64)> = (0..600).rev().map(|i| (i * 3 * block, block)).collect();
        let cut = slices(extents);
        let full = (600 / per_slice) as usize;
        assert_eq!(cut.len(), full + 1, "{cut:?}");
        assert_eq!(cut[0].from, 0);
        assert_eq!(cut[0].bytes, SLICE_BYTES);
        assert_eq!(cut[1].from, per_slice * 3 * block);
        assert_eq!(cut[full].bytes, (600 % per_slice) * block);
        assert_eq!(cut[full].to, 599 * 3 * block + block);
        // Consecutive slices do not overlap.
        assert!(cut.windows(2).all(|pair| pair[0].to <= pair[1].from));
        // Blocks three apart never touch: one run each.
        assert_eq!(cut[0].runs.len() as u64, per_slice);
        assert_eq!(cut[0].runs[1], (3 * block, 4 * block));
        assert_eq!(
            cut.iter().map(|slice| slice.bytes).sum::<u64>(),
            600 * block
        );
    }

    #[test]
    fn touching_and_overlapping_extents_make_one_run() {
        let block = 4096;
        let cut = slices(vec![
            (2 * block, block),
            (0, block),
            (block, block),
            (block, 2 * block),
            (10 * block, block),
        ]);
        assert_eq!(cut.len(), 1);
        assert_eq!(cut[0].runs, vec![(0, 3 * block), (10 * block, 11 * block)]);
        assert_eq!((cut[0].from, cut[0].to), (0, 11 * block));
    }

    #[test]
    fn nothing_to_write_back_is_no_slice() {
        assert!(slices(Vec::new()).is_empty());
    }
}
