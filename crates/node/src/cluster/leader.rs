//! Background work around leadership:
//! - every node heartbeats to the leader ([`heartbeat_loop`]);
//! - the leader turns heartbeats into online/offline states, evicts nodes
//!   offline for longer than the eviction delay (when switched on), and
//!   keeps the voters right ([`leader_loop`]).
//!
//! Voters: one while the cluster has one or two nodes, three from three
//! nodes, five from five; further nodes are learners. An even number of
//! voters would tolerate no more failures than one fewer.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use trireme_control::{Command, NodeState};
use trireme_types::NodeId;

use super::internal::{Heartbeat, PATH_HEARTBEAT};
use super::{auth, Cluster, HEARTBEAT_INTERVAL, OFFLINE_AFTER};

/// The most voters the control plane uses.
pub const MAX_VOTERS: usize = 5;

/// When the leader last heard from each node (leader-local, not replicated).
#[derive(Default)]
pub struct Liveness {
    seen: Mutex<HashMap<NodeId, Instant>>,
}

impl Liveness {
    pub fn seen(&self, node: NodeId) {
        self.seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(node, Instant::now());
    }

    /// When `node` was last heard from. A node never heard from (it just
    /// joined) counts as heard from now, so it gets the same grace period
    /// as everyone after an election instead of being marked offline at once.
    fn last_seen(&self, node: NodeId) -> Instant {
        *self
            .seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(node)
            .or_insert_with(Instant::now)
    }

    /// A new leader gives every node a fresh grace period.
    fn reset_all(&self, nodes: impl Iterator<Item = NodeId>) {
        let now = Instant::now();
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        seen.clear();
        seen.extend(nodes.map(|node| (node, now)));
    }
}

pub fn voter_target(nodes: usize) -> usize {
    match nodes {
        0..=2 => 1,
        3..=4 => 3,
        _ => MAX_VOTERS,
    }
}

pub async fn heartbeat_loop(cluster: Arc<Cluster>, mut stop: watch::Receiver<bool>) {
    let mut ticker = tokio::time::interval(HEARTBEAT_INTERVAL);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.wait_for(|stop| *stop) => return,
        }
        let me = cluster.node_id();
        let Some(leader) = cluster.leader() else {
            continue;
        };
        if leader == me {
            cluster.liveness.seen(me);
            continue;
        }
        let address = cluster
            .state
            .read()
            .membership()
            .get_node(&leader.0)
            .map(|node| node.addr.clone());
        if let Some(address) = address {
            if let Err(error) = cluster
                .peers
                .post::<_, bool>(&address, PATH_HEARTBEAT, &Heartbeat { node: me })
                .await
            {
                tracing::debug!(%error, "heartbeat to the leader failed");
            }
        }
    }
}

pub async fn leader_loop(cluster: Arc<Cluster>, mut stop: watch::Receiver<bool>) {
    let mut ticker = tokio::time::interval(Duration::from_millis(500));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut was_leader = false;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.wait_for(|stop| *stop) => return,
        }
        if !cluster.is_leader() {
            was_leader = false;
            continue;
        }
        if !was_leader {
            let nodes: Vec<NodeId> = cluster.state.read().nodes.keys().copied().collect();
            cluster.liveness.reset_all(nodes.into_iter());
            was_leader = true;
        }
        update_liveness(&cluster).await;
        manage_membership(&cluster).await;
        run_snapshot_schedules(&cluster).await;
    }
}

/// Takes the snapshots that schedules say are due (named
/// `auto-YYYYMMDD-HHMMSS`, UTC) and deletes scheduled ones beyond `keep`.
/// A refusal (the volume is busy: a rollback, a detach not yet fenced) is
/// retried on the next round.
async fn run_snapshot_schedules(cluster: &Cluster) {
    let now_ms = auth::now_ms();
    let (take, prune) = cluster.state.read().schedule_work(now_ms);
    for volume in take {
        let stamp = trireme_types::time::UtcTime::from_unix(now_ms / 1000).compact();
        let Ok(name) = trireme_types::SnapshotName::new(format!("auto-{stamp}")) else {
            continue;
        };
        match cluster
            .write(Command::CreateSnapshot {
                volume: volume.clone(),
                name,
                scheduled: true,
                now_ms,
            })
            .await
        {
            Ok(_) => tracing::info!(%volume, "scheduled snapshot asked"),
            Err(error) => tracing::debug!(%volume, %error, "scheduled snapshot not taken now"),
        }
    }
    for (volume, name) in prune {
        if let Err(error) = cluster
            .write(Command::DeleteSnapshot {
                volume: volume.clone(),
                name: name.clone(),
            })
            .await
        {
            tracing::debug!(%volume, snapshot = %name, %error, "scheduled snapshot not deleted now");
        }
    }
}

