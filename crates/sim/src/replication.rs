//! A deterministic simulator of the replication protocol.
//!
//! # What runs
//!
//! [`run_replication_sim`] drives the real sans-IO machines of
//! `trireme_replication`, a [`Primary`] engine on the primary node and a
//! [`ReplicaSide`] on every member, through the node's own drivers
//! (`trireme_replication::driver`: the [`ReplicaDriver`] decides what a
//! replica does with each message, the [`PrimaryDriver`] what an engine
//! proposes to the control plane and what the answers and the volume's
//! record mean to it), with the real message codec between them and the
//! control crate's real `ClusterState::apply` as the arbiter, over a
//! simulated world in which every
//! choice comes from the seed: a discrete-event loop with a clock in
//! milliseconds, no threads and no real time. One seed is one history;
//! running it again replays it exactly (same [`ReplicationSimReport`], down to
//! the digest of every event). What this file adds around the drivers is
//! only I/O: links, disks, persists, the arbiter's delays and losses.
//!
//! The world:
//!
//! - **Nodes**: 2 to 5 diskful replicas, sometimes with a tiebreaker (a
//!   `ReplicaSide` without a disk, which only answers hellos). Each node has
//!   a durable state that survives crashes: the accepted generation, the
//!   generation it was primary at, the clean flag, and the dirty maps its
//!   primary persisted. A crash loses the in-memory `ReplicaSide`, the
//!   engine if it ran there, pending persists and the disk's volatile layer;
//!   a restart rebuilds the side with `ReplicaSide::new(accepted,
//!   primary_at, clean).after_restart(now)`.
//! - **Disks**: blocks of 4 KiB with a volatile layer and a durable layer. A
//!   write lands in the volatile layer (FUA: durable too), a flush makes the
//!   volatile layer durable. Operations complete after seeded delays and out
//!   of order, except that an operation waits for every earlier overlapping
//!   one and a flush for every earlier write (what a store with per-block
//!   ordering does). Faults: slow periods, stalls longer than the engine's
//!   ack timeout, I/O error periods, bit flips of durable blocks (reads of
//!   such a block fail with `ReplicaError::Checksum` until it is rewritten),
//!   full pools (every replica's at once: the data of writes issued then
//!   fits nowhere, so every replica answers them `NoSpace`; or one
//!   replica's for a while, which fails every data write there), and at a
//!   crash, lost unflushed writes and torn in-flight writes (a
//!   random part of their blocks reached the platter).
//! - **Links**: one FIFO, reliable channel per (engine, member) and
//!   connection, with seeded latencies; different links reorder freely.
//!   What travels is bytes: every message is encoded with the real
//!   `ToReplica::encode` / `FromReplica::encode` when sent and decoded with
//!   `decode` when it arrives (a frame that does not decode, or is larger
//!   than `MAX_FRAME_BYTES`, fails the seed). The length prefix around a
//!   frame is crates/node's `replicated/wire.rs`, not run here. A
//!   dropped link loses what is in flight both ways and is never resumed;
//!   the replica keys its links by link id, so nothing of an old link is
//!   ever applied. The driver reconnects after a delay. Partitions cut a set
//!   of nodes off (from the others and from the control plane) for a while;
//!   control-plane partitions cut one node (mostly the primary's) off from
//!   the control plane only, so that a primary the control plane replaced
//!   still reaches the replicas, which must fence it.
//! - **Stopped processes**: the primary's node stops (SIGSTOP) for 6 to
//!   15 s. Nothing there runs meanwhile: what arrives for its engine, its
//!   replica, its disk and persists waits. When it continues, its engine
//!   ticks first (the worst order: its timer fired while it was stopped),
//!   then everything that waited is handled in the order it arrived.
//! - **Control plane**: a linearizable arbiter holding a real
//!   `trireme_control::ClusterState` (the run's nodes and the one volume,
//!   made by the commands a cluster is made with). An engine's proposals
//!   become commands in the node's [`PrimaryDriver`]
//!   (`Command::MarkOutdated`/`MarkInSync` with the engine's generation and
//!   node; progress reports are dropped), attributed to that node and
//!   applied by the control crate's own `apply`: its fencing check (the
//!   current generation, from a current primary) and its last-up-to-date
//!   rule refuse, and the driver maps the answer as on the node. The
//!   leader's refusal of a replica being evicted is simulated
//!   (`refuse_in_sync`). Answers are delayed, sometimes unavailable,
//!   sometimes lost after the commit. After every command the running
//!   engines are given the volume's record after a delay, through the
//!   driver (a view, a detach or a stop, as on the node).
//!   Attaching is `Command::AttachVolume` with `force_takeover` (or
//!   `ReattachVolume` when the node is still a primary: its engine died
//!   with a crash), which moves the generation on; it starts an engine with
//!   the view and the node's persisted dirty maps, when the primary
//!   crashed, was cut off for a while or detached, and at random (a forced
//!   move, the old engine fenced while it still runs). A detach is
//!   `Command::DetachVolume`. The state's nodes always count as online:
//!   the simulator decides when to fail over.
//! - **Replica driver**: the node's [`ReplicaDriver`] handles each message
//!   of a link, in order; the simulator carries out its [`Step`]: a
//!   welcome only after its persist completed, a refusal then the link
//!   closed, a goodbye's clean flag persisted, a hello that waits delivered
//!   again when the wait is over, an admitted message to the disk. Half of
//!   the seeds also close a replica's links of older generations (with a
//!   refusal) as soon as it accepts a newer one.
//! - **Clients**: on every running engine (also fenced ones still running
//!   behind a partition), random 4 KiB-aligned writes of 1 to 16 blocks with
//!   unique content, FUA writes, zero and trim writes, flushes and reads,
//!   several in flight and often overlapping; reads through the engine, and
//!   local reads straight from the primary's disk while the engine says
//!   `LocalReadable(true)`. After each failover, a read sweep of the whole
//!   volume through the new engine.
//! - **Settling**: after the steps, every fault is healed and every node
//!   restarted; the control plane attaches a primary if needed, and the run
//!   waits (up to 15 simulated minutes) for every replica to be up to date.
//!   Meanwhile an operator restores blocks that are bad on every up-to-date
//!   copy (the data is gone; a client write replaces it) and scrubs the
//!   volume block by block every 10 s (read failover repairs blocks bad on
//!   one copy), since no protocol can copy a block bad everywhere.
//! - **Grows**: on half of the seeds the operator grows the volume at
//!   random points (`Command::GrowVolume`, applied by the arbiter; disks
//!   and the model have [`GROW_ROOM_BYTES`] of room). Each node's agent
//!   grows its copy after a seeded delay (later while the node is down,
//!   stopped or cut off) and reports it ready at its size after another,
//!   so a report can reach the control plane after a later grow (which
//!   must then keep the replica pending). A replica refuses what lies past
//!   its copy's end, as a store does. Client requests stay inside the size
//!   the engine they go to serves.
//!
//! # What is checked
//!
//! A reference model keeps, per block, the acknowledged versions since the
//! last durable one (in the order the replicas apply them: by generation,
//! then completion), the values of writes whose outcome is unknown (failed,
//! or cut off by a crash or a fence) until a later write supersedes them, and
//! whether the newest version may have been lost (only when no reachable
//! in-sync replica holds it any more after a crash or an outdating).
//!
//! 1. **No acknowledged write lost, no stale read**: a read completed by
//!    any engine, a fenced one still running behind a partition included,
//!    returns per block the newest version acknowledged (by any engine)
//!    before the read was issued, or a write in flight during the read, or
//!    one of unknown outcome not yet superseded, or (only when the model
//!    says it may have been lost) an older version since the last durable
//!    one.
//! 2. **Durability**: versions made durable (FUA, or acknowledged before a
//!    completed flush was issued) never fall out of the model, so every read
//!    checks them; each failover is followed by a read sweep, and the run
//!    ends with a crash, a failover and a last sweep (on most seeds).
//! 3. **One primary**: no replica carries out a message of a link whose
//!    generation is older than the one it accepted; and a write acknowledged
//!    by an engine whose generation is older than the arbiter's must have
//!    been received, before they moved on, by every in-sync replica that
//!    already accepted a newer generation (so it is part of what the new
//!    primary carries on).
//! 4. **Convergence**: after healing everything and letting a final engine
//!    resync, every diskful replica is in the in-sync set, all of them hold
//!    identical content, equal to the model, all of it durable after a final
//!    flush; no fenced engine still runs; no client request is left hanging.
//! 5. **In-sync replicas hold every acknowledged write**: when the current
//!    engine acknowledges a write, every replica in the arbiter's in-sync
//!    set that has not crashed since the write was issued holds it.
//!
//! 6. **A full pool is an answer, not a fault**: in a run whose only faults
//!    are pools full on every replica at once
//!    ([`ReplicationSimConfig::only_full_pools`]), no replica is ever
//!    outdated and no write fails with EIO (the client gets ENOSPC).
//! 7. **Time the primary did not run does not count against its
//!    replicas**: in a run whose only fault is the primary's process
//!    stopped for a while ([`ReplicationSimConfig::only_pauses`]), no
//!    replica is ever outdated and no client request fails.
//! 8. **A grow reaches only copies that hold it**: a running engine sends
//!    no replica a write, read or fingerprint request past the end of its
//!    copy, beyond the size the engine started with; after convergence
//!    every copy is grown, the engine serves the recorded size, and no
//!    copy holds data past it.
//!
//! Besides, the current engine must never stop except when detached, the
//! engine's own assertions must hold (a panic fails the seed), and the
//! primary never sends data to a tiebreaker.
//!
//! Knobs test the checks themselves: [`ReplicationSimConfig::drop_writes`]
//! (a replica acknowledges writes it does not apply), and the bug switches
//! of the production code it runs (feature `bug-switches` of
//! `trireme-replication`): [`ReplicationSimConfig::ignore_fencing`]
//! (replicas carry out what fenced primaries send),
//! [`ReplicationSimConfig::welcome_without_persist`],
//! [`ReplicationSimConfig::ignore_refused_outdate`],
//! [`ReplicationSimConfig::ack_before_quorum`] and, in the control plane's
//! `apply` (feature `bug-switches` of `trireme-control`),
//! [`ReplicationSimConfig::control_skips_fence_check`] and
//! [`ReplicationSimConfig::control_ready_ignores_size`]; runs with any should fail
//! (crates/sim/tests/replication_sim.rs shows that they do).
//!
//! `TRIREME_SIM_WATCH=<block>` adds that block's content to the traced disk
//! writes, which is what a divergence usually needs.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::panic::AssertUnwindSafe;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use trireme_control::{
    Actor, ClusterState, Command, CommandError, ControlBugs, NodeRegistration, PoolRecord,
    PoolReport, ReplicaKind, ReplicaObserved, ReplicaRecord, Reply,
};
use trireme_replication::driver::primary::{
    view_of, ControlPlane, PrimaryBugs, PrimaryDriver, ProposeError,
};
use trireme_replication::driver::replica::{DurableSide, ReplicaBugs, ReplicaDriver, Step};
use trireme_replication::message::MAX_FRAME_BYTES;
use trireme_replication::primary::EngineBugs;
use trireme_replication::{
    Action, BlockHash, ClientError, ClientRequest, Completion, Config as EngineConfig, DirtyMap,
    FromReplica, LinkId, NoQuorumPolicy, Payload, Primary, Proposal, ReadData, ReplicaError,
    ReplicaSide, ToReplica, VerifyState, View, REGION_BYTES,
};
use trireme_types::{DeviceClass, Generation, NodeId, NodeName, PoolName, SnapshotId, VolumeName};

const BLOCK: u64 = 4096;
/// How often the engines' `tick` runs.
const TICK_MS: u64 = 100;
/// How many recent events a failure message shows.
const EVENTS_SHOWN: usize = 120;
/// The settle phase must converge within this much simulated time.
const SETTLE_LIMIT_MS: u64 = 900_000;
/// More events than this in one run is a livelock.
const MAX_EVENTS: u64 = 20_000_000;
/// No volatile copy of a block.
const NONE: u64 = u64::MAX;
/// Reads in flight at once for a verification sweep.
const SWEEP_WINDOW: usize = 4;
/// Blocks per sweep read.
const SWEEP_BLOCKS: u64 = 16;
/// How much a run's volume may grow in all: disks and the model are made
/// this much larger than the volume from the start.
pub const GROW_ROOM_BYTES: u64 = 3 << 20;

type Time = u64;
type EngineId = u64;

/// What a run does. Probabilities are per step.
#[derive(Debug, Clone)]
pub struct ReplicationSimConfig {
    /// Replicas with a disk: 2 to 5.
    pub diskful: usize,
    /// Diskless voters: 0 or 1.
    pub tiebreakers: usize,
    /// The volume's size, a multiple of 4 KiB.
    pub size_bytes: u64,
    /// Diskful replicas in the in-sync set at the start (the others need a
    /// full sync first).
    pub initial_in_sync: usize,
    /// Steps of faults and workload before the settle phase.
    pub steps: usize,
    /// Simulated time per step.
    pub step_ms: u64,
    pub policy: NoQuorumPolicy,
    /// The engines' resync rate in bytes per second; 0: unlimited.
    pub resync_rate: u64,
    /// A replica closes its links of older generations (sending a refusal)
    /// when it accepts a newer one; otherwise they stay open until their
    /// next message is refused.
    pub fence_closes_old_links: bool,
    pub crash: f64,
    pub partition: f64,
    /// A node cut off from the control plane only: its links work, its
    /// proposals and views do not (a primary that must be fenced by the
    /// replicas).
    pub control_partition: f64,
    pub link_drop: f64,
    pub slow_disk: f64,
    pub stall: f64,
    pub io_error: f64,
    pub bit_flip: f64,
    /// Per step: every replica's pool is full for a while (writes issued
    /// meanwhile fit nowhere: every replica answers `NoSpace`).
    pub pools_full: f64,
    /// Per step: one replica's pool is full for a while (it fails every
    /// data write; the others apply them).
    pub pool_full: f64,
    /// Per step: the primary's node stops for 6 to 15 s (SIGSTOP), then
    /// goes on. Not in the seeds' mix: its check needs a run without other
    /// faults.
    pub pause: f64,
    /// A forced move of the primary elsewhere while the old one runs.
    pub failover: f64,
    /// A clean detach, then an attach elsewhere.
    pub detach: f64,
    /// Per step: the current engine starts a `verify` of the replicas.
    pub verify: f64,
    /// Per step: the current engine is asked for a snapshot.
    pub snapshot: f64,
    /// Per step: the volume grows (the control plane records a larger
    /// size; each node's agent grows its copy and reports it later), by
    /// up to [`GROW_ROOM_BYTES`] in all.
    pub grow: f64,
    /// Per proposal: the control plane has no leader.
    pub unavailable: f64,
    /// Per proposal: committed, but the answer is lost.
    pub answer_lost: f64,
    /// Per `MarkInSync`: refused.
    pub refuse_in_sync: f64,
    /// Client requests in flight per engine.
    pub max_outstanding: usize,
    /// Per step and engine: a new client request.
    pub op_rate: f64,
    /// End with a crash, a failover and a last sweep.
    pub final_crash: bool,
    /// A test of the checks themselves: per write, a replica acknowledges
    /// it without applying it. Runs with it should fail.
    pub drop_writes: f64,
    /// Another test of the checks: replicas carry out data messages of
    /// links their generation fenced, and welcome a newer generation
    /// without waiting out the leases they granted to older ones (two
    /// primaries write). Runs with it should fail.
    pub ignore_fencing: bool,
    /// A bug switch: replicas send the welcome without persisting the
    /// accepted generation (and `clean = false`) first. Runs with it
    /// should fail.
    pub welcome_without_persist: bool,
    /// A bug switch: an engine takes a MarkOutdated the control plane
    /// refused (fenced, or the last up-to-date member) as committed.
    /// Runs with it should fail.
    pub ignore_refused_outdate: bool,
    /// A bug switch: the engine completes a write to the client before
    /// its quorum acknowledged it. Runs with it should fail.
    pub ack_before_quorum: bool,
    /// A bug switch of the control plane itself: its `apply` takes
    /// `MarkOutdated` and `MarkInSync` from a primary it replaced (or at an
    /// old generation). Unlike [`Self::ignore_fencing`], where replicas
    /// carry out what a fenced primary sends them, here the replicas fence
    /// correctly and the arbiter accepts the fenced primary's word about
    /// who is up to date. Runs with it should fail.
    pub control_skips_fence_check: bool,
    /// A bug switch of the control plane: it records a replica ready on a
    /// report made before a grow committed (its copy is smaller than the
    /// volume). Runs with it and grows should fail.
    pub control_ready_ignores_size: bool,
    /// Print every event to stderr.
    pub trace: bool,
}

impl Default for ReplicationSimConfig {
    fn default() -> Self {
        ReplicationSimConfig {
            diskful: 3,
            tiebreakers: 0,
            size_bytes: 5 << 20,
            initial_in_sync: 3,
            steps: 2_500,
            step_ms: 20,
            policy: NoQuorumPolicy::IoError,
            resync_rate: 0,
            fence_closes_old_links: true,
            crash: 0.0015,
            partition: 0.0012,
            control_partition: 0.0012,
            link_drop: 0.004,
            slow_disk: 0.002,
            stall: 0.0006,
            io_error: 0.001,
            bit_flip: 0.003,
            pools_full: 0.0,
            pool_full: 0.0,
            pause: 0.0,
            failover: 0.0008,
            detach: 0.0006,
            verify: 0.0008,
            snapshot: 0.0015,
            grow: 0.0,
            unavailable: 0.1,
            answer_lost: 0.05,
            refuse_in_sync: 0.05,
            max_outstanding: 6,
            op_rate: 0.6,
            final_crash: true,
            drop_writes: 0.0,
            ignore_fencing: false,
            welcome_without_persist: false,
            ignore_refused_outdate: false,
            ack_before_quorum: false,
            control_skips_fence_check: false,
            control_ready_ignores_size: false,
            trace: false,
        }
    }
}

