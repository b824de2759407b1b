//! [`ReplicaSide`]: what a node holding a copy of a volume decides about the
//! primaries that write to it. The data itself goes to the store; this part
//! fences stale primaries and remembers which recent writes are unsettled.

use crate::message::{FromReplica, ToReplica};
use crate::regions::{regions_of, RegionSet};
use std::collections::{BTreeMap, VecDeque};
use trireme_types::{Generation, NodeId};

/// One accepted data link, numbered by the node that accepted it.
pub type LinkId = u64;

#[derive(Debug)]
struct Link {
    generation: Generation,
    /// Writes received and not yet known settled: (seq, offset, length).
    unsettled: VecDeque<(u64, u64, u64)>,
}

#[derive(Debug)]
pub struct ReplicaSide {
    accepted: Generation,
    primary_at: Option<Generation>,
    /// Every write acknowledged since `accepted` was accepted is known to
    /// this process, or the last primary left the copy clean (`Goodbye`).
    intact: bool,
    links: BTreeMap<LinkId, Link>,
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
}

impl ReplicaSide {
    /// `accepted`, `primary_at` and `clean` as persisted. A copy that was
    /// not left clean (a primary was writing when this process last
    /// stopped) may have lost unflushed writes and forgot what was
    /// unsettled: it is not intact.
    pub fn new(accepted: Generation, primary_at: Option<Generation>, clean: bool) -> Self {
        ReplicaSide {
            accepted,
            primary_at,
            intact: clean,
            links: BTreeMap::new(),
        }
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

    pub fn on_hello(
        &mut self,
        link: LinkId,
        generation: Generation,
        _primary: NodeId,
    ) -> HelloOutcome {
        if generation < self.accepted {
            return HelloOutcome::Refuse(FromReplica::Refused {
                newer: self.accepted,
            });
        }
        let mut unsettled = RegionSet::new();
        for entry in self.links.values() {
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
        let persist = (generation > self.accepted).then_some(generation);
        if generation > self.accepted {
            // Links of older generations are fenced from now on; what they
            // left unsettled was just reported to the new primary.
            self.links.retain(|_, entry| entry.generation >= generation);
            self.accepted = generation;
        }
        self.intact = true;
        self.links.insert(
            link,
            Link {
                generation,
                unsettled: VecDeque::new(),
            },
        );
        HelloOutcome::Accept { persist, welcome }
    }

    /// Whether a message on `link` may be carried out; a refusal is sent
    /// back and the link closed otherwise.
    pub fn admit(&mut self, link: LinkId, message: &ToReplica) -> Result<(), FromReplica> {
        let accepted = self.accepted;
        let Some(entry) = self.links.get_mut(&link) else {
            return Err(FromReplica::Refused { newer: accepted });
        };
        if entry.generation < accepted {
            return Err(FromReplica::Refused { newer: accepted });
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
        }
        Ok(())
    }

    pub fn link_closed(&mut self, link: LinkId) {
        // Its unsettled writes stay known until a newer hello reports them.
        if let Some(entry) = self.links.get_mut(&link) {
            if entry.unsettled.is_empty() {
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
            side.on_hello(1, Generation(2), NodeId(1)),
            HelloOutcome::Refuse(FromReplica::Refused {
                newer: Generation(3)
            })
        ));
        let HelloOutcome::Accept { persist, welcome } = side.on_hello(2, Generation(4), NodeId(1))
        else {
            panic!("a newer generation is accepted");
        };
        assert_eq!(persist, Some(Generation(4)));
        assert!(matches!(
            welcome,
            FromReplica::Welcome { intact: false, .. }
        ));
        side.admit(2, &write(1, 0, 1)).unwrap();
        side.admit(2, &write(2, 5 << 20, 1)).unwrap();
        side.admit(2, &write(3, 9 << 20, 3)).unwrap();
        let HelloOutcome::Accept { welcome, .. } = side.on_hello(3, Generation(5), NodeId(2))
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
        assert!(side.admit(2, &write(4, 0, 4)).is_err());
    }
}
