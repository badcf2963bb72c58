//! Traces and logs of a real `hypura serve` on SmolLM2: spans exported over
//! OTLP/HTTP reach a collector written here (protobuf decoded with
//! opentelemetry-proto) with their GenAI attributes and exact token counts;
//! spans not yet sent are sent when the server stops; `--log-format json`
//! writes JSON lines that carry the request's id.
#[path = "../common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Command;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, StatusCode};
use axum::routing::post;
use axum::Router;
use common::{wait_until, Server, MODEL};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use prost::Message as _;
use serde_json::{json, Value};

/// A span as received, with its resource's attributes.
#[derive(Debug, Clone)]
struct Received {
    service: Value,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    name: String,
    kind: i32,
    attributes: HashMap<String, Value>,
    status_code: i32,
}

impl Received {
    fn attr(&self, key: &str) -> Value {
        self.attributes
            .get(key)
            .cloned()
            .unwrap_or_else(|| panic!("span {:?} has no {key}: {:#?}", self.name, self.attributes))
    }

    fn seconds(&self, key: &str) -> f64 {
        self.attr(key)
            .as_f64()
            .unwrap_or_else(|| panic!("{key} of {:?} is not a number", self.name))
    }
}

/// The spans an OTLP/HTTP collector received.
#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<Received>>>,
}

impl Collector {
    /// A collector on a free loopback port, serving `POST /v1/traces`; its base URL.
    fn start() -> (Collector, String) {
        let collector = Collector::default();
        let (tx, rx) = mpsc::channel();
        let state = collector.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                tx.send(listener.local_addr().unwrap()).unwrap();
                let app = Router::new()
                    .route("/v1/traces", post(receive))
                    .with_state(state);
                axum::serve(listener, app).await.unwrap();
            });
        });
        let addr = rx.recv_timeout(Duration::from_secs(10)).unwrap();
        (collector, format!("http://{addr}"))
    }

    fn spans(&self) -> Vec<Received> {
        self.spans.lock().unwrap().clone()
    }

    /// Waits for a span named `name`.
    fn wait_for(&self, name: &str) -> Received {
        wait_until(Duration::from_secs(30), &format!("a span {name:?}"), || {
            self.find(name).is_some()
        });
        self.find(name).unwrap()
    }

    fn find(&self, name: &str) -> Option<Received> {
        self.spans().into_iter().find(|s| s.name == name)
    }
}

