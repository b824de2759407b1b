//! Client I/O: queued requests in order, writes to every member,
//! quorum and completion, reads with failover and repair.

use super::*;

impl Primary {
    pub(super) fn on_ack(&mut self, from: NodeId, seq: u64, result: Result<(), ReplicaError>) {
        let mut applied_failed_write = false;
        if let Some(waiting) = self.failed_in_flight.get_mut(&seq) {
            waiting.remove(&from);
            if waiting.is_empty() {
                self.failed_in_flight.remove(&seq);
            }
            if result.is_ok() {
                // It applied a write that failed.
                self.pin_unsettled(seq);
                applied_failed_write = true;
            }
        }
        let member = self.members.get_mut(&from).expect("checked");
        if let Some((_, _, sent_ms, bytes)) = member.unacked.remove(&seq) {
            member.unacked_bytes -= bytes;
            member
                .ack_latency
                .record(self.now_ms.saturating_sub(sent_ms));
        }
        // A flush makes what was sent before it durable (and every earlier
        // flush's regions with it). Only its own acknowledgement says so:
        // a write sent after it may complete first.
        if result.is_ok() && member.flushing.iter().any(|(flush, _)| *flush == seq) {
            member.flushing.retain(|(flush, _)| *flush > seq);
            if seq > member.welcomed_at {
                member.tracked = true;
            }
        }
        let mut resync_piece = None;
        let mut joined = false;
        match &mut member.sync {
            Sync::Resyncing { writes, .. } => resync_piece = writes.remove(&seq),
            Sync::Joining { flush } if *flush == Some(seq) && result.is_ok() => {
                joined = true;
            }
            _ => {}
        }
        if let Some(piece) = resync_piece {
            self.on_resync_ack(from, piece, result.is_ok());
            return;
        }
        if joined {
            if let Some(member) = self.members.get_mut(&from) {
                member.sync = Sync::Joining { flush: None };
            }
            self.propose_joining(from);
            return;
        }
        if let Some(write) = self.writes.get_mut(&seq) {
            self.completion.touch(seq);
            match result {
                Ok(()) => {
                    write.acked.insert(from);
                    // Members that failed it when nobody else had it yet
                    // are out of date now that someone has.
                    let failed: Vec<NodeId> = write.errors.iter().map(|(n, _)| *n).collect();
                    for node in failed {
                        if self.members.get(&node).is_some_and(|m| m.is_up()) {
                            self.actions.push(Action::Reset { to: node });
                            self.lose_link(node);
                        }
                    }
                }
                Err(error) => {
                    write.errors.push((from, error.clone()));
                    // A copy (reconciliation, repair, the flush that ends
                    // reconciliation) comes from a source that holds it: a
                    // member that cannot apply it differs from the source.
                    let copied = matches!(write.purpose, Purpose::Internal | Purpose::Repair);
                    // A full pool is an answer, not a fault, when every
                    // member gives it: judge it only once someone applied
                    // the write (the acknowledgement then resets the full
                    // ones), never while the others may still say the
                    // same.
                    let still_answering = !matches!(error, ReplicaError::NoSpace(_))
                        && write
                            .needed
                            .iter()
                            .any(|n| *n != from && !write.errors.iter().any(|(e, _)| e == n));
                    let others_have_it = copied || !write.acked.is_empty() || still_answering;
                    // A member that could not apply what the others did is
                    // out of date; if none could, the request fails as a
                    // whole and they all stay alike.
                    if others_have_it {
                        self.actions.push(Action::Reset { to: from });
                        self.lose_link(from);
                    }
                }
            }
        } else if result.is_err() || applied_failed_write {
            // The request was abandoned (the write failed as a whole) but
            // this member applied it, or may have applied part of it: it
            // now differs from the source, and must not count as in sync
            // (a joining member would be marked so at its next flush):
            // reconnecting reconciles the write's regions, which stay
            // unsettled.
            self.actions.push(Action::Reset { to: from });
            self.lose_link(from);
        }
    }

