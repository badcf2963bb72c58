//! Who may drive the API and what a pull may touch: safe by default on a
//! shared machine whose users browse the web.
//!
//! - [`origin`]: CORS and the `Origin` / `Host` checks (web pages and DNS
//!   rebinding, Ollama's CVE-2024-28224), and the admin key's routes.
//! - [`roots`]: the local files `/api/pull` may serve (the model roots).
//! - [`remote`]: the URLs `/api/pull` may download (allowed hosts, no
//!   private addresses, no redirects elsewhere, a size cap, the GGUF header).
//!
//! Built once at start-up from the `[server]` keys and flags
//! ([`SecuritySettings`]) and the address the server binds.
pub mod origin;
pub mod remote;
pub mod roots;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::bail;

pub use origin::OriginPolicy;
pub use remote::PullPolicy;
pub use roots::ModelRoots;

/// Everything the request guards and `/api/pull` check.
#[derive(Debug)]
pub struct Security {
    pub origins: OriginPolicy,
    /// When set, `/api/pull`, `/api/create`, `/api/copy` and `/api/delete`
    /// need `Authorization: Bearer <admin key>`; the API key is not enough.
    pub admin_key: Option<Arc<str>>,
    pub roots: ModelRoots,
    pub pull: PullPolicy,
}

/// The settings as given (file and flags merged), before they are checked.
#[derive(Debug, Default, Clone)]
pub struct SecuritySettings {
    /// Origins besides the local ones whose pages may call the API
    /// (`https://app.example`, `https://*.example`, `*` for any).
    pub allowed_origins: Vec<String>,
    /// `Host` names besides the loopback ones the server answers to
    /// (`*` for any); setting it turns the check on whatever the address.
    pub allowed_hosts: Vec<String>,
    pub api_key: Option<String>,
    pub admin_key: Option<String>,
    /// Serve a non-loopback address without an API key.
    pub insecure_no_auth: bool,
    /// Directories (or files) `/api/pull` may serve from; empty: the
    /// defaults (`default_roots`).
    pub model_roots: Vec<PathBuf>,
    /// The models directory and the paths given at start.
    pub default_roots: Vec<PathBuf>,
    /// Host names `/api/pull` may download from (`*.example` wildcards,
    /// `*` for any public host); empty: Hugging Face's.
    pub pull_hosts: Vec<String>,
    /// Let pulls reach loopback, private and link-local addresses.
    pub pull_allow_private: bool,
    /// Largest download, in bytes; `None`: [`remote::DEFAULT_PULL_MAX_BYTES`].
    pub pull_max_bytes: Option<u64>,
}

impl Security {
    /// Checks the settings against the address the server binds: a
    /// non-loopback address needs an API key unless `insecure_no_auth`.
    pub fn new(settings: SecuritySettings, bind: SocketAddr) -> anyhow::Result<Security> {
        let has_key = settings.api_key.as_deref().is_some_and(|k| !k.is_empty())
            || settings.admin_key.as_deref().is_some_and(|k| !k.is_empty());
        let loopback = bind.ip().is_loopback();
        if !loopback && !has_key && !settings.insecure_no_auth {
            bail!(
                "listening on {} (not a loopback address) lets anyone on the network use every \
                 model: give an API key (--api-key, HYPURA_API_KEY or [server] api_key), or \
                 --insecure-no-auth to serve without one",
                bind.ip()
            );
        }
        let admin_key = settings.admin_key.filter(|k| !k.is_empty()).map(Arc::from);
        let roots = if settings.model_roots.is_empty() {
            settings.default_roots
        } else {
            settings.model_roots
        };
        Ok(Security {
            origins: OriginPolicy::new(settings.allowed_origins, settings.allowed_hosts, loopback),
            admin_key,
            roots: ModelRoots::new(&roots),
            pull: PullPolicy::new(
                settings.pull_hosts,
                settings.pull_allow_private,
                settings.pull_max_bytes,
            ),
        })
    }

    /// Open to local pages and loopback hosts only, no admin key, no model
    /// roots: what a server with default settings on 127.0.0.1 does.
    pub fn local_default() -> Security {
        Security {
            origins: OriginPolicy::new(Vec::new(), Vec::new(), true),
            admin_key: None,
            roots: ModelRoots::new(&[]),
            pull: PullPolicy::new(Vec::new(), false, None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lan_address_needs_a_key() {
        let lan: SocketAddr = "0.0.0.0:11434".parse().unwrap();
        let err = Security::new(SecuritySettings::default(), lan).unwrap_err();
        assert!(err.to_string().contains("--insecure-no-auth"), "{err}");
        let keyed = SecuritySettings {
            api_key: Some("k".into()),
            ..SecuritySettings::default()
        };
        assert!(Security::new(keyed, lan).is_ok());
        let insecure = SecuritySettings {
            insecure_no_auth: true,
            ..SecuritySettings::default()
        };
        assert!(Security::new(insecure, lan).is_ok());
        let local: SocketAddr = "127.0.0.1:0".parse().unwrap();
        assert!(Security::new(SecuritySettings::default(), local).is_ok());
        let v6: SocketAddr = "[::1]:0".parse().unwrap();
        assert!(Security::new(SecuritySettings::default(), v6).is_ok());
    }
}
