//! One module per noun; each turns a parsed command into API calls and output.

mod node;
mod pool;
mod volume;

use anyhow::Result;

use crate::args::{Cli, Command};
use crate::client::Client;

pub fn run(cli: Cli) -> Result<()> {
    let client = || Client::new(&cli.api);
    match cli.command {
        Command::Node(command) => node::run(command, cli.output, client),
        Command::Pool(command) => pool::run(command, cli.output, &client()),
        Command::Volume(command) => volume::run(command, cli.output, &client()),
    }
}
