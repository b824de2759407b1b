//! [`ReplicaSide`]: what a node holding a copy of a volume decides about the
//! primaries that write to it. The data itself goes to the store; this part
//! fences stale primaries, remembers which recent writes are unsettled, and
//! keeps the read leases it granted: every message it admits tells the
//! primary that sent it that no newer primary can complete a write here for
//! a while, so it welcomes a newer generation only once the leases it
//! granted to older ones have run out (docs/replication.md, rule 9).
//!
//! What the node's driver around it must do (`trireme-sim`'s replication
//! simulator does exactly this, and the protocol relies on it):
//! - Handle a link's messages in order, each through [`ReplicaSide::admit`]
//!   (or `on_hello`, `on_goodbye`) before it reaches the store; a refusal is
//!   sent back, then the link closed. A closed link delivers nothing more:
//!   key links by [`LinkId`], never by peer.
//! - Persist an accepted hello's generation and `clean = false` before the
//!   welcome goes out; persist `clean = true` when `on_goodbye` says so;
//!   persist the node's own `set_primary_at` before its engine starts.
//!   Persists complete in the order they were asked for.
//! - Order the store's operations: one that overlaps an earlier one (on any
//!   link) waits for it, and a flush waits for every write received before
//!   it. Operations may otherwise complete, and be acknowledged, in any
//!   order; only a flush's own acknowledgement says it is done.
//! - Pass every call the time by one clock of the node that only moves
//!   forward (durations count, never the wall clock), and send a `Pong` for
//!   every admitted `Ping`.
//! - When `on_hello` says [`HelloOutcome::Wait`], handle nothing more on
//!   that link and call `on_hello` again with the same hello at the time
//!   it names (the link may close meanwhile).
//! - After a restart, rebuild the side with [`ReplicaSide::new`] from what
//!   was persisted, then [`ReplicaSide::after_restart`]; a crash loses the
//!   volatile data (what was not flushed).
//! - Optionally close the links of older generations (with a refusal) when
//!   a newer hello is accepted; their acknowledgements may also keep
//!   flowing: both are safe.

pub use crate::message::LEASE_HOLD_MS;
use crate::message::{FromReplica, ToReplica};
use crate::regions::{regions_of, RegionSet};
use std::collections::{BTreeMap, VecDeque};
use trireme_types::{Generation, NodeId};

/// One accepted data link, numbered by the node that accepted it.
pub type LinkId = u64;

/// Unsettled writes a link remembers one by one; older ones are folded
/// into regions (a primary may keep writes unsettled for long).
const UNSETTLED_ENTRIES: usize = 4096;

#[derive(Debug)]
struct Link {
    generation: Generation,
    /// Writes received and not yet known settled: (seq, offset, length).
    unsettled: VecDeque<(u64, u64, u64)>,
    /// Regions of unsettled writes folded out of `unsettled`: reported
    /// until the link is forgotten.
    folded: RegionSet,
}

#[derive(Debug)]
pub struct ReplicaSide {
    accepted: Generation,
    /// Primaries of this generation and older are refused: the volume was
    /// detached at it (see [`ReplicaSide::fence`]).
    fenced: Generation,
    primary_at: Option<Generation>,
    /// No acknowledged write can be missing: this process has run since the
    /// last primary left the copy clean (`Goodbye`), or since a primary that
    /// was told otherwise wrote to it again. A restart that was not clean
    /// clears it, and only a write admitted afterwards sets it again: a
    /// primary that learns the copy is not intact resyncs it (or makes it
    /// the source) before it writes, and one that dies before doing so must
    /// not leave the next one believing the copy is whole.
    intact: bool,
    links: BTreeMap<LinkId, Link>,
    /// The newest generation whose hello waits for older leases to run
    /// out: links of older generations are refused from now on, so that
    /// they get no new lease meanwhile. Not persisted: a restart waits
    /// anyway (`restart_hold_until_ms`).
    waiting: Generation,
    /// When this side last admitted a message (or sent a welcome) of each
    /// generation: the leases it granted. Entries older than
    /// [`LEASE_HOLD_MS`] are dropped.
    granted_ms: BTreeMap<Generation, u64>,
    /// A side rebuilt after a restart forgot what it granted before: no
    /// generation newer than `restart_accepted` is welcomed before this.
    restart_hold_until_ms: u64,
    restart_accepted: Generation,
}

