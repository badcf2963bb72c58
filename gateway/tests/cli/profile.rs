//! `hypura profile` end to end: real (quick) measurements of this machine,
//! cached under a temporary cache directory.
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use hypura_scheduler::profile::{HardwareProfile, PROFILE_VERSION};

/// A fresh directory on the target's volume (a real disk, unlike a tmpfs /tmp).
fn temp_dir(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("profile-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn hypura_profile(cache: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hypura"))
        .arg("profile")
        .arg("--quick")
        .args(args)
        .env("HYPURA_CACHE_DIR", cache)
        .output()
        .expect("run hypura")
}

fn json_profile(cache: &Path, disk: &Path, extra: &[&str]) -> HardwareProfile {
    let mut args = vec!["--json", "--path", disk.to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = hypura_profile(cache, &args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "hypura profile failed: {stderr}");
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not a HardwareProfile ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

fn mem_total_bytes() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let line = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .unwrap();
    let kib: u64 = line
        .trim_start_matches("MemTotal:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kib * 1024
}

fn assert_measured(p: &HardwareProfile, disk: &Path) {
    assert_eq!(p.version, PROFILE_VERSION);
    assert!(!p.host.is_empty());
    assert!(p.measured_at.ends_with('Z'), "{}", p.measured_at);
    assert!(p.cpu.threads >= 1);
    assert!(!p.cpu.model.is_empty());
    assert!(p.cpu.q4k_matvec_gbps > 0.0, "{:?}", p.cpu);
    assert!(p.cpu.q4k_prompt_gflops > 0.0, "{:?}", p.cpu);
    assert_eq!(p.ram.total_bytes, mem_total_bytes());
    assert!(p.ram.available_bytes > 0 && p.ram.available_bytes <= p.ram.total_bytes);
    assert!(p.ram.read_gbps > 0.0, "{:?}", p.ram);
    for g in &p.gpus {
        assert!(g.total_bytes > 0 && g.q4k_matvec_gbps > 0.0, "{g:?}");
        assert!(g.host_to_device_pinned_gbps > 0.0 && g.host_to_device_pageable_gbps > 0.0);
    }
    assert_eq!(
        Path::new(&p.disk.path),
        disk.canonicalize().unwrap(),
        "the disk measured is the --path given"
    );
    assert_eq!(p.disk.reads.len(), 20, "{:?}", p.disk.reads);
    let points: BTreeSet<(u64, u32)> = p
        .disk
        .reads
        .iter()
        .map(|r| (r.block_bytes, r.queue_depth))
        .collect();
    let mut expected = BTreeSet::new();
    for block in [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20] {
        for depth in [1, 4, 16, 32] {
            expected.insert((block, depth));
        }
    }
    assert_eq!(points, expected);
    assert!(
        p.disk.reads.iter().all(|r| r.gbps > 0.0),
        "{:?}",
        p.disk.reads
    );
    // The scratch file written for the reads is gone.
    let left: Vec<_> = std::fs::read_dir(disk).unwrap().collect();
    assert!(left.is_empty(), "left in the disk directory: {left:?}");
}

#[test]
fn profile_is_measured_cached_and_refreshed() {
    let dir = temp_dir("cache");
    let (cache, disk) = (dir.join("cache"), dir.join("disk"));
    std::fs::create_dir_all(&disk).unwrap();

    let first = json_profile(&cache, &disk, &[]);
    assert_measured(&first, &disk);
    let file: HardwareProfile =
        serde_json::from_slice(&std::fs::read(cache.join("profile.json")).unwrap()).unwrap();
    assert_eq!(file, first, "the cache file holds the profile printed");

    // Cached: the very same measurement.
    let second = json_profile(&cache, &disk, &[]);
    assert_eq!(second, first);

    // --refresh measures again.
    let refreshed = json_profile(&cache, &disk, &["--refresh"]);
    assert_measured(&refreshed, &disk);
    assert_ne!(refreshed.measured_at, first.measured_at);
    let third = json_profile(&cache, &disk, &[]);
    assert_eq!(
        third, refreshed,
        "the refreshed profile replaced the cached one"
    );

    // Another disk path is measured anew.
    let other = dir.join("other");
    std::fs::create_dir_all(&other).unwrap();
    let moved = json_profile(&cache, &other, &[]);
    assert_measured(&moved, &other);
    assert_ne!(moved.measured_at, refreshed.measured_at);

    // An older profile version is measured anew.
    let mut old = moved.clone();
    old.version = PROFILE_VERSION + 1;
    std::fs::write(
        cache.join("profile.json"),
        serde_json::to_vec(&old).unwrap(),
    )
    .unwrap();
    let remeasured = json_profile(&cache, &other, &[]);
    assert_eq!(remeasured.version, PROFILE_VERSION);
    assert_ne!(remeasured.measured_at, moved.measured_at);

    // The table shows the cached profile.
    let out = hypura_profile(&cache, &["--path", other.to_str().unwrap()]);
    assert!(out.status.success());
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.contains(&remeasured.measured_at), "{table}");
    assert!(
        table.contains("QD32") && table.contains("16.0 MiB"),
        "{table}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_path_is_an_error_naming_it() {
    let dir = temp_dir("missing");
    let missing = dir.join("no-such-dir");
    let out = hypura_profile(&dir, &["--path", missing.to_str().unwrap()]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no-such-dir"), "{stderr}");
    assert!(!dir.join("profile.json").exists());
    let _ = std::fs::remove_dir_all(&dir);
}
