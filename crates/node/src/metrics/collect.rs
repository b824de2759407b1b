//! Gathers everything `/metrics` shows, at scrape time, from the parts of
//! the node that own it: the NBD edge's counters, the replication engines,
//! the pools, the control plane's state and Raft, and /proc.
//!
//! Label values come from bounded sets only: volume, node and pool names
//! (as many as the cluster has), and fixed words (`op`, `state`). See
//! docs/metrics.md for every family.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use std::sync::Arc;
use trireme_control::{NodeState, VolumeHealth};
use trireme_export::io_stats::LATENCY_BUCKET_BOUNDS_NANOS;
use trireme_export::IoKind;
use trireme_replication::ACK_LATENCY_BOUNDS_MS;

use super::encode::{counters, gauges, histograms, HistogramSample, Labels, Result};
use super::{process, Metrics};
use crate::cluster::Cluster;
use crate::replicated::Replication;
use crate::Node;

/// Link states a replica can be in, as the primary sees it: each link has
/// one series per state (1 for its state, 0 for the others).
const LINK_STATES: [&str; 5] = ["up-to-date", "outdating", "outdated", "syncing", "joining"];
const NODE_STATES: [NodeState; 3] = [NodeState::Online, NodeState::Offline, NodeState::Evicted];
const VOLUME_STATES: [VolumeHealth; 7] = [
    VolumeHealth::Ready,
    VolumeHealth::Degraded,
    VolumeHealth::Syncing,
    VolumeHealth::Creating,
    VolumeHealth::NoQuorum,
    VolumeHealth::Failed,
    VolumeHealth::Deleting,
];

#[derive(Clone)]
pub struct Sources {
    pub metrics: Arc<Metrics>,
    pub node: Arc<Node>,
    pub cluster: Arc<Cluster>,
    pub replication: Arc<Replication>,
}

impl std::fmt::Debug for Sources {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("Sources")
    }
}

impl Collector for Sources {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result {
        self.edge(&mut encoder)?;
        self.links(&mut encoder)?;
        self.pools(&mut encoder)?;
        self.pool_stalls(&mut encoder)?;
        self.control(&mut encoder)?;
        process_metrics(&mut encoder)
    }
}

fn label(key: &'static str, value: impl ToString) -> (&'static str, String) {
    (key, value.to_string())
}

impl Sources {
    /// Per volume at the NBD edge: what clients asked and how long it took.
    fn edge(&self, encoder: &mut DescriptorEncoder) -> Result {
        let volumes = self.metrics.volume_snapshots();
        let mut operations = Vec::new();
        let mut bytes = Vec::new();
        let mut latencies = Vec::new();
        let mut in_flight = Vec::new();
        let mut errors = Vec::new();
        for (volume, snapshot) in &volumes {
            for (kind, counts) in &snapshot.kinds {
                let labels = vec![label("volume", volume), label("op", kind.name())];
                operations.push((labels.clone(), counts.operations as f64));
                if *kind != IoKind::Flush {
                    bytes.push((labels.clone(), counts.bytes as f64));
                }
                let buckets = LATENCY_BUCKET_BOUNDS_NANOS
                    .iter()
                    .map(|nanos| *nanos as f64 / 1e9)
                    .chain([f64::MAX])
                    .zip(counts.latency_buckets.iter().copied())
                    .collect();
                latencies.push(HistogramSample {
                    labels,
                    sum: counts.latency_sum_seconds,
                    buckets,
                });
            }
            in_flight.push((vec![label("volume", volume)], snapshot.in_flight as f64));
            errors.push((vec![label("volume", volume)], snapshot.errors as f64));
        }
        counters(encoder, "trireme_volume_operations", "NBD requests completed, per volume and operation (read, write, flush, trim, write_zeroes).", &operations)?;
        counters(
            encoder,
            "trireme_volume_bytes",
            "Bytes read, written, trimmed or zeroed by NBD requests, per volume and operation.",
            &bytes,
        )?;
        histograms(
            encoder,
            "trireme_volume_request_duration_seconds",
            "Time from an NBD request's arrival to its reply, per volume and operation.",
            &latencies,
        )?;
        gauges(
            encoder,
            "trireme_volume_in_flight_requests",
            "NBD requests received and not yet answered, per volume.",
            &in_flight,
        )?;
        counters(
            encoder,
            "trireme_volume_errors",
            "NBD requests answered with an error, per volume.",
            &errors,
        )
    }

