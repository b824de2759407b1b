//! Printing answers: human tables, or the node's JSON unchanged.

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{Cell, CellAlignment, ContentArrangement, Table};
use std::collections::BTreeSet;
use trireme_node::api::model::{
    GroupBody, IoResponse, NodeEntry, NodeResponse, PoolResponse, PoolState, ReplicaResponse,
    ScanResponse, SettingsBody, StatusResponse, SyncResponse, VolumeCounts, VolumeResponse,
};
use trireme_types::format_size;

use crate::client::Answer;

pub fn print_json(answer: &Answer) {
    println!("{}", answer.json.as_deref().unwrap_or("{}"));
}

fn new_table(header: &[&str]) -> Table {
    let mut table = Table::new();
    table
        .load_preset(UTF8_FULL_CONDENSED)
        .set_content_arrangement(ContentArrangement::Dynamic)
        .set_header(header.iter().copied());
    table
}

fn right(text: impl Into<String>) -> Cell {
    Cell::new(text.into()).set_alignment(CellAlignment::Right)
}

fn size_or_dash(bytes: Option<u64>) -> String {
    bytes.map(format_size).unwrap_or_else(|| "-".to_string())
}

/// `34 GiB (170%)`: provisioned bytes against capacity, so over-commit shows.
fn provisioned(pool: &PoolResponse) -> String {
    match (pool.provisioned_bytes, pool.capacity_bytes) {
        (Some(provisioned), Some(capacity)) => {
            format!(
                "{} ({})",
                format_size(provisioned),
                percent(provisioned, capacity)
            )
        }
        (provisioned, _) => size_or_dash(provisioned),
    }
}

fn percent(part: u64, whole: u64) -> String {
    if whole == 0 {
        return "-".to_string();
    }
    format!("{}%", u128::from(part) * 100 / u128::from(whole))
}

fn state(pool: &PoolResponse) -> &'static str {
    match pool.state {
        PoolState::Online => "online",
        PoolState::Offline => "offline",
    }
}

/// The pools of one node: `node` names it, as a cluster has a `default`
/// pool on every node.
pub fn pools_table(pools: &[PoolResponse], node: &str) {
    if pools.is_empty() {
        println!(
            "node '{node}' has no pools: create one with `trireme pool create NAME --path PATH --size SIZE`"
        );
        return;
    }
    println!("pools of node '{node}' (another node's: `--api ADDRESS`; every node's space: `trireme node list`)");
    let mut table = new_table(&[
        "NAME",
        "STATE",
        "CLASS",
        "CAPACITY",
        "ALLOCATED",
        "FREE",
        "PROVISIONED",
        "ON HOST",
        "VOLUMES",
        "DEVICE",
    ]);
    for pool in pools {
        table.add_row(vec![
            Cell::new(&pool.name),
            Cell::new(state(pool)),
            Cell::new(&pool.class),
            right(size_or_dash(pool.capacity_bytes)),
            right(size_or_dash(pool.allocated_bytes)),
            right(size_or_dash(pool.free_bytes)),
            right(provisioned(pool)),
            right(size_or_dash(pool.host_bytes)),
            right(
                pool.volume_count
                    .map(|count| count.to_string())
                    .unwrap_or_else(|| "-".into()),
            ),
            Cell::new(&pool.device_path),
        ]);
    }
    println!("{table}");
    for pool in pools.iter().filter(|pool| pool.state == PoolState::Offline) {
        println!(
            "pool '{}' is offline: {}",
            pool.name,
            pool.error.as_deref().unwrap_or("unknown reason")
        );
    }
}

