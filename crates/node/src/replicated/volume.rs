//! [`ReplicatedVolume`]: an attached volume as the NBD server sees it.
//!
//! Reads go straight to the local copy while the engine says it is up to
//! date and its read lease holds (no hop through the engine); a checksum
//! error there, or a node without an up-to-date copy, sends the read
//! through the engine, which reads a peer and repairs the bad copy, and
//! without the lease, through the engine too, which waits for it.
//! Everything else goes through the engine.
//!
//! An NBD connection outlives the engine it was opened on: the engine
//! restarts at a new generation when the volume's primaries change (the
//! other primary of a live migration detaching, a takeover). Requests the
//! old engine answers `ShuttingDown` then go to its successor, so the
//! client (QEMU under a running guest) sees no error; they are NBD
//! requests, which the protocol lets a server redo (a write puts the same
//! bytes at the same place; a flush covers the same stores).

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};
use trireme_replication::{ClientError, ClientRequest, Completion, Payload, ReadData};
use trireme_types::{
    BlockBuf, BlockStatusExtent, BlockTarget, Completer, TargetError, TargetReply, TargetRequest,
    VolumeName, ZeroFlags,
};

use super::engine::EngineHandle;
use super::Replication;

/// How long a request waits for the engine that replaces a stopped one.
/// An engine restart takes milliseconds; this bounds a lost cause.
const SUCCESSOR_WAIT: Duration = Duration::from_secs(10);

pub struct ReplicatedVolume {
    shared: Arc<Shared>,
}

struct Shared {
    name: VolumeName,
    replication: Weak<Replication>,
    /// The engine requests go to: the one the connection opened, then
    /// each successor.
    engine: Mutex<Arc<EngineHandle>>,
}

impl ReplicatedVolume {
    pub fn new(
        name: VolumeName,
        replication: Weak<Replication>,
        engine: Arc<EngineHandle>,
    ) -> Self {
        ReplicatedVolume {
            shared: Arc::new(Shared {
                name,
                replication,
                engine: Mutex::new(engine),
            }),
        }
    }

    fn engine(&self) -> Arc<EngineHandle> {
        self.shared.engine()
    }

    fn call(&self, request: ClientRequest) -> Result<Completion, TargetError> {
        self.shared.call(request)
    }

    fn write_payload(&self, offset: u64, payload: Payload, fua: bool) -> Result<(), TargetError> {
        self.call(ClientRequest::Write {
            offset,
            payload,
            fua,
        })
        .map(|_| ())
    }
}

