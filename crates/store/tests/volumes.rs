//! Pools and volumes through the public API: data, holes, space, errors,
//! restarts.

mod common;

use common::{name, pattern, TestPool};
use trireme_store::{Pool, StoreError};
use trireme_types::{BlockTarget, TargetError, ZeroFlags};

const MIB: u64 = 1 << 20;

#[test]
fn written_data_reads_back_and_the_rest_is_zero() {
    let test = TestPool::create(64 * MIB);
    test.pool.create_volume(&name("v"), 16 * MIB).unwrap();
    let volume = test.pool.open_volume(&name("v")).unwrap();
    let data = pattern(1, 128 * 1024);
    volume.write(4096 * 10, data.clone().into(), false).unwrap();
    let mut back = vec![0u8; data.len()];
    volume.read(4096 * 10, &mut back).unwrap();
    assert_eq!(back, data);
    let mut zeros = vec![1u8; 8192];
    volume.read(0, &mut zeros).unwrap();
    assert!(zeros.iter().all(|byte| *byte == 0));
    // Unaligned writes keep the bytes around them.
    volume
        .write(4096 * 10 + 100, vec![0xee; 5000].into(), true)
        .unwrap();
    let mut back = vec![0u8; 12000];
    volume.read(4096 * 10, &mut back).unwrap();
    let mut expected = data[..12000].to_vec();
    expected[100..5100].fill(0xee);
    assert_eq!(back, expected);
    // Once applied in place, the same bytes come from the device.
    test.pool.sync().unwrap();
    volume.read(4096 * 10, &mut back).unwrap();
    assert_eq!(back, expected);
    assert!(test.pool.scan().unwrap().is_clean());
}

#[test]
fn trim_returns_whole_chunks_and_block_status_shows_holes() {
    let test = TestPool::create(64 * MIB);
    test.pool.create_volume(&name("v"), 8 * MIB).unwrap();
    let volume = test.pool.open_volume(&name("v")).unwrap();
    volume
        .write(0, pattern(2, 256 * 1024).into(), false)
        .unwrap();
    test.pool.sync().unwrap();
    assert_eq!(
        test.pool.volume_info(&name("v")).unwrap().allocated_bytes,
        256 * 1024
    );
    let status = volume.block_status(0, 8 * MIB).unwrap();
    assert_eq!(status[0].length_bytes, 256 * 1024);
    assert!(!status[0].hole);
    assert!(status[1].hole && status[1].zero);
    volume.trim(64 * 1024, 128 * 1024, false).unwrap();
    test.pool.sync().unwrap();
    assert_eq!(
        test.pool.volume_info(&name("v")).unwrap().allocated_bytes,
        128 * 1024
    );
    let status = volume.block_status(0, 256 * 1024).unwrap();
    let kinds: Vec<_> = status
        .iter()
        .map(|e| (e.length_bytes / 1024, e.hole))
        .collect();
    assert_eq!(kinds, vec![(64, false), (128, true), (64, false)]);
    let mut back = vec![1u8; 128 * 1024];
    volume.read(64 * 1024, &mut back).unwrap();
    assert!(back.iter().all(|byte| *byte == 0));
    // Zeroes with NO_HOLE stay allocated; without, they are holes.
    volume
        .write_zeroes(
            0,
            64 * 1024,
            ZeroFlags {
                no_hole: true,
                ..Default::default()
            },
        )
        .unwrap();
    assert!(!volume.block_status(0, 4096).unwrap()[0].hole);
    assert!(matches!(
        volume.write_zeroes(
            0,
            4096,
            ZeroFlags {
                no_hole: true,
                fast_zero: true,
                fua: false
            }
        ),
        Err(TargetError::NotSupported(_))
    ));
    volume
        .write_zeroes(100, 70_000, ZeroFlags::default())
        .unwrap();
    let mut back = vec![1u8; 70_000];
    volume.read(100, &mut back).unwrap();
    assert!(back.iter().all(|byte| *byte == 0));
    assert!(test.pool.scan().unwrap().is_clean());
}

