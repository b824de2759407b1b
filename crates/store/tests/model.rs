//! Random sequences of writes, trims, zeroes, flushes, restarts, crashes,
//! snapshots, snapshot deletions, clones, rollbacks and volume deletions
//! against a reference model: every read of every volume and snapshot
//! equals the model, accounting equals the chunks the model says hold data,
//! and a full scan (reference counts included) is clean after every step.

mod common;

use common::{name, pattern, TestPool};
use proptest::prelude::*;
use trireme_types::{BlockTarget, SnapshotId, VolumeName, ZeroFlags};

const MIB: u64 = 1 << 20;
const VOLUME_BYTES: u64 = 2 * MIB;
const BLOCK: u64 = 4096;
const CHUNK: u64 = 65536;

#[derive(Debug, Clone)]
enum Operation {
    Write {
        volume: usize,
        offset: u64,
        length: u64,
        seed: u64,
        fua: bool,
    },
    Trim {
        volume: usize,
        offset: u64,
        length: u64,
    },
    Zero {
        volume: usize,
        offset: u64,
        length: u64,
        no_hole: bool,
    },
    Flush,
    Sync,
    PauseApplier(bool),
    Reopen,
    CrashAndCheck,
    Snapshot {
        volume: usize,
    },
    DeleteSnapshot {
        volume: usize,
        pick: usize,
    },
    Clone {
        volume: usize,
        pick: usize,
    },
    Rollback {
        volume: usize,
        pick: usize,
    },
    DeleteVolume {
        volume: usize,
    },
}

/// Volumes and snapshots per volume are bounded so the pool never fills.
const VOLUMES_MAX: usize = 4;
const SNAPSHOTS_MAX: usize = 3;

fn range() -> impl Strategy<Value = (u64, u64)> {
    prop_oneof![
        // Whole chunks (written to fresh chunks, not through the journal).
        (0..VOLUME_BYTES / CHUNK, 1..4u64)
            .prop_map(|(chunk, count)| (chunk * CHUNK, count * CHUNK)),
        // Block-aligned, up to a few chunks.
        (0..VOLUME_BYTES / BLOCK, 1..48u64)
            .prop_map(|(block, count)| (block * BLOCK, count * BLOCK)),
        // Any bytes.
        (0..VOLUME_BYTES, 1..20_000u64),
    ]
    .prop_map(|(offset, length)| (offset, length.min(VOLUME_BYTES - offset).max(1)))
    .prop_filter("inside the volume", |(offset, length)| {
        offset + length <= VOLUME_BYTES
    })
}

fn operation() -> impl Strategy<Value = Operation> {
    prop_oneof![
        6 => (0..8usize, range(), any::<u64>(), any::<bool>())
            .prop_map(|(volume, (offset, length), seed, fua)| Operation::Write { volume, offset, length, seed, fua }),
        2 => (0..8usize, range()).prop_map(|(volume, (offset, length))| Operation::Trim { volume, offset, length }),
        1 => (0..8usize, range(), any::<bool>())
            .prop_map(|(volume, (offset, length), no_hole)| Operation::Zero { volume, offset, length, no_hole }),
        1 => Just(Operation::Flush),
        1 => Just(Operation::Sync),
        1 => any::<bool>().prop_map(Operation::PauseApplier),
        1 => Just(Operation::Reopen),
        1 => Just(Operation::CrashAndCheck),
        2 => (0..8usize).prop_map(|volume| Operation::Snapshot { volume }),
        1 => (0..8usize, 0..8usize).prop_map(|(volume, pick)| Operation::DeleteSnapshot { volume, pick }),
        1 => (0..8usize, 0..8usize).prop_map(|(volume, pick)| Operation::Clone { volume, pick }),
        1 => (0..8usize, 0..8usize).prop_map(|(volume, pick)| Operation::Rollback { volume, pick }),
        1 => (0..8usize).prop_map(|volume| Operation::DeleteVolume { volume }),
    ]
}

/// One image: its bytes, and which blocks are written (allocated).
#[derive(Clone)]
struct Image {
    data: Vec<u8>,
    written: Vec<bool>,
}

impl Image {
    fn new() -> Image {
        Image {
            data: vec![0; VOLUME_BYTES as usize],
            written: vec![false; (VOLUME_BYTES / BLOCK) as usize],
        }
    }

    fn allocated_bytes(&self) -> u64 {
        self.written
            .chunks((CHUNK / BLOCK) as usize)
            .filter(|chunk| chunk.iter().any(|written| *written))
            .count() as u64
            * CHUNK
    }

