//! The cluster's event log: what happened, when, and who asked, kept in
//! the replicated state so that every node serves the same history, and it
//! survives restarts (it is part of every Raft snapshot).
//!
//! - [`EventLog`] is a ring of the last [`EVENT_LOG_CAPACITY`] events: the
//!   oldest goes when a new one comes. Sequence numbers are never reused,
//!   so a reader that polls with "after SEQ" can tell it missed some.
//! - Events are written only by applying a [`crate::Command::Attributed`]: the
//!   command says who asked ([`Actor`]) and when. The command module
//!   (`command/event_record.rs`) derives the events from the command, the
//!   state before it and its reply, so that only transitions are logged (a node going offline
//!   once, not every time the leader looks at it). Plain commands (older
//!   logs, the simulator) change the state and log nothing.
//! - What only a node sees (a verify's result and its repairs) comes as
//!   [`crate::Command::RecordEvent`], attributed like any other command. Its
//!   message is cut at [`MAX_EVENT_MESSAGE_BYTES`], and the ring bounds
//!   how much any flood can keep.

use serde::{Deserialize, Serialize};
use std::collections::VecDeque;
use trireme_types::{NodeId, VolumeName};

/// How many events the log keeps: enough for days of a quiet cluster and
/// hours of a busy one; about 200 bytes each in every snapshot.
pub const EVENT_LOG_CAPACITY: usize = 1000;
/// The longest message kept; a longer one is cut (at a character boundary).
pub const MAX_EVENT_MESSAGE_BYTES: usize = 512;

/// Who asked for a change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Actor {
    /// The node itself: its agent, its engines, or its leader duties.
    Node(NodeId),
    /// A REST client of node `via` that presented the admin token.
    AdminToken { via: NodeId },
    /// A REST client on the loopback of node `via`, trusted without a token.
    Loopback { via: NodeId },
}

/// What kind of thing happened. The names are the API's `kind` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    NodeJoined,
    NodeOnline,
    NodeOffline,
    NodeEvicted,
    NodeRemoved,
    NodeLabelsChanged,
    /// A pool went offline (its disk failed or vanished) or came back.
    PoolOffline,
    PoolOnline,
    VolumeCreated,
    VolumeDeleted,
    VolumeGrown,
    VolumeCloned,
    Attached,
    Detached,
    /// A takeover: the new primary fenced the old one.
    PrimaryChanged,
    /// A primary restarted its engine (the generation moved on).
    Reattached,
    QuorumLost,
    QuorumRegained,
    ReplicaAdded,
    ReplicaRemoved,
    ReplicaFailed,
    ReplicaOutdated,
    ResyncStarted,
    ResyncFinished,
    PlacementRestored,
    SnapshotCreated,
    SnapshotTaken,
    SnapshotFailed,
    SnapshotDeleted,
    RolledBack,
    ScheduleChanged,
    GroupCreated,
    GroupChanged,
    GroupDeleted,
    SettingsChanged,
    VerifyFinished,
    /// Blocks a verify rewrote on replicas that differed from the majority.
    Repaired,
}

impl EventKind {
    pub fn as_str(self) -> &'static str {
        // The same names as serde's (a unit test holds them together).
        match self {
            EventKind::NodeJoined => "node_joined",
            EventKind::NodeOnline => "node_online",
            EventKind::NodeOffline => "node_offline",
            EventKind::NodeEvicted => "node_evicted",
            EventKind::NodeRemoved => "node_removed",
            EventKind::NodeLabelsChanged => "node_labels_changed",
            EventKind::PoolOffline => "pool_offline",
            EventKind::PoolOnline => "pool_online",
            EventKind::VolumeCreated => "volume_created",
            EventKind::VolumeDeleted => "volume_deleted",
            EventKind::VolumeGrown => "volume_grown",
            EventKind::VolumeCloned => "volume_cloned",
            EventKind::Attached => "attached",
            EventKind::Detached => "detached",
            EventKind::PrimaryChanged => "primary_changed",
            EventKind::Reattached => "reattached",
            EventKind::QuorumLost => "quorum_lost",
            EventKind::QuorumRegained => "quorum_regained",
            EventKind::ReplicaAdded => "replica_added",
            EventKind::ReplicaRemoved => "replica_removed",
            EventKind::ReplicaFailed => "replica_failed",
            EventKind::ReplicaOutdated => "replica_outdated",
            EventKind::ResyncStarted => "resync_started",
            EventKind::ResyncFinished => "resync_finished",
            EventKind::PlacementRestored => "placement_restored",
            EventKind::SnapshotCreated => "snapshot_created",
            EventKind::SnapshotTaken => "snapshot_taken",
            EventKind::SnapshotFailed => "snapshot_failed",
            EventKind::SnapshotDeleted => "snapshot_deleted",
            EventKind::RolledBack => "rolled_back",
            EventKind::ScheduleChanged => "schedule_changed",
            EventKind::GroupCreated => "group_created",
            EventKind::GroupChanged => "group_changed",
            EventKind::GroupDeleted => "group_deleted",
            EventKind::SettingsChanged => "settings_changed",
            EventKind::VerifyFinished => "verify_finished",
            EventKind::Repaired => "repaired",
        }
    }
}

