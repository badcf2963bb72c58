//! The client commands: `ps`, `list`, `pull`, `show`, `stop` and `run NAME`
//! talk to a running `hypura serve` (or any Ollama-compatible server) over
//! HTTP, and print as `ollama` does; `--json` prints the server's objects.
//!
//! The server is `$HYPURA_HOST`, else `$OLLAMA_HOST`, parsed as Ollama parses
//! `OLLAMA_HOST` ([`parse_host`]); default `http://127.0.0.1:11434`. When
//! `$HYPURA_API_KEY` is set it is sent as `Authorization: Bearer …`.
pub mod chat;
pub mod format;
pub mod list;
pub mod ps;
pub mod pull;
pub mod show;
pub mod stop;

use std::time::Duration;

use anyhow::{bail, Context as _};
use serde_json::Value;

/// The port `ollama` and `hypura serve` listen on by default.
const DEFAULT_PORT: u16 = 11434;

/// The server's base URL (`scheme://host:port[/path]`, no trailing slash) from
/// `$HYPURA_HOST`, else `$OLLAMA_HOST`.
pub fn base_url() -> String {
    let var = |key: &str| std::env::var(key).ok().filter(|v| !v.trim().is_empty());
    parse_host(
        &var("HYPURA_HOST")
            .or_else(|| var("OLLAMA_HOST"))
            .unwrap_or_default(),
    )
}

/// Ollama's rules for `OLLAMA_HOST` (envconfig.Host): surrounding spaces and
/// quotes trimmed; scheme optional (`http`; `http://` alone defaults the port
/// to 80, `https://` to 443, none to 11434); `host`, `host:port`, `:port`,
/// `[v6]:port` or a bare IPv6 address; an empty host is `127.0.0.1`; an invalid port is the default one; a path is kept.
pub fn parse_host(text: &str) -> String {
    let text = text.trim().trim_matches(|c| c == '"' || c == '\'');
    let (scheme, rest, default_port) = match text.split_once("://") {
        None => ("http", text, DEFAULT_PORT),
        Some(("http", rest)) => ("http", rest, 80),
        Some(("https", rest)) => ("https", rest, 443),
        Some((scheme, rest)) => (scheme, rest, DEFAULT_PORT),
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
    let port = port
        .parse::<u16>()
        .ok()
        .map_or(default_port.to_string(), |p| p.to_string());
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host
    };
    let path = path.trim_end_matches('/');
    if path.is_empty() {
        format!("{scheme}://{host}:{port}")
    } else {
        format!("{scheme}://{host}:{port}/{path}")
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

    /// Sends and checks the status; a non-2xx reply becomes its `error` message.
    fn send(
        &self,
        builder: reqwest::blocking::RequestBuilder,
    ) -> anyhow::Result<reqwest::blocking::Response> {
        let response = builder.send().map_err(|e| {
            anyhow::anyhow!(
                "could not reach the server at {}: {e}; is `hypura serve` running? \
                 (HYPURA_HOST or OLLAMA_HOST say where)",
                self.base
            )
        })?;
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let body = response.text().unwrap_or_default();
        bail!("{}", error_message(status.as_u16(), &body))
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
        mut line: impl FnMut(&Value) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        use std::io::BufRead;
        let response = self.send(self.request(reqwest::Method::POST, path).json(body))?;
        for text in std::io::BufReader::new(response).lines() {
            let text = text.with_context(|| format!("POST {path}: reading the reply"))?;
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
        Ok(())
    }
}

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
