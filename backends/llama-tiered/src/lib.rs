//! hypura's engine: llama.cpp with tiered weights.
//!
//! - [`gguf`]: reads and validates GGUF files in safe Rust, before llama.cpp sees them.
//! - [`inspect`]: what a model file holds (architecture, parameters, bytes per tensor role).
//! - [`llama`]: the FFI boundary — models, contexts, batches, samplers.
//! - [`chat`]: chat templates rendered with a Jinja engine, as llama.cpp's server does.
//! - [`prompt`]: messages or raw text → token ids.
//! - [`generate`]: the decode loop (stop strings, UTF-8, end of generation, timings).
//! - [`synth`]: synthetic GGUF models for tests and benchmarks.
pub mod chat;
pub mod error;
pub mod generate;
pub mod gguf;
pub mod inspect;
pub mod llama;
pub mod prompt;
pub mod synth;
pub mod test_models;

pub use error::EngineError;
