//! `POST /api/pull`: adds a model while the server runs.
//!
//! The source (`model`, or the legacy `name`) is one of:
//! - a name already served: succeeds at once (clients pull before they use a model);
//! - a local path of a GGUF file: validated and served in place; its bytes are
//!   hashed, never copied or written;
//! - an `http://` or `https://` URL of a `.gguf`: downloaded into the models
//!   directory as a hidden temporary file, hashed while it streams, validated
//!   as GGUF, then renamed into place; a failed pull leaves nothing behind.
//!
//! Anything else (a registry name such as `llama3`) is a 400. The model is
//! served as the file's stem with `:latest`, or as `name` when a request gives
//! both fields and they differ (`{"model": URL, "name": "smol:q4"}`).
//!
//! Progress is Ollama's NDJSON: `{"status":"pulling manifest"}`, then
//! `{"status":"downloading FILE","total","completed"}` lines (the last one also
//! carries the `digest`) or, for a local file, `{"status":"verifying sha256
//! digest","total","completed"}` lines while it is hashed; then
//! `{"status":"verifying sha256 digest","digest":"sha256:…"}` and
//! `{"status":"success"}`. A failure after the stream began is one
//! `{"error":"…"}` line; with `stream:false` the reply is the last object, or
//! the error with its status. A client that goes away cancels its download.
use std::convert::Infallible;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;
use utoipa::ToSchema;

use crate::core::error::{ApiError, OllamaError};
use crate::core::validation::{parse_json, ModelName};
use crate::pool::registry::{hex, ModelInfo, Registry};
use crate::security::remote::{check_gguf_header, Refused, GGUF_HEADER_BYTES};
use crate::security::roots::NotAllowed;
use crate::security::PullPolicy;
use crate::server::body_bytes;
use crate::state::AppState;

/// Least time between two progress lines of one transfer.
const PROGRESS_EVERY: Duration = Duration::from_millis(200);

#[derive(Debug, Deserialize, ToSchema)]
pub struct PullRequest {
    /// A served model name, a local path of a GGUF file, or an http(s) URL of a `.gguf`.
    #[schema(example = "https://example.com/models/SmolLM2-135M-Instruct.Q4_1.gguf")]
    pub model: Option<String>,
    /// Legacy spelling of `model`; given with a different `model`, the name
    /// (`[namespace/]model[:tag]`) to serve the pulled file under.
    pub name: Option<String>,
    /// Default true: NDJSON progress lines; false: one final object.
    pub stream: Option<bool>,
    /// Accept a TLS certificate that does not verify (self-signed servers).
    pub insecure: Option<bool>,
}

/// One progress line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct PullProgress {
    pub status: String,
    /// `sha256:<hex>` of the file, once known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// Bytes in all (absent when the server does not say).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completed: Option<u64>,
}

impl PullProgress {
    fn status(status: &str) -> PullProgress {
        PullProgress {
            status: status.to_string(),
            digest: None,
            total: None,
            completed: None,
        }
    }
}

const VERIFYING: &str = "verifying sha256 digest";

/// What a pull does, decided before any byte is sent back.
enum Job {
    /// The name is served already.
    Served,
    Local {
        path: PathBuf,
        name: ModelName,
        info: ModelInfo,
    },
    Remote {
        url: reqwest::Url,
        file_name: String,
        name: ModelName,
        dir: Arc<Path>,
        insecure: bool,
        policy: Arc<PullPolicy>,
    },
}

/// Ollama's pull, over local paths and http(s) URLs of GGUF files.
#[utoipa::path(post, path = "/api/pull", tag = "ollama", request_body = PullRequest,
    responses((status = 200, content_type = "application/x-ndjson", body = PullProgress),
        (status = 400, body = crate::core::error::OllamaErrorBody)))]
