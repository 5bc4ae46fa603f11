//! `gateway_store_write_batch_seconds`: the store writer's batches by how long each took,
//! as a histogram read at each scrape from the totals the writer keeps (the store does
//! not know the metrics). Its sum is `gateway_store_write_seconds_total`'s time and its
//! count the batches its buckets hold.

use prometheus::core::{Collector, Desc};
use prometheus::proto::{Bucket, Histogram, Metric, MetricFamily, MetricType};

const NAME: &str = "gateway_store_write_batch_seconds";
const HELP: &str = "How long each of the store writer's batches took: one transaction and its commit, \
    SQLite's checkpoints and the disk's syncs included (a slow batch holds every send queued behind it).";

/// The histogram, made from `store::write_batch_durations` when gathered.
pub struct WriteBatches {
    desc: Desc,
}

impl WriteBatches {
    pub fn new() -> WriteBatches {
        let desc = Desc::new(NAME.into(), HELP.into(), Vec::new(), Default::default()).expect("a valid description");
        WriteBatches { desc }
    }
}

impl Collector for WriteBatches {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.desc]
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let counts = crate::store::write_batch_durations();
        let (_, _, busy_us) = crate::store::write_stats();
        vec![family(&counts, busy_us)]
    }
}

/// The family of bucket counts `counts` (each alone; the last past every bound) and a
/// sum of `busy_us` microseconds.
fn family(counts: &[u64], busy_us: u64) -> MetricFamily {
    let mut cumulative = 0;
    let buckets = crate::store::WRITE_BATCH_BOUNDS_US
        .iter()
        .zip(counts)
        .map(|(bound, count)| {
            cumulative += count;
            let mut bucket = Bucket::default();
            bucket.set_upper_bound(*bound as f64 / 1e6);
            bucket.set_cumulative_count(cumulative);
            bucket
        })
        .collect();
    let mut histogram = Histogram::default();
    histogram.set_bucket(buckets);
    // The count is what the buckets hold, the one past every bound included, so that
    // `+Inf` and `_count` agree even when a batch ends during the scrape.
    histogram.set_sample_count(counts.iter().sum());
    histogram.set_sample_sum(busy_us as f64 / 1e6);
    let mut metric = Metric::default();
    metric.set_histogram(histogram);
    let mut family = MetricFamily::default();
    family.set_name(NAME.into());
    family.set_help(HELP.into());
    family.set_field_type(MetricType::HISTOGRAM);
    family.set_metric(vec![metric]);
    family
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::{Encoder, TextEncoder};

    #[test]
    fn the_buckets_are_cumulative_and_the_count_holds_the_batches_past_every_bound() {
        let mut counts = [0u64; crate::store::WRITE_BATCH_BOUNDS_US.len() + 1];
        counts[0] = 5; // ≤ 100 µs
        counts[5] = 2; // ≤ 5 ms
        counts[crate::store::WRITE_BATCH_BOUNDS_US.len()] = 1; // over 1 s
        let mut text = Vec::new();
        TextEncoder::new().encode(&[family(&counts, 1_500_000)], &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        for line in [
            "# TYPE gateway_store_write_batch_seconds histogram",
            "gateway_store_write_batch_seconds_bucket{le=\"0.0001\"} 5",
            "gateway_store_write_batch_seconds_bucket{le=\"0.0025\"} 5",
            "gateway_store_write_batch_seconds_bucket{le=\"0.005\"} 7",
            "gateway_store_write_batch_seconds_bucket{le=\"1\"} 7",
            "gateway_store_write_batch_seconds_bucket{le=\"+Inf\"} 8",
            "gateway_store_write_batch_seconds_sum 1.5",
            "gateway_store_write_batch_seconds_count 8",
        ] {
            assert!(text.contains(line), "{line} is not in:\n{text}");
        }
    }
}
