//! trireme's control plane: the cluster's desired state, replicated by Raft
//! to every node.
//!
//! - [`model`]: the state itself: nodes, pools, resource groups, volumes and
//!   their placement, snapshots ([`model::snapshot`]: rollbacks, clones'
//!   origins, schedules, the fencing of detached volumes), and the
//!   invariants every state keeps.
//! - [`command`]: the commands of the replicated log and the pure function
//!   that applies them (tested without any I/O), one module per domain.
//! - [`conformance`]: whether placed replicas still satisfy their group
//!   after labels or the group changed.
//! - [`events`]: the cluster's event log, a bounded ring in the replicated
//!   state, written when attributed commands are applied.
//! - [`health`]: a volume's state in one word (ready, degraded, syncing,
//!   no quorum, ...) and its distance from losing quorum.
//! - [`placer`]: the autoplacer, a pure function from candidates and a
//!   resource group to a placement or a refusal that explains itself.
//! - [`repair`]: placing again a volume's lost tiebreaker and replicas,
//!   which the leader asks for.
//! - [`raft`]: openraft's types and its storage (log, vote, snapshots) in
//!   the node's `control.redb`.
//! - [`snapshot`]: the former home of the snapshot records, re-exporting
//!   [`model::snapshot`].
//!
//! Modules depend on each other without cycles (the workspace's
//! `module_cycles` test checks it): `placer` and `events` depend on nothing
//! here, `model` on them, `command`, `repair`, `health` and `conformance`
//! on the model, and `raft` on the commands.
pub mod command;
pub mod conformance;
pub mod events;
pub mod health;
pub mod model;
pub mod placer;
pub mod raft;
pub mod repair;
pub mod snapshot;

pub use command::{Command, CommandError, FencedPrimary, NodeRegistration, PoolReport, Reply};
pub use events::{Actor, Event, EventKind, EventLog, EventPage, EVENT_LOG_CAPACITY};
pub use health::{QuorumCount, VolumeHealth};
pub use model::snapshot::{
    CloneOrigin, Rollback, SnapshotRecord, SnapshotSchedule, SnapshotState, SnapshotTaker,
    MAX_SNAPSHOTS_PER_VOLUME, MIN_SCHEDULE_SECS,
};
pub use model::*;
