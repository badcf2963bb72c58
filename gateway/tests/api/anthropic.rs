//! `POST /v1/messages` (Anthropic's Messages API) on the wire, against a
//! real `hypura serve` with SmolLM2 and a copy of it with Qwen 2.5's tool
//! template, behind an API key: whole and streamed replies and their exact
//! event order, `system`, `max_tokens`, `stop_sequences`, tool_use and
//! tool_result blocks (a call cut by `max_tokens` too), Anthropic's error
//! shape, and `x-api-key`. The
//! `anthropic` package drives the same route in
//! `tests/clients/test_anthropic_client.py`.
#[path = "../common/mod.rs"]
mod common;

use common::templates::{QwenCopy, QWEN_MODEL};
use common::{client, Server, MODEL};
use serde_json::{json, Value};

const GERMANY: &str = "The capital of Germany is Berlin.";
const KEY: &str = "test-key";

fn question() -> Value {
    json!([{"role": "user", "content": "What is the capital of Germany?"}])
}

/// POSTs `body` with the key in `x-api-key`; the status and the body.
fn post(s: &Server, body: &Value) -> (u16, String) {
    let r = client()
        .post(s.url("/v1/messages"))
        .header("x-api-key", KEY)
        .header("anthropic-version", "2023-06-01")
        .json(body)
        .send()
        .unwrap();
    (r.status().as_u16(), r.text().unwrap())
}

fn post_json(s: &Server, body: Value, status: u16) -> Value {
    let (got, text) = post(s, &body);
    assert_eq!(got, status, "{text}");
    serde_json::from_str(&text).unwrap()
}

/// Each SSE event as (its `event:` name, its data), checking both agree.
fn events(body: &str) -> Vec<(String, Value)> {
    body.split_terminator("\n\n")
        .map(|event| {
            let (name, data) = event.split_once('\n').expect("event: then data:");
            let name = name.strip_prefix("event: ").expect("an event: line");
            let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
            assert_eq!(data["type"], name, "{event}");
            (name.to_string(), data)
        })
        .collect()
}

#[test]
fn messages_whole_streamed_with_tools_errors_and_keys() {
    let qwen = QwenCopy::new("anthropic");
    let s = Server::start(&[
        qwen.path.to_str().unwrap(),
        "--context",
        "2048",
        "--api-key",
        KEY,
    ]);
    whole(&s);
    streamed(&s);
    limits_and_stop_sequences(&s);
    tool_use(&s);
    cut_tool_use(&s);
    errors_and_keys(&s);
}

fn whole(s: &Server) {
    let r = post_json(
        s,
        json!({"model": MODEL, "max_tokens": 64, "messages": question(), "temperature": 0}),
        200,
    );
    assert!(r["id"].as_str().unwrap().starts_with("msg_"), "{r}");
    assert_eq!(r["type"], "message");
    assert_eq!(r["role"], "assistant");
    assert_eq!(r["model"], MODEL);
    assert_eq!(r["content"], json!([{"type": "text", "text": GERMANY}]));
    assert_eq!(r["stop_reason"], "end_turn");
    assert!(r["stop_sequence"].is_null());
    let input_tokens = r["usage"]["input_tokens"].as_u64().unwrap();
    assert!(input_tokens > 10, "{r}");
    assert!(r["usage"]["output_tokens"].as_u64().unwrap() > 5);

    // A system prompt (as blocks) is the system message: the prompt is the chat route's.
    let r = post_json(
        s,
        json!({"model": MODEL, "max_tokens": 1, "messages": question(), "cache_prompt": false,
            "system": [{"type": "text", "text": "You are a "}, {"type": "text", "text": "geography teacher."}]}),
        200,
    );
    let chat = client()
        .post(s.url("/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&json!({"model": MODEL, "max_tokens": 1, "messages": [
            {"role": "system", "content": "You are a geography teacher."},
            {"role": "user", "content": "What is the capital of Germany?"}]}))
        .send()
        .unwrap()
        .json::<Value>()
        .unwrap();
    assert_eq!(
        r["usage"]["input_tokens"], chat["usage"]["prompt_tokens"],
        "{chat}"
    );
    assert_ne!(r["usage"]["input_tokens"], input_tokens);
}

