//! The engine over a perfect network with in-memory replicas: the happy
//! paths. The simulator (trireme-sim) covers faults.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use trireme_replication::driver::replica::{execute, ReplicaDriver, ReplicaStore, Step};
use trireme_replication::*;
use trireme_types::{Generation, NodeId, SnapshotId};

const SIZE: u64 = 8 << 20;

struct Replica {
    side: ReplicaSide,
    data: Vec<u8>,
    up: bool,
    /// Blocks that fail their checksum on this replica until rewritten.
    bad_blocks: BTreeSet<u64>,
    /// Its pool is full: data writes fail with ENOSPC.
    full: bool,
    /// 4 KiB blocks of zeros it was sent as data (a resync that inflates
    /// a thin copy).
    zero_blocks_written: u64,
}

/// A block's fingerprint as a store would give it (any hash of the bytes
/// does: equal bytes, equal fingerprints).
fn fingerprint(bytes: &[u8]) -> u128 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut hasher);
    let low = hasher.finish();
    (low as u128) << 64 | bytes.len() as u128
}

/// A replica's in-memory copy as the driver's [`ReplicaStore`]: admitted
/// messages are carried out by the driver's own `execute`, as on a node.
struct ReplicaCopy<'a>(RefCell<&'a mut Replica>);

impl ReplicaStore for ReplicaCopy<'_> {
    fn size_bytes(&self) -> u64 {
        self.0.borrow().data.len() as u64
    }

    fn write(&self, offset: u64, payload: Payload, _fua: bool) -> Result<(), ReplicaError> {
        let replica = &mut *self.0.borrow_mut();
        if replica.full && matches!(payload, Payload::Data(_)) {
            return Err(ReplicaError::NoSpace("p".into()));
        }
        let range = offset as usize..(offset + payload.length()) as usize;
        if let Payload::Data(data) = &payload {
            replica.zero_blocks_written += data
                .chunks(4096)
                .filter(|block| block.iter().all(|&byte| byte == 0))
                .count() as u64;
        }
        for block in range.start / 4096..range.end / 4096 {
            replica.bad_blocks.remove(&(block as u64));
        }
        match &payload {
            Payload::Data(data) => replica.data[range].copy_from_slice(data),
            Payload::Zeroes { .. } => replica.data[range].fill(0),
        }
        Ok(())
    }

    /// Nothing is volatile here: every write is durable at once.
    fn flush(&self) -> Result<(), ReplicaError> {
        Ok(())
    }

    fn read(&self, offset: u64, length: u64) -> Result<ReadData, ReplicaError> {
        let replica = self.0.borrow();
        let mut blocks = offset / 4096..(offset + length) / 4096;
        if blocks.any(|block| replica.bad_blocks.contains(&block)) {
            return Err(ReplicaError::Checksum(format!(
                "a block of {offset}+{length}"
            )));
        }
        Ok(ReadData::Data(
            replica.data[offset as usize..(offset + length) as usize].to_vec(),
        ))
    }

    fn hashes(&self, offset: u64, length: u64) -> Result<Vec<BlockHash>, ReplicaError> {
        let replica = self.0.borrow();
        Ok((offset / 4096..(offset + length) / 4096)
            .map(|block| {
                if replica.bad_blocks.contains(&block) {
                    BlockHash::Unreadable
                } else {
                    let at = (block * 4096) as usize;
                    BlockHash::Hash(fingerprint(&replica.data[at..at + 4096]))
                }
            })
            .collect())
    }

    fn snapshot(&self, _snapshot: SnapshotId) -> Result<(), ReplicaError> {
        Ok(())
    }
}

struct World {
    primary: Primary,
    replicas: BTreeMap<NodeId, Replica>,
    done: BTreeMap<OpId, Result<Completion, ClientError>>,
    outbox: VecDeque<(NodeId, FromReplica)>,
    now: u64,
    /// Every proposal the engine made, but progress reports.
    proposed: Vec<Proposal>,
}

fn view(in_sync: &[u64]) -> View {
    View {
        generation: Generation(2),
        primaries: [NodeId(1)].into_iter().collect(),
        diskful: [1, 2, 3].into_iter().map(NodeId).collect(),
        tiebreakers: BTreeSet::new(),
        in_sync: in_sync.iter().copied().map(NodeId).collect(),
        size_bytes: SIZE,
        growing: BTreeSet::new(),
    }
}

