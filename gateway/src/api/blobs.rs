//! `HEAD` and `POST /api/blobs/:digest`: GGUF files uploaded for
//! `/api/create` (Open WebUI's GGUF upload, the `ollama` clients'
//! `create_blob`), as Ollama takes them.
//!
//! The digest is `sha256:` and 64 lower-case hex digits, nothing else (400).
//! An upload streams into a hidden temporary file of the blobs directory
//! (`<models dir>/blobs`), hashed as it arrives, at most `[server]
//! pull_max_bytes` (413); it must begin with a GGUF header and hash to the
//! digest (400 otherwise, and nothing is left behind), and is then renamed
//! to `blobs/sha256-<hex>`: 201. A blob already there answers 200 (the
//! body is read, not kept). `HEAD` answers 200 when the blob is there, 404 when not.
//! Like `/api/pull`, both need the admin key when one is set.
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use axum::body::{Body, BodyDataStream};
use axum::extract::{Path as UrlPath, State};
use axum::http::{header, HeaderMap, StatusCode};
use futures_util::StreamExt;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::pull::{PartFile, PART_COUNTER};
use crate::core::error::{ApiError, OllamaError};
use crate::pool::manifest;
use crate::pool::registry::hex;
use crate::security::remote::{check_gguf_header, GGUF_HEADER_BYTES};
use crate::state::AppState;

/// The hex digits of a blob digest: `sha256:` and 64 lower-case hex digits.
pub fn parse_digest(digest: &str) -> Result<&str, ApiError> {
    digest
        .strip_prefix("sha256:")
        .filter(|hex| {
            hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        })
        .ok_or_else(|| {
            ApiError::bad_request(
                "invalid blob digest: use sha256: followed by 64 lower-case hex digits",
            )
        })
}

/// The models directory, where blobs and created models are kept.
pub fn models_dir(state: &AppState) -> Result<&Path, ApiError> {
    state.models_dir.as_deref().ok_or_else(|| {
        ApiError::Internal(
            "no models directory: start hypura serve with --models-dir, or set \
             HYPURA_MODELS_DIR or HOME"
                .into(),
        )
    })
}

/// Whether the blob is on this server.
#[utoipa::path(head, path = "/api/blobs/{digest}", tag = "ollama",
    params(("digest" = String, Path, description = "`sha256:` and 64 lower-case hex digits")),
    responses((status = 200, description = "The blob is here"),
        (status = 404, description = "No such blob"),
        (status = 400, body = crate::core::error::OllamaErrorBody)))]
pub async fn head_blob(
    State(state): State<AppState>,
    UrlPath(digest): UrlPath<String>,
) -> Result<StatusCode, OllamaError> {
    let hex = parse_digest(&digest)?;
    let found = manifest::blob_path(models_dir(&state)?, hex).is_file();
    if !found {
        return Err(ApiError::NotFound(format!("blob {digest} not found")).into());
    }
    Ok(StatusCode::OK)
}

/// Uploads a GGUF file for `/api/create` (the body is the file's bytes).
#[utoipa::path(post, path = "/api/blobs/{digest}", tag = "ollama",
    params(("digest" = String, Path, description = "`sha256:` and 64 lower-case hex digits: the body's sha256")),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "A GGUF file"),
    responses((status = 201, description = "Stored"),
        (status = 200, description = "The blob was here already"),
        (status = 400, description = "A bad digest, a body that is not GGUF, or whose sha256 is not the digest", body = crate::core::error::OllamaErrorBody),
        (status = 413, description = "Larger than [server] pull_max_bytes", body = crate::core::error::OllamaErrorBody)))]
pub async fn post_blob(
    State(state): State<AppState>,
    UrlPath(digest): UrlPath<String>,
    headers: HeaderMap,
    body: Body,
) -> Result<StatusCode, OllamaError> {
    let hex = parse_digest(&digest)?.to_string();
    let dir = models_dir(&state)?;
    let target = manifest::blob_path(dir, &hex);
    if target.is_file() {
        drain(body.into_data_stream(), 0, state.security.pull.max_bytes).await;
        return Ok(StatusCode::OK);
    }
    let max_bytes = state.security.pull.max_bytes;
    let announced = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if announced.is_some_and(|n| n > max_bytes) {
        return Err(too_large(max_bytes).into());
    }
    let part = receive(body, &manifest::blobs_dir(dir), &hex, max_bytes).await?;
    std::fs::rename(&part.path, &target)
        .map_err(|e| ApiError::Internal(format!("storing the blob: {e}")))?;
    let mut part = part;
    part.kept = true;
    eprintln!("hypura: stored the blob {digest}");
    Ok(StatusCode::CREATED)
}