impl Shared {
    fn engine(&self) -> Arc<EngineHandle> {
        self.engine
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// The engine that replaced `stopped`, waiting (bounded) while the
    /// volume is still attached here; `None` once it is not.
    fn successor(&self, stopped: &Arc<EngineHandle>) -> Option<Arc<EngineHandle>> {
        let deadline = Instant::now() + SUCCESSOR_WAIT;
        loop {
            let replication = self.replication.upgrade()?;
            if let Some(next) = replication.target_engine(&self.name) {
                if !Arc::ptr_eq(&next, stopped) {
                    let mut current = self
                        .engine
                        .lock()
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                    *current = next.clone();
                    tracing::info!(volume = %self.name, "requests go to the volume's restarted engine");
                    return Some(next);
                }
            }
            if replication.attached_here(&self.name) == Some(false) || Instant::now() >= deadline {
                return None;
            }
            drop(replication);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn call(&self, request: ClientRequest) -> Result<Completion, TargetError> {
        let mut engine = self.engine();
        loop {
            match engine.call(request.clone()) {
                Err(ClientError::ShuttingDown) => match self.successor(&engine) {
                    Some(next) => engine = next,
                    None => return Err(TargetError::ShuttingDown),
                },
                result => return result.map_err(client_error),
            }
        }
    }

    /// Submits `request` to `engine`; if that engine stops under it, a
    /// thread of its own (the answer comes under the engine's lock, which
    /// must not wait) hands it to the successor.
    fn submit_to(
        self: &Arc<Self>,
        engine: Arc<EngineHandle>,
        request: ClientRequest,
        done: Completer,
    ) {
        let volume = self.clone();
        let retry = request.clone();
        let stopped = engine.clone();
        engine.submit(
            request,
            Box::new(move |result| match result {
                Err(ClientError::ShuttingDown) => {
                    let slot = Arc::new(Mutex::new(Some(done)));
                    let answer = slot.clone();
                    let spawned = std::thread::Builder::new()
                        .name("nbd-engine-retry".into())
                        .spawn(move || {
                            let Some(done) = answer.lock().ok().and_then(|mut slot| slot.take())
                            else {
                                return;
                            };
                            match volume.successor(&stopped) {
                                Some(next) => volume.submit_to(next, retry, done),
                                None => done(Err(TargetError::ShuttingDown)),
                            }
                        });
                    if let Err(error) = spawned {
                        tracing::warn!(%error, "cannot hand a request to the restarted engine");
                        if let Some(done) = slot.lock().ok().and_then(|mut slot| slot.take()) {
                            done(Err(TargetError::ShuttingDown));
                        }
                    }
                }
                result => done(target_reply(result)),
            }),
        );
    }
}

fn client_error(error: ClientError) -> TargetError {
    match error {
        ClientError::Io(message) => TargetError::Io(message),
        ClientError::NoSpace(pool) => TargetError::NoSpace { pool },
        ClientError::ShuttingDown => TargetError::ShuttingDown,
    }
}

/// The engine's answer as the NBD server's.
fn target_reply(result: Result<Completion, ClientError>) -> Result<TargetReply, TargetError> {
    match result.map_err(client_error)? {
        Completion::Done => Ok(TargetReply::Done),
        Completion::Read(ReadData::Data(data)) => Ok(TargetReply::Data(data)),
        Completion::Read(ReadData::Zeroes) => Ok(TargetReply::Zeroes),
    }
}

impl BlockTarget for ReplicatedVolume {
    fn size_bytes(&self) -> u64 {
        self.engine().size_bytes()
    }

    fn read(&self, offset: u64, buffer: &mut [u8]) -> Result<(), TargetError> {
        let engine = self.engine();
        if engine.reads_locally() {
            // Past the end of this node's copy (an engine that started at
            // a size this node's agent has not grown its copy to yet) the
            // engine reads a copy that holds it.
            let end = offset + buffer.len() as u64;
            if let Some(local) = engine.local.as_ref().filter(|l| end <= l.size_bytes()) {
                match local.read(offset, buffer) {
                    Ok(()) => return Ok(()),
                    // A bad local block: the engine reads a peer and
                    // repairs it.
                    Err(TargetError::Checksum { .. }) => {}
                    Err(error) => return Err(error),
                }
            }
        }
        match self.call(ClientRequest::Read {
            offset,
            length: buffer.len() as u64,
        })? {
            Completion::Read(ReadData::Data(data)) if data.len() == buffer.len() => {
                buffer.copy_from_slice(&data);
                Ok(())
            }
            Completion::Read(ReadData::Zeroes) => {
                buffer.fill(0);
                Ok(())
            }
            other => Err(TargetError::Io(format!(
                "the replication engine answered a read with {other:?}"
            ))),
        }
    }

    fn try_read(&self, offset: u64, buffer: &mut [u8]) -> Option<Result<(), TargetError>> {
        let engine = self.engine();
        if !engine.reads_locally() {
            return None;
        }
        match engine.local.as_ref()?.try_read(offset, buffer)? {
            Ok(()) => Some(Ok(())),
            Err(_) => None,
        }
    }

    fn write(&self, offset: u64, data: BlockBuf, fua: bool) -> Result<(), TargetError> {
        self.write_payload(offset, Payload::data(data), fua)
    }

    fn flush(&self) -> Result<(), TargetError> {
        self.call(ClientRequest::Flush).map(|_| ())
    }

    fn trim(&self, offset: u64, length: u64, fua: bool) -> Result<(), TargetError> {
        self.write_payload(offset, Payload::Zeroes { length, trim: true }, fua)
    }

    fn write_zeroes(&self, offset: u64, length: u64, flags: ZeroFlags) -> Result<(), TargetError> {
        self.write_payload(
            offset,
            Payload::Zeroes {
                length,
                trim: !flags.no_hole,
            },
            flags.fua,
        )
    }

    fn submits(&self) -> bool {
        true
    }

    fn submit(&self, request: TargetRequest, done: Completer) {
        let engine = self.engine();
        let request = match request {
            TargetRequest::Read { offset, length } => {
                if engine.reads_locally() {
                    if let Some(local) = engine.local.clone() {
                        // The local copy is up to date: read it on an I/O
                        // thread (the NBD server already tried the page
                        // cache); a bad block there goes through the engine,
                        // which reads a peer and repairs it.
                        let shared = self.shared.clone();
                        tokio::task::spawn_blocking(move || {
                            let mut buffer = vec![0u8; length as usize];
                            match local.read(offset, &mut buffer) {
                                Ok(()) => done(Ok(TargetReply::Data(buffer))),
                                Err(TargetError::Checksum { .. }) => {
                                    let engine = shared.engine();
                                    shared.submit_to(
                                        engine,
                                        ClientRequest::Read { offset, length },
                                        done,
                                    )
                                }
                                Err(error) => done(Err(error)),
                            }
                        });
                        return;
                    }
                }
                ClientRequest::Read { offset, length }
            }
            TargetRequest::Write { offset, data, fua } => ClientRequest::Write {
                offset,
                payload: Payload::data(data),
                fua,
            },
            TargetRequest::Flush => ClientRequest::Flush,
            TargetRequest::Trim {
                offset,
                length,
                fua,
            } => ClientRequest::Write {
                offset,
                payload: Payload::Zeroes { length, trim: true },
                fua,
            },
            TargetRequest::WriteZeroes {
                offset,
                length,
                flags,
            } => ClientRequest::Write {
                offset,
                payload: Payload::Zeroes {
                    length,
                    trim: !flags.no_hole,
                },
                fua: flags.fua,
            },
        };
        self.shared.submit_to(engine, request, done);
    }

    fn block_status(
        &self,
        offset: u64,
        length: u64,
    ) -> Result<Vec<BlockStatusExtent>, TargetError> {
        let engine = self.engine();
        if engine.reads_locally() {
            // Past the end of this node's copy (not grown yet): the
            // answer below.
            let end = offset.saturating_add(length);
            if let Some(local) = engine.local.as_ref().filter(|l| end <= l.size_bytes()) {
                return local.block_status(offset, length);
            }
        }
        // Without an up-to-date local copy: everything is data, which is
        // always a correct answer.
        Ok(vec![BlockStatusExtent {
            length_bytes: length,
            hole: false,
            zero: false,
        }])
    }
}
