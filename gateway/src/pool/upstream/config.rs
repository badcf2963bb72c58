//! `[[upstreams]]` in the configuration file and `--upstream URL` on the
//! command line: the other servers this one routes models to.
//!
//! Checked once at start-up ([`check_all`], [`from_flag`]): a bad URL, an
//! unset key variable, a bad duration or a duplicate name is an error naming
//! the key. The API key itself is read from the environment variable the
//! file names and never written anywhere: [`Secret`]'s `Debug` hides it.
use std::time::Duration;

use serde::Deserialize;

use crate::config::Text;
use crate::core::validation::{KeepAlive, ModelName};

/// Which API the upstream speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UpstreamKind {
    /// Another hypura: Ollama's API plus `/api/ps` slots (residency and queue).
    Hypura,
    /// Ollama (or anything speaking its `/api/*` routes).
    Ollama,
    /// An OpenAI-compatible server (vLLM, llama-server, …): `/v1/*` only.
    Openai,
}

impl UpstreamKind {
    pub fn as_str(self) -> &'static str {
        match self {
            UpstreamKind::Hypura => "hypura",
            UpstreamKind::Ollama => "ollama",
            UpstreamKind::Openai => "openai",
        }
    }

    /// Whether it speaks Ollama's routes (`/api/chat`, `/api/tags`, `/api/ps`).
    pub fn speaks_ollama(self) -> bool {
        self != UpstreamKind::Openai
    }
}

/// `[[upstreams]]` as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamSection {
    /// Shown in `/api/ps`, metrics and logs [default: `peerN`, N its place in the list].
    pub name: Option<String>,
    /// Base URL (`http://box2:11434`); for `openai`, with or without `/v1`.
    pub url: String,
    /// `hypura` (default), `ollama` or `openai`.
    pub kind: Option<UpstreamKind>,
    /// The environment variable holding the upstream's API key (sent as a bearer token).
    pub api_key_env: Option<String>,
    /// Models it serves, by its names; empty: asked from it (`/api/tags` or `/v1/models`).
    #[serde(default)]
    pub models: Vec<String>,
    /// Names served here for its models: `{ "fast" = "llama3.2:3b" }`.
    #[serde(default)]
    pub aliases: std::collections::BTreeMap<String, String>,
    /// Share of requests among upstreams that report no queue [default: 1].
    pub weight: Option<u32>,
    /// Longest wait for a TCP connection [default: 2s].
    pub connect_timeout: Option<Text>,
    /// Longest wait for the first byte of a reply, then the next upstream is tried [default: 30s].
    pub first_byte_timeout: Option<Text>,
    /// Time between health probes and model-list refreshes (jittered) [default: 10s].
    pub probe_interval: Option<Text>,
    /// Time a failed upstream is skipped [default: 10s].
    pub cooldown: Option<Text>,
}

/// A value that must never be printed (an API key).
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(…)")
    }
}

/// An upstream, checked.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    pub name: String,
    /// Without a trailing `/` (and, for `openai`, without `/v1`).
    pub base_url: String,
    pub kind: UpstreamKind,
    pub api_key: Option<Secret>,
    /// Its model names; empty: discovered.
    pub models: Vec<String>,
    /// Name served here → its model name.
    pub aliases: Vec<(ModelName, String)>,
    pub weight: u32,
    pub connect_timeout: Duration,
    pub first_byte_timeout: Duration,
    pub probe_interval: Duration,
    pub cooldown: Duration,
}

pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
pub const DEFAULT_FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(30);
pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_secs(10);
pub const DEFAULT_COOLDOWN: Duration = Duration::from_secs(10);

impl UpstreamConfig {
    /// An upstream with every setting at its default.
    fn new(name: String, base_url: String, kind: UpstreamKind) -> UpstreamConfig {
        UpstreamConfig {
            name,
            base_url,
            kind,
            api_key: None,
            models: Vec::new(),
            aliases: Vec::new(),
            weight: 1,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            first_byte_timeout: DEFAULT_FIRST_BYTE_TIMEOUT,
            probe_interval: DEFAULT_PROBE_INTERVAL,
            cooldown: DEFAULT_COOLDOWN,
        }
    }
}

