//! A deterministic simulator of the control plane.
//!
//! # What runs
//!
//! [`run_control_sim`] starts `nodes` openraft nodes, each with the real
//! storage of `trireme_control::raft` (a redb file in a temporary
//! directory, on tmpfs when there is one), inside one current-thread tokio
//! runtime whose clock is paused. Paused time advances only when every task
//! waits, straight to the next timer, so an election timeout or a write
//! timeout costs no wall-clock time, and the order in which tasks run
//! depends on nothing but the program. The nodes talk through `Router`, an
//! in-memory network: a node's `RaftNetwork` connection calls the target's
//! `Raft` handle directly. A failed delivery takes simulated time (10 ms to
//! a node that is down, 50-250 ms for a lost or partitioned message), as it
//! would on a real network; if it did not, openraft's retries would spin
//! without time ever advancing. Such a spin is reported as a livelock.
//!
//! Everything random comes from the seed: which faults happen and when, the
//! fate of each message, each node's election timeout, and the commands the
//! client proposes. One seed is one run, and running it again replays it
//! exactly (the `SimReport`s of two runs are equal, down to the simulated
//! time).
//!
//! # A run
//!
//! 1. Bootstrap: `initialize` on node 1 with every node as a voter, the
//!    `Bootstrap` command, an `AddNode` for each other member (so trireme's
//!    node ids match the Raft ids, as after real joins) and a `ReportPools`
//!    for each member, so that volumes can be placed.
//! 2. `steps` steps, each one of: a client write of a random command (valid
//!    or not: volumes, groups, fake nodes, pools, node states, evictions,
//!    replica reports, settings) sent to whichever node believes it leads; a
//!    crash (the node's Raft is shut down and dropped; its redb file stays);
//!    a restart (`raft::open` on the same file, then `Raft::new`); a random
//!    partition; healing every partition; switching the network between calm
//!    and stormy (stormy: each message may be lost, or delayed by a seeded
//!    `sleep`, on the way there and on the way back); or a minority probe
//!    (below). Some simulated time passes between steps.
//! 3. Settle: every fault is healed and every node restarted; a last write
//!    makes the leader commit all it holds, and every node must apply it.
//!
//! # What is checked
//!
//! - **State-machine safety**: a task per node watches its `StateReader` and
//!   records, for every applied index it sees, a hash of the state (and the
//!   state itself, for the failure message). Any two nodes that applied the
//!   same index must hold identical states there, whether they got there by
//!   applying entries, by replaying the log after a restart or by installing
//!   a snapshot. Snapshots are taken every few entries so that lagging and
//!   restarted nodes do install them.
//! - **Invariants**: `ClusterState::check_invariants` holds on every state
//!   every node is seen with.
//! - **No acknowledged write is lost**: the client records each write that
//!   was acknowledged, with its log index, and derives what it guarantees
//!   (an acknowledged `CreateVolume` means the volume exists; `DeleteVolume`
//!   that it is gone or going; `SetNodeState` that the node is in that state;
//!   and so on). Every node whose applied index is at or past that index must
//!   show it, for as long as no other write that could undo it might have
//!   committed in between (a write whose outcome is unknown, after a timeout,
//!   might have committed anywhere after it). Two acknowledged writes must
//!   never share a log index: one of them would have been lost.
//! - **A minority cannot commit**: the probe cuts the current leader off with
//!   a minority of the nodes and proposes a write there. It must not be
//!   acknowledged, its volume must never appear on any node afterwards, and
//!   the majority side must elect a leader and commit a write within a
//!   bounded simulated time.
//! - **Convergence**: after healing, every node reaches the same applied
//!   index and an identical state, and no node stopped with a fatal error.
//! - **Placements restored**: after healing, the simulator does what the
//!   leader's loop does (a `RestorePlacement` for each volume the state
//!   lists) until nothing is listed, then checks every volume against the
//!   rules on their own terms: an even number of diskful replicas has a
//!   tiebreaker on a node that is not evicted when a node could be one, an
//!   odd number has none when dropping it keeps the quorum, and a volume
//!   with fewer replicas than it should have, or one left on an evicted
//!   node, has them placed where a node with a pool is free (for groups
//!   without label, pool or class rules, and where an empty replica would
//!   not cost the quorum).
//!
//! [`SimConfig::amnesia`] tests the checks themselves: crashes then also
//! lose the node's database, which Raft cannot survive, and most runs fail.
//!
//! # Determinism
//!
//! openraft draws each node's election timeout from the thread's RNG; the
//! simulator gives every node a one-value range, chosen from the seed, so
//! the draw has a single outcome. Each node starts at a seeded moment, so
//! that no two running nodes check their election timers (on openraft's
//! tick) at the same instant: paused time would otherwise keep such nodes
//! in lockstep for the whole run, which no real clock does (see
//! `Sim::stagger_ticks`). openraft's only unbiased `select!` (whose
//! branch order tokio randomises) waits out the back-off after an
//! `Unreachable` error, so the network reports failures as `Network` errors
//! instead. Maps are `BTreeMap`s throughout.

use std::collections::{BTreeMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use openraft::error::{InstallSnapshotError, NetworkError, RPCError, RemoteError};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use openraft::{BasicNode, ServerState, SnapshotPolicy};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;
use tokio::time::{sleep, timeout, Instant};
use trireme_control::command::MAX_PLACE_COUNT;
use trireme_control::raft::{self, ClientWriteError, Raft, StateReader, TypeConfig};
use trireme_control::{
    ClusterSettings, ClusterState, Command, CommandError, NodeRegistration, NodeState, PoolRecord,
    PoolReport, QuorumPolicy, ReplicaKind, ReplicaObserved, Reply, ResourceGroup, DEFAULT_GROUP,
};
use trireme_types::{DeviceClass, GroupName, NodeId, NodeName, PoolName, VolumeName};

/// The simulated wall clock starts here (commands carry proposer times).
const EPOCH_MS: u64 = 1_700_000_000_000;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;
/// How many recent events a failure message shows.
const EVENTS_SHOWN: usize = 60;
/// A run that has not finished after this much simulated time is stuck.
const RUN_LIMIT: Duration = Duration::from_secs(6 * 3600);
/// How long a delivery to a node that is down takes to fail.
const REFUSED_MS: u64 = 10;
/// How long a lost or partitioned message takes to fail (a timeout).
const LOST_MS: (u64, u64) = (50, 250);
/// More messages than this at one simulated instant is a livelock.
const SPIN_LIMIT: u64 = 100_000;
/// How long the majority side of a minority probe, and the cluster after
/// healing, may take to elect a leader and commit. Generous: elections take
/// a few seconds, more when stormy messages are lost.
const LIVENESS_LIMIT: Duration = Duration::from_secs(120);

/// What a run does. Probabilities are per step, except the message ones,
/// which are per message leg while the network is stormy.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Raft voters: 3 or 5 (any number from 3 to 9 works).
    pub nodes: usize,
    /// Steps after bootstrap.
    pub steps: usize,
    pub crash: f64,
    pub restart: f64,
    pub partition: f64,
    pub heal: f64,
    pub minority_probe: f64,
    /// Switching the network between calm and stormy.
    pub weather: f64,
    pub message_loss: f64,
    pub message_delay: f64,
    pub max_delay_ms: u64,
    /// How long the client waits for a write to be acknowledged.
    pub write_timeout_ms: u64,
    /// Snapshot after this many entries; small, so snapshots are installed.
    pub snapshot_every: u64,
    /// Most simulated time between two steps.
    pub max_pause_ms: u64,
    /// Print every event to stderr as it happens.
    pub trace: bool,
    /// A test of the checks themselves: a crash also loses the node's
    /// database (its log, its vote and its snapshots), which Raft does not
    /// tolerate. Runs with it should fail.
    pub amnesia: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            nodes: 3,
            steps: 80,
            crash: 0.06,
            restart: 0.10,
            partition: 0.05,
            heal: 0.08,
            minority_probe: 0.04,
            weather: 0.06,
            message_loss: 0.05,
            message_delay: 0.2,
            max_delay_ms: 300,
            write_timeout_ms: 3_000,
            snapshot_every: 20,
            max_pause_ms: 400,
            trace: false,
            amnesia: false,
        }
    }
}

impl SimConfig {
    /// The default mix, with 5 nodes for one seed in three, so a batch of
    /// seeds covers both cluster sizes.
    pub fn for_seed(seed: u64) -> SimConfig {
        SimConfig {
            nodes: if seed % 3 == 2 { 5 } else { 3 },
            ..SimConfig::default()
        }
    }

    fn validate(&self) -> Result<(), String> {
        if !(3..=9).contains(&self.nodes) {
            return Err(format!("nodes is {}; use 3 to 9", self.nodes));
        }
        let probabilities = [
            self.crash,
            self.restart,
            self.partition,
            self.heal,
            self.minority_probe,
            self.weather,
            self.message_loss,
            self.message_delay,
        ];
        if probabilities.iter().any(|p| !(0.0..=1.0).contains(p)) {
            return Err("every probability must be within 0 to 1".into());
        }
        if self.crash
            + self.restart
            + self.partition
            + self.heal
            + self.minority_probe
            + self.weather
            > 1.0
        {
            return Err("the step probabilities add up to more than 1".into());
        }
        if self.snapshot_every == 0 || self.write_timeout_ms == 0 || self.max_delay_ms == 0 {
            return Err("snapshot_every, write_timeout_ms and max_delay_ms must be above 0".into());
        }
        Ok(())
    }
}

