//! `POST /api/create` and `POST /api/push`, as Ollama answers them.
//!
//! A created model is a GGUF file's weights under a new name, with its own
//! chat template, system prompt, default options and leading messages
//! ([`crate::pool::manifest`]); no weight is copied. It comes `from`:
//! - a model this server serves (a created one passes on its defaults,
//!   which the request's replace);
//! - a blob uploaded with `/api/blobs` (`"from": "sha256:…"`, or
//!   `"files": {"x.gguf": "sha256:…"}` as Open WebUI's GGUF upload sends);
//! - the path of a GGUF file under the model roots (as `/api/pull` allows).
//!
//! The JSON fields are Ollama's (`model`, `from`, `files`, `template`,
//! `system`, `parameters`, `messages`); the legacy `modelfile` text
//! ([`super::modelfile`]) says the same with its lines, and JSON fields
//! given beside it win. The template is Jinja, like a GGUF's
//! `tokenizer.chat_template`. `quantize` and LoRA adapters are a 501:
//! hypura has no quantizer.
//!
//! Everything is checked before the first byte is answered, so a failure
//! has its own status; a failed create removes the uploaded blobs it names
//! that no model uses (nothing is left behind; a retry uploads again).
//! With `stream` (the default) the answer is Ollama's NDJSON status lines
//! ending in `{"status":"success"}`; without, that last object.
//!
//! Requests for a created model get its defaults: the system prompt,
//! template and messages in [`crate::core::infer`] (every dialect); its
//! options under the request's own through [`ollama_body`] and
//! [`openai_body`] (what the request sets wins).
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use hypura_chat::{ChatMessage, ChatTemplate};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use utoipa::ToSchema;

use super::blobs::{find_blob, models_dir, parse_digest};
use super::modelfile::{self, Modelfile};
use super::ollama::ShowResponse;
use super::pull::looks_like_path;
use crate::api::dialect::ollama::OllamaOptions;
use crate::core::error::{ApiError, OllamaError};
use crate::core::validation::{parse_json, ModelName};
use crate::pool::manifest::{self, Manifest, MAX_NAME_BYTES};
use crate::pool::registry::{ModelInfo, NamedModel, Registry};
use crate::security::remote::{check_gguf_header, GGUF_HEADER_BYTES};
use crate::security::roots::NotAllowed;
use crate::server::body_bytes;
use crate::state::AppState;

#[derive(Debug, Default, Deserialize, ToSchema)]
pub struct CreateRequest {
    /// The new model's name, `[namespace/]model[:tag]`.
    #[schema(example = "smol-pirate")]
    pub model: Option<String>,
    /// Legacy spelling of `model`.
    pub name: Option<String>,
    /// A model this server serves, a blob digest (`sha256:…`) or the path
    /// of a GGUF file under the model roots.
    #[schema(example = "SmolLM2-135M-Instruct.Q4_1:latest")]
    pub from: Option<String>,
    /// `{file name: blob digest}`: one GGUF file uploaded with
    /// `POST /api/blobs/{digest}` (used when `from` is absent).
    pub files: Option<BTreeMap<String, String>>,
    /// A Jinja chat template used instead of the model's.
    pub template: Option<String>,
    /// The system prompt of conversations that bring none.
    #[schema(example = "You are a pirate.")]
    pub system: Option<String>,
    /// Default options (Ollama's `options` names); a request's own win.
    #[schema(value_type = Object, example = json!({"temperature": 0, "num_predict": 64}))]
    pub parameters: Option<Map<String, Value>>,
    /// Messages put before every conversation (after the system prompt).
    pub messages: Option<Vec<CreateMessage>>,
    /// Legacy: a Modelfile's text (`FROM`, `TEMPLATE`, `SYSTEM`,
    /// `PARAMETER`, `MESSAGE` lines); the fields above win over it.
    pub modelfile: Option<String>,
    /// Not supported (501): hypura has no quantizer.
    pub quantize: Option<String>,
    /// Legacy spelling of `quantize`.
    pub quantization: Option<String>,
    /// LoRA adapters: not supported (501).
    #[schema(value_type = Object)]
    pub adapters: Option<BTreeMap<String, String>>,
    /// Default true: NDJSON status lines; false: one final object.
    pub stream: Option<bool>,
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
pub struct CreateMessage {
    #[schema(example = "user")]
    pub role: String,
    #[serde(default)]
    pub content: String,
}

/// One status line.
#[derive(Debug, Serialize, ToSchema)]
pub struct CreateStatus {
    #[schema(example = "success")]
    pub status: String,
}

/// What a create asks for, from its fields and its Modelfile.
struct Spec {
    name: ModelName,
    /// A model name, a blob digest or a path.
    from: String,
    template: Option<String>,
    system: Option<String>,
    parameters: Map<String, Value>,
    /// `None`: the base model's.
    messages: Option<Vec<ChatMessage>>,
    /// LoRA adapters were asked for.
    adapters: bool,
}

/// What the created model is built on.
struct Base {
    weights: PathBuf,
    info: Arc<ModelInfo>,
    /// The defaults of a created model it comes from.
    inherited: Option<Arc<Manifest>>,
    /// Status lines: the file read, the blob used.
    statuses: Vec<String>,
}

/// Makes a named model from a GGUF file with its own template, system
/// prompt and default options.
#[utoipa::path(post, path = "/api/create", tag = "ollama", request_body = CreateRequest,
    responses((status = 200, content_type = "application/x-ndjson", body = CreateStatus,
            description = "Status lines ending in {\"status\":\"success\"}, or that object with stream: false"),
        (status = 400, body = crate::core::error::OllamaErrorBody),
        (status = 501, description = "quantize or adapters", body = crate::core::error::OllamaErrorBody)))]