    pub(super) fn on_read_reply(
        &mut self,
        from: NodeId,
        id: u64,
        result: Result<ReadData, ReplicaError>,
    ) {
        let member = self.members.get_mut(&from).expect("checked");
        if let Some((_, _, _, bytes)) = member.unacked.remove(&id) {
            member.unacked_bytes -= bytes;
        }
        if self.on_verify_read(id, &result) {
            return;
        }
        // A resync source read?
        let mut target = None;
        for (&node, m) in &self.members {
            if let Sync::Resyncing { reads, .. } = &m.sync {
                if reads.contains_key(&id) {
                    target = Some(node);
                }
            }
        }
        if let Some(target) = target {
            self.on_resync_read(target, id, result);
            return;
        }
        let Some(mut read) = self.reads.remove(&id) else {
            return;
        };
        match result {
            Ok(data) => {
                if let Some(op) = read.op {
                    self.actions.push(Action::Complete {
                        op,
                        result: Ok(Completion::Read(data.clone())),
                    });
                } else {
                    // A reconcile copy: the source's version goes to the
                    // others.
                    self.reconcile_copy(read.offset, read.length, data, from);
                    return;
                }
                if !read.bad.is_empty() {
                    self.repair(
                        read.offset,
                        read.length,
                        data,
                        std::mem::take(&mut read.bad),
                    );
                }
            }
            Err(error) => {
                match &error {
                    ReplicaError::Checksum(_) => read.bad.push(from),
                    _ => {
                        self.actions.push(Action::Reset { to: from });
                        self.lose_link(from);
                    }
                }
                self.counters.read_failovers += 1;
                let tried: BTreeSet<NodeId> = read
                    .bad
                    .iter()
                    .copied()
                    .chain([from, read.source])
                    .collect();
                let next = self
                    .readable_members()
                    .into_iter()
                    .find(|node| !tried.contains(node));
                match next {
                    Some(next) => {
                        read.source = next;
                        self.send_read(id, read);
                    }
                    None => {
                        if let Some(op) = read.op {
                            self.actions.push(Action::Complete {
                                op,
                                result: Err(ClientError::Io(format!(
                                    "no up-to-date replica could serve the read; the last said: {error}"
                                ))),
                            });
                        } else if read.length > BLOCK_BYTES
                            && matches!(error, ReplicaError::Checksum(_))
                            && !self.readable_members().is_empty()
                        {
                            // Every source has a bad block in the range, but
                            // perhaps not the same one: copy block by block.
                            let blocks = read.length.div_ceil(BLOCK_BYTES);
                            if let Phase::Copying { remaining } = &mut self.phase {
                                *remaining += blocks as usize - 1;
                            }
                            for index in 0..blocks {
                                let offset = read.offset + index * BLOCK_BYTES;
                                let length = BLOCK_BYTES.min(read.offset + read.length - offset);
                                let id = self.id();
                                let source = self.resync_sources()[0];
                                self.send_read(
                                    id,
                                    PendingRead {
                                        op: None,
                                        offset,
                                        length,
                                        source,
                                        bad: Vec::new(),
                                    },
                                );
                            }
                        } else if let Phase::Copying { remaining } = &mut self.phase {
                            // Nothing to copy from (a block bad on every
                            // source, or no source left): the range stays as
                            // each member has it.
                            *remaining -= 1;
                            self.maybe_serve();
                        }
                    }
                }
            }
        }
    }

