//! The live status page (`/status`) in headless Chromium against a running
//! gateway with two models under one RAM budget (one fully resident, one
//! streamed): the page's script fills a row per model from `/api/status`,
//! and every number shown is what `/api/ps` says. `GET /` still answers
//! Ollama's "Ollama is running".
//!
//! Needs `chromium` (`scripts/install-deps.sh --test`). With
//! `HYPURA_STATUS_SCREENSHOT=<file.png>` the screenshot is kept there
//! (`docs/status.png` is made so).
#[path = "../common/mod.rs"]
mod common;

use std::process::Command;
use std::time::Duration;

use common::charges::{contexts, serve_args, RUNNER_ALLOWANCE};
use common::{Server, MODEL};
use hypura_gguf::GgufFile;
use hypura_synth as synth;
use llama_tiered::tiered::footprint::StreamFootprint;
use llama_tiered::tiered::Mode;
use serde_json::{json, Value};

/// Chromium, headless, as root (no sandbox), with `args`; its stdout.
fn chromium(args: &[String]) -> String {
    let profile = std::env::temp_dir().join(format!("hypura-chromium-{}", std::process::id()));
    let output = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            "--no-first-run",
            "--window-size=1400,420",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .output()
        .expect("chromium is not installed: run scripts/install-deps.sh --test");
    assert!(
        output.status.success(),
        "chromium failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The `data-value` of every cell of the row for `model` in the page's DOM.
fn row(dom: &str, model: &str) -> Option<std::collections::BTreeMap<String, String>> {
    let start = dom.find(&format!("data-name=\"{model}\""))?;
    let end = dom[start..].find("</tr>").map_or(dom.len(), |e| start + e);
    let row = &dom[start..end];
    let mut cells = std::collections::BTreeMap::new();
    for cell in row.split("<td ").skip(1) {
        let attr = |name: &str| {
            let at = cell.find(&format!("{name}=\""))? + name.len() + 2;
            let len = cell[at..].find('"')?;
            Some(cell[at..at + len].replace("&amp;", "&"))
        };
        if let (Some(field), Some(value)) = (attr("data-field"), attr("data-value")) {
            cells.insert(field, value);
        }
    }
    Some(cells)
}

fn number(text: &str) -> f64 {
    text.parse()
        .unwrap_or_else(|_| panic!("a number: {text:?}"))
}

#[test]
fn the_status_page_shows_each_model_as_api_ps_does() {
    let hot_path = common::smollm2();
    let dir = std::env::temp_dir().join(format!("hypura-status-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cold_path = synth::cached::link_into(
        &synth::cached::derived_moe(&hot_path, 16, 2, 0.01, 7).unwrap(),
        &dir,
        "smollm2-moe.gguf",
    )
    .unwrap();
    let hot = StreamFootprint::of(&GgufFile::open(&hot_path).unwrap());
    let cold = StreamFootprint::of(&GgufFile::open(&cold_path).unwrap());
    // Room for the hot one in full, then the cold one streaming only,
    // each beside its runner: the cold one never needs the hot one's room.
    let budget = hot.resident_bytes
        + hot.stream_bytes
        + contexts(&hot_path, Mode::FullResident)
        + cold.resident_bytes
        + cold.minimum_cache_bytes
        + contexts(&cold_path, cold.mode)
        + 2 * RUNNER_ALLOWANCE
        + (1 << 20);
    let server = Server::start_with(&serve_args(&[&hot_path, &cold_path], budget, &[]));
    let cold_name = "smollm2-moe:latest";
    for model in [MODEL, cold_name] {
        let body = json!({"model": model, "prompt": "The capital of France is", "raw": true,
                          "stream": false, "options": {"temperature": 0, "num_predict": 16}});
        server.post_json("/api/generate", body, 200);
    }
    assert_eq!(server.get("/").text().unwrap(), "Ollama is running");

    // The page's script fetched /api/status and drew both rows.
    let url = server.url("/status");
    let dom = chromium(&[
        "--virtual-time-budget=3000".into(),
        "--dump-dom".into(),
        url.clone(),
    ]);
    let ps: Value = server.get("/api/ps").json().unwrap();
    let models = ps["models"].as_array().unwrap();
    assert_eq!(models.len(), 2, "{ps}");
    for model in models {
        let name = model["name"].as_str().unwrap();
        let cells = row(&dom, name).unwrap_or_else(|| panic!("no row for {name} in:\n{dom}"));
        assert_eq!(
            cells["residency"],
            model["residency"].as_str().unwrap(),
            "{name}"
        );
        for tier in ["gpu", "ram", "stream"] {
            assert_eq!(
                number(&cells[tier]),
                model["tier_bytes"][tier].as_f64().unwrap(),
                "{name} {tier}"
            );
        }
        let slots = &model["slots"];
        assert_eq!(number(&cells["active"]), slots["active"].as_f64().unwrap());
        assert_eq!(number(&cells["queued"]), slots["queued"].as_f64().unwrap());
        let rate = slots["decode_tokens_per_second"].as_f64().unwrap();
        assert!((number(&cells["tokens_per_second"]) - rate).abs() < 1e-9 * rate.max(1.0));
    }
    let cold_row = row(&dom, cold_name).unwrap();
    assert_eq!(cold_row["residency"], "streaming");
    let hit_rate = number(&cold_row["hit_rate"]);
    assert!((0.0..=1.0).contains(&hit_rate), "{hit_rate}");
    assert!(number(&cold_row["nvme_gbps"]) > 0.0, "{cold_row:?}");
    // The page's streaming numbers are /api/status's counters.
    let status: Value = server.get("/api/status").json().unwrap();
    let reported = status["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == cold_name)
        .unwrap()["streaming"]
        .clone();
    let hits = reported["expert_hits"].as_f64().unwrap();
    let misses = reported["expert_misses"].as_f64().unwrap();
    assert!((hit_rate - hits / (hits + misses)).abs() < 1e-12);
    let gbps = reported["nvme_bytes_read"].as_f64().unwrap()
        / reported["read_seconds"].as_f64().unwrap()
        / 1e9;
    assert!((number(&cold_row["nvme_gbps"]) - gbps).abs() < 1e-9 * gbps.max(1.0));

    let shot = dir.join("status.png");
    chromium(&[
        "--virtual-time-budget=3000".into(),
        format!("--screenshot={}", shot.display()),
        url,
    ]);
    let png = std::fs::read(&shot).expect("a screenshot");
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 10_000,
        "{} bytes",
        png.len()
    );
    if let Some(keep) = std::env::var_os("HYPURA_STATUS_SCREENSHOT") {
        std::fs::copy(&shot, keep).unwrap();
    }
    std::thread::sleep(Duration::from_millis(10));
    std::fs::remove_dir_all(&dir).ok();
}
