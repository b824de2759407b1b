//! `trireme node run`: start-up, listeners, the ready line, signals, shutdown.
//!
//! Start-up order:
//! 1. open the data directory and every pool of the catalog (a pool that
//!    fails to open is offline; the node starts anyway);
//! 2. on a node without pools, create the default pool;
//! 3. with `--demo`, create the volume `demo` if it is missing;
//! 4. bind the REST API and the NBD listeners;
//! 5. print the ready line (tests wait for it), then serve.
//!
//! On SIGTERM or SIGINT: stop the listeners, shut every pool down (which
//! applies its journal), return.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use trireme_types::{format_size, VolumeName};

use crate::api::{self, Addresses, ApiState};
use crate::cluster::{self, ClusterConfig};
use crate::nbd::{NbdConfig, NbdServer, NodeExports};
use crate::{Node, NodeError};

/// All interfaces: other nodes reach the API. Clients off loopback need the
/// admin token; node-to-node endpoints need signatures.
pub const DEFAULT_API_LISTEN: &str = "0.0.0.0:7450";
/// Loopback only: NBD has no authentication (NBD over TLS is not
/// implemented yet), and whoever reaches the port reads and writes every
/// volume served here. `--nbd-listen` opens it to a trusted network.
pub const DEFAULT_NBD_LISTEN: &str = "127.0.0.1:10809";
pub const DEFAULT_NBD_SOCKET_FILE: &str = "nbd.sock";
pub const DEMO_VOLUME_NAME: &str = "demo";
pub const DEMO_VOLUME_BYTES: u64 = 1 << 30;
/// How long the listeners get to finish in-flight requests at shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);
/// How long attached volumes get to detach cleanly at shutdown.
const ENGINE_DETACH_GRACE: Duration = Duration::from_secs(5);

#[derive(Debug, Clone)]
pub struct DaemonConfig {
    pub data_dir: PathBuf,
    /// Name, labels, join address and token, loopback trust.
    pub cluster: ClusterConfig,
    /// The IP other nodes reach this one at; default: the listen IP, or,
    /// when listening on all interfaces, the IP of the default route.
    pub advertise: Option<std::net::IpAddr>,
    pub api_listen: SocketAddr,
    pub nbd_listen: SocketAddr,
    /// Default: `DATA/nbd.sock`.
    pub nbd_socket: Option<PathBuf>,
    /// Where primaries on other nodes open data links; default: the API's
    /// IP on a port the system picks (announced through the cluster state).
    pub data_listen: Option<SocketAddr>,
    pub demo: bool,
    /// The timeouts of the kernel `nbd` devices this node makes.
    pub kernel_nbd_timeouts: crate::local_device::KernelNbdTimeouts,
}

/// Runs the node until SIGTERM or SIGINT.
pub async fn run(mut config: DaemonConfig) -> Result<(), NodeError> {
    // Pools record absolute paths, and the node may be started from
    // anywhere: `--data-dir ./trireme-data` means that directory, for good.
    config.data_dir = std::path::absolute(&config.data_dir).map_err(|error| {
        NodeError::io(
            format!("resolve the data directory {}", config.data_dir.display()),
            error,
        )
    })?;
    // A node that learned it was removed touches nothing, not even its pools.
    if let Some(refusal) = cluster::identity::Identity::load(&config.data_dir)?
        .and_then(|identity| identity.removed_error(&config.data_dir))
    {
        return Err(refusal);
    }
    let node = Arc::new(start_node(&config).await?);
    let result = serve(&config, node.clone()).await;
    // Also after a failed start (e.g. a port in use): the pools were opened
    // and maybe created, and their journals should be applied.
    let node_for_shutdown = node.clone();
    tokio::task::spawn_blocking(move || node_for_shutdown.shutdown())
        .await
        .map_err(|error| NodeError::Internal(format!("pool shutdown failed: {error}")))?;
    if result.is_ok() {
        // Whoever started the node may have closed our stdout by now.
        let _ = writeln!(std::io::stdout(), "trireme node stopped");
    }
    result
}

