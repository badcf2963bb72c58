//! `hypura bench`: loads a model as the planner decides, measures prompt and
//! decode speed, and sets the measurement beside the planner's prediction.
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context as _};
use clap::Args;
use hypura_gguf::GgufFile;
use hypura_scheduler::size::format_bytes;
use llama_tiered::engine::MAX_PARALLEL;
use llama_tiered::hwprobe;
use llama_tiered::llama::{Batch, ContextParams};
use llama_tiered::tiered::host::{plan_charged_prompt, CacheFit};
use llama_tiered::tiered::routing::{RoutingRecorder, RoutingSummary, SYNTH_ROUTING_KEY};
use llama_tiered::tiered::streamer::READ_CHUNK_BYTES;
use llama_tiered::tiered::{Mode, PlannedLoad, StreamStats, TieredModel, TieredParams};
use serde_json::json;

use super::gpu::GpuBudget;
use super::inspect::{self, PlanOptions};

/// Seed of the benchmark prompt's token ids ([`prompt_tokens`]).
const PROMPT_SEED: u64 = 0x6879_7075_7261;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Path of a GGUF model file.
    model: PathBuf,
    /// Plan only this mode (default: the planner's choice).
    #[arg(long)]
    mode: Option<Mode>,
    /// Most GPU memory for weights and KV cache, e.g. 16GiB (0: CPU only)
    /// [default: each GPU's free memory less 1 GiB].
    #[arg(long, value_parser = parse_size)]
    gpu_budget: Option<u64>,
    /// Most RAM for weights, KV cache, stream cache, llama.cpp's buffers
    /// and the model's metadata, e.g. 512MiB: the process peaks at most at
    /// this plus the host overhead `hypura profile` reports.
    #[arg(long, value_parser = parse_size)]
    ram_budget: Option<u64>,
    /// Tokens to generate (greedy; end-of-generation tokens are not honoured).
    #[arg(long, default_value_t = 64)]
    tokens: u32,
    /// Tokens of the fixed prompt; several, comma-separated (e.g.
    /// `512,2048`), are measured one after the other on one load of the
    /// model, each with its own report (one JSON line each with `--json`).
    #[arg(long, value_delimiter = ',', default_value = "64")]
    prompt_tokens: Vec<u32>,
    /// Context length whose KV cache the plan counts (capped at the model's
    /// training length).
    #[arg(long, default_value_t = 4096)]
    context: u32,
    /// Threads for decoding (default: all cores).
    #[arg(long)]
    threads: Option<u32>,
    /// Timed repetitions of prompt + decode (each from an empty KV cache);
    /// figures are their mean ± standard deviation, as llama-bench reports.
    #[arg(long, default_value_t = 3)]
    repetitions: u32,
    /// Skip the untimed warm-up run (prompt and a few tokens) before the
    /// repetitions.
    #[arg(long)]
    no_warmup: bool,
    /// Sequences decoded together, each with its own copy of the prompt and
    /// its own KV stream, as `hypura serve --parallel N` runs them: the
    /// decode figure is then their aggregate tok/s (N tokens per step).
    #[arg(long, default_value_t = 1)]
    parallel: u32,
    /// Take each token's argmax on the host from the copied logits, as
    /// llama.cpp's default sampling does, instead of inside the decode graph
    /// on the output's device (the default, as `hypura serve` does for
    /// greedy requests).
    #[arg(long)]
    host_argmax: bool,
    /// Predict with this saved profile (default: this machine's cached one).
    #[arg(long)]
    profile: Option<PathBuf>,
    /// Reads in flight when streaming weights (default: what the profile's
    /// disk measurements suggest, else 4), as `hypura run` takes it.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
    read_queue_depth: Option<u32>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// MoE: after the timed runs, one more untimed run of the prompt and
    /// the decode (one sequence) records the experts every layer chose, and
    /// the report gives their per-layer histogram and the overlap of
    /// consecutive tokens' experts (`routing`). Untimed because asking
    /// llama.cpp for each layer's choice makes it sync there.
    #[arg(long)]
    routing: bool,
    /// With --routing: also write the recorded decode's choices to FILE, a
    /// JSON line per prompt size (`prompt_tokens`, `n_expert`, and `decode`:
    /// per layer, per token, the expert ids), to replay through stream-cache policies
    /// (`scripts/bench/cache_replay.py`).
    #[arg(long, value_name = "FILE", requires = "routing")]
    routing_trace: Option<PathBuf>,
}

