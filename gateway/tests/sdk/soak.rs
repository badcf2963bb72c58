//! `scripts/soak.py`, short: the soak runs against this build (two models
//! under a budget, clients of every kind, two injected runner crashes,
//! residency moves, the attack corpus of issue 30 meanwhile) and passes;
//! its report counts what it injected.
#[path = "../common/mod.rs"]
mod common;

use std::process::Command;

use hypura_synth as synth;
use serde_json::Value;

#[test]
fn a_short_soak_passes_and_reports_what_it_injected() {
    let dir = std::env::temp_dir().join(format!("hypura-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let smol = common::smollm2();
    let moe = synth::cached::link_into(
        &synth::cached::derived_moe(&smol, 8, 2, 0.01, 7).unwrap(),
        &dir,
        "smollm2-moe.gguf",
    )
    .unwrap();
    let report = dir.join("soak.json");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/soak.py");
    let output = Command::new("python3")
        .arg(script)
        .args(["--bin", env!("CARGO_BIN_EXE_hypura")])
        .arg("--model")
        .arg(&smol)
        .arg("--model")
        .arg(&moe)
        .args(["--clients", "3", "--minutes", "0.75", "--phase", "15"])
        .args(["--crash-every", "15", "--demote-after", "5s", "--attacks"])
        .arg("--out")
        .arg(&report)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    let report: Value = serde_json::from_slice(&std::fs::read(&report).unwrap()).unwrap();
    let injected = report["crashes_injected"].as_array().unwrap().len();
    assert!(injected >= 2, "{report}");
    assert_eq!(
        report["runner_crashes_counted"].as_f64().unwrap() as usize,
        injected,
        "{report}"
    );
    assert!(report["requests"].as_u64().unwrap() > 0, "{report}");
    assert_eq!(report["defects"], 0, "{report}");
    let attacks = report["attacks"].as_object().unwrap();
    assert!(attacks.contains_key("ref chain"), "{report}");
    assert_eq!(report["attack_failures"], serde_json::json!({}), "{report}");
    assert_eq!(report["server_rss_back_under_1_5x"], true, "{report}");
    std::fs::remove_dir_all(&dir).ok();
}