pub fn pool_detail(pool: &PoolResponse) {
    let mut table = new_table(&["POOL", &pool.name]);
    let rows: Vec<(&str, String)> = vec![
        ("state", state(pool).to_string()),
        ("error", pool.error.clone().unwrap_or_else(|| "-".into())),
        ("id", pool.id.to_string()),
        ("class", pool.class.clone()),
        ("device", pool.device_path.clone()),
        ("metadata", pool.metadata_path.clone()),
        ("capacity", size_or_dash(pool.capacity_bytes)),
        ("allocated", size_or_dash(pool.allocated_bytes)),
        ("free", size_or_dash(pool.free_bytes)),
        ("provisioned", provisioned(pool)),
        ("on host", size_or_dash(pool.host_bytes)),
        ("kept for overwrites", size_or_dash(pool.warm_bytes)),
        (
            "volumes",
            pool.volume_count
                .map(|count| count.to_string())
                .unwrap_or_else(|| "-".into()),
        ),
        ("journal", size_or_dash(pool.journal_bytes)),
        ("chunk size", size_or_dash(pool.chunk_bytes)),
        (
            "checksum errors",
            pool.checksum_errors
                .map(|count| count.to_string())
                .unwrap_or_else(|| "-".into()),
        ),
    ];
    for (key, value) in rows {
        table.add_row(vec![key.to_string(), value]);
    }
    println!("{table}");
}

/// The volumes of the cluster, then the space of the pools of `node`, the
/// node that answered.
pub fn volumes_table(
    volumes: &[VolumeResponse],
    pools: &[PoolResponse],
    node: &str,
    not_online: &NotOnline,
) {
    if volumes.is_empty() {
        println!("no volumes: create one with `trireme volume create NAME --size 32G`");
        return;
    }
    let mut table = new_table(&[
        "NAME",
        "POOL",
        "SIZE",
        "ALLOCATED",
        "GROUP",
        "STATE",
        "ATTACHED",
        "REPLICAS",
        "NBD",
    ]);
    for volume in volumes {
        table.add_row(vec![
            Cell::new(&volume.name),
            Cell::new(or_dash(&volume.pool)),
            right(format_size(volume.size_bytes)),
            right(format_size(volume.allocated_bytes)),
            Cell::new(&volume.group),
            Cell::new(volume.state.as_str()),
            Cell::new(attached(volume)),
            Cell::new(replicas_column(&volume.replicas, not_online)),
            Cell::new(volume.nbd_url.as_deref().unwrap_or("-")),
        ]);
    }
    println!("{table}");
    if let Some(legend) = replicas_legend(volumes.iter().flat_map(|v| &v.replicas), not_online) {
        println!("{legend}");
    }
    for pool in pools.iter().filter(|pool| pool.state == PoolState::Online) {
        let (Some(provisioned_bytes), Some(capacity_bytes)) =
            (pool.provisioned_bytes, pool.capacity_bytes)
        else {
            continue;
        };
        let over = if provisioned_bytes > capacity_bytes {
            ", over-committed: writes fail when the pool fills"
        } else {
            ""
        };
        println!(
            "pool '{}' on {node}: provisioned {} of {} ({}), {} allocated{over}",
            pool.name,
            format_size(provisioned_bytes),
            format_size(capacity_bytes),
            percent(provisioned_bytes, capacity_bytes),
            size_or_dash(pool.allocated_bytes),
        );
    }
}

/// The primaries of a volume, `pve1` or `pve1,pve2`, or `-`.
fn attached(volume: &VolumeResponse) -> String {
    if volume.primaries.is_empty() {
        "-".to_string()
    } else {
        volume.primaries.join(",")
    }
}

/// `3m20s`, `45s`, `2h5m`: a time left.
pub fn format_eta(seconds: u64) -> String {
    match seconds {
        0..60 => format!("{seconds}s"),
        60..600 => format!("{}m{}s", seconds / 60, seconds % 60),
        600..3600 => format!("{}m", seconds / 60),
        _ => format!("{}h{}m", seconds / 3600, seconds % 3600 / 60),
    }
}

