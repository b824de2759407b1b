//! The engine over a perfect network with in-memory replicas: the happy
//! paths. The simulator (trireme-sim) covers faults.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use trireme_replication::*;
use trireme_types::{Generation, NodeId};

const SIZE: u64 = 8 << 20;

struct Replica {
    side: ReplicaSide,
    data: Vec<u8>,
    up: bool,
}

struct World {
    primary: Primary,
    replicas: BTreeMap<NodeId, Replica>,
    done: BTreeMap<OpId, Result<Completion, ClientError>>,
    outbox: VecDeque<(NodeId, FromReplica)>,
    now: u64,
}

fn view(in_sync: &[u64]) -> View {
    View {
        generation: Generation(2),
        primaries: [NodeId(1)].into_iter().collect(),
        diskful: [1, 2, 3].into_iter().map(NodeId).collect(),
        tiebreakers: BTreeSet::new(),
        in_sync: in_sync.iter().copied().map(NodeId).collect(),
    }
}

impl World {
    fn new(in_sync: &[u64]) -> World {
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
                            up: true,
                        },
                    )
                })
                .collect(),
            done: BTreeMap::new(),
            outbox: VecDeque::new(),
            now: 0,
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
                let replica = self.replicas.get_mut(&to).unwrap();
                if !replica.up {
                    return;
                }
                let reply = match &message {
                    ToReplica::Hello {
                        generation,
                        primary,
                    } => match replica.side.on_hello(to.0, *generation, *primary) {
                        HelloOutcome::Refuse(reply) => reply,
                        HelloOutcome::Accept { welcome, .. } => welcome,
                    },
                    ToReplica::Write {
                        seq,
                        offset,
                        payload,
                        ..
                    } => {
                        replica.side.admit(to.0, &message).unwrap();
                        let range = *offset as usize..(*offset + payload.length()) as usize;
                        match payload {
                            Payload::Data(data) => replica.data[range].copy_from_slice(data),
                            Payload::Zeroes { .. } => replica.data[range].fill(0),
                        }
                        FromReplica::Ack {
                            seq: *seq,
                            result: Ok(()),
                        }
                    }
                    ToReplica::Goodbye => {
                        replica.side.on_goodbye(to.0);
                        return;
                    }
                    ToReplica::Flush { seq } => FromReplica::Ack {
                        seq: *seq,
                        result: Ok(()),
                    },
                    ToReplica::Read { id, offset, length } => FromReplica::ReadReply {
                        id: *id,
                        result: Ok(ReadData::Data(
                            replica.data[*offset as usize..(*offset + *length) as usize].to_vec(),
                        )),
                    },
                };
                self.outbox.push_back((to, reply));
            }
            Action::Reset { to } => self.primary.link_down(to, self.now),
            Action::Complete { op, result } => {
                self.done.insert(op, result);
            }
            Action::Propose { id, proposal } => {
                if !matches!(proposal, Proposal::Progress { .. }) {
                    self.primary
                        .proposal_result(id, ProposalResult::Committed, self.now);
                }
            }
            Action::PersistDirty { token, .. } => self.primary.persisted(token, self.now),
            Action::ForgetDirty { .. } | Action::LocalReadable(_) | Action::Stopped { .. } => {}
        }
    }

    fn write(&mut self, op: OpId, offset: u64, byte: u8) {
        let payload = Payload::Data(Arc::from(vec![byte; 4096]));
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
    for _ in 0..10 {
        world.now += 100;
        world.primary.tick(world.now);
        world.run();
    }
    assert_eq!(world.replicas[&NodeId(3)].data[3 << 20], 9);
    assert_eq!(world.primary.counters.resynced_bytes, REGION_BYTES);
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
    for _ in 0..10 {
        world.now += 100;
        world.primary.tick(world.now);
        world.run();
    }
    assert_eq!(world.replicas[&NodeId(3)].data[0], 5);
    assert_eq!(world.primary.counters.resynced_bytes, SIZE);
}
