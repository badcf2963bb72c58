//! Switching a batch engine onto another placement of the same model between
//! two decode steps (`BatchEngine::switch_model`), with requests in flight,
//! on SmolLM2 and real llama.cpp.
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver};
use std::sync::Arc;
use std::time::Duration;

use hypura_gguf::GgufFile;
use llama_tiered::engine::generate::{Completion, GenerateParams};
use llama_tiered::engine::prompt;
use llama_tiered::engine::{BatchConfig, BatchEngine, GenerateRequest, GenerationEvent};
use llama_tiered::llama::{json_schema_to_grammar, Model, ModelParams, SamplingParams};
use llama_tiered::tiered::footprint::StreamFootprint;
use llama_tiered::tiered::{GpuShare, Mode, PlannedLoad, TieredModel, TieredParams};
use llama_tiered::{test_models, EngineError};

const DEADLINE: Duration = Duration::from_secs(120);

fn config() -> BatchConfig {
    BatchConfig {
        n_parallel: 4,
        n_ctx_per_seq: 512,
        n_batch: 512,
        n_ubatch: 0,
        n_threads: 2,
        queue_limit: 16,
        prompt_cache: Default::default(),
    }
}

/// Every weight in RAM, with the kernels the streamed load uses.
fn full(path: &Path) -> Arc<Model> {
    let params = ModelParams {
        no_repack: true,
        ..Default::default()
    };
    Arc::new(Model::load(path, params).expect("full load"))
}

/// Dense FFN streamed through the smallest cache one context allows.
fn streamed(path: &Path) -> TieredModel {
    let file = GgufFile::open(path).unwrap();
    let footprint = StreamFootprint::of(&file);
    let budget = footprint.resident_bytes + footprint.layer_bytes;
    let plan = PlannedLoad::fixed(&file, Mode::DenseFfnStreaming, GpuShare::None, Some(budget));
    let params = TieredParams {
        plan: Some(plan.expect("a fixed plan")),
        no_repack: true,
        prefetch: true,
        cache_dir: Some(std::env::temp_dir().join(format!("hypura-switch-{}", std::process::id()))),
        ..Default::default()
    };
    TieredModel::load(path, &params).expect("streamed load")
}

/// Three requests: plain text, another prompt, and one under a JSON grammar
/// (its sampler state must survive the switch).
fn requests(model: &Model) -> Vec<GenerateRequest> {
    let greedy = |max_tokens, grammar: Option<String>| GenerateParams {
        sampling: SamplingParams {
            grammar,
            ..SamplingParams::greedy()
        },
        max_tokens: Some(max_tokens),
        stop: vec![],
        cache_prompt: true,
    };
    let schema = r#"{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"}},"required":["name","age"]}"#;
    let grammar = json_schema_to_grammar(schema).unwrap();
    [
        ("The capital of France is", greedy(48, None)),
        ("Once upon a time, in a small village,", greedy(48, None)),
        ("A person as JSON:", greedy(40, Some(grammar))),
    ]
    .into_iter()
    .map(|(text, params)| GenerateRequest {
        prompt: prompt::tokenize_raw(model, text).unwrap(),
        params,
    })
    .collect()
}

type Events = Receiver<GenerationEvent>;

fn submit_all(engine: &BatchEngine, requests: Vec<GenerateRequest>) -> Vec<Events> {
    requests
        .into_iter()
        .map(|r| {
            let (tx, rx) = mpsc::channel();
            engine
                .submit(r, Box::new(move |e| tx.send(e).is_ok()))
                .unwrap();
            rx
        })
        .collect()
}

/// Waits until `rx` has streamed `n` text events (kept in `seen`).
fn wait_for_text(rx: &Events, n: usize, seen: &mut Vec<GenerationEvent>) {
    while seen
        .iter()
        .filter(|e| matches!(e, GenerationEvent::Text(_)))
        .count()
        < n
    {
        let event = rx.recv_timeout(DEADLINE).expect("text before the deadline");
        let done = !matches!(event, GenerationEvent::Started | GenerationEvent::Text(_));
        seen.push(event);
        assert!(!done, "the request ended before the switch");
    }
}

fn outcome(rx: &Events, mut seen: Vec<GenerationEvent>) -> Completion {
    loop {
        if let Some(GenerationEvent::Done(_) | GenerationEvent::Error(_)) = seen.last() {
            break;
        }
        seen.push(rx.recv_timeout(DEADLINE).expect("an outcome"));
    }
    let streamed: String = seen
        .iter()
        .filter_map(|e| match e {
            GenerationEvent::Text(t) => Some(t.as_str()),
            _ => None,
        })
        .collect();
    match seen.pop() {
        Some(GenerationEvent::Done(c)) => {
            assert_eq!(streamed, c.text, "streamed text = final text");
            c
        }
        Some(GenerationEvent::Error(e)) => panic!("request failed: {e}"),
        _ => unreachable!(),
    }
}

