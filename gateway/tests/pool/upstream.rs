//! Upstreams on loopback: a front `hypura serve` with no model of its own
//! serves SmolLM2 from peer `hypura serve` processes, to raw HTTP and to the
//! official Python clients; a peer killed mid-stream ends that stream with a
//! clean error and the next request goes to the other peer; a peer that
//! accepts and never answers is left after its first-byte timeout; peers
//! reached through their OpenAI routes only, and through Ollama's only.
#[path = "../common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{client, smollm2, wait_until, Server, MODEL};
use serde_json::{json, Value};

/// A `[[upstreams]]` configuration file holding `toml`.
fn config_file(name: &str, toml: &str) -> PathBuf {
    let path = std::env::temp_dir().join(format!(
        "hypura-upstream-{}-{name}.toml",
        std::process::id()
    ));
    std::fs::write(&path, toml).unwrap();
    path
}

/// `hypura serve --config FILE` with no model of its own.
fn front(config: &Path) -> Server {
    Server::start_with(&[
        "serve".into(),
        "--config".into(),
        config.to_string_lossy().into_owned(),
        "--port".into(),
        "0".into(),
    ])
}

/// The value of the `/metrics` line starting with `series` (0 when absent).
fn metric(server: &Server, series: &str) -> f64 {
    let text = server.get("/metrics").text().unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

fn port_of(server: &Server) -> String {
    server.base.rsplit(':').next().unwrap().to_string()
}

#[test]
fn a_front_serves_a_peers_model_and_moves_to_another_peer_when_it_dies() {
    let one = Server::start(&[]);
    let two = Server::start(&["--keep-alive", "-1"]);
    // Only `one` has the model loaded: the front prefers it.
    one.post_json("/api/generate", json!({"model": MODEL}), 200);
    let config = config_file(
        "failover",
        &format!(
            "[[upstreams]]\nname = \"one\"\nurl = \"{}\"\nprobe_interval = \"500ms\"\ncooldown = \"1s\"\n\
             [[upstreams]]\nname = \"two\"\nurl = \"{}\"\nprobe_interval = \"500ms\"\n",
            one.base, two.base
        ),
    );
    let front = front(&config);
    assert_eq!(front.get("/health").status(), 200);
    assert_eq!(front.get("/ready").status(), 200);
    let ps = front.get("/api/ps").json::<Value>().unwrap();
    assert_eq!(ps["models"][0]["node"], "one", "{ps}");

    // The official clients see the peer's model as a local one.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let status = Command::new("python3")
        .arg("gateway/tests/clients/upstream_front.py")
        .args([&front.base, &one.base])
        .current_dir(&root)
        .status()
        .expect("run python3");
    assert!(
        status.success(),
        "the Python clients through the front failed"
    );
    assert_eq!(
        metric(&front, "hypura_upstream_requests_total{upstream=\"two\"}"),
        0.0
    );

    // `one` dies mid-stream: the stream ends with an error line.
    let reply = client()
        .post(front.url("/api/generate"))
        .json(
            &json!({"model": MODEL, "prompt": "Count from one to one hundred:",
                      "options": {"num_predict": 400}}),
        )
        .send()
        .unwrap();
    assert_eq!(reply.status(), 200);
    let mut lines = BufReader::new(reply).lines();
    let first: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    assert_eq!(first["done"], false, "{first}");
    let port = port_of(&one);
    drop(one);
    let rest: Vec<Value> = lines
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .collect();
    let last = rest.last().expect("a last line");
    let error = last["error"].as_str().unwrap_or_else(|| panic!("{last}"));
    assert!(error.contains("upstream server one"), "{error}");
    assert!(!error.contains(&port), "the error names no port: {error}");
    assert!(rest.iter().all(|l| l["done"] != true));

    // The next request goes to `two`.
    let answer = front.post_json(
        "/api/generate",
        json!({"model": MODEL, "prompt": "Hello", "stream": false, "options": {"num_predict": 2}}),
        200,
    );
    assert_eq!(answer["eval_count"], 2, "{answer}");
    assert_eq!(
        metric(&front, "hypura_upstream_requests_total{upstream=\"two\"}"),
        1.0
    );
    assert_eq!(metric(&front, "hypura_upstream_up{upstream=\"one\"}"), 0.0);
    assert!(metric(&front, "hypura_upstream_errors_total{upstream=\"one\"}") >= 1.0);

    // `one` comes back on its port: after its cooldown, its probe answers again.
    let _again = Server::start_with(&[
        "serve".into(),
        smollm2().to_string_lossy().into_owned(),
        "--port".into(),
        port,
    ]);
    wait_until(Duration::from_secs(30), "upstream one is up again", || {
        metric(&front, "hypura_upstream_up{upstream=\"one\"}") == 1.0
    });

    // The peers export the Inference Extension's gauges.
    let gauges = two.get("/metrics").text().unwrap();
    let series = format!("vllm:num_requests_waiting{{model_name=\"{MODEL}\"}} 0");
    assert!(gauges.contains(&series), "{gauges}");
    assert!(gauges.contains("vllm:num_requests_running{"), "{gauges}");
    assert!(gauges.contains("vllm:gpu_cache_usage_perc{"), "{gauges}");
}

/// A server that answers health probes (listing [`MODEL`] as loaded) but
/// accepts generations and never answers them: a wedged engine.
fn wedged_server() -> (String, Arc<Mutex<Vec<TcpStream>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let held = Arc::new(Mutex::new(Vec::new()));
    let keep = Arc::clone(&held);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut head = [0u8; 4096];
            let n = stream.read(&mut head).unwrap_or(0);
            if head[..n].starts_with(b"GET") {
                let body = json!({"models": [{"name": MODEL, "model": MODEL}]}).to_string();
                let _ = write!(
                    stream,
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                     connection: close\r\n\r\n{body}",
                    body.len()
                );
            } else {
                keep.lock().unwrap().push(stream);
            }
        }
    });
    (base, held)
}