/// What a run did. Two runs of the same seed and config give equal reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimReport {
    pub seed: u64,
    pub nodes: usize,
    /// The applied index every node converged to.
    pub final_applied: u64,
    /// The highest Raft term any node reached.
    pub final_term: u64,
    /// FNV-1a of the converged state's JSON.
    pub state_hash: u64,
    /// Volumes in the converged state.
    pub volumes: usize,
    pub proposed: usize,
    /// Acknowledged writes, whether the state machine accepted or refused
    /// the command.
    pub acknowledged: usize,
    /// Acknowledged writes whose command the state machine refused.
    pub refused: usize,
    /// Writes whose outcome is unknown (timed out, or their node crashed).
    pub unknown: usize,
    pub crashes: usize,
    pub restarts: usize,
    pub partitions: usize,
    pub minority_probes: usize,
    /// Distinct applied indexes whose states were compared across nodes.
    pub indexes_checked: usize,
    pub messages: u64,
    pub messages_lost: u64,
    pub messages_delayed: u64,
    /// Snapshot chunks delivered: lagging nodes caught up from a snapshot.
    pub snapshots_sent: u64,
    /// Volumes whose lost tiebreaker or replicas were placed again after
    /// healing, as the leader's loop does.
    pub placements_restored: usize,
    pub sim_time_ms: u64,
}

/// Runs one seeded simulation of the control plane; `Err` describes the
/// first violated property, with the run's recent events.
pub fn run_control_sim(seed: u64, config: SimConfig) -> Result<SimReport, String> {
    config.validate()?;
    // redb syncs every commit; on tmpfs that costs nothing.
    let shm = Path::new("/dev/shm");
    let builder = {
        let mut builder = tempfile::Builder::new();
        builder.prefix("trireme-sim-");
        builder
    };
    let dir = if shm.is_dir() {
        builder.tempdir_in(shm)
    } else {
        builder.tempdir()
    }
    .map_err(|error| format!("cannot make a temporary directory: {error}"))?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .map_err(|error| format!("cannot start a tokio runtime: {error}"))?;
    let result = runtime.block_on(async {
        let mut sim = Sim::new(seed, config, dir.path().to_path_buf());
        let outcome = match timeout(RUN_LIMIT, sim.run()).await {
            Ok(outcome) => outcome,
            Err(_) => Err(sim.failure(format!(
                "the run did not finish within {RUN_LIMIT:?} of simulated time"
            ))),
        };
        sim.stop_all().await;
        outcome
    });
    // The runtime goes first: its tasks hold the databases in `dir`.
    drop(runtime);
    drop(dir);
    result
}

// ---------------------------------------------------------------------------
// The network.
// ---------------------------------------------------------------------------

/// The in-memory network every node's connections go through.
#[derive(Clone)]
struct Router {
    net: Arc<Mutex<Net>>,
}

struct Net {
    /// Decides each message's fate; separate from the driver's RNG so that
    /// the fault schedule does not shift when a message is added or removed.
    rng: StdRng,
    /// Running nodes: their Raft handle and incarnation. A crashed node is
    /// absent, and messages of an older incarnation are not delivered.
    members: BTreeMap<u64, (Raft, u64)>,
    /// The side of the partition each node is on; absent means side 0.
    sides: BTreeMap<u64, usize>,
    stormy: bool,
    loss: f64,
    delay: f64,
    max_delay_ms: u64,
    messages: u64,
    lost: u64,
    delayed: u64,
    /// Snapshot chunks that reached their target.
    snapshots: u64,
    /// Messages sent at the current simulated instant, to catch retry loops
    /// in which time never advances (they would hang the run, not fail it).
    instant: Option<Instant>,
    at_instant: u64,
    spinning: bool,
}

impl Net {
    fn current(&self, node: u64, incarnation: u64) -> bool {
        self.members
            .get(&node)
            .is_some_and(|(_, current)| *current == incarnation)
    }

    fn side(&self, node: u64) -> usize {
        self.sides.get(&node).copied().unwrap_or(0)
    }

    /// Why a message between two incarnations cannot pass now, if it can't.
    fn blocked(&self, from: (u64, u64), to: (u64, u64)) -> Option<String> {
        if !self.current(from.0, from.1) {
            return Some(format!("node {} is down", from.0));
        }
        if !self.current(to.0, to.1) {
            return Some(format!("node {} is down", to.0));
        }
        if self.side(from.0) != self.side(to.0) {
            return Some(format!("nodes {} and {} are partitioned", from.0, to.0));
        }
        None
    }
}

