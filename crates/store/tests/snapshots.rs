//! Snapshots, clones and rollback through the public API: content, space,
//! and what survives a crash at each step.

mod common;

use common::{name, pattern, TestPool};
use std::os::unix::fs::FileExt;
use trireme_store::{SnapshotInfo, StoreError};
use trireme_types::{BlockTarget, SnapshotId, TargetError, ZeroFlags};

const MIB: u64 = 1 << 20;
const CHUNK: u64 = 65536;

fn read(target: &dyn BlockTarget, offset: u64, length: u64) -> Vec<u8> {
    let mut buffer = vec![0u8; length as usize];
    target.read(offset, &mut buffer).unwrap();
    buffer
}

fn clean(test: &TestPool) {
    let report = test.pool.scan().unwrap();
    assert!(report.is_clean(), "{report:?}");
}

fn info(test: &TestPool, volume: &str, id: u64) -> SnapshotInfo {
    test.pool
        .snapshots(&name(volume))
        .unwrap()
        .into_iter()
        .find(|info| info.id == SnapshotId(id))
        .expect("listed")
}

#[test]
fn writes_after_a_snapshot_leave_its_bytes_unchanged() {
    let test = TestPool::create(64 * MIB);
    test.pool.create_volume(&name("v"), 4 * MIB).unwrap();
    let volume = test.pool.open_volume(&name("v")).unwrap();
    let before = pattern(1, 4 * CHUNK as usize);
    volume.write(0, before.clone().into(), false).unwrap();
    test.pool.sync().unwrap();
    volume.snapshot(SnapshotId(1)).unwrap();
    assert!(matches!(
        volume.snapshot(SnapshotId(1)),
        Err(StoreError::SnapshotExists { .. })
    ));
    // A partial block write, a 4 KiB write, and writes still in the journal.
    volume.write(100, vec![0xaa; 300].into(), false).unwrap();
    volume
        .write(CHUNK + 4096, vec![0xbb; 4096].into(), false)
        .unwrap();
    let snapshot = test.pool.open_snapshot(&name("v"), SnapshotId(1)).unwrap();
    assert!(snapshot.read_only());
    assert_eq!(read(&*snapshot, 0, 4 * CHUNK), before);
    test.pool.sync().unwrap();
    assert_eq!(read(&*snapshot, 0, 4 * CHUNK), before);
    let mut expected = before.clone();
    expected[100..400].fill(0xaa);
    expected[(CHUNK + 4096) as usize..(CHUNK + 8192) as usize].fill(0xbb);
    assert_eq!(read(&*volume, 0, 4 * CHUNK), expected);
    // A second write to a copied chunk goes in place: no new chunk.
    let allocated = test.pool.info().allocated_bytes;
    assert_eq!(allocated, 6 * CHUNK, "two chunks copied on write");
    volume.write(CHUNK, vec![0xcc; 4096].into(), false).unwrap();
    test.pool.sync().unwrap();
    assert_eq!(test.pool.info().allocated_bytes, allocated);
    // The view refuses writes and answers block status like the volume did.
    assert_eq!(
        snapshot.write(0, vec![0; 4096].into(), false),
        Err(TargetError::ReadOnly)
    );
    assert_eq!(snapshot.trim(0, 4096, false), Err(TargetError::ReadOnly));
    assert_eq!(
        snapshot.write_zeroes(0, 4096, ZeroFlags::default()),
        Err(TargetError::ReadOnly)
    );
    let status = snapshot.block_status(0, 4 * MIB).unwrap();
    assert_eq!(status[0].length_bytes, 4 * CHUNK);
    assert!(!status[0].hole && status[1].hole);
    let listed = info(&test, "v", 1);
    assert_eq!(listed.exclusive_bytes, 2 * CHUNK);
    assert_eq!(listed.shared_bytes, 2 * CHUNK);
    clean(&test);
}

