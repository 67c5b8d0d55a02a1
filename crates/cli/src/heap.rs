//! The allocator's own figures as metrics, on every component's `/metrics`:
//! `tensile_allocator_allocated_bytes` (what the process's live objects hold) and
//! `tensile_allocator_resident_bytes` (the pages the allocator keeps resident for them, its
//! own metadata and what it freed but has not given back yet). RSS alone cannot tell a
//! component that holds its state from one whose allocator keeps what a burst freed; these
//! two can (docs/operations.md, "Metrics and what to watch"). Read from jemalloc at each scrape; a build without
//! the `jemalloc` feature has neither.

use prometheus_client::registry::Registry;

/// Adds the allocator's figures to `registry` (nothing without jemalloc).
#[cfg(feature = "jemalloc")]
pub fn register(registry: &mut Registry) {
    registry.register_collector(Box::new(imp::Allocator));
}

/// Adds the allocator's figures to `registry` (nothing without jemalloc).
#[cfg(not(feature = "jemalloc"))]
pub fn register(_registry: &mut Registry) {}

#[cfg(feature = "jemalloc")]
mod imp {
    use prometheus_client::collector::Collector;
    use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric as _};
    use prometheus_client::metrics::MetricType;
    use prometheus_client::metrics::gauge::ConstGauge;
    use tikv_jemalloc_ctl::{epoch, stats};

    #[derive(Debug)]
    pub(super) struct Allocator;

    /// A gauge: its name, its help, and how jemalloc reads it.
    type Figure = (
        &'static str,
        &'static str,
        fn() -> tikv_jemalloc_ctl::Result<usize>,
    );

    impl Collector for Allocator {
        fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
            // jemalloc caches its statistics until the epoch moves on. If it cannot be read, a
            // scrape without these series says more than a stale or made-up figure.
            if epoch::advance().is_err() {
                return Ok(());
            }
            let figures: [Figure; 2] = [
                (
                    "tensile_allocator_allocated_bytes",
                    "Bytes the process's live allocations hold (jemalloc stats.allocated)",
                    stats::allocated::read,
                ),
                (
                    "tensile_allocator_resident_bytes",
                    "Bytes of pages the allocator keeps resident: live allocations, its metadata, and freed pages not yet given back (jemalloc stats.resident)",
                    stats::resident::read,
                ),
            ];
            for (name, help, read) in figures {
                let Ok(value) = read() else { continue };
                let gauge = ConstGauge::new(i64::try_from(value).unwrap_or(i64::MAX));
                gauge.encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)?;
            }
            Ok(())
        }
    }
}

#[cfg(all(test, feature = "jemalloc"))]
#[allow(clippy::unwrap_used, clippy::panic)] // test code
mod tests {
    use super::*;

    fn gauge(text: &str, name: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing from:\n{text}"))
    }

    fn scrape(registry: &Registry) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, registry).unwrap();
        out
    }

    /// The figures are the allocator's and follow what the process holds: 64 MiB held shows
    /// in both (the test binary's allocator is jemalloc, as the product's), and goes once freed.
    #[test]
    fn the_live_heap_and_resident_pages_follow_what_the_process_holds() {
        let mut registry = Registry::default();
        register(&mut registry);
        let before = scrape(&registry);
        let held = std::hint::black_box(vec![1_u8; 64 << 20]);
        let during = scrape(&registry);
        let allocated = |t: &str| gauge(t, "tensile_allocator_allocated_bytes");
        let resident = |t: &str| gauge(t, "tensile_allocator_resident_bytes");
        assert!(allocated(&during) - allocated(&before) >= f64::from(48 << 20));
        assert!(resident(&during) >= allocated(&during));
        assert!(during.contains("# TYPE tensile_allocator_resident_bytes gauge"));
        drop(held);
        let after = scrape(&registry);
        assert!(allocated(&during) - allocated(&after) >= f64::from(48 << 20));
    }
}
