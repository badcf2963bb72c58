//! The route table: every path the server answers, its methods and
//! handlers, who may call it ([`Auth`]) and whether it runs a model. The
//! router ([`crate::server::app`]) is built from it and the key check
//! ([`crate::security::guard`]) reads it, so a route's auth is written once.
//!
//! The OpenAPI document ([`super::openapi`]) reads it too: which routes it
//! lists, each operation's security requirement and the statuses the
//! layers answer (401 but on open routes; 404, 503 and 500 where a model
//! runs); tests hold the handlers utoipa documents and the table together.
use std::sync::LazyLock;

use axum::http::Method;
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{on, MethodFilter, MethodRouter};
use axum::Json;

use super::{anthropic, blobs, create, debug, health, ollama, openai, openapi, pull, responses};
use crate::core::error::{ApiError, OllamaError, OpenAiError};
use crate::metrics;
use crate::state::AppState;

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    /// Anyone: liveness, the version, the docs, the status page's shell
    /// (its data is at `/api/status`, which needs the key).
    Open,
    /// The API key, when one is set (or the admin key).
    Key,
    /// The API key, except for loopback clients when
    /// `metrics_open_on_loopback` (a local Prometheus).
    Scrape,
    /// Changes which models exist: the admin key when one is set (the API
    /// key otherwise).
    Admin,
}

/// How a route's request body is read before its handler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Body {
    /// Whole, within the shared bounds of [`crate::bodies`].
    Whole,
    /// Streamed by the handler (uploads, which have their own cap).
    Streamed,
}

/// An HTTP method a route answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verb {
    Get,
    Head,
    Post,
    Delete,
}

impl Verb {
    pub fn method(self) -> Method {
        match self {
            Verb::Get => Method::GET,
            Verb::Head => Method::HEAD,
            Verb::Post => Method::POST,
            Verb::Delete => Method::DELETE,
        }
    }

    fn filter(self) -> MethodFilter {
        match self {
            Verb::Get => MethodFilter::GET,
            Verb::Head => MethodFilter::HEAD,
            Verb::Post => MethodFilter::POST,
            Verb::Delete => MethodFilter::DELETE,
        }
    }
}

/// One method of a route and its handler (given the method's filter, so
/// the two cannot disagree). A `GET` answers `HEAD` too.
#[derive(Clone, Copy)]
pub struct Endpoint {
    pub verb: Verb,
    handler: fn(MethodFilter) -> MethodRouter<AppState>,
}

/// One path of the table.
#[derive(Clone, Copy)]
pub struct Route {
    /// In axum's syntax: `{name}` one segment, `{*name}` the rest.
    pub path: &'static str,
    pub endpoints: &'static [Endpoint],
    pub auth: Auth,
    /// It runs a model: it may queue (503) and fail mid-way (500).
    pub runs_model: bool,
    /// It is in the OpenAPI document.
    pub documented: bool,
    pub body: Body,
    /// Only with `HYPURA_RUNNER_TEST_HOOKS=1` (see [`super::debug`]).
    pub test_hook: bool,
}

macro_rules! endpoint {
    ($verb:ident $handler:expr) => {
        Endpoint {
            verb: Verb::$verb,
            handler: |filter| on(filter, $handler),
        }
    };
}

const fn route(path: &'static str, auth: Auth, endpoints: &'static [Endpoint]) -> Route {
    Route {
        path,
        endpoints,
        auth,
        runs_model: false,
        documented: true,
        body: Body::Whole,
        test_hook: false,
    }
}

impl Route {
    const fn runs_model(self) -> Route {
        Route {
            runs_model: true,
            ..self
        }
    }

    const fn undocumented(self) -> Route {
        Route {
            documented: false,
            ..self
        }
    }

    const fn streamed(self) -> Route {
        Route {
            body: Body::Streamed,
            ..self
        }
    }

    const fn test_hook(self) -> Route {
        Route {
            test_hook: true,
            documented: false,
            ..self
        }
    }

    /// The handlers of every method of the route.
    pub fn method_router(&self) -> MethodRouter<AppState> {
        self.endpoints
            .iter()
            .fold(MethodRouter::new(), |router, e| {
                router.merge((e.handler)(e.verb.filter()))
            })
    }

    /// Whether this server serves the route (test hooks only when on).
    pub fn enabled(&self) -> bool {
        !self.test_hook
            || std::env::var(crate::pool::runner::protocol::TEST_HOOKS_ENV).as_deref() == Ok("1")
    }

    /// The path in OpenAPI's syntax (`{*id}` is `{id}` there).
    pub fn openapi_path(&self) -> String {
        self.path.replace("{*", "{")
    }

