//! The engine's state around the [`Primary`]: its links, the client
//! requests waiting for completion, and how each action is carried out.
//! Everything here runs under the engine's lock ([`super::Core`]) and never
//! blocks: socket writes are non-blocking, slow work goes to tasks.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use trireme_control::events::ReportedEvent;
use trireme_control::{Command, EventKind};
use trireme_replication::driver::primary::{ControlPlane, PrimaryDriver};
use trireme_replication::{Action, ClientError, FromReplica, Primary, ToReplica, VerifyState};
use trireme_store::Volume;
use trireme_types::{Generation, NodeId, SnapshotId, VolumeName};

use super::super::clock::Clock;
use super::super::local::{LocalLink, LocalOutcome};
use super::super::serve::ReplicaService;
use super::super::wire::Frames;
use super::tasks::PersistJob;
use super::{Core, Input, LinkSender, Reply};
use crate::cluster::replication_port::ControlPort;

/// Wait before reconnecting a link that failed or closed.
const RECONNECT_DELAY: Duration = Duration::from_millis(500);
/// A link that keeps failing (a node down, a replica not created yet) is
/// retried ever less often, up to this.
const RECONNECT_DELAY_MAX: Duration = Duration::from_secs(4);
/// A link the engine closes because the replica failed what it was sent
/// (a full pool, a failing disk) comes up again at once and fails the same
/// way: its retries slow down up to this, until the replica is in sync.
const FAILED_REPLICA_DELAY_MAX: Duration = Duration::from_secs(16);
/// Inputs and actions carried out in one round before the driver lets go
/// of its lock; a stop that never comes is a bug, not a hang.
const ROUND_LIMIT: usize = 1_000_000;

/// The delay to wait now before reconnecting `node`, from `delays`; the
/// next one doubles, up to `max`.
fn back_off(delays: &mut BTreeMap<NodeId, Duration>, node: NodeId, max: Duration) -> Duration {
    let delay = delays.get(&node).copied().unwrap_or(RECONNECT_DELAY);
    delays.insert(node, (delay * 2).min(max));
    delay
}

struct LinkSlot {
    epoch: u64,
    sender: Option<LinkSender>,
    tasks: Vec<JoinHandle<()>>,
}

impl LinkSlot {
    fn close(&mut self) {
        if let Some(LinkSender::Remote(remote)) = self.sender.take() {
            remote.close();
        }
        for task in self.tasks.drain(..) {
            task.abort();
        }
    }
}

pub(super) struct DriverStart {
    pub primary: Primary,
    pub me: NodeId,
    pub volume: VolumeName,
    pub generation: Generation,
    pub cluster: Arc<dyn ControlPort>,
    pub replicas: Arc<ReplicaService>,
    pub local: Option<Arc<Volume>>,
    pub core: Weak<Core>,
    pub persister: mpsc::UnboundedSender<PersistJob>,
    pub local_readable: Arc<AtomicBool>,
    pub lease_until: Arc<AtomicU64>,
    pub served_size: Arc<AtomicU64>,
    pub clock: Clock,
    pub port: Box<dyn ControlPlane + Send>,
}

/// Read repairs go to the event log at most this often per volume.
const READ_REPAIR_EVENT_EVERY_MS: u64 = 10_000;

