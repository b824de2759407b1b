//! `trireme cluster join-token` and `trireme cluster settings`.

use anyhow::Result;
use trireme_node::api::model::{JoinTokenResponse, SettingsBody};

use crate::args::{ClusterCommand, OutputFormat, Switch};
use crate::client::Client;
use crate::output;

pub fn run(command: ClusterCommand, format: OutputFormat, client: &Client) -> Result<()> {
    let json = format == OutputFormat::Json;
    match command {
        ClusterCommand::JoinToken => {
            let answer = client.get("/cluster/join-token")?;
            if json {
                output::print_json(&answer);
                return Ok(());
            }
            let join: JoinTokenResponse = answer.parse()?;
            println!("join token: {}", join.token);
            println!("on each machine to add, run:");
            println!("  {}", join.command);
            if let Some(address) = loopback_join_address(&join.command) {
                println!(
                    "note: {address} is a loopback address that other machines cannot reach; \
                     start this node with --api-listen ADDRESS:PORT on an address they can reach, \
                     and use that address after --join"
                );
            }
        }
        ClusterCommand::Settings {
            eviction,
            eviction_delay,
            resync_rate,
        } => {
            let answer = client.get("/cluster/settings")?;
            let change = eviction.is_some() || eviction_delay.is_some() || resync_rate.is_some();
            let answer = if change {
                // The API replaces the settings whole: change only what was given.
                let current: SettingsBody = answer.parse()?;
                let merged = merge_settings(current, eviction, eviction_delay, resync_rate);
                client.put("/cluster/settings", &merged)?
            } else {
                answer
            };
            if json {
                output::print_json(&answer);
            } else {
                if change {
                    println!("cluster settings changed");
                }
                output::settings(&answer.parse()?);
            }
        }
    }
    Ok(())
}

/// The current settings with the given changes.
fn merge_settings(
    current: SettingsBody,
    eviction: Option<Switch>,
    eviction_delay_secs: Option<u64>,
    resync_rate_bytes_per_sec: Option<u64>,
) -> SettingsBody {
    SettingsBody {
        eviction_enabled: eviction.map_or(current.eviction_enabled, |switch| switch == Switch::On),
        eviction_delay_secs: eviction_delay_secs.unwrap_or(current.eviction_delay_secs),
        resync_rate_bytes_per_sec: resync_rate_bytes_per_sec
            .unwrap_or(current.resync_rate_bytes_per_sec),
    }
}

/// The `--join` address of a join command when it is a loopback address.
fn loopback_join_address(command: &str) -> Option<&str> {
    let mut words = command.split_whitespace();
    words.find(|word| *word == "--join")?;
    let address = words.next()?;
    let host = address
        .rsplit_once(':')
        .map_or(address, |(host, _)| host)
        .trim_start_matches('[')
        .trim_end_matches(']');
    let loopback = host == "localhost"
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    loopback.then_some(address)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(enabled: bool, delay: u64) -> SettingsBody {
        SettingsBody {
            eviction_enabled: enabled,
            eviction_delay_secs: delay,
            resync_rate_bytes_per_sec: 256 << 20,
        }
    }

    #[test]
    fn only_the_given_settings_change() {
        let merged = merge_settings(settings(false, 3600), Some(Switch::On), None, None);
        assert!(merged.eviction_enabled);
        assert_eq!(merged.eviction_delay_secs, 3600);
        assert_eq!(merged.resync_rate_bytes_per_sec, 256 << 20);
        let merged = merge_settings(settings(true, 3600), None, Some(600), None);
        assert!(merged.eviction_enabled);
        assert_eq!(merged.eviction_delay_secs, 600);
        let merged = merge_settings(settings(true, 3600), Some(Switch::Off), Some(60), None);
        assert!(!merged.eviction_enabled);
        assert_eq!(merged.eviction_delay_secs, 60);
        let merged = merge_settings(settings(true, 3600), None, None, Some(8 << 20));
        assert!(merged.eviction_enabled);
        assert_eq!(merged.resync_rate_bytes_per_sec, 8 << 20);
    }

    #[test]
    fn loopback_join_addresses_are_noticed() {
        let command = |address: &str| format!("trireme node run --join {address} --token t");
        assert_eq!(
            loopback_join_address(&command("127.0.0.1:7450")),
            Some("127.0.0.1:7450")
        );
        assert_eq!(
            loopback_join_address(&command("[::1]:7450")),
            Some("[::1]:7450")
        );
        assert_eq!(loopback_join_address(&command("10.0.0.1:7450")), None);
        assert_eq!(loopback_join_address(&command("node1:7450")), None);
        assert_eq!(loopback_join_address("something else"), None);
    }
}
