//! The server side of the fixed-newstyle NBD handshake, as a state machine.
//!
//! ```text
//! new() ──► greeting queued ──► ClientFlags ──► Options ─┬─► Transmission(Negotiated)
//!                                   │              ▲ │    │     (OPT_GO, OPT_EXPORT_NAME)
//!                                   ▼              └─┘    └─► Close(reason)
//!                                 Close        other options    (OPT_ABORT, protocol violation,
//!                                              answered here     unknown export on EXPORT_NAME)
//! ```
//!
//! The runtime feeds received bytes to [`Handshake::receive`], sends what
//! [`Handshake::take_output`] returns, and stops when the step is not
//! [`HandshakeStep::NeedMore`]. Bytes the client sent after the final option
//! are kept for the transmission phase ([`Handshake::take_leftover`]).
//!
//! Memory stays bounded: the input buffer never holds more than one option
//! header plus [`MAX_OPTION_BYTES`] (beyond what one `receive` call hands in),
//! and a session may send at most [`MAX_OPTIONS_PER_HANDSHAKE`] options.

use super::constants::*;

/// What the handshake needs to know about an export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportInfo {
    pub size_bytes: u64,
    pub read_only: bool,
}

impl ExportInfo {
    /// The transmission flags this server advertises for the export.
    pub fn transmission_flags(&self) -> u16 {
        let mut flags = TRANSMISSION_HAS_FLAGS
            | TRANSMISSION_SEND_FLUSH
            | TRANSMISSION_SEND_FUA
            | TRANSMISSION_SEND_TRIM
            | TRANSMISSION_SEND_WRITE_ZEROES
            | TRANSMISSION_SEND_FAST_ZERO
            // The target's flush covers writes from every connection.
            | TRANSMISSION_CAN_MULTI_CONN;
        if self.read_only {
            flags |= TRANSMISSION_READ_ONLY;
        }
        flags
    }
}

/// The exports a server offers, looked up by name.
pub trait ExportCatalog {
    /// The export `name`, or why it is not offered: a sentence for the
    /// client's user, sent as the message of `NBD_REP_ERR_UNKNOWN` (QEMU
    /// and libnbd show it), e.g. where the volume is served instead.
    fn lookup(&self, name: &str) -> Result<ExportInfo, String>;
    fn names(&self) -> Vec<String>;
}

/// What the handshake agreed on; the transmission phase runs with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    pub export_name: String,
    pub export: ExportInfo,
    pub transmission_flags: u16,
    pub structured_replies: bool,
    /// The id of `base:allocation`, when the client selected it for this export.
    pub base_allocation_context_id: Option<u32>,
}

/// The outcome of feeding bytes to the handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HandshakeStep {
    /// Send the queued output and read more.
    NeedMore,
    /// Send the queued output, then enter the transmission phase.
    Transmission(Negotiated),
    /// Send the queued output (if any), then close the connection.
    Close(CloseReason),
}

/// Why the handshake ended without a transmission phase.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CloseReason {
    #[error("client sent NBD_OPT_ABORT")]
    ClientAborted,
    #[error("client flags {flags:#x} lack NBD_FLAG_C_FIXED_NEWSTYLE")]
    MissingFixedNewstyle { flags: u32 },
    #[error("client flags {flags:#x} carry unknown bits")]
    UnknownClientFlags { flags: u32 },
    #[error("option header has magic {magic:#x}, expected IHAVEOPT")]
    BadOptionMagic { magic: u64 },
    #[error(
        "option {option} is {length_bytes} bytes long, over the {MAX_OPTION_BYTES}-byte limit"
    )]
    OptionTooLong { option: u32, length_bytes: u32 },
    #[error("client sent more than {MAX_OPTIONS_PER_HANDSHAKE} options")]
    TooManyOptions,
    #[error("NBD_OPT_EXPORT_NAME asked for unknown export '{name}'")]
    UnknownExport { name: String },
    #[error("NBD_OPT_EXPORT_NAME carries a name that is not UTF-8")]
    InvalidExportName,
    #[error("bytes received after the handshake ended")]
    AlreadyFinished,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    ClientFlags,
    Options,
    Finished,
}

/// The server side of one connection's handshake.
#[derive(Debug)]
pub struct Handshake {
    state: State,
    input: Vec<u8>,
    output: Vec<u8>,
    no_zeroes: bool,
    structured_replies: bool,
    /// Export name of the last successful SET_META_CONTEXT that selected
    /// `base:allocation`; it only applies if the client then picks that export.
    meta_context_export: Option<String>,
    options_received: u32,
}

/// magic u64, option u32, length u32.
const OPTION_HEADER_BYTES: usize = 16;

