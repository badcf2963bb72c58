//! Values outside their range are 400s naming what was wrong (issue 30,
//! item 12, and issue 29, item 6's unknown role): options, `keep_alive`,
//! roles, model tags, JSON Schema bounds nothing can satisfy.
#[path = "../common/mod.rs"]
mod common;

use common::{Server, MODEL};
use serde_json::{json, Value};

fn error_message(reply: &Value) -> String {
    match &reply["error"] {
        Value::String(s) => s.clone(),
        other => other["message"].as_str().unwrap().to_string(),
    }
}

fn refused(s: &Server, route: &str, body: Value) -> String {
    let r = s.post(route, body.clone());
    assert_eq!(r.status(), 400, "{route} {body}");
    error_message(&r.json().unwrap())
}

#[test]
fn out_of_range_values_are_400s_naming_them() {
    let s = Server::start(&[]);
    let generate = |options: Value| json!({"model": MODEL, "prompt": "hi", "stream": false, "options": options});
    for (options, message) in [
        (
            json!({"num_ctx": 0}),
            "options.num_ctx must be positive, got 0",
        ),
        (
            json!({"top_k": -1}),
            "options.top_k must be between 0 and 2147483647, got -1",
        ),
        (
            json!({"num_thread": 1_000_000}),
            "options.num_thread must be between 0 and 1024, got 1000000",
        ),
        (
            json!({"num_batch": 0}),
            "options.num_batch must be between 1 and 2147483647, got 0",
        ),
        (
            json!({"min_p": 1e300}),
            "options.min_p must be between 0 and 1, got inf",
        ),
        (
            json!({"repeat_last_n": -7}),
            "options.repeat_last_n must be -1, 0 or positive, got -7",
        ),
    ] {
        assert_eq!(
            refused(&s, "/api/generate", generate(options.clone())),
            message,
            "{options}"
        );
    }
    let message = refused(&s, "/api/generate", generate(json!({"num_thread": 1e6})));
    assert!(message.contains("options.num_thread"), "{message}");

    for keep_alive in [json!(1e308), json!("1e308"), json!("9999999999h")] {
        let body =
            json!({"model": MODEL, "prompt": "hi", "stream": false, "keep_alive": keep_alive});
        assert_eq!(
            refused(&s, "/api/generate", body),
            format!(
                "keep_alive {keep_alive} is longer than 315360000 seconds: use a negative value \
                 (\"-1\") to keep the model loaded"
            )
        );
    }

    let wizard = json!([{"role": "wizard", "content": "hi"}]);
    assert_eq!(
        refused(
            &s,
            "/api/chat",
            json!({"model": MODEL, "messages": wizard, "stream": false})
        ),
        "messages[0].role \"wizard\" is unknown: use one of system, user, assistant, tool"
    );
    let openai_roles = "system, developer, user, assistant, tool, function";
    assert_eq!(
        refused(
            &s,
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": wizard})
        ),
        format!("messages[0].role \"wizard\" is unknown: use one of {openai_roles}")
    );
    assert_eq!(
        refused(
            &s,
            "/v1/responses",
            json!({"model": MODEL, "input": wizard})
        ),
        format!("messages[0].role \"wizard\" is unknown: use one of {openai_roles}")
    );

    for name in [
        "SmolLM2:-x",
        "SmolLM2:a+b",
        "SmolLM2:.hidden",
        "ns/SmolLM2:a:b",
    ] {
        assert_eq!(
            refused(&s, "/api/show", json!({"model": name})),
            format!(
                "invalid model {name:?}: its tag {:?} must start with a letter, digit or _ and \
                 hold only letters, digits and . _ - characters (128 at most)",
                name.split_once(':').unwrap().1
            )
        );
    }
    let r = s.post("/api/show", json!({"model": "SmolLM2:v1.0_q4-k"}));
    assert_eq!(r.status(), 404);

    let integer = |bounds: Value| {
        let mut n = json!({"type": "integer"});
        n.as_object_mut()
            .unwrap()
            .extend(bounds.as_object().unwrap().clone());
        json!({"type": "object", "properties": {"n": n}, "required": ["n"]})
    };
    for (bounds, problem) in [
        (
            json!({"minimum": 10, "maximum": 5}),
            "minimum (10) and maximum (5) leave no integer between them: no value can satisfy it",
        ),
        (
            json!({"multipleOf": 0}),
            "multipleOf must be a number greater than 0, got 0",
        ),
    ] {
        let schema = integer(bounds);
        let body = json!({"model": MODEL, "prompt": "hi", "stream": false, "format": schema});
        assert_eq!(
            refused(&s, "/api/generate", body),
            format!("format: invalid JSON Schema: at #/properties/n: {problem}")
        );
        let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}});
        assert_eq!(
            refused(&s, "/v1/chat/completions", body),
            format!(
                "response_format.json_schema.schema: invalid JSON Schema: at #/properties/n: \
                 {problem}"
            )
        );
    }
}

