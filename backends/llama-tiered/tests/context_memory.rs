//! What a context costs beside the weights, measured before the weights are
//! loaded (`tiered::context_memory`, llama.cpp's `no_alloc`), checked
//! against the model's shape and against real contexts.
use std::path::Path;
use std::sync::Mutex;
use std::time::Instant;

use hypura_gguf::GgufFile;
use hypura_synth::{self as synth, SynthSpec};
use llama_tiered::llama::{gpu_devices, Batch, ContextParams};
use llama_tiered::tiered::{
    context_memory, ContextMemory, GpuShare, Mode, PlannedLoad, TieredModel, TieredParams,
};
use llama_tiered::{test_models, EngineError};

/// The context of the figures below: 2048 tokens shared by 4 sequences.
fn four_sequences(n_ctx: u32) -> ContextParams {
    ContextParams {
        n_ctx,
        n_seq_max: 4,
        ..Default::default()
    }
}

/// Bytes of f16 K and V per token of context, from the GGUF's shape.
fn kv_bytes_per_token(file: &GgufFile) -> u64 {
    let key = |suffix: &str| file.arch_u64(suffix).expect(suffix);
    let head_dim = key("embedding_length") / key("attention.head_count");
    key("block_count") * key("attention.head_count_kv") * head_dim * 2 * 2
}

fn smollm2_kv_bytes_per_token() -> u64 {
    kv_bytes_per_token(&GgufFile::open(test_models::smollm2()).unwrap())
}

/// A line of a `/proc` file such as `VmRSS:  1234 kB` or `rchar: 56`.
fn proc_field(file: &str, field: &str) -> u64 {
    let text = std::fs::read_to_string(file).unwrap();
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .unwrap_or_else(|| panic!("{field} not in {file}"));
    line.split_whitespace().next().unwrap().parse().unwrap()
}

fn rss_bytes() -> u64 {
    proc_field("/proc/self/status", "VmRSS") * 1024
}

/// Bytes this thread read through read(2)-like calls (page cache included).
fn thread_read_bytes() -> u64 {
    proc_field("/proc/thread-self/io", "rchar")
}

/// Serialises this file's tests: they watch the process's RSS (a test
/// measuring it while another frees a model read a smaller delta), or load
/// real models. Every test takes it first.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn within(a: u64, b: u64, fraction: f64) -> bool {
    (a as f64 - b as f64).abs() <= fraction * b as f64
}

#[test]
fn a_cpu_context_costs_its_kv_cache_and_more_in_ram() {
    let _serial = serial();
    let per_token = smollm2_kv_bytes_per_token();
    assert_eq!(
        per_token, 23_040,
        "30 layers × 3 KV heads × 64 × (K + V) × 2 bytes"
    );
    let kv = 2048 * per_token;
    let m = context_memory(
        &test_models::smollm2(),
        &TieredParams::default(),
        &[four_sequences(2048)],
    )
    .unwrap();
    eprintln!(
        "SmolLM2 n_ctx 2048 × 4 seqs: {m:?} (KV {:.2} MiB, compute {:.2} MiB)",
        m.kv_bytes as f64 / 1048576.0,
        m.compute_bytes as f64 / 1048576.0
    );
    assert_eq!(m.gpu_bytes, 0);
    // llama.cpp logs MiB with two decimals.
    assert!(m.kv_bytes.abs_diff(kv) <= 8 << 10, "{} vs {kv}", m.kv_bytes);
    assert!(m.compute_bytes > 0);
    assert!(m.ram_bytes > kv, "{} <= {kv}", m.ram_bytes);
    // The rest is the output buffer: logits of one token per sequence.
    let n_vocab = GgufFile::open(test_models::smollm2())
        .unwrap()
        .get_array("tokenizer.ggml.tokens")
        .unwrap()
        .len() as u64;
    assert_eq!(m.ram_bytes - m.kv_bytes - m.compute_bytes, 4 * n_vocab * 4);
}

