//! The test models for tests (feature `testing`): their paths, from hypura-gguf's fixtures,
//! and SmolLM2 loaded once per test process.
//!
//! Tests that need a real model fail with a clear message when the model is missing: CI
//! fetches the models first, so a missing file is a setup error, never a reason to skip.
use std::sync::{Arc, OnceLock};

// Re-exported so engine tests find every test model in one place.
pub use hypura_gguf::testing::{models_dir, smollm2};

use crate::engine::generate::{generate, GenerateParams};
use crate::engine::prompt;
use crate::llama::{Batch, Context, ContextParams, Model, ModelParams, SamplingParams};
use crate::tiered::TieredModel;

/// SmolLM2 loaded once per test process (llama.cpp's default load), shared by tests.
pub fn smollm2_model() -> Arc<Model> {
    static MODEL: OnceLock<Arc<Model>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            Arc::new(Model::load(&smollm2(), ModelParams::default()).expect("load SmolLM2"))
        })
        .clone()
}

/// One greedy step seen from two contexts over the same model.
pub struct GreedyStep {
    /// The logits `host` read (its decodes sample nothing).
    pub logits: Vec<f32>,
    /// The host's argmax of them (the first largest), fed to both contexts.
    pub argmax: i32,
    /// What `host` sampled inside its graph: `None` unless it was asked to.
    pub host_sampled: Option<i32>,
    /// What `device` sampled inside its graph (`Context::set_device_greedy`).
    pub device_sampled: Option<i32>,
}

/// Decodes `tokens` as sequence 0 of both contexts, then `steps` greedy
/// steps, each feeding both the host's argmax of `host`'s logits.
pub fn greedy_side_by_side(
    host: &mut Context,
    device: &mut Context,
    tokens: &[i32],
    steps: u32,
) -> Vec<GreedyStep> {
    let mut batch = Batch::new(tokens.len());
    for (i, &t) in tokens.iter().enumerate() {
        batch.push(t, i as i32, 0, i + 1 == tokens.len()).unwrap();
    }
    host.decode(&batch).unwrap();
    device.decode(&batch).unwrap();
    let mut row = tokens.len() as i32 - 1;
    let mut seen = Vec::new();
    for step in 0..steps as i32 {
        let logits = host.logits(row).unwrap().to_vec();
        let argmax = (0..logits.len()).fold(0, |b, i| if logits[i] > logits[b] { i } else { b });
        seen.push(GreedyStep {
            argmax: argmax as i32,
            host_sampled: host.sampled_token(row),
            device_sampled: device.sampled_token(row),
            logits,
        });
        let mut one = Batch::new(1);
        one.push(argmax as i32, tokens.len() as i32 + step, 0, true)
            .unwrap();
        host.decode(&one).unwrap();
        device.decode(&one).unwrap();
        row = 0;
    }
    seen
}

/// The greedy tokens of `n` steps after `text` (no template), in a new
/// context of `model` (256 tokens, 2 threads).
pub fn greedy_tokens(model: &TieredModel, text: &str, n: u32) -> Vec<i32> {
    let mut ctx = model
        .new_context(&ContextParams {
            n_ctx: 256,
            n_threads: 2,
            ..Default::default()
        })
        .unwrap();
    let tokens = prompt::tokenize_raw(&model.model, text).unwrap();
    let params = GenerateParams {
        sampling: SamplingParams {
            temperature: 0.0,
            ..Default::default()
        },
        max_tokens: Some(n),
        stop: vec![],
        cache_prompt: true,
    };
    generate(&mut ctx, 0, &tokens, &params, &mut |_| true)
        .unwrap()
        .tokens
}
