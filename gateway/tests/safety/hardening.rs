//! Nothing one request or one signal can do takes the server down (issue
//! 30): each test starts from the issue's reproducer against a real
//! `hypura serve` over SmolLM2 (its models in runner processes).
#[path = "../common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{client, peak_memory, wait_until, Server, MODEL};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Map, Value};

/// The server answers `/api/version` within `deadline` (a generous
/// liveness bound, not a speed).
fn answers_within(s: &Server, path: &str, deadline: Duration) -> reqwest::blocking::Response {
    let started = Instant::now();
    let response = client()
        .get(s.url(path))
        .timeout(deadline)
        .send()
        .unwrap_or_else(|e| panic!("{path} did not answer within {deadline:?}: {e}"));
    assert!(
        started.elapsed() < deadline,
        "{path} took {:?}",
        started.elapsed()
    );
    assert_eq!(response.status(), 200, "{path}");
    response
}

/// `$defs` a0 → a1 → … → a{n-1} → a string: the issue's `$ref` chain, in a
/// schema that sits at `at` (a JSON pointer, `#` for the root) of the
/// document converted.
fn ref_chain_at(n: usize, at: &str) -> Value {
    let mut defs = Map::new();
    for i in 0..n {
        let next = if i + 1 < n {
            json!({"$ref": format!("{at}/$defs/a{}", i + 1)})
        } else {
            json!({"type": "string"})
        };
        defs.insert(format!("a{i}"), next);
    }
    json!({"type": "object", "properties": {"x": {"$ref": format!("{at}/$defs/a0")}},
        "$defs": defs})
}

fn ref_chain(n: usize) -> Value {
    ref_chain_at(n, "#")
}

/// The issue's bomb: `width` optional properties, each such an object,
/// `depth` levels (100 × 3: 28 MB).
fn nested_objects(width: usize, depth: usize) -> Value {
    let mut schema = json!({"type": "string"});
    for _ in 0..depth {
        let properties: Map<String, Value> = (0..width)
            .map(|i| (format!("property_{i:03}"), schema.clone()))
            .collect();
        schema = json!({"type": "object", "properties": properties});
    }
    schema
}

fn error_of(response: reqwest::blocking::Response) -> String {
    let body: Value = response.json().unwrap();
    match &body["error"] {
        Value::String(message) => message.clone(),
        error => error["message"].as_str().unwrap_or_default().to_string(),
    }
}

/// A `$ref` chain of 2,500 links overflowed the worker's stack in
/// llama.cpp's converter and killed the server, through every field a
/// schema comes in: now a 400 naming the limit, and the server lives on.
#[test]
fn a_ref_chain_is_a_400_not_a_crash() {
    let s = Server::start(&[]);
    let chain = ref_chain(2_500);
    let too_deep = "the JSON Schema is too costly to turn into a grammar: it nests more than \
                    64 levels deep (each $ref followed counts as a level): simplify it";
    // SmolLM2's template has no tools: a forced call's schema holds the
    // parameters at this place.
    let in_tool_call = ref_chain_at(2_500, "#/properties/tool_calls/items/properties/arguments");
    let tool = json!({"type": "function", "function": {"name": "f", "parameters": in_tool_call}});
    let requests = [
        (
            "/api/generate",
            json!({"model": MODEL, "prompt": "Hi", "format": chain}),
            "format",
        ),
        (
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                "response_format": {"type": "json_schema",
                    "json_schema": {"name": "x", "schema": chain}}}),
            "response_format.json_schema.schema",
        ),
        (
            "/v1/responses",
            json!({"model": MODEL, "input": "Hi",
                "text": {"format": {"type": "json_schema", "name": "x", "schema": chain}}}),
            "text.format.schema",
        ),
        (
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
                "tools": [tool], "tool_choice": "required"}),
            "tools",
        ),
    ];
    for (path, body, field) in requests {
        let response = s.post(path, body);
        assert_eq!(response.status(), 400, "{path} {field}");
        assert_eq!(error_of(response), format!("{field}: {too_deep}"), "{path}");
        answers_within(&s, "/api/version", Duration::from_secs(10));
    }
    // A chain within the limit still becomes a grammar and a reply.
    let short = s.post_json(
        "/api/generate",
        json!({"model": MODEL, "prompt": "Hi", "format": ref_chain(40), "stream": false,
            "options": {"num_predict": 4}}),
        200,
    );
    assert_eq!(short["done"], true);
}

