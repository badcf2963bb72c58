//! A MoE at `streaming` residency (the smallest stream cache) decodes a
//! generation and embeddings at once: each context pins the layer it
//! computes, so the smallest cache holds one layer per context that can
//! decode at once, and the budget charges that much. With one layer's
//! cache the streamer went over its budget and logged so (found by the
//! soak, docs/soak.md).
mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::charges::{footprint, serve_args, streaming, RUNNER_ALLOWANCE};
use common::{client, Server};
use hypura_synth as synth;
use llama_tiered::tiered::footprint::DECODING_CONTEXTS;
use serde_json::{json, Value};

const MOE: &str = "smollm2-moe:latest";

/// The value of the `/metrics` line starting with `series`.
fn metric(server: &Server, series: &str) -> Option<f64> {
    let text = server.get("/metrics").text().unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse().ok())
}

#[test]
fn a_generation_and_embeddings_at_once_keep_the_smallest_cache_within_its_budget() {
    let dir = std::env::temp_dir().join(format!("hypura-stream-cache-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let moe: PathBuf = dir.join("smollm2-moe.gguf");
    synth::derive_moe_from_dense(&common::smollm2(), &moe, 8, 2, 0.01, 7).unwrap();
    let f = footprint(&moe);
    assert_eq!(f.minimum_cache_bytes, DECODING_CONTEXTS * f.layer_bytes);
    // Room for the smallest cache only: the model stays at `streaming`.
    let budget = streaming(&moe, f.minimum_cache_bytes) + RUNNER_ALLOWANCE + (1 << 20);
    assert!(streaming(&moe, f.stream_bytes / 2) > budget);
    let server = Server::start_logging(&serve_args(&[&moe], budget, &[]), "info,llama.cpp=error");

    let deadline = Instant::now() + Duration::from_secs(12);
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
    assert_eq!(model["residency"], "streaming", "{ps}");
    // The budget charged the smallest cache of two contexts, and the
    // streamer holds that budget.
    let series = format!("hypura_stream_cache_budget_bytes{{model=\"{MOE}\"}}");
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
