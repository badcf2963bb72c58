//! Safe wrapper over llama.cpp's gguf API and ggml's (de)quantization, for
//! writing model files of any size and reading tensors out of existing ones.
//!
//! Writing never holds tensor data in memory: [`GgufBuilder`] collects the
//! key-values and tensor infos, [`GgufBuilder::create`] writes the metadata,
//! and the returned [`GgufStreamWriter`] takes the tensors' bytes as a stream,
//! in the order the tensors were added, inserting the padding gguf requires.
//!
//! Every precondition that ggml would `GGML_ASSERT` (and so abort the whole
//! process on) is checked here first and returned as a [`GgufError`].
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

use hypura_llama_sys as sys;

/// gguf's tensor name limit (`GGML_MAX_NAME`), including the trailing NUL.
const MAX_NAME_BYTES: usize = 64;
/// ggml tensors have at most this many dimensions (`GGML_MAX_DIMS`).
const MAX_DIMS: usize = 4;
/// Key whose value must match the alignment the writer really uses.
const KEY_ALIGNMENT: &str = "general.alignment";
/// Buffer in front of the output file: large writes go straight through.
const WRITE_BUFFER_BYTES: usize = 8 << 20;

/// What went wrong while building, writing or reading a GGUF file.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path} is not a readable GGUF file (llama.cpp's gguf reader refused it; see its log)"
    )]
    Open { path: PathBuf },
    #[error("invalid name {name:?}: names must not contain NUL and tensor names must be shorter than {MAX_NAME_BYTES} bytes")]
    InvalidName { name: String },
    #[error("tensor {name:?} already exists in this GGUF")]
    DuplicateTensor { name: String },
    #[error("tensor {name:?}: {reason}")]
    BadShape { name: String, reason: String },
    #[error("ggml type {ty} does not support {what}")]
    UnsupportedType { ty: GgmlType, what: &'static str },
    #[error("{what}: got {got} elements/bytes, expected {expected}")]
    SizeMismatch {
        what: String,
        got: usize,
        expected: usize,
    },
    #[error("key {key:?} has gguf type {found}, not {expected}")]
    KeyType {
        key: String,
        found: String,
        expected: &'static str,
    },
    #[error("{written} bytes of tensor data written to {path} but the tensors hold {expected}; write the remaining tensors before finishing")]
    Incomplete {
        path: PathBuf,
        written: u64,
        expected: u64,
    },
    #[error("more tensor data written to {path} than its {expected} bytes of tensors")]
    Overflow { path: PathBuf, expected: u64 },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> GgufError + '_ {
    move |source| GgufError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A ggml element type (`enum ggml_type`), always one ggml knows.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct GgmlType(sys::ggml_type);

impl GgmlType {
    pub const F32: Self = Self(sys::GGML_TYPE_F32);
    pub const F16: Self = Self(sys::GGML_TYPE_F16);
    pub const BF16: Self = Self(sys::GGML_TYPE_BF16);
    pub const Q4_0: Self = Self(sys::GGML_TYPE_Q4_0);
    pub const Q4_1: Self = Self(sys::GGML_TYPE_Q4_1);
    pub const Q5_0: Self = Self(sys::GGML_TYPE_Q5_0);
    pub const Q5_1: Self = Self(sys::GGML_TYPE_Q5_1);
    pub const Q8_0: Self = Self(sys::GGML_TYPE_Q8_0);
    pub const Q2_K: Self = Self(sys::GGML_TYPE_Q2_K);
    pub const Q3_K: Self = Self(sys::GGML_TYPE_Q3_K);
    pub const Q4_K: Self = Self(sys::GGML_TYPE_Q4_K);
    pub const Q5_K: Self = Self(sys::GGML_TYPE_Q5_K);
    pub const Q6_K: Self = Self(sys::GGML_TYPE_Q6_K);

    /// The type with this raw value, if ggml has it (removed types have none).
    pub fn from_raw(raw: u32) -> Option<Self> {
        if raw >= sys::GGML_TYPE_COUNT {
            return None;
        }
        // SAFETY: raw < GGML_TYPE_COUNT, so the lookup stays inside ggml's type table.
        let block = unsafe { sys::ggml_blck_size(raw) };
        (block > 0).then_some(Self(raw))
    }

    /// The raw `enum ggml_type` value.
    pub fn raw(self) -> u32 {
        self.0
    }

    /// ggml's short name, e.g. `q4_K`.
    pub fn name(self) -> &'static str {
        // SAFETY: self.0 is a valid type; ggml returns a pointer to a static string.
        let name = unsafe { sys::ggml_type_name(self.0) };
        if name.is_null() {
            return "?";
        }
        // SAFETY: non-null, NUL-terminated and static (ggml's type table).
        unsafe { CStr::from_ptr(name) }.to_str().unwrap_or("?")
    }

    /// Elements per block (1 for plain float types, 32 or 256 for quantized ones).
    pub fn block_elements(self) -> usize {
        // SAFETY: self.0 is a valid type.
        let n = unsafe { sys::ggml_blck_size(self.0) };
        n as usize
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        // SAFETY: self.0 is a valid type.
        unsafe { sys::ggml_type_size(self.0) }
    }

    /// Bytes of one row of `n_per_row` elements (`ggml_row_size`); `None` when
    /// `n_per_row` is not a whole number of blocks.
    pub fn row_bytes(self, n_per_row: usize) -> Option<usize> {
        if !divides(self.block_elements(), n_per_row) || i64::try_from(n_per_row).is_err() {
            return None;
        }
        // SAFETY: valid type, n_per_row a whole number of blocks (ggml asserts that).
        Some(unsafe { sys::ggml_row_size(self.0, n_per_row as i64) })
    }

    /// Bytes of a tensor with these dimensions (innermost first), if the
    /// innermost one is a whole number of blocks and the size fits in `u64`.
    pub fn tensor_bytes(self, dims: &[u64]) -> Option<u64> {
        let (&inner, outer) = dims.split_first()?;
        let row = self.row_bytes(usize::try_from(inner).ok()?)? as u64;
        outer.iter().try_fold(row, |acc, &d| acc.checked_mul(d))
    }

    /// Whether [`quantize_rows`] can produce this type (no importance matrix needed).
    pub fn can_quantize(self) -> bool {
        matches!(
            self.0,
            sys::GGML_TYPE_F32
                | sys::GGML_TYPE_F16
                | sys::GGML_TYPE_BF16
                | sys::GGML_TYPE_Q4_0
                | sys::GGML_TYPE_Q4_1
                | sys::GGML_TYPE_Q5_0
                | sys::GGML_TYPE_Q5_1
                | sys::GGML_TYPE_Q8_0
                | sys::GGML_TYPE_Q2_K
                | sys::GGML_TYPE_Q3_K
                | sys::GGML_TYPE_Q4_K
                | sys::GGML_TYPE_Q5_K
                | sys::GGML_TYPE_Q6_K
        )
    }

    fn to_float(self) -> sys::ggml_to_float_t {
        // SAFETY: valid type; ggml returns a pointer into its static type table.
        let traits = unsafe { sys::ggml_get_type_traits(self.0) };
        if traits.is_null() {
            return None;
        }
        // SAFETY: non-null pointer to a static, never-mutated table entry.
        unsafe { (*traits).to_float }
    }

    /// Whether [`dequantize`] can read this type.
    pub fn can_dequantize(self) -> bool {
        self == Self::F32 || self.to_float().is_some()
    }
}

