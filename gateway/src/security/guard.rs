//! The request guards: the origin and `Host` check and the key check, each
//! route's class read from the route table ([`crate::api::routes`]).
use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::Response;

use crate::api::routes::{self, family_error, Auth};
use crate::core::error::ApiError;
use crate::security::KeyPair;
use crate::state::AppState;
use crate::tenancy::keys::Role;

/// Refuses (403) a request from a web page of a foreign origin, or one
/// naming a `Host` this server does not answer to (DNS rebinding); see
/// [`super::origin`]. Runs inside the CORS layer, so a refused preflight
/// gets no CORS headers either.
pub async fn origin_guard(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let headers = request.headers();
    let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
    let origins = &state.security.origins;
    let refusal = if !origins.host_allowed(host) {
        Some(
            "this server does not answer to that Host name: use localhost or 127.0.0.1, or \
              list the name in [server] allowed_hosts",
        )
    } else if headers.get(header::ORIGIN).is_some_and(|origin| {
        !origin
            .to_str()
            .is_ok_and(|o| origins.origin_allowed(o, host))
    }) {
        Some(
            "requests from this web page's origin are not allowed: list it in [server] \
              allowed_origins",
        )
    } else {
        None
    };
    match refusal {
        Some(message) => {
            let path = request.uri().path().to_string();
            family_error(&path, ApiError::Forbidden(message.into()))
        }
        None => next.run(request).await,
    }
}

/// The key of `Authorization: Bearer <key>` (the scheme in any case, as
/// RFC 9110 has it), or of `x-api-key` (Anthropic's clients), if sent.
pub fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.trim_start()
                .split_once(' ')
                .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
                .map(|(_, key)| key)
        })
        .or_else(|| headers.get("x-api-key").and_then(|v| v.to_str().ok()))
        .map(str::trim)
}

/// The key each route's [`Auth`] asks for: the API key on every route but
/// the open ones; the admin key (when set) on the routes that add or remove
/// models, where the API key is not enough. The admin key opens every
/// route; on a LAN bind with no API key it is the API key too (a LAN bind
/// never leaves routes open by accident).
pub async fn auth(State(state): State<AppState>, request: Request, next: Next) -> Response {
    let path = request.uri().path();
    let class = routes::auth_of(path);
    if request.method() == Method::OPTIONS || class == Auth::Open {
        return next.run(request).await;
    }
    if class == Auth::Scrape && state.metrics_open_on_loopback && from_loopback(&request) {
        return next.run(request).await;
    }
    let keys = state.security.keys.get();
    let presented = bearer(request.headers());
    let matches = |key: Option<&str>| {
        key.zip(presented)
            .is_some_and(|(k, p)| constant_time_eq(p.as_bytes(), k.as_bytes()))
    };
    // A named key of the keys file ([`crate::tenancy`]) is an API key, or
    // an admin key for its admin role.
    let named = presented.and_then(|p| state.tenancy.keys().find(p));
    let is_admin =
        matches(keys.admin.as_deref()) || named.as_ref().is_some_and(|t| t.role == Role::Admin);
    let is_user = matches(keys.api.as_deref()) || named.is_some();
    if (keys.admin.is_some() || state.tenancy.has_admin()) && class == Auth::Admin {
        if is_admin {
            return next.run(request).await;
        }
        if presented.is_some() && (keys.api.is_none() || is_user) {
            return family_error(
                path,
                ApiError::Forbidden("this route needs the admin key".into()),
            );
        }
        return unauthorized(path, presented.is_some());
    }
    if open_without_key(&keys, &state) || is_admin || is_user {
        return next.run(request).await;
    }
    unauthorized(path, presented.is_some())
}

/// Whether a key-class route answers a request that presents no key: no API
/// key and no named keys set, and no admin key standing in for the API key
/// on a LAN bind. The tenancy layer reads the same rule to know a request
/// without a key is the anonymous user, not an intruder.
pub fn open_without_key(keys: &KeyPair, state: &AppState) -> bool {
    keys.api.is_none()
        && !state.tenancy.has_keys()
        && !(keys.admin.is_some() && state.security.lan_needs_key())
}

fn unauthorized(path: &str, presented: bool) -> Response {
    let message = if presented {
        "invalid API key"
    } else {
        "missing API key: send the header `Authorization: Bearer <key>` or `x-api-key: <key>`"
    };
    let mut response = family_error(path, ApiError::Unauthorized(message.into()));
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// Whether the request came over a loopback connection.
fn from_loopback(request: &Request) -> bool {
    request
        .extensions()
        .get::<ConnectInfo<SocketAddr>>()
        .is_some_and(|ConnectInfo(peer)| peer.ip().is_loopback())
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
