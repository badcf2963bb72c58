//! `/metrics` against a real `hypura serve` on SmolLM2: requests with known
//! token counts move the counters by exactly that much; running and
//! waiting gauges go back to 0 when clients leave mid-stream; a full queue
//! is counted as a rejection; a model streamed under a RAM budget reports
//! the engine's own streaming counters, the same as `/api/status` says.
#[path = "../common/mod.rs"]
mod common;
#[path = "../prom/mod.rs"]
mod prom;

use std::io::Read;
use std::time::Duration;

use common::charges::{self, BATCH, CONTEXT, RUNNER_ALLOWANCE};
use common::{client, wait_until, Server, MODEL};
use hypura_gguf::GgufFile;
use prom::Scrape;
use serde_json::{json, Value};

const PROMPT: &str = "The capital of France is";

fn scrape(server: &Server) -> Scrape {
    let reply = server.get("/metrics");
    assert_eq!(reply.status(), 200);
    let content_type = reply.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        content_type.starts_with("text/plain; version=0.0.4"),
        "{content_type}"
    );
    Scrape::parse(&reply.text().unwrap())
}

const M: (&str, &str) = ("model", MODEL);

/// What the counters of one model say, for deltas.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Counts {
    prompt_tokens: f64,
    generation_tokens: f64,
    success: f64,
    stop: f64,
    length: f64,
    cancelled: f64,
    ttft: f64,
    itl: f64,
    e2e: f64,
    queue: f64,
    prefill: f64,
    decode: f64,
    prompt_hist_count: f64,
    prompt_hist_sum: f64,
    generation_hist_count: f64,
    generation_hist_sum: f64,
    completions_200: f64,
    chat_200: f64,
    generate_200: f64,
    generate_503: f64,
    queue_full: f64,
}

impl Counts {
    fn of(s: &Scrape) -> Counts {
        Counts {
            prompt_tokens: s.sum("hypura_prompt_tokens_total", &[M]),
            generation_tokens: s.sum("hypura_generation_tokens_total", &[M]),
            success: s.sum("hypura_request_success_total", &[M]),
            stop: s.sum(
                "hypura_request_success_total",
                &[M, ("finish_reason", "stop")],
            ),
            length: s.sum(
                "hypura_request_success_total",
                &[M, ("finish_reason", "length")],
            ),
            cancelled: s.sum(
                "hypura_request_aborted_total",
                &[M, ("reason", "cancelled")],
            ),
            ttft: s.sum("hypura_time_to_first_token_seconds_count", &[M]),
            itl: s.sum("hypura_inter_token_latency_seconds_count", &[M]),
            e2e: s.sum("hypura_e2e_request_latency_seconds_count", &[M]),
            queue: s.sum("hypura_request_queue_time_seconds_count", &[M]),
            prefill: s.sum("hypura_request_prefill_time_seconds_count", &[M]),
            decode: s.sum("hypura_request_decode_time_seconds_count", &[M]),
            prompt_hist_count: s.sum("hypura_request_prompt_tokens_count", &[M]),
            prompt_hist_sum: s.sum("hypura_request_prompt_tokens_sum", &[M]),
            generation_hist_count: s.sum("hypura_request_generation_tokens_count", &[M]),
            generation_hist_sum: s.sum("hypura_request_generation_tokens_sum", &[M]),
            completions_200: s.sum(
                "hypura_requests_total",
                &[
                    M,
                    ("api", "openai"),
                    ("route", "/v1/completions"),
                    ("status", "200"),
                ],
            ),
            chat_200: s.sum(
                "hypura_requests_total",
                &[
                    M,
                    ("api", "openai"),
                    ("route", "/v1/chat/completions"),
                    ("status", "200"),
                ],
            ),
            generate_200: s.sum(
                "hypura_requests_total",
                &[
                    M,
                    ("api", "ollama"),
                    ("route", "/api/generate"),
                    ("status", "200"),
                ],
            ),
            generate_503: s.sum(
                "hypura_requests_total",
                &[M, ("route", "/api/generate"), ("status", "503")],
            ),
            queue_full: s.sum(
                "hypura_requests_rejected_total",
                &[M, ("reason", "queue_full")],
            ),
        }
    }
}

fn finish_reason(reason: &str, stop: &mut f64, length: &mut f64) {
    match reason {
        "stop" => *stop += 1.0,
        "length" => *length += 1.0,
        other => panic!("finish reason {other}"),
    }
}

