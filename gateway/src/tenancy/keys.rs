//! Named API keys: the keys file (`[server] keys_file`, `--keys-file`), read
//! at start, on SIGHUP and when the file changes.
//!
//! A key is `hyp_` and 43 characters of base64url: 256 random bits from the
//! kernel. The file stores only `sha256:<hex>` of it. SHA-256 is enough
//! because the key is long and random: no dictionary or brute force reaches
//! 2^256, so a slow password hash (argon2, bcrypt) would buy nothing and
//! cost every request a few milliseconds of CPU; argon2 is for passwords
//! people choose. A key is looked up by its hash, so the key itself is never
//! compared, kept, or logged.
//!
//! The file is TOML (JSON when its name ends in `.json`):
//!
//! ```toml
//! [[keys]]
//! name = "alice"            # the label in /metrics and /api/usage
//! hash = "sha256:9f86d0…"
//! role = "user"             # or "admin": admin routes, /api/usage
//! models = ["*"]            # globs of the model names it may use
//! rpm = 60                  # requests per minute
//! tpm = 100000              # tokens (prompt + generated) per minute
//! concurrent = 4            # requests waiting or running at once
//! max_context = 8192        # tokens of prompt and reply together, every route
//! max_tokens = 1024         # tokens of one reply at most
//! weight = 1.0              # share of the slots when users compete
//! priority = "interactive"  # or "batch": only slots nobody else waits for
//! ```
use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use base64::Engine as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// What a key may do beyond generating.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    #[default]
    User,
    /// The admin routes (pull, create, copy, delete) and `/api/usage`.
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Admin => "admin",
        }
    }
}

/// Which work goes first when users wait for a model's slots.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Priority {
    /// Served before any batch request waiting.
    #[default]
    Interactive,
    /// Takes a slot only when no interactive request waits for it.
    Batch,
}

impl Priority {
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Interactive => "interactive",
            Priority::Batch => "batch",
        }
    }

    /// `interactive` or `batch` (any case).
    pub fn parse(text: &str) -> Option<Priority> {
        match text.trim().to_ascii_lowercase().as_str() {
            "interactive" => Some(Priority::Interactive),
            "batch" => Some(Priority::Batch),
            _ => None,
        }
    }
}

/// The limits of one key; `None`: no limit.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rpm: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tpm: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub concurrent: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_context: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
}

/// One entry of the keys file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyEntry {
    pub name: String,
    /// `sha256:` and 64 hex digits.
    pub hash: String,
    #[serde(default)]
    pub role: Role,
    /// Globs (`*`, `?`) of the model names the key may use; absent: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models: Option<Globs>,
    #[serde(flatten)]
    pub limits: Limits,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<Priority>,
}

/// One glob or a list of them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Globs {
    One(String),
    Many(Vec<String>),
}

impl Globs {
    fn list(&self) -> Vec<String> {
        match self {
            Globs::One(g) => vec![g.clone()],
            Globs::Many(g) => g.clone(),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct KeysFile {
    #[serde(default)]
    keys: Vec<KeyEntry>,
}

/// A user of the server: a named key, the `--api-key` or `--admin-key`, or
/// everyone when no key is asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct Tenant {
    /// Its label in `/metrics` and `/api/usage`.
    pub name: Arc<str>,
    pub role: Role,
    /// Globs of the models it may use; empty: all.
    pub models: Vec<String>,
    pub limits: Limits,
    /// Its share of the slots against other users (> 0).
    pub weight: f64,
    pub priority: Priority,
}

impl Tenant {
    /// A key without limits.
    pub fn unlimited(name: &str, role: Role) -> Tenant {
        Tenant {
            name: Arc::from(name),
            role,
            models: Vec::new(),
            limits: Limits::default(),
            weight: 1.0,
            priority: Priority::Interactive,
        }
    }

    /// Whether it may use `model` (`name:tag`; a glob without a tag matches
    /// the name alone too: `llama*` matches `llama3:8b`).
    pub fn may_use(&self, model: &str) -> bool {
        let bare = model.split_once(':').map_or(model, |(n, _)| n);
        self.models.is_empty()
            || self
                .models
                .iter()
                .any(|g| glob_match(g, model) || glob_match(g, bare))
    }
}

/// The keys of a keys file, by hash.
#[derive(Debug, Default, Clone)]
pub struct KeySet {
    by_hash: HashMap<[u8; 32], Arc<Tenant>>,
    /// In file order.
    pub tenants: Vec<Arc<Tenant>>,
}

impl KeySet {
    pub fn is_empty(&self) -> bool {
        self.tenants.is_empty()
    }

    /// The tenant whose key `presented` is.
    pub fn find(&self, presented: &str) -> Option<Arc<Tenant>> {
        self.by_hash.get(&digest(presented)).cloned()
    }

    /// Parses a keys file's text; `json`: JSON, else TOML. Names must be
    /// unique and usable as metric labels, hashes well formed, limits
    /// positive.
    pub fn parse(text: &str, json: bool) -> Result<KeySet, String> {
        let file: KeysFile = if json {
            serde_json::from_str(text).map_err(|e| e.to_string())?
        } else {
            toml::from_str(text).map_err(|e| e.to_string())?
        };
        let mut set = KeySet::default();
        for entry in file.keys {
            let tenant = entry.check()?;
            let hash = parse_hash(&entry.hash).ok_or_else(|| {
                format!(
                    "key {:?}: hash must be sha256: and 64 hex digits",
                    entry.name
                )
            })?;
            if set.tenants.iter().any(|t| t.name == tenant.name) {
                return Err(format!("key {:?} is named twice", entry.name));
            }
            if set.by_hash.contains_key(&hash) {
                return Err(format!("key {:?} has the hash of another key", entry.name));
            }
            let tenant = Arc::new(tenant);
            set.by_hash.insert(hash, Arc::clone(&tenant));
            set.tenants.push(tenant);
        }
        Ok(set)
    }

    /// Reads the keys file at `path` (a missing file is no keys, so that
    /// `hypura keys add` can make it later).
    pub fn load(path: &Path) -> Result<KeySet, String> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(KeySet::default()),
            Err(e) => return Err(format!("reading the keys file: {e}")),
        };
        KeySet::parse(&text, is_json(path)).map_err(|e| format!("the keys file: {e}"))
    }
}

