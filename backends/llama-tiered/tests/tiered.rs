//! Tiered weights: every streaming mode gives exactly the full-resident
//! tokens and logits, within its budget, reading only what it must.
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use hypura_gguf::GgufFile;
use hypura_scheduler::reads::MeasuredReads;
use hypura_synth::{self as synth, SynthSpec};
use llama_tiered::engine::generate::{generate, GenerateParams};
use llama_tiered::engine::prompt;
use llama_tiered::llama::{Batch, Context, ContextParams, SamplingParams};
use llama_tiered::tiered::{
    GpuShare, Mode, PlannedLoad, Streamer, Tier, TieredModel, TieredParams,
};
use llama_tiered::{test_models, EngineError};

const PROMPT: &str = "The history of the city of Paris begins";

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("hypura-tiered-{}-{name}", std::process::id()))
}

/// The SmolLM2-derived MoE (4 experts, 2 used), written once and kept.
fn smollm2_moe() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        synth::cached::derived_moe(&test_models::smollm2(), 4, 2, 0.01, 7).expect("derive MoE")
    })
}

fn tiny_mixtral_q4k() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        synth::cached::model(&SynthSpec::tiny_mixtral().with_layers(4)).expect("write tiny mixtral")
    })
}

fn tiny_llama_q4k() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        synth::cached::model(&SynthSpec::tiny_llama().with_layers(4)).expect("write tiny llama")
    })
}

/// The planner's placement with `mode` fixed, no GPU, and `ram_budget_bytes`
/// for weights (resident + stream cache; `None`: everything cached).
fn planned(
    file: &GgufFile,
    mode: Mode,
    ram_budget_bytes: Option<u64>,
) -> Result<PlannedLoad, EngineError> {
    PlannedLoad::fixed(file, mode, GpuShare::None, ram_budget_bytes)
}

/// Loads with weights in file layout (no CPU repacking), so every mode runs
/// the same kernels and results can be compared bit for bit. (SmolLM2's
/// Q4_1 has no repacked form; the synthetic Q4_K models do.)
fn load(path: &Path, mode: Mode, ram_budget_bytes: Option<u64>) -> TieredModel {
    load_with(path, mode, ram_budget_bytes, true)
}

fn load_with(
    path: &Path,
    mode: Mode,
    ram_budget_bytes: Option<u64>,
    prefetch: bool,
) -> TieredModel {
    // Co-activation statistics go to a scratch folder, never the user's cache.
    let file = GgufFile::open(path).unwrap();
    let params = TieredParams {
        plan: Some(planned(&file, mode, ram_budget_bytes).expect("a fixed plan")),
        no_repack: true,
        prefetch,
        cache_dir: Some(temp_path("cache")),
        ..Default::default()
    };
    TieredModel::load(path, &params).expect("tiered load")
}

fn ctx(m: &TieredModel) -> Context {
    m.new_context(&ContextParams {
        n_ctx: 512,
        n_threads: 2,
        ..Default::default()
    })
    .expect("context")
}

/// Greedy decode one token at a time, recording tokens and the logits of
/// every step, calling `after_step` after each decode.
fn greedy_trace(
    m: &TieredModel,
    n: usize,
    after_step: &mut dyn FnMut(&TieredModel),
) -> (Vec<i32>, Vec<Vec<f32>>) {
    let mut c = ctx(m);
    let tokens = prompt::tokenize_raw(&m.model, PROMPT).unwrap();
    let mut batch = Batch::new(tokens.len());
    for (i, &t) in tokens.iter().enumerate() {
        batch.push(t, i as i32, 0, i + 1 == tokens.len()).unwrap();
    }
    c.decode(&batch).unwrap();
    after_step(m);
    let mut out = Vec::new();
    let mut all_logits = Vec::new();
    for step in 0..n {
        let pos = (tokens.len() + step) as i32;
        let logits = c.logits(-1).unwrap().to_vec();
        let next = logits
            .iter()
            .enumerate()
            .fold((0, f32::MIN), |b, (i, &l)| if l > b.1 { (i, l) } else { b })
            .0 as i32;
        all_logits.push(logits);
        out.push(next);
        let mut one = Batch::new(1);
        one.push(next, pos, 0, true).unwrap();
        c.decode(&one).unwrap();
        after_step(m);
    }
    (out, all_logits)
}

