//! Regression tests for protocol bugs the replication simulator
//! (`trireme-sim`'s `sim-replication`) found. Each test drives the engine and
//! replica sides through the shortest history that broke them.
//!
//! The harness: replicas with a volatile copy and a durable copy (a crash
//! keeps only the durable one), link ids, replies that a slow replica holds
//! back, and a control plane whose answers each test scripts.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use trireme_replication::driver::replica::{execute, ReplicaDriver, ReplicaStore, Step};
use trireme_replication::primary::NO_QUORUM_FAIL_MS;
use trireme_replication::*;
use trireme_types::{Generation, NodeId, SnapshotId};

const SIZE: u64 = 4 << 20;
/// The engine starts at this time: what the replicas did before a test
/// (at time 0) granted leases that ran out by then.
const START: u64 = LEASE_HOLD_MS;

/// Any hash of the bytes: equal bytes, equal fingerprints.
fn fingerprint(bytes: &[u8]) -> u128 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut hasher);
    u128::from(hasher.finish())
}
const ME: NodeId = NodeId(1);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Commit,
    /// Commit, but the answer is lost (the engine sees `Unavailable`).
    CommitLost,
    /// Keep the proposal unanswered until `answer_held`.
    Hold,
}

struct Replica {
    side: ReplicaSide,
    up: bool,
    reachable: bool,
    data: Vec<u8>,
    durable: Vec<u8>,
    accepted: Generation,
    primary_at: Option<Generation>,
    clean: bool,
    link: Option<LinkId>,
    /// A slow replica: its acknowledgements and read replies wait here
    /// until `release`.
    hold: bool,
    held: VecDeque<(LinkId, FromReplica)>,
    io_error: bool,
    /// Only writes fail (a bad sector): flushes succeed.
    write_error: bool,
    corrupt: BTreeSet<u64>,
}

impl Replica {
    fn new(accepted: Generation) -> Replica {
        Replica {
            side: ReplicaSide::new(accepted, None, true),
            up: true,
            reachable: true,
            data: vec![0; SIZE as usize],
            durable: vec![0; SIZE as usize],
            accepted,
            primary_at: None,
            clean: true,
            link: None,
            hold: false,
            held: VecDeque::new(),
            io_error: false,
            write_error: false,
            corrupt: BTreeSet::new(),
        }
    }
}

/// A replica's in-memory copy as the driver's [`ReplicaStore`]: admitted
/// messages are carried out by the driver's own `execute`, as on a node.
struct ReplicaCopy<'a>(RefCell<&'a mut Replica>);

impl ReplicaStore for ReplicaCopy<'_> {
    fn size_bytes(&self) -> u64 {
        self.0.borrow().data.len() as u64
    }

    fn write(&self, offset: u64, payload: Payload, fua: bool) -> Result<(), ReplicaError> {
        let replica = &mut *self.0.borrow_mut();
        if replica.io_error || replica.write_error {
            return Err(ReplicaError::Io("device".into()));
        }
        let range = offset as usize..(offset + payload.length()) as usize;
        match &payload {
            Payload::Data(data) => replica.data[range.clone()].copy_from_slice(data),
            Payload::Zeroes { .. } => replica.data[range.clone()].fill(0),
        }
        if fua {
            let copy = replica.data[range.clone()].to_vec();
            replica.durable[range].copy_from_slice(&copy);
        }
        for block in offset / 4096..(offset + payload.length()) / 4096 {
            replica.corrupt.remove(&block);
        }
        Ok(())
    }

    fn flush(&self) -> Result<(), ReplicaError> {
        let replica = &mut *self.0.borrow_mut();
        if replica.io_error {
            return Err(ReplicaError::Io("device".into()));
        }
        replica.durable = replica.data.clone();
        Ok(())
    }

    fn read(&self, offset: u64, length: u64) -> Result<ReadData, ReplicaError> {
        let replica = self.0.borrow();
        if let Some(block) =
            (offset / 4096..(offset + length) / 4096).find(|block| replica.corrupt.contains(block))
        {
            return Err(ReplicaError::Checksum(format!("block {block}")));
        }
        Ok(ReadData::Data(
            replica.data[offset as usize..(offset + length) as usize].to_vec(),
        ))
    }

    fn hashes(&self, offset: u64, length: u64) -> Result<Vec<BlockHash>, ReplicaError> {
        let replica = self.0.borrow();
        Ok((offset / 4096..(offset + length) / 4096)
            .map(|block| {
                if replica.corrupt.contains(&block) {
                    BlockHash::Unreadable
                } else {
                    let at = (block * 4096) as usize;
                    BlockHash::Hash(fingerprint(&replica.data[at..at + 4096]))
                }
            })
            .collect())
    }

    /// A snapshot is a flush here: the copy keeps no snapshots.
    fn snapshot(&self, _snapshot: SnapshotId) -> Result<(), ReplicaError> {
        self.flush()
    }
}

struct World {
    engine: Primary,
    view: View,
    replicas: BTreeMap<NodeId, Replica>,
    next_link: LinkId,
    outbox: VecDeque<(NodeId, LinkId, FromReplica)>,
    done: BTreeMap<OpId, Result<Completion, ClientError>>,
    maps: BTreeMap<NodeId, DirtyMap>,
    proposed: Vec<Proposal>,
    outdate: Answer,
    in_sync: Answer,
    held_proposals: Vec<(u64, Proposal)>,
    /// Persists wait here while set (a slow disk on the primary's node).
    hold_persists: bool,
    held_persists: Vec<u64>,
    sent: Vec<(NodeId, ToReplica)>,
    /// Snapshot barriers that ended: the replicas that took them, or why not.
    snapshots: BTreeMap<SnapshotId, Result<BTreeSet<NodeId>, String>>,
    /// Hellos a replica puts off (it holds an older primary's lease): the
    /// time to try again, the node, the link and the hello.
    parked: Vec<(u64, NodeId, LinkId, ToReplica)>,
    now: u64,
}

fn view(generation: u64, in_sync: &[u64]) -> View {
    View {
        generation: Generation(generation),
        primaries: [ME].into_iter().collect(),
        diskful: [1, 2, 3].into_iter().map(NodeId).collect(),
        tiebreakers: BTreeSet::new(),
        in_sync: in_sync.iter().copied().map(NodeId).collect(),
        size_bytes: SIZE,
        growing: BTreeSet::new(),
    }
}

impl World {
    fn start(view: View, maps: BTreeMap<NodeId, DirtyMap>, accepted: Generation) -> World {
        World::with_replicas(
            view,
            maps,
            (1..=3)
                .map(|n| (NodeId(n), Replica::new(accepted)))
                .collect(),
        )
    }