/// `--upstream URL`: a hypura peer, or `ollama+URL` / `openai+URL` for the
/// other kinds; every other setting at its default. `index` counts from 1.
pub fn from_flag(text: &str, index: usize) -> Result<UpstreamConfig, String> {
    let (kind, url) = match text.split_once('+') {
        Some(("hypura", url)) => (UpstreamKind::Hypura, url),
        Some(("ollama", url)) => (UpstreamKind::Ollama, url),
        Some(("openai", url)) => (UpstreamKind::Openai, url),
        _ => (UpstreamKind::Hypura, text),
    };
    let base_url = base_url(url, kind).map_err(|e| format!("--upstream {text}: {e}"))?;
    Ok(UpstreamConfig::new(format!("peer{index}"), base_url, kind))
}

/// The URL checked: http(s), a host, no query; trailing `/` (and `/v1` for
/// `openai`) removed.
fn base_url(text: &str, kind: UpstreamKind) -> Result<String, String> {
    let url = url::Url::parse(text.trim())
        .map_err(|e| format!("not a URL ({e}): write it as http://host:port"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err("use an http:// or https:// URL with a host".into());
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err("a base URL has no query or fragment".into());
    }
    let mut base = url.as_str().trim_end_matches('/').to_string();
    if kind == UpstreamKind::Openai {
        if let Some(stripped) = base.strip_suffix("/v1") {
            base = stripped.to_string();
        }
    }
    Ok(base)
}

fn duration(key: &str, text: Option<&Text>, default: Duration) -> Result<Duration, String> {
    let Some(text) = text else {
        return Ok(default);
    };
    match KeepAlive::from_flag(&text.0) {
        Ok(KeepAlive::For(d)) if !d.is_zero() => Ok(d),
        _ => Err(format!(
            "{key}: {:?} is not a positive duration: write it as \"500ms\", \"2s\" or \"1m\"",
            text.0
        )),
    }
}

impl UpstreamSection {
    fn check(self, i: usize) -> Result<UpstreamConfig, String> {
        let key = |field: &str| format!("upstreams[{i}].{field}");
        let kind = self.kind.unwrap_or(UpstreamKind::Hypura);
        let base_url = base_url(&self.url, kind).map_err(|e| format!("{}: {e}", key("url")))?;
        let name = self.name.unwrap_or_else(|| format!("peer{}", i + 1));
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
        {
            return Err(format!(
                "{}: {name:?}: use letters, digits, '.', '_' and '-'",
                key("name")
            ));
        }
        let api_key = match &self.api_key_env {
            None => None,
            Some(var) => match std::env::var(var) {
                Ok(value) if !value.is_empty() => Some(Secret(value)),
                _ => {
                    return Err(format!(
                        "{}: the environment variable {var} is not set: export it with the \
                         upstream's API key",
                        key("api_key_env")
                    ))
                }
            },
        };
        let mut aliases = Vec::new();
        for (alias, target) in self.aliases {
            let alias = ModelName::parse(&alias, "alias")
                .map_err(|e| format!("{}: {e}", key("aliases")))?;
            aliases.push((alias, target));
        }
        let weight = self.weight.unwrap_or(1);
        if weight == 0 {
            return Err(format!("{}: use 1 or more", key("weight")));
        }
        Ok(UpstreamConfig {
            name,
            base_url,
            kind,
            api_key,
            models: self.models,
            aliases,
            weight,
            connect_timeout: duration(
                &key("connect_timeout"),
                self.connect_timeout.as_ref(),
                DEFAULT_CONNECT_TIMEOUT,
            )?,
            first_byte_timeout: duration(
                &key("first_byte_timeout"),
                self.first_byte_timeout.as_ref(),
                DEFAULT_FIRST_BYTE_TIMEOUT,
            )?,
            probe_interval: duration(
                &key("probe_interval"),
                self.probe_interval.as_ref(),
                DEFAULT_PROBE_INTERVAL,
            )?,
            cooldown: duration(&key("cooldown"), self.cooldown.as_ref(), DEFAULT_COOLDOWN)?,
        })
    }
}

/// Checks every `[[upstreams]]` entry; names must differ.
pub fn check_all(sections: Vec<UpstreamSection>) -> Result<Vec<UpstreamConfig>, String> {
    let mut checked: Vec<UpstreamConfig> = Vec::new();
    for (i, section) in sections.into_iter().enumerate() {
        let upstream = section.check(i)?;
        if checked.iter().any(|u| u.name == upstream.name) {
            return Err(format!(
                "upstreams[{i}].name: {:?} is also the name of another upstream; give each its own",
                upstream.name
            ));
        }
        checked.push(upstream);
    }
    Ok(checked)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Vec<UpstreamConfig>, String> {
        #[derive(Deserialize)]
        struct File {
            upstreams: Vec<UpstreamSection>,
        }
        let file: File = toml::from_str(text).map_err(|e| e.to_string())?;
        check_all(file.upstreams)
    }

    #[test]
    fn a_full_entry_is_read_with_its_durations_and_aliases() {
        let all = parse(
            r#"
            [[upstreams]]
            name = "box2"
            url = "http://box2:11434/"
            kind = "ollama"
            models = ["llama3.2:3b"]
            aliases = { fast = "llama3.2:3b" }
            weight = 3
            connect_timeout = "500ms"
            first_byte_timeout = "5s"
            "#,
        )
        .unwrap();
        let u = &all[0];
        assert_eq!(u.name, "box2");
        assert_eq!(u.base_url, "http://box2:11434");
        assert_eq!(u.kind, UpstreamKind::Ollama);
        assert_eq!(u.weight, 3);
        assert_eq!(u.connect_timeout, Duration::from_millis(500));
        assert_eq!(u.first_byte_timeout, Duration::from_secs(5));
        assert_eq!(u.probe_interval, DEFAULT_PROBE_INTERVAL);
        assert_eq!(u.aliases[0].0.display, "fast:latest");
        assert_eq!(u.aliases[0].1, "llama3.2:3b");
    }

    #[test]
    fn openai_urls_lose_their_v1_and_names_default_to_their_place() {
        let all = parse(
            "[[upstreams]]\nurl = \"http://a:8000/v1\"\nkind = \"openai\"\n\
             [[upstreams]]\nurl = \"http://b:11434\"\n",
        )
        .unwrap();
        assert_eq!(all[0].base_url, "http://a:8000");
        assert_eq!(all[0].name, "peer1");
        assert_eq!(all[1].name, "peer2");
        assert_eq!(all[1].kind, UpstreamKind::Hypura);
    }

    #[test]
    fn bad_entries_name_their_key() {
        let bad_url = parse("[[upstreams]]\nurl = \"box2:11434\"\n").unwrap_err();
        assert!(bad_url.starts_with("upstreams[0].url: "), "{bad_url}");
        let bad_timeout =
            parse("[[upstreams]]\nurl = \"http://a\"\nfirst_byte_timeout = \"soon\"\n")
                .unwrap_err();
        assert!(
            bad_timeout.starts_with("upstreams[0].first_byte_timeout: "),
            "{bad_timeout}"
        );
        let unset = parse(
            "[[upstreams]]\nurl = \"http://a\"\napi_key_env = \"HYPURA_TEST_SURELY_UNSET_KEY\"\n",
        )
        .unwrap_err();
        assert!(
            unset.contains("HYPURA_TEST_SURELY_UNSET_KEY is not set"),
            "{unset}"
        );
        let twice = parse(
            "[[upstreams]]\nurl = \"http://a\"\nname = \"x\"\n\
             [[upstreams]]\nurl = \"http://b\"\nname = \"x\"\n",
        )
        .unwrap_err();
        assert!(twice.starts_with("upstreams[1].name: "), "{twice}");
    }

    #[test]
    fn the_api_key_never_prints() {
        let secret = Secret("sk-very-secret".into());
        assert!(!format!("{secret:?}").contains("very"));
    }

    #[test]
    fn flags_take_a_kind_prefix() {
        let u = from_flag("openai+http://127.0.0.1:8000/v1", 2).unwrap();
        assert_eq!(
            (u.kind, u.base_url.as_str(), u.name.as_str()),
            (UpstreamKind::Openai, "http://127.0.0.1:8000", "peer2")
        );
        let u = from_flag("http://127.0.0.1:11434", 1).unwrap();
        assert_eq!(u.kind, UpstreamKind::Hypura);
        assert!(from_flag("ftp://x", 1).is_err());
    }
}
