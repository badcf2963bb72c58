//! The one door to every model: the [`Models`] trait [`crate::infer`]
//! and the model lists go through, and its error type.
//!
//! Core names what it needs of a model and no more: where a name runs (here,
//! with the facts the request is checked against, or on another server), a
//! lease on its backend for one request, and what is listed and loaded. The
//! pool implements it (local models first, then the upstreams); core never
//! sees how.
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::future::BoxFuture;

use super::backend::{BackendStatus, MemoryUse, ModelBackend, ModelFacts};
use super::request::BackendRequest;
use super::validation::{KeepAlive, ModelName};

/// Why a model could not be served; its HTTP status is decided in
/// [`crate::error`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelsError {
    /// No model of that name (the name as the client sent it).
    #[error("model '{0}' not found")]
    NotFound(String),
    /// The model can never fit the memory budget.
    #[error("{0}")]
    Rejected(String),
    /// No room in the budget now: retry later.
    #[error("{0}")]
    NoRoom(String),
    /// Loading or starting the model failed.
    #[error("{0}")]
    Failed(String),
}

/// A model held for one request, behind its backend.
pub struct BackendLease {
    /// Dropping it lets the pool unload the model (after its keep-alive).
    pub backend: Arc<dyn ModelBackend>,
    /// Time this request spent loading the model (zero when it was loaded).
    pub load_duration: Duration,
}

/// Defaults a model brings to every request for it (a model made by
/// `/api/create`: its template, system prompt, messages and options).
pub trait RequestDefaults: Send + Sync {
    fn apply(&self, request: &mut BackendRequest);
}

/// A model run here: what a request is checked against before admission.
#[derive(Clone)]
pub struct LocalModel {
    pub chat_template: Option<String>,
    pub capabilities: Vec<&'static str>,
    /// Its training context, in tokens.
    pub context_length: Option<u64>,
    pub defaults: Option<Arc<dyn RequestDefaults>>,
}

/// Where a name runs.
pub enum Found {
    /// Here: check the request, then ask [`Models::lease`].
    Local(LocalModel),
    /// On another server: a lease on it already (nothing to load here).
    Remote(BackendLease),
}

/// What a request asks the pool for.
#[derive(Debug, Clone, Copy)]
pub struct LeaseRequest<'a> {
    /// The name as the client sent it (for errors).
    pub requested: &'a str,
    pub name: &'a ModelName,
    /// How long to keep it after the request (`None`: the model's default).
    pub keep_alive: Option<KeepAlive>,
    /// At least this many tokens per sequence (`None`: the model's).
    pub context: Option<u32>,
}

/// A model a client can name, here or on an upstream (the model lists,
/// `/api/show`).
#[derive(Debug, Clone)]
pub struct ListedModel {
    /// `name:tag`, as listed.
    pub name: String,
    pub facts: ModelFacts,
    /// The context a request gets, in tokens (0: the upstream says none).
    pub context_length: u32,
    /// Why it can never run within the memory budget (listed, refused when asked for).
    pub unavailable: Option<String>,
    /// Where its weights come from, in words (`/api/show`'s `FROM`).
    pub from: String,
}

/// A model in memory now, here or on an upstream (`/api/ps`).
#[derive(Debug, Clone)]
pub struct RunningModel {
    /// The name it was loaded under.
    pub name: String,
    pub facts: ModelFacts,
    /// When it unloads if idle (`None`: never, or not known here).
    pub expires_at: Option<SystemTime>,
    /// Bytes it takes in memory (GPU and RAM).
    pub size_bytes: u64,
    pub memory: MemoryUse,
    pub status: BackendStatus,
    /// The upstream it runs on (`None`: here).
    pub node: Option<String>,
}

/// Every model the server can reach, local or remote.
pub trait Models: Send + Sync {
    /// Where `name` runs (`None`: nowhere). A model served here runs here
    /// unless its queue is full and an upstream has it loaded.
    fn find(&self, name: &ModelName) -> Option<Found>;

    /// The model of `want`, loaded (or admitted under the budget) and held
    /// for one request.
    fn lease<'a>(
        &'a self,
        want: LeaseRequest<'a>,
    ) -> BoxFuture<'a, Result<BackendLease, ModelsError>>;

    /// Unloads `name` if it is loaded here (in-flight requests finish).
    fn unload(&self, name: &ModelName);

    /// The reply length of a request that sets none, in tokens.
    fn default_max_tokens(&self) -> u32;

    /// Every model a client can name: those served here, then the
    /// upstreams' not served here under the same name.
    fn list(&self) -> Vec<ListedModel>;

    /// The listing of `name` (`None`: no such model).
    fn describe(&self, name: &ModelName) -> Option<ListedModel>;

    /// The models in memory: here, then on the upstreams.
    fn loaded(&self) -> Vec<RunningModel>;
}
