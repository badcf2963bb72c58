//! Metrics of the upstreams ([`crate::pool::upstream`]), one series per upstream
//! (label `upstream`, its configured name):
//! `hypura_upstream_requests_total` (requests sent, retries included),
//! `hypura_upstream_errors_total` (connection failures, 5xx, timeouts,
//! replies broken off), `hypura_upstream_first_byte_seconds` (from sending
//! to the first byte of a reply that came) and `hypura_upstream_up` (1 while
//! its health probe answers and it is not cooling down after a failure).
use std::sync::OnceLock;
use std::time::Duration;

use prometheus::{HistogramVec, IntCounterVec, IntGaugeVec};

use super::{counter, gauge, histogram, metrics, TTFT_BUCKETS};

struct UpstreamMetrics {
    requests: IntCounterVec,
    errors: IntCounterVec,
    first_byte: HistogramVec,
    up: IntGaugeVec,
}

fn upstream_metrics() -> &'static UpstreamMetrics {
    static METRICS: OnceLock<UpstreamMetrics> = OnceLock::new();
    METRICS.get_or_init(|| {
        let r = &metrics().registry;
        let label = &["upstream"];
        UpstreamMetrics {
            requests: counter(
                r,
                "hypura_upstream_requests_total",
                "Requests sent to each upstream server, retries included.",
                label,
            ),
            errors: counter(
                r,
                "hypura_upstream_errors_total",
                "Requests to each upstream that failed: no connection, a 5xx, a timeout, a reply broken off.",
                label,
            ),
            first_byte: histogram(
                r,
                "hypura_upstream_first_byte_seconds",
                "From sending a request to an upstream to the first byte of its reply, in seconds.",
                TTFT_BUCKETS,
                label,
            ),
            up: gauge(
                r,
                "hypura_upstream_up",
                "1 while the upstream answers its health probe and is not in cooldown after a failure.",
                label,
            ),
        }
    })
}

pub fn request(upstream: &str) {
    upstream_metrics()
        .requests
        .with_label_values(&[upstream])
        .inc();
    // Present from the first request, even at zero.
    upstream_metrics().errors.with_label_values(&[upstream]);
}

pub fn error(upstream: &str) {
    upstream_metrics()
        .errors
        .with_label_values(&[upstream])
        .inc();
}

pub fn first_byte(upstream: &str, took: Duration) {
    upstream_metrics()
        .first_byte
        .with_label_values(&[upstream])
        .observe(took.as_secs_f64());
}

pub fn set_up(upstream: &str, up: bool) {
    upstream_metrics()
        .up
        .with_label_values(&[upstream])
        .set(i64::from(up));
}
