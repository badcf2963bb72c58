//! [`RemoteBackend`]: a model on other servers behind [`ModelBackend`].
//!
//! It holds the nodes that serve the model, best first ([`super::Upstreams::route`]).
//! A generation is sent to the first; until its first byte arrives, a
//! failure (no connection, a 5xx, no byte within the first-byte timeout)
//! puts that node in cooldown and the next one is tried. Once bytes flow
//! they are passed on as they come, piece by piece; a failure then ends the
//! stream with an error event (the client has its first bytes already).
//! Dropping the stream drops the HTTP response, which closes the
//! connection: the upstream sees the client gone and stops generating.
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use futures_util::{stream, FutureExt, StreamExt};

use super::node::{Failure, InFlight, Node, PeerLoad};
use super::wire;
use crate::core::backend::{
    BackendError, BackendEvent, BackendStatus, EmbedOutput, EventStream, MemoryUse, ModelBackend,
    ModelFacts, Residency, TierBytes,
};
use crate::core::request::{BackendRequest, EmbedBatch};
use crate::core::validation::ModelName;
use crate::metrics::upstream as metrics;

/// Context assumed for a model whose upstream states none, in tokens: the
/// upstream checks the prompt itself.
const UNKNOWN_CONTEXT: u32 = 1 << 20;

/// A model served by upstreams, with the nodes to try in order.
pub struct RemoteBackend {
    model: ModelName,
    nodes: Vec<Arc<Node>>,
    facts: ModelFacts,
    /// What the first node's `/api/ps` said of it.
    load: Option<PeerLoad>,
}

impl RemoteBackend {
    /// `nodes` all serve `model`, best first (at least one).
    pub fn new(model: ModelName, nodes: Vec<Arc<Node>>) -> Option<RemoteBackend> {
        let first = nodes.first()?.find(&model)?;
        let load = nodes[0].load_of(&first.upstream_name);
        Some(RemoteBackend {
            model,
            facts: first.facts,
            load,
            nodes,
        })
    }

    /// The nodes it tries, in order.
    pub fn node_names(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.name().to_string()).collect()
    }

    /// Whether the first choice has the model loaded (`/api/ps`).
    pub fn first_is_resident(&self) -> bool {
        self.load.is_some()
    }

    /// Tries each node in turn with `attempt` until one answers; a node
    /// that failed is put in cooldown. The error of the last, otherwise.
    async fn each_node<T, F>(&self, mut attempt: F) -> Result<T, BackendError>
    where
        F: FnMut(Arc<Node>, String) -> BoxFuture<'static, Result<T, Failure>>,
    {
        let mut last = None;
        for node in &self.nodes {
            let Some(model) = node.find(&self.model) else {
                continue;
            };
            let started = Instant::now();
            metrics::request(node.name());
            match attempt(Arc::clone(node), model.upstream_name).await {
                Ok(value) => {
                    metrics::first_byte(node.name(), started.elapsed());
                    return Ok(value);
                }
                Err(Failure::Refused(e)) => return Err(e),
                Err(Failure::Node(why)) => {
                    metrics::error(node.name());
                    node.cool_down(&why);
                    last = Some(format!("{}: {why}", node.name()));
                }
                Err(Failure::Missing(why)) => {
                    tracing::warn!(upstream = node.name(), "{why}");
                    last = Some(format!("{}: {why}", node.name()));
                }
            }
        }
        Err(BackendError::Failed(format!(
            "no upstream server serving model '{}' answered ({})",
            self.model.display,
            last.unwrap_or_else(|| "none has it now".into())
        )))
    }
}

/// Sends `body` to `path` on `node` and waits for the reply's status.
/// 4xx other than 404 is the client's error and final; the rest fail the node.
async fn send(
    node: &Node,
    path: &str,
    body: &serde_json::Value,
    timeout: Duration,
) -> Result<reqwest::Response, Failure> {
    let response = tokio::time::timeout(
        timeout,
        node.request(reqwest::Method::POST, path).json(body).send(),
    )
    .await
    .map_err(|_| Failure::Node(format!("no answer within {timeout:?}")))?
    .map_err(|e| Failure::Node(wire::describe(&e)))?;
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let bytes = response.bytes().await.unwrap_or_default();
    let message = wire::error_message(&bytes).unwrap_or_else(|| format!("status {status}"));
    Err(match status {
        reqwest::StatusCode::NOT_FOUND => Failure::Missing(message),
        reqwest::StatusCode::BAD_REQUEST => Failure::Refused(BackendError::Invalid(message)),
        _ => Failure::Node(format!("{message} (status {})", status.as_u16())),
    })
}

