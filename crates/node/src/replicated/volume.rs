//! [`ReplicatedVolume`]: an attached volume as the NBD server sees it.
//!
//! Reads go straight to the local copy while the engine says it is up to
//! date and its read lease holds (no hop through the engine); a checksum
//! error there, or a node without an up-to-date copy, sends the read
//! through the engine, which reads a peer and repairs the bad copy, and
//! without the lease, through the engine too, which waits for it.
//! Everything else goes through the engine.

use std::sync::Arc;
use trireme_replication::{ClientError, ClientRequest, Completion, Payload, ReadData};
use trireme_types::{
    BlockBuf, BlockStatusExtent, BlockTarget, Completer, TargetError, TargetReply, TargetRequest,
    ZeroFlags,
};

use super::engine::EngineHandle;

pub struct ReplicatedVolume {
    engine: Arc<EngineHandle>,
}

impl ReplicatedVolume {
    pub fn new(engine: Arc<EngineHandle>) -> Self {
        ReplicatedVolume { engine }
    }

    fn call(&self, request: ClientRequest) -> Result<Completion, TargetError> {
        self.engine.call(request).map_err(client_error)
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

fn client_error(error: ClientError) -> TargetError {
    match error {
        ClientError::Io(message) => TargetError::Io(message),
        ClientError::NoSpace(message) => TargetError::NoSpace { pool: message },
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
        self.engine.size_bytes
    }

    fn read(&self, offset: u64, buffer: &mut [u8]) -> Result<(), TargetError> {
        if self.engine.reads_locally() {
            if let Some(local) = &self.engine.local {
                match local.read(offset, buffer) {
                    Ok(()) => return Ok(()),
                    // A bad local block: the engine reads a peer and
                    // repairs it.
                    Err(TargetError::Io(message)) if message.contains("checksum") => {}
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
        if !self.engine.reads_locally() {
            return None;
        }
        match self.engine.local.as_ref()?.try_read(offset, buffer)? {
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
        let request = match request {
            TargetRequest::Read { offset, length } => {
                if self.engine.reads_locally() {
                    if let Some(local) = self.engine.local.clone() {
                        // The local copy is up to date: read it on an I/O
                        // thread (the NBD server already tried the page
                        // cache); a bad block there goes through the engine,
                        // which reads a peer and repairs it.
                        let engine = self.engine.clone();
                        tokio::task::spawn_blocking(move || {
                            let mut buffer = vec![0u8; length as usize];
                            match local.read(offset, &mut buffer) {
                                Ok(()) => done(Ok(TargetReply::Data(buffer))),
                                Err(TargetError::Io(message)) if message.contains("checksum") => {
                                    engine.submit(
                                        ClientRequest::Read { offset, length },
                                        Box::new(move |result| done(target_reply(result))),
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
        self.engine
            .submit(request, Box::new(move |result| done(target_reply(result))));
    }

    fn block_status(
        &self,
        offset: u64,
        length: u64,
    ) -> Result<Vec<BlockStatusExtent>, TargetError> {
        if self.engine.reads_locally() {
            if let Some(local) = &self.engine.local {
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
