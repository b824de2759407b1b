//! Runs a [`Primary`] under tokio: one task per attached volume that feeds
//! it events (client requests, replies from the links, control-plane
//! views, ticks) and carries out its actions (link traffic, persisting
//! dirty maps, control-plane proposals, completions).
//!
//! Links: to a peer, a TCP connection to its data listener, with a writer
//! task (batching frames into one socket write) and a reader task; to this
//! node's own copy, an in-process [`LocalLink`] that runs the same replica
//! code, so the local copy follows exactly the rules of the others.
//! A link has an epoch; anything from an older epoch is ignored, so a
//! message of a closed link can never be mistaken for one of its successor.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncWrite, AsyncWriteExt, BufReader};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use trireme_control::{
    Command, CommandError, QuorumPolicy, ReplicaKind, SyncProgress as ControlProgress, VolumeRecord,
};
use trireme_replication::{
    Action, ClientError, ClientRequest, Completion, Config, DirtyMap, FromReplica, NoQuorumPolicy,
    Primary, Proposal, ProposalResult, ToReplica, VerifyReport, VerifyState, View,
};
use trireme_store::Volume;
use trireme_types::{Generation, NodeId, VolumeName};

use super::local::LocalLink;
use super::serve::ReplicaService;
use super::wire::{push_frame, read_frame_async, LinkOpen};
use super::ReplicationMeta;
use crate::cluster::{auth, Cluster, ClusterError};

/// How often the engine's clock ticks (timeouts, resync pacing, progress).
const TICK: Duration = Duration::from_millis(100);
/// Wait before reconnecting a link that failed or closed.
const RECONNECT_DELAY: Duration = Duration::from_millis(500);
/// A link that keeps failing (a node down, a replica not created yet) is
/// retried ever less often, up to this.
const RECONNECT_DELAY_MAX: Duration = Duration::from_secs(4);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Frames gathered into one socket write at most.
const WRITE_BATCH_BYTES: usize = 1 << 20;
/// How long a stopping engine's links get to deliver what is queued (the
/// goodbyes of a clean detach).
const GOODBYE_GRACE: Duration = Duration::from_secs(2);

/// Where a client request's outcome goes.
pub(crate) enum Reply {
    /// A caller blocked on a thread waits for it.
    Waiting(oneshot::Sender<Result<Completion, ClientError>>),
    /// Called on the engine's task (it must not block): the NBD server's
    /// completion, which queues the reply to its connection.
    Callback(Box<dyn FnOnce(Result<Completion, ClientError>) + Send>),
}

impl Reply {
    fn send(self, result: Result<Completion, ClientError>) {
        match self {
            Reply::Waiting(sender) => {
                let _ = sender.send(result);
            }
            Reply::Callback(callback) => callback(result),
        }
    }
}

pub(crate) enum Input {
    Client(ClientRequest, Reply),
    Message(NodeId, u64, FromReplica),
    LinkUp(NodeId, u64, LinkSender),
    LinkDown(NodeId, u64),
    Reconnect(NodeId, u64),
    View(Option<VolumeRecord>),
    /// The cluster's resync rate changed (bytes per second).
    ResyncRate(u64),
    /// Start a `verify` (or join the running one); answers its report.
    StartVerify(oneshot::Sender<Result<VerifyReport, String>>),
    /// The running or last verify's report.
    VerifyStatus(oneshot::Sender<Option<VerifyReport>>),
    /// The node stops: detach cleanly (final flush, goodbye), so that the
    /// copies need no reconciliation or resync when it comes back.
    Shutdown,
    Persisted(u64),
    Proposal(u64, ProposalResult),
}

/// What the rest of the node holds of a running engine.
pub struct EngineHandle {
    pub volume: VolumeName,
    pub generation: Generation,
    pub size_bytes: u64,
    inputs: mpsc::UnboundedSender<Input>,
    /// This node's copy, when it holds one.
    pub(crate) local: Option<Arc<Volume>>,
    /// Reads may go straight to `local` (it is up to date and linked).
    pub(crate) local_readable: Arc<AtomicBool>,
    stopped: Arc<AtomicBool>,
}

impl EngineHandle {
    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Starts a clean detach for the node's shutdown; `is_stopped` turns
    /// true once every replica has been flushed and told goodbye.
    pub fn shut_down(&self) {
        let _ = self.inputs.send(Input::Shutdown);
    }

