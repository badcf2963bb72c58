//! Fuzzing of the GGUF reader, the validator and the inspect report, bounded in time so it runs
//! in CI as a plain `cargo test` (`cargo test --release -p hypura-gguf --test fuzz`).
//!
//! The corpus: SmolLM2's header (the file up to its tensor data, which the reader never reads;
//! skipped with a message when the model is absent) and synthetic models from the `testing`
//! helpers (a dense llama, a llama MoE, a qwen3moe, an SPM vocabulary). Each case applies a
//! few proptest-generated mutations — header fields (counts, lengths, types, dimensions,
//! offsets) overwritten with edge values, bytes flipped, bytes inserted, the file cut, metadata
//! values replaced by values of any type, hyperparameters set to edge values — and checks that
//!
//! - nothing panics (open, validate, the inspect report);
//! - nothing allocates more than [`ALLOC_FACTOR`] times the input's size (plus 1 MiB): a count
//!   claiming 2^60 entries is an error, never an allocation;
//! - no case takes more than [`CASE_LIMIT`], and the whole run finishes (a watchdog fails the
//!   test on a hang).
//!
//! `HYPURA_FUZZ_SECS` (default 20) sets the time budget, `HYPURA_FUZZ_SEED` the seed (default:
//! fixed, so CI runs are reproducible). A failing case is shrunk and printed.
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use hypura_gguf::inspect::ModelReport;
use hypura_gguf::testing::{rewrite, s, smollm2_path, Model};
use hypura_gguf::{GgufArray, GgufFile, GgufString, GgufValue};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::strategy::{Strategy, ValueTree};
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

/// Most bytes one case may allocate, per input byte (plus 1 MiB).
const ALLOC_FACTOR: usize = 32;
/// Longest one case may take: a hang detector, far above what the largest seed needs (tens of
/// milliseconds).
const CASE_LIMIT: Duration = Duration::from_secs(10);

// ---- allocation accounting ------------------------------------------------------------------

/// The system allocator, counting this thread's live bytes and their peak.
struct Counting;

thread_local! {
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
}