/// `12 MiB/s, 3m20s left`: the rate and time left of a resync, or
/// `stalled: no progress for 2m5s` when it is not running.
pub fn sync_rate(sync: &SyncResponse) -> String {
    if let Some(seconds) = sync.stalled_secs {
        return format!("stalled: no progress for {}", format_eta(seconds));
    }
    let left = match sync.eta_secs {
        Some(seconds) => format!("{} left", format_eta(seconds)),
        None => "time left unknown".to_string(),
    };
    format!("{}/s, {left}", format_size(sync.rate_bytes_per_sec))
}

/// A replica's state as `volume show` prints it: the API's state, with the
/// resync's rate and time left, e.g. `syncing 42% (12 MiB/s, 3m20s left)`.
pub fn replica_state_text(replica: &ReplicaResponse) -> String {
    match &replica.sync {
        Some(sync) => format!("{} ({})", replica.state, sync_rate(sync)),
        None => replica.state.clone(),
    }
}

pub fn volume_detail(volume: &VolumeResponse, not_online: &NotOnline) {
    let mut table = new_table(&["VOLUME", &volume.name]);
    let rows: Vec<(&str, String)> = vec![
        ("id", volume.id.to_string()),
        ("pool", volume.pool.clone()),
        (
            "size",
            format!(
                "{} ({} bytes)",
                format_size(volume.size_bytes),
                volume.size_bytes
            ),
        ),
        ("allocated", format_size(volume.allocated_bytes)),
        (
            "created (UTC)",
            format_unix_time(volume.created_unix_seconds),
        ),
        ("checksum errors", volume.checksum_errors.to_string()),
        ("nbd", volume.nbd_url.clone().unwrap_or_else(|| "-".into())),
        ("group", volume.group.clone()),
        ("state", volume.state.to_string()),
        ("generation", volume.generation.to_string()),
        ("attached on", attached(volume)),
        ("replicas", replicas_column(&volume.replicas, not_online)),
    ];
    for (key, value) in rows {
        table.add_row(vec![key.to_string(), value]);
    }
    println!("{table}");
    replicas_table(&volume.replicas, not_online);
}

/// One line per replica: node, kind, pool, state (of its data), what its
/// node reported about its storage, allocation and why it failed.
fn replicas_table(replicas: &[ReplicaResponse], not_online: &NotOnline) {
    if replicas.is_empty() {
        println!("no replicas");
        return;
    }
    let mut table = new_table(&[
        "NODE",
        "KIND",
        "POOL",
        "STATE",
        "STORAGE",
        "ALLOCATED",
        "MESSAGE",
    ]);
    for replica in sorted_replicas(replicas) {
        // Only diskful replicas are made and reported by their node.
        let diskful = replica.kind == "diskful";
        table.add_row(vec![
            Cell::new(&replica.node),
            Cell::new(&replica.kind),
            Cell::new(replica.pool.as_deref().unwrap_or("-")),
            Cell::new(replica_state_text(replica)),
            Cell::new(match (diskful, not_online.contains(&replica.node)) {
                (true, true) => format!("{} (node offline)", replica.observed),
                (true, false) => replica.observed.clone(),
                (false, true) => "node offline".to_string(),
                (false, false) => "-".to_string(),
            }),
            right(if diskful {
                format_size(replica.allocated_bytes)
            } else {
                "-".to_string()
            }),
            Cell::new(replica.message.as_deref().unwrap_or("")),
        ]);
    }
    println!("{table}");
}

/// Diskful replicas first, then the tiebreaker, then diskless members;
/// the node's order otherwise.
fn sorted_replicas(replicas: &[ReplicaResponse]) -> Vec<&ReplicaResponse> {
    let rank = |replica: &ReplicaResponse| match replica.kind.as_str() {
        "diskful" => 0,
        "tiebreaker" => 1,
        _ => 2,
    };
    let mut sorted: Vec<&ReplicaResponse> = replicas.iter().collect();
    sorted.sort_by_key(|replica| rank(replica));
    sorted
}

/// The nodes that are not online (offline or evicted), by name.
pub type NotOnline = BTreeSet<String>;