impl World {
    /// Runs a verify of the volume to its end (or 200 ticks) and returns
    /// its report.
    fn verify(&mut self) -> VerifyReport {
        self.primary.start_verify(self.now).unwrap();
        self.run();
        for _ in 0..200 {
            if self.primary.verify_report().unwrap().state != VerifyState::Running {
                break;
            }
            self.ticks(1);
        }
        self.primary.verify_report().unwrap().clone()
    }

    /// `count` ticks of the engine, 100 ms apart, each followed by
    /// everything it sends.
    fn ticks(&mut self, count: u32) {
        for _ in 0..count {
            self.now += 100;
            self.primary.tick(self.now);
            self.run();
        }
    }

    fn new(in_sync: &[u64]) -> World {
        World::with_down(in_sync, &[])
    }

    /// `down`: replicas unreachable from the start.
    fn with_down(in_sync: &[u64], down: &[u64]) -> World {
        let config = Config {
            me: NodeId(1),
            size_bytes: SIZE,
            view: view(in_sync),
            policy: NoQuorumPolicy::IoError,
            resync_rate: 0,
            dirty_maps: BTreeMap::new(),
        };
        let mut world = World {
            primary: Primary::new(config, 0),
            replicas: (1..=3)
                .map(|n| {
                    (
                        NodeId(n),
                        Replica {
                            side: ReplicaSide::new(Generation(1), None, true),
                            data: vec![0; SIZE as usize],
                            up: !down.contains(&n),
                            bad_blocks: BTreeSet::new(),
                            full: false,
                            zero_blocks_written: 0,
                        },
                    )
                })
                .collect(),
            done: BTreeMap::new(),
            outbox: VecDeque::new(),
            now: 0,
            proposed: Vec::new(),
        };
        world.run();
        world
    }

    fn run(&mut self) {
        loop {
            let actions = self.primary.take_actions();
            if actions.is_empty() && self.outbox.is_empty() {
                break;
            }
            for action in actions {
                self.act(action);
            }
            while let Some((from, message)) = self.outbox.pop_front() {
                self.primary.message(from, message, self.now);
            }
        }
    }

    fn act(&mut self, action: Action) {
        match action {
            Action::Connect { to } => {
                if self.replicas[&to].up {
                    self.primary.link_up(to, self.now)
                } else {
                    self.primary.link_down(to, self.now)
                }
            }
            Action::Send { to, message } => {
                let now = self.now;
                let replica = self.replicas.get_mut(&to).unwrap();
                if !replica.up {
                    return;
                }
                // The node's own replica driver decides, and its `execute`
                // carries the message out on this world's in-memory copy.
                let message =
                    match ReplicaDriver::new().receive(&mut replica.side, to.0, message, now, true)
                    {
                        Step::Reply(reply) | Step::Refuse(reply) => {
                            self.outbox.push_back((to, reply));
                            return;
                        }
                        Step::Welcome { welcome, .. } => {
                            self.outbox.push_back((to, welcome));
                            return;
                        }
                        Step::Wait { .. } => panic!("nothing to wait for here"),
                        Step::Close { .. } => return,
                        Step::DataForTiebreaker => panic!("every replica here holds data"),
                        Step::Store(message) => message,
                    };
                let reply = execute(&ReplicaCopy(RefCell::new(replica)), message);
                self.outbox.push_back((to, reply));
            }
            Action::Reset { to } => self.primary.link_down(to, self.now),
            Action::Complete { op, result } => {
                self.done.insert(op, result);
            }
            Action::Propose { id, proposal } => {
                if !matches!(proposal, Proposal::Progress { .. }) {
                    self.proposed.push(proposal.clone());
                    self.primary
                        .proposal_result(id, ProposalResult::Committed, self.now);
                }
            }
            Action::PersistDirty { token, .. } => self.primary.persisted(token, self.now),
            Action::ForgetDirty { .. }
            | Action::LocalReadable(_)
            | Action::Stopped { .. }
            | Action::SnapshotDone { .. } => {}
        }
    }

    fn write(&mut self, op: OpId, offset: u64, byte: u8) {
        let payload = Payload::data(vec![byte; 4096]);
        self.primary.client(
            op,
            ClientRequest::Write {
                offset,
                payload,
                fua: false,
            },
            self.now,
        );
        self.run();
    }
}

