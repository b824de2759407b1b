//! The replica's driver: what a node holding a copy of a volume does with
//! each message a primary sends on a data link, around [`ReplicaSide`].
//!
//! [`ReplicaDriver::receive`] decides, for one message, what the node must
//! do next ([`Step`]): answer it, refuse it and close the link, make the
//! side's state durable before a welcome goes out, hold the link while
//! older read leases run out, or carry it out on the store. [`execute`]
//! carries a message out on a [`ReplicaStore`] and gives the answer.
//! Nothing here does I/O: the node's replica service (sockets, one thread
//! per link, redb for what is durable) and the replication simulator (a
//! simulated disk and network) both run every message through these two.
//!
//! What the runtime around it must still do (docs/replication.md):
//! - hand a link's messages to `receive` in order, one at a time; after a
//!   [`Step::Wait`] handle nothing more on that link until it calls
//!   `receive` again with the same hello at the time named;
//! - carry out a [`Step::Welcome`]'s persist before the welcome is sent,
//!   and close the link without a reply when it fails; persists complete
//!   in the order they were asked for;
//! - order the store's operations: one that overlaps an earlier one waits
//!   for it, and a flush for every write received before it;
//! - tell the side when a link closes ([`ReplicaSide::link_closed`]).

use crate::message::{BlockHash, FromReplica, Payload, ReadData, ReplicaError, ToReplica};
use crate::message::{MAX_FRAME_BYTES, MAX_HASH_BLOCKS};
use crate::replica::{HelloOutcome, LinkId, ReplicaSide};
use trireme_types::{Generation, SnapshotId};

/// What of a replica's side must survive a restart: the side is rebuilt
/// from it with [`ReplicaSide::new`], `with_fence` and `after_restart`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurableSide {
    pub accepted: Generation,
    pub primary_at: Option<Generation>,
    /// The last primary left the copy with nothing unflushed (`Goodbye`).
    pub clean: bool,
    pub fenced: Generation,
}

impl DurableSide {
    /// The side's state now, with `clean` as given (the side itself does
    /// not remember what was persisted last).
    pub fn of(side: &ReplicaSide, clean: bool) -> DurableSide {
        DurableSide {
            accepted: side.accepted(),
            primary_at: side.primary_at(),
            clean,
            fenced: side.fenced(),
        }
    }
}

/// What to do with one message received on a link.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Send this reply; the link stays open.
    Reply(FromReplica),
    /// Send this refusal, then close the link.
    Refuse(FromReplica),
    /// Make `durable` durable, and only then send `welcome`: a restart must
    /// not forget that a newer primary was accepted, nor that the copy is
    /// no longer clean. If the persist fails, close the link without a
    /// reply.
    Welcome {
        durable: DurableSide,
        welcome: FromReplica,
    },
    /// Leases granted to older generations may still be held: handle
    /// nothing more on this link and call `receive` again with the same
    /// hello at `until_ms`.
    Wait { until_ms: u64 },
    /// Admitted: carry the message out on the store ([`execute`]) and send
    /// its answer.
    Store(ToReplica),
    /// The primary said goodbye: make `durable` durable when set (the copy
    /// was left clean; a failure only loses that knowledge), then close the
    /// link.
    Close { durable: Option<DurableSide> },
    /// Data sent to a replica that holds none (a tiebreaker): the primary
    /// is confused. Close the link.
    DataForTiebreaker,
}

/// Rules the driver can be told to break, to show that the simulator
/// catches each (crates/sim's bug-switch tests). Off by default; only with
/// the `bug-switches` feature.
#[cfg(feature = "bug-switches")]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplicaBugs {
    /// The welcome goes out without the accepted generation (and
    /// `clean = false`) being persisted first.
    pub welcome_without_persist: bool,
    /// Messages of fenced generations are carried out, and a newer primary
    /// is welcomed without waiting for older leases.
    pub ignore_fencing: bool,
}

/// The replica's driver. It holds no state of its own (that is the
/// [`ReplicaSide`]'s): only which rules to break, under `bug-switches`.
#[derive(Debug, Clone, Default)]
pub struct ReplicaDriver {
    #[cfg(feature = "bug-switches")]
    bugs: ReplicaBugs,
}

impl ReplicaDriver {
    pub fn new() -> ReplicaDriver {
        ReplicaDriver::default()
    }

    #[cfg(feature = "bug-switches")]
    pub fn with_bugs(mut self, bugs: ReplicaBugs) -> ReplicaDriver {
        self.bugs = bugs;
        self
    }