fn max_abs_diff(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs()))
        .fold(0.0, f32::max)
}

/// Bytes of one streamed unit: the largest per-layer set the streamer needs.
fn layer_stream_bytes(path: &Path, mode: Mode) -> u64 {
    let file = GgufFile::open(path).unwrap();
    let mut per_layer = std::collections::HashMap::new();
    for t in file.tensors() {
        if llama_tiered::tiered::placement::is_streamed(mode, &t.name) {
            *per_layer
                .entry(hypura_scheduler::roles::layer_index(&t.name).unwrap())
                .or_insert(0u64) += t.n_bytes;
        }
    }
    per_layer.values().copied().max().unwrap()
}

/// Checks the exactness of `mode` against full-resident under a budget of
/// `extra_layers` layers' worth of streamed weights beyond the minimum, and
/// that the cache never exceeds it (after every token, by the streamer's
/// accounting and by the kernel's page residency).
fn assert_exact_and_bounded(path: &Path, mode: Mode, extra_layers: f64) {
    let full = load(path, Mode::FullResident, None);
    let (want_tokens, want_logits) = greedy_trace(&full, 64, &mut |_| {});
    drop(full);

    let probe = load(path, mode, None);
    let resident = probe.resident_bytes;
    drop(probe);
    let layer = layer_stream_bytes(path, mode);
    let cache_budget = layer + (layer as f64 * extra_layers) as u64;
    let streamed = load(path, mode, Some(resident + cache_budget));
    assert_eq!(streamed.mode(), mode);
    // Boundary pages of evicted slices may stay: two per slice at most.
    let slices = GgufFile::open(path)
        .unwrap()
        .tensors()
        .iter()
        .filter(|t| llama_tiered::tiered::placement::is_streamed(mode, &t.name))
        .map(|t| {
            if mode == Mode::ExpertStreaming {
                t.dims[2]
            } else {
                1
            }
        })
        .sum::<u64>();
    let (tokens, logits) = greedy_trace(&streamed, 64, &mut |m| {
        let stats = m.stats();
        assert!(
            stats.cache_bytes <= cache_budget,
            "cache {} > budget {cache_budget}",
            stats.cache_bytes
        );
        let kernel = m.streamer.as_ref().unwrap().region_resident_bytes();
        assert!(
            kernel <= cache_budget + slices * 2 * 4096,
            "region holds {kernel} bytes, budget {cache_budget}"
        );
    });
    let stats = streamed.stats();
    assert_eq!(
        tokens, want_tokens,
        "{mode} tokens differ from full-resident"
    );
    let diff = max_abs_diff(&logits, &want_logits);
    assert!(diff <= 1e-4, "{mode}: logits differ by {diff}");
    assert!(
        stats.evictions > 64,
        "the budget should force evictions every token: {stats:?}"
    );
    // The loads those evictions made room for took the evicted pages
    // (exact all the same: checked above), for no more than they read.
    assert!(
        stats.recycled_bytes > 0 && stats.recycled_bytes <= stats.nvme_bytes_read,
        "{stats:?}"
    );
    assert!(stats.cache_peak_bytes <= cache_budget);
    if mode == Mode::DenseFfnStreaming || extra_layers >= 4.0 {
        assert!(
            stats.prefetch_hits > 0,
            "prefetch should have been used: {stats:?}"
        );
    }
}

#[test]
fn dense_ffn_streaming_is_exact_on_smollm2() {
    assert_exact_and_bounded(&test_models::smollm2(), Mode::DenseFfnStreaming, 2.0);
}

#[test]
fn expert_streaming_is_exact_on_the_smollm2_moe() {
    assert_exact_and_bounded(smollm2_moe(), Mode::ExpertStreaming, 0.5);
}

