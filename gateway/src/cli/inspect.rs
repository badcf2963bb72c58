//! `hypura inspect`: reads only the GGUF header and tensor table; with
//! `--plan`, also where the planner would put every tensor and the decode
//! speed it predicts.
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::Args;
use hypura_gguf::inspect::ModelReport;
use hypura_gguf::GgufFile;
use hypura_scheduler::cost::PromptPrediction;
use hypura_scheduler::plan::{
    prompt_ubatch_tokens, Budgets, Plan, PlanSettings, DEFAULT_UBATCH_TOKENS,
};
use hypura_scheduler::profile::HardwareProfile;
use hypura_scheduler::size::format_bytes;
use llama_tiered::tiered::{plan_file, Mode};
use serde_json::json;

use super::output::emit;
use crate::pool::planner::{self, find_profile, LoadedProfile};

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// Path of a GGUF model file.
    model: PathBuf,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Show the placement plan: tier per tensor, mode, cache sizes, predicted
    /// decode speed and its bottleneck.
    #[arg(long)]
    plan: bool,
    /// Most GPU memory for weights and KV cache, e.g. 16GiB (default: the
    /// profile's free GPU memory less 1 GiB).
    #[arg(long, value_parser = parse_size, requires = "plan")]
    gpu_budget: Option<u64>,
    /// Most RAM for weights, KV cache and stream cache, e.g. 16GiB (default:
    /// 90% of the profile's available RAM).
    #[arg(long, value_parser = parse_size, requires = "plan")]
    ram_budget: Option<u64>,
    /// Context length in tokens whose KV cache counts against the budgets
    /// (capped at the model's training length).
    #[arg(long, default_value_t = 4096)]
    context: u32,
    /// Sequences decoded together, each with its own context's KV cache
    /// (`hypura serve --parallel`).
    #[arg(long, default_value_t = 1, requires = "plan")]
    parallel: u32,
    /// Plan for the machine of this saved profile (default: this machine's,
    /// cached by `hypura profile`).
    #[arg(long, requires = "plan")]
    profile: Option<PathBuf>,
    /// Plan only this mode.
    #[arg(long, requires = "plan")]
    mode: Option<Mode>,
    /// Also predict the time of a prompt of this many tokens (the planner's
    /// prompt model), in passes of `--ubatch`.
    #[arg(long, requires = "plan")]
    prompt_tokens: Option<u32>,
    /// Tokens per pass of the graph for `--prompt-tokens` (default: the
    /// whole prompt up to 4096 when experts stream, else up to 512; `hypura bench`
    /// and `serve` print the pass they took).
    #[arg(long, requires = "prompt_tokens")]
    ubatch: Option<u32>,
    /// `--prompt-tokens` is a model's first prompt: its stream cache empty.
    #[arg(long, requires = "prompt_tokens")]
    cold: bool,
    /// Show the plan `hypura serve` loads the model with, alone under these
    /// budgets and hot (its prompt pass's buffers charged, as the server
    /// charges them), and predict `--prompt-tokens` in the server's pass,
    /// instead of the planner's own choice under the budgets.
    #[arg(long, requires = "plan")]
    served: bool,
}

fn parse_size(text: &str) -> Result<u64, String> {
    hypura_scheduler::size::parse_size(text)
}

pub fn inspect(args: InspectArgs) -> anyhow::Result<()> {
    let file = GgufFile::open(&args.model)?;
    file.validate()?;
    if args.plan {
        return print_plan(&args, &file);
    }
    let report = ModelReport::from_gguf(&file);
    if args.json {
        let json = serde_json::to_string_pretty(&report).context("serializing the report")?;
        emit(&format!("{json}\n"))?;
    } else {
        emit(&report.to_string())?;
    }
    Ok(())
}

/// [`find_profile`], with an error telling what to do when there is none.
pub(super) fn require_profile(explicit: Option<&Path>) -> anyhow::Result<LoadedProfile> {
    find_profile(explicit)?.ok_or_else(|| {
        anyhow::anyhow!(
            "no hardware profile of this machine: run `hypura profile` once to measure it, \
             or pass --profile FILE (e.g. config/profiles/h200.json) to plan for another machine"
        )
    })
}

/// What a plan is asked for.
pub(super) struct PlanOptions {
    pub gpu_budget: Option<u64>,
    pub ram_budget: Option<u64>,
    pub context: u32,
    pub parallel: u32,
    pub mode: Option<Mode>,
}

/// The context the engine will use: `requested`, capped at the model's
/// training length (as `hypura run` does).
pub(super) fn effective_context(file: &GgufFile, requested: u32) -> u32 {
    let train = file
        .arch_u64("context_length")
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(requested)
        .max(16);
    requested.clamp(16, train)
}