#[test]
fn a_write_reaches_every_replica_before_it_completes() {
    let mut world = World::new(&[1, 2, 3]);
    assert!(world.primary.is_serving());
    world.write(1, 4096, 7);
    assert_eq!(world.done[&1], Ok(Completion::Done));
    for replica in world.replicas.values() {
        assert_eq!(replica.data[4096], 7);
    }
    world.primary.client(
        2,
        ClientRequest::Read {
            offset: 4096,
            length: 4096,
        },
        0,
    );
    world.run();
    assert_eq!(
        world.done[&2],
        Ok(Completion::Read(ReadData::Data(vec![7; 4096])))
    );
}

#[test]
fn a_lost_replica_is_outdated_and_resynced_with_its_dirty_regions_only() {
    let mut world = World::new(&[1, 2, 3]);
    world.replicas.get_mut(&NodeId(3)).unwrap().up = false;
    world.primary.link_down(NodeId(3), 0);
    world.write(1, 3 << 20, 9);
    assert_eq!(world.done[&1], Ok(Completion::Done));
    assert_eq!(world.replicas[&NodeId(3)].data[3 << 20], 0);
    world.replicas.get_mut(&NodeId(3)).unwrap().up = true;
    world.primary.link_up(NodeId(3), 0);
    world.run();
    world.ticks(10);
    assert_eq!(world.replicas[&NodeId(3)].data[3 << 20], 9);
    // One region, and of it only the block that holds data.
    assert_eq!(world.primary.counters.resynced_bytes, 4096);
    let states = world.primary.member_states();
    assert!(
        states.iter().all(|(_, state, _)| state == "up-to-date"),
        "{states:?}"
    );
}

#[test]
fn a_new_replica_gets_a_full_sync() {
    let mut world = World::new(&[1, 2]);
    world.write(1, 0, 5);
    world.ticks(10);
    assert_eq!(world.replicas[&NodeId(3)].data[0], 5);
    // It joined before the write, when nothing was written: a thin volume
    // copies only what was written, here nothing (holes go as trims).
    assert_eq!(world.primary.counters.resynced_bytes, 0);
}

/// Issue 19, item 7: a resync copies data as data and the rest as holes:
/// nothing is written as zeros, and what the target held where the source
/// has nothing is trimmed.
#[test]
fn a_resync_keeps_holes_as_holes() {
    let mut world = World::with_down(&[1, 2], &[3]);
    // Scattered 4 KiB writes: a region with one block of data, one with
    // data every other block (finer than the piece limit), one with two
    // runs.
    world.write(1, 4096, 1);
    for block in 0..256u64 {
        if block % 2 == 0 {
            world.write(10 + block, (2 << 20) + block * 4096, 2);
        }
    }
    world.write(300, 5 << 20, 3);
    world.write(301, (5 << 20) + 8 * 4096, 3);
    // What the returning replica held before: stale data everywhere.
    world.replicas.get_mut(&NodeId(3)).unwrap().data.fill(0xee);
    world.replicas.get_mut(&NodeId(3)).unwrap().up = true;
    world.primary.link_up(NodeId(3), 0);
    world.run();
    world.ticks(10);
    let states = world.primary.member_states();
    assert!(
        states.iter().all(|(_, state, _)| state == "up-to-date"),
        "{states:?}"
    );
    assert!(
        world.replicas[&NodeId(3)].data == world.replicas[&NodeId(1)].data,
        "the resynced copy differs from its source"
    );
    // Every-other-block data goes in chunk-sized pieces (bounded message
    // count); everything else moves exactly its data blocks.
    let data_blocks = 1 + 128 + 2;
    let region_in_chunks = 256 * 4096;
    assert_eq!(
        world.primary.counters.resynced_bytes,
        (1 + 2) * 4096 + region_in_chunks,
        "{data_blocks} blocks of data, one region of them in whole chunks"
    );
    assert_eq!(
        world.replicas[&NodeId(3)].zero_blocks_written,
        128,
        "only the zero blocks inside chunks that hold data may go as data"
    );
}

