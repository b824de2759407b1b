//! Whole-chunk overwrites go in place, once (docs/store-format.md, *Which
//! writes*): the chunk stays where it is, nothing is allocated or freed,
//! and the last write of a block is the one on the device.

use super::active::Journaled;
use super::test_support::{filled, physical, pool_config, test_pool, until, MIB};
use crate::layout::CHUNK_BYTES;
use crate::{Pool, Volume};
use std::sync::Arc;
use trireme_types::{BlockTarget, VolumeName};

fn reopen(dir: &std::path::Path) -> Arc<Pool> {
    let config = pool_config(dir);
    Pool::open(&config.device_path, &config.metadata_path).unwrap()
}

/// A volume whose first `chunks` chunks are written, checkpointed and in
/// an active region: whole-chunk overwrites there may go in place. The
/// first write of each chunk is redirected (unmapped); the next one after
/// a checkpoint asks for the region; the applier activates it.
fn ready_volume(pool: &Pool, chunks: u64) -> Arc<Volume> {
    let name = VolumeName::new("v").unwrap();
    pool.create_volume(&name, 16 * MIB).unwrap();
    let volume = pool.open_volume(&name).unwrap();
    volume
        .write_shared(0, filled(1, chunks * CHUNK_BYTES), false)
        .unwrap();
    pool.sync().unwrap();
    let region = crate::active_set::region_of(physical(&volume, 0));
    volume
        .write_shared(0, filled(1, chunks * CHUNK_BYTES), false)
        .unwrap();
    until("the region is active", || {
        volume.engine.lock().active_regions.contains(&region)
    });
    pool.sync().unwrap();
    volume
}

/// Shuts the pool down, opens it again (replay) and hands `check` what
/// the volume's first `bytes` read; the pool's scan must be clean.
fn after_reopen(dir: &std::path::Path, pool: Arc<Pool>, bytes: u64, check: impl Fn(&[u8])) {
    let volume = pool.open_volume(&VolumeName::new("v").unwrap()).unwrap();
    check(&read(&volume, 0, bytes));
    drop(volume);
    pool.shutdown().unwrap();
    drop(pool);
    let pool = reopen(dir);
    let volume = pool.open_volume(&VolumeName::new("v").unwrap()).unwrap();
    check(&read(&volume, 0, bytes));
    assert!(pool.scan().unwrap().is_clean());
}

fn all(seed: u8) -> impl Fn(&[u8]) {
    move |back: &[u8]| assert!(back.iter().all(|byte| *byte == seed))
}

fn read(volume: &Volume, offset: u64, bytes: u64) -> Vec<u8> {
    let mut back = vec![0u8; bytes as usize];
    volume.read(offset, &mut back).unwrap();
    back
}

#[test]
fn a_written_chunk_overwritten_whole_stays_where_it_is() {
    let dir = tempfile::tempdir().unwrap();
    let pool = test_pool(dir.path());
    let volume = ready_volume(&pool, 2);
    let before = (physical(&volume, 0), physical(&volume, 1));
    let direct = pool.direct_writes();
    let free = volume.engine.lock().allocator.free_count();
    volume
        .write_shared(0, filled(7, 2 * CHUNK_BYTES), false)
        .unwrap();
    volume.flush().unwrap();
    pool.sync().unwrap();
    assert_eq!(pool.direct_writes(), direct + 1, "went in place");
    assert_eq!((physical(&volume, 0), physical(&volume, 1)), before);
    assert_eq!(
        volume.engine.lock().allocator.free_count(),
        free,
        "nothing allocated, nothing freed"
    );
    drop(volume);
    after_reopen(dir.path(), pool, 2 * CHUNK_BYTES, all(7));
}