#[test]
fn expert_streaming_with_room_to_prefetch_is_exact() {
    // A third of the experts fit: co-activation prefetch gets room to work.
    assert_exact_and_bounded(smollm2_moe(), Mode::ExpertStreaming, 9.0);
}

#[test]
fn expert_streaming_is_exact_on_a_synthetic_mixtral() {
    assert_exact_and_bounded(tiny_mixtral_q4k(), Mode::ExpertStreaming, 0.5);
}

#[test]
fn dense_ffn_streaming_is_exact_on_a_synthetic_llama() {
    assert_exact_and_bounded(tiny_llama_q4k(), Mode::DenseFfnStreaming, 1.0);
}

#[test]
fn loading_a_stream_placement_reads_no_stream_bytes() {
    let path = smollm2_moe();
    let m = load(path, Mode::ExpertStreaming, None);
    let file = GgufFile::open(path).unwrap();
    let stream_bytes: u64 = file
        .tensors()
        .iter()
        .filter(|t| m.placement.tier(&t.name) == Some(Tier::Stream))
        .map(|t| t.n_bytes)
        .sum();
    assert!(
        stream_bytes > file.tensor_bytes() / 2,
        "experts dominate the file"
    );
    // Header plus resident tensors read; every STREAM byte llama.cpp asked for was skipped.
    assert!(
        m.load_report.stream_bytes_skipped >= stream_bytes,
        "{:?}",
        m.load_report
    );
    let resident = file.tensor_bytes() - stream_bytes;
    assert!(m.load_report.bytes_read >= resident, "{:?}", m.load_report);
    // The header is parsed twice (hypura's reader, then llama.cpp's).
    let bound = resident + resident / 100 + 2 * file.data_offset();
    assert!(
        m.load_report.bytes_read <= bound,
        "{:?} > {bound}",
        m.load_report
    );
    assert_eq!(
        m.streamer.as_ref().unwrap().region_resident_bytes(),
        0,
        "no STREAM page touched at load"
    );
    assert_eq!(m.stats().nvme_bytes_read, 0);
}

#[test]
fn bytes_read_equal_the_slices_that_missed() {
    let path = smollm2_moe();
    // Budget: all experts, so nothing is evicted; no prefetch, so every read is a miss's.
    let m = load_with(path, Mode::ExpertStreaming, None, false);
    let mut c = ctx(&m);
    let tokens = prompt::tokenize_raw(&m.model, PROMPT).unwrap();
    let params = GenerateParams {
        sampling: SamplingParams::greedy(),
        max_tokens: Some(16),
        stop: vec![],
        cache_prompt: true,
    };
    generate(&mut c, 0, &tokens, &params, &mut |_| true).unwrap();
    let stats = m.stats();
    assert_eq!(stats.evictions, 0);
    // Each miss read its expert's three slices, page-rounded, exactly once.
    let file = GgufFile::open(path).unwrap();
    let slice = |layer: u32, e: u64| -> Vec<(u64, u64)> {
        ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"]
            .iter()
            .map(|n| {
                let t = file.tensor(&format!("blk.{layer}.{n}.weight")).unwrap();
                let s = t.n_bytes / 4;
                (t.offset_in_file + e * s, t.offset_in_file + (e + 1) * s)
            })
            .collect()
    };
    let per_unit = Streamer::unit_read_bytes(&slice(0, 0));
    let all_same =
        (0..30).all(|l| (0..4).all(|e| Streamer::unit_read_bytes(&slice(l, e)) == per_unit));
    assert!(all_same);
    assert_eq!(stats.nvme_bytes_read, stats.expert_misses * per_unit);
    assert_eq!(
        stats.cache_bytes,
        stats.expert_misses * (slice(0, 0).iter().map(|r| r.1 - r.0).sum::<u64>())
    );
    assert!(stats.expert_hits > 0 && stats.expert_misses > 0);
}