/// Issue 19, item 16: resync progress counts the regions that hold data,
/// not the volume's size.
#[test]
fn resync_progress_counts_the_regions_with_data() {
    let mut world = World::with_down(&[1, 2], &[3]);
    world.primary.set_data_regions(RegionSet::new());
    world.write(1, 0, 1);
    world.write(2, 5 << 20, 2);
    world.replicas.get_mut(&NodeId(3)).unwrap().up = true;
    world.primary.link_up(NodeId(3), 0);
    // The hello and its welcome only: the copies are on their way.
    for action in world.primary.take_actions() {
        world.act(action);
    }
    while let Some((from, message)) = world.outbox.pop_front() {
        world.primary.message(from, message, world.now);
    }
    let states = world.primary.member_states();
    let progress = states
        .iter()
        .find(|(node, _, _)| *node == NodeId(3))
        .and_then(|(_, _, progress)| *progress)
        .expect("n3 is syncing");
    assert_eq!(progress.done_bytes, 0);
    assert_eq!(
        progress.total_bytes,
        2 * REGION_BYTES,
        "two regions hold data in a volume of {SIZE} bytes"
    );
    world.run();
    assert!(world.replicas[&NodeId(3)].data == world.replicas[&NodeId(1)].data);
}

/// Issue 19, item 6: when every replica's pool is full, the write fails
/// with ENOSPC and nobody is outdated; when one replica alone is full, it
/// is the faulty one.
#[test]
fn enospc_from_every_replica_is_an_answer_not_a_fault() {
    let mut world = World::new(&[1, 2, 3]);
    for replica in world.replicas.values_mut() {
        replica.full = true;
    }
    world.write(1, 0, 1);
    assert!(
        matches!(world.done[&1], Err(ClientError::NoSpace(_))),
        "{:?}",
        world.done[&1]
    );
    assert!(world.proposed.is_empty(), "{:?}", world.proposed);
    let states = world.primary.member_states();
    assert!(
        states.iter().all(|(_, state, _)| state == "up-to-date"),
        "{states:?}"
    );
    // Room again: writes go on, on every replica.
    for replica in world.replicas.values_mut() {
        replica.full = false;
    }
    world.write(2, 0, 2);
    assert_eq!(world.done[&2], Ok(Completion::Done));

    // Only n2 is full: the others applied the write, so n2 is outdated.
    world.replicas.get_mut(&NodeId(2)).unwrap().full = true;
    world.write(3, 4096, 3);
    assert_eq!(world.done[&3], Ok(Completion::Done));
    assert_eq!(
        world.proposed,
        vec![Proposal::MarkOutdated { node: NodeId(2) }]
    );
}

#[test]
fn verify_repairs_the_minority_and_reports_what_it_changed() {
    let mut world = World::new(&[1, 2, 3]);
    world.write(1, 0, 0x11);
    world.write(2, 5 << 20, 0x22);
    // Silent divergence on n3 (the bytes differ, its checksums are fine),
    // an unreadable block on n2, and a block on which n1 (the primary)
    // alone differs.
    world.replicas.get_mut(&NodeId(3)).unwrap().data[100] = 0x99;
    world
        .replicas
        .get_mut(&NodeId(2))
        .unwrap()
        .bad_blocks
        .insert((5 << 20) / 4096);
    world.replicas.get_mut(&NodeId(1)).unwrap().data[(7 << 20) + 1] = 0x77;
    let report = world.verify();
    assert_eq!(report.state, VerifyState::Done, "{report:?}");
    assert_eq!(report.checked_bytes, SIZE);
    assert_eq!(report.differing_blocks, 3, "{report:?}");
    assert_eq!(report.no_majority_blocks, 0);
    assert_eq!(report.unrecoverable_blocks, 0);
    let repaired: Vec<(u64, u64)> = report.repaired.iter().map(|(n, c)| (n.0, *c)).collect();
    assert_eq!(repaired, vec![(1, 1), (2, 1), (3, 1)]);
    let first = world.replicas[&NodeId(1)].data.clone();
    assert_eq!(first[100], 0x11);
    assert_eq!(first[(7 << 20) + 1], 0);
    for replica in world.replicas.values() {
        assert!(replica.data == first, "replicas differ after verify");
        assert!(replica.bad_blocks.is_empty());
    }
}

