//! `trireme volume ...`: create, list, show, grow, delete.

use anyhow::Result;
use trireme_node::api::model::{
    CreateVolumeRequest, GrowVolumeRequest, NodeEntry, PoolResponse, VolumeResponse,
};
use trireme_types::format_size;

use crate::args::{OutputFormat, VolumeCommand};
use crate::client::Client;
use crate::output;

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
        } => {
            let request = CreateVolumeRequest {
                name: name.to_string(),
                size_bytes: size,
                pool: pool.map(String::from),
                group: group.map(String::from),
                replicas,
                nodes: nodes.map(|nodes| nodes.into_iter().map(String::from).collect()),
            };
            let answer = client.post("/volumes", &request)?;
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
                output::volumes_table(&volumes, &pools, &not_online(client));
            }
        }
        VolumeCommand::Show { name } => {
            let answer = client.get(&format!("/volumes/{name}"))?;
            if json {
                output::print_json(&answer);
            } else {
                output::volume_detail(&answer.parse()?, &not_online(client));
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
            }
        }
        VolumeCommand::Delete { name } => {
            let answer = client.delete(&format!("/volumes/{name}"))?;
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
