//! Logs and traces: the `tracing` subscriber of the `hypura` binary, the
//! spans the gateway opens, and their optional export over OTLP/HTTP.
//!
//! Spans, outermost first:
//! - [`http`]: one per HTTP request (`POST /v1/chat/completions`), carrying
//!   its `request_id` (the `x-request-id` header), so every log line written
//!   while a request is served names it; a client's W3C `traceparent` makes
//!   it part of the client's trace.
//! - [`genai`]: one per generation or embedding, named `{operation} {model}`
//!   (`chat smollm2:135m`), with the OpenTelemetry GenAI attributes
//!   (`gen_ai.operation.name`, `gen_ai.request.model`,
//!   `gen_ai.usage.input_tokens`, ...) and the time spent loading, queued,
//!   in prefill and in decode.
//! - [`pool`]: model loads and the budget's moves (promotions, demotions,
//!   placement switches, unloads), children of the request that caused them.
//!
//! [`observer::Recorder`] is how the inference path feeds these spans and
//! the metrics.
//!
//! Logs go to stderr as text or, with `--log-format json`, one JSON object a
//! line; `RUST_LOG` filters them. Spans are exported only when an OTLP
//! endpoint is configured, whatever `RUST_LOG` says (the exporter has its
//! own filter: `hypura`'s spans at `info`), and the last ones are flushed
//! when the server stops ([`Telemetry`]'s drop).
pub mod genai;
pub mod http;
mod logs;
pub mod observer;
mod otlp;
pub mod pool;

use std::io::IsTerminal as _;
use std::time::Duration;

use anyhow::Context as _;
use serde::Deserialize;
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::Layer as _;

use crate::config::Text;
use crate::core::validation::KeepAlive;

/// What `RUST_LOG` is when unset.
pub const DEFAULT_LOG_FILTER: &str = "warn,llama.cpp=error";
pub const DEFAULT_SERVICE_NAME: &str = "hypura";
/// How often finished spans are sent (the OpenTelemetry SDK's default).
pub const DEFAULT_EXPORT_INTERVAL: Duration = Duration::from_secs(5);

/// How log lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// For people: `LEVEL spans: target: message fields`.
    #[default]
    Text,
    /// For log shippers: one JSON object a line, the event's fields at the
    /// top level and its spans (with their fields) in `spans`.
    Json,
}

/// Where and how spans are exported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpSettings {
    /// The collector's OTLP/HTTP traces URL (`http://host:4318/v1/traces`).
    pub traces_url: String,
    /// `service.name` of every span.
    pub service_name: String,
    /// How long finished spans wait before they are sent in one batch.
    pub export_interval: Duration,
}

/// The `[telemetry]` section of the configuration file, as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetrySection {
    pub log_format: Option<LogFormat>,
    pub otlp_endpoint: Option<String>,
    pub service_name: Option<String>,
    pub export_interval: Option<Text>,
}

/// `[telemetry]`, checked; `None` where the file does not set a key.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct TelemetryConfig {
    pub log_format: Option<LogFormat>,
    /// A checked OTLP/HTTP endpoint ([`traces_url`]).
    pub otlp_endpoint: Option<String>,
    pub service_name: Option<String>,
    pub export_interval: Option<Duration>,
}

impl TelemetrySection {
    /// Checks the section; errors name the key (`telemetry.otlp_endpoint`).
    pub fn check(self) -> Result<TelemetryConfig, String> {
        let otlp_endpoint = self
            .otlp_endpoint
            .map(|url| {
                traces_url(&url).map_err(|e| format!("telemetry.otlp_endpoint: {e}"))?;
                Ok::<_, String>(url)
            })
            .transpose()?;
        let service_name = self
            .service_name
            .map(|name| match name.trim() {
                "" => Err("telemetry.service_name: give a name (it is every span's \
                           `service.name`)"
                    .to_string()),
                _ => Ok(name),
            })
            .transpose()?;
        let export_interval = self
            .export_interval
            .map(|t| interval(&t.0).map_err(|e| format!("telemetry.export_interval: {e}")))
            .transpose()?;
        Ok(TelemetryConfig {
            log_format: self.log_format,
            otlp_endpoint,
            service_name,
            export_interval,
        })
    }
}

