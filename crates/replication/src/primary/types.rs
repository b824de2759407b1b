//! The engine's public vocabulary: the control plane's view, its
//! configuration, client requests and their outcomes, proposals and the
//! actions the driver carries out.

use super::*;

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
    /// The volume's size as recorded: the engine grows to it once no
    /// member that must take every write is still `growing`.
    pub size_bytes: u64,
    /// Diskful members whose copy is not known to hold `size_bytes` (their
    /// node has not reported it ready at that size since the volume last
    /// grew). They are sent no write past the engine's size and are not
    /// resynced until they are.
    pub growing: BTreeSet<NodeId>,
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
    /// Every replica's pool is full: the name of one of them.
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
    /// A snapshot asked with [`Primary::take_snapshot`] was taken on these
    /// replicas (every in-sync one that was linked, a quorum among them),
    /// or could not be taken.
    SnapshotDone {
        snapshot: SnapshotId,
        result: Result<BTreeSet<NodeId>, String>,
    },
    /// The engine stopped: fenced by a newer generation, or detached.
    Stopped {
        reason: String,
    },
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counters {
    /// Blocks rewritten on a replica from a good copy, by reads and verifies.
    pub repaired_blocks: u64,
    /// The part of `repaired_blocks` that reads found bad (the rest: verifies).
    pub read_repaired_blocks: u64,
    pub read_failovers: u64,
    /// Data bytes resyncs copied (holes are not counted: they go as trims).
    pub resynced_bytes: u64,
    /// Regions resyncs copied, holes or not.
    pub resynced_regions: u64,
    pub writes_completed: u64,
    /// Times the engine took a larger recorded size while it ran.
    pub grows: u64,
}

/// Where a `verify` stands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum VerifyState {
    #[default]
    Running,
    Done,
    /// Stopped before the end (the engine stopped or detached).
    Aborted(String),
}

/// What a `verify` found and did, so far or in the end.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VerifyReport {
    pub state: VerifyState,
    pub total_bytes: u64,
    /// Bytes compared on every up-to-date replica.
    pub checked_bytes: u64,
    /// Bytes not compared: fewer than two up-to-date replicas answered.
    pub skipped_bytes: u64,
    /// The up-to-date replicas when it started.
    pub members: Vec<NodeId>,
    /// Blocks whose copies did not all agree.
    pub differing_blocks: u64,
    /// Of those, blocks decided without a majority (two copies that
    /// disagree): the primary's copy won.
    pub no_majority_blocks: u64,
    /// Blocks unreadable (failed checksum) on every copy: nothing to
    /// repair them from.
    pub unrecoverable_blocks: u64,
    /// Blocks rewritten, per replica.
    pub repaired: BTreeMap<NodeId, u64>,
    pub started_ms: u64,
    pub finished_ms: u64,
}
