//! Mutated model files through `hypura run`: some 400 copies of a tiny synthetic llama and a
//! tiny Mixtral (about 1 MiB each), with hyperparameters set to the values llama.cpp asserts
//! on, tokenizers it aborts on, and random mutations of the header, the metadata values and
//! the tensor data. Each runs as `hypura run FILE --prompt hi --max-tokens 1`; none may die by
//! a signal (a `GGML_ASSERT`'s SIGABRT, SIGSEGV, SIGFPE) or panic: it answers, or exits with a
//! clean error. Every file hypura's validator refuses must be refused by `run` too.
//!
//! The same corpus through `hypura serve`: every request to each is answered (a reply or an
//! error naming no file) within a deadline, and the server lives through all of them.
//!
//! The corpus is generated here, never stored: targeted edits of the metadata (values, types,
//! tokenizers, chat templates that fail, loop, grow or recurse), of the tensor table (types per
//! role and unknown ids, dimensions, offsets, missing, doubled or unknown tensors), of the
//! header's fields and counts, metadata type ids and array counts, cuts at each section, and
//! random mutations from a fixed seed.
//!
//! Prints a summary: per outcome (validator rule, llama.cpp refusal, answered) the count.
#[path = "../common/mod.rs"]
mod common;

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hypura_gguf::testing::rewrite;
use hypura_gguf::{GgufArray, GgufFile, GgufString, GgufValue};
use hypura_synth::SynthSpec;
use llama_tiered::llama::gguf_write::GgmlType;
use llama_tiered::rng::Rng;

/// Random mutations on top of the targeted ones.
const RANDOM_CASES: usize = 200;
/// Processes at once.
const WORKERS: usize = 2;
/// Longest one `hypura run` may take before it counts as hung.
const RUN_LIMIT: Duration = Duration::from_secs(60);

struct Base {
    name: &'static str,
    bytes: Vec<u8>,
    file: GgufFile,
}

impl Base {
    fn write(dir: &Path, name: &'static str, spec: SynthSpec) -> Base {
        let path = dir.join(format!("{name}.gguf"));
        hypura_synth::write(&spec.with_weight_type(GgmlType::Q8_0), &path).expect("synth");
        let bytes = std::fs::read(&path).unwrap();
        let file = GgufFile::open_validated(&path).expect("the base model is valid");
        Base { name, bytes, file }
    }

    fn metadata(&self) -> Vec<(String, GgufValue)> {
        self.file
            .metadata()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }
}

/// One mutated file to run.
struct Case {
    name: String,
    bytes: Vec<u8>,
}

type Edit = Box<dyn Fn(&mut Vec<(String, GgufValue)>)>;

fn set(key: &str, value: GgufValue) -> Edit {
    let key = key.to_string();
    Box::new(move |meta| match meta.iter_mut().find(|(k, _)| *k == key) {
        Some(kv) => kv.1 = value.clone(),
        None => meta.push((key.clone(), value.clone())),
    })
}

fn remove(key: &str) -> Edit {
    let key = key.to_string();
    Box::new(move |meta| meta.retain(|(k, _)| *k != key))
}

fn both(a: Edit, b: Edit) -> Edit {
    Box::new(move |meta| {
        a(meta);
        b(meta);
    })
}

fn u32v(v: u32) -> GgufValue {
    GgufValue::U32(v)
}

fn f32v(v: f32) -> GgufValue {
    GgufValue::F32(v)
}

fn text(v: &str) -> GgufValue {
    GgufValue::String(GgufString::from(v))
}

fn u32s(v: &[u32]) -> GgufValue {
    GgufValue::Array(GgufArray::U32(v.to_vec()))
}

