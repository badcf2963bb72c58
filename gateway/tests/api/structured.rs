//! Structured output (`format`, `response_format`) and tool calling against
//! a real `hypura serve` with SmolLM2. Tool calls in a template family's own
//! syntax need a template that knows tools: the tests serve copies of SmolLM2
//! whose `tokenizer.chat_template` is replaced by a Qwen 2.5 (Hermes
//! `<tool_call>`) or a Llama 3.1 style template, written to a temporary
//! directory (SmolLM2's own template: `tools_generic.rs`).
#[path = "../common/mod.rs"]
mod common;

use std::path::PathBuf;
use std::sync::Mutex;

use common::templates::{copy_with_template, QWEN_2_5, QWEN_MODEL};
use common::{ndjson, sse, Server, MODEL};
use serde_json::{json, Value};

/// Llama 3.1's tool conventions (system header, bare `{"name", "parameters"}`
/// calls, `ipython` tool results), in ChatML turns SmolLM2 can follow.
const LLAMA_3_STYLE: &str = r#"{%- if tools is defined and tools %}
    {{- '<|im_start|>system\n<|start_header_id|>Environment: ipython\nRespond in the format {"name": function name, "parameters": dictionary of argument name and its value}. Functions:\n' }}
    {%- for t in tools %}
        {{- t | tojson }}
        {{- "\n" }}
    {%- endfor %}
    {{- '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'tool' %}
        {{- '<|im_start|>ipython\n' + message.content + '<|im_end|>\n' }}
    {%- elif message.tool_calls %}
        {{- '<|im_start|>assistant\n{"name": "' + message.tool_calls[0].function.name + '", "parameters": ' + message.tool_calls[0].function.arguments | tojson + '}<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"#;

const LLAMA_MODEL: &str = "smollm2-llama-tools:latest";

/// The two tool-template copies of SmolLM2 in a directory of the system's
/// temporary folder, shared by the tests running at once: written by the
/// first, removed when the last is done.
struct ToolModels {
    qwen: PathBuf,
    llama: PathBuf,
}

static TOOL_MODELS: Mutex<(usize, Option<PathBuf>)> = Mutex::new((0, None));

impl ToolModels {
    fn acquire() -> ToolModels {
        let mut shared = TOOL_MODELS.lock().unwrap_or_else(|e| e.into_inner());
        let dir = std::env::temp_dir().join(format!("hypura-structured-{}", std::process::id()));
        let models = ToolModels {
            qwen: dir.join("smollm2-qwen-tools.gguf"),
            llama: dir.join("smollm2-llama-tools.gguf"),
        };
        if shared.1.is_none() {
            std::fs::create_dir_all(&dir).unwrap();
            copy_with_template(&common::smollm2(), &models.qwen, QWEN_2_5);
            copy_with_template(&common::smollm2(), &models.llama, LLAMA_3_STYLE);
            shared.1 = Some(dir);
        }
        shared.0 += 1;
        models
    }
}

impl Drop for ToolModels {
    fn drop(&mut self) {
        let mut shared = TOOL_MODELS.lock().unwrap_or_else(|e| e.into_inner());
        shared.0 -= 1;
        if shared.0 == 0 {
            if let Some(dir) = shared.1.take() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
    }
}

/// A server of SmolLM2 and its two tool-template copies (stopped before
/// the copies are removed: fields drop in order).
struct ToolServer {
    server: Server,
    _models: ToolModels,
}

fn serve_with_tool_models() -> ToolServer {
    let models = ToolModels::acquire();
    let server = Server::start(&[
        models.qwen.to_str().unwrap(),
        models.llama.to_str().unwrap(),
        "--context",
        "2048",
    ]);
    ToolServer {
        server,
        _models: models,
    }
}

fn weather_tool(cities: &[&str]) -> Value {
    json!({"type": "function", "function": {
        "name": "get_weather",
        "description": "The current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": cities}},
            "required": ["city"],
        },
    }})
}

fn time_tool() -> Value {
    json!({"type": "function", "function": {
        "name": "get_time",
        "description": "The local time in a time zone",
        "parameters": {"type": "object", "properties": {"zone": {"enum": ["CET", "UTC"]}}, "required": ["zone"]},
    }})
}

const CITY_SCHEMA: &str = r#"{
    "type": "object",
    "properties": {
        "city": {"type": "string", "enum": ["Paris", "Berlin", "Rome"]},
        "country_code": {"type": "string", "enum": ["FR", "DE", "IT"]},
        "population_millions": {"type": "integer", "minimum": 0, "maximum": 99},
        "is_capital": {"type": "boolean"}
    },
    "required": ["city", "country_code", "population_millions", "is_capital"]
}"#;

fn city_schema() -> Value {
    serde_json::from_str(CITY_SCHEMA).unwrap()
}

/// Checks a reply against [`CITY_SCHEMA`]: exactly its keys, each of its type.
fn assert_city(text: &str) {
    let value: Value = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("the reply is not JSON ({e}): {text:?}"));
    let object = value.as_object().expect("a JSON object");
    let mut keys: Vec<&str> = object.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["city", "country_code", "is_capital", "population_millions"],
        "{text}"
    );
    assert!(["Paris", "Berlin", "Rome"].contains(&value["city"].as_str().unwrap()));
    assert!(["FR", "DE", "IT"].contains(&value["country_code"].as_str().unwrap()));
    assert!((0..=99).contains(&value["population_millions"].as_i64().unwrap()));
    assert!(value["is_capital"].is_boolean());
}

