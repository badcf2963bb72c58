//! Chat-template bombs (issue 29, item 7) on a real `hypura serve`: loops,
//! string doubling, exponential macros, filter bombs and deep recursion are a
//! 400 naming the limit they hit, on every route that renders or checks a
//! template — a request's `template` (`/api/generate`), `/api/create`, a
//! created model (`/api/chat`, `/v1/chat/completions`) and a GGUF's own
//! template — and the server and its runners keep answering afterwards.
#[path = "../common/mod.rs"]
mod common;

use std::time::{Duration, Instant};

use common::templates::copy_with_template;
use common::{peak_memory, Server, MODEL};
use serde_json::{json, Value};

/// The time limit's words: on a loaded machine a bomb may reach the time
/// limit (1 s) before it runs out of fuel.
const TIME: &str = "ran past the time limit of 1s";

/// Every bomb, with the words its error must hold (one of them).
const BOMBS: &[(&str, &str, &[&str])] = &[
    (
        "triple range loop",
        "{% for a in range(100000) %}{% for b in range(100000) %}{% for c in range(100000) %}\
         x{% endfor %}{% endfor %}{% endfor %}",
        &["ran out of fuel", TIME],
    ),
    (
        "a gigabyte string",
        "{{ 'a' * 1000000000 }}",
        &["repeated string is too large"],
    ),
    (
        "string doubling in a loop",
        "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}\
         {% endfor %}{{ ns.s }}",
        &["ran out of fuel", "concatenated string is too large", TIME],
    ),
    (
        "macro doubling recursion",
        "{% macro d(n) %}{% if n > 0 %}{{ d(n - 1) }}{{ d(n - 1) }}{% else %}x{% endif %}\
         {% endmacro %}{{ d(30) }}",
        &["ran out of fuel", TIME],
    ),
    (
        "indent bomb",
        "{{ 'a\nb' | indent(1000000000) }}",
        &["size limit of 16777216 bytes (the indent filter)"],
    ),
    (
        "tojson bomb",
        "{{ [[[[1, 2]]]] | tojson(indent=1000000000) }}",
        &["size limit of 16777216 bytes (the tojson filter)"],
    ),
    (
        "format bomb",
        "{{ '%1000000000s' | format('a') }}",
        &["size limit of 16777216 bytes (the format filter)"],
    ),
    (
        "str.format bomb",
        "{{ '{:>1000000000}'.format('a') }}",
        &["size limit of 16777216 bytes (the .format() method)"],
    ),
    (
        "huge sort",
        "{{ ((range(100000) | list) * 20) | sort | length }}",
        &["the sort filter would read more than the limit of 1000000 items"],
    ),
    (
        "deep recursion",
        "{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}",
        &["recursion limit (200)"],
    ),
];

/// A template that renders normally unless the last message says `boom`,
/// so it passes `/api/create`'s check and bombs on a request.
const BOMB_ON_REQUEST: &str = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n\
    {% if m.content == 'boom' %}{% for a in range(100000) %}{% for b in range(100000) %}x\
    {% endfor %}{% endfor %}{% endif %}{% endfor %}assistant:";

/// POSTs `body`, asserting a 400; the error text and how long the answer took.
fn refused(s: &Server, path: &str, body: Value) -> (String, Duration) {
    let started = Instant::now();
    let r = s.post(path, body.clone());
    let took = started.elapsed();
    assert_eq!(r.status().as_u16(), 400, "{path} {body}");
    let reply: Value = r.json().expect("a JSON error");
    let error = match &reply["error"] {
        Value::String(text) => text.clone(),
        other => other["message"].as_str().unwrap_or_default().to_string(),
    };
    (error, took)
}

fn assert_names_limit(error: &str, words: &[&str], what: &str) {
    assert!(
        error.contains("the chat template was stopped: "),
        "{what}: {error}"
    );
    assert!(
        words.iter().any(|w| error.contains(w)),
        "{what}: {error} names none of {words:?}"
    );
}

/// The server still renders and generates with the default template.
fn still_answers(s: &Server) {
    let body = json!({"model": MODEL, "stream": false, "options": {"num_predict": 2},
        "messages": [{"role": "user", "content": "Hi"}]});
    let reply = s.post_json("/api/chat", body, 200);
    assert_eq!(reply["done"], true);
}

