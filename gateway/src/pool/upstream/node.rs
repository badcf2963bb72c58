//! One upstream server: its HTTP client, the models it serves, and what its
//! last probe and its last requests said about it.
//!
//! State lives behind one mutex per node ([`Node::state`]), held only to
//! copy or replace values, never across an `await`.
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use serde_json::{Map, Value};

use super::config::{UpstreamConfig, UpstreamKind};
use crate::core::backend::ModelFacts;
use crate::core::validation::ModelName;

/// A model an upstream serves, as it names and describes it.
#[derive(Debug, Clone)]
pub struct RemoteModel {
    /// The name it is served under here.
    pub name: ModelName,
    /// The name the upstream knows it by.
    pub upstream_name: String,
    /// Served under an alias (listed once, under the upstream's own name).
    pub alias: bool,
    pub facts: ModelFacts,
}

/// What the upstream's `/api/ps` says of one of its models.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PeerLoad {
    /// Requests generating there now.
    pub active: usize,
    /// Requests waiting there for a slot.
    pub queued: usize,
    /// Its context per sequence, in tokens.
    pub context_length: u32,
    pub size_bytes: u64,
    pub size_vram_bytes: u64,
}

#[derive(Debug, Default)]
struct NodeState {
    models: Vec<RemoteModel>,
    /// Its loaded models by its name, lower-case (from `/api/ps`; empty for `openai`).
    loaded: HashMap<String, PeerLoad>,
    /// The last probe answered (none yet: unknown, treated as up).
    probe_ok: Option<bool>,
    cooldown_until: Option<Instant>,
}

/// One upstream server.
pub struct Node {
    pub config: UpstreamConfig,
    pub client: reqwest::Client,
    state: Mutex<NodeState>,
    /// Requests this server has in flight there now.
    outstanding: AtomicUsize,
}

/// Why a request to one upstream failed, and what to do next.
#[derive(Debug)]
pub enum Failure {
    /// No connection, a timeout, a 5xx: the node is put in cooldown and the
    /// request may go to another.
    Node(String),
    /// The node does not have the model (any more): try another.
    Missing(String),
    /// The request itself is wrong: no other node would answer otherwise.
    Refused(crate::core::backend::BackendError),
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Node {
    pub fn new(config: UpstreamConfig) -> Result<Node, String> {
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .tcp_nodelay(true)
            .build()
            .map_err(|e| format!("upstream {}: {e}", config.name))?;
        let node = Node {
            client,
            state: Mutex::new(NodeState::default()),
            outstanding: AtomicUsize::new(0),
            config,
        };
        if !node.config.models.is_empty() {
            let models = node.named(
                node.config
                    .models
                    .iter()
                    .map(|m| (m.clone(), facts_unknown()))
                    .collect(),
            );
            lock(&node.state).models = models;
        }
        Ok(node)
    }

    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// `path` on this upstream, its key attached.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let builder = self
            .client
            .request(method, format!("{}{path}", self.config.base_url))
            .header(super::HOP_HEADER, "1");
        match &self.config.api_key {
            Some(key) => builder.bearer_auth(&key.0),
            None => builder,
        }
    }

    /// Its models, each under its own name and under every alias of it.
    fn named(&self, models: Vec<(String, ModelFacts)>) -> Vec<RemoteModel> {
        let mut named = Vec::new();
        for (upstream_name, facts) in models {
            if let Ok(name) = ModelName::parse(&upstream_name, "model") {
                for (alias, target) in &self.config.aliases {
                    let target = ModelName::parse(target, "alias").ok();
                    if target.is_some_and(|t| t.key == name.key) {
                        named.push(RemoteModel {
                            name: alias.clone(),
                            upstream_name: upstream_name.clone(),
                            alias: true,
                            facts: facts.clone(),
                        });
                    }
                }
                named.push(RemoteModel {
                    name,
                    upstream_name,
                    alias: false,
                    facts,
                });
            }
        }
        named
    }

    pub fn models(&self) -> Vec<RemoteModel> {
        lock(&self.state).models.clone()
    }

    /// The upstream's name of the model served here as `name`, if it has it.
    pub fn find(&self, name: &ModelName) -> Option<RemoteModel> {
        lock(&self.state)
            .models
            .iter()
            .find(|m| m.name.key == name.key)
            .cloned()
    }