    /// Whether `path` (its trailing slash already trimmed) is this route.
    pub fn matches(&self, path: &str) -> bool {
        let mut wanted = self.path.split('/');
        let mut given = path.split('/');
        loop {
            match (wanted.next(), given.next()) {
                (None, None) => return true,
                (Some(w), Some(g)) if w.starts_with("{*") => return !g.is_empty(),
                (Some(w), Some(g)) if w.starts_with('{') => {
                    if g.is_empty() {
                        return false;
                    }
                }
                (Some(w), Some(g)) if w == g => {}
                _ => return false,
            }
        }
    }
}

/// Every route.
pub static ROUTES: &[Route] = &[
    route("/", Auth::Open, &[endpoint!(Get ollama::root)]),
    route(
        "/api/version",
        Auth::Open,
        &[endpoint!(Get ollama::version)],
    ),
    route("/health", Auth::Open, &[endpoint!(Get health::health)]),
    route("/ready", Auth::Open, &[endpoint!(Get health::ready)]),
    route("/api/tags", Auth::Key, &[endpoint!(Get ollama::tags)]),
    route("/api/ps", Auth::Key, &[endpoint!(Get ollama::ps)]),
    route("/api/show", Auth::Key, &[endpoint!(Post ollama::show)]),
    route(
        "/api/generate",
        Auth::Key,
        &[endpoint!(Post ollama::generate)],
    )
    .runs_model(),
    route("/api/chat", Auth::Key, &[endpoint!(Post ollama::chat)]).runs_model(),
    route("/api/embed", Auth::Key, &[endpoint!(Post ollama::embed)]).runs_model(),
    route(
        "/api/embeddings",
        Auth::Key,
        &[endpoint!(Post ollama::embeddings)],
    )
    .runs_model(),
    route(
        "/api/delete",
        Auth::Admin,
        &[endpoint!(Delete ollama::delete_model)],
    ),
    route("/api/copy", Auth::Admin, &[endpoint!(Post ollama::copy)]),
    route("/api/pull", Auth::Admin, &[endpoint!(Post pull::pull)]),
    route(
        "/api/create",
        Auth::Admin,
        &[endpoint!(Post create::create)],
    ),
    route("/api/push", Auth::Admin, &[endpoint!(Post create::push)]),
    route(
        "/api/blobs/{digest}",
        Auth::Admin,
        &[
            endpoint!(Post blobs::post_blob),
            endpoint!(Head blobs::head_blob),
        ],
    )
    .streamed(),
    route(
        "/v1/models",
        Auth::Key,
        &[endpoint!(Get openai::list_models)],
    ),
    route(
        "/v1/models/{*id}",
        Auth::Key,
        &[endpoint!(Get openai::retrieve_model)],
    ),
    route(
        "/v1/chat/completions",
        Auth::Key,
        &[endpoint!(Post openai::chat_completions)],
    )
    .runs_model(),
    route(
        "/v1/completions",
        Auth::Key,
        &[endpoint!(Post openai::completions)],
    )
    .runs_model(),
    route(
        "/v1/embeddings",
        Auth::Key,
        &[endpoint!(Post openai::embeddings)],
    )
    .runs_model(),
    route(
        "/v1/responses",
        Auth::Key,
        &[endpoint!(Post responses::create_response)],
    )
    .runs_model(),
    route(
        "/v1/messages",
        Auth::Key,
        &[endpoint!(Post anthropic::messages)],
    )
    .runs_model(),
    route(
        "/v1/messages/count_tokens",
        Auth::Key,
        &[endpoint!(Post anthropic::count_tokens)],
    )
    .runs_model(),
    route("/openapi.json", Auth::Open, &[endpoint!(Get openapi_json)]).undocumented(),
    route("/docs", Auth::Open, &[endpoint!(Get docs_page)]).undocumented(),
    route(
        "/metrics",
        Auth::Scrape,
        &[endpoint!(Get metrics::http::handler)],
    )
    .undocumented(),
    route(
        "/status",
        Auth::Open,
        &[endpoint!(Get metrics::status::page)],
    )
    .undocumented(),
    route(
        "/api/status",
        Auth::Key,
        &[endpoint!(Get metrics::status::data)],
    )
    .undocumented(),
    // Admins only when any admin key exists (checked by the handler, which
    // knows the keys file's roles).
    route(
        "/api/usage",
        Auth::Key,
        &[endpoint!(Get crate::tenancy::http::usage)],
    )
    .undocumented(),
    route(
        "/api/debug/abort-runner",
        Auth::Key,
        &[endpoint!(Post debug::abort_runner)],
    )
    .test_hook(),
    route(
        "/api/debug/runner-ballast",
        Auth::Key,
        &[endpoint!(Post debug::runner_ballast)],
    )
    .test_hook(),
];

