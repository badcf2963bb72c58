//! The shipped systemd unit (`config/hypura.service`): bounded memory and
//! tasks, restarted on failure, a runner killed for memory not taking the
//! unit down; and `systemd-analyze verify` has nothing to say about it.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

fn unit_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/hypura.service")
}

/// `[section] → key → values` (a key set more than once keeps each value,
/// in order); comments and blank lines skipped.
fn parse_unit(text: &str) -> BTreeMap<String, BTreeMap<String, Vec<String>>> {
    let mut sections: BTreeMap<String, BTreeMap<String, Vec<String>>> = BTreeMap::new();
    let mut section = String::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_string();
            continue;
        }
        let (key, value) = line.split_once('=').expect("key=value");
        assert!(!section.is_empty(), "{line:?} before any section");
        sections
            .entry(section.clone())
            .or_default()
            .entry(key.trim().to_string())
            .or_default()
            .push(value.trim().to_string());
    }
    sections
}

/// systemd's percentage of physical memory (`90%`), as a number.
fn percent(value: &str) -> u32 {
    value
        .strip_suffix('%')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{value:?} is not a percentage"))
}

#[test]
fn the_unit_bounds_memory_and_tasks_and_restarts_on_failure() {
    let unit = parse_unit(&std::fs::read_to_string(unit_path()).unwrap());
    let service = &unit["Service"];
    let one = |key: &str| -> &str {
        let values = service
            .get(key)
            .unwrap_or_else(|| panic!("[Service] sets no {key}"));
        assert_eq!(values.len(), 1, "{key} set more than once: {values:?}");
        &values[0]
    };
    assert_eq!(one("Restart"), "on-failure");
    assert_eq!(one("RestartSec"), "5s");
    // A hard cap with a softer throttle below it, no swap to hide behind.
    let (high, max) = (percent(one("MemoryHigh")), percent(one("MemoryMax")));
    assert!(
        high < max && max < 100,
        "MemoryHigh {high}% MemoryMax {max}%"
    );
    assert_eq!(one("MemorySwapMax"), "0");
    // A runner killed at the cap is the server's to restart: the unit stays.
    assert_eq!(one("OOMPolicy"), "continue");
    let tasks: u32 = one("TasksMax").parse().expect("TasksMax: a number");
    assert_eq!(tasks, 4096);
    // Unchanged by the above: the server still starts as documented.
    assert_eq!(
        one("ExecStart"),
        "/usr/local/bin/hypura serve --host 0.0.0.0 /srv/models"
    );
    assert_eq!(one("KillSignal"), "SIGTERM");
}

#[test]
fn systemd_analyze_verify_is_silent_on_the_unit() {
    let Ok(version) = Command::new("systemd-analyze").arg("--version").output() else {
        eprintln!("systemd-analyze is not installed: only the parse test ran");
        return;
    };
    assert!(version.status.success());
    // verify checks that ExecStart's binary exists: point it at this build.
    let text = std::fs::read_to_string(unit_path())
        .unwrap()
        .replace("/usr/local/bin/hypura", env!("CARGO_BIN_EXE_hypura"));
    let dir = std::env::temp_dir().join(format!("hypura-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("hypura.service");
    std::fs::write(&path, text).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    // Unknown keys and bad values are warnings on stderr, not a failure status.
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "");
}
