//! `trireme volume ...`: create, list, show (and wait for resyncs), grow,
//! delete, attach, detach, add or remove a replica, and verify the replicas.

use anyhow::{bail, Result};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::time::{Duration, Instant};
use trireme_node::api::model::{
    AddReplicaRequest, AttachRequest, AttachResponse, CloneRequest, CreateVolumeRequest,
    DetachRequest, GrowVolumeRequest, NodeEntry, NodeResponse, PoolResponse, ReplicaResponse,
    RollbackRequest, VerifyResponse, VolumeResponse,
};
use trireme_types::{format_size, VolumeName};

use crate::args::{OutputFormat, ReplicaCommand, VolumeCommand};
use crate::client::{Answer, Client};
use crate::output;

/// How long `volume show --wait` sees no resync able to run before it
/// stops and says why.
const WAIT_BLOCKED_GRACE: Duration = Duration::from_secs(10);
/// How often `volume show --wait` asks for the volume.
const WAIT_POLL: Duration = Duration::from_millis(500);

pub fn run(command: VolumeCommand, format: OutputFormat, client: &Client) -> Result<()> {
    let json = format == OutputFormat::Json;
    match command {
        VolumeCommand::Create {
            name,
            size,
            pool,
            group,
            replicas,
            nodes,
            from_snapshot,
        } => {
            let answer = match (from_snapshot, size) {
                (Some((source, snapshot)), _) => client.post(
                    &format!("/volumes/{source}/snapshots/{snapshot}/clone"),
                    &CloneRequest {
                        name: name.to_string(),
                        group: group.map(String::from),
                    },
                )?,
                (None, Some(size)) => client.post(
                    "/volumes",
                    &CreateVolumeRequest {
                        name: name.to_string(),
                        size_bytes: size,
                        pool: pool.map(String::from),
                        group: group.map(String::from),
                        replicas,
                        nodes: nodes.map(|nodes| nodes.into_iter().map(String::from).collect()),
                    },
                )?,
                (None, None) => bail!("give --size, or --from-snapshot VOLUME@SNAPSHOT"),
            };
            let volume: Option<VolumeResponse> = if json {
                output::print_json(&answer);
                // The JSON is the node's; the note goes to stderr.
                answer.accepted().then(|| answer.parse()).transpose()?
            } else {
                let volume: VolumeResponse = answer.parse()?;
                println!(
                    "volume '{}' created: {} in pool '{}', group '{}', replicas {}",
                    volume.name,
                    format_size(volume.size_bytes),
                    volume.pool,
                    volume.group,
                    output::replicas_column(&volume.replicas, &output::NotOnline::new())
                );
                if let Some(url) = &volume.nbd_url {
                    println!("served at {url}");
                }
                Some(volume)
            };
            if let Some(volume) = volume.filter(|_| answer.accepted()) {
                let note = pending_note(&volume);
                if json {
                    eprintln!("{note}");
                } else {
                    println!("{note}");
                }
            }
        }
        VolumeCommand::List => {
            let answer = client.get("/volumes")?;
            if json {
                output::print_json(&answer);
            } else {
                let volumes: Vec<VolumeResponse> = answer.parse()?;
                let pools: Vec<PoolResponse> = client.get("/pools")?.parse()?;
                let node: NodeResponse = client.get("/node")?.parse()?;
                output::volumes_table(&volumes, &pools, &node.node_name, &not_online(client));
            }
        }
        VolumeCommand::Show {
            name,
            wait,
            timeout,
        } => {
            let answer = if wait {
                wait_in_sync(client, &name, timeout.map(Duration::from_secs), json)?
            } else {
                client.get(&format!("/volumes/{name}"))?
            };
            if json {
                output::print_json(&answer);
            } else {
                output::volume_detail(&answer.parse()?, &not_online(client));
            }
        }
        VolumeCommand::Attach {
            name,
            node,
            allow_two_primaries,
            force_takeover,
        } => {
            let answer = client.post(
                &format!("/volumes/{name}/attach"),
                &AttachRequest {
                    node: node.to_string(),
                    allow_two_primaries,
                    force_takeover,
                },
            )?;
            if json {
                output::print_json(&answer);
            } else {
                print_attached(&name, &answer.parse()?);
            }
        }
        VolumeCommand::Detach { name, node } => {
            let answer = client.post(
                &format!("/volumes/{name}/detach"),
                &DetachRequest {
                    node: node.as_ref().map(ToString::to_string),
                },
            )?;
            if json {
                output::print_json(&answer);
            } else {
                let volume: VolumeResponse = answer.parse()?;
                let from = node.map(|node| format!(" from {node}")).unwrap_or_default();
                if volume.primaries.is_empty() {
                    println!("volume '{name}' is detached{from}: no node serves it now");
                } else {
                    println!(
                        "volume '{name}' is detached{from}; still attached on {}",
                        volume.primaries.join(", ")
                    );
                }
            }
        }
        VolumeCommand::Verify {
            name,
            no_wait,
            status,
        } => return verify(client, &name, no_wait, status, json),
        VolumeCommand::Replica(ReplicaCommand::Add { name, node, pool }) => {
            // Which nodes held one before, to name the new one.
            let before: Vec<String> = if json {
                Vec::new()
            } else {
                diskful_nodes(&client.get(&format!("/volumes/{name}"))?.parse()?)
            };
            let answer = client.post(
                &format!("/volumes/{name}/replicas"),
                &AddReplicaRequest {
                    node: node.map(String::from),
                    pool: pool.map(String::from),
                },
            )?;
            if json {
                output::print_json(&answer);
            } else {
                let volume: VolumeResponse = answer.parse()?;
                let added: Vec<String> = diskful_nodes(&volume)
                    .into_iter()
                    .filter(|node| !before.contains(node))
                    .collect();
                println!(
                    "volume '{name}': new replica on {}; it is outdated until the data is copied to it (`trireme volume show {name} --wait` follows the resync)",
                    if added.is_empty() {
                        "another node".to_string()
                    } else {
                        added.join(", ")
                    }
                );
            }
        }
        VolumeCommand::Replica(ReplicaCommand::Remove { name, node }) => {
            let answer = client.delete(&format!("/volumes/{name}/replicas/{node}"))?;
            if json {
                output::print_json(&answer);
            } else {
                let volume: VolumeResponse = answer.parse()?;
                let still_primary = volume
                    .primaries
                    .iter()
                    .any(|primary| *primary == node.as_str());
                println!(
                    "volume '{name}': the replica on {node} is removed; replicas now {}",
                    output::replicas_column(&volume.replicas, &output::NotOnline::new())
                );
                if still_primary {
                    println!(
                        "{node} stays attached and serves the volume through the other replicas"
                    );
                }
            }
        }
        VolumeCommand::Rollback { name, snapshot } => {
            let answer = client.post(
                &format!("/volumes/{name}/rollback"),
                &RollbackRequest {
                    snapshot: snapshot.to_string(),
                },
            )?;
            if json {
                output::print_json(&answer);
            } else if answer.accepted() {
                println!(
                    "volume '{name}' is rolling back to '{snapshot}'; it can be attached once every replica holding the snapshot is done (`trireme volume show {name}`)"
                );
            } else {
                let volume: VolumeResponse = answer.parse()?;
                println!(
                    "volume '{name}' has the content of snapshot '{snapshot}' again (generation {})",
                    volume.generation
                );
            }
        }
        VolumeCommand::Grow { name, size } => {
            let answer = client.post(
                &format!("/volumes/{name}/grow"),
                &GrowVolumeRequest { size_bytes: size },
            )?;
            if json {
                output::print_json(&answer);
            } else {
                let volume: VolumeResponse = answer.parse()?;
                println!(
                    "volume '{}' is now {}",
                    volume.name,
                    format_size(volume.size_bytes)
                );
                // A running engine keeps the size it started with
                // (docs/replication.md, known limits).
                if !volume.primaries.is_empty() {
                    println!(
                        "it is attached on {}, which serves the old size until it is detached and attached again (`trireme volume detach {name}`, then `trireme volume attach {name} --node NODE`); NBD clients see the new size when they reconnect",
                        volume.primaries.join(" and ")
                    );
                }
            }
        }
        VolumeCommand::Delete {
            name,
            with_snapshots,
        } => {
            let query = if with_snapshots {
                "?with_snapshots=true"
            } else {
                ""
            };
            let answer = client.delete(&format!("/volumes/{name}{query}"))?;
            if json {
                output::print_json(&answer);
            } else if answer.accepted() {
                // Which nodes still hold a copy, if the volume is still listed.
                let holders = client
                    .get(&format!("/volumes/{name}"))
                    .and_then(|answer| answer.parse::<VolumeResponse>())
                    .map(|volume| {
                        volume
                            .replicas
                            .iter()
                            .filter(|replica| replica.kind == "diskful")
                            .map(|replica| replica.node.clone())
                            .collect::<Vec<_>>()
                    })
                    .unwrap_or_default();
                let nodes = if holders.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", holders.join(", "))
                };
                println!(
                    "volume '{name}' is being deleted: not every node holding a replica{nodes} \
                     has removed its copy yet (offline?); the volume is gone once they have \
                     (see `trireme volume list`)"
                );
            } else {
                println!("volume '{name}' deleted");
            }
        }
    }
    Ok(())
}