/// The metadata edits aimed at the validator's rules (and at values it lets through that
/// llama.cpp might still trip on), for the dense base (`llama.*` keys).
fn dense_edits() -> Vec<(&'static str, Edit)> {
    vec![
        ("block_count=0", set("llama.block_count", u32v(0))),
        ("block_count=513", set("llama.block_count", u32v(513))),
        (
            "block_count=3 (more than the tensors)",
            set("llama.block_count", u32v(3)),
        ),
        (
            "block_count=1 (fewer than the tensors)",
            set("llama.block_count", u32v(1)),
        ),
        (
            "block_count as u64",
            set("llama.block_count", GgufValue::U64(2)),
        ),
        ("context_length=0", set("llama.context_length", u32v(0))),
        ("context_length=1", set("llama.context_length", u32v(1))),
        ("context_length missing", remove("llama.context_length")),
        ("embedding_length=0", set("llama.embedding_length", u32v(0))),
        (
            "embedding_length=128",
            set("llama.embedding_length", u32v(128)),
        ),
        (
            "feed_forward_length=0",
            set("llama.feed_forward_length", u32v(0)),
        ),
        (
            "feed_forward_length=100",
            set("llama.feed_forward_length", u32v(100)),
        ),
        (
            "feed_forward_length per layer",
            set("llama.feed_forward_length", u32s(&[512, 512])),
        ),
        (
            "feed_forward_length 3 layers",
            set("llama.feed_forward_length", u32s(&[512; 3])),
        ),
        ("head_count=0", set("llama.attention.head_count", u32v(0))),
        ("head_count=3", set("llama.attention.head_count", u32v(3))),
        ("head_count=8", set("llama.attention.head_count", u32v(8))),
        (
            "head_count per layer 4,0",
            set("llama.attention.head_count", u32s(&[4, 0])),
        ),
        (
            "head_count_kv=0",
            set("llama.attention.head_count_kv", u32v(0)),
        ),
        (
            "head_count_kv=3",
            set("llama.attention.head_count_kv", u32v(3)),
        ),
        (
            "head_count_kv=1",
            set("llama.attention.head_count_kv", u32v(1)),
        ),
        (
            "head_count_kv=4",
            set("llama.attention.head_count_kv", u32v(4)),
        ),
        (
            "head_count_kv per layer 2,0",
            set("llama.attention.head_count_kv", u32s(&[2, 0])),
        ),
        ("key_length=32", set("llama.attention.key_length", u32v(32))),
        (
            "value_length=32",
            set("llama.attention.value_length", u32v(32)),
        ),
        (
            "rope.dimension_count=0",
            set("llama.rope.dimension_count", u32v(0)),
        ),
        (
            "rope.dimension_count=7",
            set("llama.rope.dimension_count", u32v(7)),
        ),
        (
            "rope.dimension_count=128",
            set("llama.rope.dimension_count", u32v(128)),
        ),
        (
            "rope.dimension_count=32",
            set("llama.rope.dimension_count", u32v(32)),
        ),
        (
            "rms_eps=NaN",
            set("llama.attention.layer_norm_rms_epsilon", f32v(f32::NAN)),
        ),
        (
            "rms_eps=-1",
            set("llama.attention.layer_norm_rms_epsilon", f32v(-1.0)),
        ),
        (
            "rms_eps=inf",
            set(
                "llama.attention.layer_norm_rms_epsilon",
                f32v(f32::INFINITY),
            ),
        ),
        (
            "rms_eps=0",
            set("llama.attention.layer_norm_rms_epsilon", f32v(0.0)),
        ),
        (
            "rms_eps missing",
            remove("llama.attention.layer_norm_rms_epsilon"),
        ),
        (
            "rms_eps as f64",
            set(
                "llama.attention.layer_norm_rms_epsilon",
                GgufValue::F64(1e-5),
            ),
        ),
        ("freq_base=NaN", set("llama.rope.freq_base", f32v(f32::NAN))),
        ("freq_base=0", set("llama.rope.freq_base", f32v(0.0))),
        ("freq_base=-1", set("llama.rope.freq_base", f32v(-1.0))),
        (
            "freq_base=inf",
            set("llama.rope.freq_base", f32v(f32::INFINITY)),
        ),
        ("freq_base=1e-30", set("llama.rope.freq_base", f32v(1e-30))),
        (
            "rope.scaling.type=bogus",
            set("llama.rope.scaling.type", text("bogus")),
        ),
        (
            "rope.scaling.type=yarn",
            set("llama.rope.scaling.type", text("yarn")),
        ),
        (
            "rope.scaling.factor=-1",
            set("llama.rope.scaling.factor", f32v(-1.0)),
        ),
        (
            "rope.scaling.factor=NaN",
            set("llama.rope.scaling.factor", f32v(f32::NAN)),
        ),
        (
            "rope.scaling.factor=1e30",
            set("llama.rope.scaling.factor", f32v(1e30)),
        ),
        ("tokenizer none", set("tokenizer.ggml.model", text("none"))),
        (
            "tokenizer no_vocab",
            set("tokenizer.ggml.model", text("no_vocab")),
        ),
        (
            "tokenizer klingon",
            set("tokenizer.ggml.model", text("klingon")),
        ),
        (
            "tokenizer gpt2 without merges",
            set("tokenizer.ggml.model", text("gpt2")),
        ),
        ("tokenizer bert", set("tokenizer.ggml.model", text("bert"))),
        ("tokenizer t5", set("tokenizer.ggml.model", text("t5"))),
        ("tokenizer rwkv", set("tokenizer.ggml.model", text("rwkv"))),
        ("tokens missing", remove("tokenizer.ggml.tokens")),
        (
            "tokens empty",
            set(
                "tokenizer.ggml.tokens",
                GgufValue::Array(GgufArray::String(vec![])),
            ),
        ),
        (
            "scores short",
            set(
                "tokenizer.ggml.scores",
                GgufValue::Array(GgufArray::F32(vec![0.0; 3])),
            ),
        ),
        (
            "token_type short",
            set(
                "tokenizer.ggml.token_type",
                GgufValue::Array(GgufArray::I32(vec![1; 3])),
            ),
        ),
        (
            "token_type as f32",
            set(
                "tokenizer.ggml.token_type",
                GgufValue::Array(GgufArray::F32(vec![1.0; 1024])),
            ),
        ),
        (
            "bos_token_id=100000",
            set("tokenizer.ggml.bos_token_id", u32v(100_000)),
        ),
        (
            "eos_token_id=100000",
            set("tokenizer.ggml.eos_token_id", u32v(100_000)),
        ),
        (
            "bos_token_id as i32",
            set("tokenizer.ggml.bos_token_id", GgufValue::I32(1)),
        ),
        (
            "add_bos without bos id, vocab default 1",
            remove("tokenizer.ggml.bos_token_id"),
        ),
        (
            "unknown_token_id=5000",
            set("tokenizer.ggml.unknown_token_id", u32v(5000)),
        ),
        (
            "architecture unknown",
            set("general.architecture", text("nope")),
        ),
        (
            "architecture qwen2 with llama keys",
            set("general.architecture", text("qwen2")),
        ),
        ("alignment=0", set("general.alignment", u32v(0))),
        ("alignment=48", set("general.alignment", u32v(48))),
        ("alignment=64", set("general.alignment", u32v(64))),
        (
            "expert_count=4 on a dense model",
            set("llama.expert_count", u32v(4)),
        ),
        (
            "expert_used_count=2 on a dense model",
            set("llama.expert_used_count", u32v(2)),
        ),
        (
            "nextn_predict_layers=5",
            set("llama.nextn_predict_layers", u32v(5)),
        ),
        ("vocab_size=1", set("llama.vocab_size", u32v(1))),
        (
            "chat template broken",
            set("tokenizer.chat_template", text("{% for %}")),
        ),
        (
            "chat template empty",
            set("tokenizer.chat_template", text("")),
        ),
        (
            "head_count=8, head_count_kv=4 (same widths)",
            both(
                set("llama.attention.head_count", u32v(8)),
                set("llama.attention.head_count_kv", u32v(4)),
            ),
        ),
    ]
}

