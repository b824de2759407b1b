//! Resyncs: copying the regions an outdated member may lack from an
//! up-to-date source, paced by the rate limit, with progress reports.

use super::*;

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
                if writes.len() + reads.len() >= RESYNC_WINDOW {
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
        let member = self.members.get_mut(&target).expect("listed");
        let payload = match data {
            ReadData::Data(bytes) => Payload::data(bytes),
            ReadData::Zeroes => Payload::Zeroes { length, trim: true },
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        if let Sync::Resyncing { writes, .. } = &mut member.sync {
            writes.insert(seq, region);
        }
        self.send_write(target, seq, offset, &payload, false);
    }

    pub(super) fn report_progress(&mut self, now_ms: u64) {
        let elapsed = now_ms.saturating_sub(self.last_progress_ms).max(1);
        self.last_progress_ms = now_ms;
        let mut reports = Vec::new();
        for (&node, member) in self.members.iter_mut() {
            if let Sync::Resyncing { total, done, .. } = &member.sync {
                let moved = done.saturating_sub(member.progress_mark.1);
                member.progress_mark = (now_ms, *done);
                reports.push((
                    node,
                    SyncProgress {
                        done_bytes: *done,
                        total_bytes: *total,
                        rate_bytes_per_sec: moved * 1000 / elapsed,
                    },
                ));
            }
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
