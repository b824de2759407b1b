//! `verify`: compares the up-to-date replicas online, region by region,
//! by block fingerprints, and rewrites the copies that differ from the
//! majority.
//!
//! A region is compared only while no write to it is in flight, and it is
//! locked (like a resync copy) until its repairs are acknowledged, so every
//! replica answers about the same writes and no client write can land
//! between the comparison and the repair. A block unreadable on a replica
//! (its checksum failed) is rewritten from a readable copy; blocks that
//! read fine but differ are settled by majority. With no majority (two
//! replicas that disagree), the copy the primary reads from wins: the one
//! on this node when it holds one, which is what clients have been reading,
//! and the report counts the block as decided without a majority.

use super::*;
use crate::message::BlockHash;

/// Regions compared at once.
pub const VERIFY_WINDOW: usize = 2;

/// A fingerprint read of one block's good copy, to repair the others.
#[derive(Debug)]
pub(super) struct RepairRead {
    pub(super) region: u64,
    pub(super) block: u64,
    /// Members holding the winning version, the current source first.
    pub(super) holders: Vec<NodeId>,
    /// Members to rewrite.
    pub(super) bad: Vec<NodeId>,
}

/// One region being compared.
#[derive(Debug, Default)]
pub(super) struct RegionCheck {
    /// Fingerprint requests out: id → member.
    pub(super) asked: BTreeMap<u64, NodeId>,
    pub(super) hashes: BTreeMap<NodeId, Vec<BlockHash>>,
    pub(super) compared: bool,
    /// Repair writes sent and not completed.
    pub(super) writes: BTreeSet<u64>,
}

#[derive(Debug)]
pub(super) struct VerifyJob {
    pub(super) next_region: u64,
    pub(super) active: BTreeMap<u64, RegionCheck>,
    /// Source reads for repairs: read id → what to do with the data.
    pub(super) reads: BTreeMap<u64, RepairRead>,
}

impl Primary {
    /// Starts comparing the up-to-date replicas of the volume (see the
    /// module documentation); [`Primary::verify_report`] follows it.
    /// Starting while one runs changes nothing.
    pub fn start_verify(&mut self, now_ms: u64) -> Result<(), String> {
        self.now_ms = now_ms;
        if self.verify.is_some() {
            return Ok(());
        }
        if !self.is_serving() || self.detaching.is_some() {
            return Err("the volume's engine is not serving (starting, detaching or stopped); try again once it serves".into());
        }
        let members = self.readable_members();
        if members.len() < 2 {
            return Err(format!(
                "verify compares up-to-date replicas, and {} of them {} reachable; wait until the others are in sync (trireme volume show --wait)",
                members.len(),
                if members.len() == 1 { "is" } else { "are" }
            ));
        }
        self.verify = Some(VerifyJob {
            next_region: 0,
            active: BTreeMap::new(),
            reads: BTreeMap::new(),
        });
        self.verify_report = Some(VerifyReport {
            state: VerifyState::Running,
            total_bytes: self.size_bytes,
            members,
            started_ms: now_ms,
            ..VerifyReport::default()
        });
        self.progress();
        Ok(())
    }

    /// The running verify's report so far, or the last one's.
    pub fn verify_report(&self) -> Option<&VerifyReport> {
        self.verify_report.as_ref()
    }

    pub(super) fn abort_verify(&mut self, reason: &str) {
        let Some(job) = self.verify.take() else {
            return;
        };
        for region in job.active.keys() {
            self.resync_locks.remove(region);
        }
        if let Some(report) = &mut self.verify_report {
            report.state = VerifyState::Aborted(reason.to_string());
            report.finished_ms = self.now_ms;
        }
    }

    /// Moves the verify along: finishes regions whose repairs are done,
    /// compares regions whose fingerprints are all in, starts new ones.
    pub(super) fn pump_verify(&mut self) {
        let Some(job) = &self.verify else {
            return;
        };
        let ready: Vec<u64> = job
            .active
            .iter()
            .filter(|(_, check)| !check.compared && check.asked.is_empty())
            .map(|(&region, _)| region)
            .collect();
        for region in ready {
            self.compare_region(region);
        }
        self.finish_regions();
        self.start_regions();
        let job = self.verify.as_ref().expect("running");
        if job.next_region >= self.region_count() && job.active.is_empty() {
            self.verify = None;
            let report = self.verify_report.as_mut().expect("running");
            report.state = VerifyState::Done;
            report.finished_ms = self.now_ms;
        }
    }

    fn finish_regions(&mut self) {
        let job = self.verify.as_mut().expect("running");
        let writes = &self.writes;
        let done: Vec<u64> = job
            .active
            .iter()
            .filter(|(region, check)| {
                check.compared
                    && !job.reads.values().any(|read| read.region == **region)
                    && check.writes.iter().all(|seq| !writes.contains_key(seq))
            })
            .map(|(&region, _)| region)
            .collect();
        for region in done {
            job.active.remove(&region);
            self.resync_locks.remove(&region);
            let report = self.verify_report.as_mut().expect("running");
            report.checked_bytes += region_range(region, self.size_bytes).1;
        }
    }

