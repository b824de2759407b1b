//! The engine's private state: members and their sync state, backlogs,
//! pending requests and the phase of the engine.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Diskful,
    Tiebreaker,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Link {
    Down,
    /// `link_up` came, hello sent at this time.
    Hello(u64),
    Up {
        previous: Generation,
    },
}

/// Regions a member may lack, to copy: a set plus, for a full sync, every
/// region from `sweep` on.
#[derive(Debug, Clone, Default)]
pub(super) struct Backlog {
    pub(super) set: RegionSet,
    pub(super) sweep: Option<u64>,
}

impl Backlog {
    pub(super) fn full() -> Self {
        Backlog {
            set: RegionSet::new(),
            sweep: Some(0),
        }
    }

    pub(super) fn add(&mut self, region: u64) {
        if self.sweep.is_none_or(|sweep| region < sweep) {
            self.set.insert(region);
        }
    }

    pub(super) fn add_set(&mut self, regions: &RegionSet) {
        for region in regions.iter() {
            self.add(region);
        }
    }

    pub(super) fn is_empty(&self, region_count: u64) -> bool {
        self.set.is_empty() && self.sweep.is_none_or(|sweep| sweep >= region_count)
    }

    pub(super) fn len(&self, region_count: u64) -> u64 {
        let swept = self
            .sweep
            .map_or(0, |sweep| region_count.saturating_sub(sweep));
        let below = match self.sweep {
            Some(sweep) => self.set.iter().filter(|&r| r < sweep).count() as u64,
            None => self.set.len(),
        };
        swept + below
    }

    pub(super) fn pop(&mut self, region_count: u64, skip: impl Fn(u64) -> bool) -> Option<u64> {
        let found = self.set.iter().find(|&r| !skip(r));
        if let Some(region) = found {
            self.set.remove(region);
            return Some(region);
        }
        let sweep = self.sweep?;
        if sweep >= region_count || skip(sweep) {
            return None;
        }
        self.sweep = Some(sweep + 1);
        Some(sweep)
    }

    pub(super) fn to_map(&self, since: Generation) -> DirtyMap {
        DirtyMap {
            since,
            full: self.sweep.is_some(),
            regions: self.set.clone(),
        }
    }
}

#[derive(Debug)]
#[allow(clippy::enum_variant_names)]
pub(super) enum Sync {
    InSync,
    Outdated {
        backlog: Backlog,
    },
    Resyncing {
        backlog: Backlog,
        /// Bytes of the regions holding data that are copied: progress
        /// counts what is to be copied, not the volume's size.
        done: u64,
        /// Resync writes on the link: seq → the piece of a region it
        /// carries (a region goes as a few writes: its data, and its
        /// unwritten blocks as holes).
        writes: BTreeMap<u64, ResyncPiece>,
        /// Source reads: read id → (region, source).
        reads: BTreeMap<u64, (u64, NodeId)>,
    },
    /// Copied; its acknowledgements now count. `flush`: the flush that makes
    /// the copy durable; then MarkInSync is proposed.
    Joining {
        flush: Option<u64>,
    },
}

/// One write of a resync copy.
#[derive(Debug, Clone, Copy)]
pub(super) struct ResyncPiece {
    pub(super) region: u64,
    /// The region read as data at its source (not as a hole).
    pub(super) region_has_data: bool,
    /// The data bytes this write carries (0 for a hole).
    pub(super) data_bytes: u64,
}

