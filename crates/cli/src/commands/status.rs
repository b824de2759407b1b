//! `trireme status`: the cluster on one screen, with its I/O rates like
//! the `io:` section of `ceph -s`.

use anyhow::Result;
use trireme_node::api::model::{IoResponse, StatusResponse};

use crate::args::OutputFormat;
use crate::client::Client;
use crate::output;

pub fn run(format: OutputFormat, client: &Client) -> Result<()> {
    let answer = client.get("/status")?;
    // Rates are extra: a node that cannot give them (an older version)
    // still shows the rest.
    let io = client
        .get("/io")
        .ok()
        .filter(|answer| answer.status == 200)
        .and_then(|answer| answer.parse::<IoResponse>().ok());
    if format == OutputFormat::Json {
        let mut status: serde_json::Value = answer.parse()?;
        if let (Some(object), Some(io)) = (status.as_object_mut(), &io) {
            object.insert("io".to_string(), serde_json::to_value(io)?);
        }
        println!("{}", serde_json::to_string(&status)?);
    } else {
        output::status_screen(&answer.parse::<StatusResponse>()?);
        if let Some(io) = &io {
            output::io_screen(io);
        }
    }
    Ok(())
}
