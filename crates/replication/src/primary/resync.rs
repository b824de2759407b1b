//! Resyncs: copying the regions an outdated member may lack from an
//! up-to-date source, paced by the rate limit, with progress reports.
//!
//! A thin copy stays thin: a region that reads as a hole travels as one
//! trim, and a region with data goes as its data pieces and trims for its
//! zero blocks, so the target allocates no more than the source holds
//! (and frees what it held there before). The rate limit and the progress
//! count the data that moves, not the volume's size.

use super::*;

/// Pieces one region's copy may go as: runs of 4 KiB blocks, or when the
/// data is scattered more finely, runs of [`COARSE_PIECE_BYTES`]. Bounds
/// the messages a resync has on a link (`RESYNC_WINDOW` regions).
const MAX_PIECES_PER_REGION: usize = 32;
/// The coarser grain: the store's allocation unit (its chunk), so a zero
/// piece of this size is space the target need not hold.
const COARSE_PIECE_BYTES: u64 = 64 << 10;

/// The pieces of a region's data, `(offset in the data, length, data?)`:
/// maximal runs of zero and non-zero blocks of `grain` bytes.
fn pieces(data: &[u8], grain: u64) -> Vec<(u64, u64, bool)> {
    let mut out: Vec<(u64, u64, bool)> = Vec::new();
    for (index, block) in data.chunks(grain as usize).enumerate() {
        let has_data = block.iter().any(|&byte| byte != 0);
        let at = index as u64 * grain;
        match out.last_mut() {
            Some((_, length, kind)) if *kind == has_data => *length += block.len() as u64,
            _ => out.push((at, block.len() as u64, has_data)),
        }
    }
    out
}

/// How a region's data is written to the target: its data runs, and its
/// zero runs as trims (never written as zero data).
fn sparse_pieces(data: &[u8]) -> Vec<(u64, u64, bool)> {
    let fine = pieces(data, BLOCK_BYTES);
    if fine.len() <= MAX_PIECES_PER_REGION {
        return fine;
    }
    let coarse = pieces(data, COARSE_PIECE_BYTES);
    debug_assert!(coarse.len() <= MAX_PIECES_PER_REGION);
    coarse
}

impl Primary {
    /// A write failed, yet members that were not waited for (resyncing)
    /// may have applied it: they copy its regions again.
    pub(super) fn copy_again(&mut self, (offset, length): (u64, u64)) {
        for member in self.members.values_mut() {
            if let Sync::Resyncing { backlog, .. } = &mut member.sync {
                for region in regions_of(offset, length) {
                    backlog.add(region);
                }
            }
        }
    }

    /// Where resyncs read from: ourselves first, then the other up-to-date
    /// members.
    pub(super) fn resync_sources(&self) -> Vec<NodeId> {
        let mut readable = self.readable_members();
        if let Some(at) = readable.iter().position(|&n| n == self.me) {
            readable.remove(at);
            readable.insert(0, self.me);
        }
        readable
    }

