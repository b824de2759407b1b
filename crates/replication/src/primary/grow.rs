//! Growing a running volume (docs/replication.md, "Growing an attached
//! volume"). The control plane records the new size and sets every
//! diskful replica pending; each node grows its copy and reports it ready
//! at that size. The view names the members not yet reported
//! (`View::growing`). The engine takes the new size only once no member
//! that must take every write is among them, so a write or read past the
//! old end reaches only copies that hold it. Members still growing stay
//! outdated (no writes, no resync) and are copied once they are reported.
//! Past the old end every copy reads as zeros until the engine writes
//! there (stores grow with holes, and no engine wrote past a size it did
//! not serve), and every write there after the grow is in the dirty map of
//! each member that lacks it: a member resynced later needs no more.

use super::*;

impl Primary {
    /// Takes the recorded size when it is larger and it is safe: while
    /// serving, with every member that is (or is about to be) in the set
    /// holding it, and no copy or verify of the region across the old end
    /// in flight (it was read at the old length).
    pub(super) fn try_grow(&mut self) {
        let target = self.view.size_bytes;
        if target <= self.size_bytes || !self.is_serving() || self.detaching.is_some() {
            return;
        }
        let waiting_for_member = self.members.iter().any(|(node, member)| {
            member.kind == Kind::Diskful
                && self.view.growing.contains(node)
                && (self.view.in_sync.contains(node)
                    || member.is_needed()
                    || matches!(member.sync, Sync::InSync))
        });
        if waiting_for_member {
            // One that is down would hold the grow until a write missed it
            // (then it is outdated anyway): outdate it now, as that write
            // would, so an idle volume grows too.
            let down: Vec<NodeId> = self
                .members
                .iter()
                .filter(|(node, member)| {
                    member.kind == Kind::Diskful
                        && self.view.growing.contains(node)
                        && matches!(member.sync, Sync::InSync)
                        && member.link == Link::Down
                        && member.outdating.is_none()
                })
                .map(|(&node, _)| node)
                .collect();
            for node in down {
                self.start_outdating(node);
            }
            return;
        }
        let straddling = self.size_bytes / REGION_BYTES;
        if !self.size_bytes.is_multiple_of(REGION_BYTES) && self.resync_locks.contains(&straddling)
        {
            return;
        }
        self.grow(target);
    }

    fn grow(&mut self, size_bytes: u64) {
        assert!(
            size_bytes >= self.size_bytes,
            "a volume never shrinks: {} → {size_bytes}",
            self.size_bytes
        );
        // A member still growing that is being copied to would now get
        // writes past its end: it goes back to outdated (its backlog keeps
        // what it lacks) and resumes once it is reported grown.
        let copying: Vec<NodeId> = self
            .members
            .iter()
            .filter(|(node, member)| {
                self.view.growing.contains(node)
                    && member.link != Link::Down
                    && matches!(member.sync, Sync::Resyncing { .. })
            })
            .map(|(&node, _)| node)
            .collect();
        for node in copying {
            self.actions.push(Action::Reset { to: node });
            self.lose_link(node);
        }
        self.size_bytes = size_bytes;
        self.counters.grows += 1;
        // A running verify goes on into the new regions.
        if self.verify.is_some() {
            if let Some(report) = &mut self.verify_report {
                report.total_bytes = size_bytes;
            }
        }
    }

    /// Members the control plane now reports grown that we hold outdated
    /// on a live link: they reconnect, and their welcome starts the copy.
    pub(super) fn release_grown(&mut self, old: &View) {
        let released: Vec<NodeId> = old
            .growing
            .difference(&self.view.growing)
            .copied()
            .filter(|node| {
                self.members.get(node).is_some_and(|member| {
                    member.is_up() && matches!(member.sync, Sync::Outdated { .. })
                })
            })
            .collect();
        for node in released {
            self.actions.push(Action::Reset { to: node });
            self.lose_link(node);
        }
    }
}