pub(super) struct Driver {
    pub primary: Primary,
    me: NodeId,
    pub volume: VolumeName,
    pub generation: Generation,
    /// The cluster, as replication sees it.
    cluster: Arc<dyn ControlPort>,
    replicas: Arc<ReplicaService>,
    local: Option<Arc<Volume>>,
    core: Weak<Core>,
    links: BTreeMap<NodeId, LinkSlot>,
    /// Frames for remote links produced in this round, handed to their
    /// links at its end (one write per link serves many messages), with
    /// how many messages they hold.
    staged: BTreeMap<NodeId, (Frames, usize)>,
    /// Messages for this node's own copy produced in this round, carried
    /// out once the remote frames are handed over (see `execute`).
    local_staged: Vec<(NodeId, ToReplica)>,
    /// Inputs that arose while the lock was held (a link coming up
    /// in-process): handled in the same round.
    queued: VecDeque<Input>,
    ops: BTreeMap<u64, Reply>,
    next_op: u64,
    persister: mpsc::UnboundedSender<PersistJob>,
    local_readable: Arc<AtomicBool>,
    /// The engine's read lease, by `clock`: local reads start before it.
    lease_until: Arc<AtomicU64>,
    /// The size the engine serves (it grows while it runs): what the NBD
    /// export answers.
    served_size: Arc<AtomicU64>,
    clock: Clock,
    /// The engine stopped: inputs go to its task from now on.
    pub stopping: bool,
    /// The engine's dealings with the control plane (the simulator's too).
    control: PrimaryDriver,
    /// Where its proposals go.
    port: Box<dyn ControlPlane + Send>,
    /// The next reconnect delay per peer: doubled on each failure, reset
    /// when a link comes up.
    reconnect_delays: BTreeMap<NodeId, Duration>,
    /// The next delay per peer after the engine closed its link: doubled
    /// each time, forgotten when the peer is marked in sync.
    failed_replica_delays: BTreeMap<NodeId, Duration>,
    /// The end of the last verify already logged.
    verify_logged: Option<u64>,
    /// Counters already logged.
    logged: trireme_replication::primary::Counters,
    /// When read repairs were last put in the cluster's event log.
    read_repairs_recorded_ms: Option<u64>,
    /// Who waits for each snapshot asked.
    snapshot_waiters: BTreeMap<SnapshotId, Vec<oneshot::Sender<super::SnapshotOutcome>>>,
}

impl Driver {
    pub fn new(start: DriverStart) -> Driver {
        Driver {
            primary: start.primary,
            me: start.me,
            volume: start.volume.clone(),
            generation: start.generation,
            cluster: start.cluster,
            replicas: start.replicas,
            local: start.local,
            core: start.core,
            links: BTreeMap::new(),
            staged: BTreeMap::new(),
            local_staged: Vec::new(),
            queued: VecDeque::new(),
            ops: BTreeMap::new(),
            next_op: 1,
            persister: start.persister,
            local_readable: start.local_readable,
            lease_until: start.lease_until,
            served_size: start.served_size,
            clock: start.clock,
            stopping: false,
            control: PrimaryDriver::new(start.me, start.volume.clone()),
            port: start.port,
            reconnect_delays: BTreeMap::new(),
            failed_replica_delays: BTreeMap::new(),
            verify_logged: None,
            logged: Default::default(),
            read_repairs_recorded_ms: None,
            snapshot_waiters: BTreeMap::new(),
        }
    }

    fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    pub fn handle(&mut self, input: Input) {
        let now = self.now();
        match input {
            Input::Client(request, reply) => {
                let op = self.next_op;
                self.next_op += 1;
                self.ops.insert(op, reply);
                self.primary.client(op, request, now);
            }
            Input::Messages(node, epoch, messages) => {
                if self.current(node, epoch) {
                    for message in messages {
                        self.primary.message(node, message, now);
                    }
                }
            }
            Input::LinkUp(node, epoch, sender) => match self.links.get_mut(&node) {
                Some(slot) if slot.epoch == epoch => {
                    slot.sender = Some(sender);
                    self.reconnect_delays.remove(&node);
                    self.primary.link_up(node, now);
                }
                _ => {
                    if let LinkSender::Remote(remote) = sender {
                        remote.close();
                    }
                }
            },
            Input::LinkDown(node, epoch) => {
                if self.current(node, epoch) {
                    let slot = self.links.get_mut(&node).expect("current");
                    slot.close();
                    self.unstage(node);
                    self.primary.link_down(node, now);
                    self.schedule_reconnect(node, epoch);
                }
            }
            Input::Reconnect(node, epoch) => {
                if self.current(node, epoch) {
                    self.connect(node);
                }
            }
            Input::View(record) => {
                self.control
                    .record(&mut self.primary, record.as_deref(), now);
            }
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
            Input::TakeSnapshot(id, sender) => {
                self.snapshot_waiters.entry(id).or_default().push(sender);
                self.primary.take_snapshot(id, now);
            }
            Input::Persisted(token) => self.primary.persisted(token, now),
            Input::Proposal(id, answer) => {
                if let Some(node) = self.control.answered(&mut self.primary, id, answer, now) {
                    {
                        self.failed_replica_delays.remove(&node);
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
            }
            Input::Tick => self.primary.tick(now),
        }
    }

    fn current(&self, node: NodeId, epoch: u64) -> bool {
        self.links
            .get(&node)
            .is_some_and(|slot| slot.epoch == epoch)
    }

    fn schedule_reconnect(&mut self, node: NodeId, epoch: u64) {
        let delay = back_off(&mut self.reconnect_delays, node, RECONNECT_DELAY_MAX);
        self.reconnect_in(node, epoch, delay);
    }

    /// After the engine closed the link to `node` (`Reset`, or the local
    /// replica refused): the link itself works, so the delay that restarts
    /// at every link up would retry a failing replica twice a second.
    fn reconnect_failed_replica(&mut self, node: NodeId, epoch: u64) {
        let delay = back_off(
            &mut self.failed_replica_delays,
            node,
            FAILED_REPLICA_DELAY_MAX,
        );
        self.reconnect_in(node, epoch, delay);
    }

    fn reconnect_in(&self, node: NodeId, epoch: u64, delay: Duration) {
        let core = self.core.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            if let Some(core) = core.upgrade() {
                core.deliver(Input::Reconnect(node, epoch));
            }
        });
    }

    /// Carries out the engine's actions, and the inputs they gave rise to,
    /// until there are none; then writes the frames they produced. What
    /// goes to this node's own copy is carried out after the frames for
    /// the others are handed to their links.
    pub fn execute(&mut self) {
        for _ in 0..ROUND_LIMIT {
            let actions = self.primary.take_actions();
            if !actions.is_empty() {
                for action in actions {
                    self.act(action);
                }
                continue;
            }
            if !self.local_staged.is_empty() {
                // The peers' copies first: a write to this node's copy may
                // take the lock of its store and wake its threads, which
                // then run before the frames reach the wire (a replicated
                // write + flush cycle waited ~100 µs per request for it).
                self.write_staged();
                for (to, message) in std::mem::take(&mut self.local_staged) {
                    self.send_local(to, message);
                }
                continue;
            }
            if let Some(input) = self.queued.pop_front() {
                self.handle(input);
                continue;
            }
            self.write_staged();
            if self.queued.is_empty() {
                self.lease_until
                    .store(self.primary.read_lease_until(), Ordering::Release);
                let size = self.primary.size_bytes();
                if self.served_size.swap(size, Ordering::AcqRel) != size {
                    tracing::info!(volume = %self.volume, size_bytes = size, "the engine serves the volume's new size");
                }
                self.log_counters();
                return;
            }
        }
        panic!(
            "volume {}: the engine's actions did not settle within {ROUND_LIMIT} rounds",
            self.volume
        );
    }

    /// Drops what was staged for `node`'s link, which is going away.
    fn unstage(&mut self, node: NodeId) {
        self.staged.remove(&node);
        self.local_staged.retain(|(to, _)| *to != node);
    }