pub async fn create(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, OllamaError> {
    let request: CreateRequest = parse_json(&body_bytes(body)?)?;
    let uploaded = blob_digests(&request);
    // One create at a time: a failed one must not prune a blob that another
    // is about to register.
    let _one_at_a_time = CREATES.lock().await;
    let created = create_model(state.clone(), request).await;
    if !created.as_ref().is_ok_and(|r| r.status().is_success()) {
        if let Some(dir) = state.models_dir.as_deref() {
            for hex in &uploaded {
                if let Some(path) = find_blob(dir, hex) {
                    prune_blob(&state.registry, dir, &path);
                }
            }
        }
    }
    created
}

/// Serializes creates (each reads a GGUF header and writes a small manifest).
static CREATES: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The hex digests of the blobs a create names (`from`, `files`, its
/// Modelfile's FROM): uploaded for it, they go when it fails and no model
/// uses them (a client uploads again to retry).
fn blob_digests(request: &CreateRequest) -> Vec<String> {
    let from_file = request
        .modelfile
        .as_deref()
        .and_then(|text| modelfile::parse(text).ok())
        .map(|file| file.from);
    let named = request.from.iter().chain(from_file.iter());
    let files = request.files.iter().flat_map(|files| files.values());
    named
        .chain(files)
        .filter_map(|from| parse_digest(from.trim().trim_start_matches('@')).ok())
        .map(str::to_string)
        .collect()
}

async fn create_model(state: AppState, request: CreateRequest) -> Result<Response, OllamaError> {
    let stream = request.stream.unwrap_or(true);
    let quantize = request
        .quantize
        .as_deref()
        .or(request.quantization.as_deref());
    if quantize.is_some_and(|q| !q.trim().is_empty()) {
        return Ok(not_implemented(
            "quantize is not supported: hypura has no quantizer; create from a GGUF file \
             quantized already",
        ));
    }
    let spec = spec(&request)?;
    if spec.adapters || request.adapters.as_ref().is_some_and(|a| !a.is_empty()) {
        return Ok(not_implemented("LoRA adapters are not supported"));
    }
    let dir: Arc<Path> = Arc::from(models_dir(&state)?);
    check_name_free(&state.registry, &spec.name)?;
    let built = tokio::task::spawn_blocking(move || build(&state, &dir, spec))
        .await
        .map_err(|e| ApiError::Internal(format!("creating the model failed: {e}")))?;
    let statuses = built?;
    if !stream {
        return Ok(Json(CreateStatus {
            status: "success".into(),
        })
        .into_response());
    }
    let mut lines = String::new();
    for status in statuses {
        lines.push_str(&json!({ "status": status }).to_string());
        lines.push('\n');
    }
    Ok(([(header::CONTENT_TYPE, "application/x-ndjson")], lines).into_response())
}

/// Ollama's error body with a 501.
fn not_implemented(message: &str) -> Response {
    (
        StatusCode::NOT_IMPLEMENTED,
        Json(json!({ "error": message })),
    )
        .into_response()
}

/// Reads the request's fields over its Modelfile's; checks the name, the
/// files, the template and the options.
fn spec(request: &CreateRequest) -> Result<Spec, ApiError> {
    let raw = request
        .model
        .as_deref()
        .filter(|m| !m.trim().is_empty())
        .or(request.name.as_deref())
        .unwrap_or_default();
    let name = ModelName::parse(raw, "model")?;
    if name.key.len() > MAX_NAME_BYTES {
        return Err(ApiError::bad_request(format!(
            "the model name is longer than {MAX_NAME_BYTES} bytes: give a shorter one"
        )));
    }
    let file = match request
        .modelfile
        .as_deref()
        .filter(|m| !m.trim().is_empty())
    {
        Some(text) => modelfile::parse(text).map_err(|e| ApiError::bad_request(e.to_string()))?,
        None => Modelfile::default(),
    };
    let from = match (non_empty(&request.from), &request.files) {
        (Some(from), _) => from.to_string(),
        (None, Some(files)) => one_file(files)?,
        (None, None) if !file.from.is_empty() => file.from.clone(),
        (None, None) => {
            return Err(ApiError::bad_request(
                "neither `from`, `files` nor a `modelfile` with FROM was given: say what to \
                 create the model from",
            ))
        }
    };
    let mut parameters = file.parameters;
    parameters.extend(request.parameters.clone().unwrap_or_default());
    let messages = match &request.messages {
        Some(list) => Some(list.iter().map(message).collect::<Result<_, _>>()?),
        None if !file.messages.is_empty() => Some(
            file.messages
                .iter()
                .map(|(role, content)| ChatMessage::new(role.as_str(), content.as_str()))
                .collect(),
        ),
        None => None,
    };
    Ok(Spec {
        name,
        from,
        template: non_empty(&request.template)
            .map(str::to_string)
            .or(file.template),
        system: non_empty(&request.system)
            .map(str::to_string)
            .or(file.system),
        parameters,
        messages,
        adapters: !file.adapters.is_empty(),
    })
}

fn non_empty(field: &Option<String>) -> Option<&str> {
    field.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

fn message(m: &CreateMessage) -> Result<ChatMessage, ApiError> {
    if !["system", "user", "assistant", "tool"].contains(&m.role.as_str()) {
        return Err(ApiError::bad_request(format!(
            "messages: the role '{}' is not one of system, user, assistant, tool",
            m.role
        )));
    }
    Ok(ChatMessage::new(m.role.as_str(), m.content.as_str()))
}

/// The digest of `files`' one GGUF file.
fn one_file(files: &BTreeMap<String, String>) -> Result<String, ApiError> {
    let mut entries = files.iter();
    let (Some((file, digest)), None) = (entries.next(), entries.next()) else {
        return Err(ApiError::bad_request(format!(
            "`files` must name one GGUF file, not {}: hypura creates models from one GGUF file",
            files.len()
        )));
    };
    let relative = !file.is_empty()
        && !file.starts_with('/')
        && file.split('/').all(|part| !matches!(part, "" | "." | ".."));
    if !relative {
        return Err(ApiError::bad_request(
            "`files`: a file name must be a relative path",
        ));
    }
    parse_digest(digest)?;
    Ok(digest.clone())
}

fn check_name_free(registry: &Registry, name: &ModelName) -> Result<(), ApiError> {
    match registry.resolve(name) {
        Some(existing) if existing.created.is_none() => Err(ApiError::bad_request(format!(
            "the name {} is taken by the model served from {}: give another name",
            name.display, existing.source
        ))),
        _ => Ok(()),
    }
}

/// Resolves the base, builds and checks the manifest, saves it and serves
/// the model; the status lines.
fn build(state: &AppState, dir: &Path, spec: Spec) -> Result<Vec<String>, ApiError> {
    let base = resolve_base(state, dir, &spec.from)?;
    let inherited = base.inherited.as_deref();
    let mut parameters = inherited.map(|m| m.parameters.clone()).unwrap_or_default();
    parameters.extend(spec.parameters);
    let manifest = Manifest {
        name: spec.name.display.clone(),
        weights: base.weights,
        from: spec.from,
        template: spec
            .template
            .or_else(|| inherited.and_then(|m| m.template.clone())),
        system: spec
            .system
            .or_else(|| inherited.and_then(|m| m.system.clone())),
        parameters,
        messages: spec
            .messages
            .or_else(|| inherited.map(|m| m.messages.clone()))
            .unwrap_or_default(),
    };
    check_parameters(&manifest.parameters)?;
    if let Some(template) = &manifest.template {
        check_template(template)?;
    }
    let replaced = state.registry.resolve(&spec.name).and_then(|m| m.created);
    manifest
        .save(dir, &spec.name)
        .map_err(|e| ApiError::Internal(format!("writing the manifest: {e}")))?;
    let from = manifest.from.clone();
    if let Err(e) =
        state
            .registry
            .register_created(spec.name.clone(), base.info, Arc::new(manifest))
    {
        let _ = manifest::remove(dir, &spec.name);
        return Err(ApiError::BadRequest(e));
    }
    if let Some(old) = replaced {
        prune_blob(&state.registry, dir, &old.weights);
    }
    eprintln!("hypura: created {} from {from}", spec.name.display);
    let mut statuses = base.statuses;
    statuses.extend(["writing manifest".to_string(), "success".to_string()]);
    Ok(statuses)
}

/// The weights `from` names: a blob, a served model, or a GGUF file under
/// the model roots.
fn resolve_base(state: &AppState, dir: &Path, from: &str) -> Result<Base, ApiError> {
    let digest = from.strip_prefix('@').unwrap_or(from);
    if digest.starts_with("sha256") {
        let hex = parse_digest(digest)?;
        let path = find_blob(dir, hex).ok_or_else(|| {
            ApiError::bad_request(format!(
                "the blob {digest} is not on this server: upload it first (POST \
                 /api/blobs/{digest})"
            ))
        })?;
        let mut base = file_base(&state.registry, path, digest, Some(hex))?;
        base.statuses.push(format!("using existing layer {digest}"));
        return Ok(base);
    }
    if let Some(named) = ModelName::parse(from, "from")
        .ok()
        .and_then(|name| state.registry.resolve(&name))
    {
        return Ok(Base {
            weights: (**named.source.local_path()).clone(),
            info: named.info,
            inherited: named.created,
            statuses: Vec::new(),
        });
    }
    if !looks_like_path(from) {
        return Err(ApiError::bad_request(format!(
            "cannot create from '{from}': no model of that name is served here; name a served \
             model (GET /api/tags), a blob digest (sha256:…) or the path of a GGUF file"
        )));
    }
    let mut header = [0u8; GGUF_HEADER_BYTES];
    let (path, n) = state
        .security
        .roots
        .open(from, &mut header)
        .map_err(|NotAllowed| {
            ApiError::bad_request(format!(
                "cannot create from '{from}': not found or not allowed; give the path of a GGUF \
             file under the server's model roots ([server] model_roots)"
            ))
        })?;
    if !check_gguf_header(&header[..n]) {
        return Err(ApiError::bad_request(format!(
            "{from} is not a GGUF file (it does not begin with a GGUF header)"
        )));
    }
    file_base(&state.registry, path, from, None)
}

/// A GGUF file as a base: what the registry knows of it, or its header
/// read and validated (errors name it as `label`, not by its path).
fn file_base(
    registry: &Registry,
    path: PathBuf,
    label: &str,
    sha256: Option<&str>,
) -> Result<Base, ApiError> {
    let info = match registry.info_of(&path) {
        Some(info) => info,
        None => {
            let mut info = ModelInfo::read(&path).map_err(|e| {
                ApiError::BadRequest(e.to_string().replace(&path.display().to_string(), label))
            })?;
            if let Some(hex) = sha256 {
                info.digest = hex.to_string();
            }
            Arc::new(info)
        }
    };
    Ok(Base {
        weights: path,
        info,
        inherited: None,
        statuses: vec!["parsing GGUF".into()],
    })
}

/// Known options must have their type and range (unknown ones are kept and
/// ignored, as in requests).
fn check_parameters(parameters: &Map<String, Value>) -> Result<(), ApiError> {
    #[derive(Deserialize)]
    struct Check {
        #[allow(dead_code)]
        parameters: OllamaOptions,
    }
    let body = json!({ "parameters": parameters }).to_string();
    let check: Check = parse_json(body.as_bytes())?;
    check.parameters.to_params()?;
    Ok(())
}

fn check_template(template: &str) -> Result<(), ApiError> {
    ChatTemplate::new(template, "", "").map(drop).map_err(|e| {
        ApiError::bad_request(format!(
            "template: {e}; hypura renders chat templates with Jinja, like a GGUF's \
             tokenizer.chat_template (Ollama's Go templates are not supported)"
        ))
    })
}

/// After `name` stopped being served (`/api/delete`): removes its manifest,
/// and its uploaded blob when no model uses that any more.
pub fn forget(state: &AppState, name: &ModelName, named: &NamedModel) {
    let (Some(created), Some(dir)) = (&named.created, state.models_dir.as_deref()) else {
        return;
    };
    if let Err(e) = manifest::remove(dir, name) {
        tracing::warn!("removing the manifest of {}: {e}", name.display);
    }
    prune_blob(&state.registry, dir, &created.weights);
}

/// After `/api/copy` to `destination`: a copy of a created model gets a
/// manifest of its own (it comes back after a restart, and deleting either
/// leaves the other); a copy of any other model over a created one ends
/// that one's manifest.
pub fn copied(state: &AppState, destination: &ModelName) {
    let (Some(named), Some(dir)) = (
        state.registry.resolve(destination),
        state.models_dir.as_deref(),
    ) else {
        return;
    };
    let saved = match named.created {
        Some(created) => Manifest {
            name: destination.display.clone(),
            ..(*created).clone()
        }
        .save(dir, destination),
        None => manifest::remove(dir, destination),
    };
    if let Err(e) = saved {
        tracing::warn!("the manifest of {}: {e}", destination.display);
    }
}

/// Removes an uploaded blob no model uses; any other file is left alone.
fn prune_blob(registry: &Registry, dir: &Path, weights: &Path) {
    if weights.starts_with(manifest::blobs_dir(dir)) && registry.info_of(weights).is_none() {
        match std::fs::remove_file(weights) {
            Ok(()) => eprintln!("hypura: removed the unused blob {}", weights.display()),
            Err(e) => tracing::warn!("removing {}: {e}", weights.display()),
        }
    }
}

/// `/api/show` of a created model: its Modelfile, parameters and system
/// prompt (the template is in its facts already).
pub fn show_created(response: &mut ShowResponse, created: &Manifest, context: u32) {
    let mut parameters = created.parameters.clone();
    if !parameters.contains_key("num_ctx") {
        parameters.insert("num_ctx".into(), context.into());
    }
    let file = Modelfile {
        from: created.weights.display().to_string(),
        template: created.template.clone(),
        system: created.system.clone(),
        parameters: parameters.clone(),
        messages: created
            .messages
            .iter()
            .map(|m| (m.role.clone(), m.content.clone()))
            .collect(),
        adapters: Vec::new(),
    };
    response.modelfile = format!(
        "# Modelfile generated by hypura\n{}",
        modelfile::render(&file)
    );
    // Ollama's layout: the name padded to 30 columns, strings in JSON quotes.
    response.parameters = modelfile::parameter_lines(&parameters)
        .into_iter()
        .map(|(key, text)| {
            let value = parameter_value(&parameters, &key, text);
            format!("{key:<30} {value}")
        })
        .collect::<Vec<_>>()
        .join("\n");
    response.system.clone_from(&created.system);
    response.details.parent_model = created.from.clone();
}

/// A parameter's value as `/api/show` writes it: strings (and `stop`'s
/// strings) JSON-quoted, numbers and booleans bare.
fn parameter_value(parameters: &Map<String, Value>, key: &str, text: String) -> String {
    match parameters.get(key) {
        Some(Value::String(_)) | Some(Value::Array(_)) => Value::String(text).to_string(),
        _ => text,
    }
}

/// Pushing to a registry: not supported (501).
#[utoipa::path(post, path = "/api/push", tag = "ollama",
    responses((status = 501, description = "Not supported", body = crate::core::error::OllamaErrorBody)))]
pub async fn push() -> Response {
    not_implemented(
        "pushing models to a registry is not supported: hypura serves local GGUF files; copy \
         the file (GET /api/show names it) to share a model",
    )
}

/// A generation body for a created model with its default options under
/// the request's own `options` (the request's keys win); any other body
/// as it is (a malformed one fails where it is parsed).
pub fn ollama_body(registry: &Registry, body: Bytes) -> Bytes {
    with_created(registry, body, |object, created| {
        let options = object.entry("options").or_insert_with(|| json!({}));
        if options.is_null() {
            *options = json!({});
        }
        if let Value::Object(options) = options {
            for (key, value) in &created.parameters {
                options.entry(key).or_insert_with(|| value.clone());
            }
        }
    })
}

/// Options an OpenAI body has a field of its own for.
const OPENAI_FIELDS: &[&str] = &[
    "temperature",
    "top_p",
    "seed",
    "frequency_penalty",
    "presence_penalty",
    "stop",
];

/// An OpenAI body for a created model with the default options OpenAI has
/// fields for (`num_predict` as `max_tokens`) where the request sets none.
pub fn openai_body(registry: &Registry, body: Bytes) -> Bytes {
    with_created(registry, body, |object, created| {
        let unset =
            |object: &Map<String, Value>, field: &str| object.get(field).is_none_or(Value::is_null);
        for field in OPENAI_FIELDS {
            if let Some(value) = created.parameters.get(*field) {
                if unset(object, field) {
                    object.insert(field.to_string(), value.clone());
                }
            }
        }
        let num_predict = created
            .parameters
            .get("num_predict")
            .and_then(Value::as_i64)
            .filter(|n| *n >= 0);
        if let Some(n) = num_predict {
            if unset(object, "max_tokens") && unset(object, "max_completion_tokens") {
                object.insert("max_tokens".into(), n.into());
            }
        }
    })
}

/// `body` changed by `edit` when it is a JSON object naming a created
/// model with default options.
fn with_created(
    registry: &Registry,
    body: Bytes,
    edit: impl FnOnce(&mut Map<String, Value>, &Manifest),
) -> Bytes {
    let Ok(Value::Object(mut object)) = serde_json::from_slice::<Value>(&body) else {
        return body;
    };
    let created = object
        .get("model")
        .and_then(Value::as_str)
        .and_then(|m| ModelName::parse(m, "model").ok())
        .and_then(|name| registry.resolve(&name))
        .and_then(|named| named.created)
        .filter(|m| !m.parameters.is_empty());
    let Some(created) = created else {
        return body;
    };
    edit(&mut object, &created);
    serde_json::to_vec(&object).map(Bytes::from).unwrap_or(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(value: Value) -> CreateRequest {
        parse_json(value.to_string().as_bytes()).unwrap()
    }

    #[test]
    fn fields_win_over_the_modelfile() {
        let spec = spec(&request(json!({
            "name": "pirate",
            "modelfile": "FROM smol\nSYSTEM old\nPARAMETER temperature 1\nPARAMETER top_k 7\n\
                          MESSAGE user Ahoy?",
            "system": "new",
            "parameters": {"temperature": 0},
        })))
        .unwrap();
        assert_eq!(spec.name.display, "pirate:latest");
        assert_eq!(spec.from, "smol");
        assert_eq!(spec.system.as_deref(), Some("new"));
        assert_eq!(
            Value::Object(spec.parameters),
            json!({"temperature": 0, "top_k": 7})
        );
        assert_eq!(spec.messages, Some(vec![ChatMessage::new("user", "Ahoy?")]));
        let files = spec_of(
            json!({"model": "up", "files": {"smol.gguf": format!("sha256:{}", "a".repeat(64))}}),
        );
        assert_eq!(files.unwrap().from, format!("sha256:{}", "a".repeat(64)));
    }

    fn spec_of(value: Value) -> Result<Spec, ApiError> {
        spec(&request(value))
    }

    #[test]
    fn bad_creates_are_400s_that_say_why() {
        let digest = format!("sha256:{}", "a".repeat(64));
        for (body, words) in [
            (
                json!({"model": "x"}),
                "neither `from`, `files` nor a `modelfile`",
            ),
            (json!({"from": "smol"}), "model is required"),
            (
                json!({"model": "x", "modelfile": "SYSTEM hi"}),
                "no FROM line",
            ),
            (
                json!({"model": "x", "files": {}}),
                "must name one GGUF file, not 0",
            ),
            (
                json!({"model": "x", "files": {"a.gguf": digest, "b.gguf": digest}}),
                "not 2",
            ),
            (
                json!({"model": "x", "files": {"../a.gguf": digest}}),
                "relative path",
            ),
            (
                json!({"model": "x", "files": {"a.gguf": "sha256:12"}}),
                "invalid blob digest",
            ),
            (
                json!({"model": "x", "from": "m", "messages": [{"role": "narrator", "content": "hi"}]}),
                "the role 'narrator'",
            ),
            (
                json!({"model": "a".repeat(250), "from": "m"}),
                "longer than 200 bytes",
            ),
        ] {
            let e = spec_of(body.clone())
                .err()
                .unwrap_or_else(|| panic!("{body}"));
            assert_eq!(e.status(), StatusCode::BAD_REQUEST, "{body}");
            assert!(e.to_string().contains(words), "{body}: {e}");
        }
    }

    #[test]
    fn parameters_and_templates_are_checked() {
        let params = |v: Value| check_parameters(v.as_object().unwrap());
        assert!(params(json!({"temperature": 0, "stop": ["\n"], "mirostat": 2})).is_ok());
        let e = params(json!({"temperature": "hot"})).unwrap_err();
        assert!(e.to_string().contains("parameters.temperature"), "{e}");
        assert!(params(json!({"top_p": 2})).is_err());
        assert!(check_template("{% for m in messages %}{{ m.content }}{% endfor %}").is_ok());
        let e = check_template("{{ .System }}{{ .Prompt }}").unwrap_err();
        assert!(
            e.to_string().contains("Go templates are not supported"),
            "{e}"
        );
    }

    fn pirate() -> Manifest {
        let mut parameters = Map::new();
        parameters.insert("temperature".into(), json!(0));
        parameters.insert("num_predict".into(), json!(5));
        parameters.insert("stop".into(), json!(["\n"]));
        Manifest {
            name: "pirate:latest".into(),
            weights: "/m/smol.gguf".into(),
            from: "smol".into(),
            template: None,
            system: Some("Arr.".into()),
            parameters,
            messages: Vec::new(),
        }
    }

    #[test]
    fn show_lists_the_modelfile_parameters_and_system_prompt() {
        let mut response = ShowResponse {
            modelfile: String::new(),
            parameters: String::new(),
            template: "T".into(),
            system: None,
            details: super::super::ollama::ModelDetails {
                parent_model: String::new(),
                format: "gguf".into(),
                family: "llama".into(),
                families: vec!["llama".into()],
                parameter_size: "135M".into(),
                quantization_level: "Q4_1".into(),
            },
            model_info: Map::new(),
            capabilities: Vec::new(),
            modified_at: String::new(),
            tensors: None,
        };
        show_created(&mut response, &pirate(), 2048);
        assert_eq!(
            response.modelfile,
            "# Modelfile generated by hypura\nFROM /m/smol.gguf\nSYSTEM Arr.\n\
             PARAMETER num_ctx 2048\nPARAMETER num_predict 5\nPARAMETER stop \"\"\"\n\"\"\"\n\
             PARAMETER temperature 0\n"
        );
        assert_eq!(
            response.parameters,
            format!(
                "{:<30} 2048\n{:<30} 5\n{:<30} \"\\n\"\n{:<30} 0",
                "num_ctx", "num_predict", "stop", "temperature"
            )
        );
        assert_eq!(response.system.as_deref(), Some("Arr."));
        assert_eq!(response.details.parent_model, "smol");
    }
}