/// How a replica shows in [`replicas_column`]: its node's name, `!` when
/// it failed, `*` when its node has not reported it yet (diskful replicas
/// only: the others hold no data), then in parentheses `outdated` or
/// `syncing 42%` for a diskful replica that is not up to date, `tb` for the
/// tiebreaker, `dl` for a diskless member and `off` when its node is not
/// online. E.g. `n1`, `n2*`, `n3!(off)`, `n4(tb)`, `n5(dl,off)`,
/// `n6(syncing 42%)`.
fn replica_label(replica: &ReplicaResponse, not_online: &NotOnline) -> String {
    let mut label = replica.node.clone();
    let mut notes = Vec::new();
    match (replica.kind.as_str(), replica.observed.as_str()) {
        ("diskful", "ready") => {}
        ("diskful", "failed") => label.push('!'),
        ("diskful", _) => label.push('*'),
        ("tiebreaker", _) => notes.push("tb"),
        ("diskless", _) => notes.push("dl"),
        (other, _) => notes.push(other),
    }
    let behind = match &replica.sync {
        Some(sync) => format!("syncing {}%", sync.percent),
        None => "outdated".to_string(),
    };
    if replica.kind == "diskful" && !replica.in_sync {
        notes.insert(0, &behind);
    }
    if not_online.contains(&replica.node) {
        notes.push("off");
    }
    if !notes.is_empty() {
        label.push_str(&format!("({})", notes.join(",")));
    }
    label
}

/// `n1,n2*,n3!,n4(tb)`: the nodes holding a volume, diskful replicas first.
/// See [`replica_label`] for the markers.
pub fn replicas_column(replicas: &[ReplicaResponse], not_online: &NotOnline) -> String {
    if replicas.is_empty() {
        return "-".to_string();
    }
    sorted_replicas(replicas)
        .into_iter()
        .map(|replica| replica_label(replica, not_online))
        .collect::<Vec<_>>()
        .join(",")
}

/// What the markers of [`replicas_column`] mean, when any is shown.
fn replicas_legend<'a>(
    replicas: impl Iterator<Item = &'a ReplicaResponse>,
    not_online: &NotOnline,
) -> Option<String> {
    let (mut pending, mut failed, mut tiebreaker, mut diskless, mut off) =
        (false, false, false, false, false);
    for replica in replicas {
        match (replica.kind.as_str(), replica.observed.as_str()) {
            ("diskful", "ready") => {}
            ("diskful", "failed") => failed = true,
            ("diskful", _) => pending = true,
            ("tiebreaker", _) => tiebreaker = true,
            _ => diskless = true,
        }
        off |= not_online.contains(&replica.node);
    }
    let parts: Vec<&str> = [
        (pending, "* not reported by its node yet"),
        (failed, "! failed (`trireme volume show NAME` says why)"),
        (tiebreaker, "tb: tiebreaker, votes but holds no data"),
        (diskless, "dl: diskless member"),
        (off, "off: its node is offline"),
    ]
    .into_iter()
    .filter_map(|(shown, text)| shown.then_some(text))
    .collect();
    (!parts.is_empty()).then(|| format!("replicas: {}", parts.join("; ")))
}

fn or_dash(text: &str) -> &str {
    if text.is_empty() {
        "-"
    } else {
        text
    }
}

/// `5s`, `3m`, `2h`, `4d`: how long, in the largest whole unit.
pub fn format_age(seconds: u64) -> String {
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3600 => format!("{}m", seconds / 60),
        3600..86400 => format!("{}h", seconds / 3600),
        _ => format!("{}d", seconds / 86400),
    }
}

/// `2026-11-24 07:05:09` (UTC).
pub fn format_unix_time(unix_seconds: u64) -> String {
    trireme_types::time::UtcTime::from_unix(unix_seconds).display()
}

pub fn format_duration(seconds: u64) -> String {
    if seconds == 0 {
        return "0s".to_string();
    }
    let mut text = String::new();
    let mut left = seconds;
    for (unit, size) in [("d", 86400), ("h", 3600), ("m", 60), ("s", 1)] {
        if left >= size {
            text.push_str(&format!("{}{unit}", left / size));
            left %= size;
        }
    }
    text
}

