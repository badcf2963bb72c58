//! Serving requests on one model. Continuous batching: up to `n_parallel` requests
//! decoded together in one llama.cpp context, as llama-server's slots do it.
//!
//! One worker thread owns the [`Context`](crate::llama::Context). Each step it drops cancelled
//! requests, admits queued ones into free slots (sequence ids `0..n_slots`,
//! at most `n_parallel` of them decoding; an idle slot keeps its last
//! conversation's KV for that conversation's next turn), builds one [`Batch`](crate::llama::Batch) holding the next token of every
//! generating sequence plus chunks of the prompts still being read (so a long
//! prompt never stalls the others), decodes it once, and samples every
//! sequence that got logits from its own row with its own sampler.
//!
//! Each sequence keeps its own positions and its own KV stream: the context
//! uses llama.cpp's non-unified KV cache (its default), so a greedy
//! generation gives the same tokens alone or among others. With `kv_unified`
//! the sequences share one KV buffer: a sequence's cells sit at other indices,
//! among the others' masked cells, so attention sums in another order, and
//! greedy outputs on SmolLM2 part from the solo ones within 4 to 15 tokens
//! for some prompts (measured). The price of separate streams: llama.cpp
//! splits a batch over them into micro-batches with equal tokens per
//! sequence, so prompts of different lengths read in one step take several
//! micro-batches.
//!
//! [`BatchEngine::switch_model`] moves the engine onto another load of the
//! same file (another placement: layers moved to or from the GPU, weights no
//! longer streamed) between two decode steps: the worker copies every
//! sequence's KV cache into a context of the new model, rebinds the samplers
//! and goes on; requests in flight never notice, and the old model is free
//! once its caller drops it.
//!
//! Lock order: the request state (`Shared::state`), the embedding context
//! (`Inner::embedder`) and the current model (`Inner::current`) are never
//! held together; the worker holds no lock while it decodes or calls a sink.
//!
//! - `queue`: the engine's handle ([`BatchEngine`]): configuration, requests and their
//!   events, the queue of requests waiting for a slot, counters.
//! - `worker`: the decode thread: slots, one batch per step, sampling, finishing requests.
//! - `switch`: [`BatchEngine::switch_model`], moving every sequence onto another load.
//! - `embed`: [`BatchEngine::embed`], in its own small context.
//! - [`prompt_cache`]: KV kept between requests (slots, RAM, NVMe) so a
//!   conversation's next turn decodes only its new tokens; `reuse`: how the
//!   worker picks a slot and restores a prefix.
//! - [`generate`]: one sequence's decode loop (stop strings, UTF-8, end of generation,
//!   timings), also usable alone on a context.
//! - [`prompt`]: messages or raw text → token ids.
mod embed;
pub mod generate;
pub mod prompt;
pub mod prompt_cache;
mod queue;
mod reuse;
mod switch;
mod worker;

pub use embed::EMBED_N_CTX;
pub use prompt_cache::{PromptCacheConfig, PromptCacheStatus};
pub use queue::{
    BatchConfig, BatchEngine, BatchStatus, EventSink, GenerateRequest, GenerationEvent, RequestId,
    MAX_PARALLEL,
};
