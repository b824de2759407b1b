//! `trireme pool ...`: create, list, show, delete, scan.

use anyhow::{Context, Result};
use trireme_node::api::model::{CreatePoolRequest, NodeResponse, PoolResponse, ScanResponse};

use crate::args::{OutputFormat, PoolCommand};
use crate::client::Client;
use crate::output;

pub fn run(command: PoolCommand, format: OutputFormat, client: &Client) -> Result<()> {
    let json = format == OutputFormat::Json;
    match command {
        PoolCommand::Create {
            name,
            path,
            size,
            class,
            preallocate,
            force,
        } => {
            // The node resolves paths from its own directory: send an absolute one.
            let path = std::path::absolute(&path)
                .with_context(|| format!("--path: cannot make '{}' absolute", path.display()))?;
            let request = CreatePoolRequest {
                name: name.to_string(),
                path: path.display().to_string(),
                size_bytes: size,
                class: Some(class.to_string()),
                preallocate,
                force,
            };
            let answer = client.post("/pools", &request)?;
            if json {
                output::print_json(&answer);
            } else {
                let pool: PoolResponse = answer.parse()?;
                println!("pool '{}' created on {}", pool.name, pool.device_path);
                output::pool_detail(&pool);
            }
        }
        PoolCommand::List => {
            let answer = client.get("/pools")?;
            if json {
                output::print_json(&answer);
            } else {
                let node: NodeResponse = client.get("/node")?.parse()?;
                output::pools_table(&answer.parse::<Vec<PoolResponse>>()?, &node.node_name);
            }
        }
        PoolCommand::Show { name } => {
            let answer = client.get(&format!("/pools/{name}"))?;
            if json {
                output::print_json(&answer);
            } else {
                output::pool_detail(&answer.parse()?);
            }
        }
        PoolCommand::Delete { name } => {
            let answer = client.delete(&format!("/pools/{name}"))?;
            if json {
                output::print_json(&answer);
            } else {
                println!("pool '{name}' deleted");
            }
        }
        PoolCommand::Scan { name } => {
            let answer = client.post_empty(&format!("/pools/{name}/scan"))?;
            let report: ScanResponse = answer.parse()?;
            if json {
                output::print_json(&answer);
            } else {
                output::scan_report(name.as_str(), &report);
            }
            if !report.clean {
                anyhow::bail!("pool '{name}' failed its scan");
            }
        }
    }
    Ok(())
}
