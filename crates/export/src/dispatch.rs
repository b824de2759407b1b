//! Runs one validated request against the target, on a blocking thread, and
//! encodes its reply.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedSemaphorePermit;

use crate::io_stats::{InFlight, VolumeIo};
use tracing::{error, warn};
use trireme_proto::nbd::constants::{STATE_HOLE, STATE_ZERO};
use trireme_proto::nbd::reply::{self, descriptors_from_extents};
use trireme_proto::nbd::{ErrorCode, Request, RequestKind};
use trireme_types::{
    Attempt, BlockTarget, Completer, TargetError, TargetReply, TargetRequest, ZeroFlags,
};

/// Read buffers kept per connection for reuse.
const MAX_POOLED_READ_BUFFERS: usize = 8;
/// Larger read buffers are freed rather than kept.
const MAX_POOLED_READ_BUFFER_BYTES: usize = 1024 * 1024;

/// What a request's reply needs, shared by the connection's requests.
#[derive(Clone)]
pub(crate) struct ReplyContext {
    pub(crate) target: Arc<dyn BlockTarget>,
    pub(crate) export_name: Arc<str>,
    pub(crate) structured_replies: bool,
    pub(crate) base_allocation_context_id: Option<u32>,
    pub(crate) buffers: BufferPool,
    /// Where this export's requests are counted.
    pub(crate) io: Option<Arc<VolumeIo>>,
}

/// The permits a request holds until its reply is written.
pub(crate) struct Permits {
    pub(crate) _request: OwnedSemaphorePermit,
    pub(crate) _payload: Option<OwnedSemaphorePermit>,
    /// Completes the request's accounting when the reply is written.
    pub(crate) _in_flight: Option<InFlight>,
}

/// One reply: header bytes, then READ data if any.
#[derive(Default)]
pub(crate) struct Outgoing {
    pub(crate) header: Vec<u8>,
    pub(crate) data: Option<Vec<u8>>,
    pub(crate) permits: Option<Permits>,
}

/// Reuses READ buffers within a connection, so steady reads do not
/// allocate.
#[derive(Clone, Default)]
pub(crate) struct BufferPool(Arc<Mutex<Vec<Vec<u8>>>>);

impl BufferPool {
    fn take(&self, length_bytes: usize) -> Vec<u8> {
        let pooled = self.0.lock().ok().and_then(|mut buffers| buffers.pop());
        let mut buffer = pooled.unwrap_or_default();
        buffer.clear();
        buffer.resize(length_bytes, 0);
        buffer
    }

    pub(crate) fn put(&self, buffer: Vec<u8>) {
        if buffer.capacity() > MAX_POOLED_READ_BUFFER_BYTES {
            return;
        }
        if let Ok(mut buffers) = self.0.lock() {
            if buffers.len() < MAX_POOLED_READ_BUFFERS {
                buffers.push(buffer);
            }
        }
    }
}

pub(crate) fn error_code(error: &TargetError) -> ErrorCode {
    match error {
        TargetError::Io(_) | TargetError::Device(_) | TargetError::Checksum { .. } => ErrorCode::Io,
        TargetError::NoSpace { .. } => ErrorCode::NoSpace,
        TargetError::Invalid(_) => ErrorCode::Invalid,
        TargetError::NotSupported(_) => ErrorCode::NotSupported,
        TargetError::ReadOnly => ErrorCode::Perm,
        TargetError::ShuttingDown => ErrorCode::Shutdown,
    }
}

/// Runs `request` (already validated) and builds its reply. A panicking
/// target answers EIO instead of leaving the client waiting forever.
pub(crate) fn execute(context: &ReplyContext, request: Request) -> Outgoing {
    let cookie = request.cookie;
    let command = command_name(&request.kind);
    match catch_unwind(AssertUnwindSafe(|| run(context, request))) {
        Ok(Ok(outgoing)) => outgoing,
        Ok(Err(target_error)) => {
            warn!(export = %context.export_name, cookie, command, error = %target_error, "NBD request failed");
            error_reply(
                context,
                cookie,
                error_code(&target_error),
                &target_error.to_string(),
            )
        }
        Err(_) => {
            error!(export = %context.export_name, cookie, command, "target panicked during an NBD request");
            error_reply(context, cookie, ErrorCode::Io, "internal error")
        }
    }
}