impl std::fmt::Debug for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GgmlType({})", self.name())
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether `n` is a whole multiple of `m` (never for `m` = 0). Not
/// `is_multiple_of`, which needs Rust 1.87 (the workspace declares 1.85).
fn divides(m: usize, n: usize) -> bool {
    n.checked_rem(m) == Some(0)
}

/// Block structs hold `ggml_half`/`float` fields: give ggml buffers aligned for them.
const BLOCK_ALIGN: usize = 4;

/// Quantizes rows of `n_per_row` f32 values into `ty` (`ggml_quantize_chunk`).
pub fn quantize_rows(ty: GgmlType, src: &[f32], n_per_row: usize) -> Result<Vec<u8>, GgufError> {
    let nrows = src.len().checked_div(n_per_row).unwrap_or(0);
    let row = ty.row_bytes(n_per_row).unwrap_or(0);
    let mut dst = vec![0u8; row * nrows];
    quantize_rows_into(ty, src, n_per_row, &mut dst)?;
    Ok(dst)
}

/// Like [`quantize_rows`], into `dst`, which must hold exactly the quantized rows.
pub fn quantize_rows_into(
    ty: GgmlType,
    src: &[f32],
    n_per_row: usize,
    dst: &mut [u8],
) -> Result<(), GgufError> {
    if !ty.can_quantize() {
        return Err(GgufError::UnsupportedType {
            ty,
            what: "quantization",
        });
    }
    let row = ty.row_bytes(n_per_row).filter(|_| n_per_row > 0);
    let Some(row) = row else {
        return Err(GgufError::BadShape {
            name: format!("rows of {n_per_row}"),
            reason: format!(
                "row length must be a positive multiple of {}",
                ty.block_elements()
            ),
        });
    };
    if !divides(n_per_row, src.len()) {
        return Err(GgufError::SizeMismatch {
            what: format!("f32 input, whole rows of {n_per_row}"),
            got: src.len(),
            expected: src.len() / n_per_row * n_per_row,
        });
    }
    let nrows = src.len() / n_per_row;
    if dst.len() != nrows * row {
        return Err(GgufError::SizeMismatch {
            what: format!("{ty} output for {nrows} rows"),
            got: dst.len(),
            expected: nrows * row,
        });
    }
    if !divides(BLOCK_ALIGN, dst.as_ptr() as usize) {
        let mut aligned = AlignedBytes::new(dst.len());
        quantize_rows_into(ty, src, n_per_row, aligned.as_mut_slice())?;
        dst.copy_from_slice(aligned.as_slice());
        return Ok(());
    }
    // SAFETY: ggml_quantize_init only sets up lookup tables, under ggml's own lock.
    unsafe { sys::ggml_quantize_init(ty.0) };
    // SAFETY: ty needs no imatrix (can_quantize), start = 0, n_per_row is a whole
    // number of blocks; src holds nrows*n_per_row floats and dst exactly nrows
    // rows of `row` bytes, block-aligned; ggml writes only inside dst.
    let written = unsafe {
        sys::ggml_quantize_chunk(
            ty.0,
            src.as_ptr(),
            dst.as_mut_ptr().cast(),
            0,
            nrows as i64,
            n_per_row as i64,
            std::ptr::null(),
        )
    };
    debug_assert_eq!(written, dst.len());
    Ok(())
}