/// Edits for the Mixtral base.
fn moe_edits() -> Vec<(&'static str, Edit)> {
    vec![
        ("expert_count=1025", set("llama.expert_count", u32v(1025))),
        ("expert_count=3", set("llama.expert_count", u32v(3))),
        ("expert_count=0", set("llama.expert_count", u32v(0))),
        ("expert_count missing", remove("llama.expert_count")),
        (
            "expert_used_count=0",
            set("llama.expert_used_count", u32v(0)),
        ),
        (
            "expert_used_count=5",
            set("llama.expert_used_count", u32v(5)),
        ),
        (
            "expert_used_count=4",
            set("llama.expert_used_count", u32v(4)),
        ),
        (
            "expert_used_count=1",
            set("llama.expert_used_count", u32v(1)),
        ),
        (
            "expert_used_count missing",
            remove("llama.expert_used_count"),
        ),
        (
            "expert_used_count per layer 2,0",
            set("llama.expert_used_count", u32s(&[2, 0])),
        ),
        (
            "expert_group_count=4",
            set("llama.expert_group_count", u32v(4)),
        ),
        (
            "expert_group_count=2, none used",
            set("llama.expert_group_count", u32v(2)),
        ),
        (
            "expert_group_count=2, 1 used",
            both(
                set("llama.expert_group_count", u32v(2)),
                set("llama.expert_group_used_count", u32v(1)),
            ),
        ),
        ("block_count=0", set("llama.block_count", u32v(0))),
        (
            "rms_eps=NaN",
            set("llama.attention.layer_norm_rms_epsilon", f32v(f32::NAN)),
        ),
    ]
}

/// A tensor's entry in the table, as the file writes it.
#[derive(Clone)]
struct Entry {
    name: String,
    dims: Vec<u64>,
    ggml_type: u32,
    /// From the start of the data section.
    offset: u64,
}

type TableEdit = Box<dyn Fn(&mut Vec<Entry>)>;
type DimsEdit = Box<dyn Fn(&mut Vec<u64>)>;

fn entries(file: &GgufFile) -> Vec<Entry> {
    file.tensors()
        .iter()
        .map(|t| Entry {
            name: t.name.clone(),
            dims: t.dims.clone(),
            ggml_type: t.ggml_type,
            offset: t.offset_in_file - file.data_offset(),
        })
        .collect()
}

fn put_string(out: &mut Vec<u8>, text: &str) {
    out.extend_from_slice(&(text.len() as u64).to_le_bytes());
    out.extend_from_slice(text.as_bytes());
}

