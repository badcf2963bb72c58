//! A safe-Rust reader and validator for GGUF model files (versions 2 and 3, little-endian).
//!
//! [`GgufFile::open`] reads the header, the key/value metadata and the tensor infos with
//! buffered reads; it never reads tensor data and never opens the file for writing.
//! [`GgufFile::validate`] then checks what llama.cpp would otherwise fail on later, some of it
//! by aborting the whole process: tensor data inside the file (a truncated download), tensors
//! packed the way ggml's GGUF loader requires, a supported architecture, a tokenizer llama.cpp
//! can build.
//!
//! The file is untrusted input: every count and length is checked against hard limits, against
//! the bytes left in the file and against a memory budget before anything is allocated, and all
//! arithmetic on sizes and offsets is checked.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::fs::File;
use std::io::{self, BufReader, Read};
use std::path::{Path, PathBuf};

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Tensor data alignment when `general.alignment` is absent (`GGUF_DEFAULT_ALIGNMENT`).
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The most dimensions a ggml tensor has (`GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// Longest tensor name ggml stores: `GGML_MAX_NAME` (64) less the NUL terminator.
pub const MAX_TENSOR_NAME_BYTES: usize = 63;

/// Longest string value. Real ones (chat templates, an embedded tokenizer.json) stay below a
/// few MiB; ggml's own limit is 1 GiB. Also capped by the bytes left in the file.
const MAX_STRING_BYTES: u64 = 64 << 20;
/// Most memory all metadata values together may take, whatever the file size; real files
/// need tens of MiB at most (vocabulary and merges).
const MAX_METADATA_BYTES: u64 = 1 << 30;
/// Most elements of a numeric array (ggml's `GGUF_MAX_ARRAY_ELEMENTS`).
const MAX_ARRAY_ELEMENTS: u64 = 1 << 30;
/// Most elements of a string array. Each costs a heap allocation for as little as 8 file bytes,
/// so this is lower than ggml's limit; the largest vocabularies and merge lists are far below.
const MAX_STRING_ARRAY_ELEMENTS: u64 = 1 << 24;
/// Most key/value pairs; real files have tens.
const MAX_KV_COUNT: u64 = 1 << 20;
/// Most tensors; the largest real models have a few thousand.
const MAX_TENSOR_COUNT: u64 = 1 << 20;
/// Fewest bytes one key/value pair takes: key length, a 1-byte key, value type, a 1-byte value.
const MIN_KV_BYTES: u64 = 8 + 1 + 4 + 1;
/// Fewest bytes one tensor info takes: name length, n_dims, type, offset.
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 4 + 8;

/// Why a GGUF file cannot be used. Every message names the file and says what to do.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The path does not exist.
    #[error("{} does not exist; check the model path", .path.display())]
    NotFound { path: PathBuf },

    /// Reading failed for a reason of the operating system's (permissions, I/O error).
    #[error("cannot read {}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// Empty, a directory, or the first four bytes are not `GGUF`.
    #[error("{} is not a GGUF file ({detail}); hypura loads GGUF model files only", .path.display())]
    NotGguf { path: PathBuf, detail: String },

    /// The file ends before its header or its tensor data does: an incomplete download.
    #[error("{} is truncated: {detail}; re-download it", .path.display())]
    Truncated { path: PathBuf, detail: String },

    /// GGUF v1, a future version, or a big-endian file.
    #[error("{} is GGUF version {version}, but only versions 2 and 3 are supported{}",
        .path.display(), version_hint(*.version))]
    UnsupportedVersion { path: PathBuf, version: u32 },

    /// The metadata does not follow the format (unknown value type, duplicate key, ...).
    #[error("{} is corrupt: {detail} (at byte {offset}); re-download or re-convert it", .path.display())]
    Malformed {
        path: PathBuf,
        offset: u64,
        detail: String,
    },

    /// A count or length is beyond what any real model needs: corrupt or hostile.
    #[error("{} is corrupt: {what} is {value}, above the limit of {limit}; re-download or re-convert it",
        .path.display())]
    LimitExceeded {
        path: PathBuf,
        what: String,
        value: u64,
        limit: u64,
    },

    /// A tensor's type, shape, name or data placement is unusable.
    #[error("{} has a bad tensor '{tensor}': {detail}", .path.display())]
    BadTensor {
        path: PathBuf,
        tensor: String,
        detail: String,
    },

    /// A required key is missing or has the wrong type or value.
    #[error("{} has bad metadata '{key}': {detail}", .path.display())]
    BadMetadata {
        path: PathBuf,
        key: String,
        detail: String,
    },

    /// The vocabulary would make llama.cpp fail or abort.
    #[error("{} has a tokenizer llama.cpp cannot use: {detail}; re-convert the model with a current llama.cpp",
        .path.display())]
    BadTokenizer { path: PathBuf, detail: String },

    /// A hyperparameter llama.cpp would abort the process on, or refuse: one of the
    /// validator's rules (`rule`, see `RULES`).
    #[error("{} cannot be loaded: '{key}' {detail}; re-convert the model with a current llama.cpp",
        .path.display())]
    BadValue {
        path: PathBuf,
        rule: &'static str,
        key: String,
        detail: String,
    },

    /// `general.architecture` names an architecture the bundled llama.cpp cannot run.
    #[error("{} is a '{architecture}' model, an architecture the bundled llama.cpp does not support; \
        use a model of a supported architecture", .path.display())]
    UnsupportedArchitecture { path: PathBuf, architecture: String },
}

fn version_hint(version: u32) -> &'static str {
    if version != 0 && version & 0xFFFF == 0 {
        " (this looks like a big-endian file: only little-endian GGUF files are supported)"
    } else if version == 1 {
        " (GGUF v1 is obsolete: convert the model again with a current llama.cpp)"
    } else {
        ""
    }
}

impl GgufError {
    /// The file the error is about.
    pub fn path(&self) -> &Path {
        match self {
            GgufError::NotFound { path }
            | GgufError::Io { path, .. }
            | GgufError::NotGguf { path, .. }
            | GgufError::Truncated { path, .. }
            | GgufError::UnsupportedVersion { path, .. }
            | GgufError::Malformed { path, .. }
            | GgufError::LimitExceeded { path, .. }
            | GgufError::BadTensor { path, .. }
            | GgufError::BadMetadata { path, .. }
            | GgufError::BadTokenizer { path, .. }
            | GgufError::BadValue { path, .. }
            | GgufError::UnsupportedArchitecture { path, .. } => path,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// ggml tensor types
// ---------------------------------------------------------------------------------------------

/// Storage layout of one ggml tensor type: `block_size` elements take `bytes_per_block` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgmlType {
    /// The `ggml_type` enum value stored in GGUF tensor infos.
    pub id: u32,
    /// ggml's own name (`ggml_type_name`), e.g. `q4_K`.
    pub name: &'static str,
    /// Elements per block (`ggml_blck_size`).
    pub block_size: u64,
    /// Bytes per block (`ggml_type_size`).
    pub bytes_per_block: u64,
}

const fn ty(id: u32, name: &'static str, block_size: u64, bytes_per_block: u64) -> GgmlType {
    GgmlType {
        id,
        name,
        block_size,
        bytes_per_block,
    }
}

/// Number of `ggml_type` values, removed ones included (`GGML_TYPE_COUNT`).
pub const GGML_TYPE_COUNT: u32 = 43;

/// Every ggml tensor type a GGUF file may use, by id (from ggml.h, ggml.c, ggml-common.h).
pub const GGML_TYPES: &[GgmlType] = &[
    ty(0, "f32", 1, 4),
    ty(1, "f16", 1, 2),
    ty(2, "q4_0", 32, 18),
    ty(3, "q4_1", 32, 20),
    ty(6, "q5_0", 32, 22),
    ty(7, "q5_1", 32, 24),
    ty(8, "q8_0", 32, 34),
    ty(9, "q8_1", 32, 36),
    ty(10, "q2_K", 256, 84),
    ty(11, "q3_K", 256, 110),
    ty(12, "q4_K", 256, 144),
    ty(13, "q5_K", 256, 176),
    ty(14, "q6_K", 256, 210),
    ty(15, "q8_K", 256, 292),
    ty(16, "iq2_xxs", 256, 66),
    ty(17, "iq2_xs", 256, 74),
    ty(18, "iq3_xxs", 256, 98),
    ty(19, "iq1_s", 256, 50),
    ty(20, "iq4_nl", 32, 18),
    ty(21, "iq3_s", 256, 110),
    ty(22, "iq2_s", 256, 82),
    ty(23, "iq4_xs", 256, 136),
    ty(24, "i8", 1, 1),
    ty(25, "i16", 1, 2),
    ty(26, "i32", 1, 4),
    ty(27, "i64", 1, 8),
    ty(28, "f64", 1, 8),
    ty(29, "iq1_m", 256, 56),
    ty(30, "bf16", 1, 2),
    ty(34, "tq1_0", 256, 54),
    ty(35, "tq2_0", 256, 66),
    ty(39, "mxfp4", 32, 17),
    ty(40, "nvfp4", 64, 36),
    ty(41, "q1_0", 128, 18),
    ty(42, "q2_0", 64, 18),
];

/// Type ids ggml once had and removed; files using them cannot be loaded.
pub const REMOVED_GGML_TYPES: &[(u32, &str)] = &[
    (4, "Q4_2"),
    (5, "Q4_3"),
    (31, "Q4_0_4_4"),
    (32, "Q4_0_4_8"),
    (33, "Q4_0_8_8"),
    (36, "IQ4_NL_4_4"),
    (37, "IQ4_NL_4_8"),
    (38, "IQ4_NL_8_8"),
];

/// The layout of ggml type `id`, or `None` for a removed or unknown id.
pub fn ggml_type(id: u32) -> Option<&'static GgmlType> {
    GGML_TYPES.iter().find(|t| t.id == id)
}

fn unusable_type_detail(id: u32) -> String {
    match REMOVED_GGML_TYPES.iter().find(|(removed, _)| *removed == id) {
        Some((_, name)) => format!(
            "it uses ggml type {id} ({name}), which llama.cpp has removed; \
             convert the model again (repacked types: use the plain type, llama.cpp repacks at load)"
        ),
        None => format!(
            "it uses ggml type {id}, which this llama.cpp does not know \
             (known ids are below {GGML_TYPE_COUNT}); the file may need a newer llama.cpp"
        ),
    }
}

// ---------------------------------------------------------------------------------------------
// Architectures
// ---------------------------------------------------------------------------------------------

/// Model architectures the bundled llama.cpp can load (`LLM_ARCH_NAMES` in `llama-arch.cpp`,
/// without `clip`, which is only a placeholder for llama-quantize).
pub const SUPPORTED_ARCHITECTURES: &[&str] = &[
    "llama",
    "llama4",
    "deci",
    "falcon",
    "grok",
    "gpt2",
    "gptj",
    "gptneox",
    "mpt",
    "baichuan",
    "starcoder",
    "refact",
    "bert",
    "modern-bert",
    "nomic-bert",
    "nomic-bert-moe",
    "neo-bert",
    "jina-bert-v2",
    "jina-bert-v3",
    "eurobert",
    "bloom",
    "stablelm",
    "qwen",
    "qwen2",
    "qwen2moe",
    "qwen2vl",
    "qwen3",
    "qwen3moe",
    "qwen3next",
    "qwen3vl",
    "qwen3vlmoe",
    "qwen35",
    "qwen35moe",
    "clef",
    "qwen4exp",
    "phi2",
    "phi3",
    "phimoe",
    "plamo",
    "plamo2",
    "plamo3",
    "codeshell",
    "orion",
    "internlm2",
    "minicpm",
    "minicpm3",
    "gemma",
    "gemma2",
    "gemma3",
    "gemma3n",
    "gemma4",
    "gemma4-assistant",
    "gemma-embedding",
    "starcoder2",
    "mamba",
    "mamba2",
    "maple",
    "jamba",
    "falcon-h1",
    "xverse",
    "command-r",
    "cohere2",
    "cohere2moe",
    "dbrx",
    "olmo",
    "olmo2",
    "olmoe",
    "muse-glimmer",
    "openelm",
    "arctic",
    "deepseek",
    "deepseek2",
    "deepseek2-ocr",
    "deepseek32",
    "deepseek4",
    "chatglm",
    "glm4",
    "glm4moe",
    "glm-dsa",
    "bitnet",
    "t5",
    "t5encoder",
    "jais",
    "jais2",
    "nemotron",
    "nemotron_h",
    "nemotron_h_moe",
    "exaone",
    "exaone4",
    "exaone-moe",
    "rwkv6",
    "rwkv6qwen2",
    "rwkv7",
    "arwkv7",
    "granite",
    "granitemoe",
    "granitehybrid",
    "graniteswitch",
    "granite_swa",
    "chameleon",
    "wavtokenizer-dec",
    "plm",
    "bailingmoe",
    "bailingmoe2",
    "bailingmoe3",
    "dots1",
    "dots3note",
    "arcee",
    "afmoe",
    "laguna",
    "ernie4_5",
    "ernie4_5-moe",
    "hunyuan-moe",
    "hunyuan-dense",
    "hunyuan_vl",
    "hy_v3",
    "hy_v4",
    "smollm3",
    "gpt-oss",
    "lfm2",
    "lfm2moe",
    "dream",
    "smallthinker",
    "llada",
    "llada-moe",
    "seed_oss",
    "grovemoe",
    "apertus",
    "minimax-01",
    "hrm_text",
    "minimax-m2",
    "minimax-m3",
    "cogvlm",
    "rnd1",
    "pangu-embedded",
    "mistral3",
    "eagle3",
    "dflash",
    "mistral4",
    "paddleocr",
    "mimo2",
    "step35",
    "spark2_5",
    "llama-embed",
    "maincoder",
    "kimi-linear",
    "kimi-k3",
    "glm5-next",
    "talkie",
    "mellum",
    "nanbeige",
    "qwen3tts",
    "pockettts",
];

/// Whether the bundled llama.cpp can load models of architecture `name` (`general.architecture`).
pub fn is_supported_architecture(name: &str) -> bool {
    SUPPORTED_ARCHITECTURES.contains(&name)
}

// ---------------------------------------------------------------------------------------------
// Values
// ---------------------------------------------------------------------------------------------

/// A GGUF string: length-prefixed bytes, usually but not necessarily UTF-8 (a vocabulary may
/// hold raw single-byte tokens).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct GgufString(Vec<u8>);

impl GgufString {
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The text, when it is valid UTF-8.
    pub fn as_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.0).ok()
    }

    pub fn to_string_lossy(&self) -> Cow<'_, str> {
        String::from_utf8_lossy(&self.0)
    }
}

impl From<Vec<u8>> for GgufString {
    fn from(bytes: Vec<u8>) -> Self {
        GgufString(bytes)
    }
}

impl From<&str> for GgufString {
    fn from(text: &str) -> Self {
        GgufString(text.as_bytes().to_vec())
    }
}

impl fmt::Debug for GgufString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.to_string_lossy(), f)
    }
}

impl fmt::Display for GgufString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_string_lossy())
    }
}

/// An array value. ggml does not allow arrays of arrays, so neither do we.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufArray {
    U8(Vec<u8>),
    I8(Vec<i8>),
    U16(Vec<u16>),
    I16(Vec<i16>),
    U32(Vec<u32>),
    I32(Vec<i32>),
    F32(Vec<f32>),
    Bool(Vec<bool>),
    String(Vec<GgufString>),
    U64(Vec<u64>),
    I64(Vec<i64>),
    F64(Vec<f64>),
}

impl GgufArray {
    pub fn len(&self) -> usize {
        match self {
            GgufArray::U8(v) => v.len(),
            GgufArray::I8(v) => v.len(),
            GgufArray::U16(v) => v.len(),
            GgufArray::I16(v) => v.len(),
            GgufArray::U32(v) => v.len(),
            GgufArray::I32(v) => v.len(),
            GgufArray::F32(v) => v.len(),
            GgufArray::Bool(v) => v.len(),
            GgufArray::String(v) => v.len(),
            GgufArray::U64(v) => v.len(),
            GgufArray::I64(v) => v.len(),
            GgufArray::F64(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element type's GGUF name (`u8`, `i32`, `str`, ...).
    pub fn element_type_name(&self) -> &'static str {
        match self {
            GgufArray::U8(_) => "u8",
            GgufArray::I8(_) => "i8",
            GgufArray::U16(_) => "u16",
            GgufArray::I16(_) => "i16",
            GgufArray::U32(_) => "u32",
            GgufArray::I32(_) => "i32",
            GgufArray::F32(_) => "f32",
            GgufArray::Bool(_) => "bool",
            GgufArray::String(_) => "str",
            GgufArray::U64(_) => "u64",
            GgufArray::I64(_) => "i64",
            GgufArray::F64(_) => "f64",
        }
    }

    pub fn as_strings(&self) -> Option<&[GgufString]> {
        match self {
            GgufArray::String(v) => Some(v),
            _ => None,
        }
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(GgufString),
    U64(u64),
    I64(i64),
    F64(f64),
    Array(GgufArray),
}

impl GgufValue {
    /// The GGUF type name (`u32`, `str`, `arr[str]`, ...), for messages.
    pub fn type_name(&self) -> Cow<'static, str> {
        Cow::Borrowed(match self {
            GgufValue::U8(_) => "u8",
            GgufValue::I8(_) => "i8",
            GgufValue::U16(_) => "u16",
            GgufValue::I16(_) => "i16",
            GgufValue::U32(_) => "u32",
            GgufValue::I32(_) => "i32",
            GgufValue::F32(_) => "f32",
            GgufValue::Bool(_) => "bool",
            GgufValue::String(_) => "str",
            GgufValue::U64(_) => "u64",
            GgufValue::I64(_) => "i64",
            GgufValue::F64(_) => "f64",
            GgufValue::Array(a) => return Cow::Owned(format!("arr[{}]", a.element_type_name())),
        })
    }

    /// Any integer type, when it is non-negative.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// Any integer type that fits an `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            GgufValue::U64(v) => i64::try_from(v).ok(),
            GgufValue::I8(v) => Some(v.into()),
            GgufValue::I16(v) => Some(v.into()),
            GgufValue::I32(v) => Some(v.into()),
            GgufValue::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }

    /// An `f32`, or an `f64` narrowed to one.
    pub fn as_f32(&self) -> Option<f32> {
        match *self {
            GgufValue::F32(v) => Some(v),
            GgufValue::F64(v) => Some(v as f32),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(v) => Some(v),
            _ => None,
        }
    }

    /// The text of a string value that is valid UTF-8.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => s.as_str(),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&GgufArray> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Tensors and the file
