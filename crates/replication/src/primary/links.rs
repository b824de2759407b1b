//! Members coming and going: welcomes, outdating through the control
//! plane, joining the in-sync set, dirty maps, lost links and laggards.

use super::*;

impl Primary {
    pub(super) fn on_welcome(
        &mut self,
        from: NodeId,
        previous: Generation,
        intact: bool,
        was_primary: bool,
        unsettled: RegionSet,
    ) {
        let generation = self.view.generation;
        let member = self.members.get_mut(&from).expect("checked");
        if !matches!(member.link, Link::Hello(_)) {
            return;
        }
        member.link = Link::Up { previous };
        if member.kind == Kind::Tiebreaker {
            return;
        }
        member.welcomed_at = self.next_seq;
        member.intact = intact;
        if !intact && !member.tracked {
            // It restarted, and lost what it had not flushed, including
            // writes of former primaries we know nothing about.
            member.full_resync = true;
        }
        if !intact
            && matches!(member.sync, Sync::InSync | Sync::Joining { .. })
            && !matches!(self.phase, Phase::Reconciling { .. })
        {
            // In the set (or about to be), yet it restarted: it gets no
            // write until it is outdated (a write would make it claim to
            // be intact to the next primary).
            member.damaged = true;
        }
        if let Phase::Reconciling {
            unsettled: reported,
            ..
        } = &mut self.phase
        {
            // Only a member new to this generation tells us about a former
            // primary's unsettled writes, whatever we think of it.
            if previous < generation {
                reported.union_with(&unsettled);
            }
        }
        if self.keep_if_back(from) {
            return;
        }
        // A member whose copy may not hold the volume's size yet is not
        // copied to (its store would refuse what lies past its end): it
        // stays outdated until its node reports it grown (`release_grown`).
        let hold = self.view.growing.contains(&from);
        let member = self.members.get_mut(&from).expect("checked");
        match &mut member.sync {
            Sync::InSync if member.outdating.is_none() => {
                if let Phase::Reconciling { welcomes, .. } = &mut self.phase {
                    // One that restarted may lack acknowledged writes, even
                    // if it already welcomed us before: it is not trusted.
                    welcomes.insert(from, (intact, RegionSet::new()));
                } else {
                    // Back while serving: whatever it missed in between is
                    // unknown to it; take it through the outdated path.
                    self.start_outdating(from);
                }
            }
            Sync::InSync => {}
            Sync::Outdated { backlog } => {
                let partial =
                    member.map_since == Some(previous) && !was_primary && !member.full_resync;
                member.full_resync = false;
                let mut backlog = if partial {
                    std::mem::take(backlog)
                } else {
                    Backlog::full()
                };
                // A former primary's unsettled writes may be on it alone.
                backlog.add_set(&unsettled);
                member.map_since = Some(generation);
                member.written_during_sync.clear();
                let map = backlog.to_map(generation);
                if hold {
                    // Tracked from our generation on, as a resync would
                    // be: its next welcome keeps the map.
                    member.sync = Sync::Outdated { backlog };
                } else {
                    member.sync = Sync::Resyncing {
                        backlog,
                        done: 0,
                        writes: BTreeMap::new(),
                        reads: BTreeMap::new(),
                    };
                    member.progress_mark = (self.now_ms, 0);
                }
                self.push_persist(from, map);
            }
            Sync::Resyncing { .. } | Sync::Joining { .. } => {}
        }
        self.resend_pending(from);
    }

