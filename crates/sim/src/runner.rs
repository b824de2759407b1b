//! The seed runner the simulator binaries share (`sim-store`,
//! `sim-replication`, `sim-control`): the seeds `start..start + seeds` on
//! `threads` threads, each run once (or twice, as a determinism check),
//! progress every [`PROGRESS_EVERY`] seeds, and one summary line with the
//! seeds per minute, the totals the simulator counts and the seeds that
//! failed. A failure prints its error and the commands that replay it.
//! `--time-limit` stops starting seeds after that many seconds; the
//! summary then says how many ran.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Progress goes to stderr after every this many seeds.
pub const PROGRESS_EVERY: u64 = 500;

/// The flags every simulator binary takes.
#[derive(Debug, Clone, clap::Args)]
pub struct SeedArgs {
    /// How many seeds to run.
    #[arg(long, default_value_t = 1000)]
    pub seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    pub start: u64,
    /// Run this one seed (`--start SEED --seeds 1`).
    #[arg(long, value_name = "SEED", conflicts_with_all = ["seeds", "start"])]
    pub seed: Option<u64>,
    /// Threads running seeds [default: one per core].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub threads: Option<u64>,
    /// Start no seed after this many seconds.
    #[arg(long, value_name = "SECONDS")]
    pub time_limit: Option<u64>,
    /// Run every seed twice and fail it unless both runs give the same
    /// report.
    #[arg(long)]
    pub twice: bool,
    /// Print every event (and each report).
    #[arg(long)]
    pub trace: bool,
}

impl SeedArgs {
    pub fn first(&self) -> u64 {
        self.seed.unwrap_or(self.start)
    }

    pub fn count(&self) -> u64 {
        if self.seed.is_some() {
            1
        } else {
            self.seeds
        }
    }

    pub fn threads(&self) -> usize {
        match self.threads {
            Some(threads) => threads as usize,
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }
}

/// A simulator as the runner drives it.
pub trait Simulator: Sync {
    type Report: PartialEq + std::fmt::Debug;

    /// Runs `seed`; `trace` prints every event.
    fn run(&self, seed: u64, trace: bool) -> Result<Self::Report, String>;

