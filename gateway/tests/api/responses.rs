//! `POST /v1/responses` (OpenAI's Responses API) on the wire, against a real
//! `hypura serve` with SmolLM2 and a copy of it with Qwen 2.5's tool
//! template: whole and streamed replies, their exact event order,
//! `max_output_tokens`, `text.format` JSON Schemas, function calls and their
//! outputs going back in, and the 400s. The official `openai` SDK drives the
//! same route in `tests/clients/test_responses_client.py`.
#[path = "../common/mod.rs"]
mod common;

use common::templates::{QwenCopy, QWEN_MODEL};
use common::{Server, MODEL};
use serde_json::{json, Value};

const GERMANY: &str = "The capital of Germany is Berlin.";
const QUESTION: &str = "What is the capital of Germany?";

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

fn names(events: &[(String, Value)]) -> Vec<&str> {
    events.iter().map(|(n, _)| n.as_str()).collect()
}

fn weather_tool() -> Value {
    json!({"type": "function", "name": "get_weather", "description": "The current weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
            "required": ["city"]}})
}

#[test]
fn responses_whole_streamed_structured_with_tools_and_refusals() {
    let qwen = QwenCopy::new("responses");
    let s = Server::start(&[qwen.path.to_str().unwrap(), "--context", "2048"]);
    whole(&s);
    streamed(&s);
    cut_by_max_output_tokens(&s);
    json_schema_format(&s);
    function_calls(&s);
    refusals(&s);
}

fn whole(s: &Server) {
    let r = s.post_json(
        "/v1/responses",
        json!({"model": MODEL, "input": QUESTION, "temperature": 0}),
        200,
    );
    assert!(r["id"].as_str().unwrap().starts_with("resp_"), "{r}");
    assert_eq!(r["object"], "response");
    assert_eq!(r["status"], "completed");
    assert_eq!(r["model"], MODEL);
    let output = r["output"].as_array().unwrap();
    assert_eq!(output.len(), 1, "{r}");
    assert_eq!(output[0]["type"], "message");
    assert_eq!(output[0]["role"], "assistant");
    assert_eq!(output[0]["content"][0]["type"], "output_text");
    assert_eq!(output[0]["content"][0]["text"], GERMANY);
    let usage = &r["usage"];
    assert!(usage["input_tokens"].as_u64().unwrap() > 10, "{usage}");
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["input_tokens"].as_u64().unwrap() + usage["output_tokens"].as_u64().unwrap()
    );

    // The same question as a list of items, with instructions: they change the prompt.
    let items = json!([{"type": "message", "role": "user",
        "content": [{"type": "input_text", "text": QUESTION}]}]);
    let same = s.post_json(
        "/v1/responses",
        json!({"model": MODEL, "input": items, "temperature": 0}),
        200,
    );
    assert_eq!(same["output"][0]["content"][0]["text"], GERMANY);
    assert_eq!(same["usage"]["input_tokens"], usage["input_tokens"]);
    // Instructions are the system message: the prompt is the chat route's.
    let instructed = s.post_json(
        "/v1/responses",
        json!({"model": MODEL, "input": QUESTION, "instructions": "Answer in French.",
            "temperature": 0, "max_output_tokens": 1}),
        200,
    );
    assert_eq!(instructed["instructions"], "Answer in French.");
    let chat = s.post_json(
        "/v1/chat/completions",
        json!({"model": MODEL, "max_tokens": 1, "messages": [
            {"role": "system", "content": "Answer in French."},
            {"role": "user", "content": QUESTION}]}),
        200,
    );
    assert_eq!(
        instructed["usage"]["input_tokens"],
        chat["usage"]["prompt_tokens"]
    );
    assert_ne!(instructed["usage"]["input_tokens"], usage["input_tokens"]);
}

fn streamed(s: &Server) {
    let r = s.post(
        "/v1/responses",
        json!({"model": MODEL, "input": QUESTION, "temperature": 0, "stream": true}),
    );
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let events = events(&r.text().unwrap());
    let names = names(&events);
    let deltas = names
        .iter()
        .filter(|n| **n == "response.output_text.delta")
        .count();
    assert!(deltas >= 2, "{names:?}");
    let mut expected = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    expected.extend(std::iter::repeat_n("response.output_text.delta", deltas));
    expected.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]);
    assert_eq!(names, expected);
    for (i, (_, data)) in events.iter().enumerate() {
        assert_eq!(data["sequence_number"], i, "{data}");
    }
    let text: String = events
        .iter()
        .filter_map(|(_, d)| d["delta"].as_str())
        .collect();
    assert_eq!(text, GERMANY);
    let completed = &events.last().unwrap().1["response"];
    assert_eq!(completed["status"], "completed");
    assert_eq!(completed["id"], events[0].1["response"]["id"]);
    assert_eq!(completed["output"][0]["content"][0]["text"], GERMANY);
    assert!(completed["usage"]["output_tokens"].as_u64().unwrap() > 0);
}