/// `trireme status`: one screen, like `ceph -s`.
pub fn status_screen(status: &StatusResponse) {
    let list = |names: &[String]| {
        if names.is_empty() {
            "-".to_string()
        } else {
            names.join(", ")
        }
    };
    let nodes = &status.nodes;
    let volumes = &status.volumes;
    let by_state = volume_counts_text(volumes);
    let eviction = if status.eviction_enabled {
        format!(
            "on: nodes offline for {} are evicted",
            format_duration(status.eviction_delay_secs)
        )
    } else {
        format!(
            "off (delay {} when switched on)",
            format_duration(status.eviction_delay_secs)
        )
    };
    println!("cluster:");
    println!("  id:         {}", status.cluster_id);
    println!("  health:     {}", status.health);
    println!("  this node:  {}", status.this_node);
    println!();
    println!("control plane:");
    println!(
        "  leader:     {}",
        status.leader.as_deref().unwrap_or("none (no quorum)")
    );
    println!("  voters:     {}", list(&status.voters));
    println!("  learners:   {}", list(&status.learners));
    println!("  eviction:   {eviction}");
    println!();
    println!(
        "nodes:        {}/{} online ({} offline, {} evicted)",
        nodes.online, nodes.total, nodes.offline, nodes.evicted
    );
    println!(
        "pools:        {}, {} capacity, {} free, {} provisioned ({})",
        status.pools,
        format_size(status.capacity_bytes),
        format_size(status.free_bytes),
        format_size(status.provisioned_bytes),
        percent(status.provisioned_bytes, status.capacity_bytes),
    );
    println!("volumes:      {by_state}");
    if !status.warnings.is_empty() {
        println!();
    }
    for warning in &status.warnings {
        println!("warning: {warning}");
    }
}

/// Volumes listed under `busiest:` in `trireme status`.
const BUSIEST_SHOWN: usize = 5;

/// The `io:` section of `trireme status`: rates over the last ~10 s.
pub fn io_screen(io: &IoResponse) {
    let rate = |bytes: f64| format!("{}/s", format_size(bytes.round() as u64));
    println!();
    println!("io:");
    println!(
        "  client:     {} rd, {} wr, {:.0} op/s rd, {:.0} op/s wr",
        rate(io.read_bytes_per_sec),
        rate(io.write_bytes_per_sec),
        io.read_iops,
        io.write_iops
    );
    let busy: Vec<_> = io
        .volumes
        .iter()
        .filter(|volume| volume.read_iops + volume.write_iops > 0.0)
        .take(BUSIEST_SHOWN)
        .collect();
    for (index, volume) in busy.iter().enumerate() {
        println!(
            "  {}{} on {}: {} rd, {} wr, {:.0} op/s rd, {:.0} op/s wr",
            if index == 0 {
                "busiest:    "
            } else {
                "            "
            },
            volume.volume,
            volume.node,
            rate(volume.read_bytes_per_sec),
            rate(volume.write_bytes_per_sec),
            volume.read_iops,
            volume.write_iops
        );
    }
    if !io.missing_nodes.is_empty() {
        println!(
            "  missing:    {} (did not answer: their volumes are not counted)",
            io.missing_nodes.join(", ")
        );
    }
}

/// `7 (1 no-quorum, 2 degraded, 4 ready)`: every state with volumes in
/// it, worst first.
fn volume_counts_text(volumes: &VolumeCounts) -> String {
    let by_state: Vec<String> = volumes
        .by_state()
        .into_iter()
        .filter(|(count, _)| *count > 0)
        .map(|(count, state)| format!("{count} {state}"))
        .collect();
    if by_state.is_empty() {
        volumes.total.to_string()
    } else {
        format!("{} ({})", volumes.total, by_state.join(", "))
    }
}