impl Router {
    fn new(seed: u64, config: &SimConfig) -> Router {
        Router {
            net: Arc::new(Mutex::new(Net {
                rng: StdRng::seed_from_u64(seed ^ 0x6e65_7477_6f72_6b21),
                members: BTreeMap::new(),
                sides: BTreeMap::new(),
                stormy: false,
                loss: config.message_loss,
                delay: config.message_delay,
                max_delay_ms: config.max_delay_ms,
                messages: 0,
                lost: 0,
                delayed: 0,
                snapshots: 0,
                instant: None,
                at_instant: 0,
                spinning: false,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Net> {
        self.net
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// One leg of a message, `from` → `to` (each a node and incarnation).
    ///
    /// A failure takes simulated time, as on a real network (a refused
    /// connection takes a moment, a lost message a timeout); failing at once
    /// would let openraft retry in a loop in which time never advances.
    async fn leg(&self, from: (u64, u64), to: (u64, u64)) -> Result<(), String> {
        let spinning = {
            let mut net = self.lock();
            let now = Instant::now();
            if net.instant == Some(now) {
                net.at_instant += 1;
            } else {
                net.instant = Some(now);
                net.at_instant = 0;
            }
            if net.at_instant > SPIN_LIMIT {
                net.spinning = true;
            }
            net.spinning
        };
        if spinning {
            // Let time move, so that the driver wakes up and reports it.
            sleep(Duration::from_millis(1)).await;
        }
        let fate = {
            let mut net = self.lock();
            net.messages += 1;
            if let Some(reason) = net.blocked(from, to) {
                let wait = if reason.contains("down") {
                    REFUSED_MS
                } else {
                    net.rng.gen_range(LOST_MS.0..=LOST_MS.1)
                };
                Err((reason, wait))
            } else if net.stormy {
                let (loss, delay, max) = (net.loss, net.delay, net.max_delay_ms);
                if net.rng.gen_bool(loss) {
                    net.lost += 1;
                    let wait = net.rng.gen_range(LOST_MS.0..=LOST_MS.1);
                    Err((format!("message {} -> {} lost", from.0, to.0), wait))
                } else if net.rng.gen_bool(delay) {
                    net.delayed += 1;
                    Ok(Some(Duration::from_millis(net.rng.gen_range(1..=max))))
                } else {
                    Ok(None)
                }
            } else {
                Ok(None)
            }
        };
        match fate {
            Err((reason, wait)) => {
                sleep(Duration::from_millis(wait)).await;
                Err(reason)
            }
            Ok(None) => Ok(()),
            Ok(Some(delay)) => {
                sleep(delay).await;
                // A partition or a crash may have cut the message in flight.
                let blocked = self.lock().blocked(from, to);
                match blocked {
                    Some(reason) => Err(reason),
                    None => Ok(()),
                }
            }
        }
    }

    /// The first leg of a request: the target's handle and incarnation.
    async fn outbound(&self, from: (u64, u64), target: u64) -> Result<(Raft, u64), String> {
        let member = self.lock().members.get(&target).cloned();
        let Some((raft, incarnation)) = member else {
            sleep(Duration::from_millis(REFUSED_MS)).await;
            return Err(format!("node {target} is down"));
        };
        self.leg(from, (target, incarnation)).await?;
        Ok((raft, incarnation))
    }
}

/// openraft's network factory for one node incarnation.
struct Network {
    router: Router,
    me: u64,
    incarnation: u64,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Connection;

    async fn new_client(&mut self, target: u64, _node: &BasicNode) -> Connection {
        Connection {
            router: self.router.clone(),
            me: (self.me, self.incarnation),
            target,
        }
    }
}

struct Connection {
    router: Router,
    me: (u64, u64),
    target: u64,
}

/// A failed delivery. Not `Unreachable`: openraft backs off from an
/// unreachable node in an unbiased `select!`, whose random branch order
/// would make runs irreproducible.
fn network_error<E: std::error::Error>(reason: String) -> RPCError<u64, BasicNode, E> {
    RPCError::Network(NetworkError::new(&std::io::Error::other(reason)))
}

type RpcResult<A, E = openraft::error::Infallible> =
    Result<A, RPCError<u64, BasicNode, raft::RaftError<E>>>;

impl RaftNetwork<TypeConfig> for Connection {
    async fn append_entries(
        &mut self,
        request: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> RpcResult<AppendEntriesResponse<u64>> {
        let (raft, incarnation) = self
            .router
            .outbound(self.me, self.target)
            .await
            .map_err(network_error)?;
        let answer = raft.append_entries(request).await;
        self.router
            .leg((self.target, incarnation), self.me)
            .await
            .map_err(network_error)?;
        answer.map_err(|error| RPCError::RemoteError(RemoteError::new(self.target, error)))
    }

    async fn install_snapshot(
        &mut self,
        request: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> RpcResult<InstallSnapshotResponse<u64>, InstallSnapshotError> {
        let (raft, incarnation) = self
            .router
            .outbound(self.me, self.target)
            .await
            .map_err(network_error)?;
        self.router.lock().snapshots += 1;
        let answer = raft.install_snapshot(request).await;
        self.router
            .leg((self.target, incarnation), self.me)
            .await
            .map_err(network_error)?;
        answer.map_err(|error| RPCError::RemoteError(RemoteError::new(self.target, error)))
    }

    async fn vote(
        &mut self,
        request: VoteRequest<u64>,
        _option: RPCOption,
    ) -> RpcResult<VoteResponse<u64>> {
        let (raft, incarnation) = self
            .router
            .outbound(self.me, self.target)
            .await
            .map_err(network_error)?;
        let answer = raft.vote(request).await;
        self.router
            .leg((self.target, incarnation), self.me)
            .await
            .map_err(network_error)?;
        answer.map_err(|error| RPCError::RemoteError(RemoteError::new(self.target, error)))
    }
}

// ---------------------------------------------------------------------------
// The oracle: what every node's state must satisfy.
// ---------------------------------------------------------------------------

/// What a command may change, as far as the expectations go.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    Volume(VolumeName),
    Group(GroupName),
    Node(NodeId),
    NodeState(NodeId),
    NodePools(NodeId),
    Settings,
}

/// The keys whose expectations a command could undo.
fn touches(command: &Command) -> Vec<Key> {
    match command {
        Command::CreateVolume { name, .. } | Command::DeleteVolume { name, .. } => {
            vec![Key::Volume(name.clone())]
        }
        Command::CreateGroup { group } => vec![Key::Group(group.name.clone())],
        Command::DeleteGroup { name } => vec![Key::Group(name.clone())],
        Command::RemoveNode { node } => {
            vec![
                Key::Node(*node),
                Key::NodeState(*node),
                Key::NodePools(*node),
            ]
        }
        Command::SetNodeState { node, .. } | Command::EvictNode { node, .. } => {
            vec![Key::NodeState(*node)]
        }
        Command::ReportPools { node, .. } => vec![Key::NodePools(*node)],
        Command::SetSettings { .. } => vec![Key::Settings],
        _ => Vec::new(),
    }
}

/// What an acknowledged write guarantees about every later state.
#[derive(Debug, Clone)]
enum Check {
    VolumePresent {
        name: VolumeName,
        id: u64,
    },
    /// Absent or being deleted. The client never creates a name twice, so
    /// nothing may bring it back.
    VolumeGone {
        name: VolumeName,
    },
    /// Volumes only grow (while the volume of that id exists).
    VolumeAtLeast {
        name: VolumeName,
        id: u64,
        size_bytes: u64,
    },
    GroupPresent(GroupName),
    /// Group names are never reused either.
    GroupGone(GroupName),
    NodePresent {
        id: NodeId,
        name: NodeName,
    },
    /// Node ids are never reused.
    NodeGone(NodeId),
    NodeInState {
        id: NodeId,
        state: NodeState,
    },
    NodePools {
        id: NodeId,
        pools: BTreeMap<PoolName, PoolRecord>,
    },
    Settings(ClusterSettings),
}

impl Check {
    /// The guarantees of an acknowledged command (keyed when a later command
    /// could undo them), given the state machine's reply.
    fn of(command: &Command, reply: &Reply) -> Vec<(Option<Key>, Check)> {
        match (command, reply) {
            (Command::CreateVolume { name, .. }, Reply::Volume(record)) => vec![(
                Some(Key::Volume(name.clone())),
                Check::VolumePresent {
                    name: name.clone(),
                    id: record.id,
                },
            )],
            (Command::DeleteVolume { name, .. }, _) => {
                vec![(None, Check::VolumeGone { name: name.clone() })]
            }
            (Command::GrowVolume { name, size_bytes }, Reply::Volume(record)) => vec![(
                None,
                Check::VolumeAtLeast {
                    name: name.clone(),
                    id: record.id,
                    size_bytes: *size_bytes,
                },
            )],
            (Command::CreateGroup { group }, _) => vec![(
                Some(Key::Group(group.name.clone())),
                Check::GroupPresent(group.name.clone()),
            )],
            (Command::DeleteGroup { name }, _) => vec![(None, Check::GroupGone(name.clone()))],
            (Command::AddNode { node, .. }, Reply::NodeAdded { node: id })
            | (Command::Bootstrap { node, .. }, Reply::NodeAdded { node: id }) => vec![(
                Some(Key::Node(*id)),
                Check::NodePresent {
                    id: *id,
                    name: node.name.clone(),
                },
            )],
            (Command::RemoveNode { node }, _) => vec![(None, Check::NodeGone(*node))],
            (Command::SetNodeState { node, state, .. }, _) => vec![(
                Some(Key::NodeState(*node)),
                Check::NodeInState {
                    id: *node,
                    state: *state,
                },
            )],
            (Command::EvictNode { node, .. }, _) => vec![(
                Some(Key::NodeState(*node)),
                Check::NodeInState {
                    id: *node,
                    state: NodeState::Evicted,
                },
            )],
            (Command::ReportPools { node, pools }, _) => vec![(
                Some(Key::NodePools(*node)),
                Check::NodePools {
                    id: *node,
                    pools: pools
                        .iter()
                        .map(|pool| (pool.name.clone(), pool.record.clone()))
                        .collect(),
                },
            )],
            (Command::SetSettings { settings }, _) => {
                vec![(Some(Key::Settings), Check::Settings(settings.clone()))]
            }
            _ => Vec::new(),
        }
    }

    fn holds(&self, state: &ClusterState) -> bool {
        match self {
            Check::VolumePresent { name, id } => {
                state.volumes.get(name).map(|volume| volume.id) == Some(*id)
            }
            Check::VolumeGone { name } => {
                state.volumes.get(name).is_none_or(|volume| volume.deleting)
            }
            Check::VolumeAtLeast {
                name,
                id,
                size_bytes,
            } => state
                .volumes
                .get(name)
                .is_none_or(|volume| volume.id != *id || volume.size_bytes >= *size_bytes),
            Check::GroupPresent(name) => state.groups.contains_key(name),
            Check::GroupGone(name) => !state.groups.contains_key(name),
            Check::NodePresent { id, name } => {
                state.nodes.get(id).map(|node| &node.name) == Some(name)
            }
            Check::NodeGone(id) => !state.nodes.contains_key(id),
            Check::NodeInState { id, state: wanted } => {
                state.nodes.get(id).is_none_or(|node| node.state == *wanted)
            }
            Check::NodePools { id, pools } => {
                state.nodes.get(id).is_none_or(|node| &node.pools == pools)
            }
            Check::Settings(settings) => &state.settings == settings,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Sent, no answer yet: it may commit at any moment.
    Pending,
    Acked {
        index: u64,
    },
    /// Refused by a follower before it reached any log.
    NotAppended,
    /// Timed out or failed: it may or may not have committed, anywhere.
    Unknown,
}

struct Proposal {
    command: Command,
    outcome: Outcome,
}

struct Expectation {
    proposal: usize,
    index: u64,
    key: Option<Key>,
    check: Check,
}

/// The first state seen at one applied index.
struct Seen {
    node: u64,
    hash: u64,
    json: String,
}

/// Shared by the driver and the per-node watchers.
#[derive(Default)]
struct Oracle {
    seen: BTreeMap<u64, Seen>,
    proposals: Vec<Proposal>,
    by_key: BTreeMap<Key, Vec<usize>>,
    expectations: Vec<Expectation>,
    /// Acknowledged log index → proposal.
    acked: BTreeMap<u64, usize>,
    /// Volumes proposed to an isolated minority: they must never appear.
    never: Vec<VolumeName>,
    violations: Vec<String>,
}

impl Oracle {
    fn propose(&mut self, command: &Command) -> usize {
        let id = self.proposals.len();
        for key in touches(command) {
            self.by_key.entry(key).or_default().push(id);
        }
        self.proposals.push(Proposal {
            command: command.clone(),
            outcome: Outcome::Pending,
        });
        id
    }

    fn settle(
        &mut self,
        id: usize,
        outcome: Outcome,
        result: Option<&Result<Reply, CommandError>>,
    ) {
        self.proposals[id].outcome = outcome;
        let Outcome::Acked { index } = outcome else {
            return;
        };
        if let Some(&other) = self.acked.get(&index) {
            let first = &self.proposals[other].command;
            let second = &self.proposals[id].command;
            self.violations.push(format!(
                "two acknowledged writes share log index {index}, so one of them was lost: {first:?} and {second:?}"
            ));
            return;
        }
        self.acked.insert(index, id);
        if let Some(Ok(reply)) = result {
            let command = self.proposals[id].command.clone();
            for (key, check) in Check::of(&command, reply) {
                self.expectations.push(Expectation {
                    proposal: id,
                    index,
                    key,
                    check,
                });
            }
        }
    }

    /// Whether a write other than the expectation's own might have changed
    /// its key between its index and `applied`.
    fn overtaken(&self, expectation: &Expectation, applied: u64) -> bool {
        let Some(key) = &expectation.key else {
            return false;
        };
        self.by_key.get(key).into_iter().flatten().any(|&other| {
            other != expectation.proposal
                && match self.proposals[other].outcome {
                    Outcome::Pending | Outcome::Unknown => true,
                    Outcome::Acked { index } => index > expectation.index && index <= applied,
                    Outcome::NotAppended => false,
                }
        })
    }

    /// Checks one node's state at one applied index.
    fn observe(&mut self, node: u64, applied: u64, state: &ClusterState) {
        if let Err(broken) = state.check_invariants() {
            self.violations.push(format!(
                "node {node} at applied index {applied} breaks an invariant: {broken}"
            ));
        }
        let json = serde_json::to_string(state).expect("the cluster state serialises");
        let hash = fnv1a(json.as_bytes());
        match self.seen.get(&applied) {
            None => {
                self.seen.insert(applied, Seen { node, hash, json });
            }
            Some(first) if first.hash != hash => {
                let difference = first_difference(&first.json, &json);
                let first_node = first.node;
                self.violations.push(format!(
                    "state-machine safety: nodes {first_node} and {node} both applied index {applied} but hold different states; {difference}"
                ));
            }
            Some(_) => {}
        }
        for expectation in &self.expectations {
            if expectation.index > applied || self.overtaken(expectation, applied) {
                continue;
            }
            if !expectation.check.holds(state) {
                let command = &self.proposals[expectation.proposal].command;
                let violation = format!(
                    "acknowledged write lost: {command:?} was acknowledged at index {}, but node {node} at applied index {applied} fails {:?}",
                    expectation.index, expectation.check
                );
                self.violations.push(violation);
            }
        }
        for name in &self.never {
            if state.volumes.contains_key(name) {
                self.violations.push(format!(
                    "a minority committed: volume {name}, proposed only to a leader cut off with a minority, is on node {node} at applied index {applied}"
                ));
            }
        }
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in bytes {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    hash
}

/// Where two JSON texts first differ, with some context from each.
fn first_difference(first: &str, second: &str) -> String {
    let at = first
        .bytes()
        .zip(second.bytes())
        .position(|(a, b)| a != b)
        .unwrap_or(first.len().min(second.len()));
    let boundary = |text: &str, mut index: usize| {
        index = index.min(text.len());
        while !text.is_char_boundary(index) {
            index -= 1;
        }
        index
    };
    let window = |text: &str| {
        let start = boundary(text, at.saturating_sub(80));
        let end = boundary(text, at + 160);
        text[start..end].to_string()
    };
    format!(
        "first difference at byte {at}: ...{}... versus ...{}...",
        window(first),
        window(second)
    )
}

/// Records every state `reader` applies, until aborted.
fn watch_node(node: u64, reader: StateReader, oracle: Arc<Mutex<Oracle>>) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut applied = reader.subscribe();
        loop {
            {
                let view = reader.read();
                let index = view.last_applied();
                lock(&oracle).observe(node, index, &view);
            }
            if applied.changed().await.is_err() {
                return;
            }
        }
    })
}

fn lock(oracle: &Mutex<Oracle>) -> MutexGuard<'_, Oracle> {
    oracle
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

// ---------------------------------------------------------------------------
// The driver.
// ---------------------------------------------------------------------------

struct Live {
    raft: Raft,
    reader: StateReader,
    watcher: JoinHandle<()>,
    /// Where in openraft's tick period this incarnation's ticks fall, in
    /// milliseconds since the run began, modulo the period.
    tick_phase_ms: u64,
}

/// The client's knowledge, from what it proposed and what was acknowledged.
#[derive(Default)]
struct Client {
    /// Every volume name proposed, with its id once a create was acknowledged.
    volumes: Vec<(VolumeName, Option<u64>)>,
    groups: Vec<GroupName>,
    /// Nodes whose joins were acknowledged (the members among them).
    nodes: Vec<(NodeId, NodeName)>,
    nonces: Vec<String>,
    counter: u64,
}

impl Client {
    fn fresh(&mut self, prefix: &str) -> String {
        self.counter += 1;
        format!("{prefix}{}", self.counter)
    }
}

struct Sim {
    seed: u64,
    config: SimConfig,
    rng: StdRng,
    dir: PathBuf,
    router: Router,
    oracle: Arc<Mutex<Oracle>>,
    live: BTreeMap<u64, Live>,
    incarnations: BTreeMap<u64, u64>,
    /// Draws each incarnation's tick phase. Apart from `rng`, so that the
    /// faults and commands a seed draws do not shift with the phases.
    phase_rng: StdRng,
    started: Instant,
    client: Client,
    events: VecDeque<String>,
    report: SimReport,
}

impl Sim {
    fn new(seed: u64, config: SimConfig, dir: PathBuf) -> Sim {
        let router = Router::new(seed, &config);
        let report = SimReport {
            seed,
            nodes: config.nodes,
            final_applied: 0,
            final_term: 0,
            state_hash: 0,
            volumes: 0,
            proposed: 0,
            acknowledged: 0,
            refused: 0,
            unknown: 0,
            crashes: 0,
            restarts: 0,
            partitions: 0,
            minority_probes: 0,
            indexes_checked: 0,
            messages: 0,
            messages_lost: 0,
            messages_delayed: 0,
            snapshots_sent: 0,
            placements_restored: 0,
            sim_time_ms: 0,
        };
        Sim {
            seed,
            rng: StdRng::seed_from_u64(seed),
            config,
            dir,
            router,
            oracle: Arc::new(Mutex::new(Oracle::default())),
            live: BTreeMap::new(),
            incarnations: BTreeMap::new(),
            phase_rng: StdRng::seed_from_u64(seed ^ 0x7469_636b_7068_6173),
            started: Instant::now(),
            client: Client::default(),
            events: VecDeque::new(),
            report,
        }
    }

    fn elapsed_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn now_ms(&self) -> u64 {
        EPOCH_MS + self.elapsed_ms()
    }

    fn event(&mut self, text: String) {
        let line = format!("[{:>9.3}s] {text}", self.elapsed_ms() as f64 / 1000.0);
        if self.config.trace {
            eprintln!("sim seed {}: {line}", self.seed);
        }
        if self.events.len() == EVENTS_SHOWN {
            self.events.pop_front();
        }
        self.events.push_back(line);
    }

    /// A failure message: the seed, what broke and what led there.
    fn failure(&self, what: String) -> String {
        let mut text = format!(
            "seed {} ({} nodes): {what}\nlast events:\n",
            self.seed, self.config.nodes
        );
        for line in &self.events {
            text.push_str("  ");
            text.push_str(line);
            text.push('\n');
        }
        text
    }

    fn ids(&self) -> Vec<u64> {
        (1..=self.config.nodes as u64).collect()
    }

    fn down(&self) -> Vec<u64> {
        self.ids()
            .into_iter()
            .filter(|id| !self.live.contains_key(id))
            .collect()
    }

    async fn run(&mut self) -> Result<SimReport, String> {
        self.bootstrap().await?;
        for step in 0..self.config.steps {
            self.step(step).await?;
            self.check_now()?;
            let pause = self.rng.gen_range(0..=self.config.max_pause_ms);
            sleep(Duration::from_millis(pause)).await;
        }
        self.settle().await?;
        self.check_now()?;
        Ok(self.report.clone())
    }

    // --- nodes -------------------------------------------------------------

    fn raft_config(&mut self) -> Result<Arc<openraft::Config>, String> {
        let mut config = raft::config(&format!("sim-{}", self.seed));
        // openraft draws a node's election timeout once, from the thread's
        // RNG, in [min, max): a one-value range makes the draw deterministic,
        // and drawing that value from the seed keeps the nodes' timeouts
        // apart, so that elections do not split forever.
        let spread = config.election_timeout_max - config.election_timeout_min;
        let timeout = config.election_timeout_min + self.rng.gen_range(0..spread);
        config.election_timeout_min = timeout;
        config.election_timeout_max = timeout + 1;
        // Frequent snapshots and purges, so lagging and restarted nodes
        // install snapshots instead of only replaying the log.
        config.snapshot_policy = SnapshotPolicy::LogsSinceLast(self.config.snapshot_every);
        config.max_in_snapshot_log_to_keep = 2;
        config.purge_batch_size = 1;
        let config = config
            .validate()
            .map_err(|error| format!("the Raft config is invalid: {error}"))?;
        Ok(Arc::new(config))
    }

    async fn start_node(&mut self, id: u64) -> Result<(), String> {
        let path = self.dir.join(format!("node-{id}.redb"));
        if self.config.amnesia && self.incarnations.contains_key(&id) {
            let _ = std::fs::remove_file(&path);
        }
        // Tasks of the crashed incarnation (a replication stream inside a
        // delayed message, the state machine worker) let go of the database
        // only when they next run; give them a moment.
        let mut attempts = 0;
        let (log_store, state_machine, reader) = loop {
            match raft::open(&path) {
                Ok(opened) => break opened,
                Err(error) if attempts < 500 => {
                    attempts += 1;
                    if attempts == 1 {
                        self.event(format!("node {id}: database still held ({error}); waiting"));
                    }
                    sleep(Duration::from_millis(10)).await;
                }
                Err(error) => {
                    return Err(self.failure(format!(
                        "node {id} cannot reopen its database after a crash: {error}"
                    )))
                }
            }
        };
        let incarnation = self.incarnations.get(&id).map_or(1, |seen| seen + 1);
        self.incarnations.insert(id, incarnation);
        let config = self.raft_config()?;
        let tick_phase_ms = self.stagger_ticks(&config).await;
        let network = Network {
            router: self.router.clone(),
            me: id,
            incarnation,
        };
        let raft = Raft::new(id, config, network, log_store, state_machine)
            .await
            .map_err(|error| self.failure(format!("node {id}: Raft did not start: {error}")))?;
        self.router
            .lock()
            .members
            .insert(id, (raft.clone(), incarnation));
        let watcher = watch_node(id, reader.clone(), self.oracle.clone());
        self.live.insert(
            id,
            Live {
                raft,
                reader,
                watcher,
                tick_phase_ms,
            },
        );
        Ok(())
    }

    /// Waits a seeded moment before a node's Raft starts, so that its ticks
    /// fall at a phase no other running node ticks at, and returns that phase.
    ///
    /// openraft checks its election timer only on a tick (every 1.5
    /// heartbeat intervals, from when `Raft::new` ran). On real machines no
    /// two processes tick at the same instant, and scheduling jitter moves
    /// each one a little every period. In paused time, nodes started at the
    /// same instant tick at exactly the same instants for the whole run:
    /// two of them whose timeouts round to the same number of ticks then
    /// stand for election at once, every time, which a real cluster never
    /// does. Seed 2000744 was such a run: two nodes with stale logs (3 and
    /// 4) stood together in every round and, each voting for the other,
    /// raised the term a step ahead of node 1, whose up-to-date log they
    /// needed, so node 1 always asked at a term already taken; node 5, also
    /// up to date, never stood, its timer reset by node 1's requests. No
    /// majority formed for the 120 s the probe allows.
    async fn stagger_ticks(&mut self, config: &openraft::Config) -> u64 {
        let period = (config.heartbeat_interval * 3 / 2).max(1);
        let taken: Vec<u64> = self.live.values().map(|node| node.tick_phase_ms).collect();
        let now = self.elapsed_ms();
        let mut wait = self.phase_rng.gen_range(0..period);
        for _ in 0..period {
            if !taken.contains(&((now + wait) % period)) {
                break;
            }
            wait = (wait + 1) % period;
        }
        if wait > 0 {
            sleep(Duration::from_millis(wait)).await;
        }
        self.elapsed_ms() % period
    }

    async fn crash(&mut self, id: u64) -> Result<(), String> {
        let Some(node) = self.live.remove(&id) else {
            return Ok(());
        };
        // Off the network first: nothing it sends from now on arrives.
        self.router.lock().members.remove(&id);
        node.watcher.abort();
        if timeout(Duration::from_secs(60), node.raft.shutdown())
            .await
            .is_err()
        {
            return Err(self.failure(format!("node {id} did not shut down within 60 s")));
        }
        self.report.crashes += 1;
        self.event(format!("crash node {id}"));
        Ok(())
    }

    async fn restart(&mut self, id: u64) -> Result<(), String> {
        self.start_node(id).await?;
        self.report.restarts += 1;
        self.event(format!("restart node {id}"));
        Ok(())
    }

    async fn stop_all(&mut self) {
        let ids: Vec<u64> = self.live.keys().copied().collect();
        for id in ids {
            if let Some(node) = self.live.remove(&id) {
                self.router.lock().members.remove(&id);
                node.watcher.abort();
                let _ = timeout(Duration::from_secs(60), node.raft.shutdown()).await;
            }
        }
    }

    fn metrics(&self, id: u64) -> Option<openraft::RaftMetrics<u64, BasicNode>> {
        self.live
            .get(&id)
            .map(|node| node.raft.metrics().borrow().clone())
    }

    /// Each node's Raft view, for a liveness failure: who it thinks leads,
    /// its vote, and how far its log, commit and snapshot reach.
    fn raft_views(&self) -> String {
        let mut text = String::new();
        for id in self.ids() {
            let Some(m) = self.metrics(id) else {
                text.push_str(&format!("\n  node {id}: down"));
                continue;
            };
            let index = |log_id: Option<openraft::LogId<u64>>| {
                log_id.map_or("-".to_string(), |id| {
                    format!("{}-{}", id.leader_id, id.index)
                })
            };
            text.push_str(&format!(
                "\n  node {id}: {:?}, term {}, vote {}, leader {:?}, last log {}, applied {}, snapshot {}, purged {}, voters {:?}",
                m.state,
                m.current_term,
                m.vote,
                m.current_leader,
                m.last_log_index.map_or("-".to_string(), |i| i.to_string()),
                index(m.last_applied),
                index(m.snapshot),
                index(m.purged),
                m.membership_config.membership().voter_ids().collect::<Vec<_>>(),
            ));
        }
        text
    }

    /// The running node that leads in the highest term, among `among`.
    fn leader_among(&self, among: &[u64]) -> Option<u64> {
        among
            .iter()
            .filter_map(|id| self.metrics(*id).map(|metrics| (*id, metrics)))
            .filter(|(_, metrics)| metrics.state == ServerState::Leader)
            .max_by_key(|(id, metrics)| (metrics.current_term, std::cmp::Reverse(*id)))
            .map(|(id, _)| id)
    }

    /// Where the client sends a write: a node that believes it leads, or
    /// else any running node (which will say who leads, if it knows).
    fn pick_target(&mut self) -> Option<u64> {
        let ids = self.ids();
        if let Some(leader) = self.leader_among(&ids) {
            return Some(leader);
        }
        let running: Vec<u64> = self.live.keys().copied().collect();
        running.choose(&mut self.rng).copied()
    }

    // --- checks ------------------------------------------------------------

    fn check_now(&mut self) -> Result<(), String> {
        if self.router.lock().spinning {
            return Err(self.failure(format!(
                "livelock: over {SPIN_LIMIT} messages were sent without simulated time passing"
            )));
        }
        let ids: Vec<u64> = self.live.keys().copied().collect();
        for id in ids {
            if let Some(metrics) = self.metrics(id) {
                if let Err(fatal) = &metrics.running_state {
                    return Err(
                        self.failure(format!("node {id} stopped with a fatal error: {fatal}"))
                    );
                }
            }
            let node = &self.live[&id];
            let view = node.reader.read();
            let index = view.last_applied();
            lock(&self.oracle).observe(id, index, &view);
        }
        let oracle = lock(&self.oracle);
        if let Some(first) = oracle.violations.first() {
            let more = oracle.violations.len() - 1;
            let text = if more > 0 {
                format!("{first} (and {more} more violations)")
            } else {
                first.clone()
            };
            drop(oracle);
            return Err(self.failure(text));
        }
        Ok(())
    }

    // --- writes ------------------------------------------------------------

    /// Proposes `command` through `via`, following one redirect.
    async fn write(
        &mut self,
        command: Command,
        via: u64,
        wait: Duration,
    ) -> (Outcome, Option<Result<Reply, CommandError>>) {
        self.write_within(command, via, wait, None).await
    }

    /// As [`Self::write`], following a forward to the leader only to a node
    /// in `within` (when given): the client's requests do not go through
    /// the simulated network, so a forward would cross a partition.
    async fn write_within(
        &mut self,
        command: Command,
        via: u64,
        wait: Duration,
        within: Option<&[u64]>,
    ) -> (Outcome, Option<Result<Reply, CommandError>>) {
        let mut target = via;
        for _ in 0..2 {
            let Some(node) = self.live.get(&target) else {
                return (Outcome::NotAppended, None);
            };
            let raft = node.raft.clone();
            let proposal = lock(&self.oracle).propose(&command);
            self.report.proposed += 1;
            let attempt = timeout(wait, raft.client_write(command.clone())).await;
            let (outcome, result) = match attempt {
                Ok(Ok(response)) => (
                    Outcome::Acked {
                        index: response.log_id.index,
                    },
                    Some(response.data.0),
                ),
                Ok(Err(raft::RaftError::APIError(ClientWriteError::ForwardToLeader(forward)))) => {
                    lock(&self.oracle).settle(proposal, Outcome::NotAppended, None);
                    match forward.leader_id {
                        Some(leader)
                            if leader != target
                                && self.live.contains_key(&leader)
                                && within.is_none_or(|nodes| nodes.contains(&leader)) =>
                        {
                            target = leader;
                            continue;
                        }
                        _ => return (Outcome::NotAppended, None),
                    }
                }
                Ok(Err(_)) | Err(_) => (Outcome::Unknown, None),
            };
            lock(&self.oracle).settle(proposal, outcome, result.as_ref());
            match (&outcome, &result) {
                (Outcome::Acked { .. }, Some(Ok(_))) => self.report.acknowledged += 1,
                (Outcome::Acked { .. }, _) => {
                    self.report.acknowledged += 1;
                    self.report.refused += 1;
                }
                (Outcome::Unknown, _) => self.report.unknown += 1,
                _ => {}
            }
            return (outcome, result);
        }
        (Outcome::NotAppended, None)
    }

    /// A write that must be acknowledged within the liveness limit.
    ///
    /// Only an idempotent write is retried after a timeout: another could
    /// be applied twice. Setup writes run on a healthy cluster, where a
    /// timeout is itself a failure; the barrier after healing may first
    /// reach a stale leader (cut off earlier and still leading its old
    /// term), which cannot commit and does not answer.
    async fn must_write(
        &mut self,
        command: Command,
        idempotent: bool,
    ) -> Result<Result<Reply, CommandError>, String> {
        let deadline = Instant::now() + LIVENESS_LIMIT;
        loop {
            if Instant::now() > deadline {
                return Err(self.failure(format!(
                    "{command:?} was not acknowledged within {LIVENESS_LIMIT:?} on a healed cluster; Raft views:{}",
                    self.raft_views()
                )));
            }
            let ids = self.ids();
            if let Some(leader) = self.leader_among(&ids) {
                let wait = Duration::from_millis(self.config.write_timeout_ms);
                match self.write(command.clone(), leader, wait).await {
                    (Outcome::Acked { .. }, Some(result)) => return Ok(result),
                    (Outcome::Unknown, _) if !idempotent => {
                        return Err(
                            self.failure(format!("{command:?} timed out on a healthy cluster"))
                        );
                    }
                    (Outcome::Unknown, _) => {
                        self.event(format!("barrier via node {leader}: no answer; again"));
                    }
                    _ => {}
                }
            }
            sleep(Duration::from_millis(100)).await;
        }
    }

    fn registration(&self, name: &str, zone: &str) -> NodeRegistration {
        NodeRegistration {
            name: NodeName::new(name).expect("simulated node names are valid"),
            api_address: format!("{name}.sim:7070"),
            nbd_address: None,
            data_address: None,
            labels: BTreeMap::from([("zone".to_string(), zone.to_string())]),
        }
    }

    fn pools(&mut self) -> Vec<PoolReport> {
        let mut pools = vec![PoolReport {
            name: PoolName::new("p1").expect("valid"),
            record: PoolRecord {
                class: DeviceClass::Ssd,
                capacity_bytes: TIB,
                free_bytes: self.rng.gen_range(0..TIB),
                online: true,
                reported_ms: self.now_ms(),
            },
        }];
        if self.rng.gen_bool(0.3) {
            pools.push(PoolReport {
                name: PoolName::new("fast").expect("valid"),
                record: PoolRecord {
                    class: DeviceClass::Nvme,
                    capacity_bytes: TIB,
                    free_bytes: self.rng.gen_range(0..TIB),
                    online: self.rng.gen_bool(0.9),
                    reported_ms: self.now_ms(),
                },
            });
        }
        pools
    }

    async fn bootstrap(&mut self) -> Result<(), String> {
        for id in self.ids() {
            self.start_node(id).await?;
        }
        let members: BTreeMap<u64, BasicNode> = self
            .ids()
            .into_iter()
            .map(|id| (id, BasicNode::new(format!("member-{id}.sim:7070"))))
            .collect();
        let first = self.live[&1].raft.clone();
        first
            .initialize(members)
            .await
            .map_err(|error| self.failure(format!("initialize failed: {error}")))?;
        self.event(format!("initialized {} voters", self.config.nodes));

        let command = Command::Bootstrap {
            cluster_id: format!("sim-{}", self.seed),
            join_secret: "sim-secret".into(),
            node: self.registration("member-1", "z1"),
            now_ms: self.now_ms(),
        };
        if let Err(error) = self.must_write(command, false).await? {
            return Err(self.failure(format!("the bootstrap command was refused: {error}")));
        }
        self.client
            .nodes
            .push((NodeId(1), NodeName::new("member-1").expect("valid")));
        for id in 2..=self.config.nodes as u64 {
            let name = format!("member-{id}");
            let command = Command::AddNode {
                node: self.registration(&name, &format!("z{}", id % 3 + 1)),
                nonce: format!("join-{id}"),
                now_ms: self.now_ms(),
            };
            match self.must_write(command, false).await? {
                Ok(Reply::NodeAdded { node }) if node == NodeId(id) => {}
                other => {
                    return Err(self.failure(format!(
                        "member {id} joined as {other:?}; its trireme id should be its Raft id"
                    )))
                }
            }
            self.client
                .nodes
                .push((NodeId(id), NodeName::new(name).expect("valid")));
        }
        for id in self.ids() {
            let pools = self.pools();
            let command = Command::ReportPools {
                node: NodeId(id),
                pools,
            };
            if let Err(error) = self.must_write(command, false).await? {
                return Err(self.failure(format!("pools of member {id} refused: {error}")));
            }
        }
        self.router.lock().stormy = self.rng.gen_bool(0.5);
        self.event("bootstrapped".into());
        self.check_now()
    }

    // --- steps -------------------------------------------------------------

    async fn step(&mut self, step: usize) -> Result<(), String> {
        let roll: f64 = self.rng.gen();
        let c = &self.config;
        let thresholds = [
            c.crash,
            c.crash + c.restart,
            c.crash + c.restart + c.partition,
            c.crash + c.restart + c.partition + c.heal,
            c.crash + c.restart + c.partition + c.heal + c.minority_probe,
            c.crash + c.restart + c.partition + c.heal + c.minority_probe + c.weather,
        ];
        let max_down = (self.config.nodes - 1) / 2;
        if roll < thresholds[0] {
            // Never more than a minority down: with a majority down nothing
            // can commit, which is safe but checks nothing more.
            if self.down().len() < max_down {
                let running: Vec<u64> = self.live.keys().copied().collect();
                let id = *running.choose(&mut self.rng).expect("a majority runs");
                self.crash(id).await?;
            }
        } else if roll < thresholds[1] {
            let down = self.down();
            if let Some(&id) = down.choose(&mut self.rng) {
                self.restart(id).await?;
            }
        } else if roll < thresholds[2] {
            self.partition_randomly();
        } else if roll < thresholds[3] {
            self.router.lock().sides.clear();
            self.event("heal partitions".into());
        } else if roll < thresholds[4] {
            self.minority_probe().await?;
        } else if roll < thresholds[5] {
            let stormy = {
                let mut net = self.router.lock();
                net.stormy = !net.stormy;
                net.stormy
            };
            self.event(format!(
                "network {}",
                if stormy { "stormy" } else { "calm" }
            ));
        } else {
            self.client_step(step).await;
        }
        Ok(())
    }

    fn partition_randomly(&mut self) {
        let mut ids = self.ids();
        ids.shuffle(&mut self.rng);
        let cut = self.rng.gen_range(1..ids.len());
        let (one, other) = ids.split_at(cut);
        {
            let mut net = self.router.lock();
            net.sides.clear();
            for id in one {
                net.sides.insert(*id, 1);
            }
        }
        self.report.partitions += 1;
        self.event(format!("partition {one:?} | {other:?}"));
    }

    async fn client_step(&mut self, step: usize) {
        let command = self.random_command();
        let Some(target) = self.pick_target() else {
            return;
        };
        let shown = describe(&command);
        let wait = Duration::from_millis(self.config.write_timeout_ms);
        let (outcome, result) = self.write(command.clone(), target, wait).await;
        self.learn(&command, &result);
        let how = match (&outcome, &result) {
            (Outcome::Acked { index }, Some(Ok(_))) => format!("ok at {index}"),
            (Outcome::Acked { index }, Some(Err(error))) => format!("refused at {index}: {error}"),
            (Outcome::Acked { index }, None) => format!("acknowledged at {index}"),
            (Outcome::NotAppended, _) => "not appended (no leader)".to_string(),
            (Outcome::Unknown, _) => "no answer".to_string(),
            (Outcome::Pending, _) => "pending".to_string(),
        };
        self.event(format!("step {step}: {shown} via node {target}: {how}"));
    }

    fn learn(&mut self, command: &Command, result: &Option<Result<Reply, CommandError>>) {
        match (command, result) {
            (Command::CreateVolume { name, .. }, Some(Ok(Reply::Volume(record)))) => {
                if let Some(entry) = self
                    .client
                    .volumes
                    .iter_mut()
                    .find(|(known, _)| known == name)
                {
                    entry.1 = Some(record.id);
                }
            }
            (Command::AddNode { node, .. }, Some(Ok(Reply::NodeAdded { node: id }))) => {
                self.client.nodes.push((*id, node.name.clone()));
            }
            (Command::RemoveNode { node }, Some(Ok(_))) => {
                self.client.nodes.retain(|(id, _)| id != node);
            }
            _ => {}
        }
    }

    fn some_volume(&mut self) -> Option<(VolumeName, Option<u64>)> {
        self.client.volumes.choose(&mut self.rng).cloned()
    }

    fn some_node(&mut self) -> NodeId {
        // Now and then an id nobody has.
        if self.rng.gen_bool(0.05) {
            return NodeId(999);
        }
        self.client
            .nodes
            .choose(&mut self.rng)
            .map(|(id, _)| *id)
            .unwrap_or(NodeId(1))
    }

    fn random_command(&mut self) -> Command {
        let now_ms = self.now_ms();
        let roll = self.rng.gen_range(0..100);
        match roll {
            0..=29 => {
                let name = VolumeName::new(self.client.fresh("v")).expect("valid");
                self.client.volumes.push((name.clone(), None));
                let size_bytes = if self.rng.gen_bool(0.03) {
                    0
                } else {
                    self.rng.gen_range(1..=100) * GIB
                };
                let group = if self.rng.gen_bool(0.3) {
                    let mut groups = self.client.groups.clone();
                    groups.push(GroupName::new(DEFAULT_GROUP).expect("valid"));
                    groups.push(GroupName::new("missing").expect("valid"));
                    groups.choose(&mut self.rng).cloned()
                } else {
                    None
                };
                let replicas = self.rng.gen_bool(0.3).then(|| self.rng.gen_range(1..=4));
                let nodes = self.rng.gen_bool(0.1).then(|| {
                    let count = self.rng.gen_range(1..=3);
                    self.client
                        .nodes
                        .choose_multiple(&mut self.rng, count)
                        .map(|(_, name)| name.clone())
                        .collect()
                });
                Command::CreateVolume {
                    name,
                    size_bytes,
                    group,
                    replicas,
                    nodes,
                    pool: None,
                    adopt: None,
                    now_ms,
                }
            }
            30..=39 => match self.some_volume() {
                Some((name, _)) => Command::DeleteVolume {
                    name,
                    with_snapshots: false,
                },
                None => self.random_command(),
            },
            40..=46 => match self.some_volume() {
                Some((name, _)) => Command::GrowVolume {
                    name,
                    size_bytes: self.rng.gen_range(1..=200) * GIB,
                },
                None => self.random_command(),
            },
            47..=52 => {
                let name = GroupName::new(self.client.fresh("g")).expect("valid");
                self.client.groups.push(name.clone());
                let place_count = self.rng.gen_range(1..=4);
                let min_place_count = self.rng.gen_range(1..=place_count);
                let replicas_on_different = if self.rng.gen_bool(0.5) {
                    vec!["zone".to_string()]
                } else {
                    Vec::new()
                };
                Command::CreateGroup {
                    group: ResourceGroup {
                        name,
                        place_count,
                        min_place_count,
                        pools: Vec::new(),
                        class: None,
                        replicas_on_different,
                        diskless_on_remaining: self.rng.gen_bool(0.2),
                        on_no_quorum: QuorumPolicy::IoError,
                    },
                }
            }
            53..=56 => {
                let mut groups = self.client.groups.clone();
                groups.push(GroupName::new(DEFAULT_GROUP).expect("valid"));
                let name = groups.choose(&mut self.rng).cloned().expect("not empty");
                Command::DeleteGroup { name }
            }
            57..=64 => {
                let name = self.client.fresh("fake-");
                let zone = format!("z{}", self.rng.gen_range(1..=4));
                // A replayed join now and then: the state must refuse it.
                let nonce = match self.client.nonces.choose(&mut self.rng) {
                    Some(old) if self.rng.gen_bool(0.1) => old.clone(),
                    _ => {
                        let nonce = self.client.fresh("nonce-");
                        self.client.nonces.push(nonce.clone());
                        nonce
                    }
                };
                Command::AddNode {
                    node: self.registration(&name, &zone),
                    nonce,
                    now_ms,
                }
            }
            65..=72 => {
                let node = self.some_node();
                let pools = self.pools();
                Command::ReportPools { node, pools }
            }
            73..=80 => {
                let node = self.some_node();
                let state = *[NodeState::Online, NodeState::Online, NodeState::Offline]
                    .choose(&mut self.rng)
                    .expect("not empty");
                Command::SetNodeState {
                    node,
                    state,
                    now_ms,
                }
            }
            81..=83 => Command::EvictNode {
                node: self.some_node(),
                now_ms,
            },
            84..=91 => match self.some_volume() {
                Some((volume, Some(volume_id))) => Command::ReportReplica {
                    volume,
                    volume_id,
                    node: self.some_node(),
                    observed: if self.rng.gen_bool(0.9) {
                        ReplicaObserved::Ready
                    } else {
                        ReplicaObserved::Failed("simulated failure".into())
                    },
                    allocated_bytes: self.rng.gen_range(0..GIB),
                    size_bytes: None,
                },
                _ => self.random_command(),
            },
            92..=94 => match self.some_volume() {
                Some((volume, Some(volume_id))) => Command::ReplicaRemoved {
                    volume,
                    volume_id,
                    node: self.some_node(),
                },
                _ => self.random_command(),
            },
            95..=97 => {
                // Fake nodes only: members stay, so placement has room.
                let members = self.config.nodes as u64;
                let fakes: Vec<NodeId> = self
                    .client
                    .nodes
                    .iter()
                    .map(|(id, _)| *id)
                    .filter(|id| id.0 > members)
                    .collect();
                match fakes.choose(&mut self.rng) {
                    Some(&node) => Command::RemoveNode { node },
                    None => self.random_command(),
                }
            }
            _ => Command::SetSettings {
                settings: ClusterSettings {
                    eviction_enabled: self.rng.gen_bool(0.5),
                    eviction_delay_secs: self.rng.gen_range(60..7200),
                    resync_rate_bytes_per_sec: self.rng.gen_range(1..512) << 20,
                },
            },
        }
    }

    // --- the minority probe ------------------------------------------------

    /// Cuts the leader off with a minority and checks that it cannot commit
    /// while the majority side can.
    async fn minority_probe(&mut self) -> Result<(), String> {
        let ids = self.ids();
        let Some(leader) = self.leader_among(&ids) else {
            self.event("minority probe skipped: no leader".into());
            return Ok(());
        };
        let n = self.config.nodes;
        let size = self.rng.gen_range(1..=(n - 1) / 2);
        let mut others: Vec<u64> = ids.iter().copied().filter(|id| *id != leader).collect();
        others.shuffle(&mut self.rng);
        let mut minority: Vec<u64> = vec![leader];
        minority.extend(others.iter().take(size - 1));
        minority.sort_unstable();
        let majority: Vec<u64> = ids
            .iter()
            .copied()
            .filter(|id| !minority.contains(id))
            .collect();
        // The majority side needs a quorum of running nodes.
        for id in majority.clone() {
            if !self.live.contains_key(&id) {
                self.restart(id).await?;
            }
        }
        {
            let mut net = self.router.lock();
            net.sides.clear();
            for id in &minority {
                net.sides.insert(*id, 1);
            }
        }
        self.report.partitions += 1;
        self.event(format!(
            "minority probe: leader {leader} cut off with {minority:?} | {majority:?}"
        ));

        let name = VolumeName::new(self.client.fresh("minority-")).expect("valid");
        lock(&self.oracle).never.push(name.clone());
        let command = Command::CreateVolume {
            name: name.clone(),
            size_bytes: GIB,
            group: None,
            replicas: Some(1),
            nodes: None,
            pool: None,
            adopt: None,
            now_ms: self.now_ms(),
        };
        let wait = Duration::from_millis(self.config.write_timeout_ms);
        // The node that led a moment ago may have lost its leadership while
        // the majority side restarted: a forward to the new leader, on the
        // majority side, would commit there (and prove nothing).
        let (outcome, _) = self
            .write_within(command, leader, wait, Some(&minority))
            .await;
        if let Outcome::Acked { index } = outcome {
            return Err(self.failure(format!(
                "a minority committed: leader {leader}, cut off with {minority:?}, acknowledged a write at index {index}"
            )));
        }
        self.event(format!(
            "minority probe: {name} on leader {leader}: {outcome:?}"
        ));

        let deadline = Instant::now() + LIVENESS_LIMIT;
        loop {
            if Instant::now() > deadline {
                return Err(self.failure(format!(
                    "the majority {majority:?} did not commit within {LIVENESS_LIMIT:?} after leader {leader} was cut off; Raft views:{}",
                    self.raft_views()
                )));
            }
            if let Some(new_leader) = self.leader_among(&majority) {
                let name = VolumeName::new(self.client.fresh("v")).expect("valid");
                self.client.volumes.push((name.clone(), None));
                let command = Command::CreateVolume {
                    name,
                    size_bytes: GIB,
                    group: None,
                    replicas: None,
                    nodes: None,
                    pool: None,
                    adopt: None,
                    now_ms: self.now_ms(),
                };
                let (outcome, result) = self.write(command.clone(), new_leader, wait).await;
                self.learn(&command, &result);
                if let Outcome::Acked { index } = outcome {
                    self.event(format!(
                        "minority probe: majority leader {new_leader} committed at {index}"
                    ));
                    break;
                }
            }
            sleep(Duration::from_millis(200)).await;
        }
        self.report.minority_probes += 1;
        Ok(())
    }

    // --- settling ----------------------------------------------------------

    /// What the leader's loop does once the cluster is healed: a
    /// `RestorePlacement` for every volume the state lists, until it lists
    /// none. Each round must change something, so a few rounds suffice.
    async fn restore_placements(&mut self) -> Result<(), String> {
        const ROUNDS: usize = 16;
        let deadline = Instant::now() + LIVENESS_LIMIT;
        let mut rounds = 0;
        while rounds < ROUNDS {
            let ids = self.ids();
            let Some(leader) = self.leader_among(&ids) else {
                if Instant::now() > deadline {
                    return Err(self.failure(format!(
                        "no leader within {LIVENESS_LIMIT:?} to restore placements; Raft views:{}",
                        self.raft_views()
                    )));
                }
                sleep(Duration::from_millis(100)).await;
                continue;
            };
            rounds += 1;
            let names = self.live[&leader].reader.snapshot().placements_to_restore();
            if names.is_empty() {
                return Ok(());
            }
            for name in names {
                let command = Command::RestorePlacement { name: name.clone() };
                match self.must_write(command, true).await? {
                    Ok(Reply::Volume(record)) => {
                        self.report.placements_restored += 1;
                        self.event(format!(
                            "restored the placement of {name}: {:?}",
                            record.placement()
                        ));
                    }
                    Ok(reply) => self.event(format!(
                        "restoring the placement of {name} changed nothing: {reply:?}"
                    )),
                    Err(error) => {
                        return Err(self.failure(format!(
                            "restoring the placement of {name} was refused: {error}"
                        )))
                    }
                }
            }
        }
        Err(self.failure(format!(
            "placements were still to restore after {ROUNDS} rounds"
        )))
    }

    async fn settle(&mut self) -> Result<(), String> {
        {
            let mut net = self.router.lock();
            net.sides.clear();
            net.stormy = false;
        }
        for id in self.down() {
            self.restart(id).await?;
        }
        self.event("settle: healed, every node running".into());
        // The barrier changes nothing (a removal report about no volume) but
        // takes a log index: once it is applied everywhere, so is all before.
        let barrier = Command::ReplicaRemoved {
            volume: VolumeName::new("barrier").expect("valid"),
            volume_id: 0,
            node: NodeId(1),
        };
        if let Err(error) = self.must_write(barrier, true).await? {
            return Err(self.failure(format!("the barrier was refused: {error}")));
        }
        self.restore_placements().await?;

        let ids = self.ids();
        let deadline = Instant::now() + LIVENESS_LIMIT;
        loop {
            self.check_now()?;
            let target = self
                .leader_among(&ids)
                .and_then(|leader| self.metrics(leader))
                .and_then(|metrics| metrics.last_log_index);
            let applied: Vec<(u64, u64)> = ids
                .iter()
                .map(|id| (*id, self.live[id].reader.read().last_applied()))
                .collect();
            if let Some(target) = target {
                if applied.iter().all(|(_, index)| *index == target) {
                    break;
                }
            }
            if Instant::now() > deadline {
                return Err(self.failure(format!(
                    "the nodes did not converge within {LIVENESS_LIMIT:?} after healing: leader log ends at {target:?}, applied {applied:?}"
                )));
            }
            sleep(Duration::from_millis(100)).await;
        }

        let states: Vec<(u64, ClusterState)> = ids
            .iter()
            .map(|id| (*id, self.live[id].reader.snapshot()))
            .collect();
        let (_, reference) = &states[0];
        for (id, state) in &states[1..] {
            if state != reference {
                let difference = first_difference(
                    &serde_json::to_string(reference).expect("serialises"),
                    &serde_json::to_string(state).expect("serialises"),
                );
                return Err(self.failure(format!(
                    "after converging to the same index, nodes 1 and {id} differ; {difference}"
                )));
            }
        }
        if let Err(broken) = placements_restored(reference) {
            return Err(self.failure(format!("after restoring placements: {broken}")));
        }
        let final_applied = self.live[&1].reader.read().last_applied();
        let last_acked = lock(&self.oracle).acked.keys().next_back().copied();
        if let Some(last) = last_acked {
            if last > final_applied {
                return Err(self.failure(format!(
                    "a write was acknowledged at index {last}, past the converged index {final_applied}"
                )));
            }
        }
        let final_term = ids
            .iter()
            .filter_map(|id| self.metrics(*id))
            .map(|metrics| metrics.current_term)
            .max()
            .unwrap_or(0);
        let json = serde_json::to_string(reference).expect("serialises");
        let (messages, lost, delayed, snapshots) = {
            let net = self.router.lock();
            (net.messages, net.lost, net.delayed, net.snapshots)
        };
        self.report.final_applied = final_applied;
        self.report.final_term = final_term;
        self.report.state_hash = fnv1a(json.as_bytes());
        self.report.volumes = reference.volumes.len();
        self.report.indexes_checked = lock(&self.oracle).seen.len();
        self.report.messages = messages;
        self.report.messages_lost = lost;
        self.report.messages_delayed = delayed;
        self.report.snapshots_sent = snapshots;
        self.report.sim_time_ms = self.elapsed_ms();
        self.event(format!(
            "settled at index {final_applied}, term {final_term}, {} volumes",
            reference.volumes.len()
        ));
        Ok(())
    }
}

/// Checks that every volume of `state` has what the restoring rules say it
/// should, with each rule derived here from the state itself (not from the
/// function the leader uses), so a repair that stops early is caught.
fn placements_restored(state: &ClusterState) -> Result<(), String> {
    let usable = |node: &NodeId| {
        state
            .nodes
            .get(node)
            .is_some_and(|record| record.state == NodeState::Online)
    };
    let evicted = |node: &NodeId| {
        state
            .nodes
            .get(node)
            .is_some_and(|record| record.state == NodeState::Evicted)
    };
    for volume in state.volumes.values() {
        if volume.deleting || volume.rollback.is_some() {
            continue;
        }
        let name = &volume.name;
        let diskful: Vec<NodeId> = volume.diskful().map(|replica| replica.node).collect();
        let tiebreaker = volume
            .replicas
            .iter()
            .find(|replica| replica.kind == ReplicaKind::Tiebreaker)
            .map(|replica| replica.node);
        let in_sync = diskful
            .iter()
            .filter(|node| volume.is_in_sync(**node))
            .count();
        let free: Vec<NodeId> = state
            .nodes
            .keys()
            .filter(|node| usable(node) && !diskful.contains(node))
            .copied()
            .collect();
        if diskful.len().is_multiple_of(2) {
            let missing = tiebreaker.is_none_or(|node| evicted(&node));
            if missing && !free.is_empty() {
                return Err(format!(
                    "volume {name} has {} diskful replicas and tiebreaker {tiebreaker:?}, though nodes {free:?} could be its tiebreaker",
                    diskful.len()
                ));
            }
        } else if tiebreaker.is_some() && in_sync > diskful.len() / 2 {
            return Err(format!(
                "volume {name} has {} diskful replicas and still a tiebreaker ({tiebreaker:?})",
                diskful.len()
            ));
        }
        let group = state.groups.get(&volume.group);
        let unconstrained = group.is_some_and(|group| {
            group.replicas_on_different.is_empty()
                && group.pools.is_empty()
                && group.class.is_none()
        });
        let with_pool: Vec<NodeId> = free
            .iter()
            .filter(|node| state.nodes[*node].pools.values().any(|pool| pool.online))
            .copied()
            .collect();
        // An empty replica does not count for the quorum: only where the
        // up-to-date ones stay a majority without it (tiebreakers aside).
        let short = diskful.len() < volume.replica_target.min(MAX_PLACE_COUNT)
            && in_sync > diskful.len().div_ceil(2);
        let in_sync_kept = diskful
            .iter()
            .filter(|node| volume.is_in_sync(**node) && !evicted(node))
            .count();
        let stranded = diskful.iter().any(&evicted)
            && in_sync_kept > diskful.len() / 2
            && volume.diskful().any(|replica| {
                !evicted(&replica.node)
                    && volume.is_in_sync(replica.node)
                    && replica.observed == ReplicaObserved::Ready
            });
        if unconstrained && !with_pool.is_empty() && (short || stranded) {
            return Err(format!(
                "volume {name} has diskful replicas on {diskful:?} (target {}, evicted ones stranded: {stranded}), though nodes {with_pool:?} have pools",
                volume.replica_target
            ));
        }
    }
    Ok(())
}

/// A short description of a command for the event log.
fn describe(command: &Command) -> String {
    match command {
        Command::CreateVolume {
            name,
            size_bytes,
            group,
            replicas,
            nodes,
            ..
        } => format!(
            "create {name} ({} GiB, group {group:?}, replicas {replicas:?}, nodes {nodes:?})",
            size_bytes / GIB
        ),
        Command::DeleteVolume {
            name,
            with_snapshots,
        } => format!("delete {name} (with snapshots: {with_snapshots})"),
        Command::GrowVolume { name, size_bytes } => {
            format!("grow {name} to {} GiB", size_bytes / GIB)
        }
        Command::CreateGroup { group } => format!(
            "create group {} (place {}..{}, spread {:?})",
            group.name, group.min_place_count, group.place_count, group.replicas_on_different
        ),
        Command::DeleteGroup { name } => format!("delete group {name}"),
        Command::ModifyGroup { group } => format!("modify group {}", group.name),
        Command::SetNodeLabels { node, labels } => format!("node {node} labels {labels:?}"),
        Command::AddNode { node, nonce, .. } => format!("add node {} (nonce {nonce})", node.name),
        Command::RemoveNode { node } => format!("remove node {node}"),
        Command::SetNodeState { node, state, .. } => {
            format!("node {node} {}", state.as_str())
        }
        Command::ReportPools { node, pools } => {
            format!("node {node} reports {} pools", pools.len())
        }
        Command::EvictNode { node, .. } => format!("evict node {node}"),
        Command::ReportReplica {
            volume,
            node,
            observed,
            ..
        } => format!("node {node} reports {volume} {observed:?}"),
        Command::ReplicaRemoved { volume, node, .. } => {
            format!("node {node} removed its replica of {volume}")
        }
        Command::SetSettings { settings } => format!("settings {settings:?}"),
        Command::Bootstrap { cluster_id, .. } => format!("bootstrap {cluster_id}"),
        Command::SetDataAddress { node, data_address } => {
            format!("node {node} data address {data_address:?}")
        }
        Command::StartResync { name, node, .. } => {
            format!("node {node} starts a resync of detached {name}")
        }
        Command::EndResync {
            name,
            node,
            generation,
        } => format!("node {node} ends its resync of {name} at {generation}"),
        Command::AttachVolume {
            name,
            node,
            allow_two_primaries,
            ..
        } => format!("attach {name} on node {node} (two primaries: {allow_two_primaries})"),
        Command::ReattachVolume { name, node, .. } => format!("reattach {name} on node {node}"),
        Command::DetachVolume { name, node } => format!("detach {name} from {node:?}"),
        Command::MarkOutdated {
            name,
            generation,
            node,
            by,
        } => format!("node {by} marks {name} on node {node} outdated (generation {generation})"),
        Command::MarkInSync {
            name,
            generation,
            node,
            by,
        } => format!("node {by} marks {name} on node {node} in sync (generation {generation})"),
        Command::ReportSync {
            name,
            node,
            progress,
        } => format!("resync of {name} on node {node}: {progress:?}"),
        Command::AddReplica {
            name, node, pool, ..
        } => format!("add a replica of {name} (node {node:?}, pool {pool:?})"),
        Command::RemoveReplica { name, node } => {
            format!("remove the replica of {name} on node {node}")
        }
        Command::RestorePlacement { name } => format!("restore the placement of {name}"),
        Command::CreateSnapshot { volume, name, .. } => format!("snapshot {volume}@{name}"),
        Command::ReportSnapshot {
            volume,
            id,
            from,
            holders,
            error,
        } => format!("node {from} took snapshot {id} of {volume} on {holders:?} ({error:?})"),
        Command::DeleteSnapshot { volume, name } => format!("delete snapshot {volume}@{name}"),
        Command::SnapshotRemoved { volume, id, node } => {
            format!("node {node} removed snapshot {id} of {volume}")
        }
        Command::ReportSnapshotSpace { volume, spaces } => {
            format!("space of {} snapshots of {volume}", spaces.len())
        }
        Command::RollbackVolume { volume, snapshot } => {
            format!("roll {volume} back to {snapshot}")
        }
        Command::RolledBack {
            volume,
            node,
            snapshot,
        } => format!("node {node} rolled {volume} back to snapshot {snapshot}"),
        Command::SetSnapshotSchedule {
            volume, schedule, ..
        } => format!("snapshot schedule of {volume}: {schedule:?}"),
        Command::ReportFenced {
            volume,
            node,
            generation,
        } => format!("node {node} fenced {volume} at generation {generation}"),
        Command::CloneVolume {
            name,
            source,
            snapshot,
            ..
        } => format!("clone {source}@{snapshot} as {name}"),
        Command::Attributed { actor, command, .. } => {
            format!("{} (by {actor:?})", describe(command))
        }
        Command::RecordEvent { event } => format!("event {:?}: {}", event.kind, event.message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_validation_refuses_nonsense() {
        assert!(SimConfig::default().validate().is_ok());
        let two = SimConfig {
            nodes: 2,
            ..SimConfig::default()
        };
        assert!(two.validate().is_err());
        let too_likely = SimConfig {
            crash: 0.9,
            restart: 0.9,
            ..SimConfig::default()
        };
        assert!(too_likely.validate().is_err());
    }

    #[test]
    fn first_difference_points_at_the_change() {
        let text = first_difference("{\"a\":1,\"b\":2}", "{\"a\":1,\"b\":3}");
        assert!(text.contains("byte 11"), "{text}");
    }
}
