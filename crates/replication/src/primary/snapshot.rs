//! Snapshots at one write boundary on every replica.
//!
//! [`Primary::take_snapshot`] queues a snapshot. While one waits, no new
//! client write or flush starts (reads go on), resyncs and verifies pause,
//! and once nothing is in flight (and no failed write may still land
//! somewhere) the engine sends `Snapshot` to every in-sync replica that
//! takes writes and lacks no region, then lets the queued requests go.
//! Each link is one ordered stream and each replica's store orders the
//! snapshot after what the link delivered before it, so every copy holds
//! exactly the same writes. The barrier completes like a write: every
//! in-sync replica has it (or has been outdated) and a quorum of voters is
//! among them.

use super::*;

impl Primary {
    /// Asks for a snapshot of the volume; [`Action::SnapshotDone`] follows.
    pub fn take_snapshot(&mut self, snapshot: SnapshotId, now_ms: u64) {
        self.now_ms = now_ms;
        let pending = self
            .writes
            .values()
            .any(|write| matches!(write.purpose, Purpose::Snapshot(id) if id == snapshot));
        if self.snapshots_wanted.contains(&snapshot) || pending {
            return;
        }
        if self.is_stopped() || self.detaching.is_some() {
            self.actions.push(Action::SnapshotDone {
                snapshot,
                result: Err("the volume's engine is stopping".into()),
            });
            return;
        }
        self.snapshots_wanted.push_back(snapshot);
        self.progress();
    }

    /// Whether writes wait for a snapshot barrier.
    pub(super) fn quiescing(&self) -> bool {
        !self.snapshots_wanted.is_empty()
    }

    /// Sends the next snapshot barrier once nothing is in flight; true
    /// when one was sent.
    pub(super) fn continue_snapshots(&mut self) -> bool {
        // Earlier barriers still waiting for their acknowledgements do not
        // hold this one back: each link carries it after them anyway.
        let draining = self
            .writes
            .values()
            .any(|write| !matches!(write.purpose, Purpose::Snapshot(_)));
        if self.snapshots_wanted.is_empty() || draining || !self.failed_in_flight.is_empty() {
            return false;
        }
        let snapshot = self.snapshots_wanted.pop_front().expect("not empty");
        let seq = self.id();
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
            // Only complete copies get it: a resyncing one would snapshot
            // data it does not have yet.
            if member.takes_writes() && member.is_needed() && member.holds_everything() {
                member.unacked.insert(seq, (0, 0, self.now_ms, 0));
                self.actions.push(Action::Send {
                    to: node,
                    message: ToReplica::Snapshot { seq, snapshot },
                });
            }
        }
        self.writes.insert(
            seq,
            PendingWrite {
                purpose: Purpose::Snapshot(snapshot),
                range: (0, 0),
                flush: false,
                payload: None,
                needed,
                acked: BTreeSet::new(),
                errors: Vec::new(),
                persist_token: 0,
                started_ms: self.now_ms,
            },
        );
        true
    }

    /// Every snapshot asked and not done fails (the engine stops or
    /// detaches).
    pub(super) fn fail_snapshots(&mut self, reason: &str) {
        for snapshot in std::mem::take(&mut self.snapshots_wanted) {
            self.actions.push(Action::SnapshotDone {
                snapshot,
                result: Err(reason.to_string()),
            });
        }
    }

    /// A pending write ended in `result`: its client hears, or its
    /// snapshot is reported.
    pub(super) fn end_write(
        &mut self,
        purpose: &Purpose,
        acked: &BTreeSet<NodeId>,
        result: Result<(), ClientError>,
    ) {
        match purpose {
            Purpose::Client(op) => {
                if result.is_ok() {
                    self.counters.writes_completed += 1;
                }
                self.actions.push(Action::Complete {
                    op: *op,
                    result: result.map(|()| Completion::Done),
                });
            }
            Purpose::Snapshot(snapshot) => self.actions.push(Action::SnapshotDone {
                snapshot: *snapshot,
                result: match result {
                    Ok(()) => Ok(acked.clone()),
                    Err(ClientError::Io(message)) => Err(message),
                    Err(ClientError::NoSpace(pool)) => {
                        Err(format!("no space left in pool '{pool}'"))
                    }
                    Err(ClientError::ShuttingDown) => {
                        Err("the volume's engine stopped".to_string())
                    }
                },
            }),
            Purpose::Repair | Purpose::Internal => {}
        }
    }
}
