//! The `hypura` binary end to end, on the real SmolLM2 model and on bad files.
#[path = "../common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::smollm2;

fn hypura(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hypura"))
        .args(args)
        .output()
        .expect("run hypura")
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).expect("utf-8 stdout")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn temp_file(name: &str, bytes: &[u8]) -> PathBuf {
    let path = std::env::temp_dir().join(format!("hypura-cli-{}-{name}", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn run_raw_greedy_says_paris() {
    let model = smollm2();
    let out = hypura(&[
        "run",
        model.to_str().unwrap(),
        "--prompt",
        "The capital of France is",
        "--raw",
        "--temperature",
        "0",
        "--max-tokens",
        "8",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).starts_with(" Paris."), "{:?}", stdout(&out));
    assert!(stderr(&out).contains("tok/s"), "{}", stderr(&out));
}

#[test]
fn run_json_reports_text_tokens_and_stats() {
    let model = smollm2();
    let out = hypura(&[
        "run",
        model.to_str().unwrap(),
        "--prompt",
        "What is the capital of Germany?",
        "--temperature",
        "0",
        "--max-tokens",
        "64",
        "--json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("one JSON object");
    assert_eq!(v["text"], "The capital of Germany is Berlin.");
    assert_eq!(v["stats"]["finish_reason"], "stop");
    let tokens = v["tokens"].as_array().unwrap();
    assert_eq!(tokens.len() as u64, v["generated_tokens"].as_u64().unwrap());
    // The chat template's prompt: system + user turns of SmolLM2's ChatML.
    assert!(v["prompt_tokens"].as_u64().unwrap() > 20);
    assert_eq!(v["stats"]["mode"], "full-resident");
    assert!(v["stats"]["tokens_per_second"].as_f64().unwrap() > 0.0);
}

#[test]
fn interactive_keeps_history() {
    use std::io::Write;
    let model = smollm2();
    let mut child = Command::new(env!("CARGO_BIN_EXE_hypura"))
        .args([
            "run",
            model.to_str().unwrap(),
            "--interactive",
            "--temperature",
            "0",
            "--max-tokens",
            "48",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"My name is Zorblax.\nWhat is my name?\n/bye\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    // Two replies; the second turn's prompt holds the whole first exchange.
    let err = stderr(&out);
    let prompts: Vec<u64> = err
        .lines()
        .filter_map(|l| l.split("prompt: ").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    let generated: Vec<u64> = err
        .lines()
        .filter_map(|l| {
            l.split("generated: ")
                .nth(1)?
                .split(' ')
                .next()?
                .parse()
                .ok()
        })
        .collect();
    assert_eq!(prompts.len(), 2, "{err}");
    assert!(prompts[1] > prompts[0] + generated[0], "{err}");
    assert!(!stdout(&out).trim().is_empty());
}

#[test]
fn inspect_json_roles_sum_to_tensor_bytes() {
    let model = smollm2();
    let out = hypura(&["inspect", model.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(&stdout(&out)).unwrap();
    assert_eq!(v["architecture"], "llama");
    assert_eq!(v["file_bytes"], 98_362_432u64);
    assert!(v["experts"].is_null());
    let roles = v["roles"].as_object().unwrap();
    let sum: u64 = roles.values().map(|b| b.as_u64().unwrap()).sum();
    assert_eq!(sum, v["tensor_bytes"].as_u64().unwrap());
    assert!(roles["attention"].as_u64().unwrap() > 0);
    assert!(roles["ffn"].as_u64().unwrap() > 0);
    assert_eq!(roles["experts"], 0);
}

#[test]
fn inspect_table_names_the_architecture() {
    let out = hypura(&["inspect", smollm2().to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains("llama"));
}

#[test]
fn bad_files_give_clear_errors_and_exit_1() {
    let missing = std::env::temp_dir().join("hypura-cli-does-not-exist.gguf");
    let not_gguf = temp_file("not.gguf", b"this is not a model, just some text\n");
    let full = std::fs::read(smollm2()).unwrap();
    let truncated = temp_file("truncated.gguf", &full[..full.len() / 2]);
    let cases: [(&Path, &str); 3] = [
        (&missing, "does not exist"),
        (&not_gguf, "not a GGUF"),
        (&truncated, "truncated"),
    ];
    for (path, needle) in cases {
        for cmd in [
            vec!["inspect", path.to_str().unwrap()],
            vec![
                "run",
                path.to_str().unwrap(),
                "--prompt",
                "hi",
                "--max-tokens",
                "1",
            ],
        ] {
            let out = hypura(&cmd);
            assert_eq!(out.status.code(), Some(1), "{cmd:?}: {}", stderr(&out));
            let err = stderr(&out);
            assert!(
                err.to_lowercase().contains(&needle.to_lowercase()),
                "{cmd:?}: {err}"
            );
            assert!(!err.contains("panicked"), "{err}");
        }
    }
    std::fs::remove_file(not_gguf).ok();
    std::fs::remove_file(truncated).ok();
}

#[test]
fn absurd_options_are_rejected_before_loading() {
    let model = smollm2();
    let out = hypura(&[
        "run",
        model.to_str().unwrap(),
        "--prompt",
        "hi",
        "--top-p=-1",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("top_p"), "{}", stderr(&out));
}

#[test]
fn serve_refuses_more_slots_than_a_context_holds() {
    let model = smollm2();
    let model = model.to_str().unwrap();
    let out = hypura(&["serve", model, "--port", "0", "--idle-slots", "300"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--idle-slots"), "{}", stderr(&out));
    let out = hypura(&[
        "serve",
        model,
        "--port",
        "0",
        "--parallel",
        "200",
        "--idle-slots",
        "100",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("at most 256 slots in all"),
        "{}",
        stderr(&out)
    );
}

/// `GOMP_SPINCOUNT` in the environment of the running process `pid`, once
/// it has one (within 20 s), else `None`.
fn spin_count_of(pid: u32) -> Option<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while std::time::Instant::now() < deadline {
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let found = environ
            .split(|&b| b == 0)
            .find_map(|kv| kv.strip_prefix(b"GOMP_SPINCOUNT="))
            .map(|v| String::from_utf8_lossy(v).into_owned());
        if found.is_some() {
            return found;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    None
}

/// libgomp reads its spin count as it loads: hypura starts again with a
/// short one (`cli::threads::OPENMP_SPIN_COUNT`), as the same process,
/// unless the user set one, which stays.
#[test]
fn hypura_runs_with_a_short_openmp_spin_unless_the_user_set_one() {
    use std::io::Write;
    let model = smollm2();
    for (set, expected) in [(None, "3000"), (Some("12345"), "12345")] {
        let mut command = Command::new(env!("CARGO_BIN_EXE_hypura"));
        command
            .args([
                "run",
                model.to_str().unwrap(),
                "--interactive",
                "--max-tokens",
                "1",
            ])
            .env_remove("GOMP_SPINCOUNT")
            .env_remove("OMP_WAIT_POLICY")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped());
        if let Some(v) = set {
            command.env("GOMP_SPINCOUNT", v);
        }
        let mut child = command.spawn().unwrap();
        let seen = spin_count_of(child.id());
        // The same process (pid) runs on, and answers.
        child.stdin.take().unwrap().write_all(b"/bye\n").unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        assert_eq!(seen.as_deref(), Some(expected), "{}", stderr(&out));
    }
}