#[test]
fn deleting_the_middle_of_three_snapshots_returns_exactly_its_exclusive_space() {
    let test = TestPool::create(64 * MIB);
    test.pool.create_volume(&name("v"), 4 * MIB).unwrap();
    let volume = test.pool.open_volume(&name("v")).unwrap();
    let mut images = Vec::new();
    // Chunk 0 changes before every snapshot; chunk 1 only before the
    // second (the middle one holds it alone); chunk 2 never.
    for round in 0..3u64 {
        volume
            .write(0, pattern(10 + round, CHUNK as usize).into(), false)
            .unwrap();
        if round == 1 {
            volume
                .write(CHUNK, pattern(20, 4096).into(), false)
                .unwrap();
        }
        if round == 0 {
            volume
                .write(2 * CHUNK, pattern(30, 8192).into(), false)
                .unwrap();
        }
        volume.snapshot(SnapshotId(round + 1)).unwrap();
        images.push(read(&*volume, 0, 3 * CHUNK));
        if round == 1 {
            // The middle snapshot's chunk 1 is overwritten after it.
            volume
                .write(CHUNK, pattern(21, 4096).into(), false)
                .unwrap();
        }
    }
    volume.write(0, pattern(40, 4096).into(), false).unwrap();
    test.pool.sync().unwrap();
    let middle = info(&test, "v", 2);
    // Its own chunk 0 and chunk 1 (the volume rewrote both since).
    assert_eq!(middle.exclusive_bytes, 2 * CHUNK);
    let before = test.pool.info().allocated_bytes;
    test.pool
        .delete_snapshot(&name("v"), SnapshotId(2))
        .unwrap();
    assert_eq!(
        before - test.pool.info().allocated_bytes,
        middle.exclusive_bytes
    );
    for (index, id) in [(0, 1), (2, 3)] {
        let view = test.pool.open_snapshot(&name("v"), SnapshotId(id)).unwrap();
        assert_eq!(read(&*view, 0, 3 * CHUNK), images[index], "snapshot {id}");
    }
    assert!(matches!(
        test.pool.open_snapshot(&name("v"), SnapshotId(2)),
        Err(StoreError::SnapshotNotFound { .. })
    ));
    assert!(matches!(
        test.pool.delete_snapshot(&name("v"), SnapshotId(2)),
        Err(StoreError::SnapshotNotFound { .. })
    ));
    clean(&test);
    // Deleting the others gives back everything but the volume's chunks.
    let oldest = info(&test, "v", 1).exclusive_bytes;
    let before = test.pool.info().allocated_bytes;
    test.pool
        .delete_snapshot(&name("v"), SnapshotId(1))
        .unwrap();
    assert_eq!(before - test.pool.info().allocated_bytes, oldest);
    test.pool
        .delete_snapshot(&name("v"), SnapshotId(3))
        .unwrap();
    assert_eq!(test.pool.info().allocated_bytes, 3 * CHUNK);
    drop(volume);
    let test = test.reopen();
    clean(&test);
}

#[test]
fn a_clone_survives_deletion_of_its_origin_snapshot_and_volume() {
    let test = TestPool::create(64 * MIB);
    test.pool.create_volume(&name("origin"), 4 * MIB).unwrap();
    let origin = test.pool.open_volume(&name("origin")).unwrap();
    let content = pattern(5, 8 * CHUNK as usize);
    origin.write(0, content.clone().into(), false).unwrap();
    origin.snapshot(SnapshotId(7)).unwrap();
    let before = test.pool.info().allocated_bytes;
    let info = test
        .pool
        .clone_volume(&name("origin"), SnapshotId(7), &name("copy"))
        .unwrap();
    assert_eq!(info.size_bytes, 4 * MIB);
    assert_eq!(
        test.pool.info().allocated_bytes,
        before,
        "a clone copies no data"
    );
    assert!(matches!(
        test.pool
            .clone_volume(&name("origin"), SnapshotId(7), &name("copy")),
        Err(StoreError::VolumeExists(_))
    ));
    let copy = test.pool.open_volume(&name("copy")).unwrap();
    assert_eq!(read(&*copy, 0, 8 * CHUNK), content);
    // Writes on either side copy on write.
    origin.write(0, vec![1; 4096].into(), false).unwrap();
    copy.write(CHUNK, vec![2; 4096].into(), false).unwrap();
    clean(&test);
    // A clone of a clone.
    copy.snapshot(SnapshotId(8)).unwrap();
    test.pool
        .clone_volume(&name("copy"), SnapshotId(8), &name("copy2"))
        .unwrap();
    test.pool
        .delete_snapshot(&name("origin"), SnapshotId(7))
        .unwrap();
    test.pool.delete_volume(&name("origin")).unwrap();
    test.pool.delete_volume(&name("copy")).unwrap();
    let mut expected = content.clone();
    expected[CHUNK as usize..(CHUNK + 4096) as usize].fill(2);
    let copy2 = test.pool.open_volume(&name("copy2")).unwrap();
    assert_eq!(read(&*copy2, 0, 8 * CHUNK), expected);
    assert_eq!(test.pool.info().allocated_bytes, 8 * CHUNK);
    clean(&test);
    drop((origin, copy, copy2));
    let test = test.reopen();
    let copy2 = test.pool.open_volume(&name("copy2")).unwrap();
    assert_eq!(read(&*copy2, 0, 8 * CHUNK), expected);
    copy2.write(0, vec![3; 4096].into(), true).unwrap();
    clean(&test);
    test.pool.delete_volume(&name("copy2")).unwrap();
    assert_eq!(test.pool.info().allocated_bytes, 0);
    clean(&test);
}

