//! The drivers around the sans-IO machines: the decisions a runtime makes
//! with their outputs, written once for the node daemon, the simulator and
//! the tests. Each runtime keeps only its I/O (sockets or simulated links,
//! a store or a simulated disk, a control plane or the simulator's
//! arbiter).
//!
//! - [`replica`]: what a replica does with each message on a data link.
//! - [`primary`]: the engine's proposals to the control plane, its answers
//!   and the volume's record, mapped to and from the engine's terms.

pub mod primary;
pub mod replica;
