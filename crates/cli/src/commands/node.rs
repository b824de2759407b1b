//! `trireme node run` (the daemon) and `trireme node info`.

use anyhow::{Context, Result};
use trireme_node::api::model::NodeResponse;
use trireme_node::DaemonConfig;

use crate::args::{NodeCommand, OutputFormat, RunArgs};
use crate::client::Client;
use crate::output;

/// Log level when RUST_LOG is not set.
const DEFAULT_LOG_FILTER: &str = "info";

pub fn run(command: NodeCommand, format: OutputFormat, client: impl Fn() -> Client) -> Result<()> {
    match command {
        NodeCommand::Run(arguments) => run_daemon(arguments),
        NodeCommand::Info => {
            let answer = client().get("/node")?;
            if format == OutputFormat::Json {
                output::print_json(&answer);
                return Ok(());
            }
            let node: NodeResponse = answer.parse()?;
            println!("trireme node {}", node.version);
            println!("  data directory: {}", node.data_dir);
            println!("  REST API:       http://{}", node.api_address);
            println!(
                "  NBD (TCP):      {}",
                node.nbd_tcp_address.as_deref().unwrap_or("-")
            );
            println!(
                "  NBD (unix):     {}",
                node.nbd_unix_socket.as_deref().unwrap_or("-")
            );
            Ok(())
        }
    }
}

fn run_daemon(arguments: RunArgs) -> Result<()> {
    // Logs go to stderr: stdout carries the few lines meant for people and
    // scripts (the default pool, the demo volume, the ready line).
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let config = DaemonConfig {
        data_dir: arguments.data_dir,
        api_listen: arguments.api_listen,
        nbd_listen: arguments.nbd_listen,
        nbd_socket: arguments.nbd_socket,
        demo: arguments.demo,
    };
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(trireme_node::run(config))?;
    Ok(())
}
