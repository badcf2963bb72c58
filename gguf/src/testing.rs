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

/// Where SmolLM2 is, whether or not it is there.
pub fn smollm2_path() -> PathBuf {
    models_dir().join("SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// SmolLM2-135M-Instruct Q4_1 (llama architecture, GPT-2 BPE, ChatML).
pub fn smollm2() -> PathBuf {
    let path = smollm2_path();
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
    U32Arr(Vec<u32>),
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
    /// A small valid llama model with a GPT-2 BPE vocabulary: one layer, 32 wide, 4 heads
    /// of 8 (2 KV heads), FFN 64, 4 tokens; every tensor llama.cpp's llama loader wants.
    pub fn valid() -> Model {
        Model {
            version: 3,
            kv: vec![
                ("general.architecture".into(), s("llama")),
                ("general.name".into(), s("tiny")),
                ("llama.context_length".into(), V::U32(128)),
                ("llama.block_count".into(), V::U32(1)),
                ("llama.embedding_length".into(), V::U32(32)),
                ("llama.feed_forward_length".into(), V::U32(64)),
                ("llama.attention.head_count".into(), V::U32(4)),
                ("llama.attention.head_count_kv".into(), V::U32(2)),
                (
                    "llama.attention.layer_norm_rms_epsilon".into(),
                    V::F32(1e-5),
                ),
                ("llama.rope.freq_base".into(), V::F32(10_000.0)),
                ("llama.rope.dimension_count".into(), V::U32(8)),
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
                // The rest of layer 0, after the three above so their offsets stay put.
                t("blk.0.attn_q.weight", &[32, 32], 2),
                t("blk.0.attn_k.weight", &[32, 16], 2),
                t("blk.0.attn_v.weight", &[32, 16], 2),
                t("blk.0.attn_output.weight", &[32, 32], 2),
                t("blk.0.ffn_norm.weight", &[32], 0),
                t("blk.0.ffn_gate.weight", &[32, 64], 2),
                t("blk.0.ffn_down.weight", &[64, 32], 2),
                t("blk.0.ffn_up.weight", &[32, 64], 2),
            ],
            alignment: 32,
        }
    }

    /// [`Model::valid`] as a 4-expert MoE (2 used), with the expert tensors
    /// in place of the dense FFN.
    pub fn moe() -> Model {
        let mut model = Model::valid()
            .set("llama.expert_count", V::U32(4))
            .set("llama.expert_used_count", V::U32(2));
        let dense = [
            "blk.0.ffn_gate.weight",
            "blk.0.ffn_down.weight",
            "blk.0.ffn_up.weight",
        ];
        model.tensors.retain(|t| !dense.contains(&t.name.as_str()));
        model.tensors.extend([
            t("blk.0.ffn_gate_inp.weight", &[32, 4], 0),
            t("blk.0.ffn_gate_exps.weight", &[32, 64, 4], 2),
            t("blk.0.ffn_down_exps.weight", &[64, 32, 4], 2),
            t("blk.0.ffn_up_exps.weight", &[32, 64, 4], 2),
        ]);
        model
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

    /// The same model with vocabulary `tokens`: `token_embd` (and `output`, when there is
    /// one) resized to match; per-token arrays of another length are dropped.
    pub fn vocab(mut self, tokens: Vec<String>) -> Model {
        let n = tokens.len() as u64;
        for tensor in &mut self.tensors {
            if tensor.name == "token_embd.weight" || tensor.name == "output.weight" {
                tensor.dims[1] = n;
            }
        }
        self.kv.retain(|(k, v)| match v {
            V::I32Arr(a) if k.starts_with("tokenizer.ggml.") => a.len() as u64 == n,
            V::F32Arr(a) if k.starts_with("tokenizer.ggml.") => a.len() as u64 == n,
            _ => true,
        });
        self.set("tokenizer.ggml.tokens", V::StrArr(tokens))
    }

    /// A tensor by name, to change its shape or type.
    pub fn tensor_mut(&mut self, name: &str) -> &mut T {
        self.tensors
            .iter_mut()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("no tensor {name}"))
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
            let end = offset.saturating_add(size);
            next = end.saturating_add(self.alignment - 1) / self.alignment * self.alignment;
            // Absurd shapes (the reader must refuse them) get no data.
            if end < 1 << 32 {
                data_end = data_end.max(end);
            }
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
    let n = tensor.dims.iter().fold(1u64, |n, &d| n.saturating_mul(d));
    (n / ty.0).saturating_mul(ty.1)
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
        V::U32Arr(items) => {
            put_array_header(out, T_U32, items.len());
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

/// The bytes of `file` (read from `bytes`, its whole content) with its metadata replaced by
/// `metadata`: the tensor table and the tensor data are kept as they are, so only the values
/// change. For mutation tests of real models.
pub fn rewrite(file: &GgufFile, bytes: &[u8], metadata: &[(String, GgufValue)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len());
    out.extend_from_slice(b"GGUF");
    out.extend_from_slice(&file.version.to_le_bytes());
    out.extend_from_slice(&(file.tensors.len() as u64).to_le_bytes());
    out.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata {
        put_str(&mut out, key);
        out.extend_from_slice(&value_type(value).to_le_bytes());
        put_gguf_value(&mut out, value);
    }
    for (tensor, &offset) in file.tensors.iter().zip(&file.relative_offsets) {
        put_str(&mut out, &tensor.name);
        out.extend_from_slice(&(tensor.dims.len() as u32).to_le_bytes());
        for d in &tensor.dims {
            out.extend_from_slice(&d.to_le_bytes());
        }
        out.extend_from_slice(&tensor.ggml_type.to_le_bytes());
        out.extend_from_slice(&offset.to_le_bytes());
    }
    if !file.tensors.is_empty() {
        // The alignment the new metadata states, else the default.
        let alignment = metadata
            .iter()
            .find(|(k, _)| k == "general.alignment")
            .and_then(|(_, v)| v.as_u64())
            .filter(|a| a.is_power_of_two())
            .unwrap_or(DEFAULT_ALIGNMENT)
            .min(1 << 20); // an absurd one (fuzzing) gets no padding worth the memory
        out.resize((out.len() as u64).next_multiple_of(alignment) as usize, 0);
        let data = usize::try_from(file.data_offset)
            .ok()
            .and_then(|at| bytes.get(at..))
            .unwrap_or(&[]);
        out.extend_from_slice(data);
    }
    out
}

fn value_type(value: &GgufValue) -> u32 {
    match value {
        GgufValue::U8(_) => T_U8,
        GgufValue::I8(_) => T_I8,
        GgufValue::U16(_) => T_U16,
        GgufValue::I16(_) => T_I16,
        GgufValue::U32(_) => T_U32,
        GgufValue::I32(_) => T_I32,
        GgufValue::F32(_) => T_F32,
        GgufValue::Bool(_) => T_BOOL,
        GgufValue::String(_) => T_STRING,
        GgufValue::U64(_) => T_U64,
        GgufValue::I64(_) => T_I64,
        GgufValue::F64(_) => T_F64,
        GgufValue::Array(_) => T_ARRAY,
    }
}

/// A value's bytes after its type id.
fn put_gguf_value(out: &mut Vec<u8>, value: &GgufValue) {
    fn each<T: Copy, const N: usize>(out: &mut Vec<u8>, ty: u32, items: &[T], f: fn(T) -> [u8; N]) {
        out.extend_from_slice(&ty.to_le_bytes());
        out.extend_from_slice(&(items.len() as u64).to_le_bytes());
        items.iter().for_each(|&i| out.extend_from_slice(&f(i)));
    }
    let put_bytes = |out: &mut Vec<u8>, b: &[u8]| {
        out.extend_from_slice(&(b.len() as u64).to_le_bytes());
        out.extend_from_slice(b);
    };
    match value {
        GgufValue::U8(v) => out.push(*v),
        GgufValue::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::Bool(v) => out.push(u8::from(*v)),
        GgufValue::String(v) => put_bytes(out, v.as_bytes()),
        GgufValue::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::Array(array) => match array {
            GgufArray::U8(a) => each(out, T_U8, a, |v: u8| [v]),
            GgufArray::I8(a) => each(out, T_I8, a, i8::to_le_bytes),
            GgufArray::U16(a) => each(out, T_U16, a, u16::to_le_bytes),
            GgufArray::I16(a) => each(out, T_I16, a, i16::to_le_bytes),
            GgufArray::U32(a) => each(out, T_U32, a, u32::to_le_bytes),
            GgufArray::I32(a) => each(out, T_I32, a, i32::to_le_bytes),
            GgufArray::F32(a) => each(out, T_F32, a, f32::to_le_bytes),
            GgufArray::Bool(a) => each(out, T_BOOL, a, |v: bool| [u8::from(v)]),
            GgufArray::U64(a) => each(out, T_U64, a, u64::to_le_bytes),
            GgufArray::I64(a) => each(out, T_I64, a, i64::to_le_bytes),
            GgufArray::F64(a) => each(out, T_F64, a, f64::to_le_bytes),
            GgufArray::String(a) => {
                out.extend_from_slice(&T_STRING.to_le_bytes());
                out.extend_from_slice(&(a.len() as u64).to_le_bytes());
                a.iter().for_each(|s| put_bytes(out, s.as_bytes()));
            }
        },
    }
}