impl Base {
    /// Where the tensor table starts: the last copy of the first tensor's
    /// name (as a GGUF string) before the data.
    fn table_start(&self) -> usize {
        let mut needle = Vec::new();
        put_string(&mut needle, &self.file.tensors()[0].name);
        let data_offset = self.file.data_offset() as usize;
        self.bytes[..data_offset]
            .windows(needle.len())
            .rposition(|w| w == needle)
            .expect("the tensor table")
    }

    /// The file with its tensor table replaced by `table` (the header
    /// counting `count` tensors, else the table's), the data kept.
    fn with_table(&self, table: &[Entry], count: Option<u64>) -> Vec<u8> {
        let mut out = self.bytes[..self.table_start()].to_vec();
        let count = count.unwrap_or(table.len() as u64);
        out[8..16].copy_from_slice(&count.to_le_bytes());
        for entry in table {
            put_string(&mut out, &entry.name);
            out.extend_from_slice(&(entry.dims.len() as u32).to_le_bytes());
            for d in &entry.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&entry.ggml_type.to_le_bytes());
            out.extend_from_slice(&entry.offset.to_le_bytes());
        }
        out.resize(out.len().next_multiple_of(32), 0);
        out.extend_from_slice(&self.bytes[self.file.data_offset() as usize..]);
        out
    }

    /// Where the value of metadata `key` starts (its type id).
    fn value_at(&self, key: &str) -> usize {
        let mut needle = Vec::new();
        put_string(&mut needle, key);
        let at = self
            .bytes
            .windows(needle.len())
            .position(|w| w == needle)
            .unwrap_or_else(|| panic!("no {key}"));
        at + needle.len()
    }

    /// The file with `bytes` written at `at`.
    fn patched(&self, at: usize, bytes: &[u8]) -> Vec<u8> {
        let mut out = self.bytes.clone();
        out[at..at + bytes.len()].copy_from_slice(bytes);
        out
    }
}

fn on(name: &'static str, edit: impl Fn(&mut Entry) + 'static) -> TableEdit {
    Box::new(move |table| {
        let entry = table
            .iter_mut()
            .find(|e| e.name == name)
            .unwrap_or_else(|| panic!("no tensor {name}"));
        edit(entry);
    })
}

/// Edits of the dense base's tensor table: types llama.cpp refuses or
/// aborts on for the tensor's role, unknown type ids, dimensions that do
/// not match the hyperparameters or overflow, offsets out of the file,
/// misaligned or overlapping, tensors missing, doubled or unknown.
fn table_edits() -> Vec<(String, TableEdit)> {
    let mut edits: Vec<(String, TableEdit)> = Vec::new();
    for ty in [1u32, 2, 8, 12, 30, 39, 40, 41, 1000, u32::MAX] {
        edits.push((
            format!("output_norm.weight type {ty}"),
            on("output_norm.weight", move |e| e.ggml_type = ty),
        ));
    }
    for ty in [0u32, 1, 6, 12, 14, 16, 23] {
        edits.push((
            format!("blk.0.attn_q.weight type {ty}"),
            on("blk.0.attn_q.weight", move |e| e.ggml_type = ty),
        ));
    }
    let dims: [(&str, &str, DimsEdit); 9] = [
        ("token_embd.weight", "swapped", Box::new(|d| d.reverse())),
        ("token_embd.weight", "rows 0", Box::new(|d| d[1] = 0)),
        ("token_embd.weight", "rows +1", Box::new(|d| d[1] += 1)),
        ("blk.0.ffn_up.weight", "row x2", Box::new(|d| d[0] *= 2)),
        ("blk.0.ffn_down.weight", "3 dims", Box::new(|d| d.push(2))),
        (
            "output_norm.weight",
            "5 dims",
            Box::new(|d| d.extend([1; 4])),
        ),
        ("output_norm.weight", "no dims", Box::new(|d| d.clear())),
        ("output_norm.weight", "2^40", Box::new(|d| d[0] = 1 << 40)),
        (
            "blk.0.attn_k.weight",
            "2^32 x 2^32",
            Box::new(|d| {
                d[0] = 1 << 32;
                d[1] = 1 << 32;
            }),
        ),
    ];
    for (name, what, edit) in dims {
        edits.push((
            format!("{name} dims {what}"),
            Box::new(move |table: &mut Vec<Entry>| {
                let entry = table.iter_mut().find(|e| e.name == name).unwrap();
                edit(&mut entry.dims);
            }),
        ));
    }
    let offsets: [(&str, TableEdit); 6] = [
        (
            "output_norm offset u64::MAX",
            on("output_norm.weight", |e| e.offset = u64::MAX),
        ),
        (
            "output_norm offset 2^40",
            on("output_norm.weight", |e| e.offset = 1 << 40),
        ),
        (
            "output_norm offset misaligned",
            on("output_norm.weight", |e| e.offset += 1),
        ),
        (
            "last tensor past the end",
            Box::new(|t| {
                let last = t.iter_mut().max_by_key(|e| e.offset).unwrap();
                last.offset += 1 << 20;
            }),
        ),
        (
            "two tensors at one offset",
            Box::new(|t| {
                let first = t[0].offset;
                t[1].offset = first;
            }),
        ),
        (
            "every offset 0",
            Box::new(|t| t.iter_mut().for_each(|e| e.offset = 0)),
        ),
    ];
    for (what, edit) in offsets {
        edits.push((what.to_string(), edit));
    }
    let tables: [(&str, TableEdit); 6] = [
        (
            "output_norm.weight missing",
            Box::new(|t| t.retain(|e| e.name != "output_norm.weight")),
        ),
        (
            "blk.1 missing",
            Box::new(|t| t.retain(|e| !e.name.starts_with("blk.1."))),
        ),
        (
            "blk.0.attn_q.weight twice",
            Box::new(|t| {
                let copy = t.iter().find(|e| e.name == "blk.0.attn_q.weight").cloned();
                t.extend(copy);
            }),
        ),
        (
            "an unknown tensor",
            Box::new(|t| {
                let mut extra = t[0].clone();
                extra.name = "blk.0.bogus.weight".into();
                t.push(extra);
            }),
        ),
        (
            "an empty name",
            on("output_norm.weight", |e| e.name.clear()),
        ),
        (
            "a 64 KiB name",
            on("output_norm.weight", |e| e.name = "n".repeat(1 << 16)),
        ),
    ];
    for (what, edit) in tables {
        edits.push((what.to_string(), edit));
    }
    edits
}

