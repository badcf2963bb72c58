//! The pass a prompt batch takes through the graph with streamed experts.
//! Alone in its test binary: planning a pass measures what this process's
//! resident set grows by as it makes a context (its metadata), which other
//! tests running beside it would move (beside `tiered.rs`'s, the tight case
//! below took a pass of 1,024 in about one run of four).
use std::path::Path;

use hypura_gguf::GgufFile;
use hypura_synth::{self as synth, SynthSpec};
use llama_tiered::llama::ContextParams;
use llama_tiered::tiered::Mode;

/// The H200's saved profile (the plan here keeps every weight off the GPU).
fn saved_profile() -> hypura_scheduler::profile::HardwareProfile {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/profiles/h200.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// A prompt batch with streamed experts passes the graph in the pass that
/// reads least over the batch: one pass of 2,048 tokens reads the experts
/// the cache lacks once, four of 512 four times; but where the larger
/// pass's buffers would take a tenth of the cache or more (slowing every
/// decoded token), the default pass stays.
#[test]
fn a_prompt_batch_passes_the_graph_once_where_its_buffers_leave_the_cache() {
    use hypura_scheduler::plan::{Budgets, PlanSettings};
    use llama_tiered::tiered::footprint::StreamFootprint;
    use llama_tiered::tiered::host::plan_charged_prompt;
    // Mixtral-8x7B's shape: a cache of GBs, so the larger pass's buffers
    // cost it a few percent. Planned, never read: a sparse file.
    let path = synth::cached::sparse_model(&SynthSpec::mixtral_8x7b()).unwrap();
    let file = GgufFile::open(&path).unwrap();
    let profile = saved_profile();
    let footprint = StreamFootprint::of(&file);
    let settings = |ram_bytes| PlanSettings {
        budgets: Budgets {
            gpu_bytes: Some(0),
            ram_bytes: Some(ram_bytes),
        },
        context_tokens: 2048,
        sequences: 1,
        ..Default::default()
    };
    let context = ContextParams {
        n_ctx: 2048,
        n_batch: 2048,
        n_seq_max: 1,
        ..Default::default()
    };
    let plan_at = |ram_bytes| {
        let (plan, _, context) =
            plan_charged_prompt(&file, &profile, settings(ram_bytes), &context, true).unwrap();
        (plan, context.n_ubatch)
    };
    // What the default pass's plan charges besides weights and cache.
    let (full, _) = plan_at(u64::MAX / 4);
    let beside = full.ram_other_bytes + full.kv_cache_bytes;
    let half = footprint.resident_bytes + footprint.stream_bytes / 2 + beside;
    let (plan, pass) = plan_at(half);
    assert_eq!(plan.mode, Mode::ExpertStreaming);
    assert!(plan.stream_cache_bytes < plan.tier_bytes.stream, "{plan:?}");
    assert_eq!(pass, 2048, "one pass over the batch");
    // Room for a cache of two and a half layers: a pass of 1,024 would
    // take over a tenth of it, one of 2,048 more than half a layer.
    let tight = footprint.resident_bytes
        + footprint.minimum_cache_bytes
        + footprint.layer_bytes / 2
        + beside;
    let (plan, pass) = plan_at(tight);
    assert_eq!(plan.mode, Mode::ExpertStreaming);
    assert_eq!(
        pass, 0,
        "llama.cpp's default pass where a larger one crowds the cache"
    );
}