#[test]
fn template_bombs_are_a_400_naming_the_limit_on_every_route() {
    let dir = std::env::temp_dir().join(format!("hypura-bombs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bombed_gguf = dir.join("smollm2-bomb.gguf");
    copy_with_template(&common::smollm2(), &bombed_gguf, BOMBS[0].1);
    // Created models go to a folder of the test's own, never the shared cache.
    let models = dir.join("models");
    std::fs::create_dir_all(&models).unwrap();
    let s = Server::start(&[
        bombed_gguf.to_str().unwrap(),
        "--context",
        "512",
        "--models-dir",
        models.to_str().unwrap(),
    ]);

    for (index, (name, source, words)) in BOMBS.iter().enumerate() {
        let generate = json!({"model": MODEL, "prompt": "Hi", "template": source,
            "stream": false, "options": {"num_predict": 2}});
        let (error, took) = refused(&s, "/api/generate", generate);
        assert_names_limit(&error, words, name);
        eprintln!("{name}: /api/generate with template: 400 in {took:?}");

        let create = json!({"model": format!("bomb-{index}"), "from": MODEL, "template": source});
        let (error, took) = refused(&s, "/api/create", create);
        assert_names_limit(&error, words, name);
        eprintln!("{name}: /api/create: 400 in {took:?}");
    }
    still_answers(&s);

    // A created model whose template bombs on one message only.
    let create = json!({"model": "smol-boom", "from": MODEL, "template": BOMB_ON_REQUEST,
        "stream": false});
    s.post_json("/api/create", create, 200);
    let fuel = &["ran out of fuel", TIME][..];
    let boom = json!([{"role": "user", "content": "boom"}]);
    let routes = [
        (
            "/api/chat",
            json!({"model": "smol-boom", "messages": boom, "stream": false}),
        ),
        (
            "/v1/chat/completions",
            json!({"model": "smol-boom", "messages": boom, "max_tokens": 2}),
        ),
        (
            "/api/generate",
            json!({"model": "smol-boom", "prompt": "boom", "stream": false}),
        ),
    ];
    for (path, body) in routes {
        let (error, took) = refused(&s, path, body);
        assert_names_limit(&error, fuel, path);
        eprintln!("bomb on request: {path} to a created model: 400 in {took:?}");
    }
    let fine = json!({"model": "smol-boom", "stream": false, "options": {"num_predict": 2},
        "messages": [{"role": "user", "content": "Hi"}]});
    assert_eq!(s.post_json("/api/chat", fine, 200)["done"], true);

    // A GGUF whose own template bombs: refused each time, its runner not wedged.
    for attempt in 0..2 {
        let body = json!({"model": "smollm2-bomb", "stream": false,
            "messages": [{"role": "user", "content": "Hi"}]});
        let (error, took) = refused(&s, "/api/chat", body);
        assert!(error.contains("chat template cannot be used"), "{error}");
        assert_names_limit(&error, fuel, "the GGUF's template");
        eprintln!("GGUF template bomb: /api/chat attempt {attempt}: 400 in {took:?}");
    }
    let raw = json!({"model": "smollm2-bomb", "prompt": "Hi", "raw": true, "stream": false,
        "options": {"num_predict": 2}});
    assert_eq!(s.post_json("/api/generate", raw, 200)["done"], true);

    still_answers(&s);
    let peak = peak_memory(s.pid());
    assert!(
        peak < 2 << 30,
        "the server peaked at {peak} bytes rendering bombs"
    );
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `hypura run` on a GGUF whose own template is each bomb: an error naming
/// the limit and a failed exit, never an abort (a signal, "Rust cannot catch
/// foreign exceptions").
#[test]
fn hypura_run_refuses_each_bomb_without_aborting() {
    let dir = std::env::temp_dir().join(format!("hypura-run-bombs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("smollm2-bomb.gguf");
    for (name, source, words) in BOMBS {
        copy_with_template(&common::smollm2(), &model, source);
        let started = Instant::now();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_hypura"))
            .args(["run", model.to_str().unwrap(), "--prompt", "Hi"])
            .args(["--max-tokens", "2", "--context", "512"])
            .output()
            .expect("run hypura");
        let took = started.elapsed();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            matches!(out.status.code(), Some(code) if code != 0),
            "{name}: {:?}\n{stderr}",
            out.status
        );
        assert_names_limit(&stderr, words, name);
        eprintln!(
            "{name}: hypura run: exit {:?} in {took:?}",
            out.status.code()
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