#[test]
fn a_full_pool_answers_enospc_and_recovers_after_trim() {
    let test = TestPool::create(16 * MIB);
    let capacity = test.pool.info().capacity_bytes;
    test.pool.create_volume(&name("big"), 64 * MIB).unwrap();
    assert!(
        test.pool.info().provisioned_bytes > capacity,
        "over-commit is allowed"
    );
    let volume = test.pool.open_volume(&name("big")).unwrap();
    let mut written = 0;
    let error = loop {
        match volume.write(written, vec![7u8; MIB as usize].into(), false) {
            Ok(()) => written += MIB,
            Err(error) => break error,
        }
        assert!(written <= capacity, "wrote past capacity");
    };
    assert!(matches!(error, TargetError::NoSpace { .. }), "{error:?}");
    // Overwriting allocated data still works in a full pool.
    volume.write(0, vec![8u8; 4096].into(), true).unwrap();
    // Whole chunks too: with no fresh chunk left they go through the journal.
    volume.write(65536, vec![8u8; 65536].into(), true).unwrap();
    volume.trim(0, written, false).unwrap();
    volume
        .write(0, vec![9u8; MIB as usize].into(), true)
        .unwrap();
    let report = test.pool.scan().unwrap();
    assert!(report.is_clean(), "{report:?}");
}

#[test]
fn volumes_and_data_survive_a_restart() {
    let test = TestPool::create(64 * MIB);
    test.pool.create_volume(&name("keep"), 4 * MIB).unwrap();
    let volume = test.pool.open_volume(&name("keep")).unwrap();
    volume.write(8192, pattern(3, 65536).into(), false).unwrap();
    drop(volume);
    let test = test.reopen();
    let volume = test.pool.open_volume(&name("keep")).unwrap();
    let mut back = vec![0u8; 65536];
    volume.read(8192, &mut back).unwrap();
    assert_eq!(back, pattern(3, 65536));
    let info = test.pool.grow_volume(&name("keep"), 8 * MIB).unwrap();
    assert_eq!(info.size_bytes, 8 * MIB);
    drop(volume);
    let test = test.reopen();
    assert_eq!(
        test.pool.volume_info(&name("keep")).unwrap().size_bytes,
        8 * MIB
    );
}

#[test]
fn bad_requests_get_clear_errors() {
    let test = TestPool::create(32 * MIB);
    let pool = &test.pool;
    assert!(matches!(
        pool.create_volume(&name("a"), 0),
        Err(StoreError::SizeZero)
    ));
    assert!(matches!(
        pool.create_volume(&name("a"), 1000),
        Err(StoreError::SizeUnaligned(1000))
    ));
    assert!(matches!(
        pool.create_volume(&name("a"), u64::MAX),
        Err(StoreError::SizeTooLarge { .. })
    ));
    pool.create_volume(&name("a"), 4 * MIB).unwrap();
    assert!(matches!(
        pool.create_volume(&name("a"), 4 * MIB),
        Err(StoreError::VolumeExists(_))
    ));
    assert!(matches!(
        pool.open_volume(&name("nope")),
        Err(StoreError::VolumeNotFound(_))
    ));
    assert!(matches!(
        pool.grow_volume(&name("a"), MIB),
        Err(StoreError::ShrinkRefused { .. })
    ));
    let volume = pool.open_volume(&name("a")).unwrap();
    assert!(matches!(
        volume.write(4 * MIB, vec![0; 4096].into(), false),
        Err(TargetError::Invalid(_))
    ));
    assert!(matches!(
        volume.read(u64::MAX - 10, &mut [0; 100]),
        Err(TargetError::Invalid(_))
    ));
    pool.delete_volume(&name("a")).unwrap();
    assert!(matches!(
        volume.write(0, vec![0; 4096].into(), false),
        Err(TargetError::ShuttingDown)
    ));
    assert!(matches!(
        pool.delete_volume(&name("a")),
        Err(StoreError::VolumeNotFound(_))
    ));
    let message = StoreError::SizeUnaligned(1000).to_string();
    assert!(message.contains("multiple of 4096"), "{message}");
}

#[test]
fn deleting_a_volume_returns_its_space_and_a_pool_refuses_a_second_create() {
    let test = TestPool::create(32 * MIB);
    test.pool.create_volume(&name("gone"), 8 * MIB).unwrap();
    let volume = test.pool.open_volume(&name("gone")).unwrap();
    volume
        .write(0, vec![1; 2 * MIB as usize].into(), false)
        .unwrap();
    test.pool.sync().unwrap();
    assert_eq!(test.pool.info().allocated_bytes, 2 * MIB);
    test.pool.delete_volume(&name("gone")).unwrap();
    assert_eq!(test.pool.info().allocated_bytes, 0);
    drop(volume);
    let test = test.reopen();
    assert_eq!(test.pool.info().allocated_bytes, 0);
    assert!(test.pool.volumes().is_empty());
    assert!(test.pool.scan().unwrap().is_clean());
    let again = Pool::create(common::config(test.dir.path(), 32 * MIB));
    assert!(
        again.is_err(),
        "a second pool over the first must be refused"
    );
}