#[test]
fn counters_move_by_exactly_what_the_requests_did_and_gauges_return_to_zero() {
    let server = Server::start(&["--parallel", "1", "--queue-limit", "2"]);
    // Loaded by a first request: its counts are before the baseline.
    server.post_json(
        "/api/generate",
        json!({"model": MODEL, "prompt": PROMPT, "raw": true, "stream": false,
               "options": {"temperature": 0, "num_predict": 1}}),
        200,
    );
    let before = Counts::of(&scrape(&server));

    // Known counts: usage for OpenAI, eval_count (and the same raw prompt) for Ollama.
    let (mut prompt, mut generated, mut itl) = (0.0, 0.0, 0.0);
    let (mut stop, mut length) = (0.0, 0.0);
    let mut completion_prompt = 0.0;
    for max_tokens in [6, 3] {
        let reply = server.post_json(
            "/v1/completions",
            json!({"model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0}),
            200,
        );
        let usage = &reply["usage"];
        completion_prompt = usage["prompt_tokens"].as_f64().unwrap();
        let tokens = usage["completion_tokens"].as_f64().unwrap();
        prompt += completion_prompt;
        generated += tokens;
        itl += f64::from(tokens >= 2.0);
        finish_reason(
            reply["choices"][0]["finish_reason"].as_str().unwrap(),
            &mut stop,
            &mut length,
        );
    }
    let reply = server.post_json(
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}],
               "max_tokens": 4, "temperature": 0}),
        200,
    );
    prompt += reply["usage"]["prompt_tokens"].as_f64().unwrap();
    let tokens = reply["usage"]["completion_tokens"].as_f64().unwrap();
    generated += tokens;
    itl += f64::from(tokens >= 2.0);
    finish_reason(
        reply["choices"][0]["finish_reason"].as_str().unwrap(),
        &mut stop,
        &mut length,
    );
    for stream in [false, true] {
        let body = json!({"model": MODEL, "prompt": PROMPT, "raw": true, "stream": stream,
                          "options": {"temperature": 0, "num_predict": 5}});
        let text = server.post("/api/generate", body).text().unwrap();
        let last = common::ndjson(&text).pop().unwrap();
        let tokens = last["eval_count"].as_f64().unwrap();
        prompt += completion_prompt;
        generated += tokens;
        itl += f64::from(tokens >= 2.0);
        finish_reason(
            last["done_reason"].as_str().unwrap(),
            &mut stop,
            &mut length,
        );
    }
    let after = Counts::of(&scrape(&server));
    let delta = |f: fn(&Counts) -> f64| f(&after) - f(&before);
    assert!(prompt > 0.0 && generated > 0.0);
    assert_eq!(delta(|c| c.prompt_tokens), prompt, "{before:?}\n{after:?}");
    assert_eq!(delta(|c| c.generation_tokens), generated);
    assert_eq!(delta(|c| c.success), 5.0);
    assert_eq!(delta(|c| c.stop), stop);
    assert_eq!(delta(|c| c.length), length);
    for (what, count) in [
        ("ttft", delta(|c| c.ttft)),
        ("e2e", delta(|c| c.e2e)),
        ("queue", delta(|c| c.queue)),
        ("prefill", delta(|c| c.prefill)),
        ("decode", delta(|c| c.decode)),
        ("prompt tokens", delta(|c| c.prompt_hist_count)),
        ("generation tokens", delta(|c| c.generation_hist_count)),
    ] {
        assert_eq!(count, 5.0, "{what} observations");
    }
    assert_eq!(delta(|c| c.itl), itl);
    assert_eq!(delta(|c| c.prompt_hist_sum), prompt);
    assert_eq!(delta(|c| c.generation_hist_sum), generated);
    assert_eq!(delta(|c| c.completions_200), 2.0);
    assert_eq!(delta(|c| c.chat_200), 1.0);
    assert_eq!(delta(|c| c.generate_200), 2.0);

    // One generating, two waiting (one slot, a queue of two), a fourth refused.
    let before = after;
    let long = json!({"model": MODEL, "prompt": PROMPT, "raw": true, "stream": true,
                      "options": {"num_predict": 4000, "temperature": 0}});
    let mut first = client()
        .post(server.url("/api/generate"))
        .json(&long)
        .send()
        .unwrap();
    let mut buf = [0u8; 64];
    assert!(
        first.read(&mut buf).unwrap() > 0,
        "the first request streams"
    );
    // Waiting at the model's fair gate, their headers come once each gets
    // the slot: each client then leaves at once (mid-stream).
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            let (url, long) = (server.url("/api/generate"), long.clone());
            std::thread::spawn(move || {
                let reply = client().post(url).json(&long).send().unwrap();
                assert_eq!(reply.status(), 200);
            })
        })
        .collect();
    wait_until(Duration::from_secs(30), "1 running and 2 waiting", || {
        let s = scrape(&server);
        s.get("hypura_requests_running", &[M]) == 1.0
            && s.get("hypura_requests_waiting", &[M]) == 2.0
    });
    let s = scrape(&server);
    assert_eq!(s.get("hypura_slots_busy", &[M]), 1.0);
    assert_eq!(s.get("hypura_slots", &[M]), 1.0);
    // The running request's tokens are in the KV cache: f16 keys and values
    // of every layer for one slot of the default 4096-token context.
    let usage = s.get("hypura_kv_cache_usage_ratio", &[M]);
    assert!(usage > 0.0 && usage < 1.0, "{usage}");
    let file = GgufFile::open(common::smollm2()).unwrap();
    let (_, facts) = llama_tiered::tiered::placement::plan_inputs(&file).unwrap();
    assert_eq!(
        s.get("hypura_kv_cache_bytes", &[M]),
        (facts.kv_bytes_per_token * 4096) as f64
    );
    let refused = server.post("/api/generate", long.clone());
    assert_eq!(refused.status(), 503);
    drop(refused);
    // The clients leave mid-stream.
    drop(first);
    for client in waiting {
        client.join().unwrap();
    }
    wait_until(
        Duration::from_secs(30),
        "no request running or waiting",
        || {
            let s = scrape(&server);
            s.get("hypura_requests_running", &[M]) == 0.0
                && s.get("hypura_requests_waiting", &[M]) == 0.0
                && s.get("hypura_slots_busy", &[M]) == 0.0
                && s.get("hypura_kv_cache_usage_ratio", &[M]) == 0.0
        },
    );
    wait_until(Duration::from_secs(30), "3 cancellations counted", || {
        let after = Counts::of(&scrape(&server));
        after.cancelled - before.cancelled == 3.0
    });
    let after = Counts::of(&scrape(&server));
    assert_eq!(after.queue_full - before.queue_full, 1.0);
    assert_eq!(after.generate_503 - before.generate_503, 1.0);
    assert_eq!(after.generate_200 - before.generate_200, 3.0);
    // Cancelled generations are not successes and add no tokens.
    assert_eq!(after.success, before.success);
    assert_eq!(after.generation_tokens, before.generation_tokens);

    let s = scrape(&server);
    assert_eq!(s.get("hypura_build_info", &[]), 1.0);
    assert!(s.get("process_resident_memory_bytes", &[]) > 1e6);
    let start = s.get("process_start_time_seconds", &[]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    assert!(start <= now && now - start < 600.0, "{start} vs {now}");
    assert_eq!(s.get("hypura_models_loaded", &[]), 1.0);
    assert_eq!(
        s.get("hypura_model_moves_total", &[M, ("kind", "load")]),
        1.0
    );
    assert_eq!(
        s.get(
            "hypura_model_move_duration_seconds_count",
            &[M, ("kind", "load")]
        ),
        1.0
    );
    // Without a budget the weights are in RAM, full.
    let ps = ps_model(&server, MODEL);
    for tier in ["gpu", "ram", "stream"] {
        assert_eq!(
            s.get("hypura_model_resident_bytes", &[M, ("tier", tier)]),
            ps["tier_bytes"][tier].as_f64().unwrap(),
            "{tier}"
        );
    }
    assert_eq!(
        s.get("hypura_model_residency", &[M, ("state", "full")]),
        1.0
    );
    assert!(!s.has("hypura_budget_limit_bytes"), "no budget, no limit");
    // Its series exist from the start (at 0, issue 28): nothing streamed.
    assert_eq!(
        s.get("hypura_stream_read_bytes_total", &[M]),
        0.0,
        "nothing streamed"
    );
    // The one error logged is the refusal's 503.
    let log = server.log();
    let errors: Vec<&str> = log.lines().filter(|l| l.contains("ERROR")).collect();
    assert!(errors.len() == 1 && errors[0].contains("503"), "{log}");
}