    /// Per replica link of the engines on this node (it is their primary).
    fn links(&self, encoder: &mut DescriptorEncoder) -> Result {
        // Each engine's lock first, the state's after: an engine may read
        // the state under its lock, so never hold both the other way round.
        let reports: Vec<(String, trireme_replication::EngineReport)> = self
            .replication
            .engines()
            .iter()
            .map(|engine| (engine.volume.to_string(), engine.report()))
            .collect();
        let state = self.cluster.state.read();
        let names = |node| state.node_name(node);
        let (mut messages, mut bytes, mut out_of_sync, mut connected) =
            (vec![], vec![], vec![], vec![]);
        let (mut resync_done, mut resync_total, mut resync_rate) = (vec![], vec![], vec![]);
        let (mut states, mut latencies) = (vec![], vec![]);
        let (mut quorum, mut repaired, mut resynced, mut failovers) =
            (vec![], vec![], vec![], vec![]);
        for (volume, report) in &reports {
            let of_volume = vec![label("volume", volume)];
            quorum.push((of_volume.clone(), f64::from(u8::from(report.quorum))));
            repaired.push((of_volume.clone(), report.counters.repaired_blocks as f64));
            resynced.push((of_volume.clone(), report.counters.resynced_bytes as f64));
            failovers.push((of_volume, report.counters.read_failovers as f64));
            for link in &report.links {
                let labels: Labels = vec![label("volume", volume), label("peer", names(link.node))];
                messages.push((labels.clone(), link.in_flight_messages as f64));
                bytes.push((labels.clone(), link.in_flight_bytes as f64));
                out_of_sync.push((labels.clone(), link.out_of_sync_bytes as f64));
                connected.push((labels.clone(), f64::from(u8::from(link.connected))));
                if let Some(progress) = link.resync {
                    resync_done.push((labels.clone(), progress.done_bytes as f64));
                    resync_total.push((labels.clone(), progress.total_bytes as f64));
                    resync_rate.push((labels.clone(), progress.rate_bytes_per_sec as f64));
                }
                for state in LINK_STATES {
                    let mut labels = labels.clone();
                    labels.push(label("state", state));
                    states.push((labels, f64::from(u8::from(link.state == state))));
                }
                let latency = &link.ack_latency;
                latencies.push(HistogramSample {
                    labels,
                    sum: latency.sum_ms as f64 / 1e3,
                    buckets: ACK_LATENCY_BOUNDS_MS
                        .iter()
                        .map(|millis| *millis as f64 / 1e3)
                        .chain([f64::MAX])
                        .zip(latency.buckets.iter().copied())
                        .collect(),
                });
            }
        }
        gauges(
            encoder,
            "trireme_replication_in_flight_messages",
            "Writes, flushes and resync messages sent to a replica and not yet acknowledged.",
            &messages,
        )?;
        gauges(
            encoder,
            "trireme_replication_in_flight_bytes",
            "Payload bytes sent to a replica and not yet acknowledged.",
            &bytes,
        )?;
        histograms(
            encoder,
            "trireme_replication_ack_duration_seconds",
            "Time from sending a message to a replica to its acknowledgement (millisecond clock).",
            &latencies,
        )?;
        gauges(
            encoder,
            "trireme_replication_out_of_sync_bytes",
            "Bytes of the regions a replica lacks (0 when up to date).",
            &out_of_sync,
        )?;
        gauges(
            encoder,
            "trireme_replication_link_connected",
            "1 if the link to the replica is up.",
            &connected,
        )?;
        gauges(
            encoder,
            "trireme_replication_link_state",
            "The replica's state as its primary sees it: 1 for the current state.",
            &states,
        )?;
        gauges(
            encoder,
            "trireme_replication_resync_done_bytes",
            "Bytes a running resync has copied to the replica.",
            &resync_done,
        )?;
        gauges(
            encoder,
            "trireme_replication_resync_total_bytes",
            "Bytes a running resync copies to the replica in all.",
            &resync_total,
        )?;
        gauges(
            encoder,
            "trireme_replication_resync_rate_bytes_per_second",
            "The resync rate limit of the volume's engine.",
            &resync_rate,
        )?;
        gauges(
            encoder,
            "trireme_replication_quorum",
            "1 if the volume's engine here has quorum (writes complete).",
            &quorum,
        )?;
        counters(encoder, "trireme_replication_repaired_blocks", "Blocks rewritten on a replica from a good copy (reads and verify), since the engine started.", &repaired)?;
        counters(
            encoder,
            "trireme_replication_resynced_bytes",
            "Data bytes resyncs copied, since the engine started.",
            &resynced,
        )?;
        counters(
            encoder,
            "trireme_replication_read_failovers",
            "Reads served by another replica after one failed, since the engine started.",
            &failovers,
        )
    }