async fn receive(
    State(collector): State<Collector>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, [(header::HeaderName, &'static str); 1], Vec<u8>) {
    assert_eq!(headers[header::CONTENT_TYPE], "application/x-protobuf");
    let request = ExportTraceServiceRequest::decode(body).expect("an OTLP protobuf body");
    let mut spans = collector.spans.lock().unwrap();
    for resource in request.resource_spans {
        let service = resource
            .resource
            .map(|r| json_attributes(&r.attributes))
            .and_then(|a| a.get("service.name").cloned())
            .unwrap_or(Value::Null);
        for scope in resource.scope_spans {
            for span in scope.spans {
                spans.push(Received {
                    service: service.clone(),
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    name: span.name,
                    kind: span.kind,
                    attributes: json_attributes(&span.attributes),
                    status_code: span.status.map_or(0, |s| s.code),
                });
            }
        }
    }
    let answer = ExportTraceServiceResponse::default().encode_to_vec();
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/x-protobuf")],
        answer,
    )
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn json_attributes(attributes: &[KeyValue]) -> HashMap<String, Value> {
    attributes
        .iter()
        .map(|kv| {
            let value = kv.value.as_ref().and_then(|v| v.value.as_ref());
            (kv.key.clone(), value.map_or(Value::Null, json_value))
        })
        .collect()
}

fn json_value(value: &Any) -> Value {
    match value {
        Any::StringValue(s) => json!(s),
        Any::BoolValue(b) => json!(b),
        Any::IntValue(i) => json!(i),
        Any::DoubleValue(d) => json!(d),
        Any::ArrayValue(a) => a
            .values
            .iter()
            .map(|v| v.value.as_ref().map_or(Value::Null, json_value))
            .collect(),
        other => json!(format!("{other:?}")),
    }
}

/// A configuration file exporting to `endpoint` every `interval`.
fn telemetry_config(name: &str, endpoint: &str, interval: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "hypura-telemetry-{}-{name}.toml",
        std::process::id()
    ));
    let text = format!(
        "[telemetry]\notlp_endpoint = \"{endpoint}\"\nservice_name = \"hypura-test\"\n\
         export_interval = \"{interval}\"\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

fn start(extra: &[&str], rust_log: &str) -> Server {
    let mut args = vec![
        "serve".to_string(),
        common::smollm2().to_string_lossy().into_owned(),
        "--port".into(),
        "0".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    Server::start_logging(&args, rust_log)
}

fn send(server: &Server, path: &str, headers: &[(&str, &str)], body: Value) -> (u16, String) {
    let mut request = common::client().post(server.url(path)).json(&body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().expect("POST");
    let status = response.status().as_u16();
    (status, response.text().unwrap())
}

const TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";
const CLIENT_SPAN_ID: &str = "b7ad6b7169203331";

#[test]
fn request_spans_reach_the_collector_with_genai_attributes() {
    let (collector, endpoint) = Collector::start();
    let config = telemetry_config("export", &endpoint, "100ms");
    let server = start(
        &["--config", config.to_str().unwrap()],
        "warn,llama.cpp=error",
    );

    // A chat inside a client's trace (it loads the model).
    let traceparent = format!("00-{TRACE_ID}-{CLIENT_SPAN_ID}-01");
    let (status, body) = send(
        &server,
        "/v1/chat/completions",
        &[
            ("x-request-id", "otlp-chat-1"),
            ("traceparent", &traceparent),
        ],
        json!({"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}],
               "max_tokens": 8, "temperature": 0}),
    );
    assert_eq!(status, 200, "{body}");
    let chat: Value = serde_json::from_str(&body).unwrap();

    // A streamed text completion, its usage in the last chunk.
    let (status, body) = send(
        &server,
        "/v1/completions",
        &[],
        json!({"model": MODEL, "prompt": "Once upon a time", "max_tokens": 5,
               "temperature": 0.7, "top_p": 0.9, "seed": 42, "stream": true,
               "stream_options": {"include_usage": true}}),
    );
    assert_eq!(status, 200, "{body}");
    let completion_usage = common::sse(&body)
        .iter()
        .filter(|d| d.as_str() != "[DONE]")
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .find(|c| !c["usage"].is_null())
        .expect("a usage chunk")["usage"]
        .clone();

    let (status, body) = send(
        &server,
        "/v1/embeddings",
        &[("x-request-id", "otlp-embed-1")],
        json!({"model": MODEL, "input": ["The sky is blue.", "Grass is green."]}),
    );
    assert_eq!(status, 200, "{body}");
    let embeddings: Value = serde_json::from_str(&body).unwrap();

    let (status, _) = send(
        &server,
        "/v1/chat/completions",
        &[],
        json!({"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(status, 404);

    // The chat: its GenAI span, exact usage, timings, parameters.
    let span = collector.wait_for(&format!("chat {MODEL}"));
    assert_eq!(span.service, "hypura-test");
    assert_eq!(span.attr("gen_ai.operation.name"), "chat");
    assert_eq!(span.attr("gen_ai.request.model"), MODEL);
    assert_eq!(span.attr("gen_ai.request.max_tokens"), 8);
    assert_eq!(span.attr("gen_ai.request.temperature"), 0.0);
    assert_eq!(
        span.attr("gen_ai.usage.input_tokens"),
        chat["usage"]["prompt_tokens"].clone()
    );
    assert_eq!(
        span.attr("gen_ai.usage.output_tokens"),
        chat["usage"]["completion_tokens"].clone()
    );
    assert_eq!(
        span.attr("gen_ai.response.finish_reasons"),
        json!([chat["choices"][0]["finish_reason"]])
    );
    assert!(span.seconds("hypura.queue_seconds") >= 0.0);
    assert!(span.seconds("hypura.prefill_seconds") > 0.0);
    assert!(span.seconds("hypura.decode_seconds") > 0.0);
    assert!(
        span.seconds("hypura.load_seconds") > 0.0,
        "the chat loaded the model"
    );
    assert!(span.seconds("hypura.time_to_first_token_seconds") > 0.0);
    assert!(
        !span.attributes.contains_key("otel.name"),
        "otel.* fields steer the exporter, they are no attributes"
    );
    assert_eq!(span.trace_id, TRACE_ID, "the client's trace goes on");
    assert_eq!(span.status_code, 0, "unset: no error");

    // Its parent: the HTTP request's span, a child of the client's span.
    let http = collector.wait_for("POST /v1/chat/completions");
    assert_eq!(span.parent_span_id, http.span_id);
    assert_eq!(http.parent_span_id, CLIENT_SPAN_ID);
    assert_eq!(http.trace_id, TRACE_ID);
    assert_eq!(http.kind, SpanKind::Server as i32);
    assert_eq!(http.attr("request_id"), "otlp-chat-1");
    assert_eq!(http.attr("http.request.method"), "POST");
    assert_eq!(http.attr("url.path"), "/v1/chat/completions");
    assert_eq!(http.attr("http.response.status_code"), 200);

    // The model load it caused, a child of its span.
    let load = collector.wait_for(&format!("load {MODEL}"));
    assert_eq!(load.parent_span_id, span.span_id);
    assert_eq!(load.trace_id, TRACE_ID);
    assert_eq!(load.attr("hypura.model"), MODEL);
    assert_eq!(load.attr("hypura.residency"), "no budget");
    assert_eq!(load.attr("hypura.mode"), "full-resident");
    assert!(load.attr("hypura.ram_bytes").as_i64().unwrap() > 0);

    let span = collector.wait_for(&format!("text_completion {MODEL}"));
    assert_eq!(span.attr("gen_ai.operation.name"), "text_completion");
    assert_eq!(span.attr("gen_ai.request.max_tokens"), 5);
    assert_eq!(span.attr("gen_ai.request.temperature"), 0.7);
    assert_eq!(span.attr("gen_ai.request.top_p"), 0.9);
    assert_eq!(span.attr("gen_ai.request.seed"), 42);
    assert_eq!(
        span.attr("gen_ai.usage.input_tokens"),
        completion_usage["prompt_tokens"].clone()
    );
    assert_eq!(
        span.attr("gen_ai.usage.output_tokens"),
        completion_usage["completion_tokens"].clone()
    );

    let span = collector.wait_for(&format!("embeddings {MODEL}"));
    assert_eq!(span.attr("gen_ai.operation.name"), "embeddings");
    assert_eq!(span.attr("gen_ai.request.model"), MODEL);
    assert_eq!(
        span.attr("gen_ai.usage.input_tokens"),
        embeddings["usage"]["prompt_tokens"].clone()
    );
    assert_eq!(
        span.attr("gen_ai.embeddings.dimension.count").as_u64(),
        Some(embeddings["data"][0]["embedding"].as_array().unwrap().len() as u64)
    );
    assert_eq!(span.attr("hypura.inputs"), 2);
    let http = collector.wait_for("POST /v1/embeddings");
    assert_eq!(span.parent_span_id, http.span_id);
    assert_eq!(http.attr("request_id"), "otlp-embed-1");

    // A request that failed: its error, no usage.
    let span = collector.wait_for("chat no-such-model");
    assert_eq!(span.attr("error.type"), "404");
    assert_eq!(
        span.status_code, 0,
        "a client's error leaves the status unset"
    );
    assert!(!span.attributes.contains_key("gen_ai.usage.input_tokens"));
    assert_eq!(
        collector
            .spans()
            .iter()
            .filter(|s| s.name.starts_with("chat "))
            .count(),
        2,
        "one span per request"
    );
    drop(server);
    let _ = std::fs::remove_file(config);
}

#[test]
fn spans_not_yet_sent_are_sent_at_shutdown_and_text_logs_name_the_request() {
    let (collector, endpoint) = Collector::start();
    // No batch is due for an hour: only the shutdown sends these spans.
    let config = telemetry_config("shutdown", &endpoint, "1h");
    let mut server = start(
        &["--config", config.to_str().unwrap()],
        "info,llama.cpp=error",
    );
    let (status, body) = send(
        &server,
        "/v1/chat/completions",
        &[("x-request-id", "flush-1")],
        json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
               "max_tokens": 3, "temperature": 0}),
    );
    assert_eq!(status, 200, "{body}");
    let chat: Value = serde_json::from_str(&body).unwrap();
    wait_until(Duration::from_secs(10), "the request is logged", || {
        server.log().contains("request answered")
    });
    assert!(
        collector.spans().is_empty(),
        "nothing is sent before its time"
    );

    let kill = Command::new("kill")
        .args(["-TERM", &server.pid().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    assert!(server.wait(Duration::from_secs(30)).success());
    let span = collector
        .find(&format!("chat {MODEL}"))
        .expect("the chat's span was sent before the process exited");
    assert_eq!(
        span.attr("gen_ai.usage.output_tokens"),
        chat["usage"]["completion_tokens"].clone()
    );
    assert!(collector.find(&format!("load {MODEL}")).is_some());

    // Text logs: the request's lines carry its id, the exporter's fields stay out.
    let log = server.log();
    let ended = log
        .lines()
        .find(|l| l.contains("generation ended"))
        .unwrap_or_else(|| panic!("no generation line:\n{log}"));
    assert!(ended.contains("request_id=\"flush-1\""), "{ended}");
    assert!(ended.contains("gen_ai.request.model="), "{ended}");
    assert!(!log.contains("otel."), "{log}");
    let _ = std::fs::remove_file(config);
}

/// The JSON objects of a server's log, but for its own `hypura: ` lines
/// (start-up and shutdown, for people); each has the formatter's keys.
fn json_lines(log: &str) -> Vec<Value> {
    let mut lines = Vec::new();
    for line in log.lines() {
        if line.starts_with("hypura: ") {
            continue;
        }
        let value: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}"));
        for key in ["timestamp", "level", "target", "message"] {
            assert!(value.get(key).is_some(), "no {key}: {line}");
        }
        lines.push(value);
    }
    lines
}

/// The `request_id` of the request a JSON log line was written in.
fn request_id(line: &Value) -> Option<Value> {
    line["spans"]
        .as_array()
        .and_then(|spans| spans.iter().find(|s| s["name"] == "request"))
        .map(|s| s["request_id"].clone())
}

#[test]
fn json_log_lines_parse_and_carry_the_request_id() {
    let server = start(&["--log-format", "json"], "info,llama.cpp=error");
    let (status, body) = send(
        &server,
        "/api/chat",
        &[("x-request-id", "json-chat-1")],
        json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
               "stream": false, "options": {"num_predict": 4, "temperature": 0}}),
    );
    assert_eq!(status, 200, "{body}");
    let chat: Value = serde_json::from_str(&body).unwrap();
    let (status, _) = send(
        &server,
        "/api/embed",
        &[("x-request-id", "json-embed-1")],
        json!({"model": MODEL, "input": "hello"}),
    );
    assert_eq!(status, 200);
    let answered = |lines: &[Value], id: &str| {
        lines
            .iter()
            .any(|l| request_id(l).is_some_and(|r| r == id) && l["message"] == "request answered")
    };
    wait_until(Duration::from_secs(10), "both requests are logged", || {
        let lines = json_lines(&server.log());
        answered(&lines, "json-chat-1") && answered(&lines, "json-embed-1")
    });
    let log = server.log();
    let lines = json_lines(&log);
    let of = |id: &str| -> Vec<&Value> {
        lines
            .iter()
            .filter(|l| request_id(l).is_some_and(|r| r == id))
            .collect()
    };
    let chat_lines = of("json-chat-1");
    let messages: Vec<&str> = chat_lines
        .iter()
        .map(|l| l["message"].as_str().unwrap())
        .collect();
    assert!(
        messages.iter().any(|m| m.starts_with("loading ")),
        "the model load, caused by the chat, is logged in it: {messages:?}"
    );
    let ended = chat_lines
        .iter()
        .find(|l| l["message"] == "generation ended")
        .expect("the generation's line");
    assert_eq!(ended["target"], "hypura::generation");
    assert_eq!(ended["generated_tokens"], chat["eval_count"]);
    assert_eq!(ended["spans"][1]["gen_ai.operation.name"], "chat");
    let answered = chat_lines
        .iter()
        .find(|l| l["message"] == "request answered")
        .expect("the access line");
    assert_eq!(answered["status"], 200);
    assert_eq!(answered["spans"][0]["path"], "/api/chat");
    let embed_lines = of("json-embed-1");
    assert!(
        embed_lines
            .iter()
            .any(|l| l["message"] == "request answered" && l["spans"][0]["path"] == "/api/embed"),
        "{embed_lines:?}"
    );
    // Every line written inside a generation names its request.
    for line in &lines {
        if line["target"] == "hypura::generation" {
            assert!(request_id(line).is_some(), "{line}");
        }
    }
}
