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
//! - Reads need a lease. A read that arrived at time `t` is served (from any
//!   up-to-date copy, the local one included) only once a quorum of the
//!   voters, counted as for writes (diskful members and tiebreakers), has
//!   answered messages this engine sent after `t - LEASE_MS`, by its own
//!   clock ([`Primary::read_lease_until`]). A replica welcomes no newer
//!   generation until [`crate::message::LEASE_HOLD_MS`] after it last
//!   answered an older one, and a newer primary completes no write without
//!   a quorum of welcomes: so while the lease holds, no newer primary has
//!   completed a write, and a primary cut off and replaced stops answering
//!   reads on its own. Links without traffic get a `Ping` every
//!   [`PING_EVERY_MS`]. A read without a lease waits, and fails after
//!   [`NO_QUORUM_FAIL_MS`] under the io-error policy, as writes do.
//! - Time the engine itself did not run (a tick [`TICK_GAP_MS`] or more
//!   after the previous one: its process was stopped, or starved) does not
//!   count against its members, whose answers wait unread in the links:
//!   timeouts of what was sent or started before count from that tick. The
//!   lease is never stretched so: it runs out, and the next answers renew
//!   it.

//!
//! Modules: [`types`] (the public vocabulary: views, requests, actions),
//! `state` (members, backlogs, pending requests), `links` (members coming
//! and going, outdating and joining through the control plane), `io`
//! (client requests, quorum, completion, read failover and repair),
//! `reconcile` (what a new primary does before it serves), `resync`
//! (copying what outdated members lack).

use crate::message::{FromReplica, Payload, ReadData, ReplicaError, ToReplica};
use crate::regions::{region_range, regions_of, RegionSet, REGION_BYTES};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use trireme_types::{Generation, NodeId, SnapshotId};

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
pub use crate::message::LEASE_MS;
/// A member whose last answer is older than this gets a `Ping`.
pub const PING_EVERY_MS: u64 = LEASE_MS / 4;
/// Ticks come every 100 ms or so; one that comes this long after the
/// previous one means the engine did not run meanwhile.
pub const TICK_GAP_MS: u64 = 1_000;

mod grow;
mod io;
mod links;
mod observe;
mod reconcile;
mod resync;
mod snapshot;
mod state;
pub mod types;
mod verify;

pub use observe::{AckLatency, EngineReport, LinkReport, ACK_LATENCY_BOUNDS_MS};
use state::*;
pub use types::*;
use verify::VerifyJob;
pub use verify::VERIFY_WINDOW;

/// The engine: see the module documentation.
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
    /// Which writes the next `complete_writes` must judge.
    completion: CompletionScan,
    /// Events since `check` last looked at every pending write.
    unchecked_events: u32,
    /// Run the checks that look at every pending write after every event
    /// ([`Primary::set_thorough_checks`]).
    thorough_checks: bool,
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
    /// The tick that ended the last long gap between ticks: timeouts of
    /// what was sent or started before it count from it.
    resumed_ms: u64,
    /// When each client read still queued arrived: it is served once the
    /// lease covers that time.
    read_arrivals: BTreeMap<OpId, u64>,
    last_progress_ms: u64,
    now_ms: u64,
    local_readable: bool,
    /// Detach asked: `Some(None)` until the final flush is sent, then its
    /// sequence.
    detaching: Option<Option<u64>>,
    actions: Vec<Action>,
    pub counters: Counters,
    /// A running `verify`, and the report of the running or last one.
    verify: Option<VerifyJob>,
    verify_report: Option<VerifyReport>,
    /// Snapshots asked and not yet sent: while any waits, no new write
    /// starts, so that every replica gets it at the same write boundary.
    snapshots_wanted: VecDeque<SnapshotId>,
    /// The regions that may hold data (what this node's copy held when
    /// the engine started, and every region written since): resync
    /// progress counts these, not the volume's size. `None`: unknown.
    data_regions: Option<RegionSet>,
    #[cfg(feature = "bug-switches")]
    bugs: EngineBugs,
}

/// Rules the engine can be told to break, to show that the simulator
/// catches each (crates/sim's bug-switch tests). Off by default; only with
/// the `bug-switches` feature.
#[cfg(feature = "bug-switches")]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EngineBugs {
    /// A client write completes once any member holds it, before its
    /// quorum does.
    pub ack_before_quorum: bool,
}

