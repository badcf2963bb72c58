//! Raw FFI to llama.cpp, ggml and gguf.
//!
//! The bindings come from `llama-cpp-sys-2` (pinned `=0.1.161`), which vendors
//! llama.cpp and builds it with CMake. This crate re-exports them so the rest
//! of hypura depends on one name, and is the place for the few declarations
//! bindgen does not generate there.
#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]

pub use llama_cpp_sys_2::*;