#[test]
fn a_model_file_truncated_after_load_gives_a_clear_error() {
    let path = temp_path("truncate-me.gguf");
    std::fs::copy(smollm2_moe(), &path).unwrap();
    let m = load(&path, Mode::ExpertStreaming, None);
    let len = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len / 2)
        .unwrap();
    let mut c = ctx(&m);
    let tokens = prompt::tokenize_raw(&m.model, PROMPT).unwrap();
    let err = generate(
        &mut c,
        0,
        &tokens,
        &GenerateParams {
            max_tokens: Some(4),
            ..Default::default()
        },
        &mut |_| true,
    )
    .unwrap_err();
    assert!(matches!(err, EngineError::Stream(_)), "{err}");
    assert!(err.to_string().contains("truncated"), "{err}");
    std::fs::remove_file(&path).ok();
}

#[test]
fn a_budget_below_one_layer_is_refused_with_the_minimum() {
    let path = smollm2_moe();
    let probe = load(path, Mode::ExpertStreaming, None);
    let file = GgufFile::open(path).unwrap();
    let plan = planned(
        &file,
        Mode::ExpertStreaming,
        Some(probe.resident_bytes + 1000),
    )
    .unwrap();
    let err = TieredModel::load(
        path,
        &TieredParams {
            plan: Some(plan),
            ..Default::default()
        },
    )
    .err()
    .expect("too small");
    assert!(err.to_string().contains("one layer may need"), "{err}");
}

#[test]
fn expert_streaming_needs_experts() {
    let file = GgufFile::open(test_models::smollm2()).unwrap();
    let err = planned(&file, Mode::ExpertStreaming, None).expect_err("dense model");
    assert!(err.to_string().contains("mixture-of-experts"), "{err}");
}

#[test]
fn streamed_model_runs_in_a_shared_context() {
    // Sanity: Arc<Model> from a tiered load works with the ordinary engine API.
    let m = load(&test_models::smollm2(), Mode::DenseFfnStreaming, None);
    let mut c = ctx(&m);
    let tokens = prompt::tokenize_raw(&m.model, "The capital of France is").unwrap();
    let params = GenerateParams {
        sampling: SamplingParams::greedy(),
        max_tokens: Some(8),
        stop: vec![],
        cache_prompt: true,
    };
    let out = generate(&mut c, 0, &tokens, &params, &mut |_| true).unwrap();
    assert!(out.text.starts_with(" Paris."), "{:?}", out.text);
}

#[test]
fn two_threads_decode_one_streamed_model_at_once_exactly() {
    let reference = greedy_trace(
        &load(smollm2_moe(), Mode::FullResident, None),
        12,
        &mut |_| {},
    )
    .0;
    let probe = load(smollm2_moe(), Mode::ExpertStreaming, None);
    let minimum = probe.streamer.as_ref().unwrap().minimum_budget_bytes();
    let resident = probe.resident_bytes;
    drop(probe);
    // Tight: each thread pins a layer's experts, so evictions happen under both.
    let m = load(
        smollm2_moe(),
        Mode::ExpertStreaming,
        Some(resident + 3 * minimum),
    );
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| greedy_trace(&m, 12, &mut |_| {}).0);
        let b = s.spawn(|| greedy_trace(&m, 12, &mut |_| {}).0);
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(a, reference);
    assert_eq!(b, reference);
    let stats = m.stats();
    assert!(stats.evictions > 0, "the budget was tight: {stats:?}");
    assert!(stats.cache_bytes <= 3 * minimum, "{stats:?}");
}

