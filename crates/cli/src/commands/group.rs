//! `trireme group ...` (alias `resource-group`): create, list, modify, delete.

use anyhow::{bail, Result};
use trireme_node::api::model::GroupBody;

use crate::args::{GroupCommand, GroupModifyArgs, OutputFormat, Switch};
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
        GroupCommand::Modify(arguments) => {
            let groups: Vec<GroupBody> = client.get("/groups")?.parse()?;
            let Some(mut group) = groups
                .into_iter()
                .find(|group| group.name == arguments.name.as_str())
            else {
                bail!(
                    "no resource group named '{}' (see `trireme group list`)",
                    arguments.name
                );
            };
            apply_changes(&mut group, &arguments);
            let answer = client.put(&format!("/groups/{}", arguments.name), &group)?;
            if json {
                output::print_json(&answer);
            } else {
                let group: GroupBody = answer.parse()?;
                println!("resource group '{}' changed", group.name);
                output::groups_table(std::slice::from_ref(&group));
                super::node::print_placement_warnings(client)?;
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

/// The options given replace the group's settings; the rest stay.
fn apply_changes(group: &mut GroupBody, arguments: &GroupModifyArgs) {
    if let Some(count) = arguments.place_count {
        group.place_count = count;
        // A lower place-count carries the minimum down with it, as at
        // creation, unless the minimum is given too.
        if group.min_place_count.is_some_and(|minimum| minimum > count) {
            group.min_place_count = Some(count);
        }
    }
    if let Some(minimum) = arguments.min_place_count {
        group.min_place_count = Some(minimum);
    }
    if let Some(pools) = &arguments.pools {
        group.pools = pools.iter().map(ToString::to_string).collect();
    }
    if arguments.any_pool {
        group.pools.clear();
    }
    if let Some(class) = arguments.class {
        group.class = Some(class.to_string());
    }
    if arguments.any_class {
        group.class = None;
    }
    if let Some(keys) = &arguments.replicas_on_different {
        group.replicas_on_different = keys.clone();
    }
    if arguments.replicas_anywhere {
        group.replicas_on_different.clear();
    }
    if let Some(switch) = arguments.diskless_on_remaining {
        group.diskless_on_remaining = switch == Switch::On;
    }
    if let Some(policy) = arguments.on_no_quorum {
        group.on_no_quorum = Some(policy.as_str().to_string());
    }
}
