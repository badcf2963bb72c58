//! The stream cache under a RAM budget.
//!
//! A MoE with the smallest stream cache decodes a generation and embeddings
//! at once: each context pins the layer it computes, so the smallest cache
//! holds one layer per context that can decode at once, and the budget
//! charges that much. With one layer's cache the streamer went over its
//! budget and logged so (found by the soak, docs/soak.md).
//!
//! A hot model too big for the budget streams through the largest cache the
//! budget holds, as `hypura bench` plans it: not half its streamed weights.
//!
//! A runner that takes memory its charge does not see gives it back from its
//! stream cache, so the process stays within what the budget charges it.
#[path = "../common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::charges::{footprint, full, serve_args, streaming, RUNNER_ALLOWANCE};
use common::{client, Server};
use hypura_synth as synth;
use llama_tiered::tiered::footprint::DECODING_CONTEXTS;
use serde_json::{json, Value};

const MOE: &str = "smollm2-moe:latest";

/// The value of the `/metrics` line starting with `series`.
fn metric(server: &Server, series: &str) -> Option<f64> {
    server.metric(series)
}

/// Eight greedy tokens of SmolLM2 after "The capital of France is".
fn paris(server: &Server) -> String {
    let body = json!({"model": common::MODEL, "prompt": "The capital of France is",
                      "raw": true, "stream": false,
                      "options": {"temperature": 0, "num_predict": 8}});
    server.post_json("/api/generate", body, 200)["response"]
        .as_str()
        .unwrap()
        .to_string()
}

/// The `/metrics` series of `model`'s stream cache: bytes held, and budget.
fn cache_series(model: &str) -> (String, String) {
    (
        format!("hypura_stream_cache_bytes{{model=\"{model}\"}}"),
        format!("hypura_stream_cache_budget_bytes{{model=\"{model}\"}}"),
    )
}