fn greedy() -> Value {
    json!({"temperature": 0, "num_predict": 200})
}

/// A prompt SmolLM2 answers with a short object under `format: "json"`.
const FRANCE_JSON: &str = "What is the capital of France? Reply in JSON with the key \"capital\".";
/// Its greedy reply, whole: the JSON grammar lets it end at the closing brace.
const FRANCE_REPLY: &str = "{\n  \"key\": \"capital\",\n  \"data\": {\n    \"title\": \"Paris\",\n    \"description\": \"The capital of France is Paris.\",\n    \"lang\": \"fr\"\n  }\n}";

#[test]
fn format_json_gives_a_json_object_on_generate_and_chat() {
    let s = Server::start(&[]);
    let r = s.post_json(
        "/api/generate",
        json!({"model": MODEL, "prompt": FRANCE_JSON, "format": "json",
               "stream": false, "options": greedy()}),
        200,
    );
    assert_eq!(r["done_reason"], "stop", "{r}");
    assert_eq!(r["response"], FRANCE_REPLY);
    assert!(serde_json::from_str::<Value>(FRANCE_REPLY)
        .unwrap()
        .is_object());

    let body = s
        .post(
            "/api/chat",
            json!({"model": MODEL, "messages": [{"role": "user", "content": FRANCE_JSON}],
                   "format": "json", "options": greedy()}),
        )
        .text()
        .unwrap();
    let chunks = ndjson(&body);
    let text: String = chunks
        .iter()
        .map(|c| c["message"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(chunks.last().unwrap()["done_reason"], "stop");
    assert_eq!(text, FRANCE_REPLY);
}

#[test]
fn a_json_schema_format_is_followed_on_both_apis() {
    let s = Server::start(&[]);
    let question = "Give facts about Berlin as JSON.";
    let r = s.post_json(
        "/api/generate",
        json!({"model": MODEL, "prompt": question, "format": city_schema(),
               "stream": false, "options": greedy()}),
        200,
    );
    assert_city(r["response"].as_str().unwrap());
    let r = s.post_json(
        "/api/chat",
        json!({"model": MODEL, "messages": [{"role": "user", "content": question}],
               "format": city_schema(), "stream": false, "options": greedy()}),
        200,
    );
    assert_city(r["message"]["content"].as_str().unwrap());

    let response_format = json!({"type": "json_schema", "json_schema": {
        "name": "city", "schema": city_schema(), "strict": true}});
    let messages = json!([{"role": "user", "content": question}]);
    let r = s.post_json(
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": messages, "temperature": 0,
               "response_format": response_format}),
        200,
    );
    assert_eq!(r["choices"][0]["finish_reason"], "stop");
    assert_city(r["choices"][0]["message"]["content"].as_str().unwrap());

    let body = s
        .post(
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": messages, "temperature": 0, "stream": true,
                   "response_format": response_format}),
        )
        .text()
        .unwrap();
    let events = sse(&body);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let text: String = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).unwrap())
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_city(&text);

    let r = s.post_json(
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": messages, "temperature": 0, "max_tokens": 200,
               "response_format": {"type": "json_object"}}),
        200,
    );
    assert_eq!(
        r["choices"][0]["message"]["content"],
        r#"{"city": "Berlin", "country": "DEUTSWALD"}"#
    );
}