    fn start_regions(&mut self) {
        let region_count = self.region_count();
        loop {
            let job = self.verify.as_ref().expect("running");
            if job.active.len() >= VERIFY_WINDOW || job.next_region >= region_count {
                return;
            }
            if self.resync_rate > 0 && self.resync_tokens < REGION_BYTES as f64 {
                return;
            }
            let region = job.next_region;
            let (offset, length) = region_range(region, self.size_bytes);
            // Only once nothing is in flight there: every replica then
            // answers about the same writes. Regions are taken in order,
            // so a busy one waits rather than being skipped.
            let busy = self.resync_locks.contains(&region)
                || self.writes.values().any(|w| {
                    w.range.1 > 0 && w.range.0 < offset + length && offset < w.range.0 + w.range.1
                });
            if busy {
                return;
            }
            let members = self.readable_members();
            let job = self.verify.as_mut().expect("running");
            job.next_region += 1;
            if members.len() < 2 {
                let report = self.verify_report.as_mut().expect("running");
                report.skipped_bytes += length;
                continue;
            }
            if self.resync_rate > 0 {
                self.resync_tokens -= REGION_BYTES as f64;
            }
            self.resync_locks.insert(region);
            let mut check = RegionCheck::default();
            for node in members {
                let id = self.id();
                check.asked.insert(id, node);
                let now = self.now_ms;
                let member = self.members.get_mut(&node).expect("readable");
                member.unacked.insert(id, (offset, 0, now, 0));
                self.actions.push(Action::Send {
                    to: node,
                    message: ToReplica::Hash { id, offset, length },
                });
            }
            self.verify
                .as_mut()
                .expect("running")
                .active
                .insert(region, check);
        }
    }

    /// Whether `id` is a verify request; then its reply is handled here.
    pub(super) fn on_hash_reply(
        &mut self,
        from: NodeId,
        id: u64,
        result: Result<Vec<BlockHash>, ReplicaError>,
    ) {
        if let Some(member) = self.members.get_mut(&from) {
            member.unacked.remove(&id);
        }
        let size_bytes = self.size_bytes;
        let Some(job) = self.verify.as_mut() else {
            return;
        };
        let Some((&region, check)) = job
            .active
            .iter_mut()
            .find(|(_, check)| check.asked.contains_key(&id))
        else {
            return;
        };
        check.asked.remove(&id);
        let blocks = region_range(region, size_bytes).1.div_ceil(BLOCK_BYTES) as usize;
        match result {
            Ok(hashes) if hashes.len() == blocks => {
                check.hashes.insert(from, hashes);
            }
            Ok(_) | Err(ReplicaError::Refused(_)) | Err(ReplicaError::NoSpace(_)) => {
                // A confused answer: this replica is left out of the
                // region's comparison.
            }
            Err(ReplicaError::Io(_)) | Err(ReplicaError::Checksum(_)) => {
                // Its device fails: it is outdated, like after a failed
                // read, and resynced later.
                self.actions.push(Action::Reset { to: from });
                self.lose_link(from);
            }
        }
    }

    /// All fingerprints of `region` are in: decide each block, and read
    /// the winning copy of every block some replica has differently.
    fn compare_region(&mut self, region: u64) {
        let me = self.me;
        let job = self.verify.as_mut().expect("running");
        let check = job.active.get_mut(&region).expect("active");
        check.compared = true;
        let hashes = std::mem::take(&mut check.hashes);
        let report = self.verify_report.as_mut().expect("running");
        if hashes.len() < 2 {
            // Replicas dropped out meanwhile: nothing to compare with.
            report.skipped_bytes += region_range(region, self.size_bytes).1;
            return;
        }
        // The copy clients read: ours when we hold one.
        let preferred = if hashes.contains_key(&me) {
            me
        } else {
            *hashes.keys().next().expect("two")
        };
        let blocks = hashes.values().next().expect("two").len();
        let mut repairs = Vec::new();
        for block in 0..blocks {
            let first = hashes[&preferred][block];
            if hashes.values().all(|h| h[block] == first) {
                continue;
            }
            report.differing_blocks += 1;
            let mut votes: BTreeMap<u128, usize> = BTreeMap::new();
            for h in hashes.values() {
                if let BlockHash::Hash(value) = h[block] {
                    *votes.entry(value).or_default() += 1;
                }
            }
            let Some(&top) = votes.values().max() else {
                report.unrecoverable_blocks += 1;
                continue;
            };
            let leaders: Vec<u128> = votes
                .iter()
                .filter(|(_, &count)| count == top)
                .map(|(&value, _)| value)
                .collect();
            let winner = match (leaders.len(), first) {
                (1, _) => leaders[0],
                (_, BlockHash::Hash(value)) if leaders.contains(&value) => {
                    report.no_majority_blocks += 1;
                    value
                }
                _ => {
                    report.no_majority_blocks += 1;
                    leaders[0]
                }
            };
            let mut holders: Vec<NodeId> = hashes
                .iter()
                .filter(|(_, h)| h[block] == BlockHash::Hash(winner))
                .map(|(&node, _)| node)
                .collect();
            if let Some(at) = holders.iter().position(|&n| n == me) {
                holders.swap(0, at);
            }
            let bad: Vec<NodeId> = hashes
                .iter()
                .filter(|(_, h)| h[block] != BlockHash::Hash(winner))
                .map(|(&node, _)| node)
                .collect();
            repairs.push(RepairRead {
                region,
                block: block as u64,
                holders,
                bad,
            });
        }
        for read in repairs {
            self.send_repair_read(read);
        }
    }

