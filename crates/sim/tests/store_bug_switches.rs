//! Proof that the store simulator catches broken rules (issue 22, item 4):
//! each of the store's bug switches breaks one rule, and `sim-store` must
//! fail within a bounded number of seeds with it on. A switch the
//! simulator stopped catching fails here.
//!
//! Replay one by hand: `cargo run -p trireme-sim --release --bin sim-store
//! -- --seeds 40 --bug NAME`.

use trireme_sim::store::{run_store_sim, switch_on, StoreSimConfig};

/// Runs seeds from 0 with switch `name` on until one fails; the seed that
/// failed, or `None` after `seeds` seeds. The failing seed must pass with
/// the switch off: the switch, not the run, broke it.
fn first_failure(name: &str, seeds: u64, shape: impl Fn(&mut StoreSimConfig)) -> Option<u64> {
    let config = |seed: u64, on: bool| {
        let mut config = StoreSimConfig::for_seed(seed);
        if on {
            switch_on(&mut config.bugs, name).expect("a known switch");
        }
        shape(&mut config);
        config
    };
    let failed = (0..seeds).find(|seed| run_store_sim(*seed, config(*seed, true)).is_err())?;
    if let Err(error) = run_store_sim(failed, config(failed, false)) {
        panic!("seed {failed} fails without {name} too: {error}");
    }
    Some(failed)
}

#[test]
fn a_flush_acknowledged_before_its_records_are_durable_is_caught() {
    let failed = first_failure("ack-before-durable", 20, |_| {});
    assert!(
        failed.is_some(),
        "20 seeds passed with flushes not made durable"
    );
}

#[test]
fn a_read_that_skips_its_checksum_is_caught() {
    // Corruption is what a skipped check lets through: every seed rots.
    let failed = first_failure("skip-read-checksum", 40, |config| {
        config.flip_per_thousand = 40;
    });
    assert!(
        failed.is_some(),
        "40 seeds passed without checksum checks on reads"
    );
}

#[test]
fn an_apply_before_the_journal_is_durable_is_caught() {
    let failed = first_failure("apply-before-durable", 20, |_| {});
    assert!(
        failed.is_some(),
        "20 seeds passed with applies ahead of the journal"
    );
}

#[test]
fn a_direct_write_outside_the_durable_active_set_is_caught() {
    let failed = first_failure("direct-before-active", 80, |_| {});
    assert!(
        failed.is_some(),
        "80 seeds passed with direct writes outside the active set"
    );
}