    fn with_replicas(
        view: View,
        maps: BTreeMap<NodeId, DirtyMap>,
        replicas: BTreeMap<NodeId, Replica>,
    ) -> World {
        let mut world = World::build(view, maps, replicas);
        world.run();
        world
    }

    /// The engine started, nothing done yet.
    fn build(
        view: View,
        maps: BTreeMap<NodeId, DirtyMap>,
        replicas: BTreeMap<NodeId, Replica>,
    ) -> World {
        World::build_with(view, maps, replicas, NoQuorumPolicy::Suspend)
    }

    fn build_with(
        view: View,
        maps: BTreeMap<NodeId, DirtyMap>,
        replicas: BTreeMap<NodeId, Replica>,
        policy: NoQuorumPolicy,
    ) -> World {
        let config = Config {
            me: ME,
            size_bytes: SIZE,
            view: view.clone(),
            policy,
            resync_rate: 0,
            dirty_maps: maps.clone(),
        };
        World {
            engine: Primary::new(config, START),
            view,
            replicas,
            next_link: 1,
            outbox: VecDeque::new(),
            done: BTreeMap::new(),
            maps,
            proposed: Vec::new(),
            outdate: Answer::Commit,
            in_sync: Answer::Commit,
            held_proposals: Vec::new(),
            hold_persists: false,
            held_persists: Vec::new(),
            sent: Vec::new(),
            snapshots: BTreeMap::new(),
            parked: Vec::new(),
            now: START,
        }
    }

    fn run(&mut self) {
        for _ in 0..100_000 {
            let actions = self.engine.take_actions();
            if actions.is_empty() && self.outbox.is_empty() {
                return;
            }
            for action in actions {
                self.act(action);
            }
            while let Some((node, link, message)) = self.outbox.pop_front() {
                if self.replicas[&node].link == Some(link) {
                    self.engine.message(node, message, self.now);
                }
            }
        }
        panic!("the engine does not settle");
    }

    fn tick(&mut self, ms: u64) {
        for _ in 0..ms / 100 {
            self.now += 100;
            self.engine.tick(self.now);
            let now = self.now;
            let (due, parked) = std::mem::take(&mut self.parked)
                .into_iter()
                .partition(|(until, ..)| *until <= now);
            self.parked = parked;
            for (_, node, link, hello) in due {
                if self.replicas[&node].link == Some(link) {
                    for reply in self.replica(node, link, hello) {
                        self.outbox.push_back((node, link, reply));
                    }
                }
            }
            let nodes: Vec<NodeId> = self.replicas.keys().copied().collect();
            for node in nodes {
                if self.replicas[&node].link.is_none() {
                    self.connect(node);
                }
            }
            self.run();
        }
    }

    fn connect(&mut self, node: NodeId) {
        let replica = self.replicas.get_mut(&node).expect("a replica");
        if replica.up && replica.reachable {
            let link = self.next_link;
            self.next_link += 1;
            replica.link = Some(link);
            self.engine.link_up(node, self.now);
        } else {
            self.engine.link_down(node, self.now);
        }
    }

    fn drop_link(&mut self, node: NodeId) {
        let replica = self.replicas.get_mut(&node).expect("a replica");
        if let Some(link) = replica.link.take() {
            replica.side.link_closed(link);
            replica.held.clear();
            self.engine.link_down(node, self.now);
        }
        self.run();
    }

    fn crash(&mut self, node: NodeId) {
        self.drop_link(node);
        let replica = self.replicas.get_mut(&node).expect("a replica");
        replica.data = replica.durable.clone();
        replica.side = ReplicaSide::new(replica.accepted, replica.primary_at, replica.clean)
            .after_restart(self.now);
        replica.up = false;
    }

    fn release(&mut self, node: NodeId) {
        let replica = self.replicas.get_mut(&node).expect("a replica");
        replica.hold = false;
        for (link, message) in std::mem::take(&mut replica.held) {
            self.outbox.push_back((node, link, message));
        }
        self.run();
    }

    fn answer(&mut self, id: u64, proposal: &Proposal, answer: Answer) {
        let result = match proposal {
            Proposal::MarkOutdated { node } => {
                if !self.view.in_sync.contains(node) {
                    ProposalResult::Committed
                } else if self.view.in_sync.len() == 1 {
                    ProposalResult::Refused("the last up-to-date replica".into())
                } else {
                    self.view.in_sync.remove(node);
                    ProposalResult::Committed
                }
            }
            Proposal::MarkInSync { node } => {
                self.view.in_sync.insert(*node);
                ProposalResult::Committed
            }
            Proposal::Progress { .. } => return,
        };
        let result = match (answer, result) {
            (Answer::CommitLost, ProposalResult::Committed) => ProposalResult::Unavailable,
            (_, result) => result,
        };
        self.engine.proposal_result(id, result, self.now);
    }

    fn answer_held(&mut self) {
        for (id, proposal) in std::mem::take(&mut self.held_proposals) {
            self.answer(id, &proposal, Answer::Commit);
        }
        self.run();
    }

    fn release_persists(&mut self) {
        self.hold_persists = false;
        for token in std::mem::take(&mut self.held_persists) {
            self.engine.persisted(token, self.now);
        }
        self.run();
    }

    fn push_view(&mut self) {
        self.engine.view(self.view.clone(), self.now);
        self.run();
    }

    fn act(&mut self, action: Action) {
        match action {
            Action::Connect { to } => self.connect(to),
            Action::Send { to, message } => {
                self.sent.push((to, message.clone()));
                let Some(link) = self.replicas[&to].link else {
                    return;
                };
                let replies = self.replica(to, link, message);
                let replica = self.replicas.get_mut(&to).expect("a replica");
                for reply in replies {
                    let slow = matches!(
                        reply,
                        FromReplica::Ack { .. } | FromReplica::ReadReply { .. }
                    );
                    if replica.hold && slow {
                        replica.held.push_back((link, reply));
                    } else {
                        self.outbox.push_back((to, link, reply));
                    }
                }
            }
            Action::Reset { to } => {
                let replica = self.replicas.get_mut(&to).expect("a replica");
                if let Some(link) = replica.link.take() {
                    replica.side.link_closed(link);
                    replica.held.clear();
                }
                self.engine.link_down(to, self.now);
            }
            Action::Complete { op, result } => {
                self.done.insert(op, result);
            }
            Action::Propose { id, proposal } => {
                if matches!(proposal, Proposal::Progress { .. }) {
                    return;
                }
                self.proposed.push(proposal.clone());
                let answer = match proposal {
                    Proposal::MarkOutdated { .. } => self.outdate,
                    _ => self.in_sync,
                };
                if answer == Answer::Hold {
                    self.held_proposals.push((id, proposal));
                } else {
                    self.answer(id, &proposal, answer);
                }
            }
            Action::PersistDirty { token, peer, map } => {
                self.maps.insert(peer, map);
                if self.hold_persists {
                    self.held_persists.push(token);
                } else {
                    self.engine.persisted(token, self.now);
                }
            }
            Action::ForgetDirty { peer } => {
                self.maps.remove(&peer);
            }
            Action::SnapshotDone { snapshot, result } => {
                self.snapshots.insert(snapshot, result);
            }
            Action::LocalReadable(_) | Action::Stopped { .. } => {}
        }
    }

