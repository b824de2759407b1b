//! What the engine shows of its links to monitoring (`/metrics`): per
//! member, messages and bytes in flight, acknowledgement latency, what it
//! lacks and how a resync of it goes. Read under the engine's lock, at
//! scrape time; the hot path only adds one acknowledgement to a bucket.

use super::*;

/// Upper bounds of the acknowledgement latency buckets, in milliseconds
/// (the engine's clock counts milliseconds). One more bucket holds the rest.
pub const ACK_LATENCY_BOUNDS_MS: [u64; 10] = [1, 2, 5, 10, 25, 50, 100, 250, 1000, ACK_TIMEOUT_MS];

/// Acknowledgements of writes and flushes, by how long they took.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AckLatency {
    pub count: u64,
    pub sum_ms: u64,
    /// Per bound of [`ACK_LATENCY_BOUNDS_MS`], then the rest; not cumulative.
    pub buckets: [u64; ACK_LATENCY_BOUNDS_MS.len() + 1],
}

impl AckLatency {
    pub(super) fn record(&mut self, elapsed_ms: u64) {
        self.count += 1;
        self.sum_ms += elapsed_ms;
        let bucket = ACK_LATENCY_BOUNDS_MS
            .iter()
            .position(|bound| elapsed_ms <= *bound)
            .unwrap_or(ACK_LATENCY_BOUNDS_MS.len());
        self.buckets[bucket] += 1;
    }
}

/// One member (replica or tiebreaker) as the primary sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkReport {
    pub node: NodeId,
    pub tiebreaker: bool,
    /// The link is up (welcomed).
    pub connected: bool,
    /// up-to-date, outdating, outdated, syncing, joining (tiebreakers:
    /// up-to-date while connected, else outdated).
    pub state: &'static str,
    pub in_flight_messages: u64,
    pub in_flight_bytes: u64,
    /// Bytes of the regions it lacks (0 when in sync).
    pub out_of_sync_bytes: u64,
    /// While it resyncs.
    pub resync: Option<SyncProgress>,
    pub ack_latency: AckLatency,
}

/// The engine's links and whether it has quorum now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineReport {
    pub links: Vec<LinkReport>,
    /// Connected up-to-date voters (this node's copy included) reach the
    /// quorum size of the view.
    pub quorum: bool,
    /// Since the engine started.
    pub counters: Counters,
}

impl Primary {
    /// Messages sent to `node` and not yet answered (0 for a node that is
    /// not a member). The node's driver writes a message to an otherwise
    /// quiet link at once, rather than batching it with others.
    pub fn unacked_messages(&self, node: NodeId) -> usize {
        self.members
            .get(&node)
            .map_or(0, |member| member.unacked.len())
    }

    pub fn report(&self) -> EngineReport {
        let region_count = self.region_count();
        let links = self
            .members
            .iter()
            .map(|(&node, member)| {
                let tiebreaker = member.kind == Kind::Tiebreaker;
                let (state, backlog) = match &member.sync {
                    _ if tiebreaker && member.is_up() => ("up-to-date", None),
                    _ if tiebreaker => ("outdated", None),
                    Sync::InSync if member.outdating.is_some() => ("outdating", None),
                    Sync::InSync => ("up-to-date", None),
                    Sync::Outdated { backlog } => ("outdated", Some(backlog)),
                    Sync::Resyncing { backlog, .. } => ("syncing", Some(backlog)),
                    Sync::Joining { .. } => ("joining", None),
                };
                let out_of_sync_bytes = backlog.map_or(0, |backlog| {
                    (backlog.len(region_count) * REGION_BYTES).min(self.size_bytes)
                });
                let resync = matches!(member.sync, Sync::Resyncing { .. })
                    .then(|| self.resync_progress(member, self.resync_rate));
                LinkReport {
                    node,
                    tiebreaker,
                    connected: member.is_up(),
                    state,
                    in_flight_messages: member.unacked.len() as u64,
                    in_flight_bytes: member.unacked_bytes,
                    out_of_sync_bytes,
                    resync,
                    ack_latency: member.ack_latency.clone(),
                }
            })
            .collect();
        let up_to_date: BTreeSet<NodeId> = self
            .members
            .iter()
            .filter(|(_, member)| {
                member.kind == Kind::Diskful
                    && member.is_up()
                    && matches!(member.sync, Sync::InSync)
                    && member.outdating.is_none()
            })
            .map(|(&node, _)| node)
            .collect();
        EngineReport {
            links,
            quorum: self.is_serving() && self.has_quorum(&up_to_date),
            counters: self.counters,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_land_in_the_first_bucket_that_holds_them() {
        let mut latency = AckLatency::default();
        for elapsed_ms in [0, 1, 2, 7, 6_000] {
            latency.record(elapsed_ms);
        }
        assert_eq!(latency.count, 5);
        assert_eq!(latency.sum_ms, 6_010);
        assert_eq!(&latency.buckets[..4], &[2, 1, 0, 1]);
        assert_eq!(latency.buckets[ACK_LATENCY_BOUNDS_MS.len()], 1);
    }
}
