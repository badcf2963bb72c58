//! hypura's engine: llama.cpp with tiered weights.
//!
//! GGUF files are read and checked by `hypura-gguf`, chat templates rendered by
//! `hypura-chat`; this crate runs models.
//!
//! - [`llama`]: the FFI boundary, and the only module with `unsafe`: models, contexts,
//!   batches, samplers, grammars, the STREAM buffer type, llama.cpp's gguf writer, ggml's
//!   devices.
//! - [`engine`]: serving requests: continuous batching (queue, worker, model switch,
//!   embeddings), the decode loop, prompts.
//! - [`tiered`]: placement of tensors on GPU / RAM / STREAM and the streamer.
//! - [`hwprobe`]: `hypura profile` — measures CPU, RAM, GPUs and disk; caches the profile.
//! - [`rng`]: the seeded generator for benchmark data and synthetic weights.
//! - [`error`]: the engine's one error type, [`EngineError`].
//! - [`test_models`] (feature `testing`): the test models for tests.
pub mod engine;
pub mod error;
pub mod hwprobe;
pub mod llama;
pub mod rng;
#[cfg(any(test, feature = "testing"))]
pub mod test_models;
pub mod tiered;

pub use error::EngineError;
