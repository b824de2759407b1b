//! `trireme snapshot ...`: create, list, delete, schedule.

use anyhow::Result;
use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{Cell, CellAlignment, ContentArrangement, Table};
use trireme_node::api::model::{
    CreateSnapshotRequest, ScheduleRequest, ScheduleResponse, SnapshotResponse,
};
use trireme_types::format_size;

use crate::args::{OutputFormat, SnapshotCommand};
use crate::client::Client;
use crate::output;

pub fn run(command: SnapshotCommand, format: OutputFormat, client: &Client) -> Result<()> {
    let json = format == OutputFormat::Json;
    match command {
        SnapshotCommand::Create { volume, name } => {
            let answer = client.post(
                &format!("/volumes/{volume}/snapshots"),
                &CreateSnapshotRequest {
                    name: name.to_string(),
                },
            )?;
            if json {
                output::print_json(&answer);
                return Ok(());
            }
            let snapshot: SnapshotResponse = answer.parse()?;
            if answer.accepted() {
                println!(
                    "snapshot '{volume}@{name}' asked; not every replica has taken it yet (`trireme snapshot list {volume}`)"
                );
            } else {
                println!(
                    "snapshot '{volume}@{name}' taken on {}",
                    snapshot.nodes.join(", ")
                );
                if let Some(url) = &snapshot.nbd_url {
                    println!("read-only at {url}");
                }
            }
        }
        SnapshotCommand::List { volume } => {
            let path = match &volume {
                Some(volume) => format!("/volumes/{volume}/snapshots"),
                None => "/snapshots".to_string(),
            };
            let answer = client.get(&path)?;
            if json {
                output::print_json(&answer);
            } else {
                table(&answer.parse::<Vec<SnapshotResponse>>()?);
            }
        }
        SnapshotCommand::Delete { volume, name } => {
            let answer = client.delete(&format!("/volumes/{volume}/snapshots/{name}"))?;
            if json {
                output::print_json(&answer);
            } else if answer.accepted() {
                println!(
                    "snapshot '{volume}@{name}' is being deleted; a node holding it has not removed it yet (it does when it is back online)"
                );
            } else {
                println!("snapshot '{volume}@{name}' deleted");
            }
        }
        SnapshotCommand::Schedule {
            volume,
            every,
            keep,
            off,
        } => {
            let path = format!("/volumes/{volume}/snapshot-schedule");
            let answer = match (every, keep, off) {
                (Some(every_secs), Some(keep), _) => {
                    client.put(&path, &ScheduleRequest { every_secs, keep })?
                }
                (_, _, true) => client.delete(&path)?,
                _ => client.get(&path)?,
            };
            if json {
                output::print_json(&answer);
                return Ok(());
            }
            let schedule: ScheduleResponse = answer.parse()?;
            match (schedule.every_secs, schedule.keep) {
                (Some(every), Some(keep)) => println!(
                    "volume '{volume}': a snapshot every {}, the newest {keep} kept",
                    output::format_duration(every)
                ),
                _ => println!("volume '{volume}' has no snapshot schedule"),
            }
        }
    }
    Ok(())
}

fn table(snapshots: &[SnapshotResponse]) {
    if snapshots.is_empty() {
        println!("no snapshots");
        return;
    }
    let mut table = Table::new();
    table
        .load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(vec![
            "VOLUME",
            "SNAPSHOT",
            "STATE",
            "CREATED (UTC)",
            "SIZE",
            "EXCLUSIVE",
            "SHARED",
            "NODES",
        ]);
    let right = |text: String| Cell::new(text).set_alignment(CellAlignment::Right);
    for snapshot in snapshots {
        let state = match &snapshot.error {
            Some(error) => format!("{}: {error}", snapshot.state),
            None if snapshot.scheduled => format!("{} (scheduled)", snapshot.state),
            None => snapshot.state.clone(),
        };
        table.add_row(vec![
            Cell::new(&snapshot.volume),
            Cell::new(&snapshot.name),
            Cell::new(state),
            Cell::new(output::format_unix_time(snapshot.created_unix_seconds)),
            right(format_size(snapshot.size_bytes)),
            right(format_size(snapshot.exclusive_bytes)),
            right(format_size(snapshot.shared_bytes)),
            Cell::new(snapshot.nodes.join(", ")),
        ]);
    }
    println!("{table}");
}
