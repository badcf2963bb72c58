//! `hypura run`: one completion (streamed to stdout) or an interactive chat.
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context as _;
use clap::Args;
use hypura_chat::ChatMessage;
use hypura_gguf::GgufFile;
use hypura_scheduler::plan::{Budgets, PlanSettings};
use llama_tiered::engine::generate::{generate, Completion, GenerateParams};
use llama_tiered::engine::prompt;
use llama_tiered::hwprobe;
use llama_tiered::llama::{Context, ContextParams, SamplingParams};
use llama_tiered::tiered::host::plan_charged;
use llama_tiered::tiered::{GpuShare, Mode, PlannedLoad, TieredModel, TieredParams};
use serde_json::{json, Value};

use super::client;
use super::gpu::GpuBudget;
use super::inspect;
use super::progress::load_bar;

#[derive(Args, Debug)]
pub struct RunArgs {
    /// Path of a GGUF model file, or the name of a model a running server
    /// serves (`name[:tag]`; then the chat goes through that server, see
    /// `HYPURA_HOST`).
    model: PathBuf,
    /// The prompt, after the model (as `ollama run MODEL PROMPT`).
    #[arg(value_name = "PROMPT", conflicts_with = "prompt")]
    words: Vec<String>,
    /// The prompt (a user message, or raw text with --raw).
    #[arg(long, short = 'p')]
    prompt: Option<String>,
    /// Feed the prompt as is, without the chat template.
    #[arg(long)]
    raw: bool,
    /// A system message (chat mode only).
    #[arg(long, conflicts_with = "raw")]
    system: Option<String>,
    /// Chat in a loop, keeping the conversation (`/?` lists its commands;
    /// Ctrl-C stops a reply). A served model without a prompt on a
    /// terminal chats so too.
    #[arg(long, short = 'i', conflicts_with_all = ["raw", "json"])]
    interactive: bool,
    /// Print the statistics after each reply: counts, durations and rates
    /// (a served model: as `ollama run --verbose`; a file: its streaming too).
    #[arg(long)]
    verbose: bool,
    /// Most tokens to generate [default: 512; a served model: the server's].
    #[arg(long)]
    max_tokens: Option<u32>,
    /// Sampling temperature; 0 is greedy [default: 0.8; a served model: the server's].
    #[arg(long)]
    temperature: Option<f32>,
    /// [default: 40; a served model: the server's]
    #[arg(long)]
    top_k: Option<i32>,
    /// [default: 0.95; a served model: the server's]
    #[arg(long)]
    top_p: Option<f32>,
    /// [default: 0.05; a served model: the server's]
    #[arg(long)]
    min_p: Option<f32>,
    /// [default: 1.0; a served model: the server's]
    #[arg(long)]
    repeat_penalty: Option<f32>,
    /// Random seed (random when absent).
    #[arg(long)]
    seed: Option<u32>,
    /// Stop before this string (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Context length in tokens (capped at the model's training length)
    /// [default: 4096; a served model: the server's].
    #[arg(long)]
    context: Option<u32>,
    /// Threads for decoding (default: all cores).
    #[arg(long)]
    threads: Option<u32>,
    /// Print one JSON object (text, tokens, counts, stats) instead of streaming.
    #[arg(long)]
    json: bool,
    /// full-resident, expert-streaming or dense-ffn-streaming (default: the
    /// planner's choice from this machine's profile (`hypura profile`, else
    /// an estimate) and the budgets).
    #[arg(long)]
    mode: Option<Mode>,
    /// Most RAM for weights, KV cache, stream cache, llama.cpp's buffers and
    /// the model's metadata, e.g. 512MiB or 8GiB: the process peaks at most
    /// at this plus the host overhead `hypura profile` reports.
    #[arg(long, value_parser = parse_size)]
    ram_budget: Option<u64>,
    /// Print streaming statistics on stderr after the reply.
    #[arg(long)]
    stats: bool,
    /// Do not read ahead the weights the next layers will likely need.
    #[arg(long)]
    no_prefetch: bool,
    /// Reads in flight when streaming weights (default: from `hypura profile`'s
    /// disk measurements, else 4).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
    read_queue_depth: Option<u32>,
    /// Let llama.cpp repack resident weights for faster CPU kernels (Q4_0,
    /// Q4_K, IQ4_NL, Q8_0 on x86). Off by default: streamed weights cannot be
    /// repacked, and hypura keeps every mode bit-for-bit identical.
    #[arg(long)]
    repack: bool,
    /// Put N layers' resident weights on the GPU as llama.cpp's -ngl N counts
    /// them: the output layer, then the last N-1 layers (99: all; 0: none).
    /// Needs a CUDA build of llama.cpp.
    #[arg(long, conflicts_with = "gpu_budget")]
    gpu_layers: Option<u32>,
    /// Most GPU memory for weights and KV cache, e.g. 20GiB (0: CPU only)
    /// [default: each GPU's free memory less 1 GiB].
    #[arg(long, value_parser = parse_size)]
    gpu_budget: Option<u64>,
}

