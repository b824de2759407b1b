//! Runs the control-plane simulator over many seeds and prints failures.
//!
//! ```text
//! cargo run -p trireme-sim --release --bin sim-control -- --seeds 10000 [--start S] [--nodes N] [--steps K] [--threads T] [--twice] [--amnesia] [--trace]
//! ```
//!
//! Without `--nodes`, one seed in three runs five nodes and the others
//! three. `--amnesia` makes crashes wipe the node's database, a fault Raft
//! cannot survive, to see the checks catch it. `--twice` runs every seed twice and fails it unless both runs
//! give the same report (a determinism check). Exits with status 1 when a
//! seed fails.

use std::process::ExitCode;
use std::time::Instant;

use trireme_sim::{run_control_sim, SimConfig};

struct Args {
    seeds: u64,
    start: u64,
    nodes: Option<usize>,
    steps: Option<usize>,
    threads: usize,
    twice: bool,
    amnesia: bool,
    trace: bool,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        seeds: 1000,
        start: 0,
        nodes: None,
        steps: None,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        twice: false,
        amnesia: false,
        trace: false,
    };
    let mut words = std::env::args().skip(1);
    while let Some(word) = words.next() {
        let mut value = |name: &str| -> Result<u64, String> {
            let text = words.next().ok_or(format!("{name} needs a value"))?;
            text.parse()
                .map_err(|_| format!("{name} {text}: not a number"))
        };
        match word.as_str() {
            "--seeds" => args.seeds = value("--seeds")?,
            "--start" => args.start = value("--start")?,
            "--nodes" => args.nodes = Some(value("--nodes")? as usize),
            "--steps" => args.steps = Some(value("--steps")? as usize),
            "--threads" => args.threads = (value("--threads")? as usize).max(1),
            "--twice" => args.twice = true,
            "--amnesia" => args.amnesia = true,
            "--trace" => args.trace = true,
            "--help" | "-h" => {
                return Err("usage: sim-control [--seeds N] [--start S] [--nodes N] [--steps K] [--threads T] [--twice] [--amnesia] [--trace]".into())
            }
            other => return Err(format!("unknown argument {other}; see --help")),
        }
    }
    Ok(args)
}

/// The command that runs one seed again with the same options, printing its
/// events.
fn replay_command(args: &Args, seed: u64) -> String {
    let mut command = format!(
        "cargo run -p trireme-sim --release --bin sim-control -- --seeds 1 --start {seed} --trace"
    );
    if let Some(nodes) = args.nodes {
        command.push_str(&format!(" --nodes {nodes}"));
    }
    if let Some(steps) = args.steps {
        command.push_str(&format!(" --steps {steps}"));
    }
    if args.amnesia {
        command.push_str(" --amnesia");
    }
    command
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    let started = Instant::now();
    let next = std::sync::atomic::AtomicU64::new(args.start);
    let end = args.start + args.seeds;
    let failures = std::sync::Mutex::new(Vec::new());
    let done = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|scope| {
        for _ in 0..args.threads {
            scope.spawn(|| loop {
                let seed = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if seed >= end {
                    return;
                }
                let mut config = SimConfig::for_seed(seed);
                if let Some(nodes) = args.nodes {
                    config.nodes = nodes;
                }
                if let Some(steps) = args.steps {
                    config.steps = steps;
                }
                config.trace = args.trace;
                config.amnesia = args.amnesia;
                let mut outcome = run_control_sim(seed, config.clone());
                if args.twice {
                    if let Ok(first) = &outcome {
                        match run_control_sim(seed, config) {
                            Ok(second) if &second == first => {}
                            Ok(second) => {
                                outcome = Err(format!(
                                    "not deterministic: two runs gave\n{first:#?}\nand\n{second:#?}"
                                ))
                            }
                            Err(error) => {
                                outcome = Err(format!("the second run failed, the first not: {error}"))
                            }
                        }
                    }
                }
                if let Err(error) = outcome {
                    println!("FAIL seed {seed}:\n{error}");
                    // The test runs the default config: it replays only
                    // runs without overrides.
                    if args.nodes.is_none() && args.steps.is_none() && !args.amnesia {
                        println!(
                            "replay: TRIREME_SIM_SEED={seed} cargo test -p trireme-sim --test control_sim"
                        );
                    }
                    println!("replay: {}\n", replay_command(&args, seed));
                    failures.lock().unwrap().push(seed);
                }
                let finished = done.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
                if finished.is_multiple_of(500) {
                    eprintln!(
                        "{finished}/{} seeds, {:.0} s",
                        args.seeds,
                        started.elapsed().as_secs_f64()
                    );
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap();
    failures.sort_unstable();
    println!(
        "{} seeds from {} in {:.1} s: {} failed {:?}",
        args.seeds,
        args.start,
        started.elapsed().as_secs_f64(),
        failures.len(),
        failures
    );
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