    fn replica(&mut self, node: NodeId, link: LinkId, message: ToReplica) -> Vec<FromReplica> {
        let now = self.now;
        let replica = self.replicas.get_mut(&node).expect("a replica");
        let hello = matches!(message, ToReplica::Hello { .. }).then(|| message.clone());
        // The node's own replica driver decides, and its `execute` carries
        // the message out on this world's in-memory copy.
        match ReplicaDriver::new().receive(&mut replica.side, link, message, now, true) {
            Step::Reply(reply) | Step::Refuse(reply) => vec![reply],
            Step::Wait { until_ms } => {
                let hello = hello.expect("only a hello waits");
                self.parked.push((until_ms, node, link, hello));
                Vec::new()
            }
            Step::Welcome { durable, welcome } => {
                replica.accepted = durable.accepted;
                replica.clean = durable.clean;
                vec![welcome]
            }
            Step::Close { durable } => {
                // The link's end after a goodbye matters to no test here.
                if durable.is_some() {
                    replica.clean = true;
                }
                Vec::new()
            }
            Step::DataForTiebreaker => panic!("every replica here holds data"),
            Step::Store(message) => vec![execute(&ReplicaCopy(RefCell::new(replica)), message)],
        }
    }

    fn write(&mut self, op: OpId, offset: u64, byte: u8, fua: bool) {
        let payload = Payload::data(vec![byte; 4096]);
        self.engine.client(
            op,
            ClientRequest::Write {
                offset,
                payload,
                fua,
            },
            self.now,
        );
        self.run();
    }

    fn flush(&mut self, op: OpId) {
        self.engine.client(op, ClientRequest::Flush, self.now);
        self.run();
    }

    fn read(&mut self, op: OpId, offset: u64) -> Option<Result<Completion, ClientError>> {
        self.engine.client(
            op,
            ClientRequest::Read {
                offset,
                length: 4096,
            },
            self.now,
        );
        self.run();
        self.done.get(&op).cloned()
    }

    fn byte(&self, node: u64, offset: u64) -> u8 {
        self.replicas[&NodeId(node)].data[offset as usize]
    }

    fn state(&self, node: u64) -> String {
        self.engine
            .member_states()
            .into_iter()
            .find(|(n, _, _)| *n == NodeId(node))
            .map(|(_, state, _)| state)
            .expect("a member")
    }
}

fn replicas_at(accepted: u64) -> BTreeMap<NodeId, Replica> {
    (1..=3)
        .map(|n| (NodeId(n), Replica::new(Generation(accepted))))
        .collect()
}

/// Replicas at generation 2 on which a write of the generation-2 primary
/// (node 2) at `offset` is unsettled: the next primary must copy its
/// region from one source to the others before it serves.
fn replicas_with_unsettled_write(offset: u64) -> BTreeMap<NodeId, Replica> {
    let mut replicas = replicas_at(2);
    let write = ToReplica::Write {
        seq: 9,
        offset,
        payload: Payload::Zeroes {
            length: 4096,
            trim: false,
        },
        fua: false,
        settled: 9,
    };
    for replica in replicas.values_mut() {
        replica.side.on_hello(100, Generation(2), NodeId(2), 0);
        replica.side.admit(100, &write, 0).unwrap();
        replica.side.link_closed(100);
    }
    replicas
}

/// The control plane refuses to outdate the last up-to-date member; when its
/// link comes back, the engine used to ignore the welcome and retry the
/// refused proposal forever: no read source, no resync, writes hung.
#[test]
fn the_last_up_to_date_member_is_kept_when_it_comes_back() {
    let mut replicas = replicas_at(1);
    replicas.get_mut(&NodeId(2)).unwrap().reachable = false;
    replicas.get_mut(&NodeId(3)).unwrap().reachable = false;
    let mut world = World::with_replicas(view(2, &[1]), BTreeMap::new(), replicas);
    world.tick(1_000);
    assert!(world.engine.is_serving());
    world.replicas.get_mut(&ME).unwrap().reachable = false;
    world.drop_link(ME);
    world.write(1, 0, 7, false);
    assert!(world
        .proposed
        .contains(&Proposal::MarkOutdated { node: ME }));
    assert_eq!(world.done.get(&1), None, "no up-to-date member holds it");
    world.replicas.get_mut(&ME).unwrap().reachable = true;
    world.tick(2_000);
    assert_eq!(world.state(1), "up-to-date");
    for node in [2, 3] {
        world.replicas.get_mut(&NodeId(node)).unwrap().reachable = true;
    }
    world.tick(500);
    // The write it never saw failed; the volume serves again.
    assert!(matches!(world.done.get(&1), Some(Err(ClientError::Io(_)))));
    world.write(2, 4096, 8, false);
    assert_eq!(world.done.get(&2), Some(&Ok(Completion::Done)));
    assert_eq!(
        world.read(3, 4096),
        Some(Ok(Completion::Read(ReadData::Data(vec![8; 4096]))))
    );
    world.tick(3_000);
    assert!(["up-to-date"; 3]
        .iter()
        .zip([1, 2, 3])
        .all(|(state, node)| world.state(node) == *state));
}

/// A write acknowledged by the only up-to-date member, whose link then
/// dropped (its node may have crashed with the write unflushed), used to
/// complete once another (resyncing) member's acknowledgement made the
/// quorum.
#[test]
fn an_acknowledgement_from_a_lost_link_does_not_count() {
    let mut world = World::start(view(2, &[1]), BTreeMap::new(), Generation(1));
    world.tick(1_000);
    world.tick(2_000);
    assert_eq!(world.view.in_sync.len(), 3, "all joined");
    // Back to one up-to-date member: 2 and 3 are outdated again.
    world.view.in_sync = [ME].into_iter().collect();
    world.push_view();
    world.tick(200);
    world.replicas.get_mut(&NodeId(2)).unwrap().hold = true;
    world.replicas.get_mut(&NodeId(3)).unwrap().hold = true;
    world.write(1, 0, 9, false);
    assert_eq!(world.done.get(&1), None, "no quorum yet");
    world.outdate = Answer::Hold;
    world.crash(ME);
    world.release(NodeId(2));
    world.release(NodeId(3));
    assert_eq!(
        world.done.get(&1),
        None,
        "acknowledged by a member that lost it, and by members not in the set"
    );
}

