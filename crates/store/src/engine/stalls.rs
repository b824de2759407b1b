//! Where a pool's writers and its background thread waited, since the
//! pool opened: the causes of tail latency, as counters that `/metrics`
//! shows (`docs/metrics.md`). A write that waits at admission waits for the
//! applier; the applier in turn waits for the device (write-back of the
//! in-place data, the checkpoint's flush and commit, an activation's
//! flush). Summing each wait's length, not sampling, makes a rare long
//! stall as visible as many short ones.

use std::time::Duration;

/// Why a write waited at admission (the first rule that held it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdmissionWait {
    /// The journal ring had no room until a checkpoint freed some.
    JournalFull,
    /// `HELD_BYTES_MAX` of acknowledged data waited to be applied or to
    /// have its write-back started (the label keeps its first name).
    UnappliedBytes,
    /// Not enough free chunks until pending trims or frees came back.
    Chunks,
}

impl AdmissionWait {
    pub const ALL: [AdmissionWait; 3] = [
        AdmissionWait::JournalFull,
        AdmissionWait::UnappliedBytes,
        AdmissionWait::Chunks,
    ];

    /// The `reason` label of the metric.
    pub fn name(self) -> &'static str {
        match self {
            AdmissionWait::JournalFull => "journal_full",
            AdmissionWait::UnappliedBytes => "unapplied_bytes",
            AdmissionWait::Chunks => "chunks",
        }
    }
}

/// How often something waited, and for how long in all.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WaitTotal {
    pub count: u64,
    pub micros: u64,
}

impl WaitTotal {
    pub fn add(&mut self, waited: Duration) {
        self.count += 1;
        self.micros += u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
    }

    pub fn seconds(&self) -> f64 {
        self.micros as f64 / 1e6
    }
}

/// A pool's waits since it opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StallStats {
    /// Indexed like [`AdmissionWait::ALL`]: one count per write that
    /// waited, however many times its admission looped.
    pub admission: [WaitTotal; 3],
    /// Starting the write-back of in-place data (`sync_file_range(WRITE)`,
    /// which blocks when the device's queue is full or write-back is
    /// throttled), on the write-back thread.
    pub writeback_start: WaitTotal,
    /// The write-back thread waiting for the write-back it started (every
    /// `WRITEBACK_WAIT_BYTES`).
    pub writeback: WaitTotal,
    /// The applier waiting for the write-back thread to catch up
    /// (`QUEUE_MAX_BYTES` handed over and not started).
    pub writeback_queue: WaitTotal,
    /// Checkpoints: checksum pages, the device flush and the metadata
    /// commit.
    pub checkpoints: WaitTotal,
    /// Region activations: an active-set slot and its device flush.
    pub activations: WaitTotal,
}

impl StallStats {
    pub fn admission(&self, reason: AdmissionWait) -> WaitTotal {
        self.admission[reason as usize]
    }
}