// ---------------------------------------------------------------------------------------------

/// Where one tensor's data lies in the file, and how big it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// The `ggml_type` id; always one of [`GGML_TYPES`] once opened.
    pub ggml_type: u32,
    /// Elements per dimension, innermost first (`ne[0]` is the row length); at most 4.
    pub dims: Vec<u64>,
    /// Absolute byte offset of the data in the file.
    pub offset_in_file: u64,
    /// Size of the data in bytes.
    pub n_bytes: u64,
    /// Number of elements (product of `dims`).
    pub n_elements: u64,
}

impl TensorInfo {
    /// The layout of this tensor's type.
    pub fn type_info(&self) -> Option<&'static GgmlType> {
        ggml_type(self.ggml_type)
    }

    /// One past the last byte of the data, in the file.
    pub fn end_in_file(&self) -> Option<u64> {
        self.offset_in_file.checked_add(self.n_bytes)
    }
}

/// The parsed header, metadata and tensor table of a GGUF file.
#[derive(Clone)]
pub struct GgufFile {
    pub(crate) path: PathBuf,
    pub(crate) version: u32,
    pub(crate) file_bytes: u64,
    pub(crate) alignment: u64,
    pub(crate) data_offset: u64,
    /// In file order.
    pub(crate) metadata: Vec<(String, GgufValue)>,
    pub(crate) key_index: HashMap<String, usize>,
    /// In file order.
    pub(crate) tensors: Vec<TensorInfo>,
    /// Offset of each tensor relative to the data section, as the file states it.
    pub(crate) relative_offsets: Vec<u64>,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("path", &self.path)
            .field("version", &self.version)
            .field("file_bytes", &self.file_bytes)
            .field("kv_count", &self.metadata.len())
            .field("tensor_count", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Reads the header, metadata and tensor infos of `path` (never the tensor data).
    ///
    /// Fails on anything that makes the tensor table meaningless: bad magic or version,
    /// malformed or oversized values, unknown tensor types, bad shapes, duplicate names.
    /// Call [`GgufFile::validate`] before handing the file to llama.cpp.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => GgufError::NotFound {
                path: path.to_path_buf(),
            },
            _ => io_error(path, e),
        })?;
        let meta = file.metadata().map_err(|e| io_error(path, e))?;
        if meta.is_dir() {
            return Err(GgufError::NotGguf {
                path: path.to_path_buf(),
                detail: "it is a directory".into(),
            });
        }
        let mut buffered = BufReader::with_capacity(1 << 16, file);
        parse(&mut Reader::new(&mut buffered, meta.len(), path))
    }

    /// Parses a GGUF image held in memory, as [`GgufFile::open`] does a file; `path` only
    /// names it in errors.
    pub fn from_bytes(path: impl AsRef<Path>, bytes: &[u8]) -> Result<GgufFile, GgufError> {
        let mut cursor = bytes;
        parse(&mut Reader::new(
            &mut cursor,
            bytes.len() as u64,
            path.as_ref(),
        ))
    }

    /// [`GgufFile::open`] followed by [`GgufFile::validate`].
    pub fn open_validated(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let file = GgufFile::open(path)?;
        file.validate()?;
        Ok(file)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The GGUF format version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Size of the whole file in bytes.
    pub fn file_bytes(&self) -> u64 {
        self.file_bytes
    }

    /// Alignment of tensor data in bytes (`general.alignment`, default 32).
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute offset where the tensor data section starts.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Sum of all tensors' data sizes, without alignment padding.
    pub fn tensor_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.n_bytes).sum()
    }

    /// Sum of all tensors' element counts: the model's parameter count.
    pub fn parameter_count(&self) -> u64 {
        self.tensors.iter().map(|t| t.n_elements).sum()
    }

    /// All key/value pairs, in file order.
    pub fn metadata(&self) -> impl Iterator<Item = (&str, &GgufValue)> {
        self.metadata.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// A string value that is valid UTF-8.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key)?.as_str()
    }

    /// Any non-negative integer value.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key)?.as_u64()
    }

    pub fn get_i64(&self, key: &str) -> Option<i64> {
        self.get(key)?.as_i64()
    }

    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get(key)?.as_f32()
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key)?.as_bool()
    }

    pub fn get_array(&self, key: &str) -> Option<&GgufArray> {
        self.get(key)?.as_array()
    }

    /// `general.architecture`, e.g. `llama`.
    pub fn architecture(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    /// The full key of an architecture-scoped value: `arch_key("context_length")` is
    /// `llama.context_length` for a llama model.
    pub fn arch_key(&self, suffix: &str) -> Option<String> {
        Some(format!("{}.{suffix}", self.architecture()?))
    }

    /// `{arch}.{suffix}` as an integer, e.g. `arch_u64("block_count")`.
    pub fn arch_u64(&self, suffix: &str) -> Option<u64> {
        self.get_u64(&self.arch_key(suffix)?)
    }

    /// `{arch}.{suffix}` as a float, e.g. `arch_f32("rope.freq_base")`.
    pub fn arch_f32(&self, suffix: &str) -> Option<f32> {
        self.get_f32(&self.arch_key(suffix)?)
    }
}