#[test]
fn rollback_restores_the_snapshot_and_keeps_the_snapshots() {
    let test = TestPool::create(64 * MIB);
    test.pool.create_volume(&name("v"), 4 * MIB).unwrap();
    let volume = test.pool.open_volume(&name("v")).unwrap();
    let first = pattern(1, 4 * CHUNK as usize);
    volume.write(0, first.clone().into(), false).unwrap();
    volume.snapshot(SnapshotId(1)).unwrap();
    volume
        .write(0, pattern(2, 2 * CHUNK as usize).into(), false)
        .unwrap();
    volume.trim(2 * CHUNK, CHUNK, false).unwrap();
    volume
        .write(8 * CHUNK, vec![9; 4096].into(), false)
        .unwrap();
    volume.snapshot(SnapshotId(2)).unwrap();
    let second = read(&*volume, 0, 16 * CHUNK);
    volume.write(CHUNK, vec![7; 8192].into(), false).unwrap();
    test.pool
        .rollback_volume(&name("v"), SnapshotId(1))
        .unwrap();
    let mut expected = first.clone();
    expected.resize(16 * CHUNK as usize, 0);
    assert_eq!(read(&*volume, 0, 16 * CHUNK), expected);
    let listed: Vec<_> = test
        .pool
        .snapshots(&name("v"))
        .unwrap()
        .iter()
        .map(|info| info.id.0)
        .collect();
    assert_eq!(listed, vec![1, 2]);
    let view = test.pool.open_snapshot(&name("v"), SnapshotId(2)).unwrap();
    assert_eq!(read(&*view, 0, 16 * CHUNK), second);
    clean(&test);
    // Writes after the rollback leave both snapshots alone.
    volume.write(0, vec![5; 4096].into(), false).unwrap();
    volume
        .write(4 * CHUNK, vec![5; CHUNK as usize].into(), false)
        .unwrap();
    let view = test.pool.open_snapshot(&name("v"), SnapshotId(1)).unwrap();
    assert_eq!(read(&*view, 0, 4 * CHUNK), first);
    test.pool
        .rollback_volume(&name("v"), SnapshotId(2))
        .unwrap();
    assert_eq!(read(&*volume, 0, 16 * CHUNK), second);
    clean(&test);
    test.pool
        .delete_snapshot(&name("v"), SnapshotId(1))
        .unwrap();
    test.pool
        .delete_snapshot(&name("v"), SnapshotId(2))
        .unwrap();
    assert_eq!(read(&*volume, 0, 16 * CHUNK), second);
    clean(&test);
}