    /// Writes the good data over the copies that failed their checksum.
    /// One write for all the bad copies: writes in flight never overlap.
    pub(super) fn repair(&mut self, offset: u64, length: u64, data: ReadData, bad: Vec<NodeId>) {
        if self.overlaps_active(offset, length) {
            // A newer write is on its way there; the next read repairs.
            return;
        }
        let payload = match data {
            ReadData::Data(bytes) => Payload::data(bytes),
            ReadData::Zeroes => Payload::Zeroes {
                length,
                trim: false,
            },
        };
        let targets: BTreeSet<NodeId> = bad
            .into_iter()
            .filter(|node| self.members.get(node).is_some_and(|m| m.takes_writes()))
            .collect();
        if targets.is_empty() {
            return;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        for &node in &targets {
            self.send_write(node, seq, offset, &payload, true);
            self.counters.repaired_blocks += length / 4096;
            self.counters.read_repaired_blocks += length / 4096;
        }
        self.writes.insert(
            seq,
            PendingWrite {
                purpose: Purpose::Repair,
                range: (offset, length),
                flush: false,
                payload: Some((payload, true)),
                needed: targets,
                acked: BTreeSet::new(),
                errors: Vec::new(),
                persist_token: 0,
                started_ms: self.now_ms,
            },
        );
    }

    pub(super) fn start_queued(&mut self) {
        let mut index = 0;
        while index < self.queue.len() {
            if self.writes.len() >= MAX_PENDING_WRITES {
                break;
            }
            let (op, request) = &self.queue[index];
            // A snapshot waits for the writes in flight: new ones wait
            // for it (reads go on).
            if self.quiescing() && !matches!(request, ClientRequest::Read { .. }) {
                index += 1;
                continue;
            }
            // A read waits for a lease that covers its arrival.
            if matches!(request, ClientRequest::Read { .. }) && !self.read_may_start(*op) {
                index += 1;
                continue;
            }
            let range = match request {
                ClientRequest::Read { offset, length } => (*offset, *length),
                ClientRequest::Write {
                    offset, payload, ..
                } => (*offset, payload.length()),
                ClientRequest::Flush => (0, 0),
            };
            // In order: a request waits behind earlier ones it overlaps.
            let blocked_by_earlier = self.queue.iter().take(index).any(|(_, earlier)| {
                let other = match earlier {
                    ClientRequest::Read { offset, length } => (*offset, *length),
                    ClientRequest::Write {
                        offset, payload, ..
                    } => (*offset, payload.length()),
                    ClientRequest::Flush => (0, 0),
                };
                other.1 > 0
                    && range.1 > 0
                    && other.0 < range.0 + range.1
                    && range.0 < other.0 + other.1
                    && (matches!(earlier, ClientRequest::Write { .. })
                        || matches!(self.queue[index].1, ClientRequest::Write { .. }))
            });
            let is_write = matches!(request, ClientRequest::Write { .. });
            let blocked =
                blocked_by_earlier || (is_write && self.overlaps_active(range.0, range.1));
            if blocked {
                index += 1;
                continue;
            }
            let (op, request) = self.queue.remove(index).expect("in range");
            match request {
                ClientRequest::Read { offset, length } => self.start_read(op, offset, length),
                ClientRequest::Write {
                    offset,
                    payload,
                    fua,
                } => self.start_write(Purpose::Client(op), offset, payload, fua),
                ClientRequest::Flush => self.start_flush(op),
            }
        }
    }

    pub(super) fn start_read(&mut self, op: OpId, offset: u64, length: u64) {
        let readable = self.readable_members();
        let source = if readable.contains(&self.me) {
            Some(self.me)
        } else {
            readable.first().copied()
        };
        let Some(source) = source else {
            self.actions.push(Action::Complete {
                op,
                result: Err(ClientError::Io(
                    "no up-to-date replica of the volume is reachable".into(),
                )),
            });
            return;
        };
        let id = self.id();
        self.send_read(
            id,
            PendingRead {
                op: Some(op),
                offset,
                length,
                source,
                bad: Vec::new(),
            },
        );
    }

    pub(super) fn send_read(&mut self, id: u64, read: PendingRead) {
        let now = self.now_ms;
        let member = self.members.get_mut(&read.source).expect("a member");
        member.unacked.insert(id, (read.offset, 0, now, 0));
        self.actions.push(Action::Send {
            to: read.source,
            message: ToReplica::Read {
                id,
                offset: read.offset,
                length: read.length,
            },
        });
        self.reads.insert(id, read);
    }

    /// Writes below this completed on every replica that had to hold them:
    /// neither pending, nor failed while some replica may still apply them.
    pub(super) fn settled(&self) -> u64 {
        let pending = self.writes.keys().next().copied().unwrap_or(self.next_seq);
        let failed = self.failed_in_flight.keys().next().copied();
        [Some(pending), failed, self.unsettled_floor]
            .into_iter()
            .flatten()
            .min()
            .expect("pending")
    }

    /// A write ended without completing everywhere (it failed, or it
    /// expired). Members that applied it hold what others may not: for
    /// them it stays unsettled as long as this engine runs, so that the next
    /// primary reconciles its regions. Members it is still in flight to may
    /// apply it too: it stays unsettled until they answer.
    pub(super) fn abandon(&mut self, seq: u64, acked: &BTreeSet<NodeId>) {
        if !acked.is_empty() {
            self.pin_unsettled(seq);
        }
        let waiting: BTreeSet<NodeId> = self
            .members
            .iter()
            .filter(|(_, m)| m.unacked.contains_key(&seq))
            .map(|(&n, _)| n)
            .collect();
        if !waiting.is_empty() {
            self.failed_in_flight.insert(seq, waiting);
        }
    }

    pub(super) fn pin_unsettled(&mut self, seq: u64) {
        self.unsettled_floor = Some(self.unsettled_floor.map_or(seq, |floor| floor.min(seq)));
    }

    pub(super) fn send_write(
        &mut self,
        node: NodeId,
        seq: u64,
        offset: u64,
        payload: &Payload,
        fua: bool,
    ) {
        let settled = self.settled().min(seq);
        // The settled mark never passes a write still unacknowledged.
        assert!(
            self.writes
                .keys()
                .next()
                .is_none_or(|&pending| settled <= pending),
            "the settled mark {settled} passes pending write {:?}",
            self.writes.keys().next()
        );
        let now = self.now_ms;
        let member = self.members.get_mut(&node).expect("a member");
        let bytes = match payload {
            Payload::Data(data) => data.len() as u64,
            Payload::Zeroes { .. } => 0,
        };
        member
            .unacked
            .insert(seq, (offset, payload.length(), now, bytes));
        member.unacked_bytes += bytes;
        member.unflushed.add_range(offset, payload.length());
        if let (Some(regions), Payload::Data(_)) = (&mut self.data_regions, payload) {
            regions.add_range(offset, payload.length());
        }
        self.actions.push(Action::Send {
            to: node,
            message: ToReplica::Write {
                seq,
                offset,
                payload: payload.clone(),
                fua,
                settled,
            },
        });
    }

    pub(super) fn start_write(
        &mut self,
        purpose: Purpose,
        offset: u64,
        payload: Payload,
        fua: bool,
    ) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let length = payload.length();
        let mut needed = BTreeSet::new();
        let mut persist = Vec::new();
        let nodes: Vec<NodeId> = self.members.keys().copied().collect();
        for node in nodes {
            let member = &self.members[&node];
            if member.kind != Kind::Diskful {
                continue;
            }
            if member.is_needed() {
                needed.insert(node);
            }
            if member.takes_writes() {
                self.send_write(node, seq, offset, &payload, fua);
            }
            let member = self.members.get_mut(&node).expect("listed");
            let since = self.view.generation;
            let up = member.takes_writes();
            match &mut member.sync {
                Sync::InSync | Sync::Joining { .. } if !up => {
                    member.lost.add_range(offset, length);
                }
                Sync::InSync | Sync::Joining { .. } => {}
                Sync::Outdated { backlog } => {
                    let before = backlog.len(u64::MAX);
                    for region in regions_of(offset, length) {
                        backlog.add(region);
                    }
                    if backlog.len(u64::MAX) != before {
                        persist.push((node, backlog.to_map(since)));
                    }
                }
                Sync::Resyncing { .. } => {
                    // It gets the write on its link, but the persisted map
                    // must still name the region should we crash before
                    // it is in the set.
                    let mut added = false;
                    for region in regions_of(offset, length) {
                        added |= member.written_during_sync.insert(region);
                    }
                    if added {
                        let map = Self::map_of(member, since).expect("resyncing");
                        persist.push((node, map));
                    }
                }
            }
        }
        for (peer, map) in persist {
            self.push_persist(peer, map);
        }
        // A member that lacks the write must have it named in its durable
        // map first: wait for the newest persist of the map of each member
        // outside the set, whether this write added to it or an earlier
        // change did (a dropped link's regions, say) whose persist may not
        // be done yet.
        let persist_token = self
            .members
            .values()
            .filter(|m| {
                m.kind == Kind::Diskful
                    && matches!(m.sync, Sync::Outdated { .. } | Sync::Resyncing { .. })
            })
            .map(|m| m.map_token)
            .max()
            .unwrap_or(0);
        self.writes.insert(
            seq,
            PendingWrite {
                purpose,
                range: (offset, length),
                flush: false,
                payload: Some((payload, fua)),
                needed,
                acked: BTreeSet::new(),
                errors: Vec::new(),
                persist_token,
                started_ms: self.now_ms,
            },
        );
        self.drop_laggards();
    }