/// Appends one prompt size's decode choices to `path` (`--routing-trace`),
/// which the run's first size starts afresh.
fn append_trace(
    path: &std::path::Path,
    first: bool,
    size: u32,
    n_expert: usize,
    decode: &[Vec<Vec<u32>>],
) -> anyhow::Result<()> {
    use std::io::Write as _;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .append(!first)
        .truncate(first)
        .open(path)
        .with_context(|| format!("--routing-trace: cannot write {}", path.display()))?;
    let line = json!({ "prompt_tokens": size, "n_expert": n_expert, "decode": decode });
    writeln!(file, "{line}")
        .with_context(|| format!("--routing-trace: cannot write {}", path.display()))
}

/// Most prompt sizes one run measures.
const MAX_PROMPT_SIZES: usize = 8;

fn parse_size(text: &str) -> Result<u64, String> {
    hypura_scheduler::size::parse_size(text)
}

/// What was measured, per timed repetition.
struct Measured {
    prompt_tokens: u32,
    prompt_seconds: Vec<f64>,
    decode_tokens: u32,
    decode_seconds: Vec<f64>,
    /// Streaming over the timed decode phases only.
    stream: PhaseStream,
    /// Streaming over the timed prompts only.
    prompt_stream: PhaseStream,
    /// Each decode step after the prompt, the mean over the repetitions:
    /// bytes read from the model file (how the stream cache moves from the
    /// prompt's pass to the decode's working set), seconds, and seconds
    /// stalled on reads (so a slow decode shows which steps, and whether
    /// the disk is why).
    steps: StepSeries,
    /// Tokens per pass of the graph over the prompt (llama.cpp's `n_ubatch`).
    n_ubatch: u32,
    /// The stream cache's budget against the process, read after the warm-up.
    fit: Option<CacheFit>,
    /// Whether llama.cpp took the argmax inside the decode graph.
    device_argmax: bool,
    /// Host threads computing a batch of one token, and larger batches.
    threads: (u32, u32),
    /// The sampler taking the argmax inside the decode graph, if any.
    device_sampler: Option<String>,
    /// With `--routing`: the whole run's, the prompt's and the decode's.
    routing: Option<[RoutingSummary; 3]>,
}

impl Measured {
    fn decode_tokens_total(&self) -> u32 {
        self.decode_tokens * self.decode_seconds.len() as u32
    }
}

/// The stream's counters over one phase (the prompts, or the decodes) of
/// the timed repetitions, summed.
#[derive(Debug, Default)]
struct PhaseStream {
    nvme_bytes: u64,
    read_seconds: f64,
    io_stall_seconds: f64,
    hits: u64,
    misses: u64,
    prefetch_hits: u64,
    /// Bytes the prefetcher read that were evicted before any use.
    prefetch_wasted_bytes: u64,
    evictions: u64,
    /// Bytes of loads backed by pages moved from the units they evicted.
    recycled_bytes: u64,
    resident_layer_skips: u64,
    /// Bytes the streamer's read-ahead of a prompt's next layer read.
    read_ahead_bytes: u64,
    /// Of a prompt's reads, those of cold passes (begun before the stream
    /// cache's first eviction), and their seconds.
    cold_bytes: u64,
    cold_read_seconds: f64,
    /// Bytes evicted for a prompt's reads, and of those, from layers the
    /// pass had not reached yet.
    evicted_bytes: u64,
    evicted_ahead_bytes: u64,
    /// Layers registered with the GPU's driver, the seconds that took, and
    /// the bytes registered at the phase's end.
    registrations: u64,
    register_seconds: f64,
    registered_bytes: u64,
}

impl PhaseStream {
    fn add(&mut self, s: &StreamStats) {
        self.nvme_bytes += s.nvme_bytes_read;
        self.read_seconds += s.read_seconds;
        self.io_stall_seconds += s.io_stall_seconds;
        self.hits += s.expert_hits;
        self.misses += s.expert_misses;
        self.prefetch_hits += s.prefetch_hits;
        self.prefetch_wasted_bytes += s.prefetch_wasted_bytes;
        self.evictions += s.evictions;
        self.recycled_bytes += s.recycled_bytes;
        self.resident_layer_skips += s.resident_layer_skips;
        self.read_ahead_bytes += s.prompt_stream.read_ahead_bytes;
        self.cold_bytes += s.prompt_stream.cold_bytes_read;
        self.cold_read_seconds += s.prompt_stream.cold_read_seconds;
        self.evicted_bytes += s.prompt_stream.evicted_bytes;
        self.evicted_ahead_bytes += s.prompt_stream.evicted_ahead_bytes;
        self.registrations += s.registrations;
        self.register_seconds += s.register_seconds;
        self.registered_bytes = s.registered_bytes;
    }