impl Default for Handshake {
    fn default() -> Self {
        Self::new()
    }
}

impl Handshake {
    /// A handshake with the server greeting already queued for sending.
    pub fn new() -> Self {
        let mut output = Vec::with_capacity(18);
        output.extend_from_slice(&NBD_MAGIC.to_be_bytes());
        output.extend_from_slice(&IHAVEOPT_MAGIC.to_be_bytes());
        output.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
        Handshake {
            state: State::ClientFlags,
            input: Vec::new(),
            output,
            no_zeroes: false,
            structured_replies: false,
            meta_context_export: None,
            options_received: 0,
        }
    }

    /// Bytes to send to the client, in order; the queue is emptied.
    pub fn take_output(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.output)
    }

    /// Bytes received but not consumed. After a `Transmission` step these
    /// are the first bytes of the transmission phase.
    pub fn take_leftover(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.input)
    }

    /// Bytes currently buffered (for tests of the memory bound).
    pub fn buffered_input_bytes(&self) -> usize {
        self.input.len()
    }

    /// Feeds bytes from the client; answers every complete option.
    pub fn receive(&mut self, bytes: &[u8], catalog: &dyn ExportCatalog) -> HandshakeStep {
        if self.state == State::Finished {
            return HandshakeStep::Close(CloseReason::AlreadyFinished);
        }
        self.input.extend_from_slice(bytes);
        let step = self.process(catalog);
        if !matches!(step, HandshakeStep::NeedMore) {
            self.state = State::Finished;
        }
        step
    }

    fn process(&mut self, catalog: &dyn ExportCatalog) -> HandshakeStep {
        loop {
            match self.state {
                State::ClientFlags => {
                    let Some(flags) = read_u32(&self.input, 0) else {
                        return HandshakeStep::NeedMore;
                    };
                    self.input.drain(..4);
                    if flags & CLIENT_FLAG_FIXED_NEWSTYLE == 0 {
                        return HandshakeStep::Close(CloseReason::MissingFixedNewstyle { flags });
                    }
                    if flags & !CLIENT_FLAGS_KNOWN != 0 {
                        return HandshakeStep::Close(CloseReason::UnknownClientFlags { flags });
                    }
                    self.no_zeroes = flags & CLIENT_FLAG_NO_ZEROES != 0;
                    self.state = State::Options;
                }
                State::Options => {
                    if let Some(step) = self.process_one_option(catalog) {
                        return step;
                    }
                }
                State::Finished => return HandshakeStep::Close(CloseReason::AlreadyFinished),
            }
        }
    }

    /// `None` after an option that keeps the handshake going.
    fn process_one_option(&mut self, catalog: &dyn ExportCatalog) -> Option<HandshakeStep> {
        let (Some(magic), Some(option), Some(length_bytes)) = (
            read_u64(&self.input, 0),
            read_u32(&self.input, 8),
            read_u32(&self.input, 12),
        ) else {
            return Some(HandshakeStep::NeedMore);
        };
        if magic != IHAVEOPT_MAGIC {
            return Some(HandshakeStep::Close(CloseReason::BadOptionMagic { magic }));
        }
        // Checked before waiting for the body, so a huge length never buffers.
        if length_bytes > MAX_OPTION_BYTES {
            return Some(HandshakeStep::Close(CloseReason::OptionTooLong {
                option,
                length_bytes,
            }));
        }
        let frame_bytes = OPTION_HEADER_BYTES + length_bytes as usize;
        if self.input.len() < frame_bytes {
            return Some(HandshakeStep::NeedMore);
        }
        self.options_received += 1;
        if self.options_received > MAX_OPTIONS_PER_HANDSHAKE {
            return Some(HandshakeStep::Close(CloseReason::TooManyOptions));
        }
        let frame: Vec<u8> = self.input.drain(..frame_bytes).collect();
        self.handle_option(option, &frame[OPTION_HEADER_BYTES..], catalog)
    }

    fn handle_option(
        &mut self,
        option: u32,
        data: &[u8],
        catalog: &dyn ExportCatalog,
    ) -> Option<HandshakeStep> {
        match option {
            OPT_EXPORT_NAME => Some(self.handle_export_name(data, catalog)),
            OPT_ABORT => {
                self.option_reply(option, REP_ACK, &[]);
                Some(HandshakeStep::Close(CloseReason::ClientAborted))
            }
            OPT_LIST => {
                self.handle_list(data, catalog);
                None
            }
            OPT_INFO | OPT_GO => self.handle_info_or_go(option, data, catalog),
            OPT_STRUCTURED_REPLY => {
                if data.is_empty() {
                    self.structured_replies = true;
                    self.option_reply(option, REP_ACK, &[]);
                } else {
                    self.option_error(
                        option,
                        REP_ERR_INVALID,
                        "NBD_OPT_STRUCTURED_REPLY takes no data",
                    );
                }
                None
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                self.handle_meta_context(option, data, catalog);
                None
            }
            OPT_STARTTLS => {
                self.option_error(option, REP_ERR_UNSUP, "this server does not offer TLS");
                None
            }
            _ => {
                self.option_error(
                    option,
                    REP_ERR_UNSUP,
                    "option is not supported by this server",
                );
                None
            }
        }
    }

    fn handle_export_name(&mut self, data: &[u8], catalog: &dyn ExportCatalog) -> HandshakeStep {
        // NBD_OPT_EXPORT_NAME cannot answer with an error: only closing is left.
        let Ok(name) = std::str::from_utf8(data) else {
            return HandshakeStep::Close(CloseReason::InvalidExportName);
        };
        let Ok(export) = catalog.lookup(name) else {
            return HandshakeStep::Close(CloseReason::UnknownExport {
                name: name.to_owned(),
            });
        };
        self.output
            .extend_from_slice(&export.size_bytes.to_be_bytes());
        self.output
            .extend_from_slice(&export.transmission_flags().to_be_bytes());
        if !self.no_zeroes {
            self.output.extend_from_slice(&[0u8; 124]);
        }
        HandshakeStep::Transmission(self.negotiated(name, export))
    }

    fn handle_list(&mut self, data: &[u8], catalog: &dyn ExportCatalog) {
        if !data.is_empty() {
            self.option_error(OPT_LIST, REP_ERR_INVALID, "NBD_OPT_LIST takes no data");
            return;
        }
        for name in catalog.names() {
            let Ok(name_length) = u32::try_from(name.len()) else {
                continue;
            };
            let mut payload = Vec::with_capacity(4 + name.len());
            payload.extend_from_slice(&name_length.to_be_bytes());
            payload.extend_from_slice(name.as_bytes());
            self.option_reply(OPT_LIST, REP_SERVER, &payload);
        }
        self.option_reply(OPT_LIST, REP_ACK, &[]);
    }

    fn handle_info_or_go(
        &mut self,
        option: u32,
        data: &[u8],
        catalog: &dyn ExportCatalog,
    ) -> Option<HandshakeStep> {
        let Some((name, info_requests)) = parse_info_request(data) else {
            self.option_error(
                option,
                REP_ERR_INVALID,
                "malformed NBD_OPT_INFO/NBD_OPT_GO data",
            );
            return None;
        };
        let export = match catalog.lookup(&name) {
            Ok(export) => export,
            Err(reason) => {
                self.option_error(option, REP_ERR_UNKNOWN, &reason);
                return None;
            }
        };
        let mut info = Vec::with_capacity(14);
        info.extend_from_slice(&INFO_EXPORT.to_be_bytes());
        info.extend_from_slice(&export.size_bytes.to_be_bytes());
        info.extend_from_slice(&export.transmission_flags().to_be_bytes());
        self.option_reply(option, REP_INFO, &info);

        // Sent even unrequested: it tells the client our 32 MiB maximum.
        info.clear();
        info.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        info.extend_from_slice(&BLOCK_SIZE_MINIMUM_BYTES.to_be_bytes());
        info.extend_from_slice(&BLOCK_SIZE_PREFERRED_BYTES.to_be_bytes());
        info.extend_from_slice(&BLOCK_SIZE_MAXIMUM_BYTES.to_be_bytes());
        self.option_reply(option, REP_INFO, &info);

        if info_requests.contains(&INFO_NAME) {
            info.clear();
            info.extend_from_slice(&INFO_NAME.to_be_bytes());
            info.extend_from_slice(name.as_bytes());
            self.option_reply(option, REP_INFO, &info);
        }
        self.option_reply(option, REP_ACK, &[]);
        if option == OPT_GO {
            Some(HandshakeStep::Transmission(self.negotiated(&name, export)))
        } else {
            None
        }
    }

    fn handle_meta_context(&mut self, option: u32, data: &[u8], catalog: &dyn ExportCatalog) {
        let is_set = option == OPT_SET_META_CONTEXT;
        if is_set {
            // A SET replaces the previous selection, even when it fails.
            self.meta_context_export = None;
        }
        if !self.structured_replies {
            self.option_error(
                option,
                REP_ERR_INVALID,
                "negotiate NBD_OPT_STRUCTURED_REPLY first",
            );
            return;
        }
        let Some((name, queries)) = parse_meta_context_request(data) else {
            self.option_error(option, REP_ERR_INVALID, "malformed meta context request");
            return;
        };
        if let Err(reason) = catalog.lookup(&name) {
            self.option_error(option, REP_ERR_UNKNOWN, &reason);
            return;
        }
        let selects_base_allocation = if is_set {
            queries.iter().any(|query| query == BASE_ALLOCATION)
        } else {
            // LIST: no query lists everything; "base:" is the namespace wildcard.
            queries.is_empty()
                || queries
                    .iter()
                    .any(|query| query == BASE_ALLOCATION || query == "base:")
        };
        if selects_base_allocation {
            // LIST replies carry the reserved id zero.
            let context_id = if is_set {
                BASE_ALLOCATION_CONTEXT_ID
            } else {
                0
            };
            let mut payload = Vec::with_capacity(4 + BASE_ALLOCATION.len());
            payload.extend_from_slice(&context_id.to_be_bytes());
            payload.extend_from_slice(BASE_ALLOCATION.as_bytes());
            self.option_reply(option, REP_META_CONTEXT, &payload);
            if is_set {
                self.meta_context_export = Some(name);
            }
        }
        self.option_reply(option, REP_ACK, &[]);
    }

    fn negotiated(&self, name: &str, export: ExportInfo) -> Negotiated {
        let context_applies =
            self.structured_replies && self.meta_context_export.as_deref() == Some(name);
        Negotiated {
            export_name: name.to_owned(),
            export,
            transmission_flags: export.transmission_flags(),
            structured_replies: self.structured_replies,
            base_allocation_context_id: context_applies.then_some(BASE_ALLOCATION_CONTEXT_ID),
        }
    }

    fn option_reply(&mut self, option: u32, reply_type: u32, data: &[u8]) {
        // Every reply payload built here is far below u32::MAX.
        let length = u32::try_from(data.len()).unwrap_or(u32::MAX);
        self.output
            .extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
        self.output.extend_from_slice(&option.to_be_bytes());
        self.output.extend_from_slice(&reply_type.to_be_bytes());
        self.output.extend_from_slice(&length.to_be_bytes());
        self.output.extend_from_slice(data);
    }

    fn option_error(&mut self, option: u32, reply_type: u32, message: &str) {
        let message = truncate_utf8(message, MAX_ERROR_MESSAGE_BYTES);
        self.option_reply(option, reply_type, message.as_bytes());
    }
}