    /// Starts comparing the volume's up-to-date replicas (see
    /// `trireme_replication::primary::verify`), or joins the running verify.
    pub async fn start_verify(&self) -> Result<VerifyReport, String> {
        let (sender, receiver) = oneshot::channel();
        if self.inputs.send(Input::StartVerify(sender)).is_err() {
            return Err("the volume's engine stopped".into());
        }
        receiver
            .await
            .unwrap_or_else(|_| Err("the volume's engine stopped".into()))
    }

    /// The running or last verify's report, if any ran.
    pub async fn verify_report(&self) -> Result<Option<VerifyReport>, String> {
        let (sender, receiver) = oneshot::channel();
        if self.inputs.send(Input::VerifyStatus(sender)).is_err() {
            return Err("the volume's engine stopped".into());
        }
        receiver
            .await
            .map_err(|_| "the volume's engine stopped".to_string())
    }

    /// Hands one request to the engine; `done` runs on the engine's task
    /// when it completes (or at once, with `ShuttingDown`, if the engine is
    /// gone).
    pub fn submit(
        &self,
        request: ClientRequest,
        done: Box<dyn FnOnce(Result<Completion, ClientError>) + Send>,
    ) {
        if let Err(error) = self
            .inputs
            .send(Input::Client(request, Reply::Callback(done)))
        {
            if let Input::Client(_, reply) = error.0 {
                reply.send(Err(ClientError::ShuttingDown));
            }
        }
    }

    /// Runs one request through the engine and waits for it (blocking: the
    /// NBD server calls targets on its I/O threads).
    pub fn call(&self, request: ClientRequest) -> Result<Completion, ClientError> {
        let (sender, receiver) = oneshot::channel();
        if self
            .inputs
            .send(Input::Client(request, Reply::Waiting(sender)))
            .is_err()
        {
            return Err(ClientError::ShuttingDown);
        }
        receiver
            .blocking_recv()
            .unwrap_or(Err(ClientError::ShuttingDown))
    }
}

pub(crate) struct EngineStart {
    pub cluster: Arc<Cluster>,
    pub replicas: Arc<ReplicaService>,
    pub meta: Arc<ReplicationMeta>,
    pub record: VolumeRecord,
    pub policy: QuorumPolicy,
    pub resync_rate: u64,
    pub local: Option<Arc<Volume>>,
}

/// The control plane's record as the engine's view.
pub(crate) fn view_of(record: &VolumeRecord) -> View {
    View {
        generation: record.generation,
        primaries: record.primaries.iter().map(|p| p.node).collect(),
        diskful: record.diskful().map(|r| r.node).collect(),
        tiebreakers: record
            .replicas
            .iter()
            .filter(|r| r.kind == ReplicaKind::Tiebreaker)
            .map(|r| r.node)
            .collect(),
        in_sync: record.in_sync.clone(),
    }
}

pub(crate) fn start(start: EngineStart) -> Result<Arc<EngineHandle>, crate::NodeError> {
    let me = start.cluster.node_id();
    let record = start.record;
    let dirty_maps: BTreeMap<NodeId, DirtyMap> = start.meta.dirty_maps(&record.name)?;
    let config = Config {
        me,
        size_bytes: record.size_bytes,
        view: view_of(&record),
        policy: match start.policy {
            QuorumPolicy::IoError => NoQuorumPolicy::IoError,
            QuorumPolicy::Suspend => NoQuorumPolicy::Suspend,
        },
        resync_rate: start.resync_rate,
        dirty_maps,
    };
    let epoch_start = Instant::now();
    let primary = Primary::new(config, 0);
    let (inputs, receiver) = mpsc::unbounded_channel();
    let local_readable = Arc::new(AtomicBool::new(false));
    let stopped = Arc::new(AtomicBool::new(false));
    let handle = Arc::new(EngineHandle {
        volume: record.name.clone(),
        generation: record.generation,
        size_bytes: record.size_bytes,
        inputs: inputs.clone(),
        local: start.local.clone(),
        local_readable: local_readable.clone(),
        stopped: stopped.clone(),
    });
    let persister = spawn_persister(start.meta.clone(), record.name.clone(), inputs.clone());
    let driver = Driver {
        primary,
        me,
        volume: record.name.clone(),
        generation: record.generation,
        cluster: start.cluster.clone(),
        replicas: start.replicas,
        local: start.local,
        inputs: inputs.clone(),
        links: BTreeMap::new(),
        ops: BTreeMap::new(),
        next_op: 1,
        persister,
        local_readable,
        started: epoch_start,
        joining: BTreeMap::new(),
        reconnect_delays: BTreeMap::new(),
        verify_logged: None,
        logged: Default::default(),
    };
    spawn_view_watch(start.cluster, record.name.clone(), inputs.clone());
    tracing::info!(volume = %record.name, generation = %record.generation, "primary engine starting");
    tokio::spawn(driver.run(receiver, stopped));
    Ok(handle)
}