/// Byte-level edits of the dense base: the header's fields, metadata type
/// ids and counts, strings longer than the file, and the file cut at each
/// section.
fn byte_cases(base: &Base) -> Vec<(String, Vec<u8>)> {
    let mut cases = Vec::new();
    for version in [0u32, 1, 2, 4, u32::MAX] {
        cases.push((
            format!("version {version}"),
            base.patched(4, &version.to_le_bytes()),
        ));
    }
    cases.push(("magic GGUG".into(), base.patched(0, b"GGUG")));
    let tensors = base.file.tensors().len() as u64;
    let keys = base.file.metadata().count() as u64;
    for (what, at, n) in [
        ("tensor count +1", 8, tensors + 1),
        ("tensor count -1", 8, tensors - 1),
        ("tensor count 0", 8, 0),
        ("tensor count u64::MAX", 8, u64::MAX),
        ("key count +1", 16, keys + 1),
        ("key count -1", 16, keys - 1),
        ("key count u64::MAX", 16, u64::MAX),
    ] {
        cases.push((what.to_string(), base.patched(at, &n.to_le_bytes())));
    }
    let block_count = base.value_at("llama.block_count");
    for ty in [4u32, 10, 13, 99, u32::MAX] {
        cases.push((
            format!("block_count type id {ty}"),
            base.patched(block_count, &ty.to_le_bytes()),
        ));
    }
    let tokens = base.value_at("tokenizer.ggml.tokens");
    let count = u64::from_le_bytes(base.bytes[tokens + 8..tokens + 16].try_into().unwrap());
    for n in [count + 1, count - 1, 0, 1 << 40, u64::MAX] {
        cases.push((
            format!("tokens count {n}"),
            base.patched(tokens + 8, &n.to_le_bytes()),
        ));
    }
    for ty in [4u32, 9, 99] {
        cases.push((
            format!("tokens element type {ty}"),
            base.patched(tokens + 4, &ty.to_le_bytes()),
        ));
    }
    let architecture = base.value_at("general.architecture");
    for n in [0u64, 1 << 40, u64::MAX] {
        cases.push((
            format!("architecture length {n}"),
            base.patched(architecture + 4, &n.to_le_bytes()),
        ));
    }
    cases.push((
        "first key length u64::MAX".into(),
        base.patched(24, &u64::MAX.to_le_bytes()),
    ));
    let data_offset = base.file.data_offset() as usize;
    let table = base.table_start();
    let len = base.bytes.len();
    for (what, at) in [
        ("in the magic", 3),
        ("in the header", 20),
        ("in the metadata", data_offset / 2),
        ("before the tensor table", table),
        ("in the tensor table", (table + data_offset) / 2),
        ("before the data", data_offset),
        ("one byte into the data", data_offset + 1),
        ("one byte short", len - 1),
    ] {
        cases.push((format!("cut {what}"), base.bytes[..at].to_vec()));
    }
    cases
}

