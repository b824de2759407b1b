//! Runs the control-plane simulator over many seeds and prints failures.
//!
//! ```text
//! cargo run -p trireme-sim --release --bin sim-control -- --seeds 10000 [--start S] [--seed N] [--nodes N] [--steps K] [--threads T] [--time-limit SECONDS] [--twice] [--amnesia] [--trace]
//! ```
//!
//! Without `--nodes`, one seed in three runs five nodes and the others
//! three. `--amnesia` makes crashes wipe the node's database, a fault Raft
//! cannot survive, to see the checks catch it. `--twice` runs every seed
//! twice and fails it unless both runs give the same report (a determinism
//! check). Prints seeds per minute; exits with status 1 when a seed fails.

use std::process::ExitCode;

use clap::Parser;
use trireme_sim::runner::{run_seeds, SeedArgs, Simulator};
use trireme_sim::{run_control_sim, SimConfig, SimReport};

/// Runs the control-plane simulator over many seeds.
#[derive(Parser)]
#[command(name = "sim-control")]
struct Cli {
    #[command(flatten)]
    seeds: SeedArgs,
    /// Nodes per run (3 or 5), instead of each seed's own.
    #[arg(long)]
    nodes: Option<usize>,
    /// Steps per run, instead of each seed's own number.
    #[arg(long)]
    steps: Option<usize>,
    /// Crashes wipe the node's database (the checks must catch it).
    #[arg(long)]
    amnesia: bool,
}

struct Control {
    nodes: Option<usize>,
    steps: Option<usize>,
    amnesia: bool,
}

impl Simulator for Control {
    type Report = SimReport;

    fn run(&self, seed: u64, trace: bool) -> Result<SimReport, String> {
        let mut config = SimConfig::for_seed(seed);
        if let Some(nodes) = self.nodes {
            config.nodes = nodes;
        }
        if let Some(steps) = self.steps {
            config.steps = steps;
        }
        config.trace = trace;
        config.amnesia = self.amnesia;
        run_control_sim(seed, config)
    }

    fn totals(&self, _report: &SimReport) -> Vec<(u64, &'static str)> {
        Vec::new()
    }

    fn replay(&self, seed: u64) -> Vec<String> {
        let mut command = format!(
            "cargo run -p trireme-sim --release --bin sim-control -- --seeds 1 --start {seed} --trace"
        );
        if let Some(nodes) = self.nodes {
            command.push_str(&format!(" --nodes {nodes}"));
        }
        if let Some(steps) = self.steps {
            command.push_str(&format!(" --steps {steps}"));
        }
        if self.amnesia {
            command.push_str(" --amnesia");
        }
        // The test runs the default config: it replays only runs without
        // overrides.
        if self.nodes.is_none() && self.steps.is_none() && !self.amnesia {
            vec![
                format!("TRIREME_SIM_SEED={seed} cargo test -p trireme-sim --test control_sim"),
                command,
            ]
        } else {
            vec![command]
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let control = Control {
        nodes: cli.nodes,
        steps: cli.steps,
        amnesia: cli.amnesia,
    };
    run_seeds(&cli.seeds, &control).exit_code()
}