#[test]
fn verify_without_a_majority_keeps_the_primary_copy_and_says_so() {
    let mut world = World::new(&[1, 2]);
    // n3 is not in sync (it resyncs): only n1 and n2 are compared.
    world.replicas.get_mut(&NodeId(3)).unwrap().up = false;
    world.primary.link_down(NodeId(3), 0);
    world.run();
    world.write(1, 0, 0x11);
    world.replicas.get_mut(&NodeId(2)).unwrap().data[10] = 0x55;
    let report = world.verify();
    assert_eq!(report.state, VerifyState::Done, "{report:?}");
    assert_eq!((report.differing_blocks, report.no_majority_blocks), (1, 1));
    assert_eq!(world.replicas[&NodeId(2)].data[10], 0x11);
    // Starting needs two up-to-date replicas to compare.
    world.replicas.get_mut(&NodeId(2)).unwrap().up = false;
    world.primary.link_down(NodeId(2), world.now);
    world.run();
    let refused = world.primary.start_verify(world.now).unwrap_err();
    assert!(refused.contains("1 of them is reachable"), "{refused}");
}

/// A running engine grows: it takes the recorded size only once every
/// in-sync replica is reported grown, writes past the old end reach only
/// copies that hold them, and a replica that was away is held outdated
/// until its node grows its copy, then resynced, grown part included.
#[test]
fn a_running_engine_grows_once_the_in_sync_copies_hold_the_new_size() {
    // Not a whole number of regions: the region across the old end counts.
    let grown = SIZE + (3 << 19) + 4096;
    let mut world = World::with_down(&[1, 2], &[3]);
    world.write(1, SIZE - 4096, 0x31);
    let view_growing = |growing: &[u64]| View {
        size_bytes: grown,
        growing: growing.iter().copied().map(NodeId).collect(),
        ..view(&[1, 2])
    };
    let grow_copy = |world: &mut World, node: u64| {
        world
            .replicas
            .get_mut(&NodeId(node))
            .unwrap()
            .data
            .resize(grown as usize, 0);
    };
    world.primary.view(view_growing(&[1, 2, 3]), world.now);
    world.run();
    assert_eq!(world.primary.size_bytes(), SIZE, "no copy is grown yet");
    grow_copy(&mut world, 1);
    world.primary.view(view_growing(&[2, 3]), world.now);
    world.run();
    assert_eq!(world.primary.size_bytes(), SIZE, "n2 is in sync, not grown");
    grow_copy(&mut world, 2);
    world.primary.view(view_growing(&[3]), world.now);
    world.run();
    assert_eq!(
        world.primary.size_bytes(),
        grown,
        "every in-sync copy is grown; n3 is outdated"
    );
    // Past the old end, in the region across it, and in the last block.
    world.write(2, SIZE, 0x32);
    world.write(3, grown - 4096, 0x33);
    assert_eq!(world.done[&2], Ok(Completion::Done));
    assert_eq!(world.done[&3], Ok(Completion::Done));
    for node in [1, 2] {
        let data = &world.replicas[&NodeId(node)].data;
        assert_eq!(
            (data[SIZE as usize], data[grown as usize - 1]),
            (0x32, 0x33)
        );
    }
    // n3 comes back with its copy still small: it gets nothing.
    world.replicas.get_mut(&NodeId(3)).unwrap().up = true;
    world.primary.link_up(NodeId(3), world.now);
    world.run();
    world.ticks(10);
    assert_eq!(world.replicas[&NodeId(3)].data.len() as u64, SIZE);
    let states = world.primary.member_states();
    assert!(
        states.contains(&(NodeId(3), "outdated".into(), None)),
        "{states:?}"
    );
    // Its node grows it: the engine resyncs it, grown part included.
    grow_copy(&mut world, 3);
    world.primary.view(view_growing(&[]), world.now);
    world.run();
    world.primary.link_up(NodeId(3), world.now);
    world.run();
    world.ticks(20);
    let data = &world.replicas[&NodeId(3)].data;
    assert_eq!(
        (
            data[SIZE as usize - 1],
            data[SIZE as usize],
            data[grown as usize - 1]
        ),
        (0x31, 0x32, 0x33)
    );
    let states = world.primary.member_states();
    assert!(
        states.iter().all(|(_, state, _)| state == "up-to-date"),
        "{states:?}"
    );
    // A verify covers the grown volume.
    let report = world.verify();
    assert_eq!(report.state, VerifyState::Done, "{report:?}");
    assert_eq!((report.checked_bytes, report.differing_blocks), (grown, 0));
}
