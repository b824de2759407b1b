//! Runs a [`Primary`] under tokio for one attached volume: feeds it events
//! (client requests, replies from the links, control-plane views, ticks)
//! and carries out its actions (link traffic, persisting dirty maps,
//! control-plane proposals, completions).
//!
//! Whoever has an event hands it to the engine at once, under its lock:
//! the NBD server's task with a client request, a link's reader task with
//! a replica's acknowledgements, the local link's worker with a flush's.
//! The actions that follow are carried out on the same thread; frames for
//! the replicas go to their links' flusher tasks, which run on the same
//! worker as soon as the caller's task yields, and send every frame queued
//! by then with one system call per link (see `remote`). So a replicated
//! write costs no thread switch on the primary between the client's
//! request and the replicas' sockets, nor between the last
//! acknowledgement and the client's completion, and a burst of requests
//! costs one send per link, not one per request. The engine's own task
//! ticks its clock, and takes over the inputs once the engine stops.
//!
//! Modules: `driver` (the engine's state and its actions), `remote` (links
//! to other nodes: connect, read, write), `tasks` (dirty-map persistence,
//! the control-plane watch). Links to this node's own copy are in-process
//! ([`super::local::LocalLink`]), running the same replica code as remote
//! ones. A link has an epoch; anything from an older epoch is ignored, so
//! a message of a closed link is never mistaken for one of its successor.

mod driver;
mod remote;
mod tasks;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};
use trireme_control::{QuorumPolicy, VolumeRecord};
use trireme_replication::RegionSet;
use trireme_replication::{
    ClientError, ClientRequest, Completion, Config, DirtyMap, FromReplica, NoQuorumPolicy, Primary,
    VerifyReport,
};
use trireme_store::Volume;
use trireme_types::BlockTarget;
use trireme_types::{Generation, NodeId, SnapshotId, VolumeName};

/// The replicas a snapshot was taken on, or why it was not.
pub type SnapshotOutcome = Result<std::collections::BTreeSet<NodeId>, String>;

use super::clock::Clock;
use super::serve::ReplicaService;
use super::ReplicationMeta;
use crate::cluster::replication_port::{ControlPort, EnginePort};
use driver::Driver;

/// Where a link's messages go: a peer's socket, or this node's own copy,
/// in-process. (Here, not in the driver: the remote link's tasks hand
/// their sender to the engine, and the driver holds it.)
pub(crate) enum LinkSender {
    Remote(remote::RemoteLink),
    Local(super::local::LocalLink),
}
use trireme_replication::driver::primary::{view_of, ProposeError};

/// How often the engine's clock ticks (timeouts, resync pacing, progress).
const TICK: Duration = Duration::from_millis(100);
/// How long a stopping engine's links get to deliver what is queued (the
/// goodbyes of a clean detach).
const GOODBYE_GRACE: Duration = Duration::from_secs(2);

/// Where a client request's outcome goes.
pub(crate) enum Reply {
    /// A caller blocked on a thread waits for it.
    Waiting(oneshot::Sender<Result<Completion, ClientError>>),
    /// Called under the engine's lock (it must not block, nor call the
    /// engine): the NBD server's completion, which queues the reply to its
    /// connection.
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
    /// Replies from a link, in the order it received them.
    Messages(NodeId, u64, Vec<FromReplica>),
    LinkUp(NodeId, u64, LinkSender),
    LinkDown(NodeId, u64),
    Reconnect(NodeId, u64),
    View(Option<Box<VolumeRecord>>),
    /// The cluster's resync rate changed (bytes per second).
    ResyncRate(u64),
    /// Start a `verify` (or join the running one); answers its report.
    StartVerify(oneshot::Sender<Result<VerifyReport, String>>),
    /// The running or last verify's report.
    VerifyStatus(oneshot::Sender<Option<VerifyReport>>),
    /// Take a snapshot at one write boundary on every replica written to;
    /// answers the nodes that took it.
    TakeSnapshot(SnapshotId, oneshot::Sender<SnapshotOutcome>),
    /// The node stops: detach cleanly (final flush, goodbye), so that the
    /// copies need no reconciliation or resync when it comes back.
    Shutdown,
    Persisted(u64),
    /// The control plane's answer to a proposal.
    Proposal(u64, Result<(), ProposeError>),
    Tick,
}

/// The engine as every thread that feeds it sees it.
pub(crate) struct Core {
    driver: Mutex<Driver>,
    /// Once the engine has stopped, inputs go to its task instead (it
    /// waits for the links' goodbyes, then answers late requests).
    stopped_inputs: mpsc::UnboundedSender<Input>,
    runtime: tokio::runtime::Handle,
}