    /// What its `/api/ps` said of `upstream_name` (`None`: not loaded there, or unknown).
    pub fn load_of(&self, upstream_name: &str) -> Option<PeerLoad> {
        let key = ModelName::parse(upstream_name, "model").ok()?.key;
        lock(&self.state).loaded.get(&key).copied()
    }

    /// Its loaded models (its `/api/ps`), with their facts where known.
    pub fn loaded(&self) -> Vec<(RemoteModel, PeerLoad)> {
        let state = lock(&self.state);
        state
            .models
            .iter()
            .filter(|m| !m.alias)
            .filter_map(|m| {
                let key = ModelName::parse(&m.upstream_name, "model").ok()?.key;
                Some((m.clone(), *state.loaded.get(&key)?))
            })
            .collect()
    }

    /// Whether it may be sent requests now: its last probe answered and it
    /// is not cooling down after a failure.
    pub fn available(&self) -> bool {
        let state = lock(&self.state);
        state.probe_ok != Some(false) && state.cooldown_until.is_none_or(|t| Instant::now() >= t)
    }

    /// A request to it failed: skip it for its cooldown.
    pub fn cool_down(&self, why: &str) {
        tracing::warn!(
            upstream = self.name(),
            "upstream failed, skipped for {:?}: {why}",
            self.config.cooldown
        );
        lock(&self.state).cooldown_until = Some(Instant::now() + self.config.cooldown);
        crate::metrics::upstream::set_up(self.name(), false);
    }

    pub fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::SeqCst)
    }

    /// Counts one request in flight until the guard drops.
    pub fn begin(self: &std::sync::Arc<Self>) -> InFlight {
        self.outstanding.fetch_add(1, Ordering::SeqCst);
        InFlight(std::sync::Arc::clone(self))
    }

    /// Probes the upstream: its model list (unless configured) and, for
    /// Ollama-speaking kinds, its loaded models. A failed probe marks it down.
    pub async fn probe(&self) {
        let result = match self.config.kind {
            UpstreamKind::Openai => self.probe_openai().await,
            UpstreamKind::Hypura | UpstreamKind::Ollama => self.probe_ollama().await,
        };
        let ok = match result {
            Ok(()) => true,
            Err(why) => {
                tracing::warn!(upstream = self.name(), "health probe failed: {why}");
                false
            }
        };
        let mut state = lock(&self.state);
        if ok && state.probe_ok == Some(false) {
            tracing::info!(upstream = self.name(), "upstream is answering again");
        }
        state.probe_ok = Some(ok);
        let up = ok && state.cooldown_until.is_none_or(|t| Instant::now() >= t);
        drop(state);
        crate::metrics::upstream::set_up(self.name(), up);
    }

    async fn get_json(&self, path: &str) -> Result<Value, String> {
        let response = self
            .request(reqwest::Method::GET, path)
            .timeout(self.config.first_byte_timeout)
            .send()
            .await
            .map_err(|e| format!("GET {path}: {}", super::wire::describe(&e)))?;
        if !response.status().is_success() {
            return Err(format!("GET {path}: status {}", response.status()));
        }
        response
            .json()
            .await
            .map_err(|e| format!("GET {path}: {}", super::wire::describe(&e)))
    }

    async fn probe_ollama(&self) -> Result<(), String> {
        if self.config.models.is_empty() {
            let tags = self.get_json("/api/tags").await?;
            let models = tags["models"]
                .as_array()
                .map(|all| all.iter().filter_map(tag_facts).collect())
                .unwrap_or_default();
            let models = self.named(models);
            lock(&self.state).models = models;
        }
        let ps = self.get_json("/api/ps").await?;
        let loaded = ps["models"]
            .as_array()
            .map(|all| all.iter().filter_map(peer_load).collect())
            .unwrap_or_default();
        lock(&self.state).loaded = loaded;
        Ok(())
    }

    async fn probe_openai(&self) -> Result<(), String> {
        let list = self.get_json("/v1/models").await?;
        if self.config.models.is_empty() {
            let models = list["data"]
                .as_array()
                .map(|all| {
                    all.iter()
                        .filter_map(|m| m["id"].as_str())
                        .map(|id| (id.to_string(), facts_unknown()))
                        .collect()
                })
                .unwrap_or_default();
            let models = self.named(models);
            lock(&self.state).models = models;
        }
        Ok(())
    }
}

