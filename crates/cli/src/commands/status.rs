//! `trireme status`: the cluster on one screen.

use anyhow::Result;
use trireme_node::api::model::StatusResponse;

use crate::args::OutputFormat;
use crate::client::Client;
use crate::output;

pub fn run(format: OutputFormat, client: &Client) -> Result<()> {
    let answer = client.get("/status")?;
    if format == OutputFormat::Json {
        output::print_json(&answer);
    } else {
        output::status_screen(&answer.parse::<StatusResponse>()?);
    }
    Ok(())
}