#[test]
fn doubling_the_context_grows_ram_by_at_least_the_kv_growth() {
    let _serial = serial();
    let path = test_models::smollm2();
    let params = TieredParams::default();
    let measure = |contexts: &[ContextParams]| context_memory(&path, &params, contexts).unwrap();
    let small = measure(&[four_sequences(2048)]);
    let large = measure(&[four_sequences(4096)]);
    let kv_growth = 2048 * smollm2_kv_bytes_per_token();
    assert!(
        large.ram_bytes >= small.ram_bytes + kv_growth - (16 << 10),
        "{small:?} → {large:?}: less than {kv_growth} more"
    );
    // Several contexts are summed.
    let both = measure(&[four_sequences(2048), four_sequences(4096)]);
    assert_eq!(both.ram_bytes, small.ram_bytes + large.ram_bytes);
    assert_eq!(both.kv_bytes, small.kv_bytes + large.kv_bytes);
}

/// `context_memory` for `params`, then a real load and context with the
/// same parameters: what llama.cpp logged allocating, and the RSS growth.
fn predicted_and_real(
    params: &TieredParams,
    context: &ContextParams,
) -> (ContextMemory, ContextMemory) {
    let path = test_models::smollm2();
    let predicted = context_memory(&path, params, std::slice::from_ref(context)).unwrap();
    let started = Instant::now();
    let model = TieredModel::load(&path, params).unwrap();
    let load = started.elapsed();
    let before = rss_bytes();
    let (mut ctx, real) = model.new_context_measured(context).unwrap();
    let after_creation = rss_bytes();
    // A full ubatch (the size the compute buffers are reserved for): a
    // prompt (logits of its last token), then every token with logits (the
    // output buffer then grows to 512 rows of logits).
    let decode = |ctx: &mut llama_tiered::llama::Context, all_logits: bool| {
        ctx.clear_all();
        let mut batch = Batch::new(512);
        for pos in 0..512 {
            batch
                .push(1 + pos % 100, pos, 0, all_logits || pos == 511)
                .unwrap();
        }
        ctx.decode(&batch).unwrap();
        rss_bytes().saturating_sub(before) as f64 / 1048576.0
    };
    let after_prompt = decode(&mut ctx, false);
    let after_all_logits = decode(&mut ctx, true);
    eprintln!(
        "{:?} (real load {load:?}): predicted {predicted:?}, real {real:?}; predicted RAM {:.1} MiB; RSS growth: {:.1} MiB at creation, {after_prompt:.1} MiB after a 512-token prompt, {after_all_logits:.1} MiB after 512 tokens with logits",
        model.mode(),
        predicted.ram_bytes as f64 / 1048576.0,
        after_creation.saturating_sub(before) as f64 / 1048576.0,
    );
    (predicted, real)
}

#[test]
fn the_prediction_matches_what_a_real_context_allocates() {
    let _serial = serial();
    let (predicted, real) = predicted_and_real(&TieredParams::default(), &four_sequences(2048));
    assert!(
        within(predicted.ram_bytes, real.ram_bytes, 0.03),
        "{predicted:?} vs {real:?}"
    );
    assert_eq!(predicted.gpu_bytes, real.gpu_bytes);
    assert!(
        within(predicted.kv_bytes, real.kv_bytes, 0.01),
        "{predicted:?} vs {real:?}"
    );
    assert!(
        within(predicted.compute_bytes, real.compute_bytes, 0.03),
        "{predicted:?} vs {real:?}"
    );
}

