//! Names: `name:tag` → the file a model is served from and what its GGUF
//! header says ([`ModelInfo`], read once at registration). Several names may
//! point at one file (`/api/copy`); a model made by `/api/create` carries its
//! [`Manifest`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use hypura_gguf::inspect::file_type_name;
use hypura_gguf::{GgufFile, GgufValue};
use llama_tiered::engine::prompt;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

use super::{ModelPolicy, Registry};
use crate::core::backend::ModelFacts;
use crate::core::models::ModelsError;
use crate::core::validation::ModelName;
use crate::pool::manifest::Manifest;

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

/// Where a named model is served from. Only local files for now; a model
/// run by a child process (`Runner`) and one served by another machine
/// (`Remote`) come next, each behind its own [`ModelBackend`] implementation.
///
/// [`ModelBackend`]: crate::core::backend::ModelBackend
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ModelSource {
    /// A GGUF file run by the in-process engine.
    Local(Arc<PathBuf>),
}

impl ModelSource {
    pub fn local(path: PathBuf) -> ModelSource {
        ModelSource::Local(Arc::new(path))
    }

    /// The file the in-process engine loads. Every caller that needs a path
    /// goes through here: a new source kind is a compile error at each one.
    pub fn local_path(&self) -> &Arc<PathBuf> {
        match self {
            ModelSource::Local(path) => path,
        }
    }
}

impl std::fmt::Display for ModelSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ModelSource::Local(path) => write!(f, "{}", path.display()),
        }
    }
}

/// A model under one name.
#[derive(Debug, Clone)]
pub struct NamedModel {
    pub name: String,
    pub source: ModelSource,
    pub info: Arc<ModelInfo>,
    pub policy: ModelPolicy,
    /// Made by `/api/create`: its template, system prompt and default
    /// options (`None`: served from a file as it is).
    pub created: Option<Arc<Manifest>>,
}