pub async fn pull(
    State(state): State<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, OllamaError> {
    let request: PullRequest = parse_json(&body_bytes(body)?)?;
    let stream = request.stream.unwrap_or(true);
    let job = plan(&state, &request).await?;
    let (tx, mut rx) = mpsc::channel(16);
    let registry = Arc::clone(&state.registry);
    tokio::spawn(async move {
        if let Err(e) = run(job, &registry, &tx).await {
            let _ = tx.send(Event::Failed(e)).await;
        }
    });
    if stream {
        let lines = tokio_stream::wrappers::ReceiverStream::new(rx).map(|event| {
            let mut bytes = match event {
                Event::Progress(line) => serde_json::to_vec(&line),
                Event::Failed(e) => {
                    serde_json::to_vec(&serde_json::json!({"error": e.to_string()}))
                }
            }
            .unwrap_or_default();
            bytes.push(b'\n');
            Ok::<_, Infallible>(Bytes::from(bytes))
        });
        return Ok((
            [(header::CONTENT_TYPE, "application/x-ndjson")],
            Body::from_stream(lines),
        )
            .into_response());
    }
    let mut last = None;
    while let Some(event) = rx.recv().await {
        last = Some(event);
    }
    match last {
        Some(Event::Progress(line)) if line.status == "success" => Ok(Json(line).into_response()),
        Some(Event::Failed(e)) => Err(e.into()),
        _ => Err(ApiError::Internal("the pull ended without a result".into()).into()),
    }
}

/// What the pulling task tells the response.
enum Event {
    Progress(PullProgress),
    /// The last event of a failed pull.
    Failed(ApiError),
}

/// Checks the request and decides what to do, before any line is sent: a
/// failure here is a 400 (a 500 when the server has no models directory).
async fn plan(state: &AppState, request: &PullRequest) -> Result<Job, ApiError> {
    let model = request.model.as_deref().map(str::trim).unwrap_or_default();
    let legacy = request.name.as_deref().map(str::trim).unwrap_or_default();
    let (source, explicit_name) = match (model.is_empty(), legacy.is_empty()) {
        (false, false) if model != legacy => (model, Some(legacy)),
        (false, _) => (model, None),
        (true, false) => (legacy, None),
        (true, true) => return Err(ApiError::bad_request("model is required")),
    };
    let explicit_name = explicit_name
        .map(|n| ModelName::parse(n, "name"))
        .transpose()?;
    if let Some((scheme, _)) = source.split_once("://") {
        let insecure = request.insecure.unwrap_or(false);
        return plan_remote(state, source, scheme, explicit_name, insecure);
    }
    if let Ok(name) = ModelName::parse(source, "model") {
        if explicit_name.is_none() && state.registry.resolve(&name).is_some() {
            return Ok(Job::Served);
        }
    }
    if !looks_like_path(source) {
        return Err(ApiError::bad_request(format!(
            "pulling '{source}' from a registry is not supported: pull a local path or an \
             http(s) URL of a .gguf file, or pass GGUF files to `hypura serve`"
        )));
    }
    let security = Arc::clone(&state.security);
    let raw = source.to_string();
    let read = tokio::task::spawn_blocking(move || {
        let mut header = [0u8; GGUF_HEADER_BYTES];
        let (path, n) = security
            .roots
            .open(&raw, &mut header)
            .map_err(|NotAllowed| local_refusal(&raw))?;
        if !check_gguf_header(&header[..n]) {
            return Err(not_gguf(&raw));
        }
        let info = ModelInfo::read(&path).map_err(|e| ApiError::bad_request(e.to_string()))?;
        Ok::<_, ApiError>((path, info))
    })
    .await
    .map_err(|e| ApiError::Internal(format!("reading the model failed: {e}")))?;
    let (path, info) = read?;
    let name = explicit_name.unwrap_or_else(|| ModelName::from_file_stem(&file_stem(&path)));
    check_name_free(&state.registry, &name, Some(&path))?;
    Ok(Job::Local { path, name, info })
}

/// A local path outside the model roots, missing, or not a regular file:
/// the same words whichever it is.
fn local_refusal(source: &str) -> ApiError {
    ApiError::bad_request(format!(
        "cannot pull '{source}': not found or not allowed; give the path of a GGUF file under \
         the server's model roots ([server] model_roots)"
    ))
}

/// A URL of a host not allowed, of a private address, or redirected to one.
fn remote_refusal(source: &str) -> ApiError {
    ApiError::bad_request(format!(
        "cannot pull '{source}': not found or not allowed; pulls may download only from the \
         hosts of [server] pull_hosts"
    ))
}

/// A file that does not begin with a GGUF header (its bytes are never echoed).
fn not_gguf(source: &str) -> ApiError {
    ApiError::bad_request(format!(
        "{source} is not a GGUF file (it does not begin with a GGUF header); hypura loads GGUF \
         model files only"
    ))
}

fn plan_remote(
    state: &AppState,
    source: &str,
    scheme: &str,
    explicit_name: Option<ModelName>,
    insecure: bool,
) -> Result<Job, ApiError> {
    if !(scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https")) {
        return Err(ApiError::bad_request(format!(
            "cannot pull '{source}': the scheme '{scheme}' is not supported; use an http:// or \
             https:// URL, or a local path"
        )));
    }
    let url = reqwest::Url::parse(source)
        .map_err(|e| ApiError::bad_request(format!("'{source}' is not a valid URL: {e}")))?;
    state
        .security
        .pull
        .check_url(&url)
        .map_err(|Refused| remote_refusal(source))?;
    let last = url
        .path_segments()
        .and_then(|mut segments| segments.next_back())
        .unwrap_or_default();
    if !last.to_ascii_lowercase().ends_with(".gguf") || last.len() <= ".gguf".len() {
        return Err(ApiError::bad_request(format!(
            "cannot pull '{source}': the URL must name a .gguf file (…/model.gguf)"
        )));
    }
    let file_name = safe_file_name(last);
    let name = explicit_name
        .unwrap_or_else(|| ModelName::from_file_stem(&file_stem(Path::new(&file_name))));
    let dir = state.models_dir.clone().ok_or_else(|| {
        ApiError::Internal(
            "no models directory: start hypura serve with --models-dir, or set \
             HYPURA_MODELS_DIR or HOME"
                .into(),
        )
    })?;
    let target = dir.join(&file_name);
    let target = std::fs::canonicalize(&target).unwrap_or(target);
    check_name_free(&state.registry, &name, Some(&target))?;
    Ok(Job::Remote {
        url,
        file_name,
        name,
        dir,
        insecure,
        policy: Arc::new(state.security.pull.clone()),
    })
}

pub(crate) fn looks_like_path(source: &str) -> bool {
    source.to_ascii_lowercase().ends_with(".gguf")
        || Path::new(source).is_absolute()
        || source.starts_with("./")
        || source.starts_with("../")
}

fn file_stem(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The URL's last segment as a file name: no separators, no leading dot.
fn safe_file_name(segment: &str) -> String {
    let clean: String = segment
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "._-+".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect();
    match clean.strip_prefix('.') {
        Some(rest) => format!("-{rest}"),
        None => clean,
    }
}

fn check_name_free(
    registry: &Registry,
    name: &ModelName,
    path: Option<&Path>,
) -> Result<(), ApiError> {
    match registry.resolve(name) {
        Some(existing) if Some(existing.source.local_path().as_path()) != path => {
            Err(ApiError::bad_request(format!(
                "the name {} is taken by {}: give another `name`",
                name.display, existing.source
            )))
        }
        _ => Ok(()),
    }
}

type Tx = mpsc::Sender<Event>;

async fn send(tx: &Tx, line: PullProgress) -> Result<(), ApiError> {
    tx.send(Event::Progress(line))
        .await
        .map_err(|_| ApiError::Internal("the client went away".into()))
}

async fn run(job: Job, registry: &Registry, tx: &Tx) -> Result<(), ApiError> {
    send(tx, PullProgress::status("pulling manifest")).await?;
    match job {
        Job::Served => {}
        Job::Local { path, name, info } => pull_local(path, name, info, registry, tx).await?,
        Job::Remote {
            url,
            file_name,
            name,
            dir,
            insecure,
            policy,
        } => {
            let target = Target {
                file_name: &file_name,
                name,
                dir: &dir,
            };
            pull_remote(&url, target, &policy, insecure, registry, tx).await?
        }
    }
    send(tx, PullProgress::status("success")).await
}

/// Sends `line` unless one was sent less than [`PROGRESS_EVERY`] ago
/// (`force` sends anyway); fails once the client is gone.
struct Throttle {
    last: Option<Instant>,
}

impl Throttle {
    async fn send(&mut self, tx: &Tx, line: PullProgress, force: bool) -> Result<(), ApiError> {
        if tx.is_closed() {
            return Err(ApiError::Internal("the client went away".into()));
        }
        if force || self.last.is_none_or(|t| t.elapsed() >= PROGRESS_EVERY) {
            self.last = Some(Instant::now());
            send(tx, line).await?;
        }
        Ok(())
    }
}

async fn pull_local(
    path: PathBuf,
    name: ModelName,
    mut info: ModelInfo,
    registry: &Registry,
    tx: &Tx,
) -> Result<(), ApiError> {
    let io_error =
        |e: std::io::Error| ApiError::Internal(format!("reading {}: {e}", path.display()));
    // Without blocking: the file was checked to be regular, but a FIFO put
    // in its place since must not hold this task.
    let std_file = std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&path)
        .map_err(io_error)?;
    let mut file = tokio::fs::File::from_std(std_file);
    let total = file.metadata().await.map_err(io_error)?.len();
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut completed = 0u64;
    let mut throttle = Throttle { last: None };
    let progress = |completed| PullProgress {
        total: Some(total),
        completed: Some(completed),
        ..PullProgress::status(VERIFYING)
    };
    loop {
        throttle.send(tx, progress(completed), false).await?;
        let n = tokio::io::AsyncReadExt::read(&mut file, &mut buf)
            .await
            .map_err(io_error)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        completed += n as u64;
    }
    let digest = hex(&hasher.finalize());
    let line = PullProgress {
        digest: Some(format!("sha256:{digest}")),
        ..progress(completed)
    };
    throttle.send(tx, line, true).await?;
    info.digest = digest;
    registry
        .register_pulled(name.clone(), path.clone(), Arc::new(info))
        .map_err(ApiError::BadRequest)?;
    eprintln!("hypura: serving {} as {}", path.display(), name.display);
    Ok(())
}

/// A temporary file removed when dropped, unless it was renamed into place.
pub(crate) struct PartFile {
    pub(crate) path: PathBuf,
    pub(crate) kept: bool,
}

impl Drop for PartFile {
    fn drop(&mut self) {
        if !self.kept {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Numbers the temporary files of this process.
pub(crate) static PART_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Where a download goes: `dir/file_name`, served as `name`.
struct Target<'a> {
    file_name: &'a str,
    name: ModelName,
    dir: &'a Path,
}

/// Why a download failed, in words that tell nothing of other hosts or ports.
fn fetch_error(url: &reqwest::Url, e: &reqwest::Error) -> ApiError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(cause) = source {
        if cause.is::<Refused>() {
            return remote_refusal(url.as_str());
        }
        source = cause.source();
    }
    if e.is_timeout() {
        ApiError::Internal(format!(
            "downloading {url}: the server did not answer in time"
        ))
    } else if e.is_redirect() {
        remote_refusal(url.as_str())
    } else {
        ApiError::Internal(format!("downloading {url}: the download failed; try again"))
    }
}

async fn pull_remote(
    url: &reqwest::Url,
    target: Target<'_>,
    policy: &Arc<PullPolicy>,
    insecure: bool,
    registry: &Registry,
    tx: &Tx,
) -> Result<(), ApiError> {
    let Target {
        file_name,
        name,
        dir,
    } = target;
    let client = policy
        .client(insecure)
        .map_err(|e| ApiError::Internal(format!("building the HTTP client: {e}")))?;
    let mut response = client
        .get(url.clone())
        .send()
        .await
        .map_err(|e| fetch_error(url, &e))?;
    let status = response.status();
    if !status.is_success() {
        return Err(ApiError::BadRequest(format!(
            "downloading {url}: the server answered {status}; check the URL"
        )));
    }
    let total = response.content_length();
    let too_large = || {
        ApiError::BadRequest(format!(
            "downloading {url}: the file is larger than the {} bytes a pull may download \
             ([server] pull_max_bytes)",
            policy.max_bytes
        ))
    };
    if total.is_some_and(|t| t > policy.max_bytes) {
        return Err(too_large());
    }
    let disk_error = |what: &str, e: std::io::Error| {
        ApiError::Internal(format!("{what} in {}: {e}", dir.display()))
    };
    tokio::fs::create_dir_all(dir)
        .await
        .map_err(|e| disk_error("creating the models directory", e))?;
    let part = PartFile {
        path: dir.join(format!(
            ".{file_name}.{}.{}.part",
            std::process::id(),
            PART_COUNTER.fetch_add(1, Ordering::Relaxed)
        )),
        kept: false,
    };
    let mut file = tokio::fs::File::create(&part.path)
        .await
        .map_err(|e| disk_error("creating a temporary file", e))?;
    let status = format!("downloading {file_name}");
    let progress = |completed, digest| PullProgress {
        status: status.clone(),
        digest,
        total,
        completed: Some(completed),
    };
    let mut hasher = Sha256::new();
    let mut completed = 0u64;
    let mut header = Vec::with_capacity(GGUF_HEADER_BYTES);
    let mut throttle = Throttle { last: None };
    throttle.send(tx, progress(0, None), true).await?;
    while let Some(chunk) = response.chunk().await.map_err(|e| fetch_error(url, &e))? {
        if header.len() < GGUF_HEADER_BYTES {
            let take = (GGUF_HEADER_BYTES - header.len()).min(chunk.len());
            header.extend_from_slice(&chunk[..take]);
            if header.len() == GGUF_HEADER_BYTES && !check_gguf_header(&header) {
                return Err(not_gguf(url.as_str()));
            }
        }
        completed += chunk.len() as u64;
        if completed > policy.max_bytes {
            return Err(too_large());
        }
        hasher.update(&chunk);
        file.write_all(&chunk)
            .await
            .map_err(|e| disk_error("writing the download", e))?;
        throttle.send(tx, progress(completed, None), false).await?;
    }
    if !check_gguf_header(&header) {
        return Err(not_gguf(url.as_str()));
    }
    file.sync_all()
        .await
        .map_err(|e| disk_error("writing the download", e))?;
    drop(file);
    if total.is_some_and(|t| t != completed) {
        return Err(ApiError::Internal(format!(
            "downloading {url}: the connection closed after {completed} of {} bytes; try again",
            total.unwrap_or_default()
        )));
    }
    let digest = hex(&hasher.finalize());
    let tagged = format!("sha256:{digest}");
    throttle
        .send(tx, progress(completed, Some(tagged.clone())), true)
        .await?;
    let verifying = PullProgress {
        digest: Some(tagged),
        ..PullProgress::status(VERIFYING)
    };
    throttle.send(tx, verifying, true).await?;
    let part_path = part.path.clone();
    let url_text = url.to_string();
    let users = users_by_path(registry);
    let (dir_owned, file_name_owned) = (dir.to_path_buf(), file_name.to_string());
    let checked = tokio::task::spawn_blocking(move || {
        let mut info = ModelInfo::read(&part_path).map_err(|e| {
            // Name the URL, not the temporary file.
            ApiError::BadRequest(
                e.to_string()
                    .replace(&part_path.display().to_string(), &url_text),
            )
        })?;
        info.digest = digest;
        let target = place_download(
            &dir_owned,
            &file_name_owned,
            &info.digest,
            &users,
            &part_path,
        )?;
        Ok::<_, ApiError>((info, target))
    })
    .await
    .map_err(|e| ApiError::Internal(format!("checking the download failed: {e}")))?;
    let (info, target) = checked?;
    let mut part = part;
    part.kept = true;
    let target = std::fs::canonicalize(&target).unwrap_or(target);
    registry
        .register_pulled(name.clone(), target.clone(), Arc::new(info))
        .map_err(ApiError::BadRequest)?;
    eprintln!(
        "hypura: pulled {url} into {} as {}",
        target.display(),
        name.display
    );
    Ok(())
}

/// The digests of the models served from each file.
fn users_by_path(registry: &Registry) -> Vec<(PathBuf, String)> {
    registry
        .list()
        .into_iter()
        .map(|m| ((**m.source.local_path()).clone(), m.info.digest.clone()))
        .collect()
}

/// Moves a checked download into `dir` without ever replacing a file a
/// model is served from: `file_name` when it is free, the file already
/// there when the models using it have the same digest (the part is
/// dropped), else `STEM-<digest prefix>.gguf`. The file's final path.
fn place_download(
    dir: &Path,
    file_name: &str,
    digest: &str,
    users: &[(PathBuf, String)],
    part: &Path,
) -> Result<PathBuf, ApiError> {
    let used_by = |path: &Path| -> Vec<&str> {
        let canonical = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
        users
            .iter()
            .filter(|(p, _)| *p == canonical)
            .map(|(_, d)| d.as_str())
            .collect()
    };
    let stem = file_stem(Path::new(file_name));
    let short = &digest[..digest.len().min(12)];
    let candidates = [
        dir.join(file_name),
        dir.join(format!("{stem}-{short}.gguf")),
    ];
    for candidate in &candidates {
        let using = used_by(candidate);
        if !using.is_empty() && using.iter().all(|d| *d == digest) {
            let _ = std::fs::remove_file(part);
            return Ok(candidate.clone());
        }
        let free = match std::fs::symlink_metadata(candidate) {
            Err(_) => true,
            // Ours to replace: a file of this digest's name that no model uses.
            Ok(meta) => meta.is_file() && using.is_empty() && candidate != &candidates[0],
        };
        if free {
            std::fs::rename(part, candidate).map_err(|e| {
                ApiError::Internal(format!(
                    "moving the download to {}: {e}",
                    candidate.display()
                ))
            })?;
            return Ok(candidate.clone());
        }
    }
    Err(ApiError::BadRequest(format!(
        "{file_name} and {stem}-{short}.gguf are in use in the models directory: pull under \
         another file name"
    )))
}

/// Removes the temporary files of downloads whose process is gone
/// (`.NAME.PID.N.part`, and `.NAME.PID.part` / `.whl` of the default
/// model's download), left by a crash or `kill -9`.
pub fn remove_stale_parts(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let own = std::process::id().to_string();
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') || !(name.ends_with(".part") || name.ends_with(".whl")) {
            continue;
        }
        let alive = name
            .split('.')
            .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && *s != own)
            .any(|pid| Path::new("/proc").join(pid).exists());
        if !alive && entry.file_type().is_ok_and(|t| t.is_file()) {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => eprintln!(
                    "hypura: removed the stale download {}",
                    entry.path().display()
                ),
                Err(e) => tracing::warn!("cannot remove {}: {e}", entry.path().display()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_from_urls_stay_in_the_directory() {
        assert_eq!(safe_file_name("SmolLM2.Q4_1.gguf"), "SmolLM2.Q4_1.gguf");
        assert_eq!(safe_file_name(".hidden.gguf"), "-hidden.gguf");
        assert_eq!(safe_file_name("a%2F..%2Fb.gguf"), "a-2F..-2Fb.gguf");
    }

    #[test]
    fn paths_are_told_from_names() {
        assert!(looks_like_path("/models/x.gguf"));
        assert!(looks_like_path("models/x.GGUF"));
        assert!(looks_like_path("./x"));
        assert!(!looks_like_path("llama3"));
        assert!(!looks_like_path("library/llama3:8b"));
    }
}
