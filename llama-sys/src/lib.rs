//! Raw FFI to llama.cpp, ggml and gguf.
//!
//! The bindings come from `llama-cpp-sys-2` (pinned `=0.1.161`), which vendors
//! llama.cpp and builds it with CMake. This crate re-exports them so the rest
//! of hypura depends on one name, and adds what bindgen does not generate
//! there: [`buffer_type`], the mirror of ggml's internal buffer interfaces.
#![allow(non_camel_case_types, non_upper_case_globals, non_snake_case)]

pub mod buffer_type;

pub use llama_cpp_sys_2::*;