/// Whole-chunk writes are applied without waiting for a device flush, but
/// the pad that ends a lap of the journal is not: a stream of them with no
/// flush, right after a lap ended, once filled the applier's memory and
/// stopped every writer for good (a 128k sequential write benchmark hung).
#[test]
fn whole_chunk_writes_after_the_end_of_a_journal_lap_never_stall() {
    // 192 MiB: a 12 MiB journal (1/16 of the pool), and fresh chunks for
    // more than the writers' 64 MiB memory cap.
    let test = TestPool::create(192 * MIB);
    test.pool.create_volume(&name("v"), 96 * MIB).unwrap();
    let volume = test.pool.open_volume(&name("v")).unwrap();
    // 4 KiB records take 4160 journal bytes: 3024 of them leave 3072 bytes
    // of the first lap, room for two whole-chunk records (1152 bytes each)
    // before the pad.
    let journal_bytes = 12 * MIB;
    let records = journal_bytes / 4160;
    assert_eq!(records, 3024);
    for index in 0..records {
        volume.write(0, pattern(index, 4096).into(), false).unwrap();
    }
    volume.flush().unwrap();
    // Long enough after the flush that the journal writer no longer flushes
    // each batch for a synchronous writer (that would hide the pad).
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (done, finished) = std::sync::mpsc::channel();
    let writer = volume.clone();
    std::thread::spawn(move || {
        for index in 0..80 {
            let offset = (index + 1) * MIB;
            writer
                .write(offset, pattern(index, MIB as usize).into(), false)
                .unwrap();
        }
        let _ = done.send(());
    });
    finished
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("80 MiB of whole-chunk writes did not complete within 60 s");
    volume.flush().unwrap();
    let mut back = vec![0u8; MIB as usize];
    volume.read(80 * MIB, &mut back).unwrap();
    assert!(
        back == pattern(79, MIB as usize),
        "the last write reads back"
    );
}

/// Bytes the pool file takes on the host.
fn host_bytes(test: &TestPool) -> u64 {
    test.pool
        .info()
        .host_bytes
        .expect("a pool file's blocks are measured")
}

/// Field finding: after a benchmark on a 2 GiB volume, each pool file took
/// 11 GB on the host while the pool held 2 GiB. Whole-chunk writes took
/// chunks past every chunk they freed, and freed chunks kept their space.
/// Here, round after round of whole-chunk overwrites, 4 KiB writes and
/// trims: after each checkpoint the file takes what the pool holds, plus
/// its journal and checksums, and never grows toward its size. Chunks
/// that overwrites freed may keep their space for the overwrites to take
/// again (warm chunks), at most a sixteenth of this small pool.
#[test]
fn a_pool_file_takes_on_its_host_about_the_data_it_holds() {
    let test = TestPool::create(256 * MIB);
    // The superblock, journal and checksum regions, written at creation.
    let regions = host_bytes(&test);
    test.pool.create_volume(&name("v"), 64 * MIB).unwrap();
    let volume = test.pool.open_volume(&name("v")).unwrap();
    let chunk = test.pool.info().chunk_bytes;
    let warm_max = test.pool.info().capacity_bytes / 16;
    let check = |when: &str| {
        let info = test.pool.info();
        let host = info.host_bytes.unwrap();
        assert!(
            info.warm_bytes <= warm_max,
            "{when}: {} bytes of warm chunks, over the limit of {warm_max}",
            info.warm_bytes
        );
        assert!(
            host <= regions + info.allocated_bytes + info.warm_bytes + MIB,
            "{when}: the pool file takes {host} bytes on the host for {} bytes of chunks in use and {} warm ({regions} of journal and checksums)",
            info.allocated_bytes,
            info.warm_bytes
        );
    };
    // 20 rounds write 400 MiB into a pool of about 240 MiB of chunks.
    for round in 0..20u64 {
        for piece in 0..16 {
            volume
                .write(
                    piece * MIB,
                    pattern(round * 100 + piece, MIB as usize).into(),
                    false,
                )
                .unwrap();
        }
        // One 4 KiB block in each of 64 chunks: journaled, applied in place.
        for index in 0..64 {
            volume
                .write(32 * MIB + index * chunk, pattern(round, 4096).into(), false)
                .unwrap();
        }
        // Trims give chunks back too: half of the whole chunks, and every
        // other one of the small writes.
        volume.trim(8 * MIB, 8 * MIB, false).unwrap();
        for index in (0..64).step_by(2) {
            volume.trim(32 * MIB + index * chunk, chunk, false).unwrap();
        }
        test.pool.sync().unwrap();
        check(&format!("round {round}"));
    }
    let mut back = vec![0u8; MIB as usize];
    volume.read(7 * MIB, &mut back).unwrap();
    assert_eq!(back, pattern(19 * 100 + 7, MIB as usize));
    volume.read(8 * MIB, &mut back).unwrap();
    assert!(back.iter().all(|byte| *byte == 0));
    assert!(test.pool.scan().unwrap().is_clean());
    // A volume deleted gives its space back as well.
    drop(volume);
    test.pool.delete_volume(&name("v")).unwrap();
    assert_eq!(test.pool.info().allocated_bytes, 0);
    check("after the volume was deleted");
}