#[test]
fn bad_formats_and_schemas_are_400s_that_say_why() {
    let s = Server::start(&[]);
    let user = json!([{"role": "user", "content": "x"}]);
    let bad_type = json!({"type": "object", "properties": {"a": {"type": "banana"}}});
    let r = s.post_json(
        "/api/chat",
        json!({"model": MODEL, "messages": user, "format": bad_type}),
        400,
    );
    assert_eq!(
        r["error"],
        "format: invalid JSON Schema: at #/properties/a: unrecognized type \"banana\": use one \
         of object, array, string, integer, number, boolean, null"
    );
    let r = s.post_json(
        "/api/generate",
        json!({"model": MODEL, "prompt": "x", "format": "yaml"}),
        400,
    );
    assert_eq!(
        r["error"],
        "invalid format \"yaml\": use \"json\" or a JSON Schema object"
    );
    let r = s.post_json(
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": user, "response_format":
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#/$defs/gone"}}}}),
        400,
    );
    assert_eq!(
        r["error"]["message"],
        "response_format.json_schema.schema: invalid JSON Schema: at #: $ref \"#/$defs/gone\" \
         points at nothing in the schema"
    );
    assert_eq!(r["error"]["type"], "invalid_request_error");
    let r = s.post_json(
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": user, "response_format": {"type": "xml"}}),
        400,
    );
    assert!(r["error"]["message"]
        .as_str()
        .unwrap()
        .starts_with("invalid response_format {\"type\":\"xml\"}"));
}