pub fn nodes_table(nodes: &[NodeEntry]) {
    if nodes.is_empty() {
        println!("no nodes: the cluster has not received its state yet");
        return;
    }
    let mut table = new_table(&[
        "NAME",
        "ID",
        "STATE",
        "FOR",
        "ROLE",
        "ADDRESS",
        "LABELS",
        "POOLS",
        "FREE/CAPACITY",
    ]);
    for node in nodes {
        let labels: Vec<String> = node
            .labels
            .iter()
            .map(|(key, value)| format!("{key}={value}"))
            .collect();
        let space = if node.pools == 0 {
            "-".to_string()
        } else {
            format!(
                "{} / {}",
                format_size(node.free_bytes),
                format_size(node.capacity_bytes)
            )
        };
        table.add_row(vec![
            Cell::new(&node.name),
            right(node.id.to_string()),
            Cell::new(&node.state),
            right(format_age(node.state_seconds)),
            Cell::new(&node.role),
            Cell::new(&node.api_address),
            Cell::new(if labels.is_empty() {
                "-".to_string()
            } else {
                labels.join(",")
            }),
            right(node.pools.to_string()),
            right(space),
        ]);
    }
    println!("{table}");
}

pub fn node_info(node: &NodeResponse) {
    println!("trireme node {}", node.version);
    println!("  cluster id:     {}", node.cluster_id);
    println!("  node:           {} (id {})", node.node_name, node.node_id);
    println!("  data directory: {}", node.data_dir);
    println!("  REST API:       http://{}", node.api_address);
    println!(
        "  NBD (TCP):      {}",
        node.nbd_tcp_address.as_deref().unwrap_or("-")
    );
    println!(
        "  NBD (unix):     {}",
        node.nbd_unix_socket.as_deref().unwrap_or("-")
    );
}

pub fn groups_table(groups: &[GroupBody]) {
    if groups.is_empty() {
        println!("no resource groups: create one with `trireme group create NAME --place-count 3`");
        return;
    }
    let mut table = new_table(&[
        "NAME",
        "PLACE-COUNT",
        "MIN-PLACE-COUNT",
        "POOLS",
        "CLASS",
        "REPLICAS-ON-DIFFERENT",
        "DISKLESS-ON-REMAINING",
        "ON-NO-QUORUM",
    ]);
    for group in groups {
        let joined = |items: &[String], none: &str| {
            if items.is_empty() {
                none.to_string()
            } else {
                items.join(",")
            }
        };
        table.add_row(vec![
            Cell::new(&group.name),
            right(group.place_count.to_string()),
            right(
                group
                    .min_place_count
                    .unwrap_or(group.place_count)
                    .to_string(),
            ),
            Cell::new(joined(&group.pools, "any")),
            Cell::new(group.class.as_deref().unwrap_or("any")),
            Cell::new(joined(&group.replicas_on_different, "-")),
            Cell::new(if group.diskless_on_remaining {
                "yes"
            } else {
                "no"
            }),
            Cell::new(group.on_no_quorum.as_deref().unwrap_or("io-error")),
        ]);
    }
    println!("{table}");
}

pub fn settings(settings: &SettingsBody) {
    println!(
        "eviction:       {}",
        if settings.eviction_enabled {
            "on"
        } else {
            "off"
        }
    );
    println!(
        "eviction delay: {} ({} s)",
        format_duration(settings.eviction_delay_secs),
        settings.eviction_delay_secs
    );
    println!(
        "resync rate:    {}/s per volume",
        format_size(settings.resync_rate_bytes_per_sec)
    );
    if settings.eviction_enabled {
        println!(
            "a node offline for longer than {} is evicted: its replicas are placed on other nodes",
            format_duration(settings.eviction_delay_secs)
        );
    } else {
        println!("offline nodes keep their replicas until they return or are removed (`trireme node remove`)");
    }
}

