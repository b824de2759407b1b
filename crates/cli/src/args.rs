//! The command line. Sizes, names and durations are checked while parsing,
//! so a typo is reported before anything is sent to the node.

use clap::{Args, Parser, Subcommand, ValueEnum};
use std::net::SocketAddr;
use std::path::PathBuf;
use trireme_types::{
    parse_size, DeviceClass, GroupName, NodeName, PoolName, SnapshotName, VolumeName,
};

/// The heading of the options every command takes.
const GLOBAL: &str = "Global options";

#[derive(Debug, Parser)]
#[command(
    name = "trireme",
    version,
    about = "trireme: replicated block storage for small clusters",
    long_about = "trireme: replicated block storage for small clusters.\n\n\
        `trireme node run` starts the node daemon on a machine: it keeps storage pools, \
        serves volumes over NBD, answers a REST API and, with the other nodes, forms the \
        cluster. Every other command talks to the REST API of any node (--api); each node \
        answers for the whole cluster.\n\n\
        Quick start:\n  \
        # on the first machine: creates the cluster and prints a join command\n  \
        trireme node run --data-dir /var/lib/trireme\n  \
        # on each other machine, with the address and token the first one printed\n  \
        trireme node run --join FIRST:7450 --token TOKEN\n  \
        # then, from any of them\n  \
        trireme volume create vm1 --size 32G\n  \
        trireme status\n\n\
        `trireme cluster join-token` prints the join command again. On a node's own machine \
        no token is needed for the other commands; from elsewhere pass --token (the content \
        of DATA_DIR/admin.token of any node)."
)]
pub struct Cli {
    /// The REST API of one or more nodes of the cluster, comma-separated, e.g.
    /// `--api 10.0.0.1:7450,10.0.0.2:7450`. Any node answers for the whole
    /// cluster: the next address is tried only when a node cannot be reached
    /// (refused, unreachable, no connection within 5 s), never after an
    /// error answer. Without a scheme `http://` is assumed, and without a
    /// port 7450.
    ///
    /// Precedence: this flag, then TRIREME_API, then `api` in the client
    /// config file (TRIREME_CLIENT_CONFIG, or /etc/trireme/client.toml; an
    /// empty TRIREME_CLIENT_CONFIG reads no file), then the default.
    #[arg(
        long,
        global = true,
        help_heading = GLOBAL,
        env = "TRIREME_API",
        value_name = "ADDRESSES",
        default_value = "http://127.0.0.1:7450",
        value_parser = ApiAddresses::parse
    )]
    pub api: ApiAddresses,

    /// The cluster's admin token, sent as `Authorization: Bearer TOKEN`: the
    /// content of DATA_DIR/admin.token on any node. Not needed on a node's
    /// own machine, where loopback clients are trusted (unless that node runs
    /// with --trust-loopback=false).
    ///
    /// Precedence: this flag, then TRIREME_TOKEN, then `token` or
    /// `token_file` in the client config file (see --api).
    //
    // Same id as `node run --token` (the join token): clap then leaves that
    // one alone in `node run` instead of reporting a clash.
    #[arg(
        long,
        global = true,
        help_heading = GLOBAL,
        env = "TRIREME_TOKEN",
        hide_env_values = true,
        value_parser = parse_token
    )]
    pub token: Option<String>,

    /// How to print answers: human tables, or the API's JSON unchanged.
    #[arg(
        long,
        global = true,
        help_heading = GLOBAL,
        value_enum,
        default_value_t = OutputFormat::Table
    )]
    pub output: OutputFormat,

    #[command(subcommand)]
    pub command: Command,
}

/// The node addresses of `--api`, as base URLs (`http://host:port`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiAddresses(Vec<String>);

impl ApiAddresses {
    /// Parses `http://a:7450,b:7450,[fd00::1]`: comma-separated, `http://`
    /// assumed without a scheme, port 7450 assumed without a scheme and port.
    pub fn parse(text: &str) -> Result<ApiAddresses, String> {
        let urls = text
            .split(',')
            .map(str::trim)
            .filter(|entry| !entry.is_empty())
            .map(api_url)
            .collect::<Result<Vec<_>, _>>()?;
        if urls.is_empty() {
            return Err("no address given: use e.g. --api 10.0.0.1:7450,10.0.0.2:7450".into());
        }
        Ok(ApiAddresses(urls))
    }

    pub fn urls(&self) -> &[String] {
        &self.0
    }
}