/// Integer fields take an integral float (`4.0`: JavaScript clients write every number so)
/// and answer as the integer would, on every route; a fraction stays a 400 naming the field.
#[test]
fn integers_written_as_floats_are_integers() {
    let s = Server::start(&[]);
    let chat = json!([{"role": "user", "content": "Name three colours."}]);
    // (route, body with integers, the same with floats, what to compare).
    let cases = [
        (
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": chat, "temperature": 0, "max_tokens": 4, "seed": 1,
                "n": 1, "logprobs": true, "top_logprobs": 2}),
            json!({"model": MODEL, "messages": chat, "temperature": 0, "max_tokens": 4.0,
                "seed": 1.0, "n": 1.0, "logprobs": true, "top_logprobs": 2.0}),
            "/choices/0/message/content",
        ),
        (
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": chat, "temperature": 0,
                "max_completion_tokens": 3}),
            json!({"model": MODEL, "messages": chat, "temperature": 0,
                "max_completion_tokens": 3.0}),
            "/usage/completion_tokens",
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": "Red, green", "temperature": 0, "max_tokens": 5,
                "seed": 1, "n": 1, "logprobs": 1}),
            json!({"model": MODEL, "prompt": "Red, green", "temperature": 0, "max_tokens": 5.0,
                "seed": 1.0, "n": 1.0, "logprobs": 1.0}),
            "/choices/0/text",
        ),
        (
            "/api/generate",
            json!({"model": MODEL, "prompt": "Red, green", "stream": false, "options":
                {"temperature": 0, "num_predict": 8, "top_k": 40, "seed": 1, "num_ctx": 512,
                 "repeat_last_n": 64, "num_thread": 2, "num_batch": 64}}),
            json!({"model": MODEL, "prompt": "Red, green", "stream": false, "options":
                {"temperature": 0, "num_predict": 8.0, "top_k": 40.0, "seed": 1.0,
                 "num_ctx": 512.0, "repeat_last_n": 64.0, "num_thread": 2.0, "num_batch": 64.0}}),
            "/response",
        ),
        (
            "/api/chat",
            json!({"model": MODEL, "messages": chat, "stream": false, "logprobs": true,
                "top_logprobs": 1, "options": {"temperature": 0, "num_predict": 6}}),
            json!({"model": MODEL, "messages": chat, "stream": false, "logprobs": true,
                "top_logprobs": 1.0, "options": {"temperature": 0, "num_predict": 6.0}}),
            "/message/content",
        ),
        (
            "/v1/messages",
            json!({"model": MODEL, "messages": chat, "max_tokens": 4, "top_k": 1}),
            json!({"model": MODEL, "messages": chat, "max_tokens": 4.0, "top_k": 1.0}),
            "/content/0/text",
        ),
        (
            "/v1/responses",
            json!({"model": MODEL, "input": "Name three colours.", "temperature": 0,
                "max_output_tokens": 4}),
            json!({"model": MODEL, "input": "Name three colours.", "temperature": 0,
                "max_output_tokens": 4.0}),
            "/output/0/content/0/text",
        ),
        (
            "/v1/embeddings",
            json!({"model": MODEL, "input": "red", "dimensions": 8}),
            json!({"model": MODEL, "input": "red", "dimensions": 8.0}),
            "/data/0/embedding",
        ),
        (
            "/api/embed",
            json!({"model": MODEL, "input": "red", "dimensions": 8}),
            json!({"model": MODEL, "input": "red", "dimensions": 8.0}),
            "/embeddings/0",
        ),
    ];
    for (route, integers, floats, compared) in cases {
        let want = s.post_json(route, integers, 200);
        let got = s.post_json(route, floats.clone(), 200);
        let (want, got) = (&want.pointer(compared), &got.pointer(compared));
        assert!(want.is_some(), "{route} {compared}");
        assert_eq!(got, want, "{route} {floats}");
    }

    for (route, body, field, kind) in [
        (
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": chat, "max_tokens": 4.5}),
            "max_tokens",
            "floating point `4.5`, expected u32",
        ),
        (
            "/v1/chat/completions",
            json!({"model": MODEL, "messages": chat, "n": 1.5}),
            "n",
            "floating point `1.5`, expected u32",
        ),
        (
            "/v1/completions",
            json!({"model": MODEL, "prompt": "hi", "seed": 0.5}),
            "seed",
            "floating point `0.5`, expected i64",
        ),
        (
            "/api/generate",
            json!({"model": MODEL, "prompt": "hi", "options": {"num_predict": 8.5}}),
            "options.num_predict",
            "floating point `8.5`, expected i64",
        ),
        (
            "/api/chat",
            json!({"model": MODEL, "messages": chat, "options": {"top_k": 40.25}}),
            "options.top_k",
            "floating point `40.25`, expected i32",
        ),
        (
            "/v1/messages",
            json!({"model": MODEL, "messages": chat, "max_tokens": 2.5}),
            "max_tokens",
            "floating point `2.5`, expected u32",
        ),
        (
            "/v1/responses",
            json!({"model": MODEL, "input": "hi", "max_output_tokens": 1.5}),
            "max_output_tokens",
            "floating point `1.5`, expected u32",
        ),
    ] {
        let message = refused(&s, route, body);
        let want = format!("invalid JSON body: {field}: invalid type: {kind}");
        assert!(message.starts_with(&want), "{route}: {message}");
    }
    // An integral float past the field's type is out of range, as the integer would be.
    let message = refused(
        &s,
        "/v1/completions",
        json!({"model": MODEL, "prompt": "hi", "max_tokens": -1.0}),
    );
    assert!(
        message.starts_with(
            "invalid JSON body: max_tokens: invalid value: integer `-1`, expected u32"
        ),
        "{message}"
    );
}