/// Sends a generation to one node and waits for the first bytes of its
/// reply, within the node's first-byte timeout.
async fn start_on(
    node: Arc<Node>,
    upstream_model: String,
    request: BackendRequest,
) -> Result<EventStream, Failure> {
    let (path, body) = wire::generate_body(node.config.kind, &upstream_model, &request)
        .map_err(Failure::Refused)?;
    let in_flight = node.begin();
    let sent = Instant::now();
    let timeout = node.config.first_byte_timeout;
    let mut response = send(&node, path, &body, timeout).await?;
    let left = timeout.saturating_sub(sent.elapsed());
    let first = match tokio::time::timeout(left, response.chunk()).await {
        Err(_) => return Err(Failure::Node(format!("no first byte within {timeout:?}"))),
        Ok(Err(e)) => return Err(Failure::Node(wire::describe(&e))),
        Ok(Ok(None)) => return Err(Failure::Node("an empty reply".into())),
        Ok(Ok(Some(bytes))) => bytes,
    };
    let mut reader = wire::Reader::new(node.config.kind, sent);
    let events = reader.feed(&first);
    Ok(passed_on(response, reader, events, node, in_flight))
}

/// The events of a reply whose first bytes gave `first`: the rest read as
/// it arrives. A failure ends it with an error event and cools the node.
fn passed_on(
    response: reqwest::Response,
    reader: wire::Reader,
    first: Vec<BackendEvent>,
    node: Arc<Node>,
    in_flight: InFlight,
) -> EventStream {
    struct Reading {
        response: reqwest::Response,
        reader: wire::Reader,
        node: Arc<Node>,
        _in_flight: InFlight,
    }
    let state = Reading {
        response,
        reader,
        node,
        _in_flight: in_flight,
    };
    let rest = stream::unfold(Some(state), |state| async move {
        let mut state = state?;
        if state.reader.ended() {
            return None;
        }
        let broken = match state.response.chunk().await {
            Ok(Some(bytes)) => Ok(state.reader.feed(&bytes)),
            Ok(None) => {
                let events = state.reader.end();
                match state.reader.ended() {
                    true => Ok(events),
                    false => Err("it closed the connection".to_string()),
                }
            }
            Err(e) => Err(wire::describe(&e)),
        };
        let events = broken.unwrap_or_else(|why| {
            state.node.cool_down(&why);
            metrics::error(state.node.name());
            vec![BackendEvent::Error(BackendError::Failed(format!(
                "the upstream server {} stopped in the middle of the reply: {why}",
                state.node.name()
            )))]
        });
        let failed = events.iter().any(|e| matches!(e, BackendEvent::Error(_)));
        Some((stream::iter(events), (!failed).then_some(state)))
    })
    .flatten();
    stream::iter(first).chain(rest).boxed()
}

/// Sends an embedding request to one node.
async fn embed_on(
    node: Arc<Node>,
    upstream_model: String,
    batch: EmbedBatch,
) -> Result<EmbedOutput, Failure> {
    let (path, body) = wire::embed_body(node.config.kind, &upstream_model, &batch);
    let _in_flight = node.begin();
    let timeout = node.config.first_byte_timeout;
    let response = send(&node, path, &body, timeout).await?;
    let reply: serde_json::Value = tokio::time::timeout(timeout, response.json())
        .await
        .map_err(|_| Failure::Node(format!("no whole reply within {timeout:?}")))?
        .map_err(|e| Failure::Node(wire::describe(&e)))?;
    wire::embed_output(node.config.kind, &reply).map_err(Failure::Node)
}

impl ModelBackend for RemoteBackend {
    fn generate(
        &self,
        request: BackendRequest,
    ) -> BoxFuture<'_, Result<EventStream, BackendError>> {
        async move {
            let attempt = |node, model| start_on(node, model, request.clone()).boxed();
            self.each_node(attempt).await
        }
        .boxed()
    }

    fn embed(&self, batch: EmbedBatch) -> BoxFuture<'_, Result<EmbedOutput, BackendError>> {
        async move {
            let attempt = |node, model| embed_on(node, model, batch.clone()).boxed();
            self.each_node(attempt).await
        }
        .boxed()
    }

    fn counts_tokens(&self) -> bool {
        false
    }

    fn count_tokens(&self, _text: &str) -> Result<usize, BackendError> {
        Err(BackendError::Invalid(format!(
            "model '{}' is served by another server: its tokens are not counted here",
            self.model.display
        )))
    }

    fn status(&self) -> BackendStatus {
        let context = self
            .load
            .map(|l| l.context_length)
            .filter(|&n| n > 0)
            .or(self
                .facts
                .context_length
                .map(|n| n.min(u32::MAX as u64) as u32))
            .unwrap_or(UNKNOWN_CONTEXT);
        BackendStatus {
            context_length: context,
            active: self.load.map_or(0, |l| l.active),
            queued: self.load.map_or(0, |l| l.queued),
            parallel: 0,
            decode_tokens_per_second: None,
        }
    }

    fn facts(&self) -> ModelFacts {
        self.facts.clone()
    }

    fn memory(&self) -> MemoryUse {
        let load = self.load.unwrap_or_default();
        MemoryUse {
            residency: if self.load.is_some() {
                Residency::Full
            } else {
                Residency::Unloaded
            },
            tier_bytes: TierBytes {
                gpu: load.size_vram_bytes,
                ram: load.size_bytes.saturating_sub(load.size_vram_bytes),
                stream: 0,
            },
        }
    }

    fn set_residency(&self, _level: Residency) -> Result<(), BackendError> {
        Ok(())
    }
}
