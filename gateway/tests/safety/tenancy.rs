//! A box many people share (issue 28), on a real server with SmolLM2 at
//! `--parallel 2` and a keys file made by `hypura keys add`:
//! - a `batch` key with 40 requests queued and two `interactive` keys
//!   sending one request at a time: no batch request gets a slot while an
//!   interactive one waits (the server says so in each response's
//!   `x-hypura-*started-while-waiting` headers), queued batch requests are
//!   overtaken, and all 40 finish;
//! - limits: 429 with `retry-after` and `x-ratelimit-*` in each family's
//!   shape, a reply capped at the key's `max_tokens`, a model outside the
//!   key's globs refused (403);
//! - per-user token counters (`/metrics`, `/api/usage`) equal the tokens
//!   the responses reported;
//! - the keys file read again when it changes, without a restart.
#[path = "../common/mod.rs"]
mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{client, wait_until, Server, MODEL};
use serde_json::{json, Value};

/// `hypura keys add NAME --file PATH EXTRA...`: the key it prints.
fn add_key(file: &Path, name: &str, extra: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_hypura"))
        .args(["keys", "add", name, "--file"])
        .arg(file)
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let key = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(key.starts_with("hyp_"), "{key}");
    key
}

/// This file's tests run one at a time: the fair-queue test's 40 queued
/// requests must not share the machine's cores with the other tests' servers
/// (on two loaded cores its clients ran past their 300 s timeout).
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn keys(args: &[&str], file: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_hypura"))
        .arg("keys")
        .args(args)
        .arg("--file")
        .arg(file)
        .output()
        .unwrap()
}

