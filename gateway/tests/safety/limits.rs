//! No request can take the server's memory or a thread: grammars bounded,
//! options in range, embeddings capped and cancelled, prompts measured
//! before they are tokenized, connections that never finish their headers
//! closed. A real `hypura serve` over SmolLM2.
#[path = "../common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{client, Server, MODEL};
use serde_json::{json, Value};

/// The server's resident memory in KiB (`VmRSS` of /proc/PID/status).
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// The body of a schema on each route that takes one.
fn with_schema(route: &str, schema: &Value) -> Value {
    match route {
        "/api/generate" => json!({"model": MODEL, "prompt": "Say hi", "stream": false,
            "format": schema, "options": {"num_predict": 4}}),
        "/api/chat" => json!({"model": MODEL, "stream": false, "format": schema,
            "messages": [{"role": "user", "content": "Say hi"}], "options": {"num_predict": 4}}),
        _ => json!({"model": MODEL, "max_tokens": 4,
            "messages": [{"role": "user", "content": "Say hi"}],
            "response_format": {"type": "json_schema",
                "json_schema": {"name": "x", "schema": schema}}}),
    }
}

fn error_message(body: &Value) -> String {
    body["error"]
        .as_str()
        .or_else(|| body["error"]["message"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// Every schema that made llama.cpp's grammar parser allocate without end
/// (22.8 GB before the OOM killer), and its relatives: a 400 in under a
/// second on each route, the reason named, and the server's memory flat.
#[test]
fn schema_triggers_are_fast_400s_and_memory_stays_flat() {
    let s = Server::start(&[]);
    // A first generation loads the model: its memory is the baseline.
    let warm = s.post_json(
        "/api/generate",
        json!({"model": MODEL, "prompt": "Hi", "stream": false, "options": {"num_predict": 1}}),
        200,
    );
    assert_eq!(warm["done"], true);
    let before = rss_kib(s.pid());
    let triggers: Vec<(Value, &str)> = vec![
        (
            json!({"type": "string", "minLength": 10, "maxLength": 1}),
            "minLength (10) is greater than maxLength (1)",
        ),
        (
            json!({"type": "string", "pattern": "^a{5,1}$"}),
            "asks for at least 5 but at most 1 repetitions",
        ),
        (
            json!({"type": "string", "pattern": "^a{100000}$"}),
            "repeats at least 100000 times, more than 2000",
        ),
        (
            json!({"type": "string", "pattern": "^((ab){200}){200}$"}),
            "nested repetitions multiply to 40000",
        ),
        (
            json!({"type": "string", "pattern": "^(a?){2000}$"}),
            "more than 64 parts of it in a row may match nothing",
        ),
        (
            json!({"type": "object", "properties": (0..2000)
                .map(|i| (format!("p{i}"), json!({"type": "string"})))
                .collect::<serde_json::Map<String, Value>>()}),
            // The cost check runs first: 2,000 optional properties are
            // refused for their conversion's work before their count.
            "its conversion would take more than 100000 steps",
        ),
        (
            json!({"type": "array", "items": {"type": "integer"}, "minItems": 5, "maxItems": 2}),
            "minItems (5) is greater than maxItems (2)",
        ),
        (
            json!({"type": "object", "minProperties": 3, "maxProperties": 1}),
            "minProperties (3) is greater than maxProperties (1)",
        ),
        (
            json!({"type": "array", "minItems": 100000}),
            "minItems is 100000, more than the 2000 a grammar allows",
        ),
        (
            json!({"type": "string", "maxLength": 10_000_000_000u64}),
            "maxLength is 10000000000, more than the 1000000 a grammar allows",
        ),
        (
            json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/s"}},
                "$defs": {"s": {"type": "string", "minLength": 7, "maxLength": 3}}}),
            "at #/$defs/s: minLength (7) is greater than maxLength (3)",
        ),
        (
            json!({"enum": (0..40_000).map(|i| format!("value number {i}")).collect::<Vec<_>>()}),
            // Refused by the cost check before conversion.
            "a grammar of more than 262144 bytes",
        ),
    ];
    for route in ["/api/generate", "/api/chat", "/v1/chat/completions"] {
        for (schema, reason) in &triggers {
            let started = Instant::now();
            let r = s.post(route, with_schema(route, schema));
            let took = started.elapsed();
            assert_eq!(r.status(), 400, "{route} {reason}");
            let message = error_message(&r.json().unwrap());
            assert!(message.contains(reason), "{route}: {message}");
            assert!(took < Duration::from_secs(1), "{route} {reason}: {took:?}");
        }
    }
    let after = rss_kib(s.pid());
    assert!(
        after < before + 64 * 1024,
        "RSS grew from {before} KiB to {after} KiB"
    );
    // Still answering, with a bounded schema that works.
    let ok = s.post_json(
        "/api/generate",
        with_schema(
            "/api/generate",
            &json!({"type": "string", "minLength": 1, "maxLength": 3}),
        ),
        200,
    );
    let text = ok["response"].as_str().unwrap();
    assert!(text.starts_with('"'), "{text}");
}

/// Options outside their ranges are 400s that name the option.
#[test]
fn options_out_of_range_are_named() {
    let s = Server::start(&[]);
    let cases = [
        (
            json!({"top_p": 5}),
            "options.top_p must be between 0 and 1, got 5",
        ),
        (
            json!({"temperature": -1}),
            "options.temperature must be between 0 and 10, got -1",
        ),
        (
            json!({"min_p": 2}),
            "options.min_p must be between 0 and 1, got 2",
        ),
        (
            json!({"typical_p": -0.5}),
            "options.typical_p must be between 0 and 1, got -0.5",
        ),
        (
            json!({"presence_penalty": 9}),
            "options.presence_penalty must be between -2 and 2, got 9",
        ),
    ];
    for (options, message) in cases {
        let body = json!({"model": MODEL, "prompt": "x", "stream": false, "options": options});
        let r = s.post("/api/generate", body);
        assert_eq!(r.status(), 400, "{options}");
        assert_eq!(r.json::<Value>().unwrap(), json!({"error": message}));
    }
    let r = s.post(
        "/v1/chat/completions",
        json!({"model": MODEL, "top_p": 1.5, "messages": [{"role": "user", "content": "x"}]}),
    );
    assert_eq!(r.status(), 400);
    assert_eq!(
        error_message(&r.json().unwrap()),
        "top_p must be between 0 and 1, got 1.5"
    );
}

/// Too many inputs, a prompt far beyond the context, a path-like copy: 400s
/// before anything is tokenized or written.
#[test]
fn oversized_inputs_are_refused_before_work() {
    let s = Server::start(&[]);
    let many: Vec<String> = (0..2049).map(|i| format!("text {i}")).collect();
    for route in ["/api/embed", "/v1/embeddings"] {
        let r = s.post(route, json!({"model": MODEL, "input": many}));
        assert_eq!(r.status(), 400, "{route}");
        assert_eq!(
            error_message(&r.json().unwrap()),
            "input has 2049 texts, more than the 2048 one request may embed: split it"
        );
    }
    let r = s.post(
        "/api/embed",
        json!({"model": MODEL, "input": "word ".repeat(40_000), "truncate": false}),
    );
    assert_eq!(r.status(), 400);
    let message = error_message(&r.json().unwrap());
    assert!(
        message.starts_with("input 0 has 40001 tokens, more than the context of 4096 tokens"),
        "{message}"
    );
    // Cut to the embedding context and embedded when truncation is on.
    let r = s.post(
        "/api/embed",
        json!({"model": MODEL, "input": "word ".repeat(40_000)}),
    );
    assert_eq!(r.status(), 200);

    // 28 MB: refused by its length, not after tokenizing it.
    let huge = "a".repeat(28_000_000);
    let r = client()
        .post(s.url("/api/generate"))
        .json(&json!({"model": MODEL, "prompt": huge, "stream": false}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(
        error_message(&r.json().unwrap()),
        "the prompt is 28000000 bytes, more than a context window of 4096 tokens can hold \
         (1048576 bytes at most): shorten the prompt"
    );

    for destination in ["../../etc/evil", "/abs/name", "a//b", "./x"] {
        let r = s.post(
            "/api/copy",
            json!({"source": MODEL, "destination": destination}),
        );
        assert_eq!(r.status(), 400, "{destination}");
        assert!(
            error_message(&r.json().unwrap()).contains("a model name is not a path"),
            "{destination}"
        );
    }
    let tags: Value = s.get("/api/tags").json().unwrap();
    assert_eq!(tags["models"].as_array().unwrap().len(), 1);
}

/// An embedding request whose client left stops at its next text: a
/// request after it does not wait for the abandoned one's inputs.
#[test]
fn abandoned_embeddings_stop() {
    let s = Server::start(&[]);
    let inputs: Vec<String> = (0..48)
        .map(|i| format!("This is sentence number {i} about the weather in a city far away."))
        .collect();
    let big = json!({"model": MODEL, "input": inputs});
    // Loaded first, and the big request timed at its fastest of two: a
    // first run's own costs (the load, a batch of this size's first graph)
    // must not count in its time, or a quarter of it would be enough to
    // finish the request (seen once in a full run).
    s.post_json("/api/embed", json!({"model": MODEL, "input": "warm"}), 200);
    let whole = (0..2)
        .map(|_| {
            let started = Instant::now();
            s.post_json("/api/embed", big.clone(), 200);
            started.elapsed()
        })
        .min()
        .unwrap();

    let quarter = whole / 4;
    let abandoned = reqwest::blocking::Client::builder()
        .timeout(quarter)
        .build()
        .unwrap()
        .post(s.url("/api/embed"))
        .json(&big)
        .send();
    assert!(abandoned.is_err(), "the big request should have timed out");
    let left = Instant::now();
    s.post_json("/api/embed", json!({"model": MODEL, "input": "hello"}), 200);
    let waited = left.elapsed();
    assert!(
        waited < whole / 2,
        "the small request waited {waited:?}; the abandoned one takes {whole:?} in all"
    );
}

/// Sends `partial` (a request the server never gets whole) and reads until
/// the server closes the connection, which it must do within 40 s (a read
/// timeout is a failure); returns what it answered.
fn sent_and_cut_off(s: &Server, partial: &[u8]) -> Vec<u8> {
    let addr = s.base.trim_start_matches("http://").to_string();
    let mut stream = TcpStream::connect(&addr).unwrap();
    stream.write_all(partial).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(45)))
        .unwrap();
    let started = Instant::now();
    let mut answer = Vec::new();
    // Ends (EOF or reset) once the server closes; a read timeout would be an error.
    let result = stream.read_to_end(&mut answer);
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(40),
        "the server held the connection {took:?}"
    );
    if let Err(e) = result {
        assert_ne!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}");
        assert_ne!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
    }
    answer
}