/// Two 28 MB schemas of 100 properties nested 3 deep spent ~100 s each in
/// conversion on the async workers and froze the server: now each is a
/// quick 4xx naming a limit, and `/api/version` answers meanwhile.
#[test]
fn schema_bombs_are_refused_before_conversion() {
    let s = Server::start(&[]);
    let bomb = serde_json::to_vec(&json!({"model": MODEL, "prompt": "Hi",
        "format": nested_objects(100, 3)}))
    .unwrap();
    assert!(bomb.len() > 20_000_000, "{} bytes", bomb.len());
    let url = s.url("/api/generate");
    let senders: Vec<_> = (0..2)
        .map(|_| {
            let (url, bomb) = (url.clone(), bomb.clone());
            std::thread::spawn(move || {
                let response = client()
                    .post(url)
                    .header("content-type", "application/json")
                    .body(bomb)
                    .send()
                    .unwrap();
                (response.status().as_u16(), error_of(response))
            })
        })
        .collect();
    answers_within(&s, "/api/version", Duration::from_secs(10));
    // Since session 34 a body this size is refused before it is parsed: its
    // 2 million values would take 290 MB as JSON values, more than the
    // bodies' budget.
    for sender in senders {
        let (status, message) = sender.join().unwrap();
        assert_eq!(status, 413, "{message}");
        assert!(
            message.starts_with("the request body's JSON has about 2030306 values"),
            "{message}"
        );
    }
    // Two levels of 100 properties (10,000 schemas, 300 KB)
    // passes that bound and meets the conversion's.
    let response = s.post(
        "/api/generate",
        json!({"model": MODEL, "prompt": "Hi", "format": nested_objects(100, 2)}),
    );
    assert_eq!(response.status(), 400);
    assert_eq!(
        error_of(response),
        "format: the JSON Schema is too costly to turn into a grammar: its conversion \
         would take more than 100000 steps (objects with many optional properties, \"type\" \
         lists over large schemas): simplify it"
    );
    // All required, the same shape passes the work bound and meets the
    // bound on properties.
    let mut required = nested_objects(20, 3);
    fn require_all(schema: &mut Value) {
        if let Some(properties) = schema.get_mut("properties").and_then(Value::as_object_mut) {
            let names: Vec<String> = properties.keys().cloned().collect();
            properties.values_mut().for_each(require_all);
            schema["required"] = json!(names);
        }
    }
    require_all(&mut required);
    let response = s.post(
        "/api/generate",
        json!({"model": MODEL, "prompt": "Hi", "format": required}),
    );
    assert_eq!(response.status(), 400);
    assert!(
        error_of(response).contains("more than 2048 object properties in all"),
        "the properties bound"
    );
    answers_within(&s, "/api/version", Duration::from_secs(10));
}