/// Chat templates that fail, loop, grow or recurse, and ones of the wrong type.
fn template_edits() -> Vec<(&'static str, Edit)> {
    let template = |source: &str| set("tokenizer.chat_template", text(source));
    vec![
        ("template raises", template("{{ raise_exception('no') }}")),
        (
            "template undefined",
            template("{{ messages[99].content.x }}"),
        ),
        (
            "template loops",
            template(
                "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            ),
        ),
        ("template grows", template("{{ 'x' * 1000000000 }}")),
        (
            "template recurses",
            template("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}"),
        ),
        ("template unterminated", template("{% if messages %}")),
        ("template renders nothing", template("{# nothing #}")),
        ("template of 1 MiB", template(&"a".repeat(1 << 20))),
        (
            "template a number",
            set("tokenizer.chat_template", GgufValue::U32(5)),
        ),
        (
            "template a list",
            set(
                "tokenizer.chat_template",
                GgufValue::Array(GgufArray::String(vec![GgufString::from("{{ x }}")])),
            ),
        ),
    ]
}

/// Random mutations: metadata values replaced by random values of random types, header bytes
/// flipped or overwritten with edge integers, tensor data overwritten (NaN scales, 0xFF runs),
/// the file cut.
fn random_case(rng: &mut Rng, base: &Base, i: usize) -> Case {
    let data_offset = base.file.data_offset() as usize;
    let mut bytes = base.bytes.clone();
    let kind = rng.below(5);
    let what = match kind {
        0 => {
            let mut meta = base.metadata();
            let at = rng.below(meta.len());
            let value = random_value(rng);
            let label = format!("{} = {:?}", meta[at].0, short(&value));
            meta[at].1 = value;
            bytes = rewrite(&base.file, &base.bytes, &meta);
            label
        }
        1 => {
            let n = 1 + rng.below(4);
            for _ in 0..n {
                let at = rng.below(data_offset);
                bytes[at] ^= 1 + rng.below(255) as u8;
            }
            format!("{n} header bytes flipped")
        }
        2 => {
            let at = rng.below(data_offset - 8);
            let edge = [0u64, 1, 2, 512, 513, 1 << 31, 1 << 32, 1 << 60, u64::MAX];
            let v = edge[rng.below(edge.len())];
            let width = if rng.below(2) == 0 { 4 } else { 8 };
            bytes[at..at + width].copy_from_slice(&v.to_le_bytes()[..width]);
            format!("header bytes {at}..{} = {v}", at + width)
        }
        3 => {
            // Overwrite a run of tensor data: NaN/inf f16 scales and garbage quants.
            let len = 1 + rng.below(4096);
            let at = data_offset + rng.below(bytes.len() - data_offset - len);
            let fill = [0xFFu8, 0x7C, 0x00][rng.below(3)];
            bytes[at..at + len].fill(fill);
            format!("tensor data {at}..{} = {fill:#x}", at + len)
        }
        _ => {
            let at = rng.below(bytes.len());
            bytes.truncate(at);
            format!("cut at {at}")
        }
    };
    Case {
        name: format!("{} random {i}: {what}", base.name),
        bytes,
    }
}

fn short(value: &GgufValue) -> String {
    let text = format!("{value:?}");
    text.chars().take(60).collect()
}

fn random_value(rng: &mut Rng) -> GgufValue {
    let edge_u32 = [0u32, 1, 2, 3, 7, 8, 512, 513, 1024, 1025, u32::MAX, 1 << 31];
    match rng.below(9) {
        0 => GgufValue::U32(edge_u32[rng.below(edge_u32.len())]),
        1 => GgufValue::U32(rng.next_u64() as u32),
        2 => GgufValue::I32(rng.next_u64() as i32),
        3 => GgufValue::U64([0, 1 << 60, u64::MAX][rng.below(3)]),
        4 => GgufValue::F32([f32::NAN, f32::INFINITY, -1.0, 0.0, 1e30, 1e-30][rng.below(6)]),
        5 => GgufValue::Bool(rng.below(2) == 0),
        6 => text(["none", "", "gpt2", "llama", "yarn", "\u{0}"][rng.below(6)]),
        7 => u32s(&[edge_u32[rng.below(edge_u32.len())]; 2]),
        _ => GgufValue::Array(GgufArray::String(vec![GgufString::from("a"); rng.below(4)])),
    }
}

/// What one run did.
#[derive(Debug)]
struct Outcome {
    case: String,
    /// The validator's verdict: the broken rule, "unreadable", or "valid".
    verdict: String,
    /// Exit code, or the signal that ended it.
    code: Option<i32>,
    signal: Option<i32>,
    hung: bool,
    stderr_tail: String,
}

fn verdict(path: &Path) -> String {
    match GgufFile::open(path) {
        Err(_) => "unreadable".into(),
        Ok(file) => file
            .broken_rule()
            .map_or_else(|| "valid".into(), |(rule, _)| rule.name.to_string()),
    }
}

fn run(path: &Path, cache_dir: &Path) -> (Option<i32>, Option<i32>, bool, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_hypura"))
        .arg("run")
        .arg(path)
        .args(["--prompt", "hi", "--max-tokens", "1", "--temperature", "0"])
        .args(["--threads", "1", "--context", "64", "--gpu-budget", "0"])
        .env("HYPURA_CACHE_DIR", cache_dir)
        .env("RUST_LOG", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn hypura run");
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        text
    });
    let started = Instant::now();
    let (status, hung) = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break (status, false);
        }
        if started.elapsed() > RUN_LIMIT {
            let _ = child.kill();
            break (child.wait().unwrap(), true);
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let text = reader.join().unwrap_or_default();
    let tail: String = text
        .lines()
        .rev()
        .take(6)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect::<Vec<_>>()
        .join("\n");
    (status.code(), status.signal(), hung, tail)
}

