//! [`Primary`]: the replication engine of one attached volume on its
//! primary node. Events go in (client requests, replies, link changes,
//! control-plane views, timer ticks); [`Action`]s come out. It never does
//! I/O and never reads a clock: the same code runs under tokio and under
//! the simulator.
//!
//! The rules it follows (docs/replication.md tells the whole story):
//! - A write goes to every diskful member that is linked and not outdated,
//!   and completes when every member of the up-to-date set has acknowledged
//!   it and those acknowledgements, with the reachable tiebreakers, are a
//!   majority of the voters.
//! - The up-to-date set shrinks only through the control plane
//!   ([`Proposal::MarkOutdated`], which carries our generation): until that
//!   commits, a write that a lost member did not acknowledge does not
//!   complete. A cut-off former primary cannot shrink the set, because its
//!   generation is stale.
//! - Overlapping requests run one after the other, so every replica applies
//!   them in the same order.
//! - Every write made while a member is not up to date marks its regions in
//!   that member's dirty map, persisted before the write completes, so a
//!   returning member copies only those regions. A map is trusted only by
//!   the generation right after the one that wrote it (a primary in between
//!   wrote without it), and a member that restarted while we did not know
//!   everything it held unflushed copies every region.
//! - An acknowledgement counts only while its link lives (a member whose
//!   link drops may have lost what it did not flush); a member that
//!   reconnects gets the pending writes and flushes it did not acknowledge.
//! - A write that fails after some member applied it stays unsettled for
//!   the replicas as long as this engine runs: the next primary reconciles
//!   its regions. Members not waited for (resyncing) copy them again.
//! - The last up-to-date member, which the control plane refuses to
//!   outdate, stays the truth when it comes back: the writes it missed fail
//!   and every other member copies from it what may differ.
//! - A member that restarted while in the set gets no writes and serves no
//!   reads until it is outdated; a `MarkInSync` waits while a `MarkOutdated`
//!   of the same member may still commit.

use crate::message::{FromReplica, Payload, ReadData, ReplicaError, ToReplica};
use crate::regions::{region_range, regions_of, RegionSet, REGION_BYTES};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use trireme_types::{Generation, NodeId};

/// Client writes and flushes being replicated at once; more wait in the
/// engine's queue (which the export's own in-flight limit bounds).
pub const MAX_PENDING_WRITES: usize = 256;
/// Unacknowledged messages on one link; a member that falls further behind
/// is dropped and resynced rather than buffered for.
pub const MAX_INFLIGHT_PER_LINK: usize = 512;
/// Unacknowledged payload bytes on one link.
pub const MAX_INFLIGHT_BYTES_PER_LINK: u64 = 256 << 20;
/// Regions a resync copies at once per member.
pub const RESYNC_WINDOW: usize = 4;
/// A member that has not answered its oldest message for this long is
/// treated as gone.
pub const ACK_TIMEOUT_MS: u64 = 5_000;
/// How long a new primary waits for the up-to-date members to answer its
/// hello before it outdates the silent ones.
pub const RECONCILE_WAIT_MS: u64 = 3_000;
/// A write that cannot reach quorum fails after this long when the volume's
/// policy is io-error.
pub const NO_QUORUM_FAIL_MS: u64 = 8_000;
/// How often a failed control-plane proposal is retried.
pub const PROPOSAL_RETRY_MS: u64 = 500;
/// The checksum granularity of the replicas' stores: a failed multi-block
/// copy is retried block by block.
const BLOCK_BYTES: u64 = 4096;
/// How often resync progress is reported.
pub const PROGRESS_EVERY_MS: u64 = 1_000;

/// The driver's handle on a client request.
pub type OpId = u64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoQuorumPolicy {
    IoError,
    Suspend,
}

/// What the control plane says about the volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct View {
    pub generation: Generation,
    pub primaries: BTreeSet<NodeId>,
    pub diskful: BTreeSet<NodeId>,
    pub tiebreakers: BTreeSet<NodeId>,
    pub in_sync: BTreeSet<NodeId>,
}

impl View {
    pub fn quorum_size(&self) -> usize {
        (self.diskful.len() + self.tiebreakers.len()) / 2 + 1
    }
}