#[test]
fn promotion_fills_the_cache_and_demotion_drops_it_without_changing_tokens() {
    let reference = greedy_trace(
        &load(&test_models::smollm2(), Mode::FullResident, None),
        10,
        &mut |_| {},
    )
    .0;
    let m = load_with(
        &test_models::smollm2(),
        Mode::DenseFfnStreaming,
        None,
        false,
    );
    let streamer = m.streamer.as_ref().unwrap();
    let minimum = streamer.minimum_budget_bytes();
    assert!(streamer
        .set_cache_budget(minimum - 1)
        .unwrap_err()
        .contains("below"));

    // Demoted: the smallest cache; every token reads the FFN of every layer.
    streamer.set_cache_budget(minimum).unwrap();
    assert_eq!(greedy_trace(&m, 10, &mut |_| {}).0, reference);
    let demoted = m.stats();
    assert!(demoted.cache_bytes <= minimum, "{demoted:?}");
    assert!(
        demoted.nvme_bytes_read >= 10 * streamer.stream_bytes(),
        "{demoted:?}"
    );

    // Promoted: the cache holds every unit once filled; decoding reads nothing.
    streamer.set_cache_budget(streamer.stream_bytes()).unwrap();
    let filled = streamer.fill();
    assert!(
        filled > 0 && filled <= streamer.stream_bytes() + 64 * 4096 * 30,
        "{filled}"
    );
    let before = m.stats();
    assert_eq!(before.cache_bytes, streamer.stream_bytes());
    assert_eq!(greedy_trace(&m, 10, &mut |_| {}).0, reference);
    assert_eq!(
        m.stats().nvme_bytes_read,
        before.nvme_bytes_read,
        "no I/O when full"
    );

    // Demoted again: the pages go back to the kernel at once.
    streamer.set_cache_budget(minimum).unwrap();
    assert!(m.stats().cache_bytes <= minimum);
    assert!(streamer.region_resident_bytes() <= minimum + 2 * 4096 * 3 * 30);
}

/// `a` and `b` alike to the last bit or two (JSON's decimal text does not
/// always parse back to the same `f64`).
fn assert_same_reads(a: &MeasuredReads, b: &MeasuredReads) {
    let fields = |r: &MeasuredReads| {
        [r.decode, r.prompt]
            .map(|t| [t.bytes, t.seconds, t.layer_requests, t.stall_seconds])
            .concat()
    };
    for (x, y) in fields(a).into_iter().zip(fields(b)) {
        assert!(
            (x - y).abs() <= 1e-12 * x.abs().max(y.abs()),
            "{a:?} against {b:?}"
        );
    }
}

#[test]
fn coactivation_statistics_and_read_rates_survive_a_restart() {
    let cache = temp_path("coact-restart");
    // Its own model file, so no other test's statistics are found under its key.
    let path =
        &synth::cached::model(&SynthSpec::tiny_mixtral().with_layers(4).with_seed(99)).unwrap();
    let file = GgufFile::open(path).unwrap();
    let params = TieredParams {
        plan: Some(planned(&file, Mode::ExpertStreaming, None).unwrap()),
        no_repack: true,
        cache_dir: Some(cache.clone()),
        ..Default::default()
    };
    let first = TieredModel::load(path, &params).unwrap();
    assert_eq!(first.streamer.as_ref().unwrap().coactivation().total(), 0);
    greedy_trace(&first, 8, &mut |_| {});
    let learned = first.streamer.as_ref().unwrap().coactivation();
    assert!(learned.total() > 0);
    let read = first.stats().measured_reads();
    assert!(
        read.decode.bytes > 0.0 && read.decode.seconds > 0.0,
        "{read:?}"
    );
    drop(first); // saves
    let saved = std::fs::read_dir(cache.join("coactivation"))
        .unwrap()
        .count();
    assert_eq!(saved, 1, "one statistics file saved");
    let reads_at =
        llama_tiered::tiered::reads::path(path, file.data_offset(), Some(&cache)).unwrap();
    let saved_reads = || llama_tiered::tiered::reads::load(&reads_at).expect("saved read rates");
    assert_same_reads(&saved_reads(), &read);
    let again = TieredModel::load(path, &params).unwrap();
    assert_eq!(
        again.streamer.as_ref().unwrap().coactivation(),
        learned,
        "restart starts warm"
    );
    drop(again);
    // A run that read nothing leaves the rates as they were.
    assert_same_reads(&saved_reads(), &read);
    std::fs::remove_dir_all(&cache).ok();
    std::fs::remove_file(path).ok();
}

