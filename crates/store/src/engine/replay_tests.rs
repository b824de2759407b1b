//! Replay takes the checksums of the active regions' blocks from their data
//! (direct writes no flush covered), but only in chunks the checkpoint
//! mapped: a chunk replay filled keeps the checksums it was written with
//! (docs/store-format.md, *Replay* under *Small overwrites written once*).

use super::test_support::{crash_copy, physical, test_pool, until, MIB};
use crate::active_set::{region_of, REGION_CHUNKS};
use crate::layout::{BLOCKS_PER_CHUNK, CHUNK_BYTES};
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use trireme_types::{BlockBuf, BlockTarget, SnapshotId, TargetError, VolumeName};

const BLOCK: u64 = 4096;

/// Block `block` of a chunk written with `seed`: every block differs.
fn pattern(seed: u8, blocks: u64) -> Arc<BlockBuf> {
    let mut data = Vec::with_capacity((blocks * BLOCK) as usize);
    for block in 0..blocks {
        data.extend(std::iter::repeat_n(seed ^ block as u8, BLOCK as usize));
    }
    Arc::new(data.into())
}

/// Rot in a block outside the active set, then a copy-on-write of its
/// chunk into a chunk of an active region, then a crash before the next
/// checkpoint: replay redoes the copy, and the copy must keep the source's
/// checksum (its reads fail), not take one from the rotted data.
#[test]
fn rot_that_a_replayed_copy_moves_into_an_active_region_stays_detected() {
    let dir = tempfile::tempdir().unwrap();
    let pool = test_pool(dir.path());
    let name = VolumeName::new("v").unwrap();
    pool.create_volume(&name, 8 * MIB).unwrap();
    let volume = pool.open_volume(&name).unwrap();
    // Region 0 full, and one chunk in region 1: the lowest free chunk, which
    // the copy gets, is in region 1.
    for chunk in 0..=REGION_CHUNKS {
        volume
            .write_shared(
                chunk * CHUNK_BYTES,
                pattern(chunk as u8, BLOCKS_PER_CHUNK),
                false,
            )
            .unwrap();
    }
    pool.sync().unwrap();
    let source = physical(&volume, 0);
    let last = physical(&volume, REGION_CHUNKS);
    assert_eq!((region_of(source), region_of(last)), (0, 1));
    // An overwrite of written blocks in region 1 asks for it; the applier
    // activates it (durably). Region 0 is never asked for.
    volume
        .write_shared(REGION_CHUNKS * CHUNK_BYTES, pattern(9, 1), false)
        .unwrap();
    until("region 1 is active", || {
        volume.engine.lock().active_regions.contains(&1)
    });
    volume.snapshot(SnapshotId(1)).unwrap();
    pool.sync().unwrap();
    assert!(!volume.engine.lock().active_regions.contains(&0));

    // A durable write into the shared chunk 0, not applied: replay applies
    // it, copying the chunk's other blocks.
    pool.pause_applier(true);
    volume.write_shared(BLOCK, pattern(7, 1), true).unwrap();
    // Rot in block 2 of the source chunk, in the crashed copy's files.
    let rotted = volume
        .engine
        .layout
        .data_block_offset(source as u64 * BLOCKS_PER_CHUNK + 2);
    let (_crashed, reopened) = crash_copy(&pool, dir.path(), |copy| {
        let device = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(copy.join("pool.img"))
            .unwrap();
        let mut byte = [0u8; 1];
        device.read_exact_at(&mut byte, rotted + 100).unwrap();
        device
            .write_all_at(&[byte[0] ^ 0x10], rotted + 100)
            .unwrap();
    });
    pool.pause_applier(false);
    drop(volume);
    pool.shutdown().unwrap();
    drop(pool);

    let volume = reopened.open_volume(&name).unwrap();
    assert_eq!(
        region_of(physical(&volume, 0)),
        1,
        "the copy lies in the active region"
    );
    let mut back = vec![0u8; BLOCK as usize];
    volume.read(BLOCK, &mut back).unwrap();
    assert_eq!(back, pattern(7, 1)[..], "the replayed write");
    volume.read(3 * BLOCK, &mut back).unwrap();
    assert_eq!(
        back,
        pattern(0, BLOCKS_PER_CHUNK)[3 * BLOCK as usize..4 * BLOCK as usize]
    );
    let copy = volume.read(2 * BLOCK, &mut back);
    assert!(
        matches!(copy, Err(TargetError::Checksum { .. })),
        "the copy of a rotted block must fail its checksum, got {copy:?}"
    );
    let snapshot = reopened.open_snapshot(&name, SnapshotId(1)).unwrap();
    let source = snapshot.read(2 * BLOCK, &mut back);
    assert!(
        matches!(source, Err(TargetError::Checksum { .. })),
        "{source:?}"
    );
}
