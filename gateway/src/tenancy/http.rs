//! The tenancy of one request ([`gate`], a layer on the routed requests,
//! after their bodies are read): who sent it, whether its key may use the
//! model and is within its limits (403 or 429 in the route's family, with
//! OpenAI's `x-ratelimit-*` and `retry-after`), its reply and context
//! capped at the key's `max_tokens` and `max_context`, then a slot of the
//! model from its fair queue ([`super::fair`]), held with the key's
//! concurrency until the response body ends. `GET /api/usage` ([`usage`]).
//!
//! A request held at the fair queue is the pool's [`Arrival`] from the
//! moment it came (counted waiting for its model; under a memory budget
//! its model is not idle to later requests for other models, and it keeps
//! its place among them): the pool's admission is the one queue that sees
//! every waiting request, the gate only picks which of a model's goes next.
use std::pin::Pin;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::fair::{Permit, QueueFull};
use super::keys::{Priority, Role, Tenant};
use super::limits::{InFlight, Refused};
use super::usage::{RequestUser, CURRENT};
use super::ANONYMOUS_USER;
use crate::core::error::{ApiError, OllamaError, OpenAiError};
use crate::core::models::Models;
use crate::core::validation::ModelName;
use crate::pool::registry::Arrival;
use crate::state::AppState;

/// Routes that generate: they wait at their model's fair queue.
const GENERATE: &[&str] = &[
    "/api/generate",
    "/api/chat",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
];
/// Routes that run a model without a slot of the fair queue: limits only.
const EMBED: &[&str] = &["/api/embed", "/api/embeddings", "/v1/embeddings"];

/// Asks for batch priority (`batch`; a batch key stays batch whatever it says).
pub const PRIORITY_HEADER: &str = "x-hypura-priority";
/// The user the fair queue sees, set by a trusted front (the Gateway API
/// Inference Extension's name).
pub const FAIRNESS_HEADER: &str = "x-gateway-inference-fairness-id";
/// Seconds the request waited at the fair queue.
pub const QUEUE_SECONDS_HEADER: &str = "x-hypura-queue-seconds";
/// Requests that got a slot of the model while this one waited, and how
/// many of them were batch work.
pub const STARTED_WHILE_WAITING_HEADER: &str = "x-hypura-started-while-waiting";
pub const BATCH_STARTED_WHILE_WAITING_HEADER: &str = "x-hypura-batch-started-while-waiting";

/// Who sent a request that the auth layer let through: `None` when named
/// keys are in use and it presented none of them (the auth layer lets it
/// through only on an open route or before it knows the keys file).
fn tenant_of(state: &AppState, headers: &HeaderMap) -> Option<Arc<Tenant>> {
    let tenancy = &state.tenancy;
    let keys = state.security.keys.get();
    if let Some(tenant) =
        crate::security::guard::bearer(headers).and_then(|k| tenancy.identify(k, &keys))
    {
        return Some(tenant);
    }
    let open = crate::security::guard::open_without_key(&keys, state);
    open.then(|| Arc::new(Tenant::unlimited(ANONYMOUS_USER, Role::User)))
}