fn cut_by_max_output_tokens(s: &Server) {
    let r = s.post_json(
        "/v1/responses",
        json!({"model": MODEL, "input": QUESTION, "temperature": 0, "max_output_tokens": 3}),
        200,
    );
    assert_eq!(r["status"], "incomplete", "{r}");
    assert_eq!(r["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(r["usage"]["output_tokens"], 3);
    assert_eq!(r["max_output_tokens"], 3);
    assert!(GERMANY.starts_with(r["output"][0]["content"][0]["text"].as_str().unwrap()));
}

fn json_schema_format(s: &Server) {
    let schema = json!({"type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Berlin", "Rome"]},
            "country_code": {"type": "string", "enum": ["FR", "DE", "IT"]}},
        "required": ["city", "country_code"], "additionalProperties": false});
    let format =
        json!({"type": "json_schema", "name": "capital", "schema": schema, "strict": true});
    for stream in [false, true] {
        let request = json!({"model": MODEL, "input": QUESTION, "temperature": 0,
            "max_output_tokens": 100, "text": {"format": format}, "stream": stream});
        let r = s.post("/v1/responses", request);
        assert_eq!(r.status(), 200);
        let body = r.text().unwrap();
        let response = if stream {
            events(&body).last().unwrap().1["response"].clone()
        } else {
            serde_json::from_str(&body).unwrap()
        };
        assert_eq!(response["text"]["format"], format);
        let text = response["output"][0]["content"][0]["text"]
            .as_str()
            .unwrap();
        let value: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text:?}"));
        let mut keys: Vec<&String> = value.as_object().unwrap().keys().collect();
        keys.sort();
        assert_eq!(keys, ["city", "country_code"], "{text}");
        assert!(["Paris", "Berlin", "Rome"].contains(&value["city"].as_str().unwrap()));
    }
}

fn function_calls(s: &Server) {
    let request = json!({"model": QWEN_MODEL, "input": "What is the weather in Rome?",
        "tools": [weather_tool()], "tool_choice": {"type": "function", "name": "get_weather"},
        "temperature": 0});
    let r = s.post_json("/v1/responses", request.clone(), 200);
    let output = r["output"].as_array().unwrap();
    assert_eq!(output.len(), 1, "{r}");
    let call = &output[0];
    assert_eq!(call["type"], "function_call");
    assert_eq!(call["status"], "completed");
    assert_eq!(call["name"], "get_weather");
    assert!(call["id"].as_str().unwrap().starts_with("fc_"));
    assert!(call["call_id"].as_str().unwrap().starts_with("call_"));
    let arguments: Value = serde_json::from_str(call["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, json!({"city": "Rome"}));
    assert_eq!(r["tools"], json!([weather_tool()]));

    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let events = events(&s.post("/v1/responses", streamed).text().unwrap());
    assert_eq!(
        names(&events),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ],
        "tool-call text must not leak as output_text"
    );
    assert_eq!(events[3].1["delta"], call["arguments"]);
    assert_eq!(events[5].1["item"]["name"], "get_weather");

    // The call and its output go back in as items, through the template.
    let input = json!([
        {"role": "user", "content": "What is the weather in Rome?"},
        {"type": "function_call", "call_id": call["call_id"], "name": "get_weather",
            "arguments": call["arguments"]},
        {"type": "function_call_output", "call_id": call["call_id"], "output": "{\"celsius\": 21}"},
    ]);
    let r = s.post_json(
        "/v1/responses",
        json!({"model": QWEN_MODEL, "input": input, "tools": [weather_tool()],
            "temperature": 0, "max_output_tokens": 16}),
        200,
    );
    assert!(r["usage"]["input_tokens"].as_u64().unwrap() > 200, "{r}");
}

fn refusals(s: &Server) {
    for (body, status, message) in [
        (
            json!({"model": MODEL, "input": "x", "previous_response_id": "resp_1"}),
            400,
            "previous_response_id is not supported: this server stores no responses; send the \
             whole conversation in input",
        ),
        (json!({"model": MODEL}), 400, "input is required"),
        (
            json!({"model": "nope", "input": "x"}),
            404,
            "model 'nope' not found",
        ),
        (
            json!({"model": MODEL, "input": "x", "text": {"format": {"type": "json_schema",
                "schema": {"type": "object", "minProperties": 3, "maxProperties": 1}}}}),
            400,
            "text.format.schema: invalid JSON Schema: at #: minProperties (3) is greater than \
             maxProperties (1): no value can satisfy it",
        ),
    ] {
        let r = s.post_json("/v1/responses", body, status);
        assert_eq!(r["error"]["message"], message, "{r}");
    }
    // The server is still up.
    s.post_json(
        "/v1/responses",
        json!({"model": MODEL, "input": "Hi", "max_output_tokens": 1}),
        200,
    );
}

/// An empty `input` is a 400 naming `input`, as OpenAI's is (it named hypura's internal
/// `messages`), with instructions or without; only reasoning items leave nothing to answer too.
#[test]
fn empty_input_is_a_400_naming_input() {
    let s = Server::start(&[]);
    for body in [
        json!({"model": MODEL, "input": []}),
        json!({"model": MODEL, "input": [], "instructions": "Be brief."}),
        json!({"model": MODEL, "input": [], "stream": true}),
        json!({"model": MODEL, "input": [{"type": "reasoning", "summary": []}]}),
    ] {
        let r = s.post_json("/v1/responses", body.clone(), 400);
        assert_eq!(
            r["error"]["message"], "input must be a non-empty string or list of them",
            "{body}"
        );
        assert_eq!(r["error"]["type"], "invalid_request_error");
    }
}