#[derive(Debug, PartialEq, Eq)]
pub enum HelloOutcome {
    /// Send this refusal and close the link.
    Refuse(FromReplica),
    /// Persist `persist` (when set) and `clean = false`, and only then send
    /// `welcome`.
    Accept {
        persist: Option<Generation>,
        welcome: FromReplica,
    },
    /// Leases this replica granted to older generations may still be held:
    /// handle nothing more on this link and call `on_hello` again with the
    /// same hello at `until_ms`. Older generations are refused meanwhile.
    Wait { until_ms: u64 },
}

impl ReplicaSide {
    /// `accepted`, `primary_at` and `clean` as persisted. A copy that was
    /// not left clean (a primary was writing when this process last
    /// stopped) may have lost unflushed writes and forgot what was
    /// unsettled: it is not intact.
    ///
    /// A side built for a copy that answered primaries before (every one
    /// rebuilt after a restart) must also be told when it started: see
    /// [`ReplicaSide::after_restart`].
    pub fn new(accepted: Generation, primary_at: Option<Generation>, clean: bool) -> Self {
        ReplicaSide {
            accepted,
            fenced: Generation(0),
            primary_at,
            intact: clean,
            links: BTreeMap::new(),
            waiting: accepted,
            granted_ms: BTreeMap::new(),
            restart_hold_until_ms: 0,
            restart_accepted: accepted,
        }
    }

    /// The side's process (re)started at `started_ms` (by the clock the
    /// side is given; a side built later, on first use, passes the same
    /// time): the leases granted before are forgotten, so it welcomes no
    /// generation newer than the one it had accepted until
    /// [`LEASE_HOLD_MS`] after that. A newer generation is persisted as
    /// accepted only once the leases of older ones ran out, so a hello of
    /// the accepted one needs no wait.
    pub fn after_restart(mut self, started_ms: u64) -> Self {
        self.restart_hold_until_ms = started_ms + LEASE_HOLD_MS;
        self
    }

    /// As [`ReplicaSide::new`], with the fence that was persisted.
    pub fn with_fence(mut self, fenced: Generation) -> Self {
        self.fenced = fenced;
        self
    }

    /// The volume was detached at `generation`: from now on no primary of
    /// it or an older one may write here, not even one cut off from the
    /// cluster that still believes it is attached (persist the fence, then
    /// close the links this returns true for). A later attach comes with a
    /// newer generation. Copies of a detached volume then cannot change, so
    /// snapshots and rollbacks their nodes make on their own agree.
    pub fn fence(&mut self, generation: Generation) {
        // `accepted` stays: it tells the next primary which history this
        // copy last followed (its dirty maps depend on it).
        self.fenced = self.fenced.max(generation);
    }

    pub fn fenced(&self) -> Generation {
        self.fenced
    }

    /// Whether `link` belongs to a fenced generation (close it).
    pub fn is_fenced(&self, link: LinkId) -> bool {
        self.links
            .get(&link)
            .is_some_and(|entry| entry.generation <= self.fenced)
    }

    /// A primary said goodbye on `link`: persist `clean = true` when this
    /// returns true (no other link of the newest generation is open).
    pub fn on_goodbye(&mut self, link: LinkId) -> bool {
        let accepted = self.accepted;
        let current = self
            .links
            .get(&link)
            .is_some_and(|entry| entry.generation == accepted);
        if current {
            self.links.remove(&link);
        }
        current && self.links.values().all(|entry| entry.generation < accepted)
    }