    pub(super) fn pump_resyncs(&mut self) {
        let sources = self.resync_sources();
        if sources.is_empty() {
            return;
        }
        let failed = &self.resync_failed;
        let source_for = |region: u64| {
            sources
                .iter()
                .copied()
                .find(|n| !failed.get(&region).is_some_and(|bad| bad.contains(n)))
        };
        let region_count = self.region_count();
        let nodes: Vec<NodeId> = self.members.keys().copied().collect();
        for node in nodes {
            loop {
                if self.resync_rate > 0 && self.resync_tokens < REGION_BYTES as f64 {
                    break;
                }
                let member = &self.members[&node];
                let Sync::Resyncing {
                    backlog,
                    writes,
                    reads,
                    ..
                } = &member.sync
                else {
                    break;
                };
                if !member.is_up() {
                    break;
                }
                if backlog.is_empty(region_count) && writes.is_empty() && reads.is_empty() {
                    // Copied: from now on its acknowledgements count; a
                    // flush makes the copy durable before it joins the set.
                    let seq = self.next_seq;
                    self.next_seq += 1;
                    let now = self.now_ms;
                    let member = self.members.get_mut(&node).expect("listed");
                    member.sync = Sync::Joining { flush: Some(seq) };
                    member.unacked.insert(seq, (0, 0, now, 0));
                    let regions = std::mem::take(&mut member.unflushed);
                    member.flushing.push((seq, regions));
                    self.actions.push(Action::Send {
                        to: node,
                        message: ToReplica::Flush { seq },
                    });
                    break;
                }
                let regions_writing: BTreeSet<u64> = writes.values().map(|p| p.region).collect();
                if regions_writing.len() + reads.len() >= RESYNC_WINDOW {
                    break;
                }
                let locks = &self.resync_locks;
                let active: Vec<(u64, u64)> = self.writes.values().map(|w| w.range).collect();
                let busy = |region: u64| {
                    let (offset, length) = region_range(region, self.size_bytes);
                    locks.contains(&region)
                        || active
                            .iter()
                            .any(|&(o, l)| l > 0 && o < offset + length && offset < o + l)
                        || source_for(region).is_none()
                };
                let member = self.members.get_mut(&node).expect("listed");
                let Sync::Resyncing { backlog, reads, .. } = &mut member.sync else {
                    break;
                };
                let Some(region) = backlog.pop(region_count, busy) else {
                    break;
                };
                let source = source_for(region).expect("not busy");
                let id = self.next_seq;
                self.next_seq += 1;
                reads.insert(id, (region, source));
                self.resync_locks.insert(region);
                if self.resync_rate > 0 {
                    self.resync_tokens -= REGION_BYTES as f64;
                }
                let (offset, length) = region_range(region, self.size_bytes);
                let now = self.now_ms;
                self.members
                    .get_mut(&source)
                    .expect("a member")
                    .unacked
                    .insert(id, (offset, 0, now, 0));
                self.actions.push(Action::Send {
                    to: source,
                    message: ToReplica::Read { id, offset, length },
                });
            }
        }
    }

    pub(super) fn on_resync_read(
        &mut self,
        target: NodeId,
        id: u64,
        result: Result<ReadData, ReplicaError>,
    ) {
        let member = self.members.get_mut(&target).expect("listed");
        let Sync::Resyncing { reads, backlog, .. } = &mut member.sync else {
            return;
        };
        let Some((region, source)) = reads.remove(&id) else {
            return;
        };
        self.resync_locks.remove(&region);
        let data = match result {
            Ok(data) => data,
            Err(error) => {
                // Try again from another source, or from this one after
                // the next tick.
                backlog.add(region);
                self.resync_failed.entry(region).or_default().insert(source);
                if matches!(error, ReplicaError::Checksum(_)) {
                    self.resync_corrupt
                        .entry(region)
                        .or_default()
                        .insert(source);
                }
                return;
            }
        };
        let (offset, length) = region_range(region, self.size_bytes);
        // Up-to-date sources that failed their checksum get this copy.
        if let Some(bad) = self.resync_corrupt.remove(&region) {
            let readable = self.readable_members();
            let bad: Vec<NodeId> = bad
                .into_iter()
                .filter(|n| *n != source && readable.contains(n))
                .collect();
            if !bad.is_empty() {
                self.repair(offset, length, data.clone(), bad);
            }
        }
        let writes: Vec<(u64, Payload, ResyncPiece)> = match data {
            ReadData::Zeroes => vec![(
                offset,
                Payload::Zeroes { length, trim: true },
                ResyncPiece {
                    region,
                    region_has_data: false,
                    data_bytes: 0,
                },
            )],
            ReadData::Data(bytes) => sparse_pieces(&bytes)
                .into_iter()
                .map(|(at, piece_length, has_data)| {
                    let range = at as usize..(at + piece_length) as usize;
                    let payload = if has_data {
                        Payload::data(&bytes[range])
                    } else {
                        Payload::Zeroes {
                            length: piece_length,
                            trim: true,
                        }
                    };
                    let piece = ResyncPiece {
                        region,
                        region_has_data: true,
                        data_bytes: if has_data { piece_length } else { 0 },
                    };
                    (offset + at, payload, piece)
                })
                .collect(),
        };
        // The rate limit was charged a whole region before the read; what
        // did not move (holes) goes back, so a thin volume's holes do not
        // slow its resync.
        if self.resync_rate > 0 {
            let moved: u64 = writes.iter().map(|(_, _, piece)| piece.data_bytes).sum();
            let cap = (RESYNC_WINDOW as u64 * REGION_BYTES).max(self.resync_rate / 4) as f64;
            self.resync_tokens =
                (self.resync_tokens + REGION_BYTES.saturating_sub(moved) as f64).min(cap);
        }
        for (at, payload, piece) in writes {
            let seq = self.id();
            let member = self.members.get_mut(&target).expect("listed");
            if let Sync::Resyncing { writes, .. } = &mut member.sync {
                writes.insert(seq, piece);
            }
            self.send_write(target, seq, at, &payload, false);
        }
    }