    fn send_repair_read(&mut self, read: RepairRead) {
        let (offset, _) = region_range(read.region, self.size_bytes);
        let block_offset = offset + read.block * BLOCK_BYTES;
        let source = read.holders[0];
        let up = self.members.get(&source).is_some_and(|m| m.is_up());
        if !up {
            self.next_repair_source(read);
            return;
        }
        let id = self.id();
        let now = self.now_ms;
        self.members
            .get_mut(&source)
            .expect("a member")
            .unacked
            .insert(id, (block_offset, 0, now, 0));
        self.actions.push(Action::Send {
            to: source,
            message: ToReplica::Read {
                id,
                offset: block_offset,
                length: BLOCK_BYTES,
            },
        });
        self.verify
            .as_mut()
            .expect("running")
            .reads
            .insert(id, read);
    }

    /// The source of a repair could not deliver: the next holder, or the
    /// block stays as it is.
    fn next_repair_source(&mut self, mut read: RepairRead) {
        read.holders.remove(0);
        if read.holders.is_empty() {
            if let Some(report) = &mut self.verify_report {
                report.unrecoverable_blocks += 1;
            }
            return;
        }
        self.send_repair_read(read);
    }

    /// Whether `id` is a repair source read of the verify; then its reply
    /// is handled here.
    pub(super) fn on_verify_read(
        &mut self,
        id: u64,
        result: &Result<ReadData, ReplicaError>,
    ) -> bool {
        let Some(read) = self.verify.as_mut().and_then(|job| job.reads.remove(&id)) else {
            return false;
        };
        let data = match result {
            Ok(data) => data.clone(),
            Err(_) => {
                self.next_repair_source(read);
                return true;
            }
        };
        let (offset, _) = region_range(read.region, self.size_bytes);
        let block_offset = offset + read.block * BLOCK_BYTES;
        let payload = match data {
            ReadData::Data(bytes) => Payload::data(bytes),
            ReadData::Zeroes => Payload::Zeroes {
                length: BLOCK_BYTES,
                trim: false,
            },
        };
        let targets: BTreeSet<NodeId> = read
            .bad
            .into_iter()
            .filter(|node| self.members.get(node).is_some_and(|m| m.takes_writes()))
            .collect();
        if targets.is_empty() {
            return true;
        }
        let seq = self.id();
        for &node in &targets {
            self.send_write(node, seq, block_offset, &payload, true);
        }
        let report = self.verify_report.as_mut().expect("running");
        for &node in &targets {
            *report.repaired.entry(node).or_default() += 1;
        }
        self.counters.repaired_blocks += targets.len() as u64;
        self.writes.insert(
            seq,
            PendingWrite {
                purpose: Purpose::Repair,
                range: (block_offset, BLOCK_BYTES),
                flush: false,
                payload: Some((payload, true)),
                needed: targets,
                acked: BTreeSet::new(),
                errors: Vec::new(),
                persist_token: 0,
                started_ms: self.now_ms,
            },
        );
        let job = self.verify.as_mut().expect("running");
        job.active
            .get_mut(&read.region)
            .expect("a region with a read is active")
            .writes
            .insert(seq);
        true
    }

    /// `node`'s link dropped: it answers nothing more for the verify.
    pub(super) fn verify_member_lost(&mut self, node: NodeId) {
        let Some(job) = self.verify.as_mut() else {
            return;
        };
        for check in job.active.values_mut() {
            check.asked.retain(|_, member| *member != node);
        }
        let stranded: Vec<u64> = job
            .reads
            .iter()
            .filter(|(_, read)| read.holders.first() == Some(&node))
            .map(|(&id, _)| id)
            .collect();
        let reads: Vec<RepairRead> = stranded
            .into_iter()
            .map(|id| job.reads.remove(&id).expect("listed"))
            .collect();
        for read in reads {
            self.next_repair_source(read);
        }
    }

    /// Invariants of a running verify.
    pub(super) fn check_verify(&self) {
        let Some(job) = &self.verify else {
            return;
        };
        assert!(job.active.len() <= VERIFY_WINDOW, "verify window exceeded");
        for region in job.active.keys() {
            assert!(
                self.resync_locks.contains(region),
                "a region under verify is not locked"
            );
        }
        for read in job.reads.values() {
            assert!(
                job.active.contains_key(&read.region),
                "a repair read of a region no longer under verify"
            );
        }
    }
}