/// Converts `src`, whole blocks of type `ty`, back to f32.
pub fn dequantize(ty: GgmlType, src: &[u8]) -> Result<Vec<f32>, GgufError> {
    let n = src.len() / ty.block_bytes().max(1) * ty.block_elements();
    let mut dst = vec![0f32; n];
    dequantize_into(ty, src, &mut dst)?;
    Ok(dst)
}

/// Like [`dequantize`], into `dst`, which must have room for exactly all of `src`.
pub fn dequantize_into(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), GgufError> {
    let blocks = dst.len() / ty.block_elements();
    if !divides(ty.block_elements(), dst.len()) || src.len() != blocks * ty.block_bytes() {
        return Err(GgufError::SizeMismatch {
            what: format!("{ty} bytes for {} values", dst.len()),
            got: src.len(),
            expected: blocks * ty.block_bytes(),
        });
    }
    if ty == GgmlType::F32 {
        for (d, s) in dst.iter_mut().zip(src.chunks_exact(4)) {
            *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
        }
        return Ok(());
    }
    let Some(to_float) = ty.to_float() else {
        return Err(GgufError::UnsupportedType {
            ty,
            what: "dequantization",
        });
    };
    if !divides(BLOCK_ALIGN, src.as_ptr() as usize) {
        let mut aligned = AlignedBytes::new(src.len());
        aligned.as_mut_slice().copy_from_slice(src);
        return dequantize_into(ty, aligned.as_slice(), dst);
    }
    // SAFETY: src holds exactly dst.len()/block_elements whole blocks of `ty`,
    // block-aligned; to_float reads those and writes dst.len() floats into dst.
    unsafe { to_float(src.as_ptr().cast(), dst.as_mut_ptr(), dst.len() as i64) };
    Ok(())
}

/// A byte buffer aligned for ggml's block structs.
struct AlignedBytes {
    words: Vec<u32>,
    len: usize,
}

impl AlignedBytes {
    fn new(len: usize) -> Self {
        Self {
            words: vec![0; len.div_ceil(4)],
            len,
        }
    }
    fn as_slice(&self) -> &[u8] {
        // SAFETY: words owns at least len initialized bytes; u8 has no alignment.
        unsafe { std::slice::from_raw_parts(self.words.as_ptr().cast(), self.len) }
    }
    fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.words.as_mut_ptr().cast(), self.len) }
    }
}

/// One tensor of a GGUF file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    pub ty: GgmlType,
    /// Dimensions, innermost (contiguous) first, as ggml's `ne`; no trailing 1s.
    pub dims: Vec<u64>,
    /// Offset of the tensor's bytes from the start of the data section.
    pub offset: u64,
    /// Bytes of tensor data (without padding).
    pub size_bytes: u64,
}

impl TensorInfo {
    /// Number of elements.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// Owned `gguf_context`, freed on drop.
struct Ctx(NonNull<sys::gguf_context>);

impl Drop for Ctx {
    fn drop(&mut self) {
        // SAFETY: we own the context; nothing borrows it past this point.
        unsafe { sys::gguf_free(self.0.as_ptr()) };
    }
}

impl Ctx {
    fn ptr(&self) -> *mut sys::gguf_context {
        self.0.as_ptr()
    }

    fn find_key(&self, key: &CStr) -> Option<i64> {
        // SAFETY: valid context and NUL-terminated key.
        let id = unsafe { sys::gguf_find_key(self.ptr(), key.as_ptr()) };
        (id >= 0).then_some(id)
    }

