//! The replica side of data links: a node holding a copy of a volume
//! accepts links from primaries, fences stale ones ([`ReplicaSide`]), and
//! carries out their writes, flushes and reads on the local store.
//!
//! Each link runs on its own thread and handles its messages in order, so
//! a FLUSH covers every write received before it on that link, and a
//! resync write lands after the application writes sent before it. Replies
//! are batched: the socket is flushed when no more requests are buffered.
//! The link thread puts small writes in the journal itself when the pool's
//! journal writer is idle, and, while the primary flushes often, runs the
//! device flush before it waits for the next message, so the flush that
//! follows is answered at once: no other thread is woken on the way of a
//! synchronous write (`Volume::write_now`, `Volume::sync_ahead`). It
//! answers such a write once the store has admitted it, before its journal
//! write (`Volume::admit_now`): a write's answer promises no durability,
//! only the flush's does, and the flush is read after the journal write.

use std::collections::BTreeMap;
use std::io::{BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use trireme_replication::driver::replica::{self, DurableSide, ReplicaDriver, ReplicaStore, Step};
use trireme_replication::{
    BlockHash, FromReplica, Payload, ReadData, ReplicaError, ReplicaSide, ToReplica,
};
use trireme_store::{HeldWrite, Volume};
use trireme_types::{BlockTarget, Generation, SnapshotId, TargetError, VolumeName, ZeroFlags};

use super::clock::Clock;
use super::meta::{ReplicaMeta, ReplicationMeta};
use super::wire::{frame_buffered, push_frame, read_to_replica, write_frame, LinkOpen};
use crate::cluster::replication_port::ControlPort;
use crate::{Node, NodeError};
use trireme_control::ReplicaKind;

const LINK_BUFFER_BYTES: usize = 256 * 1024;

pub struct ReplicaService {
    node: Arc<Node>,
    /// The cluster state says which volumes this node is a tiebreaker of.
    control: Arc<dyn ControlPort>,
    meta: Arc<ReplicationMeta>,
    cluster_secret: Vec<u8>,
    sides: Mutex<BTreeMap<VolumeName, Arc<Mutex<ReplicaSide>>>>,
    next_link: AtomicU64,
    /// The read leases granted: every side reads this clock, which
    /// started with the service (no lease was granted before).
    clock: Clock,
    /// What to do with each message: the driver the simulator runs too.
    driver: ReplicaDriver,
}

/// What the store's error means for replication.
pub fn replica_error(error: TargetError) -> ReplicaError {
    match error {
        TargetError::Checksum {
            volume_block,
            pool_block,
        } => ReplicaError::Checksum(format!(
            "volume block {volume_block} (pool block {pool_block})"
        )),
        TargetError::Device(message) | TargetError::Io(message) => ReplicaError::Io(message),
        TargetError::NoSpace { pool } => ReplicaError::NoSpace(pool),
        other => ReplicaError::Refused(other.to_string()),
    }
}

impl ReplicaService {
    pub fn new(
        node: Arc<Node>,
        control: Arc<dyn ControlPort>,
        meta: Arc<ReplicationMeta>,
    ) -> Arc<Self> {
        Arc::new(ReplicaService {
            node,
            cluster_secret: control.link_secret(),
            control,
            meta,
            sides: Mutex::new(BTreeMap::new()),
            next_link: AtomicU64::new(1),
            clock: Clock::start(),
            driver: ReplicaDriver::new(),
        })
    }

    pub(super) fn clock(&self) -> Clock {
        self.clock
    }

    pub(super) fn driver(&self) -> &ReplicaDriver {
        &self.driver
    }

    pub(super) fn side(&self, volume: &VolumeName) -> Result<Arc<Mutex<ReplicaSide>>, NodeError> {
        let mut sides = self.sides.lock().expect("sides lock");
        if let Some(side) = sides.get(volume) {
            return Ok(side.clone());
        }
        let stored = self.meta.replica(volume)?;
        // Built once per process, on first use: what the process before
        // granted is forgotten. It ended before this service's clock
        // started (at 0).
        let side = Arc::new(Mutex::new(
            ReplicaSide::new(stored.accepted, stored.primary_at, stored.clean)
                .with_fence(stored.fenced)
                .after_restart(0),
        ));
        sides.insert(volume.clone(), side.clone());
        Ok(side)
    }

    fn persist(&self, volume: &VolumeName, durable: DurableSide) -> Result<(), NodeError> {
        self.meta.set_replica(
            volume,
            &ReplicaMeta {
                accepted: durable.accepted,
                primary_at: durable.primary_at,
                clean: durable.clean,
                fenced: durable.fenced,
            },
        )
    }

    /// This node starts a primary for `volume` at `generation`: remembered,
    /// so that after a crash the next primary knows this copy may hold
    /// writes nobody else got.
    pub fn set_primary_at(
        &self,
        volume: &VolumeName,
        generation: Generation,
    ) -> Result<(), NodeError> {
        let side = self.side(volume)?;
        let mut side = side.lock().expect("side lock");
        side.set_primary_at(generation);
        let clean = self.meta.replica(volume)?.clean;
        self.persist(volume, DurableSide::of(&side, clean))
    }

    /// The volume is detached at `generation`: no primary of it may write
    /// to this copy any more (links of it close at their next message).
    /// Durable when this returns.
    pub fn fence(&self, volume: &VolumeName, generation: Generation) -> Result<(), NodeError> {
        let side = self.side(volume)?;
        let mut side = side.lock().expect("side lock");
        if side.fenced() >= generation {
            return Ok(());
        }
        side.fence(generation);
        let clean = self.meta.replica(volume)?.clean;
        self.persist(volume, DurableSide::of(&side, clean))
    }

    /// Runs `work` on the copy while no primary newer than `generation`
    /// can be accepted (it holds the lock that fences them), and only if
    /// none was: what a detached volume's node does on its own
    /// (snapshots, rollbacks) then cannot interleave with a new primary.
    pub fn while_fenced<R>(
        &self,
        volume: &VolumeName,
        generation: Generation,
        work: impl FnOnce() -> R,
    ) -> Result<R, String> {
        let side = self.side(volume).map_err(|error| error.to_string())?;
        let side = side.lock().expect("side lock");
        if side.fenced() < generation {
            return Err(format!(
                "the copy has not fenced generation {generation} of the volume"
            ));
        }
        if side.accepted() > generation {
            return Err(format!(
                "a primary of generation {} was accepted since",
                side.accepted()
            ));
        }
        Ok(work())
    }

    pub fn primary_at(&self, volume: &VolumeName) -> Result<Option<Generation>, NodeError> {
        Ok(self.meta.replica(volume)?.primary_at)
    }

    /// A deleted volume: its replica state goes too.
    pub fn forget(&self, volume: &VolumeName) -> Result<(), NodeError> {
        self.sides.lock().expect("sides lock").remove(volume);
        self.meta.forget_volume(volume)
    }

    /// Accepts links from primaries on other nodes, each on its own thread.
    pub fn listen(self: &Arc<Self>, listener: TcpListener) {
        let service = self.clone();
        std::thread::Builder::new()
            .name("data-accept".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    let Ok(stream) = stream else { continue };
                    let service = service.clone();
                    let _ = std::thread::Builder::new()
                        .name("data-link".into())
                        .spawn(move || {
                            if let Err(error) = service.accept(stream) {
                                tracing::debug!(%error, "data link ended");
                            }
                        });
                }
            })
            .expect("spawn the data listener thread");
    }

    fn accept(&self, stream: TcpStream) -> std::io::Result<()> {
        stream.set_nodelay(true)?;
        let mut reader = stream.try_clone()?;
        let mut writer = stream;
        let mut frame = Vec::new();
        super::wire::read_frame(&mut reader, &mut frame)?;
        let opened = serde_json::from_slice::<LinkOpen>(&frame)
            .map_err(|error| error.to_string())
            .and_then(|open| open.verify(&self.cluster_secret).map(|()| open))
            .and_then(|open| {
                let name = VolumeName::new(&open.volume).map_err(|error| error.to_string())?;
                match self.node.open_volume(name.as_str()) {
                    Some(volume) => Ok((name, Some(volume))),
                    // A tiebreaker holds no data: it only votes, and fences
                    // primaries like any replica.
                    None if self.is_tiebreaker(&name) => Ok((name, None)),
                    None => Err(format!("no replica of volume '{name}' on this node")),
                }
            });
        match opened {
            Ok((name, volume)) => {
                write_frame(&mut writer, b"")?;
                self.serve_link(&name, volume, reader, writer)
            }
            Err(reason) => {
                tracing::warn!(%reason, "refused a data link");
                write_frame(&mut writer, reason.as_bytes())
            }
        }
    }

    fn is_tiebreaker(&self, name: &VolumeName) -> bool {
        let me = self.control.node_id();
        let state = self.control.state().read();
        state.volumes.get(name).is_some_and(|volume| {
            volume
                .replica(me)
                .is_some_and(|replica| replica.kind == ReplicaKind::Tiebreaker)
        })
    }

    /// A new link id (links are told apart by it, never by peer).
    pub(super) fn next_link_id(&self) -> u64 {
        self.next_link.fetch_add(1, Ordering::Relaxed)
    }

    fn serve_link(
        &self,
        name: &VolumeName,
        volume: Option<Arc<Volume>>,
        reader: impl Read,
        mut writer: TcpStream,
    ) -> std::io::Result<()> {
        let side = self
            .side(name)
            .map_err(|error| std::io::Error::other(error.to_string()))?;
        let link = self.next_link.fetch_add(1, Ordering::Relaxed);
        let mut reader = BufReader::with_capacity(LINK_BUFFER_BYTES, reader);
        let mut frame = Vec::new();
        // Answers not sent yet, in order.
        let mut answers = Vec::new();
        // Small writes answered and admitted, whose records this thread
        // writes to the journal together once the messages at hand are
        // handled: it holds the pool's writing role meanwhile.
        let mut held: Option<HeldWrite<'_>> = None;
        let result = loop {
            let message = match read_to_replica(&mut reader, &mut frame) {
                Err(error) => break Err(error),
                Ok(Ok(message)) => message,
                Ok(Err(error)) => {
                    break Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("bad message from the primary: {error}"),
                    ))
                }
            };
            let (reply, close) =
                self.handle_answer_first(name, volume.as_deref(), &side, link, message, &mut held);
            if let Some(reply) = reply {
                push_frame(&mut answers, |body| reply.encode(body));
            }
            // The next message is here whole: reading it cannot wait on
            // the primary, so the answers and the held records wait for it.
            if !close && frame_buffered(reader.buffer()) && answers.len() < LINK_BUFFER_BYTES {
                continue;
            }
            // The answers go first, ahead of the journal write, when the
            // socket takes them without waiting: this thread holds the
            // pool's writing role, which must never wait on the primary.
            let mut rest = &answers[..];
            if held.is_some() && !rest.is_empty() {
                match send_without_waiting(&writer, rest) {
                    Ok(sent) => rest = &rest[sent..],
                    Err(error) => break Err(error),
                }
            }
            if !rest.is_empty() {
                if let Some(held) = held.take() {
                    finish_held(name, held);
                }
                if let Err(error) = writer.write_all(rest) {
                    break Err(error);
                }
            }
            answers.clear();
            // The writes were answered once admitted; they reach the
            // journal now, before the next message is read.
            if let Some(held) = held.take() {
                finish_held(name, held);
            }
            if close {
                break Ok(());
            }
            if reader.buffer().is_empty() {
                // Nothing to read yet: while the primary flushes often, its
                // next message is likely a flush, so start the device flush
                // here rather than wake another thread for it, and answer
                // that flush at once.
                if let Some(volume) = &volume {
                    volume.sync_ahead();
                }
            }
        };
        side.lock().expect("side lock").link_closed(link);
        result
    }

    /// One message, through the replica driver: the reply, and whether to
    /// close the link.
    pub(super) fn handle(
        &self,
        name: &VolumeName,
        volume: Option<&Volume>,
        side: &Mutex<ReplicaSide>,
        link: u64,
        message: ToReplica,
    ) -> (Option<FromReplica>, bool) {
        let mut held = None;
        let (reply, close) = self.handle_answer_first(name, volume, side, link, message, &mut held);
        if let Some(held) = held {
            finish_held(name, held);
        }
        (reply, close)
    }

    /// [`ReplicaService::handle`], except that a small plain write is
    /// answered as soon as the store has admitted it, and handed back to
    /// be written to the journal after the answer is sent: the primary
    /// then waits for this copy's receive and admission only, not for its
    /// device writes. This keeps the protocol's contract (a write's answer
    /// says it is in this copy's volatile state, in order; only a flush's
    /// answer says it is durable, and the flush is handled after the
    /// write reached the journal): a crash in between loses it as it would
    /// lose any unflushed write, and a device error fails the pool, so
    /// the flush that follows fails.
    fn handle_answer_first<'v>(
        &self,
        name: &VolumeName,
        volume: Option<&'v Volume>,
        side: &Mutex<ReplicaSide>,
        link: u64,
        message: ToReplica,
        held: &mut Option<HeldWrite<'v>>,
    ) -> (Option<FromReplica>, bool) {
        // Only a small plain write may join the writes this thread holds:
        // anything else may wait on the store (a flush, for the journal
        // this thread is to write), so they reach the journal first.
        if !matches!(
            message,
            ToReplica::Write {
                payload: Payload::Data(_),
                fua: false,
                ..
            }
        ) {
            if let Some(held) = held.take() {
                finish_held(name, held);
            }
        }
        // A hello put off is handled again, as it was, once the wait is over.
        let hello = matches!(message, ToReplica::Hello { .. }).then(|| message.clone());
        let mut message = Some(message);
        loop {
            let Some(next) = message.take().or_else(|| hello.clone()) else {
                unreachable!("a hello is kept for its retries");
            };
            let mut side = side.lock().expect("side lock");
            let now = self.clock.now_ms();
            match self
                .driver
                .receive(&mut side, link, next, now, volume.is_some())
            {
                Step::Reply(reply) => return (Some(reply), false),
                Step::Refuse(refusal) => return (Some(refusal), true),
                Step::Wait { until_ms } => {
                    // A former primary may still hold a read lease from
                    // this copy: this link waits (older ones are refused
                    // meanwhile).
                    drop(side);
                    tracing::info!(volume = %name, wait_ms = until_ms - now, "a newer primary waits until the former one's read lease has run out");
                    std::thread::sleep(std::time::Duration::from_millis(until_ms - now));
                }
                Step::Welcome { durable, welcome } => {
                    if let Err(error) = self.persist(name, durable) {
                        tracing::error!(%error, volume = %name, "cannot persist the accepted generation; refusing the primary");
                        return (None, true);
                    }
                    return (Some(welcome), false);
                }
                Step::Close { durable } => {
                    if let Some(durable) = durable {
                        if let Err(error) = self.persist(name, durable) {
                            tracing::warn!(%error, volume = %name, "cannot record the clean detach");
                        }
                    }
                    return (None, true);
                }
                Step::DataForTiebreaker => {
                    // A primary never sends data to a tiebreaker; one that
                    // does is confused: close the link.
                    tracing::warn!(volume = %name, "a primary sent data to this tiebreaker; closing the link");
                    return (None, true);
                }
                Step::Store(message) => {
                    drop(side);
                    let volume = volume.expect("the driver sends data only to a copy");
                    let reply = execute_answer_first(name, volume, message, held);
                    return (Some(reply), false);
                }
            }
        }
    }
}

