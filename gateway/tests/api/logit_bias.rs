//! OpenAI's `logit_bias` on `/v1/chat/completions` and `/v1/completions` (issue 30, item
//! 12): it was accepted and ignored. On the real SmolLM2, greedy, through its runner
//! process: -100 bans the greedy first token (the second most likely comes instead), +100
//! on another token makes it come first, streamed or not; ids outside the vocabulary,
//! biases out of range and keys that are no token ids are 400s naming `logit_bias`.
#[path = "../common/mod.rs"]
mod common;

use common::{sse, Server, MODEL};
use serde_json::{json, Value};

const QUESTION: &str = "The capital of France is";

fn message(reply: &Value) -> String {
    reply["error"]["message"].as_str().unwrap().to_string()
}

/// The ids and texts of the first `n` greedy reply tokens to [`QUESTION`] (Ollama's
/// `/api/generate` gives both: `context` ends with the reply's ids, `logprobs` has their
/// texts), and the second most likely first token's text.
fn greedy_tokens(s: &Server, n: usize) -> (Vec<(i64, String)>, String) {
    let reply = s.post_json(
        "/api/generate",
        json!({"model": MODEL, "prompt": QUESTION, "stream": false, "logprobs": true,
            "top_logprobs": 2, "options": {"temperature": 0, "num_predict": n}}),
        200,
    );
    let context = reply["context"].as_array().unwrap();
    let ids = &context[context.len() - n..];
    let texts = reply["logprobs"].as_array().unwrap();
    assert_eq!(texts.len(), n, "{reply}");
    let tokens = ids
        .iter()
        .zip(texts)
        .map(|(id, t)| {
            (
                id.as_i64().unwrap(),
                t["token"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let second = texts[0]["top_logprobs"][1]["token"].as_str().unwrap();
    (tokens, second.to_string())
}

/// The first token `/v1/chat/completions` generates for [`QUESTION`] with `bias`, greedy,
/// whole or streamed.
fn chat_first_token(s: &Server, bias: Value, stream: bool) -> String {
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": QUESTION}],
        "temperature": 0, "max_tokens": 1, "logit_bias": bias, "stream": stream});
    if !stream {
        let reply = s.post_json("/v1/chat/completions", body, 200);
        return reply["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string();
    }
    let r = s.post("/v1/chat/completions", body);
    assert_eq!(r.status(), 200);
    sse(&r.text().unwrap())
        .iter()
        .filter(|data| *data != "[DONE]")
        .map(|data| serde_json::from_str::<Value>(data).unwrap())
        .filter_map(|chunk| {
            chunk["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect()
}

/// The vocabulary size, as the OpenAPI document tells clients to read it: `/api/show`'s
/// `model_info`, `<architecture>.vocab_size`.
fn vocabulary(s: &Server) -> i64 {
    let show = s.post_json("/api/show", json!({"model": MODEL}), 200);
    let info = &show["model_info"];
    let architecture = info["general.architecture"].as_str().unwrap();
    info[format!("{architecture}.vocab_size")].as_i64().unwrap()
}

#[test]
fn logit_bias_bans_and_forces_tokens_and_refuses_what_it_cannot_apply() {
    let s = Server::start(&[]);
    let (tokens, second) = greedy_tokens(&s, 3);
    let (first_id, first_text) = tokens[0].clone();
    let (other_id, other_text) = tokens
        .iter()
        .find(|(id, text)| *id != first_id && *text != first_text && *text != second)
        .cloned()
        .unwrap_or_else(|| panic!("a later token unlike the first two: {tokens:?}"));

    for stream in [false, true] {
        assert_eq!(chat_first_token(&s, json!({}), stream), first_text);
        // Banned, the greedy choice is the next most likely token.
        let banned = json!({first_id.to_string(): -100});
        assert_eq!(
            chat_first_token(&s, banned, stream),
            second,
            "stream {stream}"
        );
        // A token far down the list comes first with +100.
        let forced = json!({other_id.to_string(): 100});
        assert_eq!(
            chat_first_token(&s, forced, stream),
            other_text,
            "stream {stream}"
        );
    }
    // A bias short of -100 only lowers the token: -1 leaves the greedy choice as it is
    // when it leads by more (it does here: its log-probability gap is checked).
    let gap = {
        let reply = s.post_json(
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": [{"role": "user", "content": QUESTION}],
                "temperature": 0, "max_tokens": 1, "logprobs": true, "top_logprobs": 2}),
            200,
        );
        let top = &reply["choices"][0]["logprobs"]["content"][0]["top_logprobs"];
        top[0]["logprob"].as_f64().unwrap() - top[1]["logprob"].as_f64().unwrap()
    };
    let small = -(gap / 2.0);
    assert_eq!(
        chat_first_token(&s, json!({first_id.to_string(): small}), false),
        first_text
    );

    // The legacy completions route: the forced token is the whole reply of one token.
    let completion = |bias: Value| {
        s.post_json(
            "/v1/completions",
            json!({"model": MODEL, "prompt": QUESTION, "temperature": 0, "max_tokens": 1,
                "logit_bias": bias}),
            200,
        )["choices"][0]["text"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(completion(json!({other_id.to_string(): 100})), other_text);
    let plain = completion(json!({}));
    assert_ne!(plain, other_text);

    let n_vocab = vocabulary(&s);
    assert_eq!(n_vocab, 49152, "SmolLM2's vocabulary");
    let last = n_vocab - 1;
    // The last id of the vocabulary is one.
    let r = s.post(
        "/v1/completions",
        json!({"model": MODEL, "prompt": QUESTION, "max_tokens": 1,
            "logit_bias": {last.to_string(): -100}}),
    );
    assert_eq!(r.status(), 200, "{}", r.text().unwrap());

    let outside = format!(
        "logit_bias: token {n_vocab} is outside the model's vocabulary of {n_vocab} tokens \
         (ids 0 to {last})"
    );
    for (bias, expected) in [
        (json!({n_vocab.to_string(): -100}), outside.clone()),
        (
            json!({"5": 1000}),
            "logit_bias: the bias of token 5 must be between -100 and 100, got 1000".into(),
        ),
        (
            json!({"5": -100.5}),
            "logit_bias: the bias of token 5 must be between -100 and 100, got -100.5".into(),
        ),
        (
            json!({"abc": 1}),
            "logit_bias: key \"abc\" is not a token id: use token ids (integers from 0) as keys"
                .into(),
        ),
        (
            json!({"-1": 1}),
            "logit_bias: key \"-1\" is not a token id: use token ids (integers from 0) as keys"
                .into(),
        ),
        (
            json!({"99999999999": 1}),
            "logit_bias: key \"99999999999\" is not a token id: use token ids (integers from 0) \
             as keys"
                .into(),
        ),
    ] {
        for stream in [false, true] {
            for (route, body) in [
                (
                    "/v1/chat/completions",
                    json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 1, "stream": stream, "logit_bias": bias}),
                ),
                (
                    "/v1/completions",
                    json!({"model": MODEL, "prompt": "hi", "max_tokens": 1, "stream": stream,
                        "logit_bias": bias}),
                ),
            ] {
                let r = s.post(route, body);
                assert_eq!(r.status(), 400, "{route} {bias} stream {stream}");
                let reply: Value = r.json().unwrap();
                assert_eq!(message(&reply), expected, "{route} {bias}");
                assert_eq!(reply["error"]["type"], "invalid_request_error");
            }
        }
    }
    let r = s.post(
        "/v1/chat/completions",
        json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
            "logit_bias": {"5": "x"}}),
    );
    assert_eq!(r.status(), 400);
    let text = message(&r.json().unwrap());
    assert!(text.contains("logit_bias.5"), "{text}");
    // The server is still up and answers.
    assert_eq!(chat_first_token(&s, json!({}), false), first_text);
}

/// The OpenAPI document states the field as strict as it is checked.
#[test]
fn the_document_bounds_logit_bias_as_the_validation_does() {
    let s = Server::start(&[]);
    let doc: Value = s.get("/openapi.json").json().unwrap();
    for schema in ["ChatCompletionRequest", "CompletionRequest"] {
        let field = &doc["components"]["schemas"][schema]["properties"]["logit_bias"];
        assert_eq!(field["type"], "object", "{schema}: {field}");
        assert_eq!(
            field["additionalProperties"],
            json!({"type": "number", "minimum": -100.0, "maximum": 100.0})
        );
        assert_eq!(field["propertyNames"]["pattern"], "^[0-9]{1,10}$");
        assert_eq!(field["maxProperties"], 1024);
        let description = field["description"].as_str().unwrap();
        assert!(description.contains("vocabulary"), "{description}");
    }
}
