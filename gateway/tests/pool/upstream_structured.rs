//! Structured output and tool calls through an upstream peer (issue 27,
//! item 3): a front `hypura serve` with no model of its own passes a JSON
//! Schema (`format`, `response_format`) and tools with their choice on to a
//! peer serving SmolLM2, over the peer's Ollama API (kind `hypura`) and its
//! OpenAI API (kind `openai`); the reply is a valid object, and the peer's
//! tool calls come back parsed, in each of the front's dialects. Before, a
//! front refused structured output for a peer's model with a 400.
#[path = "../common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};

use common::{ndjson, sse, Server, MODEL};
use serde_json::{json, Value};

/// `hypura serve --config FILE` with no model of its own, using `peer`
/// through `kind`'s API.
fn front(peer: &Server, kind: &str) -> (Server, PathBuf) {
    let url = match kind {
        "openai" => format!("{}/v1", peer.base),
        _ => peer.base.clone(),
    };
    let config = std::env::temp_dir().join(format!(
        "hypura-upstream-structured-{}-{kind}.toml",
        std::process::id()
    ));
    std::fs::write(
        &config,
        format!("[[upstreams]]\nname = \"peer\"\nurl = \"{url}\"\nkind = \"{kind}\"\n"),
    )
    .unwrap();
    let server = Server::start_with(&[
        "serve".into(),
        "--config".into(),
        config.to_string_lossy().into_owned(),
        "--port".into(),
        "0".into(),
    ]);
    (server, config)
}

fn city_schema() -> Value {
    json!({"type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 16},
            "population": {"type": "integer", "minimum": 0, "maximum": 99999},
        },
        "required": ["city", "population"],
        "additionalProperties": false})
}

/// `text` is a JSON object `city_schema` accepts.
fn assert_city(text: &str) {
    let value: Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"));
    let object = value.as_object().unwrap_or_else(|| panic!("{value}"));
    assert_eq!(object.len(), 2, "{value}");
    assert!(
        object["city"]
            .as_str()
            .is_some_and(|c| c.chars().count() <= 16),
        "{value}"
    );
    assert!(
        object["population"].as_u64().is_some_and(|p| p <= 99_999),
        "{value}"
    );
}

fn question() -> Value {
    json!([{"role": "user", "content": "Name a city and its population, as JSON."}])
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {"type": "object",
            "properties": {"city": {"type": "string", "description": "The city, e.g. Paris"}},
            "required": ["city"]},
    }})
}

fn weather_question() -> Value {
    json!([{"role": "user", "content": "What is the weather in Paris? Use the tool."}])
}

/// A JSON Schema through each kind of peer, on the front's Ollama and
/// OpenAI routes, whole and streamed.
fn structured_output(front: &Server) {
    let r = front.post_json(
        "/api/chat",
        json!({"model": MODEL, "messages": question(), "format": city_schema(), "stream": false,
            "options": {"temperature": 0, "num_predict": 120}}),
        200,
    );
    assert_eq!(r["done_reason"], "stop", "{r}");
    assert_city(r["message"]["content"].as_str().unwrap());
    let chunks = ndjson(
        &front
            .post(
                "/api/chat",
                json!({"model": MODEL, "messages": question(), "format": city_schema(),
                    "options": {"temperature": 0, "num_predict": 120}}),
            )
            .text()
            .unwrap(),
    );
    let streamed: String = chunks
        .iter()
        .map(|c| c["message"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(streamed, r["message"]["content"].as_str().unwrap());

    let r = front.post_json(
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": question(), "temperature": 0, "max_tokens": 120,
            "response_format": {"type": "json_schema",
                "json_schema": {"name": "city", "schema": city_schema(), "strict": true}}}),
        200,
    );
    assert_eq!(r["choices"][0]["finish_reason"], "stop", "{r}");
    assert_city(r["choices"][0]["message"]["content"].as_str().unwrap());

    // Any JSON object (`"json"`, `json_object`).
    let r = front.post_json(
        "/api/generate",
        json!({"model": MODEL, "prompt": "A JSON object describing a cat:", "format": "json",
            "stream": false, "options": {"temperature": 0, "num_predict": 80}}),
        200,
    );
    let text = r["response"].as_str().unwrap();
    if r["done_reason"] == "stop" {
        assert!(
            serde_json::from_str::<Value>(text).is_ok_and(|v| v.is_object()),
            "{r}"
        );
    } else {
        assert!(text.trim_start().starts_with('{'), "{r}");
    }
}