#[test]
fn whole_chunk_writes_over_shared_chunks_keep_the_old_ones() {
    let test = TestPool::create(64 * MIB);
    test.pool.create_volume(&name("v"), 4 * MIB).unwrap();
    let volume = test.pool.open_volume(&name("v")).unwrap();
    let old = pattern(3, 4 * CHUNK as usize);
    volume.write(0, old.clone().into(), false).unwrap();
    volume.snapshot(SnapshotId(1)).unwrap();
    test.pool
        .clone_volume(&name("v"), SnapshotId(1), &name("c"))
        .unwrap();
    // Whole aligned chunks: redirected to fresh chunks at admission.
    let new = pattern(4, 2 * CHUNK as usize);
    volume.write(0, new.clone().into(), false).unwrap();
    let clone = test.pool.open_volume(&name("c")).unwrap();
    clone.write(2 * CHUNK, new.clone().into(), true).unwrap();
    test.pool.sync().unwrap();
    let snapshot = test.pool.open_snapshot(&name("v"), SnapshotId(1)).unwrap();
    assert_eq!(read(&*snapshot, 0, 4 * CHUNK), old);
    let mut expected = old.clone();
    expected[..2 * CHUNK as usize].copy_from_slice(&new);
    assert_eq!(read(&*volume, 0, 4 * CHUNK), expected);
    let mut expected = old.clone();
    expected[2 * CHUNK as usize..].copy_from_slice(&new);
    assert_eq!(read(&*clone, 0, 4 * CHUNK), expected);
    assert_eq!(test.pool.info().allocated_bytes, 8 * CHUNK);
    clean(&test);
    test.pool
        .delete_snapshot(&name("v"), SnapshotId(1))
        .unwrap();
    test.pool.delete_volume(&name("v")).unwrap();
    assert_eq!(read(&*clone, 0, 4 * CHUNK), expected);
    assert_eq!(test.pool.info().allocated_bytes, 4 * CHUNK);
    clean(&test);
}

#[test]
fn trims_of_shared_chunks_free_nothing_the_snapshot_reads() {
    let test = TestPool::create(64 * MIB);
    test.pool.create_volume(&name("v"), 4 * MIB).unwrap();
    let volume = test.pool.open_volume(&name("v")).unwrap();
    let old = pattern(6, 4 * CHUNK as usize);
    volume.write(0, old.clone().into(), false).unwrap();
    volume.snapshot(SnapshotId(1)).unwrap();
    // A whole chunk and half of another.
    volume.trim(0, CHUNK + CHUNK / 2, false).unwrap();
    test.pool.sync().unwrap();
    assert_eq!(test.pool.info().allocated_bytes, 4 * CHUNK);
    let snapshot = test.pool.open_snapshot(&name("v"), SnapshotId(1)).unwrap();
    assert_eq!(read(&*snapshot, 0, 4 * CHUNK), old);
    let mut expected = old.clone();
    expected[..(CHUNK + CHUNK / 2) as usize].fill(0);
    assert_eq!(read(&*volume, 0, 4 * CHUNK), expected);
    assert_eq!(
        test.pool.volume_info(&name("v")).unwrap().allocated_bytes,
        3 * CHUNK
    );
    clean(&test);
    // The half-trimmed chunk is shared (the snapshot reads all of it): a
    // write to its other half copies it.
    volume
        .write(CHUNK + CHUNK / 2, vec![8; 4096].into(), false)
        .unwrap();
    expected[(CHUNK + CHUNK / 2) as usize..(CHUNK + CHUNK / 2 + 4096) as usize].fill(8);
    test.pool.sync().unwrap();
    assert_eq!(read(&*volume, 0, 4 * CHUNK), expected);
    assert_eq!(read(&*snapshot, 0, 4 * CHUNK), old);
    assert_eq!(test.pool.info().allocated_bytes, 5 * CHUNK);
    clean(&test);
    // With the snapshot gone, the trimmed space comes back.
    test.pool
        .delete_snapshot(&name("v"), SnapshotId(1))
        .unwrap();
    assert_eq!(test.pool.info().allocated_bytes, 3 * CHUNK);
    clean(&test);
}

