//! The client commands: `ps`, `list`, `pull`, `show`, `stop`, `rm`, `cp`,
//! `create` and `run NAME` talk to a running `hypura serve` (or any
//! Ollama-compatible server) over HTTP, and print as `ollama` does; `--json`
//! prints the server's objects. `push` says it is not supported.
//!
//! The server is `$HYPURA_HOST`, else `$OLLAMA_HOST`, parsed as Ollama parses
//! `OLLAMA_HOST` ([`parse_host`]); default `http://127.0.0.1:11434`. An
//! address that means "every interface" (`0.0.0.0`, `::`), what a server
//! listens on, is dialled on loopback. When `$HYPURA_API_KEY` is set it is
//! sent as `Authorization: Bearer …`.
pub mod chat;
pub mod cp;
pub mod create;
pub mod format;
pub mod list;
pub mod ps;
pub mod pull;
pub mod rm;
pub mod show;
pub mod stop;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{bail, Context as _};
use serde_json::Value;

/// The port `ollama` and `hypura serve` listen on by default.
const DEFAULT_PORT: u16 = 11434;

/// `$HYPURA_HOST`, else `$OLLAMA_HOST`, when set and not blank; with the
/// variable's name.
pub fn host_from_env() -> Option<(&'static str, String)> {
    let var = |key: &'static str| {
        std::env::var(key)
            .ok()
            .filter(|v| !v.trim().is_empty())
            .map(|v| (key, v))
    };
    var("HYPURA_HOST").or_else(|| var("OLLAMA_HOST"))
}

/// The server's base URL (`scheme://host:port[/path]`, no trailing slash) from
/// `$HYPURA_HOST`, else `$OLLAMA_HOST`.
pub fn base_url() -> String {
    let text = host_from_env().map(|(_, v)| v).unwrap_or_default();
    HostSpec::parse(&text).dial().url()
}

/// `OLLAMA_HOST` read as Ollama reads it (envconfig.Host).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostSpec {
    pub scheme: String,
    /// An address or a name, IPv6 without brackets.
    pub host: String,
    pub port: u16,
    /// The text gave a port, or a scheme that implies one (`http://` 80,
    /// `https://` 443): a server listens there, not on its default port.
    pub port_given: bool,
    /// Without slashes at either end; empty when none.
    pub path: String,
}

impl HostSpec {
    /// Surrounding spaces and quotes trimmed; scheme optional (`http`;
    /// `http://` alone defaults the port to 80, `https://` to 443, none to
    /// 11434); `host`, `host:port`, `:port`, `[v6]:port` or a bare IPv6
    /// address; an empty host is `127.0.0.1`; an invalid port is the default
    /// one; a path is kept.
    pub fn parse(text: &str) -> HostSpec {
        let text = text.trim().trim_matches(|c| c == '"' || c == '\'');
        let (scheme, rest, default_port, scheme_port) = match text.split_once("://") {
            None => ("http", text, DEFAULT_PORT, false),
            Some(("http", rest)) => ("http", rest, 80, true),
            Some(("https", rest)) => ("https", rest, 443, true),
            Some((scheme, rest)) => (scheme, rest, DEFAULT_PORT, false),
        };
        let (hostport, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (host, port) = match split_host_port(hostport) {
            // Go dials `:port` on this machine.
            Some(("", port)) => ("127.0.0.1".to_string(), port),
            Some((host, port)) => (host.to_string(), port),
            None => {
                let bare = hostport.trim_start_matches('[').trim_end_matches(']');
                let host = if bare.is_empty() { "127.0.0.1" } else { bare };
                (host.to_string(), String::new())
            }
        };
        let parsed = port.parse::<u16>().ok();
        HostSpec {
            scheme: scheme.to_string(),
            host,
            port: parsed.unwrap_or(default_port),
            port_given: parsed.is_some() || scheme_port,
            path: path.trim_matches('/').to_string(),
        }
    }

    /// Where a client connects: "every interface" is loopback.
    pub fn dial(mut self) -> HostSpec {
        match self.host.as_str() {
            "0.0.0.0" => self.host = "127.0.0.1".into(),
            "::" | "0:0:0:0:0:0:0:0" => self.host = "::1".into(),
            _ => {}
        }
        self
    }

    /// `scheme://host:port[/path]`, IPv6 in brackets.
    pub fn url(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        let base = format!("{}://{host}:{}", self.scheme, self.port);
        if self.path.is_empty() {
            base
        } else {
            format!("{base}/{}", self.path)
        }
    }
}

/// Go's net.SplitHostPort: `host:port` or `[host]:port`; `None` without a
/// port separator or with a bare IPv6 address.
fn split_host_port(text: &str) -> Option<(&str, String)> {
    if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = after.strip_prefix(':')?;
        return Some((host, port.to_string()));
    }
    let (host, port) = text.rsplit_once(':')?;
    if host.contains(':') {
        return None;
    }
    Some((host, port.to_string()))
}

