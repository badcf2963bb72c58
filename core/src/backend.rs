//! The boundary between the gateway and a model: [`ModelBackend`].
//!
//! Everything above this trait (dialects, [`crate::infer`]) works with
//! text, token counts and the events below, never with llama.cpp types: the
//! in-process engine is one implementation, a child runner process and a
//! remote upstream are others. Requests and events
//! are serializable so they can cross a process or a network.
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use hypura_scheduler::budget::Residency;
/// Log-probabilities of generated tokens (plain data, as the engine reports them).
pub use llama_tiered::engine::generate::{Logprob, TokenLogprobs};

use super::request::{BackendRequest, EmbedBatch, Prompt};

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

/// A tool call as another server reported it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CalledTool {
    /// The id it gave the call, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    pub name: String,
    pub arguments: Map<String, Value>,
}

/// A failure of a backend; its HTTP status is decided in [`crate::error`].
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

/// llama-tiered's errors as the statuses they mean (here, not in the pool,
/// because a crate may only implement `From` for its own types).
impl From<llama_tiered::EngineError> for BackendError {
    fn from(e: llama_tiered::EngineError) -> Self {
        use llama_tiered::EngineError;
        let message = e.to_string();
        match e {
            EngineError::InvalidArgument(_)
            | EngineError::PromptTooLong { .. }
            | EngineError::Template(_) => BackendError::Invalid(message),
            EngineError::QueueFull => BackendError::Busy(format!(
                "{message}: the model's request queue is full, retry later"
            )),
            EngineError::ShuttingDown => BackendError::ShuttingDown(format!(
                "{message}: the model is being unloaded or the server is stopping, retry"
            )),
            _ => BackendError::Failed(message),
        }
    }
}

/// What a generation yields, in this order: `Started`, then (when any token
/// was generated) `FirstToken`, then `Text` pieces (each after the
/// `Logprobs` of its tokens, when they were asked), then exactly one of
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
    /// The log-probabilities of the tokens the next `Text` begins (or, just
    /// before `Done`, of tokens that made no text); only when the request's
    /// sampling asked for them (`top_logprobs`).
    Logprobs(Vec<TokenLogprobs>),
    /// Tool calls another server already parsed from its model's reply (an
    /// upstream's `tool_calls`), before `Done`; a local model's calls are
    /// parsed here from its text.
    ToolCalls(Vec<CalledTool>),
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

    /// Whether this server tokenizes the model's prompts (false for a model
    /// another server runs: that server checks and fits its own context).
    fn counts_tokens(&self) -> bool {
        true
    }

    /// How many tokens `request` would submit: its `context`, then its
    /// prompt rendered with the chat template and tokenized. Backends that
    /// render templates count exactly; this default estimates from
    /// [`ModelBackend::count_tokens`] of each message (plus a few tokens
    /// for each message's markers).
    fn prompt_tokens(&self, request: &BackendRequest) -> Result<usize, BackendError> {
        let prompt = match &request.prompt {
            Prompt::Load => 0,
            Prompt::Text { text } => self.count_tokens(text)?,
            Prompt::Tokens(tokens) => tokens.len(),
            Prompt::Messages { messages, .. } => {
                let mut sum = 0;
                for message in messages {
                    sum += self.count_tokens(&message.content)? + 4;
                }
                sum
            }
        };
        Ok(request.context.len() + prompt)
    }

    /// What the backend runs now.
    fn status(&self) -> BackendStatus;

    /// What the model is: capabilities, template and metadata (`/api/show`,
    /// `/api/tags`, `/v1/models`).
    fn facts(&self) -> ModelFacts;

    /// Where its weights are now, in bytes per tier (`/api/ps`).
    fn memory(&self) -> MemoryUse;

    /// Asks for the model to move to `level` (a promotion or demotion under
    /// the pool's budget). Returns once the move is requested; it completes
    /// in the background, and [`ModelBackend::memory`] shows the target.
    fn set_residency(&self, level: Residency) -> Result<(), BackendError>;

    /// What streaming its weights from disk cost, counted since the model
    /// was loaded (across its switches of placement); `None` for a backend
    /// that never streamed. Read by `/metrics` and `/status`.
    fn streaming(&self) -> Option<StreamCounters> {
        None
    }

    /// The KV cache of its slots now (`None` when the backend cannot tell).
    fn kv_cache(&self) -> Option<KvCache> {
        None
    }
}

/// A backend's KV cache: cells (one per token of context, all slots
/// together) and what they take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvCache {
    /// Cells holding tokens of the requests in the slots.
    pub cells_used: u64,
    /// Cells allocated: slots × context per slot.
    pub cells: u64,
    /// Bytes allocated for them (f16 keys and values).
    pub bytes: u64,
    /// The prompt cache: counters since load, bytes and entries per tier.
    #[serde(default)]
    pub prompt_cache: llama_tiered::engine::PromptCacheStatus,
}

/// Counters of a model's weight streaming, cumulative since it was loaded:
/// the engine's own counts (its `StreamStats`), never estimates. Gauges
/// (`cache_bytes`, `cache_budget_bytes`) are the values now.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StreamCounters {
    /// Bytes read from the model file after load.
    pub nvme_bytes_read: u64,
    /// Seconds spent in those reads (decoding thread and prefetcher summed).
    pub read_seconds: f64,
    /// Unit lookups (an expert, or a dense layer's FFN) found resident.
    pub expert_hits: u64,
    /// Unit lookups that had to be read.
    pub expert_misses: u64,
    /// Units the prefetcher read that were then used.
    pub prefetch_hits: u64,
    /// Bytes the prefetcher read that were evicted unused.
    pub prefetch_wasted_bytes: u64,
    /// Seconds the decoding thread waited for reads.
    pub io_stall_seconds: f64,
    pub evictions: u64,
    /// Bytes of streamed units resident now, and the cache's limit.
    pub cache_bytes: u64,
    pub cache_budget_bytes: u64,
}