/// Whether `path` names a JSON keys file.
pub fn is_json(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("json"))
}

/// Names that are fine as a Prometheus label value and in a URL.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "key name {name:?}: use 1 to 64 letters, digits, '-', '_', '.' or '@'"
        ))
    }
}

impl KeyEntry {
    fn check(&self) -> Result<Tenant, String> {
        check_name(&self.name)?;
        let bad = |what: &str| format!("key {:?}: {what} must be at least 1", self.name);
        let l = &self.limits;
        if l.rpm == Some(0) {
            return Err(bad("rpm"));
        }
        if l.tpm == Some(0) {
            return Err(bad("tpm"));
        }
        if l.concurrent == Some(0) {
            return Err(bad("concurrent"));
        }
        if l.max_context == Some(0) {
            return Err(bad("max_context"));
        }
        if l.max_tokens == Some(0) {
            return Err(bad("max_tokens"));
        }
        let weight = self.weight.unwrap_or(1.0);
        if !(weight.is_finite() && weight > 0.0 && weight <= 1000.0) {
            return Err(format!(
                "key {:?}: weight must be above 0 and at most 1000",
                self.name
            ));
        }
        Ok(Tenant {
            name: Arc::from(self.name.as_str()),
            role: self.role,
            models: self.models.as_ref().map(Globs::list).unwrap_or_default(),
            limits: self.limits.clone(),
            weight,
            priority: self.priority.unwrap_or_default(),
        })
    }
}

