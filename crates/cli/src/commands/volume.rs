//! `trireme volume ...`: create, list, show, grow, delete.

use anyhow::Result;
use trireme_node::api::model::{
    CreateVolumeRequest, GrowVolumeRequest, PoolResponse, VolumeResponse,
};
use trireme_types::format_size;

use crate::args::{OutputFormat, VolumeCommand};
use crate::client::Client;
use crate::output;

pub fn run(command: VolumeCommand, format: OutputFormat, client: &Client) -> Result<()> {
    let json = format == OutputFormat::Json;
    match command {
        VolumeCommand::Create { name, size, pool } => {
            let request = CreateVolumeRequest {
                name: name.to_string(),
                size_bytes: size,
                pool: pool.map(String::from),
            };
            let answer = client.post("/volumes", &request)?;
            if json {
                output::print_json(&answer);
            } else {
                let volume: VolumeResponse = answer.parse()?;
                println!(
                    "volume '{}' created: {} in pool '{}'",
                    volume.name,
                    format_size(volume.size_bytes),
                    volume.pool
                );
                if let Some(url) = &volume.nbd_url {
                    println!("served at {url}");
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
                output::volumes_table(&volumes, &pools);
            }
        }
        VolumeCommand::Show { name } => {
            let answer = client.get(&format!("/volumes/{name}"))?;
            if json {
                output::print_json(&answer);
            } else {
                output::volume_detail(&answer.parse()?);
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
            } else {
                println!("volume '{name}' deleted");
            }
        }
    }
    Ok(())
}