#[test]
fn a_generation_and_embeddings_at_once_keep_the_smallest_cache_within_its_budget() {
    let dir = std::env::temp_dir().join(format!("hypura-stream-cache-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let moe: PathBuf = synth::cached::link_into(
        &synth::cached::derived_moe(&common::smollm2(), 8, 2, 0.01, 7).unwrap(),
        &dir,
        "smollm2-moe.gguf",
    )
    .unwrap();
    let f = footprint(&moe);
    assert_eq!(f.minimum_cache_bytes, DECODING_CONTEXTS * f.layer_bytes);
    // Room for the smallest cache only (in the server's process: no
    // runner's overhead to allow for): the most the budget holds of it, so
    // its hottest level has that cache too.
    let budget = streaming(&moe, f.minimum_cache_bytes);
    assert!(streaming(&moe, f.stream_bytes / 2) > budget);
    let server = Server::start_logging(
        &serve_args(&[&moe], budget, &["--in-process"]),
        "info,llama.cpp=error",
    );

    // 20 s: on two cores at load 8, 12 s held one 24-token generation.
    let deadline = Instant::now() + Duration::from_secs(20);
    let generation = {
        let url = server.url("/api/generate");
        std::thread::spawn(move || {
            let mut answers = 0;
            while Instant::now() < deadline {
                let body = json!({
                    "model": MOE,
                    "prompt": "The history of computing is",
                    "raw": true,
                    "stream": false,
                    "options": {"temperature": 0, "num_predict": 24}
                });
                let reply = client().post(&url).json(&body).send().unwrap();
                assert_eq!(reply.status(), 200);
                answers += 1;
            }
            answers
        })
    };
    let mut embeddings = 0;
    while Instant::now() < deadline {
        let body = json!({"model": MOE, "input": ["a short text to embed", "and another one"]});
        let reply = server.post_json("/api/embed", body, 200);
        assert_eq!(reply["embeddings"].as_array().unwrap().len(), 2);
        embeddings += 1;
    }
    let generations = generation.join().unwrap();
    assert!(
        generations >= 2 && embeddings >= 2,
        "{generations} {embeddings}"
    );

    let ps: Value = server.get("/api/ps").json().unwrap();
    let model = &ps["models"][0];
    // `full` for a model too big for the budget: the largest cache it
    // holds, here the smallest.
    assert_eq!(model["residency"], "full", "{ps}");
    // The budget charged the smallest cache of two contexts, and the
    // streamer holds that budget.
    let (_, series) = cache_series(MOE);
    assert_eq!(
        metric(&server, &series),
        Some(f.minimum_cache_bytes as f64),
        "{}",
        server.get("/metrics").text().unwrap()
    );
    let log = server.log();
    assert!(!log.contains("over budget"), "{log}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_hot_model_too_big_for_the_budget_streams_through_the_largest_cache_it_holds() {
    let path = common::smollm2();
    let f = footprint(&path);
    // Room for three quarters of its streamed weights beside the rest, and
    // for its runner: never for its full placement.
    let budget = streaming(&path, f.stream_bytes * 3 / 4) + RUNNER_ALLOWANCE;
    assert!(full(&path) + RUNNER_ALLOWANCE > budget);
    let server = Server::start_logging(&serve_args(&[&path], budget, &[]), "info,llama.cpp=error");
    let runner_mib: u64 = server
        .log()
        .split_once("an idle runner holds ")
        .and_then(|(_, rest)| rest.split(' ').next()?.parse().ok())
        .expect("the server logs its runners' overhead");
    let generate = || paris(&server);
    let text = generate();
    assert!(text.starts_with(" Paris"), "{text:?}");
    let (cache, limit) = cache_series(common::MODEL);
    // Hot, it gets its hottest level, and its cache fills past half the
    // streamed weights (the most it got before).
    common::wait_until(Duration::from_secs(30), "the cache filled", || {
        assert_eq!(generate(), text, "the same tokens whatever the cache");
        metric(&server, &cache).unwrap_or(0.0) > (f.stream_bytes / 2 + f.layer_bytes) as f64
    });
    let ps: Value = server.get("/api/ps").json().unwrap();
    assert_eq!(ps["models"][0]["residency"], "full", "{ps}");
    assert!(
        ps["models"][0]["tier_bytes"]["stream"].as_u64().unwrap() > 0,
        "{ps}"
    );
    // The cache's limit is what the RAM budget leaves beside the resident
    // weights, the contexts and the runner, and the budget is all charged.
    let cache_limit = metric(&server, &limit).unwrap() as u64;
    assert!(cache_limit < f.stream_bytes);
    let runner = budget - streaming(&path, 0) - cache_limit;
    assert_eq!(runner >> 20, runner_mib, "{cache_limit}");
    assert_eq!(
        metric(&server, "hypura_budget_charged_bytes{tier=\"ram\"}"),
        Some(budget as f64)
    );
    assert!(metric(&server, &cache).unwrap() <= cache_limit as f64);
    let log = server.log();
    assert!(!log.contains("over budget"), "{log}");
}

/// `VmRSS` of process `pid`, in bytes.
fn rss_of(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
        .unwrap()
        * 1024
}

#[test]
fn a_runner_gives_back_from_its_cache_what_it_takes_beyond_its_charge() {
    // The test hook that makes a runner take memory its budget does not see.
    std::env::set_var("HYPURA_RUNNER_TEST_HOOKS", "1");
    let path = common::smollm2();
    let f = footprint(&path);
    let budget = streaming(&path, f.stream_bytes * 3 / 4) + RUNNER_ALLOWANCE;
    let server = Server::start_logging(&serve_args(&[&path], budget, &[]), "info,llama.cpp=error");
    let generate = || paris(&server);
    let text = generate();
    let (cache, limit) = cache_series(common::MODEL);
    // Filled to its budget (what the fill and decoding read in): the spare
    // room measured next is then the process's, not the cache's.
    common::wait_until(Duration::from_secs(30), "the cache filled", || {
        assert_eq!(generate(), text);
        let budget = metric(&server, &limit).unwrap_or(f64::MAX);
        metric(&server, &cache).unwrap_or(0.0) + (f.layer_bytes as f64) >= budget
    });
    let pid: u32 = server
        .log()
        .split_once("runner pid ")
        .and_then(|(_, rest)| rest.split(' ').next()?.parse().ok())
        .expect("the server logs its runner's pid");
    let before = metric(&server, &cache).unwrap() as u64;
    // The runner's charge is the whole budget (one model): it stays within
    // it, with room to spare (the charge counts KV cache and buffers whole,
    // the kernel only the pages they touched so far).
    let charged = |rss: u64| rss + rss / 512;
    let spare = budget.saturating_sub(charged(rss_of(pid)));
    assert!(spare > 0, "runner RSS {} against {budget}", rss_of(pid));

    // The runner takes what was spare and 16 MiB more, which its budget does
    // not see: its cache gives the 16 MiB back.
    let over = 16u64 << 20;
    let taken = spare + over;
    let body = json!({"model": common::MODEL, "bytes": taken});
    server.post_json("/api/debug/runner-ballast", body, 200);
    assert_eq!(generate(), text, "the same tokens with a smaller cache");
    assert_eq!(generate(), text);
    let after = metric(&server, &limit).unwrap() as u64;
    assert!(
        after + over <= before + (2 << 20) && after + over + (12 << 20) >= before,
        "the cache went from {before} bytes to a budget of {after} after {taken} bytes were taken, {spare} spare"
    );
    assert!(metric(&server, &cache).unwrap() <= after as f64);
    assert!(
        charged(rss_of(pid)) <= budget + (1 << 20),
        "runner RSS {} against a charge of {budget}",
        rss_of(pid)
    );
    let log = server.log();
    assert!(!log.contains("over budget"), "{log}");
}