    pub fn accepted(&self) -> Generation {
        self.accepted
    }

    /// This node starts a primary at `generation` (persist it with the
    /// accepted generation): a later primary learns that this copy may hold
    /// writes nobody else got.
    pub fn set_primary_at(&mut self, generation: Generation) {
        self.primary_at = Some(generation);
    }

    pub fn primary_at(&self) -> Option<Generation> {
        self.primary_at
    }

    /// The newest generation this side knows of: older ones are refused.
    fn newest(&self) -> Generation {
        self.accepted.max(self.waiting)
    }

    /// When a hello of `generation` may be welcomed: once every lease this
    /// side granted to an older generation has run out.
    fn welcome_not_before(&self, generation: Generation) -> u64 {
        let granted = self
            .granted_ms
            .range(..generation)
            .map(|(_, &at)| at + LEASE_HOLD_MS)
            .max()
            .unwrap_or(0);
        let restart = if generation > self.restart_accepted {
            self.restart_hold_until_ms
        } else {
            0
        };
        granted.max(restart)
    }

    fn grant(&mut self, generation: Generation, now_ms: u64) {
        self.granted_ms
            .retain(|_, &mut at| at + LEASE_HOLD_MS > now_ms);
        let at = self.granted_ms.entry(generation).or_insert(now_ms);
        *at = (*at).max(now_ms);
    }

    /// A primary's hello on `link`, received at `now_ms`: refused if its
    /// generation is older than one this side knows; put off while leases
    /// granted to older generations may still be held; welcomed otherwise.
    pub fn on_hello(
        &mut self,
        link: LinkId,
        generation: Generation,
        _primary: NodeId,
        now_ms: u64,
    ) -> HelloOutcome {
        if generation < self.newest() || generation <= self.fenced {
            return HelloOutcome::Refuse(FromReplica::Refused {
                newer: self.newest().max(self.fenced.next()),
            });
        }
        let until_ms = self.welcome_not_before(generation);
        if until_ms > now_ms {
            self.waiting = self.waiting.max(generation);
            return HelloOutcome::Wait { until_ms };
        }
        let mut unsettled = RegionSet::new();
        for entry in self.links.values() {
            unsettled.union_with(&entry.folded);
            for &(_, offset, length) in &entry.unsettled {
                for region in regions_of(offset, length) {
                    unsettled.insert(region);
                }
            }
        }
        let previous = self.accepted;
        let welcome = FromReplica::Welcome {
            previous,
            intact: self.intact,
            was_primary: self.primary_at == Some(previous),
            unsettled,
        };
        // Generations only move forward here: an older one was refused.
        assert!(
            generation >= self.accepted && generation > self.fenced,
            "welcoming generation {generation} after accepting {} (fenced {})",
            self.accepted,
            self.fenced
        );
        let persist = (generation > self.accepted).then_some(generation);
        if generation > self.accepted {
            // Links of older generations are fenced from now on. What they
            // left unsettled is reported again to every hello until a
            // primary of the newer generation has reconciled (its first
            // flush here says so): one that dies before would leave the
            // next one none the wiser.
            self.accepted = generation;
        }
        self.links.insert(
            link,
            Link {
                generation,
                unsettled: VecDeque::new(),
                folded: RegionSet::new(),
            },
        );
        // The welcome answers the hello: the primary counts it in its lease.
        self.grant(generation, now_ms);
        HelloOutcome::Accept { persist, welcome }
    }