#[test]
fn a_streamed_placement_is_measured_as_loaded() {
    let _serial = serial();
    let file = GgufFile::open(test_models::smollm2()).unwrap();
    let plan = PlannedLoad::fixed(&file, Mode::DenseFfnStreaming, GpuShare::None, None);
    let streamed = TieredParams {
        plan: Some(plan.unwrap()),
        ..Default::default()
    };
    let (predicted, real) = predicted_and_real(&streamed, &four_sequences(2048));
    assert!(
        within(predicted.ram_bytes, real.ram_bytes, 0.03),
        "{predicted:?} vs {real:?}"
    );
    assert_eq!(predicted.gpu_bytes, 0);
    // Where host weights live does not change a CPU context's buffers.
    let resident = context_memory(
        &test_models::smollm2(),
        &TieredParams::default(),
        &[four_sequences(2048)],
    )
    .unwrap();
    // (The metadata is a reading of this process's RSS: not compared.)
    let buffers = |m: ContextMemory| ContextMemory {
        metadata_bytes: 0,
        ..m
    };
    assert_eq!(buffers(predicted), buffers(resident));
}

/// Measured in a process of its own: the metadata is a reading of the
/// process's RSS, and in a process where other tests have loaded and freed
/// models, the allocator hands out pages already resident (0.96 MB read
/// once here, against a few MB in a fresh process).
#[test]
fn the_models_metadata_is_measured_beside_its_buffers() {
    let _serial = serial();
    if std::env::var_os("HYPURA_METADATA_CHILD").is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "the_models_metadata_is_measured_beside_its_buffers",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env("HYPURA_METADATA_CHILD", "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // The child ran the measurement (not a filter that matched nothing).
        assert!(String::from_utf8_lossy(&out.stdout).contains("1 passed"));
        return;
    }
    let m = context_memory(
        &test_models::smollm2(),
        &TieredParams::default(),
        &[four_sequences(2048)],
    )
    .unwrap();
    // SmolLM2's vocabulary of 49,152 tokens and its header alone take
    // megabytes; the KV cache and compute buffers are not in it (no_alloc).
    assert!(
        (1 << 20..m.kv_bytes + m.compute_bytes).contains(&m.metadata_bytes),
        "{m:?}"
    );
    assert_eq!(
        m.ram_other_bytes(),
        m.ram_bytes - m.ram_kv_bytes + m.metadata_bytes
    );
}

#[test]
fn measuring_reads_no_tensor_data() {
    let _serial = serial();
    let path = test_models::smollm2();
    let started = Instant::now();
    let file = GgufFile::open_validated(&path).unwrap();
    let header = started.elapsed();
    let read_before = thread_read_bytes();
    let started = Instant::now();
    context_memory(&path, &TieredParams::default(), &[]).unwrap();
    let load = started.elapsed();
    let read = thread_read_bytes() - read_before;
    let started = Instant::now();
    context_memory(&path, &TieredParams::default(), &[four_sequences(2048)]).unwrap();
    let with_context = started.elapsed();
    eprintln!(
        "no_alloc load of SmolLM2: {load:?} (hypura's header check alone {header:?}), with one context: {with_context:?}; read {read} bytes (header {} bytes, file {} bytes)",
        file.data_offset(),
        file.file_bytes()
    );
    // The header is read twice (hypura's checks, then llama.cpp): nothing
    // near the 98 MB of weights.
    assert!(read < 4 * file.data_offset(), "read {read} bytes");
}

#[test]
fn a_bad_path_is_a_clear_error() {
    let _serial = serial();
    let missing = Path::new("/nonexistent/model.gguf");
    let err =
        context_memory(missing, &TieredParams::default(), &[four_sequences(2048)]).unwrap_err();
    assert!(matches!(err, EngineError::Gguf(_)), "{err:?}");
    assert!(err.to_string().contains("/nonexistent/model.gguf"), "{err}");

    let not_gguf = std::env::temp_dir().join(format!("hypura-ctxmem-{}.gguf", std::process::id()));
    std::fs::write(&not_gguf, b"not a model").unwrap();
    let err =
        context_memory(&not_gguf, &TieredParams::default(), &[four_sequences(2048)]).unwrap_err();
    std::fs::remove_file(&not_gguf).ok();
    assert!(matches!(err, EngineError::Gguf(_)), "{err:?}");
}