/// One `/v1/completions` of `max_tokens` with `key`: status, headers, body.
fn complete(
    server: &Server,
    key: &str,
    prompt: &str,
    max_tokens: u32,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let r = client()
        .post(server.url("/v1/completions"))
        .bearer_auth(key)
        .json(
            &json!({"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}),
        )
        .send()
        .unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    (status, headers, r.json().unwrap())
}

fn header(headers: &reqwest::header::HeaderMap, name: &str) -> String {
    headers
        .get(name)
        .unwrap_or_else(|| panic!("no {name} in {headers:?}"))
        .to_str()
        .unwrap()
        .to_string()
}

fn header_u64(headers: &reqwest::header::HeaderMap, name: &str) -> u64 {
    header(headers, name).parse().unwrap()
}

/// Tokens a completion reported: prompt and generated.
fn tokens(body: &Value) -> (u64, u64) {
    (
        body["usage"]["prompt_tokens"].as_u64().unwrap(),
        body["usage"]["completion_tokens"].as_u64().unwrap(),
    )
}

#[test]
fn interactive_users_never_wait_for_the_batch_queue_and_limits_and_usage_hold() {
    let _alone = one_at_a_time();
    let dir = std::env::temp_dir().join(format!("hypura-tenancy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("keys.toml");
    let _ = std::fs::remove_file(&file);
    let batch = add_key(&file, "batch", &["--priority", "batch"]);
    let alice = add_key(&file, "alice", &[]);
    let bob = add_key(&file, "bob", &["--weight", "2"]);
    let limited = add_key(&file, "limited", &["--rpm", "2", "--max-tokens", "3"]);
    let other = add_key(&file, "other", &["--models", "llama*"]);
    let admin = add_key(&file, "ops", &["--role", "admin"]);
    let listed = String::from_utf8(keys(&["list"], &file).stdout).unwrap();
    assert!(
        listed.contains("limited") && listed.contains("rpm=2 max_tokens=3"),
        "{listed}"
    );
    assert!(!listed.contains(&batch[4..]), "the list never shows a key");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(!text.contains(&alice[4..]), "the file keeps hashes only");

    let server = Server::start(&[
        "--parallel",
        "2",
        "--metrics-open-on-loopback",
        "--keys-file",
        file.to_str().unwrap(),
    ]);
    // Named keys in use: a request without one, or with a wrong one, is refused.
    let r = client()
        .post(server.url("/v1/completions"))
        .json(&json!({"model": MODEL, "prompt": "x"}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 401);
    let (status, _, _) = complete(&server, "hyp_wrong", "x", 1);
    assert_eq!(status, 401);

    // The batch user queues 40 requests: 2 run, 38 wait.
    let queued = format!("hypura_fair_queue_requests{{model=\"{MODEL}\",priority=\"batch\"}} ");
    let batch_runs: Vec<_> = (0..40)
        .map(|i| {
            let (server_url, key) = (server.base.clone(), batch.clone());
            std::thread::spawn(move || {
                let r = client()
                    .post(format!("{server_url}/v1/completions"))
                    .bearer_auth(key)
                    .json(&json!({"model": MODEL, "prompt": format!("Batch job {i}: count"), "max_tokens": 16, "temperature": 0}))
                    .send()
                    .unwrap();
                let status = r.status().as_u16();
                let headers = r.headers().clone();
                (status, headers, r.json::<Value>().unwrap())
            })
        })
        .collect();
    wait_until(Duration::from_secs(60), "38 batch requests wait", || {
        server.metric(&queued) == Some(38.0)
    });
    // Two interactive users, one request at a time each, while the batch queue is long.
    let interactive: Vec<_> = [("alice", alice.clone()), ("bob", bob.clone())]
        .into_iter()
        .map(|(name, key)| {
            let (url, key) = (server.base.clone(), key);
            std::thread::spawn(move || {
                (0..3)
                    .map(|i| {
                        let r = client()
                            .post(format!("{url}/v1/completions"))
                            .bearer_auth(&key)
                            .json(&json!({"model": MODEL, "prompt": format!("{name} asks {i}"), "max_tokens": 4, "temperature": 0}))
                            .send()
                            .unwrap();
                        let status = r.status().as_u16();
                        let headers = r.headers().clone();
                        (name, status, headers, r.json::<Value>().unwrap())
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let interactive: Vec<_> = interactive
        .into_iter()
        .flat_map(|t| t.join().unwrap())
        .collect();
    let mut served = std::collections::HashMap::<&str, (u64, u64)>::new();
    for (name, status, headers, body) in &interactive {
        assert_eq!(*status, 200, "{body}");
        // No batch request got a slot while it waited; at most the other
        // interactive user's one did: it waited for a running request only.
        assert_eq!(
            header_u64(headers, "x-hypura-batch-started-while-waiting"),
            0,
            "{name}"
        );
        assert!(
            header_u64(headers, "x-hypura-started-while-waiting") <= 1,
            "{name}"
        );
        let (p, g) = tokens(body);
        let entry = served.entry(name).or_default();
        entry.0 += p;
        entry.1 += g;
    }
    let batch_done: Vec<_> = batch_runs.into_iter().map(|t| t.join().unwrap()).collect();
    let mut overtaken = 0;
    for (status, headers, body) in &batch_done {
        assert_eq!(*status, 200, "{body}");
        let started = header_u64(headers, "x-hypura-started-while-waiting");
        let batch_started = header_u64(headers, "x-hypura-batch-started-while-waiting");
        overtaken += started - batch_started;
        let (p, g) = tokens(body);
        let entry = served.entry("batch").or_default();
        entry.0 += p;
        entry.1 += g;
    }
    // Queued batch requests saw the 6 interactive ones pass them.
    assert!(
        overtaken >= 6,
        "interactive requests overtook batch ones {overtaken} times"
    );

    // Per-user counters equal the tokens the responses reported.
    let usage: Value = client()
        .get(server.url("/api/usage"))
        .bearer_auth(&admin)
        .send()
        .unwrap()
        .json()
        .unwrap();
    for (name, (prompt, generated)) in &served {
        let user = usage["users"]
            .as_array()
            .unwrap()
            .iter()
            .find(|u| u["user"] == *name)
            .unwrap_or_else(|| panic!("{name} in {usage}"));
        assert_eq!(user["prompt_tokens"].as_u64(), Some(*prompt), "{name}");
        assert_eq!(
            user["generation_tokens"].as_u64(),
            Some(*generated),
            "{name}"
        );
        let label = format!("{{user=\"{name}\"}} ");
        assert_eq!(
            server.metric(&format!("hypura_user_generation_tokens_total{label}")),
            Some(*generated as f64)
        );
        assert_eq!(
            server.metric(&format!("hypura_user_prompt_tokens_total{label}")),
            Some(*prompt as f64)
        );
    }
    assert_eq!(
        usage["users"]
            .as_array()
            .unwrap()
            .iter()
            .find(|u| u["user"] == "batch")
            .unwrap()["requests"],
        40
    );
    // Only admins read the usage.
    let r = client()
        .get(server.url("/api/usage"))
        .bearer_auth(&alice)
        .send()
        .unwrap();
    assert_eq!(r.status(), 403);

    // Limits: two requests a minute, three tokens a reply.
    let (status, headers, body) = complete(&server, &limited, "Tell me a long story", 50);
    assert_eq!(status, 200);
    assert_eq!(header(&headers, "x-ratelimit-limit-requests"), "2");
    assert_eq!(header(&headers, "x-ratelimit-remaining-requests"), "1");
    assert_eq!(tokens(&body).1, 3, "capped at the key's max_tokens");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    let r = client()
        .post(server.url("/api/generate"))
        .bearer_auth(&limited)
        .json(&json!({"model": MODEL, "prompt": "hi", "stream": false, "options": {"num_predict": 20}}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(header(r.headers(), "x-ratelimit-remaining-requests"), "0");
    let reply: Value = r.json().unwrap();
    assert_eq!(reply["eval_count"], 3);
    let (status, headers, body) = complete(&server, &limited, "again", 1);
    assert_eq!(status, 429);
    let retry: u64 = header(&headers, "retry-after").parse().unwrap();
    assert!((1..=60).contains(&retry), "{retry}");
    assert_eq!(header(&headers, "x-ratelimit-remaining-requests"), "0");
    assert!(header(&headers, "x-ratelimit-reset-requests").ends_with('s'));
    assert_eq!(body["error"]["code"], "rate_limit_exceeded");
    assert_eq!(body["error"]["type"], "requests");
    let r = client()
        .post(server.url("/api/chat"))
        .bearer_auth(&limited)
        .json(&json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 429);
    assert!(r.headers().contains_key("retry-after"));
    let body: Value = r.json().unwrap();
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("requests per minute"),
        "{body}"
    );
    let r = client()
        .post(server.url("/v1/messages"))
        .bearer_auth(&limited)
        .json(&json!({"model": MODEL, "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 429);
    let body: Value = r.json().unwrap();
    assert_eq!(body["error"]["type"], "rate_limit_error");
    assert_eq!(
        server.metric("hypura_user_rejected_total{reason=\"rpm\",user=\"limited\"} "),
        Some(3.0)
    );
    // A model outside the key's globs.
    let (status, _, body) = complete(&server, &other, "hi", 1);
    assert_eq!(status, 403, "{body}");

    // The keys file is read again when it changes: a key added works, a
    // key removed stops working, without a restart.
    let carol = add_key(&file, "carol", &[]);
    wait_until(Duration::from_secs(10), "the new key works", || {
        complete(&server, &carol, "hi", 1).0 == 200
    });
    assert!(keys(&["remove", "carol"], &file).status.success());
    wait_until(
        Duration::from_secs(10),
        "the removed key is refused",
        || complete(&server, &carol, "hi", 1).0 == 401,
    );
    assert_eq!(complete(&server, &alice, "hi", 1).0, 200);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A fresh directory for one test's keys file.
fn test_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("hypura-tenancy-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// SmolLM2's end tokens (`<|endoftext|>`, `<|im_end|>`) banned: a reply
/// that runs to its `max_tokens`.
const NO_END: &str = r#"{"0": -100, "2": -100}"#;

#[test]
fn hypura_ps_shows_who_holds_each_slot_and_who_waits() {
    let _alone = one_at_a_time();
    let dir = test_dir("ps");
    let file = dir.join("keys.toml");
    let alice = add_key(&file, "alice", &[]);
    let bob = add_key(&file, "bob", &[]);
    let admin = add_key(&file, "ops", &["--role", "admin"]);
    let server = Server::start(&["--parallel", "1", "--keys-file", file.to_str().unwrap()]);
    // Alice's long reply holds the one slot: its stream is left unread
    // after its first bytes, so it holds the slot until it is dropped.
    let mut held = client()
        .post(server.url("/v1/completions"))
        .bearer_auth(&alice)
        .json(&json!({
            "model": MODEL, "prompt": "Once upon a time", "max_tokens": 3000,
            "temperature": 0, "stream": true,
            "logit_bias": serde_json::from_str::<Value>(NO_END).unwrap()
        }))
        .send()
        .unwrap();
    assert_eq!(held.status(), 200);
    let mut first = [0u8; 16];
    assert!(std::io::Read::read(&mut held, &mut first).unwrap() > 0);
    // Bob's request waits for it.
    let waiting = {
        let (url, key) = (server.base.clone(), bob.clone());
        std::thread::spawn(move || {
            client()
                .post(format!("{url}/v1/completions"))
                .bearer_auth(key)
                .json(&json!({"model": MODEL, "prompt": "hi", "max_tokens": 2, "temperature": 0}))
                .send()
                .unwrap()
                .status()
                .as_u16()
        })
    };
    let slots = |user: &str| -> Option<(u64, u64)> {
        let usage: Value = client()
            .get(server.url("/api/usage"))
            .bearer_auth(&admin)
            .send()
            .unwrap()
            .json()
            .unwrap();
        let users = usage["models"][0]["users"].as_array()?;
        let u = users.iter().find(|u| u["user"] == user)?;
        Some((u["running"].as_u64()?, u["waiting"].as_u64()?))
    };
    wait_until(Duration::from_secs(60), "bob waits behind alice", || {
        slots("bob") == Some((0, 1))
    });
    assert_eq!(slots("alice"), Some((1, 0)));

    let ps = |key: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_hypura"))
            .arg("ps")
            .env("HYPURA_HOST", &server.base)
            .env("HYPURA_API_KEY", key)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let table = ps(&admin);
    let rows: Vec<Vec<&str>> = table
        .lines()
        .skip_while(|l| !l.starts_with("MODEL "))
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows,
        [
            vec!["MODEL", "USER", "RUNNING", "WAITING"],
            vec![MODEL, "alice", "1", "0"],
            vec![MODEL, "bob", "0", "1"],
        ],
        "{table}"
    );
    assert!(
        table.starts_with("NAME "),
        "the models' table first: {table}"
    );
    // A user's key reads the models, not who uses them.
    let table = ps(&alice);
    assert!(
        table.starts_with("NAME ") && table.contains(MODEL),
        "{table}"
    );
    assert!(
        !table.contains("alice") && !table.contains("WAITING"),
        "{table}"
    );

    // Alice's stream dropped, her slot goes to Bob.
    drop(held);
    assert_eq!(waiting.join().unwrap(), 200);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_keys_file_with_a_key_guards_a_lan_address_alone() {
    let _alone = one_at_a_time();
    let dir = test_dir("lan");
    let file = dir.join("keys.toml");
    let model = common::smollm2();
    let serve = |file: &Path| {
        Command::new(env!("CARGO_BIN_EXE_hypura"))
            .arg("serve")
            .arg(&model)
            .args(["--host", "0.0.0.0", "--port", "0", "--keys-file"])
            .arg(file)
            .env("HYPURA_CACHE_DIR", common::profile_cache_dir())
            .env_remove("HYPURA_API_KEY")
            .env_remove("HYPURA_ADMIN_KEY")
            .output()
            .unwrap()
    };
    // No key at all (the file holds none): refused, as without a keys file.
    let out = serve(&file);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("lets anyone on the network use every model")
            && err.contains("(the keys file holds no key)"),
        "{err}"
    );

    let alice = add_key(&file, "alice", &[]);
    let server = Server::start(&["--host", "0.0.0.0", "--keys-file", file.to_str().unwrap()]);
    assert!(
        server.base.starts_with("http://0.0.0.0:"),
        "{}",
        server.base
    );
    let r = client()
        .post(server.url("/v1/completions"))
        .json(&json!({"model": MODEL, "prompt": "hi", "max_tokens": 1}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(complete(&server, "hyp_wrong", "hi", 1).0, 401);
    let (status, _, body) = complete(&server, &alice, "hi", 1);
    assert_eq!(status, 200, "{body}");
    assert_eq!(tokens(&body).1, 1);
    let r = client()
        .get(server.url("/api/tags"))
        .bearer_auth(&alice)
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_key_s_max_context_caps_prompt_and_reply_on_every_route() {
    let _alone = one_at_a_time();
    let dir = test_dir("context");
    let file = dir.join("keys.toml");
    let small = add_key(&file, "small", &["--max-context", "64"]);
    let free = add_key(&file, "free", &[]);
    let server = Server::start(&["--keys-file", file.to_str().unwrap()]);
    let no_end = serde_json::from_str::<Value>(NO_END).unwrap();
    let post = |path: &str, key: &str, body: Value| {
        let r = client()
            .post(server.url(path))
            .bearer_auth(key)
            .json(&body)
            .send()
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json::<Value>().unwrap())
    };
    // OpenAI: the reply gets what the prompt leaves of the key's 64 tokens
    // (as llama-server caps n_predict at its context), ending for length.
    let completion = json!({
        "model": MODEL, "prompt": "Once upon a time", "max_tokens": 100,
        "temperature": 0, "logit_bias": no_end
    });
    let (status, body) = post("/v1/completions", &small, completion.clone());
    assert_eq!(status, 200, "{body}");
    let (prompt, generated) = tokens(&body);
    assert!(prompt < 64, "{body}");
    assert_eq!(prompt + generated, 64, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    // Another key is not capped: the same request gets its 100 tokens.
    let (status, body) = post("/v1/completions", &free, completion);
    assert_eq!(status, 200, "{body}");
    assert_eq!(tokens(&body), (prompt, 100));

    let chat = |content: &str, max_tokens: u32| {
        json!({
            "model": MODEL, "messages": [{"role": "user", "content": content}],
            "max_tokens": max_tokens, "temperature": 0, "logit_bias": no_end
        })
    };
    let (status, body) = post(
        "/v1/chat/completions",
        &small,
        chat("Tell me a story.", 100),
    );
    assert_eq!(status, 200, "{body}");
    let usage = &body["usage"];
    assert_eq!(usage["total_tokens"], 64, "{body}");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    // A prompt alone over the cap: 400, OpenAI's context_length_exceeded.
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(10);
    let (status, body) = post("/v1/chat/completions", &small, chat(&long, 1));
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "context_length_exceeded", "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("the context window holds 64"), "{message}");
    // The same prompt fits the free key's window.
    let (status, body) = post("/v1/chat/completions", &free, chat(&long, 1));
    assert_eq!(status, 200, "{body}");

    // Anthropic: input (the part read from the cache too) and output
    // tokens make the 64.
    let (status, body) = post(
        "/v1/messages",
        &small,
        json!({
            "model": MODEL, "max_tokens": 100, "temperature": 0,
            "messages": [{"role": "user", "content": "Tell me a story."}]
        }),
    );
    assert_eq!(status, 200, "{body}");
    let usage = &body["usage"];
    let used = ["input_tokens", "cache_read_input_tokens", "output_tokens"]
        .iter()
        .map(|k| usage[k].as_u64().unwrap_or(0))
        .sum::<u64>();
    assert_eq!(used, 64, "{body}");
    assert_eq!(body["stop_reason"], "max_tokens", "{body}");

    // Ollama: the same cap without a num_ctx of its own (its
    // prompt_eval_count counts only what the prompt cache did not hold: the
    // prompt's tokens are those /v1/completions reported for it).
    let (status, body) = post(
        "/api/generate",
        &small,
        json!({
            "model": MODEL, "prompt": "Once upon a time", "raw": true, "stream": false,
            "options": {"num_predict": 100, "temperature": 0}
        }),
    );
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["eval_count"].as_u64(), Some(64 - prompt), "{body}");
    assert_eq!(body["done_reason"], "length", "{body}");
    // Capped in the request, not by reloading the model at a 64-token
    // context (a num_ctx the request did not send).
    let ps: Value = client()
        .get(server.url("/api/ps"))
        .bearer_auth(&free)
        .send()
        .unwrap()
        .json()
        .unwrap();
    let context = ps["models"][0]["context_length"].as_u64().unwrap_or(0);
    assert!(context > 64, "{ps}");
    let _ = std::fs::remove_dir_all(&dir);
}