/// One `--api` entry as a base URL.
fn api_url(entry: &str) -> Result<String, String> {
    if entry.contains(char::is_whitespace) {
        return Err(format!("address '{entry}' has a space"));
    }
    let (scheme, rest) = match entry.split_once("://") {
        Some((scheme, rest)) => (scheme.to_ascii_lowercase(), rest),
        None => (String::new(), entry),
    };
    if !scheme.is_empty() && scheme != "http" && scheme != "https" {
        return Err(format!(
            "address '{entry}': use http:// or https://, or no scheme (e.g. 10.0.0.1:7450)"
        ));
    }
    let rest = rest.trim_end_matches('/');
    let rest = rest.strip_suffix("/api/v1").unwrap_or(rest);
    if rest.contains(['/', '?', '#', '@']) {
        return Err(format!(
            "address '{entry}': give only HOST:PORT, e.g. 10.0.0.1:7450 or http://10.0.0.1:7450"
        ));
    }
    let authority = rest;
    let (host, port) = if let Some(bracketed) = authority.strip_prefix('[') {
        let Some((host, after)) = bracketed.split_once(']') else {
            return Err(format!("address '{entry}': ']' is missing"));
        };
        let port = match after {
            "" => None,
            _ => Some(
                after
                    .strip_prefix(':')
                    .ok_or_else(|| format!("address '{entry}': expected ':PORT' after ']'"))?,
            ),
        };
        (host, port)
    } else {
        match authority.split_once(':') {
            Some((_, port)) if port.contains(':') => {
                return Err(format!(
                    "address '{entry}': write an IPv6 address in brackets, e.g. [fd00::1]:7450"
                ))
            }
            Some((host, port)) => (host, Some(port)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err(format!("address '{entry}' has no host"));
    }
    if let Some(port) = port {
        if port.parse::<u16>().map_or(true, |port| port == 0) {
            return Err(format!(
                "address '{entry}': port '{port}' is not 1 to 65535"
            ));
        }
    }
    Ok(match (scheme.is_empty(), port) {
        (true, None) => format!("http://{rest}:{}", default_api_port()),
        (true, Some(_)) => format!("http://{rest}"),
        (false, _) => format!("{scheme}://{rest}"),
    })
}

/// The port of `node run --api-listen`'s default.
fn default_api_port() -> u16 {
    trireme_node::daemon::DEFAULT_API_LISTEN
        .parse::<SocketAddr>()
        .map(|address| address.port())
        .unwrap_or(7450)
}

pub(crate) fn parse_token(text: &str) -> Result<String, String> {
    let token = text.trim();
    if token.is_empty() {
        return Err("the token is empty: use the content of DATA_DIR/admin.token".into());
    }
    if !token.chars().all(|c| c.is_ascii_graphic()) {
        return Err(
            "the token has characters no token has: use the content of DATA_DIR/admin.token".into(),
        );
    }
    Ok(token.to_string())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Table,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// One screen of cluster health: leader and voters, nodes, capacity,
    /// volumes by state, and warnings that each name the action to take.
    ///
    /// Health is HEALTH_OK when there is nothing to warn about, HEALTH_WARN
    /// otherwise. With --output json it prints the API's status document.
    Status,
    /// Run the node daemon, or list, inspect and remove the cluster's nodes.
    #[command(subcommand)]
    Node(NodeCommand),
    /// Storage pools of the node answering (--api): block devices or files that hold volumes.
    #[command(subcommand)]
    Pool(PoolCommand),
    /// Volumes: thin virtual block devices, replicated on several nodes and served over NBD.
    #[command(subcommand)]
    Volume(VolumeCommand),
    /// Resource groups: placement policies (how many replicas, on which pools
    /// and device classes, spread over which labels) that volumes are created by.
    ///
    /// Every cluster has the group `default` (3 replicas, any pool; a volume
    /// may start with fewer while the cluster has fewer nodes). It cannot be deleted.
    #[command(subcommand, name = "group", visible_alias = "resource-group")]
    Group(GroupCommand),
    /// Cluster-wide settings and the token that lets machines join.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Snapshots: instant, crash-consistent, read-only copies of a volume,
    /// served over NBD as VOLUME@SNAPSHOT; clones and rollbacks start
    /// from them.
    #[command(subcommand)]
    Snapshot(SnapshotCommand),
    /// The cluster's event log: what happened, when, and who asked
    ///
    /// Nodes online, offline and evicted, quorum lost and regained,
    /// attaches, detaches and takeovers, resyncs, verifies and their
    /// repairs, failed pools and replicas, snapshots, settings; each with
    /// who asked: the admin token, a local client, or the node itself.
    ///
    /// The log is replicated with the cluster's state: every node shows
    /// the same one, and it survives restarts. It keeps the last 1000
    /// events. Without --follow it prints the newest (--limit) and exits;
    /// with --follow it then prints each new event as it comes (asking
    /// every second) until interrupted (Ctrl-C). With --output json it
    /// prints the API's answer, or with --follow one JSON event per line.
    ///
    /// Examples:
    ///   trireme events
    ///   trireme events --volume vm1 --limit 50
    ///   trireme events --follow --output json | jq -r .message
    #[command(verbatim_doc_comment)]
    Events(EventsArgs),
    /// Write shell completions or man pages generated from these
    /// definitions (the .deb build uses it; hidden from help).
    #[command(subcommand, hide = true)]
    Generate(GenerateCommand),
}

#[derive(Debug, Subcommand)]
pub enum GenerateCommand {
    /// Print the completion script of SHELL on stdout.
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write one man page per command (trireme.1, trireme-volume-create.1, ...) into DIR.
    Man { dir: PathBuf },
}

#[derive(Debug, Subcommand)]
pub enum SnapshotCommand {
    /// Take a snapshot of a volume
    ///
    /// Instant and without copying data: every replica takes it at the
    /// same point between writes (a write is in the snapshot on every
    /// replica or on none), whether the volume is attached or not. It
    /// costs space only as the volume is written over afterwards.
    ///
    /// Examples:
    ///   trireme snapshot create vm1 before-upgrade
    ///   qemu-img convert -O qcow2 nbd://pve1:10809/vm1@before-upgrade backup.qcow2
    #[command(verbatim_doc_comment)]
    Create {
        #[arg(value_parser = parse_volume_name)]
        volume: VolumeName,
        /// Snapshot name: letters, digits, '-', '_', '.'.
        #[arg(value_parser = parse_snapshot_name)]
        name: SnapshotName,
    },
    /// List snapshots, of one volume or of all: when taken, where, and
    /// their exclusive space (what deleting one gives back) and shared
    /// space (held with the volume, other snapshots or clones).
    List {
        #[arg(value_parser = parse_volume_name)]
        volume: Option<VolumeName>,
    },
    /// Delete a snapshot; its exclusive space is given back. Clones made
    /// from it keep their data.
    Delete {
        #[arg(value_parser = parse_volume_name)]
        volume: VolumeName,
        #[arg(value_parser = parse_snapshot_name)]
        name: SnapshotName,
    },
    /// Take snapshots of a volume on a schedule, keeping the newest ones
    ///
    /// Scheduled snapshots are named auto-YYYYMMDD-HHMMSS (UTC); once more
    /// than --keep exist, the oldest are deleted. Snapshots taken by hand
    /// are never deleted by the schedule.
    ///
    /// Examples:
    ///   trireme snapshot schedule vm1 --every 1h --keep 24
    ///   trireme snapshot schedule vm1            # show it
    ///   trireme snapshot schedule vm1 --off
    #[command(verbatim_doc_comment)]
    Schedule {
        #[arg(value_parser = parse_volume_name)]
        volume: VolumeName,
        /// How often, e.g. 15m, 1h, 1d (at least 10s).
        #[arg(long, value_parser = parse_duration, requires = "keep")]
        every: Option<u64>,
        /// How many scheduled snapshots to keep.
        #[arg(long, requires = "every")]
        keep: Option<usize>,
        /// Stop taking snapshots (those taken stay).
        #[arg(long, conflicts_with_all = ["every", "keep"])]
        off: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum NodeCommand {
    /// Run the node daemon in the foreground until SIGTERM or Ctrl-C.
    ///
    /// The first start without --join creates a new cluster and prints the
    /// command that adds another machine. On first start it also creates the
    /// default pool: a sparse file in the data directory of min(64 GiB, 50%
    /// of the free space). It prints a line starting with "trireme node
    /// ready" once the API and NBD listen.
    Run(Box<RunArgs>),
    /// Show the version, cluster, name and addresses of the node answering (--api).
    Info,
    /// List the cluster's nodes: state and for how long, control-plane role,
    /// address, labels, pools and free space.
    ///
    /// STATE is online, offline (no heartbeat for a few seconds) or evicted
    /// (offline longer than the eviction delay: its replicas were placed
    /// elsewhere). ROLE is leader, voter or learner in the control plane.
    List,
    /// Remove a node from the cluster for good: its replicas are dropped
    /// from the volumes' placement and its vote goes to another online node.
    ///
    /// Refused while the node holds the last up-to-date replica of a volume.
    /// The removed node stops when it hears of it, and refuses to start
    /// on its old data directory: wipe it and join the machine again as a
    /// new node.
    Remove {
        /// The node's name, as `trireme node list` shows it.
        #[arg(value_parser = parse_node_name)]
        name: NodeName,
    },
    /// Show one node: state and since when, role, addresses, labels, pools,
    /// and the replicas it holds.
    Show {
        #[arg(value_parser = parse_node_name)]
        name: NodeName,
    },
    /// Set or remove a node's placement labels.
    ///
    /// Replicas stay where they are; `trireme status` then names the volumes
    /// whose placement no longer satisfies their group, and how to move them.
    /// (A node restarted with `--label` replaces its labels with those.)
    ///
    /// Examples:
    ///   trireme node label pve1 zone=a rack=r1
    ///   trireme node label pve1 rack-
    #[command(verbatim_doc_comment)]
    Label {
        #[arg(value_parser = parse_node_name)]
        name: NodeName,
        /// KEY=VALUE to set, or KEY- to remove.
        #[arg(required = true, value_parser = parse_label_change)]
        changes: Vec<LabelChange>,
    },
}

/// One argument of `trireme node label`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LabelChange {
    Set(String, String),
    Remove(String),
}

fn parse_label_change(text: &str) -> Result<LabelChange, String> {
    match text.strip_suffix('-') {
        Some(key) if !text.contains('=') => parse_label_key(key).map(LabelChange::Remove),
        _ => parse_label(text)
            .map(|(key, value)| LabelChange::Set(key, value))
            .map_err(|error| format!("{error} (or KEY- to remove it)")),
    }
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// Where the pool catalog, pool metadata and the default pool live.
    #[arg(long, env = "TRIREME_DATA_DIR", default_value = "/var/lib/trireme")]
    pub data_dir: PathBuf,
    /// TCP address of the NBD server (clients use nbd://ADDRESS/VOLUME).
    /// Loopback by default: NBD has no authentication (NBD over TLS is not
    /// implemented yet), so anyone who reaches this port can read and write
    /// every volume served here. Listen on another address only on a
    /// storage network nobody else reaches.
    #[arg(long, default_value = trireme_node::daemon::DEFAULT_NBD_LISTEN)]
    pub nbd_listen: SocketAddr,
    /// Unix socket of the NBD server [default: DATA_DIR/nbd.sock].
    #[arg(long)]
    pub nbd_socket: Option<PathBuf>,
    /// Where primaries on other nodes open data links (replication)
    /// [default: the --api-listen IP, on a port the system picks; the
    /// cluster state tells the other nodes]. Set it to open one port in a
    /// firewall.
    #[arg(long)]
    pub data_listen: Option<SocketAddr>,
    /// Address of the REST API; other nodes and the CLI use it. Clients not
    /// on loopback need the admin token (DATA/admin.token).
    #[arg(long, default_value = trireme_node::daemon::DEFAULT_API_LISTEN)]
    pub api_listen: SocketAddr,
    /// The IP other nodes reach this node at [default: the --api-listen IP,
    /// or the IP of the default route when listening on 0.0.0.0].
    #[arg(long)]
    pub advertise: Option<std::net::IpAddr>,
    /// Create a 1 GiB volume named `demo` if it is missing, and print how to reach it.
    #[arg(long)]
    pub demo: bool,
    /// This node's name in the cluster [default: the host name].
    #[arg(long, value_parser = parse_node_name)]
    pub name: Option<NodeName>,
    /// A label for placement, e.g. `--label zone=a --label rack=r1`.
    #[arg(long = "label", value_parser = parse_label)]
    pub labels: Vec<(String, String)>,
    /// Join the cluster of the node whose REST API is at this address
    /// (HOST:PORT), instead of creating a new cluster. Only the first start
    /// needs it; afterwards the node remembers its cluster.
    #[arg(long, requires = "token")]
    pub join: Option<String>,
    /// The join token a member printed (or `trireme cluster join-token`).
    #[arg(long, env = "TRIREME_JOIN_TOKEN", requires = "join")]
    pub token: Option<String>,
    /// Trust REST clients on loopback without a token, as the NBD export
    /// on loopback is trusted. With false, every client needs the token.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub trust_loopback: bool,
    /// How the log (on stderr) is written: `text` for people, `json` (one
    /// object a line) for log shippers. RUST_LOG chooses what is logged.
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Kernel `nbd` devices (hosts with the module; see docs/kubernetes.md):
    /// seconds one request may go unanswered before the kernel takes the
    /// connection for dead and sends the request again on a new one (the
    /// daemon reconnects). 1 to 3600. Applied to new devices, and to
    /// existing ones when the daemon starts.
    #[arg(long, value_name = "SECONDS", default_value = "10",
        value_parser = trireme_node::local_device::parse_request_timeout)]
    pub kernel_nbd_request_timeout: std::time::Duration,
    /// Kernel `nbd` devices: seconds I/O waits for a new connection (the
    /// daemon restarting) before the kernel fails it with EIO. 1 to 86400.
    /// Applied to new devices, and to existing ones when the daemon starts.
    #[arg(long, value_name = "SECONDS", default_value = "120",
        value_parser = trireme_node::local_device::parse_dead_connection_timeout)]
    pub kernel_nbd_dead_connection_timeout: std::time::Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum PoolCommand {
    /// Create a pool on a block device or a file (a missing file is created).
    Create {
        /// Pool name: letters, digits, '-', '_', '.'.
        #[arg(value_parser = parse_pool_name)]
        name: PoolName,
        /// Block device or file; relative paths are taken from the current directory.
        #[arg(long)]
        path: PathBuf,
        /// Size of the file to create, e.g. 100G (binary units); a device's own size otherwise.
        #[arg(long, value_parser = parse_pool_size)]
        size: Option<u64>,
        /// Device class, used by placement.
        #[arg(long, default_value = "ssd", value_parser = parse_device_class)]
        class: DeviceClass,
        /// Reserve the file's space now instead of leaving it sparse.
        #[arg(long)]
        preallocate: bool,
        /// Format the path even though it holds data (a file system, a
        /// partition table, any non-zero byte at its start or end) or a pool
        /// no node uses; without it such a path is refused. A device or file
        /// in use on the host (mounted, swap, backing a loop device) is
        /// refused even with --force.
        #[arg(long)]
        force: bool,
    },
    /// List the pools of the node, with capacity, allocation and provisioning.
    List,
    /// Show one pool.
    Show {
        #[arg(value_parser = parse_pool_name)]
        name: PoolName,
    },
    /// Delete an empty pool and the files it created.
    Delete {
        #[arg(value_parser = parse_pool_name)]
        name: PoolName,
    },
    /// Check a pool: recount its allocation and verify every written block's checksum.
    Scan {
        #[arg(value_parser = parse_pool_name)]
        name: PoolName,
    },
}

