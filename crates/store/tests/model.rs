//! Random sequences of writes, trims, zeroes, flushes, restarts and crashes
//! against a reference model: every read equals the model, accounting equals
//! the chunks the model says hold data, and a full scan is clean.

mod common;

use common::{name, pattern, TestPool};
use proptest::prelude::*;
use trireme_types::{BlockTarget, ZeroFlags};

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
}

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
        6 => (0..2usize, range(), any::<u64>(), any::<bool>())
            .prop_map(|(volume, (offset, length), seed, fua)| Operation::Write { volume, offset, length, seed, fua }),
        2 => (0..2usize, range()).prop_map(|(volume, (offset, length))| Operation::Trim { volume, offset, length }),
        1 => (0..2usize, range(), any::<bool>())
            .prop_map(|(volume, (offset, length), no_hole)| Operation::Zero { volume, offset, length, no_hole }),
        1 => Just(Operation::Flush),
        1 => Just(Operation::Sync),
        1 => any::<bool>().prop_map(Operation::PauseApplier),
        1 => Just(Operation::Reopen),
        1 => Just(Operation::CrashAndCheck),
    ]
}

struct Model {
    data: Vec<Vec<u8>>,
    written: Vec<Vec<bool>>,
}

impl Model {
    fn allocated_bytes(&self, volume: usize) -> u64 {
        self.written[volume]
            .chunks((CHUNK / BLOCK) as usize)
            .filter(|chunk| chunk.iter().any(|written| *written))
            .count() as u64
            * CHUNK
    }

    fn mark(
        &mut self,
        volume: usize,
        offset: u64,
        length: u64,
        written: bool,
        whole_blocks_only: bool,
    ) {
        let (first, end) = if whole_blocks_only {
            (offset.div_ceil(BLOCK), (offset + length) / BLOCK)
        } else {
            (offset / BLOCK, (offset + length).div_ceil(BLOCK))
        };
        for block in first..end.max(first) {
            self.written[volume][block as usize] = written;
        }
    }
}

fn check(test: &TestPool, model: &Model) {
    for (index, volume_name) in ["a", "b"].iter().enumerate() {
        let volume = test.pool.open_volume(&name(volume_name)).unwrap();
        let mut back = vec![0u8; VOLUME_BYTES as usize];
        volume.read(0, &mut back).unwrap();
        assert!(
            back == model.data[index],
            "volume {volume_name} differs from the model"
        );
    }
}

fn run(operations: Vec<Operation>) {
    let mut test = TestPool::create(24 * MIB);
    for volume in ["a", "b"] {
        test.pool
            .create_volume(&name(volume), VOLUME_BYTES)
            .unwrap();
    }
    let mut model = Model {
        data: vec![vec![0; VOLUME_BYTES as usize]; 2],
        written: vec![vec![false; (VOLUME_BYTES / BLOCK) as usize]; 2],
    };
    let mut paused = false;
    for operation in operations {
        let volume_of = |index: usize| test.pool.open_volume(&name(["a", "b"][index])).unwrap();
        match operation {
            Operation::Write {
                volume,
                offset,
                length,
                seed,
                fua,
            } => {
                let data = pattern(seed, length as usize);
                volume_of(volume).write(offset, data.clone(), fua).unwrap();
                model.data[volume][offset as usize..(offset + length) as usize]
                    .copy_from_slice(&data);
                model.mark(volume, offset, length, true, false);
            }
            Operation::Trim {
                volume,
                offset,
                length,
            } => {
                volume_of(volume).trim(offset, length, false).unwrap();
                // Whole blocks become holes reading zeros; partial blocks keep their data.
                let first = offset.div_ceil(BLOCK) * BLOCK;
                let end = (offset + length) / BLOCK * BLOCK;
                if end > first {
                    model.data[volume][first as usize..end as usize].fill(0);
                }
                model.mark(volume, offset, length, false, true);
            }
            Operation::Zero {
                volume,
                offset,
                length,
                no_hole,
            } => {
                let flags = ZeroFlags {
                    no_hole,
                    ..Default::default()
                };
                volume_of(volume)
                    .write_zeroes(offset, length, flags)
                    .unwrap();
                model.data[volume][offset as usize..(offset + length) as usize].fill(0);
                if no_hole {
                    model.mark(volume, offset, length, true, false);
                } else {
                    // Partial edge blocks are written with zeros; whole ones are freed.
                    model.mark(volume, offset, length, true, false);
                    model.mark(volume, offset, length, false, true);
                }
            }
            Operation::Flush => volume_of(0).flush().unwrap(),
            Operation::Sync => {
                if !paused {
                    test.pool.sync().unwrap();
                    for volume in 0..2 {
                        let info = test.pool.volume_info(&name(["a", "b"][volume])).unwrap();
                        assert_eq!(
                            info.allocated_bytes,
                            model.allocated_bytes(volume),
                            "volume {volume}"
                        );
                    }
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
                volume_of(1).flush().unwrap();
                let (_copy, crashed) = test.crash_copy();
                let crashed_test = TestPool {
                    dir: tempfile::tempdir().unwrap(),
                    pool: crashed,
                };
                check(&crashed_test, &model);
                let report = crashed_test.pool.scan().unwrap();
                assert!(report.is_clean(), "{report:?}");
            }
        }
        check(&test, &model);
    }
    test.pool.pause_applier(false);
    let report = test.pool.scan().unwrap();
    assert!(report.is_clean(), "{report:?}");
    for volume in 0..2 {
        let info = test.pool.volume_info(&name(["a", "b"][volume])).unwrap();
        assert_eq!(info.allocated_bytes, model.allocated_bytes(volume));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]
    #[test]
    fn the_store_behaves_like_the_model(operations in proptest::collection::vec(operation(), 1..40)) {
        run(operations);
    }
}