/// A replica that restarted (lost unflushed writes) and was outdated during
/// reconciliation used to get an empty backlog: it copied nothing and
/// rejoined without the writes it lost.
#[test]
fn a_member_that_restarted_copies_everything() {
    let mut replicas = replicas_at(2);
    let node3 = replicas.get_mut(&NodeId(3)).unwrap();
    node3.data[(3 << 20) as usize] = 0; // lost in its crash
    node3.side = ReplicaSide::new(Generation(2), None, false);
    for replica in replicas.values_mut().take(2) {
        replica.data[(3 << 20) as usize] = 5;
        replica.durable[(3 << 20) as usize] = 5;
    }
    let mut world = World::with_replicas(view(3, &[1, 2, 3]), BTreeMap::new(), replicas);
    world.tick(3_000);
    assert!(world.engine.is_serving());
    assert!(world.view.in_sync.contains(&NodeId(3)), "joined again");
    assert_eq!(world.byte(3, 3 << 20), 5, "it copied what it lost");
    assert_eq!(
        world.engine.counters.resynced_regions,
        SIZE.div_ceil(REGION_BYTES)
    );
}

/// A replica that restarted stays "not intact" until a primary writes to it:
/// it used to claim to be intact to the next primary as soon as it accepted
/// any hello, so a primary that died before outdating it left it trusted.
#[test]
fn a_restarted_replica_stays_not_intact_until_written() {
    let mut side = ReplicaSide::new(Generation(4), None, false);
    let intact = |outcome: HelloOutcome| match outcome {
        HelloOutcome::Accept {
            welcome: FromReplica::Welcome { intact, .. },
            ..
        } => intact,
        other => panic!("{other:?}"),
    };
    const H: u64 = LEASE_HOLD_MS;
    assert!(!intact(side.on_hello(1, Generation(5), NodeId(1), 0)));
    // That primary died; the next one must hear the same.
    assert!(!intact(side.on_hello(2, Generation(6), NodeId(2), H)));
    let write = ToReplica::Write {
        seq: 1,
        offset: 0,
        payload: Payload::Zeroes {
            length: 4096,
            trim: false,
        },
        fua: false,
        settled: 1,
    };
    side.admit(2, &write, H).unwrap();
    assert!(intact(side.on_hello(3, Generation(7), NodeId(2), 2 * H)));
}

/// What an older generation left unsettled used to be reported to the first
/// newer hello only: if that primary died before copying those regions, the
/// next one never learned of them and replicas stayed different.
#[test]
fn unsettled_writes_are_reported_until_a_newer_primary_flushes() {
    let mut side = ReplicaSide::new(Generation(1), None, true);
    let unsettled = |outcome: HelloOutcome| match outcome {
        HelloOutcome::Accept {
            welcome: FromReplica::Welcome { unsettled, .. },
            ..
        } => unsettled.iter().collect::<Vec<_>>(),
        other => panic!("{other:?}"),
    };
    const H: u64 = LEASE_HOLD_MS;
    unsettled(side.on_hello(1, Generation(2), NodeId(1), 0));
    let write = ToReplica::Write {
        seq: 5,
        offset: 2 << 20,
        payload: Payload::Zeroes {
            length: 4096,
            trim: false,
        },
        fua: false,
        settled: 5,
    };
    side.admit(1, &write, 0).unwrap();
    assert_eq!(
        unsettled(side.on_hello(2, Generation(3), NodeId(2), H)),
        vec![2]
    );
    // The primary of generation 3 died before reconciling.
    assert_eq!(
        unsettled(side.on_hello(3, Generation(4), NodeId(3), 2 * H)),
        vec![2]
    );
    // This one reconciled and serves: its first flush settles the past.
    side.admit(3, &ToReplica::Flush { seq: 1 }, 2 * H).unwrap();
    assert_eq!(
        unsettled(side.on_hello(4, Generation(4), NodeId(3), 2 * H)),
        Vec::<u64>::new()
    );
}

/// A dirty map persisted by this node's primary of an older generation
/// misses what primaries of the generations in between wrote; it used to be
/// trusted whenever the peer had not accepted anything newer since.
#[test]
fn a_dirty_map_from_before_another_primary_is_not_trusted() {
    let maps: BTreeMap<NodeId, DirtyMap> = [(
        NodeId(3),
        DirtyMap {
            since: Generation(4),
            full: false,
            regions: RegionSet::new(),
        },
    )]
    .into_iter()
    .collect();
    // Node 3 last accepted generation 4; generation 5 ran elsewhere.
    let mut world = World::with_replicas(view(6, &[1, 2]), maps, replicas_at(4));
    world.tick(3_000);
    assert_eq!(world.state(3), "up-to-date");
    assert_eq!(
        world.engine.counters.resynced_regions,
        SIZE.div_ceil(REGION_BYTES),
        "a full sync"
    );
}

/// `MarkOutdated` committed but its answer was lost; the view told the engine,
/// the member resynced, and `MarkInSync` committed; then the retried
/// `MarkOutdated` committed again and took the member out behind the engine's
/// back.
#[test]
fn mark_in_sync_waits_for_an_unanswered_mark_outdated() {
    let mut world = World::start(view(2, &[1, 2, 3]), BTreeMap::new(), Generation(1));
    world.tick(1_000);
    world.outdate = Answer::CommitLost;
    world.drop_link(NodeId(3));
    assert!(!world.view.in_sync.contains(&NodeId(3)));
    world.push_view();
    world.tick(200);
    assert!(
        !world
            .proposed
            .contains(&Proposal::MarkInSync { node: NodeId(3) }),
        "proposed while a MarkOutdated of it may still commit"
    );
    world.outdate = Answer::Commit;
    world.tick(2_000);
    assert!(world
        .proposed
        .contains(&Proposal::MarkInSync { node: NodeId(3) }));
    assert!(world.view.in_sync.contains(&NodeId(3)));
    assert_eq!(world.state(3), "up-to-date");
}

/// Reconciliation added the former primary's unsettled regions to outdated
/// members' backlogs in memory only: a later primary on this node trusted
/// the persisted map without them.
#[test]
fn reconciliation_persists_what_outdated_members_lack() {
    let mut replicas = replicas_with_unsettled_write(2 << 20);
    replicas.get_mut(&NodeId(3)).unwrap().reachable = false;
    let mut world = World::with_replicas(view(3, &[1, 2, 3]), BTreeMap::new(), replicas);
    world.tick(5_000);
    assert!(world.engine.is_serving());
    let map = &world.maps[&NodeId(3)];
    assert!(map.full || map.regions.contains(2), "{map:?}");
}

