//! GGUF model files in safe Rust, without llama.cpp: read them, check them before llama.cpp
//! sees them, and report what they hold.
//!
//! - [`reader`]: [`GgufFile`] — the header, metadata and tensor infos of a file, read with
//!   hard limits (the file is untrusted input); the types of values and tensors.
//! - [`validate`]: [`GgufFile::validate`], which refuses what would make llama.cpp fail or
//!   abort later: the rules of [`validate::RULES`], each naming the llama.cpp code it mirrors.
//! - [`inspect`]: what a model file holds (architecture, parameters, bytes per tensor role).
//! - [`paths`]: where model files and hypura's caches live (`HYPURA_MODELS_DIR`,
//!   `HYPURA_CACHE_DIR`).
//! - [`testing`] (feature `testing`): the test models' paths and a GGUF byte builder.
pub mod inspect;
pub mod paths;
pub mod reader;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod validate;

pub use reader::{GgufArray, GgufError, GgufFile, GgufString, GgufValue, TensorInfo};
