//! A box many people share: named keys with limits ([`keys`], [`limits`]),
//! a fair queue in front of each model ([`fair`]), usage per user
//! ([`usage`], `GET /api/usage`), and the request-side glue ([`http`]).
//!
//! Identity: a key of the keys file is its entry's name; `--api-key` is the
//! user `api-key`, `--admin-key` the user `admin`; without a key (a server
//! that asks for none) everyone is `anonymous`. A trusted front (an admin
//! key, or any client of a server that asks for no key) may name the user
//! the fair queue sees with `x-gateway-inference-fairness-id`, as the
//! Kubernetes Gateway API Inference Extension does; the metrics keep the
//! key's name.
pub mod fair;
pub mod http;
pub mod keys;
pub mod limits;
pub mod usage;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, SystemTime};

use keys::{KeySet, Role, Tenant};

/// Names of the users that are not in the keys file.
pub const API_KEY_USER: &str = "api-key";
pub const ADMIN_KEY_USER: &str = "admin";
pub const ANONYMOUS_USER: &str = "anonymous";

/// The keys, their windows, the fair queues and who has been seen.
pub struct Tenancy {
    keys_file: Option<PathBuf>,
    keys: RwLock<Arc<KeySet>>,
    /// The keys file's modification time and length when last read.
    stamp: Mutex<Option<(SystemTime, u64)>>,
    pub limiter: Arc<limits::Limiter>,
    pub gates: fair::FairGates,
    /// Users with series in `/metrics` (bounded: the keys and the three above).
    seen: Mutex<BTreeSet<String>>,
}

impl Tenancy {
    /// No keys file; fair queues of `parallel` slots and `queue_limit` waiters.
    pub fn new(parallel: usize, queue_limit: usize) -> Tenancy {
        Tenancy {
            keys_file: None,
            keys: RwLock::new(Arc::new(KeySet::default())),
            stamp: Mutex::new(None),
            limiter: Arc::default(),
            gates: fair::FairGates::new(parallel, queue_limit),
            seen: Mutex::new(BTreeSet::new()),
        }
    }

    /// With the keys of `path` (read now: an error stops the start).
    pub fn with_keys_file(
        parallel: usize,
        queue_limit: usize,
        path: &Path,
    ) -> Result<Tenancy, String> {
        let tenancy = Tenancy {
            keys_file: Some(path.to_path_buf()),
            ..Tenancy::new(parallel, queue_limit)
        };
        tenancy.reload()?;
        Ok(tenancy)
    }

    pub fn keys_file(&self) -> Option<&Path> {
        self.keys_file.as_deref()
    }

    /// The keys now.
    pub fn keys(&self) -> Arc<KeySet> {
        Arc::clone(&self.keys.read().unwrap_or_else(PoisonError::into_inner))
    }

    /// Whether named keys are in use (then a request needs one of them, or
    /// the `--api-key` / `--admin-key`).
    pub fn has_keys(&self) -> bool {
        self.keys_file.is_some()
    }

    /// Whether a named key has the admin role.
    pub fn has_admin(&self) -> bool {
        self.keys().tenants.iter().any(|t| t.role == Role::Admin)
    }

    /// Reads the keys file again; on an error the keys in use stay. Says
    /// what it did.
    pub fn reload(&self) -> Result<String, String> {
        let Some(path) = &self.keys_file else {
            return Ok("no keys file".into());
        };
        let stamp = file_stamp(path);
        let set = KeySet::load(path)?;
        let count = set.tenants.len();
        for t in &set.tenants {
            self.saw(&t.name);
        }
        *self.keys.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(set);
        *self.stamp.lock().unwrap_or_else(PoisonError::into_inner) = stamp;
        Ok(format!("{count} named keys"))
    }

    /// Reads the keys file again if it changed since it was last read.
    pub fn reload_if_changed(&self) -> Option<Result<String, String>> {
        let path = self.keys_file.as_ref()?;
        let now = file_stamp(path);
        let before = *self.stamp.lock().unwrap_or_else(PoisonError::into_inner);
        if now == before {
            return None;
        }
        let outcome = self.reload();
        if outcome.is_err() {
            // Not again until it changes again.
            *self.stamp.lock().unwrap_or_else(PoisonError::into_inner) = now;
        }
        Some(outcome)
    }

    /// Watches the keys file (every second) and reads it again when it changes.
    pub fn watch(self: &Arc<Self>) {
        if self.keys_file.is_none() {
            return;
        }
        let tenancy = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs(1));
            loop {
                tick.tick().await;
                let Some(tenancy) = tenancy.upgrade() else {
                    return;
                };
                let outcome =
                    tokio::task::spawn_blocking(move || tenancy.reload_if_changed()).await;
                match outcome {
                    Ok(Some(Ok(what))) => eprintln!("hypura: the keys file changed: {what}"),
                    Ok(Some(Err(e))) => {
                        eprintln!("hypura: the keys file changed: {e}: the keys in use stay")
                    }
                    _ => {}
                }
            }
        });
    }

    /// Who presented `key`: a named key, the admin key or the API key.
    pub fn identify(&self, key: &str, security: &crate::security::KeyPair) -> Option<Arc<Tenant>> {
        let matches = |k: &Option<Arc<str>>| {
            k.as_deref()
                .is_some_and(|k| constant_time_eq(k.as_bytes(), key.as_bytes()))
        };
        if let Some(tenant) = self.keys().find(key) {
            return Some(tenant);
        }
        if matches(&security.admin) {
            return Some(Arc::new(Tenant::unlimited(ADMIN_KEY_USER, Role::Admin)));
        }
        if matches(&security.api) {
            return Some(Arc::new(Tenant::unlimited(API_KEY_USER, Role::User)));
        }
        None
    }

    /// Notes a user, so that its series exist and `/api/usage` lists it.
    pub fn saw(&self, user: &str) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        if !seen.contains(user) {
            crate::metrics::users::known_user(user);
            seen.insert(user.to_string());
        }
    }

    /// The usage of every user seen, with what each holds and waits for now.
    pub fn usage(&self) -> Vec<usage::UserUsage> {
        let names: Vec<String> = self
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .cloned()
            .collect();
        let mut out = usage::usage_of(&names);
        for (_, slots) in self.gates.snapshot() {
            for s in slots {
                if let Some(u) = out.iter_mut().find(|u| u.user == s.user) {
                    u.running += s.running;
                    u.waiting += s.waiting;
                }
            }
        }
        out
    }
}

fn file_stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}