fn count(delta: isize) {
    // try_with: no accounting while a thread is being torn down.
    let _ = LIVE.try_with(|live| {
        let now = live.get() + delta;
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as isize));
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size as isize - layout.size() as isize);
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f`, returning what it returns and the most bytes it had allocated at once.
fn peak_allocation<R>(f: impl FnOnce() -> R) -> (R, usize) {
    let base = LIVE.with(Cell::get);
    PEAK.with(|p| p.set(base));
    let result = f();
    let peak = PEAK.with(Cell::get) - base;
    (result, peak.max(0) as usize)
}

// ---- corpus ---------------------------------------------------------------------------------

/// The synthetic seeds, first in [`corpus`].
const SYNTHETIC_SEEDS: usize = 4;

struct Seed {
    name: &'static str,
    bytes: Vec<u8>,
    /// Offsets and widths (4 or 8) of the header's numeric fields: counts, lengths, value
    /// types, dimensions, tensor types and offsets.
    fields: Vec<(usize, usize)>,
    file: GgufFile,
}

impl Seed {
    fn new(name: &'static str, bytes: Vec<u8>) -> Seed {
        let file = GgufFile::from_bytes(name, &bytes).expect("seed parses");
        let fields = header_fields(&bytes);
        Seed {
            name,
            bytes,
            fields,
            file,
        }
    }
}

fn corpus() -> Vec<Seed> {
    let moe = Model::moe();
    let mut qwen3moe = moe.clone();
    for (key, _) in &mut qwen3moe.kv {
        if let Some(rest) = key.strip_prefix("llama.") {
            *key = format!("qwen3moe.{rest}");
        }
    }
    let qwen3moe = qwen3moe.set("general.architecture", s("qwen3moe"));
    let mut spm_tokens: Vec<String> = ["<unk>", "<s>", "</s>"].map(String::from).to_vec();
    spm_tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    let spm = Model::valid()
        .set("tokenizer.ggml.model", s("llama"))
        .remove("tokenizer.ggml.merges")
        .vocab(spm_tokens);

    let mut seeds = vec![
        Seed::new("tiny-llama", Model::valid().bytes()),
        Seed::new("tiny-mixtral", moe.bytes()),
        Seed::new("tiny-qwen3moe", qwen3moe.bytes()),
        Seed::new("tiny-spm", spm.bytes()),
    ];
    let path = smollm2_path();
    match std::fs::read(&path) {
        Ok(bytes) => {
            let file = GgufFile::from_bytes("smollm2", &bytes).expect("SmolLM2 parses");
            let header = bytes[..file.data_offset() as usize].to_vec();
            seeds.push(Seed::new("smollm2-header", header));
        }
        Err(e) => eprintln!(
            "fuzz: {} unreadable ({e}): SmolLM2 is left out of the corpus \
             (scripts/fetch-models.sh fetches it)",
            path.display()
        ),
    }
    for seed in &seeds {
        // Every seed is a valid model but for its missing tensor data.
        if let Some((rule, e)) = seed.file.broken_rule() {
            assert!(rule.name == "tensor-data-in-file", "{}: {e}", seed.name);
        }
    }
    seeds
}

/// The offsets of the numeric fields of a well-formed GGUF header (the first 8 elements of
/// each array only).
fn header_fields(b: &[u8]) -> Vec<(usize, usize)> {
    let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
    let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap()) as usize;
    let mut fields = vec![(4, 4), (8, 8), (16, 8)];
    let (n_tensors, n_kv) = (u64_at(8), u64_at(16));
    let mut at = 24;
    let scalar = |ty: u32| match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        _ => 0,
    };
    for _ in 0..n_kv {
        fields.push((at, 8));
        at += 8 + u64_at(at);
        fields.push((at, 4));
        let ty = u32_at(at);
        at += 4;
        match ty {
            8 => {
                fields.push((at, 8));
                at += 8 + u64_at(at);
            }
            9 => {
                fields.push((at, 4));
                let element = u32_at(at);
                fields.push((at + 4, 8));
                let n = u64_at(at + 4);
                at += 12;
                for i in 0..n {
                    if element == 8 {
                        if i < 8 {
                            fields.push((at, 8));
                        }
                        at += 8 + u64_at(at);
                    } else {
                        if i < 8 && scalar(element) >= 4 {
                            fields.push((at, scalar(element)));
                        }
                        at += scalar(element);
                    }
                }
            }
            ty => {
                if scalar(ty) >= 4 {
                    fields.push((at, scalar(ty)));
                }
                at += scalar(ty);
            }
        }
    }
    for _ in 0..n_tensors {
        fields.push((at, 8));
        at += 8 + u64_at(at);
        fields.push((at, 4));
        let n_dims = u32_at(at) as usize;
        at += 4;
        for _ in 0..n_dims {
            fields.push((at, 8));
            at += 8;
        }
        fields.push((at, 4));
        fields.push((at + 4, 8));
        at += 12;
    }
    fields
}

// ---- mutations ------------------------------------------------------------------------------

/// Hyperparameter and tokenizer keys the validator reads (`{arch}.` is prepended to those
/// without a `.` prefix of their own).
const KEYS: &[&str] = &[
    "context_length",
    "embedding_length",
    "block_count",
    "feed_forward_length",
    "attention.head_count",
    "attention.head_count_kv",
    "attention.key_length",
    "attention.value_length",
    "attention.layer_norm_rms_epsilon",
    "attention.layer_norm_epsilon",
    "rope.freq_base",
    "rope.dimension_count",
    "rope.scaling.type",
    "rope.scaling.factor",
    "expert_count",
    "expert_used_count",
    "expert_group_count",
    "expert_group_used_count",
    "expert_feed_forward_length",
    "nextn_predict_layers",
    "vocab_size",
    "general.architecture",
    "general.alignment",
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.scores",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.add_bos_token",
];

#[derive(Debug, Clone)]
enum Op {
    /// Overwrite a header field (count, length, type, dimension, offset) with `value`.
    Field { at: Index, value: u64 },
    /// XOR one header byte.
    Flip { at: Index, xor: u8 },
    /// Insert bytes into the header.
    Insert { at: Index, bytes: Vec<u8> },
    /// Cut the file.
    Cut { at: Index },
    /// Replace the value of the metadata entry at `at`.
    Replace { at: Index, value: GgufValue },
    /// Set (or add) one of [`KEYS`].
    Set { key: Index, value: GgufValue },
    /// Remove the metadata entry at `at`.
    Remove { at: Index },
}

fn edge_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(2),
        Just(3),
        Just(7),
        Just(64),
        Just(512),
        Just(513),
        Just(1024),
        Just(1025),
        Just(u64::from(u32::MAX)),
        Just(1 << 31),
        Just(1 << 32),
        Just(1 << 60),
        Just(u64::MAX),
        Just(i64::MAX as u64),
        any::<u64>(),
        0u64..100_000,
    ]
}

fn edge_u32() -> impl Strategy<Value = u32> {
    edge_u64().prop_map(|v| v as u32)
}

fn edge_f32() -> impl Strategy<Value = f32> {
    prop_oneof![
        Just(f32::NAN),
        Just(f32::INFINITY),
        Just(f32::NEG_INFINITY),
        Just(-1.0f32),
        Just(-0.0),
        Just(0.0),
        Just(1e-6),
        Just(1e30),
        any::<f32>(),
    ]
}

fn text() -> impl Strategy<Value = GgufString> {
    prop_oneof![
        Just("none"),
        Just("no_vocab"),
        Just("llama"),
        Just("gpt2"),
        Just("qwen3moe"),
        Just("yarn"),
        Just("longrope"),
        Just("kimi-k2"),
        Just(""),
    ]
    .prop_map(GgufString::from)
    .boxed()
    .prop_union(
        proptest::collection::vec(any::<u8>(), 0..12)
            .prop_map(GgufString::from)
            .boxed(),
    )
}

fn value() -> impl Strategy<Value = GgufValue> {
    let len = 0usize..6;
    prop_oneof![
        edge_u32().prop_map(GgufValue::U32),
        any::<i32>().prop_map(GgufValue::I32),
        edge_u64().prop_map(GgufValue::U64),
        any::<u8>().prop_map(GgufValue::U8),
        any::<i64>().prop_map(GgufValue::I64),
        edge_f32().prop_map(GgufValue::F32),
        any::<f64>().prop_map(GgufValue::F64),
        any::<bool>().prop_map(GgufValue::Bool),
        text().prop_map(GgufValue::String),
        proptest::collection::vec(edge_u32(), len.clone())
            .prop_map(|v| GgufValue::Array(GgufArray::U32(v))),
        proptest::collection::vec(any::<i32>(), len.clone())
            .prop_map(|v| GgufValue::Array(GgufArray::I32(v))),
        proptest::collection::vec(edge_f32(), len.clone())
            .prop_map(|v| GgufValue::Array(GgufArray::F32(v))),
        proptest::collection::vec(text(), len).prop_map(|v| GgufValue::Array(GgufArray::String(v))),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (any::<Index>(), edge_u64()).prop_map(|(at, value)| Op::Field { at, value }),
        2 => (any::<Index>(), 1u8..=255).prop_map(|(at, xor)| Op::Flip { at, xor }),
        1 => (any::<Index>(), proptest::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(at, bytes)| Op::Insert { at, bytes }),
        1 => any::<Index>().prop_map(|at| Op::Cut { at }),
        3 => (any::<Index>(), value()).prop_map(|(at, value)| Op::Replace { at, value }),
        4 => (any::<Index>(), value()).prop_map(|(key, value)| Op::Set { key, value }),
        1 => any::<Index>().prop_map(|at| Op::Remove { at }),
    ]
}

#[derive(Debug, Clone)]
struct Case {
    /// The last seed (SmolLM2's header, 1.8 MB, when present) or one of the small ones.
    last_seed: bool,
    seed: Index,
    ops: Vec<Op>,
}

fn case() -> impl Strategy<Value = Case> {
    // SmolLM2 cases cost some 100 small ones: one case in 20.
    let last_seed = prop_oneof![19 => Just(false), 1 => Just(true)];
    (
        last_seed,
        any::<Index>(),
        proptest::collection::vec(op(), 1..5),
    )
        .prop_map(|(last_seed, seed, ops)| Case {
            last_seed,
            seed,
            ops,
        })
}

impl Case {
    fn seed<'a>(&self, seeds: &'a [Seed]) -> &'a Seed {
        match self.last_seed {
            true => &seeds[seeds.len() - 1],
            false => self.seed.get(&seeds[..SYNTHETIC_SEEDS]),
        }
    }
}

/// The bytes of `case`: the metadata edits first (rewriting the header), then the byte edits.
fn build(seeds: &[Seed], case: &Case) -> (String, Vec<u8>) {
    let seed = case.seed(seeds);
    let mut metadata: Vec<(String, GgufValue)> = seed
        .file
        .metadata()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    let arch = seed.file.architecture().unwrap_or("llama").to_string();
    let mut edited = false;
    for op in &case.ops {
        match op {
            Op::Replace { at, value } if !metadata.is_empty() => {
                let i = at.index(metadata.len());
                metadata[i].1 = value.clone();
                edited = true;
            }
            Op::Set { key, value } => {
                let suffix = key.get(KEYS);
                let key = if suffix.contains("general.") || suffix.contains("tokenizer.") {
                    suffix.to_string()
                } else {
                    format!("{arch}.{suffix}")
                };
                match metadata.iter_mut().find(|(k, _)| *k == key) {
                    Some(kv) => kv.1 = value.clone(),
                    None => metadata.push((key, value.clone())),
                }
                edited = true;
            }
            Op::Remove { at } if !metadata.is_empty() => {
                metadata.remove(at.index(metadata.len()));
                edited = true;
            }
            _ => {}
        }
    }
    let mut bytes = if edited {
        rewrite(&seed.file, &seed.bytes, &metadata)
    } else {
        seed.bytes.clone()
    };
    // Field offsets hold for the unedited header only.
    let fields = if edited {
        header_fields_or_empty(&bytes)
    } else {
        seed.fields.clone()
    };
    for op in &case.ops {
        match op {
            Op::Field { at, value } if !fields.is_empty() => {
                let (offset, width) = fields[at.index(fields.len())];
                if offset + width <= bytes.len() {
                    bytes[offset..offset + width].copy_from_slice(&value.to_le_bytes()[..width]);
                }
            }
            Op::Flip { at, xor } if !bytes.is_empty() => {
                let i = at.index(bytes.len());
                bytes[i] ^= xor;
            }
            Op::Insert { at, bytes: extra } => {
                let i = at.index(bytes.len() + 1);
                bytes.splice(i..i, extra.iter().copied());
            }
            Op::Cut { at } => {
                let i = at.index(bytes.len() + 1);
                bytes.truncate(i);
            }
            _ => {}
        }
    }
    (seed.name.to_string(), bytes)
}

/// [`header_fields`] of a rewritten header (well-formed: the rewrite writes every value).
fn header_fields_or_empty(bytes: &[u8]) -> Vec<(usize, usize)> {
    catch_unwind(|| header_fields(bytes)).unwrap_or_default()
}

// ---- the check ------------------------------------------------------------------------------

/// What went wrong with one case; `Ok` holds the first broken rule (or "valid"/"unreadable").
fn check(bytes: &[u8]) -> Result<&'static str, String> {
    let started = Instant::now();
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        peak_allocation(|| match GgufFile::from_bytes("fuzz.gguf", bytes) {
            Err(e) => {
                let _ = e.to_string();
                "unreadable"
            }
            Ok(file) => {
                let rule = file.broken_rule().map_or("valid", |(rule, e)| {
                    let _ = e.to_string();
                    rule.name
                });
                let report = ModelReport::from_gguf(&file);
                let _ = report.to_string();
                rule
            }
        })
    }));
    let elapsed = started.elapsed();
    let (outcome, peak) = outcome.map_err(|p| {
        let message = p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        format!("panicked: {message}")
    })?;
    let limit = ALLOC_FACTOR * bytes.len() + (1 << 20);
    if peak > limit {
        return Err(format!(
            "allocated {peak} bytes at once for a {}-byte input (limit {limit})",
            bytes.len()
        ));
    }
    if elapsed > CASE_LIMIT {
        return Err(format!("took {elapsed:?}"));
    }
    Ok(outcome)
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn reader_and_validator_survive_mutations() {
    let budget = Duration::from_secs(env_u64("HYPURA_FUZZ_SECS").unwrap_or(20));
    let seed = env_u64("HYPURA_FUZZ_SEED").unwrap_or(0x6879_7075_7261);
    let (done, finished) = mpsc::channel();
    // The cases run on their own thread so that a hang fails the test instead of blocking it.
    std::thread::spawn(move || {
        let seeds = corpus();
        let mut key = [0u8; 32];
        key[..8].copy_from_slice(&seed.to_le_bytes());
        let rng = TestRng::from_seed(RngAlgorithm::XorShift, &key[..16]);
        let mut runner = TestRunner::new_with_rng(Config::default(), rng);
        let strategy = case();
        let started = Instant::now();
        let mut cases = 0u64;
        let mut outcomes = std::collections::BTreeMap::<&str, u64>::new();
        let mut failure = None;
        while started.elapsed() < budget {
            let mut tree = strategy.new_tree(&mut runner).expect("a case");
            let (_, bytes) = build(&seeds, &tree.current());
            cases += 1;
            match check(&bytes) {
                Ok(outcome) => *outcomes.entry(outcome).or_default() += 1,
                Err(_) => {
                    // Shrink: keep simplifying while the case still fails.
                    let mut smallest = tree.current();
                    let mut reason = check(&build(&seeds, &smallest).1).unwrap_err();
                    while tree.simplify() {
                        match check(&build(&seeds, &tree.current()).1) {
                            Err(why) => {
                                smallest = tree.current();
                                reason = why;
                            }
                            Ok(_) => {
                                if !tree.complicate() {
                                    break;
                                }
                            }
                        }
                    }
                    let (seed_name, _) = build(&seeds, &smallest);
                    failure = Some(format!(
                        "case {cases} on seed {seed_name} failed: {reason}\nshrunk: {smallest:#?}"
                    ));
                    break;
                }
            }
        }
        let _ = done.send((cases, started.elapsed(), outcomes, failure, seeds.len()));
    });
    let (cases, elapsed, outcomes, failure, n_seeds) = finished
        .recv_timeout(budget + Duration::from_secs(60))
        .expect("the fuzz loop hung (a case ran for more than a minute)");
    eprintln!(
        "fuzz: {cases} cases in {:.1} s over {n_seeds} seeds ({:.0}/s); outcomes: {outcomes:?}",
        elapsed.as_secs_f64(),
        cases as f64 / elapsed.as_secs_f64()
    );
    if let Some(failure) = failure {
        panic!("{failure}");
    }
    // The mutations reach the validator's rules, not only the reader's errors.
    assert!(
        outcomes
            .keys()
            .filter(|k| !["unreadable", "valid"].contains(k))
            .count()
            >= 10,
        "{outcomes:?}"
    );
}

#[test]
fn allocation_accounting_sees_allocations() {
    let (v, peak) = peak_allocation(|| vec![1u8; 10 << 20]);
    assert_eq!(v.len(), 10 << 20);
    assert!(peak >= 10 << 20, "{peak}");
    let err = check(&[0u8; 0]);
    assert_eq!(err, Ok("unreadable"));
}

#[test]
fn count_fields_claiming_2_to_the_60_are_errors() {
    // Every count and length field of every seed's header, set to 2^60 (and u64::MAX): an
    // error each time, never an allocation beyond the bound.
    for seed in corpus() {
        let wide: Vec<usize> = seed
            .fields
            .iter()
            .filter(|&&(_, width)| width == 8)
            .map(|&(at, _)| at)
            .collect();
        // SmolLM2 has some 1,500 such fields: a spread of 150 of them.
        let step = (wide.len() / 150).max(1);
        for &at in wide.iter().step_by(step) {
            for value in [1u64 << 60, u64::MAX] {
                let mut bytes = seed.bytes.clone();
                bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
                match check(&bytes) {
                    Ok(_) => {}
                    Err(why) => panic!("{}: field at {at} = {value}: {why}", seed.name),
                }
            }
        }
    }
}