/// Cuts `text` to at most `max_bytes`, on a character boundary.
pub(crate) fn truncate_utf8(text: &str, max_bytes: usize) -> &str {
    if text.len() <= max_bytes {
        return text;
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn read_u16(bytes: &[u8], at: usize) -> Option<u16> {
    let chunk = bytes.get(at..at.checked_add(2)?)?;
    Some(u16::from_be_bytes(chunk.try_into().ok()?))
}

fn read_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let chunk = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_be_bytes(chunk.try_into().ok()?))
}

fn read_u64(bytes: &[u8], at: usize) -> Option<u64> {
    let chunk = bytes.get(at..at.checked_add(8)?)?;
    Some(u64::from_be_bytes(chunk.try_into().ok()?))
}

/// Reads a u32-length-prefixed UTF-8 string at `*at`, advancing it.
fn read_string(bytes: &[u8], at: &mut usize) -> Option<String> {
    let length = usize::try_from(read_u32(bytes, *at)?).ok()?;
    let start = at.checked_add(4)?;
    let end = start.checked_add(length)?;
    let text = std::str::from_utf8(bytes.get(start..end)?).ok()?;
    *at = end;
    Some(text.to_owned())
}

/// NBD_OPT_INFO / NBD_OPT_GO data: name (u32 length), u16 count, u16 each.
fn parse_info_request(data: &[u8]) -> Option<(String, Vec<u16>)> {
    let mut at = 0;
    let name = read_string(data, &mut at)?;
    let count = usize::from(read_u16(data, at)?);
    at += 2;
    if data.len() != at.checked_add(count.checked_mul(2)?)? {
        return None;
    }
    let requests = (0..count)
        .map(|index| read_u16(data, at + 2 * index))
        .collect::<Option<Vec<_>>>()?;
    Some((name, requests))
}

/// LIST/SET_META_CONTEXT data: export name, u32 count, then count strings.
fn parse_meta_context_request(data: &[u8]) -> Option<(String, Vec<String>)> {
    let mut at = 0;
    let name = read_string(data, &mut at)?;
    let count = read_u32(data, at)?;
    at += 4;
    let mut queries = Vec::new();
    // Each query takes at least four bytes, so a lying count fails quickly.
    for _ in 0..count {
        queries.push(read_string(data, &mut at)?);
    }
    (at == data.len()).then_some((name, queries))
}

#[cfg(test)]
#[path = "handshake_tests.rs"]
mod tests;
