//! `trireme`: the one binary. `trireme node run` is the daemon; every other
//! command is a client of a node's REST API.
//!
//! - `args`: the command line (clap derive), with size and name parsing.
//! - `client`: the blocking HTTP client and its error messages.
//! - `output`: tables and JSON printing.
//! - `commands`: one module per noun (`node`, `pool`, `volume`).

mod args;
mod client;
mod commands;
mod output;

use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = args::Cli::parse();
    match commands::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