    fn read_gbps(&self) -> f64 {
        if self.read_seconds > 0.0 {
            self.nvme_bytes as f64 / self.read_seconds / 1e9
        } else {
            0.0
        }
    }

    fn hit_rate(&self) -> f64 {
        let lookups = self.hits + self.misses;
        if lookups > 0 {
            self.hits as f64 / lookups as f64
        } else {
            1.0
        }
    }
}

/// Mean and sample standard deviation of `tokens / seconds` over the repetitions.
fn rate(tokens: u32, seconds: &[f64]) -> (f64, f64) {
    let rates: Vec<f64> = seconds
        .iter()
        .map(|s| f64::from(tokens) / s.max(1e-12))
        .collect();
    let n = rates.len().max(1) as f64;
    let mean = rates.iter().sum::<f64>() / n;
    let var = if rates.len() > 1 {
        rates.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (n - 1.0)
    } else {
        0.0
    };
    (mean, var.sqrt())
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len().max(1) as f64
}

pub fn bench(args: BenchArgs) -> anyhow::Result<()> {
    if args.tokens == 0 || args.prompt_tokens.contains(&0) || args.repetitions == 0 {
        bail!("--tokens, --prompt-tokens and --repetitions must be at least 1");
    }
    if args.prompt_tokens.is_empty() || args.prompt_tokens.len() > MAX_PROMPT_SIZES {
        bail!("--prompt-tokens takes 1 to {MAX_PROMPT_SIZES} sizes");
    }
    if args.parallel == 0 || args.parallel > MAX_PARALLEL {
        bail!("--parallel must be in 1..={MAX_PARALLEL}");
    }
    let loaded = inspect::require_profile(args.profile.as_deref())?;
    let file = GgufFile::open(&args.model)?;
    file.validate()?;
    let experts = file.arch_u64("expert_count").filter(|&n| n > 0);
    let experts_used = file.arch_u64("expert_used_count");
    let routing_profile = file.get_str(SYNTH_ROUTING_KEY).map(str::to_string);
    if args.routing && experts.is_none() {
        bail!(
            "--routing needs a MoE model; {} has no experts",
            args.model.display()
        );
    }
    // The GPUs here by default; another machine's profile plans with its own.
    let gpu_budget = match args.profile {
        Some(_) => args.gpu_budget,
        None => {
            let gpu = GpuBudget::resolve(args.gpu_budget);
            eprintln!("hypura: {}", gpu.describe());
            gpu.bytes
        }
    };
    let options = PlanOptions {
        gpu_budget,
        ram_budget: args.ram_budget,
        context: args.context,
        parallel: args.parallel,
        mode: args.mode,
    };
    let n_ctx = inspect::effective_context(&file, args.context);
    // Everything the run holds in host RAM is charged: the context's
    // buffers and the model's metadata too (measured), not only weights,
    // KV cache and stream cache.
    // With streamed experts the prompt is one pass of the graph where its
    // compute buffers fit: each pass reads the experts the cache lacks.
    let (plan, _, context) = plan_charged_prompt(
        &file,
        &loaded.profile,
        inspect::plan_settings(&file, &options),
        &context_params(&args, n_ctx),
        true,
    )
    .with_context(|| format!("planning {}", args.model.display()))?;
    let params = TieredParams {
        no_repack: true,
        prefetch: true,
        plan: Some(PlannedLoad::from_plan(&file, &plan)?),
        read_queue_depth: args.read_queue_depth.or_else(|| {
            hwprobe::suggested_read_queue_depth(&loaded.profile.disk, READ_CHUNK_BYTES)
        }),
        ..Default::default()
    };
    let load_started = Instant::now();
    let tiered = TieredModel::load(&args.model, &params)
        .with_context(|| format!("loading {}", args.model.display()))?;
    let load_seconds = load_started.elapsed().as_secs_f64();
    drop(file);
    let overhead = loaded.profile.host_overhead();
    let limit = plan.ram_budget_bytes + overhead.bytes();
    let n_expert = experts.unwrap_or(0) as usize;
    let run = Run {
        args: &args,
        plan: &plan,
        profile: &loaded,
        load_seconds,
        routing_profile: routing_profile.as_deref(),
        experts,
        experts_used,
        read_queue_depth: tiered.streamer.as_ref().map(|s| s.read_queue_depth()),
    };
    measure(&tiered, &args, &context, limit, n_expert, |m| run.report(m))
}

