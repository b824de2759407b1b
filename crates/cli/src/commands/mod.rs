//! One module per noun; each turns a parsed command into API calls and output.

mod cluster;
mod events;
mod generate;
mod group;
mod node;
mod pool;
mod snapshot;
mod status;
mod volume;

use anyhow::Result;

use crate::args::{Cli, Command};
use crate::client::Client;

pub fn run(cli: Cli) -> Result<()> {
    let client = || Client::new(&cli.api, cli.token.as_deref());
    match cli.command {
        Command::Status => status::run(cli.output, &client()),
        Command::Node(command) => node::run(command, cli.output, client),
        Command::Pool(command) => pool::run(command, cli.output, &client()),
        Command::Volume(command) => volume::run(command, cli.output, &client()),
        Command::Group(command) => group::run(command, cli.output, &client()),
        Command::Cluster(command) => cluster::run(command, cli.output, &client()),
        Command::Snapshot(command) => snapshot::run(command, cli.output, &client()),
        Command::Events(arguments) => events::run(arguments, cli.output, &client()),
        Command::Generate(command) => generate::run(command),
    }
}
