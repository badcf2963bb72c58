//! Fixtures for tests, here and in the crates above (feature `testing`): the test models'
//! paths, and [`Model`], a builder of GGUF bytes — a header exactly as written, including
//! the malformed ones a validator must refuse — with [`TempFile`] to put them on disk.
use std::path::PathBuf;

use crate::paths;
use crate::reader::*;

/// Folder holding the test models fetched by `scripts/fetch-models.sh`:
/// `$HYPURA_MODELS_DIR`, else `models/` at the workspace root.
///
/// Tests that need a real model fail with a clear message when it is missing: CI fetches
/// the models first, so a missing file is a setup error, never a reason to skip.
pub fn models_dir() -> PathBuf {
    paths::models_dir_override()
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models"))
}

/// SmolLM2-135M-Instruct Q4_1 (llama architecture, GPT-2 BPE, ChatML).
pub fn smollm2() -> PathBuf {
    let path = models_dir().join("SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        path.is_file(),
        "{} is missing: run scripts/fetch-models.sh first",
        path.display()
    );
    path
}

use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Clone)]
pub enum V {
    U8(u8),
    U32(u32),
    I32(i32),
    U64(u64),
    F32(f32),
    Bool(bool),
    Str(String),
    StrArr(Vec<String>),
    I32Arr(Vec<i32>),
    F32Arr(Vec<f32>),
    /// An array whose element type is an array (ggml rejects these).
    NestedArr,
}

pub fn s(text: &str) -> V {
    V::Str(text.to_string())
}

pub fn strs<I: IntoIterator<Item = S>, S: Into<String>>(items: I) -> V {
    V::StrArr(items.into_iter().map(Into::into).collect())
}

#[derive(Clone)]
pub struct T {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: u32,
    /// `None`: packed after the previous tensor, as a well-formed file does.
    pub offset: Option<u64>,
}

pub fn t(name: &str, dims: &[u64], ggml_type: u32) -> T {
    T {
        name: name.into(),
        dims: dims.to_vec(),
        ggml_type,
        offset: None,
    }
}

#[derive(Clone)]
pub struct Model {
    pub version: u32,
    pub kv: Vec<(String, V)>,
    pub tensors: Vec<T>,
    pub alignment: u64,
}

impl Model {
    /// A small valid llama model with a GPT-2 BPE vocabulary.
    pub fn valid() -> Model {
        Model {
            version: 3,
            kv: vec![
                ("general.architecture".into(), s("llama")),
                ("general.name".into(), s("tiny")),
                ("llama.context_length".into(), V::U32(128)),
                ("llama.block_count".into(), V::U32(1)),
                ("tokenizer.ggml.model".into(), s("gpt2")),
                (
                    "tokenizer.ggml.tokens".into(),
                    strs(["a", "b", "ab", "<|end|>"]),
                ),
                (
                    "tokenizer.ggml.token_type".into(),
                    V::I32Arr(vec![1, 1, 1, 3]),
                ),
                ("tokenizer.ggml.merges".into(), strs(["a b"])),
                ("tokenizer.ggml.bos_token_id".into(), V::U32(3)),
                ("tokenizer.ggml.eos_token_id".into(), V::U32(3)),
            ],
            tensors: vec![
                t("token_embd.weight", &[32, 4], 2), // q4_0
                t("blk.0.attn_norm.weight", &[32], 0),
                t("output_norm.weight", &[32], 0),
            ],
            alignment: 32,
        }
    }

    pub fn set(mut self, key: &str, value: V) -> Model {
        match self.kv.iter_mut().find(|(k, _)| k == key) {
            Some(kv) => kv.1 = value,
            None => self.kv.push((key.into(), value)),
        }
        self
    }

    pub fn remove(mut self, key: &str) -> Model {
        self.kv.retain(|(k, _)| k != key);
        self
    }

    pub fn bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kv.len() as u64).to_le_bytes());
        for (key, value) in &self.kv {
            put_str(&mut out, key);
            put_value(&mut out, value);
        }
        let mut next = 0u64;
        let mut data_end = 0u64;
        for tensor in &self.tensors {
            put_str(&mut out, &tensor.name);
            out.extend_from_slice(&(tensor.dims.len() as u32).to_le_bytes());
            for d in &tensor.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&tensor.ggml_type.to_le_bytes());
            let offset = tensor.offset.unwrap_or(next);
            out.extend_from_slice(&offset.to_le_bytes());
            let size = test_size(tensor);
            next = (offset + size).next_multiple_of(self.alignment);
            data_end = data_end.max(offset + size);
        }
        if !self.tensors.is_empty() {
            out.resize(
                (out.len() as u64).next_multiple_of(self.alignment) as usize,
                0,
            );
        }
        out.resize(out.len() + data_end as usize, 0x5a);
        out
    }
}

fn test_size(tensor: &T) -> u64 {
    let ty = ggml_type(tensor.ggml_type).map_or((1, 1), |t| (t.block_size, t.bytes_per_block));
    tensor.dims.iter().product::<u64>() / ty.0 * ty.1
}

pub fn put_str(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(&(text.len() as u64).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
}

fn put_value(out: &mut Vec<u8>, value: &V) {
    let mut typed = |ty: u32, bytes: &[u8]| {
        out.extend_from_slice(&ty.to_le_bytes());
        out.extend_from_slice(bytes);
    };
    match value {
        V::U8(v) => typed(T_U8, &[*v]),
        V::U32(v) => typed(T_U32, &v.to_le_bytes()),
        V::I32(v) => typed(T_I32, &v.to_le_bytes()),
        V::U64(v) => typed(T_U64, &v.to_le_bytes()),
        V::F32(v) => typed(T_F32, &v.to_le_bytes()),
        V::Bool(v) => typed(T_BOOL, &[u8::from(*v)]),
        V::Str(v) => {
            typed(T_STRING, &[]);
            put_str(out, v);
        }
        V::StrArr(items) => {
            put_array_header(out, T_STRING, items.len());
            for item in items {
                put_str(out, item);
            }
        }
        V::I32Arr(items) => {
            put_array_header(out, T_I32, items.len());
            items
                .iter()
                .for_each(|i| out.extend_from_slice(&i.to_le_bytes()));
        }
        V::F32Arr(items) => {
            put_array_header(out, T_F32, items.len());
            items
                .iter()
                .for_each(|i| out.extend_from_slice(&i.to_le_bytes()));
        }
        V::NestedArr => {
            put_array_header(out, T_ARRAY, 1);
            put_array_header(out, T_U8, 0);
        }
    }
}

pub fn put_array_header(out: &mut Vec<u8>, element_type: u32, len: usize) {
    out.extend_from_slice(&T_ARRAY.to_le_bytes());
    out.extend_from_slice(&element_type.to_le_bytes());
    out.extend_from_slice(&(len as u64).to_le_bytes());
}

/// A file in the temp dir, removed on drop.
pub struct TempFile(pub PathBuf);

impl TempFile {
    pub fn new(bytes: &[u8]) -> TempFile {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("hypura-gguf-test-{}-{n}.gguf", std::process::id()));
        std::fs::write(&path, bytes).expect("write temp file");
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl Model {
    /// Writes the model to a temporary file and opens it (the file is gone afterwards;
    /// a `GgufFile` keeps nothing open).
    pub fn open(&self) -> Result<GgufFile, GgufError> {
        let file = TempFile::new(&self.bytes());
        GgufFile::open(&file.0)
    }
}