/// What every report of one `hypura bench` run shares.
struct Run<'a> {
    args: &'a BenchArgs,
    plan: &'a hypura_scheduler::plan::Plan,
    profile: &'a crate::pool::planner::LoadedProfile,
    load_seconds: f64,
    routing_profile: Option<&'a str>,
    experts: Option<u64>,
    experts_used: Option<u64>,
    /// Reads in flight per streamed read (when weights stream).
    read_queue_depth: Option<u32>,
}

impl Run<'_> {
    /// Prints one prompt size's report: a JSON line or a table.
    fn report(&self, m: &Measured) -> anyhow::Result<()> {
        let Run {
            args,
            plan,
            profile: loaded,
            load_seconds,
            routing_profile,
            experts,
            experts_used,
            read_queue_depth,
        } = *self;
        let n_expert = experts.unwrap_or(0) as usize;
        let overhead = loaded.profile.host_overhead();
        let host = json!({
            "peak_rss_bytes": hwprobe::host::peak_rss_bytes(),
            "rss_bytes": hwprobe::host::rss_bytes(),
            "ram_budget_bytes": plan.ram_budget_bytes,
            "ram_charged_bytes": plan.ram_charged_bytes(),
            "ram_other_bytes": plan.ram_other_bytes,
            "overhead_bytes": overhead.bytes(),
            "overhead_measured": loaded.profile.host_overhead.is_some(),
            "stream_cache_fit": m.fit.map(|f| json!({
                "rss_bytes": f.rss_bytes,
                "region_bytes": f.region_bytes,
                "before_bytes": f.before_bytes,
                "after_bytes": f.after_bytes,
            })),
        });

        let predicted = plan.prediction.tokens_per_second;
        // Mean seconds per repetition: `measured = tokens / decode_seconds`.
        let decode_seconds = mean(&m.decode_seconds);
        // Every sequence's tokens: the aggregate rate with --parallel.
        let step_tokens = m.decode_tokens * args.parallel;
        let measured = f64::from(step_tokens) / decode_seconds.max(1e-12);
        let (_, decode_sd) = rate(step_tokens, &m.decode_seconds);
        let (prompt_rate, prompt_sd) = rate(m.prompt_tokens * args.parallel, &m.prompt_seconds);
        // The warm-up leaves the stream cache as a served model's is.
        let predicted_prompt = plan.predict_prompt(m.prompt_tokens, m.n_ubatch, args.no_warmup);
        let prompt_error = relative_error(predicted_prompt.tokens_per_second, prompt_rate);
        let relative_error = relative_error(predicted, measured);
        let per_token = |x: u64| x as f64 / f64::from(m.decode_tokens_total());
        let hit_rate = m.stream.hit_rate();
        let prompts = m.prompt_seconds.len().max(1) as f64;
        let per_prompt = |x: f64| x / prompts;
        let mut report = json!({
            "model": args.model.display().to_string(),
            "profile": loaded.path.display().to_string(),
            "mode": plan.mode,
            "tier_bytes": plan.tier_bytes,
            "stream_cache_bytes": plan.stream_cache_bytes,
            "load_seconds": load_seconds,
            "repetitions": args.repetitions,
            "parallel": args.parallel,
            "step_ms": decode_seconds * 1e3 / f64::from(m.decode_tokens),
            "warmup": !args.no_warmup,
            "argmax": if m.device_argmax { "device" } else { "host" },
            "device_sampler": m.device_sampler,
            "threads": { "one_token": m.threads.0, "batch": m.threads.1 },
            "prompt_tokens": m.prompt_tokens,
            "prompt_tokens_per_second": prompt_rate,
            "prompt_tokens_per_second_sd": prompt_sd,
            "decode_tokens": m.decode_tokens,
            "decode_seconds": decode_seconds,
            "measured_tokens_per_second": measured,
            "measured_tokens_per_second_sd": decode_sd,
            "predicted_tokens_per_second": predicted,
            "relative_error": relative_error,
            "bottleneck": plan.prediction.bottleneck,
            "expected_hit_rate": plan.expected_hit_rate,
            "predicted_nvme_bytes_per_token": plan.nvme_bytes_per_token,
            "n_ubatch": m.n_ubatch,
            "stream": {
                "nvme_bytes_per_token": per_token(m.stream.nvme_bytes),
                "hit_rate": hit_rate,
                "read_gbps": m.stream.read_gbps(),
                "io_stall_seconds_per_token": m.stream.io_stall_seconds / f64::from(m.decode_tokens_total()),
                "step_nvme_bytes": m.steps.nvme_bytes,
                "step_seconds": m.steps.seconds,
                "step_stall_seconds": m.steps.stall_seconds,
                "resident_layer_skips_per_token": per_token(m.stream.resident_layer_skips),
                "prefetch_hits_per_token": per_token(m.stream.prefetch_hits),
                "prefetch_wasted_bytes_per_token": per_token(m.stream.prefetch_wasted_bytes),
                "recycled_bytes_per_token": per_token(m.stream.recycled_bytes),
            },
            "prompt_stream": {
                "nvme_bytes": per_prompt(m.prompt_stream.nvme_bytes as f64),
                "read_ahead_bytes": per_prompt(m.prompt_stream.read_ahead_bytes as f64),
                "stream_bytes": plan.tier_bytes.stream,
                "read_seconds": per_prompt(m.prompt_stream.read_seconds),
                "read_gbps": m.prompt_stream.read_gbps(),
                "io_stall_seconds": per_prompt(m.prompt_stream.io_stall_seconds),
                "hit_rate": m.prompt_stream.hit_rate(),
                "prefetch_hits": per_prompt(m.prompt_stream.prefetch_hits as f64),
                "evictions": per_prompt(m.prompt_stream.evictions as f64),
                "recycled_bytes": per_prompt(m.prompt_stream.recycled_bytes as f64),
                "registrations": per_prompt(m.prompt_stream.registrations as f64),
                "register_seconds": per_prompt(m.prompt_stream.register_seconds),
                "registered_bytes": m.prompt_stream.registered_bytes,
            },
            "host_memory": host,
            "routing": m.routing.as_ref().map(|[all, prompt, decode]| json!({
                "profile": routing_profile,
                "n_expert": experts,
                "n_expert_used": experts_used,
                "tokens": all.tokens,
                "histogram": all.histogram,
                "overlap": all.overlap,
                "concentration": all.concentration,
                "top_share": all.top_share,
                "prompt": prompt,
                "decode": decode,
            })),
        });
        report["read_queue_depth"] = json!(read_queue_depth);
        // Beside the measured prompt rate (apart: one json! this deep overflows the macro).
        report["predicted_prompt_tokens_per_second"] = json!(predicted_prompt.tokens_per_second);
        report["prompt_relative_error"] = json!(prompt_error);
        report["predicted_prompt"] = json!(predicted_prompt);
        report["prompt_stream"]["evicted_bytes"] =
            json!(per_prompt(m.prompt_stream.evicted_bytes as f64));
        report["prompt_stream"]["evicted_ahead_bytes"] =
            json!(per_prompt(m.prompt_stream.evicted_ahead_bytes as f64));
        report["prompt_stream"]["cold_bytes"] =
            json!(per_prompt(m.prompt_stream.cold_bytes as f64));
        report["prompt_stream"]["cold_read_seconds"] =
            json!(per_prompt(m.prompt_stream.cold_read_seconds));
        if args.json {
            println!("{}", serde_json::to_string(&report)?);
            return Ok(());
        }
        println!("model               {}", args.model.display());
        println!("mode                {}", plan.mode);
        println!(
            "tiers               GPU {}, RAM {}, STREAM {} (stream cache {})",
            format_bytes(plan.tier_bytes.gpu),
            format_bytes(plan.tier_bytes.ram),
            format_bytes(plan.tier_bytes.stream),
            format_bytes(plan.stream_cache_bytes)
        );
        println!(
            "prompt              {} tokens, {prompt_rate:.1} ± {prompt_sd:.1} tok/s ({} repetitions), {:.1} tok/s predicted, error {:+.1}%",
            m.prompt_tokens,
            args.repetitions,
            predicted_prompt.tokens_per_second,
            prompt_error * 100.0
        );
        println!(
            "decode              {} tokens, {measured:.2} ± {decode_sd:.2} tok/s measured, {predicted:.2} tok/s predicted ({}), error {:+.1}%",
            m.decode_tokens,
            plan.prediction.bottleneck.describe(),
            relative_error * 100.0
        );
        println!(
            "host memory         peak {} resident, RAM budget {} ({} charged, {} of it buffers and metadata) + overhead {}",
            format_bytes(hwprobe::host::peak_rss_bytes().unwrap_or(0)),
            format_bytes(plan.ram_budget_bytes),
            format_bytes(plan.ram_charged_bytes()),
            format_bytes(plan.ram_other_bytes),
            format_bytes(overhead.bytes())
        );
        if args.parallel > 1 {
            println!(
                "parallel            {} sequences: {:.2} ms per step of {} tokens (the rates above are their sum)",
                args.parallel,
                decode_seconds * 1e3 / f64::from(m.decode_tokens),
                args.parallel
            );
        }
        if plan.mode != Mode::FullResident {
            println!(
                "stream              {}/token read (predicted {}), hit rate {:.0}% (predicted {:.0}%), {:.2} GB/s, I/O stall {:.1} ms/token",
                format_bytes(per_token(m.stream.nvme_bytes) as u64),
                format_bytes(plan.nvme_bytes_per_token as u64),
                hit_rate * 100.0,
                plan.expected_hit_rate * 100.0,
                m.stream.read_gbps(),
                m.stream.io_stall_seconds * 1e3 / f64::from(m.decode_tokens_total())
            );
            println!(
                "prompt stream       {}/prompt read of {} streamed, {:.2} GB/s, I/O stall {:.2} s/prompt, {} tokens a pass",
                format_bytes(per_prompt(m.prompt_stream.nvme_bytes as f64) as u64),
                format_bytes(plan.tier_bytes.stream),
                m.prompt_stream.read_gbps(),
                per_prompt(m.prompt_stream.io_stall_seconds),
                m.n_ubatch
            );
        }
        if let Some([_, prompt, decode]) = &m.routing {
            let uniform = experts_used.unwrap_or(0) as f64 / n_expert.max(1) as f64;
            println!(
                "routing             profile {}: overlap of consecutive tokens' experts {:.2} decode, {:.2} prompt (independent uniform: {uniform:.2}); concentration {:.3} decode, {:.3} prompt; top expert {:.1}% of a layer's choices",
                routing_profile.unwrap_or("unknown"),
                decode.overlap,
                prompt.overlap,
                decode.concentration,
                prompt.concentration,
                decode.top_share * 100.0
            );
        }
        Ok(())
    }
}