impl Core {
    /// The driver. A panic under the lock is a broken invariant of the
    /// protocol: the engine then takes no more input and stops, rather
    /// than go on from a state it can no longer trust.
    fn lock(&self) -> MutexGuard<'_, Driver> {
        self.driver.lock().unwrap_or_else(|poisoned| {
            let mut driver = poisoned.into_inner();
            if !driver.stopping {
                tracing::error!(volume = %driver.volume, "the replication engine failed; the volume is no longer served here (detach and attach it again)");
                driver.stopping = true;
            }
            driver
        })
    }

    /// Hands `input` to the engine and carries out what follows, on this
    /// thread. Never blocks on I/O; must not be called under the lock.
    pub(crate) fn deliver(&self, input: Input) {
        // Actions spawn tasks and write to sockets: the node's runtime,
        // whichever thread this is (a store worker, the dirty-map thread).
        let _runtime = self.runtime.enter();
        let mut driver = self.lock();
        if driver.stopping {
            drop(driver);
            if let Err(refused) = self.stopped_inputs.send(input) {
                if let Input::Client(_, reply) = refused.0 {
                    reply.send(Err(ClientError::ShuttingDown));
                }
            }
            return;
        }
        driver.handle(input);
        driver.execute();
        if driver.primary.is_stopped() {
            driver.stopping = true;
            drop(driver);
            // Wakes the task for the stop sequence.
            let _ = self.stopped_inputs.send(Input::Tick);
        }
    }
}

/// What the rest of the node holds of a running engine.
pub struct EngineHandle {
    pub volume: VolumeName,
    pub generation: Generation,
    /// The size the engine serves: the record's at attach, then each
    /// larger recorded size once every replica that takes the writes
    /// holds it (`Primary::size_bytes`).
    size_bytes: Arc<AtomicU64>,
    /// The engine of a detached volume, run only to resync its replicas:
    /// it serves no client.
    pub resync_only: bool,
    core: Arc<Core>,
    /// This node's copy, when it holds one.
    pub(crate) local: Option<Arc<Volume>>,
    /// Reads may go straight to `local` (it is up to date and linked)...
    local_readable: Arc<AtomicBool>,
    /// ...if they start before this time by `clock`: the engine's read
    /// lease (see `trireme_replication::Primary::read_lease_until`).
    lease_until: Arc<AtomicU64>,
    clock: Clock,
    stopped: Arc<AtomicBool>,
}

impl EngineHandle {
    /// Whether a read starting now may go straight to the local copy: it
    /// is up to date, and the engine's read lease holds (no newer primary
    /// can have completed a write). Otherwise it goes through the engine,
    /// which waits for the lease.
    pub(crate) fn reads_locally(&self) -> bool {
        self.local.is_some()
            && self.local_readable.load(Ordering::Acquire)
            && self.clock.now_ms() < self.lease_until.load(Ordering::Acquire)
    }

    pub fn size_bytes(&self) -> u64 {
        self.size_bytes.load(Ordering::Acquire)
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::Acquire)
    }

    /// Starts a clean detach for the node's shutdown; `is_stopped` turns
    /// true once every replica has been flushed and told goodbye.
    pub fn shut_down(&self) {
        self.core.deliver(Input::Shutdown);
    }

    /// Starts comparing the volume's up-to-date replicas (see
    /// `trireme_replication::primary::verify`), or joins the running verify.
    pub async fn start_verify(&self) -> Result<VerifyReport, String> {
        let (sender, receiver) = oneshot::channel();
        self.core.deliver(Input::StartVerify(sender));
        receiver
            .await
            .unwrap_or_else(|_| Err("the volume's engine stopped".into()))
    }

    /// The running or last verify's report, if any ran.
    pub async fn verify_report(&self) -> Result<Option<VerifyReport>, String> {
        let (sender, receiver) = oneshot::channel();
        self.core.deliver(Input::VerifyStatus(sender));
        receiver
            .await
            .map_err(|_| "the volume's engine stopped".to_string())
    }

    /// Takes snapshot `id` of the volume: one barrier, ordered after every
    /// write completed before and before every write started after, on
    /// every replica the engine writes to.
    pub async fn take_snapshot(&self, id: SnapshotId) -> SnapshotOutcome {
        let (sender, receiver) = oneshot::channel();
        self.core.deliver(Input::TakeSnapshot(id, sender));
        receiver
            .await
            .unwrap_or_else(|_| Err("the volume's engine stopped".into()))
    }

    /// The engine's links and quorum, for `/metrics` (takes the engine's
    /// lock once: scrape time, not the I/O path).
    pub fn report(&self) -> trireme_replication::EngineReport {
        self.core.lock().primary.report()
    }

    /// Hands one request to the engine; `done` runs (under the engine's
    /// lock, so it must not block) when it completes, or at once with
    /// `ShuttingDown` if the engine is gone.
    pub fn submit(
        &self,
        request: ClientRequest,
        done: Box<dyn FnOnce(Result<Completion, ClientError>) + Send>,
    ) {
        self.core
            .deliver(Input::Client(request, Reply::Callback(done)));
    }

    /// Runs one request through the engine and waits for it (blocking: the
    /// NBD server calls targets on its I/O threads).
    pub fn call(&self, request: ClientRequest) -> Result<Completion, ClientError> {
        let (sender, receiver) = oneshot::channel();
        self.core
            .deliver(Input::Client(request, Reply::Waiting(sender)));
        receiver
            .blocking_recv()
            .unwrap_or(Err(ClientError::ShuttingDown))
    }
}

