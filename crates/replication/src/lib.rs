//! trireme's replication protocol, as sans-IO state machines.
//!
//! - [`primary::Primary`]: the engine of an attached volume on its primary:
//!   writes to every replica, quorum, outdating through the control plane,
//!   dirty maps, resync, read failover and repair.
//! - [`replica::ReplicaSide`]: a replica's part: it fences primaries of
//!   older generations and remembers which writes are not settled.
//! - [`message`]: what they say over a data link, and its encoding.
//! - [`regions`]: the dirty map's regions.
//! - [`driver`]: what a runtime does with those machines' outputs (the
//!   replica's handling of each message, the engine's dealings with the
//!   control plane), shared by the node, the simulator and the tests.
//!
//! Nothing here does I/O or reads a clock. The node runs these machines
//! under tokio; `trireme-sim` runs them under a seeded simulator that
//! injects crashes, partitions and disk faults. docs/replication.md gives
//! the rules and why they hold.

pub mod driver;
pub mod message;
pub mod primary;
pub mod regions;
pub mod replica;

pub use message::{BlockHash, FromReplica, Payload, ReadData, ReplicaError, ToReplica};
pub use primary::{
    AckLatency, Action, ClientError, ClientRequest, Completion, Config, DirtyMap, EngineReport,
    LinkReport, NoQuorumPolicy, OpId, Primary, Proposal, ProposalResult, SyncProgress,
    VerifyReport, VerifyState, View, ACK_LATENCY_BOUNDS_MS,
};
pub use regions::{RegionSet, REGION_BYTES};
pub use replica::{HelloOutcome, LinkId, ReplicaSide, LEASE_HOLD_MS};