    /// Whether a message on `link`, received at `now_ms`, may be carried
    /// out; a refusal is sent back and the link closed otherwise. An
    /// admitted message grants its primary a read lease.
    pub fn admit(
        &mut self,
        link: LinkId,
        message: &ToReplica,
        now_ms: u64,
    ) -> Result<(), FromReplica> {
        let accepted = self.accepted;
        let newest = self.newest();
        let fenced = self.fenced;
        let Some(generation) = self.links.get(&link).map(|entry| entry.generation) else {
            return Err(FromReplica::Refused { newer: newest });
        };
        if generation < newest || generation <= fenced {
            return Err(FromReplica::Refused {
                newer: newest.max(fenced.next()),
            });
        }
        self.grant(generation, now_ms);
        let entry = self.links.get_mut(&link).expect("checked");
        if matches!(message, ToReplica::Flush { .. }) {
            // A primary flushes only once it serves, after reconciling what
            // older generations left unsettled.
            self.links.retain(|_, entry| entry.generation >= accepted);
            return Ok(());
        }
        if let ToReplica::Write {
            seq,
            offset,
            payload,
            settled,
            ..
        } = message
        {
            while entry
                .unsettled
                .front()
                .is_some_and(|&(old, _, _)| old < *settled)
            {
                entry.unsettled.pop_front();
            }
            entry.unsettled.push_back((*seq, *offset, payload.length()));
            if entry.unsettled.len() > UNSETTLED_ENTRIES {
                for _ in 0..UNSETTLED_ENTRIES / 2 {
                    let (_, offset, length) = entry.unsettled.pop_front().expect("full");
                    entry.folded.add_range(offset, length);
                }
            }
            // A primary that knows what this copy may lack writes to it.
            self.intact = true;
        }
        Ok(())
    }