    /// A member that (re)connects gets the writes and flushes still pending
    /// that it has not acknowledged: they were sent on a link that broke,
    /// or not at all. Without them, a write waiting for its acknowledgement
    /// (for the quorum, or because it is needed) would wait forever.
    pub(super) fn resend_pending(&mut self, node: NodeId) {
        if !self
            .members
            .get(&node)
            .is_some_and(|m| m.kind == Kind::Diskful && m.takes_writes())
        {
            return;
        }
        // What it failed on the link it had, it may apply on this one.
        for write in self.writes.values_mut() {
            write.errors.retain(|(n, _)| *n != node);
        }
        self.completion.all = true;
        type Resend = (u64, Option<(u64, Payload, bool)>);
        let pending: Vec<Resend> = self
            .writes
            .iter()
            .filter(|(_, w)| !w.acked.contains(&node))
            .filter_map(|(&seq, w)| {
                if w.flush {
                    Some((seq, None))
                } else {
                    w.payload
                        .as_ref()
                        .map(|(payload, fua)| (seq, Some((w.range.0, payload.clone(), *fua))))
                }
            })
            .collect();
        for (seq, write) in pending {
            match write {
                Some((offset, payload, fua)) => self.send_write(node, seq, offset, &payload, fua),
                None if !self.members[&node].holds_everything() => {}
                None => {
                    let now = self.now_ms;
                    let member = self.members.get_mut(&node).expect("checked");
                    let regions = std::mem::take(&mut member.unflushed);
                    member.flushing.push((seq, regions));
                    member.unacked.insert(seq, (0, 0, now, 0));
                    self.actions.push(Action::Send {
                        to: node,
                        message: ToReplica::Flush { seq },
                    });
                }
            }
        }
    }

    pub(super) fn on_committed(&mut self, id: u64, proposal: Proposal) {
        match proposal {
            Proposal::MarkOutdated { node } => {
                if self
                    .members
                    .get(&node)
                    .is_some_and(|m| m.outdating == Some(id))
                {
                    self.become_outdated(node);
                }
            }
            Proposal::MarkInSync { node } => {
                let Some(member) = self.members.get_mut(&node) else {
                    return;
                };
                if member.joining_proposal != Some(id) {
                    return;
                }
                member.joining_proposal = None;
                let whole = member.is_up() && !member.damaged && member.lost.is_empty();
                if matches!(member.sync, Sync::Joining { .. }) && whole {
                    member.sync = Sync::InSync;
                    member.map_since = None;
                    self.actions.push(Action::ForgetDirty { peer: node });
                } else {
                    // It left while the control plane was adding it (even if
                    // it is back, it missed writes): it is in the set but
                    // lacks writes, so take it out again.
                    member.sync = Sync::InSync;
                    self.start_outdating(node);
                }
            }
            Proposal::Progress { .. } => {}
        }
    }

    /// Proposes `MarkInSync` for a copied member, unless a `MarkOutdated`
    /// of it is still unanswered: a retry of that one could commit after
    /// this one and take the member out behind our back. The tick tries
    /// again.
    pub(super) fn propose_joining(&mut self, node: NodeId) {
        let outdating = self
            .proposals
            .values()
            .any(|(p, _)| *p == Proposal::MarkOutdated { node });
        let Some(member) = self.members.get(&node) else {
            return;
        };
        if outdating
            || member.joining_proposal.is_some()
            || !member.is_up()
            || !matches!(member.sync, Sync::Joining { flush: None })
        {
            return;
        }
        let id = self.id();
        self.members
            .get_mut(&node)
            .expect("checked")
            .joining_proposal = Some(id);
        self.propose(id, Proposal::MarkInSync { node });
    }

    pub(super) fn propose(&mut self, id: u64, proposal: Proposal) {
        self.proposals.insert(id, (proposal.clone(), self.now_ms));
        self.actions.push(Action::Propose { id, proposal });
    }

    /// An up-to-date member is gone: ask the control plane to outdate it.
    pub(super) fn start_outdating(&mut self, node: NodeId) {
        let Some(member) = self.members.get(&node) else {
            return;
        };
        if member.outdating.is_some() {
            return;
        }
        let id = self.id();
        self.members.get_mut(&node).expect("checked").outdating = Some(id);
        self.set_local_readable_from_state();
        self.propose(id, Proposal::MarkOutdated { node });
    }

