//! `logprobs` on every generation route, streamed and not, over HTTP on the
//! real SmolLM2 (greedy, so both ways give the same tokens), then through
//! the real `openai` and `ollama` Python clients
//! (`gateway/tests/clients/logprobs_clients.py`).
#[path = "../common/mod.rs"]
mod common;

use std::path::Path;
use std::process::Command;

use common::{ndjson, sse, Server, MODEL};
use serde_json::{json, Value};

const QUESTION: &str = "What is the capital of Germany?";
const TOP: usize = 3;

/// One reported token, whichever dialect: its text, log-probability and
/// alternatives (text, log-probability), most likely first.
#[derive(Debug, Clone, PartialEq)]
struct Token {
    text: String,
    logprob: f64,
    top: Vec<(String, f64)>,
}

/// Ollama's and OpenAI chat's entries: `{token, logprob, bytes, top_logprobs}`.
fn entries(list: &Value) -> Vec<Token> {
    list.as_array()
        .unwrap_or_else(|| panic!("a list of logprobs: {list}"))
        .iter()
        .map(|e| {
            let text = e["token"].as_str().unwrap().to_string();
            let bytes: Vec<u8> = e["bytes"]
                .as_array()
                .map(|b| b.iter().map(|x| x.as_u64().unwrap() as u8).collect())
                .unwrap_or_default();
            assert_eq!(bytes, text.as_bytes(), "{e}");
            let top = e["top_logprobs"]
                .as_array()
                .map(|t| {
                    t.iter()
                        .map(|t| {
                            (
                                t["token"].as_str().unwrap().into(),
                                t["logprob"].as_f64().unwrap(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            Token {
                text,
                logprob: e["logprob"].as_f64().unwrap(),
                top,
            }
        })
        .collect()
}

/// The legacy completions' `{tokens, token_logprobs, top_logprobs, text_offset}`,
/// and the offsets.
fn legacy(value: &Value) -> (Vec<Token>, Vec<u64>) {
    let tokens = value["tokens"].as_array().unwrap();
    let tokens: Vec<Token> = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let mut top: Vec<(String, f64)> = value["top_logprobs"][i]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_f64().unwrap()))
                .collect();
            top.sort_by(|a, b| b.1.total_cmp(&a.1));
            Token {
                text: t.as_str().unwrap().to_string(),
                logprob: value["token_logprobs"][i].as_f64().unwrap(),
                top,
            }
        })
        .collect();
    let offsets = value["text_offset"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o.as_u64().unwrap())
        .collect();
    (tokens, offsets)
}

/// What every greedy reply's log-probabilities must satisfy: one entry per
/// token of `text` (their texts make it up), each `<= 0`, `TOP` sorted
/// alternatives whose first is the sampled token, and no more than all the
/// probability among them.
fn check_greedy(tokens: &[Token], text: &str, top: usize) {
    assert!(!tokens.is_empty(), "no logprobs for {text:?}");
    let joined: String = tokens.iter().map(|t| t.text.as_str()).collect();
    assert_eq!(joined, text);
    for t in tokens {
        assert!(t.logprob <= 0.0, "{t:?}");
        assert_eq!(t.top.len(), top, "{t:?}");
        if top == 0 {
            continue;
        }
        assert!(t.top.windows(2).all(|w| w[0].1 >= w[1].1), "sorted: {t:?}");
        assert_eq!(
            t.top[0],
            (t.text.clone(), t.logprob),
            "greedy takes the top: {t:?}"
        );
        let mass: f64 = t.top.iter().map(|(_, l)| l.exp()).sum();
        assert!(mass <= 1.0 + 1e-5, "{mass}: {t:?}");
    }
}

/// Streamed and whole replies report the same tokens with the same values.
fn assert_same(streamed: &[Token], whole: &[Token]) {
    assert_eq!(streamed.len(), whole.len());
    for (a, b) in streamed.iter().zip(whole) {
        assert_eq!(a.text, b.text);
        assert!((a.logprob - b.logprob).abs() < 1e-4, "{a:?} {b:?}");
        assert_eq!(a.top.len(), b.top.len());
    }
}

fn ollama_chat(stream: bool, extra: Value) -> Value {
    let mut body = json!({"model": MODEL, "stream": stream,
        "options": {"temperature": 0, "num_predict": 12},
        "messages": [{"role": "user", "content": QUESTION}]});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

fn ollama_routes(s: &Server) {
    let asked = json!({"logprobs": true, "top_logprobs": TOP});
    // /api/chat, whole and streamed.
    let whole = s.post_json("/api/chat", ollama_chat(false, asked.clone()), 200);
    let text = whole["message"]["content"].as_str().unwrap();
    let whole_tokens = entries(&whole["logprobs"]);
    check_greedy(&whole_tokens, text, TOP);
    let r = s.post("/api/chat", ollama_chat(true, asked.clone()));
    let chunks = ndjson(&r.text().unwrap());
    let mut streamed = Vec::new();
    for c in &chunks {
        let content = c["message"]["content"].as_str().unwrap();
        match c.get("logprobs") {
            Some(list) => {
                let tokens = entries(list);
                let joined: String = tokens.iter().map(|t| t.text.as_str()).collect();
                assert_eq!(joined, content, "a chunk's tokens make its text");
                streamed.extend(tokens);
            }
            None => assert!(content.is_empty(), "text without logprobs: {c}"),
        }
    }
    assert_same(&streamed, &whole_tokens);

    // Without top_logprobs: no alternatives, and the field left out.
    let v = s.post_json(
        "/api/chat",
        ollama_chat(false, json!({"logprobs": true})),
        200,
    );
    assert!(v["logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e.get("top_logprobs").is_none()));
    check_greedy(
        &entries(&v["logprobs"]),
        v["message"]["content"].as_str().unwrap(),
        0,
    );
    // Not asked: no field.
    let v = s.post_json("/api/chat", ollama_chat(false, json!({})), 200);
    assert!(v.get("logprobs").is_none(), "{v}");

    // /api/generate, whole and streamed.
    let generate = |stream: bool| {
        json!({"model": MODEL, "prompt": QUESTION, "stream": stream, "logprobs": true,
            "top_logprobs": TOP, "options": {"temperature": 0, "num_predict": 12}})
    };
    let whole = s.post_json("/api/generate", generate(false), 200);
    let whole_tokens = entries(&whole["logprobs"]);
    check_greedy(&whole_tokens, whole["response"].as_str().unwrap(), TOP);
    let r = s.post("/api/generate", generate(true));
    let streamed: Vec<Token> = ndjson(&r.text().unwrap())
        .iter()
        .filter_map(|c| c.get("logprobs").map(entries))
        .flatten()
        .collect();
    assert_same(&streamed, &whole_tokens);

    for (route, body) in [
        (
            "/api/chat",
            ollama_chat(false, json!({"logprobs": true, "top_logprobs": 21})),
        ),
        (
            "/api/generate",
            json!({"model": MODEL, "prompt": "x", "top_logprobs": -1}),
        ),
    ] {
        let v = s.post_json(route, body, 400);
        assert!(
            v["error"]
                .as_str()
                .unwrap()
                .starts_with("top_logprobs must be between 0 and 20"),
            "{v}"
        );
    }
}

fn openai_chat(stream: bool, extra: Value) -> Value {
    let mut body = json!({"model": MODEL, "stream": stream, "temperature": 0, "max_tokens": 12,
        "messages": [{"role": "user", "content": QUESTION}]});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().unwrap().clone());
    body
}

/// The JSON chunks of an SSE body, `[DONE]` checked and dropped.
fn sse_chunks(body: &str) -> Vec<Value> {
    let events = sse(body);
    assert_eq!(events.last().unwrap(), "[DONE]");
    events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect()
}

fn openai_routes(s: &Server) {
    let asked = json!({"logprobs": true, "top_logprobs": TOP});
    let whole = s.post_json(
        "/v1/chat/completions",
        openai_chat(false, asked.clone()),
        200,
    );
    let choice = &whole["choices"][0];
    let whole_tokens = entries(&choice["logprobs"]["content"]);
    check_greedy(
        &whole_tokens,
        choice["message"]["content"].as_str().unwrap(),
        TOP,
    );
    let r = s.post("/v1/chat/completions", openai_chat(true, asked));
    let mut streamed = Vec::new();
    for c in sse_chunks(&r.text().unwrap()) {
        let choice = &c["choices"][0];
        let content = choice["delta"]["content"].as_str().unwrap_or_default();
        match choice.get("logprobs") {
            Some(l) => {
                let tokens = entries(&l["content"]);
                let joined: String = tokens.iter().map(|t| t.text.as_str()).collect();
                assert_eq!(joined, content);
                streamed.extend(tokens);
            }
            None => assert!(content.is_empty(), "text without logprobs: {c}"),
        }
    }
    assert_same(&streamed, &whole_tokens);
    let v = s.post_json("/v1/chat/completions", openai_chat(false, json!({})), 200);
    assert!(v["choices"][0].get("logprobs").is_none(), "{v}");
    let v = s.post_json(
        "/v1/chat/completions",
        openai_chat(false, json!({"top_logprobs": 2})),
        400,
    );
    assert_eq!(v["error"]["message"], "top_logprobs needs logprobs: true");

    // Legacy completions: `logprobs` is the number of alternatives.
    let completion = |stream: bool, extra: Value| {
        let mut body = json!({"model": MODEL, "prompt": "The capital of Germany is",
            "temperature": 0, "max_tokens": 8, "stream": stream});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        body
    };
    let whole = s.post_json(
        "/v1/completions",
        completion(false, json!({"logprobs": TOP})),
        200,
    );
    let choice = &whole["choices"][0];
    let text = choice["text"].as_str().unwrap();
    let (whole_tokens, offsets) = legacy(&choice["logprobs"]);
    check_greedy(&whole_tokens, text, TOP);
    let mut at = 0;
    for (t, &offset) in whole_tokens.iter().zip(&offsets) {
        assert_eq!(offset, at as u64, "{t:?}");
        at += t.text.chars().count();
    }
    // With the prompt echoed, offsets count from its start.
    let echoed = s.post_json(
        "/v1/completions",
        completion(false, json!({"logprobs": 0, "echo": true})),
        200,
    );
    let prompt_chars = "The capital of Germany is".chars().count() as u64;
    assert_eq!(
        echoed["choices"][0]["logprobs"]["text_offset"][0],
        prompt_chars
    );
    let r = s.post(
        "/v1/completions",
        completion(true, json!({"logprobs": TOP})),
    );
    let mut streamed = Vec::new();
    let mut streamed_offsets = Vec::new();
    for c in sse_chunks(&r.text().unwrap()) {
        let l = &c["choices"][0]["logprobs"];
        if !l.is_null() {
            let (tokens, offsets) = legacy(l);
            streamed.extend(tokens);
            streamed_offsets.extend(offsets);
        }
    }
    assert_same(&streamed, &whole_tokens);
    assert_eq!(streamed_offsets, offsets);
    let v = s.post_json("/v1/completions", completion(false, json!({})), 200);
    assert!(v["choices"][0]["logprobs"].is_null(), "{v}");
    let v = s.post_json(
        "/v1/completions",
        completion(false, json!({"logprobs": 21})),
        400,
    );
    assert_eq!(
        v["error"]["message"],
        "logprobs must be between 0 and 20, got 21"
    );
}

/// The real Python clients: `openai` (`logprobs=True, top_logprobs=3`, and
/// the legacy completions) and `ollama`, streamed and not.
fn python_clients(s: &Server) {
    let have = Command::new("python3")
        .args(["-c", "import ollama, openai"])
        .status();
    assert!(
        have.is_ok_and(|s| s.success()),
        "this test needs python3 with: python3 -m pip install -r gateway/tests/clients/requirements.txt"
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients/logprobs_clients.py");
    let out = Command::new("python3")
        .arg(&script)
        .args([&s.base, MODEL])
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "the Python clients failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn logprobs_on_every_route() {
    let s = Server::start(&["--parallel", "2", "--context", "1024"]);
    ollama_routes(&s);
    openai_routes(&s);
    python_clients(&s);
}