/// Steps 4 and 5 of start-up, then serving until a signal.
async fn serve(config: &DaemonConfig, node: Arc<Node>) -> Result<(), NodeError> {
    let api_listener = tokio::net::TcpListener::bind(config.api_listen)
        .await
        .map_err(|error| {
            NodeError::io(
                format!("listen for the REST API on {}", config.api_listen),
                error,
            )
        })?;
    let api_address = api_listener
        .local_addr()
        .map_err(|error| NodeError::io("read the REST API listen address", error))?;
    let nbd_socket = config
        .nbd_socket
        .clone()
        .unwrap_or_else(|| config.data_dir.join(DEFAULT_NBD_SOCKET_FILE));
    let data_listen = config
        .data_listen
        .unwrap_or_else(|| SocketAddr::new(config.api_listen.ip(), 0));
    let data_listener = std::net::TcpListener::bind(data_listen)
        .map_err(|error| NodeError::io(format!("listen for data links on {data_listen}"), error))?;
    let data_address = data_listener
        .local_addr()
        .map_err(|error| NodeError::io("read the data listen address", error))?;
    let metrics = crate::metrics::Metrics::new();
    let nbd_config = NbdConfig {
        tcp_listen: Some(config.nbd_listen),
        unix_socket: Some(nbd_socket),
    };
    // Bound before the cluster starts, which announces the NBD address;
    // its exports are built once the cluster handle exists.
    let nbd_server = NbdServer::bind(&nbd_config)
        .await
        .map_err(|error| NodeError::Nbd(error_chain(&error)))?;
    let nbd_tcp = nbd_server.tcp_local_addr();
    let addresses = Addresses {
        api: api_address.to_string(),
        nbd_tcp: nbd_tcp.map(|address| address.to_string()),
        nbd_url_base: nbd_tcp.map(client_address),
        nbd_unix: nbd_server
            .unix_socket_path()
            .map(|path| path.display().to_string()),
    };
    let nbd_socket_path = nbd_server.unix_socket_path().map(|path| path.to_path_buf());

    let cluster = cluster::start::start(
        config.cluster.clone(),
        &config.data_dir,
        advertised(api_address, config.advertise),
        nbd_tcp.map(|address| advertised(address, config.advertise)),
        Some(advertised(data_address, config.advertise)),
    )
    .await?;
    let replication = crate::replicated::Replication::open(
        node.clone(),
        cluster.clone(),
        advertised(data_address, config.advertise),
    )?;
    replication.listen(data_listener);
    write_admin_token(&config.data_dir, &cluster.admin_token())?;
    let exports = Arc::new(NodeExports::new(
        node.clone(),
        cluster.clone(),
        replication.clone(),
        metrics.clone(),
    ));

    let (stop_sender, stop_receiver) = watch::channel(false);
    let stopped = {
        let stop_receiver = stop_receiver.clone();
        move || {
            let mut receiver = stop_receiver.clone();
            async move {
                let _ = receiver.wait_for(|stop| *stop).await;
            }
        }
    };
    let devices = Arc::new(crate::local_device::LocalDevices::new(
        &config.data_dir,
        nbd_socket_path
            .clone()
            .unwrap_or_else(|| config.data_dir.join(DEFAULT_NBD_SOCKET_FILE)),
        config.kernel_nbd_timeouts,
    ));
    devices.follow_volume_sizes(cluster.clone());
    let router = api::router(ApiState {
        node: node.clone(),
        addresses: Arc::new(addresses.clone()),
        cluster: cluster.clone(),
        replication: replication.clone(),
        metrics: metrics.clone(),
        devices,
    });
    let api_server = axum::serve(
        api_listener,
        router.into_make_service_with_connect_info::<SocketAddr>(),
    )
    .with_graceful_shutdown(stopped());
    let mut api_task = tokio::spawn(async move { api_server.await });
    let background = [
        tokio::spawn(crate::agent::run(
            cluster.clone(),
            node.clone(),
            replication.clone(),
            stop_receiver.clone(),
        )),
        tokio::spawn(cluster::leader::heartbeat_loop(
            cluster.clone(),
            stop_receiver.clone(),
        )),
        tokio::spawn(cluster::leader::leader_loop(
            cluster.clone(),
            stop_receiver.clone(),
        )),
        tokio::spawn(crate::metrics::run_sampler(
            metrics.clone(),
            cluster.clone(),
            stop_receiver.clone(),
        )),
    ];

    // A node that just joined receives the state from the leader first.
    let me = cluster.node_id();
    let member = cluster
        .wait_for_state(Duration::from_secs(30), |state| {
            state.nodes.contains_key(&me)
        })
        .await;
    if !member {
        tracing::warn!(
            "this node has not received the cluster state yet; is the leader reachable?"
        );
    }
    cluster::start::propose_labels(&cluster).await;
    // Report this node's pools before anything is placed on them.
    if let Err(error) = crate::agent::reconcile(&cluster, &node).await {
        tracing::warn!(%error, "the first report of this node's pools failed; the agent retries");
    }
    if config.demo {
        ensure_demo_volume(&cluster).await?;
        print_demo_help(&addresses);
    }
    println!(
        "cluster {}: node '{}' (id {}); add a machine with: trireme node run --join {} --token {}",
        cluster.identity.cluster_id,
        cluster.config.name,
        cluster.node_id(),
        cluster.api_address,
        cluster.join_token(),
    );
    println!(
        "trireme node ready: api http://{} nbd {} unix {}",
        addresses.api,
        addresses.nbd_tcp.as_deref().unwrap_or("-"),
        addresses.nbd_unix.as_deref().unwrap_or("-"),
    );
    let _ = std::io::stdout().flush();

    let mut nbd_task = tokio::spawn(nbd_server.serve(exports, stopped()));

    let mut outcome = Ok(());
    tokio::select! {
        signal = stop_signal() => tracing::info!(signal, "stopping"),
        result = &mut api_task => tracing::error!(?result, "the REST API stopped on its own; stopping"),
        result = &mut nbd_task => tracing::error!(?result, "the NBD server stopped on its own; stopping"),
        reason = removal(&cluster) => {
            // Nothing this node holds may be served any more: stop, and
            // refuse every later start on this data directory.
            let refusal = cluster::start::record_removal(&cluster, &config.data_dir, reason);
            tracing::error!("{refusal}");
            outcome = Err(refusal);
        }
    }
    let _ = stop_sender.send(true);
    let finished = async {
        let _ = (&mut api_task).await;
        let _ = (&mut nbd_task).await;
    };
    if tokio::time::timeout(SHUTDOWN_GRACE, finished)
        .await
        .is_err()
    {
        tracing::warn!(grace = ?SHUTDOWN_GRACE, "listeners did not finish in time");
        api_task.abort();
        nbd_task.abort();
    }
    for task in background {
        task.abort();
    }
    replication.shutdown(ENGINE_DETACH_GRACE).await;
    if let Err(error) = cluster.raft.shutdown().await {
        tracing::warn!(%error, "Raft did not stop cleanly");
    }
    if let Some(path) = nbd_socket_path {
        // Only our own socket: nobody else listens on it any more.
        let _ = std::fs::remove_file(path);
    }
    outcome
}