#[test]
fn a_wedged_peer_is_left_after_its_first_byte_timeout_and_other_kinds_serve() {
    let peer = Server::start(&[]);
    let (wedged, held) = wedged_server();
    let config = config_file(
        "wedged",
        &format!(
            "[[upstreams]]\nname = \"wedged\"\nurl = \"{wedged}\"\nfirst_byte_timeout = \"1s\"\n\
             [[upstreams]]\nname = \"viaopenai\"\nurl = \"{}/v1\"\nkind = \"openai\"\n",
            peer.base
        ),
    );
    let front = front(&config);
    let chat = json!({"model": MODEL, "stream": false, "options": {"num_predict": 3},
                      "messages": [{"role": "user", "content": "Hi"}]});
    let answer = front.post_json("/api/chat", chat.clone(), 200);
    assert_eq!(answer["eval_count"], 3, "{answer}");
    assert!(!answer["message"]["content"].as_str().unwrap().is_empty());
    assert_eq!(
        held.lock().unwrap().len(),
        1,
        "the wedged peer got the request first"
    );
    assert_eq!(
        metric(&front, "hypura_upstream_errors_total{upstream=\"wedged\"}"),
        1.0
    );
    assert_eq!(
        metric(
            &front,
            "hypura_upstream_requests_total{upstream=\"viaopenai\"}"
        ),
        1.0
    );

    // Raw text through an OpenAI-only upstream: /v1/completions, streamed.
    let body = client()
        .post(front.url("/api/generate"))
        .json(
            &json!({"model": MODEL, "prompt": "The capital of France is", "raw": true,
                      "options": {"num_predict": 3, "temperature": 0}}),
        )
        .send()
        .unwrap()
        .text()
        .unwrap();
    let lines = common::ndjson(&body);
    assert!(lines.len() >= 2, "{body}");
    assert_eq!(lines.last().unwrap()["eval_count"], 3, "{body}");

    // The same peer through its Ollama routes only.
    let via_ollama = Server::start_with(&[
        "serve".into(),
        "--upstream".into(),
        format!("ollama+{}", peer.base),
        "--port".into(),
        "0".into(),
    ]);
    let streamed = client()
        .post(via_ollama.url("/api/chat"))
        .json(&json!({"model": MODEL, "options": {"num_predict": 3},
                      "messages": [{"role": "user", "content": "Hi"}]}))
        .send()
        .unwrap()
        .text()
        .unwrap();
    let chunks = common::ndjson(&streamed);
    assert!(chunks.len() >= 2, "{streamed}");
    assert_eq!(chunks.last().unwrap()["done"], true, "{streamed}");
    let embedded = via_ollama.post_json("/api/embed", json!({"model": MODEL, "input": "Hi"}), 200);
    assert_eq!(embedded["embeddings"][0].as_array().unwrap().len(), 576);
    // Unknown models are still a 404 in the client's dialect.
    let missing = via_ollama.post(
        "/v1/chat/completions",
        json!({"model": "nope", "messages": [{"role": "user", "content": "Hi"}]}),
    );
    assert_eq!(missing.status(), 404);

    // A request from another front sees only this server's own models: fronts
    // pointing at each other never pass a request round in circles.
    let hop = |r: reqwest::blocking::RequestBuilder| r.header("x-hypura-upstream-hop", "1");
    let tags: Value = hop(client().get(via_ollama.url("/api/tags")))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(tags["models"], json!([]), "{tags}");
    let looped = hop(client().post(via_ollama.url("/api/chat")))
        .json(&chat)
        .send()
        .unwrap();
    assert_eq!(looped.status(), 404);
}