/// The route `path` is (its trailing slash already trimmed), if any.
pub fn find(path: &str) -> Option<&'static Route> {
    ROUTES.iter().find(|r| r.matches(path))
}

/// Who may call `path`: an unknown path needs the key like any route (so
/// a caller without it learns nothing of which paths exist).
pub fn auth_of(path: &str) -> Auth {
    find(path).map_or(Auth::Key, |r| r.auth)
}

/// The API a path belongs to, whose shape its errors take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Ollama,
    OpenAi,
    Anthropic,
}

/// Anthropic's under `/v1/messages`, OpenAI's elsewhere under `/v1`,
/// Ollama's else.
pub fn family(path: &str) -> Family {
    if path == "/v1/messages" || path.starts_with("/v1/messages/") {
        Family::Anthropic
    } else if path == "/v1" || path.starts_with("/v1/") {
        Family::OpenAi
    } else {
        Family::Ollama
    }
}

/// An error written in the family of the route asked for ([`family`]).
pub fn family_error(path: &str, e: ApiError) -> Response {
    match family(path) {
        Family::Anthropic => anthropic::AnthropicError(e).into_response(),
        Family::OpenAi => OpenAiError(e).into_response(),
        Family::Ollama => OllamaError(e).into_response(),
    }
}

async fn openapi_json() -> Response {
    Json(openapi::document()).into_response()
}

async fn docs_page() -> Html<String> {
    static PAGE: LazyLock<String> =
        LazyLock::new(|| utoipa_scalar::Scalar::new(openapi::document()).to_html());
    Html(PAGE.clone())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn the_table_and_the_openapi_document_list_the_same_routes() {
        let doc = serde_json::to_value(openapi::document()).unwrap();
        let mut documented = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for method in ["get", "head", "post", "put", "delete", "patch", "options"] {
                if item.get(method).is_some() {
                    documented.insert((path.clone(), method.to_string()));
                }
            }
        }
        let table: BTreeSet<(String, String)> = ROUTES
            .iter()
            .filter(|r| r.documented)
            .flat_map(|r| {
                r.endpoints.iter().map(|e| {
                    (
                        r.openapi_path(),
                        e.verb.method().as_str().to_ascii_lowercase(),
                    )
                })
            })
            .collect();
        let missing: Vec<_> = table.difference(&documented).collect();
        assert!(
            missing.is_empty(),
            "routes not in the document: {missing:?}"
        );
        let extra: Vec<_> = documented.difference(&table).collect();
        assert!(
            extra.is_empty(),
            "documented routes not in the table: {extra:?}"
        );
        for route in ROUTES.iter().filter(|r| !r.documented) {
            assert!(
                doc["paths"].get(route.openapi_path()).is_none(),
                "{} is documented but marked undocumented",
                route.path
            );
        }
    }

    #[test]
    fn paths_are_unique_and_match_only_themselves() {
        let paths: BTreeSet<_> = ROUTES.iter().map(|r| r.path).collect();
        assert_eq!(paths.len(), ROUTES.len());
        for route in ROUTES {
            let concrete = route
                .path
                .replace("{digest}", "sha256-00")
                .replace("{*id}", "org/model");
            assert_eq!(find(&concrete).map(|r| r.path), Some(route.path));
        }
        assert_eq!(find("/v1/models/a").unwrap().path, "/v1/models/{*id}");
        for unknown in [
            "/api",
            "/api/blobs",
            "/api/blobs/a/b",
            "/v1/models/",
            "/x",
            "",
        ] {
            assert!(find(unknown).is_none(), "{unknown}");
        }
    }

    #[test]
    fn auth_classes() {
        let with = |auth: Auth| -> Vec<&str> {
            ROUTES
                .iter()
                .filter(|r| r.auth == auth)
                .map(|r| r.path)
                .collect()
        };
        assert_eq!(
            with(Auth::Admin),
            [
                "/api/delete",
                "/api/copy",
                "/api/pull",
                "/api/create",
                "/api/push",
                "/api/blobs/{digest}"
            ]
        );
        assert_eq!(
            with(Auth::Open),
            [
                "/",
                "/api/version",
                "/health",
                "/ready",
                "/openapi.json",
                "/docs",
                "/status"
            ]
        );
        assert_eq!(with(Auth::Scrape), ["/metrics"]);
        assert_eq!(auth_of("/api/blobs/sha256-ab"), Auth::Admin);
        assert_eq!(auth_of("/api/chat"), Auth::Key);
        assert_eq!(auth_of("/nowhere"), Auth::Key);
    }
}