pub(crate) struct EngineStart {
    pub control: Arc<dyn ControlPort>,
    pub replicas: Arc<ReplicaService>,
    pub meta: Arc<ReplicationMeta>,
    pub record: VolumeRecord,
    pub policy: QuorumPolicy,
    pub resync_rate: u64,
    pub local: Option<Arc<Volume>>,
}

/// The regions of the local copy that hold data (its store's allocation):
/// resync progress counts these instead of the volume's size. `None` if
/// the store cannot say (progress then counts every region).
fn data_regions(volume: &Volume) -> Option<RegionSet> {
    let size_bytes = volume.size_bytes();
    let mut regions = RegionSet::new();
    let mut offset = 0;
    while offset < size_bytes {
        let extents = volume.block_status(offset, size_bytes - offset).ok()?;
        let before = offset;
        for extent in extents {
            let length = extent.length_bytes.min(size_bytes - offset);
            if !extent.hole {
                regions.add_range(offset, length);
            }
            offset += length;
        }
        if offset == before {
            return None;
        }
    }
    Some(regions)
}

/// Starts the engine of an attached volume (on the node's runtime).
pub(crate) fn start(start: EngineStart) -> Result<Arc<EngineHandle>, crate::NodeError> {
    let me = start.control.node_id();
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
    let runtime = tokio::runtime::Handle::current();
    let clock = Clock::start();
    let mut primary = Primary::new(config, clock.now_ms());
    if let Some(regions) = start.local.as_deref().and_then(data_regions) {
        primary.set_data_regions(regions);
    }
    let (stopped_inputs, receiver) = mpsc::unbounded_channel();
    let local_readable = Arc::new(AtomicBool::new(false));
    let lease_until = Arc::new(AtomicU64::new(0));
    let served_size = Arc::new(AtomicU64::new(primary.size_bytes()));
    let stopped = Arc::new(AtomicBool::new(false));
    let core = Arc::new_cyclic(|core: &std::sync::Weak<Core>| Core {
        driver: Mutex::new(Driver::new(driver::DriverStart {
            primary,
            me,
            volume: record.name.clone(),
            generation: record.generation,
            cluster: start.control.clone(),
            replicas: start.replicas,
            local: start.local.clone(),
            core: core.clone(),
            persister: tasks::spawn_persister(
                start.meta.clone(),
                record.name.clone(),
                core.clone(),
            ),
            local_readable: local_readable.clone(),
            lease_until: lease_until.clone(),
            served_size: served_size.clone(),
            clock,
            port: Box::new(EnginePort::new(start.control.clone(), {
                let core = core.clone();
                Arc::new(move |id, answer| {
                    if let Some(core) = core.upgrade() {
                        core.deliver(Input::Proposal(id, answer));
                    }
                })
            })),
        })),
        stopped_inputs,
        runtime,
    });
    let resync_only = record.resync_driver() == Some(me);
    let handle = Arc::new(EngineHandle {
        volume: record.name.clone(),
        generation: record.generation,
        size_bytes: served_size,
        resync_only,
        core: core.clone(),
        local: start.local,
        local_readable: local_readable.clone(),
        lease_until,
        clock,
        stopped: stopped.clone(),
    });
    tasks::spawn_view_watch(
        start.control,
        record.clone(),
        start.resync_rate,
        Arc::downgrade(&core),
    );
    if resync_only {
        tracing::info!(volume = %record.name, generation = %record.generation, "resync engine starting: the volume is detached and a replica is behind");
    } else {
        tracing::info!(volume = %record.name, generation = %record.generation, "primary engine starting");
    }
    tokio::spawn(run(core, receiver, local_readable, stopped));
    Ok(handle)
}

/// The engine's task: its clock while it runs, then the stop sequence.
async fn run(
    core: Arc<Core>,
    mut receiver: mpsc::UnboundedReceiver<Input>,
    local_readable: Arc<AtomicBool>,
    stopped: Arc<AtomicBool>,
) {
    core.lock().execute();
    let mut ticker = tokio::time::interval(TICK);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => core.deliver(Input::Tick),
            // Only a stopping engine sends here.
            _ = receiver.recv() => {}
        }
        if core.lock().stopping {
            break;
        }
    }
    local_readable.store(false, Ordering::Release);
    let (volume, generation, mut open) = {
        let mut driver = core.lock();
        driver.fail_ops();
        // Flushers send what is queued (a detach's goodbyes) and then end,
        // each reporting its link down; a peer that does not take it
        // within the grace is cut.
        let open = driver.close_senders();
        (driver.volume.clone(), driver.generation, open)
    };
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
    core.lock().close_links();
    stopped.store(true, Ordering::Release);
    // Requests that raced with the stop.
    receiver.close();
    while let Ok(input) = receiver.try_recv() {
        if let Input::Client(_, reply) = input {
            reply.send(Err(ClientError::ShuttingDown));
        }
    }
    tracing::info!(volume = %volume, generation = %generation, "primary engine stopped");
}
