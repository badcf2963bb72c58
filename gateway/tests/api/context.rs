//! The context window and the defaults of a shared server, end to end on
//! SmolLM2 (training context 8192): long chats truncated as Ollama does on
//! both dialects, `truncate: false`, `num_ctx` up to the training context,
//! the server's reply cap, `n` choices, OpenAI error codes, prefill and
//! trailing slashes.
#[path = "../common/mod.rs"]
mod common;

use common::{ndjson, sse, Server, MODEL};
use serde_json::{json, Value};

const HEADER: &str = "x-hypura-truncated-messages";
const GERMANY: &str = "What is the capital of Germany?";

/// A system message, then `turns` user/assistant pairs of 149 tokens each
/// (a user message of about 120), then a last question: 40 turns are 5,980 tokens.
fn long_chat(turns: usize) -> Vec<Value> {
    let filler = "The river runs past the old mill and the stone bridge, where the \
                  farmers bring their grain every autumn before the first frost. ";
    let mut messages = vec![json!({"role": "system", "content": "You are a helpful assistant."})];
    for i in 0..turns {
        let text = format!("Note {i}: {}", filler.repeat(4));
        messages.push(json!({"role": "user", "content": text}));
        messages.push(json!({"role": "assistant", "content": format!("Noted {i}. {filler}")}));
    }
    messages.push(json!({"role": "user", "content": GERMANY}));
    messages
}

fn truncated(r: &reqwest::blocking::Response) -> Option<usize> {
    r.headers()
        .get(HEADER)
        .map(|v| v.to_str().unwrap().parse().unwrap())
}

#[test]
fn long_chats_lose_their_oldest_messages_on_both_dialects() {
    let s = Server::start(&["--context", "2048", "--parallel", "2"]);
    let messages = long_chat(40);

    // Ollama: about 6,000 tokens in a 2,048-token window.
    let r = s.post(
        "/api/chat",
        json!({"model": MODEL, "messages": messages, "stream": false, "cache_prompt": false,
               "options": {"temperature": 0, "num_predict": 16}}),
    );
    assert_eq!(r.status(), 200);
    let dropped = truncated(&r).expect("the header counts the dropped messages");
    let v: Value = r.json().unwrap();
    let prompt_tokens = v["prompt_eval_count"].as_u64().unwrap();
    assert!(!v["message"]["content"].as_str().unwrap().is_empty(), "{v}");
    // Room is left for the reply (16 tokens), and no more was dropped than
    // needed: the last message dropped (at most 130 tokens) would not fit.
    assert!(prompt_tokens <= 2048 - 16, "{prompt_tokens}");
    assert!(prompt_tokens > 2048 - 16 - 130, "{prompt_tokens}");
    assert!((40..70).contains(&dropped), "{dropped}");

    // The same conversation cut by hand: the system message and the last
    // messages, as the server kept them, fit as they are.
    let kept: Vec<Value> = std::iter::once(messages[0].clone())
        .chain(messages[1 + dropped..].iter().cloned())
        .collect();
    let r = s.post(
        "/api/chat",
        json!({"model": MODEL, "messages": kept, "stream": false, "truncate": false,
               "cache_prompt": false, "options": {"temperature": 0, "num_predict": 16}}),
    );
    assert_eq!(r.status(), 200);
    assert_eq!(truncated(&r), None);
    let v: Value = r.json().unwrap();
    assert_eq!(v["prompt_eval_count"], prompt_tokens);

    // OpenAI, streamed: the same cut, counted in the header.
    let r = s.post(
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": messages, "stream": true, "temperature": 0,
               "max_tokens": 16, "stream_options": {"include_usage": true}}),
    );
    assert_eq!(r.status(), 200);
    assert_eq!(truncated(&r), Some(dropped));
    let events = sse(&r.text().unwrap());
    assert_eq!(events.last().unwrap(), "[DONE]");
    let usage: Value = serde_json::from_str(&events[events.len() - 2]).unwrap();
    assert_eq!(usage["usage"]["prompt_tokens"], prompt_tokens, "{usage}");

    // truncate: false is a clear 400 on both.
    let r = s.post(
        "/api/chat",
        json!({"model": MODEL, "messages": messages, "stream": false, "truncate": false}),
    );
    assert_eq!(r.status(), 400);
    let e: Value = r.json().unwrap();
    let message = e["error"].as_str().unwrap();
    assert!(
        message.contains("the context window holds 2048") && message.contains("truncate"),
        "{message}"
    );
    let e = s.post_json(
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": messages, "truncate": false}),
        400,
    );
    assert_eq!(e["error"]["code"], "context_length_exceeded", "{e}");
    assert_eq!(e["error"]["type"], "invalid_request_error");
}

