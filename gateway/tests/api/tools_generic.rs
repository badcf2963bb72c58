//! Tools on a model whose chat template knows nothing of them (SmolLM2's):
//! llama.cpp's generic format, against a real `hypura serve`. The tools go
//! into the system prompt and a grammar holds the reply to `{"tool_call"…}`,
//! `{"tool_calls": […]}` or `{"response": "…"}`; the gateway turns that back
//! into each dialect's tool calls or content. SmolLM2-135M is weak: the
//! assertions are on shape (which the grammar guarantees), not on wisdom.
#[path = "../common/mod.rs"]
mod common;

use common::{ndjson, sse, Server, MODEL};
use serde_json::{json, Value};

const UNITS: [&str; 2] = ["celsius", "fahrenheit"];

fn weather_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Paris"},
                "unit": {"type": "string", "enum": UNITS},
            },
            "required": ["city", "unit"],
        },
    }})
}

fn question() -> Value {
    json!([{"role": "user", "content": "What is the weather in Paris? Use the tool."}])
}

/// Arguments that follow `get_weather`'s schema: a city, a unit from the enum, nothing else.
fn assert_weather_arguments(arguments: &Value) {
    let object = arguments.as_object().expect("arguments are an object");
    assert!(object["city"].is_string(), "{arguments}");
    assert!(
        UNITS.contains(&object["unit"].as_str().unwrap_or_default()),
        "{arguments}"
    );
    assert_eq!(object.len(), 2, "{arguments}");
}

/// OpenAI `tool_calls`: ids, type, the tool's name, arguments as JSON text.
fn assert_openai_calls(calls: &Value) -> usize {
    let calls = calls.as_array().expect("tool_calls is a list");
    assert!(!calls.is_empty());
    for call in calls {
        assert!(call["id"].as_str().unwrap().starts_with("call_"), "{call}");
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"]["name"], "get_weather");
        let text = call["function"]["arguments"].as_str().expect("JSON text");
        assert_weather_arguments(&serde_json::from_str(text).expect("arguments parse"));
    }
    calls.len()
}