/// A persisted dirty map: the regions `peer` may lack, tracked since it
/// last accepted `since`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirtyMap {
    pub since: Generation,
    pub full: bool,
    pub regions: RegionSet,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub me: NodeId,
    pub size_bytes: u64,
    pub view: View,
    pub policy: NoQuorumPolicy,
    /// Bytes per second a resync may copy; 0 for no limit.
    pub resync_rate: u64,
    /// Dirty maps this node persisted, by peer.
    pub dirty_maps: BTreeMap<NodeId, DirtyMap>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientRequest {
    Read {
        offset: u64,
        length: u64,
    },
    Write {
        offset: u64,
        payload: Payload,
        fua: bool,
    },
    Flush,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    Done,
    Read(ReadData),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientError {
    Io(String),
    NoSpace(String),
    ShuttingDown,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Proposal {
    MarkOutdated {
        node: NodeId,
    },
    MarkInSync {
        node: NodeId,
    },
    Progress {
        node: NodeId,
        progress: Option<SyncProgress>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SyncProgress {
    pub done_bytes: u64,
    pub total_bytes: u64,
    pub rate_bytes_per_sec: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProposalResult {
    Committed,
    /// Refused because our generation is stale: we are fenced.
    Stale,
    /// Refused for another reason (the message says which).
    Refused(String),
    /// No answer (no leader, timeout): retried.
    Unavailable,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Connect to the peer (or the local replica) and call `link_up`.
    Connect {
        to: NodeId,
    },
    Send {
        to: NodeId,
        message: ToReplica,
    },
    /// Close the link; `link_down` follows.
    Reset {
        to: NodeId,
    },
    Complete {
        op: OpId,
        result: Result<Completion, ClientError>,
    },
    Propose {
        id: u64,
        proposal: Proposal,
    },
    /// Persist `map` for `peer` (replacing the stored one); `persisted`
    /// with `token` follows.
    PersistDirty {
        token: u64,
        peer: NodeId,
        map: DirtyMap,
    },
    ForgetDirty {
        peer: NodeId,
    },
    /// Local reads may (or may no longer) bypass the engine.
    LocalReadable(bool),
    /// The engine stopped: fenced by a newer generation, or detached.
    Stopped {
        reason: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Diskful,
    Tiebreaker,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Link {
    Down,
    /// `link_up` came, hello sent at this time.
    Hello(u64),
    Up {
        previous: Generation,
    },
}

/// Regions a member may lack, to copy: a set plus, for a full sync, every
/// region from `sweep` on.
#[derive(Debug, Clone, Default)]
struct Backlog {
    set: RegionSet,
    sweep: Option<u64>,
}

impl Backlog {
    fn full() -> Self {
        Backlog {
            set: RegionSet::new(),
            sweep: Some(0),
        }
    }

    fn add(&mut self, region: u64) {
        if self.sweep.is_none_or(|sweep| region < sweep) {
            self.set.insert(region);
        }
    }

    fn add_set(&mut self, regions: &RegionSet) {
        for region in regions.iter() {
            self.add(region);
        }
    }

    fn is_empty(&self, region_count: u64) -> bool {
        self.set.is_empty() && self.sweep.is_none_or(|sweep| sweep >= region_count)
    }

    fn len(&self, region_count: u64) -> u64 {
        let swept = self
            .sweep
            .map_or(0, |sweep| region_count.saturating_sub(sweep));
        let below = match self.sweep {
            Some(sweep) => self.set.iter().filter(|&r| r < sweep).count() as u64,
            None => self.set.len(),
        };
        swept + below
    }

    fn pop(&mut self, region_count: u64, skip: impl Fn(u64) -> bool) -> Option<u64> {
        let found = self.set.iter().find(|&r| !skip(r));
        if let Some(region) = found {
            self.set.remove(region);
            return Some(region);
        }
        let sweep = self.sweep?;
        if sweep >= region_count || skip(sweep) {
            return None;
        }
        self.sweep = Some(sweep + 1);
        Some(sweep)
    }

    fn to_map(&self, since: Generation) -> DirtyMap {
        DirtyMap {
            since,
            full: self.sweep.is_some(),
            regions: self.set.clone(),
        }
    }
}

#[derive(Debug)]
#[allow(clippy::enum_variant_names)]
enum Sync {
    InSync,
    Outdated {
        backlog: Backlog,
    },
    Resyncing {
        backlog: Backlog,
        total: u64,
        done: u64,
        /// Resync writes on the link: seq → region.
        writes: BTreeMap<u64, u64>,
        /// Source reads: read id → (region, source).
        reads: BTreeMap<u64, (u64, NodeId)>,
    },
    /// Copied; its acknowledgements now count. `flush`: the flush that makes
    /// the copy durable; then MarkInSync is proposed.
    Joining {
        flush: Option<u64>,
    },
}

#[derive(Debug)]
struct Member {
    kind: Kind,
    link: Link,
    sync: Sync,
    /// Sent, not acknowledged: seq → (offset, length, sent at, bytes).
    unacked: BTreeMap<u64, (u64, u64, u64, u64)>,
    unacked_bytes: u64,
    /// Regions written since the last flush was sent to it.
    unflushed: RegionSet,
    /// Flushes sent, with the regions they make durable.
    flushing: Vec<(u64, RegionSet)>,
    /// Regions it may have lost while it is in the set but being outdated.
    lost: RegionSet,
    /// `unflushed` and `flushing` name everything it may hold unflushed: a
    /// flush this engine sent after its welcome succeeded. Until then it
    /// may also hold unflushed writes of former primaries.
    tracked: bool,
    /// The sequence counter at its last welcome.
    welcomed_at: u64,
    /// It restarted and may have lost unflushed writes nobody can name:
    /// when it is outdated, it copies every region.
    full_resync: bool,
    /// In the set, but back from a restart: it must be outdated before it
    /// gets writes or serves reads.
    damaged: bool,
    /// What its last welcome said.
    intact: bool,
    outdating: Option<u64>,
    /// The control plane refused `outdating`: it is the last up-to-date
    /// member.
    outdate_refused: bool,
    joining_proposal: Option<u64>,
    /// Persisted map's generation, when one exists for it.
    map_since: Option<Generation>,
    /// Regions written while it resyncs, kept in its persisted map.
    written_during_sync: RegionSet,
    progress_mark: (u64, u64),
}

impl Member {
    fn new(kind: Kind, sync: Sync) -> Self {
        Member {
            kind,
            link: Link::Down,
            sync,
            unacked: BTreeMap::new(),
            unacked_bytes: 0,
            unflushed: RegionSet::new(),
            flushing: Vec::new(),
            lost: RegionSet::new(),
            tracked: false,
            welcomed_at: 0,
            full_resync: false,
            damaged: false,
            intact: false,
            outdating: None,
            outdate_refused: false,
            joining_proposal: None,
            map_since: None,
            written_during_sync: RegionSet::new(),
            progress_mark: (0, 0),
        }
    }

    fn is_up(&self) -> bool {
        matches!(self.link, Link::Up { .. })
    }

    /// Its acknowledgement is required for a write to complete.
    fn is_needed(&self) -> bool {
        match self.sync {
            Sync::InSync => true,
            Sync::Joining { .. } => true,
            _ => self.joining_proposal.is_some(),
        }
    }

    /// Receives writes.
    fn takes_writes(&self) -> bool {
        self.is_up() && !self.damaged && !matches!(self.sync, Sync::Outdated { .. })
    }
}

#[derive(Debug)]
enum Purpose {
    Client(OpId),
    Repair,
    Internal,
}

#[derive(Debug)]
struct PendingWrite {
    purpose: Purpose,
    range: (u64, u64),
    flush: bool,
    /// What a write carries (and whether it is FUA), to send it again to a
    /// member that reconnects before acknowledging it.
    payload: Option<(Payload, bool)>,
    needed: BTreeSet<NodeId>,
    acked: BTreeSet<NodeId>,
    errors: Vec<(NodeId, ReplicaError)>,
    persist_token: u64,
    started_ms: u64,
}

#[derive(Debug)]
struct PendingRead {
    op: Option<OpId>,
    offset: u64,
    length: u64,
    source: NodeId,
    bad: Vec<NodeId>,
}

#[derive(Debug)]
enum Phase {
    /// Waiting for the up-to-date members' welcomes.
    Reconciling {
        since_ms: u64,
        welcomes: BTreeMap<NodeId, (bool, RegionSet)>,
        /// Regions of former primaries' unsettled writes, as reported.
        /// Kept when a member's link drops: it cannot report them again.
        unsettled: RegionSet,
    },
    /// Copying the regions some members may hold differently.
    Copying {
        remaining: usize,
    },
    Serving,
    Stopped,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counters {
    pub repaired_blocks: u64,
    pub read_failovers: u64,
    pub resynced_bytes: u64,
    pub writes_completed: u64,
}

pub struct Primary {
    me: NodeId,
    size_bytes: u64,
    view: View,
    policy: NoQuorumPolicy,
    resync_rate: u64,
    members: BTreeMap<NodeId, Member>,
    phase: Phase,
    next_seq: u64,
    writes: BTreeMap<u64, PendingWrite>,
    reads: BTreeMap<u64, PendingRead>,
    queue: VecDeque<(OpId, ClientRequest)>,
    /// Regions a resync is reading: writes to them wait.
    resync_locks: BTreeSet<u64>,
    /// Failed writes some members may still apply, with those members:
    /// `settled` stays below them.
    failed_in_flight: BTreeMap<u64, BTreeSet<NodeId>>,
    /// The oldest failed write some member applied: `settled` never passes
    /// it while this engine runs.
    unsettled_floor: Option<u64>,
    /// Reconcile copies whose source is gone and no other could serve:
    /// the tick sends them again.
    stalled_reads: Vec<(u64, PendingRead)>,
    /// Sources whose read of a region failed (a bad block, a device
    /// error): the region is read elsewhere, or from them again after the
    /// next tick, never in a tight loop.
    resync_failed: BTreeMap<u64, BTreeSet<NodeId>>,
    /// Of those, the ones whose copy failed its checksum: repaired when
    /// another source supplies the region.
    resync_corrupt: BTreeMap<u64, BTreeSet<NodeId>>,
    proposals: BTreeMap<u64, (Proposal, u64)>,
    persist_next: u64,
    persisted_through: u64,
    /// Dirty maps reconciliation changed: serving waits for them.
    serve_after: u64,
    /// The regions reconciliation copies (while `Phase::Copying`): a member
    /// outdated meanwhile may not have got them.
    copying: RegionSet,
    resync_tokens: f64,
    last_tick_ms: u64,
    last_progress_ms: u64,
    now_ms: u64,
    local_readable: bool,
    /// Detach asked: `Some(None)` until the final flush is sent, then its
    /// sequence.
    detaching: Option<Option<u64>>,
    actions: Vec<Action>,
    pub counters: Counters,
}

impl Primary {
    pub fn new(config: Config, now_ms: u64) -> Primary {
        let mut members = BTreeMap::new();
        for &node in &config.view.diskful {
            // A map names what this node's engine wrote while the peer was
            // away; a primary of a generation in between (on another node)
            // wrote without it, so only a map of the generation just
            // before ours is complete.
            let map = config
                .dirty_maps
                .get(&node)
                .filter(|map| map.since.next() == config.view.generation);
            let sync = if config.view.in_sync.contains(&node) {
                Sync::InSync
            } else {
                let backlog = match map {
                    Some(map) if !map.full => Backlog {
                        set: map.regions.clone(),
                        sweep: None,
                    },
                    _ => Backlog::full(),
                };
                Sync::Outdated { backlog }
            };
            let mut member = Member::new(Kind::Diskful, sync);
            member.map_since = map.map(|map| map.since);
            members.insert(node, member);
        }
        for &node in &config.view.tiebreakers {
            members.insert(node, Member::new(Kind::Tiebreaker, Sync::InSync));
        }
        let mut primary = Primary {
            me: config.me,
            size_bytes: config.size_bytes,
            view: config.view,
            policy: config.policy,
            resync_rate: config.resync_rate,
            members,
            phase: Phase::Reconciling {
                since_ms: now_ms,
                welcomes: BTreeMap::new(),
                unsettled: RegionSet::new(),
            },
            next_seq: 1,
            writes: BTreeMap::new(),
            reads: BTreeMap::new(),
            queue: VecDeque::new(),
            resync_locks: BTreeSet::new(),
            failed_in_flight: BTreeMap::new(),
            unsettled_floor: None,
            stalled_reads: Vec::new(),
            resync_failed: BTreeMap::new(),
            resync_corrupt: BTreeMap::new(),
            proposals: BTreeMap::new(),
            persist_next: 1,
            persisted_through: 0,
            serve_after: 0,
            copying: RegionSet::new(),
            resync_tokens: 0.0,
            last_tick_ms: now_ms,
            last_progress_ms: now_ms,
            now_ms,
            local_readable: false,
            detaching: None,
            actions: Vec::new(),
            counters: Counters::default(),
        };
        let nodes: Vec<NodeId> = primary.members.keys().copied().collect();
        for node in nodes {
            primary.actions.push(Action::Connect { to: node });
        }
        primary.check();
        primary
    }

    pub fn generation(&self) -> Generation {
        self.view.generation
    }

    pub fn is_serving(&self) -> bool {
        matches!(self.phase, Phase::Serving)
    }

    pub fn is_stopped(&self) -> bool {
        matches!(self.phase, Phase::Stopped)
    }

    /// Members whose copy is up to date and linked: where reads may go.
    pub fn readable_members(&self) -> Vec<NodeId> {
        self.members
            .iter()
            .filter(|(_, m)| m.kind == Kind::Diskful && matches!(m.sync, Sync::InSync))
            .filter(|(_, m)| m.is_up() && m.outdating.is_none() && !m.damaged)
            .map(|(&node, _)| node)
            .collect()
    }

    /// The member's state for status output: up-to-date, outdated, syncing.
    pub fn member_states(&self) -> Vec<(NodeId, String, Option<SyncProgress>)> {
        self.members
            .iter()
            .filter(|(_, m)| m.kind == Kind::Diskful)
            .map(|(&node, m)| {
                let (state, progress) = match &m.sync {
                    Sync::InSync if m.outdating.is_some() => ("outdating", None),
                    Sync::InSync => ("up-to-date", None),
                    Sync::Outdated { .. } => ("outdated", None),
                    Sync::Resyncing { total, done, .. } => (
                        "syncing",
                        Some(SyncProgress {
                            done_bytes: *done,
                            total_bytes: *total,
                            rate_bytes_per_sec: 0,
                        }),
                    ),
                    Sync::Joining { .. } => ("joining", None),
                };
                (node, state.to_string(), progress)
            })
            .collect()
    }

    pub fn take_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.actions)
    }

    fn region_count(&self) -> u64 {
        self.size_bytes.div_ceil(REGION_BYTES)
    }

    /// Sequences, read ids and proposal ids share one counter, so a
    /// member's unacknowledged map never confuses a read with a write.
    fn id(&mut self) -> u64 {
        let id = self.next_seq;
        self.next_seq += 1;
        id
    }

    // ---- events -------------------------------------------------------

    /// The driver connected to `node` (or to the local replica).
    pub fn link_up(&mut self, node: NodeId, now_ms: u64) {
        self.now_ms = now_ms;
        let generation = self.view.generation;
        let me = self.me;
        let Some(member) = self.members.get_mut(&node) else {
            self.actions.push(Action::Reset { to: node });
            return;
        };
        member.link = Link::Hello(now_ms);
        self.actions.push(Action::Send {
            to: node,
            message: ToReplica::Hello {
                generation,
                primary: me,
            },
        });
    }

    /// The link to `node` closed or could not be made. The driver retries
    /// `Connect` later on its own.
    pub fn link_down(&mut self, node: NodeId, now_ms: u64) {
        self.now_ms = now_ms;
        self.lose_link(node);
        self.progress();
    }

    pub fn client(&mut self, op: OpId, request: ClientRequest, now_ms: u64) {
        self.now_ms = now_ms;
        if self.is_stopped() || self.detaching.is_some() {
            self.actions.push(Action::Complete {
                op,
                result: Err(ClientError::ShuttingDown),
            });
            return;
        }
        self.queue.push_back((op, request));
        self.progress();
    }

    pub fn message(&mut self, from: NodeId, message: FromReplica, now_ms: u64) {
        self.now_ms = now_ms;
        if !self.members.contains_key(&from) {
            return;
        }
        match message {
            FromReplica::Welcome {
                previous,
                intact,
                was_primary,
                unsettled,
            } => self.on_welcome(from, previous, intact, was_primary, unsettled),
            FromReplica::Refused { newer } => {
                self.stop(format!(
                    "node {from} has seen generation {newer}; this primary (generation {}) is fenced",
                    self.view.generation
                ));
            }
            FromReplica::Ack { seq, result } => self.on_ack(from, seq, result),
            FromReplica::ReadReply { id, result } => self.on_read_reply(from, id, result),
        }
        self.progress();
    }

    pub fn persisted(&mut self, token: u64, now_ms: u64) {
        self.now_ms = now_ms;
        self.persisted_through = self.persisted_through.max(token);
        self.progress();
    }

    pub fn proposal_result(&mut self, id: u64, result: ProposalResult, now_ms: u64) {
        self.now_ms = now_ms;
        let Some((proposal, _)) = self.proposals.remove(&id) else {
            return;
        };
        match result {
            ProposalResult::Stale => {
                self.stop(format!(
                    "the control plane refused generation {}: a newer primary exists",
                    self.view.generation
                ));
            }
            ProposalResult::Unavailable => {
                // Retried by the tick: keep the id so the member stays
                // waiting on it.
                self.proposals.insert(id, (proposal, now_ms));
            }
            ProposalResult::Committed => self.on_committed(id, proposal),
            ProposalResult::Refused(message) => match proposal {
                Proposal::MarkOutdated { node } => {
                    // The set would have become empty: the write that needs
                    // this member cannot complete. Keep trying (another
                    // member may join meanwhile); the io-error policy fails
                    // such writes after a while. Should the member come
                    // back first, it stays in the set (`keep_last_member`).
                    let _ = message;
                    self.proposals
                        .insert(id, (Proposal::MarkOutdated { node }, now_ms));
                    if let Some(member) = self.members.get_mut(&node) {
                        if member.outdating == Some(id) {
                            member.outdate_refused = true;
                            // Perhaps it is back already.
                            self.keep_if_back(node);
                        }
                    }
                }
                Proposal::MarkInSync { node } => {
                    if let Some(member) = self.members.get_mut(&node) {
                        member.joining_proposal = None;
                        member.sync = Sync::Outdated {
                            backlog: Backlog::full(),
                        };
                        // Outdated members resync after their next welcome:
                        // a linked one must reconnect, or it never would.
                        if member.is_up() {
                            self.actions.push(Action::Reset { to: node });
                            self.lose_link(node);
                        }
                        self.persist_map(node);
                    }
                }
                Proposal::Progress { .. } => {}
            },
        }
        self.progress();
    }

    /// A new state from the control plane.
    pub fn view(&mut self, view: View, now_ms: u64) {
        self.now_ms = now_ms;
        if self.is_stopped() {
            return;
        }
        if view.generation != self.view.generation || !view.primaries.contains(&self.me) {
            self.view = view;
            self.stop("detached, or another node was attached at a newer generation".into());
            return;
        }
        let old = std::mem::replace(&mut self.view, view);
        // Members added or removed.
        let diskful = self.view.diskful.clone();
        let tiebreakers = self.view.tiebreakers.clone();
        self.members.retain(|node, member| match member.kind {
            Kind::Diskful => diskful.contains(node),
            Kind::Tiebreaker => tiebreakers.contains(node),
        });
        for &node in &diskful {
            if let std::collections::btree_map::Entry::Vacant(entry) = self.members.entry(node) {
                entry.insert(Member::new(
                    Kind::Diskful,
                    Sync::Outdated {
                        backlog: Backlog::full(),
                    },
                ));
                self.actions.push(Action::Connect { to: node });
            }
        }
        for &node in &tiebreakers {
            if let std::collections::btree_map::Entry::Vacant(entry) = self.members.entry(node) {
                entry.insert(Member::new(Kind::Tiebreaker, Sync::InSync));
                self.actions.push(Action::Connect { to: node });
            }
        }
        // The set as committed is the truth: a member in it that we hold
        // outdated must be outdated through the control plane again.
        let in_sync = self.view.in_sync.clone();
        let nodes: Vec<NodeId> = self.members.keys().copied().collect();
        for node in nodes {
            let member = self.members.get_mut(&node).expect("listed");
            if member.kind != Kind::Diskful {
                continue;
            }
            let listed = in_sync.contains(&node);
            match (&member.sync, listed) {
                (Sync::InSync, false) if old.in_sync.contains(&node) => {
                    // Outdated by someone else (the other primary): treat
                    // as committed.
                    self.become_outdated(node);
                }
                _ => {}
            }
        }
        self.progress();
    }

    pub fn tick(&mut self, now_ms: u64) {
        let elapsed = now_ms.saturating_sub(self.last_tick_ms);
        self.now_ms = now_ms;
        self.last_tick_ms = now_ms;
        if self.is_stopped() {
            return;
        }
        self.resync_failed.clear();
        if self.resync_corrupt.len() > 1024 {
            self.resync_corrupt.clear();
        }
        if self.resync_rate > 0 {
            let cap = (RESYNC_WINDOW as u64 * REGION_BYTES).max(self.resync_rate / 4) as f64;
            self.resync_tokens =
                (self.resync_tokens + self.resync_rate as f64 * elapsed as f64 / 1000.0).min(cap);
        }
        // Silent links.
        let mut silent = Vec::new();
        for (&node, member) in &self.members {
            let oldest = member.unacked.values().map(|&(_, _, sent, _)| sent).min();
            let stuck = match member.link {
                Link::Hello(since) => now_ms.saturating_sub(since) > ACK_TIMEOUT_MS,
                Link::Up { .. } => {
                    oldest.is_some_and(|sent| now_ms.saturating_sub(sent) > ACK_TIMEOUT_MS)
                }
                Link::Down => false,
            };
            if stuck {
                silent.push(node);
            }
        }
        for node in silent {
            self.actions.push(Action::Reset { to: node });
            self.lose_link(node);
        }
        // Proposals that found no leader.
        let retry: Vec<u64> = self
            .proposals
            .iter()
            .filter(|(_, (_, sent))| now_ms.saturating_sub(*sent) >= PROPOSAL_RETRY_MS)
            .map(|(&id, _)| id)
            .collect();
        for id in retry {
            let entry = self.proposals.get_mut(&id).expect("listed");
            entry.1 = now_ms;
            self.actions.push(Action::Propose {
                id,
                proposal: entry.0.clone(),
            });
        }
        // Copied members whose MarkInSync had to wait.
        let joining: Vec<NodeId> = self
            .members
            .iter()
            .filter(|(_, m)| matches!(m.sync, Sync::Joining { flush: None }))
            .map(|(&n, _)| n)
            .collect();
        for node in joining {
            self.propose_joining(node);
        }
        // Reconcile copies that lost their source.
        for (id, mut read) in std::mem::take(&mut self.stalled_reads) {
            match self.readable_members().into_iter().next() {
                Some(source) => {
                    read.source = source;
                    read.bad.clear();
                    self.send_read(id, read);
                }
                None => self.stalled_reads.push((id, read)),
            }
        }
        // Reconciling: silent up-to-date members are outdated.
        if let Phase::Reconciling { since_ms, .. } = self.phase {
            if now_ms.saturating_sub(since_ms) > RECONCILE_WAIT_MS {
                let silent: Vec<NodeId> = self
                    .members
                    .iter()
                    .filter(|(_, m)| {
                        m.kind == Kind::Diskful
                            && matches!(m.sync, Sync::InSync)
                            && !m.is_up()
                            && m.outdating.is_none()
                    })
                    .map(|(&node, _)| node)
                    .collect();
                for node in silent {
                    self.start_outdating(node);
                }
            }
        }
        // Writes without quorum under the io-error policy.
        if self.policy == NoQuorumPolicy::IoError {
            let expired: Vec<u64> = self
                .writes
                .iter()
                .filter(|(_, w)| now_ms.saturating_sub(w.started_ms) > NO_QUORUM_FAIL_MS)
                .map(|(&seq, _)| seq)
                .collect();
            for seq in expired {
                let write = self.writes.remove(&seq).expect("listed");
                self.abandon(seq, &write.acked);
                self.copy_again(write.range);
                if let Purpose::Client(op) = write.purpose {
                    self.actions.push(Action::Complete {
                        op,
                        result: Err(ClientError::Io(
                            "the volume has no quorum: too few up-to-date replicas answer".into(),
                        )),
                    });
                }
            }
            if !self.is_serving() {
                self.fail_queue_if_stuck();
            }
        }
        if now_ms.saturating_sub(self.last_progress_ms) >= PROGRESS_EVERY_MS {
            self.report_progress(now_ms);
        }
        self.progress();
    }

    /// Detach: new requests are refused; once those in flight are done, a
    /// final flush runs and every replica is told its copy is clean, so
    /// the next primary needs no reconciliation. `Stopped` follows.
    pub fn detach(&mut self, now_ms: u64) {
        self.now_ms = now_ms;
        if self.detaching.is_none() {
            self.detaching = Some(None);
        }
        self.progress();
    }

    fn continue_detach(&mut self) {
        let Some(flush) = self.detaching else {
            return;
        };
        match flush {
            None => {
                if !self.queue.is_empty() || !self.writes.is_empty() || !self.reads.is_empty() {
                    return;
                }
                let seq = self.id();
                self.send_flush(seq, Purpose::Internal);
                self.detaching = Some(Some(seq));
            }
            Some(seq) => {
                if self.writes.contains_key(&seq) {
                    return;
                }
                let nodes: Vec<NodeId> = self
                    .members
                    .iter()
                    .filter(|(_, m)| m.is_up())
                    .map(|(&n, _)| n)
                    .collect();
                for node in nodes {
                    self.actions.push(Action::Send {
                        to: node,
                        message: ToReplica::Goodbye,
                    });
                }
                self.stop("detached".into());
            }
        }
    }

    /// Ends the engine at once: everything not completed fails.
    pub fn stop(&mut self, reason: String) {
        if self.is_stopped() {
            return;
        }
        self.phase = Phase::Stopped;
        for (_, write) in std::mem::take(&mut self.writes) {
            if let Purpose::Client(op) = write.purpose {
                self.actions.push(Action::Complete {
                    op,
                    result: Err(ClientError::ShuttingDown),
                });
            }
        }
        for (_, read) in std::mem::take(&mut self.reads) {
            if let Some(op) = read.op {
                self.actions.push(Action::Complete {
                    op,
                    result: Err(ClientError::ShuttingDown),
                });
            }
        }
        for (op, _) in std::mem::take(&mut self.queue) {
            self.actions.push(Action::Complete {
                op,
                result: Err(ClientError::ShuttingDown),
            });
        }
        self.set_local_readable(false);
        self.actions.push(Action::Stopped { reason });
    }

    // ---- internals ----------------------------------------------------

    fn fail_queue_if_stuck(&mut self) {
        let Phase::Reconciling { since_ms, .. } = self.phase else {
            return;
        };
        if self.now_ms.saturating_sub(since_ms) <= NO_QUORUM_FAIL_MS {
            return;
        }
        for (op, _) in std::mem::take(&mut self.queue) {
            self.actions.push(Action::Complete {
                op,
                result: Err(ClientError::Io(
                    "the volume cannot reach an up-to-date replica".into(),
                )),
            });
        }
    }

    fn on_welcome(
        &mut self,
        from: NodeId,
        previous: Generation,
        intact: bool,
        was_primary: bool,
        unsettled: RegionSet,
    ) {
        let generation = self.view.generation;
        let member = self.members.get_mut(&from).expect("checked");
        if !matches!(member.link, Link::Hello(_)) {
            return;
        }
        member.link = Link::Up { previous };
        if member.kind == Kind::Tiebreaker {
            return;
        }
        member.welcomed_at = self.next_seq;
        member.intact = intact;
        if !intact && !member.tracked {
            // It restarted, and lost what it had not flushed, including
            // writes of former primaries we know nothing about.
            member.full_resync = true;
        }
        if !intact
            && matches!(member.sync, Sync::InSync | Sync::Joining { .. })
            && !matches!(self.phase, Phase::Reconciling { .. })
        {
            // In the set (or about to be), yet it restarted: it gets no
            // write until it is outdated (a write would make it claim to
            // be intact to the next primary).
            member.damaged = true;
        }
        if let Phase::Reconciling {
            unsettled: reported,
            ..
        } = &mut self.phase
        {
            // Only a member new to this generation tells us about a former
            // primary's unsettled writes, whatever we think of it.
            if previous < generation {
                reported.union_with(&unsettled);
            }
        }
        if self.keep_if_back(from) {
            return;
        }
        let member = self.members.get_mut(&from).expect("checked");
        match &mut member.sync {
            Sync::InSync if member.outdating.is_none() => {
                if let Phase::Reconciling { welcomes, .. } = &mut self.phase {
                    // One that restarted may lack acknowledged writes, even
                    // if it already welcomed us before: it is not trusted.
                    welcomes.insert(from, (intact, RegionSet::new()));
                } else {
                    // Back while serving: whatever it missed in between is
                    // unknown to it; take it through the outdated path.
                    self.start_outdating(from);
                }
            }
            Sync::InSync => {}
            Sync::Outdated { backlog } => {
                let partial =
                    member.map_since == Some(previous) && !was_primary && !member.full_resync;
                member.full_resync = false;
                let mut backlog = if partial {
                    std::mem::take(backlog)
                } else {
                    Backlog::full()
                };
                // A former primary's unsettled writes may be on it alone.
                backlog.add_set(&unsettled);
                member.map_since = Some(generation);
                member.written_during_sync.clear();
                let map = backlog.to_map(generation);
                let total = backlog.len(self.size_bytes.div_ceil(REGION_BYTES)) * REGION_BYTES;
                member.sync = Sync::Resyncing {
                    backlog,
                    total,
                    done: 0,
                    writes: BTreeMap::new(),
                    reads: BTreeMap::new(),
                };
                member.progress_mark = (self.now_ms, 0);
                let token = self.persist_next;
                self.persist_next += 1;
                self.actions.push(Action::PersistDirty {
                    token,
                    peer: from,
                    map,
                });
            }
            Sync::Resyncing { .. } | Sync::Joining { .. } => {}
        }
        self.resend_pending(from);
    }

    /// A member that (re)connects gets the writes and flushes still pending
    /// that it has not acknowledged: they were sent on a link that broke,
    /// or not at all. Without them, a write waiting for its acknowledgement
    /// (for the quorum, or because it is needed) would wait forever.
    fn resend_pending(&mut self, node: NodeId) {
        if !self
            .members
            .get(&node)
            .is_some_and(|m| m.kind == Kind::Diskful && m.takes_writes())
        {
            return;
        }
        // What it failed on the link it had, it may apply on this one.
        for write in self.writes.values_mut() {
            write.errors.retain(|(n, _)| *n != node);
        }
        type Resend = (u64, Option<(u64, Payload, bool)>);
        let pending: Vec<Resend> = self
            .writes
            .iter()
            .filter(|(_, w)| !w.acked.contains(&node))
            .filter_map(|(&seq, w)| {
                if w.flush {
                    Some((seq, None))
                } else {
                    w.payload
                        .as_ref()
                        .map(|(payload, fua)| (seq, Some((w.range.0, payload.clone(), *fua))))
                }
            })
            .collect();
        for (seq, write) in pending {
            match write {
                Some((offset, payload, fua)) => self.send_write(node, seq, offset, &payload, fua),
                None => {
                    let now = self.now_ms;
                    let member = self.members.get_mut(&node).expect("checked");
                    let regions = std::mem::take(&mut member.unflushed);
                    member.flushing.push((seq, regions));
                    member.unacked.insert(seq, (0, 0, now, 0));
                    self.actions.push(Action::Send {
                        to: node,
                        message: ToReplica::Flush { seq },
                    });
                }
            }
        }
    }

    fn on_ack(&mut self, from: NodeId, seq: u64, result: Result<(), ReplicaError>) {
        if let Some(waiting) = self.failed_in_flight.get_mut(&seq) {
            waiting.remove(&from);
            if waiting.is_empty() {
                self.failed_in_flight.remove(&seq);
            }
            if result.is_ok() {
                // It applied a write that failed.
                self.pin_unsettled(seq);
            }
        }
        let member = self.members.get_mut(&from).expect("checked");
        if let Some((_, _, _, bytes)) = member.unacked.remove(&seq) {
            member.unacked_bytes -= bytes;
        }
        // A flush makes what was sent before it durable (and every earlier
        // flush's regions with it). Only its own acknowledgement says so:
        // a write sent after it may complete first.
        if result.is_ok() && member.flushing.iter().any(|(flush, _)| *flush == seq) {
            member.flushing.retain(|(flush, _)| *flush > seq);
            if seq > member.welcomed_at {
                member.tracked = true;
            }
        }
        let mut resync_region = None;
        let mut joined = false;
        match &mut member.sync {
            Sync::Resyncing { writes, done, .. } => {
                if let Some(region) = writes.remove(&seq) {
                    *done += region_range(region, self.size_bytes).1;
                    resync_region = Some(region);
                }
            }
            Sync::Joining { flush } if *flush == Some(seq) && result.is_ok() => {
                joined = true;
            }
            _ => {}
        }
        if let Some(region) = resync_region {
            match &result {
                Ok(()) => self.counters.resynced_bytes += region_range(region, self.size_bytes).1,
                Err(_) => {
                    let member = self.members.get_mut(&from).expect("checked");
                    if let Sync::Resyncing { backlog, .. } = &mut member.sync {
                        backlog.add(region);
                    }
                    self.actions.push(Action::Reset { to: from });
                    self.lose_link(from);
                }
            }
            return;
        }
        if joined {
            if let Some(member) = self.members.get_mut(&from) {
                member.sync = Sync::Joining { flush: None };
            }
            self.propose_joining(from);
            return;
        }
        if let Some(write) = self.writes.get_mut(&seq) {
            match result {
                Ok(()) => {
                    write.acked.insert(from);
                    // Members that failed it when nobody else had it yet
                    // are out of date now that someone has.
                    let failed: Vec<NodeId> = write.errors.iter().map(|(n, _)| *n).collect();
                    for node in failed {
                        if self.members.get(&node).is_some_and(|m| m.is_up()) {
                            self.actions.push(Action::Reset { to: node });
                            self.lose_link(node);
                        }
                    }
                }
                Err(error) => {
                    write.errors.push((from, error.clone()));
                    let others_have_it = !write.acked.is_empty()
                        || write
                            .needed
                            .iter()
                            .any(|n| *n != from && !write.errors.iter().any(|(e, _)| e == n));
                    // A member that could not apply what the others did is
                    // out of date; if none could, the request fails as a
                    // whole and they all stay alike.
                    if others_have_it {
                        self.actions.push(Action::Reset { to: from });
                        self.lose_link(from);
                    }
                }
            }
        } else if let Err(error) = result {
            // The request was abandoned (the write failed as a whole) but
            // this member may have applied part of it: resync it.
            let _ = error;
            self.actions.push(Action::Reset { to: from });
            self.lose_link(from);
        }
    }

    fn on_read_reply(&mut self, from: NodeId, id: u64, result: Result<ReadData, ReplicaError>) {
        let member = self.members.get_mut(&from).expect("checked");
        if let Some((_, _, _, bytes)) = member.unacked.remove(&id) {
            member.unacked_bytes -= bytes;
        }
        // A resync source read?
        let mut target = None;
        for (&node, m) in &self.members {
            if let Sync::Resyncing { reads, .. } = &m.sync {
                if reads.contains_key(&id) {
                    target = Some(node);
                }
            }
        }
        if let Some(target) = target {
            self.on_resync_read(target, id, result);
            return;
        }
        let Some(mut read) = self.reads.remove(&id) else {
            return;
        };
        match result {
            Ok(data) => {
                if let Some(op) = read.op {
                    self.actions.push(Action::Complete {
                        op,
                        result: Ok(Completion::Read(data.clone())),
                    });
                } else {
                    // A reconcile copy: the source's version goes to the
                    // others.
                    self.reconcile_copy(read.offset, read.length, data, from);
                    return;
                }
                if !read.bad.is_empty() {
                    self.repair(
                        read.offset,
                        read.length,
                        data,
                        std::mem::take(&mut read.bad),
                    );
                }
            }
            Err(error) => {
                match &error {
                    ReplicaError::Checksum(_) => read.bad.push(from),
                    _ => {
                        self.actions.push(Action::Reset { to: from });
                        self.lose_link(from);
                    }
                }
                self.counters.read_failovers += 1;
                let tried: BTreeSet<NodeId> = read
                    .bad
                    .iter()
                    .copied()
                    .chain([from, read.source])
                    .collect();
                let next = self
                    .readable_members()
                    .into_iter()
                    .find(|node| !tried.contains(node));
                match next {
                    Some(next) => {
                        read.source = next;
                        self.send_read(id, read);
                    }
                    None => {
                        if let Some(op) = read.op {
                            self.actions.push(Action::Complete {
                                op,
                                result: Err(ClientError::Io(format!(
                                    "no up-to-date replica could serve the read; the last said: {error}"
                                ))),
                            });
                        } else if read.length > BLOCK_BYTES
                            && matches!(error, ReplicaError::Checksum(_))
                            && !self.readable_members().is_empty()
                        {
                            // Every source has a bad block in the range, but
                            // perhaps not the same one: copy block by block.
                            let blocks = read.length.div_ceil(BLOCK_BYTES);
                            if let Phase::Copying { remaining } = &mut self.phase {
                                *remaining += blocks as usize - 1;
                            }
                            for index in 0..blocks {
                                let offset = read.offset + index * BLOCK_BYTES;
                                let length = BLOCK_BYTES.min(read.offset + read.length - offset);
                                let id = self.id();
                                let source = self.resync_sources()[0];
                                self.send_read(
                                    id,
                                    PendingRead {
                                        op: None,
                                        offset,
                                        length,
                                        source,
                                        bad: Vec::new(),
                                    },
                                );
                            }
                        } else if let Phase::Copying { remaining } = &mut self.phase {
                            // Nothing to copy from (a block bad on every
                            // source, or no source left): the range stays as
                            // each member has it.
                            *remaining -= 1;
                            self.maybe_serve();
                        }
                    }
                }
            }
        }
    }

    /// Writes the good data over the copies that failed their checksum.
    /// One write for all the bad copies: writes in flight never overlap.
    fn repair(&mut self, offset: u64, length: u64, data: ReadData, bad: Vec<NodeId>) {
        if self.overlaps_active(offset, length) {
            // A newer write is on its way there; the next read repairs.
            return;
        }
        let payload = match data {
            ReadData::Data(bytes) => Payload::Data(Arc::from(bytes)),
            ReadData::Zeroes => Payload::Zeroes {
                length,
                trim: false,
            },
        };
        let targets: BTreeSet<NodeId> = bad
            .into_iter()
            .filter(|node| self.members.get(node).is_some_and(|m| m.takes_writes()))
            .collect();
        if targets.is_empty() {
            return;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        for &node in &targets {
            self.send_write(node, seq, offset, &payload, true);
            self.counters.repaired_blocks += length / 4096;
        }
        self.writes.insert(
            seq,
            PendingWrite {
                purpose: Purpose::Repair,
                range: (offset, length),
                flush: false,
                payload: Some((payload, true)),
                needed: targets,
                acked: BTreeSet::new(),
                errors: Vec::new(),
                persist_token: 0,
                started_ms: self.now_ms,
            },
        );
    }

    fn on_committed(&mut self, id: u64, proposal: Proposal) {
        match proposal {
            Proposal::MarkOutdated { node } => {
                if self
                    .members
                    .get(&node)
                    .is_some_and(|m| m.outdating == Some(id))
                {
                    self.become_outdated(node);
                }
            }
            Proposal::MarkInSync { node } => {
                let Some(member) = self.members.get_mut(&node) else {
                    return;
                };
                if member.joining_proposal != Some(id) {
                    return;
                }
                member.joining_proposal = None;
                let whole = member.is_up() && !member.damaged && member.lost.is_empty();
                if matches!(member.sync, Sync::Joining { .. }) && whole {
                    member.sync = Sync::InSync;
                    member.map_since = None;
                    self.actions.push(Action::ForgetDirty { peer: node });
                } else {
                    // It left while the control plane was adding it (even if
                    // it is back, it missed writes): it is in the set but
                    // lacks writes, so take it out again.
                    member.sync = Sync::InSync;
                    self.start_outdating(node);
                }
            }
            Proposal::Progress { .. } => {}
        }
    }

    /// Proposes `MarkInSync` for a copied member, unless a `MarkOutdated`
    /// of it is still unanswered: a retry of that one could commit after
    /// this one and take the member out behind our back. The tick tries
    /// again.
    fn propose_joining(&mut self, node: NodeId) {
        let outdating = self
            .proposals
            .values()
            .any(|(p, _)| *p == Proposal::MarkOutdated { node });
        let Some(member) = self.members.get(&node) else {
            return;
        };
        if outdating
            || member.joining_proposal.is_some()
            || !member.is_up()
            || !matches!(member.sync, Sync::Joining { flush: None })
        {
            return;
        }
        let id = self.id();
        self.members
            .get_mut(&node)
            .expect("checked")
            .joining_proposal = Some(id);
        self.propose(id, Proposal::MarkInSync { node });
    }

    fn propose(&mut self, id: u64, proposal: Proposal) {
        self.proposals.insert(id, (proposal.clone(), self.now_ms));
        self.actions.push(Action::Propose { id, proposal });
    }

    /// An up-to-date member is gone: ask the control plane to outdate it.
    fn start_outdating(&mut self, node: NodeId) {
        let Some(member) = self.members.get(&node) else {
            return;
        };
        if member.outdating.is_some() {
            return;
        }
        let id = self.id();
        self.members.get_mut(&node).expect("checked").outdating = Some(id);
        self.set_local_readable_from_state();
        self.propose(id, Proposal::MarkOutdated { node });
    }

    /// Whether `node`, the last up-to-date member, is linked again after the
    /// control plane refused to outdate it; then it stays in the set.
    fn keep_if_back(&mut self, node: NodeId) -> bool {
        let Some(member) = self.members.get_mut(&node) else {
            return false;
        };
        if !(matches!(member.sync, Sync::InSync) && member.outdate_refused && member.is_up()) {
            return false;
        }
        member.outdate_refused = false;
        let others_in_set = self.members.iter().any(|(&n, m)| {
            n != node
                && m.kind == Kind::Diskful
                && matches!(m.sync, Sync::InSync)
                && m.outdating.is_none()
                && !m.damaged
        });
        if others_in_set {
            // Another member joined meanwhile: the retried outdating
            // commits now.
            return false;
        }
        let member = self.members.get_mut(&node).expect("checked");
        if let Some(id) = member.outdating.take() {
            self.proposals.remove(&id);
        }
        let intact = member.intact;
        if let Phase::Reconciling { welcomes, .. } = &mut self.phase {
            // Nothing was written yet: its welcome counts like any other.
            welcomes.insert(node, (intact, RegionSet::new()));
            self.set_local_readable_from_state();
            return false;
        }
        self.keep_last_member(node, intact);
        self.set_local_readable_from_state();
        true
    }

    /// The control plane refused to outdate `node`, the last up-to-date
    /// member, and it is back: it stays in the set, and its copy is the
    /// truth. Writes it did not acknowledge fail (other members may hold
    /// them, it may not), and every other member copies from it the regions
    /// it may hold differently: those it lost on the link, or every region
    /// when it restarted (it may have lost any unflushed write).
    fn keep_last_member(&mut self, node: NodeId, intact: bool) {
        let member = self.members.get_mut(&node).expect("a member");
        let mut regions = std::mem::take(&mut member.lost);
        if intact {
            // What it had not flushed when its link dropped is still
            // unflushed there.
            member.unflushed.union_with(&regions);
        } else {
            regions = RegionSet::all(self.size_bytes);
        }
        if matches!(self.phase, Phase::Copying { .. }) {
            regions.union_with(&self.copying);
        }
        member.full_resync = false;
        member.damaged = false;
        let failed: Vec<u64> = self
            .writes
            .iter()
            .filter(|(_, w)| w.needed.contains(&node) && !w.acked.contains(&node))
            .map(|(&seq, _)| seq)
            .collect();
        for seq in failed {
            let write = self.writes.remove(&seq).expect("listed");
            self.abandon(seq, &write.acked);
            regions.add_range(write.range.0, write.range.1);
            if let Purpose::Client(op) = write.purpose {
                self.actions.push(Action::Complete {
                    op,
                    result: Err(ClientError::Io(
                        "the last up-to-date replica lost the write with its link".into(),
                    )),
                });
            }
        }
        let others: Vec<NodeId> = self
            .members
            .iter()
            .filter(|(&n, m)| n != node && m.kind == Kind::Diskful)
            .map(|(&n, _)| n)
            .collect();
        for other in others {
            if matches!(self.members[&other].sync, Sync::Joining { .. }) {
                // Copied already, but not from what is now the truth.
                self.actions.push(Action::Reset { to: other });
                self.lose_link(other);
            }
            let member = self.members.get_mut(&other).expect("listed");
            match &mut member.sync {
                Sync::InSync | Sync::Joining { .. } => member.lost.union_with(&regions),
                Sync::Outdated { backlog } | Sync::Resyncing { backlog, .. } => {
                    backlog.add_set(&regions);
                    self.persist_map(other);
                }
            }
        }
    }

    /// The dirty map of an outdated or resyncing member: what it may lack.
    /// A resyncing member's map keeps the regions being copied (until the
    /// copy is acknowledged) and those written meanwhile.
    fn map_of(member: &Member, since: Generation) -> Option<DirtyMap> {
        match &member.sync {
            Sync::Outdated { backlog } => Some(backlog.to_map(since)),
            Sync::Resyncing {
                backlog,
                writes,
                reads,
                ..
            } => {
                let mut map = backlog.to_map(since);
                map.regions.union_with(&member.written_during_sync);
                for &region in writes.values() {
                    map.regions.insert(region);
                }
                for &(region, _) in reads.values() {
                    map.regions.insert(region);
                }
                Some(map)
            }
            _ => None,
        }
    }

    /// Persists the dirty map of an outdated or resyncing member; returns
    /// the token `persisted` will confirm.
    fn persist_map(&mut self, node: NodeId) -> u64 {
        let Some(map) = Self::map_of(&self.members[&node], self.view.generation) else {
            return 0;
        };
        let token = self.persist_next;
        self.persist_next += 1;
        self.actions.push(Action::PersistDirty {
            token,
            peer: node,
            map,
        });
        token
    }

    /// The control plane took `node` out of the set.
    fn become_outdated(&mut self, node: NodeId) {
        let since = self.view.generation;
        let member = self.members.get_mut(&node).expect("checked");
        member.outdating = None;
        member.outdate_refused = false;
        member.damaged = false;
        let mut backlog = if member.full_resync {
            Backlog::full()
        } else {
            Backlog::default()
        };
        backlog.add_set(&member.lost);
        if matches!(self.phase, Phase::Copying { .. }) {
            backlog.add_set(&self.copying);
        }
        member.lost.clear();
        for &(offset, length, _, _) in member.unacked.values() {
            for region in regions_of(offset, length) {
                backlog.add(region);
            }
        }
        backlog.add_set(&member.unflushed);
        for (_, regions) in &member.flushing {
            backlog.add_set(regions);
        }
        if member.is_up() {
            // Still linked (outdated for a disk error or a timeout): it
            // reconnects and resyncs.
            self.actions.push(Action::Reset { to: node });
            member.link = Link::Down;
        }
        member.unacked.clear();
        member.unacked_bytes = 0;
        member.unflushed.clear();
        member.flushing.clear();
        member.map_since = Some(since);
        let map = backlog.to_map(since);
        member.sync = Sync::Outdated { backlog };
        let token = self.persist_next;
        self.persist_next += 1;
        self.actions.push(Action::PersistDirty {
            token,
            peer: node,
            map,
        });
        // Writes that waited for it may complete now, but only once its
        // map is durable.
        for write in self.writes.values_mut() {
            if write.needed.contains(&node) && !write.acked.contains(&node) {
                write.persist_token = write.persist_token.max(token);
            }
        }
        self.set_local_readable_from_state();
    }

    fn lose_link(&mut self, node: NodeId) {
        let Some(member) = self.members.get_mut(&node) else {
            return;
        };
        if matches!(member.link, Link::Down) {
            return;
        }
        // What it acknowledged of the writes still pending is not flushed
        // there and may be lost with the link (its node may have crashed):
        // those acknowledgements no longer count.
        for write in self.writes.values_mut() {
            write.acked.remove(&node);
        }
        // Failed writes it had not answered: its copy of their regions is
        // another primary's business now (it resyncs them, or they are
        // reported unsettled by it).
        self.failed_in_flight.retain(|_, waiting| {
            waiting.remove(&node);
            !waiting.is_empty()
        });
        member.link = Link::Down;
        let unacked = std::mem::take(&mut member.unacked);
        member.unacked_bytes = 0;
        let mut lost = RegionSet::new();
        for &(offset, length, _, _) in unacked.values() {
            lost.add_range(offset, length);
        }
        lost.union_with(&member.unflushed);
        for (_, regions) in &member.flushing {
            lost.union_with(regions);
        }
        member.unflushed.clear();
        member.flushing.clear();
        // `tracked` stays as it was: what it may hold unflushed moves with
        // `lost` into its `lost` set or its backlog below, so a restart
        // that loses those writes loses nothing its resync does not copy.
        let kind = member.kind;
        let joining_proposed = member.joining_proposal.is_some();
        let mut outdate = false;
        let mut joining_dropped = false;
        let mut retry_reads = Vec::new();
        match &mut member.sync {
            _ if kind == Kind::Tiebreaker => {}
            Sync::InSync => {
                member.lost.union_with(&lost);
                outdate = true;
            }
            Sync::Joining { .. } if joining_proposed => {
                // The control plane may be adding it right now; until we
                // know, it counts as up to date and lost.
                member.lost.union_with(&lost);
            }
            Sync::Joining { .. } => {
                let mut backlog = if member.full_resync {
                    Backlog::full()
                } else {
                    Backlog::default()
                };
                backlog.add_set(&lost);
                member.sync = Sync::Outdated { backlog };
                member.damaged = false;
                joining_dropped = true;
            }
            Sync::Resyncing {
                backlog,
                writes,
                reads,
                ..
            } => {
                let mut backlog = std::mem::take(backlog);
                backlog.add_set(&lost);
                for region in writes.values() {
                    backlog.add(*region);
                }
                for (_, (region, _)) in std::mem::take(reads) {
                    self.resync_locks.remove(&region);
                    backlog.add(region);
                }
                member.sync = Sync::Outdated { backlog };
            }
            Sync::Outdated { backlog } => backlog.add_set(&lost),
        }
        // Reads that were waiting on it go elsewhere.
        for (&id, read) in &self.reads {
            if read.source == node {
                retry_reads.push(id);
            }
        }
        for id in retry_reads {
            let mut read = self.reads.remove(&id).expect("listed");
            let next = self
                .readable_members()
                .into_iter()
                .find(|n| *n != node && !read.bad.contains(n));
            match next {
                Some(next) => {
                    read.source = next;
                    self.send_read(id, read);
                }
                None => {
                    if let Some(op) = read.op {
                        self.actions.push(Action::Complete {
                            op,
                            result: Err(ClientError::Io(
                                "no up-to-date replica is reachable".into(),
                            )),
                        });
                    } else {
                        // A reconcile copy: serving waits for it, and it
                        // waits for a source.
                        self.stalled_reads.push((id, read));
                    }
                }
            }
        }
        // Resync reads that were waiting on it go back to their backlogs.
        for member in self.members.values_mut() {
            if let Sync::Resyncing { reads, backlog, .. } = &mut member.sync {
                let gone: Vec<u64> = reads
                    .iter()
                    .filter(|(_, (_, source))| *source == node)
                    .map(|(&id, _)| id)
                    .collect();
                for id in gone {
                    let (region, _) = reads.remove(&id).expect("listed");
                    self.resync_locks.remove(&region);
                    backlog.add(region);
                }
            }
        }
        if outdate {
            self.start_outdating(node);
        }
        if joining_dropped {
            // Writes waited for it; they complete without it once its map
            // names what it lacks.
            let token = self.persist_map(node);
            for write in self.writes.values_mut() {
                if write.needed.contains(&node) {
                    write.persist_token = write.persist_token.max(token);
                }
            }
        }
        if let Phase::Reconciling { welcomes, .. } = &mut self.phase {
            welcomes.remove(&node);
        }
        self.set_local_readable_from_state();
    }

    fn set_local_readable_from_state(&mut self) {
        let readable = self.is_serving() && self.readable_members().contains(&self.me);
        self.set_local_readable(readable);
    }

    fn set_local_readable(&mut self, readable: bool) {
        if readable != self.local_readable {
            self.local_readable = readable;
            self.actions.push(Action::LocalReadable(readable));
        }
    }

    fn overlaps_active(&self, offset: u64, length: u64) -> bool {
        let end = offset + length;
        self.writes
            .values()
            .any(|w| w.range.1 > 0 && w.range.0 < end && offset < w.range.0 + w.range.1)
            || regions_of(offset, length).any(|r| self.resync_locks.contains(&r))
    }

    /// Moves everything that can move: reconciliation, queued requests,
    /// completions, resyncs.
    fn progress(&mut self) {
        if self.is_stopped() {
            return;
        }
        if matches!(self.phase, Phase::Reconciling { .. }) {
            self.try_finish_reconcile();
        }
        if matches!(self.phase, Phase::Copying { .. } | Phase::Serving) {
            self.complete_writes();
        }
        if self.is_serving() {
            if self.detaching.is_none() {
                self.start_queued();
            }
            self.complete_writes();
            self.pump_resyncs();
            self.continue_detach();
        }
        self.check();
    }

    fn try_finish_reconcile(&mut self) {
        let Phase::Reconciling {
            welcomes,
            unsettled: reported,
            ..
        } = &self.phase
        else {
            return;
        };
        // Every up-to-date member has answered or is being outdated.
        let waiting = self.members.iter().any(|(node, m)| {
            m.kind == Kind::Diskful
                && matches!(m.sync, Sync::InSync)
                && m.outdating.is_none()
                && !welcomes.contains_key(node)
        });
        if waiting {
            return;
        }
        // Outdating must finish first: until then the set still names them.
        if self.members.values().any(|m| m.outdating.is_some()) {
            return;
        }
        let welcomes = welcomes.clone();
        let reported = reported.clone();
        if welcomes.is_empty() {
            return;
        }
        let intact: Vec<NodeId> = welcomes
            .iter()
            .filter(|(_, (intact, _))| *intact)
            .map(|(&node, _)| node)
            .collect();
        // The source of truth: ourselves if we can be, else an intact member,
        // else (everyone restarted) any member; the others copy from it.
        let source = if intact.contains(&self.me) {
            self.me
        } else if let Some(&node) = intact.first() {
            node
        } else if welcomes.contains_key(&self.me) {
            self.me
        } else {
            *welcomes.keys().next().expect("not empty")
        };
        let unsettled = reported;
        let mut outdate = Vec::new();
        for (&node, (ok, _)) in &welcomes {
            if node != source && !ok && !intact.contains(&node) {
                outdate.push(node);
            }
        }
        // Outdated members may lack the unsettled regions too, and their
        // persisted maps must say so before we serve.
        let behind: Vec<NodeId> = self
            .members
            .iter()
            .filter(|(_, m)| matches!(m.sync, Sync::Outdated { .. } | Sync::Resyncing { .. }))
            .map(|(&n, _)| n)
            .collect();
        // A source that restarted lost what it had not flushed, and it is
        // the truth now: the others may hold newer data anywhere.
        let behind_regions = if intact.contains(&source) {
            unsettled.clone()
        } else {
            RegionSet::all(self.size_bytes)
        };
        if !behind_regions.is_empty() {
            for node in behind {
                if let Some(member) = self.members.get_mut(&node) {
                    if let Sync::Outdated { backlog } | Sync::Resyncing { backlog, .. } =
                        &mut member.sync
                    {
                        backlog.add_set(&behind_regions);
                    }
                }
                let token = self.persist_map(node);
                self.serve_after = self.serve_after.max(token);
            }
        }
        if !outdate.is_empty() {
            for node in outdate {
                self.start_outdating(node);
            }
            // Their outdating must commit before we serve; the welcomes of
            // the rest stand.
            if let Phase::Reconciling { welcomes, .. } = &mut self.phase {
                welcomes.retain(|node, _| *node == source || intact.contains(node));
                for (_, (ok, _)) in welcomes.iter_mut() {
                    *ok = true;
                }
            }
            return;
        }
        let regions: Vec<u64> = unsettled.iter().collect();
        self.copying = unsettled;
        self.phase = Phase::Copying {
            remaining: regions.len(),
        };
        for region in regions {
            let (offset, length) = region_range(region, self.size_bytes);
            if length == 0 {
                if let Phase::Copying { remaining } = &mut self.phase {
                    *remaining -= 1;
                }
                continue;
            }
            let id = self.id();
            self.send_read(
                id,
                PendingRead {
                    op: None,
                    offset,
                    length,
                    source,
                    bad: Vec::new(),
                },
            );
        }
        self.maybe_serve();
    }

    fn reconcile_copy(&mut self, offset: u64, length: u64, data: ReadData, source: NodeId) {
        let payload = match data {
            ReadData::Data(bytes) => Payload::Data(Arc::from(bytes)),
            ReadData::Zeroes => Payload::Zeroes {
                length,
                trim: false,
            },
        };
        let targets: Vec<NodeId> = self
            .members
            .iter()
            .filter(|(&n, m)| n != source && m.kind == Kind::Diskful && m.is_needed())
            .filter(|(_, m)| m.takes_writes())
            .map(|(&n, _)| n)
            .collect();
        // Needed members that cannot take it now lack it.
        for (&n, m) in self.members.iter_mut() {
            if n != source && m.kind == Kind::Diskful && m.is_needed() && !m.takes_writes() {
                m.lost.add_range(offset, length);
            }
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        for &node in &targets {
            self.send_write(node, seq, offset, &payload, false);
        }
        self.writes.insert(
            seq,
            PendingWrite {
                purpose: Purpose::Internal,
                range: (offset, length),
                flush: false,
                payload: Some((payload.clone(), false)),
                needed: targets.into_iter().collect(),
                acked: BTreeSet::new(),
                errors: Vec::new(),
                persist_token: 0,
                started_ms: self.now_ms,
            },
        );
        if let Phase::Copying { remaining } = &mut self.phase {
            *remaining -= 1;
        }
        self.maybe_serve();
    }

    fn maybe_serve(&mut self) {
        if let Phase::Copying { remaining: 0 } = self.phase {
            if self.persisted_through >= self.serve_after
                && !self
                    .writes
                    .values()
                    .any(|w| matches!(w.purpose, Purpose::Internal))
            {
                self.phase = Phase::Serving;
                // From this flush on, every member's unflushed writes are
                // ours and tracked.
                let seq = self.id();
                self.send_flush(seq, Purpose::Internal);
                self.set_local_readable_from_state();
            }
        }
    }

    fn start_queued(&mut self) {
        let mut index = 0;
        while index < self.queue.len() {
            if self.writes.len() >= MAX_PENDING_WRITES {
                break;
            }
            let (_, request) = &self.queue[index];
            let range = match request {
                ClientRequest::Read { offset, length } => (*offset, *length),
                ClientRequest::Write {
                    offset, payload, ..
                } => (*offset, payload.length()),
                ClientRequest::Flush => (0, 0),
            };
            // In order: a request waits behind earlier ones it overlaps.
            let blocked_by_earlier = self.queue.iter().take(index).any(|(_, earlier)| {
                let other = match earlier {
                    ClientRequest::Read { offset, length } => (*offset, *length),
                    ClientRequest::Write {
                        offset, payload, ..
                    } => (*offset, payload.length()),
                    ClientRequest::Flush => (0, 0),
                };
                other.1 > 0
                    && range.1 > 0
                    && other.0 < range.0 + range.1
                    && range.0 < other.0 + other.1
                    && (matches!(earlier, ClientRequest::Write { .. })
                        || matches!(self.queue[index].1, ClientRequest::Write { .. }))
            });
            let is_write = matches!(request, ClientRequest::Write { .. });
            let blocked =
                blocked_by_earlier || (is_write && self.overlaps_active(range.0, range.1));
            if blocked {
                index += 1;
                continue;
            }
            let (op, request) = self.queue.remove(index).expect("in range");
            match request {
                ClientRequest::Read { offset, length } => self.start_read(op, offset, length),
                ClientRequest::Write {
                    offset,
                    payload,
                    fua,
                } => self.start_write(Purpose::Client(op), offset, payload, fua),
                ClientRequest::Flush => self.start_flush(op),
            }
        }
    }

    fn start_read(&mut self, op: OpId, offset: u64, length: u64) {
        let readable = self.readable_members();
        let source = if readable.contains(&self.me) {
            Some(self.me)
        } else {
            readable.first().copied()
        };
        let Some(source) = source else {
            self.actions.push(Action::Complete {
                op,
                result: Err(ClientError::Io(
                    "no up-to-date replica of the volume is reachable".into(),
                )),
            });
            return;
        };
        let id = self.id();
        self.send_read(
            id,
            PendingRead {
                op: Some(op),
                offset,
                length,
                source,
                bad: Vec::new(),
            },
        );
    }

    fn send_read(&mut self, id: u64, read: PendingRead) {
        let now = self.now_ms;
        let member = self.members.get_mut(&read.source).expect("a member");
        member.unacked.insert(id, (read.offset, 0, now, 0));
        self.actions.push(Action::Send {
            to: read.source,
            message: ToReplica::Read {
                id,
                offset: read.offset,
                length: read.length,
            },
        });
        self.reads.insert(id, read);
    }

    /// Writes below this completed on every replica that had to hold them:
    /// neither pending, nor failed while some replica may still apply them.
    fn settled(&self) -> u64 {
        let pending = self.writes.keys().next().copied().unwrap_or(self.next_seq);
        let failed = self.failed_in_flight.keys().next().copied();
        [Some(pending), failed, self.unsettled_floor]
            .into_iter()
            .flatten()
            .min()
            .expect("pending")
    }

    /// A write ended without completing everywhere (it failed, or it
    /// expired). Members that applied it hold what others may not: for
    /// them it stays unsettled as long as this engine runs, so that the next
    /// primary reconciles its regions. Members it is still in flight to may
    /// apply it too: it stays unsettled until they answer.
    fn abandon(&mut self, seq: u64, acked: &BTreeSet<NodeId>) {
        if !acked.is_empty() {
            self.pin_unsettled(seq);
        }
        let waiting: BTreeSet<NodeId> = self
            .members
            .iter()
            .filter(|(_, m)| m.unacked.contains_key(&seq))
            .map(|(&n, _)| n)
            .collect();
        if !waiting.is_empty() {
            self.failed_in_flight.insert(seq, waiting);
        }
    }

    fn pin_unsettled(&mut self, seq: u64) {
        self.unsettled_floor = Some(self.unsettled_floor.map_or(seq, |floor| floor.min(seq)));
    }

    fn send_write(&mut self, node: NodeId, seq: u64, offset: u64, payload: &Payload, fua: bool) {
        let settled = self.settled().min(seq);
        let now = self.now_ms;
        let member = self.members.get_mut(&node).expect("a member");
        let bytes = match payload {
            Payload::Data(data) => data.len() as u64,
            Payload::Zeroes { .. } => 0,
        };
        member
            .unacked
            .insert(seq, (offset, payload.length(), now, bytes));
        member.unacked_bytes += bytes;
        member.unflushed.add_range(offset, payload.length());
        self.actions.push(Action::Send {
            to: node,
            message: ToReplica::Write {
                seq,
                offset,
                payload: payload.clone(),
                fua,
                settled,
            },
        });
    }

    fn start_write(&mut self, purpose: Purpose, offset: u64, payload: Payload, fua: bool) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let length = payload.length();
        let mut needed = BTreeSet::new();
        let mut persist = Vec::new();
        let nodes: Vec<NodeId> = self.members.keys().copied().collect();
        for node in nodes {
            let member = &self.members[&node];
            if member.kind != Kind::Diskful {
                continue;
            }
            if member.is_needed() {
                needed.insert(node);
            }
            if member.takes_writes() {
                self.send_write(node, seq, offset, &payload, fua);
            }
            let member = self.members.get_mut(&node).expect("listed");
            let since = self.view.generation;
            let up = member.takes_writes();
            match &mut member.sync {
                Sync::InSync | Sync::Joining { .. } if !up => {
                    member.lost.add_range(offset, length);
                }
                Sync::InSync | Sync::Joining { .. } => {}
                Sync::Outdated { backlog } => {
                    let before = backlog.len(u64::MAX);
                    for region in regions_of(offset, length) {
                        backlog.add(region);
                    }
                    if backlog.len(u64::MAX) != before {
                        persist.push((node, backlog.to_map(since)));
                    }
                }
                Sync::Resyncing { .. } => {
                    // It gets the write on its link, but the persisted map
                    // must still name the region should we crash before
                    // it is in the set.
                    let mut added = false;
                    for region in regions_of(offset, length) {
                        added |= member.written_during_sync.insert(region);
                    }
                    if added {
                        let map = Self::map_of(member, since).expect("resyncing");
                        persist.push((node, map));
                    }
                }
            }
        }
        let mut persist_token = 0;
        for (peer, map) in persist {
            persist_token = self.persist_next;
            self.persist_next += 1;
            self.actions.push(Action::PersistDirty {
                token: persist_token,
                peer,
                map,
            });
        }
        self.writes.insert(
            seq,
            PendingWrite {
                purpose,
                range: (offset, length),
                flush: false,
                payload: Some((payload, fua)),
                needed,
                acked: BTreeSet::new(),
                errors: Vec::new(),
                persist_token,
                started_ms: self.now_ms,
            },
        );
        self.drop_laggards();
    }

    fn start_flush(&mut self, op: OpId) {
        let seq = self.id();
        self.send_flush(seq, Purpose::Client(op));
    }

    fn send_flush(&mut self, seq: u64, purpose: Purpose) {
        let mut needed = BTreeSet::new();
        let nodes: Vec<NodeId> = self.members.keys().copied().collect();
        for node in nodes {
            let member = self.members.get_mut(&node).expect("listed");
            if member.kind != Kind::Diskful {
                continue;
            }
            if member.is_needed() {
                needed.insert(node);
            }
            if member.takes_writes() {
                let regions = std::mem::take(&mut member.unflushed);
                member.flushing.push((seq, regions));
                member.unacked.insert(seq, (0, 0, self.now_ms, 0));
                self.actions.push(Action::Send {
                    to: node,
                    message: ToReplica::Flush { seq },
                });
            }
        }
        self.writes.insert(
            seq,
            PendingWrite {
                purpose,
                range: (0, 0),
                flush: true,
                payload: None,
                needed,
                acked: BTreeSet::new(),
                errors: Vec::new(),
                persist_token: 0,
                started_ms: self.now_ms,
            },
        );
    }

    /// A member behind by more than the link caps is dropped and resynced
    /// later, never buffered for without limit.
    fn drop_laggards(&mut self) {
        let laggards: Vec<NodeId> = self
            .members
            .iter()
            .filter(|(_, m)| {
                m.unacked.len() > MAX_INFLIGHT_PER_LINK
                    || m.unacked_bytes > MAX_INFLIGHT_BYTES_PER_LINK
            })
            .map(|(&n, _)| n)
            .collect();
        for node in laggards {
            self.actions.push(Action::Reset { to: node });
            self.lose_link(node);
        }
    }

    fn has_quorum(&self, acked: &BTreeSet<NodeId>) -> bool {
        let votes = acked
            .iter()
            .filter(|n| self.view.diskful.contains(n))
            .count()
            + self
                .members
                .iter()
                .filter(|(_, m)| m.kind == Kind::Tiebreaker && m.is_up())
                .count();
        votes >= self.view.quorum_size()
    }

    fn complete_writes(&mut self) {
        let mut done = Vec::new();
        for (&seq, write) in &self.writes {
            if write.persist_token > self.persisted_through {
                continue;
            }
            let waiting = write.needed.iter().any(|node| {
                !write.acked.contains(node)
                    && !write.errors.iter().any(|(n, _)| n == node)
                    && self.members.get(node).is_some_and(|m| m.is_needed())
            });
            if waiting {
                continue;
            }
            // Members that failed it must be out of the set first, unless
            // nobody applied it.
            let failed_still_listed = write
                .errors
                .iter()
                .any(|(node, _)| self.members.get(node).is_some_and(|m| m.is_needed()));
            let nobody_applied = write.acked.is_empty() && !write.errors.is_empty();
            if failed_still_listed && !nobody_applied {
                continue;
            }
            let internal = !matches!(write.purpose, Purpose::Client(_));
            if !internal && !nobody_applied && !self.has_quorum(&write.acked) {
                continue;
            }
            done.push(seq);
        }
        for seq in done {
            let write = self.writes.remove(&seq).expect("listed");
            if write.acked.is_empty() && !write.errors.is_empty() {
                self.abandon(seq, &write.acked);
                self.copy_again(write.range);
            }
            if let Purpose::Client(op) = write.purpose {
                let result = if write.acked.is_empty() && !write.errors.is_empty() {
                    Err(match &write.errors[0].1 {
                        ReplicaError::NoSpace(message) => ClientError::NoSpace(message.clone()),
                        other => ClientError::Io(other.to_string()),
                    })
                } else {
                    self.counters.writes_completed += 1;
                    Ok(Completion::Done)
                };
                self.actions.push(Action::Complete { op, result });
            }
            let _ = write.flush;
        }
        self.maybe_serve();
    }

    /// A write failed, yet members that were not waited for (resyncing)
    /// may have applied it: they copy its regions again.
    fn copy_again(&mut self, (offset, length): (u64, u64)) {
        for member in self.members.values_mut() {
            if let Sync::Resyncing { backlog, .. } = &mut member.sync {
                for region in regions_of(offset, length) {
                    backlog.add(region);
                }
            }
        }
    }

    /// Where resyncs read from: ourselves first, then the other up-to-date
    /// members.
    fn resync_sources(&self) -> Vec<NodeId> {
        let mut readable = self.readable_members();
        if let Some(at) = readable.iter().position(|&n| n == self.me) {
            readable.remove(at);
            readable.insert(0, self.me);
        }
        readable
    }

    fn pump_resyncs(&mut self) {
        let sources = self.resync_sources();
        if sources.is_empty() {
            return;
        }
        let failed = &self.resync_failed;
        let source_for = |region: u64| {
            sources
                .iter()
                .copied()
                .find(|n| !failed.get(&region).is_some_and(|bad| bad.contains(n)))
        };
        let region_count = self.region_count();
        let nodes: Vec<NodeId> = self.members.keys().copied().collect();
        for node in nodes {
            loop {
                if self.resync_rate > 0 && self.resync_tokens < REGION_BYTES as f64 {
                    break;
                }
                let member = &self.members[&node];
                let Sync::Resyncing {
                    backlog,
                    writes,
                    reads,
                    ..
                } = &member.sync
                else {
                    break;
                };
                if !member.is_up() {
                    break;
                }
                if backlog.is_empty(region_count) && writes.is_empty() && reads.is_empty() {
                    // Copied: from now on its acknowledgements count; a
                    // flush makes the copy durable before it joins the set.
                    let seq = self.next_seq;
                    self.next_seq += 1;
                    let now = self.now_ms;
                    let member = self.members.get_mut(&node).expect("listed");
                    member.sync = Sync::Joining { flush: Some(seq) };
                    member.unacked.insert(seq, (0, 0, now, 0));
                    let regions = std::mem::take(&mut member.unflushed);
                    member.flushing.push((seq, regions));
                    self.actions.push(Action::Send {
                        to: node,
                        message: ToReplica::Flush { seq },
                    });
                    break;
                }
                if writes.len() + reads.len() >= RESYNC_WINDOW {
                    break;
                }
                let locks = &self.resync_locks;
                let active: Vec<(u64, u64)> = self.writes.values().map(|w| w.range).collect();
                let busy = |region: u64| {
                    let (offset, length) = region_range(region, self.size_bytes);
                    locks.contains(&region)
                        || active
                            .iter()
                            .any(|&(o, l)| l > 0 && o < offset + length && offset < o + l)
                        || source_for(region).is_none()
                };
                let member = self.members.get_mut(&node).expect("listed");
                let Sync::Resyncing { backlog, reads, .. } = &mut member.sync else {
                    break;
                };
                let Some(region) = backlog.pop(region_count, busy) else {
                    break;
                };
                let source = source_for(region).expect("not busy");
                let id = self.next_seq;
                self.next_seq += 1;
                reads.insert(id, (region, source));
                self.resync_locks.insert(region);
                if self.resync_rate > 0 {
                    self.resync_tokens -= REGION_BYTES as f64;
                }
                let (offset, length) = region_range(region, self.size_bytes);
                let now = self.now_ms;
                self.members
                    .get_mut(&source)
                    .expect("a member")
                    .unacked
                    .insert(id, (offset, 0, now, 0));
                self.actions.push(Action::Send {
                    to: source,
                    message: ToReplica::Read { id, offset, length },
                });
            }
        }
    }

    fn on_resync_read(&mut self, target: NodeId, id: u64, result: Result<ReadData, ReplicaError>) {
        let member = self.members.get_mut(&target).expect("listed");
        let Sync::Resyncing { reads, backlog, .. } = &mut member.sync else {
            return;
        };
        let Some((region, source)) = reads.remove(&id) else {
            return;
        };
        self.resync_locks.remove(&region);
        let data = match result {
            Ok(data) => data,
            Err(error) => {
                // Try again from another source, or from this one after
                // the next tick.
                backlog.add(region);
                self.resync_failed.entry(region).or_default().insert(source);
                if matches!(error, ReplicaError::Checksum(_)) {
                    self.resync_corrupt
                        .entry(region)
                        .or_default()
                        .insert(source);
                }
                return;
            }
        };
        let (offset, length) = region_range(region, self.size_bytes);
        // Up-to-date sources that failed their checksum get this copy.
        if let Some(bad) = self.resync_corrupt.remove(&region) {
            let readable = self.readable_members();
            let bad: Vec<NodeId> = bad
                .into_iter()
                .filter(|n| *n != source && readable.contains(n))
                .collect();
            if !bad.is_empty() {
                self.repair(offset, length, data.clone(), bad);
            }
        }
        let member = self.members.get_mut(&target).expect("listed");
        let payload = match data {
            ReadData::Data(bytes) => Payload::Data(Arc::from(bytes)),
            ReadData::Zeroes => Payload::Zeroes { length, trim: true },
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        if let Sync::Resyncing { writes, .. } = &mut member.sync {
            writes.insert(seq, region);
        }
        self.send_write(target, seq, offset, &payload, false);
    }

    fn report_progress(&mut self, now_ms: u64) {
        let elapsed = now_ms.saturating_sub(self.last_progress_ms).max(1);
        self.last_progress_ms = now_ms;
        let mut reports = Vec::new();
        for (&node, member) in self.members.iter_mut() {
            if let Sync::Resyncing { total, done, .. } = &member.sync {
                let moved = done.saturating_sub(member.progress_mark.1);
                member.progress_mark = (now_ms, *done);
                reports.push((
                    node,
                    SyncProgress {
                        done_bytes: *done,
                        total_bytes: *total,
                        rate_bytes_per_sec: moved * 1000 / elapsed,
                    },
                ));
            }
        }
        for (node, progress) in reports {
            let id = self.id();
            // Progress is best effort: not retried.
            self.actions.push(Action::Propose {
                id,
                proposal: Proposal::Progress {
                    node,
                    progress: Some(progress),
                },
            });
        }
    }

    /// Invariants that hold after every event.
    fn check(&self) {
        for (seq, write) in &self.writes {
            assert!(
                *seq < self.next_seq,
                "a pending write has a future sequence"
            );
            assert!(
                write
                    .acked
                    .iter()
                    .all(|n| self.members.contains_key(n) || !self.view.diskful.contains(n)),
                "an acknowledgement from a stranger"
            );
        }
        if self.is_serving() || matches!(self.phase, Phase::Copying { .. }) {
            // Writes never overlap: replicas apply them in the same order.
            let ranges: Vec<(u64, u64)> = self
                .writes
                .values()
                .filter(|w| w.range.1 > 0 && !matches!(w.purpose, Purpose::Internal))
                .map(|w| w.range)
                .collect();
            for (i, a) in ranges.iter().enumerate() {
                for b in &ranges[i + 1..] {
                    assert!(
                        !(a.0 < b.0 + b.1 && b.0 < a.0 + a.1),
                        "overlapping writes in flight: {a:?} and {b:?}"
                    );
                }
            }
        }
        assert!(self.persisted_through < self.persist_next);
    }
}