/// A connection that never finishes its request head is closed by the server.
#[test]
fn half_sent_headers_are_cut_off() {
    let s = Server::start(&[]);
    sent_and_cut_off(&s, b"GET /api/tags HTTP/1.1\r\nHost: localhost\r\nX-Slow: ");
    // The server still answers.
    assert_eq!(s.get("/api/tags").status(), 200);
    assert!(s.log().contains("decode threads per model"), "{}", s.log());
}

/// `hypura inspect F | head`: the reader leaving is not a panic.
#[test]
fn inspect_into_a_closed_pipe_exits_quietly() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hypura"))
        .args(["inspect", common::smollm2().to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(output.status.success(), "{:?}: {stderr}", output.status);
}

/// One embedding request may not hold more than 300,000 tokens in all
/// (OpenAI's limit): texts each within the context, too many together, are a
/// 400 naming the limit, answered after tokenizing and before embedding.
#[test]
fn embedding_tokens_are_capped_per_request() {
    let s = Server::start(&[]);
    // 2,000 texts of about 200 tokens: 400,000 tokens, each text alone fine.
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(20);
    let many = vec![text.clone(); 2000];
    for route in ["/api/embed", "/v1/embeddings"] {
        let started = Instant::now();
        let r = s.post(route, json!({"model": MODEL, "input": many}));
        let took = started.elapsed();
        assert_eq!(r.status(), 400, "{route}");
        let message = error_message(&r.json().unwrap());
        assert!(
            message.contains("more than 300000 tokens together"),
            "{route}: {message}"
        );
        // Embedding 2,000 texts on this machine takes minutes; tokenizing, seconds.
        assert!(took < Duration::from_secs(20), "{route}: {took:?}");
    }
    // Under the cap, the same texts embed.
    let r = s.post(
        "/api/embed",
        json!({"model": MODEL, "input": vec![text; 3]}),
    );
    assert_eq!(r.status(), 200);
}

/// More decode threads than usable cores: the server says so in its log.
#[test]
fn oversubscribed_threads_are_warned_about() {
    let cores = std::thread::available_parallelism().unwrap().get();
    let threads = (cores * 4).to_string();
    let s = Server::start(&["--threads", &threads]);
    assert_eq!(s.get("/api/tags").status(), 200);
    let log = s.log();
    let warning = format!("{threads} decode threads on {cores} usable cores");
    assert!(log.contains(&warning), "{log}");
}

/// A request whose body stops arriving is answered (408) and its connection
/// closed within the body timeout; the server goes on answering.
#[test]
fn stalled_bodies_time_out() {
    let s = Server::start(&[]);
    let answer = sent_and_cut_off(
        &s,
        b"POST /api/generate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
          Content-Length: 1000\r\n\r\n{\"model\": ",
    );
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(
        answer.contains("the request body did not arrive within 30 s"),
        "{answer}"
    );
    assert_eq!(s.get("/api/tags").status(), 200);
}