/// One entry of the log. Names (not ids) are kept, so an event still reads
/// right after its node or volume is gone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// 1, 2, 3, ... in the order applied; never reused.
    pub seq: u64,
    /// Milliseconds since the Unix epoch, as the proposer's clock said.
    pub time_ms: u64,
    pub kind: EventKind,
    pub node: Option<String>,
    pub volume: Option<VolumeName>,
    /// Who asked, as people read it ([`Actor::describe`]).
    pub actor: String,
    pub message: String,
}

/// What a node reports that only it sees ([`crate::Command::RecordEvent`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportedEvent {
    pub kind: EventKind,
    pub node: Option<NodeId>,
    pub volume: Option<VolumeName>,
    pub message: String,
}

/// The last [`EVENT_LOG_CAPACITY`] events, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventLog {
    /// The sequence number of the last event ever logged (0: none yet).
    last_seq: u64,
    events: VecDeque<Event>,
}

/// A page of the log for a reader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventPage {
    pub events: Vec<Event>,
    /// The newest sequence number in the log (0: none yet).
    pub last_seq: u64,
    /// Events after the reader's `after` that the ring dropped before it
    /// read them.
    pub missed: u64,
}

impl EventLog {
    pub fn push(&mut self, mut event: Event) {
        self.last_seq += 1;
        event.seq = self.last_seq;
        event.message = cut(event.message, MAX_EVENT_MESSAGE_BYTES);
        if self.events.len() == EVENT_LOG_CAPACITY {
            self.events.pop_front();
        }
        self.events.push_back(event);
        debug_assert!(self.check().is_ok());
    }

    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    pub fn len(&self) -> usize {
        self.events.len()
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &Event> {
        self.events.iter()
    }

    /// Up to `limit` events of `volume` (or all): the first ones after
    /// `after`, or the newest ones when `after` is `None`; oldest first.
    pub fn page(&self, after: Option<u64>, volume: Option<&VolumeName>, limit: usize) -> EventPage {
        let matches =
            |event: &&Event| volume.is_none_or(|volume| event.volume.as_ref() == Some(volume));
        let events: Vec<Event> = match after {
            Some(after) => self
                .events
                .iter()
                .filter(|event| event.seq > after)
                .filter(matches)
                .take(limit)
                .cloned()
                .collect(),
            None => {
                let mut newest: Vec<Event> = self
                    .events
                    .iter()
                    .rev()
                    .filter(matches)
                    .take(limit)
                    .cloned()
                    .collect();
                newest.reverse();
                newest
            }
        };
        let oldest = self
            .events
            .front()
            .map_or(self.last_seq + 1, |event| event.seq);
        let missed = after.map_or(0, |after| oldest.saturating_sub(after + 1));
        EventPage {
            events,
            last_seq: self.last_seq,
            missed,
        }
    }

    /// The ring's rules: bounded, sequence numbers strictly increasing and
    /// at most the last one handed out.
    pub fn check(&self) -> Result<(), String> {
        if self.events.len() > EVENT_LOG_CAPACITY {
            return Err(format!("the event log holds {} events", self.events.len()));
        }
        let mut previous = 0;
        for event in &self.events {
            if event.seq <= previous || event.seq > self.last_seq {
                return Err(format!(
                    "event seq {} after {previous} (last {})",
                    event.seq, self.last_seq
                ));
            }
            previous = event.seq;
        }
        Ok(())
    }
}

fn cut(mut text: String, limit: usize) -> String {
    if text.len() > limit {
        let mut end = limit;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}