/// A blocking HTTP client of one server.
pub struct Client {
    base: String,
    http: reqwest::blocking::Client,
    api_key: Option<String>,
}

impl Client {
    /// The client of [`base_url`].
    pub fn from_env() -> anyhow::Result<Client> {
        let http = reqwest::blocking::Client::builder()
            .connect_timeout(Duration::from_secs(5))
            // Streams (chat, pull) last as long as they last.
            .timeout(None)
            .build()
            .context("making the HTTP client")?;
        Ok(Client {
            base: base_url(),
            http,
            api_key: std::env::var("HYPURA_API_KEY")
                .ok()
                .filter(|k| !k.is_empty()),
        })
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::blocking::RequestBuilder {
        let builder = self.http.request(method, format!("{}{path}", self.base));
        match &self.api_key {
            Some(key) => builder.bearer_auth(key),
            None => builder,
        }
    }

    fn unreachable(&self, e: reqwest::Error) -> anyhow::Error {
        anyhow::anyhow!(
            "could not reach the server at {}: {e}; is `hypura serve` running? \
             (HYPURA_HOST or OLLAMA_HOST say where)",
            self.base
        )
    }

    /// Sends and checks the status; a non-2xx reply becomes its `error` message.
    fn send(
        &self,
        builder: reqwest::blocking::RequestBuilder,
    ) -> anyhow::Result<reqwest::blocking::Response> {
        let response = builder.send().map_err(|e| self.unreachable(e))?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body = response.text().unwrap_or_default();
        bail!("{}", error_message(status.as_u16(), &body))
    }

    /// A request whose answer has no body to read (`/api/copy`, `/api/delete`).
    pub fn call(&self, method: reqwest::Method, path: &str, body: &Value) -> anyhow::Result<()> {
        self.send(self.request(method, path).json(body)).map(drop)
    }

    /// Whether `HEAD path` finds something (200) or not (404).
    pub fn exists(&self, path: &str) -> anyhow::Result<bool> {
        let response = self
            .request(reqwest::Method::HEAD, path)
            .send()
            .map_err(|e| self.unreachable(e))?;
        match response.status() {
            status if status.is_success() => Ok(true),
            reqwest::StatusCode::NOT_FOUND => Ok(false),
            status => bail!("{}", error_message(status.as_u16(), "")),
        }
    }

    /// POSTs a file's bytes as the body.
    pub fn post_file(&self, path: &str, file: std::fs::File, bytes: u64) -> anyhow::Result<()> {
        let body = reqwest::blocking::Body::sized(file, bytes);
        self.send(self.request(reqwest::Method::POST, path).body(body))
            .map(drop)
    }

    pub fn get(&self, path: &str) -> anyhow::Result<Value> {
        self.send(self.request(reqwest::Method::GET, path))?
            .json()
            .with_context(|| format!("GET {path}: the reply is not JSON"))
    }

    pub fn post(&self, path: &str, body: &Value) -> anyhow::Result<Value> {
        self.send(self.request(reqwest::Method::POST, path).json(body))?
            .json()
            .with_context(|| format!("POST {path}: the reply is not JSON"))
    }

    /// POSTs and calls `line` with each object of the NDJSON reply, in order;
    /// an `{"error"}` line ends it with that error.
    pub fn post_ndjson(
        &self,
        path: &str,
        body: &Value,
        line: impl FnMut(&Value) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        self.post_ndjson_until(path, body, &AtomicBool::new(false), line)
            .map(drop)
    }

    /// [`Client::post_ndjson`] that gives up as soon as `stop` is set,
    /// closing the connection (the server then stops generating); whether
    /// the reply was read to its end.
    pub fn post_ndjson_until(
        &self,
        path: &str,
        body: &Value,
        stop: &AtomicBool,
        mut line: impl FnMut(&Value) -> anyhow::Result<()>,
    ) -> anyhow::Result<bool> {
        use std::io::BufRead;
        use std::sync::mpsc::{sync_channel, RecvTimeoutError};
        let response = self.send(self.request(reqwest::Method::POST, path).json(body))?;
        // Lines are read on a thread of their own, so that a stop is seen
        // while the next one is awaited; when this returns, the reader's
        // next send fails and it drops the response.
        let (lines_tx, lines) = sync_channel(16);
        std::thread::spawn(move || {
            for text in std::io::BufReader::new(response).lines() {
                if lines_tx.send(text).is_err() {
                    return;
                }
            }
        });
        loop {
            if stop.load(Ordering::SeqCst) {
                return Ok(false);
            }
            let text = match lines.recv_timeout(STOP_POLL) {
                Ok(text) => text.with_context(|| format!("POST {path}: reading the reply"))?,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return Ok(true),
            };
            if text.trim().is_empty() {
                continue;
            }
            let value: Value = serde_json::from_str(&text)
                .with_context(|| format!("POST {path}: not a JSON line: {text}"))?;
            if let Some(error) = value.get("error") {
                bail!(
                    "{}",
                    error
                        .as_str()
                        .map_or_else(|| error.to_string(), str::to_string)
                );
            }
            line(&value)?;
        }
    }
}

/// How often a stream being read looks at its stop flag.
const STOP_POLL: Duration = Duration::from_millis(50);

/// The message of an error reply (`{"error":"…"}` or OpenAI's
/// `{"error":{"message"}}`), else the status and body.
fn error_message(status: u16, body: &str) -> String {
    let parsed: Option<Value> = serde_json::from_str(body).ok();
    let message = parsed.as_ref().and_then(|v| {
        let e = v.get("error")?;
        e.as_str()
            .or_else(|| e.get("message").and_then(Value::as_str))
            .map(str::to_string)
    });
    message.unwrap_or_else(|| format!("the server answered {status}: {}", body.trim()))
}

/// Prints one JSON value on stdout.
pub fn print_json(value: &Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string(value)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ollama's rules for `OLLAMA_HOST`: the URL it names.
    fn parse_host(text: &str) -> String {
        HostSpec::parse(text).url()
    }

    #[test]
    fn hosts_parse_as_ollama_parses_them() {
        let cases = [
            ("", "http://127.0.0.1:11434"),
            ("   ", "http://127.0.0.1:11434"),
            ("1.2.3.4", "http://1.2.3.4:11434"),
            (":1234", "http://127.0.0.1:1234"),
            ("1.2.3.4:1234", "http://1.2.3.4:1234"),
            ("example.com", "http://example.com:11434"),
            ("example.com:1234", "http://example.com:1234"),
            ("http://example.com", "http://example.com:80"),
            ("https://example.com", "https://example.com:443"),
            ("https://example.com:1234", "https://example.com:1234"),
            ("::1", "http://[::1]:11434"),
            ("[::1]", "http://[::1]:11434"),
            ("[::1]:1337", "http://[::1]:1337"),
            ("example.com:56789999", "http://example.com:11434"),
            ("\"1.2.3.4\"", "http://1.2.3.4:11434"),
            (" '1.2.3.4:5' ", "http://1.2.3.4:5"),
            ("0.0.0.0", "http://0.0.0.0:11434"),
            (
                "https://example.com/ollama/",
                "https://example.com:443/ollama",
            ),
        ];
        for (input, want) in cases {
            assert_eq!(parse_host(input), want, "{input:?}");
        }
    }

    #[test]
    fn a_server_listens_where_the_text_says_and_is_dialled_on_loopback() {
        let spec = HostSpec::parse("0.0.0.0:8080");
        assert_eq!(
            (spec.host.as_str(), spec.port, spec.port_given),
            ("0.0.0.0", 8080, true)
        );
        assert_eq!(spec.dial().url(), "http://127.0.0.1:8080");
        assert_eq!(HostSpec::parse("[::]:9").dial().url(), "http://[::1]:9");
        assert_eq!(
            HostSpec::parse("http://0.0.0.0").dial().url(),
            "http://127.0.0.1:80"
        );
        // No port: the server's own default (its file's, else 11434).
        let spec = HostSpec::parse("0.0.0.0");
        assert_eq!((spec.port, spec.port_given), (11434, false));
        assert!(HostSpec::parse("https://box.lan").port_given);
        assert!(!HostSpec::parse("box.lan:99999").port_given);
        assert_eq!(
            HostSpec::parse("box.lan:1").dial().url(),
            "http://box.lan:1"
        );
    }

    #[test]
    fn error_replies_give_their_message() {
        assert_eq!(
            error_message(404, r#"{"error":"model 'x' not found"}"#),
            "model 'x' not found"
        );
        assert_eq!(
            error_message(401, r#"{"error":{"message":"invalid API key","type":"x"}}"#),
            "invalid API key"
        );
        assert_eq!(
            error_message(502, "bad gateway\n"),
            "the server answered 502: bad gateway"
        );
    }
}