/// Plans `file` on `profile`.
pub(super) fn make_plan(
    file: &GgufFile,
    profile: &HardwareProfile,
    options: &PlanOptions,
) -> anyhow::Result<Plan> {
    Ok(plan_file(file, profile, plan_settings(file, options))?)
}

/// What the planner is asked for `options`.
pub(super) fn plan_settings(file: &GgufFile, options: &PlanOptions) -> PlanSettings {
    let budgets = Budgets {
        gpu_bytes: options.gpu_budget,
        ram_bytes: options.ram_budget,
    };
    let context = effective_context(file, options.context);
    PlanSettings {
        mode: options.mode,
        ..planner::plan_settings(budgets, context, options.parallel)
    }
}

fn print_plan(args: &InspectArgs, file: &GgufFile) -> anyhow::Result<()> {
    let loaded = require_profile(args.profile.as_deref())?;
    let options = PlanOptions {
        gpu_budget: args.gpu_budget,
        ram_budget: args.ram_budget,
        context: args.context,
        parallel: args.parallel,
        mode: args.mode,
    };
    // With a budget: the server's settings, its idle runner measured once
    // for both the least it charges and (`--served`) the plan it loads.
    let serve = match (args.gpu_budget, args.ram_budget) {
        (None, None) => None,
        _ => Some(serve_settings(args, &loaded)?),
    };
    let least = serve
        .as_ref()
        .map(|settings| crate::pool::registry::least_under_budget(&args.model, settings))
        .transpose()
        .map_err(anyhow::Error::msg)?;
    if let Some(least) = least {
        eprintln!(
            "hypura: under `hypura serve` with these budgets, --context {} and --parallel {}, \
             {} needs at least {least} (streaming, its contexts and runner included)",
            args.context,
            args.parallel,
            args.model.display()
        );
    }
    let (plan, served_pass) = if args.served {
        let settings = serve.as_ref().ok_or_else(|| {
            anyhow::anyhow!(
                "--served needs --gpu-budget or --ram-budget: without budgets the server plans as `inspect --plan` does"
            )
        })?;
        let (plan, pass) = crate::pool::registry::served_plan(&args.model, settings)
            .map_err(anyhow::Error::msg)
            .with_context(|| {
                format!(
                    "planning {} as `hypura serve` loads it",
                    args.model.display()
                )
            })?;
        (plan, Some(pass))
    } else {
        let plan = make_plan(file, &loaded.profile, &options)
            .with_context(|| format!("planning {}", args.model.display()))?;
        (plan, None)
    };
    if args.json {
        let mut value = plan_json(&plan);
        if let Some(least) = least {
            value["least_under_budget"] = json!(least);
        }
        if let Some(tokens) = args.prompt_tokens {
            value["prompt"] = json!(prompt_prediction(args, &plan, tokens, served_pass));
        }
        value["model"] = json!(args.model.display().to_string());
        value["profile"] = json!({
            "path": loaded.path.display().to_string(),
            "host": loaded.profile.host,
        });
        emit(&format!("{}\n", serde_json::to_string_pretty(&value)?))?;
    } else {
        emit(&plan_table(&plan, &args.model, &loaded))?;
        if let Some(tokens) = args.prompt_tokens {
            let p = prompt_prediction(args, &plan, tokens, served_pass);
            emit(&format!(
                "{:<20}{tokens} tokens in {} pass(es): {:.2} s, {:.1} tok/s (reads {:.2} s, \
                 host→GPU copies {:.2} s, compute {:.2} s)\n",
                "prompt",
                p.passes,
                p.seconds,
                p.tokens_per_second,
                p.read_seconds,
                p.copy_seconds,
                p.compute_seconds
            ))?;
        }
    }
    Ok(())
}

/// `hypura serve`'s settings for the same budgets, context and sequences,
/// with a runner measured as the server measures it: what the server would
/// charge the model at the least (the figure of its plan line and of its
/// refusal) and the plan it loads are computed with them.
fn serve_settings(
    args: &InspectArgs,
    loaded: &LoadedProfile,
) -> anyhow::Result<crate::pool::registry::EngineSettings> {
    let runners = crate::pool::runner::Runners::start().map_err(anyhow::Error::msg)?;
    Ok(crate::pool::registry::EngineSettings {
        n_ctx_per_seq: args.context,
        n_parallel: args.parallel,
        n_batch: crate::config::DEFAULT_BATCH.max(args.parallel),
        n_threads: 0,
        queue_limit: crate::config::DEFAULT_QUEUE_LIMIT,
        default_keep_alive: crate::config::DEFAULT_KEEP_ALIVE,
        demote_after: std::time::Duration::MAX,
        gpu_budget_bytes: args.gpu_budget,
        ram_budget_bytes: args.ram_budget,
        profile: crate::pool::planner::ServerProfile::new(loaded.profile.clone()),
        runners: Some(std::sync::Arc::new(runners)),
        default_max_tokens: crate::config::DEFAULT_MAX_TOKENS,
        prompt_cache: Default::default(),
    })
}