/// Where a link's messages go: a peer's socket (through the link's writer
/// task), or this node's own copy, in-process.
pub(crate) enum LinkSender {
    Remote(mpsc::UnboundedSender<ToReplica>),
    Local(LocalLink),
}

struct LinkSlot {
    epoch: u64,
    sender: Option<LinkSender>,
    tasks: Vec<JoinHandle<()>>,
}

impl LinkSlot {
    fn close(&mut self) {
        self.sender = None;
        for task in self.tasks.drain(..) {
            task.abort();
        }
    }
}

struct Driver {
    primary: Primary,
    me: NodeId,
    volume: VolumeName,
    generation: Generation,
    cluster: Arc<Cluster>,
    replicas: Arc<ReplicaService>,
    local: Option<Arc<Volume>>,
    inputs: mpsc::UnboundedSender<Input>,
    links: BTreeMap<NodeId, LinkSlot>,
    ops: BTreeMap<u64, Reply>,
    next_op: u64,
    persister: mpsc::UnboundedSender<PersistJob>,
    local_readable: Arc<AtomicBool>,
    started: Instant,
    /// MarkInSync proposals in flight: id → node.
    joining: BTreeMap<u64, NodeId>,
    /// The next reconnect delay per peer: doubled on each failure, reset
    /// when a link comes up.
    reconnect_delays: BTreeMap<NodeId, Duration>,
    /// The end of the last verify already logged.
    verify_logged: Option<u64>,
    /// Counters already logged.
    logged: trireme_replication::primary::Counters,
}