/// Two models (SmolLM2 under two names) in runners of their own, in a
/// folder of the test's (`tag`: tests run side by side).
fn two_models(tag: &str) -> (PathBuf, Server) {
    let dir = std::env::temp_dir().join(format!("hypura-hardening-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["alpha", "beta"] {
        let path = dir.join(format!("{name}.gguf"));
        if std::fs::hard_link(common::smollm2(), &path).is_err() {
            std::fs::copy(common::smollm2(), &path).unwrap();
        }
    }
    let args: Vec<String> = [
        "serve",
        dir.join("alpha.gguf").to_str().unwrap(),
        dir.join("beta.gguf").to_str().unwrap(),
        "--port",
        "0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    (dir, Server::start_logging(&args, "info,llama.cpp=error"))
}

fn generate(s: &Server, model: &str) -> Value {
    s.post_json(
        "/api/generate",
        json!({"model": model, "prompt": "Say hi", "stream": false,
            "options": {"num_predict": 4, "temperature": 0}}),
        200,
    )
}

/// The pid of the runner of `model`, from the server's log.
fn runner_pid(s: &Server, model: &str) -> i32 {
    let prefix = format!("{model}: runner pid ");
    s.log()
        .lines()
        .filter_map(|line| line.split_once(&prefix))
        .filter_map(|(_, rest)| rest.split_whitespace().next()?.parse().ok())
        .next_back()
        .unwrap_or_else(|| panic!("no runner pid for {model} in:\n{}", s.log()))
}

/// A stopped runner (SIGSTOP) held `/api/ps`, `/metrics`, `/api/version`
/// and the other models' generations for seconds, and was never declared
/// dead: now nothing waits on it, and it is killed and restarted.
#[test]
fn a_stopped_runner_stalls_nothing_else() {
    let (dir, s) = two_models("stopped");
    generate(&s, "alpha");
    generate(&s, "beta");
    let alpha = runner_pid(&s, "alpha:latest");
    kill(Pid::from_raw(alpha), Signal::SIGSTOP).unwrap();

    let liveness = Duration::from_secs(4);
    answers_within(&s, "/api/version", liveness);
    let ps: Value = answers_within(&s, "/api/ps", liveness).json().unwrap();
    let names: Vec<&str> = ps["models"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["name"].as_str())
        .collect();
    assert!(names.contains(&"alpha:latest"), "{ps}");
    for _ in 0..3 {
        answers_within(&s, "/api/ps", liveness);
        answers_within(&s, "/metrics", liveness);
        answers_within(&s, "/api/version", liveness);
    }
    assert_eq!(generate(&s, "beta")["done"], true);

    // Missing its deadlines, it is declared dead and killed; the next
    // request for its model starts a new runner.
    wait_until(
        Duration::from_secs(90),
        "the stopped runner is killed",
        || {
            s.log().contains("has not answered for")
                && !std::path::Path::new(&format!("/proc/{alpha}")).exists()
        },
    );
    assert_eq!(generate(&s, "alpha")["done"], true);
    assert_ne!(runner_pid(&s, "alpha:latest"), alpha);
    drop(s);
    let _ = std::fs::remove_dir_all(dir);
}

/// Writes `[server] api_key = key` to `path`.
fn write_key(path: &std::path::Path, key: &str) {
    std::fs::write(path, format!("[server]\napi_key = \"{key}\"\n")).unwrap();
}

fn tags_status(s: &Server, key: &str) -> u16 {
    client()
        .get(s.url("/api/tags"))
        .bearer_auth(key)
        .send()
        .unwrap()
        .status()
        .as_u16()
}

/// SIGHUP (default disposition) killed the server at once: now it lives,
/// keeps streaming, and reads the configuration file's keys again.
#[test]
fn sighup_reloads_keys_and_never_exits() {
    let dir = std::env::temp_dir().join(format!("hypura-hup-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("hypura.toml");
    write_key(&config, "first-key");
    let args: Vec<String> = [
        "serve",
        common::smollm2().to_str().unwrap(),
        "--port",
        "0",
        "--config",
        config.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let s = Server::start_with(&args);
    let server = Pid::from_raw(s.pid() as i32);
    assert_eq!(tags_status(&s, "first-key"), 200);

    // A stream in flight across the signal ends normally.
    let stream = {
        let url = s.url("/api/generate");
        std::thread::spawn(move || {
            let body = client()
                .post(url)
                .bearer_auth("first-key")
                .json(&json!({"model": MODEL, "prompt": "Count to fifty",
                    "options": {"num_predict": 48, "temperature": 0}}))
                .send()
                .unwrap()
                .text()
                .unwrap();
            common::ndjson(&body)
        })
    };
    kill(server, Signal::SIGHUP).unwrap();
    wait_until(Duration::from_secs(10), "the reload is logged", || {
        s.log().contains("SIGHUP: read ")
    });
    answers_within(&s, "/api/version", Duration::from_secs(10));
    let lines = stream.join().unwrap();
    assert_eq!(lines.last().unwrap()["done"], true, "{lines:?}");
    assert!(lines.iter().all(|l| l.get("error").is_none()), "{lines:?}");

    write_key(&config, "second-key");
    kill(server, Signal::SIGHUP).unwrap();
    wait_until(Duration::from_secs(10), "the new key works", || {
        tags_status(&s, "second-key") == 200
    });
    assert_eq!(tags_status(&s, "first-key"), 401);

    // A file that no longer parses, or would leave no key, changes nothing.
    std::fs::write(&config, "[server\n").unwrap();
    kill(server, Signal::SIGHUP).unwrap();
    wait_until(Duration::from_secs(10), "the bad file is logged", || {
        s.log().contains("the settings in use stay")
    });
    assert_eq!(tags_status(&s, "second-key"), 200);
    let _ = std::fs::remove_dir_all(dir);
}

/// LAN auth: a blank key is refused at start (it could never match), the
/// Bearer scheme is case-insensitive, an admin key alone guards every route
/// of a LAN bind, and a server on `0.0.0.0` checks `Host` (DNS rebinding).
#[test]
fn keys_are_checked_as_clients_send_them() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_hypura"))
        .args([
            "serve",
            common::smollm2().to_str().unwrap(),
            "--port",
            "0",
            "--api-key",
            " ",
        ])
        .env_remove("HYPURA_API_KEY")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("blank or begins or ends with whitespace"),
        "{stderr}"
    );

    let s = Server::start(&["--api-key", "k"]);
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let status = client()
            .get(s.url("/api/tags"))
            .header("authorization", format!("{scheme} k"))
            .send()
            .unwrap()
            .status();
        assert_eq!(status, 200, "{scheme}");
    }
    let basic = client()
        .get(s.url("/api/tags"))
        .header("authorization", "Basic k")
        .send()
        .unwrap()
        .status();
    assert_eq!(basic, 401);
    drop(s);

    let s = Server::start(&["--host", "0.0.0.0", "--admin-key", "admin"]);
    let local = s.base.replace("0.0.0.0", "127.0.0.1");
    let status = |key: Option<&str>| {
        let mut request = client().get(format!("{local}/api/tags"));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        request.send().unwrap().status().as_u16()
    };
    assert_eq!(status(None), 401);
    assert_eq!(status(Some("other")), 401);
    assert_eq!(status(Some("admin")), 200);
    // It listens on loopback too: a rebinding name is refused, LAN names not.
    let with_host = |host: &str| {
        let addr = local.trim_start_matches("http://");
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        let request = format!(
            "GET /api/tags HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer admin\r\n\
             Connection: close\r\n\r\n"
        );
        std::io::Write::write_all(&mut stream, request.as_bytes()).unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(&mut std::io::BufReader::new(stream), &mut line).unwrap();
        line.split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_string()
    };
    assert_eq!(with_host("evil.example"), "403");
    assert_eq!(with_host("evil.example:11434"), "403");
    assert_eq!(with_host("192.168.1.5:11434"), "200");
    assert_eq!(with_host("box.local"), "200");
    assert_eq!(with_host("localhost"), "200");
}

/// `n` arrays in one another around a 0.
fn nested_arrays(n: usize) -> Value {
    (0..n).fold(json!(0), |inner, _| json!([inner]))
}

/// Found reading the request paths (session 34): a template that puts a
/// namespace in itself overflowed the stack of the process rendering it
/// (the gateway's own for `/api/create`), tool calls nested 123 deep made
/// the runner's frame unreadable and the runner exit, `repeat_last_n`
/// near `i32::MAX` took 8 GiB in the runner, a body of 8 million zeros
/// took ~36 bytes of parsed JSON for each of its bytes in the gateway,
/// and stop lists had no bound. Each is now a 4xx naming its limit (or
/// served within bounds), and the model's runner is the same process
/// afterwards.
#[test]
fn odd_requests_are_refused_and_no_process_dies() {
    let (dir, s) = two_models("odd");
    generate(&s, "alpha");
    let runner = runner_pid(&s, "alpha:latest");
    let runner_lives = |s: &Server| {
        assert_eq!(generate(s, "alpha")["done"], true);
        assert_eq!(
            runner_pid(s, "alpha:latest"),
            runner,
            "the runner was restarted"
        );
        answers_within(s, "/api/version", Duration::from_secs(10));
    };
    let in_itself = "{% set ns = namespace(x=1) %}{% set ns.x = ns %}{{ ns }}";
    let deep_list = "{% set ns = namespace(x=[1]) %}{% for j in range(5) %}\
                     {% for i in range(100000) %}{% set ns.x = [ns.x] %}{% endfor %}{% endfor %}ok";

    // Templates: a request's own, rendered in the runner; a created
    // model's, checked in the gateway.
    for template in [in_itself, deep_list] {
        let response = s.post(
            "/api/generate",
            json!({"model": "alpha", "prompt": "Hi", "template": template, "stream": false}),
        );
        assert_eq!(response.status(), 400, "{template}");
        let error = error_of(response);
        assert!(error.contains("deeper than 128 levels"), "{error}");
        let response = s.post(
            "/api/create",
            json!({"model": "bomb", "from": "alpha", "template": template, "stream": false}),
        );
        assert_eq!(response.status(), 400, "{template}");
        assert!(error_of(response).contains("deeper than 128 levels"));
        runner_lives(&s);
    }

    // A body nested 100 deep is served (its frame to the runner nests
    // deeper still); 101 is a 400 naming the limit.
    let chat = |arguments_depth: usize| {
        json!({"model": "alpha", "stream": false, "options": {"num_predict": 2},
            "messages": [
                {"role": "user", "content": "Call f."},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"function": {"name": "f", "arguments": {"x": nested_arrays(arguments_depth)}}}]},
                {"role": "user", "content": "Thanks."}]})
    };
    // body, messages, message, tool_calls, call, function, arguments: 7.
    assert_eq!(s.post_json("/api/chat", chat(93), 200)["done"], true);
    let response = s.post("/api/chat", chat(94));
    assert_eq!(response.status(), 400);
    assert_eq!(
        error_of(response),
        "the request body's JSON nests 101 levels deep: the limit is 100"
    );
    runner_lives(&s);

    // The repetition window is the context at most.
    let runner_peak = peak_memory(runner as u32);
    let response = s.post_json(
        "/api/generate",
        json!({"model": "alpha", "prompt": "Hi", "stream": false,
            "options": {"repeat_last_n": 2147483647, "repeat_penalty": 1.1, "num_predict": 4}}),
        200,
    );
    assert_eq!(response["done"], true);
    let grown = peak_memory(runner as u32).saturating_sub(runner_peak);
    assert!(
        grown < 256 << 20,
        "the runner's peak grew {} MiB",
        grown >> 20
    );
    runner_lives(&s);

    // Stop sequences: 32 of 1,024 characters are taken; more, or longer, not.
    let stops = |count: usize, bytes: usize| {
        json!({"model": "alpha", "stream": false, "max_tokens": 2,
            "messages": [{"role": "user", "content": "Hi"}],
            "stop": vec!["s".repeat(bytes); count]})
    };
    s.post_json("/v1/chat/completions", stops(32, 1024), 200);
    for (count, bytes, longest) in [(10_000, 1, 1), (1, 1025, 1025)] {
        let response = s.post("/v1/chat/completions", stops(count, bytes));
        assert_eq!(response.status(), 400);
        assert_eq!(
            error_of(response),
            format!(
                "stop: at most 32 stop sequences of at most 1024 characters each, got \
                 {count} (the longest {longest} characters)"
            )
        );
    }
    let response = s.post(
        "/api/generate",
        json!({"model": "alpha", "prompt": "Hi", "options": {"stop": vec!["x"; 33]}}),
    );
    assert_eq!(response.status(), 400);
    assert!(error_of(response).starts_with("options.stop: at most 32 stop sequences"));

    // A body of 8 million zeros: refused before it is parsed.
    let gateway_peak = peak_memory(s.pid());
    let mut zeros = br#"{"model": "alpha", "messages": [], "pad": ["#.to_vec();
    zeros.extend(std::iter::repeat_n(&b"0,"[..], 8_000_000).flatten());
    zeros.extend_from_slice(b"0]}");
    let response = client()
        .post(s.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(zeros)
        .send()
        .unwrap();
    assert_eq!(response.status(), 413);
    let error = error_of(response);
    assert!(
        error.starts_with("the request body's JSON has about 8000006 values: the limit is "),
        "{error}"
    );
    let grown = peak_memory(s.pid()).saturating_sub(gateway_peak);
    assert!(
        grown < 128 << 20,
        "the gateway's peak grew {} MiB",
        grown >> 20
    );
    runner_lives(&s);
    drop(s);
    let _ = std::fs::remove_dir_all(dir);
}