/// A new key: `hyp_` and 256 random bits, base64url.
pub fn generate_key() -> std::io::Result<String> {
    use std::io::Read as _;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(format!(
        "hyp_{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    ))
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// `sha256:<hex>` of `key`, as the keys file stores it.
pub fn hash_key(key: &str) -> String {
    let hex: String = digest(key).iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

fn parse_hash(text: &str) -> Option<[u8; 32]> {
    let hex = text.strip_prefix("sha256:")?;
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// `*` any run of characters, `?` one; case-insensitive.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.to_lowercase().chars().collect();
    let t: Vec<char> = text.to_lowercase().chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

/// The TOML of one entry, as `hypura keys add` appends it (strings written
/// as JSON strings, which TOML reads the same).
pub fn entry_toml(entry: &KeyEntry) -> String {
    let s = |v: &str| serde_json::to_string(v).expect("a string serializes");
    let mut out = format!(
        "\n[[keys]]\nname = {}\nhash = {}\nrole = {}\n",
        s(&entry.name),
        s(&entry.hash),
        s(entry.role.as_str())
    );
    if let Some(models) = &entry.models {
        let list: Vec<String> = models.list().iter().map(|g| s(g)).collect();
        out.push_str(&format!("models = [{}]\n", list.join(", ")));
    }
    let l = &entry.limits;
    for (field, value) in [
        ("rpm", l.rpm.map(u64::from)),
        ("tpm", l.tpm),
        ("concurrent", l.concurrent.map(u64::from)),
        ("max_context", l.max_context.map(u64::from)),
        ("max_tokens", l.max_tokens.map(u64::from)),
    ] {
        if let Some(v) = value {
            out.push_str(&format!("{field} = {v}\n"));
        }
    }
    if let Some(w) = entry.weight {
        out.push_str(&format!("weight = {w:?}\n"));
    }
    if let Some(p) = entry.priority {
        out.push_str(&format!("priority = {}\n", s(p.as_str())));
    }
    out
}

/// `text` (a TOML keys file) without the `[[keys]]` table named `name`;
/// `None` when there is none. Comments elsewhere stay.
pub fn remove_entry_toml(text: &str, name: &str) -> Option<String> {
    let mut blocks: Vec<String> = vec![String::new()];
    for line in text.split_inclusive('\n') {
        if line.trim() == "[[keys]]" {
            blocks.push(String::new());
        }
        blocks
            .last_mut()
            .expect("one block at least")
            .push_str(line);
    }
    let before = blocks.len();
    let mut kept = vec![blocks.remove(0)];
    for block in blocks {
        let parsed: Result<KeysFile, _> = toml::from_str(&block);
        let named = parsed.is_ok_and(|f| f.keys.iter().any(|k| k.name == name));
        if !named {
            kept.push(block);
        }
    }
    (kept.len() < before).then(|| kept.concat())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_found_by_their_hash_only() {
        let key = generate_key().unwrap();
        assert!(key.starts_with("hyp_") && key.len() == 47, "{key}");
        let entry = KeyEntry {
            name: "alice".into(),
            hash: hash_key(&key),
            role: Role::User,
            models: Some(Globs::Many(vec!["smol*".into()])),
            limits: Limits {
                rpm: Some(2),
                max_tokens: Some(5),
                ..Limits::default()
            },
            weight: Some(2.0),
            priority: Some(Priority::Batch),
        };
        let text = entry_toml(&entry);
        assert!(!text.contains(&key));
        let set = KeySet::parse(&text, false).unwrap();
        let alice = set.find(&key).unwrap();
        assert_eq!(&*alice.name, "alice");
        assert_eq!(alice.priority, Priority::Batch);
        assert_eq!(alice.limits.rpm, Some(2));
        assert!(alice.may_use("smollm2:latest"));
        assert!(!alice.may_use("llama3:8b"));
        assert!(set.find("hyp_other").is_none());
        let json = serde_json::json!({"keys": [entry]}).to_string();
        assert_eq!(KeySet::parse(&json, true).unwrap().tenants.len(), 1);
    }

    #[test]
    fn bad_files_are_refused_with_the_reason() {
        let h = hash_key("k");
        let cases = [
            (format!("[[keys]]\nname = \"a b\"\nhash = \"{h}\"\n"), "key name"),
            ("[[keys]]\nname = \"a\"\nhash = \"md5:00\"\n".to_string(), "sha256"),
            (format!("[[keys]]\nname = \"a\"\nhash = \"{h}\"\nrpm = 0\n"), "rpm"),
            (
                format!("[[keys]]\nname = \"a\"\nhash = \"{h}\"\n[[keys]]\nname = \"a\"\nhash = \"{}\"\n", hash_key("j")),
                "twice",
            ),
            (format!("[[keys]]\nname = \"a\"\nhash = \"{h}\"\nrmp = 1\n"), "rmp"),
        ];
        for (text, needle) in cases {
            let err = KeySet::parse(&text, false).unwrap_err();
            assert!(err.contains(needle), "{err}");
        }
    }

    #[test]
    fn remove_keeps_the_other_entries_and_comments() {
        let one = |n: &str| {
            entry_toml(&KeyEntry {
                name: n.into(),
                hash: hash_key(n),
                role: Role::User,
                models: None,
                limits: Limits::default(),
                weight: None,
                priority: None,
            })
        };
        let text = format!("# my keys\n{}{}", one("a"), one("b"));
        let left = remove_entry_toml(&text, "a").unwrap();
        assert!(left.starts_with("# my keys\n"));
        let set = KeySet::parse(&left, false).unwrap();
        assert_eq!(set.tenants.len(), 1);
        assert_eq!(&*set.tenants[0].name, "b");
        assert!(remove_entry_toml(&left, "a").is_none());
    }

    #[test]
    fn globs() {
        assert!(glob_match("*", "x"));
        assert!(glob_match("llama?:*", "llama3:8b"));
        assert!(glob_match("*-instruct*", "smol-instruct:q4"));
        assert!(!glob_match("llama", "llama3"));
    }
}