/// The file mode's context length.
fn context(args: &RunArgs) -> u32 {
    args.context.unwrap_or(4096)
}

fn parse_size(text: &str) -> Result<u64, String> {
    hypura_scheduler::size::parse_size(text)
}

pub fn run(mut args: RunArgs) -> anyhow::Result<()> {
    if args.prompt.is_none() && !args.words.is_empty() {
        args.prompt = Some(args.words.join(" "));
    }
    if is_served_name(&args.model) {
        return client::chat::run(chat_options(&args));
    }
    if args.prompt.is_none() && !args.interactive {
        anyhow::bail!(
            "give a prompt (`hypura run MODEL PROMPT` or --prompt TEXT), or --interactive"
        );
    }
    let params = generate_params(&args)?;
    let load_started = Instant::now();
    let (tiered, memory_limit) = load_model(&args)?;
    let model = Arc::clone(&tiered.model);
    let load_seconds = load_started.elapsed().as_secs_f64();

    let n_ctx = context(&args).clamp(16, model.n_ctx_train().max(16));
    let mut ctx = tiered.new_context(&context_params(&args, n_ctx))?;
    // Everything but the stream cache is resident now: hold the process to
    // its RAM budget plus the host overhead.
    tiered.fit_stream_cache(memory_limit);
    // A cache that holds every streamed unit is read in whole in the
    // background, so that decoding soon asks for no router choice at all.
    if let Some(streamer) = tiered.streamer.clone().filter(|s| s.holds_every_unit()) {
        std::thread::spawn(move || streamer.fill());
    }

    if args.interactive {
        return chat_loop(&mut ctx, &args, &params);
    }
    let stats = || serde_json::to_value(tiered.stats()).unwrap_or_default();
    let text = args.prompt.as_deref().unwrap_or_default();
    let tokens = if args.raw {
        prompt::tokenize_raw(&model, text)?
    } else {
        let template = prompt::model_template(&model)?;
        let messages = initial_messages(&args, text);
        prompt::tokenize_chat(&model, &prompt::render_chat(&template, &messages)?)?
    };

    let completion = if args.json {
        generate(&mut ctx, 0, &tokens, &params, &mut |_| true)?
    } else {
        let completion = generate(&mut ctx, 0, &tokens, &params, &mut print_piece)?;
        println!();
        completion
    };
    if args.json {
        let report = json_report(&completion, load_seconds, stats());
        println!("{}", serde_json::to_string(&report)?);
    } else {
        eprintln!("{}", summary(&completion, load_seconds));
        if args.stats || args.verbose {
            eprintln!("stats: {}", stats());
        }
    }
    Ok(())
}

