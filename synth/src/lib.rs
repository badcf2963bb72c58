//! Synthetic GGUF models for tests and benchmarks, and the `hypura-synth` tool that writes
//! them. Written through llama.cpp's gguf API and ggml's quantizers (the engine's FFI
//! wrappers), so this crate builds llama.cpp.
//!
//! - `random.rs`: random valid weights in the shapes of real models ([`write`],
//!   [`write_sparse`]), and a real MoE derived from a dense model
//!   ([`derive_moe_from_dense`]).
//! - [`routing`]: routing profiles, MoEs whose expert choices have set
//!   statistics (popularity, overlap of consecutive tokens).
//! - `cached.rs`: those models written once and kept for later runs (the tests').
pub mod cached;
mod random;
pub mod routing;

pub use random::{
    derive_moe_from_dense, write, write_sparse, Arch, SynthError, SynthSpec, WriteReport,
    DERIVE_DEFAULT_EXPERTS, DERIVE_DEFAULT_PERTURB, DERIVE_DEFAULT_USED, ROUTING_KEY,
};
pub use routing::{Routing, RoutingProfile};