#[test]
fn num_ctx_is_honoured_up_to_the_training_context() {
    let s = Server::start(&["--context", "1024", "--parallel", "1"]);
    let show = |s: &Server| s.post_json("/api/show", json!({"model": MODEL}), 200);
    assert_eq!(show(&s)["parameters"], "num_ctx 1024");
    let models: Value = s.get("/v1/models").json().unwrap();
    assert_eq!(models["data"][0]["context_length"], 1024);

    // About 1,060 tokens: more than the server's context, within num_ctx.
    let messages = long_chat(7);
    let r = s.post(
        "/api/chat",
        json!({"model": MODEL, "messages": messages, "stream": false, "truncate": false,
               "options": {"temperature": 0, "num_predict": 4, "num_ctx": 4096}}),
    );
    assert_eq!(r.status(), 200);
    let v: Value = r.json().unwrap();
    assert!(v["prompt_eval_count"].as_u64().unwrap() > 1024, "{v}");
    // What is served now is what /api/show, /api/ps and /v1/models say.
    assert_eq!(show(&s)["parameters"], "num_ctx 4096");
    let ps: Value = s.get("/api/ps").json().unwrap();
    assert_eq!(ps["models"][0]["context_length"], 4096);
    let model: Value = s.get(&format!("/v1/models/{MODEL}")).json().unwrap();
    assert_eq!(model["context_length"], 4096);

    // Beyond the training context: refused, naming the limit.
    let r = s.post(
        "/api/chat",
        json!({"model": MODEL, "messages": [{"role": "user", "content": "Hi"}],
               "options": {"num_ctx": 8193}}),
    );
    assert_eq!(r.status(), 400);
    let e: Value = r.json().unwrap();
    assert_eq!(
        e["error"],
        format!(
            "options.num_ctx 8193 is more than model '{MODEL}' can serve: at most 8192 tokens \
             (its training context)"
        )
    );
}

#[test]
fn a_shared_server_caps_replies_answers_n_choices_and_continues_prefills() {
    let s = Server::start(&["--default-max-tokens", "12", "--parallel", "2"]);
    let story = "Write a very long story about a dragon who learns to bake bread.";

    // No options at all (Open WebUI's request): the reply stops at the cap.
    let v = s.post_json(
        "/api/chat",
        json!({"model": MODEL, "stream": false,
               "messages": [{"role": "user", "content": story}]}),
        200,
    );
    assert_eq!(v["eval_count"], 12, "{v}");
    assert_eq!(v["done_reason"], "length");
    let v = s.post_json(
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": [{"role": "user", "content": story}]}),
        200,
    );
    assert_eq!(v["usage"]["completion_tokens"], 12, "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "length");

    // n = 2: two choices, whole and streamed, each with its index.
    let v = s.post_json(
        "/v1/chat/completions",
        json!({"model": MODEL, "n": 2, "temperature": 0, "max_tokens": 8,
               "messages": [{"role": "user", "content": GERMANY}]}),
        200,
    );
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2, "{v}");
    assert_eq!(choices[0]["index"], 0);
    assert_eq!(choices[1]["index"], 1);
    assert_eq!(choices[0]["message"], choices[1]["message"], "greedy twice");
    let completion = v["usage"]["completion_tokens"].as_u64().unwrap();
    let r = s.post(
        "/v1/chat/completions",
        json!({"model": MODEL, "n": 2, "temperature": 0, "max_tokens": 8, "stream": true,
               "messages": [{"role": "user", "content": GERMANY}]}),
    );
    let events = sse(&r.text().unwrap());
    assert_eq!(events.last().unwrap(), "[DONE]");
    let mut texts = [String::new(), String::new()];
    let mut finishes = 0;
    for event in &events[..events.len() - 1] {
        let chunk: Value = serde_json::from_str(event).unwrap();
        let choice = &chunk["choices"][0];
        let i = choice["index"].as_u64().unwrap() as usize;
        texts[i].push_str(choice["delta"]["content"].as_str().unwrap_or_default());
        finishes += usize::from(!choice["finish_reason"].is_null());
    }
    assert_eq!(finishes, 2);
    assert_eq!(texts[0], texts[1]);
    assert_eq!(texts[0], choices[0]["message"]["content"]);
    assert!(completion >= 2);

    // An unknown model: OpenAI's code.
    let e = s.post_json(
        "/v1/chat/completions",
        json!({"model": "nope", "messages": [{"role": "user", "content": "x"}]}),
        404,
    );
    assert_eq!(e["error"]["code"], "model_not_found");
    assert_eq!(e["error"]["param"], "model");

    // A trailing assistant message is continued, on both dialects.
    let prefill = json!([{"role": "user", "content": GERMANY},
                         {"role": "assistant", "content": "The capital of Germany is"}]);
    let v = s.post_json(
        "/api/chat",
        json!({"model": MODEL, "stream": false, "messages": prefill,
               "options": {"temperature": 0, "num_predict": 4}}),
        200,
    );
    assert_eq!(v["message"]["content"], " Berlin.", "{v}");
    let v = s.post_json(
        "/v1/chat/completions",
        json!({"model": MODEL, "temperature": 0, "max_tokens": 4, "messages": prefill}),
        200,
    );
    assert_eq!(v["choices"][0]["message"]["content"], " Berlin.", "{v}");

    // Trailing slashes are the same routes.
    let tags: Value = s.get("/api/tags/").json().unwrap();
    assert_eq!(tags["models"][0]["name"], MODEL);
    let models: Value = s.get("/v1/models/").json().unwrap();
    assert_eq!(models["data"][0]["id"], MODEL);
    let show = s.post_json("/api/show/", json!({"model": MODEL}), 200);
    assert_eq!(show["details"]["family"], "llama");
    let chunks = ndjson(
        &s.post(
            "/api/chat/",
            json!({"model": MODEL, "messages": [{"role": "user", "content": GERMANY}],
                   "options": {"temperature": 0, "num_predict": 3}}),
        )
        .text()
        .unwrap(),
    );
    assert_eq!(chunks.last().unwrap()["done"], true);
}