/// The corpus: the bases unchanged, the targeted mutations, then
/// [`RANDOM_CASES`] random ones (always the same: a fixed seed); and how many
/// are targeted.
fn corpus(dir: &Path) -> (Vec<Case>, usize) {
    let dense = Base::write(dir, "tiny-llama", SynthSpec::tiny_llama());
    let moe = Base::write(dir, "tiny-mixtral", SynthSpec::tiny_mixtral());

    let mut cases = vec![Case {
        name: "tiny-llama unchanged".into(),
        bytes: dense.bytes.clone(),
    }];
    for (base, edits) in [
        (&dense, dense_edits()),
        (&moe, moe_edits()),
        (&dense, template_edits()),
    ] {
        for (name, edit) in edits {
            let mut meta = base.metadata();
            edit(&mut meta);
            cases.push(Case {
                name: format!("{} {name}", base.name),
                bytes: rewrite(&base.file, &base.bytes, &meta),
            });
        }
    }
    for (name, edit) in table_edits() {
        let mut table = entries(&dense.file);
        edit(&mut table);
        cases.push(Case {
            name: format!("{} {name}", dense.name),
            bytes: dense.with_table(&table, None),
        });
    }
    for (name, bytes) in byte_cases(&dense) {
        cases.push(Case {
            name: format!("{} {name}", dense.name),
            bytes,
        });
    }
    let targeted = cases.len();
    let mut rng = Rng::new(0x6d75_7461_7465);
    for i in 0..RANDOM_CASES {
        let base = if i % 4 == 3 { &moe } else { &dense };
        cases.push(random_case(&mut rng, base, i));
    }
    (cases, targeted)
}

#[test]
fn mutated_models_never_kill_hypura_run() {
    let started = Instant::now();
    let dir = std::env::temp_dir().join(format!("hypura-mutated-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cache_dir = dir.join("cache");
    std::fs::create_dir_all(&cache_dir).unwrap();
    let (cases, targeted) = corpus(&dir);
    let total = cases.len();

    let queue = Mutex::new(cases.into_iter().enumerate());
    let outcomes = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..WORKERS {
            scope.spawn(|| loop {
                let Some((i, case)) = queue.lock().unwrap().next() else {
                    break;
                };
                let path = dir.join(format!("case-{i}.gguf"));
                std::fs::write(&path, &case.bytes).unwrap();
                let verdict = verdict(&path);
                let (code, signal, hung, stderr_tail) = run(&path, &cache_dir);
                if signal.is_none() && !hung && code != Some(101) {
                    let _ = std::fs::remove_file(&path);
                } else {
                    eprintln!("kept {} for {}", path.display(), case.name);
                }
                outcomes.lock().unwrap().push(Outcome {
                    case: case.name,
                    verdict,
                    code,
                    signal,
                    hung,
                    stderr_tail,
                });
            });
        }
    });
    let outcomes = outcomes.into_inner().unwrap();
    assert_eq!(outcomes.len(), total);

    // Summary: validator verdict × process result.
    let mut summary: BTreeMap<(String, String), usize> = BTreeMap::new();
    for o in &outcomes {
        let result = match (o.code, o.signal, o.hung) {
            (_, _, true) => "HUNG".to_string(),
            (_, Some(sig), _) => format!("SIGNAL {sig}"),
            (Some(0), _, _) => "answered".to_string(),
            (Some(101), _, _) => "PANIC".to_string(),
            (Some(code), _, _) => format!("error exit {code}"),
            (None, None, _) => "?".to_string(),
        };
        *summary.entry((o.verdict.clone(), result)).or_default() += 1;
    }
    eprintln!(
        "mutated: {total} files ({targeted} targeted, {RANDOM_CASES} random) in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    for ((verdict, result), n) in &summary {
        eprintln!("  {n:4}  validator: {verdict:28}  hypura run: {result}");
    }
    // Valid by hypura's rules yet refused by llama.cpp (cleanly): worth knowing.
    for o in outcomes
        .iter()
        .filter(|o| o.verdict == "valid" && o.code != Some(0))
    {
        eprintln!(
            "  llama.cpp refused what the validator passed: {} ({:?})\n{}",
            o.case, o.code, o.stderr_tail
        );
    }

    let bad: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| o.hung || o.signal.is_some() || o.code == Some(101) || o.code.is_none())
        .collect();
    for o in &bad {
        eprintln!(
            "FAILED: {} (validator: {}): code {:?} signal {:?} hung {}\n{}",
            o.case, o.verdict, o.code, o.signal, o.hung, o.stderr_tail
        );
    }
    assert!(
        bad.is_empty(),
        "{} of {total} runs died by a signal, panicked or hung",
        bad.len()
    );
    // What the validator refuses, `run` refuses, with a message.
    for o in outcomes.iter().filter(|o| o.verdict != "valid") {
        assert_ne!(
            o.code,
            Some(0),
            "{}: the validator refuses it ({}) but run answered",
            o.case,
            o.verdict
        );
        assert!(
            !o.stderr_tail.is_empty(),
            "{}: refused without a message",
            o.case
        );
    }
    // The unchanged model answers.
    assert_eq!(
        outcomes
            .iter()
            .find(|o| o.case == "tiny-llama unchanged")
            .and_then(|o| o.code),
        Some(0)
    );
}