    pub(super) fn start_flush(&mut self, op: OpId) {
        let seq = self.id();
        self.send_flush(seq, Purpose::Client(op));
    }

    pub(super) fn send_flush(&mut self, seq: u64, purpose: Purpose) {
        let mut needed = BTreeSet::new();
        let nodes: Vec<NodeId> = self.members.keys().copied().collect();
        for node in nodes {
            let member = self.members.get_mut(&node).expect("listed");
            if member.kind != Kind::Diskful {
                continue;
            }
            if member.is_needed() {
                needed.insert(node);
            }
            if member.takes_writes() && member.holds_everything() {
                let regions = std::mem::take(&mut member.unflushed);
                member.flushing.push((seq, regions));
                member.unacked.insert(seq, (0, 0, self.now_ms, 0));
                self.actions.push(Action::Send {
                    to: node,
                    message: ToReplica::Flush { seq },
                });
            }
        }
        self.writes.insert(
            seq,
            PendingWrite {
                purpose,
                range: (0, 0),
                flush: true,
                payload: None,
                needed,
                acked: BTreeSet::new(),
                errors: Vec::new(),
                persist_token: 0,
                started_ms: self.now_ms,
            },
        );
    }

    pub(super) fn has_quorum(&self, acked: &BTreeSet<NodeId>) -> bool {
        let votes = acked
            .iter()
            .filter(|n| self.view.diskful.contains(n))
            .count()
            + self
                .members
                .iter()
                .filter(|(_, m)| m.kind == Kind::Tiebreaker && m.is_up())
                .count();
        votes >= self.view.quorum_size()
    }