#[test]
fn generic_tool_calls_on_smollm2() {
    let s = Server::start(&["--context", "2048"]);

    let show = s.post_json("/api/show", json!({"model": MODEL}), 200);
    assert_eq!(show["capabilities"], json!(["completion", "tools"]));

    // tool_choice required: a call, whole and streamed, in OpenAI's shape.
    let request = json!({"model": MODEL, "messages": question(), "tools": [weather_tool()],
        "tool_choice": "required", "temperature": 0, "max_tokens": 120});
    let r = s.post_json("/v1/chat/completions", request.clone(), 200);
    let choice = &r["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{r}");
    assert!(choice["message"]["content"].is_null(), "{r}");
    let calls = assert_openai_calls(&choice["message"]["tool_calls"]);

    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let events = sse(&s.post("/v1/chat/completions", streamed).text().unwrap());
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "", "the reply's JSON must not leak as content");
    let deltas: Vec<&Value> = chunks
        .iter()
        .map(|c| &c["choices"][0]["delta"]["tool_calls"])
        .filter(|c| !c.is_null())
        .collect();
    assert_eq!(deltas.len(), 1);
    assert_eq!(
        assert_openai_calls(deltas[0]),
        calls,
        "greedy: the same calls"
    );

    // One call at a time: exactly one.
    let mut single = request.clone();
    single["parallel_tool_calls"] = json!(false);
    let r = s.post_json("/v1/chat/completions", single, 200);
    assert_eq!(
        assert_openai_calls(&r["choices"][0]["message"]["tool_calls"]),
        1
    );

    // A named function is a call to it.
    let mut named = request.clone();
    named["tool_choice"] = json!({"type": "function", "function": {"name": "get_weather"}});
    let r = s.post_json("/v1/chat/completions", named, 200);
    assert_openai_calls(&r["choices"][0]["message"]["tool_calls"]);

    // "none": no tools, no grammar, plain text.
    let mut none = request.clone();
    none["tool_choice"] = json!("none");
    none["max_tokens"] = json!(8);
    let r = s.post_json("/v1/chat/completions", none, 200);
    assert!(r["choices"][0]["message"]["tool_calls"].is_null(), "{r}");
    assert!(r["choices"][0]["message"]["content"].is_string());

    // With a response format too: a clear 400 (both would need the grammar).
    let mut with_format = request.clone();
    with_format["response_format"] = json!({"type": "json_object"});
    let r = s.post_json("/v1/chat/completions", with_format, 400);
    assert!(r["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("tools and a response format cannot be combined"));

    ollama_chat(&s);
    tool_results_in_history(&s);
}

/// `/api/chat` (no tool_choice there: the model picks a call or an
/// answer): either way the reply is well-formed, whole and streamed.
fn ollama_chat(s: &Server) {
    let request = json!({"model": MODEL, "messages": question(), "tools": [weather_tool()],
        "stream": false, "options": {"temperature": 0, "num_predict": 80}});
    let r = s.post_json("/api/chat", request.clone(), 200);
    let message = &r["message"];
    let calls = message["tool_calls"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    if calls.is_empty() {
        let content = message["content"].as_str().unwrap();
        assert!(!content.contains("\"response\""), "{r}");
    } else {
        assert_eq!(message["content"], "", "{r}");
        for (i, call) in calls.iter().enumerate() {
            assert_eq!(call["function"]["index"], i);
            assert_eq!(call["function"]["name"], "get_weather");
            assert_weather_arguments(&call["function"]["arguments"]);
        }
    }
    let mut streamed = request;
    streamed["stream"] = json!(true);
    let chunks = ndjson(&s.post("/api/chat", streamed).text().unwrap());
    let content: String = chunks
        .iter()
        .map(|c| c["message"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(content, message["content"].as_str().unwrap());
    let streamed_calls: Vec<Value> = chunks
        .iter()
        .filter_map(|c| c["message"]["tool_calls"].as_array().cloned())
        .flatten()
        .collect();
    assert_eq!(streamed_calls, calls);
    assert_eq!(chunks.last().unwrap()["done"], true);
}

/// A call and the tool's result sent back: the history renders (the call as
/// the assistant's JSON, the result as a turn) and the model answers.
fn tool_results_in_history(s: &Server) {
    let call = json!({"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\",\"unit\":\"celsius\"}"}});
    let history = json!([
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 18 degrees celsius."},
    ]);
    let without_result = s.post_json(
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": history.as_array().unwrap()[..1],
               "tools": [weather_tool()], "max_tokens": 1}),
        200,
    );
    let r = s.post_json(
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": history, "tools": [weather_tool()],
               "temperature": 0, "max_tokens": 60}),
        200,
    );
    let tokens = |r: &Value| r["usage"]["prompt_tokens"].as_u64().unwrap();
    assert!(
        tokens(&r) > tokens(&without_result) + 20,
        "the call and its result are in the prompt: {r}"
    );
    let message = &r["choices"][0]["message"];
    match message["tool_calls"].as_array() {
        // SmolLM2 calls again (and again): the limit may cut the last call.
        Some(calls) if r["choices"][0]["finish_reason"] == "length" => {
            let (last, whole) = calls.split_last().unwrap();
            assert_eq!(last["function"]["name"], "get_weather", "{r}");
            if !whole.is_empty() {
                assert_openai_calls(&Value::Array(whole.to_vec()));
            }
        }
        Some(calls) => {
            assert_openai_calls(&Value::Array(calls.clone()));
        }
        None => assert!(!message["content"].as_str().unwrap().is_empty(), "{r}"),
    }

    // Ollama's shape of the same history (object arguments, tool_name).
    let r = s.post_json(
        "/api/chat",
        json!({"model": MODEL, "stream": false, "tools": [weather_tool()],
        "options": {"temperature": 0, "num_predict": 60}, "cache_prompt": false,
        "messages": [
            {"role": "user", "content": "What is the weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [{"function":
                {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}]},
            {"role": "tool", "tool_name": "get_weather", "content": "Sunny, 18 degrees."},
        ]}),
        200,
    );
    // The whole rendered history was evaluated (nothing read from the cache).
    assert!(r["prompt_eval_count"].as_u64().unwrap() > 100, "{r}");
    assert_eq!(r["done"], true);
}