/// A positive duration (`"200ms"`, `"5s"`, `2`).
fn interval(text: &str) -> Result<Duration, String> {
    match KeepAlive::from_flag(text)? {
        KeepAlive::For(d) if !d.is_zero() => Ok(d),
        _ => Err(format!(
            "{text:?} is not a positive duration (write \"200ms\", \"5s\" or a number of seconds)"
        )),
    }
}

/// The traces URL of an OTLP/HTTP endpoint: `http[s]://host:port` (the
/// base, as in `OTEL_EXPORTER_OTLP_ENDPOINT`) gets `/v1/traces` appended; a
/// URL with a path is taken as the traces URL itself.
pub fn traces_url(endpoint: &str) -> Result<String, String> {
    let endpoint = endpoint.trim();
    let rest = endpoint
        .strip_prefix("http://")
        .or_else(|| endpoint.strip_prefix("https://"))
        .ok_or_else(|| {
            format!("{endpoint:?} is not an http:// or https:// URL (OTLP over HTTP, port 4318)")
        })?;
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    if authority.is_empty() || authority.contains(char::is_whitespace) {
        return Err(format!("{endpoint:?} names no host"));
    }
    endpoint
        .parse::<axum::http::Uri>()
        .map_err(|e| format!("{endpoint:?} is not a URL: {e}"))?;
    Ok(if path.trim_end_matches('/').is_empty() {
        format!("{}/v1/traces", endpoint.trim_end_matches('/'))
    } else {
        endpoint.to_string()
    })
}

/// What `hypura serve` asks of the subscriber.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TelemetrySettings {
    pub log_format: LogFormat,
    /// `None`: no export.
    pub otlp: Option<OtlpSettings>,
}

impl TelemetrySettings {
    /// The flags over the file, over the defaults.
    pub fn resolve(
        file: &TelemetryConfig,
        log_format: Option<LogFormat>,
        otlp_endpoint: Option<&str>,
    ) -> Result<TelemetrySettings, String> {
        let otlp = match otlp_endpoint.or(file.otlp_endpoint.as_deref()) {
            Some(endpoint) => Some(OtlpSettings {
                traces_url: traces_url(endpoint)?,
                service_name: file
                    .service_name
                    .clone()
                    .unwrap_or_else(|| DEFAULT_SERVICE_NAME.to_string()),
                export_interval: file.export_interval.unwrap_or(DEFAULT_EXPORT_INTERVAL),
            }),
            None => None,
        };
        Ok(TelemetrySettings {
            log_format: log_format.or(file.log_format).unwrap_or_default(),
            otlp,
        })
    }
}

/// The installed subscriber's exporter: dropping it sends the spans not yet
/// sent and stops the exporter. Drop it outside the async runtime (the
/// exporter's HTTP client blocks).
#[must_use = "dropping it stops the span export"]
pub struct Telemetry {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            otlp::shut_down(provider);
        }
    }
}