fn io_error(path: &Path, source: io::Error) -> GgufError {
    GgufError::Io {
        path: path.to_path_buf(),
        source,
    }
}

// ---------------------------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------------------------

/// Buffered little-endian reads that never go past the file's end.
struct Reader<'p> {
    inner: &'p mut dyn Read,
    /// Bytes consumed so far; never above `len`.
    pos: u64,
    len: u64,
    /// Bytes of memory taken by the values read so far, against [`MAX_METADATA_BYTES`].
    allocated: u64,
    path: &'p Path,
}

impl<'p> Reader<'p> {
    fn new(inner: &'p mut dyn Read, len: u64, path: &'p Path) -> Reader<'p> {
        Reader {
            inner,
            pos: 0,
            len,
            allocated: 0,
            path,
        }
    }

    fn remaining(&self) -> u64 {
        self.len - self.pos
    }

    fn truncated(&self, what: &str, needed: u64) -> GgufError {
        GgufError::Truncated {
            path: self.path.to_path_buf(),
            detail: format!(
                "{what} needs {needed} bytes at offset {} but the file has {} bytes",
                self.pos, self.len
            ),
        }
    }

    fn malformed(&self, detail: String) -> GgufError {
        GgufError::Malformed {
            path: self.path.to_path_buf(),
            offset: self.pos,
            detail,
        }
    }

    fn limit(&self, what: String, value: u64, limit: u64) -> GgufError {
        GgufError::LimitExceeded {
            path: self.path.to_path_buf(),
            what,
            value,
            limit,
        }
    }

    fn need(&self, bytes: u64, what: &str) -> Result<(), GgufError> {
        if bytes > self.remaining() {
            Err(self.truncated(what, bytes))
        } else {
            Ok(())
        }
    }

    fn fill(&mut self, buf: &mut [u8], what: &str) -> Result<(), GgufError> {
        self.need(buf.len() as u64, what)?;
        self.inner.read_exact(buf).map_err(|e| match e.kind() {
            // The file shrank while we read it.
            io::ErrorKind::UnexpectedEof => self.truncated(what, buf.len() as u64),
            _ => io_error(self.path, e),
        })?;
        self.pos += buf.len() as u64;
        Ok(())
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        let mut buf = [0u8; N];
        self.fill(&mut buf, what)?;
        Ok(buf)
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    fn i64(&mut self, what: &str) -> Result<i64, GgufError> {
        self.array(what).map(i64::from_le_bytes)
    }

    /// Counts `n` bytes of memory about to be allocated for values.
    fn charge(&mut self, n: u64) -> Result<(), GgufError> {
        let total = self.allocated.saturating_add(n);
        if total > MAX_METADATA_BYTES {
            return Err(self.limit(
                "the memory the metadata needs".into(),
                total,
                MAX_METADATA_BYTES,
            ));
        }
        self.allocated = total;
        Ok(())
    }

    /// Exactly `n` bytes, after checking them against the bytes left and the memory budget.
    fn bytes(&mut self, n: u64, what: &str) -> Result<Vec<u8>, GgufError> {
        self.need(n, what)?;
        self.charge(n)?;
        let n = usize::try_from(n).map_err(|_| self.truncated(what, n))?;
        let mut buf = vec![0u8; n];
        self.fill(&mut buf, what)?;
        Ok(buf)
    }

    fn string(&mut self, what: &str) -> Result<GgufString, GgufError> {
        let len = self.u64(what)?;
        if len > MAX_STRING_BYTES {
            return Err(self.limit(format!("the length of {what}"), len, MAX_STRING_BYTES));
        }
        self.bytes(len, what).map(GgufString)
    }

    /// `count` elements of `N` bytes each, converted by `convert`.
    fn vec<T, const N: usize>(
        &mut self,
        count: u64,
        what: &str,
        convert: fn([u8; N]) -> T,
    ) -> Result<Vec<T>, GgufError> {
        let n_bytes = count
            .checked_mul(N as u64)
            .ok_or_else(|| self.truncated(what, u64::MAX))?;
        let raw = self.bytes(n_bytes, what)?;
        Ok(raw
            .chunks_exact(N)
            .map(|chunk| {
                let mut element = [0u8; N];
                element.copy_from_slice(chunk);
                convert(element)
            })
            .collect())
    }
}

