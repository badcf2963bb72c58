//! `hypura serve` end to end: every route and error path over HTTP, on the
//! real SmolLM2 model (greedy, so the texts are exact).
#[path = "../common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader};
use std::time::Duration;

use common::{client, ndjson, sse, wait_until, Server, MODEL};
use serde_json::{json, Value};

const GERMANY: &str = "The capital of Germany is Berlin.";

fn greedy(n: u32) -> Value {
    json!({"temperature": 0, "num_predict": n})
}

#[test]
fn metadata_routes() {
    let s = Server::start(&[]);
    let r = s.get("/");
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().unwrap(), "Ollama is running");
    let r = client().head(s.url("/")).send().unwrap();
    assert_eq!(r.status(), 200);

    let v: Value = s.get("/api/version").json().unwrap();
    let version = v["version"].as_str().unwrap();
    assert!(
        version.split('.').count() == 3 && version.split('.').all(|p| p.parse::<u32>().is_ok()),
        "{version}"
    );

    let tags: Value = s.get("/api/tags").json().unwrap();
    let m = &tags["models"][0];
    assert_eq!(m["name"], MODEL);
    assert_eq!(m["model"], MODEL);
    assert_eq!(m["size"], 98_362_432);
    assert_eq!(m["digest"].as_str().unwrap().len(), 64);
    assert_eq!(m["details"]["format"], "gguf");
    assert_eq!(m["details"]["family"], "llama");
    assert_eq!(m["details"]["families"], json!(["llama"]));
    assert_eq!(m["details"]["parameter_size"], "135M");
    assert_eq!(m["details"]["quantization_level"], "Q4_1");
    assert!(m["modified_at"].as_str().unwrap().contains('T'));

    // Nothing loaded yet; /api/show reads only the header.
    let ps: Value = s.get("/api/ps").json().unwrap();
    assert_eq!(ps["models"], json!([]));
    for body in [
        json!({"model": MODEL}),
        json!({"name": "smollm2-135m-instruct.q4_1"}),
    ] {
        let show = s.post_json("/api/show", body, 200);
        assert_eq!(show["model_info"]["llama.context_length"], 8192);
        assert_eq!(show["model_info"]["general.architecture"], "llama");
        assert_eq!(show["capabilities"], json!(["completion", "tools"]));
        assert!(show["template"].as_str().unwrap().contains("<|im_start|>"));
        assert_eq!(show["details"]["family"], "llama");
        assert!(show["modelfile"].as_str().unwrap().contains("FROM "));
    }
    let ps: Value = s.get("/api/ps").json().unwrap();
    assert_eq!(ps["models"], json!([]));

    let models: Value = s.get("/v1/models").json().unwrap();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], MODEL);
    assert_eq!(models["data"][0]["object"], "model");
    assert!(models["data"][0]["created"].as_u64().unwrap() > 0);
    let one: Value = s.get(&format!("/v1/models/{MODEL}")).json().unwrap();
    assert_eq!(one["id"], MODEL);
    let r = s.get("/v1/models/nope");
    assert_eq!(r.status(), 404);
    let e: Value = r.json().unwrap();
    assert_eq!(e["error"]["type"], "invalid_request_error");
    assert_eq!(e["error"]["code"], "model_not_found");
    assert_eq!(e["error"]["message"], "model 'nope' not found");

    let doc: Value = s.get("/openapi.json").json().unwrap();
    assert!(doc["paths"]["/api/chat"]["post"].is_object());
    assert!(doc["paths"]["/v1/chat/completions"]["post"].is_object());
    let docs = s.get("/docs");
    assert_eq!(docs.status(), 200);
    assert!(docs.text().unwrap().contains("<html"));

    let r = s.get("/api/nothing");
    assert_eq!(r.status(), 404);
    assert!(r.json::<Value>().unwrap()["error"].is_string());
    let r = s.get("/v1/nothing");
    assert_eq!(r.status(), 404);
    assert!(r.json::<Value>().unwrap()["error"]["message"].is_string());
}