/// What the leader does about liveness, decided from the state, who was
/// heard from recently (`alive`) and the time: state changes to record and
/// nodes to evict. Pure, so flapping can be tested without a cluster.
pub fn liveness_decisions(
    state: &trireme_control::ClusterState,
    alive: impl Fn(NodeId) -> bool,
    now_ms: u64,
) -> (Vec<(NodeId, NodeState)>, Vec<NodeId>) {
    let mut changes = Vec::new();
    let mut evictions = Vec::new();
    for node in state.nodes.values() {
        match (node.state, alive(node.id)) {
            (NodeState::Online, false) => changes.push((node.id, NodeState::Offline)),
            (NodeState::Offline | NodeState::Evicted, true) => {
                changes.push((node.id, NodeState::Online))
            }
            (NodeState::Offline, false)
                if state.settings.eviction_enabled
                    && now_ms.saturating_sub(node.state_since_ms)
                        >= state.settings.eviction_delay_secs * 1000 =>
            {
                // `state_since_ms` restarts at every return online, so a
                // flapping node never stays offline long enough.
                evictions.push(node.id)
            }
            _ => {}
        }
    }
    (changes, evictions)
}

async fn update_liveness(cluster: &Cluster) {
    let now = Instant::now();
    let now_ms = auth::now_ms();
    let (changes, evictions) = {
        let state = cluster.state.read();
        let alive = |node: NodeId| {
            node == cluster.node_id()
                || now.saturating_duration_since(cluster.liveness.last_seen(node)) < OFFLINE_AFTER
        };
        liveness_decisions(&state, alive, now_ms)
    };
    for (node, state) in changes {
        tracing::info!(node = %node, state = state.as_str(), "node state changes");
        if let Err(error) = cluster
            .write(Command::SetNodeState {
                node,
                state,
                now_ms,
            })
            .await
        {
            tracing::warn!(%error, "recording a node state failed");
        }
    }
    for node in evictions {
        match cluster.write(Command::EvictNode { node, now_ms }).await {
            Ok(reply) => tracing::warn!(node = %node, ?reply, "node evicted"),
            Err(error) => tracing::warn!(%error, node = %node, "evicting failed"),
        }
    }
}

async fn manage_membership(cluster: &Cluster) {
    let (members, voters, nodes, online) = {
        let state = cluster.state.read();
        let membership = state.membership();
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        let members: BTreeSet<u64> = membership.nodes().map(|(id, _)| *id).collect();
        let nodes: Vec<(u64, String)> = state
            .nodes
            .values()
            .map(|node| (node.id.0, node.api_address.clone()))
            .collect();
        let online: BTreeSet<u64> = state
            .nodes
            .values()
            .filter(|node| node.state == NodeState::Online)
            .map(|node| node.id.0)
            .collect();
        (members, voters, nodes, online)
    };
    let in_state: BTreeSet<u64> = nodes.iter().map(|(id, _)| *id).collect();
    // Nodes the state knows but Raft does not: new joins.
    for (id, address) in &nodes {
        if !members.contains(id) {
            if let Err(error) = cluster
                .raft
                .add_learner(*id, openraft::BasicNode::new(address), false)
                .await
            {
                tracing::warn!(%error, node = id, "adding a learner failed");
            }
            return;
        }
    }
    // Removed nodes lose their vote, and their seat goes to an online node.
    let removed: BTreeSet<u64> = members.difference(&in_state).copied().collect();
    let mut wanted: BTreeSet<u64> = voters.difference(&removed).copied().collect();
    let target = voter_target(in_state.len());
    let caught_up = caught_up_learners(cluster);
    let mut candidates: Vec<u64> = online
        .iter()
        .filter(|id| caught_up.contains(id) && !wanted.contains(id))
        .copied()
        .collect();
    let mut additions = target.saturating_sub(wanted.len()).min(candidates.len());
    // An even number of voters tolerates no more failures than one fewer
    // and needs a bigger majority: add one less rather than reach it.
    if additions > 0 && (wanted.len() + additions).is_multiple_of(2) {
        additions -= 1;
    }
    wanted.extend(candidates.drain(..additions));
    if wanted.is_empty() || (wanted == voters && removed.is_empty()) {
        return;
    }
    tracing::info!(?voters, ?wanted, ?removed, "changing the voters");
    match cluster.raft.change_membership(wanted.clone(), false).await {
        Ok(_) => {}
        Err(error) => tracing::warn!(%error, "changing the voters failed"),
    }
    if !removed.is_empty() {
        let remove = openraft::ChangeMembers::RemoveNodes(removed);
        if let Err(error) = cluster.raft.change_membership(remove, false).await {
            tracing::warn!(%error, "removing members failed");
        }
    }
}