/// Carries out an admitted message on the volume's copy.
pub(super) fn execute(volume: &Volume, message: ToReplica) -> FromReplica {
    replica::execute(&StoreCopy(volume), message)
}

/// [`execute`], except that a small plain write inside the volume is only
/// admitted: its answer, with what is left to write in `held` (see
/// [`ReplicaService::handle_answer_first`]). A write joins the writes held
/// already when it can; otherwise they are written first.
fn execute_answer_first<'v>(
    name: &VolumeName,
    volume: &'v Volume,
    message: ToReplica,
    held: &mut Option<HeldWrite<'v>>,
) -> FromReplica {
    match message {
        ToReplica::Write {
            seq,
            offset,
            payload: Payload::Data(data),
            fua: false,
            ..
        } if offset
            .checked_add(data.len() as u64)
            .is_some_and(|end| end <= volume.size_bytes()) =>
        {
            let result = volume.admit_joining(held, offset, data);
            FromReplica::Ack {
                seq,
                result: result.map_err(replica_error),
            }
        }
        message => {
            if let Some(gathering) = held.take() {
                finish_held(name, gathering);
            }
            execute(volume, message)
        }
    }
}

/// Sends what of `bytes` the socket takes without waiting: how many bytes
/// that was (0 when its buffer is full).
fn send_without_waiting(stream: &TcpStream, bytes: &[u8]) -> std::io::Result<usize> {
    use std::os::fd::AsRawFd;
    loop {
        // SAFETY: `bytes` is a live slice of `bytes.len()` bytes, and the
        // descriptor belongs to `stream`, which outlives the call.
        let sent = unsafe {
            libc::send(
                stream.as_raw_fd(),
                bytes.as_ptr().cast(),
                bytes.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
        if sent >= 0 {
            return Ok(sent as usize);
        }
        let error = std::io::Error::last_os_error();
        match error.kind() {
            std::io::ErrorKind::WouldBlock => return Ok(0),
            std::io::ErrorKind::Interrupted => continue,
            _ => return Err(error),
        }
    }
}

/// Writes an answered write's record to the journal. A failure has failed
/// the pool: logged here, and reported by the flush that follows.
fn finish_held(name: &VolumeName, held: HeldWrite<'_>) {
    if let Err(error) = held.finish() {
        tracing::error!(%error, volume = %name, "an answered write did not reach the journal; the pool has failed and the next flush reports it");
    }
}

/// The store's copy of a volume, as the replica driver carries messages
/// out on it.
struct StoreCopy<'a>(&'a Volume);

impl ReplicaStore for StoreCopy<'_> {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }

    fn write(&self, offset: u64, payload: Payload, fua: bool) -> Result<(), ReplicaError> {
        let volume = self.0;
        match payload {
            // Written on this thread when the journal writer is idle: one
            // wake-up fewer before the flush that often follows. The store
            // keeps the data's buffer as it is (on the primary's own copy,
            // shared with its record of the write).
            Payload::Data(data) if !fua => volume.write_now(offset, data),
            Payload::Data(data) => volume.write_shared(offset, data, fua),
            Payload::Zeroes { length, trim: true } => volume.trim(offset, length, fua),
            Payload::Zeroes {
                length,
                trim: false,
            } => volume.write_zeroes(
                offset,
                length,
                ZeroFlags {
                    fua,
                    no_hole: false,
                    fast_zero: false,
                },
            ),
        }
        .map_err(replica_error)
    }

    fn flush(&self) -> Result<(), ReplicaError> {
        self.0.flush().map_err(replica_error)
    }

    fn read(&self, offset: u64, length: u64) -> Result<ReadData, ReplicaError> {
        read(self.0, offset, length)
    }

    fn hashes(&self, offset: u64, length: u64) -> Result<Vec<BlockHash>, ReplicaError> {
        hashes(self.0, offset, length)
    }

    fn snapshot(&self, snapshot: SnapshotId) -> Result<(), ReplicaError> {
        self.0
            .snapshot(snapshot)
            .map_err(|error| ReplicaError::Io(format!("snapshot {snapshot}: {error}")))
    }
}

