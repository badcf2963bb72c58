//! hypura's placement and budget policy: pure Rust, no FFI.
//!
//! Everything here is unit-testable with synthetic inputs: it decides where each tensor of
//! each model lives (GPU, RAM, or streamed from NVMe) but never touches a model itself.
//!
//! - [`roles`]: what a tensor does (attention, norm, experts, ...), judged from its name.
//! - [`size`]: byte sizes as people write them (`512MiB`, `8GiB`).

pub mod roles;
pub mod size;