fn streamed(s: &Server) {
    let (status, body) = post(
        s,
        &json!({"model": MODEL, "max_tokens": 64, "messages": question(), "temperature": 0,
            "stream": true}),
    );
    assert_eq!(status, 200);
    let events = events(&body);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    let deltas = names
        .iter()
        .filter(|n| **n == "content_block_delta")
        .count();
    assert!(deltas >= 2, "{names:?}");
    let mut expected = vec!["message_start", "content_block_start"];
    expected.extend(std::iter::repeat_n("content_block_delta", deltas));
    expected.extend(["content_block_stop", "message_delta", "message_stop"]);
    assert_eq!(names, expected);
    assert_eq!(events[0].1["message"]["content"], json!([]));
    assert_eq!(
        events[1].1["content_block"],
        json!({"type": "text", "text": ""})
    );
    let text: String = events
        .iter()
        .filter_map(|(_, d)| d["delta"]["text"].as_str())
        .collect();
    assert_eq!(text, GERMANY);
    let delta = &events[names.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], "end_turn");
    // The same prompt as the whole reply's: Anthropic counts the part the
    // prompt cache held apart from the input tokens evaluated.
    let usage = &delta["usage"];
    let prompt = usage["input_tokens"].as_u64().unwrap()
        + usage["cache_read_input_tokens"].as_u64().unwrap();
    assert!(prompt > 10, "{usage}");
    assert!(
        usage["cache_read_input_tokens"].as_u64().unwrap() > 0,
        "{usage}"
    );
    assert!(delta["usage"]["output_tokens"].as_u64().unwrap() > 5);
}

fn limits_and_stop_sequences(s: &Server) {
    let r = post_json(
        s,
        json!({"model": MODEL, "max_tokens": 3, "messages": question(), "temperature": 0}),
        200,
    );
    assert_eq!(r["stop_reason"], "max_tokens", "{r}");
    assert_eq!(r["usage"]["output_tokens"], 3);

    let r = post_json(
        s,
        json!({"model": MODEL, "max_tokens": 64, "messages": question(), "temperature": 0,
            "stop_sequences": ["Berlin"]}),
        200,
    );
    assert_eq!(r["content"][0]["text"], "The capital of Germany is ", "{r}");
    assert_eq!(r["stop_reason"], "stop_sequence");
    assert_eq!(r["stop_sequence"], "Berlin");
}

fn weather_tool() -> Value {
    json!({"name": "get_weather", "description": "The current weather in a city",
        "input_schema": {"type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
            "required": ["city"]}})
}

fn tool_use(s: &Server) {
    let messages = json!([{"role": "user", "content": "What is the weather in Rome?"}]);
    let request = json!({"model": QWEN_MODEL, "max_tokens": 100, "messages": messages,
        "tools": [weather_tool()], "tool_choice": {"type": "tool", "name": "get_weather"},
        "temperature": 0});
    let r = post_json(s, request.clone(), 200);
    assert_eq!(r["stop_reason"], "tool_use", "{r}");
    let blocks = r["content"].as_array().unwrap();
    let call = blocks.last().unwrap();
    assert_eq!(call["type"], "tool_use");
    assert_eq!(call["name"], "get_weather");
    assert_eq!(call["input"], json!({"city": "Rome"}));
    let id = call["id"].as_str().unwrap();

    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let (_, body) = post(s, &streamed);
    let events = events(&body);
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ],
        "tool-call text must not leak as a text block"
    );
    assert_eq!(events[1].1["content_block"]["type"], "tool_use");
    assert_eq!(events[1].1["content_block"]["name"], "get_weather");
    assert_eq!(events[2].1["delta"]["type"], "input_json_delta");
    let partial: Value =
        serde_json::from_str(events[2].1["delta"]["partial_json"].as_str().unwrap()).unwrap();
    assert_eq!(partial, json!({"city": "Rome"}));
    assert_eq!(events[4].1["delta"]["stop_reason"], "tool_use");

    // The call and its result go back in as blocks, through the template.
    let history = json!([
        {"role": "user", "content": "What is the weather in Rome?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": id, "name": "get_weather",
            "input": {"city": "Rome"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": id,
            "content": "21 degrees and sunny"}]},
    ]);
    let r = post_json(
        s,
        json!({"model": QWEN_MODEL, "max_tokens": 16, "messages": history,
            "tools": [weather_tool()], "temperature": 0}),
        200,
    );
    // The tools' system prompt was read by the call before: cached.
    let prompt = r["usage"]["input_tokens"].as_u64().unwrap()
        + r["usage"]["cache_read_input_tokens"].as_u64().unwrap();
    assert!(prompt > 200, "{r}");
}

