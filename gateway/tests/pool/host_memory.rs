//! A streaming model under `--ram-budget B` keeps its process within B
//! plus the host overhead that `hypura profile` measured: the stream cache
//! is sized from what the rest of the process holds (weights, KV cache,
//! llama.cpp's buffers, the model's metadata), not from the weights alone.
//! The peak is sampled from outside (`VmHWM` of the process doing the
//! work) while `hypura bench` runs, and compared with what it reports.
#[path = "../common/mod.rs"]
mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use hypura_synth as synth;
use serde_json::Value;

const MIB: u64 = 1 << 20;

fn hypura(cache: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_hypura"));
    command
        .env("HYPURA_CACHE_DIR", cache)
        .env("RUST_LOG", "warn,llama.cpp=error");
    command
}

/// A `kB` field of `/proc/PID/status`, in bytes.
fn status_bytes(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|line| {
        let kb = line.strip_prefix(field)?.strip_prefix(':')?;
        Some(kb.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()? * 1024)
    })
}

#[test]
fn a_streaming_run_peaks_within_its_ram_budget_plus_the_stated_overhead() {
    let dir = std::env::temp_dir().join(format!("hypura-host-memory-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // SmolLM2 with 16 experts per layer: 760 MiB of experts to stream.
    let moe = synth::cached::link_into(
        &synth::cached::derived_moe(&common::smollm2(), 16, 2, 0.01, 7).unwrap(),
        &dir,
        "smollm2-moe16.gguf",
    )
    .unwrap();

    // This machine's profile, with the host overhead it reports.
    let profile = hypura(&dir)
        .args(["profile", "--quick", "--json", "--path"])
        .arg(&dir)
        .output()
        .unwrap();
    assert!(
        profile.status.success(),
        "{}",
        String::from_utf8_lossy(&profile.stderr)
    );
    let profile: Value = serde_json::from_slice(&profile.stdout).unwrap();
    let overhead = profile["host_overhead"]["after_devices_bytes"]
        .as_u64()
        .expect("hypura profile reports the host overhead");
    assert!(
        (4 * MIB..64 * MIB).contains(&overhead),
        "{overhead} bytes of overhead on a CPU-only build"
    );

    // A budget of which the stream cache is the largest part.
    let budget = 400 * MIB;
    let mut child = hypura(&dir)
        .arg("bench")
        .arg(&moe)
        .args(["--gpu-budget", "0", "--ram-budget", &budget.to_string()])
        .args([
            "--context",
            "512",
            "--prompt-tokens",
            "16",
            "--tokens",
            "16",
        ])
        .args(["--repetitions", "1", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut peak = 0;
    while child.try_wait().unwrap().is_none() {
        peak = peak.max(status_bytes(pid, "VmHWM").unwrap_or(0));
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let host = &report["host_memory"];
    let cache = report["stream_cache_bytes"].as_u64().unwrap();
    assert_eq!(report["mode"], "expert-streaming", "{report}");
    assert!(cache > budget / 2, "the cache dominates: {report}");
    assert_eq!(host["overhead_bytes"], overhead, "{report}");
    assert_eq!(host["ram_charged_bytes"], budget, "{report}");
    // The planner charged llama.cpp's buffers and the model's metadata.
    assert!(
        host["ram_other_bytes"].as_u64().unwrap() > 4 * MIB,
        "{report}"
    );
    // The cache filled: the bound is tested where it binds.
    let fit = &host["stream_cache_fit"];
    assert!(
        fit["region_bytes"].as_u64().unwrap() > fit["after_bytes"].as_u64().unwrap() * 9 / 10,
        "{report}"
    );
    // Sampled from outside until the process ended, and as the process
    // saw it when it wrote its report.
    let reported = host["peak_rss_bytes"].as_u64().unwrap();
    assert!(
        peak > budget / 2 && reported > budget / 2,
        "{peak} {report}"
    );
    let peak = peak.max(reported);
    assert!(
        peak <= budget + overhead,
        "peak {:.1} MiB over the budget {:.1} MiB + overhead {:.1} MiB: {report}",
        peak as f64 / MIB as f64,
        budget as f64 / MIB as f64,
        overhead as f64 / MIB as f64
    );
    std::fs::remove_dir_all(&dir).ok();
}