/// The forced call (tool_choice) comes back parsed, in OpenAI's shape,
/// whole and streamed, and the tool's answer can be sent back.
#[test]
fn openai_tool_calls_from_a_hermes_template() {
    let tool_server = serve_with_tool_models();
    let s = &tool_server.server;
    let messages = json!([{"role": "user", "content": "What is the weather in Rome?"}]);
    let tools = json!([weather_tool(&["Paris", "Rome"]), time_tool()]);
    let request = json!({"model": QWEN_MODEL, "messages": messages, "tools": tools,
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "temperature": 0});
    let r = s.post_json("/v1/chat/completions", request.clone(), 200);
    let choice = &r["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{r}");
    assert!(choice["message"]["content"].is_null(), "{r}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{r}");
    assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(calls[0]["type"], "function");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let arguments: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, json!({"city": "Rome"}));

    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let body = s.post("/v1/chat/completions", streamed).text().unwrap();
    let events = sse(&body);
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let content: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, "", "tool-call text must not leak as content");
    let deltas: Vec<&Value> = chunks
        .iter()
        .filter(|c| !c["choices"][0]["delta"]["tool_calls"].is_null())
        .collect();
    assert_eq!(deltas.len(), 1, "{body}");
    let call = &deltas[0]["choices"][0]["delta"]["tool_calls"][0];
    assert_eq!(call["index"], 0);
    assert_eq!(call["function"]["name"], "get_weather");
    assert_eq!(
        call["function"]["arguments"],
        calls[0]["function"]["arguments"]
    );
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "tool_calls"
    );

    // tool_choice "required" picks among all tools.
    let mut required = request.clone();
    required["tool_choice"] = json!("required");
    let r = s.post_json("/v1/chat/completions", required, 200);
    let call = &r["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(call["name"], "get_weather", "{r}");
    assert_eq!(call["arguments"], r#"{"city":"Rome"}"#, "{r}");

    // The call and the tool's result go back through the template.
    let history = json!([
        {"role": "user", "content": "What is the weather in Rome?"},
        {"role": "assistant", "content": null, "tool_calls": calls},
        {"role": "tool", "tool_call_id": calls[0]["id"], "content": "{\"celsius\": 21}"},
    ]);
    let r = s.post_json(
        "/v1/chat/completions",
        json!({"model": QWEN_MODEL, "messages": history, "tools": tools,
               "temperature": 0, "max_tokens": 16}),
        200,
    );
    assert!(r["usage"]["prompt_tokens"].as_u64().unwrap() > 200, "{r}");
    let r = s.post_json(
        "/v1/chat/completions",
        json!({"model": QWEN_MODEL, "messages": messages, "tools": tools,
               "tool_choice": {"type": "function", "function": {"name": "nope"}}}),
        400,
    );
    assert_eq!(
        r["error"]["message"],
        "tool_choice names function \"nope\", which is not among the tools"
    );
}

/// Ollama has no tool_choice: a JSON Schema `format` makes the model write a
/// Llama 3 style call, which comes back in `message.tool_calls`.
#[test]
fn ollama_tool_calls_from_a_llama_3_template() {
    let tool_server = serve_with_tool_models();
    let s = &tool_server.server;
    let call_schema = json!({
        "type": "object",
        "properties": {
            "name": {"const": "get_weather"},
            "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]}},
                           "required": ["city"]},
        },
        "required": ["name", "parameters"],
    });
    let messages = json!([{"role": "user", "content": "What is the weather in Paris?"}]);
    let request = json!({"model": LLAMA_MODEL, "messages": messages,
        "tools": [weather_tool(&["Paris", "Rome"])], "format": call_schema,
        "stream": false, "options": greedy()});
    let r = s.post_json("/api/chat", request.clone(), 200);
    assert_eq!(r["message"]["content"], "", "{r}");
    assert_eq!(r["done_reason"], "stop");
    let calls = r["message"]["tool_calls"].as_array().expect("tool_calls");
    assert_eq!(calls.len(), 1, "{r}");
    assert_eq!(calls[0]["function"]["index"], 0);
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(
        calls[0]["function"]["arguments"],
        json!({"city": "Paris"}),
        "{r}"
    );

    let mut streamed = request.clone();
    streamed["stream"] = json!(true);
    let chunks = ndjson(&s.post("/api/chat", streamed).text().unwrap());
    let content: String = chunks
        .iter()
        .map(|c| c["message"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(content, "", "tool-call text must not leak as content");
    let with_calls: Vec<&Value> = chunks
        .iter()
        .filter(|c| c["message"].get("tool_calls").is_some())
        .collect();
    assert_eq!(with_calls.len(), 1);
    assert_eq!(with_calls[0]["done"], false);
    assert_eq!(with_calls[0]["message"]["role"], "assistant");
    assert_eq!(
        with_calls[0]["message"]["tool_calls"],
        r["message"]["tool_calls"]
    );
    assert_eq!(chunks.last().unwrap()["done"], true);

    // Ollama-shaped history (no "type", object arguments, tool_name) renders.
    let history = json!([
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": calls},
        {"role": "tool", "tool_name": "get_weather", "content": "{\"celsius\": 18}"},
    ]);
    let r = s.post_json(
        "/api/chat",
        json!({"model": LLAMA_MODEL, "messages": history, "tools": [weather_tool(&["Paris"])],
               "stream": false, "options": {"temperature": 0, "num_predict": 8}}),
        200,
    );
    assert!(r["prompt_eval_count"].as_u64().unwrap() > 50, "{r}");
}