impl Primary {
    #[cfg(feature = "bug-switches")]
    pub fn set_bugs(&mut self, bugs: EngineBugs) {
        self.bugs = bugs;
    }

    /// Runs the checks that look at every pending write after every event
    /// (the simulator; on by default in debug builds), not after one event
    /// in 64: the writes in flight never overlap, and the completion pass,
    /// which judges only the writes whose verdict may have changed, missed
    /// none that could complete.
    pub fn set_thorough_checks(&mut self, on: bool) {
        self.thorough_checks = on;
    }

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
            completion: CompletionScan::default(),
            unchecked_events: 0,
            thorough_checks: cfg!(debug_assertions),
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
            resumed_ms: now_ms,
            read_arrivals: BTreeMap::new(),
            last_progress_ms: now_ms,
            now_ms,
            local_readable: false,
            detaching: None,
            actions: Vec::new(),
            counters: Counters::default(),
            verify: None,
            verify_report: None,
            snapshots_wanted: VecDeque::new(),
            data_regions: None,
            #[cfg(feature = "bug-switches")]
            bugs: EngineBugs::default(),
        };
        let nodes: Vec<NodeId> = primary.members.keys().copied().collect();
        for node in nodes {
            primary.actions.push(Action::Connect { to: node });
        }
        primary.check();
        primary
    }

    /// The regions of the volume that hold data, as this node's copy
    /// knows them (its store's allocation): resync progress and its time
    /// left count what is to be copied, not the volume's size. Only an
    /// estimate: copies never depend on it.
    pub fn set_data_regions(&mut self, regions: RegionSet) {
        self.data_regions = Some(regions);
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
                    Sync::Resyncing { .. } => ("syncing", Some(self.resync_progress(m, 0))),
                    Sync::Joining { .. } => ("joining", None),
                };
                (node, state.to_string(), progress)
            })
            .collect()
    }

    pub fn take_actions(&mut self) -> Vec<Action> {
        std::mem::take(&mut self.actions)
    }

    /// The size the engine serves: the size at attach, then the
    /// recorded size once it may grow to it (see [`Primary::view`]). A
    /// driver exports this size, never the record's.
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
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
        if matches!(request, ClientRequest::Read { .. }) {
            self.read_arrivals.insert(op, now_ms);
        }
        self.queue.push_back((op, request));
        self.progress();
    }

    pub fn message(&mut self, from: NodeId, message: FromReplica, now_ms: u64) {
        self.now_ms = now_ms;
        let Some(member) = self.members.get_mut(&from) else {
            return;
        };
        // Whatever it answers, short of a refusal, renews its lease vote
        // from when we sent what it answers.
        let sent = match &message {
            FromReplica::Welcome { .. } => match member.link {
                Link::Hello(since) => Some(since),
                _ => None,
            },
            FromReplica::Ack { seq: id, .. }
            | FromReplica::ReadReply { id, .. }
            | FromReplica::HashReply { id, .. } => member.unacked.get(id).map(|entry| entry.2),
            FromReplica::Pong { token } => Some(*token).filter(|&token| token <= now_ms),
            FromReplica::Refused { .. } => None,
        };
        if let Some(sent) = sent {
            member.answered_sent_ms = Some(member.answered_sent_ms.map_or(sent, |at| at.max(sent)));
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
            FromReplica::HashReply { id, result } => self.on_hash_reply(from, id, result),
            // Reads waiting for the lease may go now.
            FromReplica::Pong { .. } => {}
        }
        self.progress();
    }

    /// Until when (by this engine's clock, exclusive) the read lease holds:
    /// a quorum of the voters answered messages sent since this time minus
    /// [`LEASE_MS`]. 0 without a quorum of answers. A driver that reads
    /// this node's copy without the engine (while `LocalReadable(true)`)
    /// must check that the read starts before this time.
    pub fn read_lease_until(&self) -> u64 {
        if self.is_stopped() {
            return 0;
        }
        let mut sent: Vec<u64> = self
            .members
            .iter()
            .filter(|(node, member)| match member.kind {
                Kind::Diskful => self.view.diskful.contains(node),
                Kind::Tiebreaker => self.view.tiebreakers.contains(node),
            })
            .filter_map(|(_, member)| member.answered_sent_ms)
            .collect();
        sent.sort_unstable_by(|a, b| b.cmp(a));
        sent.get(self.view.quorum_size() - 1)
            .map_or(0, |&at| at + LEASE_MS)
    }

    /// Whether client read `op` may be served now: the lease covers the
    /// time it arrived (no newer primary can have completed a write
    /// before then).
    pub(super) fn read_may_start(&self, op: OpId) -> bool {
        let arrived = self.read_arrivals.get(&op).copied().unwrap_or(self.now_ms);
        arrived < self.read_lease_until()
    }

    /// How long ago `at` was, not counting the last long gap between ticks
    /// (the engine did not run then).
    fn waited_since(&self, at: u64) -> u64 {
        self.now_ms.saturating_sub(at.max(self.resumed_ms))
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
        // The quorum and the members writes wait for may have changed.
        self.completion.all = true;
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
        self.release_grown(&old);
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

    /// Changes the bytes per second resyncs and verifies may copy (0: no
    /// limit); takes effect at the next tick.
    pub fn set_resync_rate(&mut self, bytes_per_sec: u64) {
        self.resync_rate = bytes_per_sec;
        if bytes_per_sec > 0 {
            let cap = (RESYNC_WINDOW as u64 * REGION_BYTES).max(bytes_per_sec / 4) as f64;
            self.resync_tokens = self.resync_tokens.min(cap);
        }
    }

    pub fn resync_rate(&self) -> u64 {
        self.resync_rate
    }

    pub fn tick(&mut self, now_ms: u64) {
        let elapsed = now_ms.saturating_sub(self.last_tick_ms);
        self.now_ms = now_ms;
        self.last_tick_ms = now_ms;
        if self.is_stopped() {
            return;
        }
        if elapsed >= TICK_GAP_MS {
            // The engine did not run (its process was stopped): what the
            // members answered meanwhile waits in the links, unread. Judge
            // nothing sent before now until they have had their time.
            self.resumed_ms = now_ms;
        }
        self.send_pings();
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
                Link::Hello(since) => self.waited_since(since) > ACK_TIMEOUT_MS,
                Link::Up { .. } => {
                    oldest.is_some_and(|sent| self.waited_since(sent) > ACK_TIMEOUT_MS)
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
        // Reconciling: up-to-date members not linked are outdated. One
        // linked whose welcome waits (it holds a lease of the former
        // primary) has the hello's timeout.
        if let Phase::Reconciling { since_ms, .. } = self.phase {
            if self.waited_since(since_ms) > RECONCILE_WAIT_MS {
                let silent: Vec<NodeId> = self
                    .members
                    .iter()
                    .filter(|(_, m)| {
                        m.kind == Kind::Diskful
                            && matches!(m.sync, Sync::InSync)
                            && matches!(m.link, Link::Down)
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
                .filter(|(_, w)| self.waited_since(w.started_ms) > NO_QUORUM_FAIL_MS)
                .map(|(&seq, _)| seq)
                .collect();
            for seq in expired {
                let write = self.writes.remove(&seq).expect("listed");
                self.abandon(seq, &write.acked);
                self.copy_again(write.range);
                self.end_write(
                    &write.purpose,
                    &write.acked,
                    Err(ClientError::Io(
                        "the volume has no quorum: too few up-to-date replicas answer".into(),
                    )),
                );
            }
            if !self.is_serving() {
                self.fail_queue_if_stuck();
            }
            self.fail_reads_without_lease();
        }
        self.forget_started_reads();
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
        self.abort_verify("the volume was detached");
        self.fail_snapshots("the volume was detached");
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
        self.abort_verify(&reason);
        self.fail_snapshots(&reason);
        self.phase = Phase::Stopped;
        for (_, write) in std::mem::take(&mut self.writes) {
            self.end_write(&write.purpose, &write.acked, Err(ClientError::ShuttingDown));
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
        self.read_arrivals.clear();
        self.set_local_readable(false);
        self.actions.push(Action::Stopped { reason });
    }

    // ---- internals ----------------------------------------------------

    fn fail_queue_if_stuck(&mut self) {
        let Phase::Reconciling { since_ms, .. } = self.phase else {
            return;
        };
        if self.waited_since(since_ms) <= NO_QUORUM_FAIL_MS {
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

    /// Keepalives: every linked member whose last answer is old gets a
    /// `Ping` (at most one per [`PING_EVERY_MS`]), so that an idle volume
    /// keeps its read lease.
    fn send_pings(&mut self) {
        let now = self.now_ms;
        for (&node, member) in self.members.iter_mut() {
            let answered = member.answered_sent_ms.unwrap_or(0);
            if member.is_up()
                && now.saturating_sub(answered) >= PING_EVERY_MS
                && now.saturating_sub(member.pinged_ms) >= PING_EVERY_MS
            {
                member.pinged_ms = now;
                self.actions.push(Action::Send {
                    to: node,
                    message: ToReplica::Ping { token: now },
                });
            }
        }
    }

    /// Under the io-error policy: client reads that waited too long for
    /// the lease fail, as writes without quorum do.
    fn fail_reads_without_lease(&mut self) {
        if !self.is_serving() {
            return;
        }
        let expired: BTreeSet<OpId> = self
            .read_arrivals
            .iter()
            .filter(|(_, &arrived)| self.waited_since(arrived) > NO_QUORUM_FAIL_MS)
            .filter(|(&op, _)| !self.read_may_start(op))
            .map(|(&op, _)| op)
            .collect();
        if expired.is_empty() {
            return;
        }
        self.queue.retain(|(op, _)| !expired.contains(op));
        for op in expired {
            self.read_arrivals.remove(&op);
            self.actions.push(Action::Complete {
                op,
                result: Err(ClientError::Io(
                    "the volume has no quorum: too few replicas answer to prove the copy read is current".into(),
                )),
            });
        }
    }

    /// Arrival times of reads no longer queued (started, or failed).
    fn forget_started_reads(&mut self) {
        if self.read_arrivals.is_empty() {
            return;
        }
        let queued: BTreeSet<OpId> = self.queue.iter().map(|(op, _)| *op).collect();
        self.read_arrivals.retain(|op, _| queued.contains(op));
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
        self.try_grow();
        if matches!(self.phase, Phase::Copying { .. } | Phase::Serving) {
            self.complete_writes();
        }
        if self.is_serving() {
            if self.detaching.is_none() {
                self.start_queued();
            }
            self.complete_writes();
            // Resync goes on while a snapshot waits: its copies go only
            // to replicas that do not get the snapshot, and client writes
            // or barriers waiting for quorum may need it to finish.
            self.pump_resyncs();
            if self.snapshots_wanted.is_empty() {
                self.pump_verify();
            }
            if self.continue_snapshots() {
                // The barrier is out: what waited behind it goes now.
                self.start_queued();
            }
            self.continue_detach();
        }
        self.check();
    }

    /// Invariants that hold after every event. Those that look at every
    /// pending write (and sort their ranges) run after every event with
    /// `thorough_checks` (the simulator, debug builds), and after one event
    /// in 64 in a release node: after each, they cost about 4% of a
    /// primary's CPU with 32 writes in flight (issue 24, item 4).
    fn check(&mut self) {
        self.check_verify();
        assert!(self.persisted_through < self.persist_next);
        const RELEASE_CHECK_EVERY: u32 = 64;
        self.unchecked_events += 1;
        if !self.thorough_checks && self.unchecked_events < RELEASE_CHECK_EVERY {
            return;
        }
        self.unchecked_events = 0;
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
            // Sorted by start, ranges overlap only if neighbours do: this
            // runs after every event, so it must not be quadratic.
            let mut ranges: Vec<(u64, u64)> = self
                .writes
                .values()
                .filter(|w| w.range.1 > 0 && !matches!(w.purpose, Purpose::Internal))
                .map(|w| w.range)
                .collect();
            ranges.sort_unstable();
            for pair in ranges.windows(2) {
                let (a, b) = (pair[0], pair[1]);
                assert!(
                    a.0 + a.1 <= b.0,
                    "overlapping writes in flight: {a:?} and {b:?}"
                );
            }
        }
    }
}
