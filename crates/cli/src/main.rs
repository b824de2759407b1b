//! `trireme`: the one binary. `trireme node run` is the daemon; every other
//! command is a client of a node's REST API.
//!
//! - `args`: the command line (clap derive), with size and name parsing.
//! - `client`: the blocking HTTP client (several node addresses, the admin
//!   token) and its error messages.
//! - `output`: tables, the status screen and JSON printing.
//! - `config`: the client config file (/etc/trireme/client.toml).
//! - `commands`: one module per noun (`status`, `node`, `pool`, `volume`,
//!   `group`, `cluster`).

mod args;
mod client;
mod commands;
mod config;
mod output;

use clap::{CommandFactory, FromArgMatches};
use std::process::ExitCode;

/// mimalloc instead of glibc's malloc: the replicated write path
/// allocates and frees small objects on several threads per write, and
/// glibc's malloc and free were 9% of all CPU samples during 4 KiB random
/// writes to three replicas (`perf record -a`). With mimalloc the same job
/// ran 8% faster at 5% less CPU per write (bench/RESULTS.md,
/// *replicated-cpu-notes*). Write buffers of 64 KiB to 2 MiB do not come
/// from here but from huge-page slots (trireme-types, `huge_slab`).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let matches = args::Cli::command().get_matches();
    let mut cli = args::Cli::from_arg_matches(&matches).unwrap_or_else(|error| error.exit());
    let daemon = matches!(cli.command, args::Command::Node(args::NodeCommand::Run(_)));
    if !daemon {
        restore_default_sigpipe();
    }
    // The daemon is no client, and `generate` runs at package build time:
    // neither should fail over a client config file.
    if !daemon && !matches!(cli.command, args::Command::Generate(_)) {
        match config::ClientConfig::load() {
            Ok(config) => config.apply(&mut cli, &matches),
            Err(error) => {
                eprintln!("error: {error:#}");
                return ExitCode::FAILURE;
            }
        }
    }
    match commands::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}

/// Rust ignores SIGPIPE, so `trireme volume list | head` would panic on a
/// closed pipe; a command-line client should just end quietly, as `ls` does.
/// Not for the daemon: a closed stdout must not kill a running node.
fn restore_default_sigpipe() {
    // SAFETY: called once at start, before any thread exists; SIG_DFL is a
    // valid disposition for SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}
