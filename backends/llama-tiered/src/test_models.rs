//! Paths of the test models fetched by `scripts/fetch-models.sh`.
//!
//! Tests that need a real model call these and fail with a clear message when
//! the model is missing: CI fetches the models first, so a missing file is a
//! setup error, never a reason to skip.
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use crate::llama::{Model, ModelParams};

/// Folder holding the fetched models: `$HYPURA_MODELS_DIR`, else `models/` at the workspace root.
pub fn models_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("HYPURA_MODELS_DIR") {
        return PathBuf::from(dir);
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models")
}

/// SmolLM2-135M-Instruct Q4_1 (llama architecture, GPT-2 BPE, ChatML).
pub fn smollm2() -> PathBuf {
    let path = models_dir().join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.is_file(),
        "{} is missing: run scripts/fetch-models.sh first",
        path.display()
    );
    path
}

/// SmolLM2 loaded once per test process (llama.cpp's default load), shared by tests.
pub fn smollm2_model() -> Arc<Model> {
    static MODEL: OnceLock<Arc<Model>> = OnceLock::new();
    MODEL
        .get_or_init(|| {
            Arc::new(Model::load(&smollm2(), ModelParams::default()).expect("load SmolLM2"))
        })
        .clone()
}
