//! Upstreams: other servers (hypura peers, Ollama, OpenAI-compatible
//! engines such as vLLM or llama-server) this one routes models to over
//! HTTP, so that clients keep one address and one model list.
//!
//! - [`config`]: `[[upstreams]]` and `--upstream URL`, checked.
//! - [`node`]: one upstream: its client, models, probe results, cooldown.
//! - [`wire`]: requests and streamed replies in the upstream's own API.
//! - [`backend`]: [`backend::RemoteBackend`], a model on upstreams behind
//!   [`crate::core::backend::ModelBackend`], with failover before the first byte.
//!
//! Routing ([`route`]): a model served here goes to the local engine unless
//! its queue is full and an upstream has it loaded. Otherwise the nodes
//! that have it are tried best first: nodes available (probe answering, no
//! cooldown) before the others; among them, those whose `/api/ps` shows the
//! model loaded, by queue (their queued requests plus ours in flight there);
//! then the rest by requests in flight here per unit of weight.
pub mod backend;
pub mod config;
pub mod node;
pub mod wire;

use std::sync::Arc;
use std::time::{Duration, Instant};

use backend::RemoteBackend;
use config::UpstreamConfig;
use node::{Node, PeerLoad, RemoteModel};

use crate::core::models::BackendLease;
use crate::core::validation::ModelName;
use crate::pool::registry::Registry;

/// The header a front sends with every request to an upstream. A hypura
/// receiving it serves and lists only its own models, so that fronts
/// pointing at each other never pass a request round in circles.
pub const HOP_HEADER: &str = "x-hypura-upstream-hop";

tokio::task_local! {
    /// Whether the request being handled came from another front.
    static FROM_A_FRONT: bool;
}

/// Middleware: notes whether the request came from another front ([`HOP_HEADER`]).
pub async fn hop_guard(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let from_a_front = request.headers().contains_key(HOP_HEADER);
    FROM_A_FRONT.scope(from_a_front, next.run(request)).await
}

/// The upstreams to use for the request being handled: none for a request
/// that came from another front.
fn upstreams_of(pool: &Registry) -> Option<&Arc<Upstreams>> {
    let from_a_front = FROM_A_FRONT.try_with(|v| *v).unwrap_or(false);
    pool.upstreams().filter(|_| !from_a_front)
}

/// Every upstream, in the order configured (the order breaks ties).
pub struct Upstreams {
    nodes: Vec<Arc<Node>>,
}

impl Upstreams {
    pub fn new(configs: Vec<UpstreamConfig>) -> Result<Upstreams, String> {
        let nodes = configs
            .into_iter()
            .map(|c| Node::new(c).map(Arc::new))
            .collect::<Result<_, _>>()?;
        Ok(Upstreams { nodes })
    }

    pub fn nodes(&self) -> &[Arc<Node>] {
        &self.nodes
    }

    /// Probes every node now, then again every probe interval (jittered),
    /// on the current tokio runtime, for as long as it runs.
    pub fn start_probes(&self) {
        for node in &self.nodes {
            let node = Arc::clone(node);
            tokio::spawn(async move {
                loop {
                    node.probe().await;
                    tokio::time::sleep(node::jittered(node.config.probe_interval)).await;
                }
            });
        }
    }

    /// Waits (up to `timeout`) until every node answered a probe or failed
    /// one, so that the first requests find the discovered models.
    pub async fn first_probes(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        for node in &self.nodes {
            let left = deadline.saturating_duration_since(Instant::now());
            let _ = tokio::time::timeout(left, node.probe()).await;
        }
    }

    /// The backend for `name` over the nodes that serve it, best first
    /// (`None`: no node serves it).
    pub fn route(&self, name: &ModelName) -> Option<RemoteBackend> {
        let mut ranked: Vec<(Rank, Arc<Node>)> = self
            .nodes
            .iter()
            .filter_map(|node| {
                let model = node.find(name)?;
                Some((rank(node, &model.upstream_name), Arc::clone(node)))
            })
            .collect();
        // Stable: equal ranks keep the configured order.
        ranked.sort_by(|a, b| a.0.partial_cmp(&b.0).unwrap_or(std::cmp::Ordering::Equal));
        RemoteBackend::new(name.clone(), ranked.into_iter().map(|(_, n)| n).collect())
    }