const BLOCK_BYTES: u64 = 4096;

/// 128 bits of the block's BLAKE3: equal blocks, equal fingerprints.
fn fingerprint(block: &[u8]) -> u128 {
    let hash = blake3::hash(block);
    u128::from_le_bytes(hash.as_bytes()[..16].try_into().expect("16 bytes"))
}

/// The fingerprint of every block of the range (whole blocks of one
/// region inside the volume: the driver checked). A range that fails its
/// checksums is read again block by block, so only the bad blocks are
/// reported unreadable; a device error fails it all.
fn hashes(volume: &Volume, offset: u64, length: u64) -> Result<Vec<BlockHash>, ReplicaError> {
    let blocks = length / BLOCK_BYTES;
    let zero = fingerprint(&[0u8; BLOCK_BYTES as usize]);
    if let Ok(extents) = volume.block_status(offset, length) {
        if extents
            .first()
            .is_some_and(|extent| extent.length_bytes >= length && extent.zero)
        {
            return Ok(vec![BlockHash::Hash(zero); blocks as usize]);
        }
    }
    let mut buffer = vec![0u8; length as usize];
    match volume.read(offset, &mut buffer) {
        Ok(()) => Ok(buffer
            .chunks(BLOCK_BYTES as usize)
            .map(|block| BlockHash::Hash(fingerprint(block)))
            .collect()),
        Err(error) => match replica_error(error) {
            ReplicaError::Checksum(_) => {
                let mut out = Vec::with_capacity(blocks as usize);
                for (index, block) in buffer.chunks_mut(BLOCK_BYTES as usize).enumerate() {
                    let at = offset + index as u64 * BLOCK_BYTES;
                    out.push(match volume.read(at, block) {
                        Ok(()) => BlockHash::Hash(fingerprint(block)),
                        Err(error) => match replica_error(error) {
                            ReplicaError::Checksum(_) => BlockHash::Unreadable,
                            other => return Err(other),
                        },
                    });
                }
                Ok(out)
            }
            other => Err(other),
        },
    }
}