#[derive(Debug)]
pub(super) struct Member {
    pub(super) kind: Kind,
    pub(super) link: Link,
    pub(super) sync: Sync,
    /// Sent, not acknowledged: seq → (offset, length, sent at, bytes).
    pub(super) unacked: BTreeMap<u64, (u64, u64, u64, u64)>,
    pub(super) unacked_bytes: u64,
    /// Regions written since the last flush was sent to it.
    pub(super) unflushed: RegionSet,
    /// Flushes sent, with the regions they make durable.
    pub(super) flushing: Vec<(u64, RegionSet)>,
    /// Regions it may have lost while it is in the set but being outdated.
    pub(super) lost: RegionSet,
    /// `unflushed` and `flushing` name everything it may hold unflushed: a
    /// flush this engine sent after its welcome succeeded. Until then it
    /// may also hold unflushed writes of former primaries.
    pub(super) tracked: bool,
    /// The sequence counter at its last welcome.
    pub(super) welcomed_at: u64,
    /// It restarted and may have lost unflushed writes nobody can name:
    /// when it is outdated, it copies every region.
    pub(super) full_resync: bool,
    /// In the set, but back from a restart: it must be outdated before it
    /// gets writes or serves reads.
    pub(super) damaged: bool,
    /// What its last welcome said.
    pub(super) intact: bool,
    pub(super) outdating: Option<u64>,
    /// The control plane refused `outdating`: it is the last up-to-date
    /// member.
    pub(super) outdate_refused: bool,
    pub(super) joining_proposal: Option<u64>,
    /// Persisted map's generation, when one exists for it.
    pub(super) map_since: Option<Generation>,
    /// Regions written while it resyncs, kept in its persisted map.
    pub(super) written_during_sync: RegionSet,
    pub(super) progress_mark: (u64, u64),
    /// The token of the newest `PersistDirty` of its map: a write that
    /// completes without it must wait for that one, even when the write's
    /// regions were in the map already (the map naming them may still be
    /// on its way to the disk).
    pub(super) map_token: u64,
    /// When we sent (by our clock) the newest message it answered: its
    /// vote for the read lease, whatever its state (it welcomes no newer
    /// primary for a while after it answers).
    pub(super) answered_sent_ms: Option<u64>,
    /// When the last keepalive went to it.
    pub(super) pinged_ms: u64,
    /// How long its acknowledgements of writes took (monitoring only).
    pub(super) ack_latency: AckLatency,
}

impl Member {
    pub(super) fn new(kind: Kind, sync: Sync) -> Self {
        Member {
            kind,
            link: Link::Down,
            sync,
            unacked: BTreeMap::new(),
            unacked_bytes: 0,
            unflushed: RegionSet::new(),
            flushing: Vec::new(),
            lost: RegionSet::new(),
            tracked: false,
            welcomed_at: 0,
            full_resync: false,
            damaged: false,
            intact: false,
            outdating: None,
            outdate_refused: false,
            joining_proposal: None,
            map_since: None,
            written_during_sync: RegionSet::new(),
            progress_mark: (0, 0),
            map_token: 0,
            answered_sent_ms: None,
            pinged_ms: 0,
            ack_latency: AckLatency::default(),
        }
    }

    pub(super) fn is_up(&self) -> bool {
        matches!(self.link, Link::Up { .. })
    }

    /// Its acknowledgement is required for a write to complete.
    pub(super) fn is_needed(&self) -> bool {
        match self.sync {
            Sync::InSync => true,
            Sync::Joining { .. } => true,
            _ => self.joining_proposal.is_some(),
        }
    }

    /// Holds every region as the set does, as far as this engine knows.
    /// A member still in the set that lost regions (its link dropped with
    /// writes unconfirmed, or a copy went on without it) gets no message
    /// that would let it pass for whole until it is outdated: no snapshot
    /// barrier (its snapshot would lack those regions) and no flush (a
    /// flush tells a replica that what older primaries left unsettled is
    /// reconciled, and it would stop reporting those regions to the next
    /// primary). Flushes and barriers wait for it as for a member that is
    /// down: until it leaves the set.
    pub(super) fn holds_everything(&self) -> bool {
        self.lost.is_empty()
    }

    /// Receives writes.
    pub(super) fn takes_writes(&self) -> bool {
        self.is_up() && !self.damaged && !matches!(self.sync, Sync::Outdated { .. })
    }
}

#[derive(Debug)]
pub(super) enum Purpose {
    Client(OpId),
    Repair,
    Internal,
    /// A snapshot barrier: completes like a write (every in-sync replica,
    /// and a quorum), but carries no data and is never sent again.
    Snapshot(SnapshotId),
}