    /// Whether `node`, the last up-to-date member, is linked again after the
    /// control plane refused to outdate it; then it stays in the set.
    pub(super) fn keep_if_back(&mut self, node: NodeId) -> bool {
        let Some(member) = self.members.get_mut(&node) else {
            return false;
        };
        if !(matches!(member.sync, Sync::InSync) && member.outdate_refused && member.is_up()) {
            return false;
        }
        member.outdate_refused = false;
        let others_in_set = self.members.iter().any(|(&n, m)| {
            n != node
                && m.kind == Kind::Diskful
                && matches!(m.sync, Sync::InSync)
                && m.outdating.is_none()
                && !m.damaged
        });
        if others_in_set {
            // Another member joined meanwhile: the retried outdating
            // commits now.
            return false;
        }
        let member = self.members.get_mut(&node).expect("checked");
        if let Some(id) = member.outdating.take() {
            self.proposals.remove(&id);
        }
        let intact = member.intact;
        if let Phase::Reconciling { welcomes, .. } = &mut self.phase {
            // Nothing was written yet: its welcome counts like any other.
            welcomes.insert(node, (intact, RegionSet::new()));
            self.set_local_readable_from_state();
            return false;
        }
        self.keep_last_member(node, intact);
        self.set_local_readable_from_state();
        true
    }

    /// The control plane refused to outdate `node`, the last up-to-date
    /// member, and it is back: it stays in the set, and its copy is the
    /// truth. Writes it did not acknowledge fail (other members may hold
    /// them, it may not), and every other member copies from it the regions
    /// it may hold differently: those it lost on the link, or every region
    /// when it restarted (it may have lost any unflushed write).
    pub(super) fn keep_last_member(&mut self, node: NodeId, intact: bool) {
        let member = self.members.get_mut(&node).expect("a member");
        let mut regions = std::mem::take(&mut member.lost);
        if intact {
            // What it had not flushed when its link dropped is still
            // unflushed there.
            member.unflushed.union_with(&regions);
        } else {
            regions = RegionSet::all(self.size_bytes);
        }
        if matches!(self.phase, Phase::Copying { .. }) {
            regions.union_with(&self.copying);
        }
        member.full_resync = false;
        member.damaged = false;
        let failed: Vec<u64> = self
            .writes
            .iter()
            .filter(|(_, w)| w.needed.contains(&node) && !w.acked.contains(&node))
            .map(|(&seq, _)| seq)
            .collect();
        for seq in failed {
            let write = self.writes.remove(&seq).expect("listed");
            self.abandon(seq, &write.acked);
            regions.add_range(write.range.0, write.range.1);
            self.end_write(
                &write.purpose,
                &write.acked,
                Err(ClientError::Io(
                    "the last up-to-date replica lost the write with its link".into(),
                )),
            );
        }
        let others: Vec<NodeId> = self
            .members
            .iter()
            .filter(|(&n, m)| n != node && m.kind == Kind::Diskful)
            .map(|(&n, _)| n)
            .collect();
        for other in others {
            if matches!(self.members[&other].sync, Sync::Joining { .. }) {
                // Copied already, but not from what is now the truth.
                self.actions.push(Action::Reset { to: other });
                self.lose_link(other);
            }
            let member = self.members.get_mut(&other).expect("listed");
            match &mut member.sync {
                Sync::InSync | Sync::Joining { .. } => member.lost.union_with(&regions),
                Sync::Outdated { backlog } | Sync::Resyncing { backlog, .. } => {
                    backlog.add_set(&regions);
                    self.persist_map(other);
                }
            }
        }
    }

    /// The dirty map of an outdated or resyncing member: what it may lack.
    /// A resyncing member's map keeps the regions being copied (until the
    /// copy is acknowledged) and those written meanwhile.
    pub(super) fn map_of(member: &Member, since: Generation) -> Option<DirtyMap> {
        match &member.sync {
            Sync::Outdated { backlog } => Some(backlog.to_map(since)),
            Sync::Resyncing {
                backlog,
                writes,
                reads,
                ..
            } => {
                let mut map = backlog.to_map(since);
                map.regions.union_with(&member.written_during_sync);
                for piece in writes.values() {
                    map.regions.insert(piece.region);
                }
                for &(region, _) in reads.values() {
                    map.regions.insert(region);
                }
                Some(map)
            }
            _ => None,
        }
    }

    /// Persists the dirty map of an outdated or resyncing member; returns
    /// the token `persisted` will confirm.
    pub(super) fn persist_map(&mut self, node: NodeId) -> u64 {
        let Some(map) = Self::map_of(&self.members[&node], self.view.generation) else {
            return 0;
        };
        self.push_persist(node, map)
    }

