//! Background work around leadership:
//! - every node heartbeats to the leader ([`heartbeat_loop`]);
//! - the leader turns heartbeats into online/offline states, evicts nodes
//!   offline for longer than the eviction delay (when switched on), keeps
//!   the voters right, and places again what volumes lost with a node
//!   (their tiebreaker, their replicas) once nodes can take it
//!   ([`leader_loop`]).
//!
//! Voters: one while the cluster has one or two nodes, three from three
//! nodes, five from five; further nodes are learners. An even number of
//! voters would tolerate no more failures than one fewer: with two, the
//! loss of either stops the control plane, with one only the loss of that
//! one does, and a majority of one is as safe as any (a learner never
//! becomes leader). So a cluster that shrinks to two nodes (a `node
//! remove`) goes back to one voter, the leader.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;
use trireme_control::{Command, NodeState, Reply};
use trireme_types::NodeId;

use super::protocol::{Heartbeat, LastHeard, PATH_HEARTBEAT};
use super::{auth, Cluster, HEARTBEAT_INTERVAL, OFFLINE_AFTER};

/// The most voters the control plane uses.
pub const MAX_VOTERS: usize = 5;

/// When the leader last heard from each node (leader-local, not replicated).
#[derive(Default)]
pub struct Liveness {
    inner: Mutex<Heartbeats>,
}

#[derive(Default)]
struct Heartbeats {
    /// The last heartbeat of each node since this node became leader.
    heard: HashMap<NodeId, Instant>,
    /// When this leader began to watch each node: at its election, or when
    /// it first looked at a node that joined later.
    watched_since: HashMap<NodeId, Instant>,
}

/// What the leader knows of a node's heartbeats, for [`liveness_decisions`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heard {
    /// A heartbeat within [`OFFLINE_AFTER`].
    Recently,
    /// No heartbeat yet, but this leader has watched the node for less than
    /// [`OFFLINE_AFTER`] (it was just elected, or the node just joined): too
    /// early to call it offline, and no evidence that it is online.
    NotYet,
    /// Nothing for [`OFFLINE_AFTER`] or longer.
    Silent,
}

