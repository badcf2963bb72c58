//! The pool behind [`Models`]: a name is looked up among the models served
//! here first, then among the upstreams' ([`super::upstream`]), and one
//! listing merges both (a local model hides a remote one of its name).
use std::collections::HashMap;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::FutureExt as _;

use super::registry::{NamedModel, Registry};
use super::upstream::{self, node::PeerLoad, node::RemoteModel};
use super::LoadedBackend;
use crate::core::backend::{BackendStatus, MemoryUse, Residency, TierBytes};
use crate::core::models::{
    BackendLease, Found, LeaseRequest, ListedModel, LocalModel, Models, ModelsError,
    RequestDefaults, RunningModel,
};
use crate::core::validation::ModelName;

impl Models for Registry {
    fn find(&self, name: &ModelName) -> Option<Found> {
        if let Some(remote) = upstream::route(self, name) {
            return Some(Found::Remote(upstream::lease(remote)));
        }
        let named = self.resolve(name)?;
        Some(Found::Local(LocalModel {
            chat_template: named.info.chat_template.clone(),
            capabilities: named.info.capabilities.clone(),
            context_length: named.info.context_length,
            defaults: named
                .created
                .map(|manifest| manifest as Arc<dyn RequestDefaults>),
        }))
    }

    fn lease<'a>(
        &'a self,
        want: LeaseRequest<'a>,
    ) -> BoxFuture<'a, Result<BackendLease, ModelsError>> {
        self.backend_with_context(want.requested, want.name, want.keep_alive, want.context)
            .boxed()
    }

    fn unload(&self, name: &ModelName) {
        Registry::unload(self, name);
    }

    fn default_max_tokens(&self) -> u32 {
        self.settings().default_max_tokens
    }

    fn list(&self) -> Vec<ListedModel> {
        let local = Registry::list(self)
            .into_iter()
            .map(|named| self.listed_here(named));
        let remote = upstream::listed(self).into_iter().map(listed_remote);
        local.chain(remote).collect()
    }

    fn describe(&self, name: &ModelName) -> Option<ListedModel> {
        if let Some(named) = self.resolve(name) {
            return Some(self.listed_here(named));
        }
        upstream::listed(self)
            .into_iter()
            .find(|m| m.name.key == name.key)
            .map(listed_remote)
    }

    fn loaded(&self) -> Vec<RunningModel> {
        let remote = upstream::loaded_elsewhere(self)
            .into_iter()
            .map(|(node, model, load)| running_remote(node, model, load));
        // Each load under the name its latest request asked for (a created
        // model shares its base's load), as Ollama lists the model in use.
        let mut asked: HashMap<u64, String> = self
            .loaded()
            .into_iter()
            .map(|model| (model.id, model.asked_as()))
            .collect();
        self.loaded_backends()
            .into_iter()
            .map(|mut model| {
                if let Some(name) = asked.remove(&model.id) {
                    model.name = name;
                }
                running_here(model)
            })
            .chain(remote)
            .collect()
    }
}

impl Registry {
    /// A model served here, as the lists show it.
    fn listed_here(&self, named: NamedModel) -> ListedModel {
        ListedModel {
            facts: named.facts(),
            context_length: self.served_context(&named),
            unavailable: self.unfit_reason_of(&named),
            from: named.source.to_string(),
            name: named.name,
        }
    }
}

/// A model an upstream serves, with the context its `/api/tags` or
/// `/v1/models` says (0 when it says none).
fn listed_remote(remote: RemoteModel) -> ListedModel {
    ListedModel {
        context_length: remote
            .facts
            .context_length
            .map_or(0, |n| n.min(u64::from(u32::MAX)) as u32),
        unavailable: None,
        from: format!("an upstream server's {}", remote.upstream_name),
        name: remote.name.display,
        facts: remote.facts,
    }
}

/// A model loaded here, from its backend's memory, status and facts.
pub fn running_here(m: LoadedBackend) -> RunningModel {
    let memory = m.backend.memory();
    RunningModel {
        name: m.name,
        facts: m.backend.facts(),
        expires_at: m.expires_at,
        size_bytes: memory.tier_bytes.gpu + memory.tier_bytes.ram,
        memory,
        status: m.backend.status(),
        node: None,
    }
}

/// A model loaded on the upstream `node`, from what its `/api/ps` says.
fn running_remote(node: String, model: RemoteModel, load: PeerLoad) -> RunningModel {
    RunningModel {
        name: model.name.display,
        facts: model.facts,
        expires_at: None,
        size_bytes: load.size_bytes,
        memory: MemoryUse {
            residency: Residency::Full,
            tier_bytes: TierBytes {
                gpu: load.size_vram_bytes,
                ram: load.size_bytes.saturating_sub(load.size_vram_bytes),
                stream: 0,
            },
        },
        status: BackendStatus {
            context_length: load.context_length,
            active: load.active,
            queued: load.queued,
            parallel: 0,
            decode_tokens_per_second: None,
        },
        node: Some(node),
    }
}