/// A resyncing member (not waited for) applied a write that failed as a
/// whole (every waited-for member failed it): it kept data the others do not
/// have.
#[test]
fn a_failed_write_is_copied_again_to_resyncing_members() {
    let mut replicas = replicas_at(1);
    // Members 2 and 3 resync slowly.
    replicas.get_mut(&NodeId(2)).unwrap().hold = true;
    replicas.get_mut(&NodeId(3)).unwrap().hold = true;
    let mut world = World::with_replicas(view(2, &[1]), BTreeMap::new(), replicas);
    world.tick(200);
    assert_eq!(world.state(2), "syncing");
    world.replicas.get_mut(&ME).unwrap().io_error = true;
    world.write(1, 0, 3, false);
    world.outdate = Answer::Hold;
    assert!(matches!(world.done.get(&1), Some(Err(ClientError::Io(_)))));
    world.replicas.get_mut(&ME).unwrap().io_error = false;
    world.release(NodeId(2));
    world.release(NodeId(3));
    world.tick(5_000);
    assert_eq!(world.state(2), "up-to-date");
    assert_eq!(world.byte(2, 0), world.byte(1, 0));
    assert_eq!(world.byte(3, 0), world.byte(1, 0));
}

/// A read that found two bad copies repaired them with two writes of the same
/// range in flight at once: the engine's own check panicked.
#[test]
fn two_bad_copies_are_repaired_by_one_write() {
    let mut world = World::start(view(2, &[1, 2, 3]), BTreeMap::new(), Generation(1));
    world.tick(1_000);
    world.write(1, 8192, 4, false);
    world
        .replicas
        .get_mut(&NodeId(1))
        .unwrap()
        .corrupt
        .insert(2);
    world
        .replicas
        .get_mut(&NodeId(2))
        .unwrap()
        .corrupt
        .insert(2);
    assert_eq!(
        world.read(2, 8192),
        Some(Ok(Completion::Read(ReadData::Data(vec![4; 4096]))))
    );
    world.tick(200);
    assert!(world.replicas.values().all(|r| r.corrupt.is_empty()));
}

/// A write waiting for a quorum whose acknowledgements were lost with a link
/// waited forever: a member that reconnects was never sent it again.
#[test]
fn a_reconnected_member_gets_the_pending_writes_it_missed() {
    let mut world = World::start(view(2, &[1]), BTreeMap::new(), Generation(1));
    world.tick(3_000);
    world.view.in_sync = [ME].into_iter().collect();
    world.push_view();
    world.tick(300);
    world.replicas.get_mut(&NodeId(2)).unwrap().hold = true;
    world.replicas.get_mut(&NodeId(3)).unwrap().hold = true;
    world.write(1, 0, 6, false);
    world.drop_link(NodeId(2));
    world.drop_link(NodeId(3));
    world.replicas.get_mut(&NodeId(2)).unwrap().hold = false;
    world.replicas.get_mut(&NodeId(3)).unwrap().hold = false;
    assert_eq!(world.done.get(&1), None);
    world.tick(2_000);
    assert_eq!(world.done.get(&1), Some(&Ok(Completion::Done)));
}

/// A refused `MarkInSync` left the member outdated with its link up: it never
/// welcomed again, so it never resynced.
#[test]
fn a_refused_join_resyncs_later() {
    let mut world = World::build(view(2, &[1, 2]), BTreeMap::new(), replicas_at(1));
    world.in_sync = Answer::Hold;
    world.tick(1_000);
    assert!(world
        .proposed
        .contains(&Proposal::MarkInSync { node: NodeId(3) }));
    let (id, _) = world.held_proposals.pop().expect("held");
    world
        .engine
        .proposal_result(id, ProposalResult::Refused("evicting".into()), world.now);
    world.run();
    world.in_sync = Answer::Commit;
    world.tick(3_000);
    assert_eq!(world.state(3), "up-to-date");
}

/// The acknowledgement of a write sent after a flush used to count as the
/// flush's: a replica may complete them in either order.
#[test]
fn only_a_flush_acknowledgement_settles_its_regions() {
    let mut world = World::start(view(2, &[1, 2, 3]), BTreeMap::new(), Generation(1));
    world.tick(1_000);
    world.replicas.get_mut(&NodeId(3)).unwrap().hold = true;
    world.write(1, 0, 1, false);
    world.flush(2);
    world.write(3, 1 << 20, 2, false);
    // Node 3 acknowledges both writes, but its flush never completes before
    // it crashes: the write after the flush completed first.
    let replica = world.replicas.get_mut(&NodeId(3)).unwrap();
    let held: Vec<(LinkId, FromReplica)> = replica.held.drain(..).collect();
    replica.hold = false;
    assert_eq!(held.len(), 3);
    replica.durable[..4096].fill(0);
    world
        .outbox
        .push_back((NodeId(3), held[0].0, held[0].1.clone()));
    world
        .outbox
        .push_back((NodeId(3), held[2].0, held[2].1.clone()));
    world.run();
    world.crash(NodeId(3));
    world.replicas.get_mut(&NodeId(3)).unwrap().up = true;
    world.tick(3_000);
    assert_eq!(world.state(3), "up-to-date");
    assert_eq!(world.byte(3, 0), 1, "it copied what it lost");
    assert_eq!(world.byte(3, 1 << 20), 2);
}

/// A write that failed for want of a quorum after some members applied it
/// used to count as settled: the next messages told those members to forget
/// it, and a later primary never reconciled its region, so the members that
/// applied it kept data the others lack.
/// Members 2 and 3 stop answering (still linked), their outdating waits,
/// and a write at 2 MiB that only the primary's replica applied fails for
/// want of a quorum (op 1).
fn failed_for_want_of_quorum() -> World {
    let mut world = World::build_with(
        view(2, &[1, 2, 3]),
        BTreeMap::new(),
        replicas_at(1),
        NoQuorumPolicy::IoError,
    );
    world.tick(1_000);
    assert!(world.engine.is_serving());
    world.replicas.get_mut(&NodeId(2)).unwrap().hold = true;
    world.replicas.get_mut(&NodeId(3)).unwrap().hold = true;
    world.outdate = Answer::Hold;
    world.write(1, 2 << 20, 7, false);
    world.tick(9_000);
    assert!(matches!(world.done.get(&1), Some(Err(ClientError::Io(_)))));
    world
}

