//! The JSON bodies of the REST API. The CLI deserialises the same types, so
//! the two cannot drift apart.

use serde::{Deserialize, Serialize};
use trireme_store::ScanReport;
use utoipa::ToSchema;

use crate::node::PoolStatus;

/// Every error answer: a message for people and a stable code for programs.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ErrorBody {
    /// What was wrong and what to do about it.
    pub error: String,
    /// Stable machine-readable code, e.g. `volume_not_found`.
    pub code: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HealthResponse {
    /// `ok` when the API answers.
    pub status: String,
    pub pools_online: usize,
    pub pools_offline: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodeResponse {
    pub version: String,
    pub data_dir: String,
    /// The address the REST API listens on.
    pub api_address: String,
    /// The TCP address of the NBD server (`nbd://ADDRESS/VOLUME`).
    pub nbd_tcp_address: Option<String>,
    /// The unix socket of the NBD server.
    pub nbd_unix_socket: Option<String>,
    /// How this node makes a volume's block device on its host (`PUT
    /// /api/v1/volumes/{name}/device`): `kernel-nbd` (a `/dev/nbdN` that
    /// grows in place and rides over a restart of the node) or
    /// `nbdfuse-loop`. The Proxmox plugin hands QEMU the device only
    /// where it is `kernel-nbd`.
    #[serde(default)]
    pub device_kind: Option<String>,
    pub cluster_id: String,
    pub node_id: u64,
    pub node_name: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreatePoolRequest {
    /// Letters, digits, '-', '_' and '.', at most 63 bytes.
    pub name: String,
    /// Absolute path of a block device or a file (created if missing).
    pub path: String,
    /// Size of the file to create; a block device's own size is used otherwise.
    #[serde(default)]
    pub size_bytes: Option<u64>,
    /// `nvme`, `ssd` (default) or `hdd`.
    #[serde(default)]
    pub class: Option<String>,
    /// Reserve the file's space up front instead of leaving it sparse.
    #[serde(default)]
    pub preallocate: bool,
    /// Format the path even though it holds data (a file system, a
    /// partition table, any non-zero byte at its start or end) or a pool
    /// no node uses. A device or file in use on the host (mounted, swap,
    /// a loop device's backing file) is refused even so.
    #[serde(default)]
    pub force: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum PoolState {
    Online,
    Offline,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct PoolResponse {
    pub name: String,
    pub id: u64,
    /// `nvme`, `ssd` or `hdd`.
    pub class: String,
    pub state: PoolState,
    /// Why the pool is offline.
    pub error: Option<String>,
    pub device_path: String,
    pub metadata_path: String,
    /// Bytes volumes can be given (the data region). Absent when offline.
    pub capacity_bytes: Option<u64>,
    /// Bytes of chunks holding written data.
    pub allocated_bytes: Option<u64>,
    pub free_bytes: Option<u64>,
    /// Bytes the pool's device takes on its host: a file's allocated
    /// blocks (journal, checksums and the chunks in use; freed chunks are
    /// given back at the next checkpoint), a block device's whole size.
    #[serde(default)]
    pub host_bytes: Option<u64>,
    /// Of those, bytes of free chunks the file keeps for the overwrites
    /// that freed them to take again (at most 256 MiB, or a sixteenth of
    /// a smaller pool; given back when the pool opens).
    #[serde(default)]
    pub warm_bytes: Option<u64>,
    /// Sum of the volume sizes; above `capacity_bytes` means over-committed.
    pub provisioned_bytes: Option<u64>,
    pub volume_count: Option<usize>,
    pub journal_bytes: Option<u64>,
    pub chunk_bytes: Option<u64>,
    /// Blocks that failed their checksum since the pool was opened.
    pub checksum_errors: Option<u64>,
}

impl From<PoolStatus> for PoolResponse {
    fn from(status: PoolStatus) -> Self {
        let info = status.info.as_ref();
        PoolResponse {
            name: status.record.name.to_string(),
            id: status.record.id.0,
            class: status.record.class.to_string(),
            state: if status.offline_reason.is_none() {
                PoolState::Online
            } else {
                PoolState::Offline
            },
            error: status.offline_reason,
            device_path: status.record.device_path.display().to_string(),
            metadata_path: status.record.metadata_path.display().to_string(),
            capacity_bytes: info.map(|info| info.capacity_bytes),
            allocated_bytes: info.map(|info| info.allocated_bytes),
            free_bytes: info.map(|info| info.free_bytes),
            host_bytes: info.and_then(|info| info.host_bytes),
            warm_bytes: info.map(|info| info.warm_bytes),
            provisioned_bytes: info.map(|info| info.provisioned_bytes),
            volume_count: info.map(|info| info.volume_count),
            journal_bytes: info.map(|info| info.journal_bytes),
            chunk_bytes: info.map(|info| info.chunk_bytes),
            checksum_errors: info.map(|info| info.checksum_errors),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateVolumeRequest {
    /// The volume's name, also its NBD export name; unique on the node.
    pub name: String,
    /// A positive multiple of 4096.
    pub size_bytes: u64,
    /// Only pools of this name qualify; default: the resource group's pools.
    #[serde(default)]
    pub pool: Option<String>,
    /// The resource group to place it by; default: `default`.
    #[serde(default)]
    pub group: Option<String>,
    /// Diskful replicas wanted, overriding the group's place-count.
    #[serde(default)]
    pub replicas: Option<usize>,
    /// Manual placement: exactly these nodes hold its data.
    #[serde(default)]
    pub nodes: Option<Vec<String>>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GrowVolumeRequest {
    /// The new size: a multiple of 4096, not smaller than the current size.
    pub size_bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AttachRequest {
    /// The node that serves the volume from now on (its name).
    pub node: String,
    /// Attach on a second node while the volume is attached on one (a VM's
    /// live migration); refused otherwise.
    #[serde(default)]
    pub allow_two_primaries: bool,
    /// Take the volume over from a primary whose node the cluster still
    /// counts as online, because you know that machine is dead: it is
    /// fenced. A primary on an offline or evicted node is taken over
    /// without it.
    #[serde(default)]
    pub force_takeover: bool,
}

/// The answer to an attach: the volume as after it, served at `nbd_url` by
/// the node just attached, and the primaries this attach took it over from.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct AttachResponse {
    #[serde(flatten)]
    pub volume: VolumeResponse,
    /// Former primaries fenced by this attach: they are primaries no more,
    /// and the replicas refuse their writes (a new generation). Their VM
    /// must not be started again with the old disk state.
    #[serde(default)]
    pub fenced: Vec<FencedPrimaryResponse>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct FencedPrimaryResponse {
    pub node: String,
    /// Its state when it was fenced: `offline`, `evicted`, or `online`
    /// (with `force_takeover`).
    pub state: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DetachRequest {
    /// The primary to detach; may be left out while there is only one.
    #[serde(default)]
    pub node: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddReplicaRequest {
    /// The node to hold the new replica; default: placed by the volume's
    /// resource group.
    #[serde(default)]
    pub node: Option<String>,
    /// Only pools of this name qualify; default: the group's pools.
    #[serde(default)]
    pub pool: Option<String>,
}

/// A running resync of one replica, as the data path last reported it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SyncResponse {
    pub done_bytes: u64,
    pub total_bytes: u64,
    pub rate_bytes_per_sec: u64,
    /// Seconds left at the current rate; absent while the rate is 0.
    pub eta_secs: Option<u64>,
    /// 0 to 100.
    pub percent: u64,
    /// Seconds since the primary last reported progress, when that is
    /// longer than a running resync ever stays silent: the resync is not
    /// running (its primary is down, or each attempt fails). The rate is
    /// then 0 and there is no time left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stalled_secs: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ReplicaResponse {
    pub node: String,
    /// `diskful`, `diskless` or `tiebreaker`.
    pub kind: String,
    pub pool: Option<String>,
    /// What the replica is to the volume's data: `primary`, `up-to-date`,
    /// `outdated` (missed writes, no resync running), `syncing 42%`,
    /// `diskless` or `tiebreaker`. A primary whose own replica is not up to
    /// date shows e.g. `primary (syncing 42%)`.
    pub state: String,
    /// `pending`, `ready` or `failed`, as its node last reported the
    /// replica's storage.
    #[serde(default)]
    pub observed: String,
    /// Why it failed.
    pub message: Option<String>,
    pub allocated_bytes: u64,
    /// A diskful replica holding every acknowledged write.
    #[serde(default)]
    pub in_sync: bool,
    /// The running resync, if any.
    #[serde(default)]
    pub sync: Option<SyncResponse>,
    /// Why this replica, which is behind, is not being resynced and will
    /// not be until something changes (its node is offline, the volume is
    /// detached with an up-to-date replica offline, ...); absent when a
    /// resync runs or will start by itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resync_blocked: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct VolumeResponse {
    pub name: String,
    /// The volume's id in the cluster.
    pub id: u64,
    /// The pool of the replica on the answering node, else of the first replica.
    pub pool: String,
    pub size_bytes: u64,
    /// Bytes of pool chunks its written data holds (on one replica).
    pub allocated_bytes: u64,
    pub created_unix_seconds: u64,
    pub checksum_errors: u64,
    /// Where NBD clients reach it, e.g. `nbd://127.0.0.1:10809/NAME`.
    pub nbd_url: Option<String>,
    pub group: String,
    pub state: VolumeState,
    pub replicas: Vec<ReplicaResponse>,
    /// The volume's data-history id: moves forward at each attach with no
    /// other primary and at each restart of a primary's engine.
    #[serde(default)]
    pub generation: u64,
    /// The nodes where the volume is attached (at most two).
    #[serde(default)]
    pub primaries: Vec<String>,
}

/// A volume's state, the same word in `volume list`, `volume show`,
/// `status` and here. Worst first when several apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum VolumeState {
    /// Its nodes remove their copies; it goes once all have.
    Deleting,
    /// Every diskful replica failed (the replicas' messages say why).
    Failed,
    /// Fewer up-to-date voters (in-sync diskful replicas and the
    /// tiebreaker, on online nodes) than a majority: writes fail with EIO
    /// (or wait, with `on-no-quorum suspend`) until one comes back.
    NoQuorum,
    /// Replicas are being made on their nodes (a create or a grow).
    Creating,
    /// A replica that is not up to date is being resynced.
    Syncing,
    /// Fewer up-to-date copies than placed: a replica is outdated, failed,
    /// on a node that is not online, or lost with its node and not placed
    /// again yet.
    Degraded,
    /// Every placed replica is made, up to date and on an online node.
    Ready,
}

impl VolumeState {
    pub fn as_str(self) -> &'static str {
        self.into_health().as_str()
    }

    fn into_health(self) -> trireme_control::VolumeHealth {
        use trireme_control::VolumeHealth as Health;
        match self {
            VolumeState::Deleting => Health::Deleting,
            VolumeState::Failed => Health::Failed,
            VolumeState::NoQuorum => Health::NoQuorum,
            VolumeState::Creating => Health::Creating,
            VolumeState::Syncing => Health::Syncing,
            VolumeState::Degraded => Health::Degraded,
            VolumeState::Ready => Health::Ready,
        }
    }
}

impl From<trireme_control::VolumeHealth> for VolumeState {
    fn from(health: trireme_control::VolumeHealth) -> Self {
        use trireme_control::VolumeHealth as Health;
        match health {
            Health::Deleting => VolumeState::Deleting,
            Health::Failed => VolumeState::Failed,
            Health::NoQuorum => VolumeState::NoQuorum,
            Health::Creating => VolumeState::Creating,
            Health::Syncing => VolumeState::Syncing,
            Health::Degraded => VolumeState::Degraded,
            Health::Ready => VolumeState::Ready,
        }
    }
}

impl std::fmt::Display for VolumeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodeEntry {
    pub id: u64,
    pub name: String,
    pub api_address: String,
    pub nbd_address: Option<String>,
    /// `HOST:PORT` of the node's replication listener.
    #[serde(default)]
    pub data_address: Option<String>,
    pub labels: std::collections::BTreeMap<String, String>,
    /// `online`, `offline` or `evicted`.
    pub state: String,
    /// Seconds in that state.
    pub state_seconds: u64,
    /// `leader`, `voter` or `learner` in the control plane.
    pub role: String,
    pub pools: usize,
    pub capacity_bytes: u64,
    pub free_bytes: u64,
}

/// `GET /api/v1/nodes/{name}`: one node in full (`trireme node show`).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodeDetail {
    #[serde(flatten)]
    pub node: NodeEntry,
    /// When the node entered its state (ms since the Unix epoch).
    pub state_since_ms: u64,
    /// When the node joined the cluster (ms since the Unix epoch).
    pub joined_ms: u64,
    pub pool_list: Vec<NodePool>,
    /// Every volume with a replica (or a primary) on this node.
    pub replicas: Vec<NodeReplica>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodePool {
    pub name: String,
    pub class: String,
    pub capacity_bytes: u64,
    pub free_bytes: u64,
    pub online: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct NodeReplica {
    pub volume: String,
    /// `diskful`, `diskless` or `tiebreaker`.
    pub kind: String,
    pub pool: Option<String>,
    /// A diskful replica: `up-to-date` or `outdated`; `-` otherwise.
    pub data: String,
    /// The volume is attached here (this node is one of its primaries).
    pub primary: bool,
}

/// `PUT /api/v1/nodes/{name}/labels`: labels to set and keys to remove.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeLabelsBody {
    #[serde(default)]
    pub set: std::collections::BTreeMap<String, String>,
    #[serde(default)]
    pub remove: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct GroupBody {
    pub name: String,
    /// Diskful replicas per volume.
    pub place_count: usize,
    /// Fewest replicas a new volume may start with; default: place-count.
    #[serde(default)]
    pub min_place_count: Option<usize>,
    /// Pools (by name) that qualify; empty: any.
    #[serde(default)]
    pub pools: Vec<String>,
    /// `nvme`, `ssd` or `hdd`; absent: any.
    #[serde(default)]
    pub class: Option<String>,
    /// Label keys whose values must differ between replicas, e.g. `zone`.
    #[serde(default)]
    pub replicas_on_different: Vec<String>,
    #[serde(default)]
    pub diskless_on_remaining: bool,
    /// `io-error` (default) or `suspend`.
    #[serde(default)]
    pub on_no_quorum: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SettingsBody {
    pub eviction_enabled: bool,
    pub eviction_delay_secs: u64,
    /// Bytes per second one volume's resync (or verify) may copy; at least
    /// 1 MiB/s [default: 256 MiB/s].
    #[serde(default = "default_resync_rate")]
    pub resync_rate_bytes_per_sec: u64,
}

fn default_resync_rate() -> u64 {
    trireme_control::DEFAULT_RESYNC_RATE
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct JoinTokenResponse {
    pub token: String,
    /// The command that adds a machine, with this node's address.
    pub command: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct CountBy {
    pub total: usize,
    pub online: usize,
    pub offline: usize,
    pub evicted: usize,
}

/// How many volumes are in each [`VolumeState`].
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct VolumeCounts {
    pub total: usize,
    pub ready: usize,
    pub creating: usize,
    #[serde(default)]
    pub syncing: usize,
    pub degraded: usize,
    #[serde(default)]
    pub no_quorum: usize,
    pub failed: usize,
    pub deleting: usize,
}

impl VolumeCounts {
    pub fn count(&mut self, state: VolumeState) {
        self.total += 1;
        *match state {
            VolumeState::Ready => &mut self.ready,
            VolumeState::Creating => &mut self.creating,
            VolumeState::Syncing => &mut self.syncing,
            VolumeState::Degraded => &mut self.degraded,
            VolumeState::NoQuorum => &mut self.no_quorum,
            VolumeState::Failed => &mut self.failed,
            VolumeState::Deleting => &mut self.deleting,
        } += 1;
    }

    /// `(count, state)` for each state, worst first.
    pub fn by_state(&self) -> [(usize, VolumeState); 7] {
        [
            (self.no_quorum, VolumeState::NoQuorum),
            (self.failed, VolumeState::Failed),
            (self.degraded, VolumeState::Degraded),
            (self.syncing, VolumeState::Syncing),
            (self.creating, VolumeState::Creating),
            (self.ready, VolumeState::Ready),
            (self.deleting, VolumeState::Deleting),
        ]
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct StatusResponse {
    pub cluster_id: String,
    /// `HEALTH_OK` or `HEALTH_WARN`.
    pub health: String,
    pub this_node: String,
    pub leader: Option<String>,
    pub voters: Vec<String>,
    pub learners: Vec<String>,
    pub nodes: CountBy,
    pub pools: usize,
    pub capacity_bytes: u64,
    pub free_bytes: u64,
    pub provisioned_bytes: u64,
    pub volumes: VolumeCounts,
    /// Each names what is wrong and the action to take.
    pub warnings: Vec<String>,
    /// The replicas placed against their group's rules (after a label or
    /// group change), each also one of `warnings`.
    #[serde(default)]
    pub misplaced_volumes: Vec<MisplacedReplica>,
    pub eviction_enabled: bool,
    pub eviction_delay_secs: u64,
}

/// A replica that no longer satisfies its volume's group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MisplacedReplica {
    pub volume: String,
    pub group: String,
    /// The node whose replica should move.
    pub node: String,
    /// What is wrong, in the words of the group's settings.
    pub reason: String,
    /// The warning as `warnings` words it, with the commands that move it.
    pub warning: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ScanResponse {
    /// No problem, no checksum mismatch and the accounting agrees.
    pub clean: bool,
    pub allocated_chunks_counted: u64,
    pub allocated_chunks_accounted: u64,
    pub blocks_checked: u64,
    pub checksum_mismatches: Vec<String>,
    pub problems: Vec<String>,
}

impl From<ScanReport> for ScanResponse {
    fn from(report: ScanReport) -> Self {
        ScanResponse {
            clean: report.is_clean(),
            allocated_chunks_counted: report.allocated_chunks_counted,
            allocated_chunks_accounted: report.allocated_chunks_accounted,
            blocks_checked: report.blocks_checked,
            checksum_mismatches: report.checksum_mismatches,
            problems: report.problems,
        }
    }
}

/// Blocks a verify rewrote on one replica.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RepairedResponse {
    pub node: String,
    pub blocks: u64,
}

/// A `verify` of a volume's replicas: how far it got and what it found.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct VerifyResponse {
    pub volume: String,
    /// The node whose engine runs it (where the volume is attached).
    pub primary: String,
    /// `running`, `done` or `aborted`.
    pub state: String,
    /// Why it was aborted.
    #[serde(default)]
    pub reason: Option<String>,
    pub total_bytes: u64,
    /// Bytes compared on every up-to-date replica.
    pub checked_bytes: u64,
    /// Bytes not compared: fewer than two up-to-date replicas answered.
    pub skipped_bytes: u64,
    /// 0 to 100.
    pub percent: u64,
    /// The up-to-date replicas compared.
    pub replicas: Vec<String>,
    /// 4 KiB blocks whose copies did not all agree.
    pub differing_blocks: u64,
    /// Of those, blocks decided without a majority (two copies that
    /// disagree): the primary's copy won.
    pub no_majority_blocks: u64,
    /// Blocks unreadable on every copy: nothing to repair them from.
    pub unrecoverable_blocks: u64,
    /// Blocks rewritten, per replica.
    pub repaired: Vec<RepairedResponse>,
    /// Wall time of a finished verify; 0 while it runs.
    pub elapsed_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshotRequest {
    /// The snapshot's name, unique among the volume's snapshots.
    pub name: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SnapshotResponse {
    pub volume: String,
    pub name: String,
    /// The same id on every replica; never reused.
    pub id: u64,
    /// `creating`, `ready`, `failed` or `deleting`.
    pub state: String,
    /// Why it failed.
    pub error: Option<String>,
    pub created_unix_seconds: u64,
    /// The volume's size when it was taken.
    pub size_bytes: u64,
    /// The nodes whose replica holds it.
    pub nodes: Vec<String>,
    /// Taken by the volume's schedule.
    pub scheduled: bool,
    /// Bytes deleting it would give back (on each node holding it).
    pub exclusive_bytes: u64,
    /// Bytes it shares with the volume, other snapshots or clones.
    pub shared_bytes: u64,
    /// Its read-only NBD export, `VOLUME@SNAPSHOT`, on a node holding it.
    pub nbd_url: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RollbackRequest {
    /// The snapshot whose content the volume gets back.
    pub snapshot: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CloneRequest {
    /// The new volume's name.
    pub name: String,
    /// The resource group of the clone [default: the source volume's].
    #[serde(default)]
    pub group: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ScheduleRequest {
    /// Take a snapshot this often (at least 10 s).
    pub every_secs: u64,
    /// Keep this many scheduled snapshots; older ones are deleted.
    pub keep: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ScheduleResponse {
    pub volume: String,
    pub every_secs: Option<u64>,
    pub keep: Option<usize>,
}

/// The cluster's I/O over the last ~10 s (`GET /api/v1/io`), like the `io:`
/// section of `ceph -s`. Writes count WRITE, WRITE_ZEROES and TRIM requests;
/// bytes count request payloads.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct IoResponse {
    pub read_iops: f64,
    pub write_iops: f64,
    pub read_bytes_per_sec: f64,
    pub write_bytes_per_sec: f64,
    /// Every volume served on a node that answered, busiest first.
    pub volumes: Vec<VolumeIoRate>,
    /// Nodes whose volumes are not counted: offline, or no answer in time.
    pub missing_nodes: Vec<String>,
}

/// One volume's I/O where it is served (its primary).
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
pub struct VolumeIoRate {
    pub volume: String,
    pub node: String,
    pub read_iops: f64,
    pub write_iops: f64,
    pub read_bytes_per_sec: f64,
    pub write_bytes_per_sec: f64,
}

/// One entry of the cluster's event log.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EventResponse {
    /// 1, 2, 3, ... in the order the cluster applied them; never reused.
    pub seq: u64,
    /// When, in UTC, as RFC 3339 (`2026-11-27T04:48:49.123Z`).
    pub time: String,
    /// The same, in milliseconds since the Unix epoch.
    pub time_ms: u64,
    /// What happened, e.g. `attached`, `node_offline`, `quorum_lost`
    /// (docs/api.md lists them).
    pub kind: String,
    /// The node it happened on or to, if one.
    pub node: Option<String>,
    /// The volume it is about, if one.
    pub volume: Option<String>,
    /// Who asked: `admin token via n1`, `local client on n1`, or
    /// `node n2` for what a node did or saw itself.
    pub actor: String,
    pub message: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct EventsResponse {
    /// Oldest first.
    pub events: Vec<EventResponse>,
    /// The newest sequence number in the log (0: no event yet): poll
    /// again with `after` set to the last `seq` you have.
    pub last_seq: u64,
    /// Events after `after` that the log dropped (it keeps the last
    /// 1000) before they were read.
    pub missed: u64,
}