fn tokens(completions: &[Completion]) -> Vec<Vec<i32>> {
    completions.iter().map(|c| c.tokens.clone()).collect()
}

/// What the requests give on one placement throughout.
fn reference(path: &Path) -> Vec<Completion> {
    let model = full(path);
    let engine = BatchEngine::start(Arc::clone(&model), config()).unwrap();
    let rxs = submit_all(&engine, requests(&model));
    rxs.iter().map(|rx| outcome(rx, Vec::new())).collect()
}

fn smollm2() -> PathBuf {
    test_models::smollm2()
}

#[test]
fn requests_in_flight_survive_switches_both_ways_with_the_same_tokens() {
    let path = smollm2();
    let want = reference(&path);
    let lens: Vec<usize> = want.iter().map(|c| c.tokens.len()).collect();
    assert!(
        lens.iter().all(|&n| n >= 12),
        "long enough to switch mid-way: {lens:?}"
    );

    // Start streamed, switch to full residency a few tokens in, then back.
    let tiered = streamed(&path);
    let engine =
        BatchEngine::start_with_hook(Arc::clone(&tiered.model), config(), tiered.hook()).unwrap();
    let rxs = submit_all(&engine, requests(&tiered.model));
    let mut seen: Vec<Vec<GenerationEvent>> = rxs.iter().map(|_| Vec::new()).collect();
    wait_for_text(&rxs[0], 4, &mut seen[0]);

    let resident = full(&path);
    engine.switch_model(Arc::clone(&resident), None).unwrap();
    assert!(Arc::ptr_eq(&engine.model(), &resident));
    assert_eq!(
        engine.status().active,
        3,
        "switched with all three in flight"
    );
    // The old placement is no longer used by the engine: ours is the last handle.
    let old = Arc::clone(&tiered.model);
    drop(tiered);
    assert_eq!(
        Arc::strong_count(&old),
        1,
        "the engine let go of the old model"
    );
    drop(old);

    wait_for_text(&rxs[0], 10, &mut seen[0]);
    let back = streamed(&path);
    engine
        .switch_model(Arc::clone(&back.model), back.hook())
        .unwrap();
    let got: Vec<Completion> = rxs.iter().zip(seen).map(|(rx, s)| outcome(rx, s)).collect();
    assert_eq!(tokens(&got), tokens(&want));
    let stats = back.streamer.as_ref().unwrap().stats();
    assert!(
        stats.nvme_bytes_read > 0,
        "the last part was streamed: {stats:?}"
    );
    let json: serde_json::Value = serde_json::from_str(&got[2].text).expect("still valid JSON");
    assert!(json.get("name").is_some(), "{json}");

    // New requests after the switches decode on the new placement.
    let again = submit_all(&engine, requests(&back.model));
    let got: Vec<Completion> = again.iter().map(|rx| outcome(rx, Vec::new())).collect();
    assert_eq!(tokens(&got), tokens(&want));
    // Embeddings use the new placement too (their context is made again).
    let embedded = engine.embed(&["hello".to_string()]).unwrap();
    assert_eq!(embedded[0].len(), back.model.n_embd());
}

#[test]
fn a_switch_to_another_file_is_refused_and_the_engine_goes_on() {
    let path = smollm2();
    let model = full(&path);
    let engine = BatchEngine::start(Arc::clone(&model), config()).unwrap();
    let copy = std::env::temp_dir().join(format!("hypura-switch-copy-{}.gguf", std::process::id()));
    std::fs::copy(&path, &copy).unwrap();
    let other = full(&copy);
    let err = engine.switch_model(other, None).unwrap_err();
    assert!(matches!(err, EngineError::InvalidArgument(_)), "{err}");
    assert!(Arc::ptr_eq(&engine.model(), &model));
    let rxs = submit_all(&engine, requests(&model));
    let got: Vec<Completion> = rxs.iter().map(|rx| outcome(rx, Vec::new())).collect();
    assert_eq!(tokens(&got), tokens(&reference(&path)));
    std::fs::remove_file(copy).unwrap();
}

#[test]
fn a_switch_after_shutdown_is_an_error() {
    let path = smollm2();
    let engine = BatchEngine::start(full(&path), config()).unwrap();
    engine.shutdown();
    let err = engine.switch_model(full(&path), None).unwrap_err();
    assert!(matches!(err, EngineError::ShuttingDown), "{err}");
}
