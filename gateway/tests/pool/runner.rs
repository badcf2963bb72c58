//! Runner processes under a live `hypura serve` with two models (SmolLM2
//! under two names, two files, so two runners): a runner crash ends only its
//! model's in-flight requests, with an error in each dialect, is logged with
//! the runner's last stderr lines, and the model answers again on its next
//! request; the other model never notices. Runners die with the server.
#[path = "../common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::time::Duration;

use common::{client, ndjson, wait_until, Server, MODEL};
use serde_json::{json, Value};

const TWIN: &str = "smollm2-twin:latest";

/// A second file holding SmolLM2 (a hard link, else a copy), so that it
/// is served as a second model in a runner of its own.
fn twin_file(dir: &std::path::Path) -> PathBuf {
    let twin = dir.join("smollm2-twin.gguf");
    let _ = std::fs::remove_file(&twin);
    if std::fs::hard_link(common::smollm2(), &twin).is_err() {
        std::fs::copy(common::smollm2(), &twin).unwrap();
    }
    twin
}

fn start(dir: &std::path::Path) -> Server {
    // Inherited by the server and its runners: the abort route and command.
    std::env::set_var("HYPURA_RUNNER_TEST_HOOKS", "1");
    Server::start_with(&[
        "serve".into(),
        common::smollm2().to_string_lossy().into_owned(),
        twin_file(dir).to_string_lossy().into_owned(),
        "--port".into(),
        "0".into(),
        "--parallel".into(),
        "2".into(),
    ])
}

fn greedy_text(server: &Server, model: &str) -> String {
    let reply = server.post_json(
        "/api/generate",
        json!({"model": model, "prompt": "The capital of France is", "raw": true,
               "stream": false, "options": {"temperature": 0, "num_predict": 8}}),
        200,
    );
    reply["response"].as_str().unwrap().to_string()
}

/// A long streamed generation, its first line (or event) read.
fn open_stream(server: &Server, path: &str, body: Value) -> BufReader<reqwest::blocking::Response> {
    let response = client().post(server.url(path)).json(&body).send().unwrap();
    assert_eq!(response.status(), 200, "{path}");
    let mut reader = BufReader::new(response);
    let mut first = String::new();
    reader.read_line(&mut first).unwrap();
    assert!(!first.trim().is_empty(), "{path}: a first chunk");
    reader
}

fn rest(mut reader: BufReader<reqwest::blocking::Response>) -> String {
    let mut rest = String::new();
    reader.read_to_string(&mut rest).unwrap();
    rest
}

/// Child processes of `pid` (its runners).
fn children(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .flatten()
    {
        let list = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        out.extend(
            list.split_whitespace()
                .filter_map(|p| p.parse::<u32>().ok()),
        );
    }
    out
}

fn alive(pid: u32) -> bool {
    // A zombie (exited, not yet reaped) counts as gone.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| !stat.split(") ").nth(1).unwrap_or("").starts_with('Z'))
}

