//! Seeded runs of the store simulator: the real store on simulated disks
//! that crash, tear, reorder, fail and rot (see `trireme_sim::store`).
//!
//! - `TRIREME_SIM_SEED=<seed>` runs that one seed, printing its steps.
//! - `TRIREME_SIM_SEEDS=<n>` runs seeds 0..n instead of the default batch.
//!
//! `sim-store` runs thousands of seeds; this is the batch CI affords.

use trireme_sim::store::{run_store_sim, StoreSimConfig};

/// Seeds per run by default: a few seconds of CPU on two cores.
const DEFAULT_SEEDS: u64 = 80;

fn env_u64(name: &str) -> Option<u64> {
    let text = std::env::var(name).ok()?;
    Some(
        text.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={text} is not a number")),
    )
}

#[test]
fn the_store_keeps_every_flushed_write_through_crashes_and_faults() {
    if let Some(seed) = env_u64("TRIREME_SIM_SEED") {
        let config = StoreSimConfig {
            trace: true,
            ..StoreSimConfig::for_seed(seed)
        };
        let report = run_store_sim(seed, config).unwrap_or_else(|error| panic!("{error}"));
        println!("{report:#?}");
        return;
    }
    let seeds = env_u64("TRIREME_SIM_SEEDS").unwrap_or(DEFAULT_SEEDS);
    let (even, odd): (Vec<u64>, Vec<u64>) = (0..seeds).partition(|seed| seed % 2 == 0);
    let run = |batch: Vec<u64>| {
        batch
            .into_iter()
            .map(|seed| run_store_sim(seed, StoreSimConfig::for_seed(seed)))
            .collect::<Vec<_>>()
    };
    let (first, second) = std::thread::scope(|scope| {
        let other = scope.spawn(|| run(odd));
        (run(even), other.join().expect("the seed thread"))
    });
    let outcomes: Vec<_> = first.into_iter().chain(second).collect();
    let failures: Vec<&String> = outcomes
        .iter()
        .filter_map(|outcome| outcome.as_ref().err())
        .collect();
    let crashes: u64 = outcomes.iter().flatten().map(|report| report.crashes).sum();
    let flips: u64 = outcomes
        .iter()
        .flatten()
        .map(|report| report.bits_flipped)
        .sum();
    let errors: u64 = outcomes
        .iter()
        .flatten()
        .map(|report| report.injected_errors)
        .sum();
    assert!(
        failures.is_empty(),
        "{} of {seeds} seeds failed:\n{}\nreplay one: TRIREME_SIM_SEED=<seed> cargo test -p trireme-sim --test store_sim",
        failures.len(),
        failures.iter().map(|failure| failure.as_str()).collect::<Vec<_>>().join("\n")
    );
    // The faults the runs promise did happen.
    assert!(crashes > seeds, "{crashes} crashes in {seeds} seeds");
    assert!(
        flips > 0 && errors > 0,
        "{flips} flips, {errors} injected errors"
    );
}

#[test]
fn one_seed_is_one_history() {
    for seed in [3, 17] {
        let first = run_store_sim(seed, StoreSimConfig::for_seed(seed));
        let second = run_store_sim(seed, StoreSimConfig::for_seed(seed));
        assert_eq!(first, second, "seed {seed} ran differently twice");
    }
}

/// A pool of format version 2 (what trireme wrote before small overwrites
/// went in place once), with records still in its journal, opens: its
/// journal replays in the old geometry, then it becomes version 3, and
/// small overwrites then go in place once, through crashes.
#[test]
fn a_version_2_pool_is_upgraded_when_opened() {
    use std::path::Path;
    use std::sync::Arc;
    use trireme_sim::disk::{CrashKeeps, SimDisk, SimRedbBackend};
    use trireme_store::{Background, Pool, PoolOnDisk, PoolOptions, Step};
    use trireme_types::{BlockBuf, BlockTarget, DeviceClass, PoolId, PoolName, VolumeName};

    let label = Path::new("sim:old-pool");
    let (disk, metadata) = (SimDisk::new(16 << 20, 5), SimDisk::new(0, 6));
    let pool = Pool::create_on_version(
        Arc::new(disk.clone()),
        SimRedbBackend(metadata.clone()),
        label,
        PoolOnDisk {
            name: PoolName::new("old").unwrap(),
            id: PoolId(1),
            class: DeviceClass::Ssd,
            uuid: 0x0123_4567_89ab_cdef,
        },
        PoolOptions::new(Background::Inline),
        2,
    )
    .unwrap();
    let superblock_version = |disk: &SimDisk| {
        let mut block = [0u8; 4096];
        trireme_store::Disk::read_at(disk, &mut block, 0).unwrap();
        u32::from_le_bytes(block[8..12].try_into().unwrap())
    };
    assert_eq!(superblock_version(&disk), 2);
    let name = VolumeName::new("v").unwrap();
    pool.create_volume(&name, 4 << 20).unwrap();
    let volume = pool.open_volume(&name).unwrap();
    let block = |value: u8| {
        let mut data = BlockBuf::zeroed(4096);
        data.fill(value);
        data
    };
    for index in 0..64u64 {
        volume
            .write(index * 4096, block(index as u8 + 1), false)
            .unwrap();
    }
    volume.flush().unwrap();
    assert_eq!(pool.direct_writes(), 0, "version 2 has no active set");
    assert!(
        pool.journal_stats().journal_used_bytes > 0,
        "records left to replay"
    );
    drop(volume);
    drop(pool);
    disk.crash(CrashKeeps::Everything);
    metadata.crash(CrashKeeps::Everything);

    let open = |disk: &SimDisk, metadata: &SimDisk| {
        Pool::open_on(
            Arc::new(disk.reopen()),
            SimRedbBackend(metadata.reopen()),
            label,
            Background::Inline,
        )
        .unwrap()
    };
    let pool = open(&disk, &metadata);
    assert_eq!(superblock_version(&disk.reopen()), 3);
    let volume = pool.open_volume(&name).unwrap();
    let mut read = vec![0u8; 4096];
    for index in 0..64u64 {
        volume.read(index * 4096, &mut read).unwrap();
        assert!(
            read.iter().all(|byte| *byte == index as u8 + 1),
            "block {index}"
        );
    }
    // The first overwrites ask for their region and take the journal; once
    // a checkpoint has made those durable in place, the next ones go in
    // place once.
    for round in 0..2u8 {
        for index in 0..64u64 {
            volume
                .write(index * 4096, block(100 + round), false)
                .unwrap();
        }
        while pool.step(Step::WriteJournal).unwrap() {}
        pool.step(Step::Apply).unwrap();
        pool.step(Step::Checkpoint).unwrap();
    }
    volume.flush().unwrap();
    assert!(pool.direct_writes() > 0, "overwrites went in place once");
    drop(volume);
    drop(pool);
    disk.crash(CrashKeeps::AnySectors);
    metadata.crash(CrashKeeps::AnySectors);
    let pool = open(&disk, &metadata);
    let volume = pool.open_volume(&name).unwrap();
    for index in 0..64u64 {
        volume.read(index * 4096, &mut read).unwrap();
        assert!(
            read.iter().all(|byte| *byte == 101),
            "block {index} after a crash"
        );
    }
    assert!(pool.scan().unwrap().is_clean());
}
