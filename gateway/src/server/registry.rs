//! The model registry: `name:tag` → GGUF file, and the models loaded now.
//!
//! Names live in a [`DashMap`] (lower-case key → [`NamedModel`]); several
//! names may point at one file (`/api/copy`). Loaded models live in a moka
//! cache keyed by file path, one [`BatchEngine`] each, with a per-entry
//! time-to-idle: while a request holds a [`ModelLease`] the entry never
//! expires; when the last lease ends, it expires after the `keep_alive` of the
//! latest request (unloaded at once for 0, never for a negative value).
//! Loading runs `try_get_with` on a blocking thread: concurrent requests for
//! one model wait for one load, and requests for other models never wait on it.
//! Model files are only read.
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use dashmap::DashMap;
use llama_tiered::batch::{BatchConfig, BatchEngine};
use llama_tiered::chat::ChatTemplate;
use llama_tiered::gguf::{GgufFile, GgufValue};
use llama_tiered::inspect::file_type_name;
use llama_tiered::llama::{Model, ModelParams};
use llama_tiered::prompt;
use moka::sync::Cache;
use moka::Expiry;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::error::ApiError;
use super::validation::{KeepAlive, ModelName};

/// How every model is run (from the command line).
#[derive(Debug, Clone)]
pub struct EngineSettings {
    /// Context per sequence in tokens, capped at each model's training context.
    pub n_ctx_per_seq: u32,
    /// Sequences decoded together per model.
    pub n_parallel: u32,
    pub n_batch: u32,
    /// Decode threads (0 = one per core).
    pub n_threads: u32,
    /// Requests waiting for a slot before new ones get 503.
    pub queue_limit: usize,
    pub default_keep_alive: KeepAlive,
}

/// What a GGUF header says about a model, read once at registration.
#[derive(Debug)]
pub struct ModelInfo {
    pub architecture: String,
    /// `"135M"`, `"7.2B"`: Ollama's `parameter_size`.
    pub parameter_size: String,
    /// `"Q4_1"`: Ollama's `quantization_level`.
    pub quantization: String,
    pub context_length: Option<u64>,
    pub file_bytes: u64,
    pub modified: SystemTime,
    /// sha256 of the file's identity (path, size, mtime), not of its bytes:
    /// hashing a many-GiB file at start-up would be too slow.
    pub digest: String,
    pub chat_template: Option<String>,
    /// Scalar metadata (arrays as `null`), for `/api/show`'s `model_info`.
    pub model_info: Map<String, Value>,
    pub capabilities: Vec<&'static str>,
}

/// A model file under one name.
#[derive(Debug, Clone)]
pub struct NamedModel {
    pub name: String,
    pub path: Arc<PathBuf>,
    pub info: Arc<ModelInfo>,
}

impl ModelInfo {
    /// Reads and validates the GGUF header and tensor table of `path`.
    pub fn read(path: &Path) -> Result<ModelInfo, llama_tiered::gguf::GgufError> {
        let file = GgufFile::open(path)?;
        file.validate()?;
        let meta = std::fs::metadata(path).ok();
        let modified = meta
            .as_ref()
            .and_then(|m| m.modified().ok())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        let architecture = file.architecture().unwrap_or("unknown").to_string();
        let parameters = file.parameter_count();
        let chat_template = file.get_str("tokenizer.chat_template").map(str::to_string);
        let mut model_info = Map::new();
        for (key, value) in file.metadata() {
            if key == "tokenizer.chat_template" {
                continue;
            }
            model_info.insert(key.to_string(), json_value(value));
        }
        model_info.insert("general.parameter_count".into(), parameters.into());
        let mut capabilities = vec!["completion"];
        if chat_template
            .as_deref()
            .is_some_and(|t| t.contains("enable_thinking") || t.contains("<think>"))
        {
            capabilities.push("thinking");
        }
        let mut hasher = Sha256::new();
        hasher.update(path.as_os_str().as_encoded_bytes());
        hasher.update(file.file_bytes().to_le_bytes());
        let since_epoch = modified
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        hasher.update(since_epoch.as_nanos().to_le_bytes());
        Ok(ModelInfo {
            parameter_size: parameter_size(parameters),
            quantization: file
                .get_u64("general.file_type")
                .map(file_type_name)
                .unwrap_or_else(|| "unknown".into()),
            context_length: file.arch_u64("context_length"),
            file_bytes: file.file_bytes(),
            architecture,
            modified,
            digest: hex(&hasher.finalize()),
            chat_template,
            model_info,
            capabilities,
        })
    }
}