    fn ignore_fencing(&self) -> bool {
        #[cfg(feature = "bug-switches")]
        return self.bugs.ignore_fencing;
        #[cfg(not(feature = "bug-switches"))]
        false
    }

    fn welcome_without_persist(&self) -> bool {
        #[cfg(feature = "bug-switches")]
        return self.bugs.welcome_without_persist;
        #[cfg(not(feature = "bug-switches"))]
        false
    }

    /// `message`, received on `link` at `now_ms` (the node's clock that
    /// only moves forward), by a replica that holds data (`holds_data`) or
    /// only votes (a tiebreaker).
    pub fn receive(
        &self,
        side: &mut ReplicaSide,
        link: LinkId,
        message: ToReplica,
        now_ms: u64,
        holds_data: bool,
    ) -> Step {
        match message {
            ToReplica::Hello {
                generation,
                primary,
            } => {
                let mut outcome = side.on_hello(link, generation, primary, now_ms);
                if let HelloOutcome::Wait { until_ms } = outcome {
                    if self.ignore_fencing() {
                        outcome = side.on_hello(link, generation, primary, until_ms);
                    }
                }
                match outcome {
                    HelloOutcome::Refuse(refusal) => Step::Refuse(refusal),
                    HelloOutcome::Wait { until_ms } => Step::Wait { until_ms },
                    HelloOutcome::Accept { welcome, .. } if self.welcome_without_persist() => {
                        Step::Reply(welcome)
                    }
                    HelloOutcome::Accept { welcome, .. } => Step::Welcome {
                        durable: DurableSide::of(side, false),
                        welcome,
                    },
                }
            }
            ToReplica::Goodbye => Step::Close {
                durable: side.on_goodbye(link).then(|| DurableSide::of(side, true)),
            },
            message => {
                if let Err(refusal) = side.admit(link, &message, now_ms) {
                    if !self.ignore_fencing() {
                        return Step::Refuse(refusal);
                    }
                }
                match message {
                    // Tiebreakers answer pings too: they vote for the lease.
                    ToReplica::Ping { token } => Step::Reply(FromReplica::Pong { token }),
                    _ if !holds_data => Step::DataForTiebreaker,
                    message => Step::Store(message),
                }
            }
        }
    }
}

/// A replica's copy of a volume, as [`execute`] uses it. Ranges are checked
/// before they get here (inside the volume, whole blocks for `hashes`).
pub trait ReplicaStore {
    fn size_bytes(&self) -> u64;
    /// A write of `payload` at `offset`; durable when it returns if `fua`.
    fn write(&self, offset: u64, payload: Payload, fua: bool) -> Result<(), ReplicaError>;
    fn flush(&self) -> Result<(), ReplicaError>;
    fn read(&self, offset: u64, length: u64) -> Result<ReadData, ReplicaError>;
    /// The fingerprint of every 4 KiB block of the range (one region at
    /// most); a block that fails its checksum is `Unreadable`.
    fn hashes(&self, offset: u64, length: u64) -> Result<Vec<BlockHash>, ReplicaError>;
    fn snapshot(&self, snapshot: SnapshotId) -> Result<(), ReplicaError>;
}

const BLOCK_BYTES: u64 = 4096;

/// Carries out an admitted `message` ([`Step::Store`]) on `store`: its
/// answer.
pub fn execute(store: &impl ReplicaStore, message: ToReplica) -> FromReplica {
    match message {
        ToReplica::Write {
            seq,
            offset,
            payload,
            fua,
            ..
        } => {
            let result = if inside(store, offset, payload.length()) {
                store.write(offset, payload, fua)
            } else {
                Err(ReplicaError::Refused(format!(
                    "a write of {} bytes at {offset} is outside the volume",
                    payload.length()
                )))
            };
            FromReplica::Ack { seq, result }
        }
        ToReplica::Flush { seq } => FromReplica::Ack {
            seq,
            result: store.flush(),
        },
        ToReplica::Read { id, offset, length } => {
            let result = if length as usize <= MAX_FRAME_BYTES - 64 && inside(store, offset, length)
            {
                store.read(offset, length)
            } else {
                Err(ReplicaError::Refused(format!(
                    "read of {length} bytes at {offset} is outside the volume or too large"
                )))
            };
            FromReplica::ReadReply { id, result }
        }
        ToReplica::Hash { id, offset, length } => {
            let blocks = length / BLOCK_BYTES;
            let result = if offset.is_multiple_of(BLOCK_BYTES)
                && length.is_multiple_of(BLOCK_BYTES)
                && blocks > 0
                && blocks <= MAX_HASH_BLOCKS
                && inside(store, offset, length)
            {
                store.hashes(offset, length)
            } else {
                Err(ReplicaError::Refused(format!(
                    "fingerprints of {length} bytes at {offset}: not whole blocks of one region inside the volume"
                )))
            };
            FromReplica::HashReply { id, result }
        }
        ToReplica::Snapshot { seq, snapshot } => FromReplica::Ack {
            seq,
            result: store.snapshot(snapshot),
        },
        ToReplica::Ping { token } => FromReplica::Pong { token },
        ToReplica::Hello { .. } | ToReplica::Goodbye => FromReplica::Refused {
            // Never a `Step::Store`; answered as a protocol error would be.
            newer: Generation(0),
        },
    }
}

