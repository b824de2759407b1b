//! Deterministic simulation of trireme's distributed parts.
//!
//! - [`control`]: the control plane. Several openraft nodes with the real
//!   `trireme_control::raft` storage run in one paused-time tokio runtime,
//!   joined by an in-memory network that loses, delays and partitions
//!   messages and crashes and restarts nodes, all chosen from one seed. A
//!   client proposes random commands meanwhile, and the run checks Raft's
//!   safety properties on the replicated [`trireme_control::ClusterState`].
//!
//! A failing run names its seed; the same seed replays the same run, so a
//! failure found once can be replayed, debugged and turned into a test.

pub mod control;

pub use control::{run_control_sim, SimConfig, SimReport};