/// The journal writer cuts a batch's whole chunks into shares written in
/// parallel: a chunk written whole twice in one batch must end with the
/// later data, on the device and after a replay. Eight chunks twice, so
/// the batch is shared out (`DIRECT_SPLIT_MIN_CHUNKS`).
#[test]
fn a_chunk_written_whole_twice_in_one_batch_keeps_the_later_data() {
    let dir = tempfile::tempdir().unwrap();
    let pool = test_pool(dir.path());
    let volume = ready_volume(&pool, 8);
    let direct = pool.direct_writes();
    until("the journal writer idles", || {
        let state = volume.engine.lock();
        state.journal_idle && state.written_sequence + 1 == state.next_sequence
    });
    // Holds the writing role: both writes below wait in one batch.
    let held = volume
        .admit_now(12 * MIB, filled(9, 4096))
        .unwrap()
        .expect("the journal writer is idle");
    for seed in [2u8, 3] {
        volume
            .write_shared(0, filled(seed, 8 * CHUNK_BYTES), false)
            .unwrap();
    }
    assert_eq!(pool.direct_writes(), direct + 2, "both went in place");
    held.finish().unwrap();
    volume.flush().unwrap();
    pool.sync().unwrap();
    // Applied: the overlay is empty, so the first read below reads the
    // device's data.
    drop(volume);
    after_reopen(dir.path(), pool, 8 * CHUNK_BYTES, all(3));
}

/// A write of part of a chunk does not go in place while a whole-chunk
/// direct write of that chunk is pending: the journal writer writes the
/// buffered one first and the whole chunk after it, which would put the
/// older data last. It takes the journal, and lands on top.
#[test]
fn a_partial_write_behind_a_pending_whole_chunk_write_takes_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let pool = test_pool(dir.path());
    let volume = ready_volume(&pool, 1);
    let pending_before = volume
        .engine
        .lock()
        .write_path
        .journaled(Journaled::PendingRecord);
    pool.pause_applier(true);
    volume
        .write_shared(0, filled(4, CHUNK_BYTES), false)
        .unwrap();
    volume
        .write_shared(3 * 4096, filled(5, 4096), false)
        .unwrap();
    assert_eq!(
        volume
            .engine
            .lock()
            .write_path
            .journaled(Journaled::PendingRecord),
        pending_before + 1
    );
    pool.pause_applier(false);
    volume.flush().unwrap();
    pool.sync().unwrap();
    let expect = |back: &[u8]| {
        for (block, data) in back.chunks(4096).enumerate() {
            let seed = if block == 3 { 5 } else { 4 };
            assert!(data.iter().all(|byte| *byte == seed), "block {block}");
        }
    };
    drop(volume);
    after_reopen(dir.path(), pool, CHUNK_BYTES, expect);
}

/// The journal writer starts a batch's whole chunks while the batches
/// before it still wait for theirs (`journal_writer`, *Batches in
/// flight* in docs/store-format.md). Rewriting the same chunks round after
/// round puts writes of one chunk in batches in flight together: the later
/// one must wait, or the two land in either order and the device keeps the
/// older data under the newer record.
#[test]
fn batches_in_flight_together_leave_each_chunks_last_write() {
    const CHUNKS: u64 = 96;
    const ROUNDS: u8 = 30;
    let dir = tempfile::tempdir().unwrap();
    let pool = test_pool(dir.path());
    let volume = ready_volume(&pool, CHUNKS);
    // 128 KiB writes, as sequential streams send them, from three threads
    // (a third of the chunks each): 180 MiB a pass, more than the
    // held-data limit, so records pile up behind the batches in flight.
    // Whether they do is up to the threads' timing: passes go on until a
    // batch was started ahead.
    let mut last = 0;
    for pass in 0..5u8 {
        std::thread::scope(|scope| {
            for third in 0..3 {
                let volume = &volume;
                scope.spawn(move || {
                    for round in 1..=ROUNDS {
                        for pair in (third * CHUNKS / 6)..((third + 1) * CHUNKS / 6) {
                            let data = filled(pass * ROUNDS + round, 2 * CHUNK_BYTES);
                            volume
                                .write_shared(pair * 2 * CHUNK_BYTES, data, false)
                                .unwrap();
                        }
                    }
                });
            }
        });
        volume.flush().unwrap();
        last = pass * ROUNDS + ROUNDS;
        if volume.engine.lock().batches_started_ahead > 0 {
            break;
        }
    }
    assert!(
        volume.engine.lock().batches_started_ahead > 0,
        "no batch was started ahead"
    );
    drop(volume);
    after_reopen(dir.path(), pool, CHUNKS * CHUNK_BYTES, all(last));
}