    /// `persisted_through` and each member's state (needed, up), packed:
    /// what a write's verdict depends on outside the write and the view
    /// (which `view` marks by itself). `None` with more members than the
    /// bits hold: then every pass judges every write.
    fn completion_inputs(&self) -> Option<(u64, u128)> {
        if self.members.len() > 64 {
            return None;
        }
        let states = self
            .members
            .values()
            .enumerate()
            .fold(0u128, |bits, (index, member)| {
                let state = u128::from(member.is_needed()) | u128::from(member.is_up()) << 1;
                bits | state << (2 * index)
            });
        Some((self.persisted_through, states))
    }

    /// Whether `write` may complete now: its persist token is durable, no
    /// member it needs still owes an answer, members that failed it are
    /// out of the set, and a quorum holds it.
    fn write_done(&self, write: &PendingWrite) -> bool {
        if write.persist_token > self.persisted_through {
            return false;
        }
        #[cfg(feature = "bug-switches")]
        if self.bugs.ack_before_quorum
            && !write.acked.is_empty()
            && matches!(write.purpose, Purpose::Client(_))
        {
            return true;
        }
        let waiting = write.needed.iter().any(|node| {
            !write.acked.contains(node)
                && !write.errors.iter().any(|(n, _)| n == node)
                && self.members.get(node).is_some_and(|m| m.is_needed())
        });
        if waiting {
            return false;
        }
        // Members that failed it must be out of the set first, unless
        // nobody applied it.
        let failed_still_listed = write
            .errors
            .iter()
            .any(|(node, _)| self.members.get(node).is_some_and(|m| m.is_needed()));
        let internal = matches!(write.purpose, Purpose::Repair | Purpose::Internal);
        // A copy always has a holder (its source): members that failed
        // it must leave the set before it counts as done.
        let nobody_applied = !internal && write.acked.is_empty() && !write.errors.is_empty();
        if failed_still_listed && !nobody_applied {
            return false;
        }
        internal || nobody_applied || self.has_quorum(&write.acked)
    }