    /// This node's pools.
    fn pools(&self, encoder: &mut DescriptorEncoder) -> Result {
        let (mut capacity, mut allocated, mut free, mut online) = (vec![], vec![], vec![], vec![]);
        let (
            mut journal,
            mut journal_used,
            mut backlog,
            mut backlog_bytes,
            mut dirty,
            mut checksum_errors,
        ) = (vec![], vec![], vec![], vec![], vec![], vec![]);
        let (mut direct, mut journaled) = (vec![], vec![]);
        for (name, status, pool) in self.node.pool_handles() {
            let labels = vec![label("pool", &name)];
            online.push((labels.clone(), f64::from(u8::from(status.is_some()))));
            let Some(info) = status else { continue };
            capacity.push((labels.clone(), info.capacity_bytes as f64));
            allocated.push((labels.clone(), info.allocated_bytes as f64));
            free.push((labels.clone(), info.free_bytes as f64));
            checksum_errors.push((labels.clone(), info.checksum_errors as f64));
            if let Some(pool) = pool {
                let stats = pool.journal_stats();
                journal.push((labels.clone(), stats.journal_bytes as f64));
                journal_used.push((labels.clone(), stats.journal_used_bytes as f64));
                backlog.push((labels.clone(), stats.unapplied_records as f64));
                backlog_bytes.push((labels.clone(), stats.unapplied_bytes as f64));
                dirty.push((labels.clone(), stats.dirty_map_entries as f64));
                direct.push((labels.clone(), stats.write_path.direct as f64));
                for reason in trireme_store::Journaled::ALL {
                    let mut labels = labels.clone();
                    labels.push(label("reason", reason.name()));
                    journaled.push((labels, stats.write_path.journaled(reason) as f64));
                }
            }
        }
        gauges(
            encoder,
            "trireme_pool_online",
            "1 if the pool is open and serving I/O.",
            &online,
        )?;
        gauges(
            encoder,
            "trireme_pool_capacity_bytes",
            "Bytes of the pool's data region.",
            &capacity,
        )?;
        gauges(
            encoder,
            "trireme_pool_allocated_bytes",
            "Bytes of chunks in use by written data.",
            &allocated,
        )?;
        gauges(
            encoder,
            "trireme_pool_free_bytes",
            "Bytes of chunks free.",
            &free,
        )?;
        counters(
            encoder,
            "trireme_pool_small_writes_direct",
            "Small writes (whole blocks, not whole chunks) written in place once, since the pool opened.",
            &direct,
        )?;
        counters(
            encoder,
            "trireme_pool_small_writes_journaled",
            "Small writes that took the journal (written twice), by the first rule that sent them there, since the pool opened.",
            &journaled,
        )?;
        counters(
            encoder,
            "trireme_pool_checksum_errors",
            "Blocks that failed their checksum since the pool was opened.",
            &checksum_errors,
        )?;
        gauges(
            encoder,
            "trireme_pool_journal_bytes",
            "Size of the pool's write-ahead journal.",
            &journal,
        )?;
        gauges(encoder, "trireme_pool_journal_used_bytes", "Journal bytes written and not yet checkpointed; journal fill is this over trireme_pool_journal_bytes.", &journal_used)?;
        gauges(
            encoder,
            "trireme_pool_apply_backlog_records",
            "Journal records acknowledged and not yet applied in place.",
            &backlog,
        )?;
        gauges(
            encoder,
            "trireme_pool_apply_backlog_bytes",
            "Data of those records, held in memory until applied (dirty data).",
            &backlog_bytes,
        )?;
        gauges(
            encoder,
            "trireme_pool_dirty_map_entries",
            "Chunk-map entries changed since the last metadata checkpoint.",
            &dirty,
        )
    }

    /// Where each pool's writers and background thread waited: the
    /// causes of tail latency (`docs/metrics.md`, *Store*).
    fn pool_stalls(&self, encoder: &mut DescriptorEncoder) -> Result {
        let (mut admission_waits, mut admission_seconds) = (vec![], vec![]);
        let (mut background_waits, mut background_seconds) = (vec![], vec![]);
        for (name, _, pool) in self.node.pool_handles() {
            let Some(pool) = pool else { continue };
            let stalls = pool.journal_stats().stalls;
            for reason in trireme_store::AdmissionWait::ALL {
                let labels = vec![label("pool", &name), label("reason", reason.name())];
                let total = stalls.admission(reason);
                admission_waits.push((labels.clone(), total.count as f64));
                admission_seconds.push((labels, total.seconds()));
            }
            for (work, total) in [
                ("writeback_start", stalls.writeback_start),
                ("writeback", stalls.writeback),
                ("writeback_queue", stalls.writeback_queue),
                ("checkpoint", stalls.checkpoints),
                ("activation", stalls.activations),
            ] {
                let labels = vec![label("pool", &name), label("work", work)];
                background_waits.push((labels.clone(), total.count as f64));
                background_seconds.push((labels, total.seconds()));
            }
        }
        counters(
            encoder,
            "trireme_pool_admission_waits",
            "Writes that waited at admission for the background thread, by the first reason, since the pool opened.",
            &admission_waits,
        )?;
        counters(
            encoder,
            "trireme_pool_admission_wait_seconds",
            "Time writes spent waiting at admission, by the first reason, since the pool opened.",
            &admission_seconds,
        )?;
        counters(
            encoder,
            "trireme_pool_background_waits",
            "Times the pool's background thread waited for the device: write-back of in-place data, checkpoints, region activations.",
            &background_waits,
        )?;
        counters(
            encoder,
            "trireme_pool_background_wait_seconds",
            "Time the pool's background thread spent waiting for the device, by work, since the pool opened (while it waits, nothing is applied).",
            &background_seconds,
        )
    }