/// On a GPU: KV cache and compute buffers split between RAM and GPU memory
/// as a real load allocates them, for whole-GPU, partial and streamed
/// placements (the measured KV cache is split by its layers' devices).
#[test]
fn gpu_placements_are_measured_as_loaded() {
    let _serial = serial();
    if gpu_devices().is_empty() {
        eprintln!("skipped: no GPU in this build");
        return;
    }
    let path = synth::cached::model(&SynthSpec::tiny_llama().with_layers(4)).unwrap();
    let context = ContextParams {
        n_ctx: 512,
        n_seq_max: 2,
        ..Default::default()
    };
    for (mode, gpu) in [
        (Mode::FullResident, GpuShare::Layers(99)),
        (Mode::FullResident, GpuShare::Layers(3)),
        (Mode::DenseFfnStreaming, GpuShare::Layers(99)),
    ] {
        let file = GgufFile::open(&path).unwrap();
        let params = TieredParams {
            plan: Some(PlannedLoad::fixed(&file, mode, gpu, None).unwrap()),
            ..Default::default()
        };
        let predicted = context_memory(&path, &params, std::slice::from_ref(&context)).unwrap();
        let model = TieredModel::load(&path, &params).unwrap();
        let (_ctx, real) = model.new_context_measured(&context).unwrap();
        eprintln!("{mode:?} {gpu:?}: predicted {predicted:?}, real {real:?}");
        assert!(predicted.gpu_bytes > 0, "{mode:?} {gpu:?}: {predicted:?}");
        assert!(
            within(predicted.gpu_bytes, real.gpu_bytes, 0.03),
            "{mode:?} {gpu:?}: {predicted:?} vs {real:?}"
        );
        assert!(
            within(predicted.ram_bytes, real.ram_bytes, 0.03),
            "{mode:?} {gpu:?}: {predicted:?} vs {real:?}"
        );
        assert_eq!(predicted.kv_bytes, real.kv_bytes, "{mode:?} {gpu:?}");
    }
    std::fs::remove_file(&path).ok();
}

/// A generation context reserves its compute buffers for one row of
/// logits per sequence (`n_outputs_max`), not one per token of a pass:
/// SmolLM2's 49,152-token vocabulary at a 512-token pass is 100 MB of
/// output layer llama.cpp's default reserves and never uses. A batch asking
/// for more rows than the context gives is refused, not computed (llama.cpp
/// would abort), and the context decodes on.
#[test]
fn one_output_per_sequence_shrinks_the_compute_buffers_and_more_is_refused() {
    let _serial = serial();
    let path = test_models::smollm2();
    let params = TieredParams::default();
    let every = four_sequences(2048);
    let one_each = ContextParams {
        n_outputs_max: 4,
        ..four_sequences(2048)
    };
    let measure =
        |c: &ContextParams| context_memory(&path, &params, std::slice::from_ref(c)).unwrap();
    let (all, few) = (measure(&every), measure(&one_each));
    let n_vocab = GgufFile::open(&path)
        .unwrap()
        .get_array("tokenizer.ggml.tokens")
        .unwrap()
        .len() as u64;
    // The output layer's result: 512 rows of logits against 4.
    let saved = (512 - 4) * n_vocab * 4;
    eprintln!("every token's logits {all:?}, one a sequence {few:?}, {saved} bytes of logits");
    assert!(
        all.compute_bytes >= few.compute_bytes + saved * 9 / 10,
        "{all:?} vs {few:?}: less than {saved} saved"
    );

    let model = TieredModel::load(&path, &params).unwrap();
    let mut ctx = model.new_context(&one_each).unwrap();
    let mut batch = Batch::new(8);
    for pos in 0..5 {
        batch.push(1 + pos, pos, 0, true).unwrap();
    }
    let err = ctx.decode(&batch).unwrap_err();
    assert!(err.to_string().contains("at most 4"), "{err}");
    batch.clear();
    for seq in 0..4 {
        batch.push(1, 0, seq, true).unwrap();
    }
    ctx.decode(&batch).unwrap();
    assert_eq!(ctx.logits(3).unwrap().len(), n_vocab as usize);
}