/// See the module's documentation.
pub async fn gate(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let path = request.uri().path().to_string();
    let generates = GENERATE.contains(&path.as_str());
    if !generates && !EMBED.contains(&path.as_str()) {
        return next.run(request).await;
    }
    let Some(tenant) = tenant_of(&state, request.headers()) else {
        return refuse(&path, ApiError::Unauthorized("invalid API key".into()));
    };
    let tenancy = Arc::clone(&state.tenancy);
    tenancy.saw(&tenant.name);
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return next.run(Request::from_parts(parts, Body::empty())).await;
    };
    let mut json: Option<Value> = serde_json::from_slice(&bytes).ok();
    let model = json
        .as_ref()
        .and_then(|v| v.get("model"))
        .and_then(Value::as_str)
        .and_then(|m| ModelName::parse(m, "model").ok())
        .and_then(|name| state.registry.describe(&name))
        .map(|listed| listed.name);
    if let Some(model) = &model {
        // Its refusals here (403, 429, a full queue) count under the model.
        crate::metrics::http::note_model(model);
        if !tenant.may_use(model) {
            crate::metrics::users::rejected(&tenant.name, None);
            return refuse(
                &path,
                ApiError::Forbidden(format!(
                    "the key {} may not use the model {model}",
                    tenant.name
                )),
            );
        }
    }
    let (in_flight, rate) = match tenancy.limiter.admit(&tenant, Instant::now()) {
        Ok(admitted) => admitted,
        Err(refused) => {
            crate::metrics::users::rejected(&tenant.name, Some(refused.exceeded));
            return too_many(&path, &refused);
        }
    };
    let capped = json.as_mut().is_some_and(|v| cap(v, &path, &tenant));
    let body = match json.filter(|_| capped) {
        Some(v) => Body::from(serde_json::to_vec(&v).expect("JSON serializes")),
        None => Body::from(bytes),
    };
    let request = Request::from_parts(parts, body);
    let priority = priority(&tenant, request.headers());
    let fair_user: Arc<str> =
        fairness_id(&tenant, request.headers()).map_or_else(|| Arc::clone(&tenant.name), Arc::from);
    let mut arrival: Option<Arrival> = None;
    let permit = match model.filter(|_| generates) {
        Some(model) => {
            arrival = Some(state.registry.arrive(&model));
            let gate = tenancy.gates.gate(&model);
            match gate.admit(&fair_user, tenant.weight, priority).await {
                Ok(permit) => Some(permit),
                Err(QueueFull) => {
                    crate::metrics::rejected(&model, crate::metrics::Rejection::QueueFull);
                    let mut response = refuse(
                        &path,
                        ApiError::Unavailable(format!(
                            "model {model}: the model's request queue is full, retry later"
                        )),
                    );
                    insert(response.headers_mut(), "retry-after", "1");
                    return response;
                }
            }
        }
        None => None,
    };
    if let Some(arrival) = arrival.as_mut() {
        arrival.passed_gate();
    }
    let waited = permit.as_ref().map(|p| p.admission.waited.as_secs_f64());
    crate::metrics::users::request_started(&tenant.name, waited.unwrap_or(0.0));
    let current = Arc::new(RequestUser {
        user: Arc::clone(&tenant.name),
        tokens: permit
            .as_ref()
            .map_or_else(|| Arc::new(AtomicU64::new(0)), |p| Arc::clone(&p.tokens)),
        limiter: Arc::clone(&tenancy.limiter),
    });
    let admission = permit.as_ref().map(|p| p.admission);
    let handler = CURRENT.scope(Arc::clone(&current), next.run(request));
    let response = match arrival {
        Some(arrival) => arrival.scope(handler).await,
        None => handler.await,
    };
    let (mut parts, body) = response.into_parts();
    for (name, value) in rate.pairs() {
        insert(&mut parts.headers, name, &value);
    }
    if let Some(a) = admission {
        insert(
            &mut parts.headers,
            QUEUE_SECONDS_HEADER,
            &format!("{:.3}", a.waited.as_secs_f64()),
        );
        insert(
            &mut parts.headers,
            STARTED_WHILE_WAITING_HEADER,
            &a.started_while_waiting.to_string(),
        );
        insert(
            &mut parts.headers,
            BATCH_STARTED_WHILE_WAITING_HEADER,
            &a.batch_started_while_waiting.to_string(),
        );
    }
    let body = Body::new(Held {
        body,
        current,
        _permit: permit,
        _in_flight: in_flight,
    });
    Response::from_parts(parts, body)
}

fn insert(headers: &mut HeaderMap, name: &'static str, value: &str) {
    if let Ok(value) = HeaderValue::from_str(value) {
        headers.insert(HeaderName::from_static(name), value);
    }
}

