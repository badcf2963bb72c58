//! The test models for tests (feature `testing`): their paths, from hypura-gguf's fixtures,
//! and SmolLM2 loaded once per test process.
//!
//! Tests that need a real model fail with a clear message when the model is missing: CI
//! fetches the models first, so a missing file is a setup error, never a reason to skip.
use std::sync::{Arc, OnceLock};

// Re-exported so engine tests find every test model in one place.
pub use hypura_gguf::testing::{models_dir, smollm2};

use crate::llama::{Model, ModelParams};

/// SmolLM2 loaded once per test process (llama.cpp's default load), shared by tests.
pub fn smollm2_model() -> Arc<Model> {
    static MODEL: OnceLock<Arc<Model>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            Arc::new(Model::load(&smollm2(), ModelParams::default()).expect("load SmolLM2"))
        })
        .clone()
}
