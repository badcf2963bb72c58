//! The server's one error type, and how each API family writes it.
//!
//! Every handler fails with an [`ApiError`]; the backend's
//! [`BackendError`] and the models' [`ModelsError`] become one here, the status
//! code is decided here once ([`ApiError::status`]), and the body by the
//! family's wrapper:
//! [`OllamaError`] writes `{"error": "…"}`, [`OpenAiError`] writes
//! `{"error": {"message", "type", "param", "code"}}`.
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use serde_json::json;
use utoipa::ToSchema;

use super::backend::BackendError;
use super::models::ModelsError;
use super::validation::ValidationError;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ApiError {
    /// The request broke one of the rules checked before anything runs.
    #[error(transparent)]
    Validation(#[from] ValidationError),
    /// The request is malformed or asks for something this model cannot do.
    #[error("{0}")]
    BadRequest(String),
    /// No model of that name is known (the name as the client sent it).
    #[error("model '{0}' not found")]
    ModelNotFound(String),
    /// No such route or resource.
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Unauthorized(String),
    /// The request's origin, host or key may not use this route.
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    /// The request body stopped arriving before it was complete.
    #[error("{0}")]
    RequestTimeout(String),
    /// The model's queue is full: retry later.
    #[error("{0}")]
    Unavailable(String),
    /// The model's engine is stopping (unloaded, or the server is stopping): retry.
    #[error("{0}")]
    ShuttingDown(String),
    #[error("{0}")]
    Internal(String),
}

/// A message longer than this many characters is cut in its middle
/// ([`capped`]).
const MESSAGE_MAX_CHARS: usize = 512;
/// What a cut message keeps of its start and of its end.
const MESSAGE_HEAD_CHARS: usize = 240;
const MESSAGE_TAIL_CHARS: usize = 160;

/// `message` as sent to a client: one longer than [`MESSAGE_MAX_CHARS`]
/// keeps its start and its end, its middle replaced by how many bytes were
/// left out, so that an error never echoes a whole input (a 10 MB `format`
/// string) while its field and its advice, at the ends, stay.
pub fn capped(message: String) -> String {
    if message.chars().nth(MESSAGE_MAX_CHARS).is_none() {
        return message;
    }
    let head_end = message
        .char_indices()
        .nth(MESSAGE_HEAD_CHARS)
        .map_or(message.len(), |(i, _)| i);
    let tail_start = message
        .char_indices()
        .rev()
        .nth(MESSAGE_TAIL_CHARS - 1)
        .map_or(0, |(i, _)| i);
    format!(
        "{}… [{} bytes left out] …{}",
        &message[..head_end],
        tail_start - head_end,
        &message[tail_start..]
    )
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::BadRequest(message.into())
    }

    /// The message a client is sent ([`capped`]).
    pub fn message(&self) -> String {
        capped(self.to_string())
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::Validation(_) | ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::ModelNotFound(_) | ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden(_) => StatusCode::FORBIDDEN,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::Unavailable(_) | ApiError::ShuttingDown(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's `error.type`.
    fn openai_type(&self) -> &'static str {
        match self {
            // OpenAI answers an unknown model or route so (404, with
            // `code: model_not_found` for a model); clients branch on it.
            ApiError::Validation(_)
            | ApiError::BadRequest(_)
            | ApiError::PayloadTooLarge(_)
            | ApiError::RequestTimeout(_)
            | ApiError::ModelNotFound(_)
            | ApiError::NotFound(_) => "invalid_request_error",
            ApiError::Unauthorized(_) => "authentication_error",
            ApiError::Forbidden(_) => "permission_error",
            ApiError::Unavailable(_) | ApiError::ShuttingDown(_) | ApiError::Internal(_) => {
                "api_error"
            }
        }
    }

    /// OpenAI's `error.param`: the request field at fault, when there is one.
    fn openai_param(&self) -> Option<&'static str> {
        match self {
            ApiError::ModelNotFound(_) => Some("model"),
            _ => None,
        }
    }

    /// OpenAI's `error.code`, for the errors clients branch on.
    fn openai_code(&self) -> Option<&'static str> {
        match self {
            ApiError::ModelNotFound(_) => Some("model_not_found"),
            ApiError::Validation(
                ValidationError::PromptTooLong { .. } | ValidationError::NumCtxTooLarge { .. },
            ) => Some("context_length_exceeded"),
            _ => None,
        }
    }

    /// The body of an OpenAI error (also sent as an SSE event mid-stream).
    pub fn openai_body(&self) -> serde_json::Value {
        json!({"error": {
            "message": self.message(),
            "type": self.openai_type(),
            "param": self.openai_param(),
            "code": self.openai_code(),
        }})
    }
}

