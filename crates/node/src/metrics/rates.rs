//! I/O rates over the last ~10 s, per volume served here: the `io:` line of
//! `trireme status` and `GET /api/v1/io`. A task samples the edge counters
//! every second into a short ring; a rate is the difference between the
//! newest sample and the oldest one still inside the window.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often the counters are sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// The span rates are computed over.
pub const WINDOW: Duration = Duration::from_secs(10);
/// Samples kept: the window and a little slack; older ones are dropped.
const SAMPLES_KEPT: usize = 12;

const _: () = assert!(SAMPLES_KEPT as u64 * SAMPLE_EVERY.as_secs() > WINDOW.as_secs());

/// A volume's counters at one sample. Writes count WRITE, WRITE_ZEROES and
/// TRIM requests (all change data); bytes count payloads only.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub read_ops: u64,
    pub write_ops: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
}

/// A volume's rates, per second.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rate {
    pub read_iops: f64,
    pub write_iops: f64,
    pub read_bytes_per_sec: f64,
    pub write_bytes_per_sec: f64,
}

impl Rate {
    /// What sorts the busiest volumes first: operations, then bytes.
    pub fn busyness(&self) -> (f64, f64) {
        (
            self.read_iops + self.write_iops,
            self.read_bytes_per_sec + self.write_bytes_per_sec,
        )
    }
}

struct Sample {
    at: Instant,
    volumes: BTreeMap<String, Totals>,
}

#[derive(Default)]
pub struct Rates {
    samples: Mutex<VecDeque<Sample>>,
}

impl Rates {
    pub fn record(&self, at: Instant, volumes: BTreeMap<String, Totals>) {
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        samples.push_back(Sample { at, volumes });
        while samples.len() > SAMPLES_KEPT {
            samples.pop_front();
        }
    }

    /// Rates per volume over the window, volume names in order. With one
    /// sample only (a node up for less than a second) every rate is 0.
    pub fn current(&self) -> BTreeMap<String, Rate> {
        let samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let Some(newest) = samples.back() else {
            return BTreeMap::new();
        };
        let oldest = samples
            .iter()
            .find(|sample| newest.at.duration_since(sample.at) <= WINDOW)
            .unwrap_or(newest);
        let seconds = newest.at.duration_since(oldest.at).as_secs_f64();
        newest
            .volumes
            .iter()
            .map(|(volume, now)| {
                // Counters start at zero: a volume first served inside
                // the window counts from zero.
                let then = oldest.volumes.get(volume).copied().unwrap_or_default();
                let per_second = |now: u64, then: u64| {
                    if seconds > 0.0 {
                        // A counter that restarted (volume recreated) is
                        // not a negative rate.
                        now.saturating_sub(then) as f64 / seconds
                    } else {
                        0.0
                    }
                };
                let rate = Rate {
                    read_iops: per_second(now.read_ops, then.read_ops),
                    write_iops: per_second(now.write_ops, then.write_ops),
                    read_bytes_per_sec: per_second(now.read_bytes, then.read_bytes),
                    write_bytes_per_sec: per_second(now.write_bytes, then.write_bytes),
                };
                (volume.clone(), rate)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn totals(read_ops: u64, write_bytes: u64) -> BTreeMap<String, Totals> {
        let totals = Totals {
            read_ops,
            write_bytes,
            ..Totals::default()
        };
        BTreeMap::from([("v".to_string(), totals)])
    }

    #[test]
    fn rates_span_at_most_the_window() {
        let rates = Rates::default();
        let start = Instant::now();
        assert!(rates.current().is_empty());
        rates.record(start, totals(0, 0));
        assert_eq!(rates.current()["v"], Rate::default());
        // 20 samples a second apart, 100 reads and 1 MiB written each: the
        // rate is the same whatever the history, and old samples go.
        for second in 1..=20u64 {
            rates.record(
                start + Duration::from_secs(second),
                totals(100 * second, second << 20),
            );
        }
        let rate = &rates.current()["v"];
        assert!((rate.read_iops - 100.0).abs() < 1e-9, "{rate:?}");
        assert!((rate.write_bytes_per_sec - (1 << 20) as f64).abs() < 1e-6);
        assert_eq!(rates.samples.lock().unwrap().len(), SAMPLES_KEPT);
        // A volume first served inside the window counts from zero.
        let mut with_new = totals(100 * 21, 21 << 20);
        with_new.insert(
            "new".to_string(),
            Totals {
                write_ops: 50,
                ..Totals::default()
            },
        );
        rates.record(start + Duration::from_secs(21), with_new);
        assert!((rates.current()["new"].write_iops - 5.0).abs() < 1e-9);
        // A restarted counter reads as idle, not negative.
        rates.record(start + Duration::from_secs(22), totals(0, 0));
        assert_eq!(rates.current()["v"].read_iops, 0.0);
    }
}
