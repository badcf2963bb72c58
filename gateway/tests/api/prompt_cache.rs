//! The prompt cache end to end on SmolLM2: each route reports the tokens
//! it read from the cache, a chat's later turn evaluates only its new
//! tokens and answers as a cold run does, `/metrics` counts it, and a
//! conversation outlives a server restart on disk.
#[path = "../common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::{Server, MODEL};
use serde_json::{json, Value};

/// An agent's system prompt: several hundred tokens.
fn system() -> String {
    (0..30)
        .map(|i| format!("Rule {i}: answer briefly and name the file you read. "))
        .collect()
}

fn cache_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hypura-pc-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::copy(common::h200_profile(), dir.join("profile.json")).unwrap();
    dir
}

fn serve(cache: &std::path::Path, extra: &[&str]) -> Server {
    let mut args: Vec<String> = ["serve", common::smollm2().to_str().unwrap(), "--port", "0"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    Server::start_in(&args, "warn,llama.cpp=error", cache)
}

fn chat(s: &Server, messages: &[Value], cache_prompt: bool) -> Value {
    s.post_json(
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": messages, "temperature": 0, "max_tokens": 12,
               "cache_prompt": cache_prompt}),
        200,
    )
}

fn metric(s: &Server, series: &str) -> f64 {
    s.metric(series)
        .unwrap_or_else(|| panic!("no {series} on /metrics"))
}

