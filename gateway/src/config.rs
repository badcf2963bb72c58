//! `hypura serve --config FILE`: the server's settings in one TOML file.
//!
//! One serde tree ([`ConfigFile`]), read and checked once at start-up by
//! [`load`]: unknown keys, wrong types, bad sizes or durations, values out of
//! range, missing model files and duplicate names are errors that name the key
//! (`server.gpu_budget`, `models[1].name`) and say what to do. Flags given on
//! the command line override the file. `config/hypura.toml` documents every
//! key with its default.
//!
//! Relative paths in the file are relative to the file's own directory.
use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::Context as _;
use hypura_scheduler::size::parse_size;
use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

use crate::core::validation::{KeepAlive, ModelName};
use crate::pool::registry::{ModelPolicy, Pin};
use crate::telemetry::{TelemetryConfig, TelemetrySection};

pub const DEFAULT_HOST: &str = "127.0.0.1";
pub const DEFAULT_PORT: u16 = 11434;
pub const DEFAULT_CONTEXT: u32 = 4096;
pub const DEFAULT_PARALLEL: u32 = 4;
pub const DEFAULT_QUEUE_LIMIT: usize = 64;
pub const DEFAULT_BATCH: u32 = 512;
pub const DEFAULT_KEEP_ALIVE: KeepAlive = KeepAlive::For(std::time::Duration::from_secs(300));
pub const DEFAULT_MAX_BODY_BYTES: usize = 32 * 1024 * 1024;
/// Most tokens of a reply whose request sets no limit (the context caps it too).
pub const DEFAULT_MAX_TOKENS: u32 = 4096;
/// RAM each model's prompt cache keeps beyond its slots.
pub const DEFAULT_PROMPT_CACHE_RAM: u64 = 1 << 30;
/// Disk the prompt cache's files take, all models together.
pub const DEFAULT_PROMPT_CACHE_DISK: u64 = 8 << 30;

/// The file as written: every key optional, unknown keys refused.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    #[serde(default)]
    pub server: ServerSection,
    #[serde(default)]
    pub models: Vec<ModelSection>,
    /// `[telemetry]`: log format and span export.
    #[serde(default)]
    pub telemetry: TelemetrySection,
    /// `[[upstreams]]`: other servers models are routed to.
    #[serde(default)]
    pub upstreams: Vec<crate::pool::upstream::config::UpstreamSection>,
}

/// `[server]`: the same settings as `hypura serve`'s flags of the same names.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSection {
    pub host: Option<String>,
    pub port: Option<u16>,
    pub api_key: Option<String>,
    pub context: Option<u32>,
    pub parallel: Option<u32>,
    pub queue_limit: Option<usize>,
    pub batch: Option<u32>,
    pub threads: Option<u32>,
    pub keep_alive: Option<Text>,
    /// A model idle this long is demoted to streaming (under a budget).
    pub demote_after: Option<Text>,
    pub max_body_bytes: Option<Text>,
    /// Memory all request bodies in flight may take together.
    pub body_memory: Option<Text>,
    /// The longest a whole request body may take to arrive.
    pub body_timeout: Option<Text>,
    /// Connections open at once, all clients together.
    pub max_connections: Option<usize>,
    /// Connections open at once from one address.
    pub max_connections_per_ip: Option<usize>,
    pub models_dir: Option<PathBuf>,
    pub gpu_budget: Option<Text>,
    pub ram_budget: Option<Text>,
    /// `/metrics` open to loopback clients without the API key.
    pub metrics_open_on_loopback: Option<bool>,
    /// The key `/api/pull`, `/api/create`, `/api/copy` and `/api/delete` need.
    pub admin_key: Option<String>,
    /// Serve a non-loopback address without an API key.
    #[serde(default)]
    pub insecure_no_auth: bool,
    /// Web origins besides the local ones that may call the API.
    #[serde(default)]
    pub allowed_origins: Vec<String>,
    /// `Host` names besides the loopback ones the server answers to.
    #[serde(default)]
    pub allowed_hosts: Vec<String>,
    /// Where `/api/pull` may serve local files from.
    #[serde(default)]
    pub model_roots: Vec<PathBuf>,
    /// Hosts `/api/pull` may download from.
    #[serde(default)]
    pub pull_hosts: Vec<String>,
    /// Let `/api/pull` reach loopback and private addresses.
    #[serde(default)]
    pub pull_allow_private: bool,
    /// Largest download of `/api/pull`.
    pub pull_max_bytes: Option<Text>,
    pub in_process: Option<bool>,
    /// Most tokens of a reply whose request sets no limit.
    pub default_max_tokens: Option<u32>,
    /// RAM each model's prompt cache may keep beyond its slots.
    pub prompt_cache_ram: Option<Text>,
    /// Bytes the prompt cache's files may take on disk, all models together.
    pub prompt_cache_disk: Option<Text>,
    /// Slots per model beyond `parallel` that keep idle conversations' KV.
    pub idle_slots: Option<u32>,
    /// Named API keys with roles and limits (docs/tenancy.md).
    pub keys_file: Option<PathBuf>,
}