impl Driver {
    fn now(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    async fn run(mut self, mut receiver: mpsc::UnboundedReceiver<Input>, stopped: Arc<AtomicBool>) {
        let mut ticker = tokio::time::interval(TICK);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        self.execute();
        loop {
            tokio::select! {
                input = receiver.recv() => {
                    let Some(input) = input else { break };
                    self.handle(input);
                    // Drain what else is ready before acting: one batch of
                    // actions (and of socket writes) serves many requests.
                    let mut budget = 256;
                    while budget > 0 {
                        match receiver.try_recv() {
                            Ok(input) => self.handle(input),
                            Err(_) => break,
                        }
                        budget -= 1;
                    }
                }
                _ = ticker.tick() => {
                    let now = self.now();
                    self.primary.tick(now);
                }
            }
            self.execute();
            if self.primary.is_stopped() {
                break;
            }
        }
        self.local_readable.store(false, Ordering::Release);
        for (_, reply) in std::mem::take(&mut self.ops) {
            reply.send(Err(ClientError::ShuttingDown));
        }
        // Writers send what is queued (a detach's goodbyes) and then end,
        // each reporting its link down; a peer that does not take it
        // within the grace is cut.
        let mut open = std::collections::BTreeSet::new();
        for (&node, slot) in self.links.iter_mut() {
            if slot.sender.take().is_some() {
                open.insert((node, slot.epoch));
            }
        }
        let deadline = tokio::time::Instant::now() + GOODBYE_GRACE;
        while !open.is_empty() {
            match tokio::time::timeout_at(deadline, receiver.recv()).await {
                Ok(Some(Input::LinkDown(node, epoch))) => {
                    open.remove(&(node, epoch));
                }
                Ok(Some(Input::Client(_, reply))) => {
                    reply.send(Err(ClientError::ShuttingDown));
                }
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        for (_, slot) in self.links.iter_mut() {
            slot.close();
        }
        stopped.store(true, Ordering::Release);
        // Requests that raced with the stop.
        receiver.close();
        while let Ok(input) = receiver.try_recv() {
            if let Input::Client(_, reply) = input {
                reply.send(Err(ClientError::ShuttingDown));
            }
        }
        tracing::info!(volume = %self.volume, generation = %self.generation, "primary engine stopped");
    }

    fn handle(&mut self, input: Input) {
        let now = self.now();
        match input {
            Input::Client(request, reply) => {
                let op = self.next_op;
                self.next_op += 1;
                self.ops.insert(op, reply);
                self.primary.client(op, request, now);
            }
            Input::Message(node, epoch, message) => {
                if self.current(node, epoch) {
                    self.primary.message(node, message, now);
                }
            }
            Input::LinkUp(node, epoch, sender) => {
                if let Some(slot) = self.links.get_mut(&node) {
                    if slot.epoch == epoch {
                        slot.sender = Some(sender);
                        self.reconnect_delays.remove(&node);
                        self.primary.link_up(node, now);
                    }
                }
            }
            Input::LinkDown(node, epoch) => {
                if self.current(node, epoch) {
                    let slot = self.links.get_mut(&node).expect("current");
                    slot.close();
                    self.primary.link_down(node, now);
                    self.schedule_reconnect(node, epoch);
                }
            }
            Input::Reconnect(node, epoch) => {
                if self.current(node, epoch) {
                    self.connect(node);
                }
            }
            Input::View(record) => match record {
                None => self.primary.stop("the volume was deleted".into()),
                Some(record) if record.deleting => {
                    self.primary.stop("the volume is being deleted".into())
                }
                Some(record) => {
                    let view = view_of(&record);
                    if view.generation == self.primary.generation()
                        && !view.primaries.contains(&self.me)
                    {
                        self.primary.detach(now);
                    } else {
                        self.primary.view(view, now);
                    }
                }
            },
            Input::ResyncRate(rate) => {
                if rate != self.primary.resync_rate() {
                    tracing::info!(volume = %self.volume, rate_bytes_per_sec = rate, "resync rate changed");
                    self.primary.set_resync_rate(rate);
                }
            }
            Input::Shutdown => self.primary.detach(now),
            Input::StartVerify(sender) => {
                let result = self
                    .primary
                    .start_verify(now)
                    .map(|()| self.primary.verify_report().cloned().expect("started"));
                if result.is_ok() {
                    tracing::info!(volume = %self.volume, "verify started");
                }
                let _ = sender.send(result);
            }
            Input::VerifyStatus(sender) => {
                let _ = sender.send(self.primary.verify_report().cloned());
            }
            Input::Persisted(token) => self.primary.persisted(token, now),
            Input::Proposal(id, result) => {
                if let Some(node) = self.joining.remove(&id) {
                    if result == ProposalResult::Committed {
                        let total = self.primary.counters.resynced_bytes;
                        tracing::info!(
                            volume = %self.volume,
                            %node,
                            "resync done: copied {} bytes; the replica is in sync",
                            total - self.logged.resynced_bytes
                        );
                        self.logged.resynced_bytes = total;
                    }
                }
                self.primary.proposal_result(id, result, now)
            }
        }
    }

    fn current(&self, node: NodeId, epoch: u64) -> bool {
        self.links
            .get(&node)
            .is_some_and(|slot| slot.epoch == epoch)
    }

    fn schedule_reconnect(&mut self, node: NodeId, epoch: u64) {
        let delay = self
            .reconnect_delays
            .get(&node)
            .copied()
            .unwrap_or(RECONNECT_DELAY);
        self.reconnect_delays
            .insert(node, (delay * 2).min(RECONNECT_DELAY_MAX));
        let inputs = self.inputs.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = inputs.send(Input::Reconnect(node, epoch));
        });
    }

    fn execute(&mut self) {
        loop {
            let actions = self.primary.take_actions();
            if actions.is_empty() {
                let repaired = self.primary.counters.repaired_blocks;
                if repaired > self.logged.repaired_blocks {
                    tracing::warn!(
                        volume = %self.volume,
                        "repaired {} blocks that failed their checksum, from a peer's copy",
                        repaired - self.logged.repaired_blocks
                    );
                    self.logged.repaired_blocks = repaired;
                }
                self.log_verify_end();
                return;
            }
            for action in actions {
                self.act(action);
            }
        }
    }

    /// One line when a verify ends, with what it found.
    fn log_verify_end(&mut self) {
        let Some(report) = self.primary.verify_report() else {
            return;
        };
        if report.finished_ms == 0 || self.verify_logged == Some(report.finished_ms) {
            return;
        }
        self.verify_logged = Some(report.finished_ms);
        let repaired: u64 = report.repaired.values().sum();
        match &report.state {
            VerifyState::Aborted(reason) => {
                tracing::warn!(volume = %self.volume, %reason, "verify stopped before the end");
            }
            _ if report.differing_blocks == 0 && report.skipped_bytes == 0 => {
                tracing::info!(volume = %self.volume, checked_bytes = report.checked_bytes, "verify done: every replica is identical");
            }
            _ => tracing::warn!(
                volume = %self.volume,
                differing_blocks = report.differing_blocks,
                rewritten_blocks = repaired,
                no_majority_blocks = report.no_majority_blocks,
                unrecoverable_blocks = report.unrecoverable_blocks,
                skipped_bytes = report.skipped_bytes,
                "verify done: replicas differed"
            ),
        }
    }

    fn act(&mut self, action: Action) {
        {
            match action {
                Action::Connect { to } => self.connect(to),
                Action::Send { to, message } => {
                    match self.links.get(&to).and_then(|slot| slot.sender.as_ref()) {
                        Some(LinkSender::Remote(sender)) => {
                            let _ = sender.send(message);
                        }
                        Some(LinkSender::Local(local)) => {
                            if let Some((reply, close)) = local.send(message) {
                                self.local_outcome(to, reply, close);
                            }
                        }
                        None => {}
                    }
                }
                Action::Reset { to } => {
                    if let Some(slot) = self.links.get_mut(&to) {
                        slot.close();
                        slot.epoch += 1;
                        let epoch = slot.epoch;
                        let now = self.now();
                        self.primary.link_down(to, now);
                        self.schedule_reconnect(to, epoch);
                    }
                }
                Action::Complete { op, result } => {
                    if let Some(reply) = self.ops.remove(&op) {
                        reply.send(result);
                    }
                }
                Action::Propose { id, proposal } => {
                    if let Proposal::MarkInSync { node } = proposal {
                        self.joining.insert(id, node);
                    }
                    self.propose(id, proposal)
                }
                Action::PersistDirty { token, peer, map } => {
                    let _ = self.persister.send(PersistJob {
                        token: Some(token),
                        peer,
                        map: Some(map),
                    });
                }
                Action::ForgetDirty { peer } => {
                    let _ = self.persister.send(PersistJob {
                        token: None,
                        peer,
                        map: None,
                    });
                }
                Action::LocalReadable(readable) => {
                    self.local_readable.store(readable, Ordering::Release);
                }
                Action::Stopped { reason } => {
                    tracing::info!(volume = %self.volume, %reason, "primary engine stops");
                }
                Action::SnapshotDone { snapshot, result } => {
                    tracing::info!(volume = %self.volume, %snapshot, ?result, "snapshot barrier done");
                }
            }
        }
    }

    /// The local link carried a message out at once: its reply goes to the
    /// engine now, and a refusal closes the link like a reset.
    fn local_outcome(&mut self, to: NodeId, reply: Option<FromReplica>, close: bool) {
        let now = self.now();
        if let Some(reply) = reply {
            self.primary.message(to, reply, now);
        }
        if close {
            if let Some(slot) = self.links.get_mut(&to) {
                slot.close();
                slot.epoch += 1;
                let epoch = slot.epoch;
                self.primary.link_down(to, now);
                self.schedule_reconnect(to, epoch);
            }
        }
    }

    fn connect(&mut self, to: NodeId) {
        let slot = self.links.entry(to).or_insert(LinkSlot {
            epoch: 0,
            sender: None,
            tasks: Vec::new(),
        });
        slot.close();
        slot.epoch += 1;
        let epoch = slot.epoch;
        let inputs = self.inputs.clone();
        let volume = self.volume.clone();
        if to == self.me {
            // This node's copy (or its tiebreaker vote), in-process.
            let deliver_inputs = inputs.clone();
            let deliver = move |outcome: super::local::LocalOutcome| {
                let input = match outcome {
                    Some((Some(reply), _)) => Input::Message(to, epoch, reply),
                    Some((None, false)) => return,
                    Some((None, true)) | None => Input::LinkDown(to, epoch),
                };
                let _ = deliver_inputs.send(input);
            };
            match LocalLink::open(self.replicas.clone(), volume, self.local.clone(), deliver) {
                Ok(local) => {
                    let _ = inputs.send(Input::LinkUp(to, epoch, LinkSender::Local(local)));
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot open the local data link");
                    let _ = inputs.send(Input::LinkDown(to, epoch));
                }
            }
            return;
        }
        let address = self
            .cluster
            .state
            .read()
            .nodes
            .get(&to)
            .and_then(|node| node.data_address.clone());
        let secret = self.cluster.identity.secret_bytes();
        let me = self.me;
        let task = tokio::spawn(async move {
            let result = match address {
                None => Err(format!("node {to} has no data address yet")),
                Some(address) => open_remote(&address, &secret, &volume, me).await,
            };
            match result {
                Ok(stream) => {
                    let (reader, writer) = stream.into_split();
                    // The link's own tasks; this connecting task ends.
                    let tasks = spawn_link(to, epoch, reader, writer, inputs.clone());
                    drop(tasks);
                }
                Err(error) => {
                    tracing::debug!(node = %to, %error, "data link failed");
                    let _ = inputs.send(Input::LinkDown(to, epoch));
                }
            }
        });
        self.links.get_mut(&to).expect("inserted").tasks = vec![task];
    }

    fn propose(&self, id: u64, proposal: Proposal) {
        let name = self.volume.clone();
        let generation = self.primary.generation();
        let me = self.me;
        let (command, wants_result) = match proposal {
            Proposal::MarkOutdated { node } => (
                Command::MarkOutdated {
                    name,
                    generation,
                    node,
                    by: me,
                },
                true,
            ),
            Proposal::MarkInSync { node } => (
                Command::MarkInSync {
                    name,
                    generation,
                    node,
                    by: me,
                },
                true,
            ),
            Proposal::Progress { node, progress } => (
                Command::ReportSync {
                    name,
                    node,
                    progress: progress.map(|p| ControlProgress {
                        done_bytes: p.done_bytes,
                        total_bytes: p.total_bytes,
                        rate_bytes_per_sec: p.rate_bytes_per_sec,
                        reported_ms: auth::now_ms(),
                    }),
                },
                false,
            ),
        };
        let cluster = self.cluster.clone();
        let inputs = self.inputs.clone();
        tokio::spawn(async move {
            let result = cluster.write(command).await;
            if !wants_result {
                return;
            }
            let result = match result {
                Ok(_) => ProposalResult::Committed,
                Err(ClusterError::Refused(
                    CommandError::StaleGeneration { .. } | CommandError::NotPrimary { .. },
                )) => ProposalResult::Stale,
                Err(ClusterError::Refused(error)) => ProposalResult::Refused(error.to_string()),
                Err(error) => {
                    tracing::warn!(%error, "a replication proposal found no leader; retrying");
                    ProposalResult::Unavailable
                }
            };
            let _ = inputs.send(Input::Proposal(id, result));
        });
    }
}

async fn open_remote(
    address: &str,
    secret: &[u8],
    volume: &VolumeName,
    me: NodeId,
) -> Result<tokio::net::TcpStream, String> {
    let mut stream = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(address))
        .await
        .map_err(|_| format!("connecting to {address} timed out"))?
        .map_err(|error| format!("connecting to {address}: {error}"))?;
    stream
        .set_nodelay(true)
        .map_err(|error| error.to_string())?;
    let open =
        serde_json::to_vec(&LinkOpen::signed(secret, volume.as_str(), me)).expect("serialisable");
    let mut frame = Vec::new();
    push_frame(&mut frame, |body| body.extend_from_slice(&open));
    stream
        .write_all(&frame)
        .await
        .map_err(|error| error.to_string())?;
    let mut answer = Vec::new();
    tokio::time::timeout(CONNECT_TIMEOUT, read_frame_async(&mut stream, &mut answer))
        .await
        .map_err(|_| format!("{address} did not answer the link preamble"))?
        .map_err(|error| error.to_string())?;
    if !answer.is_empty() {
        return Err(format!(
            "{address} refused the link: {}",
            String::from_utf8_lossy(&answer)
        ));
    }
    Ok(stream)
}

