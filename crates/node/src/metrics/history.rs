//! The last hour of I/O, kept by the node so that a chart opens full
//! (`GET /api/v1/io/history`, the dashboard's charts).
//!
//! The rates sampler ([`super::Metrics::sample`]) hands this the edge
//! counters every second; at each boundary of the wall clock's
//! [`RESOLUTION`] (10 s: :00, :10, :20...) the counters' growth since the
//! last boundary becomes one [`Sample`] per volume and one for the whole
//! node. Every node cuts its samples at the same boundaries, so the
//! cluster's and a volume's history are the sum of the nodes' samples of
//! the same slot.
//!
//! Each ring holds at most [`SAMPLES_KEPT`] samples (an hour): a volume
//! costs [`BYTES_PER_VOLUME`] (8,640 B, about 8.5 KiB), at most
//! [`super::MAX_COUNTED_VOLUMES`] volumes are counted, and the node's own
//! ring costs the same once. The history lives in memory only: a node
//! that restarts starts a new one.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::rates::Totals;

/// One sample per this much wall-clock time.
pub const RESOLUTION: Duration = Duration::from_secs(10);
/// How far back the history reaches.
pub const SPAN: Duration = Duration::from_secs(3600);
/// Samples kept per ring: the span at the resolution.
pub const SAMPLES_KEPT: usize = (SPAN.as_secs() / RESOLUTION.as_secs()) as usize;
/// Memory of one volume's ring when full.
pub const BYTES_PER_VOLUME: usize = SAMPLES_KEPT * std::mem::size_of::<Sample>();

const _: () = assert!(SPAN.as_secs().is_multiple_of(RESOLUTION.as_secs()));
const _: () = assert!(std::mem::size_of::<Sample>() == 24);
const _: () = assert!(BYTES_PER_VOLUME == 8640);

/// The rates of one slot of [`RESOLUTION`]. Rates are `f32`: a chart needs
/// no more than its 7 digits, and the ring stays small.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sample {
    /// Start of the slot, in seconds since the Unix epoch; a multiple of
    /// [`RESOLUTION`].
    pub unix_seconds: u64,
    pub read_iops: f32,
    pub write_iops: f32,
    pub read_bytes_per_sec: f32,
    pub write_bytes_per_sec: f32,
}

impl Sample {
    /// Adds another node's sample of the same slot.
    pub fn add(&mut self, other: &Sample) {
        debug_assert_eq!(self.unix_seconds, other.unix_seconds);
        self.read_iops += other.read_iops;
        self.write_iops += other.write_iops;
        self.read_bytes_per_sec += other.read_bytes_per_sec;
        self.write_bytes_per_sec += other.write_bytes_per_sec;
    }

    fn between(unix_seconds: u64, then: &Totals, now: &Totals, seconds: f64) -> Sample {
        // A counter that restarted (volume recreated) is idle, not negative.
        let per_second = |now: u64, then: u64| (now.saturating_sub(then) as f64 / seconds) as f32;
        Sample {
            unix_seconds,
            read_iops: per_second(now.read_ops, then.read_ops),
            write_iops: per_second(now.write_ops, then.write_ops),
            read_bytes_per_sec: per_second(now.read_bytes, then.read_bytes),
            write_bytes_per_sec: per_second(now.write_bytes, then.write_bytes),
        }
    }
}

/// A ring of at most [`SAMPLES_KEPT`] samples, oldest first, each slot
/// later than the one before.
#[derive(Debug, Default)]
struct Ring(VecDeque<Sample>);

impl Ring {
    fn push(&mut self, sample: Sample) {
        assert!(
            self.0
                .back()
                .is_none_or(|last| last.unix_seconds < sample.unix_seconds),
            "history samples must move forward in time"
        );
        assert!(sample.unix_seconds.is_multiple_of(RESOLUTION.as_secs()));
        if self.0.len() == SAMPLES_KEPT {
            self.0.pop_front();
        }
        self.0.push_back(sample);
    }

    fn last_slot(&self) -> Option<u64> {
        self.0
            .back()
            .map(|sample| sample.unix_seconds / RESOLUTION.as_secs())
    }

    fn samples(&self) -> Vec<Sample> {
        self.0.iter().copied().collect()
    }
}

/// Where the open slot started: its time and the counters then.
struct Baseline {
    slot: u64,
    at_seconds: f64,
    volumes: BTreeMap<String, Totals>,
}

#[derive(Default)]
struct Inner {
    baseline: Option<Baseline>,
    node: Ring,
    volumes: BTreeMap<String, Ring>,
}

/// The node's I/O history: one ring for the node, one per volume counted.
#[derive(Default)]
pub struct History {
    inner: Mutex<Inner>,
}

fn seconds_since_epoch(time: SystemTime) -> f64 {
    time.duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64()
}

impl History {
    /// Takes the edge counters at `now` (every second, from the rates
    /// sampler). When `now` is in a later slot than the last call's, the
    /// open slot is closed into one sample per volume and one for the
    /// node. Volumes missing from `volumes` (deleted) lose their history.
    pub fn record(&self, now: SystemTime, volumes: &BTreeMap<String, Totals>) {
        let at_seconds = seconds_since_epoch(now);
        let slot = at_seconds as u64 / RESOLUTION.as_secs();
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner
            .volumes
            .retain(|volume, _| volumes.contains_key(volume));
        let closed = match &inner.baseline {
            // The clock went back, or the slot is still open.
            Some(baseline) if slot <= baseline.slot => {
                if slot < baseline.slot {
                    inner.baseline = None;
                }
                None
            }
            // A slot the ring already has (the clock went back and
            // forward again) is not sampled twice.
            Some(baseline) if inner.node.last_slot() >= Some(baseline.slot) => None,
            Some(baseline) => Some(close_slot(baseline, at_seconds, volumes)),
            None => None,
        };
        if let Some((node, per_volume)) = closed {
            inner.node.push(node);
            for (volume, sample) in per_volume {
                inner.volumes.entry(volume).or_default().push(sample);
            }
        }
        if inner.baseline.as_ref().is_none_or(|b| b.slot != slot) {
            inner.baseline = Some(Baseline {
                slot,
                at_seconds,
                volumes: volumes.clone(),
            });
        }
    }