/// The request's priority: the key's, or batch when the header asks.
fn priority(tenant: &Tenant, headers: &HeaderMap) -> Priority {
    let asked = headers
        .get(PRIORITY_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(Priority::parse);
    match asked {
        Some(Priority::Batch) => Priority::Batch,
        _ => tenant.priority,
    }
}

/// The fairness id a trusted front set: an admin key's, or anyone's on a
/// server that asks for no key. At most 64 bytes are kept.
fn fairness_id(tenant: &Tenant, headers: &HeaderMap) -> Option<String> {
    let trusted = tenant.role == Role::Admin || &*tenant.name == ANONYMOUS_USER;
    let id = headers.get(FAIRNESS_HEADER)?.to_str().ok()?.trim();
    (trusted && !id.is_empty()).then(|| {
        let mut end = id.len().min(64);
        while !id.is_char_boundary(end) {
            end -= 1;
        }
        format!("fairness:{}", &id[..end])
    })
}

/// Caps the body's reply length and context at the key's limits; whether
/// it changed.
fn cap(body: &mut Value, path: &str, tenant: &Tenant) -> bool {
    let limits = &tenant.limits;
    let Some(object) = body.as_object_mut() else {
        return false;
    };
    let mut changed = false;
    let mut clamp =
        |slot: &mut serde_json::Map<String, Value>, field: &str, max: u32, set: bool| {
            let over = match slot.get(field) {
                None | Some(Value::Null) => set,
                // Ollama's -1 and -2: no limit, and fill the context.
                Some(v) => v.as_i64().is_none_or(|n| n < 0 || n > i64::from(max)),
            };
            if over {
                slot.insert(field.to_string(), json!(max));
                changed = true;
            }
        };
    if let Some(max) = limits.max_tokens {
        if path.starts_with("/api/") {
            let options = object.entry("options").or_insert_with(|| json!({}));
            if let Some(options) = options.as_object_mut() {
                clamp(options, "num_predict", max, true);
            }
        } else if path == "/v1/responses" {
            clamp(object, "max_output_tokens", max, true);
        } else if path == "/v1/chat/completions" && object.contains_key("max_completion_tokens") {
            clamp(object, "max_completion_tokens", max, true);
            clamp(object, "max_tokens", max, false);
        } else {
            clamp(object, "max_tokens", max, true);
        }
    }
    // The context a request uses is capped in core, on every route
    // (Observer::context_cap); here only an Ollama num_ctx asked above the
    // cap is lowered to it. One is never set where the request has none: a
    // num_ctx reloads the model at that context (refused under a budget, a
    // 400 past the model's training context) where the served one would do.
    if let Some(max) = limits.max_context {
        if path.starts_with("/api/") {
            if let Some(options) = object.get_mut("options").and_then(Value::as_object_mut) {
                clamp(options, "num_ctx", max, false);
            }
        }
    }
    changed
}

/// An error in the route's family.
fn refuse(path: &str, error: ApiError) -> Response {
    if path.starts_with("/v1/messages") {
        crate::api::anthropic::AnthropicError(error).into_response()
    } else if path.starts_with("/v1/") {
        OpenAiError(error).into_response()
    } else {
        OllamaError(error).into_response()
    }
}

/// 429 as each family writes it: OpenAI's `rate_limit_exceeded` (type
/// `requests` or `tokens`), Anthropic's `rate_limit_error`, Ollama's
/// `{"error"}`.
fn too_many(path: &str, refused: &Refused) -> Response {
    let message = refused.message.clone();
    let body = if path.starts_with("/v1/messages") {
        json!({"type": "error", "error": {"type": "rate_limit_error", "message": message}})
    } else if path.starts_with("/v1/") {
        let kind = match refused.exceeded {
            super::limits::Exceeded::Tokens => "tokens",
            _ => "requests",
        };
        json!({"error": {"message": message, "type": kind, "param": null, "code": "rate_limit_exceeded"}})
    } else {
        json!({ "error": message })
    };
    let mut response = (StatusCode::TOO_MANY_REQUESTS, Json(body)).into_response();
    let headers = response.headers_mut();
    for (name, value) in refused.headers.pairs() {
        insert(headers, name, &value);
    }
    insert(
        headers,
        "retry-after",
        &(refused.retry_after.as_secs_f64().ceil().max(1.0) as u64).to_string(),
    );
    response
}

/// A response body that holds the request's slot and concurrency until it
/// ends, and is polled as its user's ([`CURRENT`]): a generation streamed
/// in it is counted for them.
struct Held {
    body: Body,
    current: Arc<RequestUser>,
    _permit: Option<Permit>,
    _in_flight: InFlight,
}

impl HttpBody for Held {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Bytes>, axum::Error>>> {
        let current = Arc::clone(&self.current);
        CURRENT.sync_scope(current, || Pin::new(&mut self.body).poll_frame(cx))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

/// `GET /api/usage`: every user's requests, tokens, queue time and
/// refusals since the start, and what each holds and waits for now.
/// Admins only when any admin key exists (a named admin key or
/// `--admin-key`); on a server that asks for no key, anyone.
pub async fn usage(State(state): State<AppState>, headers: HeaderMap) -> Response {
    let Some(tenant) = tenant_of(&state, &headers) else {
        return refuse(
            "/api/usage",
            ApiError::Unauthorized("invalid API key".into()),
        );
    };
    let admins_exist = state.security.keys.get().admin.is_some()
        || state
            .tenancy
            .keys()
            .tenants
            .iter()
            .any(|t| t.role == Role::Admin);
    if admins_exist && tenant.role != Role::Admin {
        return refuse(
            "/api/usage",
            ApiError::Forbidden("/api/usage needs an admin key".into()),
        );
    }
    let slots: Vec<Value> = state
        .tenancy
        .gates
        .snapshot()
        .into_iter()
        .map(|(model, users)| json!({"model": model, "users": users}))
        .collect();
    Json(json!({ "users": state.tenancy.usage(), "models": slots })).into_response()
}