/// Installs the process's subscriber: log lines on stderr in `format`,
/// filtered by `RUST_LOG` (default [`DEFAULT_LOG_FILTER`]), and with
/// `settings.otlp` the span exporter.
pub fn init(settings: &TelemetrySettings) -> anyhow::Result<Telemetry> {
    let _ = LOG_FORMAT.set(settings.log_format);
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_LOG_FILTER));
    let logs = match settings.log_format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            // Colours for a terminal, none for journald or a file.
            .with_ansi(std::io::stderr().is_terminal())
            .fmt_fields(logs::TextFields)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(true)
            .with_writer(std::io::stderr)
            .boxed(),
    };
    let (provider, export) = match &settings.otlp {
        Some(otlp) => {
            let provider = otlp::provider(otlp)?;
            let layer = otlp::layer(&provider)
                // Only our spans: the exporter's own HTTP client must not
                // feed spans back into the exporter.
                .with_filter(Targets::new().with_target("hypura", tracing::Level::INFO));
            (Some(provider), Some(layer))
        }
        None => (None, None),
    };
    tracing_subscriber::registry()
        .with(logs.with_filter(filter))
        .with(export)
        .try_init()
        .context("installing the log subscriber")?;
    if let Some(otlp) = &settings.otlp {
        tracing::info!(
            "exporting spans to {} every {} ms as {}",
            otlp.traces_url,
            otlp.export_interval.as_millis(),
            otlp.service_name
        );
    }
    Ok(Telemetry { provider })
}

/// Text logs and no export: every subcommand but `serve`.
/// The format [`init`] installed (text before it ran): what runner
/// processes write their log lines in.
pub fn log_format() -> LogFormat {
    LOG_FORMAT.get().copied().unwrap_or_default()
}

static LOG_FORMAT: std::sync::OnceLock<LogFormat> = std::sync::OnceLock::new();

pub fn init_text_logs() {
    // Only fails if a subscriber is installed already, which is then kept.
    let _ = init(&TelemetrySettings::default());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_become_traces_urls() {
        assert_eq!(
            traces_url("http://127.0.0.1:4318").unwrap(),
            "http://127.0.0.1:4318/v1/traces"
        );
        assert_eq!(
            traces_url("https://otel.lan:4318/").unwrap(),
            "https://otel.lan:4318/v1/traces"
        );
        assert_eq!(
            traces_url("http://otel.lan/custom/traces").unwrap(),
            "http://otel.lan/custom/traces"
        );
        assert_eq!(
            traces_url("otel.lan:4317").unwrap_err(),
            "\"otel.lan:4317\" is not an http:// or https:// URL (OTLP over HTTP, port 4318)"
        );
        assert_eq!(
            traces_url("http:///v1/traces").unwrap_err(),
            "\"http:///v1/traces\" names no host"
        );
    }

    #[test]
    fn the_section_is_checked_and_flags_win() {
        let section = TelemetrySection {
            log_format: Some(LogFormat::Json),
            otlp_endpoint: Some("http://collector:4318".into()),
            service_name: Some("box-1".into()),
            export_interval: Some(Text("250ms".into())),
        };
        let file = section.check().unwrap();
        assert_eq!(file.export_interval, Some(Duration::from_millis(250)));
        let settings = TelemetrySettings::resolve(&file, None, None).unwrap();
        assert_eq!(settings.log_format, LogFormat::Json);
        assert_eq!(
            settings.otlp,
            Some(OtlpSettings {
                traces_url: "http://collector:4318/v1/traces".into(),
                service_name: "box-1".into(),
                export_interval: Duration::from_millis(250),
            })
        );
        let flags =
            TelemetrySettings::resolve(&file, Some(LogFormat::Text), Some("http://other:1/x"))
                .unwrap();
        assert_eq!(flags.log_format, LogFormat::Text);
        assert_eq!(flags.otlp.unwrap().traces_url, "http://other:1/x");

        let off = TelemetrySettings::resolve(&TelemetryConfig::default(), None, None).unwrap();
        assert_eq!(off, TelemetrySettings::default());

        let bad = TelemetrySection {
            export_interval: Some(Text("0".into())),
            ..Default::default()
        };
        assert_eq!(
            bad.check().unwrap_err(),
            "telemetry.export_interval: \"0\" is not a positive duration (write \"200ms\", \
             \"5s\" or a number of seconds)"
        );
        let bad = TelemetrySection {
            otlp_endpoint: Some("localhost:4318".into()),
            ..Default::default()
        };
        assert!(bad
            .check()
            .unwrap_err()
            .starts_with("telemetry.otlp_endpoint: \"localhost:4318\" is not an http://"));
    }
}
