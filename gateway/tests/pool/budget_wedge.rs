//! Several models under one RAM budget (issue 29, item 1): `hypura serve DIR
//! --context 1024 --parallel 2 --ram-budget 520MiB` with SmolLM2 and two
//! small synthetic models. Every request is answered within 10 s of its
//! model's load time (idle models yield their memory at once; a request
//! waits only for work running), `keep_alive: 0` unloads, the model comes
//! back on its next request, and a model the budget can never hold stays
//! listed and is refused naming the least it needs.
#[path = "../common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{client, wait_until, Server};
use hypura_synth::{cached, SynthSpec};
use serde_json::{json, Value};

const SMOLLM2: &str = "smollm2:latest";
const TINYLLAMA: &str = "tinyllama:latest";
const TINYMOE: &str = "tinymoe:latest";
/// The bound on a request's wait beyond its own model's load.
const WAIT_BOUND: Duration = Duration::from_secs(10);

/// SmolLM2 and the synthetic models of the issue (`hypura-synth dense
/// --preset tiny-llama --layers 24`, `moe --preset tiny-mixtral --layers
/// 24`) in a directory of their own.
fn models_dir(test: &str) -> PathBuf {
    let dir =
        std::env::temp_dir().join(format!("hypura-budget-wedge-{test}-{}", std::process::id()));
    let tiny = cached::model(&SynthSpec::tiny_llama().with_layers(24)).unwrap();
    let moe = cached::model(&SynthSpec::tiny_mixtral().with_layers(24)).unwrap();
    cached::link_into(&common::smollm2(), &dir, "smollm2.gguf").unwrap();
    cached::link_into(&tiny, &dir, "tinyllama.gguf").unwrap();
    cached::link_into(&moe, &dir, "tinymoe.gguf").unwrap();
    dir
}

fn serve(dir: &std::path::Path, ram_budget: &str) -> Server {
    let args: Vec<String> = [
        "serve",
        dir.to_str().unwrap(),
        "--port",
        "0",
        "--context",
        "1024",
        "--parallel",
        "2",
        "--ram-budget",
        ram_budget,
    ]
    .map(String::from)
    .to_vec();
    Server::start_logging(&args, "info,llama.cpp=error")
}

/// One generation: its status, its reply, and how long it took.
fn generate(server: &Server, model: &str, extra: Value) -> (u16, Value, Duration) {
    let mut body = json!({
        "model": model,
        "prompt": "The capital of France is",
        "raw": true,
        "stream": false,
        "options": {"temperature": 0, "num_predict": 8}
    });
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    let started = Instant::now();
    let reply = client()
        .post(server.url("/api/generate"))
        .json(&body)
        .send()
        .unwrap();
    let status = reply.status().as_u16();
    let reply: Value = reply.json().unwrap_or(Value::Null);
    (status, reply, started.elapsed())
}

/// A generation's parts, in seconds: from arrival to admission (waiting
/// for room, then loading: Ollama's `load_duration`), and the work itself.
struct Answered {
    admitted: f64,
    work: f64,
    took: f64,
}

/// Asserts a generation answered; its times.
fn answered(model: &str, (status, reply, took): (u16, Value, Duration)) -> Answered {
    assert_eq!(status, 200, "{model}: {reply}");
    let seconds = |key: &str| reply[key].as_u64().unwrap_or(0) as f64 / 1e9;
    let answered = Answered {
        admitted: seconds("load_duration"),
        work: seconds("prompt_eval_duration") + seconds("eval_duration"),
        took: took.as_secs_f64(),
    };
    eprintln!(
        "{model}: answered in {:.2} s, admitted (waited and loaded) in {:.2} s",
        answered.took, answered.admitted
    );
    answered
}

/// A long streamed generation of `model`, once it is generating: the
/// model stays busy until the reader is dropped (the client goes away).
fn hold(server: &Server, model: &str) -> impl std::io::BufRead {
    let body = json!({
        "model": model,
        "prompt": "Once upon a time",
        "raw": true,
        "stream": true,
        "options": {"temperature": 0, "num_predict": 1000}
    });
    let reply = client()
        .post(server.url("/api/generate"))
        .json(&body)
        .send()
        .unwrap();
    assert_eq!(reply.status(), 200, "{model}");
    let mut reader = std::io::BufReader::new(reply);
    let mut first = String::new();
    std::io::BufRead::read_line(&mut reader, &mut first).unwrap();
    assert!(first.contains("\"done\":false"), "{model}: {first}");
    reader
}