    pub fn link_closed(&mut self, link: LinkId) {
        // Its unsettled writes stay known until a primary of a newer
        // generation flushes here (it reconciled them).
        if let Some(entry) = self.links.get_mut(&link) {
            if entry.unsettled.is_empty() && entry.folded.is_empty() {
                self.links.remove(&link);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Payload;

    fn write(seq: u64, offset: u64, settled: u64) -> ToReplica {
        ToReplica::Write {
            seq,
            offset,
            payload: Payload::Zeroes {
                length: 4096,
                trim: false,
            },
            fua: false,
            settled,
        }
    }

    #[test]
    fn an_older_generation_is_refused_and_unsettled_writes_are_reported() {
        let mut side = ReplicaSide::new(Generation(3), None, false);
        assert!(matches!(
            side.on_hello(1, Generation(2), NodeId(1), 0),
            HelloOutcome::Refuse(FromReplica::Refused {
                newer: Generation(3)
            })
        ));
        let HelloOutcome::Accept { persist, welcome } =
            side.on_hello(2, Generation(4), NodeId(1), 0)
        else {
            panic!("a newer generation is accepted");
        };
        assert_eq!(persist, Some(Generation(4)));
        assert!(matches!(
            welcome,
            FromReplica::Welcome { intact: false, .. }
        ));
        side.admit(2, &write(1, 0, 1), 0).unwrap();
        side.admit(2, &write(2, 5 << 20, 1), 0).unwrap();
        side.admit(2, &write(3, 9 << 20, 3), 0).unwrap();
        let HelloOutcome::Accept { welcome, .. } =
            side.on_hello(3, Generation(5), NodeId(2), LEASE_HOLD_MS)
        else {
            panic!("accepted");
        };
        let FromReplica::Welcome {
            previous,
            intact,
            unsettled,
            ..
        } = welcome
        else {
            panic!("welcome");
        };
        assert_eq!(previous, Generation(4));
        assert!(intact);
        assert_eq!(unsettled.iter().collect::<Vec<_>>(), vec![9]);
        // The link of generation 4 is fenced now.
        assert!(side.admit(2, &write(4, 0, 4), LEASE_HOLD_MS).is_err());
    }

    #[test]
    fn a_fence_refuses_the_detached_generation_and_older_ones() {
        let mut side = ReplicaSide::new(Generation(3), None, true);
        assert!(matches!(
            side.on_hello(1, Generation(3), NodeId(1), 0),
            HelloOutcome::Accept { .. }
        ));
        side.admit(1, &write(1, 0, 1), 0).unwrap();
        // Detached at 3: the primary of 3, still linked, can write no more,
        // nor link again; a newer primary can.
        side.fence(Generation(3));
        assert!(side.is_fenced(1));
        assert_eq!(
            side.admit(1, &write(2, 0, 2), 0),
            Err(FromReplica::Refused {
                newer: Generation(4)
            })
        );
        assert!(matches!(
            side.on_hello(2, Generation(3), NodeId(1), LEASE_HOLD_MS),
            HelloOutcome::Refuse(_)
        ));
        assert!(matches!(
            side.on_hello(3, Generation(4), NodeId(2), LEASE_HOLD_MS),
            HelloOutcome::Accept { .. }
        ));
        assert!(!side.is_fenced(3));
        // A fence persisted before a restart holds after it.
        let restarted = ReplicaSide::new(Generation(3), None, true).with_fence(Generation(3));
        assert_eq!(restarted.fenced(), Generation(3));
    }

    #[test]
    fn a_newer_generation_is_welcomed_once_the_leases_granted_to_older_ones_ran_out() {
        let mut side = ReplicaSide::new(Generation(3), None, true);
        assert!(matches!(
            side.on_hello(1, Generation(3), NodeId(1), 0),
            HelloOutcome::Accept { .. }
        ));
        side.admit(1, &ToReplica::Ping { token: 900 }, 1_000)
            .unwrap();
        // A newer primary must wait: the primary of 3 may read until 1,000
        // plus its lease.
        assert_eq!(
            side.on_hello(2, Generation(4), NodeId(2), 1_500),
            HelloOutcome::Wait {
                until_ms: 1_000 + LEASE_HOLD_MS
            }
        );
        // Meanwhile generation 3 gets no new lease: not on its link, not on
        // a new one.
        assert_eq!(
            side.admit(1, &ToReplica::Ping { token: 1_600 }, 1_600),
            Err(FromReplica::Refused {
                newer: Generation(4)
            })
        );
        assert!(matches!(
            side.on_hello(3, Generation(3), NodeId(1), 1_700),
            HelloOutcome::Refuse(_)
        ));
        assert_eq!(
            side.accepted(),
            Generation(3),
            "not accepted while it waits"
        );
        let HelloOutcome::Accept { persist, .. } =
            side.on_hello(2, Generation(4), NodeId(2), 1_000 + LEASE_HOLD_MS)
        else {
            panic!("welcomed once the lease ran out");
        };
        assert_eq!(persist, Some(Generation(4)));
        // The primary of 4 linking again waits for nothing.
        side.admit(2, &ToReplica::Ping { token: 4_000 }, 4_000)
            .unwrap();
        assert!(matches!(
            side.on_hello(4, Generation(4), NodeId(2), 4_001),
            HelloOutcome::Accept { .. }
        ));
    }

    #[test]
    fn a_restarted_replica_welcomes_a_newer_generation_only_after_a_whole_lease() {
        // It forgot what it granted before the restart.
        let mut side = ReplicaSide::new(Generation(3), None, false).after_restart(10_000);
        assert_eq!(
            side.on_hello(1, Generation(4), NodeId(2), 10_100),
            HelloOutcome::Wait {
                until_ms: 10_000 + LEASE_HOLD_MS
            }
        );
        // The generation it had accepted was persisted only after the
        // leases of older ones ran out: its primary links again at once.
        let mut side = ReplicaSide::new(Generation(3), None, false).after_restart(10_000);
        assert!(matches!(
            side.on_hello(2, Generation(3), NodeId(1), 10_100),
            HelloOutcome::Accept { .. }
        ));
        assert!(matches!(
            side.on_hello(3, Generation(4), NodeId(2), 10_000 + LEASE_HOLD_MS),
            HelloOutcome::Wait { .. }
        ));
    }
}