/// What the last pass of `complete_writes` looked at, so that the next
/// pass looks only at the writes whose verdict may have changed.
///
/// Why: a write's verdict depends on its own fields (acknowledgements,
/// errors, the members it needs, its persist token) and on three things
/// outside it: `persisted_through`, each member's state (needed, up) and
/// the view. Looking at every pending write on every event cost 7% of a
/// primary's CPU at 32 writes in flight (issue 24, item 4), each
/// acknowledgement re-judging all 32. Now an event that changes only one
/// write's fields (an acknowledgement) re-judges that write, a new write
/// is judged once, and anything else (another input changed, or code that
/// edits many writes at once) re-judges them all.
#[derive(Debug, Default)]
pub(super) struct CompletionScan {
    /// Judge every write at the next pass.
    pub(super) all: bool,
    /// The outside inputs at the last pass: `persisted_through` and the
    /// members' states (`completion_inputs`).
    pub(super) seen: Option<(u64, u128)>,
    /// Writes whose own fields changed since the last pass.
    pub(super) touched: Vec<u64>,
    /// Writes from this sequence on were started after the last pass.
    pub(super) new_from: u64,
}

impl CompletionScan {
    /// Writes touched between passes are bounded: past this many (passes
    /// wait while the engine reconciles), the next pass judges them all.
    const TOUCHED_MAX: usize = 1024;

    /// `seq`'s own fields changed: the next pass judges it.
    pub(super) fn touch(&mut self, seq: u64) {
        if self.all {
            return;
        }
        if self.touched.len() >= Self::TOUCHED_MAX {
            self.all = true;
            self.touched.clear();
        } else {
            self.touched.push(seq);
        }
    }
}

#[derive(Debug)]
pub(super) struct PendingWrite {
    pub(super) purpose: Purpose,
    pub(super) range: (u64, u64),
    pub(super) flush: bool,
    /// What a write carries (and whether it is FUA), to send it again to a
    /// member that reconnects before acknowledging it.
    pub(super) payload: Option<(Payload, bool)>,
    pub(super) needed: BTreeSet<NodeId>,
    pub(super) acked: BTreeSet<NodeId>,
    pub(super) errors: Vec<(NodeId, ReplicaError)>,
    pub(super) persist_token: u64,
    pub(super) started_ms: u64,
}

#[derive(Debug)]
pub(super) struct PendingRead {
    pub(super) op: Option<OpId>,
    pub(super) offset: u64,
    pub(super) length: u64,
    pub(super) source: NodeId,
    pub(super) bad: Vec<NodeId>,
}

#[derive(Debug)]
pub(super) enum Phase {
    /// Waiting for the up-to-date members' welcomes.
    Reconciling {
        since_ms: u64,
        welcomes: BTreeMap<NodeId, (bool, RegionSet)>,
        /// Regions of former primaries' unsettled writes, as reported.
        /// Kept when a member's link drops: it cannot report them again.
        unsettled: RegionSet,
    },
    /// Copying the regions some members may hold differently.
    Copying {
        remaining: usize,
    },
    Serving,
    Stopped,
}

#[cfg(test)]
mod tests {
    use super::CompletionScan;

    #[test]
    fn touches_past_the_bound_turn_into_a_pass_over_every_write() {
        let mut scan = CompletionScan::default();
        for seq in 0..CompletionScan::TOUCHED_MAX as u64 {
            scan.touch(seq);
        }
        assert!(!scan.all, "within the bound, only the touched are judged");
        assert_eq!(scan.touched.len(), CompletionScan::TOUCHED_MAX);
        // One more: the list would grow without bound while passes wait,
        // so the next pass judges every write instead.
        scan.touch(5000);
        assert!(scan.all);
        assert!(
            scan.touched.is_empty(),
            "the list is dropped, not kept beside `all`"
        );
        scan.touch(5001);
        assert!(
            scan.touched.is_empty(),
            "nothing is listed while `all` is set"
        );
    }
}