#[test]
fn metrics_follow_the_api_key_and_may_stay_open_on_loopback() {
    let server = Server::start(&["--api-key", "sesame"]);
    assert_eq!(server.get("/metrics").status(), 401);
    let with_key = client()
        .get(server.url("/metrics"))
        .bearer_auth("sesame")
        .send()
        .unwrap();
    assert_eq!(with_key.status(), 200);
    assert!(with_key.text().unwrap().contains("hypura_build_info"));
    drop(server);
    let server = Server::start(&["--api-key", "sesame", "--metrics-open-on-loopback"]);
    assert_eq!(server.get("/metrics").status(), 200);
    // Only /metrics: the rest still needs the key.
    assert_eq!(server.get("/api/ps").status(), 401);
    assert_eq!(server.get("/api/status").status(), 401);
}

fn ps_model(server: &Server, name: &str) -> Value {
    let ps: Value = server.get("/api/ps").json().unwrap();
    ps["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == name)
        .unwrap_or_else(|| panic!("{name} in {ps}"))
        .clone()
}

/// The streaming counters of `/metrics` for the model.
fn stream_counters(s: &Scrape) -> [f64; 8] {
    [
        "hypura_stream_read_bytes_total",
        "hypura_stream_read_seconds_total",
        "hypura_expert_cache_hits_total",
        "hypura_expert_cache_misses_total",
        "hypura_prefetch_hits_total",
        "hypura_prefetch_wasted_bytes_total",
        "hypura_io_stall_seconds_total",
        "hypura_stream_cache_evictions_total",
    ]
    .map(|name| s.get(name, &[M]))
}

#[test]
fn a_streamed_model_reports_the_engines_stream_counters() {
    let path = common::smollm2();
    // Its runner process is charged too (its idle RSS, measured by the
    // server at start; about 10 MiB, as `tests/pool/budget.rs` allows for).
    let budget = charges::streaming_minimum(&path) + RUNNER_ALLOWANCE + (1 << 20);
    let server = Server::start(&[
        "--parallel",
        "1",
        "--context",
        &CONTEXT.to_string(),
        "--batch",
        &BATCH.to_string(),
        "--ram-budget",
        &budget.to_string(),
    ]);
    let generate = |n: u32| {
        let body = json!({"model": MODEL, "prompt": PROMPT, "raw": true, "stream": false,
                          "options": {"temperature": 0, "num_predict": n}});
        server.post_json("/api/generate", body, 200)["eval_count"]
            .as_f64()
            .unwrap()
    };
    generate(4);
    let s = scrape(&server);
    let before = stream_counters(&s);
    let [bytes, seconds, hits, misses, ..] = before;
    // Read and looked up (a read-ahead deep enough serves every lookup).
    assert!(
        bytes > 0.0 && seconds > 0.0 && hits + misses > 0.0,
        "{before:?}"
    );
    // Its hottest level: too big for the budget, it streams through the
    // largest cache the budget holds.
    assert_eq!(
        s.get("hypura_model_residency", &[M, ("state", "full")]),
        1.0
    );
    assert_eq!(
        s.get("hypura_budget_limit_bytes", &[("tier", "ram")]),
        budget as f64
    );
    let charged = s.get("hypura_budget_charged_bytes", &[("tier", "ram")]);
    assert!(charged > 0.0 && charged <= budget as f64, "{charged}");
    assert!(s.get("hypura_stream_cache_budget_bytes", &[M]) > 0.0);
    let ps = ps_model(&server, MODEL);
    assert!(ps["tier_bytes"]["stream"].as_u64().unwrap() > 0, "{ps}");
    for tier in ["gpu", "ram", "stream"] {
        assert_eq!(
            s.get("hypura_model_resident_bytes", &[M, ("tier", tier)]),
            ps["tier_bytes"][tier].as_f64().unwrap(),
            "{tier}"
        );
    }

    // The same counts as the backend reports (`/api/status`), the server
    // idle. A runner that misses a status call's deadline (a loaded
    // machine) is answered for from its last status: the two agree once
    // both are fresh.
    let fields = [
        "nvme_bytes_read",
        "read_seconds",
        "expert_hits",
        "expert_misses",
        "prefetch_hits",
        "prefetch_wasted_bytes",
        "io_stall_seconds",
        "evictions",
    ];
    let mut now = [0.0; 8];
    let mut differ = String::new();
    wait_until(
        Duration::from_secs(20),
        "/metrics and /api/status agree",
        || {
            let status: Value = server.get("/api/status").json().unwrap();
            let reported = &status["models"][0]["streaming"];
            now = stream_counters(&scrape(&server));
            differ = fields
                .iter()
                .zip(now)
                .filter(|(field, value)| {
                    let expected = reported[**field].as_f64().unwrap();
                    (value - expected).abs() > 1e-9 * expected.max(1.0)
                })
                .map(|(field, value)| {
                    format!(
                        "{field}: /metrics {value}, /api/status {}",
                        reported[*field]
                    )
                })
                .collect::<Vec<_>>()
                .join("; ");
            if !differ.is_empty() {
                eprintln!("{differ}");
            }
            differ.is_empty()
        },
    );

    // Every token looks up every layer's streamed FFN: at least one lookup
    // per layer per generated token, and bytes read.
    let n_layer = GgufFile::open(&path)
        .unwrap()
        .arch_u64("block_count")
        .unwrap() as f64;
    let tokens = generate(8);
    let mut after = now;
    wait_until(
        Duration::from_secs(20),
        "the new counts are scraped",
        || {
            after = stream_counters(&scrape(&server));
            after[0] > now[0]
        },
    );
    let lookups = (after[2] + after[3]) - (hits + misses);
    assert!(
        lookups >= tokens * n_layer,
        "{lookups} lookups for {tokens} tokens"
    );
    for (a, b) in after.iter().zip(now) {
        assert!(*a >= b, "counters never go down: {after:?} {now:?}");
    }
    let log = server.log();
    assert!(!log.contains("ERROR"), "{log}");
}
