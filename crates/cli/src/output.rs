//! Printing answers: human tables, or the node's JSON unchanged.

use comfy_table::presets::UTF8_FULL_CONDENSED;
use comfy_table::{Cell, CellAlignment, ContentArrangement, Table};
use trireme_node::api::model::{PoolResponse, PoolState, ScanResponse, VolumeResponse};
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

pub fn pools_table(pools: &[PoolResponse]) {
    if pools.is_empty() {
        println!("no pools: create one with `trireme pool create NAME --path PATH --size SIZE`");
        return;
    }
    let mut table = new_table(&[
        "NAME",
        "STATE",
        "CLASS",
        "CAPACITY",
        "ALLOCATED",
        "FREE",
        "PROVISIONED",
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

pub fn volumes_table(volumes: &[VolumeResponse], pools: &[PoolResponse]) {
    if volumes.is_empty() {
        println!("no volumes: create one with `trireme volume create NAME --size 32G`");
        return;
    }
    let mut table = new_table(&["NAME", "POOL", "SIZE", "ALLOCATED", "NBD"]);
    for volume in volumes {
        table.add_row(vec![
            Cell::new(&volume.name),
            Cell::new(&volume.pool),
            right(format_size(volume.size_bytes)),
            right(format_size(volume.allocated_bytes)),
            Cell::new(volume.nbd_url.as_deref().unwrap_or("-")),
        ]);
    }
    println!("{table}");
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
            "pool '{}': provisioned {} of {} ({}), {} allocated{over}",
            pool.name,
            format_size(provisioned_bytes),
            format_size(capacity_bytes),
            percent(provisioned_bytes, capacity_bytes),
            size_or_dash(pool.allocated_bytes),
        );
    }
}

pub fn volume_detail(volume: &VolumeResponse) {
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
        ("created (unix s)", volume.created_unix_seconds.to_string()),
        ("checksum errors", volume.checksum_errors.to_string()),
        ("nbd", volume.nbd_url.clone().unwrap_or_else(|| "-".into())),
    ];
    for (key, value) in rows {
        table.add_row(vec![key.to_string(), value]);
    }
    println!("{table}");
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