#[test]
fn later_turns_read_only_their_new_tokens_on_every_route() {
    let dir = cache_dir("routes");
    let s = serve(&dir, &["--parallel", "2", "--prompt-cache-disk", "0"]);
    let mut messages = vec![json!({"role": "system", "content": system()})];
    let mut previous_prompt = 0;
    for (k, question) in ["Where is the config?", "And the tests?", "Thanks!"]
        .iter()
        .enumerate()
    {
        messages.push(json!({"role": "user", "content": question}));
        let reply = chat(&s, &messages, true);
        let usage = &reply["usage"];
        let prompt = usage["prompt_tokens"].as_u64().unwrap();
        let cached = usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        if k == 0 {
            assert_eq!(cached, 0, "{usage}");
        } else {
            // The whole previous prompt is a prefix of this one.
            assert!(cached >= previous_prompt, "turn {k}: {usage}");
            assert!(cached < prompt, "turn {k}: {usage}");
        }
        // The same answer as a cold run of the same prompt.
        let cold = chat(&s, &messages, false);
        assert_eq!(cold["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
        assert_eq!(
            reply["choices"][0]["message"], cold["choices"][0]["message"],
            "turn {k}"
        );
        messages.push(reply["choices"][0]["message"].clone());
        previous_prompt = prompt;
    }

    // Ollama: prompt_eval_count is what was evaluated, the rest was cached.
    messages.push(json!({"role": "user", "content": "One more thing."}));
    let total = chat(&s, &messages, false)["usage"]["prompt_tokens"]
        .as_u64()
        .unwrap();
    let ollama = s.post_json(
        "/api/chat",
        json!({"model": MODEL, "messages": messages, "stream": false,
               "options": {"temperature": 0, "num_predict": 4}}),
        200,
    );
    let evaluated = ollama["prompt_eval_count"].as_u64().unwrap();
    assert!(evaluated < total / 4, "{evaluated} of {total}");

    // Anthropic: the cached part is cache_read_input_tokens, not input_tokens.
    let anthropic = s.post_json(
        "/v1/messages",
        json!({"model": MODEL, "max_tokens": 4, "system": system(),
               "messages": &messages[1..]}),
        200,
    );
    let usage = &anthropic["usage"];
    let read = usage["cache_read_input_tokens"].as_u64().unwrap();
    let input = usage["input_tokens"].as_u64().unwrap();
    assert!(read >= total - 32, "{usage}");
    assert_eq!(read + input, total, "{usage}");

    // /metrics counts queries and hits in tokens, and slot reuses.
    let model = "model=\"SmolLM2-135M-Instruct.Q4_1:latest\"";
    let hits = metric(&s, &format!("hypura_prefix_cache_hits_total{{{model}}}"));
    let queries = metric(&s, &format!("hypura_prefix_cache_queries_total{{{model}}}"));
    assert!(hits > 0.0 && hits < queries, "{hits} {queries}");
    let slot = metric(
        &s,
        &format!("hypura_prompt_cache_restores_total{{{model},tier=\"slot\"}}"),
    );
    assert!(slot >= 4.0, "{slot}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_conversation_outlives_a_restart_on_disk() {
    let dir = cache_dir("restart");
    let mut messages = vec![
        json!({"role": "system", "content": system()}),
        json!({"role": "user", "content": "Where is the config?"}),
    ];
    let first = {
        let mut s = serve(&dir, &["--parallel", "1"]);
        let reply = chat(&s, &messages, true);
        let killed = std::process::Command::new("kill")
            .args(["-TERM", &s.pid().to_string()])
            .status()
            .unwrap();
        assert!(killed.success());
        assert!(s.wait(Duration::from_secs(60)).success());
        reply
    };
    let files = std::fs::read_dir(dir.join("prompt-cache"))
        .unwrap()
        .flatten()
        .flat_map(|d| std::fs::read_dir(d.path()).unwrap().flatten())
        .filter(|f| f.path().extension().is_some_and(|e| e == "kv"))
        .count();
    assert_eq!(files, 1, "the slot's conversation is written at shutdown");
    messages.push(first["choices"][0]["message"].clone());
    messages.push(json!({"role": "user", "content": "And the tests?"}));
    let s = serve(&dir, &["--parallel", "1"]);
    let reply = chat(&s, &messages, true);
    let cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    let before = first["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(cached >= before, "{reply}");
    let model = "model=\"SmolLM2-135M-Instruct.Q4_1:latest\"";
    let disk = metric(
        &s,
        &format!("hypura_prompt_cache_restores_total{{{model},tier=\"disk\"}}"),
    );
    assert_eq!(disk, 1.0);
    let cold = chat(&s, &messages, false);
    assert_eq!(
        reply["choices"][0]["message"],
        cold["choices"][0]["message"]
    );
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A chat longer than the context: the oldest messages are dropped each
/// turn, so only the system prompt may be shared with the last turn; what
/// is reused still gives the cold run's answer.
#[test]
fn a_truncated_chat_reuses_what_it_shares_and_answers_as_a_cold_run() {
    let dir = cache_dir("truncate");
    let s = serve(
        &dir,
        &[
            "--parallel",
            "1",
            "--context",
            "1024",
            "--prompt-cache-disk",
            "0",
        ],
    );
    let filler = "The river runs past the old mill and the stone bridge. ";
    let mut messages = vec![json!({"role": "system", "content": system()})];
    for i in 0..12 {
        messages
            .push(json!({"role": "user", "content": format!("Note {i}: {}", filler.repeat(3))}));
        messages.push(json!({"role": "assistant", "content": format!("Noted {i}.")}));
    }
    for turn in 0..2 {
        messages.push(json!({"role": "user", "content": format!("Question {turn}?")}));
        let r = s.post(
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": messages, "temperature": 0, "max_tokens": 12}),
        );
        assert_eq!(r.status(), 200);
        assert!(r.headers().get("x-hypura-truncated-messages").is_some());
        let reply: Value = r.json().unwrap();
        let cold = chat(&s, &messages, false);
        assert_eq!(
            reply["choices"][0]["message"],
            cold["choices"][0]["message"]
        );
        if turn == 1 {
            let cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap();
            assert!(cached > 0, "{reply}");
        }
        messages.push(reply["choices"][0]["message"].clone());
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Under a RAM budget the prompt cache is a charge of its own: a model at
/// `full` keeps at most an eighth of the budget in its RAM tier, and the
/// budget's books count it.
#[test]
fn under_a_budget_the_ram_tier_is_charged_and_limited() {
    let dir = cache_dir("budget");
    let s = serve(
        &dir,
        &[
            "--parallel",
            "1",
            "--ram-budget",
            "2GiB",
            "--prompt-cache-disk",
            "0",
        ],
    );
    let mut messages = vec![json!({"role": "system", "content": system()})];
    messages.push(json!({"role": "user", "content": "Where is the config?"}));
    chat(&s, &messages, true);
    let ps = s.get("/api/ps").json::<Value>().unwrap();
    assert_eq!(ps["models"][0]["residency"], "full", "{ps}");
    let model = "model=\"SmolLM2-135M-Instruct.Q4_1:latest\"";
    let eighth = (2u64 << 30) / 8;
    common::wait_until(
        Duration::from_secs(30),
        "the engine's limit is reported",
        || metric(&s, &format!("hypura_prompt_cache_limit_bytes{{{model}}}")) == eighth as f64,
    );
    let charged = metric(&s, "hypura_budget_charged_bytes{tier=\"ram\"}");
    assert!(charged > eighth as f64, "{charged}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn idle_slots_keep_more_conversations_than_decode_at_once_and_are_charged() {
    let dir = cache_dir("idle");
    let no_tiers = ["--prompt-cache-ram", "0", "--prompt-cache-disk", "0"];
    let model = "model=\"SmolLM2-135M-Instruct.Q4_1:latest\"";
    let kv_bytes = |extra: &[&str]| {
        let args: Vec<&str> = ["--parallel", "1", "--ram-budget", "4GiB"]
            .iter()
            .chain(&no_tiers)
            .chain(extra)
            .copied()
            .collect();
        let s = serve(&dir, &args);
        s.post_json(
            "/api/generate",
            json!({"model": MODEL, "prompt": "Hi", "stream": false, "options": {"num_predict": 1}}),
            200,
        );
        let charged = metric(&s, "hypura_budget_charged_bytes{tier=\"ram\"}");
        (s, charged)
    };
    let (_, one_slot) = kv_bytes(&[]);
    let (s, three_slots) = kv_bytes(&["--idle-slots", "2"]);
    // Two more slots' KV cache (SmolLM2 at 4096 tokens: 90 MiB each).
    assert!(
        three_slots - one_slot > 100e6,
        "{one_slot} -> {three_slots}"
    );

    // Three users, each with a system prompt of their own, take turns on
    // one decoding slot: every later turn finds its conversation in a slot.
    let users: Vec<Vec<Value>> = ["Alice", "Bob", "Carol"]
        .iter()
        .map(|name| {
            vec![
                json!({"role": "system", "content": format!("You help {name}. {}", system())}),
                json!({"role": "user", "content": "Where is the config?"}),
            ]
        })
        .collect();
    let mut histories = Vec::new();
    for mut messages in users {
        let reply = chat(&s, &messages, true);
        messages.push(reply["choices"][0]["message"].clone());
        messages.push(json!({"role": "user", "content": "And the tests?"}));
        histories.push((messages, reply["usage"]["prompt_tokens"].as_u64().unwrap()));
    }
    for (messages, first_prompt) in &histories {
        let reply = chat(&s, messages, true);
        let cached = reply["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        assert!(cached >= *first_prompt, "{}", reply["usage"]);
    }
    assert_eq!(
        metric(&s, &format!("hypura_prompt_cache_saves_total{{{model}}}")),
        0.0
    );
    let _ = std::fs::remove_dir_all(&dir);
}