fn json_value(value: &GgufValue) -> Value {
    match value {
        GgufValue::F32(v) => Value::from(*v as f64),
        GgufValue::F64(v) => Value::from(*v),
        GgufValue::Bool(v) => Value::from(*v),
        GgufValue::String(s) => Value::from(s.to_string_lossy().into_owned()),
        GgufValue::Array(_) => Value::Null,
        other => other
            .as_i64()
            .map(Value::from)
            .or_else(|| other.as_u64().map(Value::from))
            .unwrap_or(Value::Null),
    }
}

/// Ollama's human-readable parameter count: `135M`, `1.2B`.
pub fn parameter_size(parameters: u64) -> String {
    let p = parameters as f64;
    if p >= 1e9 {
        format!("{:.1}B", p / 1e9)
    } else if p >= 1e6 {
        format!("{:.0}M", p / 1e6)
    } else {
        format!("{:.0}K", p / 1e3)
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A model in memory: its engine, its compiled chat template, and its keep-alive state.
pub struct LoadedModel {
    /// The name it was loaded under.
    pub name: String,
    pub path: Arc<PathBuf>,
    pub info: Arc<ModelInfo>,
    pub engine: BatchEngine,
    /// The model's own template (ChatML when it has none), or why it does not compile.
    pub template: Result<ChatTemplate, String>,
    pub n_ctx_per_seq: u32,
    /// Leases held now; the entry does not expire while this is above 0.
    active: AtomicUsize,
    keep_alive: Mutex<KeepAlive>,
    /// When it will be unloaded if idle; `None` = never.
    expires_at: Mutex<Option<SystemTime>>,
}

impl LoadedModel {
    pub fn model(&self) -> &Arc<Model> {
        self.engine.model()
    }

    pub fn expires_at(&self) -> Option<SystemTime> {
        *lock(&self.expires_at)
    }

    fn idle_ttl(&self) -> Option<Duration> {
        if self.active.load(Ordering::SeqCst) > 0 {
            return None;
        }
        match *lock(&self.keep_alive) {
            KeepAlive::Forever => None,
            KeepAlive::For(d) => Some(d),
        }
    }

    fn set_keep_alive(&self, keep_alive: KeepAlive) {
        *lock(&self.keep_alive) = keep_alive;
        *lock(&self.expires_at) = match keep_alive {
            KeepAlive::Forever => None,
            KeepAlive::For(d) => Some(SystemTime::now() + d),
        };
    }
}

/// Poisoning cannot leave these plain values inconsistent: keep going.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct KeepAliveExpiry;

impl Expiry<Arc<PathBuf>, Arc<LoadedModel>> for KeepAliveExpiry {
    fn expire_after_create(
        &self,
        _: &Arc<PathBuf>,
        model: &Arc<LoadedModel>,
        _: Instant,
    ) -> Option<Duration> {
        model.idle_ttl()
    }

    fn expire_after_read(
        &self,
        _: &Arc<PathBuf>,
        model: &Arc<LoadedModel>,
        _: Instant,
        _: Option<Duration>,
        _: Instant,
    ) -> Option<Duration> {
        model.idle_ttl()
    }

    fn expire_after_update(
        &self,
        _: &Arc<PathBuf>,
        model: &Arc<LoadedModel>,
        _: Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        model.idle_ttl()
    }
}

/// A request's hold on a loaded model: the model stays loaded while it lives.
pub struct ModelLease {
    model: Arc<LoadedModel>,
    loaded: Cache<Arc<PathBuf>, Arc<LoadedModel>>,
    /// Time this request spent loading the model (zero when it was loaded).
    pub load_duration: Duration,
}

impl std::ops::Deref for ModelLease {
    type Target = LoadedModel;
    fn deref(&self) -> &LoadedModel {
        &self.model
    }
}

impl Drop for ModelLease {
    fn drop(&mut self) {
        if self.model.active.fetch_sub(1, Ordering::SeqCst) != 1 {
            return;
        }
        let keep_alive = *lock(&self.model.keep_alive);
        self.model.set_keep_alive(keep_alive);
        if keep_alive.is_zero() {
            self.loaded.invalidate(&self.model.path);
        } else {
            // A read recomputes the entry's expiry, now that it is idle.
            let _ = self.loaded.get(&self.model.path);
        }
    }
}

/// Names → files, and the loaded models.
pub struct Registry {
    names: DashMap<String, NamedModel>,
    loaded: Cache<Arc<PathBuf>, Arc<LoadedModel>>,
    settings: EngineSettings,
}

impl Registry {
    pub fn new(settings: EngineSettings) -> Registry {
        let loaded = Cache::builder()
            .expire_after(KeepAliveExpiry)
            .eviction_listener(|path: Arc<Arc<PathBuf>>, model: Arc<LoadedModel>, cause| {
                tracing::info!("unloading {} ({cause:?})", path.display());
                // Finishes what is in flight; memory goes with the last lease.
                std::thread::spawn(move || model.engine.shutdown());
            })
            .build();
        Registry {
            names: DashMap::new(),
            loaded,
            settings,
        }
    }

    pub fn settings(&self) -> &EngineSettings {
        &self.settings
    }

    /// Serves `path` as `name`; fails if the name is taken by another file.
    pub fn register(
        &self,
        name: ModelName,
        path: PathBuf,
        info: Arc<ModelInfo>,
    ) -> Result<(), String> {
        if let Some(existing) = self.names.get(&name.key) {
            if *existing.path != path {
                return Err(format!(
                    "two models are named {}: {} and {}",
                    name.display,
                    existing.path.display(),
                    path.display()
                ));
            }
            return Ok(());
        }
        self.names.insert(
            name.key,
            NamedModel {
                name: name.display,
                path: Arc::new(path),
                info,
            },
        );
        Ok(())
    }

    pub fn resolve(&self, name: &ModelName) -> Option<NamedModel> {
        self.names.get(&name.key).map(|e| e.value().clone())
    }

    /// Every name, sorted.
    pub fn list(&self) -> Vec<NamedModel> {
        let mut all: Vec<NamedModel> = self.names.iter().map(|e| e.value().clone()).collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// The models in memory now, by name.
    pub fn loaded(&self) -> Vec<Arc<LoadedModel>> {
        let mut all: Vec<Arc<LoadedModel>> = self.loaded.iter().map(|(_, v)| v).collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// Loads the model named `name` unless it is loaded, and holds it for one
    /// request. `keep_alive` (default: the server's) applies after the request.
    pub async fn acquire(
        &self,
        requested: &str,
        name: &ModelName,
        keep_alive: Option<KeepAlive>,
    ) -> Result<ModelLease, ApiError> {
        let named = self
            .resolve(name)
            .ok_or_else(|| ApiError::ModelNotFound(requested.to_string()))?;
        let started = Instant::now();
        let loaded = self.loaded.clone();
        let settings = self.settings.clone();
        let key = Arc::clone(&named.path);
        let model = tokio::task::spawn_blocking(move || {
            loaded.try_get_with(key, || load(&named, &settings))
        })
        .await
        .map_err(|e| ApiError::Internal(format!("model load task failed: {e}")))?
        .map_err(|e| (*e).clone())?;
        let load_duration = started.elapsed();
        model.active.fetch_add(1, Ordering::SeqCst);
        model.set_keep_alive(keep_alive.unwrap_or(self.settings.default_keep_alive));
        // A read recomputes the expiry: none while the lease lives.
        let _ = self.loaded.get(&model.path);
        Ok(ModelLease {
            model,
            loaded: self.loaded.clone(),
            load_duration,
        })
    }

    /// Unloads the model named `name` if it is loaded (in-flight requests finish).
    pub fn unload(&self, name: &ModelName) -> bool {
        let Some(named) = self.resolve(name) else {
            return false;
        };
        let was_loaded = self.loaded.contains_key(&named.path);
        self.loaded.invalidate(&named.path);
        was_loaded
    }

    /// `/api/copy`: `destination` names the same file as `source`.
    pub fn copy(&self, source: &ModelName, destination: ModelName) -> Result<(), ApiError> {
        let named = self
            .resolve(source)
            .ok_or_else(|| ApiError::ModelNotFound(source.display.clone()))?;
        self.names.insert(
            destination.key,
            NamedModel {
                name: destination.display,
                ..named
            },
        );
        Ok(())
    }

    /// `/api/delete`: forgets the name (the file is left alone); the model is
    /// unloaded when no other name serves its file.
    pub fn delete(&self, name: &ModelName) -> Result<(), ApiError> {
        let (_, named) = self
            .names
            .remove(&name.key)
            .ok_or_else(|| ApiError::ModelNotFound(name.display.clone()))?;
        if !self.names.iter().any(|e| e.path == named.path) {
            self.loaded.invalidate(&named.path);
        }
        Ok(())
    }

    /// Expires idle models whose keep-alive has passed (moka evicts lazily).
    pub fn run_pending_tasks(&self) {
        self.loaded.run_pending_tasks();
    }

    /// Stops every engine: in-flight requests finish, new ones are refused.
    pub fn shutdown(&self) {
        for (_, model) in self.loaded.iter() {
            model.engine.shutdown();
        }
    }
}

fn load(named: &NamedModel, settings: &EngineSettings) -> Result<Arc<LoadedModel>, ApiError> {
    tracing::info!("loading {} from {}", named.name, named.path.display());
    // Same kernels as `hypura run` and every streaming mode: no CPU repacking,
    // so a prompt gets the same tokens whichever way the model is held.
    let params = ModelParams {
        no_repack: true,
        ..Default::default()
    };
    let model = Model::load(&named.path, params)
        .map_err(|e| ApiError::Internal(format!("could not load model '{}': {e}", named.name)))?;
    let model = Arc::new(model);
    let n_ctx_per_seq = settings
        .n_ctx_per_seq
        .clamp(16, model.n_ctx_train().max(16));
    let config = BatchConfig {
        n_parallel: settings.n_parallel,
        n_ctx_per_seq,
        n_batch: settings.n_batch,
        n_threads: settings.n_threads,
        queue_limit: settings.queue_limit,
    };
    let template = prompt::model_template(&model).map_err(|e| e.to_string());
    let engine = BatchEngine::start(Arc::clone(&model), config)
        .map_err(|e| ApiError::Internal(format!("could not start model '{}': {e}", named.name)))?;
    Ok(Arc::new(LoadedModel {
        name: named.name.clone(),
        path: Arc::clone(&named.path),
        info: Arc::clone(&named.info),
        engine,
        template,
        n_ctx_per_seq,
        active: AtomicUsize::new(0),
        keep_alive: Mutex::new(settings.default_keep_alive),
        expires_at: Mutex::new(None),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_sizes_read_like_ollamas() {
        assert_eq!(parameter_size(134_515_008), "135M");
        assert_eq!(parameter_size(7_241_732_096), "7.2B");
        assert_eq!(parameter_size(950_000), "950K");
    }
}
