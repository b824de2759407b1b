//! `write_now` and `sync_ahead`: the caller's thread writes and flushes the
//! journal itself, and nothing else about the journal changes.

use super::test_support::{crash_copy, test_pool, MIB};
use crate::{Pool, Volume};
use std::sync::Arc;
use std::time::{Duration, Instant};
use trireme_types::{Attempt, BlockTarget, VolumeName};

fn volume(pool: &Pool) -> Arc<Volume> {
    let name = VolumeName::new("v").unwrap();
    pool.create_volume(&name, 16 * MIB).unwrap();
    pool.open_volume(&name).unwrap()
}

fn block(seed: u8) -> trireme_types::BlockBuf {
    vec![seed; 4096].into()
}

/// Polls the pool's state until `done` holds, failing with `what` after
/// `seconds`: the background threads get there in their own time.
fn until(volume: &Volume, seconds: u64, what: &str, done: impl Fn(&super::State) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(seconds);
    while !done(&volume.engine.lock()) {
        assert!(Instant::now() < deadline, "{what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits until the journal writer has written everything and sleeps.
fn until_journal_idle(volume: &Volume) {
    until(volume, 5, "the journal writer never idled", |state| {
        state.journal_idle && state.written_sequence + 1 == state.next_sequence
    });
}

#[test]
fn write_now_writes_on_the_callers_thread_when_the_journal_writer_is_idle() {
    let dir = tempfile::tempdir().unwrap();
    let pool = test_pool(dir.path());
    let volume = volume(&pool);
    for round in 0..20u8 {
        until_journal_idle(&volume);
        volume
            .write_now(u64::from(round) * 4096, block(round).into())
            .unwrap();
        // Written by the time it returns: nobody else could have been
        // woken and done it in between.
        let state = volume.engine.lock();
        assert_eq!(state.written_sequence + 1, state.next_sequence);
        assert!(!state.writing, "the role is given back");
    }
    for round in 0..20u8 {
        let mut back = vec![0u8; 4096];
        volume.read(u64::from(round) * 4096, &mut back).unwrap();
        assert!(back.iter().all(|byte| *byte == round), "block {round}");
    }
}

#[test]
fn write_now_hands_large_or_unaligned_writes_to_the_usual_path() {
    let dir = tempfile::tempdir().unwrap();
    let pool = test_pool(dir.path());
    let volume = volume(&pool);
    volume
        .write_now(512, Arc::new(vec![7u8; 100].into()))
        .unwrap();
    volume
        .write_now(MIB, Arc::new(vec![9u8; MIB as usize].into()))
        .unwrap();
    volume.flush().unwrap();
    let mut back = vec![0u8; 4096];
    volume.read(0, &mut back).unwrap();
    assert!(back[512..612].iter().all(|byte| *byte == 7));
    assert!(back[..512]
        .iter()
        .chain(&back[612..])
        .all(|byte| *byte == 0));
    let mut back = vec![0u8; MIB as usize];
    volume.read(MIB, &mut back).unwrap();
    assert!(back.iter().all(|byte| *byte == 9));
}

#[test]
fn sync_ahead_flushes_only_while_clients_flush() {
    let dir = tempfile::tempdir().unwrap();
    let pool = test_pool(dir.path());
    let volume = volume(&pool);
    // The applier's checkpoints flush too: keep it out.
    pool.pause_applier(true);
    until_journal_idle(&volume);
    volume.write_now(0, block(1).into()).unwrap();
    volume.sync_ahead();
    {
        let state = volume.engine.lock();
        assert!(
            state.durable_sequence < state.written_sequence,
            "no client flushed: nothing is flushed ahead"
        );
    }
    volume.flush().unwrap();
    until_journal_idle(&volume);
    volume.write_now(4096, block(2).into()).unwrap();
    volume.sync_ahead();
    let state = volume.engine.lock();
    assert_eq!(state.durable_sequence, state.written_sequence);
    assert_eq!(state.written_sequence + 1, state.next_sequence);
}

#[test]
fn try_flush_answers_at_once_only_when_everything_written_is_durable() {
    let dir = tempfile::tempdir().unwrap();
    let pool = test_pool(dir.path());
    let volume = volume(&pool);
    // The applier's checkpoints flush too: keep it out.
    pool.pause_applier(true);
    until_journal_idle(&volume);
    volume.flush().unwrap();
    assert!(matches!(volume.try_flush(), Attempt::Done(Ok(()))));
    until_journal_idle(&volume);
    volume.write_now(0, block(1).into()).unwrap();
    {
        let mut state = volume.engine.lock();
        // Forget the flush above, so that nothing flushes eagerly before
        // `try_flush` is asked.
        state.last_flush_request = None;
        assert!(state.durable_sequence < state.written_sequence);
    }
    assert!(
        matches!(volume.try_flush(), Attempt::WouldBlock(())),
        "a write not yet durable needs a device flush"
    );
    // It counted as a client's flush: the next sync ahead makes the
    // write durable, and the flush after it needs no waiting.
    volume.sync_ahead();
    assert!(matches!(volume.try_flush(), Attempt::Done(Ok(()))));
    let state = volume.engine.lock();
    assert_eq!(state.durable_sequence + 1, state.next_sequence);
}

/// Threads taking the writing role race the journal writer and each
/// other; records must still reach the file in order, and a crash copy
/// must replay exactly what was flushed.
#[test]
fn concurrent_writers_keep_the_journal_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let pool = test_pool(dir.path());
    let volume = volume(&pool);
    let threads: Vec<_> = (0..4u64)
        .map(|thread| {
            let volume = volume.clone();
            std::thread::spawn(move || {
                for round in 0..300u64 {
                    let block_index = thread * 1000 + round % 50;
                    let seed = (thread * 7 + round) as u8;
                    if round % 3 == 0 {
                        volume
                            .write(block_index * 4096, block(seed), false)
                            .unwrap();
                    } else {
                        volume
                            .write_now(block_index * 4096, block(seed).into())
                            .unwrap();
                    }
                    if round % 5 == 0 {
                        volume.flush().unwrap();
                    }
                    volume.sync_ahead();
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    volume.flush().unwrap();
    let mut expected = vec![0u8; 4 * 1000 * 4096];
    volume.read(0, &mut expected).unwrap();
    for thread in 0..4u64 {
        for round in 250..300u64 {
            let at = ((thread * 1000 + round % 50) * 4096) as usize;
            assert_eq!(expected[at], (thread * 7 + round) as u8);
        }
    }
    let (_copy, crashed) = crash_copy(&pool, dir.path(), |_| {});
    let recovered = crashed.open_volume(&VolumeName::new("v").unwrap()).unwrap();
    let mut back = vec![0u8; expected.len()];
    recovered.read(0, &mut back).unwrap();
    assert!(back == expected, "the crash copy replays what was flushed");
    assert!(crashed.scan().unwrap().is_clean());
    assert!(pool.scan().unwrap().is_clean());
}

/// The applier's wake-up rule (`Engine::wake_applier_for_records`): a
/// sleeping applier is woken only once written records wait for it and
/// they add up to a batch; an admission below that wakes nobody, and the
/// one that crosses it does. The applier is paused, and the test holds its
/// "asleep" flag: a wake-up is the flag cleared (the wake clears it as it
/// notifies), so no timing decides the outcome. That only written records
/// count is not checked here: a test cannot hold the journal writer back.
#[test]
fn the_applier_is_woken_only_for_a_batch_of_written_records() {
    let dir = tempfile::tempdir().unwrap();
    let pool = test_pool(dir.path());
    let volume = volume(&pool);
    let asleep = |volume: &Volume| volume.engine.lock().applier_asleep;
    // Parks the applier where the flag is no longer its own: woken, it
    // clears the flag and, seeing the pause, waits (both under the lock).
    pool.pause_applier(true);
    volume.engine.applier_wake.notify_all();
    until(&volume, 5, "the applier never saw the pause", |state| {
        !state.applier_asleep
    });
    let fall_asleep = |volume: &Volume| volume.engine.lock().applier_asleep = true;
    let batch = super::apply::APPLY_BATCH_MIN_BYTES;
    let piece = 64 << 10;

    // Written records below a batch: no wake-up.
    fall_asleep(&volume);
    volume.write(0, vec![1u8; piece].into(), false).unwrap();
    until_journal_idle(&volume);
    assert!(asleep(&volume), "one small write woke the applier");

    // Up to just below a batch, all written: still none.
    let mut offset = piece as u64;
    while volume.engine.lock().unapplied_bytes + piece as u64 * 2 <= batch {
        volume
            .write(offset, vec![2u8; piece].into(), false)
            .unwrap();
        offset += piece as u64;
    }
    until_journal_idle(&volume);
    assert!(asleep(&volume), "records below a batch woke the applier");

    // The admission that crosses the batch, with written records waiting,
    // wakes it (or the journal writer does, once it has written it).
    volume
        .write(offset, vec![3u8; 2 * piece].into(), false)
        .unwrap();
    until_journal_idle(&volume);
    assert!(
        !asleep(&volume),
        "a batch of written records did not wake the applier"
    );
    {
        let state = volume.engine.lock();
        assert!(state.unapplied_bytes >= batch);
        assert!(state.written_sequence > state.applied_sequence);
    }

    // Asleep again with a batch already waiting: the next write wakes it
    // (its admission, or the journal writer once it has written it; this
    // does not tell the two apart).
    fall_asleep(&volume);
    volume
        .write(offset + 2 * piece as u64, vec![4u8; piece].into(), false)
        .unwrap();
    assert!(
        !asleep(&volume),
        "an admission over a waiting batch did not wake the applier"
    );

    // Let go, the applier applies everything, and the data reads back.
    pool.pause_applier(false);
    volume.engine.applier_wake.notify_all();
    until(&volume, 10, "the applier never caught up", |state| {
        state.applied_sequence == state.written_sequence && state.unapplied_bytes == 0
    });
    let mut read = vec![0u8; piece];
    volume.read(offset, &mut read).unwrap();
    assert!(read.iter().all(|b| *b == 3));
}

#[test]
fn an_admitted_write_is_read_at_once_and_flushes_wait_for_its_journal_write() {
    let dir = tempfile::tempdir().unwrap();
    let pool = test_pool(dir.path());
    let volume = volume(&pool);
    until_journal_idle(&volume);
    let held = volume
        .admit_now(8192, block(5).into())
        .unwrap()
        .expect("the journal writer is idle: this thread writes the record");
    let sequence = {
        let state = volume.engine.lock();
        assert!(state.writing, "the writing role is held");
        assert_eq!(
            state.written_sequence + 2,
            state.next_sequence,
            "not written yet"
        );
        state.next_sequence - 1
    };
    // Admitted is visible: a replica answers the write here, and a read
    // that follows must see it.
    let mut back = vec![0u8; 4096];
    volume.read(8192, &mut back).unwrap();
    assert!(back.iter().all(|byte| *byte == 5));
    // A flush covers every admitted write, so it waits for this one.
    let flushed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flusher = {
        let volume = volume.clone();
        let flushed = flushed.clone();
        std::thread::spawn(move || {
            volume.flush().unwrap();
            flushed.store(true, std::sync::atomic::Ordering::SeqCst);
        })
    };
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        !flushed.load(std::sync::atomic::Ordering::SeqCst),
        "a flush answered before an admitted write reached the journal"
    );
    held.finish().unwrap();
    flusher.join().unwrap();
    let state = volume.engine.lock();
    assert!(state.durable_sequence >= sequence);
    assert!(!state.writing, "the role is given back");
}

#[test]
fn a_held_write_dropped_unfinished_is_still_written() {
    let dir = tempfile::tempdir().unwrap();
    let pool = test_pool(dir.path());
    let volume = volume(&pool);
    until_journal_idle(&volume);
    let held = volume.admit_now(0, block(3).into()).unwrap();
    assert!(held.is_some(), "the journal writer was idle");
    drop(held);
    {
        let state = volume.engine.lock();
        assert_eq!(state.written_sequence + 1, state.next_sequence);
        assert!(!state.writing, "the role is given back");
    }
    // The journal writer takes the next writes as before.
    volume.write(4096, block(4), false).unwrap();
    volume.flush().unwrap();
    let mut back = vec![0u8; 8192];
    volume.read(0, &mut back).unwrap();
    assert!(back[..4096].iter().all(|byte| *byte == 3));
    assert!(back[4096..].iter().all(|byte| *byte == 4));
}

/// `HeldWrite::admit_also`: writes admitted while the role is held join
/// the held record, are visible at once, reach the journal together when
/// the holder finishes, and survive a crash once flushed.
#[test]
fn held_writes_gather_and_reach_the_journal_together() {
    let dir = tempfile::tempdir().unwrap();
    let pool = test_pool(dir.path());
    let volume = volume(&pool);
    until_journal_idle(&volume);
    let mut held = volume
        .admit_now(0, block(1).into())
        .unwrap()
        .expect("the journal writer is idle: this thread writes the record");
    let written_before = volume.engine.lock().written_sequence;
    for seed in 2..=4u8 {
        let back = held
            .admit_also(u64::from(seed - 1) * 8192, Arc::new(block(seed)))
            .unwrap();
        assert!(back.is_none(), "write {seed} did not join");
    }
    // Not whole blocks: handed back, nothing admitted.
    let next_before = volume.engine.lock().next_sequence;
    let partial = Arc::new(trireme_types::BlockBuf::from(vec![9u8; 512]));
    assert!(held.admit_also(0, partial).unwrap().is_some());
    {
        let state = volume.engine.lock();
        assert_eq!(
            state.next_sequence, next_before,
            "a handed-back write was admitted"
        );
        assert!(state.writing, "the writing role is held");
        assert_eq!(
            state.written_sequence, written_before,
            "nothing written yet"
        );
        assert_eq!(state.next_sequence, written_before + 5, "four records held");
    }
    // Admitted is visible.
    let mut back = vec![0u8; 4096];
    volume.read(2 * 8192, &mut back).unwrap();
    assert!(back.iter().all(|byte| *byte == 3));
    held.finish().unwrap();
    {
        let state = volume.engine.lock();
        assert_eq!(
            state.written_sequence,
            written_before + 4,
            "all four written"
        );
        assert!(!state.writing, "the role is given back");
    }
    volume.flush().unwrap();
    let (_copy, crashed) = crash_copy(&pool, dir.path(), |_| {});
    let recovered = crashed.open_volume(&VolumeName::new("v").unwrap()).unwrap();
    for seed in 1..=4u8 {
        recovered
            .read(u64::from(seed - 1) * 8192, &mut back)
            .unwrap();
        assert!(
            back.iter().all(|byte| *byte == seed),
            "write {seed} after the crash"
        );
    }
    assert!(crashed.scan().unwrap().is_clean());
}

/// A record another thread admits while the role is held comes between:
/// a later write may not join (its record would be written ahead of that
/// one), and the journal writer writes the other thread's record once the
/// holder gives the role back.
#[test]
fn a_write_admitted_by_another_thread_ends_the_gathering() {
    let dir = tempfile::tempdir().unwrap();
    let pool = test_pool(dir.path());
    let volume = volume(&pool);
    until_journal_idle(&volume);
    let mut held = volume.admit_now(0, block(1).into()).unwrap().unwrap();
    assert!(held.admit_also(4096, Arc::new(block(2))).unwrap().is_none());
    // Another client's write, admitted without waiting: the journal writer
    // is to write it, after the held records.
    let other = volume.clone();
    std::thread::spawn(
        move || match other.try_write_shared(8192, Arc::new(block(3))) {
            Attempt::Done(result) => result.unwrap(),
            Attempt::WouldBlock(_) => panic!("room for one block"),
        },
    )
    .join()
    .unwrap();
    let next = volume.engine.lock().next_sequence;
    let back = held.admit_also(12288, Arc::new(block(4))).unwrap();
    let data = back.expect("a write after another thread's record cannot join");
    assert_eq!(volume.engine.lock().next_sequence, next, "nothing admitted");
    held.finish().unwrap();
    volume
        .write(12288, Arc::unwrap_or_clone(data), false)
        .unwrap();
    volume.flush().unwrap();
    let mut back = vec![0u8; 4 * 4096];
    volume.read(0, &mut back).unwrap();
    for (index, piece) in back.chunks(4096).enumerate() {
        assert!(
            piece.iter().all(|byte| *byte == index as u8 + 1),
            "block {index}"
        );
    }
}