#[test]
fn a_volume_with_a_hundred_snapshots_reads_and_writes() {
    let test = TestPool::create(64 * MIB);
    test.pool.create_volume(&name("v"), 4 * MIB).unwrap();
    let volume = test.pool.open_volume(&name("v")).unwrap();
    let mut expected = vec![0u8; 16 * CHUNK as usize];
    for round in 0..100u64 {
        let offset = (round % 16) * CHUNK + (round % 7) * 4096;
        volume
            .write(offset, vec![round as u8; 4096].into(), false)
            .unwrap();
        expected[offset as usize..offset as usize + 4096].fill(round as u8);
        volume.snapshot(SnapshotId(round)).unwrap();
    }
    assert_eq!(read(&*volume, 0, 16 * CHUNK), expected);
    let snapshots = test.pool.snapshots(&name("v")).unwrap();
    assert_eq!(snapshots.len(), 100);
    let first = test.pool.open_snapshot(&name("v"), SnapshotId(0)).unwrap();
    let mut oldest = vec![0u8; 16 * CHUNK as usize];
    oldest[..4096].fill(0);
    assert_eq!(read(&*first, 0, 16 * CHUNK), oldest);
    clean(&test);
    drop((volume, first));
    let test = test.reopen();
    let volume = test.pool.open_volume(&name("v")).unwrap();
    assert_eq!(read(&*volume, 0, 16 * CHUNK), expected);
    clean(&test);
}

/// Crash copies taken before and after each operation, with writes still
/// in the journal around it: each copy opens to exactly the state the
/// operation had reached, and scans clean.
#[test]
fn crashes_around_each_operation_leave_a_consistent_pool() {
    let test = TestPool::create(64 * MIB);
    test.pool.create_volume(&name("v"), 4 * MIB).unwrap();
    let volume = test.pool.open_volume(&name("v")).unwrap();
    let base = pattern(11, 4 * CHUNK as usize);
    volume.write(0, base.clone().into(), false).unwrap();
    test.pool.sync().unwrap();
    test.pool.pause_applier(true);
    // The snapshot is durable and applied, not checkpointed: replay makes it.
    volume.write(0, vec![1; 4096].into(), false).unwrap();
    volume.snapshot(SnapshotId(1)).unwrap();
    let mut at_snapshot = base.clone();
    at_snapshot[..4096].fill(1);
    volume.write(CHUNK, vec![2; 4096].into(), true).unwrap();
    let mut now = at_snapshot.clone();
    now[CHUNK as usize..(CHUNK + 4096) as usize].fill(2);
    let check = |test: &TestPool, snapshots: &[(u64, &Vec<u8>)], content: &Vec<u8>| {
        let (_copy, crashed) = test.crash_copy();
        let volume = crashed.open_volume(&name("v")).unwrap();
        assert_eq!(&read(&*volume, 0, 4 * CHUNK), content);
        let listed = crashed.snapshots(&name("v")).unwrap();
        assert_eq!(listed.len(), snapshots.len());
        for (id, image) in snapshots {
            let view = crashed.open_snapshot(&name("v"), SnapshotId(*id)).unwrap();
            assert_eq!(&read(&*view, 0, 4 * CHUNK), *image, "snapshot {id}");
        }
        let report = crashed.scan().unwrap();
        assert!(report.is_clean(), "{report:?}");
        (_copy, crashed)
    };
    check(&test, &[(1, &at_snapshot)], &now);
    volume.snapshot(SnapshotId(2)).unwrap();
    volume
        .write(2 * CHUNK, vec![3; CHUNK as usize].into(), true)
        .unwrap();
    let at_second = now.clone();
    now[2 * CHUNK as usize..3 * CHUNK as usize].fill(3);
    check(&test, &[(1, &at_snapshot), (2, &at_second)], &now);
    // Clone: committed with a checkpoint; writes after it replay on top.
    test.pool
        .clone_volume(&name("v"), SnapshotId(1), &name("c"))
        .unwrap();
    volume.write(3 * CHUNK, vec![4; 4096].into(), true).unwrap();
    now[3 * CHUNK as usize..(3 * CHUNK + 4096) as usize].fill(4);
    let (_copy, crashed) = check(&test, &[(1, &at_snapshot), (2, &at_second)], &now);
    let clone = crashed.open_volume(&name("c")).unwrap();
    assert_eq!(read(&*clone, 0, 4 * CHUNK), at_snapshot);
    drop(crashed);
    // Delete the older snapshot.
    test.pool
        .delete_snapshot(&name("v"), SnapshotId(1))
        .unwrap();
    volume.write(0, vec![5; 4096].into(), true).unwrap();
    now[..4096].fill(5);
    check(&test, &[(2, &at_second)], &now);
    // Rollback.
    test.pool
        .rollback_volume(&name("v"), SnapshotId(2))
        .unwrap();
    now = at_second.clone();
    check(&test, &[(2, &at_second)], &now);
    volume.write(CHUNK, vec![6; 8192].into(), true).unwrap();
    now[CHUNK as usize..(CHUNK + 8192) as usize].fill(6);
    check(&test, &[(2, &at_second)], &now);
    // Delete the volume: the clone keeps its chunks.
    test.pool.delete_volume(&name("v")).unwrap();
    let (_copy, crashed) = test.crash_copy();
    assert!(crashed.open_volume(&name("v")).is_err());
    let clone = crashed.open_volume(&name("c")).unwrap();
    assert_eq!(read(&*clone, 0, 4 * CHUNK), at_snapshot);
    let report = crashed.scan().unwrap();
    assert!(report.is_clean(), "{report:?}");
    test.pool.pause_applier(false);
    clean(&test);
}