    fn kv_type(&self, id: i64) -> sys::gguf_type {
        // SAFETY: id came from find_key on this context.
        unsafe { sys::gguf_get_kv_type(self.ptr(), id) }
    }

    fn type_name(ty: sys::gguf_type) -> String {
        // SAFETY: gguf returns a static string for every type (a fallback for unknown ones).
        let name = unsafe { sys::gguf_type_name(ty) };
        if name.is_null() {
            return format!("#{ty}");
        }
        // SAFETY: non-null, static, NUL-terminated.
        unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned()
    }

    /// The id of `key` if it holds a single value of gguf type `want`.
    fn typed_key(
        &self,
        key: &str,
        want: sys::gguf_type,
        want_name: &'static str,
    ) -> Result<Option<i64>, GgufError> {
        let c = cstring(key)?;
        let Some(id) = self.find_key(&c) else {
            return Ok(None);
        };
        let found = self.kv_type(id);
        if found != want {
            return Err(GgufError::KeyType {
                key: key.to_string(),
                found: Self::type_name(found),
                expected: want_name,
            });
        }
        Ok(Some(id))
    }

    fn tensors(&self) -> Vec<TensorInfo> {
        // SAFETY: valid context.
        let n = unsafe { sys::gguf_get_n_tensors(self.ptr()) };
        (0..n).map(|i| self.tensor(i)).collect()
    }

    fn tensor(&self, id: i64) -> TensorInfo {
        // SAFETY: 0 <= id < n_tensors; the name is NUL-terminated inside the context.
        let name = unsafe { CStr::from_ptr(sys::gguf_get_tensor_name(self.ptr(), id)) };
        // SAFETY: as above; gguf returns a pointer to GGML_MAX_DIMS values.
        let ne = unsafe {
            std::slice::from_raw_parts(sys::gguf_get_tensor_ne(self.ptr(), id), MAX_DIMS)
        };
        let mut dims: Vec<u64> = ne.iter().map(|&d| d as u64).collect();
        while dims.len() > 1 && dims.last() == Some(&1) {
            dims.pop();
        }
        // SAFETY: as above; gguf validated the type when it read or added the tensor.
        let raw_ty = unsafe { sys::gguf_get_tensor_type(self.ptr(), id) };
        TensorInfo {
            name: name.to_string_lossy().into_owned(),
            ty: GgmlType(raw_ty),
            dims,
            // SAFETY: as above.
            offset: unsafe { sys::gguf_get_tensor_offset(self.ptr(), id) } as u64,
            // SAFETY: as above.
            size_bytes: unsafe { sys::gguf_get_tensor_size(self.ptr(), id) } as u64,
        }
    }
}

fn cstring(s: &str) -> Result<CString, GgufError> {
    CString::new(s).map_err(|_| GgufError::InvalidName {
        name: s.to_string(),
    })
}

/// Collects key-values and tensor infos of a GGUF file to be written.
pub struct GgufBuilder {
    ctx: Ctx,
}

impl Default for GgufBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl GgufBuilder {
    /// An empty GGUF (version 3, default alignment).
    pub fn new() -> Self {
        // SAFETY: no preconditions; gguf_init_empty aborts rather than return NULL.
        let ptr = unsafe { sys::gguf_init_empty() };
        Self {
            ctx: Ctx(NonNull::new(ptr).expect("gguf_init_empty returned NULL")),
        }
    }

    fn key(key: &str) -> Result<CString, GgufError> {
        // gguf aborts on a general.alignment that is not a power-of-two u32, and
        // ignores its value when writing: the writer's own alignment is used.
        if key == KEY_ALIGNMENT {
            return Err(GgufError::InvalidName {
                name: format!("{key} (set by the writer, not settable)"),
            });
        }
        cstring(key)
    }

    pub fn set_u32(&mut self, key: &str, value: u32) -> Result<(), GgufError> {
        let k = Self::key(key)?;
        // SAFETY: valid context, NUL-terminated key (not the reserved one).
        unsafe { sys::gguf_set_val_u32(self.ctx.ptr(), k.as_ptr(), value) };
        Ok(())
    }

    pub fn set_i32(&mut self, key: &str, value: i32) -> Result<(), GgufError> {
        let k = Self::key(key)?;
        // SAFETY: valid context, NUL-terminated key.
        unsafe { sys::gguf_set_val_i32(self.ctx.ptr(), k.as_ptr(), value) };
        Ok(())
    }

    pub fn set_f32(&mut self, key: &str, value: f32) -> Result<(), GgufError> {
        let k = Self::key(key)?;
        // SAFETY: valid context, NUL-terminated key.
        unsafe { sys::gguf_set_val_f32(self.ctx.ptr(), k.as_ptr(), value) };
        Ok(())
    }

