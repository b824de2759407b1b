//! `trireme events`: the cluster's event log, once or followed.

use anyhow::Result;
use std::io::Write;
use std::time::Duration;
use trireme_node::api::model::{EventResponse, EventsResponse};

use crate::args::{EventsArgs, OutputFormat};
use crate::client::Client;
use crate::output;

/// How often `--follow` asks for new events.
const FOLLOW_INTERVAL: Duration = Duration::from_secs(1);
/// Events asked for per request while following: the whole log, so a
/// backlog is read in one answer of bounded size.
const FOLLOW_PAGE: usize = 1000;

pub fn run(arguments: EventsArgs, format: OutputFormat, client: &Client) -> Result<()> {
    let json = format == OutputFormat::Json;
    let volume = arguments
        .volume
        .as_ref()
        .map(|volume| format!("&volume={volume}"))
        .unwrap_or_default();
    let after = arguments
        .after
        .map(|after| format!("&after={after}"))
        .unwrap_or_default();
    let answer = client.get(&format!("/events?limit={}{after}{volume}", arguments.limit))?;
    if json && !arguments.follow {
        output::print_json(&answer);
        return Ok(());
    }
    let first: EventsResponse = answer.parse()?;
    if !json && first.events.is_empty() && !arguments.follow {
        println!("no events");
    }
    print_page(&first, json, arguments.after)?;
    if !arguments.follow {
        return Ok(());
    }
    let mut last = first
        .events
        .last()
        .map_or(arguments.after.unwrap_or(first.last_seq), |event| event.seq);
    loop {
        std::thread::sleep(FOLLOW_INTERVAL);
        let page: EventsResponse = client
            .get(&format!("/events?after={last}&limit={FOLLOW_PAGE}{volume}"))?
            .parse()?;
        print_page(&page, json, Some(last))?;
        if let Some(event) = page.events.last() {
            last = event.seq;
        }
    }
}

fn print_page(page: &EventsResponse, json: bool, after: Option<u64>) -> Result<()> {
    if page.missed > 0 {
        eprintln!(
            "note: {} event(s) after #{} were dropped from the log (it keeps the last 1000) before they were read",
            page.missed,
            after.unwrap_or(0)
        );
    }
    let mut out = std::io::stdout().lock();
    for event in &page.events {
        if json {
            writeln!(out, "{}", serde_json::to_string(event)?)?;
        } else {
            writeln!(out, "{}", line(event))?;
        }
    }
    out.flush()?;
    Ok(())
}

/// `2026-11-27 04:48:49  #12 attached  vm1 @n1  by admin token via n2: ...`
fn line(event: &EventResponse) -> String {
    let time = event.time.replace('T', " ");
    let time = time.split('.').next().unwrap_or(&time);
    let mut subject = String::new();
    if let Some(volume) = &event.volume {
        subject.push_str(&format!(" {volume}"));
    }
    if let Some(node) = &event.node {
        subject.push_str(&format!(" @{node}"));
    }
    format!(
        "{time}  #{} {}{subject}  by {}: {}",
        event.seq, event.kind, event.actor, event.message
    )
}