    /// Asks for `map` to be persisted as `node`'s dirty map; returns the
    /// token `persisted` will confirm, also kept as the member's
    /// `map_token`.
    pub(super) fn push_persist(&mut self, node: NodeId, map: DirtyMap) -> u64 {
        let token = self.persist_next;
        self.persist_next += 1;
        if let Some(member) = self.members.get_mut(&node) {
            member.map_token = token;
        }
        self.actions.push(Action::PersistDirty {
            token,
            peer: node,
            map,
        });
        token
    }

    /// The control plane took `node` out of the set.
    pub(super) fn become_outdated(&mut self, node: NodeId) {
        let since = self.view.generation;
        let member = self.members.get_mut(&node).expect("checked");
        member.outdating = None;
        member.outdate_refused = false;
        member.damaged = false;
        let mut backlog = if member.full_resync {
            Backlog::full()
        } else {
            Backlog::default()
        };
        backlog.add_set(&member.lost);
        if matches!(self.phase, Phase::Copying { .. }) {
            backlog.add_set(&self.copying);
        }
        member.lost.clear();
        for &(offset, length, _, _) in member.unacked.values() {
            for region in regions_of(offset, length) {
                backlog.add(region);
            }
        }
        backlog.add_set(&member.unflushed);
        for (_, regions) in &member.flushing {
            backlog.add_set(regions);
        }
        let was_up = member.is_up();
        if was_up {
            // Still linked (outdated for a disk error or a timeout): it
            // reconnects and resyncs.
            self.actions.push(Action::Reset { to: node });
            member.link = Link::Down;
        }
        member.unacked.clear();
        member.unacked_bytes = 0;
        member.unflushed.clear();
        member.flushing.clear();
        member.map_since = Some(since);
        let map = backlog.to_map(since);
        member.sync = Sync::Outdated { backlog };
        if was_up {
            // As when a link drops (`lose_link`, which the link already
            // marked down here skips): the answers the reset link never
            // brings must not hold back `settled` and snapshots.
            self.stop_waiting_for(node);
        }
        let token = self.push_persist(node, map);
        // Writes that waited for it may complete now, but only once its
        // map is durable.
        for write in self.writes.values_mut() {
            if write.needed.contains(&node) && !write.acked.contains(&node) {
                write.persist_token = write.persist_token.max(token);
            }
        }
        self.completion.all = true;
        self.set_local_readable_from_state();
    }

    /// Failed writes `node` had not answered: its copy of their regions is
    /// in its backlog now, or another primary's business (it resyncs them,
    /// or they are reported unsettled by it).
    fn stop_waiting_for(&mut self, node: NodeId) {
        self.failed_in_flight.retain(|_, waiting| {
            waiting.remove(&node);
            !waiting.is_empty()
        });
    }