    /// The control plane, as this node's copy of the state and its Raft
    /// member see it. Every node reports the cluster-wide series.
    fn control(&self, encoder: &mut DescriptorEncoder) -> Result {
        let raft = self.cluster.raft.metrics().borrow().clone();
        let leader = self.cluster.leader();
        let state = self.cluster.state.read();
        let none = Labels::new();
        gauges(
            encoder,
            "trireme_raft_term",
            "The current Raft term.",
            &[(none.clone(), raft.current_term as f64)],
        )?;
        gauges(
            encoder,
            "trireme_raft_last_log_index",
            "Index of the last entry in this member's Raft log.",
            &[(none.clone(), raft.last_log_index.unwrap_or(0) as f64)],
        )?;
        gauges(encoder, "trireme_raft_applied_index", "Index of the last Raft entry applied to this member's state (every applied entry is committed).", &[(none.clone(), raft.last_applied.map_or(0, |log| log.index) as f64)])?;
        gauges(
            encoder,
            "trireme_raft_is_leader",
            "1 if this node is the control plane's leader.",
            &[(
                none.clone(),
                f64::from(u8::from(leader == Some(self.cluster.node_id()))),
            )],
        )?;
        let leader_series: Vec<(Labels, f64)> = leader
            .map(|leader| (vec![label("leader", state.node_name(leader))], 1.0))
            .into_iter()
            .collect();
        gauges(
            encoder,
            "trireme_raft_leader",
            "The leader this node knows (one series, value 1; none without a leader).",
            &leader_series,
        )?;
        let mut node_states = Vec::new();
        for record in state.nodes.values() {
            for candidate in NODE_STATES {
                let labels = vec![
                    label("node", &record.name),
                    label("state", candidate.as_str()),
                ];
                node_states.push((labels, f64::from(u8::from(record.state == candidate))));
            }
        }
        gauges(encoder, "trireme_node_state", "Each node's state in the control plane: 1 for the current state (online, offline, evicted).", &node_states)?;
        let mut volume_states = Vec::new();
        for volume in state.volumes.values() {
            let health = state.volume_health(volume);
            for candidate in VOLUME_STATES {
                let labels = vec![
                    label("volume", &volume.name),
                    label("state", candidate.as_str()),
                ];
                volume_states.push((labels, f64::from(u8::from(health == candidate))));
            }
        }
        gauges(encoder, "trireme_volume_state", "Each volume's health: 1 for the current state (ready, degraded, syncing, creating, no-quorum, failed, deleting).", &volume_states)?;
        let sizes: Vec<(Labels, f64)> = state
            .volumes
            .values()
            .map(|volume| {
                (
                    vec![label("volume", &volume.name)],
                    volume.size_bytes as f64,
                )
            })
            .collect();
        gauges(
            encoder,
            "trireme_volume_size_bytes",
            "Each volume's size.",
            &sizes,
        )
    }
}

fn process_metrics(encoder: &mut DescriptorEncoder) -> Result {
    let Some(stats) = process::read() else {
        return Ok(());
    };
    let one = |value: f64| [(Labels::new(), value)];
    counters(
        encoder,
        "trireme_process_cpu_seconds",
        "User and system CPU time of the node process.",
        &one(stats.cpu_seconds),
    )?;
    gauges(
        encoder,
        "trireme_process_resident_memory_bytes",
        "Resident memory of the node process.",
        &one(stats.resident_bytes as f64),
    )?;
    gauges(
        encoder,
        "trireme_process_virtual_memory_bytes",
        "Virtual memory of the node process.",
        &one(stats.virtual_bytes as f64),
    )?;
    gauges(
        encoder,
        "trireme_process_open_fds",
        "Open file descriptors of the node process.",
        &one(stats.open_fds as f64),
    )?;
    if let Some(max) = stats.max_fds {
        gauges(
            encoder,
            "trireme_process_max_fds",
            "The process's limit on open file descriptors.",
            &one(max as f64),
        )?;
    }
    gauges(
        encoder,
        "trireme_process_threads",
        "Threads of the node process.",
        &one(stats.threads as f64),
    )?;
    gauges(
        encoder,
        "trireme_process_start_time_seconds",
        "When the node process started, in seconds since the Unix epoch.",
        &one(stats.start_time_seconds),
    )
}
