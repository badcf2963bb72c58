//! Models made by `/api/create`: a GGUF file's weights under a name of
//! their own, with their own chat template, system prompt, default options
//! and leading messages.
//!
//! Each is a small JSON file, `<models dir>/manifests/<name>.json`, read
//! back when the server starts. The weights are never copied: a local file
//! is read where it lies, an uploaded one from `<models dir>/blobs/sha256-<hex>`
//! (`/api/blobs`). Several models may share one file, and then share its
//! loaded engine too (models are loaded by file).
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hypura_chat::ChatMessage;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::registry::{ModelInfo, Registry};
use crate::core::request::{BackendRequest, Prompt};
use crate::core::validation::ModelName;

/// A created model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// `name:tag`, as created.
    pub name: String,
    /// The GGUF file its weights are read from (canonical).
    pub weights: PathBuf,
    /// What it was made from, as the request said it (a model name, a
    /// blob digest or a path).
    pub from: String,
    /// A Jinja chat template used instead of the file's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// The system prompt of conversations that bring none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system: Option<String>,
    /// Ollama option names → values, under each request's own `options`.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub parameters: Map<String, Value>,
    /// Put before every conversation (after the system prompt).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub messages: Vec<ChatMessage>,
}

/// Longest name a created model may have (its manifest's file name).
pub const MAX_NAME_BYTES: usize = 200;

/// Where uploaded GGUF files live.
pub fn blobs_dir(models_dir: &Path) -> PathBuf {
    models_dir.join("blobs")
}

/// The file of the blob whose sha256 is `hex` (64 lower-case hex digits).
pub fn blob_path(models_dir: &Path, hex: &str) -> PathBuf {
    blobs_dir(models_dir).join(format!("sha256-{hex}"))
}

fn manifests_dir(models_dir: &Path) -> PathBuf {
    models_dir.join("manifests")
}

/// The manifest file of `name`: its key with `/` as `~` and `:` as `@`
/// (neither can be in a name), so every name has its own file.
pub fn manifest_path(models_dir: &Path, name: &ModelName) -> PathBuf {
    let file = name.key.replace('/', "~").replace(':', "@");
    manifests_dir(models_dir).join(format!("{file}.json"))
}

impl Manifest {
    /// Writes it as `name`'s manifest (a whole file or none: written aside, then renamed).
    pub fn save(&self, models_dir: &Path, name: &ModelName) -> std::io::Result<()> {
        let path = manifest_path(models_dir, name);
        std::fs::create_dir_all(manifests_dir(models_dir))?;
        let part = path.with_extension(format!("json.{}.part", std::process::id()));
        let json = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(&part, json)?;
        std::fs::rename(&part, &path).inspect_err(|_| {
            let _ = std::fs::remove_file(&part);
        })
    }

    /// Puts the model's defaults into a request for it: its template unless
    /// the request brings one; unless the request continues an earlier
    /// `context`, its system prompt when the conversation does not begin
    /// with one, then its messages, before the request's. A raw prompt is
    /// left as it is.
    pub fn apply(&self, request: &mut BackendRequest) {
        let continuing = !request.context.is_empty();
        let Prompt::Messages {
            messages,
            template_override,
            ..
        } = &mut request.prompt
        else {
            return;
        };
        if template_override.is_none() {
            template_override.clone_from(&self.template);
        }
        if continuing {
            return;
        }
        let mut first = Vec::new();
        if let Some(system) = &self.system {
            let has_system = messages
                .first()
                .is_some_and(|m| m.role == "system" || m.role == "developer");
            if !has_system {
                first.push(ChatMessage::new("system", system.as_str()));
            }
        }
        first.extend(self.messages.iter().cloned());
        first.append(messages);
        *messages = first;
    }
}