/// Reads the rest of a body without keeping it (at most `max_bytes` in
/// all): a client still sending when the answer comes would see a broken
/// connection instead of the answer.
async fn drain(mut chunks: BodyDataStream, mut received: u64, max_bytes: u64) {
    while let Some(Ok(chunk)) = chunks.next().await {
        received += chunk.len() as u64;
        if received > max_bytes {
            break;
        }
    }
}

fn too_large(max_bytes: u64) -> ApiError {
    ApiError::PayloadTooLarge(format!(
        "the upload is larger than the {max_bytes} bytes a model may have here ([server] \
         pull_max_bytes)"
    ))
}

/// Streams `body` into a temporary file of `dir`, checking its size, its
/// GGUF header and its sha256 against `want` (hex); the file, removed when dropped.
async fn receive(body: Body, dir: &Path, want: &str, max_bytes: u64) -> Result<PartFile, ApiError> {
    let disk = |e: std::io::Error| ApiError::Internal(format!("writing the blob: {e}"));
    tokio::fs::create_dir_all(dir).await.map_err(disk)?;
    let part = PartFile {
        path: dir.join(format!(
            ".sha256-{want}.{}.{}.part",
            std::process::id(),
            PART_COUNTER.fetch_add(1, Ordering::Relaxed)
        )),
        kept: false,
    };
    let mut file = tokio::fs::File::create(&part.path).await.map_err(disk)?;
    let not_gguf = || {
        ApiError::bad_request(
            "the upload is not a GGUF file (it does not begin with a GGUF header); hypura \
             loads GGUF model files only",
        )
    };
    let mut hasher = Sha256::new();
    let mut received = 0u64;
    let mut header = Vec::with_capacity(GGUF_HEADER_BYTES);
    let mut chunks = body.into_data_stream();
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| {
            if crate::server::timed_out(&e) {
                ApiError::RequestTimeout(format!(
                    "the upload paused for more than {} s: send it again",
                    crate::connections::BODY_READ_TIMEOUT.as_secs()
                ))
            } else {
                ApiError::bad_request("the upload stopped before its end: send it again")
            }
        })?;
        if header.len() < GGUF_HEADER_BYTES {
            let take = (GGUF_HEADER_BYTES - header.len()).min(chunk.len());
            header.extend_from_slice(&chunk[..take]);
            if header.len() == GGUF_HEADER_BYTES && !check_gguf_header(&header) {
                drain(chunks, received, max_bytes).await;
                return Err(not_gguf());
            }
        }
        received += chunk.len() as u64;
        if received > max_bytes {
            return Err(too_large(max_bytes));
        }
        hasher.update(&chunk);
        file.write_all(&chunk).await.map_err(disk)?;
    }
    if !check_gguf_header(&header) {
        return Err(not_gguf());
    }
    let got = hex(&hasher.finalize());
    if got != want {
        return Err(ApiError::bad_request(format!(
            "digest mismatch: the upload's sha256 is sha256:{got}, not sha256:{want}"
        )));
    }
    file.sync_all().await.map_err(disk)?;
    Ok(part)
}

/// The path of an uploaded blob, if it is here.
pub fn find_blob(models_dir: &Path, hex: &str) -> Option<PathBuf> {
    let path = manifest::blob_path(models_dir, hex);
    path.is_file().then_some(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_sha256_and_64_lower_case_hex_digits() {
        let hex = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53";
        assert_eq!(parse_digest(&format!("sha256:{hex}")).unwrap(), hex);
        for bad in [
            hex.to_string(),
            format!("sha256-{hex}"),
            format!("sha256:{}", hex.to_uppercase()),
            format!("sha256:{}", &hex[1..]),
            format!("sha256:{hex}0"),
            format!("sha256:../{}", &hex[3..]),
            format!("sha512:{hex}"),
            format!("sha256:{}g", &hex[1..]),
        ] {
            let e = parse_digest(&bad).unwrap_err();
            assert_eq!(e.status(), StatusCode::BAD_REQUEST, "{bad}");
        }
    }
}