    /// Every model the upstreams serve, once each (the first node's facts),
    /// sorted by name.
    pub fn models(&self) -> Vec<RemoteModel> {
        let mut all: Vec<RemoteModel> = Vec::new();
        for model in self.nodes.iter().flat_map(|n| n.models()) {
            if !all.iter().any(|m| m.name.key == model.name.key) {
                all.push(model);
            }
        }
        all.sort_by(|a, b| a.name.display.cmp(&b.name.display));
        all
    }

    /// The models loaded on each Ollama-speaking upstream (its `/api/ps`).
    pub fn loaded(&self) -> Vec<(String, RemoteModel, PeerLoad)> {
        self.nodes
            .iter()
            .flat_map(|node| {
                node.loaded()
                    .into_iter()
                    .map(|(model, load)| (node.name().to_string(), model, load))
            })
            .collect()
    }
}

/// A node's place for a model; lower is better.
#[derive(Debug, PartialEq, PartialOrd)]
struct Rank {
    unavailable: bool,
    not_loaded: bool,
    /// Queued there plus in flight from here, per unit of weight.
    load: f64,
}

fn rank(node: &Node, upstream_model: &str) -> Rank {
    let peer = node.load_of(upstream_model);
    let queued = peer.map_or(0, |p| p.queued);
    Rank {
        unavailable: !node.available(),
        not_loaded: peer.is_none(),
        load: (queued + node.outstanding()) as f64 / f64::from(node.config.weight),
    }
}

/// Where `name` should run: `Some` for upstreams, `None` for this server's
/// own engine (or not found). Local wins unless its queue is full and the
/// best upstream has the model loaded.
pub fn route(pool: &Registry, name: &ModelName) -> Option<RemoteBackend> {
    let remote = upstreams_of(pool)?.route(name)?;
    if pool.resolve(name).is_none() {
        return Some(remote);
    }
    (local_queue_full(pool, name) && remote.first_is_resident()).then_some(remote)
}

fn local_queue_full(pool: &Registry, name: &ModelName) -> bool {
    let limit = pool.settings().queue_limit;
    pool.loaded_backends()
        .iter()
        .find(|m| m.name.to_lowercase() == name.key)
        .is_some_and(|m| m.backend.status().queued >= limit)
}

/// The upstreams' models not served here under the same name (for the
/// model lists: a local model hides a remote one of its name).
pub fn listed(pool: &Registry) -> Vec<RemoteModel> {
    let Some(upstreams) = upstreams_of(pool) else {
        return Vec::new();
    };
    upstreams
        .models()
        .into_iter()
        .filter(|m| pool.resolve(&m.name).is_none())
        .collect()
}

/// The models loaded on the upstreams, by upstream name (for `/api/ps`).
pub fn loaded_elsewhere(pool: &Registry) -> Vec<(String, RemoteModel, PeerLoad)> {
    upstreams_of(pool).map(|u| u.loaded()).unwrap_or_default()
}

/// A lease on a remote model: nothing to load here.
pub fn lease(remote: RemoteBackend) -> BackendLease {
    BackendLease {
        backend: Arc::new(remote),
        load_duration: Duration::ZERO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn upstreams(urls: &[&str], model: &str) -> Upstreams {
        let configs = urls
            .iter()
            .enumerate()
            .map(|(i, url)| {
                let mut c = config::from_flag(url, i + 1).unwrap();
                c.models = vec![model.into()];
                c
            })
            .collect();
        Upstreams::new(configs).unwrap()
    }

    fn order(u: &Upstreams, model: &str) -> Vec<String> {
        let name = ModelName::parse(model, "m").unwrap();
        let backend = u.route(&name).unwrap();
        backend.node_names()
    }

    #[test]
    fn ties_keep_the_configured_order_and_load_moves_requests_away() {
        let u = upstreams(&["http://a:1", "http://b:1"], "m");
        assert_eq!(order(&u, "m"), ["peer1", "peer2"]);
        let _busy = u.nodes()[0].begin();
        assert_eq!(order(&u, "m"), ["peer2", "peer1"]);
    }

    #[test]
    fn a_node_in_cooldown_goes_last() {
        let u = upstreams(&["http://a:1", "http://b:1"], "m");
        u.nodes()[0].cool_down("test");
        assert_eq!(order(&u, "m"), ["peer2", "peer1"]);
    }

    #[test]
    fn unknown_models_route_nowhere() {
        let u = upstreams(&["http://a:1"], "m");
        assert!(u.route(&ModelName::parse("other", "m").unwrap()).is_none());
    }
}