/// A reply cut by the token limit (issue 29, item 3): never the format's
/// JSON as content; a call the limit cut is a `tool_calls` entry with the
/// arguments as far as they go, `finish_reason: "length"`, as OpenAI
/// reports one. The grammar is compact, so a whole call fits in 60 tokens.
#[test]
fn replies_cut_by_the_token_limit_never_leak_the_json() {
    let s = Server::start(&["--context", "2048"]);
    let history = json!([
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\",\"unit\":\"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 18 degrees celsius."},
    ]);
    let mut cut_calls = 0;
    for (messages, choice) in [
        (question(), "required"),
        (question(), "auto"),
        (history.clone(), "auto"),
    ] {
        for max_tokens in [6, 12, 20, 28, 40] {
            let request = json!({"model": MODEL, "messages": messages, "tools": [weather_tool()],
                "tool_choice": choice, "temperature": 0, "max_tokens": max_tokens});
            let r = s.post_json("/v1/chat/completions", request.clone(), 200);
            let choice_out = &r["choices"][0];
            let message = &choice_out["message"];
            let content = message["content"].as_str().unwrap_or_default();
            assert!(
                !content.contains("tool_call") && !content.trim_start().starts_with('{'),
                "{r}"
            );
            let finish = choice_out["finish_reason"].as_str().unwrap();
            if let Some(calls) = message["tool_calls"].as_array() {
                assert_eq!(content, "", "{r}");
                for call in calls {
                    assert_eq!(call["function"]["name"], "get_weather", "{r}");
                    assert!(call["function"]["arguments"].is_string(), "{r}");
                }
                let last = calls.last().unwrap()["function"]["arguments"]
                    .as_str()
                    .unwrap();
                if serde_json::from_str::<Value>(last).is_err() {
                    assert_eq!(finish, "length", "{r}");
                    assert!(last.starts_with('{'), "{r}");
                    cut_calls += 1;
                }
            }
            if r["usage"]["completion_tokens"] == max_tokens {
                assert_eq!(finish, "length", "{r}");
            }

            // Streamed: the same, as deltas.
            let mut streamed = request;
            streamed["stream"] = json!(true);
            let events = sse(&s.post("/v1/chat/completions", streamed).text().unwrap());
            let chunks: Vec<Value> = events[..events.len() - 1]
                .iter()
                .map(|e| serde_json::from_str(e).unwrap())
                .collect();
            let content: String = chunks
                .iter()
                .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
                .collect();
            assert!(!content.contains("tool_call"), "{content}");
            let finishes: Vec<&Value> = chunks
                .iter()
                .map(|c| &c["choices"][0]["finish_reason"])
                .filter(|f| !f.is_null())
                .collect();
            assert_eq!(finishes, [finish], "{max_tokens}");
        }
    }
    assert!(cut_calls > 0, "no reply was cut inside a call");

    // Whole, a call takes few tokens: no whitespace to spend them on.
    let r = s.post_json(
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": question(), "tools": [weather_tool()],
            "tool_choice": "required", "temperature": 0, "max_tokens": 60}),
        200,
    );
    assert_eq!(r["choices"][0]["finish_reason"], "tool_calls", "{r}");
    assert_openai_calls(&r["choices"][0]["message"]["tool_calls"]);

    // Ollama: a cut call's arguments as far as they go (an object), or no
    // call; never the JSON as content.
    for num_predict in [6, 12, 20, 28] {
        let r = s.post_json(
            "/api/chat",
            json!({"model": MODEL, "messages": question(), "tools": [weather_tool()],
                "stream": false, "options": {"temperature": 0, "num_predict": num_predict}}),
            200,
        );
        let content = r["message"]["content"].as_str().unwrap();
        assert!(!content.contains("tool_call"), "{r}");
        if let Some(calls) = r["message"]["tool_calls"].as_array() {
            assert!(
                calls.iter().all(|c| c["function"]["arguments"].is_object()),
                "{r}"
            );
        }
    }
}