impl From<BackendError> for ApiError {
    fn from(e: BackendError) -> Self {
        match e {
            BackendError::Invalid(m) => ApiError::BadRequest(m),
            BackendError::Busy(m) => ApiError::Unavailable(m),
            BackendError::ShuttingDown(m) => ApiError::ShuttingDown(m),
            BackendError::Failed(m) => ApiError::Internal(m),
        }
    }
}

impl From<ModelsError> for ApiError {
    fn from(e: ModelsError) -> Self {
        match e {
            ModelsError::NotFound(name) => ApiError::ModelNotFound(name),
            ModelsError::Rejected(m) => ApiError::BadRequest(m),
            ModelsError::NoRoom(m) => ApiError::Unavailable(m),
            ModelsError::Failed(m) => ApiError::Internal(m),
        }
    }
}

/// An [`ApiError`] written as Ollama does: `{"error": "message"}`.
#[derive(Debug)]
pub struct OllamaError(pub ApiError);

/// Ollama's error body.
#[derive(Debug, Serialize, ToSchema)]
#[schema(example = json!({"error": "model 'llama9:latest' not found"}))]
pub struct OllamaErrorBody {
    pub error: String,
}

impl From<ApiError> for OllamaError {
    fn from(e: ApiError) -> Self {
        OllamaError(e)
    }
}

impl From<ValidationError> for OllamaError {
    fn from(e: ValidationError) -> Self {
        OllamaError(e.into())
    }
}

impl IntoResponse for OllamaError {
    fn into_response(self) -> Response {
        let body = OllamaErrorBody {
            error: self.0.message(),
        };
        (self.0.status(), Json(body)).into_response()
    }
}

/// An [`ApiError`] written as OpenAI does: `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub struct OpenAiError(pub ApiError);

/// OpenAI's error body.
#[derive(Debug, Serialize, ToSchema)]
pub struct OpenAiErrorBody {
    pub error: OpenAiErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct OpenAiErrorDetail {
    pub message: String,
    #[serde(rename = "type")]
    pub kind: String,
    pub param: Option<String>,
    pub code: Option<String>,
}

impl From<ApiError> for OpenAiError {
    fn from(e: ApiError) -> Self {
        OpenAiError(e)
    }
}

impl From<ValidationError> for OpenAiError {
    fn from(e: ValidationError) -> Self {
        OpenAiError(e.into())
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        (self.0.status(), Json(self.0.openai_body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_errors_map_to_statuses() {
        let cases = [
            (
                BackendError::Busy("x".into()),
                StatusCode::SERVICE_UNAVAILABLE,
            ),
            (
                BackendError::ShuttingDown("x".into()),
                StatusCode::SERVICE_UNAVAILABLE,
            ),
            (BackendError::Invalid("x".into()), StatusCode::BAD_REQUEST),
            (
                BackendError::Failed("x".into()),
                StatusCode::INTERNAL_SERVER_ERROR,
            ),
        ];
        for (e, status) in cases {
            assert_eq!(ApiError::from(e).status(), status);
        }
        let cases = [
            (ModelsError::NotFound("x".into()), StatusCode::NOT_FOUND),
            (ModelsError::Rejected("x".into()), StatusCode::BAD_REQUEST),
            (
                ModelsError::NoRoom("x".into()),
                StatusCode::SERVICE_UNAVAILABLE,
            ),
            (
                ModelsError::Failed("x".into()),
                StatusCode::INTERNAL_SERVER_ERROR,
            ),
        ];
        for (e, status) in cases {
            assert_eq!(ApiError::from(e).status(), status);
        }
    }

    #[test]
    fn long_messages_keep_their_ends() {
        assert_eq!(capped("short".into()), "short");
        let input = "é".repeat(10_000);
        let message = capped(format!("invalid format \"{input}\": use \"json\""));
        // 240 characters of the start, 160 of the end: 224 and 147 of the input's.
        let expected = format!(
            "invalid format \"{}… [19258 bytes left out] …{}\": use \"json\"",
            "é".repeat(224),
            "é".repeat(147)
        );
        assert_eq!(message, expected);
    }

    #[test]
    fn openai_body_has_the_four_fields() {
        let body = ApiError::ModelNotFound("x".into()).openai_body();
        assert_eq!(body["error"]["message"], "model 'x' not found");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["param"], "model");
        assert_eq!(body["error"]["code"], "model_not_found");
        let long = ValidationError::PromptTooLong {
            prompt_tokens: 9,
            n_ctx: 8,
        };
        let body = ApiError::from(long).openai_body();
        assert_eq!(body["error"]["code"], "context_length_exceeded");
        assert!(ApiError::Internal("x".into()).openai_body()["error"]["code"].is_null());
    }
}
