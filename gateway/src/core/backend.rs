//! The boundary between the gateway and a model: [`ModelBackend`].
//!
//! Everything above this trait (dialects, [`crate::core::infer`]) works with
//! text, token counts and the events below, never with llama.cpp types: the
//! in-process engine ([`crate::pool::local`]) is one implementation, a child
//! runner process or a remote upstream can be others. Requests and events
//! are serializable so they can cross a process or a network.
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use serde::{Deserialize, Serialize};

use super::request::{BackendRequest, EmbedBatch};

/// Why a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An end-of-generation token or a stop string.
    Stop,
    /// The token limit, or a full context.
    Length,
    /// The request was cancelled (client gone).
    Cancelled,
}

impl FinishReason {
    /// Ollama's and OpenAI's name for it (a cancelled reply reads as stopped).
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop | FinishReason::Cancelled => "stop",
            FinishReason::Length => "length",
        }
    }
}

/// The end of a generation: what the model produced and what it cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finished {
    pub finish_reason: FinishReason,
    /// Tokens of the prompt as submitted (context included).
    pub prompt_tokens: usize,
    /// Tokens generated, not counting a final end-of-generation token.
    pub generated_tokens: usize,
    /// Prompt tokens evaluated (fewer than `prompt_tokens` when a cache held some).
    pub prompt_eval_tokens: usize,
    pub prompt_eval_duration: Duration,
    pub eval_duration: Duration,
    /// Prompt then every sampled token (an end-of-generation token
    /// included): what continues this conversation (Ollama's `context`).
    pub context: Vec<i32>,
}

/// A failure of a backend; its HTTP status is decided in [`crate::core::error`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum BackendError {
    /// The request cannot run on this model (prompt too long, bad template…): a 400.
    #[error("{0}")]
    Invalid(String),
    /// The model's queue is full: a 503, retry later.
    #[error("{0}")]
    Busy(String),
    /// The model is being unloaded or the server is stopping: retry once on a fresh load.
    #[error("{0}")]
    ShuttingDown(String),
    /// Anything else: a 500.
    #[error("{0}")]
    Failed(String),
}

/// What a generation yields, in this order: `Started`, then (when any token
/// was generated) `FirstToken`, then `Text` pieces, then exactly one of
/// `Done` or `Error`, then nothing. An `Error` may come at any point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendEvent {
    /// The request left the queue and its prompt began evaluating.
    Started {
        queued_for: Duration,
    },
    /// The first token was sampled (time to first token is measured here).
    FirstToken,
    /// Text now final: whole UTF-8 characters, never a prefix of a stop string.
    Text(String),
    Done(Finished),
    Error(BackendError),
}

/// The events of one generation. Dropping the stream cancels the generation:
/// the backend frees its slot before its next decode step.
pub type EventStream = BoxStream<'static, BackendEvent>;

/// One model, loaded (or reachable) and held for the requests using it.
///
/// Object-safe: the pool hands out `Arc<dyn ModelBackend>`.
pub trait ModelBackend: Send + Sync {
    /// Submits a generation. Errors found before it is queued (a prompt that
    /// does not fit, a full queue, an engine stopping) come back here; later
    /// ones as [`BackendEvent::Error`].
    fn generate(&self, request: BackendRequest)
        -> BoxFuture<'_, Result<EventStream, BackendError>>;

    /// One L2-normalised vector per text, and the tokens they took.
    fn embed(&self, batch: EmbedBatch) -> BoxFuture<'_, Result<EmbedOutput, BackendError>>;

    /// How many tokens `text` is, as the model tokenizes a raw prompt.
    fn count_tokens(&self, text: &str) -> Result<usize, BackendError>;

    /// What the backend runs now.
    fn status(&self) -> BackendStatus;
}

/// Vectors and the tokens they took.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmbedOutput {
    pub vectors: Vec<Vec<f32>>,
    pub prompt_tokens: usize,
}

/// A backend's state, for `/api/ps` and the budget.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BackendStatus {
    /// Context per sequence, in tokens.
    pub context_length: u32,
    /// Requests generating now.
    pub active: usize,
    /// Requests waiting for a slot.
    pub queued: usize,
}