/// Waits until a member (or this node's own copy of the state) says that
/// this node was removed from the cluster; returns who said it.
async fn removal(cluster: &cluster::Cluster) -> String {
    let mut removed = cluster.peers.removed();
    let reason = match removed.wait_for(Option::is_some).await {
        Ok(reason) => reason.clone(),
        // The sender lives as long as the cluster handle: never.
        Err(_) => std::future::pending().await,
    };
    reason.unwrap_or_default()
}

/// Steps 1 to 3 of start-up, on a blocking thread (they do disk I/O).
async fn start_node(config: &DaemonConfig) -> Result<Node, NodeError> {
    let data_dir = config.data_dir.clone();
    tokio::task::spawn_blocking(move || {
        let node = Node::open(&data_dir)?;
        match node.ensure_default_pool() {
            Ok(Some(info)) => println!(
                "created the default pool '{}': {} in the sparse file {} (class {}); add pools with `trireme pool create`",
                info.name,
                format_size(info.capacity_bytes),
                info.device_path.display(),
                info.class,
            ),
            Ok(None) => {}
            // The node still starts: pools can be added through the API.
            Err(error) => {
                tracing::error!(%error, "cannot create the default pool");
                println!("warning: cannot create the default pool: {error}");
            }
        }
        Ok(node)
    })
    .await
    .map_err(|error| NodeError::Internal(format!("start-up failed: {error}")))?
}

