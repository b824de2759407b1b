//! Deterministic simulation of trireme's distributed parts.
//!
//! - [`control`]: the control plane. Several openraft nodes with the real
//!   `trireme_control::raft` storage run in one paused-time tokio runtime,
//!   joined by an in-memory network that loses, delays and partitions
//!   messages and crashes and restarts nodes, all chosen from one seed. A
//!   client proposes random commands meanwhile, and the run checks Raft's
//!   safety properties on the replicated [`trireme_control::ClusterState`].
//! - [`replication`]: the replication protocol. The real `Primary` engine
//!   and `ReplicaSide`s of `trireme_replication` over simulated links, disks
//!   and a linearizable control-plane arbiter, with crashes, partitions,
//!   link drops, slow and failing disks, bit flips and failovers, all chosen
//!   from one seed, checked against a reference model of the volume.
//!
//! - [`runner`]: the seed runner of the `sim-*` binaries (threads, a time
//!   limit, progress, seeds per minute, the replay lines of a failure).
//!
//! A failing run names its seed; the same seed replays the same run, so a
//! failure found once can be replayed, debugged and turned into a test.

pub mod control;
pub mod disk;
pub mod replication;
pub mod runner;
pub mod store;

pub use control::{run_control_sim, SimConfig, SimReport};
pub use replication::{run_replication_sim, ReplicationSimConfig, ReplicationSimReport};
