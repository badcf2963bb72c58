//! The span exporter: OTLP/HTTP with protobuf bodies, sent in batches from
//! the OpenTelemetry SDK's own thread with a blocking reqwest client (no
//! async runtime needed, so it works the same before, in and after tokio).
use std::time::Duration;

use anyhow::Context as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig as _};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracer, SdkTracerProvider,
};
use opentelemetry_sdk::Resource;
use tracing_opentelemetry::OpenTelemetryLayer;
use tracing_subscriber::registry::LookupSpan;

use super::OtlpSettings;

/// The longest one export may take (the collector is on the LAN).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest the last export may hold up the process's exit.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// A tracer provider that sends finished spans to `settings.traces_url`
/// every `settings.export_interval`.
pub fn provider(settings: &OtlpSettings) -> anyhow::Result<SdkTracerProvider> {
    let exporter = SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(settings.traces_url.clone())
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .with_context(|| format!("setting up the OTLP exporter to {}", settings.traces_url))?;
    let batches = BatchConfigBuilder::default()
        .with_scheduled_delay(settings.export_interval)
        .build();
    let processor = BatchSpanProcessor::builder(exporter)
        .with_batch_config(batches)
        .build();
    let resource = Resource::builder()
        .with_service_name(settings.service_name.clone())
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    Ok(SdkTracerProvider::builder()
        .with_span_processor(processor)
        .with_resource(resource)
        .build())
}

/// The layer turning `tracing` spans into OpenTelemetry spans of `provider`.
pub fn layer<S>(provider: &SdkTracerProvider) -> OpenTelemetryLayer<S, SdkTracer>
where
    S: tracing::Subscriber + for<'span> LookupSpan<'span>,
{
    tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("hypura"))
        // Source locations and thread names say little about a request.
        .with_location(false)
        .with_threads(false)
}

/// Sends what is left and stops the exporter.
pub fn shut_down(provider: SdkTracerProvider) {
    if let Err(e) = provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT) {
        eprintln!("hypura: sending the last spans failed: {e}");
    }
}
