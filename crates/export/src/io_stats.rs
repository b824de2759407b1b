//! Request accounting at the NBD edge: per volume, operations and bytes per
//! kind, latency histograms and requests in flight, as the client sees them
//! (from a request's validation to its reply being written).
//!
//! The hot path is a handful of relaxed atomic adds on counters the
//! connection already holds (`Arc<VolumeIo>`, looked up once per connection):
//! no lock, no allocation per request. Readers (the node's `/metrics` and
//! I/O rates) take a [`VolumeIoSnapshot`] whenever they like; counters only
//! grow, so a reader computes rates from two snapshots.
//!
//! Built without the `metrics` feature, [`VolumeIo::begin`] is a no-op and
//! every counter stays at zero: that build is the baseline of
//! `bench/metrics-cost.sh`.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// The kinds of request counted, each with its own counters. BLOCK_STATUS
/// and DISC are not counted: they move no data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoKind {
    Read,
    Write,
    Flush,
    Trim,
    WriteZeroes,
}

impl IoKind {
    pub const ALL: [IoKind; 5] = [
        IoKind::Read,
        IoKind::Write,
        IoKind::Flush,
        IoKind::Trim,
        IoKind::WriteZeroes,
    ];

    /// The `op` label value.
    pub fn name(self) -> &'static str {
        match self {
            IoKind::Read => "read",
            IoKind::Write => "write",
            IoKind::Flush => "flush",
            IoKind::Trim => "trim",
            IoKind::WriteZeroes => "write_zeroes",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Upper bounds of the latency buckets, in nanoseconds: 50 µs (a cached
/// read) to 2.5 s (a replica timing out). One more bucket holds the rest.
pub const LATENCY_BUCKET_BOUNDS_NANOS: [u64; 15] = [
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    25_000_000,
    50_000_000,
    100_000_000,
    250_000_000,
    500_000_000,
    1_000_000_000,
    2_500_000_000,
];
const BUCKETS: usize = LATENCY_BUCKET_BOUNDS_NANOS.len() + 1;

// The bounds must ascend, or a latency would land in the wrong bucket.
const _: () = {
    let mut index = 1;
    while index < LATENCY_BUCKET_BOUNDS_NANOS.len() {
        assert!(LATENCY_BUCKET_BOUNDS_NANOS[index - 1] < LATENCY_BUCKET_BOUNDS_NANOS[index]);
        index += 1;
    }
};

#[derive(Default)]
struct KindCounters {
    operations: AtomicU64,
    bytes: AtomicU64,
    latency_sum_nanos: AtomicU64,
    /// Per bucket, not cumulative (one add per request); summed on read.
    latency_buckets: [AtomicU64; BUCKETS],
}

/// The counters of one volume, shared by all its connections.
#[derive(Default)]
pub struct VolumeIo {
    kinds: [KindCounters; IoKind::ALL.len()],
    in_flight: AtomicI64,
    errors: AtomicU64,
}

/// A copy of one kind's counters at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KindSnapshot {
    pub operations: u64,
    pub bytes: u64,
    pub latency_sum_seconds: f64,
    /// Requests per bucket (not cumulative): one per bound of
    /// [`LATENCY_BUCKET_BOUNDS_NANOS`], then those beyond the last bound.
    pub latency_buckets: Vec<u64>,
}

/// A copy of a volume's counters at one moment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VolumeIoSnapshot {
    /// In the order of [`IoKind::ALL`].
    pub kinds: Vec<(IoKind, KindSnapshot)>,
    pub in_flight: u64,
    pub errors: u64,
}

impl VolumeIoSnapshot {
    pub fn kind(&self, kind: IoKind) -> &KindSnapshot {
        &self.kinds[kind.index()].1
    }
}

impl VolumeIo {
    pub fn new() -> Arc<Self> {
        Arc::new(VolumeIo::default())
    }

    /// Starts accounting one request; the returned guard completes it when
    /// dropped (its reply written, or the connection gone).
    pub(crate) fn begin(self: &Arc<Self>, kind: IoKind, bytes: u64) -> Option<InFlight> {
        if !cfg!(feature = "metrics") {
            return None;
        }
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        Some(InFlight {
            io: self.clone(),
            kind,
            bytes,
            started: Instant::now(),
        })
    }

    pub(crate) fn failed(&self) {
        if cfg!(feature = "metrics") {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn complete(&self, kind: IoKind, bytes: u64, elapsed_nanos: u64) {
        let counters = &self.kinds[kind.index()];
        counters.operations.fetch_add(1, Ordering::Relaxed);
        counters.bytes.fetch_add(bytes, Ordering::Relaxed);
        counters
            .latency_sum_nanos
            .fetch_add(elapsed_nanos, Ordering::Relaxed);
        let bucket = LATENCY_BUCKET_BOUNDS_NANOS
            .iter()
            .position(|bound| elapsed_nanos <= *bound)
            .unwrap_or(BUCKETS - 1);
        counters.latency_buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> VolumeIoSnapshot {
        let kinds = IoKind::ALL
            .iter()
            .map(|kind| {
                let counters = &self.kinds[kind.index()];
                let latency_buckets = counters
                    .latency_buckets
                    .iter()
                    .map(|bucket| bucket.load(Ordering::Relaxed))
                    .collect();
                let snapshot = KindSnapshot {
                    operations: counters.operations.load(Ordering::Relaxed),
                    bytes: counters.bytes.load(Ordering::Relaxed),
                    latency_sum_seconds: counters.latency_sum_nanos.load(Ordering::Relaxed) as f64
                        / 1e9,
                    latency_buckets,
                };
                (*kind, snapshot)
            })
            .collect();
        VolumeIoSnapshot {
            kinds,
            // Completions and starts race on relaxed atomics: never negative.
            in_flight: self.in_flight.load(Ordering::Relaxed).max(0) as u64,
            errors: self.errors.load(Ordering::Relaxed),
        }
    }
}

/// One request being served; completes its accounting when dropped.
pub(crate) struct InFlight {
    io: Arc<VolumeIo>,
    kind: IoKind,
    bytes: u64,
    started: Instant,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let elapsed = u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.io.complete(self.kind, self.bytes, elapsed);
    }
}

#[cfg(all(test, feature = "metrics"))]
mod tests {
    use super::*;

    #[test]
    fn a_completed_request_counts_once_in_one_bucket() {
        let io = VolumeIo::new();
        let guard = io.begin(IoKind::Write, 4096).expect("metrics are on");
        assert_eq!(io.snapshot().in_flight, 1);
        drop(guard);
        io.complete(IoKind::Read, 512, 3_000_000_000);
        let snapshot = io.snapshot();
        assert_eq!(snapshot.in_flight, 0);
        let write = snapshot.kind(IoKind::Write);
        assert_eq!((write.operations, write.bytes), (1, 4096));
        assert_eq!(write.latency_buckets.iter().sum::<u64>(), 1);
        let read = snapshot.kind(IoKind::Read);
        // 3 s is beyond the last bound: only the +Inf bucket has it.
        assert_eq!(read.latency_buckets.iter().sum::<u64>(), 1);
        assert_eq!(read.latency_buckets[BUCKETS - 1], 1);
        assert!((read.latency_sum_seconds - 3.0).abs() < 1e-9);
    }
}