/// Learners whose log is close enough to the leader's to vote at once.
fn caught_up_learners(cluster: &Cluster) -> BTreeSet<u64> {
    let metrics = cluster.raft.metrics().borrow().clone();
    let last = metrics.last_log_index.unwrap_or(0);
    metrics
        .replication
        .map(|replication| {
            replication
                .into_iter()
                .filter(|(_, matched)| matched.is_some_and(|matched| matched.index + 100 >= last))
                .map(|(id, _)| id)
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use trireme_control::{Command, NodeRegistration};
    use trireme_types::NodeName;

    const HOUR_MS: u64 = 3_600_000;

    fn two_nodes() -> trireme_control::ClusterState {
        let mut state = trireme_control::ClusterState::default();
        let registration = |name: &str| NodeRegistration {
            name: NodeName::new(name).unwrap(),
            api_address: "127.0.0.1:9".into(),
            nbd_address: None,
            data_address: None,
            labels: Default::default(),
        };
        state
            .apply(Command::Bootstrap {
                cluster_id: "c".into(),
                join_secret: "s".into(),
                node: registration("a"),
                now_ms: 0,
            })
            .unwrap();
        state
            .apply(Command::AddNode {
                node: registration("b"),
                nonce: "n".into(),
                now_ms: 0,
            })
            .unwrap();
        state.settings.eviction_enabled = true;
        state.settings.eviction_delay_secs = 3600;
        state
    }

    fn apply(
        state: &mut trireme_control::ClusterState,
        changes: &[(NodeId, NodeState)],
        now_ms: u64,
    ) {
        for (node, new_state) in changes {
            state
                .apply(Command::SetNodeState {
                    node: *node,
                    state: *new_state,
                    now_ms,
                })
                .unwrap();
        }
    }

    #[test]
    fn a_node_offline_for_the_whole_delay_is_evicted() {
        let mut state = two_nodes();
        let b = NodeId(2);
        let (changes, evictions) = liveness_decisions(&state, |node| node != b, 1000);
        assert_eq!(changes, vec![(b, NodeState::Offline)]);
        assert!(evictions.is_empty());
        apply(&mut state, &changes, 1000);
        let (_, evictions) = liveness_decisions(&state, |node| node != b, 1000 + HOUR_MS - 1);
        assert!(evictions.is_empty(), "evicted before the delay");
        let (_, evictions) = liveness_decisions(&state, |node| node != b, 1000 + HOUR_MS);
        assert_eq!(evictions, vec![b]);
    }

    #[test]
    fn a_flapping_node_is_never_evicted() {
        let mut state = two_nodes();
        let b = NodeId(2);
        // Offline for 50 minutes, back for a moment, offline again: the
        // clock restarts at each return, for days.
        let mut now = 0;
        for _ in 0..100 {
            now += 1000;
            let (changes, evictions) = liveness_decisions(&state, |node| node != b, now);
            assert!(evictions.is_empty());
            apply(&mut state, &changes, now);
            now += 50 * 60 * 1000;
            let (changes, evictions) = liveness_decisions(&state, |node| node != b, now);
            assert!(evictions.is_empty(), "a flapping node was evicted");
            apply(&mut state, &changes, now);
            let (changes, evictions) = liveness_decisions(&state, |_| true, now + 1);
            assert_eq!(changes, vec![(b, NodeState::Online)]);
            assert!(evictions.is_empty());
            apply(&mut state, &changes, now + 1);
        }
    }

    #[test]
    fn eviction_off_never_evicts() {
        let mut state = two_nodes();
        state.settings.eviction_enabled = false;
        let b = NodeId(2);
        let (changes, _) = liveness_decisions(&state, |node| node != b, 1);
        apply(&mut state, &changes, 1);
        let (_, evictions) = liveness_decisions(&state, |node| node != b, 100 * HOUR_MS);
        assert!(evictions.is_empty());
    }

    #[test]
    fn voters_are_odd_and_at_most_five() {
        let targets: Vec<usize> = (0..9).map(voter_target).collect();
        assert_eq!(targets, vec![1, 1, 1, 3, 3, 5, 5, 5, 5]);
    }
}