/// The nodes that are offline or evicted, to mark their replicas; none
/// when the list cannot be had (the volume table still shows).
fn not_online(client: &Client) -> output::NotOnline {
    client
        .get("/nodes")
        .and_then(|answer| answer.parse::<Vec<NodeEntry>>())
        .map(|nodes| {
            nodes
                .into_iter()
                .filter(|node| node.state != "online")
                .map(|node| node.name)
                .collect()
        })
        .unwrap_or_default()
}

/// What a 202 to a create means: the volume exists, some replicas do not yet.
fn pending_note(volume: &VolumeResponse) -> String {
    let pending: Vec<&str> = volume
        .replicas
        .iter()
        .filter(|replica| replica.kind == "diskful" && replica.state == "pending")
        .map(|replica| replica.node.as_str())
        .collect();
    let nodes = if pending.is_empty() {
        "some nodes".to_string()
    } else {
        pending.join(", ")
    };
    format!(
        "volume '{}' was created, but the replicas on {nodes} are still pending: those nodes have \
         not reported them yet (offline or slow?); `trireme volume show {}` shows when they are ready",
        volume.name, volume.name
    )
}

fn diskful_nodes(volume: &VolumeResponse) -> Vec<String> {
    volume
        .replicas
        .iter()
        .filter(|replica| replica.kind == "diskful")
        .map(|replica| replica.node.clone())
        .collect()
}

