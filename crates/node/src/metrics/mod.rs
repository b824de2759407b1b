//! Monitoring: `GET /metrics` (Prometheus text format, from
//! prometheus-client) and the I/O rates of `GET /api/v1/io`.
//!
//! - `encode`: writing gauge, counter and histogram families.
//! - `collect`: gathers every family at scrape time from the node's parts.
//! - `process`: the node process's CPU, memory and files from /proc.
//! - `rates`: per-volume I/O rates over the last ~10 s.
//! - `history`: the last hour of I/O at 10 s, per volume and for the node.
//!
//! The hot path only touches the NBD edge's atomics
//! ([`trireme_export::VolumeIo`]); everything else is read when scraped.

mod collect;
mod encode;
pub mod history;
pub mod process;
pub mod rates;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use trireme_export::{IoKind, VolumeIo, VolumeIoSnapshot};

pub use collect::Sources;
pub use rates::{Rate, Rates, Totals};

/// Volumes whose requests are counted at once. Export names reach this only
/// after a successful handshake (real volumes), so it is never reached in
/// practice; it keeps the label set bounded all the same.
pub const MAX_COUNTED_VOLUMES: usize = 4096;

/// The Prometheus text format (0.0.4), which every Prometheus version and
/// `promtool check metrics` read (see [`render`]).
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The edge counters of the volumes served here, and their rates.
#[derive(Default)]
pub struct Metrics {
    volumes: Mutex<BTreeMap<String, Arc<VolumeIo>>>,
    pub rates: Rates,
    pub history: history::History,
}

impl Metrics {
    pub fn new() -> Arc<Self> {
        Arc::new(Metrics::default())
    }

    /// Where requests to `volume` are counted (once per NBD connection).
    pub fn volume_io(&self, volume: &str) -> Option<Arc<VolumeIo>> {
        let mut volumes = self.volumes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(io) = volumes.get(volume) {
            return Some(io.clone());
        }
        if volumes.len() >= MAX_COUNTED_VOLUMES {
            tracing::warn!(
                volume,
                limit = MAX_COUNTED_VOLUMES,
                "not counting this volume's I/O: too many volumes counted"
            );
            return None;
        }
        let io = VolumeIo::new();
        volumes.insert(volume.to_string(), io.clone());
        Some(io)
    }

    /// Stops counting volumes that no longer exist (their series go).
    pub fn retain(&self, exists: impl Fn(&str) -> bool) {
        let mut volumes = self.volumes.lock().unwrap_or_else(|p| p.into_inner());
        volumes.retain(|volume, _| exists(volume));
    }

    pub fn volume_snapshots(&self) -> Vec<(String, VolumeIoSnapshot)> {
        let volumes: Vec<(String, Arc<VolumeIo>)> = {
            let volumes = self.volumes.lock().unwrap_or_else(|p| p.into_inner());
            volumes
                .iter()
                .map(|(name, io)| (name.clone(), io.clone()))
                .collect()
        };
        volumes
            .into_iter()
            .map(|(name, io)| (name, io.snapshot()))
            .collect()
    }

    /// Takes one sample of every volume's counters for the rates.
    pub fn sample(&self, at: Instant) {
        let totals: BTreeMap<String, Totals> = self
            .volume_snapshots()
            .into_iter()
            .map(|(name, snapshot)| {
                let kind = |kind| snapshot.kind(kind);
                let totals = Totals {
                    read_ops: kind(IoKind::Read).operations,
                    write_ops: kind(IoKind::Write).operations
                        + kind(IoKind::WriteZeroes).operations
                        + kind(IoKind::Trim).operations,
                    read_bytes: kind(IoKind::Read).bytes,
                    write_bytes: kind(IoKind::Write).bytes,
                };
                (name, totals)
            })
            .collect();
        self.history.record(std::time::SystemTime::now(), &totals);
        self.rates.record(at, totals);
    }
}

/// Renders every metric family in the Prometheus text format.
pub fn render(sources: Sources) -> Result<String, std::fmt::Error> {
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(sources));
    let mut text = String::with_capacity(64 * 1024);
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    Ok(openmetrics_to_prometheus_text(&text))
}

/// prometheus-client writes OpenMetrics, where a counter family `x` has
/// samples `x_total`. The Prometheus text format (and promtool's linter)
/// wants the family named like its samples, `x_total`, and has no `# EOF`
/// or `# UNIT`: rename counter families, drop those lines.
fn openmetrics_to_prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::BTreeSet<&str> = openmetrics
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut text = String::with_capacity(openmetrics.len() + 16 * counters.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|prefix| {
            let rest = line.strip_prefix(prefix)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{prefix}{name}_total {tail}"))
        });
        text.push_str(renamed.as_deref().unwrap_or(line));
        text.push('\n');
    }
    text
}

/// Samples the counters every [`rates::SAMPLE_EVERY`] and forgets volumes
/// the cluster deleted, until `stop`.
pub async fn run_sampler(
    metrics: Arc<Metrics>,
    cluster: Arc<crate::cluster::Cluster>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut ticks = tokio::time::interval(rates::SAMPLE_EVERY);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticks.tick() => {}
            _ = stop.wait_for(|stop| *stop) => return,
        }
        {
            let state = cluster.state.read();
            metrics.retain(|volume| {
                trireme_types::VolumeName::new(volume)
                    .is_ok_and(|name| state.volumes.contains_key(&name))
            });
        }
        metrics.sample(Instant::now());
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn counter_families_take_their_samples_name() {
        let openmetrics = "# HELP a_ops Operations.\n# TYPE a_ops counter\na_ops_total{op=\"r\"} 2.0\n# HELP b_bytes Size.\n# TYPE b_bytes gauge\nb_bytes 1\n# EOF\n";
        assert_eq!(
            super::openmetrics_to_prometheus_text(openmetrics),
            "# HELP a_ops_total Operations.\n# TYPE a_ops_total counter\na_ops_total{op=\"r\"} 2.0\n# HELP b_bytes Size.\n# TYPE b_bytes gauge\nb_bytes 1\n"
        );
    }
}