fn ps(server: &Server) -> Value {
    client()
        .get(server.url("/api/ps"))
        .send()
        .unwrap()
        .json()
        .unwrap()
}

fn listed_in_ps(server: &Server, model: &str) -> bool {
    ps(server)["models"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["name"] == model)
}

#[test]
fn three_models_under_520_mib_all_answer_within_their_load_time_and_unload_on_keep_alive_0() {
    let dir = models_dir("520");
    let server = serve(&dir, "520MiB");
    let all = [TINYLLAMA, TINYMOE, SMOLLM2];

    // One request to each in turn: the last one finds the others idle and
    // waits for nothing but its own load.
    for model in all {
        let a = answered(model, generate(&server, model, json!({})));
        assert!(
            a.admitted <= WAIT_BOUND.as_secs_f64(),
            "{model}: admitted after {:.2} s",
            a.admitted
        );
    }

    // Two requests to each at once: a request waits at most for the work
    // running in other models (they drain), then its own load.
    let replies: Vec<(&str, Answered)> = std::thread::scope(|s| {
        let handles: Vec<_> = all
            .iter()
            .chain(all.iter())
            .map(|&model| {
                let server = &server;
                s.spawn(move || (model, answered(model, generate(server, model, json!({})))))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let longest_work = replies.iter().map(|(_, a)| a.work).fold(0.0, f64::max);
    for (model, a) in &replies {
        assert!(
            a.admitted <= longest_work + WAIT_BOUND.as_secs_f64(),
            "{model}: admitted after {:.2} s; the longest work {longest_work:.2} s",
            a.admitted
        );
        assert!(a.took >= a.work);
    }
    let waiting = &ps(&server)["waiting"];
    assert_eq!(waiting["total"], 0, "{waiting}");

    // keep_alive 0 unloads each model; each comes back when asked for again.
    for model in all {
        let (status, reply, _) = generate(&server, model, json!({"keep_alive": 0}));
        assert_eq!(status, 200, "{reply}");
        wait_until(Duration::from_secs(10), "the model unloaded", || {
            !listed_in_ps(&server, model)
        });
    }

    assert_eq!(ps(&server)["waiting"]["total"], 0);

    for model in all {
        let a = answered(model, generate(&server, model, json!({})));
        assert!(
            a.admitted <= WAIT_BOUND.as_secs_f64(),
            "{model}: {:.2} s",
            a.admitted
        );
        assert!(listed_in_ps(&server, model));
    }
    let log = server.log();
    assert!(!log.contains("ERROR"), "{log}");
    drop(server);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_model_the_budget_can_never_hold_stays_listed_and_is_refused_naming_its_minimum() {
    let dir = models_dir("200");
    let server = serve(&dir, "200MiB");
    // The least SmolLM2 needs, as the plan line says it.
    let log = server.log();
    let least = log
        .lines()
        .find(|l| l.contains("placement of smollm2:latest (alone under the budgets"))
        .and_then(|l| l.split("at least ").nth(1))
        .and_then(|rest| rest.split(" under the budget").next())
        .unwrap_or_else(|| panic!("a plan line naming the least: {log}"))
        .to_string();

    let tags: Value = client()
        .get(server.url("/api/tags"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let listed = tags["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == SMOLLM2)
        .unwrap_or_else(|| panic!("listed: {tags}"))
        .clone();
    let reason = listed["unavailable"].as_str().unwrap();
    assert!(
        reason.contains(&format!("needs at least {least}")),
        "{reason}"
    );
    for fits in [TINYLLAMA, TINYMOE] {
        let entry = tags["models"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == fits)
            .unwrap();
        assert!(entry.get("unavailable").is_none(), "{entry}");
    }

    let (status, reply, took) = generate(&server, SMOLLM2, json!({}));
    assert_eq!(status, 400, "{reply}");
    let error = reply["error"].as_str().unwrap();
    assert!(
        error.contains(&format!("needs at least {least}")),
        "{error}"
    );
    assert!(took < WAIT_BOUND, "refused at once: {took:?}");
    let status: Value = client()
        .get(server.url("/api/status"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(status["unavailable"][0]["name"], SMOLLM2, "{status}");
    // The models that fit still answer.
    for model in [TINYLLAMA, TINYMOE] {
        answered(model, generate(&server, model, json!({})));
    }
    drop(server);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_request_waiting_for_room_is_counted_on_ps_status_and_metrics() {
    let dir = models_dir("465");
    // SmolLM2 in full (463.5 MiB here) alone.
    let server = serve(&dir, "465MiB");
    // SmolLM2 in full leaves no room for tinyllama: while SmolLM2 is busy,
    // a request for tinyllama waits, visible on /api/ps, /api/status and
    // /metrics, until that work ends.
    let busy = hold(&server, SMOLLM2);
    std::thread::scope(|s| {
        let server = &server;
        let waiter = s.spawn(move || answered(TINYLLAMA, generate(server, TINYLLAMA, json!({}))));
        wait_until(Duration::from_secs(60), "a request seen waiting", || {
            ps(server)["waiting"]["total"] == 1
        });
        let waiting = ps(server)["waiting"].clone();
        assert_eq!(
            waiting,
            json!({"total": 1, "models": [{"name": TINYLLAMA, "requests": 1}]})
        );
        let status: Value = client()
            .get(server.url("/api/status"))
            .send()
            .unwrap()
            .json()
            .unwrap();
        assert_eq!(status["waiting"], waiting);
        let metrics = client()
            .get(server.url("/metrics"))
            .send()
            .unwrap()
            .text()
            .unwrap();
        let gauge = format!("hypura_budget_waiting_requests{{model=\"{TINYLLAMA}\"}} 1");
        assert!(metrics.contains(&gauge), "{metrics}");
        drop(busy);
        waiter.join().unwrap();
    });
    assert_eq!(ps(&server)["waiting"]["total"], 0);
    drop(server);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_request_held_at_its_models_gate_keeps_the_model_and_goes_before_later_ones() {
    let dir = models_dir("gate");
    // SmolLM2 in full alone, as above.
    let server = serve(&dir, "465MiB");
    // Both of SmolLM2's slots busy: a third request for it waits at its
    // gate, then one for tinyllama waits for SmolLM2's room. Both are
    // waiting requests (the gate's were shown nowhere).
    let busy = [hold(&server, SMOLLM2), hold(&server, SMOLLM2)];
    std::thread::scope(|s| {
        let server = &server;
        let held = s.spawn(move || answered(SMOLLM2, generate(server, SMOLLM2, json!({}))));
        wait_until(Duration::from_secs(60), "the held request seen", || {
            ps(server)["waiting"]["total"] == 1
        });
        let later = s.spawn(move || answered(TINYLLAMA, generate(server, TINYLLAMA, json!({}))));
        wait_until(Duration::from_secs(60), "both seen waiting", || {
            ps(server)["waiting"]["total"] == 2
        });
        let waiting = ps(server)["waiting"].clone();
        assert_eq!(
            waiting,
            json!({"total": 2, "models": [
                {"name": SMOLLM2, "requests": 1},
                {"name": TINYLLAMA, "requests": 1}
            ]})
        );
        let status: Value = client()
            .get(server.url("/api/status"))
            .send()
            .unwrap()
            .json()
            .unwrap();
        assert_eq!(status["waiting"], waiting);
        // SmolLM2's running requests end: the held one came before the
        // one for tinyllama, so it runs on SmolLM2 as loaded (SmolLM2 was
        // unloaded for tinyllama the moment it looked idle, and loaded
        // again for the held request after tinyllama's work).
        drop(busy);
        held.join().unwrap();
        later.join().unwrap();
    });
    let log = server.log();
    let loads = log
        .lines()
        .filter(|l| l.contains("request{") && l.contains("loading smollm2:latest from"))
        .count();
    assert_eq!(loads, 1, "SmolLM2 loaded once: {log}");
    assert_eq!(ps(&server)["waiting"]["total"], 0);
    drop(server);
    std::fs::remove_dir_all(&dir).ok();
}
