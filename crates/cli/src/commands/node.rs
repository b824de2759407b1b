//! `trireme node run` (the daemon), `node info`, `list`, `show`, `label`
//! and `remove`.

use anyhow::{Context, Result};
use trireme_node::api::model::{
    NodeDetail, NodeEntry, NodeLabelsBody, NodeResponse, StatusResponse, VolumeResponse,
    VolumeState,
};
use trireme_node::cluster::ClusterConfig;
use trireme_node::DaemonConfig;
use trireme_types::{format_size, NodeName};

use crate::args::{LabelChange, LogFormat, NodeCommand, OutputFormat, RunArgs};
use crate::client::Client;
use crate::output;

/// What is logged when RUST_LOG is not set. openraft reports every failed
/// message to an unreachable peer (an ERROR and several WARNs, twice a
/// second, for as long as the peer is down) from its replication modules:
/// those are off, as the leader logs the peer's going and coming back once
/// (`cluster::leader`). openraft's own failures (storage, a fatal core
/// error) are logged by its core at ERROR, which stays on.
pub const DEFAULT_LOG_FILTER: &str = "info,openraft=error,openraft::replication=off,openraft::engine::handler::replication_handler=off";

pub fn run(command: NodeCommand, format: OutputFormat, client: impl Fn() -> Client) -> Result<()> {
    let json = format == OutputFormat::Json;
    match command {
        NodeCommand::Run(arguments) => run_daemon(*arguments),
        NodeCommand::Info => {
            let answer = client().get("/node")?;
            if json {
                output::print_json(&answer);
            } else {
                output::node_info(&answer.parse::<NodeResponse>()?);
            }
            Ok(())
        }
        NodeCommand::List => {
            let answer = client().get("/nodes")?;
            if json {
                output::print_json(&answer);
            } else {
                output::nodes_table(&answer.parse::<Vec<NodeEntry>>()?);
            }
            Ok(())
        }
        NodeCommand::Remove { name } => remove(&client(), &name, json),
        NodeCommand::Show { name } => {
            let answer = client().get(&format!("/nodes/{name}"))?;
            if json {
                output::print_json(&answer);
            } else {
                print_node(&answer.parse::<NodeDetail>()?);
            }
            Ok(())
        }
        NodeCommand::Label { name, changes } => {
            let mut body = NodeLabelsBody::default();
            for change in changes {
                match change {
                    LabelChange::Set(key, value) => {
                        body.set.insert(key, value);
                    }
                    LabelChange::Remove(key) => body.remove.push(key),
                }
            }
            let client = client();
            let answer = client.put(&format!("/nodes/{name}/labels"), &body)?;
            if json {
                output::print_json(&answer);
                return Ok(());
            }
            let node: NodeDetail = answer.parse()?;
            println!("node '{name}' labels: {}", labels_text(&node.node.labels));
            print_placement_warnings(&client)
        }
    }
}