    fn write_staged(&mut self) {
        for (node, (frames, messages)) in std::mem::take(&mut self.staged) {
            if let Some(slot) = self.links.get(&node) {
                if let Some(LinkSender::Remote(remote)) = &slot.sender {
                    // Nothing else outstanding on the link (a client
                    // waiting on each request, as a database's commits
                    // do): no later message of a burst will share the
                    // write, so it goes into the socket now rather than
                    // wait for the flusher task (and a worker woken for
                    // it).
                    let quiet = self.primary.unacked_messages(node) <= messages;
                    // A broken socket: its flusher reports the link down
                    // too, but the engine need not wait for that.
                    if remote.send(frames, quiet).is_err() {
                        self.queued.push_back(Input::LinkDown(node, slot.epoch));
                    }
                }
            }
        }
    }

    fn log_counters(&mut self) {
        let repaired = self.primary.counters.repaired_blocks;
        if repaired > self.logged.repaired_blocks {
            tracing::warn!(
                volume = %self.volume,
                "repaired {} blocks that failed their checksum, from a peer's copy",
                repaired - self.logged.repaired_blocks
            );
            self.logged.repaired_blocks = repaired;
        }
        self.record_read_repairs();
        self.log_verify_end();
    }

    /// Puts the blocks reads repaired in the cluster's event log: at most
    /// one event per volume every [`READ_REPAIR_EVENT_EVERY_MS`], counting
    /// all since the last, so a failing disk cannot flood the log. (A
    /// verify's repairs are logged with its result, by the API.)
    fn record_read_repairs(&mut self) {
        let repaired = self.primary.counters.read_repaired_blocks;
        let now = self.now();
        let due = self
            .read_repairs_recorded_ms
            .is_none_or(|at| now.saturating_sub(at) >= READ_REPAIR_EVENT_EVERY_MS);
        if repaired <= self.logged.read_repaired_blocks || !due {
            return;
        }
        let blocks = repaired - self.logged.read_repaired_blocks;
        self.logged.read_repaired_blocks = repaired;
        self.read_repairs_recorded_ms = Some(now);
        let event = ReportedEvent {
            kind: EventKind::Repaired,
            node: Some(self.me),
            volume: Some(self.volume.clone()),
            message: format!(
                "reads of volume {} found {blocks} blocks damaged on a replica and rewrote them from a good copy",
                self.volume
            ),
        };
        let cluster = self.cluster.clone();
        let volume = self.volume.clone();
        tokio::spawn(async move {
            if let Err(error) = cluster.propose(Command::RecordEvent { event }).await {
                tracing::warn!(%volume, "could not log the read repairs: {error}");
            }
        });
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
        match action {
            Action::Connect { to } => self.connect(to),
            Action::Send { to, message } => {
                match self.links.get(&to).and_then(|slot| slot.sender.as_ref()) {
                    Some(LinkSender::Remote(_)) => {
                        let (frames, messages) = self.staged.entry(to).or_default();
                        frames.push(&message);
                        *messages += 1;
                    }
                    Some(LinkSender::Local(_)) => self.local_staged.push((to, message)),
                    None => {}
                }
            }
            Action::Reset { to } => {
                if let Some(slot) = self.links.get_mut(&to) {
                    slot.close();
                    slot.epoch += 1;
                    let epoch = slot.epoch;
                    self.unstage(to);
                    let now = self.now();
                    self.primary.link_down(to, now);
                    self.reconnect_failed_replica(to, epoch);
                }
            }
            Action::Complete { op, result } => {
                if let Some(reply) = self.ops.remove(&op) {
                    reply.send(result);
                }
            }
            Action::Propose { id, proposal } => {
                self.control
                    .propose(&self.primary, id, proposal, self.port.as_mut())
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
                match &result {
                    Ok(nodes) => {
                        tracing::info!(volume = %self.volume, %snapshot, ?nodes, "snapshot taken")
                    }
                    Err(error) => {
                        tracing::warn!(volume = %self.volume, %snapshot, %error, "snapshot failed")
                    }
                }
                for waiter in self.snapshot_waiters.remove(&snapshot).unwrap_or_default() {
                    let _ = waiter.send(result.clone());
                }
            }
        }
    }