/// `--demo`: a 1 GiB volume named `demo` with its one replica on this node,
/// so this node's NBD server serves it.
async fn ensure_demo_volume(cluster: &cluster::Cluster) -> Result<(), NodeError> {
    let name = VolumeName::new(DEMO_VOLUME_NAME)?;
    if cluster.state.read().volumes.contains_key(&name) {
        return Ok(());
    }
    let reply = cluster
        .write(trireme_control::Command::CreateVolume {
            name: name.clone(),
            size_bytes: DEMO_VOLUME_BYTES,
            group: None,
            replicas: Some(1),
            nodes: Some(vec![cluster.config.name.clone()]),
            pool: None,
            adopt: None,
            now_ms: cluster::auth::now_ms(),
        })
        .await
        .map_err(|error| NodeError::Internal(format!("cannot create the demo volume: {error}")))?;
    let ready = cluster
        .wait_for_state(Duration::from_secs(30), |state| {
            state.volumes.get(&name).is_some_and(|volume| {
                volume
                    .diskful()
                    .all(|replica| replica.observed == trireme_control::ReplicaObserved::Ready)
            })
        })
        .await;
    if let (true, trireme_control::Reply::Volume(volume)) = (ready, reply) {
        println!(
            "created the demo volume '{}' ({}) in pool '{}'",
            volume.name,
            format_size(volume.size_bytes),
            volume.replicas[0]
                .pool
                .as_ref()
                .map(|pool| pool.as_str())
                .unwrap_or("-")
        );
    }
    Ok(())
}

fn print_demo_help(addresses: &Addresses) {
    let Some(base) = &addresses.nbd_url_base else {
        return;
    };
    let url = format!("nbd://{base}/{DEMO_VOLUME_NAME}");
    println!("the demo volume is served at {url}");
    println!("  try: nbdinfo {url}");
    println!("       qemu-img info {url}");
    if let Some(socket) = &addresses.nbd_unix {
        println!("       nbdinfo 'nbd+unix:///{DEMO_VOLUME_NAME}?socket={socket}'");
    }
}

/// `DATA/admin.token`: what remote clients present (mode 0600).
fn write_admin_token(data_dir: &std::path::Path, token: &str) -> Result<(), NodeError> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = data_dir.join("admin.token");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .map_err(|error| NodeError::io(format!("write {}", path.display()), error))?;
    writeln!(file, "{token}")
        .map_err(|error| NodeError::io(format!("write {}", path.display()), error))
}

/// `outer: inner: ...`, so the OS reason (e.g. "Address in use") is shown.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(&format!(": {cause}"));
        source = cause.source();
    }
    text
}

/// The address other nodes dial: a wildcard bind is advertised at the
/// `--advertise` IP, else at the IP the default route leaves from.
fn advertised(bound: SocketAddr, advertise: Option<std::net::IpAddr>) -> String {
    if !bound.ip().is_unspecified() {
        return bound.to_string();
    }
    let ip = advertise.or_else(default_route_ip).unwrap_or(bound.ip());
    let ip = if ip.is_unspecified() {
        std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)
    } else {
        ip
    };
    SocketAddr::new(ip, bound.port()).to_string()
}

/// The local IP of the default route: connecting a UDP socket picks it
/// without sending a packet.
fn default_route_ip() -> Option<std::net::IpAddr> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("192.0.2.1:9").ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_unspecified()).then_some(ip)
}

/// The address a local client dials: a wildcard bind is reached on loopback.
fn client_address(bound: SocketAddr) -> String {
    let ip = match bound.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => {
            std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST)
        }
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => {
            std::net::IpAddr::V6(std::net::Ipv6Addr::LOCALHOST)
        }
        ip => ip,
    };
    SocketAddr::new(ip, bound.port()).to_string()
}

async fn stop_signal() -> &'static str {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut terminate) => tokio::select! {
            _ = terminate.recv() => "SIGTERM",
            _ = tokio::signal::ctrl_c() => "SIGINT",
        },
        Err(error) => {
            tracing::warn!(%error, "cannot watch SIGTERM; only SIGINT stops the node");
            let _ = tokio::signal::ctrl_c().await;
            "SIGINT"
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_binds_are_dialled_on_loopback() {
        assert_eq!(
            client_address("0.0.0.0:10809".parse().unwrap()),
            "127.0.0.1:10809"
        );
        assert_eq!(client_address("[::]:10809".parse().unwrap()), "[::1]:10809");
        assert_eq!(client_address("10.0.0.5:1".parse().unwrap()), "10.0.0.5:1");
    }
}