/// The range's bytes (inside the volume and small enough for a frame: the
/// driver checked).
fn read(volume: &Volume, offset: u64, length: u64) -> Result<ReadData, ReplicaError> {
    // A hole needs no bytes on the wire: resyncs of thin volumes copy only
    // what was written.
    if let Ok(extents) = volume.block_status(offset, length) {
        if extents
            .first()
            .is_some_and(|extent| extent.length_bytes >= length && extent.zero)
        {
            return Ok(ReadData::Zeroes);
        }
    }
    let mut buffer = vec![0u8; length as usize];
    volume
        .read(offset, &mut buffer)
        .map(|()| ReadData::Data(buffer))
        .map_err(replica_error)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A link thread holding the pool's writing role never waits on the
    /// primary: against a peer that reads nothing, sending without waiting
    /// fills the socket and then reports that it took nothing.
    #[test]
    fn sending_without_waiting_stops_at_a_full_socket() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (_peer, _) = listener.accept().unwrap();
        let chunk = vec![7u8; 64 << 10];
        let mut taken = 0usize;
        // Loopback buffers hold a few MiB at most: 1 GiB is never reached.
        for _ in 0..(16 << 10) {
            let sent = send_without_waiting(&stream, &chunk).unwrap();
            if sent == 0 {
                assert!(taken > 0, "an empty socket took nothing");
                return;
            }
            taken += sent;
        }
        panic!("the socket took {taken} bytes without ever being full");
    }

    /// The store's errors reach the primary by kind, never by what their
    /// text happens to say.
    #[test]
    fn store_errors_become_replica_errors_by_kind() {
        let checksum = TargetError::Checksum {
            volume_block: 7,
            pool_block: 70,
        };
        let checksum = replica_error(checksum);
        assert_eq!(
            checksum,
            ReplicaError::Checksum("volume block 7 (pool block 70)".into())
        );
        assert_eq!(
            checksum.to_string(),
            "checksum mismatch: volume block 7 (pool block 70)"
        );
        // A device error whose text mentions checksums is still a device error.
        assert_eq!(
            replica_error(TargetError::Device("reading checksums: EIO".into())),
            ReplicaError::Io("reading checksums: EIO".into())
        );
        let full = replica_error(TargetError::NoSpace {
            pool: "fast".into(),
        });
        assert_eq!(full, ReplicaError::NoSpace("fast".into()));
        assert_eq!(full.to_string(), "no space left in pool 'fast'");
    }
}
