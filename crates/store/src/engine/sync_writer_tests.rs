//! A synchronous writer's batches go to the device with `O_DIRECT`, as
//! whole journal blocks (docs/store-format.md, *Synchronous writers*): the
//! records before a batch in its first block must survive the rewrite,
//! and small writes take the journal rather than going in place.

use super::active::Journaled;
use super::test_support::{crash_copy, filled, test_pool, MIB};
use crate::{Pool, Volume};
use trireme_types::{BlockTarget, VolumeName};

const BLOCK: u64 = 4096;

/// Where round `round` writes and how much: one to three blocks, so that
/// records (a 64-byte header and their data) end all over their blocks.
fn place(round: u64) -> (u64, u64) {
    (round * 3 * BLOCK, (1 + round % 3) * BLOCK)
}

fn direct_batches(volume: &Volume) -> u64 {
    volume
        .engine
        .journal_tail
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
        .direct_batches
}

/// Write, flush, write, flush: every batch after the first block boundary
/// rewrites the earlier records of its first block from memory. With the
/// applier held back nothing is checkpointed, so replay must find every
/// record: one lost or damaged by a direct batch ends the journal early
/// and the writes after it read as zeros.
#[test]
fn a_synchronous_writers_direct_batches_keep_the_records_before_them() {
    let dir = tempfile::tempdir().unwrap();
    let pool = test_pool(dir.path());
    let name = VolumeName::new("v").unwrap();
    pool.create_volume(&name, 16 * MIB).unwrap();
    let volume = pool.open_volume(&name).unwrap();
    pool.pause_applier(true);
    // The first flush makes the writer synchronous.
    volume.flush().unwrap();
    let rounds = 150;
    for round in 0..rounds {
        let (offset, bytes) = place(round);
        if round % 2 == 0 {
            volume
                .write_now(offset, filled(round as u8 + 1, bytes))
                .unwrap();
        } else {
            volume
                .write_shared(offset, filled(round as u8 + 1, bytes), false)
                .unwrap();
        }
        volume.flush().unwrap();
    }
    assert!(
        direct_batches(&volume) > rounds / 2,
        "only {} of {rounds} batches went direct",
        direct_batches(&volume)
    );
    let (_copy, crashed) = crash_copy(&pool, dir.path(), |_| {});
    let recovered = crashed.open_volume(&name).unwrap();
    for round in 0..rounds {
        let (offset, bytes) = place(round);
        let mut back = vec![0u8; bytes as usize];
        recovered.read(offset, &mut back).unwrap();
        assert!(
            back.iter().all(|byte| *byte == round as u8 + 1),
            "round {round}'s write at {offset} was lost in the crash"
        );
    }
    assert!(crashed.scan().unwrap().is_clean());
    pool.pause_applier(false);
    assert!(pool.scan().unwrap().is_clean());
}

/// Writes block 0 of `volume` until one goes in place: written,
/// checkpointed, its region asked for and activated. No client flushes
/// meanwhile (`last_flush_request` cleared), so none is a synchronous
/// writer's.
fn until_a_write_goes_in_place(pool: &Pool, volume: &Volume) {
    volume.write_shared(0, filled(1, MIB), false).unwrap();
    pool.sync().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        forget_flushes(volume);
        let direct = pool.direct_writes();
        volume.write_shared(0, filled(2, BLOCK), false).unwrap();
        if pool.direct_writes() > direct {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "never went in place");
        pool.sync().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

fn forget_flushes(volume: &Volume) {
    let mut state = volume.engine.lock();
    state.last_flush_request = None;
    for volume in state.volumes.values_mut() {
        volume.last_flush_request = None;
    }
}

fn synchronous_writes(volume: &Volume) -> u64 {
    volume
        .engine
        .lock()
        .write_path
        .journaled(Journaled::Synchronous)
}

/// A synchronous writer's small overwrite of a written block, which would
/// otherwise go in place, takes the journal with its data (one device
/// write before the flush). Another volume of the pool whose client does
/// not flush keeps writing in place: the rule is the volume's, not the
/// pool's.
#[test]
fn a_synchronous_writers_small_overwrites_take_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let pool = test_pool(dir.path());
    let mut volumes = Vec::new();
    for name in ["v", "w"] {
        let name = VolumeName::new(name).unwrap();
        pool.create_volume(&name, 16 * MIB).unwrap();
        let volume = pool.open_volume(&name).unwrap();
        until_a_write_goes_in_place(&pool, &volume);
        volumes.push(volume);
    }
    let (v, w) = (&volumes[0], &volumes[1]);
    assert_eq!(synchronous_writes(v), 0);
    v.flush().unwrap();
    let direct = pool.direct_writes();
    v.write_shared(BLOCK, filled(3, BLOCK), false).unwrap();
    assert_eq!(synchronous_writes(v), 1, "a synchronous writer's write");
    assert_eq!(pool.direct_writes(), direct, "nothing went in place");
    w.write_shared(BLOCK, filled(4, BLOCK), false).unwrap();
    assert_eq!(
        pool.direct_writes(),
        direct + 1,
        "the other volume's write went in place"
    );
    assert_eq!(synchronous_writes(v), 1);
    v.flush().unwrap();
    for (volume, seed) in [(v, 3), (w, 4)] {
        let mut back = vec![0u8; BLOCK as usize];
        volume.read(BLOCK, &mut back).unwrap();
        assert!(back.iter().all(|byte| *byte == seed));
    }
}
