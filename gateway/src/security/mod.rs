//! Who may drive the API and what a pull may touch: safe by default on a
//! shared machine whose users browse the web.
//!
//! - [`origin`]: CORS and the `Origin` / `Host` checks (web pages and DNS
//!   rebinding, Ollama's CVE-2024-28224).
//! - [`guard`]: the middleware that applies them and the keys, each route's
//!   class read from the route table ([`crate::api::routes`]).
//! - [`roots`]: the local files `/api/pull` may serve (the model roots).
//! - [`remote`]: the URLs `/api/pull` may download (allowed hosts, no
//!   private addresses, no redirects elsewhere, a size cap, the GGUF header).
//!
//! Built once at start-up from the `[server]` keys and flags
//! ([`SecuritySettings`]) and the address the server binds; the keys
//! ([`Keys`]) are read again on SIGHUP.
pub mod guard;
pub mod origin;
pub mod remote;
pub mod roots;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, PoisonError, RwLock};

pub use origin::OriginPolicy;
pub use remote::PullPolicy;
pub use roots::ModelRoots;

/// Everything the request guards and `/api/pull` check.
#[derive(Debug)]
pub struct Security {
    pub origins: OriginPolicy,
    /// The API key and the admin key.
    pub keys: Keys,
    /// The server binds a non-loopback address: a key is required (unless
    /// `insecure_no_auth`), on reload too.
    lan_needs_key: bool,
    /// A keys file with named keys guards every route (they are checked
    /// by [`guard::auth`]), so a LAN bind needs no API or admin key besides.
    keys_file_guards: bool,
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
    /// non-loopback address needs a key unless `insecure_no_auth`: an API
    /// or admin key, or a keys file holding at least one key (`named_keys`:
    /// how many its entries are, `None` without a keys file). A keys file
    /// goes on guarding every route when it is read again, even emptied
    /// (then every request is refused: it never opens the server).
    pub fn new(
        settings: SecuritySettings,
        bind: SocketAddr,
        named_keys: Option<usize>,
    ) -> anyhow::Result<Security> {
        let loopback = bind.ip().is_loopback();
        let lan_needs_key = !loopback && !settings.insecure_no_auth;
        let keys_file_guards = named_keys.is_some_and(|n| n > 0);
        let keys = KeyPair::checked(
            settings.api_key,
            settings.admin_key,
            lan_needs_key && !keys_file_guards,
        )
        .map_err(|e| {
            let e = e.replace("{ip}", &bind.ip().to_string());
            match named_keys {
                Some(0) => anyhow::anyhow!("{e} (the keys file holds no key)"),
                _ => anyhow::anyhow!(e),
            }
        })?;
        let roots = if settings.model_roots.is_empty() {
            settings.default_roots
        } else {
            settings.model_roots
        };
        Ok(Security {
            origins: OriginPolicy::new(settings.allowed_origins, settings.allowed_hosts, bind.ip()),
            keys: Keys::new(keys),
            lan_needs_key,
            keys_file_guards,
            roots: ModelRoots::new(&roots),
            pull: PullPolicy::new(
                settings.pull_hosts,
                settings.pull_allow_private,
                settings.pull_max_bytes,
            ),
        })
    }

    /// Whether the server binds a non-loopback address and must not serve
    /// it without a key.
    pub fn lan_needs_key(&self) -> bool {
        self.lan_needs_key
    }

    /// Replaces the keys (a configuration read again), checked as at
    /// start; on an error the keys in use stay. Whether they changed.
    pub fn reload_keys(&self, api: Option<String>, admin: Option<String>) -> Result<bool, String> {
        let keys = KeyPair::checked(api, admin, self.lan_needs_key && !self.keys_file_guards)
            .map_err(|e| e.replace("{ip}", "a non-loopback address"))?;
        Ok(self.keys.replace(keys))
    }

    /// Open to local pages and loopback hosts only, no admin key, no model
    /// roots: what a server with default settings on 127.0.0.1 does.
    pub fn local_default() -> Security {
        Security {
            origins: OriginPolicy::new(
                Vec::new(),
                Vec::new(),
                std::net::Ipv4Addr::LOCALHOST.into(),
            ),
            keys: Keys::new(KeyPair::default()),
            lan_needs_key: false,
            keys_file_guards: false,
            roots: ModelRoots::new(&[]),
            pull: PullPolicy::new(Vec::new(), false, None),
        }
    }
}

/// The keys in use, replaced whole when the configuration is read again.
#[derive(Debug)]
pub struct Keys(RwLock<KeyPair>);

/// The API key (every route but the open ones) and the admin key (the
/// routes that add or remove models; it opens every route).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyPair {
    pub api: Option<Arc<str>>,
    pub admin: Option<Arc<str>>,
}

impl Keys {
    pub fn new(keys: KeyPair) -> Keys {
        Keys(RwLock::new(keys))
    }