/// `[[models]]`: one model file, its name and its own settings.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    pub name: Option<String>,
    pub path: PathBuf,
    pub keep_alive: Option<Text>,
    pub pin: Option<Pin>,
    pub priority: Option<i32>,
    pub context: Option<u32>,
    pub parallel: Option<u32>,
}

/// A value written as a string or a number (`keep_alive = "5m"` or `300`,
/// `gpu_budget = "16GiB"` or `17179869184`), kept as text until it is parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Text(pub String);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Text, D::Error> {
        struct TextVisitor;
        impl Visitor<'_> for TextVisitor {
            type Value = Text;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string or a number")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Text, E> {
                Ok(Text(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Text, E> {
                Ok(Text(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Text, E> {
                Ok(Text(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Text, E> {
                Ok(Text(v.to_string()))
            }
        }
        deserializer.deserialize_any(TextVisitor)
    }
}

/// The file's settings, checked; `None` where the file does not set a key.
#[derive(Debug, Default)]
pub struct Config {
    pub host: Option<String>,
    pub port: Option<u16>,
    pub api_key: Option<String>,
    pub context: Option<u32>,
    pub parallel: Option<u32>,
    pub queue_limit: Option<usize>,
    pub batch: Option<u32>,
    pub threads: Option<u32>,
    pub default_max_tokens: Option<u32>,
    pub keep_alive: Option<KeepAlive>,
    pub demote_after: Option<KeepAlive>,
    pub max_body_bytes: Option<usize>,
    pub body_memory_bytes: Option<usize>,
    pub body_timeout: Option<std::time::Duration>,
    pub max_connections: Option<usize>,
    pub max_connections_per_ip: Option<usize>,
    pub models_dir: Option<PathBuf>,
    pub gpu_budget_bytes: Option<u64>,
    pub ram_budget_bytes: Option<u64>,
    pub prompt_cache_ram_bytes: Option<u64>,
    pub prompt_cache_disk_bytes: Option<u64>,
    pub idle_slots: Option<u32>,
    /// The keys file, relative to the configuration file's directory.
    pub keys_file: Option<PathBuf>,
    pub metrics_open_on_loopback: Option<bool>,
    /// Run every model in the server's process, not in runner processes.
    pub in_process: Option<bool>,
    pub models: Vec<ModelConfig>,
    pub telemetry: TelemetryConfig,
    /// Origins, hosts, keys and pull limits (`default_roots` left empty).
    pub security: crate::security::SecuritySettings,
    pub upstreams: Vec<crate::pool::upstream::config::UpstreamConfig>,
}

/// A `[[models]]` entry, checked: its name (given, or the file stem with
/// `:latest`), an existing file, and its settings.
#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub name: ModelName,
    pub path: PathBuf,
    pub policy: ModelPolicy,
}

/// Reads and checks the configuration file at `path`.
pub fn load(path: &Path) -> anyhow::Result<Config> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the configuration file {}", path.display()))?;
    let base = path.parent().unwrap_or(Path::new("."));
    parse(&text, base).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// Parses and checks a configuration; relative paths are taken from `base`.
pub fn parse(text: &str, base: &Path) -> Result<Config, String> {
    let file: ConfigFile = serde_path_to_error::deserialize(toml::Deserializer::new(text))
        .map_err(|e| {
            let key = e.path().to_string();
            let inner = e.into_inner();
            let line = inner
                .span()
                .map(|span| line_of(text, span.start))
                .map(|n| format!(" (line {n})"))
                .unwrap_or_default();
            let message = inner.message().trim_end();
            if key == "." {
                format!("{message}{line}")
            } else {
                format!("{key}: {message}{line}")
            }
        })?;
    file.check(base)
}

fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// `--parallel` / `parallel`: sequences decoded together.
pub fn check_parallel(n: u32) -> Result<u32, String> {
    if (1..=256).contains(&n) {
        Ok(n)
    } else {
        Err(format!("{n} is out of range: use 1 to 256"))
    }
}

/// `--context` / `context`: tokens per sequence.
pub fn check_context(n: u32) -> Result<u32, String> {
    if n >= 16 {
        Ok(n)
    } else {
        Err(format!("{n} is too small: use at least 16 tokens"))
    }
}

/// `--default-max-tokens` / `default_max_tokens`: tokens of a reply.
pub fn check_max_tokens(n: u32) -> Result<u32, String> {
    if n >= 1 {
        Ok(n)
    } else {
        Err("0 is too small: use at least 1 token".into())
    }
}

/// `--batch` / `batch`: tokens per decode call.
pub fn check_batch(n: u32) -> Result<u32, String> {
    if n >= 1 {
        Ok(n)
    } else {
        Err("0 is too small: use at least 1 token".into())
    }
}

/// `--body-timeout` / `body_timeout`: a duration of at least one second.
pub fn check_body_timeout(text: &str) -> Result<std::time::Duration, String> {
    match KeepAlive::from_flag(text)? {
        KeepAlive::For(d) if d >= std::time::Duration::from_secs(1) => Ok(d),
        _ => Err(format!(
            "{text:?} is out of range: give a duration of at least 1s (`30s`, `2m`)"
        )),
    }
}

/// `--max-connections` / `max_connections` and the per-address cap.
pub fn check_connections(n: usize) -> Result<usize, String> {
    if n >= 1 {
        Ok(n)
    } else {
        Err("0 is too small: allow at least 1 connection".into())
    }
}

fn at<T>(key: &str, result: Result<T, String>) -> Result<T, String> {
    result.map_err(|e| format!("{key}: {e}"))
}

fn keep_alive(key: &str, text: &Text) -> Result<KeepAlive, String> {
    at(key, KeepAlive::from_flag(&text.0))
}

fn size(key: &str, text: &Text) -> Result<u64, String> {
    at(key, parse_size(&text.0))
}

impl ConfigFile {
    fn check(self, base: &Path) -> Result<Config, String> {
        let s = self.server;
        let max_body_bytes = match &s.max_body_bytes {
            Some(t) => Some(at(
                "server.max_body_bytes",
                usize::try_from(size("server.max_body_bytes", t)?)
                    .map_err(|_| format!("{} is too large", t.0)),
            )?),
            None => None,
        };
        let body_memory_bytes = match &s.body_memory {
            Some(t) => Some(at(
                "server.body_memory",
                usize::try_from(size("server.body_memory", t)?)
                    .map_err(|_| format!("{} is too large", t.0)),
            )?),
            None => None,
        };
        let mut config = Config {
            host: s.host,
            port: s.port,
            api_key: s.api_key,
            default_max_tokens: s
                .default_max_tokens
                .map(|n| at("server.default_max_tokens", check_max_tokens(n)))
                .transpose()?,
            context: s
                .context
                .map(|n| at("server.context", check_context(n)))
                .transpose()?,
            parallel: s
                .parallel
                .map(|n| at("server.parallel", check_parallel(n)))
                .transpose()?,
            queue_limit: s.queue_limit,
            batch: s
                .batch
                .map(|n| at("server.batch", check_batch(n)))
                .transpose()?,
            threads: s.threads,
            keep_alive: s
                .keep_alive
                .map(|t| keep_alive("server.keep_alive", &t))
                .transpose()?,
            demote_after: s
                .demote_after
                .map(|t| keep_alive("server.demote_after", &t))
                .transpose()?,
            max_body_bytes,
            body_memory_bytes,
            body_timeout: s
                .body_timeout
                .map(|t| at("server.body_timeout", check_body_timeout(&t.0)))
                .transpose()?,
            max_connections: s
                .max_connections
                .map(|n| at("server.max_connections", check_connections(n)))
                .transpose()?,
            max_connections_per_ip: s
                .max_connections_per_ip
                .map(|n| at("server.max_connections_per_ip", check_connections(n)))
                .transpose()?,
            models_dir: s.models_dir.map(|d| base.join(d)),
            gpu_budget_bytes: s
                .gpu_budget
                .map(|t| size("server.gpu_budget", &t))
                .transpose()?,
            ram_budget_bytes: s
                .ram_budget
                .map(|t| size("server.ram_budget", &t))
                .transpose()?,
            prompt_cache_ram_bytes: s
                .prompt_cache_ram
                .map(|t| size("server.prompt_cache_ram", &t))
                .transpose()?,
            prompt_cache_disk_bytes: s
                .prompt_cache_disk
                .map(|t| size("server.prompt_cache_disk", &t))
                .transpose()?,
            idle_slots: s.idle_slots,
            keys_file: s.keys_file.map(|f| base.join(f)),
            metrics_open_on_loopback: s.metrics_open_on_loopback,
            in_process: s.in_process,
            models: Vec::new(),
            telemetry: self.telemetry.check()?,
            upstreams: crate::pool::upstream::config::check_all(self.upstreams)?,
            security: crate::security::SecuritySettings {
                allowed_origins: s.allowed_origins,
                allowed_hosts: s.allowed_hosts,
                api_key: None,
                admin_key: s.admin_key,
                insecure_no_auth: s.insecure_no_auth,
                model_roots: s.model_roots.iter().map(|r| base.join(r)).collect(),
                default_roots: Vec::new(),
                pull_hosts: s.pull_hosts,
                pull_allow_private: s.pull_allow_private,
                pull_max_bytes: s
                    .pull_max_bytes
                    .map(|t| size("server.pull_max_bytes", &t))
                    .transpose()?,
            },
        };
        for (i, model) in self.models.into_iter().enumerate() {
            let checked = model.check(i, base)?;
            if let Some(j) = config
                .models
                .iter()
                .position(|m| m.name.key == checked.name.key)
            {
                return Err(format!(
                    "models[{i}].name: \"{}\" is also the name of models[{j}]; give each model \
                     its own name",
                    checked.name.display
                ));
            }
            config.models.push(checked);
        }
        Ok(config)
    }
}

impl ModelSection {
    fn check(self, i: usize, base: &Path) -> Result<ModelConfig, String> {
        let path = base.join(&self.path);
        if !path.is_file() {
            let what = if path.exists() {
                "is not a file: name one .gguf file"
            } else {
                "does not exist: check the path (relative paths start at the configuration \
                 file's directory)"
            };
            return Err(format!("models[{i}].path: {} {what}", path.display()));
        }
        let name = match &self.name {
            Some(name) => {
                ModelName::parse(name, &format!("models[{i}].name")).map_err(|e| e.to_string())?
            }
            None => ModelName::from_file_stem(
                &path
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            ),
        };
        let policy = ModelPolicy {
            keep_alive: self
                .keep_alive
                .map(|t| keep_alive(&format!("models[{i}].keep_alive"), &t))
                .transpose()?,
            pin: self.pin.unwrap_or_default(),
            priority: self.priority.unwrap_or(0),
            n_ctx_per_seq: self
                .context
                .map(|n| at(&format!("models[{i}].context"), check_context(n)))
                .transpose()?,
            n_parallel: self
                .parallel
                .map(|n| at(&format!("models[{i}].parallel"), check_parallel(n)))
                .transpose()?,
        };
        Ok(ModelConfig { name, path, policy })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repo() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
    }

    /// The reference file parses, and the defaults it documents are the code's.
    #[test]
    fn reference_file_is_valid_and_states_the_defaults() {
        let config = load(&repo().join("config/hypura.toml")).unwrap();
        assert_eq!(config.host.as_deref(), Some(DEFAULT_HOST));
        assert_eq!(config.port, Some(DEFAULT_PORT));
        assert_eq!(config.api_key, None);
        assert_eq!(config.context, Some(DEFAULT_CONTEXT));
        assert_eq!(config.default_max_tokens, Some(DEFAULT_MAX_TOKENS));
        assert_eq!(config.parallel, Some(DEFAULT_PARALLEL));
        assert_eq!(config.queue_limit, Some(DEFAULT_QUEUE_LIMIT));
        assert_eq!(config.batch, Some(DEFAULT_BATCH));
        assert_eq!(config.threads, None);
        assert_eq!(config.keep_alive, Some(DEFAULT_KEEP_ALIVE));
        assert_eq!(config.max_body_bytes, Some(DEFAULT_MAX_BODY_BYTES));
        assert_eq!(
            config.body_memory_bytes,
            Some(crate::bodies::DEFAULT_BODY_MEMORY_BYTES)
        );
        assert_eq!(
            config.body_timeout,
            Some(crate::bodies::DEFAULT_BODY_TIMEOUT)
        );
        assert_eq!(
            config.max_connections,
            Some(crate::connections::DEFAULT_MAX_CONNECTIONS)
        );
        assert_eq!(
            config.max_connections_per_ip,
            Some(crate::connections::DEFAULT_MAX_CONNECTIONS_PER_IP)
        );
        assert_eq!(config.gpu_budget_bytes, None);
        assert_eq!(config.ram_budget_bytes, None);
        assert_eq!(
            config.prompt_cache_ram_bytes,
            Some(DEFAULT_PROMPT_CACHE_RAM)
        );
        assert_eq!(
            config.prompt_cache_disk_bytes,
            Some(DEFAULT_PROMPT_CACHE_DISK)
        );
        assert_eq!(config.idle_slots, Some(0));
        assert_eq!(
            config.telemetry,
            crate::telemetry::TelemetryConfig {
                log_format: Some(crate::telemetry::LogFormat::Text),
                otlp_endpoint: None,
                service_name: Some(crate::telemetry::DEFAULT_SERVICE_NAME.into()),
                export_interval: Some(crate::telemetry::DEFAULT_EXPORT_INTERVAL),
            }
        );
        let security = &config.security;
        assert_eq!(
            security.pull_max_bytes,
            Some(crate::security::remote::DEFAULT_PULL_MAX_BYTES)
        );
        assert!(!security.insecure_no_auth && !security.pull_allow_private);
        assert!(security.allowed_origins.is_empty() && security.pull_hosts.is_empty());
        assert_eq!(config.models.len(), 1);
        let smol = &config.models[0];
        assert_eq!(smol.name.display, "smollm2:135m");
        assert_eq!(
            std::fs::canonicalize(&smol.path).unwrap(),
            std::fs::canonicalize(repo().join("models/SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap()
        );
        assert_eq!(
            smol.policy,
            ModelPolicy {
                keep_alive: Some(KeepAlive::Forever),
                pin: Pin::None,
                priority: 0,
                n_ctx_per_seq: None,
                n_parallel: None,
            }
        );
    }

    fn error(text: &str) -> String {
        parse(text, &repo()).unwrap_err()
    }

    #[test]
    fn errors_name_the_key() {
        assert_eq!(
            error("[server]\nport = 1\nprot = 2\n"),
            "server.prot: unknown field `prot`, expected one of `host`, `port`, `api_key`, \
             `context`, `parallel`, `queue_limit`, `batch`, `threads`, `keep_alive`, \
             `demote_after`, `max_body_bytes`, `body_memory`, `body_timeout`, \
             `max_connections`, `max_connections_per_ip`, `models_dir`, `gpu_budget`, `ram_budget`, \
             `metrics_open_on_loopback`, `admin_key`, `insecure_no_auth`, `allowed_origins`, \
             `allowed_hosts`, `model_roots`, `pull_hosts`, `pull_allow_private`, \
             `pull_max_bytes`, `in_process`, `default_max_tokens`, `prompt_cache_ram`, \
             `prompt_cache_disk`, `idle_slots`, `keys_file` (line 3)"
        );
        assert_eq!(
            error("[server]\nport = \"x\"\n"),
            "server.port: invalid type: string \"x\", expected u16 (line 2)"
        );
        assert_eq!(
            error("[server]\nram_budget = \"16 GiBs\"\n"),
            "server.ram_budget: '16 GiBs': unknown unit 'gibs' (use B, KiB, MiB, GiB, TiB, kB, \
             MB, GB or TB)"
        );
        assert_eq!(
            error("[server]\nparallel = 0\n"),
            "server.parallel: 0 is out of range: use 1 to 256"
        );
        assert_eq!(
            error(
                "[[models]]\npath = \"models/SmolLM2-135M-Instruct.Q4_1.gguf\"\npin = \"half\"\n"
            ),
            "models[0].pin: unknown variant `half`, expected one of `none`, `streaming`, \
             `partial`, `full` (line 3)"
        );
        assert_eq!(
            error("[server\n"),
            "invalid table header\nexpected `.`, `]` (line 1)"
        );
    }

    #[test]
    fn sizes_and_durations_take_strings_or_numbers() {
        let config = parse(
            "[server]\ngpu_budget = \"16GiB\"\nram_budget = 1000\nkeep_alive = 30\n\
             max_body_bytes = \"1MiB\"\n",
            &repo(),
        )
        .unwrap();
        assert_eq!(config.gpu_budget_bytes, Some(16 << 30));
        assert_eq!(config.ram_budget_bytes, Some(1000));
        assert_eq!(
            config.keep_alive,
            Some(KeepAlive::For(std::time::Duration::from_secs(30)))
        );
        assert_eq!(config.max_body_bytes, Some(1 << 20));
        assert_eq!(config.in_process, None);
        assert!(config.models.is_empty());
        let config = parse("[server]\nin_process = true\n", &repo()).unwrap();
        assert_eq!(config.in_process, Some(true));
    }

    #[test]
    fn models_get_names_and_settings() {
        let config = parse(
            "[[models]]\npath = \"models/SmolLM2-135M-Instruct.Q4_1.gguf\"\n\
             [[models]]\nname = \"smol\"\npath = \"models/SmolLM2-135M-Instruct.Q4_1.gguf\"\n\
             pin = \"partial\"\npriority = -3\ncontext = 512\nparallel = 2\nkeep_alive = \"0\"\n",
            &repo(),
        )
        .unwrap();
        assert_eq!(
            config.models[0].name.display,
            "SmolLM2-135M-Instruct.Q4_1:latest"
        );
        assert_eq!(config.models[0].policy, ModelPolicy::default());
        assert_eq!(config.models[1].name.display, "smol:latest");
        assert_eq!(
            config.models[1].policy,
            ModelPolicy {
                keep_alive: Some(KeepAlive::For(std::time::Duration::ZERO)),
                pin: Pin::Partial,
                priority: -3,
                n_ctx_per_seq: Some(512),
                n_parallel: Some(2),
            }
        );
        assert_eq!(
            error(
                "[[models]]\nname = \"a:b\"\npath = \"models/SmolLM2-135M-Instruct.Q4_1.gguf\"\n\
                 [[models]]\nname = \"A:B\"\npath = \"models/SmolLM2-135M-Instruct.Q4_1.gguf\"\n"
            ),
            "models[1].name: \"A:B\" is also the name of models[0]; give each model its own name"
        );
    }
}