    /// The node's samples (all its volumes, those deleted since included),
    /// oldest first.
    pub fn node(&self) -> Vec<Sample> {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .node
            .samples()
    }

    /// One volume's samples on this node, oldest first; none if this node
    /// never served it within the span.
    pub fn volume(&self, volume: &str) -> Vec<Sample> {
        let inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner
            .volumes
            .get(volume)
            .map(Ring::samples)
            .unwrap_or_default()
    }
}

/// The samples of the slot that `baseline` opened, ending at `at_seconds`:
/// the node's and each volume's.
fn close_slot(
    baseline: &Baseline,
    at_seconds: f64,
    volumes: &BTreeMap<String, Totals>,
) -> (Sample, Vec<(String, Sample)>) {
    let unix_seconds = baseline.slot * RESOLUTION.as_secs();
    // Sampled every second, a slot spans about RESOLUTION; a stalled
    // sampler spreads what it missed over the longer time.
    let seconds = (at_seconds - baseline.at_seconds).max(f64::EPSILON);
    let mut node = Sample {
        unix_seconds,
        ..Sample::default()
    };
    let per_volume: Vec<(String, Sample)> = volumes
        .iter()
        .map(|(volume, now)| {
            // Counters start at zero: a volume first served in this slot
            // counts from zero.
            let then = baseline.volumes.get(volume).copied().unwrap_or_default();
            let sample = Sample::between(unix_seconds, &then, now, seconds);
            node.add(&sample);
            (volume.clone(), sample)
        })
        .collect();
    (node, per_volume)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(seconds)
    }

    fn totals(write_ops: u64, write_bytes: u64) -> Totals {
        Totals {
            write_ops,
            write_bytes,
            ..Totals::default()
        }
    }

    fn one(volume: &str, counters: Totals) -> BTreeMap<String, Totals> {
        BTreeMap::from([(volume.to_string(), counters)])
    }

    #[test]
    fn a_sample_per_resolution_each_slot_aligned_with_its_rate() {
        let history = History::default();
        let start = 1_700_000_000; // a multiple of 10
                                   // Every second for 100 s: 10 writes of 4 KiB a second.
        for second in 0..=100 {
            let ops = 10 * second;
            history.record(at(start + second), &one("v", totals(ops, ops * 4096)));
        }
        let samples = history.volume("v");
        assert_eq!(samples.len(), 10, "{samples:?}");
        for (index, sample) in samples.iter().enumerate() {
            assert_eq!(sample.unix_seconds, start + 10 * index as u64);
            assert!((sample.write_iops - 10.0).abs() < 1e-3, "{sample:?}");
            assert!((sample.write_bytes_per_sec - 40960.0).abs() < 1e-1);
            assert_eq!(sample.read_iops, 0.0);
        }
        assert_eq!(
            history.node(),
            samples,
            "one volume: the node's is the same"
        );
    }

    #[test]
    fn the_ring_keeps_one_hour_and_forgets_deleted_volumes() {
        let history = History::default();
        let start = 1_700_000_000;
        let slots = SAMPLES_KEPT as u64 + 50;
        for second in (0..=slots * 10).step_by(5) {
            let mut volumes = one("kept", totals(second, 0));
            if second < 600 {
                volumes.insert("gone".to_string(), totals(second, 0));
            }
            history.record(at(start + second), &volumes);
        }
        let kept = history.volume("kept");
        assert_eq!(kept.len(), SAMPLES_KEPT);
        assert_eq!(kept.last().unwrap().unix_seconds, start + (slots - 1) * 10);
        let span = kept.last().unwrap().unix_seconds - kept[0].unix_seconds;
        assert_eq!(span, SPAN.as_secs() - RESOLUTION.as_secs());
        assert!(history.volume("gone").is_empty());
        assert_eq!(history.node().len(), SAMPLES_KEPT);
    }

    #[test]
    fn a_clock_that_goes_back_starts_a_new_slot_and_never_reorders() {
        let history = History::default();
        let start = 1_700_000_000;
        history.record(at(start), &one("v", totals(0, 0)));
        history.record(at(start + 10), &one("v", totals(100, 0)));
        history.record(at(start - 100), &one("v", totals(200, 0)));
        history.record(at(start - 90), &one("v", totals(300, 0)));
        history.record(at(start + 20), &one("v", totals(400, 0)));
        let times: Vec<u64> = history.volume("v").iter().map(|s| s.unix_seconds).collect();
        assert_eq!(times, vec![start], "samples of the past are not inserted");
    }

    #[test]
    fn a_restarted_counter_is_idle_not_negative() {
        let history = History::default();
        let start = 1_700_000_000;
        history.record(at(start), &one("v", totals(1000, 0)));
        history.record(at(start + 10), &one("v", totals(5, 0)));
        assert_eq!(history.volume("v")[0].write_iops, 0.0);
    }
}