// GGUF value type ids (`enum gguf_type`).
pub(crate) const T_U8: u32 = 0;
pub(crate) const T_I8: u32 = 1;
pub(crate) const T_U16: u32 = 2;
pub(crate) const T_I16: u32 = 3;
pub(crate) const T_U32: u32 = 4;
pub(crate) const T_I32: u32 = 5;
pub(crate) const T_F32: u32 = 6;
pub(crate) const T_BOOL: u32 = 7;
pub(crate) const T_STRING: u32 = 8;
pub(crate) const T_ARRAY: u32 = 9;
pub(crate) const T_U64: u32 = 10;
pub(crate) const T_I64: u32 = 11;
pub(crate) const T_F64: u32 = 12;

fn parse(r: &mut Reader<'_>) -> Result<GgufFile, GgufError> {
    let version = read_preamble(r)?;
    let (n_tensors, n_kv) = read_counts(r)?;
    let (metadata, key_index) = read_metadata(r, n_kv)?;
    let alignment = alignment(r.path, &metadata, &key_index)?;
    let raw_tensors = read_tensor_infos(r, n_tensors)?;
    // The data section starts at the next aligned offset, when there are tensors at all.
    let data_offset = if raw_tensors.is_empty() {
        r.pos
    } else {
        r.pos.next_multiple_of(alignment)
    };
    let mut tensors = Vec::with_capacity(raw_tensors.len());
    let mut relative_offsets = Vec::with_capacity(raw_tensors.len());
    for (mut tensor, relative) in raw_tensors {
        tensor.offset_in_file =
            data_offset
                .checked_add(relative)
                .ok_or_else(|| GgufError::BadTensor {
                    path: r.path.to_path_buf(),
                    tensor: tensor.name.clone(),
                    detail: format!("its data offset {relative} overflows 64 bits"),
                })?;
        tensors.push(tensor);
        relative_offsets.push(relative);
    }
    Ok(GgufFile {
        path: r.path.to_path_buf(),
        version,
        file_bytes: r.len,
        alignment,
        data_offset,
        metadata,
        key_index,
        tensors,
        relative_offsets,
    })
}

fn read_preamble(r: &mut Reader<'_>) -> Result<u32, GgufError> {
    if r.len < GGUF_MAGIC.len() as u64 {
        let detail = if r.len == 0 {
            "the file is empty".to_string()
        } else {
            format!("the file is only {} bytes long", r.len)
        };
        return Err(GgufError::NotGguf {
            path: r.path.to_path_buf(),
            detail,
        });
    }
    let magic: [u8; 4] = r.array("the magic")?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::NotGguf {
            path: r.path.to_path_buf(),
            detail: format!(
                "bad magic {:?}, expected \"GGUF\"",
                String::from_utf8_lossy(&magic)
            ),
        });
    }
    let version = r.u32("the version")?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::UnsupportedVersion {
            path: r.path.to_path_buf(),
            version,
        });
    }
    Ok(version)
}

fn read_counts(r: &mut Reader<'_>) -> Result<(u64, u64), GgufError> {
    let n_tensors = r.u64("the tensor count")?;
    let n_kv = r.u64("the metadata count")?;
    if n_tensors > MAX_TENSOR_COUNT {
        return Err(r.limit("the tensor count".into(), n_tensors, MAX_TENSOR_COUNT));
    }
    if n_kv > MAX_KV_COUNT {
        return Err(r.limit("the metadata count".into(), n_kv, MAX_KV_COUNT));
    }
    // Both are below 2^20, so these products cannot overflow.
    let at_least = n_tensors * MIN_TENSOR_INFO_BYTES + n_kv * MIN_KV_BYTES;
    r.need(
        at_least,
        &format!("{n_kv} metadata entries and {n_tensors} tensor infos"),
    )?;
    Ok((n_tensors, n_kv))
}

type Metadata = (Vec<(String, GgufValue)>, HashMap<String, usize>);

fn read_metadata(r: &mut Reader<'_>, n_kv: u64) -> Result<Metadata, GgufError> {
    // n_kv is bounded by the bytes left (read_counts), so this allocation is too.
    let mut metadata = Vec::with_capacity(n_kv as usize);
    let mut key_index = HashMap::with_capacity(n_kv as usize);
    for i in 0..n_kv {
        let key_offset = r.pos;
        let key = r.string("a metadata key")?;
        let key = match key.as_str() {
            Some("") => return Err(r.malformed(format!("metadata key {i} is empty"))),
            Some(k) => k.to_string(),
            None => return Err(r.malformed(format!("metadata key {i} is not UTF-8: {key:?}"))),
        };
        if key_index.contains_key(&key) {
            return Err(GgufError::Malformed {
                path: r.path.to_path_buf(),
                offset: key_offset,
                detail: format!("metadata key '{key}' appears twice"),
            });
        }
        let value_type = r.u32("a metadata value type")?;
        let value = read_value(r, value_type, &key)?;
        key_index.insert(key.clone(), metadata.len());
        metadata.push((key, value));
    }
    Ok((metadata, key_index))
}

