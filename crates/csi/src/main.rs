//! `trireme-csi`: the CSI driver's binary. Serves the services of `--mode`
//! on the unix socket of `--endpoint` until SIGTERM or SIGINT.

use anyhow::{bail, Context, Result};
use clap::Parser;
use std::path::PathBuf;
use tokio_stream::wrappers::UnixListenerStream;

use trireme_csi::api::{parse_addresses, Api};
use trireme_csi::csi::controller_server::ControllerServer;
use trireme_csi::csi::identity_server::IdentityServer;
use trireme_csi::csi::node_server::NodeServer;
use trireme_csi::{Driver, Expansion, Mode, NodeConfig};

#[derive(Debug, Parser)]
#[command(
    name = "trireme-csi",
    version,
    about = "trireme's CSI driver (csi.trireme.io)"
)]
struct Args {
    /// The unix socket to serve CSI on.
    #[arg(long, env = "CSI_ENDPOINT", default_value = "unix:///csi/csi.sock")]
    endpoint: String,
    /// Which services to serve: the controller (one per cluster), the node
    /// plugin (one per machine), or both.
    #[arg(long, env = "CSI_MODE", value_enum, default_value = "all")]
    mode: Mode,
    /// The trireme node name of this machine (the CSI node id); needed by
    /// the node plugin.
    #[arg(long, env = "NODE_NAME")]
    node_name: Option<String>,
    /// trireme nodes' API addresses, tried in turn.
    #[arg(long, env = "TRIREME_API", default_value = "http://127.0.0.1:7450")]
    api: String,
    /// A file holding the admin token (the `token` key of an RPC's secrets
    /// takes its place for that RPC).
    #[arg(long, env = "TRIREME_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// Whether volumes in use may grow (Identity's volume-expansion
    /// capability). `auto`: online if this host has the kernel `nbd`
    /// module, else offline. The controller's answer is what csi-resizer
    /// follows: give `offline` there if any node lacks the module (an
    /// nbdfuse device cannot grow while staged).
    #[arg(
        long,
        env = "TRIREME_CSI_EXPANSION",
        value_enum,
        default_value = "auto"
    )]
    expansion: Expansion,
    /// Unused since the node daemon makes the block devices (it uses its
    /// own NBD socket); accepted so that manifests that still pass it
    /// start.
    #[arg(long, env = "TRIREME_NBD_SOCKET", hide = true)]
    nbd_socket: Option<PathBuf>,
    /// Unused, as --nbd-socket: the node daemon keeps the devices' state
    /// in its data directory.
    #[arg(long, env = "TRIREME_CSI_STATE_DIR", hide = true)]
    state_dir: Option<PathBuf>,
}

fn socket_path(endpoint: &str) -> Result<PathBuf> {
    match endpoint.strip_prefix("unix://") {
        Some(path) if !path.is_empty() => Ok(PathBuf::from(path)),
        _ if endpoint.starts_with('/') => Ok(PathBuf::from(endpoint)),
        _ => bail!("--endpoint {endpoint}: give a unix socket, e.g. unix:///csi/csi.sock"),
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let token = match &args.token_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("reading the token file {}", path.display()))?
                .trim()
                .to_string(),
        ),
        None => None,
    };
    let bases = parse_addresses(&args.api);
    if bases.is_empty() {
        bail!("--api names no address: give e.g. --api http://node1:7450,http://node2:7450");
    }
    let node = if args.mode.node() {
        let Some(node_name) = args.node_name.clone() else {
            bail!(
                "--mode {:?} needs --node-name (or NODE_NAME): this machine's trireme node name",
                args.mode
            );
        };
        if args.nbd_socket.is_some() || args.state_dir.is_some() {
            tracing::info!(
                "--nbd-socket and --state-dir are ignored: the trireme node daemon makes the \
                 block devices"
            );
        }
        Some(NodeConfig { node_name })
    } else {
        None
    };
    let expansion = args.expansion.resolve();
    tracing::info!(chosen = ?args.expansion, ?expansion, "volume expansion");
    let driver = Driver {
        mode: args.mode,
        expansion,
        api: Api::new(bases, token),
        node,
    };
    let path = socket_path(&args.endpoint)?;
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    // A socket left by an earlier run would make bind fail.
    let _ = std::fs::remove_file(&path);
    let listener = tokio::net::UnixListener::bind(&path)
        .with_context(|| format!("listening on {}", path.display()))?;
    tracing::info!(endpoint = %path.display(), mode = ?args.mode, "serving CSI");
    let server = tonic::transport::Server::builder()
        .add_service(IdentityServer::new(driver.clone()))
        .add_optional_service(
            args.mode
                .controller()
                .then(|| ControllerServer::new(driver.clone())),
        )
        .add_optional_service(args.mode.node().then(|| NodeServer::new(driver.clone())));
    let shutdown = async {
        let mut terminate =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                .expect("installing a SIGTERM handler");
        tokio::select! {
            _ = terminate.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    };
    let served = server
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await;
    let _ = std::fs::remove_file(&path);
    served.context("serving CSI")
}