/// Removes `name`'s manifest, if it has one.
pub fn remove(models_dir: &Path, name: &ModelName) -> std::io::Result<()> {
    match std::fs::remove_file(manifest_path(models_dir, name)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Serves every saved manifest of `models_dir` (at start-up). One that
/// cannot be read, or whose weights are gone, is skipped with a warning.
pub fn register_saved(registry: &Registry, models_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(manifests_dir(models_dir)) else {
        return;
    };
    let mut paths: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    for path in paths {
        match register_one(registry, &path) {
            Ok(name) => eprintln!("hypura: serving the created model {name}"),
            Err(e) => tracing::warn!("skipping the created model {}: {e}", path.display()),
        }
    }
}

fn register_one(registry: &Registry, path: &Path) -> Result<String, String> {
    let text = std::fs::read(path).map_err(|e| e.to_string())?;
    let manifest: Manifest = serde_json::from_slice(&text).map_err(|e| e.to_string())?;
    let name = ModelName::parse(&manifest.name, "name").map_err(|e| e.to_string())?;
    let info = match registry.info_of(&manifest.weights) {
        Some(info) => info,
        None => Arc::new(ModelInfo::read(&manifest.weights).map_err(|e| e.to_string())?),
    };
    registry.register_created(name.clone(), info, Arc::new(manifest))?;
    Ok(name.display)
}

impl crate::core::models::RequestDefaults for Manifest {
    fn apply(&self, request: &mut BackendRequest) {
        Manifest::apply(self, request);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pirate() -> Manifest {
        Manifest {
            name: "pirate:latest".into(),
            weights: "/m/smol.gguf".into(),
            from: "smol".into(),
            template: Some("{{ messages }}".into()),
            system: Some("Talk like a pirate.".into()),
            parameters: Map::new(),
            messages: vec![
                ChatMessage::new("user", "Ahoy?"),
                ChatMessage::new("assistant", "Arr!"),
            ],
        }
    }

    fn chat(messages: Vec<ChatMessage>) -> BackendRequest {
        BackendRequest {
            prompt: Prompt::messages(messages),
            context: Vec::new(),
            params: Default::default(),
        }
    }

    fn messages(request: &BackendRequest) -> Vec<(String, String)> {
        let Prompt::Messages { messages, .. } = &request.prompt else {
            panic!("{:?}", request.prompt)
        };
        messages
            .iter()
            .map(|m| (m.role.clone(), m.content.clone()))
            .collect()
    }

    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(r, c)| (r.to_string(), c.to_string()))
            .collect()
    }

    #[test]
    fn defaults_go_before_the_conversation() {
        let mut request = chat(vec![ChatMessage::new("user", "Hi")]);
        pirate().apply(&mut request);
        assert_eq!(
            messages(&request),
            pairs(&[
                ("system", "Talk like a pirate."),
                ("user", "Ahoy?"),
                ("assistant", "Arr!"),
                ("user", "Hi")
            ])
        );
        let Prompt::Messages {
            template_override, ..
        } = &request.prompt
        else {
            unreachable!()
        };
        assert_eq!(template_override.as_deref(), Some("{{ messages }}"));
    }

    #[test]
    fn the_requests_own_system_prompt_and_template_win() {
        let mut request = chat(vec![
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "Hi"),
        ]);
        if let Prompt::Messages {
            template_override, ..
        } = &mut request.prompt
        {
            *template_override = Some("mine".into());
        }
        pirate().apply(&mut request);
        assert_eq!(
            messages(&request),
            pairs(&[
                ("user", "Ahoy?"),
                ("assistant", "Arr!"),
                ("system", "Be brief."),
                ("user", "Hi")
            ])
        );
        let Prompt::Messages {
            template_override, ..
        } = &request.prompt
        else {
            unreachable!()
        };
        assert_eq!(template_override.as_deref(), Some("mine"));
    }

    #[test]
    fn raw_prompts_and_continuations_keep_their_text() {
        let mut raw = BackendRequest {
            prompt: Prompt::Text { text: "1 2".into() },
            context: Vec::new(),
            params: Default::default(),
        };
        pirate().apply(&mut raw);
        assert_eq!(raw.prompt, Prompt::Text { text: "1 2".into() });
        let mut continued = chat(vec![ChatMessage::new("user", "More")]);
        continued.context = vec![1, 2, 3];
        pirate().apply(&mut continued);
        assert_eq!(messages(&continued), pairs(&[("user", "More")]));
    }

    #[test]
    fn every_name_has_its_own_file_and_manifests_round_trip() {
        let dir = std::env::temp_dir().join(format!("hypura-manifest-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let a = ModelName::parse("team/pirate:v1", "model").unwrap();
        let b = ModelName::parse("team~pirate", "model");
        assert!(b.is_err(), "~ is not in names: the escape is one-to-one");
        assert_eq!(
            manifest_path(&dir, &a),
            dir.join("manifests/team~pirate@v1.json")
        );
        pirate().save(&dir, &a).unwrap();
        let read: Manifest =
            serde_json::from_slice(&std::fs::read(manifest_path(&dir, &a)).unwrap()).unwrap();
        assert_eq!(read, pirate());
        remove(&dir, &a).unwrap();
        remove(&dir, &a).unwrap();
        assert!(!manifest_path(&dir, &a).exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
