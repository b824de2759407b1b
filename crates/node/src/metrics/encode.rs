//! Writing metric families with prometheus-client's encoder: one family per
//! call, its samples given as (labels, value) pairs gathered at scrape time.

use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;

pub type Labels = Vec<(&'static str, String)>;
pub type Result = std::result::Result<(), std::fmt::Error>;

/// A gauge family (`name` carries its unit suffix, e.g. `_bytes`).
pub fn gauges(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: &[(Labels, f64)],
) -> Result {
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in samples {
        // No labels: `name value`, not `name{} value`.
        if labels.is_empty() {
            metric.encode_gauge(value)?;
        } else {
            metric.encode_family(labels)?.encode_gauge(value)?;
        }
    }
    Ok(())
}

/// A counter family; the encoder appends `_total` to `name`.
pub fn counters(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: &[(Labels, f64)],
) -> Result {
    debug_assert!(!name.ends_with("_total"), "the encoder adds _total");
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, value) in samples {
        if labels.is_empty() {
            metric.encode_counter::<NoLabelSet, _, f64>(value, None)?;
        } else {
            metric
                .encode_family(labels)?
                .encode_counter::<NoLabelSet, _, f64>(value, None)?;
        }
    }
    Ok(())
}

/// One histogram's data: counts per bucket, not cumulative (the encoder
/// sums them), by upper bound; the last bound is `f64::MAX`, written `+Inf`.
pub struct HistogramSample {
    pub labels: Labels,
    pub sum: f64,
    pub buckets: Vec<(f64, u64)>,
}

impl HistogramSample {
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|(_, count)| count).sum()
    }
}

pub fn histograms(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: &[HistogramSample],
) -> Result {
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for sample in samples {
        debug_assert_eq!(
            sample.buckets.last().map(|(bound, _)| *bound),
            Some(f64::MAX)
        );
        metric
            .encode_family(&sample.labels)?
            .encode_histogram::<NoLabelSet>(sample.sum, sample.count(), &sample.buckets, None)?;
    }
    Ok(())
}
