//! Runs the store simulator over many seeds and prints failures.
//!
//! ```text
//! cargo run -p trireme-sim --release --bin sim-store -- --seeds 1000 [--start S] [--seed N] [--steps K] [--threads T] [--twice] [--trace] [--bug NAME]
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
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use trireme_sim::store::{run_store_sim, StoreSimConfig};

struct Args {
    seeds: u64,
    start: u64,
    steps: Option<usize>,
    threads: usize,
    twice: bool,
    trace: bool,
    bugs: trireme_store::BugSwitches,
}

fn parse() -> Result<Args, String> {
    let mut args = Args {
        seeds: 1000,
        start: 0,
        steps: None,
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        twice: false,
        trace: false,
        bugs: Default::default(),
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
            "--seed" => {
                args.start = value("--seed")?;
                args.seeds = 1;
            }
            "--steps" => args.steps = Some(value("--steps")? as usize),
            "--threads" => args.threads = (value("--threads")? as usize).max(1),
            "--twice" => args.twice = true,
            "--trace" => args.trace = true,
            "--bug" => {
                let name = words.next().ok_or("--bug needs a name")?;
                trireme_sim::store::switch_on(&mut args.bugs, &name)?;
            }
            "--help" | "-h" => {
                return Err("usage: sim-store [--seeds N] [--start S] [--seed N] [--steps K] [--threads T] [--twice] [--trace] [--bug NAME]".into())
            }
            other => return Err(format!("unknown argument {other}; see --help")),
        }
    }
    Ok(args)
}

fn main() -> ExitCode {
    let args = match parse() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    // Failures are reported with their seed below; the default hook would
    // print each caught panic a second time.
    std::panic::set_hook(Box::new(|_| {}));
    let started = Instant::now();
    let next = AtomicU64::new(args.start);
    let end = args.start + args.seeds;
    let failures = Mutex::new(Vec::new());
    let done = AtomicU64::new(0);
    let crashes = AtomicU64::new(0);
    let checked = AtomicU64::new(0);
    let direct = AtomicU64::new(0);
    let torn = AtomicU64::new(0);
    std::thread::scope(|scope| {
        for _ in 0..args.threads {
            scope.spawn(|| loop {
                let seed = next.fetch_add(1, Ordering::Relaxed);
                if seed >= end {
                    return;
                }
                let mut config = StoreSimConfig::for_seed(seed);
                if let Some(steps) = args.steps {
                    config.steps = steps;
                }
                config.trace = args.trace;
                config.bugs = args.bugs;
                let mut outcome = run_store_sim(seed, config.clone());
                if args.twice {
                    if let Ok(first) = &outcome {
                        config.trace = false;
                        match run_store_sim(seed, config) {
                            Ok(second) if &second == first => {}
                            Ok(second) => {
                                outcome = Err(format!(
                                    "not deterministic: two runs gave\n{first:#?}\nand\n{second:#?}"
                                ))
                            }
                            Err(error) => {
                                outcome =
                                    Err(format!("the second run failed, the first not: {error}"))
                            }
                        }
                    }
                }
                match outcome {
                    Ok(report) => {
                        crashes.fetch_add(report.crashes, Ordering::Relaxed);
                        checked.fetch_add(report.blocks_checked, Ordering::Relaxed);
                        direct.fetch_add(report.direct_writes, Ordering::Relaxed);
                        torn.fetch_add(report.torn_blocks, Ordering::Relaxed);
                        if args.trace {
                            println!("{report:#?}");
                        }
                    }
                    Err(error) => {
                        println!("FAIL {error}");
                        let mut replay = format!(
                            "cargo run -p trireme-sim --release --bin sim-store -- --seed {seed} --trace"
                        );
                        for name in trireme_sim::store::switched_on(&args.bugs) {
                            replay.push_str(&format!(" --bug {name}"));
                        }
                        if let Some(steps) = args.steps {
                            replay.push_str(&format!(" --steps {steps}"));
                        }
                        println!("replay: {replay}\n");
                        failures.lock().unwrap().push(seed);
                    }
                }
                let finished = done.fetch_add(1, Ordering::Relaxed) + 1;
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
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "{} seeds from {} in {seconds:.1} s ({:.0} seeds per minute on {} threads; {} crashes, {} blocks checked, {} direct writes, {} torn blocks after crashes): {} failed {:?}",
        args.seeds,
        args.start,
        args.seeds as f64 * 60.0 / seconds.max(0.001),
        args.threads,
        crashes.load(Ordering::Relaxed),
        checked.load(Ordering::Relaxed),
        direct.load(Ordering::Relaxed),
        torn.load(Ordering::Relaxed),
        failures.len(),
        failures
    );
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