#[test]
fn a_failed_write_some_members_applied_stays_unsettled() {
    let mut world = failed_for_want_of_quorum();
    let failed = world
        .sent
        .iter()
        .find_map(|(_, m)| match m {
            ToReplica::Write { seq, offset, .. } if *offset == 2 << 20 => Some(*seq),
            _ => None,
        })
        .expect("sent");
    // Later writes must not declare it settled.
    world.replicas.get_mut(&NodeId(2)).unwrap().hold = false;
    world.write(2, 0, 8, false);
    let settled = world
        .sent
        .iter()
        .rev()
        .find_map(|(to, m)| match m {
            ToReplica::Write {
                settled, offset, ..
            } if *to == ME && *offset == 0 => Some(*settled),
            _ => None,
        })
        .expect("sent");
    assert!(
        settled <= failed,
        "settled {settled} passed the failed write {failed}"
    );
    // The next primary hears of its region from the primary's replica.
    let replica = world.replicas.get_mut(&ME).unwrap();
    let HelloOutcome::Accept {
        welcome: FromReplica::Welcome { unsettled, .. },
        ..
    } = replica
        .side
        .on_hello(1_000, Generation(3), NodeId(2), world.now + LEASE_HOLD_MS)
    else {
        panic!("accepted");
    };
    assert!(unsettled.contains(2), "{unsettled:?}");
}

/// A member joining the set (its `MarkInSync` in flight) that lost its link
/// and reconnected before the commit used to become up to date although
/// its copy differed: here the last up-to-date member came back as the
/// truth, and a write the joining member applied had failed.
#[test]
fn a_joining_member_that_differs_is_not_let_in() {
    let mut replicas = replicas_at(1);
    replicas.get_mut(&NodeId(2)).unwrap().reachable = false;
    let mut world = World::build(view(2, &[1]), BTreeMap::new(), replicas);
    world.in_sync = Answer::Hold;
    world.tick(1_000);
    assert!(world
        .proposed
        .contains(&Proposal::MarkInSync { node: NodeId(3) }));
    assert_eq!(world.state(3), "joining");
    // The only up-to-date member goes away; the joining one applies a
    // write that then fails.
    world.replicas.get_mut(&ME).unwrap().reachable = false;
    world.drop_link(ME);
    world.write(1, 0, 6, false);
    assert_eq!(world.byte(3, 0), 6);
    world.replicas.get_mut(&ME).unwrap().reachable = true;
    world.tick(500);
    assert!(matches!(world.done.get(&1), Some(Err(ClientError::Io(_)))));
    world.answer_held();
    world.in_sync = Answer::Commit;
    world.tick(3_000);
    assert_eq!(world.state(3), "up-to-date");
    assert_eq!(
        world.byte(3, 0),
        world.byte(1, 0),
        "node 3 kept a failed write"
    );
}

/// A member that failed a write while nobody else had it yet was not reset;
/// when resyncing members then applied it, the write waited forever for the
/// failed member to leave the set.
#[test]
fn a_member_that_failed_what_others_applied_is_reset() {
    let mut replicas = replicas_at(1);
    replicas.get_mut(&NodeId(2)).unwrap().hold = true;
    replicas.get_mut(&NodeId(3)).unwrap().hold = true;
    let mut world = World::with_replicas(view(2, &[1]), BTreeMap::new(), replicas);
    world.tick(200);
    assert_eq!(world.state(2), "syncing");
    // The write waits for the resyncing members' maps to be persisted;
    // meanwhile the only up-to-date member fails it, then the others apply.
    world.hold_persists = true;
    world.replicas.get_mut(&ME).unwrap().io_error = true;
    world.write(1, 0, 3, false);
    world.replicas.get_mut(&ME).unwrap().io_error = false;
    world.release(NodeId(2));
    world.release(NodeId(3));
    world.release_persists();
    world.tick(2_000);
    assert!(world.done.contains_key(&1), "the write is still waiting");
    world.write(2, 4096, 4, false);
    world.tick(3_000);
    assert_eq!(world.done.get(&2), Some(&Ok(Completion::Done)));
    assert_eq!(world.byte(2, 0), world.byte(1, 0));
}

/// The last up-to-date member came back after its link dropped, still
/// holding writes it had not flushed; the engine had moved them out of its
/// unflushed set and then forgot them, so when that member later crashed,
/// its resync skipped the regions it had lost.
#[test]
fn a_member_back_from_a_link_drop_still_holds_its_unflushed_writes() {
    let mut replicas = replicas_at(1);
    replicas.get_mut(&NodeId(2)).unwrap().reachable = false;
    // Two replicas and a tiebreaker (node 3): node 1 and the tiebreaker
    // make the quorum.
    let mut view = view(2, &[1]);
    view.diskful.remove(&NodeId(3));
    view.tiebreakers.insert(NodeId(3));
    let mut world = World::with_replicas(view, BTreeMap::new(), replicas);
    world.tick(1_000);
    world.write(1, 3 << 20, 5, false);
    assert_eq!(world.done.get(&1), Some(&Ok(Completion::Done)));
    world.flush(2);
    // Blocks of region 3 are unflushed on node 1 when its link drops.
    world.write(3, (3 << 20) + 4096, 6, false);
    world.replicas.get_mut(&ME).unwrap().reachable = false;
    world.drop_link(ME);
    world.replicas.get_mut(&ME).unwrap().reachable = true;
    world.tick(1_000);
    assert_eq!(world.state(1), "up-to-date");
    // Node 2 joins from node 1; then node 1 crashes before any flush.
    world.replicas.get_mut(&NodeId(2)).unwrap().reachable = true;
    world.tick(2_000);
    assert_eq!(world.state(2), "up-to-date");
    world.crash(ME);
    world.replicas.get_mut(&ME).unwrap().up = true;
    world.tick(5_000);
    assert_eq!(world.state(1), "up-to-date");
    assert_eq!(
        world.byte(1, (3 << 20) + 4096),
        world.byte(2, (3 << 20) + 4096)
    );
}

/// A member outdated while reconciliation was still copying a former
/// primary's unsettled regions (the source's disk was slow) got a backlog
/// without those regions: the copy, when it came, no longer went to it.
#[test]
fn a_member_outdated_during_reconciliation_copies_the_unsettled_regions() {
    let mut replicas = replicas_with_unsettled_write(2 << 20);
    // The source's (our own) disk is slow: the copy's read waits.
    replicas.get_mut(&ME).unwrap().hold = true;
    let mut world = World::with_replicas(view(3, &[1, 2, 3]), BTreeMap::new(), replicas);
    assert!(!world.engine.is_serving());
    world.drop_link(NodeId(3));
    assert!(!world.view.in_sync.contains(&NodeId(3)));
    let map = &world.maps[&NodeId(3)];
    assert!(map.full || map.regions.contains(2), "{map:?}");
}