#[test]
fn per_token_statistics_add_up_to_the_cumulative_ones() {
    let m = load_with(smollm2_moe(), Mode::ExpertStreaming, None, false);
    let mut last = m.stats();
    let mut per_token = Vec::new();
    greedy_trace(&m, 8, &mut |m| {
        let now = m.stats();
        per_token.push(now.since(&last));
        last = now;
    });
    let total = m.stats();
    let sum =
        |f: fn(&llama_tiered::tiered::StreamStats) -> u64| per_token.iter().map(f).sum::<u64>();
    assert_eq!(sum(|s| s.nvme_bytes_read), total.nvme_bytes_read);
    assert_eq!(sum(|s| s.expert_hits), total.expert_hits);
    assert_eq!(sum(|s| s.expert_misses), total.expert_misses);
    // After the prompt, each token looks up exactly 2 experts in each of 30
    // layers, but for layers whose experts were all cached (not asked).
    for s in &per_token[1..] {
        assert_eq!(
            s.expert_hits + s.expert_misses + 2 * s.resident_layer_skips,
            2 * 30,
            "{s:?}"
        );
    }
}

#[test]
fn statistics_report_resident_bytes_per_tier() {
    let path = test_models::smollm2();
    let tensor_bytes = GgufFile::open(&path).unwrap().tensor_bytes();
    let full = load(&path, Mode::FullResident, None);
    let stats = full.stats();
    assert_eq!(
        (stats.resident_gpu_bytes, stats.resident_ram_bytes),
        (0, tensor_bytes)
    );
    let streamed = load(&path, Mode::DenseFfnStreaming, None);
    greedy_trace(&streamed, 2, &mut |_| {});
    let stats = streamed.stats();
    assert!(stats.cache_bytes > 0);
    assert_eq!(stats.resident_gpu_bytes, 0);
    assert_eq!(
        stats.resident_ram_bytes,
        streamed.resident_bytes + stats.cache_bytes
    );
}

/// The hybrid placement in its CPU form: expert-streaming with the last
/// `resident_layers` layers' experts resident (RAM here; the GPU on a GPU
/// machine) and the other layers' experts streamed through `cache_bytes`.
fn hybrid(path: &Path, resident_layers: u32, cache_bytes: u64) -> TieredModel {
    let file = GgufFile::open(path).unwrap();
    let n_layer = file.arch_u64("block_count").unwrap() as u32;
    let mut plan = planned(&file, Mode::ExpertStreaming, None).unwrap();
    for (name, tier) in plan.placement.tiers.iter_mut() {
        let layer = hypura_scheduler::roles::layer_index(name);
        if *tier == Tier::Stream && layer.is_some_and(|l| l + resident_layers >= n_layer) {
            *tier = Tier::Ram;
        }
    }
    plan.stream_cache_bytes = cache_bytes;
    let params = TieredParams {
        plan: Some(plan),
        no_repack: true,
        prefetch: true,
        cache_dir: Some(temp_path("cache")),
        ..Default::default()
    };
    TieredModel::load(path, &params).expect("hybrid load")
}

#[test]
fn resident_expert_layers_beside_streamed_ones_are_exact() {
    let path = smollm2_moe();
    let full = load(path, Mode::FullResident, None);
    let (want_tokens, want_logits) = greedy_trace(&full, 32, &mut |_| {});
    drop(full);

    // 30 layers: the last 10 resident, 20 streamed through two layers' worth.
    let layer = layer_stream_bytes(path, Mode::ExpertStreaming);
    let m = hybrid(path, 10, 2 * layer);
    let streamer = m.streamer.as_ref().unwrap();
    assert_eq!(
        streamer.stream_bytes(),
        20 * layer,
        "units only for streamed layers"
    );
    assert_eq!(m.placement.stream_layers(), (0..20).collect::<Vec<u32>>());
    assert_eq!(
        m.placement.stream_patterns(),
        vec![r"^blk\.([0-9]|1[0-9])\.ffn_(gate|up|down|gate_up)_exps\.weight$".to_string()]
    );
    let (tokens, logits) = greedy_trace(&m, 32, &mut |_| {});
    assert_eq!(
        tokens, want_tokens,
        "hybrid tokens differ from full-resident"
    );
    let diff = max_abs_diff(&logits, &want_logits);
    assert!(diff <= 1e-4, "hybrid logits differ by {diff}");
    let stats = m.stats();
    assert!(stats.evictions > 0 && stats.expert_misses > 0, "{stats:?}");
    assert!(stats.cache_peak_bytes <= 2 * layer);
    // Resident layers hold their weights outside the stream cache.
    assert_eq!(m.ram_bytes, m.resident_bytes);
}

