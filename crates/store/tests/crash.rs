//! What survives a crash: the files as a killed process leaves them are
//! copied aside and opened, which replays the journal.

mod common;

use common::{name, pattern, TestPool};
use std::os::unix::fs::FileExt;
use trireme_types::{BlockTarget, TargetError};

const MIB: u64 = 1 << 20;

#[test]
fn flushed_writes_survive_and_replay_is_exact() {
    let test = TestPool::create(64 * MIB);
    test.pool.create_volume(&name("v"), 16 * MIB).unwrap();
    let volume = test.pool.open_volume(&name("v")).unwrap();
    for round in 0..50u64 {
        volume
            .write((round % 20) * 65536, pattern(round, 65536).into(), false)
            .unwrap();
        if round % 7 == 0 {
            volume
                .trim(((round + 3) % 20) * 65536, 65536, false)
                .unwrap();
        }
    }
    volume.flush().unwrap();
    let mut expected = vec![0u8; 20 * 65536];
    volume.read(0, &mut expected).unwrap();
    let (_copy, crashed) = test.crash_copy();
    let recovered = crashed.open_volume(&name("v")).unwrap();
    let mut back = vec![0u8; expected.len()];
    recovered.read(0, &mut back).unwrap();
    let first = back.iter().zip(&expected).position(|(a, b)| a != b);
    assert!(back == expected, "recovered data differs at {first:?}");
    let report = crashed.scan().unwrap();
    assert!(report.is_clean(), "{report:?}");
}

#[test]
fn a_torn_journal_tail_is_dropped_not_reported_as_corruption() {
    let test = TestPool::create(64 * MIB);
    test.pool.create_volume(&name("v"), 4 * MIB).unwrap();
    let volume = test.pool.open_volume(&name("v")).unwrap();
    volume.write(0, vec![0xaa; 8192].into(), true).unwrap();
    test.pool.sync().unwrap();
    test.pool.pause_applier(true);
    volume.write(0, vec![0xbb; 8192].into(), true).unwrap();
    volume.write(8192, vec![0xcc; 4096].into(), true).unwrap();
    let copy = test.crash_files();
    // Tear the last record (the 0xcc one): flip a byte of its data.
    let device = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(copy.path().join("pool.img"))
        .unwrap();
    let journal_offset = 4096;
    let mut journal = vec![0u8; 4 * MIB as usize];
    device.read_exact_at(&mut journal, journal_offset).unwrap();
    let position = journal
        .windows(64)
        .rposition(|window| window.iter().all(|byte| *byte == 0xcc))
        .unwrap();
    device
        .write_all_at(&[0x00], journal_offset + position as u64)
        .unwrap();
    drop(device);
    let reopened = trireme_store::Pool::open(
        &copy.path().join("pool.img"),
        &copy.path().join("meta/metadata.redb"),
    )
    .unwrap();
    let volume = reopened.open_volume(&name("v")).unwrap();
    let mut back = vec![0u8; 12288];
    volume.read(0, &mut back).unwrap();
    assert!(
        back[..8192].iter().all(|byte| *byte == 0xbb),
        "the intact record replays"
    );
    assert!(
        back[8192..].iter().all(|byte| *byte == 0),
        "the torn record is dropped, no EIO"
    );
    assert!(reopened.scan().unwrap().is_clean());
}

#[test]
fn a_flipped_byte_in_place_is_caught_on_read() {
    let test = TestPool::create(64 * MIB);
    test.pool.create_volume(&name("v"), 4 * MIB).unwrap();
    let volume = test.pool.open_volume(&name("v")).unwrap();
    let data = pattern(9, 65536);
    volume.write(0, data.clone().into(), true).unwrap();
    test.pool.sync().unwrap();
    let device = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(test.device())
        .unwrap();
    let mut whole = vec![0u8; std::fs::metadata(test.device()).unwrap().len() as usize];
    device.read_exact_at(&mut whole, 0).unwrap();
    let journal_end = 4096 + 4 * MIB as usize;
    let at = journal_end
        + whole[journal_end..]
            .windows(4096)
            .position(|window| window == &data[4096..8192])
            .expect("block found in place");
    device
        .write_all_at(&[whole[at + 10] ^ 0x01], (at + 10) as u64)
        .unwrap();
    let mut block = vec![0u8; 4096];
    let error = volume.read(4096, &mut block).unwrap_err();
    assert!(matches!(error, TargetError::Checksum { .. }), "{error:?}");
    volume.read(0, &mut block).unwrap();
    assert_eq!(block, data[..4096]);
    assert!(test.pool.info().checksum_errors >= 1);
    let report = test.pool.scan().unwrap();
    assert_eq!(report.checksum_mismatches.len(), 1, "{report:?}");
}

#[test]
fn a_whole_chunk_write_with_torn_data_is_dropped_and_the_old_data_stays() {
    let test = TestPool::create(64 * MIB);
    test.pool.create_volume(&name("v"), 4 * MIB).unwrap();
    let volume = test.pool.open_volume(&name("v")).unwrap();
    let old = pattern(21, 65536);
    let new = pattern(22, 65536);
    volume.write(0, old.clone().into(), true).unwrap();
    test.pool.sync().unwrap();
    test.pool.pause_applier(true);
    // A whole, aligned chunk: written to a fresh chunk, the journal only names it.
    volume.write(0, new.clone().into(), true).unwrap();
    let copy = test.crash_files();
    let path = copy.path().join("pool.img");
    let device = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let mut whole = vec![0u8; std::fs::metadata(&path).unwrap().len() as usize];
    device.read_exact_at(&mut whole, 0).unwrap();
    let at = whole
        .windows(4096)
        .position(|window| window == &new[8192..12288])
        .expect("the new data is in its fresh chunk");
    device.write_all_at(&[whole[at] ^ 0xff], at as u64).unwrap();
    drop(device);
    let reopened =
        trireme_store::Pool::open(&path, &copy.path().join("meta/metadata.redb")).unwrap();
    let volume = reopened.open_volume(&name("v")).unwrap();
    let mut back = vec![0u8; 65536];
    volume.read(0, &mut back).unwrap();
    assert!(
        back == old,
        "a redirect whose data does not match its crcs must not replay"
    );
    assert!(reopened.scan().unwrap().is_clean());
}