    /// What a report counts, summed over the seeds for the summary line,
    /// as `(count, what)`: `(3, "crashes")`. The same names in the same
    /// order for every report.
    fn totals(&self, report: &Self::Report) -> Vec<(u64, &'static str)>;

    /// The commands that replay `seed` with the options of this run.
    fn replay(&self, seed: u64) -> Vec<String>;
}

/// What a run of many seeds gave.
#[derive(Debug)]
pub struct Summary {
    pub ran: u64,
    pub failed: Vec<u64>,
}

impl Summary {
    pub fn exit_code(&self) -> std::process::ExitCode {
        if self.failed.is_empty() {
            std::process::ExitCode::SUCCESS
        } else {
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs the seeds of `args` with `simulator`, printing as it goes.
pub fn run_seeds<S: Simulator>(args: &SeedArgs, simulator: &S) -> Summary {
    let started = Instant::now();
    let (first, count) = (args.first(), args.count());
    let end = first.saturating_add(count);
    let limit = args.time_limit.map(Duration::from_secs);
    let next = AtomicU64::new(first);
    let done = AtomicU64::new(0);
    let out_of_time = AtomicBool::new(false);
    let failed = Mutex::new(Vec::new());
    let totals: Mutex<Vec<(u64, &'static str)>> = Mutex::new(Vec::new());
    let threads = args.threads();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| loop {
                if limit.is_some_and(|limit| started.elapsed() >= limit) {
                    out_of_time.store(true, Ordering::Relaxed);
                    return;
                }
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= end {
                    return;
                }
                match run_one(args, simulator, seed) {
                    Ok(report) => add(&mut totals.lock().unwrap(), simulator.totals(&report)),
                    Err(error) => {
                        println!("FAIL seed {seed}:\n{error}");
                        for command in simulator.replay(seed) {
                            println!("replay: {command}");
                        }
                        println!();
                        failed.lock().unwrap().push(seed);
                    }
                }
                let finished = done.fetch_add(1, Ordering::Relaxed) + 1;
                if finished.is_multiple_of(PROGRESS_EVERY) {
                    let seconds = started.elapsed().as_secs_f64();
                    eprintln!(
                        "{finished}/{count} seeds, {seconds:.0} s, {:.0} seeds per minute",
                        per_minute(finished, seconds)
                    );
                }
            });
        }
    });
    let mut failed = failed.into_inner().unwrap();
    failed.sort_unstable();
    let ran = done.into_inner();
    let seconds = started.elapsed().as_secs_f64();
    let counted: Vec<String> = totals
        .into_inner()
        .unwrap()
        .iter()
        .map(|(value, what)| format!("{value} {what}"))
        .collect();
    let counted = if counted.is_empty() {
        String::new()
    } else {
        format!("; {}", counted.join(", "))
    };
    let stopped = if out_of_time.into_inner() {
        format!(" (of {count}: the time limit stopped the run)")
    } else {
        String::new()
    };
    println!(
        "{ran} seeds from {first}{stopped} in {seconds:.1} s ({:.0} seeds per minute on {threads} threads{counted}): {} failed {failed:?}",
        per_minute(ran, seconds),
        failed.len(),
    );
    Summary { ran, failed }
}

/// One seed, twice with `--twice` (the second run without the trace).
fn run_one<S: Simulator>(args: &SeedArgs, simulator: &S, seed: u64) -> Result<S::Report, String> {
    let first = simulator.run(seed, args.trace)?;
    if args.trace {
        println!("{first:#?}");
    }
    if args.twice {
        match simulator.run(seed, false) {
            Ok(second) if second == first => {}
            Ok(second) => {
                return Err(format!(
                    "not deterministic: two runs gave\n{first:#?}\nand\n{second:#?}"
                ))
            }
            Err(error) => return Err(format!("the second run failed, the first not: {error}")),
        }
    }
    Ok(first)
}

fn add(totals: &mut Vec<(u64, &'static str)>, counts: Vec<(u64, &'static str)>) {
    if totals.is_empty() {
        *totals = counts;
        return;
    }
    for ((total, _), (value, _)) in totals.iter_mut().zip(counts) {
        *total += value;
    }
}

fn per_minute(seeds: u64, seconds: f64) -> f64 {
    seeds as f64 * 60.0 / seconds.max(0.001)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        seeds: SeedArgs,
    }

    /// Fails odd seeds; counts one "thing" per seed.
    struct Odd;

    impl Simulator for Odd {
        type Report = u64;
        fn run(&self, seed: u64, _trace: bool) -> Result<u64, String> {
            if seed % 2 == 1 {
                Err(format!("seed {seed} is odd"))
            } else {
                Ok(seed)
            }
        }
        fn totals(&self, _report: &u64) -> Vec<(u64, &'static str)> {
            vec![(1, "things")]
        }
        fn replay(&self, seed: u64) -> Vec<String> {
            vec![format!("odd --seed {seed}")]
        }
    }

    #[test]
    fn seeds_run_from_start_and_failures_are_collected() {
        let cli = Cli::parse_from(["sim", "--seeds", "6", "--start", "10", "--threads", "2"]);
        let summary = run_seeds(&cli.seeds, &Odd);
        assert_eq!(summary.ran, 6);
        assert_eq!(summary.failed, vec![11, 13, 15]);
    }

    #[test]
    fn one_seed_and_the_twice_check() {
        let cli = Cli::parse_from(["sim", "--seed", "4", "--twice"]);
        assert_eq!((cli.seeds.first(), cli.seeds.count()), (4, 1));
        let summary = run_seeds(&cli.seeds, &Odd);
        assert_eq!((summary.ran, summary.failed.len()), (1, 0));
        assert!(Cli::try_parse_from(["sim", "--seed", "4", "--start", "3"]).is_err());
        assert!(Cli::try_parse_from(["sim", "--threads", "0"]).is_err());
    }

    #[test]
    fn a_time_limit_of_zero_starts_nothing() {
        let cli = Cli::parse_from(["sim", "--seeds", "100", "--time-limit", "0"]);
        let summary = run_seeds(&cli.seeds, &Odd);
        assert_eq!(summary.ran, 0);
    }
}