impl Liveness {
    pub fn seen(&self, node: NodeId) {
        self.lock().heard.insert(node, Instant::now());
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Heartbeats> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn heard(&self, node: NodeId, now: Instant) -> Heard {
        let mut beats = self.lock();
        if let Some(at) = beats.heard.get(&node) {
            if now.saturating_duration_since(*at) < OFFLINE_AFTER {
                return Heard::Recently;
            }
        }
        let watched = *beats.watched_since.entry(node).or_insert(now);
        if now.saturating_duration_since(watched) < OFFLINE_AFTER {
            Heard::NotYet
        } else {
            Heard::Silent
        }
    }

    /// When `node` was last heard from, as of `now` (this leader's view).
    pub fn last_heard(&self, node: NodeId, now: Instant) -> LastHeard {
        let mut beats = self.lock();
        let millis = |at: Instant| now.saturating_duration_since(at).as_millis() as u64;
        if let Some(at) = beats.heard.get(&node) {
            return LastHeard::Ago {
                millis: millis(*at),
            };
        }
        let watched = *beats.watched_since.entry(node).or_insert(now);
        LastHeard::NotSince {
            millis: millis(watched),
        }
    }

    /// A new leader knows no heartbeats and watches every node from now:
    /// the nodes it finds online get a fresh grace period, and the ones it
    /// finds offline stay so until they are heard from.
    fn start_term(&self, nodes: impl Iterator<Item = NodeId>) {
        let now = Instant::now();
        let mut beats = self.lock();
        beats.heard.clear();
        beats.watched_since.clear();
        beats.watched_since.extend(nodes.map(|node| (node, now)));
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

/// The leader's rounds come every 500 ms; one this long after the previous
/// one means this process did not run meanwhile (stopped, or starved).
const ROUND_GAP: Duration = Duration::from_millis(1_500);
const _: () = assert!(ROUND_GAP.as_millis() < OFFLINE_AFTER.as_millis());

pub async fn leader_loop(cluster: Arc<Cluster>, mut stop: watch::Receiver<bool>) {
    let mut ticker = tokio::time::interval(Duration::from_millis(500));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut was_leader = false;
    let mut last_round = Instant::now();
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            _ = stop.wait_for(|stop| *stop) => return,
        }
        let resumed = last_round.elapsed() >= ROUND_GAP;
        last_round = Instant::now();
        if !cluster.is_leader() {
            was_leader = false;
            continue;
        }
        // After a gap, the heartbeats of the time this node did not run
        // wait unread in its sockets, and a newer leader may have been
        // elected meanwhile: judge nobody by that time (a stale decision
        // would be forwarded to the new leader and committed), but watch
        // every node again from now, as a new leader does.
        if !was_leader || resumed {
            let nodes: Vec<NodeId> = cluster.state.read().nodes.keys().copied().collect();
            cluster.liveness.start_term(nodes.into_iter());
            was_leader = true;
        }
        update_liveness(&cluster).await;
        manage_membership(&cluster).await;
        restore_placements(&cluster).await;
        run_snapshot_schedules(&cluster).await;
    }
}

/// Places again what volumes lost with a node, volume by volume (see
/// `trireme_control::repair`). Each command decides again from the state
/// it is applied to, so a list that is stale by then changes nothing.
async fn restore_placements(cluster: &Cluster) {
    let names = cluster.state.read().placements_to_restore();
    for name in names {
        match cluster
            .write(Command::RestorePlacement { name: name.clone() })
            .await
        {
            Ok(Reply::Volume(volume)) => {
                let state = cluster.state.read();
                let members: Vec<String> = volume
                    .replicas
                    .iter()
                    .map(|replica| {
                        format!(
                            "{} ({})",
                            state.node_name(replica.node),
                            replica.kind.as_str()
                        )
                    })
                    .collect();
                tracing::info!(volume = %name, members = %members.join(", "), "placement restored");
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(volume = %name, %error, "restoring a placement failed"),
        }
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

/// What the leader does about liveness, decided from the state, what it
/// heard from each node (`heard`) and the time: state changes to record and
/// nodes to evict. Pure, so flapping can be tested without a cluster.
///
/// Only a heartbeat brings a node back online. The grace period a new
/// leader gives every node keeps an online node from being called offline
/// before it could be heard; it must not make a dead node look alive.
pub fn liveness_decisions(
    state: &trireme_control::ClusterState,
    heard: impl Fn(NodeId) -> Heard,
    now_ms: u64,
) -> (Vec<(NodeId, NodeState)>, Vec<NodeId>) {
    let mut changes = Vec::new();
    let mut evictions = Vec::new();
    for node in state.nodes.values() {
        match (node.state, heard(node.id)) {
            (NodeState::Online, Heard::Silent) => changes.push((node.id, NodeState::Offline)),
            (NodeState::Offline | NodeState::Evicted, Heard::Recently) => {
                changes.push((node.id, NodeState::Online))
            }
            (NodeState::Offline, Heard::NotYet | Heard::Silent)
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
        let heard = |node: NodeId| {
            if node == cluster.node_id() {
                Heard::Recently
            } else {
                cluster.liveness.heard(node, now)
            }
        };
        liveness_decisions(&state, heard, now_ms)
    };
    for (node, state) in changes {
        // One line when a node goes and one when it is back: what happens
        // in between (failed messages, retries) is not logged per attempt.
        let name = cluster.state.read().node_name(node);
        match state {
            NodeState::Online => tracing::info!(node = %node, %name, "node is back online"),
            _ => {
                tracing::warn!(node = %node, %name, state = state.as_str(), "node is offline: no heartbeat for {OFFLINE_AFTER:?}")
            }
        }
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
    let (members, voters, nodes, online, evicted) = {
        let state = cluster.state.read();
        let membership = state.membership();
        let voters: BTreeSet<u64> = membership.voter_ids().collect();
        let members: BTreeSet<u64> = membership.nodes().map(|(id, _)| *id).collect();
        let nodes: Vec<(u64, String)> = state
            .nodes
            .values()
            .map(|node| (node.id.0, node.api_address.clone()))
            .collect();
        let in_state_of = |wanted: NodeState| -> BTreeSet<u64> {
            state
                .nodes
                .values()
                .filter(|node| node.state == wanted)
                .map(|node| node.id.0)
                .collect()
        };
        let online = in_state_of(NodeState::Online);
        let evicted = in_state_of(NodeState::Evicted);
        (members, voters, nodes, online, evicted)
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
    let caught_up = caught_up_learners(cluster);
    let candidates: Vec<u64> = online
        .iter()
        .filter(|id| caught_up.contains(id))
        .copied()
        .collect();
    let wanted = plan_voters(
        &VoterView {
            voters: &voters,
            removed: &removed,
            evicted: &evicted,
            online: &online,
            leader: cluster.node_id().0,
        },
        candidates,
        voter_target(in_state.len()),
    );
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

/// What [`plan_voters`] starts from.
struct VoterView<'a> {
    voters: &'a BTreeSet<u64>,
    /// Members the state no longer knows.
    removed: &'a BTreeSet<u64>,
    evicted: &'a BTreeSet<u64>,
    online: &'a BTreeSet<u64>,
    /// This node, which plans: it keeps its seat.
    leader: u64,
}

/// The voters the control plane should have: the voters without the
/// removed members, each evicted voter replaced by one of `candidates`
/// (online nodes that are caught up; voters among them are skipped) while
/// there are some, then more candidates up to `target`, never reaching an
/// even count by adding; past `target` (the cluster shrank), seats are
/// given up down to it, offline voters' first, never the leader's.
///
/// An evicted voter (offline past the eviction delay, with eviction on)
/// hands its seat to a learner, as its replicas went to other nodes: its
/// vote only makes the majority harder to reach. Back online, it is a
/// learner. Without a learner to take the seat it keeps it, so the number
/// of voters stays odd.
fn plan_voters(view: &VoterView, mut candidates: Vec<u64>, target: usize) -> BTreeSet<u64> {
    let mut wanted: BTreeSet<u64> = view.voters.difference(view.removed).copied().collect();
    candidates.retain(|id| !wanted.contains(id));
    let evicted_voters: Vec<u64> = wanted.intersection(view.evicted).copied().collect();
    for voter in evicted_voters {
        let Some(successor) = candidates.pop() else {
            break;
        };
        wanted.remove(&voter);
        wanted.insert(successor);
    }
    if wanted.len() > target {
        // Two voters of two nodes: the loss of either would stop the
        // control plane, where one voter stops it only with its own loss.
        let mut givers: Vec<u64> = wanted
            .iter()
            .copied()
            .filter(|id| *id != view.leader)
            .collect();
        // Offline voters first, then the highest ids.
        givers.sort_by_key(|id| (view.online.contains(id), std::cmp::Reverse(*id)));
        for id in givers.into_iter().take(wanted.len() - target) {
            wanted.remove(&id);
        }
        return wanted;
    }
    let mut additions = target.saturating_sub(wanted.len()).min(candidates.len());
    // An even number of voters tolerates no more failures than one fewer
    // and needs a bigger majority: add one less rather than reach it.
    if additions > 0 && (wanted.len() + additions).is_multiple_of(2) {
        additions -= 1;
    }
    wanted.extend(candidates.drain(..additions));
    wanted
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
    use trireme_control::Command;

    const HOUR_MS: u64 = 3_600_000;

    /// Every node but `silent` was heard from recently.
    fn all_but(silent: NodeId) -> impl Fn(NodeId) -> Heard {
        move |node| {
            if node == silent {
                Heard::Silent
            } else {
                Heard::Recently
            }
        }
    }

    fn two_nodes() -> trireme_control::ClusterState {
        let mut state = crate::cluster::test_state::two_nodes();
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

    fn ids(ids: &[u64]) -> BTreeSet<u64> {
        ids.iter().copied().collect()
    }

    /// `plan_voters` for a cluster whose nodes are all online, led by 1.
    fn plan(
        voters: &[u64],
        removed: &[u64],
        evicted: &[u64],
        candidates: Vec<u64>,
        target: usize,
    ) -> BTreeSet<u64> {
        let online = ids(&[1, 2, 3, 4, 5]);
        let view = VoterView {
            voters: &ids(voters),
            removed: &ids(removed),
            evicted: &ids(evicted),
            online: &online,
            leader: 1,
        };
        plan_voters(&view, candidates, target)
    }

    #[test]
    fn an_evicted_voter_hands_its_seat_to_a_learner() {
        assert_eq!(plan(&[1, 2, 3], &[], &[3], vec![4], 3), ids(&[1, 2, 4]));
    }

    #[test]
    fn an_evicted_voter_without_a_learner_keeps_its_seat() {
        // Three nodes, one evicted: two voters would need both for a
        // majority, as three do, and an even count is never the goal.
        assert_eq!(plan(&[1, 2, 3], &[], &[3], vec![], 3), ids(&[1, 2, 3]));
    }

    #[test]
    fn a_removed_voters_seat_goes_to_a_learner() {
        assert_eq!(plan(&[1, 2, 3], &[3], &[], vec![4], 3), ids(&[1, 2, 4]));
    }

    #[test]
    fn a_cluster_shrunk_to_two_nodes_keeps_one_voter_the_leader() {
        // Three voters, one removed, no learner: two nodes left. Two
        // voters would both be needed; one (the leader) is needed alone.
        assert_eq!(plan(&[1, 2, 3], &[3], &[], vec![2], 1), ids(&[1]));
        assert_eq!(plan(&[1, 2, 3], &[1], &[], vec![], 1).len(), 1);
        // Five voters, one removed: four nodes want three voters, and an
        // offline voter gives its seat up before an online one.
        let view = VoterView {
            voters: &ids(&[1, 2, 3, 4, 5]),
            removed: &ids(&[5]),
            evicted: &ids(&[]),
            online: &ids(&[1, 2, 4]),
            leader: 1,
        };
        assert_eq!(plan_voters(&view, vec![], 3), ids(&[1, 2, 4]));
    }

    #[test]
    fn voters_grow_to_the_target_and_never_to_an_even_count() {
        // A second node joins: still one voter (two would need both).
        assert_eq!(plan(&[1], &[], &[], vec![2], 1), ids(&[1]));
        // A third: three voters.
        assert_eq!(plan(&[1], &[], &[], vec![2, 3], 3), ids(&[1, 2, 3]));
        // Five wanted, one learner to offer: four would be even, so three.
        assert_eq!(plan(&[1, 2, 3], &[], &[], vec![4], 5), ids(&[1, 2, 3]));
        // A voter offered again as a candidate is not counted twice.
        assert_eq!(
            plan(&[1, 2, 3], &[], &[], vec![3, 4, 5], 5),
            ids(&[1, 2, 3, 4, 5])
        );
    }

    #[test]
    fn a_node_offline_for_the_whole_delay_is_evicted() {
        let mut state = two_nodes();
        let b = NodeId(2);
        let (changes, evictions) = liveness_decisions(&state, all_but(b), 1000);
        assert_eq!(changes, vec![(b, NodeState::Offline)]);
        assert!(evictions.is_empty());
        apply(&mut state, &changes, 1000);
        let (_, evictions) = liveness_decisions(&state, all_but(b), 1000 + HOUR_MS - 1);
        assert!(evictions.is_empty(), "evicted before the delay");
        let (_, evictions) = liveness_decisions(&state, all_but(b), 1000 + HOUR_MS);
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
            let (changes, evictions) = liveness_decisions(&state, all_but(b), now);
            assert!(evictions.is_empty());
            apply(&mut state, &changes, now);
            now += 50 * 60 * 1000;
            let (changes, evictions) = liveness_decisions(&state, all_but(b), now);
            assert!(evictions.is_empty(), "a flapping node was evicted");
            apply(&mut state, &changes, now);
            let (changes, evictions) = liveness_decisions(&state, |_| Heard::Recently, now + 1);
            assert_eq!(changes, vec![(b, NodeState::Online)]);
            assert!(evictions.is_empty());
            apply(&mut state, &changes, now + 1);
        }
    }

    #[test]
    fn a_new_leaders_grace_period_brings_no_node_back_online() {
        let mut state = two_nodes();
        let b = NodeId(2);
        let (changes, _) = liveness_decisions(&state, all_but(b), 1000);
        apply(&mut state, &changes, 1000);
        // A leader elected since has not heard from b yet: b stays offline,
        // and its time towards eviction goes on.
        let not_yet = |node| {
            if node == b {
                Heard::NotYet
            } else {
                Heard::Recently
            }
        };
        let (changes, evictions) = liveness_decisions(&state, not_yet, 2000);
        assert!(changes.is_empty(), "{changes:?}");
        assert!(evictions.is_empty());
        let (_, evictions) = liveness_decisions(&state, not_yet, 1000 + HOUR_MS);
        assert_eq!(evictions, vec![b]);
        // An online node in the same grace period is not called offline.
        let (changes, _) = liveness_decisions(&two_nodes(), not_yet, 2000);
        assert!(changes.is_empty(), "{changes:?}");
    }

    #[test]
    fn a_leader_watches_nodes_from_its_election() {
        let liveness = Liveness::default();
        let (a, b) = (NodeId(1), NodeId(2));
        let start = Instant::now();
        liveness.start_term([a, b].into_iter());
        liveness.seen(a);
        assert_eq!(liveness.heard(a, Instant::now()), Heard::Recently);
        assert_eq!(liveness.heard(b, Instant::now()), Heard::NotYet);
        let later = start + OFFLINE_AFTER + Duration::from_millis(1);
        assert_eq!(liveness.heard(b, later), Heard::Silent);
        assert_eq!(liveness.heard(a, later + OFFLINE_AFTER), Heard::Silent);
        // A node that joined after the election is watched from when the
        // leader first looks at it.
        let c = NodeId(3);
        assert_eq!(liveness.heard(c, later), Heard::NotYet);
        assert_eq!(liveness.heard(c, later + OFFLINE_AFTER), Heard::Silent);
        // A new term forgets the old heartbeats.
        liveness.start_term([a, b, c].into_iter());
        assert_eq!(liveness.heard(a, Instant::now()), Heard::NotYet);
    }

    #[test]
    fn eviction_off_never_evicts() {
        let mut state = two_nodes();
        state.settings.eviction_enabled = false;
        let b = NodeId(2);
        let (changes, _) = liveness_decisions(&state, all_but(b), 1);
        apply(&mut state, &changes, 1);
        let (_, evictions) = liveness_decisions(&state, all_but(b), 100 * HOUR_MS);
        assert!(evictions.is_empty());
    }

    #[test]
    fn voters_are_odd_and_at_most_five() {
        let targets: Vec<usize> = (0..9).map(voter_target).collect();
        assert_eq!(targets, vec![1, 1, 1, 3, 3, 5, 5, 5, 5]);
    }
}