/// A generic-format call (SmolLM2's template knows no tools) cut by
/// `max_tokens` (issue 29, item 3): `stop_reason` is `max_tokens`, as
/// Anthropic reports a reply the limit cut, with the partial `tool_use`
/// block (its input as far as it could be read), whole and streamed.
fn cut_tool_use(s: &Server) {
    let messages = json!([{"role": "user", "content": "What is the weather in Rome?"}]);
    let mut cut_calls = 0;
    for max_tokens in [8, 12, 16, 20] {
        let request = json!({"model": MODEL, "max_tokens": max_tokens, "messages": messages,
            "tools": [weather_tool()], "tool_choice": {"type": "tool", "name": "get_weather"},
            "temperature": 0});
        let r = post_json(s, request.clone(), 200);
        assert_eq!(r["usage"]["output_tokens"], max_tokens, "{r}");
        assert_eq!(r["stop_reason"], "max_tokens", "{r}");
        let blocks = r["content"].as_array().unwrap();
        assert!(
            blocks.iter().all(|b| b["type"] == "tool_use"),
            "the call's JSON never leaks as text: {r}"
        );
        if let Some(call) = blocks.last() {
            assert_eq!(call["name"], "get_weather", "{r}");
            assert!(call["input"].is_object(), "{r}");
            cut_calls += 1;
        }

        let mut streamed = request;
        streamed["stream"] = json!(true);
        let (status, body) = post(s, &streamed);
        assert_eq!(status, 200, "{body}");
        let events = events(&body);
        let (_, delta) = events
            .iter()
            .find(|(n, _)| n == "message_delta")
            .expect("a message_delta");
        assert_eq!(delta["delta"]["stop_reason"], "max_tokens", "{body}");
        let starts: Vec<&Value> = events
            .iter()
            .filter(|(n, _)| n == "content_block_start")
            .map(|(_, e)| &e["content_block"])
            .collect();
        assert_eq!(starts.len(), blocks.len(), "{body}");
        for (start, block) in starts.iter().zip(blocks) {
            assert_eq!(start["type"], "tool_use", "{body}");
            assert_eq!(start["name"], block["name"], "{body}");
        }
    }
    assert!(cut_calls > 0, "no reply was cut inside a call");
}

fn errors_and_keys(s: &Server) {
    for (body, status, kind, message) in [
        (
            json!({"model": MODEL, "messages": question()}),
            400,
            "invalid_request_error",
            "max_tokens is required",
        ),
        (
            json!({"model": "nope", "max_tokens": 5, "messages": question()}),
            404,
            "not_found_error",
            "model 'nope' not found",
        ),
    ] {
        let r = post_json(s, body, status);
        assert_eq!(
            r,
            json!({"type": "error", "error": {"type": kind, "message": message}})
        );
    }
    let body = json!({"model": MODEL, "max_tokens": 1, "messages": question()});
    let send = |header: Option<(&str, &str)>| {
        let mut request = client().post(s.url("/v1/messages")).json(&body);
        if let Some((name, value)) = header {
            request = request.header(name, value);
        }
        let r = request.send().unwrap();
        (r.status().as_u16(), r.json::<Value>().unwrap())
    };
    assert_eq!(send(Some(("authorization", "Bearer test-key"))).0, 200);
    let (status, r) = send(None);
    assert_eq!(status, 401);
    assert_eq!(r["type"], "error");
    assert_eq!(
        r["error"],
        json!({"type": "authentication_error", "message":
            "missing API key: send the header `Authorization: Bearer <key>` or `x-api-key: <key>`"})
    );
    let (status, r) = send(Some(("x-api-key", "wrong")));
    assert_eq!(status, 401);
    assert_eq!(r["error"]["message"], "invalid API key");
    // x-api-key opens the other routes too.
    let r = client()
        .get(s.url("/v1/models"))
        .header("x-api-key", KEY)
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
}
