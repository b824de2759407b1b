//! `trireme generate completions SHELL` and `trireme generate man DIR`: the
//! completions and man pages of the .deb, made from the same clap
//! definitions as the parser, so they cannot drift from the real commands.

use anyhow::{Context, Result};
use clap::CommandFactory;

use crate::args::{Cli, GenerateCommand};

pub fn run(command: GenerateCommand) -> Result<()> {
    match command {
        GenerateCommand::Completions { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "trireme",
                &mut std::io::stdout(),
            );
            Ok(())
        }
        GenerateCommand::Man { dir } => {
            std::fs::create_dir_all(&dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
            clap_mangen::generate_to(Cli::command(), &dir)
                .with_context(|| format!("cannot write the man pages into {}", dir.display()))
        }
    }
}
