//! Smaller gaps between hypura's dialects and the APIs they copy (issue 29,
//! item 6): Anthropic's `count_tokens`, OpenAI's 404 shape on every route,
//! `/api/show`'s `tensors` with `verbose`.
#[path = "../common/mod.rs"]
mod common;

use common::{Server, MODEL};
use serde_json::{json, Value};

#[test]
fn openai_404s_name_the_model_as_openai_does() {
    let s = Server::start(&[]);
    let chat = json!({"model": "nope", "messages": [{"role": "user", "content": "x"}]});
    for (route, body) in [
        ("/v1/chat/completions", chat),
        ("/v1/completions", json!({"model": "nope", "prompt": "x"})),
        ("/v1/embeddings", json!({"model": "nope", "input": "x"})),
        ("/v1/responses", json!({"model": "nope", "input": "x"})),
    ] {
        let r = s.post(route, body);
        assert_eq!(r.status(), 404, "{route}");
        let e: Value = r.json().unwrap();
        assert_eq!(
            e,
            json!({"error": {"message": "model 'nope' not found", "type": "invalid_request_error",
                "param": "model", "code": "model_not_found"}}),
            "{route}"
        );
    }
    let e: Value = s.get("/v1/models/nope").json().unwrap();
    assert_eq!(e["error"]["type"], "invalid_request_error");
    assert_eq!(e["error"]["code"], "model_not_found");
}

#[test]
fn count_tokens_counts_the_prompt_a_message_would_take() {
    let s = Server::start(&[]);
    let messages = json!([{"role": "user", "content": "What is the capital of France?"}]);
    let counted = s.post_json(
        "/v1/messages/count_tokens",
        json!({"model": MODEL, "system": "Be brief.", "messages": messages}),
        200,
    );
    let reply = s.post_json(
        "/v1/messages",
        json!({"model": MODEL, "system": "Be brief.", "messages": messages, "max_tokens": 1}),
        200,
    );
    assert_eq!(
        counted,
        json!({"input_tokens": reply["usage"]["input_tokens"]})
    );
    assert!(counted["input_tokens"].as_u64().unwrap() > 10);

    // Tools take their place in the prompt.
    let tool = json!({"name": "get_weather", "description": "The weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}});
    let with_tools = s.post_json(
        "/v1/messages/count_tokens",
        json!({"model": MODEL, "system": "Be brief.", "messages": messages, "tools": [tool]}),
        200,
    );
    assert!(with_tools["input_tokens"].as_u64() > counted["input_tokens"].as_u64());

    let r = s.post(
        "/v1/messages/count_tokens",
        json!({"model": "nope", "messages": messages}),
    );
    assert_eq!(r.status(), 404);
    let e: Value = r.json().unwrap();
    assert_eq!(e["type"], "error");
    assert_eq!(e["error"]["type"], "not_found_error");
}

#[test]
fn show_verbose_lists_the_tensors() {
    let s = Server::start(&[]);
    let plain = s.post_json("/api/show", json!({"model": MODEL}), 200);
    assert!(plain.get("tensors").is_none());
    let verbose = s.post_json("/api/show", json!({"model": MODEL, "verbose": true}), 200);
    let tensors = verbose["tensors"].as_array().unwrap();
    // SmolLM2-135M: 30 blocks of 9 tensors, the token embeddings, the output norm.
    assert_eq!(tensors.len(), 272);
    assert_eq!(
        tensors[0],
        json!({"name": "token_embd.weight", "type": "Q8_0", "shape": [576, 49152]})
    );
    assert!(tensors.contains(
        &json!({"name": "blk.29.ffn_down.weight", "type": "Q4_1", "shape": [1536, 576]})
    ));
}
