//! hypura's engine: llama.cpp with tiered weights.
//!
//! - [`gguf`]: reads and validates GGUF files in safe Rust, before llama.cpp sees them.
//! - [`inspect`]: what a model file holds (architecture, parameters, bytes per tensor role).
//! - [`llama`]: the FFI boundary — models, contexts, batches, samplers.
//! - [`chat`]: chat templates rendered with a Jinja engine, as llama.cpp's server does.
//! - [`prompt`]: messages or raw text → token ids.
//! - [`batch`]: continuous batching — many requests decoded together in one context, and embeddings.
//! - [`generate`]: the decode loop (stop strings, UTF-8, end of generation, timings).
//! - [`tiered`]: placement of tensors on GPU / RAM / STREAM and the streamer.
//! - [`hwprobe`]: `hypura profile` — measures CPU, RAM, GPUs and disk; caches the profile.
//! - [`synth`]: synthetic GGUF models for tests and benchmarks.
//! - [`tools`]: tool-call syntax per template family: detection, parsing, forcing grammars.
pub mod batch;
pub mod chat;
pub mod error;
pub mod generate;
pub mod gguf;
pub mod hwprobe;
pub mod inspect;
pub mod llama;
pub mod prompt;
pub mod synth;
pub mod test_models;
pub mod tiered;
pub mod tools;

pub use error::EngineError;
