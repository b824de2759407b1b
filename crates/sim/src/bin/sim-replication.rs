//! Runs the replication simulator over many seeds and prints failures.
//!
//! ```text
//! cargo run -p trireme-sim --release --bin sim-replication -- --seeds 10000 [--start S] [--seed N] [--steps K] [--threads T] [--time-limit SECONDS] [--twice] [--trace]
//! ```
//!
//! Each seed draws its own mix (replica count, tiebreaker, volume size,
//! policy, fault levels) with `ReplicationSimConfig::for_seed`; `--steps`
//! overrides the number of steps. `--seed N` runs that one seed (with
//! `--trace`, every event is printed). `--twice` runs every seed twice and
//! fails it unless both runs give the same report (a determinism check).
//! Prints seeds per minute; exits with status 1 when a seed fails.

use std::process::ExitCode;

use clap::Parser;
use trireme_sim::runner::{run_seeds, SeedArgs, Simulator};
use trireme_sim::{run_replication_sim, ReplicationSimConfig, ReplicationSimReport};

/// Runs the replication simulator over many seeds.
#[derive(Parser)]
#[command(name = "sim-replication")]
struct Cli {
    #[command(flatten)]
    seeds: SeedArgs,
    /// Steps per run, instead of each seed's own number.
    #[arg(long)]
    steps: Option<usize>,
}

struct Replication {
    steps: Option<usize>,
}

impl Simulator for Replication {
    type Report = ReplicationSimReport;

    fn run(&self, seed: u64, trace: bool) -> Result<ReplicationSimReport, String> {
        let mut config = ReplicationSimConfig::for_seed(seed);
        if let Some(steps) = self.steps {
            config.steps = steps;
        }
        config.trace = trace;
        run_replication_sim(seed, config)
    }

    fn totals(&self, report: &ReplicationSimReport) -> Vec<(u64, &'static str)> {
        vec![
            (report.writes_ok, "acknowledged writes"),
            (report.blocks_checked, "blocks read and checked"),
            (report.grows, "grows"),
            (report.engine_grows, "grows taken by running engines"),
        ]
    }

    fn replay(&self, seed: u64) -> Vec<String> {
        let mut command = format!(
            "cargo run -p trireme-sim --release --bin sim-replication -- --seed {seed} --trace"
        );
        match self.steps {
            Some(steps) => {
                command.push_str(&format!(" --steps {steps}"));
                vec![command]
            }
            None => vec![
                format!("TRIREME_SIM_SEED={seed} cargo test -p trireme-sim --test replication_sim"),
                command,
            ],
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Failures are reported with their seed; the default hook would print
    // each caught panic a second time.
    std::panic::set_hook(Box::new(|_| {}));
    run_seeds(&cli.seeds, &Replication { steps: cli.steps }).exit_code()
}