    fn mark(&mut self, offset: u64, length: u64, written: bool, whole_blocks_only: bool) {
        let (first, end) = if whole_blocks_only {
            (offset.div_ceil(BLOCK), (offset + length) / BLOCK)
        } else {
            (offset / BLOCK, (offset + length).div_ceil(BLOCK))
        };
        for block in first..end.max(first) {
            self.written[block as usize] = written;
        }
    }
}

struct ModelVolume {
    name: VolumeName,
    image: Image,
    snapshots: Vec<(SnapshotId, Image)>,
}

struct Model {
    volumes: Vec<ModelVolume>,
    next_snapshot: u64,
    next_volume: u64,
}

impl Model {
    fn pick(&self, volume: usize) -> Option<usize> {
        (!self.volumes.is_empty()).then(|| volume % self.volumes.len())
    }
}

fn read_all(target: &dyn BlockTarget) -> Vec<u8> {
    let mut back = vec![0u8; VOLUME_BYTES as usize];
    target.read(0, &mut back).unwrap();
    back
}

/// Written blocks as block status tells them, for comparison with the model.
fn allocated_blocks(target: &dyn BlockTarget) -> Vec<bool> {
    let mut written = Vec::new();
    let mut offset = 0;
    while offset < VOLUME_BYTES {
        for extent in target.block_status(offset, VOLUME_BYTES - offset).unwrap() {
            written.extend(std::iter::repeat_n(
                !extent.hole,
                (extent.length_bytes / BLOCK) as usize,
            ));
            offset += extent.length_bytes;
        }
    }
    written
}

fn check(test: &TestPool, model: &Model) {
    for volume in &model.volumes {
        let handle = test.pool.open_volume(&volume.name).unwrap();
        assert!(
            read_all(&*handle) == volume.image.data,
            "volume {} differs from the model",
            volume.name
        );
        let listed: Vec<SnapshotId> = test
            .pool
            .snapshots(&volume.name)
            .unwrap()
            .iter()
            .map(|info| info.id)
            .collect();
        let expected: Vec<SnapshotId> = volume.snapshots.iter().map(|(id, _)| *id).collect();
        assert_eq!(listed, expected, "snapshots of {}", volume.name);
        for (id, image) in &volume.snapshots {
            let view = test.pool.open_snapshot(&volume.name, *id).unwrap();
            assert!(
                read_all(&*view) == image.data,
                "snapshot {id} of {} differs from the model",
                volume.name
            );
            assert!(
                allocated_blocks(&*view) == image.written,
                "allocation of snapshot {id} of {} differs from the model",
                volume.name
            );
        }
    }
    assert_eq!(test.pool.volumes().len(), model.volumes.len());
}

fn check_accounting(test: &TestPool, model: &Model) {
    let report = test.pool.scan().unwrap();
    assert!(report.is_clean(), "{report:?}");
    for volume in &model.volumes {
        let info = test.pool.volume_info(&volume.name).unwrap();
        assert_eq!(
            info.allocated_bytes,
            volume.image.allocated_bytes(),
            "volume {}",
            volume.name
        );
    }
}

