//! The one module of the engine that talks to llama.cpp through FFI.
//!
//! Every `unsafe` block of the engine lives below this module, each with a
//! `// SAFETY:` line; the types it exports are safe to use from anywhere. Wrappers only:
//! what to do with them (batching, placement, measuring) lives in the modules above.
//!
//! - `backend`, `model`, `context`, `state`: llama.cpp's backend, models, contexts, batches,
//!   KV state of a sequence.
//! - `sampler`, `grammar`: sampling chains and GBNF grammars (JSON schema → grammar).
//! - `stream`: the STREAM buffer type and the eval callback.
//! - [`gguf_write`]: llama.cpp's gguf writer and ggml's (de)quantizers.
//! - [`device`]: ggml's compute devices, for the hardware probe.
mod argmax;
mod backend;
mod context;
pub mod device;
pub mod gguf_write;
mod grammar;
mod model;
mod sampler;
mod state;
mod stream;

pub use backend::init as init_backend;
pub use backend::{gpu_devices, GpuDevice};
pub use context::{default_threads, Batch, Context, ContextMemory, ContextParams, PerfTimings};
pub use grammar::{json_schema_to_grammar, GRAMMAR_ROOT, JSON_OBJECT_SCHEMA};
pub use model::{GpuOffload, LoadMode, Model, ModelParams};
pub use sampler::{Sampler, SamplingParams, LOGIT_BIAS_MAX, MAX_TOP_LOGPROBS};
pub use state::{StateBuffer, StateBuffers};
pub use stream::{
    recycling_split_points, EvalHook, LoadReport, Node, StreamBufferType, StreamRegion, PAGE,
};