impl StreamCounters {
    /// These counters followed by `later`'s (a model's next placement):
    /// counters add up, gauges are `later`'s.
    pub fn then(&self, later: &StreamCounters) -> StreamCounters {
        StreamCounters {
            nvme_bytes_read: self.nvme_bytes_read + later.nvme_bytes_read,
            read_seconds: self.read_seconds + later.read_seconds,
            expert_hits: self.expert_hits + later.expert_hits,
            expert_misses: self.expert_misses + later.expert_misses,
            prefetch_hits: self.prefetch_hits + later.prefetch_hits,
            prefetch_wasted_bytes: self.prefetch_wasted_bytes + later.prefetch_wasted_bytes,
            io_stall_seconds: self.io_stall_seconds + later.io_stall_seconds,
            evictions: self.evictions + later.evictions,
            cache_bytes: later.cache_bytes,
            cache_budget_bytes: later.cache_budget_bytes,
        }
    }
}

/// What a model is, as its file (or its upstream) states it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelFacts {
    /// Architecture (`llama`, `qwen3`): Ollama's `family`.
    pub family: String,
    /// `"135M"`, `"7.2B"`: Ollama's `parameter_size`.
    pub parameter_size: String,
    /// `"Q4_1"`: Ollama's `quantization_level`.
    pub quantization: String,
    /// Training context in tokens, when stated.
    pub context_length: Option<u64>,
    /// The chat template (Jinja) the model is prompted with: its own, or
    /// ChatML when it has none.
    pub template: String,
    /// `completion`, then `thinking`, `tools`… as the template supports them.
    pub capabilities: Vec<String>,
    /// Scalar metadata (arrays as `null`), for `/api/show`'s `model_info`.
    pub model_info: Map<String, Value>,
    /// Size of the weights' file in bytes.
    pub size_bytes: u64,
    pub modified: SystemTime,
    pub digest: String,
}

/// Bytes of a model's weights per tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TierBytes {
    pub gpu: u64,
    pub ram: u64,
    /// Left on disk, read on demand.
    pub stream: u64,
}

/// Where a model's weights are now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryUse {
    /// The residency (its target while a move runs); `full` without a budget.
    pub residency: Residency,
    pub tier_bytes: TierBytes,
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
    /// Sequences decoded together (slots).
    pub parallel: u32,
    /// Recent decode rate of finished generations, in tokens per second
    /// (`None` before the first one).
    pub decode_tokens_per_second: Option<f64>,
}

/// The recent decode rate of a model: an exponentially weighted mean of
/// each finished generation's tokens per second. Shared by every request
/// to one model; updated when a generation ends.
#[derive(Debug, Default)]
pub struct DecodeRate {
    tokens_per_second: Mutex<Option<f64>>,
}

impl DecodeRate {
    /// Weight of the newest generation.
    const ALPHA: f64 = 0.3;

    /// Counts a finished generation; one that decoded nothing (or took no
    /// time) says nothing about the rate and is skipped.
    pub fn record(&self, finished: &Finished) {
        let seconds = finished.eval_duration.as_secs_f64();
        if finished.generated_tokens == 0 || seconds <= 0.0 {
            return;
        }
        let rate = finished.generated_tokens as f64 / seconds;
        let mut mean = self
            .tokens_per_second
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        *mean = Some(match *mean {
            Some(old) => old + Self::ALPHA * (rate - old),
            None => rate,
        });
    }

    pub fn tokens_per_second(&self) -> Option<f64> {
        *self
            .tokens_per_second
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finished(tokens: usize, eval_ms: u64) -> Finished {
        Finished {
            finish_reason: FinishReason::Stop,
            prompt_tokens: 3,
            generated_tokens: tokens,
            prompt_eval_tokens: 3,
            prompt_eval_duration: Duration::from_millis(1),
            eval_duration: Duration::from_millis(eval_ms),
            context: Vec::new(),
        }
    }

    #[test]
    fn decode_rate_starts_at_the_first_generation_then_moves_toward_each_next() {
        let rate = DecodeRate::default();
        assert_eq!(rate.tokens_per_second(), None);
        rate.record(&finished(100, 1000));
        assert_eq!(rate.tokens_per_second(), Some(100.0));
        rate.record(&finished(200, 1000));
        assert_eq!(rate.tokens_per_second(), Some(130.0));
    }

    #[test]
    fn decode_rate_skips_generations_that_decoded_nothing() {
        let rate = DecodeRate::default();
        rate.record(&finished(0, 1000));
        rate.record(&finished(10, 0));
        assert_eq!(rate.tokens_per_second(), None);
    }

    #[test]
    fn memory_serializes_residency_in_lower_case() {
        let memory = MemoryUse {
            residency: Residency::Streaming,
            tier_bytes: TierBytes {
                gpu: 1,
                ram: 2,
                stream: 3,
            },
        };
        assert_eq!(
            serde_json::to_value(memory).unwrap(),
            serde_json::json!({"residency": "streaming", "tier_bytes": {"gpu": 1, "ram": 2, "stream": 3}})
        );
    }
}