fn read_value(r: &mut Reader<'_>, value_type: u32, key: &str) -> Result<GgufValue, GgufError> {
    let what = format!("the value of '{key}'");
    let value = match value_type {
        T_U8 => GgufValue::U8(u8::from_le_bytes(r.array(&what)?)),
        T_I8 => GgufValue::I8(i8::from_le_bytes(r.array(&what)?)),
        T_U16 => GgufValue::U16(u16::from_le_bytes(r.array(&what)?)),
        T_I16 => GgufValue::I16(i16::from_le_bytes(r.array(&what)?)),
        T_U32 => GgufValue::U32(u32::from_le_bytes(r.array(&what)?)),
        T_I32 => GgufValue::I32(i32::from_le_bytes(r.array(&what)?)),
        T_F32 => GgufValue::F32(f32::from_le_bytes(r.array(&what)?)),
        T_BOOL => GgufValue::Bool(r.array::<1>(&what)?[0] != 0),
        T_STRING => GgufValue::String(r.string(&what)?),
        T_U64 => GgufValue::U64(u64::from_le_bytes(r.array(&what)?)),
        T_I64 => GgufValue::I64(i64::from_le_bytes(r.array(&what)?)),
        T_F64 => GgufValue::F64(f64::from_le_bytes(r.array(&what)?)),
        T_ARRAY => GgufValue::Array(read_array(r, key)?),
        other => {
            return Err(r.malformed(format!("key '{key}' has unknown value type {other}")));
        }
    };
    Ok(value)
}

fn read_array(r: &mut Reader<'_>, key: &str) -> Result<GgufArray, GgufError> {
    let element_type = r.u32("an array element type")?;
    let count = r.u64("an array length")?;
    let what = format!("the array '{key}'");
    let (limit, min_element_bytes) = match element_type {
        T_STRING => (MAX_STRING_ARRAY_ELEMENTS, 8),
        T_ARRAY => {
            return Err(r.malformed(format!(
                "key '{key}' is an array of arrays, which ggml rejects"
            )));
        }
        _ => (MAX_ARRAY_ELEMENTS, 1),
    };
    if count > limit {
        return Err(r.limit(format!("the length of {what}"), count, limit));
    }
    // Bounded by the limit above, so no overflow.
    r.need(count * min_element_bytes, &what)?;
    let array = match element_type {
        T_U8 => GgufArray::U8(r.bytes(count, &what)?),
        T_I8 => GgufArray::I8(r.vec(count, &what, i8::from_le_bytes)?),
        T_U16 => GgufArray::U16(r.vec(count, &what, u16::from_le_bytes)?),
        T_I16 => GgufArray::I16(r.vec(count, &what, i16::from_le_bytes)?),
        T_U32 => GgufArray::U32(r.vec(count, &what, u32::from_le_bytes)?),
        T_I32 => GgufArray::I32(r.vec(count, &what, i32::from_le_bytes)?),
        T_F32 => GgufArray::F32(r.vec(count, &what, f32::from_le_bytes)?),
        T_BOOL => GgufArray::Bool(r.vec(count, &what, |[b]: [u8; 1]| b != 0)?),
        T_U64 => GgufArray::U64(r.vec(count, &what, u64::from_le_bytes)?),
        T_I64 => GgufArray::I64(r.vec(count, &what, i64::from_le_bytes)?),
        T_F64 => GgufArray::F64(r.vec(count, &what, f64::from_le_bytes)?),
        T_STRING => {
            r.charge(count * std::mem::size_of::<GgufString>() as u64)?;
            let mut strings = Vec::with_capacity(count as usize);
            for _ in 0..count {
                strings.push(r.string(&what)?);
            }
            GgufArray::String(strings)
        }
        other => {
            return Err(r.malformed(format!(
                "the array '{key}' has unknown element type {other}"
            )));
        }
    };
    Ok(array)
}

fn alignment(
    path: &Path,
    metadata: &[(String, GgufValue)],
    key_index: &HashMap<String, usize>,
) -> Result<u64, GgufError> {
    const KEY: &str = "general.alignment";
    let Some(&i) = key_index.get(KEY) else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    let bad = |detail: String| GgufError::BadMetadata {
        path: path.to_path_buf(),
        key: KEY.to_string(),
        detail,
    };
    match metadata[i].1 {
        GgufValue::U32(a) if a.is_power_of_two() => Ok(a.into()),
        GgufValue::U32(a) => Err(bad(format!("{a} is not a power of two"))),
        ref other => Err(bad(format!("must be a u32, found {}", other.type_name()))),
    }
}

fn read_tensor_infos(
    r: &mut Reader<'_>,
    n_tensors: u64,
) -> Result<Vec<(TensorInfo, u64)>, GgufError> {
    // n_tensors is bounded by the bytes left (read_counts).
    let mut tensors = Vec::with_capacity(n_tensors as usize);
    let mut names = HashSet::with_capacity(n_tensors as usize);
    for _ in 0..n_tensors {
        let (tensor, relative_offset) = read_tensor_info(r)?;
        if !names.insert(tensor.name.clone()) {
            return Err(GgufError::BadTensor {
                path: r.path.to_path_buf(),
                tensor: tensor.name,
                detail: "the name appears twice in the tensor table".into(),
            });
        }
        tensors.push((tensor, relative_offset));
    }
    Ok(tensors)
}

fn read_tensor_info(r: &mut Reader<'_>) -> Result<(TensorInfo, u64), GgufError> {
    let name = r.string("a tensor name")?;
    let name = match name.as_str() {
        Some(n) => n.to_string(),
        None => return Err(r.malformed(format!("tensor name {name:?} is not UTF-8"))),
    };
    let bad = |r: &Reader<'_>, detail: String| GgufError::BadTensor {
        path: r.path.to_path_buf(),
        tensor: name.clone(),
        detail,
    };
    if name.len() > MAX_TENSOR_NAME_BYTES {
        let detail = format!(
            "the name is {} bytes, ggml allows {MAX_TENSOR_NAME_BYTES}",
            name.len()
        );
        return Err(bad(r, detail));
    }
    let n_dims = r.u32("a tensor's dimension count")?;
    if n_dims as usize > MAX_DIMS {
        return Err(bad(
            r,
            format!("it has {n_dims} dimensions, ggml allows {MAX_DIMS}"),
        ));
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        let ne = r.i64("a tensor dimension")?;
        let ne =
            u64::try_from(ne).map_err(|_| bad(r, format!("it has a negative dimension {ne}")))?;
        dims.push(ne);
    }
    let type_id = r.u32("a tensor type")?;
    let relative_offset = r.u64("a tensor offset")?;
    let ty = ggml_type(type_id).ok_or_else(|| bad(r, unusable_type_detail(type_id)))?;
    let (n_elements, n_bytes) = tensor_size(&dims, ty).map_err(|detail| bad(r, detail))?;
    let tensor = TensorInfo {
        name,
        ggml_type: type_id,
        dims,
        offset_in_file: 0, // set once the data section's start is known
        n_bytes,
        n_elements,
    };
    Ok((tensor, relative_offset))
}