/// Starts the writer and reader tasks of a link and reports it up.
fn spawn_link<R, W>(
    node: NodeId,
    epoch: u64,
    reader: R,
    writer: W,
    inputs: mpsc::UnboundedSender<Input>,
) -> Vec<JoinHandle<()>>
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let (sender, receiver) = mpsc::unbounded_channel();
    let sender = LinkSender::Remote(sender);
    let writer_inputs = inputs.clone();
    let write_task = tokio::spawn(async move {
        let _ = write_loop(receiver, writer).await;
        let _ = writer_inputs.send(Input::LinkDown(node, epoch));
    });
    let read_inputs = inputs.clone();
    let read_task = tokio::spawn(async move {
        let mut reader = BufReader::with_capacity(256 * 1024, reader);
        let mut frame = Vec::new();
        loop {
            if read_frame_async(&mut reader, &mut frame).await.is_err() {
                break;
            }
            match FromReplica::decode(&frame) {
                Ok(message) => {
                    if read_inputs
                        .send(Input::Message(node, epoch, message))
                        .is_err()
                    {
                        return;
                    }
                }
                Err(error) => {
                    tracing::warn!(%node, %error, "bad message from a replica; closing the link");
                    break;
                }
            }
        }
        let _ = read_inputs.send(Input::LinkDown(node, epoch));
    });
    let _ = inputs.send(Input::LinkUp(node, epoch, sender));
    vec![write_task, read_task]
}