#[test]
fn a_layer_whose_experts_are_all_cached_is_not_asked_for() {
    let path = smollm2_moe();
    let full = load(path, Mode::FullResident, None);
    let (want_tokens, _) = greedy_trace(&full, 16, &mut |_| {});
    drop(full);

    let layer = layer_stream_bytes(path, Mode::ExpertStreaming);
    // A cache a layer short of every unit does not hold them all; one that
    // holds them all is what `bench` and `run` fill whole.
    assert!(!hybrid(path, 10, 19 * layer)
        .streamer
        .as_ref()
        .unwrap()
        .holds_every_unit());
    let m = hybrid(path, 10, 20 * layer);
    assert!(m.streamer.as_ref().unwrap().holds_every_unit());
    m.streamer.as_ref().unwrap().fill();
    assert_eq!(
        m.stats().cache_bytes,
        20 * layer,
        "every streamed unit cached"
    );
    let mut per_step = Vec::new();
    let mut before = m.stats();
    let (tokens, _) = greedy_trace(&m, 16, &mut |m| {
        let now = m.stats();
        per_step.push(now.since(&before));
        before = now;
    });
    assert_eq!(tokens, want_tokens);
    for step in &per_step {
        // Every streamed layer skipped (one per decode of one ubatch), no lookup, no read.
        assert_eq!(step.resident_layer_skips, 20, "{step:?}");
        assert_eq!(step.expert_hits + step.expert_misses, 0, "{step:?}");
        assert_eq!(step.nvme_bytes_read, 0, "{step:?}");
    }
}

/// A Qwen3-MoE layout (64 experts, 4 used, 4 layers; Q8_0, as its rows of
/// 64 are no K-quant block) routed as Qwen3's
/// measured statistics, trained on 2,048 tokens: a long prompt routes to
/// nearly every expert of every layer, as a real one does.
fn tiny_qwen3_routed() -> &'static Path {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let spec = SynthSpec {
            n_ctx_train: 2048,
            ..SynthSpec::tiny_qwen3_moe()
                .with_layers(4)
                .with_weight_type(llama_tiered::llama::gguf_write::GgmlType::Q8_0)
                .with_routing(synth::Routing::Qwen3)
        };
        synth::cached::model(&spec).expect("write tiny qwen3 moe")
    })
}

/// The benchmark's prompt repeated to `n` tokens.
fn long_prompt(m: &TieredModel, n: usize) -> Vec<i32> {
    let mut tokens = Vec::new();
    while tokens.len() < n {
        tokens.extend(prompt::tokenize_raw(&m.model, PROMPT).unwrap());
    }
    tokens.truncate(n);
    tokens
}

/// `prompt` in one decode call, computed in passes of `n_ubatch` tokens,
/// then `n` greedy tokens: their tokens and logits, and the stream's
/// counters over the prompt alone.
fn long_prompt_trace(
    m: &TieredModel,
    prompt: &[i32],
    n_ubatch: u32,
    n: usize,
) -> (Vec<i32>, Vec<Vec<f32>>, llama_tiered::tiered::StreamStats) {
    let mut c = m
        .new_context(&ContextParams {
            n_ctx: 2048,
            n_batch: prompt.len() as u32,
            n_ubatch,
            n_threads: 2,
            ..Default::default()
        })
        .expect("context");
    let mut batch = Batch::new(prompt.len());
    for (i, &t) in prompt.iter().enumerate() {
        batch.push(t, i as i32, 0, i + 1 == prompt.len()).unwrap();
    }
    let before = m.stats();
    c.decode(&batch).unwrap();
    let prompt_stats = m.stats().since(&before);
    let (mut tokens, mut all_logits) = (Vec::new(), Vec::new());
    for step in 0..n {
        let logits = c.logits(-1).unwrap().to_vec();
        let next = logits
            .iter()
            .enumerate()
            .fold((0, f32::MIN), |b, (i, &l)| if l > b.1 { (i, l) } else { b })
            .0 as i32;
        all_logits.push(logits);
        tokens.push(next);
        let mut one = Batch::new(1);
        one.push(next, (prompt.len() + step) as i32, 0, true)
            .unwrap();
        c.decode(&one).unwrap();
    }
    (tokens, all_logits, prompt_stats)
}

