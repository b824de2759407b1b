//! `trireme group ...` (alias `resource-group`): create, list, delete.

use anyhow::Result;
use trireme_node::api::model::GroupBody;

use crate::args::{GroupCommand, OutputFormat};
use crate::client::Client;
use crate::output;

pub fn run(command: GroupCommand, format: OutputFormat, client: &Client) -> Result<()> {
    let json = format == OutputFormat::Json;
    match command {
        GroupCommand::Create(arguments) => {
            let request = GroupBody {
                name: arguments.name.to_string(),
                place_count: arguments.place_count,
                min_place_count: arguments.min_place_count,
                pools: arguments.pools.iter().map(ToString::to_string).collect(),
                class: arguments.class.map(|class| class.to_string()),
                replicas_on_different: arguments.replicas_on_different,
                diskless_on_remaining: arguments.diskless_on_remaining,
                on_no_quorum: Some(arguments.on_no_quorum.as_str().to_string()),
            };
            let answer = client.post("/groups", &request)?;
            if json {
                output::print_json(&answer);
            } else {
                let group: GroupBody = answer.parse()?;
                println!(
                    "resource group '{}' created; use it with `trireme volume create NAME --size SIZE --group {}`",
                    group.name, group.name
                );
                output::groups_table(std::slice::from_ref(&group));
            }
        }
        GroupCommand::List => {
            let answer = client.get("/groups")?;
            if json {
                output::print_json(&answer);
            } else {
                output::groups_table(&answer.parse::<Vec<GroupBody>>()?);
            }
        }
        GroupCommand::Delete { name } => {
            let answer = client.delete(&format!("/groups/{name}"))?;
            if json {
                output::print_json(&answer);
            } else {
                println!("resource group '{name}' deleted");
            }
        }
    }
    Ok(())
}