    pub fn set_bool(&mut self, key: &str, value: bool) -> Result<(), GgufError> {
        let k = Self::key(key)?;
        // SAFETY: valid context, NUL-terminated key.
        unsafe { sys::gguf_set_val_bool(self.ctx.ptr(), k.as_ptr(), value) };
        Ok(())
    }

    pub fn set_str(&mut self, key: &str, value: &str) -> Result<(), GgufError> {
        let k = Self::key(key)?;
        let v = cstring(value)?;
        // SAFETY: valid context, NUL-terminated key and value; gguf copies the value.
        unsafe { sys::gguf_set_val_str(self.ctx.ptr(), k.as_ptr(), v.as_ptr()) };
        Ok(())
    }

    pub fn set_arr_str<S: AsRef<str>>(&mut self, key: &str, values: &[S]) -> Result<(), GgufError> {
        let k = Self::key(key)?;
        let owned = values
            .iter()
            .map(|s| cstring(s.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        let ptrs: Vec<*const std::os::raw::c_char> = owned.iter().map(|s| s.as_ptr()).collect();
        // SAFETY: ptrs holds values.len() NUL-terminated strings alive for the call; gguf copies them.
        unsafe {
            sys::gguf_set_arr_str(
                self.ctx.ptr(),
                k.as_ptr(),
                ptrs.as_ptr().cast_mut(),
                ptrs.len(),
            )
        };
        Ok(())
    }

    pub fn set_arr_f32(&mut self, key: &str, values: &[f32]) -> Result<(), GgufError> {
        self.set_arr_data(
            key,
            sys::GGUF_TYPE_FLOAT32,
            values.as_ptr().cast(),
            values.len(),
        )
    }

    pub fn set_arr_i32(&mut self, key: &str, values: &[i32]) -> Result<(), GgufError> {
        self.set_arr_data(
            key,
            sys::GGUF_TYPE_INT32,
            values.as_ptr().cast(),
            values.len(),
        )
    }

    fn set_arr_data(
        &mut self,
        key: &str,
        ty: sys::gguf_type,
        data: *const std::os::raw::c_void,
        n: usize,
    ) -> Result<(), GgufError> {
        let k = Self::key(key)?;
        // SAFETY: data points at n elements of 4 bytes (the size of `ty`); gguf copies them.
        unsafe { sys::gguf_set_arr_data(self.ctx.ptr(), k.as_ptr(), ty, data, n) };
        Ok(())
    }

    /// Removes `key`; true if it was there.
    pub fn remove_key(&mut self, key: &str) -> Result<bool, GgufError> {
        let k = cstring(key)?;
        // SAFETY: valid context, NUL-terminated key.
        Ok(unsafe { sys::gguf_remove_key(self.ctx.ptr(), k.as_ptr()) } >= 0)
    }

    /// Copies (adds or replaces) every key-value of `src` (`gguf_set_kv`).
    ///
    /// A `general.alignment` that differs from the alignment this writer uses
    /// is dropped: gguf writes with its own alignment whatever the key says,
    /// so keeping a different value would make readers misplace every tensor.
    pub fn copy_kvs_from(&mut self, src: &GgufReader) -> Result<(), GgufError> {
        // SAFETY: both contexts are valid; gguf_set_kv copies each pair.
        unsafe { sys::gguf_set_kv(self.ctx.ptr(), src.ctx.ptr()) };
        let key = cstring(KEY_ALIGNMENT)?;
        if let Some(id) = self.ctx.find_key(&key) {
            let keep = self.ctx.kv_type(id) == sys::GGUF_TYPE_UINT32
                // SAFETY: id is a u32 key of this context.
                && unsafe { sys::gguf_get_val_u32(self.ctx.ptr(), id) } as usize == self.alignment();
            if !keep {
                self.remove_key(KEY_ALIGNMENT)?;
            }
        }
        Ok(())
    }

    /// Adds the info of a tensor of type `ty` with dimensions `dims` (innermost
    /// first, 1 to 4 of them); its data must be written later, in adding order.
    pub fn add_tensor(&mut self, name: &str, ty: GgmlType, dims: &[u64]) -> Result<(), GgufError> {
        let tensor = make_tensor(name, ty, dims)?;
        let c = cstring(name)?;
        // SAFETY: valid context, NUL-terminated name.
        if unsafe { sys::gguf_find_tensor(self.ctx.ptr(), c.as_ptr()) } >= 0 {
            return Err(GgufError::DuplicateTensor {
                name: name.to_string(),
            });
        }
        // SAFETY: tensor is a fully initialized, contiguous ggml_tensor with a
        // unique name; gguf copies the struct and never reads its (null) data.
        unsafe { sys::gguf_add_tensor(self.ctx.ptr(), &tensor) };
        Ok(())
    }

    /// Alignment of tensor data in the file, in bytes.
    pub fn alignment(&self) -> usize {
        // SAFETY: valid context.
        unsafe { sys::gguf_get_alignment(self.ctx.ptr()) }
    }

    /// The tensors added so far, with their offsets in the data section.
    pub fn tensors(&self) -> Vec<TensorInfo> {
        self.ctx.tensors()
    }

    /// The file's metadata (header, key-values, tensor infos, padding): the
    /// data section starts right after these bytes.
    pub fn meta_bytes(&self) -> Vec<u8> {
        // SAFETY: valid context.
        let size = unsafe { sys::gguf_get_meta_size(self.ctx.ptr()) };
        let mut buf = vec![0u8; size];
        // SAFETY: buf has exactly gguf_get_meta_size bytes, what gguf_get_meta_data writes.
        unsafe { sys::gguf_get_meta_data(self.ctx.ptr(), buf.as_mut_ptr().cast()) };
        buf
    }

    /// Creates (truncates) `path`, writes the metadata and returns the writer
    /// for the tensors' data.
    pub fn create(self, path: &Path) -> Result<GgufStreamWriter, GgufError> {
        let meta = self.meta_bytes();
        let file = File::create(path).map_err(io_err(path))?;
        let mut out = BufWriter::with_capacity(WRITE_BUFFER_BYTES, file);
        out.write_all(&meta).map_err(io_err(path))?;
        let tensors = self.tensors();
        let alignment = self.alignment() as u64;
        let data_bytes = tensors
            .last()
            .map_or(0, |t| (t.offset + t.size_bytes).next_multiple_of(alignment));
        Ok(GgufStreamWriter {
            out,
            path: path.to_path_buf(),
            tensors,
            alignment,
            data_bytes,
            data_written: 0,
            next: 0,
            meta_bytes: meta.len() as u64,
        })
    }
}

fn make_tensor(name: &str, ty: GgmlType, dims: &[u64]) -> Result<sys::ggml_tensor, GgufError> {
    if name.len() >= MAX_NAME_BYTES || name.as_bytes().contains(&0) {
        return Err(GgufError::InvalidName {
            name: name.to_string(),
        });
    }
    let bad = |reason: String| GgufError::BadShape {
        name: name.to_string(),
        reason,
    };
    if dims.is_empty()
        || dims.len() > MAX_DIMS
        || dims.iter().any(|&d| d == 0 || d > i64::MAX as u64)
    {
        return Err(bad(format!(
            "dims {dims:?}: need 1 to {MAX_DIMS} positive dimensions"
        )));
    }
    let size = ty
        .tensor_bytes(dims)
        .filter(|&s| usize::try_from(s).is_ok());
    if size.is_none() {
        return Err(bad(format!(
            "dims {dims:?}: the first must be a multiple of {} for {ty}, and the size must fit in memory addresses",
            ty.block_elements()
        )));
    }
    // SAFETY: ggml_tensor is plain data (integers, arrays, raw pointers): all
    // zeroes is a valid value (no buffer, no data, no sources).
    let mut t: sys::ggml_tensor = unsafe { std::mem::zeroed() };
    t.type_ = ty.raw();
    let mut ne = [1i64; MAX_DIMS];
    for (n, &d) in ne.iter_mut().zip(dims) {
        *n = d as i64;
    }
    t.ne = ne;
    // Contiguous strides, as ggml_new_tensor would set them.
    t.nb[0] = ty.block_bytes();
    t.nb[1] = t.nb[0] * (ne[0] as usize / ty.block_elements());
    for i in 2..MAX_DIMS {
        t.nb[i] = t.nb[i - 1] * ne[i - 1] as usize;
    }
    for (dst, &src) in t.name.iter_mut().zip(name.as_bytes()) {
        *dst = src as std::os::raw::c_char;
    }
    Ok(t)
}

/// Streams tensor data into a GGUF file whose metadata is already written.
///
/// Bytes go to the tensors in the order they were added; padding to the
/// file's alignment is inserted after each tensor, as gguf itself does.
pub struct GgufStreamWriter {
    out: BufWriter<File>,
    path: PathBuf,
    tensors: Vec<TensorInfo>,
    alignment: u64,
    /// Size of the whole data section, padding included.
    data_bytes: u64,
    /// Bytes of the data section written so far, padding included.
    data_written: u64,
    /// Index of the tensor the next byte belongs to.
    next: usize,
    meta_bytes: u64,
}

impl GgufStreamWriter {
    /// All tensors of the file, in writing order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor the next bytes go to, `None` once all are written.
    pub fn current_tensor(&self) -> Option<&TensorInfo> {
        self.tensors.get(self.next)
    }

    /// Appends tensor data; may span tensors (padding is inserted between them).
    pub fn write_data(&mut self, mut bytes: &[u8]) -> Result<(), GgufError> {
        while !bytes.is_empty() {
            let Some(t) = self.tensors.get(self.next) else {
                return Err(GgufError::Overflow {
                    path: self.path.clone(),
                    expected: self.data_bytes,
                });
            };
            let end = t.offset + t.size_bytes;
            let room = (end - self.data_written) as usize;
            let take = room.min(bytes.len());
            self.out
                .write_all(&bytes[..take])
                .map_err(io_err(&self.path))?;
            self.data_written += take as u64;
            bytes = &bytes[take..];
            if self.data_written == end {
                self.pad()?;
            }
        }
        Ok(())
    }

    /// After a tensor's last byte: zero padding, then move on to the next tensor.
    fn pad(&mut self) -> Result<(), GgufError> {
        let padded = self.data_written.next_multiple_of(self.alignment);
        let zeros = [0u8; 256];
        let n = (padded - self.data_written) as usize;
        self.out
            .write_all(&zeros[..n])
            .map_err(io_err(&self.path))?;
        self.data_written = padded;
        self.next += 1;
        // Zero-sized tensors cannot exist (add_tensor refuses 0 dims), so the
        // next tensor starts exactly here.
        Ok(())
    }

    /// Flushes and syncs the file; fails if not all tensor data was written.
    /// Returns the file size in bytes.
    pub fn finish(mut self) -> Result<u64, GgufError> {
        if self.data_written != self.data_bytes {
            return Err(GgufError::Incomplete {
                path: self.path,
                written: self.data_written,
                expected: self.data_bytes,
            });
        }
        self.out.flush().map_err(io_err(&self.path))?;
        let file = self.out.get_ref();
        file.sync_data().map_err(io_err(&self.path))?;
        Ok(self.meta_bytes + self.data_bytes)
    }
}

/// An existing GGUF file opened for reading: its metadata in memory, tensor
/// data read from the file on request.
pub struct GgufReader {
    ctx: Ctx,
    file: File,
    path: PathBuf,
}

impl GgufReader {
    /// Reads the metadata of `path` (no tensor data).
    pub fn open(path: &Path) -> Result<Self, GgufError> {
        let file = File::open(path).map_err(io_err(path))?;
        let c = CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| {
            GgufError::InvalidName {
                name: path.display().to_string(),
            }
        })?;
        let params = sys::gguf_init_params {
            no_alloc: true,
            ctx: std::ptr::null_mut(),
        };
        // SAFETY: NUL-terminated path; ctx = NULL asks for metadata only. gguf
        // validates the file and returns NULL on any error.
        let ptr = unsafe { sys::gguf_init_from_file(c.as_ptr(), params) };
        let ctx = NonNull::new(ptr).ok_or_else(|| GgufError::Open {
            path: path.to_path_buf(),
        })?;
        Ok(Self {
            ctx: Ctx(ctx),
            file,
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// File offset where the data section starts.
    pub fn data_offset(&self) -> u64 {
        // SAFETY: valid context.
        unsafe { sys::gguf_get_data_offset(self.ctx.ptr()) as u64 }
    }

    /// Alignment of tensor data, in bytes.
    pub fn alignment(&self) -> usize {
        // SAFETY: valid context.
        unsafe { sys::gguf_get_alignment(self.ctx.ptr()) }
    }

    /// All key names, in file order.
    pub fn keys(&self) -> Vec<String> {
        // SAFETY: valid context.
        let n = unsafe { sys::gguf_get_n_kv(self.ctx.ptr()) };
        (0..n)
            .map(|i| {
                // SAFETY: 0 <= i < n_kv; the key is NUL-terminated inside the context.
                unsafe { CStr::from_ptr(sys::gguf_get_key(self.ctx.ptr(), i)) }
                    .to_string_lossy()
                    .into_owned()
            })
            .collect()
    }

    /// The string value of `key`; `None` if absent, an error if not a string.
    pub fn get_str(&self, key: &str) -> Result<Option<String>, GgufError> {
        let Some(id) = self.ctx.typed_key(key, sys::GGUF_TYPE_STRING, "string")? else {
            return Ok(None);
        };
        // SAFETY: id is a single string value; the pointer lives as long as ctx.
        let s = unsafe { CStr::from_ptr(sys::gguf_get_val_str(self.ctx.ptr(), id)) };
        Ok(Some(s.to_string_lossy().into_owned()))
    }

    /// The u32 value of `key`; `None` if absent, an error if not a u32.
    pub fn get_u32(&self, key: &str) -> Result<Option<u32>, GgufError> {
        let id = self.ctx.typed_key(key, sys::GGUF_TYPE_UINT32, "uint32")?;
        // SAFETY: id is a single u32 value of this context.
        Ok(id.map(|id| unsafe { sys::gguf_get_val_u32(self.ctx.ptr(), id) }))
    }

    /// The f32 value of `key`; `None` if absent, an error if not an f32.
    pub fn get_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        let id = self.ctx.typed_key(key, sys::GGUF_TYPE_FLOAT32, "float32")?;
        // SAFETY: id is a single f32 value of this context.
        Ok(id.map(|id| unsafe { sys::gguf_get_val_f32(self.ctx.ptr(), id) }))
    }

    /// The string array of `key`; `None` if absent, an error if not one.
    pub fn get_arr_str(&self, key: &str) -> Result<Option<Vec<String>>, GgufError> {
        let Some(id) = self.ctx.typed_key(key, sys::GGUF_TYPE_ARRAY, "array")? else {
            return Ok(None);
        };
        // SAFETY: id is an array key of this context.
        let elem = unsafe { sys::gguf_get_arr_type(self.ctx.ptr(), id) };
        if elem != sys::GGUF_TYPE_STRING {
            return Err(GgufError::KeyType {
                key: key.to_string(),
                found: format!("array of {}", Ctx::type_name(elem)),
                expected: "array of string",
            });
        }
        // SAFETY: as above.
        let n = unsafe { sys::gguf_get_arr_n(self.ctx.ptr(), id) };
        let out = (0..n)
            .map(|i| {
                // SAFETY: i < n for a string array; the string lives as long as ctx.
                unsafe { CStr::from_ptr(sys::gguf_get_arr_str(self.ctx.ptr(), id, i)) }
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        Ok(Some(out))
    }

    /// All tensors, in file order.
    pub fn tensors(&self) -> Vec<TensorInfo> {
        self.ctx.tensors()
    }

    /// The tensor called `name`, if any.
    pub fn tensor(&self, name: &str) -> Option<TensorInfo> {
        let c = CString::new(name).ok()?;
        // SAFETY: valid context, NUL-terminated name.
        let id = unsafe { sys::gguf_find_tensor(self.ctx.ptr(), c.as_ptr()) };
        (id >= 0).then(|| self.ctx.tensor(id))
    }

    /// Reads the bytes of `tensor` (one of this file's) from disk.
    pub fn read_tensor(&self, tensor: &TensorInfo) -> Result<Vec<u8>, GgufError> {
        let len = usize::try_from(tensor.size_bytes).map_err(|_| GgufError::SizeMismatch {
            what: format!("tensor {} in memory", tensor.name),
            got: usize::MAX,
            expected: usize::MAX,
        })?;
        let mut buf = vec![0u8; len];
        self.file
            .read_exact_at(&mut buf, self.data_offset() + tensor.offset)
            .map_err(io_err(&self.path))?;
        Ok(buf)
    }
}

#[cfg(test)]
mod tests {
    use hypura_gguf::reader::{ggml_type, GGML_TYPES, GGML_TYPE_COUNT, REMOVED_GGML_TYPES};

    /// hypura-gguf's copy of ggml's type table (it builds without llama.cpp) matches ggml's.
    #[test]
    fn type_table_matches_ggml() {
        use std::ffi::CStr;
        assert_eq!(GGML_TYPE_COUNT, hypura_llama_sys::GGML_TYPE_COUNT);
        for id in 0..GGML_TYPE_COUNT {
            // SAFETY: `id` is below GGML_TYPE_COUNT, the size of ggml's type_traits table;
            // these functions only read that table. ggml_type_name returns a pointer to a
            // static NUL-terminated string.
            let (block, size, name) = unsafe {
                (
                    hypura_llama_sys::ggml_blck_size(id),
                    hypura_llama_sys::ggml_type_size(id),
                    CStr::from_ptr(hypura_llama_sys::ggml_type_name(id)),
                )
            };
            let removed = REMOVED_GGML_TYPES.iter().any(|(r, _)| *r == id);
            match ggml_type(id) {
                Some(ty) => {
                    assert!(!removed, "type {id} is in both tables");
                    assert_eq!(ty.block_size, block as u64, "block size of {id}");
                    assert_eq!(ty.bytes_per_block, size as u64, "type size of {id}");
                    assert_eq!(Some(ty.name), name.to_str().ok(), "name of {id}");
                }
                None => {
                    assert!(removed, "type {id} ({name:?}) is missing from GGML_TYPES");
                    assert_eq!(block, 0, "removed type {id} has a block size in ggml");
                }
            }
        }
        let ids: Vec<u32> = GGML_TYPES.iter().map(|t| t.id).collect();
        let mut sorted = ids.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(ids, sorted, "GGML_TYPES is sorted by id without duplicates");
    }
}