impl ModelInfo {
    /// Reads and validates the GGUF header and tensor table of `path`.
    pub fn read(path: &Path) -> Result<ModelInfo, hypura_gguf::GgufError> {
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
        // Templates that cannot describe tools get llama.cpp's generic format.
        capabilities.push("tools");
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

impl ModelInfo {
    /// What `/api/show`, `/api/tags` and `/v1/models` say of the model: the
    /// template is its own, or ChatML (what it is prompted with) when it has none.
    pub fn facts(&self) -> ModelFacts {
        ModelFacts {
            family: self.architecture.clone(),
            parameter_size: self.parameter_size.clone(),
            quantization: self.quantization.clone(),
            context_length: self.context_length,
            template: self
                .chat_template
                .clone()
                .unwrap_or_else(|| prompt::CHATML_TEMPLATE.to_string()),
            capabilities: self.capabilities.iter().map(|c| c.to_string()).collect(),
            model_info: self.model_info.clone(),
            size_bytes: self.file_bytes,
            modified: self.modified,
            digest: self.digest.clone(),
        }
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

impl Registry {
    /// Serves `path` as `name`; fails if the name is taken by another file.
    pub fn register(
        &self,
        name: ModelName,
        path: PathBuf,
        info: Arc<ModelInfo>,
    ) -> Result<(), String> {
        self.register_with(name, path, info, ModelPolicy::default())
    }

    /// [`Registry::register`] with per-model settings.
    pub fn register_with(
        &self,
        name: ModelName,
        path: PathBuf,
        info: Arc<ModelInfo>,
        policy: ModelPolicy,
    ) -> Result<(), String> {
        if let Some(existing) = self.names.get(&name.key) {
            if **existing.source.local_path() != path {
                return Err(format!(
                    "two models are named {}: {} and {}",
                    name.display,
                    existing.source,
                    path.display()
                ));
            }
            return Ok(());
        }
        let named = NamedModel {
            name: name.display,
            source: ModelSource::local(path),
            info,
            policy,
            created: None,
        };
        if let Err(why) = self.add_to_budget(&named) {
            // Listed all the same: a request for it is refused with why.
            eprintln!("hypura: {why}: listed, and refused when asked for");
            self.unfit
                .insert(Arc::clone(named.source.local_path()), why);
        }
        self.names.insert(name.key, named);
        Ok(())
    }

    /// Why the model named `name` can never run within the global budget
    /// (`None`: it can, or there is no budget).
    pub fn unfit_reason(&self, name: &ModelName) -> Option<String> {
        self.unfit_reason_of(&self.resolve(name)?)
    }

    /// Why the model `named` can never run within the global budget.
    pub fn unfit_reason_of(&self, named: &NamedModel) -> Option<String> {
        self.unfit
            .get(named.source.local_path())
            .map(|why| why.clone())
    }

    /// Every model served by name that can never run within the budget,
    /// with why, sorted by name.
    pub fn unfit(&self) -> Vec<(String, String)> {
        let mut all: Vec<(String, String)> = self
            .names
            .iter()
            .filter_map(|e| {
                let why = self.unfit.get(e.source.local_path())?;
                Some((e.name.clone(), why.clone()))
            })
            .collect();
        all.sort();
        all
    }

    /// `/api/pull`: serves `path` as `name` with fresh `info`, replacing an
    /// entry of the same file (its bytes may have changed: a loaded copy is
    /// unloaded); fails if the name is taken by another file.
    pub fn register_pulled(
        &self,
        name: ModelName,
        path: PathBuf,
        info: Arc<ModelInfo>,
    ) -> Result<(), String> {
        let policy = match self.names.get(&name.key) {
            Some(existing) if **existing.source.local_path() != path => {
                return Err(format!(
                    "the name {} is taken by {}: pull under another name",
                    name.display, existing.source
                ))
            }
            Some(existing) => existing.policy,
            None => ModelPolicy::default(),
        };
        let source = ModelSource::local(path);
        self.loaded.invalidate(source.local_path());
        let named = NamedModel {
            name: name.display,
            source,
            info,
            policy,
            created: None,
        };
        self.add_to_budget(&named)?;
        self.names.insert(name.key, named);
        Ok(())
    }

    /// `/api/create`: serves `manifest` as `name`, with the settings of the
    /// models already served from its file (if any), replacing a created
    /// model of that name; fails if a model served from a file as it is
    /// has the name.
    pub fn register_created(
        &self,
        name: ModelName,
        info: Arc<ModelInfo>,
        manifest: Arc<Manifest>,
    ) -> Result<(), String> {
        let taken_by = self
            .names
            .get(&name.key)
            .filter(|existing| existing.created.is_none())
            .map(|existing| existing.source.to_string());
        if let Some(file) = taken_by {
            return Err(format!(
                "the name {} is taken by the model served from {file}: give another name",
                name.display
            ));
        }
        let source = ModelSource::local(manifest.weights.clone());
        let sibling = self
            .names
            .iter()
            .find(|e| e.source == source)
            .map(|e| e.policy);
        let named = NamedModel {
            name: name.display,
            source,
            info,
            policy: sibling.unwrap_or_default(),
            created: Some(manifest),
        };
        if sibling.is_none() {
            self.add_to_budget(&named)?;
        }
        self.names.insert(name.key, named);
        Ok(())
    }

    /// What is known of the file at `path`, when a model is served from it.
    pub fn info_of(&self, path: &Path) -> Option<Arc<ModelInfo>> {
        self.names
            .iter()
            .find(|e| e.source.local_path().as_path() == path)
            .map(|e| Arc::clone(&e.info))
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

    /// `/api/copy`: `destination` names the same file as `source`.
    pub fn copy(&self, source: &ModelName, destination: ModelName) -> Result<(), ModelsError> {
        let named = self
            .resolve(source)
            .ok_or_else(|| ModelsError::NotFound(source.display.clone()))?;
        self.names.insert(
            destination.key,
            NamedModel {
                name: destination.display,
                ..named
            },
        );
        Ok(())
    }

    /// Serves `target`'s model under `alias` too (a short name), unless
    /// the alias names a model already; whether it names `target`'s now.
    pub fn add_alias(&self, target: &ModelName, alias: ModelName) -> bool {
        let Some(named) = self.resolve(target) else {
            return false;
        };
        match self.names.entry(alias.key) {
            dashmap::Entry::Occupied(_) => false,
            dashmap::Entry::Vacant(slot) => {
                slot.insert(NamedModel {
                    name: alias.display,
                    ..named
                });
                true
            }
        }
    }

    /// `/api/delete`: forgets the name (the file is left alone); the model is
    /// unloaded when no other name serves its file. What the name served.
    pub fn delete(&self, name: &ModelName) -> Result<NamedModel, ModelsError> {
        let (_, named) = self
            .names
            .remove(&name.key)
            .ok_or_else(|| ModelsError::NotFound(name.display.clone()))?;
        if !self.names.iter().any(|e| e.source == named.source) {
            self.unload_file(named.source.local_path());
        }
        Ok(named)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::testing;

    #[test]
    fn a_name_serves_one_file_and_copies_share_it() {
        let registry = Registry::new(testing::settings(None, None));
        let smol = testing::name("Smol");
        let info = testing::info(Some(8192));
        registry
            .register(smol.clone(), "/m/smol.gguf".into(), info)
            .unwrap();
        // The same file again under the same name is no change; another file is refused.
        let same = testing::name("smol:latest");
        registry
            .register(same, "/m/smol.gguf".into(), testing::info(None))
            .unwrap();
        let e = registry
            .register(
                testing::name("SMOL"),
                "/m/other.gguf".into(),
                testing::info(None),
            )
            .unwrap_err();
        assert_eq!(
            e,
            "two models are named SMOL:latest: /m/smol.gguf and /m/other.gguf"
        );
        registry.copy(&smol, testing::name("twin")).unwrap();
        let names: Vec<String> = registry.list().into_iter().map(|m| m.name).collect();
        assert_eq!(names, ["Smol:latest", "twin:latest"]);
        let twin = registry.resolve(&testing::name("TWIN")).unwrap();
        assert_eq!(twin.source.to_string(), "/m/smol.gguf");
        assert_eq!(twin.info.context_length, Some(8192));
        assert!(registry.info_of(Path::new("/m/smol.gguf")).is_some());
        assert!(registry.info_of(Path::new("/m/other.gguf")).is_none());

        assert_eq!(registry.delete(&smol).unwrap().name, "Smol:latest");
        assert!(registry.resolve(&smol).is_none());
        let gone = ModelsError::NotFound("Smol:latest".into());
        assert_eq!(registry.delete(&smol).unwrap_err(), gone);
        assert_eq!(registry.copy(&smol, testing::name("x")).unwrap_err(), gone);

        // An alias takes no name that is served already.
        assert!(registry.add_alias(&testing::name("twin"), testing::name("short:1")));
        let short = registry.resolve(&testing::name("SHORT:1")).unwrap();
        assert_eq!(
            (short.name.as_str(), short.source.to_string().as_str()),
            ("short:1", "/m/smol.gguf")
        );
        assert!(!registry.add_alias(&testing::name("twin"), testing::name("short:1")));
        assert!(
            !registry.add_alias(&smol, testing::name("short:2")),
            "no such target"
        );
    }

    #[test]
    fn a_pull_never_takes_a_name_from_another_file() {
        let registry = Registry::new(testing::settings(None, None));
        let smol = testing::name("smol");
        registry
            .register(smol.clone(), "/m/smol.gguf".into(), testing::info(None))
            .unwrap();
        let e = registry
            .register_pulled(smol.clone(), "/m/pulled.gguf".into(), testing::info(None))
            .unwrap_err();
        assert_eq!(
            e,
            "the name smol:latest is taken by /m/smol.gguf: pull under another name"
        );
        // The same file pulled again: its facts are read anew.
        registry
            .register_pulled(smol.clone(), "/m/smol.gguf".into(), testing::info(Some(1)))
            .unwrap();
        assert_eq!(
            registry.resolve(&smol).unwrap().info.context_length,
            Some(1)
        );
    }

    #[test]
    fn parameter_sizes_read_like_ollamas() {
        assert_eq!(parameter_size(134_515_008), "135M");
        assert_eq!(parameter_size(7_241_732_096), "7.2B");
        assert_eq!(parameter_size(950_000), "950K");
    }
}