/// A request in flight on a node; counted in its outstanding requests
/// until dropped.
pub struct InFlight(std::sync::Arc<Node>);

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.outstanding.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Facts of a model only known by name (an `openai` upstream's, or one
/// configured by hand).
fn facts_unknown() -> ModelFacts {
    ModelFacts {
        family: String::new(),
        parameter_size: String::new(),
        quantization: String::new(),
        context_length: None,
        template: String::new(),
        capabilities: vec!["completion".into()],
        model_info: Map::new(),
        size_bytes: 0,
        modified: SystemTime::UNIX_EPOCH,
        digest: String::new(),
    }
}

/// One entry of an `/api/tags` answer: its name and facts.
fn tag_facts(tag: &Value) -> Option<(String, ModelFacts)> {
    let name = tag["name"].as_str().or_else(|| tag["model"].as_str())?;
    let details = &tag["details"];
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let modified = tag["modified_at"]
        .as_str()
        .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map(SystemTime::from)
        .unwrap_or(SystemTime::UNIX_EPOCH);
    Some((
        name.to_string(),
        ModelFacts {
            family: text(&details["family"]),
            parameter_size: text(&details["parameter_size"]),
            quantization: text(&details["quantization_level"]),
            size_bytes: tag["size"].as_u64().unwrap_or(0),
            digest: text(&tag["digest"]),
            modified,
            ..facts_unknown()
        },
    ))
}

/// One entry of an `/api/ps` answer: the lower-case name and its load.
fn peer_load(model: &Value) -> Option<(String, PeerLoad)> {
    let name = model["name"].as_str().or_else(|| model["model"].as_str())?;
    let key = ModelName::parse(name, "model").ok()?.key;
    let count = |v: &Value| v.as_u64().unwrap_or(0) as usize;
    Some((
        key,
        PeerLoad {
            active: count(&model["slots"]["active"]),
            queued: count(&model["slots"]["queued"]),
            context_length: model["context_length"].as_u64().unwrap_or(0) as u32,
            size_bytes: model["size"].as_u64().unwrap_or(0),
            size_vram_bytes: model["size_vram"].as_u64().unwrap_or(0),
        },
    ))
}

/// Time between probes: `interval` with ±20 % jitter, so that several
/// servers started together do not probe in step.
pub fn jittered(interval: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64,
    );
    let unit = (hasher.finish() % 10_000) as f64 / 10_000.0;
    interval.mul_f64(0.8 + 0.4 * unit)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tags_and_ps_entries_are_read() {
        let (name, facts) = tag_facts(&json!({
            "name": "SmolLM2:latest", "size": 98, "digest": "abc",
            "modified_at": "2026-12-01T10:00:00.000000000Z",
            "details": {"family": "llama", "parameter_size": "135M", "quantization_level": "Q4_1"}
        }))
        .unwrap();
        assert_eq!(name, "SmolLM2:latest");
        assert_eq!(
            (
                facts.family.as_str(),
                facts.quantization.as_str(),
                facts.size_bytes
            ),
            ("llama", "Q4_1", 98)
        );
        let (key, load) = peer_load(&json!({
            "name": "SmolLM2:latest", "size": 7, "size_vram": 0, "context_length": 4096,
            "slots": {"active": 2, "queued": 3, "parallel": 4}
        }))
        .unwrap();
        assert_eq!(key, "smollm2:latest");
        assert_eq!(
            (load.active, load.queued, load.context_length),
            (2, 3, 4096)
        );
    }

    #[test]
    fn jitter_stays_within_a_fifth() {
        for _ in 0..100 {
            let d = jittered(Duration::from_secs(10));
            assert!(
                d >= Duration::from_secs(8) && d <= Duration::from_secs(12),
                "{d:?}"
            );
        }
    }

    #[test]
    fn aliases_add_names_for_the_same_upstream_model() {
        let mut config = super::super::config::from_flag("http://a:1", 1).unwrap();
        config.aliases = vec![(
            ModelName::parse("fast", "alias").unwrap(),
            "llama3.2:3b".into(),
        )];
        config.models = vec!["llama3.2:3b".into()];
        let node = Node::new(config).unwrap();
        let fast = node.find(&ModelName::parse("fast", "m").unwrap()).unwrap();
        assert_eq!(fast.upstream_name, "llama3.2:3b");
        assert!(node
            .find(&ModelName::parse("llama3.2:3b", "m").unwrap())
            .is_some());
        assert!(node
            .find(&ModelName::parse("other", "m").unwrap())
            .is_none());
    }
}