    /// Completes the writes that may complete, judging only those whose
    /// verdict may have changed since the last pass (`CompletionScan`).
    pub(super) fn complete_writes(&mut self) {
        let inputs = self.completion_inputs();
        let mut scan = std::mem::take(&mut self.completion);
        let every_write = scan.all || inputs.is_none() || scan.seen != inputs;
        #[cfg(feature = "bug-switches")]
        let every_write = every_write || self.bugs.ack_before_quorum;
        let mut done = Vec::new();
        if every_write {
            done.extend(
                self.writes
                    .iter()
                    .filter(|(_, write)| self.write_done(write))
                    .map(|(&seq, _)| seq),
            );
        } else {
            let new_from = scan.new_from;
            let touched = &mut scan.touched;
            touched.retain(|&seq| seq < new_from);
            touched.sort_unstable();
            touched.dedup();
            let new = self.writes.range(new_from..).map(|(&seq, _)| seq);
            for seq in touched.iter().copied().chain(new) {
                if self
                    .writes
                    .get(&seq)
                    .is_some_and(|write| self.write_done(write))
                {
                    done.push(seq);
                }
            }
            // The simulator checks that judging only these missed none.
            if self.thorough_checks {
                for (seq, write) in &self.writes {
                    assert!(
                        done.contains(seq) || !self.write_done(write),
                        "write {seq} may complete but was not judged (completion inputs {inputs:?})"
                    );
                }
            }
        }
        // What happens from here on (new writes, acknowledgements, changed
        // members) is judged at the next pass.
        scan.touched.clear();
        self.completion = CompletionScan {
            all: false,
            seen: inputs,
            touched: scan.touched,
            new_from: self.next_seq,
        };
        for seq in done {
            let write = self.writes.remove(&seq).expect("listed");
            if write.acked.is_empty() && !write.errors.is_empty() {
                self.abandon(seq, &write.acked);
                self.copy_again(write.range);
            }
            let result = if write.acked.is_empty() && !write.errors.is_empty() {
                // ENOSPC only when every member that answered was full: a
                // device error anywhere is the client's EIO.
                let device_error = write
                    .errors
                    .iter()
                    .find(|(_, error)| !matches!(error, ReplicaError::NoSpace(_)));
                Err(match (device_error, &write.errors[0].1) {
                    (None, ReplicaError::NoSpace(message)) => ClientError::NoSpace(message.clone()),
                    (Some((_, other)), _) | (None, other) => ClientError::Io(other.to_string()),
                })
            } else {
                Ok(())
            };
            // The rule the engine exists for: a write completes only with
            // its quorum (copies and repairs have their source as holder).
            let internal = matches!(write.purpose, Purpose::Repair | Purpose::Internal);
            assert!(
                result.is_err() || internal || self.has_quorum(&write.acked),
                "write {seq} completes with acknowledgements of {:?} only: no quorum",
                write.acked
            );
            self.end_write(&write.purpose, &write.acked, result);
        }
        self.maybe_serve();
    }
}