    pub(super) fn lose_link(&mut self, node: NodeId) {
        if self
            .members
            .get(&node)
            .is_none_or(|member| matches!(member.link, Link::Down))
        {
            return;
        }
        // What it acknowledged of the writes still pending is not flushed
        // there and may be lost with the link (its node may have crashed):
        // those acknowledgements no longer count.
        for write in self.writes.values_mut() {
            write.acked.remove(&node);
        }
        self.completion.all = true;
        self.stop_waiting_for(node);
        let member = self.members.get_mut(&node).expect("checked");
        member.link = Link::Down;
        let unacked = std::mem::take(&mut member.unacked);
        member.unacked_bytes = 0;
        let mut lost = RegionSet::new();
        for &(offset, length, _, _) in unacked.values() {
            lost.add_range(offset, length);
        }
        lost.union_with(&member.unflushed);
        for (_, regions) in &member.flushing {
            lost.union_with(regions);
        }
        member.unflushed.clear();
        member.flushing.clear();
        // `tracked` stays as it was: what it may hold unflushed moves with
        // `lost` into its `lost` set or its backlog below, so a restart
        // that loses those writes loses nothing its resync does not copy.
        let kind = member.kind;
        let joining_proposed = member.joining_proposal.is_some();
        let mut outdate = false;
        let mut joining_dropped = false;
        // Its backlog took regions its durable map may not name (copies
        // acknowledged but not flushed, writes it had not acknowledged).
        let mut map_grew = false;
        let mut retry_reads = Vec::new();
        match &mut member.sync {
            _ if kind == Kind::Tiebreaker => {}
            Sync::InSync => {
                member.lost.union_with(&lost);
                outdate = true;
            }
            Sync::Joining { .. } if joining_proposed => {
                // The control plane may be adding it right now; until we
                // know, it counts as up to date and lost.
                member.lost.union_with(&lost);
            }
            Sync::Joining { .. } => {
                let mut backlog = if member.full_resync {
                    Backlog::full()
                } else {
                    Backlog::default()
                };
                backlog.add_set(&lost);
                member.sync = Sync::Outdated { backlog };
                member.damaged = false;
                joining_dropped = true;
            }
            Sync::Resyncing {
                backlog,
                writes,
                reads,
                ..
            } => {
                let mut backlog = std::mem::take(backlog);
                backlog.add_set(&lost);
                for piece in writes.values() {
                    backlog.add(piece.region);
                }
                for (_, (region, _)) in std::mem::take(reads) {
                    self.resync_locks.remove(&region);
                    backlog.add(region);
                }
                member.sync = Sync::Outdated { backlog };
                map_grew = true;
            }
            Sync::Outdated { backlog } => {
                let before = backlog.len(u64::MAX);
                backlog.add_set(&lost);
                map_grew = backlog.len(u64::MAX) != before;
            }
        }
        // Reads that were waiting on it go elsewhere.
        for (&id, read) in &self.reads {
            if read.source == node {
                retry_reads.push(id);
            }
        }
        for id in retry_reads {
            let mut read = self.reads.remove(&id).expect("listed");
            let next = self
                .readable_members()
                .into_iter()
                .find(|n| *n != node && !read.bad.contains(n));
            match next {
                Some(next) => {
                    read.source = next;
                    self.send_read(id, read);
                }
                None => {
                    if let Some(op) = read.op {
                        self.actions.push(Action::Complete {
                            op,
                            result: Err(ClientError::Io(
                                "no up-to-date replica is reachable".into(),
                            )),
                        });
                    } else {
                        // A reconcile copy: serving waits for it, and it
                        // waits for a source.
                        self.stalled_reads.push((id, read));
                    }
                }
            }
        }
        // Resync reads that were waiting on it go back to their backlogs.
        for member in self.members.values_mut() {
            if let Sync::Resyncing { reads, backlog, .. } = &mut member.sync {
                let gone: Vec<u64> = reads
                    .iter()
                    .filter(|(_, (_, source))| *source == node)
                    .map(|(&id, _)| id)
                    .collect();
                for id in gone {
                    let (region, _) = reads.remove(&id).expect("listed");
                    self.resync_locks.remove(&region);
                    backlog.add(region);
                }
            }
        }
        if outdate {
            self.start_outdating(node);
        }
        if joining_dropped {
            // Writes waited for it; they complete without it once its map
            // names what it lacks.
            let token = self.persist_map(node);
            for write in self.writes.values_mut() {
                if write.needed.contains(&node) {
                    write.persist_token = write.persist_token.max(token);
                }
            }
            self.completion.all = true;
        } else if map_grew {
            // Persisted now, not at its next write: an engine that stops
            // before then would hand its successor a map without them
            // (seed 1008685). Writes it had not acknowledged complete only
            // once the map naming their regions is durable.
            let token = self.persist_map(node);
            for write in self.writes.values_mut() {
                if !write.acked.contains(&node) {
                    write.persist_token = write.persist_token.max(token);
                }
            }
            self.completion.all = true;
        }
        if let Phase::Reconciling { welcomes, .. } = &mut self.phase {
            welcomes.remove(&node);
        }
        self.verify_member_lost(node);
        self.set_local_readable_from_state();
    }

    /// A member behind by more than the link caps is dropped and resynced
    /// later, never buffered for without limit.
    pub(super) fn drop_laggards(&mut self) {
        let laggards: Vec<NodeId> = self
            .members
            .iter()
            .filter(|(_, m)| {
                m.unacked.len() > MAX_INFLIGHT_PER_LINK
                    || m.unacked_bytes > MAX_INFLIGHT_BYTES_PER_LINK
            })
            .map(|(&n, _)| n)
            .collect();
        for node in laggards {
            self.actions.push(Action::Reset { to: node });
            self.lose_link(node);
        }
    }
}