#[test]
fn a_snapshot_whose_record_is_torn_is_not_there_after_a_crash() {
    // A snapshot is acknowledged only once its record is durable; a torn
    // record (its payload damaged here) replays as if never taken.
    let test = TestPool::create(64 * MIB);
    test.pool.create_volume(&name("v"), 4 * MIB).unwrap();
    let volume = test.pool.open_volume(&name("v")).unwrap();
    volume.write(0, vec![1; 4096].into(), true).unwrap();
    test.pool.sync().unwrap();
    test.pool.pause_applier(true);
    volume.snapshot(SnapshotId(1)).unwrap();
    let (_copy, crashed) = test.crash_copy();
    assert_eq!(crashed.snapshots(&name("v")).unwrap().len(), 1);
    drop(crashed);
    let copy = test.crash_files();
    let path = copy.path().join("pool.img");
    let device = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let mut journal = vec![0u8; 4 * MIB as usize];
    device.read_exact_at(&mut journal, 4096).unwrap();
    let magic = 0x5452_4a52u32.to_le_bytes();
    let at = (0..journal.len() - 64)
        .step_by(64)
        .find(|at| journal[*at..*at + 4] == magic && journal[at + 8] == 5)
        .expect("the snapshot record is in the journal");
    device
        .write_all_at(&[journal[at + 64] ^ 0xff], 4096 + at as u64 + 64)
        .unwrap();
    drop(device);
    let reopened =
        trireme_store::Pool::open(&path, &copy.path().join("meta/metadata.redb")).unwrap();
    assert!(reopened.snapshots(&name("v")).unwrap().is_empty());
    let volume = reopened.open_volume(&name("v")).unwrap();
    assert_eq!(read(&*volume, 0, 4096), vec![1; 4096]);
    assert!(reopened.scan().unwrap().is_clean());
}

#[test]
fn snapshot_errors_are_clear() {
    let test = TestPool::create(32 * MIB);
    test.pool.create_volume(&name("v"), 4 * MIB).unwrap();
    let volume = test.pool.open_volume(&name("v")).unwrap();
    assert!(matches!(
        test.pool.open_snapshot(&name("v"), SnapshotId(1)),
        Err(StoreError::SnapshotNotFound { .. })
    ));
    assert!(matches!(
        test.pool.rollback_volume(&name("v"), SnapshotId(1)),
        Err(StoreError::SnapshotNotFound { .. })
    ));
    assert!(matches!(
        test.pool
            .clone_volume(&name("v"), SnapshotId(1), &name("c")),
        Err(StoreError::SnapshotNotFound { .. })
    ));
    assert!(matches!(
        test.pool.snapshots(&name("nope")),
        Err(StoreError::VolumeNotFound(_))
    ));
    volume.snapshot(SnapshotId(1)).unwrap();
    let view = test.pool.open_snapshot(&name("v"), SnapshotId(1)).unwrap();
    test.pool.delete_volume(&name("v")).unwrap();
    assert!(matches!(
        volume.snapshot(SnapshotId(2)),
        Err(StoreError::VolumeNotFound(_))
    ));
    assert_eq!(
        view.read(0, &mut [0u8; 4096]),
        Err(TargetError::ShuttingDown)
    );
    let message = StoreError::SnapshotExists {
        volume: name("v"),
        id: SnapshotId(3),
    }
    .to_string();
    assert!(message.contains("already has snapshot 3"), "{message}");
}

