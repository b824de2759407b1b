//! Promotion: what a new primary does before it serves. It waits for the
//! up-to-date members' welcomes, then copies the regions of former
//! primaries' unsettled writes from one source to the others.

use super::*;

impl Primary {
    pub(super) fn try_finish_reconcile(&mut self) {
        let Phase::Reconciling {
            welcomes,
            unsettled: reported,
            ..
        } = &self.phase
        else {
            return;
        };
        // Every up-to-date member has answered or is being outdated.
        let waiting = self.members.iter().any(|(node, m)| {
            m.kind == Kind::Diskful
                && matches!(m.sync, Sync::InSync)
                && m.outdating.is_none()
                && !welcomes.contains_key(node)
        });
        if waiting {
            return;
        }
        // Outdating must finish first: until then the set still names them.
        if self.members.values().any(|m| m.outdating.is_some()) {
            return;
        }
        let welcomes = welcomes.clone();
        let reported = reported.clone();
        if welcomes.is_empty() {
            return;
        }
        let intact: Vec<NodeId> = welcomes
            .iter()
            .filter(|(_, (intact, _))| *intact)
            .map(|(&node, _)| node)
            .collect();
        // The source of truth: ourselves if we can be, else an intact member,
        // else (everyone restarted) any member; the others copy from it.
        let source = if intact.contains(&self.me) {
            self.me
        } else if let Some(&node) = intact.first() {
            node
        } else if welcomes.contains_key(&self.me) {
            self.me
        } else {
            *welcomes.keys().next().expect("not empty")
        };
        let unsettled = reported;
        let mut outdate = Vec::new();
        for (&node, (ok, _)) in &welcomes {
            if node != source && !ok && !intact.contains(&node) {
                outdate.push(node);
            }
        }
        // Outdated members may lack the unsettled regions too, and their
        // persisted maps must say so before we serve.
        let behind: Vec<NodeId> = self
            .members
            .iter()
            .filter(|(_, m)| matches!(m.sync, Sync::Outdated { .. } | Sync::Resyncing { .. }))
            .map(|(&n, _)| n)
            .collect();
        // A source that restarted lost what it had not flushed, and it is
        // the truth now: the others may hold newer data anywhere.
        let behind_regions = if intact.contains(&source) {
            unsettled.clone()
        } else {
            RegionSet::all(self.size_bytes)
        };
        if !behind_regions.is_empty() {
            for node in behind {
                if let Some(member) = self.members.get_mut(&node) {
                    if let Sync::Outdated { backlog } | Sync::Resyncing { backlog, .. } =
                        &mut member.sync
                    {
                        backlog.add_set(&behind_regions);
                    }
                }
                let token = self.persist_map(node);
                self.serve_after = self.serve_after.max(token);
            }
        }
        if !outdate.is_empty() {
            for node in outdate {
                self.start_outdating(node);
            }
            // Their outdating must commit before we serve; the welcomes of
            // the rest stand.
            if let Phase::Reconciling { welcomes, .. } = &mut self.phase {
                welcomes.retain(|node, _| *node == source || intact.contains(node));
                for (_, (ok, _)) in welcomes.iter_mut() {
                    *ok = true;
                }
            }
            return;
        }
        let regions: Vec<u64> = unsettled.iter().collect();
        self.copying = unsettled;
        self.phase = Phase::Copying {
            remaining: regions.len(),
        };
        for region in regions {
            let (offset, length) = region_range(region, self.size_bytes);
            if length == 0 {
                if let Phase::Copying { remaining } = &mut self.phase {
                    *remaining -= 1;
                }
                continue;
            }
            let id = self.id();
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
        self.maybe_serve();
    }

    pub(super) fn reconcile_copy(
        &mut self,
        offset: u64,
        length: u64,
        data: ReadData,
        source: NodeId,
    ) {
        let payload = match data {
            ReadData::Data(bytes) => Payload::data(bytes),
            ReadData::Zeroes => Payload::Zeroes {
                length,
                trim: false,
            },
        };
        let targets: Vec<NodeId> = self
            .members
            .iter()
            .filter(|(&n, m)| n != source && m.kind == Kind::Diskful && m.is_needed())
            .filter(|(_, m)| m.takes_writes())
            .map(|(&n, _)| n)
            .collect();
        // Needed members that cannot take it now lack it.
        for (&n, m) in self.members.iter_mut() {
            if n != source && m.kind == Kind::Diskful && m.is_needed() && !m.takes_writes() {
                m.lost.add_range(offset, length);
            }
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        for &node in &targets {
            self.send_write(node, seq, offset, &payload, false);
        }
        self.writes.insert(
            seq,
            PendingWrite {
                purpose: Purpose::Internal,
                range: (offset, length),
                flush: false,
                payload: Some((payload.clone(), false)),
                needed: targets.into_iter().collect(),
                acked: BTreeSet::new(),
                errors: Vec::new(),
                persist_token: 0,
                started_ms: self.now_ms,
            },
        );
        if let Phase::Copying { remaining } = &mut self.phase {
            *remaining -= 1;
        }
        self.maybe_serve();
    }

    pub(super) fn maybe_serve(&mut self) {
        if let Phase::Copying { remaining: 0 } = self.phase {
            if self.persisted_through >= self.serve_after
                && !self
                    .writes
                    .values()
                    .any(|w| matches!(w.purpose, Purpose::Internal))
            {
                self.phase = Phase::Serving;
                // From this flush on, every member's unflushed writes are
                // ours and tracked.
                let seq = self.id();
                self.send_flush(seq, Purpose::Internal);
                self.set_local_readable_from_state();
            }
        }
    }
}
