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