/// The calls of an OpenAI chat completion, whole.
fn openai_calls(r: &Value) -> Vec<(String, Value)> {
    r["choices"][0]["message"]["tool_calls"]
        .as_array()
        .unwrap_or_else(|| panic!("no tool_calls: {r}"))
        .iter()
        .map(|c| {
            assert_eq!(c["type"], "function", "{r}");
            let arguments = c["function"]["arguments"].as_str().unwrap();
            (
                c["function"]["name"].as_str().unwrap().to_string(),
                serde_json::from_str(arguments).unwrap(),
            )
        })
        .collect()
}

#[test]
fn structured_output_and_tool_calls_pass_through_a_peer() {
    let peer = Server::start(&["--keep-alive", "-1"]);
    let (via_ollama, ollama_config) = front(&peer, "hypura");
    let (via_openai, openai_config) = front(&peer, "openai");
    for front in [&via_ollama, &via_openai] {
        structured_output(front);
    }

    // A forced call through the peer's OpenAI API: parsed, whole and streamed.
    let forced = json!({"model": MODEL, "messages": weather_question(),
        "tools": [weather_tool()], "tool_choice": "required", "temperature": 0, "max_tokens": 80});
    let r = via_openai.post_json("/v1/chat/completions", forced.clone(), 200);
    assert_eq!(r["choices"][0]["finish_reason"], "tool_calls", "{r}");
    let calls = openai_calls(&r);
    assert_eq!(calls.len(), 1, "{r}");
    assert_eq!(calls[0].0, "get_weather");
    assert!(calls[0].1["city"].is_string(), "{r}");
    // The same call the peer makes when asked itself.
    let direct = peer.post_json("/v1/chat/completions", forced.clone(), 200);
    assert_eq!(openai_calls(&direct), calls);
    let mut streamed = forced.clone();
    streamed["stream"] = json!(true);
    let events = sse(&via_openai
        .post("/v1/chat/completions", streamed)
        .text()
        .unwrap());
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let names: Vec<&str> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .filter_map(|c| c["function"]["name"].as_str())
        .collect();
    assert_eq!(names, ["get_weather"]);
    let arguments: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array())
        .flatten()
        .filter_map(|c| c["function"]["arguments"].as_str())
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&arguments).unwrap(),
        calls[0].1
    );
    let finishes: Vec<&Value> = chunks
        .iter()
        .map(|c| &c["choices"][0]["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finishes, [&json!("tool_calls")]);

    // Ollama's API has no tool_choice: a forced call cannot pass on, and
    // says so; `auto` does.
    let refused = via_ollama.post("/v1/chat/completions", forced);
    assert_eq!(refused.status(), 400);
    let body: Value = refused.json().unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("tool_choice"), "{message}");
    assert!(!message.contains(&peer.base), "{message}");

    // Tools on the front's Ollama route, through either API: the same
    // reply as the peer's own, its calls parsed (SmolLM2 at temperature 0
    // calls the tool).
    let chat = json!({"model": MODEL, "messages": weather_question(), "tools": [weather_tool()],
        "stream": false, "options": {"temperature": 0, "num_predict": 80}});
    let direct = peer.post_json("/api/chat", chat.clone(), 200);
    let direct_calls = direct["message"]["tool_calls"].as_array().cloned();
    let direct_calls = direct_calls.unwrap_or_else(|| panic!("no call: {direct}"));
    assert_eq!(direct_calls[0]["function"]["name"], "get_weather");
    for front in [&via_ollama, &via_openai] {
        let r = front.post_json("/api/chat", chat.clone(), 200);
        assert_eq!(r["message"]["content"], direct["message"]["content"], "{r}");
        let calls = r["message"]["tool_calls"]
            .as_array()
            .unwrap_or_else(|| panic!("{r}"));
        assert_eq!(calls.len(), direct_calls.len(), "{r}");
        for (call, expected) in calls.iter().zip(&direct_calls) {
            assert_eq!(call["function"]["name"], expected["function"]["name"]);
            assert_eq!(
                call["function"]["arguments"],
                expected["function"]["arguments"]
            );
        }
        let mut streamed = chat.clone();
        streamed["stream"] = json!(true);
        let chunks = ndjson(&front.post("/api/chat", streamed).text().unwrap());
        let streamed_calls: Vec<Value> = chunks
            .iter()
            .filter_map(|c| c["message"]["tool_calls"].as_array().cloned())
            .flatten()
            .collect();
        assert_eq!(streamed_calls.len(), direct_calls.len());
        assert_eq!(chunks.last().unwrap()["done"], true);
    }
    for config in [ollama_config, openai_config] {
        let _ = std::fs::remove_file(Path::new(&config));
    }
}
