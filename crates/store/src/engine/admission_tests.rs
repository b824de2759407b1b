//! Writes that wait for the unapplied-data budget are admitted oldest
//! first (`admission_queue`).

use super::test_support::{test_pool, until, MIB};
use super::HELD_BYTES_MAX;
use std::time::Duration;
use trireme_types::{BlockTarget, VolumeName};

const KIB: u64 = 1 << 10;

#[test]
fn a_newcomer_does_not_take_the_room_held_for_a_waiting_write() {
    let dir = tempfile::tempdir().unwrap();
    let pool = test_pool(dir.path());
    let name = VolumeName::new("v").unwrap();
    pool.create_volume(&name, 16 * MIB).unwrap();
    let volume = pool.open_volume(&name).unwrap();
    // The budget is almost spent: 12 KiB left. (Counted, not written: the
    // applier is held back and the count is given back before it runs.)
    pool.pause_applier(true);
    let held = {
        let mut state = volume.engine.lock();
        let held = HELD_BYTES_MAX - 12 * KIB - state.unapplied_bytes - state.unstarted_bytes;
        state.unapplied_bytes += held;
        held
    };
    std::thread::scope(|scope| {
        let older = scope.spawn(|| volume.write(0, vec![1u8; 16 * KIB as usize].into(), false));
        until("the 16 KiB write waits", || {
            volume.engine.lock().admission.len() == 1
        });
        // 4 KiB fit in what is left, but not together with the 16 KiB
        // waiting ahead: the newcomer queues behind it.
        let newcomer = scope.spawn(|| volume.write(64 * KIB, vec![2u8; 4096].into(), false));
        until("the newcomer waits too", || {
            volume.engine.lock().admission.len() == 2
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !newcomer.is_finished(),
            "the newcomer overtook a waiting write"
        );
        assert!(!older.is_finished());
        {
            let mut state = volume.engine.lock();
            state.unapplied_bytes -= held;
        }
        volume.engine.changed.notify_all();
        older.join().unwrap().unwrap();
        newcomer.join().unwrap().unwrap();
    });
    assert_eq!(volume.engine.lock().admission.len(), 0);
    pool.pause_applier(false);
    let mut back = vec![0u8; 4096];
    volume.read(64 * KIB, &mut back).unwrap();
    assert!(back.iter().all(|byte| *byte == 2));
    volume.read(12 * KIB, &mut back).unwrap();
    assert!(back.iter().all(|byte| *byte == 1));
}

#[test]
fn room_held_by_applied_data_comes_back_once_its_write_back_starts() {
    let dir = tempfile::tempdir().unwrap();
    let pool = test_pool(dir.path());
    let name = VolumeName::new("v").unwrap();
    pool.create_volume(&name, 16 * MIB).unwrap();
    let volume = pool.open_volume(&name).unwrap();
    // Written once (journaled), then overwritten block by block out of
    // order (direct writes once their regions are active): both kinds of
    // in-place data go through the write-back thread.
    volume
        .write(0, vec![7u8; 16 * MIB as usize].into(), false)
        .unwrap();
    for round in 0..3u64 {
        for index in 0..4096u64 {
            let block = (index * 1031 + round) % 4096;
            volume
                .write(block * 4096, vec![round as u8; 4096].into(), false)
                .unwrap();
        }
    }
    volume.flush().unwrap();
    // Every byte counted at admission is given back: by the applier for
    // what writes nothing in place, by the write-back thread for the rest.
    // A byte left counted would hold writers back for good.
    until("nothing is held", || {
        let state = volume.engine.lock();
        state.unapplied_bytes == 0 && state.unstarted_bytes == 0
    });
    let mut back = vec![0u8; 4096];
    volume.read(5 * 4096, &mut back).unwrap();
    assert!(back.iter().all(|byte| *byte == 2));
}