fn labels_text(labels: &std::collections::BTreeMap<String, String>) -> String {
    if labels.is_empty() {
        return "-".into();
    }
    labels
        .iter()
        .map(|(key, value)| format!("{key}={value}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// After a label or group change: the volumes whose replicas no longer
/// satisfy their group (`status`'s `misplaced_volumes`), each with the
/// warning that gives the commands.
pub fn print_placement_warnings(client: &Client) -> Result<()> {
    let status: StatusResponse = client.get("/status")?.parse()?;
    if status.misplaced_volumes.is_empty() {
        println!("every volume's placement still satisfies its group");
    }
    for misplaced in &status.misplaced_volumes {
        println!("warning: {}", misplaced.warning);
    }
    Ok(())
}

/// `trireme node show NAME`.
fn print_node(detail: &NodeDetail) {
    let node = &detail.node;
    println!("node {} (id {})", node.name, node.id);
    println!(
        "  state:    {} for {} (since {})",
        node.state,
        output::format_age(node.state_seconds),
        output::format_unix_time(detail.state_since_ms / 1000)
    );
    println!("  role:     {} in the control plane", node.role);
    println!(
        "  joined:   {}",
        output::format_unix_time(detail.joined_ms / 1000)
    );
    println!("  labels:   {}", labels_text(&node.labels));
    println!("  api:      {}", node.api_address);
    println!("  nbd:      {}", node.nbd_address.as_deref().unwrap_or("-"));
    println!(
        "  data:     {}",
        node.data_address.as_deref().unwrap_or("-")
    );
    if detail.pool_list.is_empty() {
        println!("  pools:    none");
    }
    for pool in &detail.pool_list {
        println!(
            "  pool:     {} ({}, {} free of {}{})",
            pool.name,
            pool.class,
            format_size(pool.free_bytes),
            format_size(pool.capacity_bytes),
            if pool.online { "" } else { ", offline" }
        );
    }
    if detail.replicas.is_empty() {
        println!("  replicas: none");
    }
    for replica in &detail.replicas {
        let mut text = format!("{} {}", replica.volume, replica.kind);
        if let Some(pool) = &replica.pool {
            text.push_str(&format!(" in {pool}"));
        }
        if replica.data != "-" {
            text.push_str(&format!(", {}", replica.data));
        }
        if replica.primary {
            text.push_str(", attached here");
        }
        println!("  replica:  {text}");
    }
}

/// `trireme node remove NAME`, saying what the removal did.
fn remove(client: &Client, name: &NodeName, json: bool) -> Result<()> {
    // What the node was and held, for the report; the removal decides.
    let entry = client
        .get("/nodes")?
        .parse::<Vec<NodeEntry>>()
        .ok()
        .and_then(|nodes| nodes.into_iter().find(|node| node.name == name.as_str()));
    let held: Option<Vec<String>> = client
        .get("/volumes")?
        .parse::<Vec<VolumeResponse>>()
        .ok()
        .map(|volumes| {
            volumes
                .into_iter()
                .filter(|volume| {
                    volume.state != VolumeState::Deleting
                        && volume
                            .replicas
                            .iter()
                            .any(|replica| replica.node == name.as_str())
                })
                .map(|volume| volume.name)
                .collect()
        });
    let answer = client.delete(&format!("/nodes/{name}"))?;
    if json {
        output::print_json(&answer);
        return Ok(());
    }
    match &entry {
        Some(node) => println!(
            "node '{name}' (id {}, {} {}) removed from the cluster",
            node.id, node.state, node.role
        ),
        None => println!("node '{name}' removed from the cluster"),
    }
    if entry
        .as_ref()
        .is_some_and(|node| node.role == "leader" || node.role == "voter")
    {
        println!("its vote in the control plane goes to another online node, if one can take it");
    }
    match held.as_deref() {
        Some([]) => println!("it held no replicas"),
        Some(volumes) => println!(
            "its replicas of {} are dropped: those volumes have fewer replicas now (see `trireme status`)",
            volumes.join(", ")
        ),
        None => {}
    }
    if entry.as_ref().is_some_and(|node| node.state == "online") {
        println!("`trireme node run` on that machine stops by itself once it hears of it");
    }
    println!(
        "that node refuses to start on its old data directory: to use the machine again, wipe the directory and join it as a new node (`trireme node run --join ...`)"
    );
    Ok(())
}

fn run_daemon(arguments: RunArgs) -> Result<()> {
    // Logs go to stderr: stdout carries the few lines meant for people and
    // scripts (the default pool, the demo volume, the ready line).
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(DEFAULT_LOG_FILTER));
    let log = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match arguments.log_format {
        LogFormat::Text => log
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .init(),
        // One JSON object a line, the event's fields at the top level.
        LogFormat::Json => log.json().flatten_event(true).init(),
    }
    let name = match arguments.name {
        Some(name) => name,
        None => host_name()?,
    };
    let config = DaemonConfig {
        cluster: ClusterConfig {
            name,
            labels: arguments.labels.into_iter().collect(),
            join: arguments.join.zip(arguments.token),
            trust_loopback: arguments.trust_loopback,
        },
        advertise: arguments.advertise,
        data_dir: arguments.data_dir,
        api_listen: arguments.api_listen,
        nbd_listen: arguments.nbd_listen,
        nbd_socket: arguments.nbd_socket,
        data_listen: arguments.data_listen,
        demo: arguments.demo,
        kernel_nbd_timeouts: trireme_node::local_device::KernelNbdTimeouts {
            request: arguments.kernel_nbd_request_timeout,
            dead_connection: arguments.kernel_nbd_dead_connection_timeout,
        },
    };
    let runtime = tokio::runtime::Runtime::new().context("starting the async runtime")?;
    runtime.block_on(trireme_node::run(config))?;
    Ok(())
}

/// The default node name: the host name, which must be a valid node name.
fn host_name() -> Result<NodeName> {
    let text = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .context("reading the host name (give the node a name with --name)")?;
    NodeName::new(text.trim()).with_context(|| {
        format!(
            "the host name '{}' is not a valid node name: give one with --name",
            text.trim()
        )
    })
}