/// A resync whose preferred source (the primary's own copy) had a bad block
/// in a region read that region again and again from it, in a tight loop,
/// even though another up-to-date copy was good; now it reads elsewhere and
/// repairs the bad copy.
#[test]
fn a_resync_reads_around_a_bad_source_and_repairs_it() {
    let mut replicas = replicas_at(1);
    replicas.get_mut(&ME).unwrap().corrupt.insert(300);
    replicas.get_mut(&NodeId(3)).unwrap().reachable = false;
    let mut world = World::with_replicas(view(2, &[1, 2]), BTreeMap::new(), replicas);
    world.tick(500);
    world.replicas.get_mut(&NodeId(3)).unwrap().reachable = true;
    world.tick(3_000);
    assert_eq!(world.state(3), "up-to-date");
    assert!(world.replicas[&ME].corrupt.is_empty(), "repaired");
}

/// Reconciliation copies a former primary's unsettled region from the
/// source; when every source failed that region's checksum (different bad
/// blocks), the region used to stay different on each member.
#[test]
fn a_reconcile_copy_falls_back_to_blocks() {
    let mut replicas = replicas_with_unsettled_write(2 << 20);
    // Nodes 1 and 2 applied a write node 3 missed; each copy has a bad
    // block elsewhere in the region.
    for node in [1, 2, 3] {
        let replica = replicas.get_mut(&NodeId(node)).unwrap();
        if node != 3 {
            replica.data[(2 << 20) + 4096] = 9;
        }
        replica.corrupt.insert((2 << 20) / 4096 + 10 * node);
    }
    let mut world = World::with_replicas(view(3, &[1, 2, 3]), BTreeMap::new(), replicas);
    world.tick(1_000);
    assert!(world.engine.is_serving());
    let byte = world.byte(1, (2 << 20) + 4096);
    assert_eq!(world.byte(2, (2 << 20) + 4096), byte);
    assert_eq!(world.byte(3, (2 << 20) + 4096), byte, "the copies differ");
}

/// A reconcile copy whose source's link dropped, with no other source,
/// was forgotten: the engine stayed in its copying phase forever.
#[test]
fn a_reconcile_copy_waits_for_a_source() {
    let mut replicas = replicas_with_unsettled_write(2 << 20);
    replicas.get_mut(&NodeId(2)).unwrap().reachable = false;
    replicas.get_mut(&NodeId(3)).unwrap().reachable = false;
    // The source (our own copy) is slow: its link drops before it answers.
    replicas.get_mut(&ME).unwrap().hold = true;
    let mut world = World::with_replicas(view(3, &[1]), BTreeMap::new(), replicas);
    world.tick(300);
    assert!(!world.engine.is_serving());
    world.drop_link(ME);
    world.replicas.get_mut(&ME).unwrap().hold = false;
    world.tick(2_000);
    assert!(world.engine.is_serving());
}

/// A reconcile copy that its only target could not apply (a disk error)
/// counted as failed everywhere, like a client write nobody applied; but a
/// copy's source holds it, so the target stayed up to date without the
/// region (found by the simulator with snapshots: seed 5720).
#[test]
fn a_member_that_fails_a_reconcile_copy_is_outdated() {
    let mut replicas = replicas_with_unsettled_write(2 << 20);
    // Only our own copy (the source) and node 2 are up to date, and node
    // 2's disk fails every write (but not its flushes).
    replicas.get_mut(&NodeId(2)).unwrap().write_error = true;
    let mut world = World::with_replicas(view(3, &[1, 2]), BTreeMap::new(), replicas);
    world.tick(1_000);
    assert!(
        world
            .proposed
            .contains(&Proposal::MarkOutdated { node: NodeId(2) }),
        "{:?}",
        world.proposed
    );
    assert!(!world.view.in_sync.contains(&NodeId(2)));
    assert!(world.engine.is_serving());
}

/// A member still in the set that may lack regions (its link dropped with
/// writes unflushed there, and its outdating is not answered yet) used to
/// be sent the snapshot barrier when its link came back, so its copy of the
/// snapshot could miss those writes for good (found by the simulator:
/// seeds 105499, 112083, 113575 and 115878 from 100000).
#[test]
fn a_member_that_lost_regions_gets_no_snapshot() {
    let mut world = World::start(view(2, &[1, 2, 3]), BTreeMap::new(), Generation(1));
    world.tick(200);
    assert!(world.engine.is_serving());
    world.write(1, 0, 5, false);
    assert!(matches!(world.done.get(&1), Some(Ok(_))));
    world.outdate = Answer::Hold;
    world.drop_link(NodeId(2));
    world.tick(200);
    assert!(world.replicas[&NodeId(2)].link.is_some(), "back");
    assert!(world.view.in_sync.contains(&NodeId(2)), "still in the set");
    world.engine.take_snapshot(SnapshotId(1), world.now);
    world.run();
    let barrier_to: BTreeSet<NodeId> = world
        .sent
        .iter()
        .filter(|(_, message)| matches!(message, ToReplica::Snapshot { .. }))
        .map(|(node, _)| *node)
        .collect();
    assert_eq!(
        barrier_to,
        [ME, NodeId(3)].into_iter().collect(),
        "the member that may lack the write gets no barrier"
    );
    assert!(
        world.snapshots.is_empty(),
        "it waits for the member to leave"
    );
    world.answer_held();
    world.tick(200);
    assert_eq!(
        world.snapshots.get(&SnapshotId(1)),
        Some(&Ok([ME, NodeId(3)].into_iter().collect())),
        "taken on the complete copies once the other is outdated"
    );
}

/// A former primary's write, unsettled on every replica, so the new primary
/// copies region 0 from a source to the others before it serves. Our own
/// copy, the first source, is slow; its link drops while the read waits,
/// the copy goes on from another source without it, and its link comes
/// back while its outdating is still unanswered: it is in the set, and
/// lacks region 0 as the others hold it.
fn reconciled_without_our_copy() -> World {
    let mut replicas = replicas_with_unsettled_write(0);
    replicas.get_mut(&ME).unwrap().hold = true;
    let mut world = World::build(view(3, &[1, 2, 3]), BTreeMap::new(), replicas);
    world.run();
    assert!(!world.engine.is_serving(), "the copy waits for our read");
    world.outdate = Answer::Hold;
    world.drop_link(ME);
    world.replicas.get_mut(&ME).unwrap().hold = false;
    assert!(world.engine.is_serving(), "copied from another source");
    world.tick(200);
    assert!(world.replicas[&ME].link.is_some());
    assert!(world.view.in_sync.contains(&ME));
    world
}