#[test]
fn a_runner_crash_ends_only_its_requests_and_the_model_comes_back() {
    let dir = std::env::temp_dir().join(format!("hypura-runner-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let server = start(&dir);
    let before = greedy_text(&server, MODEL);
    let twin_before = greedy_text(&server, TWIN);
    assert!(before.starts_with(" Paris"), "{before:?}");
    assert_eq!(twin_before, before, "the same file under two names");
    assert_eq!(children(server.pid()).len(), 2, "one runner per model");

    // Two long streams on the model about to crash (one per dialect) and one
    // on the other model.
    let long = |n: u32| json!({"temperature": 0, "num_predict": n});
    let ollama = open_stream(
        &server,
        "/api/generate",
        json!({"model": MODEL, "prompt": "1, 2, 3, 4, 5,", "raw": true, "options": long(3000)}),
    );
    let openai = open_stream(
        &server,
        "/v1/completions",
        json!({"model": MODEL, "stream": true, "max_tokens": 3000, "temperature": 0,
               "prompt": "1, 2, 3, 4, 5,"}),
    );
    let other = open_stream(
        &server,
        "/api/generate",
        json!({"model": TWIN, "prompt": "1, 2, 3, 4, 5,", "raw": true, "options": long(64)}),
    );

    let aborted = server.post_json("/api/debug/abort-runner", json!({"model": MODEL}), 200);
    assert_eq!(aborted["aborted"], MODEL);

    // Ollama: the stream ends with an error line, never `done`.
    let lines = ndjson(&rest(ollama));
    let last = lines.last().unwrap();
    let message = last["error"].as_str().unwrap_or_else(|| panic!("{last}"));
    assert!(message.contains("runner process"), "{message}");
    assert!(
        message.contains("reloaded on the next request"),
        "{message}"
    );
    assert!(lines.iter().all(|l| l["done"] != true));
    // OpenAI: an error event, then [DONE].
    let events = common::sse(rest(openai).trim_start());
    assert_eq!(events.last().unwrap(), "[DONE]");
    let error: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(error["error"]["type"], "api_error", "{error}");
    let message = error["error"]["message"].as_str().unwrap();
    assert!(message.contains("runner process"), "{message}");

    // The other model went on during the crash, and answers after it.
    let lines = ndjson(&rest(other));
    let last = lines.last().unwrap();
    assert_eq!(last["done"], true, "{last}");
    assert_eq!(last["eval_count"], 64, "{last}");
    assert_eq!(greedy_text(&server, TWIN), twin_before);

    // The crashed model is back on its next request, with the same tokens.
    assert_eq!(greedy_text(&server, MODEL), before);
    assert_eq!(children(server.pid()).len(), 2, "a new runner replaced it");

    // `/metrics` counts the crash against its model only.
    let metrics = server.get("/metrics").text().unwrap();
    let crashes = |model: &str| {
        let series = format!("hypura_runner_crashes_total{{model=\"{model}\"}} ");
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .unwrap_or_else(|| panic!("no {series}in:\n{metrics}"))
            .to_string()
    };
    assert_eq!(crashes(MODEL), "1");
    assert_eq!(crashes(TWIN), "0");

    // The crash is logged with the runner's last stderr lines.
    let log = server.log();
    let report = log
        .split_once(&format!("the runner of {MODEL} (pid "))
        .map(|(_, r)| r)
        .unwrap_or_else(|| panic!("no crash report:\n{log}"));
    assert!(
        report.contains("crashed: killed by signal 6 (SIGABRT)"),
        "{report}"
    );
    assert!(
        report.contains("  | hypura runner: aborting on the test hook's request"),
        "the stderr tail: {report}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn runners_die_with_the_server() {
    let dir = std::env::temp_dir().join(format!("hypura-runner-kill-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut server = start(&dir);
    greedy_text(&server, MODEL);
    greedy_text(&server, TWIN);
    let runners = children(server.pid());
    assert_eq!(runners.len(), 2);
    // SIGKILL leaves the server no time to stop them: the kernel does.
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &server.pid().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    server.wait(Duration::from_secs(10));
    wait_until(Duration::from_secs(10), "the runners are gone", || {
        runners.iter().all(|&pid| !alive(pid))
    });
    std::fs::remove_dir_all(&dir).ok();
}

fn signal(pid: u32, name: &str) {
    let sent = std::process::Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(sent.success(), "kill -{name} {pid}");
}

/// A runner that stops answering (here `SIGSTOP`ped, as a wedged llama.cpp
/// or an endless render would leave it) is found by the heartbeat, killed
/// and replaced: its in-flight request ends with an error saying so, the
/// server answers meanwhile, and the model's next request runs in a new
/// runner with the same tokens.
#[test]
fn a_stopped_runner_is_killed_and_replaced() {
    let server = Server::start(&["--parallel", "2"]);
    let before = greedy_text(&server, MODEL);
    let runners = children(server.pid());
    assert_eq!(runners.len(), 1, "one runner");
    let wedged = runners[0];

    let stream = open_stream(
        &server,
        "/api/generate",
        json!({"model": MODEL, "prompt": "1, 2, 3, 4, 5,", "raw": true,
               "options": {"temperature": 0, "num_predict": 3000}}),
    );
    signal(wedged, "STOP");
    // The server answers while its runner does not, from what it said last.
    let ps = server.get("/api/ps");
    assert_eq!(ps.status(), 200);
    let ps: Value = ps.json().unwrap();
    assert_eq!(ps["models"][0]["name"], MODEL, "{ps}");

    // The stream ends with an error line once the watchdog killed it.
    let lines = ndjson(&rest(stream));
    let last = lines.last().unwrap();
    let message = last["error"].as_str().unwrap_or_else(|| panic!("{last}"));
    assert_eq!(
        message,
        format!(
            "the runner process of model '{MODEL}' stopped answering and was killed: this \
             request was ended; the model is reloaded on the next request"
        )
    );
    assert!(lines.iter().all(|l| l["done"] != true));
    // Failed first, then killed.
    wait_until(
        Duration::from_secs(10),
        "the stopped runner is gone",
        || !alive(wedged),
    );

    // The next request loads it in a new runner, with the same tokens.
    assert_eq!(greedy_text(&server, MODEL), before);
    let runners = children(server.pid());
    assert_eq!(runners.len(), 1, "{runners:?}");
    assert_ne!(runners[0], wedged);
    assert_eq!(
        server.metric(&format!(
            "hypura_runner_crashes_total{{model=\"{MODEL}\"}} "
        )),
        Some(1.0)
    );
    let log = server.log();
    assert!(
        log.contains(&format!(
            "the runner of {MODEL} (pid {wedged}) has not answered for"
        )),
        "{log}"
    );
}