#[test]
fn a_long_prompt_with_streamed_experts_is_exact_and_reads_each_expert_at_most_once_a_pass() {
    let path = tiny_qwen3_routed();
    let full = load(path, Mode::FullResident, None);
    let prompt = long_prompt(&full, 1100);
    let one_pass = prompt.len() as u32;
    let want = [512, one_pass].map(|ub| long_prompt_trace(&full, &prompt, ub, 16));
    drop(full);

    let probe = load(path, Mode::ExpertStreaming, None);
    let (resident, stream_bytes) = (
        probe.resident_bytes,
        probe.streamer.as_ref().unwrap().stream_bytes(),
    );
    drop(probe);
    // A layer and a half: room for the experts a pass computes with and
    // the next layer's read ahead (the routing is skewed: a chunk uses
    // under half of a layer's experts), not for every layer's.
    let layer = layer_stream_bytes(path, Mode::ExpertStreaming);
    let cache = layer + layer / 2;
    assert!(cache < stream_bytes);
    // Each unit read once is its slices, page-rounded (the most a pass may read).
    let file = GgufFile::open(path).unwrap();
    let once: u64 = (0..4u32)
        .flat_map(|l| (0..64u64).map(move |e| (l, e)))
        .map(|(l, e)| {
            let slices: Vec<(u64, u64)> = ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"]
                .iter()
                .map(|n| {
                    let t = file.tensor(&format!("blk.{l}.{n}.weight")).unwrap();
                    let s = t.n_bytes / 64;
                    (t.offset_in_file + e * s, t.offset_in_file + (e + 1) * s)
                })
                .collect();
            Streamer::unit_read_bytes(&slices)
        })
        .sum();

    let mut prompt_bytes = Vec::new();
    for (ub, (want_tokens, want_logits, _)) in [512, one_pass].iter().zip(&want) {
        // A fresh load per case: the prompt starts from an empty cache.
        let streamed = load(path, Mode::ExpertStreaming, Some(resident + cache));
        let (tokens, logits, stats) = long_prompt_trace(&streamed, &prompt, *ub, 16);
        assert_eq!(
            &tokens, want_tokens,
            "n_ubatch {ub}: tokens differ from full-resident"
        );
        let diff = max_abs_diff(&logits, want_logits);
        assert!(diff <= 1e-4, "n_ubatch {ub}: logits differ by {diff}");
        let p = &stats.prompt_stream;
        // Every read of the prompt is counted as the prompt's.
        assert_eq!(p.nvme_bytes_read, stats.nvme_bytes_read, "{stats:?}");
        assert!(stats.cache_peak_bytes <= cache, "{stats:?}");
        prompt_bytes.push(p.nvme_bytes_read);
        if *ub == one_pass {
            // One pass: each expert read at most once, most of them by the
            // read-ahead of the layer before, while it computed.
            assert!(
                p.nvme_bytes_read <= once,
                "{} > {once}: {stats:?}",
                p.nvme_bytes_read
            );
            assert!(
                p.read_ahead_bytes > p.nvme_bytes_read / 2,
                "layers 1-3 should be read ahead: {stats:?}"
            );
        }
    }
    // Three passes of 512 tokens read more than one pass of 1,100.
    assert!(prompt_bytes[0] > prompt_bytes[1], "{prompt_bytes:?}");
}