/// `(predicted − measured) / measured`: positive when the plan promised too much.
pub(super) fn relative_error(predicted: f64, measured: f64) -> f64 {
    if measured > 0.0 {
        (predicted - measured) / measured
    } else {
        f64::INFINITY
    }
}

fn largest_prompt(args: &BenchArgs) -> u32 {
    args.prompt_tokens.iter().copied().max().unwrap_or(1)
}

/// The one context the benchmark decodes in, as the batch engine makes
/// its context: a KV stream of `n_ctx` per sequence.
fn context_params(args: &BenchArgs, n_ctx: u32) -> ContextParams {
    let n = args.parallel;
    ContextParams {
        n_ctx: n_ctx * n,
        n_batch: (largest_prompt(args) * n).max(n),
        n_seq_max: n,
        // Logits at the last token of each sequence's prompt and at each decoded token.
        n_outputs_max: n,
        n_threads: args.threads.unwrap_or(0),
        ..Default::default()
    }
}

/// Greedy decoding of a fixed prompt of each asked size in turn, on one
/// context: an untimed warm-up before the first, then each size's timed
/// repetitions, each timing its prompt and its decode steps (a later size
/// starts from the stream cache the earlier runs left, as a served model's
/// next prompt does). From before the warm-up on, the process is held to
/// `limit_bytes` of memory: the stream cache gives back what the process
/// takes besides it ([`TieredModel::fit_stream_cache`]). `report` gets
/// each size's measurement as it is taken.
fn measure(
    tiered: &TieredModel,
    args: &BenchArgs,
    context: &ContextParams,
    limit_bytes: u64,
    n_expert: usize,
    mut report: impl FnMut(&Measured) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let n_ctx = context.n_ctx / args.parallel.max(1);
    let model = Arc::clone(&tiered.model);
    let needed = largest_prompt(args) + args.tokens + 1;
    if needed > n_ctx {
        bail!(
            "--prompt-tokens + --tokens ({needed}) exceed the context of {n_ctx} tokens; lower them or raise --context"
        );
    }
    let text = prompt_tokens(&model, largest_prompt(args) as usize)?;
    let n = args.parallel;
    // With --routing, a recorder around the streamer's hook: it forwards
    // everything, and records only while turned on (the untimed runs).
    let recorder = args.routing.then(|| RoutingRecorder::new(tiered.hook()));
    let mut ctx = match &recorder {
        Some(r) => {
            llama_tiered::llama::Context::with_hook(Arc::clone(&model), context, Some(r.clone()))?
        }
        None => tiered.new_context(context)?,
    };
    let mut device_argmax = !args.host_argmax;
    for seq in 0..n as i32 {
        device_argmax &= ctx.set_device_greedy(seq, device_argmax);
    }
    if !device_argmax {
        for seq in 0..n as i32 {
            ctx.set_device_greedy(seq, false);
        }
    }
    // Everything but the cache and what a first decode adds is resident
    // now: hold the process to its limit from here on (the report's fit is
    // read again after the warm-up).
    tiered.fit_stream_cache(limit_bytes);
    // A cache that holds every streamed unit is read in whole before the
    // warm-up, as `serve` fills a promoted model's: the timed runs measure
    // the steady state, with no expert left to read.
    if let Some(streamer) = tiered.streamer.as_ref().filter(|s| s.holds_every_unit()) {
        streamer.fill();
    }
    for (i, &size) in args.prompt_tokens.iter().enumerate() {
        let prompt = &text[..size as usize];
        if i == 0 && !args.no_warmup {
            // Untimed: first-use costs (kernels, allocations, the stream
            // cache's first reads) stay out of the figures, as in llama-bench.
            run_once(&mut ctx, prompt, args.tokens.min(8), n, None)?;
        }
        let fit = tiered.fit_stream_cache(limit_bytes);
        let (mut prompt_seconds, mut decode_seconds) = (Vec::new(), Vec::new());
        let mut streams = Streams::default();
        for _ in 0..args.repetitions {
            let (p, d) = run_once(
                &mut ctx,
                prompt,
                args.tokens,
                n,
                Some((tiered, &mut streams)),
            )?;
            prompt_seconds.push(p);
            decode_seconds.push(d);
        }
        let routing = match &recorder {
            Some(r) => {
                r.set_recording(true);
                let run = run_once(&mut ctx, prompt, args.tokens, 1, None);
                r.set_recording(false);
                run?;
                let trace = r.trace();
                let (head, tail) = trace.split_last(args.tokens as usize);
                if let Some(path) = &args.routing_trace {
                    append_trace(path, i == 0, size, n_expert, &tail.layers)?;
                }
                Some([
                    trace.summary(n_expert),
                    head.summary(n_expert),
                    tail.summary(n_expert),
                ])
            }
            None => None,
        };
        let reps = f64::from(args.repetitions);
        report(&Measured {
            routing,
            prompt_tokens: size,
            prompt_seconds,
            decode_tokens: args.tokens,
            decode_seconds,
            stream: streams.decode,
            prompt_stream: streams.prompt,
            steps: streams.steps.mean(reps),
            n_ubatch: ctx.n_ubatch(),
            fit,
            device_argmax,
            threads: ctx.threads(),
            device_sampler: ctx.device_greedy_name(0),
        })?;
    }
    Ok(())
}