/// A pool file that took space for chunks now free (left by a trireme that
/// did not give it back) gives it back when opened.
#[test]
fn opening_a_pool_gives_back_the_space_of_free_chunks() {
    use std::os::unix::fs::FileExt;
    let test = TestPool::create(128 * MIB);
    test.pool.create_volume(&name("v"), 16 * MIB).unwrap();
    let volume = test.pool.open_volume(&name("v")).unwrap();
    volume
        .write(0, pattern(1, 4 * MIB as usize).into(), true)
        .unwrap();
    drop(volume);
    let regions_and_data = host_bytes(&test);
    let test = {
        let TestPool { dir, pool } = test;
        pool.shutdown().unwrap();
        drop(pool);
        // The last 32 MiB of the file are free chunks; fill them.
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(dir.path().join("pool.img"))
            .unwrap();
        file.write_all_at(&vec![0x5a; 32 * MIB as usize], 96 * MIB)
            .unwrap();
        file.sync_all().unwrap();
        TestPool {
            pool: Pool::open(
                &dir.path().join("pool.img"),
                &dir.path().join("meta/metadata.redb"),
            )
            .unwrap(),
            dir,
        }
    };
    let host = host_bytes(&test);
    assert!(
        host <= regions_and_data + MIB,
        "the file takes {host} bytes after opening, {regions_and_data} before the junk"
    );
    let volume = test.pool.open_volume(&name("v")).unwrap();
    let mut back = vec![0u8; 4 * MIB as usize];
    volume.read(0, &mut back).unwrap();
    assert_eq!(back, pattern(1, 4 * MIB as usize));
}

/// A preallocated pool keeps its reservation: freed chunks are not given
/// back, so it never meets a full host file system.
#[test]
fn a_preallocated_pool_keeps_its_space_when_chunks_are_freed() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = common::config(dir.path(), 64 * MIB);
    config.preallocate = true;
    let pool = Pool::create(config).unwrap();
    pool.create_volume(&name("v"), 16 * MIB).unwrap();
    let volume = pool.open_volume(&name("v")).unwrap();
    volume
        .write(0, pattern(2, 8 * MIB as usize).into(), false)
        .unwrap();
    volume.trim(0, 8 * MIB, false).unwrap();
    pool.sync().unwrap();
    assert_eq!(pool.info().allocated_bytes, 0);
    let host = pool.info().host_bytes.unwrap();
    assert!(
        host >= 64 * MIB,
        "a preallocated pool file takes {host} bytes"
    );
}

/// `pool create` formats only what it may: a file holding data is refused
/// and left as it was, a pool no node uses is named as a pool; `force`
/// formats both.
#[test]
fn a_path_holding_data_or_a_pool_is_formatted_only_with_force() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("pool.img");
    std::fs::write(&path, "#!/bin/sh\necho precious\n").unwrap();
    let refused = Pool::create(common::config(dir.path(), 32 * MIB));
    match refused {
        Err(StoreError::HoldsData { found, .. }) => {
            assert_eq!(found, "text starting with \"#!/bin/sh\"")
        }
        other => panic!("a text file was not refused: {:?}", other.err()),
    }
    assert_eq!(std::fs::read(&path).unwrap(), b"#!/bin/sh\necho precious\n");
    assert!(!dir.path().join("meta/metadata.redb").exists());
    let mut config = common::config(dir.path(), 32 * MIB);
    config.force = true;
    let pool = Pool::create(config).unwrap();
    pool.create_volume(&name("v"), 4 * MIB).unwrap();
    pool.shutdown().unwrap();
    drop(pool);
    // The pool, with its metadata lost: refused as a pool, then formatted.
    let mut config = common::config(dir.path(), 32 * MIB);
    config.metadata_path = dir.path().join("other/metadata.redb");
    match Pool::create(config.clone()) {
        Err(error @ StoreError::AlreadyAPool { .. }) => {
            assert!(error.to_string().contains("--force"), "{error}")
        }
        other => panic!("an old pool was not refused: {:?}", other.err()),
    }
    config.force = true;
    let pool = Pool::create(config).unwrap();
    assert!(pool.volumes().is_empty());
}