impl ReplicationSimConfig {
    /// A mix drawn from the seed: mostly three replicas, sometimes two and a
    /// tiebreaker, sometimes four or five; varied sizes, policies, rates and
    /// fault levels.
    pub fn for_seed(seed: u64) -> ReplicationSimConfig {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x7265_706c_6963_6121);
        let (diskful, tiebreakers) = match rng.gen_range(0..20) {
            0..=10 => (3, 0),
            11..=13 => (2, 1),
            14..=16 => (4, 0),
            17 => (3, 1),
            _ => (5, 0),
        };
        let initial_in_sync = if rng.gen_bool(0.2) {
            rng.gen_range(1..=diskful)
        } else {
            diskful
        };
        // 4 to 6 MiB, sometimes not a whole number of regions.
        let size_bytes = (4 << 20) + rng.gen_range(0..=8u64) * (256 << 10)
            - if rng.gen_bool(0.2) { 12 << 10 } else { 0 };
        let intensity = [0.5, 1.0, 1.0, 2.0][rng.gen_range(0..4)];
        // Drawn apart, so the rest of the mix of older seeds stays as it was.
        let mut pools = StdRng::seed_from_u64(seed ^ 0x706f_6f6c_2066_756c);
        let (pools_full, pool_full) = if pools.gen_bool(0.3) {
            (0.001 * intensity, 0.0008 * intensity)
        } else {
            (0.0, 0.0)
        };
        // Drawn apart too: seeds without grows keep their history.
        let grow = if StdRng::seed_from_u64(seed ^ 0x6772_6f77_2067_726f).gen_bool(0.5) {
            0.002 * intensity
        } else {
            0.0
        };
        let base = ReplicationSimConfig::default();
        ReplicationSimConfig {
            diskful,
            tiebreakers,
            size_bytes,
            initial_in_sync,
            steps: rng.gen_range(2_000..=3_000),
            policy: if rng.gen_bool(0.8) {
                NoQuorumPolicy::IoError
            } else {
                NoQuorumPolicy::Suspend
            },
            resync_rate: if rng.gen_bool(0.5) {
                0
            } else {
                rng.gen_range(8u64..=64) << 20
            },
            fence_closes_old_links: rng.gen_bool(0.5),
            crash: base.crash * intensity,
            partition: base.partition * intensity,
            control_partition: base.control_partition * intensity,
            link_drop: base.link_drop * intensity,
            slow_disk: base.slow_disk * intensity,
            stall: base.stall * intensity,
            io_error: base.io_error * intensity,
            bit_flip: base.bit_flip * intensity,
            pools_full,
            pool_full,
            failover: base.failover * intensity,
            detach: base.detach * intensity,
            verify: base.verify * intensity,
            snapshot: base.snapshot * intensity,
            grow,
            max_outstanding: rng.gen_range(2..=8),
            op_rate: rng.gen_range(0.3..0.9),
            final_crash: rng.gen_bool(0.7),
            ..base
        }
    }

    fn validate(&self) -> Result<(), String> {
        if !(2..=5).contains(&self.diskful) || self.tiebreakers > 1 {
            return Err("use 2 to 5 diskful replicas and at most one tiebreaker".into());
        }
        if self.initial_in_sync == 0 || self.initial_in_sync > self.diskful {
            return Err("initial_in_sync must be within 1 and diskful".into());
        }
        if self.size_bytes == 0 || !self.size_bytes.is_multiple_of(BLOCK) {
            return Err("the size must be a positive multiple of 4 KiB".into());
        }
        if self.step_ms == 0 {
            return Err("step_ms must be above 0".into());
        }
        let probabilities = [
            self.crash,
            self.partition,
            self.control_partition,
            self.link_drop,
            self.slow_disk,
            self.stall,
            self.io_error,
            self.bit_flip,
            self.pools_full,
            self.pool_full,
            self.pause,
            self.failover,
            self.detach,
            self.verify,
            self.snapshot,
            self.grow,
            self.unavailable,
            self.answer_lost,
            self.refuse_in_sync,
            self.op_rate,
            self.drop_writes,
        ];
        if probabilities.iter().any(|p| !(0.0..=1.0).contains(p)) {
            return Err("every probability must be within 0 to 1".into());
        }
        Ok(())
    }

    /// The probabilities of the faults a run injects (not the client's
    /// operations, verifies, snapshots or answers to the control plane).
    fn faults_mut(&mut self) -> [&mut f64; 13] {
        [
            &mut self.crash,
            &mut self.partition,
            &mut self.control_partition,
            &mut self.link_drop,
            &mut self.slow_disk,
            &mut self.stall,
            &mut self.io_error,
            &mut self.bit_flip,
            &mut self.pools_full,
            &mut self.pool_full,
            &mut self.pause,
            &mut self.failover,
            &mut self.detach,
        ]
    }

    /// This config with no fault at all; a test then turns on the one it
    /// is about.
    pub fn without_faults(mut self) -> Self {
        for probability in self.faults_mut() {
            *probability = 0.0;
        }
        self.drop_writes = 0.0;
        self
    }

    /// `fault` is the only fault, every replica starts in sync and fencing
    /// is on.
    fn only(&self, fault: fn(&mut Self) -> &mut f64) -> bool {
        let mut others = self.clone();
        let chosen = std::mem::take(fault(&mut others));
        chosen > 0.0
            && others.faults_mut().iter().all(|p| **p == 0.0)
            && self.drop_writes == 0.0
            && self.initial_in_sync == self.diskful
            && !self.ignore_fencing
            && !self.welcome_without_persist
            && !self.ignore_refused_outdate
            && !self.ack_before_quorum
            && !self.control_skips_fence_check
            && !self.control_ready_ignores_size
    }

    /// The only faults are pools full on every replica at once: then
    /// nobody may be outdated and no write may fail with EIO.
    pub fn only_full_pools(&self) -> bool {
        self.only(|config| &mut config.pools_full)
    }

    /// The only fault is the primary's process stopped for a while: its
    /// replicas answered everything, so nobody may be outdated and no
    /// client request may fail.
    pub fn only_pauses(&self) -> bool {
        self.only(|config| &mut config.pause)
    }
}

/// What a run did. Two runs of the same seed and config give equal reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplicationSimReport {
    pub seed: u64,
    pub diskful: usize,
    pub tiebreakers: usize,
    /// FNV-1a of every event of the run.
    pub digest: u64,
    pub events: u64,
    pub sim_time_ms: u64,
    pub final_generation: u64,
    pub writes_ok: u64,
    pub writes_failed: u64,
    /// Writes acknowledged by an engine whose generation was already stale.
    pub stale_writes_ok: u64,
    pub flushes_ok: u64,
    pub reads_checked: u64,
    pub blocks_checked: u64,
    pub reads_failed: u64,
    /// Reads completed by engines whose generation was no longer the
    /// arbiter's (checked like the others).
    pub stale_reads: u64,
    pub local_reads: u64,
    pub crashes: u64,
    pub primary_crashes: u64,
    pub attaches: u64,
    pub forced_failovers: u64,
    pub detaches: u64,
    pub partitions: u64,
    pub link_drops: u64,
    pub bit_flips: u64,
    /// Verifies started, and finished to the end.
    pub verifies: u64,
    pub verifies_done: u64,
    /// Blocks verifies rewrote.
    pub verify_repairs: u64,
    /// Snapshots asked, taken (on a quorum of replicas), failed.
    pub snapshots: u64,
    pub snapshots_taken: u64,
    pub snapshots_failed: u64,
    pub io_faults: u64,
    /// Times every replica's pool filled, and one replica's did.
    pub pools_full: u64,
    pub pool_full: u64,
    /// Writes that failed with ENOSPC.
    pub writes_no_space: u64,
    /// Times the primary's node stopped for a while.
    pub pauses: u64,
    /// Times the volume grew, and times an engine took a new size.
    pub grows: u64,
    pub engine_grows: u64,
    pub stalls: u64,
    pub fenced_engines: u64,
    pub outdated: u64,
    pub joined: u64,
    pub resynced_bytes: u64,
    pub repaired_blocks: u64,
    pub read_failovers: u64,
    pub lossy_blocks: u64,
}

/// Runs one seeded history; `Err` describes the first violated property,
/// with the run's recent events.
pub fn run_replication_sim(
    seed: u64,
    config: ReplicationSimConfig,
) -> Result<ReplicationSimReport, String> {
    config.validate()?;
    let mut sim = Sim::new(seed, config);
    match std::panic::catch_unwind(AssertUnwindSafe(|| sim.run())) {
        Ok(result) => result,
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "a panic".into());
            Err(sim.failure_text(&format!("panicked: {message}")))
        }
    }
}

// ---------------------------------------------------------------------------
// Block contents: a block is a tag (0: zeros), written into the data so that
// copies made by resync and repair can be recognised.
// ---------------------------------------------------------------------------

fn encode_block(tag: u64, out: &mut [u8]) {
    if tag == 0 {
        return;
    }
    out[0..8].copy_from_slice(&tag.to_le_bytes());
    out[8..16].copy_from_slice(&(!tag).to_le_bytes());
    out[BLOCK as usize - 8..].copy_from_slice(&tag.to_le_bytes());
}

fn decode_block(bytes: &[u8]) -> Option<u64> {
    let word = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
    let (a, b, c) = (word(0), word(8), word(BLOCK as usize - 8));
    if a == 0 && b == 0 && c == 0 {
        return Some(0);
    }
    (a != 0 && b == !a && c == a).then_some(a)
}

fn data_of(tags: &[u64]) -> Vec<u8> {
    let mut data = vec![0u8; tags.len() * BLOCK as usize];
    for (index, &tag) in tags.iter().enumerate() {
        let at = index * BLOCK as usize;
        encode_block(tag, &mut data[at..at + BLOCK as usize]);
    }
    data
}

fn tags_of(data: &[u8]) -> Option<Vec<u64>> {
    if !(data.len() as u64).is_multiple_of(BLOCK) {
        return None;
    }
    data.chunks_exact(BLOCK as usize)
        .map(decode_block)
        .collect()
}

/// A client write's block `index`: op ids start at 1, so tags are never 0.
fn tag_for(op: u64, index: u64) -> u64 {
    (op << 5) | index
}

fn describe_tag(tag: u64) -> String {
    if tag == 0 {
        "zeros".into()
    } else {
        format!("op{}#{}", tag >> 5, tag & 31)
    }
}