/// A model name rather than a file: no such file, and not named like one.
fn is_served_name(model: &std::path::Path) -> bool {
    !model.exists()
        && !model
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// The server's view of the sampling flags (Ollama `options`).
fn chat_options(args: &RunArgs) -> client::chat::ChatOptions {
    let mut options = serde_json::Map::new();
    // Only what the command line sets: the rest is the model's (a created
    // model's defaults) or the server's.
    let mut set = |name: &str, value: Option<Value>| {
        if let Some(value) = value {
            options.insert(name.into(), value);
        }
    };
    set("temperature", args.temperature.map(|v| json!(v)));
    set("top_k", args.top_k.map(|v| json!(v)));
    set("top_p", args.top_p.map(|v| json!(v)));
    set("min_p", args.min_p.map(|v| json!(v)));
    set("repeat_penalty", args.repeat_penalty.map(|v| json!(v)));
    set("num_predict", args.max_tokens.map(|v| json!(v)));
    set("num_ctx", args.context.map(|v| json!(v)));
    if let Some(seed) = args.seed {
        options.insert("seed".into(), json!(seed));
    }
    if !args.stop.is_empty() {
        options.insert("stop".into(), json!(args.stop));
    }
    client::chat::ChatOptions {
        model: args.model.to_string_lossy().into_owned(),
        prompt: args.prompt.clone(),
        system: args.system.clone(),
        raw: args.raw,
        interactive: args.interactive,
        json: args.json,
        verbose: args.verbose,
        options,
    }
}

fn generate_params(args: &RunArgs) -> anyhow::Result<GenerateParams> {
    let sampling = SamplingParams {
        temperature: args.temperature.unwrap_or(0.8),
        top_k: args.top_k.unwrap_or(40),
        top_p: args.top_p.unwrap_or(0.95),
        min_p: args.min_p.unwrap_or(0.05),
        repeat_penalty: args.repeat_penalty.unwrap_or(1.0),
        seed: args.seed,
        ..SamplingParams::default()
    };
    sampling.validate()?;
    Ok(GenerateParams {
        sampling,
        max_tokens: Some(args.max_tokens.unwrap_or(512)),
        stop: args.stop.clone(),
        cache_prompt: true,
    })
}

/// The model loaded as planned, and the most memory the process may hold
/// (the plan's RAM budget plus the host overhead).
fn load_model(args: &RunArgs) -> anyhow::Result<(TieredModel, u64)> {
    let path = &args.model;
    let label = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let bar = load_bar(&label);
    let mut progress = |p: f32| {
        bar.set_position((p.clamp(0.0, 1.0) * 1000.0) as u64);
        true
    };
    let (params, limit) = tiered_params(args)?;
    let model = TieredModel::load_with_progress(path, &params, Some(&mut progress));
    bar.finish_and_clear();
    Ok((
        model.with_context(|| format!("loading {}", path.display()))?,
        limit,
    ))
}

/// Load options: the planner's placement (`--mode` and `--gpu-layers` fix
/// what they name, the budgets bound the rest) on this machine's cached
/// profile, else on an estimated one (this machine's sizes, assumed speeds).
fn tiered_params(args: &RunArgs) -> anyhow::Result<(TieredParams, u64)> {
    // `--gpu-layers` says it all; otherwise the GPUs are used by default.
    let gpu_budget = match args.gpu_layers {
        Some(_) => None,
        None => {
            let gpu = GpuBudget::resolve(args.gpu_budget);
            eprintln!("hypura: {}", gpu.describe());
            gpu.bytes
        }
    };
    let (profile, measured) = match crate::pool::planner::find_profile(None) {
        Ok(Some(loaded)) => (loaded.profile, true),
        Ok(None) => (hwprobe::estimated(), false),
        Err(e) => {
            tracing::warn!("planning with an estimated profile: {e:#}");
            (hwprobe::estimated(), false)
        }
    };
    // Validated before planning: the planner reads the hyperparameters llama.cpp asserts on.
    let file = GgufFile::open_validated(&args.model)?;
    let budgets = Budgets {
        gpu_bytes: gpu_budget,
        ram_bytes: args.ram_budget,
    };
    let context = inspect::effective_context(&file, context(args));
    let settings = PlanSettings {
        mode: args.mode,
        gpu: args.gpu_layers.map(GpuShare::Layers),
        ..crate::pool::planner::plan_settings(budgets, context, 1)
    };
    // Charging the context's buffers and the model's metadata too.
    let n_ctx = settings.context_tokens;
    let (plan, _) = plan_charged(
        &file,
        &profile,
        settings,
        &[context_params(args, n_ctx)],
        !args.repack,
    )
    .with_context(|| format!("planning {}", args.model.display()))?;
    tracing::info!(
        "plan{}: {}",
        if measured { "" } else { " (estimated profile)" },
        plan.summary()
    );
    let params = TieredParams {
        plan: Some(PlannedLoad::from_plan(&file, &plan)?),
        no_repack: !args.repack,
        prefetch: !args.no_prefetch,
        cache_dir: None,
        read_queue_depth: args.read_queue_depth,
    };
    Ok((
        params,
        plan.ram_budget_bytes + profile.host_overhead().bytes(),
    ))
}

/// The one context `run` decodes in.
fn context_params(args: &RunArgs, n_ctx: u32) -> ContextParams {
    ContextParams {
        n_ctx,
        n_threads: args.threads.unwrap_or(0),
        ..Default::default()
    }
}

fn message(role: &str, content: &str) -> ChatMessage {
    ChatMessage::new(role, content)
}

fn initial_messages(args: &RunArgs, user: &str) -> Vec<ChatMessage> {
    let mut messages = Vec::new();
    if let Some(system) = &args.system {
        messages.push(message("system", system));
    }
    messages.push(message("user", user));
    messages
}

fn print_piece(piece: &str) -> bool {
    let mut out = std::io::stdout().lock();
    // A closed stdout (e.g. `| head`) ends generation instead of failing it.
    out.write_all(piece.as_bytes())
        .and_then(|_| out.flush())
        .is_ok()
}

/// The interactive chat: the whole conversation is re-rendered each turn
/// (templates may change earlier turns' text) and decoded from a clean cache.
fn chat_loop(ctx: &mut Context, args: &RunArgs, params: &GenerateParams) -> anyhow::Result<()> {
    let model = Arc::clone(ctx.model());
    let template = prompt::model_template(&model)?;
    let mut history: Vec<ChatMessage> = args.system.iter().map(|s| message("system", s)).collect();
    if let Some(first) = &args.prompt {
        history.push(message("user", first));
        answer(ctx, &template, &mut history, params)?;
    }
    let stdin = std::io::stdin();
    loop {
        eprint!(">>> ");
        std::io::stderr().flush().ok();
        let mut line = String::new();
        if stdin.lock().read_line(&mut line).context("reading stdin")? == 0 {
            return Ok(());
        }
        let line = line.trim();
        match line {
            "" => continue,
            "/bye" | "/exit" => return Ok(()),
            "/clear" => {
                history.retain(|m| m.role == "system");
                continue;
            }
            _ => {}
        }
        history.push(message("user", line));
        answer(ctx, &template, &mut history, params)?;
    }
}

fn answer(
    ctx: &mut Context,
    template: &hypura_chat::ChatTemplate,
    history: &mut Vec<ChatMessage>,
    params: &GenerateParams,
) -> anyhow::Result<()> {
    let model = Arc::clone(ctx.model());
    let tokens = prompt::tokenize_chat(&model, &prompt::render_chat(template, history)?)?;
    ctx.clear_all();
    let completion = generate(ctx, 0, &tokens, params, &mut print_piece)?;
    println!();
    eprintln!("{}", summary(&completion, 0.0));
    history.push(message("assistant", &completion.text));
    Ok(())
}

fn summary(c: &Completion, load_seconds: f64) -> String {
    let t = &c.timings;
    let mut line = format!(
        "prompt: {} tokens, {:.1} tok/s | generated: {} tokens, {:.1} tok/s",
        t.prompt_tokens,
        t.prompt_tokens_per_second(),
        t.generated_tokens,
        t.eval_tokens_per_second()
    );
    if load_seconds > 0.0 {
        line.push_str(&format!(" | load {load_seconds:.2} s"));
    }
    line
}

fn json_report(c: &Completion, load_seconds: f64, stream: serde_json::Value) -> serde_json::Value {
    let t = &c.timings;
    let mut report = json!({
        "text": c.text,
        "tokens": c.tokens,
        "prompt_tokens": t.prompt_tokens,
        "generated_tokens": t.generated_tokens,
        "stats": {
            "finish_reason": c.finish_reason,
            "load_seconds": load_seconds,
            "prompt_eval_seconds": t.prompt_eval_seconds,
            "prompt_tokens_per_second": t.prompt_tokens_per_second(),
            "eval_seconds": t.eval_seconds,
            "tokens_per_second": t.eval_tokens_per_second(),
        }
    });
    // Streaming counters (mode, nvme_bytes_read, expert_hits, ...) join the stats.
    if let (Some(stats), serde_json::Value::Object(stream)) =
        (report["stats"].as_object_mut(), stream)
    {
        stats.extend(stream);
    }
    report
}