/// The prompt model's prediction for `--prompt-tokens`: in passes of
/// `--ubatch`, else of the server's pass (`served`; 0: llama.cpp's
/// default), else of those a context of that batch would take were its
/// buffers to fit.
fn prompt_prediction(
    args: &InspectArgs,
    plan: &Plan,
    tokens: u32,
    served: Option<u32>,
) -> PromptPrediction {
    let ubatch = args.ubatch.unwrap_or_else(|| match served {
        Some(0) => tokens.clamp(1, DEFAULT_UBATCH_TOKENS),
        Some(pass) => pass,
        None => prompt_ubatch_tokens(plan.mode, tokens, |_| true),
    });
    plan.predict_prompt(tokens, ubatch, args.cold)
}

/// The plan as one JSON object (without the per-tensor tiers' bulk beyond a map).
pub(super) fn plan_json(plan: &Plan) -> serde_json::Value {
    let p = &plan.prediction;
    json!({
        "mode": plan.mode,
        "tier_bytes": plan.tier_bytes,
        "predicted_tokens_per_second": p.tokens_per_second,
        "bottleneck": p.bottleneck,
        "seconds_per_token": {
            "total": p.seconds_per_token,
            "gpu": p.gpu_seconds,
            "ram": p.ram_seconds,
            "nvme": p.nvme_seconds,
            "pcie": p.pcie_seconds,
            "overhead": p.overhead_seconds,
        },
        "gpu_budget_bytes": plan.gpu_budget_bytes,
        "ram_budget_bytes": plan.ram_budget_bytes,
        "context_tokens": plan.context_tokens,
        "sequences": plan.sequences,
        "gpu_layers": plan.gpu_layers,
        "kv_cache_bytes": plan.kv_cache_bytes,
        "kv_cache_gpu_bytes": plan.kv_cache_gpu_bytes,
        "stream_cache_bytes": plan.stream_cache_bytes,
        "pool_slots": plan.pool_slots,
        "prefetch_depth_layers": plan.prefetch_depth_layers,
        "expected_hit_rate": plan.expected_hit_rate,
        "nvme_bytes_per_token": plan.nvme_bytes_per_token,
        "rates_gbps": plan.rates,
        "tiers": plan.tiers,
    })
}

fn plan_table(plan: &Plan, model: &Path, loaded: &LoadedProfile) -> String {
    let p = &plan.prediction;
    let b = &plan.tier_bytes;
    let ms = |s: f64| format!("{:.3} ms", s * 1e3);
    let mut out = String::new();
    let mut line = |k: &str, v: String| out.push_str(&format!("{k:<20}{v}\n"));
    line("model", model.display().to_string());
    line(
        "profile",
        format!("{} ({})", loaded.profile.host, loaded.path.display()),
    );
    line("mode", plan.mode.to_string());
    line(
        "budgets",
        format!(
            "GPU {}, RAM {}",
            format_bytes(plan.gpu_budget_bytes),
            format_bytes(plan.ram_budget_bytes)
        ),
    );
    line(
        "GPU weights",
        format!("{} ({} GPU layers)", format_bytes(b.gpu), plan.gpu_layers),
    );
    line("RAM weights", format_bytes(b.ram));
    line("STREAM weights", format_bytes(b.stream));
    line(
        "KV cache",
        format!(
            "{} for {} × {} tokens ({} on GPU)",
            format_bytes(plan.kv_cache_bytes),
            plan.sequences,
            plan.context_tokens,
            format_bytes(plan.kv_cache_gpu_bytes)
        ),
    );
    if plan.mode != Mode::FullResident {
        let unit = if plan.mode == Mode::ExpertStreaming {
            "expert slices"
        } else {
            "layers"
        };
        line(
            "stream cache",
            format!(
                "{} in RAM ({} {unit}), expected hit rate {:.0}%",
                format_bytes(plan.stream_cache_bytes),
                plan.pool_slots,
                plan.expected_hit_rate * 100.0
            ),
        );
        line(
            "prefetch depth",
            format!("{} layers", plan.prefetch_depth_layers),
        );
        line(
            "NVMe per token",
            format_bytes(plan.nvme_bytes_per_token as u64),
        );
    }
    line(
        "predicted decode",
        format!(
            "{:.2} tok/s, bottleneck: {}",
            p.tokens_per_second,
            p.bottleneck.describe()
        ),
    );
    line(
        "time per token",
        format!(
            "GPU {}, RAM {}, NVMe {}, PCIe {}, overhead {}",
            ms(p.gpu_seconds),
            ms(p.ram_seconds),
            ms(p.nvme_seconds),
            ms(p.pcie_seconds),
            ms(p.overhead_seconds)
        ),
    );
    out
}