    /// A resync write was answered. A region is copied once all its
    /// pieces are; a failed piece sends the region back to the backlog.
    pub(super) fn on_resync_ack(&mut self, from: NodeId, piece: ResyncPiece, ok: bool) {
        if !ok {
            let member = self.members.get_mut(&from).expect("checked");
            if let Sync::Resyncing { backlog, .. } = &mut member.sync {
                backlog.add(piece.region);
            }
            self.actions.push(Action::Reset { to: from });
            self.lose_link(from);
            return;
        }
        self.counters.resynced_bytes += piece.data_bytes;
        let region_bytes = region_range(piece.region, self.size_bytes).1;
        let member = self.members.get_mut(&from).expect("checked");
        if let Sync::Resyncing { writes, done, .. } = &mut member.sync {
            let last = !writes.values().any(|p| p.region == piece.region);
            if last {
                self.counters.resynced_regions += 1;
            }
            if last && piece.region_has_data {
                *done += region_bytes;
            }
        }
    }

    /// A resync's progress: the regions with data copied, of those copied
    /// and still to copy. What is left counts the regions of the backlog
    /// that may hold data (all of them when that is not known) and those
    /// on their way.
    pub(super) fn resync_progress(&self, member: &Member, rate_bytes_per_sec: u64) -> SyncProgress {
        let Sync::Resyncing {
            backlog,
            done,
            writes,
            reads,
        } = &member.sync
        else {
            return SyncProgress {
                done_bytes: 0,
                total_bytes: 0,
                rate_bytes_per_sec,
            };
        };
        let region_count = self.region_count();
        let counts = |region: u64| {
            region < region_count
                && self
                    .data_regions
                    .as_ref()
                    .is_none_or(|data| data.contains(region))
        };
        let in_backlog = match (&self.data_regions, backlog.sweep) {
            (None, _) => backlog.len(region_count),
            (Some(data), sweep) => data
                .iter()
                .filter(|&region| {
                    region < region_count
                        && (sweep.is_some_and(|sweep| region >= sweep)
                            || backlog.set.contains(region))
                })
                .count() as u64,
        };
        let on_the_way: BTreeSet<u64> = reads
            .values()
            .map(|(region, _)| *region)
            .filter(|&region| counts(region))
            .chain(
                writes
                    .values()
                    .filter(|piece| piece.region_has_data)
                    .map(|piece| piece.region),
            )
            .collect();
        SyncProgress {
            done_bytes: *done,
            total_bytes: done + (in_backlog + on_the_way.len() as u64) * REGION_BYTES,
            rate_bytes_per_sec,
        }
    }

    pub(super) fn report_progress(&mut self, now_ms: u64) {
        let elapsed = now_ms.saturating_sub(self.last_progress_ms).max(1);
        self.last_progress_ms = now_ms;
        let mut reports = Vec::new();
        for (&node, member) in &self.members {
            if let Sync::Resyncing { done, .. } = &member.sync {
                let moved = done.saturating_sub(member.progress_mark.1);
                reports.push((node, self.resync_progress(member, moved * 1000 / elapsed)));
            }
        }
        for (node, progress) in &reports {
            let member = self.members.get_mut(node).expect("listed");
            member.progress_mark = (now_ms, progress.done_bytes);
        }
        for (node, progress) in reports {
            let id = self.id();
            // Progress is best effort: not retried.
            self.actions.push(Action::Propose {
                id,
                proposal: Proposal::Progress {
                    node,
                    progress: Some(progress),
                },
            });
        }
    }
}
