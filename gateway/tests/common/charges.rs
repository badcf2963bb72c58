//! What a server started with `--parallel 1 --context 512 --batch 64` charges
//! a model under a memory budget, computed the way the server does (the
//! engine's footprint and context-memory functions), for tests that size
//! budgets around one or two models.
use std::path::Path;

use hypura_gguf::GgufFile;
use llama_tiered::engine::BatchConfig;
use llama_tiered::tiered::footprint::StreamFootprint;
use llama_tiered::tiered::{context_memory, GpuShare, Mode, PlannedLoad, TieredParams};

/// `--context`.
pub const CONTEXT: u32 = 512;
/// `--batch`.
pub const BATCH: u32 = 64;
/// More than an idle runner process holds (about 10 MiB): the budget charges
/// each loaded model's runner.
pub const RUNNER_ALLOWANCE: u64 = 16 << 20;

pub fn footprint(path: &Path) -> StreamFootprint {
    StreamFootprint::of(&GgufFile::open(path).unwrap())
}

/// The model's contexts (KV cache, compute buffers) in `mode`'s placement.
pub fn contexts(path: &Path, mode: Mode) -> u64 {
    let file = GgufFile::open(path).unwrap();
    let n_ctx_train = file.arch_u64("context_length").unwrap() as u32;
    let config = BatchConfig {
        n_parallel: 1,
        n_ctx_per_seq: CONTEXT,
        n_batch: BATCH,
        n_ubatch: 0,
        n_threads: 0,
        queue_limit: 1,
        prompt_cache: Default::default(),
    };
    let plan = PlannedLoad::fixed(&file, mode, GpuShare::None, None).unwrap();
    let params = TieredParams {
        plan: Some(plan),
        no_repack: true,
        ..Default::default()
    };
    context_memory(path, &params, &config.contexts(n_ctx_train))
        .unwrap()
        .ram_bytes
}

/// RAM charged in the streaming placement with `cache` bytes of stream cache.
pub fn streaming(path: &Path, cache: u64) -> u64 {
    let f = footprint(path);
    f.resident_bytes + cache + contexts(path, f.mode)
}

/// RAM charged in the streaming placement with its smallest stream cache.
pub fn streaming_minimum(path: &Path) -> u64 {
    streaming(path, footprint(path).minimum_cache_bytes)
}

/// RAM charged in the full placement (no GPU here).
pub fn full(path: &Path) -> u64 {
    let f = footprint(path);
    f.resident_bytes + f.stream_bytes + contexts(path, Mode::FullResident)
}

/// `hypura serve` of `models` with the flags these charges assume, on a free
/// port, under `--ram-budget ram_budget`, then `extra`.
pub fn serve_args(models: &[&Path], ram_budget: u64, extra: &[&str]) -> Vec<String> {
    let mut args = vec!["serve".to_string()];
    args.extend(models.iter().map(|m| m.to_string_lossy().into_owned()));
    for flag in [
        "--port",
        "0",
        "--parallel",
        "1",
        "--context",
        &CONTEXT.to_string(),
        "--batch",
        &BATCH.to_string(),
        "--ram-budget",
        &ram_budget.to_string(),
        // The charges these tests compute leave the prompt cache out
        // (tests/api/prompt_cache.rs charges it).
        "--prompt-cache-ram",
        "0",
    ]
    .into_iter()
    .chain(extra.iter().copied())
    {
        args.push(flag.to_string());
    }
    args
}
