//! hypura's placement and budget policy: pure Rust, no FFI.
//!
//! Everything here is unit-testable with synthetic inputs: it decides where each tensor of
//! each model lives (GPU, RAM, or streamed from NVMe) but never touches a model itself.
//!
//! - [`roles`]: what a tensor does (attention, norm, experts, ...), judged from its name.
//! - [`size`]: byte sizes as people write them (`512MiB`, `8GiB`).
//! - [`profile`]: the measured hardware profile the planner reads.
//! - [`plan`]: the placement planner (tier per tensor, mode, cache sizes, predicted speed):
//!   [`plan::plan`] is the one function every placement comes from.
//! - [`gpu`]: the GPU tier by rule (`-ngl N`, a byte budget) and llama.cpp's `n_gpu_layers`.
//! - [`cost`]: the decode cost model the planner prices plans with.
//! - [`popularity`]: how unevenly a model's router chose its experts, as measured.
//! - [`reads`]: how fast a model's streamer read its file on this machine, as measured.
//! - [`budget`]: one memory budget across models: admission, promotion, demotion.

pub mod budget;
pub mod cost;
pub mod gpu;
pub mod plan;
pub mod popularity;
pub mod profile;
pub mod reads;
pub mod roles;
pub mod size;