async fn write_loop(
    mut receiver: mpsc::UnboundedReceiver<ToReplica>,
    mut writer: impl AsyncWrite + Unpin,
) -> std::io::Result<()> {
    let mut buffer = Vec::with_capacity(WRITE_BATCH_BYTES);
    while let Some(message) = receiver.recv().await {
        buffer.clear();
        push_frame(&mut buffer, |body| message.encode(body));
        while buffer.len() < WRITE_BATCH_BYTES {
            match receiver.try_recv() {
                Ok(message) => push_frame(&mut buffer, |body| message.encode(body)),
                Err(_) => break,
            }
        }
        writer.write_all(&buffer).await?;
    }
    Ok(())
}

struct PersistJob {
    token: Option<u64>,
    peer: NodeId,
    map: Option<DirtyMap>,
}

/// Dirty maps are persisted one after the other, in the order the engine
/// asked: `persisted(token)` promises every earlier token is durable too.
fn spawn_persister(
    meta: Arc<ReplicationMeta>,
    volume: VolumeName,
    inputs: mpsc::UnboundedSender<Input>,
) -> mpsc::UnboundedSender<PersistJob> {
    let (sender, mut receiver) = mpsc::unbounded_channel::<PersistJob>();
    std::thread::Builder::new()
        .name("dirty-maps".into())
        .spawn(move || {
            while let Some(job) = receiver.blocking_recv() {
                // Coalesce: only the newest map per peer matters.
                let mut jobs = vec![job];
                while let Ok(job) = receiver.try_recv() {
                    jobs.push(job);
                }
                let mut newest: BTreeMap<NodeId, Option<DirtyMap>> = BTreeMap::new();
                let mut token = None;
                for job in jobs {
                    newest.insert(job.peer, job.map);
                    if job.token.is_some() {
                        token = job.token;
                    }
                }
                for (peer, map) in newest {
                    if let Err(error) = meta.set_dirty_map(&volume, peer, map.as_ref()) {
                        // Without its map the peer would resync too little:
                        // the engine must not go on as if it were durable.
                        tracing::error!(%error, %volume, "cannot persist a dirty map");
                        return;
                    }
                }
                if let Some(token) = token {
                    if inputs.send(Input::Persisted(token)).is_err() {
                        return;
                    }
                }
            }
        })
        .expect("spawn the dirty-map thread");
    sender
}

/// Sends the volume's record to the engine whenever it changes.
fn spawn_view_watch(
    cluster: Arc<Cluster>,
    volume: VolumeName,
    inputs: mpsc::UnboundedSender<Input>,
) {
    tokio::spawn(async move {
        let mut changes = cluster.state.subscribe();
        let (mut last, mut last_rate) = {
            let state = cluster.state.read();
            (
                state.volumes.get(&volume).cloned(),
                state.settings.resync_rate_bytes_per_sec,
            )
        };
        loop {
            if changes.changed().await.is_err() {
                return;
            }
            let (record, rate) = {
                let state = cluster.state.read();
                (
                    state.volumes.get(&volume).cloned(),
                    state.settings.resync_rate_bytes_per_sec,
                )
            };
            if rate != last_rate {
                last_rate = rate;
                if inputs.send(Input::ResyncRate(rate)).is_err() {
                    return;
                }
            }
            if record == last {
                continue;
            }
            last = record.clone();
            let gone = record.is_none();
            if inputs.send(Input::View(record)).is_err() || gone {
                return;
            }
        }
    });
}