#[test]
fn ollama_generate_and_chat() {
    let s = Server::start(&[]);
    // Raw, streamed: NDJSON chunks, then the final chunk with the stats.
    let r = s.post(
        "/api/generate",
        json!({"model": "SmolLM2-135M-Instruct.Q4_1", "prompt": "The capital of France is",
               "raw": true, "options": greedy(5)}),
    );
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/x-ndjson");
    let chunks = ndjson(&r.text().unwrap());
    let (last, pieces) = chunks.split_last().unwrap();
    let text: String = pieces
        .iter()
        .map(|c| {
            assert_eq!(c["done"], false);
            assert_eq!(c["model"], "SmolLM2-135M-Instruct.Q4_1");
            assert!(c["created_at"].as_str().unwrap().ends_with('Z'));
            c["response"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(text, " Paris.\n\nThe");
    assert_eq!(last["done"], true);
    assert_eq!(last["done_reason"], "length");
    assert_eq!(last["eval_count"], 5);
    assert_eq!(last["prompt_eval_count"], 5);
    for key in [
        "total_duration",
        "load_duration",
        "prompt_eval_duration",
        "eval_duration",
    ] {
        assert!(last[key].is_u64(), "{key}: {last}");
    }
    assert!(last["total_duration"].as_u64().unwrap() >= last["eval_duration"].as_u64().unwrap());
    assert!(last.get("context").is_none(), "raw has no context");

    // Not streamed: one object, the same text.
    let v = s.post_json(
        "/api/generate",
        json!({"model": MODEL, "prompt": "The capital of France is", "raw": true,
               "stream": false, "options": greedy(5)}),
        200,
    );
    assert_eq!(v["response"], " Paris.\n\nThe");
    assert_eq!(v["done"], true);

    // Templated, with a stop string; context continues the conversation.
    let v = s.post_json(
        "/api/generate",
        json!({"model": MODEL, "prompt": "What is the capital of Germany?", "stream": false,
               "options": {"temperature": 0, "stop": [" Berlin"]}}),
        200,
    );
    assert_eq!(v["response"], "The capital of Germany is");
    assert_eq!(v["done_reason"], "stop");
    let context = v["context"].as_array().unwrap();
    assert!(context.len() > v["prompt_eval_count"].as_u64().unwrap() as usize);
    let v = s.post_json(
        "/api/generate",
        json!({"model": MODEL, "prompt": "And of France?", "context": context, "stream": false,
               "cache_prompt": false, "options": greedy(16)}),
        200,
    );
    assert!(v["prompt_eval_count"].as_u64().unwrap() > context.len() as u64);
    assert!(!v["response"].as_str().unwrap().is_empty());

    // A template override (Jinja).
    let v = s.post_json(
        "/api/generate",
        json!({"model": MODEL, "prompt": "The capital of France is", "stream": false,
               "template": "{% for m in messages %}{{ m.content }}{% endfor %}",
               "options": greedy(3)}),
        200,
    );
    assert_eq!(v["response"], " Paris.\n");

    // Chat, streamed: every chunk has message.role.
    let r = s.post(
        "/api/chat",
        json!({"model": MODEL, "messages": [{"role": "user", "content": "What is the capital of Germany?"}],
               "options": {"temperature": 0, "num_ctx": 2048}}),
    );
    assert_eq!(r.headers()["content-type"], "application/x-ndjson");
    let chunks = ndjson(&r.text().unwrap());
    let text: String = chunks
        .iter()
        .map(|c| {
            assert_eq!(c["message"]["role"], "assistant");
            c["message"]["content"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(text, GERMANY);
    let last = chunks.last().unwrap();
    assert_eq!(last["done_reason"], "stop");
    assert_eq!(last["message"]["content"], "");
    let eval_count = last["eval_count"].as_u64().unwrap();
    assert!((7..=9).contains(&eval_count), "{eval_count}");

    // Chat, whole, with a system message.
    let v = s.post_json(
        "/api/chat",
        json!({"model": MODEL, "stream": false, "options": {"temperature": 0},
               "messages": [{"role": "system", "content": "You are a helpful AI assistant named SmolLM, trained by Hugging Face"},
                            {"role": "user", "content": "What is the capital of Germany?"}]}),
        200,
    );
    assert_eq!(v["message"]["content"], GERMANY);
    assert_eq!(v["message"]["role"], "assistant");
    assert_eq!(v["done"], true);
}

#[test]
fn load_unload_and_keep_alive() {
    let s = Server::start(&["--keep-alive", "-1"]);
    // Empty prompt: load (one object even without stream: false).
    let v = s.post_json("/api/generate", json!({"model": MODEL}), 200);
    assert_eq!(v["done_reason"], "load");
    assert_eq!(v["done"], true);
    let ps: Value = s.get("/api/ps").json().unwrap();
    assert_eq!(ps["models"][0]["name"], MODEL);
    assert_eq!(ps["models"][0]["context_length"], 4096);
    assert!(ps["models"][0]["expires_at"]
        .as_str()
        .unwrap()
        .starts_with("2286"));

    // keep_alive 0 with an empty chat: unload.
    let v = s.post_json(
        "/api/chat",
        json!({"model": MODEL, "messages": [], "keep_alive": 0}),
        200,
    );
    assert_eq!(v["done_reason"], "unload");
    assert_eq!(v["message"]["role"], "assistant");
    let ps: Value = s.get("/api/ps").json().unwrap();
    assert_eq!(ps["models"], json!([]));

    // A request with keep_alive 1s: loaded, then gone once idle for a second.
    let v = s.post_json(
        "/api/generate",
        json!({"model": MODEL, "prompt": "Hi", "raw": true, "stream": false,
               "keep_alive": "1s", "options": greedy(1)}),
        200,
    );
    assert!(v["load_duration"].as_u64().unwrap() > 0);
    wait_until(Duration::from_secs(20), "the model unloads", || {
        s.get("/api/ps").json::<Value>().unwrap()["models"] == json!([])
    });
    // keep_alive 0 on a generation unloads right after it.
    s.post_json(
        "/api/generate",
        json!({"model": MODEL, "prompt": "Hi", "raw": true, "stream": false,
               "keep_alive": 0, "options": greedy(1)}),
        200,
    );
    let ps: Value = s.get("/api/ps").json().unwrap();
    assert_eq!(ps["models"], json!([]));
}

#[test]
fn openai_routes() {
    let s = Server::start(&[]);
    let v = s.post_json(
        "/v1/chat/completions",
        json!({"model": MODEL, "temperature": 0,
               "messages": [{"role": "user", "content": [{"type": "text", "text": "What is the capital of Germany?"}]}]}),
        200,
    );
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], MODEL);
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], GERMANY);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let u = &v["usage"];
    assert_eq!(
        u["total_tokens"].as_u64().unwrap(),
        u["prompt_tokens"].as_u64().unwrap() + u["completion_tokens"].as_u64().unwrap()
    );

    // Streamed with usage: role first, finish chunk, usage chunk, [DONE].
    let r = s.post(
        "/v1/chat/completions",
        json!({"model": MODEL, "temperature": 0, "stream": true, "stream_options": {"include_usage": true},
               "max_completion_tokens": 4, "max_tokens": 100,
               "messages": [{"role": "user", "content": "What is the capital of Germany?"}]}),
    );
    assert_eq!(r.headers()["content-type"], "text/event-stream");
    let events = sse(&r.text().unwrap());
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    let id = &chunks[0]["id"];
    assert!(chunks
        .iter()
        .all(|c| &c["id"] == id && c["object"] == "chat.completion.chunk"));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let usage = chunks.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 4);
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    assert_eq!(finish["choices"][0]["delta"], json!({}));
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "The capital of Germany");

    // Text completions, with stop as a string and as a list.
    for stop in [json!("."), json!([".", "\n"])] {
        let v = s.post_json(
            "/v1/completions",
            json!({"model": MODEL, "prompt": "The capital of France is", "temperature": 0,
                   "max_tokens": 5, "stop": stop, "seed": 7}),
            200,
        );
        assert_eq!(v["object"], "text_completion");
        assert_eq!(v["choices"][0]["text"], " Paris");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
    }
    let r = s.post(
        "/v1/completions",
        json!({"model": MODEL, "prompt": "The capital of France is", "temperature": 0,
               "max_tokens": 5, "stream": true}),
    );
    let events = sse(&r.text().unwrap());
    let text: String = events[..events.len() - 1]
        .iter()
        .filter_map(|e| {
            serde_json::from_str::<Value>(e).unwrap()["choices"][0]["text"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(text, " Paris.\n\nThe");
}

#[test]
fn embeddings_all_routes() {
    let s = Server::start(&[]);
    let v = s.post_json(
        "/api/embed",
        json!({"model": MODEL, "input": ["Paris is in France.", "Berlin is in Germany."]}),
        200,
    );
    let e = v["embeddings"].as_array().unwrap();
    assert_eq!(e.len(), 2);
    let first: Vec<f64> = e[0]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(first.len(), 576);
    let norm: f64 = first.iter().map(|x| x * x).sum::<f64>().sqrt();
    assert!((norm - 1.0).abs() < 1e-3, "{norm}");
    assert!(v["prompt_eval_count"].as_u64().unwrap() >= 10);

    let v = s.post_json(
        "/api/embed",
        json!({"model": MODEL, "input": "Paris is in France.", "dimensions": 8}),
        200,
    );
    assert_eq!(v["embeddings"][0].as_array().unwrap().len(), 8);

    // Longer than the served context (4096 tokens): cut, unless truncate is false.
    let long = "word ".repeat(4200);
    let v = s.post_json("/api/embed", json!({"model": MODEL, "input": long}), 200);
    assert_eq!(v["embeddings"][0].as_array().unwrap().len(), 576);
    let r = s.post(
        "/api/embed",
        json!({"model": MODEL, "input": long, "truncate": false}),
    );
    assert_eq!(r.status(), 400);

    let legacy = s.post_json(
        "/api/embeddings",
        json!({"model": MODEL, "prompt": "Paris is in France."}),
        200,
    );
    let legacy: Vec<f64> = legacy["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert_eq!(legacy.len(), 576);
    for (a, b) in legacy.iter().zip(&first) {
        assert!((a - b).abs() < 1e-5);
    }

    let floats = s.post_json(
        "/v1/embeddings",
        json!({"model": MODEL, "input": "Paris is in France."}),
        200,
    );
    assert_eq!(floats["object"], "list");
    assert_eq!(floats["data"][0]["object"], "embedding");
    assert_eq!(floats["data"][0]["index"], 0);
    assert!(floats["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    let b64 = s.post_json(
        "/v1/embeddings",
        json!({"model": MODEL, "input": ["Paris is in France."], "encoding_format": "base64"}),
        200,
    );
    let bytes = base64_decode(b64["data"][0]["embedding"].as_str().unwrap());
    let decoded: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let floats: Vec<f32> = floats["data"][0]["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() as f32)
        .collect();
    assert_eq!(decoded, floats);
}

fn base64_decode(s: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let mut acc = 0u32;
    let mut bits = 0;
    for c in s.bytes().filter(|&c| c != b'=') {
        acc = (acc << 6) | ALPHABET.iter().position(|&a| a == c).unwrap() as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
        }
    }
    out
}

#[test]
fn errors_have_the_right_status_and_body() {
    let s = Server::start(&["--context", "64", "--max-body-bytes", "4096"]);
    let ollama_error = |r: reqwest::blocking::Response, status: u16| -> String {
        assert_eq!(r.status().as_u16(), status);
        let v: Value = r.json().unwrap();
        v["error"]
            .as_str()
            .expect("{\"error\": string}")
            .to_string()
    };
    let openai_error = |r: reqwest::blocking::Response, status: u16, kind: &str| -> String {
        assert_eq!(r.status().as_u16(), status);
        let v: Value = r.json().unwrap();
        assert_eq!(v["error"]["type"], kind, "{v}");
        assert!(v["error"]["param"].is_null() || v["error"]["param"].is_string());
        // `model_not_found`, `context_length_exceeded` (tests/api/context.rs), or null.
        assert!(v["error"]["code"].is_null() || v["error"]["code"].is_string());
        v["error"]["message"].as_str().unwrap().to_string()
    };

    let e = ollama_error(s.post_raw("/api/chat", "{\"model\": "), 400);
    assert!(e.starts_with("invalid JSON body"), "{e}");
    let e = ollama_error(s.post_raw("/api/generate", ""), 400);
    assert!(e.contains("missing request body"), "{e}");
    let e = openai_error(
        s.post_raw("/v1/chat/completions", "[1,2"),
        400,
        "invalid_request_error",
    );
    assert!(e.starts_with("invalid JSON body"), "{e}");

    let e = ollama_error(
        s.post(
            "/api/chat",
            json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}],
                                   "options": {"temperature": "hot"}}),
        ),
        400,
    );
    assert!(e.contains("options.temperature"), "{e}");
    let e = ollama_error(
        s.post(
            "/api/generate",
            json!({"model": MODEL, "prompt": "x", "options": {"num_predict": "many"}}),
        ),
        400,
    );
    assert!(e.contains("options.num_predict"), "{e}");
    // Unknown option keys are ignored.
    s.post_json(
        "/api/generate",
        json!({"model": MODEL, "prompt": "x", "raw": true, "stream": false,
               "options": {"num_predict": 1, "mirostat": 2, "use_mlock": true}}),
        200,
    );

    let e = ollama_error(
        s.post("/api/chat", json!({"model": "nope", "messages": []})),
        404,
    );
    assert_eq!(e, "model 'nope' not found");
    let e = ollama_error(s.post("/api/show", json!({"model": "nope:7b"})), 404);
    assert_eq!(e, "model 'nope:7b' not found");
    openai_error(
        s.post(
            "/v1/chat/completions",
            json!({"model": "nope", "messages": [{"role": "user", "content": "x"}]}),
        ),
        404,
        "invalid_request_error",
    );
    let e = openai_error(
        s.post(
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": []}),
        ),
        400,
        "invalid_request_error",
    );
    assert!(e.contains("messages"), "{e}");
    let e = ollama_error(s.post("/api/generate", json!({"model": "bad name!"})), 400);
    assert!(e.contains("invalid model"), "{e}");
    let e = ollama_error(s.post("/api/generate", json!({"prompt": "x"})), 400);
    assert!(e.contains("model"), "{e}");

    // A prompt longer than the context (64 tokens here).
    let long = "word ".repeat(200);
    let e = ollama_error(
        s.post(
            "/api/generate",
            json!({"model": MODEL, "prompt": long, "raw": true}),
        ),
        400,
    );
    assert!(e.contains("tokens") && e.contains("context"), "{e}");
    let e = openai_error(
        s.post(
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": [{"role": "user", "content": long}]}),
        ),
        400,
        "invalid_request_error",
    );
    assert!(e.contains("context"), "{e}");

    // What this model or server cannot do yet.
    let e = ollama_error(
        s.post(
            "/api/chat",
            json!({"model": MODEL, "think": true,
                                   "messages": [{"role": "user", "content": "x"}]}),
        ),
        400,
    );
    assert!(e.contains("does not support thinking"), "{e}");
    let e = ollama_error(
        s.post(
            "/api/generate",
            json!({"model": MODEL, "prompt": "x", "format": "yaml"}),
        ),
        400,
    );
    assert!(e.contains("use \"json\" or a JSON Schema object"), "{e}");
    let e = ollama_error(
        s.post(
            "/api/chat",
            json!({"model": MODEL, "tools": [{"type": "function"}],
                                   "messages": [{"role": "user", "content": "x"}]}),
        ),
        400,
    );
    assert!(e.starts_with("tools[0] must be"), "{e}");
    let e = ollama_error(
        s.post("/api/chat", json!({"model": MODEL,
                                   "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]})),
        400,
    );
    assert!(e.contains("images"), "{e}");
    let e = ollama_error(
        s.post(
            "/api/generate",
            json!({"model": MODEL, "prompt": "x", "keep_alive": "soon"}),
        ),
        400,
    );
    assert!(e.contains("keep_alive"), "{e}");
    openai_error(
        s.post(
            "/v1/chat/completions",
            json!({"model": MODEL, "temperature": 5,
                                              "messages": [{"role": "user", "content": "x"}]}),
        ),
        400,
        "invalid_request_error",
    );
    openai_error(
        s.post(
            "/v1/embeddings",
            json!({"model": MODEL, "input": "x", "encoding_format": "hex"}),
        ),
        400,
        "invalid_request_error",
    );

    // Body over --max-body-bytes.
    let big = json!({"model": MODEL, "prompt": "x".repeat(10_000)});
    assert_eq!(s.post("/api/generate", big).status(), 413);

    // Copy and delete: names only, the file stays.
    assert_eq!(
        client()
            .post(s.url("/api/copy"))
            .json(&json!({"source": "nope", "destination": "x"}))
            .send()
            .unwrap()
            .status(),
        404
    );
    let r = client()
        .post(s.url("/api/copy"))
        .json(&json!({"source": MODEL, "destination": "smol:copy"}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let tags: Value = s.get("/api/tags").json().unwrap();
    assert_eq!(tags["models"].as_array().unwrap().len(), 2);
    s.post_json("/api/show", json!({"model": "smol:copy"}), 200);
    let r = client()
        .delete(s.url("/api/delete"))
        .json(&json!({"model": "smol:copy"}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = client()
        .delete(s.url("/api/delete"))
        .json(&json!({"model": "smol:copy"}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 404);
    assert!(common::smollm2().is_file());

    // Pull: a model already served succeeds; others are a 400.
    let r = s.post("/api/pull", json!({"model": MODEL}));
    assert_eq!(r.status(), 200);
    let lines = ndjson(&r.text().unwrap());
    assert_eq!(lines.last().unwrap()["status"], "success");
    ollama_error(s.post("/api/pull", json!({"model": "llama3"})), 400);
}

#[test]
fn api_key_cors_and_request_ids() {
    let s = Server::start(&["--api-key", "sekret"]);
    assert_eq!(s.get("/").status(), 200);
    assert_eq!(s.get("/api/version").status(), 200);
    let r = s.get("/api/tags");
    assert_eq!(r.status(), 401);
    assert!(r.json::<Value>().unwrap()["error"].is_string());
    let r = s.get("/v1/models");
    assert_eq!(r.status(), 401);
    assert!(r.json::<Value>().unwrap()["error"]["message"].is_string());
    let r = client()
        .get(s.url("/api/tags"))
        .bearer_auth("wrong")
        .send()
        .unwrap();
    assert_eq!(r.status(), 401);
    let r = client()
        .get(s.url("/api/tags"))
        .bearer_auth("sekret")
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);

    // CORS preflight needs no key and allows the OpenAI SDK's headers.
    let r = client()
        .request(reqwest::Method::OPTIONS, s.url("/v1/chat/completions"))
        .header("Origin", "http://localhost:3000")
        .header("Access-Control-Request-Method", "POST")
        .header(
            "Access-Control-Request-Headers",
            "authorization,content-type,x-stainless-os,openai-beta",
        )
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    // A local origin is echoed (other origins are refused: tests/safety/security.rs).
    assert_eq!(
        r.headers()["access-control-allow-origin"],
        "http://localhost:3000"
    );
    let allowed = r.headers()["access-control-allow-headers"]
        .to_str()
        .unwrap();
    for h in [
        "authorization",
        "content-type",
        "user-agent",
        "accept",
        "openai-beta",
        "x-stainless-os",
    ] {
        assert!(allowed.contains(h), "{h} in {allowed}");
    }

    // Request ids: generated when absent, echoed when sent.
    let r = s.get("/");
    assert!(!r.headers()["x-request-id"].is_empty());
    let r = client()
        .get(s.url("/"))
        .header("x-request-id", "abc-123")
        .send()
        .unwrap();
    assert_eq!(r.headers()["x-request-id"], "abc-123");
}

/// Reads NDJSON lines of a streaming response until `n` have come.
fn read_lines(reader: &mut impl BufRead, n: usize) -> Vec<Value> {
    (0..n)
        .map(|_| {
            let mut line = String::new();
            assert!(
                reader.read_line(&mut line).unwrap() > 0,
                "stream ended early"
            );
            serde_json::from_str(&line).unwrap()
        })
        .collect()
}

#[test]
fn queue_full_disconnect_and_graceful_shutdown() {
    let mut s = Server::start(&["--parallel", "1", "--queue-limit", "0"]);
    let long = json!({"model": MODEL, "prompt": "1, 2, 3, 4, 5,", "raw": true,
                      "options": {"temperature": 0, "num_predict": 3000}});
    // The one slot is busy: the next request is refused with 503.
    let first = client()
        .post(s.url("/api/generate"))
        .json(&long)
        .send()
        .unwrap();
    let mut first = BufReader::new(first);
    read_lines(&mut first, 1);
    let r = s.post(
        "/api/generate",
        json!({"model": MODEL, "prompt": "x", "stream": false}),
    );
    let (status, body) = (r.status(), r.text().unwrap());
    assert_eq!(status, 503, "{body}\n{}", s.log());
    assert!(body.contains("queue"), "{body}");
    let r = s.post(
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": [{"role": "user", "content": "x"}]}),
    );
    let (status, body) = (r.status(), r.text().unwrap());
    assert_eq!(status, 503, "{body}\n{}", s.log());

    // The client goes away: its slot frees, the next request gets it.
    drop(first);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r = s.post(
            "/api/generate",
            json!({"model": MODEL, "prompt": "Hi", "raw": true, "stream": false, "options": greedy(2)}),
        );
        if r.status() == 200 {
            break;
        }
        let last = format!("{} {}", r.status(), r.text().unwrap());
        assert!(
            std::time::Instant::now() < deadline,
            "the slot never freed: {last}\n{}",
            s.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    // SIGTERM with a stream in flight: the stream still ends with done: true
    // (a dozen tokens: 40 ran past the 30 s grace on two cores at load 8).
    let short = json!({"model": MODEL, "prompt": "1, 2, 3, 4, 5,", "raw": true,
                       "options": {"temperature": 0, "num_predict": 12}});
    let stream = client()
        .post(s.url("/api/generate"))
        .json(&short)
        .send()
        .unwrap();
    let mut stream = BufReader::new(stream);
    read_lines(&mut stream, 1);
    let killed = std::process::Command::new("kill")
        .args(["-TERM", &s.pid().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stream, &mut rest).unwrap();
    let last = ndjson(&rest).pop().unwrap();
    assert_eq!(last["done"], true, "{rest}\n{}", s.log());
    assert_eq!(last["done_reason"], "length", "{rest}");
    let status = s.wait(Duration::from_secs(30));
    assert!(status.success(), "{status:?}\n{}", s.log());
}