#[derive(Debug, Subcommand)]
pub enum VolumeCommand {
    /// Create a thin volume, replicated by its resource group's policy
    ///
    /// It takes pool space only as it is written. By default the group
    /// `default` places 3 diskful replicas (fewer while the cluster has
    /// fewer nodes), each on the node's pool with the most free space.
    /// It returns once the replicas' nodes have made them; if some have
    /// not reported within 30 s, it says which are still pending.
    ///
    /// Examples:
    ///   trireme volume create vm1 --size 32G
    ///   trireme volume create db --size 100G --group fast
    ///   trireme volume create scratch --size 8G --replicas 1
    ///   trireme volume create vm2 --size 32G --nodes n1,n2,n3
    ///   # a clone of a snapshot, sharing its data (no copy is made)
    ///   trireme volume create vm3 --from-snapshot vm1@before-upgrade
    #[command(verbatim_doc_comment)]
    Create {
        /// Volume name, also its NBD export name: letters, digits, '-', '_', '.'.
        #[arg(value_parser = parse_volume_name)]
        name: VolumeName,
        /// Size, e.g. 32G (binary units, a multiple of 4 KiB).
        #[arg(long, value_parser = parse_volume_size, required_unless_present = "from_snapshot")]
        size: Option<u64>,
        /// Make the volume a clone of a snapshot, VOLUME@SNAPSHOT: it has the
        /// snapshot's size and content, and its replicas are made on the
        /// nodes holding the snapshot, sharing its chunks until written.
        #[arg(long, value_name = "VOLUME@SNAPSHOT", value_parser = parse_snapshot_ref,
              conflicts_with_all = ["size", "pool", "replicas", "nodes"])]
        from_snapshot: Option<(VolumeName, SnapshotName)>,
        /// Only pools of this name qualify [default: the group's pools; on
        /// each node the one with the most free space].
        #[arg(long, value_parser = parse_pool_name)]
        pool: Option<PoolName>,
        /// The resource group whose policy places it [default: default].
        /// See `trireme group list`.
        #[arg(long, value_parser = parse_group_name)]
        group: Option<GroupName>,
        /// Diskful replicas, instead of the group's place-count; all of them
        /// must be placeable or nothing is created.
        #[arg(long, value_name = "N")]
        replicas: Option<usize>,
        /// Manual placement: exactly these nodes hold its data
        /// (comma-separated names, e.g. n1,n2,n3). The group's other rules
        /// are still checked.
        #[arg(long, value_name = "NODES", value_delimiter = ',', value_parser = parse_node_name)]
        nodes: Option<Vec<NodeName>>,
    },
    /// List volumes: size, allocation, group, state, where each is
    /// attached and its replicas, and each pool's provisioning vs capacity.
    ///
    /// STATE is creating, ready, degraded (fewer ready replicas than
    /// placed), failed or deleting. ATTACHED names the nodes serving the
    /// volume (its primaries). REPLICAS names the nodes: `n2*` is a
    /// replica its node has not reported yet, `n2!` one that failed,
    /// `n4(tb)` a tiebreaker (votes, holds no data), `n5(dl)` a diskless
    /// member, `n3(outdated)` or `n3(syncing 42%)` a replica that is not
    /// up to date.
    List,
    /// Show one volume, with one line per replica; --wait follows resyncs
    ///
    /// It shows the volume's generation, where it is attached, and each
    /// replica's state: primary, up-to-date, outdated, syncing (percent, rate
    /// and time left), diskless or tiebreaker.
    ///
    /// With --wait it follows the running resyncs with a progress bar each
    /// (refreshed every 500 ms) and returns once every diskful replica is up
    /// to date, then shows the volume; --output json prints only the final
    /// volume. It stops, saying why, when no resync can run for any replica
    /// that is behind (its node is offline, or the volume is detached and
    /// an up-to-date replica's node is).
    ///
    /// Examples:
    ///   trireme volume show vm1
    ///   trireme volume show vm1 --wait --timeout 30m
    #[command(verbatim_doc_comment)]
    Show {
        #[arg(value_parser = parse_volume_name)]
        name: VolumeName,
        /// Wait until every diskful replica is up to date (no outdated
        /// replica, no resync running).
        #[arg(long)]
        wait: bool,
        /// With --wait: fail after this long, e.g. 90s, 10m or 1h
        /// [default: wait as long as it takes].
        #[arg(long, value_name = "DURATION", value_parser = parse_duration, requires = "wait")]
        timeout: Option<u64>,
    },
    /// Attach a volume to a node, which then serves it over NBD
    ///
    /// The node becomes the volume's primary: it serves it at
    /// nbd://NODE:10809/NAME and replicates every write to the replicas.
    /// Attaching where no other node is attached starts a new generation of
    /// the volume's data: replicas then refuse writes from any former
    /// primary, so a node cut off from the cluster cannot corrupt them.
    /// Attaching while the primary's node is offline (its machine died) is a
    /// failover in one step: that primary is fenced the same way and this
    /// node serves every acknowledged write. Refused while the primary's
    /// node is still counted online (the message says when it was last
    /// heard from), when the node is not online, or when no replica is up
    /// to date. Attaching on the node where it is attached changes nothing.
    ///
    /// Examples:
    ///   trireme volume attach vm1 --node pve1
    ///   # live migration: attach on the target too, then detach the source
    ///   trireme volume attach vm1 --node pve2 --allow-two-primaries
    ///   trireme volume detach vm1 --node pve1
    ///   # pve2 died a moment ago, before the cluster noticed
    ///   trireme volume attach vm1 --node pve3 --force-takeover
    #[command(verbatim_doc_comment)]
    Attach {
        #[arg(value_parser = parse_volume_name)]
        name: VolumeName,
        /// The node that serves the volume (see `trireme node list`).
        #[arg(long, value_parser = parse_node_name)]
        node: NodeName,
        /// Allow a second primary while the volume is attached elsewhere,
        /// for a VM's live migration. Both serve the same data; detach the
        /// old one once the VM has moved.
        #[arg(long, conflicts_with = "force_takeover")]
        allow_two_primaries: bool,
        /// Take the volume over from a primary whose node is still counted
        /// online, when you know its machine is dead (it would be marked
        /// offline within seconds): that primary is fenced, and its VM must
        /// not be started there again.
        #[arg(long)]
        force_takeover: bool,
    },
    /// Detach a volume: the node stops serving it (its NBD clients get
    /// errors). The data and the replicas stay.
    ///
    /// --node is needed only while the volume is attached on two nodes.
    Detach {
        #[arg(value_parser = parse_volume_name)]
        name: VolumeName,
        /// The node to detach from [default: the only node it is attached on].
        #[arg(long, value_parser = parse_node_name)]
        node: Option<NodeName>,
    },
    /// Add or remove one diskful replica of a volume.
    #[command(subcommand)]
    Replica(ReplicaCommand),
    /// Compare the volume's replicas online and repair the ones that differ
    ///
    /// The primary reads every block of every up-to-date replica, compares
    /// their fingerprints (BLAKE3), and rewrites each block where a replica
    /// differs from the majority or fails its checksum, while the volume
    /// stays in use (each 1 MiB region is held for writes only while it is
    /// compared). With two replicas that disagree there is no majority: the
    /// primary's copy, the one clients have been reading, is kept, and the
    /// report says how many blocks were decided that way. Blocks unreadable
    /// on every copy cannot be repaired and are listed.
    ///
    /// The volume must be attached (verify runs on its primary) and have at
    /// least two up-to-date replicas. It runs at the resync rate. Progress
    /// shows as a bar; the report lists what was repaired where. The exit
    /// status is 0 when every replica ends identical, 1 otherwise.
    ///
    /// Examples:
    ///   trireme volume verify vm1
    ///   trireme volume verify vm1 --no-wait     # start it and return
    ///   trireme volume verify vm1 --status      # the running or last report
    #[command(verbatim_doc_comment)]
    Verify {
        #[arg(value_parser = parse_volume_name)]
        name: VolumeName,
        /// Start it and return at once (`--status` follows it).
        #[arg(long, conflicts_with = "status")]
        no_wait: bool,
        /// Only show the running or last verify's report.
        #[arg(long)]
        status: bool,
    },
    /// Roll a detached volume back to one of its snapshots
    ///
    /// Every replica holding the snapshot gets its content back (the
    /// snapshot and newer ones stay); replicas without it are resynced
    /// when the volume is next attached. The volume must be detached,
    /// and cannot be attached until the rollback is done.
    ///
    /// Example:
    ///   trireme volume detach vm1
    ///   trireme volume rollback vm1 before-upgrade
    #[command(verbatim_doc_comment)]
    Rollback {
        #[arg(value_parser = parse_volume_name)]
        name: VolumeName,
        /// The snapshot (see `trireme snapshot list VOLUME`).
        #[arg(value_parser = parse_snapshot_name)]
        snapshot: SnapshotName,
    },
    /// Grow a volume to a new size (volumes never shrink).
    Grow {
        #[arg(value_parser = parse_volume_name)]
        name: VolumeName,
        /// The new total size, e.g. 64G.
        #[arg(long, value_parser = parse_volume_size)]
        size: u64,
    },
    /// Delete a volume and its data on every node. Connected NBD clients get I/O errors.
    ///
    /// A volume with snapshots is refused, naming them, unless
    /// --with-snapshots says they go too. Clones made from its snapshots
    /// keep their data (they share chunks, counted); while a clone is
    /// still being made from one, the delete waits for it.
    ///
    /// When a node holding a replica is offline, the volume stays in state
    /// `deleting` until that node comes back and removes its copy.
    Delete {
        #[arg(value_parser = parse_volume_name)]
        name: VolumeName,
        /// Delete the volume's snapshots with it.
        #[arg(long)]
        with_snapshots: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum ReplicaCommand {
    /// Add a diskful replica, placed by the volume's group or on --node
    ///
    /// The placement follows the volume's resource group (its pools, device
    /// class and label spread) unless --node names the node. The new replica is empty: it is outdated until the volume's primary
    /// has copied the data to it; `trireme volume show NAME --wait` follows
    /// the resync. With an even number of diskful replicas the volume gets a
    /// tiebreaker; with an odd number it needs none.
    ///
    /// Examples:
    ///   trireme volume replica add vm1
    ///   trireme volume replica add vm1 --node pve4 --pool nvme
    #[command(verbatim_doc_comment)]
    Add {
        #[arg(value_parser = parse_volume_name)]
        name: VolumeName,
        /// The node to hold it [default: chosen by the group's placement rules].
        #[arg(long, value_parser = parse_node_name)]
        node: Option<NodeName>,
        /// Only pools of this name qualify [default: the group's pools].
        #[arg(long, value_parser = parse_pool_name)]
        pool: Option<PoolName>,
    },
    /// Remove the diskful replica on a node
    ///
    /// Refused when it is the last up-to-date replica, or when the replicas
    /// left (with the tiebreaker) would not hold a majority of up-to-date
    /// votes: wait for resyncs first (`trireme volume show NAME --wait`). A
    /// node where the volume is attached keeps serving it, without a copy
    /// of its own.
    ///
    /// Example:
    ///   trireme volume replica remove vm1 --node pve3
    #[command(verbatim_doc_comment)]
    Remove {
        #[arg(value_parser = parse_volume_name)]
        name: VolumeName,
        /// The node whose replica goes.
        #[arg(long, value_parser = parse_node_name)]
        node: NodeName,
    },
}

#[derive(Debug, Subcommand)]
pub enum GroupCommand {
    /// Create a resource group: a placement policy for volumes
    ///
    /// Volumes use it with `trireme volume create NAME --size S --group GROUP`.
    ///
    /// Examples:
    ///   # 3 replicas on NVMe pools, in 3 different zones
    ///   # (nodes started with --label zone=...)
    ///   trireme group create fast --place-count 3 --class nvme \
    ///       --replicas-on-different zone
    ///   # 2 replicas; a volume may start with 1 while a node is down
    ///   trireme group create small --place-count 2 --min-place-count 1
    #[command(verbatim_doc_comment)]
    Create(GroupCreateArgs),
    /// List the resource groups and their policies.
    List,
    /// Change a resource group: only the options given change, checked as
    /// at creation.
    ///
    /// Replicas already placed stay where they are: `trireme status` then
    /// names the volumes that no longer satisfy the group and how to move
    /// them. New volumes and new replicas follow the new settings.
    ///
    /// Examples:
    ///   trireme group modify fast --place-count 2
    ///   trireme group modify fast --replicas-on-different zone,rack
    ///   trireme group modify fast --any-class --any-pool
    #[command(verbatim_doc_comment)]
    Modify(GroupModifyArgs),
    /// Delete a resource group no volume uses. The group `default` stays.
    Delete {
        #[arg(value_parser = parse_group_name)]
        name: GroupName,
    },
}

#[derive(Debug, Args)]
pub struct GroupCreateArgs {
    /// Group name: letters, digits, '-', '_', '.'.
    #[arg(value_parser = parse_group_name)]
    pub name: GroupName,
    /// Diskful replicas (full copies of the data) per volume, 1 to 7. With
    /// an even count a further node gets a tiebreaker, so that a split into
    /// two halves still leaves one side with a majority.
    #[arg(long, value_name = "N")]
    pub place_count: usize,
    /// The fewest diskful replicas a new volume may be created with when
    /// the cluster cannot place all of them (too few nodes, pools or zones)
    /// [default: the place-count, i.e. all or nothing].
    #[arg(long, value_name = "N")]
    pub min_place_count: Option<usize>,
    /// Only pools of this name qualify; repeat (or comma-separate) for
    /// several [default: any pool].
    #[arg(long = "pool", value_name = "POOL", value_delimiter = ',', value_parser = parse_pool_name)]
    pub pools: Vec<PoolName>,
    /// Only pools of this device class qualify: nvme, ssd or hdd [default: any].
    #[arg(long, value_parser = parse_device_class)]
    pub class: Option<DeviceClass>,
    /// A label key (from `node run --label KEY=VALUE`) whose value must
    /// differ between the replicas of a volume, e.g. `zone` or `rack`;
    /// repeat for several. Nodes without the label take no replica.
    #[arg(long, value_name = "KEY", value_delimiter = ',', value_parser = parse_label_key)]
    pub replicas_on_different: Vec<String>,
    /// Make every other online node a diskless member of each volume (it
    /// holds no data and reaches the data through the replicas).
    #[arg(long)]
    pub diskless_on_remaining: bool,
    /// What writes do while a volume has lost its quorum (a majority of its
    /// replicas): fail with an I/O error, or wait until the quorum returns.
    #[arg(long, value_enum, default_value_t = OnNoQuorum::IoError)]
    pub on_no_quorum: OnNoQuorum,
}

#[derive(Debug, Args)]
pub struct GroupModifyArgs {
    #[arg(value_parser = parse_group_name)]
    pub name: GroupName,
    /// Diskful replicas per volume, 1 to 7.
    #[arg(long, value_name = "N")]
    pub place_count: Option<usize>,
    /// The fewest diskful replicas a new volume may be created with.
    #[arg(long, value_name = "N")]
    pub min_place_count: Option<usize>,
    /// Only pools of these names qualify (replaces the list).
    #[arg(long = "pool", value_name = "POOL", value_delimiter = ',', value_parser = parse_pool_name)]
    pub pools: Option<Vec<PoolName>>,
    /// Any pool qualifies.
    #[arg(long, conflicts_with = "pools")]
    pub any_pool: bool,
    /// Only pools of this device class qualify: nvme, ssd or hdd.
    #[arg(long, value_parser = parse_device_class)]
    pub class: Option<DeviceClass>,
    /// Pools of any device class qualify.
    #[arg(long, conflicts_with = "class")]
    pub any_class: bool,
    /// Label keys whose values must differ between replicas (replaces the list).
    #[arg(long, value_name = "KEY", value_delimiter = ',', value_parser = parse_label_key)]
    pub replicas_on_different: Option<Vec<String>>,
    /// Replicas may share every label value.
    #[arg(long, conflicts_with = "replicas_on_different")]
    pub replicas_anywhere: bool,
    #[arg(long, value_enum, value_name = "on|off")]
    pub diskless_on_remaining: Option<Switch>,
    #[arg(long, value_enum)]
    pub on_no_quorum: Option<OnNoQuorum>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnNoQuorum {
    /// Writes fail with EIO.
    IoError,
    /// Writes wait until the quorum is back.
    Suspend,
}

impl OnNoQuorum {
    pub fn as_str(self) -> &'static str {
        match self {
            OnNoQuorum::IoError => "io-error",
            OnNoQuorum::Suspend => "suspend",
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Print the token that lets a machine join this cluster, and the
    /// command to run on that machine.
    ///
    /// The command names the REST address of the node answering (--api): it
    /// must be reachable from the new machine.
    JoinToken,
    /// Show the cluster-wide settings, or change them
    ///
    /// Eviction: when on, the leader re-places the replicas of a node that
    /// has been offline for longer than the eviction delay onto other
    /// nodes. It is off by default, because moving a volume's data is
    /// expensive and most outages are reboots; the default delay is 1h.
    ///
    /// Examples:
    ///   trireme cluster settings
    ///   trireme cluster settings --eviction on --eviction-delay 30m
    ///   trireme cluster settings --eviction off
    ///   trireme cluster settings --resync-rate 100M
    #[command(verbatim_doc_comment)]
    Settings {
        /// Switch eviction on or off.
        #[arg(long, value_enum, value_name = "on|off")]
        eviction: Option<Switch>,
        /// How long a node must be offline before it is evicted, e.g. 30s,
        /// 10m, 1h, 1h30m or 2d (at least 10s). Changing it keeps eviction
        /// on or off as it is.
        #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
        eviction_delay: Option<u64>,
        /// Bytes per second one volume's resync (or verify) may copy, e.g.
        /// 64M or 1G (per second; at least 1M). Lower it when resyncs slow
        /// the VMs down, raise it to get replicas up to date sooner.
        /// Running resyncs take it within a second.
        #[arg(long, value_name = "BYTES", value_parser = parse_resync_rate)]
        resync_rate: Option<u64>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Switch {
    #[value(alias = "true", alias = "yes")]
    On,
    #[value(alias = "false", alias = "no")]
    Off,
}

fn parse_size_argument(text: &str) -> Result<u64, String> {
    parse_size(text).map_err(|error| error.to_string())
}

/// Below this, a number without a unit is taken for a forgotten unit (`--size
/// 32` meant 32G), not for a pool of a few bytes.
const SMALLEST_UNITLESS_POOL_BYTES: u64 = 1 << 20;

/// Whether `text` ends in a unit (`K`, `MiB`, `B`, ...) rather than a digit.
fn has_unit(text: &str) -> bool {
    text.trim()
        .chars()
        .last()
        .is_some_and(|last| last.is_ascii_alphabetic())
}

/// The advice for a number given without a unit that cannot be meant as bytes.
fn forgotten_unit(text: &str, what: &str, example_unit: &str) -> String {
    let text = text.trim();
    format!("{text} {what}? sizes take a unit: {text}{example_unit} (K, M, G, T, P: binary units)")
}

/// `volume create --size`, `volume grow --size`: above 0 and a whole number
/// of 4 KiB blocks, checked here so the refusal names the flag's value and
/// not the API's `size_bytes`.
fn parse_volume_size(text: &str) -> Result<u64, String> {
    let bytes = parse_size_argument(text)?;
    if bytes == 0 {
        return Err("a volume needs a size above 0, e.g. 32G".into());
    }
    if bytes.is_multiple_of(trireme_types::BLOCK_SIZE) {
        return Ok(bytes);
    }
    if !has_unit(text) {
        return Err(forgotten_unit(text, "bytes", "G"));
    }
    let rounded = bytes.div_ceil(trireme_types::BLOCK_SIZE) * trireme_types::BLOCK_SIZE;
    Err(format!(
        "{} is {bytes} bytes, not a whole number of 4 KiB blocks (the volume's block size): try {}",
        text.trim(),
        typeable_size(rounded),
    ))
}

/// `bytes` as a size flag takes it, in the largest unit that divides it.
fn typeable_size(bytes: u64) -> String {
    let unit = [("P", 50), ("T", 40), ("G", 30), ("M", 20), ("K", 10)]
        .into_iter()
        .find(|(_, shift)| bytes != 0 && bytes.is_multiple_of(1 << shift));
    match unit {
        Some((name, shift)) => format!("{}{name}", bytes >> shift),
        None => bytes.to_string(),
    }
}

/// `pool create --size`: a file of a few bytes is a forgotten unit.
fn parse_pool_size(text: &str) -> Result<u64, String> {
    let bytes = parse_size_argument(text)?;
    if !has_unit(text) && bytes < SMALLEST_UNITLESS_POOL_BYTES {
        return Err(forgotten_unit(text, "bytes", "G"));
    }
    Ok(bytes)
}

/// `cluster settings --resync-rate`: bytes per second, at least the
/// control plane's minimum.
fn parse_resync_rate(text: &str) -> Result<u64, String> {
    let bytes = parse_size_argument(text)?;
    let minimum = trireme_control::MIN_RESYNC_RATE;
    if bytes >= minimum {
        return Ok(bytes);
    }
    if !has_unit(text) {
        return Err(forgotten_unit(text, "bytes per second", "M"));
    }
    Err(format!(
        "{} per second is too slow for a resync: use at least {} (per second)",
        text.trim(),
        typeable_size(minimum)
    ))
}

fn parse_device_class(text: &str) -> Result<DeviceClass, String> {
    text.parse()
}

fn parse_snapshot_name(text: &str) -> Result<SnapshotName, String> {
    SnapshotName::new(text).map_err(|error| error.to_string())
}

/// `VOLUME@SNAPSHOT`.
fn parse_snapshot_ref(text: &str) -> Result<(VolumeName, SnapshotName), String> {
    let (volume, snapshot) = text
        .split_once('@')
        .ok_or_else(|| format!("'{text}' is not VOLUME@SNAPSHOT"))?;
    Ok((parse_volume_name(volume)?, parse_snapshot_name(snapshot)?))
}

fn parse_volume_name(text: &str) -> Result<VolumeName, String> {
    VolumeName::new(text).map_err(|error| error.to_string())
}

fn parse_pool_name(text: &str) -> Result<PoolName, String> {
    PoolName::new(text).map_err(|error| error.to_string())
}

fn parse_group_name(text: &str) -> Result<GroupName, String> {
    GroupName::new(text).map_err(|error| error.to_string())
}

/// A label key as `--label KEY=VALUE` accepts it.
fn parse_label_key(text: &str) -> Result<String, String> {
    if text.is_empty() || !text.chars().all(label_character) {
        return Err(format!(
            "label key '{text}': use letters, digits, '-', '_', '.' and '/', e.g. zone"
        ));
    }
    Ok(text.to_string())
}

fn label_character(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/')
}

/// Seconds from `30s`, `10m`, `1h`, `2d`, `1h30m` or a plain number of seconds.
pub fn parse_duration(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let malformed = || format!("duration '{text}' is not like 30s, 10m, 1h, 1h30m or 2d");
    if text.is_empty() {
        return Err(malformed());
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse()
            .map_err(|_| format!("duration '{text}' is too long"));
    }
    let mut seconds: u64 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(malformed());
        }
        let number: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("duration '{text}' is too long"))?;
        rest = &rest[digits..];
        let unit = rest
            .chars()
            .next()
            .ok_or_else(malformed)?
            .to_ascii_lowercase();
        let scale = match unit {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86400,
            _ => return Err(malformed()),
        };
        rest = &rest[1..];
        seconds = number
            .checked_mul(scale)
            .and_then(|part| seconds.checked_add(part))
            .ok_or_else(|| format!("duration '{text}' is too long"))?;
    }
    Ok(seconds)
}

pub fn parse_node_name(text: &str) -> Result<NodeName, String> {
    NodeName::new(text).map_err(|error| error.to_string())
}

pub fn parse_label(text: &str) -> Result<(String, String), String> {
    let Some((key, value)) = text.split_once('=') else {
        return Err(format!("label '{text}' is not KEY=VALUE, e.g. zone=a"));
    };
    let valid = |part: &str| !part.is_empty() && part.chars().all(label_character);
    if !valid(key) || !valid(value) {
        return Err(format!(
            "label '{text}': use letters, digits, '-', '_', '.' and '/' on both sides of '='"
        ));
    }
    Ok((key.to_string(), value.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(words: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("trireme").chain(words.iter().copied()))
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn volume_create_parses_sizes_and_names() {
        let cli = parse(&["volume", "create", "vm1", "--size", "32G", "--pool", "fast"]).unwrap();
        let Command::Volume(VolumeCommand::Create {
            name,
            size,
            pool,
            group,
            replicas,
            nodes,
            from_snapshot,
        }) = cli.command
        else {
            panic!("wrong command: {:?}", cli.command);
        };
        assert_eq!(name.as_str(), "vm1");
        assert_eq!(size, Some(32 << 30));
        assert_eq!(pool.unwrap().as_str(), "fast");
        assert_eq!((group, replicas, nodes), (None, None, None));
        assert_eq!(from_snapshot, None);
        assert_eq!(cli.output, OutputFormat::Table);
    }

    #[test]
    fn a_clone_names_its_snapshot_and_takes_no_size() {
        let cli = parse(&["volume", "create", "c1", "--from-snapshot", "vm1@s1"]).unwrap();
        let Command::Volume(VolumeCommand::Create {
            size,
            from_snapshot,
            ..
        }) = cli.command
        else {
            panic!("wrong command: {:?}", cli.command);
        };
        assert_eq!(size, None);
        let (volume, snapshot) = from_snapshot.unwrap();
        assert_eq!((volume.as_str(), snapshot.as_str()), ("vm1", "s1"));
        let error = parse(&["volume", "create", "c1", "--from-snapshot", "vm1"]).unwrap_err();
        assert!(error.to_string().contains("VOLUME@SNAPSHOT"), "{error}");
        assert!(
            parse(&["volume", "create", "c1"]).is_err(),
            "no size, no snapshot"
        );
        assert!(parse(&[
            "volume",
            "create",
            "c1",
            "--size",
            "1G",
            "--from-snapshot",
            "vm1@s1"
        ])
        .is_err());
    }

    #[test]
    fn snapshot_schedules_need_both_or_off() {
        let cli = parse(&[
            "snapshot", "schedule", "vm1", "--every", "1h", "--keep", "24",
        ])
        .unwrap();
        let Command::Snapshot(SnapshotCommand::Schedule {
            every, keep, off, ..
        }) = cli.command
        else {
            panic!("wrong command: {:?}", cli.command);
        };
        assert_eq!((every, keep, off), (Some(3600), Some(24), false));
        assert!(parse(&["snapshot", "schedule", "vm1", "--every", "1h"]).is_err());
        assert!(parse(&["snapshot", "schedule", "vm1", "--off", "--keep", "2"]).is_err());
        assert!(parse(&["snapshot", "create", "vm1", "bad name"]).is_err());
    }

    #[test]
    fn volume_create_takes_group_replicas_and_nodes() {
        let cli = parse(&[
            "volume",
            "create",
            "vm1",
            "--size",
            "1G",
            "--group",
            "fast",
            "--replicas",
            "2",
            "--nodes",
            "n1,n2",
        ])
        .unwrap();
        let Command::Volume(VolumeCommand::Create {
            group,
            replicas,
            nodes,
            ..
        }) = cli.command
        else {
            panic!("wrong command: {:?}", cli.command);
        };
        assert_eq!(group.unwrap().as_str(), "fast");
        assert_eq!(replicas, Some(2));
        let nodes: Vec<String> = nodes.unwrap().iter().map(|n| n.to_string()).collect();
        assert_eq!(nodes, ["n1", "n2"]);
        let error = parse(&["volume", "create", "v", "--size", "1G", "--nodes", "n1,a/b"]);
        assert!(error.unwrap_err().to_string().contains("node name 'a/b'"));
    }

    #[test]
    fn bad_sizes_and_names_are_refused_with_the_reason() {
        let error = parse(&["volume", "create", "vm1", "--size", "12X"]).unwrap_err();
        assert!(error.to_string().contains("--size"), "{error}");
        assert!(error.to_string().contains("size '12X' is not"), "{error}");
        let error = parse(&["volume", "create", "a/b", "--size", "1G"]).unwrap_err();
        assert!(error.to_string().contains("volume name 'a/b'"), "{error}");
        let error = parse(&["pool", "create", "p", "--path", "/x", "--class", "tape"]).unwrap_err();
        assert!(error.to_string().contains("nvme, ssd or hdd"), "{error}");
        assert!(
            parse(&["volume", "create", "vm1"]).is_err(),
            "--size is required"
        );
    }

    #[test]
    fn node_label_sets_and_removes() {
        let cli = parse(&["node", "label", "n1", "zone=a", "rack-"]).unwrap();
        let Command::Node(NodeCommand::Label { name, changes }) = cli.command else {
            panic!("not node label");
        };
        assert_eq!(name.as_str(), "n1");
        assert_eq!(
            changes,
            vec![
                LabelChange::Set("zone".into(), "a".into()),
                LabelChange::Remove("rack".into())
            ]
        );
        let error = parse(&["node", "label", "n1", "zone"]).unwrap_err();
        assert!(error.to_string().contains("KEY- to remove"), "{error}");
        assert!(
            parse(&["node", "label", "n1"]).is_err(),
            "a change is required"
        );
    }

    #[test]
    fn group_modify_changes_only_what_is_given() {
        let cli = parse(&["group", "modify", "g", "--place-count", "2", "--any-class"]).unwrap();
        let Command::Group(GroupCommand::Modify(arguments)) = cli.command else {
            panic!("not group modify");
        };
        assert_eq!(arguments.place_count, Some(2));
        assert!(arguments.any_class && arguments.class.is_none());
        assert_eq!(arguments.pools, None);
        assert!(parse(&["group", "modify", "g", "--class", "ssd", "--any-class"]).is_err());
    }

    #[test]
    fn a_size_without_its_unit_is_refused_in_the_clis_words() {
        let text = |words: &[&str]| parse(words).unwrap_err().to_string();
        let error = text(&["volume", "create", "vm1", "--size", "32"]);
        assert!(
            error.contains("32 bytes? sizes take a unit: 32G"),
            "{error}"
        );
        assert!(!error.contains("size_bytes"), "{error}");
        let error = text(&["volume", "grow", "vm1", "--size", "64"]);
        assert!(
            error.contains("64 bytes? sizes take a unit: 64G"),
            "{error}"
        );
        let error = text(&["pool", "create", "p", "--path", "/x", "--size", "100"]);
        assert!(
            error.contains("100 bytes? sizes take a unit: 100G"),
            "{error}"
        );
        let error = text(&["cluster", "settings", "--resync-rate", "64"]);
        assert!(
            error.contains("64 bytes per second? sizes take a unit: 64M"),
            "{error}"
        );
        // With a unit, the reason is the flag's own rule.
        let error = text(&["volume", "create", "vm1", "--size", "1.5K"]);
        assert!(
            error.contains("1536 bytes") && error.contains("try 4K"),
            "{error}"
        );
        let error = text(&["volume", "create", "vm1", "--size", "0G"]);
        assert!(error.contains("above 0"), "{error}");
        let error = text(&["cluster", "settings", "--resync-rate", "512K"]);
        assert!(error.contains("at least 1M"), "{error}");
        // Whole blocks in bytes are still bytes.
        let cli = parse(&["volume", "create", "vm1", "--size", "1048576"]).unwrap();
        let Command::Volume(VolumeCommand::Create { size, .. }) = cli.command else {
            panic!("not a volume create");
        };
        assert_eq!(size, Some(1 << 20));
    }

    #[test]
    fn global_options_go_anywhere() {
        let cli = parse(&["volume", "list", "--output", "json", "--api", "http://h:1"]).unwrap();
        assert_eq!(cli.output, OutputFormat::Json);
        assert_eq!(cli.api.urls(), ["http://h:1"]);
        assert_eq!(cli.token, None);
        let cli = parse(&["status", "--token", " abc\n", "--api", "a:1,b"]).unwrap();
        assert_eq!(cli.token.as_deref(), Some("abc"));
        assert_eq!(cli.api.urls(), ["http://a:1", "http://b:7450"]);
    }

    #[test]
    fn api_lists_take_several_nodes_with_or_without_scheme() {
        let urls = |text: &str| ApiAddresses::parse(text).map(|list| list.urls().to_vec());
        assert_eq!(
            urls("http://a:7450,http://b:7450").unwrap(),
            ["http://a:7450", "http://b:7450"]
        );
        assert_eq!(
            urls("a:7450, 10.0.0.2:8000 ,c").unwrap(),
            ["http://a:7450", "http://10.0.0.2:8000", "http://c:7450"]
        );
        assert_eq!(urls("https://a/").unwrap(), ["https://a"]);
        assert_eq!(urls("HTTP://a:1/api/v1").unwrap(), ["http://a:1"]);
        assert_eq!(
            urls("[fd00::1],[::1]:9").unwrap(),
            ["http://[fd00::1]:7450", "http://[::1]:9"]
        );
        assert_eq!(urls("a:1,,b:2,").unwrap(), ["http://a:1", "http://b:2"]);
        for bad in [
            "", ",", "ftp://a", "a:x", "a:0", "a:70000", "fd00::1", ":7450", "a:1/x", "a b",
        ] {
            assert!(urls(bad).is_err(), "{bad:?} should be refused");
        }
        let error = parse(&["status", "--api", "a:1,ftp://b"]).unwrap_err();
        assert!(error.to_string().contains("ftp://b"), "{error}");
    }

    #[test]
    fn durations_read_like_people_write_them() {
        assert_eq!(parse_duration("30s"), Ok(30));
        assert_eq!(parse_duration("10m"), Ok(600));
        assert_eq!(parse_duration("1h"), Ok(3600));
        assert_eq!(parse_duration("2d"), Ok(172_800));
        assert_eq!(parse_duration("1h30m"), Ok(5400));
        assert_eq!(parse_duration("1H"), Ok(3600));
        assert_eq!(parse_duration("90"), Ok(90));
        assert_eq!(parse_duration(" 5m "), Ok(300));
        for bad in ["", "h", "1x", "1.5h", "-1m", "1h 30m", "m5", "1hh", "5é"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be refused");
        }
        assert!(parse_duration("99999999999999999999d").is_err());
        assert!(parse_duration("9999999999999999d")
            .unwrap_err()
            .contains("too long"));
    }

    #[test]
    fn cluster_settings_parse_switch_and_delay() {
        let cli = parse(&[
            "cluster",
            "settings",
            "--eviction",
            "on",
            "--eviction-delay",
            "1h",
            "--resync-rate",
            "64M",
        ])
        .unwrap();
        let Command::Cluster(ClusterCommand::Settings {
            eviction,
            eviction_delay,
            resync_rate,
        }) = cli.command
        else {
            panic!("wrong command");
        };
        assert_eq!(eviction, Some(Switch::On));
        assert_eq!(eviction_delay, Some(3600));
        assert_eq!(resync_rate, Some(64 << 20));
        assert!(parse(&["cluster", "settings", "--resync-rate", "fast"]).is_err());
        assert!(parse(&["cluster", "settings", "--eviction", "maybe"]).is_err());
        let error = parse(&["cluster", "settings", "--eviction-delay", "soon"]).unwrap_err();
        assert!(error.to_string().contains("duration 'soon'"), "{error}");
    }

    #[test]
    fn group_create_has_defaults_and_the_resource_group_alias() {
        let cli = parse(&[
            "resource-group",
            "create",
            "fast",
            "--place-count",
            "3",
            "--pool",
            "a,b",
            "--pool",
            "c",
            "--class",
            "nvme",
            "--replicas-on-different",
            "zone",
        ])
        .unwrap();
        let Command::Group(GroupCommand::Create(group)) = cli.command else {
            panic!("wrong command");
        };
        assert_eq!(group.name.as_str(), "fast");
        assert_eq!(group.place_count, 3);
        assert_eq!(group.min_place_count, None);
        let pools: Vec<&str> = group.pools.iter().map(|pool| pool.as_str()).collect();
        assert_eq!(pools, ["a", "b", "c"]);
        assert_eq!(group.class, Some(DeviceClass::Nvme));
        assert_eq!(group.replicas_on_different, ["zone"]);
        assert!(!group.diskless_on_remaining);
        assert_eq!(group.on_no_quorum, OnNoQuorum::IoError);
        assert!(
            parse(&["group", "create", "g"]).is_err(),
            "--place-count is required"
        );
        let cli = parse(&[
            "group",
            "create",
            "g",
            "--place-count",
            "2",
            "--on-no-quorum",
            "suspend",
        ])
        .unwrap();
        let Command::Group(GroupCommand::Create(group)) = cli.command else {
            panic!("wrong command");
        };
        assert_eq!(group.on_no_quorum.as_str(), "suspend");
        assert!(parse(&[
            "group",
            "create",
            "g",
            "--place-count",
            "2",
            "--replicas-on-different",
            "a=b"
        ])
        .is_err());
    }

    #[test]
    fn attach_detach_and_replica_commands_parse() {
        let cli = parse(&["volume", "attach", "vm1", "--node", "pve1"]).unwrap();
        let Command::Volume(VolumeCommand::Attach {
            name,
            node,
            allow_two_primaries,
            force_takeover,
        }) = cli.command
        else {
            panic!("wrong command: {:?}", cli.command);
        };
        assert_eq!((name.as_str(), node.as_str()), ("vm1", "pve1"));
        assert!(!allow_two_primaries && !force_takeover);
        assert!(parse(&[
            "volume",
            "attach",
            "vm1",
            "--node",
            "pve2",
            "--force-takeover"
        ])
        .is_ok_and(|cli| matches!(
            cli.command,
            Command::Volume(VolumeCommand::Attach {
                force_takeover: true,
                ..
            })
        )));
        assert!(
            parse(&[
                "volume",
                "attach",
                "vm1",
                "--node",
                "pve2",
                "--force-takeover",
                "--allow-two-primaries"
            ])
            .is_err(),
            "a takeover is not a migration"
        );
        assert!(
            parse(&["volume", "attach", "vm1"]).is_err(),
            "--node is required"
        );
        let cli = parse(&[
            "volume",
            "attach",
            "vm1",
            "--node",
            "pve2",
            "--allow-two-primaries",
        ])
        .unwrap();
        assert!(matches!(
            cli.command,
            Command::Volume(VolumeCommand::Attach {
                allow_two_primaries: true,
                ..
            })
        ));

        let cli = parse(&["volume", "detach", "vm1"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Volume(VolumeCommand::Detach { node: None, .. })
        ));

        let cli = parse(&["volume", "replica", "add", "vm1", "--pool", "fast"]).unwrap();
        let Command::Volume(VolumeCommand::Replica(ReplicaCommand::Add { node, pool, .. })) =
            cli.command
        else {
            panic!("wrong command: {:?}", cli.command);
        };
        assert_eq!((node, pool.unwrap().as_str()), (None, "fast"));
        let cli = parse(&["volume", "replica", "remove", "vm1", "--node", "pve3"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Volume(VolumeCommand::Replica(ReplicaCommand::Remove { .. }))
        ));
        assert!(
            parse(&["volume", "replica", "remove", "vm1"]).is_err(),
            "--node is required"
        );
        let error = parse(&["volume", "replica", "add", "vm1", "--node", "a/b"]).unwrap_err();
        assert!(error.to_string().contains("node name 'a/b'"), "{error}");
    }

    #[test]
    fn verify_parses_with_its_flags() {
        let cli = parse(&["volume", "verify", "vm1"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Volume(VolumeCommand::Verify {
                no_wait: false,
                status: false,
                ..
            })
        ));
        assert!(parse(&["volume", "verify", "vm1", "--no-wait", "--status"]).is_err());
        assert!(parse(&["volume", "verify", "bad/name"]).is_err());
    }

    #[test]
    fn volume_show_waits_with_an_optional_timeout() {
        let cli = parse(&["volume", "show", "vm1"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Volume(VolumeCommand::Show {
                wait: false,
                timeout: None,
                ..
            })
        ));
        let cli = parse(&["volume", "show", "vm1", "--wait", "--timeout", "10m"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Volume(VolumeCommand::Show {
                wait: true,
                timeout: Some(600),
                ..
            })
        ));
        assert!(
            parse(&["volume", "show", "vm1", "--timeout", "10m"]).is_err(),
            "--timeout needs --wait"
        );
    }

    #[test]
    fn node_run_keeps_its_own_token() {
        let cli = parse(&["node", "run", "--join", "a:7450", "--token", "join-secret"]).unwrap();
        let Command::Node(NodeCommand::Run(run)) = cli.command else {
            panic!("wrong command");
        };
        assert_eq!(run.token.as_deref(), Some("join-secret"));
        assert_eq!(run.join.as_deref(), Some("a:7450"));
    }

    #[test]
    fn node_run_has_defaults() {
        let cli = parse(&["node", "run", "--data-dir", "/tmp/x", "--demo"]).unwrap();
        let Command::Node(NodeCommand::Run(run)) = cli.command else {
            panic!("wrong command");
        };
        assert!(run.demo);
        assert_eq!(run.nbd_listen.port(), 10809);
        // NBD has no authentication: nothing off this machine reaches it
        // unless the admin says so.
        assert!(run.nbd_listen.ip().is_loopback());
        assert_eq!(run.api_listen.port(), 7450);
        assert_eq!(run.nbd_socket, None);
        assert_eq!(
            run.kernel_nbd_request_timeout,
            trireme_node::local_device::REQUEST_TIMEOUT
        );
        assert_eq!(
            run.kernel_nbd_dead_connection_timeout,
            trireme_node::local_device::DEAD_CONNECTION_TIMEOUT
        );
    }

    #[test]
    fn kernel_nbd_timeouts_are_read_and_bad_ones_refused_naming_the_flag() {
        let run = |extra: &[&str]| {
            let mut args = vec!["node", "run"];
            args.extend_from_slice(extra);
            parse(&args)
        };
        let cli = run(&[
            "--kernel-nbd-request-timeout",
            "30",
            "--kernel-nbd-dead-connection-timeout",
            "600s",
        ])
        .unwrap();
        let Command::Node(NodeCommand::Run(parsed)) = cli.command else {
            panic!("wrong command");
        };
        assert_eq!(parsed.kernel_nbd_request_timeout.as_secs(), 30);
        assert_eq!(parsed.kernel_nbd_dead_connection_timeout.as_secs(), 600);
        for (flag, value, says) in [
            ("--kernel-nbd-request-timeout", "0", "for ever"),
            (
                "--kernel-nbd-request-timeout",
                "99999",
                "longer than the 3600 s",
            ),
            (
                "--kernel-nbd-dead-connection-timeout",
                "0",
                "even for a restart",
            ),
            (
                "--kernel-nbd-dead-connection-timeout",
                "2m",
                "not a number of seconds",
            ),
        ] {
            let error = run(&[flag, value]).unwrap_err().to_string();
            assert!(
                error.contains(flag) && error.contains(says),
                "{flag} {value}: {error}"
            );
        }
    }

    #[test]
    fn pool_create_defaults_to_ssd() {
        let cli = parse(&[
            "pool",
            "create",
            "p",
            "--path",
            "/tmp/p.img",
            "--size",
            "100G",
        ])
        .unwrap();
        let Command::Pool(PoolCommand::Create {
            class,
            size,
            preallocate,
            ..
        }) = cli.command
        else {
            panic!("wrong command");
        };
        assert_eq!(class, DeviceClass::Ssd);
        assert_eq!(size, Some(100 << 30));
        assert!(!preallocate);
    }
}

#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Keep printing new events as they come, until interrupted.
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// Only events of this volume (also one deleted, while its events are
    /// in the log).
    #[arg(long, value_name = "VOLUME")]
    pub volume: Option<VolumeName>,
    /// How many of the newest events to print first (1 to 1000).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub limit: u16,
    /// Print the events after this sequence number instead of the newest
    /// (e.g. the last `seq` seen before), up to --limit of them.
    #[arg(long, value_name = "SEQ")]
    pub after: Option<u64>,
}
