//! Embeddings take the whole served context (issue 29, item 2): texts
//! differing only after their first 600 tokens get different vectors, the
//! token counts are the real ones, truncation happens only when asked (and
//! is counted), and token-id inputs embed as their text does.
#[path = "../common/mod.rs"]
mod common;

use std::path::Path;

use common::{Server, MODEL};
use llama_tiered::llama::{LoadMode, Model, ModelParams};
use serde_json::{json, Value};

/// The served context: longer than the engine's 512-token pieces.
const CONTEXT: usize = 2048;

fn model() -> Model {
    let params = ModelParams {
        n_gpu_layers: 0,
        gpu: None,
        load_mode: LoadMode::Mmap,
        no_repack: false,
        progress: None,
    };
    Model::load(Path::new(&hypura_gguf::testing::smollm2()), params).unwrap()
}

/// `text`'s tokens as the server embeds them (BOS as the model wants it,
/// special-token text as text).
fn tokens(model: &Model, text: &str) -> Vec<i32> {
    model.tokenize(text, true, false).unwrap()
}

/// The vectors of a reply, as the f32 they were computed in.
fn vectors(reply: &Value, key: &str) -> Vec<Vec<f32>> {
    let list = match key {
        "embeddings" => reply["embeddings"].as_array().unwrap().clone(),
        _ => reply["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["embedding"].clone())
            .collect(),
    };
    list.iter()
        .map(|v| {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        })
        .collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn error_message(reply: &Value) -> String {
    match &reply["error"] {
        Value::String(s) => s.clone(),
        other => other["message"].as_str().unwrap().to_string(),
    }
}

#[test]
fn embeddings_cover_the_context_and_count_real_tokens() {
    let model = model();
    let s = Server::start(&["--context", &CONTEXT.to_string()]);
    let head = "The quick brown fox jumps over the lazy dog. ".repeat(60);
    let a = format!(
        "{head}{}",
        "Apples are red and grow on trees in the orchard. ".repeat(15)
    );
    let b = format!(
        "{head}{}",
        "Stock markets fell sharply after the bank raised rates. ".repeat(15)
    );
    let (ta, tb) = (tokens(&model, &a), tokens(&model, &b));
    let shared = ta.iter().zip(&tb).take_while(|(x, y)| x == y).count();
    assert!(shared >= 600 && ta.len() < CONTEXT, "{shared} {}", ta.len());

    let reply = s.post_json("/api/embed", json!({"model": MODEL, "input": [a, b]}), 200);
    let ollama = vectors(&reply, "embeddings");
    let similarity = cosine(&ollama[0], &ollama[1]);
    assert!(similarity < 0.9999, "cosine {similarity}");
    assert_eq!(
        reply["prompt_eval_count"].as_u64(),
        Some((ta.len() + tb.len()) as u64)
    );

    // OpenAI: the same vector and count; token ids (one list, or a list of
    // lists) embed as the text does.
    let reply = s.post_json("/v1/embeddings", json!({"model": MODEL, "input": a}), 200);
    assert_eq!(
        reply["usage"]["prompt_tokens"].as_u64(),
        Some(ta.len() as u64)
    );
    let text = vectors(&reply, "data").remove(0);
    assert_eq!(text, ollama[0]);
    for (input, count) in [
        (json!(ta), ta.len()),
        (json!([ta, tb]), ta.len() + tb.len()),
    ] {
        let reply = s.post_json(
            "/v1/embeddings",
            json!({"model": MODEL, "input": input}),
            200,
        );
        assert_eq!(vectors(&reply, "data")[0], text);
        assert_eq!(reply["usage"]["prompt_tokens"].as_u64(), Some(count as u64));
    }

    // Longer than the context: cut to it by default on /api/embed, and
    // counted so; a 400 with truncate: false, and on /v1/embeddings.
    let long = "Rivers carry water from the mountains to the sea. ".repeat(300);
    assert!(tokens(&model, &long).len() > CONTEXT);
    let reply = s.post_json("/api/embed", json!({"model": MODEL, "input": long}), 200);
    assert_eq!(reply["prompt_eval_count"].as_u64(), Some(CONTEXT as u64));
    let reply = s.post_json(
        "/api/embed",
        json!({"model": MODEL, "input": long, "options": {"num_ctx": 1024}}),
        200,
    );
    assert_eq!(reply["prompt_eval_count"].as_u64(), Some(1024));
    let n_long = tokens(&model, &long).len();
    let refused = format!(
        "input 0 has {n_long} tokens, more than the context of {CONTEXT} tokens embeddings \
         take: shorten it (Ollama's /api/embed cuts it to the context with truncate: true)"
    );
    let r = s.post(
        "/api/embed",
        json!({"model": MODEL, "input": long, "truncate": false}),
    );
    assert_eq!(r.status(), 400);
    assert_eq!(error_message(&r.json().unwrap()), refused);
    let r = s.post("/v1/embeddings", json!({"model": MODEL, "input": long}));
    assert_eq!(r.status(), 400);
    assert_eq!(error_message(&r.json().unwrap()), refused);

    // The report's case: 700 tokens, truncate: false, num_ctx 4096.
    let reply = s.post_json(
        "/api/embed",
        json!({"model": MODEL, "input": b, "truncate": false, "options": {"num_ctx": 4096}}),
        200,
    );
    assert_eq!(reply["prompt_eval_count"].as_u64(), Some(tb.len() as u64));
}

#[test]
fn token_ids_and_dimensions_outside_their_range_are_400s() {
    let s = Server::start(&[]);
    for (input, message) in [
        (
            json!([[1, 49152]]),
            "input 0 holds token 49152, outside the vocabulary of 49152 tokens",
        ),
        (
            json!([1, -1]),
            "input token ids must be integers from 0 to the model's vocabulary size",
        ),
        (
            json!([[5_000_000_000_i64]]),
            "input token ids must be integers from 0 to the model's vocabulary size",
        ),
        (
            json!([[]]),
            "input must be a non-empty string or list of them",
        ),
    ] {
        let r = s.post("/v1/embeddings", json!({"model": MODEL, "input": input}));
        assert_eq!(r.status(), 400, "{input}");
        assert_eq!(error_message(&r.json().unwrap()), message, "{input}");
    }
    for (route, dimensions) in [
        ("/v1/embeddings", json!(1_000_000_000_000_u64)),
        ("/api/embed", json!(577)),
        ("/api/embed", json!(0)),
    ] {
        let r = s.post(
            route,
            json!({"model": MODEL, "input": "hello", "dimensions": dimensions}),
        );
        assert_eq!(r.status(), 400, "{route} {dimensions}");
        assert_eq!(
            error_message(&r.json().unwrap()),
            format!(
                "dimensions must be between 1 and 576 (the model's embedding length), got \
                 {dimensions}"
            )
        );
    }
    let r = s.post(
        "/api/embed",
        json!({"model": MODEL, "input": "hello", "dimensions": 1e12}),
    );
    assert_eq!(r.status(), 400);
    assert!(error_message(&r.json().unwrap()).contains("dimensions"));
}