/// The benchmark prompt, as llama-bench makes its own: the model's BOS
/// token where its tokenizer adds one, then token ids drawn uniformly from
/// the vocabulary (seeded: the same prompt every run). Not a sentence
/// repeated: a MoE routes a repeated sentence's few distinct tokens to a
/// few experts, and its prompt would read fewer experts than a real one.
fn prompt_tokens(model: &llama_tiered::llama::Model, n: usize) -> anyhow::Result<Vec<i32>> {
    let n_vocab = model.n_vocab();
    if n_vocab == 0 {
        bail!("the model has no vocabulary");
    }
    let mut tokens = model.tokenize("", true, false)?;
    tokens.truncate(n);
    let mut rng = llama_tiered::rng::Rng::new(PROMPT_SEED);
    while tokens.len() < n {
        tokens.push(rng.below(n_vocab) as i32);
    }
    Ok(tokens)
}

/// The stream's counters over the timed runs of one prompt size.
#[derive(Default)]
struct Streams {
    prompt: PhaseStream,
    decode: PhaseStream,
    /// Each decode step's, summed over the repetitions.
    steps: StepSeries,
}

/// Per decode step: bytes read, seconds, seconds stalled on reads.
#[derive(Default)]
struct StepSeries {
    nvme_bytes: Vec<f64>,
    seconds: Vec<f64>,
    stall_seconds: Vec<f64>,
}

