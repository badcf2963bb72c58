//! What every handler can reach: [`AppState`].
use std::sync::Arc;

use crate::core::infer::Inference;
use crate::pool::registry::Registry;

/// What every handler can reach.
#[derive(Clone)]
pub struct AppState {
    /// The pool: names, loaded models, the budget, the upstreams.
    pub registry: Arc<Registry>,
    /// The one inference path's view of the pool ([`crate::core::models::Models`])
    /// and the metrics and traces it feeds.
    pub inference: Inference,
    /// Where `/api/pull` saves downloaded models (`None`: no directory could
    /// be found; pulling URLs then fails with a message that says how to set one).
    pub models_dir: Option<Arc<std::path::Path>>,
    /// `/metrics` answers loopback clients without the API key (a local
    /// Prometheus); others still need it.
    pub metrics_open_on_loopback: bool,
    /// Origins, hosts, the keys (an API key set: every route but `/`,
    /// `/api/version` and the docs needs `Authorization: Bearer <key>`) and
    /// what pulls may touch.
    pub security: Arc<crate::security::Security>,
    /// Named keys, their limits and usage, the models' fair queues
    /// (`--parallel` slots each unless the server sets its own).
    pub tenancy: Arc<crate::tenancy::Tenancy>,
}

impl AppState {
    /// The state of a server over `registry`, its requests observed by the
    /// metrics and traces ([`crate::telemetry::observer::Recorder`]).
    pub fn new(
        registry: Arc<Registry>,
        models_dir: Option<Arc<std::path::Path>>,
        metrics_open_on_loopback: bool,
        security: Arc<crate::security::Security>,
    ) -> AppState {
        let inference = Inference {
            models: Arc::clone(&registry) as Arc<dyn crate::core::models::Models>,
            observer: Arc::new(crate::telemetry::observer::Recorder),
        };
        let settings = registry.settings();
        let tenancy =
            crate::tenancy::Tenancy::new(settings.n_parallel as usize, settings.queue_limit);
        AppState {
            tenancy: Arc::new(tenancy),
            registry,
            inference,
            models_dir,
            metrics_open_on_loopback,
            security,
        }
    }
}