/// Element count and byte size of a tensor of shape `dims` and type `ty`.
fn tensor_size(dims: &[u64], ty: &GgmlType) -> Result<(u64, u64), String> {
    let row = dims.first().copied().unwrap_or(1);
    if row % ty.block_size != 0 {
        return Err(format!(
            "its rows have {row} elements, not a multiple of the {} block size {}",
            ty.name, ty.block_size
        ));
    }
    let overflow = || format!("its shape {dims:?} overflows 64 bits");
    let n_elements = dims
        .iter()
        .try_fold(1u64, |acc, &ne| acc.checked_mul(ne))
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(overflow)?;
    let n_bytes = (n_elements / ty.block_size)
        .checked_mul(ty.bytes_per_block)
        .filter(|&n| n <= i64::MAX as u64)
        .ok_or_else(overflow)?;
    Ok((n_elements, n_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;

    fn open_bytes(bytes: &[u8]) -> Result<GgufFile, GgufError> {
        let file = TempFile::new(bytes);
        GgufFile::open(&file.0)
    }

    fn validate_bytes(bytes: &[u8]) -> Result<GgufFile, GgufError> {
        let file = TempFile::new(bytes);
        GgufFile::open_validated(&file.0)
    }

    fn validate(model: &Model) -> Result<GgufFile, GgufError> {
        validate_bytes(&model.bytes())
    }

    fn spm_vocab(with_bytes: bool) -> Vec<String> {
        let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>", "▁a", "▁b"]
            .map(String::from)
            .to_vec();
        if with_bytes {
            tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
        }
        tokens
    }

    // ---- well-formed files -----------------------------------------------------------------

    #[test]
    fn reads_a_valid_file() {
        let model = Model::valid();
        let bytes = model.bytes();
        let file = validate_bytes(&bytes).expect("valid");
        assert_eq!(file.version(), 3);
        assert_eq!(file.file_bytes(), bytes.len() as u64);
        assert_eq!(file.architecture(), Some("llama"));
        assert_eq!(file.arch_u64("context_length"), Some(128));
        assert_eq!(file.get_str("general.name"), Some("tiny"));
        assert_eq!(file.tensors().len(), 11);
        assert_eq!(file.data_offset() % 32, 0);
        let embd = file.tensor("token_embd.weight").expect("tensor");
        assert_eq!(embd.dims, [32, 4]);
        assert_eq!(embd.n_elements, 128);
        assert_eq!(embd.n_bytes, 4 * 18);
        assert_eq!(embd.offset_in_file, file.data_offset());
        let norm = file.tensor("blk.0.attn_norm.weight").expect("tensor");
        assert_eq!(norm.offset_in_file, file.data_offset() + 96); // 72 padded to 32
        let last = file.tensor("blk.0.ffn_up.weight").expect("tensor");
        assert_eq!(last.end_in_file(), Some(bytes.len() as u64));
        // token_embd, two norms; attn q, k, v, output; ffn_norm; ffn gate, down, up.
        assert_eq!(
            file.tensor_bytes(),
            72 + 128 + 128 + 576 + 288 + 288 + 576 + 128 + 3 * 1152
        );
        assert_eq!(
            file.parameter_count(),
            128 + 32 + 32 + 1024 + 512 + 512 + 1024 + 32 + 3 * 2048
        );
    }

    #[test]
    fn from_bytes_reads_what_open_reads() {
        let bytes = Model::valid().bytes();
        let from_file = open_bytes(&bytes).expect("valid");
        let from_memory = GgufFile::from_bytes("memory.gguf", &bytes).expect("valid");
        assert_eq!(from_memory.path(), Path::new("memory.gguf"));
        assert_eq!(from_memory.tensors(), from_file.tensors());
        assert_eq!(from_memory.data_offset(), from_file.data_offset());
        assert!(from_memory.metadata().eq(from_file.metadata()));
        let err = GgufFile::from_bytes("memory.gguf", &bytes[..20]).unwrap_err();
        assert!(matches!(err, GgufError::Truncated { .. }), "{err}");
    }

    #[test]
    fn reads_version_2() {
        let model = Model {
            version: 2,
            ..Model::valid()
        };
        assert_eq!(validate(&model).expect("v2 is fine").version(), 2);
    }

    #[test]
    fn honours_general_alignment() {
        let mut model = Model::valid().set("general.alignment", V::U32(64));
        model.alignment = 64;
        let file = validate(&model).expect("valid");
        assert_eq!(file.alignment(), 64);
        assert_eq!(file.data_offset() % 64, 0);
        let norm = file.tensor("blk.0.attn_norm.weight").expect("tensor");
        assert_eq!(norm.offset_in_file, file.data_offset() + 128);
    }

    #[test]
    fn integer_accessors_accept_any_integer_type() {
        let model = Model::valid()
            .set("x.u8", V::U8(7))
            .set("x.i32", V::I32(9))
            .set("x.neg", V::I32(-1))
            .set("x.u64", V::U64(1 << 40))
            .set("x.f32", V::F32(0.5))
            .set("x.bool", V::Bool(true));
        let file = validate(&model).expect("valid");
        assert_eq!(file.get_u64("x.u8"), Some(7));
        assert_eq!(file.get_u64("x.i32"), Some(9));
        assert_eq!(file.get_u64("x.neg"), None);
        assert_eq!(file.get_i64("x.neg"), Some(-1));
        assert_eq!(file.get_u64("x.u64"), Some(1 << 40));
        assert_eq!(file.get_u64("x.f32"), None);
        assert_eq!(file.get_f32("x.f32"), Some(0.5));
        assert_eq!(file.get_bool("x.bool"), Some(true));
        assert_eq!(file.get_str("x.u8"), None);
        assert_eq!(file.get_u64("missing"), None);
        let merges = file.get_array("tokenizer.ggml.merges").expect("array");
        assert_eq!(
            merges.as_strings().map(|m| m[0].as_str()),
            Some(Some("a b"))
        );
        assert_eq!(
            file.get("tokenizer.ggml.tokens").map(|v| v.type_name()),
            Some("arr[str]".into())
        );
    }

    #[test]
    fn spm_vocab_with_byte_tokens_is_valid() {
        let model = Model::valid()
            .set("tokenizer.ggml.model", s("llama"))
            .vocab(spm_vocab(true))
            .set("tokenizer.ggml.scores", V::F32Arr(vec![0.0; 261]))
            .remove("tokenizer.ggml.merges");
        validate(&model).expect("valid");
    }

    #[test]
    fn vocab_less_models_are_refused() {
        // llama.cpp loads them, then aborts on the first text it tokenizes.
        for name in ["no_vocab", "none"] {
            let model = Model::valid()
                .set("tokenizer.ggml.model", s(name))
                .remove("tokenizer.ggml.tokens")
                .remove("tokenizer.ggml.token_type");
            assert_bad_tokenizer(model, "the model has no vocabulary");
        }
    }

    // ---- not GGUF, truncated, unsupported --------------------------------------------------

    #[test]
    fn missing_file_is_not_found() {
        let path = std::env::temp_dir().join("hypura-gguf-test-does-not-exist.gguf");
        let err = GgufFile::open(&path).unwrap_err();
        assert!(matches!(err, GgufError::NotFound { .. }), "{err}");
        assert!(err.to_string().contains("does-not-exist"), "{err}");
    }

    #[test]
    fn bad_magic_is_not_gguf() {
        let mut bytes = Model::valid().bytes();
        bytes[..4].copy_from_slice(b"GGML");
        let err = open_bytes(&bytes).unwrap_err();
        assert!(matches!(err, GgufError::NotGguf { .. }), "{err}");
        assert!(
            err.to_string().contains("is not a GGUF file (bad magic"),
            "{err}"
        );
    }

    #[test]
    fn empty_file_is_not_gguf() {
        let err = open_bytes(&[]).unwrap_err();
        assert!(matches!(err, GgufError::NotGguf { .. }), "{err}");
        assert!(err.to_string().contains("empty"), "{err}");
    }

    #[test]
    fn truncated_header_is_truncated() {
        let bytes = Model::valid().bytes();
        for cut in [6, 12, 30, 100] {
            let err = open_bytes(&bytes[..cut]).unwrap_err();
            assert!(
                matches!(err, GgufError::Truncated { .. }),
                "cut at {cut}: {err}"
            );
        }
    }

    #[test]
    fn truncated_tensor_data_is_detected() {
        let bytes = Model::valid().bytes();
        let cut = &bytes[..bytes.len() - 10];
        // The header is intact, so open succeeds; validate finds the missing bytes.
        let file = open_bytes(cut).expect("header is intact");
        let err = file.validate().unwrap_err();
        assert!(matches!(err, GgufError::Truncated { .. }), "{err}");
        let end = bytes.len();
        let start = end - 1152;
        let expected = format!(
            "is truncated: the file has {} bytes but its tensors need {end} bytes (10 missing): \
             the first tensor cut is blk.0.ffn_up.weight, bytes {start}..{end}; re-download it",
            end - 10
        );
        assert!(err.to_string().contains(&expected), "{err}");
    }

    #[test]
    fn unsupported_versions_are_rejected() {
        for version in [1, 4, 0x0300_0000] {
            let model = Model {
                version,
                ..Model::valid()
            };
            let err = open_bytes(&model.bytes()).unwrap_err();
            assert!(
                matches!(err, GgufError::UnsupportedVersion { version: v, .. } if v == version),
                "{err}"
            );
        }
        let big_endian = Model {
            version: 0x0300_0000,
            ..Model::valid()
        };
        let err = open_bytes(&big_endian.bytes()).unwrap_err();
        assert!(err.to_string().contains("big-endian"), "{err}");
    }

    #[test]
    fn unsupported_architecture_is_rejected() {
        let model = Model::valid().set("general.architecture", s("not-a-real-arch"));
        let err = validate(&model).unwrap_err();
        assert!(
            matches!(&err, GgufError::UnsupportedArchitecture { architecture, .. } if architecture == "not-a-real-arch"),
            "{err}"
        );
        assert!(err.to_string().contains("'not-a-real-arch'"), "{err}");
    }

    #[test]
    fn missing_architecture_is_bad_metadata() {
        let model = Model::valid().remove("general.architecture");
        let err = validate(&model).unwrap_err();
        assert!(
            matches!(&err, GgufError::BadMetadata { key, .. } if key == "general.architecture"),
            "{err}"
        );
    }

    #[test]
    fn supported_architectures_match_llama_cpp() {
        for name in [
            "llama",
            "qwen3moe",
            "deepseek2",
            "gemma3",
            "gpt-oss",
            "mixtral-free-arch",
        ] {
            let expected = name != "mixtral-free-arch";
            assert_eq!(is_supported_architecture(name), expected, "{name}");
        }
        // `clip` is in llama.cpp's table but only as a placeholder for llama-quantize.
        assert!(!is_supported_architecture("clip"));
        assert!(!is_supported_architecture("(unknown)"));
        assert!(!is_supported_architecture("LLAMA"));
        let unique: HashSet<_> = SUPPORTED_ARCHITECTURES.iter().collect();
        assert_eq!(unique.len(), SUPPORTED_ARCHITECTURES.len());
    }

    // ---- hostile or broken structure -------------------------------------------------------

    #[test]
    fn absurd_string_length_is_a_limit_error() {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(b"GGUF");
        bytes.extend_from_slice(&3u32.to_le_bytes());
        bytes.extend_from_slice(&0u64.to_le_bytes());
        bytes.extend_from_slice(&1u64.to_le_bytes());
        bytes.extend_from_slice(&u64::MAX.to_le_bytes()); // key length
        bytes.extend_from_slice(&[0u8; 64]);
        let err = open_bytes(&bytes).unwrap_err();
        assert!(
            matches!(
                err,
                GgufError::LimitExceeded {
                    value: u64::MAX,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn string_longer_than_the_file_is_truncated() {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(b"GGUF");
        bytes.extend_from_slice(&3u32.to_le_bytes());
        bytes.extend_from_slice(&0u64.to_le_bytes());
        bytes.extend_from_slice(&1u64.to_le_bytes());
        bytes.extend_from_slice(&1_000_000u64.to_le_bytes());
        bytes.extend_from_slice(&[b'k'; 64]);
        let err = open_bytes(&bytes).unwrap_err();
        assert!(matches!(err, GgufError::Truncated { .. }), "{err}");
    }

    #[test]
    fn absurd_counts_are_limit_errors() {
        for (n_tensors, n_kv) in [(u64::MAX, 0), (0, u64::MAX), (1 << 40, 1)] {
            let mut bytes = Vec::new();
            bytes.extend_from_slice(b"GGUF");
            bytes.extend_from_slice(&3u32.to_le_bytes());
            bytes.extend_from_slice(&n_tensors.to_le_bytes());
            bytes.extend_from_slice(&n_kv.to_le_bytes());
            bytes.extend_from_slice(&[0u8; 256]);
            let err = open_bytes(&bytes).unwrap_err();
            assert!(matches!(err, GgufError::LimitExceeded { .. }), "{err}");
        }
        // Counts under the hard limit but more than the file can hold.
        let mut bytes = Vec::new();
        bytes.extend_from_slice(b"GGUF");
        bytes.extend_from_slice(&3u32.to_le_bytes());
        bytes.extend_from_slice(&1000u64.to_le_bytes());
        bytes.extend_from_slice(&1000u64.to_le_bytes());
        bytes.extend_from_slice(&[0u8; 256]);
        let err = open_bytes(&bytes).unwrap_err();
        assert!(matches!(err, GgufError::Truncated { .. }), "{err}");
    }

    #[test]
    fn absurd_array_length_is_rejected() {
        let mut bytes = Vec::new();
        bytes.extend_from_slice(b"GGUF");
        bytes.extend_from_slice(&3u32.to_le_bytes());
        bytes.extend_from_slice(&0u64.to_le_bytes());
        bytes.extend_from_slice(&1u64.to_le_bytes());
        put_str(&mut bytes, "tokenizer.ggml.tokens");
        put_array_header(&mut bytes, T_STRING, 0);
        let len_at = bytes.len() - 8;
        bytes.extend_from_slice(&[0u8; 64]);
        bytes[len_at..len_at + 8].copy_from_slice(&(1u64 << 62).to_le_bytes());
        let err = open_bytes(&bytes).unwrap_err();
        assert!(matches!(err, GgufError::LimitExceeded { .. }), "{err}");
        bytes[len_at..len_at + 8].copy_from_slice(&1000u64.to_le_bytes());
        let err = open_bytes(&bytes).unwrap_err();
        assert!(matches!(err, GgufError::Truncated { .. }), "{err}");
    }

    #[test]
    fn nested_arrays_and_unknown_value_types_are_malformed() {
        let err = open_bytes(&Model::valid().set("x.nested", V::NestedArr).bytes()).unwrap_err();
        assert!(matches!(err, GgufError::Malformed { .. }), "{err}");

        let mut bytes = Vec::new();
        bytes.extend_from_slice(b"GGUF");
        bytes.extend_from_slice(&3u32.to_le_bytes());
        bytes.extend_from_slice(&0u64.to_le_bytes());
        bytes.extend_from_slice(&1u64.to_le_bytes());
        put_str(&mut bytes, "x.weird");
        bytes.extend_from_slice(&13u32.to_le_bytes());
        bytes.extend_from_slice(&[0u8; 32]);
        let err = open_bytes(&bytes).unwrap_err();
        assert!(matches!(err, GgufError::Malformed { .. }), "{err}");
    }

    #[test]
    fn duplicate_keys_are_malformed() {
        let mut model = Model::valid();
        model.kv.push(("general.name".into(), s("again")));
        let err = open_bytes(&model.bytes()).unwrap_err();
        assert!(matches!(err, GgufError::Malformed { .. }), "{err}");
    }

    #[test]
    fn corrupted_files_give_errors_not_panics() {
        let bytes = Model::valid()
            .set("tokenizer.ggml.model", s("llama"))
            .set("tokenizer.ggml.tokens", V::StrArr(spm_vocab(true)))
            .remove("tokenizer.ggml.token_type")
            .remove("tokenizer.ggml.merges")
            .bytes();
        // Only the header matters: tensor data is never read.
        let header_end = GgufFile::from_bytes("valid.gguf", &bytes)
            .expect("valid")
            .data_offset() as usize;
        for at in 0..header_end {
            for value in [0x00, 0xff, bytes[at] ^ 0x01] {
                let mut corrupted = bytes.clone();
                corrupted[at] = value;
                if let Ok(file) = GgufFile::from_bytes("corrupted.gguf", &corrupted) {
                    let _ = file.validate();
                }
            }
            let _ = GgufFile::from_bytes("cut.gguf", &bytes[..at]);
        }
    }

    #[test]
    fn directory_is_not_gguf() {
        let err = GgufFile::open(std::env::temp_dir()).unwrap_err();
        assert!(matches!(err, GgufError::NotGguf { .. }), "{err}");
    }

    #[test]
    fn bad_alignment_is_bad_metadata() {
        for value in [V::U32(0), V::U32(48), V::U64(32)] {
            let model = Model::valid().set("general.alignment", value);
            let err = open_bytes(&model.bytes()).unwrap_err();
            assert!(
                matches!(&err, GgufError::BadMetadata { key, .. } if key == "general.alignment"),
                "{err}"
            );
        }
    }

    // ---- bad tensors -----------------------------------------------------------------------

    fn with_tensor(tensor: T) -> Model {
        let mut model = Model::valid();
        model.tensors.push(tensor);
        model
    }

    fn assert_bad_tensor(err: GgufError, name: &str, needle: &str) {
        match &err {
            GgufError::BadTensor { tensor, detail, .. } => {
                assert_eq!(tensor, name, "{err}");
                assert!(detail.contains(needle), "{err}");
            }
            _ => panic!("expected BadTensor, got {err}"),
        }
    }

    #[test]
    fn unknown_ggml_type_is_a_bad_tensor() {
        let err = open_bytes(&with_tensor(t("x.weight", &[32], 99)).bytes()).unwrap_err();
        assert_bad_tensor(err, "x.weight", "ggml type 99");
    }

    #[test]
    fn removed_ggml_type_is_a_bad_tensor() {
        let err = open_bytes(&with_tensor(t("x.weight", &[32], 4)).bytes()).unwrap_err();
        assert_bad_tensor(err, "x.weight", "Q4_2");
        let err = open_bytes(&with_tensor(t("y.weight", &[32], 31)).bytes()).unwrap_err();
        assert_bad_tensor(err, "y.weight", "Q4_0_4_4");
    }

    #[test]
    fn misaligned_offset_is_a_bad_tensor() {
        let mut model = Model::valid();
        model.tensors[1].offset = Some(100);
        let err = validate(&model).unwrap_err();
        assert_bad_tensor(err, "blk.0.attn_norm.weight", "alignment 32");
    }

    #[test]
    fn overlapping_and_gapped_tensors_are_bad_tensors() {
        let mut model = Model::valid();
        model.tensors[1].offset = Some(64); // token_embd occupies 0..72
        let err = validate(&model).unwrap_err();
        assert_bad_tensor(
            err,
            "blk.0.attn_norm.weight",
            "overlaps with tensor 'token_embd.weight'",
        );

        let mut model = Model::valid();
        model.tensors[2].offset = Some(512);
        let err = validate(&model).unwrap_err();
        assert_bad_tensor(err, "output_norm.weight", "ggml expects 224");
    }

    #[test]
    fn bad_shapes_are_bad_tensors() {
        let err = open_bytes(&with_tensor(t("x", &[1, 1, 1, 1, 1], 0)).bytes()).unwrap_err();
        assert_bad_tensor(err, "x", "5 dimensions");
        // q4_0 rows must be whole 32-element blocks.
        let err = open_bytes(&with_tensor(t("x", &[16, 2], 2)).bytes()).unwrap_err();
        assert_bad_tensor(err, "x", "not a multiple");
        let err = open_bytes(&with_tensor(t("x", &[1 << 32, 1 << 32], 0)).bytes()).unwrap_err();
        assert_bad_tensor(err, "x", "overflows");
        let long = "n".repeat(64);
        let err = open_bytes(&with_tensor(t(&long, &[32], 0)).bytes()).unwrap_err();
        assert_bad_tensor(err, &long, "ggml allows 63");
    }

    #[test]
    fn negative_dimension_is_a_bad_tensor() {
        let err = open_bytes(&with_tensor(t("x", &[u64::MAX], 0)).bytes()).unwrap_err();
        assert_bad_tensor(err, "x", "negative");
    }

    #[test]
    fn duplicate_tensor_names_are_bad_tensors() {
        let err = open_bytes(&with_tensor(t("output_norm.weight", &[32], 0)).bytes()).unwrap_err();
        assert_bad_tensor(err, "output_norm.weight", "twice");
    }

    // ---- tokenizers ------------------------------------------------------------------------

    fn assert_bad_tokenizer(model: Model, needle: &str) {
        let err = validate(&model).unwrap_err();
        assert!(matches!(err, GgufError::BadTokenizer { .. }), "{err}");
        assert!(err.to_string().contains(needle), "{err}");
    }

    #[test]
    fn spm_vocab_without_byte_tokens_is_rejected() {
        let model = Model::valid()
            .set("tokenizer.ggml.model", s("llama"))
            .vocab(spm_vocab(false));
        assert_bad_tokenizer(model, "lacks 256 of the 256 byte tokens (<0x00>, <0x01>");
    }

    #[test]
    fn spm_vocab_may_use_plain_ascii_bytes() {
        // byte_to_token falls back to the one-byte string when <0xXX> is absent.
        let mut tokens = spm_vocab(true);
        tokens.retain(|t| t != "<0x41>");
        tokens.push("A".into());
        let model = Model::valid()
            .set("tokenizer.ggml.model", s("llama"))
            .vocab(tokens.clone());
        validate(&model).expect("valid");

        tokens.retain(|t| t != "A");
        let model = model.vocab(tokens);
        assert_bad_tokenizer(model, "lacks 1 of the 256 byte tokens (<0x41>)");
    }

    #[test]
    fn missing_or_empty_vocab_is_rejected() {
        assert_bad_tokenizer(
            Model::valid().remove("tokenizer.ggml.model"),
            "tokenizer.ggml.model is missing",
        );
        assert_bad_tokenizer(
            Model::valid().set("tokenizer.ggml.model", s("klingon")),
            "unknown tokenizer model",
        );
        assert_bad_tokenizer(
            Model::valid().remove("tokenizer.ggml.tokens"),
            "tokenizer.ggml.tokens is missing",
        );
        assert_bad_tokenizer(
            Model::valid().set("tokenizer.ggml.tokens", V::I32Arr(vec![1, 2])),
            "must be an array of strings, found arr[i32]",
        );
        assert_bad_tokenizer(
            Model::valid().set("tokenizer.ggml.tokens", V::StrArr(vec![])),
            "tokenizer.ggml.tokens is empty",
        );
    }

    #[test]
    fn per_token_arrays_must_match_the_vocab() {
        assert_bad_tokenizer(
            Model::valid().set("tokenizer.ggml.token_type", V::I32Arr(vec![1, 1])),
            "token_type has 2 entries but the vocabulary has 4 tokens",
        );
        assert_bad_tokenizer(
            Model::valid().set("tokenizer.ggml.scores", V::F32Arr(vec![0.0; 5])),
            "scores has 5 entries",
        );
        assert_bad_tokenizer(
            Model::valid().set("tokenizer.ggml.token_type", V::F32Arr(vec![0.0; 4])),
            "must be arr[i32], found arr[f32]",
        );
    }

    #[test]
    fn special_token_ids_must_be_integers_and_may_be_out_of_range() {
        // llama.cpp disables an out-of-range special token with a warning: so do we.
        validate(&Model::valid().set("tokenizer.ggml.padding_token_id", V::U32(4)))
            .expect("an out-of-range padding id is accepted");
        assert_bad_tokenizer(
            Model::valid().set("tokenizer.ggml.unknown_token_id", s("0")),
            "must be a u32 token id",
        );
    }

    #[test]
    fn bpe_needs_merges() {
        assert_bad_tokenizer(
            Model::valid().remove("tokenizer.ggml.merges"),
            "needs tokenizer.ggml.merges",
        );
        // Kimi-K2's pre-tokenizer is the one BPE vocabulary llama.cpp accepts without merges.
        let kimi = Model::valid()
            .remove("tokenizer.ggml.merges")
            .set("tokenizer.ggml.pre", s("kimi-k2"));
        validate(&kimi).expect("valid");
    }

    #[test]
    fn duplicate_tokens_are_rejected() {
        assert_bad_tokenizer(
            Model::valid().set("tokenizer.ggml.tokens", strs(["a", "b", "a", "c"])),
            "token 2 (\"a\") appears twice",
        );
    }

    // ---- the real test model ---------------------------------------------------------------

    #[test]
    fn smollm2_opens_and_validates() {
        // Expected values were read independently with the `gguf` Python package (0.19.0).
        let file = GgufFile::open_validated(crate::testing::smollm2()).expect("valid model");
        assert_eq!(file.version(), 3);
        assert_eq!(file.file_bytes(), 98_362_432);
        assert_eq!(file.architecture(), Some("llama"));
        assert_eq!(file.metadata().count(), 33);
        assert_eq!(file.tensors().len(), 272);
        assert_eq!(file.alignment(), 32);
        assert_eq!(file.data_offset(), 1_785_664);
        assert_eq!(file.parameter_count(), 134_515_008);
        assert_eq!(file.tensor_bytes(), 96_576_768);
        assert_eq!(file.arch_u64("context_length"), Some(8192));
        assert_eq!(file.arch_u64("block_count"), Some(30));
        assert_eq!(file.arch_u64("embedding_length"), Some(576));
        assert_eq!(file.arch_f32("rope.freq_base"), Some(100_000.0));
        assert_eq!(file.get_u64("general.file_type"), Some(3));
        assert_eq!(file.get_str("tokenizer.ggml.model"), Some("gpt2"));
        let tokens = file.get_array("tokenizer.ggml.tokens").expect("tokens");
        assert_eq!(tokens.len(), 49_152);
        assert_eq!(
            file.get_array("tokenizer.ggml.merges").map(GgufArray::len),
            Some(48_900)
        );

        let embd = file.tensor("token_embd.weight").expect("token_embd");
        assert_eq!(embd.ggml_type, 8); // q8_0
        assert_eq!(embd.dims, [576, 49_152]);
        assert_eq!(embd.n_bytes, 30_081_024);
        assert_eq!(embd.offset_in_file, 1_785_664);
        let down = file.tensor("blk.0.ffn_down.weight").expect("ffn_down");
        assert_eq!(down.ggml_type, 3); // q4_1
        assert_eq!(down.dims, [1536, 576]);
        assert_eq!(down.n_bytes, 552_960);
        assert_eq!(down.offset_in_file, 31_868_992);
        let last = file.tensors().last().expect("tensors");
        assert_eq!(last.name, "output_norm.weight");
        assert_eq!(last.end_in_file(), Some(98_362_432));
    }
}
