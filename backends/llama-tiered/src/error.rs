//! The engine's error type.
use std::path::PathBuf;

use hypura_gguf::GgufError;

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
    /// The planner found no placement (e.g. the model does not fit the budgets).
    #[error(transparent)]
    Plan(#[from] hypura_scheduler::plan::PlanError),
    #[error("the prompt has {prompt_tokens} tokens but the context holds {n_ctx}: shorten it or raise the context size")]
    PromptTooLong { prompt_tokens: usize, n_ctx: u32 },
    #[error("the context is full: no KV cache slot left for the batch")]
    ContextFull,
    #[error("cancelled")]
    Cancelled,
    #[error("llama_decode failed with code {0}")]
    Decode(i32),
    /// Streaming a weight from the model file failed (I/O error, file truncated after load).
    #[error("streaming weights from the model file failed: {0}")]
    Stream(String),
    #[error("chat template: {0}")]
    Template(String),
    /// The batch engine's queue already holds as many waiting requests as it may.
    #[error("too many requests are waiting for this model (the queue is full): retry later")]
    QueueFull,
    /// The batch engine is shutting down (or its worker stopped) and takes no new requests.
    #[error("the engine is shutting down and takes no new requests")]
    ShuttingDown,
}