    /// The keys now.
    pub fn get(&self) -> KeyPair {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Whether `keys` differ from those it replaced.
    fn replace(&self, keys: KeyPair) -> bool {
        let mut current = self.0.write().unwrap_or_else(PoisonError::into_inner);
        let changed = *current != keys;
        *current = keys;
        changed
    }
}

impl KeyPair {
    /// The keys as given: empty is none; blank or padded with whitespace is
    /// an error (a client's key is trimmed, so it could never match); a LAN
    /// bind needs one (`{ip}` in the message stands for its address).
    fn checked(
        api: Option<String>,
        admin: Option<String>,
        lan_needs_key: bool,
    ) -> Result<KeyPair, String> {
        let key = |flag: &str, key: Option<String>| -> Result<Option<Arc<str>>, String> {
            match key.filter(|k| !k.is_empty()) {
                Some(k) if k.trim() != k => Err(format!(
                    "the {flag} is blank or begins or ends with whitespace, so no client could \
                     send it: give a key without surrounding spaces"
                )),
                k => Ok(k.map(Arc::from)),
            }
        };
        let keys = KeyPair {
            api: key(
                "API key (--api-key, HYPURA_API_KEY or [server] api_key)",
                api,
            )?,
            admin: key("admin key (--admin-key or [server] admin_key)", admin)?,
        };
        if lan_needs_key && keys.api.is_none() && keys.admin.is_none() {
            return Err(
                "listening on {ip} (not a loopback address) lets anyone on the network use every \
                 model: give an API key (--api-key, HYPURA_API_KEY or [server] api_key) or a \
                 keys file with at least one key (--keys-file or [server] keys_file, `hypura \
                 keys add`), or --insecure-no-auth to serve without one"
                    .into(),
            );
        }
        Ok(keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lan_address_needs_a_key() {
        let lan: SocketAddr = "0.0.0.0:11434".parse().unwrap();
        let err = Security::new(SecuritySettings::default(), lan, None).unwrap_err();
        assert!(err.to_string().contains("--insecure-no-auth"), "{err}");
        let keyed = SecuritySettings {
            api_key: Some("k".into()),
            ..SecuritySettings::default()
        };
        assert!(Security::new(keyed, lan, None).is_ok());
        let insecure = SecuritySettings {
            insecure_no_auth: true,
            ..SecuritySettings::default()
        };
        assert!(Security::new(insecure, lan, None).is_ok());
        let local: SocketAddr = "127.0.0.1:0".parse().unwrap();
        assert!(Security::new(SecuritySettings::default(), local, None).is_ok());
        let v6: SocketAddr = "[::1]:0".parse().unwrap();
        assert!(Security::new(SecuritySettings::default(), v6, None).is_ok());
    }

    #[test]
    fn a_keys_file_with_a_key_guards_a_lan_address() {
        let lan: SocketAddr = "0.0.0.0:11434".parse().unwrap();
        let security = Security::new(SecuritySettings::default(), lan, Some(1)).unwrap();
        assert!(security.lan_needs_key());
        // Its reload may leave the API and admin keys unset.
        assert_eq!(security.reload_keys(None, None), Ok(false));
        // An empty keys file guards nothing: still refused.
        let err = Security::new(SecuritySettings::default(), lan, Some(0)).unwrap_err();
        let err = err.to_string();
        assert!(
            err.contains("--keys-file") && err.ends_with("(the keys file holds no key)"),
            "{err}"
        );
    }

    #[test]
    fn blank_keys_are_refused_and_keys_reload() {
        let local: SocketAddr = "127.0.0.1:0".parse().unwrap();
        for blank in [" ", "k ", "\tk"] {
            let settings = SecuritySettings {
                api_key: Some(blank.into()),
                ..SecuritySettings::default()
            };
            let err = Security::new(settings, local, None)
                .unwrap_err()
                .to_string();
            assert!(err.contains("whitespace"), "{err}");
        }
        let lan: SocketAddr = "0.0.0.0:11434".parse().unwrap();
        let security = Security::new(
            SecuritySettings {
                api_key: Some("k".into()),
                ..SecuritySettings::default()
            },
            lan,
            None,
        )
        .unwrap();
        assert_eq!(security.keys.get().api.as_deref(), Some("k"));
        assert_eq!(security.reload_keys(Some("k".into()), None), Ok(false));
        assert_eq!(security.reload_keys(Some("k2".into()), None), Ok(true));
        assert_eq!(security.keys.get().api.as_deref(), Some("k2"));
        // A reload cannot leave a LAN bind without a key, nor blank one.
        assert!(security.reload_keys(None, None).is_err());
        assert!(security.reload_keys(Some(" ".into()), None).is_err());
        assert_eq!(security.keys.get().api.as_deref(), Some("k2"));
    }
}