impl StepSeries {
    /// Adds one run's steps, step by step.
    fn add(&mut self, run: &StepSeries) {
        for (total, one) in [
            (&mut self.nvme_bytes, &run.nvme_bytes),
            (&mut self.seconds, &run.seconds),
            (&mut self.stall_seconds, &run.stall_seconds),
        ] {
            total.resize(one.len().max(total.len()), 0.0);
            for (t, x) in total.iter_mut().zip(one) {
                *t += x;
            }
        }
    }

    /// The sums over `runs` repetitions as means.
    fn mean(&self, runs: f64) -> StepSeries {
        let each = |v: &Vec<f64>| v.iter().map(|x| x / runs).collect();
        StepSeries {
            nvme_bytes: each(&self.nvme_bytes),
            seconds: each(&self.seconds),
            stall_seconds: each(&self.stall_seconds),
        }
    }
}

/// From an empty KV cache: the prompt of each of `n` sequences in one
/// batch, then `tokens` greedy steps of one token per sequence. Returns
/// (prompt seconds, decode seconds). With `streams`, adds the model's
/// stream counters over the prompt, over the decode and over each step to
/// theirs.
fn run_once(
    ctx: &mut llama_tiered::llama::Context,
    prompt: &[i32],
    tokens: u32,
    n: u32,
    mut streams: Option<(&TieredModel, &mut Streams)>,
) -> anyhow::Result<(f64, f64)> {
    let stats = |s: &Option<(&TieredModel, &mut Streams)>| s.as_ref().map(|(t, _)| t.stats());
    ctx.clear_all();
    let mut batch = Batch::new(prompt.len() * n as usize);
    for seq in 0..n as i32 {
        for (i, &t) in prompt.iter().enumerate() {
            batch.push(t, i as i32, seq, i + 1 == prompt.len())?;
        }
    }
    let before_prompt = stats(&streams);
    let started = Instant::now();
    ctx.decode(&batch)?;
    let prompt_seconds = started.elapsed().as_secs_f64();
    let after_prompt = stats(&streams);
    // Each sequence's last prompt token: its index in the batch.
    let mut next = Vec::with_capacity(n as usize);
    for seq in 0..n as usize {
        next.push(greedy_token(ctx, ((seq + 1) * prompt.len() - 1) as i32)?);
    }
    // Each step's reads, where the model streams: nothing is sampled inside
    // the timed loop of a model that reads no file.
    let streamed = streams.as_ref().is_some_and(|(t, _)| t.streamer.is_some());
    let mut steps = StepSeries::default();
    let mut last = after_prompt.clone().filter(|_| streamed);
    let started = Instant::now();
    let mut step_started = started;
    let mut step = Batch::new(n as usize);
    for k in 0..tokens {
        step.clear();
        for (seq, &token) in next.iter().enumerate() {
            step.push(token, (prompt.len() as u32 + k) as i32, seq as i32, true)?;
        }
        ctx.decode(&step)?;
        for (seq, token) in next.iter_mut().enumerate() {
            *token = greedy_token(ctx, seq as i32)?;
        }
        if let (Some((tiered, _)), Some(last)) = (&streams, last.as_mut()) {
            // The counters only: cheap beside a step that reads from disk.
            let now = tiered.stats();
            let ended = Instant::now();
            let this_step = now.since(last);
            steps.nvme_bytes.push(this_step.nvme_bytes_read as f64);
            steps.seconds.push((ended - step_started).as_secs_f64());
            steps.stall_seconds.push(this_step.io_stall_seconds);
            *last = now;
            step_started = ended;
        }
    }
    let decode_seconds = started.elapsed().as_secs_f64();
    if let (Some((tiered, s)), Some(before), Some(after)) =
        (streams.as_mut(), before_prompt, after_prompt)
    {
        s.prompt.add(&after.since(&before));
        s.decode.add(&tiered.stats().since(&after));
        s.steps.add(&steps);
    }
    Ok((prompt_seconds, decode_seconds))
}

/// The token llama.cpp chose inside the decode for batch index `row`, else
/// the host's argmax of its logits.
fn greedy_token(ctx: &llama_tiered::llama::Context, row: i32) -> anyhow::Result<i32> {
    match ctx.sampled_token(row) {
        Some(token) => Ok(token),
        None => Ok(argmax(ctx.logits(row)?)),
    }
}

fn argmax(logits: &[f32]) -> i32 {
    logits
        .iter()
        .enumerate()
        .fold((0, f32::NEG_INFINITY), |best, (i, &v)| {
            if v > best.1 {
                (i, v)
            } else {
                best
            }
        })
        .0 as i32
}