    /// Carries out a message to this node's copy (staged in `act`), on a
    /// link that is still the one it was staged for: a reset or a new
    /// link drops what was staged for the old one, as for remote links.
    fn send_local(&mut self, to: NodeId, message: ToReplica) {
        let Some(LinkSender::Local(local)) =
            self.links.get(&to).and_then(|slot| slot.sender.as_ref())
        else {
            return;
        };
        if let Some((reply, close)) = local.send(message) {
            self.local_outcome(to, reply, close);
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
                self.reconnect_failed_replica(to, epoch);
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
        self.unstage(to);
        let volume = self.volume.clone();
        if to == self.me {
            // This node's copy (or its tiebreaker vote), in-process. Its
            // worker delivers what it carried out later, from its thread.
            let core = self.core.clone();
            let deliver = move |outcome: LocalOutcome| {
                let input = match outcome {
                    Some((Some(reply), _)) => Input::Messages(to, epoch, vec![reply]),
                    Some((None, false)) => return,
                    Some((None, true)) | None => Input::LinkDown(to, epoch),
                };
                if let Some(core) = core.upgrade() {
                    core.deliver(input);
                }
            };
            match LocalLink::open(self.replicas.clone(), volume, self.local.clone(), deliver) {
                Ok(local) => {
                    self.queued
                        .push_back(Input::LinkUp(to, epoch, LinkSender::Local(local)))
                }
                Err(error) => {
                    tracing::warn!(%error, "cannot open the local data link");
                    self.queued.push_back(Input::LinkDown(to, epoch));
                }
            }
            return;
        }
        let address = self
            .cluster
            .state()
            .read()
            .nodes
            .get(&to)
            .and_then(|node| node.data_address.clone());
        let secret = self.cluster.link_secret();
        let task = super::remote::spawn_connect(super::remote::Connect {
            to,
            epoch,
            me: self.me,
            volume,
            address,
            secret,
            core: self.core.clone(),
        });
        self.links.get_mut(&to).expect("inserted").tasks = vec![task];
    }

    /// The remote link of `node` at `epoch` is open: its tasks are kept
    /// with the slot (and aborted when it closes).
    pub fn adopt_tasks(&mut self, node: NodeId, epoch: u64, tasks: Vec<JoinHandle<()>>) -> bool {
        match self.links.get_mut(&node) {
            Some(slot) if slot.epoch == epoch => {
                slot.tasks.extend(tasks);
                true
            }
            _ => {
                for task in tasks {
                    task.abort();
                }
                false
            }
        }
    }

    /// Every client request waiting fails: the engine stopped.
    pub fn fail_ops(&mut self) {
        for (_, reply) in std::mem::take(&mut self.ops) {
            reply.send(Err(ClientError::ShuttingDown));
        }
        for (_, waiters) in std::mem::take(&mut self.snapshot_waiters) {
            for waiter in waiters {
                let _ = waiter.send(Err("the volume's engine stopped".into()));
            }
        }
    }

    /// Lets every open link deliver what is queued and end; returns the
    /// links whose end is awaited.
    pub fn close_senders(&mut self) -> BTreeSet<(NodeId, u64)> {
        debug_assert!(
            self.local_staged.is_empty(),
            "every round carries out what it staged for this node's copy"
        );
        self.write_staged();
        let mut open = BTreeSet::new();
        for (&node, slot) in self.links.iter_mut() {
            match slot.sender.take() {
                Some(LinkSender::Remote(remote)) => {
                    remote.finish();
                    open.insert((node, slot.epoch));
                }
                Some(LinkSender::Local(local)) => {
                    // Its worker ends once it has done what it was given.
                    drop(local);
                    open.insert((node, slot.epoch));
                }
                None => {}
            }
        }
        open
    }

    pub fn close_links(&mut self) {
        for (_, slot) in self.links.iter_mut() {
            slot.close();
        }
    }
}