pub fn scan_report(pool: &str, report: &ScanResponse) {
    let verdict = if report.clean {
        "clean"
    } else {
        "PROBLEMS FOUND"
    };
    println!(
        "pool '{pool}': {verdict}; {} blocks checked, {} chunks counted, {} accounted",
        report.blocks_checked, report.allocated_chunks_counted, report.allocated_chunks_accounted
    );
    for mismatch in &report.checksum_mismatches {
        println!("checksum mismatch: {mismatch}");
    }
    for problem in &report.problems {
        println!("problem: {problem}");
    }
}

/// The report of `volume verify`.
pub fn verify_report(report: &trireme_node::api::model::VerifyResponse) {
    let what = match report.state.as_str() {
        "running" => format!("running, {}% done", report.percent),
        "done" => format!(
            "done in {}",
            format_duration(report.elapsed_ms.div_ceil(1000))
        ),
        other => format!(
            "{other}: {}",
            report.reason.as_deref().unwrap_or("no reason given")
        ),
    };
    println!(
        "verify of volume '{}' on {}: {what}",
        report.volume, report.primary
    );
    println!(
        "  compared {} of {} on {}",
        format_size(report.checked_bytes),
        format_size(report.total_bytes),
        report.replicas.join(", ")
    );
    if report.skipped_bytes > 0 {
        println!(
            "  not compared: {} (fewer than two up-to-date replicas answered)",
            format_size(report.skipped_bytes)
        );
    }
    if report.differing_blocks == 0 {
        println!("  every block is identical on every replica");
        return;
    }
    println!("  blocks that differed: {}", report.differing_blocks);
    for repaired in &report.repaired {
        println!(
            "  rewritten on {}: {} blocks ({})",
            repaired.node,
            repaired.blocks,
            format_size(repaired.blocks * 4096)
        );
    }
    if report.no_majority_blocks > 0 {
        println!(
            "  decided without a majority (two copies disagreed; the primary's was kept): {} blocks",
            report.no_majority_blocks
        );
    }
    if report.unrecoverable_blocks > 0 {
        println!(
            "  unreadable on every replica (lost): {} blocks",
            report.unrecoverable_blocks
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(node: &str, kind: &str, observed: &str) -> ReplicaResponse {
        ReplicaResponse {
            node: node.to_string(),
            kind: kind.to_string(),
            pool: (kind == "diskful").then(|| "default".to_string()),
            state: if kind == "diskful" {
                "up-to-date"
            } else {
                kind
            }
            .to_string(),
            observed: observed.to_string(),
            message: (observed == "failed").then(|| "No space left on device".to_string()),
            allocated_bytes: 0,
            in_sync: kind == "diskful",
            sync: None,
            resync_blocked: None,
        }
    }

    #[test]
    fn replicas_not_up_to_date_say_how_far_they_are() {
        let all_online = NotOnline::new();
        let mut outdated = replica("n2", "diskful", "ready");
        outdated.in_sync = false;
        outdated.state = "outdated".into();
        let mut syncing = replica("n3", "diskful", "pending");
        syncing.in_sync = false;
        syncing.state = "syncing 42%".into();
        syncing.sync = Some(SyncResponse {
            done_bytes: 42,
            total_bytes: 100,
            rate_bytes_per_sec: 12 << 20,
            eta_secs: Some(200),
            percent: 42,
            stalled_secs: None,
        });
        let replicas = [replica("n1", "diskful", "ready"), outdated, syncing];
        assert_eq!(
            replicas_column(&replicas, &all_online),
            "n1,n2(outdated),n3*(syncing 42%)"
        );
        assert_eq!(
            replica_state_text(&replicas[2]),
            "syncing 42% (12 MiB/s, 3m20s left)"
        );
        assert_eq!(replica_state_text(&replicas[1]), "outdated");
        let mut stalled = replicas[2].clone();
        if let Some(sync) = stalled.sync.as_mut() {
            (sync.stalled_secs, sync.rate_bytes_per_sec, sync.eta_secs) = (Some(125), 0, None);
        }
        assert_eq!(
            replica_state_text(&stalled),
            "syncing 42% (stalled: no progress for 2m5s)"
        );
    }

    #[test]
    fn times_left_are_short() {
        assert_eq!(format_eta(0), "0s");
        assert_eq!(format_eta(59), "59s");
        assert_eq!(format_eta(200), "3m20s");
        assert_eq!(format_eta(1800), "30m");
        assert_eq!(format_eta(7500), "2h5m");
    }

    #[test]
    fn the_replicas_column_marks_what_is_not_ready() {
        let all_online = NotOnline::new();
        assert_eq!(replicas_column(&[], &all_online), "-");
        let replicas = [
            replica("n4", "tiebreaker", "pending"),
            replica("n1", "diskful", "ready"),
            replica("n2", "diskful", "pending"),
            replica("n5", "diskless", "pending"),
            replica("n3", "diskful", "failed"),
        ];
        assert_eq!(
            replicas_column(&replicas, &all_online),
            "n1,n2*,n3!,n4(tb),n5(dl)"
        );
        let legend = replicas_legend(replicas.iter(), &all_online).unwrap();
        for marker in ["*", "!", "tb:", "dl:"] {
            assert!(legend.contains(marker), "{legend}");
        }
        assert!(!legend.contains("off"), "{legend}");
        let ready = [
            replica("n1", "diskful", "ready"),
            replica("n2", "diskful", "ready"),
        ];
        assert_eq!(replicas_column(&ready, &all_online), "n1,n2");
        assert_eq!(replicas_legend(ready.iter(), &all_online), None);
    }

    #[test]
    fn replicas_on_offline_nodes_say_so() {
        let not_online: NotOnline = ["n2".to_string(), "n4".to_string()].into();
        let replicas = [
            replica("n1", "diskful", "ready"),
            replica("n2", "diskful", "ready"),
            replica("n3", "diskful", "pending"),
            replica("n4", "tiebreaker", "pending"),
        ];
        assert_eq!(
            replicas_column(&replicas, &not_online),
            "n1,n2(off),n3*,n4(tb,off)"
        );
        let legend = replicas_legend(replicas.iter(), &not_online).unwrap();
        assert!(legend.contains("off: its node is offline"), "{legend}");
    }

    #[test]
    fn volume_counts_name_every_state_worst_first() {
        let mut volumes = VolumeCounts::default();
        assert_eq!(volume_counts_text(&volumes), "0");
        use trireme_node::api::model::VolumeState;
        for state in [
            VolumeState::Ready,
            VolumeState::Ready,
            VolumeState::Degraded,
            VolumeState::Syncing,
            VolumeState::NoQuorum,
        ] {
            volumes.count(state);
        }
        assert_eq!(
            volume_counts_text(&volumes),
            "5 (1 no-quorum, 1 degraded, 1 syncing, 2 ready)"
        );
    }

    #[test]
    fn ages_use_the_largest_whole_unit() {
        assert_eq!(format_age(0), "0s");
        assert_eq!(format_age(5), "5s");
        assert_eq!(format_age(59), "59s");
        assert_eq!(format_age(60), "1m");
        assert_eq!(format_age(3 * 60 + 59), "3m");
        assert_eq!(format_age(2 * 3600 + 5), "2h");
        assert_eq!(format_age(86400 * 4 + 7), "4d");
    }

    #[test]
    fn durations_print_as_they_are_typed() {
        assert_eq!(format_duration(0), "0s");
        assert_eq!(format_duration(45), "45s");
        assert_eq!(format_duration(3600), "1h");
        assert_eq!(format_duration(5400), "1h30m");
        assert_eq!(format_duration(86400 + 61), "1d1m1s");
        for seconds in [1, 59, 60, 61, 3599, 3600, 5400, 86399, 86400, 1_000_000] {
            let text = format_duration(seconds);
            assert_eq!(crate::args::parse_duration(&text), Ok(seconds), "{text}");
        }
    }
}
