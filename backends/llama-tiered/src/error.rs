//! The engine's error type.
use std::path::PathBuf;

use crate::gguf::GgufError;

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The file is missing, not a GGUF, truncated, malformed or of an
    /// unsupported architecture (found before llama.cpp opens it).
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("could not load model {path}: {reason}")]
    Load { path: PathBuf, reason: String },
    #[error("{0}")]
    Context(String),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("the prompt has {prompt_tokens} tokens but the context holds {n_ctx}: shorten it or raise the context size")]
    PromptTooLong { prompt_tokens: usize, n_ctx: u32 },
    #[error("the context is full: no KV cache slot left for the batch")]
    ContextFull,
    #[error("cancelled")]
    Cancelled,
    #[error("llama_decode failed with code {0}")]
    Decode(i32),
    #[error("chat template: {0}")]
    Template(String),
}
