//! Runs the store simulator over many seeds and prints failures.
//!
//! ```text
//! cargo run -p trireme-sim --release --bin sim-store -- --seeds 1000 [--start S] [--seed N] [--steps K] [--threads T] [--time-limit SECONDS] [--twice] [--trace] [--bug NAME]
//! ```
//!
//! `--bug NAME` turns on one of the store's bug switches
//! (`trireme_sim::store::BUG_NAMES`): the run should then fail.
//!
//! Each seed draws its own run (`StoreSimConfig::for_seed`): volumes,
//! crash and bit-flip rates, snapshots, injected EIO. `--seed N` runs that
//! one seed (with `--trace`, every step is printed). `--twice` runs every
//! seed twice and fails it unless both runs give the same report (a
//! determinism check). Prints seeds per minute; exits with status 1 when a
//! seed fails.

use std::process::ExitCode;

use clap::Parser;
use trireme_sim::runner::{run_seeds, SeedArgs, Simulator};
use trireme_sim::store::{run_store_sim, StoreSimConfig, StoreSimReport};

/// Runs the store simulator over many seeds.
#[derive(Parser)]
#[command(name = "sim-store")]
struct Cli {
    #[command(flatten)]
    seeds: SeedArgs,
    /// Steps per run, instead of each seed's own number.
    #[arg(long)]
    steps: Option<usize>,
    /// Turn on this bug switch of the store (may be given several times).
    #[arg(long = "bug", value_name = "NAME")]
    bugs: Vec<String>,
}

struct Store {
    steps: Option<usize>,
    bugs: trireme_store::BugSwitches,
}

impl Simulator for Store {
    type Report = StoreSimReport;

    fn run(&self, seed: u64, trace: bool) -> Result<StoreSimReport, String> {
        let mut config = StoreSimConfig::for_seed(seed);
        if let Some(steps) = self.steps {
            config.steps = steps;
        }
        config.trace = trace;
        config.bugs = self.bugs;
        run_store_sim(seed, config)
    }

    fn totals(&self, report: &StoreSimReport) -> Vec<(u64, &'static str)> {
        vec![
            (report.crashes, "crashes"),
            (report.blocks_checked, "blocks checked"),
            (report.direct_writes, "direct writes"),
            (report.torn_blocks, "torn blocks after crashes"),
        ]
    }

    fn replay(&self, seed: u64) -> Vec<String> {
        let mut replay =
            format!("cargo run -p trireme-sim --release --bin sim-store -- --seed {seed} --trace");
        for name in trireme_sim::store::switched_on(&self.bugs) {
            replay.push_str(&format!(" --bug {name}"));
        }
        if let Some(steps) = self.steps {
            replay.push_str(&format!(" --steps {steps}"));
        }
        vec![replay]
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let mut bugs = trireme_store::BugSwitches::default();
    for name in &cli.bugs {
        if let Err(message) = trireme_sim::store::switch_on(&mut bugs, name) {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    }
    // Failures are reported with their seed; the default hook would print
    // each caught panic a second time.
    std::panic::set_hook(Box::new(|_| {}));
    let store = Store {
        steps: cli.steps,
        bugs,
    };
    run_seeds(&cli.seeds, &store).exit_code()
}