/// Runs a plain write or a read on the calling (network) thread when the
/// target can do it without blocking; otherwise hands the request back.
pub(crate) fn try_inline(context: &ReplyContext, request: Request) -> Result<Outgoing, Request> {
    let cookie = request.cookie;
    let fua = request.fua();
    let flags = request.flags;
    match request.kind {
        RequestKind::Write { offset, data } if !fua && !data.is_empty() => {
            match context.target.try_write(offset, data) {
                Attempt::Done(result) => Ok(finish(
                    context,
                    cookie,
                    "write",
                    result.map(|()| {
                        let mut outgoing = Outgoing::default();
                        reply::simple_reply(&mut outgoing.header, cookie, None);
                        outgoing
                    }),
                )),
                Attempt::WouldBlock(data) => Err(Request {
                    cookie,
                    flags,
                    kind: RequestKind::Write { offset, data },
                }),
            }
        }
        RequestKind::Read { offset, length } if length > 0 => {
            let mut buffer = context.buffers.take(length as usize);
            match context.target.try_read(offset, &mut buffer) {
                Some(result) => Ok(finish(
                    context,
                    cookie,
                    "read",
                    result.map(|()| {
                        let mut outgoing = Outgoing::default();
                        if context.structured_replies {
                            reply::offset_data_header(
                                &mut outgoing.header,
                                cookie,
                                offset,
                                length,
                                true,
                            );
                        } else {
                            reply::simple_reply(&mut outgoing.header, cookie, None);
                        }
                        outgoing.data = Some(buffer);
                        outgoing
                    }),
                )),
                None => {
                    context.buffers.put(buffer);
                    Err(Request {
                        cookie,
                        flags,
                        kind: RequestKind::Read { offset, length },
                    })
                }
            }
        }
        kind => Err(Request {
            cookie,
            flags,
            kind,
        }),
    }
}

/// Hands `request` to a target that completes requests on its own
/// threads ([`BlockTarget::submits`]); its reply goes to `replies` when it
/// completes. Requests with nothing to hand over (block status, zero
/// lengths) come back, to run as usual.
// The request comes back by value when it is not handed over: boxing it
// would allocate on every request, which the accounting in `Permits` must
// not cost.
#[allow(clippy::result_large_err)]
pub(crate) fn submit(
    context: &ReplyContext,
    request: Request,
    permits: Permits,
    replies: &tokio::sync::mpsc::UnboundedSender<Outgoing>,
) -> Result<(), (Request, Permits)> {
    let fua = request.fua();
    let cookie = request.cookie;
    let command = command_name(&request.kind);
    let (target_request, read) = match request.kind {
        RequestKind::Read { offset, length } if length > 0 => (
            TargetRequest::Read {
                offset,
                length: u64::from(length),
            },
            Some((offset, length)),
        ),
        RequestKind::Write { offset, data } if !data.is_empty() => {
            (TargetRequest::Write { offset, data, fua }, None)
        }
        RequestKind::Trim { offset, length } if length > 0 => (
            TargetRequest::Trim {
                offset,
                length: u64::from(length),
                fua,
            },
            None,
        ),
        RequestKind::WriteZeroes {
            offset,
            length,
            no_hole,
            fast_zero,
        } if length > 0 => (
            TargetRequest::WriteZeroes {
                offset,
                length: u64::from(length),
                flags: ZeroFlags {
                    fua,
                    no_hole,
                    fast_zero,
                },
            },
            None,
        ),
        RequestKind::Flush => (TargetRequest::Flush, None),
        kind => {
            return Err((
                Request {
                    cookie,
                    flags: request.flags,
                    kind,
                },
                permits,
            ))
        }
    };
    let reply_context = context.clone();
    let replies = replies.clone();
    let done: Completer = Box::new(move |result| {
        let result = result.map(|reply| {
            let mut outgoing = Outgoing::default();
            match (read, reply) {
                (Some((offset, length)), reply) => {
                    let data = match reply {
                        TargetReply::Data(data) if data.len() == length as usize => data,
                        // Zeros: a pooled buffer is zero-filled.
                        _ => reply_context.buffers.take(length as usize),
                    };
                    if reply_context.structured_replies {
                        reply::offset_data_header(
                            &mut outgoing.header,
                            cookie,
                            offset,
                            length,
                            true,
                        );
                    } else {
                        reply::simple_reply(&mut outgoing.header, cookie, None);
                    }
                    outgoing.data = Some(data);
                }
                (None, _) => reply::simple_reply(&mut outgoing.header, cookie, None),
            }
            outgoing
        });
        let mut outgoing = finish(&reply_context, cookie, command, result);
        outgoing.permits = Some(permits);
        // The writer may be gone (client vanished): the reply is dropped.
        let _ = replies.send(outgoing);
    });
    context.target.submit(target_request, done);
    Ok(())
}

fn finish(
    context: &ReplyContext,
    cookie: u64,
    command: &'static str,
    result: Result<Outgoing, TargetError>,
) -> Outgoing {
    result.unwrap_or_else(|target_error| {
        warn!(export = %context.export_name, cookie, command, error = %target_error, "NBD request failed");
        error_reply(context, cookie, error_code(&target_error), &target_error.to_string())
    })
}