fn inside(store: &impl ReplicaStore, offset: u64, length: u64) -> bool {
    offset
        .checked_add(length)
        .is_some_and(|end| end <= store.size_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use trireme_types::NodeId;

    #[test]
    fn a_welcome_waits_for_the_persist_and_a_stale_primary_is_refused() {
        let driver = ReplicaDriver::new();
        let mut side = ReplicaSide::new(Generation(3), None, true);
        let hello = |generation| ToReplica::Hello {
            generation: Generation(generation),
            primary: NodeId(1),
        };
        match driver.receive(&mut side, 1, hello(4), 0, true) {
            Step::Welcome { durable, .. } => {
                assert_eq!(durable.accepted, Generation(4));
                assert!(!durable.clean, "a primary writes: the copy is not clean");
            }
            other => panic!("expected a welcome after a persist, got {other:?}"),
        }
        assert!(matches!(
            driver.receive(&mut side, 2, hello(3), 0, true),
            Step::Refuse(FromReplica::Refused { .. })
        ));
        assert!(matches!(
            driver.receive(&mut side, 2, ToReplica::Flush { seq: 1 }, 0, true),
            Step::Refuse(_)
        ));
        assert_eq!(
            driver.receive(&mut side, 1, ToReplica::Flush { seq: 1 }, 0, true),
            Step::Store(ToReplica::Flush { seq: 1 })
        );
        assert_eq!(
            driver.receive(&mut side, 1, ToReplica::Flush { seq: 2 }, 0, false),
            Step::DataForTiebreaker
        );
        assert_eq!(
            driver.receive(&mut side, 1, ToReplica::Ping { token: 7 }, 0, false),
            Step::Reply(FromReplica::Pong { token: 7 })
        );
        match driver.receive(&mut side, 1, ToReplica::Goodbye, 0, true) {
            Step::Close {
                durable: Some(durable),
            } => assert!(durable.clean),
            other => panic!("expected a clean close, got {other:?}"),
        }
    }

    struct Small;
    impl ReplicaStore for Small {
        fn size_bytes(&self) -> u64 {
            8192
        }
        fn write(&self, _: u64, _: Payload, _: bool) -> Result<(), ReplicaError> {
            Ok(())
        }
        fn flush(&self) -> Result<(), ReplicaError> {
            Ok(())
        }
        fn read(&self, _: u64, _: u64) -> Result<ReadData, ReplicaError> {
            Ok(ReadData::Zeroes)
        }
        fn hashes(&self, _: u64, length: u64) -> Result<Vec<BlockHash>, ReplicaError> {
            Ok(vec![BlockHash::Hash(0); (length / 4096) as usize])
        }
        fn snapshot(&self, _: SnapshotId) -> Result<(), ReplicaError> {
            Ok(())
        }
    }

    #[test]
    fn ranges_outside_the_volume_are_refused_not_carried_out() {
        let read = execute(
            &Small,
            ToReplica::Read {
                id: 1,
                offset: 4096,
                length: 8192,
            },
        );
        assert!(matches!(
            read,
            FromReplica::ReadReply {
                result: Err(ReplicaError::Refused(_)),
                ..
            }
        ));
        let hashes = execute(
            &Small,
            ToReplica::Hash {
                id: 2,
                offset: 100,
                length: 4096,
            },
        );
        assert!(matches!(
            hashes,
            FromReplica::HashReply {
                result: Err(ReplicaError::Refused(_)),
                ..
            }
        ));
        let write = execute(
            &Small,
            ToReplica::Write {
                seq: 3,
                offset: u64::MAX - 10,
                payload: Payload::Zeroes {
                    length: 4096,
                    trim: false,
                },
                fua: false,
                settled: 0,
            },
        );
        assert!(matches!(
            write,
            FromReplica::Ack {
                result: Err(ReplicaError::Refused(_)),
                ..
            }
        ));
    }
}