/// The diskful replicas of `volume` that are not up to date.
fn behind(volume: &VolumeResponse) -> Vec<&ReplicaResponse> {
    volume
        .replicas
        .iter()
        .filter(|replica| replica.kind == "diskful" && !replica.in_sync)
        .collect()
}

/// `n3 syncing 42% (12 MiB/s, 3m20s left), n4 outdated`.
fn behind_text(replicas: &[&ReplicaResponse]) -> String {
    replicas
        .iter()
        .map(|replica| format!("{} {}", replica.node, output::replica_state_text(replica)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `volume show --wait`: polls the volume until every diskful replica is up
/// to date, with a progress bar per replica that is behind (on a terminal;
/// elsewhere a line whenever the picture changes). Returns the last answer.
fn wait_in_sync(
    client: &Client,
    name: &VolumeName,
    timeout: Option<Duration>,
    json: bool,
) -> Result<Answer> {
    let started = Instant::now();
    let draw = !json && std::io::stderr().is_terminal();
    let lines = !json && !draw;
    let bars = MultiProgress::new();
    let style = ProgressStyle::with_template(
        "{prefix:>12} [{bar:40.cyan/blue}] {percent:>3}% {binary_bytes}/{binary_total_bytes} {msg}",
    )
    .expect("the template is valid")
    .progress_chars("=> ");
    let mut shown: BTreeMap<String, ProgressBar> = BTreeMap::new();
    let mut last_line = String::new();
    let mut blocked_since: Option<Instant> = None;
    loop {
        let answer = client.get(&format!("/volumes/{name}"))?;
        let volume: VolumeResponse = answer.parse()?;
        let behind = behind(&volume);
        if draw {
            for replica in &behind {
                let bar = shown.entry(replica.node.clone()).or_insert_with(|| {
                    let bar = bars.add(ProgressBar::new(0).with_style(style.clone()));
                    bar.set_prefix(replica.node.clone());
                    bar
                });
                match &replica.sync {
                    Some(sync) => {
                        bar.set_length(sync.total_bytes);
                        bar.set_position(sync.done_bytes.min(sync.total_bytes));
                        bar.set_message(output::sync_rate(sync));
                    }
                    None => bar.set_message("outdated: waiting for its resync to start"),
                }
            }
            for (node, bar) in &shown {
                if !bar.is_finished() && !behind.iter().any(|replica| &replica.node == node) {
                    bar.set_position(bar.length().unwrap_or(0));
                    bar.finish_with_message("up to date");
                }
            }
        }
        if behind.is_empty() {
            return Ok(answer);
        }
        // Nothing will copy the data to these replicas until something
        // changes: say why rather than wait for it (after a grace, since a
        // node that just restarted is reported online a moment later).
        let blocked = behind
            .iter()
            .all(|replica| replica.resync_blocked.is_some());
        let blocked_for = match (blocked, blocked_since) {
            (false, _) => {
                blocked_since = None;
                Duration::ZERO
            }
            (true, None) => {
                blocked_since = Some(Instant::now());
                Duration::ZERO
            }
            (true, Some(since)) => since.elapsed(),
        };
        if blocked_for >= WAIT_BLOCKED_GRACE {
            bars.clear().ok();
            let reasons: Vec<String> = behind
                .iter()
                .filter_map(|replica| {
                    let why = replica.resync_blocked.as_ref()?;
                    Some(format!("{}: {why}", replica.node))
                })
                .collect();
            bail!(
                "volume '{name}' is not up to date everywhere, and no resync can run: {}",
                reasons.join("; ")
            );
        }
        if lines {
            let line = behind_text(&behind);
            if line != last_line {
                eprintln!("volume '{name}': waiting for {line}");
                last_line = line;
            }
        }
        if let Some(timeout) = timeout {
            if started.elapsed() >= timeout {
                bars.clear().ok();
                bail!(
                    "volume '{name}' is still not up to date everywhere after {}: {}; \
                     `trireme volume show {name}` shows where it stands",
                    output::format_duration(timeout.as_secs()),
                    behind_text(&behind)
                );
            }
        }
        std::thread::sleep(WAIT_POLL);
    }
}

/// `volume verify`: starts (or joins) the verify on the volume's primary,
/// follows it with a progress bar unless `no_wait`, and prints the report.
/// Fails when the replicas do not end identical.
fn verify(
    client: &Client,
    name: &VolumeName,
    no_wait: bool,
    status_only: bool,
    json: bool,
) -> Result<()> {
    let path = format!("/volumes/{name}/verify");
    let mut answer = if status_only {
        client.get(&path)?
    } else {
        client.post(&path, &serde_json::json!({}))?
    };
    let mut report: VerifyResponse = answer.parse()?;
    if !(no_wait || status_only) {
        let draw = !json && std::io::stderr().is_terminal();
        let bar = draw.then(|| {
            ProgressBar::new(report.total_bytes).with_style(
                ProgressStyle::with_template(
                    "verify [{bar:40.cyan/blue}] {percent:>3}% {binary_bytes}/{binary_total_bytes} {msg}",
                )
                .expect("the template is valid")
                .progress_chars("=> "),
            )
        });
        while report.state == "running" {
            if let Some(bar) = &bar {
                bar.set_position(report.checked_bytes + report.skipped_bytes);
                bar.set_message(format!("{} blocks differ", report.differing_blocks));
            }
            std::thread::sleep(WAIT_POLL);
            answer = client.get(&path)?;
            report = answer.parse()?;
        }
        if let Some(bar) = &bar {
            bar.finish_and_clear();
        }
    }
    if json {
        output::print_json(&answer);
    } else {
        output::verify_report(&report);
    }
    match report.state.as_str() {
        "aborted" => bail!(
            "the verify of volume '{name}' stopped before the end: {}",
            report.reason.as_deref().unwrap_or("no reason given")
        ),
        "done" if report.unrecoverable_blocks > 0 => bail!(
            "{} blocks of volume '{name}' are unreadable on every replica: their data is lost; \
             restore them from a backup (the report above names the counts)",
            report.unrecoverable_blocks
        ),
        "done" if report.skipped_bytes > 0 => bail!(
            "{} of volume '{name}' could not be compared (fewer than two up-to-date replicas \
             answered); run the verify again once every replica is in sync",
            format_size(report.skipped_bytes)
        ),
        _ => Ok(()),
    }
}

/// What an attach did: where the volume is served now and, after a
/// takeover, what became of the former primary.
fn print_attached(name: &VolumeName, answer: &AttachResponse) {
    let volume = &answer.volume;
    println!(
        "volume '{name}' is attached on {} (generation {})",
        volume.primaries.join(" and "),
        volume.generation
    );
    if let Some(url) = &volume.nbd_url {
        println!("served at {url}");
    }
    for fenced in &answer.fenced {
        println!(
            "took over from {node} ({state}): {node} is fenced (the replicas refuse its writes, which carry a generation older than {generation}) and serves '{name}' no more. Do not start the VM that used it there again: it would run on the old disk state",
            node = fenced.node,
            state = fenced.state,
            generation = volume.generation,
        );
    }
    if volume.primaries.len() > 1 {
        println!(
            "two primaries: detach one once the migration is done (`trireme volume detach {name} --node NODE`)"
        );
    }
}
