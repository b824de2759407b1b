//! `trireme`: the one binary. `trireme node run` is the daemon; every other
//! command is a client of a node's REST API.
//!
//! - `args`: the command line (clap derive), with size and name parsing.
//! - `client`: the blocking HTTP client (several node addresses, the admin
//!   token) and its error messages.
//! - `output`: tables, the status screen and JSON printing.
//! - `commands`: one module per noun (`status`, `node`, `pool`, `volume`,
//!   `group`, `cluster`).

mod args;
mod client;
mod commands;
mod output;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = args::Cli::parse();
    if !matches!(cli.command, args::Command::Node(args::NodeCommand::Run(_))) {
        restore_default_sigpipe();
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