/// The member `reconciled_without_our_copy` leaves lacking region 0 used to
/// be sent the flush that ends reconciliation when its link came back. A
/// flush tells a replica that what older primaries left unsettled is
/// reconciled, so it stopped reporting the region; the outdating never
/// committed, and the next primary trusted its copy of the region (found by
/// the simulator: seed 209760 from 200000).
#[test]
fn a_member_that_lost_regions_keeps_reporting_them() {
    let mut world = reconciled_without_our_copy();
    world.write(1, 4 << 12, 7, false);
    assert!(
        !world
            .sent
            .iter()
            .any(|(node, message)| *node == ME && matches!(message, ToReplica::Flush { .. })),
        "no flush to the member that lacks the region"
    );
    world.flush(2);
    assert_eq!(world.done.get(&2), None, "the flush waits for the member");
    let replica = world.replicas.get_mut(&ME).unwrap();
    match replica
        .side
        .on_hello(999, Generation(4), NodeId(3), world.now + LEASE_HOLD_MS)
    {
        HelloOutcome::Accept {
            welcome: FromReplica::Welcome { unsettled, .. },
            ..
        } => assert!(
            unsettled.contains(0),
            "the next primary hears of the region: {unsettled:?}"
        ),
        other => panic!("the hello was refused: {other:?}"),
    }
    world.answer_held();
    assert!(
        matches!(world.done.get(&2), Some(Ok(_))),
        "the flush completes once the member is outdated: {:?}",
        world.done.get(&2)
    );
}

/// Writes failed for want of a quorum while two members, slow but still
/// linked, had not answered them. The control plane then outdated those
/// members, and the engine reset their links itself; the failed writes
/// kept waiting for answers that the reset links would never bring, and
/// the next snapshot barrier (and every write queued behind it) waited for
/// them for good. (sim-replication seed 1011911.)
#[test]
fn a_member_outdated_while_linked_does_not_hold_back_a_snapshot() {
    let mut world = failed_for_want_of_quorum();
    assert!(
        world.replicas[&NodeId(2)].link.is_some() && world.replicas[&NodeId(3)].link.is_some(),
        "both still linked when they are outdated"
    );
    world.answer_held();
    world.release(NodeId(2));
    world.release(NodeId(3));
    world.engine.take_snapshot(SnapshotId(1), world.now);
    // Sent at once to the primary's replica alone (the others are being
    // resynced), the barrier ends, with or without a quorum, within
    // NO_QUORUM_FAIL_MS.
    world.tick(10_000);
    assert!(
        world.snapshots.contains_key(&SnapshotId(1)),
        "the snapshot still waits; states {} {} {}",
        world.state(1),
        world.state(2),
        world.state(3)
    );
    world.write(2, 0, 8, false);
    world.tick(1_000);
    assert_eq!(world.done.get(&2), Some(&Ok(Completion::Done)));
}

/// A primary cut off from its replicas, and replaced, answered reads from
/// its own copy: the data the new primary overwrote, and its own writes
/// that failed (issue 19; `sim-replication` seed 728). Now a read needs a
/// lease from a quorum, and a replica welcomes the newer primary only once
/// the lease it granted has run out.
#[test]
fn a_replaced_primary_answers_no_read_once_its_lease_ran_out() {
    let mut world = World::build_with(
        view(2, &[1, 2, 3]),
        BTreeMap::new(),
        replicas_at(1),
        NoQuorumPolicy::IoError,
    );
    world.run();
    world.tick(1_000);
    world.write(1, 0, 0xaa, false);
    assert_eq!(world.done[&1], Ok(Completion::Done));
    assert!(matches!(world.read(2, 0), Some(Ok(_))));

    // Cut off: from the control plane too (its outdating never commits).
    world.outdate = Answer::Hold;
    for node in [2, 3] {
        world.replicas.get_mut(&NodeId(node)).unwrap().reachable = false;
        world.drop_link(NodeId(node));
    }
    let lease_end = world.engine.read_lease_until();
    assert!(lease_end > world.now, "the answers of a moment ago hold");
    // A newer primary reaches nodes 2 and 3: they welcome it only once our
    // lease has run out.
    for node in [2, 3] {
        let side = &mut world.replicas.get_mut(&NodeId(node)).unwrap().side;
        match side.on_hello(500 + node, Generation(3), NodeId(2), world.now) {
            HelloOutcome::Wait { until_ms } => assert!(
                until_ms >= lease_end,
                "node {node} would welcome at {until_ms}, within the lease (until {lease_end})"
            ),
            other => panic!("node {node} welcomed a newer primary at once: {other:?}"),
        }
    }
    world.tick(LEASE_HOLD_MS);
    for node in [2, 3] {
        let side = &mut world.replicas.get_mut(&NodeId(node)).unwrap().side;
        assert!(matches!(
            side.on_hello(500 + node, Generation(3), NodeId(2), world.now),
            HelloOutcome::Accept { .. }
        ));
    }
    // From here on the newer primary may write: we answer no read, not
    // from our copy, not through the engine.
    assert!(world.engine.read_lease_until() <= world.now);
    assert_eq!(world.read(3, 0), None, "the read waits for a lease");
    world.tick(NO_QUORUM_FAIL_MS + 200);
    assert!(
        matches!(world.done.get(&3), Some(Err(ClientError::Io(_)))),
        "{:?}",
        world.done.get(&3)
    );
}

/// SIGSTOP on the primary for 10 s during writes: on SIGCONT its first tick
/// judged the replicas' answers, which waited unread in its sockets, as
/// missing: both healthy replicas were reset and outdated, and the writes
/// in flight failed for want of quorum (issue 19). Time the engine did not
/// run no longer counts against its members; its read lease still runs out.
#[test]
fn a_stopped_primary_judges_no_member_by_the_time_it_did_not_run() {
    let mut world = World::build_with(
        view(2, &[1, 2, 3]),
        BTreeMap::new(),
        replicas_at(1),
        NoQuorumPolicy::IoError,
    );
    world.run();
    world.tick(1_000);
    // The answers of nodes 2 and 3 are on their way when the engine stops.
    world.replicas.get_mut(&NodeId(2)).unwrap().hold = true;
    world.replicas.get_mut(&NodeId(3)).unwrap().hold = true;
    for op in 1..=4 {
        world.write(op, op * 4096, op as u8, false);
    }
    assert!(world.done.is_empty());
    // Stopped for 10 s: the first tick after is the first thing it does.
    world.now += 10_000;
    world.engine.tick(world.now);
    assert!(
        world.engine.read_lease_until() <= world.now,
        "the lease is not stretched over the stop"
    );
    world.run();
    // Then its link readers hand it what waited.
    world.release(NodeId(2));
    world.release(NodeId(3));
    world.tick(6_000);
    for op in 1..=4 {
        assert_eq!(world.done.get(&op), Some(&Ok(Completion::Done)), "op {op}");
    }
    assert!(
        world.proposed.is_empty(),
        "no member is outdated: {:?}",
        world.proposed
    );
    for node in [2, 3] {
        assert_eq!(world.state(node), "up-to-date");
    }
    assert!(matches!(world.read(5, 4096), Some(Ok(_))));
}
