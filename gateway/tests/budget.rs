//! One memory budget across two real models in one server: both keep
//! answering, with the same tokens whatever their residency, and the hot one
//! ends fully resident while the cold one streams.
mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{client, wait_until, Server};
use llama_tiered::gguf::GgufFile;
use llama_tiered::synth;
use llama_tiered::tiered::footprint::StreamFootprint;
use serde_json::{json, Value};

const CONTEXT: u64 = 512;
const EMBED_CONTEXT: u64 = 512;

/// RAM the server charges a model (`--parallel 1`): resident weights + KV +
/// stream cache (`cache` = the cache bytes of the residency).
fn charged(f: &StreamFootprint, cache: u64) -> u64 {
    f.resident_bytes + f.kv_bytes_per_token * (CONTEXT + EMBED_CONTEXT) + cache
}

fn footprint(path: &Path) -> StreamFootprint {
    StreamFootprint::of(&GgufFile::open(path).unwrap())
}

fn generate(server: &Server, model: &str) -> String {
    let body = json!({
        "model": model,
        "prompt": "The capital of France is",
        "raw": true,
        "stream": false,
        "options": {"temperature": 0, "num_predict": 8}
    });
    let reply = server.post_json("/api/generate", body, 200);
    reply["response"].as_str().unwrap().to_string()
}

fn ps(server: &Server) -> Vec<Value> {
    let reply: Value = client()
        .get(server.url("/api/ps"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    reply["models"].as_array().unwrap().clone()
}

fn residency(server: &Server, name: &str) -> Option<String> {
    ps(server)
        .into_iter()
        .find(|m| m["name"] == name)
        .map(|m| m["residency"].as_str().unwrap().to_string())
}

#[test]
fn two_models_under_a_budget_that_fits_one_fully_keep_answering_and_the_hot_one_ends_full() {
    let hot_path = common::smollm2();
    let dir = std::env::temp_dir().join(format!("hypura-budget-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cold_path: PathBuf = dir.join("smollm2-moe.gguf");
    synth::derive_moe_from_dense(&hot_path, &cold_path, 4, 2, 0.01, 7).unwrap();
    let (hot, cold) = (footprint(&hot_path), footprint(&cold_path));

    // Room for the hot one in full beside the cold one streaming, not for both in full.
    let budget =
        charged(&hot, hot.stream_bytes) + charged(&cold, cold.minimum_cache_bytes) + (1 << 20);
    assert!(charged(&cold, cold.stream_bytes) + charged(&hot, hot.minimum_cache_bytes) > budget);
    let server = Server::start_with(&[
        "serve".into(),
        hot_path.to_string_lossy().into_owned(),
        cold_path.to_string_lossy().into_owned(),
        "--port".into(),
        "0".into(),
        "--parallel".into(),
        "1".into(),
        "--context".into(),
        CONTEXT.to_string(),
        "--ram-budget".into(),
        budget.to_string(),
    ]);
    let (hot_name, cold_name) = (common::MODEL, "smollm2-moe:latest");

    // The cold model first: it takes what fits.
    let cold_text = generate(&server, cold_name);
    let hot_text = generate(&server, hot_name);
    assert!(hot_text.starts_with(" Paris"), "{hot_text:?}");

    // Traffic on the hot one only, until the policy has moved both.
    wait_until(
        Duration::from_secs(120),
        "the hot model fully resident",
        || {
            assert_eq!(
                generate(&server, hot_name),
                hot_text,
                "same tokens at any residency"
            );
            residency(&server, hot_name).as_deref() == Some("full")
                && residency(&server, cold_name).as_deref() == Some("streaming")
        },
    );
    // The cold one still answers, streaming, with the same tokens as before.
    assert_eq!(generate(&server, cold_name), cold_text);
    for model in ps(&server) {
        let tiers = &model["tier_bytes"];
        let total = tiers["ram"].as_u64().unwrap() + tiers["stream"].as_u64().unwrap();
        let expected = if model["name"] == hot_name {
            &hot
        } else {
            &cold
        };
        assert_eq!(
            total,
            expected.resident_bytes + expected.stream_bytes,
            "{model}"
        );
        if model["name"] == hot_name {
            assert_eq!(tiers["stream"], 0, "nothing left on disk: {model}");
        }
    }
    assert!(!server.log().contains("ERROR"), "{}", server.log());
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_model_that_cannot_stream_within_the_budget_is_refused_at_start_naming_its_minimum() {
    let mut server = std::process::Command::new(env!("CARGO_BIN_EXE_hypura"))
        .args(["serve", common::smollm2().to_str().unwrap(), "--port", "0"])
        .args(["--ram-budget", "1MiB"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = server.wait().unwrap();
    let mut log = String::new();
    std::io::Read::read_to_string(&mut server.stderr.take().unwrap(), &mut log).unwrap();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("needs at least"), "{log}");
}