/// Reads of the blocks a copy-on-write copies, while the applier is copying
/// them: the map already points at the private copy, whose data lands a
/// moment later. Every read must return the shared chunk's data, never a
/// checksum error (found by bench/snapshots.sh reading a clone under load).
#[test]
fn reads_during_copy_on_write_see_the_shared_data() {
    use std::sync::atomic::{AtomicBool, Ordering};
    const CHUNKS: u64 = 512;
    let test = TestPool::create(256 * MIB);
    test.pool.create_volume(&name("v"), CHUNKS * CHUNK).unwrap();
    let volume = test.pool.open_volume(&name("v")).unwrap();
    let before = pattern(7, (CHUNKS * CHUNK) as usize);
    volume.write(0, before.clone().into(), false).unwrap();
    test.pool.sync().unwrap();
    volume.snapshot(SnapshotId(1)).unwrap();
    // Block 0 of every chunk, in a scattered order, held in the journal so
    // that one apply pass copies the other 15 blocks of all of them.
    test.pool.pause_applier(true);
    for round in 0..CHUNKS {
        let chunk = (round * 97) % CHUNKS;
        volume
            .write(chunk * CHUNK, vec![0xee; 4096].into(), false)
            .unwrap();
    }
    let applied = AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            test.pool.pause_applier(false);
            test.pool.sync().unwrap();
            applied.store(true, Ordering::Relaxed);
        });
        let mut reads = 0u64;
        while !applied.load(Ordering::Relaxed) || reads < 2 * CHUNKS {
            let chunk = (reads * 13) % CHUNKS;
            let offset = chunk * CHUNK + 4096;
            let length = CHUNK - 4096;
            let mut buffer = vec![0u8; length as usize];
            volume
                .read(offset, &mut buffer)
                .unwrap_or_else(|error| panic!("read of chunk {chunk}: {error}"));
            assert!(
                buffer == before[offset as usize..(offset + length) as usize],
                "chunk {chunk} changed"
            );
            reads += 1;
            assert!(reads < 10_000_000, "the apply pass never finished");
        }
    });
    clean(&test);
}

/// Field finding (as the admin saw it): write 4 MiB, snapshot s1,
/// overwrite, snapshot s2, overwrite. Each snapshot then holds 4 MiB that
/// nothing else does, and its exclusive bytes say so; deleting s1 gives
/// back exactly that. Whole-chunk writes (redirected) and 4 KiB writes
/// (copied on write) alike.
#[test]
fn overwritten_snapshots_list_the_bytes_deleting_them_gives_back() {
    for block_bytes in [4 * MIB as usize, 4096] {
        let test = TestPool::create(64 * MIB);
        test.pool.create_volume(&name("v"), 16 * MIB).unwrap();
        let volume = test.pool.open_volume(&name("v")).unwrap();
        let write_all = |seed: u64| {
            let data = pattern(seed, 4 * MIB as usize);
            for (index, block) in data.chunks(block_bytes).enumerate() {
                volume
                    .write((index * block_bytes) as u64, block.to_vec().into(), false)
                    .unwrap();
            }
        };
        write_all(1);
        volume.snapshot(SnapshotId(1)).unwrap();
        write_all(2);
        volume.snapshot(SnapshotId(2)).unwrap();
        write_all(3);
        test.pool.sync().unwrap();
        for id in [1, 2] {
            let listed = info(&test, "v", id);
            assert_eq!(
                (listed.exclusive_bytes, listed.shared_bytes),
                (4 * MIB, 0),
                "snapshot s{id} with {block_bytes}-byte writes"
            );
        }
        let before = test.pool.info().allocated_bytes;
        assert_eq!(before, 12 * MIB);
        test.pool
            .delete_snapshot(&name("v"), SnapshotId(1))
            .unwrap();
        assert_eq!(before - test.pool.info().allocated_bytes, 4 * MIB);
        assert_eq!(info(&test, "v", 2).exclusive_bytes, 4 * MIB);
        clean(&test);
    }
}