fn run(context: &ReplyContext, request: Request) -> Result<Outgoing, TargetError> {
    let target = context.target.as_ref();
    let fua = request.fua();
    let cookie = request.cookie;
    match request.kind {
        RequestKind::Read { offset, length } => return read(context, cookie, offset, length),
        RequestKind::BlockStatus {
            offset,
            length,
            req_one,
        } => return block_status(context, cookie, offset, length, req_one),
        // Zero-length writes, trims and zeroes are no-ops: the spec leaves
        // them unspecified, and the target may treat them as invalid.
        RequestKind::Write { offset, data } if !data.is_empty() => {
            target.write(offset, data, fua)?
        }
        RequestKind::Trim { offset, length } if length > 0 => {
            target.trim(offset, u64::from(length), fua)?
        }
        RequestKind::WriteZeroes {
            offset,
            length,
            no_hole,
            fast_zero,
        } if length > 0 => {
            let flags = ZeroFlags {
                fua,
                no_hole,
                fast_zero,
            };
            target.write_zeroes(offset, u64::from(length), flags)?
        }
        RequestKind::Flush => target.flush()?,
        RequestKind::Write { .. }
        | RequestKind::Trim { .. }
        | RequestKind::WriteZeroes { .. }
        | RequestKind::Disconnect => {}
    }
    let mut outgoing = Outgoing::default();
    // Simple replies are allowed for data-less commands even with
    // structured replies negotiated, and are four bytes shorter.
    reply::simple_reply(&mut outgoing.header, cookie, None);
    Ok(outgoing)
}

fn read(
    context: &ReplyContext,
    cookie: u64,
    offset: u64,
    length: u32,
) -> Result<Outgoing, TargetError> {
    let mut outgoing = Outgoing::default();
    if length == 0 {
        if context.structured_replies {
            reply::structured_none_done(&mut outgoing.header, cookie);
        } else {
            reply::simple_reply(&mut outgoing.header, cookie, None);
        }
        return Ok(outgoing);
    }
    let mut buffer = context.buffers.take(length as usize);
    if let Err(error) = context.target.read(offset, &mut buffer) {
        context.buffers.put(buffer);
        return Err(error);
    }
    if context.structured_replies {
        reply::offset_data_header(&mut outgoing.header, cookie, offset, length, true);
    } else {
        reply::simple_reply(&mut outgoing.header, cookie, None);
    }
    outgoing.data = Some(buffer);
    Ok(outgoing)
}

fn block_status(
    context: &ReplyContext,
    cookie: u64,
    offset: u64,
    length: u32,
    req_one: bool,
) -> Result<Outgoing, TargetError> {
    let Some(context_id) = context.base_allocation_context_id else {
        // validate_request rejects this before dispatch.
        return Err(TargetError::Invalid(
            "base:allocation was not negotiated".into(),
        ));
    };
    let extents = context.target.block_status(offset, u64::from(length))?;
    let flags = |hole: bool, zero: bool| {
        (if hole { STATE_HOLE } else { 0 }) | (if zero { STATE_ZERO } else { 0 })
    };
    let descriptors = descriptors_from_extents(
        extents
            .iter()
            .map(|extent| (extent.length_bytes, flags(extent.hole, extent.zero))),
        length,
        req_one,
    );
    let mut outgoing = Outgoing::default();
    reply::block_status_chunk(&mut outgoing.header, cookie, context_id, &descriptors, true);
    Ok(outgoing)
}

fn error_reply(context: &ReplyContext, cookie: u64, code: ErrorCode, message: &str) -> Outgoing {
    if let Some(io) = &context.io {
        io.failed();
    }
    let mut outgoing = Outgoing::default();
    if context.structured_replies {
        reply::structured_error(&mut outgoing.header, cookie, code, message);
    } else {
        reply::simple_reply(&mut outgoing.header, cookie, Some(code));
    }
    outgoing
}

fn command_name(kind: &RequestKind) -> &'static str {
    match kind {
        RequestKind::Read { .. } => "read",
        RequestKind::Write { .. } => "write",
        RequestKind::Flush => "flush",
        RequestKind::Trim { .. } => "trim",
        RequestKind::WriteZeroes { .. } => "write_zeroes",
        RequestKind::BlockStatus { .. } => "block_status",
        RequestKind::Disconnect => "disconnect",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_errors_map_to_nbd_errors() {
        let cases = [
            (TargetError::Io("disk".into()), ErrorCode::Io),
            (TargetError::Device("disk".into()), ErrorCode::Io),
            (
                TargetError::Checksum {
                    volume_block: 1,
                    pool_block: 2,
                },
                ErrorCode::Io,
            ),
            (
                TargetError::NoSpace { pool: "p".into() },
                ErrorCode::NoSpace,
            ),
            (TargetError::Invalid("x".into()), ErrorCode::Invalid),
            (
                TargetError::NotSupported("slow".into()),
                ErrorCode::NotSupported,
            ),
            (TargetError::ReadOnly, ErrorCode::Perm),
            (TargetError::ShuttingDown, ErrorCode::Shutdown),
        ];
        for (error, code) in cases {
            assert_eq!(error_code(&error), code);
        }
        assert_eq!(ErrorCode::Shutdown.as_u32(), 108);
    }
}