/// Longest one request through the server may take before it counts as hung.
const SERVE_LIMIT: Duration = Duration::from_secs(60);

/// The same corpus served from one directory (`hypura serve DIR`: a file
/// the validator refuses is skipped, and asking for it is a 404): each is
/// asked for one token with `keep_alive: 0` (so its runner goes with the
/// reply). Every request is answered (a reply or an error) within
/// [`SERVE_LIMIT`], no error names a file, and the server lives through all.
#[test]
fn mutated_models_never_hang_the_server() {
    let started = Instant::now();
    let dir = std::env::temp_dir().join(format!("hypura-mutated-serve-{}", std::process::id()));
    let models = dir.join("models");
    std::fs::create_dir_all(&models).unwrap();
    let (cases, _) = corpus(&dir);
    for (i, case) in cases.iter().enumerate() {
        std::fs::write(models.join(format!("case-{i:03}.gguf")), &case.bytes).unwrap();
    }
    let server = common::Server::start_with(&[
        "serve".into(),
        models.to_string_lossy().into_owned(),
        "--port".into(),
        "0".into(),
        "--context".into(),
        "128".into(),
        "--parallel".into(),
        "1".into(),
    ]);
    let client = reqwest::blocking::Client::builder()
        .timeout(SERVE_LIMIT)
        .build()
        .unwrap();
    let queue = Mutex::new(cases.iter().enumerate());
    let answers = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..WORKERS {
            scope.spawn(|| loop {
                let Some((i, case)) = queue.lock().unwrap().next() else {
                    break;
                };
                let body = serde_json::json!({"model": format!("case-{i:03}"), "prompt": "hi",
                    "stream": false, "keep_alive": 0,
                    "options": {"num_predict": 1, "temperature": 0}});
                let answer = client
                    .post(server.url("/api/generate"))
                    .json(&body)
                    .send()
                    .and_then(|r| Ok((r.status().as_u16(), r.text()?)));
                answers.lock().unwrap().push((case.name.clone(), answer));
            });
        }
    });
    let answers = answers.into_inner().unwrap();
    let mut summary: BTreeMap<String, usize> = BTreeMap::new();
    let mut bad = Vec::new();
    let dir_text = dir.to_string_lossy().into_owned();
    for (case, answer) in &answers {
        match answer {
            Ok((status, body)) => {
                *summary.entry(format!("{status}")).or_default() += 1;
                if body.contains(&dir_text) || body.contains(".gguf") {
                    bad.push(format!("{case}: the error names a file: {body}"));
                }
            }
            Err(e) => {
                *summary.entry("HUNG or cut".into()).or_default() += 1;
                bad.push(format!("{case}: {e}"));
            }
        }
    }
    eprintln!(
        "mutated through the server: {} files in {:.1} s",
        answers.len(),
        started.elapsed().as_secs_f64()
    );
    for (status, n) in &summary {
        eprintln!("  {n:4}  {status}");
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
    assert_eq!(answers.len(), cases.len());
    // Alive, and the unchanged model still answers.
    assert_eq!(server.get("/api/version").status(), 200);
    assert!(answers
        .iter()
        .any(|(case, a)| case == "tiny-llama unchanged" && matches!(a, Ok((200, _)))));
    std::fs::remove_dir_all(&dir).ok();
}