fn fnv(hash: u64, bytes: &[u8]) -> u64 {
    let mut hash = hash;
    for &byte in bytes {
        hash ^= byte as u64;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

fn summary_to(message: &ToReplica) -> String {
    match message {
        ToReplica::Hello { generation, .. } => format!("hello g{generation}"),
        ToReplica::Write {
            seq,
            offset,
            payload,
            fua,
            settled,
        } => format!(
            "write s{seq} b{}+{}{}{} settled {settled}",
            offset / BLOCK,
            payload.length() / BLOCK,
            if *fua { " fua" } else { "" },
            if matches!(payload, Payload::Zeroes { .. }) {
                " zeroes"
            } else {
                ""
            }
        ),
        ToReplica::Flush { seq } => format!("flush s{seq}"),
        ToReplica::Read { id, offset, length } => {
            format!("read r{id} b{}+{}", offset / BLOCK, length / BLOCK)
        }
        ToReplica::Goodbye => "goodbye".into(),
        ToReplica::Snapshot { seq, snapshot } => format!("snapshot #{snapshot} s{seq}"),
        ToReplica::Hash { id, offset, length } => {
            format!("hash h{id} b{}+{}", offset / BLOCK, length / BLOCK)
        }
        ToReplica::Ping { token } => format!("ping {token}"),
    }
}

fn summary_from(message: &FromReplica) -> String {
    match message {
        FromReplica::Welcome {
            previous,
            intact,
            was_primary,
            unsettled,
        } => format!(
            "welcome previous g{previous} intact {intact} was_primary {was_primary} unsettled {:?}",
            unsettled.iter().collect::<Vec<_>>()
        ),
        FromReplica::Refused { newer } => format!("refused newer g{newer}"),
        FromReplica::Ack { seq, result } => match result {
            Ok(()) => format!("ack s{seq}"),
            Err(error) => format!("ack s{seq} error {error}"),
        },
        FromReplica::ReadReply { id, result } => match result {
            Ok(ReadData::Data(data)) => format!("read reply r{id} {} bytes", data.len()),
            Ok(ReadData::Zeroes) => format!("read reply r{id} zeroes"),
            Err(error) => format!("read reply r{id} error {error}"),
        },
        FromReplica::HashReply { id, result } => match result {
            Ok(hashes) => format!("hash reply h{id} {} blocks", hashes.len()),
            Err(error) => format!("hash reply h{id} error {error}"),
        },
        FromReplica::Pong { token } => format!("pong {token}"),
    }
}

// ---------------------------------------------------------------------------
// The world's parts.
// ---------------------------------------------------------------------------

/// What a node keeps across crashes.
#[derive(Debug, Clone)]
struct Durable {
    accepted: Generation,
    primary_at: Option<Generation>,
    clean: bool,
    dirty_maps: BTreeMap<NodeId, DirtyMap>,
}

#[derive(Debug)]
enum DiskKind {
    Write {
        first: u64,
        tags: Vec<u64>,
        fua: bool,
        seq: u64,
    },
    Flush {
        seq: u64,
    },
    Read {
        id: u64,
        first: u64,
        count: u64,
    },
    /// A snapshot: waits for every earlier write, then flushes and copies
    /// the disk's content, durably.
    Snapshot {
        seq: u64,
        snapshot: SnapshotId,
    },
    /// Block fingerprints for `verify`.
    Hash {
        id: u64,
        first: u64,
        count: u64,
    },
    /// A client's read straight from the primary's own disk.
    LocalRead {
        op: u64,
        first: u64,
        count: u64,
    },
}

impl DiskKind {
    fn range(&self) -> Option<(u64, u64)> {
        match self {
            DiskKind::Write { first, tags, .. } => Some((*first, tags.len() as u64)),
            DiskKind::Flush { .. } | DiskKind::Snapshot { .. } => None,
            DiskKind::Read { first, count, .. }
            | DiskKind::Hash { first, count, .. }
            | DiskKind::LocalRead { first, count, .. } => Some((*first, *count)),
        }
    }
}

#[derive(Debug)]
struct DiskOp {
    /// 0 for a local read.
    link: LinkId,
    ready: Time,
    kind: DiskKind,
}

struct Disk {
    durable: Vec<u64>,
    volatile: Vec<u64>,
    corrupt: Vec<bool>,
    pending: BTreeMap<u64, DiskOp>,
    next: u64,
    slow_until: Time,
    stall_until: Time,
    io_until: Time,
    /// This pool is full: every data write fails with `NoSpace`.
    full_until: Time,
}

impl Disk {
    fn new(blocks: u64) -> Disk {
        Disk {
            durable: vec![0; blocks as usize],
            volatile: vec![NONE; blocks as usize],
            corrupt: vec![false; blocks as usize],
            pending: BTreeMap::new(),
            next: 1,
            slow_until: 0,
            stall_until: 0,
            io_until: 0,
            full_until: 0,
        }
    }

    /// What a read of block `b` sees (ignoring corruption).
    fn top(&self, b: u64) -> u64 {
        let volatile = self.volatile[b as usize];
        if volatile != NONE {
            volatile
        } else {
            self.durable[b as usize]
        }
    }

    fn read(&self, first: u64, count: u64, now: Time) -> Result<ReadData, ReplicaError> {
        if now < self.io_until {
            return Err(ReplicaError::Io("simulated device error".into()));
        }
        let mut tags = Vec::with_capacity(count as usize);
        for b in first..first + count {
            if self.volatile[b as usize] == NONE && self.corrupt[b as usize] {
                return Err(ReplicaError::Checksum(format!("block {b}")));
            }
            tags.push(self.top(b));
        }
        if tags.iter().all(|&tag| tag == 0) {
            Ok(ReadData::Zeroes)
        } else {
            Ok(ReadData::Data(data_of(&tags)))
        }
    }

    /// Fingerprints of blocks: what a read of each would see, or
    /// unreadable where a read would fail its checksum.
    fn hashes(&self, first: u64, count: u64, now: Time) -> Result<Vec<BlockHash>, ReplicaError> {
        if now < self.io_until {
            return Err(ReplicaError::Io("simulated device error".into()));
        }
        Ok((first..first + count)
            .map(|b| {
                if self.volatile[b as usize] == NONE && self.corrupt[b as usize] {
                    BlockHash::Unreadable
                } else {
                    BlockHash::Hash(u128::from(self.top(b)))
                }
            })
            .collect())
    }

    /// Whether the pending operation `key` must wait for an earlier one.
    fn blocked(&self, key: u64, op: &DiskOp) -> bool {
        let is_flush = matches!(op.kind, DiskKind::Flush { .. } | DiskKind::Snapshot { .. });
        let range = op.kind.range();
        let is_write = matches!(op.kind, DiskKind::Write { .. });
        self.pending.range(..key).any(|(_, earlier)| {
            if is_flush {
                return matches!(earlier.kind, DiskKind::Write { .. });
            }
            // A snapshot is a point in the store's order (a journal
            // record): no later write lands before it.
            if is_write && matches!(earlier.kind, DiskKind::Snapshot { .. }) {
                return true;
            }
            match (range, earlier.kind.range()) {
                (Some((a, n)), Some((b, m))) => a < b + m && b < a + n,
                _ => false,
            }
        })
    }
}

struct Node {
    diskful: bool,
    up: bool,
    /// Bumped at each crash: events of an older incarnation are void.
    incarnation: u64,
    /// The logical clock of its last crash.
    crashed_lc: u64,
    side: Option<ReplicaSide>,
    durable: Durable,
    /// When its last pending persist completes (persists are in order).
    persist_at: Time,
    disk: Option<Disk>,
    /// Open links on which it is the replica.
    links: BTreeSet<LinkId>,
    /// The highest generation it ever accepted, persisted or not.
    max_accepted: Generation,
    /// Snapshots it took: their blocks' tags (durable: they survive crashes).
    snapshots: BTreeMap<SnapshotId, Vec<u64>>,
    /// The size of its copy, in blocks (durable: its agent grows it). It
    /// refuses what lies past it, as a store does.
    store_blocks: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LinkState {
    Open,
    /// The engine stopped: what it sent still arrives, nothing comes back.
    Draining,
}

struct Link {
    engine: EngineId,
    primary: NodeId,
    member: NodeId,
    generation: Generation,
    state: LinkState,
    /// FIFO: when the last message each way arrives.
    to_at: Time,
    from_at: Time,
    /// The replica refused on it: it handles and sends nothing more.
    replica_closing: bool,
}

struct Engine {
    node: NodeId,
    generation: Generation,
    /// The size it started with: only past it must it know that every
    /// member it sends to holds what it sends.
    start_bytes: u64,
    primary: Primary,
    /// Its dealings with the control plane: the node's own driver.
    control: PrimaryDriver,
    links: BTreeMap<NodeId, LinkId>,
    want: BTreeSet<NodeId>,
    connecting: BTreeSet<NodeId>,
    local_readable: bool,
    view_at: Time,
    serving_seen: bool,
    detach_started: Option<Time>,
    /// The next block a verification sweep reads.
    sweep: Option<u64>,
    /// Blocks per sweep read: 1 for a scrub (a read fails as a whole when
    /// every copy has a bad block in its range, even different ones).
    sweep_blocks: u64,
    /// When the last verify this engine finished did (counted once).
    verify_counted_ms: Option<u64>,
}

#[derive(Debug)]
enum PersistOp {
    Accept {
        durable: DurableSide,
        link: LinkId,
        welcome: FromReplica,
    },
    Clean,
    Dirty {
        engine: EngineId,
        token: u64,
        peer: NodeId,
        map: DirtyMap,
    },
    Forget {
        peer: NodeId,
    },
}

#[derive(Debug)]
enum OpKind {
    Write {
        first: u64,
        tags: Vec<u64>,
        fua: bool,
        zero: bool,
        /// Kept so that the payload's address identifies the request in
        /// the messages the engine sends.
        payload: Option<Payload>,
        /// Replicas that admitted it, with the generation each had
        /// accepted then.
        admitted: BTreeMap<NodeId, Generation>,
    },
    Read {
        first: u64,
        count: u64,
        local: bool,
        sweep: bool,
        /// Per block, the values the read may return.
        allowed: Vec<BTreeSet<u64>>,
    },
    Flush,
}

#[derive(Debug)]
struct Op {
    engine: EngineId,
    /// The engine's node.
    node: NodeId,
    generation: Generation,
    /// Logical clock at issue.
    issued: u64,
    kind: OpKind,
}

#[derive(Debug, Clone, Copy)]
struct Version {
    tag: u64,
    generation: u64,
    /// Logical clock at completion.
    at: u64,
}

/// The reference model of one block.
#[derive(Debug, Clone)]
struct Block {
    /// Acknowledged versions in the order replicas apply them, from the
    /// last durable one.
    chain: Vec<Version>,
    /// The newest version may have been lost with every copy of it.
    lossy: bool,
    /// Versions below this index were possible contents at once (the
    /// block was lossy when the next version completed): a flush issued
    /// then made one of them durable, not necessarily the newest.
    ambiguous: usize,
    /// Writes of unknown outcome: (tag, logical clock when they ended,
    /// when an acknowledged write issued after that end completed). A
    /// superseded one may still come back when that write is lost, until a
    /// durable version replaces it: a FUA write issued after its end, or a
    /// flush issued after the superseding write completed.
    unknown: Vec<(u64, u64, Option<u64>)>,
}

impl Block {
    fn allowed(&self) -> BTreeSet<u64> {
        let mut allowed: BTreeSet<u64> = if self.lossy {
            self.chain.iter().map(|v| v.tag).collect()
        } else {
            self.chain.last().map(|v| v.tag).into_iter().collect()
        };
        allowed.extend(
            self.unknown
                .iter()
                .filter(|&&(_, _, superseded)| self.lossy || superseded.is_none())
                .map(|&(tag, _, _)| tag),
        );
        allowed
    }
}

#[derive(Debug)]
enum Ev {
    Step,
    Tick,
    /// Primary → replica on a link: an encoded `ToReplica`.
    Deliver {
        link: LinkId,
        frame: Vec<u8>,
        op: Option<u64>,
    },
    /// Replica → primary: an encoded `FromReplica`.
    Reply {
        link: LinkId,
        frame: Vec<u8>,
    },
    Close {
        link: LinkId,
    },
    Connect {
        engine: EngineId,
        node: NodeId,
    },
    Disk {
        node: NodeId,
        incarnation: u64,
    },
    Persist {
        node: NodeId,
        incarnation: u64,
        op: PersistOp,
    },
    /// A proposal of the engine on node `by` reaches the arbiter.
    Apply {
        engine: EngineId,
        by: NodeId,
        id: u64,
        command: Command,
    },
    Answer {
        engine: EngineId,
        id: u64,
        answer: Result<(), ProposeError>,
    },
    View {
        engine: EngineId,
    },
    Restart {
        node: NodeId,
    },
    /// A node's agent grows its copy to the recorded size, if the record
    /// says it is not ready.
    AgentGrow {
        node: NodeId,
    },
    /// The agent's report of its copy, made at `size_bytes`, reaches the
    /// control plane (perhaps after a later grow committed).
    AgentReport {
        node: NodeId,
        size_bytes: u64,
    },
    /// A stopped node goes on.
    Resume {
        node: NodeId,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Run,
    /// Everything healed; waiting for the final engine to converge.
    Converge,
    FinalFlush(u64),
    Sweep,
    Done,
}

/// The control plane: the real cluster state, changed only by the real
/// `ClusterState::apply` with the commands a node proposes.
struct Arbiter {
    state: ClusterState,
    volume: VolumeName,
    /// The volume's view, as an engine derives it from the state: updated
    /// after every command.
    view: View,
    current: Option<EngineId>,
}

impl Arbiter {
    /// A cluster of the run's nodes (node ids 1 to n, the diskful ones
    /// first), made by the commands a real cluster is made with, and one
    /// volume with a diskful replica on each diskful node. The replica
    /// layout and the starting in-sync set are then set to the run's
    /// (the placer chooses tiebreakers by its own rules; the start is not
    /// what is under test).
    fn new(cfg: &ReplicationSimConfig) -> Arbiter {
        let mut state = ClusterState::default();
        let name = |n: u64| NodeName::new(format!("n{n}")).expect("a valid node name");
        let nodes = (cfg.diskful + cfg.tiebreakers) as u64;
        for n in 1..=nodes {
            let node = NodeRegistration {
                name: name(n),
                api_address: format!("127.0.0.1:{}", 7000 + n),
                nbd_address: None,
                data_address: None,
                labels: BTreeMap::new(),
            };
            let command = if n == 1 {
                Command::Bootstrap {
                    cluster_id: "sim".into(),
                    join_secret: "sim".into(),
                    node,
                    now_ms: 0,
                }
            } else {
                Command::AddNode {
                    node,
                    nonce: format!("join-{n}"),
                    now_ms: 0,
                }
            };
            state.apply(command).expect("a new cluster takes its nodes");
        }
        let pool = PoolName::new("default").expect("a valid pool name");
        for n in 1..=cfg.diskful as u64 {
            let report = PoolReport {
                name: pool.clone(),
                record: PoolRecord {
                    class: DeviceClass::Ssd,
                    capacity_bytes: 1 << 40,
                    free_bytes: 1 << 40,
                    online: true,
                    reported_ms: 0,
                },
            };
            state
                .apply(Command::ReportPools {
                    node: NodeId(n),
                    pools: vec![report],
                })
                .expect("a node reports its pools");
        }
        let volume = VolumeName::new("sim").expect("a valid volume name");
        state
            .apply(Command::CreateVolume {
                name: volume.clone(),
                size_bytes: cfg.size_bytes,
                group: None,
                replicas: Some(cfg.diskful),
                nodes: Some((1..=cfg.diskful as u64).map(name).collect()),
                pool: None,
                adopt: None,
                now_ms: 0,
            })
            .expect("the volume is placed on the diskful nodes");
        let record = state.volumes.get_mut(&volume).expect("created");
        record
            .replicas
            .retain(|replica| replica.kind == ReplicaKind::Diskful);
        // Every node made its copy at the volume's size.
        for replica in &mut record.replicas {
            replica.observed = ReplicaObserved::Ready;
        }
        for n in cfg.diskful as u64 + 1..=nodes {
            record.replicas.push(ReplicaRecord {
                node: NodeId(n),
                kind: ReplicaKind::Tiebreaker,
                pool: None,
                observed: ReplicaObserved::Ready,
                allocated_bytes: 0,
                sync: None,
            });
        }
        record.in_sync = (1..=cfg.initial_in_sync as u64).map(NodeId).collect();
        state
            .check_invariants()
            .expect("the run's starting state is a valid cluster state");
        state.set_bugs(ControlBugs {
            skip_fence_check: cfg.control_skips_fence_check,
            ready_ignores_size: cfg.control_ready_ignores_size,
        });
        let view = view_of(&state.volumes[&volume]);
        Arbiter {
            state,
            volume,
            view,
            current: None,
        }
    }

    /// Applies `command` as the node that proposes it does (attributed to
    /// that node, so the event log's derivation runs too), and refreshes
    /// the view.
    fn apply(&mut self, by: NodeId, now: Time, command: Command) -> Result<Reply, CommandError> {
        let result = self.state.apply(Command::Attributed {
            actor: Actor::Node(by),
            now_ms: now,
            command: Box::new(command),
        });
        self.view = view_of(&self.state.volumes[&self.volume]);
        result
    }
}

/// The engine's proposals as the node's driver hands them to the control
/// plane: collected, then sent to the arbiter as the run decides.
#[derive(Default)]
struct Proposals(Vec<(u64, Command, bool)>);

impl ControlPlane for Proposals {
    fn propose(&mut self, id: u64, command: Command, wants_answer: bool) {
        self.0.push((id, command, wants_answer));
    }

    fn wall_clock_ms(&self) -> u64 {
        // Only progress reports carry it, and the arbiter drops those.
        0
    }
}

struct Sim {
    seed: u64,
    cfg: ReplicationSimConfig,
    /// The replica driver every node runs (the node daemon's own).
    replica_driver: ReplicaDriver,
    rng: StdRng,
    /// Latencies: separate, so that the fault schedule does not shift when
    /// one more message is sent.
    lat: StdRng,
    now: Time,
    queue: BTreeMap<(Time, u64), Ev>,
    queued: u64,
    /// The volume's recorded size, in blocks (it grows).
    blocks: u64,
    max_blocks: u64,
    /// Grows and the agents' delays: apart, so seeds without grows keep
    /// their history.
    grow_rng: StdRng,
    nodes: BTreeMap<NodeId, Node>,
    links: BTreeMap<LinkId, Link>,
    next_link: LinkId,
    engines: BTreeMap<EngineId, Engine>,
    next_engine: EngineId,
    arbiter: Arbiter,
    ops: BTreeMap<u64, Op>,
    next_op: u64,
    /// Payload address → client write.
    payloads: BTreeMap<usize, u64>,
    model: Vec<Block>,
    /// Logical clock: orders issues, completions and crashes.
    lc: u64,
    phase: Phase,
    steps_done: usize,
    settle_started: Time,
    final_crash_done: bool,
    scrubs: u64,
    next_snapshot: u64,
    /// Per snapshot, what each block may hold: the model when the barrier
    /// went out (no write of that engine was in flight).
    snapshot_expected: BTreeMap<SnapshotId, Vec<BTreeSet<u64>>>,
    /// Snapshots an engine reported taken, with the nodes it named.
    snapshot_taken: BTreeMap<SnapshotId, BTreeSet<NodeId>>,
    partitioned: BTreeSet<NodeId>,
    heal_at: Time,
    /// Nodes cut off from the control plane only.
    control_cut: BTreeSet<NodeId>,
    control_heal_at: Time,
    failover_at: Option<Time>,
    /// Every replica's pool is full until then.
    pools_full_until: Time,
    /// Tags of writes issued while every pool was full: they fit nowhere.
    no_room: BTreeSet<u64>,
    /// Stopped nodes, with the events that arrived for them meanwhile.
    paused: BTreeMap<NodeId, Vec<Ev>>,
    events: VecDeque<String>,
    report: ReplicationSimReport,
    violation: Option<String>,
}

impl Sim {
    fn new(seed: u64, cfg: ReplicationSimConfig) -> Sim {
        let blocks = cfg.size_bytes / BLOCK;
        // Room to grow: the volume's blocks are the first `blocks`.
        let max_blocks = blocks + GROW_ROOM_BYTES / BLOCK;
        let replica_driver = ReplicaDriver::new().with_bugs(ReplicaBugs {
            welcome_without_persist: cfg.welcome_without_persist,
            ignore_fencing: cfg.ignore_fencing,
        });
        let report = ReplicationSimReport {
            seed,
            diskful: cfg.diskful,
            tiebreakers: cfg.tiebreakers,
            digest: 0xcbf2_9ce4_8422_2325,
            ..ReplicationSimReport::default()
        };
        let mut nodes = BTreeMap::new();
        for n in 1..=(cfg.diskful + cfg.tiebreakers) as u64 {
            let diskful = n <= cfg.diskful as u64;
            let durable = Durable {
                accepted: Generation(0),
                primary_at: None,
                clean: true,
                dirty_maps: BTreeMap::new(),
            };
            nodes.insert(
                NodeId(n),
                Node {
                    diskful,
                    up: true,
                    incarnation: 1,
                    crashed_lc: 0,
                    side: Some(ReplicaSide::new(Generation(0), None, true)),
                    durable,
                    persist_at: 0,
                    disk: diskful.then(|| Disk::new(max_blocks)),
                    links: BTreeSet::new(),
                    max_accepted: Generation(0),
                    snapshots: BTreeMap::new(),
                    store_blocks: if diskful { blocks } else { 0 },
                },
            );
        }
        let arbiter = Arbiter::new(&cfg);
        Sim {
            seed,
            replica_driver,
            rng: StdRng::seed_from_u64(seed),
            lat: StdRng::seed_from_u64(seed ^ 0x6c61_7465_6e63_7921),
            cfg,
            now: 0,
            queue: BTreeMap::new(),
            queued: 0,
            blocks,
            max_blocks,
            grow_rng: StdRng::seed_from_u64(seed ^ 0x6167_656e_7473_2121),
            nodes,
            links: BTreeMap::new(),
            next_link: 1,
            engines: BTreeMap::new(),
            next_engine: 1,
            arbiter,
            ops: BTreeMap::new(),
            next_op: 1,
            payloads: BTreeMap::new(),
            model: vec![
                Block {
                    chain: vec![Version {
                        tag: 0,
                        generation: 0,
                        at: 0,
                    }],
                    lossy: false,
                    ambiguous: 0,
                    unknown: Vec::new(),
                };
                max_blocks as usize
            ],
            lc: 1,
            phase: Phase::Run,
            steps_done: 0,
            settle_started: 0,
            final_crash_done: false,
            scrubs: 0,
            next_snapshot: 1,
            snapshot_expected: BTreeMap::new(),
            snapshot_taken: BTreeMap::new(),
            partitioned: BTreeSet::new(),
            heal_at: 0,
            control_cut: BTreeSet::new(),
            control_heal_at: 0,
            failover_at: None,
            pools_full_until: 0,
            no_room: BTreeSet::new(),
            paused: BTreeMap::new(),
            events: VecDeque::new(),
            report,
            violation: None,
        }
    }

    // --- bookkeeping ---------------------------------------------------------

    fn log(&mut self, text: String) {
        let line = format!("[{:>8.3}s] {text}", self.now as f64 / 1000.0);
        self.report.digest = fnv(self.report.digest, line.as_bytes());
        if self.cfg.trace {
            eprintln!("replication sim seed {}: {line}", self.seed);
        }
        if self.events.len() == EVENTS_SHOWN {
            self.events.pop_front();
        }
        self.events.push_back(line);
    }

    fn violate(&mut self, what: String) {
        if self.violation.is_none() {
            self.log(format!("VIOLATION: {what}"));
            self.violation = Some(what);
        }
    }

    fn failure_text(&self, what: &str) -> String {
        let mut text = format!(
            "seed {} ({} diskful, {} tiebreaker, {} KiB, {:?}, resync rate {}, fence closes old links {}): {what}\nat {} ms, arbiter generation {} in sync {:?}\nlast events:\n",
            self.seed,
            self.cfg.diskful,
            self.cfg.tiebreakers,
            self.cfg.size_bytes >> 10,
            self.cfg.policy,
            self.cfg.resync_rate,
            self.cfg.fence_closes_old_links,
            self.now,
            self.arbiter.view.generation,
            self.arbiter.view.in_sync.iter().map(|n| n.0).collect::<Vec<_>>(),
        );
        for line in &self.events {
            text.push_str("  ");
            text.push_str(line);
            text.push('\n');
        }
        text
    }

    fn at(&mut self, time: Time, event: Ev) {
        self.queued += 1;
        self.queue.insert((time, self.queued), event);
    }

    fn tick_lc(&mut self) -> u64 {
        self.lc += 1;
        self.lc
    }

    fn net_delay(&mut self, from: NodeId, to: NodeId) -> Time {
        if from == to {
            self.lat.gen_range(0..=1)
        } else if self.lat.gen_bool(0.1) {
            self.lat.gen_range(5..=40)
        } else {
            self.lat.gen_range(1..=5)
        }
    }

    /// Whether the control plane reaches the node.
    fn reachable(&self, node: NodeId) -> bool {
        self.nodes[&node].up
            && !self.partitioned.contains(&node)
            && !self.control_cut.contains(&node)
    }

    fn can_link(&self, a: NodeId, b: NodeId) -> bool {
        self.nodes[&a].up
            && self.nodes[&b].up
            && (a == b || self.partitioned.contains(&a) == self.partitioned.contains(&b))
    }

    fn diskful_nodes(&self) -> Vec<NodeId> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.diskful)
            .map(|(&id, _)| id)
            .collect()
    }

    // --- the loop --------------------------------------------------------------

    fn run(&mut self) -> Result<ReplicationSimReport, String> {
        self.log(format!(
            "start: {} diskful, {} tiebreaker, {} blocks, in sync {:?}",
            self.cfg.diskful, self.cfg.tiebreakers, self.blocks, self.arbiter.view.in_sync
        ));
        let in_sync: Vec<NodeId> = self.arbiter.view.in_sync.iter().copied().collect();
        let first = *in_sync.choose(&mut self.rng).expect("in sync");
        self.attach(first);
        self.drain_all();
        self.at(0, Ev::Step);
        self.at(0, Ev::Tick);
        let mut events = 0u64;
        while let Some(((time, _), event)) = self.queue.pop_first() {
            self.now = time;
            events += 1;
            if let Some(node) = self.stopped_target(&event) {
                self.paused.get_mut(&node).expect("stopped").push(event);
                continue;
            }
            self.handle(event);
            self.drain_all();
            self.check_step();
            if let Some(what) = self.violation.take() {
                return Err(self.failure_text(&what));
            }
            if self.phase == Phase::Done {
                break;
            }
            if events > MAX_EVENTS {
                return Err(self.failure_text("livelock: too many events"));
            }
        }
        if self.phase != Phase::Done {
            return Err(self.failure_text("the event queue ran dry"));
        }
        self.report.events = events;
        self.report.sim_time_ms = self.now;
        self.report.final_generation = self.arbiter.view.generation.0;
        Ok(self.report.clone())
    }

    fn handle(&mut self, event: Ev) {
        match event {
            Ev::Step => {
                self.step();
                let next = self.now + self.cfg.step_ms;
                self.at(next, Ev::Step);
            }
            Ev::Tick => {
                let ids: Vec<EngineId> = self.engines.keys().copied().collect();
                for id in ids {
                    let now = self.now;
                    if let Some(engine) = self.engines.get_mut(&id) {
                        if !self.paused.contains_key(&engine.node) {
                            engine.primary.tick(now);
                        }
                    }
                }
                let next = self.now + TICK_MS;
                self.at(next, Ev::Tick);
            }
            Ev::Deliver { link, frame, op } => match ToReplica::decode(&frame) {
                Ok(message) => self.replica_receive(link, message, op),
                Err(error) => self.violate(format!(
                    "link {link}: the replica cannot decode a frame of {} bytes the primary encoded: {error}",
                    frame.len()
                )),
            },
            Ev::Reply { link, frame } => match FromReplica::decode(&frame) {
                Ok(message) => self.engine_receive(link, message),
                Err(error) => self.violate(format!(
                    "link {link}: the primary cannot decode a frame of {} bytes the replica encoded: {error}",
                    frame.len()
                )),
            },
            Ev::Close { link } => self.close_link(link),
            Ev::Connect { engine, node } => self.connect(engine, node),
            Ev::Disk { node, incarnation } => self.disk_run(node, incarnation),
            Ev::Persist {
                node,
                incarnation,
                op,
            } => self.persist_done(node, incarnation, op),
            Ev::Apply {
                engine,
                by,
                id,
                command,
            } => self.arbiter_apply(engine, by, id, command),
            Ev::Answer { engine, id, answer } => {
                let Some(node) = self.engines.get(&engine).map(|e| e.node) else {
                    return;
                };
                if !self.reachable(node) {
                    return;
                }
                self.log(format!(
                    "engine {engine}: proposal {id} answered {answer:?}"
                ));
                let now = self.now;
                let engine = self.engines.get_mut(&engine).expect("checked");
                engine
                    .control
                    .answered(&mut engine.primary, id, answer, now);
            }
            Ev::View { engine } => {
                let Some(node) = self.engines.get(&engine).map(|e| e.node) else {
                    return;
                };
                if !self.reachable(node) {
                    return;
                }
                let now = self.now;
                let record = self.arbiter.state.volumes.get(&self.arbiter.volume);
                let e = self.engines.get_mut(&engine).expect("checked");
                // As the node gives an engine the volume's record.
                let change = e.control.record(&mut e.primary, record, now);
                self.log(format!("engine {engine}: record: {change:?}"));
            }
            Ev::Restart { node } => self.restart(node),
            Ev::Resume { node } => self.resume(node),
            Ev::AgentGrow { node } => self.agent_grow(node),
            Ev::AgentReport { node, size_bytes } => self.agent_report(node, size_bytes),
        }
    }

    // --- growing ---------------------------------------------------------------

    /// The operator grows the volume: the control plane records it, and
    /// every diskful node's agent will grow its copy.
    fn grow_volume(&mut self) {
        let room = (self.max_blocks - self.blocks) * BLOCK;
        if room == 0 {
            return;
        }
        // Whole blocks, often not whole regions.
        let by = BLOCK * self.grow_rng.gen_range(1..=(room / BLOCK).min(256));
        let size_bytes = self.blocks * BLOCK + by;
        let name = self.arbiter.volume.clone();
        let now = self.now;
        match self
            .arbiter
            .apply(NodeId(1), now, Command::GrowVolume { name, size_bytes })
        {
            Ok(_) => {}
            Err(error) => {
                self.violate(format!(
                    "the control plane refused a grow to {size_bytes}: {error}"
                ));
                return;
            }
        }
        self.blocks = size_bytes / BLOCK;
        self.report.grows += 1;
        self.log(format!("operator: grow the volume to {size_bytes} bytes"));
        for node in self.diskful_nodes() {
            let delay = self.grow_rng.gen_range(1..=3_000);
            self.at(now + delay, Ev::AgentGrow { node });
        }
        self.views_changed();
    }

    /// A node's agent sees its replica not ready: it grows its copy to
    /// the recorded size and reports that size, later. A node that is down
    /// or cut off from the control plane does so once it is back.
    fn agent_grow(&mut self, node: NodeId) {
        let ready = self.arbiter.state.volumes[&self.arbiter.volume]
            .replica(node)
            .is_none_or(|replica| replica.observed == ReplicaObserved::Ready);
        if ready {
            return;
        }
        if !self.nodes[&node].up || !self.reachable(node) || self.paused.contains_key(&node) {
            let delay = self.grow_rng.gen_range(200..=1_500);
            self.at(self.now + delay, Ev::AgentGrow { node });
            return;
        }
        let blocks = self.blocks;
        let n = self.nodes.get_mut(&node).expect("a node");
        n.store_blocks = n.store_blocks.max(blocks);
        let size_bytes = n.store_blocks * BLOCK;
        self.log(format!(
            "node {node}: agent: copy grown to {size_bytes} bytes"
        ));
        let delay = self.grow_rng.gen_range(0..=1_500);
        self.at(self.now + delay, Ev::AgentReport { node, size_bytes });
    }

    fn agent_report(&mut self, node: NodeId, size_bytes: u64) {
        if !self.nodes[&node].up || !self.reachable(node) || self.paused.contains_key(&node) {
            // Lost: the agent tries again.
            let delay = self.grow_rng.gen_range(200..=1_500);
            self.at(self.now + delay, Ev::AgentGrow { node });
            return;
        }
        let record = &self.arbiter.state.volumes[&self.arbiter.volume];
        let command = Command::ReportReplica {
            volume: record.name.clone(),
            volume_id: record.id,
            node,
            observed: ReplicaObserved::Ready,
            allocated_bytes: 0,
            size_bytes: Some(size_bytes),
        };
        let now = self.now;
        if let Err(error) = self.arbiter.apply(node, now, command) {
            self.violate(format!("node {node}'s ready report was refused: {error}"));
            return;
        }
        let ready = self.arbiter.state.volumes[&self.arbiter.volume]
            .replica(node)
            .is_some_and(|replica| replica.observed == ReplicaObserved::Ready);
        self.log(format!(
            "node {node}: agent: reported ready at {size_bytes} bytes{}",
            if ready { "" } else { " (stale: still pending)" }
        ));
        if !ready {
            let delay = self.grow_rng.gen_range(1..=1_000);
            self.at(self.now + delay, Ev::AgentGrow { node });
        }
        self.views_changed();
    }

    /// The blocks engine `id` serves.
    fn engine_blocks(&self, id: EngineId) -> u64 {
        self.engines[&id].primary.size_bytes() / BLOCK
    }

    /// The stopped node an event is for, if it is for one: it waits until
    /// the node goes on.
    fn stopped_target(&self, event: &Ev) -> Option<NodeId> {
        if self.paused.is_empty() {
            return None;
        }
        let engine_node = |id: &EngineId| self.engines.get(id).map(|e| e.node);
        let nodes = match event {
            Ev::Deliver { link, .. } => [self.links.get(link).map(|l| l.member), None],
            Ev::Reply { link, .. } => [self.links.get(link).map(|l| l.primary), None],
            Ev::Close { link } => self
                .links
                .get(link)
                .map_or([None, None], |l| [Some(l.member), Some(l.primary)]),
            Ev::Connect { engine, .. } | Ev::Answer { engine, .. } | Ev::View { engine } => {
                [engine_node(engine), None]
            }
            Ev::Disk { node, .. }
            | Ev::Persist { node, .. }
            | Ev::AgentGrow { node }
            | Ev::AgentReport { node, .. } => [Some(*node), None],
            Ev::Step | Ev::Tick | Ev::Apply { .. } | Ev::Restart { .. } | Ev::Resume { .. } => {
                [None, None]
            }
        };
        nodes
            .into_iter()
            .flatten()
            .find(|node| self.paused.contains_key(node))
    }

    /// A stopped node goes on: its engines tick first (their timer fired
    /// while the process was stopped, and nothing says it runs before the
    /// sockets are read), then what waited is handled in arrival order.
    fn resume(&mut self, node: NodeId) {
        let Some(waited) = self.paused.remove(&node) else {
            return;
        };
        self.log(format!(
            "node {node} goes on; {} events waited",
            waited.len()
        ));
        let now = self.now;
        for engine in self.engines.values_mut() {
            if engine.node == node {
                engine.primary.tick(now);
            }
        }
        for event in waited {
            self.drain_all();
            self.check_step();
            self.handle(event);
        }
    }

    fn is_paused(&self, engine: EngineId) -> bool {
        self.engines
            .get(&engine)
            .is_some_and(|e| self.paused.contains_key(&e.node))
    }

    /// Carries out what the engines asked for, until none asks more. Only
    /// here: actions are handled in the order each engine emitted them.
    fn drain_all(&mut self) {
        loop {
            let mut any = false;
            let ids: Vec<EngineId> = self.engines.keys().copied().collect();
            for id in ids {
                let actions = match self.engines.get_mut(&id) {
                    Some(engine) => engine.primary.take_actions(),
                    None => continue,
                };
                if actions.is_empty() {
                    continue;
                }
                any = true;
                for action in actions {
                    self.act(id, action);
                }
            }
            if !any {
                break;
            }
        }
        // A new engine's first moments as a server: sweep the volume.
        let ids: Vec<EngineId> = self.engines.keys().copied().collect();
        for id in ids {
            let engine = self.engines.get_mut(&id).expect("listed");
            if !engine.serving_seen && engine.primary.is_serving() {
                engine.serving_seen = true;
                engine.sweep = Some(0);
                let generation = engine.generation;
                self.log(format!("engine {id}: serving at g{generation}; sweep"));
            }
        }
    }

    fn check_step(&mut self) {
        let current: Vec<EngineId> = self
            .engines
            .iter()
            .filter(|(_, e)| e.generation == self.arbiter.view.generation)
            .map(|(&id, _)| id)
            .collect();
        if current.len() > 1 {
            self.violate(format!(
                "two engines at the arbiter's generation: {current:?}"
            ));
        }
        for (id, engine) in &self.engines {
            if engine.generation > self.arbiter.view.generation {
                let what = format!("engine {id} is ahead of the arbiter");
                self.violation.get_or_insert(what);
                break;
            }
        }
    }

    // --- steps: faults, failover, workload -----------------------------------

    fn step(&mut self) {
        match self.phase {
            Phase::Run => {
                self.steps_done += 1;
                self.count_verifies();
                self.faults();
                self.failover();
                self.workload();
                self.sweep_pump();
                if self.steps_done >= self.cfg.steps {
                    self.begin_settle();
                }
            }
            Phase::Converge | Phase::FinalFlush(_) | Phase::Sweep => {
                self.failover();
                self.sweep_pump();
                self.settle();
            }
            Phase::Done => {}
        }
    }

    /// Counts the verifies that ran to the end, once each.
    fn count_verifies(&mut self) {
        for engine in self.engines.values_mut() {
            let Some(report) = engine.primary.verify_report() else {
                continue;
            };
            if report.state == VerifyState::Done
                && engine.verify_counted_ms != Some(report.finished_ms)
            {
                engine.verify_counted_ms = Some(report.finished_ms);
                self.report.verifies_done += 1;
                self.report.verify_repairs += report.repaired.values().sum::<u64>();
            }
        }
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.gen_bool(p)
    }

    fn faults(&mut self) {
        if self.cfg.grow > 0.0 && self.grow_rng.gen_bool(self.cfg.grow) {
            self.grow_volume();
        }
        let all: Vec<NodeId> = self.nodes.keys().copied().collect();
        let down = self.nodes.values().filter(|n| !n.up).count();
        let max_down = if all.len() >= 5 { 2 } else { 1 };
        if down < max_down && self.chance(self.cfg.crash) {
            let primary = self
                .arbiter
                .current
                .and_then(|id| self.engines.get(&id))
                .map(|e| e.node);
            let up: Vec<NodeId> = all.iter().copied().filter(|n| self.nodes[n].up).collect();
            let target = match primary {
                Some(node) if self.rng.gen_bool(0.35) => Some(node),
                _ => up.choose(&mut self.rng).copied(),
            };
            if let Some(node) = target {
                self.crash(node);
                let delay = self.rng.gen_range(300..=8_000);
                let time = self.now + delay;
                self.at(time, Ev::Restart { node });
            }
        }
        if self.partitioned.is_empty() {
            if self.chance(self.cfg.partition) {
                let mut shuffled = all.clone();
                shuffled.shuffle(&mut self.rng);
                let size = self.rng.gen_range(1..=(all.len() - 1).max(1));
                let mut cut: BTreeSet<NodeId> = shuffled.into_iter().take(size).collect();
                // Sometimes the primary is cut off with a minority.
                if self.rng.gen_bool(0.3) {
                    if let Some(node) = self
                        .arbiter
                        .current
                        .and_then(|id| self.engines.get(&id))
                        .map(|e| e.node)
                    {
                        cut = [node].into_iter().collect();
                        if all.len() > 3 && self.rng.gen_bool(0.5) {
                            if let Some(&other) = all.iter().find(|&&n| n != node) {
                                cut.insert(other);
                            }
                        }
                    }
                }
                let duration = self.rng.gen_range(500..=15_000);
                self.heal_at = self.now + duration;
                self.partition(cut);
            }
        } else if self.now >= self.heal_at {
            self.heal();
        }
        if self.control_cut.is_empty() {
            if self.chance(self.cfg.control_partition) {
                let node = match self.current_node() {
                    Some(node) if self.rng.gen_bool(0.8) => node,
                    _ => *all.choose(&mut self.rng).expect("nodes"),
                };
                self.control_heal_at = self.now + self.rng.gen_range(500..=15_000);
                self.report.partitions += 1;
                self.log(format!(
                    "fault: node {node} cut off from the control plane until {}",
                    self.control_heal_at
                ));
                self.control_cut.insert(node);
            }
        } else if self.now >= self.control_heal_at {
            self.heal_control();
        }
        if self.chance(self.cfg.link_drop) {
            let open: Vec<LinkId> = self
                .links
                .iter()
                .filter(|(_, l)| l.state == LinkState::Open)
                .map(|(&id, _)| id)
                .collect();
            if let Some(&link) = open.choose(&mut self.rng) {
                self.report.link_drops += 1;
                self.log(format!("fault: drop link {link}"));
                self.close_link(link);
            }
        }
        let diskful = self.diskful_nodes();
        if self.chance(self.cfg.slow_disk) {
            let node = *diskful.choose(&mut self.rng).expect("diskful");
            let until = self.now + self.rng.gen_range(500..=10_000);
            self.log(format!("fault: node {node}'s disk slow until {until}"));
            self.nodes
                .get_mut(&node)
                .unwrap()
                .disk
                .as_mut()
                .unwrap()
                .slow_until = until;
        }
        if self.chance(self.cfg.stall) {
            let node = *diskful.choose(&mut self.rng).expect("diskful");
            let until = self.now + self.rng.gen_range(3_000..=9_000);
            self.report.stalls += 1;
            self.log(format!("fault: node {node}'s disk stalls until {until}"));
            self.nodes
                .get_mut(&node)
                .unwrap()
                .disk
                .as_mut()
                .unwrap()
                .stall_until = until;
        }
        if self.chance(self.cfg.io_error) {
            let node = *diskful.choose(&mut self.rng).expect("diskful");
            let until = self.now + self.rng.gen_range(50..=4_000);
            self.report.io_faults += 1;
            self.log(format!("fault: node {node}'s disk fails I/O until {until}"));
            self.nodes
                .get_mut(&node)
                .unwrap()
                .disk
                .as_mut()
                .unwrap()
                .io_until = until;
        }
        if self.now >= self.pools_full_until && self.chance(self.cfg.pools_full) {
            self.pools_full_until = self.now + self.rng.gen_range(50..=3_000);
            self.report.pools_full += 1;
            self.log(format!(
                "fault: every replica's pool is full until {}",
                self.pools_full_until
            ));
        }
        if self.chance(self.cfg.pool_full) {
            let node = *diskful.choose(&mut self.rng).expect("diskful");
            let until = self.now + self.rng.gen_range(50..=3_000);
            self.report.pool_full += 1;
            self.log(format!("fault: node {node}'s pool is full until {until}"));
            self.nodes
                .get_mut(&node)
                .unwrap()
                .disk
                .as_mut()
                .unwrap()
                .full_until = until;
        }
        if self.paused.is_empty() && self.chance(self.cfg.pause) {
            if let Some(node) = self.current_node() {
                let until = self.now + self.rng.gen_range(6_000..=15_000);
                self.report.pauses += 1;
                self.log(format!("fault: node {node} stops (SIGSTOP) until {until}"));
                self.paused.insert(node, Vec::new());
                self.at(until, Ev::Resume { node });
            }
        }
        if self.chance(self.cfg.bit_flip) {
            let node = *diskful.choose(&mut self.rng).expect("diskful");
            let block = self.rng.gen_range(0..self.blocks);
            self.report.bit_flips += 1;
            self.log(format!("fault: bit flip on node {node}, block {block}"));
            self.nodes
                .get_mut(&node)
                .unwrap()
                .disk
                .as_mut()
                .unwrap()
                .corrupt[block as usize] = true;
        }
        if self.chance(self.cfg.failover) {
            if let Some(node) = self.current_node() {
                let candidates: Vec<NodeId> = diskful
                    .iter()
                    .copied()
                    .filter(|&n| n != node && self.reachable(n))
                    .collect();
                if let Some(&target) = candidates.choose(&mut self.rng) {
                    self.report.forced_failovers += 1;
                    self.log(format!(
                        "control: forced move of the primary to node {target}"
                    ));
                    self.attach(target);
                }
            }
        }
        if self.chance(self.cfg.snapshot) {
            // An operator's request to a stopped node waits: none is sent.
            if let Some(id) = self.arbiter.current.filter(|&id| !self.is_paused(id)) {
                let snapshot = SnapshotId(self.next_snapshot);
                self.next_snapshot += 1;
                let now = self.now;
                self.report.snapshots += 1;
                self.log(format!("operator: snapshot #{snapshot} on engine {id}"));
                let engine = self.engines.get_mut(&id).expect("current");
                engine.primary.take_snapshot(snapshot, now);
            }
        }
        if self.chance(self.cfg.verify) {
            if let Some(id) = self.arbiter.current.filter(|&id| !self.is_paused(id)) {
                let now = self.now;
                let engine = self.engines.get_mut(&id).expect("current");
                if engine.primary.start_verify(now).is_ok() {
                    self.report.verifies += 1;
                    self.log(format!("operator: verify on engine {id}"));
                }
            }
        }
        if self.chance(self.cfg.detach) {
            if let Some(id) = self.arbiter.current.filter(|&id| !self.is_paused(id)) {
                let now = self.now;
                let engine = self.engines.get_mut(&id).expect("current");
                if engine.detach_started.is_none() {
                    engine.detach_started = Some(now);
                    engine.primary.detach(now);
                    self.report.detaches += 1;
                    self.log(format!("control: detach engine {id}"));
                }
            }
        }
    }

    fn current_node(&self) -> Option<NodeId> {
        self.arbiter
            .current
            .and_then(|id| self.engines.get(&id))
            .map(|e| e.node)
    }

    /// Attaches a new primary when the current one is gone, cut off, or
    /// stuck detaching.
    fn failover(&mut self) {
        let healthy = match self.arbiter.current.and_then(|id| self.engines.get(&id)) {
            Some(engine) => {
                self.reachable(engine.node)
                    && engine
                        .detach_started
                        .is_none_or(|since| self.now.saturating_sub(since) < 20_000)
            }
            None => false,
        };
        if healthy {
            self.failover_at = None;
            return;
        }
        let Some(at) = self.failover_at else {
            let delay = if self.arbiter.current.is_none() && self.arbiter.view.primaries.is_empty()
            {
                // Detached: the next attach comes soon.
                self.rng.gen_range(50..=1_000)
            } else {
                self.rng.gen_range(1_000..=6_000)
            };
            self.failover_at = Some(self.now + delay);
            return;
        };
        if self.now < at {
            return;
        }
        let current = self.current_node();
        let mut candidates: Vec<NodeId> = self
            .diskful_nodes()
            .into_iter()
            .filter(|&n| self.reachable(n) && Some(n) != current)
            .collect();
        if candidates.is_empty() {
            return;
        }
        // Mostly an up-to-date node.
        if self.rng.gen_bool(0.7) {
            let in_sync: Vec<NodeId> = candidates
                .iter()
                .copied()
                .filter(|n| self.arbiter.view.in_sync.contains(n))
                .collect();
            if !in_sync.is_empty() {
                candidates = in_sync;
            }
        }
        let node = *candidates.choose(&mut self.rng).expect("not empty");
        self.failover_at = None;
        self.attach(node);
    }

    fn attach(&mut self, node: NodeId) {
        if self.arbiter.view.in_sync.is_empty() {
            self.log(format!(
                "control: attach on node {node} refused: no up-to-date replica"
            ));
            return;
        }
        // A node that is still a primary restarted its engine (a crash):
        // it reattaches, as the node does; any other attach takes the
        // volume over from whoever was primary (a failover or a forced
        // move), which fences it.
        let now_ms = self.now;
        let name = self.arbiter.volume.clone();
        let command = if self.arbiter.view.primaries.contains(&node) {
            Command::ReattachVolume { name, node, now_ms }
        } else {
            Command::AttachVolume {
                name,
                node,
                allow_two_primaries: false,
                force_takeover: true,
                now_ms,
            }
        };
        let generation = match self.arbiter.apply(node, now_ms, command) {
            Ok(Reply::Attached { generation, .. } | Reply::Generation(generation)) => generation,
            answer => {
                self.violate(format!(
                    "the control plane answered an attach on node {node} with {answer:?}"
                ));
                return;
            }
        };
        let id = self.next_engine;
        self.next_engine += 1;
        self.report.attaches += 1;
        let n = self.nodes.get_mut(&node).expect("a node");
        n.side
            .as_mut()
            .expect("an attached node is up")
            .set_primary_at(generation);
        n.durable.primary_at = Some(generation);
        let config = EngineConfig {
            me: node,
            // As the node: the recorded size, whether or not every
            // replica's agent has grown its copy yet.
            size_bytes: self.blocks * BLOCK,
            view: self.arbiter.view.clone(),
            policy: self.cfg.policy,
            resync_rate: self.cfg.resync_rate,
            dirty_maps: n.durable.dirty_maps.clone(),
        };
        let maps: Vec<String> = config
            .dirty_maps
            .iter()
            .map(|(peer, map)| {
                format!(
                    "{peer}: since g{} full {} {:?}",
                    map.since,
                    map.full,
                    map.regions.iter().collect::<Vec<_>>()
                )
            })
            .collect();
        self.log(format!(
            "control: attach engine {id} on node {node} at g{generation}, in sync {:?}, dirty maps {maps:?}",
            self.arbiter.view.in_sync.iter().map(|n| n.0).collect::<Vec<_>>()
        ));
        let mut primary = Primary::new(config, self.now);
        primary.set_thorough_checks(true);
        primary.set_bugs(EngineBugs {
            ack_before_quorum: self.cfg.ack_before_quorum,
        });
        self.engines.insert(
            id,
            Engine {
                node,
                generation,
                start_bytes: self.blocks * BLOCK,
                primary,
                control: PrimaryDriver::new(node, self.arbiter.volume.clone()).with_bugs(
                    PrimaryBugs {
                        ignore_refused_outdate: self.cfg.ignore_refused_outdate,
                    },
                ),
                links: BTreeMap::new(),
                want: BTreeSet::new(),
                connecting: BTreeSet::new(),
                local_readable: false,
                view_at: self.now,
                serving_seen: false,
                detach_started: None,
                sweep: None,
                sweep_blocks: SWEEP_BLOCKS,
                verify_counted_ms: None,
            },
        );
        self.arbiter.current = Some(id);
        self.views_changed();
    }

    fn partition(&mut self, cut: BTreeSet<NodeId>) {
        self.report.partitions += 1;
        self.log(format!(
            "fault: partition {:?} until {}",
            cut.iter().map(|n| n.0).collect::<Vec<_>>(),
            self.heal_at
        ));
        self.partitioned = cut;
        let crossing: Vec<LinkId> = self
            .links
            .iter()
            .filter(|(_, l)| {
                l.primary != l.member
                    && self.partitioned.contains(&l.primary) != self.partitioned.contains(&l.member)
            })
            .map(|(&id, _)| id)
            .collect();
        for link in crossing {
            self.close_link(link);
        }
    }

    fn heal_control(&mut self) {
        if self.control_cut.is_empty() {
            return;
        }
        self.log("fault: control plane reachable again".into());
        self.control_cut.clear();
        self.views_changed();
    }

    fn heal(&mut self) {
        if self.partitioned.is_empty() {
            return;
        }
        self.log("fault: partition healed".into());
        self.partitioned.clear();
        self.views_changed();
    }

    // --- the workload ------------------------------------------------------------

    /// A range of blocks inside the first `blocks` (the size the engine
    /// that gets the request serves).
    fn random_range(&mut self, blocks: u64) -> (u64, u64) {
        let count = if self.rng.gen_bool(0.5) {
            self.rng.gen_range(1..=2)
        } else {
            self.rng.gen_range(1..=16)
        };
        let per_region = REGION_BYTES / BLOCK;
        let regions = blocks.div_ceil(per_region);
        let first = match self.rng.gen_range(0..10) {
            0..=3 => self.rng.gen_range(0..48.min(blocks)),
            4..=5 => {
                let region = self.rng.gen_range(1..regions.max(2));
                (region * per_region).saturating_sub(self.rng.gen_range(0..16))
            }
            _ => self.rng.gen_range(0..blocks),
        };
        let first = first.min(blocks - 1);
        (first, count.min(blocks - first))
    }

    fn workload(&mut self) {
        let ids: Vec<EngineId> = self.engines.keys().copied().collect();
        for id in ids {
            if self.is_paused(id) {
                // Its client waits: what it sends stays in the socket.
                continue;
            }
            let current = self.arbiter.current == Some(id);
            let outstanding = self
                .ops
                .values()
                .filter(|op| {
                    op.engine == id && !matches!(op.kind, OpKind::Read { sweep: true, .. })
                })
                .count();
            if outstanding >= self.cfg.max_outstanding {
                continue;
            }
            let rate = if current {
                self.cfg.op_rate
            } else {
                self.cfg.op_rate / 4.0
            };
            if !self.chance(rate) {
                continue;
            }
            let kind = self.rng.gen_range(0..100);
            match kind {
                0..=44 => self.issue_write(id, false, false),
                45..=54 => self.issue_write(id, true, false),
                55..=62 => {
                    let fua = self.rng.gen_bool(0.2);
                    self.issue_write(id, fua, true)
                }
                63..=69 => {
                    self.issue_flush(id);
                }
                _ => {
                    let (first, count) = self.random_range(self.engine_blocks(id));
                    // What the node does: its own copy, without the
                    // engine, while it is up to date and the lease holds.
                    let engine = &self.engines[&id];
                    // Past the end of its own copy (an engine that started
                    // at a size its node has not grown to yet), the node
                    // asks the engine.
                    let local = engine.local_readable
                        && self.now < engine.primary.read_lease_until()
                        && self.rng.gen_bool(0.4)
                        && first + count <= self.nodes[&engine.node].store_blocks;
                    self.issue_read(id, first, count, local, false);
                }
            }
        }
    }

    fn sweep_pump(&mut self) {
        let ids: Vec<EngineId> = self.engines.keys().copied().collect();
        for id in ids {
            if self.is_paused(id) {
                continue;
            }
            while let Some(next) = self.engines[&id].sweep {
                // What the engine serves; a sweep started before it grew
                // goes on into the new blocks.
                let blocks = self.engine_blocks(id);
                if next >= blocks {
                    let pending = self.ops.values().any(|op| {
                        op.engine == id && matches!(op.kind, OpKind::Read { sweep: true, .. })
                    });
                    if !pending {
                        let engine = self.engines.get_mut(&id).expect("listed");
                        engine.sweep = None;
                        engine.sweep_blocks = SWEEP_BLOCKS;
                        self.log(format!("engine {id}: sweep done"));
                    }
                    break;
                }
                let in_flight = self
                    .ops
                    .values()
                    .filter(|op| {
                        op.engine == id && matches!(op.kind, OpKind::Read { sweep: true, .. })
                    })
                    .count();
                let (window, blocks) = match self.engines[&id].sweep_blocks {
                    1 => (4 * SWEEP_WINDOW, 1),
                    blocks => (SWEEP_WINDOW, blocks),
                };
                if in_flight >= window {
                    break;
                }
                let count = blocks.min(self.engine_blocks(id) - next);
                self.engines.get_mut(&id).expect("listed").sweep = Some(next + count);
                self.issue_read(id, next, count, false, true);
            }
        }
    }

    fn new_op(&mut self, engine: EngineId, kind: OpKind) -> u64 {
        let id = self.next_op;
        self.next_op += 1;
        let issued = self.tick_lc();
        let generation = self.engines[&engine].generation;
        let node = self.engines[&engine].node;
        self.ops.insert(
            id,
            Op {
                engine,
                node,
                generation,
                issued,
                kind,
            },
        );
        id
    }

    fn issue_write(&mut self, engine: EngineId, fua: bool, zero: bool) {
        let (first, count) = self.random_range(self.engine_blocks(engine));
        self.issue_write_at(engine, first, count, fua, zero);
    }

    fn issue_write_at(&mut self, engine: EngineId, first: u64, count: u64, fua: bool, zero: bool) {
        let id = self.next_op;
        let tags: Vec<u64> = if zero {
            vec![0; count as usize]
        } else {
            (0..count).map(|i| tag_for(id, i)).collect()
        };
        if !zero && self.now < self.pools_full_until {
            // Whatever each replica holds, this one fits on none of them.
            self.no_room.extend(tags.iter().copied());
        }
        let payload = if zero {
            Payload::Zeroes {
                length: count * BLOCK,
                trim: self.rng.gen_bool(0.5),
            }
        } else {
            Payload::data(data_of(&tags))
        };
        if let Payload::Data(data) = &payload {
            self.payloads.insert(data.as_ptr() as usize, id);
        }
        // Reads in flight over these blocks may see it.
        for op in self.ops.values_mut() {
            if let OpKind::Read {
                first: read_first,
                count: read_count,
                allowed,
                ..
            } = &mut op.kind
            {
                for b in first.max(*read_first)..(first + count).min(*read_first + *read_count) {
                    allowed[(b - *read_first) as usize].insert(tags[(b - first) as usize]);
                }
            }
        }
        let op = self.new_op(
            engine,
            OpKind::Write {
                first,
                tags,
                fua,
                zero,
                payload: Some(payload.clone()),
                admitted: BTreeMap::new(),
            },
        );
        debug_assert_eq!(op, id);
        self.log(format!(
            "client: op{op} on engine {engine}: write b{first}+{count}{}{}",
            if fua { " fua" } else { "" },
            if zero { " zeroes" } else { "" }
        ));
        let now = self.now;
        self.engines
            .get_mut(&engine)
            .expect("running")
            .primary
            .client(
                op,
                ClientRequest::Write {
                    offset: first * BLOCK,
                    payload,
                    fua,
                },
                now,
            );
    }

    fn issue_flush(&mut self, engine: EngineId) -> u64 {
        let op = self.new_op(engine, OpKind::Flush);
        self.log(format!("client: op{op} on engine {engine}: flush"));
        let now = self.now;
        self.engines
            .get_mut(&engine)
            .expect("running")
            .primary
            .client(op, ClientRequest::Flush, now);
        op
    }

    /// Per block of the range, every version a copy may hold now: what the
    /// model allows plus the writes still in flight on any engine.
    fn possible_now(&self, first: u64, count: u64) -> Vec<BTreeSet<u64>> {
        let mut allowed: Vec<BTreeSet<u64>> = (first..first + count)
            .map(|b| self.model[b as usize].allowed())
            .collect();
        for op in self.ops.values() {
            if let OpKind::Write {
                first: write_first,
                tags,
                ..
            } = &op.kind
            {
                let end = write_first + tags.len() as u64;
                for b in first.max(*write_first)..(first + count).min(end) {
                    allowed[(b - first) as usize].insert(tags[(b - write_first) as usize]);
                }
            }
        }
        allowed
    }

    fn issue_read(&mut self, engine: EngineId, first: u64, count: u64, local: bool, sweep: bool) {
        let allowed = self.possible_now(first, count);
        let op = self.new_op(
            engine,
            OpKind::Read {
                first,
                count,
                local,
                sweep,
                allowed,
            },
        );
        self.log(format!(
            "client: op{op} on engine {engine}: {}read b{first}+{count}",
            if sweep {
                "sweep "
            } else if local {
                "local "
            } else {
                ""
            }
        ));
        if local {
            self.report.local_reads += 1;
            let node = self.engines[&engine].node;
            self.disk_submit(node, 0, DiskKind::LocalRead { op, first, count });
        } else {
            let now = self.now;
            self.engines
                .get_mut(&engine)
                .expect("running")
                .primary
                .client(
                    op,
                    ClientRequest::Read {
                        offset: first * BLOCK,
                        length: count * BLOCK,
                    },
                    now,
                );
        }
    }

    // --- the settle phase --------------------------------------------------------

    fn begin_settle(&mut self) {
        self.log("settle: heal everything".into());
        // A stopped node goes on first, still under the run's checks.
        let paused: Vec<NodeId> = self.paused.keys().copied().collect();
        for node in paused {
            self.resume(node);
        }
        self.phase = Phase::Converge;
        self.settle_started = self.now;
        self.heal();
        self.heal_control();
        let nodes: Vec<NodeId> = self.nodes.keys().copied().collect();
        for node in nodes {
            if !self.nodes[&node].up {
                self.restart(node);
            }
            if let Some(disk) = self.nodes.get_mut(&node).unwrap().disk.as_mut() {
                disk.slow_until = 0;
                disk.stall_until = 0;
                disk.io_until = 0;
                disk.full_until = 0;
            }
        }
        self.pools_full_until = 0;
    }

    /// Why the volume has not converged yet, if it has not.
    fn not_converged(&self) -> Option<String> {
        let Some(id) = self.arbiter.current else {
            return Some("no engine".into());
        };
        let Some(engine) = self.engines.get(&id) else {
            return Some("the current engine is gone".into());
        };
        if self.engines.len() > 1 {
            return Some(format!(
                "fenced engines still run: {:?}",
                self.engines
                    .keys()
                    .filter(|&&e| e != id)
                    .collect::<Vec<_>>()
            ));
        }
        if let Some(node) = self.nodes.iter().find(|(_, n)| !n.up).map(|(&id, _)| id) {
            return Some(format!("node {node} is down"));
        }
        if !engine.primary.is_serving() {
            return Some("the engine is not serving".into());
        }
        if engine.detach_started.is_some() {
            return Some("the engine is detaching".into());
        }
        let diskful: BTreeSet<NodeId> = self.diskful_nodes().into_iter().collect();
        if self.arbiter.view.in_sync != diskful {
            return Some(format!(
                "in sync {:?}, members {:?}",
                self.arbiter.view.in_sync,
                engine.primary.member_states()
            ));
        }
        let states = engine.primary.member_states();
        if states.iter().any(|(_, state, _)| state != "up-to-date") {
            return Some(format!("member states {states:?}"));
        }
        if let Some((node, n)) = self
            .nodes
            .iter()
            .find(|(_, n)| n.diskful && n.store_blocks < self.blocks)
        {
            return Some(format!(
                "node {node}'s agent has not grown its copy yet ({} blocks of {})",
                n.store_blocks, self.blocks
            ));
        }
        if engine.primary.size_bytes() != self.blocks * BLOCK {
            return Some(format!(
                "the engine serves {} bytes of the volume's {}",
                engine.primary.size_bytes(),
                self.blocks * BLOCK
            ));
        }
        let waiting: Vec<u64> = self
            .ops
            .iter()
            .filter(|(_, op)| !matches!(op.kind, OpKind::Read { sweep: true, .. }))
            .map(|(&id, _)| id)
            .collect();
        if !waiting.is_empty() {
            return Some(format!("client requests still in flight: {waiting:?}"));
        }
        None
    }

    fn settle(&mut self) {
        if self.now.saturating_sub(self.settle_started) > SETTLE_LIMIT_MS {
            let why = self
                .not_converged()
                .unwrap_or_else(|| format!("{:?}", self.phase));
            self.violate(format!(
                "no convergence within {} s of healing: {why}",
                SETTLE_LIMIT_MS / 1000
            ));
            return;
        }
        match self.phase {
            Phase::Converge => {
                self.restore_lost_blocks();
                if self.not_converged().is_some() {
                    self.scrub();
                    return;
                }
                let engine = self.arbiter.current.expect("converged");
                let op = self.issue_flush(engine);
                self.log(format!("settle: converged; final flush op{op}"));
                self.phase = Phase::FinalFlush(op);
            }
            Phase::FinalFlush(op) => {
                if self.ops.contains_key(&op) {
                    return;
                }
                self.check_convergence();
                if self.cfg.final_crash && !self.final_crash_done {
                    self.final_crash_done = true;
                    let node = if self.rng.gen_bool(0.5) {
                        self.current_node().expect("converged")
                    } else {
                        *self.diskful_nodes().choose(&mut self.rng).expect("diskful")
                    };
                    self.log(format!("settle: final crash of node {node}"));
                    self.crash(node);
                    let time = self.now + self.rng.gen_range(200..=3_000);
                    self.at(time, Ev::Restart { node });
                    self.phase = Phase::Converge;
                } else {
                    let engine = self.arbiter.current.expect("converged");
                    self.engines.get_mut(&engine).expect("current").sweep = Some(0);
                    self.log("settle: final sweep".into());
                    self.phase = Phase::Sweep;
                }
            }
            Phase::Sweep => {
                let engine = self.arbiter.current.expect("converged");
                let done = self.engines.get(&engine).is_some_and(|e| e.sweep.is_none());
                if done {
                    let counters: Vec<_> =
                        self.engines.values().map(|e| e.primary.counters).collect();
                    for counters in counters {
                        self.count(counters);
                    }
                    // Snapshots the engines never reported taken are not
                    // recorded by the control plane, and their leftovers
                    // are deleted: only reported ones must agree.
                    let snapshots: Vec<SnapshotId> = self.snapshot_taken.keys().copied().collect();
                    for snapshot in snapshots {
                        self.check_snapshot(snapshot);
                    }
                    self.log("settle: done".into());
                    self.phase = Phase::Done;
                } else if !self.engines.contains_key(&engine) {
                    self.violate("the final engine vanished during the sweep".into());
                }
            }
            Phase::Run | Phase::Done => {}
        }
    }

    /// Every 10 s without convergence, a read sweep through the engine: its
    /// read failover repairs blocks that are bad on one copy, which a
    /// resync cannot copy when every source has a bad block in the region.
    fn scrub(&mut self) {
        let Some(engine) = self.arbiter.current else {
            return;
        };
        let Some(e) = self.engines.get_mut(&engine) else {
            return;
        };
        if !e.primary.is_serving() || e.sweep.is_some() {
            return;
        }
        if self.now.saturating_sub(self.settle_started) / 10_000 <= self.scrubs {
            return;
        }
        self.scrubs += 1;
        e.sweep = Some(0);
        e.sweep_blocks = 1;
        self.log("settle: scrub".into());
    }

    /// Blocks corrupt on every in-sync replica are lost: no resync can copy
    /// their region. The operator restores them (a client write) so that
    /// the run can converge.
    fn restore_lost_blocks(&mut self) {
        let Some(engine) = self.arbiter.current else {
            return;
        };
        if !self
            .engines
            .get(&engine)
            .is_some_and(|e| e.primary.is_serving())
        {
            return;
        }
        let in_sync: Vec<NodeId> = self.arbiter.view.in_sync.iter().copied().collect();
        let mut lost = Vec::new();
        for b in 0..self.blocks {
            let all_bad = in_sync.iter().all(|n| {
                let node = &self.nodes[n];
                node.up && {
                    let disk = node.disk.as_ref().expect("diskful");
                    disk.corrupt[b as usize] && disk.volatile[b as usize] == NONE
                }
            });
            let pending = self.ops.values().any(|op| {
                matches!(&op.kind, OpKind::Write { first, tags, .. }
                    if *first <= b && b < first + tags.len() as u64)
            });
            if all_bad && !pending {
                lost.push(b);
            }
        }
        let served = self.engine_blocks(engine);
        for b in lost.into_iter().filter(|&b| b < served).take(4) {
            self.log(format!(
                "settle: block {b} is corrupt on every in-sync replica; restore it"
            ));
            self.issue_write_at(engine, b, 1, true, false);
        }
    }

    /// Invariant 4: every diskful replica holds the same content, the
    /// model's, all of it durable.
    fn check_convergence(&mut self) {
        let diskful = self.diskful_nodes();
        let reference = diskful[0];
        for n in &diskful {
            let node = &self.nodes[n];
            if node.store_blocks < self.blocks {
                self.violate(format!(
                    "after convergence node {n}'s copy holds {} blocks of the volume's {}",
                    node.store_blocks, self.blocks
                ));
                return;
            }
            let disk = node.disk.as_ref().expect("diskful");
            if let Some(b) = (self.blocks..self.max_blocks).find(|&b| disk.top(b) != 0) {
                self.violate(format!(
                    "node {n} holds {} at block {b}, past the volume's end",
                    describe_tag(disk.top(b))
                ));
                return;
            }
        }
        for b in 0..self.blocks {
            let tops: Vec<(NodeId, u64)> = diskful
                .iter()
                .map(|n| (*n, self.nodes[n].disk.as_ref().unwrap().top(b)))
                .collect();
            let first = tops[0].1;
            if tops.iter().any(|&(_, tag)| tag != first) {
                let shown: Vec<String> = tops
                    .iter()
                    .map(|(n, tag)| format!("node {n}: {}", describe_tag(*tag)))
                    .collect();
                self.violate(format!(
                    "after convergence the replicas differ at block {b}: {shown:?}; model {:?}",
                    self.model[b as usize]
                ));
                return;
            }
            let allowed = self.model[b as usize].allowed();
            if !allowed.contains(&first) {
                self.violate(format!(
                    "after convergence block {b} holds {} on every replica (node {reference} and others), the model allows {:?}: {:?}",
                    describe_tag(first),
                    allowed.iter().map(|t| describe_tag(*t)).collect::<Vec<_>>(),
                    self.model[b as usize]
                ));
                return;
            }
            for n in &diskful {
                let disk = self.nodes[n].disk.as_ref().unwrap();
                if disk.volatile[b as usize] != NONE {
                    self.violate(format!(
                        "after the final flush node {n} still holds block {b} only in its volatile layer"
                    ));
                    return;
                }
            }
        }
        self.log("check: every replica holds the model's content".into());
    }

    // --- links -------------------------------------------------------------------

    fn schedule_connect(&mut self, engine: EngineId, node: NodeId, delay: Time) {
        let Some(e) = self.engines.get_mut(&engine) else {
            return;
        };
        if e.connecting.insert(node) {
            let time = self.now + delay;
            self.at(time, Ev::Connect { engine, node });
        }
    }

    fn connect(&mut self, engine: EngineId, node: NodeId) {
        let Some(e) = self.engines.get_mut(&engine) else {
            return;
        };
        e.connecting.remove(&node);
        if e.links.contains_key(&node) || !e.want.contains(&node) {
            return;
        }
        let (primary, generation) = (e.node, e.generation);
        let now = self.now;
        if self.can_link(primary, node) {
            let link = self.next_link;
            self.next_link += 1;
            self.links.insert(
                link,
                Link {
                    engine,
                    primary,
                    member: node,
                    generation,
                    state: LinkState::Open,
                    to_at: now,
                    from_at: now,
                    replica_closing: false,
                },
            );
            self.nodes.get_mut(&node).unwrap().links.insert(link);
            self.log(format!("engine {engine}: link {link} to node {node} up"));
            let e = self.engines.get_mut(&engine).expect("checked");
            e.links.insert(node, link);
            e.primary.link_up(node, now);
        } else {
            let e = self.engines.get_mut(&engine).expect("checked");
            e.primary.link_down(node, now);
            let delay = self.rng.gen_range(200..=1_500);
            self.schedule_connect(engine, node, delay);
        }
    }

    /// Closes a link at once: what is in flight is lost; both ends learn.
    fn close_link(&mut self, link: LinkId) {
        let Some(l) = self.links.remove(&link) else {
            return;
        };
        if let Some(node) = self.nodes.get_mut(&l.member) {
            node.links.remove(&link);
            if let Some(side) = node.side.as_mut() {
                side.link_closed(link);
            }
        }
        let now = self.now;
        let current = self
            .engines
            .get(&l.engine)
            .is_some_and(|engine| engine.links.get(&l.member) == Some(&link));
        if current {
            self.log(format!(
                "engine {}: link {link} to node {} down",
                l.engine, l.member
            ));
            if let Some(engine) = self.engines.get_mut(&l.engine) {
                engine.links.remove(&l.member);
                engine.primary.link_down(l.member, now);
                let delay = self.rng.gen_range(100..=1_000);
                self.schedule_connect(l.engine, l.member, delay);
            }
        }
    }

    /// `message` as a data link carries it: the real encoder's frame body.
    /// (The length prefix around it is crates/node's frame layer, which
    /// refuses bodies over `MAX_FRAME_BYTES`.)
    fn encode_to(&mut self, message: &ToReplica) -> Vec<u8> {
        let mut frame = Vec::new();
        message.encode(&mut frame);
        self.check_frame(frame.len(), || summary_to(message));
        frame
    }

    fn encode_from(&mut self, message: &FromReplica) -> Vec<u8> {
        let mut frame = Vec::new();
        message.encode(&mut frame);
        self.check_frame(frame.len(), || summary_from(message));
        frame
    }

    fn check_frame(&mut self, length: usize, summary: impl FnOnce() -> String) {
        if length > MAX_FRAME_BYTES {
            let summary = summary();
            self.violate(format!(
                "{summary} encodes to {length} bytes, more than a peer accepts ({MAX_FRAME_BYTES})"
            ));
        }
    }

    fn replica_send(&mut self, link: LinkId, message: FromReplica) {
        let Some(l) = self.links.get(&link) else {
            return;
        };
        if l.state != LinkState::Open || l.replica_closing {
            return;
        }
        let (from, to) = (l.member, l.primary);
        let delay = self.net_delay(from, to);
        let l = self.links.get_mut(&link).expect("checked");
        l.from_at = l.from_at.max(self.now + delay);
        let time = l.from_at;
        let frame = self.encode_from(&message);
        self.at(time, Ev::Reply { link, frame });
    }

    /// The replica refuses on `link`: the refusal goes out, then the link
    /// closes.
    fn replica_refuse(&mut self, link: LinkId, message: FromReplica) {
        let summary = summary_from(&message);
        self.replica_send(link, message);
        let Some(l) = self.links.get_mut(&link) else {
            return;
        };
        l.replica_closing = true;
        let time = l.from_at.max(self.now) + 1;
        let member = l.member;
        self.log(format!("node {member}: link {link}: {summary}; closing"));
        self.at(time, Ev::Close { link });
    }

    /// The replica closes `link` after what it sent on it.
    fn replica_close(&mut self, link: LinkId) {
        let Some(l) = self.links.get_mut(&link) else {
            return;
        };
        l.replica_closing = true;
        let time = l.from_at.max(self.now) + 1;
        self.at(time, Ev::Close { link });
    }

    // --- the replica: the node's driver over a simulated disk and network --------------

    fn replica_receive(&mut self, link: LinkId, message: ToReplica, op: Option<u64>) {
        let Some(l) = self.links.get(&link) else {
            return;
        };
        if l.replica_closing {
            return;
        }
        let member = l.member;
        let engine = l.engine;
        let node = self.nodes.get_mut(&member).expect("a node");
        if !node.up {
            return;
        }
        let summary = summary_to(&message);
        if self.cfg.trace {
            eprintln!(
                "replication sim seed {}: [{:>8.3}s]   node {member}: link {link} (engine {engine}) receives {summary}",
                self.seed,
                self.now as f64 / 1000.0
            );
        }
        // A primary never sends data to a tiebreaker (checked before the
        // driver, which would only close the link).
        if !node.diskful
            && !matches!(
                message,
                ToReplica::Hello { .. } | ToReplica::Goodbye | ToReplica::Ping { .. }
            )
        {
            self.violate(format!(
                "engine {engine} sent {summary} to tiebreaker {member}"
            ));
            return;
        }
        let hello = match &message {
            ToReplica::Hello {
                generation,
                primary,
            } => Some((*generation, *primary)),
            _ => None,
        };
        let now = self.now;
        let side = node.side.as_mut().expect("up");
        let accepted_before = side.accepted();
        // The node's own driver decides; the simulator carries it out.
        let step = self
            .replica_driver
            .receive(side, link, message, now, node.diskful);
        match step {
            Step::Refuse(refusal) => {
                self.log(format!(
                    "node {member}: link {link}: {summary} refused or not admitted"
                ));
                self.replica_refuse(link, refusal);
            }
            Step::Wait { until_ms } => {
                // It holds leases of older generations: the link waits,
                // and they are refused meanwhile.
                let (generation, primary) = hello.expect("only a hello waits");
                self.log(format!(
                    "node {member}: link {link} (engine {engine}): {summary} waits until {until_ms} for older leases"
                ));
                self.close_older_links(member, link, generation);
                let frame = self.encode_to(&ToReplica::Hello {
                    generation,
                    primary,
                });
                self.at(
                    until_ms,
                    Ev::Deliver {
                        link,
                        frame,
                        op: None,
                    },
                );
            }
            Step::Welcome { durable, welcome } => {
                let (generation, _) = hello.expect("only a hello is welcomed");
                node.max_accepted = node.max_accepted.max(generation);
                self.log(format!(
                    "node {member}: link {link} (engine {engine}): {summary} accepted"
                ));
                if durable.accepted > accepted_before {
                    self.close_older_links(member, link, generation);
                }
                self.persist(
                    member,
                    PersistOp::Accept {
                        durable,
                        link,
                        welcome,
                    },
                );
            }
            Step::Reply(reply) => {
                if let Some((generation, _)) = hello {
                    // Welcomed without a persist (a bug switch).
                    node.max_accepted = node.max_accepted.max(generation);
                    self.log(format!(
                        "node {member}: link {link} (engine {engine}): {summary} accepted, not persisted"
                    ));
                    if generation > accepted_before {
                        self.close_older_links(member, link, generation);
                    }
                }
                self.replica_send(link, reply);
            }
            Step::Close { durable } => {
                self.log(format!(
                    "node {member}: link {link}: goodbye (clean: {})",
                    durable.is_some()
                ));
                if durable.is_some() {
                    self.persist(member, PersistOp::Clean);
                }
                self.replica_close(link);
            }
            Step::DataForTiebreaker => {
                self.violate(format!(
                    "engine {engine} sent {summary} to tiebreaker {member}"
                ));
            }
            Step::Store(message) => self.replica_store(link, message, op),
        }
    }

    /// An admitted message goes to the member's disk.
    fn replica_store(&mut self, link: LinkId, message: ToReplica, op: Option<u64>) {
        let l = &self.links[&link];
        let (member, engine, generation) = (l.member, l.engine, l.generation);
        let summary = summary_to(&message);
        // One primary: nothing of a fenced generation is carried out.
        let accepted = self.nodes[&member].side.as_ref().expect("up").accepted();
        if generation < accepted {
            self.violate(format!(
                "node {member} carries out {summary} of engine {engine} at g{generation} after accepting g{accepted} (two primaries)"
            ));
            return;
        }
        if let Some(op) = op {
            if let Some(Op {
                kind: OpKind::Write { admitted, .. },
                ..
            }) = self.ops.get_mut(&op)
            {
                admitted.insert(member, accepted);
            }
        }
        // Past the end of this node's copy: its store refuses it (as
        // `driver::replica::execute` does), and a running engine must not
        // have sent it past the size it started with (it grows only onto
        // copies reported grown).
        let range = match &message {
            ToReplica::Write {
                offset, payload, ..
            } => Some((*offset, payload.length())),
            ToReplica::Read { offset, length, .. } | ToReplica::Hash { offset, length, .. } => {
                Some((*offset, *length))
            }
            _ => None,
        };
        if let Some((offset, length)) = range {
            let end = offset + length;
            let store_end = self.nodes[&member].store_blocks * BLOCK;
            if end <= self.max_blocks * BLOCK && end > store_end {
                if let Some(start) = self.engines.get(&engine).map(|e| e.start_bytes) {
                    if end > start {
                        self.violate(format!(
                            "engine {engine} (started at {start} bytes, now {}) sent {summary} to node {member}, whose copy holds {store_end} bytes",
                            self.engines[&engine].primary.size_bytes()
                        ));
                        return;
                    }
                }
                let error = ReplicaError::Refused(format!("{summary} is outside the volume"));
                let reply = match message {
                    ToReplica::Write { seq, .. } => FromReplica::Ack {
                        seq,
                        result: Err(error),
                    },
                    ToReplica::Read { id, .. } => FromReplica::ReadReply {
                        id,
                        result: Err(error),
                    },
                    ToReplica::Hash { id, .. } => FromReplica::HashReply {
                        id,
                        result: Err(error),
                    },
                    _ => unreachable!("a range"),
                };
                self.log(format!(
                    "node {member}: refuses {summary}: its copy holds {store_end} bytes"
                ));
                self.replica_send(link, reply);
                return;
            }
        }
        let kind = match message {
            ToReplica::Write {
                seq,
                offset,
                payload,
                fua,
                ..
            } => {
                let length = payload.length();
                if !offset.is_multiple_of(BLOCK)
                    || !length.is_multiple_of(BLOCK)
                    || offset + length > self.max_blocks * BLOCK
                    || length == 0
                {
                    self.violate(format!("bad write from engine {engine}: {summary}"));
                    return;
                }
                let tags = match &payload {
                    Payload::Data(data) => match tags_of(data) {
                        Some(tags) => tags,
                        None => {
                            self.violate(format!(
                                "engine {engine} sent data that is no block of any write: {summary}"
                            ));
                            return;
                        }
                    },
                    Payload::Zeroes { length, .. } => vec![0; (length / BLOCK) as usize],
                };
                DiskKind::Write {
                    first: offset / BLOCK,
                    tags,
                    fua,
                    seq,
                }
            }
            ToReplica::Flush { seq } => DiskKind::Flush { seq },
            ToReplica::Snapshot { seq, snapshot } => DiskKind::Snapshot { seq, snapshot },
            ToReplica::Read { id, offset, length } => {
                if !offset.is_multiple_of(BLOCK)
                    || !length.is_multiple_of(BLOCK)
                    || offset + length > self.max_blocks * BLOCK
                    || length == 0
                {
                    self.violate(format!("bad read from engine {engine}: {summary}"));
                    return;
                }
                DiskKind::Read {
                    id,
                    first: offset / BLOCK,
                    count: length / BLOCK,
                }
            }
            ToReplica::Hash { id, offset, length } => {
                if !offset.is_multiple_of(BLOCK)
                    || !length.is_multiple_of(BLOCK)
                    || offset + length > self.max_blocks * BLOCK
                    || length == 0
                {
                    self.violate(format!("bad hash request from engine {engine}: {summary}"));
                    return;
                }
                DiskKind::Hash {
                    id,
                    first: offset / BLOCK,
                    count: length / BLOCK,
                }
            }
            ToReplica::Hello { .. } | ToReplica::Goodbye | ToReplica::Ping { .. } => {
                unreachable!("the driver answers these itself")
            }
        };
        self.disk_submit(member, link, kind);
    }

    /// With `fence_closes_old_links`: the member refuses its links of
    /// generations older than `generation` (the one `link` brings) and
    /// closes them.
    fn close_older_links(&mut self, member: NodeId, link: LinkId, generation: Generation) {
        if !self.cfg.fence_closes_old_links {
            return;
        }
        let older: Vec<LinkId> = self.nodes[&member]
            .links
            .iter()
            .copied()
            .filter(|&other| {
                other != link
                    && self
                        .links
                        .get(&other)
                        .is_some_and(|o| o.generation < generation)
            })
            .collect();
        for other in older {
            self.replica_refuse(other, FromReplica::Refused { newer: generation });
        }
    }

    fn persist(&mut self, node: NodeId, op: PersistOp) {
        let delay = if self.lat.gen_bool(0.05) {
            self.lat.gen_range(5..=60)
        } else {
            self.lat.gen_range(0..=3)
        };
        let n = self.nodes.get_mut(&node).expect("a node");
        n.persist_at = n.persist_at.max(self.now) + delay;
        let (time, incarnation) = (n.persist_at, n.incarnation);
        self.at(
            time,
            Ev::Persist {
                node,
                incarnation,
                op,
            },
        );
    }

    fn persist_done(&mut self, node: NodeId, incarnation: u64, op: PersistOp) {
        let n = self.nodes.get_mut(&node).expect("a node");
        if n.incarnation != incarnation || !n.up {
            return;
        }
        match op {
            PersistOp::Accept {
                durable,
                link,
                welcome,
            } => {
                n.durable.accepted = durable.accepted;
                n.durable.clean = durable.clean;
                let summary = summary_from(&welcome);
                self.log(format!("node {node}: link {link}: persisted; {summary}"));
                self.replica_send(link, welcome);
            }
            PersistOp::Clean => {
                n.durable.clean = true;
                self.log(format!("node {node}: persisted clean"));
            }
            PersistOp::Dirty {
                engine,
                token,
                peer,
                map,
            } => {
                let text = format!(
                    "node {node}: persisted dirty map {token} for {peer}: since g{} full {} {:?}",
                    map.since,
                    map.full,
                    map.regions.iter().collect::<Vec<_>>()
                );
                n.durable.dirty_maps.insert(peer, map);
                self.log(text);
                let now = self.now;
                if let Some(engine) = self.engines.get_mut(&engine) {
                    engine.primary.persisted(token, now);
                }
            }
            PersistOp::Forget { peer } => {
                n.durable.dirty_maps.remove(&peer);
                self.log(format!("node {node}: forgot the dirty map of {peer}"));
            }
        }
    }

    // --- disks ---------------------------------------------------------------------

    fn disk_submit(&mut self, node: NodeId, link: LinkId, kind: DiskKind) {
        let now = self.now;
        let n = self.nodes.get_mut(&node).expect("a node");
        let incarnation = n.incarnation;
        let disk = n.disk.as_mut().expect("diskful");
        let extra = match &kind {
            DiskKind::Write { fua: true, .. } | DiskKind::Flush { .. } => self.lat.gen_range(1..=4),
            _ => 0,
        };
        let mut latency = if now < disk.slow_until {
            self.lat.gen_range(5..=300)
        } else {
            self.lat.gen_range(0..=2)
        } + extra;
        if now < disk.stall_until {
            latency = latency.max(disk.stall_until - now + self.lat.gen_range(0..=5));
        }
        let ready = now + latency;
        let key = disk.next;
        disk.next += 1;
        disk.pending.insert(key, DiskOp { link, ready, kind });
        self.at(ready, Ev::Disk { node, incarnation });
    }

    fn disk_run(&mut self, node: NodeId, incarnation: u64) {
        loop {
            let n = self.nodes.get_mut(&node).expect("a node");
            if n.incarnation != incarnation || !n.up {
                return;
            }
            let disk = n.disk.as_mut().expect("diskful");
            let now = self.now;
            let chosen = disk
                .pending
                .iter()
                .find(|(&key, op)| op.ready <= now && !disk.blocked(key, op))
                .map(|(&key, _)| key);
            let Some(key) = chosen else {
                return;
            };
            let op = disk.pending.remove(&key).expect("listed");
            let io = now < disk.io_until;
            if self.cfg.trace {
                eprintln!(
                    "replication sim seed {}: [{:>8.3}s]   node {node}: disk completes {:?}{}",
                    self.seed,
                    now as f64 / 1000.0,
                    match &op.kind {
                        DiskKind::Write {
                            first,
                            tags,
                            fua,
                            seq,
                        } => format!(
                            "write s{seq} b{first}+{} fua {fua} first tag {}{}",
                            tags.len(),
                            describe_tag(tags[0]),
                            // TRIREME_SIM_WATCH=<block> shows one block's tag.
                            std::env::var("TRIREME_SIM_WATCH")
                                .ok()
                                .and_then(|b| b.parse::<u64>().ok())
                                .filter(|b| *b >= *first && *b < first + tags.len() as u64)
                                .map(|b| format!(
                                    " block {b}: {}",
                                    describe_tag(tags[(b - first) as usize])
                                ))
                                .unwrap_or_default()
                        ),
                        other => format!("{other:?}"),
                    },
                    if io { " (I/O error)" } else { "" }
                );
            }
            match op.kind {
                DiskKind::Write {
                    first,
                    tags,
                    fua,
                    seq,
                } => {
                    let lie = self.cfg.drop_writes > 0.0 && self.rng.gen_bool(self.cfg.drop_writes);
                    let n = self.nodes.get_mut(&node).expect("a node");
                    let disk = n.disk.as_mut().expect("diskful");
                    let data = tags.iter().any(|&tag| tag != 0);
                    let full = (data && now < disk.full_until)
                        || tags.iter().any(|tag| self.no_room.contains(tag));
                    let result = if io {
                        Err(ReplicaError::Io("simulated device error".into()))
                    } else if full {
                        Err(ReplicaError::NoSpace("simulated".into()))
                    } else if lie {
                        Ok(())
                    } else {
                        for (i, &tag) in tags.iter().enumerate() {
                            let b = first as usize + i;
                            if fua {
                                disk.durable[b] = tag;
                                disk.corrupt[b] = false;
                                disk.volatile[b] = NONE;
                            } else {
                                disk.volatile[b] = tag;
                            }
                        }
                        Ok(())
                    };
                    self.replica_send(op.link, FromReplica::Ack { seq, result });
                }
                DiskKind::Flush { seq } => {
                    let result = if io {
                        Err(ReplicaError::Io("simulated device error".into()))
                    } else {
                        for b in 0..disk.volatile.len() {
                            if disk.volatile[b] != NONE {
                                disk.durable[b] = disk.volatile[b];
                                disk.corrupt[b] = false;
                                disk.volatile[b] = NONE;
                            }
                        }
                        Ok(())
                    };
                    self.replica_send(op.link, FromReplica::Ack { seq, result });
                }
                DiskKind::Read { id, first, count } => {
                    let result = disk.read(first, count, now);
                    self.replica_send(op.link, FromReplica::ReadReply { id, result });
                }
                DiskKind::Snapshot { seq, snapshot } => {
                    let result = if io {
                        Err(ReplicaError::Io("simulated device error".into()))
                    } else {
                        for b in 0..disk.volatile.len() {
                            if disk.volatile[b] != NONE {
                                disk.durable[b] = disk.volatile[b];
                                disk.corrupt[b] = false;
                                disk.volatile[b] = NONE;
                            }
                        }
                        let content = disk.durable.clone();
                        n.snapshots.insert(snapshot, content);
                        Ok(())
                    };
                    self.replica_send(op.link, FromReplica::Ack { seq, result });
                }
                DiskKind::Hash { id, first, count } => {
                    let result = disk.hashes(first, count, now);
                    self.replica_send(op.link, FromReplica::HashReply { id, result });
                }
                DiskKind::LocalRead { op, first, count } => {
                    let result = disk.read(first, count, now);
                    self.local_read_done(op, result);
                }
            }
        }
    }

    fn local_read_done(&mut self, op: u64, result: Result<ReadData, ReplicaError>) {
        let result = result.map(Completion::Read).map_err(|error| match error {
            ReplicaError::Io(message) => ClientError::Io(message),
            other => ClientError::Io(other.to_string()),
        });
        self.client_done(op, result);
    }

    // --- nodes ---------------------------------------------------------------------

    fn crash(&mut self, node: NodeId) {
        if !self.nodes[&node].up {
            return;
        }
        self.report.crashes += 1;
        let lc = self.tick_lc();
        let n = self.nodes.get_mut(&node).expect("a node");
        n.up = false;
        n.incarnation += 1;
        n.crashed_lc = lc;
        n.side = None;
        // The disk: unflushed writes are lost, or reached the platter
        // before the crash; in-flight writes are torn. A block that fits on
        // no replica (written while every pool was full) never lands: the
        // disk would have refused it. (Seed 3000058: one landed on the
        // copy that became the only up-to-date one, and no resync could
        // ever copy it to the others.)
        if let Some(disk) = n.disk.as_mut() {
            for op in std::mem::take(&mut disk.pending).into_values() {
                if let DiskKind::Write { first, tags, .. } = op.kind {
                    for (i, tag) in tags.into_iter().enumerate() {
                        if self.rng.gen_bool(0.3) && !self.no_room.contains(&tag) {
                            disk.durable[first as usize + i] = tag;
                            disk.corrupt[first as usize + i] = false;
                        }
                    }
                }
            }
            for b in 0..disk.volatile.len() {
                if disk.volatile[b] != NONE {
                    if self.rng.gen_bool(0.3) {
                        disk.durable[b] = disk.volatile[b];
                        disk.corrupt[b] = false;
                    }
                    disk.volatile[b] = NONE;
                }
            }
        }
        self.log(format!("fault: crash node {node}"));
        // Local reads queued on its disk are gone.
        let local: Vec<u64> = self
            .ops
            .iter()
            .filter(|(_, op)| {
                op.node == node && matches!(op.kind, OpKind::Read { local: true, .. })
            })
            .map(|(&id, _)| id)
            .collect();
        for id in local {
            self.ops.remove(&id);
        }
        // Its engine dies with it, and every link it had.
        let engines: Vec<EngineId> = self
            .engines
            .iter()
            .filter(|(_, e)| e.node == node)
            .map(|(&id, _)| id)
            .collect();
        for id in engines {
            self.report.primary_crashes += 1;
            let engine = self.engines.remove(&id).expect("listed");
            self.count(engine.primary.counters);
            if self.arbiter.current == Some(id) {
                self.arbiter.current = None;
            }
            self.log(format!("engine {id} dies with node {node}"));
            for link in engine.links.into_values() {
                self.close_link(link);
            }
            self.engine_gone(id);
        }
        let links: Vec<LinkId> = self
            .links
            .iter()
            .filter(|(_, l)| l.member == node || l.primary == node)
            .map(|(&id, _)| id)
            .collect();
        for link in links {
            self.close_link(link);
        }
        self.nodes.get_mut(&node).unwrap().links.clear();
        self.evaluate_losses();
    }

    fn restart(&mut self, node: NodeId) {
        let n = self.nodes.get_mut(&node).expect("a node");
        if n.up {
            return;
        }
        n.up = true;
        n.side = Some(
            ReplicaSide::new(n.durable.accepted, n.durable.primary_at, n.durable.clean)
                .after_restart(self.now),
        );
        let (accepted, clean) = (n.durable.accepted, n.durable.clean);
        self.log(format!(
            "restart node {node}: accepted g{accepted}, clean {clean}"
        ));
    }

    // --- the engine driver -------------------------------------------------------------

    fn act(&mut self, id: EngineId, action: Action) {
        if !self.engines.contains_key(&id) {
            return;
        }
        match action {
            Action::Connect { to } => {
                let engine = self.engines.get_mut(&id).expect("checked");
                engine.want.insert(to);
                if let Some(&link) = engine.links.get(&to) {
                    self.close_link(link);
                }
                let delay = self.rng.gen_range(1..=20);
                self.schedule_connect(id, to, delay);
            }
            Action::Send { to, message } => {
                if let ToReplica::Snapshot { snapshot, .. } = &message {
                    // The barrier: nothing of this engine is in flight.
                    if !self.snapshot_expected.contains_key(snapshot) {
                        // Writes of other engines (a superseded primary)
                        // may still be in flight and land before it.
                        let expected = self.possible_now(0, self.model.len() as u64);
                        self.snapshot_expected.insert(*snapshot, expected);
                    }
                }
                let Some(&link) = self.engines[&id].links.get(&to) else {
                    self.log(format!(
                        "engine {id}: {} to node {to} without a link: dropped",
                        summary_to(&message)
                    ));
                    return;
                };
                let op = match &message {
                    ToReplica::Write {
                        offset, payload, ..
                    } => self.client_write_of(id, *offset, payload),
                    _ => None,
                };
                let from = self.engines[&id].node;
                let delay = self.net_delay(from, to);
                let l = self.links.get_mut(&link).expect("an engine's link exists");
                l.to_at = l.to_at.max(self.now + delay);
                let time = l.to_at;
                let frame = self.encode_to(&message);
                self.at(time, Ev::Deliver { link, frame, op });
            }
            Action::Reset { to } => {
                self.log(format!("engine {id}: reset link to node {to}"));
                match self.engines[&id].links.get(&to).copied() {
                    Some(link) => self.close_link(link),
                    None => {
                        let delay = self.rng.gen_range(100..=1_000);
                        self.schedule_connect(id, to, delay);
                    }
                }
            }
            Action::Complete { op, result } => self.client_done(op, result),
            Action::Propose {
                id: proposal_id,
                proposal,
            } => self.propose(id, proposal_id, proposal),
            Action::PersistDirty { token, peer, map } => {
                let node = self.engines[&id].node;
                self.persist(
                    node,
                    PersistOp::Dirty {
                        engine: id,
                        token,
                        peer,
                        map,
                    },
                );
            }
            Action::ForgetDirty { peer } => {
                let node = self.engines[&id].node;
                self.persist(node, PersistOp::Forget { peer });
            }
            Action::LocalReadable(readable) => {
                self.engines.get_mut(&id).expect("checked").local_readable = readable;
            }
            Action::Stopped { reason } => self.engine_stopped(id, reason),
            Action::SnapshotDone { snapshot, result } => match result {
                Ok(nodes) => {
                    self.report.snapshots_taken += 1;
                    self.log(format!(
                        "engine {id}: snapshot #{snapshot} taken on {nodes:?}"
                    ));
                    self.snapshot_taken.insert(snapshot, nodes.clone());
                    for node in &nodes {
                        if !self.nodes[node].snapshots.contains_key(&snapshot) {
                            self.violate(format!(
                                "engine {id} reports snapshot #{snapshot} taken on node {node}, which does not hold it"
                            ));
                            return;
                        }
                    }
                    self.check_snapshot(snapshot);
                }
                Err(reason) => {
                    self.report.snapshots_failed += 1;
                    self.log(format!(
                        "engine {id}: snapshot #{snapshot} failed: {reason}"
                    ));
                }
            },
        }
    }

    /// Every node that holds `snapshot` holds the same blocks, and each
    /// block is a version the model allowed when the barrier went out.
    fn check_snapshot(&mut self, snapshot: SnapshotId) {
        let holders: Vec<(NodeId, &Vec<u64>)> = self
            .nodes
            .iter()
            .filter(|(node, _)| {
                self.snapshot_taken
                    .get(&snapshot)
                    .is_some_and(|nodes| nodes.contains(node))
            })
            .filter_map(|(&node, n)| n.snapshots.get(&snapshot).map(|tags| (node, tags)))
            .collect();
        let Some(&(first_node, first)) = holders.first() else {
            return;
        };
        for &(node, tags) in &holders[1..] {
            if let Some(b) = (0..tags.len()).find(|&b| tags[b] != first[b]) {
                let message = format!(
                    "snapshot #{snapshot} differs between node {first_node} and node {node} at block {b}: {} vs {}",
                    describe_tag(first[b]),
                    describe_tag(tags[b])
                );
                self.violate(message);
                return;
            }
        }
        let Some(expected) = self.snapshot_expected.get(&snapshot) else {
            self.violate(format!(
                "snapshot #{snapshot} exists but its barrier was never sent"
            ));
            return;
        };
        if let Some(b) = (0..first.len()).find(|&b| !expected[b].contains(&first[b])) {
            let message = format!(
                "snapshot #{snapshot} on node {first_node} holds {} at block {b}; the model allowed {:?} at the barrier",
                describe_tag(first[b]),
                expected[b].iter().map(|&t| describe_tag(t)).collect::<Vec<_>>()
            );
            self.violate(message);
        }
    }

    /// The client write a write message carries, if it is one.
    fn client_write_of(&self, engine: EngineId, offset: u64, payload: &Payload) -> Option<u64> {
        match payload {
            Payload::Data(data) => self.payloads.get(&(data.as_ptr() as usize)).copied(),
            Payload::Zeroes { length, .. } => {
                if *length >= REGION_BYTES {
                    return None;
                }
                self.ops
                    .iter()
                    .find(|(_, op)| {
                        op.engine == engine
                            && matches!(&op.kind, OpKind::Write { first, tags, zero: true, .. }
                                if first * BLOCK == offset && tags.len() as u64 * BLOCK == *length)
                    })
                    .map(|(&id, _)| id)
            }
        }
    }

    fn engine_receive(&mut self, link: LinkId, message: FromReplica) {
        let Some(l) = self.links.get(&link) else {
            return;
        };
        if l.state != LinkState::Open {
            return;
        }
        let (member, engine) = (l.member, l.engine);
        let Some(e) = self.engines.get(&engine) else {
            return;
        };
        if e.links.get(&member) != Some(&link) {
            return;
        }
        if !matches!(
            message,
            FromReplica::Ack { result: Ok(()), .. } | FromReplica::Pong { .. }
        ) {
            let summary = summary_from(&message);
            self.log(format!(
                "engine {engine}: from node {member} on link {link}: {summary}"
            ));
        }
        let now = self.now;
        let e = self.engines.get_mut(&engine).expect("checked");
        e.primary.message(member, message, now);
    }

    /// The engine's proposal, through the node's driver: the command the
    /// node proposes for it goes to the arbiter (after a delay, or is lost
    /// when the control plane is out of reach).
    fn propose(&mut self, engine: EngineId, id: u64, proposal: Proposal) {
        let e = self.engines.get_mut(&engine).expect("checked");
        let (node, generation) = (e.node, e.generation);
        let mut proposals = Proposals::default();
        e.control.propose(&e.primary, id, proposal, &mut proposals);
        for (id, command, wants_answer) in proposals.0 {
            // Progress reports change nothing the run checks; the node
            // waits for no answer to them: the arbiter drops them.
            if !wants_answer {
                continue;
            }
            self.log(format!(
                "engine {engine}: propose {id} {command:?} at g{generation}"
            ));
            if !self.reachable(node) || self.chance(self.cfg.unavailable) {
                if self.rng.gen_bool(0.5) {
                    let time = self.now + self.rng.gen_range(20..=300);
                    let answer = Err(ProposeError::Unavailable("no leader".into()));
                    self.at(time, Ev::Answer { engine, id, answer });
                }
                continue;
            }
            let time = self.now + self.rng.gen_range(2..=40);
            self.at(
                time,
                Ev::Apply {
                    engine,
                    by: node,
                    id,
                    command,
                },
            );
        }
    }

    /// The node's command, applied by the real `ClusterState::apply` with
    /// its fencing check; the answer goes back to the engine's driver.
    fn arbiter_apply(&mut self, engine: EngineId, by: NodeId, id: u64, command: Command) {
        // The leader refuses to mark a replica in sync while it evicts its
        // node: a refusal the state alone does not give.
        let evicting = match &command {
            Command::MarkInSync {
                generation, node, ..
            } => {
                *generation == self.arbiter.view.generation
                    && self.phase == Phase::Run
                    && !self.arbiter.view.in_sync.contains(node)
                    && self.rng.gen_bool(self.cfg.refuse_in_sync)
            }
            _ => false,
        };
        let marks_in_sync = matches!(command, Command::MarkInSync { .. });
        let summary = format!("{command:?}");
        let before = self.arbiter.view.in_sync.clone();
        let answer = match &command {
            Command::MarkInSync { node, .. } if evicting => {
                Err(ProposeError::Refused(CommandError::NodeNotOnline {
                    node: node.to_string(),
                    state: "evicting".into(),
                }))
            }
            _ => self
                .arbiter
                .apply(by, self.now, command)
                .map(|_| ())
                .map_err(ProposeError::Refused),
        };
        let after = &self.arbiter.view.in_sync;
        let removed = after.len() < before.len();
        let changed = *after != before;
        if removed {
            self.report.outdated += 1;
            if self.phase == Phase::Run && self.cfg.only_full_pools() {
                self.violate(format!(
                    "{summary} committed, yet the only faults were pools full on every replica: ENOSPC is an answer, not a replica fault"
                ));
            }
            if self.phase == Phase::Run && self.cfg.only_pauses() {
                self.violate(format!(
                    "{summary} committed, yet the only fault was the primary's process stopped: time it did not run counts against no replica"
                ));
            }
        }
        if changed && marks_in_sync {
            self.report.joined += 1;
        }
        self.log(format!(
            "arbiter: {summary} of engine {engine}: {answer:?}; in sync {:?}",
            self.arbiter
                .view
                .in_sync
                .iter()
                .map(|n| n.0)
                .collect::<Vec<_>>()
        ));
        if changed {
            self.views_changed();
        }
        if removed {
            self.evaluate_losses();
        }
        let answer = if self.chance(self.cfg.answer_lost) {
            Err(ProposeError::Unavailable("the answer was lost".into()))
        } else {
            answer
        };
        let time = self.now + self.rng.gen_range(1..=30);
        self.at(time, Ev::Answer { engine, id, answer });
    }

    /// Pushes the arbiter's view to every running engine, in order.
    fn views_changed(&mut self) {
        let ids: Vec<EngineId> = self.engines.keys().copied().collect();
        for engine in ids {
            let delay = self.rng.gen_range(5..=100);
            let e = self.engines.get_mut(&engine).expect("listed");
            e.view_at = e.view_at.max(self.now + delay);
            let time = e.view_at;
            self.at(time, Ev::View { engine });
        }
    }

    fn engine_stopped(&mut self, id: EngineId, reason: String) {
        let engine = self.engines.remove(&id).expect("checked");
        self.log(format!("engine {id} stopped: {reason}"));
        if self.arbiter.current == Some(id) {
            self.arbiter.current = None;
            if engine.detach_started.is_some() && reason.contains("detached") {
                let detach = Command::DetachVolume {
                    name: self.arbiter.volume.clone(),
                    node: Some(engine.node),
                };
                if let Err(error) = self.arbiter.apply(engine.node, self.now, detach) {
                    self.violate(format!(
                        "the control plane refused the detach of engine {id}: {error}"
                    ));
                }
            } else {
                self.violate(format!(
                    "the current engine {id} (generation {}) stopped: {reason}",
                    engine.generation
                ));
            }
        } else {
            self.report.fenced_engines += 1;
        }
        self.count(engine.primary.counters);
        // What it sent still arrives; nothing comes back.
        for link in engine.links.into_values() {
            if let Some(l) = self.links.get_mut(&link) {
                l.state = LinkState::Draining;
                let time = l.to_at.max(self.now) + 1;
                self.at(time, Ev::Close { link });
            }
        }
        self.engine_gone(id);
    }

    fn count(&mut self, counters: trireme_replication::primary::Counters) {
        self.report.resynced_bytes += counters.resynced_bytes;
        self.report.repaired_blocks += counters.repaired_blocks;
        self.report.read_failovers += counters.read_failovers;
        self.report.engine_grows += counters.grows;
    }

    /// Requests of an engine that is gone: writes end with an unknown
    /// outcome.
    fn engine_gone(&mut self, id: EngineId) {
        let ops: Vec<u64> = self
            .ops
            .iter()
            .filter(|(_, op)| {
                op.engine == id && !matches!(op.kind, OpKind::Read { local: true, .. })
            })
            .map(|(&op, _)| op)
            .collect();
        for op in ops {
            self.client_done(op, Err(ClientError::ShuttingDown));
        }
    }

    // --- client completions and the model ----------------------------------------------

    fn client_done(&mut self, id: u64, result: Result<Completion, ClientError>) {
        let Some(op) = self.ops.remove(&id) else {
            self.violate(format!("completion of unknown or finished request op{id}"));
            return;
        };
        if let Err(error) = &result {
            if self.phase == Phase::Run && self.cfg.only_pauses() {
                self.violate(format!(
                    "op{id} failed with {error:?}, yet the only fault was the primary's process stopped: its replicas answered everything"
                ));
            }
        }
        match &op.kind {
            OpKind::Write { payload, .. } => {
                if let Some(Payload::Data(data)) = payload {
                    self.payloads.remove(&(data.as_ptr() as usize));
                }
                match result {
                    Ok(Completion::Done) => self.write_done(id, &op),
                    Ok(other) => self.violate(format!("write op{id} completed with {other:?}")),
                    Err(error) => {
                        self.report.writes_failed += 1;
                        if matches!(error, ClientError::NoSpace(_)) {
                            self.report.writes_no_space += 1;
                        }
                        if self.phase == Phase::Run
                            && self.cfg.only_full_pools()
                            && matches!(error, ClientError::Io(_))
                        {
                            self.violate(format!(
                                "write op{id} failed with {error:?} where the only faults were full pools: the client must get ENOSPC"
                            ));
                        }
                        self.log(format!("client: op{id} failed: {error:?}"));
                        let end = self.tick_lc();
                        if let OpKind::Write { first, tags, .. } = &op.kind {
                            for (i, &tag) in tags.iter().enumerate() {
                                self.model[(*first as usize) + i]
                                    .unknown
                                    .push((tag, end, None));
                            }
                        }
                    }
                }
            }
            OpKind::Flush => match result {
                Ok(Completion::Done) => {
                    self.report.flushes_ok += 1;
                    self.log(format!("client: op{id} flush done"));
                    self.flush_done(&op);
                }
                Ok(other) => self.violate(format!("flush op{id} completed with {other:?}")),
                Err(error) => {
                    self.log(format!("client: op{id} flush failed: {error:?}"));
                    if matches!(self.phase, Phase::FinalFlush(final_op) if final_op == id) {
                        self.violate(format!("the final flush failed: {error:?}"));
                    }
                }
            },
            OpKind::Read { .. } => match result {
                Ok(Completion::Read(data)) => self.read_done(id, &op, data),
                Ok(other) => self.violate(format!("read op{id} completed with {other:?}")),
                Err(error) => {
                    self.report.reads_failed += 1;
                    self.log(format!("client: op{id} read failed: {error:?}"));
                }
            },
        }
    }

    fn write_done(&mut self, id: u64, op: &Op) {
        let OpKind::Write {
            first,
            tags,
            fua,
            admitted,
            ..
        } = &op.kind
        else {
            unreachable!("a write");
        };
        let (first, fua) = (*first, *fua);
        let generation = op.generation;
        let current = self.arbiter.view.generation;
        let at = self.tick_lc();
        self.report.writes_ok += 1;
        self.log(format!(
            "client: op{id} write b{first}+{} done at g{generation}",
            tags.len()
        ));
        if generation < current {
            self.report.stale_writes_ok += 1;
            // Invariant 3: the newer generation carries it on: every in-sync
            // replica that moved on received it before it did, or holds it
            // (copied from one that did), or something written since by a
            // newer generation.
            for node in self.arbiter.view.in_sync.clone() {
                let n = &self.nodes[&node];
                let received = admitted
                    .get(&node)
                    .is_some_and(|accepted| *accepted <= generation);
                let holds = n.up
                    && (first..first + tags.len() as u64).all(|b| {
                        self.holds_or_newer(node, b, tags[(b - first) as usize], generation)
                    });
                if n.max_accepted > generation && !received && !holds {
                    self.violate(format!(
                        "op{id}, a write of engine {} at g{generation}, was acknowledged while the arbiter is at g{current} and in-sync node {node} accepted g{} without receiving it (two primaries)",
                        op.engine, n.max_accepted
                    ));
                    return;
                }
            }
        } else {
            // Invariant 5: every in-sync replica holds it.
            for node in self.arbiter.view.in_sync.clone() {
                let n = &self.nodes[&node];
                if !n.up || n.crashed_lc > op.issued {
                    continue;
                }
                let disk = n.disk.as_ref().expect("in sync replicas have disks");
                for (i, &tag) in tags.iter().enumerate() {
                    let b = first + i as u64;
                    let held = disk.top(b);
                    if held != tag {
                        self.violate(format!(
                            "op{id} (write b{first}+{}) was acknowledged at g{generation} but in-sync node {node} holds {} at block {b}, not {}",
                            tags.len(),
                            describe_tag(held),
                            describe_tag(tag)
                        ));
                        return;
                    }
                }
            }
        }
        for (i, &tag) in tags.iter().enumerate() {
            let block = &mut self.model[first as usize + i];
            let version = Version {
                tag,
                generation: generation.0,
                at,
            };
            let position = block
                .chain
                .partition_point(|v| (v.generation, v.at) <= (version.generation, version.at));
            block.chain.insert(position, version);
            let top = position == block.chain.len() - 1;
            if position < block.ambiguous {
                block.ambiguous += 1;
            }
            if top && block.lossy {
                block.lossy = false;
                block.ambiguous = position;
            }
            let durable = fua && generation == current;
            if durable {
                block.chain.drain(..position);
                block.ambiguous = block.ambiguous.saturating_sub(position);
                block.unknown.retain(|&(_, end, _)| end > op.issued);
            }
            for entry in &mut block.unknown {
                if entry.1 <= op.issued && entry.2.is_none() {
                    entry.2 = Some(at);
                }
            }
        }
    }

    /// Whether `node` holds `tag` at block `b`, or a value written since by
    /// a generation newer than `generation` (or of unknown outcome).
    fn holds_or_newer(&self, node: NodeId, b: u64, tag: u64, generation: Generation) -> bool {
        let Some(disk) = self.nodes[&node].disk.as_ref() else {
            return false;
        };
        let top = disk.top(b);
        if top == tag {
            return true;
        }
        let block = &self.model[b as usize];
        block
            .chain
            .iter()
            .any(|v| v.tag == top && v.generation > generation.0)
            || block.unknown.iter().any(|&(t, _, _)| t == top)
            || self.ops.values().any(|op| {
                op.generation > generation
                    && matches!(&op.kind, OpKind::Write { first, tags, .. }
                        if *first <= b && b < first + tags.len() as u64
                            && tags[(b - first) as usize] == top)
            })
    }

    fn flush_done(&mut self, op: &Op) {
        if op.generation != self.arbiter.view.generation {
            return;
        }
        for block in &mut self.model {
            if block.lossy || block.chain.len() < 2 {
                continue;
            }
            let Some(last) = block.chain.iter().rposition(|v| v.at <= op.issued) else {
                continue;
            };
            if last < block.ambiguous {
                continue;
            }
            block.chain.drain(..last);
            block.ambiguous = 0;
            block
                .unknown
                .retain(|&(_, _, superseded)| superseded.is_none_or(|at| at > op.issued));
        }
    }

    fn read_done(&mut self, id: u64, op: &Op, data: ReadData) {
        let OpKind::Read {
            first,
            count,
            allowed,
            local,
            ..
        } = &op.kind
        else {
            unreachable!("a read");
        };
        let (first, count) = (*first, *count);
        // A fenced engine's reads are checked too: a primary that was cut
        // off and replaced must not answer from what it holds once the new
        // one has acknowledged a write.
        let stale =
            !self.engines.contains_key(&op.engine) || op.generation != self.arbiter.view.generation;
        if stale {
            self.report.stale_reads += 1;
        }
        let tags = match data {
            ReadData::Zeroes => vec![0; count as usize],
            ReadData::Data(bytes) => {
                if bytes.len() as u64 != count * BLOCK {
                    self.violate(format!(
                        "read op{id} of {count} blocks returned {} bytes",
                        bytes.len()
                    ));
                    return;
                }
                match tags_of(&bytes) {
                    Some(tags) => tags,
                    None => {
                        self.violate(format!("read op{id} returned data no write wrote"));
                        return;
                    }
                }
            }
        };
        self.report.reads_checked += 1;
        self.report.blocks_checked += count;
        for (i, &tag) in tags.iter().enumerate() {
            if !allowed[i].contains(&tag) {
                let b = first + i as u64;
                let replicas: Vec<String> = self
                    .nodes
                    .iter()
                    .filter_map(|(n, node)| {
                        node.disk
                            .as_ref()
                            .map(|d| format!("node {n}: {}", describe_tag(d.top(b))))
                    })
                    .collect();
                self.violate(format!(
                    "{}read op{id} on {}engine {} (g{}) returned {} at block {b}; allowed {:?}; model {:?}; replicas now {replicas:?}",
                    if *local { "local " } else { "" },
                    if stale { "fenced " } else { "" },
                    op.engine,
                    op.generation,
                    describe_tag(tag),
                    allowed[i].iter().map(|t| describe_tag(*t)).collect::<Vec<_>>(),
                    self.model[b as usize],
                ));
                return;
            }
        }
    }

    /// After a crash or an outdating: blocks whose newest acknowledged
    /// version no reachable in-sync replica holds any more may come back
    /// older (but never older than the last durable version).
    fn evaluate_losses(&mut self) {
        let holders: Vec<NodeId> = self
            .arbiter
            .view
            .in_sync
            .iter()
            .copied()
            .filter(|n| self.nodes[n].up && self.nodes[n].diskful)
            .collect();
        let mut newly = Vec::new();
        for b in 0..self.blocks {
            let block = &self.model[b as usize];
            if block.lossy || block.chain.len() < 2 {
                continue;
            }
            let top = block.chain.last().expect("not empty").tag;
            let held = holders
                .iter()
                .any(|n| self.nodes[n].disk.as_ref().expect("diskful").top(b) == top);
            if !held {
                newly.push(b);
            }
        }
        if newly.is_empty() {
            return;
        }
        self.report.lossy_blocks += newly.len() as u64;
        self.log(format!(
            "model: {} blocks may have lost unflushed versions (first {})",
            newly.len(),
            newly[0]
        ));
        for &b in &newly {
            let block = &mut self.model[b as usize];
            block.lossy = true;
            let tags = block.allowed();
            for op in self.ops.values_mut() {
                if let OpKind::Read {
                    first,
                    count,
                    allowed,
                    ..
                } = &mut op.kind
                {
                    if b >= *first && b < *first + *count {
                        allowed[(b - *first) as usize].extend(tags.iter().copied());
                    }
                }
            }
        }
    }
}
