//! One memory budget across two real models in one server: both keep
//! answering, with the same tokens whatever their residency, and the hot one
//! ends fully resident (loaded in its full placement, the idle cold one
//! demoted for it at once, or switched to it with requests in flight) while
//! the cold one streams.
#[path = "../common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::charges::{footprint, full, serve_args, streaming, RUNNER_ALLOWANCE};
use common::{client, wait_until, Server};
use hypura_synth as synth;
use serde_json::{json, Value};

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
    // 20 experts: half of them cached leaves room for the hot one in full
    // beside the cold one's smallest cache (two layers: one per decoding context).
    let cold_path: PathBuf = synth::cached::link_into(
        &synth::cached::derived_moe(&hot_path, 20, 2, 0.01, 7).unwrap(),
        &dir,
        "smollm2-moe.gguf",
    )
    .unwrap();
    let (hot, cold) = (footprint(&hot_path), footprint(&cold_path));

    // The cold one loads first, half cached (partial), and leaves the hot
    // one room to stream only; once the cold one is demoted, there is room
    // for the hot one's full placement loaded beside its streaming one
    // (while it switches). Never room for the cold one in full.
    let hot_streaming = streaming(&hot_path, hot.minimum_cache_bytes);
    let cold_partial = streaming(&cold_path, cold.stream_bytes / 2);
    let cold_streaming = streaming(&cold_path, cold.minimum_cache_bytes);
    // Each model's runner process is charged too (its idle RSS, measured
    // by the server at start): room for two, up to RUNNER_ALLOWANCE each.
    let runners = 2 * RUNNER_ALLOWANCE;
    let budget = cold_partial + hot_streaming + runners + (1 << 20);
    assert!(full(&hot_path) + cold_partial > budget);
    // While the hot one switches, both its placements are charged (and its runner twice).
    assert!(full(&hot_path) + hot_streaming + cold_streaming + 3 * RUNNER_ALLOWANCE < budget);
    assert!(full(&cold_path) > budget);
    // Info logs show the switch of placement.
    let server = Server::start_logging(
        &serve_args(&[&hot_path, &cold_path], budget, &[]),
        "info,llama.cpp=error",
    );
    let (hot_name, cold_name) = (common::MODEL, "smollm2-moe:latest");
    let idle_runner_mib: u64 = server
        .log()
        .split_once("an idle runner holds ")
        .and_then(|(_, rest)| rest.split(' ').next()?.parse().ok())
        .expect("the server logs its runners' overhead");
    assert!(
        idle_runner_mib << 20 < RUNNER_ALLOWANCE,
        "{idle_runner_mib} MiB"
    );

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
    let log = server.log();
    assert!(!log.contains("ERROR"), "{log}");
    let full = format!("placement of {hot_name} (full)");
    assert!(
        log.contains("now in its full placement") || log.contains(&full),
        "in its full placement: {log}"
    );
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