fn run(operations: Vec<Operation>) {
    let mut test = TestPool::create(64 * MIB);
    let mut model = Model {
        volumes: Vec::new(),
        next_snapshot: 1,
        next_volume: 0,
    };
    for volume in ["a", "b"] {
        test.pool
            .create_volume(&name(volume), VOLUME_BYTES)
            .unwrap();
        model.volumes.push(ModelVolume {
            name: name(volume),
            image: Image::new(),
            snapshots: Vec::new(),
        });
    }
    let mut paused = false;
    for operation in operations {
        let volume_of = |index: usize| test.pool.open_volume(&model.volumes[index].name).unwrap();
        match operation {
            Operation::Write {
                volume,
                offset,
                length,
                seed,
                fua,
            } => {
                let Some(volume) = model.pick(volume) else {
                    continue;
                };
                let data = pattern(seed, length as usize);
                volume_of(volume)
                    .write(offset, data.clone().into(), fua)
                    .unwrap();
                let image = &mut model.volumes[volume].image;
                image.data[offset as usize..(offset + length) as usize].copy_from_slice(&data);
                image.mark(offset, length, true, false);
            }
            Operation::Trim {
                volume,
                offset,
                length,
            } => {
                let Some(volume) = model.pick(volume) else {
                    continue;
                };
                volume_of(volume).trim(offset, length, false).unwrap();
                // Whole blocks become holes reading zeros; partial blocks keep their data.
                let image = &mut model.volumes[volume].image;
                let first = offset.div_ceil(BLOCK) * BLOCK;
                let end = (offset + length) / BLOCK * BLOCK;
                if end > first {
                    image.data[first as usize..end as usize].fill(0);
                }
                image.mark(offset, length, false, true);
            }
            Operation::Zero {
                volume,
                offset,
                length,
                no_hole,
            } => {
                let Some(volume) = model.pick(volume) else {
                    continue;
                };
                let flags = ZeroFlags {
                    no_hole,
                    ..Default::default()
                };
                volume_of(volume)
                    .write_zeroes(offset, length, flags)
                    .unwrap();
                let image = &mut model.volumes[volume].image;
                image.data[offset as usize..(offset + length) as usize].fill(0);
                // Partial edge blocks are written with zeros; whole ones are
                // freed unless NO_HOLE.
                image.mark(offset, length, true, false);
                if !no_hole {
                    image.mark(offset, length, false, true);
                }
            }
            Operation::Flush => {
                if let Some(volume) = model.pick(0) {
                    volume_of(volume).flush().unwrap();
                }
            }
            Operation::Sync => {
                if !paused {
                    test.pool.sync().unwrap();
                }
            }
            Operation::PauseApplier(pause) => {
                test.pool.pause_applier(pause);
                paused = pause;
            }
            Operation::Reopen => {
                test = test.reopen();
                paused = false;
            }
            Operation::CrashAndCheck => {
                // A flush makes every write durable (one journal per pool).
                volume_of(0).flush().unwrap();
                let (_copy, crashed) = test.crash_copy();
                let crashed_test = TestPool {
                    dir: tempfile::tempdir().unwrap(),
                    pool: crashed,
                };
                check(&crashed_test, &model);
                check_accounting(&crashed_test, &model);
            }
            Operation::Snapshot { volume } => {
                let Some(volume) = model.pick(volume) else {
                    continue;
                };
                if model.volumes[volume].snapshots.len() >= SNAPSHOTS_MAX {
                    continue;
                }
                let id = SnapshotId(model.next_snapshot);
                model.next_snapshot += 1;
                volume_of(volume).snapshot(id).unwrap();
                let image = model.volumes[volume].image.clone();
                model.volumes[volume].snapshots.push((id, image));
            }
            Operation::DeleteSnapshot { volume, pick } => {
                let Some(volume) = model.pick(volume) else {
                    continue;
                };
                let snapshots = &mut model.volumes[volume].snapshots;
                if snapshots.is_empty() {
                    continue;
                }
                let (id, _) = snapshots.remove(pick % snapshots.len());
                test.pool
                    .delete_snapshot(&model.volumes[volume].name, id)
                    .unwrap();
            }
            Operation::Clone { volume, pick } => {
                let Some(volume) = model.pick(volume) else {
                    continue;
                };
                let snapshots = &model.volumes[volume].snapshots;
                if snapshots.is_empty() || model.volumes.len() >= VOLUMES_MAX {
                    continue;
                }
                let (id, image) = snapshots[pick % snapshots.len()].clone();
                let clone = name(&format!("clone{}", model.next_volume));
                model.next_volume += 1;
                let info = test
                    .pool
                    .clone_volume(&model.volumes[volume].name, id, &clone)
                    .unwrap();
                assert_eq!(info.size_bytes, VOLUME_BYTES);
                model.volumes.push(ModelVolume {
                    name: clone,
                    image,
                    snapshots: Vec::new(),
                });
            }
            Operation::Rollback { volume, pick } => {
                let Some(volume) = model.pick(volume) else {
                    continue;
                };
                let snapshots = &model.volumes[volume].snapshots;
                if snapshots.is_empty() {
                    continue;
                }
                let (id, image) = snapshots[pick % snapshots.len()].clone();
                test.pool
                    .rollback_volume(&model.volumes[volume].name, id)
                    .unwrap();
                model.volumes[volume].image = image;
            }
            Operation::DeleteVolume { volume } => {
                let Some(volume) = model.pick(volume) else {
                    continue;
                };
                if model.volumes.len() <= 1 {
                    continue;
                }
                let removed = model.volumes.remove(volume);
                test.pool.delete_volume(&removed.name).unwrap();
            }
        }
        check(&test, &model);
        if !paused {
            check_accounting(&test, &model);
        }
    }
    test.pool.pause_applier(false);
    check_accounting(&test, &model);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]
    #[test]
    fn the_store_behaves_like_the_model(operations in proptest::collection::vec(operation(), 1..40)) {
        run(operations);
    }
}
